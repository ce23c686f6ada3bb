"""A tiny random program generator: chains of movement, elementwise and reduce ops applied to
the same data in baregrad and in numpy (float64), for the fuzz cases in test_ops.py."""
import numpy as np

from baregrad.tensor import Tensor


def _random_factorization(n, r):
  dims = []
  for p in (2, 3, 5, 7):
    while n % p == 0:
      dims.append(p)
      n //= p
  if n > 1:
    dims.append(n)
  r.shuffle(dims)
  out, cur = [], 1
  for d in dims:
    cur *= d
    if r.random() < 0.5:
      out.append(cur)
      cur = 1
  if cur > 1 or not out:
    out.append(cur)
  return tuple(out)


def random_program(seed, steps=6, device=None):
  """returns (baregrad tensor, numpy float64 reference)"""
  r = np.random.default_rng(seed)
  shape = tuple(int(s) for s in r.integers(1, 5, size=int(r.integers(1, 4))))
  base = r.uniform(-2, 2, size=shape).astype(np.float32)
  t, a = Tensor(base, device=device), base.astype(np.float64)
  for _ in range(steps):
    op = r.choice(["reshape", "permute", "pad", "shrink", "flip", "expand", "binary_view", "unary", "reduce", "slice"])
    nd = a.ndim
    if op == "reshape" and a.size > 0:
      new = _random_factorization(a.size, r)
      t, a = t.reshape(*new), a.reshape(new)
    elif op == "permute" and nd > 1:
      order = [int(i) for i in r.permutation(nd)]
      t, a = t.permute(*order), a.transpose(order)
    elif op == "pad" and nd > 0:
      pads = [(int(r.integers(0, 3)), int(r.integers(0, 3))) for _ in range(nd)]
      t, a = t.pad(pads, value=0.5), np.pad(a, pads, constant_values=0.5)
    elif op == "shrink" and nd > 0:
      arg = []
      for s in a.shape:
        lo = int(r.integers(0, s)) if s > 1 else 0
        hi = int(r.integers(lo + 1, s + 1)) if s > 0 else 0
        arg.append((lo, hi))
      t, a = t.shrink(arg), a[tuple(slice(lo, hi) for lo, hi in arg)]
    elif op == "flip" and nd > 0:
      axes = sorted({int(x) for x in r.integers(0, nd, size=int(r.integers(1, nd + 1)))})
      t, a = t.flip(*axes), np.flip(a, axes)
    elif op == "expand" and nd < 4:
      n = int(r.integers(2, 4))
      t, a = t.reshape(1, *a.shape).expand(n, *a.shape), np.broadcast_to(a[None], (n, *a.shape))
    elif op == "binary_view" and nd > 0:
      # combine with a permuted/flipped view of itself
      if nd > 1 and len(set(a.shape)) == 1:
        order = list(range(nd))[::-1]
        t, a = t * 0.5 + t.permute(*order), a * 0.5 + a.transpose(order)
      else:
        t, a = t - t.flip(nd - 1) * 2, a - np.flip(a, nd - 1) * 2
    elif op == "unary":
      t, a = (t * 0.25).exp() + (t > 0).where(t, -t), np.exp(a * 0.25) + np.where(a > 0, a, -a)
    elif op == "reduce" and nd > 1:
      ax = int(r.integers(0, nd))
      keep = bool(r.random() < 0.5)
      if r.random() < 0.5:
        t, a = t.sum(ax, keepdim=keep), a.sum(ax, keepdims=keep)
      else:
        t, a = t.max(ax, keepdim=keep), a.max(ax, keepdims=keep)
    elif op == "slice" and nd > 0:
      idx = tuple(slice(None, None, int(r.choice([-2, -1, 1, 2]))) for _ in range(nd))
      t, a = t[idx], a[idx]
  return t, a
