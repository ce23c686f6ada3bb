"""Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW.

`step()` writes the new parameter values into the parameters' own buffers with `assign`, so a jitted training
step (forward, backward and step inside one `jit`) keeps updating the same buffers on every replay. Everything
that changes from step to step lives in device buffers, not in Python numbers: the state (momentum, moments),
Adam's running powers beta^t for the bias correction, and the learning rate (setting `opt.lr = x` writes the
buffer, so a schedule works with a jitted step too).

A step runs two schedules: first the gradients (and whatever is passed to `step(...)`, such as the loss) are
realized from the current parameters; then the state and the parameters are assigned. In the second one an
update reads its state through the assigned tensor (`m` after `m.assign(...)`), so it sees the new state, as
assigns in one schedule order readers of a buffer after the write.
"""
from __future__ import annotations
from baregrad.compiler.dtype import dtypes
from .tensor import Tensor


def _fresh(value: Tensor) -> Tensor:
  """A realized copy of `value` in a buffer of its own (realized results of identical graphs may share a buffer,
  and optimizer state is updated in place)."""
  return Tensor.empty(*value.shape, dtype=value.dtype, device=value.device).assign(value).realize()


def _zeros_like(p: Tensor) -> Tensor:
  return _fresh(Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device))


def _scalar_buffer(value: float, device: str, dtype=dtypes.float32) -> Tensor:
  return _fresh(Tensor.full((1,), float(value), dtype=dtype, device=device))


def _like(scalar: Tensor, p: Tensor) -> Tensor:
  """A 1-element state tensor as p's dtype, broadcastable against p."""
  s = scalar.cast(p.dtype) if p.dtype != scalar.dtype else scalar
  return s.reshape(*([1] * p.ndim)) if p.ndim else s.reshape(())


class Optimizer:
  def __init__(self, params, lr: float):
    params = list(params)
    if not params: raise ValueError(f"{type(self).__name__}: got an empty parameter list")
    seen, self.params = set(), []
    for p in params:
      if not isinstance(p, Tensor): raise TypeError(f"{type(self).__name__}: parameters must be Tensors, got {type(p).__name__}")
      if not p.dtype.is_float: raise TypeError(f"{type(self).__name__}: parameter of dtype {p.dtype.name} is not a float tensor")
      if id(p) in seen: continue
      seen.add(id(p))
      if not p.requires_grad: p.requires_grad = True
      self.params.append(p.realize())
    if lr < 0: raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {lr}")
    self.device = self.params[0].device
    # scalar state (lr, beta powers) in float64 when a parameter is float64, else float32
    self.scalar_dtype = dtypes.float64 if any(p.dtype == dtypes.float64 for p in self.params) else dtypes.float32
    self._lr = self._scalar(lr)

  def _scalar(self, value: float) -> Tensor: return _scalar_buffer(value, self.device, self.scalar_dtype)

  @property
  def lr(self) -> float: return float(self._lr.numpy()[0])
  @lr.setter
  def lr(self, value: float):
    if value < 0: raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {value}")
    self._lr.assign(float(value)).realize()

  def zero_grad(self):
    for p in self.params: p.grad = None

  def state_tensors(self) -> list[Tensor]:
    """Every buffer of optimizer state."""
    return [self._lr]

  def step(self, *realize_with: Tensor):
    """Update every parameter that has a gradient, in place. Tensors in `realize_with` (the loss, metrics) are
    realized together with the gradients, from the parameters before the update: `opt.step(loss)` after
    `loss.backward()` computes the forward pass once."""
    live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
    grads = []
    for _, p in live:
      g = p.grad if p.grad.shape == p.shape else p.grad.reshape(p.shape)
      p.grad = g.cast(p.dtype) if g.dtype != p.dtype else g
      grads.append(p.grad)
    if realize_with or grads: Tensor.realize(*realize_with, *grads)
    if not live: return
    self._pre_step()
    for i, p in live: p.assign(self._update(i, p, p.grad.detach()))
    Tensor.realize(*self.params, *self.state_tensors())

  def _pre_step(self):
    """Assign state shared by all parameters (read through the assigned tensors by `_update`)."""

  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    """Assign this parameter's state; return its new value."""
    raise NotImplementedError


class SGD(Optimizer):
  """p -= lr * d with d = g + weight_decay * p; with momentum the buffer b = momentum * b + (1 - dampening) * d
  (b = d on the first step) and d = b, or d + momentum * b with nesterov."""
  def __init__(self, params, lr: float = 0.001, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    if momentum < 0: raise ValueError(f"SGD: momentum must be >= 0, got {momentum}")
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")
    self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov
    self.bufs = [_zeros_like(p) for p in self.params] if momentum else []
    # 0 before the first step (the buffer starts as d), 1 after
    self._started = self._scalar(0.0) if momentum else None

  def state_tensors(self):
    return super().state_tensors() + self.bufs + ([self._started] if self._started is not None else [])

  def _update(self, i, p, g):
    d = g + p * self.weight_decay if self.weight_decay else g
    if self.momentum:
      buf, started = self.bufs[i], _like(self._started, p)
      buf.assign(started * (buf * self.momentum + d * (1 - self.dampening)) + (1 - started) * d)
      d = d + buf * self.momentum if self.nesterov else buf
    return p - _like(self._lr, p) * d

  def step(self, *realize_with: Tensor):
    super().step(*realize_with)
    if self._started is not None and any(p.grad is not None for p in self.params):
      self._started.assign(1.0).realize()


class Adam(Optimizer):
  """Adam (Kingma & Ba, 2015); weight_decay adds weight_decay * p to the gradient (L2). AdamW decouples it."""
  decoupled = False

  def __init__(self, params, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
    super().__init__(params, lr)
    self.b1, self.b2 = float(betas[0]), float(betas[1])
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1): raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
    self.eps, self.weight_decay = eps, weight_decay
    self.m = [_zeros_like(p) for p in self.params]
    self.v = [_zeros_like(p) for p in self.params]
    self._b1_pow, self._b2_pow = self._scalar(1.0), self._scalar(1.0)   # beta^t

  def state_tensors(self):
    return super().state_tensors() + self.m + self.v + [self._b1_pow, self._b2_pow]

  def _pre_step(self):
    self._b1_pow.assign(self._b1_pow * self.b1)
    self._b2_pow.assign(self._b2_pow * self.b2)

  def _update(self, i, p, g):
    lr = _like(self._lr, p)
    if self.weight_decay and not self.decoupled: g = g + p * self.weight_decay
    m, v = self.m[i], self.v[i]
    m.assign(m * self.b1 + g * (1 - self.b1))
    v.assign(v * self.b2 + g * g * (1 - self.b2))
    m_hat = m / (1 - _like(self._b1_pow, p))
    v_hat = v / (1 - _like(self._b2_pow, p))
    base = p * (1 - lr * self.weight_decay) if self.weight_decay and self.decoupled else p
    return base - lr * m_hat / (v_hat.sqrt() + self.eps)


class AdamW(Adam):
  """Adam with decoupled weight decay (Loshchilov & Hutter, 2019): p *= 1 - lr * weight_decay before the step."""
  decoupled = True

  def __init__(self, params, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
    super().__init__(params, lr, betas, eps, weight_decay)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
