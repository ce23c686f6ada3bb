"""Scans, sorting, gathering and scattering, masks, triangles and diagonals (torch names and defaults).

`SelectionOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph. Two ops cannot be: `nonzero` and `masked_select` have an output
shape that depends on the values, so they compute their input (or mask) and read it back, as torch synchronizes for
them; `repeat_interleave` with a tensor of repeats reads back one total unless `output_size` is given.

How the data-dependent ops are built (there is no indexed load at this level, so every "pick" is a one-hot match):
- scans (cumprod, cummax, cummin, logcumsumexp) reduce over a lower-triangular (n, n) mask, as cumsum does: O(n^2)
  work per scanned row in one or two kernels;
- sort/argsort/topk rank each element by counting (the elements that sort before it, plus the equal ones before it
  in the input, so equal keys keep their order: torch's stable=True) and move it to its rank with a one-hot match:
  O(n^2) per row;
- gather, scatter, scatter_reduce, index_select and repeat_interleave with a tensor of repeats match every index
  against every position of the indexed dim: O(numel(index) * size of that dim).

Indices come back as int32 (torch gives int64), as `argmax` does here.
"""
from __future__ import annotations
import math
from collections import namedtuple

import numpy as np

from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import Ops
from .composite import ShapeError, ArgumentError, DTypeError, dtype_arg, _norm_dim, _is_scalar, _is_size, sum_dtype

# what torch.return_types gives: a tuple that also has .values and .indices
SortResult = namedtuple("sort", ["values", "indices"])
TopkResult = namedtuple("topk", ["values", "indices"])
CummaxResult = namedtuple("cummax", ["values", "indices"])
CumminResult = namedtuple("cummin", ["values", "indices"])

_SCATTER_REDUCE = ("sum", "prod", "mean", "amax", "amin")


def _int_arg(value, name: str, op: str, low: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{op}: {name} must be an int, got {value!r}")
  if low is not None and value < low:
    raise ArgumentError(f"{op}: {name} must be at least {low}, got {value}")
  return int(value)


def _const_bounds(t) -> tuple[int, int] | None:
  """(min, max) of an index tensor when they are known without computing it (a constant, maybe broadcast)."""
  u = t.uop.base
  return (int(u.arg), int(u.arg)) if u.op is Ops.CONST else None


class SelectionOps:
  """Mixed into `Tensor`."""

  # ---------------------------------------------------------------- helpers

  def _move_dim_last(self, dim, op: str):
    """(self with `dim` moved to the end, the permutation that puts it back)."""
    ax = _norm_dim(dim, self.ndim, op, self.shape)
    order = [i for i in range(self.ndim) if i != ax] + [ax]
    return self.permute(*order), [order.index(i) for i in range(self.ndim)]

  def _lower_triangle(self, n: int):
    """(n, n) bool mask, [i, j] = j <= i: row i of a scan reduces over the inputs up to i."""
    ar = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    return ar.reshape(n, 1) >= ar.reshape(1, n)

  def _int_index(self, index, op: str):
    """An index (Tensor, list or numpy array of ints) as an int Tensor on self's device, and its (min, max) when known
    without computing it: host arrays and constants."""
    if isinstance(index, SelectionOps):
      if not index.dtype.is_int:
        raise DTypeError(f"{op}: index must be an integer tensor, got {index.dtype.name}")
      if index.device != self.device:
        raise ValueError(f"{op}: index is on {index.device}, the tensor on {self.device}; move one with .to()")
      return index, (_const_bounds(index) if index.numel() else None)
    arr = np.asarray(index)
    if arr.size == 0: arr = arr.astype(np.int32)
    if arr.dtype.kind not in "iu": raise DTypeError(f"{op}: index must hold ints, got {arr.dtype} values")
    bounds = (int(arr.min()), int(arr.max())) if arr.size else None
    big = arr.size and (arr.min() < -2**31 or arr.max() >= 2**31)
    return type(self)(arr.astype(np.int64 if big else np.int32), device=self.device), bounds

  @staticmethod
  def _check_in_range(op: str, bounds, size: int, dim: int, shape):
    """torch's rule for gather/scatter/index_select: every index in [0, size) (no negative indices)."""
    if bounds is None: return
    lo, hi = bounds
    if lo < 0 or hi >= size:
      raise IndexError(f"{op}: index {lo if lo < 0 else hi} is out of bounds for dim {dim} with size {size} "
                       f"(tensor of shape {tuple(shape)}; indices must be in [0, {size}))")

  def _zero_of(self):
    return False if self.dtype.is_bool else 0

  # ---------------------------------------------------------------- scans

  def cumprod(self, dim=0, dtype=None, *, axis=None):
    """Running product along `dim` (None: over the flattened tensor, as numpy; `axis` is tinygrad's name). The dtype
    follows numpy, as for cumsum: bool and ints narrower than 64 bits give int64 (unsigned: uint64); `dtype` casts
    the input first.

    A product over a lower-triangular mask: O(n^2) per row. For floats the first zero of a row is taken out of the
    product and multiplied back in, so the gradient is right with zeros (the product of the others), as torch."""
    if axis is not None: dim = axis
    if dim is None: return self.reshape(-1).cumprod(0, dtype)
    ax = _norm_dim(dim, self.ndim, "cumprod", self.shape)
    dt = dtype_arg(dtype, "cumprod") if dtype is not None else sum_dtype(self.dtype)
    x = self.cast(dt)
    if self.ndim == 0 or self.shape[ax] == 0: return x
    if dt in (dtypes.float16, dtypes.bfloat16): return x.cast(dtypes.float32).cumprod(ax).cast(dt)
    x, inverse = x._move_dim_last(ax, "cumprod")
    n = x.shape[-1]
    tri = self._lower_triangle(n)
    if not dt.is_float: return tri.where(x.unsqueeze(-2), 1).prod(-1, dtype=dt).permute(*inverse)
    j = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    z = (x == 0).where(j, n).min(-1, keepdim=True)                # the first zero of each row (n: none)
    first = j == z
    # the values after the first zero only matter for inf/NaN (0 * inf); their gradient is 0, so they are detached
    u = first.where(1.0, (j < z).where(x, x.detach()))
    rest = tri.where(u.unsqueeze(-2), 1.0).prod(-1)
    zero = first.where(x, 0.0).sum(-1, keepdim=True)               # the first zero itself, with its gradient
    return ((j >= z).where(zero, 1.0) * rest).permute(*inverse)

  def _cum_extreme(self, dim, use_max: bool, op: str):
    """(running max or min, index of the last element equal to it): torch's cummax/cummin, where NaN wins and then
    every later NaN takes the index. The values are gathered at the indices, so the gradient goes to that element."""
    result = CummaxResult if use_max else CumminResult
    ax = _norm_dim(dim, self.ndim, op, self.shape)
    if self.ndim == 0: return result(self, self._scalar(0, dtypes.int32))
    if self.shape[ax] == 0: return result(self, self.full_like(0, dtype=dtypes.int32))
    x, inverse = self._move_dim_last(ax, op)
    n = x.shape[-1]
    tri = self._lower_triangle(n)
    row = x.unsqueeze(-2)                                          # [..., i, j] = x[j]
    masked = tri.where(row, x.dtype.min if use_max else x.dtype.max)
    run = masked.max(-1, keepdim=True) if use_max else masked.min(-1, keepdim=True)
    hit = row == run
    if x.dtype.is_float: hit = hit | (row != row)
    j = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    idx = (tri & hit).where(j, -1).max(-1)
    values = (idx.unsqueeze(-1) == j).where(row, self._zero_of())._acc_sum(-1)
    if values.dtype != self.dtype: values = values.cast(self.dtype)
    return result(values.permute(*inverse), idx.permute(*inverse))

  def cummax(self, dim=0, *, axis=None):
    """(values, indices): the running maximum along `dim` (`axis`: tinygrad's name) and where it was seen last (ties:
    the latest index; NaN propagates, as torch). O(n^2) per row."""
    return self._cum_extreme(dim if axis is None else axis, True, "cummax")

  def cummin(self, dim=0, *, axis=None):
    """(values, indices): the running minimum along `dim`, as cummax."""
    return self._cum_extreme(dim if axis is None else axis, False, "cummin")

  def logcumsumexp(self, dim=0, *, axis=None):
    """log(cumsum(exp(x))) along `dim` (default 0, as tinygrad; `axis` is its name), stable: row i is shifted by the
    running max up to i. Ints compute in float32 (torch raises for them), 16-bit floats in float32. O(n^2) per row."""
    if axis is not None: dim = axis
    x = self._float()
    ax = _norm_dim(dim, self.ndim, "logcumsumexp", self.shape)
    if self.ndim == 0 or self.shape[ax] == 0: return x
    if x.dtype in (dtypes.float16, dtypes.bfloat16): return x.cast(dtypes.float32).logcumsumexp(ax).cast(x.dtype)
    x, inverse = x._move_dim_last(ax, "logcumsumexp")
    tri = self._lower_triangle(x.shape[-1])
    row = x.unsqueeze(-2)
    run = tri.where(row, -math.inf).max(-1, keepdim=True)
    shift = (run.abs() == math.inf).where(0.0, run).detach()     # as logsumexp: an infinite max shifts by 0
    # masked before exp, so an entry past i is exp(-inf) = 0 and its gradient 0 (never 0 * inf)
    total = tri.where(row - shift, -math.inf).exp().sum(-1)
    return (total.log() + shift.squeeze(-1)).permute(*inverse)

  # ---------------------------------------------------------------- sorting

  @staticmethod
  def _before(a, b):
    """a sorts before b in ascending order: a < b, NaN last (torch's order)."""
    less = a < b
    return less | ((b != b) & (a == a)) if a.dtype.is_float else less

  @staticmethod
  def _same_key(a, b):
    same = a == b
    return same | ((a != a) & (b != b)) if a.dtype.is_float else same

  def _sort_rank(self, descending: bool):
    """Where each element of the last dim goes in a stable sort: the count of elements that sort before it plus the
    equal ones before it in the input (int32, no gradient)."""
    n = self.shape[-1]
    me, other = self.unsqueeze(-1), self.unsqueeze(-2)             # [..., i, j]: element i against element j
    before = self._before(me, other) if descending else self._before(other, me)
    j = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    earlier = j.reshape(1, n) < j.reshape(n, 1)
    return (before | (self._same_key(me, other) & earlier)).cast(dtypes.int32)._acc_sum(-1)

  def _place_by_rank(self, rank, k: int):
    """(values, indices) of the elements whose rank is 0..k-1 (last dim)."""
    n = self.shape[-1]
    slot = type(self).arange(k, dtype=dtypes.int32, device=self.device).reshape(k, 1)
    pick = rank.unsqueeze(-2) == slot                              # [..., r, i]: element i goes to slot r
    values = pick.where(self.unsqueeze(-2), self._zero_of())._acc_sum(-1)
    if values.dtype != self.dtype: values = values.cast(self.dtype)
    indices = pick.where(type(self).arange(n, dtype=dtypes.int32, device=self.device), 0)._acc_sum(-1)
    return values, indices

  def sort(self, dim=-1, descending=False, stable=False):
    """(values, indices) sorted along `dim`. Always stable (equal keys keep their input order, torch's stable=True);
    NaN sorts as the largest value. O(n^2) per row (a counting sort by comparisons)."""
    ax = _norm_dim(dim, self.ndim, "sort", self.shape)
    if self.ndim == 0: return SortResult(self, self._scalar(0, dtypes.int32))
    x, inverse = self._move_dim_last(ax, "sort")
    values, indices = x._place_by_rank(x._sort_rank(bool(descending)), x.shape[-1])
    return SortResult(values.permute(*inverse), indices.permute(*inverse))

  def argsort(self, dim=-1, descending=False, stable=False):
    """The indices of sort(dim, descending) (stable, NaN largest)."""
    return self.sort(dim, descending, stable).indices

  def topk(self, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (largest=False: smallest) along `dim`, in sorted order whatever `sorted`
    says; equal values are taken in input order and NaN counts as the largest, as torch. O(n^2 + n*k) per row."""
    ax = _norm_dim(dim, self.ndim, "topk", self.shape)
    n = self.shape[ax] if self.ndim else 1
    k = _int_arg(k, "k", "topk")
    if not 0 <= k <= n:
      raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {tuple(self.shape)})")
    if self.ndim == 0:
      values, indices = self.reshape(1).topk(k)
      return TopkResult(values.reshape(()), indices.reshape(())) if k else TopkResult(values, indices)
    x, inverse = self._move_dim_last(ax, "topk")
    values, indices = x._place_by_rank(x._sort_rank(bool(largest)), k)
    return TopkResult(values.permute(*inverse), indices.permute(*inverse))

  # ---------------------------------------------------------------- gather and scatter

  def _gather_args(self, dim, index, op: str):
    index, bounds = self._int_index(index, op)
    ax = _norm_dim(dim, self.ndim, op, self.shape)
    if index.ndim != self.ndim:
      raise ShapeError(f"{op}: index of shape {tuple(index.shape)} must have as many dims as the tensor of shape "
                       f"{tuple(self.shape)}")
    for d, (i, s) in enumerate(zip(index.shape, self.shape)):
      if d != ax and i > s:
        raise ShapeError(f"{op}: index of shape {tuple(index.shape)} is larger than the tensor of shape "
                         f"{tuple(self.shape)} in dim {d} (only dim {ax} may differ)")
    if index.numel(): self._check_in_range(op, bounds, self.shape[ax] if self.ndim else 1, ax, self.shape)
    return ax, index

  def gather(self, dim, index):
    """out[i][j][k] = self[index[i][j][k]][j][k] for dim 0 (torch.gather): the output has index's shape, which may
    be smaller than self's in every dim but `dim`. Indices must be in [0, size of dim): lists, numpy arrays and constant
    tensors are checked (IndexError); other index tensors are not (that would wait for and read back their values),
    and an out-of-range entry there gives 0."""
    ax, index = self._gather_args(dim, index, "gather")
    if self.ndim == 0: return (index == 0).where(self, self._zero_of()).cast(self.dtype)
    x = self.shrink([None if d == ax else (0, s) for d, s in enumerate(index.shape)])
    match = index.unsqueeze(ax + 1) == self._mask_dim(self.shape[ax], ax + 1, self.ndim + 1)
    out = match.where(x.unsqueeze(ax), self._zero_of())._acc_sum(ax + 1)
    return out if out.dtype == self.dtype else out.cast(self.dtype)

  def index_select(self, dim, index):
    """self along `dim` at the positions of the 1-D `index` (torch.index_select); indices checked as in gather."""
    index, bounds = self._int_index(index, "index_select")
    if index.ndim > 1: raise ShapeError(f"index_select: index must be 1-D, got shape {tuple(index.shape)}")
    ax = _norm_dim(dim, self.ndim, "index_select", self.shape)
    x = self.reshape(1) if self.ndim == 0 else self
    if index.numel(): self._check_in_range("index_select", bounds, x.shape[ax], ax, self.shape)
    out = x._take_along(ax, index.reshape(-1))
    return out.reshape(()) if self.ndim == 0 and index.ndim == 0 else out

  def _take_along(self, ax: int, index):
    """self at the positions of the 1-D int tensor `index` along dim `ax` (one-hot match, no bounds check)."""
    n, k = self.shape[ax], index.shape[0]
    shape = [1] * (self.ndim + 1)
    shape[ax] = k
    match = index.reshape(*shape) == self._mask_dim(n, ax + 1, self.ndim + 1)
    out = match.where(self.unsqueeze(ax), self._zero_of())._acc_sum(ax + 1)
    return out if out.dtype == self.dtype else out.cast(self.dtype)

  def _scatter_parts(self, dim, index, src, op: str):
    """The pieces every scatter shares, in the layout index.shape[:ax] + (m, n) + index.shape[ax+1:] where m runs
    over index's positions along dim and n over self's: (ax, match, src there, position m, pad back to self)."""
    ax, index = self._gather_args(dim, index, op)
    if isinstance(src, SelectionOps):
      if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise ShapeError(f"{op}: src of shape {tuple(src.shape)} must have the tensor's {self.ndim} dims and be at "
                         f"least as large as index of shape {tuple(index.shape)} in every dim")
      if src.dtype != self.dtype:
        raise DTypeError(f"{op}: src has dtype {src.dtype.name}, the tensor {self.dtype.name}; cast one (as torch, "
                         "no implicit conversion)")
      src = src.shrink([(0, s) for s in index.shape]).cast(self.dtype)
    elif _is_scalar(src): src = type(self).full(tuple(index.shape), src, dtype=self.dtype, device=self.device)
    else: raise TypeError(f"{op}: src must be a Tensor or a Python scalar, got {type(src).__name__}")
    nd = self.ndim + 1
    match = index.unsqueeze(ax + 1) == self._mask_dim(self.shape[ax], ax + 1, nd)
    pos = self._mask_dim(index.shape[ax], ax, nd)
    pads = [None if d == ax else (0, s - i) for d, (i, s) in enumerate(zip(index.shape, self.shape))]
    return ax, match, src.unsqueeze(ax + 1), pos, lambda t: t.pad(pads)

  def scatter(self, dim, index, src=None, value=None, reduce=None):
    """A copy of self with self[index[i][j]][j] = src[i][j] for dim 0 (torch.scatter; `src` may be a scalar, or
    give `value=`). Where an index repeats, the last write wins (torch leaves that order undefined). reduce="add"
    or "multiply" combines with self instead. Indices are checked as in gather; an out-of-range entry of an unchecked
    index tensor writes nothing."""
    if (src is None) == (value is None): raise TypeError("scatter: give exactly one of src and value")
    src = value if src is None else src
    if reduce is not None:
      if reduce not in ("add", "multiply"):
        raise ArgumentError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
      return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
    if self.ndim == 0: return self._scatter_0d(dim, index, src, "scatter", lambda x, i, s: x.scatter(0, i, s))
    ax, match, src, pos, pad = self._scatter_parts(dim, index, src, "scatter")
    if match.numel() == 0: return self
    last = match.where(pos, -1).max(ax, keepdim=True)              # the last position m writing to each place
    written = pad((last >= 0).squeeze(ax))
    value = (match & (pos == last)).where(src, self._zero_of())._acc_sum(ax)
    return written.where(pad(value.cast(self.dtype)), self)

  def _scatter_0d(self, dim, index, src, op: str, fn):
    """A scatter into a 0-d tensor, as the same scatter into its 1-element view."""
    self._gather_args(dim, index, op)
    index = self._int_index(index, op)[0].reshape(1)
    return fn(self.reshape(1), index, src.reshape(1) if isinstance(src, SelectionOps) else src).reshape(())

  def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    """torch.scatter_reduce: every src[i][j] (dim 0) is combined into self[index[i][j]][j] with reduce "sum", "prod",
    "mean", "amax" or "amin"; include_self=False leaves self's value out of the places written to. "mean" of ints
    rounds down (as torch); amax/amin propagate NaN. Indices are checked as in gather."""
    if reduce not in _SCATTER_REDUCE:
      raise ArgumentError(f"scatter_reduce: reduce must be one of {', '.join(_SCATTER_REDUCE)}, got {reduce!r}")
    if self.ndim == 0:
      return self._scatter_0d(dim, index, src, "scatter_reduce",
                              lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self))
    ax, match, src, _, pad = self._scatter_parts(dim, index, src, "scatter_reduce")
    if match.numel() == 0: return self
    count = match.cast(dtypes.int32)._acc_sum(ax)
    written = pad(count > 0)
    if reduce in ("sum", "mean"):
      red = match.where(src, self._zero_of())._acc_sum(ax).cast(self.dtype)
      if reduce == "sum": out = self + pad(red) if include_self else pad(red)
      else:
        total = pad(red) + self if include_self else pad(red)
        n = pad(count) + 1 if include_self else pad(count).maximum(1)
        out = (total / n).cast(self.dtype) if self.dtype.is_float else (total // n).cast(self.dtype)
    elif reduce == "prod":
      red = pad(match.where(src, 1).prod(ax, dtype=self.dtype))
      out = self * red if include_self else red
    else:
      fill = self.dtype.min if reduce == "amax" else self.dtype.max
      masked = match.where(src, fill)
      red = pad(masked.max(ax) if reduce == "amax" else masked.min(ax))
      out = (self.maximum(red) if reduce == "amax" else self.minimum(red)) if include_self else red
    return written.where(out.cast(self.dtype), self)

  # ---------------------------------------------------------------- masks

  def masked_fill(self, mask, value):
    """self with `value` where the bool `mask` (broadcast against self) is True. `value` is a scalar or a
    one-element tensor (which gets its gradient) and is cast to self's dtype, as torch."""
    if not isinstance(mask, SelectionOps) or not mask.dtype.is_bool:
      raise TypeError(f"masked_fill: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if isinstance(value, SelectionOps):
      if value.numel() != 1:
        raise ShapeError(f"masked_fill: value must be a scalar or a one-element tensor, got shape {tuple(value.shape)}")
      value = value.reshape(()).cast(self.dtype)
    elif _is_scalar(value): value = self._scalar(value, self.dtype)
    else: raise TypeError(f"masked_fill: value must be a scalar or a tensor, got {type(value).__name__}")
    return mask.where(value, self)

  def masked_select(self, mask, size=None, fill_value=0):
    """The elements of self where the bool `mask` (broadcast together) is True, as a 1-D tensor in row-major
    order. The output's length depends on the mask, so the mask is computed and read back here (torch synchronizes
    too); self stays lazy and gets its gradient. The pick is a one-hot match: O(numel * selected).

    With `size` (tinygrad's form) nothing is read back: the output has `size` elements, the first selected ones,
    then `fill_value` (cast to self's dtype) where fewer are selected."""
    if not isinstance(mask, SelectionOps) or not mask.dtype.is_bool:
      raise TypeError(f"masked_select: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    shape = type(self)._broadcast_shape(tuple(self.shape), tuple(mask.shape))
    if size is not None:
      flat, keep = self.expand(*shape).reshape(-1), mask.expand(*shape).reshape(-1)
      pick, found = keep._first_true(_int_arg(size, "size", "masked_select", low=0))
      fill = self._scalar(fill_value, self.dtype)
      return found.where(pick.where(flat.unsqueeze(0), self._zero_of()).any(-1) if self.dtype.is_bool else
                         pick.where(flat.unsqueeze(0), 0)._acc_sum(-1), fill)
    positions = np.flatnonzero(mask.expand(*shape).numpy())
    flat = self.expand(*shape).reshape(-1)
    return flat._take_along(0, type(self)(positions.astype(np.int32), device=self.device))

  def nonzero(self, as_tuple=False, size=None, fill_value=0):
    """The indices of the non-zero elements (NaN counts), as an (count, ndim) int32 tensor or, with as_tuple, one 1-D
    tensor per dim. The output's shape depends on the values, so the tensor is computed and read back here (torch
    synchronizes too). With `size` (tinygrad's form) nothing is read back: `size` rows, the first non-zero
    elements' indices, then rows of `fill_value` (cast to int32)."""
    if size is not None:
      n = _int_arg(size, "size", "nonzero", low=0)
      pick, found = self.reshape(-1)._bool()._first_true(n)          # (n, numel), (n,)
      flat = pick.where(type(self).arange(self.numel(), dtype=dtypes.int32, device=self.device), 0)._acc_sum(-1)
      coords, stride = [], 1
      for s in reversed(self.shape):
        coords.append((flat // stride) % s if s > 1 else flat * 0)
        stride *= s
      out = type(self).stack(*reversed(coords), dim=-1) if coords else flat.reshape(n, 1).shrink([None, (0, 0)])
      out = found.unsqueeze(-1).where(out, self._scalar(int(fill_value), dtypes.int32))
      return tuple(out[:, d] for d in range(self.ndim)) if as_tuple else out
    a = self.numpy()
    if as_tuple:   # a 0-d tensor counts as one element, as torch
      where = np.nonzero(a.reshape(-1) if a.ndim == 0 else a)
      return tuple(type(self)(i.astype(np.int32), device=self.device) for i in where)
    return type(self)(np.argwhere(a).astype(np.int32), device=self.device)

  def _first_true(self, n: int):
    """For a 1-D bool tensor: (pick, found), pick[k, i] True where element i is the k-th True one (k < n) and
    found[k] whether there is a k-th. One running count (cumsum) and a one-hot match: O(n * numel), lazy."""
    rank = self.cumsum(0).cast(dtypes.int32) - 1                     # the place of each True element
    k = type(self).arange(n, dtype=dtypes.int32, device=self.device).reshape(n, 1)
    pick = self.unsqueeze(0) & (rank.unsqueeze(0) == k)
    return pick, pick.any(-1)

  # ---------------------------------------------------------------- triangles and diagonals

  def _band(self, diagonal, op: str):
    """(row, col) index grids of the last two dims and the checked diagonal."""
    if self.ndim < 2: raise ShapeError(f"{op}: needs a tensor of at least 2 dims, got shape {tuple(self.shape)}")
    if not _is_size(diagonal): diagonal = _int_arg(diagonal, "diagonal", op)   # (a bound Variable may be one)
    rows = self._mask_dim(self.shape[-2], self.ndim - 2, self.ndim)
    cols = self._mask_dim(self.shape[-1], self.ndim - 1, self.ndim)
    return rows, cols, diagonal

  def tril(self, diagonal=0):
    """The lower triangle of the last two dims (j - i <= diagonal), zeros elsewhere."""
    rows, cols, k = self._band(diagonal, "tril")
    return (cols - rows <= k).where(self, self._zero_of())

  def triu(self, diagonal=0):
    """The upper triangle of the last two dims (j - i >= diagonal), zeros elsewhere."""
    rows, cols, k = self._band(diagonal, "triu")
    return (cols - rows >= k).where(self, self._zero_of())

  def diag(self, diagonal=0):
    """1-D: a square matrix with self on diagonal `diagonal` (above the main one if positive); 2-D: that diagonal
    as a vector (torch.diag)."""
    k = _int_arg(diagonal, "diagonal", "diag")
    if self.ndim == 2: return self.diagonal(k)
    if self.ndim != 1: raise ShapeError(f"diag: needs a 1-D or 2-D tensor, got shape {tuple(self.shape)}")
    n = self.shape[0]
    m = n + abs(k)
    vec = self.pad([(0, m - n)])
    vec = vec.reshape(m, 1) if k >= 0 else vec.reshape(1, m)      # x[i] sits at row i (k >= 0) or column i
    ar = type(self).arange(m, dtype=dtypes.int32, device=self.device)
    return (ar.reshape(1, m) - ar.reshape(m, 1) == k).where(vec, self._zero_of())

  def diagonal(self, offset=0, dim1=0, dim2=1):
    """The diagonal `offset` of the (dim1, dim2) planes as a last dim (torch.diagonal). Movement ops only: the
    plane is flattened and re-read with rows one longer, so the diagonal lines up in a column."""
    offset = _int_arg(offset, "offset", "diagonal")
    d1 = _norm_dim(dim1, self.ndim, "diagonal", self.shape)
    d2 = _norm_dim(dim2, self.ndim, "diagonal", self.shape)
    if self.ndim < 2: raise ShapeError(f"diagonal: needs a tensor of at least 2 dims, got shape {tuple(self.shape)}")
    if d1 == d2: raise ArgumentError(f"diagonal: dim1 and dim2 are both dim {d1} (shape {tuple(self.shape)})")
    lead = [i for i in range(self.ndim) if i not in (d1, d2)]
    x = self.permute(*lead, d1, d2)
    pre = [None] * len(lead)
    a, b = x.shape[-2:]
    if offset >= 0: x = x.shrink(pre + [None, (min(offset, b), b)])
    else: x = x.shrink(pre + [(min(-offset, a), a), None])
    a, b = x.shape[-2:]
    size = min(a, b)
    x = x.shrink(pre + [(0, size), None]).reshape(*x.shape[:-2], size * b)
    x = x.pad(pre + [(0, size)]).reshape(*x.shape[:-1], size, b + 1)
    return x.shrink(pre + [None, (0, 1)]).reshape(*x.shape[:-2], size)

  # ---------------------------------------------------------------- movement-like

  def roll(self, shifts, dims=None):
    """Elements shifted by `shifts` along `dims`, wrapping around (dims=None: over the flattened tensor). Movement
    ops only: the dim is laid out twice and a window of it kept."""
    if dims is None:
      s = shifts if not isinstance(shifts, (tuple, list)) else (shifts[0] if len(shifts) == 1 else None)
      if s is None: raise ArgumentError(f"roll: without dims, shifts must be one int, got {shifts!r}")
      return self.reshape(-1).roll(s, 0).reshape(*self.shape)
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
      raise ArgumentError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    x = self
    for s, d in zip(shifts, dims):
      s = _int_arg(s, "shift", "roll")
      d = _norm_dim(d, self.ndim, "roll", self.shape)
      if self.ndim == 0: continue
      n = x.shape[d]
      if n == 0 or s % n == 0: continue
      s %= n
      twice = x.unsqueeze(d).expand(*x.shape[:d], 2, *x.shape[d:]).reshape(*x.shape[:d], 2 * n, *x.shape[d + 1:])
      x = twice.shrink([(n - s, 2 * n - s) if i == d else None for i in range(x.ndim)])
    return x

  def unfold(self, dimension, size, step):
    """All windows of `size` elements along `dimension`, `step` apart: that dim becomes the window count and a
    last dim of `size` is added (torch.Tensor.unfold). Movement ops only."""
    ax = _norm_dim(dimension, self.ndim, "unfold", self.shape)
    size = _int_arg(size, "size", "unfold", low=0)
    step = _int_arg(step, "step", "unfold", low=1)
    x = self.reshape(1) if self.ndim == 0 else self
    n = x.shape[ax]
    if size > n:
      raise ShapeError(f"unfold: size {size} is larger than dim {dimension} of size {n} (shape {tuple(self.shape)})")
    count = (n - size) // step + 1
    if size == 0:
      empty = x.shrink([(0, 0) if i == ax else None for i in range(x.ndim)])
      out = empty.reshape(*x.shape[:ax], count, *x.shape[ax + 1:], 0)
      return out.reshape(0) if self.ndim == 0 else out
    last, _ = x._move_dim_last(ax, "unfold")
    windows = last._pool((size,), (step,), (1,))                  # (..., count, size)
    nd = x.ndim
    out = windows.permute(*range(ax), nd - 1, *range(ax, nd - 1), nd)
    return out.reshape(size) if self.ndim == 0 else out

  def repeat_interleave(self, repeats, dim=None, output_size=None):
    """Each element repeated `repeats` times along `dim` (None: over the flattened tensor). An int keeps this to
    movement ops. A 1-D tensor of per-element repeats is matched one-hot (O(n * output size)); the output size is
    read back from it (a sync, as torch) unless `output_size` is given, and then its values are not checked."""
    x = self.reshape(-1) if dim is None or self.ndim == 0 else self
    ax = 0 if dim is None else _norm_dim(dim, self.ndim, "repeat_interleave", self.shape)
    n = x.shape[ax]
    if isinstance(repeats, (list, tuple, np.ndarray)): repeats = type(self)(np.asarray(repeats), device=self.device)
    if isinstance(repeats, SelectionOps):
      if not repeats.dtype.is_int:
        raise TypeError(f"repeat_interleave: repeats must be ints, got {repeats.dtype.name}")
      if repeats.ndim > 1 or (repeats.numel() != n and repeats.numel() != 1):
        raise ShapeError(f"repeat_interleave: repeats of shape {tuple(repeats.shape)} must be one int or one per "
                         f"element of dim {ax} (size {n})")
      if repeats.numel() == 1 and n != 1: repeats = int(repeats.reshape(()).item())
    if not isinstance(repeats, SelectionOps):
      r = _int_arg(repeats, "repeats", "repeat_interleave", low=0)
      out = x.unsqueeze(ax + 1).expand(*x.shape[:ax + 1], r, *x.shape[ax + 1:])
      return out.reshape(*x.shape[:ax], n * r, *x.shape[ax + 1:])
    repeats = repeats.reshape(n)
    if output_size is None:
      total, low = repeats.sum(), repeats.min() if n else repeats.sum()
      total.realize(low)
      if n and low.item() < 0: raise ValueError(f"repeat_interleave: repeats must be non-negative, got {low.item()}")
      output_size = int(total.item())
    output_size = _int_arg(output_size, "output_size", "repeat_interleave", low=0)
    ends = repeats.cumsum(0).reshape(1, n)                         # output position p comes from the element
    p = type(self).arange(output_size, dtype=dtypes.int32, device=self.device).reshape(output_size, 1)
    source = (ends <= p).cast(dtypes.int32)._acc_sum(1)            # whose run covers p
    return x._take_along(ax, source)

  def meshgrid(self=None, *tensors, indexing="ij"):
    """Coordinate grids from 1-D tensors (torch.meshgrid): with "ij" output k varies along dim k; "xy" swaps the
    first two dims (Cartesian, as numpy's default). Movement ops only. Called on a tensor, that tensor is the first
    grid axis (tinygrad's x.meshgrid(y)); Tensor.meshgrid(x, y) and Tensor.meshgrid([x, y]) work too."""
    tensors = (*(self if isinstance(self, (list, tuple)) else () if self is None else (self,)), *tensors)
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"): raise ArgumentError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if not tensors: raise ArgumentError("meshgrid: needs at least one tensor")
    for t in tensors:
      if not isinstance(t, SelectionOps) or t.ndim > 1:
        shapes = [tuple(getattr(t, "shape", ())) for t in tensors]
        raise ShapeError(f"meshgrid: expects 0-D or 1-D tensors, got shapes {shapes}")
    place = list(range(len(tensors)))                              # the output dim each input varies along
    if indexing == "xy" and len(tensors) > 1: place[0], place[1] = 1, 0
    shape = [0] * len(tensors)
    for t, p in zip(tensors, place): shape[p] = t.numel()
    out = []
    for t, p in zip(tensors, place):
      view = [1] * len(tensors)
      view[p] = t.numel()
      out.append(t.reshape(*view).expand(*shape))
    return tuple(out)
