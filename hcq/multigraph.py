"""MultiGraphExecutor: a captured list of ExecItems over several devices turned into prebuilt, bound queues.

What GraphExecutor (hcq/graph.py) does for one device, for several: every device gets an arena for the
intermediates made on it, kernel arguments in memory the graph owns, and bound queues; a copy between devices runs
where hcq/transfer.py's link for that pair says (a peer engine's queue, or the host relay). The queues -- agents,
one per device and kind, plus the relay -- order themselves with signals only:

  * every agent counts the items it ran (seq) and after each one writes that count (plus a per-replay base) into
    its mailboxes: one signal per reader that waits on it -- its own device's other queue (a signal of its device),
    another device's queue (a signal in memory both map, as the peer link's), or the host relay (its own signal);
  * an item waits for the last writer of each buffer it reads and, for the buffer it writes, for the readers since
    (read-after-write and write-after-read, also across devices and through arena memory planned for reuse);
  * each device's compute queue ends the replay: it waits for every agent that touched the device's memory, then
    signals the device's timeline, so `synchronize()` and later eager work see the whole replay.

A replay patches input/output addresses, variables, symbolic launch dimensions and the signal values, submits every
bound queue and queues the relay's copies: the host waits for nothing but the previous replay of the same graph
(its arenas are reused).
CAPTURE= and PROFILE= (hcq/hooks.py) do not see these replays yet: they record one-device graphs only.
"""
from __future__ import annotations
import numpy as np
from .buffer import Buffer
from .device import Device
from .queue import HWQueue, Slot, resolve
from .signal import Signal
from .tlsf import plan_arena
from .graph import RAW_BYTES, buffer_roles, launch_slots, grid_values
from . import transfer


class _Agent:
  """A queue of one kind on one device, or the host relay of one device pair (dev None)."""
  def __init__(self, key, dev: Device | None, kind: str):
    self.key, self.dev, self.kind = key, dev, kind
    self.q = HWQueue(kind) if dev is not None else None
    self.pair = None               # relay: (source device, destination device)
    self.seq = 0
    self.mailboxes: dict = {}      # reader (a Device or "host") -> Signal this agent writes its seq into
    self.bound = None

  @property
  def base(self) -> str: return f"__base:{self.key}"


class MultiGraphExecutor:
  def __init__(self, items: list, inputs: list[Buffer], outputs: list[Buffer], capture_serial: int, pinned=frozenset()):
    items = [it for it in items if it.program is not None or it.bufs[0].nbytes]    # (copies of empty shards)
    self.items = items
    names = list(dict.fromkeys(b.device for it in items for b in it.bufs))
    self.devices = [Device.get(n) for n in names]
    self.dev = self.devices[0]
    role, first, last, inter = buffer_roles(items, inputs, outputs, capture_serial, pinned)   # one arena per device
    self.arenas: dict[str, Buffer] = {}
    overlaps: dict[Buffer, list] = {}          # an intermediate -> earlier ones sharing its arena bytes
    for dev in self.devices:
      mine = [b for b in inter if b.device == dev.name]
      if not mine: continue
      offsets, size = plan_arena([(first[b], last[b], b.nbytes) for b in mine])
      self.arenas[dev.name] = Buffer(dev.name, max(size, 1), RAW_BYTES).ensure_allocated()
      for b, off in zip(mine, offsets): role[b] = ("arena", dev.name, off)
      for b, off in zip(mine, offsets):
        overlaps[b] = [c for c, o in zip(mine, offsets) if c is not b and first[c] < first[b]
                       and o < off + b.nbytes and off < o + c.nbytes]
    self.out_specs = [(b.size, b.dtype, b.device) if role[b][0] == "out" else None for b in outputs]
    self.out_fixed = {j: b for j, b in enumerate(outputs) if role[b][0] not in ("out", "in")}
    self.out_from_input = {j: role[b][1] for j, b in enumerate(outputs) if role[b][0] == "in"}
    self.role = role
    self.grids: dict[tuple, str] = {}    # symbolic launch dimensions -> their slots (graph.launch_slots)

    def addr(b: Buffer):
      r = role.get(b)
      if r is None: return b.ensure_allocated().addr            # weights and other buffers from before the capture
      if r[0] == "arena": return self.arenas[r[1]].addr + r[2]
      return Slot(f"{r[0]}{r[1]}")
    self.addr = addr

    # ---- agents: which queue (or the relay) runs each item ----
    agents: dict = {}
    def agent(dev: Device | None, kind: str, key=None) -> _Agent:
      key = key or f"{dev.name}/{kind}"
      if key not in agents: agents[key] = _Agent(key, dev, kind)
      return agents[key]
    for dev in self.devices: agent(dev, "compute")             # every device ends the replay on its compute queue
    placed = []
    self.peer_links = []
    for it in items:
      if it.program is not None:
        placed.append(agent(Device.get(it.bufs[0].device), "compute")); continue
      dst, src = (Device.get(b.device) for b in it.bufs)
      if dst is src:
        placed.append(agent(dst, "copy" if dst.driver.has_copy_queue else "compute")); continue
      link = transfer.link(src, dst)
      if link.path == "peer":
        self.peer_links.append((link, it))
        placed.append(agent(link.engine, link.kind))
      else:
        placed.append(agent(None, "relay", f"relay {src.name}->{dst.name}"))
        placed[-1].pair = (src, dst)

    def mailbox(x: _Agent, reader) -> Signal:
      """The signal agent x writes its count into for `reader` (a Device, or "host" for the relay)."""
      if reader not in x.mailboxes:
        if x.dev is None:         # the relay writes it: in the reader's memory (for another relay: the destination's)
          x.mailboxes[reader] = Signal(x.pair[1] if reader == "host" else reader, f"graph {x.key}")
        elif reader == "host" or reader is x.dev: x.mailboxes[reader] = Signal(x.dev, f"graph {x.key}")
        else: x.mailboxes[reader] = _shared_signal(x.dev, reader, f"graph {x.key} -> {reader.name}")
      return x.mailboxes[reader]

    # ---- pass 1: dependencies (agent, seq) per item ----
    writer: dict = {}          # buffer -> (agent, seq) of its last writer
    readers: dict = {}         # buffer -> [(agent, seq)] since that write
    touched: dict = {d.name: set() for d in self.devices}     # device -> agents that used its memory
    plans = []
    for it, ag in zip(items, placed):
      deps: dict[str, tuple] = {}
      for n, b in enumerate(it.bufs):
        found = [writer[b]] if b in writer else []
        if n == 0:
          found += readers.get(b, [])
          if b not in writer:            # its first write: after everything on arena bytes it reuses
            for c in overlaps.get(b, ()):
              found += ([writer[c]] if c in writer else []) + readers.get(c, [])
        for dag, dseq in found:
          if dag is not ag and dseq > deps.get(dag.key, (None, 0))[1]: deps[dag.key] = (dag, dseq)
      ag.seq += 1
      plans.append((it, ag, list(deps.values()), ag.seq))
      for n, b in enumerate(it.bufs):
        if n == 0: writer[b], readers[b] = (ag, ag.seq), []
        else: readers.setdefault(b, []).append((ag, ag.seq))
        touched[b.device].add(ag)
    self.seq = {ag.key: ag.seq for ag in agents.values()}

    # ---- pass 2: the commands ----
    kv_words: dict[str, list] = {d.name: [] for d in self.devices}
    for ag in agents.values():
      if ag.dev is not None: ag.q.wait(ag.dev.timeline, Slot(f"__prev:{ag.dev.name}"))   # after earlier eager work
    waits_of = []
    self.relay_jobs = []
    for it, ag, deps, seq in plans:
      reader = "host" if ag.dev is None else ag.dev
      waits_of.append([(mailbox(dag, reader), Slot(dag.base) + dseq) for dag, dseq in deps])
    for (it, ag, deps, seq), waits in zip(plans, waits_of):
      if ag.dev is None:
        dst, src = it.bufs
        before = [(d.timeline, Slot(f"__prev:{d.name}")) for d in (Device.get(src.device), Device.get(dst.device))]
        self.relay_jobs.append((ag, before + waits, addr(dst), addr(src), dst.nbytes, seq))     # in item order
        continue
      for sig, value in waits: ag.q.wait(sig, value)
      if it.program is None:
        dst, src = it.bufs
        ag.q.copy(addr(dst), addr(src), dst.nbytes)
      else:
        words = kv_words[ag.dev.name]
        start = len(words)
        for b in it.bufs: words.append(addr(b))
        for v in it.program.variables: words.append(Slot(f"var:{v}"))
        ag.q.exec(it.program, ("kernargs", ag.dev.name, start), launch_slots(it, self.grids))
      ag.q.cmds.append(("__mailboxes", seq))       # replaced below, once every reader of this agent is known
    # the end of a replay: each device's compute queue waits for the agents that touched its memory
    for dev in self.devices:
      main = agents[f"{dev.name}/compute"]
      for other in touched[dev.name]:
        if other is not main and other.seq: main.q.wait(mailbox(other, dev), Slot(other.base) + other.seq)
      main.q.signal(dev.timeline, Slot(f"__timeline:{dev.name}"))
    # mailbox writes after every item (now that all readers are known), kernel arguments in memory of the graph
    self.kernargs = {}
    for dev in self.devices:
      words = kv_words[dev.name]
      mem = dev.driver.alloc_args(8 * max(len(words), 1))
      kv = np.frombuffer(dev.driver.view(mem.addr, 8 * max(len(words), 1)), dtype=np.uint64)
      pos, names = [], []
      for i, w in enumerate(words):
        if isinstance(w, Slot): pos.append(i); names.append(w.name)
        else: kv[i] = w
      self.kernargs[dev.name] = (mem, kv, np.array(pos, dtype=np.int64), names)
    for ag in agents.values():
      if ag.dev is None: continue
      cmds = []
      for c in ag.q.cmds:
        if c[0] == "__mailboxes":
          cmds += [("signal", box, Slot(ag.base) + c[1]) for box in ag.mailboxes.values()]
        elif c[0] == "exec" and isinstance(c[2], tuple):
          _, dname, start = c[2]
          cmds.append(c[:2] + (self.kernargs[dname][0].addr + 8 * start,) + c[3:])
        else: cmds.append(c)
      ag.q.cmds = cmds
    # peer copies of fixed buffers and the arenas: mapped for their engines now (inputs/outputs at each replay)
    for link, it in self.peer_links:
      for b in it.bufs:
        r = role.get(b, ("fixed",))
        if r[0] == "arena": link.map(self.arenas[r[1]])
        elif r[0] == "fixed": link.map(b)
    self.agents = agents
    for ag in agents.values():
      if ag.dev is not None and ag.key != f"{ag.dev.name}/compute": ag.bound = ag.q.bind(ag.dev)
    for dev in self.devices: agents[f"{dev.name}/compute"].bound = agents[f"{dev.name}/compute"].q.bind(dev)
    self.bases = {k: 0 for k in agents}
    self.last_values: dict[str, int] = {}

  def replay(self, inputs: list[Buffer], var_vals: dict[str, int]) -> list[Buffer]:
    with Device.lock: return self._replay(inputs, var_vals)

  def _replay(self, inputs: list[Buffer], var_vals: dict[str, int]) -> list[Buffer]:
    for dev in self.devices:       # the previous replay still uses the kernel arguments and arenas
      if dev.name in self.last_values: dev.timeline.wait(self.last_values[dev.name])
    outs = []
    for j, spec in enumerate(self.out_specs):
      if j in self.out_from_input: outs.append(inputs[self.out_from_input[j]])
      elif j in self.out_fixed: outs.append(self.out_fixed[j])
      else: outs.append(Buffer(spec[2], spec[0], spec[1]).ensure_allocated())
    vals = {f"in{i}": b.addr for i, b in enumerate(inputs)}
    vals.update((f"out{j}", b.addr) for j, b in enumerate(outs))
    vals.update((f"var:{k}", v) for k, v in var_vals.items())
    vals.update(grid_values(self.grids, var_vals))
    for link, it in self.peer_links:      # inputs and outputs a peer engine copies: mapped for it
      for b in it.bufs:
        if self.role.get(b, ("fixed",))[0] in ("in", "out"): link.map(self._actual(b, inputs, outs))
    for mem, kv, pos, names in self.kernargs.values():
      if len(pos): kv[pos] = np.array([vals[n] for n in names], dtype=np.uint64)
    for dev in self.devices:       # eager work left for this device (other devices' copies on its memory) first
      q = dev.queue("compute")
      if q.cmds: dev.submit(q)
      vals[f"__prev:{dev.name}"] = dev.timeline_value
      vals[f"__timeline:{dev.name}"] = self.last_values[dev.name] = dev.next_timeline()
    for key, base in self.bases.items():
      vals[f"__base:{key}"] = base
      self.bases[key] = base + self.seq[key]
    for ag, waits, dst, src, nbytes, seq in self.relay_jobs:     # one thread runs them in this (the items') order
      transfer.relay().put(transfer.RelayJob([(s, resolve(v, vals)) for s, v in waits], resolve(dst, vals),
                                             resolve(src, vals), nbytes,
                                             [(box, resolve(Slot(ag.base) + seq, vals)) for box in ag.mailboxes.values()],
                                             f"graph {ag.key} copy of {nbytes} bytes"))
    for ag in self.agents.values():
      if ag.dev is not None and ag.key != f"{ag.dev.name}/compute": ag.bound.submit(ag.dev, vals)
    for dev in self.devices:
      self.agents[f"{dev.name}/compute"].bound.submit(dev, vals)
      dev.last_kind = "compute"
    return outs

  def _actual(self, b: Buffer, inputs, outs) -> Buffer:
    r = self.role.get(b)
    if r is None or r[0] == "arena": return b
    return inputs[r[1]] if r[0] == "in" else outs[r[1]]


def _shared_signal(writer: Device, reader: Device, name: str) -> Signal:
  """A signal both devices' queues address: in the reader's memory mapped by the writer, else the other way."""
  for owner, other in ((reader, writer), (writer, reader)):
    try: return Signal(owner, name, shared_with=(other,))
    except (NotImplementedError, OSError): continue
  raise RuntimeError(f"a captured graph orders {writer.name}'s queue before {reader.name}'s, but neither device can "
                     f"map the other's memory for a signal between them")
