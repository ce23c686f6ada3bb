"""API parity, round 2 (issue 30): the forms tinygrad accepts, the exception classes torch raises, gradients in
torch's documented formulas (derivatives.yaml: softmax, log_softmax, pow, acosh, clamp, copysign), zero-size
gradients, and bitwise ops with wide constants.

References are numpy, float64 finite differences, and torch's derivative formulas written out in numpy (torch itself
is not imported)."""
import math

import numpy as np
import pytest

from baregrad.tensor import (Tensor, dtypes, ShapeError, DimError, ArgumentError, ModeError, DTypeError,
                             IndexTypeError, RangeOverflowError)
from helpers_ops import check, randf

F64 = dict(rtol=1e-12, atol=1e-12)
np.seterr(all="ignore")


def grads(fn, *values, dtype=np.float64):
  """(fn's value, [d sum(fn) / d input]) as numpy, through Tensor.gradient (tinygrad's form)."""
  ts = [Tensor(np.asarray(v, dtype)) for v in values]
  out = fn(*ts)
  gs = out.sum().gradient(*ts)          # built before out is realized (a realized tensor is a leaf)
  return out.numpy(), [g.numpy() for g in gs]


def fd(fn, *values, eps=1e-6):
  """Central finite differences of sum(fn) in float64, fn a numpy function."""
  vals = [np.array(v, np.float64) for v in values]
  out = []
  for k, v in enumerate(vals):
    g = np.zeros_like(v)
    for i in np.ndindex(v.shape):
      hi, lo = [w.copy() for w in vals], [w.copy() for w in vals]
      hi[k][i] += eps
      lo[k][i] -= eps
      g[i] = (np.sum(fn(*hi)) - np.sum(fn(*lo))) / (2 * eps)
    out.append(g)
  return out


# ---------------------------------------------------------------- 1. exception classes

X34 = np.arange(12, dtype=np.float32).reshape(3, 4)
IDX = np.random.default_rng(0).integers(0, 3, (3, 4, 5)).astype(np.int32)

ERROR_CASES = {
  "flip_twice": (lambda: Tensor(X34).flip((1, -1)), ArgumentError, (ValueError, RuntimeError), "duplicate"),
  "reshape_two_minus_one": (lambda: Tensor(X34).reshape(-1, -1, 2), ArgumentError, (ValueError, RuntimeError), "-1"),
  "sum_axis_twice": (lambda: Tensor(X34).sum((0, 0)), ArgumentError, (ValueError, RuntimeError), "duplicate"),
  "pad_mode": (lambda: Tensor.ones(3, 3, 3).pad((3, 0), mode="typo"), ModeError,
               (ValueError, NotImplementedError, RuntimeError), "typo"),
  "div_mode": (lambda: Tensor([5.0]).div(Tensor([0.0]), rounding_mode="typo"), ArgumentError,
               (ValueError, RuntimeError), "rounding_mode"),
  "scatter_reduce_mode": (lambda: Tensor.ones(4, 5, 6).scatter_reduce(0, Tensor(IDX), Tensor.ones(4, 5, 6), "bad"),
                          ArgumentError, (ValueError, RuntimeError), "reduce"),
  "roll_without_dims": (lambda: Tensor(X34).roll((1, 2)), ArgumentError, (ValueError, RuntimeError), "dims"),
  "roll_lengths": (lambda: Tensor(X34).roll(1, (0, 1)), ArgumentError, (ValueError, RuntimeError), "same length"),
  "shl_float": (lambda: Tensor([1.0]) << 2, DTypeError, (TypeError, RuntimeError), "float32"),
  "shr_float_amount": (lambda: Tensor([1], dtype="uint32") >> Tensor([1.0]), DTypeError, (TypeError, RuntimeError),
                       "float32"),
  "lshift_method_float": (lambda: Tensor([4.0]).lshift(1), DTypeError, (TypeError, RuntimeError), "float32"),
  "scatter_dtype": (lambda: Tensor.ones(3, 4, 5).half().scatter(1, Tensor(IDX), Tensor.ones(3, 4, 5)), DTypeError,
                    (TypeError, RuntimeError), "dtype"),
  "scatter_small_src": (lambda: Tensor.ones(10, 3, 10).scatter(1, Tensor(IDX), Tensor.ones(10, 3, 10)), ShapeError,
                        (ValueError, RuntimeError), "src"),
  "float_index_tensor": (lambda: Tensor.ones(10, 11)[Tensor(1.1)], IndexTypeError, (TypeError, IndexError), "integer"),
  "float_index_list": (lambda: Tensor.ones(10, 11)[[1.1]], IndexTypeError, (TypeError, IndexError), "ints"),
  "bool_index_tensor": (lambda: Tensor.ones(10, 11)[Tensor([True, False])], IndexTypeError, (TypeError, IndexError),
                        "bool"),
  "arange_int32": (lambda: Tensor.arange(2**33, dtype=dtypes.int32), RangeOverflowError, (OverflowError, ValueError),
                   "int32"),
  "arange_int8_last": (lambda: Tensor.arange(129, dtype=dtypes.int8), RangeOverflowError, (OverflowError,), "int8"),
  "arange_int8_start": (lambda: Tensor.arange(128, 0, -1, dtype=dtypes.int8), RangeOverflowError, (OverflowError,),
                        "int8"),
  "clip_no_bounds": (lambda: Tensor(X34).clip(None, None), ArgumentError, (ValueError, RuntimeError), "clip"),
  "int_negative_power": (lambda: Tensor([-2, 0, 2]) ** -2, ArgumentError, (ValueError, RuntimeError), "negative"),
  "unfold_step": (lambda: Tensor.ones(8).unfold(0, 1, -1), ArgumentError, (ValueError, RuntimeError), "step"),
  "meshgrid_indexing": (lambda: Tensor([1.0, 2.0]).meshgrid(indexing="bad"), ArgumentError, (ValueError, RuntimeError),
                        "indexing"),
  "diagonal_same_dims": (lambda: Tensor(X34).diagonal(dim1=0, dim2=0), ArgumentError, (ValueError, RuntimeError),
                         "dim1"),
  "sdpa_causal_and_mask": (lambda: Tensor.ones(1, 2, 3).scaled_dot_product_attention(
    Tensor.ones(1, 2, 3), Tensor.ones(1, 2, 3), attn_mask=Tensor.ones(2, 2), is_causal=True), ArgumentError,
    (ValueError, RuntimeError), "is_causal"),
  "cat_0d": (lambda: Tensor(3.14).cat(Tensor(3.14)), DimError, (IndexError, ValueError), "zero-dimensional"),
  "sum_dtype_name": (lambda: Tensor([1.0, 2.0]).sum(dtype=""), TypeError, (TypeError, AttributeError), "dtype"),
  "prod_dtype_name": (lambda: Tensor([1.0, 2.0]).prod(dtype="nope"), TypeError, (TypeError, AttributeError), "dtype"),
  "linspace_bool": (lambda: Tensor.linspace(5, 10, 3, dtype="bool"), DTypeError, (TypeError, RuntimeError, ValueError),
                    "bool"),
  "stack_list_then_tensor": (lambda: Tensor.stack((Tensor([1, 2]), Tensor([3, 4])), Tensor([5, 6])), TypeError,
                             (TypeError, ValueError), "dim"),
  "index_out_of_bounds": (lambda: Tensor.ones(4, 3)[1, 3], IndexError, (IndexError,), "out of bounds"),
  "index_negative_out_of_bounds": (lambda: Tensor.ones(4, 3)[1, -4], IndexError, (IndexError,), "out of bounds"),
  "slice_bound_1d_tensor": (lambda: Tensor.ones(4, 3)[:Tensor([3]), 1], TypeError, (TypeError,), "0-d integer"),
  "randint_negative_dim": (lambda: Tensor.randint(-3, 2), ValueError, (ValueError,), "non-negative"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_exception_classes(name):
  """Each error is one class that is both what baregrad raised before (kept by the first class) and what torch (or
  tinygrad) raises; the message names the op's mistake."""
  fn, cls, also, words = ERROR_CASES[name]
  with pytest.raises(cls, match=words) as e:
    fn()
  assert all(isinstance(e.value, c) for c in also), type(e.value).__mro__


def test_arange_at_the_edges_of_its_dtype():
  check(Tensor.arange(-128, 128, dtype=dtypes.int8), np.arange(-128, 128, dtype=np.int8))
  check(Tensor.arange(127, -129, -1, dtype=dtypes.int8), np.arange(127, -129, -1, dtype=np.int8))
  assert Tensor.arange(2**31, 2**31 + 3).dtype == dtypes.int64          # no dtype given: widened, not raised
  assert Tensor.arange(0, dtype=dtypes.int8).shape == (0,)


# ---------------------------------------------------------------- 2. arguments and methods

def test_scans_take_axis():
  a = randf((3, 4), seed=1)
  check(Tensor(a).cumprod(axis=1), np.cumprod(a, 1), rtol=1e-6)
  check(Tensor(a).cummax(axis=0)[0], np.maximum.accumulate(a, 0))
  check(Tensor(a).cummin(axis=1)[0], np.minimum.accumulate(a, 1))
  check(Tensor(a).logcumsumexp(axis=1), np.logaddexp.accumulate(a.astype(np.float64), 1).astype(np.float32),
        rtol=1e-6)
  with pytest.raises(IndexError): Tensor(a).cumprod(axis=2)
  with pytest.raises(IndexError): Tensor(a).cummax(axis=-3)


def test_logcumsumexp_defaults_to_dim_0():
  v = np.array([0.0, 100.0])
  out, (g,) = grads(lambda x: x.logcumsumexp(), v)
  np.testing.assert_allclose(out, np.logaddexp.accumulate(v), **F64)
  # d/dx_j sum_i log(sum_{k<=i} e^x_k) = sum_{i>=j} softmax_i(x[:i+1])_j
  np.testing.assert_allclose(g, [1 + 1 / (1 + math.exp(100)), 1 / (1 + math.exp(-100))], rtol=1e-12)
  out, (g,) = grads(lambda x: x.logcumsumexp(), 2.5)
  assert out == 2.5 and g == 1.0


def test_meshgrid_as_a_method_and_without_tensors():
  x, y, z = np.array([0.0, 1.0, 2.0]), np.array([3.0, 4.0, 5.0, 6.0]), np.array([7.0, 8.0])
  for indexing in ("ij", "xy"):
    (only,) = Tensor(x).meshgrid(indexing=indexing)
    check(only, x)
    for got, want in zip(Tensor(x).meshgrid(Tensor(y), Tensor(z), indexing=indexing), np.meshgrid(x, y, z,
                                                                                                    indexing=indexing)):
      check(got, want)
    for got, want in zip(Tensor.meshgrid([Tensor(x), Tensor(y)], indexing=indexing), np.meshgrid(x, y,
                                                                                                  indexing=indexing)):
      check(got, want)
  with pytest.raises(ArgumentError, match="at least one"):
    Tensor.meshgrid()


def sdpa_ref(q, k, v):
  s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  w = np.exp(s - s.max(-1, keepdims=True))
  return (w / w.sum(-1, keepdims=True)) @ v


def test_scaled_dot_product_attention_enable_gqa():
  q, k, v = randf((2, 6, 3, 4), seed=2), randf((2, 2, 5, 4), seed=3), randf((2, 2, 5, 3), seed=4)
  out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), enable_gqa=True)
  check(out, sdpa_ref(q.astype(np.float64), np.repeat(k, 3, 1), np.repeat(v, 3, 1)).astype(np.float32), rtol=1e-5,
        atol=1e-6)
  with pytest.raises(ShapeError, match="multiple"):
    Tensor(randf((2, 5, 3, 4))).scaled_dot_product_attention(Tensor(k), Tensor(v), enable_gqa=True)
  with pytest.raises(ShapeError):      # without enable_gqa the heads must broadcast, as torch
    Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v))


def test_isinf_detect_sign():
  v = [-math.inf, 0.0, math.inf, math.nan, 1.1]
  check(Tensor(v).isinf(), np.isinf(v))
  check(Tensor(v).isinf(detect_positive=True, detect_negative=False), np.isposinf(v))
  check(Tensor(v).isinf(detect_positive=False, detect_negative=True), np.isneginf(v))
  check(Tensor(v).isinf(detect_positive=False, detect_negative=False), np.zeros(5, bool))
  check(Tensor([1, 2]).isinf(detect_negative=False), np.zeros(2, bool))


def test_masked_select_with_size_reads_nothing_back():
  t, mask = Tensor(np.arange(9, dtype=np.int32)), Tensor(np.array([1, 0, 1, 0, 1, 0, 0, 0, 1], bool))
  out = t.masked_select(mask, size=6, fill_value=-1)
  assert out.schedule(), "a fixed-size masked_select is a lazy graph"
  check(out, np.array([0, 2, 4, 8, -1, -1], np.int32))
  check(t.masked_select(mask, size=2), np.array([0, 2], np.int32))
  check(Tensor([], dtype=dtypes.int32).masked_select(Tensor([], dtype=dtypes.bool), size=2, fill_value=-1),
        np.array([-1, -1], np.int32))
  assert Tensor([1.0, 2.0]).masked_select(Tensor([True, False]), size=3, fill_value=-1).dtype == dtypes.float32
  a, m = randf((3, 4), seed=5), randf((1, 4), seed=6) > 0                       # the mask broadcasts
  check(Tensor(a).masked_select(Tensor(m), size=12), np.pad(a[np.broadcast_to(m, a.shape)], (0, 12 - 3 * m.sum())))
  x = Tensor(np.array([1.0, 2.0, 3.0]))
  (g,) = x.masked_select(Tensor([True, False, True]), size=4).sum().gradient(x)
  check(g, np.array([1.0, 0.0, 1.0]))


def test_nonzero_with_size_reads_nothing_back():
  out = Tensor([1, 0, 2, 0, 3]).nonzero(size=5, fill_value=-1)
  assert out.schedule(), "a fixed-size nonzero is a lazy graph"
  check(out, np.array([[0], [2], [4], [-1], [-1]], np.int32))
  check(Tensor([1, 0, 2, 0, 3]).nonzero(size=3), np.array([[0], [2], [4]], np.int32))
  a = randf((3, 4, 2), seed=7) * (randf((3, 4, 2), seed=8) > 0.5)
  a[1, 2, 0] = np.nan                                                           # NaN counts as non-zero
  want = np.argwhere(a)
  check(Tensor(a).nonzero(size=len(want) + 2), np.concatenate([want, np.zeros((2, 3), int)]).astype(np.int32))
  rows, cols = Tensor(np.eye(3)).nonzero(as_tuple=True, size=3)
  check(rows, np.arange(3, dtype=np.int32)); check(cols, np.arange(3, dtype=np.int32))
  assert Tensor(5).nonzero(size=4).shape == (4, 0)
  check(Tensor([], dtype=dtypes.int32).nonzero(size=3, fill_value=-1), np.full((3, 1), -1, np.int32))
  assert Tensor([1, 0]).nonzero(size=3, fill_value=-1.5).dtype == dtypes.int32


def test_scaled_and_glorot_uniform():
  Tensor.manual_seed(3)
  s = Tensor.scaled_uniform(64, 32).numpy()
  assert s.shape == (64, 32) and np.abs(s).max() <= 1 / math.sqrt(64 * 32) and s.std() > 0.5 / math.sqrt(3 * 64 * 32)
  g = Tensor.glorot_uniform(64, 32).numpy()
  assert np.abs(g).max() <= math.sqrt(6 / 96) and g.std() > 0.5 * math.sqrt(6 / 96) / math.sqrt(3)
  for method in (Tensor.scaled_uniform, Tensor.glorot_uniform):
    for shape in [(-3, 2), ((2, -3),), ((2, -3, 0),)]:
      with pytest.raises(ValueError): method(*shape)


@pytest.mark.parametrize("name,want", [("float32", "float32"), ("Float64", "float64"), ("half", "float16"),
                                       ("bfloat16", "bfloat16"), ("double", "float64"), ("long", "int64"),
                                       ("int", "int32"), ("uchar", "uint8"), ("ushort", "uint16"), ("ulong", "uint64"),
                                       ("char", "int8"), ("short", "int16"), ("uint", "uint32"), ("bool", "bool"),
                                       ("default_float", "float32"), ("default_int", "int32"),
                                       ("torch.float64", "float64"), ("dtypes.int16", "int16")])
def test_sum_and_prod_dtype_names(name, want):
  x = Tensor([1.0, 2.0, 3.0])
  assert x.sum(dtype=name).dtype.name == want and x.prod(dtype=name).dtype.name == want
  if want != "bool": assert float(x.sum(dtype=name).item()) == 6 and float(x.prod(dtype=name).item()) == 6


# ---------------------------------------------------------------- 3. gradients in torch's formulas

def softmax_ref(x, axis):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def test_softmax_gradient_in_torchs_form():
  x, g = randf((6, 9), seed=9).astype(np.float64), randf((6, 9), seed=10).astype(np.float64)
  for axis in (0, 1):
    t = Tensor(x)
    y = softmax_ref(x, axis)
    (got,) = t.softmax(axis).gradient(t, gradient=Tensor(g))
    np.testing.assert_allclose(got.numpy(), y * (g - (g * y).sum(axis, keepdims=True)), **F64)
    (got,) = t.softmin(axis).gradient(t, gradient=Tensor(g))
    ym = softmax_ref(-x, axis)
    np.testing.assert_allclose(got.numpy(), -ym * (g - (g * ym).sum(axis, keepdims=True)), **F64)
    (got,) = t.log_softmax(axis).gradient(t, gradient=Tensor(g))
    np.testing.assert_allclose(got.numpy(), g - y * g.sum(axis, keepdims=True), **F64)
  # a uniform upstream: exactly y * (1 - sum(y)) (float32, the sum as baregrad rounds it), so exactly 0 in every row
  # whose sum rounds to 1, and tiny elsewhere
  t = Tensor(randf((45, 65), seed=11))
  (got,) = t.softmax(1).sum().gradient(t)
  y = t.softmax(1).numpy()
  s = Tensor(y).sum(1, keepdim=True).numpy()
  np.testing.assert_array_equal(got.numpy(), y * (np.float32(1) - s))
  assert (got.numpy()[s[:, 0] == 1] == 0).all() and np.abs(got.numpy()).max() < 1e-7


def test_softmax_and_log_softmax_of_a_0d_tensor():
  for fn, value in [(lambda t: t.softmax(0), 1.0), (lambda t: t.log_softmax(-1), 0.0), (lambda t: t.softmin(), 1.0)]:
    out, (g,) = grads(fn, 1.5)
    assert out == value and g == 0.0


def test_softmax_gradient_keeps_intermediate_targets():
  """The custom rule skips the ops inside softmax; a target among them still gets the chain rule's gradient."""
  x = Tensor(randf((3, 4), seed=12).astype(np.float64))
  e = x.exp()
  y = e / e.sum(1, keepdim=True)
  (ge,) = y.softmax(1).sum().gradient(e)
  assert ge.shape == (3, 4) and np.isfinite(ge.numpy()).all()


def pow_ref_grads(b, e):
  """torch: d/db = where(e == 0, 0, e * b ** (e - 1)); d/de = where(b == 0 and e >= 0, 0, b ** e * log(b))."""
  b, e = np.broadcast_arrays(np.asarray(b, np.float64), np.asarray(e, np.float64))
  return np.where(e == 0, 0.0, e * np.power(b, e - 1)), np.where((b == 0) & (e >= 0), 0.0, np.power(b, e) * np.log(b))


def test_pow_tensor_exponent_gradients():
  b, e = randf((4, 5), seed=13).astype(np.float64), randf((4, 5), seed=14).astype(np.float64)
  out, (gb, ge) = grads(lambda x, y: x ** y, b, e)
  rb, re = pow_ref_grads(b, e)
  np.testing.assert_allclose(out, np.power(b, e), rtol=1e-12)
  np.testing.assert_allclose(gb, rb, rtol=1e-10)       # NaN where b < 0 and e is not an integer, as torch
  np.testing.assert_allclose(ge, re, rtol=1e-10)       # NaN where b < 0 (log of a negative), as torch
  pos = np.abs(b)
  out, (gb, ge) = grads(lambda x, y: x ** y, pos, e)
  fb, fe = fd(np.power, pos, e)
  np.testing.assert_allclose(gb, fb, rtol=1e-6); np.testing.assert_allclose(ge, fe, rtol=1e-6)
  # zero bases, zero exponents, infinite bases
  cases = [([-math.inf, math.inf, 0.0], [0.0, 0.0, 0.0]), ([0.0, 0.0, 0.0], [0.0, 0.3, -0.3])]
  for bv, ev in cases:
    out, (gb, ge) = grads(lambda x, y: x ** y, bv, ev)
    rb, re = pow_ref_grads(bv, ev)
    np.testing.assert_array_equal(out, np.power(bv, ev))
    np.testing.assert_array_equal(gb, rb); np.testing.assert_array_equal(ge, re)
  out, (gb, ge) = grads(lambda x, y: x ** y, [[2.0], [3.0]], [1.0, 2.0, 0.5])   # broadcast
  rb, re = pow_ref_grads([[2.0], [3.0]], [1.0, 2.0, 0.5])
  np.testing.assert_allclose(gb, rb.sum(1, keepdims=True), rtol=1e-12)
  np.testing.assert_allclose(ge, re.sum(0), rtol=1e-12)


@pytest.mark.parametrize("c", [0, 1, 2, 3, -2, 0.0, -1.0, 8.0, 5.5, -5.5, 0.2, 1.2, 0.3, 0.5, 3.3])
def test_pow_constant_exponent_gradients(c):
  """torch: d/dx x ** c = 0 for c == 0, else c * x ** (c - 1) (NaN for a negative x and fractional c; inf at 0)."""
  x = np.array([-2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, math.inf, -math.inf])
  out, (g,) = grads(lambda t: t ** c, x)
  np.testing.assert_allclose(out, np.power(x, float(c)), rtol=1e-12)
  want = np.zeros_like(x) if c == 0 else c * np.power(x, c - 1.0)
  np.testing.assert_allclose(g, want, rtol=1e-12)


@pytest.mark.parametrize("base", [0, 0.7, -2, 1.0, 2.0, 5.5, -5.5])
def test_pow_constant_base_gradients(base):
  """torch: d/de base ** e = base ** e * log(base), 0 where base == 0 and e >= 0."""
  e = np.array([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 0.5])
  out, (g,) = grads(lambda t: base ** t, e)
  np.testing.assert_allclose(out, np.power(float(base), e), rtol=1e-12)
  np.testing.assert_allclose(g, pow_ref_grads(base, e)[1], rtol=1e-12)


def test_pow_float32_direct_points():
  """tinygrad's x ** c at x in {-inf, 0, 1, inf}: the same as torch's formula, NaN where it is NaN."""
  for x in [-math.inf, 0.0, 1.0, math.inf]:
    for c in [-1, 0, 0.3, 1, 2]:
      t = Tensor([x])
      got = (t ** c)[0].gradient(t)[0].item()
      want = 0.0 if c == 0 else c * np.power(np.float64(x), c - 1.0)
      assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want), (x, c, got, want)


def test_acosh_gradient_is_torchs_everywhere():
  x = np.concatenate([np.linspace(1.5, 4, 5), np.linspace(-300, -297, 4), np.linspace(-0.9, 0.9, 3), [1e10]])
  out, (g,) = grads(lambda t: t.acosh(), x)
  np.testing.assert_allclose(out, np.arccosh(x), rtol=1e-12)
  np.testing.assert_allclose(g, 1 / np.sqrt(x * x - 1), rtol=1e-12)   # finite below -1, NaN in (-1, 1), as torch
  inside = (x > 1) & (x < 100)
  np.testing.assert_allclose(g[inside], fd(np.arccosh, x[inside])[0], rtol=1e-5)


def test_clip_gradient_at_and_away_from_its_bounds():
  x = np.array([-3.0, -2.5, 0.0, 1.5, 2.0])
  for lo, hi in [(-2.5, 1.5), (0, 0), (3, 0), (None, 0), (0, None), (-0.3, -0.2)]:
    out, (g,) = grads(lambda t: t.clip(lo, hi), x)
    want = x if lo is None else np.maximum(x, lo)
    want = want if hi is None else np.minimum(want, hi)
    np.testing.assert_array_equal(out, want)
    inside = np.ones_like(x, bool)                      # torch's clamp: 1 where lo <= x <= hi, bounds included
    if lo is not None: inside &= x >= lo
    if hi is not None: inside &= x <= hi
    np.testing.assert_array_equal(g, inside.astype(np.float64))


def test_copysign_gradient_at_signed_zeros():
  v = [-1.0, -0.0, 0.0, 1.0, math.inf, -math.inf, math.nan]
  a, b = np.repeat(v, len(v)), np.tile(v, len(v))
  out, (ga, gb) = grads(lambda x, y: x.copysign(y), a, b)
  np.testing.assert_array_equal(np.signbit(out), np.signbit(np.copysign(a, b)))
  np.testing.assert_array_equal(out, np.copysign(a, b))
  finite = np.isfinite(a)
  with np.errstate(invalid="ignore"):
    want = np.where(a == 0, 0.0, np.copysign(a, b) / a)       # torch: result / self, 0 where self == 0
  np.testing.assert_array_equal(ga[finite], want[finite])
  np.testing.assert_array_equal(gb, np.zeros_like(b))


def test_exp_ratio_gradient_at_overflow():
  """x.exp() / (1 + x.exp()) at +-300: exp overflows float32, the gradient is 0 (tinygrad), not 0 * inf."""
  for x in (300.0, -300.0):
    t = Tensor([x])
    s = t.exp() / (1 + t.exp())
    assert s[0].gradient(t)[0].item() == 0.0
    assert t.sigmoid()[0].gradient(t)[0].item() == 0.0
  out, (g,) = grads(lambda t: t.exp() / (1 + t.exp()), [-2.0, 0.0, 3.0])     # finite: the ordinary chain rule
  e = np.exp([-2.0, 0.0, 3.0])
  np.testing.assert_allclose(g, e / (1 + e) ** 2, rtol=1e-12)


# ---------------------------------------------------------------- 4. zero-size gradients, cat with empty operands

def test_gradient_of_empty_tensors():
  a, b, c = (Tensor(randf(s, seed=i)) for i, s in enumerate([(4, 0, 3), (4, 1, 3), (4, 2, 3)]))
  ga, gb, gc = a.cat(b, c, dim=1).sum().gradient(a, b, c)
  assert ga.shape == (4, 0, 3) and ga.dtype == dtypes.float32
  check(gb, np.ones((4, 1, 3), np.float32)); check(gc, np.ones((4, 2, 3), np.float32))
  e1, e2 = Tensor(np.zeros((4, 0, 3), np.float32)), Tensor(np.zeros((4, 0, 3), np.float32))
  assert [g.shape for g in e1.cat(e2, dim=1).sum().gradient(e1, e2)] == [(4, 0, 3)] * 2
  assert [g.shape for g in e1.cat(e2, dim=0).sum().gradient(e1, e2)] == [(4, 0, 3)] * 2
  for axis in (0, 1, (0, 1)):
    x = Tensor(np.zeros((4, 0), np.float32))
    (g,) = x.sum(axis=axis).sum().gradient(x)
    assert g.shape == (4, 0)
  with pytest.raises(RuntimeError, match="not part"):     # a non-empty unrelated target still raises
    (b * 2).sum().gradient(c)


# ---------------------------------------------------------------- 5. forms: N-d conv and pooling, padding, interpolate

def conv_ref(x, w, pads, stride=1):
  """Cross-correlation of (N, C, *S) with (O, C, *K) after (before, after) padding per spatial dim, in float64."""
  nd = w.ndim - 2
  x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + list(pads))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=tuple(range(2, 2 + nd)))
  win = win[(slice(None), slice(None)) + (slice(None, None, stride),) * nd]
  sp, ks = "pqr"[:nd], "ijk"[:nd]
  return np.einsum(f"nc{sp}{ks},oc{ks}->no{sp}", win, w.astype(np.float64))


@pytest.mark.parametrize("nd", [1, 3])
def test_conv2d_follows_the_weight_dims(nd):
  x, w = randf((2, 3) + (5,) * nd, seed=20), randf((4, 3) + (3,) * nd, seed=21)
  flat = [1, 1] * nd
  check(Tensor(x).conv2d(Tensor(w), padding=flat), conv_ref(x, w, [(1, 1)] * nd).astype(np.float32), rtol=1e-5,
        atol=1e-5)
  check(Tensor(x).conv2d(Tensor(w), stride=2), conv_ref(x, w, [(0, 0)] * nd, 2).astype(np.float32), rtol=1e-5,
        atol=1e-5)
  if nd == 1:    # tinygrad's flat (left, right) for one dim
    check(Tensor(x).conv2d(Tensor(w), padding=(2, 1)), conv_ref(x, w, [(2, 1)]).astype(np.float32), rtol=1e-5,
          atol=1e-5)
  # conv_transpose2d with an N-d weight is the N-d transposed convolution: the adjoint of conv2d
  wt = randf((3, 4) + (3,) * nd, seed=22)
  y = randf((2, 3) + (4,) * nd, seed=23)
  out = Tensor(y).conv_transpose2d(Tensor(wt)).numpy().astype(np.float64)
  probe = randf(out.shape, seed=24).astype(np.float64)
  lhs = (out * probe).sum()
  rhs = (conv_ref(probe, wt, [(0, 0)] * nd) * y).sum()
  assert lhs == pytest.approx(rhs, rel=1e-5)


def test_pool2d_follows_the_kernel_dims_and_flat_padding():
  x = randf((2, 2, 7, 6, 5), seed=25)
  m = Tensor(x).max_pool2d(kernel_size=(3, 3, 3), stride=2).numpy()
  win = np.lib.stride_tricks.sliding_window_view(x, (3, 3, 3), axis=(2, 3, 4))[:, :, ::2, ::2, ::2]
  check(Tensor(m), win.max((-3, -2, -1)))
  a = Tensor(x).avg_pool2d(kernel_size=(3, 3, 3), stride=2).numpy()
  np.testing.assert_allclose(a, win.mean((-3, -2, -1)), rtol=1e-5, atol=1e-6)
  x1 = randf((2, 3, 9), seed=26)
  check(Tensor(x1).max_pool2d(kernel_size=(3,)), np.lib.stride_tricks.sliding_window_view(x1, 3, -1)[..., ::3, :]
        .max(-1))
  x2 = randf((2, 2, 11, 8), seed=27)
  for p in [(0, 1, 0, 1), (2, 1, 2, 1), (2, 0, 2, 1)]:
    padded = np.pad(x2, [(0, 0), (0, 0), (p[2], p[3]), (p[0], p[1])], constant_values=-np.inf)
    want = np.lib.stride_tricks.sliding_window_view(padded, (5, 5), (2, 3))[:, :, ::5, ::5].max((-2, -1))
    check(Tensor(x2).max_pool2d(kernel_size=(5, 5), padding=p), want)
    padded0 = np.pad(x2, [(0, 0), (0, 0), (p[2], p[3]), (p[0], p[1])])
    want = np.lib.stride_tricks.sliding_window_view(padded0, (5, 5), (2, 3))[:, :, ::5, ::5].mean((-2, -1))
    np.testing.assert_allclose(Tensor(x2).avg_pool2d(kernel_size=(5, 5), padding=p).numpy(), want, rtol=1e-5,
                               atol=1e-6)
  with pytest.raises(ValueError): Tensor(x2).max_pool2d(kernel_size=(2, 2), padding=(1, 1, 1))
  with pytest.raises(ValueError): Tensor(x2).avg_pool2d(kernel_size=(2, 2), padding=(1, 1, 1))


def linear_ref(x, axis, out, align):
  """torch's linear resampling along one axis, in float64."""
  L = x.shape[axis]
  o = np.arange(out, dtype=np.float64)
  src = o * ((L - 1) / (out - 1) if out > 1 else 0) if align else np.maximum((o + 0.5) * L / out - 0.5, 0)
  i0 = np.minimum(np.floor(src).astype(int), L - 1)
  i1 = np.minimum(i0 + 1, L - 1)
  lam = (src - i0).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
  return np.take(x, i0, axis) * (1 - lam) + np.take(x, i1, axis) * lam


@pytest.mark.parametrize("size", [(9, 31), (3, 6, 4)])
@pytest.mark.parametrize("align", [False, True])
def test_interpolate_linear_on_2d_and_3d(size, align):
  x = randf((2, 3) + ((12, 20) if len(size) == 2 else (5, 2, 8)), seed=28).astype(np.float64)
  want = x
  for i, o in enumerate(size): want = linear_ref(want, 2 + i, o, align)
  check(Tensor(x.astype(np.float32)).interpolate(size=size, mode="linear", align_corners=align),
        want.astype(np.float32), rtol=1e-5, atol=1e-5)


def torch_pad_ref(x, pads, mode):
  """torch.nn.functional.pad for replicate (index clamp(j - left)) and circular (crop first, then wrap the rest)."""
  for i in range(len(pads) // 2):
    dim, (left, right) = x.ndim - 1 - i, pads[2 * i:2 * i + 2]
    L = x.shape[dim]
    if mode == "replicate": idx = np.clip(np.arange(L + left + right) - left, 0, L - 1)
    else:
      kept = np.arange(max(-left, 0), L - max(-right, 0))
      idx = np.concatenate([kept[len(kept) - max(left, 0):], kept, kept[:max(right, 0)]])
    x = np.take(x, idx, axis=dim)
  return x


@pytest.mark.parametrize("mode,shape,pads", [
  ("replicate", (1, 1, 5, 5), (3, -3, 0, -3)), ("replicate", (3, 3, 3, 3), (-1, 2, 2, -1)),
  ("replicate", (1, 1, 5, 5), (3, -5, 1, -5)), ("replicate", (1, 1, 5, 5), (0, 0, 0, -5)),
  ("circular", (1, 1, 5, 5), (1, -2, 2, -1)), ("circular", (2, 6), (-2, 3)), ("circular", (1, 1, 5, 5), (0, 2, 3, 2)),
  ("circular", (1, 1, 4, 5, 5), (1, 2, -1, 3, 1, -2))])
def test_pad_modes_with_negative_pads(mode, shape, pads):
  x = randf(shape, seed=29)
  want = torch_pad_ref(x, pads, mode)
  out, (g,) = grads(lambda t: t.pad(pads, mode=mode) * Tensor(np.arange(want.size).reshape(want.shape) % 5), x)
  np.testing.assert_array_equal(out, want * (np.arange(want.size).reshape(want.shape) % 5))
  np.testing.assert_allclose(g, fd(lambda v: torch_pad_ref(v, pads, mode) * (np.arange(want.size).reshape(
    want.shape) % 5), x, eps=0.5)[0], atol=1e-9)


# ---------------------------------------------------------------- 6. bitwise ops with wide constants

def test_bitwise_constants_of_the_dtypes_bit_width_wrap():
  assert (Tensor([0], dtype="int32") | 0xFFFFFFFF).dtype == dtypes.int32
  check(Tensor([0, 7], dtype="int32") | 0xFFFFFFFF, np.array([-1, -1], np.int32))
  check(0xFFFFFFF0 & Tensor([-1, 0x7F], dtype="int32"), np.array([-16, 0x70], np.int32))
  check(Tensor([3, -1], dtype="int8") ^ 0xFF, np.array([3, -1], np.int8) ^ np.int8(-1))
  check(Tensor([1], dtype="int16") | 0x8000, np.array([-32767], np.int16))
  # past the bit width, and for shifts, numpy 1's rule still widens
  out = Tensor([3], dtype="int32") | 2**40
  assert out.dtype == dtypes.int64 and out.item() == 2**40 + 3
  assert (Tensor([1], dtype="int32") + 0xFFFFFFFF).dtype == dtypes.int64
  assert (Tensor([1], dtype="uint8") & 0xFF).dtype == dtypes.uint8


# ---------------------------------------------------------------- a subset on the emulated GPUs

def test_on_the_emulated_metal_device():
  """The subset below on the emulated Metal device (opened and closed here: other tests open their own)."""
  from baregrad.drivers import settings
  from baregrad.drivers.metal import framework
  from baregrad.hcq.device import Device
  with settings.override(EMU=1):
    ok, why = framework.available()
    if not ok: pytest.skip(why)
    if "METAL" in Device._open: pytest.skip("a METAL device is already open in this process")
    try: test_on_emulated_gpus("METAL")
    finally:
      import gc; gc.collect()
      if "METAL" in Device._open: Device.get("METAL").close()


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_on_emulated_gpus(device):
  if device != "METAL":
    from test_reliability import _emulated
    _emulated(device)
  b8, e8 = np.array([11, -3, 2, 7, -1], np.int32), np.array([7, 5, 30, 0, -3], np.int32)
  check(Tensor(b8, device=device) ** Tensor(e8, device=device), np.array([19487171, -243, 2**30, 1, -1], np.int32))
  import os
  ref = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "torch", "interpolate_uint8.npz"))
  got = Tensor(ref["x1"], device=device).interpolate(size=tuple(int(v) for v in ref["size1"]), mode="bilinear")
  np.testing.assert_array_equal(got.numpy(), ref["y1"])      # torch 2.13's uint8 result
  x, g = randf((3, 5), seed=30), randf((3, 5), seed=31)
  t = Tensor(x, device=device)
  (gs,) = t.softmax(1).gradient(t, gradient=Tensor(g, device=device))
  y = softmax_ref(x.astype(np.float64), 1)
  check(gs, (y * (g - (g * y).sum(1, keepdims=True))).astype(np.float32), rtol=1e-5, atol=1e-6)
  b = Tensor(np.array([0.0, 0.0, 2.0, -1.0], np.float32), device=device)
  e = Tensor(np.array([0.0, 0.3, 1.5, 2.0], np.float32), device=device)
  gb, ge = (b ** e).sum().gradient(b, e)
  rb, re = pow_ref_grads([0.0, 0.0, 2.0, -1.0], [0.0, 0.3, 1.5, 2.0])
  check(gb, rb.astype(np.float32), rtol=1e-5); check(ge, re.astype(np.float32), rtol=1e-5)
  m = Tensor(np.array([1, 0, 2, 0, 3], np.int32), device=device)
  check(m.nonzero(size=4, fill_value=-1), np.array([[0], [2], [4], [-1]], np.int32))
  check(m.masked_select(m > 0, size=4), np.array([1, 2, 3, 0], np.int32))
  x1, w1 = randf((1, 2, 6), seed=32), randf((3, 2, 3), seed=33)
  check(Tensor(x1, device=device).conv2d(Tensor(w1, device=device), padding=(1, 0)),
        conv_ref(x1, w1, [(1, 0)]).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_backward_with_no_tensor_requiring_grad_fills_every_float_tensor():
  """torch raises when nothing requires grad; baregrad follows tinygrad there: every float tensor of the graph still
  referenced gets .grad (numpy: d sum(t * (t < 0)) / dt = t < 0), but one made with requires_grad=False. When some
  tensor requires grad, only those get .grad (torch's rule)."""
  x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
  t, off = Tensor(x), Tensor(x, requires_grad=False)
  (t * (t < 0) + off).sum().backward()
  np.testing.assert_array_equal(t.grad.numpy(), (x < 0).astype(np.float32))
  assert off.grad is None
  w, other = Tensor(x, requires_grad=True), Tensor(x)
  (w * other).sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), x)
  assert other.grad is None


def test_a_0d_integer_tensor_is_an_index():
  a = np.arange(12, dtype=np.float32).reshape(4, 3)
  np.testing.assert_array_equal(Tensor(a)[:Tensor(3), 1].numpy(), a[:np.array(3), 1])
  assert list(range(10))[Tensor(4)] == 4


def test_integer_tensor_power_is_exact():
  """int ** int tensor: exact, wrapping as the dtype does (numpy's power), not exp2(e * log2 b) rounded (11 ** 7 read
  19487186); a negative exponent gives torch's integer results (1 for a base of 1, +-1 for -1, else 0)."""
  rng = np.random.default_rng(4)
  for dt in (np.int32, np.int64, np.uint8, np.int16):
    b = rng.integers(-7 if dt != np.uint8 else 0, 12, 200).astype(dt)
    e = rng.integers(0, 40, 200).astype(dt)
    np.testing.assert_array_equal((Tensor(b) ** Tensor(e)).numpy(), np.power(b, e), err_msg=np.dtype(dt).name)
  assert (Tensor(11) ** Tensor(7)).item() == 19487171
  got = (Tensor([-5, -1, 1, 2, -1, 0]) ** Tensor([-2, -3, -4, -1, -2, -1])).numpy()
  np.testing.assert_array_equal(got, [0, -1, 1, 0, 1, 0])
