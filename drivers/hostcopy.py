"""Host <-> device copies for drivers whose memory is ordinary host memory (the CPU's, Metal's shared storage): a plain
copy through the driver's `view`. A driver with device memory the host should not read through the BAR (AMD VRAM, NV
video memory) copies with its copy engine instead (hcq/driver.py)."""
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
