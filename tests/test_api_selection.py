"""Selection and scan ops (tensor/selection.py): scans, sort/topk, gather/scatter, masks, triangles, diagonals,
roll, unfold, repeat_interleave and meshgrid.

Forward values are checked against numpy references written from torch's documented definitions (loops where numpy
has no such op: cummax's "last index wins, NaN sticks", scatter's index rule, scatter_reduce). Gradients are checked
in float64 against central differences of those references (skipped on a device without float64, METAL). A subset
runs on the emulated AMD and NV GPUs.
"""
import math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import as_widest, check

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy refs meeting NaN
rng = np.random.default_rng(7)
NAN = np.nan


def T(a, **kw):
  return Tensor(np.asarray(a), **kw)


# ---------------------------------------------------------------- references (torch's definitions, in numpy)

def _rows(a, axis):
  """a with `axis` last, flattened to rows, and a function that puts such rows back."""
  moved = np.moveaxis(a, axis, -1)
  def back(rows, dtype=None):
    out = np.asarray(rows, dtype=dtype if dtype is not None else a.dtype).reshape(moved.shape[:-1] + (-1,))
    return np.moveaxis(out, -1, axis)
  return moved.reshape(-1, moved.shape[-1]), back


def ref_cum_extreme(a, axis, is_max):
  """torch's cummax/cummin: an element replaces the running value if it is NaN, or if the running value is not NaN
  and the element is >= it (<= for cummin), so ties and NaNs take the latest index."""
  rows, back = _rows(a, axis)
  vals, idxs = [], []
  for row in rows:
    out, at, vr, ir = row[0], 0, [], []
    for i, v in enumerate(row):
      if v != v or (out == out and (v >= out if is_max else v <= out)): out, at = v, i
      vr.append(out); ir.append(at)
    vals.append(vr); idxs.append(ir)
  return back(vals), back(idxs, np.int32)


def _sort_key(v, descending):
  nan = v != v
  if descending: return (0 if nan else 1, 0 if nan else -v)
  return (1 if nan else 0, 0 if nan else v)


def ref_sort(a, axis=-1, descending=False):
  """A stable sort (equal keys keep their order), NaN as the largest value: torch.sort(stable=True)."""
  rows, back = _rows(a, axis)
  order = [sorted(range(len(r)), key=lambda i, r=r: _sort_key(r.tolist()[i], descending)) for r in rows]
  return back([r[o] for r, o in zip(rows, order)]), back(order, np.int32)


def ref_gather(a, dim, idx):
  out = np.empty(idx.shape, a.dtype)
  for pos in np.ndindex(*idx.shape):
    src = list(pos); src[dim] = idx[pos]
    out[pos] = a[tuple(src)]
  return out


def ref_scatter_reduce(a, dim, idx, src, reduce=None, include_self=True):
  """self[index[i][j]][j] (dim 0) combined with src[i][j], in index order (so for reduce=None the last one wins)."""
  out = a.copy()
  parts = {}
  for pos in np.ndindex(*idx.shape):
    dst = list(pos); dst[dim] = idx[pos]
    parts.setdefault(tuple(dst), []).append(src[pos])
  for dst, vals in parts.items():
    own = [a[dst]] if include_self else []
    if reduce is None: out[dst] = vals[-1]
    elif reduce == "sum": out[dst] = sum(own + vals)
    elif reduce == "prod": out[dst] = np.prod(np.array(own + vals, a.dtype))
    elif reduce == "amax": out[dst] = np.max(np.array(own + vals, a.dtype))
    elif reduce == "amin": out[dst] = np.min(np.array(own + vals, a.dtype))
    elif reduce == "mean":
      total = np.array(own + vals, a.dtype).sum(dtype=a.dtype)
      out[dst] = total / len(own + vals) if a.dtype.kind == "f" else total // len(own + vals)
  return out


def ref_unfold(a, dim, size, step):
  return np.lib.stride_tricks.sliding_window_view(a, size, axis=dim).take(
    range(0, a.shape[dim] - size + 1, step), axis=dim)


# ---------------------------------------------------------------- scans

A = np.array([[2., 0., -1., 3., 0., 2.],
              [NAN, 1., 2., -2., 1., 1.],
              [0.5, 4., 4., 1., -3., np.inf]], np.float32)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_float_zeros_nan_inf(dim):
  check(T(A).cumprod(dim), np.cumprod(A, dim))


@pytest.mark.parametrize("dt", ["int8", "int32", "uint8", "int64", "bool"])
def test_cumprod_int_dtypes_promote_like_numpy(dt):
  a = rng.integers(0 if dt in ("uint8", "bool") else -3, 2 if dt == "bool" else 4, (3, 5)).astype(dt)
  check(T(a).cumprod(1), np.cumprod(a, 1))          # numpy: int8/int32/bool -> int64, uint8 -> uint64


def test_cumprod_dim_none_dtype_0d_empty_half():
  check(T(A[:, 1:]).cumprod(None), np.cumprod(A[:, 1:]))
  ints = np.arange(1, 5, dtype=np.int32)
  check(T(ints).cumprod(0, dtype=dtypes.float32), np.cumprod(ints.astype(np.float32)))
  check(T(np.float32(3)).cumprod(0), np.float32(3))
  check(T(np.zeros((0, 3), np.float32)).cumprod(0), np.zeros((0, 3), np.float32))
  h = np.array([1.5, -2, 0.5, 3], np.float16)
  check(T(h).cumprod(0), np.cumprod(h))


@pytest.mark.parametrize("is_max", [True, False])
@pytest.mark.parametrize("dim", [1, -2])
def test_cummax_cummin_ties_nan(is_max, dim):
  a = np.array([[1., 3., 3., NAN, 5., NAN, 0.],
                [-1., -1., -np.inf, 2., 2., -1., 2.],
                [0., -0., 7., 7., 1., 7., -7.]], np.float32)
  if dim == -2: a = np.ascontiguousarray(a.T)
  res = T(a).cummax(dim) if is_max else T(a).cummin(dim)
  values, indices = res
  assert res.values is values and res.indices is indices      # torch.return_types: a tuple with names
  want_v, want_i = ref_cum_extreme(a, dim, is_max)
  check(values, want_v)
  check(indices, want_i)


@pytest.mark.parametrize("dt", ["int32", "uint8", "bool"])
def test_cummax_cummin_int_bool(dt):
  a = rng.integers(0, 2 if dt == "bool" else 5, (2, 7)).astype(dt)
  for is_max in (True, False):
    res = T(a).cummax(1) if is_max else T(a).cummin(1)
    want_v, want_i = ref_cum_extreme(a, 1, is_max)
    check(res.values, want_v)
    check(res.indices, want_i)


def test_cummax_empty_and_0d():
  v, i = T(np.zeros((3, 0), np.float32)).cummax(1)
  check(v, np.zeros((3, 0), np.float32)); check(i, np.zeros((3, 0), np.int32))
  v, i = T(np.float32(4)).cummin(0)
  check(v, np.float32(4)); check(i, np.int32(0))


def test_logcumsumexp_stable_inf_nan():
  a = as_widest([[1000., 1000., -1000., 1010.],        # float64, or float32 on a device without it
                 [-np.inf, -np.inf, 0., 1.],
                 [-1000., 0., -np.inf, 3.],
                 [1., NAN, 2., 3.],
                 [1., np.inf, 2., np.inf]])
  a64 = a.astype(np.float64)
  check(T(a).logcumsumexp(1), np.logaddexp.accumulate(a64, 1).astype(a.dtype))
  check(T(a[:, :3]).logcumsumexp(0), np.logaddexp.accumulate(a64[:, :3], 0).astype(a.dtype))
  b = rng.standard_normal((3, 4)).astype(np.float32)
  check(T(b).logcumsumexp(-1), np.logaddexp.accumulate(b, -1))
  i = np.array([1, 2, 3], np.int32)
  check(T(i).logcumsumexp(0), np.logaddexp.accumulate(i.astype(np.float32)))   # ints compute in float32
  check(T(np.zeros((0,), np.float32)).logcumsumexp(0), np.zeros((0,), np.float32))


# ---------------------------------------------------------------- sort, argsort, topk

S = np.array([[3., 1., NAN, 1., -0., 0., -np.inf, 2.],
              [5., 5., 5., NAN, NAN, -1., np.inf, 5.]], np.float32)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_sort_stable_nan_largest(descending, dim):
  res = T(S).sort(dim, descending=descending)
  want_v, want_i = ref_sort(S, dim, descending)
  check(res.values, want_v)
  check(res.indices, want_i)
  check(T(S).argsort(dim, descending), want_i)


@pytest.mark.parametrize("dt", ["int8", "uint8", "int64", "bool", "float16"])
def test_sort_dtypes(dt):
  a = rng.integers(0 if dt in ("uint8", "bool") else -5, 2 if dt == "bool" else 6, (3, 9)).astype(dt)
  if dt == "uint8": a[0, 0] = 255
  for desc in (False, True):
    values, indices = T(a).sort(descending=desc)
    want_v, want_i = ref_sort(a, -1, desc)
    check(values, want_v); check(indices, want_i)


def test_sort_3d_empty_0d():
  a = rng.integers(-3, 3, (2, 4, 3)).astype(np.float32)
  for dim in (0, 1, 2):
    v, i = T(a).sort(dim, descending=True)
    want_v, want_i = ref_sort(a, dim, True)
    check(v, want_v); check(i, want_i)
  v, i = T(np.zeros((2, 0), np.float32)).sort()
  check(v, np.zeros((2, 0), np.float32)); check(i, np.zeros((2, 0), np.int32))
  v, i = T(np.zeros((2, 0), np.float32)).topk(0)
  check(v, np.zeros((2, 0), np.float32)); check(i, np.zeros((2, 0), np.int32))
  v, i = T(np.float32(5)).sort()
  check(v, np.float32(5)); check(i, np.int32(0))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [0, 3, 8])
def test_topk(largest, k):
  values, indices = T(S).topk(k, largest=largest)
  want_v, want_i = ref_sort(S, -1, largest)
  check(values, want_v[:, :k]); check(indices, want_i[:, :k])


def test_topk_dim0_ints_sorted_flag_errors():
  a = rng.integers(-4, 4, (6, 3)).astype(np.int32)
  values, indices = T(a).topk(2, dim=0, sorted=False)
  want_v, want_i = ref_sort(a, 0, True)
  check(values, want_v[:2]); check(indices, want_i[:2])
  with pytest.raises(ValueError, match="k=7"): T(a).topk(7, dim=0)
  with pytest.raises(ValueError): T(a).topk(-1)
  with pytest.raises(IndexError): T(a).topk(1, dim=2)


# ---------------------------------------------------------------- gather, index_select

X3 = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3) - 10


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_smaller_index(dim):
  shape = [2, 3, 2]
  shape[dim] = 5
  idx = rng.integers(0, X3.shape[dim], shape)
  check(T(X3).gather(dim, T(idx)), ref_gather(X3, dim % 3, idx))
  check(T(X3).gather(dim, idx.tolist()), ref_gather(X3, dim % 3, idx))


def test_gather_dtypes_empty_0d():
  b = rng.integers(0, 2, (3, 4)).astype(bool)
  idx = rng.integers(0, 4, (3, 6)).astype(np.int64)
  check(T(b).gather(1, T(idx)), ref_gather(b, 1, idx))
  i8 = rng.integers(-100, 100, (3, 4)).astype(np.int8)
  check(T(i8).gather(1, T(idx)), ref_gather(i8, 1, idx))
  check(T(X3).gather(1, T(np.zeros((2, 0, 3), np.int32))), np.zeros((2, 0, 3), np.float32))
  check(T(np.float32(3)).gather(0, T(np.int32(0))), np.float32(3))


def test_gather_errors():
  with pytest.raises(IndexError, match="index 4 is out of bounds for dim 1 with size 4"):
    T(X3).gather(1, [[[0, 4, 0]], [[0, 0, 0]]])
  with pytest.raises(IndexError, match="index -1"): T(X3).gather(1, [[[0, -1, 0]]])
  with pytest.raises(IndexError, match="index 9"): T(X3).gather(0, Tensor.full((1, 1, 1), 9, dtype=dtypes.int32))
  with pytest.raises(TypeError, match="integer"): T(X3).gather(0, T(np.zeros((1, 1, 1), np.float32)))
  with pytest.raises(ValueError, match="as many dims"): T(X3).gather(0, T(np.zeros((1, 1), np.int32)))
  with pytest.raises(ValueError, match="larger"): T(X3).gather(0, T(np.zeros((1, 5, 1), np.int32)))


def test_gather_computed_out_of_range_gives_zero():
  """A computed index is not checked (that would read it back): an entry out of range matches nothing."""
  idx = T(np.array([[0, 5]], np.int32)) + 0
  check(T(X3[0]).gather(1, idx), np.array([[-10., 0.]], np.float32))


def test_index_select():
  check(T(X3).index_select(1, T(np.array([3, 0, 3]))), X3[:, [3, 0, 3]])
  check(T(X3).index_select(-1, [2]), X3[:, :, [2]])
  with pytest.raises(IndexError): T(X3).index_select(0, [2])


# ---------------------------------------------------------------- scatter, scatter_reduce

def test_scatter_src_larger_than_index():
  base = rng.standard_normal((3, 5)).astype(np.float32)
  src = np.arange(1, 25, dtype=np.float32).reshape(4, 6)
  idx = np.array([[0, 4, 2], [1, 1, 3]])
  for dim in (0, 1, -1):
    i = idx % base.shape[dim]
    check(T(base).scatter(dim, T(i), T(src)), ref_scatter_reduce(base, dim % 2, i, src))


def test_scatter_value_duplicates_last_wins_ints():
  base = np.zeros((3, 4), np.int32)
  idx = np.array([[1, 1, 3], [0, 2, 0], [3, 3, 3]])
  src = np.arange(9, dtype=np.int32).reshape(3, 3) + 1
  check(T(base).scatter(1, T(idx), T(src)), ref_scatter_reduce(base, 1, idx, src))
  check(T(base).scatter(1, T(idx), 7), ref_scatter_reduce(base, 1, idx, np.full((3, 3), 7, np.int32)))
  check(T(base).scatter(1, T(idx), value=-2), ref_scatter_reduce(base, 1, idx, np.full((3, 3), -2, np.int32)))
  b = np.zeros((2, 3), bool)
  bi = np.array([[1, 0, 1]])
  check(T(b).scatter(0, T(bi), True), ref_scatter_reduce(b, 0, bi, np.ones((1, 3), bool)))


@pytest.mark.parametrize("reduce, torch_name", [("add", "sum"), ("multiply", "prod")])
def test_scatter_reduce_argument(reduce, torch_name):
  base = np.full((2, 4), 2.0, np.float32)
  idx = np.array([[0, 0, 3], [2, 1, 2]])
  src = np.array([[1.5, 3., -1.], [4., 0.5, 2.]], np.float32)
  check(T(base).scatter(1, T(idx), T(src), reduce=reduce), ref_scatter_reduce(base, 1, idx, src, torch_name))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce, dt", [("sum", "float32"), ("prod", "float32"), ("mean", "float32"),
                                        ("amax", "float32"), ("amin", "float32"),
                                        ("mean", "int32"), ("amin", "int32")])   # an int mean rounds down
def test_scatter_reduce(reduce, include_self, dt):
  base = rng.integers(-5, 6, (4, 3)).astype(dt)
  idx = np.array([[0, 1, 1], [0, 3, 1], [3, 3, 1]])
  src = rng.integers(-5, 6, (3, 3)).astype(dt)
  out = T(base).scatter_reduce(0, T(idx), T(src), reduce, include_self=include_self)
  check(out, ref_scatter_reduce(base, 0, idx, src, reduce, include_self), rtol=1e-6)


def test_scatter_reduce_amax_nan_and_errors():
  base = np.array([1., 2., 3.], np.float32)
  src = np.array([NAN, 5., -1.], np.float32)
  check(T(base).scatter_reduce(0, T(np.array([0, 0, 2])), T(src), "amax"), np.array([NAN, 2., 3.], np.float32))
  with pytest.raises(ValueError, match="reduce"): T(base).scatter_reduce(0, T(np.array([0])), T(src), "max")
  with pytest.raises(ValueError, match="reduce"): T(base).scatter(0, T(np.array([0])), T(src), reduce="sum")
  with pytest.raises(IndexError, match="index 3"): T(base).scatter(0, [3], T(src))
  with pytest.raises(TypeError, match="exactly one"): T(base).scatter(0, [1])
  check(T(base).scatter(0, T(np.zeros((0,), np.int32)), T(src)), base)


# ---------------------------------------------------------------- masks

def test_masked_fill():
  a = rng.standard_normal((3, 4)).astype(np.float32)
  m = rng.integers(0, 2, (4,)).astype(bool)
  check(T(a).masked_fill(T(m), -7.5), np.where(m, np.float32(-7.5), a))
  check(T(a).masked_fill(T(m), T(np.float32(2))), np.where(m, np.float32(2), a))
  i = np.arange(12, dtype=np.int32).reshape(3, 4)
  check(T(i).masked_fill(T(m), 2.7), np.where(m, 2, i).astype(np.int32))    # the value takes self's dtype
  check(T(i[0]).masked_fill(T(m.reshape(1, 4) & np.ones((2, 1), bool)), 0), np.where(m, 0, np.tile(i[0], (2, 1))))
  with pytest.raises(TypeError, match="bool"): T(a).masked_fill(T(m.astype(np.int32)), 1)
  with pytest.raises(ValueError): T(a).masked_fill(T(m), T(np.ones(2, np.float32)))


def test_masked_select():
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  m = a % 3 == 1
  check(T(a).masked_select(T(m)), a[m])
  check(T(a).masked_select(T(np.array([True, False, False, True]))), a[:, [0, 3]].reshape(-1))
  check(T(a[0]).masked_select(T(np.array([[True], [False]]))), np.tile(a[0], (2, 1))[[0]].reshape(-1))
  check(T(a).masked_select(T(np.zeros((3, 4), bool))), np.zeros((0,), np.float32))
  check(T(a.astype(np.int8)).masked_select(T(m)), a[m].astype(np.int8))


def test_nonzero():
  a = np.array([[0., 1., NAN], [0., 0., -2.]], np.float32)
  check(T(a).nonzero(), np.argwhere(a).astype(np.int32))
  for got, want in zip(T(a).nonzero(as_tuple=True), np.nonzero(a)): check(got, want.astype(np.int32))
  check(T(np.zeros((2, 3), bool)).nonzero(), np.zeros((0, 2), np.int32))
  b = rng.integers(0, 2, (2, 3, 2)).astype(bool)
  check(T(b).nonzero(), np.argwhere(b).astype(np.int32))
  check(T(np.float32(3)).nonzero(), np.zeros((1, 0), np.int32))
  check(T(np.float32(0)).nonzero(), np.zeros((0, 0), np.int32))
  check(T(np.int32(5)).nonzero(as_tuple=True)[0], np.array([0], np.int32))


# ---------------------------------------------------------------- triangles and diagonals

@pytest.mark.parametrize("k", [-2, 0, 1, 9])
def test_tril_triu(k):
  a = rng.standard_normal((2, 3, 5)).astype(np.float32)
  check(T(a).tril(k), np.tril(a, k))
  check(T(a).triu(k), np.triu(a, k))
  check(T(a[0].T).triu(diagonal=k), np.triu(a[0].T, k))
  b = rng.integers(0, 2, (4, 3)).astype(bool)
  check(T(b).tril(k), np.tril(b, k))


def test_tril_errors_and_empty():
  check(T(np.zeros((0, 3), np.int32)).tril(), np.zeros((0, 3), np.int32))
  with pytest.raises(ValueError, match="at least 2 dims"): T(np.ones(3, np.float32)).tril()
  with pytest.raises(TypeError): T(np.ones((3, 3), np.float32)).triu(0.5)


@pytest.mark.parametrize("k", [-3, 0, 2])
def test_diag(k):
  v = np.array([1.5, -2., 3.], np.float32)
  check(T(v).diag(k), np.diag(v, k))
  m = rng.standard_normal((3, 5)).astype(np.float32)
  check(T(m).diag(k), np.diag(m, k))
  check(T(np.arange(3, dtype=np.int32)).diag(k), np.diag(np.arange(3, dtype=np.int32), k))


def test_diag_empty_and_errors():
  check(T(np.zeros((0,), np.float32)).diag(), np.zeros((0, 0), np.float32))
  with pytest.raises(ValueError, match="1-D or 2-D"): T(np.zeros((2, 2, 2), np.float32)).diag()


@pytest.mark.parametrize("offset, d1, d2", [(0, 0, 1), (1, 1, 2), (-1, 2, 0), (2, -1, -3), (-4, 0, 2), (9, 0, 1)])
def test_diagonal(offset, d1, d2):
  a = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
  check(T(a).diagonal(offset, d1, d2), np.diagonal(a, offset, d1, d2))


def test_diagonal_errors():
  with pytest.raises(ValueError, match="both"): T(np.ones((2, 2), np.float32)).diagonal(0, 1, -1)
  with pytest.raises(IndexError): T(np.ones((2, 2), np.float32)).diagonal(0, 0, 2)


# ---------------------------------------------------------------- roll, unfold, repeat_interleave, meshgrid

@pytest.mark.parametrize("shifts, dims", [(1, 0), (-2, 1), (7, -1), ((1, -3), (0, 2)), ((2, 2), (1, 1)), (5, None),
                                          (-13, None), ((4,), None), (0, 1)])
def test_roll(shifts, dims):
  a = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
  check(T(a).roll(shifts, dims), np.roll(a, shifts, dims))


def test_roll_empty_errors():
  check(T(np.zeros((0, 2), np.float32)).roll(3, 0), np.zeros((0, 2), np.float32))
  with pytest.raises(ValueError, match="same length"): T(as_widest(np.ones((2, 2)))).roll((1, 2), 0)
  with pytest.raises(ValueError, match="one int"): T(as_widest(np.ones((2, 2)))).roll((1, 2))


@pytest.mark.parametrize("dim, size, step", [(0, 3, 1), (0, 2, 3), (1, 4, 2), (-1, 1, 1), (1, 5, 1), (2, 2, 5),
                                             (1, 5, 7)])
def test_unfold(dim, size, step):
  a = np.arange(3 * 5 * 4, dtype=np.float32).reshape(3, 5, 4)
  if size > a.shape[dim]: size = a.shape[dim]
  check(T(a).unfold(dim, size, step), ref_unfold(a, dim % 3, size, step))


def test_unfold_edges():
  a = np.arange(6, dtype=np.int32)
  check(T(a).unfold(0, 0, 2), np.zeros((4, 0), np.int32))   # torch: (n - 0) // step + 1 empty windows
  check(T(np.float32(2)).unfold(0, 1, 1), np.array([2.], np.float32))
  with pytest.raises(ValueError, match="larger"): T(a).unfold(0, 7, 1)
  with pytest.raises(ValueError, match="step"): T(a).unfold(0, 2, 0)


def test_repeat_interleave():
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  check(T(a).repeat_interleave(2), np.repeat(a, 2))
  check(T(a).repeat_interleave(3, dim=0), np.repeat(a, 3, 0))
  check(T(a).repeat_interleave(0, dim=-1), np.repeat(a, 0, -1))
  reps = np.array([2, 0, 3])
  check(T(a).repeat_interleave(T(reps), dim=1), np.repeat(a, reps, 1))
  check(T(a).repeat_interleave(T(reps), dim=1, output_size=5), np.repeat(a, reps, 1))
  check(T(a).repeat_interleave(T(np.array([4])), dim=0), np.repeat(a, 4, 0))
  check(T(a).repeat_interleave([1, 2], dim=0), np.repeat(a, [1, 2], 0))
  check(T(np.int32(7)).repeat_interleave(2), np.array([7, 7], np.int32))
  with pytest.raises(ValueError, match="non-negative"): T(a).repeat_interleave(T(np.array([1, -1, 1])), dim=1)
  with pytest.raises(ValueError, match="one per element"): T(a).repeat_interleave(T(np.array([1, 1])), dim=1)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
  xs = [np.arange(2, dtype=np.float32), np.arange(3, dtype=np.int32) * 10, np.array([5, 6, 7, 8], np.int8)]
  for n in (1, 2, 3):
    got = Tensor.meshgrid(*[T(x) for x in xs[:n]], indexing=indexing)
    want = np.meshgrid(*xs[:n], indexing=indexing)
    assert len(got) == n
    for g, w in zip(got, want): check(g, w)
  got = Tensor.meshgrid([T(xs[0]), T(np.float32(4))], indexing=indexing)
  for g, w in zip(got, np.meshgrid(xs[0], np.float32(4), indexing=indexing)): check(g, w)
  with pytest.raises(ValueError, match="indexing"): Tensor.meshgrid(T(xs[0]), indexing="ji")
  with pytest.raises(ValueError, match="1-D"): Tensor.meshgrid(T(as_widest(np.ones((2, 2)))))


# ---------------------------------------------------------------- gradients (float64, central differences: skipped on
# a device without float64)

H = 1e-6


def distinct(*shape):
  """Values at least 0.1 apart (max/sort-like ops are differentiable only without ties)."""
  n = math.prod(shape)
  return (rng.permutation(n) * 0.25 - n * 0.125 + rng.uniform(-0.05, 0.05, n)).reshape(shape)


def gradcheck(fn, ref, inputs, wrt=0, rtol=1e-6, atol=1e-8):
  """d sum(fn(...) * W) / d inputs[wrt] from backward() against central differences of the reference `ref` (numpy,
  float64); the forward value is checked against ref too. Non-float inputs (indices, masks) are held fixed."""
  ts = [Tensor(a, dtype=dtypes.float64, requires_grad=(i == wrt)) if np.asarray(a).dtype == np.float64 else Tensor(a)
        for i, a in enumerate(inputs)]
  out = fn(*ts)
  w = rng.standard_normal(out.shape)
  (out * Tensor(w, dtype=dtypes.float64)).sum().backward()     # before out is realized (that cuts its graph)
  check(out, ref(*inputs))
  got = ts[wrt].grad.numpy()
  numeric = np.zeros_like(inputs[wrt])
  for j in range(numeric.size):
    plus = [np.array(a, copy=True) for a in inputs]; minus = [np.array(a, copy=True) for a in inputs]
    plus[wrt].reshape(-1)[j] += H; minus[wrt].reshape(-1)[j] -= H
    numeric.reshape(-1)[j] = (np.sum(ref(*plus) * w) - np.sum(ref(*minus) * w)) / (2 * H)
  np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol)


GRAD_CASES = {
  "cumprod": (lambda x: x.cumprod(1), lambda x: np.cumprod(x, 1), [rng.uniform(-2, 2, (2, 5))]),
  "cumprod_zeros": (lambda x: x.cumprod(-1), lambda x: np.cumprod(x, -1),
                    [np.array([[1.5, 0., 2., -1., 0., 3.], [0., 0.5, -2., 1.5, 2., 1.], [2., -1., 0.5, 0., 1., 2.]])]),
  "cummax": (lambda x: x.cummax(0).values, lambda x: ref_cum_extreme(x, 0, True)[0], [distinct(5, 2)]),
  "cummin": (lambda x: x.cummin(1)[0], lambda x: ref_cum_extreme(x, 1, False)[0], [distinct(2, 5)]),
  "logcumsumexp": (lambda x: x.logcumsumexp(1), lambda x: np.logaddexp.accumulate(x, 1),
                   [np.array([[0.5, 30., -2., 31., -40.], [-1., 0., 1., 2., 3.]])]),
  "sort": (lambda x: x.sort(1, descending=True).values, lambda x: ref_sort(x, 1, True)[0], [distinct(2, 5)]),
  "topk": (lambda x: x.topk(2, dim=0).values, lambda x: ref_sort(x, 0, True)[0][:2], [distinct(4, 3)]),
  "gather": (lambda x, i: x.gather(1, i), lambda x, i: ref_gather(x, 1, i),
             [rng.standard_normal((3, 4)), np.array([[0, 0, 3], [2, 1, 2]])]),
  "scatter_src": (lambda b, i, s: b.scatter(1, i, s), lambda b, i, s: ref_scatter_reduce(b, 1, i, s),
                  [rng.standard_normal((2, 4)), np.array([[3, 0, 3], [1, 2, 0]]), rng.standard_normal((2, 3))]),
  "masked_fill": (lambda x, m: x.masked_fill(m, 0.5), lambda x, m: np.where(m, 0.5, x),
                  [rng.standard_normal((3, 4)), rng.integers(0, 2, (3, 4)).astype(bool)]),
  "masked_fill_value": (lambda v, x, m: x.masked_fill(m, v), lambda v, x, m: np.where(m, v, x),
                        [np.array(1.25), rng.standard_normal((3, 4)), rng.integers(0, 2, (4,)).astype(bool)]),
  "tril": (lambda x: x.tril(-1), lambda x: np.tril(x, -1), [rng.standard_normal((3, 4))]),
  "triu": (lambda x: x.triu(1), lambda x: np.triu(x, 1), [rng.standard_normal((2, 3, 3))]),
  "diag_1d": (lambda x: x.diag(1), lambda x: np.diag(x, 1), [rng.standard_normal(3)]),
  "diag_2d": (lambda x: x.diag(-1), lambda x: np.diag(x, -1), [rng.standard_normal((4, 3))]),
  "diagonal": (lambda x: x.diagonal(1, 0, 2), lambda x: np.diagonal(x, 1, 0, 2), [rng.standard_normal((3, 2, 4))]),
  "roll": (lambda x: x.roll((1, -2), (0, 1)), lambda x: np.roll(x, (1, -2), (0, 1)), [rng.standard_normal((3, 4))]),
  "unfold": (lambda x: x.unfold(1, 3, 2), lambda x: ref_unfold(x, 1, 3, 2), [rng.standard_normal((2, 6))]),
  "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=1), lambda x: np.repeat(x, 2, 1),
                        [rng.standard_normal((2, 3))]),
  "repeat_interleave_tensor": (lambda x, r: x.repeat_interleave(r, dim=0), lambda x, r: np.repeat(x, r, 0),
                               [rng.standard_normal((3, 2)), np.array([2, 0, 3])]),
}


@pytest.mark.needs_float64
@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradient(name):
  fn, ref, inputs = GRAD_CASES[name]
  gradcheck(fn, ref, inputs)


def test_gradient_of_scatter_self_is_masked():
  """scatter overwrites: self gets no gradient where src was written (torch's rule)."""
  base = Tensor(as_widest(np.ones((2, 3))), requires_grad=True)       # float64, or float32 on a device without it
  base.scatter(1, T(np.array([[2], [0]])), T(as_widest(np.zeros((2, 1))))).sum().backward()
  np.testing.assert_array_equal(base.grad.numpy(), [[1, 1, 0], [0, 1, 1]])


# ---------------------------------------------------------------- on the emulated GPUs

@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_on_emulated_gpus(device):
  from test_reliability import _emulated
  _emulated(device)
  a = np.array([[3., 1., NAN, 1., 0.], [2., -1., 2., 0., 5.]], np.float32)
  idx = np.array([[4, 0], [1, 1]])
  t = Tensor(a, device=device)
  v, i = t.sort(1)
  outs = {"sort_values": v, "sort_indices": i, "gather": t.gather(1, Tensor(idx, device=device)),
          "scatter": t.scatter(1, Tensor(idx, device=device), Tensor(np.full((2, 2), 9., np.float32), device=device)),
          "cumprod": t.cumprod(1), "roll": t.roll(2, 1), "tril": t.tril(1)}
  Tensor.realize(*outs.values())
  want_v, want_i = ref_sort(a, 1)
  check(outs["sort_values"], want_v); check(outs["sort_indices"], want_i)
  check(outs["gather"], ref_gather(a, 1, idx))
  check(outs["scatter"], ref_scatter_reduce(a, 1, idx, np.full((2, 2), 9., np.float32)))
  check(outs["cumprod"], np.cumprod(a, 1))
  check(outs["roll"], np.roll(a, 2, 1))
  check(outs["tril"], np.tril(a, 1))
  assert all(o.device == device for o in outs.values())


def test_lazy_until_realized():
  """Everything but nonzero and masked_select only builds a graph: each result still has kernels to run."""
  x = T(A)
  outs = [x.sort().values, x.topk(2).indices, x.cumprod(1), x.cummax(0).values, x.logcumsumexp(1),
          x.gather(1, T(np.zeros((3, 2), np.int32))), x.scatter(1, T(np.zeros((3, 2), np.int32)), 1.0), x.roll(1, 1),
          x.unfold(1, 2, 2), x.repeat_interleave(2), x.tril(), x.diagonal(), x.masked_fill(x > 0, 0.0)]
  assert all(o.schedule() for o in outs)
