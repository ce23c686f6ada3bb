"""BEAM search over kernel optimizations: time real runs of each candidate, keep the best `width`,
extend them by one more opt, repeat; the winner is cached on disk per kernel (BEAM=n).

The cached winner (`drivers/diskcache.py`, kind "beam") is a JSON list of [op, axis, amount]. An entry that
is not that, or whose opts no longer apply to the kernel (the opts changed since it was written), is
searched again and rewritten; a cache that cannot be used is a warning there, never an error here.

The search times real runs, so it needs the kernel compiler: the caller (compiler/codegen.py) passes its
`get_program` in as `compile_kernel`."""
from __future__ import annotations
import dataclasses, hashlib, json, math, time
from baregrad.drivers import diskcache
from baregrad.drivers.progress import Progress
from .uop import UOp, Ops
from .opt import (Opt, OptError, apply_opt, apply_opts, global_ranges, reduce_ranges, cpu_threads, _size, CHUNKS_PER_THREAD,
                  has_coupled)

MAX_LANES = 256
MAX_CACHED_OPTS = 64   # a cached list longer than this is not one BEAM wrote (depth is a handful)


def ast_key(ast: UOp) -> str:
  order = ast.toposort()
  pos = {u: i for i, u in enumerate(order)}
  text = "\n".join(f"{u.op.name} {u.dtype} {[pos[s] for s in u.src]} {u.arg!r}" for u in order)
  return hashlib.sha256(text.encode()).hexdigest()


def actions(ast: UOp, threads: int) -> list[Opt]:
  if has_coupled(ast): return []     # (an online softmax's loop stays whole; a CPU accumulator has no lanes there)
  gl = global_ranges(ast)
  lanes = math.prod(_size(u) for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "upcast")
  threaded = any(u.op is Ops.SPECIAL for u in ast.toposort())
  out = []
  for i, r in enumerate(gl):
    s = _size(r)
    for amt in (2, 4, 8, 16, 32):
      if s % amt == 0 and lanes * amt <= MAX_LANES: out.append(Opt("UPCAST", i, amt))
    # chunks for the cores to share (compiler/opt.py, CHUNKS_PER_THREAD): a few per core, or many small ones; a
    # threaded kernel may cut a second axis too (chunks of rows x groups of columns)
    for n in ((2, 4) if threaded else (2 * threads, CHUNKS_PER_THREAD * threads)):
      if threads > 1 and s % n == 0: out.append(Opt("THREAD", i, n))
    for k in range(i + 1, len(gl)): out.append(Opt("SWAP", i, k))
    for amt in (4, 8, 16):
      if s % amt and s * 2 >= amt: out.append(Opt("PADTO", i, amt))
  for i, r in enumerate(reduce_ranges(ast)):
    s = _size(r)
    for amt in (2, 4, 8):
      if s % amt == 0 and s > amt: out.append(Opt("UNROLL", i, amt))
  return out


def _emulated(dev) -> bool:
  return dev.driver.emulated


# an emulated GPU's time says little about a real one: BEAM there minimizes what the emulator counted instead, one
# global byte weighed as this many thread-instructions (drivers/emu/counters.py)
EMU_BYTE_COST = 4
# On the H200 the clocks took seconds of load to rise: the first candidates of a sweep (each run 0.05 s first) timed an
# 8192x8192 float16 matvec at 148 us, the same kernel 57 us a few seconds later and 38.5 us after ~5 s of adds. So a
# timing that follows none in the last GPU_COLD_AFTER seconds runs the kernel GPU_COLD_SECONDS first, others
# GPU_WARM_SECONDS.
GPU_LAUNCHES, GPU_WARM_SECONDS, GPU_COLD_SECONDS, GPU_COLD_AFTER = 4, 0.05, 1.0, 1.0
_last_gpu_timing = -1e9


def _buffers(spec) -> list:
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.device import Device
  dev, bufs = Device.get(spec.device), []
  for p in spec.params:
    n = p.arg.size if p.op is Ops.BUFFER else max(1, math.prod(p.shape))
    # written once: never-written pages would all read the kernel's shared zero page (always a cache hit)
    bufs.append(Buffer(dev.name, n, p.dtype).copyin(bytes(n * p.dtype.itemsize)))
  return bufs


def _run_times(spec, prog, bufs, repeats: int) -> list[float]:
  """Device seconds of `repeats` runs of `prog` on `bufs` (a cost from the counters on an emulated GPU, see below)."""
  from baregrad.hcq.device import Device, HOST_KINDS, kind_of
  from baregrad.hcq.runtime import ExecItem, time_item
  dev = Device.get(spec.device)
  item = ExecItem(prog, bufs, {v: 1 for v in prog.variables}, prog.meta)
  emulated = _emulated(dev)
  if emulated:
    from baregrad.drivers.emu import counters
    counters.reset()
    repeats = 1        # the counts do not vary between runs
  # a real GPU's run is GPU_LAUNCHES launches back to back (their time divided by their number), after
  # GPU_WARM_SECONDS of such runs: its clocks rise only under sustained load (an H200 idles at 345 MHz and ran an add
  # 2.4x slower launched alone after waits), which made candidates' times say more about the clock than about them
  launches = 1 if emulated or kind_of(dev.name) in HOST_KINDS else GPU_LAUNCHES
  def run() -> float: return time_item(dev, item, launches)     # every workgroup (exec_item.enqueue's global size)
  if launches > 1:
    global _last_gpu_timing
    cold = time.perf_counter() - _last_gpu_timing > GPU_COLD_AFTER
    end = time.perf_counter() + (GPU_COLD_SECONDS if cold else GPU_WARM_SECONDS)
    while time.perf_counter() < end: run()
  out = [run() for _ in range(repeats)]
  if launches > 1: _last_gpu_timing = time.perf_counter()
  if emulated:
    c = counters.last()
    return [(c.thread_instrs + EMU_BYTE_COST * c.global_bytes) * 1e-9]
  return out


def time_program(spec, opts, compile_kernel, repeats: int = 3) -> float:
  """Seconds per run (best of `repeats`, device timestamps) of the kernel compiled by `compile_kernel` with `opts`;
  on an emulated GPU a cost from the emulator's counters (thread-instructions + EMU_BYTE_COST * global bytes, as
  nanoseconds: comparable between candidates, not with real times)."""
  prog = compile_kernel(dataclasses.replace(spec, opts=tuple(opts)))
  return min(_run_times(spec, prog, _buffers(spec), repeats))


# The search's own timings (the best of a few runs each, one candidate after another) pick the winner among many;
# whether it beats the heuristic is decided as a real run sees them: the two take turns on the same warm buffers,
# ROUNDS rounds of PER_ROUND runs each, and the winner must be faster by MARGIN in the median (a kernel a little
# faster in the search measured 0.89-0.94x of the heuristic's in the bench: best-of-3 rewards lucky runs)
ROUNDS, PER_ROUND, MARGIN = 5, 4, 0.97


def beats(spec, opts, default, compile_kernel) -> bool:
  """Is the kernel with `opts` faster than with `default` (the heuristic's) in a head-to-head run?"""
  progs = [compile_kernel(dataclasses.replace(spec, opts=tuple(o))) for o in (opts, default)]
  bufs = _buffers(spec)
  times: list[list[float]] = [[], []]
  for _ in range(ROUNDS):
    for prog, ts in zip(progs, times):
      _run_times(spec, prog, bufs, 1)                  # warm: caches, the helper threads awake
      ts.extend(_run_times(spec, prog, bufs, PER_ROUND))
  mine, theirs = (sorted(ts)[len(ts) // 2] for ts in times)
  return mine < theirs * MARGIN


def _cache_key(spec, width: int, default: list | None = None) -> str:
  """By the kernel, the device, the width, the threads, and the heuristic's choice (a candidate: when the heuristic
  changes, the kernel is searched again, so a winner found against an older heuristic never stands in for a better
  new default)."""
  heuristic = [[o.op, o.axis, o.amount] for o in default or []]
  return diskcache.hash_key(ast_key(spec.ast), spec.device, width, cpu_threads(), heuristic) + ".json"


def _cached_opts(spec, key: str, moves=None, default=None) -> list[Opt] | None:
  """The cached winner for this kernel, or None when there is none or it no longer applies to the kernel."""
  raw = diskcache.get("beam", key)
  if raw is None: return None
  try: entry = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError, RecursionError): return None
  def is_int(x): return isinstance(x, int) and not isinstance(x, bool)
  if not isinstance(entry, list) or len(entry) > MAX_CACHED_OPTS or not all(
      isinstance(o, list) and len(o) == 3 and isinstance(o[0], str) and is_int(o[1]) and is_int(o[2]) for o in entry):
    return None
  # each opt must be one BEAM could have chosen at that step (which also bounds the lanes it asks for)
  opts, ast, threads = [Opt(*o) for o in entry], spec.ast, cpu_threads()
  if default and opts == list(default): return opts      # the heuristic's choice won
  moves = moves or (lambda a: actions(a, threads))
  for o in opts:
    if o not in moves(ast): return None
    try: ast = apply_opt(ast, o)
    except OptError: return None
  return opts


def beam_search(spec, width: int, compile_kernel, depth: int = 4, default: list | None = None,
                moves=None) -> list[Opt]:
  """The best opts found for this kernel (cached on disk by the kernel's AST); `compile_kernel(spec)` gives the loaded
  program of a KernelSpec (codegen's get_program). `default`: the heuristic's opts, always a candidate, so the search
  never returns something slower than it measured; `moves(ast)`: the opts to try from an AST (default: the CPU's)."""
  key = _cache_key(spec, width, default)
  if (cached := _cached_opts(spec, key, moves, default)) is not None: return cached
  threads = cpu_threads()
  moves = moves or (lambda ast: actions(ast, threads))
  base = time_program(spec, [], compile_kernel)
  bar = Progress(desc=f"BEAM {spec.name}")
  beam: list[tuple[float, list[Opt]]] = [(base, [])]
  if default: beam.append((time_program(spec, default, compile_kernel), list(default)))
  beam.sort(key=lambda c: c[0])
  best = beam[0]
  tried: set = {tuple(o) for _, o in beam}
  for level in range(depth):
    cands = []
    for _, opts in beam:
      try: ast = apply_opts(spec.ast, opts)
      except OptError: continue
      for a in moves(ast):
        new = opts + [a]
        if tuple(new) in tried: continue
        tried.add(tuple(new))
        try:
          apply_opts(spec.ast, new)
          cands.append((time_program(spec, new, compile_kernel), new))
        except OptError: continue
        bar.update(1, note=f"level {level + 1}/{depth}, best {min(best[0], min(c[0] for c in cands)) * 1e6:.1f} us "
                           f"(unoptimized {base * 1e6:.1f} us)")
    if not cands: break
    cands.sort(key=lambda c: c[0])
    beam = cands[:width]
    if beam[0][0] >= best[0] * 0.98: break
    best = beam[0]
  bar.close()
  if default is not None and best[1] != list(default) and not beats(spec, best[1], list(default), compile_kernel):
    best = (best[0], list(default))
  diskcache.put("beam", key, json.dumps([[o.op, o.axis, o.amount] for o in best[1]]).encode())
  return best[1]
