"""PyTorch/tinygrad conventions of the autograd API: Tensor.gradient, backward without a dependency, gradients at
ties and edges (checked against numpy's values and the derivative each convention defines), and the exception
classes torch raises for shape mistakes.

The values are float64 where the device has it and float32 where it has none (METAL): `wide`."""
import math
import numpy as np
import pytest

from baregrad.tensor import Tensor, ShapeError, DimError
from helpers_ops import as_widest, has_float64


def wide(v, grad=True):
  return Tensor(as_widest(v), requires_grad=grad)


def grads(fn, *values):
  ts = [wide(v) for v in values]
  out = fn(*ts)
  out.sum().backward()
  return out.numpy(), [t.grad.numpy() for t in ts]


# ---------------------------------------------------------------- gradient() and backward()

def test_gradient_returns_a_list_and_writes_no_grad():
  x, w = Tensor([1.0, 2.0, 3.0]), Tensor([0.5, -1.0, 2.0])
  gx, gw = (x * w).sum().gradient(x, w)
  np.testing.assert_array_equal(gx.numpy(), [0.5, -1.0, 2.0])
  np.testing.assert_array_equal(gw.numpy(), [1.0, 2.0, 3.0])
  assert x.grad is None and w.grad is None
  (g,) = (x * x).gradient(x, gradient=Tensor([1.0, 0.0, 2.0]))
  np.testing.assert_array_equal(g.numpy(), [2.0, 0.0, 12.0])


def test_gradient_of_an_unrelated_target():
  x, z = Tensor([1.0, 2.0]), Tensor([7.0])
  with pytest.raises(RuntimeError, match="not part of this tensor's graph"):
    (x * 2).sum().gradient(z)
  (gz,) = (x * 2).sum().gradient(z, materialize_grads=True)
  np.testing.assert_array_equal(gz.numpy(), [0.0])
  with pytest.raises(TypeError, match="Tensors"):
    (x * 2).sum().gradient(np.ones(2))


def test_gradient_matches_backward_for_a_chain():
  r = np.random.default_rng(0)
  a, b = r.standard_normal((3, 4)), r.standard_normal((4, 2))
  A, B = wide(a), wide(b)
  loss = ((A @ B).tanh() * 3).sum()
  ga, gb = loss.gradient(A, B)
  loss.backward()
  np.testing.assert_allclose(ga.numpy(), A.grad.numpy())
  np.testing.assert_allclose(gb.numpy(), B.grad.numpy())


def test_backward_without_a_dependency_is_a_no_op():
  used, unused = wide([1.0, 2.0]), wide([3.0])
  (used * 2).sum().backward()
  np.testing.assert_array_equal(used.grad.numpy(), [2.0, 2.0])
  assert unused.grad is None                          # torch: a leaf the loss does not use keeps grad None
  plain = wide([1.0], grad=False)
  (plain * 2).sum().backward()                        # no leaf at all: nothing happens, no exception
  assert plain.grad is None


def test_a_leaf_reached_only_through_comparisons_gets_zeros():
  x = wide([1.0, -2.0])
  (x > 0).where(1.0, 2.0).sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


# ---------------------------------------------------------------- conventions at ties and edges

def test_abs_at_zero():
  v, (g,) = grads(lambda x: x.abs(), [0.0, -0.0, -2.0, 3.0])
  np.testing.assert_array_equal(v, [0.0, 0.0, 2.0, 3.0])
  assert not np.signbit(v[1])                         # abs(-0.0) is +0.0
  np.testing.assert_array_equal(g, [0.0, 0.0, -1.0, 1.0])
  assert np.isnan(Tensor([np.nan]).abs().numpy()[0])


def test_clip_passes_the_gradient_at_the_bounds():
  v, (g,) = grads(lambda x: x.clip(-1.0, 1.0), [-1.0, 1.0, 0.5, -3.0, 3.0, np.nan])
  np.testing.assert_array_equal(v, np.clip([-1.0, 1.0, 0.5, -3.0, 3.0, np.nan], -1.0, 1.0))
  np.testing.assert_array_equal(g, [1.0, 1.0, 1.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_ties_split_the_gradient(op):
  v, (ga, gb) = grads(lambda a, b: getattr(a, op)(b), [1.0, 2.0, -0.0], [1.0, 3.0, 0.0])
  np.testing.assert_array_equal(v, getattr(np, op)([1.0, 2.0, -0.0], [1.0, 3.0, 0.0]))
  first = [0.5, 0.0 if op == "maximum" else 1.0, 0.5]
  np.testing.assert_array_equal(ga, first)
  np.testing.assert_array_equal(gb, 1 - np.array(first))


def test_minimum_follows_numpy_with_nan_and_signed_zeros():
  a, b = as_widest([0.0, -0.0, np.nan, 1.0, 2.0]), as_widest([-0.0, 0.0, 1.0, np.nan, -5.0])
  got = Tensor(a).minimum(Tensor(b)).numpy()
  np.testing.assert_array_equal(got, np.minimum(a, b))
  np.testing.assert_array_equal(np.signbit(got), np.signbit(np.minimum(a, b)))


@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
def test_sigmoid_tanh_at_extreme_inputs(op):
  xs = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0])
  v, (g,) = grads(lambda x: getattr(x, op)(), xs)
  with np.errstate(over="ignore"): ref = 1 / (1 + np.exp(-xs)) if op == "sigmoid" else np.tanh(xs)
  tol = dict(rtol=1e-12, atol=1e-300) if has_float64() else dict(rtol=1e-5, atol=1e-44)
  np.testing.assert_allclose(v, ref, **tol)
  z = np.exp(-np.abs(xs) * (1 if op == "sigmoid" else 2))     # the derivatives written without cancellation
  dref = z / (1 + z) ** 2 if op == "sigmoid" else 4 * z / (1 + z) ** 2
  assert np.isfinite(g).all()
  np.testing.assert_allclose(g, dref, **(dict(rtol=1e-9, atol=1e-300) if has_float64() else tol))


def test_pow_zero_exponent_and_zero_base_have_finite_gradients():
  f64 = has_float64()
  _, (g,) = grads(lambda x: x ** 0, [0.0, 2.0, -3.0])
  np.testing.assert_array_equal(g, [0.0, 0.0, 0.0])
  v, (gx, ge) = grads(lambda x, e: x ** e, [0.0, 0.0, 0.0, 2.0, 3.0], [0.0, 2.5, 1.0, 0.0, 2.0])
  want = np.power([0.0, 0.0, 0.0, 2.0, 3.0], [0.0, 2.5, 1.0, 0.0, 2.0])
  np.testing.assert_allclose(v, want, rtol=1e-15 if f64 else 1e-6)
  tol = dict(rtol=1e-7 if f64 else 1e-6)                                          # (assert_allclose's default rtol)
  np.testing.assert_allclose(gx, [0.0, 0.0, 1.0, 0.0, 6.0], **tol)                # e * x ** (e - 1), 0 at x = 0
  np.testing.assert_allclose(ge, [0.0, 0.0, 0.0, np.log(2.0), 9 * np.log(3.0)], **tol)   # x ** e * ln x, 0 at x = 0
  _, (g,) = grads(lambda x: x ** 2.5, [0.0, 4.0])
  np.testing.assert_allclose(g, [0.0, 2.5 * 4.0 ** 1.5], **tol)


def test_pow_of_infinities_and_nan_like_numpy():
  x = as_widest([-np.inf, -np.inf, -np.inf, np.inf, np.nan, -2.0, -0.0, 0.0])
  e = as_widest([0.3, 3.0, -1.0, 0.0, 0.0, 0.5, 1.0, -1.0])
  with np.errstate(all="ignore"): want = np.power(x, e)
  got = (Tensor(x) ** Tensor(e)).numpy()
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.signbit(got[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))
  assert (Tensor([-np.inf]) ** 0.3).numpy()[0] == np.inf


def test_prod_with_zeros_has_the_product_of_the_others_as_gradient():
  for xs in ([0.0, 2.0, 3.0], [0.0, 2.0, 0.0], [1.0, 2.0, 3.0], [4.0, 0.0, -1.0]):
    _, (g,) = grads(lambda x: x.prod(), xs)
    want = [np.prod(np.delete(xs, i)) for i in range(len(xs))]
    np.testing.assert_array_equal(g, want)
  x = wide([[0.0, 2.0], [3.0, 4.0]])
  x.prod(axis=1).sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), [[2.0, 0.0], [4.0, 3.0]])


def test_erf_softplus_keep_their_derivative_at_zero():
  _, (g,) = grads(lambda x: x.erf(), [0.0])
  np.testing.assert_allclose(g, [2 / np.sqrt(np.pi)], rtol=1e-5)
  _, (g,) = grads(lambda x: x.softplus(), [0.0])
  np.testing.assert_allclose(g, [0.5])


def test_erf_and_gelu_gradients_are_the_exact_derivatives():
  """erf's gradient is 2/sqrt(pi) exp(-x^2) (torch's), not the derivative of the rational approximation the value is
  computed with; GELU's follows: Phi(x) + x phi(x). Float64 inputs against the closed forms, to 1e-12, across the
  range where the approximation's own derivative is off by up to ~1e-6."""
  xs = np.linspace(-6, 6, 241)
  tol = 1e-12 if has_float64() else 1e-6          # (float32 where the device has no float64)
  _, (g,) = grads(lambda x: x.erf(), xs)
  np.testing.assert_allclose(g, 2 / np.sqrt(np.pi) * np.exp(-xs * xs), rtol=tol, atol=1e-30)
  _, (g,) = grads(lambda x: x.gelu(), xs)
  erf = np.vectorize(math.erf)(xs / np.sqrt(2))
  want = 0.5 * (1 + erf) + xs * np.exp(-xs * xs / 2) / np.sqrt(2 * np.pi)
  # (the value's erf is the approximation, |error| < 1.5e-7: Phi's part of the gradient carries it)
  np.testing.assert_allclose(g, want, rtol=tol, atol=2e-7)


# ---------------------------------------------------------------- torch's exception classes

@pytest.mark.parametrize("make, cls", [
  (lambda a, b: a @ b, RuntimeError),
  (lambda a, b: a.permute(0), RuntimeError),
  (lambda a, b: a.permute(0, 0), RuntimeError),
  (lambda a, b: a.permute(0, 5), IndexError),
  (lambda a, b: a.flip(3), IndexError),
  (lambda a, b: Tensor.einsum("ij,jk->ik", a, a), RuntimeError),
  (lambda a, b: a.cat(b), RuntimeError),
  (lambda a, b: a.cat(a, dim=5), IndexError),
  (lambda a, b: a.reshape(4, 2), RuntimeError),
  (lambda a, b: a.expand(3, 3), RuntimeError),
  (lambda a, b: a + b, RuntimeError),
  (lambda a, b: Tensor.stack([a, a], a), TypeError),
  (lambda a, b: Tensor.linspace(0, 1, 5, dtype="bool"), TypeError),
])
def test_shape_mistakes_raise_what_torch_raises(make, cls):
  a, b = Tensor.ones(2, 3), Tensor.ones(4, 5)
  with pytest.raises(cls):
    make(a, b)


def test_shape_errors_are_still_value_errors():
  assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError)
  assert issubclass(DimError, IndexError) and issubclass(DimError, ValueError)
  with pytest.raises(ValueError, match="inner dimensions"):
    Tensor.ones(2, 3) @ Tensor.ones(4, 5)


def test_stack_takes_dim_by_position_after_a_list():
  a, b = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
  np.testing.assert_array_equal(Tensor.stack([a, b], 1).numpy(), np.stack([[1.0, 2.0], [3.0, 4.0]], 1))
  np.testing.assert_array_equal(Tensor.stack(a, b, dim=1).numpy(), np.stack([[1.0, 2.0], [3.0, 4.0]], 1))
