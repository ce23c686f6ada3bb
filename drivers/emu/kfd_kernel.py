"""Emulated amdkfd + amdgpu render node + one gfx1100 GPU, behind the kernel interface (EMU=1 DEV=AMD).

`EmulatedKFD` has the methods of drivers/kernel.py's KernelInterface (exists/read_text/open/close/ioctl/mmap/
munmap). It serves:
  * sysfs: the KFD topology (a CPU node 0 and a Navi31 / gfx1100 node 1 with the properties amdkfd prints);
  * /dev/kfd ioctls, argument handling as amdkfd's kfd_ioctl() does it (request number -> the kernel's own size,
    user bytes copied in and zero-extended, copied back out) and per-ioctl checks with amdkfd's errnos;
  * mmap of /dev/kfd (doorbell page, events page) and of the render node (BO CPU mappings at MAP_FIXED addresses).
Buffer objects are memfd-backed: the CPU mapping (mmap of the render node) and the GPU's view (a mapping in the
emulator's `Memory` at the BO's GPU virtual address) share pages. Queues run in kfd_engines.py, one thread each.
Anything a real kernel would print to dmesg goes to `self.kmsg` (and to stderr with EMU_LOG=1).
What each dispatch executed (drivers/emu/counters.py) is kept in `self.counters`; DEBUG=1 prints a line per dispatch.

Two coherence models the engines share live here (kfd_engines.py enforces them):
  * the HDP: CPU stores to VRAM pass the host data path, which may still hold them when the doorbell rings until a
    queue flushes it (gfx_v11_0_ring_emit_hdp_flush / sdma_v6_0_ring_emit_hdp_flush). The host's stores cannot be seen
    here (they land in the shared pages at once), so the model is by epoch: every doorbell an engine picks up may follow
    host writes (`host_epoch`); an HDP flush covers everything the host wrote before it (`hdp_flushed_epoch`). A
    one-shot read of a VRAM BO by a packet picked up after the last flush stops the queue naming the missing flush.
  * the GPU L2 for SDMA FENCE writes: a FENCE whose MTYPE is not UC (3) lands in an L2 line (`gl2_lines`) that the
    engines read but the host (and the interrupt handler, which reads the event page from memory) does not see until a
    GL2 write-back (RELEASE_MEM GCR_GL2_WB, ACQUIRE_MEM GL2_WB) writes it to memory.
"""
from __future__ import annotations
import errno, mmap as _mmap, os, sys, threading, time
import cffi
import numpy as np

from baregrad.drivers import kernel as kernel_mod, settings
from baregrad.drivers.amd import kfd
from baregrad.drivers.amd.topology import TOPOLOGY, PAGE
from . import counters
from .memory import Memory

_ffi = cffi.FFI()
_ffi.cdef("void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset); int munmap(void *addr, size_t length);")
_libc = _ffi.dlopen(None)
MAP_FAILED = 2**64 - 1

MMAP_TYPE_SHIFT, MMAP_TYPE_DOORBELL, MMAP_TYPE_EVENTS = 62, 3, 2     # amdkfd/kfd_priv.h (KFD_MMAP_TYPE_*)
MMAP_GPU_ID_SHIFT = 46
DOORBELL_PAGE = 8192
UNSIGNALED_SLOT = 2**64 - 1                    # kfd_events.h UNSIGNALED_EVENT_SLOT ((uint64_t)-1)
OLD_USER_MODE_SLOTS = 256                      # allocate_event_notification_slot: "Oldest user mode expects 256 event slots"

GPU_ID = 0xE1A5
RENDER_MINOR = 128
VRAM_BYTES = 24 << 30
VISIBLE_VRAM_SMALL_BAR = 256 << 20             # the classic PCI BAR a machine without Resizable BAR maps
# A Radeon RX 7900 XTX (Navi31, gfx1100) as amdkfd describes it (kfd_topology.c node_show order)
GPU_PROPERTIES = [
  ("cpu_cores_count", 0), ("simd_count", 192), ("mem_banks_count", 1), ("caches_count", 206), ("io_links_count", 1),
  ("p2p_links_count", 0), ("cpu_core_id_base", 0), ("simd_id_base", 2147487744), ("max_waves_per_simd", 16),
  ("lds_size_in_kb", 64), ("gds_size_in_kb", 0), ("num_gws", 64), ("wave_front_size", 32), ("array_count", 12),
  ("simd_arrays_per_engine", 2), ("cu_per_simd_array", 8), ("simd_per_cu", 2), ("max_slots_scratch_cu", 32),
  ("gfx_target_version", 110000), ("vendor_id", 4098), ("device_id", 29772), ("location_id", 768), ("domain", 0),
  ("drm_render_minor", RENDER_MINOR), ("hive_id", 0), ("num_sdma_engines", 2), ("num_sdma_xgmi_engines", 0),
  ("num_sdma_queues_per_engine", 6), ("num_cp_queues", 8), ("max_engine_clk_fcompute", 2482), ("local_mem_size", 0),
  ("fw_version", 2080), ("capability", 671588992), ("debug_prop", 1495), ("sdma_fw_version", 20),
  ("unique_id", 0x3F1A2B3C4D5E6F70), ("num_xcc", 1), ("max_engine_clk_ccompute", 2200),
]
# The Ryzen 7000 integrated GPU (Raphael, gfx1036) a desktop with a 7900 XTX also has: amdkfd lists it as a GPU node
# too, in PCI probe order, here before the dGPU (the driver must pick the node whose target it compiles for). It is
# only topology: an ioctl naming its gpu_id is refused (EINVAL), the emulator runs gfx1100 only.
IGPU_ID, IGPU_RENDER_MINOR = 0x7A3B, 129
IGPU_PROPERTIES = [
  ("cpu_cores_count", 0), ("simd_count", 4), ("mem_banks_count", 1), ("caches_count", 4), ("io_links_count", 1),
  ("p2p_links_count", 0), ("cpu_core_id_base", 0), ("simd_id_base", 2147487808), ("max_waves_per_simd", 16),
  ("lds_size_in_kb", 64), ("gds_size_in_kb", 0), ("num_gws", 0), ("wave_front_size", 32), ("array_count", 1),
  ("simd_arrays_per_engine", 1), ("cu_per_simd_array", 2), ("simd_per_cu", 2), ("max_slots_scratch_cu", 32),
  ("gfx_target_version", 100306), ("vendor_id", 4098), ("device_id", 5710), ("location_id", 4352), ("domain", 0),
  ("drm_render_minor", IGPU_RENDER_MINOR), ("hive_id", 0), ("num_sdma_engines", 1), ("num_sdma_xgmi_engines", 0),
  ("num_sdma_queues_per_engine", 2), ("num_cp_queues", 8), ("max_engine_clk_fcompute", 2200), ("local_mem_size", 0),
  ("fw_version", 2080), ("capability", 671588992), ("debug_prop", 1495), ("sdma_fw_version", 20),
  ("unique_id", 0), ("num_xcc", 1), ("max_engine_clk_ccompute", 5000),
]
CPU_PROPERTIES = [("cpu_cores_count", 16), ("simd_count", 0), ("mem_banks_count", 1), ("caches_count", 0),
                  ("io_links_count", 1), ("cpu_core_id_base", 0), ("gfx_target_version", 0), ("vendor_id", 0),
                  ("device_id", 0), ("drm_render_minor", 0)]
GPU_NODE = 2                                   # the gfx1100's topology node index


class BO:
  """A buffer object: memfd backing, GPU VA, CPU mmap offset."""
  def __init__(self, handle, va, size, flags, memfd=None, kernel_map=None, host=None):
    self.handle, self.va, self.size, self.flags = handle, va, size, flags
    self.memfd, self.kernel_map, self.host = memfd, kernel_map, host     # host: userptr address
    self.mmap_offset = 0
    self.mapped = False

  def array(self) -> np.ndarray:
    if self.host is not None: return np.frombuffer(_ffi.buffer(_ffi.cast("uint8_t *", self.host), self.size), np.uint8)
    return np.frombuffer(self.kernel_map, np.uint8)


class Event:
  def __init__(self, event_id, event_type, auto_reset, slot):
    self.id, self.type, self.auto_reset, self.slot = event_id, event_type, auto_reset, slot
    self.signaled = False
    self.memory_exception = None       # (va, not_present, read_only)


class EmulatedKFD:
  """The kernel interface, served by an emulated amdkfd and gfx1100."""
  emulated = True

  def __init__(self, small_bar: bool | None = None):
    """small_bar: the host can map only VISIBLE_VRAM_SMALL_BAR of the VRAM (no Resizable BAR); default EMU_SMALL_BAR."""
    self.small_bar = settings.EMU_SMALL_BAR if small_bar is None else small_bar
    self.paths: dict[int, str] = {}
    self.file_ids: dict[int, int] = {}         # fd -> which open file it is (a new number for every open)
    self.next_file_id = 1
    self.drm_file: int | None = None           # the render-node file ACQUIRE_VM bound (pdd->drm_file)
    self.opener_pid: int | None = None         # the process that opened /dev/kfd
    self.files = self._sysfs()
    self.lock = threading.RLock()              # guards `memory` (GPU mappings) against the engine threads
    self.cond = threading.Condition()          # events
    self.memory = Memory()
    self.bos: dict[int, BO] = {}
    self.by_offset: dict[int, BO] = {}
    self.next_handle, self.next_offset = 1, 1 << 32
    self.vram_used = 0
    self.runtime_enabled = False
    self.events: dict[int, Event] = {}
    self.event_page = None                     # np.uint64 signal slots (p->signal_page) once there is one
    self.signal_handle = 0                     # the BO handle of a user-mode event page (p->signal_handle)
    self.signal_mapped_size = 0                # bytes of slots user mode can use (p->signal_mapped_size)
    self.signal_event_count = 1                # kfd_event_init_process: event id 0 is allocated (reserved) up front
    self.doorbell_page = None
    self.host_epoch = 0                        # doorbells picked up so far: each may follow host writes to VRAM
    self.hdp_flushed_epoch = 0                 # host_epoch when an engine last flushed the HDP
    self.gl2_lines: dict[int, bytes] = {}      # dword address -> 4 bytes an SDMA FENCE left in the GPU L2
    self.copy_engine_bytes = 0                 # bytes moved by SDMA COPY_LINEAR and CP DMA_DATA (tools/bench.py)
    self.queues: dict = {}
    self.kmsg: list[str] = []
    self.t0 = time.perf_counter_ns()
    self.counters = counters.CounterLog("AMD", parent=counters.PROCESS)   # what each dispatch executed (counters.py)
    self.kernel_names: dict[int, str] = {}     # code address -> kernel name, for the counters only

  # ---- files ----
  def _sysfs(self) -> dict[str, str]:
    base = f"{TOPOLOGY}/nodes"
    props = lambda items: "".join(f"{k} {v}\n" for k, v in items)
    heap = kfd.HEAP_TYPE_FB_PRIVATE if self.small_bar else kfd.HEAP_TYPE_FB_PUBLIC
    bank = lambda heap_type, size: f"heap_type {heap_type}\nsize_in_bytes {size}\nflags 0\nwidth 384\nmem_clk_max 1250\n"
    return {f"{TOPOLOGY}/generation_id": "1\n", f"{TOPOLOGY}/system_properties": "platform_oem 0\nplatform_id 0\nplatform_rev 0\n",
            f"{base}/0/gpu_id": "0\n", f"{base}/0/name": "\n", f"{base}/0/properties": props(CPU_PROPERTIES),
            f"{base}/1/gpu_id": f"{IGPU_ID}\n", f"{base}/1/name": "gfx1036\n", f"{base}/1/properties": props(IGPU_PROPERTIES),
            f"{base}/1/mem_banks/0/properties": bank(kfd.HEAP_TYPE_FB_PUBLIC, 512 << 20),
            f"{base}/{GPU_NODE}/gpu_id": f"{GPU_ID}\n", f"{base}/{GPU_NODE}/name": "gfx1100\n",
            f"{base}/{GPU_NODE}/properties": props(GPU_PROPERTIES),
            f"{base}/{GPU_NODE}/mem_banks/0/properties": bank(heap, VRAM_BYTES)}

  def exists(self, path: str) -> bool:
    path = path.rstrip("/")
    return path in ("/dev/kfd", f"/dev/dri/renderD{RENDER_MINOR}", f"/dev/dri/renderD{IGPU_RENDER_MINOR}") or \
      path in self.files or \
      any(p.startswith(path + "/") for p in self.files)

  def read_text(self, path: str) -> str:
    if path in self.files: return self.files[path]
    raise FileNotFoundError(errno.ENOENT, f"emulated KFD: no such file {path!r}")

  def open(self, path: str, flags: int = 0) -> int:
    if path not in ("/dev/kfd", f"/dev/dri/renderD{RENDER_MINOR}", f"/dev/dri/renderD{IGPU_RENDER_MINOR}"):
      self._fail(errno.ENOENT, f"open({path!r})")
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)      # a real descriptor number, unique in the process
    self.paths[fd] = path
    self.file_ids[fd] = self.next_file_id
    self.next_file_id += 1
    if path == "/dev/kfd": self.opener_pid = os.getpid()
    kernel_mod.log("open", path=path, flags=flags, result=fd)
    return fd

  def close(self, fd: int) -> None:
    """Closing a file. Closing /dev/kfd drops only the file's reference to the process's kfd_process, which lives
    until the process's mm goes (kfd_chardev.c kfd_release -> kfd_unref_process; kfd_process.c create_process: "the
    kfd_process is fully operational and will be freed when the mm is released"): queues, buffers, events, the
    event page, the bound render node and the runtime state all stay (`process_exit` ends them)."""
    path = self.paths.pop(fd, None)
    if path is None: self._fail(errno.EBADF, f"close({fd})")
    self.file_ids.pop(fd, None)
    os.close(fd)
    kernel_mod.log("close", fd=fd, result=0)

  def process_exit(self):
    """The process's mm goes: amdkfd stops its queues and releases its buffer objects (kfd_process_notifier_release)."""
    self.shutdown()
    for fd in list(self.paths):
      try: os.close(fd)
      except OSError: pass
    self.paths.clear(); self.file_ids.clear()

  def shutdown(self):
    """Stop the queues and release the process's buffer objects (as the kernel does when the process ends)."""
    for q in list(self.queues.values()): q.stop()
    self.queues.clear()
    with self.lock:
      for bo in list(self.bos.values()):
        if bo.mapped: self.memory.unmap(bo.va); bo.mapped = False
        if bo.memfd is not None:
          os.close(bo.memfd); bo.memfd = None
          if bo.flags & kfd.ALLOC_VRAM: self.vram_used -= bo.size
      self.bos.clear(); self.by_offset.clear()
      if self.doorbell_page is not None and self.doorbell_page[0] is not None:   # the mapping keeps its page
        os.close(self.doorbell_page[0]); self.doorbell_page = (None, self.doorbell_page[1])

  def __del__(self):
    try: self.process_exit()
    except Exception: pass

  def _fail(self, code: int, what: str):
    raise kernel_mod.KernelCallError(code, f"{what} failed: errno {code} ({errno.errorcode.get(code, '?')}: "
                                           f"{os.strerror(code)}) [emulated KFD]")

  def log(self, message: str):
    line = f"[{(time.perf_counter_ns() - self.t0) / 1e9:12.6f}] amdgpu 0000:03:00.0: {message}"
    self.kmsg.append(line)
    if settings.EMU_LOG: print(line, file=sys.stderr)

  # ---- ioctl: amdkfd's kfd_ioctl() argument handling ----
  def ioctl(self, fd: int, request: int, arg, name: str | None = None, fields=None) -> int:
    path = self.paths.get(fd)
    if path is None: self._fail(errno.EBADF, f"ioctl {name or hex(request)} on fd {fd}")
    if path != "/dev/kfd": self._fail(errno.ENOTTY, f"ioctl {name or hex(request)} on {path}")
    # kfd_ioctl (drivers/gpu/drm/amd/amdkfd/kfd_chardev.c, Linux 6.x): "Only the process that opened /dev/kfd can
    # use the file descriptor" -- process->lead_thread != current->group_leader gives -EBADF (a forked child)
    if self.opener_pid not in (None, os.getpid()):
      self._fail(errno.EBADF, f"ioctl {name or hex(request)} on fd {fd}: /dev/kfd was opened by process "
                              f"{self.opener_pid}, not by this one (a forked child must open its own)")
    nr = request & 0xFF
    kname = kfd.NAME_OF_NR.get(nr)
    if kname is None:
      kernel_mod.log("ioctl", fd=fd, request=request, name=name, fields=None, result=-1, path=path)
      self._fail(errno.EINVAL, f"ioctl {name or hex(request)} on fd {fd} (/dev/kfd): unknown KFD command {nr:#x}")
    direction, _, struct = kfd.IOCTLS[kname]
    usize = (request >> 16) & 0x3FFF
    asize = max(usize, kfd.ffi.sizeof(f"struct {struct}"))
    kdata = kfd.ffi.new("char[]", asize)
    uaddr = int(_ffi.cast("uintptr_t", arg))
    if direction & kfd.IOC_WRITE: _ffi.memmove(_ffi.cast("void *", int(kfd.ffi.cast("uintptr_t", kdata))), _ffi.cast("void *", uaddr), usize)
    args = kfd.ffi.cast(f"struct {struct} *", kdata)
    try:
      err = getattr(self, f"_ioctl_{kname.lower()}")(args)
    except Exception as e:     # a bug in the emulator must not look like a kernel errno
      raise RuntimeError(f"emulated KFD: {kname} handler failed: {type(e).__name__}: {e}") from e
    if direction & kfd.IOC_READ and not err:
      _ffi.memmove(_ffi.cast("void *", uaddr), _ffi.cast("void *", int(kfd.ffi.cast("uintptr_t", kdata))), usize)
    kernel_mod.log("ioctl", fd=fd, request=request, name=name or f"AMDKFD_IOC_{kname}",
                   fields=fields() if callable(fields) else fields, result=-1 if err else 0, path=path)
    if err: self._fail(err, f"ioctl {name or 'AMDKFD_IOC_' + kname} on fd {fd} (/dev/kfd)")
    return 0

  def _gpu(self, gpu_id: int) -> bool: return gpu_id == GPU_ID

  def _ioctl_get_version(self, a):
    a.major_version, a.minor_version = 1, 14
    return 0

  def _ioctl_acquire_vm(self, a):
    if not self._gpu(a.gpu_id): return errno.EINVAL
    if self.paths.get(a.drm_fd) != f"/dev/dri/renderD{RENDER_MINOR}": return errno.EINVAL
    # kfd_ioctl_acquire_vm (kfd_chardev.c): "if (pdd->drm_file) ret = pdd->drm_file == drm_file ? 0 : -EBUSY;" -- the
    # pdd keeps the first render-node file for the process's lifetime: a second open of the render node is refused
    if self.drm_file is not None:
      if self.drm_file == self.file_ids.get(a.drm_fd): return 0
      self.log("kfd: ACQUIRE_VM with another render-node file: this process's VM is already bound to the first one")
      return errno.EBUSY
    self.drm_file = self.file_ids[a.drm_fd]
    return 0

  @property
  def drm_fd(self):
    """Whether ACQUIRE_VM bound this process to the GPU (memory and queues need it: kfd_bind_process_to_device)."""
    return self.drm_file

  def _ioctl_runtime_enable(self, a):
    if a.mode_mask & kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK:
      if self.runtime_enabled: return errno.EBUSY
      if self.queues: return errno.EEXIST
      self.runtime_enabled = True
    else:
      self.runtime_enabled = False
    return 0

  # ---- memory ----
  def _ioctl_alloc_memory_of_gpu(self, a):
    if a.size == 0: return errno.EINVAL
    if not self._gpu(a.gpu_id): return errno.EINVAL
    if self.drm_fd is None: return errno.ENODEV                 # kfd_bind_process_to_device: no ACQUIRE_VM yet
    kinds = a.flags & kfd.ALLOC_KINDS
    if kinds not in (kfd.ALLOC_VRAM, kfd.ALLOC_GTT, kfd.ALLOC_USERPTR):
      self.log(f"kfd: alloc flags {a.flags:#x}: need exactly one of VRAM, GTT, USERPTR (doorbell/MMIO BOs are not emulated)")
      return errno.EINVAL
    size = (a.size + PAGE - 1) // PAGE * PAGE
    if a.va_addr % PAGE: return errno.EINVAL
    with self.lock:
      for bo in self.bos.values():
        if bo.va < a.va_addr + size and a.va_addr < bo.va + bo.size:     # VA already used (amdgpu_vm_bo_map's dev_err)
          self.log(f"va {a.va_addr:#012x}-{a.va_addr + size:#012x} conflict with {bo.va:#012x}-{bo.va + bo.size:#012x}")
          return errno.EINVAL
      if kinds == kfd.ALLOC_USERPTR:
        if a.mmap_offset % PAGE or a.mmap_offset != a.va_addr: return errno.EINVAL
        bo = BO(self.next_handle, a.va_addr, size, a.flags, host=a.mmap_offset)
      else:
        if kinds == kfd.ALLOC_VRAM and self.vram_used + size > VRAM_BYTES: return errno.ENOMEM
        # kfd_ioctl_alloc_memory_of_gpu (kfd_chardev.c): VRAM the host maps (PUBLIC) needs a large BAR
        # (!kfd_dev_is_large_bar -> "Alloc host visible vram on small bar is not allowed", -EINVAL)
        if kinds == kfd.ALLOC_VRAM and a.flags & kfd.ALLOC_PUBLIC and self.small_bar:
          self.log("kfd: Alloc host visible vram on small bar is not allowed")
          return errno.EINVAL
        memfd = os.memfd_create(f"amdgpu-bo-{self.next_handle}", os.MFD_CLOEXEC)
        os.ftruncate(memfd, size)
        bo = BO(self.next_handle, a.va_addr, size, a.flags, memfd, _mmap.mmap(memfd, size))
        bo.mmap_offset = self.next_offset
        self.by_offset[bo.mmap_offset] = bo
        self.next_offset += size + PAGE
        if kinds == kfd.ALLOC_VRAM: self.vram_used += size
      a.handle = (GPU_ID << 32) | self.next_handle
      self.bos[a.handle] = bo
      self.next_handle += 1
      if kinds != kfd.ALLOC_USERPTR: a.mmap_offset = bo.mmap_offset
    return 0

  def _ioctl_free_memory_of_gpu(self, a):
    # kfd_ioctl_free_memory_of_gpu (amdkfd/kfd_chardev.c): "Safeguard to prevent user space from freeing signal BO"
    if self.signal_handle and a.handle == self.signal_handle:
      self.log("kfd: Free signal BO is not allowed")
      return errno.EPERM
    with self.lock:
      bo = self.bos.get(a.handle)
      if bo is None: return errno.EINVAL
      if bo.mapped:
        self.log(f"kfd: BO VA {bo.va:#x} size {bo.size:#x} is still mapped")
        return errno.EBUSY
      del self.bos[a.handle]
      if bo.memfd is not None:
        self.by_offset.pop(bo.mmap_offset, None)
        os.close(bo.memfd)           # CPU mappings keep their pages until munmap
        if bo.flags & kfd.ALLOC_VRAM: self.vram_used -= bo.size
    return 0

  def _map_args(self, a):
    if a.n_devices == 0 or a.n_success > a.n_devices: return None, errno.EINVAL
    bo = self.bos.get(a.handle)
    if bo is None: return None, errno.EINVAL
    ids = _ffi.cast("uint32_t *", a.device_ids_array_ptr)
    for i in range(a.n_success, a.n_devices):
      if not self._gpu(ids[i]): return None, errno.EINVAL
    return bo, 0

  def _ioctl_map_memory_to_gpu(self, a):
    with self.lock:
      bo, err = self._map_args(a)
      if err: return err
      if not bo.mapped:
        self.memory.map_array(bo.va, bo.array(), system=not bo.flags & kfd.ALLOC_VRAM)   # GTT / userptr: over PCIe
        bo.mapped = True
      a.n_success = a.n_devices
    return 0

  def _ioctl_unmap_memory_from_gpu(self, a):
    with self.lock:
      bo, err = self._map_args(a)
      if err: return err
      if not bo.mapped: return errno.EINVAL
      self.memory.unmap(bo.va)
      bo.mapped = False
      a.n_success = a.n_devices
    return 0

  def mapping_of(self, addr: int):
    """The GPU-mapped BO containing addr (None if unmapped)."""
    with self.lock:
      for bo in self.bos.values():
        if bo.mapped and bo.va <= addr < bo.va + bo.size: return bo
    return None

  # ---- the HDP and the L2 (see the module docstring) ----
  def doorbell_picked_up(self) -> int:
    """An engine starts on commands the host wrote since its last look: the host may have written VRAM meanwhile."""
    with self.lock:
      self.host_epoch += 1
      return self.host_epoch

  def hdp_flush(self) -> None:
    """An HDP flush ran: what the host wrote to VRAM before now is in VRAM."""
    with self.lock: self.hdp_flushed_epoch = self.host_epoch

  def gl2_write_back(self) -> None:
    """A GL2 write-back: the lines SDMA FENCEs left in the L2 reach memory (the host sees them)."""
    with self.lock:
      lines, self.gl2_lines = self.gl2_lines, {}
      for addr, data in lines.items():
        try: self.memory.write(addr, data)
        except Exception: pass              # unmapped since: the line is dropped

  # ---- events (amdkfd/kfd_events.c) ----
  def _ioctl_create_event(self, a):
    # kfd_ioctl_create_event (kfd_chardev.c): "For dGPUs the event page is allocated in user mode. The handle is passed
    # to KFD with the first call to this IOCTL through the event_page_offset field."
    if a.event_page_offset:
      err = self._kmap_event_page(a.event_page_offset)
      if err: return err
    with self.cond:
      a.event_page_offset = 0                                    # kfd_event_create
      if a.event_type == kfd.EVENT_SIGNAL:
        # create_signal_event: -ENOSPC once every mapped slot has an event
        if self.signal_mapped_size and self.signal_event_count == self.signal_mapped_size // 8:
          self.log("kfd: Signal event wasn't created because limit was reached")
          return errno.ENOSPC
        # allocate_event_notification_slot: without a user page the kernel allocates one (mapped to the CPU only, by
        # mmap of KFD_MMAP_TYPE_EVENTS; the GPU cannot write it) and offers the 256 slots old user mode expects;
        # ids come from [0, signal_mapped_size / 8) with 0 taken by kfd_event_init_process
        if self.event_page is None:
          self.event_page = np.full(kfd.SIGNAL_EVENT_LIMIT, UNSIGNALED_SLOT, np.uint64)
          self.signal_mapped_size = OLD_USER_MODE_SLOTS * 8
        event_id = next(i for i in range(1, self.signal_mapped_size // 8) if i not in self.events)
        self.event_page[event_id] = UNSIGNALED_SLOT
        self.signal_event_count += 1
        a.event_page_offset = MMAP_TYPE_EVENTS << MMAP_TYPE_SHIFT    # KFD_MMAP_TYPE_EVENTS
        a.event_slot_index = event_id
        slot = event_id
      else:                                                      # create_other_event: ids past the signal slots
        slot = None
        event_id = next(i for i in range(kfd.SIGNAL_EVENT_LIMIT, 2 * kfd.SIGNAL_EVENT_LIMIT) if i not in self.events)
      self.events[event_id] = Event(event_id, a.event_type, bool(a.auto_reset), slot)
      a.event_id = a.event_trigger_data = event_id
    return 0

  def _kmap_event_page(self, handle: int) -> int:
    """kfd_kmap_event_page (kfd_events.c): the user's BO becomes the process's signal page."""
    if self.event_page is not None:
      self.log("kfd: Event page is already set")
      return errno.EINVAL
    if handle >> 32 != GPU_ID:
      self.log("kfd: Getting device by id failed in kfd_kmap_event_page")
      return errno.EINVAL
    with self.lock:
      bo = self.bos.get(handle)
      if bo is None:
        self.log(f"kfd: Can't find BO, offset is {handle:#x}")
        return errno.EINVAL
      # amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel: a userptr cannot be mapped to the kernel; the BO is pinned to GTT
      # (amdgpu_bo_pin(bo, AMDGPU_GEM_DOMAIN_GTT)) and kmapped. The emulator takes GTT BOs only.
      if bo.host is not None or not bo.flags & kfd.ALLOC_GTT:
        self.log(f"kfd: Failed to map event page to kernel (BO {handle:#x} is not a GTT BO)")
        return errno.EINVAL
      # kfd_event_page_set memsets KFD_SIGNAL_EVENT_LIMIT * 8 bytes of it to UNSIGNALED whatever its size: a smaller
      # BO would have the kernel write past it. The emulator refuses one instead.
      if bo.size < kfd.SIGNAL_EVENT_LIMIT * 8:
        self.log(f"kfd: event page BO of {bo.size:#x} bytes is smaller than the {kfd.SIGNAL_EVENT_LIMIT * 8:#x} bytes "
                 f"kfd_event_page_set initializes")
        return errno.EINVAL
      page = np.frombuffer(bo.kernel_map, np.uint64, count=kfd.SIGNAL_EVENT_LIMIT)
      page[:] = UNSIGNALED_SLOT                                  # "Initialize all events to unsignaled"
      self.event_page, self.signal_mapped_size, self.signal_handle = page, bo.size, handle
    return 0

  def _ioctl_destroy_event(self, a):
    with self.cond:
      e = self.events.pop(a.event_id, None)
      if e is None: return errno.EINVAL
      if e.type == kfd.EVENT_SIGNAL: self.signal_event_count -= 1      # destroy_event
    return 0

  def _ioctl_set_event(self, a):
    with self.cond:
      e = self.events.get(a.event_id)
      if e is None or e.type != kfd.EVENT_SIGNAL: return errno.EINVAL
      e.signaled = True
      self.cond.notify_all()
    return 0

  def _ioctl_wait_events(self, a):
    if a.num_events == 0: return errno.EINVAL
    data = _ffi.cast("uint8_t *", a.events_ptr)
    size = kfd.ffi.sizeof("struct kfd_event_data")
    items = [kfd.ffi.cast("struct kfd_event_data *", int(_ffi.cast("uintptr_t", data)) + i * size) for i in range(a.num_events)]
    deadline = time.monotonic() + (a.timeout / 1000 if a.timeout != 0xFFFFFFFF else 1e9)
    with self.cond:
      events = [self.events.get(it.event_id) for it in items]
      if any(e is None for e in events): return errno.EINVAL
      while True:
        ready = [e.signaled for e in events]
        if (all(ready) if a.wait_for_all else any(ready)):
          for e, it in zip(events, items):
            if e.memory_exception is not None:
              va, not_present, read_only = e.memory_exception
              m = it.memory_exception_data
              m.va, m.gpu_id, m.failure.NotPresent, m.failure.ReadOnly = va, GPU_ID, not_present, read_only
            if e.signaled and e.auto_reset: e.signaled = False
          a.wait_result = kfd.WAIT_COMPLETE
          return 0
        left = deadline - time.monotonic()
        if left <= 0:
          a.wait_result = kfd.WAIT_TIMEOUT
          return 0
        self.cond.wait(left)

  def signal_interrupt(self, partial_id: int, valid_id_bits: int):
    """kfd_signal_event_interrupt (kfd_events.c) for an interrupt whose context carries `valid_id_bits` bits of an event
    id (kfd_int_process_v11.c: CP END_OF_PIPE context_id0 with 32, SDMA_TRAP context_id0 & 0xfffffff with 28). An event
    is set only if its slot in the event page no longer reads UNSIGNALED; its slot is reset as it is set
    (set_event_from_interrupt -> acknowledge_signal). An interrupt whose event's slot reads UNSIGNALED falls back to
    the exhaustive search, which sets only events with written slots: with none, it is ignored."""
    with self.cond:
      slots = self.event_page
      ev = self._lookup_signaled_event_by_partial_id(partial_id, valid_id_bits) if valid_id_bits else None
      if ev is not None: self._set_event_from_interrupt(ev)
      elif slots is not None:
        for event_id, e in sorted(self.events.items()):
          if event_id >= kfd.SIGNAL_EVENT_LIMIT: break
          if int(slots[event_id]) != UNSIGNALED_SLOT: self._set_event_from_interrupt(e)
      self.cond.notify_all()

  def _lookup_signaled_event_by_partial_id(self, event_id: int, bits: int):
    slots = self.event_page
    if slots is None or event_id >= kfd.SIGNAL_EVENT_LIMIT: return None
    if bits > 31 or (1 << bits) >= kfd.SIGNAL_EVENT_LIMIT:    # the fast path: a whole id
      return None if int(slots[event_id]) == UNSIGNALED_SLOT else self.events.get(event_id)
    while event_id < kfd.SIGNAL_EVENT_LIMIT:
      if int(slots[event_id]) != UNSIGNALED_SLOT and event_id in self.events: return self.events[event_id]
      event_id += 1 << bits
    return None

  def _set_event_from_interrupt(self, e: Event):
    if e.type == kfd.EVENT_SIGNAL:                              # event_can_be_gpu_signaled
      self.event_page[e.id] = UNSIGNALED_SLOT                   # acknowledge_signal
      e.signaled = True

  def raise_exception(self, message: str, va: int | None = None, queue=None, code: int | None = None):
    """A queue stopped: log it, then tell the process the way amdkfd does. A GPU VM fault (va given) signals the
    memory-exception events (kfd_signal_vm_fault_event). A compute queue's error (a bad packet, a wave's illegal
    instruction) reaches the runtime through the queue's context-save-area header (`send_exception_to_runtime`).
    An SDMA queue's packet error reaches no process: amdgpu handles SDMA illegal-instruction interrupts for its own
    rings only (sdma_v6_0_process_illegal_inst_irq), so only the kernel log shows it and the waiter times out."""
    self.log(message)
    if va is not None:
      with self.cond:
        for e in self.events.values():
          if e.type == kfd.EVENT_MEMORY: e.signaled, e.memory_exception = True, (va, 1, 0)
        self.cond.notify_all()
    elif queue is not None and queue.kind == "compute":
      self.send_exception_to_runtime(queue, code or kfd.EC["EC_QUEUE_PACKET_UNSUPPORTED"])

  def send_exception_to_runtime(self, queue, code: int):
    """kfd_send_exception_to_runtime -> send_exception_work_handler (kfd_process.c, Linux 6.4+): with the runtime
    enabled, read `err_payload_addr` and `err_event_id` from the queue's context-save-area header with get_user (the
    header must be memory the process maps), OR KFD_EC_MASK(code) into the payload and kfd_set_event(err_event_id).
    A header user mode left zero (event 0, no payload) reports nothing: the queue is just suspended."""
    if not self.runtime_enabled:
      self.log(f"kfd: queue {queue.queue_id} exception {kfd.EXCEPTION_CODES.get(code, code)}: runtime not enabled")
      return
    def user_bytes(addr: int, n: int):
      bo = self.mapping_of(addr)
      if bo is None or (bo.flags & kfd.ALLOC_VRAM and not bo.flags & kfd.ALLOC_PUBLIC) or addr + n > bo.va + bo.size:
        return None                       # get_user faults: no host mapping there
      return bo
    header = queue.csa_addr
    if user_bytes(header, 40) is None:
      self.log(f"kfd: queue {queue.queue_id}: get_user of the context-save-area header at {header:#x} failed")
      return
    with self.lock:
      payload = int.from_bytes(self.memory.read(header + kfd.CSA_ERR_PAYLOAD_ADDR, 8), "little")
      event_id = int.from_bytes(self.memory.read(header + kfd.CSA_ERR_EVENT_ID, 4), "little")
      if payload and user_bytes(payload, 8) is not None:
        cur = int.from_bytes(self.memory.read(payload, 8), "little") | kfd.ec_mask(code)
        self.memory.write(payload, cur.to_bytes(8, "little"))
    with self.cond:
      e = self.events.get(event_id)
      if e is None: return                # kfd_set_event: no such event (0 when the header was never filled)
      e.signaled = True
      self.cond.notify_all()

  def fault(self) -> str | None:
    """What stopped the live queues, as the kernel log says it (the driver adds it to its fault message; the real
    kernel interface returns None)."""
    dead = [f"{q.describe()}: {q.dead}" for q in list(self.queues.values()) if q.dead]
    return "; ".join(dead) or None

  def register_program(self, code_addr: int, source: str | None, name: str, param_base: int, params: list) -> None:
    """Only the kernel's name, which the counters' lines show (counters.py): the emulated gfx1100 runs the machine
    code the driver uploaded (drivers/kernel.py Kernel), a dispatch of unnamed code shows `kernel@<address>`."""
    self.kernel_names[code_addr] = name

  def unregister_program(self, code_addr: int) -> None:
    self.kernel_names.pop(code_addr, None)

  def clock(self) -> int:
    """The GPU clock counter: 100 MHz."""
    return (time.perf_counter_ns() - self.t0) // 10

  # ---- queues ----
  def _ioctl_create_queue(self, a):
    from . import kfd_engines
    if (a.queue_percentage & 0xFF) > kfd.MAX_QUEUE_PERCENTAGE: return errno.EINVAL
    if a.queue_priority > kfd.MAX_QUEUE_PRIORITY: return errno.EINVAL
    if a.ring_size and (a.ring_size & (a.ring_size - 1)): return errno.EINVAL
    if a.ring_base_address == 0 and a.ring_size: return errno.EINVAL
    if a.queue_type not in (kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA, kfd.QUEUE_TYPE_COMPUTE_AQL, kfd.QUEUE_TYPE_SDMA_XGMI):
      return errno.EINVAL
    if not self._gpu(a.gpu_id): return errno.EINVAL
    if self.drm_fd is None: return errno.ENODEV
    if a.queue_type == kfd.QUEUE_TYPE_COMPUTE_AQL:
      self.log("kfd: the emulated CP runs PM4 queues only (no AQL packet processor)")
      return errno.EINVAL
    # kfd_queue_acquire_buffers: each buffer must be exactly one mapped BO of the expected size
    def exact(addr, size, what):
      bo = self.mapping_of(addr)
      if bo is None or addr // PAGE != bo.va // PAGE or (size and bo.size != size):
        self.log(f"kfd: queue {what} at {addr:#x} is not a mapped BO of {size:#x} bytes")
        return False
      return True
    from baregrad.drivers.amd.topology import GPUNode
    node = GPUNode(GPU_NODE, GPU_ID, dict(GPU_PROPERTIES))
    if not (exact(a.write_pointer_address, PAGE, "write pointer") and exact(a.read_pointer_address, PAGE, "read pointer")
            and exact(a.ring_base_address, a.ring_size, "ring")): return errno.EINVAL
    if a.queue_type == kfd.QUEUE_TYPE_COMPUTE:
      if a.eop_buffer_address:
        if a.eop_buffer_size != node.eop_buffer_size or not exact(a.eop_buffer_address, a.eop_buffer_size, "EOP buffer"):
          return errno.EINVAL
      if a.ctl_stack_size != node.ctl_stack_size or a.ctx_save_restore_size < node.cwsr_size: return errno.EINVAL
      total = (a.ctx_save_restore_size + node.debug_memory_size + PAGE - 1) // PAGE * PAGE
      if not exact(a.ctx_save_restore_address, total, "context save area"): return errno.EINVAL
    if self.doorbell_page is None:
      fd = os.memfd_create("kfd-doorbells", os.MFD_CLOEXEC)
      os.ftruncate(fd, DOORBELL_PAGE)
      self.doorbell_page = (fd, _mmap.mmap(fd, DOORBELL_PAGE))
    queue_id = next(i for i in range(1024) if i not in self.queues)
    doorbell = np.frombuffer(self.doorbell_page[1], np.uint64)[queue_id:queue_id + 1]
    doorbell[0] = 0
    cls = kfd_engines.ComputeQueue if a.queue_type == kfd.QUEUE_TYPE_COMPUTE else kfd_engines.SDMAQueue
    q = cls(self, queue_id, a.ring_base_address, a.ring_size, a.read_pointer_address, a.write_pointer_address, doorbell)
    q.csa_addr = a.ctx_save_restore_address
    self.queues[queue_id] = q
    q.start()
    a.queue_id = queue_id
    a.doorbell_offset = (MMAP_TYPE_DOORBELL << MMAP_TYPE_SHIFT) | (GPU_ID << MMAP_GPU_ID_SHIFT) | (queue_id * 8)
    return 0

  def _ioctl_destroy_queue(self, a):
    q = self.queues.pop(a.queue_id, None)
    if q is None: return errno.EINVAL
    q.stop()
    return 0

  # ---- mmap ----
  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    offset &= 2**64 - 1
    path = self.paths.get(fd)
    if fd == -1: target_fd, target_off = -1, 0
    elif path == "/dev/kfd":
      kind = offset >> MMAP_TYPE_SHIFT
      if kind == MMAP_TYPE_DOORBELL and self.doorbell_page is not None and length <= DOORBELL_PAGE \
         and (offset >> MMAP_GPU_ID_SHIFT) & 0xFFFF == GPU_ID:
        target_fd, target_off = self.doorbell_page[0], 0
      elif kind == MMAP_TYPE_EVENTS and self.event_page is not None and length <= self.event_page.nbytes:
        return self._event_mapping(length)
      else:
        self._log_mmap(addr, length, prot, flags, fd, offset, MAP_FAILED)
        self._fail(errno.EINVAL, f"mmap(length={length:#x}, fd={fd} /dev/kfd, offset={offset:#x})")
    elif path is not None and path.startswith("/dev/dri/renderD"):
      bo = self.by_offset.get(offset)
      if bo is None or length > bo.size or bo.memfd is None:
        self._log_mmap(addr, length, prot, flags, fd, offset, MAP_FAILED)
        self._fail(errno.EINVAL, f"mmap(length={length:#x}, fd={fd} {path}, offset={offset:#x}): no such BO")
      # amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu gives VRAM without PUBLIC AMDGPU_GEM_CREATE_NO_CPU_ACCESS, and
      # amdgpu_gem_object_mmap refuses such a BO (-EPERM): the host cannot map device-only VRAM
      if bo.flags & kfd.ALLOC_VRAM and not bo.flags & kfd.ALLOC_PUBLIC:
        self._log_mmap(addr, length, prot, flags, fd, offset, MAP_FAILED)
        self._fail(errno.EPERM, f"mmap(length={length:#x}, fd={fd} {path}, offset={offset:#x}): VRAM BO allocated "
                                f"without PUBLIC (NO_CPU_ACCESS) cannot be mapped by the host")
      target_fd, target_off = bo.memfd, 0
    else:
      self._fail(errno.EBADF, f"mmap(fd={fd})")
    p = _libc.mmap(_ffi.cast("void *", addr), length, prot, flags, target_fd, target_off)
    res = int(_ffi.cast("uintptr_t", p))
    self._log_mmap(addr, length, prot, flags, fd, offset, res)
    if res == MAP_FAILED: self._fail(_ffi.errno, f"mmap(length={length:#x}, fd={fd})")
    return res

  def _event_mapping(self, length: int) -> int:
    # the events page is kernel memory the process maps read-only; a copy-free view of our array
    return int(self.event_page.ctypes.data)

  def _log_mmap(self, addr, length, prot, flags, fd, offset, result):
    kernel_mod.log("mmap", addr=addr, length=length, prot=prot, flags=flags, fd=fd, offset=offset, result=result)

  def munmap(self, addr: int, length: int) -> None:
    if self.event_page is not None and addr == self.event_page.ctypes.data: return
    r = _libc.munmap(_ffi.cast("void *", addr), length)
    kernel_mod.log("munmap", addr=addr, length=length, result=r)
    if r < 0: self._fail(_ffi.errno, f"munmap({addr:#x}, {length:#x})")
