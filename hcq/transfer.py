"""Copies between devices, ordered by signals: the host never waits in the middle.

A copy from device A to device B takes one of two paths, chosen once per pair by what the drivers can do:

  peer   One device's queue -- the engine E: B's, else A's -- addresses the other device's memory: E's driver maps
         the other's allocations for it (`Device.map_host`, the capability this is chosen by: a driver that cannot
         raises NotImplementedError, a kernel that refuses the mapping an OSError. The CPU driver adds the pages to its
         command processor's table, AMD makes a KFD userptr BO, NV an RM OS descriptor that UVM maps at the same GPU
         address). The copy runs on E's copy engine (the AMD SDMA queue, the NV DMA-copy channel; the CPU command
         processor) when E has one. The two signals it is ordered with live in the other device's (P's) memory,
         mapped by E:
             P:  ... its queued work, signal ready = k        (skipped when P has nothing in flight)
             E:  wait E's own earlier work, wait ready >= k, copy dst <- src, signal done = k, signal E's timeline
             P's next submission waits done >= k (E read or wrote P's memory), and so does P.synchronize().
  host   Neither device can address the other's memory (neither driver maps host memory, or the kernel refused
         both mappings): the host relay -- a thread of this process --
         waits for A's and B's queued work (their timelines), copies host memory to host memory (every driver maps its
         memory for the host at the device address) and writes a signal in B's memory that B's queue waits on, and one
         in A's memory for A's next submission. The caller only queues the job.

Both buffers are kept alive until the copy is done (retired on the device whose timeline covers the copy), so their
memory is reused only afterwards.
"""
from __future__ import annotations
import ctypes, os, queue as _queue, threading, time
from .device import Device
from .signal import Signal


class Link:
  """How copies from `src` to `dst` run: `path` ("peer" or "host") and `engine` (the device whose queue copies)."""
  path = "host"
  engine: Device | None = None
  kind = "host"

  def describe(self) -> str:
    if self.path == "host": return "host relay (a host thread copies; both devices' queues wait on its signals)"
    return f"peer ({self.engine.name} {self.kind} queue addresses {self.other.name}'s memory)"


class PeerLink(Link):
  path = "peer"

  def __init__(self, src: Device, dst: Device, engine: Device, other: Device):
    self.src, self.dst, self.engine, self.other = src, dst, engine, other
    self.kind = "copy" if engine.driver.has_copy_queue else "compute"
    name = f"{src.name}->{dst.name}"
    self.ready = Signal(other, f"copy {name} ready", shared_with=(engine,))   # P's memory, mapped by E
    self.done = Signal(other, f"copy {name} done", shared_with=(engine,))
    self.count = 0

  def map(self, buf):
    """Make E's queue address `buf` (a buffer of the other device)."""
    owner, mem, nbytes = buf.allocation()
    if owner is not self.engine: self.engine.map_peer(owner, mem, nbytes)

  def copy(self, dst, src):
    E, P = self.engine, self.other
    self.count += 1
    k = self.count
    busy = P.timeline.value < P.timeline_value or bool(P.pending_waits)
    if busy:
      q = P.queue("compute")
      P.submit(q.signal(self.ready, k))
    self.map(dst); self.map(src)
    q = E.queue(self.kind)
    if busy: q.wait(self.ready, k)
    q.copy(dst.addr, src.addr, dst.nbytes).signal(self.done, k)
    E.submit(q)
    P.pending_waits.append((self.done, k))
    E.retire((dst, src))


class HostLink(Link):
  def __init__(self, src: Device, dst: Device):
    self.src, self.dst = src, dst
    name = f"{src.name}->{dst.name}"
    self.arrived_src = Signal(src, f"host relay {name} (read)")     # in A's memory: A may write src again
    self.arrived_dst = Signal(dst, f"host relay {name} (written)")  # in B's memory: B may read dst
    self.count = 0

  def copy(self, dst, src):
    A, B = self.src, self.dst
    self.count += 1
    k = self.count
    waits = [(A.timeline, A.timeline_value), (B.timeline, B.timeline_value)] + A.pending_waits + B.pending_waits
    q = B.queue("compute")
    B.submit(q.wait(self.arrived_dst, k))
    A.pending_waits.append((self.arrived_src, k))
    relay().put(RelayJob(waits, dst.addr, src.addr, dst.nbytes, [(self.arrived_src, k), (self.arrived_dst, k)],
                         f"copy {A.name}->{B.name} of {dst.nbytes} bytes"))
    B.retire((dst, src))


# ---- choosing the path ----
_links: dict[tuple, Link] = {}


def link(src: Device, dst: Device) -> Link:
  """The path copies from `src` to `dst` take (made once per pair of open devices)."""
  key = (src.name, dst.name, Device.epoch)
  found = _links.get(key)
  if found is None:
    found = _links[key] = _choose(src, dst)
  return found


def _choose(src: Device, dst: Device) -> Link:
  for engine, other in ((dst, src), (src, dst)):   # the destination pulls, else the source pushes
    try: return PeerLink(src, dst, engine, other)
    except NotImplementedError: continue           # its driver cannot map the other's memory
    except OSError: continue                       # the kernel refused the mapping (no peer access)
  return HostLink(src, dst)


def copy_path(src: str, dst: str) -> str:
  """What a copy from device `src` to device `dst` runs on, in words (the benchmark reports it)."""
  return link(Device.get(src), Device.get(dst)).describe()


def copy(dst, src):
  """Queue a copy of buffer `src` into buffer `dst` (on another device), ordered after the work queued on both
  devices and before the work queued after it (see the module docstring). Call under Device.lock."""
  if dst.nbytes == 0: return          # (an empty shard)
  for b in (dst, src): b.ensure_allocated()
  link(Device.get(src.device), Device.get(dst.device)).copy(dst, src)


# ---- the host relay ----
class RelayJob:
  def __init__(self, waits, dst: int, src: int, nbytes: int, signals, what: str):
    self.waits, self.dst, self.src, self.nbytes, self.signals, self.what = list(waits), dst, src, nbytes, signals, what


class Relay:
  """One thread that runs host copies in the order they were queued. A job waits for its signals by polling their
  memory (the drivers' waits are not called from this thread), copies with memmove (without the GIL), then writes
  its signals. A wait that times out (TIMEOUT) leaves its signals unwritten: the devices' waits on them then fail
  naming the signal, and `error` says what the relay saw."""

  def __init__(self):
    self.jobs: _queue.Queue = _queue.Queue()
    self.error: str | None = None
    self.pid = os.getpid()
    self.thread = threading.Thread(target=self._run, name="baregrad host relay", daemon=True)
    self.thread.start()

  def put(self, job: RelayJob): self.jobs.put(job)

  def _run(self):
    while True:
      job = self.jobs.get()
      try:
        for sig, value in job.waits: _poll(sig, value, Device.default_timeout)
        ctypes.memmove(job.dst, job.src, job.nbytes)
        for sig, value in job.signals: sig.value = value
      except Exception as e:
        self.error = f"host relay: {job.what}: {type(e).__name__}: {e}"


def _poll(sig: Signal, value: int, timeout: float):
  if sig.value >= value: return
  start, pause = time.monotonic(), 1e-6
  while sig.value < value:
    if time.monotonic() - start > timeout:
      raise TimeoutError(f"waited {timeout} s for {sig.device.name} signal '{sig.name}' to reach {value}, it is {sig.value}")
    time.sleep(pause)
    pause = min(pause * 2, 1e-3)


_relay: Relay | None = None


def relay() -> Relay:
  global _relay
  if _relay is None or _relay.pid != os.getpid(): _relay = Relay()   # a forked child has no thread: a new relay
  return _relay
