"""Tensor ops against numpy: creation, elementwise, movement, indexing, reductions, matmul,
einsum, softmax, conv/pool, layernorm, one_hot, PRNG and the realize/export methods.

Every case uses the default device (DEV=...), so the suite runs unchanged on every backend.
Arrays are kept small: each distinct kernel is compiled once.
"""
import math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import check, make, randf, randi, rng, round_to, bf16_round, TOLERANCES

# ----------------------------------------------------------------------------------------------
# creation
# ----------------------------------------------------------------------------------------------

PY_DATA = [
  (1.5, np.float32), (3, np.int32), (-2, np.int32), (True, np.bool_), (0.0, np.float32),
  ([1, 2, 3], np.int32), ([1.0, 2.5, -3.25], np.float32), ([True, False, True], np.bool_),
  ([[1, 2], [3, 4]], np.int32), ([[1.5], [2.5], [3.5]], np.float32), ((1, 2, 3), np.int32),
  ([[[1, 2]], [[3, 4]]], np.int32), ([1, 2.5], np.float32), ([], np.float32),
]


@pytest.mark.parametrize("data,np_dt", PY_DATA, ids=[repr(d) for d, _ in PY_DATA])
def test_create_from_python(data, np_dt):
  check(Tensor(data), np.array(data, dtype=np_dt))


@pytest.mark.parametrize("dtype_spec", [dtypes.int16, "int16", np.int16, np.dtype("int16")],
                         ids=["DType", "str", "np.type", "np.dtype"])
def test_create_with_dtype_spec(dtype_spec):
  check(Tensor([1, -2, 3], dtype=dtype_spec), np.array([1, -2, 3], dtype=np.int16))


@pytest.mark.parametrize("data,dtype,expected", [
  ([1, 2, 3], "float32", np.array([1, 2, 3], np.float32)),
  ([1.0, 2.0], "int32", np.array([1, 2], np.int32)),
  pytest.param(2.5, "float64", np.array(2.5, np.float64), marks=pytest.mark.needs_float64),
  ([0, 1, 2], "bool", np.array([False, True, True])),
  ([[1, 2]], "uint8", np.array([[1, 2]], np.uint8)),
], ids=["int->f32", "float->i32", "scalar->f64", "int->bool", "nested->u8"])
def test_create_python_with_dtype(data, dtype, expected):
  check(Tensor(data, dtype=dtype), expected)


def test_create_from_noncontiguous_numpy():
  a = np.arange(24, dtype=np.float32).reshape(4, 6)[::2, ::-3]
  check(Tensor(a), np.array(a))


def test_create_from_numpy_copies_data():
  a = np.arange(4, dtype=np.int32)
  t = Tensor(a).realize()
  a[0] = 100
  check(t, np.arange(4, dtype=np.int32))


CREATION = [
  ("zeros_args", lambda: Tensor.zeros(2, 3), np.zeros((2, 3), np.float32)),
  ("zeros_tuple", lambda: Tensor.zeros((2, 3)), np.zeros((2, 3), np.float32)),
  ("zeros_int", lambda: Tensor.zeros(4, dtype="int32"), np.zeros(4, np.int32)),
  ("zeros_0d", lambda: Tensor.zeros(()), np.zeros((), np.float32)),
  ("zeros_empty", lambda: Tensor.zeros(0, 3), np.zeros((0, 3), np.float32)),
  ("ones", lambda: Tensor.ones(3, 1, 2), np.ones((3, 1, 2), np.float32)),
  ("ones_int8", lambda: Tensor.ones((2, 2), dtype=dtypes.int8), np.ones((2, 2), np.int8)),
  ("ones_bool", lambda: Tensor.ones(3, dtype="bool"), np.ones(3, np.bool_)),
  ("full_int", lambda: Tensor.full((2, 3), 7), np.full((2, 3), 7, np.int32)),
  ("full_float", lambda: Tensor.full((4,), 2.5), np.full((4,), 2.5, np.float32)),
  ("full_bool", lambda: Tensor.full((2, 2), True), np.full((2, 2), True)),
  ("full_f16", lambda: Tensor.full((3,), 5, dtype="float16"), np.full((3,), 5, np.float16)),
  ("full_neg_i64", lambda: Tensor.full((2,), -3, dtype=dtypes.int64), np.full((2,), -3, np.int64)),
  ("full_0d", lambda: Tensor.full((), 1.25), np.array(1.25, np.float32)),
  ("arange_stop", lambda: Tensor.arange(5), np.arange(5, dtype=np.int32)),
  ("arange_start_stop", lambda: Tensor.arange(2, 8), np.arange(2, 8, dtype=np.int32)),
  ("arange_step", lambda: Tensor.arange(1, 10, 3), np.arange(1, 10, 3, dtype=np.int32)),
  ("arange_neg_step", lambda: Tensor.arange(10, 0, -3), np.arange(10, 0, -3, dtype=np.int32)),
  ("arange_neg_range", lambda: Tensor.arange(-5, 5, 2), np.arange(-5, 5, 2, dtype=np.int32)),
  ("arange_float_step", lambda: Tensor.arange(0, 1, 0.25), np.arange(0, 1, 0.25, dtype=np.float32)),
  ("arange_float_tenth", lambda: Tensor.arange(0, 1, 0.1), np.arange(0, 1, 0.1).astype(np.float32)),
  ("arange_float_start", lambda: Tensor.arange(0.5, 3), np.arange(0.5, 3).astype(np.float32)),
  ("arange_float_neg_step", lambda: Tensor.arange(3, -1.5, -0.75), np.arange(3, -1.5, -0.75).astype(np.float32)),
  ("arange_dtype", lambda: Tensor.arange(0, 5, dtype="float32"), np.arange(0, 5, dtype=np.float32)),
  ("arange_empty", lambda: Tensor.arange(5, 5), np.arange(5, 5, dtype=np.int32)),
  ("linspace", lambda: Tensor.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
  ("linspace_neg", lambda: Tensor.linspace(2, -3, 6), np.linspace(2, -3, 6).astype(np.float32)),
  ("linspace_one", lambda: Tensor.linspace(-1, 1, 1), np.linspace(-1, 1, 1).astype(np.float32)),
  ("eye", lambda: Tensor.eye(3), np.eye(3, dtype=np.float32)),
  ("eye_rect", lambda: Tensor.eye(2, 4), np.eye(2, 4, dtype=np.float32)),
]


@pytest.mark.parametrize("fn,expected", [c[1:] for c in CREATION], ids=[c[0] for c in CREATION])
def test_creation(fn, expected):
  check(fn(), expected)


@pytest.mark.parametrize("args,kwargs,shape,dtype", [
  ((2, 3), {}, (2, 3), "float32"), (((4,),), {}, (4,), "float32"),
  ((3,), {"dtype": "int32"}, (3,), "int32"), (((),), {}, (), "float32"),
], ids=["args", "tuple", "int32", "0d"])
def test_empty_shape_only(args, kwargs, shape, dtype):
  t = Tensor.empty(*args, **kwargs)
  assert t.shape == shape and t.dtype == getattr(dtypes, dtype)
  assert t.numpy().shape == shape


LIKE_SRC = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int16)
LIKES = [
  ("zeros_like", lambda t: Tensor.zeros_like(t), np.zeros_like(LIKE_SRC)),
  ("ones_like", lambda t: Tensor.ones_like(t), np.ones_like(LIKE_SRC)),
  ("full_like", lambda t: Tensor.full_like(t, 9), np.full_like(LIKE_SRC, 9)),
  ("zeros_like_method", lambda t: t.zeros_like(), np.zeros_like(LIKE_SRC)),
  ("ones_like_dtype", lambda t: Tensor.ones_like(t, dtype="float32"), np.ones(LIKE_SRC.shape, np.float32)),
  ("full_like_float", lambda t: Tensor.full_like(t.cast("float16"), 0.5), np.full(LIKE_SRC.shape, 0.5, np.float16)),
]


@pytest.mark.parametrize("fn,expected", [c[1:] for c in LIKES], ids=[c[0] for c in LIKES])
def test_like(fn, expected):
  check(fn(Tensor(LIKE_SRC)), expected)


def test_rand_like_shape_dtype():
  r = Tensor.rand_like(Tensor.zeros(3, 5))
  assert r.shape == (3, 5) and r.dtype == dtypes.float32
  v = r.numpy()
  assert v.shape == (3, 5) and ((v >= 0) & (v < 1)).all()


# ----------------------------------------------------------------------------------------------
# elementwise: unary
# ----------------------------------------------------------------------------------------------

def _erf(x):
  return np.vectorize(math.erf)(x.astype(np.float64))


def _logu(low, high):
  """log-uniform sampler for strictly positive domains"""
  return lambda shape, seed: np.exp(rng(seed).uniform(np.log(low), np.log(high), size=shape)).astype(np.float32)


def _unif(low, high):
  return lambda shape, seed: rng(seed).uniform(low, high, size=shape).astype(np.float32)


# name: (baregrad fn, numpy fn in float64, sampler, rtol, atol)
UNARY = {
  "neg": (lambda t: -t, lambda x: -x, _unif(-10, 10), 0, 0),
  "exp_small": (lambda t: t.exp(), np.exp, _unif(-5, 5), 2e-6, 0),
  "exp_wide": (lambda t: t.exp(), np.exp, _unif(-80, 80), 3e-5, 0),
  "exp2": (lambda t: t.exp2(), np.exp2, _unif(-100, 100), 2e-5, 0),
  "exp2_int_points": (lambda t: t.exp2(), np.exp2, lambda s, seed: rng(seed).integers(-20, 20, s).astype(np.float32), 1e-6, 0),
  "log": (lambda t: t.log(), np.log, _logu(1e-20, 1e20), 1e-5, 1e-6),
  "log_near1": (lambda t: t.log(), np.log, _unif(0.5, 2), 1e-5, 1e-6),
  "log2": (lambda t: t.log2(), np.log2, _logu(1e-30, 1e30), 1e-5, 1e-6),
  "sin_small": (lambda t: t.sin(), np.sin, _unif(-3.2, 3.2), 1e-5, 2e-6),
  "sin_large": (lambda t: t.sin(), np.sin, _unif(-100, 100), 1e-4, 1e-5),
  "cos_small": (lambda t: t.cos(), np.cos, _unif(-3.2, 3.2), 1e-5, 2e-6),
  "cos_large": (lambda t: t.cos(), np.cos, _unif(-100, 100), 1e-4, 1e-5),
  "tan": (lambda t: t.tan(), np.tan, _unif(-1.2, 1.2), 1e-5, 1e-5),
  "sqrt": (lambda t: t.sqrt(), np.sqrt, _unif(0, 1e4), 1e-6, 0),
  "rsqrt": (lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), _logu(1e-4, 1e4), 1e-5, 0),
  "reciprocal": (lambda t: t.reciprocal(), lambda x: 1 / x, _logu(1e-3, 1e3), 1e-6, 0),
  "trunc": (lambda t: t.trunc(), np.trunc, _unif(-10, 10), 0, 0),
  "floor": (lambda t: t.floor(), np.floor, _unif(-10, 10), 0, 0),
  "ceil": (lambda t: t.ceil(), np.ceil, _unif(-10, 10), 0, 0),
  "abs": (lambda t: t.abs(), np.abs, _unif(-10, 10), 0, 0),
  "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), _unif(-10, 10), 0, 0),
  "square": (lambda t: t.square(), np.square, _unif(-10, 10), 1e-6, 0),
  "tanh": (lambda t: t.tanh(), np.tanh, _unif(-10, 10), 1e-5, 2e-6),
  "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), _unif(-20, 20), 1e-5, 1e-7),
  "gelu": (lambda t: t.gelu(), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), _unif(-5, 5), 0, 1e-3),
  "silu": (lambda t: t.silu(), lambda x: x / (1 + np.exp(-x)), _unif(-20, 20), 1e-5, 1e-6),
  "softplus": (lambda t: t.softplus(), lambda x: np.log1p(np.exp(x)), _unif(-20, 20), 1e-5, 1e-6),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32(name):
  bg_fn, np_fn, sampler, rtol, atol = UNARY[name]
  x = sampler((4, 64), 1)
  check(bg_fn(Tensor(x)), np_fn(x.astype(np.float64)).astype(np.float32), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["neg", "exp_small", "log_near1", "sqrt", "sin_small", "sigmoid", "abs", "relu"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16", pytest.param("float64", marks=pytest.mark.needs_float64)])
def test_unary_other_floats(name, dt):
  bg_fn, np_fn, sampler, rtol, atol = UNARY[name]
  x = round_to(sampler((16,), 2), dt)
  expected = np_fn(x.astype(np.float64))
  tol_r, tol_a = TOLERANCES[dt]
  if dt == "float64":
    tol_r, tol_a = 1e-9, 1e-12
  check(bg_fn(make(x, dt)), round_to(expected, dt), rtol=tol_r, atol=tol_a, dtype=dt)


def test_unary_special_values():
  x = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, 4.0], dtype=np.float32)
  with np.errstate(all="ignore"):
    check(Tensor(x).sqrt(), np.sqrt(x))
    check(Tensor(x).exp2(), np.exp2(x))
    check(Tensor(x).reciprocal(), 1 / x)
    check(Tensor(x).log2(), np.log2(x))


def test_unary_nan_propagates():
  x = np.array([np.nan, 1.0], dtype=np.float32)
  out = (Tensor(x).exp() + Tensor(x).sqrt()).numpy()
  assert np.isnan(out[0]) and not np.isnan(out[1])


@pytest.mark.parametrize("dt", ["int8", "int32", "int64", "uint8"])
def test_unary_int_neg_abs(dt):
  x = randi((10,), -100, 100, seed=3).astype(dt) if dt != "uint8" else randi((10,), 0, 100, seed=3).astype(dt)
  check(-Tensor(x), (-x.astype(np.int64)).astype(dt))
  if dt != "uint8":
    check(Tensor(x).abs(), np.abs(x))


def test_logical_not():
  x = np.array([True, False, False, True])
  check(Tensor(x).logical_not(), np.logical_not(x))


# ----------------------------------------------------------------------------------------------
# elementwise: binary with broadcasting
# ----------------------------------------------------------------------------------------------

BROADCAST_SHAPES = [((3,), ()), ((), (2, 2)), ((3, 1), (1, 4)), ((2, 1, 3), (4, 1)),
                    ((2, 3), (2, 3)), ((1,), (5,)), ((4, 1), (3,))]

FLOAT_BINARY = {
  "add": (lambda a, b: a + b, np.add),
  "sub": (lambda a, b: a - b, np.subtract),
  "mul": (lambda a, b: a * b, np.multiply),
  "div": (lambda a, b: a / b, np.divide),
  "maximum": (lambda a, b: a.maximum(b), np.maximum),
  "minimum": (lambda a, b: a.minimum(b), np.minimum),
  "pow": (lambda a, b: a ** b, np.power),
}


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=[f"{a}x{b}" for a, b in BROADCAST_SHAPES])
@pytest.mark.parametrize("op", list(FLOAT_BINARY))
def test_binary_float32_broadcast(op, shapes):
  bg_fn, np_fn = FLOAT_BINARY[op]
  a = randf(shapes[0], 0.5, 3.0, seed=1) if op == "pow" else randf(shapes[0], seed=1)
  b = randf(shapes[1], -2, 2, seed=2)
  if op == "div":
    b = np.where(np.abs(b) < 0.1, np.float32(0.5), b).astype(np.float32)
  check(bg_fn(Tensor(a), Tensor(b)), np_fn(a.astype(np.float64), b.astype(np.float64)).astype(np.float32), rtol=2e-6)


METHODS = ["add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne"]
NP_METHODS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
              "minimum": np.minimum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
              "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}


@pytest.mark.parametrize("method", METHODS)
def test_binary_methods(method):
  a = np.array([[1.0, -2.0, 3.5], [0.0, 2.0, -1.0]], np.float32)
  b = np.array([2.0, -2.0, 0.5], np.float32)
  expected = NP_METHODS[method](a, b)
  check(getattr(Tensor(a), method)(Tensor(b)), expected.astype(np.float32) if expected.dtype != np.bool_ else expected)


INT_BINARY = {
  "add": (lambda a, b: a + b, np.add),
  "sub": (lambda a, b: a - b, np.subtract),
  "mul": (lambda a, b: a * b, np.multiply),
  "floordiv": (lambda a, b: a // b, np.floor_divide),
  "mod": (lambda a, b: a % b, np.mod),
  "maximum": (lambda a, b: a.maximum(b), np.maximum),
  "minimum": (lambda a, b: a.minimum(b), np.minimum),
  "and": (lambda a, b: a & b, np.bitwise_and),
  "or": (lambda a, b: a | b, np.bitwise_or),
  "xor": (lambda a, b: a ^ b, np.bitwise_xor),
}


@pytest.mark.parametrize("op", list(INT_BINARY))
@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "int32", "int64", "uint32"])
def test_binary_int(op, dt):
  bg_fn, np_fn = INT_BINARY[op]
  signed = not dt.startswith("u")
  a = randi((3, 1), -11 if signed else 0, 12, seed=4).astype(dt)
  b = randi((1, 4), 1, 6, seed=5).astype(dt)
  if signed:
    b = (b * np.array([1, -1, 1, -1], dtype=dt)).astype(dt)
  check(bg_fn(Tensor(a), Tensor(b)), np_fn(a, b).astype(dt))


def test_int_floordiv_mod_negative_table():
  a = np.repeat(np.arange(-7, 8, dtype=np.int32), 6)
  b = np.tile(np.array([-3, -2, -1, 1, 2, 3], dtype=np.int32), 15)
  check(Tensor(a) // Tensor(b), np.floor_divide(a, b))
  check(Tensor(a) % Tensor(b), np.mod(a, b))


@pytest.mark.parametrize("dt", ["int32", "int64", "int8"])
def test_int_floordiv_mod_scalar_negative(dt):
  a = np.arange(-9, 10).astype(dt)
  check(Tensor(a) // 4, a // np.array(4, dt))
  check(Tensor(a) % 4, a % np.array(4, dt))
  check(Tensor(a) // -4, a // np.array(-4, dt))
  check(Tensor(a) % -4, a % np.array(-4, dt))


def test_float_floordiv_mod_negative():
  a = np.array([-7.5, -3.0, -0.5, 0.5, 3.0, 7.5], np.float32)
  b = np.array([2.0, -2.0, 2.0, -2.0, 2.5, -2.5], np.float32)
  check(Tensor(a) // Tensor(b), np.floor_divide(a, b))
  check(Tensor(a) % Tensor(b), np.mod(a, b))


REFLECTED = [
  ("rsub", lambda t: 2 - t, lambda x: 2 - x),
  ("rdiv", lambda t: 1 / t, lambda x: 1 / x),
  ("radd", lambda t: 2.5 + t, lambda x: 2.5 + x),
  ("rmul", lambda t: 3 * t, lambda x: 3 * x),
  ("rpow", lambda t: 2 ** t, lambda x: 2.0 ** x),
  ("pow_int", lambda t: t ** 2, lambda x: x ** 2),
  ("pow_half", lambda t: t.abs() ** 0.5, lambda x: np.abs(x) ** 0.5),
  ("pow_neg", lambda t: t ** -1, lambda x: x ** -1.0),
  ("pow_three", lambda t: t ** 3, lambda x: x ** 3),
  ("rmax", lambda t: t.maximum(0.5), lambda x: np.maximum(x, 0.5)),
  ("rlt", lambda t: 0.5 < t, lambda x: 0.5 < x),
  ("rge", lambda t: 0.5 >= t, lambda x: 0.5 >= x),
  ("req", lambda t: t == 1.5, lambda x: x == 1.5),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in REFLECTED], ids=[c[0] for c in REFLECTED])
def test_scalar_and_reflected(fn, np_fn):
  x = np.array([[-2.0, -0.5, 1.5], [0.25, 1.0, 3.0]], np.float32)
  expected = np_fn(x.astype(np.float64))
  check(fn(Tensor(x)), expected if expected.dtype == np.bool_ else expected.astype(np.float32), rtol=2e-6)


INT_REFLECTED = [
  ("rsub", lambda t: 7 - t, lambda x: 7 - x),
  ("rfloordiv", lambda t: 7 // t, lambda x: 7 // x),
  ("rmod", lambda t: 7 % t, lambda x: 7 % x),
  ("rmod_neg", lambda t: -7 % t, lambda x: -7 % x),
  ("rmul", lambda t: 3 * t, lambda x: 3 * x),
  ("rand", lambda t: 6 & t, lambda x: 6 & x),
  ("ror", lambda t: 8 | t, lambda x: 8 | x),
  ("pow2", lambda t: t ** 2, lambda x: x ** 2),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in INT_REFLECTED], ids=[c[0] for c in INT_REFLECTED])
def test_int_scalar_and_reflected(fn, np_fn):
  x = np.array([-5, -3, -1, 1, 2, 4], np.int32)
  check(fn(Tensor(x)), np_fn(x).astype(np.int32))


def test_int_true_division_gives_float32():
  a = np.array([7, -7, 1, 0], np.int32)
  b = np.array([2, 2, 3, 5], np.int32)
  check(Tensor(a) / Tensor(b), (a / b).astype(np.float32))
  check(Tensor(a) / 2, (a / 2).astype(np.float32))


def test_pow_negative_base_integer_exponent():
  x = np.array([-2.0, -1.5, -1.0, 0.0, 2.0], np.float32)
  check(Tensor(x) ** 3, x ** 3)
  check(Tensor(x) ** 2, x ** 2)
  check(Tensor(x) ** Tensor(np.array([3.0, 2.0, 1.0, 2.0, 0.0], np.float32)),
        x ** np.array([3.0, 2.0, 1.0, 2.0, 0.0], np.float32))


def test_pow_zero_exponent_and_zero_base():
  x = np.array([0.0, 0.0, 2.0], np.float32)
  y = np.array([0.0, 2.0, 0.0], np.float32)
  check(Tensor(x) ** Tensor(y), np.power(x, y))


COMPARISONS = {"lt": (lambda a, b: a < b, np.less), "le": (lambda a, b: a <= b, np.less_equal),
               "gt": (lambda a, b: a > b, np.greater), "ge": (lambda a, b: a >= b, np.greater_equal),
               "eq": (lambda a, b: a == b, np.equal), "ne": (lambda a, b: a != b, np.not_equal)}


@pytest.mark.parametrize("op", list(COMPARISONS))
@pytest.mark.parametrize("dt", ["float32", "int32", "uint8", "float16"])
def test_comparisons(op, dt):
  bg_fn, np_fn = COMPARISONS[op]
  a = np.array([[0, 1, 2, 3], [3, 2, 1, 0], [1, 1, 2, 2]]).astype(dt)
  b = np.array([1, 1, 2, 0]).astype(dt)
  check(bg_fn(Tensor(a), Tensor(b)), np_fn(a, b))
  check(bg_fn(Tensor(a), 2), np_fn(a, np.array(2).astype(dt)))


def test_comparison_mixed_dtypes():
  a = np.array([1, 2, 3], np.int32)
  b = np.array([1.5, 2.0, 2.5], np.float32)
  check(Tensor(a) < Tensor(b), a < b)
  check(Tensor(a) == Tensor(b), a == b)


def test_comparison_bool_tensors():
  a = np.array([True, False, True, False])
  b = np.array([True, True, False, False])
  check(Tensor(a) == Tensor(b), a == b)
  check(Tensor(a) != Tensor(b), a != b)


WHERE_CASES = [
  ("tensors", (3, 4), (3, 4), (3, 4), None),
  ("broadcast", (3, 1), (1, 4), (4,), None),
  ("scalar_y", (2, 3), (2, 3), 0.0, None),
  ("scalar_x", (2, 3), 1.5, (2, 3), None),
  ("both_scalars", (2, 3), 1.0, -1.0, None),
  ("int_tensors", (5,), (5,), (5,), "int32"),
]


@pytest.mark.parametrize("cshape,xs,ys,dt", [c[1:] for c in WHERE_CASES], ids=[c[0] for c in WHERE_CASES])
def test_where(cshape, xs, ys, dt):
  cond = rng(7).random(cshape) > 0.5
  def arg(s, seed):
    if not isinstance(s, tuple):
      return s, np.float32(s)
    v = randf(s, seed=seed) if dt is None else randi(s, seed=seed)
    return Tensor(v), v
  (xb, xn), (yb, yn) = arg(xs, 1), arg(ys, 2)
  expected = np.where(cond, xn, yn).astype(dt or np.float32)
  check(Tensor(cond).where(xb, yb), expected)
  check(Tensor.where(Tensor(cond), xb, yb), expected)


def test_where_from_comparison():
  x = randf((4, 5), seed=3)
  check((Tensor(x) > 0).where(Tensor(x), Tensor(x) * 0.1), np.where(x > 0, x, x * np.float32(0.1)))


SHIFT_AMOUNTS = [0, 1, 2, 3, 4, 5]
SHIFTS = [
  ("shl", lambda t, dt: t << 3, lambda x: x << 3),
  ("shr", lambda t, dt: t >> 2, lambda x: x >> 2),
  ("shl_tensor", lambda t, dt: t << Tensor(np.array(SHIFT_AMOUNTS, dt)), lambda x: x << np.array(SHIFT_AMOUNTS, x.dtype)),
  ("shr_tensor", lambda t, dt: t >> Tensor(np.array(SHIFT_AMOUNTS, dt)), lambda x: x >> np.array(SHIFT_AMOUNTS, x.dtype)),
  ("invert", lambda t, dt: ~t, lambda x: ~x),
  ("xor_scalar", lambda t, dt: t ^ 5, lambda x: x ^ 5),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in SHIFTS], ids=[c[0] for c in SHIFTS])
@pytest.mark.parametrize("dt", ["int32", "uint8", "uint32", "int64", "int8"])
def test_shifts_bitwise(fn, np_fn, dt):
  x = np.array([0, 1, 5, 12, 100, 7]).astype(dt)
  check(fn(Tensor(x), dt), np_fn(x).astype(dt))


def test_shift_right_negative_is_arithmetic():
  x = np.array([-16, -5, -1, 3], np.int32)
  check(Tensor(x) >> 1, x >> 1)


def test_bitwise_bool():
  a = np.array([True, False, True, False])
  b = np.array([True, True, False, False])
  check(Tensor(a) & Tensor(b), a & b)
  check(Tensor(a) | Tensor(b), a | b)
  check(Tensor(a) ^ Tensor(b), a ^ b)
  check(~Tensor(a), ~a)


# ----------------------------------------------------------------------------------------------
# movement and views
# ----------------------------------------------------------------------------------------------

A234 = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10

MOVEMENT = [
  ("reshape_args", lambda t: t.reshape(6, 4), lambda a: a.reshape(6, 4)),
  ("reshape_tuple", lambda t: t.reshape((4, 6)), lambda a: a.reshape(4, 6)),
  ("reshape_infer", lambda t: t.reshape(-1, 2), lambda a: a.reshape(-1, 2)),
  ("reshape_flat", lambda t: t.reshape(-1), lambda a: a.reshape(-1)),
  ("reshape_unit_dims", lambda t: t.reshape(1, 2, 1, 12, 1), lambda a: a.reshape(1, 2, 1, 12, 1)),
  ("permute", lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
  ("permute_tuple", lambda t: t.permute((1, 2, 0)), lambda a: a.transpose(1, 2, 0)),
  ("permute_neg", lambda t: t.permute(-1, -3, -2), lambda a: a.transpose(2, 0, 1)),
  ("transpose", lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
  ("transpose_neg", lambda t: t.transpose(-1, -2), lambda a: a.swapaxes(-1, -2)),
  ("T_2d", lambda t: t.reshape(6, 4).T, lambda a: a.reshape(6, 4).T),
  ("expand", lambda t: t[:, :1, :].expand(2, 5, 4), lambda a: np.broadcast_to(a[:, :1, :], (2, 5, 4))),
  ("expand_keep", lambda t: t[:, :, :1].expand(-1, -1, 3), lambda a: np.broadcast_to(a[:, :, :1], (2, 3, 3))),
  ("expand_new_dims", lambda t: t[0, 0].expand(3, 2, 4), lambda a: np.broadcast_to(a[0, 0], (3, 2, 4))),
  ("squeeze_all", lambda t: t.reshape(1, 2, 1, 12).squeeze(), lambda a: a.reshape(2, 12)),
  ("squeeze_dim", lambda t: t.reshape(1, 2, 1, 12).squeeze(2), lambda a: a.reshape(1, 2, 12)),
  ("squeeze_neg", lambda t: t.reshape(2, 12, 1).squeeze(-1), lambda a: a.reshape(2, 12)),
  ("squeeze_noop", lambda t: t.squeeze(0), lambda a: a),
  ("unsqueeze0", lambda t: t.unsqueeze(0), lambda a: a[None]),
  ("unsqueeze_mid", lambda t: t.unsqueeze(2), lambda a: a[:, :, None]),
  ("unsqueeze_neg", lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
  ("flatten", lambda t: t.flatten(), lambda a: a.reshape(-1)),
  ("flatten_start", lambda t: t.flatten(1), lambda a: a.reshape(2, 12)),
  ("flatten_range", lambda t: t.flatten(0, 1), lambda a: a.reshape(6, 4)),
  ("pad", lambda t: t.pad(((1, 0), (0, 2), (1, 1))), lambda a: np.pad(a, ((1, 0), (0, 2), (1, 1)))),
  ("pad_value", lambda t: t.pad(((0, 0), (1, 1), (2, 0)), value=-1.5), lambda a: np.pad(a, ((0, 0), (1, 1), (2, 0)), constant_values=-1.5)),
  ("pad_none", lambda t: t.pad((None, (2, 1), None)), lambda a: np.pad(a, ((0, 0), (2, 1), (0, 0)))),
  ("shrink", lambda t: t.shrink(((1, 2), (0, 2), (1, 4))), lambda a: a[1:2, 0:2, 1:4]),
  ("shrink_none", lambda t: t.shrink((None, (1, 3), None)), lambda a: a[:, 1:3, :]),
  ("flip0", lambda t: t.flip(0), lambda a: a[::-1]),
  ("flip_multi", lambda t: t.flip(0, 2), lambda a: a[::-1, :, ::-1]),
  ("flip_neg", lambda t: t.flip(-2), lambda a: a[:, ::-1]),
  ("repeat", lambda t: t.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3))),
  ("repeat_new_dim", lambda t: t[0].repeat(2, 2, 1), lambda a: np.tile(a[0], (2, 2, 1))),
  ("pad_then_shrink", lambda t: t.pad(((1, 1), (1, 1), (1, 1))).shrink(((1, 3), (1, 4), (1, 5))), lambda a: a),
  ("permute_reshape", lambda t: t.permute(1, 0, 2).reshape(3, 8), lambda a: a.transpose(1, 0, 2).reshape(3, 8)),
  ("flip_permute_pad", lambda t: t.flip(1).permute(2, 1, 0).pad(((0, 1), None, None)),
   lambda a: np.pad(a[:, ::-1].transpose(2, 1, 0), ((0, 1), (0, 0), (0, 0)))),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in MOVEMENT], ids=[c[0] for c in MOVEMENT])
def test_movement(fn, np_fn):
  check(fn(Tensor(A234)), np.array(np_fn(A234)))


@pytest.mark.parametrize("dt", ["int8", "bool", "float16", "int64"])
def test_movement_other_dtypes(dt):
  a = (np.arange(12).reshape(3, 4) % 5).astype(dt)
  t = Tensor(a)
  check(t.permute(1, 0).flip(0), a.T[::-1])
  check(t.pad(((1, 0), (0, 1))), np.pad(a, ((1, 0), (0, 1))))


CAT_CASES = [
  ("dim0", [(2, 3), (1, 3), (3, 3)], 0),
  ("dim1", [(2, 3), (2, 1)], 1),
  ("dim_neg", [(2, 2, 1), (2, 2, 3)], -1),
  ("single", [(2, 3)], 0),
  ("with_empty", [(2, 3), (0, 3), (1, 3)], 0),
]


@pytest.mark.parametrize("shapes,dim", [c[1:] for c in CAT_CASES], ids=[c[0] for c in CAT_CASES])
def test_cat(shapes, dim):
  arrays = [randf(s, seed=i) for i, s in enumerate(shapes)]
  tensors = [Tensor(a) for a in arrays]
  check(tensors[0].cat(*tensors[1:], dim=dim), np.concatenate(arrays, axis=dim))


def test_cat_classmethod_form():
  a, b = randf((2, 2), seed=1), randf((1, 2), seed=2)
  check(Tensor.cat(Tensor(a), Tensor(b), dim=0), np.concatenate([a, b]))


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_stack(dim):
  arrays = [randf((2, 3), seed=i) for i in range(3)]
  tensors = [Tensor(a) for a in arrays]
  check(tensors[0].stack(*tensors[1:], dim=dim), np.stack(arrays, axis=dim))


@pytest.mark.parametrize("sizes,dim", [(2, 0), (3, 1), ([1, 4], 1), ([2, 1, 2], 1), (4, -1)],
                         ids=["int_dim0", "int_uneven", "list", "list3", "neg_dim"])
def test_split(sizes, dim):
  a = randf((4, 5), seed=1)
  parts = Tensor(a).split(sizes, dim)
  if isinstance(sizes, int):
    n = a.shape[dim]
    idx = list(range(sizes, n, sizes))
  else:
    idx = list(np.cumsum(sizes)[:-1])
  expected = np.split(a, idx, axis=dim)
  assert len(parts) == len(expected)
  for p, e in zip(parts, expected):
    check(p, e)


@pytest.mark.parametrize("chunks,dim", [(2, 0), (3, 1), (2, -1), (7, 1)], ids=["even", "uneven", "neg", "more_than_size"])
def test_chunk(chunks, dim):
  a = randf((4, 5), seed=1)
  parts = Tensor(a).chunk(chunks, dim)
  n = a.shape[dim]
  step = -(-n // chunks)
  expected = [np.take(a, range(s, min(s + step, n)), axis=dim) for s in range(0, n, step)]
  assert len(parts) == len(expected)
  for p, e in zip(parts, expected):
    check(p, e)


# ----------------------------------------------------------------------------------------------
# getitem / setitem
# ----------------------------------------------------------------------------------------------

class Idx:
  """an integer index tensor, built inside the test (not at collection time)"""
  def __init__(self, values):
    self.values = np.array(values, dtype=np.int32)

  def __repr__(self):
    return f"T{self.values.tolist()}"


def _to_bg(idx):
  if isinstance(idx, Idx):
    return Tensor(idx.values)
  if isinstance(idx, tuple):
    return tuple(_to_bg(i) for i in idx)
  return idx


def _to_np(idx):
  if isinstance(idx, Idx):
    return idx.values
  if isinstance(idx, tuple):
    return tuple(_to_np(i) for i in idx)
  return idx


GETITEM = [
  1, -1, (1, 2), (-1, -2, -3), (0, 1, 3), slice(None), slice(1, None), slice(None, None, 2),
  slice(None, None, -1), slice(2, 0, -1),
  (slice(None), slice(0, 3, 2)), (slice(None), slice(None, None, -2)), (slice(None), slice(1, 3), slice(3, 0, -2)),
  (Ellipsis, 1), (Ellipsis, slice(None, None, 3)), (None, 0), (0, None, slice(1, 3)), (slice(None), None, -1),
  (1, Ellipsis, slice(None, None, -2)), (slice(-2, None), slice(None, None, -2)), (None, Ellipsis, None),
  (slice(2, 2),), (slice(0, 100),), (slice(-100, 100), slice(-2, 100)), (0, slice(5, 1)),
  Idx([0, 1, 1]), Idx([[0, 1], [1, 0]]), (slice(None), Idx([2, 0])), (Idx([1, 0]), Idx([2, 1])),
  (0, Idx([2, 0, 1])), (Ellipsis, Idx([3, 0])), (Idx([1, 0, 1]), slice(None), Idx([0, 3, 2])),
  (slice(None, None, -1), Idx([1, 1]), slice(1, 3)), Idx([-1, 0]),
]


@pytest.mark.parametrize("idx", GETITEM, ids=[repr(i) for i in GETITEM])
def test_getitem(idx):
  check(Tensor(A234)[_to_bg(idx)], np.array(A234[_to_np(idx)]))


def test_getitem_on_computed_tensor():
  a = randf((4, 6), seed=2)
  check((Tensor(a) * 2 + 1)[1::2, ::-2], (a * 2 + 1)[1::2, ::-2])


def test_getitem_chained():
  check(Tensor(A234)[1][::-1][:, 2], A234[1][::-1][:, 2])


def test_getitem_gather_1d_int64_index():
  a = np.arange(10, dtype=np.float32) * 1.5
  idx = np.array([9, 0, 4, 4], np.int64)
  check(Tensor(a)[Tensor(idx)], a[idx])


SETITEM = [
  ("int_scalar", 1, 5.0),
  ("neg_int", -1, -2.0),
  ("slice_row", (0, slice(1, 3)), "tensor"),
  ("column", (slice(None), 0), 2.5),
  ("ellipsis_last", (Ellipsis, -1), "tensor"),
  ("stepped", (slice(None, None, 2), slice(None, None, 2)), 9.0),
]


@pytest.mark.parametrize("idx,value", [c[1:] for c in SETITEM], ids=[c[0] for c in SETITEM])
def test_setitem_realized(idx, value):
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(a.copy()).realize()
  expected = a.copy()
  if value == "tensor":
    v = randf(expected[idx].shape, seed=3)
    t[idx] = Tensor(v)
    expected[idx] = v
  else:
    t[idx] = value
    expected[idx] = value
  check(t, expected)


def test_setitem_index_tensor():
  a = np.arange(6, dtype=np.float32)
  t = Tensor(a.copy()).realize()
  t[Tensor(np.array([0, 4], np.int32))] = -1.0
  a[[0, 4]] = -1.0
  check(t, a)


@pytest.mark.parametrize("dt", ["int32", "uint8", "bool", "float16"])
def test_setitem_other_dtypes(dt):
  a = (np.arange(8) % 3).astype(dt).reshape(2, 4)
  t = Tensor(a.copy()).realize()
  t[1, 1:3] = 1
  a[1, 1:3] = 1
  check(t, a)


def test_setitem_then_read_twice():
  t = Tensor(np.zeros((2, 2), np.float32)).realize()
  t[0, 0] = 1.0
  t[1, 1] = 2.0
  check(t + 0, np.array([[1.0, 0.0], [0.0, 2.0]], np.float32))


def test_assign():
  t = Tensor.zeros(2, 3).contiguous().realize()
  v = randf((2, 3), seed=1)
  t.assign(Tensor(v)).realize()
  check(t, v)


def test_assign_then_use_in_graph():
  t = Tensor(np.ones((3,), np.float32)).realize()
  t.assign(t + 1).realize()
  check(t * 2, np.full((3,), 4, np.float32))


NONCONTIG = [
  ("permute_sum", lambda t: (t.permute(1, 0, 2) * 2 + 1).sum(0), lambda a: (a.transpose(1, 0, 2) * 2 + 1).sum(0)),
  ("flip_exp_max", lambda t: t.flip(1).exp().max(1), lambda a: np.exp(a[:, ::-1]).max(1)),
  ("stepped_slice_sum", lambda t: t[::2, ::-1].sum(1), lambda a: a[::2, ::-1].sum(1)),
  ("permute_slice_mean", lambda t: (t.permute(2, 0, 1)[1:, ::-2] - 1).mean(), lambda a: (a.transpose(2, 0, 1)[1:, ::-2] - 1).mean()),
  ("transpose_add_transpose", lambda t: (t.transpose(0, 2) + t.transpose(0, 2).flip(0)).sum((0, 2)),
   lambda a: (a.swapaxes(0, 2) + a.swapaxes(0, 2)[::-1]).sum((0, 2))),
  ("expand_mul_sum", lambda t: (t[:, :1] * t).sum(-1), lambda a: (a[:, :1] * a).sum(-1)),
  ("pad_flip_prod", lambda t: (t[0] / 10).pad(((1, 1), None), value=1.0).flip(0).prod(0),
   lambda a: np.pad(a[0] / 10, ((1, 1), (0, 0)), constant_values=1.0)[::-1].prod(0)),
  ("strided_min", lambda t: t[:, ::2, 1::2].min((1, 2)), lambda a: a[:, ::2, 1::2].min((1, 2))),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in NONCONTIG], ids=[c[0] for c in NONCONTIG])
def test_ops_on_noncontiguous_views(fn, np_fn):
  a = randf((4, 3, 4), seed=9)
  check(fn(Tensor(a)), np.asarray(np_fn(a.astype(np.float64))).astype(np.float32), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# reductions
# ----------------------------------------------------------------------------------------------

def _np_logsumexp(x, axis, keepdims):
  m = np.max(x, axis=axis, keepdims=True)
  out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
  return out if keepdims else np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


REDUCE = {
  "sum": (lambda t, ax, kd: t.sum(ax, keepdim=kd), lambda a, ax, kd: a.sum(ax, keepdims=kd)),
  "prod": (lambda t, ax, kd: t.prod(ax, keepdim=kd), lambda a, ax, kd: a.prod(ax, keepdims=kd)),
  "max": (lambda t, ax, kd: t.max(ax, keepdim=kd), lambda a, ax, kd: a.max(ax, keepdims=kd)),
  "min": (lambda t, ax, kd: t.min(ax, keepdim=kd), lambda a, ax, kd: a.min(ax, keepdims=kd)),
  "mean": (lambda t, ax, kd: t.mean(ax, keepdim=kd), lambda a, ax, kd: a.mean(ax, keepdims=kd)),
  "var": (lambda t, ax, kd: t.var(ax, keepdim=kd), lambda a, ax, kd: a.var(ax, keepdims=kd, ddof=1)),
  "std": (lambda t, ax, kd: t.std(ax, keepdim=kd), lambda a, ax, kd: a.std(ax, keepdims=kd, ddof=1)),
  "logsumexp": (lambda t, ax, kd: t.logsumexp(ax, keepdim=kd), _np_logsumexp),
  "any": (lambda t, ax, kd: (t > 1).any(ax, keepdim=kd), lambda a, ax, kd: (a > 1).any(ax, keepdims=kd)),
  "all": (lambda t, ax, kd: (t > -1.5).all(ax, keepdim=kd), lambda a, ax, kd: (a > -1.5).all(ax, keepdims=kd)),
}
AXES = [None, 1, -1, (0, 2)]


@pytest.mark.parametrize("keepdim", [False, True], ids=["nokeep", "keep"])
@pytest.mark.parametrize("axis", AXES, ids=[repr(a) for a in AXES])
@pytest.mark.parametrize("op", list(REDUCE))
def test_reduce_float32(op, axis, keepdim):
  bg_fn, np_fn = REDUCE[op]
  a = randf((2, 3, 4), -2, 2, seed=11)
  expected = np.asarray(np_fn(a.astype(np.float64), axis, keepdim))
  expected = expected if expected.dtype == np.bool_ else expected.astype(np.float32)
  check(bg_fn(Tensor(a), axis, keepdim), expected, rtol=2e-5, atol=1e-5)


def test_reduce_tuple_negative_axes():
  a = randf((2, 3, 4), seed=12)
  check(Tensor(a).sum((-1, 0)), a.sum((-1, 0)), rtol=1e-5, atol=1e-6)
  check(Tensor(a).max(axis=-2, keepdim=True), a.max(-2, keepdims=True))


def test_var_std_correction0():
  a = randf((3, 5), seed=13)
  check(Tensor(a).var(1, correction=0), a.astype(np.float64).var(1).astype(np.float32), rtol=1e-5, atol=1e-6)
  check(Tensor(a).std(correction=0), np.float32(a.astype(np.float64).std()), rtol=1e-5, atol=1e-6)


ARG = [(None, False), (0, False), (-1, False), (1, True)]


@pytest.mark.parametrize("axis,keepdim", ARG, ids=[f"{a}-{k}" for a, k in ARG])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(op, axis, keepdim):
  a = randi((3, 4, 5), -5, 5, seed=14).astype(np.float32)  # many ties: first index wins
  np_out = getattr(np, op)(a, axis=axis, keepdims=keepdim)
  t = getattr(Tensor(a), op)(axis, keepdim=keepdim)
  assert t.dtype in (dtypes.int32, dtypes.int64), f"{op} dtype {t.dtype}"
  check(t, np_out.astype(t.dtype.name))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(axis):
  a = randf((3, 4, 5), seed=15)
  check(Tensor(a).cumsum(axis), np.cumsum(a.astype(np.float64), axis=axis).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_cumsum_int():
  a = randi((7,), -5, 5, seed=16)
  check(Tensor(a).cumsum(0), np.cumsum(a))   # numpy: int32 -> int64


INT_REDUCE = [
  ("sum_int32", "int32", lambda t: t.sum(1), lambda a: a.sum(1)),   # numpy's dtypes: int64 (signed), uint64
  ("sum_int8", "int8", lambda t: t.sum(0), lambda a: a.sum(0)),
  ("sum_uint8", "uint8", lambda t: t.sum(), lambda a: np.array(a.sum())),
  ("sum_int64", "int64", lambda t: t.sum(), lambda a: np.array(a.sum(), np.int64)),
  ("prod_int32", "int32", lambda t: t.prod(0), lambda a: a.prod(0)),
  ("max_int8", "int8", lambda t: t.max(1), lambda a: a.max(1)),
  ("min_uint32", "uint32", lambda t: t.min(0), lambda a: a.min(0)),
  ("max_int64", "int64", lambda t: t.max(), lambda a: np.array(a.max())),
  ("mean_int32", "int32", lambda t: t.mean(1), lambda a: a.mean(1)),
  ("sum_bool", "bool", lambda t: t.sum(1), lambda a: a.sum(1)),
  ("prod_bool", "bool", lambda t: t.prod(0), lambda a: a.prod(0)),
  ("max_bool", "bool", lambda t: t.max(1), lambda a: a.max(1)),
  ("sum_float16", "float16", lambda t: t.sum(1), lambda a: a.astype(np.float32).sum(1).astype(np.float16)),
  ("mean_float16", "float16", lambda t: t.mean(), lambda a: np.array(a.astype(np.float32).mean(), np.float16)),
  ("sum_float64", "float64", lambda t: t.sum(0), lambda a: a.sum(0)),
]


# numpy's mean of ints is float64; on a device without float64 it is float32 (tests/metal/test_metal_dtypes.py)
FLOAT64_REDUCE = ("mean_int32", "sum_float64")


@pytest.mark.parametrize("dt,fn,np_fn", [pytest.param(*c[1:], id=c[0], marks=[pytest.mark.needs_float64] *
                                                      (c[0] in FLOAT64_REDUCE)) for c in INT_REDUCE])
def test_reduce_dtypes(dt, fn, np_fn):
  if dt == "bool":
    a = rng(17).random((3, 4)) > 0.4
  elif dt.startswith("float"):
    a = randf((3, 4), seed=17).astype(dt)
  else:
    a = randi((3, 4), 0 if dt.startswith("u") else -3, 4, seed=17).astype(dt)
  check(fn(Tensor(a)), np_fn(a))


EDGE_REDUCE = [
  ("0d_sum", (), lambda t: t.sum(), lambda a: a.sum()),
  ("0d_max", (), lambda t: t.max(), lambda a: a.max()),
  ("0d_mean", (), lambda t: t.mean(), lambda a: a.mean()),
  ("0d_prod", (), lambda t: t.prod(), lambda a: a.prod()),
  ("1elem_sum", (1,), lambda t: t.sum(), lambda a: a.sum()),
  ("1elem_max_keep", (1,), lambda t: t.max(0, keepdim=True), lambda a: a.max(0, keepdims=True)),
  ("1elem_min", (1, 1), lambda t: t.min(), lambda a: a.min()),
  ("1elem_mean_axis", (1, 1), lambda t: t.mean(1), lambda a: a.mean(1)),
  ("1elem_prod", (1,), lambda t: t.prod(0), lambda a: a.prod(0)),
  ("empty_sum", (0,), lambda t: t.sum(), lambda a: a.sum()),
  ("empty_prod", (0,), lambda t: t.prod(), lambda a: a.prod()),
  ("empty_sum_axis0", (0, 3), lambda t: t.sum(0), lambda a: a.sum(0)),
  ("empty_sum_axis1", (0, 3), lambda t: t.sum(1), lambda a: a.sum(1)),
  ("empty_prod_axis1", (2, 0), lambda t: t.prod(1), lambda a: a.prod(1)),
  ("empty_sum_keep", (2, 0), lambda t: t.sum(1, keepdim=True), lambda a: a.sum(1, keepdims=True)),
  ("empty_any", (0,), lambda t: (t > 0).any(), lambda a: (a > 0).any()),
  ("empty_all", (0,), lambda t: (t > 0).all(), lambda a: (a > 0).all()),
]


@pytest.mark.parametrize("shape,fn,np_fn", [c[1:] for c in EDGE_REDUCE], ids=[c[0] for c in EDGE_REDUCE])
def test_reduce_edge_shapes(shape, fn, np_fn):
  a = randf(shape, 0.5, 2, seed=18)
  expected = np.asarray(np_fn(a))
  check(fn(Tensor(a)), expected if expected.dtype == np.bool_ else expected.astype(np.float32))


# ----------------------------------------------------------------------------------------------
# 0-d and zero-size tensors through elementwise and movement
# ----------------------------------------------------------------------------------------------

ZERO_D = [
  ("add_scalar", lambda t: t + 1, lambda a: a + 1),
  ("mul_tensor", lambda t: t * Tensor(np.array(3, np.float32)), lambda a: a * 3),
  ("exp", lambda t: t.exp(), np.exp),
  ("broadcast_to_vec", lambda t: t + Tensor(np.arange(3, dtype=np.float32)), lambda a: a + np.arange(3, dtype=np.float32)),
  ("reshape_1", lambda t: t.reshape(1, 1), lambda a: a.reshape(1, 1)),
  ("reshape_back", lambda t: t.reshape(1).reshape(()), lambda a: a),
  ("expand", lambda t: t.expand(2, 3), lambda a: np.broadcast_to(a, (2, 3))),
  ("unsqueeze", lambda t: t.unsqueeze(0), lambda a: a[None]),
  ("cmp", lambda t: t > 1, lambda a: a > 1),
  ("where", lambda t: (t > 1).where(t, -t), lambda a: np.where(a > 1, a, -a)),
  ("getitem_none", lambda t: t[None], lambda a: a[None]),
  ("getitem_ellipsis", lambda t: t[...], lambda a: a[...]),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in ZERO_D], ids=[c[0] for c in ZERO_D])
def test_zero_d(fn, np_fn):
  a = np.array(1.75, dtype=np.float32)
  expected = np.asarray(np_fn(a))
  check(fn(Tensor(a)), np.array(expected if expected.dtype == np.bool_ else expected.astype(np.float32)))


ZERO_SIZE = [
  ("add", lambda t: t + 1, lambda a: a + 1),
  ("binary_broadcast", lambda t: t * Tensor(np.ones((1, 3), np.float32)), lambda a: a * np.ones((1, 3), np.float32)),
  ("exp", lambda t: t.exp(), np.exp),
  ("cmp", lambda t: t < 0, lambda a: a < 0),
  ("reshape", lambda t: t.reshape(3, 0), lambda a: a.reshape(3, 0)),
  ("permute", lambda t: t.permute(1, 0), lambda a: a.T),
  ("pad", lambda t: t.pad(((1, 1), None)), lambda a: np.pad(a, ((1, 1), (0, 0)))),
  ("flip", lambda t: t.flip(0), lambda a: a[::-1]),
  ("expand", lambda t: t.reshape(1, 0, 3).expand(2, 0, 3), lambda a: np.broadcast_to(a.reshape(1, 0, 3), (2, 0, 3))),
  ("cat_with_nonempty", lambda t: t.cat(Tensor(np.ones((2, 3), np.float32)), dim=0), lambda a: np.concatenate([a, np.ones((2, 3), np.float32)])),
  ("slice_to_empty", lambda t: t.pad(((2, 0), None))[1:1], lambda a: np.pad(a, ((2, 0), (0, 0)))[1:1]),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in ZERO_SIZE], ids=[c[0] for c in ZERO_SIZE])
def test_zero_size(fn, np_fn):
  a = np.zeros((0, 3), np.float32)
  expected = np.asarray(np_fn(a))
  check(fn(Tensor(a)), np.array(expected if expected.dtype == np.bool_ else expected.astype(np.float32)))


# ----------------------------------------------------------------------------------------------
# matmul, einsum
# ----------------------------------------------------------------------------------------------

MATMUL = [
  ("2d", (3, 4), (4, 5)),
  ("vec_vec", (4,), (4,)),
  ("vec_mat", (4,), (4, 3)),
  ("mat_vec", (3, 4), (4,)),
  ("batch_broadcast", (2, 1, 3, 4), (5, 4, 2)),
  ("batch_2d", (2, 3, 4), (4, 2)),
  ("batch_same", (3, 2, 5), (3, 5, 2)),
  ("k1", (3, 1), (1, 4)),
  ("outputs_1x1", (1, 7), (7, 1)),
]


@pytest.mark.parametrize("sa,sb", [c[1:] for c in MATMUL], ids=[c[0] for c in MATMUL])
def test_matmul(sa, sb):
  a, b = randf(sa, seed=1), randf(sb, seed=2)
  expected = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
  check(Tensor(a) @ Tensor(b), expected, rtol=1e-5, atol=1e-5)
  check(Tensor(a).matmul(Tensor(b)), expected, rtol=1e-5, atol=1e-5)


def test_dot():
  a, b = randf((5,), seed=1), randf((5,), seed=2)
  check(Tensor(a).dot(Tensor(b)), np.float32(np.dot(a.astype(np.float64), b)), rtol=1e-5, atol=1e-5)
  a, b = randf((2, 5), seed=3), randf((5, 3), seed=4)
  check(Tensor(a).dot(Tensor(b)), (a.astype(np.float64) @ b).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_matmul_transposed_inputs():
  a, b = randf((4, 3), seed=1), randf((5, 4), seed=2)
  check(Tensor(a).T @ Tensor(b).T, (a.T.astype(np.float64) @ b.T).astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", ["int32", "float16", pytest.param("float64", marks=pytest.mark.needs_float64)])
def test_matmul_dtypes(dt):
  if dt == "int32":
    a, b = randi((3, 4), -5, 5, seed=1), randi((4, 2), -5, 5, seed=2)
    check(Tensor(a) @ Tensor(b), a @ b)
  else:
    a, b = randf((3, 4), seed=1).astype(dt), randf((4, 2), seed=2).astype(dt)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(dt)
    check(Tensor(a) @ Tensor(b), expected, rtol=1e-2 if dt == "float16" else 1e-10, atol=1e-2 if dt == "float16" else 1e-12)


def test_matmul_larger():
  a, b = randf((17, 33), seed=1), randf((33, 9), seed=2)
  check(Tensor(a) @ Tensor(b), (a.astype(np.float64) @ b).astype(np.float32), rtol=1e-5, atol=1e-5)


EINSUM = [
  ("ij,jk->ik", [(3, 4), (4, 2)]),
  ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
  ("ii->i", [(4, 4)]),
  ("ij->ji", [(3, 5)]),
  ("i,j->ij", [(3,), (4,)]),
  ("ij,jk", [(3, 4), (4, 2)]),
  ("ij->", [(3, 4)]),
  ("ij->j", [(3, 4)]),
  ("i,i->", [(5,), (5,)]),
  ("ij,ij->ij", [(2, 3), (2, 3)]),
  ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
  ("ba", [(2, 3)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(formula, shapes):
  arrays = [randf(s, seed=i) for i, s in enumerate(shapes)]
  expected = np.einsum(formula, *[a.astype(np.float64) for a in arrays]).astype(np.float32)
  check(Tensor.einsum(formula, *[Tensor(a) for a in arrays]), np.array(expected), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# softmax, layernorm, one_hot
# ----------------------------------------------------------------------------------------------

def _np_softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("scale", [1.0, 100.0], ids=["normal", "large"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax(op, axis, scale):
  a = randf((3, 4, 5), seed=20) * np.float32(scale)
  x = a.astype(np.float64)
  expected = _np_softmax(x, axis) if op == "softmax" else np.log(_np_softmax(x, axis))
  check(getattr(Tensor(a), op)(axis), expected.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_softmax_default_axis_is_last():
  a = randf((2, 6), seed=21)
  check(Tensor(a).softmax(), _np_softmax(a.astype(np.float64), -1).astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, (-2, -1)], ids=["last", "last2"])
def test_layernorm(axis):
  a = randf((2, 3, 8), seed=22) * 3 + 1
  x = a.astype(np.float64)
  mean = x.mean(axis=axis, keepdims=True)
  var = x.var(axis=axis, keepdims=True)
  expected = (x - mean) / np.sqrt(var + 1e-5)
  check(Tensor(a).layernorm(axis), expected.astype(np.float32), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,n", [((4,), 5), ((2, 3), 4)], ids=["1d", "2d"])
def test_one_hot(shape, n):
  idx = randi(shape, 0, n, seed=23)
  t = Tensor(idx).one_hot(n)
  expected = np.eye(n, dtype=np.int64)[idx]
  assert t.dtype in (dtypes.int32, dtypes.int64), f"one_hot dtype {t.dtype}"
  check(t, expected.astype(t.dtype.name))


# ----------------------------------------------------------------------------------------------
# conv2d and pooling against a naive numpy implementation
# ----------------------------------------------------------------------------------------------

def _pair(v):
  return (v, v) if isinstance(v, int) else tuple(v)


def naive_conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
  """direct loops over output pixels; x (N,C,H,W), w (O,C/groups,KH,KW)"""
  sh, sw = _pair(stride)
  ph, pw = _pair(padding)
  dh, dw = _pair(dilation)
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=np.float64)
  xp[:, :, ph:ph + h, pw:pw + wd] = x
  oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
  ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros((n, o, oh, ow), dtype=np.float64)
  opg = o // groups
  for oc in range(o):
    g = oc // opg
    for i in range(oh):
      for j in range(ow):
        for ci in range(cg):
          for a in range(kh):
            for b in range(kw):
              out[:, oc, i, j] += xp[:, g * cg + ci, i * sh + a * dh, j * sw + b * dw] * w[oc, ci, a, b]
  if bias is not None:
    out += bias.reshape(1, -1, 1, 1)
  return out


CONV = [
  ("basic", (1, 2, 5, 5), (3, 2, 3, 3), {}),
  ("stride2", (2, 2, 7, 6), (2, 2, 3, 3), {"stride": 2}),
  ("padding1", (1, 3, 4, 4), (2, 3, 3, 3), {"padding": 1}),
  ("dilation2", (1, 1, 7, 7), (2, 1, 3, 3), {"dilation": 2}),
  ("groups2", (1, 4, 5, 5), (6, 2, 3, 3), {"groups": 2}),
  ("depthwise", (1, 3, 4, 4), (3, 1, 2, 2), {"groups": 3}),
  ("bias", (2, 2, 4, 4), (3, 2, 3, 3), {"bias": True}),
  ("kernel1x1", (1, 4, 3, 3), (2, 4, 1, 1), {}),
  ("rect_kernel_tuple_args", (1, 2, 6, 7), (2, 2, 2, 3), {"stride": (1, 2), "padding": (1, 0)}),
  ("everything", (2, 4, 8, 8), (4, 2, 3, 3), {"stride": 2, "padding": 2, "dilation": 2, "groups": 2, "bias": True}),
]


@pytest.mark.parametrize("xs,ws,kw", [c[1:] for c in CONV], ids=[c[0] for c in CONV])
def test_conv2d(xs, ws, kw):
  kw = dict(kw)
  x, w = randf(xs, seed=1), randf(ws, seed=2)
  bias = randf((ws[0],), seed=3) if kw.pop("bias", False) else None
  expected = naive_conv2d(x.astype(np.float64), w.astype(np.float64), bias, **kw).astype(np.float32)
  out = Tensor(x).conv2d(Tensor(w), bias=None if bias is None else Tensor(bias), **kw)
  check(out, expected, rtol=1e-4, atol=1e-4)


def naive_pool(x, k, stride, reduce):
  kh, kw = _pair(k)
  sh, sw = _pair(stride)
  n, c, h, w = x.shape
  oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
  out = np.zeros((n, c, oh, ow), dtype=np.float64)
  for i in range(oh):
    for j in range(ow):
      out[:, :, i, j] = reduce(x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw], axis=(2, 3))
  return out


POOL = [("k2", 2, None), ("k2s1", 2, 1), ("k3s2", 3, 2), ("rect", (2, 3), (2, 1))]


@pytest.mark.parametrize("k,stride", [c[1:] for c in POOL], ids=[c[0] for c in POOL])
@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_pool2d(op, k, stride):
  x = randf((2, 3, 7, 6), seed=4)
  reduce = np.max if op == "max_pool2d" else np.mean
  expected = naive_pool(x.astype(np.float64), k, stride if stride is not None else k, reduce).astype(np.float32)
  kwargs = {"kernel_size": k} if stride is None else {"kernel_size": k, "stride": stride}
  check(getattr(Tensor(x), op)(**kwargs), expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# PRNG
# ----------------------------------------------------------------------------------------------

def test_rand_reproducible_with_seed():
  Tensor.manual_seed(1234)
  a = Tensor.rand(64).numpy()
  Tensor.manual_seed(1234)
  b = Tensor.rand(64).numpy()
  np.testing.assert_array_equal(a, b)


def test_rand_module_level_manual_seed():
  import baregrad.tensor as bt
  bt.manual_seed(7)
  a = Tensor.rand(3, 4).numpy()
  Tensor.manual_seed(7)
  b = Tensor.rand(3, 4).numpy()
  np.testing.assert_array_equal(a, b)


def test_rand_different_seeds_differ():
  Tensor.manual_seed(1)
  a = Tensor.rand(64).numpy()
  Tensor.manual_seed(2)
  b = Tensor.rand(64).numpy()
  assert not np.array_equal(a, b)


def test_rand_consecutive_calls_differ():
  Tensor.manual_seed(3)
  a, b = Tensor.rand(64).numpy(), Tensor.rand(64).numpy()
  assert not np.array_equal(a, b)


def test_rand_shape_dtype():
  t = Tensor.rand(2, 3)
  assert t.shape == (2, 3) and t.dtype == dtypes.float32
  assert Tensor.rand((4, 1)).shape == (4, 1)
  assert Tensor.rand(3, dtype="float16").numpy().dtype == np.float16


def test_rand_uniform_statistics():
  Tensor.manual_seed(42)
  x = Tensor.rand(100_000).numpy()
  assert x.dtype == np.float32 and x.shape == (100_000,)
  assert x.min() >= 0.0 and x.max() < 1.0
  assert abs(x.mean() - 0.5) < 0.01
  assert len(np.unique(x)) > 90_000
  counts, _ = np.histogram(x, bins=20, range=(0, 1))
  chi2 = ((counts - 5000) ** 2 / 5000).sum()
  assert chi2 < 60, f"chi2 {chi2} for counts {counts}"


def test_random_bits_uint32():
  bits = Tensor._random_bits((1000,), Tensor([0]).device)
  assert bits.dtype == dtypes.uint32 and bits.shape == (1000,)
  v = bits.numpy()
  assert v.dtype == np.uint32
  assert len(np.unique(v)) > 990
  assert v.max() > 2 ** 31  # high bit is used


def test_randn_statistics():
  Tensor.manual_seed(5)
  t = Tensor.randn(100_000)
  assert t.dtype == dtypes.float32 and t.shape == (100_000,)
  x = t.numpy().astype(np.float64)
  assert abs(x.mean()) < 0.02
  assert abs(x.std() - 1) < 0.02
  assert abs((np.abs(x) < 1).mean() - 0.6827) < 0.01


def test_randn_reproducible():
  Tensor.manual_seed(9)
  a = Tensor.randn(2, 8).numpy()
  Tensor.manual_seed(9)
  b = Tensor.randn(2, 8).numpy()
  np.testing.assert_array_equal(a, b)
  assert a.shape == (2, 8)


def test_randint_range():
  Tensor.manual_seed(6)
  t = Tensor.randint(-3, 5, (2000,))
  assert t.shape == (2000,) and t.dtype == dtypes.int32
  v = t.numpy()
  assert v.min() == -3 and v.max() == 4
  assert set(np.unique(v).tolist()) == set(range(-3, 5))


# ----------------------------------------------------------------------------------------------
# realize / numpy / item / tolist / repr
# ----------------------------------------------------------------------------------------------

def test_realize_returns_self():
  t = Tensor([1.0, 2.0]) * 3
  assert t.realize() is t
  check(t, np.array([3.0, 6.0], np.float32))


def test_realize_several_at_once():
  a = Tensor([1.0, 2.0]) + 1
  b = a * 2
  c = Tensor([[1, 2]]) - 5
  out = Tensor.realize(a, b, c)
  assert out is a
  check(a, np.array([2.0, 3.0], np.float32))
  check(b, np.array([4.0, 6.0], np.float32))
  check(c, np.array([[-4, -3]], np.int32))


def test_realize_method_with_others():
  a = Tensor([1, 2, 3]) * 2
  b = Tensor([1, 2, 3]) + 10
  a.realize(b)
  check(b, np.array([11, 12, 13], np.int32))
  check(a, np.array([2, 4, 6], np.int32))


def test_realize_twice_and_reuse():
  a = (Tensor([1.0, 2.0]) + 1).realize()
  a.realize()
  check(a + a, np.array([4.0, 6.0], np.float32))
  check(a, np.array([2.0, 3.0], np.float32))


@pytest.mark.parametrize("data,expected", [(2.5, 2.5), (7, 7), (True, True), ([[3.5]], 3.5), ([-4], -4)],
                         ids=["float", "int", "bool", "1x1", "1elem"])
def test_item(data, expected):
  v = Tensor(data).item()
  assert v == expected and type(v) is type(expected)


def test_item_of_computed():
  v = (Tensor([1.5, 2.5]).sum() * 2).item()
  assert v == 8.0 and type(v) is float
  v = Tensor([[1, 2], [3, 4]])[1, 0].item()
  assert v == 3 and type(v) is int


@pytest.mark.parametrize("data", [[1, 2, 3], [[1.5, 2.0], [3.0, -4.25]], 5, 2.5, [[True], [False]], [], [[[1]], [[2]]]],
                         ids=["1d", "2d", "int0d", "float0d", "bool", "empty", "3d"])
def test_tolist(data):
  t = Tensor(data)
  out = t.tolist()
  assert out == data
  assert out == t.numpy().tolist()


def test_tolist_types():
  assert type(Tensor([1, 2]).tolist()[0]) is int
  assert type(Tensor([1.5]).tolist()[0]) is float
  assert type(Tensor([True]).tolist()[0]) is bool


def test_repr_contains_shape_dtype_device():
  t = Tensor.zeros(2, 3, dtype="int16")
  r = repr(t)
  assert "int16" in r
  assert "(2, 3)" in r.replace("[2, 3]", "(2, 3)")
  assert t.device in r


def test_properties():
  t = Tensor(np.zeros((2, 3, 4), np.int16))
  assert t.shape == (2, 3, 4) and t.ndim == 3 and len(t) == 2
  assert t.numel() == 24 and t.element_size() == 2 and t.nbytes() == 48
  assert isinstance(t.device, str)
  assert Tensor(1.0).ndim == 0 and Tensor(1.0).numel() == 1


def test_lazy_ops_do_not_change_source():
  a = Tensor([1.0, 2.0]).realize()
  b = a + 1
  check(a, np.array([1.0, 2.0], np.float32))
  check(b, np.array([2.0, 3.0], np.float32))


def test_to_same_device_and_detach_contiguous():
  a = Tensor([[1.0, 2.0], [3.0, 4.0]])
  check(a.to(a.device), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
  check(a.T.contiguous(), np.array([[1.0, 3.0], [2.0, 4.0]], np.float32))
  check(a.detach() * 2, np.array([[2.0, 4.0], [6.0, 8.0]], np.float32))


def test_numpy_returns_independent_copy():
  t = Tensor([1, 2, 3]).realize()
  n = t.numpy()
  n[0] = 99
  check(t, np.array([1, 2, 3], np.int32))


def test_graph_reuse_shared_subexpression():
  a = Tensor(randf((5,), seed=1))
  s = a.exp()
  x, y = s + 1, s * 2
  e = np.exp(randf((5,), seed=1).astype(np.float64))
  check(x, (e + 1).astype(np.float32), rtol=1e-5)
  check(y, (e * 2).astype(np.float32), rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# edge cases: NaN/inf semantics, masking, larger sizes, in-place hazards
# ----------------------------------------------------------------------------------------------

NAN = np.float32(np.nan)


def test_nan_propagates_through_max_min_reductions():
  x = np.array([[1.0, NAN, 3.0], [4.0, 5.0, 6.0]], np.float32)
  check(Tensor(x).max(1), x.max(1))
  check(Tensor(x).min(1), x.min(1))
  check(Tensor(x).max(), np.array(np.nan, np.float32))


def test_nan_propagates_through_maximum_minimum():
  a = np.array([NAN, 1.0, NAN, 2.0], np.float32)
  b = np.array([1.0, NAN, NAN, 3.0], np.float32)
  check(Tensor(a).maximum(Tensor(b)), np.maximum(a, b))
  check(Tensor(a).minimum(Tensor(b)), np.minimum(a, b))


@pytest.mark.parametrize("op", list(COMPARISONS))
def test_comparisons_with_nan(op):
  bg_fn, np_fn = COMPARISONS[op]
  a = np.array([NAN, 1.0, NAN, -np.inf], np.float32)
  b = np.array([1.0, NAN, NAN, -np.inf], np.float32)
  check(bg_fn(Tensor(a), Tensor(b)), np_fn(a, b))
  check(bg_fn(Tensor(a), 1.0), np_fn(a, np.float32(1.0)))


def test_argmax_with_nan_and_ints():
  x = np.array([[1.0, NAN, 7.0], [3.0, 3.0, 2.0]], np.float32)
  check(Tensor(x).argmax(1), np.argmax(x, 1).astype(np.int32))
  i = np.array([[5, -2, 9, 9], [-1, -1, -3, 0]], np.int8)
  check(Tensor(i).argmax(1), np.argmax(i, 1).astype(np.int32))
  check(Tensor(i).argmin(), np.array(np.argmin(i), np.int32))
  b = np.array([False, True, True])
  check(Tensor(b).argmax(), np.array(1, np.int32))


SATURATING = [
  ("sigmoid", lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
  ("tanh", lambda t: t.tanh(), np.tanh),
  ("softplus", lambda t: t.softplus(), lambda x: np.logaddexp(0, x)),
  ("silu", lambda t: t.silu(), lambda x: x / (1 + np.exp(-x))),
  ("gelu", lambda t: t.gelu(), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
  ("exp", lambda t: t.exp(), np.exp),
  ("relu", lambda t: t.relu(), lambda x: np.maximum(x, 0)),
]


@pytest.mark.parametrize("fn,np_fn", [c[1:] for c in SATURATING], ids=[c[0] for c in SATURATING])
def test_activation_extremes(fn, np_fn):
  x = np.array([-1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0, -np.inf, np.inf], np.float32)
  with np.errstate(all="ignore"):
    expected = np_fn(x.astype(np.float64)).astype(np.float32)
  check(fn(Tensor(x)), expected, rtol=1e-5, atol=1e-6)


def test_softmax_with_masked_entries():
  x = np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]], np.float32)
  check(Tensor(x).softmax(-1), _np_softmax(x.astype(np.float64), -1).astype(np.float32), rtol=1e-6, atol=1e-7)
  ls = Tensor(x).log_softmax(-1).numpy()
  assert ls[0, 1] == -np.inf and ls[1, 0] == -np.inf and ls[1, 1] == 0.0


def test_logsumexp_with_inf():
  x = np.array([[-np.inf, -np.inf], [0.0, -np.inf], [np.inf, 1.0]], np.float32)
  out = Tensor(x).logsumexp(1).numpy()
  assert out[0] == -np.inf and out[1] == 0.0 and out[2] == np.inf


def test_log_exp_sqrt_special_values():
  x = np.array([0.0, -1.0, np.inf, -np.inf], np.float32)
  with np.errstate(all="ignore"):
    check(Tensor(x).log(), np.log(x))
    check(Tensor(x).sqrt(), np.sqrt(x))
    check(Tensor(x).exp(), np.exp(x))


def test_float_division_by_zero():
  a = np.array([1.0, -1.0, 0.0, 2.0], np.float32)
  b = np.array([0.0, 0.0, 0.0, -0.0], np.float32)
  with np.errstate(all="ignore"):
    check(Tensor(a) / Tensor(b), a / b)


def test_float16_overflow_to_inf():
  x = np.array([60000.0, -60000.0, 1.0], np.float16)
  with np.errstate(over="ignore"):
    check(Tensor(x) * 2, x * np.float16(2))


def test_round_half_to_even():
  x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6, 3.5], np.float32)
  check(Tensor(x).round(), np.round(x))


@pytest.mark.parametrize("n", [1000, 4097, 65537])
def test_sum_larger_1d(n):
  x = randf((n,), 0, 1, seed=30)
  check(Tensor(x).sum(), np.float32(x.astype(np.float64).sum()), rtol=1e-4, atol=1e-4)


def test_sum_float16_accumulates_precisely():
  x = np.ones(4096, np.float16)
  check(Tensor(x).sum(), np.array(4096, np.float16), rtol=0, atol=0)


@pytest.mark.parametrize("shape,axis", [((300, 257), 0), ((300, 257), 1), ((7, 130, 33), (0, 2)), ((64, 64, 3), -1)],
                         ids=["rows", "cols", "outer", "last3"])
def test_reduce_larger_2d(shape, axis):
  x = randf(shape, seed=31)
  x64 = x.astype(np.float64)
  check(Tensor(x).sum(axis), x64.sum(axis).astype(np.float32), rtol=1e-4, atol=1e-4)
  check(Tensor(x).max(axis), x.max(axis))


def test_elementwise_large_odd_size():
  x = randf((1_000_003,), seed=32)
  check(Tensor(x) * 2 + 1, (x.astype(np.float64) * 2 + 1).astype(np.float32))


@pytest.mark.parametrize("m,k,n", [(64, 96, 80), (33, 17, 65), (1, 256, 1), (128, 8, 128)])
def test_matmul_larger_shapes(m, k, n):
  a, b = randf((m, k), seed=1), randf((k, n), seed=2)
  check(Tensor(a) @ Tensor(b), (a.astype(np.float64) @ b).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_cumsum_longer():
  x = randf((300,), seed=33)
  check(Tensor(x).cumsum(0), np.cumsum(x.astype(np.float64)).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_arange_many_float_steps():
  check(Tensor.arange(0, 10, 0.1), np.arange(0, 10, 0.1).astype(np.float32), rtol=1e-6, atol=1e-6)
  check(Tensor.arange(-3, 3, 0.5), np.arange(-3, 3, 0.5).astype(np.float32))


def test_pad_int_and_bool_values():
  a = np.arange(6, dtype=np.int32).reshape(2, 3)
  check(Tensor(a).pad(((1, 0), (0, 2)), value=-7), np.pad(a, ((1, 0), (0, 2)), constant_values=-7))
  b = np.array([True, False])
  check(Tensor(b).pad(((1, 1),), value=True), np.pad(b, (1, 1), constant_values=True))


def test_assign_reversed_self():
  t = Tensor(np.arange(5, dtype=np.float32)).realize()
  t.assign(t.flip(0)).realize()
  check(t, np.arange(5, dtype=np.float32)[::-1])


def test_setitem_overlapping_shift():
  a = np.arange(6, dtype=np.int32)
  t = Tensor(a.copy()).realize()
  t[1:] = t[:-1]
  a[1:] = a[:-1].copy()
  check(t, a)


def test_setitem_negative_step():
  a = np.zeros(7, np.float32)
  t = Tensor(a.copy()).realize()
  v = np.arange(1, 4, dtype=np.float32)
  t[::-3] = Tensor(v)
  a[::-3] = v
  check(t, a)


def test_realized_tensor_used_after_setitem_in_expression():
  t = Tensor(np.ones((2, 3), np.float32)).realize()
  u = (t * 2).realize()
  t[0] = 5.0
  check(u, np.full((2, 3), 2.0, np.float32))
  check(t.sum(1), np.array([15.0, 3.0], np.float32))


def test_one_hot_int64_input():
  idx = np.array([3, 0, 2], np.int64)
  t = Tensor(idx).one_hot(4)
  check(t, np.eye(4, dtype=np.int64)[idx].astype(t.dtype.name))


def test_zero_d_broadcast_to_zero_size():
  check(Tensor(2.0) + Tensor(np.zeros((0, 2), np.float32)), np.zeros((0, 2), np.float32))


def test_sum_bfloat16_accumulates_precisely():
  check(Tensor.ones(4096, dtype="bfloat16").sum(), np.array(4096, np.float32), rtol=0, atol=0, dtype="bfloat16")
  x = np.full((2, 4096), 0.1, np.float16)
  check(Tensor(x).sum(1), np.full((2,), 409.6, np.float32).astype(np.float16), rtol=2e-3, atol=0)


def test_cos_large_arguments_as_precise_as_sin():
  x = np.array([1e3, -1e3, 1e4, -1e4, 12345.678, 3e4], np.float32)
  x64 = x.astype(np.float64)
  check(Tensor(x).sin(), np.sin(x64).astype(np.float32), rtol=0, atol=1e-5)
  check(Tensor(x).cos(), np.cos(x64).astype(np.float32), rtol=0, atol=1e-5)


def test_float_mod_large_quotient_stays_in_range():
  a = np.array([1e10, -1e10, 1e7 + 1, 123456.0], np.float32)
  b = np.array([3.0, 3.0, 7.0, 0.3], np.float32)
  out = check(Tensor(a) % Tensor(b), np.mod(a, b), rtol=1e-5, atol=1e-5)
  assert ((out >= 0) & (out < b)).all()


def test_float_floordiv_inexact_matches_python():
  a = np.array([7.0, -7.0, 1.0, 0.3], np.float32)
  b = np.array([0.1, 0.1, 0.1, 0.1], np.float32)
  check(Tensor(a) // Tensor(b), np.floor_divide(a, b))


@pytest.mark.parametrize("fn", ["exp", "log", "sigmoid", "tanh"])
def test_float16_transcendentals_within_two_ulp(fn):
  x = np.linspace(-10, 10, 41).astype(np.float16)
  if fn == "log":
    x = np.abs(x) + np.float16(0.25)
  ref = {"exp": np.exp, "log": np.log, "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}[fn](x.astype(np.float64))
  ref16 = ref.astype(np.float16)
  out = getattr(Tensor(x), fn)().numpy()
  assert out.dtype == np.float16
  ulp = np.spacing(np.abs(ref16)).astype(np.float64)
  err = np.abs(out.astype(np.float64) - ref16.astype(np.float64)) / ulp
  assert err.max() <= 2, f"{fn} float16 error {err.max()} ulp at x={x[err.argmax()]}"


FUZZ_SEEDS = list(range(40))


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_random_view_programs(seed):
  from helpers_fuzz import random_program
  t, a = random_program(1000 + seed, steps=7)
  check(t, a.astype(np.float32), rtol=1e-4, atol=1e-4)


def test_conv2d_larger_grouped_strided():
  x, w = randf((2, 8, 16, 16), seed=40), randf((16, 4, 3, 3), seed=41)
  b = randf((16,), seed=42)
  expected = naive_conv2d(x.astype(np.float64), w.astype(np.float64), b, stride=2, padding=1, groups=2)
  check(Tensor(x).conv2d(Tensor(w), bias=Tensor(b), stride=2, padding=1, groups=2), expected.astype(np.float32), rtol=1e-4, atol=1e-4)
