"""Autograd: gradients of ops and compositions against central finite differences, all in float64.

For each case, loss = sum(f(inputs) * W) with a fixed random W (so every output element's gradient counts);
backward() gives d loss / d input, and every element of every float input is also perturbed by +-h to get
(loss(x + h) - loss(x - h)) / 2h from the forward pass alone. The forward evaluations run through a jitted copy
of the loss (checked against the eager loss first), so the hundreds of evaluations stay cheap."""
import math
import numpy as np
import pytest
from baregrad.tensor import Tensor, dtypes, nn
from baregrad.tensor.jit import jit
from helpers_ops import as_widest

H = 1e-6
rng = np.random.default_rng(1234)


# ---------------------------------------------------------------- input samplers (float64 numpy arrays)

def normal(*shape): return ("f", lambda: rng.standard_normal(shape))
def pos(*shape, lo=0.5, hi=2.0): return ("f", lambda: rng.uniform(lo, hi, shape))
def away(*shape, gap=0.3):
  """Values at least `gap` from 0 (for kinks at 0: relu, abs, sign, reciprocal)."""
  return ("f", lambda: rng.choice([-1.0, 1.0], shape) * rng.uniform(gap, 1.5, shape))
def unit(*shape, r=0.9): return ("f", lambda: rng.uniform(-r, r, shape))
def distinct(*shape):
  """All values different by at least 0.1 (for max/min/sorting-like ops, so there are no ties)."""
  n = int(np.prod(shape))
  return ("f", lambda: (rng.permutation(n) * 0.25 - n * 0.125 + rng.uniform(-0.05, 0.05, n)).reshape(shape))
def frac(*shape):
  """Values well away from integers (floor/round have zero gradient there)."""
  return ("f", lambda: rng.integers(-3, 3, shape) + rng.uniform(0.2, 0.8, shape))
def ints(values): return ("i", lambda: np.asarray(values, dtype=np.int32))
def const_bool(values): return ("b", lambda: np.asarray(values, dtype=bool))


def _tensors(arrays, grad):
  out = []
  for a in arrays:
    if a.dtype == np.float64: out.append(Tensor(a, dtype=dtypes.float64, requires_grad=grad))
    else: out.append(Tensor(a))
  return out


def gradcheck(fn, specs, rtol=1e-5, atol=1e-6):
  arrays = [make() for _, make in specs]
  out_shape = fn(*_tensors(arrays, False)).shape
  w_np = rng.standard_normal(out_shape)
  W = Tensor(w_np, dtype=dtypes.float64)
  def loss(*ts):
    out = fn(*ts)
    assert out.dtype == dtypes.float64, f"output dtype {out.dtype}"
    return (out * W).sum()
  ts = _tensors(arrays, True)
  eager = loss(*ts)
  eager.backward()
  base = eager.item()
  jloss = jit(loss)
  def value(arrs): return jloss(*_tensors(arrs, False)).item()
  for _ in range(3):   # call 1 runs, call 2 captures, call 3 replays: all must equal the eager loss
    assert value(arrays) == pytest.approx(base, rel=1e-12, abs=1e-12)
  checked = 0
  for i, (kind, _) in enumerate(specs):
    if kind != "f": continue
    assert ts[i].grad is not None, f"input {i} got no gradient"
    got = ts[i].grad.numpy()
    assert got.shape == arrays[i].shape and got.dtype == np.float64
    want = np.zeros_like(arrays[i])
    for j in range(arrays[i].size):
      plus = [a.copy() for a in arrays]; minus = [a.copy() for a in arrays]
      plus[i].reshape(-1)[j] += H; minus[i].reshape(-1)[j] -= H
      want.reshape(-1)[j] = (value(plus) - value(minus)) / (2 * H)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")
    checked += 1
  assert checked, "no float input to check"


# ---------------------------------------------------------------- the cases: (name, fn, input specs)

S = (3, 4)
CASES = [
  # elementwise, unary
  ("neg", lambda x: -x, [normal(*S)]),
  ("exp", lambda x: x.exp(), [normal(*S)]),
  ("exp2", lambda x: x.exp2(), [normal(*S)]),
  ("log", lambda x: x.log(), [pos(*S)]),
  ("log2", lambda x: x.log2(), [pos(*S)]),
  ("sqrt", lambda x: x.sqrt(), [pos(*S)]),
  ("rsqrt", lambda x: x.rsqrt(), [pos(*S)]),
  ("sin", lambda x: x.sin(), [normal(*S)]),
  ("cos", lambda x: x.cos(), [normal(*S)]),
  ("tan", lambda x: x.tan(), [unit(*S, r=1.2)]),
  ("sigmoid", lambda x: x.sigmoid(), [normal(*S)]),
  ("tanh", lambda x: x.tanh(), [normal(*S)]),
  ("relu", lambda x: x.relu(), [away(*S)]),
  ("leaky_relu", lambda x: x.leaky_relu(0.1), [away(*S)]),
  ("gelu", lambda x: x.gelu(), [normal(*S)]),
  ("silu", lambda x: x.silu(), [normal(*S)]),
  ("softplus", lambda x: x.softplus(), [normal(*S)]),
  ("softplus_beta", lambda x: x.softplus(beta=2), [normal(*S)]),
  ("abs", lambda x: x.abs(), [away(*S)]),
  ("square", lambda x: x.square(), [normal(*S)]),
  ("reciprocal", lambda x: x.reciprocal(), [away(*S)]),
  ("erf", lambda x: x.erf(), [normal(*S)]),
  ("pow_int", lambda x: x ** 3, [normal(*S)]),
  ("pow_neg_int", lambda x: x ** -2, [away(*S)]),
  ("pow_float", lambda x: x ** 2.5, [pos(*S)]),
  ("pow_half", lambda x: x ** 0.5, [pos(*S)]),
  ("pow_tensor", lambda x, y: x ** y, [pos(*S), normal(*S)]),
  ("rpow", lambda x: 3.0 ** x, [normal(*S)]),
  ("clip", lambda x: x.clip(-0.5, 0.7), [away(*S, gap=0.0)]),
  ("floor_zero_grad", lambda x: x.floor() + x * 0.5, [frac(*S)]),
  ("round_zero_grad", lambda x: x.round() * x, [frac(*S)]),
  # elementwise, binary (with broadcasting: gradients are summed back to each input's shape)
  ("add", lambda x, y: x + y, [normal(*S), normal(*S)]),
  ("sub", lambda x, y: x - y, [normal(*S), normal(*S)]),
  ("mul", lambda x, y: x * y, [normal(*S), normal(*S)]),
  ("div", lambda x, y: x / y, [normal(*S), away(*S)]),
  ("maximum", lambda x, y: x.maximum(y), [distinct(*S), distinct(*S)]),
  ("minimum", lambda x, y: x.minimum(y), [distinct(*S), distinct(*S)]),
  ("where", lambda c, x, y: c.where(x, y), [const_bool(rng.random(S) < 0.5), normal(*S), normal(*S)]),
  ("where_from_compare", lambda x, y: (x > y).where(x * y, x - y), [distinct(*S), distinct(*S)]),
  ("lerp", lambda a, b, w: a.lerp(b, w), [normal(*S), normal(*S), normal(*S)]),
  ("broadcast_add_row", lambda x, y: x + y, [normal(3, 4), normal(4)]),
  ("broadcast_mul_3d", lambda x, y: x * y, [normal(2, 3, 1), normal(1, 3, 4)]),
  ("broadcast_div_col", lambda x, y: x / y, [normal(3, 4), pos(3, 1)]),
  ("broadcast_scalar_tensor", lambda x, s: x * s + s, [normal(3, 4), normal()]),
  ("rsub_scalar", lambda x: 1 - x, [normal(*S)]),
  ("rdiv_scalar", lambda x: 2 / x, [away(*S)]),
  ("same_input_twice", lambda x: x * x + x.exp() * x, [normal(*S)]),
  # reductions
  ("sum", lambda x: x.sum(), [normal(*S)]),
  ("sum_axis", lambda x: x.sum(1), [normal(*S)]),
  ("sum_keepdim", lambda x: x.sum(0, keepdim=True), [normal(*S)]),
  ("sum_axes_3d", lambda x: x.sum((0, 2)), [normal(2, 3, 2)]),
  ("mean", lambda x: x.mean(), [normal(*S)]),
  ("mean_axis_keepdim", lambda x: x.mean(-1, keepdim=True), [normal(*S)]),
  ("max", lambda x: x.max(), [distinct(*S)]),
  ("max_axis", lambda x: x.max(1), [distinct(*S)]),
  ("max_keepdim", lambda x: x.max(0, keepdim=True), [distinct(*S)]),
  ("min", lambda x: x.min(), [distinct(*S)]),
  ("min_axis", lambda x: x.min(0), [distinct(*S)]),
  ("prod", lambda x: x.prod(), [away(2, 3)]),
  ("prod_axis", lambda x: x.prod(1), [away(*S)]),
  ("var", lambda x: x.var(), [normal(*S)]),
  ("var_axis", lambda x: x.var(1, correction=0), [normal(*S)]),
  ("std", lambda x: x.std(0), [normal(*S)]),
  ("logsumexp", lambda x: x.logsumexp(1), [normal(*S)]),
  ("logsumexp_all_keepdim", lambda x: x.logsumexp(keepdim=True), [normal(*S)]),
  ("cumsum", lambda x: x.cumsum(1), [normal(*S)]),
  # movement
  ("reshape", lambda x: x.reshape(2, 6) * Tensor.arange(6, dtype=dtypes.float64), [normal(*S)]),
  ("permute", lambda x: x.permute(2, 0, 1), [normal(2, 3, 2)]),
  ("transpose", lambda x: x.transpose(0, 1), [normal(*S)]),
  ("T", lambda x: x.T, [normal(*S)]),
  ("expand", lambda x: x.expand(3, 4), [normal(3, 1)]),
  ("pad", lambda x: x.pad(((1, 2), (0, 1))), [normal(*S)]),
  ("pad_value", lambda x: x.pad(((1, 0), (2, 1)), value=3.0).exp(), [normal(*S)]),
  ("shrink", lambda x: x.shrink(((1, 3), (0, 2))), [normal(*S)]),
  ("flip", lambda x: x.flip(0, 1), [normal(*S)]),
  ("getitem_slices", lambda x: x[1:, :3], [normal(*S)]),
  ("getitem_steps", lambda x: x[::2, ::-3], [normal(5, 7)]),
  ("getitem_int", lambda x: x[1, 2:], [normal(*S)]),
  ("getitem_none_ellipsis", lambda x: x[None, ..., 1], [normal(*S)]),
  ("getitem_int_tensor", lambda x, i: x[i], [normal(4, 3), ints([3, 0, 3, 1, -1])]),
  ("getitem_two_tensors", lambda x, i, j: x[i, j], [normal(3, 4), ints([0, 2, 2]), ints([3, 1, 3])]),
  ("getitem_slice_and_tensor", lambda x, i: x[1:, i], [normal(3, 4), ints([[0, 3], [3, 2]])]),
  ("cat", lambda x, y: x.cat(y, dim=1), [normal(2, 3), normal(2, 2)]),
  ("cat_three", lambda x, y, z: Tensor.cat(x, y, z, dim=0), [normal(1, 3), normal(2, 3), normal(1, 3)]),
  ("stack", lambda x, y: Tensor.stack(x, y, dim=1), [normal(2, 3), normal(2, 3)]),
  ("repeat", lambda x: x.repeat(2, 3), [normal(2, 2)]),
  ("split", lambda x: x.split([1, 3], dim=1)[1] * x.split(2, dim=1)[0].sum(), [normal(*S)]),
  ("chunk", lambda x: x.chunk(2, dim=0)[0] - x.chunk(2, dim=0)[1] * 2, [normal(4, 3)]),
  ("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0).unsqueeze(-1), [normal(3, 1, 4)]),
  ("flatten", lambda x: x.flatten(1), [normal(2, 3, 2)]),
  # linear algebra
  ("matmul", lambda a, b: a @ b, [normal(3, 4), normal(4, 2)]),
  ("matmul_batched_broadcast", lambda a, b: a @ b, [normal(2, 2, 3), normal(3, 2)]),
  ("matmul_vector", lambda a, v: a @ v, [normal(3, 4), normal(4)]),
  ("vector_dot", lambda u, v: u.dot(v), [normal(5), normal(5)]),
  ("einsum_bmm", lambda a, b: Tensor.einsum("bij,bjk->bik", a, b), [normal(2, 2, 3), normal(2, 3, 2)]),
  ("einsum_trace", lambda a: Tensor.einsum("ii->", a), [normal(3, 3)]),
  ("einsum_outer_sum", lambda a, b: Tensor.einsum("i,j->j", a, b), [normal(3), normal(4)]),
  # nn
  ("softmax", lambda x: x.softmax(-1), [normal(*S)]),
  ("softmax_axis0", lambda x: x.softmax(0), [normal(*S)]),
  ("log_softmax", lambda x: x.log_softmax(1), [normal(*S)]),
  ("conv2d", lambda x, w: x.conv2d(w), [normal(1, 2, 4, 4), normal(2, 2, 2, 2)]),
  ("conv2d_stride_pad_bias", lambda x, w, b: x.conv2d(w, b, stride=2, padding=1),
   [normal(2, 1, 4, 4), normal(2, 1, 3, 3), normal(2)]),
  ("conv2d_groups", lambda x, w: x.conv2d(w, groups=2), [normal(1, 4, 3, 3), normal(2, 2, 2, 2)]),
  ("conv2d_dilation", lambda x, w: x.conv2d(w, dilation=2, padding=(1, 0)), [normal(1, 1, 4, 5), normal(1, 1, 2, 2)]),
  ("max_pool2d", lambda x: x.max_pool2d(2), [distinct(1, 2, 4, 4)]),
  ("max_pool2d_stride_pad", lambda x: x.max_pool2d(3, stride=2, padding=1), [distinct(1, 1, 5, 5)]),
  ("avg_pool2d", lambda x: x.avg_pool2d(2), [normal(1, 2, 4, 4)]),
  ("avg_pool2d_stride_pad", lambda x: x.avg_pool2d(3, stride=2, padding=1), [normal(1, 1, 5, 5)]),
  ("layernorm", lambda x: x.layernorm(), [normal(*S)]),
  ("layer_norm_affine", lambda x, w, b: x.layer_norm(4, w, b), [normal(*S), normal(4), normal(4)]),
  ("cross_entropy", lambda x, y: nn.cross_entropy(x, y), [normal(4, 5), ints([1, 0, 4, 4])]),
  ("cross_entropy_smoothing_sum", lambda x, y: nn.cross_entropy(x, y, reduction="sum", label_smoothing=0.1),
   [normal(3, 4), ints([3, 0, 1])]),
  ("nll_by_hand", lambda x, y: -(x.log_softmax(-1) * y.one_hot(4).cast(dtypes.float64)).sum(-1).mean(),
   [normal(3, 4), ints([2, 0, 1])]),
  ("mse_loss", lambda x, y: nn.mse_loss(x, y), [normal(*S), normal(*S)]),
  ("mlp", lambda x, w1, b1, w2: ((x @ w1 + b1).tanh() @ w2).softmax(), [normal(2, 3), normal(3, 4), normal(4), normal(4, 2)]),
  ("batchnorm_like", lambda x, g: (x - x.mean((0, 2, 3), keepdim=True)) * (x.var((0, 2, 3), keepdim=True, correction=0) + 1e-5).rsqrt() * g,
   [normal(2, 2, 2, 2), normal(1, 2, 1, 1)]),
  ("embedding_gather", lambda w, i: (i.reshape(3, 1) == Tensor.arange(4).reshape(1, 4)).reshape(3, 4, 1).where(w, 0.0).sum(1),
   [normal(4, 2), ints([3, 0, 3])]),
  ("attention", lambda q, k, v: (q @ k.transpose(-1, -2) * 0.5).softmax(-1) @ v, [normal(1, 3, 2), normal(1, 3, 2), normal(1, 3, 2)]),
]


@pytest.mark.needs_float64     # finite differences with h = 1e-6 need float64's precision
@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, specs):
  gradcheck(fn, specs)


def test_case_count():
  assert len(CASES) >= 60


# ---------------------------------------------------------------- autograd semantics (exact values: float64, or float32
# on a device without it)

def wide(a, grad=True): return Tensor(as_widest(a), requires_grad=grad)


def test_grad_accumulates_over_two_backward_calls():
  x = wide([1.0, 2.0, 3.0])
  (x * x).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [2, 4, 6])
  (x * 3).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [5, 7, 9])
  x.grad = None
  x.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [1, 1, 1])


def test_detach_blocks_gradient():
  x = wide([1.0, -2.0])
  y = x * x.detach() + x.detach().exp()   # d/dx = x (the detached factor is a constant)
  y.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [1.0, -2.0])


def test_only_detached_path_gives_no_gradient():
  x = wide([1.0, 2.0])
  (x.detach() * 2).sum().backward()
  assert x.grad is None
  y = wide([1.0, 2.0], grad=False)
  (y * 2).sum().backward()             # nothing requires a gradient: a no-op, as issue-free as torch's None grads
  assert y.grad is None and x.grad is None


def test_no_grad_raises_on_backward():
  x = wide([1.0, 2.0])
  loss = (x * 2).sum()
  with Tensor.no_grad():
    with pytest.raises(RuntimeError, match="no_grad"):
      loss.backward()
    assert not wide(np.zeros(2)).requires_grad
  loss.backward()   # fine again outside
  np.testing.assert_allclose(x.grad.numpy(), [2, 2])


def test_non_scalar_backward_needs_gradient():
  x = wide([[1.0, 2.0], [3.0, 4.0]])
  with pytest.raises(ValueError, match="one-element"):
    (x * 2).backward()
  (x * x).backward(wide([[1.0, 0.0], [2.0, 1.0]], grad=False))
  np.testing.assert_allclose(x.grad.numpy(), [[2, 0], [12, 8]])
  with pytest.raises(ValueError, match="gradient shape"):
    (x * 2).backward(wide(np.ones(3), grad=False))


def test_int_tensor_cannot_require_grad():
  with pytest.raises(TypeError, match="float"):
    Tensor([1, 2, 3], requires_grad=True)


def test_gradient_of_broadcast_input_has_input_shape():
  b = wide([1.0, 2.0, 3.0])
  x = wide(np.ones((4, 3)), grad=False)
  (x * b).sum().backward()
  assert b.grad.shape == (3,)
  np.testing.assert_allclose(b.grad.numpy(), [4, 4, 4])


def test_float32_gradients():
  """The same rules in float32 (the training dtype) against a hand derivative."""
  a = np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)
  x = Tensor(a, requires_grad=True)
  (x.sigmoid() * x).sum().backward()
  s = 1 / (1 + np.exp(-a))
  np.testing.assert_allclose(x.grad.numpy(), s + a * s * (1 - s), rtol=1e-5)
  assert x.grad.dtype == dtypes.float32


def test_gradient_reaches_realized_tensor_through_reshape():
  """A realized n-d tensor is a RESHAPE view of its buffer and reshape() folds view chains, so the graph may reach
  the buffer without the tensor's own node (this lost the gradient of conv weights and 0-d tensors)."""
  w = wide(np.arange(6.0).reshape(2, 3))
  s = wide(np.array(2.0))
  (w.reshape(3, 2) * s.reshape(1, 1)).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), np.full((2, 3), 2.0))
  assert s.grad.shape == () and s.grad.item() == 15.0
