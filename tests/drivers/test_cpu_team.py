"""The CPU command processor's EXEC_MT team under CPU contention: every chunk of every job runs exactly once,
with that job's function and arguments.

A job's chunks used to be claimed with a fetch-add on one shared counter: a helper that had read job k and was
then descheduled could claim chunk 0 of job k+1 and run it with job k's function and arguments, so chunk 0 of
job k+1 was never computed (half of a 2-chunk gradient came back 0.0). Contention (a busy process on every
core) makes such preemptions frequent; these tests caught the race within a few hundred jobs."""
import os, subprocess, sys, time
import numpy as np
import pytest
from helpers_stress import busy_cores
from baregrad.drivers.cpu import cc
from baregrad.drivers.cpu.elf import load_elf
from baregrad.drivers.cpu.processor import CommandProcessor, Op, packet, _Worker

MARK_SRC = r"""
#include <stdint.h>
/* args: out, tag, spin. out[chunk] = tag + chunk; a short spin widens the window in which the others run */
void mark(const uint64_t *args, int64_t chunk) {
  volatile uint64_t s = 0;
  for (uint64_t i = 0; i < args[2]; i++) s += i;
  ((uint64_t *)args[0])[chunk] = args[1] + (uint64_t)chunk;
}
/* a second kernel: a job run with the wrong function shows up as the wrong value */
void mark_neg(const uint64_t *args, int64_t chunk) {
  ((uint64_t *)args[0])[chunk] = ~(args[1] + (uint64_t)chunk);
}
"""


def addr(a: np.ndarray) -> int: return a.ctypes.data


@pytest.fixture(scope="module")
def image():
  img = load_elf(cc.compile_c(MARK_SRC))
  yield img
  img.close()


def run_jobs(proc, image, njobs: int, nchunks: int, rng):
  """njobs EXEC_MT packets written back to back (one ring write, so the worker publishes them as fast as it
  can); returns (expected, outputs)."""
  fns = [image.symbol("mark"), image.symbol("mark_neg")]
  outs = np.zeros((njobs, nchunks), np.uint64)
  args = np.zeros((njobs, 3), np.uint64)
  which = rng.integers(0, 2, njobs)
  args[:, 0] = outs.ctypes.data + np.arange(njobs, dtype=np.uint64) * (8 * nchunks)
  args[:, 1] = np.arange(njobs, dtype=np.uint64) * 1000 + 1
  args[:, 2] = rng.integers(0, 200, njobs)
  words, signal = [], np.zeros(1, np.uint64)
  for j in range(njobs): words += packet(Op.EXEC_MT, fns[which[j]], addr(args) + 24 * j, nchunks)
  proc.write(words + packet(Op.SIGNAL, addr(signal), 1))
  assert proc.wait_value(addr(signal), 1, timeout=60)
  base = args[:, 1:2] + np.arange(nchunks, dtype=np.uint64)[None, :]
  expected = np.where(which[:, None] == 1, ~base, base)
  return expected, outs


@pytest.mark.parametrize("nchunks", [2, 7])
def test_exec_mt_every_chunk_once_under_contention(image, nchunks):
  _Worker.get().start_helpers(max(1, (os.cpu_count() or 1) - 1))
  rng = np.random.default_rng(nchunks)
  with CommandProcessor(ring_words=1 << 16) as proc, busy_cores():
    for _ in range(10):
      expected, outs = run_jobs(proc, image, 3000, nchunks, rng)
      bad = np.argwhere(outs != expected)
      assert not len(bad), (f"{len(bad)} chunks wrong, first (job, chunk) {bad[:5].tolist()}: "
                            f"got {outs[tuple(bad[0])]:#x}, expected {expected[tuple(bad[0])]:#x}")


def test_exec_mt_two_processors_at_once(image):
  """Two command processors share the one team of helpers: each job still runs every chunk exactly once."""
  import threading
  _Worker.get().start_helpers(max(1, (os.cpu_count() or 1) - 1))
  results, errors = [], []
  def one(seed):
    try:
      with CommandProcessor() as proc:
        results.append(run_jobs(proc, image, 1000, 3, np.random.default_rng(seed)))
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=one, args=(s,)) for s in range(2)]
  for t in threads: t.start()
  for t in threads: t.join(90)
  assert not errors and len(results) == 2
  for expected, outs in results: np.testing.assert_array_equal(outs, expected)



TID_SRC = r"""
#include <stdint.h>
static long gettid_raw(void) {    /* gettid: <asm/unistd_64.h> 186, asm-generic <unistd.h> 178 */
#if defined(__x86_64__)
  long r; __asm__ volatile("syscall" : "=a"(r) : "0"(186L) : "rcx", "r11", "memory"); return r;
#else
  register long x8 __asm__("x8") = 178, x0 __asm__("x0");
  __asm__ volatile("svc 0" : "=r"(x0) : "r"(x8) : "memory"); return x0;
#endif
}
/* args: out, running, most, spin, linger. out[chunk] = the id of the thread that ran the chunk; *most = the most
 * chunks that ran at once. A chunk spins `spin` steps, then, up to `linger` more, until more than `most_wanted` (args[5])
 * chunks run at once: so every thread that joins the job is in a chunk at the same time as the others. */
void tid(const uint64_t *args, int64_t chunk) {
  uint64_t *running = (uint64_t *)args[1], *most = (uint64_t *)args[2];
  uint64_t now = __atomic_add_fetch(running, 1, __ATOMIC_SEQ_CST), m = __atomic_load_n(most, __ATOMIC_SEQ_CST);
  while (now > m && !__atomic_compare_exchange_n(most, &m, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  volatile uint64_t s = 0;
  for (uint64_t i = 0; i < args[3]; i++) s += i;
  for (uint64_t i = 0; i < args[4] && __atomic_load_n(most, __ATOMIC_SEQ_CST) <= args[5]; i++) s += i;
  ((uint64_t *)args[0])[chunk] = (uint64_t)gettid_raw();
  __atomic_sub_fetch(running, 1, __ATOMIC_SEQ_CST);
}
"""


def test_waiting_host_thread_runs_chunks():
  """A host thread that waits for the processor runs chunks of the multi-threaded kernel in flight (as a BLAS's caller
  computes its share) in place of a helper that is still asleep, and every chunk runs once. Jobs spaced 2 ms apart:
  the helpers sleep at each start."""
  import threading
  _Worker.get().start_helpers(max(1, (os.cpu_count() or 1) - 1))
  img = load_elf(cc.compile_c(TID_SRC))
  try:
    nchunks, njobs = 8, 100
    outs, args, signal = np.zeros((njobs, nchunks), np.uint64), np.zeros(6, np.uint64), np.zeros(1, np.uint64)
    counters = np.zeros(2, np.uint64)
    args[:] = (0, addr(counters), addr(counters) + 8, 20_000, 0, 0)
    with CommandProcessor() as proc:
      for j in range(njobs):
        args[0] = addr(outs) + 8 * nchunks * j
        proc.write(packet(Op.EXEC_MT, img.symbol("tid"), addr(args), nchunks) + packet(Op.SIGNAL, addr(signal), j + 1))
        assert proc.wait_value(addr(signal), j + 1, timeout=60)
        time.sleep(0.002)
    assert (outs != 0).all()
    assert threading.get_native_id() in set(outs.ravel().tolist()), "the waiting host thread ran no chunk"
  finally:
    img.close()


def test_no_more_runners_than_threads():
  """The worker, its helpers and a waiting host thread: at most THREADS of them (the worker and its helpers) run chunks
  at once; more would share a CPU, and a chunk whose thread lost it holds up the kernel. Each chunk lingers (up to
  ~10 ms) until one more than that runs at once, so every thread that joins overlaps the others."""
  _Worker.get().start_helpers(max(1, (os.cpu_count() or 1) - 1))
  cap = len(_Worker.get().helpers) + 1
  img = load_elf(cc.compile_c(TID_SRC))
  try:
    nchunks = 3 * cap
    outs, args, signal, counters = (np.zeros(n, np.uint64) for n in (nchunks, 6, 1, 2))
    args[:] = (addr(outs), addr(counters), addr(counters) + 8, 0, 10_000_000, cap)
    with CommandProcessor() as proc:
      proc.write(packet(Op.EXEC_MT, img.symbol("tid"), addr(args), nchunks) + packet(Op.SIGNAL, addr(signal), 1))
      assert proc.wait_value(addr(signal), 1, timeout=60)
    assert (outs != 0).all()
    assert 1 <= counters[1] <= cap, f"{counters[1]} chunks ran at once, THREADS is {cap}"
  finally:
    img.close()


def test_a_sleeping_helper_is_woken_for_the_next_job():
  """Helpers asleep after an idle spell are woken by the next job (exec_mt wakes them only when one counts itself
  asleep: the wake is a syscall per kernel otherwise): after 0.3 s of idle, a job of 64 chunks of ~0.2 ms is shared by
  the worker and a helper. The host polls from Python here (a waiting host thread would take a helper's place)."""
  _Worker.get().start_helpers(max(1, (os.cpu_count() or 1) - 1))
  img = load_elf(cc.compile_c(TID_SRC))
  try:
    nchunks = 64
    outs, args, signal, counters = (np.zeros(n, np.uint64) for n in (nchunks, 6, 1, 2))
    args[:] = (addr(outs), addr(counters), addr(counters) + 8, 200_000, 0, 0)
    with CommandProcessor() as proc:
      for round_ in range(1, 4):
        outs[:] = 0
        time.sleep(0.3)                      # the helpers' spin after a job is long over: they sleep
        proc.write(packet(Op.EXEC_MT, img.symbol("tid"), addr(args), nchunks) + packet(Op.SIGNAL, addr(signal), round_))
        deadline = time.monotonic() + 60
        while signal[0] < round_ and time.monotonic() < deadline: time.sleep(0.001)
        assert signal[0] == round_ and (outs != 0).all()
        assert len(set(outs.tolist())) >= 2, f"round {round_}: one thread ran every chunk (the helper slept through)"
  finally:
    img.close()
