"""Decompositions: how to compute an op a target lacks from ops every target has. Each builder takes UOps and
returns the UOp graph of the result; compiler/lower.py decides which target gets which.

- exp2, log2, sin: argument reduction + polynomials. float32 uses float32 arithmetic (sin reduces in float64 for
  accuracy); float16/bfloat16 go through float32.
- floor from trunc; C's fmod exactly, from integer arithmetic on the significands.
- shifts by any amount, as numpy: an amount outside [0, bits) (negative included) gives 0, except a right shift of
  a negative signed value, which gives -1. C makes such a shift undefined behaviour and the hardware takes the
  amount modulo the register width (AMD: `1 << 40` is 256), so every shift whose amount is not known to be in
  range becomes a shift by an amount masked to [0, bits) plus a select.
- float16/bfloat16 <-> float32 conversions as bit operations: round to nearest even, overflow to inf, float16
  subnormals kept; a NaN converted to 16 bits becomes its sign | the quiet NaN (float16 0x7e00; bfloat16 keeps the
  top bits | 0x40), a 16-bit NaN converted to float32 keeps sign and payload.
"""
from __future__ import annotations
import math
import numpy as np
from .uop import UOp, Ops
from .dtype import dtypes, DType

_FMT = {dtypes.float32: (dtypes.int32, 23, 127), dtypes.float64: (dtypes.int64, 52, 1023)}


def _c(x: UOp, v) -> UOp: return UOp.const(x.dtype, v)
def _poly(x: UOp, coeffs: list[float]) -> UOp:
  """Horner: coeffs from the highest power down to the constant term."""
  acc = _c(x, coeffs[0])
  for c in coeffs[1:]: acc = acc * x + _c(x, c)
  return acc


def floor_by_trunc(x: UOp) -> UOp:
  t = UOp(Ops.TRUNC, x.dtype, (x,))
  return (x < t).where(t - _c(x, 1.0), t)


def _floor(x: UOp) -> UOp: return UOp(Ops.FLOOR, x.dtype, (x,))
def _isnan(x: UOp) -> UOp: return x.ne(x)


def exp2(x: UOp) -> UOp:
  dt = x.dtype
  idt, mbits, bias = _FMT[dt]
  lo, hi = -(bias + mbits + 2), bias + 1
  xc = x.maximum(_c(x, lo))
  xc = (xc < _c(x, hi)).where(xc, _c(x, hi))
  n = _floor(xc + _c(x, 0.5))
  f = xc - n
  degree = 7 if dt == dtypes.float32 else 13
  ln2 = math.log(2.0)
  p = _poly(f, [ln2 ** k / math.factorial(k) for k in range(degree, -1, -1)])
  ni = n.cast(idt)
  n1 = UOp(Ops.SHR, idt, (ni, UOp.const(idt, 1)))
  n2 = ni - n1
  def scale(k: UOp) -> UOp: return UOp(Ops.SHL, idt, (k + UOp.const(idt, bias), UOp.const(idt, mbits))).bitcast(dt)
  out = p * scale(n1) * scale(n2)
  return _isnan(x).where(x, out)


def log2(x: UOp) -> UOp:
  dt = x.dtype
  idt, mbits, bias = _FMT[dt]
  small = x < _c(x, 2.0 ** (1 - bias))
  xs = small.where(x * _c(x, 2.0 ** 64), x)
  eadj = small.where(UOp.const(idt, -64), UOp.const(idt, 0))
  bits = xs.bitcast(idt)
  e = (UOp(Ops.SHR, idt, (bits, UOp.const(idt, mbits))) & UOp.const(idt, 2 * bias + 1)) - UOp.const(idt, bias) + eadj
  m = ((bits & UOp.const(idt, (1 << mbits) - 1)) | UOp.const(idt, bias << mbits)).bitcast(dt)
  big = _c(x, math.sqrt(2.0)) < m
  m = big.where(m * _c(x, 0.5), m)
  e = big.where(e + UOp.const(idt, 1), e)
  s = (m - _c(x, 1.0)) * UOp(Ops.RECIP, dt, (m + _c(x, 1.0),))
  s2 = s * s
  terms = 5 if dt == dtypes.float32 else 12
  series = _poly(s2, [1.0 / (2 * k + 1) for k in range(terms - 1, -1, -1)])
  out = e.cast(dt) + _c(x, 2.0 / math.log(2.0)) * s * series
  out = x.ne(_c(x, 0.0)).where(out, _c(x, -math.inf))
  out = (x < _c(x, 0.0)).where(_c(x, math.nan), out)
  out = x.ne(_c(x, math.inf)).where(out, x)
  return _isnan(x).where(x, out)


# pi/2 split so that k*PIO2_HI is exact for |k| < 2^20 (fdlibm's pio2_1 / pio2_1t)
PIO2_HI, PIO2_LO = 1.57079632673412561417e+00, 6.07710050650619224932e-11


def sin64(x: UOp) -> UOp:
  k = _floor(x * _c(x, 2.0 / math.pi) + _c(x, 0.5))
  r = (x - k * _c(x, PIO2_HI)) - k * _c(x, PIO2_LO)
  r2 = r * r
  s = r + r * r2 * _poly(r2, [(-1) ** j / math.factorial(2 * j + 1) for j in range(8, 0, -1)])
  c = _c(x, 1.0) + r2 * _poly(r2, [(-1) ** j / math.factorial(2 * j) for j in range(9, 0, -1)])
  q = k.cast(dtypes.int64) & UOp.const(dtypes.int64, 3)
  odd = (q & UOp.const(dtypes.int64, 1)).ne(UOp.const(dtypes.int64, 0))
  neg = (q & UOp.const(dtypes.int64, 2)).ne(UOp.const(dtypes.int64, 0))
  v = odd.where(c, s)
  v = neg.where(-v, v)
  finite = (x - x).ne(_c(x, 0.0))   # inf - inf and nan are nan
  return finite.where(_c(x, math.nan), v)


def sin(x: UOp) -> UOp:
  if x.dtype == dtypes.float64: return sin64(x)
  return sin64(x.cast(dtypes.float64)).cast(x.dtype)


TRANSCENDENTAL = {Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin}


def transcendental(u: UOp) -> UOp | None:
  """EXP2/LOG2/SIN from ALU ops (16-bit floats through float32)."""
  if not u.dtype.is_float: return None
  if u.dtype not in (dtypes.float32, dtypes.float64):
    return UOp(u.op, dtypes.float32, (u.src[0].cast(dtypes.float32),)).cast(u.dtype)
  return TRANSCENDENTAL[u.op](u.src[0])


# ---------------------------------------------------------------- shifts

def _amount_in_range(amount: UOp, bits: int) -> bool:
  """Is a shift amount known to lie in [0, bits)? (a constant, `x & c` with c < bits, or its value range)"""
  if amount.op is Ops.CONST: return 0 <= amount.arg < bits
  if amount.op is Ops.AND and any(s.op is Ops.CONST and 0 <= s.arg < bits for s in amount.src): return True
  lo, hi = amount.vrange
  return isinstance(lo, int) and isinstance(hi, int) and 0 <= lo and hi < bits


def shift(u: UOp) -> UOp | None:
  """numpy's shift for any amount (see the module doc); the shift that remains has an amount in [0, bits)."""
  a, amount = u.src
  dt = u.dtype
  if dt is None or not dt.is_int or _amount_in_range(amount, dt.bits): return None
  bits = UOp.const(amount.dtype, dt.bits)
  mask = UOp.const(amount.dtype, dt.bits - 1)
  valid = amount < bits
  if not amount.dtype.is_unsigned:   # a negative amount is out of range too (numpy compares it as unsigned)
    valid = (amount < UOp.const(amount.dtype, 0)).where(UOp.const(dtypes.bool, False), valid)
  if u.op is Ops.SHR and not dt.is_unsigned:   # a >> (bits - 1) is -1 for a negative a, 0 otherwise
    return UOp(Ops.SHR, dt, (a, valid.where(amount, mask) & mask))
  return valid.where(UOp(u.op, dt, (a, amount & mask)), UOp.const(dt, 0))


# ---------------------------------------------------------------- fmod

U64, I64, F64 = dtypes.uint64, dtypes.int64, dtypes.float64
# per float type: (bits type, mantissa bits, exponent bits)
_LAYOUT = {dtypes.float32: (dtypes.uint32, 23, 8), dtypes.float64: (U64, 52, 11)}


def _u(v: int, dt: DType = U64) -> UOp: return UOp.const(dt, v)


def _mulmod(a: UOp, b: UOp, m: UOp, exact: bool) -> UOp:
  """(a * b) mod m for uint64 a, b < 2^53 with a * b / m < 2^53, m > 0. `exact`: a * b < 2^64, so the integer
  remainder is the answer. Else q = trunc(a * b / m) in float64 is within 3 of the true quotient (three
  roundings of relative 2^-53 on a quotient below 2^53), so a * b - q * m (wrapping: its true value is small)
  lies in [-3m, 4m) and three corrections each way bring it into [0, m)."""
  if exact: return (a * b) % m
  q = (a.cast(F64) * b.cast(F64) * UOp(Ops.RECIP, F64, (m.cast(F64),))).cast(U64)
  r = (a * b + (q * m).alu(Ops.NEG)).bitcast(I64)
  mi = m.bitcast(I64)
  for _ in range(3): r = (r < _u(0, I64)).where(r + mi, r)
  for _ in range(3): r = (r < mi).where(r, r - mi)
  return r.bitcast(U64)


def fmod(x: UOp, y: UOp, integer_remainder: bool = True) -> UOp:
  """C's fmod, exact, with x's sign: |x| = Mx 2^Ex, |y| = My 2^Ey (integer significands, subnormals with
  exponent 1), so for |x| >= |y| the remainder is (Mx 2^(Ex-Ey) mod My) 2^Ey. 2^(Ex-Ey) mod My comes from
  square-and-multiply over the bits of Ex-Ey (mulmod above). fmod(x, 0), fmod(inf, y) and NaN operands give
  NaN; |x| < |y| gives x. `integer_remainder=False`: mulmod by float64 quotients even where a 64-bit integer
  remainder would do (float32), for targets whose 64-bit MOD is slow."""
  dt = x.dtype
  ut, mbits, ebits = _LAYOUT[dt]
  sign = _u(1 << (dt.bits - 1), ut)
  xb, yb = x.bitcast(ut), y.bitcast(ut)
  ax, ay = xb & _u((1 << (dt.bits - 1)) - 1, ut), yb & _u((1 << (dt.bits - 1)) - 1, ut)

  def unpack(a: UOp) -> tuple[UOp, UOp]:
    e = UOp(Ops.SHR, ut, (a, _u(mbits, ut)))
    m = a & _u((1 << mbits) - 1, ut)
    normal = e.ne(_u(0, ut))
    return normal.where(m | _u(1 << mbits, ut), m).cast(U64), normal.where(e, _u(1, ut))
  mx, ex = unpack(ax)
  my, ey = unpack(ay)
  k = ex + ey.alu(Ops.NEG)        # >= 0 where it is used (|x| >= |y|)
  exact = integer_remainder and 2 * (mbits + 1) <= 64
  t = _u(1)
  for j in reversed(range(ebits)):   # Ex - Ey < 2^ebits
    t = _mulmod(t, t, my, exact)
    double = t + t
    double = (double < my).where(double, double + my.alu(Ops.NEG))
    bit = (UOp(Ops.SHR, ut, (k, _u(j, ut))) & _u(1, ut)).ne(_u(0, ut))
    t = bit.where(double, t)
  r = _mulmod(mx, t, my, exact)
  # r 2^Ey as a float: r < 2^(mbits+1) converts exactly; both scalings are exact (the result is representable)
  mag = r.cast(dt) * _c(x, 2.0 ** -mbits) * UOp(Ops.SHL, ut, (ey, _u(mbits, ut))).bitcast(dt)
  out = (mag.bitcast(ut) | (xb & sign)).bitcast(dt)
  inf = _u(((1 << ebits) - 1) << mbits, ut)
  nan = ay.ne(_u(0, ut)).where((ax < inf).where(inf < ay, UOp.const(dtypes.bool, True)), UOp.const(dtypes.bool, True))
  return nan.where(_c(x, math.nan), (ax < ay).where(x, out))


# ---------------------------------------------------------------- float16 / bfloat16 bits <-> float32

U16, U32, F32 = dtypes.uint16, dtypes.uint32, dtypes.float32


def _f16_bits(v: float) -> int:
  if math.isnan(v): return (0x8000 if math.copysign(1.0, v) < 0 else 0) | 0x7e00
  return int(np.array(v, np.float16).view(np.uint16))


def _bf16_bits(v: float) -> int:
  b = int(np.array(v, np.float32).view(np.uint32))
  if (b & 0x7fffffff) > 0x7f800000: return (b >> 16) | 0x40
  return (b + 0x7fff + ((b >> 16) & 1)) >> 16


def bits16(v: float, dt: DType) -> int:
  """The storage bits of a float16/bfloat16 constant (as the conversions below give them)."""
  return _f16_bits(v) if dt == dtypes.float16 else _bf16_bits(v)


def f32_to_f16_bits(x: UOp) -> UOp:
  """float32 -> float16 bits (uint16)."""
  if x.op is Ops.CONST: return _u(_f16_bits(x.arg), U16)
  b = x.bitcast(U32)
  s = UOp(Ops.SHR, U32, (b, _u(16, U32))) & _u(0x8000, U32)
  a = b & _u(0x7fffffff, U32)
  # normal: drop 13 mantissa bits with round-to-nearest-even (the carry may reach the exponent) and rebias 127 -> 15
  lsb = UOp(Ops.SHR, U32, (a, _u(13, U32))) & _u(1, U32)
  normal = UOp(Ops.SHR, U32, (a + _u((1 << 32) - (112 << 23) + 0xfff, U32) + lsb, _u(13, U32)))
  # below 2^-14: a float16 subnormal q = significand >> (126 - exponent), rounded to nearest even
  e = UOp(Ops.SHR, U32, (a, _u(23, U32)))
  sig = (a & _u(0x7fffff, U32)) | _u(0x800000, U32)
  n = (_u(126, U32) + e.alu(Ops.NEG))
  n = (n < _u(31, U32)).where(n, _u(31, U32))
  q = UOp(Ops.SHR, U32, (sig, n))
  rest = sig & (UOp(Ops.SHL, U32, (_u(1, U32), n)) + _u(0xffffffff, U32))
  half = UOp(Ops.SHL, U32, (_u(1, U32), n + _u(0xffffffff, U32)))
  tie = rest.ne(half).alu(Ops.XOR, UOp.const(dtypes.bool, True))
  up = (half < rest) | (tie & (q & _u(1, U32)).ne(_u(0, U32)))
  sub = q + up.where(_u(1, U32), _u(0, U32))
  h = (a < _u(0x38800000, U32)).where(sub, normal)
  h = (a < _u(0x477ff000, U32)).where(h, _u(0x7c00, U32))
  h = (_u(0x7f800000, U32) < a).where(_u(0x7e00, U32), h)
  return (h | s).cast(U16)


def f16_bits_to_f32(h: UOp) -> UOp:
  """float16 bits (uint16) -> float32, exact."""
  if h.op is Ops.CONST: return UOp.const(F32, float(np.array(h.arg, np.uint16).view(np.float16)))
  w = h.cast(U32)
  s = UOp(Ops.SHL, U32, (w & _u(0x8000, U32), _u(16, U32)))
  e = UOp(Ops.SHR, U32, (w, _u(10, U32))) & _u(0x1f, U32)
  m = w & _u(0x3ff, U32)
  exp = e.ne(_u(0x1f, U32)).where(e + _u(112, U32), _u(0xff, U32))   # inf and NaN keep the payload
  normal = UOp(Ops.SHL, U32, (exp, _u(23, U32))) | UOp(Ops.SHL, U32, (m, _u(13, U32)))
  sub = (m.cast(F32) * UOp.const(F32, 2.0 ** -24)).bitcast(U32)    # m 2^-24: exact
  return (e.ne(_u(0, U32)).where(normal, sub) | s).bitcast(F32)


def f32_to_bf16_bits(x: UOp) -> UOp:
  """float32 -> bfloat16 bits (uint16): round to nearest even on the top 16 bits; NaN -> top bits | 0x40."""
  if x.op is Ops.CONST: return _u(_bf16_bits(x.arg), U16)
  b = x.bitcast(U32)
  top = UOp(Ops.SHR, U32, (b, _u(16, U32)))
  rounded = UOp(Ops.SHR, U32, (b + _u(0x7fff, U32) + (top & _u(1, U32)), _u(16, U32)))
  nan = _u(0x7f800000, U32) < (b & _u(0x7fffffff, U32))
  return nan.where(top | _u(0x40, U32), rounded).cast(U16)


def bf16_bits_to_f32(h: UOp) -> UOp:
  if h.op is Ops.CONST: return UOp.const(F32, float(np.array(h.arg << 16, np.uint32).view(np.float32)))
  return UOp(Ops.SHL, U32, (h.cast(U32), _u(16, U32))).bitcast(F32)


TO_BITS = {dtypes.float16: f32_to_f16_bits, dtypes.bfloat16: f32_to_bf16_bits}
FROM_BITS = {dtypes.float16: f16_bits_to_f32, dtypes.bfloat16: bf16_bits_to_f32}
