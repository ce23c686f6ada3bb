"""Decompositions of ops a target lacks: exp2, log2 and sin by argument reduction + polynomials; and shifts
by any amount.

Built from ADD/MUL/CMPLT/WHERE/TRUNC/CAST/BITCAST/shifts only, so any target that has those can run them.
float32 uses float32 arithmetic (sin reduces in float64 for accuracy); float16/bfloat16 go through float32.

Shifts follow numpy, whose `a << b` and `a >> b` are defined for every amount: an amount outside [0, bits)
(negative included) gives 0, except a right shift of a negative signed value, which gives -1. C makes such a
shift undefined behaviour, and the hardware takes the amount modulo the register width (AMD: `1 << 40` is
256), so every SHL/SHR whose amount is not known to be in range is rewritten here, once for all targets,
into a shift by an amount masked to [0, bits) plus a select.
"""
from __future__ import annotations
import math
from .uop import UOp, Ops
from .dtype import dtypes, DType
from .pattern import UPat, PatternMatcher

_FMT = {dtypes.float32: (dtypes.int32, 23, 127), dtypes.float64: (dtypes.int64, 52, 1023)}


def _c(x: UOp, v) -> UOp: return UOp.const(x.dtype, v)
def _poly(x: UOp, coeffs: list[float]) -> UOp:
  """Horner: coeffs from the highest power down to the constant term."""
  acc = _c(x, coeffs[0])
  for c in coeffs[1:]: acc = acc * x + _c(x, c)
  return acc


def _floor(x: UOp) -> UOp:
  t = UOp(Ops.TRUNC, x.dtype, (x,))
  return (x < t).where(t - _c(x, 1.0), t)


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


_IMPL = {Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin}


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


def _decompose(u: UOp, ctx) -> UOp | None:
  if u.op in ctx or not u.dtype.is_float: return None
  if u.dtype not in (dtypes.float32, dtypes.float64):
    return UOp(u.op, dtypes.float32, (u.src[0].cast(dtypes.float32),)).cast(u.dtype)
  return _IMPL[u.op](u.src[0])


def decompositions() -> PatternMatcher:
  """Rewrite EXP2/LOG2/SIN into ALU ops (`ctx` is the set of ops the target supports natively) and shifts whose
  amount may be out of range into numpy's defined result (on every target: none defines them that way)."""
  return PatternMatcher([(UPat((Ops.EXP2, Ops.LOG2, Ops.SIN), name="u"), _decompose),
                         (UPat((Ops.SHL, Ops.SHR), name="u"), shift)])
