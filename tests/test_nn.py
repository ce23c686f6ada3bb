"""nn layers, losses and optimizers against numpy references."""
import math
import numpy as np
import pytest
from baregrad.tensor import Tensor, dtypes, nn, optim
from baregrad.tensor.nn import StateDictError
from helpers_ops import widest_float_name

rng = np.random.default_rng(5)


def f32(a): return Tensor(np.asarray(a, dtype=np.float32))


# ---------------------------------------------------------------- layers

def test_linear_forward_backward_and_init():
  Tensor.manual_seed(1)
  lin = nn.Linear(20, 7)
  w, b = lin.weight.numpy(), lin.bias.numpy()
  assert w.shape == (7, 20) and b.shape == (7,)
  bound = 1 / math.sqrt(20)
  assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
  assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.15)   # U(-a, a) has std a / sqrt(3)
  x = rng.standard_normal((5, 20)).astype(np.float32)
  np.testing.assert_allclose(lin(f32(x)).numpy(), x @ w.T + b, rtol=1e-5, atol=1e-5)
  lin(f32(x)).sum().backward()
  np.testing.assert_allclose(lin.weight.grad.numpy(), np.ones((5, 7)).T @ x, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lin.bias.grad.numpy(), np.full(7, 5.0), rtol=1e-6)
  assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
  assert nn.Linear(3, 2, bias=False).bias is None
  with pytest.raises(ValueError, match="expected 20"):
    lin(f32(np.zeros((2, 3))))


def test_different_layers_get_different_weights():
  a, b = nn.Linear(4, 4), nn.Linear(4, 4)
  assert not np.array_equal(a.weight.numpy(), b.weight.numpy())
  Tensor.manual_seed(9); c = nn.Linear(4, 4)
  Tensor.manual_seed(9); d = nn.Linear(4, 4)
  np.testing.assert_array_equal(c.weight.numpy(), d.weight.numpy())   # same seed, same values ...
  d.weight.assign(Tensor.zeros(4, 4)).realize()
  assert np.abs(c.weight.numpy()).sum() > 0                            # ... but separate buffers


def _np_conv(x, w, b, stride, pad, groups):
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
  out = np.zeros((n, o, oh, ow))
  og = o // groups
  for oc in range(o):
    g = oc // og
    for i in range(oh):
      for j in range(ow):
        patch = x[:, g * cg:(g + 1) * cg, i * stride:i * stride + kh, j * stride:j * stride + kw]
        out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3)) + b[oc]
  return out


def test_conv2d_layer():
  conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
  assert conv.weight.shape == (6, 2, 3, 3)
  assert np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(2 * 9)
  x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
  want = _np_conv(x, conv.weight.numpy(), conv.bias.numpy(), 2, 1, 2)
  np.testing.assert_allclose(conv(f32(x)).numpy(), want, rtol=1e-4, atol=1e-5)
  conv(f32(x)).sum().backward()
  assert conv.weight.grad.shape == (6, 2, 3, 3) and conv.bias.grad.shape == (6,)
  np.testing.assert_allclose(conv.bias.grad.numpy(), np.full(6, 2 * 3 * 3), rtol=1e-6)


def test_batchnorm2d_train_and_eval():
  bn = nn.BatchNorm2d(3, momentum=0.2)
  bn.weight.assign(f32([1.0, 2.0, 0.5])).realize()
  bn.bias.assign(f32([0.0, -1.0, 3.0])).realize()
  rm, rv = np.zeros(3), np.ones(3)
  for step in range(3):
    x = (rng.standard_normal((4, 3, 2, 5)) * (step + 1) + step).astype(np.float32)
    out = bn(f32(x)).numpy()
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * np.array([1, 2, 0.5])[:, None, None] \
      + np.array([0, -1, 3])[:, None, None]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    n = x.size // 3
    rm, rv = 0.8 * rm + 0.2 * mean, 0.8 * rv + 0.2 * var * n / (n - 1)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)
  assert bn.num_batches_tracked.numpy().tolist() == [3]
  bn.eval()
  x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
  want = (x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5) * np.array([1, 2, 0.5])[:, None, None] \
    + np.array([0, -1, 3])[:, None, None]
  np.testing.assert_allclose(bn(f32(x)).numpy(), want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)   # eval does not update
  assert [n for n, _ in bn.named_parameters()] == ["weight", "bias"]
  assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]


def test_batchnorm_gradient_flows():
  bn = nn.BatchNorm2d(2)
  x = Tensor(rng.standard_normal((3, 2, 2, 2)).astype(np.float32), requires_grad=True)
  (bn(x) * f32(rng.standard_normal((3, 2, 2, 2)))).sum().backward()
  g = x.grad.numpy()
  assert np.abs(g.sum((0, 2, 3))).max() < 1e-4   # normalized outputs: gradient orthogonal to the mean shift
  assert bn.weight.grad is not None and bn.bias.grad is not None


def test_layernorm_layer():
  ln = nn.LayerNorm((3, 4))
  ln.weight.assign(f32(rng.standard_normal((3, 4)))).realize()
  x = rng.standard_normal((2, 3, 4)).astype(np.float32)
  mean = x.mean((1, 2), keepdims=True)
  var = x.var((1, 2), keepdims=True)
  want = (x - mean) / np.sqrt(var + 1e-5) * ln.weight.numpy()
  np.testing.assert_allclose(ln(f32(x)).numpy(), want, rtol=1e-4, atol=1e-5)


def test_embedding():
  emb = nn.Embedding(6, 3)
  idx = np.array([[0, 5, 2], [5, 5, 1]], dtype=np.int32)
  np.testing.assert_allclose(emb(Tensor(idx)).numpy(), emb.weight.numpy()[idx], rtol=1e-6)
  emb(Tensor(idx)).sum().backward()
  counts = np.bincount(idx.reshape(-1), minlength=6).astype(np.float32)
  np.testing.assert_allclose(emb.weight.grad.numpy(), np.repeat(counts[:, None], 3, 1))
  with pytest.raises(TypeError, match="integers"): emb(f32([1.0]))


def test_dropout():
  drop = nn.Dropout(0.25)
  x = np.ones((64, 64), dtype=np.float32)
  out = drop(f32(x)).numpy()
  kept = out != 0
  assert 0.70 < kept.mean() < 0.80
  np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
  assert not np.array_equal(drop(f32(x)).numpy(), out)   # a new mask each call
  drop.eval()
  np.testing.assert_array_equal(drop(f32(x)).numpy(), x)
  with pytest.raises(ValueError): nn.Dropout(1.5)


def test_sequential_train_eval_and_parameters():
  model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm2d(8), nn.Dropout(0.5), nn.Linear(8, 2))
  names = [n for n, _ in model.named_parameters()]
  assert names == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "layers.3.weight", "layers.3.bias"]
  assert len(model.parameters()) == 6
  model.eval()
  assert not model[1].training and not model[2].training
  model.train()
  assert model[2].training


# ---------------------------------------------------------------- state dict

def _two_layer():
  return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm2d(4))


def test_load_state_dict_in_place_and_errors():
  a, b = _two_layer(), _two_layer()
  w_before = b[0].weight
  b.load_state_dict(a.state_dict())
  assert b[0].weight is w_before   # loaded in place: optimizers keep working
  for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
    np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=k)
  sd = {k: v.numpy() for k, v in a.state_dict().items()}
  b.load_state_dict(sd)   # numpy arrays work too
  bad = dict(sd); del bad["layers.1.running_var"]
  with pytest.raises(StateDictError, match=r"missing keys \['layers.1.running_var'\]"): b.load_state_dict(bad)
  b.load_state_dict(bad, strict=False)
  extra = dict(sd, junk=np.zeros(1, np.float32))
  with pytest.raises(StateDictError, match=r"unexpected keys \['junk'\]"): b.load_state_dict(extra)
  wrong_shape = dict(sd, **{"layers.0.weight": np.zeros((3, 4), np.float32)})
  with pytest.raises(StateDictError, match=r"'layers.0.weight' has shape \(3, 4\) in the state dict but \(4, 3\)"):
    b.load_state_dict(wrong_shape)
  wrong_dtype = dict(sd, **{"layers.0.bias": np.zeros(4, np.float64)})
  with pytest.raises(StateDictError, match="'layers.0.bias' has dtype float64 in the state dict but float32"):
    b.load_state_dict(wrong_dtype)
  with pytest.raises(StateDictError, match="num_batches_tracked.*int32"):
    b.load_state_dict(dict(sd, **{"layers.1.num_batches_tracked": np.zeros(1, np.int64)}))
  # a failed load writes nothing
  w = b[0].weight.numpy()
  with pytest.raises(StateDictError, match="shape"):
    b.load_state_dict(dict(sd, **{"layers.0.weight": w * 0 + 7, "layers.1.bias": np.zeros(5, np.float32)}))
  np.testing.assert_array_equal(b[0].weight.numpy(), w)


# ---------------------------------------------------------------- losses

def _np_log_softmax(x):
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_cross_entropy():
  logits = rng.standard_normal((6, 5)).astype(np.float32) * 3
  labels = np.array([0, 4, 2, 2, 1, 3], dtype=np.int32)
  lp = _np_log_softmax(logits.astype(np.float64))
  per = -lp[np.arange(6), labels]
  assert nn.cross_entropy(f32(logits), Tensor(labels)).item() == pytest.approx(per.mean(), rel=1e-5)
  assert nn.cross_entropy(f32(logits), labels, reduction="sum").item() == pytest.approx(per.sum(), rel=1e-5)
  np.testing.assert_allclose(nn.cross_entropy(f32(logits), labels, reduction="none").numpy(), per, rtol=1e-5)
  smooth = (0.9 * per - 0.1 * lp.mean(-1)).mean()
  assert nn.cross_entropy(f32(logits), labels, label_smoothing=0.1).item() == pytest.approx(smooth, rel=1e-5)
  # classes on dim 1 for (N, C, d) logits
  l3 = rng.standard_normal((2, 5, 3)).astype(np.float32)
  y3 = rng.integers(0, 5, (2, 3)).astype(np.int32)
  lp3 = _np_log_softmax(l3.transpose(0, 2, 1).astype(np.float64))
  want = -np.take_along_axis(lp3, y3[..., None], -1).mean()
  assert nn.cross_entropy(f32(l3), y3).item() == pytest.approx(want, rel=1e-5)
  x = Tensor(logits, requires_grad=True)
  nn.cross_entropy(x, labels).backward()
  onehot = np.eye(5)[labels]
  np.testing.assert_allclose(x.grad.numpy(), (np.exp(lp) - onehot) / 6, rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="labels of shape"): nn.cross_entropy(f32(logits), labels[:3])
  with pytest.raises(TypeError, match="integer"): nn.cross_entropy(f32(logits), f32(labels))
  with pytest.raises(ValueError, match="reduction"): nn.cross_entropy(f32(logits), labels, reduction="max")


def test_mse_loss():
  a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
  assert nn.mse_loss(f32(a), f32(b)).item() == pytest.approx(((a - b) ** 2).mean(), rel=1e-5)
  assert nn.mse_loss(f32(a), b, reduction="sum").item() == pytest.approx(((a - b) ** 2).sum(), rel=1e-5)
  with pytest.raises(ValueError, match="shape"): nn.mse_loss(f32(a), f32(b[:2]))


# ---------------------------------------------------------------- optimizers vs numpy

W1 = rng.standard_normal((5, 4)); W2 = rng.standard_normal((4, 3))
X = rng.standard_normal((6, 5)); T = rng.standard_normal((6, 3))


def _np_grads(w1, w2):
  a = np.tanh(X @ w1)
  d = 2 * (a @ w2 - T) / T.size
  return X.T @ ((d @ w2.T) * (1 - a * a)), a.T @ d


def _np_optimize(kind, steps, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, betas=(0.9, 0.999), eps=1e-8):
  ws = [W1.copy(), W2.copy()]
  state = [dict(b=None, m=np.zeros_like(w), v=np.zeros_like(w)) for w in ws]
  b1, b2 = betas
  for t in range(1, steps + 1):
    for w, g, s in zip(ws, _np_grads(*ws), state):
      if kind == "SGD":
        d = g + weight_decay * w
        if momentum:
          s["b"] = d.copy() if s["b"] is None else momentum * s["b"] + (1 - dampening) * d
          d = d + momentum * s["b"] if nesterov else s["b"]
        w -= lr * d
      else:
        if kind == "Adam": g = g + weight_decay * w
        else: w *= 1 - lr * weight_decay
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        w -= lr * (s["m"] / (1 - b1 ** t)) / (np.sqrt(s["v"] / (1 - b2 ** t)) + eps)
  return ws


OPTIMIZERS = [
  ("sgd", "SGD", dict(lr=0.1)),
  ("sgd_momentum", "SGD", dict(lr=0.1, momentum=0.9)),
  ("sgd_dampening_wd", "SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02)),
  ("sgd_nesterov_wd", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
  ("adam", "Adam", dict(lr=0.01)),
  ("adam_l2", "Adam", dict(lr=0.02, weight_decay=0.1, betas=(0.8, 0.99))),
  ("adamw", "AdamW", dict(lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("name,kind,kw", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_optimizer_matches_numpy(name, kind, kw):
  """Four steps on a two-layer tanh net in float64: the update of W1 needs the old W2 (through the gradient),
  and each step must read the state written by the previous one. (In float32 on a device without float64, against
  the same float64 reference with float32's tolerance.)"""
  wide = getattr(dtypes, widest_float_name())
  w1 = nn.fresh(Tensor(W1, dtype=wide)); w2 = nn.fresh(Tensor(W2, dtype=wide))
  opt = getattr(optim, kind)([w1, w2], **kw)
  x, t = Tensor(X, dtype=wide), Tensor(T, dtype=wide)
  buffers = (w1._buffer(), w2._buffer())
  losses = []
  for _ in range(4):
    opt.zero_grad()
    loss = nn.mse_loss((x @ w1).tanh() @ w2, t)
    loss.backward()
    opt.step(loss)
    losses.append(loss.item())
  want = _np_optimize(kind, 4, **kw)
  f64 = wide == dtypes.float64
  tol = dict(rtol=1e-10, atol=1e-12) if f64 else dict(rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(w1.numpy(), want[0], **tol)
  np.testing.assert_allclose(w2.numpy(), want[1], **tol)
  assert (w1._buffer(), w2._buffer()) == buffers   # updated in place
  # the loss realized with step() is the loss before that step's update
  ws = [W1.copy(), W2.copy()]
  assert losses[0] == pytest.approx(((np.tanh(X @ ws[0]) @ ws[1] - T) ** 2).mean(), rel=1e-12 if f64 else 1e-5)
  w_after3 = _np_optimize(kind, 3, **kw)
  want_loss3 = ((np.tanh(X @ w_after3[0]) @ w_after3[1] - T) ** 2).mean()
  assert losses[3] == pytest.approx(want_loss3, rel=1e-10 if f64 else 1e-4)


def test_optimizer_float32_and_lr_setter():
  w = Tensor(np.array([1.0, -2.0, 3.0], dtype=np.float32), requires_grad=True)
  opt = optim.SGD([w], lr=0.5)
  assert opt.lr == 0.5
  for lr in (0.1, 0.25, 0.05):
    opt.lr = lr
    opt.zero_grad()
    (w * w).sum().backward()   # grad 2w: w <- w (1 - 2 lr)
    opt.step()
  np.testing.assert_allclose(w.numpy(), np.array([1.0, -2.0, 3.0]) * 0.8 * 0.5 * 0.9, rtol=1e-6)
  assert opt.lr == pytest.approx(0.05)
  assert w.grad is not None
  opt.zero_grad()
  assert w.grad is None
  opt.step()   # no gradients: nothing changes
  with pytest.raises(ValueError): opt.lr = -1
  with pytest.raises(ValueError, match="empty"): optim.Adam([])
  with pytest.raises(ValueError, match="nesterov"): optim.SGD([w], lr=0.1, nesterov=True)


def test_frozen_parameter_keeps_value():
  a = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
  b = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
  opt = optim.Adam([a, b], lr=0.1)
  opt.zero_grad()
  (a * 2).sum().backward()   # b gets no gradient
  opt.step()
  np.testing.assert_allclose(a.numpy(), 1 - 0.1, rtol=1e-5)
  np.testing.assert_array_equal(b.numpy(), np.ones(3))


def test_assign_invalidates_cached_results():
  """A graph identical to one realized before an assign is computed again from the written buffer (it used to
  return the cached result, e.g. a fresh zeros(n).contiguous() gave the ones assigned to an earlier one)."""
  x = Tensor(np.array([1.0, 2.0], dtype=np.float32))
  a, b = x * 2, x * 2
  a.realize()
  x.assign(Tensor(np.array([5.0, 5.0], dtype=np.float32))).realize()
  np.testing.assert_array_equal(b.numpy(), [10.0, 10.0])
  np.testing.assert_array_equal(a.numpy(), [2.0, 4.0])   # realized before the write: keeps its value
  z = Tensor.zeros(3).contiguous().realize()
  z.assign(Tensor.ones(3)).realize()
  np.testing.assert_array_equal(Tensor.zeros(3).contiguous().numpy(), [0.0, 0.0, 0.0])


def test_assign_invalidates_results_computed_from_cached_results():
  """A write makes stale what was computed from the buffer, and in turn what was computed from those."""
  b = Tensor(np.ones(3, np.float32))
  (b * 2).contiguous().realize()
  ((b * 2).contiguous() + 1).realize()
  b.assign(Tensor(np.full(3, 5.0, np.float32))).realize()
  np.testing.assert_array_equal((((b * 2).contiguous() + 1) * 3).numpy(), [33.0, 33.0, 33.0])
