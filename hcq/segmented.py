"""A captured graph with host steps in it: device work replayed from prebuilt queues, host work run between them.

Some work of a jitted function is not device work: a collective across processes (tensor/distributed.py) hands a
buffer to MPI on the host and writes the result into another buffer. While the JIT captures, such work appends a
`HostStep` to the captured items (runtime.capturing) at the point it ran. A captured list with host steps becomes a
`SegmentedGraph`: the device items between two host steps are one part, built as a GraphExecutor (or, spanning
several devices, a MultiGraphExecutor) like any captured graph; a replay runs the parts in order, each host step
after the device work before it is submitted (the step synchronizes the devices it reads, as its own code does).

Buffers that more than one part uses (a gradient made by the backward part, reduced by the host step, read by the
optimizer part) keep their own memory for the graph's life (`pinned`: no arena slot), so every part sees them at
the address it was built with. The function's outputs come from the part that wrote them, fresh per replay; an
output that a host step wrote, or that several parts use, is copied into a fresh buffer at the end of the replay,
so a result handed out by one replay never changes under the caller in the next."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Callable
import numpy as np
from .buffer import Buffer
from .device import Device
from .graph import GraphExecutor
from .multigraph import MultiGraphExecutor


@dataclass(eq=False)
class HostStep:
  """Host work inside a captured function: `run(bufs)` with the replay's buffers in the order of `bufs` (the captured
  buffers; a jitted function's inputs are replaced by the ones of the call). `writes`: the buffers it writes."""
  name: str
  run: Callable[[list], None]
  bufs: list
  writes: list = field(default_factory=list)
  program = None                       # (not a kernel: the executors never see a HostStep)


class SegmentedGraph:
  def __init__(self, items: list, inputs: list[Buffer], outputs: list[Buffer], capture_serial: int):
    parts, cur = [], []
    for it in items:
      if isinstance(it, HostStep):
        if cur: parts.append(cur); cur = []
        parts.append(it)
      else: cur.append(it)
    if cur: parts.append(cur)
    users: dict[Buffer, set] = {}
    for i, p in enumerate(parts):
      for b in (p.bufs if isinstance(p, HostStep) else [b for it in p for b in it.bufs]): users.setdefault(b, set()).add(i)
    host_written = {b for p in parts if isinstance(p, HostStep) for b in p.writes}
    pinned = frozenset(b for b, ps in users.items() if len(ps) > 1) | host_written
    self.inputs = list(inputs)
    in_index = {b: i for i, b in enumerate(inputs)}
    self.plan = []                     # ("graph", executor, its outputs) | ("host", HostStep)
    self.out_plan = []                 # per output: ("input", i) | ("part", buffer) | ("copy", buffer)
    produced = {}
    for i, p in enumerate(parts):
      if isinstance(p, HostStep): self.plan.append(("host", p)); continue
      bufs = {b for it in p for b in it.bufs}
      mine = list(dict.fromkeys(b for b in outputs if b in bufs and b not in pinned and b not in in_index))
      several = len({b.device for it in p for b in it.bufs}) > 1
      ex = (MultiGraphExecutor if several else GraphExecutor)(p, inputs, mine, capture_serial, pinned)
      self.plan.append(("graph", ex, mine))
      for b in mine: produced[b] = i
    for b in outputs:
      if b in in_index: self.out_plan.append(("input", in_index[b]))
      elif b in produced: self.out_plan.append(("part", b))
      else: self.out_plan.append(("copy", b))
    self.copied_outputs = {j for j, (kind, _) in enumerate(self.out_plan) if kind == "copy"}
    self.devices = list(dict.fromkeys(d for step in self.plan if step[0] == "graph" for d in _devices(step[1])))
    self.host_steps = sum(step[0] == "host" for step in self.plan)

  def replay(self, inputs: list[Buffer], var_vals: dict[str, int]) -> list[Buffer]:
    with Device.lock:
      actual = dict(zip(self.inputs, inputs))
      got: dict[Buffer, Buffer] = {}
      for step in self.plan:
        if step[0] == "host":
          step[1].run([actual.get(b, b) for b in step[1].bufs])
          continue
        _, ex, mine = step
        got.update(zip(mine, ex.replay(inputs, var_vals)))
      outs = []
      for kind, x in self.out_plan:
        if kind == "input": outs.append(inputs[x])
        elif kind == "part": outs.append(got[x])
        else: outs.append(copy_buffer(x))
      return outs


def _devices(ex) -> list:
  return ex.devices if isinstance(ex, MultiGraphExecutor) else [ex.dev]


def copy_buffer(b: Buffer) -> Buffer:
  """A fresh buffer with `b`'s bytes (through the host: only outputs a host step wrote take this path)."""
  tmp = np.empty(b.nbytes, np.uint8)
  if b.nbytes: b.copyout(memoryview(tmp))
  out = Buffer(b.device, b.size, b.dtype).ensure_allocated()
  if b.nbytes: out.copyin(memoryview(tmp))
  return out
