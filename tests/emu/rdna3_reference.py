"""Reference semantics of RDNA3 VALU float instructions at the edges, written from AMD's "RDNA3 Instruction Set
Architecture Reference Guide" (section 16.7 "VOP2 Instructions", 16.8 "VOP1 Instructions", 16.9 "VOPC
Instructions", 16.12 "VOP3 & VOP3SD Instructions") with Python floats, exact rationals and numpy; nothing here
imports the emulator. Values travel as raw bit patterns (Python ints), so NaN payloads and signalling NaNs stay
exact, and every function follows the guide's pseudocode step by step."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np


class Fmt(NamedTuple):
  bits: int
  mant: int                 # explicit mantissa bits
  float_t: type
  uint_t: type


FORMATS = {"f16": Fmt(16, 10, np.float16, np.uint16), "f32": Fmt(32, 23, np.float32, np.uint32),
           "f64": Fmt(64, 52, np.float64, np.uint64)}

# 16 edge values per format: +-0, +-1-ish normals, the smallest denormal and -(largest denormal), the smallest
# normal and -(largest normal), +-inf, a quiet NaN, a negative quiet NaN with a payload, a signalling NaN, a
# negative signalling NaN with a payload, 2.5 and -3.0 (ties and integers for the rounding ops)
SPECIALS = {
  "f32": [0x00000000, 0x80000000, 0x3F800000, 0xBFC00000, 0x00000001, 0x807FFFFF, 0x00800000, 0xFF7FFFFF,
          0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00123, 0x7F800001, 0xFF812345, 0x40200000, 0xC0400000],
  "f16": [0x0000, 0x8000, 0x3C00, 0xBE00, 0x0001, 0x83FF, 0x0400, 0xFBFF,
          0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01, 0xFD23, 0x4100, 0xC200],
  "f64": [0x0, 0x8000000000000000, 0x3FF0000000000000, 0xBFF8000000000000, 0x1, 0x800FFFFFFFFFFFFF,
          0x0010000000000000, 0xFFEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
          0xFFF8000000000123, 0x7FF0000000000001, 0xFFF0000000012345, 0x4004000000000000, 0xC008000000000000],
}


def exponent_field(b: int, t: str) -> int:
  f = FORMATS[t]
  return (b >> f.mant) & ((1 << (f.bits - f.mant - 1)) - 1)


def sign(b: int, t: str) -> bool: return bool(b >> (FORMATS[t].bits - 1))
def mantissa_field(b: int, t: str) -> int: return b & ((1 << FORMATS[t].mant) - 1)
def max_exponent(t: str) -> int: return (1 << (FORMATS[t].bits - FORMATS[t].mant - 1)) - 1
def is_nan(b: int, t: str) -> bool: return exponent_field(b, t) == max_exponent(t) and mantissa_field(b, t) != 0
def quiet_bit(t: str) -> int: return 1 << (FORMATS[t].mant - 1)
def is_signalling(b: int, t: str) -> bool: return is_nan(b, t) and not b & quiet_bit(t)
def is_quiet(b: int, t: str) -> bool: return is_nan(b, t) and bool(b & quiet_bit(t))
def quieted(b: int, t: str) -> int: return b | quiet_bit(t)          # cvtToQuietNAN: payload and sign kept


def value(b: int, t: str) -> float:
  f = FORMATS[t]
  return float(np.array(b, f.uint_t).view(f.float_t)[()])


def bits_of(x, t: str) -> int:
  f = FORMATS[t]
  return int(np.array(x, f.float_t).view(f.uint_t)[()])


def is_denormal(b: int, t: str) -> bool: return exponent_field(b, t) == 0 and mantissa_field(b, t) != 0


# ---- V_MIN_F32 / V_MAX_F32 (16.7): the F16/F64/packed and three-operand forms are defined through them ----

def v_min(a: int, b: int, t: str, ieee: bool = True) -> int:
  x, y = value(a, t), value(b, t)
  lt_neg_zero = x < y or (x == 0 and y == 0 and sign(a, t) and not sign(b, t))    # -0.0 < +0.0 here
  if ieee:
    if is_signalling(a, t): return quieted(a, t)
    if is_signalling(b, t): return quieted(b, t)
    if is_quiet(b, t): return a
    if is_quiet(a, t): return b
  else:
    if is_nan(b, t): return a
    if is_nan(a, t): return b
  return a if lt_neg_zero else b


def v_max(a: int, b: int, t: str, ieee: bool = True) -> int:
  x, y = value(a, t), value(b, t)
  gt_neg_zero = x > y or (x == 0 and y == 0 and not sign(a, t) and sign(b, t))    # +0.0 > -0.0 here
  if ieee:
    if is_signalling(a, t): return quieted(a, t)
    if is_signalling(b, t): return quieted(b, t)
    if is_quiet(b, t): return a
    if is_quiet(a, t): return b
  else:
    if is_nan(b, t): return a
    if is_nan(a, t): return b
  return a if gt_neg_zero else b


def v_min3(a, b, c, t, ieee=True): return v_min(v_min(a, b, t, ieee), c, t, ieee)
def v_max3(a, b, c, t, ieee=True): return v_max(v_max(a, b, t, ieee), c, t, ieee)
def v_minmax(a, b, c, t, ieee=True): return v_max(v_min(a, b, t, ieee), c, t, ieee)
def v_maxmin(a, b, c, t, ieee=True): return v_min(v_max(a, b, t, ieee), c, t, ieee)


def v_med3(a: int, b: int, c: int, t: str, ieee: bool = True) -> int:
  """V_MED3_F32 (16.12): a NaN operand gives v_min3; else compares v_max3's value with S0, then S1."""
  if is_nan(a, t) or is_nan(b, t) or is_nan(c, t): return v_min3(a, b, c, t, ieee)
  top = value(v_max3(a, b, c, t, ieee), t)
  if top == value(a, t): return v_max(b, c, t, ieee)
  if top == value(b, t): return v_max(a, c, t, ieee)
  return v_max(a, b, t, ieee)


MINMAX = {"min": v_min, "max": v_max, "min3": v_min3, "max3": v_max3, "med3": v_med3, "minmax": v_minmax,
          "maxmin": v_maxmin}


# ---- compares (16.9, Table "Float Compare Operations"; NEQ/NLT... are the negations, true on NaN) ----

FLOAT_COMPARES = {
  "f": lambda x, y: False, "lt": lambda x, y: x < y, "eq": lambda x, y: x == y, "le": lambda x, y: x <= y,
  "gt": lambda x, y: x > y, "lg": lambda x, y: x < y or x > y, "ge": lambda x, y: x >= y,
  "o": lambda x, y: not (math.isnan(x) or math.isnan(y)), "u": lambda x, y: math.isnan(x) or math.isnan(y),
  "nge": lambda x, y: not x >= y, "nlg": lambda x, y: not (x < y or x > y), "ngt": lambda x, y: not x > y,
  "nle": lambda x, y: not x <= y, "neq": lambda x, y: not x == y, "nlt": lambda x, y: not x < y,
  "t": lambda x, y: True,
}
INT_COMPARES = {"f": lambda x, y: False, "lt": lambda x, y: x < y, "eq": lambda x, y: x == y,
                "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ne": lambda x, y: x != y,
                "ge": lambda x, y: x >= y, "t": lambda x, y: True}


def v_cmp_class(b: int, mask: int, t: str) -> bool:
  """V_CMP_CLASS_F32 (16.9): mask bit 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal,
  8 +normal, 9 +inf."""
  if is_signalling(b, t): bit = 0
  elif is_quiet(b, t): bit = 1
  elif exponent_field(b, t) == max_exponent(t): bit = 2 if sign(b, t) else 9
  elif exponent_field(b, t) > 0: bit = 3 if sign(b, t) else 8
  elif mantissa_field(b, t): bit = 4 if sign(b, t) else 7
  else: bit = 5 if sign(b, t) else 6
  return bool((mask >> bit) & 1)


# ---- rounding helpers ----

def round_to(x: Fraction | float, t: str, mode: str = "rn") -> float:
  """An exact value rounded to format t (subnormals, overflow to inf for rn; rz gives the largest finite)."""
  f = FORMATS[t]
  ebits = f.bits - f.mant - 1
  emin, emax, p = 2 - (1 << (ebits - 1)), (1 << (ebits - 1)) - 1, f.mant + 1
  x = Fraction(x)
  if x == 0: return 0.0
  neg, a = x < 0, abs(x)
  e = a.numerator.bit_length() - a.denominator.bit_length()
  if Fraction(2) ** e > a: e -= 1
  ulp = Fraction(2) ** (max(e, emin) - p + 1)
  q, r = divmod(a, ulp)
  q = int(q)
  if mode == "rn" and (r > ulp / 2 or (r == ulp / 2 and q & 1)): q += 1
  v = q * ulp
  max_finite = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
  if v > max_finite: v = math.inf if mode == "rn" else max_finite
  out = float(v)
  return -out if neg else out


def ulps_apart(got: int, want: float, t: str) -> float:
  """|got - want| in units of the last place of the format at want (want finite)."""
  f = FORMATS[t]
  w = np.array(want, f.float_t)
  spacing = float(np.spacing(np.abs(w)))
  return abs(value(got, t) - want) / spacing


def flushed(b: int, t: str) -> int:
  """A denormal replaced by the zero of its sign ("denormals are flushed")."""
  return (b & (1 << (FORMATS[t].bits - 1))) if is_denormal(b, t) else b


def exact(b: int, t: str) -> Fraction: return Fraction(value(b, t))


def neighbours(x: Fraction, t: str) -> tuple[float, float]:
  """The two values of format t around the exact value x (equal when x is representable), by exact rounding down
  and up; only for x inside the format's normal range."""
  f = FORMATS[t].float_t
  toward_zero = round_to(x, t, "rz")
  if Fraction(toward_zero) == x: return toward_zero, toward_zero
  away = float(np.nextafter(f(toward_zero), f(math.copysign(math.inf, toward_zero))))
  return (toward_zero, away) if x > 0 else (away, toward_zero)


# ---- V_FMA_* (16.12): "fma(S0, S1, S2)", "0.5ULP accuracy": the exact a * b + c rounded once ----

def fma(a: int, b: int, c: int, t: str) -> int:
  x, y, z = value(a, t), value(b, t), value(c, t)
  if not all(map(math.isfinite, (x, y, z))):
    with np.errstate(invalid="ignore"): return bits_of(np.float64(x) * y + z, t)     # inf * 0, inf - inf: NaN
  r = Fraction(x) * Fraction(y) + Fraction(z)
  if r == 0: return bits_of(x * y + z, t)            # the sign of an exact zero: the IEEE sum rule
  return bits_of(round_to(r, t), t)


# ---- V_DIV_SCALE / V_DIV_FMAS / V_DIV_FIXUP (16.12) with the readings of drivers/emu/rdna3_float.py ----

DIV = {"f32": dict(big=96, k=64, tiny_num=23, gap=-150), "f64": dict(big=768, k=128, tiny_num=53, gap=-1075)}


def _denormal(x: float, t: str) -> bool:
  return x != 0 and math.isfinite(x) and abs(x) < np.finfo(FORMATS[t].float_t).tiny


def div_scale(s0: int, s1: int, s2: int, t: str) -> tuple[int, bool]:
  """(D0 bits, VCC) following the pseudocode: D0 keeps S0 unless a branch scales it; "1/S1 denormal" means
  |S1| above 2**(bias - 1); with 1/S1 and S2/S1 both denormal the denominator is scaled down."""
  p = DIV[t]
  x0, x1, x2 = value(s0, t), value(s1, t), value(s2, t)
  scale = lambda k: bits_of(round_to(Fraction(x0) * Fraction(2) ** k, t), t) if math.isfinite(x0) else s0
  bias = max_exponent(t) >> 1
  inv_denormal = abs(x1) > 2.0 ** (bias - 1)
  q = Fraction(x2) / Fraction(x1) if x1 != 0 and math.isfinite(x1) and math.isfinite(x2) else None
  q_denormal = q is not None and _denormal(round_to(q, t), t)
  if x2 == 0 or x1 == 0: return bits_of(math.nan, t), False
  if exponent_field(s2, t) - exponent_field(s1, t) >= p["big"]: return (scale(p["k"]) if x0 == x1 else s0), True
  if _denormal(x1, t): return scale(p["k"]), False
  if inv_denormal and q_denormal: return (scale(-p["k"]) if x0 == x1 else s0), True
  if inv_denormal: return scale(-p["k"]), False
  if q_denormal: return (scale(p["k"]) if x0 == x2 else s0), True
  if exponent_field(s2, t) <= p["tiny_num"]: return scale(p["k"]), False
  return s0, False


def div_fmas(a: int, b: int, c: int, vcc: bool, t: str) -> int:
  if not vcc: return fma(a, b, c, t)
  k = DIV[t]["k"] if exponent_field(c, t) > max_exponent(t) >> 1 else -DIV[t]["k"]
  r = (Fraction(value(a, t)) * Fraction(value(b, t)) + Fraction(value(c, t))) * Fraction(2) ** k
  return bits_of(round_to(r, t), t)


def div_fixup(q: int, d: int, n: int, t: str) -> int:
  sign_out = sign(d, t) != sign(n, t)
  signed = lambda x: bits_of(-abs(x) if sign_out else abs(x), t)
  top = 1 << (FORMATS[t].bits - 1)
  x, y = value(d, t), value(n, t)
  if is_nan(n, t): return quieted(n, t)
  if is_nan(d, t): return quieted(d, t)
  if (x == 0 and y == 0) or (math.isinf(x) and math.isinf(y)): return top | bits_of(math.inf, t) | quiet_bit(t)
  if x == 0 or math.isinf(y): return signed(math.inf)
  if math.isinf(x) or y == 0: return signed(0.0)
  if t != "f16":
    if exponent_field(n, t) - exponent_field(d, t) < DIV[t]["gap"]: return signed(0.0)
    if is_nan(q, t): return signed(math.inf)
  return (q | top) if sign_out else (q & ~top)
