"""Losses and scaled dot-product attention (tensor/losses.py) against numpy references written from torch's
definitions (torch.nn.functional: cross_entropy, nll_loss, binary_cross_entropy[_with_logits],
scaled_dot_product_attention), float64 finite-difference gradients, and a forward subset on the emulated GPUs."""
import math
import numpy as np
import pytest
from baregrad.tensor import Tensor, dtypes, ShapeError
from baregrad.tensor.losses import attention_weights
from helpers_ops import as_widest

rng = np.random.default_rng(11)


# ---------------------------------------------------------------- numpy references (torch's definitions)

def np_log_softmax(x, axis):
  m = x.max(axis, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def np_reduce(per, reduction):
  return per.mean() if reduction == "mean" else per.sum() if reduction == "sum" else per


def np_nll(logp, target, weight=None, ignore_index=-100, reduction="mean"):
  """torch.nn.functional.nll_loss: classes on dim 1 (dim 0 for a 1-D input)."""
  class_dim = 1 if logp.ndim >= 2 else 0
  lp = np.moveaxis(logp, class_dim, -1)
  w = np.ones(lp.shape[-1]) if weight is None else weight
  keep = target != ignore_index
  safe = np.where(keep, target, 0)
  w_y = w[safe] * keep
  per = -np.take_along_axis(lp, safe[..., None], -1)[..., 0] * w_y
  if reduction == "mean": return per.sum() / w_y.sum()
  return np_reduce(per, reduction)


def np_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
  """torch's cross_entropy: class indices (nll of log_softmax mixed with the smoothing term, reduced with the
  same denominator) or class probabilities (smoothed toward uniform; 'mean' divides by the sample count)."""
  class_dim = 1 if x.ndim >= 2 else 0
  C = x.shape[class_dim]
  logp = np_log_softmax(x, class_dim)
  w = np.ones(C) if weight is None else weight
  lp = np.moveaxis(logp, class_dim, -1)
  if target.dtype.kind == "f":
    p = np.moveaxis(target, class_dim, -1) * (1 - label_smoothing) + label_smoothing / C
    per = -(lp * p * w).sum(-1)
    return per.sum() / per.size if reduction == "mean" else np_reduce(per, reduction)
  nll = np_nll(logp, target, weight, ignore_index, reduction)
  keep = target != ignore_index
  smooth = -(lp * w).sum(-1) * keep
  if reduction == "mean": smooth = smooth.sum() / (w[np.where(keep, target, 0)] * keep).sum()
  else: smooth = np_reduce(smooth, reduction)
  return (1 - label_smoothing) * nll + label_smoothing / C * smooth


def np_sdpa(q, k, v, mask=None, is_causal=False, scale=None):
  """torch's reference implementation of scaled_dot_product_attention (without dropout)."""
  L, S = q.shape[-2], k.shape[-2]
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  bias = np.zeros((L, S))
  if is_causal: bias = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf)
  if mask is not None: bias = np.where(mask, bias, -np.inf) if mask.dtype == bool else bias + mask
  s = q @ np.swapaxes(k, -1, -2) * scale + bias
  e = np.exp(s - s.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)) @ v


def close(got, want, tol=1e-5):
  np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol, atol=tol)


def t32(a): return Tensor(np.asarray(a, dtype=np.float32))


# ---------------------------------------------------------------- cross_entropy / nll_loss

REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_class_indices(reduction, use_weight, label_smoothing):
  x = rng.standard_normal((6, 5)).astype(np.float32)
  y = np.array([0, 4, 2, -100, 2, 1])
  w = rng.uniform(0.5, 2.0, 5).astype(np.float32) if use_weight else None
  got = t32(x).cross_entropy(Tensor(y.astype(np.int32)), weight=None if w is None else t32(w), reduction=reduction,
                             label_smoothing=label_smoothing)
  close(got.numpy(), np_cross_entropy(x.astype(np.float64), y, w, -100, reduction, label_smoothing))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_spatial_and_ignore_index_inside_the_classes(reduction):
  x = rng.standard_normal((2, 4, 3, 2)).astype(np.float32)     # (N, C, d1, d2)
  y = rng.integers(0, 4, (2, 3, 2))
  w = np.array([1.0, 0.5, 2.0, 3.0], np.float32)
  got = t32(x).cross_entropy(y, weight=w, ignore_index=2, reduction=reduction, label_smoothing=0.1)
  close(got.numpy(), np_cross_entropy(x.astype(np.float64), y, w, 2, reduction, 0.1))


def test_cross_entropy_unbatched_and_all_ignored():
  x = rng.standard_normal(7).astype(np.float32)
  close(t32(x).cross_entropy(3).numpy(), -np_log_softmax(x.astype(np.float64), 0)[3])
  # every target ignored: 'mean' is 0/0 = NaN (as torch), 'sum' is 0
  x2 = rng.standard_normal((2, 3)).astype(np.float32)
  assert np.isnan(t32(x2).cross_entropy([-100, -100]).item())
  assert t32(x2).cross_entropy([-100, -100], reduction="sum").item() == 0.0


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_cross_entropy_probability_targets(reduction, use_weight, label_smoothing):
  x = rng.standard_normal((3, 4, 2)).astype(np.float32)
  p = rng.uniform(size=(3, 4, 2))
  p = (p / p.sum(1, keepdims=True)).astype(np.float32)
  w = rng.uniform(0.5, 2.0, 4).astype(np.float32) if use_weight else None
  got = t32(x).cross_entropy(t32(p), weight=w, reduction=reduction, label_smoothing=label_smoothing)
  close(got.numpy(), np_cross_entropy(x.astype(np.float64), p.astype(np.float64), w, -100, reduction, label_smoothing))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_weight", [False, True])
def test_nll_loss(reduction, use_weight):
  logp = np_log_softmax(rng.standard_normal((5, 4)), 1).astype(np.float32)
  y = np.array([3, 1, 1, 0, -100])
  w = np.array([0.2, 1.0, 3.0, 0.7], np.float32) if use_weight else None
  close(t32(logp).nll_loss(y, weight=w, reduction=reduction).numpy(),
        np_nll(logp.astype(np.float64), y, w, -100, reduction))
  y1 = np.where(y == -100, 0, y)
  close(t32(logp).nll_loss(y1, weight=w, ignore_index=1, reduction=reduction).numpy(),
        np_nll(logp.astype(np.float64), y1, w, 1, reduction))


def test_nll_loss_spatial():
  logp = np_log_softmax(rng.standard_normal((2, 3, 4)), 1).astype(np.float32)
  y = rng.integers(0, 3, (2, 4))
  close(t32(logp).nll_loss(y).numpy(), np_nll(logp.astype(np.float64), y))


def test_classification_loss_errors():
  x = t32(rng.standard_normal((4, 3)))
  with pytest.raises(IndexError, match="out of bounds"): x.cross_entropy([0, 1, 3, 0])
  with pytest.raises(IndexError, match="out of bounds"): x.nll_loss([0, -1, 2, 0])
  with pytest.raises(ShapeError, match="does not match input of shape"): x.cross_entropy([0, 1, 2])
  with pytest.raises(ValueError, match="reduction"): x.cross_entropy([0, 1, 2, 0], reduction="max")
  with pytest.raises(ValueError, match="label_smoothing"): x.cross_entropy([0, 1, 2, 0], label_smoothing=1.5)
  with pytest.raises(ValueError, match="weight must have shape"): x.cross_entropy([0, 1, 2, 0], weight=[1.0, 2.0])
  with pytest.raises(ValueError, match="ignore_index"): x.cross_entropy(t32(np.full((4, 3), 1 / 3)), ignore_index=0)
  with pytest.raises(ValueError, match="class dim"): Tensor(1.0).cross_entropy(0)


# ---------------------------------------------------------------- tinygrad-named losses

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
def test_sparse_categorical_crossentropy(reduction, label_smoothing):
  x = rng.standard_normal((2, 3, 5)).astype(np.float32)     # classes on the LAST dim
  y = np.array([[0, 4, -1], [2, -1, 3]])
  got = t32(x).sparse_categorical_crossentropy(y, label_smoothing=label_smoothing, reduction=reduction)
  # the same as torch's cross_entropy with the classes moved to dim 1 and ignore_index=-1
  want = np_cross_entropy(np.moveaxis(x.astype(np.float64), -1, 1), y, None, -1, reduction, label_smoothing)
  close(got.numpy(), want)
  y4 = np.where(y < 0, 0, y)
  got = t32(x).sparse_categorical_crossentropy(y4, ignore_index=4, reduction=reduction)
  close(got.numpy(), np_cross_entropy(np.moveaxis(x.astype(np.float64), -1, 1), y4, None, 4, reduction))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_crossentropy(reduction):
  p = rng.uniform(0.02, 0.98, (4, 3))
  y = rng.uniform(size=(4, 3))
  want = -(y * np.log(p) + (1 - y) * np.log(1 - p))
  close(t32(p).binary_crossentropy(t32(y), reduction=reduction).numpy(), np_reduce(want, reduction), 2e-5)
  # torch clamps each log at -100, so saturated probabilities give a finite loss (and a finite gradient)
  # (the gradient is that of the clamped function: 0 where the clamp holds, 1/(1-p) = 1 at p = 0 with y = 0)
  edge = Tensor(as_widest([0.0, 1.0, 0.0, 1.0]), requires_grad=True)
  target = as_widest([1.0, 0.0, 0.0, 1.0])
  edge.binary_crossentropy(target, reduction="sum").backward()
  close(edge.binary_crossentropy(target, reduction="none").numpy(), [100.0, 100.0, 0.0, 0.0])
  close(edge.grad.numpy(), [0.0, 0.0, 1.0, -1.0])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("use_pos_weight", [False, True])
def test_binary_crossentropy_logits(reduction, use_pos_weight):
  x = np.concatenate([rng.standard_normal((3, 4)) * 3, [[-200.0, 200.0, 0.0, 60.0]]]).astype(np.float32)
  y = rng.uniform(size=(4, 4)).astype(np.float32)
  pw = np.array([0.5, 1.0, 2.0, 3.0], np.float32) if use_pos_weight else None
  xd = x.astype(np.float64)
  log_sig = -np.logaddexp(0, -xd)                            # log sigmoid(x), log(1 - sigmoid(x)) = log sigmoid(-x)
  want = -((1.0 if pw is None else pw) * y * log_sig + (1 - y) * -np.logaddexp(0, xd))
  got = t32(x).binary_crossentropy_logits(t32(y), reduction=reduction, pos_weight=None if pw is None else t32(pw))
  assert np.isfinite(got.numpy()).all()
  close(got.numpy(), np_reduce(want, reduction), 2e-5)


# ---------------------------------------------------------------- scaled dot-product attention

def _qkv(*batch, L=4, S=5, E=6, Ev=3):
  q = rng.standard_normal((*batch, L, E)).astype(np.float32)
  k = rng.standard_normal((*batch, S, E)).astype(np.float32)
  v = rng.standard_normal((*batch, S, Ev)).astype(np.float32)
  return q, k, v


def _sdpa(q, k, v, **kw):
  m = kw.get("attn_mask")
  if isinstance(m, np.ndarray): kw["attn_mask"] = Tensor(m)
  return t32(q).scaled_dot_product_attention(t32(k), t32(v), **kw).numpy()


def test_sdpa_plain_and_scale():
  q, k, v = _qkv(2, 3)
  close(_sdpa(q, k, v), np_sdpa(q, k, v))
  close(_sdpa(q, k, v, scale=0.7), np_sdpa(q, k, v, scale=0.7))


def test_sdpa_bool_masks_keep_where_true():
  q, k, v = _qkv(2, 3)
  mask = rng.uniform(size=(4, 5)) < 0.6
  mask[:, 0] = True                                    # every row keeps a key
  close(_sdpa(q, k, v, attn_mask=mask), np_sdpa(q, k, v, mask))
  per_batch = rng.uniform(size=(2, 1, 4, 5)) < 0.6    # broadcast over heads
  per_batch[..., 1] = True
  close(_sdpa(q, k, v, attn_mask=per_batch), np_sdpa(q, k, v, per_batch))


def test_sdpa_float_mask_is_added():
  q, k, v = _qkv(3)
  mask = rng.standard_normal((3, 4, 5)).astype(np.float32)
  close(_sdpa(q, k, v, attn_mask=mask), np_sdpa(q, k, v, mask))


def test_sdpa_causal():
  q, k, v = _qkv(2, L=5, S=5)
  close(_sdpa(q, k, v, is_causal=True), np_sdpa(q, k, v, is_causal=True))
  q, k, v = _qkv(2, L=3, S=5)                          # top-left aligned, as torch
  close(_sdpa(q, k, v, is_causal=True, scale=0.5), np_sdpa(q, k, v, is_causal=True, scale=0.5))
  # a query whose keys are all masked gets NaN, as torch's math reference
  out = _sdpa(q, k, v, attn_mask=np.zeros((3, 5), bool))
  assert np.isnan(out).all()


def test_sdpa_dropout_zeroes_and_rescales():
  q, k, _ = _qkv(4, L=8, S=8)
  Tensor.manual_seed(3)
  plain = attention_weights(t32(q), t32(k)).numpy()
  dropped = attention_weights(t32(q), t32(k), dropout_p=0.25).numpy()
  zero = dropped == 0
  assert 0.1 < zero.mean() < 0.4
  close(dropped[~zero], plain[~zero] / 0.75)
  assert np.abs(attention_weights(t32(q), t32(k), dropout_p=1.0).numpy()).max() == 0


def test_sdpa_errors():
  q, k, v = _qkv(2)
  with pytest.raises(ValueError, match="not both"):
    _sdpa(q, k, v, attn_mask=np.ones((4, 5), bool), is_causal=True)
  with pytest.raises(ValueError, match="same feature size"):
    t32(q).scaled_dot_product_attention(t32(k[..., :2]), t32(v))
  with pytest.raises(ValueError, match="value has"):
    t32(q).scaled_dot_product_attention(t32(k), t32(v[:, :3]))
  with pytest.raises(ShapeError, match="does not broadcast"):
    _sdpa(q, k, v, attn_mask=np.ones((4, 4), bool))


# ---------------------------------------------------------------- float64 finite-difference gradients (skipped on a
# device without float64)

def numeric_grad(f, arrays, i, eps=1e-6):
  """Central differences of the scalar f(*arrays) with respect to arrays[i], one element at a time."""
  x = arrays[i]
  g = np.zeros_like(x)
  for j in np.ndindex(x.shape):
    hi, lo = [a.copy() for a in arrays], [a.copy() for a in arrays]
    hi[i][j] += eps
    lo[i][j] -= eps
    g[j] = (f(*[Tensor(a) for a in hi]).item() - f(*[Tensor(a) for a in lo]).item()) / (2 * eps)
  return g


def check_gradients(f, arrays, wrt=(0,)):
  tensors = [Tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
  f(*tensors).backward()
  for i in wrt:
    assert tensors[i].dtype == dtypes.float64
    np.testing.assert_allclose(tensors[i].grad.numpy(), numeric_grad(f, arrays, i), rtol=1e-5, atol=1e-7)


Y_IDX = Tensor(np.array([2, -100, 0], np.int32))
W3 = np.array([0.5, 2.0, 1.5, 1.0])


@pytest.mark.needs_float64
def test_grad_cross_entropy_indices_weight_ignore_smoothing():
  x = rng.standard_normal((3, 4))
  check_gradients(lambda x: x.cross_entropy(Y_IDX, weight=Tensor(W3), label_smoothing=0.2), [x])


@pytest.mark.needs_float64
def test_grad_cross_entropy_probabilities():
  x, p = rng.standard_normal((2, 3)), rng.dirichlet(np.ones(3), 2)
  check_gradients(lambda x, p: x.cross_entropy(p, weight=Tensor(W3[:3]), reduction="sum", label_smoothing=0.1),
                  [x, p], wrt=(0, 1))


@pytest.mark.needs_float64
def test_grad_nll_loss():
  x = rng.standard_normal((3, 4))
  check_gradients(lambda x: x.nll_loss(Y_IDX, weight=Tensor(W3)), [x])


@pytest.mark.needs_float64
def test_grad_sparse_categorical_crossentropy():
  x = rng.standard_normal((1, 3, 3))
  y = Tensor(np.array([[2, -1, 0]], np.int32))
  check_gradients(lambda x: x.sparse_categorical_crossentropy(y, label_smoothing=0.1), [x])


@pytest.mark.needs_float64
def test_grad_binary_crossentropy():
  p, y = rng.uniform(0.1, 0.9, (2, 3)), rng.uniform(size=(2, 3))
  check_gradients(lambda p, y: p.binary_crossentropy(y), [p, y], wrt=(0, 1))


@pytest.mark.needs_float64
def test_grad_binary_crossentropy_logits():
  x, y = rng.standard_normal((2, 3)) * 2, rng.uniform(size=(2, 3))
  pw = Tensor(np.array([0.5, 2.0, 3.0]))
  check_gradients(lambda x, y: x.binary_crossentropy_logits(y, reduction="sum", pos_weight=pw), [x, y], wrt=(0, 1))


@pytest.mark.needs_float64
def test_grad_sdpa_causal_and_float_mask():
  q, k, v = rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 3, 2))
  weights = Tensor(rng.standard_normal((3, 2)))
  check_gradients(lambda q, k, v: (q.scaled_dot_product_attention(k, v, is_causal=True, scale=0.8) * weights).sum(),
                  [q, k, v], wrt=(0, 1, 2))
  mask = Tensor(rng.standard_normal((3, 3)))
  check_gradients(lambda q, k, v: (q.scaled_dot_product_attention(k, v, attn_mask=mask) * weights).sum(),
                  [q, k, v], wrt=(0, 1))


# ---------------------------------------------------------------- the emulated GPUs

@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_forward_on_emulated_gpus(device):
  from test_reliability import _emulated
  _emulated(device)
  x = rng.standard_normal((4, 5)).astype(np.float32)
  y = np.array([1, -100, 4, 0])
  w = np.array([1.0, 2.0, 0.5, 1.5, 3.0], np.float32)
  got = Tensor(x, device=device).cross_entropy(Tensor(y.astype(np.int32), device=device),
                                               weight=Tensor(w, device=device), label_smoothing=0.1)
  assert got.device == device
  close(got.numpy(), np_cross_entropy(x.astype(np.float64), y, w, -100, "mean", 0.1), 1e-4)
  q, k, v = _qkv(2, L=5, S=5)
  out = Tensor(q, device=device).scaled_dot_product_attention(Tensor(k, device=device), Tensor(v, device=device),
                                                              is_causal=True)
  close(out.numpy(), np_sdpa(q, k, v, is_causal=True), 1e-4)
