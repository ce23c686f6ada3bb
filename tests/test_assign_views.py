"""Writes through views: assign and setitem on a slice, shrink, reshape, permute or flip of a realized tensor (and on
views of views) write the viewed elements of the buffer under it, so the tensor and every other view of it show
them, as in PyTorch; eager, inside @jit, on emulated GPUs and on several devices. Views that cannot be written are
refused with an error. Every value is checked against numpy doing the same writes."""
import numpy as np
import pytest
from baregrad.hcq import runtime
from baregrad.hcq.device import Device
from baregrad.tensor import Tensor
from baregrad.tensor.jit import jit


def rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_issue_script_writes_the_base():
  c = Tensor.zeros(2, 4).contiguous().realize()
  c.shrink((None, (1, 2))).assign(Tensor(np.array([[1.], [2.]], np.float32))).realize()
  np.testing.assert_array_equal(c.numpy(), [[0, 1, 0, 0], [0, 2, 0, 0]])


VIEWS = {   # name: (the view on a Tensor, the same view on a numpy array)
  "shrink": (lambda t: t.shrink(((1, 3), (2, 5))), lambda a: a[1:3, 2:5]),
  "slice_int": (lambda t: t[2], lambda a: a[2]),
  "slice_neg_int": (lambda t: t[:, -1], lambda a: a[:, -1]),
  "reshape": (lambda t: t.reshape(3, 8), lambda a: a.reshape(3, 8)),
  "reshape_of_shrink_rows": (lambda t: t[1:3].reshape(12), lambda a: a[1:3].reshape(12)),
  "permute": (lambda t: t.permute(1, 0), lambda a: a.transpose(1, 0)),
  "flip": (lambda t: t.flip(1), lambda a: a[:, ::-1]),
  "reversed_slice": (lambda t: t[::-1, 1:4], lambda a: a[::-1, 1:4]),
  "view_of_view": (lambda t: t[1:4][1][2:5], lambda a: a[1:4][1][2:5]),
  "transpose_then_slice": (lambda t: t.T[1:5, 0:2], lambda a: a.T[1:5, 0:2]),
  "unsqueeze": (lambda t: t[1:3, None, 2], lambda a: a[1:3, None, 2]),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
@pytest.mark.parametrize("how", ["assign", "setitem"])
def test_writes_through_a_view(name, how):
  tview, nview = VIEWS[name]
  base = rand(4, 6)
  t = Tensor(base.copy()).realize()
  other_view = t[1:]          # another view of the same buffer, made before the write
  want = base.copy()
  target = nview(want)
  value = rand(*target.shape, seed=1)
  target[...] = value
  if how == "assign": tview(t).assign(Tensor(value)).realize()
  else: tview(t)[...] = Tensor(value)
  np.testing.assert_array_equal(t.numpy(), want)
  np.testing.assert_array_equal(other_view.numpy(), want[1:])
  np.testing.assert_array_equal(tview(t).numpy(), nview(want))


def test_a_kept_view_stays_a_view_after_writes_and_reads():
  t = Tensor(np.zeros((3, 4), np.float32)).realize()
  v = t[:, 1:3]
  v.assign(Tensor(np.ones((3, 2), np.float32))).realize()
  np.testing.assert_array_equal(v.numpy(), np.ones((3, 2)))      # reading it does not turn it into a copy
  v.assign(v * 5 + 1).realize()                                   # reads itself where it writes
  want = np.zeros((3, 4), np.float32)
  want[:, 1:3] = 6
  np.testing.assert_array_equal(t.numpy(), want)
  v[0, 1] = 9.0                                                   # setitem on the view reaches t
  want[0, 2] = 9
  np.testing.assert_array_equal(t.numpy(), want)


def test_an_assign_not_realized_or_kept_still_happens():
  t = Tensor(np.zeros(6, np.float32)).realize()
  t[2:4].assign(Tensor(np.array([7., 8.], np.float32)))          # a statement: nothing holds the view
  y = t * 2                                                       # a graph built after the write reads it
  np.testing.assert_array_equal(y.numpy(), [0, 0, 14, 16, 0, 0])


@pytest.mark.parametrize("src,dst", [((0, 4), (2, 6)), ((2, 6), (0, 4)), ((1, 5), (1, 5))])
def test_value_reading_the_buffer_elsewhere(src, dst):
  """c[dst] = c[src] on overlapping ranges reads every element before any is written (numpy's copy semantics)."""
  a = np.arange(6, dtype=np.float32)
  t = Tensor(a.copy()).realize()
  t[dst[0]:dst[1]].assign(t[src[0]:src[1]] * 10).realize()
  want = a.copy()
  want[dst[0]:dst[1]] = a[src[0]:src[1]] * 10
  np.testing.assert_array_equal(t.numpy(), want)
  t2 = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
  t2.T.assign(t2.reshape(4, 3)).realize()                         # a transpose written from a reshape of itself
  np.testing.assert_array_equal(t2.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3).T)


def test_value_reading_the_buffer_through_an_assign_that_ran():
  """The value of a write reads the same buffer elsewhere through an assign that already ran (its graph node, held
  by a lazy result built before it ran: read from its view, c[0:4], not walked into): read whole before any element
  is written, as numpy copies."""
  a = np.arange(8, dtype=np.float32)
  t = Tensor(a.copy()).realize()
  head = t[0:4]
  head.assign(Tensor(np.array([10., 20., 30., 40.], np.float32)))
  later = head * 1.0 + 1.0       # built on the assign's node, before it runs
  head.realize()
  t[2:6].assign(later).realize()   # reads t[0:4] (2 elements behind) while writing t[2:6]
  want = a.copy()
  want[0:4] = [10., 20., 30., 40.]
  want[2:6] = want[0:4] + 1.0
  np.testing.assert_array_equal(t.numpy(), want)


def test_setitem_stepped_and_tensor_indexes_still_write_the_tensor():
  a = rand(5, 6)
  t = Tensor(a.copy()).realize()
  t[::2, 1::3] = 0.5
  a[::2, 1::3] = 0.5
  t[1][[0, 5]] = Tensor(np.array([3., 4.], np.float32))           # advanced index on a view of row 1
  a[1][[0, 5]] = [3., 4.]
  np.testing.assert_array_equal(t.numpy(), a)


def test_a_lazy_tensor_is_computed_before_setitem():
  z = Tensor.zeros(2, 4)
  z[:, 1:2] = Tensor(np.array([[1.], [2.]], np.float32))
  np.testing.assert_array_equal(z.numpy(), [[0, 1, 0, 0], [0, 2, 0, 0]])
  y = Tensor(np.ones(4, np.float32)) * 3
  y[1:3] = 0
  np.testing.assert_array_equal(y.numpy(), [3, 0, 0, 3])


def test_views_that_cannot_be_written_are_refused():
  t = Tensor(np.zeros(4, np.float32)).realize()
  with pytest.raises(ValueError, match="broadcast"): t.reshape(4, 1).expand(4, 3).assign(Tensor(np.ones((4, 3), np.float32)))
  with pytest.raises(ValueError, match="padded"): t.pad(((1, 1),)).assign(Tensor(np.ones(6, np.float32)))
  lazy = Tensor(np.ones(4, np.float32)) + 1
  with pytest.raises(ValueError, match="not in memory yet.*realize"): lazy[1:3].assign(Tensor(np.ones(2, np.float32)))
  with pytest.raises(ValueError, match="not in memory yet"): Tensor.zeros(2, 4)[:, 1:2].assign(1.0)
  np.testing.assert_array_equal(t.numpy(), np.zeros(4))           # nothing was written by the refused ones
  np.testing.assert_array_equal(lazy.numpy(), np.full(4, 2.0))


def test_the_write_is_only_the_view():
  """A setitem on a slice runs one kernel over the slice's elements, not the whole tensor."""
  t = Tensor(np.zeros((64, 64), np.float32)).realize()
  runtime.capturing = items = []
  try: t[3, 4:8] = 1.0; t.realize()
  finally: runtime.capturing = None
  assert [i.name for i in items] == ["E_4"]
  assert t.numpy().sum() == 4 and t.numpy()[3, 4:8].tolist() == [1, 1, 1, 1]


def test_assign_into_a_view_inside_jit():
  """A KV-cache-like update: each call writes one row of a persistent buffer and reads the whole buffer."""
  cache = Tensor(np.zeros((4, 3), np.float32)).realize()
  def step(x):
    cache[1:2].assign(x.reshape(1, 3) * 2).realize()
    return cache.sum(0) + 0
  jstep = jit(step)
  want = np.zeros((4, 3), np.float32)
  for i in range(5):
    x = rand(3, seed=i)
    want[1:2] = x.reshape(1, 3) * 2
    np.testing.assert_allclose(jstep(Tensor(x)).numpy(), want.sum(0), rtol=1e-6)
    np.testing.assert_array_equal(cache.numpy(), want)
  assert jstep.graph is not None      # replayed from the captured queues


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_writes_through_views_on_emulated_gpus(emulated_gpus, device):
  a = rand(3, 5)
  t = Tensor(a.copy(), device=device).realize()
  t.T[1:3, 0:2].assign(Tensor(np.ones((2, 2), np.float32), device=device)).realize()
  t[2, ::-1][0:2] = 4.0
  a.T[1:3, 0:2] = 1
  a[2, ::-1][0:2] = 4
  np.testing.assert_array_equal(t.numpy(), a)


def test_writes_through_views_of_a_sharded_tensor():
  devs = ("CPU", "CPU:1")
  a = rand(6, 4)
  t = Tensor(a.copy()).shard(devs, axis=0).realize()
  t[2:5, 1:3].assign(Tensor(np.full((3, 2), 7.0, np.float32)).to(devs)).realize()   # rows on both devices
  a[2:5, 1:3] = 7
  np.testing.assert_array_equal(t.numpy(), a)
  t[:, 0] = Tensor(np.arange(6, dtype=np.float32)).shard(devs, axis=0)
  a[:, 0] = np.arange(6)
  np.testing.assert_array_equal(t.numpy(), a)
  Device.get("CPU:1")


def test_no_recompute_across_realizes():
  """A 12-layer forward that writes a cache per layer (each realized as it is written), then reads the result:
  every matvec runs once. Before, each realize computed every earlier layer again (quadratic in depth)."""
  layers, d = 12, 16
  rng = np.random.default_rng(0)
  w1 = [rng.standard_normal((d, 4 * d)).astype(np.float32) * 0.2 for _ in range(layers)]
  w2 = [rng.standard_normal((4 * d, d)).astype(np.float32) * 0.2 for _ in range(layers)]
  wk = [rng.standard_normal((4 * d, d)).astype(np.float32) * 0.2 for _ in range(layers)]
  table = rng.standard_normal((50, d)).astype(np.float32)
  tw1, tw2, twk = ([Tensor(w).realize() for w in ws] for ws in (w1, w2, wk))
  caches = [Tensor.zeros(4, d).contiguous().realize() for _ in range(layers)]
  ttable = Tensor(table).realize()
  runtime.capturing = items = []
  try:
    x = ttable[Tensor(np.array([7], np.int32))]
    for l in range(layers):
      h = (x @ tw1[l]).relu()
      caches[l][2:3].assign(h @ twk[l]).realize()
      x = x + h @ tw2[l]
    out = x.numpy()
  finally: runtime.capturing = None
  # numpy
  xn = table[[7]]
  for l in range(layers):
    hn = np.maximum(xn @ w1[l], 0)
    np.testing.assert_allclose(caches[l].numpy()[2:3], hn @ wk[l], rtol=1e-4, atol=1e-4)
    xn = xn + hn @ w2[l]
  np.testing.assert_allclose(out, xn, rtol=1e-4, atol=1e-4)
  # three matvecs per layer, the lookup and its index's bounds check (min and max), each once
  assert len(items) == 3 * layers + 3, [i.name for i in items]


def test_no_recompute_across_realizes_of_packed_matmuls():
  """The same with products large enough that the CPU packs their right operand (8 x 128 @ 128 x 1024 and back): the
  packed graph's materialized values (a packed product's reduction too) are recorded under the caller's nodes: each
  product runs once, beside the copies of its weight into strips (made again by each realize that reads them). Before, each layer's realize computed every earlier layer again (a 16-layer prefill: 324 -> 2590 kernels)."""
  rng = np.random.default_rng(1)
  w1 = [rng.standard_normal((128, 1024)).astype(np.float32) * 0.05 for _ in range(6)]
  w2 = [rng.standard_normal((1024, 128)).astype(np.float32) * 0.05 for _ in range(6)]
  x0 = rng.standard_normal((8, 128)).astype(np.float32)
  tw1, tw2 = [Tensor(w).realize() for w in w1], [Tensor(w).realize() for w in w2]
  def launches(layers: int) -> int:
    caches = [Tensor.zeros(8, 16).contiguous().realize() for _ in range(layers)]
    runtime.capturing = items = []
    try:
      x = Tensor(x0)
      for l in range(layers):
        h = (x @ tw1[l]).relu()
        caches[l].assign(h[:, :16]).realize()
        x = x + h @ tw2[l]
      out = x.numpy()
    finally: runtime.capturing = None
    xn = x0
    for l in range(layers):
      hn = np.maximum(xn @ w1[l], 0)
      np.testing.assert_allclose(caches[l].numpy(), hn[:, :16], rtol=1e-4, atol=1e-4)
      xn = xn + hn @ w2[l]
    np.testing.assert_allclose(out, xn, rtol=1e-4, atol=1e-4)
    assert any("1024" in i.name for i in items), [i.name for i in items]
    return len(items)
  two, four, six = launches(2), launches(4), launches(6)
  assert (two, four, six) == (12, 24, 36), (two, four, six)   # per layer: 3 products, the copies of their weights
