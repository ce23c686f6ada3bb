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
import math
from dataclasses import dataclass
from .uop import UOp, Ops
from .dtype import DType, dtypes
from .lower import Native
from .decomp import bits16
from .symbolic import conjuncts
from .amd.inst import Inst, Reg, Sub, Imm, Label, VCC_LO, EXEC_LO, waitcnt, listing
from .amd.regalloc import legalize, allocate, insert_waits, live_intervals, RegisterPressureError, MAX_SGPRS, _phys
from .amd.plan import plan, hoist_staging_loads
from .amd.encode import assemble
from baregrad.drivers.amd.codeobj import KernelMeta, write_kernel
from baregrad.drivers.amd import isa
from .amd.common import F16, BF16, F32, F64, LOCAL_SIZE, KERNARG_PTR, WORKGROUP_ID_X, LOCAL_ID, USER_SGPRS, RESERVED_VGPRS, GROUP_IDS, LOCAL_IDS, WORKITEM_ID_BITS, MAX_WORKGROUP_THREADS, TOTAL_VGPRS_PER_SIMD, VGPR_ALLOC_GRANULE, ADDRESSABLE_VGPRS, SIMDS_PER_WGP, WAVE, LDS_BYTES, LDS_ALIGN, DEPCTR_VA_VDST_0, Const, f32_bits, f64_bits, imm32, is_narrow, signed
from .amd.emit_loops import LoopEmitter
from .amd.emit_memory import MemoryEmitter
from .amd.emit_arith import ArithEmitter


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


class _Renderer(LoopEmitter, MemoryEmitter, ArithEmitter):
  """One kernel's rendering: registers, values, the walk over the program (RULES), launch facts; loops, memory
  accesses and arithmetic come from the emitter mixins (compiler/amd/emit_*.py)."""
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

  def rule(self, u: UOp):
    """The value RULES computes for u (no plan decisions: the emitters call it for the op they stand in for)."""
    return RULES[u.op](self, u)

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
