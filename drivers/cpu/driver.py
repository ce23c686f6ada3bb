"""The CPU driver: host memory from mmap, kernels as ELF objects loaded by our own loader, and one command
processor (a ring consumed by a worker thread) that both the compute and the copy queue feed."""
from __future__ import annotations
from dataclasses import dataclass
import os, weakref
import cffi
from . import cc, elf
from .. import settings
import numpy as np
from ..encoded import Encoded, stream
from . import processor
from .processor import CommandProcessor, Op, PACKETS, header, ProcessorFault, address_space
from ..markers import MARKS_KEPT
from ..hostcopy import HostMemoryCopies

_ffi = cffi.FFI()
# -fwrapv: integer overflow wraps, as on every GPU and in numpy. -ffp-contract=off: a*b+c is two roundings, as numpy
# and the GPU renderers (.rn) compute it; gcc's default (fast) fuses across statements. Kernels that sum products
# turn fusion back on for themselves (compiler/render_c.py, kernel_attributes).
KERNEL_FLAGS = cc.DEFAULT_FLAGS + ("-fwrapv", "-ffp-contract=off") + cc.VECTOR_WIDTH_FLAGS
# A kernel of more lines than this (a fused expression of hundreds of exp/sin/log/sqrt terms) is compiled by clang
# without its SLP vectorizer: the loop vectorizer already made the body one vector iteration, and SLP plus the
# register allocator grow faster than linearly there. clang 19 -O3, 500-term chain (18,900 lines): 5.0 s -> 3.4 s.
# gcc gets per-function optimize attributes from the renderer instead (compiler/render_c.py, kernel_attributes).
HUGE_KERNEL_LINES = 2048


# the header word of each packet (its size from processor.PACKETS: the header + its operands)
_EXEC, _EXEC_MT, _COPY, _SIGNAL, _WAIT, _TIMESTAMP, _BARRIER = (header(op, 1 + len(PACKETS[op])) for op in (
  Op.EXEC, Op.EXEC_MT, Op.COPY, Op.SIGNAL, Op.WAIT, Op.TIMESTAMP, Op.BARRIER))


def _helpers() -> int:
  """Threads besides the command processor's that run the chunks of a kernel: THREADS cores in all (a kernel's THREAD
  opt cuts it into chunks whatever the cores, compiler/opt.py; THREADS=1 runs them one after another)."""
  return max(0, min(settings.THREADS, os.cpu_count() or 1) - 1)


@dataclass(eq=False)
class Memory:
  addr: int
  nbytes: int
  mapped: int


class ProcessorTimeout(TimeoutError):
  """A wait on the CPU device timed out with packets still queued: names where the command processor is."""


class CPUDriver(HostMemoryCopies):     # copyin/copyout: plain copies (drivers/hostcopy.py)
  word_log = None         # CAPTURE: a drivers/decode.py WordLog of what the ring gets
  name = "CPU"
  target = None                  # programs are host machine code (a capture records the machine instead)
  timestamp_hz = 1_000_000_000   # the command processor writes CLOCK_MONOTONIC nanoseconds
  has_copy_queue = False         # one command processor runs both queues' packets, in order
  emulated = False               # the host's own processor

  @classmethod
  def probe(cls) -> dict: return {"available": True}

  def __init__(self):
    # packets touch only our allocations and loaded kernels; its thread compiles the worker while we go on
    self.processor = CommandProcessor(checked=True, helpers=_helpers())
    self._init_progress()

  def _init_progress(self):
    # hang reports (settings.QUEUE_MARKERS): ring position of each recent packet -> what it runs; the worker's own
    # progress words (rptr, the packet being executed, the INDIRECT buffer offset) say how far it got
    self.markers = settings.QUEUE_MARKERS
    self._starts = np.full(MARKS_KEPT, -1, np.int64)   # ring positions of the last packets written (no Python objects:
    self._nstarts = 0                                   # a report reads the packets themselves from the ring)
    self._kernel_names: dict[int, str] = {}    # entry point -> kernel name
    self._stalled = None

  def close(self):
    """Stop the command processor thread (its ring and control block go with it)."""
    self.processor.stop()

  def after_fork_in_child(self) -> bool:
    """A forked child keeps using this device: its memory and loaded kernels are the child's private copies at the
    same addresses (mmap MAP_PRIVATE), only the command processor thread is missing. A new processor (with a new
    worker image and helper threads) takes over; the parent's is left alone. True: the device stays usable."""
    processor.after_fork_in_child()
    self.processor.abandon()
    self.processor = CommandProcessor(checked=True, helpers=_helpers())
    names = self._kernel_names
    self._init_progress()
    self._kernel_names = names
    address_space.publish()
    return True

  # ---- memory ----
  def alloc(self, nbytes: int) -> Memory:
    mapped = (max(nbytes, 1) + elf.PAGE - 1) // elf.PAGE * elf.PAGE
    mem = Memory(elf.map_memory(mapped), nbytes, mapped)
    address_space.map(mem.addr, mapped)
    return mem

  def alloc_args(self, nbytes: int):
    """Kernel arguments: memory like any other (hcq/driver.py)."""
    return self.alloc(nbytes)

  def alloc_polled(self, nbytes: int):
    """Memory the host polls (signals): see hcq/driver.py."""
    return self.alloc(nbytes)                 # host memory already

  def free(self, mem: Memory):
    address_space.unmap(mem.addr)
    elf.unmap_memory(mem.addr, mem.mapped)

  def map_host(self, addr: int, nbytes: int):
    """Let packets touch host memory another device allocated (memory shared by the queues of both)."""
    address_space.map(addr, nbytes)

  def view(self, addr: int, nbytes: int):
    return _ffi.buffer(_ffi.cast("char *", addr), nbytes)


  # ---- programs ----
  def compile(self, src: str) -> bytes:
    flags = KERNEL_FLAGS
    if src.count("\n") > HUGE_KERNEL_LINES and "clang" in cc.compiler_version(cc.find_compiler()):
      flags += ("-fno-slp-vectorize",)
    return cc.compile_c(src, flags)

  def load_program(self, binary: bytes, name: str):
    image = elf.load_elf(binary)
    entry = image.symbol(name)
    address_space.add_entry(entry)
    weakref.finalize(image, address_space.remove_entry, entry)   # unloaded with its image
    self._kernel_names[entry] = name
    weakref.finalize(image, self._kernel_names.pop, entry, None)
    return entry, image

  def unload_program(self, handle):
    """Nothing to do: the image unloads itself (its finalizer) once hcq drops the last reference to it, which is
    after the device finished the work that used it."""

  # ---- queues ----
  def encode(self, kind: str, cmds: list[tuple]) -> Encoded:
    """Queue commands -> 64-bit packet words (processor.py), one stream (both kinds of queue feed the one command
    processor); a symbolic value (an hcq Slot) fills its operand word, which `stream` lists as a patch. No side
    effects."""
    words: list = []
    for cmd in cmds:
      op = cmd[0]
      if op == "exec":
        threads = cmd[1].meta.get("threads", 1)
        words += (_EXEC, cmd[1].entry, cmd[2]) if threads == 1 else (_EXEC_MT, cmd[1].entry, cmd[2], threads)
      elif op == "signal": words += (_SIGNAL, cmd[1].addr, cmd[2])
      elif op == "wait": words += (_WAIT, cmd[1].addr, cmd[2])
      elif op == "copy": words += (_COPY, cmd[1], cmd[2], cmd[3])
      elif op == "timestamp": words += (_TIMESTAMP, cmd[1].timestamp_addr)
      elif op == "barrier": words.append(_BARRIER)
      else: raise ValueError(f"CPU queue: unknown command {op!r}")
    return stream(words, 64)

  def submit(self, kind: str, encoded: Encoded):
    if encoded.patches: raise ValueError(f"CPU {kind} queue: submit of commands with unresolved symbolic values")
    if self.word_log is not None: self.word_log.add(kind, "cpu", encoded.words, self._readable)
    starts = self.processor.write(encoded.words)
    if self.markers: self._note_packets(starts, encoded.words)

  # ---- bound queues (JIT replay): packets live in memory, the ring gets one INDIRECT packet ----
  def bind(self, kind: str, encoded: Encoded):
    words = encoded.words
    mem = self.alloc(8 * len(words))
    view = np.frombuffer(self.view(mem.addr, 8 * len(words)), dtype=np.uint64)
    view[:] = np.array(words, dtype=np.uint64)
    return (mem, view, len(words))

  def submit_bound(self, kind: str, bound, patch: list[tuple[int, int]]):
    mem, view, nwords = bound
    for i, v in patch: view[i] = v
    words = [header(Op.INDIRECT, 3), mem.addr, nwords]
    if self.word_log is not None: self.word_log.add(kind, "cpu", words, self._readable)
    starts = self.processor.write(words)
    if self.markers: self._note_packets(starts, words)

  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    try:
      if self.processor.wait_value(addr, value, timeout): return True
    except ProcessorFault:
      return False      # check_faults reports it, with where the processor was
    self._stalled = (addr, value, int.from_bytes(bytes(self.view(addr, 8)), "little"), timeout)
    return False

  # ---- progress: which command a stopped or hung processor is in ----
  def _describe(self, words: list[int], at: int) -> str:
    """The packet at words[at] in words (its kernel by name)."""
    op, n = words[at] & 0xFFFF, words[at] >> 16
    args = words[at + 1:at + n]
    if op in (Op.EXEC, Op.EXEC_MT) and args: return f"kernel {self._kernel_names.get(args[0], hex(args[0]))}"
    if op in (Op.SIGNAL, Op.WAIT) and len(args) == 2:
      return f"{'signal' if op == Op.SIGNAL else 'wait for'} [{args[0]:#x}] {'=' if op == Op.SIGNAL else '>='} {args[1]}"
    if op == Op.COPY and len(args) == 3: return f"copy of {args[2]} bytes"
    if op == Op.INDIRECT and len(args) == 2: return f"a bound queue ({args[1]} words at {args[0]:#x})"
    return Op(op).name.lower() if op in Op._value2member_map_ else f"opcode {op}"

  def _note_packets(self, starts: list[int], words: list[int]):
    n = self._nstarts
    for s in starts: self._starts[n % MARKS_KEPT] = s; n += 1
    self._nstarts = n

  def _packet_at(self, position: int) -> str | None:
    """What the packet at ring `position` runs, read from the ring (None: it was overwritten since)."""
    if position < self.processor.wptr - self.processor.ring_words: return None
    words = self.processor.words_at(position, 1)
    n = words[0] >> 16
    return self._describe(self.processor.words_at(position, max(1, min(n, 8))), 0) if n else None

  def _last_before(self, position: int) -> int | None:
    """The ring position of the last remembered packet that starts before `position`."""
    before = self._starts[(self._starts >= 0) & (self._starts < position)]
    return int(before.max()) if before.size else None

  def progress_report(self) -> str:
    """'last command done ..., first not done ...' from the worker's progress words (empty without markers)."""
    if not self.markers: return ""
    rptr, _, ib = self.processor.progress()
    wptr = self.processor.wptr
    done = self._last_before(rptr)
    last = f"#{done} ({self._packet_at(done)})" if done is not None else "none remembered"
    if rptr >= wptr: return f"; every command done (last {last})"
    first = f"#{rptr} ({self._packet_at(rptr) or 'a packet of a submission before the last ' + str(MARKS_KEPT)})"
    _, _, pending = self.processor.pending()
    if ib and pending and pending[0] & 0xFFFF == Op.INDIRECT and len(pending) >= 3:
      data = self._readable(pending[1], 8 * pending[2])
      if data is not None and ib - 1 < pending[2]:
        ibw = np.frombuffer(data, np.uint64).tolist()
        first += f", at word {ib - 1} of its indirect buffer: {self._describe(ibw, ib - 1)}"
    return f"; ring position of the last command done {last}, first not done {first}"

  def _readable(self, addr: int, nbytes: int) -> bytes | None:
    """The bytes at an address inside memory the command processor may touch (for decoding), else None."""
    for start, end in list(address_space.ranges.items()):
      if start <= addr and addr + nbytes <= end: return bytes(self.view(addr, nbytes))
    return None

  def dump_queues(self) -> str:
    """The command processor's ring from its read pointer to its write pointer, decoded (following INDIRECTs)."""
    from ..decode import decode as decode_words    # (only here: the decoder's tables stay out of import time)
    rptr, wptr, words = self.processor.pending()
    head = (f"command processor ring ({self.processor.ring_words} words): read pointer {rptr}, write pointer {wptr} "
            f"(words since it started){': empty' if not words else ''}")
    return "\n".join([head] + decode_words("cpu", words, None, self._readable, "  "))

  def check_faults(self, device_name: str):
    fault = self.processor.fault
    if fault is not None:
      where = ""
      if self.processor.fault_code == processor.FAULT_KERNEL:     # the faulting address, by this device's memory
        addr = self.processor.fault_address
        inside = [(a, end) for a, end in list(address_space.ranges.items()) if a <= addr < end]
        where = (f" (in memory of this device at {inside[0][0]:#x}, offset {addr - inside[0][0]:#x})" if inside else
                 " (in no memory of this device)")
      raise ProcessorFault(f"{device_name}: {fault}{where}{self.progress_report()}")
    if self._stalled:
      (addr, value, seen, timeout), self._stalled = self._stalled, None
      rptr, _, _ = self.processor.progress()
      if rptr < self.processor.wptr:
        raise ProcessorTimeout(f"{device_name}: waited {timeout:.3g} s for [{addr:#x}] >= {value}, it is {seen}; the "
                               f"command processor is at ring position {rptr}{self.progress_report()}")
