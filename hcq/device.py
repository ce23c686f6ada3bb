"""The device: driver + allocator + timeline signal + program loader. `Device.get(name)` opens one once."""
from __future__ import annotations
import atexit, os, importlib, mmap, struct, sys, time, weakref
from typing import TYPE_CHECKING
from .allocator import LRUAllocator
if TYPE_CHECKING: from .driver import Driver   # (the protocol, for annotations: its module loads with the drivers)
from .signal import Signal, SignalPool
from .queue import HWQueue, describe as describe_commands
from .lock import RuntimeLock
from . import hooks             # CAPTURE=/PROFILE= (hcq/trace.py installs them)
from baregrad.drivers import settings
from baregrad.drivers.encoded import words_struct
from baregrad.drivers.hostcopy import StagedCopies

# name -> (module, class, what it needs); the module is imported only when the device is opened
DRIVERS = {
  "CPU": ("baregrad.drivers.cpu.driver", "CPUDriver"),
  "AMD": ("baregrad.drivers.amd.driver", "AMDDriver"),   # AMD: /dev/kfd; EMU=1 -> emulated KFD + gfx1100 (drivers/emu/kfd_*.py)
  "NV": ("baregrad.drivers.nv.driver", "NVDriver"),   # NV driver; EMU=1: drivers.kernel.interface("NV") is the emulated RM/UVM
  "METAL": ("baregrad.drivers.metal.driver", "MetalDriver"),   # Metal.framework via objc; EMU=1: drivers/emu/metal_framework.py
}


def canonical(name: str) -> str:
  """The device's name as hcq keys it: the kind in capitals, and ':i' for the i-th device of a kind after the first
  ('amd' -> 'AMD', 'AMD:0' -> 'AMD', 'nv:1' -> 'NV:1')."""
  if not isinstance(name, str):
    raise ValueError(f"device must be a string like 'CPU' or 'AMD:1', got {name!r}")
  base, sep, index = name.upper().partition(":")
  if base not in DRIVERS:
    raise ValueError(f"unknown device {name!r}: available devices are {', '.join(DRIVERS)}")
  if not sep: return base
  if not index.isdigit(): raise ValueError(f"device {name!r}: the index after ':' must be a number, as in {base}:1")
  return base if int(index) == 0 else f"{base}:{int(index)}"


def kind_of(name: str) -> str:
  """'AMD:1' -> 'AMD': the driver (and renderer) a device uses."""
  return canonical(name).partition(":")[0]


# kinds whose every instance is another device on the same machine (CPU:1 is a second command processor over host
# memory). Of a GPU kind, instance i is the i-th GPU; with EMU=1 each instance is an emulated GPU of its own.
HOST_KINDS = {"CPU"}


class Device:
  _open: dict[str, "Device"] = {}
  # The runtime is serialized by this one process-wide lock: taking timeline values, submitting, scheduling and
  # capturing happen under it, so threads may realize tensors and call jitted functions at the same time (they
  # run one at a time). Re-entrant: realize -> run_schedule -> copyout nest.
  lock = RuntimeLock()
  epoch = 0     # moves when a device is closed or dropped (fork): what was loaded on it is stale
  default_timeout = settings.TIMEOUT

  @staticmethod
  def default() -> str: return canonical(settings.DEV)

  @classmethod
  def get(cls, name: str) -> "Device":
    dev = cls._open.get(name) if type(name) is str else None   # keys are canonical: a Buffer's name needs no more
    if dev is not None: return dev
    name = canonical(name)
    dev = cls._open.get(name)
    if dev is None:
      kind = kind_of(name)
      module, what = DRIVERS[kind]
      if module is None: raise RuntimeError(f"device {name} is not available: {what}")
      from baregrad.drivers import kernel as kernel_mod     # (cffi: imported when a device is opened)
      if name != kind and kind not in HOST_KINDS and not kernel_mod.emulated():
        raise RuntimeError(f"device {name}: this build opens only the first {kind} GPU of the machine ({kind}); with "
                           f"EMU=1 every {kind}:i is an emulated GPU of its own")
      driver = getattr(importlib.import_module(module), what)()   # EMU=1: a new emulated kernel driver + GPU each
      dev = cls._open[name] = Device(name, driver)
      _register_exit_hook()
    return dev

  def __init__(self, name: str, driver: Driver):
    self.name, self.driver = name, driver
    self.forked_from: int | None = None      # a device of the parent process, unusable in this forked child
    # the memory of its buffers is the host's and stays usable by the device of that name opened after a close (CPU)
    self.host_memory = name.partition(":")[0] in HOST_KINDS
    self.closed = False                      # close() ran: what still retires here is dropped, its memory is gone
    # memory goes back to the driver only after the work queued before it was freed (see LRUAllocator). A GPU's own
    # memory (a driver whose copies go through staging: drivers/hostcopy.py) keeps up to 16 GiB of freed buffers for
    # reuse (an allocation the GPU has no room for empties the cache and tries again; allocating video memory and
    # mapping it costs ~20 ms per GiB on an H200); host memory (the CPU, Metal's shared storage, the emulated GPUs'
    # memory, which is this process's) keeps 1 GiB
    cached = 16 << 30 if isinstance(driver, StagedCopies) and not driver.emulated else 1 << 30
    self.allocator = LRUAllocator(driver, cached, release=lambda mem: self.retire(mem, self.free_memory),
                                  synchronize=self.synchronize, free=self.free_memory)
    self.signal_pool = SignalPool(driver)
    self.shared_pools: dict[tuple, SignalPool] = {}    # other devices -> signals in memory they map too
    self.timeline = Signal(self, "timeline")
    self.timeline_value = 0
    self.timeline_submitted = 0   # the timeline values taken so far that went to the device (HWQueue.submit)
    self.last_submitted: tuple | None = None   # (queue kind, its last commands): see last_command
    self.kernargs = KernargArena(self)
    self._retired: list[tuple[int, object, object]] = []   # (timeline value, object, release fn) kept until done
    # ---- work of other devices on this device's memory (hcq/transfer.py: copies between devices) ----
    self.last_kind: str | None = None      # the kind of queue submitted to last (the next of another kind waits for it)
    # (signal, value) another device's queue (or the host relay) writes once it is done with this device's memory (a
    # copy reading or writing it): this device's next submission waits for each, and so does synchronize()
    self.pending_waits: list[tuple[Signal, int]] = []
    self.peer_maps: dict[tuple[str, int], tuple[object, int]] = {}   # (owner, address) -> (handle, bytes) mapped here
    self.exported: dict[int, list] = {}    # address of an allocation of ours -> the devices that mapped it (map_peer)

  def dump_queues(self) -> str:
    """Every queue of this device decoded from its read pointer to its write pointer (the driver's `dump_queues`),
    under a line naming the device: for a person looking at a hang, or a report."""
    return f"{self.name} queues:\n" + self.driver.dump_queues()

  REPORT_LINES = 120         # lines of the decoded queues an error's note shows (the whole dump: `error.queues`)

  def queues_report(self) -> str:
    """dump_queues(), or why there is none (a report must not fail on a device too broken to read)."""
    try: return self.dump_queues()
    except Exception as e: return f"{self.name} queues: cannot be decoded ({type(e).__name__}: {e})"

  def hang_report(self, error: BaseException, queues: str) -> None:
    """Attach the decoded queues to a timeout or fault `error` (`error.queues`, and a note shown with it); with
    HANG_REPORT set, append the error and the queues to that file."""
    error.queues = queues
    lines = queues.splitlines()
    shown = "\n".join(lines[:self.REPORT_LINES]) + (f"\n... {len(lines) - self.REPORT_LINES} more lines (error.queues)"
                                                    if len(lines) > self.REPORT_LINES else "")
    error.add_note("the device's queues when it stopped, decoded from their read pointers:\n" + shown)
    if (path := settings.HANG_REPORT):
      try:
        with open(path, "a") as f:
          f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {type(error).__name__}: {error}\n"
                  f"{queues}\n\n")
        error.add_note(f"(written to {path})")
      except OSError as e: error.add_note(f"(HANG_REPORT: cannot write {path}: {e.strerror})")

  @property
  def last_command(self) -> str | None:
    """What was submitted last, in words (hang and fault reports): its queue and that queue's last commands."""
    if self.last_submitted is None: return None
    kind, cmds = self.last_submitted
    return f"{kind} queue: {describe_commands(cmds)}"

  def retire(self, obj, release=None):
    """Keep `obj` (a program's code) alive until the work queued so far has finished, then drop it and call
    release(obj). Programs retire themselves when their last reference goes."""
    if self.closed: return                   # (a program or buffer outliving its closed device: nothing to give back)
    self._retired.append((self.timeline_value, obj, release))
    if len(self._retired) > 64: self._reap()

  def _reap(self):
    done = self.timeline.value
    keep, free = [], []
    for item in self._retired: (keep if item[0] > done else free).append(item)
    self._retired = keep
    for _, obj, release in free:
      if release is not None: release(obj)

  def close(self):
    """Release the device: finish its work, give cached memory back, close the driver (queues, threads, file
    descriptors). Buffers still alive keep their memory until they go; the device must not be used after."""
    try: self.synchronize()
    except Exception: pass                     # a faulted device still closes (its queues no longer run)
    retired, self._retired = self._retired, []
    for _, obj, release in retired:
      if release is not None:
        try: release(obj)
        except Exception: pass
    self.allocator.free_cache(wait=False)
    if Device._open.get(self.name) is self: del Device._open[self.name]
    Device.epoch += 1
    self.closed = True
    self.driver.close()

  def compute_queue(self) -> HWQueue: return HWQueue("compute")
  def copy_queue(self) -> HWQueue: return HWQueue("copy")

  def queue(self, kind: str = "compute") -> HWQueue:
    """A queue of `kind` whose commands start after everything submitted to this device so far: after the other
    queue's last submission (queues of two kinds run side by side) and after other devices' work on this device's
    memory (`pending_waits`). Submit it with `submit` (it signals the timeline)."""
    q = HWQueue(kind)
    if self._after_other_kind(kind): q.wait(self.timeline, self.timeline_value)
    if self.pending_waits:
      for sig, value in self.pending_waits: q.wait(sig, value)
      self.pending_waits.clear()
    return q

  def _after_other_kind(self, kind: str) -> bool: return self.last_kind is not None and self.last_kind != kind

  def must_order(self, kind: str) -> bool:
    """Whether queue(kind) would hold waits (for the other kind's last submission, or other devices' work): a
    prebuilt queue submitted on its own needs them submitted first."""
    return self._after_other_kind(kind) or bool(self.pending_waits)

  def submit(self, q: HWQueue) -> int:
    """Signal the next timeline value at the end of `q` and submit it; returns that value."""
    value = self.next_timeline()
    q.signal(self.timeline, value).submit(self)
    self.last_kind = q.kind
    return value

  def next_timeline(self) -> int:
    self.timeline_value += 1
    return self.timeline_value

  def synchronize(self, timeout: float | None = None):
    if hooks.active: hooks.installed.on_synchronize(self, timeout)   # CAPTURE/PROFILE: the same wait, timed
    else: self.timeline.wait(self.timeline_value, timeout)
    self.check_faults()
    for sig, value in self.pending_waits: sig.wait(value, timeout)
    self.pending_waits.clear()
    if self._retired: self._reap()

  def check_faults(self):
    try:
      self.driver.check_faults(self.name)
    except Exception as e:
      # the driver reset its queues: the work they dropped never signals, so the timeline moves past it
      if getattr(e, "queues_reset", False): self.timeline.value = self.timeline_value
      raise

  # ---- memory that queues of several devices address: cross-device signals and buffers ----
  def map_host(self, addr: int, nbytes: int):
    """Let this device's queues address host memory the process already has, at its host address (the pages around
    it): the driver's `map_host` (CPU: its command processor's address table; AMD: a userptr BO; NV: an RM OS
    descriptor mapped by UVM). A driver whose device cannot (NotImplementedError, or OSError when the kernel refuses
    those pages) leaves the caller another path (hcq/transfer.py)."""
    page = mmap.PAGESIZE
    start = addr // page * page
    return self.driver.map_host(start, (addr + nbytes - start + page - 1) // page * page)

  def alloc_shared(self, nbytes: int, others):
    """`nbytes` of this device's memory that the queues of `others` address too, at the same address (a signal one
    device waits on and another writes, a buffer several copy through): the driver's memory for what the host polls
    (`alloc_polled`: host memory, such as NV's pinned pages, that the others can map with map_host; a GPU's video
    memory is neither fast to poll nor pages another device can pin)."""
    mem = self.driver.alloc_polled(nbytes)
    try:
      for d in dict.fromkeys(others):
        if d is not self: d.map_host(mem.addr, nbytes)
    except BaseException:
      self.driver.free(mem)         # (a mapping made before the one that failed stays until its device closes)
      raise
    return mem

  def map_peer(self, owner: "Device", mem, nbytes: int):
    """Let this device's queues address `nbytes` of `owner`'s allocation `mem` (a copy between the two devices), at
    its address; the mapping is kept until `owner` gives the allocation back to its driver (free_memory)."""
    key = (owner.name, mem.addr)
    have = self.peer_maps.get(key)
    if have is not None and have[1] >= nbytes: return
    if have is not None: self.unmap_peer(owner, mem.addr)
    handle = self.map_host(mem.addr, nbytes)
    self.peer_maps[key] = (handle, nbytes)
    owner.exported.setdefault(mem.addr, []).append(self)

  def unmap_peer(self, owner: "Device", addr: int):
    """Drop this device's mapping of `owner`'s allocation at `addr`, once the work queued here that uses it is done."""
    handle, _ = self.peer_maps.pop((owner.name, addr), (None, 0))
    lst = owner.exported.get(addr)
    if lst is not None and self in lst: lst.remove(self)
    # (CPU: nothing to free; closed or left behind by a fork: gone with the driver. A device that is open but not the
    # one registered under its name, a private or replaced one, frees its mapping too: a userptr BO left at an address
    # the host frees and hands out again makes the GPU refuse the next allocation there, EINVAL)
    if handle is None or self.closed or self.forked_from is not None: return
    try: self.synchronize()
    except Exception: pass
    self.driver.free(handle)

  def free_memory(self, mem):
    """Give an allocation back to the driver, after the mappings other devices made of it (map_peer) are dropped."""
    for other in list(self.exported.pop(mem.addr, ())): other.unmap_peer(self, mem.addr)
    self.driver.free(mem)

  def shared_signal_pool(self, others) -> SignalPool:
    """Signal slots in memory of this device that `others` map too (Signal(..., shared_with=others))."""
    key = tuple(d for d in dict.fromkeys(others) if d is not self)
    if key not in self.shared_pools:
      self.shared_pools[key] = SignalPool(self.driver, alloc=lambda n: self.alloc_shared(n, key))
    return self.shared_pools[key]

  def copyin(self, buf, mv: memoryview):
    with Device.lock:
      self.synchronize()
      if hooks.active: hooks.installed.on_copyin(self, buf, mv)   # CAPTURE: records the host write
      self.driver.copyin(buf.addr, mv)            # by the path that is fast for where the memory lives

  def copyout(self, out: memoryview, buf):
    with Device.lock:
      self.synchronize()
      mv = memoryview(out).cast("B")
      if mv.nbytes != buf.nbytes: raise ValueError(f"copyout of a {buf.nbytes}-byte buffer into {mv.nbytes} bytes")
      self.driver.copyout(mv, buf.addr)

  def __repr__(self): return f"<Device {self.name}>"


def device_ns(dev: Device, ticks: int) -> int:
  """A queue timestamp in nanoseconds (the driver's `timestamp_hz` says how fast its clock ticks)."""
  hz = dev.driver.timestamp_hz
  return ticks if hz == 1_000_000_000 else ticks * 1_000_000_000 // int(hz)


class KernargArena:
  """Kernel arguments (one 64-bit word each) live in device memory; a bump allocator that waits for the
  device before it wraps around."""

  def __init__(self, dev: Device, size: int = 1 << 20):
    self.dev, self.size = dev, size
    self.mem = dev.driver.alloc_args(size)
    self.view = dev.driver.view(self.mem.addr, size)
    self.offset = 0

  def put(self, words: list[int]) -> int:
    n = 8 * max(len(words), 1)
    if self.offset + n > self.size:
      self.dev.synchronize()
      self.offset = 0
    addr = self.mem.addr + self.offset
    if words:
      pack = words_struct(len(words)).pack_into
      try: pack(self.view, self.offset, *words)
      except struct.error: pack(self.view, self.offset, *[w & 0xFFFF_FFFF_FFFF_FFFF for w in words])   # negative
    self.offset += (n + 63) // 64 * 64
    return addr



# ---- interpreter exit: queued work finishes before anything it uses is released ----
_exit_hook_registered = False


def _register_exit_hook():
  """atexit runs hooks last registered first. weakref.finalize registers its own hook (which runs the finalizers of
  objects still alive: a CPU command processor's shutdown among them) when its first finalizer is made; making
  one here first puts `finish_queued_work` ahead of it, so queued work finishes while its queues still run."""
  global _exit_hook_registered
  if _exit_hook_registered: return
  weakref.finalize(Device, int).atexit = False
  atexit.register(finish_queued_work)
  _exit_hook_registered = True


def finish_queued_work(timeout: float | None = None):
  """Wait for the work queued on every open device (at interpreter exit: a script may end right after queuing
  kernels). A device whose work does not finish within `timeout` (TIMEOUT) is reported and left as it is; the
  memory its queues use is not released at exit either (buffers and programs are not freed at exit)."""
  for dev in list(Device._open.values()):
    try: dev.synchronize(timeout)
    except Exception as e:
      print(f"baregrad: at exit, {dev.name} did not finish its queued work: {type(e).__name__}: {e}", file=sys.stderr)


# ---- fork(): the parent keeps its devices; the child continues on the CPU and opens GPUs anew ----
def _before_fork():
  """No work in flight at the fork, and no other thread in the middle of a submission (the lock is held across
  the fork): the child's copy of every buffer is what the queued work left in it."""
  Device.lock.acquire()
  for dev in list(Device._open.values()):
    try: dev.synchronize()
    except Exception: pass     # the parent sees the error on its next synchronize


def _after_fork_in_parent(): Device.lock.release()


def _after_fork_in_child():
  Device.lock = RuntimeLock()        # the parent's is held by the forking thread's parent copy
  parent = os.getppid()
  for name, dev in list(Device._open.items()):
    try: usable = dev.driver.after_fork_in_child()
    except Exception as e:
      usable = False
      print(f"baregrad: {name} could not continue in the forked child: {type(e).__name__}: {e}", file=sys.stderr)
    if not usable:
      dev.forked_from = parent     # its buffers refuse to be used (Buffer.addr); Device.get opens a new device
      del Device._open[name]
      Device.epoch += 1


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


# ---- probe: what `baregrad info` shows about a device kind, without opening it ----
def probe(name: str) -> dict:
  """{"name", "available": bool, "reason" (when not), "driver", properties...}; never raises. What the driver class's
  `probe()` says ({"available": ..., "reason": ..., properties...})."""
  try:
    module, what = DRIVERS[kind_of(name)]
    if module is None: return {"name": name, "available": False, "reason": what}
    cls = getattr(importlib.import_module(module), what)
    found = cls.probe()
    return {"name": name, "driver": f"{module}.{what}", **found}
  except Exception as e:
    return {"name": name, "available": False, "reason": f"{type(e).__name__}: {e}"}
