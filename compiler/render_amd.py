"""Render a linearized kernel to RDNA3 (gfx1100) instruction objects (compiler/amd/inst.py); `compile` encodes them
(compiler/amd/encode.py) into a code object. No assembly text on that path: str() of the result is the listing.

Launch and calling convention (LLVM AMDGPUUsage, "Initial Kernel Execution State" for GFX11, wave32):
s[0:1] = kernarg segment pointer (the only user SGPRs), then the system SGPRs: workgroup id x in s2, then y and z
in the next SGPRs where the descriptor enables them (ENABLE_SGPR_WORKGROUP_ID_Y/Z, set only when gid1/gid2 are
used); v0 = the packed work-item id x | y << 10 | z << 20 (gfx11 packs them; ENABLE_VGPR_WORKITEM_ID is 1 when
lid1 is used, 2 when lid2 is). The kernarg segment holds one 8-byte slot per buffer pointer in PARAM order, then
one 8-byte (int64) slot per DEFINE_VAR sorted by name. Kernels not mapped to workgroups have codegen's SPECIAL
"gidx" = workgroup_id * 256 + local_id (`to_threads`); workgroup kernels (compiler/gpu.py) read gid0..2 (uniform:
the SGPR itself is the value) and lid0..2 (unpacked from v0 once each).

Workgroup memory (DEFINE_LOCAL) is LDS: each buffer at a 16-byte aligned offset, the sum is the descriptor's
GROUP_SEGMENT_FIXED_SIZE (at most 64 KiB a workgroup, RDNA3 ISA guide "Local Data Share"). An INDEX on it is a
32-bit LDS byte address (the buffer's offset goes in the DS instruction's 16-bit offset field); STORE/LOAD are
ds_store_b8/b16/b32/b64 and ds_load_u8/i8/u16/i16/b32/b64, whose results are read only after the s_waitcnt
lgkmcnt that `insert_lds_waits` places (LDS operations complete in order: RDNA3 ISA guide 5.6 "Data Dependency
Resolution"). BARRIER is `s_waitcnt lgkmcnt(0)` (the workgroup-scope release of AMDGPUUsage's "Memory Model
GFX10-GFX11" table: every LDS store done) then `s_barrier`.

Registers: `regalloc.allocate` gives each virtual register the lowest free physical one from its first to its
last mention (a register is reused once its value is dead; values live around a loop keep theirs for the whole
loop) without spilling. The budget is what the hardware can launch: gfx1100 wave32 has 1536 VGPRs per SIMD,
allocated in granules of 24, 256 addressable per wave, and the waves of a workgroup share the 4 SIMDs of a WGP
(LLVM AMDGPUBaseInfo.cpp getTotalNumVGPRs, getVGPRAllocGranule, getAddressableNumVGPRs, getEUsPerCU, getMaxNumVGPRs):
min(256, alignDown(1536 / ceil(waves / 4), 24)) VGPRs a wave: 256 up to 640 threads, 240 for 768, 192 for 1024. A kernel
needing more fails to render with an error naming it and its register count.

What RDNA3 lacks was lowered before (compiler/lower.py, keyed by `native_ops`); the ops left map through the
tables BINARY / UNARY to one instruction or to an emitter for what only this target has to spell out:
- values live in VGPRs: bool, int8..uint32 and the storage bits of float16/bfloat16 as 32-bit integers (sign/
  zero-extended from their width), float32 in one dword, int64/uint64/index/float64 in two. An 8-byte integer
  whose value range (UOp.vrange) fits in int32 is held "narrow" in one dword (sign-extended where a 64-bit use
  needs it) and computed with 32-bit instructions where that gives the same value. Pointers, variables and
  loop counters are SGPRs; constants are inline/literal operands; compares write vcc_lo and become 0/1 with
  v_cndmask_b32; gated loads/stores run under s_and_saveexec_b32 (a gated-off lane loads 0).
- float division, reciprocal and square root are refined from the hardware estimates (v_rcp_f32 / v_sqrt_f32
  are ~1 ulp, RDNA3 ISA guide "VOP1") by Newton/FMA residual steps; float->int truncates, giving x86's
  "integer indefinite" for NaN and out-of-range values as the CPU device does.
- there is no integer divide (the divisor is never 0 nor -1 here): 32 bits use a v_rcp_iflag_f32 estimate of
  2^32/d, one Newton step and two corrections; constant divisors multiply-high by a magic number (Granlund &
  Montgomery, "Division by invariant integers using multiplication", 1994); 64 bits a 64-step restoring loop.
The kernel descriptor enables float32 denormals (float_denorm_mode_32 = 3) so that results match C's.

Fewer instructions (decided before emitting, compiler/amd/plan.py): an accumulate step is computed into its
accumulator (a float sum of products as one v_fmac_f32, rounded once); an index x + c takes the address of x and c in
the immediate offset (global: signed 13 bits, with SGPR bases moved by 8 KiB set once for larger c; DS: 16 bits), one
address VGPR per (x, size) in a loop body; neighbouring 4-byte LDS loads are one ds_load_b128/b64; a global index
whose byte offset may not fit 32 unsigned bits is one v_mad_i64_i32; in a loop, the terms of an index sum known
before it are added once before it; the loads of a tile staged through LDS all go out before one wait. Tensor cores
(compiler/tc.py): v_wmma_f32_16x16x16_{f16,bf16} with A and B in 8 consecutive VGPRs each (16-byte runs of one
row straight from memory with global_load_b128, other pairs packed by v_lshl_or_b32) and, when its outputs are only
added into accumulators, those accumulators (8 consecutive VGPRs) as C and D.
"""
from __future__ import annotations
import math, struct
from dataclasses import dataclass
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes
from .lower import Native
from .decomp import bits16
from .symbolic import conjuncts
from .amd.inst import Inst, Reg, Sub, Imm, Neg, Abs, Label, OFF, VCC_LO, EXEC_LO, waitcnt, listing, base_reg
from .amd.regalloc import legalize, allocate, insert_waits, live_intervals, RegisterPressureError, MAX_SGPRS, _phys
from .amd.plan import plan, split, hoist_staging_loads
from .amd.encode import assemble
from baregrad.drivers.amd.codeobj import KernelMeta, write_kernel
from baregrad.drivers.amd import isa

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
LOCAL_SIZE = 256
KERNARG_PTR, WORKGROUP_ID_X, LOCAL_ID = Reg("s", 2, phys=0), Reg("s", 1, phys=2), Reg("v", 1, phys=0)
NULL = Reg("s", 1, phys=isa.SPECIAL_SREGS["null"])     # a discarded carry-out (v_mad_*64)
USER_SGPRS, RESERVED_VGPRS = 2, 1
GROUP_IDS, LOCAL_IDS = ("gid0", "gid1", "gid2"), ("lid0", "lid1", "lid2")
WORKITEM_ID_BITS = 10                  # packed work-item ids: x bits 0-9, y 10-19, z 20-29 (AMDGPUUsage, GFX11)
MAX_WORKGROUP_THREADS = 1024
# VGPR budget (LLVM AMDGPUBaseInfo.cpp, gfx1100 = Feature1_5xVGPRs, wave32; see the module docstring)
TOTAL_VGPRS_PER_SIMD, VGPR_ALLOC_GRANULE, ADDRESSABLE_VGPRS, SIMDS_PER_WGP, WAVE = 1536, 24, 256, 4, 32
LDS_BYTES = 65536                      # per workgroup (RDNA3 ISA guide, "Local Data Share"; AMDGPUUsage: 64 KiB)
LDS_ALIGN = 16
DS_LOAD = {1: "u8", 2: "u16", 4: "b32", 8: "b64"}
# v_cmp_class masks (RDNA3 ISA guide, V_CMP_CLASS_F32): bit 3 -normal, 4 -denormal, 7 +denormal, 8 +normal
CLASS_FINITE_NONZERO, CLASS_POSITIVE_FINITE_NONZERO = 0x198, 0x180
# gfx1100's VALU trans-use hazard (LLVM AMDGPU.td FeatureVALUTransUseHazard, GCNHazardRecognizer::
# fixVALUTransUseHazard): a transcendental's (v_rcp/v_sqrt/v_rsq...) result is read only after
# `s_waitcnt_depctr va_vdst(0)` (0xfff, what LLVM inserts) or enough other VALUs
DEPCTR_VA_VDST_0 = 0x0FFF
MEM_LOAD = {1: "u8", 2: "u16", 4: "b32", 8: "b64"}
MEM_STORE = {1: "b8", 2: "b16", 4: "b32", 8: "b64"}
# instructions whose destination may not be renamed to an accumulator that is also a source (gfx11 forbids an
# overlap of the 64-bit mad destination with its sources; WMMA and compares have destinations of their own)
NO_RETARGET = ("v_mad_u64", "v_mad_i64", "v_wmma", "v_cmp", "v_readfirstlane", "v_readlane")


@dataclass(frozen=True)
class LDSAddress:
  """Where a lane's workgroup-memory access goes: VGPR `addr` + the DS instruction's offset field."""
  addr: object
  offset: int


@dataclass(frozen=True)
class GlobalAddress:
  """Where a lane's global access goes: `saddr` (an SGPR pair) + `vaddr` (a 32-bit VGPR offset) + `offset`, or with
  saddr OFF a 64-bit VGPR address + offset (RDNA3 ISA guide, "Global, Scratch and Flat Instructions")."""
  vaddr: object
  saddr: object
  offset: int = 0

  def mods(self) -> dict: return {"offset": self.offset} if self.offset else {}


GLOBAL_OFFSET = 4096        # the signed 13-bit immediate offset of GLOBAL instructions: -4096..4095 (gfx11)
CHUNK = 2 * GLOBAL_OFFSET   # one SGPR base per 8 KiB window of constant offsets
MAX_CHUNK_BASES = 12        # SGPR pairs spent on such bases; beyond, a VGPR add per (index, window)
SGPR_SLACK = 32             # SGPRs kept free of them for loop counters, saved EXEC masks and the like


class Const:
  """A constant value: `bits` of its register form (a 64-bit pattern when size == 2)."""
  __slots__ = ("bits", "size", "is_float")
  def __init__(self, bits: int, size: int, is_float: bool = False): self.bits, self.size, self.is_float = bits, size, is_float


def f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


def imm32(bits: int) -> Imm: return Imm(b - (1 << 32) if (b := bits & 0xFFFFFFFF) >= 0xFFFFFFF0 else b)


def fits32(u: UOp) -> bool:
  lo, hi = u.vrange
  return isinstance(lo, int) and isinstance(hi, int) and -(1 << 31) <= lo and hi < (1 << 31)


def is_narrow(u: UOp) -> bool:
  """An 8-byte integer value held in one (sign-extended) dword."""
  return u.dtype is not None and u.dtype.itemsize == 8 and (u.dtype.is_int or u.dtype == dtypes.index) and fits32(u)


def is_wide(dt: DType, u: UOp | None = None) -> bool:
  """Two dwords: float64 and 8-byte integers that are not narrow."""
  return dt == F64 or (dt.itemsize == 8 and not (u is not None and is_narrow(u)))


def signed(dt: DType) -> bool: return dt.kind == 'i' or dt == dtypes.index


def value_class(dt: DType) -> str:
  """How a dtype's values are held and computed: f32, f64, or integers i32/u32/i64/u64 (bool, the 8/16-bit
  integers and the storage bits of float16/bfloat16 are 32-bit integers in registers)."""
  if dt in (F32, F64): return f"f{8 * dt.itemsize}"
  return ("i" if signed(dt) else "u") + ("64" if dt.itemsize == 8 else "32")


@dataclass
class AMDKernel:
  """What AMDRenderer.render returns: the instructions (registers allocated, waits inserted) and the facts the
  code-object writer needs. str() is the assembly listing (DEBUG=4, captures), made only when asked for."""
  meta: KernelMeta
  code: list

  def __str__(self):
    m = self.meta
    ids = m.workgroup_ids if isinstance(m.workgroup_ids, tuple) else tuple(m.workgroup_ids > k for k in range(3))
    sgprs = ", ".join(f"workgroup id {a} s{USER_SGPRS + sum(ids[:k])}" for k, a in enumerate("xyz") if ids[k])
    return (f"; {m.name}: gfx1100 wave32, kernarg s[0:1], {sgprs}, work-item ids {'xyz'[:m.workitem_dims]} in v0\n"
            f"; vgprs={m.vgprs} sgprs={m.sgprs} kernarg={m.kernarg_size} lds={m.lds_size}\n{listing(self.code)}\n")


class AMDRenderer:
  device = "AMD"
  threads = True                         # codegen maps the global loops to SPECIAL "gidx"
  workgroups = True                      # or to workgroups with the GPU opts (compiler/gpu.py)
  tensor_cores = True                    # renders WMMA ops (compiler/tc.py) as v_wmma_f32_16x16x16_{f16,bf16}
  # exp2/log2/sin are decomposed (v_exp_f32/v_log_f32 are ~1 ulp and v_sin_f32 is inaccurate for large arguments:
  # RDNA3 ISA guide, "VOP1"), so are NaN-propagating max and fmod; 16-bit floats and the 8/16-bit integers are
  # emulated in 32 bits; 64-bit integer division is a loop, so fmod avoids it
  # (float16 <-> float32 are v_cvt_f16_f32 / v_cvt_f32_f16: round to nearest even, denormals kept as the descriptor's
  # float_denorm_mode_16_64 says; RDNA3 ISA guide, "VOP1")
  native_ops = Native(float_ops=frozenset({Ops.FDIV, Ops.FLOOR}),
                      dtypes=frozenset(dtypes.all()) - {F16, BF16, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16},
                      int64_divide=False, float16_casts=frozenset({F16}))
  arch = "gfx1100"

  def render(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> AMDKernel:
    return _Renderer(name, program, alias, n_params, variables).render()

  def compile(self, kernel: AMDKernel) -> bytes:
    if not isinstance(kernel, AMDKernel):
      raise TypeError(f"AMDRenderer.compile takes the AMDKernel render() returns, not {type(kernel).__name__} (hand-written "
                      "assembly: compiler.amd.asm.assemble, then drivers.amd.codeobj.write_kernel)")
    return write_kernel(kernel.meta, assemble(kernel.code))


class _Renderer:
  def __init__(self, name, program, alias, n_params, variables):
    program = hoist_staging_loads(program)
    self.name, self.program, self.alias, self.n_params, self.variables = name, program, alias, n_params, variables
    self.code: list = []
    self.born: dict = {}               # virtual register -> the code position when it was made (retarget)
    self.nregs = self.labels = 0
    self.vals: dict[UOp, object] = {}
    self.loops: dict[UOp, tuple] = {}
    self.launch_registers()
    self.lds_offsets, self.lds_size = self.layout_lds()
    self.plan = plan(program)
    self.scopes: list[dict] = [{}]     # per open loop: cached addresses, operands, values rendered in it
    self.sums: dict = {}               # reassociated index sums in open loops: root -> (the terms left, invariant sum)
    self.sum_parts: set = set()        # the inner ADDs of those sums (not rendered)
    self.chunks: dict = {}             # (PARAM, window) -> SGPR pair holding its address + window * CHUNK
    self.wmma_d: dict = {}             # WMMA group -> the 8 VGPRs of its D (and C when in place)

  # ---------------------------------------------------------------- registers and instructions
  def reg(self, file: str, size: int = 1) -> Reg:
    self.nregs += 1
    r = Reg(file, size, self.nregs)
    self.born[r] = len(self.code)
    return r

  def v(self, size: int = 1) -> Reg: return self.reg("v", size)
  def s(self, size: int = 1) -> Reg: return self.reg("s", size)

  def label(self, hint: str = "L") -> Label:
    self.labels += 1
    return Label(f".{hint}{self.labels}")

  def e(self, name: str, *operands): self.code.append(Inst(name, operands))

  def o(self, name: str, *srcs, size: int = 1) -> Reg:
    """Emit `name d, srcs...` into a new VGPR (pair when size=2) and return it."""
    d = self.v(size)
    self.e(name, d, *srcs)
    return d

  def trans(self, name: str, x, size: int = 1) -> Reg:
    """A transcendental estimate into a new register, readable after the s_waitcnt_depctr that follows it."""
    d = self.o(name, x, size=size)
    self.e("s_waitcnt_depctr", Imm(DEPCTR_VA_VDST_0))
    return d

  def sel(self, f, t, cond=VCC_LO) -> Reg: return self.o("v_cndmask_b32", f, t, cond)   # t where the mask is set

  def sel64(self, f, t) -> Reg: return self.mov64(self.sel(f[0], t[0]), self.sel(f[1], t[1]))

  def mov64(self, lo, hi) -> Reg:
    d = self.v(2)
    self.e("v_mov_b32", d[0], lo); self.e("v_mov_b32", d[1], hi)
    return d

  def cmp_to_bool(self) -> Reg: return self.sel(Imm(0), Imm(1))

  def compare(self, name: str, a, b) -> Reg:
    self.e(name, VCC_LO, a, b)
    return self.cmp_to_bool()

  # ---------------------------------------------------------------- launch registers and workgroup memory
  def launch_registers(self):
    """Which workgroup ids (SGPRs) and work-item ids (v0) the kernel reads, the SGPR of each id, the workgroup size."""
    specials = {}
    for u in self.program:
      if u.op is not Ops.SPECIAL: continue
      name, size = u.arg
      if name not in ("gidx",) + GROUP_IDS + LOCAL_IDS:
        raise NotImplementedError(f"AMD renderer: kernel {self.name!r} has an unknown SPECIAL {name!r} "
                                  f"(knows gidx, {', '.join(GROUP_IDS + LOCAL_IDS)})")
      if specials.setdefault(name, size) != size:
        raise ValueError(f"AMD renderer: kernel {self.name!r} has SPECIAL {name!r} with sizes {specials[name]} and {size}")
    if "gidx" in specials and len(specials) > 1:
      raise ValueError(f"AMD renderer: kernel {self.name!r} mixes the 1-D SPECIAL 'gidx' with workgroup ids "
                       f"{sorted(set(specials) - {'gidx'})}; a kernel uses one launch mapping")
    local = [specials.get(n, 1) for n in LOCAL_IDS]
    if "gidx" in specials: local = [LOCAL_SIZE, 1, 1]
    if max(local) > 1 << WORKITEM_ID_BITS or math.prod(local) > MAX_WORKGROUP_THREADS:
      raise ValueError(f"AMD renderer: kernel {self.name!r} has a workgroup of {'x'.join(map(str, local))} threads; gfx1100 "
                       f"runs at most {MAX_WORKGROUP_THREADS} a workgroup (ids of {WORKITEM_ID_BITS} bits a dimension)")
    self.threads = math.prod(local)
    # system SGPRs after the user SGPRs: workgroup id x always (s2), y and z only where used, each the next SGPR
    self.group_ids = (True, "gid1" in specials, "gid2" in specials)
    self.group_sgpr = {}
    for k, name in enumerate(GROUP_IDS):
      if self.group_ids[k]: self.group_sgpr[name] = Reg("s", 1, phys=USER_SGPRS + sum(self.group_ids[:k]))
    self.workitem_dims = 3 if "lid2" in specials else 2 if "lid1" in specials else 1
    self.reserved_sgprs = USER_SGPRS + sum(self.group_ids)

  def layout_lds(self) -> tuple[dict, int]:
    """Each DEFINE_LOCAL's byte offset in LDS (16-byte aligned, in order of first appearance) and the total."""
    offsets, size = {}, 0
    for u in self.program:
      if u.op is not Ops.DEFINE_LOCAL or u in offsets: continue
      count = u.arg[1]
      if not isinstance(count, int) or count < 1:
        raise ValueError(f"AMD renderer: kernel {self.name!r}: DEFINE_LOCAL {u.arg} needs a positive constant element count")
      size = -(-size // LDS_ALIGN) * LDS_ALIGN
      offsets[u] = size
      size += count * u.dtype.itemsize
    size = -(-size // LDS_ALIGN) * LDS_ALIGN
    if size > LDS_BYTES:
      raise ValueError(f"AMD renderer: kernel {self.name!r} needs {size} bytes of workgroup memory (DEFINE_LOCAL: "
                       + ", ".join(f"{u.arg[1]} x {u.dtype.name}" for u in offsets) + f"); a gfx1100 workgroup has "
                       f"at most {LDS_BYTES} bytes of LDS: use smaller local buffers (fewer threads or a smaller tile)")
    return offsets, size

  def waves_per_simd(self) -> int: return -(-(-(-self.threads // WAVE)) // SIMDS_PER_WGP)   # ceil(ceil(t / 32) / 4)

  def vgpr_budget(self) -> int:
    """The VGPRs a wave may use when the whole workgroup must fit on one WGP (see the module docstring)."""
    per_simd = TOTAL_VGPRS_PER_SIMD // self.waves_per_simd()
    return min(ADDRESSABLE_VGPRS, per_simd // VGPR_ALLOC_GRANULE * VGPR_ALLOC_GRANULE)

  def register_error(self, code: list, file: str, limit: int, used: int | None, why: str) -> RegisterPressureError:
    """The error for a kernel whose registers exceed `limit`: its need and where most values are live at once."""
    delta: dict[int, int] = {}
    for r, (a, b) in live_intervals(code).items():
      if r.file != file: continue
      delta[a] = delta.get(a, 0) + r.size
      delta[b + 1] = delta.get(b + 1, 0) - r.size
    live, peak, at = (RESERVED_VGPRS if file == "v" else self.reserved_sgprs), 0, 0
    for i in sorted(delta):
      live += delta[i]
      if live > peak: peak, at = live, i
    need, kind = max(peak, used or 0), ("VGPRs" if file == "v" else "SGPRs")
    where = next((x.name for x in code[at:] if isinstance(x, Inst)), "the end")
    over = f"{need - limit} more than" if need > limit else "which do not fit (register pairs left no room) in"
    fix = "keep fewer values live (a smaller register tile or upcast, fewer accumulators, fewer fused ops)"
    if file == "v" and limit < ADDRESSABLE_VGPRS: fix += " or use fewer threads a workgroup"
    return RegisterPressureError(
      f"AMD renderer: kernel {self.name!r} needs {need} {kind}, {over} the {limit} {why}: {peak} are live at once at "
      f"instruction {at} ({where}). The renderer does not spill: {fix}")

  def allocate_registers(self, code: list) -> tuple[int, int]:
    """(VGPRs, SGPRs) used once every virtual register has a physical one within the budget, or a clear error."""
    budget, per_simd = self.vgpr_budget(), self.waves_per_simd()
    why_v = (f"a gfx1100 wave32 wave may use in a workgroup of {self.threads} threads ({TOTAL_VGPRS_PER_SIMD} VGPRs a "
             f"SIMD shared by {per_simd} wave{'s' if per_simd > 1 else ''} of it, at most {ADDRESSABLE_VGPRS} addressable)")
    try: vgprs, sgprs = allocate(code, RESERVED_VGPRS, self.reserved_sgprs)
    except RegisterPressureError as e:
      if "VGPRs" in str(e): raise self.register_error(code, "v", budget, None, why_v) from None
      raise self.register_error(code, "s", MAX_SGPRS, None, "SGPRs (s0..s105) of gfx1100") from None
    if vgprs > budget: raise self.register_error(code, "v", budget, vgprs, why_v)
    return vgprs, sgprs

  # ---------------------------------------------------------------- driver
  def render(self) -> AMDKernel:
    if any(u.op is Ops.DEFINE_ACC and u.src for u in self.program):
      raise NotImplementedError("AMD renderer: upcast accumulators (DEFINE_ACC with lanes) are CPU-only opts "
                                "(GPU kernels expand their lanes: compiler/gpu.py)")
    # kernel arguments: one s_load_b64 per pointer / variable, then one wait (RDNA3 ISA guide, "Scalar Memory")
    for u in self.program:
      if u.op is Ops.PARAM and u not in self.vals:
        if u.arg >= self.n_params: raise RuntimeError(f"PARAM {u.arg} but the kernel has {self.n_params} parameters")
        r = self.s(2)
        self.e("s_load_b64", r, KERNARG_PTR, Imm(8 * u.arg))
        self.vals[u] = r
    for j, var in enumerate(self.variables):
      r = self.s(2)
      self.e("s_load_b64", r, KERNARG_PTR, Imm(8 * (self.n_params + j)))
      self.vals[var] = r[0] if is_narrow(var) else r
    if self.code: self.e("s_waitcnt", waitcnt(lgkmcnt=0))
    self.chunk_bases()
    self.tail_gate = self.find_tail_gate()
    self.exit = self.label("exit")
    for self.pc, u in enumerate(self.program): self.lower(u)
    self.code.append(self.exit)
    self.e("s_endpgm")
    code = legalize(self.code, self.v)
    vgprs, sgprs = self.allocate_registers(code)
    args = [{".name": f"data{i}", ".size": 8, ".offset": 8 * i, ".value_kind": "global_buffer",
             ".address_space": "global"} for i in range(self.n_params)]
    args += [{".name": v.arg[0], ".size": 8, ".offset": 8 * (self.n_params + j), ".value_kind": "by_value"}
             for j, v in enumerate(self.variables)]
    meta = KernelMeta(self.name, vgprs, sgprs, 8 * (self.n_params + len(self.variables)), tuple(args),
                      lds_size=self.lds_size, workgroup_ids=self.group_ids, workitem_dims=self.workitem_dims,
                      descriptor=(("float_denorm_mode_32", 3), ("float_denorm_mode_16_64", 3)),
                      max_flat_workgroup_size=self.threads)
    return AMDKernel(meta, insert_lds_waits(insert_waits(wmma_hazards(code))))

  def find_tail_gate(self) -> UOp | None:
    """`gidx < n` when every store is gated by it (to_threads' guard for threads past the end)."""
    common = None
    for u in self.program:
      if u.op is not Ops.STORE: continue
      idx = u.src[0]
      terms = {t for t in (conjuncts(idx.src[2]) if len(idx.src) == 3 else ()) if t.op is Ops.CMPLT and
               t.src[0].op is Ops.SPECIAL and t.src[0].arg[0] == "gidx" and t.src[1].op is Ops.CONST and is_narrow(t.src[0])}
      common = terms if common is None else common & terms
    return next(iter(common)) if common else None

  def lower(self, u: UOp, now: bool = False):
    if not now and (self.plan.skipped(u) or u in self.sum_parts or self.plan.lds_vectors.get(u, ()) is None):
      return      # rendered by the op that uses it / part of a reassociated sum / by the first load of its vector group
    rule = RULES.get(u.op)
    if rule is None: raise NotImplementedError(f"AMD renderer: no rule for {u.op.name}")
    if u in self.sums: x = self.reassociated(u)
    else: x = self.inplace_step(u) if u in self.plan.inplace else rule(self, u)
    if x is None: return
    # values only: an INDEX is an address whatever its dtype says (an int64 INDEX is not an int64 value)
    if u.dtype is not None and u.dtype.itemsize == 8 and u.dtype.is_int and u.op not in (Ops.RANGE, Ops.INDEX):
      # keep the representation rule: narrow (one dword) exactly when the value fits in int32
      if is_narrow(u) and isinstance(x, Reg) and x.size == 2: x = x[0]
      elif not is_narrow(u) and not (isinstance(x, Reg) and x.size == 2) and not isinstance(x, Const):
        x = self.rpair(x, signed(u.dtype))
    if len(self.scopes) > 1 and u.op not in (Ops.DEFINE_ACC, Ops.RANGE):
      self.scopes[-1].setdefault(("rendered",), []).append((u, self.vals.get(u)))
    self.vals[u] = x

  # ---------------------------------------------------------------- values
  def val(self, u: UOp):
    u = self.alias.get(u, u)
    if u not in self.vals:
      if u.op is Ops.CONST: return self.const(u.arg, u.dtype, u)
      if self.plan.skipped(u) or u in self.sum_parts:     # planned to be folded into its user, which could not
        self.lower(u, now=True)
        return self.vals[u]
      raise RuntimeError(f"AMD renderer: {u.op.name} used before it was rendered")
    return self.vals[u]

  # scopes: what is computed inside a loop body is valid in that body only (the next iteration recomputes it, and a
  # loop with a variable bound may not run at all); what is computed before a loop stays valid in it
  def cached(self, key, make):
    for scope in reversed(self.scopes):
      if key in scope: return scope[key]
    value = self.scopes[-1][key] = make()
    return value

  def pop_scope(self):
    """Leave a loop body: what was computed in it is gone (the linearizer emits a value again where it is needed
    after the loop: C block scoping; a value rendered again in the loop has its outer register back), as are its
    reassociated sums."""
    scope = self.scopes.pop()
    for u, before in reversed(scope.get(("rendered",), ())):
      if before is None: self.vals.pop(u, None)
      else: self.vals[u] = before
    for u in scope.get(("sums",), ()): self.sums.pop(u, None)
    self.sum_parts -= scope.get(("parts",), set())

  def const(self, value, dt: DType, u: UOp | None = None) -> Const:
    if dt.is_bool: return Const(1 if value else 0, 1)
    if dt == F64: return Const(f64_bits(value), 2, True)
    if dt == F32: return Const(f32_bits(value), 1)
    if dt.is_float: return Const(bits16(value, dt), 1)     # float16/bfloat16: the storage bits
    if dt.itemsize == 8 and not (-(1 << 31) <= int(value) < (1 << 31) and (u is None or is_narrow(u))):
      return Const(int(value) & 0xFFFFFFFFFFFFFFFF, 2)
    return Const(int(value) & 0xFFFFFFFF, 1)

  def op32(self, u_or_val):
    """A one-dword operand (the low dword of a wide value)."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const): return imm32(x.bits)
    return x[0] if isinstance(x, Reg) and x.size == 2 else x

  lo = op32

  def hi(self, u_or_val, sgn: bool = True):
    """The high dword of a 64-bit value; a narrow value is sign-extended (zero-extended if not sgn)."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const): return imm32(x.bits >> 32 if x.size == 2 else 0xFFFFFFFF if sgn and x.bits & 0x80000000 else 0)
    if isinstance(x, Reg) and x.size == 2: return x[1]
    return self.o("v_ashrrev_i32", Imm(31), x) if sgn else Imm(0)

  def pair(self, u_or_val, sgn: bool = True):
    """A 64-bit operand: a register pair, or a 64-bit inline constant."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const):
      v = x.bits if x.size == 2 else (x.bits - (1 << 32) if sgn and x.bits & 0x80000000 else x.bits)
      v = v - (1 << 64) if v >= (1 << 63) else v
      if -16 <= v <= 64 and (not x.is_float or v == 0): return Imm(v)      # an inline integer constant
      return self.mov64(imm32(v), imm32(v >> 32))
    if isinstance(x, Reg) and x.size == 2: return x
    return self.mov64(x, self.hi(x, sgn))

  def rpair(self, u_or_val, sgn: bool = True) -> Reg:
    """A 64-bit value in a register pair (constants are moved into VGPRs)."""
    return self.mov64(imm32(x.value), imm32(x.value >> 32)) if isinstance(x := self.pair(u_or_val, sgn), Imm) else x

  def vgpr(self, x) -> Reg:
    """A value as one VGPR (stores and addresses need VGPRs)."""
    if isinstance(x, Reg) and x.file == "v" and x.size == 1: return x
    if isinstance(x, Sub) and x.reg.file == "v": return x
    return self.o("v_mov_b32", self.op32(x))

  def copy_into(self, dst, src, dt: DType):
    """Copy a value into a (new, if dst is None) VGPR or VGPR pair; returns the destination."""
    wide = (isinstance(src, Reg) and src.size == 2) or (isinstance(src, Const) and src.size == 2) or dt == F64
    if dst is None: dst = self.v(2 if wide else 1)
    if not (isinstance(dst, Reg) and dst.size == 2): self.e("v_mov_b32", dst, self.op32(src))
    else: self.e("v_mov_b32", dst[0], self.lo(src)); self.e("v_mov_b32", dst[1], self.hi(src, signed(dt)))
    return dst

  def narrow(self, x, dt: DType):
    """The register form of a sub-32-bit value: sign/zero-extended from its width (16-bit floats: their bits)."""
    if dt.itemsize >= 4 or dt.is_bool: return x
    if signed(dt): return self.o("v_bfe_i32", x, Imm(0), Imm(8 * dt.itemsize))
    return self.o("v_and_b32", Imm((1 << (8 * dt.itemsize)) - 1), x)

  # ---------------------------------------------------------------- threads, loops, accumulators
  def special(self, u: UOp):
    name = u.arg[0]
    if name in GROUP_IDS: x = self.group_sgpr[name]       # uniform: the system SGPR is the value (never written)
    elif name in LOCAL_IDS:
      axis = LOCAL_IDS.index(name)
      if axis == 0: x = self.o("v_and_b32", Imm((1 << WORKITEM_ID_BITS) - 1), LOCAL_ID)
      else: x = self.o("v_bfe_u32", LOCAL_ID, Imm(WORKITEM_ID_BITS * axis), Imm(WORKITEM_ID_BITS))
    if name != "gidx": return x if u.dtype.itemsize < 8 or is_narrow(u) else self.mov64(x, Imm(0))
    lid = self.o("v_and_b32", Imm(0x3FF), LOCAL_ID)           # work-item id x: bits 0-9 of v0
    g = self.o("v_lshl_add_u32", WORKGROUP_ID_X, Imm(int(math.log2(LOCAL_SIZE))), lid)
    g = g if is_narrow(u) or u.dtype.itemsize < 8 else self.mov64(g, Imm(0))
    if self.tail_gate is not None and self.tail_gate.src[0] is u:
      # lanes past the end would only compute values that no store keeps; they also must not load out of
      # bounds: switch them off for the whole kernel (and end a wave that has none left)
      self.e("v_cmp_gt_i32", VCC_LO, imm32(self.tail_gate.src[1].arg), self.op32(g))
      self.e("s_and_b32", EXEC_LO, EXEC_LO, VCC_LO)
      self.e("s_cbranch_execz", self.exit)
    return g

  def open_range(self, u: UOp):
    if not fits32(u): raise NotImplementedError(f"AMD renderer: loop bound {u.src[0].vmax} does not fit in 32 bits")
    if u.src[0].op is Ops.CONST: bound = imm32(u.src[0].arg)
    else:
      b = self.op32(u.src[0])
      if isinstance(b, Imm) or (isinstance(b, (Reg, Sub)) and b.file == "s"): bound = b
      else:   # uniform (a function of variables only) but computed in VGPRs: read it from the first lane
        bound = self.s(); self.e("v_readfirstlane_b32", bound, b)
    counter, top, end = self.s(), self.label("loop"), self.label("endloop")
    self.e("s_mov_b32", counter, Imm(0))
    if not (isinstance(bound, Imm) and bound.value > 0):
      self.e("s_cmp_ge_i32", counter, bound)
      self.e("s_cbranch_scc1", end)
    sums, parts = self.invariant_sums(u)
    self.code.append(top)
    self.loops[u] = (counter, bound, top, end)
    self.scopes.append({("sums",): sums, ("parts",): parts})
    self.sums.update(sums)
    self.sum_parts |= parts
    return counter

  def invariant_sums(self, r: UOp) -> tuple[dict, set]:
    """Loop-invariant code motion for 32-bit index sums (wrapping adds: any order gives the same bits). A sum in
    the loop body of terms of which two or more are known before the loop (values rendered outside it, constants)
    adds those once, here before the loop, and each iteration only adds the rest: (((r*8 + a) + b) + c) becomes
    r*8 + (a + b + c). Returns {root: (the other terms, the invariant sum)} and the inner ADDs no longer rendered."""
    body, depth = [], 0
    for u in self.program[self.pc + 1:]:
      if u.op is Ops.RANGE: depth += 1
      elif u.op is Ops.ENDRANGE:
        if depth == 0: break
        depth -= 1
      body.append(u)
    inside, users = set(body), self.plan.users
    def chain(n):
      return n.op is Ops.ADD and n.dtype in (dtypes.int32, dtypes.uint32) and n not in self.vals and n not in self.plan.inplace
    sums, parts = {}, set()
    for n in reversed(body):
      if not chain(n) or n in parts or n in self.sums or n in sums or n in self.plan.offsets: continue
      terms, inner, stack = [], [], list(n.src)
      while stack:
        t = stack.pop()
        if chain(t) and t in inside and len(users.get(t, ())) == 1 and t not in self.plan.offsets:   # only this sum uses it
          inner.append(t); stack.extend(t.src)
        else: terms.append(t)
      # (an accumulator changes in the loop: never a known term)
      known = [t for t in terms if t in self.vals and not isinstance(self.vals[t], Const) and t.op is not Ops.DEFINE_ACC]
      consts = [t for t in terms if t.op is Ops.CONST]
      rest = [t for t in terms if t not in known and t not in consts]
      if len(known) + bool(consts) < 2 or not rest: continue
      total = self.op32(known[0]) if known else imm32(0)
      for t in known[1:]: total = self.o("v_add_nc_u32", total, self.op32(t))
      c = sum(int(t.arg) for t in consts)
      if c: total = self.o("v_add_nc_u32", imm32(c), total)
      if isinstance(total, Imm) or (isinstance(total, (Reg, Sub)) and total.file == "s"): total = self.vgpr(total)
      sums[n] = (rest, total)
      parts.update(inner)
    return sums, parts

  def reassociated(self, u: UOp):
    rest, total = self.sums[u]
    for t in rest: total = self.o("v_add_nc_u32", self.op32(t), total)
    return total

  def close_range(self, u: UOp):
    self.pop_scope()
    r = u.src[0]
    counter, bound, top, end = self.loops.pop(r)
    self.e("s_add_i32", counter, counter, Imm(1))
    self.e("s_cmp_lt_i32", counter, bound)
    self.e("s_cbranch_scc1", top)
    self.code.append(end)
    del self.vals[r]

  def define_acc(self, u: UOp):
    if u in self.plan.acc_slot:     # one dword of its WMMA group's 8 consecutive accumulator VGPRs
      key, e = self.plan.acc_slot[u]
      if key not in self.wmma_d: self.wmma_d[key] = self.v(8)
      acc = self.wmma_d[key][e]
    else: acc = self.v(2 if u.dtype.itemsize == 8 else 1)
    return self.copy_into(acc, self.const(identity_for(u.arg[0], u.dtype), u.dtype), u.dtype)

  def acc_update(self, u: UOp):
    """acc = the accumulate step computed before (the lowering gives every reduction its step as ops), unless the
    step was computed into the accumulator (inplace_step)."""
    if u.arg is not None: raise NotImplementedError(f"AMD renderer: ACC_UPDATE {u.arg} was not lowered to a step")
    acc, new = self.vals[u.src[0]], self.val(u.src[1])
    if new != acc: self.copy_into(acc, new, u.dtype)

  def inplace_step(self, u: UOp):
    """An accumulate step whose only use is its ACC_UPDATE, computed into the accumulator: acc += a * b as one
    v_fmac_f32 / v_fma_f64 (rounded once), a WMMA group's sum by the WMMA itself (C = D = the accumulators), any other
    step by its own instruction with the accumulator as destination (retarget), else a copy."""
    acc_u = self.plan.inplace[u]
    acc = self.vals[acc_u]
    if self.plan.acc_done(acc_u): return acc
    other = u.src[1] if u.src[0] is acc_u else u.src[0]
    if other in self.plan.fused:
      a, b = other.src
      if u.dtype == F64: self.e("v_fma_f64", acc, self.pair(a), self.pair(b), acc)
      else:
        x, y = self.op32(a), self.op32(b)
        if not _is_vgpr(y) and _is_vgpr(x): x, y = y, x    # VOP2 v_fmac_f32 reads src1 from a VGPR (else VOP3)
        self.e("v_fmac_f32", acc, x, y)
      return acc
    start = len(self.code)
    x = RULES[u.op](self, u)
    if x != acc and not self.retarget(x, acc, start): self.copy_into(acc, x, u.dtype)
    return acc

  def retarget(self, x, acc, since: int) -> bool:
    """Make the one instruction that wrote x (made since code position `since`, nothing else mentions it) write acc
    instead."""
    start = self.born.get(x) if isinstance(x, Reg) else None
    if start is None or start < since or x.size != acc.size: return False
    hits = [k for k in range(start, len(self.code)) if isinstance(self.code[k], Inst)
            and any(base_reg(a) is x for a in self.code[k].operands)]
    if len(hits) != 1: return False
    inst = self.code[hits[0]]
    if inst.operands[0] is not x or not inst.name.startswith("v_") or inst.name.startswith(NO_RETARGET): return False
    self.code[hits[0]] = Inst(inst.name, (acc,) + inst.operands[1:], inst.mods)
    return True

  # ---------------------------------------------------------------- tensor cores (compiler/tc.py)
  def wmma(self, u: UOp):
    """Element u.arg[1] of D of u's group: v_wmma_f32_16x16x16_{f16,bf16} D, A, B, C (RDNA3 ISA guide, 7.9 "Wave
    Matrix Multiply Accumulate"), emitted once per group (config, sources) at its first output."""
    key = (u.arg[0], u.src)
    return self.cached(("wmma", key), lambda: self.emit_wmma(key))[u.arg[1]]

  def emit_wmma(self, key) -> Reg:
    from .tc import BY_NAME
    tc = BY_NAME[key[0]]
    srcs = key[1]
    a = self.cached(("operand", srcs[:tc.n_a]), lambda: self.operand(srcs[:tc.n_a]))
    b = self.cached(("operand", srcs[tc.n_a:tc.n_a + tc.n_b]), lambda: self.operand(srcs[tc.n_a:tc.n_a + tc.n_b]))
    if key in self.plan.wmma_accs: d = c = self.wmma_d[key]       # in place: D = A @ B + the accumulators
    else:
      d, cv = self.v(tc.n_c), [self.val(x) for x in srcs[tc.n_a + tc.n_b:]]
      if all(isinstance(x, Const) and x.bits == 0 for x in cv): c = Imm(0)
      else:
        c = self.v(tc.n_c)
        for k, x in enumerate(cv): self.e("v_mov_b32", c[k], self.op32(x))
    self.e("v_wmma_f32_16x16x16_" + ("bf16" if tc.dtype_in == BF16 else "f16"), d, a, b, c)
    return d

  def operand(self, srcs: tuple) -> Reg:
    """A or B: 16 16-bit values in 8 consecutive VGPRs, element e in VGPR e // 2 (low half for even e): planned runs
    of neighbouring loads straight from memory (global_load_b32 / b128, plan.py), other pairs (hi << 16) | lo."""
    r = self.v(len(srcs) // 2)
    e = 0
    while e < len(srcs):
      run = self.plan.operand_loads.get(srcs[e])
      if run is not None and run[0] is srcs[e] and e % len(run) == 0 and tuple(srcs[e:e + len(run)]) == run:
        idx, n = srcs[e].src[0], len(run) // 2
        a = self.global_address(idx.src[0], idx.src[1])
        dst = r[e // 2] if n == 1 else r[e // 2:e // 2 + n]
        self.code.append(Inst(f"global_load_b{32 * n}", (dst, a.vaddr, a.saddr), a.mods()))
        e += len(run)
        continue
      lo, hi = self.op32(srcs[e]), self.op32(srcs[e + 1])
      if isinstance(lo, Imm) and isinstance(hi, Imm):
        self.e("v_mov_b32", r[e // 2], imm32((hi.value & 0xFFFF) << 16 | lo.value & 0xFFFF))
      else: self.e("v_lshl_or_b32", r[e // 2], hi, Imm(16), lo)    # lo is zero-extended (16-bit float bits)
      e += 2
    return r

  # ---------------------------------------------------------------- memory
  def address(self, idx: UOp):
    """An INDEX: a GlobalAddress, or on workgroup memory an LDSAddress."""
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_address(idx.src[0], idx.src[1])
    return self.global_address(idx.src[0], idx.src[1])

  @staticmethod
  def offset32(x: UOp, size: int, extra: int = 0) -> bool:
    """x * size (+ extra bytes) is a 32-bit unsigned byte offset for every value of x."""
    lo, hi = x.vrange
    return isinstance(lo, int) and isinstance(hi, int) and lo >= 0 and (hi + 1) * size + extra <= (1 << 32)

  @staticmethod
  def window(cb: int) -> int:
    """The 8 KiB window k (the base moved by k * CHUNK bytes) that brings byte offset cb into the immediate's range."""
    return (cb + GLOBAL_OFFSET) // CHUNK

  def global_split(self, buf: UOp, i: UOp) -> tuple | None:
    """(x, c) with index i = x + c (x None: 0) where x * size is a 32-bit unsigned offset (also once moved by the
    window of c), as planned or else (i, 0); None when neither is (a 64-bit address)."""
    size = buf.dtype.itemsize
    x, c = split(i, self.plan.offsets)
    if x.op is Ops.CONST: x, c = None, c + int(x.arg)
    def ok(x, c): return x is None or self.offset32(x, size, max(0, self.window(c * size) * CHUNK))
    if ok(x, c): return x, c
    if c and i.op is not Ops.CONST and ok(i, 0): return i, 0
    return None

  def chunk_bases(self):
    """SGPR pairs base + k * CHUNK for the windows k != 0 the kernel's global accesses need, most used first (set once,
    before any loop: no per-iteration cost)."""
    want: dict = {}
    for u in self.program:
      if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and (xc := self.global_split(u.src[0], u.src[1])):
        if (k := self.window(xc[1] * u.src[0].dtype.itemsize)): want[(u.src[0], k)] = want.get((u.src[0], k), 0) + 1
    # (SGPRs left for them: the pointers and variables hold two each, and loops, gates and sums need some more)
    room = (MAX_SGPRS - self.reserved_sgprs - 2 * (self.n_params + len(self.variables)) - SGPR_SLACK) // 2
    for (buf, k), _ in sorted(want.items(), key=lambda kv: -kv[1])[:max(0, min(MAX_CHUNK_BASES, room))]:
      base, r = self.vals[buf], self.s(2)
      self.e("s_add_u32", r[0], base[0], imm32(k * CHUNK))
      self.e("s_addc_u32", r[1], base[1], imm32((k * CHUNK) >> 32))
      self.chunks[(buf, k)] = r

  def global_address(self, buf: UOp, i: UOp) -> GlobalAddress:
    """base + i * size. When x * size (i = x + c) is a 32-bit unsigned offset: the SGPR base, x << log2(size) in a
    VGPR (one per x and size in a scope) and c * size in the immediate offset, the base moved by whole 8 KiB windows
    (chunk_bases) where it is beyond the immediate's range. Else a 64-bit VGPR address: one v_mad_i64_i32 of a 32-bit
    index, or the 64-bit shift and add of a wide one."""
    size = buf.dtype.itemsize
    shift = int(math.log2(size))
    base = self.val(buf)
    if (xc := self.global_split(buf, i)) is not None:
      x, c = xc
      if x is None: voff = self.cached(("zero",), lambda: self.vgpr(Imm(0)))
      else:
        xv = self.op32(x)
        voff = self.cached(("global", x, shift), lambda: self.o("v_lshlrev_b32", Imm(shift), xv) if shift else self.vgpr(xv))
      k = self.window(c * size)
      saddr = self.chunks.get((buf, k), base) if k else base
      if k and saddr is base:
        voff = self.cached(("window", x, shift, k), lambda: self.o("v_add_nc_u32", imm32(k * CHUNK), voff))
      return GlobalAddress(voff, saddr, c * size - k * CHUNK)
    iv = self.val(i)
    if not (isinstance(iv, Reg) and iv.size == 2) and not (isinstance(iv, Const) and iv.size == 2):
      mad = "v_mad_i64_i32" if signed(i.dtype) or i.dtype.itemsize == 8 else "v_mad_u64_u32"
      d = self.v(2)
      self.e(mad, d, NULL, self.vgpr(self.op32(iv)), Imm(size), base)
      return GlobalAddress(d, OFF)
    off = self.rpair(i)
    if shift: off = self.o("v_lshlrev_b64", Imm(shift), off, size=2)
    return GlobalAddress(self.add64(base[0], base[1], off[0], off[1]), OFF)

  def gate_begin(self, idx: UOp):
    if len(idx.src) < 3: return None
    g = self.val(idx.src[2])
    if isinstance(g, Const):
      if g.bits: return None
      saved = self.s(); self.e("s_mov_b32", saved, EXEC_LO); self.e("s_mov_b32", EXEC_LO, Imm(0))
      return saved
    def mask():      # the lanes whose gate is true, once per gate in a scope (gates of neighbouring accesses repeat)
      m = self.s()
      self.e("v_cmp_ne_u32", m, Imm(0), self.op32(g))
      return m
    m = self.cached(("gate", idx.src[2]), mask)
    saved = self.s()
    self.e("s_and_saveexec_b32", saved, m)
    return saved

  def gate_end(self, saved):
    if saved is not None: self.e("s_mov_b32", EXEC_LO, saved)

  def lds_address(self, buf: UOp, i: UOp) -> LDSAddress:
    """The LDS byte address of a valid lane: x * itemsize in a VGPR (one per x and size in a scope), the buffer's
    offset and the constant term c of the index x + c in the DS instruction's 16-bit offset field (RDNA3 ISA guide,
    "Data Share Operations": address = VGPR + offset). Lanes whose gate is false never use it, so the low dword of
    the index suffices."""
    size, offset = buf.dtype.itemsize, self.lds_offsets[buf]
    def nonneg(x): return isinstance(lo := x.vrange[0], int) and lo >= 0
    x, c = split(i, self.plan.offsets)
    if c and not (nonneg(x) and offset + (c + 1) * size <= LDS_BYTES): x, c = i, 0
    if not c and x.op is Ops.ADD and x.src[1].op is Ops.CONST and nonneg(x.src[0]) and 0 <= (k := int(x.src[1].arg)) \
        and offset + (k + 1) * size <= LDS_BYTES:
      x, c = x.src[0], k          # (an index computed anyway: its constant term still goes into the offset field)
    if x.op is Ops.CONST and 0 <= offset + (int(x.arg) + c) * size < LDS_BYTES:
      return LDSAddress(self.cached(("zero",), lambda: self.vgpr(Imm(0))), offset + (int(x.arg) + c) * size)
    shift = int(math.log2(size))
    xv = self.op32(x)
    addr = self.cached(("lds", x, shift), lambda: self.o("v_lshlrev_b32", Imm(shift), xv) if shift else self.vgpr(xv))
    return LDSAddress(addr, offset + c * size)

  def lds_load(self, u: UOp) -> Reg:
    idx, dt = u.src[0], u.dtype
    size = idx.src[0].dtype.itemsize
    if (group := self.plan.lds_vectors.get(u)):    # neighbours: one ds_load_b64 / ds_load_b128 (plan.py)
      a = self.lds_address(group[0].src[0].src[0], group[0].src[0].src[1])
      d = self.v(len(group))
      self.code.append(Inst(f"ds_load_b{32 * len(group)}", (d, a.addr), {"offset": a.offset} if a.offset else {}))
      for k, ld in enumerate(group): self.vals[ld] = d[k]
      return d[group.index(u)]
    kind = DS_LOAD[size]
    if dt.is_int and size < 4 and signed(dt): kind = f"i{8 * size}"    # the register form of int8/int16 is sign-extended
    d = self.v(2 if size == 8 else 1)
    if len(idx.src) == 3:   # lanes whose gate is false keep 0
      for k in range(d.size): self.e("v_mov_b32", d[k] if d.size > 1 else d, Imm(0))
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"ds_load_{kind}", (d, a.addr), {"offset": a.offset} if a.offset else {}))
    self.gate_end(saved)
    return d

  def lds_store(self, u: UOp):
    idx, v = u.src[0], u.src[1]
    size = idx.src[0].dtype.itemsize
    data = self.rpair(v, signed(v.dtype)) if size == 8 else self.vgpr(self.val(v))
    if isinstance(data, Reg) and data.file == "s": data = self.copy_into(None, data, v.dtype)
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"ds_store_{MEM_STORE[size]}", (a.addr, data), {"offset": a.offset} if a.offset else {}))
    self.gate_end(saved)

  def barrier(self, u: UOp):
    """Every LDS operation of this wave done, its stores and its loads (lgkmcnt(0): AMDGPUUsage "Memory Model
    GFX10-GFX11", workgroup release), then s_barrier: the wave waits until every wave of its workgroup got here
    (RDNA3 ISA guide, S_BARRIER: waves that already ended are not waited for). Its sources are the local STOREs it
    publishes and, for a barrier in a loop (compiler/gpu.py STAGE), the RANGE whose previous step's reads it ends."""
    if any(s.op is Ops.STORE and s.src[0].src[0].op is not Ops.DEFINE_LOCAL for s in u.src):
      # global memory would also need s_waitcnt_vscnt and a gl0 invalidate (the WGP's two CUs have their own L0)
      raise NotImplementedError(f"AMD renderer: kernel {self.name!r} has a BARRIER ordering a STORE to global memory; "
                                "a BARRIER orders STOREs to workgroup memory (DEFINE_LOCAL)")
    self.e("s_waitcnt", waitcnt(lgkmcnt=0))
    self.e("s_barrier")

  def load(self, u: UOp):
    idx, dt = u.src[0], u.dtype
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_load(u)
    size = idx.src[0].dtype.itemsize
    kind = MEM_LOAD[size]
    if dt.is_int and dt.itemsize < 4: kind = ("i" if signed(dt) else "u") + str(8 * dt.itemsize)
    d = self.v(2 if size == 8 else 1)
    if len(idx.src) == 3:   # lanes whose gate is false keep 0
      for k in range(d.size): self.e("v_mov_b32", d[k] if d.size > 1 else d, Imm(0))
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"global_load_{kind}", (d, a.vaddr, a.saddr), a.mods()))
    self.gate_end(saved)
    return d

  def store(self, u: UOp):
    idx, v = u.src[0], u.src[1]
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_store(u)
    size = idx.src[0].dtype.itemsize
    data = self.rpair(v, signed(v.dtype)) if size == 8 else self.vgpr(self.val(v))
    if isinstance(data, Reg) and data.file == "s": data = self.copy_into(None, data, v.dtype)
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"global_store_{MEM_STORE[size]}", (a.vaddr, data, a.saddr), a.mods()))
    self.gate_end(saved)

  # ---------------------------------------------------------------- ALU: the tables BINARY / UNARY
  def alu(self, u: UOp):
    if len(u.src) == 2: return self.binary(u.op, u.src[0], u.src[1], u.src[0].dtype, out=u)
    return self.unary(u.op, u.src[0], u.dtype)

  def binary(self, op: Ops, ua: UOp, ub: UOp, dt: DType, out: UOp):
    """`dt` is the operand dtype; CMPLT/CMPNE give a bool (0/1)."""
    k = value_class(dt)
    if k in ("i64", "u64"):   # the low dwords give the same value (lower() keeps the low dword of a narrow result)
      modular = op in (Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR) or \
        (op is Ops.SHL and isinstance(ub.vrange[0], int) and 0 <= ub.vrange[0] and ub.vrange[1] < 32)
      narrow_out = op not in (Ops.CMPLT, Ops.CMPNE) and is_narrow(out)
      if (narrow_out and modular) or (is_narrow(ua) and is_narrow(ub) and (narrow_out or op in (Ops.CMPLT, Ops.CMPNE))):
        k = "i32"
    rule = BINARY[k].get(op)
    if rule is None: raise NotImplementedError(f"AMD renderer: no rule for {op.name} on {dt.name} (compiler/lower.py lowers it?)")
    if not rule.startswith("v_"): return getattr(self, rule)(op, ua, ub, k)
    swap, wide = "rev_" in rule, k in ("f64", "i64", "u64")
    if k in ("i64", "u64"): a, b = self.pair(ua, k == "i64"), (self.lo(ub) if swap else self.pair(ub, k == "i64"))
    elif wide: a, b = self.pair(ua), self.pair(ub)
    else: a, b = self.op32(ua), self.op32(ub)
    if rule.startswith("v_cmp"): return self.compare(rule, a, b)
    return self.o(rule, *((b, a) if swap else (a, b)), size=2 if wide else 1)

  def unary(self, op: Ops, ua: UOp, dt: DType):
    k = value_class(dt)
    rule = UNARY["int" if k[0] in "iu" else k].get(op)
    if rule is None: raise NotImplementedError(f"AMD renderer: no rule for {op.name} on {dt.name} (compiler/lower.py lowers it?)")
    a = self.rpair(ua) if k == "f64" else ua if k[0] in "iu" else self.op32(ua)
    if rule.startswith("v_"): return self.o(rule, a, size=2 if k == "f64" else 1)
    return getattr(self, rule)(a)

  # the emitters the tables name
  def sign_flip(self, a):
    if isinstance(a, Reg) and a.size == 2: return self.mov64(a[0], self.o("v_xor_b32", imm32(0x80000000), a[1]))
    return self.o("v_xor_b32", imm32(0x80000000), a)

  def recip(self, a): return self.fdiv64(None, a) if isinstance(a, Reg) and a.size == 2 else self.fdiv32(None, a)

  def int_neg(self, ua: UOp):
    if is_wide(ua.dtype, ua): return self.sub64(Imm(0), Imm(0), self.lo(ua), self.hi(ua))
    return self.o("v_sub_nc_u32", Imm(0), self.op32(ua))

  def fdiv(self, op, ua, ub, k):
    if k == "f64": return self.fdiv64(self.rpair(ua), self.rpair(ub))
    return self.fdiv32(self.op32(ua), self.op32(ub))

  def wide(self, op, ua, ub, k):
    """64-bit ADD/MUL/AND/OR/XOR from the dwords (a narrow operand extended by the signedness of k)."""
    sg = k == "i64"
    a, b = (self.lo(ua), self.hi(ua, sg)), (self.lo(ub), self.hi(ub, sg))
    if op is Ops.ADD: return self.add64(*a, *b)
    if op is Ops.MUL: return self.mul64(*a, *b)
    name = {Ops.XOR: "v_xor_b32", Ops.OR: "v_or_b32", Ops.AND: "v_and_b32"}[op]
    return self.mov64(self.o(name, a[0], b[0]), self.o(name, a[1], b[1]))

  def wide_max(self, op, ua, ub, k):
    a, b = self.rpair(ua, k == "i64"), self.rpair(ub, k == "i64")
    self.e(f"v_cmp_gt_{k}", VCC_LO, a, b)
    return self.sel64(b, a)

  def add64(self, alo, ahi, blo, bhi) -> Reg:
    d = self.v(2)
    self.e("v_add_co_u32", d[0], VCC_LO, alo, blo)
    self.e("v_add_co_ci_u32", d[1], VCC_LO, ahi, bhi, VCC_LO)
    return d

  def sub64(self, alo, ahi, blo, bhi) -> Reg:
    d = self.v(2)
    self.e("v_sub_co_u32", d[0], VCC_LO, alo, blo)
    self.e("v_sub_co_ci_u32", d[1], VCC_LO, ahi, bhi, VCC_LO)
    return d

  def abs64(self, x) -> tuple[Reg, Reg]:
    """(|x|, the sign of x as 0 or -1 in one dword) of a signed 64-bit pair: (x + s) ^ s."""
    s = self.o("v_ashrrev_i32", Imm(31), x[1])
    t = self.add64(x[0], x[1], s, s)
    return self.mov64(self.o("v_xor_b32", t[0], s), self.o("v_xor_b32", t[1], s)), s

  def mul64(self, alo, ahi, blo, bhi) -> Reg:
    """Low 64 bits of the product: alo*blo (full) + (alo*bhi + ahi*blo) << 32."""
    lo = self.o("v_mul_lo_u32", alo, blo)
    hi = self.o("v_mul_hi_u32", alo, blo)
    c1 = self.o("v_mul_lo_u32", alo, bhi)
    c2 = self.o("v_mul_lo_u32", ahi, blo)
    return self.mov64(lo, self.o("v_add3_u32", hi, c1, c2))

  def where(self, u: UOp):
    c, a, b = u.src
    self.e("v_cmp_ne_u32", VCC_LO, Imm(0), self.op32(c))
    if is_wide(u.dtype, u):   # (the v_ashrrev of a narrow operand's high dword keeps vcc)
      sg = signed(u.dtype)
      return self.sel64((self.lo(b), self.hi(b, sg)), (self.lo(a), self.hi(a, sg)))
    return self.sel(self.op32(b), self.op32(a))

  # ---------------------------------------------------------------- float division, sqrt
  def fdiv32(self, a, b) -> Reg:
    """a / b (a None: 1 / b), correctly rounded for finite nonzero quotients in range: r = rcp(b),
    q0 = a*r, e = fma(-b, q0, a), q = fma(e, r, q0); where q0 is 0, inf or NaN it is already the answer."""
    # a subnormal divisor (1/b would overflow) is scaled by 2^64, and so is the quotient; one above 2^126 (1/b is
    # subnormal, which v_rcp_f32 flushes to 0: RDNA3 ISA guide, "VOP1") by 2^-64, and so is the quotient
    b = self.vgpr(b) if isinstance(b, Imm) else b
    self.e("v_cmp_class_f32", VCC_LO, b, Imm(0x090))            # +-subnormal
    tiny = self.cmp_to_bool()
    b = self.sel(b, self.o("v_mul_f32", Imm(0x5F800000), b))       # * 2^64
    self.e("v_cmp_lt_f32", VCC_LO, Imm(0x7E800000), Abs(b))       # 2^126 < |b|
    huge = self.cmp_to_bool()
    b = self.sel(b, self.o("v_mul_f32", Imm(0x1F800000), b))       # * 2^-64
    q = self._fdiv32(a, b)
    self.e("v_cmp_ne_u32", VCC_LO, Imm(0), tiny)
    q = self.sel(q, self.o("v_mul_f32", Imm(0x5F800000), q))
    self.e("v_cmp_ne_u32", VCC_LO, Imm(0), huge)
    return self.sel(q, self.o("v_mul_f32", Imm(0x1F800000), q))

  def _fdiv32(self, a, b) -> Reg:
    r = self.trans("v_rcp_f32", b)
    if a is None:
      e = self.o("v_fma_f32", Neg(b), r, Imm(0x3F800000))
      q = self.o("v_fma_f32", e, r, r)
      q0 = r
    else:
      e1 = self.o("v_fma_f32", Neg(b), r, Imm(0x3F800000))
      r1 = self.o("v_fma_f32", e1, r, r)
      self.e("v_cmp_class_f32", VCC_LO, r, Imm(CLASS_FINITE_NONZERO))   # 1/0, 1/inf: keep the estimate
      r = self.sel(r, r1)
      q0 = self.o("v_mul_f32", a, r)
      e = self.o("v_fma_f32", Neg(b), q0, a)
      q = self.o("v_fma_f32", e, r, q0)
    self.e("v_cmp_class_f32", VCC_LO, q0, Imm(CLASS_FINITE_NONZERO))
    return self.sel(q0, q)

  def fdiv64(self, a, b) -> Reg:
    """As fdiv32 with two Newton steps on the reciprocal (a None: 1 / b)."""
    one = self.mov64(Imm(0), Imm(0x3FF00000))
    r0 = r = self.trans("v_rcp_f64", b, size=2)
    for _ in range(2):
      e = self.o("v_fma_f64", Neg(b), r, one, size=2)
      r = self.o("v_fma_f64", e, r, r, size=2)
    self.e("v_cmp_class_f64", VCC_LO, r0, Imm(CLASS_FINITE_NONZERO))   # 1/0, 1/inf: keep the estimate
    r = self.sel64(r0, r)
    if a is None:
      e = self.o("v_fma_f64", Neg(b), r, one, size=2)
      q = self.o("v_fma_f64", e, r, r, size=2)
      q0 = r
    else:
      q0 = self.o("v_mul_f64", a, r, size=2)
      e = self.o("v_fma_f64", Neg(b), q0, a, size=2)
      q = self.o("v_fma_f64", e, r, q0, size=2)
    self.e("v_cmp_class_f64", VCC_LO, q0, Imm(CLASS_FINITE_NONZERO))
    return self.sel64(q0, q)

  def fsqrt32(self, x) -> Reg:
    """Correctly rounded sqrt: s = v_sqrt_f32(x) then one-ulp corrections from fma residuals (x - s_dn*s <= 0
    picks s_dn, x - s_up*s > 0 picks s_up); tiny inputs are scaled by 2^32 (result by 2^-16) first."""
    x = self.vgpr(x) if isinstance(x, Imm) else x
    self.e("v_cmp_gt_f32", VCC_LO, Imm(0x0F800000), x)          # x < 2^-96
    xs = self.sel(x, self.o("v_mul_f32", Imm(0x4F800000), x))     # * 2^32
    small = self.o("v_cndmask_b32", Imm(0), Imm(1), VCC_LO)
    s = self.trans("v_sqrt_f32", xs)
    s_dn = self.o("v_add_nc_u32", Imm(-1), s)
    s_up = self.o("v_add_nc_u32", Imm(1), s)
    r_dn = self.o("v_fma_f32", Neg(s_dn), s, xs)
    r_up = self.o("v_fma_f32", Neg(s_up), s, xs)
    self.e("v_cmp_ge_f32", VCC_LO, Imm(0), r_dn)
    t = self.sel(s, s_dn)
    self.e("v_cmp_lt_f32", VCC_LO, Imm(0), r_up)
    t = self.sel(t, s_up)
    self.e("v_cmp_class_f32", VCC_LO, xs, Imm(CLASS_POSITIVE_FINITE_NONZERO))
    t = self.sel(s, t)
    self.e("v_cmp_ne_u32", VCC_LO, Imm(0), small)
    return self.sel(t, self.o("v_mul_f32", Imm(0x37800000), t))   # * 2^-16

  def fsqrt64(self, x) -> Reg:
    """sqrt by v_rsq_f64 refined with Newton-Raphson (Goldschmidt form) and two residual corrections;
    0, inf, NaN and negative inputs take v_sqrt_f64's answer."""
    half = self.mov64(Imm(0), Imm(0x3FE00000))
    y = self.trans("v_rsq_f64", x, size=2)
    g = self.o("v_mul_f64", x, y, size=2)
    h = self.o("v_mul_f64", half, y, size=2)
    r = self.o("v_fma_f64", Neg(g), h, half, size=2)
    g = self.o("v_fma_f64", g, r, g, size=2)
    h = self.o("v_fma_f64", h, r, h, size=2)
    for _ in range(2):
      d = self.o("v_fma_f64", Neg(g), g, x, size=2)
      g = self.o("v_fma_f64", d, h, g, size=2)
    s = self.trans("v_sqrt_f64", x, size=2)
    self.e("v_cmp_class_f64", VCC_LO, x, Imm(CLASS_POSITIVE_FINITE_NONZERO))
    return self.sel64(s, g)

  # ---------------------------------------------------------------- integer division (divisor never 0 nor -1)
  def udivmod32(self, n, d) -> tuple[Reg, Reg]:
    """Unsigned 32-bit n / d and n % d (d != 0): z ~ 2^32/d from v_rcp_iflag_f32 (scaled just below 2^32 so
    it never overshoots), one Newton step z += z*(-d*z)/2^32, then q = mulhi(n, z) is short by at most 2,
    fixed by two conditional corrections."""
    f = self.o("v_cvt_f32_u32", d)
    f = self.trans("v_rcp_iflag_f32", f)
    f = self.o("v_mul_f32", Imm(0x4F7FFFFE), f)
    z = self.o("v_cvt_u32_f32", f)
    nd = self.o("v_sub_nc_u32", Imm(0), d)
    t = self.o("v_mul_lo_u32", nd, z)
    t = self.o("v_mul_hi_u32", z, t)
    z = self.o("v_add_nc_u32", z, t)
    q = self.o("v_mul_hi_u32", n, z)
    r = self.o("v_sub_nc_u32", n, self.o("v_mul_lo_u32", q, d))
    for _ in range(2):
      q1 = self.o("v_add_nc_u32", Imm(1), q)
      r1 = self.o("v_sub_nc_u32", r, d)
      self.e("v_cmp_ge_u32", VCC_LO, r, d)
      q, r = self.sel(q, q1), self.sel(r, r1)
    return q, r

  def divmod32(self, op: Ops, ua: UOp, ub: UOp, k: str):
    """Truncating; signed operands through their magnitudes."""
    a, b, sg = self.op32(ua), self.op32(ub), k == "i32"
    if ub.op is Ops.CONST:
      c = int(ub.arg)
      lo, hi = ua.vrange
      small = isinstance(lo, int) and lo >= 0 and hi < (1 << 31)      # 0 <= a < 2^31
      if 0 < c < (1 << 31) and (small or (not sg and c & (c - 1) == 0)):
        if c & (c - 1) == 0:
          shift = c.bit_length() - 1
          return self.o("v_lshrrev_b32", Imm(shift), a) if op is Ops.IDIV else self.o("v_and_b32", imm32(c - 1), a)
        # n < 2^31, l = ceil(log2 c): m = floor(2^(31+l) / c) + 1 < 2^32 and q = floor(n*m / 2^(31+l))
        l = (c - 1).bit_length()
        m = (1 << (31 + l)) // c + 1
        q = self.o("v_mul_hi_u32", a, imm32(m))
        if l > 1: q = self.o("v_lshrrev_b32", Imm(l - 1), q)
        if op is Ops.IDIV: return q
        return self.o("v_sub_nc_u32", a, self.o("v_mul_lo_u32", q, imm32(c)))
    a = self.vgpr(a) if isinstance(a, Imm) else a
    b = self.vgpr(b) if isinstance(b, Imm) else b
    if not sg:
      q, r = self.udivmod32(a, b)
      return q if op is Ops.IDIV else r
    sa = self.o("v_ashrrev_i32", Imm(31), a)
    sb = self.o("v_ashrrev_i32", Imm(31), b)
    na = self.o("v_xor_b32", self.o("v_add_nc_u32", a, sa), sa)
    nb = self.o("v_xor_b32", self.o("v_add_nc_u32", b, sb), sb)
    q, r = self.udivmod32(na, nb)
    if op is Ops.IDIV:
      s = self.o("v_xor_b32", sa, sb)
      return self.o("v_sub_nc_u32", self.o("v_xor_b32", q, s), s)
    return self.o("v_sub_nc_u32", self.o("v_xor_b32", r, sa), sa)

  def divmod64(self, op: Ops, ua: UOp, ub: UOp, k: str):
    """64-bit: magnitudes, a 64-step restoring division loop (r = 2r + next bit of n; if r >= d: r -= d,
    set the quotient bit), signs put back."""
    sg = k == "i64"
    a, b = self.rpair(ua, sg), self.rpair(ub, sg)
    (n, sa), (d, sb) = (self.abs64(a), self.abs64(b)) if sg else ((a, None), (b, None))
    q, r = self.mov64(Imm(0), Imm(0)), self.mov64(Imm(0), Imm(0))
    i = self.s()
    self.e("s_mov_b32", i, Imm(63))
    top = self.label("div64")
    self.code.append(top)
    self.e("v_lshlrev_b64", r, Imm(1), r)
    bit = self.o("v_lshrrev_b64", i, n, size=2)
    self.e("v_and_or_b32", r[0], bit[0], Imm(1), r[0])
    rs = self.sub64(r[0], r[1], d[0], d[1])
    self.e("v_cmp_ge_u64", VCC_LO, r, d)
    self.e("v_cndmask_b32", r[0], r[0], rs[0], VCC_LO)
    self.e("v_cndmask_b32", r[1], r[1], rs[1], VCC_LO)
    qb = self.cmp_to_bool()
    self.e("v_lshlrev_b64", q, Imm(1), q)
    self.e("v_or_b32", q[0], q[0], qb)
    self.e("s_sub_i32", i, i, Imm(1))
    self.e("s_cmp_ge_i32", i, Imm(0))
    self.e("s_cbranch_scc1", top)
    if not sg: return q if op is Ops.IDIV else r
    s, x = (self.o("v_xor_b32", sa, sb), q) if op is Ops.IDIV else (sa, r)
    t = self.mov64(self.o("v_xor_b32", x[0], s), self.o("v_xor_b32", x[1], s))
    return self.sub64(t[0], t[1], s, s)

  # ---------------------------------------------------------------- casts (bool and 16-bit floats were lowered)
  def cast(self, src_u: UOp, dst: DType, u: UOp):
    src = src_u.dtype
    x = self.val(src_u)
    if src == dst: return x
    if isinstance(x, Const): x = self.copy_into(None, x, src)   # (symbolic folds constant casts: rare)
    wide_src = isinstance(x, Reg) and x.size == 2
    if src == F16 and dst == F32: return self.o("v_cvt_f32_f16", self.op32(x))        # reads the low 16 bits
    if src == F32 and dst == F16:   # the 16 bits zero-extended: the register form of a float16
      return self.o("v_and_b32", Imm(0xFFFF), self.o("v_cvt_f16_f32", self.op32(x)))
    if src.is_float and dst.is_float:
      return self.o("v_cvt_f32_f64", self.pair(x)) if src == F64 else self.o("v_cvt_f64_f32", self.op32(x), size=2)
    if src.is_float:   # -> int: truncate toward zero (to int32, int64 or uint64: the lowering routes the others)
      f = self.pair(x) if src == F64 else self.op32(x)
      if dst.itemsize == 8:
        r = self.f_to_i64(f, src == F64, signed(dst))
        return r[0] if is_narrow(u) else r
      # x86's cvttss2si gives 0x80000000 for NaN and out-of-range values (C leaves them undefined; the CPU
      # device does this); v_cvt_i32 saturates, so those lanes are patched
      i = self.o("v_cvt_i32_f64" if src == F64 else "v_cvt_i32_f32", f)
      lim = self.mov64(Imm(0), Imm(0x41E00000)) if src == F64 else Imm(0x4F000000)     # 2^31
      self.e("v_cmp_gt_f64" if src == F64 else "v_cmp_gt_f32", VCC_LO, lim, Abs(f))
      return self.sel(imm32(0x80000000), i)
    if dst.is_float:   # int -> float: round to nearest even
      if wide_src:
        return self.i64_to_f64(self.pair(x), signed(src)) if dst == F64 else self.i64_to_f32(self.pair(x), signed(src))
      sg = signed(src) or src.itemsize < 4 or src.itemsize == 8   # small/narrow values are sign-correct in 32 bits
      if dst == F64: return self.o("v_cvt_f64_i32" if sg else "v_cvt_f64_u32", self.op32(x), size=2)
      return self.o("v_cvt_f32_i32" if sg else "v_cvt_f32_u32", self.op32(x))
    # int -> int: C value conversion (sign- or zero-extend by the source type, or keep the low bits)
    sg_src = signed(src) or src.itemsize < 4 or (src.itemsize == 8 and not wide_src)
    if dst.itemsize == 8:
      if is_narrow(u): return self.op32(x)
      if wide_src: return x
      return self.mov64(self.op32(x), self.hi(x, sg_src))
    return self.narrow(self.op32(x), dst)

  def f_to_i64(self, f, is_f64: bool, sg: bool) -> Reg:
    """Truncate a float to a 64-bit integer: t = trunc(x) in float64 (exact for float32 inputs),
    hi = floor(t * 2^-32), lo = t - hi * 2^32 (exact), both converted with v_cvt_*_f64."""
    t = self.o("v_trunc_f64", f, size=2) if is_f64 else self.o("v_trunc_f64", self.o("v_cvt_f64_f32", f, size=2), size=2)
    neg = None
    if sg:   # work on |t| and negate at the end (so the high word is floor of a positive value)
      self.e("v_cmp_gt_f64", VCC_LO, Imm(0), t)
      neg = self.cmp_to_bool()
      t = self.mov64(t[0], self.o("v_and_b32", Imm(0x7FFFFFFF), t[1]))
    scale = self.mov64(Imm(0), Imm(0x3DF00000))        # 2^-32
    h = self.o("v_floor_f64", self.o("v_mul_f64", t, scale, size=2), size=2)
    m = self.mov64(Imm(0), imm32(0xC1F00000))           # -2^32
    lo = self.o("v_fma_f64", h, m, t, size=2)
    r = self.mov64(self.o("v_cvt_u32_f64", lo), self.o("v_cvt_u32_f64", h))
    if sg:
      n = self.sub64(Imm(0), Imm(0), r[0], r[1])
      self.e("v_cmp_ne_u32", VCC_LO, Imm(0), neg)
      r = self.sel64(r, n)
      # NaN and |x| >= 2^63: x86's cvttsd2si "integer indefinite" 0x8000000000000000, as the CPU device gives
      self.e("v_cmp_gt_f64", VCC_LO, self.mov64(Imm(0), Imm(0x43E00000)), t)
      r = self.mov64(self.sel(Imm(0), r[0]), self.sel(imm32(0x80000000), r[1]))
    return r

  def i64_to_f64(self, x, sg: bool) -> Reg:
    """hi * 2^32 + lo: both parts exact in float64, one rounding in the add (v_ldexp_f64 scales exactly)."""
    h = self.o("v_cvt_f64_i32" if sg else "v_cvt_f64_u32", x[1], size=2)
    h = self.o("v_ldexp_f64", h, Imm(32), size=2)
    l = self.o("v_cvt_f64_u32", x[0], size=2)
    return self.o("v_add_f64", h, l, size=2)

  def i64_to_f32(self, x, sg: bool) -> Reg:
    """Round-to-nearest-even int64 -> float32: |x| shifted left so its top bit is bit 63, the high dword with
    a sticky bit for any nonzero low dword converted by v_cvt_f32_u32 (one rounding), scaled back by ldexp."""
    if sg: x, s = self.abs64(x)
    z = self.o("v_clz_i32_u32", x[1])                      # 32 when the high dword is 0 (-1 never: gfx11 gives 32)
    z = self.o("v_min_u32", Imm(32), z)
    y = self.o("v_lshlrev_b64", z, x, size=2)
    self.e("v_cmp_ne_u32", VCC_LO, Imm(0), y[0])
    sticky = self.cmp_to_bool()
    top = self.o("v_or_b32", y[1], sticky)
    f = self.o("v_cvt_f32_u32", top)
    f = self.o("v_ldexp_f32", f, self.o("v_sub_nc_u32", Imm(32), z))
    if sg:
      f = self.o("v_xor_b32", f, self.o("v_and_b32", imm32(0x80000000), s))
    return f

  def bitcast(self, src_u: UOp, dst: DType):
    src = src_u.dtype
    if src.itemsize != dst.itemsize:
      raise NotImplementedError(f"AMD renderer: BITCAST {src.name} -> {dst.name} changes the size")
    x = self.val(src_u)
    if src.itemsize == 8:
      if isinstance(x, Const): return Const(x.bits if x.size == 2 else (x.bits | (0xFFFFFFFF << 32 if x.bits >> 31 else 0)), 2, dst.is_float)
      return self.rpair(src_u)
    if isinstance(x, Const): return Const(_narrow_const(x.bits, dst), 1)
    return self.narrow(x, dst)


def _is_vgpr(x) -> bool: return isinstance(x, (Reg, Sub)) and x.file == "v"


def _narrow_const(v: int, dt: DType) -> int:
  bits = 8 * dt.itemsize
  v &= (1 << bits) - 1
  if signed(dt) and v >> (bits - 1): v -= 1 << bits
  return v & 0xFFFFFFFF


def wmma_hazards(code: list) -> list:
  """An independent VALU before a v_wmma whose A or B registers overlap the D of the VALU right before it, a v_wmma
  (a v_nop, as LLVM GCNHazardRecognizer::fixWMMAHazards inserts). Registers allocated. After a label the previous VALU
  is unknown: any v_wmma."""
  d_of = lambda x: {x.operands[0].phys + k for k in range(x.operands[0].size)}
  ab_of = lambda x: {a.phys + k for a in x.operands[1:3] for k in range(a.size)}
  every_d = set().union(*(d_of(x) for x in code if isinstance(x, Inst) and x.name.startswith("v_wmma")))
  out: list = []
  last: set = set()        # the D registers of the previous VALU when it was a v_wmma
  for x in code:
    if isinstance(x, Label): last = every_d
    elif x.name.startswith("v_"):
      if x.name.startswith("v_wmma") and last & ab_of(x): out.append(Inst("v_nop", ()))
      last = d_of(x) if x.name.startswith("v_wmma") else set()
    out.append(x)
  return out


_WAITCNT_LGKM = isa.WAITCNT_FIELDS["lgkmcnt"]


def insert_lds_waits(code: list) -> list:
  """`s_waitcnt lgkmcnt(n)` before the first instruction that touches a register an LDS load has not finished
  writing (registers allocated). LDS operations (loads and stores) decrement LGKM_CNT in issue order, so n counts
  the DS operations issued after that load; a pending scalar load (out of order) makes it 0, as does a label or a
  branch while a load is outstanding (RDNA3 ISA guide 5.6 "Data Dependency Resolution"; at most 63 operations are
  outstanding: the counter's 6 bits). Stores alone need no wait here (a BARRIER waits for them itself): forgetting
  older ones only makes a later count smaller, a stronger wait."""
  out: list = []
  pending: list = []     # outstanding LGKM operations in issue order: (registers written, in order)
  for x in code:
    if pending:
      need = None
      if isinstance(x, Label) or x.target is not None or x.name == "s_endpgm":
        if any(w for w, _ in pending): need = 0
        else: pending = []
      else:
        regs = _phys(x)
        hit = max((k for k, (w, _) in enumerate(pending) if w & regs), default=None)
        if hit is not None: need = len(pending) - 1 - hit if all(o for _, o in pending) else 0
      if need is not None:
        out.append(Inst("s_waitcnt", (waitcnt(lgkmcnt=need),)))
        pending = pending[len(pending) - need:] if need else []
    if isinstance(x, Inst):
      if x.name == "s_waitcnt":
        lo, width = _WAITCNT_LGKM
        n = (x.operands[0].value >> lo) & ((1 << width) - 1)
        if n == 0: pending = []
        elif n < len(pending) and all(o for _, o in pending): pending = pending[len(pending) - n:]
      elif x.name.startswith("ds_"):
        pending.append((_phys(Inst(x.name, x.operands[:1])) if x.name.startswith("ds_load") else set(), True))
      elif x.name.startswith(("s_load_", "s_buffer_load_")):
        pending.append((_phys(Inst(x.name, x.operands[:1])), False))
      pending = pending[-63:]       # a 64th operation waits until the oldest is done
    out.append(x)
  return out


# UOp op -> emitter (a value, or None for ops that define none)
_NOTHING = lambda r, u: None  # noqa: E731
RULES = {
  Ops.PARAM: _NOTHING, Ops.DEFINE_VAR: _NOTHING, Ops.SINK: _NOTHING, Ops.REDUCE: _NOTHING,
  Ops.DEFINE_LOCAL: _NOTHING, Ops.BARRIER: _Renderer.barrier,
  Ops.CONST: lambda r, u: r.const(u.arg, u.dtype, u), Ops.SPECIAL: _Renderer.special,
  Ops.RANGE: _Renderer.open_range, Ops.ENDRANGE: _Renderer.close_range,
  Ops.DEFINE_ACC: _Renderer.define_acc, Ops.ACC_UPDATE: _Renderer.acc_update, Ops.WMMA: _Renderer.wmma,
  Ops.INDEX: _Renderer.address, Ops.LOAD: _Renderer.load, Ops.STORE: _Renderer.store,
  Ops.CAST: lambda r, u: r.cast(u.src[0], u.dtype, u), Ops.BITCAST: lambda r, u: r.bitcast(u.src[0], u.dtype),
  Ops.WHERE: _Renderer.where,
  **{op: _Renderer.alu for op in (Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.MOD, Ops.IDIV, Ops.CMPLT, Ops.CMPNE, Ops.XOR,
                                   Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.TRUNC, Ops.FLOOR)},
}

# binary ALU ops per value class: "v_*" is one instruction d = op(a, b) (a "*rev*" shift takes the amount first;
# "v_cmp_*" sets vcc and gives 0/1), any other name an emitter method of _Renderer
_INT32 = {Ops.ADD: "v_add_nc_u32", Ops.MUL: "v_mul_lo_u32", Ops.MAX: "v_max_i32", Ops.XOR: "v_xor_b32",
          Ops.OR: "v_or_b32", Ops.AND: "v_and_b32", Ops.SHL: "v_lshlrev_b32", Ops.SHR: "v_ashrrev_i32",
          Ops.CMPLT: "v_cmp_lt_i32", Ops.CMPNE: "v_cmp_ne_u32", Ops.IDIV: "divmod32", Ops.MOD: "divmod32"}
_INT64 = {Ops.ADD: "wide", Ops.MUL: "wide", Ops.MAX: "wide_max", Ops.XOR: "wide", Ops.OR: "wide", Ops.AND: "wide",
          Ops.SHL: "v_lshlrev_b64", Ops.SHR: "v_ashrrev_i64", Ops.CMPLT: "v_cmp_lt_i64",
          Ops.CMPNE: "v_cmp_ne_u64", Ops.IDIV: "divmod64", Ops.MOD: "divmod64"}
BINARY = {
  "f32": {Ops.ADD: "v_add_f32", Ops.MUL: "v_mul_f32", Ops.FDIV: "fdiv",
          Ops.CMPLT: "v_cmp_lt_f32", Ops.CMPNE: "v_cmp_neq_f32"},     # lt: false on NaN; neq: true on NaN
  "f64": {Ops.ADD: "v_add_f64", Ops.MUL: "v_mul_f64", Ops.FDIV: "fdiv", Ops.CMPLT: "v_cmp_lt_f64", Ops.CMPNE: "v_cmp_neq_f64"},
  "i32": _INT32,
  "u32": {**_INT32, Ops.MAX: "v_max_u32", Ops.SHR: "v_lshrrev_b32", Ops.CMPLT: "v_cmp_lt_u32"},
  "i64": _INT64,
  "u64": {**_INT64, Ops.SHR: "v_lshrrev_b64", Ops.CMPLT: "v_cmp_lt_u64"},
}
# unary ALU ops per value class: "v_*" one instruction d = op(a), other names emitter methods
UNARY = {
  "f32": {Ops.NEG: "sign_flip", Ops.TRUNC: "v_trunc_f32", Ops.FLOOR: "v_floor_f32", Ops.RECIP: "recip", Ops.SQRT: "fsqrt32"},
  "f64": {Ops.NEG: "sign_flip", Ops.TRUNC: "v_trunc_f64", Ops.FLOOR: "v_floor_f64", Ops.RECIP: "recip", Ops.SQRT: "fsqrt64"},
  "int": {Ops.NEG: "int_neg"},
}
