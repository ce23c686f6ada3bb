"""Composite Tensor ops: everything that is built from the core primitives.

`ComposedOps` is a mixin that `Tensor` inherits. Every method here is a composition of the core
movement ops (reshape, permute, expand, pad, shrink, flip), elementwise ops, reductions, `where`,
`cast` and the creation ops, so it stays lazy and fuses like any other graph. Nothing here computes
values on the host; the only op that writes is `__setitem__`, through `assign`.

Index, dim and shape checks happen here, when the op is built, so an error names the op, the
shapes and the dims a user passed.
"""
from __future__ import annotations
import math

import numpy as np

from baregrad.compiler.dtype import DType, dtypes, promote, to_dtype
from .device_dtypes import widest_float

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


class ShapeError(ValueError, RuntimeError):
  """Shapes that do not fit an op. A ValueError, as numpy raises, and the RuntimeError PyTorch raises for the
  same mistake, so code written for either catches it."""


class DimError(IndexError, ValueError):
  """A dim out of range: the IndexError numpy and PyTorch raise (and a ValueError, as baregrad raised before)."""


class ArgumentError(ValueError, RuntimeError):
  """An argument an op does not take (a dim given twice, a second -1 in a shape, an unknown rounding or reduce
  mode, shifts without dims): the ValueError baregrad raised before and the RuntimeError PyTorch raises."""


class ModeError(ArgumentError, NotImplementedError):
  """An unknown padding mode: PyTorch's pad raises NotImplementedError (a RuntimeError) for it."""


class DTypeError(TypeError, RuntimeError):
  """An op on a dtype it does not take (shifts and bitwise ops on floats, a scatter source of another dtype): the
  TypeError numpy raises and the RuntimeError PyTorch raises."""


class DTypeArgumentError(DTypeError, ValueError):
  """A dtype an op refuses (linspace to bool): the TypeError baregrad raised before, PyTorch's RuntimeError
  (NotImplementedError) and tinygrad's ValueError."""


class ArgumentTypeError(TypeError, ValueError):
  """Arguments of the wrong kind in a mixed form (stack's list of tensors followed by another tensor): the TypeError
  PyTorch raises and the ValueError tinygrad raises."""


class IndexTypeError(TypeError, IndexError):
  """An index tensor or list that is not of integers: the TypeError baregrad raised before and the IndexError numpy
  and PyTorch raise."""


# elements from which softmax stores its exponentials (an exp of 32K floats costs more than a kernel launch)
SOFTMAX_STORE_EXP = 1 << 15


class RangeOverflowError(OverflowError, ValueError):
  """A range whose values do not fit its integer dtype (arange(2**33, dtype=int32)): the OverflowError tinygrad
  raises, and a ValueError."""


# ---------------------------------------------------------------- small helpers (no tensors)

def _pow_gradient(out, g, base, exp):
  """torch's derivatives of base ** exp (both tensors of one shape and float dtype)."""
  b, e = base.detach(), exp.detach()
  d_base = (e == 0).where(0.0, g * (e * b.pow(e - 1)))
  d_exp = g * ((b == 0) & (e >= 0)).where(0.0, out.detach() * b.log())
  return d_base, d_exp


def _in_float32(fn):
  """16-bit float inputs are computed in float32 and rounded once at the end (within an ulp or two)."""
  import functools
  @functools.wraps(fn)
  def wrapper(self, *args, **kwargs):
    if self.dtype in (dtypes.float16, dtypes.bfloat16):
      return fn(self.cast(dtypes.float32), *args, **kwargs).cast(self.dtype)
    return fn(self, *args, **kwargs)
  return wrapper


def _is_size(x) -> bool:
  """A symbolic size (a bound Variable or arithmetic on one: compiler/shape.py), a UOp of dtype index."""
  from baregrad.compiler.uop import UOp
  return isinstance(x, UOp) and x.dtype is dtypes.index


def _norm_dim(dim, ndim: int, op: str, shape=None, extra: int = 0) -> int:
  """Normalize a possibly negative dim into [0, ndim + extra); 0-d tensors accept 0 and -1."""
  if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
    raise TypeError(f"{op}: dim must be an int, got {dim!r}")
  dim, hi = int(dim), max(ndim + extra, 1)
  if not -hi <= dim < hi:
    where = f" of shape {tuple(shape)}" if shape is not None else f" with {ndim} dims"
    raise IndexError(f"{op}: dim {dim} is out of range for a tensor{where} (expected a dim in [{-hi}, {hi - 1}])")
  return dim + hi if dim < 0 else dim


def _shape_arg(shape, op: str) -> tuple:
  """Accept f(2, 3) and f((2, 3)) and f([2, 3])."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out = []
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
      raise ValueError(f"{op}: shape entries must be non-negative ints, got shape {tuple(shape)}")
    out.append(int(s))
  return tuple(out)


class DTypeNameError(TypeError, AttributeError):
  """A dtype name baregrad does not know: the TypeError to_dtype raises and the AttributeError tinygrad raises (it
  looks the name up as an attribute of dtypes)."""


def dtype_arg(dtype, op: str) -> DType:
  """A dtype= argument as a DType: a DType, a numpy dtype, or a name in any case ("float32", "Half", "long",
  "default_float", "torch.float64", as tinygrad and torch name them)."""
  if isinstance(dtype, DType): return dtype
  if not isinstance(dtype, str) and type(dtype).__module__.split(".")[0] == "torch": dtype = str(dtype)
  if not isinstance(dtype, str): return to_dtype(dtype)
  name = dtype.strip().lower()
  for prefix in ("torch.", "dtypes.", "np.", "numpy."):
    if name.startswith(prefix): name = name[len(prefix):]
  if name in ("default_float", "default_int"): return getattr(dtypes, name)
  try: return to_dtype(name)
  except TypeError as e: raise DTypeNameError(f"{op}: {e}") from None


def sum_dtype(dtype: DType) -> DType:
  """The dtype numpy's sum/prod/cumsum give (its accumulator): bool and signed ints narrower than 64 bits -> int64
  (numpy's default integer, the C long of 64-bit Linux and macOS), unsigned ones -> uint64; others keep theirs."""
  if dtype.is_bool or (dtype.kind == 'i' and dtype.itemsize < 8): return dtypes.int64
  if dtype.is_unsigned and dtype.itemsize < 8: return dtypes.uint64
  return dtype


def _check_index_bounds(lo: int, hi: int, size: int, dim: int):
  """numpy's IndexError for integer-array indices outside [-size, size) (lo, hi: the smallest and largest)."""
  if lo < -size or hi >= size:
    raise IndexError(f"index {lo if lo < -size else hi} is out of bounds for axis {dim} with size {size}")


def _is_scalar(x) -> bool:
  return isinstance(x, (bool, int, float, np.integer, np.floating, np.bool_))


class ComposedOps:
  """Ops composed from the core primitives. Mixed into `Tensor`."""

  # ---------------------------------------------------------------- internal helpers

  def _as_tensor(self, x, dtype=None):
    """x as a Tensor on self's device (Tensors pass through)."""
    if isinstance(x, ComposedOps): return x
    return type(self)(x, dtype=dtype, device=self.device)

  def _scalar(self, value, dtype):
    return type(self).full((), value, dtype=dtype, device=self.device)

  def _acc_sum(self, axis=None, keepdim=False):
    """sum in the input dtype (bool counts in int32), for the ops whose numpy result keeps it (matmul, einsum,
    conv, softmax...); 16-bit floats accumulate in float32 (like torch). sum() itself promotes like numpy."""
    return self.sum(axis, keepdim=keepdim, dtype=dtypes.int32 if self.dtype.is_bool else self.dtype)

  def _with_gradient(self, sources, rule):
    """self, differentiated by rule(out, g, *sources) -> one gradient (or None) per source tensor instead of through
    the ops that computed it (autograd.define_gradient: torch's formula, in torch's form)."""
    from .autograd import define_gradient
    define_gradient(self.uop, tuple(s.uop for s in sources), rule)
    return self

  def _float(self):
    """self if it is a float tensor, else cast to float32 (the torch rule for exp/log...)."""
    return self if self.dtype.is_float else self.cast(dtypes.float32)

  def _float64(self):
    """self if it is a float tensor, else cast to float64 (numpy's rule for mean/var/std of ints and bools), or to
    float32 on a device without float64 (device_dtypes.py)."""
    return self if self.dtype.is_float else self.cast(widest_float(self.device))

  def _axes(self, axis, op: str) -> tuple:
    """Normalized reduction axes (None = all)."""
    if axis is None: return tuple(range(self.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = tuple(_norm_dim(a, self.ndim, op, self.shape) for a in axes)
    if len(set(out)) != len(out): raise ArgumentError(f"{op}: axis {axis} repeats a dim")
    return tuple(a for a in out if a < self.ndim)   # a 0-d tensor accepts dim 0 / -1 and reduces nothing

  def _mask_dim(self, size: int, dim: int, ndim: int):
    """arange(size) shaped to broadcast along `dim` of an ndim-dim tensor."""
    shape = [1] * ndim
    shape[dim] = size
    return type(self).arange(size, dtype=dtypes.int32, device=self.device).reshape(*shape)

  # ---------------------------------------------------------------- movement

  def view(self, *shape):
    return self.reshape(*shape)

  def transpose(self, dim0=1, dim1=0):
    d0 = _norm_dim(dim0, self.ndim, "transpose", self.shape)
    d1 = _norm_dim(dim1, self.ndim, "transpose", self.shape)
    if self.ndim < 2: return self
    order = list(range(self.ndim))
    order[d0], order[d1] = order[d1], order[d0]
    return self.permute(*order)

  @property
  def T(self):
    """All dims reversed (the transpose for 2-D)."""
    return self if self.ndim < 2 else self.permute(*range(self.ndim - 1, -1, -1))

  def squeeze(self, dim=None):
    if dim is None: dims = {i for i, s in enumerate(self.shape) if s == 1}
    else:
      dims = dim if isinstance(dim, (tuple, list)) else (dim,)
      dims = {d for d in (_norm_dim(d, self.ndim, "squeeze", self.shape) for d in dims)
              if d < self.ndim and self.shape[d] == 1}
    return self.reshape(*[s for i, s in enumerate(self.shape) if i not in dims])

  def unsqueeze(self, dim):
    d = _norm_dim(dim, self.ndim, "unsqueeze", self.shape, extra=1)
    return self.reshape(*self.shape[:d], 1, *self.shape[d:])

  def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0: return self.reshape(1)
    s = _norm_dim(start_dim, self.ndim, "flatten", self.shape)
    e = _norm_dim(end_dim, self.ndim, "flatten", self.shape)
    if s > e: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
    return self.reshape(*self.shape[:s], math.prod(self.shape[s:e + 1]), *self.shape[e + 1:])

  def unflatten(self, dim, sizes):
    d = _norm_dim(dim, self.ndim, "unflatten", self.shape)
    sizes = tuple(int(s) for s in sizes)
    if not sizes: raise ValueError(f"unflatten: sizes must not be empty (shape {self.shape}, dim {dim})")
    known = math.prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1 or any(s < -1 for s in sizes) or \
       (sizes.count(-1) == 0 and known != self.shape[d]) or \
       (sizes.count(-1) == 1 and (known == 0 or self.shape[d] % known)):
      raise ValueError(f"unflatten: sizes {sizes} do not split dim {dim} of size {self.shape[d]} (shape {self.shape})")
    if -1 in sizes: sizes = tuple(self.shape[d] // known if s == -1 else s for s in sizes)
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

  def repeat(self, *repeats):
    repeats = _shape_arg(repeats, "repeat")
    if len(repeats) < self.ndim:
      raise ValueError(f"repeat: got {len(repeats)} repeats {repeats} for a tensor of shape {self.shape}; "
                       f"give at least one per dim ({self.ndim})")
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    x = self.reshape(*[v for s in shape for v in (1, s)])
    x = x.expand(*[v for r, s in zip(repeats, shape) for v in (r, s)])
    return x.reshape(*[r * s for r, s in zip(repeats, shape)])

  def cat(self, *others, dim=0):
    """Concatenate along `dim`: each input is padded to the full size and the pads are summed."""
    tensors = list(self) if isinstance(self, (list, tuple)) else [self]
    if len(others) == 1 and isinstance(others[0], (list, tuple)): others = others[0]
    tensors += list(others)
    if not tensors: raise ValueError("cat: needs at least one tensor")
    if not all(isinstance(t, ComposedOps) for t in tensors):
      raise TypeError(f"cat: expected Tensors, got {[type(t).__name__ for t in tensors]}")
    first = tensors[0]
    d = _norm_dim(dim, first.ndim, "cat", first.shape)
    if first.ndim == 0: raise DimError("cat: zero-dimensional tensors cannot be concatenated; use stack")
    for t in tensors:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
        raise ShapeError(f"cat: shapes {[tuple(t.shape) for t in tensors]} differ outside dim {dim}")
    out_dtype = first.dtype
    for t in tensors[1:]: out_dtype = promote(out_dtype, t.dtype)
    total = sum(t.shape[d] for t in tensors)
    parts, offset = [], 0
    for t in tensors:
      n = t.shape[d]
      if n:
        pad = [None] * t.ndim
        pad[d] = (offset, total - offset - n)
        parts.append(t.cast(out_dtype).pad(pad))
      offset += n
    if not parts: return first.cast(out_dtype)
    out = parts[0]
    for p in parts[1:]: out = (out | p) if out_dtype.is_bool else out + p
    return out

  def stack(self, *others, dim=0):
    """stack(a, b, ..., dim=0), a.stack(b, ...), or torch's stack([a, b], dim) with dim given by position."""
    tensors = list(self) if isinstance(self, (list, tuple)) else [self]
    if isinstance(self, (list, tuple)) and others:     # torch.stack(tensors, dim)
      if len(others) > 1 or isinstance(others[0], ComposedOps) or dim != 0:
        raise ArgumentTypeError(f"stack: after the list of tensors only dim may follow, got {others!r}")
      dim, others = others[0], ()
    if len(others) == 1 and isinstance(others[0], (list, tuple)): others = others[0]
    tensors += list(others)
    if not all(isinstance(t, ComposedOps) for t in tensors):
      raise TypeError(f"stack: expected tensors, got {[type(t).__name__ for t in tensors]}")
    if not tensors: raise ValueError("stack: needs at least one tensor")
    first = tensors[0]
    for t in tensors:
      if tuple(t.shape) != tuple(first.shape):
        raise ShapeError(f"stack: all tensors must have the same shape, got {[tuple(t.shape) for t in tensors]}")
    d = _norm_dim(dim, first.ndim, "stack", first.shape, extra=1)
    return ComposedOps.cat(*[t.unsqueeze(d) for t in tensors], dim=d)

  def split(self, sizes, dim=0):
    d = _norm_dim(dim, self.ndim, "split", self.shape)
    n = self.shape[d]
    if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
      if sizes <= 0: raise ValueError(f"split: split size must be positive, got {sizes} (shape {self.shape})")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != n or any(s < 0 for s in sizes):
      raise ValueError(f"split: sizes {sizes} must be non-negative and sum to {n}, the size of dim {dim} of {self.shape}")
    out, start = [], 0
    for s in sizes:
      arg = [None] * self.ndim
      arg[d] = (start, start + s)
      out.append(self.shrink(arg))
      start += s
    return tuple(out)

  def chunk(self, chunks, dim=0):
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks <= 0:
      raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    d = _norm_dim(dim, self.ndim, "chunk", self.shape)
    return self.split(max(1, -(-self.shape[d] // chunks)), d)

  # ---------------------------------------------------------------- indexing

  def _index_tensor(self, it, size: int, dim: int):
    """A list / numpy array / Tensor index as an int32 Tensor with negative values wrapped (as numpy: -1 is the
    last element). Every index must be in [-size, size), else IndexError, as numpy. Host indices (lists, numpy
    arrays) are checked at once; a Tensor index is checked by realizing its min and max, so indexing with a
    Tensor waits for the index tensor to be computed (inside a jitted function: at capture, not at replay)."""
    if isinstance(it, ComposedOps):
      if not it.dtype.is_int:
        raise IndexTypeError(f"index tensors must have an integer dtype, got {it.dtype} for dim {dim}; "
                             "boolean masks are not supported (use where)")
      if it.numel():
        lo, hi = it.min(), it.max()
        lo.realize(hi)
        _check_index_bounds(lo.item(), hi.item(), size, dim)
      idx = it if it.dtype == dtypes.int32 else it.cast(dtypes.int32)
    else:
      arr = np.asarray(it)
      if arr.size == 0: arr = arr.astype(np.int32)
      if arr.dtype.kind not in "iu":
        raise IndexTypeError(f"index lists must hold ints, got {arr.dtype} values for dim {dim}")
      if arr.size: _check_index_bounds(int(arr.min()), int(arr.max()), size, dim)
      idx = type(self)(arr.astype(np.int32), device=self.device)
    return (idx < 0).where(idx + size, idx)

  def _parse_index(self, index):
    """Expand an index into one entry per consumed dim (None entries add a dim).

    Returns a list of (kind, value, dim) with kind in int/slice/none/tensor.
    """
    if not isinstance(index, tuple): index = (index,)
    items = []
    for it in index:
      if it is None or it is Ellipsis or isinstance(it, slice): items.append(it)
      elif isinstance(it, (bool, np.bool_)):
        raise TypeError(f"boolean index {it!r} is not supported")
      elif isinstance(it, (int, np.integer)): items.append(int(it))
      elif _is_size(it): items.append(it)     # a bound Variable (or arithmetic on one): an int index
      elif isinstance(it, (ComposedOps, list, tuple, np.ndarray)): items.append(("tensor", it))
      else: raise TypeError(f"unsupported index {it!r} of type {type(it).__name__}")
    if sum(it is Ellipsis for it in items) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(it is not None and it is not Ellipsis for it in items)
    if consumed > self.ndim:
      raise IndexError(f"too many indices for tensor of shape {self.shape}: {consumed} indices for {self.ndim} dims")
    if Ellipsis in [it for it in items if not isinstance(it, tuple)]:
      at = next(i for i, it in enumerate(items) if it is Ellipsis)
      items[at:at + 1] = [slice(None)] * (self.ndim - consumed)
    else: items += [slice(None)] * (self.ndim - consumed)
    out, d = [], 0
    for it in items:
      if it is None:
        out.append(("none", None, None))
        continue
      size = self.shape[d]
      if _is_size(it) or (isinstance(it, slice) and any(_is_size(x) for x in (it.start, it.stop, it.step))):
        out.append(self._symbolic_index_entry(it, size, d))
      elif isinstance(it, int):
        if not -size <= it < size:
          raise IndexError(f"index {it} is out of bounds for dim {d} with size {size} (shape {self.shape})")
        out.append(("int", it + size if it < 0 else it, d))
      elif isinstance(it, slice):
        start, stop, step = it.indices(size) if it.step != 0 else (None, None, 0)
        if step == 0: raise ValueError(f"slice step cannot be zero (dim {d}, shape {self.shape})")
        out.append(("slice", (start, step, len(range(start, stop, step))), d))
      else: out.append(("tensor", self._index_tensor(it[1], size, d), d))
      d += 1
    return out

  def _symbolic_index_entry(self, it, size, d: int):
    """An index entry with a symbolic position: x[p] (an int index) or x[s:e] (step 1). Positions are offsets from
    the start (a symbolic one is never counted from the end) and must lie inside the dim for every value of their
    Variables: shrink checks that."""
    from baregrad.compiler import shape as sym
    if _is_size(it): return ("int", it, d)
    if it.step not in (None, 1): raise ValueError(f"a slice with a symbolic bound needs step 1, got {it!r} (dim {d})")
    start = 0 if it.start is None else it.start
    stop = size if it.stop is None else it.stop
    if not _is_size(start) and start < 0: start += size
    if not _is_size(stop) and stop < 0: stop += size
    return ("slice", (sym.canonical(start), 1, sym.ssub(stop, start)), d)

  def _basic_index(self, entries):
    """Apply the int/slice part of an index; tensor-indexed dims stay whole. Returns (x, kept_shape)."""
    x, shrink, flips, strides = self, [], [], []
    for kind, val, d in entries:
      if kind == "int": shrink.append((val, val + 1))
      elif kind == "slice":
        start, step, n = val
        if _is_size(n) or _is_size(start): shrink.append((start, start + n))     # symbolic: step 1
        elif n == 0: shrink.append((0, 0))
        elif step > 0: shrink.append((start, start + (n - 1) * step + 1))
        else:
          shrink.append((start + (n - 1) * step, start + 1))
          flips.append(d)
        if abs(step) > 1 and n > 1: strides.append((d, abs(step), n))
      elif kind == "tensor": shrink.append(None)
    if any(s is not None and s != (0, self.shape[i]) for i, s in enumerate(shrink)): x = x.shrink(shrink)
    if flips: x = x.flip(*flips)
    for d, step, n in strides: x = x._take_every(d, step, n)
    kept = []
    for kind, val, d in entries:
      if kind == "none": kept.append(1)
      elif kind == "slice": kept.append(val[2])
      elif kind == "tensor": kept.append(self.shape[d])
    return x.reshape(*kept), kept

  def _take_every(self, dim: int, step: int, n: int):
    """Keep every `step`-th element of `dim`, whose size is (n-1)*step+1: pad, split, shrink."""
    shape = list(self.shape)
    x = self.pad([(0, step - 1) if i == dim else None for i in range(self.ndim)])
    x = x.reshape(*shape[:dim], n, step, *shape[dim + 1:])
    x = x.shrink([(0, 1) if i == dim + 1 else None for i in range(x.ndim)])
    return x.reshape(*shape[:dim], n, *shape[dim + 1:])

  def __getitem__(self, index):
    """numpy indexing: ints, slices, None, ..., and integer arrays (lists, numpy arrays, Tensors) that gather.
    An index out of range raises IndexError, as in numpy; for a Tensor index that check realizes the index
    tensor's min and max, so it waits for the index tensor to be computed (see `_index_tensor`)."""
    entries = self._parse_index(index)
    x, kept = self._basic_index(entries)
    tensor_at = [i for i, (kind, _, _) in enumerate(entries) if kind == "tensor"]
    if not tensor_at: return x
    # advanced indexing: gather with a one-hot mask and a sum over the indexed dims
    kept_kinds = [kind for kind, _, _ in entries if kind != "int"]
    tdims = [i for i, k in enumerate(kept_kinds) if k == "tensor"]
    rdims = [i for i, k in enumerate(kept_kinds) if k != "tensor"]
    idxs = [entries[i][1] for i in tensor_at]
    try: bshape = tuple(type(self)._broadcast_shape(*[t.shape for t in idxs]))
    except ValueError:
      raise IndexError(f"index tensors of shapes {[tuple(t.shape) for t in idxs]} cannot be broadcast together") from None
    sizes = [kept[i] for i in tdims]
    k, nb = len(tdims), len(bshape)
    rshape = [kept[i] for i in rdims]
    x = x.permute(*rdims, *tdims).reshape(*rshape, *([1] * nb), *sizes)
    mask = None
    for j, (idx, size) in enumerate(zip(idxs, sizes)):
      onehot_shape = [1] * k
      onehot_shape[j] = size
      ar = type(self).arange(size, dtype=dtypes.int32, device=self.device).reshape(*([1] * nb), *onehot_shape)
      m = idx.reshape(*([1] * (nb - idx.ndim)), *idx.shape, *([1] * k)) == ar
      mask = m if mask is None else mask & m
    zero = False if x.dtype.is_bool else 0
    out = mask.where(x, zero)._acc_sum(tuple(range(x.ndim - k, x.ndim)))
    if out.dtype != self.dtype: out = out.cast(self.dtype)
    # PyTorch's rule: index tensors next to each other (ints, which only drop their dim, do not separate them) put
    # the broadcast dims in their place, else first. numpy counts ints as advanced indices too, so it differs when
    # an int is apart from the tensors: x[1, :, idx] keeps idx's dims in place here, numpy moves them first.
    kept_entries = [kind for kind, _, _ in entries if kind != "int"]
    adv = [i for i, kind in enumerate(kept_entries) if kind == "tensor"]
    p = 0
    if adv[-1] - adv[0] + 1 == len(adv): p = sum(1 for kind in kept_entries[:adv[0]] if kind in ("slice", "none"))
    nr = len(rdims)
    order = [*range(p), *range(nr, nr + nb), *range(p, nr)]
    return out.permute(*order) if order != list(range(out.ndim)) else out

  def __setitem__(self, index, value):
    if isinstance(index, ComposedOps) and index.dtype.is_bool:
      self.assign(self._masked_fill(index, value))
      return
    entries = self._parse_index(index)
    if isinstance(value, ComposedOps): v = value.cast(self.dtype) if value.dtype != self.dtype else value
    elif _is_scalar(value): v = self._scalar(value, self.dtype)
    else: v = type(self)(value, dtype=self.dtype, device=self.device)
    if any(kind == "tensor" for kind, _, _ in entries): new = self._scatter_gathered(index, v)
    elif any(kind == "slice" and abs(val[1]) > 1 and val[2] > 1 for kind, val, _ in entries):
      new = self._scatter_basic(entries, v)     # every step-th element: the whole tensor, the others kept
    else:
      # ints, slices with step +-1, None, ...: the indexed elements are a view of this tensor's memory, written in
      # place (only they are read and written)
      self._write_target("setitem")      # this tensor's own value is computed first; a view of nothing is refused
      view, kept = self._basic_index(entries)
      v = self._broadcast_value(v, kept, f"tensor shape {self.shape}")
      if math.prod(kept): view.reshape(*kept).assign(v)
      return
    if new is not None: self.assign(new)

  def _masked_fill(self, mask, value):
    """x[mask] = value for a boolean mask over the leading dims and a scalar (or one-element) value."""
    if tuple(mask.shape) != tuple(self.shape[:mask.ndim]):
      raise IndexError(f"setitem: boolean mask of shape {tuple(mask.shape)} does not match tensor of shape {self.shape}")
    if isinstance(value, ComposedOps):
      if value.numel() != 1:
        raise ValueError(f"setitem: a boolean mask needs a scalar value, got a tensor of shape {tuple(value.shape)}")
      value = value.reshape(*([1] * self.ndim)).cast(self.dtype)
    elif not _is_scalar(value): raise TypeError(f"setitem: a boolean mask needs a scalar value, got {type(value).__name__}")
    else: value = self._scalar(value, self.dtype)
    return mask.reshape(*mask.shape, *([1] * (self.ndim - mask.ndim))).where(value, self)

  def _broadcast_value(self, v, shape, index_desc):
    try: ok = tuple(type(self)._broadcast_shape(tuple(v.shape), tuple(shape))) == tuple(shape)
    except ValueError: ok = False
    if not ok:
      raise ValueError(f"setitem: value of shape {tuple(v.shape)} cannot be broadcast to the indexed shape "
                       f"{tuple(shape)} ({index_desc})")
    return v.reshape(*([1] * (len(shape) - v.ndim)), *v.shape).expand(*shape)

  def _scatter_basic(self, entries, v):
    """New full value for an int/slice/None/... index: the value is moved into place with pads."""
    kept = [1 if kind == "none" else val[2] for kind, val, _ in entries if kind != "int"]
    v = self._broadcast_value(v, kept, f"tensor shape {self.shape}")
    if math.prod(kept) == 0: return None
    v = v.reshape(*[1 if kind == "int" else val[2] for kind, val, _ in entries if kind != "none"])
    lo_hi, mask = [], None
    for d, ((kind, val, _), size) in enumerate(zip([e for e in entries if e[0] != "none"], self.shape)):
      if kind == "int": lo, step, n = val, 1, 1
      else: lo, step, n = val
      if step < 0:
        lo = lo + (n - 1) * step
        step = -step
        v = v.flip(d)
      if step > 1 and n > 1:   # spread the n values out to every step-th place
        shp = list(v.shape)
        v = v.reshape(*shp[:d], n, 1, *shp[d + 1:])
        v = v.pad([(0, step - 1) if i == d + 1 else None for i in range(v.ndim)])
        v = v.reshape(*shp[:d], n * step, *shp[d + 1:])
        v = v.shrink([(0, (n - 1) * step + 1) if i == d else None for i in range(v.ndim)])
      span = (n - 1) * step + 1
      lo_hi.append((lo, size - lo - span))
      ar = self._mask_dim(size, d, self.ndim)
      m = (ar >= lo) & (ar < lo + span)
      if step > 1: m = m & ((ar - lo) % step == 0)
      mask = m if mask is None else mask & m
    if mask is None: return v   # 0-d tensor, index () or ...
    v = v.pad(lo_hi) if any(p != (0, 0) for p in lo_hi) else v
    return mask.where(v, self)

  def _scatter_gathered(self, index, v):
    """New full value for an index with tensors: one-hot match of flat positions (last write wins)."""
    n = self.numel()
    positions = type(self).arange(n, dtype=dtypes.int32, device=self.device).reshape(*self.shape)[index]
    v = self._broadcast_value(v, positions.shape, f"tensor shape {self.shape}")
    m = positions.numel()
    if m == 0 or n == 0: return None
    col = type(self).arange(m, dtype=dtypes.int32, device=self.device).reshape(1, m)
    match = type(self).arange(n, dtype=dtypes.int32, device=self.device).reshape(n, 1) == positions.reshape(1, m)
    last = match.where(col, -1).max(1, keepdim=True)
    pick = col == last
    vals = pick.where(v.reshape(1, m).cast(dtypes.int32 if self.dtype.is_bool else self.dtype), 0)._acc_sum(1)
    new = (last.reshape(n) >= 0).where(vals.cast(self.dtype), self.reshape(n))
    return new.reshape(*self.shape)

  # ---------------------------------------------------------------- elementwise

  @_in_float32
  def exp(self): return (self._float() * LOG2E).exp2()
  @_in_float32
  def log(self): return self._float().log2() * LN2
  @_in_float32
  def rsqrt(self): return self._float().sqrt().reciprocal()
  @_in_float32
  def cos(self):
    # pi/2 - x in float64, so large arguments keep their precision (sin reduces in float64 anyway). Without float64
    # (device_dtypes.py): cos x = 1 - 2 sin^2(x/2), exact halving, no cancellation in the argument; the result is
    # within ~2e-7 absolute of cos x for every x, as sin(x/2) is
    x = self._float()
    if x.dtype == dtypes.float32 and widest_float(x.device) == dtypes.float64:
      return ((math.pi / 2) - x.cast(dtypes.float64)).sin().cast(dtypes.float32)
    if x.dtype == dtypes.float32:
      s = (x * 0.5).sin()
      return 1 - 2 * (s * s)
    return ((math.pi / 2) - x).sin()
  @_in_float32
  def tan(self): return self.sin() / self.cos()
  @_in_float32
  def sigmoid(self):
    """1 / (1 + exp(-x)) from z = exp(-|x|) <= 1, so no intermediate overflows: the value and the gradient at
    extreme inputs are 0 or 1, never NaN."""
    x = self._float()
    z = (x >= 0).where(-x, x).exp()       # exp(-|x|), differentiable at 0 from both sides
    return (x >= 0).where((z + 1).reciprocal(), z * (z + 1).reciprocal())
  @_in_float32
  def tanh(self): return (self._float() * 2).sigmoid() * 2 - 1
  def relu(self):
    """max(x, 0); NaN stays NaN (as numpy's maximum(x, 0))."""
    return (self <= 0).where(0, self)
  def leaky_relu(self, neg_slope=0.01): return (self > 0).where(self, self * neg_slope)
  def silu(self): return self * self.sigmoid()
  def square(self): return self * self

  @_in_float32
  def gelu(self, approximate="none"):
    """torch's gelu: x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))) ("none"), or its tanh approximation ("tanh")."""
    x = self._float()
    # (1 + tanh(y)) / 2 is sigmoid(2y): no cancellation in the negative tail
    if approximate == "tanh": return x * ((2 * math.sqrt(2 / math.pi)) * (x + 0.044715 * x * x * x)).sigmoid()
    if approximate != "none": raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * ((x * (1 / math.sqrt(2))).erf() + 1)

  @_in_float32
  def softplus(self, beta=1):
    x = self._float() * beta
    return (x.maximum(0) + ((-x.abs()).exp() + 1).log()) * (1 / beta)

  def clip(self, min_=None, max_=None):
    """min(max(x, min_), max_) like numpy; NaN stays NaN. The gradient is 1 inside [min_, max_], the bounds
    included (as torch.clamp), and 0 outside."""
    if min_ is None and max_ is None: raise ArgumentError("clip: at least one of min_ and max_ must be given")
    x = self
    if min_ is not None: x = (x < min_).where(min_, x) if x.dtype.is_float else x.maximum(min_)
    if max_ is not None: x = (x > max_).where(max_, x) if x.dtype.is_float else x.minimum(max_)
    return x
  clamp = clip

  def abs(self):
    """|x|; abs(-0.0) is +0.0 and the gradient at 0 is 0 (as torch)."""
    if self.dtype.is_bool or self.dtype.is_unsigned: return self
    if not self.dtype.is_float: return (self < 0).where(-self, self)
    return (self < 0).where(-self, (self == 0).where(0.0, self))

  def sign(self):
    if self.dtype.is_bool: return self
    out = (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
    return (self != self).where(self, out) if self.dtype.is_float else out

  def _bool(self): return self if self.dtype.is_bool else self != 0

  def logical_and(self, other): return self._bool() & self._as_tensor(other)._bool()
  def logical_or(self, other): return self._bool() | self._as_tensor(other)._bool()
  def logical_xor(self, other): return self._bool() ^ self._as_tensor(other)._bool()

  def lerp(self, end, weight): return self + (end - self) * weight

  def erf(self):
    """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    x = self._float()
    # t = 1 / s with s = 1 + p|x| (|x| whose gradient at 0 is the right-hand one, capped at 10, where erf is 1 in
    # float64 already): the polynomial t (a1 + t (a2 + ... + t a5)) is (a1 s^4 + a2 s^3 + ... + a5) / s^5, one
    # division instead of one per term (each `* t` of a reciprocal becomes a correctly rounded division, compiler/
    # lower.py, which costs several times a multiply on vector lanes)
    s = (x < 0).where(-x, x).minimum(10.0) * 0.3275911 + 1
    s2 = s * s
    num = (((0.254829592 * s - 0.284496736) * s + 1.421413741) * s - 1.453152027) * s + 1.061405429
    poly = num / (s2 * s2 * s)
    e = (-x * x).exp()
    y = 1 - poly * e
    # the gradient is erf's own, 2/sqrt(pi) exp(-x^2) (as torch), not the approximation's (its rational polynomial
    # differentiated through a division: several times the forward's cost in a GELU's backward, and off by ~1e-6)
    return (x < 0).where(-y, y)._with_gradient((x,), lambda out, g, _x: (g * (e * (2 / math.sqrt(math.pi))),))

  # ---------------------------------------------------------------- pow

  def _int_pow(self, n: int):
    """self ** n for a Python int n >= 0, by repeated squaring (exact for ints)."""
    result, base = None, self
    while n:
      if n & 1: result = base if result is None else result * base
      n >>= 1
      if n: base = base * base
    if result is not None: return result
    # x ** 0 is 1 (inf and NaN included) yet stays a function of x, so x gets its zero gradient (as torch)
    return (self == self).where(self.ones_like(), self.ones_like()) if self.dtype.is_float else self.ones_like()

  def _pow_float(self, e):
    """self ** e for float tensors of one dtype: exp2(e * log2|b|) with the sign of a negative base (C's pow:
    x ** 0 is 1, (-inf) ** e is inf or -inf for odd integer e). A zero base is taken apart (0 ** e is 0, 1 or inf)
    so its gradients are finite: d/dx at x = 0 is 1 for e = 1 and 0 for other e > 0 (torch gives inf for
    0 < e < 1), d/de of 0 ** e is 0 (as torch)."""
    zero = self == 0
    mag = (e * zero.where(1.0, self.abs()).log2()).exp2()
    mag = zero.where((e > 0).where(self * (e == 1).where(1.0, 0.0), (e == 0).where(1.0, math.inf)), mag)
    e_int = e.trunc() == e
    odd = (e * 0.5).trunc() * 2 != e
    neg_ok = e_int | (self == -math.inf)                         # a negative base needs an integer exponent
    res = (self < 0).where(neg_ok.where((e_int & odd).where(-mag, mag), math.nan), mag)
    return ((e == 0) & ((self - self) != 0)).where(1, res)     # inf ** 0 and nan ** 0 are 1; elsewhere exact

  def _int_pow_tensor(self, e):
    """Integer self ** e elementwise, exact (wrapping as the dtype does, as torch): binary exponentiation over the
    exponent's bits. A negative exponent gives 1 for a base of 1, +-1 for -1 and 0 otherwise (torch's integer pow)."""
    bits = self.dtype.itemsize * 8
    r, b, k = self._scalar(1, self.dtype).expand(*self.shape), self, e.abs()
    signed = not self.dtype.is_unsigned
    for i in range(bits - 1 if signed else bits):
      r = ((k >> i) & 1).cast(dtypes.bool).where(r * b, r)
      if i < bits - 2: b = b * b
    if not signed: return r
    neg = (self == -1).where((e & 1).cast(dtypes.bool).where(-1, 1), (self == 1).where(1, 0)).cast(self.dtype)
    return (e < 0).where(neg, r)

  def pow(self, exponent):
    """self ** exponent. Float results are differentiated by torch's formulas: d/dx = e * x ** (e - 1) (0 where
    e == 0), d/de = x ** e * log(x) (0 where x == 0 and e >= 0; NaN for a negative x, as torch)."""
    if isinstance(exponent, ComposedOps):
      out = promote(self.dtype, exponent.dtype)
      if out.is_bool: out = dtypes.int32
      work = out if out.is_float else dtypes.float32
      shape = tuple(type(self)._broadcast_shape(tuple(self.shape), tuple(exponent.shape)))
      if not out.is_float: return self.cast(out).expand(*shape)._int_pow_tensor(exponent.cast(out).expand(*shape))
      base, exp = self.cast(work).expand(*shape), exponent.cast(work).expand(*shape)
      return base._pow_float(exp)._with_gradient((base, exp), _pow_gradient)
    if not _is_scalar(exponent): raise TypeError(f"pow: unsupported exponent {exponent!r} of type {type(exponent).__name__}")
    if isinstance(exponent, (bool, np.bool_)): exponent = int(exponent)
    if isinstance(exponent, (int, np.integer)) and not self.dtype.is_float:
      if exponent < 0: raise ArgumentError(f"pow: integer tensor ({self.dtype}) to a negative integer power {exponent}")
      x = self.cast(dtypes.int32) if self.dtype.is_bool else self
      return x._int_pow(int(exponent))
    x = self._float()
    e = float(exponent)
    if e == int(e) and abs(e) <= 32:
      r = x._int_pow(int(abs(e)))
      if e < 0: r = r.reciprocal()
    elif e == 0.5: r = x.sqrt()
    else: r = x._pow_float(x._scalar(e, x.dtype))
    return r._with_gradient((x,), lambda out, g, b: (None if e == 0 else g * (e * b.detach().pow(e - 1)),))

  def __pow__(self, exponent): return self.pow(exponent)

  def __rpow__(self, base):
    if not _is_scalar(base): return NotImplemented
    if isinstance(base, (bool, np.bool_)): base = int(base)
    if isinstance(base, (float, np.floating)): dt = self.dtype if self.dtype.is_float else dtypes.float32
    else: dt = dtypes.int32 if self.dtype.is_bool else self.dtype
    if dt.is_float and float(base) == 2.0: return self.cast(dt).exp2()
    return self._scalar(base, dt).pow(self)

  # ---------------------------------------------------------------- reductions

  def mean(self, axis=None, keepdim=False):
    """Mean over `axis`. The dtype follows numpy: float tensors keep theirs (float16/bfloat16 accumulate in
    float32), int and bool tensors give float64. An empty axis gives NaN."""
    x = self._float64()
    count = math.prod(self.shape[a] for a in self._axes(axis, "mean"))
    return x._acc_sum(axis, keepdim=keepdim) / count

  def var(self, axis=None, keepdim=False, correction=1, *, dim=None):
    """Variance with `correction` (numpy's ddof); dtype as mean(). `dim` is torch's name for axis."""
    if dim is not None: axis = dim
    x = self._float64()
    count = math.prod(self.shape[a] for a in self._axes(axis, "var"))
    d = x - x.mean(axis, keepdim=True)
    return (d * d)._acc_sum(axis, keepdim=keepdim) / max(0, count - correction)

  def std(self, axis=None, keepdim=False, correction=1, *, dim=None):
    return self.var(axis if dim is None else dim, keepdim=keepdim, correction=correction).sqrt()

  def _arg_reduce(self, axis, keepdim, use_max: bool, op: str):
    if axis is None:
      out = self.reshape(-1)._arg_reduce(0, False, use_max, op)
      return out.reshape(*([1] * self.ndim)) if keepdim else out
    ax = _norm_dim(axis, self.ndim, op, self.shape)
    if self.ndim == 0: return self._scalar(0, dtypes.int32)
    n = self.shape[ax]
    if n == 0: raise ValueError(f"{op}: cannot reduce over the empty dim {axis} of shape {self.shape}")
    m = self.max(ax, keepdim=True) if use_max else self.min(ax, keepdim=True)
    hit = self == m
    if self.dtype.is_float: hit = hit | (self != self)   # numpy: the first NaN wins
    idx = self._mask_dim(n, ax, self.ndim)
    return hit.where(idx, n).min(ax, keepdim=keepdim).cast(dtypes.int32)

  def argmax(self, axis=None, keepdim=False): return self._arg_reduce(axis, keepdim, True, "argmax")
  def argmin(self, axis=None, keepdim=False): return self._arg_reduce(axis, keepdim, False, "argmin")

  def any(self, axis=None, keepdim=False):
    self._axes(axis, "any")
    return self._bool().cast(dtypes.int32).sum(axis, keepdim=keepdim) > 0

  def all(self, axis=None, keepdim=False):
    self._axes(axis, "all")
    return self._bool().logical_not().cast(dtypes.int32).sum(axis, keepdim=keepdim) == 0

  def cumsum(self, axis=0, *, dim=None):
    """Running sum: each output is a sum over a lower-triangular mask (O(n^2), one kernel). The dtype follows
    numpy, as for sum(): bool and ints narrower than 64 bits give int64 (unsigned: uint64). `dim` is torch's name."""
    if dim is not None: axis = dim
    if axis is None: return self.reshape(-1).cumsum(0)
    ax = _norm_dim(axis, self.ndim, "cumsum", self.shape)
    x = self.cast(sum_dtype(self.dtype))
    if self.ndim == 0: return x
    n = self.shape[ax]
    order = [i for i in range(self.ndim) if i != ax] + [ax]
    x = x.permute(*order)
    ar = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    tri = ar.reshape(n, 1) >= ar.reshape(1, n)
    y = tri.where(x.reshape(*x.shape[:-1], 1, n), 0)._acc_sum(-1)
    inverse = [order.index(i) for i in range(self.ndim)]
    return y.permute(*inverse)

  def logsumexp(self, axis=None, keepdim=False):
    x = self._float()
    axes = self._axes(axis, "logsumexp")
    if any(self.shape[a] == 0 for a in axes): m = x._scalar(0, x.dtype)   # an empty sum: log(0) = -inf
    else: m = x.max(axis, keepdim=True)
    m = (m.abs() == math.inf).where(0, m)
    out = (x - m).exp()._acc_sum(axis, keepdim=True).log() + m
    if keepdim: return out
    return out.squeeze(self._axes(axis, "logsumexp")) if self.ndim else out

  # ---------------------------------------------------------------- linear algebra

  def matmul(self, other):
    other = self._as_tensor(other)
    a, b = self, other
    if a.ndim == 0 or b.ndim == 0:
      raise ShapeError(f"matmul: both operands need at least 1 dim, got shapes {a.shape} and {b.shape}")
    a2 = a.reshape(1, *a.shape) if a.ndim == 1 else a
    b2 = b.reshape(*b.shape, 1) if b.ndim == 1 else b
    k = a2.shape[-1]
    if b2.shape[-2] != k:
      raise ShapeError(f"matmul: inner dimensions differ for shapes {a.shape} and {b.shape} ({k} != {b2.shape[-2]})")
    try: batch = tuple(type(self)._broadcast_shape(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])))
    except ValueError:
      raise ShapeError(f"matmul: batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
    n, m = a2.shape[-2], b2.shape[-1]
    if a2.ndim > 2 and b2.ndim == 2 and a.ndim > 1 and 0 not in a2.shape:
      # batch dims on the left only (x @ W of a linear layer): one (batch * n, k) @ (k, m) matmul, so that the
      # gradient of W is one reduction over every row (x^T @ dy) instead of a per-batch product summed afterwards
      out = a2.reshape(-1, k).matmul(b2).reshape(*a2.shape[:-1], m)
      return out if b.ndim > 1 else out.reshape(*a2.shape[:-1])
    # the same graph on every device: (..., n, 1, k) * (..., 1, m, k) summed over k. How a device lays the
    # operands out is the compiler's choice (compiler/pack.py packs large CPU matmuls)
    x = a2.reshape(*a2.shape[:-1], 1, k)
    y = b2.transpose(-1, -2).reshape(*b2.shape[:-2], 1, m, k)
    out = (x * y)._acc_sum(-1)
    out_shape = list(batch) + ([n] if a.ndim > 1 else []) + ([m] if b.ndim > 1 else [])
    return out.reshape(*out_shape)

  def __matmul__(self, other): return self.matmul(other)
  def __rmatmul__(self, other): return self._as_tensor(other).matmul(self)
  def dot(self, other): return self.matmul(other)

  @staticmethod
  def einsum(formula: str, *operands):
    """Einstein summation: operands are lined up on one axis per letter, multiplied and summed."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
    if not operands: raise ValueError("einsum: needs at least one operand")
    formula = formula.replace(" ", "")
    if formula.count("->") > 1: raise ValueError(f"einsum: formula {formula!r} has more than one '->'")
    lhs, rhs = formula.split("->") if "->" in formula else (formula, None)
    terms = lhs.split(",")
    if len(terms) != len(operands):
      raise ShapeError(f"einsum: formula {formula!r} has {len(terms)} inputs but {len(operands)} operands were given")
    for t in terms + ([rhs] if rhs is not None else []):
      if not all(c.isalpha() and c.isascii() for c in t.replace("...", "")):
        raise ValueError(f"einsum: term {t!r} of {formula!r} may only hold letters and '...'")
    # ellipsis dims get private letters, right-aligned so they broadcast like numpy
    ell_counts = []
    for t, op in zip(terms, operands):
      named = len(t.replace("...", ""))
      ell = op.ndim - named if "..." in t else 0
      if ell < 0 or ("..." not in t and named != op.ndim):
        raise ShapeError(f"einsum: term {t!r} does not match operand of shape {op.shape}")
      ell_counts.append(ell)
    n_ell = max(ell_counts)
    ell_letters = "".join(chr(0x3b1 + i) for i in range(n_ell))   # Greek: never a user letter
    terms = [t.replace("...", ell_letters[n_ell - c:]) for t, c in zip(terms, ell_counts)]
    sizes = {}
    xs = []
    for t, x in zip(terms, operands):
      for c, s in zip(t, x.shape):
        if c in sizes and sizes[c] != s and not (c in ell_letters and 1 in (s, sizes[c])):
          raise ShapeError(f"einsum: letter {c!r} has size {s} in operand of shape {x.shape} but {sizes[c]} elsewhere")
        sizes[c] = max(sizes.get(c, s), s) if c in ell_letters else s
      # a letter repeated in one term takes the diagonal
      t = list(t)
      while len(set(t)) != len(t):
        c = next(c for c in t if t.count(c) > 1)
        p = t.index(c)
        q = t.index(c, p + 1)
        nd = x.ndim
        eye = (x._mask_dim(x.shape[p], p, nd) == x._mask_dim(x.shape[q], q, nd))
        x = eye.where(x, False if x.dtype.is_bool else 0)._acc_sum(q)
        t.pop(q)
      xs.append((t, x))
    if rhs is None:
      counts = {}
      for t in terms:
        for c in t: counts[c] = counts.get(c, 0) + 1
      out = ell_letters + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters))
    else:
      out = rhs.replace("...", ell_letters)
      if len(set(out)) != len(out): raise ValueError(f"einsum: output {rhs!r} repeats a letter")
      missing = [c for c in out if c not in sizes]
      if missing: raise ValueError(f"einsum: output letters {missing} of {formula!r} appear in no input")
    contracted = [c for c in dict.fromkeys("".join(terms)) if c not in out]
    letters = list(out) + contracted
    result = None
    for t, x in xs:
      present = [c for c in letters if c in t]
      x = x.permute(*[t.index(c) for c in present]) if present != t else x
      x = x.reshape(*[x.shape[present.index(c)] if c in present else 1 for c in letters])
      result = x if result is None else result * x
    if contracted: result = result._acc_sum(tuple(range(len(out), len(letters))))
    return result.expand(*[sizes[c] for c in out]) if result.ndim else result

  # ---------------------------------------------------------------- nn

  def softmax(self, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along `axis`. The gradient is torch's y * (g - sum(g * y)), in that form: a
    uniform upstream gradient gives exactly 0 wherever sum(y) rounds to 1."""
    x = self._float()
    ax = _norm_dim(axis, self.ndim, "softmax", self.shape)
    if self.ndim == 0: return x.reshape(1).softmax(0).reshape(())
    e = (x - x.max(ax, keepdim=True).detach()).exp()
    # a large softmax stores exp(x - max) once for its sum and its division (4 kernels), rather than computing it in
    # both (3): the demo transformer's attention, 16 x 4 x 64 x 64, -1.8 ms of kernel time a training step
    n = math.prod(x.shape)
    if isinstance(n, int) and n >= SOFTMAX_STORE_EXP: e = e.contiguous()
    y = e / e._acc_sum(ax, keepdim=True)
    return y._with_gradient((x,), lambda out, g, _x: (out * (g - (g * out)._acc_sum(ax, keepdim=True)),))

  def log_softmax(self, axis=-1):
    """x - logsumexp(x) along `axis`; the gradient is torch's g - exp(y) * sum(g)."""
    x = self._float()
    ax = _norm_dim(axis, self.ndim, "log_softmax", self.shape)
    if self.ndim == 0: return x.reshape(1).log_softmax(0).reshape(())
    y = x - x.logsumexp(ax, keepdim=True)
    return y._with_gradient((x,), lambda out, g, _x: (g - out.exp() * g._acc_sum(ax, keepdim=True),))

  def layernorm(self, axis=-1, eps=1e-5):
    x = self._float()
    self._axes(axis, "layernorm")
    d = x - x.mean(axis, keepdim=True)
    return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()

  def layer_norm(self, normalized_shape, weight=None, bias=None, eps=1e-5):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(ns) == 0 or len(ns) > self.ndim or tuple(self.shape[self.ndim - len(ns):]) != ns:
      raise ValueError(f"layer_norm: normalized_shape {ns} does not match the last dims of shape {self.shape}")
    out = self.layernorm(tuple(range(self.ndim - len(ns), self.ndim)), eps)
    if weight is not None: out = out * weight
    if bias is not None: out = out + bias
    return out

  def one_hot(self, num_classes: int):
    if not self.dtype.is_int: raise TypeError(f"one_hot: needs an integer tensor, got {self.dtype}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
      raise ValueError(f"one_hot: num_classes must be a positive int, got {num_classes!r}")
    ar = type(self).arange(num_classes, dtype=promote(self.dtype, dtypes.int32), device=self.device)
    return (self.reshape(*self.shape, 1) == ar).cast(dtypes.int32)

  # ---------------------------------------------------------------- creation

  def zeros_like(self, dtype=None, device=None): return self.full_like(0, dtype=dtype, device=device)
  def ones_like(self, dtype=None, device=None): return self.full_like(1, dtype=dtype, device=device)

  def full_like(self, fill_value, dtype=None, device=None):
    return type(self).full(tuple(self.shape), fill_value, dtype=dtype if dtype is not None else self.dtype,
                           device=device if device is not None else self.device)

  def empty_like(self, dtype=None, device=None):
    return type(self).empty(*self.shape, dtype=dtype if dtype is not None else self.dtype,
                            device=device if device is not None else self.device)

  def rand_like(self, dtype=None, device=None):
    dt = to_dtype(dtype) if dtype is not None else self.dtype
    if not dt.is_float: raise TypeError(f"rand_like: needs a float dtype, got {dt}")
    return type(self).rand(*self.shape, dtype=dt, device=device if device is not None else self.device)

  def randn_like(self, dtype=None, device=None):
    dt = to_dtype(dtype) if dtype is not None else self.dtype
    if not dt.is_float: raise TypeError(f"randn_like: needs a float dtype, got {dt}")
    return type(self).randn(*self.shape, dtype=dt, device=device if device is not None else self.device)

  @classmethod
  def randn(cls, *shape, dtype=None, device=None):
    """Standard normal samples by Box-Muller from two uniform draws."""
    shape = _shape_arg(shape, "randn")
    dt = to_dtype(dtype) if dtype is not None else dtypes.float32
    if not dt.is_float: raise TypeError(f"randn: needs a float dtype, got {dt}")
    u = cls.rand(2, *shape, dtype=dtypes.float32, device=device)
    u1 = u.shrink([(0, 1)] + [None] * len(shape)).reshape(*shape)
    u2 = u.shrink([(1, 2)] + [None] * len(shape)).reshape(*shape)
    z = ((1 - u1).log() * -2).sqrt() * (u2 * (2 * math.pi)).cos()
    return z if dt == dtypes.float32 else z.cast(dt)

  @classmethod
  def randint(cls, *args, low=0, high=10, shape=None, dtype=dtypes.int32, device=None):
    """Random integers in [low, high). tinygrad's form: randint(*shape, low=0, high=10); torch's form: randint(high,
    size) or randint(low, high, size), the size a tuple or list (or shape=)."""
    if shape is None and args and isinstance(args[-1], (tuple, list)): args, shape = args[:-1], args[-1]
    if shape is None:      # tinygrad: the positional ints are the shape
      shape = args if args else (1,)
    elif len(args) == 1: low, high = 0, args[0]
    elif len(args) == 2: low, high = args
    elif len(args) > 2: raise ArgumentTypeError(f"randint: low, high and a size, got {args!r} and shape={shape!r}")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (low, high)) or high <= low:
      raise ValueError(f"randint: need ints low < high, got low={low!r} high={high!r}")
    shape = _shape_arg((shape,) if isinstance(shape, (tuple, list)) else (shape,), "randint")
    dt = to_dtype(dtype)
    r = cls.rand(*shape, dtype=dtypes.float32, device=device)
    v = (r * (high - low)).trunc().cast(dtypes.int32).minimum(high - low - 1)
    return (v.cast(dt) + low) if dt.is_int else (v + low).cast(dt)

  @classmethod
  def uniform(cls, *shape, low=0.0, high=1.0, dtype=None, device=None):
    shape = _shape_arg(shape, "uniform")
    dt = to_dtype(dtype) if dtype is not None else dtypes.float32
    r = cls.rand(*shape, dtype=dtypes.float32, device=device) * (high - low) + low
    return r if dt == dtypes.float32 else r.cast(dt)

  @classmethod
  def linspace(cls, start, stop, steps, dtype=None, device=None):
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
      raise ValueError(f"linspace: steps must be a non-negative int, got {steps!r}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.float32
    if dt.is_bool: raise DTypeArgumentError("linspace: dtype bool is not supported (as in torch); use a float or int dtype")
    if steps <= 1: return cls.full((steps,), start, dtype=dtypes.float32, device=device).cast(dt)
    step = (stop - start) / (steps - 1)
    i = cls.arange(steps, dtype=dtypes.float32, device=device)
    # the first half counts up from start, the second down from stop, so both ends are exact
    out = (i < steps // 2).where(i * step + start, stop - ((steps - 1) - i) * step)
    return out if dt == dtypes.float32 else out.cast(dt)

  @classmethod
  def eye(cls, n, m=None, dtype=None, device=None):
    m = n if m is None else m
    for v in (n, m):
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"eye: sizes must be non-negative ints, got n={n!r} m={m!r}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.float32
    rows = cls.arange(n, dtype=dtypes.int32, device=device).reshape(n, 1)
    cols = cls.arange(m, dtype=dtypes.int32, device=device).reshape(1, m)
    return (rows == cols).cast(dt)
