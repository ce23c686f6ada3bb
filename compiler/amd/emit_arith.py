"""The AMD renderer's arithmetic: the ALU ops by value class (the BINARY/UNARY tables), what RDNA3 has no
instruction for spelled out (float division and square root refined from the hardware estimates, 32- and 64-bit
integer division, 64-bit integer add/multiply/max), selects, and conversions between dtypes. A mixin of
compiler/render_amd.py's _Renderer (its registers, values and code list)."""
from __future__ import annotations
from ..uop import UOp, Ops
from ..dtype import DType
from .inst import Reg, Imm, Neg, Abs, VCC_LO
from .common import F16, F32, F64, CLASS_FINITE_NONZERO, CLASS_POSITIVE_FINITE_NONZERO, Const, imm32, is_narrow, is_wide, signed, value_class, _narrow_const


class ArithEmitter:
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


# binary ALU ops per value class: "v_*" is one instruction d = op(a, b) (a "*rev*" shift takes the amount first;
# "v_cmp_*" sets vcc and gives 0/1), any other name an emitter method of the renderer
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
