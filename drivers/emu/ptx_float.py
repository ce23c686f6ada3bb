"""Exactly rounded float helpers for the PTX interpreter (numpy, vectorized).

- float32 `.rn` arithmetic is numpy float32 arithmetic (IEEE round-to-nearest-even, subnormals kept: PTX
  without `.ftz` keeps them on sm_20+); float64 likewise.
- directed rounding (`.rz/.rm/.rp`) of a value known exactly as a float64 (or as float64 s + e) is done by
  rounding to nearest and stepping one ulp back where that went past the exact value.
- fused multiply-add in float32: the product of two float32 is exact in float64; the sum is taken with
  TwoSum (s + e exactly) and rounded to float64 with round-to-odd, which a second rounding to float32
  cannot spoil (53 >= 24 + 2 bits), so the result is the correctly rounded a*b+c.
- float16 / bfloat16 conversions: bfloat16 is handled on its bits (round-to-nearest-even, or truncation
  for the directed modes); float16 uses numpy's correctly rounded float16 conversion plus the same
  one-ulp correction for directed modes.
"""
from __future__ import annotations

import numpy as np

F32_NAN = np.uint32(0x7FFFFFFF)          # NVIDIA's canonical NaNs (PTX ISA: min/max, cvt)
F16_NAN = np.uint16(0x7FFF)
BF16_NAN = np.uint16(0x7FFF)
TINY = {np.dtype(np.float32): np.float32(np.finfo(np.float32).tiny),
        np.dtype(np.float64): np.float64(np.finfo(np.float64).tiny)}


def directed(r, exact, mode: str, dt):
  """`r` = exact rounded to nearest in dtype `dt`; `exact` given as a float64 array (or anything comparing
  exactly with r). Returns the rounding of `exact` in `mode` (rn/rz/rm/rp)."""
  if mode == "rn": return r
  r64 = np.asarray(r).astype(np.float64)
  if mode == "rz": fix = np.abs(r64) > np.abs(exact); toward = np.zeros_like(r)
  elif mode == "rm": fix = r64 > exact; toward = np.full_like(r, -np.inf)
  elif mode == "rp": fix = r64 < exact; toward = np.full_like(r, np.inf)
  else: raise ValueError(mode)
  return np.where(fix, np.nextafter(r, toward), r).astype(dt)


def two_sum(a, b):
  s = a + b
  bb = s - a
  e = (a - (s - bb)) + (b - bb)
  return s, e


def f64_sign_residual(s, e):
  """Round-to-odd of the exact value s + e (s = fl(s + e), both float64) to float64."""
  inexact = (e != 0) & np.isfinite(s)
  shrink = inexact & ((e < 0) != (s < 0))          # the exact value is closer to zero than s
  t = np.where(shrink, np.nextafter(s, np.zeros_like(s)), s)
  bits = t.view(np.uint64) | inexact.astype(np.uint64)
  return np.where(inexact, bits.view(np.float64), s)


def exact_zero_is_negative(x, y, mode: str):
  """Where the exact sum x + y (x, y: the float64 addends, e.g. a product and c for fma) is zero and the result must
  be -0 (IEEE 754-2008, 6.3, which PTX's add/sub/fma follow): a zero sum of operands of opposite signs, or x - x,
  is +0 in every rounding direction but toward -inf (.rm), where it is -0; x + x is x, zeros included. Round to
  nearest and the other directions already give +0 from the float64 sum; only .rm needs the -0."""
  x, y = np.asarray(x), np.asarray(y)
  if mode != "rm": return np.zeros(np.broadcast(x, y).shape, bool)
  both_plus_zero = (x == 0) & (y == 0) & ~np.signbit(x) & ~np.signbit(y)
  return (x == -y) & ~both_plus_zero


def to_f32_from_f64(x, mode: str = "rn"):
  x = np.asarray(x, np.float64)
  return directed(x.astype(np.float32), x, mode, np.float32)


def f32_fma(a, b, c, mode: str = "rn"):
  a64, b64, c64 = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
  p = a64 * b64                                     # exact
  s, e = two_sum(p, c64)
  odd = f64_sign_residual(s, e)
  return np.where(exact_zero_is_negative(p, c64, mode), np.float32(-0.0), to_f32_from_f64(odd, mode)).astype(np.float32)


def f32_add(a, b, mode: str, sub: bool = False):
  """Directed-rounding float32 add/sub: s + e holds the exact sum."""
  a64, b64 = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
  if sub: b64 = -b64
  s, e = two_sum(a64, b64)
  return np.where(exact_zero_is_negative(a64, b64, mode), np.float32(-0.0),
                  to_f32_from_f64(f64_sign_residual(s, e), mode)).astype(np.float32)


def f32_mul(a, b, mode: str):
  return to_f32_from_f64(np.asarray(a).astype(np.float64) * np.asarray(b).astype(np.float64), mode)


def f64_fma(a, b, c):
  """Correctly rounded float64 fma, element by element with exact rationals (rarely used)."""
  from fractions import Fraction
  a, b, c = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(c, np.float64))
  out = (a * b + c).astype(np.float64).reshape(-1)   # right whenever an operand is not finite
  for i, (x, y, z) in enumerate(zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), c.reshape(-1).tolist())):
    if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)) or x == 0 or y == 0: continue
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    if exact == 0: out[i] = 0.0; continue
    try: out[i] = exact.numerator / exact.denominator          # int / int rounds correctly
    except OverflowError: out[i] = np.inf if exact > 0 else -np.inf
  return out.reshape(a.shape)


def ftz(x):
  """Flush float32 subnormals to sign-preserving zero (`.ftz`)."""
  x = np.asarray(x)
  return np.where(np.abs(x) < TINY[x.dtype], np.copysign(np.zeros_like(x), x), x)


# ---- float16 / bfloat16 ----
def f16_bits_to_f32(bits):
  return np.asarray(bits, np.uint16).view(np.float16).astype(np.float32)


def bf16_bits_to_f32(bits):
  return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x, mode: str = "rn"):
  """float32 -> bfloat16 bits; NaN -> canonical 0x7FFF."""
  b = np.asarray(x, np.float32).view(np.uint32)
  nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
  if mode == "rn":
    r = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
  else:
    trunc = b >> np.uint32(16)
    inexact = (b & np.uint32(0xFFFF)) != 0
    neg = (b >> np.uint32(31)) != 0
    away = {"rz": np.zeros_like(inexact), "rm": inexact & neg, "rp": inexact & ~neg}[mode]
    r = trunc + away.astype(np.uint32)
  return np.where(nan, np.uint32(BF16_NAN), r).astype(np.uint16)


def f64_to_f32_odd(x):
  """float64 -> float32 with round-to-odd (for a second, exact-as-one rounding to a narrower format)."""
  x = np.asarray(x, np.float64)
  t = directed(x.astype(np.float32), x, "rz", np.float32)
  inexact = (t.astype(np.float64) != x) & np.isfinite(x)
  return np.where(inexact, (t.view(np.uint32) | np.uint32(1)).view(np.float32), t)


def to_f16_bits(x, mode: str = "rn"):
  """float32 or float64 -> float16 bits (numpy's conversion is correctly rounded to nearest even);
  NaN -> canonical 0x7FFF."""
  x = np.asarray(x)
  h = x.astype(np.float16)
  if mode != "rn": h = directed(h, x.astype(np.float64), mode, np.float16)
  return np.where(np.isnan(x), F16_NAN, h.view(np.uint16)).astype(np.uint16)


def to_bf16_bits(x, mode: str = "rn"):
  x = np.asarray(x)
  if x.dtype == np.float64: x = f64_to_f32_odd(x)
  return f32_to_bf16_bits(x, mode)


def fminmax(a, b, is_max: bool, nan_mode: bool = False):
  """PTX min/max: a NaN operand yields the other one (both NaN: canonical NaN; `.NaN`: NaN if either);
  -0.0 < +0.0."""
  a, b = np.asarray(a), np.asarray(b)
  a, b = np.broadcast_arrays(a, b)
  if is_max: r = np.where((a > b) | ((a == b) & np.signbit(b)), a, b)
  else: r = np.where((a < b) | ((a == b) & np.signbit(a)), a, b)
  na, nb = np.isnan(a), np.isnan(b)
  r = np.where(na, b, np.where(nb, a, r))
  canon = np.array(F32_NAN if a.dtype == np.float32 else np.uint64(0x7FFFFFFFFFFFFFFF)).view(a.dtype)
  either = (na | nb) if nan_mode else (na & nb)
  return np.where(either, canon, r).astype(a.dtype)
