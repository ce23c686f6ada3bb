"""An LRU allocator in front of a driver: freed device memory is recycled by size before the driver is asked."""
from __future__ import annotations
from collections import defaultdict


class LRUAllocator:
  """Keeps freed allocations by size and hands them out again before asking the driver.

  Memory freed here may still be in use by work already queued (a buffer dropped right after the kernel that
  writes it was queued). Handing it to a new buffer is safe: the new buffer's work is queued after the old work on
  the same in-order queue, and host access synchronizes first. Giving it back to the driver is not: `release`
  (the device's: Device.retire) frees it only once the work queued so far has finished, and `synchronize` runs
  before the cache is emptied to make room."""

  def __init__(self, driver, max_cached_bytes: int = 1 << 30, release=None, synchronize=None, free=None):
    self.driver, self.max_cached = driver, max_cached_bytes
    self.release = release or driver.free
    self.free_now = free or driver.free       # gives memory straight back (free_cache, once nothing uses it)
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
      for m in mems: self.free_now(m)
    self.cache.clear()
    self.cached_bytes = 0
