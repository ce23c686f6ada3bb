"""PyTorch/tinygrad API parity, elementwise part (tensor/elementwise.py; gelu's and div's new arguments).

Forward values are compared with numpy references written from torch's documented definitions, computed in
float64 from the (dtype-rounded) input and rounded to the output dtype; NaN and +-inf must land exactly where the
reference has them, and -0.0 keeps its sign where the op is odd. Inputs span each op's domain: NaN, +-inf, +-0,
tiny and huge magnitudes, and values just inside and outside its edges. Gradients are checked in float64 against
central differences. A few ops also run on the emulated AMD and NV GPUs. On a device without float64 (METAL) the
float64 cases are skipped and the computations that use float64 only for headroom run in float32."""
import math

import numpy as np
import pytest

from baregrad.compiler.dtype import to_dtype
from baregrad.tensor import Tensor, dtypes
from helpers_ops import as_widest, has_float64, needs_float64_cases, round_to, widest_float_name

NAN, INF = math.nan, math.inf
SPECIAL = [NAN, INF, -INF, 0.0, -0.0]
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}
TINY = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126, "float64": 2.0 ** -1022}


def _both_signs(v): return [*v, *(-x for x in v)]


# inputs by domain (float64; rounded to the tested dtype, so huge values become inf in 16-bit floats)
DOMAINS = {
  "unit": [*np.linspace(-1, 1, 41), *_both_signs([1 - 2 ** -20, 1e-20, 1e-5, 1.5, 3.0]), *SPECIAL],
  "line": [*_both_signs(np.geomspace(1e-30, 1e30, 25)), *np.linspace(-5, 5, 21), 0.4, 0.66, 0.7, 2.4, 2.5, *SPECIAL],
  "ge1": [*(1 + np.geomspace(1e-7, 1e30, 30)), 1.0, 1.5, 2.0, 0.5, -1.0, -3.0, *SPECIAL],
  "gt-1": [*np.geomspace(1e-30, 1e30, 25), *(-np.geomspace(1e-30, 1, 20)), -0.75, -1.0, -2.0, *SPECIAL],
  "pos": [*np.geomspace(1e-30, 1e30, 25), 1.0, 10.0, 1000.0, -1.0, *SPECIAL],
  "exp": [*_both_signs(np.geomspace(1e-30, 700, 30)), *_both_signs([0.5, 1.0, 88.0, 89.5, 90.0, 710.0, 720.0]),
          *SPECIAL],
  "act": [*np.linspace(-8, 8, 33), *_both_signs([1e-6, 2.9, 3.0, 3.1, 6.0, 20.0, 21.0, 50.0, 1e4]), *SPECIAL],
}


def _inputs(domain, dtype):
  with np.errstate(over="ignore"): return round_to(np.array(DOMAINS[domain], np.float64), dtype)


def _make(x, dtype):
  return Tensor(x, dtype=to_dtype(dtype))


def assert_values(t, want, dtype, ulps=4.0, atol=0.0, signed_zero=False):
  """t (a Tensor of dtype) against the float64 reference `want`: rounded to dtype, then NaN/inf positions exact and
  finite values within `ulps` units of the dtype's epsilon (relative) or atol (a scalar or one per element)."""
  assert t.dtype == to_dtype(dtype), f"dtype {t.dtype} != {dtype}"
  got = t.numpy().astype(np.float64)
  with np.errstate(over="ignore"): want = round_to(np.asarray(want, np.float64), dtype).astype(np.float64)
  assert got.shape == want.shape
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
  inf = np.isinf(want)
  np.testing.assert_array_equal(got[inf], want[inf], err_msg="infinities")
  fin = np.isfinite(want)
  err = np.abs(got[fin] - want[fin])
  tiny = TINY[dtype]   # subnormal results have fewer bits
  bound = np.broadcast_to(atol, want.shape)[fin] + ulps * EPS[dtype] * np.maximum(np.abs(want[fin]), tiny)
  if (bad := np.flatnonzero(~(err <= bound))).size:
    worst = bad[np.argsort(-(err[bad] / np.maximum(bound[bad], 1e-300)))][:5]
    raise AssertionError(f"{bad.size} of {err.size} finite values off by more than {ulps} ulp: " + ", ".join(
      f"got {got[fin][i]!r} want {want[fin][i]!r} ({err[i] / max(EPS[dtype] * abs(want[fin][i]), 1e-300):.3g} ulp)"
      for i in worst))
  if signed_zero:
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg="sign of zero")


def _np(fn):
  def ref(*a):
    with np.errstate(all="ignore"): return fn(*a)
  return ref


_erf = np.vectorize(math.erf)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _softplus(x): return np.logaddexp(0.0, x)
def _GELU_ATOL(x): return 1e-7 * np.maximum(1.0, np.abs(np.nan_to_num(x)))   # 0.5 |x| * erf's 1.5e-7, and rounding


# ---------------------------------------------------------------- unary math

# name, method call, numpy reference, domain, ulps (float32/float64), odd (keeps the sign of zero)
MATH = [
  ("asin", lambda t: t.asin(), np.arcsin, "unit", 3, True),
  ("acos", lambda t: t.acos(), np.arccos, "unit", 3, False),
  ("atan", lambda t: t.atan(), np.arctan, "line", 3, True),
  ("sinh", lambda t: t.sinh(), np.sinh, "exp", 4, True),
  ("cosh", lambda t: t.cosh(), np.cosh, "exp", 4, False),
  ("asinh", lambda t: t.asinh(), np.arcsinh, "line", 3, True),
  ("acosh", lambda t: t.acosh(), np.arccosh, "ge1", 4, False),
  ("atanh", lambda t: t.atanh(), np.arctanh, "unit", 6, True),
  ("log10", lambda t: t.log10(), np.log10, "pos", 3, False),
  ("log2", lambda t: t.log2(), np.log2, "pos", 3, False),
  ("log1p", lambda t: t.log1p(), np.log1p, "gt-1", 3, True),
  ("expm1", lambda t: t.expm1(), np.expm1, "exp", 3, True),
]


@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64"]))
@pytest.mark.parametrize("name, call, ref, domain, ulps, odd", MATH, ids=[m[0] for m in MATH])
def test_math(name, call, ref, domain, ulps, odd, dtype):
  x = _inputs(domain, dtype)
  assert_values(call(_make(x, dtype)), _np(ref)(x.astype(np.float64)), dtype, ulps, signed_zero=odd)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["asin", "atan", "sinh", "acosh", "log1p"])
def test_math_16bit(name, dtype):
  """16-bit floats are computed in float32 and rounded once: within one of their ulps (plus the double rounding)."""
  call, ref, domain = next((c, r, d) for n, c, r, d, _, _ in MATH if n == name)
  x = _inputs(domain, dtype)
  assert_values(call(_make(x, dtype)), _np(ref)(x.astype(np.float64)), dtype, ulps=1.01)


@pytest.mark.parametrize("name", ["atan", "asinh", "log10", "expm1"])
def test_math_int_input_is_float32(name):
  call, ref, _ = next((c, r, d) for n, c, r, d, _, _ in MATH if n == name)
  x = np.array([-7, -1, 0, 1, 3, 100, 2 ** 20], np.int32)
  assert_values(call(Tensor(x)), _np(ref)(x.astype(np.float64)), "float32", 4)


def test_acos_asin_near_the_edges_keep_relative_precision():
  """acos(1 - d) ~ sqrt(2d) and asin(-1 + d) + pi/2 are small: relative, not absolute, accuracy."""
  d = np.array([2 ** -24, 2 ** -20, 1e-5, 1e-3], np.float32)
  assert_values(Tensor(1 - d).acos(), np.arccos((1 - d).astype(np.float64)), "float32", 3)
  if has_float64():
    dd = np.array([2 ** -53, 1e-12, 1e-8], np.float64)
    assert_values(Tensor(1 - dd).acos(), np.arccos(1 - dd), "float64", 3)


def test_cosh_sinh_reach_the_top_of_float32():
  """cosh(89.4) ~ 3.2e38 fits in float32 though exp(89.4) does not."""
  x = np.array([88.5, 89.0, 89.4, -89.4, 89.5], np.float32)
  assert_values(Tensor(x).cosh(), np.cosh(x.astype(np.float64)), "float32", 4)
  assert_values(Tensor(x).sinh(), np.sinh(x.astype(np.float64)), "float32", 4)


# ---------------------------------------------------------------- classification

@pytest.mark.parametrize("dtype", needs_float64_cases(["float16", "bfloat16", "float32", "float64"]))
def test_isnan_isinf_isfinite(dtype):
  x = round_to(np.array([NAN, -NAN, INF, -INF, 0.0, -0.0, 1.0, -3.5, 1e-40, 6e4]), dtype)
  for name, ref in (("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)):
    t = getattr(_make(x, dtype), name)()
    assert t.dtype == dtypes.bool
    np.testing.assert_array_equal(t.numpy(), ref(x), err_msg=name)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool", "int64"])
def test_isnan_isinf_isfinite_ints(dtype):
  x = np.array([0, 1, 2, 1], dtype)
  for name, ref in (("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)):
    t = getattr(Tensor(x), name)()
    assert t.dtype == dtypes.bool and t.shape == (4,)
    np.testing.assert_array_equal(t.numpy(), ref(x), err_msg=name)


@pytest.mark.parametrize("kwargs", [{}, {"equal_nan": True}, {"rtol": 0.1, "atol": 0.0}, {"rtol": 0.0, "atol": 0.0},
                                    {"rtol": 1e-3, "atol": 1e-2}])
def test_isclose(kwargs):
  a = np.array([1.0, 1.0, 1.0, 100.0, INF, INF, -INF, NAN, NAN, 0.0, 1e-9, 5.0, 1.0], np.float32)
  b = np.array([1.0, 1 + 1e-6, 1.2, 100.5, INF, -INF, -INF, NAN, 1.0, -0.0, 0.0, INF, NAN], np.float32)
  got = Tensor(a).isclose(Tensor(b), **kwargs)
  assert got.dtype == dtypes.bool
  np.testing.assert_array_equal(got.numpy(), np.isclose(a, b, **kwargs))


def test_isclose_ints_broadcast_and_scalars():
  a = np.array([[0, 10, 2 ** 30], [3, -4, 7]], np.int32)
  b = np.array([1, 10, 2 ** 30 + 1], np.int32)
  np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), rtol=0, atol=1).numpy(), np.isclose(a, b, rtol=0, atol=1))
  np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), rtol=0, atol=0).numpy(), a == b)
  np.testing.assert_array_equal(Tensor(as_widest(a)).isclose(7.0).numpy(), np.isclose(a, 7.0))
  with pytest.raises(ValueError, match="rtol"): Tensor(a).isclose(Tensor(b), rtol=-1)


# ---------------------------------------------------------------- binary

def _pairs(dtype):
  v = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -7.25, 1e-30, 3e30, 0.1]
  a, b = np.meshgrid(v, v)
  with np.errstate(over="ignore"): return round_to(a.ravel(), dtype), round_to(b.ravel(), dtype)


@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64", "float16"]))
def test_fmod_float(dtype):
  a, b = _pairs(dtype)
  assert_values(_make(a, dtype).fmod(_make(b, dtype)), _np(np.fmod)(a, b), dtype, 0, signed_zero=True)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_fmod_int(dtype):
  info = np.iinfo(dtype)
  v = [0, 1, 3, 7, info.max, info.min] + ([-1, -3, -7] if info.min else [])
  a, b = (m.ravel().astype(dtype) for m in np.meshgrid(v, v))
  with np.errstate(all="ignore"):
    want = np.fmod(a, b)   # numpy: x % 0 is 0 (torch raises); INT_MIN % -1 is 0
  got = Tensor(a).fmod(Tensor(b))
  assert got.dtype == to_dtype(dtype)
  np.testing.assert_array_equal(got.numpy(), want)


def test_fmod_scalars_promote():
  x = np.array([5, -5, 7], np.int32)
  got = Tensor(x).fmod(2.5)
  assert got.dtype == dtypes.float32
  np.testing.assert_array_equal(got.numpy(), np.fmod(x, 2.5).astype(np.float32))
  np.testing.assert_array_equal(Tensor(x).fmod(3).numpy(), np.fmod(x, 3))


@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64", "bfloat16"]))
def test_copysign(dtype):
  a, b = _pairs(dtype)
  got = _make(a, dtype).copysign(_make(b, dtype))
  assert_values(got, np.copysign(a, b), dtype, 0, signed_zero=True)
  nan_sign = np.signbit(got.numpy()[np.isnan(a)])
  np.testing.assert_array_equal(nan_sign, np.signbit(b[np.isnan(a)]))   # NaN takes the sign too


def test_copysign_negative_nan_and_ints():
  neg_nan = np.array([-NAN], np.float32)
  assert np.signbit(neg_nan[0])
  np.testing.assert_array_equal(Tensor(np.float32([2.0])).copysign(Tensor(neg_nan)).numpy(), [-2.0])
  got = Tensor(np.array([3, -4, 0], np.int32)).copysign(Tensor(np.array([-1, 1, -1], np.int32)))
  assert got.dtype == dtypes.float32
  assert_values(got, np.copysign([3, -4, 0], [-1, 1, -1]), "float32", 0, signed_zero=True)


@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64"]))
def test_logaddexp(dtype):
  a, b = _pairs(dtype)
  assert_values(_make(a, dtype).logaddexp(_make(b, dtype)), _np(np.logaddexp)(a, b), dtype, 3)
  big = np.array([1000.0, -1000.0, 0.0, 80.0], dtype)
  other = np.array([1000.0, -1001.0, -800.0, 1.0], dtype)
  assert_values(_make(big, dtype).logaddexp(_make(other, dtype)), np.logaddexp(big, other), dtype, 3)


def test_logaddexp_ints_and_scalar():
  got = Tensor(np.array([0, 1, 2], np.int32)).logaddexp(1.0)
  assert_values(got, np.logaddexp([0, 1, 2], 1.0), "float32", 3)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "uint32"])
def test_shifts(dtype):
  info = np.iinfo(dtype)
  bits = info.bits
  x = np.array([1, 3, 5, info.max, info.min, 0] + ([-1, -6] if info.min else [6, 7]), dtype)
  for amounts in ([0, 1, 2, bits - 1, bits, bits + 3, 1, 3], [-1, 2, 0, 1, 1, 5, bits - 1, bits * 2]):
    s = np.array([a if a >= 0 or info.min else info.max for a in amounts], dtype)   # unsigned: -1 is the max
    np.testing.assert_array_equal(Tensor(x).lshift(Tensor(s)).numpy(), np.left_shift(x, s))
    np.testing.assert_array_equal(Tensor(x).rshift(Tensor(s)).numpy(), np.right_shift(x, s))
    np.testing.assert_array_equal(Tensor(x).bitwise_left_shift(Tensor(s)).numpy(), np.left_shift(x, s))
  np.testing.assert_array_equal(Tensor(x).lshift(2).numpy(), np.left_shift(x, np.array(2, dtype)))
  np.testing.assert_array_equal(Tensor(x).rshift(1).numpy(), np.right_shift(x, np.array(1, dtype)))


def test_shift_and_bitwise_not_reject_floats():
  for fn in (lambda t: t.lshift(1), lambda t: t.rshift(1), lambda t: t.bitwise_not()):
    with pytest.raises(TypeError, match="float32"): fn(Tensor([1.0]))


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "uint32", "int64"])
def test_bitwise_not_and_neg(dtype):
  info = np.iinfo(dtype) if dtype != "bool" else None
  x = np.array([True, False, True]) if info is None else np.array([0, 1, 5, info.max, info.min], dtype)
  got = Tensor(x).bitwise_not()
  assert got.dtype == to_dtype(dtype)
  np.testing.assert_array_equal(got.numpy(), np.invert(x))
  if dtype == "bool":
    with pytest.raises(TypeError): Tensor(x).neg()
  else:
    with np.errstate(all="ignore"): np.testing.assert_array_equal(Tensor(x).neg().numpy(), np.negative(x))


def test_neg_float_signs():
  x = np.array([0.0, -0.0, 1.5, -INF, NAN], np.float32)
  assert_values(Tensor(x).neg(), -x.astype(np.float64), "float32", 0, signed_zero=True)


# ---------------------------------------------------------------- div with rounding_mode

@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64"]))
def test_div_rounding_float(dtype):
  a, b = _pairs(dtype)
  a = np.concatenate([a, np.array([6.0, -6.0, 7.0, -7.0, 0.3, 1e30], dtype)])
  b = np.concatenate([b, np.array([3.0, 3.0, -2.0, 2.0, 0.1, 3.0], dtype)])
  ta, tb = _make(a, dtype), _make(b, dtype)
  assert_values(ta.div(tb), _np(np.divide)(a, b), dtype, 0)
  assert_values(ta.div(tb, rounding_mode="trunc"), _np(lambda p, q: np.trunc(p / q))(a, b), dtype, 0)
  assert_values(ta.div(tb, rounding_mode="floor"), _np(np.floor_divide)(a, b), dtype, 0)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_div_rounding_int(dtype):
  info = np.iinfo(dtype)
  v = [0, 1, 2, 7, 100 % (info.max + 1)] + ([-1, -2, -7] if info.min else [])
  a, b = (m.ravel().astype(dtype) for m in np.meshgrid(v, v))
  nz = b != 0
  trunc = np.zeros_like(a)
  trunc[nz] = np.fix(a[nz].astype(np.float64) / b[nz]).astype(dtype)   # C's division; x / 0 gives 0 here
  got = Tensor(a).div(Tensor(b), rounding_mode="trunc")
  assert got.dtype == to_dtype(dtype)
  np.testing.assert_array_equal(got.numpy(), trunc)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(Tensor(a).div(Tensor(b), rounding_mode="floor").numpy(), np.floor_divide(a, b))
  true = Tensor(a).div(Tensor(b))
  assert true.dtype == dtypes.float32
  with np.errstate(all="ignore"): assert_values(true, a.astype(np.float64) / b, "float32", 1)


def test_div_rounding_mode_errors_and_scalars():
  with pytest.raises(ValueError, match="rounding_mode"): Tensor([1.0]).div(2, rounding_mode="round")
  np.testing.assert_array_equal(Tensor([-7, 7]).div(2, rounding_mode="trunc").numpy(), [-3, 3])
  np.testing.assert_array_equal(Tensor([-7, 7]).div(2, rounding_mode="floor").numpy(), [-4, 3])
  np.testing.assert_array_equal(Tensor([-7.5, 7.5]).div(2, rounding_mode="trunc").numpy(), np.float32([-3, 3]))


# ---------------------------------------------------------------- activations

def _hardswish(x): return np.where(x <= -3, 0.0, np.where(x >= 3, x, x * (x + 3) / 6))
def _hardsigmoid(x): return np.where(x <= -3, 0.0, np.where(x >= 3, 1.0, x / 6 + 0.5))
def _elu(x, alpha=1.0): return np.where(x > 0, x, alpha * np.expm1(x))


# name, call, reference, ulps. Ops built on tensor/composite.py's exp (sigmoid, tanh) get 32: its exp2(x / ln2)
# loses the rounding of x / ln2 (~20 ulp at |x| = 50; in float64 ~500 at 700); gelu's erf is A&S 7.1.26 (|error| < 1.5e-7): `_GELU_ATOL`
ACTIVATIONS = [
  ("elu", lambda t: t.elu(), _elu, 4),
  ("elu_alpha", lambda t: t.elu(alpha=0.3), lambda x: _elu(x, 0.3), 4),
  ("celu", lambda t: t.celu(alpha=2.0), lambda x: np.maximum(0, x) + np.minimum(0, 2.0 * np.expm1(x / 2.0)), 4),
  ("selu", lambda t: t.selu(), lambda x: SELU_SCALE * (np.maximum(0, x) + np.minimum(0, SELU_ALPHA * np.expm1(x))), 4),
  ("mish", lambda t: t.mish(), lambda x: x * np.tanh(_softplus(x)), 4),
  ("swish", lambda t: t.swish(), lambda x: x / (1 + np.exp(-x)), 32),
  ("quick_gelu", lambda t: t.quick_gelu(), lambda x: x / (1 + np.exp(-1.702 * x)), 32),
  ("gelu", lambda t: t.gelu(), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), 32),
  ("gelu_none", lambda t: t.gelu(approximate="none"), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), 32),
  ("gelu_tanh", lambda t: t.gelu(approximate="tanh"),
   lambda x: x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), 1024),   # sigmoid(2y), 2y to -700
  ("hardswish", lambda t: t.hardswish(), _hardswish, 2),
  ("hardsigmoid", lambda t: t.hardsigmoid(), _hardsigmoid, 2),
  ("hardtanh", lambda t: t.hardtanh(), lambda x: np.clip(x, -1, 1), 0),
  ("hardtanh_range", lambda t: t.hardtanh(min_val=-2.5, max_val=0.5), lambda x: np.clip(x, -2.5, 0.5), 0),
  ("relu6", lambda t: t.relu6(), lambda x: np.minimum(np.maximum(x, 0), 6), 0),
  ("logsigmoid", lambda t: t.logsigmoid(), lambda x: -_softplus(-x), 4),
  ("softsign", lambda t: t.softsign(), lambda x: x / (1 + np.abs(x)), 2),
]


@pytest.mark.parametrize("dtype", needs_float64_cases(["float32", "float64"]))
@pytest.mark.parametrize("name, call, ref, ulps", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation(name, call, ref, ulps, dtype):
  x = _inputs("act", dtype)
  atol = _GELU_ATOL(x) if name in ("gelu", "gelu_none") else 0.0
  if name == "hardsigmoid": atol = 4 * EPS[dtype]   # the reference's x/6 + 1/2 cancels near x = -3
  assert_values(call(_make(x, dtype)), _np(ref)(x.astype(np.float64)), dtype, ulps, atol=atol)


def test_logsigmoid_keeps_tiny_values():
  x = np.array([20.0, 40.0, 80.0, 87.0], np.float32)   # log(sigmoid(x)) = -exp(-x) to float precision
  assert_values(Tensor(x).logsigmoid(), -np.exp(-x.astype(np.float64)), "float32", 4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_activation_16bit(dtype):
  x = _inputs("act", dtype)
  for name in ("elu", "selu", "mish", "hardswish", "logsigmoid"):
    call, ref = next((c, r) for n, c, r, _ in ACTIVATIONS if n == name)
    assert_values(call(_make(x, dtype)), _np(ref)(x.astype(np.float64)), dtype, 1.01)


def test_gelu_approximate_is_checked():
  with pytest.raises(ValueError, match="approximate"): Tensor([1.0]).gelu(approximate="erf")


def test_relu6_hardtanh_keep_int_dtype():
  x = np.array([-3, 0, 4, 9], np.int32)
  got = Tensor(x).relu6()
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), np.clip(x, 0, 6))
  with pytest.raises(ValueError, match="min_val"): Tensor([1.0]).hardtanh(1.0, -1.0)


# ---------------------------------------------------------------- softmin, normalize, std_mean

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmin(dim):
  x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32) * 4
  e = np.exp(-(x - x.min(dim, keepdims=True)).astype(np.float64))
  assert_values(Tensor(x).softmin(dim), e / e.sum(dim, keepdims=True), "float32", 8)
  wide = widest_float_name()
  got = Tensor(x.astype(np.int32)).softmin(dim, dtype=wide)
  xi = x.astype(np.int32).astype(np.float64)
  e = np.exp(-(xi - xi.min(dim, keepdims=True)))
  assert_values(got, e / e.sum(dim, keepdims=True), wide, 8)


@pytest.mark.parametrize("p, dim", [(2.0, 1), (2, 0), (1, -1), (3.0, 1), (0.5, 1), (INF, 1), (-INF, 0), (0, 1)])
def test_normalize(p, dim):
  x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
  x[1, 2] = 0.0
  x[2] = 0.0                                                 # an all-zero row: divided by eps, stays 0
  norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=dim, keepdims=True) if p not in (0,) else \
    np.count_nonzero(x, axis=dim, keepdims=True).astype(np.float64)
  with np.errstate(all="ignore"):
    want = x / np.maximum(norm, 1e-12)
  assert_values(Tensor(x).normalize(p=p, dim=dim), want, "float32", 8)


def test_normalize_defaults_eps_and_errors():
  x, wide = as_widest([[3.0, 4.0], [1e-14, 0.0]]), widest_float_name()
  x64 = x.astype(np.float64)
  norm = np.linalg.norm(x64, axis=1, keepdims=True)
  assert_values(Tensor(x).normalize(), x64 / np.maximum(norm, 1e-12), wide, 4)
  assert_values(Tensor(x).normalize(eps=1.0), x64 / np.maximum(norm, 1.0), wide, 4)
  with pytest.raises(IndexError): Tensor([1.0, 2.0]).normalize()   # torch's default dim=1 needs 2 dims


@pytest.mark.parametrize("kwargs, np_axis", [({}, None), ({"dim": 1}, 1), ({"dim": (0, 2), "keepdim": True}, (0, 2)),
                                             ({"dim": 0, "correction": 0}, 0), ({"axis": -1}, -1)])
def test_std_mean_var_mean(kwargs, np_axis):
  x, wide = as_widest(np.random.default_rng(3).standard_normal((2, 3, 4))), widest_float_name()
  ddof = kwargs.get("correction", 1)
  keep = kwargs.get("keepdim", False)
  s, m = Tensor(x).std_mean(**kwargs)
  v, m2 = Tensor(x).var_mean(**kwargs)
  x = x.astype(np.float64)                                      # the reference in float64 from the tested values
  assert_values(s, np.std(x, axis=np_axis, ddof=ddof, keepdims=keep), wide, 8)
  assert_values(m, np.mean(x, axis=np_axis, keepdims=keep), wide, 8)
  assert_values(v, np.var(x, axis=np_axis, ddof=ddof, keepdims=keep), wide, 8)
  assert_values(m2, np.mean(x, axis=np_axis, keepdims=keep), wide, 8)


def test_std_mean_positional_is_torch_order():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  s, m = Tensor(x).std_mean(0, 0, True)     # dim, correction, keepdim
  assert s.shape == m.shape == (1, 4)
  assert_values(s, np.std(x, 0, ddof=0, keepdims=True), "float32", 4)
  with pytest.raises(ValueError, match="dim"): Tensor(x).std_mean(dim=0, axis=1)


# ---------------------------------------------------------------- initializers

def test_normal():
  Tensor.manual_seed(11)
  t = Tensor.normal(64, 64, mean=3.0, std=0.5)
  assert t.shape == (64, 64) and t.dtype == dtypes.float32
  v = t.numpy()
  assert abs(v.mean() - 3.0) < 0.03 and abs(v.std() - 0.5) < 0.02
  if has_float64():
    t = Tensor.normal((8, 2), dtype="float64", requires_grad=True)
    assert t.shape == (8, 2) and t.dtype == dtypes.float64 and t.requires_grad


@pytest.mark.parametrize("shape, a", [((64, 96), 0.01), ((32, 4, 3, 3), 0.0), ((16, 50), 5.0)])
def test_kaiming(shape, a):
  Tensor.manual_seed(5)
  fan_in = math.prod(shape[1:])
  gain = math.sqrt(2.0 / (1 + a * a))
  u = Tensor.kaiming_uniform(*shape, a=a).numpy()
  bound = math.sqrt(3.0) * gain / math.sqrt(fan_in)
  assert u.shape == shape and np.abs(u).max() <= bound and np.abs(u).max() > 0.95 * bound
  assert abs(u.std() - bound / math.sqrt(3)) < 0.05 * bound
  n = Tensor.kaiming_normal(shape, a=a).numpy()
  assert n.shape == shape and abs(n.std() - gain / math.sqrt(fan_in)) < 0.05 * gain / math.sqrt(fan_in)
  assert abs(n.mean()) < 0.05 * gain / math.sqrt(fan_in)


# ---------------------------------------------------------------- clone and casts

def test_clone_is_a_snapshot_in_its_own_buffer():
  x = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()
  c = x.clone()
  x.assign(x * 10)
  np.testing.assert_array_equal(c.numpy(), [1.0, 2.0, 3.0])
  np.testing.assert_array_equal(x.numpy(), [10.0, 20.0, 30.0])
  assert c._buffer() is not x._buffer()
  lazy = (Tensor(np.arange(6, dtype=np.int64)).reshape(2, 3) * 2).clone()
  assert lazy.shape == (2, 3) and lazy.dtype == dtypes.int64
  np.testing.assert_array_equal(lazy.numpy(), np.arange(6).reshape(2, 3) * 2)
  assert Tensor.zeros(0, 3).clone().shape == (0, 3)
  assert Tensor(2.5).clone().item() == 2.5


CASTS = [("float", "float32"), ("half", "float16"), ("double", "float64"), ("int", "int32"), ("long", "int64"),
         ("bool", "bool"), ("short", "int16"), ("char", "int8"), ("byte", "uint8")]


@pytest.mark.parametrize("method, dtype", needs_float64_cases(CASTS))
def test_cast_methods(method, dtype):
  x = np.array([-2.75, -1.0, 0.0, 0.5, 3.9, 100.0], np.float32)
  if dtype == "uint8": x = np.abs(x)
  got = getattr(Tensor(x), method)()
  assert got.dtype == to_dtype(dtype)
  np.testing.assert_array_equal(got.numpy(), x.astype(dtype))
  assert getattr(Tensor(np.array([1, 0, 7], np.int32)), method)().dtype == to_dtype(dtype)


def test_bfloat16_method():
  got = Tensor(np.array([1.0, 1.00390625, 3.0], np.float32)).bfloat16()
  assert got.dtype == dtypes.bfloat16
  np.testing.assert_array_equal(got.numpy(), round_to([1.0, 1.00390625, 3.0], "bfloat16"))


def test_dtype_aliases():
  assert dtypes.int is dtypes.int32 and dtypes.long is dtypes.int64
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
  assert dtypes.short is dtypes.int16 and dtypes.char is dtypes.int8 and dtypes.uchar is dtypes.uint8
  assert dtypes.uint is dtypes.uint32 and dtypes.ulong is dtypes.uint64 and dtypes.ushort is dtypes.uint16
  assert dtypes.float32 not in (dtypes.int, dtypes.long)


@pytest.mark.parametrize("name, want", [("float32", "float32"), ("int64", "int64"), ("float", "float32"),
                                        ("half", "float16"), ("double", "float64"), ("long", "int64"), ("int", "int32"),
                                        ("bool", "bool"), ("bfloat16", "bfloat16"), ("torch.float16", "float16"),
                                        ("dtypes.uint8", "uint8"), ("f4", "float32"), ("<i8", "int64"), ("u2", "uint16"),
                                        ("short", "int16"), ("uint", "uint32")])
def test_to_dtype_strings(name, want):
  assert to_dtype(name) is getattr(dtypes, want)


@pytest.mark.parametrize("bad", ["complex64", "index", "default_float", "float128", "floaty", "c8", ""])
def test_to_dtype_rejects(bad):
  with pytest.raises(TypeError, match="unsupported dtype"): to_dtype(bad)


def test_string_dtypes_everywhere():
  assert Tensor([1, 2], dtype="float16").dtype == dtypes.float16
  assert Tensor(3, dtype="int64").dtype == dtypes.int64
  assert Tensor.zeros(2, dtype="half").dtype == dtypes.float16
  assert Tensor.ones(2, dtype="long").dtype == dtypes.int64
  assert Tensor.empty(2, dtype="int8").dtype == dtypes.int8
  assert Tensor.arange(4, dtype="float").dtype == dtypes.float32
  assert Tensor.randn(2, dtype="half").dtype == dtypes.float16
  assert Tensor.randint(0, 5, (3,), dtype="int64").dtype == dtypes.int64
  assert Tensor.eye(2, dtype="bool").dtype == dtypes.bool
  x = Tensor([1.5, 2.5])
  assert x.cast("int32").dtype == dtypes.int32 and x.bitcast("uint32").dtype == dtypes.uint32
  assert x.zeros_like(dtype="int16").dtype == dtypes.int16 and x.full_like(2, dtype="uint8").dtype == dtypes.uint8
  np.testing.assert_array_equal(Tensor([1, 2], dtype="float16").numpy(), np.float16([1, 2]))
  if has_float64():
    assert Tensor.full((2,), 1, dtype="double").dtype == dtypes.float64
    assert Tensor.rand(2, dtype="float64").dtype == dtypes.float64
    assert Tensor.uniform(2, dtype="float64").dtype == dtypes.float64
    assert Tensor.linspace(0, 1, 3, dtype="float64").dtype == dtypes.float64
    assert x.sum(dtype="float64").dtype == dtypes.float64


# ---------------------------------------------------------------- gradients (float64, central differences: skipped on
# a device without float64)

def _weights(shape, seed=0): return np.random.default_rng(seed).standard_normal(shape)


def _value(fn, arrays):
  with Tensor.no_grad(): return fn(*[Tensor(a, dtype=dtypes.float64) for a in arrays]).numpy()


def gradcheck(fn, *arrays, elementwise=True, rtol=1e-6, atol=1e-9):
  """backward() of sum(fn(x) * W) against central differences with a step relative to each |x|. Elementwise ops
  perturb every element at once (two evaluations per input); the others one element at a time."""
  arrays = [np.asarray(a, np.float64) for a in arrays]
  ts = [Tensor(a, dtype=dtypes.float64, requires_grad=True) for a in arrays]
  out = fn(*ts)
  outs = out if isinstance(out, tuple) else (out,)
  ws = [_weights(o.shape, i) for i, o in enumerate(outs)]
  loss = sum((o * Tensor(w, dtype=dtypes.float64)).sum() for o, w in zip(outs, ws))
  loss.backward()
  def weighted(vals):
    vals = vals if isinstance(vals, tuple) else (vals,)
    return [np.asarray(v) * w for v, w in zip(vals, ws)]
  def value(arrs):
    with Tensor.no_grad():
      r = fn(*[Tensor(a, dtype=dtypes.float64) for a in arrs])
      return tuple(t.numpy() for t in r) if isinstance(r, tuple) else r.numpy()
  for i, a in enumerate(arrays):
    h = 1e-6 * np.maximum(1e-2, np.abs(a))
    if elementwise:
      plus, minus = list(arrays), list(arrays)
      plus[i], minus[i] = a + h, a - h
      want = sum((p - m) for p, m in zip(weighted(value(plus)), weighted(value(minus)))) / (2 * h)
    else:
      want = np.zeros_like(a)
      for j in range(a.size):
        plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
        plus[i].reshape(-1)[j] += h.reshape(-1)[j]
        minus[i].reshape(-1)[j] -= h.reshape(-1)[j]
        want.reshape(-1)[j] = sum((p - m).sum() for p, m in zip(weighted(value(plus)), weighted(value(minus)))) \
          / (2 * h.reshape(-1)[j])
    got = ts[i].grad
    assert got is not None, f"input {i} got no gradient"
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")


UNIT = [-0.95, -0.6, -1e-3, 0.0, 0.2, 0.7, 0.93]
WIDE = [-40.0, -3.0, -1.0, -0.5, 0.0, 0.3, 0.7, 2.0, 5.0, 1e3]
ACT = [-30.0, -4.0, -2.5, -0.7, -1e-3, 0.4, 1.3, 2.2, 4.0, 25.0]
GRAD_UNARY = [
  ("asin", lambda t: t.asin(), UNIT), ("acos", lambda t: t.acos(), UNIT), ("atanh", lambda t: t.atanh(), UNIT),
  ("atan", lambda t: t.atan(), WIDE), ("asinh", lambda t: t.asinh(), [-1e9, -20.0, -1.0, -1e-3, 0.0, 0.5, 3.0, 1e10]),
  ("sinh", lambda t: t.sinh(), [-30.0, -2.0, -0.9, -1e-3, 0.0, 0.5, 1.5, 40.0]),
  ("cosh", lambda t: t.cosh(), [-30.0, -2.0, -0.9, -1e-3, 0.0, 0.5, 1.5, 40.0]),
  ("acosh", lambda t: t.acosh(), [1.05, 1.5, 1.99, 2.5, 30.0, 1e9]),
  ("log10", lambda t: t.log10(), [1e-5, 0.3, 1.0, 7.0, 1e6]),
  ("log1p", lambda t: t.log1p(), [-0.9, -0.2, -1e-5, 0.0, 0.2, 0.3, 5.0, 1e5]),
  ("expm1", lambda t: t.expm1(), [-30.0, -1.0, -0.4, -1e-4, 0.0, 0.3, 0.6, 5.0, 30.0]),
  ("elu", lambda t: t.elu(), ACT), ("celu", lambda t: t.celu(alpha=0.5), ACT), ("selu", lambda t: t.selu(), ACT),
  ("mish", lambda t: t.mish(), ACT), ("swish", lambda t: t.swish(), ACT), ("quick_gelu", lambda t: t.quick_gelu(), ACT),
  ("gelu", lambda t: t.gelu(), ACT), ("gelu_tanh", lambda t: t.gelu(approximate="tanh"), ACT),
  ("hardswish", lambda t: t.hardswish(), ACT), ("hardsigmoid", lambda t: t.hardsigmoid(), ACT),
  ("hardtanh", lambda t: t.hardtanh(-2.0, 3.0), ACT), ("relu6", lambda t: t.relu6(), [*ACT, 5.5, 7.0]),
  ("logsigmoid", lambda t: t.logsigmoid(), ACT), ("softsign", lambda t: t.softsign(), ACT),
  ("neg", lambda t: t.neg(), ACT),
]


@pytest.mark.needs_float64
@pytest.mark.parametrize("name, fn, x", GRAD_UNARY, ids=[g[0] for g in GRAD_UNARY])
def test_grad_unary(name, fn, x):
  # GELU's erf is an approximation (|error| < 1.5e-7) differentiated exactly (erf' = 2/sqrt(pi) exp(-x^2), as torch):
  # central differences of the approximation differ from that by up to the approximation's slope error
  # (test_api_autograd checks the gradient against the closed form)
  gradcheck(fn, x, atol=5e-7 if name == "gelu" else 1e-9)


@pytest.mark.parametrize("name, fn, a, b", [
  ("logaddexp", lambda a, b: a.logaddexp(b), [-3.0, 0.5, 2.0, 700.0, -1.0], [1.0, 0.5, -40.0, 699.0, -1.0]),
  ("copysign", lambda a, b: a.copysign(b), [-3.0, 0.5, 2.0, -1.5], [1.0, -0.5, -4.0, 2.0]),
  ("fmod", lambda a, b: a.fmod(b), [5.5, -5.5, 7.3, -0.7, 100.25], [2.0, 2.0, -3.0, 0.5, 7.5]),
  ("div_true", lambda a, b: a.div(b), [5.5, -5.5, 1.0], [2.0, -3.0, 0.25]),
])
@pytest.mark.needs_float64
def test_grad_binary(name, fn, a, b):
  gradcheck(fn, a, b)


@pytest.mark.parametrize("name, fn", [
  ("normalize", lambda t: t.normalize()), ("normalize_p1_dim0", lambda t: t.normalize(p=1, dim=0)),
  ("normalize_p3", lambda t: t.normalize(p=3.0)), ("softmin", lambda t: t.softmin(1)),
  ("std_mean", lambda t: t.std_mean(1)), ("var_mean", lambda t: t.var_mean(dim=0, correction=0)),
])
@pytest.mark.needs_float64
def test_grad_reducing(name, fn):
  x = np.array([[0.5, -1.2, 2.0], [1.1, 0.3, -0.4]])
  gradcheck(fn, x, elementwise=False)


# ---------------------------------------------------------------- emulated GPUs (forward only)

GPU_CASES = [
  ("atan", lambda t: t.atan(), np.arctan),
  ("asinh", lambda t: t.asinh(), np.arcsinh),
  ("expm1", lambda t: t.expm1(), np.expm1),
  ("logaddexp", lambda t: t.logaddexp(t.flip(0)), lambda x: np.logaddexp(x, x[::-1])),
  ("fmod", lambda t: t.fmod(2.5), lambda x: np.fmod(x, 2.5)),
  ("hardswish_elu", lambda t: t.hardswish() + t.elu(), lambda x: _hardswish(x) + _elu(x)),
]
GPU_X = np.array([NAN, INF, -INF, 0.0, -0.0, 1e-30, -1e-5, 0.3, -0.7, 1.0, 2.4, -2.6, 5.0, -30.0, 70.0, 1e20], np.float32)


@pytest.mark.parametrize("device", ["AMD", "NV"])
@pytest.mark.parametrize("name, call, ref", GPU_CASES, ids=[g[0] for g in GPU_CASES])
def test_emulated_gpu(device, name, call, ref):
  from test_reliability import _emulated
  _emulated(device)
  t = call(Tensor(GPU_X, device=device))
  assert t.device == device
  # the GPUs' own exp2/log2 (a few ulp): a looser bound than the CPU's
  assert_values(t, _np(ref)(GPU_X.astype(np.float64)), "float32", 64, atol=1e-30)


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_emulated_gpu_int_ops(device):
  from test_reliability import _emulated
  _emulated(device)
  a = np.array([7, -7, 7, -7, 5, -2 ** 31, 1], np.int32)
  b = np.array([2, 2, -2, -2, 0, -1, 33], np.int32)
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(ta.fmod(tb).numpy(), np.fmod(a, b))
    np.testing.assert_array_equal(ta.lshift(tb).numpy(), np.left_shift(a, b))
    np.testing.assert_array_equal(ta.rshift(tb).numpy(), np.right_shift(a, b))
  np.testing.assert_array_equal(ta.div(tb, rounding_mode="trunc").numpy(), [3, -3, -3, 3, 0, -2 ** 31, 0])
  np.testing.assert_array_equal(Tensor(GPU_X, device=device).isfinite().numpy(), np.isfinite(GPU_X))
