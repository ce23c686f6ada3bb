"""Rangeify: turn a Tensor graph into kernels.

Shapes become loop ranges; movement ops become index arithmetic on those ranges; a reduction that is
broadcast again (or read by several users) is materialized into its own buffer; everything else fuses.
Each kernel is an AST `SINK(STORE(INDEX(PARAM 0, idx), value))` over PARAMs, RANGEs and DEFINE_VARs.
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass, field
from .uop import UOp, Ops, MOVEMENT, ELEMENTWISE, TRANSCENDENTAL, identity_for
from .dtype import dtypes
from .shape import smul, render
from .gather import fold_gathers


@dataclass(frozen=True)
class BufferSlot:
  """A placeholder for a realized buffer in a normalized graph (arg of Ops.BUFFER)."""
  index: int
  size: int
  dtype: object
  device: str


@dataclass
class KernelSpec:
  """One kernel of a schedule: its AST and which graph nodes feed its PARAMs (0 is the output)."""
  ast: UOp
  params: list[UOp]            # graph nodes (materialized nodes or BUFFERs), params[0] is the output node
  name: str
  device: str
  root: UOp = None             # the materialized node this kernel computes
  opts: tuple | None = None    # kernel optimizations to use (None: the heuristic or BEAM decides)


@dataclass
class CopySpec:
  dest: UOp
  src: UOp
  device: str


@dataclass
class Schedule:
  items: list = field(default_factory=list)      # KernelSpec | CopySpec in dependency order
  materialized: list[UOp] = field(default_factory=list)


def _strides(shape) -> list:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc); acc = smul(acc, s)
  return out[::-1]


def flat_index(idx: tuple[UOp, ...], shape) -> UOp:
  out = UOp.const(dtypes.index, 0)
  for i, st, s in zip(idx, _strides(shape), shape):
    if isinstance(s, UOp) or s != 1: out = out + i * st
  return out


REDUCING = (Ops.REDUCE_AXIS, Ops.ATTEND)    # tensor-level ops that loop over an axis per output element


def _is_expanding(u: UOp) -> bool:
  return u.op is Ops.EXPAND and any(a != b for a, b in zip(u.src[0].shape, u.arg))


def find_materialized(sink: UOp) -> list[UOp]:
  """The nodes that get their own buffer, in dependency order."""
  order = sink.toposort()
  users: dict[UOp, int] = {}
  for n in order:
    for s in n.src: users[s] = users.get(s, 0) + 1
  mat: set[UOp] = set()
  for out in sink.src:
    if out.base.op is not Ops.BUFFER or not _is_contiguous_view(out): mat.add(out)
  views: dict[UOp, set] = {}     # the movement views each node is read through (RoPE reads a product's two halves)
  for n in reversed(order):
    for s in n.src: views.setdefault(s, set()).update(views.get(n, set()) if n.op in MOVEMENT else {s})
  for n in order:
    if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): mat.add(n)
    if n.op is Ops.COPY: mat.add(n.src[0])
    # a reduction read twice, or through two views (one kernel would compute it once per view): stored once
    if n.op in REDUCING and (users.get(n, 0) > 1 or len(views.get(n, ())) > 1): mat.add(n)
    # a long reduction read through a padding (the gradient of a slice: cat(dq, dk, dv)) would run its loop for
    # every output element, the padded ones included, its loads masked: stored on its own, its kernel is a plain
    # reduction (a matmul the opts recognize) and the pad a copy
    if n.op is Ops.PAD and any(_nonzero(b) or _nonzero(a) for b, a in n.arg[0]):
      s = n.src[0]
      while s.op in MOVEMENT and s not in mat: s = s.src[0]
      if s.op is Ops.REDUCE_AXIS and _reduced_size(s) >= SIBLING_MIN: mat.add(s)
  costly = _costly(order, mat)
  for _ in range(32):
    _materialize_broadcast_reads(mat, costly)
    # a value that holds a reduction (not stored yet) and is part of several kernels would compute that reduction
    # again in each (a residual stream x + attn @ W, read by a norm's reduction, the norm and the next residual):
    # stored once. (Users inside one kernel share it: the kernel computes a node once per index.)
    shared = _in_several_kernels(order, mat, users) | _sibling_reductions(mat)
    if not shared: break
    mat |= shared
  return [n for n in order if n in mat]


SIBLING_MIN = 64    # reductions over fewer elements share a kernel (a loss's few sums): splitting costs more


def _sibling_reductions(mat: set) -> set:
  """A kernel that would hold several long reductions side by side (silu(x @ A) * (x @ B)) computes each in its own
  loop, and the opts split or vectorize only one of them: all but the last get kernels (and buffers) of their own."""
  out = set()
  for root in mat:
    tops, seen, stack = [], set(), [root]
    while stack:
      n = stack.pop()
      for s in n.src:
        if s in seen or s in mat or s.op is Ops.BUFFER: continue
        seen.add(s)
        if s.op in REDUCING: tops.append(s)
        else: stack.append(s)
    long = [r for r in tops if _reduced_size(r) >= SIBLING_MIN]
    if len(long) > 1: out.update(long[1:])
  return out


def _reduced_size(r: UOp) -> int:
  from .shape import max_size
  return max_size([r.src[0].shape[a] for a in ((r.arg,) if r.op is Ops.ATTEND else r.arg[1])])


def _in_several_kernels(order: list[UOp], mat: set, users: dict) -> set:
  """The nodes (not stored) holding an unstored reduction that more than one kernel computes."""
  holds: dict[UOp, bool] = {}
  for n in order:
    holds[n] = n.op is not Ops.BUFFER and n.op not in REDUCING and \
      any((s.op in REDUCING or holds[s]) and s not in mat for s in n.src)
  cands = {n for n in order if holds[n] and users.get(n, 0) > 1 and n not in mat and n.op is not Ops.SINK}
  if not cands: return set()
  kernels: dict[UOp, int] = {}
  for root in mat:
    seen, stack = set(), [root]
    while stack:
      n = stack.pop()
      for s in n.src:
        if s in seen or s in mat or s.op is Ops.BUFFER: continue
        seen.add(s); stack.append(s)
        if s in cands: kernels[s] = kernels.get(s, 0) + 1
  shared = {n for n, k in kernels.items() if k > 1}
  # the lowest ones first: once they are stored, the values above them may hold no reduction any more
  below: dict[UOp, bool] = {}
  for n in order:
    below[n] = any((s in shared or below[s]) and s not in mat for s in n.src)
  return {n for n in shared if not below[n]}


def _materialize_broadcast_reads(mat: set, costly: dict) -> None:
  """A reduce reached through a broadcast would be recomputed per broadcast element: give it a buffer. So does an
  elementwise value that costs transcendental ops and that a reduction reads through a broadcast (silu, gelu: the
  operand of a matrix-vector product, which every output row reads); elementwise consumers keep theirs fused."""
  seen: set = set()
  stack = [(m, 0) for m in mat]            # flags: EXPANDED (read through a broadcast), REDUCING (below a reduce)
  while stack:
    n, flags = stack.pop()
    if (n, flags) in seen: continue
    seen.add((n, flags))
    if n not in mat and ((n.op in REDUCING and flags & _EXPANDED) or
                         (n.op in ELEMENTWISE and flags == _EXPANDED | _REDUCING and costly.get(n))):
      mat.add(n); stack.append((n, 0)); continue
    if n.op is Ops.BUFFER: continue
    child = flags | (_EXPANDED if _is_expanding(n) else 0) | (_REDUCING if n.op in REDUCING else 0)
    for s in n.src: stack.append((s, 0 if s in mat else child))


def reshape_index(idx, new_shape, old_shape):
  """The index into `old_shape` of element `idx` of its reshape to `new_shape` (row-major order kept)."""
  squeezed_new = [s for s in new_shape if s != 1]
  if squeezed_new == [s for s in old_shape if s != 1]:
    it = iter(i for i, s in zip(idx, new_shape) if s != 1)
    return tuple(next(it) if s != 1 else UOp.const(dtypes.index, 0) for s in old_shape)
  lin = flat_index(idx, new_shape)
  return tuple((lin // st) % s if s != 1 else UOp.const(dtypes.index, 0)
               for st, s in zip(_strides(old_shape), old_shape))


def move_index(n: UOp, idx: tuple) -> tuple[tuple, UOp | None]:
  """Movement op `n` read at `idx`: the index into its source, and for a PAD the condition that idx lies in the
  source (None where every idx does). One definition for reads (KernelBuilder.lower) and assign targets."""
  op, src_shape = n.op, n.src[0].shape
  if op is Ops.RESHAPE: return reshape_index(idx, n.shape, src_shape), None
  if op is Ops.PERMUTE:
    new = [None] * len(idx)
    for i, p in enumerate(n.arg): new[p] = idx[i]
    return tuple(new), None
  if op is Ops.EXPAND: return tuple(UOp.const(dtypes.index, 0) if s == 1 else i for i, s in zip(idx, src_shape)), None
  if op is Ops.SHRINK: return tuple(i + b if _nonzero(b) else i for i, (b, _) in zip(idx, n.arg)), None
  if op is Ops.FLIP:
    return tuple((s - 1) - i if d in n.arg else i for d, (i, s) in enumerate(zip(idx, src_shape))), None
  assert op is Ops.PAD, op
  conds, new_idx = [], []
  for i, (b, a), s in zip(idx, n.arg[0], src_shape):
    if _nonzero(b) or _nonzero(a):
      conds.append((UOp.const(dtypes.index, b - 1) if isinstance(b, int) else b - 1) < i)
      conds.append(i < s + b)
    new_idx.append(i - b if _nonzero(b) else i)
  pad_valid = None
  for c in conds: pad_valid = c if pad_valid is None else (pad_valid & c)
  return tuple(new_idx), pad_valid


def _nonzero(x) -> bool: return isinstance(x, UOp) or x != 0


_EXPANDED, _REDUCING = 1, 2


MANY_READS = 3      # float reads that make an elementwise value worth storing once (RoPE: x, its pair, cos, sin)


def _costly(order: list[UOp], mat: set) -> dict[UOp, bool]:
  """For each node: does computing it in a kernel take a transcendental op, or MANY_READS reads of float data (below
  it, up to the buffers and the nodes that get buffers of their own)? Recomputed per broadcast element, each read is
  memory traffic (a rotated query read once per key position reads the query, its pair, cos and sin). A value that is
  arithmetic on few loads, or on integer fields (a dequantized weight: bytes and a scale), stays fused."""
  out: dict[UOp, bool] = {}
  reads: dict[UOp, frozenset | None] = {}      # the views of stored data a node reads; None: an integer read
  for n in order:
    # (a reduction counts as one read: read through a broadcast it gets a buffer; computed in place it costs more)
    if n.op is Ops.BUFFER or n.op in REDUCING or n in mat or (n.op in MOVEMENT and (n.src[0].op is Ops.BUFFER or n.src[0] in mat)):
      reads[n] = frozenset((n,)) if n.dtype.is_float else None
    else:
      rs = [reads.get(s, frozenset()) for s in n.src]
      # (at most MANY_READS kept: whether there are that many is all that is asked, and chains stay linear)
      reads[n] = None if any(r is None for r in rs) else frozenset(itertools.islice(frozenset().union(*rs), MANY_READS))
    many = n.op in ELEMENTWISE and reads[n] is not None and len(reads[n]) >= MANY_READS
    out[n] = many or n.op in TRANSCENDENTAL or (n.op not in REDUCING and any(out[s] and s not in mat for s in n.src))
  return out


def _is_contiguous_view(u: UOp) -> bool:
  """A RESHAPE chain straight onto a whole BUFFER reads it in order."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER


class KernelBuilder:
  """Lowers one materialized node into a kernel AST by pushing indices down the graph."""

  def __init__(self, root: UOp, materialized: set[UOp]):
    self.root, self.materialized = root, materialized
    self.params: list[UOp] = [root]
    self.param_index: dict[UOp, int] = {root: 0}   # params by node (a list search per load is quadratic)
    self.memo: dict = {}
    self.n_ranges = 0

  def new_range(self, size, kind: str) -> UOp:
    """A loop over `size`: an int, or a symbolic size (its bound read from a kernel argument)."""
    r = UOp(Ops.RANGE, dtypes.index, (size if isinstance(size, UOp) else UOp.const(dtypes.index, size),), (self.n_ranges, kind))
    self.n_ranges += 1
    return r

  def ranges_for(self, shape, kind: str) -> tuple[UOp, ...]:
    return tuple(self.new_range(s, kind) if isinstance(s, UOp) or s != 1 else UOp.const(dtypes.index, 0) for s in shape)

  def param(self, node: UOp) -> UOp:
    index = self.param_index.get(node)
    if index is None:
      index = self.param_index[node] = len(self.params)
      self.params.append(node)
    return UOp(Ops.PARAM, node.dtype, (), index)

  def build(self) -> UOp:
    root = self.root
    target = root.src[0] if root.op is Ops.ASSIGN else root
    value_node = root.src[1] if root.op is Ops.ASSIGN else (root.src[0] if root.op is Ops.CONTIGUOUS else root)
    idx = self.ranges_for(root.shape, "global")
    value = self.lower(value_node, idx, None, top=value_node is root)
    if value.dtype != root.dtype: value = value.cast(root.dtype)
    if root.op is Ops.ASSIGN:
      # write through the target's view (a chain of movement ops that maps each element to its own place) into
      # the buffer under it
      buf = target.base
      self.params[0] = buf
      out_index = self.view_index(target, idx)
    else:
      out_index = flat_index(idx, root.shape)
    store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, None, (UOp(Ops.PARAM, root.dtype, (), 0), out_index)), value))
    return UOp.sink(store)

  def view_index(self, view: UOp, idx) -> UOp:
    """Index into the base buffer of the assign target: a chain of movement ops that maps each of its elements to a
    distinct element of the buffer (tensor/tensor.py's assign() refuses the others: an expand would write one
    element from many places, a pad would write outside the buffer)."""
    while view.op in MOVEMENT:
      if view.op is Ops.PAD and any(b or a for b, a in view.arg[0]) or _is_expanding(view):
        raise ValueError(f"an assign cannot write through {view.op.name.lower()} (shape {view.shape})")
      idx, _ = move_index(view, idx)
      view = view.src[0]
    if view.op is not Ops.BUFFER: raise ValueError("assign target must be a view of a realized tensor")
    return idx[0]


  def lower(self, n: UOp, idx: tuple, valid: UOp | None, top: bool = False) -> UOp:
    key = (n, idx, valid)
    hit = self.memo.get(key)
    if hit is not None: return hit
    out = self._lower(n, idx, valid, top)
    self.memo[key] = out
    return out

  def load(self, node: UOp, idx, valid) -> UOp:
    shape = node.shape
    src = (self.param(node), flat_index(idx, shape)) + ((valid,) if valid is not None else ())
    return UOp(Ops.LOAD, node.dtype, (UOp(Ops.INDEX, None, src),))

  def _lower(self, n: UOp, idx, valid, top) -> UOp:
    op = n.op
    if op is Ops.BUFFER or (n in self.materialized and not top): return self.load(n, idx, valid)
    if op is Ops.CONST: return UOp.const(n.dtype, n.arg) if n.src else n
    if op is Ops.IOTA: return idx[0].cast(n.dtype)
    if op is Ops.DEFINE_VAR: return n
    if op is Ops.BIND: return n.src[0]
    if op in ELEMENTWISE:
      return UOp(op, n.dtype, tuple(self.lower(s, idx, valid) for s in n.src), n.arg)
    if op is Ops.CONTIGUOUS or op is Ops.DETACH: return self.lower(n.src[0], idx, valid)
    src_shape = n.src[0].shape if n.src else ()
    if op in MOVEMENT:
      new_idx, pad_valid = move_index(n, idx)
      if pad_valid is None: return self.lower(n.src[0], new_idx, valid)
      inner = self.lower(n.src[0], new_idx, pad_valid if valid is None else valid & pad_valid)
      return pad_valid.where(inner, UOp.const(n.dtype, n.arg[1]))
    if op is Ops.REDUCE_AXIS:
      rop, axes = n.arg
      src_idx, ranges = list(idx), []
      for ax in axes:
        size = src_shape[ax]
        r = self.new_range(size, "reduce") if size != 1 else UOp.const(dtypes.index, 0)
        src_idx[ax] = r
        if size != 1: ranges.append(r)
      if any(src_shape[ax] == 0 for ax in axes): return UOp.const(n.dtype, identity_for(rop, n.dtype))
      val = self.lower(n.src[0], tuple(src_idx), valid)
      return UOp(Ops.REDUCE, n.dtype, (val,) + tuple(ranges), rop)
    if op is Ops.ATTEND: return self.attend(n, idx, valid)
    raise NotImplementedError(f"rangeify cannot lower {op.name} (shape {n.shape})")

  def attend(self, n: UOp, idx, valid) -> UOp:
    """ATTEND at idx: out = sum_s p_s v_s / sum_s p_s, p_s = exp(a_s - max a), as one loop over s with an online
    softmax (three coupled accumulators, uop.coupled): the running maximum m, the running sum of p and of p * v; each
    new maximum rescales both sums by exp(m_old - m_new). The scores a are computed inside the loop (the q . k
    product is a reduction nested in it), so no score is stored. A maximum of -inf (every key so far masked) is
    rescaled from 0 instead (no -inf - -inf); a row with no key kept ends with 0 / 0 = NaN, as softmax gives."""
    a, b = n.src
    axis, dt = n.arg, n.dtype
    size = a.shape[axis]
    zero = UOp.const(dtypes.index, 0)
    r = self.new_range(size, "reduce")
    def at(x): return tuple(r if i == axis else (zero if s == 1 else idx[i]) for i, s in enumerate(x.shape))
    score, value = self.lower(a, at(a), valid), self.lower(b, at(b), valid)
    if score.dtype != dt: score = score.cast(dt)
    if value.dtype != dt: value = value.cast(dt)
    m, l, o = (UOp(Ops.DEFINE_ACC, dt, (r,), ("peer", k)) for k in range(3))
    m_new = UOp(Ops.MAX, dt, (m, score))
    ref = UOp(Ops.CMPNE, dtypes.bool, (m_new, UOp.const(dt, float("-inf")))).where(m_new, UOp.const(dt, 0.0))
    def exp(x): return UOp(Ops.EXP2, dt, ((x - ref) * UOp.const(dt, LOG2E),))
    alpha, p = exp(m), exp(score)
    group = [UOp(Ops.REDUCE, dt, (new, r), (op, ("coupled", k))) for k, (op, new) in
             enumerate([(Ops.MAX, m_new), (Ops.ADD, l * alpha + p), (Ops.ADD, o * alpha + p * value)])]
    # (the maximum is read by the result, so the group is whole in the kernel: -inf there is a row with no key)
    out = group[2] * UOp(Ops.RECIP, dt, (group[1],))
    return UOp(Ops.CMPNE, dtypes.bool, (group[0], UOp.const(dt, float("-inf")))).where(out, UOp.const(dt, float("nan")))


LOG2E = 1.4426950408889634


def kernel_name(root: UOp) -> str:
  reduce_sizes = []
  for n in root.toposort():
    if n.op is Ops.REDUCE_AXIS:
      reduce_sizes = [n.src[0].shape[a] for a in n.arg[1]]
    if n.op is Ops.ATTEND: reduce_sizes = [n.src[0].shape[n.arg]]
  shape = "_".join(render(s) for s in root.shape) or "1"
  if reduce_sizes: return f"r_{shape}_{'_'.join(map(render, reduce_sizes))}"
  return f"E_{shape}"


# Buffers (and variables) a kernel of a device may take, where that is fewer than any kernel needs in practice.
# Metal: 31 entries in a compute function's buffer argument table (Metal Feature Set Tables, "Maximum number of
# entries in the buffer argument table, per graphics or compute function"; drivers/metal/selectors.py).
MAX_KERNEL_ARGS = {"METAL": 31}


def _arguments(root: UOp, mat: set) -> dict[UOp, int]:
  """What the kernel of `root` reads (buffers, materialized nodes, variables), and, for every node of the kernel
  below root, how many of those it reads ({node: count}; root's count is the kernel's)."""
  below: dict[UOp, frozenset] = {}
  for n in root.toposort():
    if n is not root and (n in mat or n.op in (Ops.BUFFER, Ops.DEFINE_VAR, Ops.BIND)): below[n] = frozenset([n])
    else: below[n] = frozenset().union(*(below[s] for s in n.src)) if n.src else frozenset()
  return below


def split_for_arguments(mat_list: list, device_of) -> list:
  """Kernels that would take more arguments than their device allows get an intermediate result materialized: the
  node below the root that reads the most arguments but not all of them, until every kernel fits."""
  mat, changed = set(mat_list), True
  while changed:
    changed = False
    for m in list(mat_list):
      limit = MAX_KERNEL_ARGS.get(str(device_of(m)).partition(":")[0])
      if limit is None: continue
      while len((below := _arguments(m, mat))[m]) + 1 > limit:
        total = len(below[m])
        cands = [(len(v), n) for n, v in below.items() if n is not m and n not in mat and 1 < len(v) < total
                 and n.op not in (Ops.BUFFER, Ops.DEFINE_VAR, Ops.BIND, Ops.CONST) and n.op not in MOVEMENT]
        if not cands: raise RuntimeError(f"a kernel on {device_of(m)} needs {total + 1} arguments, more than its {limit}, "
                                         "and no intermediate result splits it")
        pick = max(cands, key=lambda c: c[0])[1]
        mat.add(pick); changed = True
        mat_list.insert(mat_list.index(m), pick)   # before its user: still dependency order
  return mat_list


def rangeify(sink: UOp, device_of) -> Schedule:
  """Split a Tensor graph sink into kernels and copies, in dependency order."""
  mat_list = split_for_arguments(find_materialized(sink), device_of)
  mat = set(mat_list)
  sched = Schedule(materialized=mat_list)
  for m in mat_list:
    if m.op is Ops.COPY:
      sched.items.append(CopySpec(m, m.src[0], m.arg)); continue
    builder = KernelBuilder(m, mat)
    ast = fold_gathers(builder.build())
    sched.items.append(KernelSpec(ast, builder.params, kernel_name(m), device_of(m), m))
  sched.items = order_assigns(sched.items)
  return sched


def order_assigns(items: list) -> list:
  """An assign writes a buffer in place: kernels it depends on run before it, every other kernel that reads
  that buffer runs after it (so all readers see the assigned value, as views of a mutated buffer do)."""
  def outputs(it): return it.dest if isinstance(it, CopySpec) else it.params[0]
  def inputs(it): return [it.src] if isinstance(it, CopySpec) else it.params[1:]
  producer = {}
  for k, it in enumerate(items):
    if isinstance(it, KernelSpec) and it.ast.src[0].op is Ops.STORE: producer[_root_of(it)] = k
  deps = [set() for _ in items]
  for k, it in enumerate(items):
    for p in inputs(it):
      if p in producer and producer[p] != k: deps[k].add(producer[p])
  def closure(k, seen=None):
    seen = set() if seen is None else seen
    for d in deps[k]:
      if d not in seen: seen.add(d); closure(d, seen)
    return seen
  for a, it in enumerate(items):
    if not isinstance(it, KernelSpec) or it.root.op is not Ops.ASSIGN: continue
    target, before = it.params[0], closure(a)
    for k, other in enumerate(items):
      if k != a and k not in before and target in inputs(other) and a not in closure(k): deps[k].add(a)
  order, done = [], set()
  def visit(k, stack=()):
    if k in done: return
    if k in stack: raise RuntimeError("cyclic dependency between assigns in one schedule")
    for d in sorted(deps[k]): visit(d, stack + (k,))
    done.add(k); order.append(items[k])
  for k in range(len(items)): visit(k)
  return order


def _root_of(spec: "KernelSpec") -> UOp: return spec.root
