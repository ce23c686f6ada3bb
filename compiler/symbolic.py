"""Symbolic simplification: constant folding, linear index arithmetic, div/mod by constants using value ranges."""
from __future__ import annotations
import math
from .uop import UOp, Ops, exec_alu, ALU
from .dtype import dtypes
from .pattern import UPat, PatternMatcher, graph_rewrite, substitute


def sort_key(u: UOp) -> tuple:
  """A deterministic order for the terms of a sum (cached on the node)."""
  key = u.__dict__.get("_sort_key")
  if key is None:
    if u.op is Ops.RANGE: key = (0, u.arg[0])
    elif u.op is Ops.DEFINE_VAR: key = (1, u.arg[0])
    elif u.op is Ops.CONST: key = (3, repr(u.arg))
    else: key = (2, u.op.value, repr(u.arg), tuple(sort_key(s) for s in u.src))
    u.__dict__["_sort_key"] = key
  return key


# ---------- linear forms: sum(coef * term) + const, for index arithmetic ----------
def linear(u: UOp) -> tuple[dict[UOp, int], int]:
  if u.op is Ops.CONST: return {}, u.arg
  if u.op is Ops.ADD:
    (ta, ca), (tb, cb) = linear(u.src[0]), linear(u.src[1])
    out = dict(ta)
    for t, c in tb.items(): out[t] = out.get(t, 0) + c
    return {t: c for t, c in out.items() if c != 0}, ca + cb
  if u.op is Ops.NEG:
    t, c = linear(u.src[0])
    return {k: -v for k, v in t.items()}, -c
  if u.op is Ops.MUL and (u.src[0].op is Ops.CONST or u.src[1].op is Ops.CONST):
    k, x = (u.src[0].arg, u.src[1]) if u.src[0].op is Ops.CONST else (u.src[1].arg, u.src[0])
    if k == 0: return {}, 0
    t, c = linear(x)
    return {a: b * k for a, b in t.items()}, c * k
  return {u: 1}, 0


def from_linear(terms: dict[UOp, int], const: int, dtype=dtypes.index) -> UOp:
  out = None
  for t in sorted(terms, key=sort_key):
    c = terms[t]
    if c == 0: continue
    term = t if c == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, c)))
    out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
  if out is None: return UOp.const(dtype, const)
  return out if const == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(dtype, const)))


def fold_div_mod(terms: dict[UOp, int], const: int) -> tuple[dict[UOp, int], int]:
  """A linear form with each k*((x // c) * c) + k*(x % c) folded back into k*x, whatever x: exact for floor and for
  truncating division alike (both define x % c as x - (x // c) * c). A view that splits an axis and merges it again
  leaves such pairs in its indices (and they hide a unit stride from vector lanes and coalescing)."""
  while True:
    pair = next(((t, q) for t in terms if t.op is Ops.MOD and t.src[1].op is Ops.CONST for q in terms
                 if q.op is Ops.IDIV and q.src[0] is t.src[0] and q.src[1] is t.src[1]
                 and terms[q] == terms[t] * t.src[1].arg), None)
    if pair is None: return terms, const
    mod, div = pair
    terms = dict(terms)
    scale = terms.pop(mod)
    terms.pop(div)
    inner, c = fold_div_mod(*linear(mod.src[0]))
    for t, k in inner.items(): terms[t] = terms.get(t, 0) + k * scale
    terms = {t: k for t, k in terms.items() if k != 0}
    const += c * scale


def canonical_linear(x: UOp) -> UOp | None:
  terms, c = fold_div_mod(*linear(x))
  out = from_linear(terms, c, x.dtype)
  return None if out is x else out


def div_mod_const(x: UOp, c: UOp, op: Ops) -> UOp | None:
  d = c.arg
  if d == 1: return x if op is Ops.IDIV else x.const_like(0)
  if d <= 0 or x.vmin < 0: return None
  if x.vmax < d: return x.const_like(0) if op is Ops.IDIV else x
  # nested: (y // a) // d -> y // (a*d);  (y % (k*d)) // d -> (y // d) % k;  (y % (k*d)) % d -> y % d
  if x.op is Ops.IDIV and op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
    return UOp(Ops.IDIV, x.dtype, (x.src[0], x.const_like(x.src[1].arg * d)))
  if x.op is Ops.MOD and x.src[1].op is Ops.CONST and x.src[1].arg % d == 0 and x.src[0].vmin >= 0:
    y, m = x.src[0], x.src[1].arg
    if op is Ops.MOD: return UOp(Ops.MOD, x.dtype, (y, c))
    return UOp(Ops.MOD, x.dtype, (UOp(Ops.IDIV, x.dtype, (y, c)), x.const_like(m // d)))
  terms, k = linear(x)
  if not terms: return None
  g = math.gcd(d, k, *terms.values())
  if g > 1:
    inner = from_linear({t: v // g for t, v in terms.items()}, k // g, x.dtype)
    if op is Ops.IDIV: return UOp(Ops.IDIV, x.dtype, (inner, x.const_like(d // g)))
    return UOp(Ops.MUL, x.dtype, (UOp(Ops.MOD, x.dtype, (inner, x.const_like(d // g))), x.const_like(g)))
  # blocks: x = c*hi + lo with c dividing d and 0 <= lo < c: x // d = hi // (d/c), x % d = (hi % (d/c))*c + lo
  # (a loop over 8-wide lanes inside 32-element blocks: (8*i + lane) // 32 = i // 4)
  for v0 in sorted({v for v in terms.values()}, reverse=True):
    cd = math.gcd(d, v0)
    if cd <= 1 or cd == d: continue
    lo = from_linear({t: v for t, v in terms.items() if v % cd}, k % cd, x.dtype)
    if lo.vmin < 0 or lo.vmax >= cd: continue
    hi = from_linear({t: v // cd for t, v in terms.items() if v % cd == 0}, k // cd, x.dtype)
    if hi.vmin < 0: continue
    q = UOp(Ops.IDIV if op is Ops.IDIV else Ops.MOD, x.dtype, (hi, x.const_like(d // cd)))
    return q if op is Ops.IDIV else UOp(Ops.ADD, x.dtype, (UOp(Ops.MUL, x.dtype, (q, x.const_like(cd))), lo))
  q_terms = {t: v // d for t, v in terms.items() if v % d == 0}
  r_terms = {t: v for t, v in terms.items() if v % d != 0}
  if not q_terms and k < d: return None
  rem = from_linear(r_terms, k % d, x.dtype)
  if rem.vmin < 0 or rem.vmax >= d:
    if not q_terms: return None
    # split off the exact part: (d*q + r) // d = q + r // d when both parts are non-negative
    quot = from_linear(q_terms, k // d, x.dtype)
    if quot.vmin < 0 or rem.vmin < 0: return None
    if op is Ops.IDIV: return UOp(Ops.ADD, x.dtype, (quot, UOp(Ops.IDIV, x.dtype, (rem, c))))
    return UOp(Ops.MOD, x.dtype, (rem, c)) if r_terms else None
  if op is Ops.MOD: return rem
  return from_linear(q_terms, k // d, x.dtype)


def fold_const(u: UOp) -> UOp | None:
  if not all(s.op is Ops.CONST for s in u.src): return None
  if u.op is Ops.MAX and u.dtype.is_float and any(math.isnan(s.arg) for s in u.src):
    return UOp.const(u.dtype, math.nan)   # as the kernels' MAX (and numpy's maximum): NaN from either side
  try:
    return UOp.const(u.dtype, exec_alu(u.op, u.dtype, tuple(s.arg for s in u.src)))
  except (NotImplementedError, OverflowError, ValueError, ZeroDivisionError):
    return None


def fold_range(u: UOp) -> UOp | None:
  """Any integer or bool node whose value range is a single point is that constant."""
  if u.op is Ops.CONST or u.dtype is None or not (u.dtype.is_int or u.dtype.is_bool): return None
  if u.op in (Ops.BUFFER, Ops.PARAM, Ops.LOAD, Ops.INDEX, Ops.STORE, Ops.DEFINE_VAR, Ops.BIND): return None
  lo, hi = u.vrange
  if lo == hi and not isinstance(lo, float): return UOp.const(u.dtype, lo)
  return None


def cmp_blocks(x: UOp, c: int, upper: bool) -> UOp | None:
  """x < c (upper) or c < x for an index x = g*hi + lo with 0 <= lo < g, when the bound falls on a multiple of g:
  the comparison is one of hi alone (8 lanes inside a loop over 8-wide blocks: 8*i + lane < 64 <=> i < 8), so a
  gate on a cat's piece is the same for every lane of a vector."""
  terms, m = linear(x)
  if len(terms) < 2 or isinstance(m, float): return None
  bound = c - m if upper else c - m + 1          # upper: g*hi + lo < bound;  else: g*hi + lo >= bound
  for g in sorted({abs(v) for v in terms.values()}, reverse=True):
    if g < 2 or bound % g: continue
    hi = {t: v // g for t, v in terms.items() if v % g == 0}
    lo = {t: v for t, v in terms.items() if v % g}
    if not hi or not lo: continue
    low = from_linear(lo, 0, x.dtype)
    if low.vmin < 0 or low.vmax >= g: continue
    high = from_linear(hi, 0, x.dtype)
    if upper: return UOp(Ops.CMPLT, dtypes.bool, (high, high.const_like(bound // g)))
    return UOp(Ops.CMPLT, dtypes.bool, (high.const_like(bound // g - 1), high))
  return None


def conjuncts(valid: UOp) -> list[UOp]:
  """The conjuncts of a gate (an AND tree of bools)."""
  stack, out = [valid], []
  while stack:
    u = stack.pop()
    if u.op is Ops.AND and u.dtype is not None and u.dtype.is_bool: stack += u.src
    else: out.append(u)
  return out


def _range_bounds(valid: UOp) -> dict[UOp, tuple[int, int]]:
  """Bounds on loop ranges that a gate implies: each conjunct k*r + m < c or c < k*r + m (k > 0) narrows r."""
  bounds: dict[UOp, tuple[int, int]] = {}
  for c in conjuncts(valid):
    if c.op is not Ops.CMPLT: continue
    a, b = c.src
    upper = b.op is Ops.CONST and a.dtype is dtypes.index
    if not upper and not (a.op is Ops.CONST and b.dtype is dtypes.index): continue
    terms, m = linear(a if upper else b)
    if len(terms) != 1: continue
    (r, k), = terms.items()
    if r.op is not Ops.RANGE or k <= 0 or isinstance(m, float): continue
    lo, hi = bounds.get(r, (r.vmin, r.vmax))
    if upper: hi = min(hi, (b.arg - m - 1) // k)           # k*r + m < c  <=>  r <= (c - m - 1) // k
    else: lo = max(lo, -(-(a.arg - m + 1) // k))           # c < k*r + m  <=>  r >= ceil((c - m + 1) / k)
    bounds[r] = (lo, hi)
  return bounds


def narrow_index(b: UOp, i: UOp, v: UOp) -> UOp | None:
  """An index read only where its gate holds, simplified for the loop values the gate lets through (the pieces of a
  cat: under r < 64 a piece's (r1*64 + r) // 4096 is 0 and its div/mod chains fold away; under 63 < r, r - 64 is
  non-negative and divides). Each narrowed range stands in as a Variable with the narrower bounds while the index
  is simplified, then goes back: equal wherever the gate is true, which is everywhere the load happens."""
  node = UOp(Ops.INDEX, None, (b, i, v))
  hit = node.__dict__.get("_narrowed", False)
  if hit is not False: return hit
  out = None
  bounds = {r: lh for r, lh in _range_bounds(v).items() if lh != r.vrange and lh[0] <= lh[1] and r in i.toposort()}
  if bounds:
    # r = lo + u with u in [0, hi - lo]: the offset joins the index's constant (r - 64 of a cat's second piece)
    var = {r: UOp(Ops.DEFINE_VAR, dtypes.index, (), (f"_gated_range{r.arg[0]}", 0, hi - lo)) for r, (lo, hi) in bounds.items()}
    j = graph_rewrite(substitute(i, {r: u + bounds[r][0] for r, u in var.items()}), symbolic)
    # (simplified again after: the form the rewrite keeps, so that this is its fixed point)
    j = graph_rewrite(substitute(j, {u: r + (-bounds[r][0]) for r, u in var.items()}), symbolic)
    if j is not i: out = UOp(Ops.INDEX, None, (b, j, v))
  node.__dict__["_narrowed"] = out
  if out is not None: out.__dict__["_narrowed"] = None
  return out


def _is(v): return lambda u: u.op is Ops.CONST and u.arg == v
def _int(u): return u.dtype is not None and (u.dtype.is_int or u.dtype.is_bool)

symbolic = PatternMatcher([
  (UPat(ALU | {Ops.CAST}, name="u"), lambda u: fold_const(u) if u.op is not Ops.CAST or u.src[0].op is not Ops.CONST
   else UOp.const(u.dtype, u.src[0].arg)),
  (UPat(ALU | {Ops.CAST, Ops.RANGE}, name="u"), fold_range),
  # index arithmetic in canonical linear form (merges x*c1 + x*c2)
  (UPat((Ops.ADD, Ops.MUL, Ops.NEG), dtype=dtypes.index, name="x"), canonical_linear),
  (UPat((Ops.IDIV, Ops.MOD), src=(UPat.var("x"), UPat.cvar("c")), name="u"),
   lambda u, x, c: div_mod_const(x, c, u.op) if _int(x) else None),
  # a loop index over a symbolic bound n is in [0, n): r % n is r, r // n is 0 (a KV cache read over 0..pos)
  (UPat((Ops.IDIV, Ops.MOD), src=(UPat(Ops.RANGE, name="r"), UPat.var("n")), name="u"),
   lambda u, r, n: (r if u.op is Ops.MOD else r.const_like(0)) if r.src[0] is n else None),
  # identities
  (UPat(Ops.ADD, src=(UPat.var("x"), UPat(predicate=_is(0))), commutative=True), lambda x: x if _int(x) else None),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat(predicate=_is(1))), commutative=True), lambda x: x),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat(predicate=_is(0), name="z")), commutative=True), lambda x, z: z if _int(x) else None),
  (UPat(Ops.AND, src=(UPat.var("x"), UPat(Ops.CONST, name="c")), commutative=True),
   lambda x, c: (x if c.arg else c) if x.dtype.is_bool else None),
  (UPat(Ops.OR, src=(UPat.var("x"), UPat(Ops.CONST, name="c")), commutative=True),
   lambda x, c: (c if c.arg else x) if x.dtype.is_bool else None),
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
  (UPat(Ops.CAST, name="u"), lambda u: u.src[0] if u.src[0].dtype == u.dtype else None),
  # a reduce over a constant (size-1) range: drop the range
  (UPat(Ops.REDUCE, name="u"), lambda u: (u.src[0] if len(u.src) == 1 else None) if all(r.op is Ops.RANGE for r in u.src[1:])
   else u.replace(src=(u.src[0],) + tuple(r for r in u.src[1:] if r.op is Ops.RANGE))),
  # an index whose validity is always true needs no gate
  (UPat(Ops.INDEX, src=(UPat.var("b"), UPat.var("i"), UPat(Ops.CONST, name="v"))),
   lambda b, i, v: UOp(Ops.INDEX, None, (b, i)) if v.arg else None),
  (UPat(Ops.CMPLT, src=(UPat.var("x", dtype=dtypes.index), UPat.cvar("c"))), lambda x, c: cmp_blocks(x, c.arg, True)),
  (UPat(Ops.CMPLT, src=(UPat.cvar("c"), UPat.var("x", dtype=dtypes.index))), lambda x, c: cmp_blocks(x, c.arg, False)),
  # an index under a gate: simplified for the loop values that reach it
  (UPat(Ops.INDEX, src=(UPat.var("b"), UPat.var("i"), UPat((Ops.CMPLT, Ops.AND), name="v"))), narrow_index),
])
