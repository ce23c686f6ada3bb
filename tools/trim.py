"""`baregrad trim run.bgq --from I --to J -o part.bgq`: a smaller capture of commands I..J that replays and checks on
its own.

The part keeps commands I to J (indices into the capture's command list, both included; `baregrad replay run.bgq
--list` shows them), the allocations those commands use and the programs they launch, renumbered, and only the blobs
those records refer to. Each kept allocation starts with the contents it had when command I ran and ends with those
it had after command J. Neither is in the capture (it holds contents at its start and end only), so trim replays it
on a device of the captured kind: commands 0..I-1, a snapshot, commands I..J, a snapshot; then, unless `check` is
off, the rest, comparing every allocation with the capture's final contents -- a trim whose replay does not reproduce
the capture is refused, since its contents would be that replay's, not the captured program's. A CPU capture's
programs run for this only with `allow_native_code` (as for replay).

A submission cut by I or J keeps the commands inside the range: its `submit` command is kept where it lies inside
the range and added after J where it lay after it. The part's `trimmed` header record says where it came from. The
file is written with the capture writer and read back with every check of `load_capture` before trim returns.
"""
from __future__ import annotations
import os
from dataclasses import dataclass
from baregrad.hcq.capture import Capture, check_header, device_info
from .bgq import Derived, file_sha256
from .replay import Replayer, ReplayError, ReplayResult, describe_device


@dataclass
class Trimmed:
  source: Capture
  part: Capture
  first: int
  last: int
  checked: int            # allocations of the whole capture compared with its final contents (0: check off)
  device_text: str        # where the contents at I and after J were computed


def _refs(c: dict) -> list:
  if c["op"] == "exec": return c["bufs"]
  if c["op"] == "copy": return [c["dst"], c["src"]]
  if c["op"] == "write": return [c["dst"]]
  return []


def trim(cap: Capture, first: int, last: int, out: str, device: str | None = None, allow_native_code: bool = False,
         check: bool = True) -> Trimmed:
  """Write commands `first`..`last` of `cap` to `out` as a capture of their own (see the module's docstring)."""
  if not cap.checked: check_header(cap)
  n = len(cap.commands)
  if not 0 <= first <= last < n:
    raise ReplayError(f"--from {first} --to {last}: {cap.path} has {n} commands (0 to {n - 1}); expected "
                      "0 <= --from <= --to < the number of commands")
  keep = range(first, last + 1)
  if not any(cap.commands[i]["op"] in ("exec", "copy", "write") for i in keep):
    raise ReplayError(f"commands {first}..{last} of {cap.path} hold no kernel launch, copy or host write: nothing to trim to")
  # the allocations and programs the kept commands use, numbered in order of first use
  alloc_ids: dict[int, int] = {}
  prog_ids: dict[int, int] = {}
  for i in keep:
    c = cap.commands[i]
    for a, _, _ in _refs(c): alloc_ids.setdefault(a, len(alloc_ids))
    if c["op"] == "exec": prog_ids.setdefault(c["program"], len(prog_ids))

  r = Replayer(cap, device, allow_native_code)
  r.reset()
  r.run(range(first))
  at_first = {a: bytes(r.view(a)) for a in alloc_ids}
  r.run(keep)
  after_last = {a: bytes(r.view(a)) for a in alloc_ids}
  checked = 0
  if check:
    result = ReplayResult(r.dev.name, cap, 1)
    r.run(range(last + 1, n))
    r.check(result, 0)
    if result.mismatches:
      raise ReplayError(f"replaying {cap.path} on {r.dev.name} did not reproduce the captured final contents, so the "
                        f"contents at command {first} it would write are not the captured program's; not trimming "
                        f"(--no-check trims anyway). {result.mismatches[0].text}")
    checked = result.checked
  where = describe_device(device_info(r.dev))

  d = Derived(cap)
  programs = []
  for old, new in prog_ids.items():
    p = cap.programs[old]
    programs.append(dict(p, id=new, binary=d.blob(p["binary"]), source=d.blob(p["source"])))
  allocations = []
  for old, new in alloc_ids.items():
    a = cap.allocations[old]
    # the capture's own records where the range starts at its start or ends at its end (a null `initial` stays null)
    allocations.append({"id": new, "device": a["device"], "nbytes": a["nbytes"], "dtype": a["dtype"],
                        "initial": d.blob(a["initial"]) if first == 0 else d.data(at_first[old]),
                        "final": d.blob(a["final"]) if last == n - 1 and a["final"] is not None else d.data(after_last[old])})

  def ref(x): return [alloc_ids[x[0]], x[1], x[2]]
  subs: dict[int, int] = {}
  submitted: set[int] = set()
  commands = []
  for i in keep:
    c = dict(cap.commands[i])
    op = c["op"]
    if op == "submit":
      if c["sub"] not in subs: continue       # a submission whose commands all lie before `first`
      submitted.add(c["sub"])
    if op in ("exec", "copy", "submit"): c["sub"] = subs.setdefault(c["sub"], len(subs))
    if op == "exec": c.update(program=prog_ids[c["program"]], bufs=[ref(b) for b in c["bufs"]])
    elif op == "copy": c.update(dst=ref(c["dst"]), src=ref(c["src"]))
    elif op == "write": c.update(dst=ref(c["dst"]), data=d.blob(c["data"]))
    commands.append(c)
  for old, new in subs.items():              # submissions cut by `last`: submitted after their last kept command
    if old in submitted: continue
    later = next((c for c in cap.commands[last + 1:] if c["op"] == "submit" and c["sub"] == old), None)
    dev = next(c["device"] for c in commands if c.get("sub") == new)
    commands.append({"op": "submit", "sub": new, "device": dev, "origin": later["origin"] if later else "trim"})

  header = {k: cap.header[k] for k in ("created", "argv", "python", "host") if k in cap.header}
  header.update(devices=cap.header["devices"], programs=programs, allocations=allocations, commands=commands,
                submissions=len(subs),
                trimmed={"file": os.path.basename(cap.path)[:200], "sha256": file_sha256(cap.path), "first": first,
                         "last": last, "commands": n, "contents_from": f"a replay on {where}"[:256]})
  part = d.write(out, header)
  return Trimmed(cap, part, first, last, checked, where)


def summary(t: Trimmed) -> str:
  src, part = t.source, t.part
  size = os.path.getsize(part.path)
  lines = [f"trimmed commands {t.first}..{t.last} of {src.path} ({len(src.commands)} commands, {len(src.programs)} programs, "
           f"{len(src.allocations)} allocations, {os.path.getsize(src.path)} bytes)",
           f"  to {part.path}: {len(part.commands)} commands, {len(part.programs)} programs, {len(part.allocations)} "
           f"allocations, {len(part.header['blobs'])} blobs, {size} bytes",
           f"  contents at command {t.first} and after command {t.last} from a replay on {t.device_text}",
           (f"  that replay matched the captured final contents of all {t.checked} allocations" if t.checked else
            "  that replay was not checked against the capture (--no-check)"),
           f"  replay it: baregrad replay {part.path}" + (" --allow-native-code" if "CPU" in part.header["devices"] else "")]
  return "\n".join(lines)
