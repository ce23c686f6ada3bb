"""Spatial ops (tensor/spatial.py: N-D and transposed convolution, pooling, unpooling, pad modes, interpolate) against
numpy references written from torch.nn.functional's documented definitions, as direct loops over output positions:
a convolution sums x[o*stride + k*dilation - padding] * w[k]; a transposed convolution scatters each x[i] * w[k] to
i*stride + k*dilation - padding; pools follow torch's window rules (ceil_mode, count_include_pad); interpolate follows
torch's source-coordinate rules. Gradients are float64 central differences against .backward() (skipped on a device
without float64, METAL). A subset runs on the emulated AMD and NV GPUs."""
import itertools, math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from helpers_ops import check, randf, widest_float_name
from test_reliability import _emulated

F32 = dict(rtol=1e-4, atol=1e-5)


def tup(v, n): return (v,) * n if isinstance(v, (int, float)) else tuple(v)


def np_pad(a, pairs, mode="constant", value=0.0):
  """numpy's pad for the positive amounts, then a slice for the negative ones (crops)."""
  pairs = [(0, 0)] * (a.ndim - len(pairs)) + list(pairs)
  grow = [(max(b, 0), max(e, 0)) for b, e in pairs]
  kind = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
  a = np.pad(a, grow, mode=kind, **({"constant_values": value} if mode == "constant" else {}))
  return a[tuple(slice(max(-b, 0), a.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(pairs))]


# ---------------------------------------------------------------- references

def conv_ref(x, w, b=None, stride=1, pads=None, dilation=1, groups=1):
  """out[n, o, p] = b[o] + sum over c, k of xpad[n, g*cg + c, p*stride + k*dilation] * w[o, c, k]."""
  nd = x.ndim - 2
  s, d = tup(stride, nd), tup(dilation, nd)
  xp = np_pad(x.astype(np.float64), pads or [(0, 0)] * nd)
  cout, cg, *kernel = w.shape
  out_size = [(L - di * (k - 1) - 1) // si + 1 for L, k, si, di in zip(xp.shape[2:], kernel, s, d)]
  out = np.zeros((x.shape[0], cout, *out_size))
  for o in range(cout):
    g = o // (cout // groups)
    for pos in np.ndindex(*out_size):
      for kk in np.ndindex(*kernel):
        at = tuple(p * si + k * di for p, k, si, di in zip(pos, kk, s, d))
        out[(slice(None), o) + pos] += xp[(slice(None), slice(g * cg, (g + 1) * cg)) + at] @ w[(o, slice(None)) + kk]
  return out if b is None else out + b.reshape(1, -1, *[1] * nd)


def conv_transpose_ref(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
  """Each x[n, c, i] * w[c, o, k] lands on out[n, g*cog + o, i*stride + k*dilation - padding] (conv's adjoint)."""
  nd = x.ndim - 2
  s, p, op, d = (tup(v, nd) for v in (stride, padding, output_padding, dilation))
  cin, cog, *kernel = w.shape
  full = [(L - 1) * si + di * (k - 1) + 1 + o for L, si, di, k, o in zip(x.shape[2:], s, d, kernel, op)]
  out = np.zeros((x.shape[0], cog * groups, *full))
  for c in range(cin):
    g = c // (cin // groups)
    for pos in np.ndindex(*x.shape[2:]):
      for kk in np.ndindex(*kernel):
        at = tuple(i * si + k * di for i, k, si, di in zip(pos, kk, s, d))
        contribution = np.outer(x[(slice(None), c) + pos], w[(c, slice(None)) + kk])
        out[(slice(None), slice(g * cog, (g + 1) * cog)) + at] += contribution
  out = out[(slice(None), slice(None)) + tuple(slice(pi, f - pi) for pi, f in zip(p, full))]
  return out if b is None else out + b.reshape(1, -1, *[1] * nd)


def pool_out(L, k, s, p, d, ceil):
  o = (L + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
  return o - 1 if ceil and (o - 1) * s >= L + p else o


def max_pool_ref(x, nd, k, s=None, p=0, d=1, ceil=False):
  """Per window: the positions o*s - p + j*d inside the input; the max and the flat index of its first occurrence."""
  k = tup(k, nd); s = k if s is None else tup(s, nd); p, d = tup(p, nd), tup(d, nd)
  size = x.shape[-nd:]
  out_size = [pool_out(*a, ceil) for a in zip(size, k, s, p, d)]
  planes = x.reshape(-1, *size)
  vals, idxs = np.zeros((len(planes), *out_size), x.dtype), np.zeros((len(planes), *out_size), np.int64)
  for n, plane in enumerate(planes):
    for pos in np.ndindex(*out_size):
      best = None
      for kk in np.ndindex(*k):
        at = tuple(o * si - pi + j * di for o, j, si, pi, di in zip(pos, kk, s, p, d))
        if all(0 <= a < L for a, L in zip(at, size)) and (best is None or plane[at] > plane[best]): best = at
      vals[(n,) + pos], idxs[(n,) + pos] = plane[best], np.ravel_multi_index(best, size)
  return vals.reshape(*x.shape[:-nd], *out_size), idxs.reshape(*x.shape[:-nd], *out_size)


def avg_pool_ref(x, nd, k, s=None, p=0, ceil=False, include=True, divisor=None):
  """torch: window [o*s - p, min(o*s - p + k, L + p)); pool_size counts it all, the sum and the unpadded count only
  positions inside the input."""
  k = tup(k, nd); s = k if s is None else tup(s, nd); p = tup(p, nd)
  size = x.shape[-nd:]
  out_size = [pool_out(L, ki, si, pi, 1, ceil) for L, ki, si, pi in zip(size, k, s, p)]
  planes = x.reshape(-1, *size).astype(np.float64)
  out = np.zeros((len(planes), *out_size))
  for pos in np.ndindex(*out_size):
    lo = [o * si - pi for o, si, pi in zip(pos, s, p)]
    hi = [min(a + ki, L + pi) for a, ki, L, pi in zip(lo, k, size, p)]
    pool_size = math.prod(h - a for a, h in zip(lo, hi))
    lo, hi = [max(a, 0) for a in lo], [min(h, L) for h, L in zip(hi, size)]
    box = planes[(slice(None),) + tuple(slice(a, h) for a, h in zip(lo, hi))]
    div = divisor or (pool_size if include else math.prod(h - a for a, h in zip(lo, hi)))
    out[(slice(None),) + pos] = box.reshape(len(planes), -1).sum(1) / div
  return out.reshape(*x.shape[:-nd], *out_size)


def unpool_ref(x, idx, nd, out_size):
  """out.flat[idx[i]] = x[i] per plane, in order (a later write wins)."""
  plane = math.prod(x.shape[-nd:])
  xs, ip = x.reshape(-1, plane), idx.reshape(-1, plane)
  out = np.zeros((len(xs), math.prod(out_size)), x.dtype)
  for n in range(len(xs)):
    for i in range(plane): out[n, ip[n, i]] = xs[n, i]
  return out.reshape(*x.shape[:-nd], *out_size)


def source_coord(o, L, O, scale, align, cubic=False):
  """torch's area_pixel_compute_source_index in float32: o*(L-1)/(O-1) with align_corners, else
  (o + 0.5)*scale - 0.5 (clamped at 0 unless cubic), scale = 1/scale_factor if given, else L/O."""
  f = np.float32
  if align: return (f(L - 1) / f(O - 1) if O > 1 else f(0)) * f(o)
  sc = f(1.0 / scale) if scale else f(L) / f(O)
  src = sc * (f(o) + f(0.5)) - f(0.5)
  return src if cubic or src >= 0 else f(0)


def interp_taps(o, L, O, scale, mode, align):
  """[(input index, weight)] that output index o reads along one dim."""
  f = np.float32
  if mode in ("nearest", "nearest-exact"):
    sc = f(1.0 / scale) if scale else f(L) / f(O)
    if mode == "nearest": src = f(o) * sc
    else: src = f((o + 0.5) * np.float64(sc))
    return [(min(int(math.floor(src)), L - 1), 1.0)]
  if mode == "area":
    a, b = (o * L) // O, -(-((o + 1) * L) // O)
    return [(i, 1.0 / (b - a)) for i in range(a, b)]
  if mode == "bicubic":
    src = source_coord(o, L, O, scale, align, cubic=True)
    i0 = int(math.floor(src)); t = float(src - f(i0)); A = -0.75
    near = lambda x: ((A + 2) * x - (A + 3)) * x * x + 1
    far = lambda x: ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return [(min(max(i0 - 1 + j, 0), L - 1), c) for j, c in enumerate((far(t + 1), near(t), near(1 - t), far(2 - t)))]
  src = source_coord(o, L, O, scale, align)
  i0 = min(int(math.floor(src)), L - 1)
  lam = min(max(float(src) - i0, 0.0), 1.0)
  return [(i0, 1 - lam), (i0 + (1 if i0 < L - 1 else 0), lam)]


def interp_ref(x, out_size, mode, align=False, scales=None):
  """Each output element: the sum over the product of every dim's taps."""
  nd = x.ndim - 2
  scales = scales or [None] * nd
  out = np.zeros((*x.shape[:2], *out_size))
  for pos in np.ndindex(*out_size):
    taps = [interp_taps(o, L, O, sc, mode, align) for o, L, O, sc in zip(pos, x.shape[2:], out_size, scales)]
    for combo in itertools.product(*taps):
      with np.errstate(invalid="ignore"):   # 0 * inf is NaN, in torch too
        out[(...,) + pos] += math.prod(wt for _, wt in combo) * x[(...,) + tuple(i for i, _ in combo)]
  return out


def grad_check(fn, *arrays, eps=1e-6, rtol=1e-5, atol=1e-7):
  """.backward() of sum(fn(*inputs) * R) against central differences in every element of every input (float64)."""
  arrays = [np.asarray(a, np.float64) for a in arrays]
  ts = [Tensor(a, requires_grad=True) for a in arrays]
  out = fn(*ts)
  r = np.random.default_rng(7).standard_normal(out.shape)
  (out * Tensor(r)).sum().backward()
  for k, (t, a) in enumerate(zip(ts, arrays)):
    numeric = np.zeros_like(a)
    for i in np.ndindex(*a.shape):
      vals = []
      for sign in (1, -1):
        moved = [b.copy() for b in arrays]
        moved[k][i] += sign * eps
        vals.append((fn(*[Tensor(b) for b in moved]).numpy() * r).sum())
      numeric[i] = (vals[0] - vals[1]) / (2 * eps)
    assert t.grad is not None, f"input {k} got no gradient"
    np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=rtol, atol=atol, err_msg=f"gradient of input {k}")


def distinct(*shape, seed=0):
  """Values at least 0.1 apart (a max keeps its argmax under a small perturbation)."""
  return np.random.default_rng(seed).permutation(math.prod(shape)).reshape(shape) * 0.1 - 1.0


# ---------------------------------------------------------------- convolution

CONV = [  # (op, x shape, w shape, kwargs, reference (before, after) per spatial dim)
  ("conv1d", (2, 3, 9), (4, 3, 3), dict(), [(0, 0)]),
  ("conv1d", (2, 4, 10), (6, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2, bias=True), [(1, 1)]),
  ("conv1d", (1, 2, 7), (3, 2, 4), dict(padding="same"), [(1, 2)]),
  ("conv1d", (1, 2, 7), (3, 2, 3), dict(padding="valid", stride=3), [(0, 0)]),
  ("conv1d", (1, 3, 8), (3, 1, 2), dict(groups=3, padding=(2, 1)), [(2, 1)]),
  ("conv2d", (1, 4, 7, 6), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2, bias=True),
   [(1, 1), (2, 2)]),
  ("conv2d", (2, 2, 6, 7), (3, 2, 3, 3), dict(padding="same", dilation=2), [(2, 2), (2, 2)]),
  ("conv2d", (1, 2, 5, 6), (2, 2, 3, 2), dict(padding=(1, 0, 2, 1)), [(2, 1), (1, 0)]),        # tinygrad (l, r, t, b)
  ("conv2d", (1, 2, 6, 7), (2, 2, 2, 2), dict(padding=(-1, 2, 1, -2), stride=2), [(1, -2), (-1, 2)]),   # crops
  ("conv2d", (1, 1, 6, 6), (1, 1, 2, 2), dict(padding=-1), [(-1, -1), (-1, -1)]),
  ("conv3d", (1, 2, 5, 4, 5), (2, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=(1, 0, 1), bias=True),
   [(1, 1), (0, 0), (1, 1)]),
  ("conv3d", (1, 4, 5, 5, 4), (2, 2, 2, 2, 2), dict(groups=2, dilation=2, padding=(0, 1, 1, 0, 0, 1)),
   [(0, 1), (1, 0), (0, 1)]),
]


@pytest.mark.parametrize("op, xs, ws, kw, pads", CONV, ids=[f"{c[0]}-{i}" for i, c in enumerate(CONV)])
def test_conv(op, xs, ws, kw, pads):
  kw = dict(kw)
  x, w = randf(xs, seed=1), randf(ws, seed=2)
  b = randf((ws[0],), seed=3) if kw.pop("bias", False) else None
  out = getattr(Tensor(x), op)(Tensor(w), None if b is None else Tensor(b), **kw)
  ref_kw = {k: v for k, v in kw.items() if k in ("stride", "dilation", "groups")}
  check(out, conv_ref(x, w, b, pads=pads, **ref_kw).astype(np.float32), **F32)


def test_conv_unbatched_and_errors():
  x, w = randf((3, 8), seed=1), randf((2, 3, 3), seed=2)
  check(Tensor(x).conv1d(Tensor(w), padding=1), conv_ref(x[None], w, pads=[(1, 1)])[0].astype(np.float32), **F32)
  x3, w3 = randf((2, 4, 3, 5), seed=3), randf((1, 2, 2, 2, 2), seed=4)
  check(Tensor(x3).conv3d(Tensor(w3)), conv_ref(x3[None], w3)[0].astype(np.float32), **F32)
  for bad in [dict(padding="same", stride=2), dict(padding="full"), dict(padding=(1, 2, 3)), dict(groups=2),
              dict(dilation=0)]:
    with pytest.raises(ValueError):
      Tensor(randf((1, 3, 8))).conv1d(Tensor(randf((2, 3, 3))), **bad)
  with pytest.raises(ValueError):
    Tensor(randf((1, 3, 8, 8))).conv1d(Tensor(randf((2, 3, 3))))


CONV_T = [  # (op, x shape, w shape, kwargs)
  ("conv_transpose1d", (2, 4, 5), (4, 3, 3), dict(stride=2, padding=1, output_padding=1, bias=True)),
  ("conv_transpose1d", (1, 4, 4), (4, 2, 3), dict(stride=3, groups=2, dilation=2, output_padding=2)),
  ("conv_transpose1d", (1, 2, 6), (2, 1, 4), dict(padding=3)),
  ("conv_transpose2d", (1, 2, 3, 4), (2, 3, 3, 2),
   dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), bias=True)),
  ("conv_transpose2d", (1, 1, 5, 5), (1, 2, 3, 3), dict(stride=2, padding=2)),            # padding > dilation*(k-1)
  ("conv_transpose2d", (2, 4, 3, 3), (4, 1, 2, 3), dict(groups=2, dilation=(2, 1), padding=(0, 1))),
  ("conv_transpose3d", (1, 2, 2, 3, 2), (2, 2, 2, 2, 3), dict(stride=2, padding=(0, 1, 1), bias=True)),
  ("conv_transpose3d", (1, 2, 2, 2, 3), (2, 1, 2, 1, 2), dict(groups=2, stride=(1, 2, 2), output_padding=(0, 1, 0))),
]


@pytest.mark.parametrize("op, xs, ws, kw", CONV_T, ids=[f"{c[0]}-{i}" for i, c in enumerate(CONV_T)])
def test_conv_transpose(op, xs, ws, kw):
  kw = dict(kw)
  x, w = randf(xs, seed=4), randf(ws, seed=5)
  b = randf((ws[1] * kw.get("groups", 1),), seed=6) if kw.pop("bias", False) else None
  out = getattr(Tensor(x), op)(Tensor(w), None if b is None else Tensor(b), **kw)
  check(out, conv_transpose_ref(x, w, b, **kw).astype(np.float32), **F32)


def test_conv_transpose_unbatched_and_errors():
  x, w = randf((2, 3, 4), seed=1), randf((2, 3, 2, 2), seed=2)
  check(Tensor(x).conv_transpose2d(Tensor(w), stride=2), conv_transpose_ref(x[None], w, stride=2)[0].astype(np.float32),
        **F32)
  t, wt = Tensor(randf((1, 2, 4))), Tensor(randf((2, 3, 3)))
  for bad in [dict(output_padding=2, stride=2), dict(padding=-1), dict(groups=4), dict(stride=0), dict(padding=3)]:
    with pytest.raises(ValueError):
      t.conv_transpose1d(wt, **bad)


def test_conv_transpose_is_conv_input_gradient():
  """conv_transpose2d(g, w) is d/dx of sum(conv2d(x, w) * g), the relation its definition comes from."""
  wide = widest_float_name()                      # float64, or float32 on a device without it
  x, w = Tensor(randf((1, 2, 7, 6), seed=1, dtype=wide), requires_grad=True), randf((3, 2, 3, 2), seed=2)
  y = x.conv2d(Tensor(w), stride=2, padding=1, dilation=(1, 2))
  g = randf(y.shape, seed=3, dtype=wide)
  (y * Tensor(g)).sum().backward()
  ref = Tensor(g).conv_transpose2d(Tensor(w), stride=2, padding=1, dilation=(1, 2), output_padding=(0, 1))
  tol = dict(rtol=1e-10, atol=1e-12) if wide == "float64" else dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ref.numpy(), x.grad.numpy(), **tol)


# ---------------------------------------------------------------- pooling

MAX_POOL = [  # (nd, x shape, kwargs)
  (1, (2, 3, 9), dict(kernel_size=3, stride=2, padding=1)),
  (1, (1, 2, 7), dict(kernel_size=2, ceil_mode=True)),
  (1, (1, 1, 5), dict(kernel_size=2, stride=2, padding=1, ceil_mode=True)),     # ceil window would start in padding
  (1, (2, 10), dict(kernel_size=3, stride=2, dilation=2, padding=1, ceil_mode=True)),
  (2, (2, 2, 7, 6), dict(kernel_size=(3, 2), stride=2, padding=(1, 0), ceil_mode=True)),
  (2, (1, 2, 9, 8), dict(kernel_size=3, stride=2, padding=1, dilation=(2, 1))),
  (2, (3, 5, 5), dict(kernel_size=2, ceil_mode=True)),
  (2, (1, 1, 6, 6), dict(kernel_size=3, stride=1)),
  (3, (1, 2, 5, 4, 5), dict(kernel_size=2, stride=(2, 1, 2), padding=(1, 0, 1), ceil_mode=True)),
]


@pytest.mark.parametrize("nd, xs, kw", MAX_POOL, ids=[f"{c[0]}d-{i}" for i, c in enumerate(MAX_POOL)])
def test_max_pool(nd, xs, kw):
  x = np.random.default_rng(8).integers(-3, 4, size=xs).astype(np.float32)   # ties: the first maximum's index
  ref_v, ref_i = max_pool_ref(x, nd, kw["kernel_size"], kw.get("stride"), kw.get("padding", 0), kw.get("dilation", 1),
                              kw.get("ceil_mode", False))
  fn = getattr(Tensor(x), f"max_pool{nd}d")
  check(fn(**kw), ref_v)
  v, i = fn(**kw, return_indices=True)
  check(v, ref_v)
  check(i, ref_i.astype(np.int32))


def test_max_pool_int_and_neg_inf():
  x = np.full((1, 1, 4, 5), -np.inf, np.float32)
  x[0, 0, 3, 4] = 1.0
  v, i = Tensor(x).max_pool2d(2, padding=1, return_indices=True)
  ref_v, ref_i = max_pool_ref(x, 2, 2, None, 1)
  check(v, ref_v)
  check(i, ref_i.astype(np.int32))
  xi = np.random.default_rng(1).integers(-50, 50, size=(2, 7)).astype(np.int32)
  check(Tensor(xi).max_pool1d(3, 2, 1, ceil_mode=True), max_pool_ref(xi, 1, 3, 2, 1, ceil=True)[0])


AVG_POOL = [  # (nd, x shape, kwargs)
  (1, (2, 3, 9), dict(kernel_size=3, stride=2, padding=1)),
  (1, (1, 1, 5), dict(kernel_size=2, stride=2, padding=1)),
  (1, (1, 2, 8), dict(kernel_size=3, stride=3, padding=1)),
  (2, (1, 2, 7, 8), dict(kernel_size=(3, 2), stride=(2, 3), padding=1)),
  (2, (2, 6, 5), dict(kernel_size=3, stride=2)),
  (3, (1, 2, 5, 4, 5), dict(kernel_size=2, stride=2, padding=1)),
]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("nd, xs, kw", AVG_POOL, ids=[f"{c[0]}d-{i}" for i, c in enumerate(AVG_POOL)])
def test_avg_pool(nd, xs, kw, ceil_mode, count_include_pad):
  x = randf(xs, seed=9)
  out = getattr(Tensor(x), f"avg_pool{nd}d")(**kw, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
  ref = avg_pool_ref(x, nd, kw["kernel_size"], kw.get("stride"), kw.get("padding", 0), ceil_mode, count_include_pad)
  check(out, ref.astype(np.float32), **F32)


def test_avg_pool_divisor_and_errors():
  x = randf((1, 2, 7, 6), seed=2)
  check(Tensor(x).avg_pool2d(3, 2, 1, ceil_mode=True, divisor_override=5),
        avg_pool_ref(x, 2, 3, 2, 1, ceil=True, divisor=5).astype(np.float32), **F32)
  x3 = randf((1, 1, 4, 5, 3), seed=3)
  check(Tensor(x3).avg_pool3d((2, 3, 2), 1, divisor_override=4), avg_pool_ref(x3, 3, (2, 3, 2), 1, divisor=4)
        .astype(np.float32), **F32)
  t = Tensor(randf((1, 2, 5)))
  for bad in [dict(kernel_size=2, padding=2), dict(kernel_size=6), dict(kernel_size=0), dict(kernel_size=2, stride=0)]:
    with pytest.raises(ValueError):
      t.avg_pool1d(**bad)
    with pytest.raises(ValueError):
      t.max_pool1d(**bad)
  with pytest.raises(ValueError):
    Tensor(randf((5, 5))).max_pool2d(2)


UNPOOL = [  # (nd, x shape, kwargs, output_size)
  (1, (2, 2, 9), dict(kernel_size=3, stride=2, padding=1), None),
  (2, (1, 2, 6, 6), dict(kernel_size=2), None),
  (2, (1, 1, 5, 5), dict(kernel_size=2, stride=2), (5, 5)),
  (2, (1, 1, 4, 5), dict(kernel_size=3, stride=1), None),            # overlapping windows: repeated indices
  (3, (1, 1, 4, 4, 5), dict(kernel_size=2, stride=2), (1, 1, 4, 5, 5)),
]


@pytest.mark.parametrize("nd, xs, kw, output_size", UNPOOL, ids=[f"{c[0]}d-{i}" for i, c in enumerate(UNPOOL)])
def test_max_unpool(nd, xs, kw, output_size):
  x = distinct(*xs, seed=3).astype(np.float32)
  v, i = getattr(Tensor(x), f"max_pool{nd}d")(**kw, return_indices=True)
  out = getattr(v, f"max_unpool{nd}d")(i, **kw, output_size=output_size)
  k, s, p = tup(kw["kernel_size"], nd), tup(kw.get("stride", kw["kernel_size"]), nd), tup(kw.get("padding", 0), nd)
  default = [(L - 1) * si - 2 * pi + ki for L, si, pi, ki in zip(v.shape[-nd:], s, p, k)]
  size = output_size[-nd:] if output_size else default
  check(out, unpool_ref(v.numpy(), i.numpy(), nd, size).astype(np.float32))


def test_max_unpool_given_indices_last_wins():
  x = randf((2, 1, 4), seed=1)
  idx = np.array([[[3, 0, 3, 5]], [[1, 1, 2, 7]]], np.int32)
  check(Tensor(x).max_unpool1d(Tensor(idx), 2), unpool_ref(x, idx, 1, (8,)))
  with pytest.raises(ValueError):
    Tensor(x).max_unpool1d(Tensor(idx), 2, output_size=(11,))
  with pytest.raises(ValueError):
    Tensor(x).max_unpool1d(Tensor(idx[:, :, :3]), 2)


# ---------------------------------------------------------------- pad

PAD = [  # (shape, padding, mode, value, numpy (before, after) per dim from the last dims)
  ((2, 3, 5), (1, 2), "constant", 1.5, [(1, 2)]),
  ((2, 3, 5), (1, 2, 0, 1), "constant", 0.0, [(0, 1), (1, 2)]),
  ((2, 3, 5), (-1, 2, 1, -2, 1, 0), "constant", -2.0, [(1, 0), (1, -2), (-1, 2)]),
  ((2, 3, 5), ((-1, 0), None, (2, -3)), "constant", 0.0, [(-1, 0), (0, 0), (2, -3)]),
  ((2, 3, 5), (2, 4), "reflect", 0.0, [(2, 4)]),
  ((1, 2, 4, 5), (1, 2, 3, 0), "reflect", 0.0, [(3, 0), (1, 2)]),
  ((2, 3, 5), (-1, 3, 2, 1), "reflect", 0.0, [(2, 1), (-1, 3)]),
  ((2, 3, 5), (3, 1, 2, 2), "replicate", 0.0, [(2, 2), (3, 1)]),
  ((1, 2, 3, 4), ((0, 0), (1, 0), (0, 2), (4, 1)), "replicate", 0.0, [(0, 0), (1, 0), (0, 2), (4, 1)]),
  ((2, 3, 5), (5, 2, 3, 1), "circular", 0.0, [(3, 1), (5, 2)]),
  ((1, 2, 3, 4, 5), (1, 1, 0, 2, 3, 0), "circular", 0.0, [(3, 0), (0, 2), (1, 1)]),
  ((1, 2, 3, 4, 5), (2, -1, 1, 1, 1, 2), "reflect", 0.0, [(1, 2), (1, 1), (2, -1)]),
]


@pytest.mark.parametrize("shape, padding, mode, value, pairs", PAD, ids=[f"{c[2]}-{i}" for i, c in enumerate(PAD)])
def test_pad(shape, padding, mode, value, pairs):
  x = randf(shape, seed=4)
  check(Tensor(x).pad(padding, mode=mode, value=value), np_pad(x, pairs, mode, value))


def test_pad_keeps_dtype_and_errors():
  xi = np.arange(12, dtype=np.int32).reshape(3, 4)
  check(Tensor(xi).pad((1, 2, 2, 0), mode="reflect"), np_pad(xi, [(2, 0), (1, 2)], "reflect"))
  check(Tensor(xi).pad(((1, 1), (-1, 0)), value=7), np_pad(xi, [(1, 1), (-1, 0)], value=7))
  t = Tensor(randf((2, 3)))
  for padding, kw in [((3, 0), dict(mode="reflect")), ((0, 4), dict(mode="circular")), ((1, 2, 3), {}),
                      ((1, 1) * 3, {}), ((-2, -2), {}), ((1, 1), dict(mode="wrap")),
                      ((1, 1), dict(mode="replicate", value=1.0)), (((1, 1),), {})]:
    with pytest.raises(ValueError):
      t.pad(padding, **kw)


# ---------------------------------------------------------------- interpolate

INTERP = [  # (x shape, kwargs)
  ((1, 2, 5), dict(size=7)),
  ((1, 2, 5), dict(scale_factor=2)),
  ((1, 2, 8), dict(scale_factor=0.5)),
  ((1, 1, 4), dict(size=3)),
  ((1, 1, 3), dict(scale_factor=1.7)),
  ((1, 2, 4, 5), dict(size=(7, 3))),
  ((1, 2, 4, 5), dict(scale_factor=(2, 0.6))),
  ((1, 1, 3, 4, 2), dict(size=(5, 3, 4))),
  ((1, 1, 3, 4, 2), dict(scale_factor=(1.5, 0.75, 3), recompute_scale_factor=True)),
]


def _interp_case(xs, kw, mode, align):
  x = randf(xs, seed=6)
  nd = len(xs) - 2
  kw = dict(kw)
  if "size" in kw: out_size, scales = tup(kw["size"], nd), None
  else:
    sf = tup(kw["scale_factor"], nd)
    out_size = tuple(math.floor(L * v) for L, v in zip(xs[2:], sf))
    scales = None if kw.get("recompute_scale_factor") or mode == "area" else list(sf)
  out = Tensor(x).interpolate(**kw, mode=mode, align_corners=align)
  return out, interp_ref(x, out_size, mode, bool(align), scales)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area"])
@pytest.mark.parametrize("xs, kw", INTERP, ids=[str(i) for i in range(len(INTERP))])
def test_interpolate_nearest_area(xs, kw, mode):
  out, ref = _interp_case(xs, kw, mode, None)
  check(out, ref.astype(np.float32), **(F32 if mode == "area" else {}))


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("xs, kw", INTERP, ids=[str(i) for i in range(len(INTERP))])
def test_interpolate_linear(xs, kw, align):
  mode = {3: "linear", 4: "bilinear", 5: "trilinear"}[len(xs)]
  out, ref = _interp_case(xs, kw, mode, align)
  check(out, ref.astype(np.float32), **F32)
  if len(xs) == 4:
    out, ref = _interp_case(xs, kw, "bicubic", align)
    check(out, ref.astype(np.float32), **F32)


def test_interpolate_known_values():
  """Values torch documents and users quote: half-pixel bilinear of [[1, 2], [3, 4]], the corner-aligned grid, and
  nearest vs nearest-exact on a 4 -> 3 downscale."""
  x = Tensor(np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32))
  half = [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]]
  check(x.interpolate(scale_factor=2, mode="bilinear"), np.array([[half]], np.float32))
  aligned = np.array([[1.0, 4 / 3, 5 / 3, 2.0], [5 / 3, 2.0, 7 / 3, 8 / 3], [7 / 3, 8 / 3, 3.0, 10 / 3],
                      [3.0, 10 / 3, 11 / 3, 4.0]], np.float32)
  check(x.interpolate(size=4, mode="bilinear", align_corners=True), aligned[None, None], **F32)
  r = Tensor(np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32))
  check(r.interpolate(scale_factor=2, mode="linear"),
        np.array([[[1, 1.25, 1.75, 2.25, 2.75, 3.25, 3.75, 4]]], np.float32))
  check(r.interpolate(size=3), np.array([[[1.0, 2.0, 3.0]]], np.float32))
  check(r.interpolate(size=3, mode="nearest-exact"), np.array([[[1.0, 3.0, 4.0]]], np.float32))
  three = Tensor(np.array([[[1.0, 2.0, 3.0]]], np.float32))
  check(three.interpolate(size=5), np.array([[[1, 1, 2, 2, 3]]], np.float32))
  check(three.interpolate(size=5, mode="nearest-exact"), np.array([[[1, 1, 2, 3, 3]]], np.float32))


def test_interpolate_dtypes_and_errors():
  xi = np.arange(10, dtype=np.int32).reshape(1, 1, 2, 5)
  check(Tensor(xi).interpolate(size=(3, 7)), interp_ref(xi, (3, 7), "nearest").astype(np.int32))
  x = np.array([[[0.0, np.inf, 2.0, 3.0]]], np.float32)
  check(Tensor(x).interpolate(size=8, mode="linear"), interp_ref(x, (8,), "linear").astype(np.float32))
  check(Tensor(xi).interpolate(size=(3, 4), mode="bilinear"), interp_ref(xi, (3, 4), "bilinear").astype(np.float32),
        **F32)
  t = Tensor(randf((1, 2, 4, 4)))
  for kw in [dict(size=3, mode="trilinear"), dict(size=3, align_corners=True),
             dict(size=3, scale_factor=2), dict(), dict(size=3, mode="cubic"), dict(scale_factor=0.1),
             dict(scale_factor=(2, 2, 2)), dict(size=(0, 3))]:
    with pytest.raises(ValueError):
      t.interpolate(**kw)


def test_interpolate_uint8_bilinear_equals_torch():
  """uint8 images interpolate in PyTorch's fixed point and stay uint8: every value equal to what torch 2.13 returned
  (tests/fixtures/make_interpolate_fixtures.py wrote them), full-range pixels, up and down, both align_corners."""
  import os
  ref = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "torch", "interpolate_uint8.npz"))
  for k in range(len([n for n in ref.files if n.startswith("x")])):
    got = Tensor(ref[f"x{k}"]).interpolate(size=tuple(int(v) for v in ref[f"size{k}"]), mode="bilinear",
                                           align_corners=bool(ref[f"align{k}"])).numpy()
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref[f"y{k}"], err_msg=f"case {k}")


# ---------------------------------------------------------------- gradients (float64 central differences: skipped on a
# device without float64)

GRADS = [  # (name, fn, input shapes or arrays)
  ("conv1d", lambda x, w, b: x.conv1d(w, b, stride=2, padding=1, dilation=2, groups=2), [(1, 4, 7), (4, 2, 3), (4,)]),
  ("conv2d_tinygrad_pads", lambda x, w: x.conv2d(w, groups=2, padding=(1, -1, 0, 2)), [(1, 2, 4, 5), (2, 1, 2, 3)]),
  ("conv3d", lambda x, w: x.conv3d(w, padding=1, stride=2), [(1, 1, 3, 3, 3), (2, 1, 2, 2, 2)]),
  ("conv_transpose1d", lambda x, w, b: x.conv_transpose1d(w, b, stride=2, padding=1, output_padding=1),
   [(1, 2, 4), (2, 2, 3), (2,)]),
  ("conv_transpose2d", lambda x, w: x.conv_transpose2d(w, groups=2, stride=(2, 1), dilation=(1, 2), padding=1),
   [(1, 2, 3, 3), (2, 1, 2, 3)]),
  ("conv_transpose3d", lambda x, w: x.conv_transpose3d(w, stride=2), [(1, 1, 2, 2, 2), (1, 2, 2, 1, 2)]),
  ("avg_pool1d", lambda x: x.avg_pool1d(3, 2, 1), [(1, 2, 7)]),
  ("avg_pool2d_ceil", lambda x: x.avg_pool2d(2, 2, 1, ceil_mode=True, count_include_pad=False), [(1, 1, 5, 4)]),
  ("avg_pool3d", lambda x: x.avg_pool3d(2, 1, ceil_mode=True), [(1, 1, 3, 2, 3)]),
  ("max_pool1d", lambda x: x.max_pool1d(3, 1, 1, dilation=2), [distinct(1, 2, 6)]),
  ("max_pool2d", lambda x: x.max_pool2d(3, 2, 1, ceil_mode=True), [distinct(1, 1, 6, 5)]),
  ("max_pool3d", lambda x: x.max_pool3d(2, (1, 2, 1)), [distinct(1, 1, 3, 4, 2)]),
  ("max_unpool2d", lambda x: x.max_unpool2d(Tensor(np.array([[[[0, 5], [12, 14]]]], np.int32)), 2), [(1, 1, 2, 2)]),
  ("pad_constant", lambda x: x.pad((2, -1, -1, 1), value=0.5), [(1, 3, 4)]),
  ("pad_reflect", lambda x: x.pad((2, 1, 1, 2), mode="reflect"), [(1, 3, 4)]),
  ("pad_replicate", lambda x: x.pad((2, 0, 1, 3), mode="replicate"), [(1, 3, 4)]),
  ("pad_circular", lambda x: x.pad((4, -1, 1, 3), mode="circular"), [(1, 3, 4)]),
  ("linear", lambda x: x.interpolate(size=7, mode="linear"), [(1, 2, 4)]),
  ("linear_align", lambda x: x.interpolate(scale_factor=0.6, mode="linear", align_corners=True), [(1, 1, 6)]),
  ("bilinear", lambda x: x.interpolate(size=(5, 3), mode="bilinear"), [(1, 1, 3, 4)]),
  ("bicubic_align", lambda x: x.interpolate(size=(4, 5), mode="bicubic", align_corners=True), [(1, 1, 3, 3)]),
  ("trilinear", lambda x: x.interpolate(scale_factor=(1.5, 1, 2), mode="trilinear"), [(1, 1, 2, 3, 2)]),
]


@pytest.mark.needs_float64
@pytest.mark.parametrize("fn, inputs", [g[1:] for g in GRADS], ids=[g[0] for g in GRADS])
def test_gradient(fn, inputs):
  arrays = [a if isinstance(a, np.ndarray) else randf(a, seed=i, dtype=np.float64) for i, a in enumerate(inputs)]
  grad_check(fn, *arrays)


# ---------------------------------------------------------------- emulated GPUs

GPU = [  # (name, fn, input shapes); each checked against the same op on the CPU device (itself checked above)
  ("conv1d", lambda x, w: x.conv1d(w, stride=2, padding=1), [(1, 2, 7), (2, 2, 3)]),
  ("conv_transpose2d", lambda x, w: x.conv_transpose2d(w, stride=2, padding=1, output_padding=1),
   [(1, 2, 3, 3), (2, 1, 3, 3)]),
  ("max_pool2d", lambda x: x.max_pool2d(3, 2, 1, ceil_mode=True), [(1, 1, 6, 5)]),
  ("avg_pool2d_ceil", lambda x: x.avg_pool2d(2, 2, 1, ceil_mode=True, count_include_pad=False), [(1, 1, 5, 4)]),
  ("pad_reflect", lambda x: x.pad((2, 1, 1, 2), mode="reflect"), [(1, 3, 4)]),
  ("bilinear", lambda x: x.interpolate(size=(5, 3), mode="bilinear"), [(1, 1, 3, 4)]),
]


@pytest.mark.parametrize("device", ["AMD", "NV"])
@pytest.mark.parametrize("fn, inputs", [g[1:] for g in GPU], ids=[g[0] for g in GPU])
def test_emulated_gpu(device, fn, inputs):
  _emulated(device)
  arrays = [randf(s, seed=i) for i, s in enumerate(inputs)]
  want = fn(*[Tensor(a) for a in arrays])
  got = fn(*[Tensor(a, device=device) for a in arrays])
  assert got.device == device
  check(got, want.numpy(), **F32)


def test_emulated_gpu_max_pool_indices():
  _emulated("AMD")
  x = np.random.default_rng(8).integers(-3, 4, size=(1, 2, 5, 5)).astype(np.float32)
  v, i = Tensor(x, device="AMD").max_pool2d(2, padding=1, return_indices=True)
  ref_v, ref_i = max_pool_ref(x, 2, 2, None, 1)
  check(v, ref_v)
  check(i, ref_i.astype(np.int32))
