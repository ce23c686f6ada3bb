"""jit: capture a function's kernels once, then replay them on prebuilt, bound command queues.

    @jit
    def step(x, w): return (x @ w).relu()

Call 1 runs normally (and compiles). Call 2 runs normally too, capturing the ExecItems it produces into a
GraphExecutor. Later calls realize the Tensor arguments, patch their addresses (and fresh output buffers,
and the values of bound Variables) into the prebuilt queues and submit them: no scheduling, no compiling.
Tensor arguments must keep the shape, dtype and device of the captured call; other arguments must not
change (both raise a clear error). Random numbers drawn inside the function repeat on every replay.
A function whose kernels and copies span several devices (sharded tensors, collectives: tensor/multi.py) replays
on the queues of all of them (hcq/multigraph.py), ordered by signals across devices. Host work inside the function
(a collective across processes, tensor/distributed.py) is captured as a host step: a replay runs the device work
before it from prebuilt queues, the host step, then the device work after it (hcq/segmented.py)."""
from __future__ import annotations
import functools, weakref
from baregrad.compiler.uop import UOp, Ops
from baregrad.compiler.schedule import fresh_views
from baregrad.hcq import runtime
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.device import Device
from baregrad.hcq.graph import GraphExecutor
from baregrad.hcq.multigraph import MultiGraphExecutor
from baregrad.hcq.segmented import HostStep, SegmentedGraph, copy_buffer as segmented_copy
from baregrad.compiler import shape as sym
from .tensor import Tensor, Variable, _is_realized
from . import tensor as _tensor
from . import multi as _multi


class JitError(ValueError):
  pass


class jit:
  def __init__(self, fn):
    self.fn = fn
    self.calls = 0
    self.graph: GraphExecutor | None = None
    self.signature = None
    self.out_meta = None
    self.range_checks: list = []      # (start, end, size) of symbolic views to check at each replay's values
    functools.update_wrapper(self, fn)

  def reset(self):
    self.calls, self.graph, self.signature, self.out_meta, self.range_checks = 0, None, None, None, []
    self._checked = None

  # A replay whose Tensor arguments are the realized nodes the last replay checked (weak references: the check holds
  # no memory) skips realizing and checking them again, and reads their buffers straight off the nodes; not while a
  # write is pending (an assign runs with the next realize, which the replay then is)
  _checked = None

  def _same_inputs(self, tensors) -> bool:
    checked = self._checked
    return (checked is not None and len(checked) == len(tensors) and not _tensor._pending_assigns
            and all(r() is t.uop for r, t in zip(checked, tensors)))

  def _note_inputs(self, tensors) -> None:
    """Remember the argument nodes of a replay that checked them, where each is a whole realized buffer
    (_whole_buffer); otherwise forget (the next replay checks them)."""
    ok = all(_whole_buffer(t.uop) is not None for t in tensors)
    self._checked = [weakref.ref(t.uop) for t in tensors] if ok else None

  def _split(self, args, kwargs):
    tensors, var_vals, static = [], {}, []
    for k, a in list(enumerate(args)) + sorted(kwargs.items()):
      if isinstance(a, Tensor): tensors.append(a); static.append((k, "tensor"))
      elif isinstance(a, UOp) and a.op is Ops.BIND:    # a bound Variable: its value is patched into the replay
        var_vals[a.src[0].arg[0]] = a.src[1].arg; static.append((k, "var", a.src[0].arg[0]))
      else: static.append((k, "value", _freeze(a)))
    return tensors, var_vals, tuple(static)

  def _check(self, tensors, static):
    sig = tuple((tuple(sym.unbind(d) for d in t.shape), t.dtype, t.device, _layout(t)) for t in tensors)
    if self.signature is None:
      self.signature = (sig, static)
      return
    want_sig, want_static = self.signature
    if len(static) != len(want_static):
      raise JitError(f"jitted {self.fn.__name__}: called with {len(static)} arguments, captured with {len(want_static)}")
    for (a, b) in zip(static, want_static):
      if a != b:
        raise JitError(f"jitted {self.fn.__name__}: argument {a[0]!r} changed from {b[1:]!r} to {a[1:]!r}; non-tensor "
                       f"arguments are baked into the captured kernels (call .reset() to capture again)")
    for i, (got, want) in enumerate(zip(sig, want_sig)):
      if got != want:
        k = next(k for k in range(4) if got[k] != want[k])
        what = ("shape", "dtype", "device", "layout on its devices (shard axis, bounds)")[k]
        raise JitError(f"jitted {self.fn.__name__}: tensor argument {i} has {what} {got[k]}, captured with {want[k]}; "
                       f"call .reset() to capture again")

  def __call__(self, *args, **kwargs):
    """Thread-safe: calls from several threads run one at a time (under Device.lock), each with its own outputs."""
    with Device.lock: return self._call(args, kwargs)

  def _call(self, args, kwargs):
    if self.graph is not None and any(Device._open.get(d.name) is not d for d in _graph_devices(self.graph)):
      self.reset()     # a device was closed (or belongs to the parent of this forked process): capture anew
    tensors, var_vals, static = self._split(args, kwargs)
    if self.calls == 2 and self._same_inputs(tensors) and static == self.signature[1]:
      return self._replay(tensors, var_vals, [_whole_buffer(t.uop) for t in tensors])
    if tensors: Tensor.realize(*tensors)
    self._check(tensors, static)
    if self.calls == 0:
      self.calls = 1
      return _realize_outputs(self.fn(*args, **kwargs))
    if self.calls == 1:
      serial = Buffer.serial
      runtime.capturing = captured = []
      _tensor.range_checks = self.range_checks = []
      try:
        with fresh_views(): out = _realize_outputs(self.fn(*args, **kwargs))
      finally:
        runtime.capturing = _tensor.range_checks = None
      outs = _flatten(out)
      if not captured: raise JitError(f"jitted {self.fn.__name__} ran no kernels: nothing to capture")
      in_bufs = [b for t in tensors for b in t._buffers()]
      out_bufs = [b for t in outs for b in t._buffers()]
      if any(isinstance(it, HostStep) for it in captured):     # host work between device parts (hcq/segmented.py)
        self.graph = SegmentedGraph(captured, in_bufs, out_bufs, serial)
        _own_copies(outs, self.graph.copied_outputs)
      else:
        several = len({b.device for it in captured for b in it.bufs}) > 1
        self.graph = (MultiGraphExecutor if several else GraphExecutor)(captured, in_bufs, out_bufs, serial)
      self.out_meta = (_structure(out), [_out_meta(t) for t in outs])
      self.calls = 2
      return out
    in_bufs = [b for t in tensors for b in t._buffers()]
    self._note_inputs(tensors)
    return self._replay(tensors, var_vals, in_bufs)

  def _replay(self, tensors, var_vals, in_bufs):
    for start, end, size in self.range_checks:   # symbolic views that other values could take outside their tensor
      b, e, n = (sym.evaluate(x, var_vals) for x in (start, end, size))
      if not 0 <= b <= e <= n:
        raise JitError(f"jitted {self.fn.__name__}: with {var_vals} a view [{sym.render(start)}, {sym.render(end)}) "
                       f"is [{b}, {e}), outside its tensor's {n} elements; bind values that keep it inside")
    bufs = iter(self.graph.replay(in_bufs, var_vals))
    structure, metas = self.out_meta
    outs = []
    for shape, layout in metas:
      shape = tuple(sym.rebind(d, var_vals) for d in shape)     # a symbolic shape at this call's values
      if layout is None: outs.append(_tensor_from(next(bufs), shape)); continue
      axis, bounds, shard_shapes = layout
      views = [_tensor_from(next(bufs), s).uop for s in shard_shapes]
      outs.append(Tensor(_multi.multi_uop(views, axis, bounds)))
    return _unflatten(structure, outs)


def _own_copies(outs: list, copied: set):
  """The capture's outputs whose buffers the graph keeps writing (a host step's results) become copies of them, as
  every replay's are, so that a later replay does not change what this call returned."""
  j = 0
  for t in outs:
    bufs = t._buffers()
    mine = range(j, j + len(bufs))
    j += len(bufs)
    if not copied.intersection(mine): continue
    fresh = [segmented_copy(b) if k in copied else b for k, b in zip(mine, bufs)]
    if not isinstance(t.device, tuple): t.uop = _tensor_from(fresh[0], t.shape).uop; continue
    axis, bounds = t.uop.arg
    t.uop = _multi.multi_uop([_tensor_from(b, s.shape).uop for b, s in zip(fresh, t.uop.src)], axis, bounds)


def _layout(t: Tensor):
  """A realized tensor on several devices: its MULTI's (axis, bounds); None on one device."""
  return t.uop.arg if isinstance(t.device, tuple) and t.uop.op is Ops.MULTI else None


def _out_meta(t: Tensor):
  if not isinstance(t.device, tuple): return (t.shape, None)
  axis, bounds = t.uop.arg
  return (t.shape, (axis, bounds, [s.shape for s in t.uop.src]))


def _graph_devices(graph) -> list:
  return graph.devices if isinstance(graph, (MultiGraphExecutor, SegmentedGraph)) else [graph.dev]


def _freeze(a):
  if isinstance(a, (list, tuple)): return tuple(_freeze(x) for x in a)
  if isinstance(a, dict): return tuple(sorted((k, _freeze(v)) for k, v in a.items()))
  try:
    hash(a); return a
  except TypeError: return repr(a)


def _realize_outputs(out):
  """Realize what a jitted function returns. An output that is a view of an input or of a weight (x.T, w[1:3]) becomes
  a contiguous copy of it: a replay hands back buffers of its own, in the captured outputs' shapes."""
  ts = _flatten(out)
  for t in ts:
    if not isinstance(t.device, tuple) and not _is_realized(t.uop): t.uop = t.contiguous().uop
  if ts: Tensor.realize(*ts)
  return out


def _flatten(out) -> list[Tensor]:
  if isinstance(out, Tensor): return [out]
  if isinstance(out, (tuple, list)): return [t for o in out for t in _flatten(o)]
  if out is None: return []
  raise JitError(f"a jitted function must return Tensors (or tuples/lists of them), got {type(out).__name__}")


def _structure(out):
  if isinstance(out, Tensor): return "T"
  if isinstance(out, (tuple, list)): return (type(out), [_structure(o) for o in out])
  return None


def _unflatten(structure, outs: list):
  return _build(structure, iter(outs))


def _build(s, it):
  """The returned structure `s` with its tensors taken from `it` in order. (Not a closure that calls itself: that is a
  reference cycle holding the outputs until the cyclic collector runs, so their memory was not reused at once.)"""
  if s == "T": return next(it)
  if s is None: return None
  return s[0](_build(x, it) for x in s[1])


def _whole_buffer(u: UOp) -> Buffer | None:
  """The buffer a realized node on one device is, whole (a BUFFER, or a reshape of one); None for anything else."""
  if u.op is Ops.RESHAPE: u = u.src[0]
  return u.arg if u.op is Ops.BUFFER else None


def _tensor_from(buf: Buffer, shape) -> Tensor:
  u = UOp(Ops.BUFFER, buf.dtype, (), buf)
  return Tensor(u if shape == (buf.size,) else UOp(Ops.RESHAPE, buf.dtype, (u,), shape))


__all__ = ["jit", "JitError", "Variable"]
