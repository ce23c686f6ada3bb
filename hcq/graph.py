"""GraphExecutor: a captured list of ExecItems turned into prebuilt, bound queues.

Built once: intermediates get offsets in one arena (TLSF plan over their lifetimes), every kernel's arguments
are written into kernarg memory the graph owns, and the commands are bound into device memory. A replay
patches only the kernarg words of inputs, outputs and variables, and the queue's slot words (timeline value,
copy addresses), then submits one indirect command. Device specific: only the queue encoding (the driver)."""
from __future__ import annotations
import numpy as np
from .buffer import Buffer
from .exec_item import grid_value
from .device import Device
from .queue import HWQueue, Slot
from .signal import Signal
from .tlsf import plan_arena
from . import hooks
from baregrad.drivers import settings
if settings.CAPTURE or settings.PROFILE: from . import trace   # noqa: F401  installs their hooks (hcq/hooks.py)

DEBUG = settings.DEBUG


def launch_slots(it, grids: dict) -> tuple:
  """An item's launch dimensions in a prebuilt queue: a symbolic one (compiler/codegen.py symbolic_grid) is a slot the
  replay fills in from the Variables' values (grid_values), so the queue launches what this replay needs (the driver
  patches it). `grids`: (expression, largest) -> slot name, shared by the graph's kernels (a model's layers share a
  few)."""
  grid = it.meta.get("grid")
  if grid is None: return tuple(it.meta.get("global_size", (1, 1, 1)))
  dims = []
  for g, most in zip(grid, it.meta["global_size"]):
    if isinstance(g, int): dims.append(g); continue
    dims.append(Slot(grids.setdefault((g, most), f"grid:{len(grids)}")))
  return tuple(dims)


def grid_values(grids: dict, var_vals: dict) -> dict:
  """The values of launch_slots' slots for these Variables' values."""
  return {name: grid_value(g, most, var_vals) for (g, most), name in grids.items()}


class RAW_BYTES:
  """Element type of untyped memory (the arena)."""
  name, itemsize = "bytes", 1


def buffer_roles(items: list, inputs: list[Buffer], outputs: list[Buffer], capture_serial: int, pinned=frozenset()):
  """(role, first, last, intermediates) of a captured graph's buffers: role maps an input to ("in", i) and an output
  to ("out", j); first/last: the index of the first and last item using each other buffer; the intermediates are those
  made during the capture (serial) and first written by a captured item (what an arena may hold), but for `pinned`
  ones (which keep their own memory: another part of a segmented graph uses them, hcq/segmented.py)."""
  role: dict[Buffer, tuple] = {}
  for i, b in enumerate(inputs): role.setdefault(b, ("in", i))
  for j, b in enumerate(outputs): role.setdefault(b, ("out", j))
  first, last, written_first = {}, {}, {}
  for k, it in enumerate(items):
    for n, b in enumerate(it.bufs):
      if b in role: continue
      first.setdefault(b, k); last[b] = k
      written_first.setdefault(b, n == 0)
  inter = [b for b in first if written_first[b] and b.serial > capture_serial and b.base is None and b not in pinned]
  return role, first, last, inter


class GraphExecutor:
  def __init__(self, items: list, inputs: list[Buffer], outputs: list[Buffer], capture_serial: int, pinned=frozenset()):
    devices = {b.device for it in items for b in it.bufs}
    if len(devices) != 1: raise NotImplementedError(f"a captured graph must use one device, got {sorted(devices)}")
    self.dev = Device.get(devices.pop())
    self.items = items
    role, first, last, inter = buffer_roles(items, inputs, outputs, capture_serial, pinned)
    offsets, arena_size = plan_arena([(first[b], last[b], b.nbytes) for b in inter])
    self.arena = Buffer(self.dev.name, max(arena_size, 1), RAW_BYTES).ensure_allocated() if inter else None
    self.arena_bytes, self.unplanned_bytes = arena_size, sum(b.nbytes for b in inter)
    for b, off in zip(inter, offsets): role[b] = ("arena", off)
    if DEBUG >= 2:
      print(f"jit graph: {len(items)} items, arena {arena_size} bytes for {len(inter)} intermediates "
            f"({self.unplanned_bytes} bytes unplanned, {100 * (1 - arena_size / max(self.unplanned_bytes, 1)):.0f}% saved)")
    self.out_specs = [(b.size, b.dtype) if role[b][0] == "out" else role[b] for b in outputs]
    self.out_fixed = {j: b for j, b in enumerate(outputs) if role[b][0] not in ("out",) and role[b][0] != "in"}
    self.out_from_input = {j: role[b][1] for j, b in enumerate(outputs) if role[b][0] == "in"}
    # the argument slots' names, made once (a replay fills them by position)
    self.slot_names = ([f"in{i}" for i in range(len(inputs))], [f"out{j}" for j in range(len(outputs))])

    def addr(b: Buffer):
      r = role.get(b)
      if r is None: return b.ensure_allocated().addr           # weights and other buffers from before the capture
      if r[0] == "arena": return self.arena.addr + r[1]
      return Slot(f"{r[0]}{r[1]}")
    # kernel arguments: one region for the whole graph
    arg_lists = []
    for it in items:
      if it.program is None: arg_lists.append(None); continue
      arg_lists.append([addr(b) for b in it.bufs] + [Slot(f"var:{v}") for v in it.program.variables])
    nwords = sum(len(a) for a in arg_lists if a is not None)
    self.kernargs = self.dev.driver.alloc_args(8 * max(nwords, 1))
    self.kv = np.frombuffer(self.dev.driver.view(self.kernargs.addr, 8 * max(nwords, 1)), dtype=np.uint64)
    self.patch_pos, self.patch_slots = [], []
    self.grids: dict[tuple, str] = {}    # (expression, largest) of a symbolic launch dimension -> its slot's name
    # copies get their own queue where the driver has one; queues order themselves with per-queue signals
    kinds = ["compute", "copy"] if self.dev.driver.has_copy_queue else ["compute"]
    queues = {k: HWQueue(k) for k in kinds}
    for k in kinds[1:]: queues[k].wait(self.dev.timeline, Slot("__prev"))   # after the work submitted before a replay
    self.queue_signals = {k: Signal(self.dev, f"graph {k}") for k in kinds}
    seq = {k: 0 for k in kinds}
    writer: dict = {}          # buffer -> (queue, seq) of its last writer
    readers: dict = {}         # buffer -> [(queue, seq)] since that write
    q = queues["compute"]
    pos = 0
    for it, args in zip(items, arg_lists):
      kind = "copy" if args is None and "copy" in queues else "compute"
      q = queues[kind]
      deps: dict[str, int] = {}
      for n, b in enumerate(it.bufs):
        found = [writer[b]] if b in writer else []
        if n == 0: found += readers.get(b, [])     # bufs[0] is written: wait for earlier readers too
        for dq, dseq in found:
          if dq != kind: deps[dq] = max(deps.get(dq, 0), dseq)
      for dq, dseq in deps.items(): q.wait(self.queue_signals[dq], Slot(f"__base:{dq}") + dseq)
      if args is None:
        dst, src = it.bufs
        q.copy(addr(dst), addr(src), dst.nbytes)
      else:
        for w in args:
          if isinstance(w, Slot): self.patch_pos.append(pos); self.patch_slots.append(w.name)
          else: self.kv[pos] = w
          pos += 1
        q.exec(it.program, self.kernargs.addr + 8 * (pos - len(args)), launch_slots(it, self.grids))
      seq[kind] += 1
      if len(queues) > 1: q.signal(self.queue_signals[kind], Slot(f"__base:{kind}") + seq[kind])
      for n, b in enumerate(it.bufs):
        if n == 0: writer[b], readers[b] = (kind, seq[kind]), []
        else: readers.setdefault(b, []).append((kind, seq[kind]))
    self.seq = seq
    self.bases = {k: 0 for k in kinds}
    main = queues["compute"]
    for k in kinds[1:]:
      if seq[k]: main.wait(self.queue_signals[k], Slot(f"__base:{k}") + seq[k])
    self.capture_role: dict = {}     # the buffers' roles, kept by a CAPTURE hook for its records
    if hooks.active: hooks.installed.on_graph_build(self, main, role)   # CAPTURE/PROFILE (hcq/trace.py)
    main.signal(self.dev.timeline, Slot("__timeline"))
    self.side_queues = [queues[k].bind(self.dev) for k in kinds[1:] if seq[k]]
    self.queue = main.bind(self.dev)
    self.patch_list = self.patch_pos
    self.patch_pos = np.array(self.patch_pos, dtype=np.int64)
    self.base_names = {k: f"__base:{k}" for k in kinds}
    self.last_value = 0

  def replay(self, inputs: list[Buffer], var_vals: dict[str, int]) -> list[Buffer]:
    with Device.lock: return self._replay(inputs, var_vals)

  def _replay(self, inputs: list[Buffer], var_vals: dict[str, int]) -> list[Buffer]:
    dev = self.dev
    if self.last_value: dev.timeline.wait(self.last_value)   # the previous replay still reads the kernargs/arena
    outs = []
    for j, spec in enumerate(self.out_specs):
      if j in self.out_from_input: outs.append(inputs[self.out_from_input[j]])
      elif j in self.out_fixed: outs.append(self.out_fixed[j])
      else: outs.append(Buffer(dev.name, spec[0], spec[1]).ensure_allocated())
    in_names, out_names = self.slot_names
    vals = dict(zip(in_names, [b.addr for b in inputs]))
    vals.update(zip(out_names, [b.addr for b in outs]))
    if var_vals: vals.update((f"var:{k}", v) for k, v in var_vals.items())
    if self.grids: vals.update(grid_values(self.grids, var_vals))
    if len(self.patch_pos):
      patch = [vals[s] for s in self.patch_slots]
      if len(patch) <= 8:       # (a few words: item by item costs less than building an array for a gather)
        kv = self.kv
        for i, v in zip(self.patch_list, patch): kv[i] = v
      else: self.kv[self.patch_pos] = np.array(patch, dtype=np.uint64)
    if dev.must_order("compute"):   # other devices' copies on this device's memory (hcq/transfer.py) come first
      dev.submit(dev.queue("compute"))
    vals["__prev"] = dev.timeline_value
    vals["__timeline"] = self.last_value = dev.next_timeline()
    for k, base in self.bases.items():
      vals[self.base_names[k]] = base
      self.bases[k] = base + self.seq[k]
    if hooks.active: hooks.installed.on_graph_replay(self, inputs, outs, var_vals, self.last_value)   # CAPTURE/PROFILE
    for side in self.side_queues: side.submit(dev, vals)
    self.queue.submit(dev, vals)
    dev.last_kind = "compute"
    return outs
