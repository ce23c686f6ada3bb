"""Reliability: the timeline signal across 2^32, and no leaks of threads, file descriptors or mappings."""
import gc, os, threading, time
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.tensor.jit import jit
from baregrad.drivers.encoded import Encoded
from baregrad.hcq.device import Device


def _emulated(name: str) -> Device:
  """The emulated GPU's device without changing the environment (what EMU=1 DEV=name selects)."""
  from baregrad.drivers import kernel
  dev = Device._open.get(name)
  iface = getattr(dev.driver, "k", None) or getattr(dev.driver, "kernel", None) if dev is not None else None
  if dev is None or not getattr(iface, "emulated", False):
    if name == "NV":
      from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
      from baregrad.drivers.nv.driver import NVDriver
      dev = Device(name, NVDriver(kernel=EmulatedNVKernel()))
    else:
      from baregrad.drivers.amd.driver import AMDDriver
      from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
      dev = Device(name, AMDDriver(kernel=EmulatedKFD()))
    Device._open[name] = dev
  return dev


@pytest.mark.parametrize("name", ["CPU", "NV", "AMD"])
def test_timeline_crosses_2_pow_32(name):
  dev = Device.get("CPU") if name == "CPU" else _emulated(name)
  dev.synchronize()
  dev.timeline.value = dev.timeline_value = 2**32 - 3
  x = Tensor(np.arange(8, dtype=np.float32), device=name)
  for _ in range(6): x = (x + 1).realize()
  np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.float32) + 6)
  assert dev.timeline.value == dev.timeline_value > 2**32


def test_jit_replays_across_2_pow_32():
  dev = Device.get("CPU")
  f = jit(lambda a: (a * 2 + 1).contiguous() - 1)
  for _ in range(2): f(Tensor(np.ones(4, np.float32), device="CPU"))
  dev.synchronize()
  dev.timeline.value = dev.timeline_value = 2**32 - 2
  for k in range(5):
    np.testing.assert_array_equal(f(Tensor(np.full(4, k, np.float32), device="CPU")).numpy(), np.full(4, 2.0 * k))
  assert dev.timeline.value > 2**32


def _resources():
  gc.collect()
  fds = len(os.listdir("/proc/self/fd"))
  maps = sum(1 for _ in open("/proc/self/maps"))
  return threading.active_count(), fds, maps


def test_no_leaks_over_many_tensors():
  """Creating, computing and dropping tensors returns threads, file descriptors and mappings (buffers go back to
  the allocator's cache and are reused)."""
  x = Tensor(np.ones(1000, np.float32))
  def work():
    y = Tensor(np.random.rand(1000).astype(np.float32))
    return ((y * x + 3).sum() + (y - x).max()).numpy()
  # bounded caches (schedules, scalar operands, dependents lists, the allocator's) fill up first: until 100 more
  # steps change nothing (a leak never gets there: the 20 tries run out and the check below fails)
  before = _resources()
  for _ in range(20):
    for _ in range(100): work()
    now = _resources()
    if now == before: break
    before = now
  before = _resources()
  for _ in range(300): work()
  after = _resources()
  # threads and fds exactly; mappings within 2: /proc/self/maps also counts the C allocator splitting and merging its
  # own regions (one line more or less), while anything kept per step would add hundreds over 300 steps
  assert after[:2] == before[:2] and after[2] - before[2] <= 2, f"threads, fds, mappings: {before} -> {after}"


def _rss_kb() -> int:
  for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"): return int(line.split()[1])
  return 0


# ENDURANCE=1: the full counts (100,000 eager launches, 10,000 JIT replays); CI runs a slice of each
EAGER_N, REPLAY_N = (100_000, 10_000) if os.environ.get("ENDURANCE") == "1" else (3_000, 1_000)


def _stable_rss(step, n: int, what: str):
  """Warm up, then run `step` n times: RSS after stays within 10% (+2 MB for allocator noise) of RSS before, and
  so do the live Python objects."""
  for _ in range(max(500, n // 20)): step()
  gc.collect()
  base, objs = _rss_kb(), len(gc.get_objects())
  t = time.perf_counter()
  for i in range(n):
    step()
    if i % 10_000 == 9_999: gc.collect()
  dt = time.perf_counter() - t
  gc.collect()
  end, end_objs = _rss_kb(), len(gc.get_objects())
  print(f"{what}: {n} in {dt:.1f} s ({dt / n * 1e6:.0f} us each), RSS {base} -> {end} kB, objects {objs} -> {end_objs}")
  assert end <= base * 1.1 + 2048, f"RSS grew from {base} kB to {end} kB over {n} {what}"
  assert end_objs <= objs + 500, f"live Python objects grew from {objs} to {end_objs} over {n} {what}"


def test_eager_launches_keep_memory_stable():
  """Eager launches: RSS settles (the allocator recycles, nothing accumulates per launch)."""
  x, y = Tensor(np.random.rand(256).astype(np.float32)), Tensor(np.random.rand(256).astype(np.float32))
  dev = Device.get(x.device)
  def step(): (x * y + 1.0).realize()
  _stable_rss(step, EAGER_N, "eager launches")
  dev.synchronize()


def test_jit_replays_keep_memory_stable():
  x = Tensor(np.random.rand(256).astype(np.float32))
  dev = Device.get(x.device)
  f = jit(lambda a: ((a * 1.5 + 2).relu().contiguous() * a).sum())
  want = ((x.numpy() * 1.5 + 2).clip(0) * x.numpy()).sum()
  def step(): f(x)
  _stable_rss(step, REPLAY_N, "JIT replays")
  np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-5)
  dev.synchronize()


FUZZ = int(os.environ.get("FUZZ_LONG", "12"))   # FUZZ_LONG=2000 for a long run


@pytest.mark.parametrize("name", ["CPU", "NV", "AMD"])
def test_fuzz_random_programs_on_every_device(name):
  """Random chains of views, elementwise ops and reductions, compared with numpy on each device."""
  import sys
  sys.path.insert(0, os.path.dirname(__file__))
  from helpers_fuzz import random_program
  if name != "CPU": _emulated(name)
  for seed in range(5000, 5000 + FUZZ):
    t, a = random_program(seed, steps=7, device=name)
    got = t.numpy()
    assert got.shape == a.shape, f"seed {seed}: shape {got.shape} != {a.shape}"
    np.testing.assert_allclose(got, a.astype(np.float32), rtol=1e-4, atol=1e-4, err_msg=f"seed {seed} on {name}")


def _fresh(name: str) -> Device:
  """A private emulated device (not registered), so a fault injected here leaves the shared one usable."""
  if name == "NV":
    from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
    from baregrad.drivers.nv.driver import NVDriver
    return Device(name, NVDriver(kernel=EmulatedNVKernel()))
  from baregrad.drivers.amd.driver import AMDDriver
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  return Device(name, AMDDriver(kernel=EmulatedKFD()))


@pytest.mark.parametrize("name", ["NV", "AMD"])
def test_injected_memory_fault_names_address_and_device_stays_reported(name):
  dev = _fresh(name)
  src = dev.driver.alloc(4096)
  q = dev.compute_queue().copy(0xdead0000, src.addr, 16)
  q.signal(dev.timeline, dev.next_timeline()).submit(dev)
  with pytest.raises(Exception, match="0xdead0000") as first:
    dev.synchronize(timeout=10)
  # afterwards the device reports itself unusable, with the same reason, instead of hanging
  with pytest.raises(Exception, match="0xdead0000"):
    dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize(timeout=10)
  assert name in str(first.value) or "GPU" in str(first.value)


@pytest.mark.parametrize("name", ["NV", "AMD"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_corrupted_command_stream_errors_without_hanging(name, seed):
  import random
  dev = _fresh(name)
  rng = random.Random(seed)
  with pytest.raises(Exception):            # synchronize's timeout bounds the wait: no hang, an exception
    dev.driver.submit("compute", Encoded([rng.getrandbits(32) for _ in range(64)]))
    dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize(timeout=5)


def test_cpu_queue_rejects_malformed_packets():
  import random
  from baregrad.drivers.cpu.processor import ProcessorFault
  dev = Device.get("CPU")
  rng = random.Random(7)
  with pytest.raises((ValueError, ProcessorFault)):
    dev.driver.submit("compute", Encoded([rng.getrandbits(64) for _ in range(64)]))
    dev.synchronize(timeout=5)


CPU_PACKET_FUZZ = r"""
import random, sys, time
import numpy as np
from baregrad.hcq.device import Device
from baregrad.drivers.cpu.driver import CPUDriver
from baregrad.drivers.cpu.processor import Op, PACKETS, header, ProcessorFault
from baregrad.drivers.encoded import Encoded
from baregrad.tensor import Tensor
seed = int(sys.argv[1])
rng = random.Random(seed)
prog = (Tensor(np.ones(4, np.float32), device="CPU") + 1).realize()   # a loaded kernel entry point exists
faults = 0
for k in range(int(sys.argv[2])):
  dev = Device("CPU", CPUDriver())
  bufs = [dev.driver.alloc(rng.choice([8, 64, 4096, 10000])) for _ in range(3)]
  def operand(name):
    b = rng.choice(bufs)
    kind = rng.randrange(4)
    if name == "nbytes" or name == "nwords" or name == "nchunks": return rng.choice([0, 1, 8, 4096, 1 << 20, rng.getrandbits(64)])
    if kind == 0: return rng.getrandbits(64)
    if kind == 1: return b.addr + rng.randrange(0, b.mapped + 64)          # inside, or just past the end
    if kind == 2: return b.addr - rng.randrange(1, 4096)
    return rng.getrandbits(48)
  words = []
  for _ in range(rng.randint(1, 12)):
    op = rng.choice([o for o in Op if o not in (Op.WAIT,)])
    ops = [operand(n) for n in PACKETS[op]]
    words += [header(op, 1 + len(ops)), *ops]
  try:
    dev.driver.submit("compute", Encoded(words))
    dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize(timeout=5)
  except (ProcessorFault, RuntimeError, ValueError, TimeoutError) as e:
    faults += 1
    msg = str(e)
    assert "CPU" in msg, msg
print("ok", faults)
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cpu_random_packets_with_wild_operands_never_crash(seed):
  """Valid opcodes and sizes with random addresses, lengths and function pointers: the CPU device's checked
  processor faults (unmapped address / not a kernel entry point) instead of touching the memory; the process
  survives (run in a child so a crash shows up as its exit status)."""
  import subprocess, sys
  out = subprocess.run([sys.executable, "-c", CPU_PACKET_FUZZ, str(seed), "40"], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, f"child exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
  faults = int(out.stdout.split()[-1])
  assert faults >= 30, out.stdout       # nearly every random stream has a bad operand


def test_cpu_fault_names_the_unmapped_address_and_packet():
  from baregrad.drivers.cpu.driver import CPUDriver
  from baregrad.drivers.cpu.processor import Op, header, ProcessorFault
  def run(words):
    dev = Device("CPU", CPUDriver())
    dev.driver.submit("compute", Encoded(words))
    dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize(timeout=5)
  buf = Device("CPU", CPUDriver()).driver.alloc(64)
  with pytest.raises(ProcessorFault, match="CPU command processor fault: COPY packet operand 0x1000 is not mapped device memory"):
    run([header(Op.COPY, 4), buf.addr, 0x1000, 8])
  with pytest.raises(ProcessorFault, match=f"COPY packet operand 0x{buf.addr:x} is not mapped"):
    run([header(Op.COPY, 4), buf.addr, buf.addr, 5000])    # runs past the end of the allocation
  with pytest.raises(ProcessorFault, match="EXEC packet function 0x1234 is not a loaded kernel entry point"):
    run([header(Op.EXEC, 3), 0x1234, buf.addr])
  run([header(Op.COPY, 4), buf.addr, buf.addr + 8, 56])     # inside: fine


def test_programs_and_device_memory_are_released():
  """Distinct kernels load programs (code mappings + entry points); once the caches let go of them and the
  device is done, they are unloaded. Dropped tensors' memory returns to the driver when the allocator's cache
  is flushed. Counted on the CPU device's address table and in /proc/self/maps (executable mappings)."""
  from baregrad.compiler import codegen
  from baregrad.drivers.cpu.processor import address_space
  dev = Device.get("CPU")
  def counts():
    gc.collect(); dev.synchronize(); dev.allocator.free_cache()
    # executable mappings: program images (not Python's own 1 MiB object arenas, which come and go with its heap)
    code = sum(1 for line in open("/proc/self/maps") if line.split()[1][2] == "x")
    return len(address_space.entries), len(address_space.ranges), code
  def work(k):
    x = Tensor(np.arange(k + 1, dtype=np.float32), device="CPU")
    return float((x * (k + 0.5) + k).sum().numpy())
  work(0)
  codegen.clear_programs()
  before = counts()
  outs = [work(k) for k in range(1, 25)]           # 24 shapes: distinct kernels and buffers
  loaded = counts()
  assert loaded[0] >= before[0] + 24 and loaded[2] >= before[2] + 24, (before, loaded)
  codegen.clear_programs()
  del outs
  after = counts()
  # nothing more than before (fewer is a cache letting go of something an earlier test left in it)
  assert all(a <= b for a, b in zip(after, before)), f"(entries, allocations, code mappings): {before} -> loaded {loaded} -> after {after}"


def test_program_cache_is_bounded(monkeypatch):
  from baregrad.compiler import codegen
  from baregrad.drivers.cpu.processor import address_space
  dev = Device.get("CPU")
  codegen.clear_programs(); gc.collect(); dev.synchronize()
  base = len(address_space.entries)
  from baregrad.compiler import schedule
  monkeypatch.setattr(codegen, "PROGRAM_CACHE", 8)
  monkeypatch.setattr(schedule, "PLAN_CACHE", 8)     # schedules hold their programs too
  for k in range(1, 40): Tensor(np.ones(k, np.float32), device="CPU").exp2().numpy()
  gc.collect(); dev.synchronize()
  assert len(codegen._programs) <= 8 and len(schedule._plans) <= 8
  assert len(address_space.entries) <= base + 16, (base, len(address_space.entries))


def test_no_plan_cache(monkeypatch):
  """PLAN_CACHE=0 (a valid setting: keep no schedules) schedules every realize anew and keeps none (it raised
  StopIteration evicting from the empty cache)."""
  from baregrad.compiler import schedule
  monkeypatch.setattr(schedule, "PLAN_CACHE", 0)
  schedule._plans.clear()
  x = np.arange(6, dtype=np.float32)
  for _ in range(2): np.testing.assert_array_equal((Tensor(x, device="CPU") * 2).numpy(), x * 2)
  assert len(schedule._plans) == 0


@pytest.mark.parametrize("name", ["NV", "AMD"])
def test_emulated_gpu_programs_and_memory_are_released(name):
  """The same on the emulated GPUs, counted as live mappings of the emulated GPU's memory: kernel code,
  buffers and all come back once programs are unloaded and the allocator's cache is flushed."""
  from baregrad.compiler import codegen
  dev = _emulated(name)
  iface = getattr(dev.driver, "k", None) or getattr(dev.driver, "kernel", None)
  mem = iface.gpu.mem if name == "NV" else iface.memory
  def count():
    gc.collect(); dev.synchronize(); dev.allocator.free_cache()
    return mem.mappings
  def work(k):
    x = Tensor(np.arange(k + 1, dtype=np.float32), device=name)
    return float((x * (k + 0.5)).sum().numpy())
  work(0)
  codegen.clear_programs()
  before = count()
  outs = [work(k) for k in range(1, 12)]
  assert outs == [float((np.arange(k + 1, dtype=np.float32) * np.float32(k + 0.5)).sum()) for k in range(1, 12)]
  loaded = count()
  assert loaded >= before + 11, (before, loaded)                # the code of 11 distinct kernels
  codegen.clear_programs()
  assert count() == before, f"{name}: mappings {before} -> loaded {loaded} -> {count()}"


@pytest.mark.parametrize("src,dst", [("NV", "CPU"), ("CPU", "AMD"), ("AMD", "NV"), ("CPU", "NV")])
def test_cross_device_copy_waits_for_the_source(src, dst):
  """Tensor.to between devices: the copy starts after the source's queued kernels (not synchronized here) and
  the result continues on the destination."""
  for n in (src, dst):
    if n != "CPU": _emulated(n)
  a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
  x = Tensor(a, device=src)
  y = ((x * 2).exp2().sum(1) + 1).to(dst)              # queued on src, copied, used on dst in one realize
  got = (y * 3).numpy()
  np.testing.assert_allclose(got, (np.exp2(a * 2).sum(1) + 1) * 3, rtol=1e-4)


def test_devices_opened_and_closed_release_threads_and_descriptors():
  """Private devices (CPU, EMU NV, EMU AMD) opened, used and closed: threads, file descriptors and mappings
  come back to where they were (the CPU processor thread stops, the emulated channels/queues and fds close)."""
  from baregrad.drivers.cpu.driver import CPUDriver
  from baregrad.hcq.signal import Signal
  def use(dev):
    buf = dev.driver.alloc(4096)
    s = Signal(dev, "t")
    dev.compute_queue().signal(s, 5).submit(dev)
    s.wait(5, timeout=10)
    dev.driver.free(buf)
  def cycle():
    for make in (lambda: Device("CPU", CPUDriver()), lambda: _fresh("NV"), lambda: _fresh("AMD")):
      dev = make(); use(dev); dev.close()
  cycle()
  before = _resources()
  for _ in range(5): cycle()
  after = _resources()
  assert after[:2] == before[:2], f"threads, fds: {before} -> {after}"
  assert after[2] <= before[2] + 16, f"mappings: {before[2]} -> {after[2]}"   # allocator arenas, not per-device
