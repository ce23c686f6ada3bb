"""Gathers: a sum over a loop of `where(loop == e, value, 0)` is `value` at loop = e.

The Tensor layer has no gather op: an embedding lookup or an index with an index tensor (`table[idx]`) is a one-hot
mask times the table, summed over the table's rows, the same graph on every device (its gradient is the matching
scatter-add). Computed as written, each output element reads a whole column of the table. Here, on a kernel's
AST, such a reduction becomes the one load it stands for:

    REDUCE(ADD, WHERE(CAST(r) == e, v(r), 0), r)   ->   WHERE(0 <= e < n, v(e), 0)      (n the size of r)

where e does not depend on r (the index read from memory), and every load of v(e) is gated by the same bounds (an
index out of range reads nothing and gives 0, as the sum did). The equality is Tensor.eq's form:
CMPNE(CMPNE(a, b), True) with a or b the loop index (cast to the index tensor's type).
"""
from __future__ import annotations
from .uop import UOp, Ops
from .dtype import dtypes
from .pattern import substitute


def _loop_equality(cond: UOp):
  """(range, e) where cond is `CAST(range) == e` (either order), else None."""
  if cond.op is not Ops.CMPNE or cond.src[1].op is not Ops.CONST or cond.src[1].arg is not True: return None
  ne = cond.src[0]
  if ne.op is not Ops.CMPNE: return None
  for a, b in (ne.src, ne.src[::-1]):
    r = a.src[0] if a.op is Ops.CAST and a.dtype.is_int else a
    if r.op is Ops.RANGE and r.arg[1] == "reduce" and r not in b.toposort(): return r, b
  return None


def _fold(red: UOp) -> UOp | None:
  if red.arg is not Ops.ADD: return None
  value, cast = red.src[0], None
  if value.op is Ops.CAST: value, cast = value.src[0], value.dtype
  if value.op is not Ops.WHERE or value.src[2].op is not Ops.CONST or value.src[2].arg != 0: return None
  found = _loop_equality(value.src[0])
  if found is None or found[0] not in red.src[1:]: return None
  r, e = found
  size = r.src[0]
  at = e.cast(dtypes.index)
  inside = (UOp.const(dtypes.index, -1) < at) & (at < size)
  picked = substitute(value.src[1], {r: at})
  # every load that now reads at e is gated: an index out of range reads nothing
  gates = {}
  for u in picked.toposort():
    if u.op is Ops.INDEX and at in u.src[1].toposort():
      gates[u] = u.replace(src=(u.src[0], u.src[1], inside if len(u.src) == 2 else u.src[2] & inside))
  picked = substitute(picked, gates)
  out = inside.where(picked, value.src[2])
  if cast is not None: out = out.cast(cast)
  rest = tuple(x for x in red.src[1:] if x is not r)
  return UOp(Ops.REDUCE, red.dtype, (out, *rest), red.arg) if rest else out


def fold_gathers(ast: UOp) -> UOp:
  """`ast` with each one-hot reduction replaced by the load it stands for (see the top)."""
  while True:     # one at a time, innermost first: a folded reduction may sit inside another one
    for red in ast.toposort():
      if red.op is Ops.REDUCE and (new := _fold(red)) is not None:
        ast = substitute(ast, {red: new})
        break
    else: return ast
