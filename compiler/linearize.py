"""Linearize a kernel AST into an ordered list of UOps with explicit loops and accumulators.

Global loops open first. Each REDUCE becomes DEFINE_ACC, its reduce loops, the loads that need only
those loops (hoisted), then the innermost constant-size "upcast" lane loops around the value and
ACC_UPDATE; the accumulator is an array over the lanes. Finally the store runs inside its lane loops.
A REDUCE's result is read through its accumulator (`alias`).

ACC_UPDATE(acc, value) with arg op means acc = acc op value. A REDUCE lowered by compiler/lower.py carries its
accumulate step as an expression instead (arg (op, step) over the placeholders DEFINE_ACC "acc" and "value"): the
step is emitted as ordinary ops on the accumulator and ACC_UPDATE(acc, new) without arg assigns the result.
A coupled group (uop.coupled) shares one loop: its members' next values are all computed before any ACC_UPDATE.
"""
from __future__ import annotations
from .uop import UOp, Ops, coupled
from .pattern import substitute


def range_deps(ast: UOp) -> dict[UOp, frozenset]:
  deps: dict[UOp, frozenset] = {}
  for u in ast.toposort():
    if u.op is Ops.RANGE: deps[u] = frozenset([u]) | deps[u.src[0]]
    elif u.op is Ops.REDUCE: deps[u] = deps[u.src[0]] - frozenset(u.src[1:])
    else: deps[u] = frozenset().union(*(deps[s] for s in u.src)) if u.src else frozenset()
  return deps


def lane_strides(ast: UOp) -> dict[UOp, int]:
  """Each upcast lane range's stride in the store index (the unit-stride lane goes innermost: vectorizable)."""
  from .symbolic import linear
  strides: dict[UOp, int] = {}
  for store in ast.src:
    if store.op is Ops.STORE:
      terms, _ = linear(store.src[0].src[1])
      for r, coef in terms.items():
        if r.op is Ops.RANGE and r.arg[1] == "upcast": strides[r] = abs(coef)
  return strides


def linearize(ast: UOp, merge: bool = False) -> tuple[list[UOp], dict[UOp, UOp]]:
  """Returns the ordered program and, for each REDUCE, the accumulator that holds its result. merge: REDUCEs over
  the same loops share one loop (`members_of`)."""
  deps = range_deps(ast)
  strides = lane_strides(ast)

  def _lanes(rs) -> list[UOp]:
    """The upcast lane loops among `rs`, outermost first."""
    return sorted((r for r in rs if r.arg[1] == "upcast"), key=lambda r: (-strides.get(r, 0), r.arg[0]))
  out: list[UOp] = []
  emitted: set[UOp] = set()
  open_ranges: list[UOp] = []
  alias: dict[UOp, UOp] = {}
  n_acc = [0]

  def emit(u: UOp):
    if u in emitted: return
    if u.op is Ops.REDUCE: return emit_reduce(u)
    if u.op is Ops.RANGE: raise RuntimeError(f"RANGE {u.arg} used outside its loop")
    for s in u.src: emit(s)
    out.append(u); emitted.add(u)

  def hoist(root: UOp, allowed: frozenset):
    for n in root.toposort():
      if n not in emitted and n.op not in (Ops.RANGE, Ops.REDUCE) and deps[n] <= allowed: emit(n)

  marks: list[int] = []

  def open_loops(ranges):
    for r in ranges:
      emit(r.src[0])
      out.append(r); emitted.add(r); open_ranges.append(r); marks.append(len(out))

  def close_loops(ranges):
    for r in reversed(ranges):
      out.append(UOp(Ops.ENDRANGE, None, (r,)))
      open_ranges.pop()
      # values computed inside the loop are out of scope after it (C block scoping): emit again if needed
      for n in out[marks.pop():]:
        if n.op not in (Ops.DEFINE_ACC, Ops.ACC_UPDATE, Ops.ENDRANGE): emitted.discard(n)
      emitted.discard(r)

  siblings: dict[frozenset, list[UOp]] = {}
  groups: dict[frozenset, list[UOp]] = {}
  for n in ast.toposort():
    if n.op is Ops.REDUCE and merge: siblings.setdefault(frozenset(n.src[1:]), []).append(n)
    if coupled(n) is not None: groups.setdefault(frozenset(n.src[1:]), []).append(n)

  def deps_of(n: UOp, accs: dict) -> frozenset:
    """range_deps for the nodes made by putting accumulators in (an accumulator lives in its loops)."""
    for x in n.toposort():
      if x not in deps: deps[x] = accs[x] if x in accs else frozenset().union(*(deps[s] for s in x.src))
    return deps[n]

  def emit_coupled(u: UOp):
    """The group's accumulators, one loop, every next value computed before any ACC_UPDATE. A placeholder of key k
    in a member's value is that member's own accumulator when the member has key k, else the one member of key k
    (a register tile repeats the members that depend on its lane: the running sums of p * v per output, which
    share one running maximum and one sum of p)."""
    group = sorted(groups[frozenset(u.src[1:])], key=coupled)
    ranges = sorted(u.src[1:], key=lambda r: r.arg[0])
    if _lanes(ranges): raise RuntimeError(f"coupled reductions {[coupled(m) for m in group]} over lane loops")
    accs, by_key = {}, {}
    for m in group:
      acc = UOp(Ops.DEFINE_ACC, m.dtype, (), (m.arg[0], n_acc[0]))
      n_acc[0] += 1
      out.append(acc); emitted.add(acc); accs[m] = acc
      by_key.setdefault(coupled(m), []).append(acc)
    for m in group:    # reductions in the values that need none of the group's loops run before them
      for n in m.src[0].toposort():
        if n.op is Ops.REDUCE and n not in emitted and deps[n] <= frozenset(open_ranges): emit_reduce(n)
    open_loops(ranges)
    news = []
    for m in group:
      slots = {}
      for n in m.src[0].toposort():
        if n.op is not Ops.DEFINE_ACC or n.arg[0] != "peer": continue
        k = n.arg[1]
        if k == coupled(m): slots[n] = accs[m]
        elif len(by_key.get(k, ())) == 1: slots[n] = by_key[k][0]
        else: raise RuntimeError(f"coupled reduction {coupled(m)} reads accumulator {k}, of which its group has "
                                 f"{len(by_key.get(k, ()))} (keys {sorted(by_key)})")
      news.append(substitute(m.src[0], slots))
      deps_of(news[-1], {a: frozenset(ranges) for a in accs.values()})
    for new in news: emit(new)
    for m, new in zip(group, news): out.append(UOp(Ops.ACC_UPDATE, m.dtype, (accs[m], new)))
    close_loops(ranges)
    for m in group:
      emitted.add(m)
      alias[m] = accs[m]

  def members_of(u: UOp) -> list[UOp]:
    """u and the REDUCEs over the same loops that can share them (GPU register tiles: one loop, many accumulators):
    no lanes, nothing outside the loops that is not open yet, neither inside the other's value."""
    out = [u]
    if _lanes(deps[u]): return out
    inside = set(u.src[0].toposort())
    for s in siblings.get(frozenset(u.src[1:]), ()):
      if s is u or s in emitted or s in inside or _lanes(deps[s]) or not deps[s] <= frozenset(open_ranges) or \
         coupled(s) is not None: continue
      below = set(s.src[0].toposort())
      if any(m in below for m in out): continue
      out.append(s); inside.update(below)
    return out

  def emit_reduce(u: UOp):
    if coupled(u) is not None: return emit_coupled(u)
    members = members_of(u)
    # reduces nested in these ones' values that need none of their loops run first
    for m in members:
      for n in m.src[0].toposort():
        if n.op is Ops.REDUCE and n not in emitted and deps[n] <= frozenset(open_ranges) | frozenset(_lanes(deps[n])):
          emit_reduce(n)
    members = [m for m in members if m not in emitted]
    lanes = [r for r in _lanes(deps[u]) if r not in open_ranges]
    for m in members: hoist(m.src[0], frozenset(open_ranges))
    accs = []
    for m in members:
      acc = UOp(Ops.DEFINE_ACC, m.dtype, tuple(lanes), (m.arg if isinstance(m.arg, Ops) else m.arg[0], n_acc[0]))
      n_acc[0] += 1
      out.append(acc); emitted.add(acc); accs.append(acc)
    ranges = sorted(u.src[1:], key=lambda r: r.arg[0])
    for r in (ranges if merge else [ranges]):    # GPU: hoist at every loop level (a staged tile fills per outer step)
      open_loops([r] if merge else r)
      for m in members: hoist(m.src[0], frozenset(open_ranges))
    open_loops(lanes)
    for m, acc in zip(members, accs):
      op, step = (m.arg, None) if isinstance(m.arg, Ops) else m.arg
      emit(m.src[0])
      if step is None: out.append(UOp(Ops.ACC_UPDATE, m.dtype, (acc, m.src[0]), op))
      else:
        slots = {n: acc if n.arg == "acc" else m.src[0] for n in step.toposort() if n.op is Ops.DEFINE_ACC}
        new = substitute(step, slots)
        emit(new)
        out.append(UOp(Ops.ACC_UPDATE, m.dtype, (acc, new)))
    close_loops(lanes)
    close_loops(ranges)
    for m, acc in zip(members, accs):
      emitted.add(m)
      alias[m] = acc

  global_ranges = sorted({r for r in deps[ast] if r.arg[1] == "global"}, key=lambda r: r.arg[0])
  open_loops(global_ranges)
  for store in ast.src:
    # top-level reduces first (each with its own lane loops), then the store inside its lanes
    for n in store.toposort():
      if n.op is Ops.REDUCE and n not in emitted and deps[n] - frozenset(_lanes(deps[n])) <= frozenset(open_ranges):
        emit_reduce(n)
    lanes = _lanes(deps[store])
    open_loops(lanes)
    emit(store)
    close_loops(lanes)
  close_loops(global_ranges)
  return out, alias


def positions(program: list[UOp]) -> dict[UOp, list[int]]:
  """Where each node stands in the program (a value used after its loop is emitted again there)."""
  where: dict[UOp, list[int]] = {}
  for i, u in enumerate(program): where.setdefault(u, []).append(i)
  return where


def read_between(where: dict, users: dict, acc: UOp, new: UOp, update: UOp) -> bool:
  """Whether something other than `new` reads `acc` after `new` is computed and before `update` writes it: then `new`
  cannot be computed into the accumulator (a coupled group's step reads another's old value). For the renderers'
  in-place accumulate steps; `where` is positions(program), `users` each node's readers."""
  end = where[update][-1]
  start = max((i for i in where.get(new, ()) if i < end), default=end)
  return any(start < i < end for r in users.get(acc, ()) if r is not new for i in where.get(r, ()))
