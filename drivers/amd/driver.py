"""The AMD driver: KFD (/dev/kfd) memory, a PM4 compute queue and an SDMA copy queue, built in user space.

Nothing of ROCm/HSA is used: the driver talks to amdkfd through the kernel interface (drivers/kernel.py; with
EMU=1 the emulated KFD + gfx1100 of drivers/emu/kfd_*.py serves the same calls) and writes the packets itself.

    open /dev/kfd, GET_VERSION, topology (sysfs) -> GPU node, open its render node, ACQUIRE_VM, RUNTIME_ENABLE
    memory:  reserve VA (anonymous PROT_NONE mmap) -> ALLOC_MEMORY_OF_GPU(va) -> mmap(render node, mmap_offset,
             MAP_FIXED at va) -> MAP_MEMORY_TO_GPU       (GPU VA = CPU VA)
    queues:  CREATE_QUEUE(ring, rptr/wptr page, EOP buffer, context-save area sized from the topology) -> mmap the
             doorbell page of /dev/kfd
    signals: RELEASE_MEM / SDMA FENCE (uncached) write the value, then the event's slot in the event page (a GTT BO
             handed to amdkfd with the first CREATE_EVENT); then the interrupt (RELEASE_MEM INT_SEL, SDMA TRAP) signals
             the KFD event that `wait_value` sleeps on (WAIT_EVENTS) after polling with back-off.
    HDP:     every submission starts with an HDP flush, so what the host wrote to VRAM (kernel arguments, code, signals,
             buffers) has left the host data path before a packet of it reads VRAM.

hcq hands the driver a generic command list; `encode` turns it into PM4 (kind "compute") or SDMA (kind "copy")
packets, with the dwords that hold symbolic values located by the packet tables (drivers/encoded.py), and
`submit` writes them into the ring. Bound queues (JIT replay) live in GPU memory and are started by one
INDIRECT_BUFFER / SDMA INDIRECT packet.
"""
from __future__ import annotations
import os, time, weakref
from dataclasses import dataclass
import cffi
import numpy as np

from .. import kernel as kernel_mod, settings
from ..encoded import Encoded, Encoder, lo32, hi32
from ..hostcopy import StagedCopies
from ..allochistory import AllocationHistory
from ..markers import Marker, TraceMarkers, describe, launch_args
from . import kfd, pm4, sdma
from .codeobj import RSRC1_PRIV
from .kfd import ffi as kfd_ffi
from .ring import Ring
from .topology import gpu_nodes, pick_node, GPUNode, PAGE

# EMU=1: the emulated KFD + gfx1100 serves /dev/kfd (registered here so drivers/kernel.py needs no AMD knowledge)
kernel_mod.EMULATORS.setdefault("AMD", ("baregrad.drivers.emu.kfd_kernel", "EmulatedKFD"))

_ffi = cffi.FFI()
_ffi.cdef("int munmap(void *addr, size_t length);")
_libc = _ffi.dlopen(None)
# resolved once here: _unmap_all runs as a GC finalizer, which may fire while this thread is inside another cffi type
# parse, and cffi's parser lock is not reentrant (a string type parsed there deadlocked a test worker)
_VOID_P = _ffi.typeof("void *")
PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
DOORBELL_PAGE = 8192            # 1024 64-bit doorbells per process on gfx9+ (libhsakmt's doorbell mapping size)
TIMESTAMP_HZ = 100_000_000      # gfx11 GPU clock counter (RELEASE_MEM DATA_SEL 3, SDMA TIMESTAMP): 100 MHz
KFD_MIN_RUNTIME_ENABLE = (1, 14)
TARGETS = ("gfx1100",)          # what compiler/render_amd.py assembles for (codeobj.py writes the code object's target)
LDS_GRANULE = 512               # COMPUTE_PGM_RSRC2.LDS_SIZE unit on gfx7..gfx11 (128 dwords)
RSRC2_LDS_SHIFT, RSRC2_LDS_BITS = 15, 9
# SDMA FENCE MTYPE 3, uncached: sdma_v6_0_ring_emit_fence (amdgpu/sdma_v6_0.c) writes every fence with
# SDMA_PKT_FENCE_HEADER_MTYPE(0x3) /* Ucached(UC) */; another MTYPE can leave the value in the GPU's L2, where the
# host does not see it
SDMA_MTYPE_UC = 3
# kfd_events.c: each signal event has a 64-bit slot in the event page; "the signaler will write a 1 before sending an
# interrupt", and the interrupt handler ignores an event whose slot still reads UNSIGNALED_EVENT_SLOT (all ones)
EVENT_SLOT_SIGNALED = 1
# A queue whose read pointer stands this long at the start of a packet the engine cannot decode has stopped there:
# a CP bad opcode suspends the queue without telling the process (kfd_dqm_suspend_bad_queue_mes) and SDMA's
# illegal-instruction interrupt stays in amdgpu (sdma_v6_0_process_illegal_inst_irq), so no event ever comes
BAD_PACKET_AFTER_S = 0.5
ERROR_PAYLOAD_OFFSET = 64       # where in a queue's read/write-pointer page the kernel ORs its error codes


class AMDError(RuntimeError):
  pass


class GPUFault(AMDError):
  pass


class QueueReset(GPUFault):
  """A queue stopped on a hardware exception; the driver recreated the queues, so the device is usable again."""
  queues_reset = True


class QueueTimeout(TimeoutError):
  pass


@dataclass(eq=False)
class Memory:
  addr: int
  nbytes: int
  size: int           # bytes mapped (page multiple)
  handle: int
  domain: str


@dataclass(eq=False)
class LoadedProgram:
  name: str
  memory: Memory
  pgm_addr: int
  rsrc1: int
  rsrc2: int
  rsrc3: int
  user_sgprs: int
  lds_bytes: int
  wave32: bool




@dataclass(eq=False)
class BoundQueue:
  kind: str
  memory: Memory
  words: np.ndarray                   # the packets in GPU memory (uint32 view); hcq patches words by index
  ndwords: int
  label: str = "a bound queue"        # what it runs, for fault reports


_kernels: dict = {}          # (pid, emulated) -> the kernel interfaces this process opened
_kernels_in_use: set = set()  # ids of those an open AMDDriver holds


def _packets(ring: Ring):
  """The packet table (encode/decode/describe) of a ring's engine: SDMA for the copy queue, PM4 for compute."""
  return sdma if ring.kind == "copy" else pm4


def _process_kernel():
  """The kernel interface for a new AMDDriver: the process's own (amdkfd keeps per-process state across device opens,
  KFDProcess), a new one in a forked child. With EMU=1 each emulated kernel is one emulated GPU: a driver takes one no
  open driver holds (AMD:1 beside AMD is a second GPU), and a device opened again after a close gets it back."""
  key = (os.getpid(), kernel_mod.emulated())
  have = _kernels.setdefault(key, [])
  if not key[1]:
    if not have: have.append(kernel_mod.interface("AMD"))
    return have[0]
  for k in have:
    if id(k) not in _kernels_in_use: break
  else:
    k = kernel_mod.interface("AMD")
    have.append(k)
  _kernels_in_use.add(id(k))
  return k


def _unmap_all(mappings: list):
  for addr, size in mappings: _libc.munmap(_ffi.cast(_VOID_P, addr), size)
  mappings.clear()


class KFDProcess:
  """What amdkfd keeps per process, opened once and kept until the process ends: /dev/kfd, the render node bound by
  ACQUIRE_VM, the runtime state, the event page with its signal event, the doorbell page mapping.

  amdkfd has one kfd_process per process (per mm, not per open file), "freed when the mm is released"
  (kfd_process.c create_process); closing /dev/kfd only drops a reference (kfd_release). A second ACQUIRE_VM with
  another render-node file fails with EBUSY, a second event page with EINVAL ("Event page is already set",
  kfd_kmap_event_page), a second RUNTIME_ENABLE with EBUSY -- so a device closed and opened again in one process
  must reuse all of these (libhsakmt likewise never closes its /dev/kfd, openclose.c). `AMDDriver.close` destroys
  only its queues, events and buffers."""
  _open = weakref.WeakKeyDictionary()   # kernel interface -> KFDProcess (a forked child's pid differs: a new one)

  @classmethod
  def get(cls, kernel, node: GPUNode, ioctl) -> "KFDProcess":
    proc = cls._open.get(kernel)
    if proc is None or proc.pid != os.getpid():
      proc = cls._open[kernel] = cls(kernel, ioctl)
      # the host mappings it keeps (event page, doorbells) go when the interface goes (an emulated KFD a test made);
      # the process's own interface lives as long as the process
      weakref.finalize(kernel, _unmap_all, proc.mappings)
    proc.bind(kernel, node, ioctl)
    return proc

  def __init__(self, kernel, ioctl):
    # (no reference to `kernel`: the table above holds it weakly, so an interface nobody uses any more -- an emulated
    # KFD a test made -- goes away with its state, as a process's kfd_process does)
    self.pid = os.getpid()
    self.kfd_fd = kernel.open("/dev/kfd")
    ver = ioctl("GET_VERSION", fd=self.kfd_fd)
    self.version = (ver.major_version, ver.minor_version)
    self.drm_fds: dict[int, int] = {}          # gpu_id -> the render-node fd ACQUIRE_VM bound
    self.runtime_enabled = False
    self.event_page: Memory | None = None      # allocated by the first driver (its alloc), never freed
    self.queue_event = self.queue_event_slot = None
    self.doorbells: dict[int, tuple[int, int]] = {}   # gpu_id -> (mapping address, mmap offset)
    self.mappings: list[tuple[int, int]] = []         # (address, bytes) of host mappings kept for the process

  def bind(self, kernel, node: GPUNode, ioctl):
    if node.gpu_id not in self.drm_fds:
      fd = kernel.open(node.render_node)
      ioctl("ACQUIRE_VM", fd=self.kfd_fd, drm_fd=fd, gpu_id=node.gpu_id)
      self.drm_fds[node.gpu_id] = fd
    if self.version >= KFD_MIN_RUNTIME_ENABLE and not self.runtime_enabled:
      ioctl("RUNTIME_ENABLE", fd=self.kfd_fd, r_debug=0, mode_mask=kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK)
      self.runtime_enabled = True


class AMDDriver(StagedCopies, TraceMarkers):     # copyin/copyout of VRAM through SDMA and GTT staging
  word_log = None         # CAPTURE: a drivers/decode.py WordLog of what the rings get
  name = "AMD"
  timestamp_hz = TIMESTAMP_HZ
  has_copy_queue = True    # an SDMA queue beside the PM4 compute queue (hcq graphs put copies there)

  def __init__(self, kernel=None, timeout: float = 30.0):
    if kernel is None:
      if not kernel_mod.emulated() and not os.path.exists("/dev/kfd"):
        raise AMDError("DEV=AMD: /dev/kfd does not exist on this machine (no amdgpu kernel driver with KFD, or no AMD GPU). "
                       "Run with EMU=1 DEV=AMD to use the emulated gfx1100, or use DEV=CPU.")
      kernel = _process_kernel()
    self.kernel, self.timeout = kernel, timeout
    nodes = gpu_nodes(kernel)
    if not nodes: raise AMDError("AMD: KFD topology lists no GPU node (/sys/devices/virtual/kfd/kfd/topology/nodes/*/gpu_id)")
    try: self.node: GPUNode = pick_node(nodes, TARGETS)
    except ValueError as e: raise AMDError(f"AMD: {e}. Use DEV=CPU, or EMU=1 DEV=AMD for the emulated gfx1100.") from None
    self.gpu_id = self.node.gpu_id
    self.target = self.node.target     # gfx1100: what the programs are assembled for
    self.large_bar = self.node.large_bar
    self.process = KFDProcess.get(kernel, self.node, self._ioctl)
    self.kfd_fd, self.drm_fd, self.version = self.process.kfd_fd, self.process.drm_fds[self.gpu_id], self.process.version
    self.memory: dict[int, Memory] = {}
    # what was allocated and freed, bounded, so a fault address can be named: live, freed (when), or never mapped
    self.history = AllocationHistory()        # for naming fault addresses
    self.fault: str | None = None
    self.fault_fatal = False       # memory faults are; a queue error resets the queues instead
    self._stalled = False
    # events: one signal event for queue interrupts (process-wide, with the event page), the exception events faults
    # arrive on, and the queue-error event the compute queue's context-save-area header names. A dGPU's event page is
    # memory user mode allocates and hands to amdkfd (its handle in event_page_offset) with the first CREATE_EVENT
    # (kfd_ioctl_create_event -> kfd_kmap_event_page, amdkfd/kfd_chardev.c + kfd_events.c); the GPU writes an event's
    # slot there before it interrupts. amdkfd maps it through amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel (a GTT BO) and
    # refuses to free it (kfd_ioctl_free_memory_of_gpu: -EPERM): it lives as long as the process.
    proc = self.process
    if proc.event_page is None:
      page = self.alloc(kfd.SIGNAL_EVENT_LIMIT * 8, "gtt")
      del self.memory[page.addr]
      event = self._ioctl("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1, event_page_offset=page.handle)
      proc.event_page, proc.queue_event = page, event.event_id
      proc.mappings.append((page.addr, page.size))
      proc.queue_event_slot = page.addr + 8 * event.event_slot_index
    self.event_page, self.queue_event, self.queue_event_slot = proc.event_page, proc.queue_event, proc.queue_event_slot
    self.memory_event = self._ioctl("CREATE_EVENT", event_type=kfd.EVENT_MEMORY, auto_reset=0,
                                    node_id=self.node.index).event_id
    self.hw_event = self._ioctl("CREATE_EVENT", event_type=kfd.EVENT_HW_EXCEPTION, auto_reset=0,
                                node_id=self.node.index).event_id
    self.error_event = self._new_error_event()
    self.doorbells = proc.doorbells.get(self.gpu_id)
    self.compute = self._create_queue("compute", kfd.QUEUE_TYPE_COMPUTE, 1 << 18)
    self.copy = self._create_queue("copy", kfd.QUEUE_TYPE_SDMA, 1 << 18)
    self.queue_types = {"compute": kfd.QUEUE_TYPE_COMPUTE, "copy": kfd.QUEUE_TYPE_SDMA}
    self.programs: dict[int, LoadedProgram] = {}
    self._stage = None             # GTT staging buffer + signal of copyin/copyout, made on first use
    # trace markers (settings.QUEUE_MARKERS): after each command a queue writes that command's sequence number into
    # its slot here (RELEASE_MEM / SDMA FENCE, uncached system memory the host reads); `_marks` remembers what each
    # number was, so a stopped or hung queue's report names the last command done and the first one not done
    self.marker_page = self.alloc_polled(PAGE)
    self._init_markers(settings.QUEUE_MARKERS, {"compute": self.marker_page.addr, "copy": self.marker_page.addr + 8})

  def _new_error_event(self) -> int:
    """The signal event amdkfd sets when a compute queue stops on an error (its id goes into the queue's context-save
    header, `_fill_cwsr_header`); not auto-reset: it stays set until the queues are recreated."""
    return self._ioctl("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=0).event_id

  # ---- ioctls ----
  def _ioctl(self, name: str, fd: int | None = None, **fields):
    args = kfd.new_args(name, **fields)
    self.kernel.ioctl(self.kfd_fd if fd is None else fd, kfd.REQUEST[name], args, name=f"AMDKFD_IOC_{name}",
                      fields=lambda: kfd.fields(args))
    return args

  # ---- memory ----
  def alloc(self, nbytes: int, domain: str = "vram", executable: bool = True) -> Memory:
    """`nbytes` the queues address at the same address the host maps them (hcq's memory: tensors, code, kernel
    arguments, signals). domain "vram": VRAM the host maps (PUBLIC) -- on a machine without a large BAR, where
    amdkfd refuses that, GTT instead; "gtt": system memory; "device": VRAM only the GPU touches (no PUBLIC, no host
    mapping: the EOP buffer). Every allocation is executable, as the references allocate queue memory (kfdtest
    `isExec` buffers, ROCr AllocateExecutable, libhsakmt allocate_exec_aligned_memory): rings and indirect buffers
    are fetched from it."""
    if domain == "vram" and not self.large_bar: domain = "gtt"
    size = max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)
    k = self.kernel
    va = k.mmap(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)     # reserve the GPU VA
    flags = kfd.ALLOC_WRITABLE | kfd.ALLOC_NO_SUBSTITUTE | (kfd.ALLOC_EXECUTABLE if executable else 0)
    flags |= {"vram": kfd.ALLOC_VRAM | kfd.ALLOC_PUBLIC, "device": kfd.ALLOC_VRAM,
              "gtt": kfd.ALLOC_GTT | kfd.ALLOC_COHERENT | kfd.ALLOC_UNCACHED}[domain]
    try:
      args = self._ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=size, gpu_id=self.gpu_id, flags=flags)
    except OSError as e:
      k.munmap(va, size)
      if e.errno == 12: raise MemoryError(f"AMD: out of {domain.upper()} allocating {size} bytes") from None
      if e.errno == 22 and domain == "vram":
        raise AMDError(f"AMD: the kernel refused host-visible VRAM ({size} bytes at {va:#x}, KFD_IOC_ALLOC_MEM_FLAGS_"
                       f"PUBLIC, EINVAL): amdkfd allows it only when the whole VRAM is CPU-visible (kfd_ioctl_alloc_"
                       f"memory_of_gpu: \"Alloc host visible vram on small bar is not allowed\"). Enable Resizable BAR "
                       f"(\"Re-Size BAR Support\" and \"Above 4G Decoding\" in the firmware setup). Where it is on, "
                       f"EINVAL means that GPU address range is taken (a buffer of this process still mapped there): "
                       f"the kernel log names the reason") from None
      raise
    if domain != "device":       # device-only VRAM keeps its PROT_NONE reservation: the host never maps it
      off = args.mmap_offset
      k.mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.drm_fd, off - (1 << 64) if off >> 63 else off)
    ids = kfd_ffi.new("uint32_t[1]", [self.gpu_id])
    self._ioctl("MAP_MEMORY_TO_GPU", handle=args.handle, device_ids_array_ptr=int(kfd_ffi.cast("uintptr_t", ids)), n_devices=1)
    mem = Memory(va, nbytes, size, args.handle, domain)
    self.memory[va] = mem
    self.history.alloc(va, size, domain)
    return mem

  def map_host(self, addr: int, nbytes: int) -> Memory:
    """Let the queues address host memory another device allocated (page-aligned), at its own address: a userptr BO."""
    return self.alloc_userptr(addr, nbytes)

  def alloc_userptr(self, addr: int, nbytes: int) -> Memory:
    """Map existing page-aligned host memory for the GPU at its own address."""
    if addr % PAGE or nbytes % PAGE: raise ValueError(f"userptr {addr:#x}+{nbytes:#x} must be page aligned")
    args = self._ioctl("ALLOC_MEMORY_OF_GPU", va_addr=addr, size=nbytes, mmap_offset=addr, gpu_id=self.gpu_id,
                       flags=kfd.ALLOC_USERPTR | kfd.ALLOC_WRITABLE | kfd.ALLOC_COHERENT)
    ids = kfd_ffi.new("uint32_t[1]", [self.gpu_id])
    self._ioctl("MAP_MEMORY_TO_GPU", handle=args.handle, device_ids_array_ptr=int(kfd_ffi.cast("uintptr_t", ids)), n_devices=1)
    mem = Memory(addr, nbytes, nbytes, args.handle, "userptr")
    self.memory[addr] = mem
    return mem

  @property
  def emulated(self) -> bool:
    """Whether the KFD and GPU are the emulated ones (EMU=1)."""
    return bool(self.kernel.emulated)

  def alloc_args(self, nbytes: int):
    """Kernel arguments: memory like any other (hcq/driver.py)."""
    return self.alloc(nbytes)

  def alloc_polled(self, nbytes: int):
    """Memory the host polls (signals): see hcq/driver.py."""
    return self.alloc(nbytes, "gtt")         # GTT: host reads of VRAM cross the BAR uncached

  def free(self, mem: Memory):
    if self.memory.pop(mem.addr, None) is None: return
    self.history.free(mem.addr, mem.size, mem.domain)
    ids = kfd_ffi.new("uint32_t[1]", [self.gpu_id])
    self._ioctl("UNMAP_MEMORY_FROM_GPU", handle=mem.handle, device_ids_array_ptr=int(kfd_ffi.cast("uintptr_t", ids)), n_devices=1)
    self._ioctl("FREE_MEMORY_OF_GPU", handle=mem.handle)
    if mem.domain != "userptr": self.kernel.munmap(mem.addr, mem.size)

  def view(self, addr: int, nbytes: int):
    return _ffi.buffer(_ffi.cast("char *", addr), nbytes)

  # ---- host <-> device copies: VRAM through the SDMA queue and GTT staging, system memory by the CPU ----
  # copyin/copyout: drivers/hostcopy.py StagedCopies (smaller copies of VRAM go through the BAR: a packet round trip
  # costs more; larger reads never cross it uncached)
  def _staging_memory(self):
    return [self.alloc(self.STAGING, "gtt"), self.alloc(self.STAGING, "gtt")], self.alloc(PAGE, "gtt")

  def _in_device(self, addr: int, nbytes: int) -> bool:
    """Whether [addr, addr + nbytes) lies in host-visible VRAM this driver allocated (reads of it cross the BAR
    uncached, tens of MB/s; writes are write-combined)."""
    for mem in self.memory.values():
      if mem.addr <= addr and addr + nbytes <= mem.addr + mem.size: return mem.domain == "vram"
    return False

  def _staged_copy_failed(self, what: str) -> Exception:
    return QueueTimeout(f"{self.name}: SDMA {what} did not finish in {self.timeout} s")

  # ---- queues ----
  def _create_queue(self, kind: str, queue_type: int, ring_size: int) -> Ring:
    ring = self.alloc(ring_size, "gtt")
    rw = self.alloc(PAGE, "gtt")        # rptr at +0, wptr at +8 (one page BO, as KFD checks); error payload at +64
    extra, memories = {}, [ring, rw]
    if queue_type == kfd.QUEUE_TYPE_COMPUTE:
      # the EOP buffer only the CP touches: device VRAM, not host-visible (libhsakmt allocates it in VRAM); the
      # context-save area in system memory, whose header the host fills and amdkfd reads with get_user (libhsakmt
      # "Allocating GTT for CWSR", queues.c handle_concrete_asic)
      eop = self.alloc(self.node.eop_buffer_size, "device")
      cwsr = self.alloc(self.node.cwsr_total, "gtt")
      self._fill_cwsr_header(cwsr, rw.addr + ERROR_PAYLOAD_OFFSET)
      memories += [eop, cwsr]
      extra = dict(eop_buffer_address=eop.addr, eop_buffer_size=eop.size, ctx_save_restore_address=cwsr.addr,
                   ctx_save_restore_size=self.node.cwsr_size, ctl_stack_size=self.node.ctl_stack_size)
    args = self._ioctl("CREATE_QUEUE", ring_base_address=ring.addr, ring_size=ring_size, gpu_id=self.gpu_id,
                       queue_type=queue_type, queue_percentage=kfd.MAX_QUEUE_PERCENTAGE, queue_priority=7,
                       read_pointer_address=rw.addr, write_pointer_address=rw.addr + 8, **extra)
    if self.doorbells is None:   # the process's doorbell page of this GPU, mapped once (it stays with the process)
      base = args.doorbell_offset & ~(DOORBELL_PAGE - 1)
      # mmap offsets with the top bits set (KFD's mmap type) go to libc's signed off_t as negative numbers
      signed = base - (1 << 64) if base >> 63 else base
      self.doorbells = (self.kernel.mmap(0, DOORBELL_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, self.kfd_fd, signed), base)
      self.process.doorbells[self.gpu_id] = self.doorbells
      self.process.mappings.append((self.doorbells[0], DOORBELL_PAGE))
    db_addr, db_base = self.doorbells
    doorbell = db_addr + (args.doorbell_offset & (DOORBELL_PAGE - 1))
    unit, nop = (4, pm4.nop) if queue_type == kfd.QUEUE_TYPE_COMPUTE else (1, sdma.nop)
    r = Ring(f"{self.name} {kind} queue {args.queue_id}", ring.addr, self.view(ring.addr, ring_size), ring_size, self.view(rw.addr, 16),
             self.view(doorbell, 8), unit, nop, self.timeout, rptr_wraps=queue_type == kfd.QUEUE_TYPE_COMPUTE)
    r.queue_id, r.kind, r.memories = args.queue_id, kind, memories
    r.error_payload = np.frombuffer(self.view(rw.addr + ERROR_PAYLOAD_OFFSET, 8), np.uint64)
    return r

  def _fill_cwsr_header(self, cwsr: Memory, payload_addr: int):
    """The context-save-area header amdkfd reads when the queue stops on an error (struct
    kfd_context_save_area_header, kfd_ioctl.h; filled as libhsakmt queues.c fill_cwsr_header does): the error
    event's id and the qword the kernel ORs the error's KFD_EC_MASK into (kfd_process.c send_exception_work_handler).
    Left zero, a bad packet or an illegal instruction only suspends the queue and a waiter learns nothing."""
    header = np.frombuffer(self.view(cwsr.addr, 40), np.uint8)
    header[:] = 0
    words = header.view(np.uint32)
    words[kfd.CSA_DEBUG_OFFSET // 4] = self.node.cwsr_size          # the debugger area follows the save area
    words[kfd.CSA_DEBUG_SIZE // 4] = self.node.debug_memory_size
    header[kfd.CSA_ERR_PAYLOAD_ADDR:kfd.CSA_ERR_PAYLOAD_ADDR + 8].view(np.uint64)[0] = payload_addr
    words[kfd.CSA_ERR_EVENT_ID // 4] = self.error_event

  def _reset_queues(self):
    """After a queue error: destroy and recreate both queues (what they still held is dropped, as a queue reset does)
    and the exception events, which stay signaled once set (amdkfd resets only auto-reset events)."""
    for event in (self.hw_event, self.error_event): self._ioctl("DESTROY_EVENT", event_id=event)
    self.hw_event = self._ioctl("CREATE_EVENT", event_type=kfd.EVENT_HW_EXCEPTION, auto_reset=0,
                                node_id=self.node.index).event_id
    self.error_event = self._new_error_event()
    for kind, queue_type in self.queue_types.items():
      old = self.ring_of(kind)
      self._ioctl("DESTROY_QUEUE", queue_id=old.queue_id)
      for mem in old.memories: self.free(mem)
      setattr(self, kind, self._create_queue(kind, queue_type, old.size))
    self.fault, self._stalled = None, False

  def ring_of(self, kind: str) -> Ring: return self.copy if kind == "copy" else self.compute

  # ---- programs ----
  def compile(self, src: str) -> bytes:
    # the assembler lives in the compiler layer (drivers never import it): compiler/codegen uses the renderer's
    # compile() for AMD, so nothing should reach this
    raise NotImplementedError("AMD programs are assembled by compiler.render_amd.AMDRenderer.compile")

  def load_program(self, binary: bytes, name: str):
    from .codeobj import read_code_object, RSRC1, RSRC2, RSRC3
    code, kd, entry, kname = read_code_object(binary)
    if entry % 256: raise AMDError(f"AMD: kernel {kname!r} entry at .text+{entry:#x} is not 256-byte aligned (COMPUTE_PGM_LO)")
    unsupported = [f for f in ("enable_sgpr_private_segment_buffer", "enable_sgpr_dispatch_ptr", "enable_sgpr_queue_ptr",
                               "enable_sgpr_dispatch_id", "enable_sgpr_flat_scratch_init", "enable_private_segment")
                   if getattr(kd, f)]
    if unsupported: raise AMDError(f"AMD: kernel {kname!r} asks for {', '.join(unsupported)}: this driver launches through PM4 "
                                   f"with only the kernarg pointer in user SGPRs (no AQL packet, no scratch)")
    if kd.priv: raise AMDError(f"AMD: kernel {kname!r} has COMPUTE_PGM_RSRC1.PRIV set in its descriptor, which AMDGPUUsage "
                               f"says must be 0 (the CP fills the register's PRIV)")
    mem = self.alloc(len(code), "vram", executable=True)
    self.view(mem.addr, len(code))[:] = code
    lds = kd.group_segment_fixed_size
    granules = -(-lds // LDS_GRANULE)
    if granules >= 1 << RSRC2_LDS_BITS: raise AMDError(f"AMD: kernel {kname!r} needs {lds} bytes of LDS")
    rsrc2 = kd.register(RSRC2) | granules << RSRC2_LDS_SHIFT
    user = 2 if kd.enable_sgpr_kernarg_segment_ptr else 0
    if kd.user_sgpr_count != user:
      raise AMDError(f"AMD: kernel {kname!r} has USER_SGPR_COUNT {kd.user_sgpr_count}, expected {user} (kernarg pointer only)")
    prog = LoadedProgram(kname, mem, mem.addr + entry, kd.register(RSRC1), rsrc2, kd.register(RSRC3), user, lds,
                         bool(kd.enable_wavefront_size32))
    self.programs[prog.pgm_addr] = prog
    self.kernel.register_program(prog.pgm_addr, None, kname, 0, [])   # its name for the emulator's counters
    return prog.pgm_addr, prog

  def unload_program(self, handle: LoadedProgram):
    """Free a program's code (hcq calls this once the device has finished the work that used it)."""
    if self.programs.pop(handle.pgm_addr, None) is not None:
      self.kernel.unregister_program(handle.pgm_addr)
      self.free(handle.memory)

  # ---- queues: hcq commands -> PM4 (compute queue) or SDMA (copy queue) packets ----
  def encode(self, kind: str, cmds: list[tuple]) -> Encoded:
    """The packets of `cmds` for the queue of `kind`. A symbolic value (an hcq Slot) goes into the packet fields as
    its 32-bit halves (`lo32`/`hi32`): `pm4.pack_fields` places them by the packet tables and the Encoder records
    where they landed, so the patch locations come from the tables that build the packets. No side effects."""
    if kind not in self.queue_types: raise AMDError(f"AMD: no {kind!r} queue (the queues are {', '.join(self.queue_types)})")
    out, sdma_queue = Encoder(), kind == "copy"
    for cmd in cmds:
      op = cmd[0]
      if op == "exec":
        if sdma_queue: raise AMDError("AMD: exec on the copy (SDMA) queue; kernels run on the compute queue")
        self._dispatch(out, *cmd[1:])
      elif op == "copy":
        _, dst, src, n = cmd
        if sdma_queue:
          for p in sdma.copy_linear_packets(dst, src, n): out.packet(p)
        else:
          for off in range(0, n, pm4.DMA_DATA_MAX_BYTES):
            c = min(pm4.DMA_DATA_MAX_BYTES, n - off)
            out.packet(pm4.packet("DMA_DATA", src_addr_lo=lo32(src + off), src_addr_hi=hi32(src + off), dst_addr_lo=lo32(dst + off),
                                  dst_addr_hi=hi32(dst + off), byte_count=c, cp_sync=int(off + c >= n), raw_wait=1))
      elif op == "signal": self._signal(out, sdma_queue, cmd[1].addr, cmd[2])
      elif op == "wait": self._wait(out, kind, cmd[1].addr, cmd[2])
      elif op == "timestamp":
        addr = cmd[1].timestamp_addr
        if sdma_queue: out.packet(sdma.packet("TIMESTAMP", addr_lo=lo32(addr), addr_hi=hi32(addr)))
        else:
          out.packet(pm4.packet("RELEASE_MEM", event_type=pm4.BOTTOM_OF_PIPE_TS, event_index=5, data_sel=pm4.DATA_SEL_GPU_CLOCK,
                                addr_lo=lo32(addr), addr_hi=hi32(addr)))
      elif op == "barrier":
        if not sdma_queue:
          for p in self._pm4_barrier(): out.packet(p)
      else: raise ValueError(f"AMD queue: unknown command {op!r}")
      if self.markers: self._marker(out, kind, describe(cmd), launch_args(cmd))
    return out.encoded

  def _marker(self, out: Encoder, kind: str, what: str, args: tuple | None = None):
    """The command's trace marker: its sequence number (a Marker fixup) written when the command is done. PM4:
    RELEASE_MEM at bottom of pipe, 32-bit data, no cache action or interrupt (the dispatch's own barrier came before);
    SDMA: an uncached FENCE."""
    addr = self._marker_slot[kind]
    if kind == "copy":
      out.packet(sdma.packet("FENCE", mtype=SDMA_MTYPE_UC, addr_lo=lo32(addr), addr_hi=hi32(addr), data=Marker(what, args)))
    else:
      out.packet(pm4.packet("RELEASE_MEM", event_type=pm4.BOTTOM_OF_PIPE_TS, event_index=5, data_sel=pm4.DATA_SEL_32,
                            addr_lo=lo32(addr), addr_hi=hi32(addr), data_lo=Marker(what, args)))

  def _dispatch(self, out: Encoder, program, args_addr, global_size, local_size):
    """SET_SH_REG the program, its resources, the kernarg pointer (user SGPRs 0-1) and the block size, then
    DISPATCH_DIRECT and a barrier (dispatches in one queue run in order, as hcq expects)."""
    prog: LoadedProgram = program.handle
    if tuple(local_size) == (1, 1, 1): local_size = tuple(program.meta.get("local_size", (1, 1, 1)))
    # a launch dimension may be a symbolic value (hcq's JIT graph patches a grid that depends on a Variable per replay):
    # DISPATCH_DIRECT's DIM_X/Y/Z each fill a dword, which the encoder lists as a patch
    gx, gy, gz = (d if isinstance(d, int) else lo32(d) for d in tuple(global_size) + (1,) * (3 - len(global_size)))
    lx, ly, lz = tuple(local_size) + (1,) * (3 - len(local_size))
    pgm = prog.pgm_addr
    out.packet(pm4.set_sh_reg("COMPUTE_PGM_LO", (pgm >> 8) & 0xFFFFFFFF, pgm >> 40))
    # COMPUTE_PGM_RSRC1.PRIV: "CP is responsible for filling in COMPUTE_PGM_RSRC1.PRIV" (AMDGPUUsage, compute_pgm_rsrc1);
    # writing the register, this driver is the CP. On gfx11 its waves start privileged for context save/restore (CWSR:
    # amdkfd preempts user queues by saving their waves with its trap handler, amdkfd/cwsr_trap_handler_gfx10.asm), as
    # tinygrad's KFD PM4 path does ("priv=1 on gfx11 for cwsr"); the descriptor's PRIV stays 0 (load_program checks).
    out.packet(pm4.set_sh_reg("COMPUTE_PGM_RSRC1", prog.rsrc1 | RSRC1_PRIV, prog.rsrc2))
    out.packet(pm4.set_sh_reg("COMPUTE_PGM_RSRC3", prog.rsrc3))
    out.packet(pm4.set_sh_reg("COMPUTE_TMPRING_SIZE", 0))
    if prog.user_sgprs: out.packet(pm4.set_sh_reg("COMPUTE_USER_DATA_0", lo32(args_addr), hi32(args_addr)))
    out.packet(pm4.set_sh_reg("COMPUTE_START_X", 0, 0, 0))
    out.packet(pm4.set_sh_reg("COMPUTE_NUM_THREAD_X", lx, ly, lz))
    out.packet(pm4.set_sh_reg("COMPUTE_RESOURCE_LIMITS", 0))
    out.packet(pm4.packet("DISPATCH_DIRECT", dim_x=gx, dim_y=gy, dim_z=gz, compute_shader_en=1, force_start_at_000=1,
                          cs_w32_en=int(prog.wave32)), label=f"kernel {prog.name}")
    for p in self._pm4_barrier(): out.packet(p)

  def _signal(self, out: Encoder, sdma_queue: bool, addr: int, value):
    """Write the 64-bit `value` at `addr`, then the event's slot, then interrupt (the event `wait_value` sleeps on).
    kfd_events.c: "the signaler will write a 1 before sending an interrupt", and kfd_signal_event_interrupt ignores an
    interrupt whose event slot still reads UNSIGNALED. The slot comes after the value: whenever amdkfd finds it written
    the value is visible, so an interrupt of a signal whose slot an earlier interrupt already acknowledged (one event
    serves every signal) loses no wake-up."""
    slot = self.queue_event_slot
    if sdma_queue:   # FENCEs are 32-bit and uncached (MTYPE UC, as sdma_v6_0_ring_emit_fence). The value: low word
      # first (as sdma_v6_0_ring_emit_fence): a 64-bit reader never sees more than the new value while the high word
      # changes (high first would show new high : old low). The slot's low word (1 over all ones) makes it differ from
      # UNSIGNALED_EVENT_SLOT. TRAP: the interrupt (kfd_int_process_v11.c: SDMA_TRAP context, 28 bits of event id)
      out.packet(sdma.packet("FENCE", mtype=SDMA_MTYPE_UC, addr_lo=lo32(addr), addr_hi=hi32(addr), data=lo32(value)))
      out.packet(sdma.packet("FENCE", mtype=SDMA_MTYPE_UC, addr_lo=lo32(addr + 4), addr_hi=hi32(addr + 4),
                             data=hi32(value)))
      out.packet(sdma.packet("FENCE", mtype=SDMA_MTYPE_UC, addr_lo=lo32(slot), addr_hi=hi32(slot), data=EVENT_SLOT_SIGNALED))
      out.packet(sdma.packet("TRAP", int_context=self.queue_event))
    else:            # end-of-pipe writes, in order: the value, then the slot with the interrupt after its write
      out.packet(self._release_mem(addr, value, pm4.INT_SEL_NONE, 0))
      out.packet(self._release_mem(slot, EVENT_SLOT_SIGNALED, pm4.INT_SEL_AFTER_WRITE, self.queue_event))

  @staticmethod
  def _release_mem(addr: int, value, int_sel: int, int_ctxid: int) -> list:
    """RELEASE_MEM at end of pipe: write back + invalidate the caches, then write the 64-bit `value` at `addr`."""
    return pm4.packet("RELEASE_MEM", event_type=pm4.CACHE_FLUSH_AND_INV_TS_EVENT, event_index=5, gcr_glm_wb=1,
                      gcr_glm_inv=1, gcr_gl2_wb=1, gcr_seq=1, cache_policy=3, data_sel=pm4.DATA_SEL_64, int_sel=int_sel,
                      addr_lo=lo32(addr), addr_hi=hi32(addr), data_lo=lo32(value), data_hi=hi32(value), int_ctxid=int_ctxid)

  def _wait(self, out: Encoder, kind: str, addr: int, value):
    """Wait until the 64-bit word at `addr` is >= `value`."""
    if isinstance(addr, int) and addr & 7:
      raise AMDError(f"AMD {kind} queue: wait on a signal at {addr:#x}, which is not 8-byte aligned")
    if kind == "copy":
      # SDMA v6 has no 64-bit poll: high word >= the value's, then, if the high word equals it, low word >= the
      # value's. It never passes early; it stalls only if the signal leaves the value's 2**32 epoch (jumps past
      # its end) while the low word is polled and before the queue saw a low word >= the value's
      lo_poll = sdma.packet("POLL_REGMEM", mem_poll=1, func=sdma.FUNC[">="], addr_lo=lo32(addr), addr_hi=hi32(addr),
                            value=lo32(value), mask=0xFFFFFFFF, interval=10, retry_count=0xFFF)
      out.packet(sdma.packet("POLL_REGMEM", mem_poll=1, func=sdma.FUNC[">="], addr_lo=lo32(addr + 4), addr_hi=hi32(addr + 4),
                             value=hi32(value), mask=0xFFFFFFFF, interval=10, retry_count=0xFFF))
      # COND_EXE and the low poll it guards are one packet: a ring never puts NOPs between them
      out.packet(sdma.packet("COND_EXE", addr_lo=lo32(addr + 4), addr_hi=hi32(addr + 4), reference=hi32(value),
                             exec_count=len(lo_poll)) + lo_poll)
    else:
      # WAIT_REG_MEM64 (PAL's PM4_MEC_WAIT_REG_MEM64, pm4.py): a 64-bit ">=" of the 8-byte-aligned signal. The gfx11 MEC
      # runs it: IREE's AMDGPU HAL waits on its 64-bit epoch signals with it on gfx1100 (iree-org/iree
      # runtime/src/iree/hal/drivers/amdgpu/physical_device_capabilities.c: WAIT_REG_MEM64 is among the "packet families
      # validated on the local gfx1100 bring-up system" and selects the PM4_WAIT_REG_MEM64 wait-barrier strategy;
      # util/pm4_emitter.h iree_hal_amdgpu_pm4_emit_wait_reg_mem64: 9 dwords, memory space, 64-bit reference and mask,
      # poll interval 4), executed from PM4 indirect buffers by the same MEC firmware as a KFD PM4 queue. No 32-bit form
      # amdgpu uses is correct for hcq's signals, whose 64-bit values grow by any step: a CP WAIT_REG_MEM
      # (gfx_v11_0_wait_reg_mem) compares one dword and cannot branch. The low word alone passes early across every
      # 2**32 boundary (low word of 2**32 - 1 >= low word of 2**32 + 3); "high >= then low >=" never passes early but
      # stalls for good whenever the signal is already an epoch ahead with a smaller low word (waiting for 0x3_fffffffc
      # with the signal at 0x4_fffffffb: test_sync_fuzz seed 7 deadlocks so). So the driver keeps this one packet, in
      # this one form, which is all the emulated CP accepts (kfd_engines.py).
      out.packet(pm4.packet("WAIT_REG_MEM64", function=pm4.FUNC[">="], mem_space=1, addr_lo=lo32(addr), addr_hi=hi32(addr),
                            reference=lo32(value), reference_hi=hi32(value), mask=0xFFFFFFFF, mask_hi=0xFFFFFFFF,
                            poll_interval=4))

  @staticmethod
  def _pm4_barrier() -> list[list[int]]:
    """Wait for earlier dispatches (CS_PARTIAL_FLUSH), then write back + invalidate the caches (ACQUIRE_MEM)."""
    return [pm4.packet("EVENT_WRITE", event_type=pm4.CS_PARTIAL_FLUSH, event_index=4),
            pm4.packet("ACQUIRE_MEM", coher_size=0xFFFFFFFF, coher_size_hi=0xFF, poll_interval=10, gli_inv=1,
                       glm_inv=1, glm_wb=1, glk_inv=1, glv_inv=1, gl1_inv=1, gl2_inv=1, gl2_wb=1)]

  @staticmethod
  def hdp_flush(kind: str) -> list[int]:
    """The HDP flush that starts every submission: the host's writes to VRAM (through the BAR) may still be in the HDP
    when the doorbell rings. gfx_v11_0_ring_emit_hdp_flush (amdgpu/gfx_v11_0.c) for the compute queue: WAIT_REG_MEM
    write-wait-write on GPU_HDP_FLUSH_REQ / _DONE, "==", engine ME (0), poll interval 0x20, ref_and_mask covering every
    pipe a KFD compute queue can be on (pm4.HDP_FLUSH_COMPUTE). The copy queue is an unprivileged user SDMA queue, where
    amdgpu's register form (sdma_v6_0_ring_emit_hdp_flush, for its privileged rings) does not apply: it uses the
    firmware packet ROCr's user-mode SDMA blits use (sdma.HDP_FLUSH_PACKET)."""
    if kind == "copy": return list(sdma.HDP_FLUSH_PACKET)
    return pm4.packet("WAIT_REG_MEM", function=pm4.FUNC["=="], mem_space=0, operation=pm4.WAIT_REG_MEM_WRITE_WAIT_WRITE,
                      engine=0, addr_lo=pm4.HDP_FLUSH_REQ, addr_hi=pm4.HDP_FLUSH_DONE, reference=pm4.HDP_FLUSH_COMPUTE,
                      mask=pm4.HDP_FLUSH_COMPUTE, poll_interval=0x20)

  def submit(self, kind: str, encoded: Encoded):
    """Write an HDP flush and the resolved packets into the ring of `kind` and ring its doorbell."""
    if encoded.patches: raise AMDError(f"AMD {kind} queue: submit of commands with unresolved symbolic values (resolve them first)")
    if self.fault: self.check_faults(self.name)
    labels = {k + 1: text for k, text in encoded.packet_labels().items()}
    if encoded.fixups:
      encoded = Encoded(self._place_markers(kind, encoded.words, encoded.fixups), [], encoded.packets, encoded.labels)
    packets = [self.hdp_flush(kind)] + encoded.packet_words()
    if self.word_log is not None: self.word_log.add(kind, self._format(kind), [w for p in packets for w in p], self._readable)
    self.ring_of(kind).write(packets, labels)

  # ---- bound queues (JIT replay): the packets stay in GPU memory, a submit is one indirect-buffer packet ----
  def bind(self, kind: str, encoded: Encoded) -> BoundQueue:
    flat = self._place_markers(kind, encoded.words, encoded.fixups, keep=False)   # a replay writes these numbers each time
    if kind == "copy":       # an SDMA IB is padded to a multiple of 8 dwords (sdma_v6_0_ring_pad_ib)
      flat += sdma.nop(-len(flat) % sdma.IB_ALIGN_DWORDS) if flat else sdma.nop(sdma.IB_ALIGN_DWORDS)
    mem = self.alloc(4 * max(len(flat), 1), "gtt")
    view = np.frombuffer(self.view(mem.addr, 4 * max(len(flat), 1)), dtype=np.uint32)
    view[:len(flat)] = np.array(flat, dtype=np.uint64).astype(np.uint32)
    labels = list(encoded.labels.values())
    label = f"a bound queue: {', '.join(labels)}" if labels else "a bound queue"
    return BoundQueue(kind, mem, view, len(flat), label)

  def submit_bound(self, kind: str, bound: BoundQueue, patch: list[tuple[int, int]]):
    if self.fault: self.check_faults(self.name)
    for i, v in patch: bound.words[i] = v
    addr = bound.memory.addr
    if kind == "copy":       # the INDIRECT ends on an 8-dword ring boundary (sdma_v6_0_ring_emit_ib)
      p = sdma.packet("INDIRECT", ib_base_lo=addr & 0xFFFFFFFF, ib_base_hi=addr >> 32, ib_size=bound.ndwords)
    else:
      p = pm4.packet("INDIRECT_BUFFER", ib_base_lo=addr & 0xFFFFFFFC, ib_base_hi=(addr >> 32) & 0xFFFF,
                     ib_size=bound.ndwords, valid=1)
    if self.word_log is not None: self.word_log.add(kind, self._format(kind), self.hdp_flush(kind) + p, self._readable)
    if kind == "copy":
      self.ring_of(kind).write([self.hdp_flush(kind), p], {1: bound.label}, end_align={1: sdma.IB_ALIGN_DWORDS})
    else:
      self.ring_of(kind).write([self.hdp_flush(kind), p], {1: bound.label})   # the kernel arguments hcq patched are VRAM

  # ---- waiting ----
  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    """Poll the 64-bit value with back-off, then sleep on the queues' interrupt event (KFD WAIT_EVENTS)."""
    view = np.frombuffer(self.view(addr, 8), dtype=np.uint64)
    start, delay = time.monotonic(), 2e-6
    while time.monotonic() - start < 2e-3:              # short spin: most waits end here
      if int(view[0]) >= value: return True
      time.sleep(delay); delay = min(delay * 2, 2e-4)
    events = kfd_ffi.new("struct kfd_event_data[1]")
    standing: dict = {}      # ring kind -> (read pointer, since when it stands there)
    while True:
      if int(view[0]) >= value: return True
      if self.fault or (self._poll_exceptions() and self.fault) or self._stopped_at_bad_packet(standing): return False
      left = timeout - (time.monotonic() - start)
      if left <= 0:
        self._stalled = (addr, value, int(view[0]), timeout)
        return False
      events[0].event_id = self.queue_event
      self._ioctl("WAIT_EVENTS", events_ptr=int(kfd_ffi.cast("uintptr_t", events)), num_events=1, wait_for_all=1,
                  timeout=max(1, min(int(left * 1000), 50)))

  def _stopped_at_bad_packet(self, standing: dict) -> bool:
    """True (with the fault recorded) when a busy queue's read pointer has stood BAD_PACKET_AFTER_S at the start of a
    packet that does not decode: the engine stopped there, and waiting longer only turns it into a timeout."""
    now = time.monotonic()
    for ring in (self.compute, self.copy):
      if ring.idle(): standing.pop(ring.kind, None); continue
      rptr = ring.rptr
      at, since = standing.get(ring.kind, (None, now))
      if at != rptr: standing[ring.kind] = (rptr, now); continue
      if now - since < BAD_PACKET_AFTER_S or rptr not in ring.starts: continue
      pos, words = ring.packet_at_rptr()
      try: _packets(ring).decode(words, pos)
      except ValueError: pass
      else: continue
      self.fault = (f"GPU {ring.kind} queue stopped at a packet its engine cannot decode, {now - since:.2g} s without "
                    f"progress{self._queue_report()}{self._packets_report()}")
      return True
    return False

  def _poll_exceptions(self) -> bool:
    """Non-blocking look at the memory-fault, queue-error and hardware-exception events; records a fault message."""
    events = kfd_ffi.new("struct kfd_event_data[3]")
    events[0].event_id, events[1].event_id, events[2].event_id = self.memory_event, self.error_event, self.hw_event
    args = self._ioctl("WAIT_EVENTS", events_ptr=int(kfd_ffi.cast("uintptr_t", events)), num_events=3, wait_for_all=0,
                       timeout=0)
    if args.wait_result != kfd.WAIT_COMPLETE: return False
    mem = events[0].memory_exception_data
    detail = self.kernel.fault()     # the emulated KFD's dmesg line (drivers/emu/README.md); None from the real kernel
    detail = f"; dmesg: {detail}" if detail else ""
    errors = {ring.kind: int(ring.error_payload[0]) for ring in (self.compute, self.copy) if int(ring.error_payload[0])}
    if mem.va or mem.failure.NotPresent or mem.failure.ReadOnly:
      what = ("page not present" if mem.failure.NotPresent else "write to read-only page" if mem.failure.ReadOnly
              else "no-execute" if mem.failure.NoExecute else "fault")
      self.fault = (f"GPU memory fault at address {mem.va:#x} ({what}, gpu_id {mem.gpu_id}; "
                    f"{self.describe_address(mem.va)}){self._queue_report()}{detail}{self._packets_report()}")
      self.fault_fatal = True
    elif errors:     # the queue-error event of the context-save header: amdkfd ORed the error codes into the payload
      names = "; ".join(f"{kind} queue: {', '.join(kfd.exception_names(bits))}" for kind, bits in errors.items())
      self.fault = f"GPU queue error ({names}){self._queue_report()}{detail}{self._packets_report()}"
    else:
      self.fault = f"GPU hardware exception (GPU reset){self._queue_report()}{detail}{self._packets_report()}"
    return True

  def _queue_report(self, verb: str = "stopped at") -> str:
    """Where each busy queue's read pointer stands, decoded from the ring the driver wrote."""
    parts = []
    for ring in (self.compute, self.copy):
      if ring.idle(): continue
      pos, words = ring.packet_at_rptr()
      try:
        if ring.kind == "copy":
          name, fields, _ = sdma.decode(words, pos)
          text = sdma.describe(name, fields)
          if name == "POLL_REGMEM": text += self._memory_now(fields["addr_hi"] << 32 | fields["addr_lo"], fields["mask"])
        else:
          name, fields, _ = pm4.decode(words, pos)
          text = pm4.describe(name, fields)
          if name == "WAIT_REG_MEM": text += self._memory_now(fields["addr_hi"] << 32 | fields["addr_lo"], fields["mask"])
          if name == "WAIT_REG_MEM64": text += self._memory_now(*pm4.wait64_operands(fields)[:2], nbytes=8)
      except ValueError as e:
        text = f"undecodable packet ({e})"
      label = ring.labels.get(ring.rptr)
      if label: text += f" ({label})"
      parts.append(f"; {ring.kind} queue {ring.queue_id} {verb} ring dword {pos:#x}: {text}{self.marker_report(ring.kind)}")
    return "".join(parts)

  def describe_address(self, addr: int) -> str:
    """Which allocation `addr` falls in and at what offset; or the freed one it was in (how long ago); or that this
    driver never mapped it (as far as the bounded history reaches)."""
    return self.history.describe(addr, ((m.addr, m.size, m.nbytes, m.domain) for m in list(self.memory.values())))

  def _packets_report(self) -> str:
    """The decoded packets around each busy queue's read pointer (the end of a fault or hang report)."""
    return "".join(f"\n  {ring.kind} queue {ring.queue_id}, packets around its read pointer:{self._packets_around(ring)}"
                   for ring in (self.compute, self.copy) if not ring.idle() and self._packets_around(ring))

  def _packets_around(self, ring: Ring, before: int = 3, after: int = 3) -> str:
    """The packets the driver wrote around the ring's read pointer, decoded (=> marks the one at the read pointer)."""
    table = _packets(ring)
    decode, describe = table.decode, table.describe
    starts = [at for at in ring.starts if ring.rptr - 4 * ring.dwords < at]
    if ring.rptr not in starts: return ""
    k = starts.index(ring.rptr)
    lines = []
    for at in starts[max(0, k - before):k + after + 1]:
      if at >= ring.wptr: break
      try: text = describe(*decode(ring.ring, at % ring.dwords)[:2])
      except ValueError as e: text = f"undecodable ({e})"
      lines.append(f"{'=>' if at == ring.rptr else '  '} {at % ring.dwords:#06x} {text}")
    return "\n    " + "\n    ".join(lines)

  @staticmethod
  def _format(kind: str) -> str: return "sdma" if kind == "copy" else "pm4"

  def _readable(self, addr: int, nbytes: int) -> bytes | None:
    """The bytes at a GPU address inside one live allocation the host can map (for decoding), else None."""
    for m in self.memory.values():
      if m.addr <= addr and addr + nbytes <= m.addr + m.size and m.domain != "device": return bytes(self.view(addr, nbytes))
    return None

  def dump_queues(self) -> str:
    """Each queue's ring decoded from the engine's read pointer to the write pointer, following indirect buffers."""
    from ..decode import decode as decode_words    # (only here: the decoder's tables stay out of import time)
    out = []
    for ring in (self.compute, self.copy):
      fmt = "sdma" if ring.kind == "copy" else "pm4"
      rptr, wptr = ring.rptr, ring.wptr
      out.append(f"{ring.kind} queue {ring.queue_id} ({fmt.upper()} ring of {ring.dwords} dwords at {ring.base:#x}): read "
                 f"pointer {rptr}, write pointer {wptr} (dwords since it was created)"
                 f"{': empty' if rptr >= wptr else ''}{self.marker_report(ring.kind)}")
      pos = rptr
      while pos < wptr:          # no packet straddles the wrap: decode up to it, then from the ring's start
        at = pos % ring.dwords
        n = min(wptr - pos, ring.dwords - at)
        out += decode_words(fmt, ring.ring[at:at + n], ring.base + 4 * at, self._readable, "  ")
        pos += n
    return "\n".join(out)

  def _memory_now(self, addr: int, mask: int, nbytes: int = 4) -> str:
    if not any(m.addr <= addr < m.addr + m.size for m in self.memory.values()): return ""
    value = int(np.frombuffer(self.view(addr, nbytes), dtype=np.uint32 if nbytes == 4 else np.uint64)[0])
    return f", memory holds {value & mask:#x}"

  def check_faults(self, device_name: str):
    """Raise a fault the GPU reported: a memory fault on every call from now on; a queue error once, after resetting
    the queues (QueueReset)."""
    if self.fault is None: self._poll_exceptions()
    if self.fault is not None:
      if self.fault_fatal: raise GPUFault(f"{device_name}: {self.fault}")
      message = f"{device_name}: {self.fault}"
      self._reset_queues()
      raise QueueReset(f"{message}; the queues were recreated (work queued after the fault was dropped)")
    if self._stalled:
      (addr, value, seen, timeout), self._stalled = self._stalled, False
      report = self._queue_report(verb="is at")
      if report: raise QueueTimeout(f"{device_name}: waited {timeout:.3g} s for [{addr:#x}] >= {value}, it is {seen}{report}"
                                    f"{self._packets_report()}")

  # ---- teardown ----
  def after_fork_in_child(self) -> bool:
    """False: a forked child cannot use this device. amdkfd binds a /dev/kfd file to the process that opened it and
    refuses ioctls from any other (kfd_ioctl in drivers/gpu/drm/amd/amdkfd/kfd_chardev.c, Linux 6.x: -EBADF when
    process->lead_thread != current->group_leader); the child opens its own device when it needs one."""
    return False

  def close(self):
    """Destroy this device's queues, events and buffers. The process's KFD state (/dev/kfd, the render node bound by
    ACQUIRE_VM, the event page, the doorbell mapping) stays for the next device opened in this process (KFDProcess)."""
    for ring in (self.compute, self.copy):
      try: self._ioctl("DESTROY_QUEUE", queue_id=ring.queue_id)
      except OSError: pass
    for event in (self.memory_event, self.hw_event, self.error_event):
      try: self._ioctl("DESTROY_EVENT", event_id=event)
      except OSError: pass
    for mem in list(self.memory.values()):      # the queues are gone: nothing reads this memory any more
      try: self.free(mem)
      except OSError: pass
    _kernels_in_use.discard(id(self.kernel))    # (an emulated GPU: the next driver opened may take it again)

  @classmethod
  def probe(cls) -> dict:
    if not kernel_mod.emulated() and not os.path.exists("/dev/kfd"):
      return {"available": False, "reason": "/dev/kfd does not exist (set EMU=1 for the emulated gfx1100)"}
    return {"available": True, "emulated": kernel_mod.emulated()}
