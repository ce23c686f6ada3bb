"""The emulated gfx1100's queue engines: a PM4 command processor (compute queue) and an SDMA engine (copy queue).

One thread per queue, woken by its doorbell: the thread polls the doorbell word (memory the process mapped
from /dev/kfd) with back-off, and on a new write pointer parses the ring the driver wrote, packet by packet,
with the same tables the driver encodes with (drivers/amd/pm4.py, sdma.py). Dispatches run in the RDNA3
emulator (drivers/emu/rdna3.py) over the GPU's virtual memory; RELEASE_MEM / FENCE write signals, RELEASE_MEM
DATA_SEL 3 and SDMA TIMESTAMP write the 100 MHz clock, interrupts (RELEASE_MEM INT_SEL, SDMA TRAP) signal KFD
events, WAIT_REG_MEM(64) / POLL_REGMEM block the queue until the memory condition holds.

The read pointer is written back after each packet (an indirect buffer counts as its INDIRECT packet), so a
queue that stops (unknown packet, memory fault) leaves it on the offending packet, and the kernel reports the
fault through the exception events with a dmesg line naming queue, packet and address.

Rules from the Linux sources the engines enforce (each cited where it is checked):
  * HDP: a packet that reads a VRAM BO once (a dispatch's code and kernel arguments, a copy's source, an indirect
    buffer, SDMA COND_EXE) must come after an HDP flush that ran after its doorbell was picked up (kfd_kernel.py has the
    model); polls (WAIT_REG_MEM, POLL_REGMEM) are not checked: they read again until the value arrives.
  * SDMA FENCE without MTYPE UC writes the GPU L2, not memory: the host sees it only after a GL2 write-back.
  * Interrupts: amdkfd ignores one whose event slot still reads UNSIGNALED (kfd_kernel.py signal_interrupt).
  * COMPUTE_PGM_RSRC1.PRIV must be set on a dispatch (gfx11 context save/restore).
  * SDMA: the HDP is flushed with ROCr's user-mode firmware packet (the register form is for privileged rings); an
    INDIRECT ends on an 8-dword ring boundary with a 32-byte-aligned IB of a multiple of 8 dwords (sdma_v6_0.c).
  * Commands are fetched only from BOs allocated executable (rings, indirect buffers).
  * Errors: a memory fault signals the memory-exception events; a compute queue's other errors reach the process
    through its context-save-area header (kfd_kernel.py send_exception_to_runtime); an SDMA queue's only the log.
  * A workgroup must fit: its waves' VGPRs (COMPUTE_PGM_RSRC1.VGPRS) on one WGP and its LDS in 64 KiB (rdna3.py
    check_launch, LaunchError), as the hardware could never launch it; the RDNA3 emulator also refuses LDS accesses
    of two waves of a workgroup with no s_barrier between (rdna3_mem.LDSOrder).
  * WAIT_REG_MEM64: no Linux code emits it for gfx11's MEC; IREE's AMDGPU HAL uses it on gfx1100 (validated there,
    physical_device_capabilities.c); the one form the driver needs is accepted, any other is refused.

The engines are strict: what they do not model stops the queue with a message naming it, instead of being skipped.
A PM4 opcode other than the ones below, a SET_SH_REG of a register outside pm4.REGISTERS, an SDMA op/sub_op other
than the packets of sdma.PACKETS, an event, DATA_SEL/INT_SEL/DST_SEL or compare function the emulator does not
implement: each is an error here, so a driver that writes them (or a wrong constant in the shared tables that turns
a good packet into one of them) fails in CI instead of passing unnoticed.
"""
from __future__ import annotations
import hashlib, threading, time
import numpy as np

from baregrad.drivers.amd import kfd as kfd_abi, pm4, sdma
from baregrad.drivers.amd.codeobj import KernelDescriptor, RSRC1, RSRC2, RSRC3, PROPERTIES, RSRC1_PRIV
from . import counters as counters_mod
from .counters import KernelCounters
from .memory import MemoryFault

# WAIT_REG_MEM / POLL_REGMEM FUNCTION (amdgpu/nvd.h WAIT_REG_MEM_FUNCTION; radeon/cikd.h SDMA_POLL_REG_MEM_EXTRA_FUNC):
# 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >; 7 is not a function
_COMPARE = {0: lambda v, r: True, 1: lambda v, r: v < r, 2: lambda v, r: v <= r, 3: lambda v, r: v == r,
            4: lambda v, r: v != r, 5: lambda v, r: v >= r, 6: lambda v, r: v > r}
# the events the compute queue models (VGT_EVENT_TYPE; EVENT_INDEX as nvd.h / PAL's MEC packets give it):
# EVENT_WRITE CS_PARTIAL_FLUSH with index 4 (*S_PARTIAL_FLUSH); RELEASE_MEM end-of-pipe timestamp events, index 5
EVENT_WRITE_EVENTS = {pm4.CS_PARTIAL_FLUSH: ("CS_PARTIAL_FLUSH", 4)}
RELEASE_MEM_EVENTS = {pm4.CACHE_FLUSH_AND_INV_TS_EVENT: ("CACHE_FLUSH_AND_INV_TS_EVENT", 5),
                      pm4.BOTTOM_OF_PIPE_TS: ("BOTTOM_OF_PIPE_TS", 5)}
RELEASE_MEM_DST_SEL = (0, 1)          # memory (MC) or L2: both land in memory here; 2/3 (queue write pointer) do not
SDMA_OP_NAMES = {v: k for k, v in sdma.OP.items()}
# SDMA FENCE MTYPE: sdma_v6_0_ring_emit_fence (amdgpu/sdma_v6_0.c) writes its fences with
# SDMA_PKT_FENCE_HEADER_MTYPE(0x3) /* Ucached(UC) */; the other (cached) MTYPEs can leave the value in the GPU's L2
SDMA_MTYPE_UC = 3
# ROCr's user-mode SDMA HDP flush (runtime/hsa-runtime/core/inc/sdma_registers.h SDMA_PKT_HDP_FLUSH, used by
# amd_blit_sdma.cpp BuildHdpFlushCommand): a POLL_REGMEM-opcode packet the SDMA firmware (gfx9 microcode >= 0x1A5)
# treats as "flush the HDP" for an unprivileged queue; exactly these six dwords
HDP_FLUSH_PACKET = sdma.HDP_FLUSH_PACKET
# the GPU_HDP_FLUSH_REQ/DONE client bits that exist (nbio_4_3_0_sh_mask.h: CP0-CP9, SDMA0, SDMA1)
HDP_FLUSH_CLIENTS = sum(pm4.HDP_FLUSH_BITS.values())


class QueueError(Exception):
  """Stops a queue: `message` names the packet; `va` is set for memory faults; `code` is the exception code amdkfd
  reports to the runtime for it (kfd_ioctl.h enum kfd_dbg_trap_exception_code)."""
  def __init__(self, message: str, va: int | None = None, code: int = kfd_abi.EC["EC_QUEUE_PACKET_UNSUPPORTED"]):
    super().__init__(message)
    self.va, self.code = va, code


class Stopped(Exception):
  pass


class EngineQueue(threading.Thread):
  kind, unit, engine = "?", 4, "?"

  def decode(self, packets, words, pos, where):
    """(name, fields, size) of the packet at pos, by the `packets` module (pm4 / sdma); kept in the history."""
    try:
      name, f, size = packets.decode(words, pos)
    except packets.PacketError as e:
      raise QueueError(f"{where}: {e}") from None
    self.history.append(name)
    if len(self.history) > 256: del self.history[:128]
    return name, f, size

  def __init__(self, kfd, queue_id, ring_base, ring_size, rptr_addr, wptr_addr, doorbell):
    super().__init__(daemon=True, name=f"emulated {self.engine} queue {queue_id}")
    self.kfd, self.queue_id = kfd, queue_id
    self.ring_base, self.ring_dwords = ring_base, ring_size // 4
    self.rptr_addr, self.wptr_addr, self.doorbell = rptr_addr, wptr_addr, doorbell
    self.rptr = 0                 # dwords, monotonic
    self.csa_addr = 0             # the context-save area (compute queues; CREATE_QUEUE sets it)
    self.ring_checked = None      # the ring's BO was found executable (check_executable, on the first fetch)
    self.stopping = False
    self.dead: str | None = None
    self.packets_done = 0
    self.pickup_epoch = 0         # kfd.host_epoch when this engine last picked up new commands (the HDP model)
    self.history: list[str] = []  # names of the last packets executed (tests inspect it)
    with kfd.lock:
      self.ring = kfd.memory.array(ring_base, np.uint32, self.ring_dwords)

  def stop(self):
    self.stopping = True
    if self is not threading.current_thread(): self.join(timeout=5)

  def describe(self) -> str: return f"{self.kind} queue {self.queue_id} ({self.engine}, ring at {self.ring_base:#x})"

  # ---- memory ----
  def read(self, addr: int, nbytes: int) -> bytes:
    """The engine's view of memory: what an SDMA FENCE left in the GPU L2 over what memory holds."""
    with self.kfd.lock:
      try: data = self.kfd.memory.read(addr, nbytes)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None
      lines = self.kfd.gl2_lines
      if lines:
        out = bytearray(data)
        for a in range(addr & ~3, addr + nbytes, 4):
          line = lines.get(a)
          if line is None: continue
          for k in range(4):
            if addr <= a + k < addr + nbytes: out[a + k - addr] = line[k]
        data = bytes(out)
      return data

  def write(self, addr: int, data: bytes):
    with self.kfd.lock:
      try: self.kfd.memory.write(addr, data)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None
      lines = self.kfd.gl2_lines
      if lines:                   # a later write to memory supersedes what the L2 held there
        for a in range(addr & ~3, addr + len(data), 4): lines.pop(a, None)

  def write_l2(self, addr: int, data: bytes, where: str):
    """A write that stays in the GPU L2 (an SDMA FENCE without MTYPE UC): engines see it, the host does not."""
    with self.kfd.lock:
      if self.kfd.mapping_of(addr) is None: raise QueueError(f"{where}: {MemoryFault(addr, len(data), True)}", addr)
      self.kfd.gl2_lines[addr] = bytes(data)

  def check_hdp(self, addr: int, what: str, where: str):
    """A one-shot read of `addr`: if it is VRAM, the host's writes there must have been flushed from the HDP after this
    engine picked up the doorbell (gfx_v11_0_ring_emit_hdp_flush / sdma_v6_0_ring_emit_hdp_flush; see kfd_kernel.py)."""
    bo = self.kfd.mapping_of(addr)
    if bo is None or not bo.flags & kfd_abi.ALLOC_VRAM or self.kfd.hdp_flushed_epoch >= self.pickup_epoch: return
    raise QueueError(f"{where}: {what} reads VRAM at {addr:#x} (BO at {bo.va:#x}) with no HDP flush since the doorbell: "
                     f"what the host wrote there through the BAR may still sit in the HDP and the GPU would read stale "
                     f"bytes. Start the submission with an HDP flush (PM4: WAIT_REG_MEM write-wait-write of "
                     f"GPU_HDP_FLUSH_REQ/DONE as gfx_v11_0_ring_emit_hdp_flush; SDMA: the user-mode firmware packet "
                     f"SDMA_PKT_HDP_FLUSH of ROCr's sdma_registers.h)")

  def hdp_flush_registers(self, req: int, done: int, func: int, ref: int, mask: int, what: str, where: str):
    """The HDP flush handshake: write ref_and_mask to GPU_HDP_FLUSH_REQ, wait for GPU_HDP_FLUSH_DONE & mask == ref
    (nbio_v4_3_get_hdp_flush_req_offset / _done_offset, amdgpu/nbio_v4_3.c); the flush completes at once here."""
    if (req, done) != (pm4.HDP_FLUSH_REQ, pm4.HDP_FLUSH_DONE):
      raise QueueError(f"{where}: {what} on registers {req:#x} / {done:#x}: only the HDP flush (GPU_HDP_FLUSH_REQ "
                       f"{pm4.HDP_FLUSH_REQ:#x}, GPU_HDP_FLUSH_DONE {pm4.HDP_FLUSH_DONE:#x}) is emulated")
    if func != pm4.FUNC["=="] or ref != mask or not ref or ref & ~HDP_FLUSH_CLIENTS:
      raise QueueError(f"{where}: {what} HDP flush with function {func}, reference {ref:#x}, mask {mask:#x}: amdgpu "
                       f"waits for DONE & ref_and_mask == ref_and_mask (function 3), ref_and_mask a set of the client "
                       f"bits {HDP_FLUSH_CLIENTS:#x} (CP0-CP9, SDMA0-1); another compare never completes")
    self.kfd.hdp_flush()

  def read_u32(self, addr: int) -> int: return int.from_bytes(self.read(addr, 4), "little")

  def copy(self, dst: int, src: int, nbytes: int):
    with self.kfd.lock:
      self.kfd.copy_engine_bytes += nbytes
      try:
        s = self.kfd.memory.array(src, np.uint8, nbytes)
        d = self.kfd.memory.array(dst, np.uint8, nbytes)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None
      d[:] = s
      lines = self.kfd.gl2_lines
      if lines:                   # the copy's writes supersede what the L2 held there
        for a in [a for a in lines if dst <= a < dst + nbytes]: del lines[a]

  def poll_memory(self, addr: int, mask: int, func: int, ref: int, what: str, nbytes: int = 4):
    """Block until (mem[addr] & mask) func ref, on a dword or (nbytes 8) a qword; returns when the queue is stopped."""
    if func not in _COMPARE: raise QueueError(f"{what}: compare function {func} is reserved (0-6 are defined)")
    delay = 1e-5
    while not self.stopping:
      if _COMPARE[func](int.from_bytes(self.read(addr, nbytes), "little") & mask, ref): return
      time.sleep(delay); delay = min(delay * 2, 1e-3)
    raise Stopped()

  # ---- the doorbell loop ----
  def run(self):
    delay = 1e-5
    while not self.stopping:
      wptr = int(self.doorbell[0]) * self.unit // 4
      if wptr <= self.rptr or self.dead:
        time.sleep(delay); delay = min(delay * 2, 1e-3)
        continue
      delay = 1e-5
      self.pickup_epoch = self.kfd.doorbell_picked_up()
      try:
        if self.ring_checked is None:     # (the ring's BO is fixed for the queue's life: looked up once)
          self.check_executable(self.ring_base, "the ring", f"ring dword {self.rptr % self.ring_dwords:#x}")
          self.ring_checked = True
        # the ring holds at most size - 1 dwords: rptr == wptr means empty (kfd_kernel_queue.c; kfdtest BaseQueue)
        if wptr - self.rptr >= self.ring_dwords:
          raise QueueError(f"queue overrun: write pointer {wptr:#x} is {wptr - self.rptr:#x} dwords ahead of the read "
                           f"pointer {self.rptr:#x}: a ring of {self.ring_dwords:#x} dwords holds at most "
                           f"{self.ring_dwords - 1:#x}")
        while self.rptr < wptr and not self.stopping:
          pos = self.rptr % self.ring_dwords
          size = self.execute(self.ring, pos, f"ring dword {pos:#x}")
          self.rptr += size
          self.packets_done += 1
          self._write_rptr()
      except Stopped:
        return
      except QueueError as e:
        self.dead = str(e)
        self.kfd.raise_exception(f"{self.describe()}: {e}", e.va, queue=self, code=e.code)
      except Exception as e:      # an emulator bug: still stop the queue and tell the process
        self.dead = f"{type(e).__name__}: {e}"
        self.kfd.raise_exception(f"{self.describe()}: internal error at ring dword {self.rptr % self.ring_dwords:#x}: "
                                 f"{self.dead}", queue=self)

  def _write_rptr(self):
    """What the engine writes back: SDMA a 64-bit byte count that only grows (kfdtest SDMAQueue.cpp Rptr); PM4 a
    32-bit dword offset that wraps at the ring size (kfdtest PM4Queue.cpp RptrWhenConsumed; kfd_kernel_queue.c)."""
    if self.unit == 4: self.write(self.rptr_addr, (self.rptr % self.ring_dwords).to_bytes(4, "little"))
    else: self.write(self.rptr_addr, (self.rptr * 4 // self.unit).to_bytes(8, "little"))

  def check_executable(self, addr: int, what: str, where: str):
    """Commands are fetched from executable memory. Every reference allocates ring and indirect buffers with the
    executable flag (kfdtest BaseQueue/PM4Queue buffers `isExec`, ROCr AllocateExecutable for SDMA rings, libhsakmt
    allocate_exec_aligned_memory for queue memory); no source says a gfx11 CP or SDMA fetch ignores the PTE's
    EXECUTABLE bit, so the emulated engines refuse command fetches from a BO allocated without it."""
    bo = self.kfd.mapping_of(addr)
    if bo is not None and not bo.flags & kfd_abi.ALLOC_EXECUTABLE:
      raise QueueError(f"{where}: {what} at {addr:#x} is in a BO allocated without KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE "
                       f"(ring and indirect buffers are allocated executable by every reference: kfdtest, ROCr, "
                       f"libhsakmt)")

  def run_buffer(self, base: int, ndwords: int, where: str):
    """Execute an indirect buffer."""
    self.check_executable(base, "the indirect buffer", where)
    self.check_hdp(base, "the indirect buffer fetch", where)
    with self.kfd.lock:
      try: words = self.kfd.memory.array(base, np.uint32, ndwords).copy()
      except MemoryFault as e: raise QueueError(f"{where}: indirect buffer: {e}", e.address) from None
    pos = 0
    while pos < ndwords:
      pos += self.execute(words, pos, f"{where} -> indirect buffer {base:#x} dword {pos:#x}", nested=True)

  def execute(self, words, pos: int, where: str, nested: bool = False) -> int:
    raise NotImplementedError


class ComputeQueue(EngineQueue):
  """PM4 compute queue: SH registers + DISPATCH_DIRECT, RELEASE_MEM, WAIT_REG_MEM, ACQUIRE_MEM, EVENT_WRITE,
  INDIRECT_BUFFER, DMA_DATA, NOP."""
  kind, unit, engine = "compute", 4, "PM4"

  def __init__(self, *args):
    super().__init__(*args)
    self.regs: dict[int, int] = {}
    self._programs: dict = {}

  def execute(self, words, pos, where, nested=False) -> int:
    name, f, size = self.decode(pm4, words, pos, where)
    if name == "NOP": return size
    if name == "ACQUIRE_MEM":            # work is synchronous: caches are coherent, except the L2 lines FENCEs left
      if f["gl2_wb"]: self.kfd.gl2_write_back()
      return size
    if name == "EVENT_WRITE":
      self.check_event(EVENT_WRITE_EVENTS, name, f, where)
      return size
    if name == "SET_SH_REG": self.set_sh_reg(f, where)
    elif name == "DISPATCH_DIRECT": self.dispatch(f, where)
    elif name == "RELEASE_MEM": self.release_mem(f, where)
    elif name == "WAIT_REG_MEM":
      if f["engine"] != 0:             # nvd.h WAIT_REG_MEM_ENGINE: 0 me, 1 pfp; a compute queue's MEC has no PFP
        raise QueueError(f"{where}: WAIT_REG_MEM with ENGINE_SEL {f['engine']} on a compute queue: the MEC has only the "
                         f"ME (gfx_v11_0_ring_emit_hdp_flush uses reg_mem_engine 0 on compute rings)")
      if f["mem_space"] == 0 and f["operation"] == pm4.WAIT_REG_MEM_WRITE_WAIT_WRITE:
        self.hdp_flush_registers(f["addr_lo"], f["addr_hi"], f["function"], f["reference"], f["mask"], name, where)
      elif f["mem_space"] != 1 or f["operation"] != 0:
        raise QueueError(f"{where}: WAIT_REG_MEM on a register (mem_space {f['mem_space']}, operation {f['operation']}) "
                         f"is not emulated")
      else: self.poll_memory(f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["mask"], f["function"], f["reference"], where)
    elif name == "WAIT_REG_MEM64":
      # no Linux code emits WAIT_REG_MEM64 for gfx11; IREE's AMDGPU HAL does, validated on gfx1100 hardware
      # (iree-org/iree runtime/src/iree/hal/drivers/amdgpu/physical_device_capabilities.c, util/pm4_emitter.h). The
      # emulated CP takes the one form the driver needs (a 64-bit >= on an 8-byte-aligned memory qword, full masks:
      # driver.py `_wait` says why) and refuses the rest, which it does not model
      addr, mask, ref = pm4.wait64_operands(f)
      form = (f["mem_space"], f["operation"], f["function"], f["cache_policy"], mask, f["addr_lo"] & 7)
      if form != (1, 0, pm4.FUNC[">="], 0, 2**64 - 1, 0):
        raise QueueError(f"{where}: WAIT_REG_MEM64 other than a 64-bit '>=' on an aligned memory qword with full masks "
                         f"(mem_space {f['mem_space']}, operation {f['operation']}, function {f['function']}, cache_policy "
                         f"{f['cache_policy']}, mask {mask:#x}, address {addr | f['addr_lo'] & 7:#x}): no Linux code "
                         f"emits WAIT_REG_MEM64 for gfx11, so only the driver's form is accepted")
      self.poll_memory(addr, mask, f["function"], ref, where, nbytes=8)
    elif name == "INDIRECT_BUFFER":
      if nested: raise QueueError(f"{where}: INDIRECT_BUFFER inside an indirect buffer (chaining is not emulated)")
      if not f["valid"]: raise QueueError(f"{where}: INDIRECT_BUFFER without VALID")
      self.run_buffer(f["ib_base_hi"] << 32 | f["ib_base_lo"] & ~3, f["ib_size"], where)
    elif name == "DMA_DATA":
      if f["sas"] or f["das"] or f["dst_sel"] != 0 or f["src_sel"] not in (0, 2):
        raise QueueError(f"{where}: DMA_DATA with register/GDS operands is not emulated ({pm4.describe(name, f)})")
      dst, n = f["dst_addr_hi"] << 32 | f["dst_addr_lo"], f["byte_count"]
      if n > 32767:       # gfx11 CP DMA: cp_dma_max_byte_count() (Mesa radeonsi si_cp_dma.c, radv radv_cp_dma.c)
        raise QueueError(f"{where}: DMA_DATA of {n} bytes; a gfx11 CP DMA packet copies at most 32767 bytes")
      if f["src_sel"] == 2:
        self.write(dst, (f["src_addr_lo"].to_bytes(4, "little") * (n // 4 + 1))[:n])
      else:
        self.check_hdp(f["src_addr_hi"] << 32 | f["src_addr_lo"], "DMA_DATA's source", where)
        self.copy(dst, f["src_addr_hi"] << 32 | f["src_addr_lo"], n)
    elif name in pm4.OPCODES:
      raise QueueError(f"{where}: PM4 packet {name} (opcode {pm4.OPCODES[name]:#04x}, header {int(words[pos]):#010x}) "
                       f"is not emulated")
    else:
      raise QueueError(f"{where}: unknown PM4 packet {name} (opcode {(int(words[pos]) >> 8) & 0xFF:#04x}, header "
                       f"{int(words[pos]):#010x}): not an opcode of the compute queue")
    return size

  def set_sh_reg(self, f, where):
    """Write consecutive SH registers; every one must be a register the emulated gfx1100 models."""
    for k in range(len(f["values"])):
      reg = f["register"] + k
      if reg not in pm4.REGISTER_NAMES:
        offset = reg + pm4.SH_REG_BASE - pm4.SET_SH_REG_START
        raise QueueError(f"{where}: SET_SH_REG of unknown register {reg:#06x} (SET_SH_REG offset {offset:#x}, value "
                         f"{k} of {len(f['values'])}): not one of the {len(pm4.REGISTERS)} COMPUTE_* registers the "
                         f"emulated gfx1100 models (drivers/amd/pm4.py REGISTERS)")
    for k, v in enumerate(f["values"]): self.regs[f["register"] + k] = v

  @staticmethod
  def check_event(known: dict, name: str, f, where):
    """An EVENT_WRITE / RELEASE_MEM must carry an event (and its EVENT_INDEX) the emulator models."""
    event, index = f["event_type"], f["event_index"]
    if event not in known:
      raise QueueError(f"{where}: {name} of event type {event:#04x} (index {index}) is not emulated; it knows "
                       + ", ".join(f"{n} {e:#04x}" for e, (n, _) in known.items()))
    ename, want = known[event]
    if index != want:
      raise QueueError(f"{where}: {name} of {ename} with EVENT_INDEX {index}; the event takes EVENT_INDEX {want}")

  def release_mem(self, f, where):
    self.check_event(RELEASE_MEM_EVENTS, "RELEASE_MEM", f, where)
    if f["dst_sel"] not in RELEASE_MEM_DST_SEL:
      raise QueueError(f"{where}: RELEASE_MEM DST_SEL {f['dst_sel']} (a queue write pointer) is not emulated")
    if f["int_sel"] not in (pm4.INT_SEL_NONE, pm4.INT_SEL_INT_ONLY, pm4.INT_SEL_AFTER_WRITE):
      raise QueueError(f"{where}: RELEASE_MEM INT_SEL {f['int_sel']} is not emulated (0 none, 1 interrupt only, "
                       f"2 interrupt after the write)")
    addr = f["addr_hi"] << 32 | f["addr_lo"]
    sel = f["data_sel"]
    if f["gcr_gl2_wb"]: self.kfd.gl2_write_back()      # the release's cache actions come before its write
    if sel == pm4.DATA_SEL_32: self.write(addr, f["data_lo"].to_bytes(4, "little"))
    elif sel == pm4.DATA_SEL_64: self.write(addr, (f["data_hi"] << 32 | f["data_lo"]).to_bytes(8, "little"))
    elif sel in (pm4.DATA_SEL_GPU_CLOCK, pm4.DATA_SEL_SYS_CLOCK): self.write(addr, self.kfd.clock().to_bytes(8, "little"))
    elif sel != pm4.DATA_SEL_NONE: raise QueueError(f"{where}: RELEASE_MEM DATA_SEL {sel} is not emulated")
    # the CP's END_OF_PIPE interrupt: kfd_int_process_v11.c passes context_id0 with 32 valid id bits
    if f["int_sel"] in (pm4.INT_SEL_INT_ONLY, pm4.INT_SEL_AFTER_WRITE): self.kfd.signal_interrupt(f["int_ctxid"], 32)

  def reg(self, name: str) -> int: return self.regs.get(pm4.REGISTERS[name], 0)

  def dispatch(self, f, where):
    from . import rdna3
    pgm = (self.reg("COMPUTE_PGM_HI") << 40) | (self.reg("COMPUTE_PGM_LO") << 8)
    rsrc1, rsrc2, rsrc3 = self.reg("COMPUTE_PGM_RSRC1"), self.reg("COMPUTE_PGM_RSRC2"), self.reg("COMPUTE_PGM_RSRC3")
    w32 = (f["cs_w32_en"] != 0)
    if not w32: raise QueueError(f"{where}: DISPATCH_DIRECT without CS_W32_EN: the emulator runs wave32 only")
    # COMPUTE_PGM_RSRC1.PRIV: the CP fills it (AMDGPUUsage, compute_pgm_rsrc1 PRIV: "CP is responsible for filling in
    # COMPUTE_PGM_RSRC1.PRIV"), and on gfx11 a PM4 queue's waves start privileged for context save/restore (CWSR: amdkfd
    # preempts user queues by saving their waves with its trap handler). No Linux source states the gfx11 failure mode;
    # the rule is what tinygrad's KFD PM4 path does on gfx11 ("priv=1 on gfx11 for cwsr"), so it is checked, not modelled
    if not rsrc1 & RSRC1_PRIV:
      raise QueueError(f"{where}: DISPATCH_DIRECT with COMPUTE_PGM_RSRC1 {rsrc1:#010x} without PRIV (bit 20): on gfx11 "
                       f"the CP (a PM4 driver) sets PRIV so that context save/restore can preempt and restore the waves")
    grid = (f["dim_x"], f["dim_y"], f["dim_z"])
    block = tuple(self.reg(f"COMPUTE_NUM_THREAD_{a}") for a in "XYZ")
    user_sgprs = (rsrc2 >> 1) & 0x1F
    if user_sgprs not in (0, 2):
      raise QueueError(f"{where}: DISPATCH_DIRECT with {user_sgprs} user SGPRs: the emulated CP loads only "
                       f"COMPUTE_USER_DATA_0/1 (the kernarg pointer)")
    kernarg = self.reg("COMPUTE_USER_DATA_1") << 32 | self.reg("COMPUTE_USER_DATA_0")
    lds = ((rsrc2 >> 15) & 0x1FF) * 512
    bo = self.kfd.mapping_of(pgm)
    if bo is None: raise QueueError(f"{where}: DISPATCH_DIRECT: COMPUTE_PGM at {pgm:#x} is not mapped", pgm)
    self.check_hdp(pgm, "DISPATCH_DIRECT's code (COMPUTE_PGM)", where)
    if user_sgprs == 2: self.check_hdp(kernarg, "DISPATCH_DIRECT's kernel arguments (COMPUTE_USER_DATA_0/1)", where)
    with self.kfd.lock:
      code = self.kfd.memory.array(pgm, np.uint8).tobytes()
    name = self.kfd.kernel_names.get(pgm, f"kernel@{pgm:#x}")
    key = (pgm, rsrc1, rsrc2, rsrc3, hashlib.sha1(code).digest(), name)
    prog = self._programs.get(key)
    if prog is None:
      # the descriptor the hardware sees is only these registers: rebuild it for the emulator
      value = rsrc3 << RSRC3 | (rsrc1 & ~RSRC1_PRIV) << RSRC1 | (rsrc2 & ~(0x1FF << 15)) << RSRC2   # PRIV is the CP's
      value |= (1 << 10 | (1 << 3 if user_sgprs == 2 else 0)) << PROPERTIES     # wave32, kernarg pointer in s[0:1]
      value |= lds                                                              # group_segment_fixed_size
      kd = KernelDescriptor.unpack(value.to_bytes(64, "little"))
      prog = self._programs[key] = rdna3.Program(code, 0, kd, name)    # errors name the kernel
      if len(self._programs) > 64: self._programs.pop(next(iter(self._programs)))
    run = KernelCounters(name)
    with self.kfd.lock:
      system_before = self.kfd.memory.traffic[1]
      if counters_mod.UNIQUE: self.kfd.memory.sectors = []
      try:
        rdna3.dispatch(prog, grid, block, kernarg, self.kfd.memory, code_address=pgm, counters=run)
      except (MemoryFault, rdna3.EmulatorError, ValueError) as e:   # ValueError: a block or LDS no workgroup can have
        self.kfd.memory.sectors = None
        notes = "".join(f"\n{n}" if "\n" in n else f" ({n})"      # where in the kernel: pc and instruction; the wave
                        for n in getattr(e, "__notes__", ()))
        code = kfd_abi.EC["EC_QUEUE_PACKET_DISPATCH_WORK_GROUP_SIZE_INVALID" if isinstance(e, ValueError) else
                          "EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION"]
        raise QueueError(f"{where}: DISPATCH_DIRECT {grid}x{block} of kernel {name!r} at {pgm:#x}: {e}{notes}",
                         getattr(e, "address", None), code) from None
      run.global_system_bytes = self.kfd.memory.traffic[1] - system_before
      if self.kfd.memory.sectors is not None:
        run.global_load_unique_bytes = counters_mod.sector_bytes(self.kfd.memory.sectors)
        self.kfd.memory.sectors = None
    self.kfd.counters.record(run)     # before the packets after the dispatch (RELEASE_MEM) run


class SDMAQueue(EngineQueue):
  """SDMA queue: COPY_LINEAR, FENCE, TRAP, POLL_REGMEM, COND_EXE, TIMESTAMP, INDIRECT, NOP."""
  kind, unit, engine = "copy", 1, "SDMA"

  def execute(self, words, pos, where, nested=False) -> int:
    hdr = int(words[pos])
    op, sub_op = hdr & 0xFF, (hdr >> 8) & 0xFF
    if (op, sub_op) not in sdma.BY_OPCODE:     # name what it is before decoding fails on it
      if op not in SDMA_OP_NAMES:
        raise QueueError(f"{where}: unknown SDMA opcode {op} (sub_op {sub_op}, header {hdr:#010x})")
      emulated = [f"{n} sub_op {s}" for n, (o, s, _) in sdma.PACKETS.items() if o == op]
      raise QueueError(f"{where}: SDMA packet {SDMA_OP_NAMES[op]} (op {op}) sub_op {sub_op} (header {hdr:#010x}) is "
                       f"not emulated" + (f"; this op is emulated as {', '.join(emulated)}" if emulated else ""))
    name, f, size = self.decode(sdma, words, pos, where)
    if name == "NOP": return size
    if name == "COPY_LINEAR":
      modes = [m for m in ("backwards", "broadcast", "encrypt", "tmz") if f[m]]
      if modes: raise QueueError(f"{where}: COPY_LINEAR with {', '.join(modes)} is not emulated")
      self.check_hdp(f["src_addr_hi"] << 32 | f["src_addr_lo"], "COPY_LINEAR's source", where)
      self.copy(f["dst_addr_hi"] << 32 | f["dst_addr_lo"], f["src_addr_hi"] << 32 | f["src_addr_lo"], f["count"] + 1)
    elif name == "FENCE":
      addr, data = f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["data"].to_bytes(4, "little")
      if f["mtype"] == SDMA_MTYPE_UC: self.write(addr, data)
      else: self.write_l2(addr, data, where)       # NC/CC/WC: the value stays in the L2 until a GL2 write-back
    # the SDMA_TRAP interrupt: kfd_int_process_v11.c passes context_id0 & 0xfffffff with 28 valid id bits
    elif name == "TRAP": self.kfd.signal_interrupt(f["int_context"] & 0xFFFFFFF, 28)
    elif name == "POLL_REGMEM":
      if [int(w) for w in words[pos:pos + size]] == HDP_FLUSH_PACKET:
        self.kfd.hdp_flush()           # the firmware's user-mode HDP flush (see HDP_FLUSH_PACKET)
        return size
      if f["hdp_flush"]:
        raise QueueError(f"{where}: POLL_REGMEM with HDP_FLUSH set (the register handshake of "
                         f"sdma_v6_0_ring_emit_hdp_flush) on a user queue: amdgpu emits it on its own rings, which run "
                         f"privileged (RB_PRIV, sdma_v6_0_gfx_resume); a KFD SDMA queue is not (kfd_mqd_manager_v11.c "
                         f"update_mqd_sdma). User mode flushes the HDP with the firmware packet "
                         f"{[hex(w) for w in HDP_FLUSH_PACKET]} (ROCr sdma_registers.h SDMA_PKT_HDP_FLUSH)")
      if not f["mem_poll"]: raise QueueError(f"{where}: POLL_REGMEM on a register is not emulated")
      self.poll_memory(f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["mask"], f["func"], f["value"], where)
    elif name == "COND_EXE":           # the next exec_count dwords run only if the dword equals the reference
      self.check_hdp(f["addr_hi"] << 32 | f["addr_lo"] & ~3, "COND_EXE", where)
      if self.read_u32(f["addr_hi"] << 32 | f["addr_lo"] & ~3) != f["reference"]: return size + f["exec_count"]
    elif name == "TIMESTAMP": self.write(f["addr_hi"] << 32 | f["addr_lo"] & ~7, self.kfd.clock().to_bytes(8, "little"))
    elif name == "INDIRECT":
      if nested: raise QueueError(f"{where}: SDMA INDIRECT inside an indirect buffer")
      base = f["ib_base_hi"] << 32 | f["ib_base_lo"]
      # sdma_v6_0_ring_emit_ib (amdgpu/sdma_v6_0.c): "IB packet must end on a 8 DW boundary" (it NOP-pads the ring
      # first) and the IB base is 32-byte aligned; sdma_v6_0_ring_pad_ib pads every IB to a multiple of 8 dwords
      if (pos + size) % 8 or base % 32 or f["ib_size"] % 8:
        raise QueueError(f"{where}: SDMA INDIRECT (IB at {base:#x}, {f['ib_size']} dwords) ending at ring dword "
                         f"{(pos + size) % self.ring_dwords:#x}: the packet must end on an 8-dword boundary, the IB base "
                         f"be 32-byte aligned and its size a multiple of 8 dwords (sdma_v6_0_ring_emit_ib, "
                         f"sdma_v6_0_ring_pad_ib)")
      self.run_buffer(base, f["ib_size"], where)
    else:
      raise QueueError(f"{where}: SDMA packet {name} is not emulated")
    return size
