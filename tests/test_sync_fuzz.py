"""Queue synchronization: 64-bit waits across 2^32 on every device and queue, and a fuzzer of random signal/wait
graphs over the queues of the CPU device and both emulated GPUs that must neither deadlock nor give wrong values.

Cross-device waits use signals (and data) in memory that every device's queues address at the same address:
host memory allocated on the NV device (system memory it maps for its GPU), mapped by the AMD device as a userptr
BO and added to the CPU command processor's address table (Device.alloc_shared, Signal(..., shared_with=...)).
The queues themselves poll the other devices' writes; the host only submits and, at the end, waits.

SYNC_FUZZ_LONG=<count> runs <count> graphs instead of the default 20."""
import os, random, time
import numpy as np
import pytest

from baregrad.drivers.amd import pm4, sdma
from baregrad.hcq.device import Device
from baregrad.hcq.queue import Slot
from baregrad.hcq.signal import Signal

GRAPHS = int(os.environ.get("SYNC_FUZZ_LONG", "20"))
TIMEOUT = 10.0                 # seconds per graph before it counts as a deadlock
CELL, MAX_PREDS, MAX_STEPS = 16, 3, 14
BLOCK = 2 * CELL + MAX_PREDS * CELL     # per step: its constant, its slot, its inbox (one cell per predecessor)
QUEUES = [(d, k) for d in ("CPU", "NV", "AMD") for k in ("compute", "copy")]


def _device(name: str) -> Device:
  """A private device (not registered): a deadlock or fault here leaves the shared ones usable."""
  if name == "CPU":
    from baregrad.drivers.cpu.driver import CPUDriver
    return Device(name, CPUDriver())
  if name == "NV":
    from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
    from baregrad.drivers.nv.driver import NVDriver
    return Device(name, NVDriver(kernel=EmulatedNVKernel()))
  from baregrad.drivers.amd.driver import AMDDriver
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  return Device(name, AMDDriver(kernel=EmulatedKFD()))


@pytest.fixture(scope="module")
def devices():
  devs = {name: _device(name) for name in ("CPU", "NV", "AMD")}
  yield devs
  for dev in devs.values():                                    # stops the emulated queue threads
    if hasattr(dev.driver, "close"): dev.driver.close()


def _queue(dev: Device, kind: str):
  return dev.compute_queue() if kind == "compute" else dev.copy_queue()


# ---- 64-bit waits ----

def test_wait_reg_mem64_layout():
  # PM4_MEC_WAIT_REG_MEM64 (AMD PAL gfx9_plus_merged_f32_mec_pm4_packets.h): header PACKET3(0x93, 7) with the compute
  # bit, control (function 2:0, mem_space 5:4), address lo/hi, reference lo/hi, mask lo/hi, poll interval
  words = pm4.packet("WAIT_REG_MEM64", function=pm4.FUNC[">="], mem_space=1, addr_lo=0x12345678, addr_hi=0x7F,
                     reference=3, reference_hi=1, mask=0xFFFFFFFF, mask_hi=0xFFFFFFFF, poll_interval=4)
  assert words == [3 << 30 | 7 << 16 | 0x93 << 8 | 2, 5 | 1 << 4, 0x12345678, 0x7F, 3, 1, 0xFFFFFFFF, 0xFFFFFFFF, 4]
  name, fields, size = pm4.decode(words, 0)
  assert (name, size) == ("WAIT_REG_MEM64", 9)
  assert pm4.wait64_operands(fields) == (0x7F_12345678, 2**64 - 1, 2**32 + 3)
  assert pm4.describe(name, fields) == "WAIT_REG_MEM64 [0x7f12345678] & 0xffffffffffffffff >= 0x100000003"


@pytest.mark.parametrize("kind", ["compute", "copy"])
@pytest.mark.parametrize("name", ["CPU", "NV", "AMD"])
def test_queue_wait_across_2_pow_32(devices, name, kind):
  """A queue waiting for 2^32 + 3 stays blocked while the signal is below it, also when its low word is above 3."""
  dev = devices[name]
  target = 2**32 + 3
  gate, done = Signal(dev, "gate", value=2**32 - 2), Signal(dev, "done")
  _queue(dev, kind).wait(gate, target).signal(done, 1).submit(dev)
  try:
    for value in (2**32 - 2, 2**32 - 1, 2**32 + 2):    # low words 0xfffffffe and 0xffffffff (above 3), then 2
      gate.value = value
      time.sleep(0.03)
      assert done.value == 0, f"{name} {kind} queue passed a wait for {target:#x} with the signal at {value:#x}"
    gate.value = target
    done.wait(1, timeout=10)
  finally:
    gate.value = target                                  # never leave a queue blocked
  if name == "AMD":
    engine = dev.driver.kernel.queues[dev.driver.ring_of(kind).queue_id]
    assert ("WAIT_REG_MEM64" if kind == "compute" else "COND_EXE") in engine.history


@pytest.mark.parametrize("kind", ["compute", "copy"])
@pytest.mark.parametrize("name", ["CPU", "NV", "AMD"])
def test_bound_queue_patches_64_bit_waits(devices, name, kind):
  """A bound queue (what JIT replays submit) patches the whole 64-bit value it waits for on every submit."""
  dev = devices[name]
  gate, done = Signal(dev, "gate"), Signal(dev, "done")
  q = _queue(dev, kind).wait(gate, Slot("gate")).signal(done, Slot("done")).bind(dev)
  targets = [2**32 - 2, 2**32 + 1, 3 * 2**32 - 5, 3 * 2**32 + 4]    # the gate stays at the previous target meanwhile
  try:
    for k, target in enumerate(targets):
      q.submit(dev, {"gate": target, "done": 2**32 + k})
      time.sleep(0.03)
      assert done.value == (2**32 + k - 1 if k else 0), f"{name} {kind}: passed the wait for {target:#x}"
      gate.value = target
      done.wait(2**32 + k, timeout=10)
  finally:
    gate.value = targets[-1]


def test_sdma_signal_writes_low_word_first(devices):
  """A 64-bit reader never sees more than the value being written: low word first, then high (two 32-bit FENCEs)."""
  dev = devices["AMD"]
  sig = Signal(dev, "s", value=2**32 - 1)
  ring = dev.driver.copy
  start = ring.wptr
  dev.copy_queue().signal(sig, 2**33 + 1).submit(dev)
  sig.wait(2**33 + 1, timeout=10)
  fences, pos = [], start
  while pos < ring.wptr:
    name, fields, size = sdma.decode(ring.ring, pos % ring.dwords)
    if name == "FENCE": fences.append((fields["addr_hi"] << 32 | fields["addr_lo"], fields["data"]))
    pos += size
  assert [f for f in fences if f[0] in (sig.addr, sig.addr + 4)] == [(sig.addr, 1), (sig.addr + 4, 2)]
  fences = [f for f in fences if f[0] != dev.driver.marker_page.addr + 8]   # (the command's trace marker comes last)
  assert fences[-1][0] == dev.driver.queue_event_slot        # then the event's slot, before the TRAP


def test_cross_device_signals(devices):
  """Every queue of every device waits on one signal in NV memory that the host opens, then signals its own."""
  others = (devices["AMD"], devices["CPU"])
  gate = Signal(devices["NV"], "gate", value=2**32 - 1, shared_with=others)
  done = [Signal(devices["NV"], f"{name} {kind}", shared_with=others) for name, kind in QUEUES]
  for (name, kind), sig in zip(QUEUES, done):
    _queue(devices[name], kind).wait(gate, 2**32 + 1).signal(sig, 2**32 + 7).submit(devices[name])
  try:
    time.sleep(0.03)
    assert [sig.value for sig in done] == [0] * len(QUEUES)
  finally:
    gate.value = 2**32 + 1
  for sig in done: sig.wait(2**32 + 7, timeout=10)
  # NV maps host memory other devices allocated too (an RM OS descriptor mapped by UVM): a signal in CPU memory
  mapped = Signal(devices["CPU"], "in CPU memory", shared_with=(devices["NV"],))
  _queue(devices["NV"], "copy").signal(mapped, 2**32 + 3).submit(devices["NV"])
  mapped.wait(2**32 + 3, timeout=10)


# ---- the fuzzer ----

class Step:
  def __init__(self, index, queue, preds, init, target):
    self.index, self.queue, self.preds, self.init, self.target = index, queue, preds, init, target
    self.extra = []            # (step, value <= its initial value): waits that hold from the start
  def __repr__(self):
    return (f"step {self.index} on {self.queue[0]} {self.queue[1]}: waits {[(p, hex(v)) for p, v in self.waits()]}, "
            f"signals {self.init:#x} -> {self.target:#x}")
  def waits(self): return [(p.index, p.target) for p in self.preds] + [(s.index, v) for s, v in self.extra]


def _value(rng) -> int:
  """An initial signal value, often just below a 2^32 boundary so that the value written crosses it."""
  return rng.choice([rng.randrange(0, 1 << 20), 2**32 - rng.randrange(1, 9), 5 * 2**32 - rng.randrange(1, 9),
                     rng.randrange(1 << 40, 1 << 62)])


def _sdma_safe(step, value: int) -> bool:
  """Whether the AMD copy queue may wait for `value` on `step`'s signal while that signal may be written: gfx11 SDMA
  polls one dword, so its 64-bit wait (drivers/amd/driver.py) holds unless the signal jumps from the waited value's
  2^32 epoch into the next one while the queue polls."""
  return value >> 32 < step.init >> 32 or step.init >> 32 == step.target >> 32


def make_graph(seed: int) -> list[Step]:
  """A random DAG (steps, each after its predecessors in index order) with random queues and signal values."""
  rng = random.Random(seed)
  steps = []
  for i in range(rng.randint(2, MAX_STEPS)):
    preds = [steps[p] for p in rng.sample(range(i), rng.randint(0, min(i, MAX_PREDS)))]
    init = _value(rng)
    steps.append(Step(i, rng.choice(QUEUES), preds, init, init + rng.randint(1, 12)))
  for s in steps:               # waits on values a signal already holds (timeline >=, not ==)
    for _ in range(rng.choice([0, 0, 1, 2])):
      other = rng.choice(steps)
      value = max(0, other.init - rng.choice([0, 1, 5, other.init & 0xFFFFFFFF, 2**32 - 1]))
      if s.queue == ("AMD", "copy") and not _sdma_safe(other, value): continue
      s.extra.append((other, value))
  return steps


def submission_order(steps: list[Step], ring_of, rng) -> list[list[Step]]:
  """Batches of steps (one batch = one submission to one queue) in a random order. Each hardware queue runs its
  steps in one random topological order of the graph (any other order could deadlock for real); across queues
  the order is random, so waits are often submitted before the signal they wait for."""
  order: list[Step] = []
  while len(order) < len(steps):      # a random linear extension: any step whose predecessors are all placed
    order.append(rng.choice([s for s in steps if s not in order and all(p in order for p in s.preds)]))
  per_ring: dict = {}
  for s in order: per_ring.setdefault(ring_of(s.queue), []).append(s)
  batches = []
  while per_ring:
    ring = rng.choice(list(per_ring))
    n = rng.choice([1, 1, 1, 2, 3])
    batches.append(per_ring[ring][:n])
    per_ring[ring] = per_ring[ring][n:]
    if not per_ring[ring]: del per_ring[ring]
  return batches


class Fuzzer:
  """Each step waits for its predecessors' signals, copies each predecessor's slot into its inbox, copies its
  constant into its own slot and signals. Right values need the order: a step that ran early reads the poison
  of a slot not yet written."""

  def __init__(self, devs: dict):
    self.devs = devs
    owner, others = devs["NV"], [devs["AMD"], devs["CPU"]]
    self.mem = owner.alloc_shared(MAX_STEPS * BLOCK, others)
    self.view = np.frombuffer(owner.driver.view(self.mem.addr, MAX_STEPS * BLOCK), np.uint8)

  def ring_of(self, queue):
    """Queues that are one hardware queue: the CPU device's compute and copy queues feed one command processor."""
    name, kind = queue
    return (name, kind if self.devs[name].driver.has_copy_queue else "compute")

  def const(self, i): return self.mem.addr + i * BLOCK
  def slot(self, i): return self.mem.addr + i * BLOCK + CELL
  def inbox(self, i, k): return self.mem.addr + i * BLOCK + 2 * CELL + k * CELL
  def cells(self, addr): return self.view[addr - self.mem.addr:addr - self.mem.addr + CELL]

  def run(self, seed: int):
    rng = random.Random(seed ^ 0x5EED)
    steps = make_graph(seed)
    nv, others = self.devs["NV"], (self.devs["AMD"], self.devs["CPU"])
    sigs = [Signal(nv, f"step {s.index}", value=s.init, shared_with=others) for s in steps]
    self.view[:] = 0
    consts = np.frombuffer(rng.randbytes(len(steps) * CELL), np.uint8).reshape(len(steps), CELL)
    for s in steps:
      self.cells(self.const(s.index))[:] = consts[s.index]
      self.cells(self.slot(s.index))[:] = 0xEE       # poison until the step writes its slot
    batches = submission_order(steps, self.ring_of, rng)
    for batch in batches:
      name, kind = batch[0].queue[0], rng.choice([s.queue[1] for s in batch])    # one hardware queue: either builder
      dev = self.devs[name]
      q = _queue(dev, kind)
      for s in batch:
        waits = s.waits()
        rng.shuffle(waits)
        for p, v in waits: q.wait(sigs[p], v)
        for k, p in enumerate(s.preds): q.copy(self.inbox(s.index, k), self.slot(p.index), CELL)
        if rng.random() < 0.3: q.memory_barrier()
        q.copy(self.slot(s.index), self.const(s.index), CELL)
        q.signal(sigs[s.index], s.target)
      q.submit(dev)
      if rng.random() < 0.1: time.sleep(0.002)       # let queues reach their waits before the signals are submitted
    self.finish(seed, steps, sigs, batches, consts)

  def finish(self, seed, steps, sigs, batches, consts):
    deadline = time.monotonic() + TIMEOUT
    try:
      for s, sig in zip(steps, sigs): sig.wait(s.target, timeout=max(0.01, deadline - time.monotonic()))
    except Exception as e:      # a timeout (with the drivers' report of where each queue stands) or a queue fault
      stuck = [f"{s!r}: at {sig.value:#x}" for s, sig in zip(steps, sigs) if sig.value < s.target]
      for s, sig in zip(steps, sigs): sig.value = s.target     # release every queue before failing
      order = [[f"{s.index}@{s.queue[0]} {s.queue[1]}" for s in b] for b in batches]
      what = "deadlock" if isinstance(e, TimeoutError) else "queue error"
      pytest.fail(f"seed {seed}: {what} ({type(e).__name__}: {e})\nsteps not done:\n  " + "\n  ".join(stuck) +
                  f"\nsubmissions: {order}")
    for d in self.devs.values(): d.check_faults()
    for s in steps:          # numpy's walk of the DAG: slots hold the constants, inboxes the predecessors' constants
      got, want = self.cells(self.slot(s.index)), consts[s.index]
      assert (got == want).all(), f"seed {seed}: {s!r}: slot holds {got.tobytes().hex()}, expected {want.tobytes().hex()}"
      for k in range(MAX_PREDS):
        got = self.cells(self.inbox(s.index, k))
        want = consts[s.preds[k].index] if k < len(s.preds) else np.zeros(CELL, np.uint8)
        assert (got == want).all(), (f"seed {seed}: {s!r}: inbox {k} holds {got.tobytes().hex()}, expected "
                                     f"{want.tobytes().hex()} (it ran before its predecessor wrote its slot)")
    for s, sig in zip(steps, sigs):
      assert sig.value == s.target, f"seed {seed}: {s!r}: signal ends at {sig.value:#x}"


def test_sync_fuzz(devices):
  fuzzer = Fuzzer(devices)
  for seed in range(GRAPHS): fuzzer.run(seed)
