"""A user-mode hardware queue: ring buffer, read/write pointers, 64-bit doorbell.

The ring is a power-of-two number of bytes of GPU memory. The write pointer is 64-bit and only grows (the position
in the ring is `pointer mod size`); the PM4 compute queue counts it in dwords, the SDMA queue in bytes (KFD's
convention for gfx9+ user queues with 64-bit doorbells). The engine writes the read pointer back to memory: the SDMA
engine as a 64-bit byte count that only grows, the PM4 engine as a 32-bit dword offset that wraps at the ring size
(kfdtest PM4Queue.cpp RptrWhenConsumed: "On PM4 queues Rptr is always 32-bit in dword units and wraps at queue
size"; amdkfd kfd_kernel_queue.c kq_acquire_packet_buffer), which this side extends to a monotonic count by the
distance it moved. The ring holds at most size - 1 dwords of commands: rptr == wptr means empty (kfd_kernel_queue.c,
kfdtest BaseQueue::PlacePacket). The driver writes the write pointer to memory and then to the doorbell. A packet
never straddles the end of the ring: the space before the wrap is filled with NOP dwords first.
"""
from __future__ import annotations
import collections, threading, time
import numpy as np


class RingFull(TimeoutError):
  pass


class Ring:
  def __init__(self, name: str, base: int, ring_view, size: int, rw_view, doorbell_view, unit: int, nop, timeout: float = 30.0,
               rptr_wraps: bool = False):
    """ring_view/rw_view/doorbell_view: writable buffers over the ring, the read/write pointer page (rptr at byte 0,
    wptr at byte 8) and this queue's 8-byte doorbell. unit: bytes per pointer step (4 = dwords, 1 = bytes).
    nop(n): n dwords of NOP for this engine. rptr_wraps: the engine writes back a 32-bit offset into the ring (PM4)."""
    self.name, self.base, self.size, self.unit, self.nop, self.timeout = name, base, size, unit, nop, timeout
    self.ring = np.frombuffer(ring_view, dtype=np.uint32)
    self.ptrs = np.frombuffer(rw_view, dtype=np.uint64, count=2)
    self.doorbell = np.frombuffer(doorbell_view, dtype=np.uint64, count=1)
    self.dwords = size // 4
    self.wptr = 0                 # in dwords
    self.last_packet_at = 0       # dword index (monotonic) of the last packet written
    self.labels: dict[int, str] = {}   # dword index (monotonic) of a packet -> what it runs (fault reports name it)
    self.starts: collections.deque = collections.deque(maxlen=4096)   # where the last packets start (monotonic)
    self.rptr_wraps = rptr_wraps
    self._rptr, self._reported = 0, 0  # (rptr_wraps) the monotonic read pointer, the offset last read back
    self._rptr_lock = threading.Lock()  # (a waiter's fault report reads it beside the submitting thread)

  @property
  def rptr(self) -> int:
    """The engine's read pointer in dwords, counted from the start (monotonic)."""
    if not self.rptr_wraps: return int(self.ptrs[0]) * self.unit // 4
    with self._rptr_lock:
      reported = int(self.ptrs[0]) & 0xFFFFFFFF
      if reported >= self.dwords:
        raise RuntimeError(f"{self.name}: the engine reported read pointer {reported:#x}, past the ring's "
                           f"{self.dwords:#x} dwords: the read-pointer page is not what the engine writes")
      # the engine never passes the write pointer and the ring never holds a whole lap: the distance is unambiguous
      self._rptr += (reported - self._reported) % self.dwords
      self._reported = reported
      return self._rptr

  def _reserve(self, n: int):
    if self.wptr + n - self.rptr < self.dwords: return      # (at most size - 1 dwords in flight)
    self.commit()                 # the engine frees space only by running what is already written
    start, delay = time.monotonic(), 1e-5
    while self.wptr + n - self.rptr >= self.dwords:
      if time.monotonic() - start > self.timeout:
        raise RingFull(f"{self.name}: ring full for {self.timeout:.3g} s: {n} more dwords do not fit in the ring of "
                       f"{self.dwords} dwords (read pointer {self.rptr}, write pointer {self.wptr} dwords): the engine "
                       f"is not consuming commands")
      time.sleep(delay); delay = min(delay * 2, 1e-3)

  def write(self, packets: list[list[int]], labels: dict | None = None, end_align: dict | None = None) -> None:
    """Append packets (lists of dwords) and ring the doorbell once (and before waiting for space).
    labels: packet index -> what the packet runs, kept by ring position for fault reports.
    end_align: packet index -> n: NOPs go before that packet so that it ends on an n-dword boundary of the ring
    (an SDMA INDIRECT must end on an 8-dword boundary, sdma_v6_0_ring_emit_ib)."""
    for p in packets:
      if len(p) >= self.dwords:
        raise ValueError(f"{self.name}: a packet of {len(p)} dwords does not fit in a ring of {self.dwords} (at most {self.dwords - 1})")
    for k, p in enumerate(packets):
      align = (end_align or {}).get(k, 1)
      while True:
        pos = self.wptr % self.dwords
        pad = -(self.wptr + len(p)) % align
        if pos + pad + len(p) <= self.dwords: break
        self._nops(self.dwords - pos)          # no packet straddles the wrap (the ring size is a multiple of align)
      self._nops(pad)
      pos = self.wptr % self.dwords
      self._reserve(len(p))
      self.ring[pos:pos + len(p)] = p
      self.last_packet_at = self.wptr
      self.starts.append(self.wptr)
      if labels and k in labels: self._label(labels[k])
      self.wptr += len(p)
    self.commit()

  def _nops(self, n: int):
    if n <= 0: return
    self._reserve(n)
    pos = self.wptr % self.dwords
    self.ring[pos:pos + n] = self.nop(n)
    self.wptr += n

  def _label(self, text: str):
    if len(self.labels) >= 1024:     # keep the packets the engine has not passed yet
      self.labels = {at: t for at, t in self.labels.items() if at >= self.rptr}
    self.labels[self.wptr] = text

  def commit(self) -> None:
    value = self.wptr * 4 // self.unit
    self.ptrs[1] = value          # the write pointer the engine polls ...
    self.doorbell[0] = value      # ... and the doorbell that wakes it

  def idle(self) -> bool: return self.rptr >= self.wptr

  def packet_at_rptr(self) -> tuple[int, np.ndarray]:
    """(ring dword index, the ring's dwords) of where the engine's read pointer stands."""
    return self.rptr % self.dwords, self.ring
