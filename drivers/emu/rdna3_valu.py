"""RDNA3 vector ALU semantics: VOP1, VOP2, VOP3, VOPC and VOP3P as tables of numpy functions.

Semantics follow the AMD "RDNA3 Instruction Set Architecture" reference guide, chapter
"Instructions" (VOP1/VOP2/VOP3/VOP3P/VOPC opcode descriptions) and "Vector ALU Operations"
(input modifiers abs/neg, output modifiers clamp/omod, op_sel for 16-bit operands, VCC/SDST
carry and compare outputs, inactive lanes of compare results read as 0).

Each entry of OPS is (output type, input types, fn): fn takes typed numpy arrays of shape
(k, 32) (or broadcastable) and returns a typed result; the compiler converts raw register bits
to and from those types and applies the modifiers. Special shapes (carry, compare, lane ops,
packed math) are compiled by the functions further down. The float min/max family and the clamp
modifier depend on the wave's MODE bits (rdna3_state.FloatMode, from the kernel descriptor). FMA, the
transcendentals, the division helpers and the WMMA sums round as rdna3_float.py computes them.
"""
from __future__ import annotations

import re

import numpy as np

from . import rdna3_float as rf
from .rdna3_state import (EXEC, F16, F32, F64, I16, I32, I64, LANE, U16, U32, U64, VCC, EmulatorError, FloatMode,
                          bits_to_mask, check_vgpr, mask_to_bits, vector_source)

DTYPES = {"f32": F32, "i32": I32, "u32": U32, "f16": F16, "i16": I16, "u16": U16, "f64": F64, "i64": I64, "u64": U64}
BITS = {"f32": 32, "i32": 32, "u32": 32, "f16": 16, "i16": 16, "u16": 16, "f64": 64, "i64": 64, "u64": 64}
FLOAT = {"f16", "f32", "f64"}
OPS: dict[str, tuple[str, tuple[str, ...], object]] = {}


def _op(names: str, out: str, ins: str, fn) -> None:
  for name in names.split(): OPS[name] = (out, tuple(ins.split()), fn)


# ---- numeric helpers ----

_UINT_OF = {2: U16, 4: U32, 8: U64}


def _raw(x):
  """The bits of a float array (a view, so NaN payloads and signalling NaNs stay exactly as they are)."""
  return x.view(_UINT_OF[x.dtype.itemsize])


def _pick(cond, a, b):
  """np.where(cond, a, b) on the bits: a signalling NaN is copied, never quieted by a float move."""
  return np.where(cond, _raw(a), _raw(b)).view(a.dtype)


def _quiet_bit(x):
  raw = _raw(x)
  return raw.dtype.type(1) << raw.dtype.type(np.finfo(x.dtype).nmant - 1)


def _signalling(x):
  """isSignalNAN: a NaN whose mantissa's top bit is clear."""
  return np.isnan(x) & ((_raw(x) & _quiet_bit(x)) == 0)


def _quieted(x):
  """cvtToQuietNAN: the same NaN with the quiet bit set (payload and sign kept)."""
  return (_raw(x) | _quiet_bit(x)).view(x.dtype)


def _minmax(is_max: bool, ieee: bool):
  """V_MIN_F32 / V_MAX_F32 (RDNA3 ISA guide, 16.7 "VOP2 Instructions"; V_MIN/V_MAX_F16, _F64, V_PK_MIN/MAX_F16
  and the three-operand forms are defined through them). With MODE.IEEE: a signalling NaN operand gives that
  NaN quieted (S0 checked first), else a quiet NaN in S1 gives S0 and one in S0 gives S1 (IEEE 754-2008
  minNum/maxNum); without MODE.IEEE any NaN operand gives the other operand. Numbers compare with -0.0 < +0.0
  (LT_NEG_ZERO / GT_NEG_ZERO)."""
  def fn(a, b):
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    with np.errstate(invalid="ignore"):
      if is_max: take_a = (a > b) | ((a == b) & ~np.signbit(a) & np.signbit(b))
      else: take_a = (a < b) | ((a == b) & np.signbit(a) & ~np.signbit(b))
    r = _pick(take_a, a, b)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not ieee:
      return _pick(nan_b, a, _pick(nan_a, b, r))                 # isNAN(S1) is tested first
    snan_a, snan_b = _signalling(a), _signalling(b)
    r = _pick(nan_a & ~snan_a, b, r)
    r = _pick(nan_b & ~snan_b, a, r)                              # isQuietNAN(S1) before isQuietNAN(S0)
    r = _pick(snan_b, _quieted(b), r)
    return _pick(snan_a, _quieted(a), r)
  return fn


def _med3_float(ieee: bool):
  """V_MED3_F32 (RDNA3 ISA guide, 16.12 "VOP3 & VOP3SD Instructions"): any NaN operand gives
  v_min3(S0, S1, S2); else the v_max of the two operands other than the one equal to v_max3(S0, S1, S2)."""
  vmin, vmax = _minmax(False, ieee), _minmax(True, ieee)
  def fn(a, b, c):
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    top = vmax(vmax(a, b), c)
    with np.errstate(invalid="ignore"):
      r = _pick(top == a, vmax(b, c), _pick(top == b, vmax(a, c), vmax(a, b)))
    return _pick(np.isnan(a) | np.isnan(b) | np.isnan(c), vmin(vmin(a, b), c), r)
  return fn


def _med3(a, b, c, fmin, fmax):
  return fmax(fmin(a, b), fmin(fmax(a, b), c))


def _cvt_int(x, lo, hi, dtype):
  """float -> integer with truncation, saturation and NaN -> 0 (v_cvt_i32_f32 & co: "out-of-range floating point
  values (including infinity) saturate. NAN is converted to 0", RDNA3 ISA guide, 16.8 "VOP1 Instructions")."""
  x = np.asarray(x, F64)
  return np.where(np.isnan(x), 0, np.clip(np.trunc(np.nan_to_num(x)), lo, hi)).astype(I64).astype(dtype)


def _fract(x):
  """V_FRACT_F32 (16.8): S0 + -floor(S0), "result clamped to 0x3f7fffff" (the largest value below 1.0); inf and
  NaN give NaN."""
  one_below = np.nextafter(x.dtype.type(1), x.dtype.type(0))
  r = np.minimum(x - np.floor(x), one_below)
  return np.where(np.isinf(x), x.dtype.type(np.nan), r)


def _rndne(x): return np.rint(x)


def _frexp_mant(x):
  """V_FREXP_MANT_F32 (16.8): inf and NaN give S0; otherwise the significand of C's frexp(), in [0.5, 1) (denormals
  normalized, +-0 gives +-0), so that S0 = significand * 2**exponent."""
  m, _ = np.frexp(x)
  return np.where(np.isfinite(x), m, x).astype(x.dtype)


def _frexp_exp(x):
  """V_FREXP_EXP_I32_F32 (16.8): inf and NaN give 0; otherwise the exponent of C's frexp() (0 for +-0)."""
  _, e = np.frexp(x)
  return np.where(np.isfinite(x), e, 0).astype(I32)


def _top_bit(x):
  """Index of the highest set bit of a uint32/uint64 array (-1 for 0)."""
  x = np.asarray(x)
  if x.dtype == U64:
    hi = (x >> np.uint64(32)).astype(U32)
    return np.where(hi != 0, _top_bit(hi) + 32, _top_bit((x & np.uint64(0xFFFFFFFF)).astype(U32)))
  _, e = np.frexp(x.astype(F64))
  return np.where(x == 0, -1, e - 1).astype(I32)


def _clz32(x): return np.where(x == 0, -1, 31 - _top_bit(x)).astype(I32)        # v_clz_i32_u32: -1 for 0


def _ctz32(x):
  x = np.asarray(x, U32)
  low = x & (~x + np.uint32(1))
  return np.where(x == 0, -1, _top_bit(low)).astype(I32)


_REV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


def bit_reverse32(x):
  b = np.ascontiguousarray(np.asarray(x, U32)).view(np.uint8)
  return _REV8[b].reshape(*np.asarray(x).shape, 4)[..., ::-1].copy().view(U32).reshape(np.asarray(x).shape)


def _mul_hi_u32(a, b): return ((a.astype(U64) * b.astype(U64)) >> np.uint64(32)).astype(U32)
def _mul_hi_i32(a, b): return ((a.astype(I64) * b.astype(I64)) >> 32).astype(I32)
def _u24(x): return (x & np.uint32(0xFFFFFF))
def _i24(x): return ((x.astype(I32) << 8) >> 8).astype(I64)


def _bfe_u32(a, b, c):
  off, width = b & np.uint32(31), c & np.uint32(31)
  mask = ((np.uint64(1) << width.astype(U64)) - np.uint64(1)).astype(U32)
  return (a >> off) & mask


def _bfe_i32(a, b, c):
  off, width = (b & np.uint32(31)).astype(I64), (c & np.uint32(31)).astype(I64)
  v = (a.astype(I64) << (64 - off - width)) >> (64 - np.maximum(width, 1))
  return np.where(width == 0, 0, v).astype(I32)


def _alignbit(a, b, c):
  v = (a.astype(U64) << np.uint64(32)) | b.astype(U64)
  return (v >> (c & np.uint32(31)).astype(U64)).astype(U32)


def _alignbyte(a, b, c):
  v = (a.astype(U64) << np.uint64(32)) | b.astype(U64)
  return (v >> ((c & np.uint32(3)) * np.uint32(8)).astype(U64)).astype(U32)


def _perm(a, b, c):
  """v_perm_b32: each byte of c selects a byte of {a, b} (b is bytes 0-3), a sign fill, 0 or 0xff."""
  a, b, c = np.broadcast_arrays(np.asarray(a, U32), np.asarray(b, U32), np.asarray(c, U32))
  src = ((a.astype(U64) << np.uint64(32)) | b.astype(U64))
  out = np.zeros(a.shape, U32)
  for i in range(4):
    sel = (c >> np.uint32(8 * i)) & np.uint32(0xFF)
    byte = ((src >> (np.minimum(sel, 7).astype(U64) * np.uint64(8))) & np.uint64(0xFF)).astype(U32)
    sign_bit = (src >> ((np.clip(sel, 8, 11).astype(U64) - np.uint64(8)) * np.uint64(16) + np.uint64(15))) & np.uint64(1)
    byte = np.where(sel >= 8, np.where(sign_bit.astype(bool), 0xFF, 0), byte)
    byte = np.where(sel == 12, 0, np.where(sel > 12, 0xFF, byte)).astype(U32)
    out |= byte << np.uint32(8 * i)
  return out


def _sat_add(a, b, lo, hi): return np.clip(a.astype(I64) + b.astype(I64), lo, hi)


def _cvt_pk_rtz(a, b):
  def rtz(x):
    x = np.asarray(x, F32)
    h = x.astype(F16)
    bits = h.view(U16).astype(np.int32)
    away = np.isfinite(x) & (np.abs(h.astype(F32)) > np.abs(x))
    return np.where(away, bits - 1, bits).astype(U16)
  return rtz(a).astype(U32) | (rtz(b).astype(U32) << np.uint32(16))


def _cvt_pk_norm(a, b, signed, src_t):
  lo, hi, scale = (-32767, 32767, 32767.0) if signed else (0, 65535, 65535.0)
  def one(x): return np.clip(np.rint(np.asarray(x, F32) * np.float32(scale)), lo, hi).astype(np.int64).astype(U16)
  return one(a).astype(U32) | (one(b).astype(U32) << np.uint32(16))


# ---- plain ops: name -> (out, ins, fn) ----
_op("v_mov_b32", "u32", "u32", lambda a: a)
_op("v_not_b32", "u32", "u32", lambda a: ~a)
_op("v_bfrev_b32", "u32", "u32", bit_reverse32)
_op("v_clz_i32_u32", "i32", "u32", _clz32)
_op("v_ctz_i32_b32", "i32", "u32", _ctz32)
_op("v_cls_i32", "i32", "u32", lambda a: _cls_i32(a))
_op("v_cvt_i32_f64", "i32", "f64", lambda a: _cvt_int(a, -2**31, 2**31 - 1, I32))
_op("v_cvt_u32_f64", "u32", "f64", lambda a: _cvt_int(a, 0, 2**32 - 1, U32))
_op("v_cvt_f64_i32", "f64", "i32", lambda a: a.astype(F64))
_op("v_cvt_f64_u32", "f64", "u32", lambda a: a.astype(F64))
_op("v_cvt_f32_i32", "f32", "i32", lambda a: a.astype(F32))
_op("v_cvt_f32_u32", "f32", "u32", lambda a: a.astype(F32))
_op("v_cvt_u32_f32", "u32", "f32", lambda a: _cvt_int(a, 0, 2**32 - 1, U32))
_op("v_cvt_i32_f32", "i32", "f32", lambda a: _cvt_int(a, -2**31, 2**31 - 1, I32))
_op("v_cvt_nearest_i32_f32", "i32", "f32", lambda a: _cvt_int(np.floor(np.asarray(a, F64) + 0.5), -2**31, 2**31 - 1, I32))
_op("v_cvt_floor_i32_f32", "i32", "f32", lambda a: _cvt_int(np.floor(a), -2**31, 2**31 - 1, I32))
_op("v_cvt_f16_f32", "f16", "f32", lambda a: a.astype(F16))
_op("v_cvt_f32_f16", "f32", "f16", lambda a: a.astype(F32))
_op("v_cvt_f32_f64", "f32", "f64", lambda a: a.astype(F32))
_op("v_cvt_f64_f32", "f64", "f32", lambda a: a.astype(F64))
_op("v_cvt_off_f32_i4", "f32", "u32", lambda a: (((a & np.uint32(15)).astype(I32) ^ 8) - 8).astype(F32) / np.float32(16))
for _i in range(4):
  _op(f"v_cvt_f32_ubyte{_i}", "f32", "u32", lambda a, s=np.uint32(8 * _i): ((a >> s) & np.uint32(0xFF)).astype(F32))
_op("v_cvt_f16_u16", "f16", "u16", lambda a: a.astype(F16))
_op("v_cvt_f16_i16", "f16", "i16", lambda a: a.astype(F16))
_op("v_cvt_u16_f16", "u16", "f16", lambda a: _cvt_int(a, 0, 65535, U16))
_op("v_cvt_i16_f16", "i16", "f16", lambda a: _cvt_int(a, -32768, 32767, I16))
_op("v_cvt_i32_i16", "i32", "i16", lambda a: a.astype(I32))
_op("v_cvt_u32_u16", "u32", "u16", lambda a: a.astype(U32))
_op("v_cvt_norm_i16_f16", "i16", "f16", lambda a: np.clip(np.rint(a.astype(F32) * 32767), -32767, 32767).astype(I16))
_op("v_cvt_norm_u16_f16", "u16", "f16", lambda a: np.clip(np.rint(a.astype(F32) * 65535), 0, 65535).astype(U16))
_op("v_not_b16", "u16", "u16", lambda a: ~a)
_op("v_sat_pk_u8_i16", "u32", "u32", lambda a: (np.clip((a & np.uint32(0xFFFF)).astype(U16).view(I16), 0, 255).astype(U32)
                                                  | (np.clip((a >> np.uint32(16)).astype(U16).view(I16), 0, 255).astype(U32) << np.uint32(8))))
for _t in ("f16", "f32", "f64"):
  _op(f"v_trunc_{_t}", _t, _t, np.trunc)
  _op(f"v_ceil_{_t}", _t, _t, np.ceil)
  _op(f"v_floor_{_t}", _t, _t, np.floor)
  _op(f"v_rndne_{_t}", _t, _t, _rndne)
  _op(f"v_fract_{_t}", _t, _t, _fract)
  _op(f"v_frexp_mant_{_t}", _t, _t, _frexp_mant)
# Transcendentals (RDNA3 ISA guide, 16.8 "VOP1 Instructions"), computed correctly rounded (why not worse, inside
# the documented 1 ULP / (2**29) ULP: rdna3_float.nearest_f32): f32 rcp/rsq/sqrt/exp/log "denormals are flushed"
# (inputs and results, whatever MODE's denorm setting: the note is unconditional); f64 rcp/rsq/sqrt and f16 keep
# denormals
_op("v_rcp_f16", "f16", "f16", lambda a: F16(1) / a)
_op("v_rsq_f16", "f16", "f16", lambda a: F16(1) / np.sqrt(a))
_op("v_sqrt_f16", "f16", "f16", np.sqrt)
_op("v_rcp_f64", "f64", "f64", rf.rcp_f64)
_op("v_rsq_f64", "f64", "f64", rf.rsq_f64)
_op("v_sqrt_f64", "f64", "f64", rf.sqrt_f64)
_op("v_rcp_f32", "f32", "f32", rf.rcp_f32)
_op("v_rsq_f32", "f32", "f32", rf.rsq_f32)
_op("v_sqrt_f32", "f32", "f32", rf.sqrt_f32)
_op("v_rcp_iflag_f32", "f32", "f32", rf.rcp_iflag_f32)
_op("v_frexp_exp_i32_f32", "i32", "f32", _frexp_exp)
_op("v_frexp_exp_i32_f64", "i32", "f64", _frexp_exp)
_op("v_frexp_exp_i16_f16", "i16", "f16", lambda a: _frexp_exp(a).astype(I16))
_op("v_exp_f16", "f16", "f16", np.exp2)
_op("v_log_f16", "f16", "f16", np.log2)
_op("v_exp_f32", "f32", "f32", rf.exp_f32)
_op("v_log_f32", "f32", "f32", rf.log_f32)
for _t in ("f16", "f32"):
  # v_sin/v_cos take the angle in revolutions (x * 2pi radians)
  _op(f"v_sin_{_t}", _t, _t, lambda a: np.sin(a.astype(F64) * (2 * np.pi)).astype(a.dtype))
  _op(f"v_cos_{_t}", _t, _t, lambda a: np.cos(a.astype(F64) * (2 * np.pi)).astype(a.dtype))

# The float min/max family depends on MODE.IEEE: per mode, its functions by kind; compile_valu picks the kernel's.
def _minmax_kinds(ieee: bool) -> dict:
  vmin, vmax = _minmax(False, ieee), _minmax(True, ieee)
  return {"min": vmin, "max": vmax, "min3": lambda a, b, c: vmin(vmin(a, b), c),
          "max3": lambda a, b, c: vmax(vmax(a, b), c), "med3": _med3_float(ieee),
          "maxmin": lambda a, b, c: vmin(vmax(a, b), c), "minmax": lambda a, b, c: vmax(vmin(a, b), c)}


_MINMAX_BY_MODE = {ieee: _minmax_kinds(ieee) for ieee in (False, True)}
_MINMAX_KIND: dict[str, str] = {}       # mnemonic -> kind, for the float min/max family


def _minmax_op(name: str, kind: str, t: str, n: int) -> None:
  _op(name, t, " ".join([t] * n), _MINMAX_BY_MODE[True][kind])
  _MINMAX_KIND[name] = kind


# VOP2 / VOP3 two- and three-source ops
for _t in ("f16", "f32", "f64"):
  _op(f"v_add_{_t}", _t, f"{_t} {_t}", lambda a, b: a + b)
  _op(f"v_mul_{_t}", _t, f"{_t} {_t}", lambda a, b: a * b)
  _minmax_op(f"v_min_{_t}", "min", _t, 2)
  _minmax_op(f"v_max_{_t}", "max", _t, 2)
  _op(f"v_fma_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: _fma(a, b, c))
for _t in ("f16", "f32"):
  _op(f"v_sub_{_t}", _t, f"{_t} {_t}", lambda a, b: a - b)
  _op(f"v_subrev_{_t}", _t, f"{_t} {_t}", lambda a, b: b - a)
  for _kind in ("min3", "max3", "med3", "maxmin", "minmax"):
    _minmax_op(f"v_{_kind}_{_t}", _kind, _t, 3)
  _op(f"v_div_fixup_{_t}", _t, f"{_t} {_t} {_t}", rf.div_fixup)
_op("v_div_fixup_f64", "f64", "f64 f64 f64", rf.div_fixup)
_op("v_mul_dx9_zero_f32", "f32", "f32 f32", lambda a, b: np.where((a == 0) | (b == 0), np.float32(0), a * b))
_op("v_fma_dx9_zero_f32", "f32", "f32 f32 f32", lambda a, b, c: np.where((a == 0) | (b == 0), c, _fma(a, b, c)))
_op("v_ldexp_f32", "f32", "f32 i32", lambda a, b: np.ldexp(a, np.clip(b, -1000, 1000)).astype(F32))
_op("v_ldexp_f64", "f64", "f64 i32", lambda a, b: np.ldexp(a, np.clip(b, -5000, 5000)))
_op("v_ldexp_f16", "f16", "f16 i16", lambda a, b: np.ldexp(a, np.clip(b.astype(I32), -100, 100)).astype(F16))
_op("v_mul_i32_i24", "i32", "u32 u32", lambda a, b: (_i24(a) * _i24(b)).astype(I32))
_op("v_mul_hi_i32_i24", "i32", "u32 u32", lambda a, b: ((_i24(a) * _i24(b)) >> 32).astype(I32))
_op("v_mul_u32_u24", "u32", "u32 u32", lambda a, b: (_u24(a).astype(U64) * _u24(b)).astype(U32))
_op("v_mul_hi_u32_u24", "u32", "u32 u32", lambda a, b: ((_u24(a).astype(U64) * _u24(b)) >> np.uint64(32)).astype(U32))
_op("v_mad_i32_i24", "i32", "u32 u32 i32", lambda a, b, c: (_i24(a) * _i24(b) + c).astype(I32))
_op("v_mad_u32_u24", "u32", "u32 u32 u32", lambda a, b, c: (_u24(a).astype(U64) * _u24(b) + c).astype(U32))
for _t in ("i32", "u32", "i16", "u16"):
  _op(f"v_min_{_t}", _t, f"{_t} {_t}", np.minimum)
  _op(f"v_max_{_t}", _t, f"{_t} {_t}", np.maximum)
  _op(f"v_min3_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: np.minimum(np.minimum(a, b), c))
  _op(f"v_max3_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: np.maximum(np.maximum(a, b), c))
  _op(f"v_med3_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: _med3(a, b, c, np.minimum, np.maximum))
for _t in ("i32", "u32"):
  _op(f"v_maxmin_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: np.minimum(np.maximum(a, b), c))
  _op(f"v_minmax_{_t}", _t, f"{_t} {_t} {_t}", lambda a, b, c: np.maximum(np.minimum(a, b), c))
_op("v_lshlrev_b32", "u32", "u32 u32", lambda a, b: b << (a & np.uint32(31)))
_op("v_lshrrev_b32", "u32", "u32 u32", lambda a, b: b >> (a & np.uint32(31)))
_op("v_ashrrev_i32", "i32", "u32 i32", lambda a, b: b >> (a & np.uint32(31)).astype(I32))
_op("v_lshlrev_b64", "u64", "u32 u64", lambda a, b: b << (a & np.uint32(63)).astype(U64))
_op("v_lshrrev_b64", "u64", "u32 u64", lambda a, b: b >> (a & np.uint32(63)).astype(U64))
_op("v_ashrrev_i64", "i64", "u32 i64", lambda a, b: b >> (a & np.uint32(63)).astype(I64))
_op("v_lshlrev_b16", "u16", "u16 u16", lambda a, b: b << (a & np.uint16(15)))
_op("v_lshrrev_b16", "u16", "u16 u16", lambda a, b: b >> (a & np.uint16(15)))
_op("v_ashrrev_i16", "i16", "u16 i16", lambda a, b: b >> (a & np.uint16(15)).astype(I16))
_op("v_and_b32", "u32", "u32 u32", lambda a, b: a & b)
_op("v_or_b32", "u32", "u32 u32", lambda a, b: a | b)
_op("v_xor_b32", "u32", "u32 u32", lambda a, b: a ^ b)
_op("v_xnor_b32", "u32", "u32 u32", lambda a, b: ~(a ^ b))
_op("v_and_b16", "u16", "u16 u16", lambda a, b: a & b)
_op("v_or_b16", "u16", "u16 u16", lambda a, b: a | b)
_op("v_xor_b16", "u16", "u16 u16", lambda a, b: a ^ b)
_op("v_add_nc_u32", "u32", "u32 u32", lambda a, b: a + b)
_op("v_sub_nc_u32", "u32", "u32 u32", lambda a, b: a - b)
_op("v_subrev_nc_u32", "u32", "u32 u32", lambda a, b: b - a)
_op("v_add_nc_i32", "i32", "i32 i32", lambda a, b: a + b)
_op("v_sub_nc_i32", "i32", "i32 i32", lambda a, b: a - b)
_op("v_add_nc_u16", "u16", "u16 u16", lambda a, b: a + b)
_op("v_sub_nc_u16", "u16", "u16 u16", lambda a, b: a - b)
_op("v_add_nc_i16", "i16", "i16 i16", lambda a, b: a + b)
_op("v_sub_nc_i16", "i16", "i16 i16", lambda a, b: a - b)
_op("v_mul_lo_u16", "u16", "u16 u16", lambda a, b: a * b)
_op("v_mad_u16", "u16", "u16 u16 u16", lambda a, b, c: a * b + c)
_op("v_mad_i16", "i16", "i16 i16 i16", lambda a, b, c: a * b + c)
_op("v_mad_u32_u16", "u32", "u16 u16 u32", lambda a, b, c: a.astype(U32) * b.astype(U32) + c)
_op("v_mad_i32_i16", "i32", "i16 i16 i32", lambda a, b, c: a.astype(I32) * b.astype(I32) + c)
_op("v_mul_lo_u32", "u32", "u32 u32", lambda a, b: a * b)
_op("v_mul_hi_u32", "u32", "u32 u32", _mul_hi_u32)
_op("v_mul_hi_i32", "i32", "i32 i32", _mul_hi_i32)
_op("v_bfe_u32", "u32", "u32 u32 u32", _bfe_u32)
_op("v_bfe_i32", "i32", "u32 u32 u32", _bfe_i32)
_op("v_bfi_b32", "u32", "u32 u32 u32", lambda a, b, c: (a & b) | (~a & c))
_op("v_bfm_b32", "u32", "u32 u32", lambda a, b: (((np.uint64(1) << (a & np.uint32(31)).astype(U64)) - np.uint64(1)).astype(U32))
                                               << (b & np.uint32(31)))
_op("v_alignbit_b32", "u32", "u32 u32 u32", _alignbit)
_op("v_alignbyte_b32", "u32", "u32 u32 u32", _alignbyte)
_op("v_perm_b32", "u32", "u32 u32 u32", _perm)
_op("v_lshl_add_u32", "u32", "u32 u32 u32", lambda a, b, c: (a << (b & np.uint32(31))) + c)
_op("v_add_lshl_u32", "u32", "u32 u32 u32", lambda a, b, c: (a + b) << (c & np.uint32(31)))
_op("v_add3_u32", "u32", "u32 u32 u32", lambda a, b, c: a + b + c)
_op("v_lshl_or_b32", "u32", "u32 u32 u32", lambda a, b, c: (a << (b & np.uint32(31))) | c)
_op("v_and_or_b32", "u32", "u32 u32 u32", lambda a, b, c: (a & b) | c)
_op("v_or3_b32", "u32", "u32 u32 u32", lambda a, b, c: a | b | c)
_op("v_xor3_b32", "u32", "u32 u32 u32", lambda a, b, c: a ^ b ^ c)
_op("v_xad_u32", "u32", "u32 u32 u32", lambda a, b, c: (a ^ b) + c)
_op("v_bcnt_u32_b32", "u32", "u32 u32", lambda a, b: np.bitwise_count(a).astype(U32) + b)
_op("v_cvt_pk_rtz_f16_f32", "u32", "f32 f32", _cvt_pk_rtz)
_op("v_cvt_pk_norm_i16_f32", "u32", "f32 f32", lambda a, b: _cvt_pk_norm(a, b, True, F32))
_op("v_cvt_pk_norm_u16_f32", "u32", "f32 f32", lambda a, b: _cvt_pk_norm(a, b, False, F32))
_op("v_cvt_pk_norm_i16_f16", "u32", "f16 f16", lambda a, b: _cvt_pk_norm(a, b, True, F16))
_op("v_cvt_pk_norm_u16_f16", "u32", "f16 f16", lambda a, b: _cvt_pk_norm(a, b, False, F16))
_op("v_cvt_pk_u16_u32", "u32", "u32 u32", lambda a, b: np.minimum(a, 0xFFFF) | (np.minimum(b, 0xFFFF) << np.uint32(16)))
_op("v_cvt_pk_i16_i32", "u32", "i32 i32", lambda a, b: np.clip(a, -32768, 32767).astype(U16).astype(U32)
                                                     | (np.clip(b, -32768, 32767).astype(U16).astype(U32) << np.uint32(16)))
_op("v_cvt_pk_i16_f32", "u32", "f32 f32", lambda a, b: _cvt_int(a, -32768, 32767, U16).astype(U32)
                                                     | (_cvt_int(b, -32768, 32767, U16).astype(U32) << np.uint32(16)))
_op("v_cvt_pk_u16_f32", "u32", "f32 f32", lambda a, b: _cvt_int(a, 0, 65535, U32) | (_cvt_int(b, 0, 65535, U32) << np.uint32(16)))
_op("v_cvt_pk_u8_f32", "u32", "f32 u32 u32", lambda a, b, c: (c & ~(np.uint32(0xFF) << ((b & np.uint32(3)) * np.uint32(8))))
                                                           | (_cvt_int(np.rint(a), 0, 255, U32) << ((b & np.uint32(3)) * np.uint32(8))))
_op("v_pack_b32_f16", "u32", "f16 f16", lambda a, b: a.view(U16).astype(U32) | (b.view(U16).astype(U32) << np.uint32(16)))
_op("v_sad_u8", "u32", "u32 u32 u32", lambda a, b, c: sum(np.abs(((a >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(I32)
                                                                  - ((b >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(I32))
                                                           for i in range(4)).astype(U32) + c)
_op("v_sad_u16", "u32", "u32 u32 u32", lambda a, b, c: sum(np.abs(((a >> np.uint32(16 * i)) & np.uint32(0xFFFF)).astype(I32)
                                                                   - ((b >> np.uint32(16 * i)) & np.uint32(0xFFFF)).astype(I32))
                                                            for i in range(2)).astype(U32) + c)
_op("v_sad_u32", "u32", "u32 u32 u32", lambda a, b, c: (np.abs(a.astype(I64) - b.astype(I64)) + c).astype(U32))


def _cls_i32(a):
  x = np.asarray(a).astype(U32).view(I32)
  y = np.where(x < 0, ~x, x).astype(U32)          # leading sign bits = leading zeros of y
  return np.where((x == 0) | (x == -1), -1, 31 - _top_bit(y)).astype(I32)


_fma = rf.fma         # one rounding ("0.5ULP accuracy", V_FMA_F32/F64/F16 in 16.12)


# ---- raw bits <-> typed values ----

def typed(raw, t: str, hi: bool = False):
  """Raw register bits (uint32 or uint64 array/scalar) as numpy values of type t."""
  if BITS[t] == 16:
    h = (raw >> np.uint32(16)) if hi else raw
    return np.asarray(h).astype(U16).view(DTYPES[t]) if t != "u16" else np.asarray(h).astype(U16)
  raw = np.asarray(raw)
  if BITS[t] == 64:
    raw = raw.astype(U64, copy=False)
    return raw.view(DTYPES[t]) if t != "u64" else raw
  raw = raw.astype(U32, copy=False)
  return raw.view(DTYPES[t]) if t != "u32" else raw


def raw_bits(value, t: str):
  """Typed values -> raw bits: uint32 for 16/32-bit types (16-bit zero-extended), uint64 for 64."""
  v = np.asarray(value)
  if t in FLOAT:
    v = v.astype(DTYPES[t], copy=False)
    if t == "f16": return v.view(U16).astype(U32)
    return v.view(U32 if t == "f32" else U64)
  if BITS[t] == 16: return v.astype(U16).astype(U32)
  return v.astype(U32 if BITS[t] == 32 else U64)


# ---- compilation of one VALU instruction ----

def _kind_bits(kind: str) -> int:
  return 64 if kind in ("b64", "f64", "v64", "s64") else 32


class _Valu:
  """Decoded fields of one VALU instruction and the source readers built from them."""

  def __init__(self, inst, get, literal, n_vgprs, mode: FloatMode):
    self.inst, self.get, self.literal, self.n_vgprs, self.mode = inst, get, literal, n_vgprs, mode
    self.vop3 = inst.fmt == "VOP3"
    self.vop3p = inst.fmt == "VOP3P"
    f = lambda name: get(name) if name in _fields(inst) else 0
    self.neg = f("neg") if (self.vop3 or self.vop3p) else 0
    self.abs = f("abs") if self.vop3 and "abs" in inst.modifiers else 0
    self.clamp = f("clamp") if (self.vop3 or self.vop3p) else 0
    self.omod = f("omod") if self.vop3 else 0
    self.op_sel = f("op_sel") if (self.vop3 or self.vop3p) else 0
    self.sources = []        # (operand, reader) in assembly order for src0/src1/src2/vsrc1/k
    for op in inst.operands:
      if op.field in ("src0", "src1", "src2", "vsrc1"):
        self.sources.append((op, self.reader(op)))
      elif op.kind in ("k32", "k16"):
        c = U32(literal)
        self.sources.append((op, lambda w, sel, c=c: c))

  def reader(self, op):
    bits = _kind_bits(op.kind)
    code = self.get(op.field)
    if op.field == "vsrc1": code += 256            # an 8-bit VGPR field
    return vector_source(code, bits, self.literal, self.n_vgprs, kind16=op.kind in ("f16", "i16", "bf16", "v2f16", "v2bf16"),
                         float64=op.kind == "f64", signed64="_i64" in self.inst.name, packed16=op.kind in ("v2f16", "v2bf16"))

  def vdst(self) -> int:
    return self.get("vdst")

  def sdst(self) -> int:
    return self.get("sdst")


def _fields(inst) -> dict:
  from baregrad.drivers.amd.isa import FORMATS
  return FORMATS[inst.fmt].fields


def _modify(x, t, i, d: _Valu):
  """Input modifiers abs/neg (VOP3) for float source i."""
  if t not in FLOAT: return x
  if (d.abs >> i) & 1: x = np.abs(x)
  if (d.neg >> i) & 1: x = -x
  return x


def _clamp01(r, dx10_clamp: bool):
  """The clamp output modifier on a float result: into [0.0, 1.0]; a NaN becomes 0.0 under MODE.DX10_CLAMP and
  passes through otherwise (LLVM AMDGPUUsage, COMPUTE_PGM_RSRC1 "DX10_CLAMP")."""
  r = np.asarray(r)
  clipped = np.clip(r, r.dtype.type(0), r.dtype.type(1))
  return np.where(np.isnan(r), r.dtype.type(0), clipped) if dx10_clamp else clipped


def _output(r, t, d: _Valu):
  if t in FLOAT:
    if d.omod:
      r = r * r.dtype.type({1: 2.0, 2: 4.0, 3: 0.5}[d.omod])
    if d.clamp:
      r = _clamp01(r, d.mode.dx10_clamp)
  return r


def _write_result(w, sel, d: _Valu, out_t: str, result, lanes):
  """Write a typed result to vdst (one or two registers; 16-bit results into the low half, or
  the high half with op_sel[3], keeping the other half)."""
  vdst = d.vdst()
  raw = raw_bits(result, out_t)
  if BITS[out_t] == 64:
    w.write_v(vdst, sel, (raw & np.uint64(0xFFFFFFFF)).astype(U32), lanes)
    w.write_v(vdst + 1, sel, (raw >> np.uint64(32)).astype(U32), lanes)
  elif BITS[out_t] == 16 and d.vop3 and (d.op_sel >> 3) & 1:
    old = w.V[vdst][sel]
    w.write_v(vdst, sel, (old & np.uint32(0xFFFF)) | (raw << np.uint32(16)), lanes)
  else:
    w.write_v(vdst, sel, raw, lanes)


def _active(w, sel):
  """lanes mask for write_v: None when every lane of the selected waves is active."""
  return None if w.all_active(sel) else w.lanes(sel)


def compile_valu(inst, get, literal, n_vgprs, mode: FloatMode):
  """A function run(w, sel) executing this VALU instruction, or None if unimplemented. `mode`: the wave's MODE
  bits (from the kernel descriptor) that float results depend on."""
  name = inst.name
  d = _Valu(inst, get, literal, n_vgprs, mode)
  if name.startswith("v_cmp"): return _compile_cmp(d)
  if name.startswith("v_wmma"): return _compile_wmma(d)
  special = _SPECIAL.get(name)
  if special: return special(d)
  if inst.fmt == "VOP3P" or name.startswith("v_fma_mix") or name.startswith("v_dot2"):
    return _compile_packed(d)
  readers = [r for _, r in d.sources]
  if name in _ACCUMULATE:
    # D = S0 * S1 + D: the destination is the third source
    out_t, in_ts, fn = OPS[_ACCUMULATE[name]]
    readers = readers + [vector_source(256 + d.vdst(), 32, None, n_vgprs)]
  elif name in ("v_fmamk_f32", "v_fmamk_f16", "v_fmaak_f32", "v_fmaak_f16"):
    out_t, in_ts, fn = OPS[f"v_fma_{name[-3:]}"]     # sources in assembly order: a, k, b / a, b, k
    if name.startswith("v_fmamk"): fn = lambda a, k, b, f=fn: f(a, k, b)
  elif name in OPS:
    out_t, in_ts, fn = OPS[name]
    if name in _MINMAX_KIND: fn = _MINMAX_BY_MODE[mode.ieee][_MINMAX_KIND[name]]
  else:
    return None
  if len(readers) != len(in_ts):
    raise EmulatorError(f"{name}: {len(readers)} sources decoded, semantics take {len(in_ts)}")
  check_vgpr(d.vdst(), 2 if BITS[out_t] == 64 else 1, n_vgprs)
  fast = not (d.abs or d.neg or d.clamp or d.omod or d.op_sel)
  sixteen = [BITS[t] == 16 for t in in_ts]
  hi = [bool((d.op_sel >> i) & 1) and d.vop3 for i in range(len(in_ts))]

  if fast and len(in_ts) == 2 and not any(sixteen):
    r0, r1 = readers
    t0, t1 = DTYPES[in_ts[0]], DTYPES[in_ts[1]]
    conv = _fast_out(out_t)
    def run2(w, sel):
      a, b = r0(w, sel), r1(w, sel)
      a = a.view(t0) if a.dtype != t0 else a
      b = b.view(t1) if b.dtype != t1 else b
      w.write_v(d.vdst(), sel, conv(fn(a, b)), _active(w, sel)) if BITS[out_t] != 64 else \
        _write_result(w, sel, d, out_t, fn(a, b), _active(w, sel))
    return run2

  def run(w, sel):
    args = [_modify(typed(r(w, sel), t, h), t, i, d) for i, (r, t, h) in enumerate(zip(readers, in_ts, hi))]
    result = _output(fn(*args), out_t, d)
    if d.clamp and out_t not in FLOAT and name in _SATURATE:
      result = _SATURATE[name](*args)
    _write_result(w, sel, d, out_t, result, _active(w, sel))
  return run


_ACCUMULATE = {"v_fmac_f32": "v_fma_f32", "v_fmac_f16": "v_fma_f16", "v_fmac_dx9_zero_f32": "v_fma_dx9_zero_f32"}


def _fast_out(t):
  if t == "f32": return lambda r: np.asarray(r, F32).view(U32)
  if t == "i32": return lambda r: np.asarray(r).astype(I32, copy=False).view(U32)
  if t == "u32": return lambda r: r
  return lambda r: raw_bits(r, t)


_SATURATE = {
  "v_add_nc_u32": lambda a, b: _sat_add(a, b, 0, 2**32 - 1),
  "v_sub_nc_u32": lambda a, b: np.clip(a.astype(I64) - b.astype(I64), 0, 2**32 - 1),
  "v_add_nc_i32": lambda a, b: _sat_add(a, b, -2**31, 2**31 - 1),
  "v_sub_nc_i32": lambda a, b: np.clip(a.astype(I64) - b.astype(I64), -2**31, 2**31 - 1),
  "v_add_nc_u16": lambda a, b: _sat_add(a, b, 0, 65535),
  "v_sub_nc_u16": lambda a, b: np.clip(a.astype(I64) - b.astype(I64), 0, 65535),
  "v_add_nc_i16": lambda a, b: _sat_add(a, b, -32768, 32767),
  "v_sub_nc_i16": lambda a, b: np.clip(a.astype(I64) - b.astype(I64), -32768, 32767),
}


# ---- compares: v_cmp_<op>_<type>, v_cmpx_<op>_<type>, v_cmp_class_<type> ----
# RDNA3 ISA guide, 16.9 "VOPC Instructions", Table "Float Compare Operations": LT..GE and LG (<>) are false when an
# operand is NaN, O/U test for NaN, NGE..NLT are the negations (true on NaN); integers have no LG/O/U/N* forms.

_CMP = {
  "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "t": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
  "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
  "ne": np.not_equal, "lg": lambda a, b: np.less(a, b) | np.greater(a, b),
  "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)), "u": lambda a, b: np.isnan(a) | np.isnan(b),
  "nge": lambda a, b: ~np.greater_equal(a, b), "nlg": lambda a, b: ~(np.less(a, b) | np.greater(a, b)),
  "ngt": lambda a, b: ~np.greater(a, b), "nle": lambda a, b: ~np.less_equal(a, b),
  "neq": lambda a, b: ~np.equal(a, b), "nlt": lambda a, b: ~np.less(a, b),
}


def _class_mask(x, m):
  """V_CMP_CLASS_F32 (16.9): bit i of m tests class i (0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal,
  5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf)."""
  info = np.finfo(x.dtype)
  raw = x.view({F16: U16, F32: U32, F64: U64}[x.dtype.type])
  quiet_bit = raw.dtype.type(1) << raw.dtype.type(info.nmant - 1)
  nan = np.isnan(x)
  neg = np.signbit(x)
  ax = np.abs(x)
  classes = [nan & ((raw & quiet_bit) == 0), nan & ((raw & quiet_bit) != 0),
             np.isneginf(x), neg & (ax >= info.tiny) & np.isfinite(x), neg & (ax < info.tiny) & (ax > 0),
             neg & (x == 0), ~neg & (x == 0), ~neg & (ax < info.tiny) & (ax > 0),
             ~neg & (ax >= info.tiny) & np.isfinite(x), np.isposinf(x)]
  m = np.asarray(m).astype(U32)
  out = np.zeros(np.broadcast(x, m).shape, bool)
  for i, c in enumerate(classes): out |= c & (((m >> np.uint32(i)) & np.uint32(1)) != 0)
  return out


def _compile_cmp(d: _Valu):
  m = re.fullmatch(r"v_cmp(x?)_(\w+?)_([fiu])(16|32|64)", d.inst.name)
  if not m: return None
  cmpx, op, kind, bits = m[1] == "x", m[2], m[3], int(m[4])
  t = {"f": "f", "i": "i", "u": "u"}[kind] + str(bits)
  readers = [r for _, r in d.sources]
  if op == "class":
    def test(a_raw, b_raw, w, sel):
      a = _modify(typed(a_raw, t, d.vop3 and d.op_sel & 1), t, 0, d)
      return _class_mask(a, typed(b_raw, "u32"))
  else:
    fn = _CMP[op]
    def test(a_raw, b_raw, w, sel):
      a = _modify(typed(a_raw, t, d.vop3 and d.op_sel & 1), t, 0, d)
      b = _modify(typed(b_raw, t, d.vop3 and (d.op_sel >> 1) & 1), t, 1, d)
      return fn(a, b)
  # VOPC writes VCC; the VOP3 form writes the SGPR(s) in vdst; v_cmpx writes EXEC only (gfx10+)
  dst = EXEC if cmpx else (d.get("vdst") if d.vop3 else VCC)
  r0, r1 = readers

  def run(w, sel):
    result = test(r0(w, sel), r1(w, sel), w, sel) & w.lanes(sel)
    w.write_s(dst, sel, mask_to_bits(np.broadcast_to(result, (len(w.pc[sel]), 32))))
  return run


# ---- ops with carries, masks, lanes ----

def _per_wave(x, k: int) -> np.ndarray:
  """A scalar operand as one value per wave (a VGPR given where an SGPR belongs reads lane 0)."""
  x = np.asarray(x)
  if x.ndim == 2: x = x[:, 0]
  return np.broadcast_to(x.reshape(-1), (k,))


def _mask_source(d: _Valu, field: str | None):
  """Reader of a lane mask: the SGPR in `field` (VOP3 src2) or VCC (VOP2)."""
  if field is None or not d.vop3: return lambda w, sel: bits_to_mask(w.S[VCC][sel])
  code = d.get(field)
  if code >= 128:
    from .rdna3_state import inline_constant
    c = inline_constant(code, 32)
    if c is None: raise EmulatorError(f"{d.inst.name}: unsupported mask operand {code}")
    return lambda w, sel: np.broadcast_to(bits_to_mask(np.full(len(w.pc[sel]), c, U32)), (len(w.pc[sel]), 32))
  return lambda w, sel: bits_to_mask(w.S[code][sel])


def _carry_dst(d: _Valu) -> int:
  return d.sdst() if d.vop3 else VCC


def _compile_cndmask(d: _Valu):
  r0, r1 = d.sources[0][1], d.sources[1][1]
  mask = _mask_source(d, "src2")
  b16 = d.inst.name.endswith("b16")
  t = "f16" if b16 else "f32"

  def run(w, sel):
    a, b = r0(w, sel), r1(w, sel)
    if d.abs or d.neg:
      a = raw_bits(_modify(typed(a, t), t, 0, d), t)
      b = raw_bits(_modify(typed(b, t), t, 1, d), t)
    r = np.where(mask(w, sel), b, a)
    if b16: r = r & np.uint32(0xFFFF)
    w.write_v(d.vdst(), sel, r, _active(w, sel))
  return run


def _compile_carry(d: _Valu):
  """v_add_co_u32, v_sub_co_u32, v_subrev_co_u32 and the _co_ci_ forms with a carry input."""
  name = d.inst.name
  r0, r1 = d.sources[0][1], d.sources[1][1]
  carry_in = _mask_source(d, "src2") if "_ci_" in name else None
  sub, rev = "_sub" in name, "subrev" in name
  cdst = _carry_dst(d)

  def run(w, sel):
    a, b = r0(w, sel).astype(I64), r1(w, sel).astype(I64)
    if rev: a, b = b, a
    c = carry_in(w, sel).astype(I64) if carry_in else 0
    full = a - b - c if sub else a + b + c
    carry = (full < 0) if sub else (full > 0xFFFFFFFF)
    lanes = w.lanes(sel)
    result = np.clip(full, 0, 0xFFFFFFFF) if d.clamp else full
    w.write_v(d.vdst(), sel, result.astype(U32), None if w.all_active(sel) else lanes)
    w.write_s(cdst, sel, mask_to_bits(np.broadcast_to(carry, lanes.shape) & lanes))
  return run


def _compile_mad64(d: _Valu):
  """v_mad_u64_u32 / v_mad_i64_i32: D.u64 = S0 * S1 + S2.u64, carry out to sdst."""
  signed = "_i64" in d.inst.name
  r0, r1, r2 = (r for _, r in d.sources)
  check_vgpr(d.vdst(), 2, d.n_vgprs)

  def run(w, sel):
    a, b, c = r0(w, sel), r1(w, sel), r2(w, sel)
    if signed:
      prod = a.astype(U32).view(I32).astype(I64) * b.astype(U32).view(I32).astype(I64)
      full = prod.astype(U64) + c.astype(U64)
      carry = np.zeros(np.shape(full), bool)   # signed overflow of the 64-bit sum (rare; not tracked)
    else:
      prod = a.astype(U64) * b.astype(U64)
      full = prod + c.astype(U64)
      carry = full < prod
    lanes = w.lanes(sel)
    act = None if w.all_active(sel) else lanes
    full = np.broadcast_to(full, lanes.shape)
    w.write_v(d.vdst(), sel, (full & np.uint64(0xFFFFFFFF)).astype(U32), act)
    w.write_v(d.vdst() + 1, sel, (full >> np.uint64(32)).astype(U32), act)
    w.write_s(d.sdst(), sel, mask_to_bits(np.broadcast_to(carry, lanes.shape) & lanes))
  return run


def _compile_div_scale(d: _Valu):
  """v_div_scale_f32/f64 (VOP3SD): D = S0 scaled for the division macro, the lane mask of quotients to be rescaled
  by v_div_fmas in SDST (rdna3_float.div_scale; inactive lanes read 0)."""
  t = "f64" if d.inst.name.endswith("f64") else "f32"
  readers = [r for _, r in d.sources]
  check_vgpr(d.vdst(), 2 if t == "f64" else 1, d.n_vgprs)

  def run(w, sel):
    s0, s1, s2 = (_modify(typed(r(w, sel), t), t, i, d) for i, r in enumerate(readers))
    lanes = w.lanes(sel)
    value, vcc = rf.div_scale(s0, s1, s2)
    _write_result(w, sel, d, t, _output(np.broadcast_to(value, lanes.shape), t, d), _active(w, sel))
    w.write_s(d.sdst(), sel, mask_to_bits(np.broadcast_to(vcc, lanes.shape) & lanes))
  return run


def _compile_div_fmas(d: _Valu):
  """v_div_fmas_f32/f64: fma(S0, S1, S2), rescaled on the lanes VCC selects (rdna3_float.div_fmas)."""
  t = "f64" if d.inst.name.endswith("f64") else "f32"
  readers = [r for _, r in d.sources]
  check_vgpr(d.vdst(), 2 if t == "f64" else 1, d.n_vgprs)

  def run(w, sel):
    a, b, c = (_modify(typed(r(w, sel), t), t, i, d) for i, r in enumerate(readers))
    lanes = w.lanes(sel)
    result = rf.div_fmas(a, b, c, bits_to_mask(w.S[VCC][sel]))
    _write_result(w, sel, d, t, _output(np.broadcast_to(result, lanes.shape), t, d), _active(w, sel))
  return run


def _compile_readfirstlane(d: _Valu):
  r0 = d.sources[0][1]
  dst = d.get("vdst")

  def run(w, sel):
    v = np.broadcast_to(r0(w, sel), (len(w.pc[sel]), 32))
    lanes = w.lanes(sel)
    first = np.where(lanes.any(axis=1), lanes.argmax(axis=1), 0)
    w.write_s(dst, sel, v[np.arange(v.shape[0]), first])
  return run


def _compile_readlane(d: _Valu):
  r0 = d.sources[0][1]
  lane_sel = d.sources[1][1]
  dst = d.get("vdst")

  def run(w, sel):
    v = np.broadcast_to(r0(w, sel), (len(w.pc[sel]), 32))
    lane = _per_wave(lane_sel(w, sel), v.shape[0]) & np.uint32(31)
    w.write_s(dst, sel, v[np.arange(v.shape[0]), lane])
  return run


def _compile_writelane(d: _Valu):
  r0, lane_sel = d.sources[0][1], d.sources[1][1]

  def run(w, sel):
    k = len(w.pc[sel])
    lane = _per_wave(lane_sel(w, sel), k) & np.uint32(31)
    mask = np.zeros((k, 32), bool)
    mask[np.arange(k), lane] = True
    w.write_v(d.vdst(), sel, np.broadcast_to(r0(w, sel), (k, 32)), mask)   # ignores EXEC
  return run


def _compile_mbcnt(d: _Valu):
  r0, r1 = d.sources[0][1], d.sources[1][1]
  lo = d.inst.name == "v_mbcnt_lo_u32_b32"
  below = ((np.uint64(1) << LANE.astype(U64)) - np.uint64(1)).astype(U32)   # lanes below this one

  def run(w, sel):
    a, b = r0(w, sel), r1(w, sel)
    count = np.bitwise_count(a & below).astype(U32) if lo else np.uint32(0)   # wave32: the hi half counts none
    w.write_v(d.vdst(), sel, count + b, _active(w, sel))
  return run


def _compile_swap(d: _Valu):
  src = d.get("src0") - 256

  def run(w, sel):
    lanes = _active(w, sel)
    a, b = w.V[d.vdst()][sel].copy(), w.V[src][sel].copy()
    w.write_v(d.vdst(), sel, b, lanes)
    w.write_v(src, sel, a, lanes)
  return run


def _compile_permlane64(d: _Valu):
  return lambda w, sel: None          # wave32: no other half to swap with


def _compile_nop(d: _Valu):
  return lambda w, sel: None          # V_NOP: does nothing (a VALU slot: hazard padding, LLVM's fixWMMAHazards)


_SPECIAL = {
  "v_cndmask_b32": _compile_cndmask, "v_cndmask_b16": _compile_cndmask,
  "v_add_co_u32": _compile_carry, "v_sub_co_u32": _compile_carry, "v_subrev_co_u32": _compile_carry,
  "v_add_co_ci_u32": _compile_carry, "v_sub_co_ci_u32": _compile_carry, "v_subrev_co_ci_u32": _compile_carry,
  "v_mad_u64_u32": _compile_mad64, "v_mad_i64_i32": _compile_mad64,
  "v_div_scale_f32": _compile_div_scale, "v_div_scale_f64": _compile_div_scale,
  "v_div_fmas_f32": _compile_div_fmas, "v_div_fmas_f64": _compile_div_fmas,
  "v_readfirstlane_b32": _compile_readfirstlane, "v_readlane_b32": _compile_readlane,
  "v_writelane_b32": _compile_writelane, "v_mbcnt_lo_u32_b32": _compile_mbcnt, "v_mbcnt_hi_u32_b32": _compile_mbcnt,
  "v_swap_b32": _compile_swap, "v_permlane64_b32": _compile_permlane64, "v_nop": _compile_nop,
}


# ---- VOP3P: packed 16-bit math, mixed-precision fma, dot products ----

_PK = {
  "v_pk_add_f16": ("f16", lambda a, b: a + b), "v_pk_mul_f16": ("f16", lambda a, b: a * b),
  "v_pk_min_f16": ("f16", _MINMAX_BY_MODE[True]["min"]), "v_pk_max_f16": ("f16", _MINMAX_BY_MODE[True]["max"]),
  "v_pk_fma_f16": ("f16", lambda a, b, c: _fma(a, b, c)),
  "v_pk_add_u16": ("u16", lambda a, b: a + b), "v_pk_sub_u16": ("u16", lambda a, b: a - b),
  "v_pk_add_i16": ("i16", lambda a, b: a + b), "v_pk_sub_i16": ("i16", lambda a, b: a - b),
  "v_pk_mul_lo_u16": ("u16", lambda a, b: a * b),
  "v_pk_max_u16": ("u16", np.maximum), "v_pk_min_u16": ("u16", np.minimum),
  "v_pk_max_i16": ("i16", np.maximum), "v_pk_min_i16": ("i16", np.minimum),
  "v_pk_lshlrev_b16": ("u16", lambda a, b: b << (a & np.uint16(15))),
  "v_pk_lshrrev_b16": ("u16", lambda a, b: b >> (a & np.uint16(15))),
  "v_pk_ashrrev_i16": ("i16", lambda a, b: b >> (a & np.int16(15))),
  "v_pk_mad_u16": ("u16", lambda a, b, c: a * b + c), "v_pk_mad_i16": ("i16", lambda a, b, c: a * b + c),
}


_PK_MINMAX_KIND = {"v_pk_min_f16": "min", "v_pk_max_f16": "max"}


def _compile_packed(d: _Valu):
  name = d.inst.name
  readers = [r for _, r in d.sources]
  get = d.get
  op_sel = get("op_sel") if d.vop3p else d.op_sel
  op_sel_hi = (get("op_sel_hi") | (get("op_sel_hi2") << 2)) if d.vop3p else 0
  neg_lo = get("neg") if d.vop3p else 0
  neg_hi = get("neg_hi") if d.vop3p else 0
  clamp = get("clamp") if d.vop3p else 0

  def half(raw, i, which_hi: bool, t):
    v = typed(raw, t, which_hi)
    if t in FLOAT and ((neg_hi if which_hi else neg_lo) >> i) & 1 and not name.startswith("v_fma_mix"): v = -v
    return v

  if name in _PK:
    t, fn = _PK[name]
    if name in _PK_MINMAX_KIND: fn = _MINMAX_BY_MODE[d.mode.ieee][_PK_MINMAX_KIND[name]]

    def run(w, sel):
      raws = [r(w, sel) for r in readers]
      lo = fn(*[np.asarray(half(x, i, bool((op_sel >> i) & 1), t)) for i, x in enumerate(raws)])
      hi = fn(*[np.asarray(half(x, i, bool((op_sel_hi >> i) & 1), t)) for i, x in enumerate(raws)])
      if clamp and t in FLOAT: lo, hi = _clamp01(lo, d.mode.dx10_clamp), _clamp01(hi, d.mode.dx10_clamp)
      w.write_v(d.vdst(), sel, raw_bits(lo, t) | (raw_bits(hi, t) << np.uint32(16)), _active(w, sel))
    return run

  if name.startswith("v_fma_mix"):
    # each source is f32 (op_sel_hi bit 0) or the f16 half chosen by op_sel (op_sel_hi bit 1);
    # neg_hi holds the abs bits (RDNA3 ISA guide, VOP3P "v_fma_mix_f32")
    def src(raw, i):
      if (op_sel_hi >> i) & 1: v = typed(raw, "f16", bool((op_sel >> i) & 1)).astype(F32)
      else: v = typed(raw, "f32")
      if (neg_hi >> i) & 1: v = np.abs(v)
      if (neg_lo >> i) & 1: v = -v
      return v

    def run(w, sel):
      a, b, c = (src(r(w, sel), i) for i, r in enumerate(readers))
      r = _fma(a, b, c)
      if clamp: r = _clamp01(r, d.mode.dx10_clamp)
      if name == "v_fma_mix_f32": out = raw_bits(r, "f32")
      else:
        h = raw_bits(r.astype(F16), "f16")
        old = w.V[d.vdst()][sel]
        out = (old & np.uint32(0xFFFF0000)) | h if name == "v_fma_mixlo_f16" else (old & np.uint32(0xFFFF)) | (h << np.uint32(16))
      w.write_v(d.vdst(), sel, out, _active(w, sel))
    return run

  if name in ("v_dot2_f32_f16", "v_dot2_f32_bf16", "v_dot2_f16_f16", "v_dot2_bf16_bf16"):
    bf = "bf16" in name

    def conv(raw, i, hi):
      if bf:
        bits = (np.asarray(raw) >> np.uint32(16)) if hi else np.asarray(raw)
        v = ((bits & np.uint32(0xFFFF)).astype(U32) << np.uint32(16)).view(F32)
      else:
        v = typed(raw, "f16", hi).astype(F32)
      return -v if ((neg_hi if hi else neg_lo) >> i) & 1 else v

    def run(w, sel):
      a, b, c = (r(w, sel) for r in readers)
      acc_t = "f32" if name.startswith("v_dot2_f32") else "f16"
      cv = typed(c, "f32") if acc_t == "f32" else typed(c, "f16").astype(F32)
      r = conv(a, 0, False) * conv(b, 1, False) + conv(a, 0, True) * conv(b, 1, True) + cv
      if clamp: r = _clamp01(r, d.mode.dx10_clamp)
      if acc_t == "f32": out = raw_bits(r, "f32")
      elif bf: out = (np.asarray(r, F32).view(U32) >> np.uint32(16))
      else: out = raw_bits(r.astype(F16), "f16")
      w.write_v(d.vdst(), sel, out, _active(w, sel))
    return run

  if name in ("v_dot4_i32_iu8", "v_dot4_u32_u8", "v_dot8_i32_iu4", "v_dot8_u32_u4"):
    width, count = (8, 4) if "dot4" in name else (4, 8)
    signed = "_iu" in name
    mask = np.uint32((1 << width) - 1)

    def elems(raw, i):
      out = []
      for j in range(count):
        v = ((np.asarray(raw, U32) >> np.uint32(width * j)) & mask).astype(I64)
        if signed and (neg_lo >> i) & 1: v = np.where(v >= 1 << (width - 1), v - (1 << width), v)   # neg_lo = signedness
        out.append(v)
      return out

    def run(w, sel):
      a, b, c = (r(w, sel) for r in readers)
      acc = np.asarray(c, U32).astype(U32).view(I32).astype(I64) if signed else np.asarray(c, U32).astype(I64)
      for x, y in zip(elems(a, 0), elems(b, 1)): acc = acc + x * y
      if clamp: acc = np.clip(acc, -2**31, 2**31 - 1) if signed else np.clip(acc, 0, 2**32 - 1)
      w.write_v(d.vdst(), sel, acc.astype(U32), _active(w, sel))
    return run
  return None


# ---- WMMA: D = A * B + C on 16x16 matrices held by the whole wave32 ----
# Register layout (RDNA3 ISA guide, "Wave Matrix Multiply Accumulate (WMMA)"; AMD Matrix Instruction Calculator,
# --architecture rdna3, which prints it element by element): A[i][k] is element k of lane i (16-bit inputs: VGPR
# k // 2, bits [15:0] for even k, [31:16] for odd k; 8-bit / 4-bit inputs packed the same way, low bits first), and
# lane i + 16 holds the same copy; B[k][j] is element k of lane j (and of lane j + 16). C and D: element [i][j] is in
# VGPR i // 2 of lane j + 16 * (i % 2), a 32-bit value or, for 16-bit C/D, the half that OPSEL[2] picks (0: bits
# [15:0], 1: bits [31:16]; the other half of each D register is kept, so two 16-bit results can share registers).
# Modifiers of the float forms (calculator, "NEG"): NEG[0] / NEG_HI[0] negate the low / high halves of the A
# registers (even / odd K), NEG[1] / NEG_HI[1] those of B, NEG[2] negates C and NEG_HI[2] takes |C| first; for the
# integer forms NEG[0] / NEG[1] mark A / B as signed and NEG[2], NEG_HI must be 0. OPSEL[0], OPSEL[1] are unused.
# EXEC must be all ones: the instruction reads and writes all 32 lanes. AMD's CDNA5 ISA guide (7.12) says so for
# every WMMA op (as quoted in ROCm/rocm-systems PR 11124); LLVM marks V_WMMA convergent so that it is never moved
# under divergent control flow (llvm-project PR 165602). A partial EXEC is refused, and so are lanes 16-31 whose A/B
# copy differs from lanes 0-15 (the calculator: "A[i][k] Lane: i and i+16"): the result would be undefined.
# Float accumulation: rdna3_float.matrix_sum (exact sum of the 16 products and C, rounded once to nearest even).
_C_ROW = (2 * np.arange(8)[:, None] + np.arange(32)[None, :] // 16)       # (vgpr, lane) -> row
_C_COL = np.broadcast_to(np.arange(32)[None, :] % 16, (8, 32))            # (vgpr, lane) -> column


def _wmma_operand(regs, kind):
  """(k, 16, 16) values of an A or B operand from its (k, 16, n_regs) uint32 registers of lanes 0-15: [wave, lane
  (row of A, column of B), K]; float64 for f16/bf16 (exact), int64 element bits for iu8/iu4."""
  if kind in ("f16", "bf16"):
    halves = np.ascontiguousarray(regs).view(np.uint16)                                # (k, 16, 16), K in order
    if kind == "f16": return halves.view(F16).astype(F64)
    return (halves.astype(U32) << np.uint32(16)).view(F32).astype(F64)
  bits = 8 if kind == "iu8" else 4
  per = 32 // bits
  out = np.empty(regs.shape[:2] + (16,), np.int64)
  for j in range(regs.shape[2]):
    for e in range(per):
      out[:, :, j * per + e] = (regs[:, :, j] >> np.uint32(bits * e)) & np.uint32((1 << bits) - 1)
  return out


def _wmma_negate(x, lo: bool, hi: bool):
  """NEG (even K: low halves) and NEG_HI (odd K: high halves) of one float input matrix [wave, lane, K]."""
  if lo: x[:, :, 0::2] *= -1
  if hi: x[:, :, 1::2] *= -1
  return x


def _compile_wmma(d: _Valu):
  name = d.inst.name
  m = re.fullmatch(r"v_wmma_(f32|f16|bf16|i32)_16x16x16_(f16|bf16|iu8|iu4)", name)
  if not m: return None
  out_t, in_kind = m[1], m[2]
  n_ab = {"f16": 8, "bf16": 8, "iu8": 4, "iu4": 2}[in_kind]
  get = d.get
  a_reg, b_reg, c_code = get("src0") - 256, get("src1") - 256, get("src2")
  neg_lo, neg_hi, clamp = get("neg"), get("neg_hi"), get("clamp")
  hi16 = bool((get("op_sel") >> 2) & 1) and out_t in ("f16", "bf16")
  integer = out_t == "i32"
  if integer and (neg_lo & 4 or neg_hi):
    raise EmulatorError(f"{name}: NEG[2] and NEG_HI must be 0 for the integer WMMA (neg_lo:[{neg_lo & 1},"
                        f"{neg_lo >> 1 & 1},{neg_lo >> 2}] neg_hi bits {neg_hi:#x}); NEG[0]/NEG[1] mark A/B as signed")
  if clamp and not integer: raise EmulatorError(f"{name}: clamp is not a modifier of the float WMMA")
  check_vgpr(d.vdst(), 8, d.n_vgprs)
  check_vgpr(a_reg, n_ab, d.n_vgprs)
  check_vgpr(b_reg, n_ab, d.n_vgprs)
  const, wrong = None, None          # operands LLVM's assembler rejects are refused when the instruction runs
  if a_reg < 0 or b_reg < 0:
    wrong = f"{name}: A (src0) and B (src1) must be VGPRs, not operand codes {a_reg + 256}, {b_reg + 256}"
  if c_code >= 256: check_vgpr(c_code - 256, 8, d.n_vgprs)
  else:
    from .rdna3_state import inline_constant
    const = inline_constant(c_code, 32, out_t in ("f16", "bf16"))
    if const is None:
      wrong = wrong or f"{name}: C (src2) must be 8 VGPRs or an inline constant, not operand code {c_code}"
    elif out_t in ("f16", "bf16"): const = (const & 0xFFFF) * 0x10001      # the 16-bit constant in either half

  def inputs(w, sel, base, what):
    regs = np.stack([w.V[base + j][sel] for j in range(n_ab)], axis=2)               # (k, 32, n_ab)
    if not np.array_equal(regs[:, :16], regs[:, 16:]):
      wave, lane, j = (int(x) for x in np.argwhere(regs[:, :16] != regs[:, 16:])[0])
      raise EmulatorError(f"{name}: {what} matrix: lane {lane + 16} of v{base + j} holds "
                          f"{int(regs[wave, lane + 16, j]):#010x} but lane {lane} holds "
                          f"{int(regs[wave, lane, j]):#010x}; in wave32 lanes 16-31 must repeat "
                          f"the A and B data of lanes 0-15 (A[i][k] and B[k][j] are in lanes i, j and i+16, j+16)")
    return _wmma_operand(regs[:, :16], in_kind)

  def run(w, sel):
    if wrong: raise EmulatorError(wrong)
    lanes = w.lanes(sel)
    if not lanes.all():
      wave = int(np.argmin(lanes.all(axis=1)))
      raise EmulatorError(f"{name}: EXEC is {int(w.S[EXEC][sel][wave]):#010x} in a wave that executes it; WMMA "
                          f"needs EXEC all ones (every lane holds part of the matrices): run it outside divergent "
                          f"control flow, or set exec_lo to -1 around it")
    a = inputs(w, sel, a_reg, "A")
    b = inputs(w, sel, b_reg, "B")
    k = a.shape[0]
    if c_code >= 256: craw = np.stack([w.V[c_code - 256 + j][sel] for j in range(8)])   # (8, k, 32)
    else: craw = np.full((8, k, 32), const, U32)
    if hi16: craw = craw >> np.uint32(16)
    c = np.zeros((k, 16, 16), np.int64 if integer else F64)
    if out_t == "f32": cv = craw.view(F32)
    elif integer: cv = craw.view(I32).astype(np.int64)
    elif out_t == "f16": cv = (craw & np.uint32(0xFFFF)).astype(U16).view(F16)
    else: cv = ((craw & np.uint32(0xFFFF)) << np.uint32(16)).view(F32)
    c[:, _C_ROW, _C_COL] = np.moveaxis(cv, 1, 0)
    if integer:
      bits = 8 if in_kind == "iu8" else 4
      if neg_lo & 1: a = np.where(a >= 1 << (bits - 1), a - (1 << bits), a)
      if neg_lo & 2: b = np.where(b >= 1 << (bits - 1), b - (1 << bits), b)
      dmat = np.matmul(a, np.swapaxes(b, 1, 2)) + c
      dmat = np.clip(dmat, -2**31, 2**31 - 1) if clamp else dmat
      raw = dmat.astype(np.int64).astype(I32).view(U32)
    else:
      a = _wmma_negate(a, bool(neg_lo & 1), bool(neg_hi & 1))
      b = _wmma_negate(b, bool(neg_lo & 2), bool(neg_hi & 2))
      if neg_hi & 4: c = np.abs(c)
      if neg_lo & 4: c = -c
      terms = np.empty((17, k, 16, 16))                                                # (K, wave, row, column)
      np.multiply(np.moveaxis(a, 2, 0)[:, :, :, None], np.moveaxis(b, 2, 0)[:, :, None, :], out=terms[:16])  # exact
      terms[16] = c
      dmat = rf.round_matrix_sum(rf.matrix_sum(terms), out_t)
      if out_t == "f32": raw = dmat.view(U32)
      elif out_t == "f16": raw = dmat.view(U16).astype(U32)
      else: raw = dmat.astype(U32)
    for j in range(8):
      value = raw[:, _C_ROW[j], _C_COL[j]]
      if out_t in ("f16", "bf16"):
        old = w.V[d.vdst() + j][sel]
        if hi16: value = (old & np.uint32(0x0000FFFF)) | (value << np.uint32(16))
        else: value = (old & np.uint32(0xFFFF0000)) | value
      w.write_v(d.vdst() + j, sel, value, None)
  return run


def _compile_dot2acc(d: _Valu):
  """v_dot2acc_f32_f16 (VOP2): D.f32 = S0.lo * S1.lo + S0.hi * S1.hi + D.f32."""
  r0, r1 = d.sources[0][1], d.sources[1][1]

  def run(w, sel):
    a, b = r0(w, sel), r1(w, sel)
    acc = w.V[d.vdst()][sel].view(F32)
    r = (typed(a, "f16").astype(F32) * typed(b, "f16").astype(F32) + typed(a, "f16", True).astype(F32)
         * typed(b, "f16", True).astype(F32) + acc)
    w.write_v(d.vdst(), sel, raw_bits(r, "f32"), _active(w, sel))
  return run


def _compile_pk_fmac(d: _Valu):
  """v_pk_fmac_f16 (VOP2): both halves D = S0 * S1 + D."""
  r0, r1 = d.sources[0][1], d.sources[1][1]

  def run(w, sel):
    a, b, c = r0(w, sel), r1(w, sel), w.V[d.vdst()][sel]
    lo = _fma(typed(a, "f16"), typed(b, "f16"), typed(c, "f16"))
    hi = _fma(typed(a, "f16", True), typed(b, "f16", True), typed(c, "f16", True))
    w.write_v(d.vdst(), sel, raw_bits(lo, "f16") | (raw_bits(hi, "f16") << np.uint32(16)), _active(w, sel))
  return run


def _compile_permlane16(d: _Valu):
  """v_permlane16_b32 / v_permlanex16_b32: lane i of each 16-lane row reads lane sel[i] of the
  same row (x16: of the other row); the 64-bit select is S1 (lanes 0-7) : S2 (lanes 8-15)."""
  src = d.get("src0") - 256
  r1, r2 = d.sources[1][1], d.sources[2][1]
  cross = "x16" in d.inst.name

  def run(w, sel):
    k = len(w.pc[sel])
    lo = _per_wave(r1(w, sel), k).astype(U64)
    hi = _per_wave(r2(w, sel), k).astype(U64)
    selects = lo | (hi << np.uint64(32))
    lane = np.arange(32)
    nib = ((selects[:, None] >> (np.uint64(4) * (lane % 16).astype(U64))) & np.uint64(15)).astype(np.int64)
    row = lane // 16
    source_row = (1 - row) if cross else row
    idx = source_row * 16 + nib
    w.write_v(d.vdst(), sel, np.take_along_axis(w.V[src][sel], idx, axis=1), _active(w, sel))
  return run


_SPECIAL.update({"v_dot2acc_f32_f16": _compile_dot2acc, "v_pk_fmac_f16": _compile_pk_fmac,
                 "v_permlane16_b32": _compile_permlane16, "v_permlanex16_b32": _compile_permlane16})
_op("v_lerp_u8", "u32", "u32 u32 u32", lambda a, b, c: sum(
  (((((a >> np.uint32(8 * i)) & np.uint32(255)) + ((b >> np.uint32(8 * i)) & np.uint32(255))
     + ((c >> np.uint32(8 * i)) & np.uint32(1))) >> np.uint32(1)) << np.uint32(8 * i)) for i in range(4)).astype(U32))
_op("v_sad_hi_u8", "u32", "u32 u32 u32", lambda a, b, c: (sum(np.abs(((a >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(I32)
                                                                      - ((b >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(I32))
                                                               for i in range(4)).astype(U32) << np.uint32(16)) + c)


def implemented_names() -> set[str]:
  """Every VALU mnemonic with semantics (for coverage reports)."""
  from baregrad.drivers.amd import isa
  names = set(OPS) | set(_SPECIAL) | set(_PK) | {"v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16",
                                                   "v_dot2_f32_f16", "v_dot2_f32_bf16", "v_dot2_f16_f16", "v_dot2_bf16_bf16",
                                                   "v_dot4_i32_iu8", "v_dot4_u32_u8", "v_dot8_i32_iu4", "v_dot8_u32_u4",
                                                   "v_fmac_f32", "v_fmac_f16", "v_fmac_dx9_zero_f32",
                                                   "v_fmamk_f32", "v_fmamk_f16", "v_fmaak_f32", "v_fmaak_f16"}
  for fmt in ("VOPC", "VOP3"):
    for n in isa.TABLES[fmt]:
      if n.startswith("v_cmp") and re.fullmatch(r"v_cmpx?_(\w+?)_([fiu])(16|32|64)", n): names.add(n)
  return {n.strip() for n in names}
