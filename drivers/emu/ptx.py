"""A vectorized PTX interpreter: runs every thread of a kernel launch with numpy.

    module = parse_ptx(text)
    launch(module, "kernel", grid=(gx, gy, gz), block=(bx, by, bz), params=[addr0, addr1, n], mem=memory)

Threads run in batches of whole blocks (up to `BATCH_THREADS` threads, all blocks of most launches): each
register is one numpy array over the batch and each instruction is one Python dispatch over the threads that
execute it. Guards (`@%p`) narrow the executing threads. Divergence uses a per-thread program counter: the
group of threads at the lowest PC runs until it branches (splitting or not) or reaches a label where other
threads wait, then the lowest PC is looked up again, so threads re-join at labels (loop exits, if/else joins)
and a loop runs its iterations with every thread still in it. `bar.sync` ends a group's run too; as no
thread of a block can be behind the lowest PC, the block has arrived when its group reaches the barrier.

Memory: global through `mem` (drivers/emu/memory.py `Memory`: vectorized gather/scatter raising
`MemoryFault`), `.local` one byte array per thread, `.shared` one per block, `.param` the launch
parameters. Generic addresses of .local/.shared (cvta) live in the windows LOCAL_WINDOW / SHARED_WINDOW.

Counters (drivers/emu/counters.py): `launch` returns the run's `KernelCounters`: each executed instruction adds the
number of threads that execute it (a guard's true threads) to its class (decided when it is compiled,
ptx_exec.counter_class), and `_Batch.load/store` add threads x width to the global / shared byte counts of the space
the access lands in (generic addresses included).

Errors: `PtxUnsupported(name, line)` for instructions or forms not implemented (raised when the entry is
first compiled, before anything runs), `PtxRunaway` when a launch exceeds its instruction budget, `PtxTrap` when a
thread executes `trap` (the GPU's illegal-instruction exception), `PtxWarpError` when a `.sync.aligned` warp-wide
instruction (mma) is executed by part of a warp only.

Warps: the 32 threads of consecutive linear thread index (x fastest) within a block are a warp (%laneid 0-31);
warps never straddle blocks, so a block whose size is not a multiple of 32 ends with a partial warp. Warp-wide
instructions (mma.sync) read the registers of all 32 threads of each warp in the executing group at once.
"""
from __future__ import annotations
import re

import time

import numpy as np

from baregrad.drivers import settings
from . import counters as counters_mod
from .counters import KernelCounters, GLOBAL, SHARED, OTHER
from .memory import Memory, MemoryFault
from .ptx_parse import PtxModule, PtxError, PtxTrap, PtxUnsupported, PtxWarpError, parse_ptx, Entry
from .ptx_exec import (Compiler, KIND_OP, KIND_BRA, KIND_EXIT, KIND_BAR, HANDLERS, LOCAL_WINDOW, SHARED_WINDOW,
                       WINDOW_SIZE, NP, container)

__all__ = ["parse_ptx", "launch", "PtxModule", "PtxError", "PtxTrap", "PtxUnsupported", "PtxWarpError", "PtxRunaway", "Memory",
           "MemoryFault", "SUPPORTED", "BATCH_THREADS"]

BATCH_THREADS = 1 << 16
MAX_STEPS = settings.PTX_MAX_STEPS   # instruction dispatches per launch
# the instructions `launch` runs (control flow here, the rest in ptx_exec.HANDLERS)
SUPPORTED = sorted(set(HANDLERS) | {"bra", "ret", "exit", "bar", "barrier", "membar", "fence", "prefetch", "prefetchu",
                                    "nanosleep", "pmevent", "trap"})


class PtxRunaway(RuntimeError):
  """A launch executed more instruction dispatches than its budget (an endless loop, most likely)."""


def _dims(v, what: str) -> tuple[int, int, int]:
  t = (v,) if isinstance(v, (int, np.integer)) else tuple(int(x) for x in v)
  if not 1 <= len(t) <= 3 or any(x < 1 for x in t): raise ValueError(f"{what} must be 1 to 3 positive sizes, got {v!r}")
  return t + (1,) * (3 - len(t))


def _param_bytes(entry: Entry, params) -> bytes:
  size = entry.param_size
  if isinstance(params, (bytes, bytearray, memoryview)):
    data = bytes(params)
    if len(data) < size: raise ValueError(f"{entry.name}: {size} bytes of parameters needed, {len(data)} given")
    return data
  params = list(params)
  if len(params) != len(entry.params):
    raise ValueError(f"{entry.name} takes {len(entry.params)} parameters ({', '.join(p.name for p in entry.params)}), "
                     f"got {len(params)}")
  buf = bytearray(size)
  for p, v in zip(entry.params, params):
    if isinstance(v, (bytes, bytearray, memoryview)):
      b = bytes(v)
      if len(b) != p.size: raise ValueError(f"parameter {p.name}: {p.size} bytes expected, {len(b)} given")
    elif p.type in ("f32", "f64", "f16"):
      b = np.asarray(v, NP[p.type]).tobytes()
    else:
      b = (int(v) & ((1 << (8 * p.size)) - 1)).to_bytes(p.size, "little")
    buf[p.offset:p.offset + p.size] = b
  return bytes(buf)


class _Batch:
  """The state of the threads of one batch of blocks."""

  def __init__(self, entry: Entry, first_block: int, nblocks: int, grid, block, params: bytes, mem, regs: dict,
               counters: KernelCounters | None = None):
    self.entry, self.mem = entry, mem
    self.counters = KernelCounters(entry.name) if counters is None else counters
    tpb = block[0] * block[1] * block[2]
    self.n = n = nblocks * tpb
    self.threads = np.arange(n, dtype=np.int64)
    local = self.threads % tpb
    self.block_row = self.threads // tpb
    blk = first_block + self.block_row
    self.sregs = {
      "tid.x": (local % block[0]).astype(np.uint32), "tid.y": ((local // block[0]) % block[1]).astype(np.uint32),
      "tid.z": (local // (block[0] * block[1])).astype(np.uint32),
      "ctaid.x": (blk % grid[0]).astype(np.uint32), "ctaid.y": ((blk // grid[0]) % grid[1]).astype(np.uint32),
      "ctaid.z": (blk // (grid[0] * grid[1])).astype(np.uint32),
      "ntid.x": np.uint32(block[0]), "ntid.y": np.uint32(block[1]), "ntid.z": np.uint32(block[2]),
      "nctaid.x": np.uint32(grid[0]), "nctaid.y": np.uint32(grid[1]), "nctaid.z": np.uint32(grid[2]),
      "laneid": (local % 32).astype(np.uint32), "warpid": (local // 32).astype(np.uint32),
      "nwarpid": np.uint32(-(-tpb // 32)), "smid": np.uint32(0), "nsmid": np.uint32(1), "gridid": np.uint64(0),
      "warpsize": np.uint32(32),
    }
    lane = local % 32
    one = np.ones(n, np.uint64)
    self.sregs.update({
      "lanemask_eq": (one << lane.astype(np.uint64)).astype(np.uint32),
      "lanemask_lt": ((one << lane.astype(np.uint64)) - one).astype(np.uint32),
      "lanemask_le": ((one << (lane + 1).astype(np.uint64)) - one).astype(np.uint32)})
    self.sregs["lanemask_gt"] = ~self.sregs["lanemask_le"]
    self.sregs["lanemask_ge"] = ~self.sregs["lanemask_lt"]
    self.params = np.frombuffer(params, np.uint8)
    self.regs = {name: np.zeros(n, cont) for name, cont in regs.items()}
    ls, ss = entry.space_size("local"), entry.space_size("shared")
    self.local = np.zeros((n, ls), np.uint8)
    self.shared = np.zeros((nblocks, ss), np.uint8)
    self.steps = 0

  def sreg(self, key: str):
    if key in ("clock", "clock64"): return np.uint32(self.steps) if key == "clock" else np.uint64(self.steps)
    if key == "globaltimer": return np.uint64(time.time_ns())
    v = self.sregs.get(key)
    if v is None: raise PtxUnsupported("%" + key)
    return v.view() if isinstance(v, np.ndarray) else v

  def count(self, idx) -> int: return self.n if idx is None else len(idx)

  def rows(self, idx): return self.threads if idx is None else idx

  # ---- memory ----
  def load(self, space: str, addrs, idx, nbytes: int) -> np.ndarray:
    n = self.count(idx)
    addrs = np.broadcast_to(np.asarray(addrs, np.uint64), (n,))
    if space == "global":
      self.counters.global_load_bytes += n * nbytes
      return self.mem.gather(np.ascontiguousarray(addrs), nbytes)
    if space == "param":
      offs = addrs.astype(np.int64)
      if n and (offs.max() + nbytes > self.params.size): raise MemoryFault(int(offs.max()), nbytes)
      return self.params[offs[:, None] + np.arange(nbytes)]
    if space == "local": return self._take(self.local, self.rows(idx), addrs, nbytes, LOCAL_WINDOW)
    if space == "shared":
      self.counters.shared_load_bytes += n * nbytes
      return self._take(self.shared, self.block_row[self.rows(idx)], addrs, nbytes, SHARED_WINDOW)
    return self._generic(addrs, idx, nbytes, None)

  def store(self, space: str, addrs, idx, data: np.ndarray, nbytes: int):
    n = self.count(idx)
    addrs = np.broadcast_to(np.asarray(addrs, np.uint64), (n,))
    if space == "global":
      self.counters.global_store_bytes += n * nbytes
      self.mem.scatter(np.ascontiguousarray(addrs), data, nbytes)
    elif space == "local": self._put(self.local, self.rows(idx), addrs, data, nbytes, LOCAL_WINDOW)
    elif space == "shared":
      self.counters.shared_store_bytes += n * nbytes
      self._put(self.shared, self.block_row[self.rows(idx)], addrs, data, nbytes, SHARED_WINDOW)
    else: self._generic(addrs, idx, nbytes, data)

  def _generic(self, addrs, idx, nbytes: int, data):
    """Generic addressing: the .local / .shared windows, everything else is global. The instruction was counted as
    global (ptx_exec.counter_class); the threads whose address lands in a window move to that space's class."""
    rows = self.rows(idx)
    in_local = (addrs >= np.uint64(LOCAL_WINDOW)) & (addrs < np.uint64(LOCAL_WINDOW + WINDOW_SIZE))
    in_shared = (addrs >= np.uint64(SHARED_WINDOW)) & (addrs < np.uint64(SHARED_WINDOW + WINDOW_SIZE))
    glob = ~(in_local | in_shared)
    out = np.zeros((len(addrs), nbytes), np.uint8) if data is None else None
    instrs = self.counters.instrs
    for sel, space, base in ((glob, "global", 0), (in_local, "local", LOCAL_WINDOW), (in_shared, "shared", SHARED_WINDOW)):
      if not sel.any(): continue
      if space != "global":
        moved = int(np.count_nonzero(sel))
        instrs[GLOBAL] -= moved
        instrs[OTHER if space == "local" else SHARED] += moved
      a = addrs[sel] - np.uint64(base)
      sub = rows[sel]
      if data is None: out[sel] = self.load(space, a, sub, nbytes)
      else: self.store(space, a, sub, data[sel], nbytes)
    return out

  @staticmethod
  def _check(space_array, addrs, nbytes, window, write=False):
    offs = addrs.astype(np.int64)
    bad = (addrs > np.uint64(1 << 40)) | (offs + nbytes > space_array.shape[1])
    if bad.any():
      raise MemoryFault(window + int(addrs[np.argmax(bad)]), nbytes, write,
                        f"{'local' if window == LOCAL_WINDOW else 'shared'} space of {space_array.shape[1]} bytes")
    return offs

  def _take(self, arr, rows, addrs, nbytes, window):
    offs = self._check(arr, addrs, nbytes, window)
    return arr[rows[:, None], offs[:, None] + np.arange(nbytes)]

  def _put(self, arr, rows, addrs, data, nbytes, window):
    offs = self._check(arr, addrs, nbytes, window, True)
    arr[rows[:, None], offs[:, None] + np.arange(nbytes)] = data.reshape(len(rows), nbytes)


def _compile_entry(entry: Entry):
  """Closures for every instruction of the entry (cached on it), and the label-target flags."""
  cached = getattr(entry, "_compiled", None)
  if cached is not None: return cached
  c = Compiler(entry)
  code = [c.compile(ins, entry.labels) for ins in entry.instrs]
  join = np.zeros(len(code) + 1, bool)
  for target in entry.labels.values(): join[target] = True
  cached = (code, join.tolist(), {name: container(t) for name, t in entry.regs.items()})
  entry._compiled = cached
  return cached


def compile_entry(module: PtxModule, entry: str):
  """Compile (and so check for unsupported instructions) without running."""
  return _compile_entry(module.entry(entry))


def launch(module: PtxModule, entry: str, grid, block, params, mem, max_steps: int | None = None,
           counters: KernelCounters | None = None) -> KernelCounters:
  """Run `entry` over grid x block threads. params: the parameter values in order (ints: addresses and
  integers; floats for float parameters) or their packed bytes. mem: a Memory (gather/scatter).
  Returns what the run executed (drivers/emu/counters.py), added into `counters` when one is given."""
  e = module.entry(entry)
  grid, block = _dims(grid, "grid"), _dims(block, "block")
  tpb = block[0] * block[1] * block[2]
  if tpb > 1024: raise ValueError(f"{entry}: a block has at most 1024 threads, got {block}")
  for key in ("reqntid", "maxntid"):
    want = e.directives.get(key)
    if want:
      lim = tuple(want) + (1,) * (3 - len(want))
      if (key == "reqntid" and tuple(block) != lim) or (key == "maxntid" and tpb > np.prod(lim)):
        raise ValueError(f"{entry}: block {block} violates .{key} {want}")
  code, join, regs = _compile_entry(e)
  pbytes = _param_bytes(e, params)
  nblocks = grid[0] * grid[1] * grid[2]
  per_batch = max(1, BATCH_THREADS // tpb)
  budget = [MAX_STEPS if max_steps is None else max_steps]
  counters = KernelCounters(e.name) if counters is None else counters
  system_before = mem.traffic[1]          # global bytes in system memory (memory.py), whatever the run ends with
  if counters_mod.UNIQUE: mem.sectors = []
  try:
    with np.errstate(all="ignore"):
      for first in range(0, nblocks, per_batch):
        batch = _Batch(e, first, min(per_batch, nblocks - first), grid, block, pbytes, mem, regs, counters)
        _run(batch, code, join, budget, e)
  finally:
    counters.global_system_bytes += mem.traffic[1] - system_before
    if mem.sectors is not None:
      counters.global_load_unique_bytes += counters_mod.sector_bytes(mem.sectors)
      mem.sectors = None
  return counters


def _warp_state(ctx: _Batch, code, cur: int, sub, before: int = 3, after: int = 2) -> str:
  """The first faulting warp at the fault (a fault report): the PTX around the instruction, the warp's threads that ran
  it (its mask) and the values of the registers it names for the first of them."""
  threads = np.arange(ctx.n) if sub is None else np.asarray(sub)
  warp = int(threads[0]) // 32 if len(threads) else 0
  mine = [int(t) for t in threads if int(t) // 32 == warp]
  mask = sum(1 << (t % 32) for t in mine)
  lines = [f"warp {warp} of its batch at the fault:"]
  lines += [f"  {'=>' if k == cur else '  '} line {code[k].ins.line}: {code[k].ins.text}"
            for k in range(max(0, cur - before), min(len(code), cur + after + 1))]
  lines.append(f"  active mask {mask:#010x} ({len(mine)} threads ran it)")
  shown = []
  for name in dict.fromkeys(re.findall(r"%[A-Za-z_][A-Za-z_0-9]*", code[cur].ins.text)):
    values = ctx.regs.get(name)
    if values is None or not hasattr(values, "__getitem__"): continue
    try: shown.append(f"{name} = " + ", ".join(f"thread {t}: {int(values[t]):#x}" for t in mine[:4])
                      + (" ..." if len(mine) > 4 else ""))
    except (TypeError, ValueError, IndexError): continue
  if shown: lines.append("  registers it names: " + "; ".join(shown))
  return "\n".join(lines)


def _run(ctx: _Batch, code, join, budget, entry: Entry):
  """Execute one batch: the group of threads at the lowest PC steps until it branches, exits, reaches a barrier
  or a label where other threads may wait."""
  n = ctx.n
  end = len(code)
  pc = np.zeros(n, np.int64)
  cur, idx, alone = 0, None, True     # idx None: every thread of the batch; alone: no other live thread
  steps, limit = 0, budget[0]
  regs = ctx.regs
  counts = ctx.counters.instrs          # thread-instructions per counter class

  def set_pc(value):
    if idx is None: pc[:] = value
    else: pc[idx] = value

  def regroup():
    live = pc < end
    nlive = int(np.count_nonzero(live))
    if nlive == 0: return None
    low = int(pc[live].min()) if nlive < n else int(pc.min())
    group = pc == low
    ng = int(np.count_nonzero(group))
    return low, (None if ng == n else np.flatnonzero(group)), ng == nlive

  while True:
    if cur >= end:                     # fell off the end: the threads exit
      set_pc(end)
      g = regroup()
      if g is None: break
      cur, idx, alone = g
      continue
    ins = code[cur]
    steps += 1
    if steps > limit:
      raise PtxRunaway(f"{entry.name}: more than {limit} instruction dispatches (at line {ins.ins.line}: {ins.ins.text}); "
                       f"an endless loop? raise max_steps (or PTX_MAX_STEPS) if the kernel is just long")
    ctx.steps = steps
    sub = idx
    if ins.guard is not None:
      p = regs[ins.guard[0]]
      pv = p if idx is None else p[idx]
      if ins.guard[1]: pv = ~pv
      if pv.all(): sub = idx
      elif not pv.any(): sub = False
      else: sub = np.flatnonzero(pv) if idx is None else idx[pv]
    if sub is not False: counts[ins.cls] += n if sub is None else len(sub)
    kind = ins.kind
    if kind == KIND_OP:
      if sub is not False:
        try: ins.fn(ctx, sub)
        except PtxTrap:
          n = ctx.n if sub is None else len(sub)
          trap = PtxTrap(f"kernel {entry.name}: illegal instruction `{ins.ins.text}` (line {ins.ins.line}) executed by "
                         f"{n} thread(s)")
          trap.add_note(_warp_state(ctx, code, cur, sub))
          raise trap from None
        except MemoryFault as ex:
          ex.add_note(f"line {ins.ins.line}: {ins.ins.text}")
          ex.add_note(_warp_state(ctx, code, cur, sub))
          raise
        except (PtxError, PtxUnsupported, PtxWarpError): raise
        except Exception as ex:
          raise RuntimeError(f"{entry.name}: line {ins.ins.line}: {ins.ins.text}: {type(ex).__name__}: {ex}") from ex
      cur += 1
      if not alone and join[cur]:
        set_pc(cur)
        cur, idx, alone = regroup()
      continue
    if kind == KIND_BRA:
      if sub is idx:                   # every thread of the group branches
        cur = ins.target
        if alone: continue
        set_pc(cur)
      elif sub is False:
        cur += 1
        if alone: continue
        set_pc(cur)
      else:
        set_pc(cur + 1)
        pc[sub] = ins.target
      cur, idx, alone = regroup()
      continue
    if kind == KIND_EXIT:
      if sub is False:
        cur += 1
        if alone: continue
        set_pc(cur)
      elif sub is idx: set_pc(end)
      else:
        set_pc(cur + 1)
        pc[sub] = end
      g = regroup()
      if g is None: break
      cur, idx, alone = g
      continue
    # KIND_BAR: threads of a block below this PC do not exist (the group is at the lowest PC), so the block
    # has arrived; re-group so threads that waited here join
    cur += 1
    if not alone:
      set_pc(cur)
      cur, idx, alone = regroup()
  budget[0] = limit - steps
