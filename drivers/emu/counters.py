"""Per-kernel execution counters of the emulated GPUs (the PTX interpreter and the RDNA3 emulator fill them).

    from baregrad.drivers.emu import counters
    counters.reset(); (a @ b).realize(); dev.synchronize()
    counters.total().as_dict()     # every kernel run since reset; counters.last(): the latest one

What one kernel run (one NV launch / one AMD DISPATCH_DIRECT) counts:

- Thread-instructions by class (CLASSES): one instruction executed by one thread.
  NV (PTX): the threads that execute it; a guarded instruction (`@%p`) counts the threads its guard lets through
  (a guarded `bra` counts the threads that branch).
  AMD (RDNA3): a vector instruction (VALU, VMEM, DS) counts the active lanes (EXEC bits) of each wave that executes
  it; a scalar instruction (SALU, SMEM, SOPP) counts the wave's live lanes (the lanes that exist in the wave, fixed
  at launch: 32, fewer in the last wave of a workgroup whose size is not a multiple of 32). A scalar instruction does
  its work once per wave, but counting it per lane keeps the two GPUs comparable (PTX has no scalar unit).
    alu      arithmetic, logic, moves, conversions, compares, selects (PTX add/mul/fma/cvt/setp/selp/mov/...,
             VALU and SALU on AMD, s_getpc included; v_cmpx is a compare even though it writes EXEC)
    global   global memory: ld/st .global and generic ld/st on NV; global_*/flat_* and the scalar loads
             (s_load/s_buffer_load) on AMD
    shared   shared memory: ld/st .shared on NV; the LDS (ds_*) on AMD
    branch   control flow: bra/ret/exit on NV; s_branch, s_cbranch_*, s_setpc/s_swappc/s_call, s_endpgm and the SALU
             instructions that write EXEC (s_and_saveexec_b32, s_mov_b32 exec_lo, ...) on AMD
    barrier  bar.sync / barrier.sync; s_barrier
    other    the rest: s_waitcnt, s_nop, s_delay_alu, membar/fence, ld.param (a constant-bank operand in SASS),
             per-thread private memory (PTX .local, AMD scratch_*), s_dcache_inv
- Where global bytes live: `global_system_bytes` is the part of the vectorized global loads and stores (memory.py
  gather/scatter: what the lanes move; scalar and atomic traffic included where the emulator routes it there) that
  hit system memory (GTT, pinned host pages) instead of the GPU's own memory.
- Bytes: per executing thread (active lane) x access width, loads and stores apart, for global memory and for shared
  memory / LDS: a b128 load by 32 lanes moves 512 bytes; an AMD scalar load moves its width once per wave. An atomic
  reads and writes its width (both counted). Private memory (.local, scratch), parameters and LDS-free DS
  instructions (ds_swizzle/permute, append/consume) move no counted bytes. Generic PTX addresses count where they
  land (global or shared).

Each emulator decides an instruction's class and width when it compiles the instruction (ptx_exec.Compiled,
rdna3.Compiled), so counting is one add per executed instruction.

Every emulated GPU keeps a `CounterLog` (the last run and a running total, under a lock: kernels run on the device's
queue threads) and forwards each run to this module's process-wide log, which `last()`, `total()` and `reset()` read.
With DEBUG >= 1 each run prints one line (`summary`) when it finishes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from baregrad.drivers import settings

CLASSES = ("alu", "global", "shared", "branch", "barrier", "other")
ALU, GLOBAL, SHARED, BRANCH, BARRIER, OTHER = range(len(CLASSES))
BYTE_FIELDS = ("global_load_bytes", "global_store_bytes", "shared_load_bytes", "shared_store_bytes",
               "global_system_bytes", "global_load_unique_bytes")
# `global_load_unique_bytes` (counted only while UNIQUE is on: count_unique; it costs a sort of every loaded address
# per kernel): the bytes of the distinct 32-byte sectors a kernel's global loads touched (memory.py gather), i.e. what
# it reads from DRAM when the caches (L1, L2) keep what it reads again. A kernel that reads a small vector once per
# output row loads the vector N times but reads it from DRAM once.
UNIQUE = False
SECTOR = 32


def count_unique(on: bool = True) -> None:
  global UNIQUE
  UNIQUE = on


def sector_bytes(chunks: list) -> int:
  """Bytes of the distinct sectors among the sector numbers in `chunks` (numpy arrays)."""
  import numpy as np
  return SECTOR * int(np.unique(np.concatenate(chunks)).size) if chunks else 0


@dataclass
class KernelCounters:
  """What one kernel run executed (or the sum of several runs: `kernels` says how many)."""
  name: str = ""
  instrs: list = field(default_factory=lambda: [0] * len(CLASSES))   # thread-instructions per class, CLASSES order
  global_load_bytes: int = 0
  global_store_bytes: int = 0
  shared_load_bytes: int = 0
  shared_store_bytes: int = 0
  global_system_bytes: int = 0     # of the global bytes, those in system memory (across the bus; memory.py traffic)
  global_load_unique_bytes: int = 0   # distinct 32-byte sectors loaded (UNIQUE on; above)
  kernels: int = 1

  @property
  def thread_instrs(self) -> int: return sum(self.instrs)

  @property
  def global_bytes(self) -> int: return self.global_load_bytes + self.global_store_bytes

  def by_class(self) -> dict: return dict(zip(CLASSES, self.instrs))

  def add(self, other: "KernelCounters") -> "KernelCounters":
    """Add `other` into this one (in place); returns self."""
    self.instrs = [a + b for a, b in zip(self.instrs, other.instrs)]
    for f in BYTE_FIELDS: setattr(self, f, getattr(self, f) + getattr(other, f))
    self.kernels += other.kernels
    return self

  def copy(self) -> "KernelCounters":
    return KernelCounters(self.name, list(self.instrs), *(getattr(self, f) for f in BYTE_FIELDS), self.kernels)

  def as_dict(self) -> dict:
    return {"name": self.name, "kernels": self.kernels, "thread_instrs": self.thread_instrs, **self.by_class(),
            **{f: getattr(self, f) for f in BYTE_FIELDS}}

  def summary(self, vendor: str) -> str:
    """`emu NV  r_256_16  thread-instrs 1,234,567 (alu 70% global 20% ...)  global 4.0 MB ld / 1.0 MB st  shared 0 B`"""
    total = self.thread_instrs
    shares = " ".join(f"{c} {100 * n / total:.0f}%" for c, n in zip(CLASSES, self.instrs) if n) if total else "none"
    shared = self.shared_load_bytes + self.shared_store_bytes
    shared_text = f"{_bytes(self.shared_load_bytes)} ld / {_bytes(self.shared_store_bytes)} st" if shared else "0 B"
    return (f"emu {vendor:3s} {self.name}  thread-instrs {total:,} ({shares})  "
            f"global {_bytes(self.global_load_bytes)} ld / {_bytes(self.global_store_bytes)} st  shared {shared_text}")


def _bytes(n: int) -> str:
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale: return f"{n / scale:.1f} {unit}"
  return f"{n} B"


class CounterLog:
  """The last kernel run and the running total of one emulated GPU (or of the process), thread safe."""

  def __init__(self, vendor: str = "", parent: "CounterLog | None" = None, echo: bool = True):
    self.vendor, self.parent, self.echo = vendor, parent, echo     # echo: print each run with DEBUG >= 1
    self._lock = threading.Lock()
    self._last: KernelCounters | None = None
    self._total = KernelCounters("total", kernels=0)

  def record(self, run: KernelCounters) -> None:
    """A kernel run finished: keep it, add it to the total, print it with DEBUG >= 1 (from the emulator's thread)."""
    with self._lock:
      self._last = run
      self._total.add(run)
    if self.parent is not None: self.parent.record(run)
    if self.echo and settings.DEBUG >= 1: print(run.summary(self.vendor), flush=True)

  def last(self) -> KernelCounters | None:
    """A copy of the latest kernel run's counters (None before the first run since the last reset)."""
    with self._lock: return None if self._last is None else self._last.copy()

  def total(self) -> KernelCounters:
    """A copy of the sum over every kernel run since the last reset (`kernels` counts them)."""
    with self._lock: return self._total.copy()

  def reset(self) -> None:
    with self._lock:
      self._last, self._total = None, KernelCounters("total", kernels=0)


PROCESS = CounterLog("all", echo=False)     # every emulated GPU of this process (each GPU's own log prints)


def last() -> KernelCounters | None: return PROCESS.last()
def total() -> KernelCounters: return PROCESS.total()
def reset() -> None:
  """Forget the process-wide last run and total (each GPU's own log keeps its own)."""
  PROCESS.reset()
