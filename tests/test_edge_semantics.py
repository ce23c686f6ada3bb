"""Edge semantics against numpy: out-of-range integer indices, the result dtype of sums of small integer types,
NaN through relu/maximum/minimum/clip/max, shifts by the bit width or more, reductions with no identity over an
empty axis, and turning requires_grad off again.

Every case here returned a silently wrong answer (or raised the wrong error) before it was fixed. The suite names
no device, so it runs as well under `EMU=1 DEV=AMD` and `EMU=1 DEV=NV` (sizes are kept small for the emulators).
"""
import math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import check, make, needs_float64_cases, round_to, widest_float_name

SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]


# ---------------------------------------------------------------- integer-array indexing

@pytest.mark.parametrize("index_dtype", ["int8", "int32", "int64", "uint32"])
def test_tensor_index_wraps_negatives_and_rejects_out_of_range(index_dtype):
  a = np.arange(24, dtype=np.float32).reshape(4, 6)
  good = np.array([[3, 0], [1, 2]] if index_dtype.startswith("u") else [[-1, 0], [-4, 2]]).astype(index_dtype)
  check(Tensor(a)[Tensor(good)], a[good])
  check(Tensor(a)[:, Tensor(good)], a[:, good])
  cases = [(np.array([0, 4]), 0, 4), (np.array([6, 1]), 1, 6)]
  if index_dtype == "uint32": cases.append((np.array([2**32 - 1]), 0, 4))   # is -1 once cast to int32
  for bad, axis, size in cases:
    idx = Tensor(bad.astype(index_dtype))
    with pytest.raises(IndexError) as numpy_error:
      a[(slice(None),) * axis + (bad.astype(index_dtype),)]
    with pytest.raises(IndexError, match=f"index {int(bad.astype(index_dtype).max())} is out of bounds for axis {axis} "
                                         f"with size {size}"):
      Tensor(a)[(slice(None),) * axis + (idx,)]
    assert "out of bounds" in str(numpy_error.value)


@pytest.mark.parametrize("bad", [-5, -100])
def test_tensor_index_below_minus_size_raises(bad):
  a = np.arange(4, dtype=np.int32)
  with pytest.raises(IndexError): a[np.array([0, bad])]
  with pytest.raises(IndexError, match=f"index {bad} is out of bounds for axis 0 with size 4"):
    Tensor(a)[Tensor(np.array([0, bad], np.int32))]


def test_tensor_index_setitem_out_of_range_raises_and_leaves_the_tensor():
  a = np.arange(5, dtype=np.float32)
  t = Tensor(a.copy())
  with pytest.raises(IndexError, match="index 7 is out of bounds for axis 0 with size 5"):
    t[Tensor(np.array([1, 7], np.int32))] = 9.0
  t[Tensor(np.array([-1, 1], np.int64))] = 9.0
  a[np.array([-1, 1])] = 9.0
  check(t, a)


def test_list_index_error_names_axis():
  a = np.zeros((2, 3), np.float32)
  with pytest.raises(IndexError, match="index 3 is out of bounds for axis 1 with size 3"):
    Tensor(a)[:, [0, 3]]


# ---------------------------------------------------------------- sum/prod/mean/cumsum dtypes

SUM_CASES = [  # dtype, value repeated, count: every one overflows the input dtype
  ("bool", True, 300), ("int8", -100, 200), ("uint8", 200, 1000), ("int16", 30000, 10), ("uint16", 60000, 10),
  ("int32", 2**30, 8), ("uint32", 2**31, 6),
]


@pytest.mark.parametrize("dt,value,count", SUM_CASES, ids=[c[0] for c in SUM_CASES])
def test_sum_promotes_like_numpy(dt, value, count):
  a = np.full(count, value, dtype=dt)
  check(Tensor(a).sum(), a.sum())
  b = a.reshape(2, -1)
  check(Tensor(b).sum(1), b.sum(1))
  check(Tensor(b).sum(0, keepdim=True), b.sum(0, keepdims=True))
  check(Tensor(a).sum(dtype=dt), a.sum(dtype=dt))   # an explicit dtype accumulates in it, as numpy
  if dt != "bool":   # numpy's matmul keeps the dtype (and wraps); so does baregrad's (bool: counts in int32)
    m = np.resize(np.array([100, 27, 3], dtype=dt), (3, 3))
    check(Tensor(m) @ Tensor(m), m @ m)


def test_float_reductions_keep_the_dtype():
  f = np.array([1.5, 2.25, -4.0], np.float16)
  check(Tensor(f).sum(), f.sum())
  check(Tensor(f).mean(), f.mean())
  check(Tensor(np.ones(3, np.uint8)).sum(), np.ones(3, np.uint8).sum())


@pytest.mark.parametrize("dt", ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32"])
def test_prod_mean_cumsum_dtypes_like_numpy(dt):
  a = np.array([[3, 5, 7, 1, 6], [2, 9, 4, 8, 1]], dtype=np.int64) if dt != "bool" else np.ones((2, 5), bool)
  a = np.repeat(a, 3, axis=1).astype(dt)   # products of 15 values overflow 8, 16 and 32 bits
  check(Tensor(a).prod(1), a.prod(1))
  wide = widest_float_name()               # numpy's float64 for the mean of ints (float32 on a device without it)
  check(Tensor(a).mean(1), a.mean(1), dtype=wide)
  check(Tensor(a).mean(), np.array(a.mean()), dtype=wide)
  check(Tensor(a).cumsum(1), np.cumsum(a, 1))
  big = np.full(300, 1 if dt == "bool" else 100, dtype=dt)
  check(Tensor(big).cumsum(0), np.cumsum(big))


# ---------------------------------------------------------------- NaN

@pytest.mark.parametrize("dt", needs_float64_cases(FLOATS))
def test_relu_maximum_minimum_clip_propagate_nan(dt):
  x = round_to(np.array([np.nan, -1.5, 0.0, 2.5, np.nan]), dt)
  y = round_to(np.array([1.0, np.nan, -2.0, np.nan, np.nan]), dt)
  ref_dt = np.float32 if dt == "bfloat16" else np.dtype(dt)
  xr, yr = x.astype(ref_dt), y.astype(ref_dt)
  check(make(x, dt).relu(), np.maximum(xr, 0), dtype=dt)
  check(make(x, dt).maximum(make(y, dt)), np.maximum(xr, yr), dtype=dt)
  check(make(y, dt).maximum(make(x, dt)), np.maximum(yr, xr), dtype=dt)
  check(make(x, dt).minimum(make(y, dt)), np.minimum(xr, yr), dtype=dt)
  check(make(x, dt).clip(-1.0, 1.0), np.clip(xr, -1.0, 1.0), dtype=dt)
  check(make(x, dt).max(), np.array(np.max(xr)), dtype=dt)
  check(make(y, dt).min(), np.array(np.min(yr)), dtype=dt)


def test_maximum_of_constants_propagates_nan():
  # both operands constant: folded at compile time, which must agree with the kernels
  check(Tensor(1.0).maximum(math.nan), np.maximum(np.float32(1.0), np.float32(np.nan)))
  check(Tensor(math.nan).maximum(1.0), np.maximum(np.float32(np.nan), np.float32(1.0)))
  check(Tensor(math.nan).relu(), np.maximum(np.float32(np.nan), 0))


# ---------------------------------------------------------------- shifts

def _shift_cases(dt):
  bits = np.dtype(dt).itemsize * 8
  amounts = [0, 1, bits - 1, bits, bits + 1, 33, 65, 100]
  if dt in SIGNED: amounts += [-1, -33]
  values = [1, 5, 100, 0, 127, 3, 1, 9, 2, 7] if dt in UNSIGNED else [1, 5, -3, 0, -128, 7, -1, 100, 2, -7]
  return np.array(values[:len(amounts)], dtype=dt), np.array(amounts).astype(dt)


@pytest.mark.parametrize("dt", SIGNED + UNSIGNED)
def test_shift_by_any_amount_like_numpy(dt):
  a, amounts = _shift_cases(dt)
  for x in (a, np.full_like(a, -1 if dt in SIGNED else 255)):
    # whole arrays, and short ones: a C compiler's vector and scalar shift instructions differ past the width
    for n in (len(x), 3, 1):
      check(Tensor(x[-n:]) << Tensor(amounts[-n:]), x[-n:] << amounts[-n:])
      check(Tensor(x[-n:]) >> Tensor(amounts[-n:]), x[-n:] >> amounts[-n:])
  bits = np.dtype(dt).itemsize * 8
  for amount in (bits, bits + 1, 65):   # a Python int amount (weak scalar)
    check(Tensor(a) << amount, a << np.array(amount).astype(dt))
    check(Tensor(a) >> amount, a >> np.array(amount).astype(dt))


def test_shift_of_computed_values():
  a = np.array([1, -8, 3, 2**20, 5], np.int32)
  s = np.array([30, 31, 32, 40, 15], np.int32)
  check((Tensor(a) << (Tensor(s) + 1)) + 1, (a << (s + 1)) + 1)
  check(Tensor(a) >> (Tensor(s) * 2), a >> (s * 2))
  check(Tensor(a[3:]) >> (Tensor(s[3:]) + 1), a[3:] >> (s[3:] + 1))


# ---------------------------------------------------------------- reductions without identity

@pytest.mark.parametrize("shape,axis", [((0,), None), ((0, 3), 0), ((2, 0), 1), ((0, 0), 0), ((2, 0, 3), (0, 1))])
@pytest.mark.parametrize("dt", ["float32", "int32", "uint8"])
def test_max_min_over_an_empty_axis_raise(shape, axis, dt):
  a = np.zeros(shape, dt)
  for op, numpy_op in (("max", "maximum"), ("min", "minimum")):
    with pytest.raises(ValueError, match=f"zero-size array to reduction operation {numpy_op}"):
      getattr(a, op)(axis=axis)
    with pytest.raises(ValueError, match=f"zero-size array to reduction operation {numpy_op} which has no identity"):
      getattr(Tensor(a), op)(axis)
  if not isinstance(axis, tuple):
    for op in ("argmax", "argmin"):
      with pytest.raises(ValueError): getattr(a, op)(axis=axis)
      with pytest.raises(ValueError): getattr(Tensor(a), op)(axis)


def test_max_over_a_non_empty_axis_of_an_empty_tensor():
  a = np.zeros((3, 0), np.float32)
  check(Tensor(a).max(0), a.max(0))
  check(Tensor(a).min(0, keepdim=True), a.min(0, keepdims=True))
  with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
    Tensor(a).max()


# ---------------------------------------------------------------- requires_grad

@pytest.mark.parametrize("shape", [(3,), (2, 2)])
def test_requires_grad_off_again(shape):
  x = Tensor.ones(*shape)
  x.requires_grad = True
  x.requires_grad = False
  assert x.requires_grad is False
  x.requires_grad = False
  assert float(x.sum().item()) == float(np.ones(shape).sum())
  w, b = Tensor(np.full(shape, 3, np.float32)), Tensor(np.full(shape, 5, np.float32))
  w.requires_grad = True
  w.requires_grad = True
  b.requires_grad = True
  b.requires_grad = False
  (w * b).sum().backward()
  check(w.grad, np.full(shape, 5, np.float32))
  assert b.grad is None
  (b * 2).sum().backward()             # nothing requires a gradient: a no-op (torch leaves the grads None)
  assert b.grad is None


def test_multiply_add_rounds_twice_like_numpy():
  """a*b+c is two IEEE roundings, as numpy computes it (gcc would fuse it into an FMA by default: the CPU device
  compiles with -ffp-contract=off); only kernels that sum products (matmul, conv) fuse, as BLAS does."""
  r = np.random.default_rng(0)
  a, b, c = (r.standard_normal(4096).astype(np.float32) for _ in range(3))
  np.testing.assert_array_equal((Tensor(a) * Tensor(b) + Tensor(c)).numpy(), a * b + c)
  np.testing.assert_array_equal((Tensor(a) * 3.0 - Tensor(c) * Tensor(b)).numpy(), a * np.float32(3.0) - c * b)
  if Tensor([1]).device == "CPU":
    (mm,) = (Tensor(a[:64].reshape(8, 8)) @ Tensor(b[:64].reshape(8, 8))).schedule()
    (ew,) = (Tensor(a) * Tensor(b) + Tensor(c)).schedule()
    assert 'optimize("fp-contract=fast")' in mm.program.source
    assert "fp-contract" not in ew.program.source


def test_arange_past_int32_is_int64():
  got = Tensor.arange(2**31 - 2, 2**31 + 2)
  assert got.dtype == dtypes.int64
  np.testing.assert_array_equal(got.numpy(), np.arange(2**31 - 2, 2**31 + 2))
  assert Tensor.arange(5).dtype == dtypes.int32 and Tensor.arange(-2**31, -2**31 + 3).dtype == dtypes.int32


def test_reshape_none_keeps_the_dim():
  x = Tensor(np.arange(24).reshape(2, 3, 4))
  assert x.reshape(None, -1).shape == (2, 12) and x.reshape(2, None, 4).shape == (2, 3, 4)
  np.testing.assert_array_equal(x.reshape(None, 12).numpy(), np.arange(24).reshape(2, 12))
  with pytest.raises(ValueError):
    x.reshape(None, None, None, None)


@pytest.mark.parametrize("dt, value, want_dt", [(np.int32, 2**40, np.int64), (np.int32, -2**40, np.int64),
                                                (np.uint8, 300, np.uint16), (np.int8, -300, np.int16),
                                                (np.uint32, 2**40, np.uint64), (np.uint64, 2**63, np.uint64)])
def test_int_constants_outside_the_dtype_widen_it(dt, value, want_dt):
  """numpy 1's value-based promotion (numpy 2 raises OverflowError): the result dtype holds the constant."""
  a = np.array([1, 7], dt)
  got = Tensor(a) + value
  assert got.dtype.np == np.dtype(want_dt)
  np.testing.assert_array_equal(got.numpy(), a.astype(want_dt) + np.array(value, want_dt))


def test_int_constants_no_integer_dtype_holds_raise():
  with pytest.raises(OverflowError, match="2361183241434822606848"):
    Tensor([1]) + 2**71
  with pytest.raises(OverflowError, match="int32"):
    Tensor([1]) + 2**63
