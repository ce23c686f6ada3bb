"""Composite Tensor ops (tensor/composite.py) against numpy references.

Each case checks shape, dtype and values (helpers_ops.check). Inputs include broadcasting,
negative axes, non-contiguous views (permuted / flipped / stepped), 0-d and zero-size tensors.
"""
import math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import check, default_has, randf, randi, widest_float_name

F32 = dict(rtol=1e-5, atol=1e-6)
LOOSE = dict(rtol=1e-4, atol=1e-5)


def T(a):
  return Tensor(np.asarray(a))


# ---------------------------------------------------------------- movement

A234 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("fn, ref", [
  (lambda t: t.view(6, 4), lambda a: a.reshape(6, 4)),
  (lambda t: t.view(-1), lambda a: a.reshape(-1)),
  (lambda t: t.transpose(), lambda a: a.swapaxes(1, 0)),
  (lambda t: t.transpose(0, -1), lambda a: a.swapaxes(0, -1)),
  (lambda t: t.T, lambda a: a.T),
  (lambda t: t[0].T, lambda a: a[0].T),
  (lambda t: t[0, 0].T, lambda a: a[0, 0]),
  (lambda t: t.reshape(2, 1, 3, 1, 4).squeeze(), lambda a: a),
  (lambda t: t.reshape(2, 1, 3, 1, 4).squeeze(-2), lambda a: a.reshape(2, 1, 3, 4)),
  (lambda t: t.reshape(2, 1, 3, 1, 4).squeeze((1, 3)), lambda a: a),
  (lambda t: t.squeeze(0), lambda a: a),
  (lambda t: t.unsqueeze(0), lambda a: a[None]),
  (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
  (lambda t: t.unsqueeze(3), lambda a: a[..., None]),
  (lambda t: t.unsqueeze(-2), lambda a: a[:, :, None]),
  (lambda t: t.flatten(), lambda a: a.reshape(-1)),
  (lambda t: t.flatten(1), lambda a: a.reshape(2, 12)),
  (lambda t: t.flatten(0, -2), lambda a: a.reshape(6, 4)),
  (lambda t: t.unflatten(-1, (2, 2)), lambda a: a.reshape(2, 3, 2, 2)),
  (lambda t: t.unflatten(1, (-1, 1)), lambda a: a.reshape(2, 3, 1, 4)),
  (lambda t: t.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3))),
  (lambda t: t.repeat((2, 1, 1, 2)), lambda a: np.tile(a, (2, 1, 1, 2))),
  (lambda t: t.permute(2, 0, 1).repeat(1, 2, 1), lambda a: np.tile(a.transpose(2, 0, 1), (1, 2, 1))),
  (lambda t: t.flip(1).transpose(1, 2), lambda a: np.flip(a, 1).swapaxes(1, 2)),
])
def test_movement(fn, ref):
  check(fn(T(A234)), ref(A234))


def test_flatten_0d_and_T_0d():
  check(T(np.float32(3)).flatten(), np.array([3], np.float32))
  check(T(np.float32(3)).T, np.float32(3))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_cat(dim):
  a, b, c = randf((2, 3, 4), seed=1), randf((2, 3, 4), seed=2), randf((2, 3, 4), seed=3)
  check(T(a).cat(T(b), T(c), dim=dim), np.concatenate([a, b, c], dim))
  check(Tensor.cat([T(a), T(b)], dim=dim), np.concatenate([a, b], dim))


def test_cat_uneven_and_noncontiguous():
  a, b = randf((3, 2), seed=1), randf((5, 4), seed=2)
  check(T(a).permute(1, 0).cat(T(b)[::2, ::-1].permute(1, 0), dim=0),
        np.concatenate([a.T, b[::2, ::-1].T], 0))
  check(T(a).cat(T(np.zeros((0, 2), np.float32)), dim=0), a)
  check(T(a).cat(T(b[:, :2]), dim=0), np.concatenate([a, b[:, :2]], 0))


def test_cat_dtypes():
  a, b = randi((2, 3), seed=1), randf((1, 3))
  check(Tensor.cat(T(a), T(b)), np.concatenate([a.astype(np.float32), b]))
  m, n = np.array([[True, False]]), np.array([[False, False], [True, True]])
  check(T(m).cat(T(n)), np.concatenate([m, n]))


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_stack(dim):
  a, b = randf((3, 4), seed=1), randf((3, 4), seed=2)
  check(T(a).stack(T(b), dim=dim), np.stack([a, b], dim))
  check(Tensor.stack([T(a), T(b), T(a)], dim=dim), np.stack([a, b, a], dim))


def test_stack_0d():
  check(Tensor.stack([T(np.float32(1)), T(np.float32(2))]), np.array([1, 2], np.float32))


@pytest.mark.parametrize("sizes, dim", [(2, 0), (3, -1), ([1, 3], -1), ([0, 2, 0], 0), (5, 1)])
def test_split(sizes, dim):
  a = randf((2, 3, 4))
  parts = T(a).split(sizes, dim)
  n = a.shape[dim]
  if isinstance(sizes, int): cuts = list(range(sizes, n, sizes))
  else: cuts = list(np.cumsum(sizes)[:-1])
  ref = np.split(a, cuts, axis=dim)
  assert len(parts) == len(ref)
  for p, r in zip(parts, ref): check(p, r)


@pytest.mark.parametrize("n, dim", [(2, 2), (3, -1), (4, 1), (1, 0)])
def test_chunk(n, dim):
  a = randf((2, 3, 4))
  size = -(-a.shape[dim] // n)
  ref = np.split(a, list(range(size, a.shape[dim], size)), axis=dim)
  parts = T(a).chunk(n, dim)
  assert len(parts) == len(ref)
  for p, r in zip(parts, ref): check(p, r)


@pytest.mark.parametrize("fn, exc", [
  (lambda t: t.transpose(0, 3), IndexError),
  (lambda t: t.unsqueeze(4), IndexError),
  (lambda t: t.squeeze(-4), IndexError),
  (lambda t: t.flatten(2, 1), ValueError),
  (lambda t: t.unflatten(1, (2, 2)), ValueError),
  (lambda t: t.repeat(2, 2), ValueError),
  (lambda t: t.cat(Tensor.zeros(2, 4, 4), dim=2), ValueError),
  (lambda t: t.cat(Tensor.zeros(2, 3), dim=0), ValueError),
  (lambda t: t.cat(t, dim=3), IndexError),
  (lambda t: t.stack(Tensor.zeros(2, 3, 5)), ValueError),
  (lambda t: t.split([1, 1], 1), ValueError),
  (lambda t: t.split(0, 1), ValueError),
  (lambda t: t.chunk(0), ValueError),
])
def test_movement_errors(fn, exc):
  with pytest.raises(exc):
    fn(T(A234))


def test_movement_error_names_shape():
  with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
    T(A234).cat(Tensor.zeros(2, 4, 4), dim=2)
  with pytest.raises(IndexError, match="dim 3"):
    T(A234).transpose(0, 3)


# ---------------------------------------------------------------- getitem

B = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6) - 20.0


@pytest.mark.parametrize("idx", [
  lambda a: 1, lambda a: -1, lambda a: (1, 2), lambda a: (-2, -5, -6),
  lambda a: slice(None, None, 2), lambda a: (slice(None), slice(None, None, -1)),
  lambda a: (slice(None), slice(4, 0, -2)), lambda a: (Ellipsis, slice(None, None, -4)),
  lambda a: (slice(None), slice(1, 100)), lambda a: (slice(None), slice(4, 1)),
  lambda a: (slice(None), slice(-2, None), slice(1, 6, 3)), lambda a: (0, slice(None, None, 3), slice(5, None, -2)),
  lambda a: (Ellipsis, 1), lambda a: (None, 1, None), lambda a: (Ellipsis, None),
  lambda a: (1, Ellipsis, None, slice(None, None, -3)), lambda a: (), lambda a: Ellipsis,
  lambda a: (slice(None), None, slice(1, 3), None),
  lambda a: (slice(None, None, -1), slice(None, None, -1), slice(None, None, -1)),
])
def test_getitem_basic(idx):
  i = idx(None)
  check(T(B)[i], B[i])


def test_getitem_noncontiguous():
  t = T(B).permute(2, 0, 1).flip(0)[::2]
  a = np.flip(B.transpose(2, 0, 1), 0)[::2]
  check(t[1:, ::-1, 3], a[1:, ::-1, 3])
  check(t[:, 1][[2, 0]], a[:, 1][[2, 0]])


def test_getitem_0d_and_empty():
  s = np.float32(2.5)
  check(T(s)[()], s)
  check(T(s)[None], s[None])
  check(T(s)[...], s)
  z = np.zeros((0, 3), np.float32)
  check(T(z)[:, 1], z[:, 1])
  check(T(z)[::-1, :2], z[::-1, :2])


@pytest.mark.parametrize("make", [
  lambda: (np.array([1, 0, 1]),),
  lambda: (np.array([-1, 0]),),
  lambda: (slice(None), np.array([[4, 0], [-1, 2]])),
  lambda: (slice(None), slice(None), np.array([5, 0, 5])),
  lambda: (np.array([1, 0]), slice(None), np.array([2, -3])),          # not adjacent: broadcast dims first
  lambda: (slice(None), np.array([1, 0]), np.array([[2], [3]])),       # adjacent: in place
  lambda: (slice(None), 1, np.array([0, 2])),
  lambda: (Ellipsis, np.array([0, 5]), None),
  lambda: (np.array(1), slice(1, None, 2)),
  lambda: (np.zeros((0,), np.int64),),
])
def test_getitem_tensor_index(make):
  idx = make()
  tidx = tuple(Tensor(i.astype(np.int32)) if isinstance(i, np.ndarray) else i for i in idx)
  check(T(B)[tidx], B[idx])


def test_getitem_int_apart_from_index_tensors_keeps_their_place():
  """PyTorch's placement, not numpy's: an int only drops its dim, so x[1, :, idx] puts idx's dims where idx is
  (numpy, which counts the int as an advanced index, moves them first)."""
  check(T(B)[1, :, Tensor(np.array([0, 2], np.int32))], B[1][:, [0, 2]])
  x = np.arange(2 * 3 * 12 * 5 * 4, dtype=np.float32).reshape(2, 3, 12, 5, 4)
  idx = np.array([[0, 4], [2, 1]])
  got = Tensor(x)[1, :, 3:11:2, Tensor(idx.astype(np.int32)), 0:2]
  check(got, x[1][:, 3:11:2][:, :, idx][..., 0:2])       # shape (3, 4, 2, 2, 2), as torch
  small = np.array([[0, 1], [1, 0]], np.int32)
  check(Tensor(x)[Tensor(small), 1, :, Tensor(small)], x[small, 1, :, small])   # apart: first, as both agree


def test_getitem_list_and_dtypes():
  check(T(B)[[1, 0, 1]], B[[1, 0, 1]])
  check(T(B)[:, [0, -1]], B[:, [0, -1]])
  ai = randi((4, 5))
  check(T(ai)[Tensor(np.array([3, 0], np.int64)), 1:], ai[[3, 0], 1:])
  ab = ai > 0
  check(T(ab)[:, [4, 1]], ab[:, [4, 1]])
  emb = randf((10, 3))
  tok = np.array([[1, 9], [0, 0]])
  check(T(emb)[T(tok.astype(np.int32))], emb[tok])


def test_getitem_inf_values_do_not_leak():
  a = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
  check(T(a)[[3, 0, 1]], a[[3, 0, 1]])


@pytest.mark.parametrize("idx, exc", [
  (5, IndexError), (-6, IndexError), ((0, 6), IndexError), ((0, 0, 0, 0), IndexError),
  ((Ellipsis, Ellipsis), IndexError), ((slice(None, None, 0),), ValueError),
  ([0, 6], IndexError), ("a", TypeError), (1.5, TypeError),
])
def test_getitem_errors(idx, exc):
  with pytest.raises(exc):
    T(B[:, 0])[idx]


def test_getitem_error_message_and_tensor_dtype():
  with pytest.raises(IndexError, match=r"index 7 .*dim 1 .*size 5"):
    T(B)[0, 7]
  with pytest.raises(TypeError):
    T(B)[Tensor(np.array([0.0, 1.0], np.float32))]


def test_iterate():
  rows = [r.numpy() for r in T(B[0, :3])]
  np.testing.assert_array_equal(np.stack(rows), B[0, :3])


# ---------------------------------------------------------------- setitem

@pytest.mark.parametrize("idx, val", [
  (1, 7.0),
  ((slice(None), 1), np.arange(6, dtype=np.float32)),
  ((slice(None, None, 2), slice(None, None, -1)), np.arange(6, dtype=np.float32) + 100),
  ((Ellipsis, 0), -1.0),
  ((-1, None, slice(1, 4)), np.ones((1, 3, 1), np.float32)),
  ((slice(None), slice(4, 0, -2), slice(1, 6, 2)), np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)),
  ((0, 2, 3), 9.0),
  ((), 3.0),
  ((slice(None), slice(3, 3)), 5.0),
])
def test_setitem_basic(idx, val):
  a = B.copy()
  t = T(a.copy())
  t[idx] = T(val) if isinstance(val, np.ndarray) else val
  a[idx] = val
  check(t, a)


@pytest.mark.parametrize("idx, val", [
  ((np.array([1, 0]),), 5.0),
  ((slice(None), np.array([4, -1, 0])), np.arange(6, dtype=np.float32)),
  ((np.array([0, 1]), 2), np.array([10, 20, 30, 40, 50, 60], np.float32)),
  ((slice(None), np.array([2, 2])), np.arange(24, dtype=np.float32).reshape(2, 2, 6)),  # duplicates: last wins
])
def test_setitem_tensor_index(idx, val):
  a = B.copy()
  t = T(a.copy())
  tidx = tuple(Tensor(i.astype(np.int32)) if isinstance(i, np.ndarray) else i for i in idx)
  t[tidx] = T(val) if isinstance(val, np.ndarray) else val
  a[idx] = val
  check(t, a)


def test_setitem_int_tensor_and_cast():
  a = randi((3, 4))
  t = T(a.copy())
  t[1:, ::2] = 2.9                     # value cast to the tensor dtype (like torch)
  a[1:, ::2] = 2
  check(t, a)
  t[[0, 2], 1] = T(np.array([-5, -6], np.int32))
  a[[0, 2], 1] = [-5, -6]
  check(t, a)


def test_setitem_then_use():
  a = np.zeros((3, 3), np.float32)
  t = T(a.copy())
  t[1] = 1.0
  a[1] = 1.0
  check(t * 2, a * 2)


@pytest.mark.parametrize("idx, val, exc", [
  ((0,), np.ones(4, np.float32), ValueError),
  ((slice(None), 0), np.ones((2, 2), np.float32), ValueError),
  ((3,), 1.0, IndexError),
])
def test_setitem_errors(idx, val, exc):
  t = T(np.zeros((3, 5), np.float32))
  with pytest.raises(exc):
    t[idx] = T(val) if isinstance(val, np.ndarray) else val


# ---------------------------------------------------------------- elementwise

def _gelu(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))     # torch's default: the exact (erf) form


X = randf((3, 5), low=-3, high=3, seed=7)
BIG = np.array([-100, -30, -5, -1e-3, 0, 1e-3, 5, 30, 100], np.float32)
POS = randf((4, 3), low=0.05, high=5, seed=8)

with np.errstate(all="ignore"):
  UNARY = [
    ("exp", X, np.exp, F32), ("exp", BIG[2:-2], np.exp, F32),
    ("log", POS, np.log, F32), ("rsqrt", POS, lambda a: 1 / np.sqrt(a), F32),
    ("cos", X, np.cos, LOOSE), ("tan", randf((7,), -1.4, 1.4), np.tan, LOOSE),
    ("sigmoid", X, lambda a: 1 / (1 + np.exp(-a)), F32),
    ("sigmoid", BIG, lambda a: 1 / (1 + np.exp(-a.astype(np.float64))), F32),
    ("tanh", X, np.tanh, LOOSE), ("tanh", BIG, np.tanh, LOOSE),
    ("relu", X, lambda a: np.maximum(a, 0), F32),
    ("leaky_relu", X, lambda a: np.where(a > 0, a, 0.01 * a), F32),
    ("gelu", X, _gelu, LOOSE), ("silu", X, lambda a: a / (1 + np.exp(-a)), LOOSE),
    ("softplus", X, lambda a: np.log1p(np.exp(a)), LOOSE),
    ("softplus", BIG, lambda a: np.logaddexp(0, a.astype(np.float64)), LOOSE),
    ("abs", X, np.abs, F32), ("sign", X, np.sign, F32), ("sign", BIG, np.sign, F32),
    ("square", X, np.square, F32),
    ("erf", X, np.vectorize(math.erf), dict(rtol=1e-5, atol=3e-7)),
  ]


@pytest.mark.parametrize("name, a, ref, tol", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, a, ref, tol):
  with np.errstate(all="ignore"):
    check(getattr(T(a), name)(), ref(a).astype(np.float32), **tol)


@pytest.mark.parametrize("name, ref", [("exp", np.exp), ("sigmoid", lambda a: 1 / (1 + np.exp(-a))),
                                       ("log", np.log), ("tanh", np.tanh)])
def test_unary_noncontiguous_and_int(name, ref):
  a = POS.T[::-1]
  check(getattr(T(POS).permute(1, 0).flip(0), name)(), ref(a), **LOOSE)
  i = np.array([[1, 2], [3, 4]], np.int32)
  check(getattr(T(i), name)(), ref(i.astype(np.float32)).astype(np.float32), **LOOSE)


def test_int_unary_keep_dtype():
  i = randi((3, 4))
  check(T(i).abs(), np.abs(i))
  check(T(i).sign(), np.sign(i))
  check(T(i).relu(), np.maximum(i, 0))
  check(T(i).square(), i * i)
  check(T(i).clip(-2, 3), np.clip(i, -2, 3))


def test_leaky_relu_softplus_args():
  check(T(X).leaky_relu(0.2), np.where(X > 0, X, 0.2 * X), **F32)
  check(T(X).softplus(beta=2), np.log1p(np.exp(2 * X)) / 2, **LOOSE)


def test_clip():
  check(T(X).clip(-1, 0.5), np.clip(X, -1, 0.5), **F32)
  check(T(X).clamp(min_=0.0), np.maximum(X, 0), **F32)
  check(T(X).clamp(max_=0.0), np.minimum(X, 0), **F32)
  lo = randf((1, 5), -2, 0)
  check(T(X).clip(T(lo), 1.0), np.clip(X, lo, 1.0), **F32)
  with pytest.raises(ValueError):
    T(X).clip()


def test_logical_and_lerp():
  a, b = X > 0, randi((3, 5), -1, 2)
  check(T(a).logical_and(T(b)), np.logical_and(a, b))
  check(T(a).logical_or(T(b)), np.logical_or(a, b))
  check(T(a).logical_xor(T(b)), np.logical_xor(a, b))
  check(T(b).logical_and(True), np.logical_and(b, True))
  e = randf((5,), seed=3)
  check(T(X).lerp(T(e), 0.25), X + 0.25 * (e - X), **F32)
  w = randf((3, 1), 0, 1, seed=4)
  check(T(X).lerp(T(e), T(w)), X + w * (e - X), **F32)


# ---------------------------------------------------------------- pow

@pytest.mark.parametrize("base, exp", [
  (POS, 1.7), (POS, -0.5), (X, 2), (X, 3), (X, -2), (X, 0), (POS, 0.5), (X, 2.0), (X, 0.0),
])
def test_pow_scalar_exponent(base, exp):
  with np.errstate(all="ignore"):
    check(T(base) ** exp, np.power(base, np.float32(exp)), **LOOSE)


def test_pow_tensor_exponent_signs():
  b = np.array([-2, -2, -2, 0, 0, 0, 3, -0.5, 1.5], np.float32)
  e = np.array([3, 2, 0.5, 0, 2, -1, -2, -3, 2.5], np.float32)
  with np.errstate(all="ignore"):
    check(T(b) ** T(e), np.power(b, e), **LOOSE)
    check(T(b).pow(T(e[::-1])), np.power(b, e[::-1]), **LOOSE)
    check(T(b[:, None]) ** T(e[None, :]), np.power(b[:, None], e[None, :]), **LOOSE)


def test_pow_int_exact():
  i = randi((3, 4), -9, 9)
  check(T(i) ** 3, i ** 3)
  check(T(i) ** 0, np.ones_like(i))
  check(T(i).pow(1), i)
  big = np.array([3, -7, 12], np.int32)
  check(T(big) ** 7, big ** 7)             # exact beyond float32's 24-bit mantissa
  e = np.array([0, 1, 2, 3], np.int32)
  check(T(np.array([3, -2, 5, 4], np.int32)) ** T(e), np.array([3, -2, 5, 4], np.int32) ** e)
  check(T(i) ** 1.5, (np.power(np.abs(i), 1.5) * np.where(i < 0, np.nan, 1)).astype(np.float32), **LOOSE)
  with pytest.raises(ValueError):
    T(i) ** -1


def test_rpow():
  check(2 ** T(X), np.exp2(X), **F32)
  check(2.5 ** T(X), np.power(np.float32(2.5), X), **LOOSE)
  e = np.array([0, 1, 5, 10], np.int32)
  check(3 ** T(e), 3 ** e)
  check(2.0 ** T(e), np.exp2(e).astype(np.float32))


# ---------------------------------------------------------------- reductions

R = randf((3, 4, 5), seed=11)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (-1, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mean_var_std(axis, keepdim):
  check(T(R).mean(axis, keepdim), R.mean(axis, keepdims=keepdim), **F32)
  check(T(R).var(axis, keepdim), R.var(axis, ddof=1, keepdims=keepdim), **LOOSE)
  check(T(R).std(axis, keepdim, correction=0), R.std(axis, ddof=0, keepdims=keepdim), **LOOSE)


def test_mean_int_noncontig_and_empty():
  i = randi((4, 6))
  check(T(i).mean(1), i.mean(1), dtype=widest_float_name())   # numpy: the mean of ints is float64 (float32 without it)
  check(T(R).permute(2, 0, 1)[::-2].mean((0, -1)), R.transpose(2, 0, 1)[::-2].mean((0, -1)), **F32)
  with np.errstate(all="ignore"):
    check(T(np.zeros((0, 3), np.float32)).mean(0), np.full(3, np.nan, np.float32))
  check(T(np.float32(4)).mean(), np.float32(4))


ARGM = np.array([[1, 5, 5, 0], [7, 7, 7, 7], [-3, -9, 2, -9]], np.float32)


@pytest.mark.parametrize("a", [ARGM, ARGM.astype(np.int32), R, R.transpose(1, 2, 0)[::-1]])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_argmax_argmin(a, axis):
  for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
    check(getattr(T(a), name)(axis), ref(a, axis).astype(np.int32))
    check(getattr(T(a), name)(axis, keepdim=True), ref(a, axis, keepdims=True).astype(np.int32))


def test_arg_errors():
  with pytest.raises(ValueError):
    T(np.zeros((2, 0), np.float32)).argmax(1)
  with pytest.raises(IndexError):
    T(ARGM).argmin(2)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_any_all(axis, keepdim):
  a = np.array([[0, 1, 0], [0, 0, 0], [2, 3, 1]], np.int32)
  check(T(a).any(axis, keepdim), a.any(axis, keepdims=keepdim))
  check(T(a).all(axis, keepdim), a.all(axis, keepdims=keepdim))
  b = ARGM > 0
  check(T(b).all(axis, keepdim), b.all(axis, keepdims=keepdim))


def test_any_all_empty():
  z = np.zeros((0, 2), np.float32)
  check(T(z).any(), np.bool_(False))
  check(T(z).all(0), np.ones(2, bool))


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_cumsum(axis):
  check(T(R).cumsum(axis), np.cumsum(R, axis), **LOOSE)
  i = randi((3, 4))
  check(T(i).cumsum(axis), np.cumsum(i, axis))   # numpy: int32 -> int64


def test_cumsum_noncontig_bool_0d():
  check(T(R)[:, ::-1].permute(2, 0, 1).cumsum(1), np.cumsum(R[:, ::-1].transpose(2, 0, 1), 1), **LOOSE)
  b = R > 0
  check(T(b).cumsum(-1), np.cumsum(b, -1))   # numpy: bool -> int64
  check(T(np.float32(2)).cumsum(0), np.float32(2))


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(axis, keepdim):
  a = R * 50
  ref = np.log(np.exp(a.astype(np.float64) - a.max()).sum(axis, keepdims=keepdim)) + a.max()
  if axis is not None:
    m = a.max(axis, keepdims=True).astype(np.float64)
    ref = np.log(np.exp(a - m).sum(axis, keepdims=True)) + m
    if not keepdim: ref = np.squeeze(ref, axis)
  check(T(a).logsumexp(axis, keepdim), ref.astype(np.float32), **LOOSE)


def test_logsumexp_inf():
  a = np.array([[-np.inf, -np.inf], [0.0, -np.inf], [np.inf, 1.0]], np.float32)
  check(T(a).logsumexp(1), np.array([-np.inf, 0.0, np.inf], np.float32))


# ---------------------------------------------------------------- matmul / einsum

@pytest.mark.parametrize("sa, sb", [
  ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
  ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((3, 0), (0, 2)), ((1, 1), (1, 1)),
])
def test_matmul(sa, sb):
  a, b = randf(sa, seed=1), randf(sb, seed=2)
  check(T(a) @ T(b), a @ b, **LOOSE)
  check(T(a).dot(T(b)), np.matmul(a, b), **LOOSE)


def test_matmul_noncontig_and_dtypes():
  a, b = randf((5, 3), seed=1), randf((4, 5), seed=2)
  check(T(a).T @ T(b).T, a.T @ b.T, **LOOSE)
  check(T(a)[::-1, ::2].T.matmul(T(b)[:, ::-1].T), a[::-1, ::2].T @ b[:, ::-1].T, **LOOSE)
  ia, ib = randi((3, 4)), randi((4, 2))
  check(T(ia) @ T(ib), ia @ ib)
  fb = randf((4, 2))
  check(T(ia) @ T(fb), (ia @ fb).astype(np.float32), **LOOSE)                # int @ float -> float32


@pytest.mark.parametrize("sa, sb", [((3, 4), (5, 6)), ((4,), (3,)), ((2, 3, 4), (3, 4, 5)), ((), (3,))])
def test_matmul_errors(sa, sb):
  with pytest.raises(ValueError, match=r"\(.*\).*\(.*\)"):
    T(randf(sa)) @ T(randf(sb))


EIN = [
  ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ii->", [(4, 4)]), ("ii->i", [(4, 4)]),
  ("ii", [(3, 3)]), ("ij->ji", [(3, 4)]), ("ij", [(3, 4)]), ("ji", [(3, 4)]), ("i,j->ij", [(3,), (4,)]),
  ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
  ("ij->", [(3, 4)]), ("i,i", [(5,), (5,)]), ("ij,ij->ij", [(3, 4), (3, 4)]), ("ijk->kij", [(2, 3, 4)]),
  ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
  ("iij->j", [(3, 3, 2)]), ("i...->...", [(3, 2, 2)]), (" ij , jk -> ki ", [(3, 4), (4, 2)]),
]


@pytest.mark.parametrize("formula, shapes", EIN, ids=[e[0] for e in EIN])
def test_einsum(formula, shapes):
  ops = [randf(s, seed=i) for i, s in enumerate(shapes)]
  check(Tensor.einsum(formula, *[T(o) for o in ops]), np.einsum(formula.replace(" ", ""), *ops), **LOOSE)


def test_einsum_list_operands_noncontig():
  a, b = randf((4, 3), seed=1), randf((5, 4), seed=2)
  check(Tensor.einsum("ij,jk->ik", [T(a).T, T(b).T]), a.T @ b.T, **LOOSE)


@pytest.mark.parametrize("formula, shapes", [
  ("ij,jk->ik", [(3, 4), (5, 6)]), ("ij,jk", [(3, 4)]), ("ijk", [(3, 4)]), ("ij->iz", [(3, 4)]),
  ("ij->ii", [(3, 4)]), ("i1", [(3, 4)]), ("ii", [(3, 4)]),
])
def test_einsum_errors(formula, shapes):
  with pytest.raises(ValueError):
    Tensor.einsum(formula, *[T(randf(s)) for s in shapes])


# ---------------------------------------------------------------- nn

def _softmax(a, axis):
  e = np.exp(a - a.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(axis):
  a = R * 30
  check(T(a).softmax(axis), _softmax(a, axis), **LOOSE)
  check(T(a).log_softmax(axis), np.log(_softmax(a.astype(np.float64), axis)).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_softmax_noncontig_int():
  check(T(R).permute(2, 1, 0)[::-1].softmax(), _softmax(R.transpose(2, 1, 0)[::-1], -1), **LOOSE)
  i = randi((2, 3))
  check(T(i).softmax(0), _softmax(i.astype(np.float32), 0), **LOOSE)
  with pytest.raises(IndexError):
    T(R).softmax(3)


@pytest.mark.parametrize("axis", [-1, (1, 2), 0])
def test_layernorm(axis):
  m = R.mean(axis, keepdims=True)
  v = R.var(axis, keepdims=True)
  check(T(R).layernorm(axis), (R - m) / np.sqrt(v + 1e-5), **LOOSE)


def test_layer_norm_affine():
  w, b = randf((4, 5), seed=1), randf((5,), seed=2)
  m, v = R.mean((1, 2), keepdims=True), R.var((1, 2), keepdims=True)
  check(T(R).layer_norm((4, 5), T(w), T(b), eps=1e-3), (R - m) / np.sqrt(v + 1e-3) * w + b, **LOOSE)
  with pytest.raises(ValueError):
    T(R).layer_norm((5, 4))


def test_one_hot():
  i = np.array([[0, 3], [2, 1]], np.int32)
  check(T(i).one_hot(4), np.eye(4, dtype=np.int32)[i])
  check(T(i)[:, ::-1].one_hot(5), np.eye(5, dtype=np.int32)[i[:, ::-1]])
  with pytest.raises(TypeError):
    T(X).one_hot(3)
  with pytest.raises(ValueError):
    T(i).one_hot(0)


def _conv2d_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
  sh, sw = (stride, stride) if isinstance(stride, int) else stride
  ph, pw = (padding, padding) if isinstance(padding, int) else padding
  dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
  n, c, h, wd = x.shape
  co, cg, kh, kw = w.shape
  oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros((n, co, oh, ow))
  og = co // groups
  for g in range(groups):
    xs = x[:, g * cg:(g + 1) * cg]
    for i in range(kh):
      for j in range(kw):
        patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
        out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
  if b is not None: out += b[None, :, None, None]
  return out.astype(np.float32)


CONV = [
  dict(xs=(2, 3, 7, 7), ws=(4, 3, 3, 3)),
  dict(xs=(1, 2, 6, 5), ws=(3, 2, 2, 3), stride=2, padding=1, bias=True),
  dict(xs=(1, 4, 8, 8), ws=(4, 2, 3, 3), groups=2, dilation=2, padding=(2, 1)),
  dict(xs=(2, 2, 5, 9), ws=(2, 2, 1, 4), stride=(1, 3)),
  dict(xs=(1, 3, 4, 4), ws=(6, 1, 3, 3), groups=3, padding=1, stride=3),
  dict(xs=(1, 1, 3, 3), ws=(1, 1, 3, 3)),
]


@pytest.mark.parametrize("cfg", CONV)
def test_conv2d(cfg):
  cfg = dict(cfg)
  x, w = randf(cfg.pop("xs"), seed=1), randf(cfg.pop("ws"), seed=2)
  b = randf((w.shape[0],), seed=3) if cfg.pop("bias", False) else None
  out = T(x).conv2d(T(w), T(b) if b is not None else None, **cfg)
  check(out, _conv2d_ref(x, w, b, **cfg), **LOOSE)


def test_conv2d_noncontig_same_unbatched():
  x, w = randf((1, 2, 5, 6), seed=1), randf((3, 2, 3, 3), seed=2)
  xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)[..., ::-1])
  check(T(x).permute(0, 1, 3, 2).flip(-1).conv2d(T(w)), _conv2d_ref(xt, w), **LOOSE)
  check(T(x).conv2d(T(w), padding="same"), _conv2d_ref(x, w, padding=1), **LOOSE)
  check(T(x[0]).conv2d(T(w), padding=1), _conv2d_ref(x, w, padding=1)[0], **LOOSE)


@pytest.mark.parametrize("xs, ws, kw, exc", [
  ((1, 3, 5, 5), (2, 2, 3, 3), {}, ValueError),
  ((1, 4, 5, 5), (3, 2, 3, 3), dict(groups=2), ValueError),
  ((1, 3, 2, 2), (2, 3, 3, 3), {}, ValueError),
  ((3, 5, 5), (2, 3, 3), {}, ValueError),
  ((1, 3, 5, 5), (2, 3, 3, 3), dict(stride=0), ValueError),
])
def test_conv2d_errors(xs, ws, kw, exc):
  with pytest.raises(exc):
    T(randf(xs)).conv2d(T(randf(ws)), **kw)


def _pool_ref(x, k, s, p, d, fill, fn):
  kh, kw = k
  sh, sw = s
  x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p[0], p[0]), (p[1], p[1])], constant_values=fill)
  h, w = x.shape[-2:]
  oh, ow = (h - d[0] * (kh - 1) - 1) // sh + 1, (w - d[1] * (kw - 1) - 1) // sw + 1
  taps = [x[..., i * d[0]:i * d[0] + sh * (oh - 1) + 1:sh, j * d[1]:j * d[1] + sw * (ow - 1) + 1:sw]
          for i in range(kh) for j in range(kw)]
  return fn(np.stack(taps), axis=0)


POOL = [
  dict(shape=(2, 3, 6, 6), k=2), dict(shape=(1, 2, 7, 5), k=3, s=2, p=1),
  dict(shape=(1, 1, 8, 8), k=(2, 3), s=(1, 2), p=(1, 0)), dict(shape=(3, 5, 5), k=2, s=1),
  dict(shape=(1, 2, 9, 9), k=3, s=2, d=2, p=1),
]


@pytest.mark.parametrize("cfg", POOL)
def test_max_pool2d(cfg):
  x = randf(cfg["shape"], seed=5)
  k = (cfg["k"],) * 2 if isinstance(cfg["k"], int) else cfg["k"]
  s = k if "s" not in cfg else ((cfg["s"],) * 2 if isinstance(cfg["s"], int) else cfg["s"])
  p = (cfg.get("p", 0),) * 2 if isinstance(cfg.get("p", 0), int) else cfg["p"]
  d = (cfg.get("d", 1),) * 2
  check(T(x).max_pool2d(cfg["k"], cfg.get("s"), cfg.get("p", 0), cfg.get("d", 1)),
        _pool_ref(x, k, s, p, d, -np.inf, np.max))
  if "d" not in cfg:
    check(T(x).avg_pool2d(cfg["k"], cfg.get("s"), cfg.get("p", 0)), _pool_ref(x, k, s, p, d, 0, np.mean), **LOOSE)


def test_pool_int_noncontig_and_errors():
  i = randi((1, 1, 4, 6))
  check(T(i).max_pool2d(2, padding=1), _pool_ref(i, (2, 2), (2, 2), (1, 1), (1, 1), np.iinfo(np.int32).min, np.max))
  x = randf((1, 2, 6, 4))
  xv = x.transpose(0, 1, 3, 2)[..., ::-1]
  check(T(x).permute(0, 1, 3, 2).flip(-1).avg_pool2d(3, 1), _pool_ref(xv, (3, 3), (1, 1), (0, 0), (1, 1), 0, np.mean),
        **LOOSE)
  with pytest.raises(ValueError):
    T(x).max_pool2d(2, padding=2)
  with pytest.raises(ValueError):
    T(x).avg_pool2d(7)
  with pytest.raises(ValueError):
    T(x[0, 0]).max_pool2d(2)


# ---------------------------------------------------------------- creation

@pytest.mark.parametrize("a", [X, randi((2, 3)), np.zeros((0, 2), np.float16)])
def test_like(a):
  t = T(a)
  check(t.zeros_like(), np.zeros_like(a))
  check(t.ones_like(), np.ones_like(a))
  check(t.full_like(3), np.full_like(a, 3))
  check(t.ones_like(dtype="float32"), np.ones(a.shape, np.float32))
  e = t.empty_like()
  assert e.shape == a.shape and e.dtype == t.dtype
  assert t.zeros_like().device == t.device


def test_rand_like_randn():
  Tensor.manual_seed(1)
  r = T(np.zeros((100, 100), np.float32)).rand_like()
  assert r.shape == (100, 100) and r.dtype == dtypes.float32
  v = r.numpy()
  assert v.min() >= 0 and v.max() < 1 and abs(v.mean() - 0.5) < 0.02
  n = Tensor.randn(200, 100)
  assert n.shape == (200, 100) and n.dtype == dtypes.float32
  v = n.numpy()
  assert np.isfinite(v).all() and abs(v.mean()) < 0.03 and abs(v.std() - 1) < 0.03
  assert abs((np.abs(v) < 1).mean() - 0.6827) < 0.02
  h = T(np.zeros((3, 4), np.float16)).randn_like()
  assert h.shape == (3, 4) and h.dtype == dtypes.float16
  if default_has(["float64"]): assert Tensor.randn((2, 3), dtype="float64").dtype == dtypes.float64
  with pytest.raises(TypeError):
    T(np.zeros(3, np.int32)).rand_like()


def test_randint_uniform():
  Tensor.manual_seed(2)
  r = Tensor.randint(-3, 4, shape=(1000,))
  assert r.shape == (1000,) and r.dtype == dtypes.int32
  v = r.numpy()
  assert v.min() == -3 and v.max() == 3
  assert set(np.unique(v)) == set(range(-3, 4))
  r = Tensor.randint(5, shape=(4, 5), dtype="int64")
  assert r.dtype == dtypes.int64 and r.shape == (4, 5) and 0 <= r.numpy().min() and r.numpy().max() < 5
  u = Tensor.uniform(500, low=-2.0, high=3.0)
  v = u.numpy()
  assert u.shape == (500,) and v.min() >= -2 and v.max() < 3 and abs(v.mean() - 0.5) < 0.3
  with pytest.raises(ValueError):
    Tensor.randint(3, 3, (2,))            # torch's form: low < high
  # tinygrad's form: the positional ints are the shape, low/high keywords (0 and 10 by default)
  r = Tensor.randint(3, 4, low=2, high=5)
  assert r.shape == (3, 4) and 2 <= r.numpy().min() and r.numpy().max() < 5
  assert Tensor.randint(6).shape == (6,) and 0 <= Tensor.randint(50).numpy().min() and Tensor.randint(50).numpy().max() < 10
  with pytest.raises(ValueError, match="non-negative"):
    Tensor.randint(-3, 2)                 # a negative dim, as every creation method


@pytest.mark.parametrize("start, stop, steps", [(0, 1, 5), (-3.5, 2, 8), (1, 1, 1), (2, -2, 2), (0, 10, 0), (0, 1, 101)])
def test_linspace(start, stop, steps):
  check(Tensor.linspace(start, stop, steps), np.linspace(start, stop, steps, dtype=np.float32), **F32)


@pytest.mark.parametrize("n, m", [(3, None), (2, 4), (4, 1), (0, 2)])
def test_eye(n, m):
  check(Tensor.eye(n, m), np.eye(n, m, dtype=np.float32))
  check(Tensor.eye(n, m, dtype="int32"), np.eye(n, m, dtype=np.int32))


# ---------------------------------------------------------------- dtypes and fusion

def test_half_precision_composites():
  h = randf((3, 4), seed=9).astype(np.float16)
  hf = h.astype(np.float32)
  check(T(h).softmax(), _softmax(hf, -1).astype(np.float16), rtol=1e-2, atol=1e-3)
  check(T(h) @ T(h.T), (hf @ hf.T).astype(np.float16), rtol=1e-2, atol=1e-2)
  check(T(h).mean(0), hf.mean(0).astype(np.float16), rtol=1e-2, atol=1e-3)
  check(T(h)[::-1, [0, 3]], h[::-1, [0, 3]])
  bf = Tensor(np.array([1.5, -2.25, 3.0], np.float32), dtype="bfloat16")
  check(bf.exp(), np.exp(np.array([1.5, -2.25, 3.0], np.float32)), rtol=2e-2, atol=1e-2, dtype="bfloat16")
  check(bf.cat(bf[::-1]), np.array([1.5, -2.25, 3.0, 3.0, -2.25, 1.5], np.float32), dtype="bfloat16")


def test_int64_and_nan_edge_cases():
  big = np.array([2 ** 40, 5, -(2 ** 35)], np.int64)
  check(T(big)[[2, 0]], big[[2, 0]])
  check(T(big).cumsum(), np.cumsum(big))
  check(T(big).argmin(), np.int32(2))
  n = np.array([1, np.nan, 3, np.nan], np.float32)
  check(T(n).argmax(), np.argmax(n).astype(np.int32))
  check(T(n).argmin(), np.argmin(n).astype(np.int32))


@pytest.mark.parametrize("build", [
  lambda a, x: a @ a.T,
  lambda a, x: a.cat(a[::-1], a, dim=1),
  lambda a, x: a[[2, 0, 1]],
  lambda a, x: a[::-2, 1::3],
  lambda a, x: a.cumsum(1),
  lambda a, x: Tensor.einsum("ij,kj->ik", a, a),
  lambda a, x: x.conv2d(Tensor.ones(2, 3, 3, 3), padding=1, stride=2),
  lambda a, x: x.max_pool2d(3, 2, 1),
  lambda a, x: x.repeat(1, 2, 1, 1),
], ids=["matmul", "cat", "gather", "strided", "cumsum", "einsum", "conv2d", "max_pool2d", "repeat"])
def test_composites_fuse_into_one_kernel(build):
  a = T(randf((4, 6)))
  x = T(randf((1, 3, 6, 6)))
  assert len(build(a, x).schedule()) == 1


def test_half_reductions_accumulate_in_float32():
  ones = np.ones(5000, np.float16)
  check(T(ones).mean(), np.float16(1.0))
  check(T(ones).cumsum()[-1], np.float16(5000))
  check(T(ones[None]) @ T(ones[:, None]), np.array([[5000]], np.float16))


def test_setitem_bool_mask():
  a = X.copy()
  t = T(a.copy())
  t[t < 0] = 0.0
  a[a < 0] = 0.0
  check(t, a)
  rows = np.array([True, False, True])
  t[T(rows)] = T(np.float32(-1))
  a[rows] = -1
  check(t, a)
  with pytest.raises(IndexError):
    t[T(np.array([True, False]))] = 1.0
  with pytest.raises(ValueError):
    t[T(rows)] = T(np.ones(5, np.float32))
