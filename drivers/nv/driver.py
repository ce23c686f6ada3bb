"""The NV driver: NVIDIA GPUs through the kernel driver's RM and UVM ioctls, no CUDA runtime.

Opening the device builds the RM object tree on /dev/nvidiactl (root client, device, subdevice, usermode doorbell
page, a UVM-owned VA space, one GRAPHICS channel group (TSG) with a context share holding the compute GPFIFO channel
and the copy channel, whose DMA-copy object runs on the GR engine's copy engine; the newest compute, DMA-copy, channel
and usermode classes the GPU lists) and registers the GPU, the VA
space and every channel with /dev/nvidia-uvm (a channel in a UVM-owned VA space is schedulable only once bound).

Memory: one address for host and GPU, `view()` is a plain pointer; addresses are driver-chosen, below 2**40, in a
region per kind (VA_REGIONS). `alloc` gives video memory (tensors, programs with their constant banks, QMDs with
constant bank 0, shader local memory): RM's NV01_MEMORY_LOCAL_USER (vidmem.py), GPU-cached, mapped by UVM into the GPU
VA space and for the CPU at the same address through BAR1 (NV_ESC_RM_MAP_MEMORY + mmap of /dev/nvidiaN, write-combined:
host writes are fine, host reads are uncached PCIe round trips, so the driver does not read it: copyout takes the copy
engine). `alloc_polled` gives
pinned host memory: host pages mmapped at the address, described to RM as an OS descriptor
(NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, osdesc.py) and mapped by UVM at the same GPU virtual address. It holds what the host
polls or reads back (signals, the channels' fences, GPFIFO rings, USERD, the error notifier, pushbuffers) and the
staging buffers of copyin/copyout, which move video memory through the DMA-copy channel, two staging buffers in turn
(the host copies one chunk while the engine moves the other); small writes go through BAR1. Kernel arguments are read by
the host (copied into constant bank 0 at submit): `alloc_args` gives them pinned host memory. `map_host` maps host pages another device allocated (at their own
address, below 2**47 on Ampere/Ada, 2**56 on Hopper) as an OS descriptor: the DMA-copy channel then copies between the
two devices' memory (hcq/transfer.py) and semaphores reach the other's signals.

Queues: HWQueue commands become pushbuffer methods (pushbuf.py): `exec` -> a QMD (qmd.py) + SEND_PCAS, `copy` ->
DMA-copy class methods, `signal`/`wait`/`timestamp` -> host semaphore release/acquire. `encode` only builds the words
(a launch's SEND_PCAS_A word is a `Launch` fixup); `submit`/`bind` write each launch's QMD and constant bank 0 into
launch memory and fill in its address. `submit` writes the pushbuffer, one GPFIFO entry per segment, GPPut in USERD
and the work-submit token to the usermode doorbell.
A driver-owned fence semaphore per channel (released after each submission) tells when launch memory is free.

Kernel arguments: the kernel reads its parameters from constant bank 0 (at the cubin's parameter base); the
driver copies the argument words from the hcq kernarg address into each launch's bank 0 when the pushbuffer is
written (eager) or submitted (bound queues, so a JIT replay's patched arguments are seen). Bank 0's driver area gets
what ptxas code reads there (cubin.DRIVER_AREA: %ntid, %nctaid, the shared and local windows, the stack pointer);
every other constant bank of the cubin (bank 2: ptxas's 64-bit immediates) is uploaded with the code and bound.

Channel state a launch relies on is sent at the head of the next compute submission (`_state_words`): local memory
(SET_SHADER_LOCAL_MEMORY_A/B and _NON_THROTTLED_A/B/C, grown when a kernel's stack needs more) and an instruction-
cache invalidation after program memory was written (a freed program's memory is reused for the next one).
"""
from __future__ import annotations
import bisect, dataclasses, os, re, time, struct
from dataclasses import dataclass, field
import cffi
import numpy as np
from .. import kernel as kernel_mod, settings
from ..encoded import Encoded, Encoder, Fixup, lo32, hi32
from ..hostcopy import StagedCopies
from ..allochistory import AllocationHistory
from ..markers import Marker, TraceMarkers, describe, launch_args
from . import rm, qmd, osdesc, vidmem, pushbuf as pb
from .cubin import compile_ptx, load_cubin, DRIVER_AREA, STACK_TOP
from .rm import ffi

_ffi = cffi.FFI()
# pointer types resolved once: the host reads fences and the error notifier, and rings the doorbell, on every submit
_U16P, _U32P, _U64P = (_ffi.typeof(f"volatile uint{n}_t *") for n in (16, 32, 64))
VA_BASE, VA_LIMIT = 0x20_0000_0000, 1 << 40      # driver-chosen host == GPU addresses (GPFIFO GET_HI is 8 bits)
MAP_FIXED_NOREPLACE = 0x100000                    # <linux/mman.h>
PAGE = 0x1000
OVERRUN = 0x10000
PARAM_GATHER_SPAN = 1 << 30    # a bound pushbuffer gathers its launches' parameters in one numpy copy when they lie within this
GPFIFO_ENTRIES = 1024
# VA regions, by the page size of what lies there: pinned host memory in 4 KiB pages, video memory in 64 KiB and in
# 2 MiB pages (vidmem.placement). Within a region allocations lie back to back at their page alignment (see OVERRUN);
# a 2 MiB-page allocation at a 2 MiB-aligned address gets 2 MiB PTEs from UVM. What the channel fetches by a 40-bit
# address (pushbuffers: pinned memory; QMDs: SEND_PCAS_A holds address >> 8 in 32 bits, launch arenas take 64 KiB
# pages) lies below 2**40; 2 MiB-page video memory (the big tensors) above, up to 2**46 (UVM addresses user VAs below
# 2**47 on Ampere/Ada, 2**56 on Hopper; Linux places its own mappings near 2**47).
VA_REGIONS = {PAGE: (VA_BASE, 0x40_0000_0000), vidmem.PAGE_64K: (0x40_0000_0000, VA_LIMIT),
              vidmem.PAGE_2M: (VA_LIMIT, 1 << 46)}
_va_cursor = {page: lo for page, (lo, _) in VA_REGIONS.items()}   # process-wide: every NVDriver shares the address space
SHARED_WINDOW, LOCAL_WINDOW = 0xFE00_0000, 0xFF00_0000   # generic-address windows (driver's choice, below VA_BASE)
# Hopper forms a generic shared address as SR_SWINHI (the window's high 32 bits) : offset, so its window is 4 GiB
# aligned and spans 4 GiB (Mesa NVK nvk_cmd_dispatch.c "shared memory window needs 4GB alignment on hopper+", 1 << 32;
# ptxas sm_90 cvta.shared); [4 GiB, 8 GiB) is free of the local window and of every allocation (VA_BASE up)
SHARED_WINDOW_HOPPER = 1 << 32
CHANNEL_VA_ALIGN = 2 << 20    # a GR channel's context-buffer region (UVM_REGISTER_CHANNEL): 2 MiB aligned, its size
                              # from NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE rounded up to 2 MiB
CONST_BANK_ALIGN = 256        # constant banks are placed at 256-byte boundaries after a program's code

# Per SM architecture: (resident warps per SM, SMs per TPC, TPCs of the largest chip of the architecture, the shared
# memory carveouts an SM can be set to in KiB). Warps and carveouts: CUDA C++ Programming Guide, "Compute
# Capabilities" (technical specifications table; "Shared Memory" of 8.x and 9.0); TPCs: NVIDIA's architecture
# whitepapers (full GA100 128 SMs, GA102 84, AD102 144, GH100 144; two SMs per TPC). Local memory is sized for the
# full chip because the hardware places each TPC's slice at base + TPC index * bytes per TPC.
SM_LIMITS = {
  "sm_80": (64, 2, 64, (0, 8, 16, 32, 64, 100, 132, 164)),
  "sm_86": (48, 2, 42, (0, 8, 16, 32, 64, 100)),
  "sm_89": (48, 2, 72, (0, 8, 16, 32, 64, 100)),
  "sm_90": (64, 2, 72, (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)),
}
MIN_CARVEOUT = 8 << 10         # the smallest nonzero carveout, as Mesa NVK picks (gv100_sm_config_smem_size)


class NVError(RuntimeError):
  pass


class ChannelReset(NVError):
  """A channel faulted (not a memory fault); the driver reallocated its channels, so the device is usable again."""
  queues_reset = True


class ChannelTimeout(TimeoutError):
  pass


class RMError(NVError):
  """An RM or UVM call returned a status other than NV_OK."""
  def __init__(self, what: str, status: int):
    self.status = status
    super().__init__(f"{what} failed: {rm.status_name(status)}")


class EscapeError(NVError, OSError):
  """The kernel module's escape layer refused an ioctl (-EINVAL and no RM status): wrong size or wrong file."""
  def __init__(self, message: str, errno_: int):
    NVError.__init__(self, message)
    self.errno = errno_


class HostMapError(RMError, OSError):
  """RM or UVM refused to map host memory for the GPU (map_host): an OSError, so hcq copies another way."""
  def __init__(self, message: str, status: int):
    self.status = status
    NVError.__init__(self, message)


@dataclass(eq=False)
class NVMemory:
  addr: int
  nbytes: int
  mapped: int
  handle: int
  host_mapped: bool = False     # pages another allocation owns, mapped for the GPU (map_host): not ours to munmap
  video: bool = False           # video memory (NV01_MEMORY_LOCAL_USER, the CPU's mapping through BAR1); else pinned host
  page: int = PAGE              # the VA region it lies in (VA_REGIONS)


@dataclass(eq=False)
class Channel:
  name: str
  handle: int
  ring: NVMemory
  userd: NVMemory
  token: int
  fence: NVMemory
  fence_value: int = 0
  put: int = 0
  subchannels: dict = field(default_factory=dict)   # subchannel -> class
  cls: int = 0                                      # channel class and engine type, to allocate it again
  engine: int = 0
  group: int = 0                                    # its channel group (TSG)
  window: tuple = (0, 0)                            # (base, bytes) registered with UVM for its context buffers
  local_generation: int = 0                         # the local memory its method stream last set up
  # per GPFIFO entry, the fence value of the submission that last wrote it: an entry is free again once the channel's
  # fence reached that value (the GPU's GP_GET in USERD is written back only when its PBDMA idles: dev_pbdma.ref.txt)
  slots: list = field(default_factory=lambda: [0] * GPFIFO_ENTRIES)
  code_generation: int = 0                          # program memory writes its last invalidation covered
  views: tuple | None = None                        # (GPFIFO words, USERD words) as the host writes them
  fence_template: tuple | None = None               # (the fence release's words, where the value's two words go)


class RMClient:
  """RM escapes on /dev/nvidiactl; every status checked."""

  def __init__(self, kernel, fd_ctl: int):
    self.k, self.fd_ctl = kernel, fd_ctl
    self.root = 0
    self._next = 0xBA000001

  def escape(self, fd: int, nr: int, params, fields=None):
    name = rm.ESCAPES[nr][0]
    try:
      self.k.ioctl(fd, rm.escape_request(nr), params, name=name, fields=fields)
    except kernel_mod.KernelCallError as e:
      # errors of the escape layer come back from the ioctl itself, the status untouched (escape.c, nv.c nvidia_ioctl):
      # the parameter struct's size or the file is not what this module takes
      raise EscapeError(f"{name}: the NVIDIA kernel module refused the call itself ({e}): the parameter size "
                        f"({ffi.sizeof(params[0]) if isinstance(params, ffi.CData) else '?'} bytes) or the file it "
                        f"went to is not what this module version takes; baregrad's structures are written for the "
                        f"{', '.join(s + '.x' for s in rm.SUPPORTED_SERIES)} driver series", e.errno) from e
    return params

  def new_handle(self) -> int:
    self._next += 1
    return self._next

  def alloc(self, parent: int, cls: int, params=None, handle: int | None = None) -> int:
    p = ffi.new("NVOS21_PARAMETERS *")
    p.hRoot, p.hObjectParent, p.hClass = self.root, parent, cls
    p.hObjectNew = self.new_handle() if handle is None else handle
    if params is not None:
      p.pAllocParms, p.paramsSize = int(ffi.cast("uintptr_t", params)), ffi.sizeof(params[0])
    self.escape(self.fd_ctl, rm.NV_ESC_RM_ALLOC, p, lambda: {"hParent": parent, "hClass": cls, "hNew": p.hObjectNew, "status": p.status})
    if p.status != rm.NV_OK:
      raise RMError(f"NV_ESC_RM_ALLOC of {rm.class_name(cls)} under handle {parent:#x}", p.status)
    return p.hObjectNew

  def control(self, obj: int, cmd: int, params=None):
    name, struct_name = rm.CONTROLS[cmd]
    params = ffi.new(struct_name + " *") if params is None else params
    p = ffi.new("NVOS54_PARAMETERS *")
    p.hClient, p.hObject, p.cmd = self.root, obj, cmd
    p.params, p.paramsSize = int(ffi.cast("uintptr_t", params)), ffi.sizeof(params[0])
    self.escape(self.fd_ctl, rm.NV_ESC_RM_CONTROL, p, lambda: {"hObject": obj, "cmd": cmd, "status": p.status})
    if p.status != rm.NV_OK: raise RMError(f"NV_ESC_RM_CONTROL {name} ({cmd:#x}) on handle {obj:#x}", p.status)
    return params

  def free(self, parent: int, handle: int):
    p = ffi.new("NVOS00_PARAMETERS *")
    p.hRoot, p.hObjectParent, p.hObjectOld = self.root, parent, handle
    self.escape(self.fd_ctl, rm.NV_ESC_RM_FREE, p)
    if p.status != rm.NV_OK: raise RMError(f"NV_ESC_RM_FREE of handle {handle:#x}", p.status)


def driver_version(k, fd_ctl: int) -> str:
  """The running kernel driver's version: NV_ESC_CHECK_VERSION_STR with the QUERY command (nv-ioctl.h)."""
  p = ffi.new("nv_ioctl_rm_api_version_t *")
  p.cmd = rm.NV_RM_API_VERSION_CMD_QUERY
  k.ioctl(fd_ctl, rm.escape_request(rm.NV_ESC_CHECK_VERSION_STR), p, name="NV_ESC_CHECK_VERSION_STR")
  version = ffi.string(p.versionString).decode(errors="replace")
  if not version and k.exists("/proc/driver/nvidia/version"):
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", k.read_text("/proc/driver/nvidia/version"))
    version = m.group(1) if m else ""
  return version


def check_version(version: str):
  series = version.split(".")[0]
  if series not in rm.SUPPORTED_SERIES:
    raise NVError(f"NVIDIA kernel driver {version or '(unknown version)'} is not supported: the RM ioctl structures change "
                  f"between driver series and baregrad's are written for the {', '.join(s + '.x' for s in rm.SUPPORTED_SERIES)} "
                  f"series (checked against {rm.HEADERS_VERSION}). Install a {rm.SUPPORTED_SERIES[-1]} driver.")


class NVDriver(StagedCopies, TraceMarkers):     # copyin/copyout of video memory through the copy channel
  word_log = None         # CAPTURE: a drivers/decode.py WordLog of what the channels get
  name = "NV"
  has_copy_queue = True    # a DMA-copy channel beside the compute channel (hcq graphs put copies there)
  timestamp_hz = 1_000_000_000   # semaphore release timestamps are the GPU's globaltimer, in ns

  def __init__(self, kernel=None, timeout: float = 30.0):
    self.k = kernel if kernel is not None else kernel_mod.interface("NV")
    self.timeout = timeout           # seconds a full GPFIFO may stay full
    self._stalled = None             # (address, value, seen, timeout) of the last wait that timed out
    self._live: dict[int, NVMemory] = {}   # mapped allocations, unmapped by close()
    self.history = AllocationHistory()      # allocations and frees, for naming fault addresses
    self._live_addrs: list[int] = []       # their addresses, sorted (which allocation holds an address)
    self._stage = None                     # copyin/copyout: two pinned staging buffers and their signal, on first use
    self._guards: list[NVMemory] = []      # the first page of each video-memory VA region (see _alloc_video)
    self._host_maps: dict[int, NVMemory] = {}   # other allocations' pages this GPU maps (map_host)
    if not self.k.exists("/dev/nvidiactl"):
      raise NVError("NV device: /dev/nvidiactl does not exist: the NVIDIA kernel driver is not loaded (or this machine has "
                    "no NVIDIA GPU). Load the nvidia and nvidia-uvm modules, use EMU=1 for the emulated GPU, or DEV=CPU.")
    self.fd_ctl = self.k.open("/dev/nvidiactl")
    self.version = driver_version(self.k, self.fd_ctl)
    check_version(self.version)
    self.rm = RMClient(self.k, self.fd_ctl)
    self.rm.root = self.rm.alloc(0, rm.NV01_ROOT_CLIENT, handle=0)
    cards = ffi.new(f"nv_ioctl_card_info_t[{rm.NV_MAX_DEVICES}]")
    self.rm.escape(self.fd_ctl, rm.NV_ESC_CARD_INFO, cards)
    valid = [c for c in cards if c.valid]
    if not valid: raise NVError("NV device: the NVIDIA driver reports no GPU (NV_ESC_CARD_INFO)")
    self.minor = valid[0].minor_number
    self.dev_path = f"/dev/nvidia{self.minor}"
    self.fd_dev = self._open_device()
    self.fd_uvm = self.k.open("/dev/nvidia-uvm")
    self._uvm(rm.UVM_INITIALIZE, flags=0)
    self.fd_uvm_mm = self.k.open("/dev/nvidia-uvm")
    p = ffi.new("UVM_MM_INITIALIZE_PARAMS *"); p.uvmFd = self.fd_uvm
    self._uvm_call(self.fd_uvm_mm, rm.UVM_MM_INITIALIZE, p, ok=(rm.NV_OK, rm.STATUS["NV_WARN_NOTHING_TO_DO"]))   # 0x10006 (nvstatuscodes.h): va_space_mm off
    dp = ffi.new("NV0080_ALLOC_PARAMETERS *")
    dp.deviceId, dp.hClientShare, dp.vaMode = 0, self.rm.root, 2   # NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES (nvos.h)
    self.device = self.rm.alloc(self.rm.root, rm.NV01_DEVICE_0, dp)
    self.subdevice = self.rm.alloc(self.device, rm.NV20_SUBDEVICE_0, ffi.new("NV2080_ALLOC_PARAMETERS *"))
    classes = self.rm.control(self.device, rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2)
    listed = set(classes.classList[0:classes.numClasses])
    picked = {kind: [c for c in known if c in listed] for kind, known in
              (("compute", rm.COMPUTE_CLASSES), ("copy", rm.COPY_CLASSES), ("channel", rm.CHANNEL_CLASSES),
               ("usermode", rm.USERMODE_CLASSES))}
    if not all(picked.values()):
      missing = ", ".join(kind for kind, found in picked.items() if not found)
      raise NVError(f"NV device: the GPU lists no supported {missing} class (supported: Ampere, Ada, Hopper; "
                    f"GPU classes: {sorted(hex(c) for c in listed)})")
    self.compute_class, self.copy_class = picked["compute"][0], picked["copy"][0]
    self.channel_class, self.usermode_class = channel_class, usermode_class = picked["channel"][0], picked["usermode"][0]
    self.target, self.qmd_version = rm.COMPUTE_CLASSES[self.compute_class]   # sm_90, (4, 0)
    self.shared_window = SHARED_WINDOW_HOPPER if int(self.target[3:]) >= 90 else SHARED_WINDOW
    self.qmd_table = qmd.TABLES[self.qmd_version]
    self.warps_per_sm, self.sms_per_tpc, self.tpcs, carveouts = SM_LIMITS[self.target]
    self.carveouts = [kib << 10 for kib in carveouts if kib << 10 >= MIN_CARVEOUT]
    gid = ffi.new("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS *")
    gid.flags = rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY
    self.rm.control(self.subdevice, rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO, gid)
    self.uuid = bytes(gid.data[0:16])
    self.vram_bytes = self._fb_info("TOTAL_RAM_SIZE")[0]     # the GPU's memory (143771 MiB on an H200)
    self._uvm(rm.UVM_REGISTER_GPU, gpu_uuid=self.uuid, rmCtrlFd=self.fd_ctl, hClient=self.rm.root)
    # usermode doorbell page
    self.usermode = self.rm.alloc(self.subdevice, usermode_class)
    self.doorbell = self._map_object(self.subdevice, self.usermode, pb.USERMODE_BYTES)
    # VA space owned by UVM, channel group, context share
    vp = ffi.new("NV_VASPACE_ALLOCATION_PARAMETERS *")
    vp.vaBase = PAGE
    vp.flags = rm.NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING | rm.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED
    self.vaspace = self.rm.alloc(self.device, rm.FERMI_VASPACE_A, vp)
    self._uvm(rm.UVM_REGISTER_GPU_VASPACE, gpuUuid=self.uuid, rmCtrlFd=self.fd_ctl, hClient=self.rm.root, hVaSpace=self.vaspace)
    self._free_va: dict[tuple, list] = {}   # (region page size, bytes) -> freed addresses
    self._free_windows: list[tuple] = []     # (base, bytes) of GR channels' context-buffer regions, to reuse
    self._group_windows: dict = {}           # channel group -> the region its channels registered
    self.error_notifier = self.alloc_polled(PAGE)
    # trace markers (drivers/markers.py): after each command a channel releases that command's sequence number into
    # its slot here (a semaphore release after WFI: the command is done), pinned memory the host reads
    self.marker_page = self.alloc_polled(PAGE)
    self._init_markers(settings.QUEUE_MARKERS, {"compute": self.marker_page.addr, "copy": self.marker_page.addr + 16})
    # One TSG on the GR engine holds both channels: RM ties a TSG and every channel in it to the runlist of the TSG's
    # engine and rejects a channel whose engineType differs from its TSG's (kchannelConstruct, kernel_channel.c), so
    # the copy channel takes the TSG's engine (engineType GRAPHICS) and its DMA-copy object runs on the GR engine's
    # copy engine (GRCE; chandesConstruct, channel_descendant.c) -- the layout tinygrad runs on hardware. A CE-only TSG
    # on COPY0, a GRCE on GH100 (kernel_ce_gh100.c), is a layout neither UVM nor RM's CeUtils use that way.
    self._make_groups()
    self.channels = {
      "compute": self._channel("compute", channel_class, rm.NV2080_ENGINE_TYPE_GRAPHICS,
                               {pb.SUBC_COMPUTE: self.compute_class, pb.SUBC_COPY: self.copy_class}),
      "copy": self._channel("copy", channel_class, rm.NV2080_ENGINE_TYPE_GRAPHICS, {pb.SUBC_COPY: self.copy_class}),
    }
    self._schedule()
    self._arenas: list = []          # launch/pushbuffer memory: [memory, offset, live blocks]
    self._inflight: list = []        # (channel, fence value, arena) of eager blocks
    self._ptx: dict[bytes, str] = {}
    self._local = None               # (memory, bytes per thread, bytes per TPC) of the shader local memory
    self._local_generation = 0       # bumped when the local memory changes
    self._local_retired: list = []   # [memory, channel, fence value]: freed once that channel passed the value
    self._code_generation = 1        # bumped whenever program memory is written
    # program memory (code and its constant banks) is written by the compute channel itself (I2M) at its next
    # submission: address -> bytes of every live program, and the addresses of those not written yet (all of them
    # again after a channel reset dropped the work queued)
    self._programs: dict[int, bytes] = {}
    self._uploads: set[int] = set()
    self.sass_version = int(self.target[3:], 16)   # sm_90 -> 0x90 (SASS_VERSION holds the sm as two hex digits)
    for ch in self.channels.values(): self._submit_words(ch, self._init_words(ch))

  # ---- kernel plumbing ----
  def _open_device(self) -> int:
    fd = self.k.open(self.dev_path)
    p = ffi.new("nv_ioctl_register_fd_t *"); p.ctl_fd = self.fd_ctl
    self.rm.escape(fd, rm.NV_ESC_REGISTER_FD, p)
    return fd

  def _uvm_call(self, fd: int, cmd: int, p, ok=(rm.NV_OK,)):
    name = rm.UVM_IOCTLS[cmd][0]
    self.k.ioctl(fd, cmd, p, name=name, fields=lambda: {"rmStatus": p.rmStatus})
    if p.rmStatus not in ok: raise RMError(f"{name} on /dev/nvidia-uvm", p.rmStatus)
    return p

  def _uvm(self, cmd: int, **values):
    p = ffi.new(rm.UVM_IOCTLS[cmd][1] + " *")
    for k, v in values.items():
      if isinstance(v, bytes): getattr(p, k)[0:len(v)] = v
      else: setattr(p, k, v)
    return self._uvm_call(self.fd_uvm, cmd, p)

  def _map_object(self, parent: int, handle: int, length: int) -> int:
    """NV_ESC_RM_MAP_MEMORY on a fresh /dev/nvidiaN fd, then mmap of that fd: a CPU mapping of an RM object."""
    fd = self._open_device()
    p = ffi.new("nv_ioctl_nvos33_parameters_with_fd *")
    p.params.hClient, p.params.hDevice, p.params.hMemory, p.params.length, p.fd = self.rm.root, parent, handle, length, fd
    self.rm.escape(self.fd_ctl, rm.NV_ESC_RM_MAP_MEMORY, p)
    if p.params.status != rm.NV_OK: raise RMError(f"NV_ESC_RM_MAP_MEMORY of handle {handle:#x}", p.params.status)
    return self.k.mmap(0, length, kernel_mod.PROT_READ | kernel_mod.PROT_WRITE, kernel_mod.MAP_SHARED, fd, 0)

  def _channel(self, name: str, cls: int, engine: int, subchannels: dict) -> Channel:
    """A GPFIFO channel in the TSG of `engine`, its objects, its work-submit token, registered with UVM."""
    ring, userd = self.alloc_polled(GPFIFO_ENTRIES * pb.GP_ENTRY_BYTES), self.alloc_polled(PAGE)    # the host reads them
    p = ffi.new("NV_CHANNEL_ALLOC_PARAMS *")
    p.hObjectError, p.gpFifoOffset, p.gpFifoEntries = self.error_notifier.handle, ring.addr, GPFIFO_ENTRIES
    p.hContextShare, p.hUserdMemory[0], p.userdOffset[0], p.engineType = self.ctxshares[engine], userd.handle, 0, engine
    handle = self.rm.alloc(self.groups[engine], cls, p)
    for c in dict.fromkeys(subchannels.values()): self.rm.alloc(handle, c)
    token = self.rm.control(handle, rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN).workSubmitToken
    # UVM_REGISTER_CHANNEL maps the channel's context buffers into the VA space and binds them (nvGpuOpsBindChannel-
    # Resources sets bIsContextBound, rmapi/nv_gpu_ops.c); RM schedules a GR channel of an externally owned VA space only
    # once bound (kchannelIsSchedulable, gpu/fifo/kernel_channel.c; else NVA06C_CTRL_CMD_GPFIFO_SCHEDULE returns
    # NV_ERR_INVALID_STATE, kernel_channel_group_api.c). The region: driver-chosen VA no allocation uses.
    # Its size and alignment come from NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE (uvm.h, UvmRegisterChannel); UVM places
    # each buffer at its own alignment inside the region (up to 2 MiB, uvm_user_channel.c create_va_range), so the
    # region starts 2 MiB aligned and spans the reported size rounded up to 2 MiB. A copy channel has no buffers.
    # The channels of one TSG share its context, so they register one region (as CUDA does).
    window, group = (0, 0), self.groups[engine]
    if engine == rm.NV2080_ENGINE_TYPE_GRAPHICS and group in self._group_windows: window = self._group_windows[group]
    elif engine == rm.NV2080_ENGINE_TYPE_GRAPHICS:
      sp = ffi.new("NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS *"); sp.hChannel = handle
      size = -(-self.rm.control(self.subdevice, rm.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE, sp).totalBufferSize
               // CHANNEL_VA_ALIGN) * CHANNEL_VA_ALIGN
      reuse = [w for w in self._free_windows if w[1] == size]
      if reuse: self._free_windows.remove(reuse[0])
      window = self._group_windows[group] = reuse[0] if reuse else (self._take_va(size, align=CHANNEL_VA_ALIGN), size)
    self._uvm(rm.UVM_REGISTER_CHANNEL, gpuUuid=self.uuid, rmCtrlFd=self.fd_ctl, hClient=self.rm.root, hChannel=handle,
              base=window[0], length=window[1])
    return Channel(name, handle, ring, userd, token, self.alloc_polled(PAGE), subchannels=subchannels, cls=cls,
                   engine=engine, group=self.groups[engine], window=window)

  def _make_groups(self):
    """The channel groups and their context shares (again after a channel error: RM's recovery works on the whole
    TSG, and nothing shows a TSG usable after it, kernel_channel.c bIsRcPending; CUDA treats the context as lost)."""
    self.groups, self.ctxshares = {}, {}
    for engine in (rm.NV2080_ENGINE_TYPE_GRAPHICS,):
      gp = ffi.new("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS *")
      gp.engineType = engine
      self.groups[engine] = self.rm.alloc(self.device, rm.KEPLER_CHANNEL_GROUP_A, gp)
      cp = ffi.new("NV_CTXSHARE_ALLOCATION_PARAMETERS *")
      cp.hVASpace, cp.flags = self.vaspace, rm.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC
      self.ctxshares[engine] = self.rm.alloc(self.groups[engine], rm.FERMI_CONTEXT_SHARE_A, cp)
    self.group, self.ctxshare = self.groups[rm.NV2080_ENGINE_TYPE_GRAPHICS], self.ctxshares[rm.NV2080_ENGINE_TYPE_GRAPHICS]

  def _schedule(self):
    for group in self.groups.values():
      sp = ffi.new("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS *"); sp.bEnable = 1
      self.rm.control(group, rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, sp)

  def _init_words(self, ch: Channel) -> list[int]:
    p = pb.Pushbuffer()
    for subc, cls in ch.subchannels.items(): p.method(subc, pb.SET_OBJECT, cls)
    if pb.SUBC_COMPUTE in ch.subchannels:
      p.method(pb.SUBC_COMPUTE, pb.SET_SHADER_SHARED_MEMORY_WINDOW_A, self.shared_window >> 32, self.shared_window & 0xFFFFFFFF)
      p.method(pb.SUBC_COMPUTE, pb.SET_SHADER_LOCAL_MEMORY_WINDOW_A, LOCAL_WINDOW >> 32, LOCAL_WINDOW & 0xFFFFFFFF)
    return p.words

  def _state_words(self, ch: Channel) -> list[int]:
    """Methods the compute channel needs before the launches of the submission being written: the current local
    memory, and an instruction-cache invalidation if program memory was written since its last one (the SMs' caches
    would otherwise run the instructions a freed program left at a reused address; the QMD's INVALIDATE_SHADER_*
    bits cover data and constants on every launch, code only here)."""
    if pb.SUBC_COMPUTE not in ch.subchannels: return []
    p = pb.Pushbuffer()
    if ch.local_generation != self._local_generation and self._local is not None:
      mem, _per_thread, per_tpc = self._local
      p.method(pb.SUBC_COMPUTE, pb.SET_SHADER_LOCAL_MEMORY_A, hi32(mem.addr), lo32(mem.addr))
      p.method(pb.SUBC_COMPUTE, pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, hi32(per_tpc), lo32(per_tpc),
               self.tpcs * self.sms_per_tpc)
      for retired in self._local_retired:      # what this channel used before is free once this submission is done
        if retired[1] is None: retired[1:] = [ch, ch.fence_value + 1]
      ch.local_generation = self._local_generation
    for addr in sorted(self._uploads):       # programs loaded since: their code and constant banks, inline
      image = self._programs[addr]
      for off in range(0, len(image), 4 * pb.I2M_MAX_WORDS):
        chunk = image[off:off + 4 * pb.I2M_MAX_WORDS]
        p.inline_to_memory(hi32(addr + off), lo32(addr + off), len(chunk), list(_le_words(chunk)))
    self._uploads.clear()
    return p.words + self._code_invalidation(ch)

  def _code_invalidation(self, ch: Channel) -> list[int]:
    """INVALIDATE_SHADER_CACHES_NO_WFI(INSTRUCTION) when program memory was written since the channel's last one."""
    if ch.code_generation == self._code_generation: return []
    ch.code_generation = self._code_generation
    return pb.Pushbuffer().method(pb.SUBC_COMPUTE, pb.INVALIDATE_SHADER_CACHES_NO_WFI,
                                  pb.INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION).words

  def _ensure_local_memory(self, per_thread: int):
    """Shader local memory for `per_thread` bytes per thread (SHADER_LOCAL_MEMORY_*_SIZE of a QMD): every resident warp
    of every TPC gets its slice (a warp's 32 threads rounded to 512 bytes, a TPC's slice to 32 KiB: the granules
    tinygrad's NV runtime uses on real GPUs)."""
    if per_thread == 0 or (self._local is not None and self._local[1] >= per_thread): return
    per_thread = (per_thread + 255) // 256 * 256
    per_warp = (per_thread * 32 + 0x1FF) // 0x200 * 0x200
    per_tpc = (per_warp * self.warps_per_sm * self.sms_per_tpc + 0x7FFF) // 0x8000 * 0x8000
    mem = self.alloc(per_tpc * self.tpcs)
    if self._local is not None: self._local_retired.append([self._local[0], None, 0])
    self._local = (mem, per_thread, per_tpc)
    self._local_generation += 1

  # ---- memory ----
  # OVERRUN bytes of slack after each buffer: codegen's GPU kernels load (not store) past the end for the masked-off
  # threads of the last block; on the GPU an unmapped address faults (drivers/emu/README.md)
  def alloc(self, nbytes: int) -> NVMemory:
    """Video memory (see the module docstring): tensors, programs, launch memory, local memory."""
    page, size = vidmem.placement(nbytes + OVERRUN)
    if _va_cursor[page] == VA_REGIONS[page][0]:     # nothing before the region's first allocation to read: a guard
      self._guards.append(self._alloc_video(page, page, page))
    return self._alloc_video(nbytes, size, page)

  def alloc_args(self, nbytes: int):
    """Kernel arguments: pinned host memory. Only the host reads them (it copies them into a launch's constant bank 0
    at submit), so in video memory every launch would read them through BAR1."""
    return self.alloc_polled(nbytes)

  def alloc_polled(self, nbytes: int) -> NVMemory:
    """Pinned host memory (OS descriptors) for what the host polls or reads back: signals (hcq/driver.py), and the
    driver's fences, GPFIFO rings, USERD, error notifier, pushbuffers and copy staging."""
    size = (max(nbytes, 1) + OVERRUN + PAGE - 1) // PAGE * PAGE
    addr = self._va(PAGE, size)
    while True:
      try:
        self.k.mmap(addr, size, kernel_mod.PROT_READ | kernel_mod.PROT_WRITE,
                    kernel_mod.MAP_SHARED | kernel_mod.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
        break
      except kernel_mod.KernelCallError as e:   # the range is taken (another mapping in this process): the next one
        if e.errno != 17: raise               # EEXIST
        addr = self._take_va(size)
    handle = self._os_descriptor(addr, size)
    self._uvm_map(addr, size, handle)
    return self._track(NVMemory(addr, nbytes, size, handle))

  def _alloc_video(self, nbytes: int, size: int, page: int) -> NVMemory:
    """`size` bytes (whole pages of `page` bytes) of video memory: RM's allocation, its CPU mapping through BAR1 at a
    driver-chosen address and UVM's GPU mapping at the same address. MemoryError when the GPU's memory is full."""
    p = ffi.new("NV_MEMORY_ALLOCATION_PARAMS *")
    vidmem.request(p, self.rm.root, size, page)
    try: handle = self.rm.alloc(self.device, rm.NV01_MEMORY_LOCAL_USER, p)
    except RMError as e:
      if e.status != rm.STATUS["NV_ERR_NO_MEMORY"]: raise
      total, free = self._fb_info("HEAP_SIZE", "HEAP_FREE")
      raise MemoryError(f"{self.name}: out of GPU memory allocating {size} bytes of video memory: {free >> 20} MiB of "
                        f"{total >> 20} MiB free (NV01_MEMORY_LOCAL_USER: {rm.status_name(e.status)})") from None
    try:
      addr = self._bar1_map(handle, size, page)
      try: self._uvm_map(addr, size, handle)
      except BaseException:
        self.k.munmap(addr, size)
        self._free_va.setdefault((page, size), []).append(addr)
        raise
    except BaseException:
      self.rm.free(self.device, handle)
      raise
    return self._track(NVMemory(addr, nbytes, size, handle, video=True, page=page))

  def _bar1_map(self, handle: int, size: int, page: int) -> int:
    """Map video memory object `handle` for the CPU at a driver-chosen address of region `page`: NV_ESC_RM_MAP_MEMORY
    (NVOS33) naming a fresh /dev/nvidiaN fd, then mmap of that fd at offset 0 and the whole length (vidmem.py). The
    fd is closed after: the mapping keeps the file (and RM's mapping context on it) alive."""
    fd = self._open_device()
    try:
      p = ffi.new("nv_ioctl_nvos33_parameters_with_fd *")
      p.params.hClient, p.params.hDevice, p.params.hMemory, p.params.offset, p.params.length = \
        self.rm.root, self.device, handle, 0, size
      p.fd = fd
      self.rm.escape(self.fd_ctl, rm.NV_ESC_RM_MAP_MEMORY, p, lambda: {"hMemory": handle, "length": size, "status": p.params.status})
      if p.params.status != rm.NV_OK:
        raise RMError(f"NV_ESC_RM_MAP_MEMORY of {size:#x} bytes of video memory (handle {handle:#x})", p.params.status)
      addr = self._va(page, size)
      while True:
        try:
          got = self.k.mmap(addr, size, kernel_mod.PROT_READ | kernel_mod.PROT_WRITE,
                            kernel_mod.MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0)
        except kernel_mod.KernelCallError as e:   # the range is taken (another mapping in this process): the next one
          if e.errno != 17: raise               # EEXIST
          addr = self._take_va(size, page)
          continue
        if got != addr:                        # a kernel without MAP_FIXED_NOREPLACE (before Linux 4.17) took it as a hint
          self.k.munmap(got, size)
          raise NVError(f"{self.name}: mmap of video memory at {addr:#x} placed it at {got:#x} (the kernel does not "
                        f"know MAP_FIXED_NOREPLACE, Linux 4.17+)")
        return addr
    finally:
      self.k.close(fd)

  def _fb_info(self, *names: str) -> list[int]:
    """NV2080_CTRL_CMD_FB_GET_INFO_V2: the named sizes (vidmem.FB_INFO_INDEX; RM reports KiB), in bytes."""
    p = ffi.new("NV2080_CTRL_FB_GET_INFO_V2_PARAMS *")
    p.fbInfoListSize = len(names)
    for i, name in enumerate(names): p.fbInfoList[i].index = vidmem.FB_INFO_INDEX[name]
    self.rm.control(self.subdevice, rm.NV2080_CTRL_CMD_FB_GET_INFO_V2, p)
    return [p.fbInfoList[i].data << 10 for i in range(len(names))]

  def _track(self, mem: NVMemory) -> NVMemory:
    self._live[mem.addr] = mem
    bisect.insort(self._live_addrs, mem.addr)
    self.history.alloc(mem.addr, mem.mapped, _kind(mem))
    return mem

  def describe_address(self, addr: int) -> str:
    """Which allocation `addr` falls in and at what offset, or the freed one it was in (a use after free), or none."""
    return self.history.describe(addr, ((m.addr, m.mapped, m.nbytes, _kind(m)) for m in list(self._live.values())))

  def _allocation(self, addr: int, nbytes: int) -> NVMemory | None:
    """This driver's allocation holding [addr, addr + nbytes), or None."""
    i = bisect.bisect_right(self._live_addrs, addr) - 1
    mem = self._live.get(self._live_addrs[i]) if i >= 0 else None
    return mem if mem is not None and addr + nbytes <= mem.addr + mem.mapped else None

  def _os_descriptor(self, addr: int, size: int) -> int:
    """Describe `size` bytes of host pages at `addr` to RM: NV_ESC_RM_ALLOC_MEMORY (NVOS02) of
    NV01_MEMORY_SYSTEM_OS_DESCRIPTOR on /dev/nvidiaN, which pins them (osdesc.py). Returns the memory handle."""
    p = ffi.new("nv_ioctl_nvos02_parameters_with_fd *")
    p.params.hRoot, p.params.hObjectParent, p.params.hObjectNew = self.rm.root, self.device, self.rm.new_handle()
    p.params.hClass, p.params.flags = rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, osdesc.HOST_PAGES
    p.params.pMemory, p.params.limit, p.fd = addr, size - 1, -1
    self.rm.escape(self.fd_dev, rm.NV_ESC_RM_ALLOC_MEMORY, p,
                   lambda: {"hNew": p.params.hObjectNew, "pMemory": addr, "limit": size - 1, "status": p.params.status})
    if p.params.status != rm.NV_OK:
      raise RMError(f"NV_ESC_RM_ALLOC_MEMORY of {size:#x} bytes of host memory at {addr:#x}", p.params.status)
    return p.params.hObjectNew

  def _uvm_map(self, addr: int, size: int, handle: int):
    """Map RM memory object `handle` into the GPU VA space at `addr`, its host address: an external range
    (UVM_CREATE_EXTERNAL_RANGE) and UVM_MAP_EXTERNAL_ALLOCATION with default attributes for this GPU."""
    self._uvm(rm.UVM_CREATE_EXTERNAL_RANGE, base=addr, length=size)
    m = ffi.new("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS *")
    m.base, m.length, m.gpuAttributesCount, m.rmCtrlFd, m.hClient, m.hMemory = addr, size, 1, self.fd_ctl, self.rm.root, handle
    m.perGpuAttributes[0].gpuUuid[0:16] = self.uuid
    try: self._uvm_call(self.fd_uvm, rm.UVM_MAP_EXTERNAL_ALLOCATION, m)
    except RMError:
      self._uvm(rm.UVM_FREE, base=addr, length=size)
      raise

  def _va(self, page: int, size: int) -> int:
    """An address for `size` bytes in the region of `page`: a freed one of that size, else a fresh one."""
    free = self._free_va.get((page, size))
    return free.pop() if free else self._take_va(size, page)

  def _take_va(self, size: int, page: int = PAGE, align: int = 0) -> int:
    if align: _va_cursor[page] = -(-_va_cursor[page] // align) * align
    addr = _va_cursor[page]
    _va_cursor[page] += size            # contiguous: see the note on out-of-range loads in drivers/emu/README.md
    if _va_cursor[page] > VA_REGIONS[page][1]:
      raise MemoryError(f"NV device: out of GPU virtual address space for {page >> 10} KiB pages (below "
                        f"{VA_REGIONS[page][1]:#x})")
    return addr

  def free(self, mem: NVMemory):
    if mem.host_mapped:               # another allocation's pages: unmap them from the GPU, RM unpins them
      self._host_maps.pop(mem.addr, None)
      self._uvm(rm.UVM_FREE, base=mem.addr, length=mem.mapped)
      self.rm.free(self.device, mem.handle)
      return
    if self._live.pop(mem.addr, None) is not None: self._live_addrs.remove(mem.addr)
    self.history.free(mem.addr, mem.mapped, _kind(mem))
    self._uvm(rm.UVM_FREE, base=mem.addr, length=mem.mapped)
    if mem.video:                     # the CPU's BAR1 mapping goes before the memory (RM would drop it with the object)
      self.k.munmap(mem.addr, mem.mapped)
      self.rm.free(self.device, mem.handle)
    else:                             # RM unpins the pages, then they go
      self.rm.free(self.device, mem.handle)
      self.k.munmap(mem.addr, mem.mapped)
    self._free_va.setdefault((mem.page, mem.mapped), []).append(mem.addr)

  def view(self, addr: int, nbytes: int):
    return _ffi.buffer(_ffi.cast("char *", addr), nbytes)

  # ---- host <-> device copies: video memory through the copy channel and pinned staging, other memory by the CPU ----
  # copyin/copyout: drivers/hostcopy.py StagedCopies. Video memory is written and read by the copy engine only, never
  # by the host through BAR1: reads there are uncached PCIe round trips, and where a hypervisor traps BAR accesses
  # (an H200 in a Firecracker VM) writes move ~6 MB/s and reads under 1 MB/s
  STAGE_MIN = COPYOUT_MIN = 0

  def _staging_memory(self):
    return [self.alloc_polled(self.STAGING), self.alloc_polled(self.STAGING)], self.alloc_polled(PAGE)

  def _in_device(self, addr: int, nbytes: int) -> bool:
    mem = self._allocation(addr, nbytes)
    return mem is not None and mem.video

  def _staged_copy_failed(self, what: str) -> Exception:
    return NVError(f"{self.name}: the copy engine's {what} did not finish in {self.timeout:.3g} s{self._channel_report()}")

  @property
  def emulated(self) -> bool:
    """Whether RM, UVM and the GPU are the emulated ones (EMU=1)."""
    return bool(self.k.emulated)

  @property
  def kernel(self):
    """The kernel interface (`k`), under the name the AMD driver gives it (tools/bench.py reads `driver.kernel`)."""
    return self.k

  def map_host(self, addr: int, nbytes: int) -> NVMemory:
    """Let the GPU address host memory another device allocated (page-aligned), at its host address, as this driver
    maps its own: the pages as an OS descriptor (RM pins them) mapped by UVM at the same GPU virtual address. The
    copy channel's DMA engine and the semaphores then reach them. HostMapError (an OSError) where RM or UVM refuses:
    pages RM cannot pin (not readable and writable process memory), an address the GPU's VA space does not reach, a
    range UVM already has. `free` unmaps it."""
    if addr % PAGE or nbytes % PAGE or nbytes <= 0:
      raise ValueError(f"{self.name}: map_host of {nbytes:#x} bytes at {addr:#x}: address and size must be multiples of "
                       f"the {PAGE:#x}-byte page (round the range out to whole pages)")
    why = {"NV_ERR_INVALID_ADDRESS": "RM could not pin the pages (they must be readable and writable memory of this process)",
           "NV_ERR_OUT_OF_RANGE": "the GPU's virtual address space does not reach that address",
           "NV_ERR_UVM_ADDRESS_IN_USE": "UVM already maps something there (a range overlapping this one)"}
    try:
      handle = self._os_descriptor(addr, nbytes)
      try: self._uvm_map(addr, nbytes, handle)
      except RMError:
        self.rm.free(self.device, handle)
        raise
    except RMError as e:
      reason = why.get(rm.NV_STATUS.get(e.status, ""), "")
      raise HostMapError(f"{self.name}: mapping host memory [{addr:#x}, {addr + nbytes:#x}) for the GPU: {e}"
                         f"{'; ' + reason if reason else ''}", e.status) from None
    mem = NVMemory(addr, nbytes, nbytes, handle, host_mapped=True)
    self._host_maps[addr] = mem
    return mem

  # ---- programs ----
  def compile(self, src: str) -> bytes:
    binary = compile_ptx(src, self.target)
    self._ptx[binary] = src
    return binary

  def load_program(self, binary: bytes, name: str):
    """Upload a kernel's code and its constant banks other than 0 (bound at each launch) into one allocation."""
    kernels = load_cubin(binary)
    if name not in kernels: raise NVError(f"NV: cubin has no kernel {name!r} (it has {sorted(kernels)})")
    kern = kernels[name]
    if kern.relocations:
      raise NVError(f"NV: kernel {name}: the cubin has relocations ({', '.join(f'{sec}: {n}' for sec, n in kern.relocations)}) "
                    f"and this driver does not apply relocations (baregrad's renderer produces none: a kernel that "
                    f"references globals, .const variables or function addresses cannot be loaded)")
    offsets, end = {}, len(kern.text)
    for bank, data in sorted(kern.const_banks.items()):
      if not data: continue
      offsets[bank] = (end + CONST_BANK_ALIGN - 1) // CONST_BANK_ALIGN * CONST_BANK_ALIGN
      end = offsets[bank] + len(data)
    mem = self.alloc(end + 256)
    image = bytearray(end)
    image[:len(kern.text)] = kern.text
    for bank, off in offsets.items(): image[off:off + len(kern.const_banks[bank])] = kern.const_banks[bank]
    self._programs[mem.addr] = bytes(image)
    self._uploads.add(mem.addr)
    kern.bank_addrs = {bank: (mem.addr + off, len(kern.const_banks[bank])) for bank, off in offsets.items()}
    self._code_generation += 1     # the next compute submission invalidates the instruction caches first
    # the emulated GPU runs the PTX, not the SASS: the side channel (drivers/emu/README.md); the real kernel ignores it
    if self.k.emulated and binary not in self._ptx:
      raise NVError(f"NV emulator: no PTX known for kernel {name} (compile it with this driver)")
    self.k.register_program(mem.addr, self._ptx.get(binary), name, kern.param_base, [(p.ordinal, p.offset, p.size) for p in kern.params])
    kern.memory = mem
    return mem.addr, kern

  def unload_program(self, handle):
    """Free a program's code (hcq calls this once the device has finished the work that used it)."""
    if handle.memory is None: return
    self.k.unregister_program(handle.memory.addr)
    self._uploads.discard(handle.memory.addr)
    self._programs.pop(handle.memory.addr, None)
    self.free(handle.memory)
    handle.memory = None

  # ---- launch memory: arenas of blocks, freed when the channel's fence passes ----
  def _block(self, nbytes: int, launch: bool = False) -> tuple[int, list]:
    """`nbytes` (256-aligned) of pushbuffer memory (pinned host memory), or of launch memory (QMDs and constant bank
    0: video memory) with `launch`: bump allocation in the first arena of that kind with room; an arena whose blocks
    are all done (fences passed) starts over."""
    nbytes = (nbytes + 255) // 256 * 256
    self._reap()
    for arena in self._arenas:
      if arena[0].video != launch: continue
      if arena[2] == 0: arena[1] = 0
      if arena[1] + nbytes <= arena[0].nbytes: break
    else:
      arena = [(self.alloc if launch else self.alloc_polled)(max(4 << 20, nbytes)), 0, 0]
      self._arenas.append(arena)
    addr = arena[0].addr + arena[1]
    arena[1] += nbytes
    arena[2] += 1
    return addr, arena

  def _reap(self):
    keep = []
    for ch, value, arena in self._inflight:
      if self._u64(ch.fence.addr) >= value: arena[2] -= 1
      else: keep.append((ch, value, arena))
    self._inflight = keep
    done = [r for r in self._local_retired if r[1] is not None and self._u64(r[1].fence.addr) >= r[2]]
    for retired in done:
      self._local_retired.remove(retired)
      self.free(retired[0])

  def _u64(self, addr: int) -> int: return _ffi.cast(_U64P, addr)[0]

  # ---- queues ----
  def encode(self, kind: str, cmds: list[tuple]) -> Encoded:
    """HWQueue commands -> 32-bit pushbuffer words. A symbolic value (an hcq Slot) goes into the method data as its
    32-bit halves (patches); a launch's SEND_PCAS_A data is a `Launch` fixup: its QMD is written into launch
    memory, and its address into that word, when the words are submitted or bound. No side effects."""
    if kind not in self.channels: raise NVError(f"NV: no {kind!r} channel (the channels are {', '.join(self.channels)})")
    p = pb.Pushbuffer()
    for cmd in cmds:
      op = cmd[0]
      if op == "exec": self._encode_exec(p, *cmd[1:])
      elif op == "copy":
        _, dst, src, nbytes = cmd
        p.method(0, pb.WFI, pb.WFI_SCOPE_ALL)
        for off in range(0, nbytes, 1 << 30):
          n = min(1 << 30, nbytes - off)
          p.method(pb.SUBC_COPY, pb.OFFSET_IN_UPPER, hi32(src + off), lo32(src + off), hi32(dst + off), lo32(dst + off))
          p.method(pb.SUBC_COPY, pb.LINE_LENGTH_IN, n, 1)
          p.method(pb.SUBC_COPY, pb.LAUNCH_DMA, pb.DMA_DATA_TRANSFER_TYPE_NON_PIPELINED | pb.DMA_FLUSH_ENABLE |
                   pb.DMA_SRC_MEMORY_LAYOUT_PITCH | pb.DMA_DST_MEMORY_LAYOUT_PITCH)
      elif op == "signal": self._semaphore(p, cmd[1].addr, cmd[2], pb.SEM_OPERATION_RELEASE | pb.SEM_RELEASE_WFI | pb.SEM_RELEASE_TIMESTAMP)
      elif op == "wait": self._semaphore(p, cmd[1].addr, cmd[2], pb.SEM_OPERATION_ACQ_STRICT_GEQ)
      elif op == "timestamp":   # a 16-byte release: payload (0) at the signal, the timestamp after it
        self._semaphore(p, cmd[1].timestamp_addr - 8, 0, pb.SEM_OPERATION_RELEASE | pb.SEM_RELEASE_WFI | pb.SEM_RELEASE_TIMESTAMP)
      elif op == "barrier": p.method(0, pb.WFI, pb.WFI_SCOPE_ALL)
      else: raise ValueError(f"NV queue: unknown command {op!r}")
      if self.markers:       # the command's sequence number (a Marker fixup), released once it is done
        slot = self._marker_slot[kind]
        p.method(0, pb.SEM_ADDR_LO, lo32(slot), hi32(slot), Marker(describe(cmd), launch_args(cmd)), 0,
                 pb.SEM_OPERATION_RELEASE | pb.SEM_RELEASE_WFI | pb.SEM_PAYLOAD_SIZE_64BIT)
    return Encoder().packet(p.words, special=p.special).encoded      # one pushbuffer segment (one GPFIFO entry)

  def _semaphore(self, p: pb.Pushbuffer, addr, value, operation: int):
    p.method(0, pb.SEM_ADDR_LO, lo32(addr), hi32(addr), lo32(value), hi32(value), operation | pb.SEM_PAYLOAD_SIZE_64BIT)

  def _encode_exec(self, p: pb.Pushbuffer, program, args_addr, global_size, local_size):
    kern = program.handle
    if not isinstance(args_addr, int): raise NVError(f"NV queue: exec of {program.name} needs a concrete kernarg address")
    block = tuple(local_size) if tuple(local_size) != (1, 1, 1) else tuple(program.meta.get("local_size", (1, 1, 1)))
    cb_size = (max(kern.cbank0_size, kern.param_base + 8) + 255) // 256 * 256
    self._carveout(program.name, kern)      # a kernel no carveout holds fails here, not on the GPU
    threads = block[0] * block[1] * block[2]
    if qmd.block_registers(kern.registers, threads) > qmd.REGISTER_FILE:   # ... and one the register file cannot hold
      most = qmd.REGISTER_FILE // qmd.block_registers(kern.registers, 32) * 32
      raise NVError(f"NV: kernel {program.name}: {threads} threads of {kern.registers} registers each need "
                    f"{qmd.block_registers(kern.registers, threads)} registers, more than an SM's register file of "
                    f"{qmd.REGISTER_FILE} (CUDA's 'too many resources requested for launch'); launch at most {most} "
                    f"threads per block, or make the kernel use fewer registers")
    grid = tuple(global_size) + (1,) * (3 - len(global_size))
    p.method(0, pb.WFI, pb.WFI_SCOPE_ALL)
    if not isinstance(grid[0], int):
      # a grid width that depends on a Variable (a JIT graph patches it per replay): hcq fills in the data word of a
      # no-op method (SET_I2M_SPARE_NOOP00), and the driver copies that word into the QMD and bank 0 before the
      # doorbell, as it copies the parameters (a bound queue: every submit)
      if not all(isinstance(g, int) for g in grid[1:]):
        raise NVError(f"NV queue: exec of {program.name}: only the grid's width may be symbolic, got {grid}")
      p.method(pb.SUBC_COMPUTE, pb.SET_I2M_SPARE_NOOP00, lo32(grid[0]))
      grid = (GridWord(len(p.words) - 1), *grid[1:])
    launch = Launch(program.name, program.entry, kern, grid, block, args_addr, cb_size)
    # the QMD and constant bank 0 reach launch memory (video memory) from this pushbuffer through I2M, never through
    # BAR1: placeholders here, filled in by _place (LaunchData)
    nbytes = qmd.QMD_BYTES + cb_size
    for off in range(0, nbytes, 4 * pb.I2M_MAX_WORDS):
      n = min(4 * pb.I2M_MAX_WORDS, nbytes - off)
      p.inline_to_memory(LaunchData(launch, "hi", off, n), LaunchData(launch, "lo", off, n), n,
                         [LaunchData(launch, "data", off, n)] + [0] * ((n + 3) // 4 - 1))
    p.method(pb.SUBC_COMPUTE, pb.SEND_PCAS_A, launch)
    p.method(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, pb.PCAS_ACTION_INVALIDATE_COPY_SCHEDULE)

  def _place(self, encoded: Encoded, kind: str, keep: bool = True) -> tuple[list[int], list, list]:
    """Write the QMD and constant bank 0 of every launch in `encoded` into launch memory and fill in the words that
    name them, and the trace markers' sequence numbers (`keep`: remember them for reports; a bound queue's replays
    write the same numbers): (words, the arenas the launches took, the (kernarg, bank 0, bytes) copies of their
    parameters)."""
    words, arenas, copies = self._place_markers(kind, encoded.words, encoded.fixups, keep), [], []
    launches = [(i, fix) for i, fix in encoded.fixups if isinstance(fix, Launch)]
    self._ensure_local_memory(max((launch.kern.local_high for _, launch in launches), default=0))
    placed = {}      # id(Launch) -> (launch memory address, QMD + bank 0 bytes, [(source, byte in them, bytes)])
    for i, launch in launches:
      addr, arena = self._block(qmd.QMD_BYTES + launch.cb_size, launch=True)
      grid_copies, encoded_launch = [], launch
      if isinstance(launch.grid[0], GridWord):     # the pushbuffer word holding the width (resolved, or 0 until patched)
        at = launch.grid[0].index
        grid_copies = [(GridWord(at), off, 4) for off in self._grid_width_offsets()]
        launch = dataclasses.replace(launch, grid=(max(words[at], 1), *launch.grid[1:]))
      data, params = self._launch_bytes(launch, addr)
      placed[id(encoded_launch)] = (addr, data, grid_copies + params)
      words[i] = launch.word(addr)
      arenas.append(arena)
    for i, part in encoded.fixups:           # the inline writes of each launch's QMD and bank 0 (_encode_exec)
      if not isinstance(part, LaunchData): continue
      addr, data, moves = placed[id(part.launch)]
      if part.part == "hi": words[i] = hi32(addr + part.offset)
      elif part.part == "lo": words[i] = lo32(addr + part.offset)
      else:
        words[i:i + (part.nbytes + 3) // 4] = _le_words(data[part.offset:part.offset + part.nbytes])
        # what is copied into the bank later (parameters, a patched grid width) goes to these pushbuffer words
        copies += [(src, 4 * i + at - part.offset, n) for src, at, n in moves if part.offset <= at < part.offset + part.nbytes]
    return words, arenas, copies

  def _grid_width_offsets(self) -> list[int]:
    """Where a launch holds its grid width, as byte offsets in its QMD + constant bank 0: the QMD's field (a whole
    dword: GRID_WIDTH of V04_00 bits 1055:1024, CTA_RASTER_WIDTH of V03_00 bits 415:384) and %nctaid.x in constant
    bank 0's driver area."""
    hi, lo = self.qmd_table["GRID_WIDTH" if "GRID_WIDTH" in self.qmd_table else "CTA_RASTER_WIDTH"]
    assert lo % 32 == 0 and hi - lo == 31, "the QMD's grid width is not a whole dword"
    return [lo // 8, qmd.QMD_BYTES + DRIVER_AREA["NCTAID"]]

  def _carveout(self, name: str, kern) -> tuple[int, int, int]:
    """(min, target, max) shared-memory carveout in bytes for a kernel: the smallest the SM can be set to that holds
    the CTA's shared memory, up to the largest. On sm_80 .. sm_89 each CTA also takes 1 KiB the system reserves
    (CUDA C++ Programming Guide, "Shared Memory" of compute capability 8.x); sm_90 cubins count it in .nv.shared."""
    need = (kern.shared_size + 255) // 256 * 256 + (1024 if int(self.target[3:]) < 90 else 0)
    fits = [c for c in self.carveouts if c >= need]
    if not fits:
      raise NVError(f"NV: kernel {name} needs {need} bytes of shared memory per CTA; a {self.target} SM holds at most "
                    f"{self.carveouts[-1]} (use less shared memory per block)")
    return fits[0], fits[0], self.carveouts[-1]

  def _launch_bytes(self, launch: "Launch", addr: int) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The QMD of a launch whose QMD goes to `addr`, and constant bank 0 after it (QMD_BYTES on), as bytes; and the
    copies that put the parameters into bank 0: (kernarg address, byte offset in these bytes, bytes)."""
    kern, cb_size = launch.kern, launch.cb_size
    # all but bank 0's address is the same for every launch of a kernel with this grid and block: packed once, kept
    # with the cubin kernel (a launch's QMD packing was a third of the host's time per launch)
    key = (launch.program, launch.grid, launch.block, cb_size, self.sass_version, tuple(sorted(kern.bank_addrs.items())))
    cache = kern.launch_cache
    if (hit := cache.get(key)) is None:
      cbufs = {0: (0, cb_size), **kern.bank_addrs}
      fields = qmd.launch_fields(self.qmd_version, program=launch.program, cbufs=cbufs, grid=launch.grid,
                                 block=launch.block, registers=kern.registers, shared=kern.shared_size,
                                 barriers=kern.barriers, sm_config=self._carveout(launch.name, kern),
                                 local_high=kern.local_high, sass_version=self.sass_version)
      bank0 = bytearray(cb_size)
      bank0[:len(kern.cbank0_data)] = kern.cbank0_data
      area = DRIVER_AREA
      struct.pack_into("<3I", bank0, area["NTID"], *launch.block)
      struct.pack_into("<3I", bank0, area["NCTAID"], *launch.grid)
      struct.pack_into("<Q", bank0, area["SHARED_WINDOW"], self.shared_window)
      struct.pack_into("<Q", bank0, area["LOCAL_WINDOW"], LOCAL_WINDOW)
      struct.pack_into("<I", bank0, area["STACK_POINTER"], STACK_TOP)
      if len(cache) >= 64: cache.clear()
      hit = cache[key] = (qmd.pack_bits(self.qmd_table, fields), bytes(bank0))
    bits = hit[0] | qmd.pack_bits(self.qmd_table, qmd.cbuf_address_fields(self.qmd_version, 0, addr + qmd.QMD_BYTES))
    return (bits.to_bytes(qmd.QMD_BYTES, "little") + hit[1],
            [(launch.args_addr + 8 * prm.ordinal, qmd.QMD_BYTES + kern.param_base + prm.offset, prm.size)
             for prm in kern.params])

  def _copy_params(self, base: int, copies):
    """The launches' parameters from kernel-argument memory (`alloc_args`: pinned host memory) into the inline data of
    their constant bank 0 in the pushbuffer at `base` (and symbolic grid widths from a word of that pushbuffer into
    their QMD and bank 0 there): (source address or GridWord, byte offset in the pushbuffer, bytes)."""
    for src, dst, n in copies:
      src = base + 4 * src.index if isinstance(src, GridWord) else src
      _ffi.memmove(_ffi.cast("char *", base + dst), _ffi.cast("char *", src), n)

  def submit(self, kind: str, encoded: Encoded):
    """Place the launches, write the pushbuffer, copy the parameters from the kernarg memory into it, ring the
    doorbell."""
    if encoded.patches: raise NVError(f"NV {kind} channel: submit of commands with unresolved symbolic values (resolve them first)")
    if self._faulted(): self.check_faults(self.name)
    words, arenas, copies = self._place(encoded, kind)
    ch = self.channels[kind]
    state = self._state_words(ch)
    self._submit_words(ch, state + words, arenas,
                       [(src, 4 * len(state) + dst, n) for src, dst, n in copies if not isinstance(src, GridWord)])

  def _submit_words(self, ch: Channel, words: list[int], arenas=(), copies=()):
    entries = []
    if words:
      addr, arena = self._block(4 * len(words))
      self.view(addr, 4 * len(words))[:] = struct.pack(f"<{len(words)}I", *words)     # (4x numpy's list conversion)
      self._copy_params(addr, copies)
      entries.append((addr, len(words)))
      arenas = [*arenas, arena]
    self._ring(ch, entries, arenas)

  def _ring(self, ch: Channel, entries: list, arenas):
    """Append the channel's fence release, write the GPFIFO entries, GPPut, and ring the doorbell."""
    ch.fence_value += 1
    words = self._fence_words(ch, ch.fence_value)
    faddr, farena = self._block(4 * len(words))
    self.view(faddr, 4 * len(words))[:] = struct.pack(f"<{len(words)}I", *words)
    if ch.views is None:     # made once per channel: a replay's host time went largely into making views
      ch.views = (np.frombuffer(self.view(ch.ring.addr, GPFIFO_ENTRIES * 8), np.uint32),
                  np.frombuffer(self.view(ch.userd.addr, pb.USERD_BYTES), np.uint32))
    ring, userd = ch.views
    for arena in [*arenas, farena]: self._inflight.append((ch, ch.fence_value, arena))
    if self.word_log is not None:
      gp = [w for addr, n in [*entries, (faddr, len(words))] for w in pb.gp_entry(addr, n)]
      self.word_log.add(ch.name, "gpfifo", gp, self._readable)
    for addr, n in [*entries, (faddr, len(words))]:
      # after this entry the next one must still be unread (GPPut == GPGet means empty): wait until the submission that
      # last wrote it is complete (its fence), which needs no GP_GET from USERD
      nxt = (ch.put + 1) % GPFIFO_ENTRIES
      if ch.slots[nxt] > self._u64(ch.fence.addr): self._wait_for_gpfifo(ch, userd, ch.slots[nxt])
      ring[2 * ch.put:2 * ch.put + 2] = pb.gp_entry(addr, n)
      ch.slots[ch.put] = ch.fence_value
      ch.put = nxt
    self._publish(ch, userd)

  def _fence_words(self, ch: Channel, value: int) -> list[int]:
    """The pushbuffer words that release `value` to the channel's fence: encoded once per channel, the value's two
    words replaced per submit."""
    if ch.fence_template is None:
      p = [pb.Pushbuffer(), pb.Pushbuffer()]
      for v, q in zip((0, (1 << 32) + 1), p):
        self._semaphore(q, ch.fence.addr, v, pb.SEM_OPERATION_RELEASE | pb.SEM_RELEASE_WFI)
      at = [i for i, (a, b) in enumerate(zip(p[0].words, p[1].words)) if a != b]
      assert len(at) == 2, at     # the value's low and high word
      ch.fence_template = (p[0].words, at[0], at[1])
    words, lo, hi = ch.fence_template
    words = list(words)
    words[lo], words[hi] = value & 0xFFFFFFFF, value >> 32
    return words

  def _publish(self, ch: Channel, userd):
    userd[pb.USERD_GP_PUT // 4] = ch.put
    _ffi.cast(_U32P, self.doorbell + pb.USERMODE_NOTIFY_CHANNEL_PENDING)[0] = ch.token

  def _wait_for_gpfifo(self, ch: Channel, userd, value: int):
    """The GPFIFO is full: publish the entries written so far and wait for the channel's fence to reach `value`."""
    self._publish(ch, userd)
    deadline, sleep = time.monotonic() + self.timeout, 1e-5
    while self._u64(ch.fence.addr) < value:
      if self._faulted(): self.check_faults(self.name)
      if time.monotonic() > deadline:
        raise NVError(f"{self.name} {ch.name} channel: its GPFIFO of {GPFIFO_ENTRIES} entries stayed full for {self.timeout:.3g} s "
                      f"(fence {self._u64(ch.fence.addr)} of {ch.fence_value} submissions, GPPut {ch.put}): the channel "
                      f"is not progressing{self._channel_report()}")
      time.sleep(sleep); sleep = min(sleep * 2, 1e-3)

  # ---- bound queues (JIT replay): the pushbuffer stays in memory, a submit is one GPFIFO entry ----
  def bind(self, kind: str, encoded: Encoded) -> "BoundPushbuffer":
    words, arenas, copies = self._place(encoded, kind, keep=False)    # launch blocks stay with the bound queue
    mem = self.alloc_polled(4 * max(len(words), 1))     # pushbuffer: the host patches it (and reads it in reports)
    view = np.frombuffer(self.view(mem.addr, 4 * max(len(words), 1)), np.uint32)
    view[:len(words)] = np.array(words, dtype=np.uint64).astype(np.uint32)
    return BoundPushbuffer(mem, view, len(words), copies, arenas, self._param_gather(copies))

  def _param_gather(self, copies) -> tuple | None:
    """The parameter copies from kernel-argument memory as one numpy gather (a replay's host time per launch was
    mostly one cffi copy per parameter): (the source bytes, their indices, the pushbuffer byte indices, the copies of
    symbolic grid widths left to copy one by one), or None."""
    params = [(src, dst, n) for src, dst, n in copies if not isinstance(src, GridWord)]
    if not params: return None
    lo, hi = min(src for src, _, _ in params), max(src + n for src, _, n in params)
    if hi - lo > PARAM_GATHER_SPAN: return None
    take = np.concatenate([np.arange(src - lo, src - lo + n) for src, _, n in params])
    put = np.concatenate([np.arange(dst, dst + n) for _, dst, n in params])
    return (np.frombuffer(self.view(lo, hi - lo), np.uint8), take, put,
            [c for c in copies if isinstance(c[0], GridWord)])

  def submit_bound(self, kind: str, bound: "BoundPushbuffer", patch: list[tuple[int, int]]):
    """Patch the words, copy the launches' parameters from the kernarg memory (a replay patched them), submit."""
    if self._faulted(): self.check_faults(self.name)
    for i, v in patch: bound.words[i] = v
    if bound.gather is None: self._copy_params(bound.memory.addr, bound.copies)
    else:
      src, take, put, grids = bound.gather
      bound.words.view(np.uint8)[put] = src[take]
      self._copy_params(bound.memory.addr, grids)
    ch = self.channels[kind]
    entries, arenas = [], []
    if (state := self._state_words(ch)):
      addr, arena = self._block(4 * len(state))
      np.frombuffer(self.view(addr, 4 * len(state)), np.uint32)[:] = state
      entries, arenas = [(addr, len(state))], [arena]
    self._ring(ch, [*entries, (bound.memory.addr, bound.nwords)], arenas)

  # a wait polls without sleeping this long first: a sleep lasts >= ~60 us on Linux (timer slack), longer than most
  # kernels and the whole submit -> signal round trip on the GPU (the emulated GPU's threads need the CPU instead)
  SPIN_S = 3e-4

  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    deadline, sleep = time.monotonic() + timeout, 1e-5
    if not self.k.emulated:
      spin_until = time.perf_counter() + self.SPIN_S
      while self._u64(addr) < value and time.perf_counter() < spin_until: pass
    while self._u64(addr) < value:
      if self._faulted(): return False     # RM wrote the error notifier (or the emulated GPU stopped a channel)
      if time.monotonic() > deadline:
        self._stalled = (addr, value, self._u64(addr), timeout)
        return False
      time.sleep(sleep)
      sleep = min(sleep * 2, 5e-4)
    return True

  def _faulted(self) -> bool:
    """Whether RM wrote the channels' error notifier (or the emulated GPU reports a fault)."""
    status = _ffi.cast(_U16P, self.error_notifier.addr + 14)[0]
    return bool(status) or self.k.fault() is not None

  def check_faults(self, device_name: str):
    """Raise a channel error: a memory fault (Xid 31) on every call from now on; any other error once, after
    reallocating the channels (ChannelReset). Raise ChannelTimeout for a wait that timed out on a blocked channel."""
    detail = self.k.fault()     # the emulated GPU's account (drivers/emu/README.md); None from the real kernel
    info32, info16, status = struct.unpack_from("<IHH", self.view(self.error_notifier.addr, 16), 8)
    if status or info32 or detail:
      # the faulting address: the emulated GPU's account gives it (RM's error notifier does not)
      where = re.search(r"at (0x[0-9a-f]+) is outside every mapping", detail or "")
      where = f" (the address {where.group(1)} is {self.describe_address(int(where.group(1), 16))})" if where else ""
      message = (f"{device_name}: GPU channel error {info32} ({rm.RC_ERRORS.get(info32, 'unknown error')}; error notifier "
                 f"info16={info16:#x} status={status:#x}){': ' + detail if detail else ''}{where}"
                 + "".join(f"; {kind} channel:{self.marker_report(kind)[1:]}" for kind in self.channels if self.markers))
      if info32 == rm.ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT: raise NVError(message)
      self._reset_channels()
      raise ChannelReset(f"{message}; the channels were reallocated (work queued after the fault was dropped)")
    if self._stalled:
      (addr, value, seen, timeout), self._stalled = self._stalled, None
      report = self._channel_report()
      if report: raise ChannelTimeout(f"{device_name}: waited {timeout:.3g} s for [{addr:#x}] >= {value}, it is {seen}{report}")

  def _reset_channels(self):
    """Robust-channel recovery as RM expects of a client: free the faulted channels (RM stops them), clear the error
    notifier and allocate new ones; what they still held is dropped."""
    for kind, old in list(self.channels.items()):
      self._uvm(rm.UVM_UNREGISTER_CHANNEL, gpuUuid=self.uuid, hClient=self.rm.root, hChannel=old.handle)
      self.rm.free(old.group, old.handle)
      for ch, _, arena in self._inflight:
        if ch is old: arena[2] -= 1
      self._inflight = [entry for entry in self._inflight if entry[0] is not old]
      for retired in [r for r in self._local_retired if r[1] is old]:
        self._local_retired.remove(retired)
        self.free(retired[0])
      for mem in (old.ring, old.userd, old.fence): self.free(mem)
    for group in self.groups.values():
      self.rm.free(self.device, group)       # with its context share
      if group in self._group_windows: self._free_windows.append(self._group_windows.pop(group))
    self._make_groups()
    self.view(self.error_notifier.addr, 16)[:] = bytes(16)
    for kind, old in list(self.channels.items()):
      self.channels[kind] = self._channel(kind, old.cls, old.engine, old.subchannels)
    self._schedule()
    self._uploads = set(self._programs)        # the program writes queued before may have been dropped
    for ch in self.channels.values(): self._submit_words(ch, self._init_words(ch))
    self._stalled = None

  def _channel_report(self) -> str:
    """Where each busy channel stands: its GPFIFO entry and the semaphore acquires there that do not hold yet."""
    parts = []
    for ch in self.channels.values():
      done = self._u64(ch.fence.addr)       # (not USERD GP_GET: stale while the channel is busy)
      if done >= ch.fence_value: continue
      mine = [i for i in self._pending_entries(ch, done) if ch.slots[i] == done + 1]   # the first incomplete submission
      if not mine: continue
      segs = []
      for i in mine:
        w0, w1 = np.frombuffer(self.view(ch.ring.addr + 8 * i, 8), np.uint32)
        segs.append(pb.decode_gp_entry(int(w0), int(w1)))
      waits = [f"semaphore acquire [{a:#x}] >= {v}, memory holds {self._u64(a)}" for addr, n in segs
               for a, v in self._acquires(addr, n) if self._u64(a) < v]
      where = f"GPFIFO entr{'y' if len(mine) == 1 else 'ies'} {mine[0]}" + (f"-{mine[-1]}" if len(mine) > 1 else "")
      parts.append(f"; {ch.name} channel is in submission {done + 1} of {ch.fence_value} ({where}): "
                   + (", ".join(waits) or f"segments of {sum(n for _, n in segs)} pushbuffer words at "
                                          f"{', '.join(hex(a) for a, _ in segs)}") + self.marker_report(ch.name))
    return "".join(parts)

  def _readable(self, addr: int, nbytes: int) -> bytes | None:
    """The bytes at a GPU address inside one live allocation (for decoding), else None."""
    return bytes(self.view(addr, nbytes)) if self._allocation(addr, nbytes) is not None else None

  @staticmethod
  def _pending_entries(ch: Channel, done: int) -> list[int]:
    """The GPFIFO entries of submissions after fence value `done`, in ring order ending before GPPut."""
    return [i for i in ((ch.put - k) % GPFIFO_ENTRIES for k in range(GPFIFO_ENTRIES, 0, -1)) if ch.slots[i] > done]

  def dump_queues(self) -> str:
    """Each channel's GPFIFO entries that are not done (its fence) up to GPPut, with the pushbuffer segments they
    point at and the QMDs their launches name, decoded."""
    from ..decode import decode as decode_words    # (only here: the decoder's tables stay out of import time)
    out = []
    for ch in self.channels.values():
      done = self._u64(ch.fence.addr)       # (not USERD GP_GET: stale while the channel is busy)
      pending = self._pending_entries(ch, done)
      out.append(f"{ch.name} channel (GPFIFO of {GPFIFO_ENTRIES} entries at {ch.ring.addr:#x}): GPPut {ch.put}, "
                 f"{done} of {ch.fence_value} submissions done"
                 f"{', nothing pending' if not pending else f', {len(pending)} entries pending'}{self.marker_report(ch.name)}")
      for i in pending:
        words = np.frombuffer(self.view(ch.ring.addr + 8 * i, 8), np.uint32)
        out += [line.replace("GP entry 0:", f"GP entry {i}:", 1)
                for line in decode_words("gpfifo", words, ch.ring.addr + 8 * i, self._readable, "  ")]
    return "\n".join(out)

  def _acquires(self, addr: int, n: int) -> list[tuple[int, int]]:
    """(address, payload) of the 64-bit semaphore acquires in the pushbuffer segment the driver wrote at addr."""
    words = np.frombuffer(self.view(addr, 4 * n), np.uint32)
    regs, found, i = {}, [], 0
    while i < n:
      sec_op, _, method, count = pb.decode_header(int(words[i]))
      if sec_op == pb.SEC_OP_IMMD_DATA_METHOD: i += 1; continue
      if sec_op != pb.SEC_OP_INC_METHOD: i += 1 + count; continue     # (semaphores are incrementing methods)
      for k in range(min(count, n - i - 1)):
        value = regs[method + 4 * k] = int(words[i + 1 + k])
        if method + 4 * k == pb.SEM_EXECUTE and value & 7 in (pb.SEM_OPERATION_ACQUIRE, pb.SEM_OPERATION_ACQ_STRICT_GEQ):
          found.append(((regs.get(pb.SEM_ADDR_HI, 0) & 0x1FFFFFF) << 32 | regs.get(pb.SEM_ADDR_LO, 0) & ~3,
                        regs.get(pb.SEM_PAYLOAD_HI, 0) << 32 | regs.get(pb.SEM_PAYLOAD_LO, 0)))
      i += 1 + count
    return found

  # ---- teardown ----
  def after_fork_in_child(self) -> bool:
    """False: a forked child cannot use this device. Its RM client, channels and UVM VA space belong to the parent
    (nvidia-uvm binds a VA space to the mm of the process that initialized it), and the GPU keeps running the
    parent's channels; the child opens its own device when it needs one."""
    return False

  def close(self):
    """Free the RM client (RM frees every object under it: the channels stop) and close the descriptors."""
    try:
      self.rm.free(self.rm.root, self.rm.root)
      for mem in list(self._live.values()): self.k.munmap(mem.addr, mem.mapped)   # RM freed the memory objects
      self._live.clear()
      self._live_addrs.clear()
      self._host_maps.clear()                # RM freed the descriptors; the pages are their owners'
      for fd in (self.fd_uvm_mm, self.fd_uvm, self.fd_dev, self.fd_ctl): self.k.close(fd)
    except (NVError, OSError): pass

  @classmethod
  def probe(cls) -> dict:
    if not kernel_mod.emulated() and not os.path.exists("/dev/nvidiactl"):
      return {"available": False, "reason": "no /dev/nvidiactl (the NVIDIA kernel driver is not loaded, or there is no "
                                            "NVIDIA GPU; set EMU=1 for the emulated GPU)"}
    return {"available": True, "emulated": kernel_mod.emulated()}


def _le_words(data: bytes) -> tuple[int, ...]:
  """`data` as little-endian 32-bit words, the last one zero-padded (inline data of an I2M write)."""
  return struct.unpack(f"<{(len(data) + 3) // 4}I", data + bytes(-len(data) % 4))


def _kind(mem: NVMemory) -> str:
  return "video memory" if mem.video else "host-mapped" if mem.host_mapped else "pinned host memory"


@dataclass(eq=False)
class Launch(Fixup):
  """A grid launch: the SEND_PCAS_A word that names its QMD, filled in when bind/submit has written the QMD and
  constant bank 0 into launch memory (`NVDriver._place`)."""
  name: str
  program: int           # code address
  kern: object           # the cubin kernel (cubin.py): registers, shared memory, parameters
  grid: tuple
  block: tuple
  args_addr: int         # the kernel arguments in hcq's kernarg memory, one 64-bit word each
  cb_size: int           # bytes of constant bank 0

  def word(self, qmd_addr: int) -> int: return qmd_addr >> 8     # SEND_PCAS_A: QMD_ADDRESS_SHIFTED8


@dataclass(eq=False)
class LaunchData(Fixup):
  """A word of the inline write (I2M) that puts a launch's QMD and constant bank 0 into launch memory: the halves of
  the destination (`part` "hi", "lo") or the first of the data words ("data"), for the `nbytes` bytes at `offset` of
  the QMD + bank 0."""
  launch: Launch
  part: str
  offset: int
  nbytes: int


@dataclass(frozen=True)
class GridWord:
  """A launch's grid width that a pushbuffer data word holds (the word at `index` of the encoded words)."""
  index: int


@dataclass(eq=False)
class BoundPushbuffer:
  memory: NVMemory
  words: np.ndarray      # the pushbuffer in memory (uint32 view); hcq patches words by index
  nwords: int
  copies: list           # (kernarg address or GridWord, byte offset in the pushbuffer, bytes): every launch's
                         # parameters (and symbolic grid width) into its inline bank 0 data, copied per submit
  arenas: list           # the launch memory the bound queue holds
  gather: tuple | None = None   # the parameter copies as one numpy gather (NVDriver._param_gather)
