"""The CPU device's command processor: a ring of command packets consumed by a worker thread.

The host side of the same queue model a GPU uses: `write()` puts whole packets into the ring,
publishes `wptr` and rings the doorbell (a futex wake when the worker sleeps). The worker is C
(`worker.c`, which documents the packet format), compiled by cc.py and loaded by baregrad's own
ELF loader; a daemon thread runs it through cffi, which releases the GIL for the whole call.

    cp = CommandProcessor()
    cp.write(packet(Op.EXEC, kernel_address, args_address) + packet(Op.SIGNAL, signal_address, 1))
    cp.wait_value(signal_address, 1, timeout=1.0)
"""
from __future__ import annotations
import atexit, enum, mmap, os, threading, time, warnings, weakref
from pathlib import Path
import cffi
import numpy as np
from . import cc, elf
from ..encoded import words_struct

ffi = cffi.FFI()
ffi.cdef("""
struct bg_ctl {
  uint64_t wptr, rptr;
  uint32_t sleeping, stop;
  uint64_t fault, fault_info, last_header_rptr;
  uint32_t rptr_waiters, host_cpu;
  uint64_t fault_ib_offset, fault_addr, checked, ib_progress, guard, fault_signal, pad[3];
};
struct bg_range { uint64_t start, end; };
typedef void (*bg_host_mmu_set_t)(const struct bg_range *ranges, uint64_t nranges, const uint64_t *entries, uint64_t nentries);
struct bg_libc { void *syscall, *clock_gettime, *memcpy; };
typedef void (*bg_helper_run_t)(const struct bg_libc *libc);
typedef void (*bg_helpers_stop_t)(const struct bg_libc *libc);
typedef void (*bg_worker_run_t)(struct bg_ctl *ctl, uint64_t *ring, uint64_t ring_words, const struct bg_libc *libc);
typedef void (*bg_host_doorbell_t)(struct bg_ctl *ctl, uint64_t wptr, const struct bg_libc *libc);
typedef void (*bg_host_stop_t)(struct bg_ctl *ctl, const struct bg_libc *libc);
typedef void (*bg_host_install_fault_handler_t)(const struct bg_libc *libc);
typedef int (*bg_host_guarded_launch_t)(uint64_t fn, uint64_t a, uint64_t b, uint64_t *addr, const struct bg_libc *libc);
typedef int (*bg_host_wait_value_t)(uint64_t addr, uint64_t value, int64_t timeout_ns, int64_t spin_ns,
                                    uint64_t fault_addr, const struct bg_libc *libc);
typedef int (*bg_host_wait_rptr_t)(struct bg_ctl *ctl, uint64_t target, int64_t timeout_ns, int64_t spin_ns,
                                   const struct bg_libc *libc);
typedef long (*bg_host_futex_wait_t)(uint64_t addr, uint32_t expected, int64_t timeout_ns, const struct bg_libc *libc);
typedef long (*bg_host_futex_wake_t)(uint64_t addr, int count, const struct bg_libc *libc);
""")


class Op(enum.IntEnum):
  NOP = 0
  EXEC = 1
  COPY = 2
  SIGNAL = 3
  WAIT = 4
  TIMESTAMP = 5
  BARRIER = 6
  INDIRECT = 7
  EXEC_MT = 8


# operands after the header word, in order (worker.c's min_words is 1 + len of each)
PACKETS = {
  Op.NOP: (), Op.EXEC: ("fn", "args"), Op.COPY: ("dst", "src", "nbytes"), Op.SIGNAL: ("addr", "value"),
  Op.WAIT: ("addr", "value"), Op.TIMESTAMP: ("addr",), Op.BARRIER: (), Op.INDIRECT: ("addr", "nwords"),
  Op.EXEC_MT: ("fn", "args", "nchunks"),
}
FAULTS = {1: "unknown opcode", 2: "bad packet size", 3: "INDIRECT inside an INDIRECT buffer", 4: "unmapped address",
          5: "not a loaded kernel entry point", 6: "a fault signal inside a kernel"}
SIGNALS = {4: "SIGILL (an illegal instruction)", 7: "SIGBUS (a bus error)", 8: "SIGFPE (an arithmetic fault, e.g. an "
           "integer division by zero)", 11: "SIGSEGV (a memory access where nothing is mapped for it)"}   # Linux signal numbers
WAIT_DONE, WAIT_TIMEOUT, WAIT_ABORTED = 0, 1, 2
FAULT_KERNEL = 6        # a fault signal inside a kernel (worker.c BG_FAULT_KERNEL)
HOST_SPIN_NS = 200_000  # host waits spin this long before sleeping in futex: a host that sleeps is woken by
# the worker onto the worker's CPU (the kernel places a woken thread beside its waker), and the two then share
# one CPU (worker.c, leave_cpu); a short kernel is done well within it
ETIMEDOUT = 110        # Linux <asm-generic/errno.h>


def header(opcode: int, nwords: int) -> int: return int(opcode) | nwords << 16


def packet(op: Op, *operands: int) -> list[int]:
  """One packet: header word + operand words."""
  op = Op(op)
  if len(operands) != len(PACKETS[op]):
    raise TypeError(f"{op.name} packet takes {len(PACKETS[op])} operands {PACKETS[op]}, got {len(operands)}")
  for name, value in zip(PACKETS[op], operands):
    if not 0 <= value < 2**64: raise ValueError(f"{op.name} operand {name}={value} is not a 64-bit unsigned word")
  return [header(op, 1 + len(operands)), *map(int, operands)]


def nop(nwords: int) -> list[int]: return [header(Op.NOP, nwords)] + [0] * (nwords - 1)


class ProcessorFault(RuntimeError):
  pass


class _Worker:
  """worker.c compiled and loaded once per process, its functions typed for cffi. A command processor's thread
  compiles it when the processor starts (`get` from that thread), so the C compiler runs while the host builds and
  compiles its first kernels; the host waits for it only at its first doorbell or wait. Memory registered before
  then is handed to it once it is loaded."""
  _lock = threading.Lock()
  _instance: "_Worker | None" = None

  def __init__(self):
    self._helpers_lock = threading.Lock()
    self.image = elf.load_elf(cc.compile_c(Path(__file__).with_name("worker.c").read_text()))
    self.libc = ffi.new("struct bg_libc *")
    for name in ("syscall", "clock_gettime", "memcpy"):
      setattr(self.libc, name, ffi.cast("void *", elf.resolve_libc(name)))
    for name in ("bg_helper_run", "bg_helpers_stop", "bg_worker_run", "bg_host_doorbell", "bg_host_stop", "bg_host_wait_value", "bg_host_wait_rptr",
                 "bg_host_futex_wait", "bg_host_futex_wake", "bg_host_mmu_set", "bg_host_install_fault_handler",
                 "bg_host_guarded_launch"):
      setattr(self, name.removeprefix("bg_"), ffi.cast(name + "_t", self.image.symbol(name)))
    # a fault signal inside a kernel stops the kernel, not the process (worker.c); other faults go to the handler
    # that was there before (Python's faulthandler, or the default)
    self.host_install_fault_handler(self.libc)

  def start_helpers(self, n: int):
    """Helper threads that share the chunks of multi-threaded kernels (once per process; from any thread)."""
    with self._helpers_lock:
      if getattr(self, "helpers", None) is not None: return
      self.helpers = [threading.Thread(target=self.helper_run, args=(self.libc,), daemon=True,
                                       name=f"baregrad-cpu-helper{i}") for i in range(n)]
      for t in self.helpers: t.start()
    atexit.register(self.stop_helpers)

  def stop_helpers(self):
    """Stop and join the helper threads (before the worker image is unmapped at exit)."""
    helpers, self.helpers = getattr(self, "helpers", None) or [], []
    if helpers: self.helpers_stop(self.libc)
    for t in helpers: t.join(timeout=5)

  @classmethod
  def get(cls) -> "_Worker":
    """The loaded worker: compiled here, or waited for while another thread compiles it."""
    if (w := cls._instance) is not None: return w
    with cls._lock:
      if cls._instance is None:
        cls._instance = _Worker()
        address_space.publish()    # what was registered while it compiled
      return cls._instance


def _u64p(addr: int): return ffi.cast("uint64_t *", addr)


def guarded_launch(fn: int, a: int, b: int) -> tuple[int, int, int]:
  """fn(a, b) -> int, a C function of another library (the emulated Metal GPU's kernel launcher), with a fault signal
  inside it stopping it rather than the process (worker.c): (its result, the signal or 0, the faulting address)."""
  w = _Worker.get()
  addr = ffi.new("uint64_t *")
  rc = w.host_guarded_launch(fn, a, b, addr, w.libc)
  return (rc, 0, 0) if rc >= 0 else (0, -rc, int(addr[0]))


class AddressSpace:
  """What packets of a checked processor may touch: registered memory ranges and kernel entry points. One table
  per process (the worker's); the host publishes a new sorted copy on every change. The sorted tables are kept as
  numpy arrays and changed in place of being rebuilt (a change costs microseconds, not a walk over every range: a
  cache flushing thousands of programs or buffers stays linear)."""

  def __init__(self):
    self.ranges: dict[int, int] = {}     # start -> end
    self.entries: dict[int, int] = {}    # entry point -> how many loaded programs have it
    self._lock = threading.Lock()
    self._tables = None
    self._range_table = np.zeros((0, 2), np.uint64)      # (start, end) rows sorted by start
    self._entry_table = np.zeros(0, np.uint64)           # sorted entry points

  def map(self, addr: int, nbytes: int):
    with self._lock:
      if addr in self.ranges: self._range_table = self._drop(self._range_table, addr)
      self.ranges[addr] = addr + nbytes
      at = int(np.searchsorted(self._range_table[:, 0], np.uint64(addr)))
      self._range_table = np.insert(self._range_table, at, np.array([addr, addr + nbytes], np.uint64), axis=0)
      self._publish()

  def unmap(self, addr: int):
    with self._lock:
      if self.ranges.pop(addr, None) is not None:
        self._range_table = self._drop(self._range_table, addr)
        self._publish()

  def add_entry(self, fn: int):
    with self._lock:
      self.entries[fn] = self.entries.get(fn, 0) + 1
      if self.entries[fn] == 1:
        self._entry_table = np.insert(self._entry_table, int(np.searchsorted(self._entry_table, np.uint64(fn))),
                                      np.uint64(fn))
      self._publish()

  def remove_entry(self, fn: int):
    with self._lock:
      if fn in self.entries:
        self.entries[fn] -= 1
        if not self.entries[fn]:
          del self.entries[fn]
          self._entry_table = self._drop(self._entry_table, fn)
        self._publish()

  @staticmethod
  def _drop(table: np.ndarray, key: int) -> np.ndarray:
    """`table` without the row (or value) whose first column is `key` (a new array: the worker may read the old)."""
    keys = table[:, 0] if table.ndim == 2 else table
    at = int(np.searchsorted(keys, np.uint64(key)))
    return np.delete(table, at, axis=0) if at < len(keys) and int(keys[at]) == key else table

  def publish(self):
    """Hand the current tables to the worker (again: a forked child's new worker starts with none)."""
    with self._lock: self._publish()

  def _publish(self):
    # never waits for the worker (its loader publishes under this lock): one not loaded yet gets the tables then
    if (w := _Worker._instance) is None: return
    ranges = self._range_table if len(self._range_table) else np.zeros((1, 2), np.uint64)
    entries = self._entry_table if len(self._entry_table) else np.zeros(1, np.uint64)
    ranges, entries = np.ascontiguousarray(ranges), np.ascontiguousarray(entries)
    w.host_mmu_set(ffi.cast("struct bg_range *", ranges.ctypes.data), len(self._range_table),
                   _u64p(entries.ctypes.data), len(self._entry_table))
    self._tables = (ranges, entries)     # the previous tables are no longer read once mmu_set returned


address_space = AddressSpace()


_pid = os.getpid()


def after_fork_in_child():
  """A forked child has none of the parent's threads: the worker image (with the helpers' team and the address
  table the parent's threads used) is loaded anew on next use, and locks another thread held at the fork are
  replaced. Idempotent (every at-fork handler that needs it calls it first, whatever their order). A CPU driver
  that was open makes its own new command processor (CPUDriver.after_fork_in_child)."""
  global _pid
  if _pid == os.getpid(): return
  _pid = os.getpid()
  _Worker._lock = threading.Lock()
  _Worker._instance = None
  address_space._lock = threading.Lock()


os.register_at_fork(after_in_child=after_fork_in_child)


def futex_wait(addr: int, expected_low32: int, timeout_s: float) -> bool:
  """Sleep while the 32-bit word at addr equals expected_low32 (GIL released). False on timeout, True otherwise
  (woken, value already different, or interrupted: callers re-check their condition)."""
  w = _Worker.get()
  if w.host_futex_wait(addr, expected_low32 & 0xFFFFFFFF, int(timeout_s * 1e9), w.libc) == 0: return True
  return ffi.errno != ETIMEDOUT


def futex_wake(addr: int, count: int = 0x7FFFFFFF) -> int:
  """Wake up to `count` threads sleeping in futex on the 32-bit word at addr; returns how many woke."""
  w = _Worker.get()
  return max(0, w.host_futex_wake(addr, count, w.libc))


def wait_value(addr: int, value: int, timeout_s: float, spin_ns: int = HOST_SPIN_NS) -> bool:
  """Block until the uint64 at addr is >= value (spin, then futex; GIL released). False on timeout."""
  w = _Worker.get()
  return w.host_wait_value(addr, value, int(timeout_s * 1e9), spin_ns, 0, w.libc) == WAIT_DONE


def _run(ctl, ring, ring_words: int, helpers: int, failure: list) -> None:
  """The command processor thread: load the worker (compiling it on first use), start the helper threads, consume.
  If the worker cannot be loaded here, the error is kept in `failure` and the host's next doorbell or wait raises it
  (the thread is gone: nothing would ever consume the ring, and every wait would time out)."""
  try:
    w = _Worker.get()
    if helpers: w.start_helpers(helpers)
  except BaseException as e:
    failure.append(f"{type(e).__name__}: {e}")
    return
  w.worker_run(ctl, ring, ring_words, w.libc)


def _shutdown(ctl, thread: threading.Thread, memory, timeout: float = 5.0) -> None:
  """Stop the worker thread and join it; memory is released only once the thread is gone."""
  deadline = time.monotonic() + timeout
  ctl.stop = 1       # seen by a worker that starts only now (its thread was still compiling it)
  while thread.is_alive() and time.monotonic() < deadline:
    if (worker := _Worker._instance) is not None: worker.host_stop(ctl, worker.libc)
    thread.join(0.01)
  if thread.is_alive():  # a kernel that never returns: the ring must outlive the thread
    _leaked.append(memory)
    warnings.warn(f"CPU command processor thread did not stop within {timeout} s (a kernel still running?)")


_leaked: list = []


class CommandProcessor:
  """A ring of `ring_words` uint64 words (a power of two) and the worker thread that consumes it."""

  def __init__(self, ring_words: int = 1 << 16, checked: bool = False, helpers: int = 0):
    """checked: packets may only use memory and kernel entry points registered in `address_space`. helpers: threads
    (once per process) that share the chunks of multi-threaded kernels with this processor's."""
    if ring_words < 16 or ring_words & (ring_words - 1):
      raise ValueError(f"ring_words must be a power of two >= 16, got {ring_words}")
    self.ring_words = ring_words
    # one page for the control block, then the ring, page-aligned
    # private: a forked child gets its own copy (a shared ring would feed the child's packets to our worker)
    self._memory = mmap.mmap(-1, elf.PAGE + ring_words * 8, flags=mmap.MAP_PRIVATE)
    self._ptr = ffi.from_buffer(self._memory)
    self.ctl_address = int(ffi.cast("uintptr_t", self._ptr))
    self.ring_address = self.ctl_address + elf.PAGE
    self._ctl = ffi.cast("struct bg_ctl *", self.ctl_address)
    self._ctl.checked = int(checked)
    self._fault_address = self.ctl_address + ffi.offsetof("struct bg_ctl", "fault")
    self._ring = np.frombuffer(self._memory, dtype=np.uint64, count=ring_words, offset=elf.PAGE)
    self._wptr = 0  # host copy: words written, published or not
    self._lock = threading.Lock()
    self._failure: list[str] = []
    self._thread = threading.Thread(target=_run, name="baregrad-cpu-processor", daemon=True,
                                    args=(self._ctl, _u64p(self.ring_address), ring_words, helpers, self._failure))
    self._thread.start()
    self._finalizer = weakref.finalize(self, _shutdown, self._ctl, self._thread, (self._memory, self._ptr))

  @property
  def _w(self) -> _Worker: return _Worker._instance or _Worker.get()

  # ---- state ----
  @property
  def rptr(self) -> int: return self._ctl.rptr

  @property
  def wptr(self) -> int: return self._ctl.wptr

  @property
  def stopped(self) -> bool: return not self._finalizer.alive

  def words_at(self, position: int, n: int) -> list[int]:
    """The `n` ring words from ring position `position` (words since the start; what is there now)."""
    return [int(self._ring[p & (self.ring_words - 1)]) for p in range(position, position + n)]

  def progress(self) -> tuple[int, int, int]:
    """(read pointer: packets done up to here, the ring position of the packet being executed, the word offset + 1 of
    the packet being executed inside an INDIRECT buffer or 0): the worker's progress words."""
    return self._ctl.rptr, self._ctl.last_header_rptr, self._ctl.ib_progress

  def pending(self) -> tuple[int, int, list[int]]:
    """(read pointer, write pointer, the ring words between them): what the worker has not finished yet (a packet
    may continue past the ring's end at its start)."""
    rptr, wptr = self.rptr, self.wptr
    return rptr, wptr, [int(self._ring[p & (self.ring_words - 1)]) for p in range(rptr, max(rptr, wptr))]

  @property
  def fault_code(self) -> int: return self._ctl.fault

  @property
  def fault_address(self) -> int: return self._ctl.fault_addr

  @property
  def fault(self) -> str | None:
    """None, or what went wrong: the fault, the packet header and where it was."""
    code = self._ctl.fault
    if code == 0: return None
    info, pos, ib = self._ctl.fault_info, self._ctl.last_header_rptr, self._ctl.fault_ib_offset
    opcode, nwords = info & 0xFFFF, info >> 16
    name = Op(opcode).name if opcode in Op._value2member_map_ else "unknown"
    what = FAULTS.get(code, f"fault code {code}")
    if code == 1: what = f"unknown opcode {opcode}"
    elif code == 4: what = f"{name} packet operand 0x{self._ctl.fault_addr:x} is not mapped device memory"
    elif code == 5: what = f"{name} packet function 0x{self._ctl.fault_addr:x} is not a loaded kernel entry point"
    elif code == 6:
      sig = self._ctl.fault_signal
      what = (f"the kernel of the {name} packet was stopped by {SIGNALS.get(sig, f'signal {sig}')} at address "
              f"0x{self._ctl.fault_addr:x}")
    elif code == 2: what = f"bad packet size: {name} (opcode {opcode}) packet with nwords={nwords}"
    where = f"ring position {pos} (ring word {pos & (self.ring_words - 1)})"
    if ib: where = f"word {ib - 1} of the INDIRECT buffer called at {where}"
    return f"CPU command processor fault: {what} (header 0x{info:x}) at {where}"

  def _check(self) -> None:
    if (f := self.fault) is not None: raise ProcessorFault(f)
    if self.stopped or self._ctl.stop: raise RuntimeError("the CPU command processor is stopped")
    self._check_thread()

  def _check_thread(self) -> None:
    """A processor whose thread ended before it was stopped consumes nothing: say why now, not after a timeout. A
    fault ends the thread too, and says why better (it is written before the thread returns)."""
    if (f := self.fault) is not None: raise ProcessorFault(f)
    if self._failure or (not self._thread.is_alive() and self._thread.ident is not None and not self._ctl.stop):
      why = self._failure[0] if self._failure else "it returned without being stopped"
      raise ProcessorFault(f"the CPU command processor thread is not running ({why}); the packets written to it will "
                           f"never run: open the device again (a new processor), and report this if it recurs")

  # ---- submission ----
  def write(self, words) -> list[int]:
    """Write whole packets (a list of uint64 words, one or more packets) and ring the doorbell; returns the ring
    position (words since the start) of each packet. A packet never straddles the end of the ring: a NOP pads to the
    end first. Blocks while the ring is full."""
    if not isinstance(words, list): words = list(words)
    total, ring_words, sizes, i = len(words), self.ring_words, [], 0
    if total and int(words[0]) >> 16 == total <= ring_words: sizes, i = [total], total   # one packet (bound queues)
    while i < total:
      n = int(words[i]) >> 16
      if n == 0: raise ValueError(f"packet at word {i} has nwords=0 (header 0x{int(words[i]):x})")
      if i + n > total: raise ValueError(f"packet at word {i} needs {n} words, only {total - i} given")
      if n > ring_words: raise ValueError(f"packet of {n} words does not fit the ring of {ring_words} words")
      sizes.append(n)
      i += n
    ctl = self._ctl
    with self._lock:
      if ctl.fault or ctl.stop or self.stopped: self._check()
      wptr = self._wptr
      at = wptr & (ring_words - 1)
      if at + total <= ring_words and wptr + total - ctl.rptr <= ring_words:
        words_struct(total).pack_into(self._memory, elf.PAGE + 8 * at, *words)  # common case: no wrap, room for all
        self._wptr = wptr + total
        starts = [wptr]
        for n in sizes[:-1]: starts.append(starts[-1] + n)
      else:
        starts = self._write_slow(words, sizes)
      w = self._w
      w.host_doorbell(ctl, self._wptr, w.libc)
    return starts

  def _write_slow(self, words: list, sizes: list[int]) -> None:
    """Packet by packet: NOP padding at the end of the ring, waits for room (publishing what is written first)."""
    i, starts = 0, []
    for n in sizes:
      room = self.ring_words - (self._wptr & (self.ring_words - 1))
      if room < n:
        self._reserve(room)
        self._put(nop(room))
      self._reserve(n)
      starts.append(self._wptr)
      self._put(words[i:i + n])
      i += n
    return starts

  def _reserve(self, nwords: int) -> None:
    """Wait until nwords more fit in the ring."""
    if self._wptr + nwords - self._ctl.rptr > self.ring_words:
      self._w.host_doorbell(self._ctl, self._wptr, self._w.libc)
      self._wait_rptr(self._wptr + nwords - self.ring_words, timeout=None)

  def _put(self, words: list) -> None:
    at = self._wptr & (self.ring_words - 1)
    self._ring[at:at + len(words)] = words
    self._wptr += len(words)

  # ---- waiting ----
  def _wait_rptr(self, target: int, timeout: float | None) -> None:
    if not self._thread.is_alive(): self._check_thread()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1e9))
      result = self._w.host_wait_rptr(self._ctl, target, left, HOST_SPIN_NS, self._w.libc)
      if result == WAIT_DONE: return
      self._check()
      if result == WAIT_TIMEOUT:
        raise TimeoutError(f"CPU command processor: rptr={self.rptr} did not reach {target} within {timeout} s "
                           f"(wptr={self.wptr}, executing the packet at ring position {self._ctl.last_header_rptr}, "
                           f"header 0x{int(self._ring[self._ctl.last_header_rptr & (self.ring_words - 1)]):x})")

  def wait_idle(self, timeout: float = 10.0) -> None:
    """Block until every written packet has run. Raises ProcessorFault or TimeoutError."""
    self._check()
    self._wait_rptr(self._wptr, timeout)

  def wait_value(self, addr: int, value: int, timeout: float = 10.0, spin_ns: int = HOST_SPIN_NS) -> bool:
    """Block until the uint64 at addr is >= value; False on timeout; ProcessorFault if the worker faults or its
    thread is gone."""
    if not self._thread.is_alive(): self._check_thread()
    result = self._w.host_wait_value(addr, value, int(timeout * 1e9), spin_ns, self._fault_address, self._w.libc)
    if result == WAIT_ABORTED: self._check()
    return result == WAIT_DONE

  def stop(self) -> None:
    """Stop the worker and join its thread (idempotent; also done on garbage collection and at exit)."""
    self._finalizer()

  def abandon(self) -> None:
    """In a forked child: the worker thread is the parent's and does not exist here; forget it without waiting
    for it. The ring stays mapped (this process's private copy, unused from now on)."""
    self._finalizer.detach()
    _leaked.append((self._memory, self._ptr))

  def __enter__(self): return self
  def __exit__(self, *exc): self.stop()
  def __repr__(self): return f"<CommandProcessor ring={self.ring_words} rptr={self.rptr} wptr={self.wptr}{' stopped' if self.stopped else ''}>"
