"""`baregrad doctor [--device D] [-o report.txt] [--inject-fault] [--perf]`: one report of a first contact with a device.

It is what a person with the hardware runs and sends back. Sections, each PASS, FAIL or SKIP with its time:

  1 host                         OS and kernel, Python, numpy, baregrad version and commit, settings not at default
  2 kernel driver and firmware   what `baregrad info` finds on the host, and what the driver read while opening the
                                 device: driver and firmware versions, GPU ids, memory, limits (EMU=1: the emulator's)
  3 device open                  every call through the kernel interface while the device opened, with its result
  4 smoke checks                 the bring-up checks of `baregrad smoke` (tools/smoke.py)
  5 ops against numpy            a few Tensor ops with their largest absolute error against numpy
  6 fault recovery               a bad packet on the compute queue: the error arrives within seconds and names the
                                 device, and the device computes again (or stays reported as lost until reopened)
  7 performance (--perf)         an add's and matvecs' bandwidth and matmuls' FLOP/s by device timestamps, host<->device
                                 copies, a small op's and a jitted step's latency
  7 (8 with --perf) summary

At the first failure the report holds the traceback and the last kernel calls before it. A failed section does not
stop the ones after it, except that a device that did not open skips 4-6.

Kernel calls are recorded as TRACE_IOCTL=1 logs them (drivers/kernel_log.py writes each line; here they go into
the report instead of stderr, and still to TRACE_IOCTL's output when it is on).
"""
from __future__ import annotations
import collections, datetime, importlib.metadata, io, platform, shlex, subprocess, sys, time, traceback
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from baregrad.drivers import settings
from . import info

CALLS_AT_FAILURE = 50          # kernel calls shown before the first failure
# --perf sizes (elements of the add, matvec and matmul sides, copy bytes) and how long each kernel runs before it is timed
PERF_SIZES = {"gpu": (64 << 20, 8192, 4096, 256 << 20), "cpu": (4 << 20, 2048, 512, 64 << 20),
              "emulated": (1 << 14, 128, 32, 1 << 20)}
PERF_WARM_SECONDS = 0.3
PERF_LAUNCHES = 8              # a GPU kernel's runs per timing, back to back (its time: theirs divided by 8)
FAULT_SECONDS = 5.0            # how long the injected fault may take to arrive
INDENT = "    "

# The bad packet section 6 puts on a real GPU: amdkfd turns an unknown PM4 opcode into a queue error
# (EC_QUEUE_PACKET_UNSUPPORTED, kfd_int_process_v11.c) and RM a reserved pushbuffer opcode into a robust-channel error,
# but a real GPU may also need a reset, which takes down a display it drives: it runs only when asked for.
REAL_GPU_FAULT = ("injecting a queue error into a real GPU can make the kernel driver reset the GPU, which takes down a "
                  "display it drives; run with --inject-fault on a GPU that no display or other job uses")
METAL_FAULT = ("Metal on a Mac reports no command-buffer fault that can be caused safely (a kernel that breaks Metal's "
               "rules may hang the GPU): only the emulated Metal framework (EMU=1) runs this check")
# a kernel whose thread 5 skips the threadgroup barrier the others wait at: the emulated Metal framework fails the
# command buffer (MSL spec 6.9.1: every thread of a threadgroup must reach each threadgroup_barrier)
METAL_FAULT_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void bg_doctor_fault(device float* out [[buffer(0)]], uint tid [[thread_position_in_threadgroup]]) {
  if (tid == 5) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}
"""


# ---- the kernel calls, as TRACE_IOCTL logs them ----
class KernelCalls:
  """While active (`with`), every call through the kernel interface as one line of drivers/kernel_log.py: the
  drivers' calls through drivers/kernel.py's logger, and the CPU loader's mmap/mprotect/munmap, which go to
  kernel_log directly. Lines are numbered; `count` is a mark for `since`."""
  KEEP = 100_000

  def __init__(self):
    self.lines: collections.deque = collections.deque(maxlen=self.KEEP)
    self.count = 0
    self._saved = None

  def write(self, text: str):  # kernel_log's output file
    for line in text.splitlines():
      self.count += 1
      self.lines.append((self.count, line))

  def flush(self): pass

  def since(self, mark: int) -> list[str]: return [line for n, line in self.lines if n > mark]
  def last(self, n: int) -> list[str]: return [line for _, line in list(self.lines)[-n:]]

  def __enter__(self) -> "KernelCalls":
    from baregrad.drivers import kernel
    self._saved = kernel.recording(self)
    self._saved.__enter__()
    return self

  def __exit__(self, *exc):
    self._saved.__exit__(*exc)


# ---- the report ----
@dataclass
class Section:
  number: int
  title: str
  status: str = "PASS"
  seconds: float = 0.0
  lines: list[str] = field(default_factory=list)
  calls_listed: bool = False     # its lines list the kernel calls it made (a failure there needs no second list)

  def add(self, *lines: str):
    for line in lines: self.lines += str(line).splitlines() or [""]


def _indent(lines, prefix: str = "  ") -> list[str]: return [prefix + line for text in lines for line in text.splitlines()]


def _settings_changed() -> str:
  """The settings (environment variables) not at their default, as they would be written in the environment."""
  show = lambda v: str(int(v)) if isinstance(v, bool) else str(v)     # noqa: E731
  changed = [f"{name}={show(getattr(settings, name))}" for name, s in settings.SETTINGS.items()
             if getattr(settings, name) != s.default]
  return " ".join(changed) or "all at their defaults"


def _git_commit() -> str:
  root = Path(__file__).resolve().parent.parent
  if not (root / ".git").exists(): return "no git checkout"
  try:
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"unknown ({e})"
  if head.returncode != 0: return f"unknown (git: {head.stderr.strip()[:120]})"
  return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _read(kernel, path: str) -> str | None:
  """A file through the driver's kernel interface (EMU=1: what the emulated kernel has), or None."""
  try: return kernel.read_text(path) if kernel.exists(path) else None
  except OSError: return None


class Doctor:
  def __init__(self, device: str, inject_fault: bool = False, perf: bool = False):
    from baregrad.hcq.device import kind_of
    self.name, self.kind, self.inject_fault, self.perf = device, kind_of(device), inject_fault, perf
    self.emulated = settings.EMU and self.kind != "CPU"
    self.sections: list[Section] = []
    self.dev = None
    self.first_failure: str | None = None
    self.calls = KernelCalls()
    self.host_props: dict = {}

  # ---- running sections ----
  def run(self) -> list[Section]:
    start = time.perf_counter()
    with self.calls:
      self.section(1, "host", self.host)
      opened = self.section(3, "device open (each kernel call)", self.open_device)
      self.section(2, "kernel driver and firmware", self.driver_facts)
      skip = None if opened.status == "PASS" else "skipped: the device did not open"
      self.section(4, "smoke checks", self.smoke, skip)
      self.section(5, "ops against numpy", self.ops, skip)
      self.section(6, "fault recovery", self.fault_recovery, skip)
      if self.perf: self.section(7, "performance", self.performance, skip)
    self.summary(time.perf_counter() - start)
    return self.sections

  def section(self, number: int, title: str, fn, skip: str | None = None) -> Section:
    s = Section(number, title)
    self.sections.append(s)
    if skip is not None:
      s.status = "SKIP"
      s.add(skip)
      return s
    start = time.perf_counter()
    try: fn(s)
    except Exception as e: self.fail(s, e)
    s.seconds = time.perf_counter() - start
    return s

  def fail(self, s: Section, error: BaseException | None = None, what: str | None = None):
    """Mark `s` failed: what went wrong, the traceback, and at the first failure the kernel calls before it."""
    s.status = "FAIL"
    if what: s.add(f"FAIL: {what}")
    if error is not None:
      s.add(f"FAIL: {type(error).__name__}: {error}", "traceback:",
            *_indent("".join(traceback.format_exception(error)).rstrip().splitlines()))
    if self.first_failure is not None:
      s.add(f"(the kernel calls before the first failure are under '{self.first_failure}')")
      return
    self.first_failure = s.title
    if s.calls_listed:
      s.add("(this is the first failure of the run; the kernel calls before it are listed above)")
      return
    tail = self.calls.last(CALLS_AT_FAILURE)
    s.add(f"the last {len(tail)} kernel calls before this failure (first failure of the run):" if tail
          else "no call went through the kernel interface before this failure")
    s.add(*_indent(tail))

  # ---- 1: host ----
  def host(self, s: Section):
    u = platform.uname()
    s.add(f"os: {u.system} {u.release} {u.machine} ({u.version})")
    if (proc := info._read("/proc/version")): s.add(f"/proc/version: {proc.strip()}")
    s.add(f"python: {platform.python_implementation()} {platform.python_version()}", f"numpy: {np.__version__}")
    try: version = importlib.metadata.version("baregrad")
    except importlib.metadata.PackageNotFoundError: version = "unknown (not installed as a package)"
    s.add(f"baregrad: {version}, commit {_git_commit()}")
    self.host_props = info.cpu_properties()
    p = self.host_props
    s.add(f"cpu: {p.get('model', p['machine'])}, {p['cores']} cores ({p.get('cores_usable', '?')} usable), "
          f"{p.get('memory', '? GiB')}, ISA flags {p['isa_flags']}")
    s.add(f"settings: {_settings_changed()}")

  # ---- 3: device open ----
  def open_device(self, s: Section):
    from baregrad.hcq.device import Device
    if self.name in Device._open:
      self.dev = Device._open[self.name]
      s.add(f"{self.name} was already open in this process: no open calls to show")
      return
    what = {"CPU": "a command processor thread over host memory", "METAL": "Metal.framework"}.get(self.kind,
                                                                                                "the kernel driver")
    if self.emulated: what = f"the emulated {'framework' if self.kind == 'METAL' else 'kernel driver and GPU'}, EMU=1"
    mark, start = self.calls.count, time.perf_counter()
    try:
      self.dev = Device.get(self.name)
    finally:
      calls = self.calls.since(mark)
      ms = (time.perf_counter() - start) * 1e3
      s.add(f"opening {self.name} ({what}): {len(calls)} kernel calls in {ms:.1f} ms")
      if self.kind == "METAL":
        s.add("(the Metal driver talks to the GPU through Objective-C messages to Metal.framework, which makes its own "
              "kernel calls; only calls of baregrad's own kernel interface are listed)")
      s.add(*_indent(calls))
      s.calls_listed = True
    s.add(f"opened: {type(self.dev.driver).__name__}")

  # ---- 2: kernel driver and firmware ----
  def driver_facts(self, s: Section):
    why = None                   # why the host cannot have this device
    if self.emulated:
      from baregrad.hcq.device import probe
      probe(self.kind)           # (imports the driver, which registers its emulated kernel driver, as Device.get does)
      row = info.emulated(self.kind)
      s.add(f"emulated (EMU=1): {row['name']}")
      s.add(*_indent(f"{k}: {v}" for k, v in row.items() if k not in ("name", "emulated")))
    elif self.kind == "CPU":
      p = self.host_props or info.cpu_properties()
      s.add("CPU device: no kernel driver or firmware; kernels are C compiled on this machine")
      s.add(*_indent(f"{k}: {p[k]}" for k in ("compiler", "kernel_flags", "queue") if k in p))
      s.add(f"  threads per kernel: {settings.THREADS}")
      if str(p.get("compiler", "")).startswith("unavailable"): why = f"no C compiler: {p['compiler']}"
    else:
      why, props = info.HOST_CHECKS[self.kind]()
      s.add(f"host: {self.kind} {'available' if why is None else 'unavailable'}")
      s.add(*_indent(f"{k}: {v}" for k, v in props.items()))
    facts = {"AMD": amd_facts, "NV": nv_facts, "METAL": metal_facts, "CPU": None}[self.kind]
    if self.dev is None:
      s.add("(the device did not open: what its driver reads while opening is not available)")
    elif facts is not None:
      s.add(f"what the driver reads{' from the emulator' if self.emulated else ''}:")
      s.add(*_indent(facts(self.dev.driver)))
    if why is not None: self.fail(s, what=why)

  # ---- 4: smoke checks ----
  def smoke(self, s: Section):
    from .smoke import run_smoke
    out = io.StringIO()
    ok = run_smoke(self.name, out=out)
    s.add(out.getvalue().rstrip())
    if not ok: self.fail(s, what="a smoke check failed (its traceback is above)")

  # ---- 5: ops against numpy ----
  def ops(self, s: Section):
    from baregrad.tensor import Tensor
    name = self.name
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    i, j = rng.integers(-1000, 1000, 1000).astype(np.int32), rng.integers(1, 100, 1000).astype(np.int32)
    t = lambda x: Tensor(x, device=name)     # noqa: E731
    other = "CPU:1" if self.kind == "CPU" else "CPU"     # (the CPU device copies to a second command processor)
    shifted = np.exp(a - a.max(-1, keepdims=True))
    cases = [   # (what, baregrad, numpy, absolute tolerance, relative tolerance)
      ("add 64x64 float32", lambda: t(a) + t(b), a + b, 0, 0),
      ("mul 64x64 float32", lambda: t(a) * t(b), a * b, 0, 0),
      ("exp 64x64 float32", lambda: t(a).exp(), np.exp(a), 1e-6, 1e-5),
      ("sum over axis 1, 64x64 float32", lambda: t(a).sum(axis=1), a.sum(axis=1), 1e-4, 1e-5),
      ("matmul 64x64 @ 64x64 float32", lambda: t(a) @ t(b), a @ b, 1e-4, 1e-4),
      ("softmax over the last axis, 64x64", lambda: t(a).softmax(-1), shifted / shifted.sum(-1, keepdims=True), 1e-6, 1e-5),
      ("int32 (i * 3 + j) // j, 1000", lambda: (t(i) * 3 + t(j)) // t(j), (i * 3 + j) // j, 0, 0),
      (f"copy {name} -> {other} -> {name}, 64x64", lambda: t(a).to(other).to(name), a, 0, 0),
    ]
    s.add(f"{'op':38s} {'result':6s} {'max abs err':>12s} {'tolerance':>18s} {'ms':>8s}")
    for what, run, ref, atol, rtol in cases:
      start = time.perf_counter()
      try:
        got = run().numpy()
        ms = (time.perf_counter() - start) * 1e3
        err = float(np.max(np.abs(got.astype(np.float64) - ref))) if got.shape == ref.shape else float("nan")
        ok = got.shape == ref.shape and got.dtype == ref.dtype and bool(np.allclose(got, ref, rtol=rtol, atol=atol))
        tol = "exact" if atol == rtol == 0 else f"{atol:.0e} + {rtol:.0e}*|ref|"
        s.add(f"{what:38s} {'PASS' if ok else 'FAIL':6s} {err:12.3g} {tol:>18s} {ms:8.1f}")
        if not ok:
          self.fail(s, what=f"{what}: got {got.dtype} {got.shape}, numpy {ref.dtype} {ref.shape}, largest absolute error "
                            f"{err:.3g}")
      except Exception as e:
        s.add(f"{what:38s} FAIL")
        self.fail(s, e)

  # ---- 6: fault recovery ----
  def fault_recovery(self, s: Section):
    from baregrad.hcq.device import Device
    from baregrad.tensor import Tensor
    dev = self.dev
    injection = self._injection(dev)
    if isinstance(injection, str):
      s.status = "SKIP"
      s.add(f"skipped: {injection}")
      return
    what, inject = injection
    s.add(f"injected: {what}")
    start = time.perf_counter()
    try:
      inject()
      dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)   # work after it, which never runs
      dev.synchronize(timeout=FAULT_SECONDS)
    except Exception as e:
      error, seconds = e, time.perf_counter() - start
    else:
      return self.fail(s, what=f"no error within {FAULT_SECONDS:g} s: the device took the bad packet without reporting it")
    s.add(f"error after {seconds:.3f} s: {type(error).__name__}:", *_indent(str(error).splitlines()))
    if isinstance(error, TimeoutError):    # the queue stopped, but nothing reported why
      return self.fail(s, what="the device did not report the bad packet: the wait for the work after it timed out")
    if seconds > FAULT_SECONDS: self.fail(s, what=f"the error took {seconds:.1f} s (more than {FAULT_SECONDS:g} s)")
    if self.name not in str(error): self.fail(s, what=f"the error does not name the device {self.name}")
    if getattr(error, "queues_reset", False):
      s.add("the driver recovered its queues (the error says so): the same device must compute again")
    else:   # a fault the driver does not recover from: the device is lost, every later call must say so
      try: dev.synchronize(timeout=FAULT_SECONDS)
      except Exception as again:
        s.add(f"device lost: the next call reports the fault again ({type(again).__name__}); closing and opening it again")
      else:
        return self.fail(s, what="the device reported the fault once, then went on as if nothing had happened")
      dev.close()
      self.dev = Device.get(self.name)
    x = np.arange(16, dtype=np.float32)
    got = (Tensor(x, device=self.name) * 2 + 1).numpy()
    if not np.array_equal(got, x * 2 + 1): return self.fail(s, what=f"after the fault, x * 2 + 1 gave {got[:4]} ...")
    s.add("after the fault: x * 2 + 1 over 16 floats equals numpy's")

  def _injection(self, dev):
    """(what, a function that puts a bad packet on the compute queue), or why there is none here."""
    from baregrad.drivers.encoded import Encoded
    if self.kind == "METAL":
      if not settings.EMU: return METAL_FAULT
      from baregrad.hcq.program import Program
      def launch():
        prog = Program(dev.name, "bg_doctor_fault", METAL_FAULT_MSL.encode(), METAL_FAULT_MSL, n_params=1).load(dev)
        out = dev.allocator.alloc(256)
        dev.compute_queue().exec(prog, dev.kernargs.put([out.addr]), (1, 1, 1), (64, 1, 1)).submit(dev)
        dev.allocator.free(out, 256)       # (given back once the work queued before is done)
      return "a kernel whose thread 5 skips the threadgroup barrier the other 63 wait at", launch
    if self.kind in ("AMD", "NV") and not self.emulated and not self.inject_fault: return REAL_GPU_FAULT
    if self.kind == "CPU":
      from baregrad.drivers.cpu.processor import Op, header
      op = max(Op) + 7
      words, what = [header(op, 1)], f"a packet with opcode {op}, which the CPU command processor does not know"
    elif self.kind == "AMD":
      from baregrad.drivers.amd import pm4
      op = next(o for o in range(0xFF, 0, -1) if o not in pm4.NAMES)
      words, what = [pm4.header(op, 1), 0], f"a PM4 packet with opcode {op:#04x}, which no compute queue knows"
    else:
      from baregrad.drivers.nv import pushbuf
      # SEC_OP 6 is RESERVED6 in clc56f.h's method header (31:29): no pushbuffer opcode
      words, what = [pushbuf.method_header(0, 0, 1, sec_op=6)], "a pushbuffer method header with the reserved opcode 6"
    return what, lambda: dev.driver.submit("compute", Encoded(words))

  # ---- 7 (--perf): performance ----
  def performance(self, s: Section):
    """Bandwidths, FLOP rates and latencies a person with the hardware can compare with other software on it: kernel
    times by the device's own timestamps (each kernel run for a while first: GPU clocks ramp up under load), copies and
    latencies by the host's clock. Sizes fit the device (a GPU's memory bandwidth needs gigabytes; an emulator only a
    few kilobytes, and its times say nothing of hardware)."""
    from baregrad.hcq.device import Device
    from baregrad.hcq.runtime import time_item
    from baregrad.tensor import Tensor
    from baregrad.tensor.jit import jit
    dev, name = Device.get(self.name), self.name
    big = "emulated" if self.emulated else "cpu" if self.kind == "CPU" else "gpu"
    n_add, n_mv, n_mm, n_copy = PERF_SIZES[big]
    warm = 0.0 if self.emulated else PERF_WARM_SECONDS
    if self.emulated: s.add("(an emulated device: the emulator's times, which say nothing of a GPU's)")
    rng = np.random.default_rng(0)

    # a GPU's kernels are timed LAUNCHES at a time, back to back (time_item): one launched alone after a wait runs
    # slower (an H200 took 2.4x as long for an add), and a model's kernels run queued behind one another
    launches = PERF_LAUNCHES if big == "gpu" else 1

    def kernels(t: "Tensor", reps: int = 5) -> tuple[float, int]:
      items = [it for it in t.schedule() if it.program is not None]
      for it in items:
        for b in it.bufs: b.ensure_allocated()
      end = time.perf_counter() + warm
      while True:
        once = sum(time_item(dev, it, launches) for it in items)
        if time.perf_counter() >= end: break
      return min([once] + [sum(time_item(dev, it, launches) for it in items) for _ in range(reps - 1)]), len(items)

    def wall(fn, reps: int) -> float:
      fn()
      times = []
      for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
      return float(np.median(times))

    def row(what: str, value: str): s.add(f"{what:62s} {value}")
    s.add(f"{'figure':62s} value")
    x = Tensor(rng.standard_normal(n_add, dtype=np.float32), device=name).realize()
    y = Tensor(rng.standard_normal(n_add, dtype=np.float32), device=name).realize()
    dt, k = kernels(x + y)
    row(f"add of {n_add >> 20 or n_add} {'Mi ' if n_add >> 20 else ''}float32 (kernel)",
        f"{dt * 1e6:10.1f} us  {12 * n_add / dt / 1e9:8.1f} GB/s of the three arrays")
    for dt_name, np_dt in (("float16", np.float16), ("float32", np.float32)):
      w = Tensor((rng.standard_normal((n_mv, n_mv)) * 0.1).astype(np_dt), device=name).realize()
      v = Tensor(rng.standard_normal((1, n_mv)).astype(np_dt), device=name).realize()
      dt, k = kernels(v @ w.T)
      row(f"matvec {n_mv}x{n_mv} {dt_name}, x @ W.T ({k} kernel{'s' * (k > 1)})",
          f"{dt * 1e6:10.1f} us  {n_mv * n_mv * np.dtype(np_dt).itemsize / dt / 1e9:8.1f} GB/s of weights")
    # the two other layouts language models bring: weights of shape (in, out) (GPT-2's), and Q8_0 blocks
    w = Tensor((rng.standard_normal((n_mv, n_mv)) * 0.1).astype(np.float16), device=name).realize()
    v = Tensor(rng.standard_normal((1, n_mv)).astype(np.float16), device=name).realize()
    dt, k = kernels(v @ w)
    row(f"matvec {n_mv}x{n_mv} float16, x @ W ({k} kernel{'s' * (k > 1)})",
        f"{dt * 1e6:10.1f} us  {n_mv * n_mv * 2 / dt / 1e9:8.1f} GB/s of weights")
    from baregrad.tensor.ggml_quants import dequantize
    from .bench_llm import random_blocks
    raw, _, _ = random_blocks(rng, "Q8_0", (n_mv, n_mv))
    wq = dequantize(Tensor(np.frombuffer(raw, np.uint8), device=name).realize(), "Q8_0", (n_mv, n_mv))
    v = Tensor(rng.standard_normal((1, n_mv)).astype(np.float32), device=name).realize()
    dt, k = kernels(v @ wq.T)
    row(f"matvec {n_mv}x{n_mv} Q8_0, x @ W.T ({k} kernel{'s' * (k > 1)})",
        f"{dt * 1e6:10.1f} us  {len(raw) / dt / 1e9:8.1f} GB/s of weights")
    for dt_name, np_dt in (("float32", np.float32), ("float16", np.float16)):
      a = Tensor(rng.standard_normal((n_mm, n_mm)).astype(np_dt), device=name).realize()
      b = Tensor(rng.standard_normal((n_mm, n_mm)).astype(np_dt), device=name).realize()
      dt, k = kernels(a @ b)
      row(f"matmul {n_mm}^3 {dt_name} ({k} kernel{'s' * (k > 1)})", f"{dt * 1e6:10.1f} us  {2 * n_mm ** 3 / dt / 1e12:8.3f} TFLOP/s")
    host = rng.standard_normal(n_copy // 4, dtype=np.float32)
    up = wall(lambda: (Tensor(host, device=name).realize(), dev.synchronize()), 3)
    t = Tensor(host, device=name).realize()
    down = wall(lambda: t.numpy(), 3)
    row(f"host -> device, device -> host {n_copy >> 20} MiB", f"{n_copy / up / 1e9:6.2f} GB/s, {n_copy / down / 1e9:6.2f} GB/s")
    small = Tensor(np.ones(1024, np.float32), device=name).realize()
    row("a small op, realize + synchronize (median of 50)", f"{wall(lambda: ((small + 1).realize(), dev.synchronize()), 50) * 1e6:10.1f} us")

    @jit
    def step(a): return (a * 2 + 1).sum()
    for _ in range(3): step(small).realize()
    row("a jitted one-kernel step, replay + synchronize (median of 50)",
        f"{wall(lambda: (step(small).realize(), dev.synchronize()), 50) * 1e6:10.1f} us")

  # ---- summary (the last section) ----
  def summary(self, seconds: float):
    done = sorted(self.sections, key=lambda s: s.number)
    failed = [s.title for s in done if s.status == "FAIL"]
    skipped = [s.title for s in done if s.status == "SKIP"]
    s = Section(done[-1].number + 1, "summary", "FAIL" if failed else "PASS", seconds)
    s.add(f"{len(done) - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    if failed: s.add(f"failed: {'; '.join(failed)}")
    if skipped: s.add(f"skipped: {'; '.join(skipped)}")
    self.sections.append(s)

  @property
  def passed(self) -> bool: return not any(s.status == "FAIL" for s in self.sections)


# ---- what each driver read while opening its device ----
def amd_facts(d) -> list[str]:
  from baregrad.drivers.amd import kfd
  from baregrad.drivers.amd.topology import TOPOLOGY, parse_properties
  node, p, k = d.node, d.node.props, d.kernel
  module = _read(k, "/sys/module/amdgpu/version")
  module = module.strip() if module else "none (no /sys/module/amdgpu/version: an in-tree amdgpu has none)"
  lines = [f"KFD ioctl interface {d.version[0]}.{d.version[1]} (AMDKFD_IOC_GET_VERSION)", f"amdgpu module version: {module}",
           f"GPU: topology node {node.index}, gpu_id {node.gpu_id:#x}, {node.target} (gfx_target_version "
           f"{p.get('gfx_target_version')}), PCI {p.get('vendor_id', 0):04x}:{p.get('device_id', 0):04x}, "
           f"location {p.get('location_id', 0):#x}, render node {node.render_node}",
           f"firmware: MEC fw_version {p.get('fw_version')}, SDMA sdma_fw_version {p.get('sdma_fw_version')}"]
  vbios = _read(k, f"/sys/class/drm/renderD{p.get('drm_render_minor')}/device/vbios_version")
  lines.append(f"VBIOS: {vbios.strip() if vbios else 'not reported'}")
  lines.append(f"limits: {node.cu_count} CUs ({p.get('simd_count')} SIMDs, {p.get('simd_per_cu')} per CU), wave"
               f"{p.get('wave_front_size')}, {p.get('max_waves_per_simd')} waves per SIMD, {node.lds_bytes >> 10} KiB LDS, "
               f"{p.get('num_cp_queues')} CP queues, {p.get('num_sdma_engines')} SDMA engines, "
               f"{p.get('max_engine_clk_fcompute')} MHz, {p.get('num_xcc', 1)} XCC")
  heaps = {kfd.HEAP_TYPE_SYSTEM: "SYSTEM", kfd.HEAP_TYPE_FB_PUBLIC: "FB_PUBLIC", kfd.HEAP_TYPE_FB_PRIVATE: "FB_PRIVATE"}
  for b in range(len(node.heap_types)):
    bank = parse_properties(_read(k, f"{TOPOLOGY}/nodes/{node.index}/mem_banks/{b}/properties") or "")
    heap = bank.get("heap_type", 1)
    lines.append(f"memory bank {b}: heap_type {heap} ({heaps.get(heap, '?')}), "
                 f"{bank.get('size_in_bytes', 0) / 2**30:.1f} GiB")
  lines.append("large BAR: " + ("yes: all of the VRAM is host-visible" if d.large_bar else
                                "no: host-visible memory lives in GTT (system memory)"))
  return lines


def nv_facts(d) -> list[str]:
  from baregrad.drivers.nv import rm, cubin
  from baregrad.drivers.nv.rm import ffi
  lines = [f"kernel driver {d.version} (NV_ESC_CHECK_VERSION_STR); baregrad's RM structs are for the "
           f"{', '.join(s + '.x' for s in rm.SUPPORTED_SERIES)} series (checked against {rm.HEADERS_VERSION})"]
  proc = _read(d.k, "/proc/driver/nvidia/version")
  if proc: lines.append(f"/proc/driver/nvidia/version: {proc.strip().splitlines()[0]}")
  cards = ffi.new(f"nv_ioctl_card_info_t[{rm.NV_MAX_DEVICES}]")
  d.rm.escape(d.fd_ctl, rm.NV_ESC_CARD_INFO, cards)
  for c in cards:
    if not c.valid or c.minor_number != d.minor: continue
    pci = c.pci_info
    bdf = f"{pci.domain:04x}:{pci.bus:02x}:{pci.slot:02x}.{pci.function:x}"
    model = next((line.split(":", 1)[1].strip() for line in (_read(d.k, f"/proc/driver/nvidia/gpus/{bdf}/information") or "")
                  .splitlines() if line.startswith("Model:")), "not reported")
    fb = f"{c.fb_size / 2**30:.1f} GiB" if c.fb_size else "not reported"
    lines.append(f"GPU: {d.dev_path}, PCI {pci.vendor_id:04x}:{pci.device_id:04x} at {bdf}, model {model}, framebuffer "
                 f"{fb} (NV_ESC_CARD_INFO)")
  h = d.uuid.hex()
  lines.append(f"UUID: GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
  lines.append(f"architecture: {d.target}, QMD {d.qmd_version[0]}.{d.qmd_version[1]}; classes: compute "
               f"{rm.class_name(d.compute_class)}, copy {rm.class_name(d.copy_class)}, channel "
               f"{rm.class_name(d.channel_class)}, usermode {rm.class_name(d.usermode_class)}")
  lines.append(f"limits: {d.warps_per_sm} warps per SM, {d.sms_per_tpc} SMs per TPC, up to {d.tpcs} TPCs on a chip of "
               f"this architecture, shared memory carveouts {', '.join(str(c >> 10) for c in d.carveouts)} KiB")
  try:
    path = cubin.find_ptxas()
    lines.append(f"ptxas: {cubin.ptxas_version(path)}")
  except Exception as e:
    lines.append(f"ptxas: {e}")
  return lines


def metal_facts(d) -> list[str]:
  return [f"device: {d.device_name}", f"GPU families: {', '.join(d.families) or 'none listed'}",
          "indirect command buffers dispatch each pipeline once first (before Apple9): "
          + ("yes" if d.icb_pipeline_fix else "no")]


# ---- the command ----
def render(doctor: Doctor, command: list[str]) -> str:
  now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  lines = [f"baregrad doctor report: {doctor.name}{' (emulated, EMU=1)' if doctor.emulated else ''}, {now}",
           f"command: {'EMU=1 ' if settings.EMU else ''}{shlex.join(command)}", ""]
  for s in sorted(doctor.sections, key=lambda s: s.number):
    lines.append(f"[{s.number}] {s.title:40s} {s.status:4s} {s.seconds * 1e3:10.1f} ms")
    lines += [INDENT + line for line in s.lines]
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def short_summary(doctor: Doctor) -> str:
  done = sorted(doctor.sections, key=lambda s: s.number)
  return "\n".join([f"[{s.number}] {s.title:40s} {s.status}" for s in done] + [INDENT + line for line in done[-1].lines])


def run_doctor(device: str | None, output: str | None = None, inject_fault: bool = False, out=None,
               perf: bool = False) -> int:
  """Run every section and print the report (with `output`: write it there and print the summary). 0 when nothing
  failed, 1 when a check failed, 2 for a bad device name or an output file that cannot be written."""
  from baregrad.hcq.device import Device, canonical
  out = out or sys.stdout
  try: name = canonical(device) if device else Device.default()
  except ValueError as e:
    print(f"baregrad doctor: {e}", file=sys.stderr)
    return 2
  report_file = None
  if output:
    try: report_file = open(output, "w")
    except OSError as e:
      print(f"baregrad doctor: cannot write the report to {output}: {e.strerror}", file=sys.stderr)
      return 2
  doctor = Doctor(name, inject_fault, perf)
  doctor.run()
  command = ["baregrad", "doctor", "--device", name] + (["-o", output] if output else []) + \
            (["--inject-fault"] if inject_fault else []) + (["--perf"] if perf else [])
  text = render(doctor, command)
  if report_file is None:
    out.write(text)
  else:
    with report_file: report_file.write(text)
    print(short_summary(doctor), file=out)
    print(f"report written to {output}: send this file back", file=out)
  return 0 if doctor.passed else 1
