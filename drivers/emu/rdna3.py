"""RDNA3 (gfx1100, wave32) emulator, vectorized with numpy across lanes and waves.

    dispatch(code_object, grid, block, kernarg_addr, mem)

runs every workgroup of a dispatch. Waves of a batch (whole workgroups, up to
`max_batch_waves` waves) execute together: while all waves share one PC (the common case) an
instruction runs once over arrays shaped (waves, 32); after a data-dependent scalar branch the
waves that share the lowest PC run together until they meet again. s_barrier parks a wave until
every live wave of the batch is parked (waves of one workgroup always belong to one batch).

Initial state follows LLVM AMDGPUUsage, "Initial Kernel Execution State" (GFX11): user SGPRs
from s0 in the order private segment buffer, dispatch ptr, queue ptr, kernarg segment ptr,
dispatch id, flat scratch init, private segment size (those the kernel descriptor enables);
from s[USER_SGPR_COUNT] the system SGPRs workgroup id x, y, z, workgroup info, private segment
wave offset (those enabled); v0 = workitem id x | y << 10 | z << 20 (ENABLE_VGPR_WORKITEM_ID
says which are present); EXEC = the wave's live lanes.

Decoding uses the instruction tables in baregrad.drivers.amd.isa (shared with the assembler).
Semantics live in rdna3_valu.py (float rounding: rdna3_float.py), rdna3_salu.py and rdna3_mem.py. Every step is
checked by rdna3_deps.py against what the program must resolve itself: outstanding loads until the s_waitcnt that
completes them (MissingWait) and the gfx1100 hazards (HazardError). Because the waves of a workgroup run in lockstep
here, what only their order on real hardware decides is checked instead of trusted: an LDS access that meets another
wave's with no s_barrier between raises LDSRace (rdna3_mem.LDSOrder), and a workgroup whose waves cannot all hold
their VGPRs on one WGP is refused before it runs (LaunchError, `max_vgprs`), as the hardware could never launch it.

Counters (drivers/emu/counters.py): `dispatch(..., counters=KernelCounters())` adds what the kernel executed. Each
instruction's class, whether it is a vector instruction and the bytes it moves per lane (per wave for SMEM) are
decided when it is decoded (`classify`); a step adds the active lanes (EXEC bits) of the waves it runs for a vector
instruction, their live lanes for a scalar one.
"""
from __future__ import annotations

import hashlib, re
from dataclasses import dataclass

import numpy as np

from baregrad.drivers.amd import isa
from baregrad.drivers.amd.codeobj import KernelDescriptor, read_code_object
from . import counters as C
from .counters import KernelCounters
from .memory import Memory, MemoryFault, HostMemory  # noqa: F401  (re-exported for users)
from .rdna3_deps import DepState, HazardError, MissingWait, analyze
from .rdna3_deps import step as dependency_step
from .rdna3_mem import LDSOrder, LDSRace, compile_ds, compile_smem, compile_vmem
from .rdna3_salu import compile_salu
from .rdna3_state import (ALL, EXEC, LANE, U32, U64, VCC, EmulatorError, FloatMode, IllegalInstruction, Waves,
                          mask_to_bits, unemulated_float_mode)
from .rdna3_valu import compile_valu

__all__ = ["dispatch", "Memory", "HostMemory", "MemoryFault", "IllegalInstruction", "EmulatorError", "MissingWait",
           "HazardError", "InstructionBudgetExceeded", "LDSRace", "LaunchError", "Program", "load_program", "max_vgprs"]

NORMAL, BRANCH, END, BARRIER, JUMP = range(5)
_SRC_FIELDS = ("src0", "src1", "src2", "ssrc0", "ssrc1")


class InstructionBudgetExceeded(EmulatorError):
  pass


class LaunchError(EmulatorError):
  """A dispatch the hardware cannot launch (its workgroup does not fit)."""


# The VGPR file of gfx1100 (LLVM AMDGPUBaseInfo.cpp, namespace IsaInfo; gfx1100 has Feature1_5xVGPRs): wave32 waves
# get VGPRs in blocks of getVGPRAllocGranule = 24 out of getTotalNumVGPRs = 1536 a SIMD, and address at most
# getAddressableNumVGPRs = 256. The waves of a workgroup must share one WGP of 4 SIMDs (getEUsPerCU: 4, or 2 when the
# kernel runs in CU mode, COMPUTE_PGM_RSRC1.WGP_MODE = 0), ceil(waves / SIMDs) waves a SIMD
# (getWavesPerEUForWorkGroup), so a wave may use getMaxNumVGPRs = min(256, alignDown(1536 / waves a SIMD, 24)).
VGPRS_PER_SIMD, VGPR_ALLOC_GRANULE, ADDRESSABLE_VGPRS = 1536, 24, 256


def max_vgprs(threads: int, wgp_mode: bool = True) -> int:
  """The most VGPRs a wave32 wave of a workgroup of `threads` threads may use on gfx1100."""
  per_simd = -(-(-(-threads // 32)) // (4 if wgp_mode else 2))
  return min(ADDRESSABLE_VGPRS, VGPRS_PER_SIMD // per_simd // VGPR_ALLOC_GRANULE * VGPR_ALLOC_GRANULE)


def check_launch(prog: "Program", threads: int) -> None:
  """Refuse a workgroup of `threads` threads whose waves cannot all get the kernel's VGPRs on one WGP (CU)."""
  wgp = bool(prog.kd.wgp_mode)
  limit = max_vgprs(threads, wgp)
  if prog.n_vgprs <= limit: return
  simds = 4 if wgp else 2
  waves = -(-threads // 32)
  blocks = -(-prog.n_vgprs // VGPR_ALLOC_GRANULE) * VGPR_ALLOC_GRANULE
  fit = min(1024, VGPRS_PER_SIMD // blocks * simds * 32) if prog.n_vgprs <= ADDRESSABLE_VGPRS else 0
  raise LaunchError(
    f"kernel {prog.name!r} uses {prog.n_vgprs} VGPRs a wave (COMPUTE_PGM_RSRC1.VGPRS "
    f"{prog.kd.granulated_workitem_vgpr_count}) but a workgroup of {threads} threads ({waves} waves, "
    f"{-(-waves // simds)} on each of the {simds} SIMDs of a {'WGP' if wgp else 'CU (CU mode)'}) can use at most "
    f"{limit}: a gfx1100 cannot launch it ({VGPRS_PER_SIMD} VGPRs a SIMD, allocated in blocks of "
    f"{VGPR_ALLOC_GRANULE}, at most {ADDRESSABLE_VGPRS} a wave; LLVM AMDGPUBaseInfo getMaxNumVGPRs). Use fewer VGPRs "
    f"or " + (f"at most {fit} threads a workgroup" if fit else "split the kernel"))


@dataclass
class Compiled:
  name: str
  size: int
  kind: int
  run: object = None           # fn(w, sel) for the data part (all kinds may have one)
  cond: object = None          # BRANCH: fn(w, sel) -> bool array (taken), None = always
  target: int = 0              # BRANCH target pc
  dest: object = None          # JUMP: fn(w, sel) -> int64 array of pcs
  dep: object = None           # rdna3_deps.Dep: registers touched, counters, hazards
  cls: int = C.OTHER           # counters.CLASSES index
  vector: bool = False         # counted per active lane (else per live lane of the wave)
  traffic: tuple = ()          # (slot, bytes per lane, or per wave for SMEM); slot: TRAFFIC index


# drivers/emu/counters.py byte counts, in the order `dispatch` keeps them
TRAFFIC = ("global_load_bytes", "global_store_bytes", "shared_load_bytes", "shared_store_bytes")
GLOBAL_LD, GLOBAL_ST, SHARED_LD, SHARED_ST = range(4)
# access width by the data-type suffix of a memory mnemonic (RDNA3 ISA guide, 9 "Flat, Scratch and Global" and
# 11 "Data Share Operations": b32 = one dword, d16 forms move 8 or 16 bits into half a VGPR)
_WIDTH = {"b8": 1, "u8": 1, "i8": 1, "b16": 2, "u16": 2, "i16": 2, "b32": 4, "u32": 4, "i32": 4, "f32": 4,
          "b64": 8, "u64": 8, "i64": 8, "f64": 8, "b96": 12, "b128": 16, "b256": 32, "b512": 64}
# DS instructions that touch no LDS bytes: cross-lane moves (ds_swizzle/permute/bpermute), the wave counters
# (ds_append/consume), ds_nop, the BVH stack
_DS_NO_LDS = ("ds_nop", "ds_swizzle_b32", "ds_permute_b32", "ds_bpermute_b32", "ds_append", "ds_consume",
              "ds_bvh_stack_rtn_b32")


def _width(name: str) -> int:
  parts = [p for p in name.split("_") if p in _WIDTH]
  if not parts: raise EmulatorError(f"{name}: no access width in the mnemonic")
  return _WIDTH[parts[-1]] * (2 if "2addr" in name else 1)


def classify(inst, get) -> tuple[int, bool, tuple]:
  """(counter class, vector?, traffic) of a decoded instruction (drivers/emu/counters.py explains the classes)."""
  name, fmt = inst.name, inst.fmt
  if fmt in ("VOP1", "VOP2", "VOP3", "VOPC", "VOP3P"): return C.ALU, True, ()
  if fmt == "SOPP":
    if name == "s_barrier": return C.BARRIER, False, ()
    if name in ("s_branch", "s_endpgm", "s_endpgm_saved", "s_sethalt") or name.startswith("s_cbranch"):
      return C.BRANCH, False, ()
    return C.OTHER, False, ()
  if fmt in ("SOP1", "SOP2", "SOPK", "SOPC"):
    if name in ("s_setpc_b64", "s_swappc_b64", "s_call_b64") or "saveexec" in name or "wrexec" in name:
      return C.BRANCH, False, ()
    if fmt != "SOPC" and not name.startswith("s_cmpk") and get("sdst") in (EXEC, EXEC + 1): return C.BRANCH, False, ()
    return C.ALU, False, ()
  if fmt == "SMEM":
    if "load" not in name: return C.OTHER, False, ()          # s_dcache_inv, s_gl1_inv
    return C.GLOBAL, False, ((GLOBAL_LD, _width(name)),)
  if fmt == "SCRATCH": return C.OTHER, True, ()                # private memory: no counted bytes
  if fmt in ("GLOBAL", "FLAT"):
    width = _width(name)
    if "_load_" in name: return C.GLOBAL, True, ((GLOBAL_LD, width),)
    if "_store_" in name: return C.GLOBAL, True, ((GLOBAL_ST, width),)
    return C.GLOBAL, True, ((GLOBAL_LD, width), (GLOBAL_ST, width))       # an atomic reads and writes
  if fmt == "DS":
    if name.startswith(_DS_NO_LDS): return C.SHARED, True, ()
    width = _width(name)
    if name.startswith("ds_load"): return C.SHARED, True, ((SHARED_LD, width),)
    if name.startswith("ds_store_"): return C.SHARED, True, ((SHARED_ST, width),)
    return C.SHARED, True, ((SHARED_LD, width), (SHARED_ST, width))      # atomics, ds_storexchg
  return C.OTHER, False, ()


def _uses_literal(inst, get) -> bool:
  for op in inst.operands:
    if op.kind in ("k32", "k16"): return True
    if op.field in _SRC_FIELDS and not isa.is_reg_kind(op.kind) and get(op.field) == isa.LITERAL: return True
  return False


def decode(code: bytes, pc: int):
  """(inst, get(field), literal, size) of the instruction at byte offset pc."""
  if pc < 0 or pc + 4 > len(code) or pc % 4:
    raise EmulatorError(f"pc {pc:#x} is outside the kernel's code ({len(code)} bytes) or misaligned")
  word = int.from_bytes(code[pc:pc + 8].ljust(8, b"\0"), "little")
  for fmt in isa.DECODE_ORDER:
    w = word & 0xFFFFFFFF if fmt.size == 4 else word
    if not fmt.matches(w): continue
    if fmt.size == 8 and pc + 8 > len(code): raise IllegalInstruction(pc, word & 0xFFFFFFFF, "truncated instruction")
    inst = isa.BY_OPCODE.get((fmt.name, fmt.fields["op"].get(w)))
    if inst is None: break
    fields = fmt.fields
    get = lambda name, _w=w, _f=fields: _f[name].get(_w)
    size, literal = fmt.size, None
    if _uses_literal(inst, get):
      if pc + size + 4 > len(code): raise IllegalInstruction(pc, word & 0xFFFFFFFF, "missing literal dword")
      literal = int.from_bytes(code[pc + size:pc + size + 4], "little")
      size += 4
    return inst, get, literal, size
  raise IllegalInstruction(pc, word & 0xFFFFFFFF)


def _signed16(v: int) -> int: return v - 0x10000 if v & 0x8000 else v


_SOPP_NOOPS = {"s_nop", "s_waitcnt", "s_waitcnt_depctr", "s_delay_alu", "s_clause", "s_sleep", "s_setprio", "s_sendmsg", "s_icache_inv",
               "s_wakeup", "s_round_mode", "s_denorm_mode", "s_set_inst_prefetch_distance", "s_wait_idle",
               "s_wait_event", "s_ttracedata", "s_ttracedata_imm", "s_incperflevel", "s_decperflevel", "s_setkill",
               "s_cbranch_cdbgsys", "s_cbranch_cdbguser", "s_cbranch_cdbgsys_or_user", "s_cbranch_cdbgsys_and_user"}
_MODE_AS_EMULATED = {"s_round_mode": 0x0, "s_denorm_mode": 0xF}
_BRANCH_COND = {
  "s_cbranch_scc0": lambda w, sel: w.scc[sel] == 0, "s_cbranch_scc1": lambda w, sel: w.scc[sel] != 0,
  "s_cbranch_vccz": lambda w, sel: w.S[VCC][sel] == 0, "s_cbranch_vccnz": lambda w, sel: w.S[VCC][sel] != 0,
  "s_cbranch_execz": lambda w, sel: w.S[EXEC][sel] == 0, "s_cbranch_execnz": lambda w, sel: w.S[EXEC][sel] != 0,
}


class Program:
  """Decoded-on-first-use instructions of one kernel, keyed by byte offset into .text."""

  def __init__(self, code: bytes, entry: int, kd, name: str = "kernel"):
    self.code, self.entry, self.kd, self.name = code, entry, kd, name
    self.n_vgprs = (kd.granulated_workitem_vgpr_count + 1) * 8
    self.float_mode = FloatMode.of(kd)
    self.unemulated_mode = unemulated_float_mode(kd)      # dispatch refuses to run the kernel when set
    self._cache: dict[int, Compiled] = {}

  def at(self, pc: int) -> Compiled:
    c = self._cache.get(pc)
    if c is None:
      c = self._cache[pc] = self._compile(pc)
    return c

  def text(self, pc: int) -> str:
    from baregrad.drivers.amd.disasm import decode as disasm_decode
    try: return disasm_decode(self.code, pc)[0]
    except Exception: return "?"

  def _compile(self, pc: int) -> Compiled:
    inst, get, literal, size = decode(self.code, pc)
    name, fmt = inst.name, inst.fmt
    dword = int.from_bytes(self.code[pc:pc + 4], "little")
    try:
      c = self._compile_inst(pc, inst, get, literal, size)
    except EmulatorError as e:
      if isinstance(e, IllegalInstruction): raise
      raise IllegalInstruction(pc, dword, f"cannot execute {name}: {e}", self.text(pc)) from None
    if c is None:
      raise IllegalInstruction(pc, dword, f"instruction {name} ({fmt}) has no semantics in the emulator", self.text(pc))
    try:
      c.dep = analyze(inst, get)
      c.cls, c.vector, c.traffic = classify(inst, get)
    except EmulatorError as e:
      raise IllegalInstruction(pc, dword, f"cannot execute {name}: {e}", self.text(pc)) from None
    return c

  def _compile_inst(self, pc, inst, get, literal, size):
    name, fmt = inst.name, inst.fmt
    nxt = pc + size
    if fmt == "SOPP":
      if name in ("s_round_mode", "s_denorm_mode") and get("simm16") & 0xF != _MODE_AS_EMULATED[name]:
        # s_round_mode: [1:0] f32, [3:2] f16/f64 rounding (0: nearest even); s_denorm_mode: [1:0] f32, [3:2] f16/f64
        # denormals (3: kept) (RDNA3 ISA guide, 16.5 "SOPP Instructions"): only the modes the emulator computes in
        raise EmulatorError(f"{name} {get('simm16') & 0xF:#x}: the emulator rounds to nearest even and keeps "
                            f"denormals ({name} {_MODE_AS_EMULATED[name]:#x}); other modes are not emulated")
      if name in _SOPP_NOOPS: return Compiled(name, size, NORMAL, lambda w, sel: None)
      if name in ("s_endpgm", "s_endpgm_saved", "s_sethalt"): return Compiled(name, size, END)
      if name == "s_barrier": return Compiled(name, size, BARRIER)
      if name == "s_branch": return Compiled(name, size, BRANCH, target=nxt + 4 * _signed16(get("simm16")))
      if name in _BRANCH_COND:
        return Compiled(name, size, BRANCH, cond=_BRANCH_COND[name], target=nxt + 4 * _signed16(get("simm16")))
      if name == "s_code_end":
        raise IllegalInstruction(pc, 0xBF9F0000, "s_code_end reached: execution ran past the end of the kernel")
      if name == "s_trap": raise IllegalInstruction(pc, int.from_bytes(self.code[pc:pc + 4], "little"), "s_trap executed")
      return None
    if fmt == "SOPK" and name == "s_call_b64":
      dst = get("sdst")
      def link(w, sel, _ret=nxt): w.write_s64(dst, sel, np.full(len(w.scc[sel]), w.code_base + _ret, U64))
      return Compiled(name, size, BRANCH, run=link, target=nxt + 4 * _signed16(get("simm16")))
    if fmt == "SOP1" and name in ("s_getpc_b64", "s_setpc_b64", "s_swappc_b64"):
      dst, src = get("sdst"), get("ssrc0")
      def getpc(w, sel, _ret=nxt): w.write_s64(dst, sel, np.full(len(w.scc[sel]), w.code_base + _ret, U64))
      if name == "s_getpc_b64": return Compiled(name, size, NORMAL, run=getpc)
      def dest(w, sel): return (w.read_s64(src, sel) - np.uint64(w.code_base)).astype(np.int64)
      return Compiled(name, size, JUMP, run=getpc if name == "s_swappc_b64" else None, dest=dest)
    if fmt in ("SOP1", "SOP2", "SOPC", "SOPK"): run = compile_salu(inst, get, literal)
    elif fmt in ("VOP1", "VOP2", "VOP3", "VOPC", "VOP3P"):
      run = compile_valu(inst, get, literal, self.n_vgprs, self.float_mode)
    elif fmt == "SMEM": run = compile_smem(inst, get)
    elif fmt in ("GLOBAL", "FLAT", "SCRATCH"): run = compile_vmem(inst, get, self.n_vgprs)
    elif fmt == "DS":
      run = compile_ds(inst, get, self.n_vgprs, lambda: f"kernel {self.name!r} at pc {pc:#x} ({self.text(pc)})")
    else: run = None
    return None if run is None else Compiled(name, size, NORMAL, run)


_PROGRAMS: dict[bytes, Program] = {}


def load_program(code_object: bytes) -> Program:
  """The decoded program of a code object (cached by content)."""
  key = hashlib.sha256(code_object).digest()
  prog = _PROGRAMS.get(key)
  if prog is None:
    code, kd, entry, name = read_code_object(code_object)
    if not kd.enable_wavefront_size32:
      raise EmulatorError(f"kernel {name!r} is wave64 (ENABLE_WAVEFRONT_SIZE32 = 0); the emulator runs wave32 only")
    prog = _PROGRAMS[key] = Program(code, entry, kd, name)
    if len(_PROGRAMS) > 256: _PROGRAMS.pop(next(iter(_PROGRAMS)))
  return prog


MAX_STEPS = 10_000_000       # instruction steps per batch of waves before a kernel is called a runaway


def dispatch(code_object: bytes, grid, block, kernarg_addr: int, mem, *, lds_size: int = 0, dispatch_ptr: int = 0,
             queue_ptr: int = 0, code_address: int = 0, max_steps: int | None = None, max_batch_waves: int = 8192,
             counters: KernelCounters | None = None) -> int:
  """Run a kernel over grid = (gx, gy, gz) workgroups of block = (lx, ly, lz) threads.

  kernarg_addr: GPU address of the kernel arguments in `mem` (a Memory). lds_size: dynamic
  LDS bytes added to the descriptor's group_segment_fixed_size. max_steps bounds the number of
  instruction steps (one step runs one instruction for a group of waves) per batch; exceeding it
  raises InstructionBudgetExceeded. Returns the number of steps executed; what the kernel executed is added into
  `counters` when one is given (drivers/emu/counters.py). max_steps None: MAX_STEPS."""
  if max_steps is None: max_steps = MAX_STEPS
  prog = code_object if isinstance(code_object, Program) else load_program(bytes(code_object))
  if prog.unemulated_mode: raise EmulatorError(f"kernel {prog.name!r}: {prog.unemulated_mode}")
  kd = prog.kd
  grid = tuple(int(g) for g in (tuple(grid) + (1, 1, 1))[:3])
  block = tuple(int(b) for b in (tuple(block) + (1, 1, 1))[:3])
  if min(grid) < 1 or min(block) < 1: raise ValueError(f"grid {grid} and block {block} must be positive")
  threads = block[0] * block[1] * block[2]
  if threads > 1024: raise ValueError(f"block {block} has {threads} threads; at most 1024 per workgroup")
  check_launch(prog, threads)
  waves_per_group = -(-threads // 32)
  n_groups = grid[0] * grid[1] * grid[2]
  # whole workgroups per batch; the VGPR file of a batch stays under ~256 MiB
  max_waves = min(max_batch_waves, max(1, (256 << 20) // (prog.n_vgprs * 32 * 4)))
  groups_per_batch = max(1, max_waves // waves_per_group)
  lds_bytes = kd.group_segment_fixed_size + lds_size
  if lds_bytes > 65536: raise ValueError(f"{lds_bytes} bytes of LDS requested; a gfx1100 workgroup has at most 65536")
  steps = 0
  counters = KernelCounters(prog.name) if counters is None else counters
  traffic = [0] * len(TRAFFIC)
  try:
    with np.errstate(all="ignore"):
      for g0 in range(0, n_groups, groups_per_batch):
        g1 = min(n_groups, g0 + groups_per_batch)
        w = _setup(prog, g0, g1, grid, block, waves_per_group, lds_bytes, kernarg_addr, dispatch_ptr, queue_ptr)
        if waves_per_group > 1 and lds_bytes:      # one wave alone is ordered by its own program order
          w.lds_order = LDSOrder(len(w.lds), lds_bytes, np.tile(np.arange(waves_per_group), g1 - g0), g0, grid)
        w.memory, w.code_base = mem, code_address
        w.deps = DepState(w.n)
        steps += _run(prog, w, max_steps, counters.instrs, traffic)
  finally:
    for field, n in zip(TRAFFIC, traffic): setattr(counters, field, getattr(counters, field) + n)
  return steps


def _setup(prog, g0, g1, grid, block, wpg, lds_bytes, kernarg_addr, dispatch_ptr, queue_ptr) -> Waves:
  kd = prog.kd
  ng = g1 - g0
  w = Waves(ng * wpg, prog.n_vgprs, ng, lds_bytes, kd.private_segment_fixed_size)
  w.group = np.repeat(np.arange(ng), wpg)
  w.pc[:] = prog.entry
  t = (np.tile(np.arange(wpg), ng)[:, None] * 32 + LANE.astype(np.int64))
  lx, ly, lz = block
  threads = lx * ly * lz
  x, y, z = t % lx, (t // lx) % ly, t // (lx * ly)
  ids = x.copy()
  if kd.enable_vgpr_workitem_id >= 1: ids |= y << 10
  if kd.enable_vgpr_workitem_id >= 2: ids |= z << 20
  w.V[0] = np.where(t < threads, ids, 0).astype(U32)
  w.S[EXEC] = mask_to_bits(t < threads)
  w.exec_dirty = True
  w.live = np.count_nonzero(t < threads, axis=1).astype(np.int64)
  w.live_total = int(w.live.sum())
  # user SGPRs (AMDGPUUsage: "Initial Kernel Execution State", SGPR order)
  s = 0
  def put64(value):
    nonlocal s
    w.S[s], w.S[s + 1] = value & 0xFFFFFFFF, value >> 32
    s += 2
  if kd.enable_sgpr_private_segment_buffer: s += 4
  if kd.enable_sgpr_dispatch_ptr: put64(dispatch_ptr)
  if kd.enable_sgpr_queue_ptr: put64(queue_ptr)
  if kd.enable_sgpr_kernarg_segment_ptr: put64(kernarg_addr)
  if kd.enable_sgpr_dispatch_id: put64(0)
  if kd.enable_sgpr_flat_scratch_init: put64(0)
  if kd.enable_sgpr_private_segment_size: w.S[s] = kd.private_segment_fixed_size; s += 1
  # system SGPRs start at USER_SGPR_COUNT
  s = kd.user_sgpr_count
  gid = g0 + w.group
  gx, gy, _ = grid
  for enabled, value in ((kd.enable_sgpr_workgroup_id_x, gid % gx), (kd.enable_sgpr_workgroup_id_y, (gid // gx) % gy),
                         (kd.enable_sgpr_workgroup_id_z, gid // (gx * gy))):
    if enabled:
      w.S[s] = value.astype(U32)
      s += 1
  if kd.enable_sgpr_workgroup_info: w.S[s] = 0; s += 1
  if kd.enable_private_segment: w.S[s] = 0; s += 1
  return w


_REGS = re.compile(r"\b([sv])(\d+)\b|\b([sv])\[(\d+):(\d+)\]")


def wave_state(prog: Program, w: Waves, sel, pc: int, before: int = 3, after: int = 2) -> str:
  """The state of the first wave at `pc` (a fault report): the instructions around it disassembled, its EXEC mask and
  the values of the registers the instruction names (vector registers: their first active lanes)."""
  from baregrad.drivers.amd.disasm import decode as disasm_decode
  waves = np.nonzero(~w.done & (w.pc == pc))[0] if sel is ALL else np.asarray(sel)
  wave = int(waves[0]) if len(waves) else 0
  listing, at = [], prog.entry
  while at < len(prog.code) and len(listing) < 100000:
    try: text, size = disasm_decode(prog.code, at)
    except Exception: break
    listing.append((at, text))
    if at > pc and sum(1 for a, _ in listing if a > pc) >= after: break
    at += size
  k = next((i for i, (a, _) in enumerate(listing) if a == pc), len(listing) - 1)
  lines = [f"wave {wave} of its batch (workgroup {int(w.group[wave])}) at the fault:"]
  lines += [f"  {'=>' if a == pc else '  '} {a:#06x}  {t}" for a, t in listing[max(0, k - before):k + after + 1]]
  if not any(a == pc for a, _ in listing):
    lines.append(f"  => {pc:#06x}  (not an instruction: dword {int.from_bytes(prog.code[pc:pc + 4], 'little'):#010x})")
  execm = int(w.S[EXEC][wave]) | int(w.S[EXEC + 1][wave]) << 32
  lanes = [i for i in range(32) if execm >> i & 1]
  lines.append(f"  EXEC {execm:#018x} ({len(lanes)} lanes active)")
  regs = []
  for m in _REGS.finditer(prog.text(pc)):
    kind, lo, hi = (m.group(1), int(m.group(2)), int(m.group(2))) if m.group(1) else (m.group(3), int(m.group(4)), int(m.group(5)))
    for r in range(lo, hi + 1):
      if kind == "s" and r < w.S.shape[0]: regs.append(f"s{r} = {int(w.S[r][wave]):#x}")
      elif kind == "v" and r < w.V.shape[0]:
        shown = ", ".join(f"lane {i}: {int(w.V[r][wave][i]):#x}" for i in lanes[:4])
        regs.append(f"v{r} = {shown or 'no active lane'}{' ...' if len(lanes) > 4 else ''}")
  if regs: lines.append("  registers it names: " + "; ".join(dict.fromkeys(regs)))
  return "\n".join(lines)


def _run(prog: Program, w: Waves, max_steps: int, counts: list, traffic: list) -> int:
  """Run the waves of one batch; add thread-instructions per class into `counts` and bytes into `traffic`."""
  steps = 0
  uniform = prog.entry        # the PC of all waves while they agree, else None
  sel = ALL
  pc = uniform
  while True:
    if uniform is None:
      runnable = ~w.done & ~w.barrier
      if not runnable.any():
        if not w.barrier.any(): return steps
        w.barrier[:] = False                            # every live wave reached s_barrier
        if w.lds_order is not None: w.lds_order.barrier()
        runnable = ~w.done
      pc = int(w.pc[runnable].min())
      here = runnable & (w.pc == pc)
      if here.all(): uniform, sel = pc, ALL
      else: sel = np.nonzero(here)[0]
    else:
      pc, sel = uniform, ALL
    steps += 1
    if steps > max_steps:
      raise InstructionBudgetExceeded(
        f"kernel {prog.name!r} exceeded the instruction budget of {max_steps} steps (at pc {pc:#x}: {prog.text(pc)}); "
        "a runaway loop? pass a larger max_steps to dispatch() for long kernels")
    try: c = prog.at(pc)
    except EmulatorError as e:       # an instruction it cannot decode: the wave that reached it
      e.add_note(wave_state(prog, w, sel, pc))
      raise
    lanes = w.active_lanes(sel) if c.vector else w.live_lanes(sel)
    counts[c.cls] += lanes
    if c.traffic:
      per = lanes if c.vector else (w.n if sel is ALL else len(sel))    # SMEM: once per wave
      for slot, width in c.traffic: traffic[slot] += per * width
    try:
      if w.tracking or c.dep.starts: dependency_step(w, c.dep, sel, pc, prog.text)
      if c.run is not None: c.run(w, sel)
    except (MemoryFault, EmulatorError) as e:
      if f"kernel {prog.name!r} at pc {pc:#x}" not in str(e):      # LDSRace names them already
        e.add_note(f"in kernel {prog.name!r} at pc {pc:#x}: {prog.text(pc)}")
      e.add_note(wave_state(prog, w, sel, pc))
      raise
    except Exception as e:
      raise EmulatorError(f"kernel {prog.name!r} at pc {pc:#x} ({prog.text(pc)}): {type(e).__name__}: {e}") from e
    kind = c.kind
    if kind == NORMAL:
      if uniform is not None: uniform = pc + c.size
      else: w.pc[sel] = pc + c.size
    elif kind == BRANCH:
      if c.cond is None: taken = True
      else:
        t = c.cond(w, sel)
        taken = bool(t.all()) if t.all() or not t.any() else t
      if taken is True or taken is False:
        new = c.target if taken else pc + c.size
        if uniform is not None: uniform = new
        else: w.pc[sel] = new
      else:
        if uniform is not None: w.pc[:] = pc; uniform = None
        w.pc[sel] = np.where(taken, c.target, pc + c.size)
    elif kind == END:
      if uniform is not None: return steps
      w.done[sel] = True
    elif kind == BARRIER:
      if uniform is not None:                           # every wave arrives together
        uniform = pc + c.size
        if w.lds_order is not None: w.lds_order.barrier()
      else:
        w.pc[sel] = pc + c.size
        w.barrier[sel] = True
    elif kind == JUMP:
      dest = c.dest(w, sel)
      if uniform is not None:
        if (dest == dest[0]).all(): uniform = int(dest[0]); continue
        w.pc[:] = dest; uniform = None
      else: w.pc[sel] = dest


def coverage() -> tuple[list[str], list[str]]:
  """(mnemonics with semantics, mnemonics without) over every (format, opcode) of the tables.

  Each instruction is compiled once with all fields zero (registers s0/v0) to see whether the
  emulator can run it."""
  prog = Program(b"\0" * 16, 0, KernelDescriptor.for_kernel(vgprs=256))
  have, missing = [], []
  for (fmt, _), inst in sorted(isa.BY_OPCODE.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    label = f"{inst.name} ({fmt})"
    try:
      ok = prog._compile_inst(0, inst, lambda name: 0, 0, 8) is not None
    except IllegalInstruction:
      ok = inst.name in ("s_code_end", "s_trap")        # defined behaviour: they stop the kernel
    except Exception:
      ok = False
    (have if ok else missing).append(label)
  return have, missing
