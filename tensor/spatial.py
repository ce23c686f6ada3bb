"""Convolutions (N-D, transposed), pooling, padding modes and interpolation (torch names and defaults).

`SpatialOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph.

Layouts are torch's: inputs (N, C, *spatial) or unbatched (C, *spatial); weights (C_out, C_in / groups, *kernel), and
(C_in, C_out / groups, *kernel) for transposed convolutions. One implementation serves every number of spatial dims:
`_pool` cuts sliding windows with movement ops only, a convolution multiplies them by the weight and sums, a pooling
reduces them. A transposed convolution is the convolution of the input with s-1 zeros inserted between neighbours
(`_dilate`) by the flipped, in/out-swapped weight.
"""
from __future__ import annotations
import math
from typing import Sequence

import numpy as np

from baregrad.compiler.dtype import dtypes
from .composite import ShapeError

# spatial dims each interpolate mode needs (None: any number; "linear" on 2 or 3 is bilinear/trilinear, as tinygrad)
INTERPOLATE_DIMS = {"nearest": None, "nearest-exact": None, "area": None, "linear": None, "bilinear": 2, "bicubic": 2,
                    "trilinear": 3}
CUBIC_A = -0.75   # torch's (and OpenCV's) bicubic coefficient


def _is_int(v) -> bool: return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _ints(x, n: int, name: str, op: str) -> tuple[int, ...]:
  """An int repeated n times, or a sequence of n ints."""
  if _is_int(x): return (int(x),) * n
  x = tuple(x) if isinstance(x, (tuple, list)) else (x,)
  if len(x) != n or not all(_is_int(v) for v in x):
    raise ValueError(f"{op}: {name} must be an int or a tuple of {n} ints, got {x!r}")
  return tuple(int(v) for v in x)


def _weight_dims(weight) -> int:
  """Spatial dims of a convolution given by its weight (C_out, C_in / groups, *kernel): tinygrad's N-d conv2d."""
  return weight.ndim - 2 if getattr(weight, "ndim", 0) >= 3 else 2


def _kernel_dims(kernel_size) -> int:
  """Spatial dims a pooling pools: one per kernel_size entry (tinygrad's N-d pool2d), 2 for an int."""
  return len(kernel_size) if isinstance(kernel_size, (tuple, list)) and kernel_size else 2


def _dims(nd: int) -> str:
  return {1: "L", 2: "H, W", 3: "D, H, W"}.get(nd, ", ".join(f"S{i}" for i in range(nd)))


def _conv_pads(op: str, padding, kernel, stride, dilation) -> list[tuple[int, int]]:
  """(before, after) per spatial dim. torch's forms: an int, one int per dim, 'valid', 'same' (an odd total puts the
  extra element after); tinygrad's: flat ints for the last dim first, (left, right, top, bottom, ...). Negative
  amounts crop."""
  nd = len(kernel)
  if isinstance(padding, str):
    if padding == "valid": return [(0, 0)] * nd
    if padding == "same":
      if any(s != 1 for s in stride): raise ValueError(f"{op}: padding='same' needs stride 1, got stride {stride}")
      total = [d * (k - 1) for k, d in zip(kernel, dilation)]
      return [(t // 2, t - t // 2) for t in total]
  elif _is_int(padding): return [(int(padding), int(padding))] * nd
  elif isinstance(padding, (tuple, list)) and all(_is_int(p) for p in padding):
    if len(padding) == nd: return [(int(p), int(p)) for p in padding]
    if len(padding) == 2 * nd: return [(int(padding[2 * i]), int(padding[2 * i + 1])) for i in reversed(range(nd))]
  raise ValueError(f"{op}: padding must be an int, {nd} ints (one per spatial dim), {2 * nd} ints (left, right, top, "
                   f"bottom, ...: last dim first), 'valid' or 'same', got {padding!r}")


def _out_size(op: str, shape, padded, kernel, stride, dilation) -> list[int]:
  outs = []
  for L, k, s, d in zip(padded, kernel, stride, dilation):
    if k < 1 or s < 1 or d < 1:
      raise ValueError(f"{op}: kernel {tuple(kernel)}, stride {tuple(stride)} and dilation {tuple(dilation)} must be "
                       "positive")
    o = (L - d * (k - 1) - 1) // s + 1
    if o < 1:
      raise ShapeError(f"{op}: input of shape {tuple(shape)} (padded spatial size {tuple(padded)}) is smaller than "
                       f"the kernel {tuple(kernel)} with dilation {tuple(dilation)}")
    outs.append(o)
  return outs


# ---------------------------------------------------------------- interpolation tables (shapes only, on the host)
# torch's CPU kernels (aten/src/ATen/native/UpSample.h) compute source coordinates in float32 for float32 and 16-bit
# inputs (float64 for float64); these tables repeat that arithmetic step by step, so edge cases round as torch's do.

def _inverse_scale(L: int, O: int, scale, T):
  """compute_scales_value: 1/scale_factor when one was given (and not recomputed), else in/out."""
  return T(1.0 / scale) if scale else T(L) / T(O)


def _nearest_source(L: int, O: int, scale, exact: bool) -> np.ndarray:
  """nearest: min(floor(o * scale), L-1); nearest-exact: min(floor((o + 0.5) * scale), L-1) (the +0.5 in float64)."""
  if not exact and O == L: return np.arange(O)
  if not exact and O == 2 * L: return np.arange(O) >> 1
  sc = _inverse_scale(L, O, scale, np.float32)
  src = (np.arange(O, dtype=np.float64) + 0.5) * np.float64(sc) if exact else np.arange(O).astype(np.float32) * sc
  return np.minimum(np.floor(src.astype(np.float32)).astype(np.int64), L - 1)


def _linear_table(L: int, O: int, scale, align: bool, T) -> tuple[np.ndarray, np.ndarray]:
  """(weights, taps) as (O, L) arrays: src = o*(L-1)/(O-1) with align_corners, else max((o+0.5)*scale - 0.5, 0);
  taps floor(src) and the next one (clamped to the last element)."""
  o = np.arange(O).astype(T)
  if align: src = (T(L - 1) / T(O - 1) if O > 1 else T(0)) * o
  else: src = np.maximum(_inverse_scale(L, O, scale, T) * (o + T(0.5)) - T(0.5), T(0))
  i0 = np.minimum(np.floor(src).astype(np.int64), L - 1)
  lam = np.clip(src - i0.astype(T), T(0), T(1))
  i1 = i0 + (i0 < L - 1)
  w, taps, rows = np.zeros((O, L), T), np.zeros((O, L), bool), np.arange(O)
  np.add.at(w, (rows, i0), T(1) - lam)
  np.add.at(w, (rows, i1), lam)
  taps[rows, i0] = taps[rows, i1] = True
  return w, taps


def _cubic_table(L: int, O: int, scale, align: bool, T) -> tuple[np.ndarray, np.ndarray]:
  """Keys' cubic convolution (A = -0.75) on taps floor(src)-1 .. floor(src)+2, clamped into the input; src as linear
  but not clamped at 0."""
  o = np.arange(O).astype(T)
  if align: src = (T(L - 1) / T(O - 1) if O > 1 else T(0)) * o
  else: src = _inverse_scale(L, O, scale, T) * (o + T(0.5)) - T(0.5)
  i0 = np.floor(src).astype(np.int64)
  t, a = src - i0.astype(T), T(CUBIC_A)
  near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1              # |x| <= 1
  far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a          # 1 < |x| < 2
  coeffs = (far(t + 1), near(t), near(1 - t), far(2 - t))
  w, taps, rows = np.zeros((O, L), T), np.zeros((O, L), bool), np.arange(O)
  for j, c in enumerate(coeffs):
    idx = np.clip(i0 - 1 + j, 0, L - 1)
    np.add.at(w, (rows, idx), c.astype(T))
    taps[rows, idx] = True
  return w, taps


def _area_table(L: int, O: int, T) -> tuple[np.ndarray, np.ndarray]:
  """adaptive average pooling: output o averages [floor(o*L/O), ceil((o+1)*L/O))."""
  w = np.zeros((O, L), T)
  for o in range(O):
    start, end = o * L // O, -(-(o + 1) * L // O)
    w[o, start:end] = T(1) / T(end - start)
  return w, w != 0


class SpatialOps:
  """Mixed into `Tensor`."""

  # ---------------------------------------------------------------- windows

  def _pool(self, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]):
    """Sliding windows over the last len(kernel) dims: (..., L1, L2) -> (..., O1, O2, k1, k2).

    For one dim of length L: k copies of the (padded) row are laid end to end and re-read with
    rows of length L'+d, so row j starts d*j further on; every s-th column then is x[o*s + j*d].
    Only movement ops, so the windows fuse into the consumer.
    """
    nd = len(kernel)
    lead = self.ndim - nd
    x = self
    for k, s, d in zip(kernel, stride, dilation):
      x = x.permute(*range(lead), *range(lead + 1, x.ndim), lead)   # this spatial dim to the end
      *pre, L = x.shape
      o = (L - d * (k - 1) - 1) // s + 1
      row = max(L + d, o * s)
      lp = row - d
      copies = -(-k * row // lp)
      if lp > L: x = x.pad([None] * len(pre) + [(0, lp - L)])
      x = x.reshape(*pre, 1, lp).expand(*pre, copies, lp).reshape(*pre, copies * lp)
      x = x.shrink([None] * len(pre) + [(0, k * row)]).reshape(*pre, k, row)
      x = x.shrink([None] * (len(pre) + 1) + [(0, o * s)]).reshape(*pre, k, o, s)
      x = x.shrink([None] * (len(pre) + 2) + [(0, 1)]).reshape(*pre, k, o)
    # now (*lead, k1, o1, k2, o2, ...)
    return x.permute(*range(lead), *[lead + 2 * i + 1 for i in range(nd)], *[lead + 2 * i for i in range(nd)])

  def _dilate(self, dim: int, s: int):
    """s-1 zeros between neighbours along `dim`: length L -> (L-1)*s + 1 (the input of a stride-s transposed conv)."""
    if s == 1 or self.shape[dim] == 0: return self
    shape, L = self.shape, self.shape[dim]
    x = self.reshape(*shape[:dim + 1], 1, *shape[dim + 1:])
    x = x.pad([None] * (dim + 1) + [(0, s - 1)] + [None] * (len(shape) - dim - 1))
    x = x.reshape(*shape[:dim], L * s, *shape[dim + 1:])
    return x.shrink([None] * dim + [(0, (L - 1) * s + 1)] + [None] * (len(shape) - dim - 1))

  def _pad_edges(self, pads, mode: str):
    """Non-negative (before, after) per dim filled from the tensor itself (pad's non-constant modes): 'reflect'
    mirrors around the edge element, 'replicate' repeats it, 'circular' wraps around. Cut, flip, expand, cat."""
    x = self
    for dim, (b, a) in enumerate(pads):
      if not (b or a): continue
      L = x.shape[dim]
      if (mode == "reflect" and max(b, a) >= L) or (mode == "circular" and max(b, a) > L) or L == 0:
        limit = "smaller than" if mode == "reflect" else "at most"
        raise ValueError(f"pad: {mode} padding {(b, a)} of dim {dim} must be {limit} its size {L} "
                         f"(shape {tuple(self.shape)}); use mode='constant' for more")

      def cut(lo, hi, t=x, dim=dim): return t.shrink([None] * dim + [(lo, hi)] + [None] * (t.ndim - dim - 1))
      def grow(t, n, dim=dim): return t.expand(*[n if i == dim else s for i, s in enumerate(t.shape)])
      if mode == "reflect": before, after = cut(1, b + 1).flip(dim), cut(L - 1 - a, L - 1).flip(dim)
      elif mode == "replicate": before, after = grow(cut(0, 1), b), grow(cut(L - 1, L), a)
      else: before, after = cut(L - b, L), cut(0, a)
      parts = ([before] if b else []) + [x] + ([after] if a else [])
      x = parts[0].cat(*parts[1:], dim=dim)
    return x

  # ---------------------------------------------------------------- convolution

  def _conv(self, op: str, nd: int, weight, bias, stride, padding, dilation, groups):
    """torch.nn.functional.conv{nd}d; padding also takes tinygrad's flat and negative forms (`_conv_pads`)."""
    if self.ndim == nd + 1:   # unbatched
      out = self.reshape(1, *self.shape)._conv(op, nd, weight, bias, stride, padding, dilation, groups)
      return out.reshape(*out.shape[1:])
    if self.ndim != nd + 2 or weight.ndim != nd + 2:
      raise ShapeError(f"{op}: expected an (N, C, {_dims(nd)}) or (C, {_dims(nd)}) input and a (C_out, C_in/groups, "
                       f"{_dims(nd)}) weight, got shapes {tuple(self.shape)} and {tuple(weight.shape)}")
    c, (cout, cg, *kernel) = self.shape[1], weight.shape
    if not _is_int(groups) or groups < 1 or c != cg * groups or cout % groups:
      raise ShapeError(f"{op}: input {tuple(self.shape)} with {c} channels, weight {tuple(weight.shape)} and "
                       f"groups={groups} do not fit (need channels == weight.shape[1] * groups and out channels "
                       "divisible by groups)")
    stride, dilation = _ints(stride, nd, "stride", op), _ints(dilation, nd, "dilation", op)
    return self._conv_padded(op, weight, bias, stride, _conv_pads(op, padding, kernel, stride, dilation), dilation,
                             groups)

  def _conv_padded(self, op: str, weight, bias, stride, pads, dilation, groups):
    n, c, *size = self.shape
    cout, cg, *kernel = weight.shape
    nd = len(kernel)
    if bias is not None and tuple(bias.shape) != (cout,):
      raise ShapeError(f"{op}: bias shape {tuple(bias.shape)} must be ({cout},) for weight {tuple(weight.shape)}")
    padded = [L + b + a for L, (b, a) in zip(size, pads)]
    out = _out_size(op, self.shape, padded, kernel, stride, dilation)
    win = self.pad([None, None, *pads])._pool(kernel, stride, dilation)          # (N, C, *out, *kernel)
    win = win.reshape(n, groups, 1, cg, *out, *kernel)
    wt = weight.reshape(1, groups, cout // groups, cg, *[1] * nd, *kernel)
    y = (win * wt)._acc_sum((3, *range(4 + nd, 4 + 2 * nd))).reshape(n, cout, *out)
    return y if bias is None else y + bias.reshape(1, cout, *[1] * nd)

  def conv1d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(N, C, L) * (C_out, C/groups, k) -> (N, C_out, L_out), as torch.nn.functional.conv1d."""
    return self._conv("conv1d", 1, weight, bias, stride, padding, dilation, groups)

  def conv2d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(N, C, H, W) * (C_out, C/groups, kh, kw) -> (N, C_out, H_out, W_out), as torch.nn.functional.conv2d;
    padding may also be tinygrad's (left, right, top, bottom) and negative (crops). As in tinygrad, the number of
    spatial dims follows the weight: a (C_out, C/groups, k) weight makes it conv1d, a 5-D one conv3d."""
    return self._conv("conv2d", _weight_dims(weight), weight, bias, stride, padding, dilation, groups)

  def conv3d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(N, C, D, H, W) * (C_out, C/groups, kd, kh, kw) -> (N, C_out, D_out, H_out, W_out), as torch's conv3d."""
    return self._conv("conv3d", 3, weight, bias, stride, padding, dilation, groups)

  def _conv_transpose(self, op: str, nd: int, weight, bias, stride, padding, output_padding, groups, dilation):
    """torch.nn.functional.conv_transpose{nd}d: out = (L-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1.
    The gradient of a convolution with respect to its input, computed as a stride-1 convolution of the zero-inserted
    input with the flipped weight, padded by dilation*(k-1) - padding (negative: cropped)."""
    if self.ndim == nd + 1:   # unbatched
      out = self.reshape(1, *self.shape)._conv_transpose(op, nd, weight, bias, stride, padding, output_padding,
                                                         groups, dilation)
      return out.reshape(*out.shape[1:])
    if self.ndim != nd + 2 or weight.ndim != nd + 2:
      raise ShapeError(f"{op}: expected an (N, C_in, {_dims(nd)}) or (C_in, {_dims(nd)}) input and a (C_in, "
                       f"C_out/groups, {_dims(nd)}) weight, got shapes {tuple(self.shape)} and {tuple(weight.shape)}")
    cin, (wcin, cog, *kernel) = self.shape[1], weight.shape
    if not _is_int(groups) or groups < 1 or cin != wcin or cin % groups:
      raise ShapeError(f"{op}: input {tuple(self.shape)} with {cin} channels, weight {tuple(weight.shape)} and "
                       f"groups={groups} do not fit (need channels == weight.shape[0], divisible by groups)")
    s, p = _ints(stride, nd, "stride", op), _ints(padding, nd, "padding", op)
    outp, d = _ints(output_padding, nd, "output_padding", op), _ints(dilation, nd, "dilation", op)
    if any(v < 1 for v in s + d): raise ValueError(f"{op}: stride {s} and dilation {d} must be positive")
    if any(v < 0 for v in p): raise ValueError(f"{op}: padding {p} must be non-negative")
    if any(not 0 <= o < max(si, di) for o, si, di in zip(outp, s, d)):
      raise ValueError(f"{op}: output_padding {outp} must be non-negative and smaller than stride {s} or dilation {d}")
    out = [(L - 1) * si - 2 * pi + di * (k - 1) + o + 1
           for L, si, pi, di, k, o in zip(self.shape[2:], s, p, d, kernel, outp)]
    if any(o < 1 for o in out):
      raise ShapeError(f"{op}: input {tuple(self.shape)}, kernel {tuple(kernel)}, stride {s}, padding {p} and "
                       f"dilation {d} give the empty output size {tuple(out)}")
    x = self
    for i, si in enumerate(s): x = x._dilate(2 + i, si)
    cig = cin // groups
    w = weight.reshape(groups, cig, cog, *kernel).permute(0, 2, 1, *range(3, 3 + nd))
    w = w.reshape(cog * groups, cig, *kernel).flip(*range(2, 2 + nd))
    pads = [(di * (k - 1) - pi, di * (k - 1) - pi + o) for di, k, pi, o in zip(d, kernel, p, outp)]
    return x._conv_padded(op, w, bias, (1,) * nd, pads, d, groups)

  def conv_transpose1d(self, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """(N, C_in, L) with weight (C_in, C_out/groups, k) -> (N, C_out, L_out), as torch's conv_transpose1d."""
    return self._conv_transpose("conv_transpose1d", 1, weight, bias, stride, padding, output_padding, groups, dilation)

  def conv_transpose2d(self, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """(N, C_in, H, W) with weight (C_in, C_out/groups, kh, kw) -> (N, C_out, H_out, W_out), as torch's; the number
    of spatial dims follows the weight, as in tinygrad (a 3-D weight: conv_transpose1d, a 5-D one: 3d)."""
    return self._conv_transpose("conv_transpose2d", _weight_dims(weight), weight, bias, stride, padding, output_padding,
                                groups, dilation)

  def conv_transpose3d(self, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """(N, C_in, D, H, W) with weight (C_in, C_out/groups, kd, kh, kw) -> (N, C_out, D_out, H_out, W_out)."""
    return self._conv_transpose("conv_transpose3d", 3, weight, bias, stride, padding, output_padding, groups, dilation)

  # ---------------------------------------------------------------- pooling

  def _pool_geometry(self, op: str, nd: int, kernel_size, stride, padding, dilation, ceil_mode: bool):
    """kernel, stride, padding, dilation per dim, torch's output sizes, and the (before, after) padding that gives
    exactly those windows: after < padding where the last window ends early (negative: the tail is cropped), more
    where ceil_mode keeps a last window that runs past the padded input."""
    if self.ndim not in (nd + 1, nd + 2):
      raise ShapeError(f"{op}: expected a (C, {_dims(nd)}) or (N, C, {_dims(nd)}) input, got shape {tuple(self.shape)}")
    k = _ints(kernel_size, nd, "kernel_size", op)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _ints(stride, nd, "stride", op)
    d = _ints(dilation, nd, "dilation", op)
    if isinstance(padding, (tuple, list)) and len(padding) == 2 * nd and nd > 1 and all(_is_int(v) for v in padding):
      p = [(int(padding[2 * i]), int(padding[2 * i + 1])) for i in reversed(range(nd))]   # flat: last dim first
    else: p = [(v, v) for v in _ints(padding, nd, "padding", op)]
    if any(v < 1 for v in k + s + d):
      raise ValueError(f"{op}: kernel_size {k}, stride {s} and dilation {d} must be positive")
    if any(not (0 <= pb <= ki // 2 and 0 <= pa <= ki // 2) for (pb, pa), ki in zip(p, k)):
      raise ValueError(f"{op}: padding {padding} must be between 0 and half the kernel size {k}")
    out, pads = [], []
    for L, ki, si, (pb, pa), di in zip(self.shape[-nd:], k, s, p, d):
      span = di * (ki - 1) + 1
      o = (L + pb + pa - span + (si - 1 if ceil_mode else 0)) // si + 1
      if ceil_mode and (o - 1) * si >= L + pb: o -= 1   # the last window must start inside the input or left padding
      if o < 1:
        raise ShapeError(f"{op}: input of shape {tuple(self.shape)} (spatial size padded by {padding}) is smaller "
                         f"than the kernel {k} with dilation {d}")
      out.append(o)
      pads.append((pb, (o - 1) * si + span - L - pb))
    return k, s, p, d, out, pads

  def _max_pool(self, op, nd, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    k, s, p, d, out, pads = self._pool_geometry(op, nd, kernel_size, stride, padding, dilation, ceil_mode)
    fill = -math.inf if self.dtype.is_float else self.dtype.min
    win = self.pad([None] * (self.ndim - nd) + pads, value=fill)._pool(k, s, d)    # (..., *out, *k)
    axes = tuple(range(self.ndim, self.ndim + nd))
    m = win.max(axes)
    if not return_indices: return m
    # torch's indices: the first maximum in window order among the positions inside the input; row-major, so the
    # one with the smallest flat index
    pos, inside = self._window_positions(out, k, s, p, d)
    hit = win == m.reshape(*m.shape, *[1] * nd)
    if self.dtype.is_float: hit = hit | (win != win)
    return m, (hit & inside).where(pos, math.prod(self.shape[-nd:])).min(axes).cast(dtypes.int32)

  def _window_positions(self, out, k, s, p, d):
    """(flat index into the input plane, inside the input?) of every window element, shaped (*out, *k): along each
    dim, window o's element j reads o*stride + j*dilation - padding."""
    nd, size, pos, inside = len(k), self.shape[-len(k):], None, None
    for i in range(nd):
      o_shape, k_shape = [1] * (2 * nd), [1] * (2 * nd)
      o_shape[i], k_shape[nd + i] = out[i], k[i]
      o_at = type(self).arange(out[i], dtype=dtypes.int32, device=self.device).reshape(*o_shape) * s[i]
      j_at = type(self).arange(k[i], dtype=dtypes.int32, device=self.device).reshape(*k_shape) * d[i]
      coord = o_at + j_at - p[i][0]
      term, ok = coord * math.prod(size[i + 1:]), (coord >= 0) & (coord < size[i])
      pos, inside = (term, ok) if pos is None else (pos + term, inside & ok)
    return pos, inside

  def max_pool1d(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, L) or (C, L); with return_indices also each maximum's index into its row."""
    return self._max_pool("max_pool1d", 1, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

  def max_pool2d(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, H, W) or (C, H, W); with return_indices also each maximum's flat index h*W + w
    into its input plane (int32), as torch.nn.functional.max_pool2d. As in tinygrad, a kernel_size of 1 or 3 ints
    pools that many trailing dims, and padding may be flat (left, right, top, bottom)."""
    return self._max_pool("max_pool2d", _kernel_dims(kernel_size), kernel_size, stride, padding, dilation, ceil_mode,
                          return_indices)

  def max_pool3d(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, D, H, W) or (C, D, H, W); indices are flat (d*H + h)*W + w."""
    return self._max_pool("max_pool3d", 3, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

  def _avg_pool(self, op, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    """Window sums over a divisor: with count_include_pad, the window's positions inside the input or its padding;
    without, those inside the input; a ceil_mode window past the padding counts only what it covers (torch's rule)."""
    k, s, p, d, out, pads = self._pool_geometry(op, nd, kernel_size, stride, padding, 1, ceil_mode)
    x = self._float()
    axes = tuple(range(self.ndim, self.ndim + nd))
    sums = x.pad([None] * (self.ndim - nd) + pads)._pool(k, s, d)._acc_sum(axes)
    if divisor_override is not None:
      if not _is_int(divisor_override) or divisor_override == 0:
        raise ValueError(f"{op}: divisor_override must be a non-zero int, got {divisor_override!r}")
      return sums / int(divisor_override)
    counted = [pi if count_include_pad else (0, 0) for pi in p]
    if all(b <= cb and a <= ca for (b, a), (cb, ca) in zip(pads, counted)): return sums / math.prod(k)
    ones = type(self).ones(*[L + cb + ca for L, (cb, ca) in zip(self.shape[-nd:], counted)], dtype=x.dtype,
                           device=self.device)
    counts = ones.pad([(b - cb, a - ca) for (b, a), (cb, ca) in zip(pads, counted)])._pool(k, s, d)
    return sums / counts._acc_sum(tuple(range(nd, 2 * nd)))

  def avg_pool1d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Mean over windows of (N, C, L) or (C, L), as torch.nn.functional.avg_pool1d."""
    return self._avg_pool("avg_pool1d", 1, kernel_size, stride, padding, ceil_mode, count_include_pad)

  def avg_pool2d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
    """Mean over windows of (N, C, H, W) or (C, H, W), as torch.nn.functional.avg_pool2d; a kernel_size of 1 or 3
    ints pools that many trailing dims, and padding may be flat (left, right, top, bottom), as in tinygrad."""
    return self._avg_pool("avg_pool2d", _kernel_dims(kernel_size), kernel_size, stride, padding, ceil_mode,
                          count_include_pad, divisor_override)

  def avg_pool3d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
    """Mean over windows of (N, C, D, H, W) or (C, D, H, W), as torch.nn.functional.avg_pool3d."""
    return self._avg_pool("avg_pool3d", 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override)

  def _max_unpool(self, op, nd, indices, kernel_size, stride, padding, output_size):
    """out.flat[indices[i]] = self[i] per plane, zeros elsewhere; where indices repeat, the last one wins (torch's CPU
    order). A one-hot comparison of every input with every output position: O(in * out) per plane."""
    if self.ndim not in (nd + 1, nd + 2):
      raise ShapeError(f"{op}: expected a (C, {_dims(nd)}) or (N, C, {_dims(nd)}) input, got shape {tuple(self.shape)}")
    if tuple(indices.shape) != tuple(self.shape) or not indices.dtype.is_int:
      raise ShapeError(f"{op}: indices must be an integer tensor of the input's shape {tuple(self.shape)}, got "
                       f"{indices.dtype} of shape {tuple(indices.shape)}")
    k = _ints(kernel_size, nd, "kernel_size", op)
    s = k if stride is None else _ints(stride, nd, "stride", op)
    p, size = _ints(padding, nd, "padding", op), self.shape[-nd:]
    default = [(L - 1) * si - 2 * pi + ki for L, si, pi, ki in zip(size, s, p, k)]
    if output_size is None: out = default
    else:
      out = tuple(output_size)
      out = _ints(out[-nd:] if len(out) in (nd + 1, nd + 2) else out, nd, "output_size", op)
      if any(not dv - si < o < dv + si for o, dv, si in zip(out, default, s)):
        raise ValueError(f"{op}: output_size {out} must be within stride {s} of the default size {tuple(default)}")
    if any(o < 1 for o in out): raise ShapeError(f"{op}: output size {tuple(out)} is empty")
    lead, n_in, n_out = self.shape[:-nd], math.prod(size), math.prod(out)
    ar = lambda n: type(self).arange(n, dtype=dtypes.int32, device=self.device)
    x, idx = self.reshape(*lead, n_in, 1), indices.reshape(*lead, n_in, 1)
    writes = idx == ar(n_out)                                               # (..., in, out)
    i = ar(n_in).reshape(n_in, 1)
    last = writes.where(i, -1).max(-2, keepdim=True)
    return (writes & (i == last)).where(x, 0)._acc_sum(-2).reshape(*lead, *out)

  def max_unpool1d(self, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Inverse of max_pool1d(return_indices=True): each value back at its index, zeros elsewhere."""
    return self._max_unpool("max_unpool1d", 1, indices, kernel_size, stride, padding, output_size)

  def max_unpool2d(self, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Inverse of max_pool2d(return_indices=True): each value back at its flat index, zeros elsewhere."""
    return self._max_unpool("max_unpool2d", 2, indices, kernel_size, stride, padding, output_size)

  def max_unpool3d(self, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Inverse of max_pool3d(return_indices=True): each value back at its flat index, zeros elsewhere."""
    return self._max_unpool("max_unpool3d", 3, indices, kernel_size, stride, padding, output_size)

  # ---------------------------------------------------------------- interpolation

  def interpolate(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                  recompute_scale_factor=None):
    """torch.nn.functional.interpolate on (N, C, *spatial). Modes: 'nearest' (source floor(o * in/out)),
    'nearest-exact' (floor((o + 0.5) * in/out)), 'linear' / 'bilinear' / 'trilinear' / 'bicubic' (half-pixel source
    (o + 0.5) * in/out - 0.5, or o * (in-1)/(out-1) with align_corners), 'area' (adaptive average pooling).
    in/out is 1/scale_factor when one is given, unless recompute_scale_factor. Separable: each spatial dim is
    resampled by an (out, in) table computed from the shapes on the host; an integer nearest upscale is a repeat."""
    op, nd = "interpolate", self.ndim - 2
    if mode not in INTERPOLATE_DIMS:
      raise ValueError(f"{op}: mode must be one of {', '.join(map(repr, INTERPOLATE_DIMS))}, got {mode!r}")
    if nd < 1 or (INTERPOLATE_DIMS[mode] or nd) != nd:
      want = f"{INTERPOLATE_DIMS[mode] + 2}-D" if INTERPOLATE_DIMS[mode] else "at least 3-D"
      raise ShapeError(f"{op}: mode {mode!r} needs a {want} (N, C, *spatial) input, got shape {tuple(self.shape)}")
    smooth = mode in ("linear", "bilinear", "trilinear", "bicubic")
    if align_corners is not None and not smooth:
      raise ValueError(f"{op}: align_corners only applies to the linear and cubic modes, not {mode!r}")
    if (size is None) == (scale_factor is None): raise ValueError(f"{op}: give exactly one of size and scale_factor")
    in_size = self.shape[2:]
    if size is not None: out, scales = _ints(size, nd, "size", op), [None] * nd
    else:
      sf = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * nd
      if len(sf) != nd or not all(isinstance(v, (int, float, np.number)) and math.isfinite(v) and v > 0 for v in sf):
        raise ValueError(f"{op}: scale_factor must be a positive number or {nd} of them, got {scale_factor!r}")
      out = tuple(math.floor(L * float(v)) for L, v in zip(in_size, sf))
      scales = [None] * nd if recompute_scale_factor or mode == "area" else [float(v) for v in sf]
    if any(o < 1 for o in out):
      raise ShapeError(f"{op}: output size {tuple(out)} of input {tuple(self.shape)} is empty")
    x = self
    if self.dtype == dtypes.uint8 and mode in ("linear", "bilinear", "trilinear"):
      # PyTorch's uint8 path (an image): each dim in fixed point, the last dim first, rounded and clamped to 0..255
      # after each pass (UpSampleKernel.cpp's separable uint8 kernels: int16 weights)
      for i in reversed(range(nd)): x = x._resample_u8(2 + i, out[i], bool(align_corners), scales[i])
      return x
    if mode != "nearest" and mode != "nearest-exact" and x.dtype != dtypes.float64: x = x.cast(dtypes.float32)
    for i in range(nd): x = x._resample(2 + i, out[i], mode, bool(align_corners), scales[i])
    keep = self.dtype if self.dtype.is_float or mode in ("nearest", "nearest-exact") else dtypes.float32
    return x if x.dtype == keep else x.cast(keep)

  def _resample_u8(self, dim: int, O: int, align: bool, scale):
    """Linear resampling of a uint8 `dim` to O elements in fixed point, as PyTorch: weights round(w * 2**p) with p the
    most fractional bits (at most 15) that keep the largest weight of the table below 2**15, then (sum of taps *
    weights + 2**(p-1)) >> p clamped to 0..255 (weights from the float64 table, each tap rounded on its own)."""
    L, trailing = self.shape[dim], [1] * (self.ndim - dim - 1)
    w, taps = _linear_table(L, O, scale, align, np.float64)
    bits, top = 0, float(w.max())
    while bits < 15 and int(0.5 + top * (1 << (bits + 1))) < (1 << 15): bits += 1
    wi = type(self)(np.floor(w * (1 << bits) + 0.5).astype(np.int32), device=self.device).reshape(O, L, *trailing)
    mask = type(self)(taps, device=self.device).reshape(O, L, *trailing)
    acc = mask.where(self.unsqueeze(dim).cast(dtypes.int32) * wi, 0).sum(dim + 1)
    return ((acc + (1 << (bits - 1))) >> bits).clip(0, 255).cast(dtypes.uint8)

  def _resample(self, dim: int, O: int, mode: str, align: bool, scale):
    """Resample `dim` to O elements: out[o] = sum over i of table[o, i] * self[i] (the taps only)."""
    L, trailing = self.shape[dim], [1] * (self.ndim - dim - 1)
    if mode in ("nearest", "nearest-exact"):
      src = _nearest_source(L, O, scale, mode == "nearest-exact")
      if O == L and (src == np.arange(O)).all(): return self
      if O % L == 0 and (src == np.arange(O) // (O // L)).all():   # a repeat: movement ops only
        r, shape = O // L, self.shape
        x = self.reshape(*shape[:dim + 1], 1, *shape[dim + 1:]).expand(*shape[:dim + 1], r, *shape[dim + 1:])
        return x.reshape(*shape[:dim], O, *shape[dim + 1:])
      taps = type(self)(src[:, None] == np.arange(L)[None, :], device=self.device).reshape(O, L, *trailing)
      return taps.where(self.unsqueeze(dim), 0)._acc_sum(dim + 1)
    T = np.float64 if self.dtype == dtypes.float64 else np.float32
    if mode == "area": w, taps = _area_table(L, O, T)
    elif mode == "bicubic": w, taps = _cubic_table(L, O, scale, align, T)
    else: w, taps = _linear_table(L, O, scale, align, T)
    wt = type(self)(w, device=self.device).reshape(O, L, *trailing)
    mask = type(self)(taps, device=self.device).reshape(O, L, *trailing)
    return mask.where(self.unsqueeze(dim) * wt, 0)._acc_sum(dim + 1)
