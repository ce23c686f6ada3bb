"""dtypes: properties, round trips through Tensor(np) -> ops -> numpy(), promotion rules (weak
Python scalars included), casts between every pair of dtypes, float->int truncation, bitcast.
"""
import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import (ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, check, make, np_dtype, round_to, bf16_round,
                         bg_dtype, default_has, needs_float64_cases, widest_float_name)

# name: (itemsize, is_float, is_int, is_unsigned)
PROPERTIES = {
  "bool": (1, False, False, False), "int8": (1, False, True, False), "uint8": (1, False, True, True),
  "int16": (2, False, True, False), "int32": (4, False, True, False), "int64": (8, False, True, False),
  "uint32": (4, False, True, True), "float16": (2, True, False, False), "bfloat16": (2, True, False, False),
  "float32": (4, True, False, False), "float64": (8, True, False, False),
}


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_dtype_properties(name):
  dt = bg_dtype(name)
  itemsize, is_float, is_int, is_unsigned = PROPERTIES[name]
  assert dt.name == name
  assert dt.itemsize == itemsize
  assert bool(dt.is_float) == is_float and bool(dt.is_int) == is_int and bool(dt.is_unsigned) == is_unsigned
  assert np.dtype(dt.np) == np_dtype(name)


# ----------------------------------------------------------------------------------------------
# round trips
# ----------------------------------------------------------------------------------------------

EXTREMES = {
  "bool": [True, False, True, True],
  "int8": [-128, 127, 0, -1],
  "uint8": [0, 255, 128, 1],
  "int16": [-32768, 32767, 0, -1],
  "int32": [-2 ** 31, 2 ** 31 - 1, 0, -1],
  "int64": [-2 ** 63, 2 ** 63 - 1, 2 ** 40 + 3, -(2 ** 50) - 7],
  "uint32": [0, 2 ** 32 - 1, 2 ** 31, 123456789],
  "float16": [65504.0, 6e-8, -0.0, np.inf, -np.inf, np.nan, 1 / 3, -2.5],
  "bfloat16": [3.3895e38, 1e-38, -0.0, np.inf, -np.inf, np.nan, 1 / 3, -2.5],
  "float32": [3.4028235e38, 1e-45, -0.0, np.inf, -np.inf, np.nan, 1 / 3, -2.5],
  "float64": [1.7976931348623157e308, 5e-324, -0.0, np.inf, -np.inf, np.nan, 1 / 3, -2.5],
}


def _extreme(name):
  return round_to(np.array(EXTREMES[name]), name)


@pytest.mark.parametrize("name", needs_float64_cases(ALL_DTYPES))
def test_round_trip_identity(name):
  x = _extreme(name)
  out = check(make(x, name), x, rtol=0, atol=0, dtype=name)
  if name in FLOAT_DTYPES:  # signed zero survives
    assert np.signbit(out[2])


ROUND_TRIP_OPS = {
  "flip": (lambda t: t.flip(0), lambda x: x[::-1]),
  "reshape_permute": (lambda t: t.reshape(2, -1).permute(1, 0), lambda x: x.reshape(2, -1).T),
  "pad_shrink": (lambda t: t.pad(((2, 1),)).shrink(((2, 2 + len_(t)),)), lambda x: x),
  "where": (lambda t: Tensor([True] * len_(t)).where(t, t.flip(0)), lambda x: x),
  "stepped_slice": (lambda t: t[::-2], lambda x: x[::-2]),
}


def len_(t):
  return t.shape[0]


@pytest.mark.parametrize("op", list(ROUND_TRIP_OPS))
@pytest.mark.parametrize("name", needs_float64_cases(ALL_DTYPES))
def test_round_trip_through_ops(name, op):
  bg_fn, np_fn = ROUND_TRIP_OPS[op]
  x = _extreme(name)
  check(bg_fn(make(x, name)), np.array(np_fn(x)), rtol=0, atol=0, dtype=name)


@pytest.mark.parametrize("name", needs_float64_cases([d for d in ALL_DTYPES if d not in ("bool",)]))
def test_arith_keeps_dtype(name):
  vals = [1, 2, 3, 5] if name in INT_DTYPES else [1.5, -2.0, 0.25, 3.0]
  x = round_to(np.array(vals), name)
  expected = round_to(x.astype(np.float64) * 2 + x.astype(np.float64), name)
  check(make(x, name) * 2 + make(x, name), expected, dtype=name)


def test_bfloat16_creation_forms():
  vals = [1.0, -2.5, 3.140625, 65280.0]
  expected = bf16_round(np.array(vals, np.float32))
  check(Tensor(vals, dtype="bfloat16"), expected, rtol=0, atol=0, dtype="bfloat16")
  check(Tensor(np.array(vals, np.float32)).cast(dtypes.bfloat16), expected, rtol=0, atol=0, dtype="bfloat16")
  check(Tensor.full((2,), 1.5, dtype=dtypes.bfloat16), np.full((2,), 1.5, np.float32), rtol=0, atol=0, dtype="bfloat16")


def test_bfloat16_cast_rounds_to_nearest_even():
  x = np.array([1 / 3, 1.00390625, 1.01171875, -7.77, 1e-3, 12345.678], np.float32)
  check(Tensor(x).cast("bfloat16"), bf16_round(x), rtol=0, atol=0, dtype="bfloat16")


def test_float16_cast_rounds_to_nearest():
  x = np.array([1 / 3, 1.00048828125, 1.00146484375, -7.77, 1e-5, 70000.0], np.float32)
  with np.errstate(over="ignore"):
    expected = x.astype(np.float16)  # 70000 overflows to inf
  check(Tensor(x).cast("float16"), expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# promotion
# ----------------------------------------------------------------------------------------------

PROMOTION = [
  ("bool", "int8", "int8"), ("bool", "uint8", "uint8"), ("bool", "int32", "int32"), ("bool", "float16", "float16"),
  ("bool", "bfloat16", "bfloat16"), ("bool", "float32", "float32"),
  ("int8", "int8", "int8"), ("int8", "int16", "int16"), ("int8", "int32", "int32"), ("int16", "int64", "int64"),
  ("uint8", "int8", "int16"), ("uint8", "int16", "int16"), ("uint8", "int32", "int32"), ("uint8", "uint32", "uint32"),
  ("int32", "uint32", "int64"), ("int8", "uint32", "int64"), ("int64", "uint32", "int64"),
  ("int32", "float16", "float16"), ("int64", "float32", "float32"), ("uint8", "bfloat16", "bfloat16"),
  ("int8", "float64", "float64"), ("uint32", "float32", "float32"), ("int32", "float32", "float32"),
  ("float16", "float32", "float32"), ("float16", "bfloat16", "float32"), ("bfloat16", "float32", "float32"),
  ("float32", "float64", "float64"), ("float16", "float64", "float64"), ("bfloat16", "float64", "float64"),
]


@pytest.mark.parametrize("order", ["ab", "ba"])
@pytest.mark.parametrize("a_dt,b_dt,res", needs_float64_cases(PROMOTION), ids=[f"{a}+{b}" for a, b, _ in PROMOTION])
def test_promotion_add(a_dt, b_dt, res, order):
  a_vals = round_to(np.array([0, 1, 1, 3]), a_dt)
  b_vals = round_to(np.array([1, 0, 2, 4]), b_dt)
  expected = round_to(a_vals.astype(np.float64) + b_vals.astype(np.float64), res)
  a, b = make(a_vals, a_dt), make(b_vals, b_dt)
  out = a + b if order == "ab" else b + a
  check(out, expected, dtype=res)


@pytest.mark.parametrize("a_dt,b_dt,res", [("int8", "uint8", "int16"), ("float16", "bfloat16", "float32"),
                                           ("int32", "float16", "float16"), ("bool", "int16", "int16")],
                         ids=["i8*u8", "f16*bf16", "i32*f16", "bool*i16"])
def test_promotion_mul_and_where(a_dt, b_dt, res):
  a_vals, b_vals = round_to(np.array([1, 0, 2]), a_dt), round_to(np.array([3, 1, 1]), b_dt)
  a, b = make(a_vals, a_dt), make(b_vals, b_dt)
  check(a * b, round_to(a_vals.astype(np.float64) * b_vals.astype(np.float64), res), dtype=res)
  cond = Tensor([True, False, True])
  check(cond.where(a, b), round_to(np.where([True, False, True], a_vals.astype(np.float64), b_vals.astype(np.float64)), res), dtype=res)


WEAK = [
  ("int32+1.5", "int32", lambda t: t + 1.5, lambda x: x + 1.5, "float32"),
  ("float16*2.0", "float16", lambda t: t * 2.0, lambda x: x * 2.0, "float16"),
  ("int8+1", "int8", lambda t: t + 1, lambda x: x + 1, "int8"),
  ("uint8+1", "uint8", lambda t: t + 1, lambda x: x + 1, "uint8"),
  ("int16*2", "int16", lambda t: t * 2, lambda x: x * 2, "int16"),
  ("int64+2", "int64", lambda t: t + 2, lambda x: x + 2, "int64"),
  ("uint32+1", "uint32", lambda t: t + 1, lambda x: x + 1, "uint32"),
  ("bool+1", "bool", lambda t: t + 1, lambda x: x + 1, "int32"),
  ("bool*1.5", "bool", lambda t: t * 1.5, lambda x: x * 1.5, "float32"),
  ("bf16+1", "bfloat16", lambda t: t + 1, lambda x: x + 1, "bfloat16"),
  ("bf16*0.5", "bfloat16", lambda t: t * 0.5, lambda x: x * 0.5, "bfloat16"),
  ("float64+1.5", "float64", lambda t: t + 1.5, lambda x: x + 1.5, "float64"),
  ("float16+3", "float16", lambda t: t + 3, lambda x: x + 3, "float16"),
  ("int32/2", "int32", lambda t: t / 2, lambda x: x / 2, "float32"),
  ("int8/int8", "int8", lambda t: t / t.maximum(1), lambda x: x / np.maximum(x, 1), "float32"),
  ("float16/float16", "float16", lambda t: t / (t + 1), lambda x: x / (x + 1), "float16"),
  ("1.5-int32", "int32", lambda t: 1.5 - t, lambda x: 1.5 - x, "float32"),
  ("2-uint8", "uint8", lambda t: 10 - t, lambda x: 10 - x, "uint8"),
  ("int8>1", "int8", lambda t: t > 1, lambda x: x > 1, "bool"),
  ("float16==2.0", "float16", lambda t: t == 2.0, lambda x: x == 2.0, "bool"),
  ("int32<1.5", "int32", lambda t: t < 1.5, lambda x: x < 1.5, "bool"),
  ("int8.maximum(2)", "int8", lambda t: t.maximum(2), lambda x: np.maximum(x, 2), "int8"),
  ("int16.where-scalar", "int16", lambda t: (t > 1).where(t, 0), lambda x: np.where(x > 1, x, 0), "int16"),
  ("int32.where-float", "int32", lambda t: (t > 1).where(t, 0.5), lambda x: np.where(x > 1, x, 0.5), "float32"),
]


@pytest.mark.parametrize("dt,fn,np_fn,res", needs_float64_cases([w[1:] for w in WEAK]), ids=[w[0] for w in WEAK])
def test_weak_python_scalars(dt, fn, np_fn, res):
  x = round_to(np.array([0, 1, 2, 3]), dt)
  expected = np.asarray(np_fn(x.astype(np.float64) if dt != "bool" else x.astype(np.int64)))
  expected = expected if res == "bool" else round_to(expected, res)
  check(fn(make(x, dt)), expected, dtype=res)


# numpy's result dtypes (bfloat16, which numpy lacks, keeps its dtype like float16); a float64 result of an int input
# is computed in the device's widest float (float32 where it has no float64: tensor/device_dtypes.py)
REDUCE_DTYPES = [
  ("bool", "sum", "int64"), ("bool", "prod", "int64"), ("int8", "sum", "int64"), ("uint8", "sum", "uint64"),
  ("int16", "sum", "int64"), ("int64", "sum", "int64"), ("uint32", "sum", "uint64"), ("float16", "sum", "float16"),
  ("bfloat16", "sum", "bfloat16"), ("float64", "sum", "float64"), ("int32", "mean", "float64"),
  ("int8", "mean", "float64"), ("float16", "mean", "float16"), ("float64", "mean", "float64"),
  ("int8", "max", "int8"), ("bfloat16", "max", "bfloat16"), ("uint8", "min", "uint8"), ("int16", "prod", "int64"),
]


@pytest.mark.parametrize("dt,op,res", needs_float64_cases(REDUCE_DTYPES, at=(0,)),
                         ids=[f"{op}-{dt}" for dt, op, _ in REDUCE_DTYPES])
def test_reduce_result_dtype(dt, op, res):
  x = round_to(np.array([[1, 0, 2], [3, 1, 1]]), dt)
  if dt != "bfloat16": assert getattr(x, op)(1).dtype == np.dtype(res)   # the table is numpy's rule
  if res == "float64": res = widest_float_name()
  ref = getattr(x.astype(np.float64), op)(1)
  check(getattr(make(x, dt), op)(1), round_to(ref, res), dtype=res)


# ----------------------------------------------------------------------------------------------
# casts
# ----------------------------------------------------------------------------------------------

def _cast_values(src, dst):
  """values exactly representable in both dtypes"""
  if src == "bool" or dst == "bool":
    vals = [0, 1, 1, 0] if src == "bool" else [0, 1, 2, 0, 100, 7]
  else:
    vals = [0, 1, 2, 5, 100, 127]
    signed = lambda d: d in FLOAT_DTYPES or d in ("int8", "int16", "int32", "int64")
    if signed(src) and signed(dst):
      vals += [-1, -7, -100, -128]
  return np.array(vals)


@pytest.mark.parametrize("dst", needs_float64_cases(ALL_DTYPES))
@pytest.mark.parametrize("src", needs_float64_cases(ALL_DTYPES))
def test_cast_all_pairs(src, dst):
  vals = _cast_values(src, dst)
  x = round_to(vals, src)
  expected = (vals != 0) if dst == "bool" else round_to(vals, dst)
  check(make(x, src).cast(dst), expected, rtol=0, atol=0, dtype=dst)


@pytest.mark.parametrize("dst", ["int8", "int16", "int32", "int64", "uint8", "uint32"])
@pytest.mark.parametrize("src", needs_float64_cases(["float16", "bfloat16", "float32", "float64"]))
def test_cast_float_to_int_truncates(src, dst):
  vals = np.array([0.5, 1.5, 2.75, 99.9, 0.0, 126.5])
  if not dst.startswith("u"):
    vals = np.concatenate([vals, [-0.5, -1.5, -2.75, -99.9, -127.5]])
  x = round_to(vals, src)
  check(make(x, src).cast(dst), np.trunc(x.astype(np.float64)).astype(dst), rtol=0, atol=0)


@pytest.mark.parametrize("src", needs_float64_cases(["float16", "float32", "float64", "int8", "uint32"]))
def test_cast_to_bool_nonzero(src):
  vals = [0, 3, 0, 1] if src in INT_DTYPES else [0.0, 0.5, -0.0, -2.0, np.inf, 1e-30 if src != "float16" else 1e-7]
  x = round_to(np.array(vals), src)
  check(make(x, src).cast("bool"), x != 0)


def test_cast_large_int_to_float():
  x = np.array([2 ** 24, -(2 ** 24), 2 ** 31 - 128, 2 ** 20 + 1], np.int64)
  check(Tensor(x).cast("float32"), x.astype(np.float32), rtol=0, atol=0)
  if default_has(["float64"]): check(Tensor(x).cast("float64"), x.astype(np.float64), rtol=0, atol=0)


def test_cast_int_wraps_like_numpy():
  x = np.array([255, 256, 300, -1, 127, 128], np.int32)
  check(Tensor(x).cast("uint8"), x.astype(np.uint8))
  check(Tensor(x).cast("int8"), x.astype(np.int8))


@pytest.mark.parametrize("spec", ["float16", dtypes.float16, np.float16, np.dtype("float16")], ids=["str", "DType", "np.type", "np.dtype"])
def test_cast_dtype_spec_forms(spec):
  check(Tensor([1.5, -2.0]).cast(spec), np.array([1.5, -2.0], np.float16))


def test_cast_inside_graph():
  x = np.array([1.7, -2.2, 3.9], np.float32)
  t = (Tensor(x) * 2).cast("int32") + 1
  check(t, (x * 2).astype(np.int32) + 1)
  check(Tensor(x).cast("float16").cast("float32"), x.astype(np.float16).astype(np.float32), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# bitcast
# ----------------------------------------------------------------------------------------------

BITCAST = [
  ("float32", "int32", [1.0, -2.5, 0.0, -0.0, np.inf, 3.4e38, 1e-40]),
  ("float32", "uint32", [1.0, -2.5, 0.0, -0.0, np.inf, 3.4e38, 1e-40]),
  ("int32", "float32", [0, 1065353216, -1075838976, 2139095040, 1]),
  ("uint32", "float32", [0, 1065353216, 3219128320, 2139095040, 1]),
  ("float16", "int16", [1.0, -2.5, 0.0, -0.0, np.inf, 65504.0, 6e-8]),
  ("int16", "float16", [0, 15360, -16640, 31744, 1]),
  ("int32", "uint32", [0, -1, -2 ** 31, 12345]),
  ("uint32", "int32", [0, 2 ** 32 - 1, 2 ** 31, 12345]),
]


@pytest.mark.parametrize("src,dst,vals", BITCAST, ids=[f"{s}->{d}" for s, d, _ in BITCAST])
def test_bitcast(src, dst, vals):
  x = np.array(vals).astype(src)
  check(Tensor(x).bitcast(dst), x.view(dst), rtol=0, atol=0)


def test_bitcast_of_computed_and_view():
  x = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
  check((Tensor(x) + 1).bitcast("int32"), (x + 1).view(np.int32))
  check(Tensor(x).T.bitcast(dtypes.uint32), np.array(x.T).view(np.uint32))


def test_bitcast_round_trip():
  x = np.array([0.1, -7.25, 1e30], np.float32)
  check(Tensor(x).bitcast("int32").bitcast("float32"), x, rtol=0, atol=0)


def test_element_size_and_nbytes():
  for name in default_has(ALL_DTYPES):
    t = Tensor.zeros(3, dtype=name)
    assert t.element_size() == PROPERTIES[name][0]
    assert t.nbytes() == 3 * PROPERTIES[name][0]


# ----------------------------------------------------------------------------------------------
# wide integers and precise constants
# ----------------------------------------------------------------------------------------------

def test_int64_large_values_arith():
  a = np.array([2 ** 40, -(2 ** 40) - 3, 2 ** 62, 7], np.int64)
  b = np.array([3, 5, -2, 2 ** 33], np.int64)
  check(Tensor(a) + Tensor(b), a + b)
  check(Tensor(a) * Tensor(np.array([2, 3, 1, 4], np.int64)), a * np.array([2, 3, 1, 4], np.int64))
  check(Tensor(a) // Tensor(b), a // b)
  check(Tensor(a) % Tensor(b), a % b)
  check(Tensor(a) < Tensor(b), a < b)


def test_int64_large_python_scalar():
  a = np.array([1, -5, 2 ** 35], np.int64)
  check(Tensor(a) + 2 ** 40, a + np.int64(2 ** 40))
  check(Tensor(a) * 3_000_000_000, a * np.int64(3_000_000_000))
  check(Tensor(a).maximum(2 ** 34), np.maximum(a, np.int64(2 ** 34)))


def test_int64_shift_and_reduce():
  a = np.array([1, 3, -1, 5], np.int64)
  check(Tensor(a) << 40, a << 40)
  big = np.array([2 ** 40, 2 ** 41, -(2 ** 42)], np.int64)
  check(Tensor(big).sum(), np.array(big.sum(), np.int64))
  check(Tensor(big).max(), np.array(big.max(), np.int64))
  check(Tensor(big).min(), np.array(big.min(), np.int64))


def test_uint32_large_values():
  a = np.array([2 ** 31, 2 ** 32 - 1, 5, 3_000_000_000], np.uint32)
  b = np.array([7, 2 ** 31 + 1, 2 ** 31, 3], np.uint32)
  check(Tensor(a) > Tensor(b), a > b)
  check(Tensor(a) // Tensor(b), a // b)
  check(Tensor(a) % Tensor(b), a % b)
  check(Tensor(a) >> 4, a >> np.uint32(4))
  check(Tensor(a).maximum(Tensor(b)), np.maximum(a, b))
  check(Tensor(a).max(), np.array(a.max(), np.uint32))
  check(Tensor(a).min(), np.array(a.min(), np.uint32))
  check(Tensor(a) & 0xFFFF0000, a & np.uint32(0xFFFF0000))
  check(Tensor(a) + 4_000_000_000, a + np.uint32(4_000_000_000))


def test_uint32_large_casts():
  a = np.array([2 ** 31, 2 ** 32 - 256, 3_000_000_000, 1], np.uint32)
  check(Tensor(a).cast("float32"), a.astype(np.float32), rtol=0, atol=0)
  if default_has(["float64"]): check(Tensor(a).cast("float64"), a.astype(np.float64), rtol=0, atol=0)
  check(Tensor(a).cast("int64"), a.astype(np.int64))
  f = np.array([3e9, 2147483648.0, 4294967040.0, 0.5], np.float32)
  check(Tensor(f).cast("uint32"), f.astype(np.uint32))


def test_int64_float_casts_large():
  a = np.array([2 ** 40, -(2 ** 40), 2 ** 53, -(2 ** 62)], np.int64)
  check(Tensor(a).cast("float32"), a.astype(np.float32), rtol=0, atol=0)
  f = np.array([2.0 ** 40, -(2.0 ** 40) - 0.5, 2.0 ** 53, 1e18], np.float64)
  check(Tensor(f.astype(np.float32)).cast("int64"), f.astype(np.float32).astype(np.int64))
  if default_has(["float64"]):
    check(Tensor(a).cast("float64"), a.astype(np.float64), rtol=0, atol=0)
    check(Tensor(f).cast("int64"), f.astype(np.int64))


def test_int32_overflow_wraps():
  a = np.array([2 ** 31 - 1, -(2 ** 31), 65536], np.int32)
  with np.errstate(over="ignore"):
    check(Tensor(a) + 1, a + np.int32(1))
    check(Tensor(a) * 65536, a * np.int32(65536))
    check(Tensor(a) - 2, a - np.int32(2))


@pytest.mark.needs_float64
def test_float64_keeps_precision_of_constants():
  a = np.array([1.0, 1e-300, 123456789.123456789], np.float64)
  check(Tensor(a) + 1e-10, a + 1e-10, rtol=1e-15, atol=0)
  check(Tensor(a) * (1 / 3), a * (1 / 3), rtol=1e-15, atol=0)
  check(Tensor.full((2,), 0.1, dtype="float64"), np.full((2,), 0.1), rtol=0, atol=0)
  check(Tensor.arange(0, 1, 0.1, dtype="float64"), np.arange(0, 1, 0.1), rtol=1e-15, atol=1e-16)


@pytest.mark.needs_float64
def test_float64_transcendentals_precise():
  x = np.linspace(0.1, 20, 50)
  check(Tensor(x).exp(), np.exp(x), rtol=1e-13, atol=0)
  check(Tensor(x).log(), np.log(x), rtol=1e-13, atol=1e-15)
  check(Tensor(x).sin(), np.sin(x), rtol=1e-12, atol=1e-13)
  check(Tensor(x).sqrt(), np.sqrt(x), rtol=1e-15, atol=0)


def test_bfloat16_arith_rounds_to_nearest():
  a = Tensor([1.0, 1.0, 256.0], dtype="bfloat16")
  b = Tensor([0.005859375, 0.001953125, 1.5], dtype="bfloat16")
  expected = bf16_round(np.array([1.0, 1.0, 256.0], np.float32) + np.array([0.005859375, 0.001953125, 1.5], np.float32))
  check(a + b, expected, rtol=0, atol=0, dtype="bfloat16")


def test_float16_arith_rounds_to_nearest():
  a = np.array([1.0, 2048.0, 0.1], np.float16)
  b = np.array([0.000732421875, 3.0, 0.2], np.float16)
  check(Tensor(a) + Tensor(b), (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16), rtol=0, atol=0)


def test_uint8_and_int8_wrap():
  u = np.array([0, 1, 250], np.uint8)
  check(Tensor(u) - 1, u - np.uint8(1))
  check(Tensor(u) + 10, u + np.uint8(10))
  check(-Tensor(u), -u)
  i = np.array([100, -100, 127], np.int8)
  with np.errstate(over="ignore"):
    check(Tensor(i) * 3, i * np.int8(3))


@pytest.mark.parametrize("scalar,name", needs_float64_cases([(np.int64(3), "int64"), (np.float64(1.5), "float64"),
                                                              (np.float16(1.5), "float16"), (np.uint8(200), "uint8"),
                                                              (np.int8(-3), "int8"), (np.bool_(True), "bool")]),
                         ids=["int64", "float64", "float16", "uint8", "int8", "bool"])
def test_numpy_scalar_keeps_dtype(scalar, name):
  check(Tensor(scalar), np.array(scalar))
