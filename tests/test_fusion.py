"""Fusion: how many kernels a computation becomes (and that the fused result is still right)."""
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.compiler.dtype import dtypes

rng = np.random.default_rng(0)


def kernels(t: Tensor) -> int:
  return sum(1 for item in t.schedule() if item.program is not None)


def T(*shape):
  return Tensor(rng.standard_normal(shape).astype(np.float32))


def check(t: Tensor, ref, max_kernels: int, exact: bool = True):
  n = kernels(t)
  assert (n == max_kernels) if exact else (n <= max_kernels), f"{n} kernels, expected {'' if exact else '<= '}{max_kernels}"
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_elementwise_chain():
  a, b, c = T(4, 5), T(4, 5), T(4, 5)
  check((((a + b) * c - 1.5) / 2).relu().exp(), np.exp(np.maximum(((a.numpy() + b.numpy()) * c.numpy() - 1.5) / 2, 0)), 1)


def test_reduce_of_elementwise():
  a, b, c = T(6, 7), T(6, 7), T(6, 7)
  check(((a + b) * c).sum(axis=1), ((a.numpy() + b.numpy()) * c.numpy()).sum(1), 1)


def test_matmul_bias_relu():
  x, w, b = T(8, 16), T(16, 4), T(4)
  check((x @ w + b).relu(), np.maximum(x.numpy() @ w.numpy() + b.numpy(), 0), 1)


def test_softmax_at_most_3():
  x = T(5, 9)
  e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
  check(x.softmax(-1), e / e.sum(-1, keepdims=True), 3, exact=False)


def test_large_softmax_stores_its_exponentials_once():
  """From SOFTMAX_STORE_EXP elements a softmax stores exp(x - max) (one kernel) for its sum and its division, so exp
  runs once per element rather than in both: max, exp, sum, division."""
  x = T(8, 4, 32, 64)
  e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
  check(x.softmax(-1), e / e.sum(-1, keepdims=True), 4)


def test_broadcast_add():
  a, b = T(3, 4), T(4)
  check(a + b.reshape(1, 4), a.numpy() + b.numpy(), 1)


def test_permuted_sum():
  a, b = T(3, 4), T(4, 3)
  check((a.permute(1, 0) + b).sum(0), (a.numpy().T + b.numpy()).sum(0), 1)


def test_movement_chain():
  a = T(5, 6)
  t = a.pad(((1, 2), (0, 3))).flip(0).shrink(((1, 7), (2, 8))) * 3
  ref = np.pad(a.numpy(), ((1, 2), (0, 3)))[::-1][1:7, 2:8] * 3
  check(t, ref, 1)


def test_cat_is_one_kernel():
  a, b = T(2, 3), T(4, 3)
  check(a.cat(b, dim=0) + 1, np.concatenate([a.numpy(), b.numpy()]) + 1, 1)


def test_cat_of_long_reductions_stores_them():
  # the gradient of q, k, v = qkv.chunk(3): cat(dq, dk, dv). Fused, each product's loop would run for every
  # element of the cat, its loads masked off in the other two thirds: each gets a kernel, the cat is a copy
  x, a, b = T(6, 64), T(64, 5), T(64, 7)
  check((x @ a).cat(x @ b, dim=1), np.concatenate([x.numpy() @ a.numpy(), x.numpy() @ b.numpy()], 1), 3)
  # short reductions (a few terms per element) stay fused
  y, c, d = T(6, 8), T(8, 5), T(8, 7)
  check((y @ c).cat(y @ d, dim=1), np.concatenate([y.numpy() @ c.numpy(), y.numpy() @ d.numpy()], 1), 1)


def test_mean_one_kernel():
  a = T(10, 3)
  check(a.mean(), a.numpy().mean(), 1)


def test_nested_reduce_one_kernel():
  a = T(4, 5, 6)
  check(a.sum(2).sum(0), a.numpy().sum(2).sum(0), 1)


def test_broadcast_reduce_materializes():
  a = T(4, 5)
  check(a - a.max(1, keepdim=True), a.numpy() - a.numpy().max(1, keepdims=True), 2)


def test_layernorm_at_most_3():
  a = T(6, 8)
  x = a.numpy()
  ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  check(a.layernorm(), ref, 3, exact=False)


def test_where_fuses():
  a, b = T(3, 3), T(3, 3)
  check((a > 0).where(a, b * 2), np.where(a.numpy() > 0, a.numpy(), b.numpy() * 2), 1)


def test_strided_slices_fuse():
  a = T(8, 9)
  check(a[::2, 1::3] + a[1::2, ::3], a.numpy()[::2, 1::3] + a.numpy()[1::2, ::3], 1)


def test_two_outputs_share_nothing():
  a = T(4)
  x, y = a + 1, a * 2
  items = x.schedule(y)
  assert sum(1 for i in items if i.program is not None) == 2
  x.realize(y)
  np.testing.assert_allclose(x.numpy(), a.numpy() + 1)
  np.testing.assert_allclose(y.numpy(), a.numpy() * 2)


def test_realized_input_no_kernel():
  a = T(4, 4).realize()
  assert kernels(a) == 0
  assert kernels(a.reshape(16)) == 0


def test_conv2d_kernel_count():
  x, w = T(1, 2, 6, 6), T(3, 2, 3, 3)
  out = x.conv2d(w)
  assert kernels(out) <= 2
  xn, wn = x.numpy(), w.numpy()
  ref = np.zeros((1, 3, 4, 4), np.float32)
  for o in range(3):
    for i in range(4):
      for j in range(4):
        ref[0, o, i, j] = (xn[0, :, i:i + 3, j:j + 3] * wn[o]).sum()
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_fused_chain_of_200_terms():
  """The benchmark's fused expression with 200 terms (each nested in the next: exp/sin/log/sqrt over 4 inputs) is
  one kernel and gives numpy's values."""
  from baregrad.tools.bench import fused_chain
  xs = [rng.random(64, dtype=np.float32) + 0.5 for _ in range(4)]
  ts = [Tensor(a) for a in xs]
  out = fused_chain(ts[0], ts, 200, Tensor.exp, Tensor.sin, Tensor.log, Tensor.sqrt)
  check(out, fused_chain(xs[0], xs, 200, np.exp, np.sin, np.log, np.sqrt), 1)


def test_fused_sum_of_200_terms():
  """200 different independent terms (transcendentals, a select, a cast round trip) summed: one kernel, numpy's
  values."""
  xs = [rng.random(64, dtype=np.float32) + 0.5 for _ in range(4)]
  ts = [Tensor(a) for a in xs]

  def term(i, a, lib):
    a = a * (1 + 0.01 * i)
    kind = i % 6
    if kind == 0: return lib.sin(a)
    if kind == 1: return lib.exp(a)
    if kind == 2: return lib.log(a)
    if kind == 3: return lib.sqrt(a)
    if kind == 4: return lib.where(a > 0.7, a, -a)
    return lib.int_round_trip(a * 3)

  class TensorLib:
    sin, exp, log, sqrt = Tensor.sin, Tensor.exp, Tensor.log, Tensor.sqrt
    where = staticmethod(lambda c, a, b: c.where(a, b))
    int_round_trip = staticmethod(lambda a: a.cast(dtypes.int32).cast(dtypes.float32))

  class NumpyLib:
    sin, exp, log, sqrt, where = np.sin, np.exp, np.log, np.sqrt, np.where
    int_round_trip = staticmethod(lambda a: a.astype(np.int32).astype(np.float32))

  out = sum(term(i, ts[i % 4], TensorLib) for i in range(200))
  ref = sum(term(i, xs[i % 4], NumpyLib) for i in range(200))
  check(out, ref, 1)


def test_codegen_walks_grow_linearly(monkeypatch):
  """Rangeify, lowering, rendering and the flop estimate of a fused chain of N terms walk O(N) nodes, counted through
  UOp.toposort (the walk every pass starts from): doubling N about doubles them. A pass that walks the graph below
  every node, as the flop estimate once did, makes that a factor of 4."""
  from baregrad.compiler import codegen
  from baregrad.compiler.uop import UOp
  from baregrad.compiler.rangeify import rangeify
  from baregrad.compiler.schedule import normalize
  from baregrad.compiler.render_c import CRenderer
  from baregrad.tools.bench import fused_chain
  visited = [0]
  toposort = UOp.toposort

  def counting_toposort(self):
    order = toposort(self)
    visited[0] += len(order)
    return order

  def walks(terms: int) -> int:
    ts = [Tensor(rng.random(16, dtype=np.float32) + 0.5) for _ in range(4)]
    sink, _, _ = normalize(fused_chain(ts[0], ts, terms, Tensor.exp, Tensor.sin, Tensor.log, Tensor.sqrt).uop.sink())
    visited[0] = 0
    (spec,) = rangeify(sink, lambda n: n.device).items
    renderer = CRenderer()
    low = codegen.lower(spec, renderer)
    renderer.render("k", low.program, low.alias, len(spec.params), low.variables)
    codegen.estimate(low.ast, spec.params)
    return visited[0]

  monkeypatch.setattr(UOp, "toposort", counting_toposort)
  from baregrad.compiler.deepstack import on_deep_stack
  small, big = on_deep_stack(walks, 40), on_deep_stack(walks, 80)   # the passes recurse deeply, as in codegen
  assert small > 40 * 20, f"only {small} nodes walked: the count misses the passes"
  assert big < 2.5 * small, f"{small} nodes walked for 40 terms, {big} for 80: a pass grows faster than linearly"


def test_costly_operand_of_a_product_is_stored_once():
  """silu(g) @ W.T with one row of g: fused into the product, silu would run once per output row (768 times per
  element); it is stored first (one kernel) and the product reads it. Elementwise consumers of costly values stay
  fused (softmax is one kernel after its reductions). Values against numpy."""
  r = np.random.default_rng(5)
  g, w = r.standard_normal((1, 256)).astype(np.float32), r.standard_normal((96, 256)).astype(np.float32)
  out = Tensor(g).silu() @ Tensor(w).T
  items = out.schedule()
  assert [i.bufs[0].size for i in items] == [256, 96], [(i.name, i.bufs[0].size) for i in items]
  np.testing.assert_allclose(out.numpy(), (g / (1 + np.exp(-g))) @ w.T, rtol=1e-5, atol=1e-5)
  x = r.standard_normal((8, 32)).astype(np.float32)
  sm = Tensor(x).softmax(-1)
  assert len(sm.schedule()) == 3, [i.name for i in sm.schedule()]     # max, sum, the normalized values


def test_contiguous_of_contiguous_is_one_kernel():
  # a second contiguous() is the same value, not a copy kernel (numpy reference for the values)
  a, w = T(32, 16), T(16, 8)
  check((a + 1).contiguous().contiguous(), a.numpy() + 1, 1)
  check((a @ w).contiguous().contiguous(), a.numpy() @ w.numpy(), 1)
