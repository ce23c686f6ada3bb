"""Neural-network layers and losses on top of Tensor.

A `Module` finds its tensors by walking its attributes: a Tensor attribute is a parameter (trainable,
`requires_grad=True`) unless it was registered with `register_buffer` (running statistics and other
state that is saved but not trained); a Module attribute, or a list/tuple/dict of Modules, is a child.
Names in `state_dict()` are the attribute paths joined by dots ("layers.0.weight").

Initialization follows the usual conventions: Linear and Conv2d draw weight and bias from
U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming-uniform with a=sqrt(5)), Embedding from N(0, 1),
norm layers start at weight 1, bias 0.
"""
from __future__ import annotations
import math
from typing import Iterator
import numpy as np
from baregrad.compiler.dtype import dtypes, to_dtype
from .device_dtypes import host_floats
from .tensor import Tensor
from .composite import ShapeError
from .losses import attention_weights


class StateDictError(ValueError):
  pass


def fresh(value: Tensor) -> Tensor:
  """A realized copy of `value` in a buffer of its own. (A realized graph result may share its buffer with another
  tensor computed from the same graph, e.g. two `zeros(n).contiguous()`; state that is later updated in place
  with `assign` must not be shared.)"""
  out = Tensor.empty(*value.shape, dtype=value.dtype, device=value.device)
  return out.assign(value).realize()


def _param(t: Tensor) -> Tensor:
  t = fresh(t)
  t.requires_grad = True
  return t


def _uniform(shape, bound: float, dtype, device) -> Tensor:
  return Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)


class Module:
  """Base class: subclasses set tensors and child modules as attributes and define `forward`."""
  training = True

  def __call__(self, *args, **kwargs): return self.forward(*args, **kwargs)

  def forward(self, *args, **kwargs):
    raise NotImplementedError(f"{type(self).__name__} does not define forward()")

  def register_buffer(self, name: str, value: Tensor):
    """A tensor that belongs to the state (saved and loaded) but is not trained."""
    self.__dict__.setdefault("_buffer_names", set()).add(name)
    setattr(self, name, value)

  # ---- tree walking
  def _children(self) -> Iterator[tuple[str, object]]:
    for name, v in vars(self).items():
      if name.startswith("_"): continue
      if isinstance(v, (Tensor, Module)): yield name, v
      elif isinstance(v, (list, tuple)):
        for i, item in enumerate(v):
          if isinstance(item, (Tensor, Module)): yield f"{name}.{i}", item
      elif isinstance(v, dict):
        for k, item in v.items():
          if isinstance(item, (Tensor, Module)): yield f"{name}.{k}", item

  def named_tensors(self, prefix: str = "") -> Iterator[tuple[str, Tensor, bool]]:
    """(name, tensor, is_buffer) for every tensor in this module and its children, in attribute order."""
    buffers = self.__dict__.get("_buffer_names", set())
    for name, v in self._children():
      if isinstance(v, Tensor): yield prefix + name, v, name in buffers
      else: yield from v.named_tensors(prefix + name + ".")

  def named_parameters(self) -> list[tuple[str, Tensor]]:
    return [(n, t) for n, t, is_buf in self.named_tensors() if not is_buf]

  def parameters(self) -> list[Tensor]:
    seen, out = set(), []
    for _, t in self.named_parameters():
      if id(t) not in seen: seen.add(id(t)); out.append(t)
    return out

  def modules(self) -> Iterator["Module"]:
    yield self
    for _, v in self._children():
      if isinstance(v, Module): yield from v.modules()

  def train(self, mode: bool = True) -> "Module":
    for m in self.modules(): m.training = mode
    return self

  def eval(self) -> "Module": return self.train(False)

  # ---- state
  def state_dict(self) -> dict[str, Tensor]:
    """Every parameter and buffer by name (the module's own tensors, not copies)."""
    return {name: t for name, t, _ in self.named_tensors()}

  def load_state_dict(self, state: dict, strict: bool = True) -> "Module":
    """Copy values (Tensors or numpy arrays) into this module's tensors, in place, so optimizers and jitted
    functions holding them see the new values. Shapes and dtypes must match exactly. With strict=True, missing
    and unexpected names are errors; with strict=False they are skipped."""
    own = self.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if strict and (missing or unexpected):
      parts = ([f"missing keys {missing}"] if missing else []) + ([f"unexpected keys {unexpected}"] if unexpected else [])
      raise StateDictError(f"load_state_dict for {type(self).__name__}: " + "; ".join(parts))
    values = []   # every entry is checked before anything is written, so a failed load changes nothing
    for name, t in own.items():
      if name not in state: continue
      v = state[name]
      if isinstance(v, np.ndarray):
        try: vdt = to_dtype(v.dtype)
        except TypeError: raise StateDictError(f"load_state_dict: {name!r} has unsupported numpy dtype {v.dtype}") from None
        shape = tuple(v.shape)
      elif isinstance(v, Tensor): vdt, shape = v.dtype, tuple(v.shape)
      else: raise StateDictError(f"load_state_dict: {name!r} must be a Tensor or a numpy array, got {type(v).__name__}")
      if shape != tuple(t.shape):
        raise StateDictError(f"load_state_dict: {name!r} has shape {shape} in the state dict but {tuple(t.shape)} in the "
                             f"model")
      if vdt != t.dtype:
        raise StateDictError(f"load_state_dict: {name!r} has dtype {vdt.name} in the state dict but {t.dtype.name} in "
                             f"the model; cast it first")
      if v is not t: values.append((t, v))
    for t, v in values:
      value = Tensor(v, device=t.device) if isinstance(v, np.ndarray) else v.to(t.device)
      t.assign(value.contiguous() if value.uop is t.uop else value)
    if values: Tensor.realize(*[t for t, _ in values])
    return self

  def __repr__(self):
    inner = ", ".join(f"{n}={tuple(t.shape)}" for n, t, _ in self.named_tensors())
    return f"{type(self).__name__}({inner})"


class Sequential(Module):
  """Calls its layers (Modules or plain functions such as Tensor.relu) in order."""
  def __init__(self, *layers):
    self.layers = list(layers)
  def forward(self, x):
    for layer in self.layers: x = layer(x)
    return x
  def __getitem__(self, i): return self.layers[i]
  def __len__(self): return len(self.layers)


class Linear(Module):
  def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None, device=None):
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    bound = 1 / math.sqrt(in_features) if in_features else 0.0
    self.weight = _param(_uniform((out_features, in_features), bound, dt, device))
    self.bias = _param(_uniform((out_features,), bound, dt, device)) if bias else None
    self.in_features, self.out_features = in_features, out_features

  def forward(self, x: Tensor) -> Tensor:
    if x.shape[-1] != self.in_features:
      raise ValueError(f"Linear({self.in_features}, {self.out_features}): input of shape {tuple(x.shape)} has "
                       f"{x.shape[-1]} features in its last dim, expected {self.in_features}")
    out = x @ self.weight.T
    return out + self.bias if self.bias is not None else out


class Conv2d(Module):
  def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups=1,
               bias: bool = True, dtype=None, device=None):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"Conv2d: in_channels {in_channels} and out_channels {out_channels} must be divisible by "
                       f"groups {groups}")
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    fan_in = in_channels // groups * kh * kw
    bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
    self.weight = _param(_uniform((out_channels, in_channels // groups, kh, kw), bound, dt, device))
    self.bias = _param(_uniform((out_channels,), bound, dt, device)) if bias else None
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

  def forward(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class BatchNorm2d(Module):
  """Training: normalize with the batch's mean and biased variance over (N, H, W) and update the running
  statistics in place (running = (1 - momentum) * running + momentum * batch, the running variance from the
  unbiased batch variance). Eval: normalize with the running statistics."""
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
               track_running_stats: bool = True, dtype=None, device=None):
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.weight = _param(Tensor.ones(num_features, dtype=dt, device=device)) if affine else None
    self.bias = _param(Tensor.zeros(num_features, dtype=dt, device=device)) if affine else None
    self.track_running_stats = track_running_stats
    if track_running_stats:
      self.register_buffer("running_mean", fresh(Tensor.zeros(num_features, dtype=dt, device=device)))
      self.register_buffer("running_var", fresh(Tensor.ones(num_features, dtype=dt, device=device)))
      self.register_buffer("num_batches_tracked", fresh(Tensor.zeros(1, dtype=dtypes.int32, device=device)))

  def forward(self, x: Tensor) -> Tensor:
    if x.ndim != 4 or x.shape[1] != self.num_features:
      raise ValueError(f"BatchNorm2d({self.num_features}): expected an (N, {self.num_features}, H, W) input, got shape "
                       f"{tuple(x.shape)}")
    shape = (1, self.num_features, 1, 1)
    if self.training or not self.track_running_stats:
      mean = x.mean((0, 2, 3))
      centered = x - mean.reshape(shape)
      var = (centered * centered).mean((0, 2, 3))
      if self.training and self.track_running_stats:
        n = x.numel() // self.num_features
        m = self.momentum
        unbiased = var.detach() * (n / max(n - 1, 1))
        self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
        self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    else:
      mean, var = self.running_mean, self.running_var
      centered = x - mean.reshape(shape)
    out = centered * (var + self.eps).rsqrt().reshape(shape)
    if self.weight is not None: out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
    return out


class LayerNorm(Module):
  def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, dtype=None, device=None):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.eps = eps
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    self.weight = _param(Tensor.ones(*self.normalized_shape, dtype=dt, device=device)) if elementwise_affine else None
    self.bias = _param(Tensor.zeros(*self.normalized_shape, dtype=dt, device=device)) if elementwise_affine else None

  def forward(self, x: Tensor) -> Tensor:
    return x.layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(Module):
  def __init__(self, num_embeddings: int, embedding_dim: int, dtype=None, device=None):
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.weight = _param(Tensor.randn(num_embeddings, embedding_dim, dtype=dt, device=device))

  def forward(self, idx: Tensor) -> Tensor:
    """The rows of `weight` that `idx` names. Indices are not range-checked (that would wait for idx on every call):
    an index outside [0, num_embeddings) gives a row of zeros; `weight[idx]` checks (IndexError) and waits."""
    if not isinstance(idx, Tensor): idx = Tensor(np.asarray(idx, dtype=np.int32), device=self.weight.device)
    if not idx.dtype.is_int: raise TypeError(f"Embedding: indices must be integers, got {idx.dtype.name}")
    # one-hot rows times the table: a gather whose gradient is a scatter-add into the used rows
    onehot = idx.reshape(*idx.shape, 1) == Tensor.arange(self.num_embeddings, device=idx.device)
    return (onehot.reshape(*onehot.shape, 1).where(self.weight, 0.0)).sum(-2)


class Dropout(Module):
  """Zero each element with probability p and scale the rest by 1/(1-p) while training; identity in eval.
  Inside a jitted function the random mask is drawn at capture time and repeats on every replay."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
    self.p = p

  def forward(self, x: Tensor) -> Tensor:
    if not self.training or self.p == 0: return x
    if self.p == 1: return x * 0
    keep = Tensor.rand(*x.shape, device=x.device) >= self.p
    return keep.where(x * (1 / (1 - self.p)), 0.0)


# ---------------------------------------------------------------- attention

def _additive_mask(mask, dtype, device, op: str, name: str) -> Tensor:
  """torch's MultiheadAttention masks as one float mask to add to the scores: a bool mask is True where a
  position may NOT be attended (-inf there, 0 elsewhere); a float mask is added as it is."""
  if not isinstance(mask, Tensor): mask = Tensor(host_floats(mask, device, dtype), device=device)
  if mask.dtype.is_bool: return mask.where(-math.inf, 0.0).cast(dtype)
  if not mask.dtype.is_float:
    raise TypeError(f"{op}: {name} must be a bool or float tensor, got {mask.dtype.name}")
  return mask.cast(dtype)


class MultiheadAttention(Module):
  """torch.nn.MultiheadAttention: the parameters have torch's names and layouts (`in_proj_weight` (3E, E) packs
  the query, key and value projections in that order, `in_proj_bias` (3E,), `out_proj.weight`, `out_proj.bias`),
  so a torch state_dict loads by name; they are initialized as torch does (Xavier-uniform in_proj_weight, zero
  biases). kdim/vdim different from embed_dim and add_bias_kv are not supported.

  Differences from torch: `batch_first` defaults to True (inputs (N, L, E)); `key` and `value` default to the
  query (self-attention); `is_causal=True` without an `attn_mask` builds the causal mask (torch asks for the
  mask too). Masks as torch: a bool `attn_mask` ((L, S) or (N * num_heads, L, S)) or `key_padding_mask` (N, S) is
  True where attention is NOT allowed; a float one is added to the scores. Dropout on the attention weights only
  while training."""
  def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, batch_first: bool = True,
               dtype=None, device=None):
    if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
      raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be a positive multiple of num_heads "
                       f"({num_heads})")
    if not 0 <= dropout <= 1: raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
    self.dropout, self.batch_first = dropout, batch_first
    # xavier_uniform_ on (3E, E): bound sqrt(6 / (fan_in + fan_out))
    self.in_proj_weight = _param(_uniform((3 * embed_dim, embed_dim), math.sqrt(6 / (4 * embed_dim)), dt, device))
    self.in_proj_bias = _param(Tensor.zeros(3 * embed_dim, dtype=dt, device=device)) if bias else None
    self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dt, device=device)
    if bias: self.out_proj.bias = _param(Tensor.zeros(embed_dim, dtype=dt, device=device))

  def _project(self, x: Tensor, part: int, parts: int = 1) -> Tensor:
    """x @ W.T + b for rows [part * E, (part + parts) * E) of the packed projection."""
    E = self.embed_dim
    rows = (part * E, (part + parts) * E)
    w = self.in_proj_weight if parts == 3 else self.in_proj_weight.shrink((rows, None))
    out = x @ w.T
    if self.in_proj_bias is None: return out
    return out + (self.in_proj_bias if parts == 3 else self.in_proj_bias.shrink((rows,)))

  def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, key_padding_mask=None,
              need_weights: bool = True, attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
    """Returns (attn_output, attn_weights): the output has the query's shape; the weights (None unless
    need_weights) are (N, L, S) averaged over heads, or (N, num_heads, L, S)."""
    op = f"MultiheadAttention({self.embed_dim}, {self.num_heads})"
    key = query if key is None else key
    value = key if value is None else value
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
      raise ShapeError(f"{op}: query, key and value must all be batched 3-D or unbatched 2-D, got shapes "
                       f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    for name, t in (("query", query), ("key", key), ("value", value)):
      if t.shape[-1] != self.embed_dim:
        raise ShapeError(f"{op}: {name} of shape {tuple(t.shape)} must have {self.embed_dim} features in its last dim")
    batched = query.ndim == 3
    same = query is key and key is value
    if not batched: query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    elif not self.batch_first: query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    N, L, E = query.shape
    S, H, D = key.shape[1], self.num_heads, self.head_dim
    if key.shape[0] != N or value.shape[0] != N or value.shape[1] != S:
      raise ShapeError(f"{op}: query, key and value disagree on the batch or key length: shapes {tuple(query.shape)}, "
                       f"{tuple(key.shape)}, {tuple(value.shape)} (as (N, L, E))")
    if same: q, k, v = self._project(query, 0, 3).split(E, dim=-1)
    else: q, k, v = self._project(query, 0), self._project(key, 1), self._project(value, 2)
    q, k, v = (t.reshape(N, -1, H, D).permute(0, 2, 1, 3) for t in (q, k, v))   # (N, H, positions, D)
    mask = None
    if attn_mask is not None:
      mask = _additive_mask(attn_mask, q.dtype, q.device, op, "attn_mask")
      if mask.shape == (L, S): mask = mask.reshape(1, 1, L, S)
      elif mask.shape == (N * H, L, S): mask = mask.reshape(N, H, L, S)
      else:
        raise ShapeError(f"{op}: attn_mask must have shape ({L}, {S}) or ({N * H}, {L}, {S}), got {tuple(mask.shape)}")
    if key_padding_mask is not None:
      kpm = _additive_mask(key_padding_mask, q.dtype, q.device, op, "key_padding_mask")
      want = (N, S) if batched else (S,)
      if kpm.shape != want: raise ShapeError(f"{op}: key_padding_mask must have shape {want}, got {tuple(kpm.shape)}")
      kpm = kpm.reshape(N, 1, 1, S)
      mask = kpm if mask is None else mask + kpm
    causal = is_causal and attn_mask is None
    if causal and mask is not None:   # merge the causal mask into the others
      rows = Tensor.arange(L, dtype=dtypes.int32, device=q.device).reshape(L, 1)
      cols = Tensor.arange(S, dtype=dtypes.int32, device=q.device).reshape(1, S)
      mask, causal = mask + (cols > rows).where(-math.inf, 0.0).cast(q.dtype), False
    weights = attention_weights(q, k, mask, self.dropout if self.training else 0.0, causal)
    out = (weights @ v).permute(0, 2, 1, 3).reshape(N, L, E)
    out = self.out_proj(out)
    if not batched: out = out.reshape(L, E)
    elif not self.batch_first: out = out.transpose(0, 1)
    if not need_weights: return out, None
    if average_attn_weights: weights = weights.mean(1)
    return out, (weights if batched else weights.reshape(*weights.shape[1:]))


class TransformerBlock(Module):
  """A pre-LayerNorm transformer block on (N, L, dim) inputs:

      x = x + self_attn(norm1(x))            (causal by default)
      x = x + linear2(gelu(linear1(norm2(x))))

  The names and layouts are those of torch.nn.TransformerEncoderLayer(dim, num_heads, dim_feedforward,
  activation="gelu", norm_first=True, batch_first=True), so its state_dict loads by name; GELU is the exact (erf)
  form, as torch's. `dropout` as torch (on the attention weights, after attention, after the GELU and after
  linear2), only while training. forward's `attn_mask` (torch's MultiheadAttention convention: a bool mask is True
  where attention is NOT allowed) replaces the causal mask; `key_padding_mask` is added to it."""
  def __init__(self, dim: int, num_heads: int, dim_feedforward: int | None = None, dropout: float = 0.0,
               causal: bool = True, bias: bool = True, eps: float = 1e-5, dtype=None, device=None):
    hidden = 4 * dim if dim_feedforward is None else dim_feedforward
    self.self_attn = MultiheadAttention(dim, num_heads, dropout=dropout, bias=bias, batch_first=True, dtype=dtype,
                                        device=device)
    self.linear1 = Linear(dim, hidden, bias=bias, dtype=dtype, device=device)
    self.linear2 = Linear(hidden, dim, bias=bias, dtype=dtype, device=device)
    self.norm1 = LayerNorm(dim, eps=eps, dtype=dtype, device=device)
    self.norm2 = LayerNorm(dim, eps=eps, dtype=dtype, device=device)
    self.dropout, self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
    self.dim, self.causal = dim, causal

  def forward(self, x: Tensor, attn_mask=None, key_padding_mask=None) -> Tensor:
    if x.ndim != 3 or x.shape[-1] != self.dim:
      raise ShapeError(f"TransformerBlock({self.dim}): expected an (N, L, {self.dim}) input, got {tuple(x.shape)}")
    h = self.norm1(x)
    a, _ = self.self_attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False, attn_mask=attn_mask,
                          is_causal=self.causal)
    x = x + self.dropout1(a)
    h = self.linear2(self.dropout(self.linear1(self.norm2(x)).gelu()))
    return x + self.dropout2(h)


# ---------------------------------------------------------------- losses

def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  if reduction == "none": return loss
  raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def cross_entropy(logits: Tensor, labels, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
  """Softmax cross-entropy of (N, C) logits (or (C,), or (N, C, d...) with classes on dim 1) against integer
  class labels of shape (N,) (or (), or (N, d...)). Labels are not range-checked on the device: a label outside
  [0, C) contributes a loss of 0 (plus the smoothing term)."""
  if not isinstance(labels, Tensor): labels = Tensor(np.asarray(labels, dtype=np.int32), device=logits.device)
  if not labels.dtype.is_int: raise TypeError(f"cross_entropy: labels must be integer class indices, got {labels.dtype.name}")
  if logits.ndim == 0: raise ValueError("cross_entropy: logits must have a class dim")
  if logits.ndim > 2:   # classes on dim 1: move them last
    logits = logits.permute(0, *range(2, logits.ndim), 1)
  want = tuple(logits.shape[:-1])
  if tuple(labels.shape) != want:
    raise ValueError(f"cross_entropy: labels of shape {tuple(labels.shape)} do not match logits of shape "
                     f"{tuple(logits.shape)} (expected labels of shape {want})")
  num_classes = logits.shape[-1]
  logp = logits.log_softmax(-1)
  picked = (labels.one_hot(num_classes).cast(logp.dtype) * logp).sum(-1)
  loss = -picked
  if label_smoothing:
    loss = loss * (1 - label_smoothing) - logp.mean(-1) * label_smoothing
  return _reduce(loss, reduction, "cross_entropy")


def mse_loss(pred: Tensor, target, reduction: str = "mean") -> Tensor:
  if not isinstance(target, Tensor): target = Tensor(np.asarray(target), dtype=pred.dtype, device=pred.device)
  if tuple(target.shape) != tuple(pred.shape):
    raise ValueError(f"mse_loss: target shape {tuple(target.shape)} differs from prediction shape {tuple(pred.shape)}")
  d = pred - target
  return _reduce(d * d, reduction, "mse_loss")


__all__ = ["Module", "Sequential", "Linear", "Conv2d", "BatchNorm2d", "LayerNorm", "Embedding", "Dropout",
           "MultiheadAttention", "TransformerBlock", "cross_entropy", "mse_loss", "StateDictError"]
