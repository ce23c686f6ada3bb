"""The CPU command processor's worker between submissions: it stays awake through the short gaps of an eager host
loop (a doorbell that has to wake it costs the host a futex syscall), and it does not spin on the CPU the host thread
runs on (the two shared one CPU for as long as an eager loop ran, which made every op ~15% slower: a futex wake
places the woken thread beside its waker, and the scheduler seldom separated them).

Linux facts: /proc/<pid>/task/<tid>/stat field 39 is the CPU the thread last ran on (proc(5))."""
import os, sys, threading, time
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


def test_worker_stays_awake_through_short_gaps():
  """Submissions 120 us apart (more than the shortest spin, 50 us): after the first few, the doorbell finds the
  worker spinning, not asleep."""
  proc = CommandProcessor(ring_words=1 << 10)
  try:
    signal = np.zeros(1, np.uint64)
    asleep = 0
    for i in range(1, 401):
      busy_wait(120e-6)
      if i > 20: asleep += proc._ctl.sleeping
      submit_and_wait(proc, signal, i)
    assert asleep <= 38, f"the worker slept at {asleep} of 380 doorbells 120 us apart"
  finally:
    proc.stop()


def test_worker_sleeps_after_a_long_gap():
  """A host that stops submitting does not keep a CPU busy: the worker sleeps within a millisecond."""
  proc = CommandProcessor(ring_words=1 << 10)
  try:
    signal = np.zeros(1, np.uint64)
    for i in range(1, 51):
      busy_wait(100e-6)
      submit_and_wait(proc, signal, i)
    time.sleep(0.005)
    assert proc._ctl.sleeping == 1
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
    for i in range(3, 203):
      busy_wait(40e-6)
      submit_and_wait(proc, signal, i)
    assert last_cpu(worker) != host_cpu, "the worker still spins on the host thread's CPU"
    time.sleep(0.01)                                  # idle: the worker sleeps, with its own CPU mask back
    assert proc._ctl.sleeping == 1
    assert os.sched_getaffinity(worker) == set(allowed), "the worker's CPU mask was not given back"
  finally:
    os.sched_setaffinity(0, old_host)
    proc.stop()
