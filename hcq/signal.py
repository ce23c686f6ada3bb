"""Signals: a 64-bit value + 64-bit timestamp in memory that both the host and the device see."""
from __future__ import annotations
import struct, time


_U64 = struct.Struct("<Q")


class SignalTimeout(TimeoutError):
  pass


class Signal:
  """Devices write `value` (and `timestamp`, in ns) when a queue reaches a signal command. `shared_with`: other
  devices whose queues signal or wait on it too (its memory is then `device`'s, mapped by them: Device.alloc_shared)."""

  def __init__(self, device, name: str = "signal", value: int = 0, shared_with=()):
    self.device, self.name = device, name
    self.pool = device.shared_signal_pool(shared_with) if shared_with else device.signal_pool
    self.addr = self.pool.take()
    self._view = device.driver.view(self.addr, 16)
    self.value = value

  @property
  def value(self) -> int: return _U64.unpack_from(self._view, 0)[0]
  @value.setter
  def value(self, v: int): _U64.pack_into(self._view, 0, v & (2**64 - 1))

  @property
  def timestamp(self) -> int: return _U64.unpack_from(self._view, 8)[0]
  @property
  def timestamp_addr(self) -> int: return self.addr + 8

  def wait(self, value: int, timeout: float | None = None, queue: str = "compute"):
    """Block until the signal reaches `value`; a clear error instead of a silent hang."""
    timeout = self.device.default_timeout if timeout is None else timeout
    if self.value >= value: return
    start = time.monotonic()
    if not self.device.driver.wait_value(self.addr, value, timeout):
      queues = self.device.queues_report()        # before check_faults: a driver that resets its queues empties them
      try:
        self.device.check_faults()
        raise SignalTimeout(
          f"{self.device.name}: waited {time.monotonic() - start:.3f} s on {queue} queue for signal '{self.name}' "
          f"to reach {value}, it is {self.value}; last command submitted: {self.device.last_command or 'none'}")
      except Exception as e:
        self.device.hang_report(e, queues)
        raise

  def __del__(self):
    # a command already queued may still write it: the slot is reused only once the work queued so far is done
    try: self.device.retire(self.addr, self.pool.give_back)
    except Exception: pass

  def __repr__(self): return f"<Signal {self.name} value={self.value}>"


class SignalPool:
  """16-byte signal slots carved out of pages of memory the host polls (from `alloc`, default the driver's
  `alloc_polled`: where host reads are fast)."""

  def __init__(self, driver, page: int = 4096, alloc=None):
    self.driver, self.alloc = driver, alloc or driver.alloc_polled
    self.mem = self.alloc(page)
    self.free = [self.mem.addr + i for i in range(0, page, 16)][::-1]

  def take(self) -> int:
    if not self.free:
      more = self.alloc(4096)
      self.free.extend(more.addr + i for i in range(0, 4096, 16))
    addr = self.free.pop()
    self.driver.view(addr, 16)[:] = bytes(16)
    return addr

  def give_back(self, addr: int): self.free.append(addr)
