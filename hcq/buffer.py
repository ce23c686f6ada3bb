"""Device memory: a Buffer (lazily allocated, typed elements) and an LRU allocator that recycles freed memory."""
from __future__ import annotations
import weakref
from collections import defaultdict


class LRUAllocator:
  """Keeps freed allocations by size and hands them out again before asking the driver.

  Memory freed here may still be in use by work already queued (a buffer dropped right after the kernel that
  writes it was queued). Handing it to a new buffer is safe: the new buffer's work is queued after the old work on
  the same in-order queue, and host access synchronizes first. Giving it back to the driver is not: `release`
  (the device's: Device.retire) frees it only once the work queued so far has finished, and `synchronize` runs
  before the cache is emptied to make room."""

  def __init__(self, driver, max_cached_bytes: int = 1 << 30, release=None, synchronize=None):
    self.driver, self.max_cached = driver, max_cached_bytes
    self.release = release or driver.free
    self.synchronize = synchronize or (lambda: None)
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
    if self.cached_bytes + nbytes > self.max_cached: self.release(mem); return
    self.cache[nbytes].append(mem)
    self.cached_bytes += nbytes

  def free_cache(self, wait: bool = True):
    """Give every cached allocation back to the driver, after the queued work that may still use them (wait=False:
    the caller knows nothing is queued any more)."""
    if wait: self.synchronize()
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
    self._dev = None          # the Device that allocated the memory
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
      self._dev = dev
      self._finalizer = weakref.finalize(self, _release, dev, self._mem, self.nbytes)
      self._finalizer.atexit = False    # at exit a queue may still use it (the OS takes it back)
    return self

  @property
  def addr(self) -> int:
    if self.base is not None: return self.base.addr + self.offset
    self.ensure_allocated()
    if self._dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    return self._mem.addr

  def _forked_message(self) -> str:
    return (f"{self!r} was allocated on {self.device} by the parent process (pid {self._dev.forked_from}) before "
            f"fork(); a forked child cannot use the parent's {self.device} device or its memory. Create the tensor "
            f"in the child (or copy it to the CPU with .numpy() before forking)")

  def copyin(self, data: memoryview | bytes) -> "Buffer":
    from .device import Device
    if self._dev is not None and self._dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    mv = memoryview(data).cast("B")
    if mv.nbytes != self.nbytes:
      raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes ({self.size} x {self.dtype.name})")
    Device.get(self.device).copyin(self.ensure_allocated(), mv)
    return self

  def copyout(self, out: memoryview) -> memoryview:
    from .device import Device
    if self._dev is not None and self._dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    Device.get(self.device).copyout(out, self.ensure_allocated())
    return out

  def __repr__(self):
    return f"<Buffer {self.device} {self.size} x {self.dtype.name}{'' if self.is_allocated else ' (not allocated)'}>"


class ForkedDeviceError(RuntimeError):
  """A buffer of a device the parent process opened, used in a forked child."""


def _release(dev, mem, nbytes):
  if dev.forked_from is not None: return     # the parent's device: nothing of it is ours to free
  try: dev.allocator.free(mem, nbytes)
  except Exception: pass   # interpreter shutdown
