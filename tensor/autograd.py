"""Reverse-mode gradients on the UOp graph: each op's rule turns the gradient of its output into gradients
of its sources, as more lazy Tensor ops (so the backward pass fuses and schedules like anything else).

The rules build those ops with the class of the gradients they are given (`type(seed)`: Tensor), so this
module sits below tensor/tensor.py and never imports it."""
from __future__ import annotations
import math, weakref
from baregrad.compiler.uop import UOp, Ops
from baregrad.compiler.dtype import dtypes

LN2 = math.log(2.0)

# node -> (sources, rule): the node's gradient is rule(out, g, *sources) -> one gradient (or None) per source, given
# in one piece instead of through the ops that computed the node (`define_gradient`)
_RULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def define_gradient(node: UOp, sources: tuple, rule) -> None:
  """Differentiate `node` by `rule` with respect to `sources` (UOps it was computed from), skipping the ops between
  them: for ops whose derivative torch writes in a form that rounds differently from the chain rule over their
  parts (softmax: y * (g - sum(g * y)), exactly 0 for a uniform g) or that their parts cannot give (pow at 0 and
  at -inf, acosh below 1). The rule must not hold `node` itself (it gets it as `out`). A node equal to one of its
  sources, or without sources, keeps its ordinary gradient."""
  if not node.src or node in sources: return
  _RULES[node] = (tuple(sources), rule)


def _interior_target(node: UOp, sources: tuple, targets: set) -> bool:
  """Whether a target lies strictly between `node` and its rule's `sources` (then the rule, which skips those
  nodes, cannot be used)."""
  stop, seen, stack = set(sources), set(), [node]
  while stack:
    n = stack.pop()
    for s in n.src:
      if s in stop or s in seen: continue
      if s in targets: return True
      seen.add(s)
      stack.append(s)
  return False


def _sum_to(g, shape):
  """Undo a broadcast: sum the expanded axes back down to `shape` (same rank)."""
  axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if a != b)
  return g.sum(axis=axes, keepdim=True) if axes else g


def op_gradients(node: UOp, out, g):
  """Gradients (as Tensors, or None) for each source of `node`, given g = d loss / d node (a Tensor, as `out`)."""
  src = [type(g)(s) for s in node.src]
  op = node.op
  if op is Ops.ADD: return (g, g)
  if op is Ops.MUL: return (g * src[1], g * src[0])
  if op is Ops.NEG: return (-g,)
  # a derivative that is exactly 0 stays 0 when the incoming gradient is infinite (1 / inf), and an incoming 0 stays 0
  # when exp overflowed: x.exp() / (1 + x.exp()) at x = 300 has gradient 0 (as tinygrad), not 0 * inf = NaN
  if op is Ops.RECIP: return ((out == 0).where(0.0, -g * out * out),)
  if op is Ops.SQRT: return (g / (out * 2),)
  if op is Ops.EXP2: return ((g == 0).where(0.0, g * out * LN2),)
  if op is Ops.LOG2: return (g / (src[0] * LN2),)
  if op is Ops.SIN: return (g * (src[0] + math.pi / 2).sin(),)
  if op is Ops.MAX:
    a, b = src
    wa = (a > b).where(1.0, (a == b).where(0.5, 0.0)).cast(g.dtype)
    return (g * wa, g * (1.0 - wa))
  if op is Ops.WHERE:
    c = src[0]
    return (None, c.where(g, 0.0), c.where(0.0, g))
  if op is Ops.CAST:
    return (g.cast(node.src[0].dtype) if node.src[0].dtype.is_float else None,)
  if op in (Ops.CONTIGUOUS,): return (g,)
  if op is Ops.ASSIGN: return (None, g)       # the target's old value is overwritten; the value flows through
  if op is Ops.COPY: return (g.to(node.src[0].device),)
  if op is Ops.MULTI:                         # one value on several devices: each shard's part of g
    from .multi import shard_gradients
    return shard_gradients(node, g)
  if op is Ops.RESHAPE: return (g.reshape(node.src[0].shape),)
  if op is Ops.PERMUTE:
    inv = [0] * len(node.arg)
    for i, p in enumerate(node.arg): inv[p] = i
    return (g.permute(*inv),)
  if op is Ops.EXPAND: return (_sum_to(g, node.src[0].shape),)
  if op is Ops.PAD:
    return (g.shrink(tuple((b, b + s) for (b, _), s in zip(node.arg[0], node.src[0].shape))),)
  if op is Ops.SHRINK:
    return (g.pad(tuple((b, s - e) for (b, e), s in zip(node.arg, node.src[0].shape))),)
  if op is Ops.FLIP: return (g.flip(*node.arg),)
  if op is Ops.REDUCE_AXIS:
    rop, axes = node.arg
    x = src[0]
    if rop is Ops.ADD: return (g.expand(x.shape),)
    if rop is Ops.MAX:
      is_max = (x == out.expand(x.shape)).cast(g.dtype)
      count = is_max.sum(axis=axes, keepdim=True)
      return (is_max * (g / count).expand(x.shape),)
    if rop is Ops.MUL:   # the product of the others: out / x without zeros, the one zero's cofactor, else 0
      zero = x == 0
      zeros = zero.cast(dtypes.int32).sum(axis=axes, keepdim=True).expand(x.shape)
      others = zero.where(1, x).prod(axis=axes, keepdim=True).expand(x.shape)
      cof = (zeros == 0).where(others / zero.where(1, x), (zero & (zeros == 1)).where(others, 0))
      return (g.expand(x.shape) * cof,)
  if op is Ops.ATTEND:   # out = sum_s p_s b_s with p = softmax(a) along the axis: d/da_s = p_s (b_s - out)
    a, b = src
    full = tuple(x if x != 1 else y for x, y in zip(a.shape, b.shape))
    p = a.softmax(node.arg).expand(full)
    gp = g.expand(full) * p
    return (_sum_to(gp * (b.expand(full) - out.expand(full)), a.shape), _sum_to(gp, b.shape))
  return tuple(None for _ in node.src)   # comparisons, bit ops, integer ops, TRUNC, DETACH: no gradient


def gradients(loss: UOp, targets: list[UOp], seed) -> dict[UOp, object]:
  """d loss / d target for every target that loss depends on (targets missing from the graph are left out).
  `seed` (d loss / d loss, a Tensor) gives the class the gradients are built with."""
  tensor = type(seed)
  order = loss.toposort()
  target_set = set(targets)
  # only walk nodes that lead to a target
  leads: set[UOp] = set()
  for n in order:
    if n in target_set or any(s in leads for s in n.src): leads.add(n)
  grads: dict[UOp, object] = {loss: seed}
  for node in reversed(order):
    g = grads.get(node)
    if g is None or node in target_set and not node.src: continue
    if node.op is Ops.DETACH or not any(s in leads for s in node.src): continue
    rule = _RULES.get(node)
    if rule is not None and not _interior_target(node, rule[0], target_set):
      pairs = zip(rule[0], rule[1](tensor(node), g, *[tensor(s) for s in rule[0]]))
    else: pairs = zip(node.src, op_gradients(node, tensor(node), g))
    for s, sg in pairs:
      if sg is None or s not in leads: continue
      if sg.shape != s.shape: sg = sg.reshape(s.shape)
      if s.dtype is not None and s.dtype.is_float and sg.dtype != s.dtype: sg = sg.cast(s.dtype)
      grads[s] = sg if s not in grads else grads[s] + sg
  return {t: grads[t] for t in targets if t in grads}
