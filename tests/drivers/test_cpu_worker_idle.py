"""The CPU command processor's worker between submissions: it stays awake through the short gaps of an eager host
loop (a doorbell that has to wake it costs the host a futex syscall), and it does not spin on the CPU the host thread
runs on (the two shared one CPU for as long as an eager loop ran, which made every op ~15% slower: a futex wake
places the woken thread beside its waker, and the scheduler seldom separated them).

Linux facts: /proc/<pid>/task/<tid>/stat field 39 is the CPU the thread last ran on (proc(5))."""
import math, os, sys, time
import numpy as np
import pytest
from baregrad.drivers.cpu.processor import CommandProcessor, Op, packet

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduler facts")


def addr(a: np.ndarray) -> int: return a.ctypes.data


def last_cpu(tid: int) -> int:
  stat = open(f"/proc/{os.getpid()}/task/{tid}/stat").read()
  return int(stat[stat.rindex(")") + 2:].split()[36])


def busy_wait(seconds: float) -> None:
  end = time.perf_counter() + seconds
  while time.perf_counter() < end: pass


def submit_and_wait(proc: CommandProcessor, signal: np.ndarray, value: int) -> None:
  proc.write(packet(Op.NOP) + packet(Op.SIGNAL, addr(signal), value))
  assert proc.wait_value(addr(signal), value, timeout=10)


def until_asleep(proc: CommandProcessor, timeout: float = 1.0) -> float:
  """Seconds until the worker sleeps (polling its flag); inf if it does not within `timeout`."""
  start = time.perf_counter()
  while time.perf_counter() - start < timeout:
    if proc._ctl.sleeping: return time.perf_counter() - start
  return math.inf


def test_worker_spins_longer_after_short_gaps():
  """After submissions 120 us apart (more than the shortest spin, 50 us) the worker spins for several such gaps
  before it sleeps, so the next doorbell of an eager loop finds it awake. (A spin is timed by the clock: being
  descheduled never shortens it; a gap that looked long because the worker was descheduled shortens the next spin,
  hence the best of several tries: with the suite's other worker busy on the same cores (pytest -n), one try in five
  or ten keeps the CPU through its 40 submissions.)"""
  proc = CommandProcessor(ring_words=1 << 10)
  try:
    signal, value, spins = np.zeros(1, np.uint64), 0, []
    for _ in range(30):
      for _ in range(40):
        busy_wait(120e-6)
        value += 1
        submit_and_wait(proc, signal, value)
      spins.append(until_asleep(proc))
      if spins[-1] >= 200e-6: break
    assert max(spins) >= 200e-6, f"the worker slept {min(spins) * 1e6:.0f} us after the ring emptied"
    assert max(spins) < math.inf
  finally:
    proc.stop()


def test_worker_sleeps_after_a_long_gap():
  """A host that stops submitting does not keep a CPU busy: the worker sleeps (within its longest spin, 400 us, when
  it has the CPU)."""
  proc = CommandProcessor(ring_words=1 << 10)
  try:
    signal = np.zeros(1, np.uint64)
    for i in range(1, 51):
      busy_wait(100e-6)
      submit_and_wait(proc, signal, i)
    assert until_asleep(proc) < math.inf
  finally:
    proc.stop()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may run on")
def test_worker_leaves_the_host_cpu():
  """Put the worker on the host thread's CPU (pinned there a moment, then allowed every CPU again: it stays until
  something moves it) and submit as an eager loop does: within a few submissions it runs on another CPU."""
  allowed = sorted(os.sched_getaffinity(0))
  host_cpu = allowed[0]
  proc = CommandProcessor(ring_words=1 << 10)
  worker = proc._thread.native_id
  old_host = os.sched_getaffinity(0)
  try:
    os.sched_setaffinity(0, {host_cpu})               # this (host) thread only
    signal = np.zeros(1, np.uint64)
    submit_and_wait(proc, signal, 1)
    os.sched_setaffinity(worker, {host_cpu})
    submit_and_wait(proc, signal, 2)                  # the worker has run on host_cpu
    assert last_cpu(worker) == host_cpu
    os.sched_setaffinity(worker, set(allowed))
    moved = False
    for i in range(3, 2003):                          # (on a quiet machine the first few submissions do it)
      busy_wait(40e-6)
      submit_and_wait(proc, signal, i)
      if i > 20 and last_cpu(worker) != host_cpu: moved = True; break
    assert moved, "the worker still spins on the host thread's CPU"
    assert until_asleep(proc) < math.inf              # idle: the worker sleeps, with its own CPU mask back
    assert os.sched_getaffinity(worker) == set(allowed), "the worker's CPU mask was not given back"
  finally:
    os.sched_setaffinity(0, old_host)
    proc.stop()
