"""Losses and attention (torch names and defaults).

`LossOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph.

Targets and masks may be Tensors, numpy arrays or lists. Class-index targets given on the host are range-checked
at once (IndexError, as torch); a Tensor target is not (that would wait for it on every call): an index outside
[0, C) that is not `ignore_index` picks no class, so its term of the loss is 0.

Shape mismatches raise ShapeError (a ValueError and a RuntimeError, as numpy and torch).

Attention follows `torch.nn.functional.scaled_dot_product_attention`: a bool mask keeps the scores where it is
True, a float mask is added to them; `attention_weights` gives the softmax that it multiplies `value` with (what
`nn.MultiheadAttention` returns when asked for the weights)."""
from __future__ import annotations
import math
import numpy as np
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import UOp, Ops
from .composite import ShapeError, ArgumentError
from .device_dtypes import host_floats

REDUCTIONS = ("mean", "sum", "none")
LOG_CLAMP = -100.0   # torch's BCELoss clamps log(p) and log(1 - p) to >= -100, so p = 0 or 1 gives a finite loss


def _check_reduction(reduction, op: str):
  if reduction not in REDUCTIONS:
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_smoothing(label_smoothing, op: str):
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"{op}: label_smoothing must be in [0.0, 1.0], got {label_smoothing!r}")


def _reduce(loss, reduction: str):
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  return loss


def _log_clamped(p):
  """max(log p, -100), with a gradient of 0 (not NaN) where p == 0; NaN stays NaN."""
  nonzero = p != 0
  return nonzero.where(nonzero.where(p, 1.0).log().clip(LOG_CLAMP), LOG_CLAMP)


def _class_last(x, class_dim: int):
  """x with its class dim moved to the end."""
  if class_dim == x.ndim - 1: return x
  order = [d for d in range(x.ndim) if d != class_dim] + [class_dim]
  return x.permute(*order)


def _nll_terms(logp, target, weight, ignore_index: int):
  """For log-probabilities `logp` (..., C) with classes last and integer targets (...): the per-element loss
  -w[y] * logp[y] (0 where y == ignore_index) and the per-element weight w[y] (0 there too)."""
  num_classes = logp.shape[-1]
  classes = type(logp).arange(num_classes, dtype=dtypes.int32, device=logp.device)
  hit = target.cast(dtypes.int32).unsqueeze(-1) == classes            # (..., C) bool: the picked class
  keep = target != ignore_index
  picked = hit.where(logp, 0.0).sum(-1)
  if weight is None: return keep.where(-picked, 0.0), keep.cast(logp.dtype)
  w = hit.where(weight, 0.0).sum(-1)
  return keep.where(-picked * w, 0.0), keep.where(w, 0.0)


class LossOps:
  """Mixed into `Tensor`."""

  # ---------------------------------------------------------------- argument handling

  def _loss_target(self, target, op: str, num_classes: int | None = None, ignore_index: int | None = None):
    """target as a Tensor on self's device. Host integer targets are checked against [0, num_classes)."""
    if isinstance(target, LossOps):
      if target.device != self.device:
        raise ValueError(f"{op}: target is on {target.device} but the input is on {self.device}; move one with .to()")
      return target
    arr = host_floats(target, self.device, self._float().dtype)
    if arr.dtype.kind in "iu" and num_classes is not None and arr.size:
      bad = (arr != ignore_index) & ((arr < 0) | (arr >= num_classes))
      if bad.any():
        raise IndexError(f"{op}: target {arr[bad].flat[0]} is out of bounds for {num_classes} classes "
                         f"(ignore_index is {ignore_index})")
    if arr.dtype.kind in "iu": arr = arr.astype(np.int32)
    return type(self)(arr, device=self.device)

  def _class_weight(self, weight, num_classes: int, op: str):
    if weight is None: return None
    if not isinstance(weight, LossOps):
      weight = type(self)(host_floats(weight, self.device, self._float().dtype), device=self.device)
    if tuple(weight.shape) != (num_classes,):
      raise ShapeError(f"{op}: weight must have shape ({num_classes},), one entry per class, got {tuple(weight.shape)}")
    return weight.cast(self._float().dtype)

  def _class_dim(self, op: str) -> int:
    if self.ndim == 0: raise ShapeError(f"{op}: the input needs a class dim, got a 0-d tensor")
    return 1 if self.ndim >= 2 else 0

  def _index_target_shape(self, target, class_dim: int, op: str):
    want = tuple(s for d, s in enumerate(self.shape) if d != class_dim)
    if tuple(target.shape) != want:
      raise ShapeError(f"{op}: target of shape {tuple(target.shape)} does not match input of shape "
                       f"{tuple(self.shape)} (class indices need shape {want}; class probabilities the input's shape)")
    if not target.dtype.is_int:
      raise TypeError(f"{op}: class-index targets must be integers, got {target.dtype.name}")

  # ---------------------------------------------------------------- classification losses

  def cross_entropy(self, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                    label_smoothing: float = 0.0):
    """torch.nn.functional.cross_entropy of logits `self` (C,), (N, C) or (N, C, d1, ...) (classes on dim 1).

    `target` is either class indices of the input's shape without the class dim, or class probabilities of the
    input's shape (a float tensor). `weight` (C,) rescales each class. With class indices, 'mean' divides by the
    summed weights of the targets that are not `ignore_index`; with probabilities it divides by the number of
    samples (N * d1 * ...). `label_smoothing` mixes the target with the uniform distribution."""
    op = "cross_entropy"
    _check_reduction(reduction, op)
    _check_smoothing(label_smoothing, op)
    class_dim = self._class_dim(op)
    num_classes = self.shape[class_dim]
    target = self._loss_target(target, op, num_classes, ignore_index)
    weight = self._class_weight(weight, num_classes, op)
    logp = self.log_softmax(class_dim)
    if target.dtype.is_float:
      if tuple(target.shape) != tuple(self.shape):
        raise ShapeError(f"{op}: class-probability target of shape {tuple(target.shape)} must have the input's shape "
                         f"{tuple(self.shape)}")
      if ignore_index >= 0:
        raise ValueError(f"{op}: ignore_index ({ignore_index}) is not supported with class-probability targets")
      probs = target.cast(logp.dtype)
      if label_smoothing: probs = probs * (1 - label_smoothing) + label_smoothing / num_classes
      prod = _class_last(logp * probs, class_dim)
      if weight is not None: prod = prod * weight
      per = -prod.sum(-1)
      if reduction == "mean": return per.sum() / (self.numel() // max(num_classes, 1))
      return _reduce(per, reduction)
    self._index_target_shape(target, class_dim, op)
    logp_last = _class_last(logp, class_dim)
    loss, w = _nll_terms(logp_last, target, weight, ignore_index)
    if reduction == "mean": out, denom = loss.sum(), w.sum()
    else: out, denom = _reduce(loss, reduction), None
    if denom is not None: out = out / denom
    if not label_smoothing: return out
    # torch: (1 - eps) * nll + eps / C * smooth, with smooth = -sum_c w_c logp_c, reduced like nll
    smooth = -(logp_last * weight).sum(-1) if weight is not None else -logp_last.sum(-1)
    smooth = (target != ignore_index).where(smooth, 0.0)
    smooth = smooth.sum() / denom if denom is not None else _reduce(smooth, reduction)
    return out * (1 - label_smoothing) + smooth * (label_smoothing / num_classes)

  def nll_loss(self, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """torch.nn.functional.nll_loss of log-probabilities `self` (C,), (N, C) or (N, C, d1, ...) against class
    indices; 'mean' divides by the summed weights of the targets that are not `ignore_index`."""
    op = "nll_loss"
    _check_reduction(reduction, op)
    class_dim = self._class_dim(op)
    num_classes = self.shape[class_dim]
    target = self._loss_target(target, op, num_classes, ignore_index)
    self._index_target_shape(target, class_dim, op)
    weight = self._class_weight(weight, num_classes, op)
    loss, w = _nll_terms(_class_last(self._float(), class_dim), target, weight, ignore_index)
    if reduction == "mean": return loss.sum() / w.sum()
    return _reduce(loss, reduction)

  def sparse_categorical_crossentropy(self, Y, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean"):
    """tinygrad's: cross-entropy of logits with the classes on the LAST dim against integer labels `Y`
    (the input's shape without its last dim). Labels equal to `ignore_index` add nothing and are not counted by
    'mean'. label_smoothing as torch: (1 - eps) * nll - eps * mean_c(logp_c)."""
    op = "sparse_categorical_crossentropy"
    _check_reduction(reduction, op)
    _check_smoothing(label_smoothing, op)
    if self.ndim == 0: raise ShapeError(f"{op}: the input needs a class dim, got a 0-d tensor")
    num_classes = self.shape[-1]
    Y = self._loss_target(Y, op, num_classes, ignore_index)
    self._index_target_shape(Y, self.ndim - 1, op)
    logp = self.log_softmax(-1)
    loss, w = _nll_terms(logp, Y, None, ignore_index)
    if label_smoothing:
      loss = loss * (1 - label_smoothing) - (Y != ignore_index).where(logp.mean(-1), 0.0) * label_smoothing
    if reduction == "mean": return loss.sum() / w.sum()
    return _reduce(loss, reduction)

  def binary_crossentropy(self, y, reduction: str = "mean"):
    """Binary cross-entropy of probabilities `self` against targets `y` (same shape):
    -(y log p + (1 - y) log(1 - p)), each log clamped to >= -100 as torch's binary_cross_entropy."""
    op = "binary_crossentropy"
    _check_reduction(reduction, op)
    y = self._loss_target(y, op)
    p = self._float()
    y = y.cast(p.dtype)
    loss = -(y * _log_clamped(p) + (1 - y) * _log_clamped(1 - p))
    return _reduce(loss, reduction)

  def binary_crossentropy_logits(self, y, reduction: str = "mean", pos_weight=None):
    """Binary cross-entropy of logits `self` against targets `y`, in the stable form of torch's
    binary_cross_entropy_with_logits: (1 - y) x + (1 + (pos_weight - 1) y) (log(1 + e^-|x|) + max(-x, 0)).
    `pos_weight` (broadcast against the last dim) weighs the positive term."""
    op = "binary_crossentropy_logits"
    _check_reduction(reduction, op)
    y = self._loss_target(y, op)
    x = self._float()
    y = y.cast(x.dtype)
    softplus_neg = -x.logsigmoid()       # log(1 + e^-x) = log1p(e^-|x|) + max(-x, 0), without overflow
    if pos_weight is None: loss = (1 - y) * x + softplus_neg
    else:
      if not isinstance(pos_weight, LossOps):
        pos_weight = type(self)(host_floats(pos_weight, self.device, x.dtype), device=self.device)
      loss = (1 - y) * x + (1 + (pos_weight.cast(x.dtype) - 1) * y) * softplus_neg
    return _reduce(loss, reduction)

  # ---------------------------------------------------------------- attention

  def scaled_dot_product_attention(self, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                   scale: float | None = None, enable_gqa: bool = False):
    """torch.nn.functional.scaled_dot_product_attention with `self` as the query (..., L, E), key (..., S, E) and
    value (..., S, Ev): softmax(q k^T * scale + mask) @ v, scale = 1/sqrt(E) unless given. A bool `attn_mask`
    (broadcast to (..., L, S)) keeps the positions where it is True; a float one is added to the scores;
    `is_causal` keeps key j <= query i (top-left aligned, as torch). A row with no kept key gives NaN, as torch.
    Dropout (p = dropout_p) is applied whenever dropout_p > 0 (there is no global training flag; nn modules pass
    0 in eval mode), from the project's random stream (Tensor.manual_seed). With `enable_gqa`, a query of Hq heads
    (dim -3) attends to key/value of H heads, Hq a multiple of H: each key/value head serves Hq / H query heads in a
    row (grouped-query attention, as torch).

    On a GPU, a prefill (several queries) without dropout runs as one kernel with an online softmax (Ops.ATTEND):
    the scores are computed in its loop over the keys, never stored. Elsewhere the scores and the probabilities are
    stored, and both products run as matmuls (faster on the CPU, whose matmuls are packed and threaded)."""
    if enable_gqa: key, value = _gqa_heads(self, key), _gqa_heads(self, value)
    if value.shape[-2] != key.shape[-2]:
      raise ShapeError(f"scaled_dot_product_attention: key has {key.shape[-2]} positions (shape {tuple(key.shape)}) "
                       f"but value has {value.shape[-2]} (shape {tuple(value.shape)})")
    if dropout_p == 0 and _fused_attention(self, key, value):
      return attend(attention_scores(self, key, attn_mask, is_causal, scale), value)
    weights = attention_weights(self, key, attn_mask, dropout_p, is_causal, scale)
    return weights @ value.cast(weights.dtype)


def _fused_attention(query, key, value) -> bool:
  """Whether attention runs as one ATTEND kernel: several queries, all on one GPU (not the CPU, not sharded)."""
  dev = query.device
  return (isinstance(dev, str) and not dev.startswith("CPU") and key.device == dev and value.device == dev and
          query.ndim >= 2 and query.shape[-2] != 1 and value.ndim >= 2)


def attend(scores, value):
  """softmax(scores) @ value as one ATTEND kernel: scores (..., L, S), value (..., S, Ev) -> (..., L, Ev), in
  scores' dtype (computed in float32 when that is narrower)."""
  n = max(scores.ndim, value.ndim)
  dt = scores.dtype if scores.dtype.itemsize >= 4 else dtypes.float32
  a = scores.cast(dt).reshape(*(1,) * (n - scores.ndim), *scores.shape[:-1], 1, scores.shape[-1])   # (..., L, 1, S)
  v = value.cast(dt).transpose(-2, -1)
  b = v.reshape(*(1,) * (n - value.ndim), *v.shape[:-2], 1, *v.shape[-2:])                            # (..., 1, Ev, S)
  if a.shape[-1] != b.shape[-1]:
    raise ShapeError(f"scaled_dot_product_attention: {a.shape[-1]} scores per query but value has {b.shape[-1]} "
                     f"positions (shape {tuple(value.shape)})")
  try: type(scores)._broadcast_shape(tuple(a.shape[:-3]), tuple(b.shape[:-3]))
  except ValueError:
    raise ShapeError(f"scaled_dot_product_attention: the batch dims of the scores {tuple(scores.shape)} and of value "
                     f"{tuple(value.shape)} do not broadcast") from None
  out = type(scores)(UOp(Ops.ATTEND, dt, (a.uop, b.uop), a.ndim - 1))
  return out.reshape(*out.shape[:-1]).cast(scores.dtype)


def _gqa_heads(query, kv):
  """key or value with each of its H heads (dim -3) repeated Hq / H times, to match the query's Hq heads."""
  op = "scaled_dot_product_attention"
  if query.ndim < 3 or kv.ndim < 3 or query.shape[-3] == kv.shape[-3]: return kv
  hq, h = query.shape[-3], kv.shape[-3]
  if h == 0 or hq % h:
    raise ShapeError(f"{op}: with enable_gqa the query's {hq} heads (shape {tuple(query.shape)}) must be a multiple "
                     f"of the key/value heads, got {h} (shape {tuple(kv.shape)})")
  lead = kv.shape[:-3]
  grown = kv.unsqueeze(-3).expand(*lead, h, hq // h, *kv.shape[-2:])
  return grown.reshape(*lead, hq, *kv.shape[-2:])


def attention_weights(query, key, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None):
  """The attention probabilities of scaled_dot_product_attention (..., L, S), after dropout."""
  if not 0.0 <= dropout_p <= 1.0: raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p!r}")
  weights = attention_scores(query, key, attn_mask, is_causal, scale).softmax(-1)
  if dropout_p > 0:
    if dropout_p == 1: return weights * 0
    keep = type(weights).rand(*weights.shape, device=weights.device) >= dropout_p
    weights = keep.where(weights * (1 / (1 - dropout_p)), 0.0)
  return weights


def attention_scores(query, key, attn_mask=None, is_causal: bool = False, scale=None):
  """The masked, scaled scores q k^T of scaled_dot_product_attention (..., L, S), before the softmax."""
  op = "scaled_dot_product_attention"
  if query.ndim < 2 or key.ndim < 2:
    raise ShapeError(f"{op}: query and key need at least 2 dims (..., positions, features), got shapes "
                     f"{tuple(query.shape)} and {tuple(key.shape)}")
  if query.shape[-1] != key.shape[-1]:
    raise ShapeError(f"{op}: query and key must have the same feature size, got shapes {tuple(query.shape)} and "
                     f"{tuple(key.shape)}")
  if is_causal and attn_mask is not None:
    raise ArgumentError(f"{op}: give either attn_mask or is_causal=True, not both (as torch)")
  q = query._float()
  L, S, E = q.shape[-2], key.shape[-2], q.shape[-1]
  scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
  scores = (q @ key.cast(q.dtype).transpose(-2, -1)) * scale
  if is_causal:
    rows = type(q).arange(L, dtype=dtypes.int32, device=q.device).reshape(L, 1)
    cols = type(q).arange(S, dtype=dtypes.int32, device=q.device).reshape(1, S)
    scores = (cols <= rows).where(scores, -math.inf)
  if attn_mask is not None:
    if not isinstance(attn_mask, LossOps): attn_mask = type(q)(host_floats(attn_mask, q.device, q.dtype), device=q.device)
    try: type(q)._broadcast_shape(tuple(attn_mask.shape), tuple(scores.shape))
    except ValueError:
      raise ShapeError(f"{op}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' shape "
                       f"{tuple(scores.shape)} (..., L, S)") from None
    scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask.cast(q.dtype)
  return scores
