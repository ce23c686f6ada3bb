"""Symbolic sizes: a size or an offset in a shape is an int or an index UOp over Variables.

A Variable is a DEFINE_VAR (arg: name, min, max). A user binds it to a value (BIND(DEFINE_VAR, CONST value)) and
uses that bound variable, or arithmetic on it (`start_pos + 1`), wherever an int size or offset goes: the shapes of
the Tensor graph hold these expressions, so `Tensor.shape` shows them and each node knows the values it was built
with. The scheduler unbinds them (compiler/schedule.py: BIND -> its DEFINE_VAR, the values collected as the
kernels' variable values), so graphs that differ only in the values share their kernels and their schedule.

Expressions are kept in one canonical linear form (symbolic.linear: sum of coef * term + const, terms in a fixed
order), so `(p + 1) + 1` and `p + 2` are the same node and shapes built two ways compare equal. A value in
[min, max] is what the bounds of a Variable promise; buffers of a symbolic size are allocated at the largest size.
"""
from __future__ import annotations
import functools, math
from . import uop as _uop_module
from .uop import UOp, Ops, exec_alu
from .dtype import dtypes

sint = int | UOp


def is_sym(x) -> bool: return isinstance(x, UOp)


def canonical(x) -> sint:
  """The canonical form of an index expression; an int where it is constant."""
  if not isinstance(x, UOp): return x
  from .symbolic import linear, from_linear
  if x.op in (Ops.DEFINE_VAR, Ops.BIND): return x
  terms, const = linear(x)
  if not terms: return const
  return from_linear(terms, const)


def _u(x) -> UOp: return x if isinstance(x, UOp) else UOp.const(dtypes.index, int(x))


def sadd(a, b) -> sint:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a + b
  return canonical(_u(a) + _u(b))


def ssub(a, b) -> sint:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a - b
  return canonical(_u(a) + _u(b) * -1)


def smul(a, b) -> sint:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a * b
  if isinstance(a, UOp) and isinstance(b, UOp):
    return canonical(UOp(Ops.MUL, dtypes.index, (a, b)))     # not linear: kept as a product of its terms
  return canonical(_u(a) * _u(b))


def sdiv_exact(a, b) -> sint | None:
  """a / b where b divides a exactly (the -1 of a reshape), else None: ints, a linear form by an int that divides
  each of its coefficients, or a term times an int by that term."""
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a // b if b and a % b == 0 else None
  from .symbolic import linear, from_linear
  ta, ca = linear(_u(a))
  if not isinstance(b, UOp):
    if b == 0 or ca % b or any(c % b for c in ta.values()): return None
    return canonical(from_linear({t: c // b for t, c in ta.items()}, ca // b))
  tb, cb = linear(b)
  if cb == 0 and len(tb) == 1 and ca == 0 and len(ta) == 1:
    (t, k), = tb.items()
    if t in ta and ta[t] % k == 0: return ta[t] // k
  return None


def sprod(xs) -> sint:
  out: sint = 1
  for x in xs: out = smul(out, x)
  return out


def vmin(x) -> int: return x.vmin if isinstance(x, UOp) else x
def vmax(x) -> int: return x.vmax if isinstance(x, UOp) else x


def max_size(shape) -> int:
  """Elements of `shape` at the largest values of its Variables (what a buffer of that shape holds)."""
  return math.prod(max(vmax(s), 0) for s in shape)


def binds(x) -> dict[str, int]:
  """{variable name: bound value} of the BINDs in expression x (an int: none)."""
  if not isinstance(x, UOp): return {}
  out = x.__dict__.get("_binds")
  if out is None:
    out = {n.src[0].arg[0]: n.src[1].arg for n in x.toposort() if n.op is Ops.BIND}
    x.__dict__["_binds"] = out
  return out


def evaluate(x, var_vals: dict[str, int] | None = None) -> int:
  """The value of x: BINDs take their bound value, DEFINE_VARs the one in var_vals."""
  if not isinstance(x, UOp): return x
  vals: dict[UOp, int] = {}
  for n in x.toposort():
    if n.op is Ops.BIND: vals[n] = n.src[1].arg
    elif n.op is Ops.DEFINE_VAR:
      if var_vals is not None and n.arg[0] in var_vals: vals[n] = var_vals[n.arg[0]]
    elif n.op is Ops.CONST: vals[n] = n.arg
    else:
      missing = next((s for s in n.src if s not in vals), None)
      if missing is not None:
        raise ValueError(f"the size {render(x)} needs a value for the Variable {missing.arg[0]!r}: bind it (v.bind(k))")
      vals[n] = exec_alu(n.op, n.dtype, tuple(vals[s] for s in n.src))
  if x not in vals: raise ValueError(f"the size {render(x)} needs a value for the Variable {x.arg[0]!r}: bind it")
  return int(vals[x])


@functools.lru_cache(maxsize=4096)
def evaluator(x: UOp):
  """x as a function of {variable name: value}, built once per expression (`evaluate` walks the graph on every call,
  ~36 us for a launch grid; a JIT replay resolves its symbolic grids each time). BINDs take their bound value."""
  if not isinstance(x, UOp): return lambda d: x
  built: dict[UOp, object] = {}
  for n in x.toposort():
    if n.op is Ops.BIND: built[n] = (lambda v: lambda d: v)(n.src[1].arg)
    elif n.op is Ops.DEFINE_VAR: built[n] = (lambda name: lambda d: d[name])(n.arg[0])
    elif n.op is Ops.CONST: built[n] = (lambda v: lambda d: v)(n.arg)
    elif n.dtype == dtypes.index and n.op in _INDEX_OPS:    # exact Python ints: no truncation to a C type
      built[n] = (lambda fn, f, g: lambda d: fn(f(d), g(d)))(_INDEX_OPS[n.op], *(built[s] for s in n.src))
    else:
      fs = tuple(built[s] for s in n.src)
      built[n] = (lambda op, dt, fs: lambda d: exec_alu(op, dt, tuple(f(d) for f in fs)))(n.op, n.dtype, fs)
  return built[x]


# index arithmetic as exec_alu computes it (IDIV truncates toward zero, as C), without its dispatch
_INDEX_OPS = {Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.MAX: max,
              Ops.IDIV: lambda a, b: 0 if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)}


def unbind(x):
  """x with each BIND replaced by its Variable (cached on the node)."""
  if not isinstance(x, UOp): return x
  out = x.__dict__.get("_unbound")
  if out is None:
    done: dict[UOp, UOp] = {}
    for n in x.toposort():
      if n.op is Ops.BIND: done[n] = n.src[0]
      else:
        src = tuple(done[s] for s in n.src)
        done[n] = n if src == n.src else n.replace(src=src)
    out = x.__dict__["_unbound"] = done[x]
  return out


def rebind(x, var_vals: dict[str, int]):
  """x with each Variable (bound or not) bound to its value in var_vals."""
  if not isinstance(x, UOp): return x
  done: dict[UOp, UOp] = {}
  for n in x.toposort():
    if n.op is Ops.BIND: done[n] = UOp(Ops.BIND, dtypes.index, (n.src[0], UOp.const(dtypes.index, var_vals[n.src[0].arg[0]])))
    elif n.op is Ops.DEFINE_VAR and n.arg[0] in var_vals:
      done[n] = UOp(Ops.BIND, dtypes.index, (n, UOp.const(dtypes.index, var_vals[n.arg[0]])))
    else:
      src = tuple(done[s] for s in n.src)
      done[n] = n if src == n.src else n.replace(src=src)
  return done[x]


def has_sym(arg) -> bool:
  """Does a movement op's arg (nested tuples of ints, floats and UOps) hold a symbolic size?"""
  if isinstance(arg, UOp): return True
  if isinstance(arg, tuple): return any(has_sym(a) for a in arg)
  return False


def map_arg(arg, fn):
  """arg with fn applied to each UOp in it."""
  if isinstance(arg, UOp): return fn(arg)
  if isinstance(arg, tuple): return tuple(map_arg(a, fn) for a in arg)
  return arg


def arg_binds(arg) -> dict[str, int]:
  out: dict[str, int] = {}
  map_arg(arg, lambda u: out.update(binds(u)) or u)
  return out


_OPS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%"}


def render(x) -> str:
  """A short form of a size for shapes and messages: `start_pos+1`, `start_pos[=5]+1` for a bound one."""
  if not isinstance(x, UOp): return str(x)
  if x.op is Ops.CONST: return str(x.arg)
  if x.op is Ops.DEFINE_VAR: return x.arg[0]
  if x.op is Ops.BIND: return f"{x.src[0].arg[0]}[={x.src[1].arg}]"
  if x.op is Ops.NEG: return f"-{render(x.src[0])}"
  if x.op is Ops.MAX: return f"max({render(x.src[0])}, {render(x.src[1])})"
  if x.op in _OPS:
    a, b = render(x.src[0]), render(x.src[1])
    if x.op is Ops.ADD and b.startswith("-"): return f"{a}{b}"
    if x.op is Ops.MUL and x.src[0].op is Ops.ADD: a = f"({a})"
    return f"{a}{_OPS[x.op]}{b}"
  return f"{x.op.name.lower()}(...)"


_uop_module.size_ops.update(add=sadd, sub=ssub, render=render, evaluate=evaluate)
