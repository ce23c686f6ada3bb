"""Render a linearized kernel to RDNA3 (gfx1100) assembly for compiler/amd/asm.py; `compile` makes the code object.

Launch and calling convention (LLVM AMDGPUUsage, "Initial Kernel Execution State" for GFX11, wave32):
s[0:1] = kernarg segment pointer, s2 = workgroup id x, v0 = packed work-item id (x in bits 0-9).
The kernarg segment holds one 8-byte slot per buffer pointer in PARAM order, then one 8-byte (int64) slot
per DEFINE_VAR sorted by name. codegen's `to_threads` replaced the global loops by SPECIAL "gidx" =
workgroup_id * 256 + local_id and gated the stores of threads past the end.

Values (mirroring render_c.py, the reference, value by value):
- every per-lane value lives in VGPRs: bool as 0/1, int8..uint32 in one dword sign/zero-extended from its
  width (re-narrowed after each op that can leave the range, as C's conversion on assignment),
  float16/bfloat16 as float32 rounded after every op (C's `_round16`), float32 in one dword, int64/uint64/
  index/float64 in two. An 8-byte integer whose value range (UOp.vrange) fits in int32 is held "narrow" in one
  dword (sign-extended when a 64-bit use needs it) and computed with 32-bit instructions where that gives the
  same value (always for add/mul/and/or/xor/neg, whose low 32 bits do not depend on the high ones).
- buffer pointers and variables are SGPR pairs (s_load_b64 from the kernarg segment); loop counters are SGPRs
  (loop bounds are uniform: constants or variables); constants are inline/literal operands.
- compares write vcc_lo and become 0/1 with v_cndmask_b32; gated loads/stores run under
  s_and_saveexec_b32 so lanes whose gate is false touch no memory (a gated load gives 0 there).
- float arithmetic: IEEE add/mul/fma; division, reciprocal and square root are refined from the hardware
  estimates (v_rcp_f32 / v_sqrt_f32 are ~1 ulp, RDNA3 ISA guide "VOP1") by Newton/FMA residual steps;
  MAX is `(a != a || a > b) ? a : b`; CMPNE is true on NaN; float->int truncates; float MOD is C's fmod
  (exact: repeated Sterbenz-exact subtraction of the divisor scaled by ldexp).
- integer IDIV/MOD truncate; a zero divisor gives 0; x / -1 is -x (wrapping, INT_MIN / -1 = INT_MIN).
  RDNA3 has no integer divide: 32-bit division uses a v_rcp_iflag_f32 estimate of 2^32/d refined by one
  Newton step and two correction steps; constant divisors use multiply-high by a magic number
  (Granlund & Montgomery, "Division by invariant integers using multiplication", 1994); 64-bit division
  is a 64-step restoring shift-subtract loop.
The kernel descriptor enables float32 denormals (float_denorm_mode_32 = 3) so that results match C's.
"""
from __future__ import annotations
import math, re, struct
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes
from .amd.regalloc import Reg, Sub, Imm, Neg, Abs, Inst, allocate, finish, is_inline, base_reg, INLINE_F32_BITS

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
LOCAL_SIZE = 256
KERNARG_PTR, WORKGROUP_ID_X, LOCAL_ID = "s[0:1]", "s2", "v0"
RESERVED_SGPRS, RESERVED_VGPRS = 3, 1
# two-dword results (vdst, sdst) and VOPC destinations: the number of destination operands per mnemonic
TWO_DESTS = ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32",
             "v_subrev_co_ci_u32", "v_mad_u64_u32", "v_mad_i64_i32")
# v_cmp_class masks (RDNA3 ISA guide, V_CMP_CLASS_F32): bit 3 -normal, 4 -denormal, 7 +denormal, 8 +normal
CLASS_FINITE_NONZERO, CLASS_POSITIVE_FINITE_NONZERO = 0x198, 0x180
MEM_LOAD = {1: "u8", 2: "u16", 4: "b32", 8: "b64"}
MEM_STORE = {1: "b8", 2: "b16", 4: "b32", 8: "b64"}


class Const:
  """A constant value: `bits` of its register form (a 64-bit pattern when size == 2)."""
  __slots__ = ("bits", "size", "is_float")
  def __init__(self, bits: int, size: int, is_float: bool = False): self.bits, self.size, self.is_float = bits, size, is_float


def f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


def imm32(bits: int) -> Imm:
  bits &= 0xFFFFFFFF
  return Imm(bits - (1 << 32) if bits >= 0xFFFFFFF0 else bits)


def fits32(u: UOp) -> bool:
  lo, hi = u.vrange
  return isinstance(lo, int) and isinstance(hi, int) and -(1 << 31) <= lo and hi < (1 << 31)


def is_narrow(u: UOp) -> bool:
  """An 8-byte integer value held in one (sign-extended) dword."""
  return u.dtype is not None and u.dtype.itemsize == 8 and (u.dtype.is_int or u.dtype == dtypes.index) and fits32(u)


def is_wide(dt: DType, u: UOp | None = None) -> bool:
  """Two dwords: float64 and 8-byte integers that are not narrow."""
  if dt == F64: return True
  return dt.itemsize == 8 and not (u is not None and is_narrow(u))


def signed(dt: DType) -> bool: return dt.kind == 'i' or dt == dtypes.index


def _operand_literal(a) -> bool:
  return isinstance(a, Imm) and not is_inline(a.value) and (a.value & 0xFFFFFFFF) not in INLINE_F32_BITS


def _sgpr(a):
  if isinstance(a, (Neg, Abs)): a = a.x
  if isinstance(a, Reg) and a.file == "s": return a
  if isinstance(a, Sub) and a.reg.file == "s": return a.reg
  if isinstance(a, str) and (a.startswith("s") or a.startswith("vcc")): return a
  return None


class _Kernel:
  def __init__(self):
    self.code: list[Inst] = []
    self.nregs = 0
    self.labels = 0

  # ---- registers and instructions ----
  def reg(self, file: str, size: int = 1) -> Reg:
    self.nregs += 1
    return Reg(file, size, self.nregs)

  def v(self, size: int = 1) -> Reg: return self.reg("v", size)
  def s(self, size: int = 1) -> Reg: return self.reg("s", size)

  def label(self, hint: str = "L") -> str:
    self.labels += 1
    return f".{hint}{self.labels}"

  def put_label(self, name: str): self.code.append(Inst("label", (name,)))

  def e(self, op: str, *args, mods: str = "", load: bool = False, target: str = ""):
    if op.startswith("v_") and op != "v_readfirstlane_b32": args = self.legalize(op, list(args))
    self.code.append(Inst(op, tuple(args), mods, load, target))

  def legalize(self, op: str, args: list) -> tuple:
    """At most one literal and two scalar values (SGPRs + literal) per VALU instruction (gfx10+ constant
    bus limit, RDNA3 ISA guide "VALU Instruction Operands"); extra ones go through VGPRs."""
    ndst = 2 if op.startswith(TWO_DESTS) else 1
    literals = [i for i in range(ndst, len(args)) if _operand_literal(args[i])]
    for i in literals[1:]:
      t = self.v(); self.code.append(Inst("v_mov_b32", (t, args[i]))); args[i] = t
    while True:
      scalars = {id(s): s for i in range(ndst, len(args)) if (s := _sgpr(args[i])) is not None}
      nlit = 1 if any(_operand_literal(args[i]) for i in range(ndst, len(args))) else 0
      if len(scalars) + nlit <= 2: break
      for i in range(ndst, len(args)):   # move the first register SGPR operand to a VGPR
        a = args[i]
        if isinstance(a, (Reg, Sub)) and _sgpr(a) is not None:
          size = a.size if isinstance(a, Reg) else 1
          t = self.v(size)
          for k in range(size): self.code.append(Inst("v_mov_b32", (t[k] if size > 1 else t, a[k] if isinstance(a, Reg) and size > 1 else a)))
          args = [t if x is a else x for x in args]
          break
      else:
        raise RuntimeError(f"AMD renderer: cannot satisfy the constant bus limit for {op} {args}")
    return tuple(args)

  def o(self, op: str, *srcs, size: int = 1, mods: str = "") -> Reg:
    """Emit `op d, srcs...` into a new VGPR (pair when size=2) and return it."""
    d = self.v(size)
    self.e(op, d, *srcs, mods=mods)
    return d

  def sel(self, f, t, cond=None) -> Reg:
    """v_cndmask: t where the lane mask (default vcc_lo) is set, else f."""
    return self.o("v_cndmask_b32", f, t, cond or "vcc_lo")

  def mov64(self, lo, hi) -> Reg:
    d = self.v(2)
    self.e("v_mov_b32", d[0], lo); self.e("v_mov_b32", d[1], hi)
    return d

  def cmp_to_bool(self) -> Reg: return self.sel(Imm(0), Imm(1))


class AMDRenderer:
  device = "AMD"
  threads = True                         # codegen maps the global loops to SPECIAL "gidx"
  # exp2/log2/sin come from compiler.decomp: v_exp_f32/v_log_f32 are ~1 ulp and v_sin_f32 is inaccurate
  # for large arguments (RDNA3 ISA guide, "VOP1"); the decompositions match the CPU device.
  native_ops = {Ops.SQRT, Ops.TRUNC}
  arch = "gfx1100"

  def render(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> str:
    return _Renderer(name, program, alias, n_params, variables).render()

  def compile(self, src: str) -> bytes:
    from .amd.asm import assemble
    from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
    meta = parse_meta(src)
    code = assemble(src)
    kd = KernelDescriptor.for_kernel(meta["vgprs"], kernarg_size=meta["kernarg"], lds_size=meta.get("lds", 0),
                                     workgroup_ids=1, workitem_dims=1, float_denorm_mode_32=3,
                                     float_denorm_mode_16_64=3)
    args = [{".name": f"data{i}", ".size": 8, ".offset": 8 * i, ".value_kind": "global_buffer",
             ".address_space": "global"} for i in range(meta["params"])]
    args += [{".name": v, ".size": 8, ".offset": 8 * (meta["params"] + j), ".value_kind": "by_value"}
             for j, v in enumerate(meta["vars"])]
    return write_code_object(meta["name"], code, kd, meta["kernarg"], args, sgpr_count=meta["sgprs"],
                             vgpr_count=meta["vgprs"])


META_RE = re.compile(r"^; baregrad-amd (.*)$", re.M)


def parse_meta(src: str) -> dict:
  """The facts `render` records in its header comment: name, vgprs, sgprs, kernarg, params, vars."""
  m = META_RE.search(src)
  if not m: raise ValueError("AMD source has no '; baregrad-amd' header line (was it made by AMDRenderer.render?)")
  out: dict = {}
  for item in m[1].split():
    key, _, value = item.partition("=")
    out[key] = value if key == "name" else [x for x in value.split(",") if x] if key == "vars" else int(value)
  return out


class _Renderer(_Kernel):
  def __init__(self, name, program, alias, n_params, variables):
    super().__init__()
    self.name, self.program, self.alias, self.n_params, self.variables = name, program, alias, n_params, variables
    self.vals: dict[UOp, object] = {}
    self.loops: dict[UOp, tuple] = {}

  # ---------------------------------------------------------------- driver
  def render(self) -> str:
    for u in self.program:
      if u.op is Ops.DEFINE_ACC and u.src:
        raise NotImplementedError("AMD renderer: upcast accumulators (DEFINE_ACC with lanes) are CPU-only opts")
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
    if self.code: self.e("s_waitcnt", "lgkmcnt(0)")
    self.tail_gate = self.find_tail_gate()
    self.exit = self.label("exit")
    for u in self.program: self.lower(u)
    self.put_label(self.exit)
    self.e("s_endpgm")
    vgprs, sgprs = allocate(self.code, RESERVED_VGPRS, RESERVED_SGPRS)
    kernarg = 8 * (self.n_params + len(self.variables))
    head = [f"; baregrad-amd name={self.name} vgprs={vgprs} sgprs={sgprs} kernarg={kernarg} params={self.n_params} "
            f"vars={','.join(v.arg[0] for v in self.variables)} lds=0",
            f"; {self.name}: gfx1100 wave32, kernarg s[0:1], workgroup id x s2, local id v0"]
    return "\n".join(head + finish(self.code)) + "\n"

  def find_tail_gate(self) -> UOp | None:
    """`gidx < n` when every store is gated by it (to_threads' guard for threads past the end)."""
    common = None
    for u in self.program:
      if u.op is not Ops.STORE: continue
      idx = u.src[0]
      terms, stack = set(), [idx.src[2]] if len(idx.src) == 3 else []
      while stack:
        t = stack.pop()
        if t.op is Ops.AND and t.dtype.is_bool: stack.extend(t.src)
        elif t.op is Ops.CMPLT and t.src[0].op is Ops.SPECIAL and t.src[1].op is Ops.CONST and is_narrow(t.src[0]): terms.add(t)
      common = terms if common is None else common & terms
    return next(iter(common)) if common else None

  def lower(self, u: UOp):
    op = u.op
    if op in (Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.REDUCE): return
    self.lower_value(u)
    if u in self.vals and u.dtype is not None and u.dtype.itemsize == 8 and u.dtype.is_int and u.op is not Ops.RANGE:
      x = self.vals[u]   # keep the representation rule: narrow (one dword) exactly when the value fits in int32
      if is_narrow(u) and isinstance(x, Reg) and x.size == 2: self.vals[u] = x[0]
      elif not is_narrow(u) and not (isinstance(x, Reg) and x.size == 2) and not isinstance(x, Const):
        self.vals[u] = self.rpair(x, signed(u.dtype))

  def lower_value(self, u: UOp):
    op = u.op
    if op is Ops.CONST: self.vals[u] = self.const(u.arg, u.dtype, u); return
    if op is Ops.SPECIAL:
      self.vals[u] = self.special(u)
      if self.tail_gate is not None and self.tail_gate.src[0] is u:
        # lanes past the end would only compute values that no store keeps; they also must not load out of
        # bounds: switch them off for the whole kernel (and end a wave that has none left)
        self.e("v_cmp_gt_i32", "vcc_lo", imm32(self.tail_gate.src[1].arg), self.op32(u))
        self.e("s_and_b32", "exec_lo", "exec_lo", "vcc_lo")
        self.e("s_cbranch_execz", target=self.exit)
      return
    if op is Ops.RANGE: return self.open_range(u)
    if op is Ops.ENDRANGE: return self.close_range(u.src[0])
    if op is Ops.DEFINE_ACC:
      acc = self.v(2 if u.dtype.itemsize == 8 and not u.dtype.is_bool else 1)
      self.vals[u] = self.copy_into(acc, self.const(identity_for(u.arg[0], u.dtype), u.dtype), u.dtype)
      return
    if op is Ops.ACC_UPDATE:
      acc = self.vals[u.src[0]]
      new = self.binary(u.arg, u.src[0], u.src[1], u.dtype, out=u.src[0])
      self.copy_into(acc, new, u.dtype)
      return
    if op is Ops.INDEX: self.vals[u] = self.address(u); return
    if op is Ops.LOAD: self.vals[u] = self.load(u); return
    if op is Ops.STORE: return self.store(u)
    if op is Ops.CAST: self.vals[u] = self.cast(u.src[0], u.dtype, u); return
    if op is Ops.BITCAST: self.vals[u] = self.bitcast(u.src[0], u.dtype); return
    if op is Ops.WHERE: self.vals[u] = self.where(u); return
    if op is Ops.MUL and u.dtype.is_float and u.src[1].op is Ops.RECIP:
      a, b = u.src[0], u.src[1].src[0]
      q = self.fdiv64(self.rpair(a), self.rpair(b)) if u.dtype == F64 else self.fdiv32(self.op32(a), self.op32(b))
      self.vals[u] = self.round16(q, u.dtype); return
    if len(u.src) == 2: self.vals[u] = self.binary(op, u.src[0], u.src[1], u.src[0].dtype, out=u); return
    if len(u.src) == 1: self.vals[u] = self.unary(op, u.src[0], u.dtype); return
    raise NotImplementedError(f"AMD renderer: no rule for {op.name}")

  # ---------------------------------------------------------------- values
  def val(self, u: UOp):
    u = self.alias.get(u, u)
    if u not in self.vals:
      if u.op is Ops.CONST: return self.const(u.arg, u.dtype, u)
      raise RuntimeError(f"AMD renderer: {u.op.name} used before it was rendered")
    return self.vals[u]

  def const(self, value, dt: DType, u: UOp | None = None) -> Const:
    if dt.is_bool: return Const(1 if value else 0, 1)
    if dt == F64: return Const(f64_bits(value), 2, True)
    if dt.is_float: return Const(f32_bits(value), 1)
    if dt.itemsize == 8:
      v = int(value)
      if -(1 << 31) <= v < (1 << 31) and (u is None or is_narrow(u)): return Const(v & 0xFFFFFFFF, 1)
      return Const(v & 0xFFFFFFFFFFFFFFFF, 2)
    return Const(int(value) & 0xFFFFFFFF, 1)

  def op32(self, u_or_val):
    """A one-dword operand (the low dword of a wide value)."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const): return imm32(x.bits)
    if isinstance(x, Reg) and x.size == 2: return x[0]
    return x

  def lo(self, u_or_val): return self.op32(u_or_val)

  def hi(self, u_or_val, sgn: bool = True):
    """The high dword of a 64-bit value; a narrow value is sign-extended (zero-extended if not sgn)."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const):
      if x.size == 2: return imm32(x.bits >> 32)
      return imm32(0xFFFFFFFF if sgn and x.bits & 0x80000000 else 0)
    if isinstance(x, Reg) and x.size == 2: return x[1]
    return self.o("v_ashrrev_i32", Imm(31), x) if sgn else Imm(0)

  def pair(self, u_or_val, sgn: bool = True):
    """A 64-bit operand: a register pair, or a 64-bit inline constant."""
    x = self.val(u_or_val) if isinstance(u_or_val, UOp) else u_or_val
    if isinstance(x, Const):
      v = x.bits if x.size == 2 else (x.bits - (1 << 32) if sgn and x.bits & 0x80000000 else x.bits)
      v = v - (1 << 64) if v >= (1 << 63) else v
      if is_inline(v) and (not x.is_float or v == 0): return Imm(v)
      return self.mov64(imm32(v), imm32(v >> 32))
    if isinstance(x, Reg) and x.size == 2: return x
    return self.mov64(x, self.hi(x, sgn))

  def rpair(self, u_or_val, sgn: bool = True) -> Reg:
    """A 64-bit value in a register pair (constants are moved into VGPRs)."""
    x = self.pair(u_or_val, sgn)
    if isinstance(x, Imm): return self.mov64(imm32(x.value), imm32(x.value >> 32))
    return x

  def vgpr(self, x) -> Reg:
    """A value as one VGPR (stores and addresses need VGPRs)."""
    if isinstance(x, Reg) and x.file == "v" and x.size == 1: return x
    if isinstance(x, Sub) and x.reg.file == "v": return x
    return self.o("v_mov_b32", self.op32(x))

  def copy_into(self, dst, src, dt: DType):
    """Copy a value into a (new, if dst is None) VGPR or VGPR pair; returns the destination."""
    wide = (isinstance(src, Reg) and src.size == 2) or (isinstance(src, Const) and src.size == 2) or dt == F64
    if dst is None: dst = self.v(2 if wide else 1)
    if isinstance(dst, Reg) and dst.size == 2:
      self.e("v_mov_b32", dst[0], self.lo(src)); self.e("v_mov_b32", dst[1], self.hi(src, signed(dt)))
    else:
      self.e("v_mov_b32", dst, self.op32(src))
    return dst

  # ---------------------------------------------------------------- threads and loops
  def special(self, u: UOp):
    if u.arg[0] != "gidx": raise NotImplementedError(f"AMD renderer: unknown SPECIAL {u.arg[0]!r} (knows 'gidx')")
    lid = self.o("v_and_b32", Imm(0x3FF), LOCAL_ID)           # work-item id x: bits 0-9 of v0
    g = self.o("v_lshl_add_u32", WORKGROUP_ID_X, Imm(int(math.log2(LOCAL_SIZE))), lid)
    return g if is_narrow(u) or u.dtype.itemsize < 8 else self.mov64(g, Imm(0))

  def open_range(self, u: UOp):
    if not fits32(u): raise NotImplementedError(f"AMD renderer: loop bound {u.src[0].vmax} does not fit in 32 bits")
    if u.src[0].op is Ops.CONST: bound = imm32(u.src[0].arg)
    else:
      b = self.op32(u.src[0])
      if isinstance(b, Imm) or _sgpr(b) is not None: bound = b
      else:   # uniform (a function of variables only) but computed in VGPRs: read it from the first lane
        bound = self.s(); self.e("v_readfirstlane_b32", bound, b)
    counter, top, end = self.s(), self.label("loop"), self.label("endloop")
    self.e("s_mov_b32", counter, Imm(0))
    if not (isinstance(bound, Imm) and bound.value > 0):
      self.e("s_cmp_ge_i32", counter, bound)
      self.e("s_cbranch_scc1", target=end)
    self.put_label(top)
    self.vals[u] = counter
    self.loops[u] = (counter, bound, top, end)

  def close_range(self, u: UOp):
    counter, bound, top, end = self.loops.pop(u)
    self.e("s_add_i32", counter, counter, Imm(1))
    self.e("s_cmp_lt_i32", counter, bound)
    self.e("s_cbranch_scc1", target=top)
    self.put_label(end)
    del self.vals[u]

  # ---------------------------------------------------------------- memory
  def address(self, idx: UOp):
    """(base SGPR pair, 32-bit VGPR byte offset) when the offset provably fits in 32 unsigned bits, else
    (None, 64-bit VGPR address): base + (index << log2(itemsize)) with v_add_co_u32 / v_add_co_ci_u32."""
    base, index = self.val(idx.src[0]), idx.src[1]
    size = idx.src[0].dtype.itemsize
    shift = int(math.log2(size))
    lo, hi = index.vrange
    if isinstance(lo, int) and lo >= 0 and (hi + 1) * size <= (1 << 32):
      x = self.op32(index)
      off = self.o("v_lshlrev_b32", Imm(shift), x) if shift else self.vgpr(x)
      return (base, off)
    off = self.rpair(index)
    if shift: off = self.o("v_lshlrev_b64", Imm(shift), off, size=2)
    addr = self.v(2)
    self.e("v_add_co_u32", addr[0], "vcc_lo", base[0], off[0])
    self.e("v_add_co_ci_u32", addr[1], "vcc_lo", base[1], off[1], "vcc_lo")
    return (None, addr)

  def gate_begin(self, idx: UOp):
    if len(idx.src) < 3: return None
    g = self.val(idx.src[2])
    if isinstance(g, Const):
      if g.bits: return None
      saved = self.s(); self.e("s_mov_b32", saved, "exec_lo"); self.e("s_mov_b32", "exec_lo", Imm(0))
      return saved
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), self.op32(g))
    saved = self.s()
    self.e("s_and_saveexec_b32", saved, "vcc_lo")
    return saved

  def gate_end(self, saved):
    if saved is not None: self.e("s_mov_b32", "exec_lo", saved)

  def mem_args(self, addr):
    base, off = addr
    return (off, base) if base is not None else (off, "off")

  def load(self, u: UOp):
    idx, dt = u.src[0], u.dtype
    size = idx.src[0].dtype.itemsize
    kind = MEM_LOAD[size]
    if dt.is_int and dt.itemsize < 4: kind = ("i" if signed(dt) else "u") + str(8 * dt.itemsize)
    d = self.v(2 if size == 8 else 1)
    gated = len(idx.src) == 3
    if gated:   # lanes whose gate is false keep 0
      for k in range(d.size): self.e("v_mov_b32", d[k] if d.size > 1 else d, Imm(0))
    saved = self.gate_begin(idx)
    a, b = self.mem_args(self.val(idx))
    self.e(f"global_load_{kind}", d, a, b, load=True)
    self.gate_end(saved)
    if dt.is_bool:
      self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), d)
      return self.cmp_to_bool()
    if dt == F16: return self.f16_bits_to_f32(d)
    if dt == BF16: return self.o("v_lshlrev_b32", Imm(16), d)
    return d

  def store(self, u: UOp):
    idx, v = u.src[0], u.src[1]
    dt = v.dtype
    size = idx.src[0].dtype.itemsize
    if dt == F16: data = self.f32_to_f16_bits(self.op32(v))
    elif dt == BF16: data = self.f32_to_bf16_bits(self.op32(v))
    elif size == 8: data = self.rpair(v, signed(dt))
    else: data = self.vgpr(self.val(v))
    if isinstance(data, Reg) and data.file == "s": data = self.copy_into(None, data, dt)
    saved = self.gate_begin(idx)
    a, b = self.mem_args(self.val(idx))
    self.e(f"global_store_{MEM_STORE[size]}", a, data, b)
    self.gate_end(saved)

  # ---------------------------------------------------------------- 16-bit floats (C prelude semantics)
  def f32_to_f16_bits(self, x) -> Reg:
    """bg_f32_f16: round to nearest even, overflow to inf, subnormals kept; NaN -> sign | 0x7e00."""
    h = self.o("v_cvt_f16_f32", x)
    h = self.o("v_and_b32", Imm(0xFFFF), h)
    n = self.o("v_lshrrev_b32", Imm(16), x)
    n = self.o("v_and_b32", Imm(0x8000), n)
    n = self.o("v_or_b32", Imm(0x7E00), n)
    self.e("v_cmp_u_f32", "vcc_lo", x, x)
    return self.sel(h, n)

  def f16_bits_to_f32(self, bits) -> Reg:
    """bg_f16_f32: exact; a NaN keeps sign and payload (sign | 0x7f800000 | mantissa << 13)."""
    f = self.o("v_cvt_f32_f16", bits)
    s = self.o("v_and_b32", Imm(0x8000), bits)
    s = self.o("v_lshlrev_b32", Imm(16), s)
    m = self.o("v_and_b32", Imm(0x3FF), bits)
    m = self.o("v_lshlrev_b32", Imm(13), m)
    n = self.o("v_or3_b32", s, m, Imm(0x7F800000))
    self.e("v_cmp_u_f32", "vcc_lo", f, f)
    return self.sel(f, n)

  def f32_to_bf16_bits(self, x) -> Reg:
    """bg_f32_bf16: NaN -> (bits >> 16) | 0x40, else round to nearest even on the top 16 bits."""
    t = self.o("v_bfe_u32", x, Imm(16), Imm(1))
    t = self.o("v_add3_u32", x, t, Imm(0x7FFF))
    t = self.o("v_lshrrev_b32", Imm(16), t)
    n = self.o("v_lshrrev_b32", Imm(16), x)
    n = self.o("v_or_b32", Imm(0x40), n)
    self.e("v_cmp_u_f32", "vcc_lo", x, x)
    return self.sel(t, n)

  def round16(self, x, dt: DType):
    """C's _round16: a float32 value rounded to float16/bfloat16 and back; other dtypes unchanged."""
    if dt == F16:
      f = self.o("v_cvt_f32_f16", self.o("v_cvt_f16_f32", x))
      n = self.o("v_and_b32", imm32(0x80000000), x)
      n = self.o("v_or_b32", Imm(0x7FC00000), n)
      self.e("v_cmp_u_f32", "vcc_lo", x, x)
      return self.sel(f, n)
    if dt == BF16:
      t = self.o("v_bfe_u32", x, Imm(16), Imm(1))
      t = self.o("v_add3_u32", x, t, Imm(0x7FFF))
      t = self.o("v_and_b32", imm32(0xFFFF0000), t)
      n = self.o("v_and_b32", imm32(0xFFFF0000), x)
      n = self.o("v_or_b32", Imm(0x400000), n)
      self.e("v_cmp_u_f32", "vcc_lo", x, x)
      return self.sel(t, n)
    return x

  def narrow(self, x, dt: DType):
    """C's conversion back to a sub-32-bit integer type after an op (sign/zero extension of the low bits)."""
    if dt.is_int and dt.itemsize < 4:
      if signed(dt): return self.o("v_bfe_i32", x, Imm(0), Imm(8 * dt.itemsize))
      return self.o("v_and_b32", Imm((1 << (8 * dt.itemsize)) - 1), x)
    return x

  # ---------------------------------------------------------------- ALU
  def binary(self, op: Ops, ua: UOp, ub: UOp, dt: DType, out: UOp):
    """`dt` is the operand dtype; CMPLT/CMPNE give a bool (0/1)."""
    if dt.is_bool: return self.binary_bool(op, self.op32(ua), self.op32(ub))
    if dt == F64: return self.binary_f64(op, ua, ub)
    if dt.is_float and op is Ops.MOD: return self.round16(self.fmod(ua, ub, False), dt)
    if dt.is_float and op in (Ops.CMPLT, Ops.CMPNE): return self.binary_f32(op, self.op32(ua), self.op32(ub))
    if dt.is_float: return self.round16(self.binary_f32(op, self.op32(ua), self.op32(ub)), dt)
    if dt.itemsize == 8:
      modular = op in (Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR) or \
        (op is Ops.SHL and isinstance(ub.vrange[0], int) and 0 <= ub.vrange[0] and ub.vrange[1] < 32)
      result_narrow = op not in (Ops.CMPLT, Ops.CMPNE) and is_narrow(out)
      if (result_narrow and modular) or (is_narrow(ua) and is_narrow(ub) and (result_narrow or op in (Ops.CMPLT, Ops.CMPNE))):
        return self.binary_i32(op, self.op32(ua), self.op32(ub), dtypes.int32, ua, ub)
      r = self.binary_i64(op, ua, ub, dt)
      return r[0] if result_narrow and isinstance(r, Reg) and r.size == 2 else r
    return self.binary_i32(op, self.op32(ua), self.op32(ub), dt, ua, ub)

  def binary_bool(self, op: Ops, a, b):
    if op in (Ops.ADD, Ops.OR, Ops.MAX): return self.o("v_or_b32", a, b)
    if op in (Ops.MUL, Ops.AND, Ops.IDIV): return self.o("v_and_b32", a, b)   # C: b ? a / b : 0 on 0/1
    if op in (Ops.XOR, Ops.CMPNE): return self.o("v_xor_b32", a, b)
    if op is Ops.CMPLT: return self.o("v_and_b32", self.o("v_xor_b32", Imm(1), a), b)
    if op is Ops.MOD: return self.o("v_mov_b32", Imm(0))
    if op is Ops.SHL: return self.o("v_mov_b32", a) if not isinstance(a, Imm) else self.o("v_mov_b32", a)
    if op is Ops.SHR: return self.o("v_and_b32", self.o("v_xor_b32", Imm(1), b), a)
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on bool")

  def fmax_select(self, a, b, cmp_gt: str, cmp_u: str, dwords: int):
    """C: (a != a || a > b) ? a : b."""
    outs = []
    self.e(cmp_gt, "vcc_lo", a, b)
    t = [self.sel(b[k] if dwords > 1 else b, a[k] if dwords > 1 else a) for k in range(dwords)]
    self.e(cmp_u, "vcc_lo", a, a)
    outs = [self.sel(t[k], a[k] if dwords > 1 else a) for k in range(dwords)]
    if dwords == 1: return outs[0]
    return self.mov64(outs[0], outs[1])

  def binary_f32(self, op: Ops, a, b):
    if op is Ops.ADD: return self.o("v_add_f32", a, b)
    if op is Ops.MUL: return self.o("v_mul_f32", a, b)
    if op is Ops.MAX: return self.fmax_select(self.vgpr(a) if isinstance(a, Imm) else a, b, "v_cmp_gt_f32", "v_cmp_u_f32", 1)
    if op is Ops.CMPLT: self.e("v_cmp_lt_f32", "vcc_lo", a, b); return self.cmp_to_bool()      # false on NaN
    if op is Ops.CMPNE: self.e("v_cmp_neq_f32", "vcc_lo", a, b); return self.cmp_to_bool()     # true on NaN
    if op is Ops.MOD: raise AssertionError("float MOD goes through fmod with the UOps")
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on float32")

  def binary_f64(self, op: Ops, ua: UOp, ub: UOp):
    if op is Ops.MOD: return self.fmod(ua, ub, True)
    if op is Ops.MAX: a, b = self.rpair(ua), self.rpair(ub)
    else: a, b = self.pair(ua), self.pair(ub)
    if op is Ops.ADD: return self.o("v_add_f64", a, b, size=2)
    if op is Ops.MUL: return self.o("v_mul_f64", a, b, size=2)
    if op is Ops.MAX: return self.fmax_select(a, b, "v_cmp_gt_f64", "v_cmp_u_f64", 2)
    if op is Ops.CMPLT: self.e("v_cmp_lt_f64", "vcc_lo", a, b); return self.cmp_to_bool()
    if op is Ops.CMPNE: self.e("v_cmp_neq_f64", "vcc_lo", a, b); return self.cmp_to_bool()
    if op is Ops.MOD: return self.fmod(ua, ub, True)
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on float64")

  def binary_i32(self, op: Ops, a, b, dt: DType, ua: UOp | None = None, ub: UOp | None = None):
    sg = signed(dt)
    if op is Ops.ADD: return self.narrow(self.o("v_add_nc_u32", a, b), dt)
    if op is Ops.MUL: return self.narrow(self.o("v_mul_lo_u32", a, b), dt)
    if op is Ops.MAX: return self.o("v_max_i32" if sg else "v_max_u32", a, b)
    if op is Ops.XOR: return self.o("v_xor_b32", a, b)
    if op is Ops.OR: return self.o("v_or_b32", a, b)
    if op is Ops.AND: return self.o("v_and_b32", a, b)
    if op is Ops.SHL: return self.narrow(self.o("v_lshlrev_b32", b, a), dt)
    if op is Ops.SHR: return self.o("v_ashrrev_i32" if sg else "v_lshrrev_b32", b, a)
    if op is Ops.CMPLT: self.e("v_cmp_lt_i32" if sg else "v_cmp_lt_u32", "vcc_lo", a, b); return self.cmp_to_bool()
    if op is Ops.CMPNE: self.e("v_cmp_ne_u32", "vcc_lo", a, b); return self.cmp_to_bool()
    if op in (Ops.IDIV, Ops.MOD): return self.narrow(self.divmod32(op, a, b, sg, ua, ub), dt)
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on {dt.name}")

  def binary_i64(self, op: Ops, ua: UOp, ub: UOp, dt: DType):
    sg = signed(dt)
    if op in (Ops.SHL, Ops.SHR):
      a, amount = self.pair(ua, sg), self.lo(ub)
      name = "v_lshlrev_b64" if op is Ops.SHL else "v_ashrrev_i64" if sg else "v_lshrrev_b64"
      return self.o(name, amount, a, size=2)
    if op in (Ops.XOR, Ops.OR, Ops.AND):
      name = {Ops.XOR: "v_xor_b32", Ops.OR: "v_or_b32", Ops.AND: "v_and_b32"}[op]
      return self.mov64(self.o(name, self.lo(ua), self.lo(ub)), self.o(name, self.hi(ua, sg), self.hi(ub, sg)))
    if op is Ops.ADD: return self.add64(self.lo(ua), self.hi(ua, sg), self.lo(ub), self.hi(ub, sg))
    if op is Ops.MUL: return self.mul64(self.lo(ua), self.hi(ua, sg), self.lo(ub), self.hi(ub, sg))
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.MAX):
      a, b = self.pair(ua, sg), self.pair(ub, sg)
      if op is Ops.CMPNE: self.e("v_cmp_ne_u64", "vcc_lo", a, b); return self.cmp_to_bool()
      if op is Ops.CMPLT: self.e("v_cmp_lt_i64" if sg else "v_cmp_lt_u64", "vcc_lo", a, b); return self.cmp_to_bool()
      a, b = self.rpair(ua, sg), self.rpair(ub, sg)
      self.e("v_cmp_gt_i64" if sg else "v_cmp_gt_u64", "vcc_lo", a, b)
      return self.mov64(self.sel(b[0], a[0]), self.sel(b[1], a[1]))
    if op in (Ops.IDIV, Ops.MOD): return self.divmod64(op, ua, ub, sg)
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on {dt.name}")

  def add64(self, alo, ahi, blo, bhi) -> Reg:
    d = self.v(2)
    self.e("v_add_co_u32", d[0], "vcc_lo", alo, blo)
    self.e("v_add_co_ci_u32", d[1], "vcc_lo", ahi, bhi, "vcc_lo")
    return d

  def sub64(self, alo, ahi, blo, bhi) -> Reg:
    d = self.v(2)
    self.e("v_sub_co_u32", d[0], "vcc_lo", alo, blo)
    self.e("v_sub_co_ci_u32", d[1], "vcc_lo", ahi, bhi, "vcc_lo")
    return d

  def mul64(self, alo, ahi, blo, bhi) -> Reg:
    """Low 64 bits of the product: alo*blo (full) + (alo*bhi + ahi*blo) << 32."""
    lo = self.o("v_mul_lo_u32", alo, blo)
    hi = self.o("v_mul_hi_u32", alo, blo)
    c1 = self.o("v_mul_lo_u32", alo, bhi)
    c2 = self.o("v_mul_lo_u32", ahi, blo)
    return self.mov64(lo, self.o("v_add3_u32", hi, c1, c2))

  def unary(self, op: Ops, ua: UOp, dt: DType):
    if dt.is_bool:
      if op is Ops.NEG: return self.o("v_xor_b32", Imm(1), self.op32(ua))
      if op is Ops.TRUNC: return self.val(ua)
      raise NotImplementedError(f"AMD renderer: no rule for {op.name} on bool")
    if dt == F64:
      a = self.rpair(ua)
      if op is Ops.NEG: return self.mov64(a[0], self.o("v_xor_b32", imm32(0x80000000), a[1]))
      if op is Ops.TRUNC: return self.o("v_trunc_f64", a, size=2)
      if op is Ops.RECIP: return self.fdiv64(None, a)
      if op is Ops.SQRT: return self.fsqrt64(a)
      raise NotImplementedError(f"AMD renderer: {op.name} on float64 is not native (compiler.decomp rewrites it)")
    if dt.is_float:
      a = self.op32(ua)
      if op is Ops.NEG: r = self.o("v_xor_b32", imm32(0x80000000), a)
      elif op is Ops.TRUNC: r = self.o("v_trunc_f32", a)
      elif op is Ops.RECIP: r = self.fdiv32(None, a)
      elif op is Ops.SQRT: r = self.fsqrt32(a)
      else: raise NotImplementedError(f"AMD renderer: {op.name} is not native (compiler.decomp rewrites it)")
      return self.round16(r, dt)
    if op is Ops.TRUNC: return self.val(ua)
    if op is Ops.NEG:
      if is_wide(dt, ua): return self.sub64(Imm(0), Imm(0), self.lo(ua), self.hi(ua))
      return self.narrow(self.o("v_sub_nc_u32", Imm(0), self.op32(ua)), dt)
    if op is Ops.RECIP:
      one = UOp.const(dt, 1)
      return self.binary(Ops.IDIV, one, ua, dt, out=UOp(Ops.IDIV, dt, (one, ua)))
    if op is Ops.SQRT:   # C: __builtin_sqrtf on the int, truncated back on assignment
      f = self.fsqrt32(self.cast_value(ua, F32))
      return self.cast_from(f, F32, dt, None)
    raise NotImplementedError(f"AMD renderer: no rule for {op.name} on {dt.name}")

  def where(self, u: UOp):
    c, a, b = u.src
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), self.op32(c))
    if is_wide(u.dtype, u):
      sg = signed(u.dtype)
      alo, ahi, blo, bhi = self.lo(a), self.hi(a, sg), self.lo(b), self.hi(b, sg)   # (v_ashrrev keeps vcc)
      return self.mov64(self.sel(blo, alo), self.sel(bhi, ahi))
    return self.sel(self.op32(b), self.op32(a))

  # ---------------------------------------------------------------- float division, sqrt, fmod
  def fdiv32(self, a, b) -> Reg:
    """a / b (a None: 1 / b), correctly rounded for finite nonzero quotients in range: r = rcp(b),
    q0 = a*r, e = fma(-b, q0, a), q = fma(e, r, q0); where q0 is 0, inf or NaN it is already the answer."""
    # a divisor below 2^-100 (1/b would overflow when subnormal) is scaled by 2^64, and so is the quotient
    b = self.vgpr(b) if isinstance(b, Imm) else b
    self.e("v_cmp_class_f32", "vcc_lo", b, Imm(0x090))            # +-subnormal
    tiny = self.cmp_to_bool()
    b = self.sel(b, self.o("v_mul_f32", Imm(0x5F800000), b))       # * 2^64
    q = self._fdiv32(a, b)
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), tiny)
    return self.sel(q, self.o("v_mul_f32", Imm(0x5F800000), q))

  def _fdiv32(self, a, b) -> Reg:
    r = self.o("v_rcp_f32", b)
    if a is None:
      e = self.o("v_fma_f32", self.neg(b), r, Imm(0x3F800000))
      q = self.o("v_fma_f32", e, r, r)
      q0 = r
    else:
      e1 = self.o("v_fma_f32", self.neg(b), r, Imm(0x3F800000))
      r1 = self.o("v_fma_f32", e1, r, r)
      self.e("v_cmp_class_f32", "vcc_lo", r, Imm(CLASS_FINITE_NONZERO))   # 1/0, 1/inf: keep the estimate
      r = self.sel(r, r1)
      q0 = self.o("v_mul_f32", a, r)
      e = self.o("v_fma_f32", self.neg(b), q0, a)
      q = self.o("v_fma_f32", e, r, q0)
    self.e("v_cmp_class_f32", "vcc_lo", q0, Imm(CLASS_FINITE_NONZERO))
    return self.sel(q0, q)

  def neg(self, x):
    """-x as an operand (the VOP3 neg modifier); a constant is negated directly."""
    if isinstance(x, Imm): return imm32(x.value ^ 0x80000000)
    return Neg(x)

  def fdiv64(self, a, b) -> Reg:
    """As fdiv32 with two Newton steps on the reciprocal (a None: 1 / b)."""
    one = self.mov64(Imm(0), Imm(0x3FF00000))
    r0 = r = self.o("v_rcp_f64", b, size=2)
    for _ in range(2):
      e = self.o("v_fma_f64", Neg(b), r, one, size=2)
      r = self.o("v_fma_f64", e, r, r, size=2)
    self.e("v_cmp_class_f64", "vcc_lo", r0, Imm(CLASS_FINITE_NONZERO))   # 1/0, 1/inf: keep the estimate
    r = self.mov64(self.sel(r0[0], r[0]), self.sel(r0[1], r[1]))
    if a is None:
      e = self.o("v_fma_f64", Neg(b), r, one, size=2)
      q = self.o("v_fma_f64", e, r, r, size=2)
      q0 = r
    else:
      q0 = self.o("v_mul_f64", a, r, size=2)
      e = self.o("v_fma_f64", Neg(b), q0, a, size=2)
      q = self.o("v_fma_f64", e, r, q0, size=2)
    self.e("v_cmp_class_f64", "vcc_lo", q0, Imm(CLASS_FINITE_NONZERO))
    return self.mov64(self.sel(q0[0], q[0]), self.sel(q0[1], q[1]))

  def fsqrt32(self, x) -> Reg:
    """Correctly rounded sqrt: s = v_sqrt_f32(x) then one-ulp corrections from fma residuals (x - s_dn*s <= 0
    picks s_dn, x - s_up*s > 0 picks s_up); tiny inputs are scaled by 2^32 (result by 2^-16) first."""
    x = self.vgpr(x) if isinstance(x, Imm) else x
    self.e("v_cmp_gt_f32", "vcc_lo", Imm(0x0F800000), x)          # x < 2^-96
    xs = self.sel(x, self.o("v_mul_f32", Imm(0x4F800000), x))     # * 2^32
    small = self.o("v_cndmask_b32", Imm(0), Imm(1), "vcc_lo")
    s = self.o("v_sqrt_f32", xs)
    s_dn = self.o("v_add_nc_u32", Imm(-1), s)
    s_up = self.o("v_add_nc_u32", Imm(1), s)
    r_dn = self.o("v_fma_f32", Neg(s_dn), s, xs)
    r_up = self.o("v_fma_f32", Neg(s_up), s, xs)
    self.e("v_cmp_ge_f32", "vcc_lo", Imm(0), r_dn)
    t = self.sel(s, s_dn)
    self.e("v_cmp_lt_f32", "vcc_lo", Imm(0), r_up)
    t = self.sel(t, s_up)
    self.e("v_cmp_class_f32", "vcc_lo", xs, Imm(CLASS_POSITIVE_FINITE_NONZERO))
    t = self.sel(s, t)
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), small)
    return self.sel(t, self.o("v_mul_f32", Imm(0x37800000), t))   # * 2^-16

  def fsqrt64(self, x) -> Reg:
    """sqrt by v_rsq_f64 refined with Newton-Raphson (Goldschmidt form) and two residual corrections;
    0, inf, NaN and negative inputs take v_sqrt_f64's answer."""
    half = self.mov64(Imm(0), Imm(0x3FE00000))
    y = self.o("v_rsq_f64", x, size=2)
    g = self.o("v_mul_f64", x, y, size=2)
    h = self.o("v_mul_f64", half, y, size=2)
    r = self.o("v_fma_f64", Neg(g), h, half, size=2)
    g = self.o("v_fma_f64", g, r, g, size=2)
    h = self.o("v_fma_f64", h, r, h, size=2)
    for _ in range(2):
      d = self.o("v_fma_f64", Neg(g), g, x, size=2)
      g = self.o("v_fma_f64", d, h, g, size=2)
    s = self.o("v_sqrt_f64", x, size=2)
    self.e("v_cmp_class_f64", "vcc_lo", x, Imm(CLASS_POSITIVE_FINITE_NONZERO))
    return self.mov64(self.sel(s[0], g[0]), self.sel(s[1], g[1]))

  def fmod(self, ua: UOp, ub: UOp, f64: bool) -> Reg:
    """C fmod: x = |a| is reduced by y = |b| * 2^k (k so that it has x's exponent, one less if that exceeds
    x); each subtraction is exact (Sterbenz lemma), so the loop ends with the exact remainder < |b|. The loop
    runs while any lane still has x >= y (vcc, s_cbranch_vccz). fmod(x, 0), fmod(inf, y) and NaN operands
    give NaN (those lanes skip the loop); the result has a's sign."""
    sfx, size = ("f64", 2) if f64 else ("f32", 1)
    a = self.rpair(ua) if f64 else self.vgpr(self.op32(ua))
    b = self.rpair(ub) if f64 else self.vgpr(self.op32(ub))
    ahi, bhi = (a[1], b[1]) if f64 else (a, b)
    self.e(f"v_cmp_class_{sfx}", "vcc_lo", a, Imm(0x207))     # a is NaN or +-inf
    bad = self.cmp_to_bool()
    self.e(f"v_cmp_class_{sfx}", "vcc_lo", b, Imm(0x063))     # b is NaN or +-0
    bad = self.o("v_or_b32", bad, self.cmp_to_bool())
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), bad)
    xhi = self.sel(self.o("v_and_b32", Imm(0x7FFFFFFF), ahi), Imm(0))    # bad lanes: x = 0 < y, no steps
    x = self.mov64(self.sel(a[0], Imm(0)), xhi) if f64 else xhi
    y = self.mov64(b[0], self.o("v_and_b32", Imm(0x7FFFFFFF), bhi)) if f64 else self.o("v_and_b32", Imm(0x7FFFFFFF), b)
    top, end = self.label("fmod"), self.label("fmodend")
    steps = self.s()   # each step lowers x's exponent: at most (exponent range + mantissa bits) steps
    self.e("s_mov_b32", steps, Imm(2200 if f64 else 300))
    self.put_label(top)
    self.e(f"v_cmp_ge_{sfx}", "vcc_lo", x, y)
    self.e("s_cbranch_vccz", target=end)
    self.e("s_sub_i32", steps, steps, Imm(1))
    self.e("s_cmp_lt_i32", steps, Imm(0))
    self.e("s_cbranch_scc1", target=end)
    k = self.o("v_sub_nc_u32", self.o(f"v_frexp_exp_i32_{sfx}", x), self.o(f"v_frexp_exp_i32_{sfx}", y))
    ys = self.o(f"v_ldexp_{sfx}", y, k, size=size)
    ys1 = self.o(f"v_ldexp_{sfx}", y, self.o("v_add_nc_u32", Imm(-1), k), size=size)
    self.e(f"v_cmp_gt_{sfx}", "vcc_lo", ys, x)
    ys = self.mov64(self.sel(ys[0], ys1[0]), self.sel(ys[1], ys1[1])) if f64 else self.sel(ys, ys1)
    xn = self.o(f"v_add_{sfx}", x, Neg(ys), size=size)
    self.e(f"v_cmp_ge_{sfx}", "vcc_lo", x, y)
    for k in range(size):
      self.e("v_cndmask_b32", x[k] if f64 else x, x[k] if f64 else x, xn[k] if f64 else xn, "vcc_lo")
    self.e("s_branch", target=top)
    self.put_label(end)
    sign = self.o("v_and_b32", imm32(0x80000000), ahi)
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), bad)
    if f64:
      rhi = self.sel(self.o("v_or_b32", x[1], sign), Imm(0x7FF80000))
      return self.mov64(self.sel(x[0], Imm(0)), rhi)
    return self.sel(self.o("v_or_b32", x, sign), Imm(0x7FC00000))

  # ---------------------------------------------------------------- integer division
  def udivmod32(self, n, d) -> tuple[Reg, Reg]:
    """Unsigned 32-bit n / d and n % d (d != 0): z ~ 2^32/d from v_rcp_iflag_f32 (scaled just below 2^32 so
    it never overshoots), one Newton step z += z*(-d*z)/2^32, then q = mulhi(n, z) is short by at most 2,
    fixed by two conditional corrections."""
    f = self.o("v_cvt_f32_u32", d)
    f = self.o("v_rcp_iflag_f32", f)
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
      self.e("v_cmp_ge_u32", "vcc_lo", r, d)
      q, r = self.sel(q, q1), self.sel(r, r1)
    return q, r

  def divmod32(self, op: Ops, a, b, sg: bool, ua: UOp | None, ub: UOp | None):
    """C semantics: truncating; b == 0 gives 0; for signed types b == -1 gives -a (IDIV) or 0 (MOD)."""
    if ub is not None and ub.op is Ops.CONST:
      c = int(ub.arg)
      if c == 0 or (sg and c == -1 and op is Ops.MOD): return self.o("v_mov_b32", Imm(0))
      if sg and c == -1: return self.o("v_sub_nc_u32", Imm(0), a)
      lo, hi = ua.vrange if ua is not None else (None, None)
      small = isinstance(lo, int) and lo >= 0 and hi < (1 << 31)      # 0 <= a < 2^31
      if 0 < c < (1 << 31) and (small or (not sg and c & (c - 1) == 0)):
        if c & (c - 1) == 0:
          k = c.bit_length() - 1
          return self.o("v_lshrrev_b32", Imm(k), a) if op is Ops.IDIV else self.o("v_and_b32", imm32(c - 1), a)
        # n < 2^31, l = ceil(log2 c): m = floor(2^(31+l) / c) + 1 < 2^32 and q = floor(n*m / 2^(31+l))
        l = (c - 1).bit_length()
        m = (1 << (31 + l)) // c + 1
        q = self.o("v_mul_hi_u32", a, imm32(m))
        if l > 1: q = self.o("v_lshrrev_b32", Imm(l - 1), q)
        if op is Ops.IDIV: return q
        return self.o("v_sub_nc_u32", a, self.o("v_mul_lo_u32", q, imm32(c)))
    a = self.vgpr(a) if isinstance(a, Imm) else a
    b = self.vgpr(b) if isinstance(b, Imm) else b
    if sg:
      sa = self.o("v_ashrrev_i32", Imm(31), a)
      sb = self.o("v_ashrrev_i32", Imm(31), b)
      ua = self.o("v_xor_b32", self.o("v_add_nc_u32", a, sa), sa)
      ubb = self.o("v_xor_b32", self.o("v_add_nc_u32", b, sb), sb)
      q, r = self.udivmod32(ua, ubb)
      if op is Ops.IDIV:
        s = self.o("v_xor_b32", sa, sb)
        res = self.o("v_sub_nc_u32", self.o("v_xor_b32", q, s), s)
      else:
        res = self.o("v_sub_nc_u32", self.o("v_xor_b32", r, sa), sa)
    else:
      q, r = self.udivmod32(a, b)
      res = q if op is Ops.IDIV else r
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), b)
    return self.sel(Imm(0), res)

  def divmod64(self, op: Ops, ua: UOp, ub: UOp, sg: bool):
    """64-bit: magnitudes, a 64-step restoring division loop (r = 2r + next bit of n; if r >= d: r -= d,
    set the quotient bit), signs put back; b == 0 gives 0 (b == -1 works out as -a / 0 by itself)."""
    a, b = self.rpair(ua, sg), self.rpair(ub, sg)
    if sg:
      sa = self.o("v_ashrrev_i32", Imm(31), a[1])
      sb = self.o("v_ashrrev_i32", Imm(31), b[1])
      t = self.add64(a[0], a[1], sa, sa)
      n = self.mov64(self.o("v_xor_b32", t[0], sa), self.o("v_xor_b32", t[1], sa))
      t = self.add64(b[0], b[1], sb, sb)
      d = self.mov64(self.o("v_xor_b32", t[0], sb), self.o("v_xor_b32", t[1], sb))
    else:
      n, d = a, b
    q, r = self.mov64(Imm(0), Imm(0)), self.mov64(Imm(0), Imm(0))
    i = self.s()
    self.e("s_mov_b32", i, Imm(63))
    top = self.label("div64")
    self.put_label(top)
    self.e("v_lshlrev_b64", r, Imm(1), r)
    bit = self.o("v_lshrrev_b64", i, n, size=2)
    self.e("v_and_or_b32", r[0], bit[0], Imm(1), r[0])
    rs = self.sub64(r[0], r[1], d[0], d[1])
    self.e("v_cmp_ge_u64", "vcc_lo", r, d)
    self.e("v_cndmask_b32", r[0], r[0], rs[0], "vcc_lo")
    self.e("v_cndmask_b32", r[1], r[1], rs[1], "vcc_lo")
    qb = self.cmp_to_bool()
    self.e("v_lshlrev_b64", q, Imm(1), q)
    self.e("v_or_b32", q[0], q[0], qb)
    self.e("s_sub_i32", i, i, Imm(1))
    self.e("s_cmp_ge_i32", i, Imm(0))
    self.e("s_cbranch_scc1", target=top)
    if sg:
      if op is Ops.IDIV:
        s = self.o("v_xor_b32", sa, sb)
        t = self.mov64(self.o("v_xor_b32", q[0], s), self.o("v_xor_b32", q[1], s))
        res = self.sub64(t[0], t[1], s, s)
      else:
        t = self.mov64(self.o("v_xor_b32", r[0], sa), self.o("v_xor_b32", r[1], sa))
        res = self.sub64(t[0], t[1], sa, sa)
    else:
      res = q if op is Ops.IDIV else r
    self.e("v_cmp_ne_u64", "vcc_lo", Imm(0), b)
    return self.mov64(self.sel(Imm(0), res[0]), self.sel(Imm(0), res[1]))

  # ---------------------------------------------------------------- casts
  def cast_value(self, u: UOp, dst: DType):
    return self.cast(u, dst, None)

  def cast(self, src_u: UOp, dst: DType, u: UOp | None):
    src = src_u.dtype
    x = self.val(src_u)
    if src == dst: return x
    if dst.is_bool:
      if src.is_bool: return x
      if src == F64: self.e("v_cmp_neq_f64", "vcc_lo", Imm(0), self.pair(src_u))          # NaN != 0 is true
      elif src.is_float: self.e("v_cmp_neq_f32", "vcc_lo", Imm(0), self.op32(src_u))
      elif is_wide(src, src_u): self.e("v_cmp_ne_u64", "vcc_lo", Imm(0), self.pair(src_u))
      else: self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), self.op32(src_u))
      return self.cmp_to_bool()
    if src.is_bool:
      self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), self.op32(src_u))
      if dst == F64: return self.mov64(Imm(0), self.sel(Imm(0), Imm(0x3FF00000)))
      if dst.is_float: return self.sel(Imm(0), Imm(0x3F800000))
      one = self.sel(Imm(0), Imm(1))
      return self.mov64(one, Imm(0)) if is_wide(dst, u) else one
    return self.cast_from(x, src, dst, u, src_u)

  def cast_from(self, x, src: DType, dst: DType, u: UOp | None, src_u: UOp | None = None):
    if isinstance(x, Const): x = self.copy_into(None, x, src)   # (symbolic folds constant casts: rare)
    wide_src = isinstance(x, Reg) and x.size == 2
    if src.is_float and dst.is_float:
      if src == F64: return self.round16(self.o("v_cvt_f32_f64", self.pair(x)), dst)
      if dst == F64: return self.o("v_cvt_f64_f32", self.op32(x), size=2)
      return self.round16(self.op32(x), dst)      # float16/bfloat16/float32 are float32 in registers
    if src.is_float:   # -> int: truncate toward zero
      if src == F64: f = self.pair(x)
      else: f = self.op32(x)
      if dst.itemsize == 8:
        r = self.f_to_i64(f, src == F64, signed(dst))
        return r[0] if u is not None and is_narrow(u) else r
      cvt_i, cvt_u = ("v_cvt_i32_f64", "v_cvt_u32_f64") if src == F64 else ("v_cvt_i32_f32", "v_cvt_u32_f32")
      if dst == dtypes.uint32:   # gcc: through a 64-bit signed int, then wrapped: negative values wrap
        return self.f_to_i64(f, src == F64, True)[0]
      # x86's cvttss2si gives 0x80000000 for NaN and out-of-range values (C leaves them undefined; the CPU
      # device does this); v_cvt_i32 saturates, so those lanes are patched
      i = self.o(cvt_i, f)
      lim = self.mov64(Imm(0), Imm(0x41E00000)) if src == F64 else Imm(0x4F000000)     # 2^31
      self.e("v_cmp_gt_f64" if src == F64 else "v_cmp_gt_f32", "vcc_lo", lim, Abs(f))
      i = self.sel(imm32(0x80000000), i)
      return self.narrow(i, dst)
    if dst.is_float:   # int -> float: round to nearest even
      if wide_src:
        if dst == F64: return self.i64_to_f64(self.pair(x), signed(src))
        return self.round16(self.i64_to_f32(self.pair(x), signed(src)), dst)
      sg = signed(src) or src.itemsize < 4 or src.itemsize == 8   # small/narrow values are sign-correct in 32 bits
      if dst == F64: return self.o("v_cvt_f64_i32" if sg else "v_cvt_f64_u32", self.op32(x), size=2)
      return self.round16(self.o("v_cvt_f32_i32" if sg else "v_cvt_f32_u32", self.op32(x)), dst)
    # int -> int: C value conversion (sign- or zero-extend by the source type, or keep the low bits)
    sg_src = signed(src) or src.itemsize < 4 or (src.itemsize == 8 and not wide_src)
    if dst.itemsize == 8:
      if u is not None and is_narrow(u): return self.op32(x)
      if wide_src: return x
      return self.mov64(self.op32(x), self.hi(x, sg_src))
    lo = self.op32(x)
    return self.narrow(lo, dst) if dst.itemsize < 4 else lo

  @staticmethod
  def _narrow_const(v: int, dt: DType) -> int:
    bits = 8 * dt.itemsize
    v &= (1 << bits) - 1
    if signed(dt) and v >> (bits - 1): v -= 1 << bits
    return v & 0xFFFFFFFF

  def f_to_i64(self, f, is_f64: bool, sg: bool) -> Reg:
    """Truncate a float to a 64-bit integer: t = trunc(x) in float64 (exact for float32 inputs),
    hi = floor(t * 2^-32), lo = t - hi * 2^32 (exact), both converted with v_cvt_*_f64."""
    t = self.o("v_trunc_f64", f, size=2) if is_f64 else self.o("v_trunc_f64", self.o("v_cvt_f64_f32", f, size=2), size=2)
    neg = None
    if sg:   # work on |t| and negate at the end (so the high word is floor of a positive value)
      self.e("v_cmp_gt_f64", "vcc_lo", Imm(0), t)
      neg = self.cmp_to_bool()
      t = self.mov64(t[0], self.o("v_and_b32", Imm(0x7FFFFFFF), t[1]))
    scale = self.mov64(Imm(0), Imm(0x3DF00000))        # 2^-32
    h = self.o("v_floor_f64", self.o("v_mul_f64", t, scale, size=2), size=2)
    m = self.mov64(Imm(0), imm32(0xC1F00000))           # -2^32
    lo = self.o("v_fma_f64", h, m, t, size=2)
    r = self.mov64(self.o("v_cvt_u32_f64", lo), self.o("v_cvt_u32_f64", h))
    if sg:
      n = self.sub64(Imm(0), Imm(0), r[0], r[1])
      self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), neg)
      r = self.mov64(self.sel(r[0], n[0]), self.sel(r[1], n[1]))
      # NaN and |x| >= 2^63: x86's cvttsd2si "integer indefinite" 0x8000000000000000, as the CPU device gives
      self.e("v_cmp_gt_f64", "vcc_lo", self.mov64(Imm(0), Imm(0x43E00000)), t)
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
    if sg:
      s = self.o("v_ashrrev_i32", Imm(31), x[1])
      t = self.add64(x[0], x[1], s, s)
      x = self.mov64(self.o("v_xor_b32", t[0], s), self.o("v_xor_b32", t[1], s))
    z = self.o("v_clz_i32_u32", x[1])                      # 32 when the high dword is 0 (-1 never: gfx11 gives 32)
    z = self.o("v_min_u32", Imm(32), z)
    y = self.o("v_lshlrev_b64", z, x, size=2)
    self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), y[0])
    sticky = self.cmp_to_bool()
    top = self.o("v_or_b32", y[1], sticky)
    f = self.o("v_cvt_f32_u32", top)
    f = self.o("v_ldexp_f32", f, self.o("v_sub_nc_u32", Imm(32), z))
    if sg:
      f = self.o("v_xor_b32", f, self.o("v_and_b32", imm32(0x80000000), s))
    return f

  # ---------------------------------------------------------------- bitcasts
  def bitcast(self, src_u: UOp, dst: DType):
    src = src_u.dtype
    if src.itemsize != dst.itemsize:
      raise NotImplementedError(f"AMD renderer: BITCAST {src.name} -> {dst.name} changes the size")
    x = self.val(src_u)
    if src.itemsize == 8:
      if isinstance(x, Const): return Const(x.bits if x.size == 2 else (x.bits | (0xFFFFFFFF << 32 if x.bits >> 31 else 0)), 2, dst.is_float)
      return self.rpair(src_u)
    # to the raw bits first
    if src == F16: bits = self.f32_to_f16_bits(self.op32(x))
    elif src == BF16: bits = self.f32_to_bf16_bits(self.op32(x))
    else: bits = self.op32(x)
    if dst == F16: return self.f16_bits_to_f32(bits)
    if dst == BF16: return self.o("v_lshlrev_b32", Imm(16), bits)
    if dst.is_bool:
      self.e("v_cmp_ne_u32", "vcc_lo", Imm(0), self.o("v_and_b32", Imm(0xFF), bits))
      return self.cmp_to_bool()
    if dst.itemsize < 4:
      if isinstance(bits, Imm): return Const(self._narrow_const(bits.value, dst), 1)
      return self.narrow(bits, dst)
    return bits if not isinstance(bits, Imm) else Const(bits.value & 0xFFFFFFFF, 1)
