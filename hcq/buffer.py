"""Device memory: a Buffer (lazily allocated, typed elements) and an LRU allocator that recycles freed memory."""
from __future__ import annotations
import weakref
from collections import defaultdict


class LRUAllocator:
  """Keeps freed allocations by size and hands them out again before asking the driver."""

  def __init__(self, driver, max_cached_bytes: int = 1 << 30):
    self.driver, self.max_cached = driver, max_cached_bytes
    self.cache: dict[int, list] = defaultdict(list)
    self.cached_bytes = 0
    self.live_bytes = 0

  def alloc(self, nbytes: int):
    nbytes = max(nbytes, 1)
    if self.cache[nbytes]:
      self.cached_bytes -= nbytes
      mem = self.cache[nbytes].pop()
    else:
      try:
        mem = self.driver.alloc(nbytes)
      except MemoryError:
        self.free_cache()
        mem = self.driver.alloc(nbytes)
    self.live_bytes += nbytes
    return mem

  def free(self, mem, nbytes: int):
    nbytes = max(nbytes, 1)
    self.live_bytes -= nbytes
    if self.cached_bytes + nbytes > self.max_cached: self.driver.free(mem); return
    self.cache[nbytes].append(mem)
    self.cached_bytes += nbytes

  def free_cache(self):
    for mems in self.cache.values():
      for m in mems: self.driver.free(m)
    self.cache.clear()
    self.cached_bytes = 0


class Buffer:
  """`size` elements of `dtype` on `device`; memory is taken on first use and given back when unreferenced."""
  serial = 0      # creation counter: the JIT tells buffers made during a capture from older ones

  def __init__(self, device: str, size: int, dtype, preallocate: bool = False, base: "Buffer | None" = None,
               offset: int = 0):
    self.device, self.size, self.dtype = device, size, dtype
    self.nbytes = size * dtype.itemsize
    Buffer.serial += 1
    self.serial = Buffer.serial
    self._mem = None
    self._finalizer = None
    self.base, self.offset = base, offset     # a view: `nbytes` at `offset` inside `base` (e.g. a JIT arena)
    if base is not None and offset + self.nbytes > base.nbytes:
      raise ValueError(f"buffer view [{offset}, {offset + self.nbytes}) exceeds its base of {base.nbytes} bytes")
    if preallocate: self.ensure_allocated()

  @property
  def is_allocated(self) -> bool: return self._mem is not None if self.base is None else self.base.is_allocated

  def ensure_allocated(self) -> "Buffer":
    if self.base is not None:
      self.base.ensure_allocated()
      return self
    if self._mem is None:
      from .device import Device
      dev = Device.get(self.device)
      self._mem = dev.allocator.alloc(self.nbytes)
      self._finalizer = weakref.finalize(self, _release, dev, self._mem, self.nbytes)
    return self

  @property
  def addr(self) -> int:
    if self.base is not None: return self.base.addr + self.offset
    self.ensure_allocated()
    return self._mem.addr

  def copyin(self, data: memoryview | bytes) -> "Buffer":
    from .device import Device
    mv = memoryview(data).cast("B")
    if mv.nbytes != self.nbytes:
      raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes ({self.size} x {self.dtype.name})")
    Device.get(self.device).copyin(self.ensure_allocated(), mv)
    return self

  def copyout(self, out: memoryview) -> memoryview:
    from .device import Device
    Device.get(self.device).copyout(out, self.ensure_allocated())
    return out

  def __repr__(self):
    return f"<Buffer {self.device} {self.size} x {self.dtype.name}{'' if self.is_allocated else ' (not allocated)'}>"


def _release(dev, mem, nbytes):
  try: dev.allocator.free(mem, nbytes)
  except Exception: pass   # interpreter shutdown
