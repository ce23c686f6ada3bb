"""Schedule: a sink of Tensor graph outputs -> ExecItems (programs + buffers), cached by graph structure.

Realized buffers are replaced by numbered slots first, so the same computation on other data (the common
case in eager loops) reuses the cached kernels and buffer plan without running rangeify again.
"""
from __future__ import annotations
import weakref
from dataclasses import dataclass
from .uop import UOp, Ops, MOVEMENT
from .rangeify import BufferSlot, CopySpec
from .deepstack import on_deep_stack
from . import shape as sym
from baregrad.drivers import settings

DEBUG = settings.DEBUG
_BUFFER, _ASSIGN, _BIND = Ops.BUFFER, Ops.ASSIGN, Ops.BIND   # (an Enum member lookup costs more than a global's)
_VIEW = "realized_view"    # the key of a realized node's view in its __dict__ (where UOps keep derived values)


class Realized:
  """tensor-graph node -> the BUFFER view that holds its value, once realized. The view is kept on the node itself,
  so it goes when the node goes, as a WeakKeyDictionary entry would, without a weakref and its callback per node."""
  def get(self, node: UOp, default=None): return node.__dict__.get(_VIEW, default)
  def __contains__(self, node: UOp) -> bool: return _VIEW in node.__dict__
  def __getitem__(self, node: UOp) -> UOp: return node.__dict__[_VIEW]
  def __setitem__(self, node: UOp, view: UOp): node.__dict__[_VIEW] = view
  def pop(self, node: UOp, default=None): return node.__dict__.pop(_VIEW, default)


realized = Realized()
_EPOCH = "realized_epoch"  # the key of when it was remembered (clock.now then)


class _Clock:
  now = 0       # advanced by fresh_views
  floor = 0     # views remembered before this are not read by a graph (ASSIGNs excepted): see fresh_views


clock = _Clock()


class fresh_views:
  """Inside: a graph reads no view remembered before (other than an assign's that already ran); views remembered
  inside are read as usual. The JIT captures its graph so: a value an earlier call computed from the same input or
  weight Tensors (an identical node) is computed again inside the captured graph, not taken as a constant buffer
  that later replays, with other inputs or after the weights were written, would keep reading."""
  def __enter__(self):
    clock.now += 1
    self.saved, clock.floor = clock.floor, clock.now
  def __exit__(self, *exc): clock.floor = self.saved


def reusable(n: UOp):
  """The view holding n's value that a graph may read instead of computing n, or None."""
  d = n.__dict__
  view = d.get(_VIEW)
  if view is None or n.op is _ASSIGN or not clock.floor or d.get(_EPOCH, 0) >= clock.floor: return view
  return None


def remember(node: UOp, view: UOp, inputs: list) -> None:
  """Record that `node`'s value is now in `view`, computed from the buffers `inputs`. A node on several devices:
  `view` is a MULTI of one view per device (tensor/multi.py looks it up before lowering). A constant (movement ops
  of a CONST) is not recorded: computing it again costs nothing, and its nodes are kept for reuse without a buffer
  (tensor.py's scalar operands)."""
  base = node
  while base.op in MOVEMENT: base = base.src[0]
  if base.op is Ops.CONST: return
  node.__dict__[_VIEW] = view
  node.__dict__[_EPOCH] = clock.now
  ref = weakref.ref(node)
  for base in (view.src if view.op is Ops.MULTI else (view,)):
    while base.op is not _BUFFER: base = base.src[0]
    _depend(base.arg, ref)
  for buf in inputs: _depend(buf, ref)


class Dependents(list):
  """`Buffer.dependents` (hcq): weak references to realized nodes, without callbacks, so nothing runs when a node
  goes. The dead ones are dropped when the list reaches `limit`, which is then twice what is left (from 64)."""
  __slots__ = ("limit",)


def _depend(buf, ref: weakref.ref) -> None:
  refs = buf.dependents
  if refs is None:
    refs = buf.dependents = Dependents()
    refs.limit = 64
  refs.append(ref)
  if len(refs) >= refs.limit:
    refs[:] = [r for r in refs if r() is not None]
    refs.limit = max(64, 2 * len(refs))


def forget(buf) -> None:
  """`buf` is about to be written: cached results that live in it or were computed from it are stale, and so are the
  results computed from those (a graph walk stops at a realized node, graph_order: a result records the buffers it
  read, the realized node's among them, not what that node was computed from). Assigns that already ran stay
  recorded: a graph that still holds one must not run it again."""
  todo, seen = [buf], set()
  while todo:
    b = todo.pop()
    if id(b) in seen: continue
    seen.add(id(b))
    refs, b.dependents = b.dependents, None
    for ref in refs or ():
      node = ref()
      if node is None or node.op is Ops.ASSIGN: continue
      view = node.__dict__.pop(_VIEW, None)
      for base in (() if view is None else view.src if view.op is Ops.MULTI else (view,)):
        while base.op is not _BUFFER: base = base.src[0]
        if base.arg is not b: todo.append(base.arg)
stats = {"schedules_built": 0, "schedule_cache_hits": 0}


@dataclass
class Plan:
  """A cached schedule: kernels/copies with references ('in', slot) or ('new', k) for their buffers."""
  steps: list            # (program or None, [refs], meta)
  new_buffers: list      # (device, size, dtype) for each ('new', k)
  outputs: list          # ref per sink source
  # materialized nodes other than the outputs (a contiguous(), a reduce read through a broadcast, an assign another
  # graph reads): normalized node -> its ref. create_schedule records each graph node they stand for, so a later
  # realize that reads one while a Tensor still holds it loads the buffer instead of computing it again.
  inner: dict = None
  # filled on first use (create_schedule): steps and outputs as indexes into the realized inputs followed by the new
  # buffers, and each output's shape (the number of inputs is the sink's number of slots: fixed by its structure)
  flat: tuple | None = None


# (slot index, size, dtype, device, node dtype) -> the slot's BUFFER UOp: making one hashes a BufferSlot each time
_slot_uops: dict[tuple, UOp] = {}


def leaf_view(n: UOp) -> UOp | None:
  """The view a graph walk reads n's value from instead of walking under n (realized before and reusable), or None.
  A value on several devices (a MULTI of views) is walked through: tensor/multi.py lowers such graphs."""
  view = reusable(n)
  return view if view is not None and view is not n and view.op is not Ops.MULTI else None


def graph_order(outs: list[UOp]) -> list[UOp]:
  """The walk normalize_outputs takes over `outs` (their sink's toposort less the sink): a node it will replace by
  the view holding its value (leaf_view) is a leaf, its sources not walked. A model that realizes per layer (a KV
  cache written by each) then walks each layer once, not every earlier one again."""
  outputs = set(outs)
  def leaf(n: UOp) -> bool: return (n.op is _ASSIGN or n not in outputs) and leaf_view(n) is not None
  if len(outs) == 1: return outs[0].toposort(leaf)
  return UOp.sink(*outs).toposort(leaf)[:-1]


def normalize(sink: UOp):
  """Replace realized buffers by slots and bound variables by their DEFINE_VAR; returns (sink, buffers, var_vals).
  `buffers` lists every realized buffer the graph reaches, in the order of `sink.toposort()` (slot i is
  buffers[i]), those under a node realized before included. (create_schedule walks graph_order instead: there
  a realized node is a leaf and only the buffers the result reads are listed; forget() follows realized
  results to what was computed from them.)"""
  outs, buffers, var_vals, _ = normalize_outputs(list(sink.src), sink.toposort()[:-1])
  return UOp.sink(*outs), buffers, var_vals


def normalize_outputs(outs: list[UOp], order: list[UOp]):
  """normalize() of UOp.sink(*outs) without making that sink: `order` is its toposort less the sink itself. One
  walk in that order maps each node to its normalized form (the substitution is done as it goes); that map is
  returned last."""
  buffers, var_vals, slots = [], {}, {}
  outputs = set(outs)
  done: dict[UOp, UOp] = {}
  mapped = done.__getitem__
  for n in order:
    op = n.op
    if op is _BUFFER and n in slots: done[n] = slots[n]; continue   # under a realized view seen before
    # an output gets a buffer of its own even when an identical graph was realized before (an assign to one
    # must not change the other); assigns that already ran are never run again
    view = reusable(n) if op is _ASSIGN or n not in outputs else None
    if view is not None and view is not n: done[n] = normalize_leaf(view, buffers, slots)
    elif op is _BUFFER: done[n] = n if isinstance(n.arg, BufferSlot) else normalize_leaf(n, buffers, slots)
    elif op is _BIND:
      var, val = n.src[0], n.src[1].arg
      _bind_value(var_vals, var, val)
      done[n] = var
    else:
      src = tuple(map(mapped, n.src))
      arg = n.arg
      if op in _SIZED and (unbound := _unbound_arg(n)) is not None:    # symbolic sizes: their Variables unbound
        arg, vals = unbound
        for var, val in vals: _bind_value(var_vals, var, val)
      if src == n.src and arg is n.arg: done[n] = n            # (== compares sources by identity)
      else:
        # the last normalized form of n, kept on n: a weight's subgraph (a quantized one's dequantization: hundreds of
        # nodes above its buffer) maps to the same nodes in every graph that reads it at the same slot, which were
        # otherwise made again each realize (a 32-token Q4_K prefill of 16 layers: 99,000 nodes)
        memo = n.__dict__.get(_NORMALIZED)
        if memo is not None and memo[0] == src and memo[1].arg is arg: done[n] = memo[1]
        else:
          new = done[n] = UOp(op, n.dtype, src, arg)
          n.__dict__[_NORMALIZED] = (src, new)
  return [done[o] for o in outs], buffers, var_vals, done


_NORMALIZED = "normalized"   # node.__dict__ key: (normalized sources, normalized node) of its last normalize


_SIZED = frozenset(MOVEMENT | {Ops.IOTA})   # ops whose arg may hold a symbolic size (compiler/shape.py)


def _bind_value(var_vals: dict, var: UOp, val: int) -> None:
  name = var.arg[0]
  if not var.arg[1] <= val <= var.arg[2]:
    raise ValueError(f"variable {name}={val} is outside its range [{var.arg[1]}, {var.arg[2]}]")
  if var_vals.get(name, val) != val:
    raise ValueError(f"variable {name} is bound to two values in one graph ({var_vals[name]} and {val})")
  var_vals[name] = val


def _unbound_arg(n: UOp):
  """(n's arg with its Variables unbound, [(variable, value)]) where the arg holds a symbolic size, else None (cached
  on the node)."""
  d = n.__dict__
  if "unbound_arg" in d: return d["unbound_arg"]
  out = None
  if sym.has_sym(n.arg):
    vals = []
    def collect(u):
      vals.extend((b.src[0], b.src[1].arg) for b in u.toposort() if b.op is _BIND)
      return sym.unbind(u)
    out = (sym.map_arg(n.arg, collect), vals)
  d["unbound_arg"] = out
  return out


def normalize_leaf(view: UOp, buffers: list, slots: dict) -> UOp:
  """Map the BUFFER under a realized view to a slot (one per BUFFER: `slots`); return the view rebuilt on it."""
  chain = []
  node = view
  while node.op is not _BUFFER:
    chain.append(node); node = node.src[0]
  out = slots.get(node)
  if out is None:
    buf = node.arg
    key = (len(buffers), buf.size, buf.dtype, buf.device, node.dtype)
    out = _slot_uops.get(key)
    if out is None:
      if len(_slot_uops) >= 4096: _slot_uops.clear()
      out = _slot_uops[key] = UOp(_BUFFER, node.dtype, (), BufferSlot(*key[:4]))
    slots[node] = out
    buffers.append(buf)
  for c in reversed(chain): out = c.replace(src=(out,))
  return out


_plans: dict[UOp, Plan] = {}   # (see create_schedule for the key)
PLAN_CACHE = settings.PLAN_CACHE   # schedules kept for reuse (a runtime switch: tests monkeypatch it)


def _codegen():
  """compiler/codegen.py, imported when the first schedule is made (`import baregrad.tensor` does not load the
  compiler's lowering, renderers and search). Plans hold programs: codegen.clear_programs() forgets them too."""
  from . import codegen
  if _plans_clear not in codegen.program_holders: codegen.program_holders.append(_plans_clear)
  return codegen


def _plans_clear(): _plans.clear()


# the kernel optimization settings (codegen.OPT, codegen.BEAM) the cached plans were made under: a program may switch
# them at run time (a test, a tool comparing OPT on and off), and a plan packs matmuls and picks programs by them
_plans_made_with: tuple | None = None


def get_programs(specs: list) -> list:
  """codegen.get_programs (tests wrap this name to see every kernel a schedule compiles)."""
  return _codegen().get_programs(specs)


def build_plan(sink: UOp) -> Plan:
  from .rangeify import rangeify
  from .pack import pack_matmuls
  from . import viz   # VIZ=out.html report hook
  from baregrad.drivers.progress import progress   # a bar on a terminal when compiling takes a while
  stats["schedules_built"] += 1
  caller_outs = set(sink.src)
  # device-specific layouts: large CPU matmuls pack their right operand (with OPT), 16-bit products summed in float32
  # are exact on the CPU; packed_from: node -> the sink's node it stands for
  sink, packed_from = pack_matmuls(sink, pack=bool(_codegen().OPT))
  sched = rangeify(sink, lambda n: n.device)
  if viz.VIZ: viz.viz_event("schedule", sink=sink, schedule=sched)
  ref: dict[UOp, tuple] = {}
  new_buffers = []
  for m in sched.materialized:
    if m.op is Ops.ASSIGN:
      target = m.src[0].base
      ref[m] = ("in", target.arg.index)
    else:
      ref[m] = ("new", len(new_buffers))
      new_buffers.append((m.device, sym.max_size(m.shape), m.dtype))   # a symbolic size: its largest
  def runs(item) -> bool:
    out = item.params[0]
    return sym.max_size(out.shape if out.op is not Ops.BUFFER else (out.arg.size,)) != 0
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
  outs = set(sink.src)
  # values the packed graph materialized are recorded under the caller's nodes they stand for (pack_matmuls' map; its
  # strip copies have none), so a later realize that holds one reads it; the caller's outputs are the realize's own
  inner = {o: ref[m] for m in sched.materialized
           if m not in outs and (o := packed_from.get(m) if packed_from else m) is not None and o not in caller_outs}
  if DEBUG >= 2:
    print(f"schedule: {len(steps)} steps, {len(new_buffers)} new buffers")
    for prog, refs, meta in steps: print(f"  {meta['name']:30s} bufs={refs}")
  return Plan(steps, new_buffers, outputs, inner)


def create_schedule(outs: list[UOp], order: list[UOp] | None = None):
  """Returns (ExecItems, one Buffer per output, the realized buffers the outputs are computed from, each output's
  shape: the normalized output's, which the cached plan keeps, so a new graph's nodes need not work it out, and the
  graph nodes other than the outputs that the schedule materializes, each with the view that will hold its value:
  [(node, view)]). A schedule not in the cache is built on the compiler's deep-stack thread
  (compiler/deepstack.py): deep graphs recurse deeply."""
  global _device_epoch, _plans_made_with
  Device, Buffer, ExecItem = _runtime or _import_runtime()
  # the toposort of one output is its sink's less the sink (a sink of several: see UOp.toposort); `order`: the
  # caller's toposort of outs[0] (one output)
  if order is None: order = graph_order(outs)
  try: outs, buffers, var_vals, done = normalize_outputs(outs, order)
  except RecursionError: outs, buffers, var_vals, done = on_deep_stack(normalize_outputs, outs, order)
  # plans are keyed by the normalized sink, or by the output itself when there is one (no SINK node to look up; a
  # tensor graph's output is never a SINK, so the two kinds of key never meet)
  key = outs[0] if len(outs) == 1 else UOp.sink(*outs)
  if Device.epoch != _device_epoch:    # a device was closed: the programs loaded on it are stale
    _codegen().drop_stale_programs()
    _device_epoch = Device.epoch
  cg = _codegen()
  if (cg.OPT, cg.BEAM) != _plans_made_with:     # plans chose their layouts and programs under other settings
    _plans.clear()
    _plans_made_with = (cg.OPT, cg.BEAM)
  plan = _plans.pop(key, None)
  if plan is None:
    plan = on_deep_stack(build_plan, UOp.sink(*outs))
    while _plans and len(_plans) >= PLAN_CACHE: _plans.pop(next(iter(_plans)))   # least recently used first
  else: stats["schedule_cache_hits"] += 1
  if PLAN_CACHE: _plans[key] = plan          # (PLAN_CACHE=0: none kept)
  if plan.flat is None:
    n = len(buffers)
    def at(r): return r[1] if r[0] == "in" else n + r[1]
    plan.flat = ([(prog, [at(r) for r in refs], meta) for prog, refs, meta in plan.steps],
                 [at(r) for r in plan.outputs], [o.shape for o in outs])
  steps, out_at, shapes = plan.flat
  pool = buffers + [Buffer(dev, size, dt) for dev, size, dt in plan.new_buffers]
  items = [ExecItem(prog, [pool[i] for i in at], var_vals, meta) for prog, at, meta in steps]
  inner = _inner_views(plan, done, pool, len(buffers)) if plan.inner else []
  return items, [pool[i] for i in out_at], buffers, shapes, inner


def _inner_views(plan: Plan, done: dict, pool: list, n_in: int) -> list:
  """[(graph node, view)] for the graph nodes whose normalized form the plan materializes besides its outputs: an
  assign is its target (a view of a realized buffer), any other node a view of its new buffer in its shape."""
  out = []
  for node, norm in done.items():
    r = plan.inner.get(norm)
    if r is None or node.base.op is _BUFFER: continue    # (a realized buffer read by a copy: it has its buffer)
    if node.op is _ASSIGN: out.append((node, node.src[0])); continue
    buf = pool[r[1] if r[0] == "in" else n_in + r[1]]
    view = UOp(_BUFFER, buf.dtype, (), buf)
    out.append((node, view if node.shape == (buf.size,) else UOp(Ops.RESHAPE, buf.dtype, (view,), node.shape)))
  return out


_runtime: tuple | None = None    # (Device, Buffer, ExecItem) of hcq, imported on first use
_device_epoch: int | None = None  # Device.epoch when drop_stale_programs() last ran here


def _import_runtime() -> tuple:
  global _runtime
  from baregrad.hcq.device import Device
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.exec_item import ExecItem
  _runtime = (Device, Buffer, ExecItem)
  return _runtime
