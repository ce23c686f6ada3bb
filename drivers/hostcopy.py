"""Host <-> device copies. HostMemoryCopies: for drivers whose memory is ordinary host memory (the CPU's, Metal's shared
storage), a plain copy through the driver's `view`. StagedCopies: for drivers with device memory the host should not
read through the BAR (AMD VRAM, NV video memory), the copy engine and host staging (hcq/driver.py)."""
from __future__ import annotations
import os, threading
from concurrent.futures import ThreadPoolExecutor, wait
import numpy as np

# One thread copies ~5.5 GB/s between ordinary and pinned host memory on an H200 machine's Xeon (a 64 MiB numpy copy),
# 8 threads 23 GB/s, while the copy engine moves 33-39 GB/s between pinned memory and video memory: the host's copy is
# what limits a staged transfer, so a chunk is split between up to COPY_THREADS threads, each part at least PART_MIN.
COPY_THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
PART_MIN = 1 << 20


class _CopyThreads:
  """The threads that split a host copy (numpy's copy releases the GIL), made on first use and again in a forked child
  (the parent's threads do not exist there)."""

  def __init__(self):
    self._pool, self._pid, self._lock = None, None, threading.Lock()

  def copy(self, dst: np.ndarray, src: np.ndarray):
    parts = min(COPY_THREADS, dst.nbytes // PART_MIN)
    if parts <= 1:
      np.copyto(dst, src)
      return
    with self._lock:
      if self._pool is None or self._pid != os.getpid():
        self._pool, self._pid = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="baregrad-copy"), os.getpid()
      pool = self._pool
    step = -(-dst.nbytes // parts) + 63 & ~63          # 64-byte aligned parts
    done = [pool.submit(np.copyto, dst[o:o + step], src[o:o + step]) for o in range(0, dst.nbytes, step)]
    wait(done)            # every part finished (a failed one's error is raised below only once none still writes)
    for f in done: f.result()


copy_threads = _CopyThreads()


def _bytes(buf) -> np.ndarray:
  """The bytes of a buffer-protocol object as a flat uint8 array (no copy; writable when the object is)."""
  return np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)


class HostMemoryCopies:
  def copyin(self, dst_addr: int, data) -> None:
    """Host bytes into this driver's memory at `dst_addr`: a plain copy."""
    mv = memoryview(data).cast("B")
    self.view(dst_addr, mv.nbytes)[:] = mv

  def copyout(self, out, src_addr: int) -> None:
    """len(out) bytes of this driver's memory at `src_addr` into `out`: a plain copy."""
    mv = memoryview(out).cast("B")
    mv[:] = self.view(src_addr, mv.nbytes)


class StagedCopies:
  """Host <-> device copies for drivers with device memory (AMD VRAM, NV video memory): through the driver's "copy"
  queue and two host-memory staging buffers used in turn, so the host's copy of one chunk overlaps the engine's copy
  of the other. Memory that is not device memory, and copies in smaller than STAGE_MIN (out: COPYOUT_MIN), go through
  the host mapping. A driver provides `_staging_memory()` (two staging buffers of STAGING bytes and a page for the
  signal, in memory the host reads fast), `_in_device(addr, nbytes)` and `_staged_copy_failed(what)` (the exception
  for a copy that did not finish in time), besides its `submit`, `encode`, `wait_value`, `check_faults` and `view`."""
  STAGING = 16 << 20         # bytes per staging buffer (two: the host fills or reads one while the engine moves the
                             # other; a chunk is split between the copy threads, above)
  STAGE_MIN = 64 << 10       # smaller writes to device memory go through the host mapping (a submission and a wait cost
                             # more; the mapping is write-combined)
  COPYOUT_MIN = STAGE_MIN    # smaller reads of device memory go through the host mapping (0: never)
  _stage = None

  def _staging(self):
    if self._stage is None:
      self._stage, self._stage_value = self._staging_memory(), 0
    return self._stage

  def _stage_chunk(self, dst: int, src: int, nbytes: int) -> int:
    """Queue one copy on the copy queue and the staging signal after it; the signal value to wait for."""
    _, sig = self._staging()
    self._stage_value += 1
    self.submit("copy", self.encode("copy", [("copy", dst, src, nbytes), ("signal", sig, self._stage_value)]))
    return self._stage_value

  def _stage_wait(self, value: int, what: str):
    _, sig = self._staging()
    if not self.wait_value(sig.addr, value, self.timeout):
      self.check_faults(self.name)
      raise self._staged_copy_failed(what)

  def copyin(self, dst_addr: int, data) -> None:
    mv = memoryview(data).cast("B")
    if mv.nbytes < self.STAGE_MIN or not self._in_device(dst_addr, mv.nbytes):
      self.view(dst_addr, mv.nbytes)[:] = mv
      return
    stages, _ = self._staging()
    src = _bytes(mv)
    pending = [0, 0]                   # the signal value each staging buffer's last copy completes with
    for k, off in enumerate(range(0, mv.nbytes, self.STAGING)):
      n, stage = min(self.STAGING, mv.nbytes - off), stages[k % 2]
      if pending[k % 2]: self._stage_wait(pending[k % 2], f"copy of {n} bytes to {dst_addr + off:#x}")
      copy_threads.copy(_bytes(self.view(stage.addr, n)), src[off:off + n])
      pending[k % 2] = self._stage_chunk(dst_addr + off, stage.addr, n)
    self._stage_wait(max(pending), f"copy of {mv.nbytes} bytes to {dst_addr:#x}")

  def copyout(self, out, src_addr: int) -> None:
    mv = memoryview(out).cast("B")
    if not mv.nbytes: return
    if mv.nbytes < self.COPYOUT_MIN or not self._in_device(src_addr, mv.nbytes):
      mv[:] = self.view(src_addr, mv.nbytes)
      return
    stages, _ = self._staging()
    dst = _bytes(mv)
    chunks = [(off, min(self.STAGING, mv.nbytes - off)) for off in range(0, mv.nbytes, self.STAGING)]
    queued = {0: self._stage_chunk(stages[0].addr, src_addr, chunks[0][1])}
    for k, (off, n) in enumerate(chunks):
      if k + 1 < len(chunks):            # the next chunk into the other buffer, while this one is read
        noff, nn = chunks[k + 1]
        queued[k + 1] = self._stage_chunk(stages[(k + 1) % 2].addr, src_addr + noff, nn)
      self._stage_wait(queued.pop(k), f"copy of {n} bytes from {src_addr + off:#x}")
      copy_threads.copy(dst[off:off + n], _bytes(self.view(stages[k % 2].addr, n)))
