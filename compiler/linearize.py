"""Linearize a kernel AST into an ordered list of UOps with explicit loops and accumulators.

Each value is placed in the outermost loop where all the ranges it depends on are open; a REDUCE becomes
DEFINE_ACC, its loops, ACC_UPDATE, ENDRANGE, and finally the REDUCE itself (which reads the accumulator).
"""
from __future__ import annotations
from .uop import UOp, Ops


def range_deps(ast: UOp) -> dict[UOp, frozenset]:
  deps: dict[UOp, frozenset] = {}
  for u in ast.toposort():
    if u.op is Ops.RANGE: deps[u] = frozenset([u]) | deps[u.src[0]]
    elif u.op is Ops.REDUCE: deps[u] = deps[u.src[0]] - frozenset(u.src[1:])
    else: deps[u] = frozenset().union(*(deps[s] for s in u.src)) if u.src else frozenset()
  return deps


def linearize(ast: UOp) -> tuple[list[UOp], dict[UOp, UOp]]:
  """Returns the ordered program and, for each REDUCE, the accumulator that holds its result."""
  deps = range_deps(ast)
  out: list[UOp] = []
  emitted: set[UOp] = set()
  open_ranges: list[UOp] = []
  n_acc = [0]

  def emit(u: UOp):
    if u in emitted: return
    if u.op is Ops.REDUCE: return emit_reduce(u)
    if u.op is Ops.RANGE:   # a range used outside its loop would be a bug in rangeify
      raise RuntimeError(f"RANGE {u.arg} used outside its loop")
    for s in u.src: emit(s)
    out.append(u); emitted.add(u)

  def hoist(root: UOp, allowed: frozenset):
    for n in root.toposort():
      if n not in emitted and n.op is not Ops.RANGE and deps[n] <= allowed: emit(n)

  def open_loops(ranges):
    for r in ranges:
      emit(r.src[0])
      out.append(r); emitted.add(r); open_ranges.append(r)

  def close_loops(ranges):
    for r in reversed(ranges):
      out.append(UOp(Ops.ENDRANGE, None, (r,)))
      open_ranges.pop()

  def emit_reduce(u: UOp):
    hoist(u.src[0], frozenset(open_ranges))
    acc = UOp(Ops.DEFINE_ACC, u.dtype, (), (u.arg, n_acc[0])); n_acc[0] += 1
    out.append(acc)
    ranges = sorted(u.src[1:], key=lambda r: r.arg[0])
    open_loops(ranges)
    emit(u.src[0])
    out.append(UOp(Ops.ACC_UPDATE, u.dtype, (acc, u.src[0]), u.arg))
    close_loops(ranges)
    emitted.add(u)
    alias[u] = acc

  alias: dict[UOp, UOp] = {}
  global_ranges = sorted({r for r in deps[ast] if r.arg[1] == "global"}, key=lambda r: r.arg[0])
  open_loops(global_ranges)
  for store in ast.src: emit(store)
  close_loops(global_ranges)
  return out, alias
