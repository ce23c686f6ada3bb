"""Signals: a 64-bit value + 64-bit timestamp in memory that both the host and the device see."""
from __future__ import annotations
import struct, time


class SignalTimeout(TimeoutError):
  pass


class Signal:
  """Devices write `value` (and `timestamp`, in ns) when a queue reaches a signal command."""

  def __init__(self, device, name: str = "signal", value: int = 0):
    self.device, self.name = device, name
    self.addr = device.signal_pool.take()
    self._view = device.driver.view(self.addr, 16)
    self.value = value

  @property
  def value(self) -> int: return struct.unpack_from("<Q", self._view, 0)[0]
  @value.setter
  def value(self, v: int): struct.pack_into("<Q", self._view, 0, v & (2**64 - 1))

  @property
  def timestamp(self) -> int: return struct.unpack_from("<Q", self._view, 8)[0]
  @property
  def timestamp_addr(self) -> int: return self.addr + 8

  def wait(self, value: int, timeout: float | None = None, queue: str = "compute"):
    """Block until the signal reaches `value`; a clear error instead of a silent hang."""
    timeout = self.device.default_timeout if timeout is None else timeout
    if self.value >= value: return
    start = time.monotonic()
    if not self.device.driver.wait_value(self.addr, value, timeout):
      self.device.check_faults()
      raise SignalTimeout(
        f"{self.device.name}: waited {time.monotonic() - start:.3f} s on {queue} queue for signal '{self.name}' "
        f"to reach {value}, it is {self.value}; last command submitted: {self.device.last_command or 'none'}")

  def __del__(self):
    try: self.device.signal_pool.give_back(self.addr)
    except Exception: pass

  def __repr__(self): return f"<Signal {self.name} value={self.value}>"


class SignalPool:
  """16-byte signal slots carved out of one page of host-visible device memory."""

  def __init__(self, driver, page: int = 4096):
    self.driver, self.mem = driver, driver.alloc(page)
    self.free = [self.mem.addr + i for i in range(0, page, 16)][::-1]

  def take(self) -> int:
    if not self.free:
      more = self.driver.alloc(4096)
      self.free.extend(more.addr + i for i in range(0, 4096, 16))
    addr = self.free.pop()
    self.driver.view(addr, 16)[:] = bytes(16)
    return addr

  def give_back(self, addr: int): self.free.append(addr)
