"""Host <-> device copies. HostMemoryCopies: for drivers whose memory is ordinary host memory (the CPU's, Metal's shared
storage), a plain copy through the driver's `view`. StagedCopies: for drivers with device memory the host should not
read through the BAR (AMD VRAM, NV video memory), the copy engine and host staging (hcq/driver.py)."""
from __future__ import annotations


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
  STAGING = 4 << 20          # bytes per staging buffer (two: the host fills or reads one while the engine moves the other)
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
    pending = [0, 0]                   # the signal value each staging buffer's last copy completes with
    for k, off in enumerate(range(0, mv.nbytes, self.STAGING)):
      n, stage = min(self.STAGING, mv.nbytes - off), stages[k % 2]
      if pending[k % 2]: self._stage_wait(pending[k % 2], f"copy of {n} bytes to {dst_addr + off:#x}")
      self.view(stage.addr, n)[:] = mv[off:off + n]
      pending[k % 2] = self._stage_chunk(dst_addr + off, stage.addr, n)
    self._stage_wait(max(pending), f"copy of {mv.nbytes} bytes to {dst_addr:#x}")

  def copyout(self, out, src_addr: int) -> None:
    mv = memoryview(out).cast("B")
    if not mv.nbytes: return
    if mv.nbytes < self.COPYOUT_MIN or not self._in_device(src_addr, mv.nbytes):
      mv[:] = self.view(src_addr, mv.nbytes)
      return
    stages, _ = self._staging()
    chunks = [(off, min(self.STAGING, mv.nbytes - off)) for off in range(0, mv.nbytes, self.STAGING)]
    queued = {0: self._stage_chunk(stages[0].addr, src_addr, chunks[0][1])}
    for k, (off, n) in enumerate(chunks):
      if k + 1 < len(chunks):            # the next chunk into the other buffer, while this one is read
        noff, nn = chunks[k + 1]
        queued[k + 1] = self._stage_chunk(stages[(k + 1) % 2].addr, src_addr + noff, nn)
      self._stage_wait(queued.pop(k), f"copy of {n} bytes from {src_addr + off:#x}")
      mv[off:off + n] = self.view(stages[k % 2].addr, n)
