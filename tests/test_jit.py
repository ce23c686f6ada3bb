"""JIT: captured and replayed functions give the un-jitted results, without rescheduling or recompiling."""
import functools
import numpy as np
import pytest
from baregrad.tensor import Tensor, dtypes
from baregrad.tensor.jit import jit, JitError
from baregrad.tensor.tensor import Variable
from baregrad.compiler import schedule, codegen

rng = np.random.default_rng(1)
WEIGHTS = {name: rng.standard_normal(shape).astype(np.float32)
           for name, shape in (("W1", (8, 16)), ("B1", (16,)), ("W2", (16, 4)), ("CW", (4, 3, 3, 3)))}


@functools.cache
def weight(name: str) -> Tensor:
  """WEIGHTS[name] on the default device, made at first use: not at import (collecting opens no device), so a test
  that closes the default device before this module runs (tests/metal/test_metal_leaks.py under DEV=METAL) leaves
  these tensors alone."""
  return Tensor(WEIGHTS[name])


N = Variable("n", 0, 1000)

# (name, function, input shapes, extra args)
FUNCS = [
  ("add", lambda x, y: x + y, [(4, 5), (4, 5)]),
  ("mul_broadcast", lambda x, y: x * y, [(4, 5), (5,)]),
  ("chain", lambda x: ((x * 2 + 1).exp2() - 3).relu(), [(7,)]),
  ("sum_axis", lambda x: x.sum(axis=1), [(6, 5)]),
  ("max_keepdim", lambda x: x - x.max(axis=0, keepdim=True), [(6, 5)]),
  ("softmax", lambda x: x.softmax(-1), [(3, 8)]),
  ("log_softmax", lambda x: x.log_softmax(-1), [(3, 8)]),
  ("matmul", lambda x, y: x @ y, [(5, 6), (6, 7)]),
  ("mlp", lambda x: (x @ weight("W1") + weight("B1")).relu() @ weight("W2"), [(3, 8)]),
  ("mlp_softmax", lambda x: ((x @ weight("W1") + weight("B1")).relu() @ weight("W2")).softmax(), [(3, 8)]),
  ("conv_block", lambda x: x.conv2d(weight("CW"), padding=1).relu().max_pool2d(2), [(2, 3, 6, 6)]),
  ("layernorm", lambda x: x.layernorm(), [(4, 9)]),
  ("transpose_add", lambda x: x.permute(1, 0) + 1, [(3, 4)]),
  ("slices", lambda x: x[::2, 1:] * x[1::2, :-1], [(6, 5)]),
  ("flip_pad", lambda x: x.flip(0).pad(((1, 1), (0, 2))), [(3, 3)]),
  ("two_outputs", lambda x: (x + 1, x * 2), [(5,)]),
  ("three_outputs_list", lambda x, y: [x + y, x - y, (x * y).sum()], [(4,), (4,)]),
  ("cat", lambda x, y: x.cat(y, dim=0).sqrt(), [(2, 3), (3, 3)]),
  ("where", lambda x: (x > 0).where(x, x * 0.1), [(10,)]),
  ("mean_var", lambda x: (x.mean(0), x.var(0)), [(8, 3)]),
  ("cumsum", lambda x: x.cumsum(0), [(6,)]),
  ("int_ops", lambda x: (x.cast(dtypes.int32) * 3) // 2, [(6,)]),
]


@pytest.mark.parametrize("name,fn,shapes", FUNCS, ids=[f[0] for f in FUNCS])
def test_jit_matches_eager(name, fn, shapes):
  jfn = jit(fn)
  kept = []
  for call in range(5):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = jfn(*[Tensor(a) for a in arrays])
    want = fn(*[Tensor(a) for a in arrays])
    kept.append((got, want))
  for got, want in kept:   # outputs of earlier calls stay intact
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got, want):
      assert g.shape == w.shape and g.dtype == w.dtype
      np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


def test_replay_does_not_schedule_or_compile():
  jfn = jit(lambda x: (x @ weight("W1") + weight("B1")).relu().sum(1))
  for _ in range(2): jfn(Tensor(rng.standard_normal((3, 8)).astype(np.float32)))
  before = (dict(schedule.stats), dict(codegen.stats))
  for _ in range(5):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    out = jfn(Tensor(x))
    np.testing.assert_allclose(out.numpy(), np.maximum(x @ WEIGHTS["W1"] + WEIGHTS["B1"], 0).sum(1), rtol=1e-5)
  assert (dict(schedule.stats), dict(codegen.stats)) == before


def test_variable_flows_into_replay():
  jfn = jit(lambda x, n: x * 2 + n)
  for i in range(6):
    out = jfn(Tensor([1.0, 2.0, 3.0]), N.bind(i * 10))
    np.testing.assert_allclose(out.numpy(), np.array([1.0, 2.0, 3.0]) * 2 + i * 10)


def test_variable_no_recompile_eager():
  x = Tensor([1.0, 2.0])
  (x + N.bind(1)).realize()
  before = dict(codegen.stats)
  for i in range(5): np.testing.assert_allclose((x + N.bind(i)).numpy(), [1.0 + i, 2.0 + i])
  assert codegen.stats == before


def test_variable_out_of_range():
  with pytest.raises(ValueError, match="outside its range"): N.bind(5000)


def test_assign_inside_jit_updates_weights():
  w = Tensor(np.zeros(4, np.float32)).realize()
  def step(g):
    w.assign(w - g * 0.5)
    return w + 0
  jstep = jit(step)
  total = np.zeros(4, np.float32)
  for i in range(5):
    g = rng.standard_normal(4).astype(np.float32)
    total -= g * 0.5
    np.testing.assert_allclose(jstep(Tensor(g)).numpy(), total, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(w.numpy(), total, rtol=1e-6, atol=1e-6)


def test_arena_smaller_than_intermediates():
  """An MLP forward + hand-written backward: the planned arena is >= 40% smaller than its intermediates."""
  ws = [Tensor((rng.standard_normal((32, 32)) * 0.1).astype(np.float32)) for _ in range(6)]
  def fwd_bwd(x, y):
    acts = [x]
    for w in ws: acts.append((acts[-1] @ w).relu().contiguous())
    grad = (acts[-1] - y).contiguous()
    grads = []
    for w, a_in, a_out in zip(reversed(ws), reversed(acts[:-1]), reversed(acts[1:])):
      grad = (grad * (a_out > 0)).contiguous()
      grads.append((a_in.T @ grad).contiguous())
      grad = (grad @ w.T).contiguous()
    return grads
  jfn = jit(fwd_bwd)
  for _ in range(3):
    x, y = (rng.standard_normal((64, 32)).astype(np.float32) for _ in range(2))
    got = jfn(Tensor(x), Tensor(y))
  want = fwd_bwd(Tensor(x), Tensor(y))
  for g, w in zip(got, want): np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-4)
  graph = jfn.graph
  assert graph.unplanned_bytes > 0
  assert graph.arena_bytes <= 0.6 * graph.unplanned_bytes, (graph.arena_bytes, graph.unplanned_bytes)


def test_returned_contiguous_is_not_copied_again():
  # the jit makes a returned lazy tensor contiguous; one that already is (x.contiguous()) gets no copy kernel
  jfn = jit(lambda a, b: (a @ b).contiguous())
  for _ in range(3):
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 4)))
    got = jfn(Tensor(a), Tensor(b))
  np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5, atol=1e-5)
  assert sum(1 for it in jfn.graph.items if it.program is not None) == 1, [it.name for it in jfn.graph.items]


def test_shape_change_raises():
  jfn = jit(lambda x: x + 1)
  for _ in range(3): jfn(Tensor(np.ones((2, 3), np.float32)))
  with pytest.raises(JitError, match=r"shape \(3, 3\).*\(2, 3\)"): jfn(Tensor(np.ones((3, 3), np.float32)))


def test_dtype_change_raises():
  jfn = jit(lambda x: x + 1)
  for _ in range(3): jfn(Tensor(np.ones(3, np.float32)))
  with pytest.raises(JitError, match="dtype"): jfn(Tensor(np.ones(3, np.int32)))


def test_argument_count_raises():
  jfn = jit(lambda x, y=None: x + 1 if y is None else x + y)
  for _ in range(3): jfn(Tensor(np.ones(3, np.float32)))
  with pytest.raises(JitError, match="arguments"): jfn(Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32)))


def test_non_tensor_argument_change_raises():
  jfn = jit(lambda x, k: x * k)
  for _ in range(3): jfn(Tensor(np.ones(3, np.float32)), 2)
  with pytest.raises(JitError, match="changed"): jfn(Tensor(np.ones(3, np.float32)), 3)


def test_reset_recaptures():
  jfn = jit(lambda x: x + 1)
  for _ in range(3): jfn(Tensor(np.ones(2, np.float32)))
  jfn.reset()
  for _ in range(3): out = jfn(Tensor(np.ones(4, np.float32)))
  np.testing.assert_allclose(out.numpy(), np.full(4, 2.0))


def test_outputs_are_freed_when_dropped():
  """A replay's output goes as soon as its last reference does, without the cyclic collector (the structure it is
  returned in was rebuilt by a closure calling itself, a cycle that held it): the next replay reuses its memory."""
  import gc, weakref
  jfn = jit(lambda x: (x * 2 + 1).sum())
  x = Tensor(np.arange(64, dtype=np.float32))
  for _ in range(3): jfn(x).realize()
  enabled = gc.isenabled()
  gc.disable()
  try:
    out = jfn(x)
    assert out.item() == float((np.arange(64) * 2 + 1).sum())
    ref = weakref.ref(out)
    del out
    assert ref() is None
  finally:
    if enabled: gc.enable()


def test_packed_weight_updated_in_place_between_replays():
  """A jitted product large enough that the CPU packs its right operand into strips, traced with the same weight
  Tensor every call: after the weight is assigned new values the replays compute with them (the strips are copied
  again each replay, never taken from an earlier realize)."""
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
  X, W = Tensor(x).realize(), Tensor(w).realize()
  step = jit(lambda a, b: (a @ b).contiguous())
  for _ in range(3): np.testing.assert_allclose(step(X, W).numpy(), x @ w, rtol=1e-4, atol=1e-3)
  for _ in range(2):
    w = rng.standard_normal((256, 256), dtype=np.float32)
    W.assign(Tensor(w)).realize()
    np.testing.assert_allclose(step(X, W).numpy(), x @ w, rtol=1e-4, atol=1e-3)


def test_replay_with_the_same_arguments_sees_pending_writes():
  """Replays with the very argument Tensors of the last one skip checking them again; a write still pending (an
  assign not realized) to a weight the function reads, or to an argument, runs before the replay all the same."""
  w = Tensor(np.ones(8, np.float32)).realize()
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  step = jit(lambda a: (a * w).contiguous())
  for _ in range(4): np.testing.assert_array_equal(step(x).numpy(), np.arange(8))
  w.assign(Tensor(np.full(8, 2.0, np.float32)))                   # pending: realized by the next realize
  np.testing.assert_array_equal(step(x).numpy(), np.arange(8) * 2.0)
  x.assign(Tensor(np.full(8, 3.0, np.float32)))                   # the argument itself
  np.testing.assert_array_equal(step(x).numpy(), np.full(8, 6.0))
  x.assign(Tensor(np.full(8, 4.0, np.float32))).realize()         # written in place, the same node
  np.testing.assert_array_equal(step(x).numpy(), np.full(8, 8.0))
  with pytest.raises(JitError, match="shape"): step(Tensor(np.ones(4, np.float32)))


@pytest.mark.parametrize("name", ["contiguous", "reduce_broadcast"])
def test_capture_computes_what_an_earlier_call_left_in_a_buffer(name):
  """Called with the same input Tensor each time, the traced function's intermediates (a contiguous(), a reduction
  read through a broadcast) are identical graph nodes whose values an earlier call materialized: the captured graph
  computes them again instead of reading that buffer, so replays follow new inputs and in-place writes."""
  fn, ref = {"contiguous": (lambda t: ((t * 2).contiguous() + 1).contiguous(), lambda v: v * 2 + 1),
             "reduce_broadcast": (lambda t: (t.sum(0, keepdim=True) + t).contiguous(), lambda v: v.sum(0, keepdims=True) + v)}[name]
  rng = np.random.default_rng(3)
  a = rng.standard_normal((16, 16), dtype=np.float32)
  A = Tensor(a).realize()
  f = jit(fn)
  for _ in range(3): np.testing.assert_allclose(f(A).numpy(), ref(a), rtol=1e-5, atol=1e-5)
  b = rng.standard_normal((16, 16), dtype=np.float32)
  A.assign(Tensor(b)).realize()
  np.testing.assert_allclose(f(A).numpy(), ref(b), rtol=1e-5, atol=1e-5)
  c = rng.standard_normal((16, 16), dtype=np.float32)
  np.testing.assert_allclose(f(Tensor(c)).numpy(), ref(c), rtol=1e-5, atol=1e-5)
