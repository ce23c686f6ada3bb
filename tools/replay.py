"""`baregrad replay run.bgq [--allow-native-code] [--device D] [--repeat N] [--warmup W] [--trace out.json]`: run a
capture again, check it, time it.

The programs are loaded on a device of the captured kind, every allocation is recreated with its initial
contents, and the commands are submitted again in their order, each between two queue timestamps. After each
repetition every allocation is compared with its captured final contents. Warm-up repetitions run (and are
checked) first and are left out of the figures.

The same machinery (`Replayer`) runs one kernel of a capture again and again (tools/kernel_replay.py) and the part
of a capture a trim needs (tools/trim.py).

A capture is input from whoever sent it. `load_capture` has checked every field (hcq/capture.py); here the device
must be the captured kind, and the programs of a CPU capture are machine code this process would run with the
user's privileges, so they are loaded only when the caller opts in (`allow_native_code`, `--allow-native-code`).
GPU programs run under the GPU's MMU and need no opt-in.
"""
from __future__ import annotations
import platform, sys, time
from dataclasses import dataclass, field
import numpy as np
from baregrad.hcq.capture import Capture, CaptureError, check_header, device_info, host_info
from baregrad.hcq.trace import TraceBuilder, clock_offset, device_ns
from baregrad.drivers.progress import Progress


NATIVE_CODE_DEVICES = ("CPU",)    # devices whose programs are host machine code, run in this process


class ReplayError(RuntimeError):
  pass


class _Bytes:
  """Element type of a recreated allocation (untyped bytes)."""
  name, itemsize = "bytes", 1


@dataclass
class Timing:
  rep: int
  index: int           # command index in the capture
  op: str              # exec | copy | write | sync
  name: str
  start_ns: int        # host monotonic clock
  end_ns: int
  flops: int = 0
  nbytes: int = 0      # bytes the command moves (meta bytes for kernels, size for copies)
  queue: str = "compute"

  @property
  def ns(self) -> int: return self.end_ns - self.start_ns


@dataclass
class Mismatch:
  rep: int             # the timed repetition, or the warm-up run when `warmup`
  alloc: int
  text: str
  warmup: bool = False

  @property
  def run(self) -> str: return f"warm-up run {self.rep}" if self.warmup else f"repetition {self.rep}"


@dataclass
class ReplayResult:
  device: str
  capture: Capture
  repeat: int
  timings: list = field(default_factory=list)
  mismatches: list = field(default_factory=list)
  checked: int = 0
  warmup: int = 0      # runs before the timed ones: checked, not timed
  device_info: dict = field(default_factory=dict)   # where it ran (hcq.capture.device_info)

  def of(self, *ops) -> list: return [t for t in self.timings if t.op in ops]


def check_device(cap: Capture, device: str | None) -> tuple[str, str]:
  """(captured device name, device to replay on); ReplayError when the kinds differ."""
  from baregrad.hcq.device import canonical
  devices = cap.header["devices"]
  if not devices: raise ReplayError(f"{cap.path}: the capture recorded no device work (no ExecItem was submitted)")
  if len(devices) > 1:
    raise ReplayError(f"{cap.path} used {len(devices)} devices ({', '.join(devices)}): replaying captures that span "
                      "several devices is not supported yet")
  name, info = next(iter(devices.items()))
  try: target = canonical(device) if device is not None else canonical(name)
  except ValueError as e: raise ReplayError(str(e)) from e
  kind = info.get("kind", name)
  what = ", ".join(str(info[k]) for k in ("machine", "target", "compiler") if k in info)
  if target != kind:
    raise ReplayError(f"{cap.path} was captured on a {kind} device ({what}); its programs are {kind} binaries and "
                      f"cannot run on {target}: replay it on a {kind} device (real or emulated, --device {kind})")
  if kind == "CPU" and info.get("machine") not in (None, platform.machine()):
    raise ReplayError(f"{cap.path} holds CPU code for {info['machine']}; this machine is {platform.machine()}")
  if "target" in info:
    dev = _open(target, cap)
    have = dev.driver.target
    if have is not None and have != info["target"]:
      raise ReplayError(f"{cap.path} holds {kind} code for {info['target']}; this {kind} device is {have}")
  return name, target


def _open(target: str, cap: Capture):
  from baregrad.hcq.device import Device
  try: return Device.get(target)
  except (RuntimeError, OSError) as e: raise ReplayError(f"cannot open {target} to replay {cap.path}: {e}") from e


def check_native_code(cap: Capture, target: str, allow_native_code: bool):
  """A CPU capture's programs are machine code from the file: refuse them unless the caller opted in."""
  if target not in NATIVE_CODE_DEVICES or not cap.programs or allow_native_code: return
  raise ReplayError(f"{cap.path} is a {target} capture: its {len(cap.programs)} program(s) are machine code from the file, which "
                    "replay would load and run in this process with your privileges; not running them without "
                    "--allow-native-code (pass it only if you trust whoever made the file as you would a program from them; "
                    "allow_native_code=True in Python)")


def _meta(meta: dict) -> dict:
  out = dict(meta)
  for k in ("global_size", "local_size"):
    if k in out and isinstance(out[k], list): out[k] = tuple(out[k])
  return out


def _load(dev, cap: Capture, p: dict):
  """The captured binary, loaded as it is. A driver that cannot load a binary it did not compile itself in this
  process (the emulated NV GPU runs the PTX the cubin came from) gets the captured source compiled first; on the CPU
  that is C source compiled and run, which only happens after the native-code opt-in (check_native_code), and says so."""
  from baregrad.compiler.codegen import compile_source
  from baregrad.hcq.program import Program
  try: source = (cap.blob(p["source"]) or b"").decode()
  except UnicodeDecodeError as e:
    raise CaptureError(f"{cap.path}: corrupted capture: the source of program {p['name']} is not UTF-8 ({e.reason})") from e
  prog = Program(dev.name, p["name"], cap.blob(p["binary"]), source, p["n_params"], tuple(p["variables"]), _meta(p["meta"]))
  try:
    return prog.load(dev)
  except Exception as first:
    if not source: raise ReplayError(f"cannot load program {p['name']} on {dev.name}: {first}") from first
    if dev.name in NATIVE_CODE_DEVICES:
      print(f"baregrad replay: the binary of program {p['name']} does not load here ({first}); compiling and running its "
            "captured C source instead (--allow-native-code)", file=sys.stderr)
    try:
      binary = compile_source(dev.name, source)
      if binary != prog.binary: prog.binary = binary     # the driver's compiler differs: run what it makes of the source
      return prog.load(dev)
    except Exception as e:
      raise ReplayError(f"cannot load program {p['name']} on {dev.name}: {first} (compiling its source: {e})") from e


class Replayer:
  """A capture's programs loaded and its allocations recreated on a device, ready to run any of its commands: the
  whole capture (`replay`), one kernel again and again (tools/kernel_replay.py), the prefix a trim needs
  (tools/trim.py). Every command is submitted between two queue timestamps, so its device time is measured by the
  device's own clock (the CPU device's command processor writes CLOCK_MONOTONIC; an emulated GPU, its emulator's)."""

  def __init__(self, cap: Capture, device: str | None = None, allow_native_code: bool = False):
    if not cap.checked: check_header(cap)
    _, target = check_device(cap, device)
    check_native_code(cap, target, allow_native_code)
    self.cap = cap
    self.dev = dev = _open(target, cap)
    self.programs = [_load(dev, cap, p) for p in cap.programs]
    self.allocs = [_allocate(dev, cap, a, rec["nbytes"]) for a, rec in enumerate(cap.allocations)]
    self.initial = [cap.blob(a["initial"]) for a in cap.allocations]
    self.final = [cap.blob(a.get("final")) for a in cap.allocations]
    self.offset = clock_offset(dev)

  def addr(self, ref) -> int:     # check_header has checked every reference against its allocation
    a, off, _ = ref
    return self.allocs[a].addr + off

  def view(self, a: int): return self.dev.driver.view(self.allocs[a].addr, self.cap.allocations[a]["nbytes"])

  def ref_view(self, ref):
    """The bytes of one buffer reference [allocation, offset, nbytes]."""
    return self.dev.driver.view(self.addr(ref), ref[2])

  def reset(self):
    """Every allocation back to its captured initial contents (zeros where the capture has none)."""
    self.dev.synchronize()
    for a, rec in enumerate(self.cap.allocations):
      if self.initial[a] is not None: self.view(a)[:] = self.initial[a]
      elif rec["nbytes"]: np.frombuffer(self.view(a), np.uint8).fill(0)

  def run(self, indices, rep: int = 0, bar: Progress | None = None) -> list:
    """Submit the commands at `indices` (in that order) and wait for them; their Timings, device commands timed with
    queue timestamps, host writes and waits with the host clock."""
    from baregrad.hcq.signal import Signal
    cap, dev = self.cap, self.dev
    q, stamps, timings = None, [], []
    for i in indices:
      c = cap.commands[i]
      op = c["op"]
      if op in ("exec", "copy"):
        if q is None: q = dev.compute_queue()
        t0, t1 = Signal(dev, "replay"), Signal(dev, "replay")
        q.timestamp(t0)
        if op == "exec":
          prog = self.programs[c["program"]]
          words = [self.addr(r) for r in c["bufs"]] + [int(v) for v in c["vars"]]
          q.exec(prog, dev.kernargs.put(words), tuple(c["global_size"]), tuple(c.get("local_size", (1, 1, 1))))
          stamps.append((Timing(rep, i, op, c["name"], 0, 0, c.get("flops", 0), c.get("bytes", 0)), t0, t1))
        else:
          q.copy(self.addr(c["dst"]), self.addr(c["src"]), c["nbytes"])
          stamps.append((Timing(rep, i, op, c.get("name", "copy"), 0, 0, 0, c["nbytes"]), t0, t1))
        q.timestamp(t1)
        if bar is not None: bar.update(1)
      elif op == "submit":
        if q is not None: q.signal(dev.timeline, dev.next_timeline()).submit(dev)
        q = None
      elif op in ("write", "sync"):
        if q is not None: q.signal(dev.timeline, dev.next_timeline()).submit(dev); q = None
        h0 = time.monotonic_ns()
        dev.synchronize()
        if op == "write": self.ref_view(c["dst"])[:] = cap.blob(c["data"])
        timings.append(Timing(rep, i, "wait" if op == "sync" else "write", "host wait" if op == "sync" else "host write",
                              h0, time.monotonic_ns(), 0, c["dst"][2] if op == "write" else 0, "host"))
      else:
        raise CaptureError(f"{cap.path}: corrupted capture: command #{i} has unknown op {op!r}")   # check_header refuses these
    if q is not None: q.signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize()
    for t, t0, t1 in stamps:
      t.start_ns, t.end_ns = device_ns(dev, t0.timestamp) - self.offset, device_ns(dev, t1.timestamp) - self.offset
      timings.append(t)
    return timings

  def check(self, result: "ReplayResult", rep: int, warmup: bool = False):
    """Compare every allocation with its captured final contents; a difference becomes a Mismatch of `result`."""
    _check(result, rep, self.cap, self.final, self.view, warmup)


def replay(cap: Capture, device: str | None = None, repeat: int = 1, check: bool = True, show_progress: bool = True,
           allow_native_code: bool = False, warmup: int = 0) -> ReplayResult:
  """Run `cap` `warmup` + `repeat` times on `device` (default: the captured one); the warm-up runs are checked but not
  timed. A CPU capture's programs run only with `allow_native_code` (see check_native_code); ReplayError/CaptureError
  say why a capture cannot be replayed."""
  r = Replayer(cap, device, allow_native_code)
  result = ReplayResult(r.dev.name, cap, repeat, warmup=warmup, device_info=device_info(r.dev))
  work = sum(1 for c in cap.commands if c["op"] in ("exec", "copy"))
  bar = Progress((warmup + repeat) * work, "replay", enabled=None if show_progress else False)
  everything = range(len(cap.commands))
  for run in range(warmup + repeat):
    rep = run - warmup           # the warm-up runs are -warmup..-1
    r.reset()
    timings = r.run(everything, rep, bar)
    if rep >= 0: result.timings += timings
    if check: r.check(result, rep if rep >= 0 else run, warmup=rep < 0)
  bar.close()
  result.timings.sort(key=lambda t: (t.rep, t.start_ns, t.index))
  return result


def _allocate(dev, cap: Capture, a: int, nbytes: int):
  from baregrad.hcq.buffer import Buffer
  try: return Buffer(dev.name, max(nbytes, 1), _Bytes).ensure_allocated()
  except (MemoryError, RuntimeError, OSError) as e:
    raise ReplayError(f"cannot recreate allocation {a} of {cap.path} ({nbytes} bytes) on {dev.name}: {e or type(e).__name__}") from e


def _check(result: ReplayResult, rep: int, cap: Capture, final: list, view, warmup: bool = False):
  writer = {}
  for i, c in enumerate(cap.commands):
    if c["op"] == "exec" and c["bufs"]: writer[c["bufs"][0][0]] = f"{c['name']} (command {i})"
    elif c["op"] == "copy": writer[c["dst"][0]] = f"copy (command {i})"
    elif c["op"] == "write": writer[c["dst"][0]] = f"a host write (command {i})"
  for a, rec in enumerate(cap.allocations):
    if final[a] is None: continue
    result.checked += 1
    got = bytes(view(a))
    if got == final[a]: continue
    result.mismatches.append(Mismatch(rep, a, describe_mismatch(a, rec, got, final[a], writer.get(a, "no command")), warmup))


NUMPY_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")


def describe_mismatch(a: int, rec: dict, got: bytes, want: bytes, writer: str, labels=("got", "captured")) -> str:
  g8, w8 = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
  head = f"buffer #{a} ({rec['dtype']}, {rec['nbytes']} bytes, last written by {writer})"
  dt = np.dtype(rec["dtype"] if rec["dtype"] in NUMPY_DTYPES else "uint8")     # never np.dtype() of any string from the file
  if rec["nbytes"] % dt.itemsize: dt = np.dtype(np.uint8)
  g, w = np.frombuffer(got, dt), np.frombuffer(want, dt)
  diff = np.flatnonzero((g8 != w8).reshape(-1, dt.itemsize).any(axis=1))
  k = int(diff[0])
  text = f"{head}: {len(diff)} of {len(g)} elements differ; first at element {k}: {labels[0]} {g[k]!r}, {labels[1]} {w[k]!r}"
  if dt.kind == "f":
    with np.errstate(all="ignore"):
      err = np.abs(g.astype(np.float64) - w.astype(np.float64))
    text += f"; max abs diff {np.nanmax(err) if np.isfinite(err).any() else float('nan'):.3g}"
  return text


# ---- reporting ----

def describe_device(info: dict, host: dict | None = None) -> str:
  """One line of where a capture or a replay ran: device kind and target, machine and OS, driver, firmware, GPU id."""
  host = host or {}
  parts = [str(info.get("kind", "?")) + (f" {info['target']}" if "target" in info else "")
           + (" (emulated)" if info.get("emulated") else "")]
  machine = " ".join(str(x) for x in (host.get("machine", info.get("machine")), host.get("os")) if x)
  if machine: parts.append(machine)
  for key, label in (("driver_version", "driver"), ("firmware", "firmware"), ("gpu_id", "GPU"), ("compiler", "cc")):
    if key in info: parts.append(f"{label} {info[key]}")
  return ", ".join(parts)


def where(cap: Capture, replay_info: dict | None = None) -> list[str]:
  """The 'captured on' and 'replayed on' lines of a report (a capture written before these fields: what it has)."""
  lines = [f"captured on: {describe_device(info, cap.header.get('host'))}" for info in cap.header["devices"].values()]
  if replay_info: lines.append(f"replayed on: {describe_device(replay_info, host_info())}")
  return lines


def clock_text(info: dict) -> str:
  """Where the device times of a replay come from (every replay times commands with queue timestamps)."""
  if info.get("kind") == "CPU": return "queue timestamps (the CPU command processor's CLOCK_MONOTONIC)"
  if info.get("emulated"): return "queue timestamps (written by the emulated GPU: emulator time, not hardware time)"
  return "queue timestamps (the GPU's clock)"


def runs_text(repeat: int, warmup: int) -> str:
  return (f"{repeat} timed run{'s' * (repeat != 1)}"
          + (f" ({warmup} warm-up run{'s' * (warmup != 1)} before them, checked, not counted)" if warmup else " (no warm-up)"))

def write_trace(result: ReplayResult, path: str):
  tb = TraceBuilder()
  for t in result.timings:
    track = tb.track("host", "python") if t.queue == "host" else tb.track(f"{result.device} (replay)", f"{t.queue} queue")
    args = {"command": t.index, "repetition": t.rep}
    if t.op == "exec": args.update(flops=t.flops, bytes=t.nbytes)
    if t.op in ("copy", "write"): args["nbytes"] = t.nbytes
    cat = {"exec": "kernel", "copy": "copy", "wait": "wait", "write": "host"}[t.op]
    tb.complete(track, t.name, t.start_ns, t.end_ns, cat, args)
  tb.write(path, {"tool": "baregrad replay", "capture": result.capture.path, "device": result.device, "repeat": result.repeat})


def summary(result: ReplayResult, top: int = 10) -> str:
  kernels, copies = result.of("exec"), result.of("copy")
  lines = []
  reps = f", {result.repeat} repetitions" if result.repeat > 1 else ""
  lines.append(f"replay of {result.capture.path} on {result.device}: {len(kernels) // result.repeat} kernels, "
               f"{len(copies) // result.repeat} copies per run{reps}")
  lines += where(result.capture, result.device_info)
  lines.append(f"figures: {runs_text(result.repeat, result.warmup)}; device time from {clock_text(result.device_info)}")
  by: dict[str, list] = {}
  for t in kernels: by.setdefault(t.name, []).append(t)
  ktotal = sum(t.ns for t in kernels)
  if kernels:
    lines.append("")
    lines.append(f"{'kernel':32s} {'calls':>6s} {'total us':>11s} {'mean us':>10s} {'%':>6s} {'GFLOP/s':>9s} {'GB/s':>8s}")
    rows = sorted(by.items(), key=lambda kv: -sum(t.ns for t in kv[1]))
    for name, ts in rows[:top]:
      ns = sum(t.ns for t in ts)
      sec = max(ns, 1) * 1e-9
      lines.append(f"{name[:32]:32s} {len(ts):6d} {ns / 1e3:11.2f} {ns / 1e3 / len(ts):10.2f} {100 * ns / max(ktotal, 1):6.1f} "
                   f"{sum(t.flops for t in ts) / sec / 1e9:9.2f} {sum(t.nbytes for t in ts) / sec / 1e9:8.2f}")
    if len(rows) > top:
      rest = [t for _, ts in rows[top:] for t in ts]
      lines.append(f"{f'({len(rows) - top} more kernels)':32s} {len(rest):6d} {sum(t.ns for t in rest) / 1e3:11.2f}")
  lines.append("")
  lines.append(f"kernels: {len(kernels)} runs, {ktotal / 1e3:.2f} us total (the sum of the trace's kernel events)")
  if copies:
    ns = sum(t.ns for t in copies)
    nb = sum(t.nbytes for t in copies)
    lines.append(f"copies:  {len(copies)} runs, {ns / 1e3:.2f} us total, {nb / 1e6:.3f} MB, {nb / max(ns, 1):.2f} GB/s")
  gaps, span = [], 0
  for rep in range(result.repeat):
    dev_ts = [t for t in result.timings if t.rep == rep and t.op in ("exec", "copy")]
    for a, b in zip(dev_ts, dev_ts[1:]): gaps.append((b.start_ns - a.end_ns, a, b))
    if dev_ts: span += dev_ts[-1].end_ns - dev_ts[0].start_ns
  if gaps:
    idle = sum(max(g, 0) for g, _, _ in gaps)
    g, a, b = max(gaps, key=lambda x: x[0])
    lines.append(f"idle:    {idle / 1e3:.2f} us between commands ({len(gaps)} gaps, longest {g / 1e3:.2f} us between "
                 f"{a.name} and {b.name})")
  waits = result.of("wait", "write")
  if waits:
    lines.append(f"host:    {len(waits)} waits/writes, {sum(t.ns for t in waits) / 1e3:.2f} us")
  lines.append(f"total:   {span / 1e3:.2f} us of device time from the first command to the last"
               + (f" ({span / 1e3 / result.repeat:.2f} us per run)" if result.repeat > 1 else ""))
  n = len(result.capture.allocations)
  if result.mismatches:
    lines.append("")
    lines.append(f"MISMATCH: {len(result.mismatches)} buffer(s) differ from the captured final contents:")
    for m in result.mismatches[:20]: lines.append(f"  {m.run}: {m.text}")
  else:
    lines.append(f"check:   all {n} buffers match their captured final contents" + (" in every repetition" if result.repeat > 1 else ""))
  return "\n".join(lines)
