"""The emulated NVIDIA GPU behind drivers/emu/nv_kernel.py: GPU memory, and one GPFIFO processor thread per channel.

Three GPUs can be emulated (`GPU_MODELS`): GA100 (A100, sm_80, AMPERE_COMPUTE_A, QMD V03_00), AD102 (RTX 4090, sm_89,
ADA_COMPUTE_A, V03_00) and GH100 (H200, sm_90, HOPPER_COMPUTE_A, V04_00, the default).

A channel fetches GPFIFO entries up to the GPPut its PBDMA read when a doorbell was rung: work starts only once the
driver writes a channel's work-submit token to the usermode NOTIFY_CHANNEL_PENDING register (clc361.h; open-gpu-doc:
GPPut alone is not seen). The register is plain memory here, so the channel threads look at it, consume what was
written (it reads back 0) and then take every channel's USERD GPPut as of that moment: a later token overwriting an
earlier one before it was seen loses no work (the driver writes GPPut before the token), and no work runs without a
doorbell after its GPPut, or with a token that names no channel. A channel thread fetches GPFIFO entries, parses
the pushbuffer methods the driver wrote and executes them: host semaphore release (64-bit payload, nanosecond timestamp) / acquire (blocks until the value
holds), SET_OBJECT, WFI; the compute class's SEND_PCAS_A + SEND_SIGNALING_PCAS2_B read the QMD and run the kernel
in the PTX interpreter (drivers/emu/ptx.py) with constant bank 0's parameters; the copy class's LAUNCH_DMA copies.
Anything else (an unknown method, a method on an unbound subchannel, an unmapped address, a kernel that traps or
cannot run) stops the channel and becomes a fault naming channel, method and address (returned by `fault()`), and
the error notifier gets the robust-channel error code (info32: 31 memory fault, 13 kernel exception, 32 pushbuffer).
Freeing the channel (RM_FREE) ends the fault; the driver then allocates a new one.
What each kernel executed (thread-instructions by class, global and shared bytes: drivers/emu/counters.py) is
kept in `NVGpu.counters` (last run, running total) and the process-wide log; DEBUG=1 prints a line per launch.

It executes only what it knows, and rejects the rest rather than ignoring it: a method that is not in the class's
table (drivers/nv/pushbuf.py), method data with fields it does not emulate (SEM_EXECUTE reductions, LAUNCH_DMA
semaphores / interrupts / block-linear layouts, PCAS actions other than schedule / invalidate / prefetch), and a QMD
whose version is not the GPU's (V04_00 / V03_00), whose type is not GRID_CTA, or that has any bit set outside the
fields of drivers/nv/qmd.py (the driver wrote something the emulator cannot interpret).

What the SASS would need, checked at each launch (`launch`). The emulator runs PTX, so it learns what the machine
code the driver uploaded needs by assembling the same PTX with ptxas for its GPU (drivers/nv/cubin.py; the disk cache
makes it the driver's own cubin) and reading the cubin:
- the code at PROGRAM_ADDRESS is that kernel's `.text`, and the instruction cache holds no stale copy of it: code
  fetched since the last instruction-cache invalidation (INVALIDATE_SHADER_CACHES(_NO_WFI) with INSTRUCTION, or the
  QMD's INVALIDATE_INSTRUCTION_CACHE) is remembered, and a launch whose code memory was rewritten since it was
  fetched faults (the hardware would run the old instructions; the emulator stops the channel rather than run them);
- every constant bank the cubin has is bound with its bytes (bank 2: ptxas's 64-bit immediates), no other;
- the shared-memory carveout (MIN/TARGET/MAX_SM_CONFIG_SHARED_MEM_SIZE, `bytes / 4 KiB + 1`) is one the SM has and
  holds the CTA's shared memory, which SHARED_MEMORY_SIZE covers;
- a kernel with a stack frame has local memory: the stack pointer ptxas code loads from bank 0 (cubin.DRIVER_AREA)
  and the frame below it lie in the thread's local memory (QMD SHADER_LOCAL_MEMORY_LOW_SIZE from address 0, HIGH_SIZE
  below the top of the 16 MiB window), and SET_SHADER_LOCAL_MEMORY_A/B + _NON_THROTTLED_A/B give every resident warp
  of every TPC its slice in mapped memory;
- the bank 0 driver words the PTX's SASS reads (%ntid, %nctaid, the local / shared window for cvta) hold the values.
"""
from __future__ import annotations
import bisect, functools, hashlib, operator, re, struct, threading, time
from dataclasses import dataclass
import numpy as np
from . import counters
from .memory import Memory, MemoryFault
from baregrad.drivers.nv import pushbuf as pb, qmd, rm
from baregrad.drivers.nv.cubin import DRIVER_AREA, LOCAL_WINDOW_BYTES

MMU_FAULT = rm.ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT
GR_EXCEPTION = rm.ROBUST_CHANNEL_GR_EXCEPTION
QMD_KNOWN_BITS = {version: functools.reduce(operator.or_, (((1 << (hi - lo + 1)) - 1) << lo for hi, lo in table.values()))
                  for version, table in qmd.TABLES.items()}


@dataclass(frozen=True)
class GpuModel:
  """One emulated GPU: what RM reports of it and what its SMs offer."""
  chip: str                 # RM's name of the chip (src/nvidia/generated/g_gpu_class_list.c)
  product: str
  pci_device: int           # PCI device id (NV_ESC_CARD_INFO)
  arch: str                 # the ptxas target of its SMs
  qmd_version: tuple        # the QMD its compute class reads
  compute_class: int
  copy_class: int
  sms: int                  # SMs enabled on the product (two per TPC)
  warps_per_sm: int         # resident warps per SM
  carveouts_kib: tuple      # shared-memory carveouts an SM can be set to
  reserved_shared: int      # per-CTA shared memory the system reserves outside the cubin's .nv.shared
  max_channel_va: int       # UVM: a channel's mapped resources lie below this (parent_gpu->max_channel_va)
  user_va_limit: int        # UVM: a user VA range the GPU can address lies below this (uvm_gpu_can_address)
  fb_mib: int = 0           # its video memory, MiB (RM's NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE)

  @property
  def tpcs(self) -> int: return (self.sms + 1) // 2


# SMs: NVIDIA's product specifications (A100 SXM4 108 SMs, RTX 4090 128, H100 SXM5 132); warps per SM and carveouts:
# CUDA C++ Programming Guide, "Compute Capabilities" (8.0: 64 warps, 0..164 KiB; 8.9: 48 warps, 0..100 KiB; 9.0: 64
# warps, 0..228 KiB), which also says 1 KiB of shared memory per block is reserved for system use (sm_90 cubins count it
# in .nv.shared: ptxas's .nv.shared.reserved.0); max_channel_va: kernel-open/nvidia-uvm/uvm_ampere.c, uvm_ada.c (2**40),
# uvm_hopper.c (2**57), 580.142. user_va_limit: uvm_gpu_can_address (uvm_gpu.c) with uvm_get_unaddressable_range
# (uvm_common.h): the GPU's VA bits (49, num_va_bits_pascal in uvm_pascal_mmu.c, for Ampere and Ada; 57,
# num_va_bits_hopper in uvm_hopper_mmu.c) against an x86-64 CPU with 4-level paging (48 VA bits): 49-bit GPUs use the
# CPU's 48 bits, so the lower half ends at 2**47; Hopper keeps its 57, so 2**56.
# The GH100 product is the H200 (SXM, 132 SMs like the H100 SXM5; PCI device 0x2335 "NVIDIA H200", OGKM README.md's
# supported-GPU table at 580.142); its 141 GB of HBM3e are the 143771 MiB nvidia-smi reports as total memory on H200s
# (TOTAL_RAM_SIZE). The others: 40960 MiB (A100-SXM4-40GB) and 24564 MiB (RTX 4090), nvidia-smi's totals too. The
# emulated RM does not model the part of it RM reserves for itself: the heap is the whole of it.
GPU_MODELS = {
  "GA100": GpuModel("GA100", "NVIDIA A100-SXM4-40GB", 0x20B0, "sm_80", (3, 0), rm.AMPERE_COMPUTE_A, rm.AMPERE_DMA_COPY_A,
                    108, 64, (0, 8, 16, 32, 64, 100, 132, 164), 1024, 1 << 40, 1 << 47, fb_mib=40960),
  "AD102": GpuModel("AD102", "NVIDIA GeForce RTX 4090", 0x2684, "sm_89", (3, 0), rm.ADA_COMPUTE_A, rm.AMPERE_DMA_COPY_B,
                    128, 48, (0, 8, 16, 32, 64, 100), 1024, 1 << 40, 1 << 47, fb_mib=24564),
  "GH100": GpuModel("GH100", "NVIDIA H200", 0x2335, "sm_90", (4, 0), rm.HOPPER_COMPUTE_A, rm.HOPPER_DMA_COPY_A,
                    132, 64, (0, 8, 16, 32, 64, 100, 132, 164, 196, 228), 0, 1 << 57, 1 << 56, fb_mib=143771),
}
DEFAULT_GPU = "GH100"

# ptxas code reads these bank 0 words when its PTX uses what the key names (drivers/nv/cubin.py DRIVER_AREA)
PTX_DRIVER_WORDS = {"NTID": re.compile(r"%ntid\b"), "NCTAID": re.compile(r"%nctaid\b"),
                    "LOCAL_WINDOW": re.compile(r"\bcvta(?:\.to)?\.local\b"), "SHARED_WINDOW": re.compile(r"\bcvta(?:\.to)?\.shared\b")}

# NVCBC0_SEND_SIGNALING_PCAS2_B (open-gpu-doc classes/compute/clcbc0.h): PCAS_ACTION 3:0, SELECT 13:8, OFFSET_MINUS_ONE
# 23:14. Actions that schedule the grid launch it; NOP, INVALIDATE and PREFETCH have no effect on an emulator without a
# QMD cache; the dependence / queue / reference-counter actions are not emulated.
PCAS_ACTIONS = {0x0: "NOP", 0x1: "INVALIDATE", 0x2: "SCHEDULE", 0x3: "INVALIDATE_COPY_SCHEDULE", 0x6: "INCREMENT_PUT",
                0x7: "DECREMENT_DEPENDENCE", 0x8: "PREFETCH", 0x9: "PREFETCH_SCHEDULE",
                0xA: "INVALIDATE_PREFETCH_COPY_SCHEDULE", 0xB: "INVALIDATE_PREFETCH_COPY_FORCE_REQUIRE_SCHEDULING",
                0xC: "INCREMENT_DEPENDENCE", 0xD: "INCREMENT_CWD_REF_COUNTER"}
PCAS_LAUNCH, PCAS_NO_EFFECT = {0x2, 0x3, 0x9, 0xA, 0xB}, {0x0, 0x1, 0x8}
INVALIDATE_SHADER_CACHES_FIELDS = (1 << 0) | (1 << 4) | (1 << 12)   # INSTRUCTION 0:0, GLOBAL_DATA 4:4, CONSTANT 12:12
INVALIDATE_SHADER_CACHES_INSTRUCTION = 1 << 0
COMPUTE_STATE_METHODS = (pb.SEND_PCAS_A, pb.SET_SHADER_SHARED_MEMORY_WINDOW_A, pb.SET_SHADER_SHARED_MEMORY_WINDOW_B,
                         pb.SET_SHADER_LOCAL_MEMORY_WINDOW_A, pb.SET_SHADER_LOCAL_MEMORY_WINDOW_B,
                         pb.SET_SHADER_LOCAL_MEMORY_A, pb.SET_SHADER_LOCAL_MEMORY_B,
                         pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B,
                         pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C,
                         pb.SET_I2M_SPARE_NOOP00)      # a no-op method (clcbc0.h): its data word carries nothing

# NVC86F_SEM_EXECUTE (clc86f.h / clc56f.h): the bits the emulator executes; REDUCTION 30:27 and REDUCTION_FORMAT 31:31
# belong to OPERATION_REDUCTION, which it does not emulate. ACQUIRE_SWITCH_TSG 12:12 is a scheduling hint.
SEM_EXECUTE_EMULATED = 0x7 | (1 << 12) | pb.SEM_RELEASE_WFI | pb.SEM_PAYLOAD_SIZE_64BIT | pb.SEM_RELEASE_TIMESTAMP

# NVC8B5_LAUNCH_DMA fields (open-gpu-doc classes/dma-copy/clc8b5.h), and the values the emulator's plain copy honours:
# a field missing from EMULATED must be 0; FLUSH_*, DISABLE_PLC and FORCE_RMWDISABLE do not change the bytes copied.
LAUNCH_DMA_FIELDS = {
  "DATA_TRANSFER_TYPE": (1, 0), "FLUSH_ENABLE": (2, 2), "SEMAPHORE_TYPE": (4, 3), "INTERRUPT_TYPE": (6, 5),
  "SRC_MEMORY_LAYOUT": (7, 7), "DST_MEMORY_LAYOUT": (8, 8), "MULTI_LINE_ENABLE": (9, 9), "REMAP_ENABLE": (10, 10),
  "FORCE_RMWDISABLE": (11, 11), "SRC_TYPE": (12, 12), "DST_TYPE": (13, 13), "SEMAPHORE_REDUCTION": (17, 14),
  "SEMAPHORE_REDUCTION_SIGN": (18, 18), "SEMAPHORE_REDUCTION_ENABLE": (19, 19), "COPY_TYPE": (21, 20),
  "VPRMODE": (22, 22), "MEMORY_SCRUB_ENABLE": (23, 23), "RESERVED_START_OF_COPY": (24, 24), "FLUSH_TYPE": (25, 25),
  "DISABLE_PLC": (26, 26), "SEMAPHORE_PAYLOAD_SIZE": (27, 27), "RESERVED_ERR_CODE": (31, 28)}
LAUNCH_DMA_EMULATED = {"DATA_TRANSFER_TYPE": (1, 2),       # PIPELINED, NON_PIPELINED: both copy
                       "SRC_MEMORY_LAYOUT": (1,), "DST_MEMORY_LAYOUT": (1,),    # PITCH
                       "FLUSH_ENABLE": (0, 1), "FLUSH_TYPE": (0, 1), "DISABLE_PLC": (0, 1), "FORCE_RMWDISABLE": (0, 1)}


def _bit_runs(bits: int, limit: int = 4) -> str:
  """The set bits of `bits` as MW(hi:lo) runs, the first `limit` of them."""
  runs, lo = [], 0
  while bits and len(runs) < limit:
    while not (bits >> lo) & 1: lo += 1
    hi = lo
    while (bits >> (hi + 1)) & 1: hi += 1
    runs.append(f"MW({hi}:{lo})")
    bits &= ~(((1 << (hi - lo + 1)) - 1) << lo)
  return ", ".join(runs) + (", ..." if bits else "")


class ChannelFault(RuntimeError):
  """Stops a channel; `xid` is the robust-channel error code the error notifier gets."""
  def __init__(self, message: str, xid: int = rm.ROBUST_CHANNEL_PBDMA_ERROR):
    super().__init__(message)
    self.xid = xid


class Stopped(Exception):
  pass


_cubins: dict = {}          # (arch, sha256 of the PTX) -> the kernels of its cubin
_cubins_lock = threading.Lock()


def kernel_facts(ptx: str, name: str, arch: str):
  """What the machine code of kernel `name` needs: the CubinKernel of the cubin ptxas makes of `ptx` for `arch`."""
  from baregrad.drivers.nv.cubin import compile_ptx, load_cubin
  key = (arch, hashlib.sha256(ptx.encode()).hexdigest())
  with _cubins_lock: kernels = _cubins.get(key)
  if kernels is None:
    kernels = load_cubin(compile_ptx(ptx, arch))
    with _cubins_lock:
      if len(_cubins) > 256: _cubins.clear()
      _cubins[key] = kernels
  return kernels[name]


class EmulatedProgram:
  """A program the driver uploaded, with its PTX (the documented side channel, README.md)."""
  def __init__(self, ptx: str, name: str, param_base: int, params: list, arch: str = "sm_90"):
    self.ptx, self.name, self.param_base, self.params, self.arch = ptx, name, param_base, params, arch
    self._module = self._cubin = None

  @property
  def module(self):
    if self._module is None:
      from .ptx import parse_ptx
      self._module = parse_ptx(self.ptx)
    return self._module

  @property
  def cubin(self):
    """The kernel's cubin facts (code, constant banks, shared memory, stack frame)."""
    if self._cubin is None: self._cubin = kernel_facts(self.ptx, self.name, self.arch)
    return self._cubin


class WrittenRanges:
  """Address ranges the GPU wrote itself (I2M, the copy engine): `covers(lo, hi)` when one write spanned [lo, hi).
  A cost model, not a rule: a later host write into such a range is not seen (the driver's launch memory is written
  only by the GPU or only by the host). Unmapping memory forgets what was written in it (the list stays as long as the
  live mappings' distinct write destinations)."""

  def __init__(self): self.starts, self.ends = [], {}

  def forget(self, lo: int, hi: int):
    i, j = bisect.bisect_left(self.starts, lo), bisect.bisect_left(self.starts, hi)
    for s in self.starts[i:j]: del self.ends[s]
    del self.starts[i:j]

  def add(self, lo: int, hi: int):
    if lo not in self.ends: bisect.insort(self.starts, lo)
    self.ends[lo] = max(hi, self.ends.get(lo, 0))

  def covers(self, lo: int, hi: int) -> bool:
    i = bisect.bisect_right(self.starts, lo) - 1
    return i >= 0 and self.ends[self.starts[i]] >= hi


class NVGpu:
  def __init__(self, model: GpuModel = GPU_MODELS[DEFAULT_GPU]):
    self.model = model
    self.mem = Memory()
    self.programs: dict[int, EmulatedProgram] = {}
    self.faults: dict["ChannelProcessor", str] = {}     # what stopped each channel that is still allocated
    self.lock = threading.Lock()
    self.channels: list["ChannelProcessor"] = []
    self.icache: dict[int, bytes] = {}      # code fetched since the last instruction-cache invalidation: address -> bytes
    self.counters = counters.CounterLog("NV", parent=counters.PROCESS)   # what each kernel executed (counters.py)
    self.copy_bytes: dict[str, int] = {}    # bytes the copy engine moved (LAUNCH_DMA), per channel name
    self.inline_bytes = 0                   # bytes the compute class wrote from pushbuffer data (I2M)
    # what the GPU itself wrote (I2M, copy engine), and the bytes launches read that it did not write: the host wrote
    # them through BAR1 (a few GB/s write-combined on bare metal, ~6 MB/s where a hypervisor traps each access)
    self.gpu_written = WrittenRanges()
    self.host_written = {"QMD": 0, "constant bank 0": 0, "constant banks": 0, "code": 0}
    self.doorbells: list[np.ndarray] = []   # each usermode page's NOTIFY_CHANNEL_PENDING word (add_doorbell)
    self.doorbell_lock = threading.Lock()
    self.unknown_tokens = 0                 # doorbell writes that named no channel of this GPU (they start nothing)

  def add_doorbell(self, host: int):
    """A usermode object's page at host address `host`: its NOTIFY_CHANNEL_PENDING word is a doorbell."""
    import cffi
    buf = cffi.FFI().buffer(cffi.FFI().cast("uint8_t *", host + pb.USERMODE_NOTIFY_CHANNEL_PENDING), 4)
    with self.doorbell_lock: self.doorbells.append(np.frombuffer(buf, np.uint32))

  def take_doorbells(self):
    """Consume the work-submit tokens written since the last look: when one names a channel, every channel's PBDMA
    reads its USERD GPPut now (the one whose token was overwritten by a later one too: see the top)."""
    with self.doorbell_lock:
      tokens = []
      for word in self.doorbells:
        if (token := int(word[0])): word[0] = 0; tokens.append(token)
      if not tokens: return
      channels = list(self.channels)
      known = {ch.token for ch in channels}
      self.unknown_tokens += sum(t not in known for t in tokens)
      if any(t in known for t in tokens):
        for ch in channels: ch.read_gp_put()

  def invalidate_instruction_cache(self):
    with self.lock: self.icache.clear()

  def map_host(self, va: int, host: int, nbytes: int):
    """The GPU's page tables point `nbytes` at GPU address `va` to the host pages at `host` (system memory: what the
    CPU or another device writes there, the copy engine and semaphores read, and the other way round)."""
    import cffi
    buf = cffi.FFI().buffer(cffi.FFI().cast("uint8_t *", host), nbytes)
    self.mem.map_array(va, np.frombuffer(buf, np.uint8), system=True)

  def fault(self, channel: "ChannelProcessor", message: str, xid: int):
    with self.lock:       # (not after release: the notifier's memory may be unmapped once the channel is freed)
      if channel.released: return
      channel.faulted = True
      if channel.notifier:     # NvNotification: timeStamp, info32 (the error code), info16, status; written first
        try: self.mem.write(channel.notifier, struct.pack("<QIHH", time.time_ns(), xid, 0, rm.NOTIFICATION_STATUS_ERROR))
        except MemoryFault: pass
      self.faults[channel] = message

  def release(self, channel: "ChannelProcessor"):
    """The channel was freed: stop its thread and forget its fault. A thread still inside a long kernel when the join
    gives up writes no more notifier (its memory goes with the client)."""
    channel.stopped = True
    if channel is not threading.current_thread() and channel.is_alive(): channel.join(timeout=5)
    with self.lock:
      channel.released = True
      self.faults.pop(channel, None)
      if channel in self.channels: self.channels.remove(channel)


REGISTER_FILE = qmd.REGISTER_FILE      # the SM's (its own copy: tests lift the driver's limit and keep this one)


class ChannelProcessor(threading.Thread):
  writeback_gp_get = True     # False: never (a PBDMA busy past a lap with no timer write-back yet; tests)
  faulted = False             # set by NVGpu.fault: its channel group is in RM's recovery
  released = False            # set by NVGpu.release: the channel was freed (its memory may be gone)

  def __init__(self, gpu: NVGpu, name: str, handle: int, ring: int, entries: int, userd: int, notifier: int | None,
               objects: dict, doorbell, cls: int = rm.HOPPER_CHANNEL_GPFIFO_A):
    super().__init__(daemon=True, name=f"nv-emu-{name}")
    self.gpu, self.given_name, self.handle, self.ring, self.entries, self.cls = gpu, name, handle, ring, entries, cls
    self.userd, self.notifier, self.objects, self.doorbell = userd, notifier, objects, doorbell
    self.subchannels: dict[int, int] = {}
    self.state: dict[int, int] = {}         # last value of each method per subchannel (method registers)
    self.stopped = False
    self.token = None                       # the work-submit token (NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN)
    self.fetch_put = 0                      # the GPPut read at the last doorbell: entries before it may be fetched
    self.i2m: list | None = None            # an inline write in progress: [destination, bytes, bytes written]

  def read_gp_put(self):
    """A doorbell was rung: the PBDMA reads the channel's USERD GPPut."""
    try: self.fetch_put = struct.unpack("<I", self.gpu.mem.read(self.userd + pb.USERD_GP_PUT, 4))[0]
    except MemoryFault: pass     # (a channel whose USERD went: it is being freed)

  @property
  def chname(self) -> str:
    """'compute' or 'copy' by the engine object it holds (a GR channel may hold either: a copy object on it runs on
    the GR engine's copy engine), else its given name."""
    held = set(self.objects.values())
    if self.gpu.model.compute_class in held: return "compute"
    if self.gpu.model.copy_class in held: return "copy"
    return self.given_name

  def describe(self) -> str: return f"channel '{self.chname}' (handle {self.handle:#x})"

  def run(self):
    sleep = 1e-5
    userd = self.gpu.mem.array(self.userd, np.uint32, pb.USERD_BYTES // 4)
    get = int(userd[pb.USERD_GP_GET // 4])      # the PBDMA's own GP_GET; USERD's copy is written back only when idle
    while not self.stopped:
      self.gpu.take_doorbells()
      put = self.fetch_put
      if get == put:
        # idle: the PBDMA writes GP_GET back to USERD (dev_pbdma.ref.txt: USERD GP_GET is updated when the PBDMA
        # goes idle or on a timer, not per entry; software must not rely on it: the driver tracks its fence)
        if self.writeback_gp_get and userd[pb.USERD_GP_GET // 4] != get: userd[pb.USERD_GP_GET // 4] = get
        time.sleep(sleep); sleep = min(sleep * 2, 1e-3)
        continue
      sleep = 1e-5
      try:
        if put >= self.entries: raise ChannelFault(f"GPPut {put} is past the end of the {self.entries}-entry GPFIFO")
        w0, w1 = struct.unpack("<II", self.gpu.mem.read(self.ring + 8 * get, 8))
        addr, n = pb.decode_gp_entry(w0, w1)
        words = np.frombuffer(self._read(addr, 4 * n, "pushbuffer fetch"), np.uint32)
        self.execute(words, addr)
      except Stopped:          # freed while it waited
        return
      except Exception as e:   # the channel stops, as a faulted channel does
        self.stopped = True
        self.gpu.fault(self, f"NV emulator: {self.describe()} at GPFIFO entry {get}: {e}",
                       getattr(e, "xid", rm.ROBUST_CHANNEL_PBDMA_ERROR))
        return
      get = (get + 1) % self.entries

  def _read(self, addr: int, n: int, what: str) -> bytes:
    try: return self.gpu.mem.read(addr, n)
    except MemoryFault:
      raise ChannelFault(f"{what}: address {addr:#x} (+{n:#x} bytes) is not mapped on the GPU", MMU_FAULT) from None

  def execute(self, words: np.ndarray, base: int):
    i, n = 0, len(words)
    while i < n:
      if self.stopped: raise Stopped()     # freed while a long method ran: nothing more of its stream runs
      header = int(words[i])
      sec_op, subc, method, count = pb.decode_header(header)
      if header == 0: i += 1; continue      # a NOP word
      if sec_op == pb.SEC_OP_IMMD_DATA_METHOD:
        self.method(subc, method, count); i += 1; continue
      if sec_op not in (pb.SEC_OP_INC_METHOD, pb.SEC_OP_NON_INC_METHOD, pb.SEC_OP_ONE_INC):
        raise ChannelFault(f"unknown pushbuffer opcode {sec_op} in header {header:#010x} at {base + 4 * i:#x}")
      if i + count >= n:
        raise ChannelFault(f"method {method:#x} at {base + 4 * i:#x} has {count} data words, the segment ends first")
      for k in range(count):
        if sec_op == pb.SEC_OP_INC_METHOD: m = method + 4 * k
        elif sec_op == pb.SEC_OP_ONE_INC: m = method + (4 if k else 0)
        else: m = method
        if m == pb.I2M_LOAD_INLINE_DATA and sec_op != pb.SEC_OP_INC_METHOD and \
           self.subchannels.get(subc) == self.gpu.model.compute_class:    # the rest of the method's words: data
          self.state.setdefault(subc, {})[m] = int(words[i + count])
          self.inline_data(words[i + 1 + k:i + 1 + count])
          break
        self.method(subc, m, int(words[i + 1 + k]))
      i += 1 + count

  # ---- methods ----
  def method(self, subc: int, m: int, data: int):
    regs = self.state.setdefault(subc, {})
    regs[m] = data
    if m < pb.HOST_METHODS_END: return self.host_method(subc, m, data, regs)
    cls = self.subchannels.get(subc)
    if cls is None: raise ChannelFault(f"method {m:#06x} on subchannel {subc}, which has no object (SET_OBJECT first)")
    if cls == self.gpu.model.compute_class:
      if m == pb.I2M_LOAD_INLINE_DATA: return self.inline_data(np.array([data], np.uint32))
      if self.i2m is not None:
        raise ChannelFault(f"method {m:#06x} while an inline write to {self.i2m[0]:#x} still expects "
                           f"{self.i2m[1] - self.i2m[2]} bytes of LOAD_INLINE_DATA (LINE_LENGTH_IN {self.i2m[1]})")
      if m == pb.I2M_LAUNCH_DMA: return self.start_inline(regs, data)
      if m in (pb.I2M_LINE_LENGTH_IN, pb.I2M_LINE_COUNT, pb.I2M_OFFSET_OUT_UPPER, pb.I2M_OFFSET_OUT): return
      if m == pb.SEND_SIGNALING_PCAS2_B: return self.pcas(data, regs)
      if m == pb.INVALIDATE_SHADER_CACHES_NO_WFI:
        if data & ~INVALIDATE_SHADER_CACHES_FIELDS:
          raise ChannelFault(f"INVALIDATE_SHADER_CACHES_NO_WFI {data:#x} on subchannel {subc}: bits "
                             f"{_bit_runs(data & ~INVALIDATE_SHADER_CACHES_FIELDS)} are not fields of {rm.class_name(cls)}")
        if data & INVALIDATE_SHADER_CACHES_INSTRUCTION: self.gpu.invalidate_instruction_cache()
        return
      if m in COMPUTE_STATE_METHODS: return
    elif cls == self.gpu.model.copy_class:
      if m == pb.LAUNCH_DMA: return self.copy(regs, data)
      if m in (pb.OFFSET_IN_UPPER, pb.OFFSET_IN_LOWER, pb.OFFSET_OUT_UPPER, pb.OFFSET_OUT_LOWER, pb.LINE_LENGTH_IN, pb.LINE_COUNT):
        return
    raise ChannelFault(f"unknown method {m:#06x} (data {data:#x}) for {rm.class_name(cls)} on subchannel {subc}")

  def host_method(self, subc: int, m: int, data: int, regs: dict):
    if m == pb.SET_OBJECT:
      if data not in self.objects.values():
        raise ChannelFault(f"SET_OBJECT {rm.class_name(data)}: no object of that class was allocated under this channel")
      self.subchannels[subc] = data
    elif m == pb.SEM_EXECUTE: self.semaphore(regs, data)
    elif m == pb.WFI:
      if data & ~pb.WFI_SCOPE_ALL:
        raise ChannelFault(f"WFI {data:#x}: bits {_bit_runs(data & ~pb.WFI_SCOPE_ALL)} are not fields of WFI (SCOPE 0:0)")
    elif m in (pb.SEM_ADDR_LO, pb.SEM_ADDR_HI, pb.SEM_PAYLOAD_LO, pb.SEM_PAYLOAD_HI, pb.NON_STALL_INTERRUPT): pass
    else: raise ChannelFault(f"unknown host method {m:#06x} (data {data:#x}) on subchannel {subc} "
                             f"({rm.class_name(self.cls)})")

  def start_inline(self, regs: dict, launch: int):
    """I2M LAUNCH_DMA (clcbc0.h): a pitch-linear write of LINE_LENGTH_IN bytes, one line, to OFFSET_OUT_UPPER:OFFSET_OUT;
    the data follows as LOAD_INLINE_DATA words. Reductions, semaphores, interrupts and block-linear layouts are not
    emulated."""
    fields = {name: (launch >> lo) & ((1 << (hi - lo + 1)) - 1) for name, (hi, lo) in pb.I2M_LAUNCH_DMA_FIELDS.items()}
    known = sum(((1 << (hi - lo + 1)) - 1) << lo for hi, lo in pb.I2M_LAUNCH_DMA_FIELDS.values())
    if launch & ~known: raise ChannelFault(f"I2M LAUNCH_DMA {launch:#x}: bits {_bit_runs(launch & ~known)} are not fields")
    if fields["DST_MEMORY_LAYOUT"] != 1 or fields["REDUCTION_ENABLE"] or fields["COMPLETION_TYPE"] > 1 or \
       fields["INTERRUPT_TYPE"]:
      raise ChannelFault(f"I2M LAUNCH_DMA {launch:#x} ({fields}): only pitch-linear writes without reduction, semaphore "
                         f"release or interrupt are emulated")
    n, lines = regs.get(pb.I2M_LINE_LENGTH_IN, 0), regs.get(pb.I2M_LINE_COUNT, 0)
    if lines != 1 or n == 0:
      raise ChannelFault(f"I2M LAUNCH_DMA: LINE_LENGTH_IN {n}, LINE_COUNT {lines}: only one line of at least one byte is "
                         f"emulated")
    dst = (regs.get(pb.I2M_OFFSET_OUT_UPPER, 0) & 0x1FFFFFF) << 32 | regs.get(pb.I2M_OFFSET_OUT, 0)
    self.i2m = [dst, n, 0]

  def inline_data(self, words: np.ndarray):
    """LOAD_INLINE_DATA words of the inline write in progress."""
    if self.i2m is None: raise ChannelFault("LOAD_INLINE_DATA with no inline write started (I2M LAUNCH_DMA first)")
    dst, total, done = self.i2m
    n = min(4 * len(words), total - done)
    if 4 * len(words) - n >= 4:
      raise ChannelFault(f"{len(words)} LOAD_INLINE_DATA words for the {total - done} bytes left of the inline write to "
                         f"{dst:#x}")
    try: self.gpu.mem.write(dst + done, np.asarray(words, "<u4").tobytes()[:n])
    except MemoryFault:
      raise ChannelFault(f"inline write to {dst + done:#x} (+{n:#x} bytes) is not mapped on the GPU", MMU_FAULT) from None
    self.i2m[2] = done + n
    with self.gpu.lock:
      self.gpu.inline_bytes += n
      if done + n == total: self.gpu.gpu_written.add(dst, dst + total)
    if done + n == total: self.i2m = None

  def host_written(self, what: str, lo: int, n: int):
    """Count `n` bytes at `lo` that a launch reads as `what`, when the GPU did not write them itself."""
    with self.gpu.lock:
      if not self.gpu.gpu_written.covers(lo, lo + n): self.gpu.host_written[what] += n

  def pcas(self, data: int, regs: dict):
    action = data & 0xF
    if data & ~0xF:
      raise ChannelFault(f"SEND_SIGNALING_PCAS2_B {data:#x}: bits {_bit_runs(data & ~0xF)} are set; only PCAS_ACTION 3:0 is "
                         f"emulated (SELECT 13:8 and OFFSET_MINUS_ONE 23:14 signal another QMD, other bits are not fields)")
    if action in PCAS_LAUNCH: return self.launch(regs.get(pb.SEND_PCAS_A, 0) << 8, regs)
    if action in PCAS_NO_EFFECT: return
    what = f"PCAS_ACTION_{PCAS_ACTIONS[action]} is not emulated" if action in PCAS_ACTIONS else "not a PCAS_ACTION of clcbc0.h"
    raise ChannelFault(f"SEND_SIGNALING_PCAS2_B {data:#x}: PCAS_ACTION {action:#x} is {what}")

  def semaphore(self, regs: dict, execute: int):
    if execute & ~SEM_EXECUTE_EMULATED:
      raise ChannelFault(f"SEM_EXECUTE {execute:#x}: bits {_bit_runs(execute & ~SEM_EXECUTE_EMULATED)} (REDUCTION 30:27, "
                         f"REDUCTION_FORMAT 31:31 or undefined bits) are not emulated")
    addr = (regs.get(pb.SEM_ADDR_HI, 0) & 0x1FFFFFF) << 32 | (regs.get(pb.SEM_ADDR_LO, 0) & 0xFFFFFFFC)
    payload = regs.get(pb.SEM_PAYLOAD_LO, 0)
    wide = bool(execute & pb.SEM_PAYLOAD_SIZE_64BIT)
    if wide: payload |= regs.get(pb.SEM_PAYLOAD_HI, 0) << 32
    op, size = execute & 7, 8 if wide else 4
    # dev_pbdma.ref.txt (open-gpu-doc, Hopper) 3786-3795, 3865: a 64-bit payload's address is 8-byte aligned and a
    # release with RELEASE_TIMESTAMP writes 16 bytes at a 16-byte aligned address; otherwise PBDMA_INTR_0_SEMAPHORE
    need = 16 if op == pb.SEM_OPERATION_RELEASE and execute & pb.SEM_RELEASE_TIMESTAMP else size
    if addr % need:
      raise ChannelFault(f"semaphore {'release' if op == pb.SEM_OPERATION_RELEASE else 'acquire'} at {addr:#x}: "
                         f"{'a timestamped release' if need == 16 else f'a {8 * size}-bit payload'} needs a {need}-byte "
                         f"aligned address (PBDMA_INTR_0_SEMAPHORE)")
    fmt = "<Q" if wide else "<I"
    if op == pb.SEM_OPERATION_RELEASE:
      try:
        self.gpu.mem.write(addr, struct.pack(fmt, payload))
        if execute & pb.SEM_RELEASE_TIMESTAMP: self.gpu.mem.write(addr + 8, struct.pack("<Q", time.time_ns()))
      except MemoryFault: raise ChannelFault(f"semaphore release at unmapped address {addr:#x}", MMU_FAULT) from None
    elif op in (pb.SEM_OPERATION_ACQUIRE, pb.SEM_OPERATION_ACQ_STRICT_GEQ):
      sleep = 1e-5
      while not self.stopped:
        value = struct.unpack(fmt, self._read(addr, size, "semaphore acquire"))[0]
        if (value == payload) if op == pb.SEM_OPERATION_ACQUIRE else (value >= payload): return
        time.sleep(sleep); sleep = min(sleep * 2, 1e-3)
      raise Stopped()
    else: raise ChannelFault(f"SEM_EXECUTE operation {op} is not emulated")

  def copy(self, regs: dict, launch: int):
    for name, (hi, lo) in LAUNCH_DMA_FIELDS.items():
      value = (launch >> lo) & ((1 << (hi - lo + 1)) - 1)
      if value not in LAUNCH_DMA_EMULATED.get(name, (0,)):
        raise ChannelFault(f"LAUNCH_DMA {launch:#x}: {name} ({hi}:{lo}) = {value} is not emulated; only virtual, "
                           f"single-line, pitch copies without semaphore, interrupt or reduction are")
    src = regs.get(pb.OFFSET_IN_UPPER, 0) << 32 | regs.get(pb.OFFSET_IN_LOWER, 0)
    dst = regs.get(pb.OFFSET_OUT_UPPER, 0) << 32 | regs.get(pb.OFFSET_OUT_LOWER, 0)
    n = regs.get(pb.LINE_LENGTH_IN, 0)
    views = []
    for addr, what in ((src, "source"), (dst, "destination")):      # one memmove, from GPU memory to GPU memory
      try: views.append(self.gpu.mem.array(addr, np.uint8, n))
      except MemoryFault:
        raise ChannelFault(f"DMA copy {what} {addr:#x} (+{n:#x} bytes) is not mapped on the GPU", MMU_FAULT) from None
    views[1][:] = views[0]
    with self.gpu.lock:
      self.gpu.copy_bytes[self.chname] = self.gpu.copy_bytes.get(self.chname, 0) + n
      self.gpu.gpu_written.add(dst, dst + n)

  def check_qmd(self, qmd_addr: int, raw: bytes):
    """Reject a QMD the emulator cannot interpret fully: it would otherwise run something other than what it says."""
    version = self.gpu.model.qmd_version
    table = qmd.TABLES[version]
    f = qmd.unpack(table, raw)
    where, name = f"QMD at {qmd_addr:#x}", f"V{version[0]:02d}_{version[1]:02d}"
    minor = f["QMD_MINOR_VERSION"] if version == (4, 0) else f["QMD_VERSION"]
    if (f["QMD_MAJOR_VERSION"], minor) != version:
      raise ChannelFault(f"{where}: QMD_MAJOR_VERSION {f['QMD_MAJOR_VERSION']} / QMD_MINOR_VERSION {minor}: "
                         f"{rm.class_name(self.gpu.model.compute_class)} reads QMD {name}")
    unknown = int.from_bytes(raw, "little") & ~QMD_KNOWN_BITS[version]
    if unknown:
      raise ChannelFault(f"{where}: bits {_bit_runs(unknown)} are set outside every QMD {name} field the emulator reads "
                         f"(drivers/nv/qmd.py {name}); it does not guess what they ask for")
    if version == (4, 0) and f["QMD_TYPE"] != qmd.QMD_TYPE_GRID_CTA:
      raise ChannelFault(f"{where}: QMD_TYPE {f['QMD_TYPE']} is not emulated (only GRID_CTA, {qmd.QMD_TYPE_GRID_CTA})")

  def launch(self, qmd_addr: int, regs: dict | None = None):
    regs = regs if regs is not None else {}
    model = self.gpu.model
    raw = self._read(qmd_addr, qmd.SIZES[model.qmd_version], "QMD")
    self.host_written("QMD", qmd_addr, len(raw))
    self.check_qmd(qmd_addr, raw)
    q = qmd.read_launch(model.qmd_version, raw)
    if q["invalidate_instruction_cache"]: self.gpu.invalidate_instruction_cache()
    prog = self.gpu.programs.get(q["program"])
    if prog is None: raise ChannelFault(f"QMD at {qmd_addr:#x}: no program was uploaded at code address {q['program']:#x}")
    where = f"kernel {prog.name} (QMD {qmd_addr:#x})"
    kern = prog.cubin
    self.fetch_code(where, q["program"], kern.text)
    bank0, param_size = self.check_constant_banks(where, q, prog, kern)
    self.check_shared_memory(where, q, kern)
    threads = q["block"][0] * q["block"][1] * q["block"][2]
    if qmd.block_registers(q["registers"], threads) > REGISTER_FILE:
      raise ChannelFault(f"{where}: {threads} threads x REGISTER_COUNT {q['registers']} need "
                         f"{qmd.block_registers(q['registers'], threads)} registers, more than the SM's register file "
                         f"({REGISTER_FILE})", GR_EXCEPTION)
    if q["registers"] < kern.registers:
      raise ChannelFault(f"{where}: REGISTER_COUNT {q['registers']} is less than the {kern.registers} registers the "
                         f"cubin's code uses", GR_EXCEPTION)
    if kern.stack_size: self.check_local_memory(where, q, kern, bank0, regs)
    self.check_driver_words(where, q, prog, bank0, regs)
    params = bank0[prog.param_base:prog.param_base + param_size]
    from .ptx import launch, PtxTrap, PtxUnsupported, PtxError
    try:
      run = launch(prog.module, prog.name, q["grid"], q["block"], params, self.gpu.mem)
    except MemoryFault as e:     # the note says where in the kernel: PTX line and instruction
      notes = "".join(f"\n{n}" if "\n" in n else f" ({n})" for n in getattr(e, "__notes__", ()))   # the warp: lines
      raise ChannelFault(f"kernel {prog.name} (QMD {qmd_addr:#x}): {e}{notes}", MMU_FAULT) from None
    except PtxTrap as e:         # its message names the kernel; its note shows the warp
      notes = "".join(f"\n{n}" for n in getattr(e, "__notes__", ()))
      raise ChannelFault(f"QMD {qmd_addr:#x}: {e}{notes}", GR_EXCEPTION) from None
    except (PtxUnsupported, PtxError, RuntimeError) as e:     # an instruction it cannot run, a runaway: the SM stops it
      raise ChannelFault(f"kernel {prog.name} (QMD {qmd_addr:#x}): {e}", GR_EXCEPTION) from None
    self.gpu.counters.record(run)     # before the methods after the launch (a semaphore release) run

  # ---- what the machine code needs (see the module docstring) ----
  def fetch_code(self, where: str, addr: int, text: bytes):
    """The SMs fetch the kernel's code through the instruction cache: memory must hold the kernel's SASS, and no
    cached copy of these addresses may predate a rewrite of them (the cache would serve the old instructions)."""
    code = self._read(addr, len(text), f"{where}: code fetch")
    self.host_written("code", addr, len(text))
    if code != text:
      first = next(i for i in range(len(text)) if code[i] != text[i])
      raise ChannelFault(f"{where}: the code at {addr:#x} is not this kernel's SASS (first difference at +{first:#x}; "
                         f"the program memory was overwritten or the cubin's .text was not uploaded as is)", GR_EXCEPTION)
    end = addr + len(text)
    with self.gpu.lock:
      for start, cached in self.gpu.icache.items():
        lo, hi = max(start, addr), min(start + len(cached), end)
        if lo < hi and cached[lo - start:hi - start] != code[lo - addr:hi - addr]:
          raise ChannelFault(f"{where}: stale instruction cache: code at {lo:#x}..{hi:#x} was rewritten since it was "
                             f"fetched and no instruction-cache invalidation came between (INVALIDATE_SHADER_CACHES with "
                             f"INSTRUCTION, or the QMD's INVALIDATE_INSTRUCTION_CACHE); the SMs would run the old code",
                             GR_EXCEPTION)
      self.gpu.icache[addr] = code

  def check_constant_banks(self, where: str, q: dict, prog: EmulatedProgram, kern) -> tuple[bytes, int]:
    """Bank 0 holds the parameters; every other bank of the cubin is bound with its bytes, and nothing else is."""
    cbufs = q["cbufs"]
    if 0 not in cbufs: raise ChannelFault(f"{where}: constant buffer 0 is not valid")
    entry = prog.module.entries[prog.name] if hasattr(prog.module, "entries") else None
    size = entry.param_size if entry is not None else sum(s for _, _, s in prog.params)
    addr0, size0 = cbufs[0]
    if size0 < prog.param_base + size:
      raise ChannelFault(f"{where}: constant buffer 0 of {size0} bytes is too small for the parameters")
    bank0 = self._read(addr0, size0, "constant buffer 0")
    self.host_written("constant bank 0", addr0, size0)
    for bank, data in sorted(kern.const_banks.items()):
      if not data: continue
      if bank not in cbufs:
        raise ChannelFault(f"{where}: the kernel reads constant bank {bank} (.nv.constant{bank}, {len(data)} bytes) but "
                           f"the QMD binds no constant buffer {bank} (CONSTANT_BUFFER_VALID_{bank} is 0)", GR_EXCEPTION)
      addr, bound = cbufs[bank]
      self.host_written("constant banks", addr, len(data))
      if bound < len(data) or self._read(addr, len(data), f"constant buffer {bank}") != data:
        raise ChannelFault(f"{where}: constant buffer {bank} at {addr:#x} ({bound} bytes) does not hold the cubin's "
                           f".nv.constant{bank} ({len(data)} bytes)", GR_EXCEPTION)
    extra = sorted(b for b in cbufs if b and not kern.const_banks.get(b))
    if extra:
      raise ChannelFault(f"{where}: constant buffers {extra} are valid but the kernel has no such constant bank", GR_EXCEPTION)
    return bank0, size

  def check_shared_memory(self, where: str, q: dict, kern):
    model = self.gpu.model
    options = [kib << 10 for kib in model.carveouts_kib]
    fields = ("MIN", "TARGET", "MAX")
    sizes = []
    for name, value in zip(fields, q["sm_config"]):
      nbytes = qmd.sm_config_bytes(value)
      if nbytes not in options:
        raise ChannelFault(f"{where}: {name}_SM_CONFIG_SHARED_MEM_SIZE {value} is not a shared-memory carveout of a "
                           f"{model.arch} SM (the field is KiB / 4 + 1 of one of {model.carveouts_kib} KiB)", GR_EXCEPTION)
      sizes.append(nbytes)
    if not sizes[0] <= sizes[1] <= sizes[2]:
      raise ChannelFault(f"{where}: SM_CONFIG_SHARED_MEM_SIZE MIN {sizes[0]} <= TARGET {sizes[1]} <= MAX {sizes[2]} does "
                         f"not hold", GR_EXCEPTION)
    if q["shared"] < kern.shared_size:
      raise ChannelFault(f"{where}: SHARED_MEMORY_SIZE {q['shared']} is below the kernel's {kern.shared_size} bytes of "
                         f"shared memory (.nv.shared)", GR_EXCEPTION)
    need = q["shared"] + model.reserved_shared
    if need > sizes[0]:
      raise ChannelFault(f"{where}: a CTA needs {need} bytes of shared memory ({q['shared']} + {model.reserved_shared} "
                         f"reserved) but MIN_SM_CONFIG_SHARED_MEM_SIZE configures a carveout of {sizes[0]}", GR_EXCEPTION)

  def check_local_memory(self, where: str, q: dict, kern, bank0: bytes, regs: dict):
    """A stack frame: the stack pointer from bank 0 and the frame below it lie in the thread's local memory, and the
    channel's local memory gives every resident warp of every TPC its slice."""
    model = self.gpu.model
    low, high = q["local"]
    sp = struct.unpack_from("<I", bank0, DRIVER_AREA["STACK_POINTER"])[0]
    frame = (sp - kern.stack_size, sp)
    inside = (0 <= frame[0] and frame[1] <= low) or (LOCAL_WINDOW_BYTES - high <= frame[0] and frame[1] <= LOCAL_WINDOW_BYTES)
    if not inside:
      raise ChannelFault(f"{where}: the kernel's {kern.stack_size}-byte stack frame lies at local addresses "
                         f"{frame[0]:#x}..{frame[1]:#x} (the stack pointer c[0x0][{DRIVER_AREA['STACK_POINTER']:#x}] is "
                         f"{sp:#x}) outside the thread's local memory (SHADER_LOCAL_MEMORY_LOW_SIZE {low:#x} from 0, "
                         f"HIGH_SIZE {high:#x} below {LOCAL_WINDOW_BYTES:#x})", GR_EXCEPTION)
    base = (regs.get(pb.SET_SHADER_LOCAL_MEMORY_A, 0) & 0x1FFFFFF) << 32 | regs.get(pb.SET_SHADER_LOCAL_MEMORY_B, 0)
    per_tpc = (regs.get(pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, 0) & 0xFF) << 32 | \
      regs.get(pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B, 0)
    need = (low + high) * 32 * model.warps_per_sm * 2
    if not base or per_tpc < need:
      raise ChannelFault(f"{where}: the kernel has a {kern.stack_size}-byte stack frame but the channel's shader local "
                         f"memory is {'not set (SET_SHADER_LOCAL_MEMORY_A/B)' if not base else f'{per_tpc:#x} bytes per TPC'}"
                         f"; {low + high:#x} bytes per thread need {need:#x} per TPC ({model.warps_per_sm} warps x 2 SMs) "
                         f"(SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A/B)", GR_EXCEPTION)
    total = per_tpc * model.tpcs
    self._read(base, 1, "shader local memory"); self._read(base + total - 1, 1, f"shader local memory (TPC {model.tpcs - 1})")

  def check_driver_words(self, where: str, q: dict, prog: EmulatedProgram, bank0: bytes, regs: dict):
    """The bank 0 words the kernel's SASS reads for what its PTX uses (cubin.DRIVER_AREA)."""
    window = lambda a, b: (regs.get(a, 0) & 0x1FFFF) << 32 | regs.get(b, 0)
    want = {"NTID": struct.pack("<3I", *q["block"]), "NCTAID": struct.pack("<3I", *q["grid"]),
            "LOCAL_WINDOW": struct.pack("<Q", window(pb.SET_SHADER_LOCAL_MEMORY_WINDOW_A, pb.SET_SHADER_LOCAL_MEMORY_WINDOW_B))}
    shared = window(pb.SET_SHADER_SHARED_MEMORY_WINDOW_A, pb.SET_SHADER_SHARED_MEMORY_WINDOW_B)
    local = window(pb.SET_SHADER_LOCAL_MEMORY_WINDOW_A, pb.SET_SHADER_LOCAL_MEMORY_WINDOW_B)
    hopper = int(self.gpu.model.arch[3:]) >= 90
    if PTX_DRIVER_WORDS["SHARED_WINDOW"].search(prog.ptx):      # generic addresses of shared memory
      # sm_90 code forms them as SR_SWINHI (the window's high 32 bits) : offset, so the window is 4 GiB aligned and
      # spans 4 GiB (Mesa NVK nvk_cmd_dispatch.c: "shared memory window needs 4GB alignment on hopper+"); earlier
      # ones add a 16 MiB window to the offset. Either way it must not overlap the local window.
      span = 1 << 32 if hopper else 1 << 24
      if hopper and (shared & 0xFFFFFFFF or not shared):
        raise ChannelFault(f"{where}: the shader shared memory window {shared:#x} is not 4 GiB aligned: sm_90 code forms "
                           f"generic shared addresses from its high 32 bits (SR_SWINHI), so they would be global "
                           f"addresses", MMU_FAULT)
      if shared < local + LOCAL_WINDOW_BYTES and local < shared + span:
        raise ChannelFault(f"{where}: the shader shared memory window [{shared:#x}, +{span:#x}) overlaps the local "
                           f"memory window [{local:#x}, +{LOCAL_WINDOW_BYTES:#x}): generic addresses are ambiguous",
                           MMU_FAULT)
    if not hopper:     # sm_90 code forms shared addresses from SR_SWINHI instead of bank 0
      want["SHARED_WINDOW"] = struct.pack("<Q", shared)
    for key, value in want.items():
      if not PTX_DRIVER_WORDS[key].search(prog.ptx): continue
      at = DRIVER_AREA[key]
      got = bank0[at:at + len(value)]
      if got != value:
        raise ChannelFault(f"{where}: the kernel reads {key} from c[0x0][{at:#x}] ({len(value)} bytes): it holds "
                           f"{got.hex()}, the launch needs {value.hex()}", GR_EXCEPTION)
