"""Kernel AST -> program: simplify, decompose, linearize, render, compile, load. Cached per AST."""
from __future__ import annotations
import math, os, re
from dataclasses import dataclass
from .uop import UOp, Ops, ALU
from .pattern import graph_rewrite, substitute
from .dtype import dtypes
from .shape import sprod, smul, max_size
from . import lower as _lowering
from .linearize import linearize
from .render_c import CRenderer
from .rangeify import KernelSpec
from .deepstack import on_deep_stack
from .opt import hand_coded_opts, apply_opts, threads_of
from .search import beam_search
from . import gpu as _gpu
from . import viz as _viz   # VIZ=out.html report hook

from baregrad.drivers import settings
DEBUG = settings.DEBUG   # these module globals are the runtime switches (tests monkeypatch them)
OPT = settings.OPT       # 0: no kernel optimizations
BEAM = settings.BEAM     # >0: search optimizations by timing real runs
RENDERERS = {"CPU": CRenderer}


def _ptx_renderer():   # NV: PTX for the opened device's sm (the driver reads it from the GPU's compute class)
  from .render_ptx import PTXRenderer
  from baregrad.hcq.device import Device
  return PTXRenderer(arch=Device.get("NV").driver.target)


RENDERERS["NV"] = _ptx_renderer


def _amd_renderer():   # AMD: RDNA3 assembly -> code object, no external tools
  from .render_amd import AMDRenderer
  return AMDRenderer()


RENDERERS["AMD"] = _amd_renderer


def _msl_renderer():   # METAL: MSL source, compiled by Metal when the driver makes a library of it
  from .render_msl import MSLRenderer
  return MSLRenderer()


RENDERERS["METAL"] = _msl_renderer
_programs: dict = {}      # (ast, device, opts) -> Program, least recently used first
PROGRAM_CACHE = settings.PROGRAM_CACHE   # loaded programs kept for reuse


program_holders: list = []   # clear() of each cache that holds programs too (compiler/schedule.py's plans)


def clear_programs():
  """Forget every cached program and schedule: each is unloaded once nothing else holds it and its device has
  finished the work queued before."""
  _programs.clear()
  for clear in program_holders: clear()


_device_epoch = 0


def drop_stale_programs():
  """Cached programs (and the schedules holding them) are loaded on a Device object; when a device was closed, or
  dropped in a forked child, Device.epoch moved and they are forgotten (a new device loads its own)."""
  global _device_epoch
  from baregrad.hcq.device import Device
  if Device.epoch != _device_epoch:
    clear_programs()
    _device_epoch = Device.epoch
stats = {"kernels_compiled": 0}


def renderer_for(device: str):
  kind = device.partition(":")[0]     # AMD:1 renders as AMD does
  if kind not in RENDERERS: raise RuntimeError(f"no renderer for device {device}")
  return RENDERERS[kind]()


def rewrite_passes(renderer) -> list[tuple]:
  """The rewrites between the optimizations and linearize, in order, as (label, patterns, ctx): optimize_ast runs
  them, VIZ reports each one's rewrite count. The lowering (compiler/lower.py) is keyed by what the renderer declares."""
  return _lowering.passes(renderer.native_ops)


def optimize_ast(ast: UOp, renderer, rewrite_stats: dict | None = None) -> UOp:
  for _, patterns, ctx in rewrite_passes(renderer): ast = graph_rewrite(ast, patterns, ctx=ctx, stats=rewrite_stats)
  return ast


LOCAL_SIZE = 256


def to_threads(ast: UOp, local_size: int = LOCAL_SIZE) -> tuple[UOp, tuple, tuple]:
  """GPU targets: the global loops become one global thread id (SPECIAL "gidx" = block * local_size + thread),
  split back into the loop indices with div/mod; threads past the end are masked off at the store.
  Returns (ast, global_size in blocks, local_size)."""
  ranges, total = _global_ranges(ast)
  blocks = max(1, -(-max_size((total,)) // local_size))
  gidx = UOp(Ops.SPECIAL, dtypes.index, (), ("gidx", blocks * local_size))
  mapping, stride = {}, 1
  for r in reversed(ranges):
    size = r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0]
    mapping[r] = (gidx // stride) % size if r is not ranges[0] else gidx // stride
    stride = smul(stride, size)
  ast = substitute(ast, mapping)
  if isinstance(total, UOp) or blocks * local_size != total:
    # threads past the end must neither store nor load: gate every memory access
    in_range = gidx < total
    gates = {}
    for u in ast.toposort():
      if u.op is Ops.INDEX:
        valid = in_range if len(u.src) == 2 else (u.src[2] & in_range)
        gates[u] = u.replace(src=(u.src[0], u.src[1], valid))
    ast = substitute(ast, gates)
  return ast, (blocks, 1, 1), (local_size, 1, 1)


def _global_ranges(ast: UOp) -> tuple[list, object]:
  """The global loops in `to_threads` order and their product (an int, or an expression of the Variables). A
  symbolic size (compiler/shape.py) goes outermost, so no other index divides by it; the launch covers its largest
  value and the threads past this launch's end are masked off with the rest."""
  ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "global"}, key=lambda r: r.arg[0])
  ranges.sort(key=lambda r: r.src[0].op is Ops.CONST)
  return ranges, sprod(r.src[0] if r.src[0].op is not Ops.CONST else r.src[0].arg for r in ranges)


def symbolic_grid(ast: UOp, local_size: int = LOCAL_SIZE) -> tuple | None:
  """The workgroups a `to_threads` kernel needs for the Variables' values, as (blocks, 1, 1) with blocks an
  expression in them, when its global size is symbolic (a KV cache's 0..pos); else None. The drivers launch that
  many (hcq resolves it per launch, a JIT graph patches it per replay); `global_size` stays the largest launch."""
  total = _global_ranges(ast)[1]
  if not isinstance(total, UOp): return None
  return ((total + (local_size - 1)) // local_size, 1, 1)


def estimate(ast: UOp, params) -> dict:
  """Rough flop and byte counts: ALU ops times the iterations of the loops they sit in (the constant-size
  RANGEs and "core" SPECIALs reachable from the op). One walk: each node's loops are the union of its sources'."""
  flops = 0
  loops: dict[UOp, frozenset] = {}    # node -> the loops it runs in
  for u in ast.toposort():
    inside = frozenset().union(*(loops[s] for s in u.src))
    if (u.op is Ops.RANGE and u.src[0].op is Ops.CONST) or (u.op is Ops.SPECIAL and u.arg[0] == "core"): inside |= {u}
    loops[u] = inside
    if (u.op in ALU or u.op is Ops.REDUCE) and u.dtype != dtypes.index:   # a REDUCE: one op per iteration
      flops += math.prod(r.src[0].arg if r.op is Ops.RANGE else r.arg[1] for r in inside)
  nbytes = sum(p.shape[0] * p.dtype.itemsize if p.op is Ops.BUFFER else max_size(p.shape) * p.dtype.itemsize for p in params)
  return {"flops": flops, "bytes": nbytes}


def _tc_device(renderer) -> str | None:
  """The device whose tensor cores the heuristic may use: the renderer's, if it renders WMMA ops."""
  return renderer.device if getattr(renderer, "tensor_cores", False) else None


def search_opts(spec: KernelSpec, renderer) -> list:
  """BEAM compiles and times candidates with get_program; the heuristic's choice is one of them. A kernel with a loop
  of symbolic size keeps the heuristic's choice: its time depends on the Variable's value, which a search cannot fix."""
  if any(u.op is Ops.RANGE and u.src[0].op is not Ops.CONST for u in spec.ast.toposort()):
    return _gpu.gpu_opts(spec.ast, _tc_device(renderer)) if getattr(renderer, "workgroups", False) else hand_coded_opts(spec.ast)
  if getattr(renderer, "workgroups", False):
    return beam_search(spec, BEAM, get_program, default=_gpu.gpu_opts(spec.ast, _tc_device(renderer)), moves=_gpu.gpu_actions)
  return beam_search(spec, BEAM, get_program, default=hand_coded_opts(spec.ast))


@dataclass
class Lowered:
  """A kernel ready to render: the linear program, REDUCE -> accumulator aliases, variables, launch meta."""
  program: list
  alias: dict
  variables: list
  launch: dict
  ast: UOp
  opt_ast: UOp       # the AST after the optimizations (or the GPU thread mapping), before optimize_ast


def lower(spec: KernelSpec, renderer) -> Lowered:
  """Kernel AST -> linear program for `renderer`: GPU threads or CPU opts, symbolic + decompositions, linearize
  (on the compiler's deep-stack thread: compiler/deepstack.py)."""
  return on_deep_stack(_lower, spec, renderer)


GRID_SPECIALS = ("gid0", "gid1", "gid2")
LOCAL_SPECIALS = ("lid0", "lid1", "lid2")


def launch_dims(ast: UOp) -> dict | None:
  """The launch of a kernel whose AST is already mapped to workgroups (SPECIALs gid0..2 / lid0..2): global_size in
  workgroups and local_size in threads, x first. None when it has none."""
  specials = {u.arg[0]: u.arg[1] for u in ast.toposort() if u.op is Ops.SPECIAL}
  if not any(n in specials for n in GRID_SPECIALS + LOCAL_SPECIALS): return None
  return {"global_size": tuple(specials.get(n, 1) for n in GRID_SPECIALS),
          "local_size": tuple(specials.get(n, 1) for n in LOCAL_SPECIALS)}


def _lower(spec: KernelSpec, renderer) -> Lowered:
  ast, launch, gpu = spec.ast, {}, getattr(renderer, "threads", False)
  if gpu and (dims := launch_dims(ast)) is not None: launch = dims
  elif gpu and OPT and getattr(renderer, "workgroups", False) and _gpu.optimizable(ast):
    opts = spec.opts if spec.opts is not None else search_opts(spec, renderer) if BEAM else _gpu.gpu_opts(ast, _tc_device(renderer))
    ast = _gpu.to_workgroups(_gpu.apply_gpu_opts(ast, opts, renderer.device))
    launch = {**(launch_dims(ast) or {"global_size": (1, 1, 1), "local_size": (1, 1, 1)}), "opts": tuple(opts)}
  elif gpu:
    grid = symbolic_grid(ast)
    ast, gsz, lsz = to_threads(ast)
    launch = {"global_size": gsz, "local_size": lsz, **({"grid": grid} if grid is not None else {})}
  elif OPT:
    opts = spec.opts if spec.opts is not None else search_opts(spec, renderer) if BEAM else hand_coded_opts(ast)
    ast = apply_opts(ast, opts)
    launch = {"threads": threads_of(ast), "opts": tuple(opts)}
  opt_ast = ast
  ast = optimize_ast(ast, renderer)
  if "opts" in launch and gpu: ast = _gpu.narrow_indices(ast)
  program, alias = linearize(ast, merge=gpu)
  variables = sorted({u for u in ast.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda v: v.arg[0])
  return Lowered(program, alias, variables, launch, ast, opt_ast)


def compile_source(device: str, src, renderer=None) -> bytes:
  """Rendered source -> binary: the renderer's own compiler where it has one (AMD: the renderer's instruction objects
  to baregrad's encoder, no text), else the driver's (CPU: cc, NV: ptxas)."""
  from baregrad.hcq.device import Device
  renderer = renderer if renderer is not None else renderer_for(device)
  return renderer.compile(src) if hasattr(renderer, "compile") else Device.get(device).driver.compile(src)


def get_program(spec: KernelSpec):
  return get_programs([spec])[0]


def _cached(key):
  prog = _programs.pop(key, None)
  if prog is not None: _programs[key] = prog      # most recently used last
  return prog


@dataclass
class _Rendered:
  spec: KernelSpec
  key: tuple
  renderer: object
  low: Lowered
  name: str
  src: object


def get_programs(specs) -> list:
  """The loaded Program of each spec. Those not loaded yet are lowered and rendered here one after another, then
  compiled at once by a pool of threads sized to the cores where the compiler is another process (cc, ptxas),
  then loaded in order: a cold schedule waits for its slowest compile, not for the sum of them."""
  drop_stale_programs()
  out, pending = [], {}
  for i, spec in enumerate(specs):     # any iterable (a progress bar over the schedule)
    out.append(None)
    key = (spec.ast, spec.device, spec.opts)
    if (prog := _cached(key)) is not None: out[i] = prog
    elif key in pending: pending[key][1].append(i)
    else: pending[key] = (on_deep_stack(_render, spec, key), [i])
  jobs = list(pending.values())
  external = [r for r, _ in jobs if not hasattr(r.renderer, "compile")]
  binaries = {}
  if len(external) > 1:
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(len(external), os.cpu_count() or 1)) as pool:
      for r, b in zip(external, pool.map(lambda r: compile_source(r.spec.device, r.src, r.renderer), external)):
        binaries[r.key] = b
  for r, idxs in jobs:
    binary = binaries.get(r.key)
    if binary is None: binary = on_deep_stack(compile_source, r.spec.device, r.src, r.renderer)
    prog = _load(r, binary)
    for i in idxs: out[i] = prog
  return out


def _render(spec: KernelSpec, key) -> _Rendered:
  renderer = renderer_for(spec.device)
  low = lower(spec, renderer)
  name = re.sub(r"[^A-Za-z0-9_]", "_", spec.name)
  src = renderer.render(name, low.program, low.alias, len(spec.params), low.variables)
  if hasattr(renderer, "with_launch_bounds") and "local_size" in low.launch:    # PTX: .maxntid (the block it runs with)
    src = renderer.with_launch_bounds(src, low.launch["local_size"])
  if DEBUG >= 4: print(src)
  return _Rendered(spec, key, renderer, low, name, src)


def _load(r: _Rendered, binary: bytes):
  from baregrad.hcq.device import Device
  from baregrad.hcq.program import Program
  spec, low = r.spec, r.low
  prog = Program(spec.device, r.name, binary, r.src, len(spec.params), tuple(v.arg[0] for v in low.variables),
                 meta={**estimate(low.ast, spec.params), **low.launch}).load(Device.get(spec.device))
  stats["kernels_compiled"] += 1
  if _viz.VIZ: _viz.viz_event("kernel", spec=spec, launch=low.launch, opt_ast=low.opt_ast,
                              passes=rewrite_passes(r.renderer), ast=low.ast, program=low.program, source=r.src,
                              name=r.name)
  _programs[r.key] = prog
  while len(_programs) > PROGRAM_CACHE: _programs.pop(next(iter(_programs)))
  return prog
