"""Schedule: a sink of Tensor graph outputs -> ExecItems (programs + buffers), cached by graph structure.

Realized buffers are replaced by numbered slots first, so the same computation on other data (the common
case in eager loops) reuses the cached kernels and buffer plan without running rangeify again.
"""
from __future__ import annotations
import math, weakref
from dataclasses import dataclass
from .uop import UOp, Ops, MOVEMENT
from .pattern import substitute
from .rangeify import rangeify, BufferSlot, KernelSpec, CopySpec
from .pack import pack_matmuls
from . import codegen
from .codegen import get_program, get_programs, drop_stale_programs
from .deepstack import on_deep_stack
from . import viz as _viz   # VIZ=out.html report hook
from baregrad.drivers.progress import progress   # a bar on a terminal when compiling takes a while
from baregrad.drivers import settings

DEBUG = settings.DEBUG
# tensor-graph node -> the BUFFER view that holds its value, once realized
realized: "weakref.WeakKeyDictionary[UOp, UOp]" = weakref.WeakKeyDictionary()
# buffer -> the realized nodes whose value lives in it or was computed from it (what a write makes stale)
_depends: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def remember(node: UOp, view: UOp, inputs: list) -> None:
  """Record that `node`'s value is now in `view`, computed from the buffers `inputs`. A node on several devices:
  `view` is a MULTI of one view per device (tensor/multi.py looks it up before lowering)."""
  realized[node] = view
  bases = []
  for base in (view.src if view.op is Ops.MULTI else (view,)):
    while base.op is not Ops.BUFFER: base = base.src[0]
    bases.append(base.arg)
  for buf in (*bases, *inputs): _depends.setdefault(buf, weakref.WeakSet()).add(node)


def forget(buf) -> None:
  """`buf` is about to be written: cached results that live in it or were computed from it are stale. Assigns that
  already ran stay recorded: a graph that still holds one must not run it again."""
  # `inputs` in remember() come from the graph before realized parts were replaced by their buffers, so a result
  # computed from another cached result is indexed under that one's inputs too: one level is enough
  for node in list(_depends.pop(buf, ())):
    if node.op is not Ops.ASSIGN: realized.pop(node, None)
stats = {"schedules_built": 0, "schedule_cache_hits": 0}


@dataclass
class Plan:
  """A cached schedule: kernels/copies with references ('in', slot) or ('new', k) for their buffers."""
  steps: list            # (program or None, [refs], meta)
  new_buffers: list      # (device, size, dtype) for each ('new', k)
  outputs: list          # ref per sink source


def normalize(sink: UOp):
  """Replace realized buffers by slots and bound variables by their DEFINE_VAR; returns (sink, buffers, var_vals)."""
  buffers, var_vals, mapping = [], {}, {}
  outputs = set(sink.src)
  order = sink.toposort()
  for n in order:
    if n in mapping: continue
    # an output gets a buffer of its own even when an identical graph was realized before (an assign to one
    # must not change the other); assigns that already ran are never run again
    view = realized.get(n) if n not in outputs or n.op is Ops.ASSIGN else None
    if view is not None and view is not n:
      n_map = normalize_leaf(view, buffers, mapping)
      mapping[n] = n_map
    elif n.op is Ops.BUFFER and not isinstance(n.arg, BufferSlot):
      normalize_leaf(n, buffers, mapping)
    elif n.op is Ops.BIND:
      var, val = n.src[0], n.src[1].arg
      if not var.arg[1] <= val <= var.arg[2]:
        raise ValueError(f"variable {var.arg[0]}={val} is outside its range [{var.arg[1]}, {var.arg[2]}]")
      var_vals[var.arg[0]] = val
      mapping[n] = var
  if not mapping: return sink, buffers, var_vals
  return substitute(sink, mapping, order), buffers, var_vals


def normalize_leaf(view: UOp, buffers: list, mapping: dict) -> UOp:
  """Map the BUFFER under a realized view to a slot; return the view rebuilt on the slot."""
  chain = []
  node = view
  while node.op is not Ops.BUFFER:
    chain.append(node); node = node.src[0]
  if node not in mapping:
    buf = node.arg
    slot = UOp(Ops.BUFFER, node.dtype, (), BufferSlot(len(buffers), buf.size, buf.dtype, buf.device))
    buffers.append(buf)
    mapping[node] = slot
  out = mapping[node]
  for c in reversed(chain): out = c.replace(src=(out,))
  return out


_plans: dict[UOp, Plan] = {}
PLAN_CACHE = settings.PLAN_CACHE   # schedules kept for reuse (a runtime switch: tests monkeypatch it)
codegen.program_holders.append(_plans.clear)   # plans hold programs: codegen.clear_programs() forgets them too


def build_plan(sink: UOp) -> Plan:
  stats["schedules_built"] += 1
  if codegen.OPT: sink = pack_matmuls(sink)   # device-specific layouts: large CPU matmuls pack their right operand
  sched = rangeify(sink, lambda n: n.device)
  if _viz.VIZ: _viz.viz_event("schedule", sink=sink, schedule=sched)
  ref: dict[UOp, tuple] = {}
  new_buffers = []
  for m in sched.materialized:
    if m.op is Ops.ASSIGN:
      target = m.src[0].base
      ref[m] = ("in", target.arg.index)
    else:
      ref[m] = ("new", len(new_buffers))
      new_buffers.append((m.device, math.prod(m.shape), m.dtype))
  def runs(item) -> bool:
    out = item.params[0]
    return math.prod(out.shape if out.op is not Ops.BUFFER else (out.arg.size,)) != 0
  kernels = [item for item in sched.items if not isinstance(item, CopySpec) and runs(item)]
  programs = dict(zip(map(id, kernels), get_programs(progress(kernels, "compile kernels"))))
  steps = []
  for item in sched.items:
    if isinstance(item, CopySpec):
      steps.append((None, [ref[item.dest], ref[item.src]], {"name": f"copy {item.src.device}->{item.device}"}))
      continue
    if not runs(item): continue
    prog = programs[id(item)]
    refs = [ref[p] if p.op is not Ops.BUFFER else ("in", p.arg.index) for p in item.params]
    steps.append((prog, refs, dict(prog.meta, name=prog.name)))
  outputs = []
  for out in sink.src:
    if out in ref: outputs.append(ref[out])
    else:
      node = out
      while node.op in MOVEMENT: node = node.src[0]
      outputs.append(("in", node.arg.index))
  if DEBUG >= 2:
    print(f"schedule: {len(steps)} steps, {len(new_buffers)} new buffers")
    for prog, refs, meta in steps: print(f"  {meta['name']:30s} bufs={refs}")
  return Plan(steps, new_buffers, outputs)


def create_schedule(outs: list[UOp]):
  """Returns (ExecItems, one Buffer per output, the realized buffers the outputs are computed from). A schedule not
  in the cache is built on the compiler's deep-stack thread (compiler/deepstack.py): deep graphs recurse deeply."""
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.runtime import ExecItem
  try: sink, buffers, var_vals = normalize(UOp.sink(*outs))
  except RecursionError: sink, buffers, var_vals = on_deep_stack(normalize, UOp.sink(*outs))
  drop_stale_programs()
  plan = _plans.pop(sink, None)
  if plan is None:
    plan = on_deep_stack(build_plan, sink)
    while len(_plans) >= PLAN_CACHE: _plans.pop(next(iter(_plans)))   # least recently used first
  else: stats["schedule_cache_hits"] += 1
  _plans[sink] = plan
  new = [Buffer(dev, size, dt) for dev, size, dt in plan.new_buffers]
  def get(r): return buffers[r[1]] if r[0] == "in" else new[r[1]]
  items = [ExecItem(prog, [get(r) for r in refs], var_vals, meta) for prog, refs, meta in plan.steps]
  return items, [get(r) for r in plan.outputs], buffers


