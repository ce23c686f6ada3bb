"""GPU kernels: the opts that only GPUs have, and the mapping of a kernel's loops onto workgroups.

Opts (compiler/opt.py applies them; each makes a RANGE of its own kind):
  LOCAL(axis, n)      a global axis splits into (global, local): n threads of a workgroup take neighbouring elements
  GROUP(raxis, n)     a reduce axis is shared by n threads of a workgroup, interleaved (thread t takes elements t,
                      t + n, ...: neighbouring threads read neighbouring elements)
  GROUPTOP(raxis, n)  the same, each thread a contiguous chunk
  UPCAST / UNROLL     as on the CPU; on a GPU every lane becomes its own value in registers (expanded below)

`to_workgroups(ast)` then, in order:
 1. expands UNROLL lanes (a REDUCE combines its lane values in each iteration) and UPCAST lanes (each store is
    repeated per lane, so a thread computes a tile of outputs; the loads shared between lanes are one node);
 2. splits each grouped REDUCE: every thread reduces its share, writes it to workgroup memory (DEFINE_LOCAL), a
    BARRIER, then every thread reduces the n partials from workgroup memory; only the threads with group index 0
    store. REDUCEs that depend on one another get one barrier per level;
 3. replaces the global ranges by the workgroup ids (SPECIAL gid0..2, the innermost global axis on x) and the local
    and group ranges by the thread ids in the workgroup (lid0..2, the one with the smallest memory stride on x, so
    neighbouring threads touch neighbouring addresses). A kernel with more than three global axes folds the outer ones
    into z (one div/mod); the hardware gives every other index directly.
`gpu_opts(ast)` is the hand-coded heuristic.
"""
from __future__ import annotations
import itertools, math
from .uop import UOp, Ops
from .dtype import dtypes
from .pattern import substitute
from .symbolic import linear
from .shape import evaluate
from .linearize import range_deps
from .opt import Opt, OptError, apply_opt, apply_opts, _size, has_coupled

LOCAL_KINDS = ("local", "group", "warp")      # "warp": the lanes of a tensor core op (compiler/tc.py), always x
MAX_THREADS = 1024                     # threads per workgroup: NV (CUDA guide, compute capability table), gfx11, Metal
MAX_LOCAL_DIM = (1024, 1024, 64)       # NV block x, y, z (CUDA guide, "Maximum x-, y-, z-dimension of a block")
# workgroup memory: the least of the GPUs': Metal 32 KiB (Apple4+ feature set tables), NV 48 KiB static (PTX ISA / ptxas
# "uses too much shared data", 0xc000), AMD 64 KiB LDS (RDNA3 ISA guide)
MAX_SHARED_BYTES = 32768
MAX_GRID_YZ = 65535                    # NV grid y, z (same table); x is 2^31 - 1


def _ranges(ast: UOp, *kinds) -> list[UOp]:
  return sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in kinds}, key=lambda r: r.arg[0])


def _combine(op: Ops, vals: list[UOp]) -> UOp:
  out = vals[0]
  for v in vals[1:]: out = out.alu(Ops.MAX if op is Ops.MAX else op, v)
  return out


def expand_unroll(ast: UOp) -> UOp:
  """A REDUCE over an "unroll" lane range of size m reduces, per iteration of its other ranges, the m lane values."""
  done: dict[UOp, UOp] = {}
  for n in ast.toposort():
    src = tuple(done[s] for s in n.src)
    new = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
    if new.op is Ops.REDUCE and any(r.arg[1] == "unroll" for r in new.src[1:]):
      lanes = [r for r in new.src[1:] if r.arg[1] == "unroll"]
      rest = tuple(r for r in new.src[1:] if r.arg[1] != "unroll")
      vals = [substitute(new.src[0], dict(zip(lanes, (UOp.const(dtypes.index, i) for i in c))))
              for c in itertools.product(*(range(r.src[0].arg) for r in lanes))]
      value = _combine(new.arg, vals)
      new = UOp(Ops.REDUCE, new.dtype, (value,) + rest, new.arg) if rest else value
    done[n] = new
  return done[ast]


def expand_upcast(ast: UOp) -> UOp:
  """Each store is repeated for every value of the "upcast" lane ranges it depends on."""
  stores = []
  for st in ast.src:
    lanes = [r for r in st.toposort() if r.op is Ops.RANGE and r.arg[1] == "upcast"]
    if not lanes: stores.append(st); continue
    for c in itertools.product(*(range(r.src[0].arg) for r in lanes)):
      stores.append(substitute(st, dict(zip(lanes, (UOp.const(dtypes.index, i) for i in c)))))
  return ast.replace(src=tuple(dict.fromkeys(stores)))


def _stride_order(ast: UOp, rs: list[UOp]) -> list[UOp]:
  """`rs` ordered by the smallest memory stride each has in any load or store index (x first)."""
  best = {r: math.inf for r in rs}
  for u in ast.toposort():
    if u.op is Ops.INDEX:
      terms, _ = linear(u.src[1])
      for r in rs:
        if r in terms: best[r] = min(best[r], abs(terms[r]))
  return sorted(rs, key=lambda r: (best[r], -r.arg[0]))


def _thread_order(ast: UOp) -> list[UOp]:
  """The local ranges as thread dimensions x, y, z: a tensor core's lanes on x (a wave/warp is consecutive x), the
  rest by memory stride."""
  warp = _ranges(ast, "warp")
  return warp + _stride_order(ast, _ranges(ast, "local", "group"))


def apply_gpu_opts(ast: UOp, opts, device: str) -> UOp:
  """apply_opts, and TC (compiler/tc.py) with `device`'s tensor core for the kernel's input dtype (TC comes first)."""
  from .tc import TENSOR_CORES, apply_tc
  from .opt import apply_opts
  for i, o in enumerate(opts):
    if o.op == "TC":
      if i: raise OptError("TC must be the first opt")
      tcs = [tc for tc in TENSOR_CORES.get(device.partition(":")[0], [])]
      if not tcs: raise OptError(f"TC: {device} has no tensor core here")
      errors = []
      for tc in tcs:
        try: ast = apply_tc(ast, tc); break
        except OptError as e: errors.append(str(e))
      else: raise OptError("; ".join(dict.fromkeys(errors)))
    else: ast = apply_opts(ast, [o])
  return ast


def _group(ast: UOp, locals_: list[UOp]) -> UOp:
  """Step 2 of the module docstring."""
  groups = set(_ranges(ast, "group"))
  if not groups: return ast
  deps = range_deps(ast)
  grouped = [u for u in ast.toposort() if u.op is Ops.REDUCE and groups & set(u.src[1:])]
  for u in grouped:
    if any(r.arg[1] in ("reduce", "unroll") for r in deps[u]):
      raise OptError("GROUP: the reduce sits inside another reduce's loop (its barrier would run in a loop)")
  # the thread's slot in workgroup memory: its position among all local and group ranges
  strides, n = {}, 1
  for r in reversed(locals_): strides[r] = n; n *= r.src[0].arg
  def slot(rs: dict) -> UOp:
    out = UOp.const(dtypes.index, 0)
    for r in locals_: out = out + rs.get(r, r) * strides[r]
    return out
  next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
  next_buf = max((u.arg[0] + 1 for u in ast.toposort() if u.op is Ops.DEFINE_LOCAL), default=0)
  done: dict[UOp, UOp] = {}
  level: dict[UOp, int] = {}
  for node in ast.toposort():            # a grouped REDUCE's level: 1 + the most grouped REDUCEs below it
    level[node] = max((level[s] for s in node.src), default=0) + (node in grouped)
  barrier_of: dict[int, UOp] = {}
  for node in ast.toposort():
    src = tuple(done[s] for s in node.src)
    new = node if all(a is b for a, b in zip(src, node.src)) else node.replace(src=src)
    if node in grouped:
      g = [r for r in new.src[1:] if r in groups]
      rest = tuple(r for r in new.src[1:] if r not in groups)
      partial = UOp(Ops.REDUCE, new.dtype, (new.src[0],) + rest, new.arg) if rest else new.src[0]
      buf = UOp(Ops.DEFINE_LOCAL, new.dtype, (), (next_buf, n)); next_buf += 1
      store = UOp(Ops.STORE, None, (UOp(Ops.INDEX, new.dtype, (buf, slot({}))), partial))
      lv = level[node]
      # one barrier per level: every REDUCE of the level writes its partials first
      bar = barrier_of.get(lv)
      stores = (bar.src if bar is not None else ()) + (store,)
      bar = barrier_of[lv] = UOp(Ops.BARRIER, None, stores)
      wait = UOp(Ops.BARRIER, None, (), ("level", lv))    # replaced by the level's barrier once it has every store
      size = g[0].src[0].arg
      if len(g) == 1 and size >= 4 and size & (size - 1) == 0:
        # a tree: in log2(size) steps the first half of the threads adds the second half's partials to theirs
        gr, cur, step = g[0], wait, size // 2
        while step >= 1:
          act = gr < step
          x, y = (UOp(Ops.LOAD, new.dtype, (UOp(Ops.INDEX, new.dtype, (buf, slot(at), act)), cur)) for at in ({}, {gr: gr + step}))
          cur = UOp(Ops.BARRIER, None, (UOp(Ops.STORE, None, (UOp(Ops.INDEX, new.dtype, (buf, slot({}), act)), _combine(new.arg, [x, y]))),))
          step //= 2
        new = UOp(Ops.LOAD, new.dtype, (UOp(Ops.INDEX, new.dtype, (buf, slot({gr: UOp.const(dtypes.index, 0)}))), cur))
      else:   # every thread reduces the partials
        js = {r: UOp(Ops.RANGE, dtypes.index, (r.src[0],), (next_id + i, "reduce")) for i, r in enumerate(g)}
        next_id += len(g)
        load = UOp(Ops.LOAD, new.dtype, (UOp(Ops.INDEX, new.dtype, (buf, slot(js))), wait))
        new = UOp(Ops.REDUCE, new.dtype, (load,) + tuple(js.values()), new.arg)
    done[node] = new
  out = substitute(done[ast], {UOp(Ops.BARRIER, None, (), ("level", lv)): b for lv, b in barrier_of.items()})
  # only the threads with group index 0 store, and only they load what the stored value reads after the reduction
  # (an epilogue's operand: a residual, the other factor of a product), not the threads whose results are dropped
  first = None
  for r in groups: first = (r < 1) if first is None else (first & (r < 1))
  def gated(idx: UOp) -> UOp: return idx.replace(src=(idx.src[0], idx.src[1], first if len(idx.src) == 2 else idx.src[2] & first))
  # (what every thread must load stays: the partials, and the copies into workgroup memory that STAGE shares out)
  barriers = [b for b in out.toposort() if b.op is Ops.BARRIER]
  partials = set(UOp.sink(*barriers).toposort()) if barriers else set()    # (one walk, not one per barrier)
  stores = [st for st in out.src if st.op is Ops.STORE]
  values = UOp.sink(*(st.src[1] for st in stores))     # the stored values, walked once for every store
  loads = {u: u.replace(src=(gated(u.src[0]),) + u.src[1:]) for u in values.toposort()
           if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM and u not in partials}
  if loads: values = substitute(values, loads)
  gates = {st: st.replace(src=(gated(st.src[0]), v)) for st, v in zip(stores, values.src)}
  return out.replace(src=tuple(gates.get(s, s) for s in out.src))


def _stage(ast: UOp, locals_: list[UOp]) -> UOp:
  """STAGE: a reduce loop split into (outer, tile) steps. Each load inside the REDUCE that walks the tile range and
  that some threads of the workgroup share (its index misses a local range) is staged: per outer step, after a
  barrier (the previous step's reads are done), the workgroup's threads copy the whole tile of it (every value of
  its local, upcast and tile ranges) from global to workgroup memory, neighbouring threads taking neighbouring
  addresses; a second barrier; then the load reads workgroup memory. Global traffic drops by the reuse factor."""
  stages = _ranges(ast, "stage")
  if not stages: return ast
  tile_kinds = LOCAL_KINDS + ("upcast", "stage")
  strides, nthreads = {}, 1
  for r in reversed(locals_): strides[r] = nthreads; nthreads *= r.src[0].arg
  tid = UOp.const(dtypes.index, 0)
  for r in locals_: tid = tid + r * strides[r]
  next_buf = max((u.arg[0] + 1 for u in ast.toposort() if u.op is Ops.DEFINE_LOCAL), default=0)
  mapping: dict[UOp, UOp] = {}
  for red in [u for u in ast.toposort() if u.op is Ops.REDUCE and set(stages) & set(u.src[1:])]:
    outer = [r for r in red.src[1:] if r.arg[1] != "stage"]
    first = UOp(Ops.BARRIER, None, tuple(outer)) if outer else None    # in the outer loop: the last step's reads done
    fills, staged = [], {}
    for ld in red.src[0].toposort():
      if ld.op is not Ops.LOAD or ld.src[0].src[0].op is not Ops.PARAM or ld in staged: continue
      idx = ld.src[0]
      rs = {u for s in idx.src[1:] for u in s.toposort() if u.op is Ops.RANGE}
      if not rs & set(stages) or all(r in rs for r in locals_): continue
      if any(r.arg[1] not in tile_kinds + ("global", "reduce") for r in rs): continue
      tile = _stride_order(UOp.sink(idx), [r for r in rs if r.arg[1] in tile_kinds])[::-1]   # innermost last
      size = math.prod(r.src[0].arg for r in tile)
      buf = UOp(Ops.DEFINE_LOCAL, ld.dtype, (), (next_buf, size)); next_buf += 1
      # the copy walks the tile in global order (neighbouring threads, neighbouring addresses); workgroup memory holds
      # it with the upcast lanes innermost, so a thread's reads of its lanes are neighbours (vector loads)
      tstr, sstr, n, m = {}, {}, 1, 1
      for r in reversed(tile): tstr[r] = n; n *= r.src[0].arg
      for r in sorted(tile, key=lambda r: (r.arg[1] != "upcast", -tile.index(r))): sstr[r] = m; m *= r.src[0].arg
      def at(vals: dict) -> UOp: return sum((vals[r] * sstr[r] for r in tile), UOp.const(dtypes.index, 0))
      for e in range(-(-size // nthreads)):
        flat = tid + e * nthreads
        vals = {r: (flat // tstr[r]) % r.src[0].arg for r in tile}
        inside = flat < size if (e + 1) * nthreads > size else None
        gsrc = tuple(substitute(s, vals) for s in idx.src[1:])
        gate = gsrc[1] if len(gsrc) == 2 else None
        gate = inside if gate is None else gate if inside is None else gate & inside
        src = UOp(Ops.LOAD, ld.dtype, (idx.replace(src=(idx.src[0], gsrc[0]) + ((gate,) if gate is not None else ())),)
                  + ((first,) if first is not None else ()))
        sidx = (buf, at(vals)) + ((inside,) if inside is not None else ())
        fills.append(UOp(Ops.STORE, None, (UOp(Ops.INDEX, ld.dtype, sidx), src)))
      staged[ld] = (buf, at({r: r for r in tile}))
    if not staged: continue
    ready = UOp(Ops.BARRIER, None, tuple(fills))
    for ld, (buf, at) in staged.items(): mapping[ld] = UOp(Ops.LOAD, ld.dtype, (UOp(Ops.INDEX, ld.dtype, (buf, at)), ready))
  ast = substitute(ast, mapping) if mapping else ast
  # the tile loops stay loops of the reduce
  return substitute(ast, {r: UOp(Ops.RANGE, dtypes.index, r.src, (r.arg[0], "reduce")) for r in stages})


def to_workgroups(ast: UOp) -> UOp:
  """The three steps of the module docstring. The AST keeps no global, local, group or lane ranges."""
  locals_ = _thread_order(ast)
  ast = _stage(ast, locals_)
  ast = expand_upcast(expand_unroll(ast))
  locals_ = _thread_order(ast)
  if len(locals_) > 3: raise OptError(f"{len(locals_)} local/group axes; a workgroup has 3 dimensions")
  sizes = [r.src[0].arg for r in locals_]
  if math.prod(sizes) > MAX_THREADS: raise OptError(f"workgroup of {math.prod(sizes)} threads; at most {MAX_THREADS}")
  if any(s > m for s, m in zip(sizes, MAX_LOCAL_DIM)): raise OptError(f"workgroup {sizes} exceeds {MAX_LOCAL_DIM}")
  ast = _group(ast, locals_)
  shared = sum(u.dtype.itemsize * u.arg[1] for u in ast.toposort() if u.op is Ops.DEFINE_LOCAL)
  if shared > MAX_SHARED_BYTES: raise OptError(f"{shared} bytes of workgroup memory; at most {MAX_SHARED_BYTES}")
  mapping = {r: UOp(Ops.SPECIAL, dtypes.index, (), (f"lid{i}", r.src[0].arg)) for i, r in enumerate(locals_)}
  gl = list(reversed(_ranges(ast, "global")))          # innermost first: x
  gsz = [r.src[0].arg for r in gl]
  if len(gl) > 3 or any(s > MAX_GRID_YZ for s in gsz[1:3]):
    # fold: x keeps the innermost axis when y/z can hold the rest, else everything goes to x
    keep = 1 if math.prod(gsz[1:]) <= MAX_GRID_YZ and len(gl) > 1 else 0
    dims = gl[:keep] + [None]
    folded = gl[keep:]
    total = math.prod(r.src[0].arg for r in folded)
    sp = UOp(Ops.SPECIAL, dtypes.index, (), (f"gid{keep}", total))
    stride = 1
    for r in folded:
      size = r.src[0].arg
      mapping[r] = (sp // stride) % size if r is not folded[-1] else sp // stride
      stride *= size
    gl = gl[:keep]
  for i, r in enumerate(gl): mapping[r] = UOp(Ops.SPECIAL, dtypes.index, (), (f"gid{i}", r.src[0].arg))
  return substitute(ast, mapping)


def narrow_indices(ast: UOp) -> UOp:
  """Index arithmetic in 32 bits when every index value of the kernel provably fits (its value range): GPUs compute
  32-bit integers natively and 64-bit ones in two or more instructions. Else the kernel keeps 64-bit indices.
  Run after the lowering (codegen): the index expressions are simplified as indices, then only their type changes."""
  nodes = [u for u in ast.toposort() if u.dtype == dtypes.index]
  lo, hi = dtypes.int32.min, dtypes.int32.max
  if not nodes or any(not (lo <= u.vmin and u.vmax <= hi) for u in nodes): return ast
  done: dict[UOp, UOp] = {}
  for n in ast.toposort():
    src = tuple(done[s] for s in n.src)
    if n.op is Ops.DEFINE_VAR: done[n] = UOp(Ops.CAST, dtypes.int32, (n,))   # (the argument stays 64-bit)
    elif n.dtype == dtypes.index:
      arg = n.arg
      done[n] = UOp(n.op, dtypes.int32, src, arg)
    else: done[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
  return done[ast]


def optimizable(ast: UOp) -> bool:
  """Constant loop sizes and at least one global or reduce loop (else the kernel keeps the 1-D mapping). A Variable
  in an index (a KV cache written at start_pos) is fine; a loop of symbolic size is not (yet)."""
  rs = [u for u in ast.toposort() if u.op is Ops.RANGE]
  return bool(rs) and all(r.src[0].op is Ops.CONST for r in rs)


def _broadcast_operand(ast: UOp, r: UOp) -> bool:
  """Does some load of the kernel not depend on the global axis r (an operand every output along r reads again)?"""
  return any(u.op is Ops.LOAD and r not in u.src[0].src[1].toposort() for u in ast.toposort())


def _param_loads(ast: UOp) -> list[UOp]:
  """The kernel's loads of its buffer parameters."""
  return [u for u in ast.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.PARAM]


def _index_ranges(load: UOp) -> int:
  """How many loop ranges a load's index uses."""
  return len({v for v in load.src[0].src[1].toposort() if v.op is Ops.RANGE})


def _unit_stride(ast: UOp, r: UOp) -> bool:
  """Does the largest operand (by element size, then by the ranges its index uses) read neighbouring elements along
  loop range r (stride 1)?"""
  if not (loads := _param_loads(ast)): return False
  big = max(loads, key=lambda u: (u.dtype.itemsize, _index_ranges(u)))
  idx = big.src[0].src[1]
  rs = [v for v in idx.toposort() if v.op is Ops.RANGE]
  if r not in rs: return False
  def at(k: int) -> int:
    return evaluate(substitute(idx, {v: UOp.const(dtypes.index, k if v is r else 0) for v in rs}))
  try: base = at(0); return at(1) - base == 1 and at(4) - base == 4   # (an index through a reshape's div/mod)
  except ValueError: return False                                      # (a Variable in the index)


def _weight_itemsize(ast: UOp) -> int:
  """Element size of the operand read through the most loop ranges (a matrix-vector product's weights)."""
  return max(loads, key=_index_ranges).dtype.itemsize if (loads := _param_loads(ast)) else 0


NARROW_THREADS = 8192       # threads a quantized matvec keeps at least when it tiles outputs per thread
NARROW_WORKGROUPS = 512     # ... and workgroups when it puts several tiles in one (an H200 has 132 SMs)


def _block_group(blocks: int) -> int | None:
  """Threads sharing a reduction of `blocks` 32-weight blocks: the largest divisor of it up to 64, at least 8."""
  return next((n for n in range(min(blocks, 64), 7, -1) if blocks % n == 0), None)


def gpu_opts(ast: UOp, device: str | None = None) -> list:
  """The hand-coded choice: a matmul on 16-bit floats runs on the device's tensor cores (TC) with 4x4 of them per
  wave; long reductions into few outputs are grouped across a workgroup; reductions into many outputs get a register
  tile of outputs per thread (UPCAST), workgroups of neighbouring outputs (LOCAL) and staged operands (STAGE);
  everything else gets workgroups along the innermost axes (padded when no size divides)."""
  nodes = ast.toposort()
  if any(u.op is Ops.RANGE and u.src[0].op is not Ops.CONST for u in nodes): return []
  opts: list = []
  base = ast
  def tryopt(o) -> bool:
    nonlocal ast
    try: ast = apply_opt(ast, o)
    except OptError: return False
    opts.append(o)
    return True
  if device is not None:
    try: ast, opts = apply_gpu_opts(ast, [Opt("TC", 0, 0)], device), [Opt("TC", 0, 0)]
    except OptError: pass
    else:
      n = len(_ranges(ast, "global"))
      for axis in (n - 1, n - 2):
        size = _size(_ranges(ast, "global")[axis])
        next((True for t in (4, 2) if size % t == 0 and tryopt(Opt("UPCAST", axis, t))), None)
      try: to_workgroups(ast)
      except OptError: return [Opt("TC", 0, 0)]
      return opts
  if has_coupled(ast):
    # an online softmax (attention): a register tile along the innermost output axis its running maximum does not
    # depend on (the value's dims: each score computed once for the tile's outputs), then workgroups (below)
    gl = _ranges(ast, "global")
    for axis in reversed(range(len(gl))):
      if next((True for t in (32, 16, 8, 4, 2) if _size(gl[axis]) % t == 0 and tryopt(Opt("UPCAST", axis, t))), None): break
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  nested = any(v.op is Ops.REDUCE for u in reduces for v in u.src[0].toposort() if v is not u)
  gl = _ranges(ast, "global")
  outputs = math.prod(_size(r) for r in gl)
  rl = _ranges(ast, "reduce")
  inner = {v for u in reduces for v in u.src[0].toposort() if v is not u and v.op is Ops.REDUCE}
  top = [u for u in reduces if u not in inner]
  matvec = rows = placed = False     # placed: the kernel's workgroups are chosen (no LOCAL added below)
  if reduces and nested and len(top) == 1 and outputs < 4096 and len(top[0].src) > 1:
    # nested reductions (a loss: a sum over rows of a function of a sum over columns): threads share the outer one
    r = max(top[0].src[1:], key=lambda r: r.arg[0])
    rsize = math.prod(_size(x) for x in top[0].src[1:])
    for n in (64, 32, 16, 8, 4):
      if _size(r) % n == 0 and rsize // n >= 8 and tryopt(Opt("GROUP", rl.index(r), n)): break
  elif reduces and not nested and rl:
    rsize = math.prod(_size(r) for r in rl)
    narrow = any(u.op is Ops.LOAD and u.dtype.itemsize == 1 for u in nodes)
    # lanes per thread and step: one 16-byte load of the weights (8 16-bit weights: on the H200 an 8192x8192 float16
    # matvec ran 146 us with 8, 186 us with 4; float32 keeps 4), else 4
    rowgroup, lanes = next(((g, n) for n in ((8, 4) if _weight_itemsize(ast) == 2 else (4,)) for g in (256, 128, 64)
                            if _size(rl[-1]) % (n * g) == 0 and _size(rl[-1]) // (n * g) >= 4), (None, 4))
    if gl and (outputs < 4096 or len(gl) == 1) and rsize >= 64 and _broadcast_operand(ast, gl[-1]) and not narrow and \
       rowgroup and _unit_stride(ast, rl[-1]):
      # a matrix-vector product whose weight rows are contiguous along the reduction (x @ W.T, the layout of every
      # language model's weights): a workgroup of 256 threads per output, each thread 4 neighbouring weights per step
      # (a vector load; the warp reads 128 neighbouring weights), x re-read per output from the caches. On an H200
      # (8192x8192 float16) the register tile of outputs below, reading each weight row in narrow per-thread strips,
      # took 0.78 ms; BEAM found 0.21 ms for a workgroup per output
      # (a reduction 4 x 256 does not divide, LLaMA's 11008: 128 or 64 threads; on the H200 128 ran float32 as fast
      # and float16 at 0.7x of 256, both far ahead of the register tile)
      rows = tryopt(Opt("UNROLL", len(rl) - 1, lanes)) and tryopt(Opt("GROUP", len(_ranges(ast, "reduce")) - 1, rowgroup))
    elif narrow and gl and (outputs < 4096 or len(gl) == 1) and _broadcast_operand(ast, gl[-1]) and \
         _size(rl[-1]) % 32 == 0 and _size(rl[-1]) >= 256 and (n := _block_group(_size(rl[-1]) // 32)):
      # quantized weights (ggml blocks, a multiple of 32 weights each) times x: each output's reduction split between
      # n threads, each whole blocks in a contiguous chunk (a block's scale loaded once, the block one unrolled step),
      # a tile of up to 4 outputs per thread (x loaded once for them) where that leaves NARROW_THREADS threads, and
      # workgroups of several tiles only where NARROW_WORKGROUPS remain. The register tile below gave a 1024x2816 Q8_0
      # matvec 2 workgroups of 64 threads (a 245M-parameter Q8_0 LLaMA decoded 53 tokens/s on an H200, its F16 file 160)
      rows = placed = True
      t = next((t for t in (4, 2) if outputs % t == 0 and outputs // t * n >= NARROW_THREADS), 1)
      if t > 1: tryopt(Opt("UPCAST", len(gl) - 1, t))
      if tryopt(Opt("GROUPTOP", len(rl) - 1, n)) and _size(rl[-1]) // n > 32:
        tryopt(Opt("UNROLL", len(_ranges(ast, "reduce")) - 1, 32))
      tiles = outputs // t
      next((True for w in (8, 4, 2) if n * w <= 256 and tiles % w == 0 and tiles // w >= NARROW_WORKGROUPS and
            tryopt(Opt("LOCAL", len(gl) - 1, w))), None)
    elif gl and (outputs < 4096 or len(gl) == 1) and rsize >= 64 and _broadcast_operand(ast, gl[-1]):
      if not narrow and len(gl) == 1 and outputs >= 4096 and outputs % 64 == 0 and _size(rl[-1]) % 16 == 0 and \
         rsize // 16 >= 16 and _unit_stride(ast, gl[-1]):
        # weights contiguous along the outputs (x @ W, W of shape (in, out)): 64 threads of a workgroup along the
        # outputs (a warp reads neighbouring weights), 16 along the reduction, each a contiguous chunk. On the H200
        # (8192x8192, clocks warm) float16 ran 54 us, float32 66 us, against 94 and 103 for the register tile below
        try: ast, opts, rows = apply_opts(ast, [Opt("LOCAL", 0, 64), Opt("GROUPTOP", len(rl) - 1, 16)]), \
          opts + [Opt("LOCAL", 0, 64), Opt("GROUPTOP", len(rl) - 1, 16)], True
        except OptError: pass
      matvec = not rows         # (x is not staged through workgroup memory then: the shape measured had it from the caches)
      if not rows:
        # a matrix-vector product: every output reads all of x. A register tile of outputs per thread reads each x
        # element once for all of them (global bytes 1 + 1/tile times the weight's, not 2x), keeping 8+ threads' work
        # (a weight of bytes, quantized blocks: x is 4x its bytes per element, so more outputs share each x load)
        tiles = (64, 32, 16, 8, 4) if narrow else (32, 16, 8, 4)
        amt = next((t for t in tiles if _size(gl[-1]) % t == 0 and outputs // t >= (4 if narrow else 16 if t == 32 else 8)),
                   None)
        if amt: tryopt(Opt("UPCAST", len(gl) - 1, amt))
        outputs = math.prod(_size(r) for r in _ranges(ast, "global"))
    if rows: pass
    elif outputs < 4096 and rsize >= 64:
      # threads of a workgroup share the innermost reduce axis, each at least 16 elements of the whole reduction;
      # quantized blocks in contiguous chunks per thread (GROUPTOP), so a block's scale is loaded once per thread
      last = len(rl) - 1
      group = "GROUPTOP" if narrow else "GROUP"
      # (a chunk of whole 32-element blocks where one divides so: every ggml block is a multiple of 32)
      size = _size(rl[last])
      ns = [n for n in (256, 128, 64, 32, 16, 8, 4) if size % n == 0 and rsize // n >= (32 if narrow else 16)]
      if narrow: ns = [n for n in ns if (size // n) % 32 == 0] + [n for n in ns if (size // n) % 32]
      n = next((n for n in ns if tryopt(Opt(group, last, n))), None)
      # a chunk of several blocks: each block's 32 elements in one unrolled step, so its scale is loaded once
      if narrow and n and (size // n) % 32 == 0 and size // n > 32:
        tryopt(Opt("UNROLL", len(_ranges(ast, "reduce")) - 1, 32))
    elif outputs >= 4096 and len(gl) >= 2:
      # a tile of outputs per thread over the two innermost axes: 8x8 (64 accumulators, 16 loads per 64 fma) when the
      # axes are long enough to leave workgroups, else 4x4; then 16x16 threads, and the reduce staged through
      # workgroup memory in steps of 8 (each operand read from global once per workgroup, not once per thread)
      # (the largest tile that still leaves 2048 threads: small matmuls keep their parallelism)
      tile = next((t for t in (8, 4, 2) if outputs // (t * t) >= 2048), 1)
      for axis in (len(gl) - 1, len(gl) - 2):
        size = _size(_ranges(ast, "global")[axis])
        amt = next((t for t in (tile, tile // 2, tile // 4) if t > 1 and size % t == 0), None)
        if amt: tryopt(Opt("UPCAST", axis, amt))
      n = len(_ranges(ast, "global"))
      for axis in (n - 1, n - 2):
        size = _size(_ranges(ast, "global")[axis])
        if next((tryopt(Opt("LOCAL", axis, t)) for t in (16, 8, 4) if size % t == 0), False) is False: break
      last = len(_ranges(ast, "reduce")) - 1
      if tile >= 4 and len(_ranges(ast, "local")) == 2 and _size(_ranges(ast, "reduce")[last]) % 8 == 0:
        tryopt(Opt("STAGE", last, 8))
  if not reduces and gl and math.prod(_size(r) for r in gl) >= 1 << 16 and _size(gl[-1]) % 4 == 0:
    # a large elementwise kernel: 4 neighbouring outputs per thread, so its loads and stores of 4-byte elements are
    # 16-byte vector accesses (render_ptx vector_accesses): 4x the bytes in flight per thread (an H200 streamed a
    # 1-per-thread float add at 1.1 TB/s of its 4.8)
    tryopt(Opt("UPCAST", len(gl) - 1, 4))
  # workgroups: up to 256 threads over the innermost global axes
  threads = math.prod(_size(r) for r in _ranges(ast, *LOCAL_KINDS))
  gl = _ranges(ast, "global")
  for axis in reversed(range(len(gl))):
    if placed or threads >= 64 or len(_ranges(ast, *LOCAL_KINDS)) >= 3: break
    size = _size(_ranges(ast, "global")[axis])
    want = max(1, min(256 // threads, 16 if len(gl) > 1 and axis != len(gl) - 1 else 256))
    # a grouped reduction's partials: one word per thread and output of its tile in workgroup memory (<= 16 KiB)
    if _ranges(ast, "group"): want = max(1, min(want, 4096 // (threads * math.prod(_size(r) for r in _ranges(ast, "upcast")))))
    n = next((n for n in (256, 128, 64, 32, 16, 8, 4, 2) if n <= want and size % n == 0), None)
    if n is None and size > 64 and threads == 1:
      n = 64 if tryopt(Opt("PADTO", axis, 64)) else None
    if n is not None and n > 1 and tryopt(Opt("LOCAL", axis, n)): threads *= n
  if matvec and _ranges(ast, "local"):
    # the workgroup's threads along the outputs read the same x: staged through workgroup memory, x is read from
    # global once per workgroup (not once per row of threads): a quantized weight's 1.06 bytes per element against
    # x's 4 made that 6% of the traffic
    size = _size(_ranges(ast, "reduce")[-1])
    next((True for t in (32, 16, 8, size) if size % t == 0 and t <= 64 and tryopt(Opt("STAGE", len(_ranges(ast, "reduce")) - 1, t))), None)
  # never a choice that cannot be mapped: the longest prefix of the opts that maps (no opts: the kernel unoptimized)
  for k in range(len(opts), 0, -1):
    try: to_workgroups(ast if k == len(opts) else apply_opts(base, opts[:k]))
    except OptError: continue
    return opts[:k]
  return []


def gpu_actions(ast: UOp) -> list:
  """Every single GPU opt that applies to `ast` (BEAM's moves and the tests' sweep)."""
  out = []
  gl, rl = _ranges(ast, "global"), _ranges(ast, "reduce")
  threads = math.prod(_size(r) for r in _ranges(ast, *LOCAL_KINDS))
  lanes = math.prod(_size(r) for r in _ranges(ast, "upcast", "unroll"))
  for i, r in enumerate(gl):
    s = _size(r)
    out += [Opt("LOCAL", i, n) for n in (2, 4, 8, 16, 32, 64, 128, 256) if s % n == 0 and threads * n <= 256]
    out += [Opt("UPCAST", i, n) for n in (2, 4, 8) if s % n == 0 and lanes * n <= 64]
    out += [Opt("PADTO", i, n) for n in (4, 8, 16, 32, 64) if s % n and s * 2 >= n]
  for i, r in enumerate(rl):
    s = _size(r)
    for op in ("GROUP", "GROUPTOP"):
      out += [Opt(op, i, n) for n in (2, 4, 8, 16, 32, 64, 128, 256) if s % n == 0 and threads * n <= 256]
    out += [Opt("UNROLL", i, n) for n in (2, 4, 8) if s % n == 0 and s > n and lanes * n <= 64]
    out += [Opt("STAGE", i, n) for n in (4, 8, 16) if s % n == 0 and threads > 1]
  return out
