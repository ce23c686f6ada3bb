"""RDNA3 float arithmetic where numpy's one-operation rounding is not what the hardware does: fused multiply-add
with a single rounding, the transcendentals (denormals flushed where the guide says so; correctly rounded, see
nearest_f32), the division helpers v_div_scale / v_div_fmas / v_div_fixup, and the exactly rounded sums of products
of the matrix instructions (matrix_sum; the PTX interpreter's mma uses them too). Pure numpy functions over arrays;
rdna3_valu.py wires them to opcodes.

Sources: AMD "RDNA3 Instruction Set Architecture" reference guide, 16.8 "VOP1 Instructions" (accuracy notes of
V_RCP_F32 & co) and 16.12 "VOP3 & VOP3SD Instructions" (V_FMA_*, V_DIV_SCALE_*, V_DIV_FMAS_*, V_DIV_FIXUP_*
pseudocode); LLVM SIISelLowering::LowerFDIV32/LowerFDIV64 (the division macro these three instructions exist for).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

F16, F32, F64, U64, I64 = np.float16, np.float32, np.float64, np.uint64, np.int64


def _pick(cond, a, b):
  """np.where on the bits (NaN payloads kept)."""
  a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
  u = {2: np.uint16, 4: np.uint32, 8: U64}[a.dtype.itemsize]
  return np.where(cond, a.view(u), b.view(u)).view(a.dtype)


# ---------------------------------------------------------------- fused multiply-add, one rounding

def _two_sum(a, b):
  """s = RN(a + b) and the exact error e = (a + b) - s (Knuth's TwoSum; exact barring overflow)."""
  s = a + b
  bb = s - a
  return s, (a - (s - bb)) + (b - bb)


def _round_to_odd(s, err):
  """s = RN(x), err = x - s exactly: RO(x), the neighbour of x with an odd last bit when x is inexact. Rounding
  RO(x) to a format at least 2 bits narrower is then the single rounding of x (Boldo & Melquiond, "Emulation of
  FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008)."""
  bits = s.view(I64)
  fix = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)
  step = np.where((s > 0) == (err > 0), 1, -1)          # toward x: a larger magnitude when err has s's sign
  return np.where(fix, bits + step, bits).view(F64)


def fma(a, b, c):
  """a * b + c rounded once to the operands' type ("0.5ULP accuracy" of V_FMA_F32/F64/F16, 16.12).
  float16/float32: the product is exact in float64, so only the float64 sum rounds before the final rounding; that
  double rounding errs only where the sum lands exactly on a tie of the type (its low 28 bits zero), and there the
  sum is rounded to odd instead. float64: exact product as two doubles (Dekker), sum by TwoSum, the low parts
  rounded to odd, one final rounding (Boldo & Melquiond 2008); lanes outside the range where that is exact are
  computed with exact rationals."""
  a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
  dt = np.result_type(a, b, c).type
  if dt == F64: return _fma64(*np.broadcast_arrays(a.astype(F64), b.astype(F64), c.astype(F64)))
  with np.errstate(all="ignore"):
    p, c64 = a.astype(F64) * b.astype(F64), c.astype(F64)
    s = np.asarray(p + c64)
    tie = (s.view(U64) & U64(0x0FFFFFFF)) == 0
    if tie.any():
      p, c64 = np.broadcast_to(p, s.shape), np.broadcast_to(c64, s.shape)
      s[tie] = _round_to_odd(*_two_sum(p[tie], c64[tie]))
    return s.astype(dt)


def fma_exact_scaled(a, b, c, scale):
  """RN((a * b + c) * 2**scale) for float32 operands: one rounding after the exponent adjustment."""
  with np.errstate(all="ignore"):
    p = a.astype(F64) * b.astype(F64)
    s, err = _two_sum(p, c.astype(F64))
    return (_round_to_odd(s, err) * np.ldexp(F64(1), scale)).astype(F32)      # exact scaling in float64


def _split(x):
  t = x * F64(134217729.0)                                # 2**27 + 1 (Veltkamp)
  hi = t - (t - x)
  return hi, x - hi


def _fma64(a, b, c, scale=None):
  with np.errstate(all="ignore"):
    uh = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl      # a * b = uh + ul exactly (Dekker)
    th, tl = _two_sum(c, uh)
    v = _round_to_odd(*_two_sum(tl, ul))
    z = th + v
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    zero_product = (a == 0) | (b == 0)
    big = F64(2.0 ** 995)
    safe = finite & (np.abs(a) < big) & (np.abs(b) < big) & (np.abs(c) < big) & \
      ((np.abs(uh) > F64(2.0 ** -960)) | zero_product)
    # inf/NaN operands and exact zero products: the plain expression is exact and keeps IEEE's signs
    z = np.where(finite & ~zero_product, z, a * b + c)
  if scale is not None: safe = np.zeros_like(safe)          # scaled results are rare: exact rationals
  if (finite & ~safe).any():
    z = z.copy()
    for i in zip(*np.nonzero(finite & ~safe)):
      z[i] = _exact_fma64(float(a[i]), float(b[i]), float(c[i]), 0 if scale is None else int(scale[i]))
  return z


def _exact_fma64(a: float, b: float, c: float, scale: int = 0) -> float:
  exact = (Fraction(a) * Fraction(b) + Fraction(c)) * Fraction(2) ** scale
  if exact == 0:     # an exact zero sum is +0 in round to nearest, unless both terms are -0
    p = a * b
    return -0.0 if p == 0 and c == 0 and np.signbit(p) and np.signbit(c) else 0.0
  try: return float(exact)                                   # int / int true division: correctly rounded
  except OverflowError: return float("inf") if exact > 0 else float("-inf")


def fma64_scaled(a, b, c, scale):
  """RN((a * b + c) * 2**scale) for float64 operands, one rounding (scale: per-lane int array)."""
  return _fma64(a, b, c, np.asarray(scale))


# ---------------------------------------------------------------- transcendentals

def flushed(x):
  """Denormals replaced by a zero of the same sign (NaN bits kept)."""
  x = np.asarray(x)
  with np.errstate(invalid="ignore"):
    tiny = (x != 0) & (np.abs(x) < np.finfo(x.dtype).tiny)
  return _pick(tiny, np.copysign(np.zeros_like(x), x), x)


def nearest_f32(approx):
  """The float32 result of V_RCP_F32, V_RSQ_F32, V_SQRT_F32, V_EXP_F32 and V_LOG_F32: correctly rounded from the
  float64 value (correctly rounded there for rcp and sqrt). The guide documents "1ULP accuracy" (and "(2**29)ULP"
  for V_RCP_F64 & co, 16.8), but a model that uses that slack makes LLVM's own IEEE division sequences
  (SIISelLowering::LowerFDIV32/64) misround classic cases such as 1 / (1 - 2**-24) and 1 / (1 - 2**-53): an
  estimate of exactly 1.0 is a fixed point of their Newton step (the correction lands on a tie), and a 2**-24
  error leaves the reciprocal 2**-96 off where 1/b is 2**-106 from a tie. AMD's compilers ship those sequences
  as correctly rounded division, so the hardware's estimates are the correctly rounded ones there; the emulator
  does not claim worse, and computes every estimate correctly rounded."""
  with np.errstate(all="ignore"): return approx.astype(F32)


def rcp_f32(a):
  x = flushed(a).astype(F64)
  with np.errstate(all="ignore"): return flushed(nearest_f32(1.0 / x))


def _domain_nan(x, result):
  """A negative operand of V_SQRT/V_RSQ/V_LOG gives the negative quiet NaN 0xFFC00000 (the guide's functional
  examples, 16.8): set explicitly, as libm's and numpy's NaN sign for these differs by version and CPU."""
  with np.errstate(invalid="ignore"): neg = x < 0
  return _pick(neg, np.full_like(result, np.array(0xFFC00000, np.uint32).view(F32)), result)


def rsq_f32(a):
  x = flushed(a).astype(F64)
  with np.errstate(all="ignore"): return _domain_nan(x, flushed(nearest_f32(1.0 / np.sqrt(x))))


def sqrt_f32(a):
  x = flushed(a).astype(F64)
  with np.errstate(all="ignore"): return _domain_nan(x, flushed(nearest_f32(np.sqrt(x))))


def exp_f32(a):
  x = flushed(a).astype(F64)
  with np.errstate(all="ignore"): return flushed(nearest_f32(np.exp2(x)))


def log_f32(a):
  x = flushed(a).astype(F64)
  with np.errstate(all="ignore"): return _domain_nan(x, flushed(nearest_f32(np.log2(x))))


def rcp_iflag_f32(a):
  """V_RCP_IFLAG_F32 is V_RCP_F32 for integer division macros (only the exceptions differ, 16.8); no denormal
  flushing is documented for it."""
  with np.errstate(all="ignore"): return nearest_f32(1.0 / np.asarray(a).astype(F64))


def rcp_f64(a):
  with np.errstate(all="ignore"): return F64(1) / a


def rsq_f64(a):
  with np.errstate(all="ignore"): return F64(1) / np.sqrt(a)


def sqrt_f64(a):
  with np.errstate(all="ignore"): return np.sqrt(a)


# ---------------------------------------------------------------- division helpers

class Layout:
  def __init__(self, dt, exp_bits, mant_bits):
    self.dt, self.uint = dt, {F16: np.uint16, F32: np.uint32, F64: U64}[dt]
    self.exp_bits, self.mant, self.bias = exp_bits, mant_bits, (1 << (exp_bits - 1)) - 1
    self.tiny = np.finfo(dt).tiny

  def exponent(self, x):
    """The biased exponent field (the pseudocode's exponent())."""
    return ((np.asarray(x).view(self.uint) >> self.uint(self.mant)) & self.uint((1 << self.exp_bits) - 1)).astype(I64)

  def denormal(self, x):
    with np.errstate(invalid="ignore"): return (x != 0) & (np.abs(x) < self.tiny)


LAYOUT = {F16: Layout(F16, 5, 10), F32: Layout(F32, 8, 23), F64: Layout(F64, 11, 52)}


def div_scale(s0, s1, s2):
  """V_DIV_SCALE_F32/F64 (16.12): (D0, VCC) of S0 = the value to scale, S1 = denominator, S2 = numerator, following
  the guide's pseudocode branch by branch, read where it is not literal as the division macro it serves needs:
    - D0 keeps S0 where no branch assigns it ("scale the first input ... if required");
    - `1.0 / 64'F(S1) == DENORM.f64` is "1/S1 is below the type's smallest normal" (|S1| > 2**126 for float32:
      taken literally in float64 it never holds for a float32 S1, and V_RCP_F32 flushes such reciprocals to 0);
    - when both 1/S1 and S2/S1 are denormal the denominator is scaled by 2**-64 (2**-128), as in the branch for
      a denormal 1/S1 alone: scaled up (the literal +64) its reciprocal would flush to 0.
  With these readings LLVM's division macro (SIISelLowering::LowerFDIV32/64) returns the correctly rounded
  quotient for every pair of operands, denormals and the exponent extremes included (tests/emu)."""
  dt = np.result_type(s0, s1, s2).type
  L = LAYOUT[dt]
  big, k, tiny_num = (96, 64, 23) if dt == F32 else (768, 128, 53)
  s0, s1, s2 = np.broadcast_arrays(np.asarray(s0, dt), np.asarray(s1, dt), np.asarray(s2, dt))
  e1, e2 = L.exponent(s1), L.exponent(s2)
  with np.errstate(all="ignore"):
    inv_denormal = np.abs(s1.astype(F64)) > F64(2.0) ** (L.bias - 1)
    quotient = (s2.astype(F64) / s1.astype(F64)).astype(dt) if dt == F32 else s2 / s1
    q_denormal = L.denormal(quotient)
    up, down = np.ldexp(s0, k).astype(dt), np.ldexp(s0, -k).astype(dt)
  cases = [  # (condition, D0 or None to keep S0, VCC), first match wins
    ((s2 == 0) | (s1 == 0), np.full_like(s0, np.nan), False),
    (e2 - e1 >= big, np.where(s0 == s1, up, s0), True),       # N/D near the largest float: scale the denominator
    (L.denormal(s1), up, False),
    (inv_denormal & q_denormal, np.where(s0 == s1, down, s0), True),
    (inv_denormal, down, False),
    (q_denormal, np.where(s0 == s2, up, s0), True),           # only scale the numerator
    (e2 <= tiny_num, up, False),                               # numerator is tiny
  ]
  d, vcc, taken = s0.copy(), np.zeros(s0.shape, bool), np.zeros(s0.shape, bool)
  for cond, value, flag in cases:
    hit = cond & ~taken
    d = _pick(hit, value, d)
    vcc |= hit & flag
    taken |= hit
  return d, vcc


def div_fmas(a, b, c, vcc):
  """V_DIV_FMAS_F32/F64 (16.12): fma(S0, S1, S2), where VCC is set scaled by 2**64 (2**128) when S2 >= 2.0
  (exponent(S2) > bias) and by 2**-64 (2**-128) otherwise, rounded once. The guide's pseudocode writes a fixed
  2.0F ** 32 (2.0 ** 64), which cannot undo V_DIV_SCALE's 2**64 (2**128) scaling; the direction follows which
  operand V_DIV_SCALE scaled: a scaled denominator leaves a large quotient, a scaled numerator a small one."""
  dt = np.result_type(a, b, c).type
  L = LAYOUT[dt]
  k = 64 if dt == F32 else 128
  a, b, c, vcc = np.broadcast_arrays(np.asarray(a, dt), np.asarray(b, dt), np.asarray(c, dt), np.asarray(vcc, bool))
  plain = fma(a, b, c)
  if not vcc.any(): return plain
  scale = np.where(L.exponent(c) > L.bias, k, -k)
  if dt == F32: scaled = fma_exact_scaled(a, b, c, scale)
  else:
    scaled = plain.copy()
    idx = np.nonzero(vcc)
    scaled[idx] = fma64_scaled(a[idx], b[idx], c[idx], scale[idx])
  return _pick(vcc, scaled, plain)


def div_fixup(q, d, n):
  """V_DIV_FIXUP_F16/F32/F64 (16.12): S0 = quotient, S1 = denominator, S2 = numerator, the guide's pseudocode
  case by case. Where it leaves constants undefined: UNDERFLOW (the true quotient is below 2**-150, 2**-1075) is
  the correctly rounded +-0, and a NaN quotient from the macro's FMA chain (it overflowed: inf - inf) becomes the
  signed infinity, which is what the IEEE quotient is then; the OVERFLOW branch (exponent(S1) all ones) is
  unreachable after the inf and NaN cases."""
  dt = np.result_type(q, d, n).type
  L = LAYOUT[dt]
  q, d, n = np.broadcast_arrays(np.asarray(q, dt), np.asarray(d, dt), np.asarray(n, dt))
  neg = np.signbit(d) ^ np.signbit(n)
  signed = lambda v: np.where(neg, -np.abs(v), np.abs(v)).astype(dt)
  quiet = lambda x: (x.view(L.uint) | L.uint(1 << (L.mant - 1))).view(dt)
  inf, zero, default_nan = signed(np.full_like(q, np.inf)), signed(np.zeros_like(q)), np.full_like(q, np.nan)
  default_nan = (default_nan.view(L.uint) | L.uint(1 << (L.mant + L.exp_bits))).view(dt)      # 0xffc00000
  with np.errstate(invalid="ignore"):
    cases = [
      (np.isnan(n), quiet(n)),
      (np.isnan(d), quiet(d)),
      ((d == 0) & (n == 0), default_nan),
      (np.isinf(d) & np.isinf(n), default_nan),
      ((d == 0) | np.isinf(n), inf),
      (np.isinf(d) | (n == 0), zero),
    ]
    if dt != F16:      # V_DIV_FIXUP_F16 has neither case
      cases.append((L.exponent(n) - L.exponent(d) < (-150 if dt == F32 else -1075), zero))
      cases.append((np.isnan(q), inf))
  out, taken = signed(q), np.zeros(q.shape, bool)
  for cond, value in cases:
    hit = cond & ~taken
    out = _pick(hit, value, out)
    taken |= hit
  return out


# ---------------------------------------------------------------- matrix multiply-accumulate: one rounding

def matrix_sum(terms):
  """The accumulation rule of the emulated tensor-core instructions (v_wmma_*_f16/bf16 here, PTX mma.sync in
  ptx_exec.py): each element of D is the EXACT sum of its K products and C, rounded once. Neither vendor documents
  an order or an intermediate precision (RDNA3 ISA guide, "Wave Matrix Multiply Accumulate"; PTX ISA, "mma"), so
  the emulator takes the mathematically exact one: every product of two float16/bfloat16 values is exact in
  float32 (and float64), and no partial sum is rounded.

  terms: float64 array (n, ...): the n terms of each sum along the FIRST axis, every one finite with at most 24
  significant bits (a float32 C, or the product of two float16/bfloat16 values) or inf/NaN. Returns a float64 array
  (...) from which one rounding to nearest even to float32, float16 or bfloat16 (round_matrix_sum) is the correctly
  rounded exact sum: the exact sum where float64 holds it, else the sum rounded to odd at 33 bits or more (Boldo &
  Melquiond 2008, see _round_to_odd). Sums with an inf or NaN term are their IEEE float64 sum (inf - inf is NaN). An
  exact zero is -0 only when every term is -0 (IEEE 754-2008, 6.3, as a chain of additions gives it).

  Fast path: the float64 sum taken term by term with TwoSum is exact when no step has an error; the sums where one
  does are redone exactly in 32-bit limbs of int64 (a Kulisch accumulator)."""
  t = np.asarray(terms, F64)
  n, shape = t.shape[0], t.shape[1:]
  t = np.ascontiguousarray(t.reshape(n, -1))
  with np.errstate(all="ignore"):
    s = t[0].copy()
    inexact = np.zeros(t.shape[1], bool)
    nxt, bb, err = np.empty_like(s), np.empty_like(s), np.empty_like(s)
    for k in range(1, n):                                  # TwoSum (Knuth) in place: nxt + err == s + t[k] exactly
      np.add(s, t[k], out=nxt)
      np.subtract(nxt, s, out=bb)
      np.subtract(nxt, bb, out=err)
      np.subtract(s, err, out=err)
      np.subtract(t[k], bb, out=bb)
      err += bb
      inexact |= err != 0                                  # a NaN error (inf terms) counts as inexact too
      s, nxt = nxt, s
    slow = inexact & np.isfinite(s)          # a finite float64 sum means finite terms (else s is the IEEE inf/NaN)
  if slow.any(): s[slow] = _limb_sum(t[:, slow].T)
  return s.reshape(shape)


def _bit_length64(x):
  """Bit length of uint64 values (exact: each 32-bit half converts to float64 without rounding)."""
  hi, lo = (x >> U64(32)).astype(F64), (x & U64(0xFFFFFFFF)).astype(F64)
  return np.where(hi > 0, np.frexp(hi)[1] + 32, np.frexp(lo)[1]).astype(I64)


def _carry(acc):
  """Limbs 0..n-2 into [0, 2**32) (two's complement: the last limb keeps the sign)."""
  for j in range(acc.shape[1] - 1):
    c = acc[:, j] >> 32                                    # arithmetic shift: floor division by 2**32
    acc[:, j] &= 0xFFFFFFFF
    acc[:, j + 1] += c


def _limb_sum(t):
  """Exact sums of the rows of t (finite, <= 24 significant bits each) as float64 values rounded to odd."""
  rows, n = np.arange(len(t)), t.shape[1]
  mant, ex = np.frexp(t)
  m = (mant * F64(1 << 24)).astype(I64)                    # t = m * 2**e exactly, |m| < 2**24
  e = ex.astype(I64) - 24
  nz = m != 0
  base = int(e[nz].min()) - 32                             # limb 0 stays zero: the top limb is never limb 0
  nl = (int(e[nz].max()) + 24 + n.bit_length() - base) // 32 + 2
  pos = np.where(nz, e - base, 32)
  limb, shift = pos >> 5, pos & 31
  mag = np.abs(m) << shift                                 # < 2**55
  sign = np.sign(m)
  lo, hi = (mag & 0xFFFFFFFF) * sign, (mag >> 32) * sign
  acc = np.zeros((len(t), nl), I64)
  for k in range(n):                                       # one term per row at a time: no repeated index
    acc[rows, limb[:, k]] += lo[:, k]
    acc[rows, limb[:, k] + 1] += hi[:, k]
  _carry(acc)
  neg = acc[:, -1] < 0
  if neg.any():
    acc[neg] = -acc[neg]
    _carry(acc)
  nonzero = acc != 0
  top = nl - 1 - np.argmax(nonzero[:, ::-1], axis=1)      # the highest nonzero limb (>= 1 unless the sum is 0)
  zero = ~nonzero.any(axis=1)
  top = np.where(zero, 1, top)
  w = (acc[rows, top].astype(U64) << U64(32)) | acc[rows, top - 1].astype(U64)
  below = np.cumsum(nonzero, axis=1)
  sticky = np.where(top >= 2, below[rows, np.maximum(top - 2, 0)] > 0, False)
  drop = np.maximum(_bit_length64(w) - 53, 0).astype(U64)  # keep at most 53 bits (>= 33: the top limb is nonzero)
  sticky |= (w & ((U64(1) << drop) - U64(1))) != 0
  w = (w >> drop) | sticky.astype(U64)                     # the dropped bits jammed into the last bit: round to odd
  value = np.ldexp(w.astype(F64), (base + 32 * (top - 1) + drop.astype(I64)).astype(np.int32))
  value = np.where(neg, -value, value)
  return np.where(zero, F64(0), value)


def round_matrix_sum(s, out: str):
  """matrix_sum's float64 carrier rounded to nearest even once: float32 / float16 arrays, or bfloat16 bits (uint16;
  bfloat16 from float32 rounded to odd, 24 >= 8 + 2 bits)."""
  s = np.asarray(s, F64)
  with np.errstate(all="ignore"):
    if out == "f32": return s.astype(F32)
    if out == "f16": return s.astype(F16)                 # numpy converts float64 -> float16 in one rounding
    if out != "bf16": raise ValueError(out)
    r = s.astype(F32)
    bits = r.view(np.uint32)
    inexact = np.isfinite(r) & (r.astype(F64) != s)
    toward = np.where((r.astype(F64) < s) != np.signbit(r), 1, -1).astype(np.int64)   # one step toward s
    odd = np.where(inexact & ((bits & 1) == 0), (bits.astype(np.int64) + toward).astype(np.uint32), bits)
    nan = np.isnan(s)
    rounded = ((odd.astype(np.uint64) + 0x7FFF + ((odd >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, (odd >> 16).astype(np.uint16) | np.uint16(0x40), rounded)
