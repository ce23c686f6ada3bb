"""GPU-visible memory for the emulators: mappings of bytes at GPU virtual addresses.

`Memory` keeps each mapping as a numpy uint8 array placed at a chosen (fake) GPU address;
`HostMemory` maps real host memory, by address, through cffi (the emulated KFD maps the
buffers it allocated in the host process at their own addresses). Both share the vectorized
`gather`/`scatter` that the ISA emulators use: one call moves the bytes of every active lane.
"""
from __future__ import annotations

import bisect, threading

import numpy as np


class MemoryFault(Exception):
  """An access touched an address no mapping covers."""

  def __init__(self, address: int, nbytes: int = 1, write: bool = False, detail: str = ""):
    self.address, self.nbytes, self.write = address, nbytes, write
    kind = "write" if write else "read"
    super().__init__(f"memory fault: {kind} of {nbytes} byte(s) at {address:#x} is outside every mapping"
                     + (f" ({detail})" if detail else ""))


class Memory:
  """Mappings of numpy uint8 arrays at GPU virtual addresses (non-overlapping).

  Each mapping says where its bytes live on the modelled GPU: device memory (VRAM/HBM) or system memory the GPU
  reaches over PCIe (GTT, pinned host pages). The vectorized accesses a kernel makes (`gather`/`scatter`) add their
  bytes to `traffic[SYSTEM]` or `traffic[DEVICE]`, so the emulated GPUs can say how much of a kernel's global
  traffic crossed the bus (drivers/emu/counters.py `global_system_bytes`)."""

  DEVICE, SYSTEM = 0, 1

  def __init__(self):
    # (bases sorted, uint8 arrays in the same order, whether each is system memory): replaced whole, never changed in
    # place, so a GPU thread that reads it once per access sees one consistent table while the host maps and unmaps
    # (an index into lists another thread inserts into would name another mapping's bytes)
    self._table: tuple[list, list, list] = ([], [], [])
    self._lock = threading.Lock()        # serializes the host's map/unmap
    self.traffic = [0, 0]                # bytes gathered + scattered in device / system memory
    self.sectors: list | None = None     # while a list: the 32-byte sector numbers gather reads (counters.UNIQUE)
    self._next = 0x1000_0000_0000        # where alloc() places the next mapping

  # ---- mappings ----
  @property
  def mappings(self) -> int:
    """How many mappings there are."""
    return len(self._table[0])

  def map(self, addr: int, nbytes: int) -> np.ndarray:
    """Map `nbytes` zeroed bytes at `addr`; returns the backing uint8 array."""
    return self.map_array(addr, np.zeros(nbytes, np.uint8))

  def map_array(self, addr: int, array: np.ndarray, system: bool = False) -> np.ndarray:
    """Map an existing C-contiguous numpy array (any dtype) at `addr` without copying; the
    kernel's writes land in it. system: the bytes are system memory on the modelled GPU."""
    if not array.flags.c_contiguous: raise ValueError("map_array needs a C-contiguous array")
    data = array.reshape(-1).view(np.uint8)
    if addr < 0 or addr + data.size > 1 << 64: raise ValueError(f"mapping [{addr:#x}, +{data.size:#x}) outside the 64-bit space")
    with self._lock:
      bases, arrays, system_ = self._table
      i = bisect.bisect_right(bases, addr)
      if i > 0 and bases[i - 1] + arrays[i - 1].size > addr or i < len(bases) and addr + data.size > bases[i]:
        raise ValueError(f"mapping [{addr:#x}, {addr + data.size:#x}) overlaps an existing one")
      self._table = (bases[:i] + [addr] + bases[i:], arrays[:i] + [data] + arrays[i:],
                     system_[:i] + [bool(system)] + system_[i:])
    return data

  def unmap(self, addr: int) -> None:
    with self._lock:
      bases, arrays, system = self._table
      i = bisect.bisect_left(bases, addr)
      if i == len(bases) or bases[i] != addr: raise ValueError(f"no mapping starts at {addr:#x}")
      self._table = (bases[:i] + bases[i + 1:], arrays[:i] + arrays[i + 1:], system[:i] + system[i + 1:])

  def is_system(self, addr: int) -> bool:
    """Whether the mapping holding `addr` is system memory."""
    return self._find(addr, 1)[2]

  def alloc(self, nbytes: int, align: int = 0x1000) -> int:
    """Map `nbytes` zeroed bytes at a fresh address; returns the address."""
    addr = -(-self._next // align) * align
    self.map(addr, max(nbytes, 1))
    self._next = addr + max(nbytes, 1) + 0x1000       # a guard gap between mappings
    return addr

  def array(self, addr: int, dtype=np.uint8, count: int | None = None) -> np.ndarray:
    """A numpy view of mapped memory starting at `addr`."""
    array, off, _ = self._find(addr, 1)
    data = array[off:]
    itemsize = np.dtype(dtype).itemsize
    count = data.size // itemsize if count is None else count
    if count * itemsize > data.size: raise MemoryFault(addr, count * itemsize)
    return data[:count * itemsize].view(dtype)

  def _find(self, addr: int, nbytes: int, write: bool = False) -> tuple[np.ndarray, int, bool]:
    """(the mapping's bytes, the offset of `addr` in them, whether it is system memory)."""
    bases, arrays, system = self._table
    i = bisect.bisect_right(bases, addr) - 1
    if i < 0 or addr + nbytes > bases[i] + arrays[i].size: raise MemoryFault(addr, nbytes, write)
    return arrays[i], addr - bases[i], system[i]

  # ---- scalar access ----
  def read(self, addr: int, nbytes: int) -> bytes:
    array, off, _ = self._find(addr, nbytes)
    return array[off:off + nbytes].tobytes()

  def write(self, addr: int, data: bytes) -> None:
    array, off, _ = self._find(addr, len(data), True)
    array[off:off + len(data)] = np.frombuffer(bytes(data), np.uint8)

  # ---- vectorized access ----
  def _locate(self, addrs: np.ndarray, nbytes: int, write: bool):
    """(mapping index per address, offset per address, the mappings' arrays, their system flags) from one snapshot of
    the table; raises on the first bad address."""
    bases_l, arrays, system = self._table
    if not bases_l:
      if addrs.size: raise MemoryFault(int(addrs[0]), nbytes, write)
      return np.zeros(0, np.intp), np.zeros(0, np.int64), arrays, system
    # fast path: every address inside the mapping that holds the lowest one
    lo, hi = int(addrs.min()), int(addrs.max())
    i = bisect.bisect_right(bases_l, lo) - 1
    if i >= 0 and hi + nbytes <= bases_l[i] + arrays[i].size:
      return np.full(1, i, np.intp), (addrs - np.uint64(bases_l[i])).view(np.int64), arrays, system
    bases = np.array(bases_l, np.uint64)
    ends = bases + np.array([a.size for a in arrays], np.uint64)
    idx = np.searchsorted(bases, addrs, side="right").astype(np.intp) - 1
    safe = np.maximum(idx, 0)
    bad = (idx < 0) | (addrs + np.uint64(nbytes) > ends[safe]) | (addrs > np.uint64((1 << 64) - 1 - nbytes))
    if bad.any():
      raise MemoryFault(int(addrs[np.argmax(bad)]), nbytes, write)
    return safe, (addrs - bases[safe]).astype(np.int64), arrays, system

  def gather(self, addrs: np.ndarray, nbytes_each: int) -> np.ndarray:
    """Bytes at every address: (len(addrs), nbytes_each) uint8. Every address must be mapped
    (pass only the active lanes' addresses)."""
    addrs = np.asarray(addrs, np.uint64).reshape(-1)
    out = np.empty((addrs.size, nbytes_each), np.uint8)
    if addrs.size == 0: return out
    if self.sectors is not None:
      self.sectors += [addrs >> np.uint64(5), (addrs + np.uint64(nbytes_each - 1)) >> np.uint64(5)]
    idx, offs, arrays, system = self._locate(addrs, nbytes_each, False)
    first = int(idx[0])
    if idx.size == 1 or (idx == first).all():
      out[:] = self._take(arrays[first], offs, nbytes_each)
      self.traffic[system[first]] += addrs.size * nbytes_each
    else:
      for m in np.unique(idx):
        sel = idx == m
        out[sel] = self._take(arrays[int(m)], offs[sel], nbytes_each)
        self.traffic[system[int(m)]] += int(sel.sum()) * nbytes_each
    return out

  def scatter(self, addrs: np.ndarray, values: np.ndarray, nbytes_each: int, mask: np.ndarray | None = None) -> None:
    """Store `values` (len(addrs) rows of nbytes_each bytes, any dtype viewed as bytes) at the
    addresses whose mask is set; lanes are written in order (a later lane wins)."""
    addrs = np.asarray(addrs, np.uint64).reshape(-1)
    values = np.ascontiguousarray(values).reshape(addrs.size, -1).view(np.uint8)
    if values.shape[1] < nbytes_each: raise ValueError(f"scatter: {values.shape[1]} bytes per lane given, {nbytes_each} needed")
    values = values[:, :nbytes_each]
    if mask is not None:
      mask = np.asarray(mask, bool).reshape(-1)
      addrs, values = addrs[mask], values[mask]
    if addrs.size == 0: return
    idx, offs, arrays, system = self._locate(addrs, nbytes_each, True)
    if idx.size == 1 or (idx == idx[0]).all():      # one mapping holds every address
      self._put(arrays[int(idx[0])], offs, values, nbytes_each)
      self.traffic[system[int(idx[0])]] += addrs.size * nbytes_each
      return
    for m in np.unique(idx):
      sel = idx == m
      self._put(arrays[int(m)], offs[sel], values[sel], nbytes_each)
      self.traffic[system[int(m)]] += int(sel.sum()) * nbytes_each

  @staticmethod
  def _take(data: np.ndarray, offs: np.ndarray, n: int) -> np.ndarray:
    if n in (4, 8, 12, 16) and not (offs & 3).any() and data.ctypes.data % 4 == 0:
      words = data[:data.size // 4 * 4].view(np.uint32)
      w = offs >> 2
      if n == 4: return words[w].view(np.uint8).reshape(-1, 4)
      return words[w[:, None] + np.arange(n // 4)].view(np.uint8).reshape(-1, n)
    if n == 1: return data[offs][:, None]
    return data[offs[:, None] + np.arange(n)]

  @staticmethod
  def _put(data: np.ndarray, offs: np.ndarray, values: np.ndarray, n: int) -> None:
    if n in (4, 8, 12, 16) and not (offs & 3).any() and data.ctypes.data % 4 == 0:
      words = data[:data.size // 4 * 4].view(np.uint32)
      vals = np.ascontiguousarray(values).view(np.uint32)
      if n == 4: words[offs >> 2] = vals[:, 0]
      else: words[(offs >> 2)[:, None] + np.arange(n // 4)] = vals
      return
    data[offs[:, None] + np.arange(n)] = values


class HostMemory(Memory):
  """Mappings of real host memory: a GPU address is a host pointer (as with an SVM/userptr
  mapping). `map(addr, nbytes)` registers host memory that already exists at `addr`."""

  def __init__(self):
    super().__init__()
    import cffi
    self._ffi = cffi.FFI()

  def map(self, addr: int, nbytes: int, system: bool = True) -> np.ndarray:
    buf = self._ffi.buffer(self._ffi.cast("uint8_t *", addr), nbytes)
    return self.map_array(addr, np.frombuffer(buf, np.uint8), system)

  def alloc(self, nbytes: int, align: int = 0x1000) -> int:
    raise NotImplementedError("HostMemory maps memory the host allocated: call map(host_address, nbytes)")
