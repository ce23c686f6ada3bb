"""`baregrad diff A B`: what differs between two captures, or between two replay results.

Two captures (`.bgq`, both checked by `load_capture` first):
  devices      where each was captured (kind, target, machine, driver and firmware versions, GPU id)
  programs     paired by the aligned launches (below) that run them, the rest by name; a pair differs when its
               source or binary hash, its parameters or its compiled launch size differ
  commands     the two command lists aligned on (op, kernel name) with difflib; an aligned pair differs in its launch
               size (global and local), buffer sizes, variable values, copy or write size, or its program's hashes; a run
               of commands replaced by as many others is compared pair by pair, the rest are only in A or only in B
  contents     the allocations the aligned commands pair up (else the same index, when the size agrees): final
               contents compared by SHA-256, and where they differ, how (elements, first difference, largest error)

Two replay results (`replay --json-out`, checked by `load_results`): per kernel name (copies too), its time per run
(the sum over its launches in one run), median, min and max of each side, the delta of the medians, and whether
the two spreads overlap.

Exit code: 0 the two are the same, 1 they differ, 2 one cannot be read.
"""
from __future__ import annotations
import difflib, statistics
from collections import defaultdict
from baregrad.hcq.capture import Capture
from .bgq import blob_sha, launch_size, program_hashes
from .replay import describe_device, describe_mismatch

LIMIT = 40        # lines listed per section


class Report:
  def __init__(self):
    self.lines: list[str] = []
    self.differences = 0

  def add(self, line: str = ""): self.lines.append(line)

  def section(self, title: str, items: list[str]):
    self.differences += len(items)
    self.add(title)
    for line in items[:LIMIT]: self.add(f"  {line}")
    if len(items) > LIMIT: self.add(f"  ... {len(items) - LIMIT} more")

  def text(self) -> str: return "\n".join(self.lines)


def _short(sha: str | None) -> str: return "none" if sha is None else sha[:12]


# ---- two captures ----

def _describe(cap: Capture) -> str:
  n = {op: sum(1 for c in cap.commands if c["op"] == op) for op in ("exec", "copy", "write")}
  return (f"{cap.path}: {len(cap.commands)} commands ({n['exec']} kernel launches, {n['copy']} copies, {n['write']} host "
          f"writes), {len(cap.programs)} programs, {len(cap.allocations)} allocations, captured {cap.header.get('created', '?')}")


def _label(c: dict) -> str: return f"{c['op']} {c['name']}" if "name" in c else c["op"]


def _key(c: dict) -> tuple:
  if c["op"] in ("exec", "copy"): return (c["op"], c["name"])
  if c["op"] == "submit": return ("submit", c["origin"])
  return (c["op"],)


def _program_diff(a: Capture, b: Capture, pa: dict, pb: dict) -> list[str]:
  out = []
  (sa, ba), (sb, bb) = program_hashes(a, pa), program_hashes(b, pb)
  if sa != sb: out.append(f"source {_short(sa)} -> {_short(sb)}")
  if ba != bb: out.append(f"binary {_short(ba)} -> {_short(bb)}")
  for key in ("n_params", "variables", "param_nbytes"):
    if pa[key] != pb[key]: out.append(f"{key} {pa[key]} -> {pb[key]}")
  for key in ("global_size", "local_size", "threads"):
    va, vb = pa["meta"].get(key), pb["meta"].get(key)
    if va != vb: out.append(f"compiled {key} {va} -> {vb}")
  return out


def _command_diff(a: Capture, b: Capture, ca: dict, cb: dict) -> list[str]:
  out = []
  if ca["op"] != cb["op"]: return [f"{ca['op']} -> {cb['op']}"]
  if ca["op"] == "exec":
    if ca["name"] != cb["name"]: out.append(f"kernel {ca['name']} -> {cb['name']}")
    (ga, la), (gb, lb) = launch_size(a, ca), launch_size(b, cb)
    if ga != gb: out.append(f"global size {ga} -> {gb}")
    if la != lb: out.append(f"local size {la} -> {lb}")
    na, nb = [r[2] for r in ca["bufs"]], [r[2] for r in cb["bufs"]]
    if na != nb: out.append(f"buffer sizes {na} -> {nb}")
    if ca["vars"] != cb["vars"]: out.append(f"variables {ca['vars']} -> {cb['vars']}")
    if ca["name"] == cb["name"]:
      ha, hb = program_hashes(a, a.programs[ca["program"]]), program_hashes(b, b.programs[cb["program"]])
      if ha != hb: out.append("its program differs (source/binary hash)")
  elif ca["op"] == "copy":
    if ca["nbytes"] != cb["nbytes"]: out.append(f"copy of {ca['nbytes']} -> {cb['nbytes']} bytes")
  elif ca["op"] == "write":
    if ca["dst"][2] != cb["dst"][2]: out.append(f"host write of {ca['dst'][2]} -> {cb['dst'][2]} bytes")
    elif blob_sha(a, ca["data"]) != blob_sha(b, cb["data"]): out.append("host write: same size, other bytes")
  return out


def _refs(c: dict) -> list:
  return c["bufs"] if c["op"] == "exec" else [c["dst"], c["src"]] if c["op"] == "copy" else [c["dst"]] if c["op"] == "write" else []


def _writers(cap: Capture) -> dict:
  writer = {}
  for i, c in enumerate(cap.commands):
    if c["op"] == "exec" and c["bufs"]: writer[c["bufs"][0][0]] = f"{c['name']} (command {i})"
    elif c["op"] in ("copy", "write"): writer[c["dst"][0]] = f"{c['op']} (command {i})"
  return writer


def diff_captures(a: Capture, b: Capture) -> Report:
  rep = Report()
  rep.add(f"A: {_describe(a)}")
  rep.add(f"B: {_describe(b)}")
  # where: a device of another kind or target is a difference; versions, machine and ids are shown
  devs = []
  ha, hb = a.header.get("host"), b.header.get("host")
  for name in sorted(set(a.header["devices"]) | set(b.header["devices"])):
    ia, ib = a.header["devices"].get(name), b.header["devices"].get(name)
    if ia is None or ib is None:
      devs.append(f"{name}: only in {'B' if ia is None else 'A'}")
      continue
    if (ia.get("kind"), ia.get("target")) != (ib.get("kind"), ib.get("target")):
      devs.append(f"{name}: {ia.get('kind')} {ia.get('target', '')} -> {ib.get('kind')} {ib.get('target', '')}")
  rep.add(f"captured on: A {'; '.join(describe_device(i, ha) for i in a.header['devices'].values()) or 'no device'}")
  rep.add(f"             B {'; '.join(describe_device(i, hb) for i in b.header['devices'].values()) or 'no device'}")
  if devs: rep.section("devices: differ", devs)

  # commands, aligned on (op, kernel name); a replaced run of as many commands is compared pair by pair
  ka, kb = [_key(c) for c in a.commands], [_key(c) for c in b.commands]
  pairs, command_items, same_commands = [], [], 0
  for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
    if tag in ("equal", "replace"):
      for i, j in zip(range(i1, i2), range(j1, j2)):
        pairs.append((i, j))
        d = _command_diff(a, b, a.commands[i], b.commands[j])
        if d: command_items.append(f"changed    A#{i} / B#{j} {_label(a.commands[i])}: {'; '.join(d)}")
        else: same_commands += 1
      i1, j1 = i1 + min(i2 - i1, j2 - j1), j1 + min(i2 - i1, j2 - j1)
    command_items += [f"only in A  A#{i} {_label(a.commands[i])}" for i in range(i1, i2)]
    command_items += [f"only in B  B#{j} {_label(b.commands[j])}" for j in range(j1, j2)]

  # programs: those the aligned launches pair up, then the rest by name (in order, where a name repeats)
  pmap: dict[int, int] = {}
  for i, j in pairs:
    ca, cb = a.commands[i], b.commands[j]
    if ca["op"] == cb["op"] == "exec" and ca["program"] not in pmap and cb["program"] not in pmap.values():
      pmap[ca["program"]] = cb["program"]
  by_b = defaultdict(list)
  for p in b.programs:
    if p["id"] not in pmap.values(): by_b[p["name"]].append(p["id"])
  for p in a.programs:
    if p["id"] not in pmap and by_b[p["name"]]: pmap[p["id"]] = by_b[p["name"]].pop(0)
  changed, same = [], 0
  for x, y in sorted(pmap.items()):
    pa, pb = a.programs[x], b.programs[y]
    d = _program_diff(a, b, pa, pb)
    names = pa["name"] if pa["name"] == pb["name"] else f"{pa['name']} -> {pb['name']}"
    if d: changed.append(f"changed    {names} (A program {x}, B program {y}): {'; '.join(d)}")
    else: same += 1
  only = ([f"only in A  {p['name']} (program {p['id']})" for p in a.programs if p["id"] not in pmap]
          + [f"only in B  {p['name']} (program {p['id']})" for p in b.programs if p["id"] not in pmap.values()])
  rep.section(f"programs: {same} identical, {len(changed)} changed, {sum(1 for x in only if 'only in A' in x)} only in A, "
              f"{sum(1 for x in only if 'only in B' in x)} only in B", changed + only)
  rep.section(f"commands: {same_commands} in the same order with the same sizes, "
              f"{sum(1 for x in command_items if x.startswith('changed'))} changed, "
              f"{sum(1 for x in command_items if x.startswith('only in A'))} only in A, "
              f"{sum(1 for x in command_items if x.startswith('only in B'))} only in B", command_items)

  # final contents of the allocations the aligned commands pair up
  amap: dict[int, int] = {}
  for i, j in pairs:
    for ra, rb in zip(_refs(a.commands[i]), _refs(b.commands[j])):
      if ra[0] not in amap and rb[0] not in amap.values(): amap[ra[0]] = rb[0]
  for x in range(min(len(a.allocations), len(b.allocations))):
    if x not in amap and x not in amap.values() and a.allocations[x]["nbytes"] == b.allocations[x]["nbytes"]: amap[x] = x
  items, same, writer = [], 0, _writers(a)
  for x, y in sorted(amap.items()):
    ra, rb = a.allocations[x], b.allocations[y]
    sa, sb = blob_sha(a, ra["final"]), blob_sha(b, rb["final"])
    if sa == sb: same += 1; continue
    what = f"A#{x} / B#{y}"
    if ra["nbytes"] != rb["nbytes"] or sa is None or sb is None:
      items.append(f"{what}: {ra['nbytes']} -> {rb['nbytes']} bytes" + (" (one has no final contents)" if None in (sa, sb) else ""))
      continue
    text = describe_mismatch(x, ra, b.blob(rb["final"]), a.blob(ra["final"]), writer.get(x, "no command"), ("B", "A"))
    items.append(f"{what}: {text}")
  unpaired = (len(a.allocations) - len(amap), len(b.allocations) - len(set(amap.values())))
  rep.section(f"final contents: {same} of {len(amap)} paired allocations identical, {len(items)} differ"
              + (f" ({unpaired[0]} of A and {unpaired[1]} of B not paired)" if any(unpaired) else ""), items)
  rep.differences += sum(unpaired)
  rep.add(f"{'no differences' if not rep.differences else f'{rep.differences} difference(s)'}")
  return rep


# ---- two replay results ----

def _per_run(results: dict) -> dict[str, list[int]]:
  """Kernel (or copy) name -> its total time in each timed run."""
  out: dict[str, list[int]] = {}
  for c in results["commands"]:
    key = c["name"] if c["op"] == "exec" else f"copy: {c['name']}"
    per = out.setdefault(key, [0] * results["repeat"])
    for r, ns in enumerate(c["ns"]): per[r] += ns
  return out


def _us(ns: float) -> str: return f"{ns / 1e3:.2f}"


def diff_results(a: dict, b: dict, path_a: str, path_b: str, threshold: float = 0.0) -> Report:
  """Per-kernel time deltas with their spread. A kernel counts as a difference when the delta of the medians is over
  `threshold` (a fraction of A's median) and the [min, max] ranges of the two sides do not overlap."""
  rep = Report()
  for label, path, r in (("A", path_a, a), ("B", path_b, b)):
    rep.add(f"{label}: {path}: {r['mode']} replay of {r['capture']['file']}, {r['repeat']} timed runs "
            f"({r['warmup']} warm-up not counted), on {describe_device(r.get('device', {}), r.get('host'))}; "
            f"times from {r['clock']}")
  if a["capture"].get("sha256") != b["capture"].get("sha256"):
    rep.add("   (the two replayed different capture files)")
  pa, pb = _per_run(a), _per_run(b)
  rep.add("")
  rep.add(f"{'kernel':32s} {'runs A/B':>9s} {'median A us':>12s} {'median B us':>12s} {'delta us':>10s} {'delta':>8s} "
          f"{'A min..max us':>20s} {'B min..max us':>20s}  verdict")
  rows, total_a, total_b = [], 0.0, 0.0
  for name in list(dict.fromkeys(list(pa) + list(pb))):
    ta, tb = pa.get(name), pb.get(name)
    if ta is None or tb is None:
      rows.append(f"{name[:32]:32s} only in {'B' if ta is None else 'A'}")
      rep.differences += 1
      continue
    ma, mb = statistics.median(ta), statistics.median(tb)
    total_a, total_b = total_a + ma, total_b + mb
    delta = mb - ma
    overlap = min(tb) <= max(ta) and min(ta) <= max(tb)
    big = abs(delta) > threshold * ma
    verdict = "within spread" if overlap or not big else ("slower" if delta > 0 else "faster")
    if verdict != "within spread": rep.differences += 1
    pct = f"{100 * delta / ma:+.1f}%" if ma else "n/a"
    rows.append(f"{name[:32]:32s} {f'{len(ta)}/{len(tb)}':>9s} {_us(ma):>12s} {_us(mb):>12s} {delta / 1e3:>+10.2f} {pct:>8s} "
                f"{_us(min(ta)) + '..' + _us(max(ta)):>20s} {_us(min(tb)) + '..' + _us(max(tb)):>20s}  {verdict}")
  for line in rows: rep.add(line)
  pct = f"{100 * (total_b - total_a) / total_a:+.1f}%" if total_a else "n/a"
  rep.add(f"{'(sum of the medians)':32s} {'':9s} {_us(total_a):>12s} {_us(total_b):>12s} {(total_b - total_a) / 1e3:>+10.2f} {pct:>8s}")
  rep.add("")
  rep.add("a kernel's time per run is the sum over its launches in that run; 'slower'/'faster' when the min..max ranges "
          "do not overlap" + (f" and the medians differ by more than {threshold:.0%}" if threshold else ""))
  rep.add(f"{'no differences beyond the spread' if not rep.differences else f'{rep.differences} difference(s)'}")
  return rep
