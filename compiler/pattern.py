"""Pattern matching on UOps and the one rewrite engine every pass uses."""
from __future__ import annotations
import inspect, itertools, sys
from typing import Callable, Iterable
from .uop import UOp, Ops

_ANY = object()


class UPat:
  """Matches a UOp by op, dtype, arg and sources; `name` captures the matched node for the rewrite function."""
  __slots__ = ("ops", "dtypes", "src", "arg", "name", "commutative", "predicate")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype=None, src: tuple | None = None, arg=_ANY,
               name: str | None = None, commutative: bool = False, predicate: Callable | None = None):
    self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
    self.dtypes = None if dtype is None else (frozenset(dtype) if isinstance(dtype, (set, frozenset, tuple, list)) else frozenset([dtype]))
    self.src, self.arg, self.name, self.commutative, self.predicate = src, arg, name, commutative, predicate

  @staticmethod
  def var(name: str | None = None, dtype=None) -> "UPat": return UPat(name=name, dtype=dtype)
  @staticmethod
  def cvar(name: str | None = None, dtype=None) -> "UPat": return UPat(Ops.CONST, dtype=dtype, name=name)

  def match(self, u: UOp, store: dict) -> bool:
    if self.ops is not None and u.op not in self.ops: return False
    if self.dtypes is not None and u.dtype not in self.dtypes: return False
    if self.arg is not _ANY and self.arg != u.arg: return False
    if self.name is not None:
      prev = store.get(self.name)
      if prev is not None and prev is not u: return False
      store[self.name] = u
    if self.predicate is not None and not self.predicate(u): return False
    if self.src is None: return True
    if len(self.src) != len(u.src): return False
    orders = [u.src] if not (self.commutative and len(u.src) == 2) else [u.src, u.src[::-1]]
    for srcs in orders:
      trial = dict(store)
      if all(p.match(s, trial) for p, s in zip(self.src, srcs)):
        store.clear(); store.update(trial)
        return True
    return False


class PatternMatcher:
  """An ordered list of (UPat, fn). fn gets the captures as keyword args (and `ctx` if it asks) and
  returns a replacement UOp or None."""

  def __init__(self, patterns: list[tuple[UPat, Callable]]):
    self.patterns = patterns
    self.by_op: dict[Ops, list] = {}
    for pat, fn in patterns:
      wants_ctx = "ctx" in inspect.signature(fn).parameters
      for op in (pat.ops if pat.ops is not None else list(Ops)):
        self.by_op.setdefault(op, []).append((pat, fn, wants_ctx))

  def __add__(self, other: "PatternMatcher") -> "PatternMatcher": return PatternMatcher(self.patterns + other.patterns)

  def rewrite(self, u: UOp, ctx=None) -> UOp | None:
    for pat, fn, wants_ctx in self.by_op.get(u.op, ()):
      store: dict = {}
      if pat.match(u, store):
        out = fn(ctx=ctx, **store) if wants_ctx else fn(**store)
        if out is not None and out is not u: return out
    return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx=None, stats: dict | None = None) -> UOp:
  """Rewrite bottom-up to a fixed point: sources first, then the node until no pattern applies."""
  done: dict[UOp, UOp] = {}
  count = itertools.count()

  def visit(n: UOp) -> UOp:
    hit = done.get(n)
    if hit is not None: return hit
    src = tuple(visit(s) for s in n.src)
    m = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
    r = pm.rewrite(m, ctx)
    if r is not None: next(count)
    out = m if r is None else visit(r)
    done[n] = out
    done[m] = out
    return out

  for node in root.toposort(): visit(node)
  if stats is not None: stats["rewrites"] = stats.get("rewrites", 0) + next(count)
  return done[root]


def substitute(root: UOp, mapping: dict[UOp, UOp], order: list[UOp] | None = None) -> UOp:
  """Replace nodes by identity (no pattern matching). `order`: root.toposort(), if the caller has it."""
  done: dict[UOp, UOp] = {}
  for n in (order if order is not None else root.toposort()):
    if n in mapping: done[n] = mapping[n]; continue
    src = tuple(done[s] for s in n.src)
    done[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
  return done[root]
