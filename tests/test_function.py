"""@function (tensor/function.py): traced once per structure, reused with new inputs (same kernels), tuples of outputs,
nested use, gradients through it -- all against numpy."""
import numpy as np
import pytest

from baregrad.compiler import schedule
from baregrad.tensor import Tensor
from baregrad.tensor.function import function, FunctionError
from baregrad.tensor.jit import jit


def rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_traced_once_and_reused_with_new_inputs():
  calls = []

  @function
  def layer(x, w, scale=2.0):
    calls.append(1)
    return (x @ w).relu() * scale
  for i in range(4):
    a, b = rand(6, 3, seed=i), rand(3, 5, seed=10 + i)
    built = schedule.stats["schedules_built"]
    y = layer(Tensor(a), Tensor(b))
    np.testing.assert_allclose(y.numpy(), np.maximum(a @ b, 0) * 2, rtol=1e-5, atol=1e-6)
    if i: assert schedule.stats["schedules_built"] == built      # same structure: the cached kernels
  assert len(calls) == layer.trace_count == 1
  np.testing.assert_allclose(layer(Tensor(a), Tensor(b), scale=3.0).numpy(), np.maximum(a @ b, 0) * 3, rtol=1e-5)
  y = layer(Tensor(rand(2, 3)), Tensor(b))                      # a new shape, or a new value of an argument: a new trace
  assert y.shape == (2, 5) and len(calls) == layer.trace_count == 3


def test_tuple_outputs_and_nesting():
  @function
  def stats(x): return x.sum(axis=0), (x.max(axis=1), x * x)

  @function
  def outer(x, y):
    s, (m, sq) = stats(x + y)
    return [s * 2, m, sq.mean()]
  for i in range(2):
    a, b = rand(4, 5, seed=i), rand(4, 5, seed=5 + i)
    s, (m, sq) = stats(Tensor(a))
    np.testing.assert_allclose(s.numpy(), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(m.numpy(), a.max(1))
    np.testing.assert_allclose(sq.numpy(), a * a, rtol=1e-6)
    out = outer(Tensor(a), Tensor(b))
    assert isinstance(out, list) and len(out) == 3
    np.testing.assert_allclose(out[0].numpy(), (a + b).sum(0) * 2, rtol=1e-5)
    np.testing.assert_allclose(out[1].numpy(), (a + b).max(1))
    np.testing.assert_allclose(out[2].numpy(), ((a + b) ** 2).mean(), rtol=1e-5)
  assert stats.trace_count == 1 and outer.trace_count == 1       # inside outer, stats reuses its trace too


def test_gradients_through_a_function():
  @function
  def mlp(x, w1, w2): return ((x @ w1).relu() @ w2).tanh()
  a, b1, b2 = rand(8, 4), rand(4, 6, seed=1), rand(6, 3, seed=2)
  for _ in range(2):
    x, w1, w2 = (Tensor(v, requires_grad=True) for v in (a, b1, b2))
    loss = mlp(x, w1, w2).square().sum()
    loss.backward()
    h = a @ b1
    r = np.maximum(h, 0)
    y = np.tanh(r @ b2)
    dy = 2 * y * (1 - y * y)
    dr = dy @ b2.T * (h > 0)
    np.testing.assert_allclose(w2.grad.numpy(), r.T @ dy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w1.grad.numpy(), a.T @ dr, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), dr @ b1.T, rtol=1e-4, atol=1e-5)
  assert mlp.trace_count == 1


def test_inside_jit_and_on_several_devices():
  devs = ("CPU", "CPU:1")

  @function
  def f(x, w): return (x @ w).sum(axis=0)
  w = Tensor(rand(5, 2)).to(devs).realize()

  @jit
  def step(x): return f(x, w) + 1
  for i in range(4):
    a = rand(7, 5, seed=i)
    np.testing.assert_allclose(step(Tensor(a).shard(devs, axis=0)).numpy(), (a @ w.numpy()).sum(0) + 1, rtol=1e-4)
  assert f.trace_count == 1


def test_a_body_that_reads_values_is_refused():
  @function
  def bad(x): return x * float(x.sum().item())
  with pytest.raises(FunctionError, match="cannot be traced"): bad(Tensor(rand(3)))
  with pytest.raises(FunctionError, match="must return Tensors"): function(lambda x: 3)(Tensor(rand(3)))
