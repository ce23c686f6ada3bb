"""Runtime hooks for the tools, and the Chrome/Perfetto trace format they write.

    CAPTURE=run.bgq   record every queue submission of ExecItems into a replayable file (hcq/capture.py)
    PROFILE=out.json  time every ExecItem with queue timestamps; write a Chrome trace at exit (Profiler below)

When CAPTURE or PROFILE is set, importing this module installs the `on_*` functions below as the runtime's hooks
(hcq/hooks.py: the runtime's hot paths test one flag there); hcq/runtime.py and hcq/graph.py import it then. The
compiler tests `VIZ`. Nothing else runs when they are unset (and this module is not imported).
"""
from __future__ import annotations
import atexit, json, os, sys, time
from . import capture, hooks, transfer
from .device import Device, device_ns   # device_ns: imported from here too (tools)
from .exec_item import enqueue
from .signal import Signal
from baregrad.drivers import settings

CAPTURE = settings.CAPTURE
PROFILE = settings.PROFILE
VIZ = settings.VIZ
active = bool(CAPTURE or PROFILE)
profiler = None     # Profiler, made on first use (the capture's Recorder is capture.recorder)


# ---- the Chrome trace event format (the JSON Perfetto and chrome://tracing load) ----

class TraceBuilder:
  """Collects complete events (`ph: "X"`) on named tracks; `pid` is a process (a device, or "host"), `tid` a
  thread inside it (a queue). Times are integer nanoseconds on one clock until `to_json`, which writes µs."""

  def __init__(self):
    self.events: list[dict] = []
    self.tracks: dict[tuple[str, str], tuple[int, int]] = {}
    self.processes: dict[str, int] = {}

  def track(self, process: str, thread: str) -> tuple[int, int]:
    key = (process, thread)
    if key not in self.tracks:
      pid = self.processes.setdefault(process, len(self.processes) + 1)
      self.tracks[key] = (pid, sum(1 for p, _ in self.tracks if p == process) + 1)
    return self.tracks[key]

  def complete(self, track: tuple[int, int], name: str, start_ns: int, end_ns: int, cat: str, args: dict | None = None):
    self.events.append({"name": name, "cat": cat, "ph": "X", "start_ns": int(start_ns), "dur_ns": max(0, int(end_ns - start_ns)),
                        "pid": track[0], "tid": track[1], "args": args or {}})

  def to_json(self, metadata: dict | None = None) -> dict:
    origin = min((e["start_ns"] for e in self.events), default=0)
    out = []
    for name, pid in self.processes.items():
      out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
    for (process, thread), (pid, tid) in self.tracks.items():
      out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
    for e in sorted(self.events, key=lambda e: (e["start_ns"], e["pid"], e["tid"])):
      out.append({"name": e["name"], "cat": e["cat"], "ph": "X", "ts": (e["start_ns"] - origin) / 1000,
                  "dur": e["dur_ns"] / 1000, "pid": e["pid"], "tid": e["tid"], "args": e["args"]})
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": dict(metadata or {}, clock_origin_ns=origin)}

  def write(self, path: str, metadata: dict | None = None):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f: json.dump(self.to_json(metadata), f)
    os.replace(tmp, path)


def clock_offset(dev) -> int:
  """Nanoseconds to subtract from `dev`'s queue timestamps to get host `time.monotonic_ns()`. A timestamp the
  device writes between two host readings is taken as the same clock (0, e.g. the CPU device); otherwise the
  offset from the midpoint of the round trip."""
  s = Signal(dev, "clock")
  h0 = time.monotonic_ns()
  value = dev.next_timeline()
  dev.compute_queue().timestamp(s).signal(dev.timeline, value).submit(dev)
  dev.timeline.wait(value)
  h1 = time.monotonic_ns()
  ts = device_ns(dev, s.timestamp)
  return 0 if h0 <= ts <= h1 else ts - (h0 + h1) // 2


def item_args(item) -> dict:
  meta = item.meta or {}
  args = {k: meta[k] for k in ("flops", "bytes") if k in meta}
  if item.program is None: args["nbytes"] = item.bufs[0].nbytes
  return args


class Profiler:
  """PROFILE=out.json: every ExecItem gets a queue timestamp before and after it (eager and JIT replays); the
  timestamps are read once the timeline passes the submission, and written as a Chrome trace at exit."""

  def __init__(self, path: str):
    self.path = path
    self.trace = TraceBuilder()
    self.pending: list[tuple] = []       # (device, timeline value, [(name, cat, args, start signal, end signal)])
    self.graphs: dict[int, tuple] = {}   # id(graph) -> (graph, records) for graphs built while profiling
    self.graph_pending: dict[int, tuple] = {}
    self.offsets: dict[str, int] = {}
    self.devices: dict[str, object] = {}
    self.count = 0
    atexit.register(self.write)

  def _device(self, dev):
    if dev.name not in self.offsets:
      self.devices[dev.name] = dev
      self.offsets[dev.name] = clock_offset(dev)

  def run(self, items: list, sync: bool):
    """The profiled version of hcq.runtime.run_schedule."""
    by_dev: dict[str, tuple] = {}
    def flush():
      for dev, q, recs in by_dev.values():
        value = dev.submit(q)
        self.pending.append((dev, value, recs, "compute"))
        if sync: dev.synchronize()
      by_dev.clear()
    for item in items:
      for b in item.bufs: b.ensure_allocated()
      if item.program is None and item.bufs[0].device != item.bufs[1].device:
        flush()
        transfer.copy(*item.bufs)      # between devices: on the path hcq/transfer.py chooses (not timed here)
        continue
      dev = Device.get(item.bufs[0].device)
      self._device(dev)
      if dev.name not in by_dev: by_dev[dev.name] = (dev, dev.queue("compute"), [])
      _, q, recs = by_dev[dev.name]
      t0, t1 = Signal(dev, "profile"), Signal(dev, "profile")
      q.timestamp(t0)
      enqueue(dev, q, item)
      q.timestamp(t1)
      recs.append((item.name, "kernel" if item.program is not None else "copy", item_args(item), t0, t1))
    flush()
    self.harvest()

  def graph_built(self, graph, queue):
    """Put a timestamp before and after each command of a JIT graph's queue (before it is bound)."""
    self._device(graph.dev)
    cmds, recs, items = [], [], iter(graph.items)
    for cmd in queue.cmds:
      if cmd[0] not in ("exec", "copy"): cmds.append(cmd); continue
      item = next(items)
      t0, t1 = Signal(graph.dev, "profile"), Signal(graph.dev, "profile")
      cmds += [("timestamp", t0), cmd, ("timestamp", t1)]
      recs.append((item.name, "kernel" if cmd[0] == "exec" else "copy", dict(item_args(item), jit=True), t0, t1))
    queue.cmds = cmds
    self.graphs[id(graph)] = (graph, recs)

  def graph_replay(self, graph, value: int):
    """Called before a graph's queue is submitted again: the previous replay is done (the graph waited for it),
    so its timestamps are read now, before this submission overwrites them."""
    entry = self.graphs.get(id(graph))
    if entry is None: return
    prev = self.graph_pending.pop(id(graph), None)
    if prev is not None: self._events(graph.dev, prev[1], "compute")
    self.graph_pending[id(graph)] = (value, entry[1])

  def host_wait(self, dev, start_ns: int, end_ns: int, value: int):
    track = self.trace.track("host", "python")
    self.trace.complete(track, f"wait {dev.name} timeline >= {value}", start_ns, end_ns, "wait", {"device": dev.name, "value": value})

  def harvest(self):
    """Turn finished submissions into events."""
    keep = []
    for dev, value, recs, queue in self.pending:
      if dev.timeline.value >= value: self._events(dev, recs, queue)
      else: keep.append((dev, value, recs, queue))
    self.pending = keep
    for gid, (value, recs) in list(self.graph_pending.items()):
      graph = self.graphs[gid][0]
      if graph.dev.timeline.value >= value:
        self._events(graph.dev, recs, "compute")
        del self.graph_pending[gid]

  def _events(self, dev, recs, queue):
    offset = self.offsets.get(dev.name, 0)
    track = self.trace.track(dev.name, f"{queue} queue")
    for name, cat, args, t0, t1 in recs:
      self.trace.complete(track, name, device_ns(dev, t0.timestamp) - offset, device_ns(dev, t1.timestamp) - offset, cat, args)
      self.count += 1

  def write(self):
    try:
      for dev in self.devices.values(): dev.timeline.wait(dev.timeline_value)
      self.harvest()
    except Exception as e:   # still write what was collected
      print(f"PROFILE: could not read the last timestamps ({e})", file=sys.stderr)
    self.trace.write(self.path, {"tool": "baregrad PROFILE", "argv": sys.argv})
    print(f"PROFILE: wrote {self.count} events to {self.path}", file=sys.stderr)


# ---- hooks called by the runtime (installed in hcq/hooks.py when `active`) ----

def _recorder() -> capture.Recorder:
  if capture.recorder is None: capture.recorder = capture.Recorder(CAPTURE)
  return capture.recorder


def _profiler():
  global profiler
  if profiler is None: profiler = Profiler(PROFILE)
  return profiler


def on_run_schedule(items: list, sync: bool) -> bool:
  """True when the profiler ran the items (the caller then returns)."""
  if CAPTURE: _recorder().record_items(items)
  if PROFILE:
    _profiler().run(items, sync)
    return True
  return False


def on_graph_build(graph, queue, role: dict):
  if CAPTURE: graph.capture_role = role
  if PROFILE: _profiler().graph_built(graph, queue)


def on_graph_replay(graph, inputs: list, outputs: list, var_vals: dict, timeline_value: int):
  if CAPTURE: _recorder().record_graph(graph, inputs, outputs, var_vals, timeline_value)
  if PROFILE: _profiler().graph_replay(graph, timeline_value)


def on_copyin(dev, buf, data: memoryview):
  if CAPTURE: _recorder().host_write(dev, buf, data)


def on_synchronize(dev, timeout):
  """Device.synchronize, timed: the host wait shows in the profile, the capture records a sync point."""
  value = dev.timeline_value
  start = time.monotonic_ns()
  dev.timeline.wait(value, timeout)
  end = time.monotonic_ns()
  if PROFILE:
    p = _profiler()
    if end - start > 2000: p.host_wait(dev, start, end, value)
    p.harvest()
  if CAPTURE: _recorder().sync(dev)


class _Hooks:
  """The functions above, as the object hcq/hooks.py calls."""
  on_run_schedule = staticmethod(on_run_schedule)
  on_graph_build = staticmethod(on_graph_build)
  on_graph_replay = staticmethod(on_graph_replay)
  on_copyin = staticmethod(on_copyin)
  on_synchronize = staticmethod(on_synchronize)


if active: hooks.install(_Hooks())
