"""`baregrad smoke [--device D]`: bring-up checks of one device, in the order a new driver comes up.

open -> allocate and map -> copy round trip (queue copy command) -> signal round trip (signal + wait commands)
-> timestamp clock -> empty kernel -> add kernel vs numpy -> copy bandwidth -> dispatch latency.
Each check prints a pass/fail row with its figures; the first failure stops the run and prints what it saw.
"""
from __future__ import annotations
from baregrad.compiler.codegen import compile_source
import statistics, sys, time, traceback
import numpy as np
from baregrad.hcq.device import device_ns   # queue timestamps -> ns (the driver's `timestamp_hz`)
from baregrad.drivers import settings


class CheckFailed(AssertionError):
  pass


def _expect(cond: bool, what: str):
  if not cond: raise CheckFailed(what)


class Smoke:
  def __init__(self, device: str):
    self.name = device
    self.dev = None
    self.keep = []
    self.small = settings.EMU    # emulated devices: smaller transfers

  def _run(self, q, timeout: float = 10.0):
    value = self.dev.next_timeline()
    q.signal(self.dev.timeline, value).submit(self.dev)
    self.dev.timeline.wait(value, timeout)
    self.dev.check_faults()

  def _mem(self, nbytes: int):
    mem = self.dev.allocator.alloc(nbytes)
    self.keep.append((mem, nbytes))
    return mem

  def open(self):
    from baregrad.hcq.device import Device
    t = time.perf_counter()
    self.dev = Device.get(self.name)
    return f"{type(self.dev.driver).__name__} in {(time.perf_counter() - t) * 1e3:.1f} ms"

  def allocate(self):
    n = 1 << 20
    mem = self._mem(n)
    pattern = (np.arange(n, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8)
    # through the driver's host copies (a GPU's own memory: its copy engine and host staging; the host reads it
    # through the BAR never, and writes it there only where that is fast)
    self.dev.driver.copyin(mem.addr, pattern)
    back = np.empty(n, np.uint8)
    self.dev.driver.copyout(memoryview(back), mem.addr)
    _expect(np.array_equal(back, pattern), f"host write/read of the memory at 0x{mem.addr:x} differs at "
            f"{int(np.count_nonzero(back != pattern))} bytes")
    return f"1 MiB at 0x{mem.addr:x}, host write/read ok"

  def copy_round_trip(self):
    n = 1 << 20
    a, b, c = self._mem(n), self._mem(n), self._mem(n)
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    self.dev.driver.copyin(a.addr, data)
    self.dev.driver.copyin(c.addr, bytes(n))
    self._run(self.dev.copy_queue().copy(b.addr, a.addr, n).memory_barrier().copy(c.addr, b.addr, n))
    got = np.empty(n, np.uint8)
    self.dev.driver.copyout(memoryview(got), c.addr)
    bad = np.flatnonzero(got != data)
    _expect(len(bad) == 0, f"{len(bad)} of {n} bytes differ after A->B->C; first at byte {bad[0] if len(bad) else 0}: "
            f"got {got[bad[0]] if len(bad) else 0}, wrote {data[bad[0]] if len(bad) else 0}")
    return f"{n >> 10} KiB A->B->C through the copy queue, identical"

  def signal_round_trip(self):
    from baregrad.hcq.signal import Signal
    gate, done = Signal(self.dev, "smoke gate"), Signal(self.dev, "smoke done")
    value = self.dev.next_timeline()
    self.dev.compute_queue().wait(gate, 1).signal(done, 7).signal(self.dev.timeline, value).submit(self.dev)
    time.sleep(0.02)
    _expect(done.value == 0, f"the queue passed a wait on a signal the host had not set (done={done.value})")
    t = time.perf_counter()
    gate.value = 1
    done.wait(7, timeout=5)
    rt = (time.perf_counter() - t) * 1e6
    self.dev.timeline.wait(value, 5)
    return f"queue waited for the host's signal, then signalled 7; round trip {rt:.1f} us"

  def timestamps(self):
    from baregrad.hcq.signal import Signal
    sigs = [Signal(self.dev, f"ts{i}") for i in range(8)]
    q = self.dev.compute_queue()
    for s in sigs: q.timestamp(s)
    self._run(q)
    ts = [device_ns(self.dev, s.timestamp) for s in sigs]
    _expect(all(b >= a for a, b in zip(ts, ts[1:])), f"timestamps in one queue went backwards: {ts}")
    _expect(ts[0] != 0, "the queue wrote a timestamp of 0")
    # the device's interval a -> b lies inside the host's outer interval and contains the host's sleep
    a, b = Signal(self.dev, "ta"), Signal(self.dev, "tb")
    outer0 = time.perf_counter_ns()
    self._run(self.dev.compute_queue().timestamp(a))
    h0 = time.perf_counter_ns()
    time.sleep(0.05)
    h1 = time.perf_counter_ns()
    self._run(self.dev.compute_queue().timestamp(b))
    outer1 = time.perf_counter_ns()
    dev_dt, inner, outer = device_ns(self.dev, b.timestamp) - device_ns(self.dev, a.timestamp), h1 - h0, outer1 - outer0
    _expect(dev_dt > 0, f"the second timestamp ({b.timestamp}) is not after the first ({a.timestamp})")
    hz = self.dev.driver.timestamp_hz
    _expect(0.98 * inner <= dev_dt <= 1.02 * outer,
            f"device clock ran {dev_dt / 1e6:.3f} ms between two timestamps; the host slept {inner / 1e6:.3f} ms between "
            f"them and saw {outer / 1e6:.3f} ms in all (timestamps read as {'ns' if hz == 1_000_000_000 else f'{hz} Hz ticks'}; "
            "expected them to advance at the host clock's rate)")
    return f"monotonic; {dev_dt / 1e6:.2f} ms on the device around a {inner / 1e6:.2f} ms host sleep (x{dev_dt / inner:.3f})"

  def empty_kernel(self):
    from baregrad.compiler.codegen import renderer_for
    from baregrad.hcq.program import Program
    src = renderer_for(self.dev.name).render("bg_smoke_empty", [], {}, 0, [])
    t = time.perf_counter()
    self.empty = Program(self.dev.name, "bg_smoke_empty", compile_source(self.dev.name, src), src).load(self.dev)
    compile_ms = (time.perf_counter() - t) * 1e3
    self._run(self.dev.compute_queue().exec(self.empty, self.dev.kernargs.put([])))
    return f"compiled + loaded in {compile_ms:.1f} ms, ran"

  def add_kernel(self):
    from baregrad.tensor import Tensor
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(4099).astype(np.float32), rng.standard_normal(4099).astype(np.float32)
    got = (Tensor(a, device=self.dev.name) + Tensor(b, device=self.dev.name)).numpy()
    ref = a + b
    bad = np.flatnonzero(got != ref)
    _expect(len(bad) == 0, f"{len(bad)} of {len(ref)} sums differ from numpy; first at {bad[0] if len(bad) else 0}: "
            f"got {got[bad[0]] if len(bad) else 0}, numpy {ref[bad[0]] if len(bad) else 0}")
    return "4099 float32 sums equal numpy's"

  def bandwidth(self):
    from baregrad.hcq.signal import Signal
    n = (4 if self.small else 64) << 20
    a, b = self._mem(n), self._mem(n)
    self.dev.driver.copyin(a.addr, bytes(n))
    best = 0.0
    for _ in range(3):
      t0, t1 = Signal(self.dev, "bw0"), Signal(self.dev, "bw1")
      self._run(self.dev.copy_queue().timestamp(t0).copy(b.addr, a.addr, n).timestamp(t1))
      best = max(best, n / max(device_ns(self.dev, t1.timestamp) - device_ns(self.dev, t0.timestamp), 1))
    return f"{best:.2f} GB/s ({n >> 20} MiB copy, best of 3, device timestamps)"

  def latency(self):
    q_times = []
    for i in range(120):
      t = time.perf_counter()
      self._run(self.dev.compute_queue().exec(self.empty, self.dev.kernargs.put([])))
      if i >= 20: q_times.append(time.perf_counter() - t)
    med = statistics.median(q_times) * 1e6
    return f"{med:.1f} us median submit -> kernel -> signal seen by the host (100 runs; p90 " \
           f"{sorted(q_times)[89] * 1e6:.1f} us)"


CHECKS = [("open", "open"), ("allocate and map", "allocate"), ("copy round trip", "copy_round_trip"),
          ("signal round trip", "signal_round_trip"), ("timestamp clock", "timestamps"), ("empty kernel", "empty_kernel"),
          ("add kernel vs numpy", "add_kernel"), ("copy bandwidth", "bandwidth"), ("dispatch latency", "latency")]


def run_smoke(device: str | None = None, out=None) -> bool:
  from baregrad.hcq.device import Device, canonical
  out = out or sys.stdout
  try: name = canonical(device) if device else Device.default()
  except ValueError as e:
    print(f"baregrad smoke: {e}", file=out)
    return False
  smoke = Smoke(name)
  print(f"smoke test of {name}", file=out)
  print(f"{'check':22s} {'result':6s} {'ms':>8s}  figures", file=out)
  for title, method in CHECKS:
    t = time.perf_counter()
    try:
      figures = getattr(smoke, method)()
      ok = True
    except Exception as e:
      ok, figures = False, f"{type(e).__name__}: {e}"
      tb = traceback.format_exc()
    ms = (time.perf_counter() - t) * 1e3
    print(f"{title:22s} {'PASS' if ok else 'FAIL':6s} {ms:8.1f}  {figures}", file=out, flush=True)
    if not ok:
      print(f"\nstopped at '{title}'. what it saw:\n{tb.rstrip()}", file=out)
      if smoke.dev is not None and smoke.dev.last_command: print(f"last command submitted: {smoke.dev.last_command}", file=out)
      return False
  for mem, nbytes in smoke.keep: smoke.dev.allocator.free(mem, nbytes)
  print(f"all {len(CHECKS)} checks passed", file=out)
  return True
