"""@function: trace a Python function on Tensors once into a graph over placeholder params, then reuse that graph.

    @function
    def block(x, w): return (x @ w).relu(), x.sum()

    y, s = block(a, w1)        # traced: the body runs once, on placeholders
    y2, s2 = block(b, w2)      # same structure: the traced graph with b, w2 put in the placeholders' place

The first call with a new structure -- the shapes, dtypes and devices of the Tensor arguments (and a sharded one's
layout) and the values of the other arguments -- runs the body on placeholder Tensors: each is a BUFFER node whose
arg is a `Placeholder` (no memory), shaped as the argument. The outputs are lazy graphs over those placeholders;
they are kept, with their nodes in order. A later call with that structure puts the arguments' graphs in the
placeholders' place (no Python body runs) and returns lazy Tensors, as the body would have: they fuse with what
uses them, realize when asked, and carry gradients back to the arguments. The graph being the same, the
schedule cache (compiler/schedule.py) hands out the same kernels: same structure, same kernels, as the JIT.

Outputs may be a Tensor or (nested) tuples/lists of them; functions may call other functions (the inner one is
traced on the outer's placeholders). Like the JIT, a trace reads the Tensors the body takes from elsewhere (weights
in a closure) as they were at the trace: realize them first, and assign() to them keeps working (the graph reads
their buffers). Random numbers drawn in the body repeat on every call.
"""
from __future__ import annotations
import functools, itertools
from dataclasses import dataclass
from baregrad.compiler.uop import UOp, Ops
from .tensor import Tensor
from . import multi as _multi
from .jit import _structure, _unflatten   # the output structure of a traced function, as the JIT keeps it

_ids = itertools.count()


@dataclass(frozen=True)
class Placeholder:
  """What a BUFFER node stands for in a traced graph: Tensor argument `index` of trace `trace` (for an argument on
  several devices, its `part` on one of them). It has no memory: a body that realizes it is told so."""
  trace: int
  index: int
  part: int
  size: int
  dtype: object
  device: str

  _mem = None     # (no memory: hcq's runtime calls ensure_allocated for a buffer whose _mem is None)

  def ensure_allocated(self):
    raise FunctionError(f"@function: the body realized a value computed from its Tensor argument {self.index} (a "
                        f"placeholder while tracing): .numpy(), .item() and Python decisions on values cannot be traced")


class FunctionError(ValueError):
  pass


@dataclass
class Trace:
  params: list            # the placeholder UOp of each Tensor argument, in order
  outputs: list           # the traced output UOps
  order: list             # the nodes of the outputs' graph, sources first (substitute walks it)
  structure: object       # how the outputs nest


class function:
  def __init__(self, fn):
    self.fn = fn
    self.traces: dict = {}          # structure of the arguments -> Trace
    self.trace_count = 0            # how many times the body ran
    functools.update_wrapper(self, fn)

  def __call__(self, *args, **kwargs):
    tensors, key = _split(args, kwargs)
    trace = self.traces.get(key)
    if trace is None: trace = self.traces[key] = self._trace(args, kwargs, tensors)
    mapping: dict[UOp, UOp] = {}
    for p, t in zip(trace.params, tensors): _bind(p, t.uop, mapping)
    done: dict[UOp, UOp] = {}
    for n in trace.order:
      if n in mapping: done[n] = mapping[n]; continue
      src = tuple(done[s] for s in n.src)
      done[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
    return _unflatten(trace.structure, [Tensor(done[o]) for o in trace.outputs])

  def _trace(self, args, kwargs, tensors) -> Trace:
    trace_id = next(_ids)
    params, it = [], iter(range(len(tensors)))
    def placeholder(t: Tensor) -> Tensor:
      u = _placeholder(t, trace_id, next(it))
      params.append(u)
      return Tensor(u)
    new_args = [placeholder(a) if isinstance(a, Tensor) else a for a in args]
    new_kwargs = {k: placeholder(v) if isinstance(v, Tensor) else v for k, v in sorted(kwargs.items())}
    self.trace_count += 1
    out = self.fn(*new_args, **new_kwargs)
    outs = _flatten(out, self.fn.__name__)
    order = UOp.sink(*[o.uop for o in outs]).toposort()[:-1] if outs else []
    return Trace(params, [o.uop for o in outs], order, _structure(out))


def _placeholder(t: Tensor, trace: int, index: int, part: int = 0) -> UOp:
  """A BUFFER node standing for Tensor argument `t` (on several devices: one per device, in t's layout)."""
  if isinstance(t.device, tuple):
    if t.uop.op is not Ops.MULTI: t.realize()
    axis, bounds = t.uop.arg
    parts = [_placeholder(Tensor(s), trace, index, i) for i, s in enumerate(t.uop.src)]
    return _multi.multi_uop(parts, axis, bounds)
  n = t.numel()
  u = UOp(Ops.BUFFER, t.dtype, (), Placeholder(trace, index, part, n, t.dtype, t.device))
  return u if t.shape == (n,) else UOp(Ops.RESHAPE, t.dtype, (u,), t.shape)


def _bind(param: UOp, actual: UOp, mapping: dict):
  """Put `actual` in the place of placeholder `param` -- and of its BUFFER, which views of it reach directly
  (Tensor.reshape folds reshapes of reshapes)."""
  mapping[param] = actual
  if param.op is Ops.MULTI:
    for p, a in zip(param.src, actual.src): _bind(p, a, mapping)
  elif param.op is Ops.RESHAPE: mapping[param.src[0]] = _multi._reshape(actual, param.src[0].shape)


def _split(args, kwargs):
  """The Tensor arguments in order, and the key of the call's structure."""
  tensors, key = [], []
  for k, a in list(enumerate(args)) + sorted(kwargs.items()):
    if isinstance(a, Tensor):
      if isinstance(a.device, tuple) and a.uop.op is not Ops.MULTI: a.realize()   # its layout is part of the key
      tensors.append(a)
      layout = a.uop.arg if isinstance(a.device, tuple) and a.uop.op is Ops.MULTI else None
      key.append((k, "tensor", a.shape, a.dtype, a.device, layout))
    else: key.append((k, "value", _freeze(a)))
  return tensors, tuple(key)


def _freeze(a):
  if isinstance(a, (list, tuple)): return (type(a).__name__,) + tuple(_freeze(x) for x in a)
  if isinstance(a, dict): return ("dict",) + tuple(sorted((k, _freeze(v)) for k, v in a.items()))
  try:
    hash(a); return a
  except TypeError:
    raise FunctionError(f"@function: argument {a!r} is neither a Tensor nor hashable: it cannot key a trace") from None


def _flatten(out, name: str) -> list:
  if isinstance(out, Tensor): return [out]
  if isinstance(out, (tuple, list)): return [t for o in out for t in _flatten(o, name)]
  if out is None: return []
  raise FunctionError(f"@function {name} must return Tensors (or tuples/lists of them), got {type(out).__name__}")


__all__ = ["function", "FunctionError", "Placeholder"]
