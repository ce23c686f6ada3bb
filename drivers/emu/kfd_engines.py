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

The engines are strict: what they do not model stops the queue with a message naming it, instead of being skipped.
A PM4 opcode other than the ones below, a SET_SH_REG of a register outside pm4.REGISTERS, an SDMA op/sub_op other
than the packets of sdma.PACKETS, an event, DATA_SEL/INT_SEL/DST_SEL or compare function the emulator does not
implement: each is an error here, so a driver that writes them (or a wrong constant in the shared tables that turns
a good packet into one of them) fails in CI instead of passing unnoticed.
"""
from __future__ import annotations
import hashlib, threading, time
import numpy as np

from baregrad.drivers.amd import pm4, sdma
from baregrad.drivers.amd.codeobj import KernelDescriptor, RSRC1, RSRC2, RSRC3, PROPERTIES
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


class QueueError(Exception):
  """Stops a queue: `message` names the packet; `va` is set for memory faults."""
  def __init__(self, message: str, va: int | None = None):
    super().__init__(message)
    self.va = va


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
    self.stopping = False
    self.dead: str | None = None
    self.packets_done = 0
    self.history: list[str] = []  # names of the last packets executed (tests inspect it)
    with kfd.lock:
      self.ring = kfd.memory.array(ring_base, np.uint32, self.ring_dwords)

  def stop(self):
    self.stopping = True
    if self is not threading.current_thread(): self.join(timeout=5)

  def describe(self) -> str: return f"{self.kind} queue {self.queue_id} ({self.engine}, ring at {self.ring_base:#x})"

  # ---- memory ----
  def read(self, addr: int, nbytes: int) -> bytes:
    with self.kfd.lock:
      try: return self.kfd.memory.read(addr, nbytes)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None

  def write(self, addr: int, data: bytes):
    with self.kfd.lock:
      try: self.kfd.memory.write(addr, data)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None

  def read_u32(self, addr: int) -> int: return int.from_bytes(self.read(addr, 4), "little")

  def copy(self, dst: int, src: int, nbytes: int):
    with self.kfd.lock:
      try:
        s = self.kfd.memory.array(src, np.uint8, nbytes)
        d = self.kfd.memory.array(dst, np.uint8, nbytes)
      except MemoryFault as e: raise QueueError(str(e), e.address) from None
      d[:] = s

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
      try:
        if wptr - self.rptr > self.ring_dwords:     # the ring cannot hold that much: what is there is not the commands
          raise QueueError(f"queue overrun: write pointer {wptr:#x} is {wptr - self.rptr:#x} dwords ahead of the read "
                           f"pointer {self.rptr:#x}, more than the ring's {self.ring_dwords:#x} dwords")
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
        self.kfd.raise_exception(f"{self.describe()}: {e}", e.va)
      except Exception as e:      # an emulator bug: still stop the queue and tell the process
        self.dead = f"{type(e).__name__}: {e}"
        self.kfd.raise_exception(f"{self.describe()}: internal error at ring dword {self.rptr % self.ring_dwords:#x}: {self.dead}")

  def _write_rptr(self):
    self.write(self.rptr_addr, (self.rptr * 4 // self.unit).to_bytes(8, "little"))

  def run_buffer(self, base: int, ndwords: int, where: str):
    """Execute an indirect buffer."""
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
    if name in ("NOP", "ACQUIRE_MEM"): return size     # work is synchronous: caches are coherent
    if name == "EVENT_WRITE":
      self.check_event(EVENT_WRITE_EVENTS, name, f, where)
      return size
    if name == "SET_SH_REG": self.set_sh_reg(f, where)
    elif name == "DISPATCH_DIRECT": self.dispatch(f, where)
    elif name == "RELEASE_MEM": self.release_mem(f, where)
    elif name == "WAIT_REG_MEM":
      if f["mem_space"] != 1 or f["operation"] != 0:
        raise QueueError(f"{where}: WAIT_REG_MEM on a register (mem_space {f['mem_space']}, operation {f['operation']}) "
                         f"is not emulated")
      self.poll_memory(f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["mask"], f["function"], f["reference"], where)
    elif name == "WAIT_REG_MEM64":     # a 64-bit compare of the qword at the 8-byte aligned address
      if f["mem_space"] != 1 or f["operation"] != 0:
        raise QueueError(f"{where}: WAIT_REG_MEM64 on a register (mem_space {f['mem_space']}, operation {f['operation']}) "
                         f"is not emulated")
      addr, mask, ref = pm4.wait64_operands(f)
      self.poll_memory(addr, mask, f["function"], ref, where, nbytes=8)
    elif name == "INDIRECT_BUFFER":
      if nested: raise QueueError(f"{where}: INDIRECT_BUFFER inside an indirect buffer (chaining is not emulated)")
      if not f["valid"]: raise QueueError(f"{where}: INDIRECT_BUFFER without VALID")
      self.run_buffer(f["ib_base_hi"] << 32 | f["ib_base_lo"] & ~3, f["ib_size"], where)
    elif name == "DMA_DATA":
      if f["sas"] or f["das"] or f["dst_sel"] != 0 or f["src_sel"] not in (0, 2):
        raise QueueError(f"{where}: DMA_DATA with register/GDS operands is not emulated ({pm4.describe(name, f)})")
      dst, n = f["dst_addr_hi"] << 32 | f["dst_addr_lo"], f["byte_count"]
      if f["src_sel"] == 2:
        self.write(dst, (f["src_addr_lo"].to_bytes(4, "little") * (n // 4 + 1))[:n])
      else:
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
    if sel == pm4.DATA_SEL_32: self.write(addr, f["data_lo"].to_bytes(4, "little"))
    elif sel == pm4.DATA_SEL_64: self.write(addr, (f["data_hi"] << 32 | f["data_lo"]).to_bytes(8, "little"))
    elif sel in (pm4.DATA_SEL_GPU_CLOCK, pm4.DATA_SEL_SYS_CLOCK): self.write(addr, self.kfd.clock().to_bytes(8, "little"))
    elif sel != pm4.DATA_SEL_NONE: raise QueueError(f"{where}: RELEASE_MEM DATA_SEL {sel} is not emulated")
    if f["int_sel"] in (pm4.INT_SEL_INT_ONLY, pm4.INT_SEL_AFTER_WRITE): self.kfd.signal_interrupt(f["int_ctxid"])

  def reg(self, name: str) -> int: return self.regs.get(pm4.REGISTERS[name], 0)

  def dispatch(self, f, where):
    from . import rdna3
    pgm = (self.reg("COMPUTE_PGM_HI") << 40) | (self.reg("COMPUTE_PGM_LO") << 8)
    rsrc1, rsrc2, rsrc3 = self.reg("COMPUTE_PGM_RSRC1"), self.reg("COMPUTE_PGM_RSRC2"), self.reg("COMPUTE_PGM_RSRC3")
    w32 = (f["cs_w32_en"] != 0)
    if not w32: raise QueueError(f"{where}: DISPATCH_DIRECT without CS_W32_EN: the emulator runs wave32 only")
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
    with self.kfd.lock:
      code = self.kfd.memory.array(pgm, np.uint8).tobytes()
    key = (pgm, rsrc1, rsrc2, rsrc3, hashlib.sha1(code).digest())
    prog = self._programs.get(key)
    if prog is None:
      # the descriptor the hardware sees is only these registers: rebuild it for the emulator
      value = rsrc3 << RSRC3 | rsrc1 << RSRC1 | (rsrc2 & ~(0x1FF << 15)) << RSRC2
      value |= (1 << 10 | (1 << 3 if user_sgprs == 2 else 0)) << PROPERTIES     # wave32, kernarg pointer in s[0:1]
      value |= lds                                                              # group_segment_fixed_size
      kd = KernelDescriptor.unpack(value.to_bytes(64, "little"))
      prog = self._programs[key] = rdna3.Program(code, 0, kd, f"kernel@{pgm:#x}")
      if len(self._programs) > 64: self._programs.pop(next(iter(self._programs)))
    with self.kfd.lock:
      try:
        rdna3.dispatch(prog, grid, block, kernarg, self.kfd.memory, code_address=pgm)
      except MemoryFault as e:     # the note says where in the kernel: pc and instruction
        notes = "".join(f" ({n})" for n in getattr(e, "__notes__", ()))
        raise QueueError(f"{where}: DISPATCH_DIRECT {grid}x{block} of the kernel at {pgm:#x}: {e}{notes}", e.address) from None
      except rdna3.EmulatorError as e:
        raise QueueError(f"{where}: DISPATCH_DIRECT {grid}x{block} of the kernel at {pgm:#x}: {e}") from None


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
      self.copy(f["dst_addr_hi"] << 32 | f["dst_addr_lo"], f["src_addr_hi"] << 32 | f["src_addr_lo"], f["count"] + 1)
    elif name == "FENCE": self.write(f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["data"].to_bytes(4, "little"))
    elif name == "TRAP": self.kfd.signal_interrupt(f["int_context"])
    elif name == "POLL_REGMEM":
      if not f["mem_poll"]: raise QueueError(f"{where}: POLL_REGMEM on a register is not emulated")
      if f["hdp_flush"]: raise QueueError(f"{where}: POLL_REGMEM with HDP_FLUSH is not emulated")
      self.poll_memory(f["addr_hi"] << 32 | f["addr_lo"] & ~3, f["mask"], f["func"], f["value"], where)
    elif name == "COND_EXE":           # the next exec_count dwords run only if the dword equals the reference
      if self.read_u32(f["addr_hi"] << 32 | f["addr_lo"] & ~3) != f["reference"]: return size + f["exec_count"]
    elif name == "TIMESTAMP": self.write(f["addr_hi"] << 32 | f["addr_lo"] & ~7, self.kfd.clock().to_bytes(8, "little"))
    elif name == "INDIRECT":
      if nested: raise QueueError(f"{where}: SDMA INDIRECT inside an indirect buffer")
      self.run_buffer(f["ib_base_hi"] << 32 | f["ib_base_lo"], f["ib_size"], where)
    else:
      raise QueueError(f"{where}: SDMA packet {name} is not emulated")
    return size
