"""`baregrad replay run.bgq --kernel I [--repeat N] [--warmup W]`: one kernel launch of a capture, run again and again
with its inputs restored before each run, timed and checked.

1. The capture is replayed up to command I: the buffers the kernel is given then hold what they held when it ran
   in the captured program. They are saved: its inputs.
2. Command I runs once, in its place; its buffers are saved again: its outputs. With checking on, the rest of the
   capture runs too and every allocation is compared with its captured final contents, so these outputs are those of
   a replay that reproduced the capture.
3. The kernel then runs `warmup + repeat` times, each time after its inputs were written back, and its buffers are
   compared with the outputs of step 2 after every run. Where nothing later in the capture writes one of its buffers,
   the capture's final contents of that buffer are the kernel's outputs themselves, and step 2's are compared with
   them directly.

What a kernel reads and writes is taken to be its argument buffers (every buffer bound to it, whole): an
over-approximation, since a GPU kernel's machine code may use only part of what it is given, but never less than it
touches -- a capture's launches are checked to pass buffers at least as large as the program was compiled for.

Device time is measured with queue timestamps around the launch (as a whole replay does); the warm-up runs are
left out of the figures.
"""
from __future__ import annotations
import statistics
from dataclasses import dataclass, field
from baregrad.hcq.capture import Capture, check_header, device_info
from baregrad.drivers.progress import Progress
from .bgq import launch_size
from .replay import Replayer, ReplayError, ReplayResult, clock_text, describe_mismatch, runs_text, where


@dataclass
class KernelRun:
  capture: Capture
  index: int                  # the exec command's index in the capture
  device: str
  device_info: dict
  repeat: int
  warmup: int
  times_ns: list = field(default_factory=list)      # device time of each timed run
  warmup_ns: list = field(default_factory=list)
  against: list = field(default_factory=list)       # per argument buffer: "capture" or "reference run" (or "unchecked")
  mismatches: list = field(default_factory=list)    # one line each
  reference: ReplayResult | None = None             # the whole-capture replay the outputs come from (its check)
  runs_checked: int = 0

  @property
  def command(self) -> dict: return self.capture.commands[self.index]

  @property
  def program(self) -> dict: return self.capture.programs[self.command["program"]]

  def stats(self) -> dict:
    t = sorted(self.times_ns)
    return {"min": t[0], "median": statistics.median(t), "max": t[-1], "runs": len(t)} if t else {"runs": 0}


def exec_command(cap: Capture, index: int) -> dict:
  """Command `index` of `cap`, which must be a kernel launch (ReplayError naming the launches near it otherwise)."""
  n = len(cap.commands)
  execs = [i for i, c in enumerate(cap.commands) if c["op"] == "exec"]
  if not execs: raise ReplayError(f"{cap.path} has no kernel launches")
  if not 0 <= index < n or cap.commands[index]["op"] != "exec":
    what = f"is a {cap.commands[index]['op']} command" if 0 <= index < n else f"is not one of its {n} commands (0 to {n - 1})"
    near = sorted(execs, key=lambda i: abs(i - index))[:5]
    raise ReplayError(f"--kernel {index}: command {index} of {cap.path} {what}; --kernel takes the index of a kernel "
                      f"launch (`baregrad replay {cap.path} --list` lists them; the nearest: {', '.join(map(str, sorted(near)))})")
  return cap.commands[index]


def written_after(cap: Capture, index: int) -> list[tuple[int, int, int]]:
  """[(allocation, start, end)] that some command after `index` may write: a kernel's every buffer (its reads and
  writes are over-approximated by its arguments), a copy's destination, a host write's."""
  out = []
  for c in cap.commands[index + 1:]:
    refs = c["bufs"] if c["op"] == "exec" else [c["dst"]] if c["op"] in ("copy", "write") else []
    out += [(a, off, off + n) for a, off, n in refs]
  return out


def replay_kernel(cap: Capture, index: int, device: str | None = None, repeat: int = 10, warmup: int = 1,
                  check: bool = True, allow_native_code: bool = False, show_progress: bool = True) -> KernelRun:
  """Run the kernel launch `cap.commands[index]` `warmup + repeat` times (see the module's docstring)."""
  if not cap.checked: check_header(cap)
  c = exec_command(cap, index)
  r = Replayer(cap, device, allow_native_code)
  run = KernelRun(cap, index, r.dev.name, device_info(r.dev), repeat, warmup)
  bufs = c["bufs"]
  r.reset()
  r.run(range(index))
  inputs = [bytes(r.ref_view(ref)) for ref in bufs]
  r.run([index])
  outputs = [bytes(r.ref_view(ref)) for ref in bufs]
  if check:
    run.reference = ReplayResult(r.dev.name, cap, 1, device_info=run.device_info)
    r.run(range(index + 1, len(cap.commands)))
    r.check(run.reference, 0)
    later = written_after(cap, index)
    for j, (a, off, n) in enumerate(bufs):
      final = r.final[a]
      if final is None or any(b == a and lo < off + n and off < hi for b, lo, hi in later):
        run.against.append("reference run")
        continue
      run.against.append("capture")
      if final[off:off + n] != outputs[j]:
        run.mismatches.append(f"the reference run: argument {j}: " + _describe(cap, a, outputs[j], final[off:off + n], c))
  else: run.against = ["unchecked"] * len(bufs)
  bar = Progress(warmup + repeat, f"kernel {c['name']}", enabled=None if show_progress else False)
  for k in range(warmup + repeat):
    for ref, data in zip(bufs, inputs): r.ref_view(ref)[:] = data
    timing = r.run([index], k - warmup)[0]
    (run.warmup_ns if k < warmup else run.times_ns).append(timing.ns)
    bar.update(1)
    if not check: continue
    run.runs_checked += 1
    label = f"warm-up run {k}" if k < warmup else f"run {k - warmup}"
    for j, ref in enumerate(bufs):
      got = bytes(r.ref_view(ref))
      if got != outputs[j]: run.mismatches.append(f"{label}: argument {j}: " + _describe(cap, ref[0], got, outputs[j], c))
  bar.close()
  return run


def _describe(cap: Capture, a: int, got: bytes, want: bytes, c: dict) -> str:
  rec = dict(cap.allocations[a], nbytes=len(got))
  return describe_mismatch(a, rec, got, want, c["name"])


def _us(ns: float) -> str: return f"{ns / 1e3:.2f} us"


def summary(run: KernelRun) -> str:
  c = run.command
  nbytes = sum(ref[2] for ref in c["bufs"])
  g, l = launch_size(run.capture, c)
  lines = [f"kernel replay of command {run.index} of {run.capture.path} on {run.device}: {c['name']} (program {c['program']}), "
           f"global size {g}, local size {l}, "
           f"{len(c['bufs'])} buffers ({nbytes} bytes), {len(c['vars'])} variables"]
  lines += where(run.capture, run.device_info)
  lines.append(f"inputs: its {len(c['bufs'])} argument buffers ({nbytes} bytes) as they were when it ran in the capture, "
               "written back before every run (its reads and writes are taken to be its argument buffers)")
  s = run.stats()
  lines.append(f"device time from {clock_text(run.device_info)}, {runs_text(run.repeat, run.warmup)}:")
  if s["runs"]:
    lines.append(f"  min {_us(s['min'])}   median {_us(s['median'])}   max {_us(s['max'])}   (of {s['runs']} runs)")
    flops, moved = c.get("flops", 0), c.get("bytes", 0)
    for label, ns in (("median", s["median"]), ("min", s["min"])):
      sec = max(ns, 1) * 1e-9
      lines.append(f"  at the {label:6s}  {flops / sec / 1e9:9.2f} GFLOP/s  {moved / sec / 1e9:8.2f} GB/s  "
                   f"(of {s['runs']} runs; {flops} FLOP and {moved} bytes per run, the compiler's estimates)")
  if run.warmup_ns: lines.append(f"  warm-up: {', '.join(_us(t) for t in run.warmup_ns)} (not counted)")
  if run.against and run.against[0] == "unchecked":
    lines.append("check:   off (--no-check)")
  elif run.mismatches:
    lines.append(f"MISMATCH: {len(run.mismatches)} difference(s):")
    lines += [f"  {m}" for m in run.mismatches[:20]]
  else:
    direct, ref = run.against.count("capture"), run.against.count("reference run")
    ctx = run.reference
    ctx_text = ("which matched the captured final contents of all "
                f"{ctx.checked} buffers" if not ctx.mismatches else f"which did NOT match the capture in {len(ctx.mismatches)} buffers")
    lines.append(f"check:   outputs of all {run.runs_checked} runs match: {direct} argument buffer(s) against the captured "
                 f"final contents, {ref} (written again later in the capture) against this replay's run of the capture, "
                 + ctx_text)
  if run.reference is not None and run.reference.mismatches:
    lines.append("MISMATCH in the reference run of the whole capture:")
    lines += [f"  {m.text}" for m in run.reference.mismatches[:10]]
  return "\n".join(lines)


def failed(run: KernelRun) -> bool:
  return bool(run.mismatches or (run.reference is not None and run.reference.mismatches))
