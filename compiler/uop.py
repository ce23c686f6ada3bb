"""The UOp IR: one immutable, hash-consed node type for every stage from Tensor graph to linear program."""
from __future__ import annotations
import math, threading, weakref, functools
from enum import Enum, auto
from typing import Any
from .dtype import DType, dtypes, truncate


class Ops(Enum):
  # sources
  BUFFER = auto()       # a device buffer (arg: hcq Buffer); shape (size,)
  CONST = auto()        # a scalar (arg: value); shape ()
  DEFINE_VAR = auto()   # a symbolic integer (arg: (name, min, max))
  BIND = auto()         # DEFINE_VAR bound to a value (src: (var, CONST))
  PARAM = auto()        # kernel parameter slot (arg: index); a pointer
  DEVICE = auto()       # where a constant lives (arg: device name); src of tensor-level CONST/IOTA
  IOTA = auto()         # the integers 0..n-1 (arg: n); src (DEVICE,)
  # movement (tensor level)
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()
  # reductions
  REDUCE_AXIS = auto()  # tensor level: arg (op, axes); keeps reduced dims as 1
  REDUCE = auto()       # kernel level: src (value, *ranges), arg op; or (op, ("coupled", k)): see `coupled`
  ATTEND = auto()       # tensor level: sum over axis arg of softmax(src[0]) * src[1] (attention's weighted sum, one
                        # kernel with an online softmax: rangeify.attend); sources broadcast (size-1 dims), equal
                        # along the axis; keeps the axis as 1
  # unary
  RECIP = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); TRUNC = auto(); FLOOR = auto(); NEG = auto()
  CAST = auto(); BITCAST = auto()
  # binary
  ADD = auto(); MUL = auto(); MAX = auto(); MOD = auto(); IDIV = auto(); CMPLT = auto(); CMPNE = auto()
  XOR = auto(); OR = auto(); AND = auto(); SHL = auto(); SHR = auto()
  # ternary
  WHERE = auto()
  # materialization and ordering
  CONTIGUOUS = auto()   # force a buffer here
  DETACH = auto()       # the same value, but gradients stop here
  COPY = auto()         # to another device (arg: device name, or a tuple of them: a copy on each)
  ASSIGN = auto()       # write src[1] into the buffer of src[0]
  SINK = auto()
  # kernel level
  RANGE = auto()        # loop counter: src (size,), arg (id, kind)
  SPECIAL = auto()      # a hardware thread index: arg (name, size), 0 <= value < size. "gidx": the global linear
                        # thread id (one 1-D grid); "gid0/1/2": the workgroup (block) index along x/y/z; "lid0/1/2":
                        # the thread index inside its workgroup along x/y/z; "core": a CPU thread (opt THREAD)
  DEFINE_LOCAL = auto() # GPU workgroup memory (LDS / .shared / threadgroup): arg (id, count), dtype the element;
                        # used like a PARAM as INDEX's src[0]
  WMMA = auto()         # tensor core: element arg[1] of D = A @ B + C for this lane, src the lane's elements of A, B, C
                        # (compiler/tc.py: arg (config name, element))
  BARRIER = auto()      # every thread of the workgroup waits here: src the local STOREs it orders; a LOAD from a
                        # DEFINE_LOCAL has it as src[1] (the load runs after the barrier)
  INDEX = auto()        # src (param, linear index[, valid])
  LOAD = auto()
  STORE = auto()        # src (index, value)
  # linear program only
  DEFINE_ACC = auto(); ACC_UPDATE = auto(); ENDRANGE = auto()
  # lowered only (compiler/lower.py): a / b, correctly rounded, for targets that divide (from MUL(a, RECIP(b)))
  FDIV = auto()
  # tensor level, several devices: one value on a tuple of devices, src one tensor per device, arg (the shard axis or
  # None for copies, the (start, end) of each device's part on that axis or None); tensor/multi.py lowers it to
  # per-device graphs before scheduling
  MULTI = auto()


UNARY = {Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.FLOOR, Ops.NEG}
BINARY = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.MOD, Ops.IDIV, Ops.CMPLT, Ops.CMPNE, Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR}
ALU = UNARY | BINARY | {Ops.WHERE, Ops.FDIV}
ELEMENTWISE = ALU | {Ops.CAST, Ops.BITCAST}
MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
# ops that cost tens of instructions once decomposed (exp2/log2/sin polynomials, a division or square root)
TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.FDIV})
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.XOR, Ops.OR, Ops.AND}
REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: -math.inf}


def coupled(u: UOp) -> int | None:
  """k for a REDUCE of a coupled group, else None. The REDUCEs over the same ranges whose arg is (op, ("coupled", k))
  form one group: each one's value is its accumulator's next value, read from the accumulators as they stood at the
  start of the iteration through placeholders DEFINE_ACC(src (range,), arg ("peer", k)); linearize runs them in one
  loop and writes every accumulator only after computing all the new values (an online softmax: the running maximum
  rescales the running sums). The accumulator starts at op's identity."""
  if u.op is not Ops.REDUCE or isinstance(u.arg, Ops): return None
  tag = u.arg[1]
  return tag[1] if isinstance(tag, tuple) and tag[0] == "coupled" else None


def identity_for(op: Ops, dtype: DType):
  if op is Ops.MAX: return dtype.min if not dtype.is_float else -math.inf
  return truncate(REDUCE_IDENTITY[op], dtype)


def exec_alu(op: Ops, dtype: DType, vals: tuple):
  """Evaluate an ALU op on Python values with the kernel's (C) semantics."""
  a = vals[0]
  if op is Ops.NEG: r = -a
  elif op is Ops.RECIP: r = (1.0 / a) if a != 0 else math.copysign(math.inf, a)
  elif op is Ops.SQRT: r = math.sqrt(a) if a >= 0 else math.nan
  elif op is Ops.EXP2:
    try: r = 2.0 ** a
    except OverflowError: r = math.inf
  elif op is Ops.LOG2: r = math.log2(a) if a > 0 else (-math.inf if a == 0 else math.nan)
  elif op is Ops.SIN: r = math.sin(a) if math.isfinite(a) else math.nan
  elif op is Ops.TRUNC: r = float(math.trunc(a)) if math.isfinite(a) else a
  elif op is Ops.FLOOR: r = math.copysign(float(math.floor(a)), a) if dtype.is_float and math.isfinite(a) else a
  elif op is Ops.ADD: r = a + vals[1]
  elif op is Ops.MUL: r = a * vals[1]
  elif op is Ops.MAX: r = max(a, vals[1])
  elif op is Ops.IDIV:
    b = vals[1]
    r = 0 if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
  elif op is Ops.MOD:
    b = vals[1]
    if dtype.is_float: r = math.fmod(a, b) if b != 0 and math.isfinite(a) else math.nan
    else: r = 0 if b == 0 else abs(a) % abs(b) * (-1 if a < 0 else 1)
  elif op is Ops.CMPLT: r = a < vals[1]
  elif op is Ops.CMPNE: r = a != vals[1]
  elif op is Ops.XOR: r = a ^ vals[1]
  elif op is Ops.OR: r = a | vals[1]
  elif op is Ops.AND: r = a & vals[1]
  elif op is Ops.SHL: r = a << vals[1]
  elif op is Ops.SHR: r = a >> vals[1]
  elif op is Ops.WHERE: r = vals[1] if a else vals[2]
  else: raise NotImplementedError(f"cannot evaluate {op} on constants")
  return truncate(r, dtype)


_cache_lock = threading.Lock()
try: from _weakref import _remove_dead_weakref       # CPython: delete d[key] only if it is a dead reference
except ImportError:                                   # pragma: no cover
  def _remove_dead_weakref(d, key):
    with _cache_lock:
      r = d.get(key)
      if r is not None and r() is None: del d[key]


def _drop_dead(ref) -> None: _remove_dead_weakref(UOp._cache, ref.key)


class _Ref(weakref.ref):
  """A weak reference that knows its cache key, as weakref.KeyedRef, without KeyedRef's Python-level __new__ and
  __init__ (two Python calls per new node)."""
  __slots__ = ("key",)


class UOp:
  """An immutable node `(op, dtype, src, arg)`. Equal nodes are the same object (hash-consed)."""
  __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")
  # key -> weak reference to the node: a plain dict of KeyedRefs, as WeakValueDictionary keeps them, without its
  # Python-level get(); a dead entry is dropped by CPython's own atomic helper (only if it is still the dead one)
  _cache: dict = {}

  def __new__(cls, op: Ops, dtype: DType | None = None, src: tuple = (), arg: Any = None):
    # floats are keyed by their bits so that 0.0 and -0.0 stay apart and nan finds itself
    karg = ("f", arg.hex()) if isinstance(arg, float) else arg
    # ops and dtypes are singletons: their ids hash faster than Enum/dataclass hashing
    key = (id(op), id(dtype), tuple([id(s) for s in src]), karg)
    try:
      ref = _cache_get(key)
    except TypeError:
      raise TypeError(f"UOp arg must be hashable, got {arg!r}") from None
    if ref is not None and (hit := ref()) is not None: return hit
    with _cache_lock:    # two threads making the same node at once must get one object (checked again inside)
      ref = _cache_get(key)
      if ref is not None and (hit := ref()) is not None: return hit
      self = object.__new__(cls)
      self.op, self.dtype, self.src, self.arg = op, dtype, tuple(src), arg
      ref = _Ref(self, _drop_dead)
      ref.key = key
      UOp._cache[key] = ref
    return self

  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg))
  def __repr__(self):
    if self.dtype is dtypes.index and "render" in size_ops and _is_size(self):    # a symbolic size: start_pos[=5]+1
      return size_ops["render"](self)
    return pretty(self)
  def replace(self, **kw) -> UOp:
    return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))

  # ---- graph walks ----
  def toposort(self, leaf=None) -> list[UOp]:
    """Every node reachable from self, sources before users (iterative: graphs get deep). `leaf(node)` true: the
    node is in the order but its sources are not walked (self's always are)."""
    order, seen, stack = [], {self}, [(self, iter(self.src))]
    while stack:
      node, srcs = stack[-1]
      for s in srcs:      # the next source not seen yet: visit it (its sources first), then come back for the rest
        if s not in seen:
          seen.add(s)
          if leaf is not None and leaf(s):
            order.append(s)
            continue
          stack.append((s, iter(s.src)))
          break
      else:
        stack.pop()
        order.append(node)
    return order

  # ---- derived attributes, cached on the node. Each is computed from its sources' values, filled sources first by
  # an explicit walk (`_derive`): a recursive property would recurse once per level of the graph in C, and a
  # chain of a few thousand ops would overflow the C stack (a segfault, not a RecursionError).
  @property
  def shape(self) -> tuple[int, ...]:
    d = self.__dict__
    return d["shape"] if "shape" in d else _derive(self, "shape", _shape)

  @property
  def device(self) -> str | None:
    d = self.__dict__
    return d["device"] if "device" in d else _derive(self, "device", _device)

  @functools.cached_property
  def base(self) -> UOp:
    """The node under any movement ops."""
    node = self
    while node.op in MOVEMENT: node = node.src[0]
    return node

  # ---- derived: value range (for symbolic simplification) ----
  @property
  def vrange(self) -> tuple:
    d = self.__dict__
    return d["vrange"] if "vrange" in d else _derive(self, "vrange", _vrange)
  @property
  def vmin(self): return self.vrange[0]
  @property
  def vmax(self): return self.vrange[1]

  # ---- constructors and index arithmetic sugar ----
  @staticmethod
  def const(dtype: DType, value) -> UOp: return UOp(Ops.CONST, dtype, (), truncate(value, dtype))
  def const_like(self, value) -> UOp: return UOp.const(self.dtype, value)
  def alu(self, op: Ops, *src: UOp) -> UOp:
    out = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else (src[-1].dtype if op is Ops.WHERE else self.dtype)
    return UOp(op, out, (self,) + src)
  def _c(self, x) -> UOp: return x if isinstance(x, UOp) else UOp.const(self.dtype, x)
  def __add__(self, x): return self.alu(Ops.ADD, self._c(x))
  def __radd__(self, x): return self._c(x).alu(Ops.ADD, self)
  def __mul__(self, x): return self.alu(Ops.MUL, self._c(x))
  def __rmul__(self, x): return self._c(x).alu(Ops.MUL, self)
  def __sub__(self, x): return self.alu(Ops.ADD, self._c(x).alu(Ops.NEG) if isinstance(x, UOp) else self._c(-x))
  def __rsub__(self, x): return self._c(x) - self
  def __neg__(self): return self.alu(Ops.NEG)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, self._c(x))
  def __mod__(self, x): return self.alu(Ops.MOD, self._c(x))
  def __lt__(self, x): return self.alu(Ops.CMPLT, self._c(x))
  def ne(self, x): return self.alu(Ops.CMPNE, self._c(x))
  def __and__(self, x): return self.alu(Ops.AND, self._c(x))
  def __or__(self, x): return self.alu(Ops.OR, self._c(x))
  def where(self, a: UOp, b: UOp) -> UOp: return self.alu(Ops.WHERE, a, b)
  def maximum(self, x): return self.alu(Ops.MAX, self._c(x))
  def cast(self, dtype: DType) -> UOp: return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))
  def sink(*srcs: UOp) -> UOp: return UOp(Ops.SINK, None, tuple(srcs))
  def __bool__(self): raise TypeError(f"a UOp has no truth value (op {self.op.name}); compare .op or use .arg")
  __hash__ = object.__hash__
  def __eq__(self, other): return self is other

  @property
  def val(self) -> int:
    """The value of a bound Variable, or of arithmetic on bound ones (a symbolic size: compiler/shape.py)."""
    return size_ops["evaluate"](self)

  @staticmethod
  def variable(name: str, vmin: int, vmax: int) -> UOp:
    if not (isinstance(vmin, int) and isinstance(vmax, int) and vmin <= vmax):
      raise ValueError(f"Variable {name!r} needs integer bounds min <= max, got {vmin}, {vmax}")
    return UOp(Ops.DEFINE_VAR, dtypes.index, (), (name, vmin, vmax))


_cache_get = UOp._cache.get
# Arithmetic on symbolic sizes in canonical form, and their printing (compiler/shape.py fills this when it is
# imported: a lower module is handed the functions of a higher one, so the imports stay one-way)
size_ops: dict = {}


def _derive(root: UOp, name: str, compute) -> Any:
  """Cache `compute(node)` as attribute `name` on root and every node below it that lacks it, sources first."""
  for s in root.src:     # the common case, a new node on known sources: no walk
    if name not in s.__dict__: break
  else:
    value = root.__dict__[name] = compute(root)
    return value
  stack = [(root, False)]
  while stack:
    node, ready = stack.pop()
    d = node.__dict__
    if name in d: continue
    if ready:
      d[name] = compute(node)
      continue
    stack.append((node, True))
    for s in node.src:
      if name not in s.__dict__: stack.append((s, False))
  return root.__dict__[name]


def _shape(u: UOp) -> tuple[int, ...]:
  """Tensor-level nodes' shape (its sources' are cached: see _derive)."""
  op = u.op
  if op is Ops.BUFFER: return (u.arg.size,)
  if op is Ops.IOTA: return (u.arg,)
  if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): return ()
  if op is Ops.RESHAPE or op is Ops.EXPAND: return u.arg
  if op is Ops.PERMUTE: return tuple(u.src[0].shape[i] for i in u.arg)
  if op is Ops.PAD:
    if any(isinstance(x, UOp) for x in u.src[0].shape) or any(isinstance(x, UOp) for p in u.arg[0] for x in p):
      sadd = size_ops["add"]
      return tuple(sadd(sadd(s, b), a) for s, (b, a) in zip(u.src[0].shape, u.arg[0]))
    return tuple(s + b + a for s, (b, a) in zip(u.src[0].shape, u.arg[0]))
  if op is Ops.SHRINK:
    if any(isinstance(x, UOp) for p in u.arg for x in p):
      return tuple(size_ops["sub"](e, b) for b, e in u.arg)
    return tuple(e - b for b, e in u.arg)
  if op is Ops.REDUCE_AXIS: return tuple(1 if i in u.arg[1] else s for i, s in enumerate(u.src[0].shape))
  if op is Ops.ATTEND:
    return tuple(1 if i == u.arg else (b if a == 1 else a) for i, (a, b) in enumerate(zip(u.src[0].shape, u.src[1].shape)))
  if op is Ops.ASSIGN: return u.src[0].shape
  if op is Ops.MULTI:
    shape, axis = list(u.src[0].shape), u.arg[0]
    if axis is not None: shape[axis] = sum(s.shape[axis] for s in u.src)
    return tuple(shape)
  if op is Ops.SINK: return ()
  return u.src[0].shape if u.src else ()


def _device(u: UOp) -> str | None:
  if u.op is Ops.BUFFER: return u.arg.device
  if u.op in (Ops.DEVICE, Ops.COPY): return u.arg
  if u.op is Ops.MULTI: return tuple(s.device for s in u.src)
  for s in u.src:
    if (d := s.device) is not None: return d
  return None


def _vrange(u: UOp) -> tuple:
  op, dt = u.op, u.dtype
  if op is Ops.CONST: return (u.arg, u.arg)
  if op is Ops.DEFINE_VAR: return (u.arg[1], u.arg[2])
  if op is Ops.BIND: return u.src[0].vrange
  if op is Ops.RANGE:
    size = u.src[0]
    return (0, size.vmax - 1)
  if op is Ops.SPECIAL: return (0, u.arg[1] - 1)
  full = (dt.min, dt.max) if dt is not None else (-math.inf, math.inf)
  if op is Ops.CMPLT or op is Ops.CMPNE:
    (a0, a1), (b0, b1) = u.src[0].vrange, u.src[1].vrange
    if op is Ops.CMPLT:
      if a1 < b0: return (True, True)
      if a0 >= b1: return (False, False)
    elif a1 < b0 or b1 < a0: return (True, True)
    elif a0 == a1 == b0 == b1: return (False, False)
    return (False, True)
  if dt is None or not (dt.is_int or dt.is_bool): return full
  if op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.NEG):
    (a0, a1) = u.src[0].vrange
    if op is Ops.NEG: r = (-a1, -a0)
    else:
      (b0, b1) = u.src[1].vrange
      if op is Ops.ADD: r = (a0 + b0, a1 + b1)
      elif op is Ops.MAX: r = (max(a0, b0), max(a1, b1))
      else:
        c = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
        if any(isinstance(x, float) and math.isnan(x) for x in c): return full
        r = (min(c), max(c))
    return r if full[0] <= r[0] and r[1] <= full[1] else full
  if op is Ops.IDIV and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
    (a0, a1), c = u.src[0].vrange, u.src[1].arg
    if a0 >= 0: return (a0 // c, a1 // c)
    return (-(-a0 // c), a1 // c) if a1 <= 0 else (-((-a0) // c), a1 // c)
  if op is Ops.MOD and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
    (a0, a1), c = u.src[0].vrange, u.src[1].arg
    if a0 >= 0: return (0, min(a1, c - 1))
    return (-(c - 1), c - 1)
  if op is Ops.WHERE:
    (b0, b1), (c0, c1) = u.src[1].vrange, u.src[2].vrange
    return (min(b0, c0), max(b1, c1))
  if op is Ops.AND and dt.is_bool:
    (a0, a1), (b0, b1) = u.src[0].vrange, u.src[1].vrange
    return (a0 and b0, a1 and b1)
  if op is Ops.CAST and u.src[0].dtype is not None and (u.src[0].dtype.is_int or u.src[0].dtype.is_bool):
    r = u.src[0].vrange
    return r if full[0] <= r[0] and r[1] <= full[1] else full
  return full


_SIZE_OPS = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.NEG, Ops.MAX})


def _is_size(u: UOp) -> bool:
  """Is u a symbolic size: arithmetic on Variables only (no loop or thread index)?"""
  order = u.toposort()
  return len(order) < 64 and all(n.op in _SIZE_OPS for n in order) and any(n.op is Ops.DEFINE_VAR for n in order)


def pretty(u: UOp, limit: int = 40) -> str:
  """A readable multi-line dump of a UOp graph (shared nodes printed once)."""
  order = u.toposort()
  if len(order) > limit: order = order[-limit:]
  names = {n: f"%{i}" for i, n in enumerate(order)}
  lines = []
  for n in order:
    srcs = ", ".join(names.get(s, "…") for s in n.src)
    arg = "" if n.arg is None else f" {n.arg!r}"
    lines.append(f"{names[n]} = {n.op.name}{'' if n.dtype is None else ':' + n.dtype.name}({srcs}){arg}")
  return "\n".join(lines)
