"""The lazy Tensor: every op adds UOps to a graph; realize() schedules, compiles and runs it."""
from __future__ import annotations
import gc, math, threading, weakref
from weakref import ref as _weakref
from typing import Sequence
import numpy as np
from baregrad.compiler.uop import UOp, Ops, MOVEMENT
from baregrad.compiler.dtype import DType, dtypes, to_dtype, promote, weak_promote, scalar_dtype, truncate
from baregrad.compiler.schedule import create_schedule, graph_order, leaf_view, realized, remember, forget
from baregrad.compiler import shape as sym
from baregrad.hcq.device import Device, canonical
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.runtime import _run_schedule
from baregrad.drivers import settings
from .composite import ComposedOps, ShapeError, DimError, ArgumentError, ModeError, DTypeError, RangeOverflowError, sum_dtype, dtype_arg
from .elementwise import ElementwiseOps
from .selection import SelectionOps
from .spatial import SpatialOps
from .losses import LossOps
from .autograd import gradients
from . import multi as _multi
from .device_dtypes import require_float64

Scalar = (int, float, bool, np.integer, np.floating, np.bool_)
_COMPARISONS = (Ops.CMPLT, Ops.CMPNE)
SPLIT_REDUCE = settings.SPLIT_REDUCE   # reductions this long into <= 64 outputs split in two
SPLIT_GROUPS = 256


def _shape_args(shape: tuple, op: str) -> tuple:
  """Sizes: ints, or symbolic sizes (a bound Variable, arithmetic on one: compiler/shape.py) in canonical form."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out = []
  for s in shape:
    if isinstance(s, UOp) and s.dtype is dtypes.index: out.append(sym.canonical(s)); continue
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
      raise TypeError(f"{op}: shape entries must be ints (or bound Variables), got {shape!r}")
    out.append(int(s))
  return tuple(out)


def _sint(x, op: str):
  """An int or a symbolic size given as an offset or a size."""
  if isinstance(x, UOp) and x.dtype is dtypes.index: return sym.canonical(x)
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{op}: expected an int (or a bound Variable), got {x!r}")
  return int(x)


def _fmt(shape) -> str: return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _np_to_bf16_bits(a: np.ndarray) -> np.ndarray:
  b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
  rounded = ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)
  return np.where(np.isnan(a), np.uint16(0x7fc0), rounded)


class Variable:
  """A symbolic integer in [min, max]. `v.bind(value)` gives a bound variable: use it (or arithmetic on it,
  `start_pos + 1`) wherever an int goes: as a value in Tensor ops, or as a size or an offset (shrink, pad, reshape,
  expand, slicing, arange/full/zeros). Kernels take its value as an argument and are compiled once for every value
  in [min, max]; a jitted function called with another value replays its kernels (compiler/shape.py)."""
  def __init__(self, name: str, min_val: int, max_val: int):
    if not isinstance(name, str) or not name.isidentifier():
      raise ValueError(f"Variable name must be an identifier, got {name!r}")
    self.uop = UOp.variable(name, min_val, max_val)
    self.name, self.min, self.max = name, min_val, max_val
  def bind(self, value: int) -> UOp:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise TypeError(f"Variable {self.name}: bind takes an int, got {value!r}")
    if not self.min <= value <= self.max:
      raise ValueError(f"Variable {self.name}={value} is outside its range [{self.min}, {self.max}]")
    return UOp(Ops.BIND, dtypes.index, (self.uop, UOp.const(dtypes.index, int(value))))
  def __repr__(self): return f"Variable({self.name!r}, {self.min}, {self.max})"


def _sym_tensor(x: UOp, device) -> "Tensor":
  """A symbolic size (arithmetic on bound Variables) as an int32 scalar tensor on `device`."""
  done: dict[UOp, UOp] = {}
  for n in x.toposort():
    if n.op is Ops.BIND: done[n] = UOp(Ops.BIND, dtypes.index, (n.src[0], _const(n.src[1].arg, dtypes.index, device)))
    elif n.op is Ops.CONST: done[n] = _const(n.arg, dtypes.index, device)
    elif n.op is Ops.DEFINE_VAR: continue
    elif n.op is Ops.BIND or any(s not in done for s in n.src):
      raise ValueError(f"a Variable must be bound (v.bind(k)) to be used as a value, got {x}")
    else: done[n] = UOp(n.op, n.dtype, tuple(done[s] for s in n.src), n.arg)
  if x not in done: raise ValueError(f"a Variable must be bound (v.bind(k)) to be used as a value, got {x}")
  return Tensor(done[x]).cast(dtypes.int32)


class Tensor(ComposedOps, ElementwiseOps, SelectionOps, SpatialOps, LossOps):
  """A lazy n-dimensional array on a device."""
  __slots__ = ("uop", "_requires_grad", "grad")
  _seed: list = [0, 0]   # [seed, counter]

  def __init__(self, data, dtype=None, device: str | None = None, requires_grad: bool | None = None):
    self._requires_grad, self.grad = None, None     # None: not set (backward's fallback may fill .grad)
    self._init(data, dtype, device)
    if requires_grad: self.requires_grad = True
    elif requires_grad is not None: self._requires_grad = False

  def _init(self, data, dtype, device):
    dtype = None if dtype is None else to_dtype(dtype)
    if isinstance(data, UOp):
      self.uop = data if dtype is None or data.dtype == dtype else data.cast(dtype)
      return
    device = _device_arg(device)
    if isinstance(data, Tensor):
      t = data.to(device)
      self.uop = t.uop if dtype is None else t.cast(dtype).uop
      return
    if isinstance(data, Scalar):
      dt = dtype or (to_dtype(data.dtype) if isinstance(data, np.generic) else scalar_dtype(data))
      if isinstance(data, np.generic): data = data.item()
      self.uop = _const(data, dt, device)
      return
    if isinstance(data, (list, tuple, np.ndarray)):
      if isinstance(device, tuple):    # the host data written to each device (replicated)
        self.uop = _multi.multi_uop([_from_numpy(data, dtype, d) for d in device], None, None)
      else: self.uop = _from_numpy(data, dtype, device)
      return
    raise TypeError(f"cannot make a Tensor from {type(data).__name__}: expected a scalar, a (nested) list, a numpy "
                    f"array or a Tensor")

  # ---------------- properties ----------------
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def device(self) -> str | tuple[str, ...]:
    """The device name, or for a tensor on several devices (shard(), to(devices)) the tuple of their names."""
    return self.uop.device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int:
    """The number of elements (symbolic where a dim is)."""
    return sym.sprod(self.shape)
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.dtype.itemsize
  def size(self, dim=None):
    return self.shape if dim is None else self.shape[dim]
  def __len__(self):
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __repr__(self):
    return f"<Tensor shape={_fmt(self.shape)} dtype={self.dtype.name} device={self.device}>"
  def __hash__(self): return id(self)

  # ---------------- creation ----------------
  @staticmethod
  def full(shape, fill_value, dtype=None, device=None) -> Tensor:
    shape = _shape_args((shape,) if isinstance(shape, (int, UOp)) else tuple(shape), "full")
    if any(sym.vmin(s) < 0 for s in shape): raise ValueError(f"full: negative dimension in shape {_fmt(shape)}")
    dev = _device_arg(device)
    dt = to_dtype(dtype) if dtype is not None else scalar_dtype(fill_value)
    t = Tensor(_const(fill_value, dt, dev))
    return t.reshape((1,) * len(shape)).expand(shape) if shape else t

  @staticmethod
  def zeros(*shape, dtype=None, device=None) -> Tensor:
    return Tensor.full(_shape_args(shape, "zeros"), 0, dtype or dtypes.default_float, device)
  @staticmethod
  def ones(*shape, dtype=None, device=None) -> Tensor:
    return Tensor.full(_shape_args(shape, "ones"), 1, dtype or dtypes.default_float, device)
  @staticmethod
  def empty(*shape, dtype=None, device=None) -> Tensor:
    shape = _shape_args(shape, "empty")
    dev = _device_arg(device)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if isinstance(dev, tuple):
      return Tensor(_multi.multi_uop([Tensor.empty(*shape, dtype=dt, device=d).uop for d in dev], None, None))
    if dt == dtypes.float64: require_float64(dev, "empty")
    if any(isinstance(s, UOp) for s in shape):
      raise TypeError(f"empty: a symbolic shape {_fmt(shape)} is not supported (use zeros or full)")
    buf = Buffer(dev, math.prod(shape), dt)
    return Tensor(UOp(Ops.BUFFER, dt, (), buf)).reshape(shape)

  @staticmethod
  def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange: step must not be zero")
    if any(isinstance(v, UOp) for v in (start, stop, step)):
      return Tensor._symbolic_arange(start, stop, step, dtype, device)
    n = max(0, math.ceil((stop - start) / step))
    all_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    dt = to_dtype(dtype) if dtype is not None else (dtypes.default_int if all_int else dtypes.default_float)
    if dtype is None and all_int and not all(dt.min <= int(v) <= dt.max for v in (start, stop - step, step)):
      dt = dtypes.int64          # values past the default int's range: int64, as numpy picks
    if dt.is_int and n > 0 and not all(dt.min <= v <= dt.max for v in (start, start + (n - 1) * step)):
      raise RangeOverflowError(f"arange: values from {start} to {start + (n - 1) * step} do not fit {dt.name} "
                               f"[{dt.min}, {dt.max}]; pick a wider dtype")
    dev = _device_arg(device)
    idx = Tensor(UOp(Ops.IOTA, dt if dt.is_int else dtypes.int32, (UOp(Ops.DEVICE, None, (), dev),), n))
    if not dt.is_int: idx = idx.cast(dt)
    out = idx * step if step != 1 else idx
    return (out + start if start != 0 else out).cast(dt)

  @staticmethod
  def _symbolic_arange(start, stop, step, dtype, device) -> Tensor:
    """arange(start, stop) with a symbolic start or stop (step 1): stop - start integers."""
    if isinstance(step, UOp) or step != 1: raise ValueError(f"arange: a symbolic range needs step 1, got step {step}")
    start, stop = _sint(start, "arange"), _sint(stop, "arange")
    n = sym.ssub(stop, start)
    if sym.vmin(n) < 0: raise ValueError(f"arange: stop {stop} may be less than start {start}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
    dev = _device_arg(device)
    idx = Tensor(UOp(Ops.IOTA, dt if dt.is_int else dtypes.int32, (UOp(Ops.DEVICE, None, (), dev),), n))
    if not dt.is_int: idx = idx.cast(dt)
    if isinstance(start, UOp): return (idx + _sym_tensor(start, dev).cast(idx.dtype)).cast(dt)
    return (idx + start if start != 0 else idx).cast(dt)

  @staticmethod
  def manual_seed(seed: int = 0):
    Tensor._seed[:] = [int(seed), 0]

  @staticmethod
  def _random_bits(shape, device=None) -> Tensor:
    """uint32 random bits from Threefry-2x32 (20 rounds), keyed by the seed, counter-based: the same seed gives
    the same bits on every device."""
    shape = _shape_args(tuple(shape), "rand")
    n = math.prod(shape)
    seed, counter = Tensor._seed
    Tensor._seed[1] = counter + n
    dev = _device_arg(device)
    ctr = Tensor.arange(n, dtype=dtypes.uint32, device=dev) + (counter & 0xffffffff)
    hi = Tensor.full((n,), (counter >> 32) & 0xffffffff, dtypes.uint32, dev)
    return _threefry2x32(ctr, hi, seed & 0xffffffff, (seed >> 32) & 0xffffffff).reshape(shape)

  @staticmethod
  def rand(*shape, dtype=None, device=None) -> Tensor:
    shape = _shape_args(shape, "rand")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dt.is_float: raise TypeError(f"rand: dtype must be a float type, got {dt.name} (use randint for integers)")
    bits = Tensor._random_bits(shape, device)
    # the top 24 bits as a float in [0, 1)
    return ((bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))).cast(dt)

  # ---------------- movement primitives ----------------
  def reshape(self, *shape) -> Tensor:
    """A new view of the elements in `shape`: one entry may be -1 (inferred), and None keeps that dim's size
    (tinygrad's form, e.g. reshape(None, -1) flattens all but the first dim)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    if any(s is None for s in shape):
      if any(s is None and i >= self.ndim for i, s in enumerate(shape)):
        raise ShapeError(f"reshape: None keeps the dim at its place in shape {_fmt(self.shape)}, but {shape!r} has None "
                         f"past its {self.ndim} dims")
      shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(shape))
    shape = _shape_args(shape, "reshape")
    if sum(1 for s in shape if not isinstance(s, UOp) and s == -1) > 1:
      raise ArgumentError(f"reshape: only one dimension can be -1, got {_fmt(shape)}")
    if any(not isinstance(s, UOp) and s == -1 for s in shape):
      known = sym.sprod(s for s in shape if isinstance(s, UOp) or s != -1)
      rest = sym.sdiv_exact(self.numel(), known) if not (isinstance(known, int) and known == 0) else None
      if rest is None:
        raise ShapeError(f"reshape: cannot reshape tensor of shape {_fmt(self.shape)} ({self.numel()} elements) "
                         f"into {_fmt(shape)}")
      shape = tuple(rest if not isinstance(s, UOp) and s == -1 else s for s in shape)
    if any(sym.vmin(s) < 0 for s in shape): raise ValueError(f"reshape: negative dimension in {_fmt(shape)}")
    if sym.sprod(shape) != self.numel():
      raise ShapeError(f"reshape: cannot reshape tensor of shape {_fmt(self.shape)} ({self.numel()} elements) into "
                       f"{_fmt(shape)} ({sym.sprod(shape)} elements)")
    if shape == self.shape: return self
    src = self.uop.src[0] if self.uop.op is Ops.RESHAPE else self.uop
    return Tensor(src if src.shape == shape else UOp(Ops.RESHAPE, self.dtype, (src,), shape))

  def permute(self, *order) -> Tensor:
    order = _shape_args(order, "permute")
    order = tuple(o + self.ndim if o < 0 else o for o in order)
    if len(order) == self.ndim and any(not 0 <= o < self.ndim for o in order):
      raise DimError(f"permute: order {order} names a dim out of range for shape {_fmt(self.shape)}")
    if sorted(order) != list(range(self.ndim)):
      raise ShapeError(f"permute: order {order} is not a permutation of the {self.ndim} dims of shape {_fmt(self.shape)}")
    if order == tuple(range(self.ndim)): return self
    return Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), order))

  def expand(self, *shape) -> Tensor:
    if shape == self.shape or (len(shape) == 1 and shape[0] == self.shape): return self
    shape = _shape_args(shape, "expand")
    if shape == self.shape: return self
    if len(shape) < self.ndim:
      raise ShapeError(f"expand: cannot expand shape {_fmt(self.shape)} to {_fmt(shape)} (fewer dims)")
    x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
    new = tuple(s if isinstance(s, UOp) or s != -1 else o for s, o in zip(shape, x.shape))
    for s, o in zip(new, x.shape):
      if o is not s and o != s and not (not isinstance(o, UOp) and o == 1):
        raise ShapeError(f"expand: cannot expand shape {_fmt(self.shape)} to {_fmt(shape)}")
    if new == x.shape: return x
    return Tensor(UOp(Ops.EXPAND, self.dtype, (x.uop,), new))

  def pad(self, padding, mode: str = "constant", value=0.0) -> Tensor:
    """Pad each dim, or crop it where an amount is negative. `padding` is numpy-style, one (before, after) pair or
    None per dim, or torch-style flat ints for the last dims, last dim first: (left, right, top, bottom, ...).
    `mode` is torch.nn.functional.pad's: "constant" fills with `value`; "reflect" mirrors without repeating the
    edge, "replicate" repeats the edge, "circular" wraps around (SpatialOps._pad_edges). Amounts are relative to
    this tensor: a crop removes its own elements, never the other side's padding; in "circular" mode the crop comes
    first and the rest wraps around what is left (as torch), where what is left is long enough."""
    padding = tuple(padding)
    if _symbolic_pads(padding) or any(isinstance(d, UOp) for d in self.shape):
      return self._symbolic_pad(padding, mode, value)
    if padding and all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in padding):
      if len(padding) % 2 or len(padding) > 2 * self.ndim:
        raise ValueError(f"pad: flat padding {padding} needs an even number of ints, at most 2 per dim of shape "
                         f"{_fmt(self.shape)} (left, right of the last dim first)")
      last = [(int(padding[i]), int(padding[i + 1])) for i in range(0, len(padding), 2)]
      pads = ((0, 0),) * (self.ndim - len(last)) + tuple(reversed(last))
    else:
      if len(padding) != self.ndim or not all(p is None or len(p) == 2 for p in padding):
        raise ValueError(f"pad: need one (before, after) pair per dim of shape {_fmt(self.shape)}, or flat ints "
                         f"(left, right, top, bottom, ...) for the last dims, got {padding}")
      pads = tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    if mode not in ("constant", "reflect", "replicate", "circular"):
      raise ModeError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    if mode != "constant" and value != 0:
      raise ValueError(f"pad: mode {mode!r} takes no fill value (got value={value!r}); use mode='constant'")
    for (b, a), s in zip(pads, self.shape):
      if max(-b, 0) + max(-a, 0) > s:
        raise ValueError(f"pad: padding {pads} crops more than the dims of shape {_fmt(self.shape)}")
    if all(p == (0, 0) for p in pads): return self
    grow = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    x = self
    crop = [(max(-b, 0), n - max(-a, 0)) for (b, a), n in zip(pads, self.shape)]
    if mode == "circular" and any(b < 0 or a < 0 for b, a in pads) and \
       all(max(g) <= e - s for g, (s, e) in zip(grow, crop)):   # (a wrap longer than what is left: pad, then crop)
      return self.shrink(crop).pad(grow, mode=mode)
    if mode != "constant": x = x._pad_edges(grow, mode)
    elif any(b or a for b, a in grow): x = Tensor(UOp(Ops.PAD, self.dtype, (self.uop,), (grow, truncate(value, self.dtype))))
    return x.shrink([(max(-b, 0), n - max(-a, 0)) for (b, a), n in zip(pads, x.shape)])

  def _symbolic_pad(self, padding, mode, value) -> Tensor:
    """pad with a symbolic amount or on a symbolic dim: (before, after) pairs per dim, amounts >= 0, constant mode."""
    if mode != "constant": raise ValueError(f"pad: mode {mode!r} with symbolic sizes is not supported (constant only)")
    if len(padding) != self.ndim or not all(p is None or len(p) == 2 for p in padding):
      raise ValueError(f"pad: with symbolic sizes, give one (before, after) pair per dim of shape {_fmt(self.shape)}")
    pads = tuple((0, 0) if p is None else (_sint(p[0], "pad"), _sint(p[1], "pad")) for p in padding)
    if any(sym.vmin(x) < 0 for p in pads for x in p):
      raise ValueError(f"pad: symbolic padding {pads} may be negative (crop with shrink instead)")
    if all(not isinstance(x, UOp) and x == 0 for p in pads for x in p): return self
    return Tensor(UOp(Ops.PAD, self.dtype, (self.uop,), (pads, truncate(value, self.dtype))))

  def shrink(self, arg) -> Tensor:
    arg = tuple(arg)
    if len(arg) != self.ndim:
      raise ValueError(f"shrink: need one (start, end) pair per dim of shape {_fmt(self.shape)}, got {arg}")
    rng = tuple((0, s) if a is None else (_sint(a[0], "shrink"), _sint(a[1], "shrink")) for a, s in zip(arg, self.shape))
    if any(isinstance(x, UOp) for r in rng for x in r) or any(isinstance(s, UOp) for s in self.shape):
      _check_symbolic_range(rng, self.shape)
    else:
      for (b, e), s in zip(rng, self.shape):
        if not 0 <= b <= e <= s: raise ValueError(f"shrink: range {rng} is outside shape {_fmt(self.shape)}")
    if all(not isinstance(b, UOp) and b == 0 for b, _ in rng) and all(e is s or e == s for (_, e), s in zip(rng, self.shape)):
      return self
    return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), rng))

  def flip(self, *axis) -> Tensor:
    axis = _shape_args(axis, "flip")
    axes = tuple(sorted({a + self.ndim if a < 0 else a for a in axis}))
    if len(axes) != len(axis): raise ArgumentError(f"flip: duplicate value in axis {axis}")
    if any(not 0 <= a < self.ndim for a in axes): raise DimError(f"flip: axis {axis} out of range for shape {_fmt(self.shape)}")
    axes = tuple(a for a in axes if self.shape[a] > 1)
    if not axes: return self
    return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), axes))

  # ---------------- elementwise primitives ----------------
  @staticmethod
  def _broadcast_shape(*shapes) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
      big = {d for d in dims if d != 1}
      if len(big) > 1:
        raise ShapeError(f"shapes {' and '.join(_fmt(s) for s in shapes)} cannot be broadcast together")
      out.append(big.pop() if big else 1)
    return tuple(out)

  def _to_tensor_like(self, x, dtype: DType | None = None) -> Tensor:
    if isinstance(x, Tensor): return x
    return Tensor(_const(x, dtype or weak_promote(self.dtype, x), self.device))

  def _operands(self, other, reverse=False, dtype_fn=None) -> tuple[Tensor, Tensor]:
    """Promote and broadcast self and other (a Tensor or a Python scalar)."""
    if isinstance(other, Tensor):
      su, ou = self.uop, other.uop
      if su.dtype is ou.dtype and dtype_fn is None and su.shape == ou.shape and su.device == ou.device:
        return (other, self) if reverse else (self, other)     # the common case: nothing to promote or broadcast
      if other.device != self.device:
        raise ValueError(f"operands are on different devices: {self.device} and {other.device}; move one with .to()")
      dt = promote(self.dtype, other.dtype)
    elif type(other) is float and dtype_fn is None and self.uop.dtype.is_float:   # the common case first: x * 0.5
      u = self.uop
      b = _wrap(_broadcast_const(other, u.dtype, u.device, u.shape))
      return (b, self) if reverse else (self, b)
    elif isinstance(other, Scalar):
      dt = weak_promote(self.dtype, other)
      if dt.is_int and not isinstance(other, (bool, np.bool_)) and not dt.min <= int(other) <= dt.max:
        # a Python int outside the tensor's range widens the result as numpy 1's value-based promotion did
        # (numpy 2 raises): int32 + 2**40 is int64; past uint64/int64 it is an OverflowError
        v = int(other)
        kinds = ("uint8", "uint16", "uint32", "uint64") if dt.is_unsigned and v >= 0 else ("int8", "int16", "int32", "int64")
        fits = [np.dtype(k) for k in kinds if np.iinfo(k).min <= v <= np.iinfo(k).max]
        wide = np.promote_types(dt.np, fits[0]) if fits else None
        if wide is None or wide.kind not in "iu":
          raise OverflowError(f"Python int {other} does not fit an integer dtype together with {self.dtype.name}; "
                              "use a float or cast the tensor")
        dt = to_dtype(wide.name)
    elif isinstance(other, UOp) and other.dtype is dtypes.index:    # a bound Variable, or arithmetic on one
      other = _sym_tensor(other, self.device)
      dt = weak_promote(self.dtype, 1)
    elif isinstance(other, (list, np.ndarray)):
      other = Tensor(other, device=self.device)
      dt = promote(self.dtype, other.dtype)
    else: raise TypeError(f"unsupported operand type {type(other).__name__} for a Tensor op")
    if dtype_fn is not None: dt = dtype_fn(dt)
    a = self if self.dtype is dt else self.cast(dt)
    if isinstance(other, Tensor):
      b = other if other.dtype is dt else other.cast(dt)
      if a.shape != b.shape:
        shape = Tensor._broadcast_shape(a.shape, b.shape)
        a, b = a.expand(shape), b.expand(shape)
    else: b = Tensor(_broadcast_const(other, dt, self.device, a.shape))
    return (b, a) if reverse else (a, b)

  def _alu(self, op: Ops, *src: Tensor, dtype: DType | None = None) -> Tensor:
    if dtype is None: dtype = dtypes.bool if op in _COMPARISONS else self.uop.dtype
    return _wrap(UOp(op, dtype, (self.uop, *[s.uop for s in src])))

  def _binop(self, op: Ops, other, reverse=False, dtype_fn=None) -> Tensor:
    a, b = self._operands(other, reverse, dtype_fn)
    return a._alu(op, b)

  def add(self, other, reverse=False) -> Tensor:
    return self._binop(Ops.ADD, other, reverse)
  def mul(self, other, reverse=False) -> Tensor:
    return self._binop(Ops.MUL, other, reverse)
  def sub(self, other, reverse=False) -> Tensor:
    a, b = self._operands(other, reverse)
    if a.dtype.is_bool: raise TypeError("subtraction of bool tensors is not supported; use logical_xor or cast first")
    return a._alu(Ops.ADD, b._alu(Ops.NEG))
  def div(self, other, reverse=False, *, rounding_mode=None) -> Tensor:
    """True division (ints and bools give float32), or torch's rounding_mode: "trunc" rounds the quotient toward
    zero (ints: C's integer division, x / 0 gives 0 where torch raises), "floor" rounds it down (as idiv, //)."""
    if rounding_mode == "floor": return self.idiv(other, reverse)
    if rounding_mode == "trunc":
      a, b = self._operands(other, reverse)
      if a.dtype.is_float: return a._alu(Ops.MUL, b._alu(Ops.RECIP)).trunc()
      if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
      return a._alu(Ops.IDIV, b)
    if rounding_mode is not None:
      raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = self._operands(other, reverse, lambda d: d if d.is_float else dtypes.default_float)
    return a._alu(Ops.MUL, b._alu(Ops.RECIP))
  def idiv(self, other, reverse=False) -> Tensor:
    """Floor division (Python/numpy semantics)."""
    a, b = self._operands(other, reverse)
    if a.dtype.is_float:
      # Python/numpy float floor division: from the exact remainder, so large quotients stay right
      mod = a._alu(Ops.MOD, b)
      div = (a - mod) / b
      div = (mod.ne(0) & (b < 0).ne(mod < 0)).where(div - 1, div)
      fl = div.floor()
      fl = ((div - fl) > 0.5).where(fl + 1, fl)
      fl = div.eq(0).where((a / b) * 0, fl)
      return b.eq(0).where(a / b, fl)
    if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    q = a._alu(Ops.IDIV, b)
    if a.dtype.is_unsigned: return q
    r = a._alu(Ops.MOD, b)
    fix = r._alu(Ops.CMPNE, b._const_like(0)) & (r._alu(Ops.CMPLT, b._const_like(0))._alu(Ops.CMPNE, b._alu(Ops.CMPLT, b._const_like(0))))
    return fix.where(q - 1, q)
  def mod(self, other, reverse=False) -> Tensor:
    """Remainder with the sign of the divisor (Python/numpy semantics)."""
    a, b = self._operands(other, reverse)
    if a.dtype.is_float:
      r = a._alu(Ops.MOD, b)     # fmod: exact, with the sign of a
      return (r.ne(0) & (r < 0).ne(b < 0)).where(r + b, r)
    if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    r = a._alu(Ops.MOD, b)
    if a.dtype.is_unsigned: return r
    fix = r._alu(Ops.CMPNE, r._const_like(0)) & (r._alu(Ops.CMPLT, r._const_like(0))._alu(Ops.CMPNE, b._alu(Ops.CMPLT, b._const_like(0))))
    return fix.where(r + b, r)
  def maximum(self, other) -> Tensor:
    return self._binop(Ops.MAX, other)
  def minimum(self, other) -> Tensor:
    a, b = self._operands(other)
    if a.dtype.is_float: return -((-a)._alu(Ops.MAX, -b))   # NaN from either side; ties split the gradient
    return a._alu(Ops.CMPLT, b).where(a, b)

  def _const_like(self, v) -> Tensor: return Tensor(_const(v, self.dtype, self.device)).expand(self.shape) if self.shape else Tensor(_const(v, self.dtype, self.device))

  def __add__(self, x): return self.add(x)
  def __radd__(self, x): return self.add(x, True)
  def __sub__(self, x): return self.sub(x)
  def __rsub__(self, x): return self.sub(x, True)
  def __mul__(self, x): return self.mul(x)
  def __rmul__(self, x): return self.mul(x, True)
  def __truediv__(self, x): return self.div(x)
  def __rtruediv__(self, x): return self.div(x, True)
  def __floordiv__(self, x): return self.idiv(x)
  def __rfloordiv__(self, x): return self.idiv(x, True)
  def __mod__(self, x): return self.mod(x)
  def __rmod__(self, x): return self.mod(x, True)
  def __neg__(self):
    if self.dtype.is_bool: raise TypeError("negation of a bool tensor is not supported; use logical_not()")
    return self._alu(Ops.NEG)
  def __pos__(self): return self

  # comparisons (NaN compares unequal and unordered, as in numpy)
  def lt(self, x): return self._binop(Ops.CMPLT, x)
  def gt(self, x): return self._binop(Ops.CMPLT, x, reverse=True)
  def ne(self, x): return self._binop(Ops.CMPNE, x)
  def eq(self, x): return self.ne(x).logical_not()
  def le(self, x):
    a, b = self._operands(x)
    return a._alu(Ops.CMPLT, b) | b._alu(Ops.CMPNE, a).logical_not()
  def ge(self, x):
    a, b = self._operands(x)
    return b._alu(Ops.CMPLT, a) | b._alu(Ops.CMPNE, a).logical_not()
  __lt__, __gt__, __le__, __ge__ = lt, gt, le, ge
  def __eq__(self, x): return self.eq(x)
  def __ne__(self, x): return self.ne(x)

  # bitwise
  def _bitop(self, op: Ops, x, reverse=False) -> Tensor:
    """&, |, ^, <<, >>. A Python int that a signed tensor's dtype cannot hold but its bit width can, as an unsigned
    value (int32 | 0xFFFFFFFF), is that bit pattern: it wraps to the signed value (-1), as tinygrad, and the dtype
    stays (other out-of-range ints widen, numpy 1's rule; torch raises)."""
    bits = 8 * self.dtype.itemsize
    if op in (Ops.AND, Ops.OR, Ops.XOR) and self.dtype.is_int and not self.dtype.is_unsigned and \
       isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and self.dtype.max < int(x) < 2 ** bits:
      x = int(x) - 2 ** bits
    a, b = self._operands(x, reverse)
    if a.dtype.is_float: raise DTypeError(f"bitwise {op.name.lower()} needs integer or bool tensors, got {a.dtype.name}")
    return a._alu(op, b)
  def bitwise_and(self, x): return self._bitop(Ops.AND, x)
  def bitwise_or(self, x): return self._bitop(Ops.OR, x)
  def bitwise_xor(self, x): return self._bitop(Ops.XOR, x)
  def __and__(self, x): return self._bitop(Ops.AND, x)
  def __rand__(self, x): return self._bitop(Ops.AND, x, True)
  def __or__(self, x): return self._bitop(Ops.OR, x)
  def __ror__(self, x): return self._bitop(Ops.OR, x, True)
  def __xor__(self, x): return self._bitop(Ops.XOR, x)
  def __rxor__(self, x): return self._bitop(Ops.XOR, x, True)
  def __lshift__(self, x): return self._bitop(Ops.SHL, x)
  def __rshift__(self, x): return self._bitop(Ops.SHR, x)
  def __rlshift__(self, x): return self._bitop(Ops.SHL, x, True)
  def __rrshift__(self, x): return self._bitop(Ops.SHR, x, True)
  def __invert__(self):
    if self.dtype.is_bool: return self.logical_not()
    if self.dtype.is_float: raise DTypeError(f"bitwise not needs an integer or bool tensor, got {self.dtype.name}")
    return self._alu(Ops.XOR, self._const_like(-1 if not self.dtype.is_unsigned else self.dtype.max))
  def logical_not(self):
    b = self if self.dtype.is_bool else self._alu(Ops.CMPNE, self._const_like(0))
    return b._alu(Ops.CMPNE, b._const_like(True))

  # unary math (ints are computed as float32)
  def _float_unary(self, op: Ops) -> Tensor:
    x = self if self.dtype.is_float else self.cast(dtypes.default_float)
    return x._alu(op)
  def exp2(self): return self._float_unary(Ops.EXP2)
  def log2(self): return self._float_unary(Ops.LOG2)
  def sin(self): return self._float_unary(Ops.SIN)
  def sqrt(self): return self._float_unary(Ops.SQRT)
  def reciprocal(self): return self._float_unary(Ops.RECIP)
  def trunc(self): return self._alu(Ops.TRUNC) if self.dtype.is_float else self
  def floor(self): return self._alu(Ops.FLOOR) if self.dtype.is_float else self
  def ceil(self):
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (t < self).where(t + 1, t)
  def round(self):
    """Round half to even, like numpy."""
    if not self.dtype.is_float: return self
    f = self.floor()
    diff = self - f
    up = (diff > 0.5) | ((diff == 0.5) & ((f * 0.5).floor() * 2 != f))
    return up.where(f + 1, f)

  def where(self, x, y) -> Tensor:
    cond = self if self.dtype.is_bool else self.cast(dtypes.bool)
    if isinstance(x, Tensor) and isinstance(y, Tensor): dt = promote(x.dtype, y.dtype)
    elif isinstance(x, Tensor): dt = weak_promote(x.dtype, y)
    elif isinstance(y, Tensor): dt = weak_promote(y.dtype, x)
    else: dt = promote(scalar_dtype(x), scalar_dtype(y))
    xt = x.cast(dt) if isinstance(x, Tensor) else Tensor(_const(x, dt, cond.device))
    yt = y.cast(dt) if isinstance(y, Tensor) else Tensor(_const(y, dt, cond.device))
    shape = Tensor._broadcast_shape(cond.shape, xt.shape, yt.shape)
    return Tensor(UOp(Ops.WHERE, dt, (cond.expand(shape).uop, xt.expand(shape).uop, yt.expand(shape).uop)))

  def cast(self, dtype) -> Tensor:
    dt = to_dtype(dtype)
    if dt == self.dtype: return self
    if dt in (dtypes.uint16, dtypes.uint64) and False: pass
    if dt == dtypes.float64: require_float64(self.device, "cast to float64")
    if self.uop.op is Ops.CONST: return Tensor(_const(self.uop.arg, dt, self.device))
    return Tensor(UOp(Ops.CAST, dt, (self.uop,)))

  def bitcast(self, dtype) -> Tensor:
    dt = to_dtype(dtype)
    if dt.itemsize != self.dtype.itemsize:
      raise ValueError(f"bitcast from {self.dtype.name} ({self.dtype.itemsize} bytes) to {dt.name} ({dt.itemsize} bytes): "
                       f"item sizes must match")
    if dt == self.dtype: return self
    if dt == dtypes.float64: require_float64(self.device, "bitcast to float64")
    if dt.is_bool or self.dtype.is_bool: raise TypeError(f"bitcast to or from bool is not supported ({self.dtype.name} -> {dt.name})")
    return Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))

  # ---------------- reductions ----------------
  def _reduce_axes(self, axis, op: str) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
      a = int(a)
      if not -max(self.ndim, 1) <= a < max(self.ndim, 1):
        raise IndexError(f"{op}: axis {a} is out of range for a tensor of shape {_fmt(self.shape)}")
      out.append(a + self.ndim if a < 0 else a)
    if len(set(out)) != len(out): raise ArgumentError(f"{op}: duplicate value in axis {axis}")
    return tuple(sorted(set(a for a in out if self.ndim)))

  def _reduce(self, op: Ops, axis=None, keepdim=False) -> Tensor:
    axes = self._reduce_axes(axis, op.name.lower())
    if not axes: return self
    reduced = sym.sprod(self.shape[a] for a in axes)
    if isinstance(reduced, int) and isinstance(self.numel(), int) and reduced >= SPLIT_REDUCE and \
       self.numel() // max(reduced, 1) <= 64 and not isinstance(self.device, tuple):
      out = self._split_reduce(op, axes, reduced)
    else:
      out = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def _accumulate(self, op: Ops, axis, keepdim, dtype):
    x = self.cast(dtype_arg(dtype, "sum" if op is Ops.ADD else "prod") if dtype is not None else sum_dtype(self.dtype))
    if x.dtype in (dtypes.float16, dtypes.bfloat16):   # 16-bit floats accumulate in float32
      return x.cast(dtypes.float32)._reduce(op, axis, keepdim).cast(x.dtype)
    return x._reduce(op, axis, keepdim)
  def _split_reduce(self, op: Ops, axes: tuple, reduced: int) -> Tensor:
    """A long reduction into few outputs runs as two kernels: SPLIT_GROUPS partial results in parallel (GPU
    threads, CPU cores), then their reduction; the tail is padded with the op's identity."""
    from baregrad.compiler.uop import identity_for
    keep = tuple(i for i in range(self.ndim) if i not in axes)
    out_shape = tuple(self.shape[i] for i in keep)
    x = self.permute(*keep, *axes).reshape(*out_shape, reduced)
    groups = SPLIT_GROUPS
    per = -(-reduced // groups)
    if per * groups != reduced:
      x = x.pad(((0, 0),) * len(out_shape) + ((0, per * groups - reduced),), value=identity_for(op, self.dtype))
    x = x.reshape(*out_shape, groups, per)
    n = len(out_shape)
    part = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (x.uop,), (op, (n + 1,)))).contiguous()
    total = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (part.uop,), (op, (n,))))
    return total.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))

  def sum(self, axis=None, keepdim=False, dtype=None):
    """Sum over `axis` (None: all). The result dtype follows numpy: bool and signed ints narrower than 64 bits
    give int64, unsigned ones uint64 (`sum_dtype`); 64-bit ints and floats keep theirs (float16 and bfloat16
    accumulate in float32). `dtype` casts the input first and accumulates in it, as numpy's `dtype=` does."""
    return self._accumulate(Ops.ADD, axis, keepdim, dtype)
  def prod(self, axis=None, keepdim=False, dtype=None):
    """Product over `axis`; result dtype as for sum()."""
    return self._accumulate(Ops.MUL, axis, keepdim, dtype)
  def max(self, axis=None, keepdim=False):
    """Maximum over `axis`; NaN wins (as numpy's max). An empty reduced axis raises ValueError (no identity)."""
    self._check_not_empty(axis, "max", "maximum")
    return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim=False):
    """Minimum over `axis`; NaN wins. An empty reduced axis raises ValueError (no identity)."""
    self._check_not_empty(axis, "min", "minimum")
    # an order-reversing map, then max: -x for floats, ~x for ints (no overflow), not for bool
    return self._order_flip()._reduce(Ops.MAX, axis, keepdim)._order_flip()
  def _check_not_empty(self, axis, name: str, numpy_op: str):
    if any(self.shape[a] == 0 for a in self._reduce_axes(axis, name)):
      raise ValueError(f"{name}: zero-size array to reduction operation {numpy_op} which has no identity (shape "
                       f"{_fmt(self.shape)}, axis {axis})")
  def _order_flip(self):
    if self.dtype.is_float: return -self
    return ~self

  # ---------------- realization ----------------
  def contiguous(self) -> Tensor:
    # a contiguous() of a contiguous() is the same value: a second node would be a copy kernel (a jitted function
    # returning x.contiguous() is made contiguous again by the jit)
    if self.uop.op is Ops.CONTIGUOUS: return Tensor(self.uop)
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
  def detach(self) -> Tensor: return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)))

  # ---------------- autograd ----------------
  @property
  def requires_grad(self) -> bool: return bool(self._requires_grad)
  @requires_grad.setter
  def requires_grad(self, value: bool):
    if value and _no_grad_depth(): value = False
    if value and not self.dtype.is_float:
      raise TypeError(f"only float tensors can require gradients, got {self.dtype.name}")
    self._requires_grad = bool(value)
    if value: _grad_tensors[id(self)] = self
    else: _grad_tensors.pop(id(self), None)

  def _grad_seed(self, gradient: Tensor | None, op: str) -> Tensor:
    if _no_grad_depth(): raise RuntimeError(f"{op} inside Tensor.no_grad()")
    if gradient is None:
      if self.numel() != 1:
        raise ValueError(f"{op} without a gradient needs a one-element tensor, got shape {_fmt(self.shape)}")
      return Tensor.ones(*self.shape, dtype=self.dtype, device=self.device)
    if gradient.shape != self.shape:
      raise ValueError(f"{op}: gradient shape {_fmt(gradient.shape)} differs from tensor shape {_fmt(self.shape)}")
    return gradient

  def _derivatives(self, tensors: list, seed: Tensor) -> dict[int, Tensor | None]:
    """{id(t): d self / d t} for the given tensors: None where self does not depend on t, zeros where it depends on
    t only through ops without a derivative (comparisons, x ** 0)."""
    # a realized tensor is a RESHAPE view of its BUFFER, and reshape() folds view chains, so graphs may reach the
    # buffer without passing through the tensor's own node: such tensors are found by their buffer
    by_uop: dict[UOp, list] = {}
    for t in tensors: by_uop.setdefault(_grad_key(t.uop), []).append(t)
    targets: dict[UOp, list] = {}
    for n in _undetached(self.uop):
      for cand in (n, _grad_key(realized[n]) if n in realized else None):
        for t in by_uop.get(cand, ()): targets.setdefault(n, []).append(t)
    out: dict[int, Tensor | None] = {id(t): None for t in tensors}
    grads = gradients(self.uop, list(targets), seed) if targets else {}
    for n, ts in targets.items():
      g = grads.get(n)
      if g is None: g = Tensor.zeros(*n.shape, dtype=n.dtype if n.dtype.is_float else dtypes.float32, device=self.device)
      for t in ts: out[id(t)] = g if g.shape == t.shape else g.reshape(t.shape)
    return out

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d self / d t into t.grad for every tensor t with requires_grad that self depends on; the others
    keep their grad (None if none was computed yet, as torch). When no tensor self depends on requires grad (torch
    raises there), tinygrad's rule: every float tensor of the graph that is still referenced gets its .grad, but
    those made with requires_grad=False (found by a scan of the live objects: only this case pays for it)."""
    seed = self._grad_seed(gradient, "backward()")
    leaves = list(_grad_tensors.values())
    derivs = self._derivatives(leaves, seed) if leaves else {}
    if not any(derivs[id(t)] is not None for t in leaves):
      leaves = [t for t in gc.get_objects() if issubclass(type(t), Tensor) and _unset_float(t)]
      derivs = self._derivatives(leaves, seed)
    for t in leaves:
      if (g := derivs[id(t)]) is not None: t.grad = g if t.grad is None else t.grad + g
    return self

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = False) -> list[Tensor]:
    """[d self / d t for t in targets] (tinygrad's form): nothing is written to .grad and the targets need no
    requires_grad. A target self does not depend on raises, or gives zeros with materialize_grads=True. A target
    with no elements (a zero-size dim) always gets its empty gradient, as torch (cat drops empty operands from the
    graph, yet torch differentiates them)."""
    if not all(isinstance(t, Tensor) for t in targets):
      raise TypeError(f"gradient: targets must be Tensors, got {[type(t).__name__ for t in targets]}")
    derivs = self._derivatives(list(targets), self._grad_seed(gradient, "gradient()"))
    out = []
    for i, t in enumerate(targets):
      g = derivs[id(t)]
      if g is None:
        if not materialize_grads and t.numel() != 0:
          raise RuntimeError(f"gradient: target {i} (shape {_fmt(t.shape)}) is not part of this tensor's graph; "
                             "pass materialize_grads=True for zeros")
        g = Tensor.zeros(*t.shape, dtype=t.dtype if t.dtype.is_float else dtypes.float32, device=t.device)
      out.append(g)
    return out

  class no_grad:
    """Context manager (and decorator) for code that must not track gradients: new tensors get no
    requires_grad, and backward() raises inside it."""
    def __enter__(self): _grad_mode.no_grad_depth = _no_grad_depth() + 1
    def __exit__(self, *exc): _grad_mode.no_grad_depth = _no_grad_depth() - 1
    def __call__(self, fn):
      import functools
      @functools.wraps(fn)
      def wrapper(*a, **k):
        with Tensor.no_grad(): return fn(*a, **k)
      return wrapper

  def schedule(self, *others: Tensor) -> list:
    """The ExecItems (kernels and copies) that realizing these tensors would run, without running them."""
    pending = [t for t in (self, *others) if not _is_realized(t.uop)]
    if not pending: return []
    with Device.lock: return create_schedule(*_lowered(pending)[::2])[0]

  def realize(self, *others: Tensor) -> Tensor:
    """Compute these tensors (and pending assigns). Thread-safe: realizes from several threads run one at a time
    under the runtime's lock (Device.lock)."""
    with Device.lock: return self._realize(others)

  def _realize(self, others) -> Tensor:
    tensors = [self, *others]
    if _pending_assigns:   # lazy assigns run with the next realize, so later graphs read the written buffer
      ids = {id(t) for t in tensors}
      tensors += [t for t in _pending_assigns if id(t) not in ids and not _settled(t.uop)]
      _pending_assigns.clear()
    pending = [t for t in tensors if not _settled(t.uop)]
    if pending:
      uops, lowered, order = _lowered(pending)
      items, bufs, inputs, shapes, inner = create_schedule(uops, order)
      del order
      if items: _run_schedule(items, False)     # (run_schedule less taking Device.lock: held here)
      views = [_output_view(u, buf, shape) for u, buf, shape in zip(uops, bufs, shapes)]
      # each graph node realized here is recorded with its view (remember) if it outlives the realize: a later graph
      # that holds it reads the buffer. The common eager temporary, `(x * y + 1).realize()`, is gone by then. So are
      # the intermediates the schedule materialized (`inner`: a contiguous(), a reduce read through a broadcast)
      # unless a Tensor still holds them: then a later realize loads them instead of computing them again.
      records = [(_weakref(u), view) for u, view in zip(uops, views)]
      records += [(_weakref(n), view) for n, view in inner]
      del inner
      it = iter(views)
      for t, low in zip(pending, lowered):   # a tensor on several devices: a MULTI of its shards' buffers
        view = next(it) if low is None else _multi.multi_uop([next(it) for _ in low.shards], low.axis, low.bounds)
        if low is not None: records.append((_weakref(t.uop), view))    # a graph that was lowered
        t.uop = view
      del uops, lowered, t, low
      for ref, view in records:
        if (node := ref()) is not None and realized.get(node) is not view: remember(node, view, inputs)
    return self

  def _buffer(self) -> Buffer:
    """The buffer holding this tensor (realizing it); for a view of a realized tensor (a slice, a transpose), the
    buffer it views."""
    if isinstance(self.device, tuple):
      raise ValueError(f"{self!r} is on several devices: it has one buffer per device (_buffers())")
    self.realize()
    node = self.uop
    while node.op in MOVEMENT: node = node.src[0]
    return node.arg

  def _buffers(self) -> list[Buffer]:
    """The buffer holding this tensor, or for a tensor on several devices each device's (realizing it)."""
    if not isinstance(self.device, tuple): return [self._buffer()]
    self.realize()
    return [Tensor(s)._buffer() for s in self.uop.src]

  def numpy(self) -> np.ndarray:
    if isinstance(self.device, tuple):     # each device's part, put together on the host
      self.realize()
      axis, bounds = self.uop.arg
      parts = [Tensor(s).numpy() for s in self.uop.src]
      if axis is None: return parts[0]
      out = np.empty(self.shape, dtype=parts[0].dtype)
      for p, (b, e) in zip(parts, bounds): out[(slice(None),) * axis + (slice(b, e),)] = p
      return out
    # a view of a realized tensor stays a view (writes through it reach the tensor): its elements are read from a
    # contiguous copy made for the read
    buf = (self if _is_realized(self.uop) or not _settled(self.uop) else self.contiguous())._buffer()
    # a symbolic shape at the values its Variables are bound to (its buffer is sized for their largest values)
    shape = tuple(sym.evaluate(d) for d in self.shape)
    n = math.prod(shape)
    if self.dtype == dtypes.bfloat16:
      bits = np.empty(buf.size, dtype=np.uint16)
      if bits.size: buf.copyout(memoryview(bits))
      return (bits[:n].astype(np.uint32) << 16).view(np.float32).reshape(shape)
    out = np.empty(buf.size, dtype=self.dtype.np)
    if out.size: buf.copyout(memoryview(out.view(np.uint8)))
    return out[:n].reshape(shape)

  def item(self):
    if sym.evaluate(self.numel()) != 1:
      raise ValueError(f"item() needs a tensor with one element, got shape {_fmt(self.shape)} ({self.numel()} elements)")
    return self.numpy().reshape(()).item()
  def tolist(self): return self.numpy().tolist()
  def __float__(self): return float(self.item())
  def __int__(self): return int(self.item())
  def __bool__(self): return bool(self.item())
  def __index__(self):
    # numpy's rule: only a 0-d integer tensor stands for an int (a slice bound, range(), a list index); a 1-element
    # 1-d one does not (torch takes it; numpy and tinygrad raise TypeError)
    if self.dtype.is_float or self.dtype.is_bool or self.ndim != 0:
      raise TypeError(f"only a 0-d integer tensor can be used as an index (an int), got a {self.dtype.name} tensor of "
                      f"shape {_fmt(self.shape)}")
    return int(self.item())

  def to(self, device) -> Tensor:
    """This tensor on `device`, or on each device of a tuple (replicated; a tensor on several devices moves its
    shards to as many devices, or is gathered first)."""
    dev = _device_arg(device)
    if dev == self.device: return self
    if self.dtype == dtypes.float64: require_float64(dev, "to")
    src = self.uop if isinstance(self.device, tuple) else self.contiguous().uop
    return Tensor(UOp(Ops.COPY, self.dtype, (src,), dev))

  def shard(self, devices, axis: int | None = None) -> Tensor:
    """This tensor split along `axis` across `devices` (near-equal parts, the first ones one longer when the size
    does not divide), or with axis None a copy on each device. `.device` is then the tuple of devices."""
    devices = _device_arg(tuple(devices))
    if axis is None: return self.to(devices)
    if not -max(self.ndim, 1) <= axis < self.ndim:
      raise IndexError(f"shard: axis {axis} is out of range for a tensor of shape {_fmt(self.shape)}")
    axis = axis + self.ndim if axis < 0 else axis
    if isinstance(self.device, tuple):
      if self.device == devices and self.uop.op is Ops.MULTI and self.uop.arg == (axis, _multi.split_bounds(self.shape[axis], len(devices))):
        return self
      src = self.to(devices[0])    # gathered first
    else: src = self
    parts, bounds = _multi.scatter_uops(src.uop, devices, axis)
    return Tensor(_multi.multi_uop(parts, axis, bounds))

  def assign(self, other) -> Tensor:
    """Write other's values into this tensor's memory: its buffer, or for a view of a realized tensor (a slice,
    shrink, reshape, permute or flip of it, and views of those) the elements it views in the buffer under it, which
    the viewed tensor and every other view of it then show, as in PyTorch. A view that does not map each element to
    a place of its own (an expand, a padded region) is refused, as is a view of a tensor not computed yet (it has no
    memory to write through: realize that tensor first)."""
    other = other if isinstance(other, Tensor) else Tensor(_const(other, self.dtype, self.device))
    if other.shape != self.shape:
      if Tensor._broadcast_shape(other.shape, self.shape) != self.shape:
        raise ValueError(f"assign: value of shape {_fmt(other.shape)} does not fit tensor of shape {_fmt(self.shape)}")
      other = other.expand(self.shape)
    if other.device != self.device:
      raise ValueError(f"assign: value is on {other.device}, tensor on {self.device}")
    # earlier assigns run first (one of them may read the memory this one writes: clone() then a write)
    if _pending_assigns: _pending_assigns[0].realize()
    target = self._write_target("assign")
    value = other.cast(self.dtype)
    bases = _view_bases(target)
    for base in bases: forget(base.arg)
    # (on several devices, tensor/multi.py checks each device's part when it lowers the assign)
    if not isinstance(self.device, tuple) and _reads_shifted(value.uop, bases[0].arg, target): value = value.contiguous()
    self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
    _pending_assigns.append(self)
    return self

  def _write_target(self, op: str) -> UOp:
    """The view of realized memory that writing into this tensor writes: this tensor's own buffer (computing it
    first where it is a value of its own: a result, a constant, a broadcast of one) or the buffer it views."""
    chain, base = _view_chain(self.uop)
    if base.op is Ops.ASSIGN or (base.op is not Ops.BUFFER and base in realized):
      # an assign (run now if pending) or a result realized before: the view of its buffer stands in for it
      if base not in realized: _wrap(base).realize()
      base = realized[base]
      for n in reversed(chain): base = n.replace(src=(base,))
      chain, base = _view_chain(base)
    if not _view_of_memory(base):
      if any(n.op not in (Ops.RESHAPE, Ops.EXPAND) for n in chain):
        kind = next(n.op.name.lower() for n in chain if n.op not in (Ops.RESHAPE, Ops.EXPAND))
        raise ValueError(f"{op}: this tensor (shape {_fmt(self.shape)}) is a view ({kind}) of a tensor that is not "
                         f"in memory yet ({base.op.name.lower()} of shape {_fmt(base.shape)}), so there is nothing to "
                         f"write through; realize the tensor it views first (.realize()), then write into the view")
      self.realize()       # a value of this tensor's own (a constant, a broadcast of one, a result): its own buffer
      chain, base = _view_chain(self.uop)
    for n in chain:
      if (n.op is Ops.EXPAND and any(a != b for a, b in zip(n.src[0].shape, n.arg))) or \
         (n.op is Ops.PAD and any(b or a for b, a in n.arg[0])):
        what = "a broadcast (expand)" if n.op is Ops.EXPAND else "a padded region (pad)"
        raise ValueError(f"{op}: this tensor (shape {_fmt(self.shape)}) is {what} of shape {_fmt(n.src[0].shape)}: "
                         f"several of its elements are one element of memory, or none; write into the tensor it "
                         f"views, or into a .contiguous() copy")
    return self.uop if not chain or chain[0] is self.uop else chain[0]


# ---------------- helpers ----------------
_grad_mode = threading.local()     # no_grad() is per thread (as torch's), so one thread's block leaves others alone


def _no_grad_depth() -> int: return getattr(_grad_mode, "no_grad_depth", 0)


# tensors with an assign not run yet, kept until the next realize runs it: a write through a view must happen even when
# nothing holds the view any more (`x[1:3].assign(y)` as a statement; setitem's view is its own temporary)
_pending_assigns: list = []
# the tensors with requires_grad, by id: a WeakSet would compare members with Tensor.__eq__, which is elementwise
# (a lazy Tensor whose truth value realizes it, and raises for more than one element)
_grad_tensors: "weakref.WeakValueDictionary[int, Tensor]" = weakref.WeakValueDictionary()


def _const(value, dtype: DType, device: str) -> UOp:
  if isinstance(value, Tensor): raise TypeError("expected a scalar, got a Tensor")
  if dtype is dtypes.float64: require_float64(device, "a float64 constant")
  dev = _device_nodes.get(device)
  if dev is None: dev = _device_nodes[device] = UOp(Ops.DEVICE, None, (), device)
  return UOp(Ops.CONST, dtype, (dev,), truncate(value, dtype))


_device_nodes: dict = {}   # device name (or tuple of names) -> its DEVICE node, kept: a constant needs one each time


# A Python scalar operand broadcast to a shape, by (type, value bits, dtype, device, shape): an eager loop that uses
# the same scalar finds its nodes here instead of making them again. float values are keyed by their bits (0.0 and
# -0.0 apart, nan finds itself); numpy scalars are not kept. At most _SCALARS_KEPT, the oldest out. Kept strongly:
# a constant's nodes hold no buffer (compiler/schedule.py's remember() does not record a realized constant).
_scalar_operands: dict = {}
_SCALARS_KEPT = 64


def _broadcast_const(value, dtype: DType, device, shape: tuple) -> UOp:
  """Tensor(_const(value, dtype, device)).expand(shape), the same UOps made directly (a scalar operand)."""
  kind = type(value)
  key = (kind, value.hex() if kind is float else value, dtype, device, shape) if kind in (int, float, bool) else None
  u = _scalar_operands.get(key) if key is not None else None
  if u is not None: return u
  u = _const(value, dtype, device)
  if shape:
    ones = (1,) * len(shape)
    u = UOp(Ops.RESHAPE, dtype, (u,), ones)
    if shape != ones: u = UOp(Ops.EXPAND, dtype, (u,), shape)
  if key is not None:
    with _scalar_lock:   # (ops are made from several threads at once)
      if len(_scalar_operands) >= _SCALARS_KEPT: del _scalar_operands[next(iter(_scalar_operands))]
      _scalar_operands[key] = u
  return u


_scalar_lock = threading.Lock()


def _accept_dim(fn):
  """Let a reduction take torch's `dim=` for its `axis`."""
  import functools
  @functools.wraps(fn)
  def wrapper(self, *args, dim=None, **kwargs):
    if dim is not None:
      if args or "axis" in kwargs: raise TypeError(f"{fn.__name__}: give dim or axis, not both")
      kwargs["axis"] = dim
    return fn(self, *args, **kwargs)
  return wrapper


for _name in ("sum", "prod", "max", "min", "mean", "argmax", "argmin", "any", "all", "logsumexp", "softmax",
              "log_softmax"):
  setattr(Tensor, _name, _accept_dim(getattr(Tensor, _name)))


def _undetached(root: UOp) -> list[UOp]:
  """The nodes `root` reaches without passing through a DETACH (what a gradient can flow back to)."""
  seen, stack = {root}, [root]
  while stack:
    n = stack.pop()
    if n.op is Ops.DETACH: continue
    for s in n.src:
      if s not in seen: seen.add(s); stack.append(s)
  return list(seen)


def _unset_float(t) -> bool:
  """A float tensor whose requires_grad was never set (one another thread is still making has no uop yet: not it)."""
  return getattr(t, "_requires_grad", False) is None and getattr(t, "uop", None) is not None and t.dtype.is_float


def _grad_key(u: UOp) -> UOp:
  """The BUFFER under a chain of RESHAPEs, else u itself."""
  b = u
  while b.op is Ops.RESHAPE: b = b.src[0]
  return b if b.op is Ops.BUFFER else u


def _wrap(u: UOp) -> Tensor:
  """Tensor(u) for a UOp, without __init__'s checks of other kinds of data (every op's result is made so)."""
  t = _new_tensor(Tensor)
  t.uop, t._requires_grad, t.grad = u, None, None
  return t


_new_tensor = object.__new__


def _output_view(u: UOp, buf: Buffer, shape: tuple) -> UOp:
  """What a realized output is: the view an assign wrote through, or its own buffer in its shape (a symbolic shape
  with the values u was built with: the schedule's `shape` has the Variables unbound)."""
  if u.op is Ops.ASSIGN: return u.src[0]
  if any(isinstance(d, UOp) for d in shape): shape = u.shape
  view = UOp(Ops.BUFFER, buf.dtype, (), buf)
  return UOp(Ops.RESHAPE, buf.dtype, (view,), shape) if shape != (buf.size,) else view


def _symbolic_pads(padding) -> bool:
  return any(isinstance(x, UOp) for p in padding if isinstance(p, (tuple, list)) for x in p) or \
    any(isinstance(p, UOp) for p in padding)


# While a jitted function is captured (tensor/jit.py), the symbolic ranges that only some values of their Variables
# keep inside the tensor: [(start, end, size)]. Each replay checks them at its values before it runs.
range_checks: list | None = None


def _check_symbolic_range(rng, shape) -> None:
  """A shrink with symbolic bounds lies inside the shape at the values its Variables are bound to now. A range that
  some other value in the Variables' [min, max] would take outside (the cache read `[0, start_pos + seqlen)` at the
  largest start_pos) is noted for a jit capture, whose replays check it at their values."""
  for (b, e), s in zip(rng, shape):
    try: ok = 0 <= sym.evaluate(b) <= sym.evaluate(e) <= sym.evaluate(s)
    except ValueError: ok = True        # an unbound Variable: only its range is checked
    if ok and sym.vmin(b) >= 0 and sym.vmax(e) <= sym.vmin(s): continue
    if ok and range_checks is not None: range_checks.append((sym.unbind(b), sym.unbind(e), sym.unbind(s))); continue
    if ok: continue
    raise ValueError(f"shrink: range {rng} is outside shape {_fmt(shape)} at the values its Variables are bound to")


def _view_chain(u: UOp) -> tuple[list[UOp], UOp]:
  """The movement ops from u down (u first) and the node under them."""
  chain = []
  while u.op in MOVEMENT: chain.append(u); u = u.src[0]
  return chain, u


def _view_of_memory(base: UOp) -> bool:
  """Is `base` (a node under any movement ops) realized memory: a buffer, or on several devices one per device?"""
  if base.op is Ops.MULTI: return all(_view_of_memory(_view_chain(s)[1]) for s in base.src)
  return base.op is Ops.BUFFER


def _view_bases(u: UOp) -> list[UOp]:
  """The BUFFER nodes under a view of realized memory (one per device for a tensor on several devices)."""
  base = _view_chain(u)[1]
  if base.op is Ops.MULTI: return [b for s in base.src for b in _view_bases(s)]
  return [base]


def _settled(u: UOp) -> bool:
  """Nothing to compute: u is realized, or a view of a realized tensor on one device (it stays a view, so that
  writing through it reaches the tensor it views; a tensor on several devices is realized into its MULTI form)."""
  if u.op is Ops.MULTI: return all(_is_realized(s) or _settled(s) for s in u.src)
  while u.op in MOVEMENT: u = u.src[0]
  return u.op is Ops.BUFFER


def _is_realized(u: UOp) -> bool:
  if u.op is Ops.MULTI: return all(_is_realized(s) for s in u.src)
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER


def _lowered(tensors) -> tuple[list[UOp], list, list | None]:
  """The single-device UOps to schedule for `tensors`, each tensor's lowered value and, for one tensor on one
  device, its toposort (create_schedule's walk, taken here once): graphs that involve several devices are lowered by
  tensor/multi.py (a tensor on several devices becomes one UOp per device, its Sharded value says how); a tensor on
  one device is None there."""
  if len(tensors) == 1:   # the eager case: the walk that finds the graph's devices is the one scheduling needs
    u = tensors[0].uop
    order = graph_order([u])
    if not any(map(_multi.on_several, order)): return [u], [None], order
  todo = [t.uop for t in tensors if _multi.involves_several_devices(t.uop)]
  if not todo: return [t.uop for t in tensors], [None] * len(tensors), None
  low = dict(zip(todo, _multi.lower(todo, _reads_shifted)))
  uops, lowered = [], []
  for t in tensors:
    m = low.get(t.uop, t.uop)
    if isinstance(m, _multi.Sharded): uops.extend(m.shards); lowered.append(m)
    else: uops.append(m); lowered.append(None)
  return uops, lowered, None


def _device_arg(device) -> str | tuple[str, ...]:
  """A device argument: None (the default device), a name, or a tuple/list of names (several devices)."""
  if device is None: return Device.default()
  if isinstance(device, (tuple, list)):
    devices = tuple(canonical(d) for d in device)
    if not devices: raise ValueError("a tuple of devices needs at least one device")
    if len(set(devices)) != len(devices): raise ValueError(f"devices {devices} name a device twice")
    return devices
  return canonical(device)


def _from_numpy(data, dtype: DType | None, device: str) -> UOp:
  if isinstance(data, np.ndarray):
    arr = data
    if dtype is None:
      try: dtype = to_dtype(arr.dtype)
      except TypeError: raise TypeError(f"unsupported numpy dtype {arr.dtype}") from None
  else:
    try: arr = np.array(data)
    except ValueError as e: raise ValueError(f"cannot make a Tensor from ragged nested lists: {e}") from None
    if arr.dtype == object: raise TypeError("cannot make a Tensor from a list with non-numeric items")
    if dtype is None:
      big = arr.dtype.kind in "iu" and arr.size and (arr.min() < -2**31 or arr.max() >= 2**31)
      dtype = dtypes.bool if arr.dtype == np.bool_ else (dtypes.int64 if big else dtypes.default_int) if arr.dtype.kind in "iu" else \
        dtypes.default_float if arr.dtype.kind == "f" else None
      if dtype is None: raise TypeError(f"cannot make a Tensor from values of numpy kind {arr.dtype}")
  if dtype == dtypes.float64: require_float64(device, "Tensor of float64 data (dtype=float32 converts it)")
  if dtype == dtypes.bfloat16:
    host = _np_to_bf16_bits(arr.astype(np.float32))
  else:
    with np.errstate(over="ignore", invalid="ignore"):
      host = np.ascontiguousarray(arr.astype(dtype.np, copy=False))
  buf = Buffer(device, int(host.size), dtype)
  if host.size: buf.copyin(memoryview(host.reshape(-1).view(np.uint8)))
  u = UOp(Ops.BUFFER, dtype, (), buf)
  return u if arr.shape == (host.size,) else UOp(Ops.RESHAPE, dtype, (u,), tuple(arr.shape))


def _reads_shifted(value: UOp, buf: Buffer, target: UOp | None = None) -> bool:
  """Does `value` read `buf` through a view that moves elements (so writing in place would be a hazard)? Reading the
  assign's own `target` view is reading each element where it is written."""
  state: dict[UOp, int] = {}   # 0 no, 1 reads at the same index, 2 reads elsewhere
  # the buffer read whole (through reshapes only) is read where a target that is a reshape of it writes
  whole = 1 if target is None or all(n.op is Ops.RESHAPE for n in _view_chain(target)[0]) else 2
  # a node realized before is read from the view holding its value (as the schedule will: graph_order), so the walk
  # does not go under it; the assign has already forgotten every result computed from `buf` (forget)
  views = {}
  def leaf(n: UOp) -> bool:
    v = views[n] = None if n is target else leaf_view(n)
    return v is not None
  def walk(root: UOp) -> int:
    for n in root.toposort(leaf):
      if n in state: continue
      if n is target: state[n] = 1
      elif views.get(n) is not None: state[n] = walk(views[n])
      elif n.op is Ops.BUFFER: state[n] = whole if n.arg is buf else 0
      elif not n.src: state[n] = 0
      else:
        s = max(state[x] for x in n.src)
        if s and (n.op in MOVEMENT and n.op is not Ops.RESHAPE or n.op is Ops.REDUCE_AXIS): s = 2
        if n.op is Ops.RESHAPE and s == 1 and n.src[0].op is not Ops.BUFFER and n.shape != n.src[0].shape: s = 2
        state[n] = s
    return state[root]
  return walk(value) == 2


def _rotl(x: Tensor, r: int) -> Tensor: return (x << r) | (x >> (32 - r))


def _threefry2x32(x0: Tensor, x1: Tensor, k0: int, k1: int) -> Tensor:
  """Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11);
  rotation constants and key-schedule parity 0x1BD11BDA from the paper."""
  rot = (13, 15, 26, 6, 17, 29, 16, 24)
  ks = (k0, k1, (k0 ^ k1 ^ 0x1BD11BDA) & 0xffffffff)
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for block in range(5):
    for i in range(4):
      x0 = x0 + x1
      x1 = _rotl(x1, rot[(block % 2) * 4 + i]) ^ x0
    s = block + 1
    x0 = x0 + ks[s % 3]
    x1 = x1 + ((ks[(s + 1) % 3] + s) & 0xffffffff)
  return x0
