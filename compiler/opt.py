"""Kernel optimizations on ranges: UPCAST (a global axis gets an inner constant-size lane loop whose
accumulators live in registers), UNROLL (a reduce axis gets an inner constant-size loop the compiler unrolls),
THREAD (a global axis is cut into chunks the CPU cores share), SWAP (loop order), PADTO (a global axis is rounded up to a
multiple, the extra iterations gated off, so UPCAST/THREAD can split it). GPUs add LOCAL, GROUP and GROUPTOP
(compiler/gpu.py maps the ranges onto workgroups).
`hand_coded_opts` picks them by default; compiler.search (BEAM=n) picks them by timing real runs."""
from __future__ import annotations
import math
from dataclasses import dataclass
from baregrad.drivers import settings
from .uop import UOp, Ops, TRANSCENDENTAL, coupled
from .dtype import dtypes
from .pattern import substitute


@dataclass(frozen=True)
class Opt:
  op: str          # "UPCAST" | "UNROLL" | "REDUCE_LANES" | "THREAD" | "SWAP" | "PADTO"; GPU only (compiler/gpu.py): "LOCAL" | "GROUP" |
                   # "GROUPTOP" | "STAGE"
  axis: int        # index into the kernel's current global axes, outermost first (UNROLL: its reduce axes)
  amount: int = 0  # lanes / unrolled iterations / threads / the other axis for SWAP / the multiple for PADTO

  def __repr__(self): return f"{self.op}({self.axis},{self.amount})"


class OptError(ValueError):
  pass


MAX_CHUNKS = 4096   # THREAD: chunks of one kernel (each a call of the kernel function by a core)


def global_ranges(ast: UOp) -> list[UOp]:
  return sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "global"}, key=lambda r: r.arg[0])


def _ranges(ast: UOp) -> list[UOp]: return [u for u in ast.toposort() if u.op is Ops.RANGE]


def _size(r: UOp) -> int:
  if r.src[0].op is not Ops.CONST: raise OptError("symbolic range sizes are not optimized")
  return r.src[0].arg


def reduce_ranges(ast: UOp) -> list[UOp]:
  return sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "reduce"}, key=lambda r: r.arg[0])


def _unroll(ast: UOp, opt: Opt) -> UOp:
  """A reduce axis splits into an outer loop and an inner constant-size loop the compiler unrolls (UNROLL), or into
  a loop and the threads of a workgroup that share it (GPU: GROUP interleaved, GROUPTOP contiguous chunks)."""
  rl = reduce_ranges(ast)
  if not 0 <= opt.axis < len(rl): raise OptError(f"{opt}: kernel has {len(rl)} reduce axes")
  r, amt = rl[opt.axis], opt.amount
  size = _size(r)
  if amt < 2 or size % amt: raise OptError(f"{opt}: reduce axis of size {size} does not split by {amt}")
  next_id = max(u.arg[0] for u in _ranges(ast)) + 1
  kind = {"UNROLL": "unroll", "STAGE": "stage"}.get(opt.op, "group")
  lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, amt),), (next_id, kind))
  outer = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size // amt),), r.arg)
  parts = (lane,) if size == amt else (outer, lane)
  split = lane * (size // amt) + outer if opt.op == "GROUPTOP" else outer * amt + lane
  done: dict[UOp, UOp] = {r: lane if size == amt else split}
  for n in ast.toposort():
    if n is r: continue
    src = tuple(done[s] for s in n.src)
    if n.op is Ops.REDUCE and r in n.src[1:]:   # the reduce now runs over both new loops
      src = (src[0],) + tuple(x for s in n.src[1:] for x in (parts if s is r else (s,)))
    done[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
  return done[ast]


def _reduce_lanes(ast: UOp, opt: Opt) -> UOp:
  """REDUCE_LANES: a reduce axis splits into a loop and `amount` vector lanes, each lane summing its own part (an
  accumulator per lane, in registers), the lanes summed once at the end: REDUCE(v, r) -> REDUCE(REDUCE(v, outer),
  lane) with r = outer * amount + lane. A reduction whose operands are contiguous along the reduced axis (a matrix-
  vector product x @ W.T reads W's rows in order) then runs as vector loads and vector multiply-adds. The sum is
  taken in another order (per lane, then across lanes), as vectorized BLAS does."""
  rl = reduce_ranges(ast)
  if not 0 <= opt.axis < len(rl): raise OptError(f"{opt}: kernel has {len(rl)} reduce axes")
  r, amt = rl[opt.axis], opt.amount
  size = _size(r)
  if amt < 2 or size % amt: raise OptError(f"{opt}: reduce axis of size {size} does not split by {amt}")
  next_id = max(u.arg[0] for u in _ranges(ast)) + 1
  lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, amt),), (next_id, "upcast"))
  outer = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size // amt),), r.arg)
  done: dict[UOp, UOp] = {r: outer * amt + lane if size != amt else lane}
  for n in ast.toposort():
    if n is r: continue
    src = tuple(done[s] for s in n.src)
    if n.op is Ops.REDUCE and r in n.src[1:]:
      if n.arg not in (Ops.ADD, Ops.MAX): raise OptError(f"{opt}: a {n.arg} reduction keeps its order")
      inner = tuple(outer if s is r else s for s in n.src[1:] if not (s is r and size == amt))
      part = UOp(Ops.REDUCE, n.dtype, (src[0], *inner), n.arg) if inner else src[0]
      done[n] = UOp(Ops.REDUCE, n.dtype, (part, lane), n.arg)
      continue
    done[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
  # a second split of a reduction already in lanes (REDUCE_LANES(a, 8), then REDUCE_LANES(a, 4) of its loop): the new
  # lanes are independent accumulators of the first's vectors (4 multiply-add chains, a 64-byte step through each
  # operand), so the first's lanes stay the innermost loop, the vector one
  first = next((n.src[1] for n in ast.toposort() if n.op is Ops.REDUCE and len(n.src) == 2 and n.src[1].arg[1] == "upcast"
                and n.src[0].op is Ops.REDUCE and r in n.src[0].src[1:]), None)
  if first is None: return done[ast]
  return substitute(done[ast], {first: UOp(Ops.RANGE, dtypes.index, first.src, (next_id + 1, "upcast"))})


def has_coupled(ast: UOp) -> bool:
  """Whether the kernel has coupled reductions (an online softmax: uop.coupled)."""
  return any(coupled(u) is not None for u in ast.toposort())


def _coupled_opt_ok(ast: UOp, opt: Opt) -> bool:
  """The opts a kernel with coupled reductions takes: LOCAL (threads), and UPCAST of an output axis that no member
  another member reads depends on (a register tile of the attention's value dims: each lane repeats its own running
  sum, the maximum and the sum of p are shared). Splitting the coupled loop itself (UNROLL, GROUP, STAGE, ...) would
  need the group's merge rule, which no opt has."""
  if opt.op == "LOCAL": return True
  if opt.op != "UPCAST": return False
  gl = global_ranges(ast)
  if not 0 <= opt.axis < len(gl): return False
  members = [u for u in ast.toposort() if coupled(u) is not None]
  shared = {(n.src, n.arg[1]) for m in members for n in m.src[0].toposort()    # (loops, key) read by another member
            if n.op is Ops.DEFINE_ACC and n.arg[0] == "peer" and n.arg[1] != coupled(m)}
  return not any((m.src[1:], coupled(m)) in shared and gl[opt.axis] in m.src[0].toposort() for m in members)


def apply_opt(ast: UOp, opt: Opt) -> UOp:
  if has_coupled(ast) and not _coupled_opt_ok(ast, opt):
    raise OptError(f"{opt}: the kernel has coupled reductions (an online softmax); only LOCAL and UPCAST of an axis "
                   "its shared accumulators do not depend on apply")
  if opt.op in ("UNROLL", "GROUP", "GROUPTOP", "STAGE"): return _unroll(ast, opt)
  if opt.op == "REDUCE_LANES": return _reduce_lanes(ast, opt)
  gl = global_ranges(ast)
  if not 0 <= opt.axis < len(gl): raise OptError(f"{opt}: kernel has {len(gl)} global axes")
  r = gl[opt.axis]
  size = _size(r)
  next_id = max((u.arg[0] for u in _ranges(ast)), default=-1) + 1
  def rng(n: int, kind: str, k: int = 0) -> UOp: return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), (next_id + k, kind))
  if opt.op in ("UPCAST", "LOCAL"):
    amt = opt.amount
    if amt < 2 or size % amt: raise OptError(f"{opt}: axis of size {size} does not split by {amt}")
    # the outer part keeps the axis's id (its place in the loop order); the lane loop (LOCAL: the threads) is new
    outer = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size // amt),), r.arg)
    lane = rng(amt, opt.op.lower(), 1)
    new = lane if size == amt else outer * amt + lane
    return substitute(ast, {r: new})
  if opt.op == "THREAD":
    # the axis is cut into `amount` chunks (the kernel's `core` argument picks one; drivers/cpu/worker.c hands them
    # out to the cores); a second THREAD cuts another axis too: chunk = first * amount + second
    n = opt.amount
    if n < 2 or size % n: raise OptError(f"{opt}: axis of size {size} does not split into {n} chunks")
    old = next((u for u in ast.toposort() if u.op is Ops.SPECIAL and u.arg[0] == "core"), None)
    if n * (old.arg[1] if old is not None else 1) > MAX_CHUNKS: raise OptError(f"{opt}: more than {MAX_CHUNKS} chunks")
    core = UOp(Ops.SPECIAL, dtypes.index, (), ("core", n * (old.arg[1] if old is not None else 1)))
    # the chunk loop keeps this axis's place in the loop order
    inner = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size // n),), r.arg)
    if old is None: return substitute(ast, {r: core * (size // n) + inner})
    return substitute(ast, {old: core // n, r: (core % n) * (size // n) + inner})
  if opt.op == "PADTO":
    amt = opt.amount
    if amt < 2 or size % amt == 0: raise OptError(f"{opt}: axis of size {size} is already a multiple of {amt}")
    if size * 2 < amt: raise OptError(f"{opt}: padding {size} to {amt} more than doubles the work")
    padded = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, -(-size // amt) * amt),), r.arg)
    tmp = substitute(ast, {r: padded})
    # the padded iterations store nothing: their stores are gated. Their loads read the last real element instead
    # (the index clamped, loop-invariant in the reductions): what they compute is never stored, and an ungated load
    # costs nothing in a matmul's inner loop, where a gate per load (a select) cost 10% of the 6 x 16 tile
    inside = padded < size
    clamped = inside.where(padded, UOp.const(dtypes.index, size - 1))
    stored = {u.src[0] for u in tmp.toposort() if u.op is Ops.STORE}
    gates = {}
    for u in tmp.toposort():
      if u.op is not Ops.INDEX: continue
      if u in stored:
        gates[u] = u.replace(src=(u.src[0], u.src[1], inside if len(u.src) == 2 else (u.src[2] & inside)))
      elif padded in u.src[1].toposort() + (u.src[2].toposort() if len(u.src) == 3 else []):
        gates[u] = substitute(u, {padded: clamped})
    return substitute(tmp, gates)
  if opt.op == "SWAP":
    if not 0 <= opt.amount < len(gl) or opt.amount == opt.axis: raise OptError(f"{opt}: bad axis to swap with")
    other = gl[opt.amount]
    a, b = (UOp(Ops.RANGE, dtypes.index, x.src, ("swap", x.arg[0])) for x in (r, other))
    tmp = substitute(ast, {r: a, other: b})
    return substitute(tmp, {a: UOp(Ops.RANGE, dtypes.index, r.src, (other.arg[0], "global")),
                            b: UOp(Ops.RANGE, dtypes.index, other.src, (r.arg[0], "global"))})
  raise OptError(f"unknown opt {opt.op}")


def apply_opts(ast: UOp, opts) -> UOp:
  for o in opts: ast = apply_opt(ast, o)
  return ast


def threads_of(ast: UOp) -> int:
  for u in ast.toposort():
    if u.op is Ops.SPECIAL and u.arg[0] == "core": return u.arg[1]
  return 1


def has_avx512() -> bool:
  """Whether this host's CPU has AVX-512 (32 vector registers of 64 bytes): CPU kernels use wider tiles."""
  global _AVX512
  if _AVX512 is None:
    try: _AVX512 = " avx512f" in open("/proc/cpuinfo").read()
    except OSError: _AVX512 = False
  return _AVX512


_AVX512 = None


def cpu_threads() -> int:
  return settings.THREADS


def _index_strides(ast: UOp) -> list[tuple[UOp, dict[UOp, int]]]:
  """Each INDEX of the kernel with the stride of each term of its (simplified) index."""
  from .pattern import graph_rewrite
  from .symbolic import symbolic
  from .render_c import index_linear
  return [(u, index_linear(graph_rewrite(u.src[1], symbolic))[0]) for u in ast.toposort() if u.op is Ops.INDEX]


def _unit_stride_axes(ast: UOp, gl: list[UOp]) -> set[UOp]:
  """Global ranges that some load or the store walks with stride 1."""
  out = set()
  for _, terms in _index_strides(ast): out |= {r for r in gl if terms.get(r) == 1}
  return out


def vector_lanes_ok(ast: UOp, axis: int, lanes: int) -> bool:
  """Whether the C renderer can run UPCAST(axis, lanes) as vector ops (compiler/render_c.py, vector_loops): every
  load and store that depends on the lanes walks them with stride 1, and every value that depends on them is float
  arithmetic, a comparison, bool logic or a select of one float dtype. Lanes it cannot vectorize are as many scalar
  copies of the body, which the C compiler vectorizes itself, slowly (seconds for a few hundred)."""
  return _lanes_vectorize(ast, Opt("UPCAST", axis, lanes))


def reduce_lanes_ok(ast: UOp, axis: int, lanes: int) -> bool:
  """Whether the C renderer can run REDUCE_LANES(axis, lanes) as vector ops (the same rules as vector_lanes_ok; the
  lanes may also load integers or float16 bits and convert them: a quantized or half-precision weight)."""
  return _lanes_vectorize(ast, Opt("REDUCE_LANES", axis, lanes))


EPILOGUE_SCALAR_OPS = 4   # ops after a reduction that its output lanes may run as scalar copies (_lanes_vectorize)


def _lanes_vectorize(ast: UOp, opt: Opt) -> bool:
  from .render_c import vector_renderable, lane_step, VEC_DTYPES, INT_VEC_DTYPES
  from .pattern import graph_rewrite
  from .symbolic import symbolic
  try: ast = apply_opt(ast, opt)
  except OptError: return False
  # simplified first, as the kernel will be: a lane index that divides out of an index or a gate (8 lanes inside a
  # 32-element block) leaves no trace there
  r = max((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "upcast"), key=lambda u: u.arg[0])
  ast = graph_rewrite(ast, symbolic)
  strides = dict(_index_strides(ast))
  users: dict[UOp, list[UOp]] = {}
  for u in ast.toposort():
    for x in u.src: users.setdefault(x, []).append(u)
  def users_of(u: UOp) -> list[UOp]:     # every node computed from u
    out, stack, seen = [], [u], {u}
    while stack:
      for v in users.get(stack.pop(), ()):
        if v not in seen: seen.add(v); out.append(v); stack.append(v)
    return out
  dep, dts, int_selects, lane_ints, epilogue, scalar_tail = {r}, set(), set(), set(), set(), 0
  for u in ast.toposort():
    if u is r or not any(s in dep for s in u.src): continue
    if any(s in lane_ints for s in u.src):     # integer lanes computed from positions (as the C renderer takes them)
      if not vector_renderable(u.op, u.dtype, [s.dtype for s in u.src]): return False
      dep.add(u)
      if u.dtype in INT_VEC_DTYPES: lane_ints.add(u)
      elif u.op in (Ops.CMPLT, Ops.CMPNE): int_selects.add(u.src[0].dtype.itemsize)
      continue
    if u.op is Ops.INDEX:
      terms = strides[u]
      inside = any(t is not r and r in t.toposort() for t in terms)
      if r not in terms and not inside: continue      # the lanes cancel out of the index: a broadcast load
      gated = len(u.src) == 3 and r in u.src[2].toposort()     # (a gate the same for every lane gates the vector)
      if gated or terms.get(r) != 1 or inside: return False
    dep.add(u)
    if u.op in (Ops.INDEX, Ops.STORE, Ops.SINK): continue
    elif u.dtype in (dtypes.index, dtypes.int32, dtypes.int64) and u.op in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD):
      continue   # index arithmetic (its strides are checked at the INDEX)
    elif u.op is Ops.LOAD and u.dtype in INT_VEC_DTYPES and (opt.op == "REDUCE_LANES" or u.dtype.is_float):
      continue   # integer lanes (reduction lanes) or 16-bit float bits, converted to float lanes where they are used
    elif u.op is Ops.CAST and u.src[0].dtype == dtypes.index and u.dtype in (dtypes.int32, dtypes.int64):
      # a position as integer lanes (a causal mask's key index): linear in the lanes, compared as a mask as wide
      if opt.op != "UPCAST" or lane_step(u.src[0], r) is None: return False
      lane_ints.add(u)
      continue
    elif u.op is Ops.LOAD or u.op is Ops.REDUCE:
      if u.dtype not in VEC_DTYPES or (u.op is Ops.REDUCE and u.arg not in (Ops.ADD, Ops.MUL, Ops.MAX)): return False
      dts.add(u.dtype)
      # reduction lanes end at their reduction (summed across the vector): what uses its result is scalar (a float16
      # output converted after a float32 sum)
      if u.op is Ops.REDUCE and opt.op == "REDUCE_LANES" and r in u.src[1:]: dep.discard(u)
      # output lanes of a reduction (no other reduction reads it): what its result goes through runs once per output
      # after the loop, a loop of its own that the C renderer makes vector ops where it can and scalar copies where
      # not (a float16 output's conversion): a few such ops leave the accumulating loop's vector lanes worth it
      if u.op is Ops.REDUCE and opt.op == "UPCAST":
        after = users_of(u)
        if not any(v.op is Ops.REDUCE for v in after): epilogue.update(after)
    elif not vector_renderable(u.op, u.dtype, [s.dtype for s in u.src]):
      if u not in epilogue: return False
      scalar_tail += 1
      if scalar_tail > EPILOGUE_SCALAR_OPS: return False
    elif u.op is Ops.WHERE and not u.dtype.is_float and u.src[0] in dep:
      int_selects.add(u.dtype.itemsize)   # integer lanes chosen lane by lane: a mask select as wide as the float lanes
    else: dts.update(d for d in (u.dtype, *(s.dtype for s in u.src)) if d in VEC_DTYPES)
  return len(dts) <= 1 and (not int_selects or (len(dts) == 1 and int_selects <= {next(iter(dts)).itemsize}))


def _divisors(n: int) -> list[int]:
  small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
  return sorted(set(small + [n // d for d in small]))


# chunks per core a threaded kernel is cut into: the command processor's threads claim them one at a time
# (drivers/cpu/worker.c, EXEC_MT), so a core that another process holds for a while leaves its chunks to the others
# (numpy's BLAS splits a matmul once per thread: the busy core's half finishes last). A register-tiled matmul's chunk
# is a panel of rows and a group of column strips that stay in the core's L2 (_panel_opts).
CHUNKS_PER_THREAD = 8
MIN_CHUNK_WORK = 1 << 15


def _thread_opts(sizes: list[int], prefer: list[int], threads: int, work: int) -> list[Opt]:
  """THREAD opts cutting the kernel into about CHUNKS_PER_THREAD * threads chunks (fewer for small work): along the
  first axis of `prefer` that splits into at least `threads`, else along two axes (a core index for each)."""
  want = max(threads, min(CHUNKS_PER_THREAD * threads, work // MIN_CHUNK_WORK))
  def pick(size: int, want: int, least: int) -> int:
    divs = [d for d in _divisors(size) if least <= d <= min(4 * want, MAX_CHUNKS)]
    return min(divs, key=lambda d: (d % threads != 0, abs(math.log(d / want)))) if divs else 0
  for axis in prefer:
    if (n := pick(sizes[axis], want, threads)): return [Opt("THREAD", axis, n)]
  # no single axis has `threads` chunks: the first two axes together
  for a, b in ((a, b) for a in prefer for b in prefer if a != b):
    na = max(d for d in _divisors(sizes[a]) if d <= want)
    if na > 1 and (nb := pick(sizes[b], want // na, -(-threads // na))): return [Opt("THREAD", a, na), Opt("THREAD", b, nb)]
  return []


def _panel_opts(rows: int, cols: int, sizes: list[int], tile: tuple[int, int], threads: int, work: int) -> list[Opt]:
  """THREAD opts cutting a register-tiled matmul (`rows` and `cols`: the axes of its row blocks and column strips,
  `tile`: rows x columns of one register tile) into about CHUNKS_PER_THREAD * threads chunks along both axes: a
  chunk is a panel of A's rows and a group of B's strips. Each chunk reads its panel and its strips from L3 once, so
  the traffic is (row chunks) * |B| + (column chunks) * |A|, least when the two counts are in the ratio of n to m
  (1024 kernel on 2 cores: 16 row panels 380, 4 x 4 chunks 402 GFLOP/s)."""
  want = max(threads, min(CHUNKS_PER_THREAD * threads, work // MIN_CHUNK_WORK))
  n, m = sizes[rows] * tile[0], sizes[cols] * tile[1]
  def near(size: int, target: float) -> int: return min(_divisors(size), key=lambda d: abs(math.log(d / target)))
  a = near(sizes[rows], math.sqrt(want * n / m))
  b = near(sizes[cols], want / a)
  if a * b < threads: return _thread_opts(sizes, [rows, cols], threads, work)
  return [Opt("THREAD", axis, amount) for axis, amount in ((rows, a), (cols, b)) if amount > 1]


def _elementwise_opts(ast: UOp, gl: list[UOp], sizes: list[int]) -> list[Opt]:
  """A kernel without reductions: its innermost axis as vector lanes (one register wide) where the store walks it
  with stride 1 and the renderer can vectorize it (a large output then streams past the caches:
  render_c.NT_STORE_BYTES); a copy (one load) reads its source in order: the axis that continues the load's lanes
  contiguously goes innermost (packing a matmul's operand into strips: 430 -> 210 us for 1024 x 1024 floats).
  Updates `sizes`."""
  stores = [u for u in ast.toposort() if u.op is Ops.STORE]
  loads = [u for u in ast.toposort() if u.op is Ops.LOAD]
  if len(stores) != 1: return []
  strides = dict(_index_strides(ast))
  lanes = (64 if has_avx512() else 32) // stores[0].src[1].dtype.itemsize
  opts: list[Opt] = []
  if (sizes[-1] % lanes == 0 and strides[stores[0].src[0]].get(gl[-1]) == 1
      and vector_lanes_ok(ast, len(gl) - 1, lanes)):
    opts.append(Opt("UPCAST", len(gl) - 1, lanes))
    sizes[-1] //= lanes
    if len(loads) == 1 and len(gl) >= 3 and sizes[-1] == 1:    # the lanes took the whole innermost axis
      load = strides[loads[0].src[0]]
      inner = len(gl) - 2                      # the innermost axis left after the lanes
      follow = [a for a in range(inner) if load.get(gl[a]) == lanes]
      if follow and abs(load.get(gl[inner], 0)) != lanes:
        opts.append(Opt("SWAP", follow[0], inner))
        sizes[follow[0]], sizes[inner] = sizes[inner], sizes[follow[0]]
  return opts


def _symbolic_opts(ast: UOp, gl: list[UOp]) -> list[Opt]:
  """Opts for a kernel with loops over a symbolic size (a decode step's attention over positions 0..pos): those
  loops stay whole (their bound is read at run time); the constant ones get vector lanes: the reduced axis when it
  is constant and contiguous (the scores q . k over a head's dims), else a contiguous output axis (the probabilities
  times V: a head's dims as lanes, the positions summed into vectors). Such kernels are small (one token's
  attention), so they run on one core."""
  reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE]
  if any(v.op is Ops.REDUCE for u in reduces for v in u.src[0].toposort() if v is not u): return []
  lanes = (64 if has_avx512() else 32) // 4
  rl = reduce_ranges(ast)
  if reduces and rl and rl[-1].src[0].op is Ops.CONST and _size(rl[-1]) % lanes == 0 and \
     reduces[0].dtype == dtypes.float32 and reduce_lanes_ok(ast, len(rl) - 1, lanes):
    return [Opt("REDUCE_LANES", len(rl) - 1, lanes)]
  strides = dict(_index_strides(ast))
  store = next((u for u in ast.toposort() if u.op is Ops.STORE), None)
  for axis in reversed(range(len(gl))):
    r = gl[axis]
    if r.src[0].op is Ops.CONST and _size(r) % lanes == 0 and store is not None and \
       strides[store.src[0]].get(r) == 1 and vector_lanes_ok(ast, axis, lanes):
      return [Opt("UPCAST", axis, lanes)]
  return []


def racc_size(reduces: list[UOp]) -> int:
  """Bytes of the (first) reduction's accumulator element."""
  return reduces[0].dtype.itemsize if reduces and reduces[0].dtype is not None else 4


def _block_period_unroll(ast: UOp, opts: list[Opt]) -> int:
  """Steps of a matrix-vector product's reduction loop to unroll (0: none) after `opts` put 32 elements in each step,
  when a select in the kernel depends on the step: a K-quant block of 256 elements (Q4_K, Q5_K, Q6_K: tensor/
  ggml_quants.py) has 8 sub-blocks of 32, and which nibble, which scale and which min a sub-block takes are chosen by
  its position, so each step decoded its scale and both nibbles and selected between them. Unrolled over the 8
  sub-blocks, every choice is a constant in its copy and the compiler keeps one load of the block's d and dmin.
  2816 x 1024 on 2 cores: Q4_K 840-940 -> 565-585 us, Q5_K 1807 -> 820, Q6_K 1536 -> 754."""
  if not any(u.op is Ops.LOAD and u.dtype.itemsize == 1 for u in ast.toposort()): return 0
  from .pattern import graph_rewrite
  from .symbolic import symbolic
  try: tmp = graph_rewrite(apply_opts(ast, opts), symbolic)    # simplified, as the kernel will be
  except OptError: return 0
  loop = reduce_ranges(tmp)[-1]
  size = _size(loop)
  chosen = any(u.op is Ops.WHERE and loop in u.src[0].toposort() for u in tmp.toposort())
  return next((u for u in (8, 4, 2) if size % u == 0), 0) if chosen else 0


ROWS_6_FROM = 48     # rows from which an AVX2 matmul tile is 6 x 16 (padded to a multiple of 6), else 4 x 16


def _strip_axis(ast: UOp, gl: list[UOp], sizes: list[int], j: int) -> int | None:
  """The global axis, of an even size, along which the output's columns go on from the lane axis j (stride
  sizes[j] in the store: a packed matmul's strips), or None."""
  stores = [u for u in ast.toposort() if u.op is Ops.STORE]
  if len(stores) != 1: return None
  terms = dict(_index_strides(ast))[stores[0].src[0]]
  if terms.get(gl[j]) != 1: return None
  return next((a for a in range(len(gl)) if a != j and sizes[a] % 2 == 0 and terms.get(gl[a]) == sizes[j]), None)


def hand_coded_opts(ast: UOp, threads: int | None = None) -> list[Opt]:
  threads = cpu_threads() if threads is None else threads
  nodes = ast.toposort()
  gl = global_ranges(ast)
  if not gl or has_coupled(ast): return []
  if any(r.src[0].op is not Ops.CONST for r in _ranges(ast)): return _symbolic_opts(ast, gl)
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  nested = any(v.op is Ops.REDUCE for u in reduces for v in u.src[0].toposort() if v is not u)
  work = math.prod(_size(r) for r in gl) * math.prod(_size(r) for r in _ranges(ast) if r.arg[1] == "reduce")
  # a body with transcendental ops (exp, log, a division: ~40 vector ops each once decomposed) is worth threading at
  # fewer elements: a cross-entropy over 1024 rows of 68 classes ran 0.9 ms on one core
  if any(u.op in TRANSCENDENTAL for u in nodes): work *= 16
  opts: list[Opt] = []
  sizes = [_size(r) for r in gl]
  prefer = list(range(len(sizes)))          # elementwise: outer axes first (each core streams its own part)
  panel = None
  if reduces and not nested:
    unit = _unit_stride_axes(ast, gl)
    cand = [i for i in range(len(gl)) if gl[i] in unit] or [len(gl) - 1]
    j = cand[-1]
    picks = {}
    # the widest lanes that divide the axis and that the renderer runs as vector ops (a packed operand's strips are
    # as wide as one register: 8 floats with AVX2, whose lanes do not split further into 16)
    # (at most one vector register of lanes per row: with AVX2 a 16-lane row is two registers, and 8 rows of them are
    # 16 accumulators, every register, so each step spills; x^T @ dy of a linear layer ran at 7 GFLOP/s so)
    width = (64 if has_avx512() else 32) // max(racc_size(reduces), 4)
    amt_j = next((a for a in (16, 8, 4) if a <= width and sizes[j] % a == 0 and vector_lanes_ok(ast, j, a)), None)
    vector = amt_j is not None
    if amt_j is None: amt_j = next((a for a in (16, 8, 4) if sizes[j] % a == 0), None)
    i = next((i for i in reversed(range(len(gl))) if i != j and sizes[i] % 4 == 0), None)
    strips = _strip_axis(ast, gl, sizes, j) if vector and amt_j == sizes[j] == 8 and not has_avx512() else None
    if strips is not None:
      # the columns go on along another axis, one 8-wide strip per step (a packed matmul whose output is viewed as
      # (rows, strips, 1, 8)): the tile takes 2 strips of it, and its rows are the rows (they were the strips: a
      # 1 x 64 tile, 9 loads per 8 FMAs; 1024 x 256 @ 256 x 64 in a training step 432 -> 218 us)
      i = next((a for a in reversed(range(len(gl))) if a not in (j, strips) and
                (sizes[a] % 4 == 0 or sizes[a] >= ROWS_6_FROM)), None)
    rl = reduce_ranges(ast)
    racc = next(u.dtype for u in reduces)
    rlanes = (64 if has_avx512() else 32) // max(racc.itemsize, 4) if racc.is_float else 0
    if not vector and rlanes and len(rl) >= 1 and _size(rl[-1]) % rlanes == 0 and \
       reduce_lanes_ok(ast, len(rl) - 1, rlanes):
      # the reduced axis is the contiguous one (a matrix-vector product x @ W.T reads W's rows in order): vector
      # lanes along it, a few outputs per step sharing the other operand's loads (x); the weight streams once
      opts.append(Opt("REDUCE_LANES", len(rl) - 1, rlanes))
      k = next((k for k in reversed(range(len(gl))) if sizes[k] % 4 == 0), None)
      if math.prod(sizes) == max(sizes) and _size(rl[-1]) % (4 * rlanes) == 0:
        # one input row (a decode step's matrix-vector products): each output is one row of the matrix streamed
        # start to end, 4 vectors (64 bytes of f16) a step, 4 accumulators; the renderer prefetches the row ahead
        # (render_c.PREFETCH_BYTES). 4 rows a step read 4 streams 2 KB apart: f16 8192 x 4096 on 2 cores,
        # 16.7 GB/s as 4 rows, 17.7 as one, 22 with the prefetch
        opts.append(Opt("REDUCE_LANES", len(rl) - 1, 4))
        k = None
        if (u := _block_period_unroll(ast, opts)): opts.append(Opt("UNROLL", len(rl) - 1, u))
      elif any(u.op is Ops.LOAD and u.dtype.itemsize == 1 for u in nodes) and _size(rl[-1]) % (4 * rlanes) == 0:
        # quantized blocks (byte loads): 4 steps of lanes unrolled, so a block's scale is loaded and converted once
        # for its 32 elements rather than once per vector (the compiler merges the unrolled copies' scale loads)
        opts.append(Opt("UNROLL", len(rl) - 1, 4))
        if (u := _block_period_unroll(ast, opts)): opts.append(Opt("UNROLL", len(rl) - 1, u))
      if k is not None and (narrow := [u.src[0] for u in nodes if u.op is Ops.LOAD and u.dtype.itemsize < 4]):
        # a few input rows (a prompt's tokens) times a float16/quantized weight: the 4 outputs of a step are 4 rows
        # of the input, so each converted weight vector serves 4 of them (4 rows of the weight would share only the
        # input's float loads): a 32-token prefill's 32 x 1024 @ 1024 x 2816 f16, 19 -> 35 GFLOP/s on 2 cores
        strides = dict(_index_strides(ast))
        read = {r for idx in narrow for t in strides[idx] for r in t.toposort() if r.op is Ops.RANGE}
        k = next((a for a in reversed(range(len(gl))) if gl[a] not in read and sizes[a] % 4 == 0), k)
      if k is not None: picks[k] = 4
    elif not vector:
      # lanes the C compiler must vectorize from scalar copies of the body (a strided operand, exp/log, integers):
      # a 4 x 4 tile (a few hundred copies of a fused body take clang and gcc seconds)
      if sizes[j] % 4 == 0: picks[j] = 4
      if i is not None: picks[i] = 4
    elif (i is not None and i < j and has_avx512() and amt_j == 16 and sizes[j] % 32 == 0 and sizes[i] % 8 == 0
        and sizes[j] > 32 and sizes[i] > 8):
      # AVX-512: 8 rows x 2 vectors of 16 = 16 accumulators, 10 loads per 16 FMAs; the unit-stride axis goes
      # outer so its operand's strip stays in cache while a panel of rows (a THREAD chunk, below) streams past.
      # The 1024 kernel on one core: 192 GFLOP/s (4096 x 256 x 1024: 150 unpanelled, 215 in panels of 256 rows)
      opts += [Opt("UPCAST", j, 16), Opt("UPCAST", j, 2), Opt("UPCAST", i, 8), Opt("SWAP", i, j)]
      sizes[j] //= 32; sizes[i] //= 8
      sizes[i], sizes[j] = sizes[j], sizes[i]
      panel = (j, i)            # after the swap: the row blocks are axis j, the column strips axis i
    elif i is not None and not has_avx512() and amt_j == 8 and (sizes[j] % 16 == 0 or strips is not None) and \
        (sizes[i] % 4 == 0 or sizes[i] >= ROWS_6_FROM):
      # AVX2: 6 rows x 2 vectors of 8 = 12 accumulators, 8 loads (6 broadcasts) per 12 FMAs: 12 independent sums hide
      # the FMA latency (4 cycles, two units: 8 in flight), which the 4 x 16 tile's 8 accumulators did not. Rows
      # that 6 does not divide are padded (PADTO: the extra rows' stores are dropped). Zen 3, 1024^3 on 2 cores:
      # 79 -> 120 GFLOP/s (numpy 127-135); one core 256 x 64 x 1024 in C: 4 x 16 50, 6 x 16 82, 4 x 24 62 GFLOP/s.
      # Below ROWS_6_FROM rows the padding costs more than it saves: 4 rows (8 accumulators, 6 loads per 8 FMAs;
      # an 8 x 8 tile needs 9 loads per 8 FMAs and waits on the load ports)
      rows = 6 if sizes[i] >= ROWS_6_FROM else 4
      lanes = [Opt("UPCAST", j, 8), Opt("UPCAST", j if strips is None else strips, 2)]
      tile = ([Opt("PADTO", i, rows)] if sizes[i] % rows else []) + [Opt("UPCAST", i, rows)]
      opts += lanes + tile if j > i else tile + lanes
      if strips is None: sizes[j] //= 16
      else: sizes[j], sizes[strips] = 1, sizes[strips] // 2
      sizes[i] = -(-sizes[i] // rows)
    elif i is not None:
      # a 16x16 register tile needs 32 vector registers (AVX-512); 16x8 fits 16 (AVX2)
      wide = 16 if has_avx512() and sizes[i] % 16 == 0 and amt_j == 16 else 0
      picks[i] = wide or (8 if sizes[i] % 8 == 0 and amt_j and amt_j <= 16 else 4)
      if amt_j: picks[j] = amt_j
    elif amt_j and i is None and (more := next((m for m in (8, 4, 2) if sizes[j] % (amt_j * m) == 0 and
                                                  sizes[j] // (amt_j * m) >= threads), None)):
      # one row of outputs whose reduction walks down the columns (x @ W with W stored (in, out), GPT-2's layout): a
      # step takes 8 vectors of neighbouring columns (whole cache lines of each row of W, 8 accumulators); one vector
      # of 8 read 16 or 32 bytes of each 64-byte line per pass (2048 x 2048 float16: 3.6 ms -> 0.18-0.27 ms)
      opts += [Opt("UPCAST", j, amt_j), Opt("UPCAST", j, more)]
      sizes[j] //= amt_j * more
    elif amt_j: picks[j] = amt_j
    for axis in sorted(picks, reverse=True):    # higher axes first: lower indices stay valid
      opts.append(Opt("UPCAST", axis, picks[axis]))
      sizes[axis] //= picks[axis]
    prefer = list(reversed(range(len(sizes))))   # the row blocks first: a chunk is a panel of rows
  elif not reduces:
    opts += _elementwise_opts(ast, gl, sizes)
  keep = [k for k, s in enumerate(sizes) if s != 1]    # a fully upcast axis is gone from the global axes
  # chunks: for the cores to share, and (one core too) panels of a reduction that stay in cache
  # (an elementwise kernel from 64K elements: a cat or a transposing copy costs a few ns per element, so 200K of
  # them are ~0.5 ms, against ~10 us to hand a chunk to another core)
  if (threads > 1 or (reduces and not nested)) and work >= (1 << (18 if reduces else 16)) and keep:
    if panel is not None and all(p in keep for p in panel):
      rows, cols = (keep.index(p) for p in panel)
      opts += _panel_opts(rows, cols, [sizes[k] for k in keep], (8, 32), threads, work)
    else:
      sizes = [sizes[k] for k in keep]
      opts += _thread_opts(sizes, [keep.index(p) for p in prefer if p in keep], threads, work)
  return opts
