"""The emulated NVIDIA GPU behind drivers/emu/nv_kernel.py: GPU memory, and one GPFIFO processor thread per channel.

A channel thread polls its USERD GPPut (the driver's doorbell write is a plain store, so the thread watches the
USERD page the doorbell announces), fetches GPFIFO entries, parses the pushbuffer methods the driver wrote and
executes them: host semaphore release (64-bit payload, nanosecond timestamp) / acquire (blocks until the value
holds), SET_OBJECT, WFI; the compute class's SEND_PCAS_A + SEND_SIGNALING_PCAS2_B read the QMD and run the kernel
in the PTX interpreter (drivers/emu/ptx.py) with constant bank 0's parameters; the copy class's LAUNCH_DMA copies.
Anything else (an unknown method, a method on an unbound subchannel, an unmapped address, a kernel that traps or
cannot run) stops the channel and becomes a fault naming channel, method and address (returned by `fault()`), and
the error notifier gets the robust-channel error code (info32: 31 memory fault, 13 kernel exception, 32 pushbuffer).
Freeing the channel (RM_FREE) ends the fault; the driver then allocates a new one.

It executes only what it knows, and rejects the rest rather than ignoring it: a method that is not in the class's
table (drivers/nv/pushbuf.py), method data with fields it does not emulate (SEM_EXECUTE reductions, LAUNCH_DMA
semaphores / interrupts / block-linear layouts, PCAS actions other than schedule / invalidate / prefetch), and a QMD
whose version is not V04_00, whose type is not GRID_CTA, that binds constant buffers other than 0, or that has any
bit set outside the V04_00 fields of drivers/nv/qmd.py (the driver wrote something the emulator cannot interpret).
"""
from __future__ import annotations
import functools, operator, struct, threading, time
import numpy as np
from .memory import Memory, MemoryFault
from baregrad.drivers.nv import pushbuf as pb, qmd, rm

QMD_VERSION = (4, 0)          # HOPPER_COMPUTE_A
QMD_TABLE = qmd.TABLES[QMD_VERSION]
QMD_KNOWN_BITS = functools.reduce(operator.or_, (((1 << (hi - lo + 1)) - 1) << lo for hi, lo in QMD_TABLE.values()))
MMU_FAULT = rm.ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT

# NVCBC0_SEND_SIGNALING_PCAS2_B (open-gpu-doc classes/compute/clcbc0.h): PCAS_ACTION 3:0, SELECT 13:8, OFFSET_MINUS_ONE
# 23:14. Actions that schedule the grid launch it; NOP, INVALIDATE and PREFETCH have no effect on an emulator without a
# QMD cache; the dependence / queue / reference-counter actions are not emulated.
PCAS_ACTIONS = {0x0: "NOP", 0x1: "INVALIDATE", 0x2: "SCHEDULE", 0x3: "INVALIDATE_COPY_SCHEDULE", 0x6: "INCREMENT_PUT",
                0x7: "DECREMENT_DEPENDENCE", 0x8: "PREFETCH", 0x9: "PREFETCH_SCHEDULE",
                0xA: "INVALIDATE_PREFETCH_COPY_SCHEDULE", 0xB: "INVALIDATE_PREFETCH_COPY_FORCE_REQUIRE_SCHEDULING",
                0xC: "INCREMENT_DEPENDENCE", 0xD: "INCREMENT_CWD_REF_COUNTER"}
PCAS_LAUNCH, PCAS_NO_EFFECT = {0x2, 0x3, 0x9, 0xA, 0xB}, {0x0, 0x1, 0x8}
INVALIDATE_SHADER_CACHES_FIELDS = (1 << 0) | (1 << 4) | (1 << 12)   # INSTRUCTION 0:0, GLOBAL_DATA 4:4, CONSTANT 12:12

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


class EmulatedProgram:
  """A program the driver uploaded, with its PTX (the documented side channel, README.md)."""
  def __init__(self, ptx: str, name: str, param_base: int, params: list):
    self.ptx, self.name, self.param_base, self.params = ptx, name, param_base, params
    self._module = None

  @property
  def module(self):
    if self._module is None:
      from .ptx import parse_ptx
      self._module = parse_ptx(self.ptx)
    return self._module


class NVGpu:
  def __init__(self):
    self.mem = Memory()
    self.programs: dict[int, EmulatedProgram] = {}
    self.faults: dict["ChannelProcessor", str] = {}     # what stopped each channel that is still allocated
    self.lock = threading.Lock()
    self.channels: list["ChannelProcessor"] = []

  def map_host(self, va: int, host: int, nbytes: int):
    import cffi
    buf = cffi.FFI().buffer(cffi.FFI().cast("uint8_t *", host), nbytes)
    self.mem.map_array(va, np.frombuffer(buf, np.uint8))

  def fault(self, channel: "ChannelProcessor", message: str, xid: int):
    if channel.notifier:     # NvNotification: timeStamp, info32 (the error code), info16, status; written first
      try: self.mem.write(channel.notifier, struct.pack("<QIHH", time.time_ns(), xid, 0, rm.NOTIFICATION_STATUS_ERROR))
      except MemoryFault: pass
    with self.lock: self.faults[channel] = message

  def release(self, channel: "ChannelProcessor"):
    """The channel was freed: stop its thread and forget its fault."""
    channel.stopped = True
    if channel is not threading.current_thread() and channel.is_alive(): channel.join(timeout=5)
    with self.lock:
      self.faults.pop(channel, None)
      if channel in self.channels: self.channels.remove(channel)


class ChannelProcessor(threading.Thread):
  def __init__(self, gpu: NVGpu, name: str, handle: int, ring: int, entries: int, userd: int, notifier: int | None,
               objects: dict, doorbell):
    super().__init__(daemon=True, name=f"nv-emu-{name}")
    self.gpu, self.chname, self.handle, self.ring, self.entries = gpu, name, handle, ring, entries
    self.userd, self.notifier, self.objects, self.doorbell = userd, notifier, objects, doorbell
    self.subchannels: dict[int, int] = {}
    self.state: dict[int, int] = {}         # last value of each method per subchannel (method registers)
    self.stopped = False

  def describe(self) -> str: return f"channel '{self.chname}' (handle {self.handle:#x})"

  def run(self):
    sleep = 1e-5
    userd = self.gpu.mem.array(self.userd, np.uint32, pb.USERD_BYTES // 4)
    while not self.stopped:
      get, put = int(userd[pb.USERD_GP_GET // 4]), int(userd[pb.USERD_GP_PUT // 4])
      if get == put:
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
      userd[pb.USERD_GP_GET // 4] = (get + 1) % self.entries

  def _read(self, addr: int, n: int, what: str) -> bytes:
    try: return self.gpu.mem.read(addr, n)
    except MemoryFault:
      raise ChannelFault(f"{what}: address {addr:#x} (+{n:#x} bytes) is not mapped on the GPU", MMU_FAULT) from None

  def execute(self, words: np.ndarray, base: int):
    i, n = 0, len(words)
    while i < n:
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
        self.method(subc, m, int(words[i + 1 + k]))
      i += 1 + count

  # ---- methods ----
  def method(self, subc: int, m: int, data: int):
    regs = self.state.setdefault(subc, {})
    regs[m] = data
    if m < pb.HOST_METHODS_END: return self.host_method(subc, m, data, regs)
    cls = self.subchannels.get(subc)
    if cls is None: raise ChannelFault(f"method {m:#06x} on subchannel {subc}, which has no object (SET_OBJECT first)")
    if cls == rm.HOPPER_COMPUTE_A:
      if m == pb.SEND_SIGNALING_PCAS2_B: return self.pcas(data, regs)
      if m == pb.INVALIDATE_SHADER_CACHES_NO_WFI:
        if data & ~INVALIDATE_SHADER_CACHES_FIELDS:
          raise ChannelFault(f"INVALIDATE_SHADER_CACHES_NO_WFI {data:#x} on subchannel {subc}: bits "
                             f"{_bit_runs(data & ~INVALIDATE_SHADER_CACHES_FIELDS)} are not fields of clcbc0.h")
        return
      if m in (pb.SEND_PCAS_A, pb.SET_SHADER_SHARED_MEMORY_WINDOW_A, pb.SET_SHADER_SHARED_MEMORY_WINDOW_B,
               pb.SET_SHADER_LOCAL_MEMORY_WINDOW_A, pb.SET_SHADER_LOCAL_MEMORY_WINDOW_B, pb.SET_SHADER_LOCAL_MEMORY_A,
               pb.SET_SHADER_LOCAL_MEMORY_B): return
    elif cls == rm.HOPPER_DMA_COPY_A:
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
                             f"({rm.class_name(rm.HOPPER_CHANNEL_GPFIFO_A)})")

  def pcas(self, data: int, regs: dict):
    action = data & 0xF
    if data & ~0xF:
      raise ChannelFault(f"SEND_SIGNALING_PCAS2_B {data:#x}: bits {_bit_runs(data & ~0xF)} are set; only PCAS_ACTION 3:0 is "
                         f"emulated (SELECT 13:8 and OFFSET_MINUS_ONE 23:14 signal another QMD, other bits are not fields)")
    if action in PCAS_LAUNCH: return self.launch(regs.get(pb.SEND_PCAS_A, 0) << 8)
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
    data = self._read(src, n, "DMA copy source")
    try: self.gpu.mem.write(dst, data)
    except MemoryFault:
      raise ChannelFault(f"DMA copy destination {dst:#x} (+{n:#x} bytes) is not mapped on the GPU", MMU_FAULT) from None

  def check_qmd(self, qmd_addr: int, raw: bytes):
    """Reject a QMD the emulator cannot interpret fully: it would otherwise run something other than what it says."""
    f = qmd.unpack(QMD_TABLE, raw)
    where = f"QMD at {qmd_addr:#x}"
    if (f["QMD_MAJOR_VERSION"], f["QMD_MINOR_VERSION"]) != QMD_VERSION:
      raise ChannelFault(f"{where}: QMD_MAJOR_VERSION {f['QMD_MAJOR_VERSION']} / QMD_MINOR_VERSION {f['QMD_MINOR_VERSION']}: "
                         f"{rm.class_name(rm.HOPPER_COMPUTE_A)} reads QMD V{QMD_VERSION[0]:02d}_{QMD_VERSION[1]:02d} (clcbc0qmd.h)")
    unknown = int.from_bytes(raw, "little") & ~QMD_KNOWN_BITS
    if unknown:
      raise ChannelFault(f"{where}: bits {_bit_runs(unknown)} are set outside every QMD V04_00 field the emulator reads "
                         f"(drivers/nv/qmd.py V04_00); it does not guess what they ask for")
    if f["QMD_TYPE"] != qmd.QMD_TYPE_GRID_CTA:
      raise ChannelFault(f"{where}: QMD_TYPE {f['QMD_TYPE']} is not emulated (only GRID_CTA, {qmd.QMD_TYPE_GRID_CTA})")
    bound = [i for i in range(1, 8) if f[f"CONSTANT_BUFFER_VALID_{i}"]]
    if bound: raise ChannelFault(f"{where}: constant buffers {bound} are valid; the emulator binds only constant buffer 0")

  def launch(self, qmd_addr: int):
    raw = self._read(qmd_addr, qmd.SIZES[QMD_VERSION], "QMD")
    self.check_qmd(qmd_addr, raw)
    q = qmd.read_launch(QMD_VERSION, raw)
    prog = self.gpu.programs.get(q["program"])
    if prog is None: raise ChannelFault(f"QMD at {qmd_addr:#x}: no program was uploaded at code address {q['program']:#x}")
    if not q["cbuf0_valid"]: raise ChannelFault(f"QMD at {qmd_addr:#x}: constant buffer 0 is not valid")
    from .ptx import launch, PtxTrap, PtxUnsupported, PtxError
    entry = prog.module.entries[prog.name] if hasattr(prog.module, "entries") else None
    size = entry.param_size if entry is not None else sum(s for _, _, s in prog.params)
    if q["cbuf0_size"] < prog.param_base + size:
      raise ChannelFault(f"QMD at {qmd_addr:#x}: constant buffer 0 of {q['cbuf0_size']} bytes is too small for the parameters")
    params = self._read(q["cbuf0"] + prog.param_base, size, "constant buffer 0")
    try:
      launch(prog.module, prog.name, q["grid"], q["block"], params, self.gpu.mem)
    except MemoryFault as e:     # the note says where in the kernel: PTX line and instruction
      notes = "".join(f" ({n})" for n in getattr(e, "__notes__", ()))
      raise ChannelFault(f"kernel {prog.name} (QMD {qmd_addr:#x}): {e}{notes}", MMU_FAULT) from None
    except PtxTrap as e:         # its message names the kernel
      raise ChannelFault(f"QMD {qmd_addr:#x}: {e}", rm.ROBUST_CHANNEL_GR_EXCEPTION) from None
    except (PtxUnsupported, PtxError, RuntimeError) as e:     # an instruction it cannot run, a runaway: the SM stops it
      raise ChannelFault(f"kernel {prog.name} (QMD {qmd_addr:#x}): {e}", rm.ROBUST_CHANNEL_GR_EXCEPTION) from None
