"""Kernel optimizations on ranges: UPCAST (a global axis gets an inner constant-size lane loop whose
accumulators live in registers), UNROLL (a reduce axis gets an inner constant-size loop the compiler unrolls),
THREAD (a global axis is split across CPU cores), SWAP (loop order), PADTO (a global axis is rounded up to a
multiple, the extra iterations gated off, so UPCAST/THREAD can split it). GPUs add LOCAL, GROUP and GROUPTOP
(compiler/gpu.py maps the ranges onto workgroups).
`hand_coded_opts` picks them by default; compiler.search (BEAM=n) picks them by timing real runs."""
from __future__ import annotations
import math
from dataclasses import dataclass
from baregrad.drivers import settings
from .uop import UOp, Ops
from .dtype import dtypes
from .pattern import substitute
from .symbolic import linear


@dataclass(frozen=True)
class Opt:
  op: str          # "UPCAST" | "UNROLL" | "THREAD" | "SWAP" | "PADTO"; GPU only (compiler/gpu.py): "LOCAL" | "GROUP" |
                   # "GROUPTOP" | "STAGE"
  axis: int        # index into the kernel's current global axes, outermost first (UNROLL: its reduce axes)
  amount: int = 0  # lanes / unrolled iterations / threads / the other axis for SWAP / the multiple for PADTO

  def __repr__(self): return f"{self.op}({self.axis},{self.amount})"


class OptError(ValueError):
  pass


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


def apply_opt(ast: UOp, opt: Opt) -> UOp:
  if opt.op in ("UNROLL", "GROUP", "GROUPTOP", "STAGE"): return _unroll(ast, opt)
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
    n = opt.amount
    if n < 2 or size % n: raise OptError(f"{opt}: axis of size {size} does not split across {n} threads")
    if any(u.op is Ops.SPECIAL for u in ast.toposort()): raise OptError("kernel is already threaded")
    core = UOp(Ops.SPECIAL, dtypes.index, (), ("core", n))
    # the chunk loop keeps this axis's place in the loop order
    inner = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size // n),), r.arg)
    return substitute(ast, {r: core * (size // n) + inner})
  if opt.op == "PADTO":
    amt = opt.amount
    if amt < 2 or size % amt == 0: raise OptError(f"{opt}: axis of size {size} is already a multiple of {amt}")
    if size * 2 < amt: raise OptError(f"{opt}: padding {size} to {amt} more than doubles the work")
    padded = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, -(-size // amt) * amt),), r.arg)
    tmp = substitute(ast, {r: padded})
    # the padded iterations neither load nor store: every memory access they reach is gated
    inside = padded < size
    gates = {}
    for u in tmp.toposort():
      if u.op is Ops.INDEX and padded in u.src[1].toposort() + (u.src[2].toposort() if len(u.src) == 3 else []):
        gates[u] = u.replace(src=(u.src[0], u.src[1], inside if len(u.src) == 2 else (u.src[2] & inside)))
      elif u.op is Ops.STORE and u.src[0] not in gates and len(u.src[0].src) == 2:
        gates[u.src[0]] = u.src[0].replace(src=(*u.src[0].src, inside))
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


def _unit_stride_axes(ast: UOp, gl: list[UOp]) -> set[UOp]:
  """Global ranges that some load or the store walks with stride 1."""
  out = set()
  for u in ast.toposort():
    if u.op is Ops.INDEX:
      terms, _ = linear(u.src[1])
      out |= {r for r in gl if terms.get(r) == 1}
  return out


def hand_coded_opts(ast: UOp, threads: int | None = None) -> list[Opt]:
  threads = cpu_threads() if threads is None else threads
  nodes = ast.toposort()
  gl = global_ranges(ast)
  if not gl or any(r.src[0].op is not Ops.CONST for r in _ranges(ast)): return []
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  nested = any(v.op is Ops.REDUCE for u in reduces for v in u.src[0].toposort() if v is not u)
  work = math.prod(_size(r) for r in gl) * math.prod(_size(r) for r in _ranges(ast) if r.arg[1] == "reduce")
  opts: list[Opt] = []
  sizes = [_size(r) for r in gl]
  if reduces and not nested:
    unit = _unit_stride_axes(ast, gl)
    cand = [i for i in range(len(gl)) if gl[i] in unit] or [len(gl) - 1]
    j = cand[-1]
    picks = {}
    amt_j = next((a for a in (16, 8, 4) if sizes[j] % a == 0), None)
    if amt_j: picks[j] = amt_j
    i = next((i for i in reversed(range(len(gl))) if i != j and sizes[i] % 4 == 0), None)
    if (i is not None and i < j and has_avx512() and amt_j == 16 and sizes[j] % 32 == 0 and sizes[i] % 8 == 0
        and sizes[j] > 32 and sizes[i] > 8):
      # AVX-512: 8 rows x 2 vectors of 16 = 16 accumulators, 10 loads per 16 FMAs; the unit-stride axis goes
      # outer so its operand's strip stays in cache while the rows stream past
      opts += [Opt("UPCAST", j, 16), Opt("UPCAST", j, 2), Opt("UPCAST", i, 8), Opt("SWAP", i, j)]
      sizes[j] //= 32; sizes[i] //= 8
      sizes[i], sizes[j] = sizes[j], sizes[i]
      picks = {}
    elif i is not None:
      # a 16x16 register tile needs 32 vector registers (AVX-512); 16x8 fits 16 (AVX2)
      wide = 16 if has_avx512() and sizes[i] % 16 == 0 and amt_j == 16 else 0
      picks[i] = wide or (8 if sizes[i] % 8 == 0 and amt_j and amt_j <= 16 else 4)
    for axis in sorted(picks, reverse=True):    # higher axes first: lower indices stay valid
      opts.append(Opt("UPCAST", axis, picks[axis]))
      sizes[axis] //= picks[axis]
    sizes = [s for s in sizes if s != 1] if any(s == 1 for s in sizes) else sizes
  if threads > 1 and work >= (1 << 18) and sizes:
    # reductions: split the innermost axis (each core streams its own part of the reused operand)
    axes = list(reversed(range(len(sizes)))) if reduces else list(range(len(sizes)))
    for i in axes:
      s = sizes[i]
      if s % threads == 0 and s >= threads:
        opts.append(Opt("THREAD", i, threads)); break
  return opts
