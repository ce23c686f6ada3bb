"""Device memory: a Buffer (lazily allocated, typed elements) on a device; its memory comes from the device's
allocator (hcq/allocator.py) and goes back to it when the Buffer is unreferenced."""
from __future__ import annotations
import sys
from .device import Device


class Buffer:
  """`size` elements of `dtype` on `device`; memory is taken on first use and given back when unreferenced."""
  serial = 0      # creation counter: the JIT tells buffers made during a capture from older ones
  _mem = None     # (before __init__ sets it: __del__ of a Buffer whose __init__ raised)

  def __init__(self, device: str, size: int, dtype, preallocate: bool = False, base: "Buffer | None" = None,
               offset: int = 0):
    self.device, self.size, self.dtype = device, size, dtype
    self.nbytes = size * dtype.itemsize
    Buffer.serial += 1
    self.serial = Buffer.serial
    self._mem = None
    self._dev = None          # the Device that allocated the memory
    # weak references to the realized graph nodes whose value lives here or was computed from this buffer: what a
    # write makes stale (kept by compiler/schedule.py; None: none yet)
    self.dependents: list | None = None
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
      dev = Device.get(self.device)
      self._mem = dev.allocator.alloc(self.nbytes)
      self._dev = dev
    return self

  def __del__(self, finalizing=sys.is_finalizing):
    # the memory goes back to the allocator when the last reference goes; not at interpreter exit, where a queue
    # may still use it (the OS takes it back)
    if self._mem is not None and not finalizing(): _release(self._dev, self._mem, self.nbytes)

  @property
  def addr(self) -> int:
    if self.base is not None: return self.base.addr + self.offset
    if self._mem is None: self.ensure_allocated()
    dev = self._dev
    if dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    if dev.closed and not dev.host_memory: raise DeviceClosedError(self._closed_message())
    return self._mem.addr

  def allocation(self):
    """(Device, driver memory, bytes used) of the allocation that holds this buffer (a view's: its base's)."""
    if self.base is not None: return self.base.allocation()
    self.ensure_allocated()
    return self._dev, self._mem, self.nbytes

  def _forked_message(self) -> str:
    return (f"{self!r} was allocated on {self.device} by the parent process (pid {self._dev.forked_from}) before "
            f"fork(); a forked child cannot use the parent's {self.device} device or its memory. Create the tensor "
            f"in the child (or copy it to the CPU with .numpy() before forking)")

  def _closed_message(self) -> str:
    return (f"{self!r} was allocated on {self.device} before that device was closed (Device.close): its memory "
            f"belonged to the closed device, not to the {self.device} opened since. Copy the data out (.numpy()) "
            f"before closing the device, or make the tensor again")

  def copyin(self, data: memoryview | bytes) -> "Buffer":
    if self._dev is not None and self._dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    mv = memoryview(data).cast("B")
    if mv.nbytes != self.nbytes:
      raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes ({self.size} x {self.dtype.name})")
    Device.get(self.device).copyin(self.ensure_allocated(), mv)
    return self

  def copyout(self, out: memoryview) -> memoryview:
    if self._dev is not None and self._dev.forked_from is not None: raise ForkedDeviceError(self._forked_message())
    Device.get(self.device).copyout(out, self.ensure_allocated())
    return out

  def __repr__(self):
    return f"<Buffer {self.device} {self.size} x {self.dtype.name}{'' if self.is_allocated else ' (not allocated)'}>"


class ForkedDeviceError(RuntimeError):
  """A buffer of a device the parent process opened, used in a forked child."""


class DeviceClosedError(RuntimeError):
  """A buffer of a GPU that was closed (Device.close), used after: its memory is gone with that device."""


def _release(dev, mem, nbytes):
  if dev.forked_from is not None: return     # the parent's device: nothing of it is ours to free
  try: dev.allocator.free(mem, nbytes)
  except Exception: pass   # interpreter shutdown
