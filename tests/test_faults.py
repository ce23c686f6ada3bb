"""Faults injected into the emulated GPUs reach the host as exceptions within the timeout, naming the device, the
queue, the kernel and the fault. A memory fault leaves the device reporting that same fault on every later call; any
other fault resets the queues once (the exception says so) and the device computes again; a wait nobody satisfies
is reported on every synchronize until the value is written."""
import dataclasses, random, re, threading, time
import numpy as np
import pytest
from baregrad.compiler import codegen, schedule
from baregrad.drivers.amd import pm4
from baregrad.drivers.encoded import Encoded
from baregrad.drivers.amd.codeobj import read_code_object
from baregrad.drivers.nv import pushbuf as pb
from baregrad.hcq.device import Device
from baregrad.hcq.signal import Signal
from baregrad.tensor import Tensor
from test_reliability import _emulated, _fresh

QUEUE = {"AMD": r"compute queue \d+", "NV": r"channel 'compute'|compute channel"}   # how each names its compute queue


@pytest.fixture(params=["NV", "AMD"])
def dev(request):
  d = _fresh(request.param)
  yield d
  d.driver.close()


def _kernel(dev: Device, patch=None):
  """The renderer's kernel for `a + 1` over 64 float32 (arguments: out, in), loaded on dev. patch: a function of the
  PTX text (NV), or bytes written over the first instruction (AMD)."""
  _emulated(dev.name)
  (item,) = (Tensor(np.arange(64, dtype=np.float32), device=dev.name) + 1).schedule()
  prog = item.program
  binary, source = prog.binary, prog.source
  if dev.name == "NV":
    source = patch(source) if patch else source
    binary = dev.driver.compile(source)     # the driver keeps the PTX the emulated GPU runs
  elif patch:
    code, _, entry, _ = read_code_object(binary)
    at = bytes(binary).index(code) + entry
    binary = bytes(binary[:at]) + patch + bytes(binary[at + len(patch):])
  return dataclasses.replace(prog, binary=binary, source=source, handle=None).load(dev)


def _launch(dev: Device, prog, src: int):
  out = dev.driver.alloc(4 * 64)
  args = dev.kernargs.put([out.addr, src])
  q = dev.compute_queue().exec(prog, args, prog.meta["global_size"], prog.meta["local_size"])
  q.signal(dev.timeline, dev.next_timeline()).submit(dev)


def _computes(dev: Device, monkeypatch):
  """A small Tensor computation on dev (its kernels compiled and loaded there) gives numpy's result."""
  with monkeypatch.context() as m:
    m.setitem(Device._open, dev.name, dev)
    m.setattr(codegen, "_programs", {})
    m.setattr(schedule, "_plans", {})
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal((Tensor(x, device=dev.name) * 2 + 1).numpy(), x * 2 + 1)


def _raises(fn, exc=RuntimeError) -> str:
  """fn() raises exc (the timeouts passed to fn bound how long that takes); its message."""
  with pytest.raises(exc) as e: fn()
  return str(e.value)


def _names(msg: str, dev: Device, *parts: str):
  assert msg.startswith(f"{dev.name}: "), msg
  for part in (QUEUE[dev.name], *parts): assert re.search(part, msg), (part, msg)


def _was_reset(dev: Device, fn) -> str:
  """fn() raises the one exception of a fault after which the driver reset its queues; its message."""
  with pytest.raises(RuntimeError) as e: fn()
  assert getattr(e.value, "queues_reset", False), e.value
  return str(e.value)


def test_kernel_reading_unmapped_memory_stays_reported(dev, monkeypatch):
  _launch(dev, _kernel(dev), 0xDEAD0000)
  msg = _raises(lambda: dev.synchronize(timeout=10))
  _names(msg, dev, r"memory (page )?fault", "E_64", "0xdead0000", r"read of 4 byte", r"global_load_b32|ld\.global\.f32")
  for _ in range(2):        # every later call: the same reason
    assert _raises(lambda: _computes(dev, monkeypatch)) == msg
    assert _raises(lambda: dev.synchronize(timeout=10)) == msg


def test_illegal_instruction_resets_the_queue(dev, monkeypatch):
  # AMD: a dword the RDNA3 decoder rejects over the first instruction; NV: PTX `trap` before the kernel returns
  patch = b"\xff\xff\xff\xff" if dev.name == "AMD" else (lambda src: src.replace("  ret;", "  trap;\n  ret;"))
  _launch(dev, _kernel(dev, patch), dev.driver.alloc(4 * 64).addr)
  msg = _was_reset(dev, lambda: dev.synchronize(timeout=10))
  want = {"AMD": r"illegal instruction at pc 0x0: dword 0xffffffff", "NV": r"illegal instruction `trap` \(line \d+\)"}
  _names(msg, dev, "E_64", want[dev.name])
  # the wave / warp that ran it: the instruction marked in its code, its lanes
  state = {"AMD": [r"=> 0x0000  ", r"EXEC 0x[0-9a-f]{16}"], "NV": [r"=> line \d+: trap", r"active mask 0x[0-9a-f]{8}"]}
  for part in state[dev.name]: assert re.search(part, msg), (part, msg)
  _computes(dev, monkeypatch)


def _fill(dev: Device):
  """Commands for more than the compute ring holds (AMD: NOPs in one write of the PM4 ring; NV: submissions of one
  barrier, two GPFIFO entries each)."""
  if dev.name == "AMD":
    ring = dev.driver.compute
    ring.write([pm4.nop(0x3F00)] * (ring.dwords // 0x3F00 + 2))
  else:
    for _ in range(600): dev.compute_queue().memory_barrier().submit(dev)


def test_full_ring_waits_for_the_engine(dev, monkeypatch):
  gate = Signal(dev, "gate")
  dev.compute_queue().wait(gate, 1).submit(dev)
  opener = threading.Timer(0.3, lambda: setattr(gate, "value", 1))
  opener.start()
  start = time.monotonic()
  _fill(dev)                                              # blocks until the gate opens and the engine drains
  assert time.monotonic() - start > 0.25                  # it waited for the engine
  dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
  dev.synchronize(timeout=10)
  _computes(dev, monkeypatch)


def test_full_ring_times_out_naming_queue_and_sizes(dev, monkeypatch):
  gate = Signal(dev, "gate")
  dev.compute_queue().wait(gate, 1).submit(dev)
  if dev.name == "AMD": dev.driver.compute.timeout = 0.5      # how long a writer waits for ring space
  else: dev.driver.timeout = 0.5
  msg = _raises(lambda: _fill(dev), (TimeoutError, RuntimeError))
  if dev.name == "AMD":
    assert re.search(r"^AMD compute queue \d+: ring full for 0.5 s: \d+ more dwords do not fit in the ring "
                     r"of 65536 dwords \(read pointer \d+, write pointer \d+ dwords\)", msg), msg
  else:
    assert msg.startswith("NV compute channel: its GPFIFO of 1024 entries stayed full for 0.5 s (fence "), msg
    assert f"semaphore acquire [{gate.addr:#x}] >= 1, memory holds 0" in msg
  gate.value = 1                                          # the engine goes on: nothing was lost or corrupted
  dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
  dev.synchronize(timeout=10)
  _computes(dev, monkeypatch)


def test_write_pointer_beyond_the_ring_faults_the_queue(dev, monkeypatch):
  dev.next_timeline()                                     # a value nothing will signal
  if dev.name == "AMD":
    ring = dev.driver.compute
    ring.doorbell[0] = (ring.rptr + ring.dwords + 8) * 4 // ring.unit
    want = (r"queue overrun: write pointer 0x10008 is 0x10008 dwords ahead of the read pointer 0x0: a ring of "
            r"0x10000 dwords holds at most 0xffff")
  else:
    ch = dev.driver.channels["compute"]
    np.frombuffer(dev.driver.view(ch.userd.addr + pb.USERD_GP_PUT, 4), np.uint32)[0] = 5000
    np.frombuffer(dev.driver.view(dev.driver.doorbell + pb.USERMODE_NOTIFY_CHANNEL_PENDING, 4), np.uint32)[0] = ch.token
    want = r"GPPut 5000 is past the end of the 1024-entry GPFIFO"
  _names(_was_reset(dev, lambda: dev.synchronize(timeout=10)), dev, want)
  _computes(dev, monkeypatch)


def test_wait_never_satisfied_is_reported_until_the_value_arrives(dev, monkeypatch):
  gate = Signal(dev, "gate")
  dev.compute_queue().wait(gate, 5).signal(dev.timeline, dev.next_timeline()).submit(dev)
  for _ in range(2):                                      # each synchronize reports it; the queue keeps waiting
    msg = _raises(lambda: dev.synchronize(timeout=0.3), TimeoutError)
    value = dev.timeline_value
    _names(msg, dev, rf"waited 0.3 s for \[{dev.timeline.addr:#x}\] >= {value}, it is {value - 1}",
           rf"\[{gate.addr:#x}\].* >= (0x)?5\b", r"memory holds (0x)?0\b")
  gate.value = 5
  dev.synchronize(timeout=10)
  _computes(dev, monkeypatch)


@pytest.mark.parametrize("seed", [1, 2])
def test_corrupted_command_stream_resets_the_queue(dev, monkeypatch, seed):
  rng = random.Random(seed)
  words = [rng.getrandbits(32) for _ in range(64)]
  if dev.name == "AMD": dev.driver.compute.write([words])     # straight into the PM4 ring
  else: dev.driver.submit("compute", Encoded(words))           # one pushbuffer segment
  dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
  want = {"AMD": r"stopped at ring dword 0x0: .*dmesg: compute queue \d+ \(PM4, ring at 0x[0-9a-f]+\): ring dword 0x0: "
                 r"(dword 0x[0-9a-f]+ is not a PM4 type-3 header|unknown PM4 packet OPCODE_0x[0-9a-f]+)",
          "NV": r"ROBUST_CHANNEL_PBDMA_ERROR.*at GPFIFO entry \d+: (method 0x[0-9a-f]+ at 0x[0-9a-f]+ has \d+ data "
                r"words|unknown pushbuffer opcode \d+ in header 0x[0-9a-f]+)"}
  _names(_was_reset(dev, lambda: dev.synchronize(timeout=10)), dev, want[dev.name])
  _computes(dev, monkeypatch)


def test_undecodable_sdma_packet_resets_the_copy_queue_within_a_second(monkeypatch):
  """No event reaches the process when an SDMA engine meets a packet it cannot decode (amdgpu keeps the illegal-
  instruction interrupt): the driver sees its read pointer stand at a packet it does not decode and reports that
  within a second, where it used to wait for the 30 s timeout; the queues are recreated and the device computes."""
  dev = _fresh("AMD")
  try:
    src, dst = dev.driver.alloc(4096, "gtt"), dev.driver.alloc(4096, "gtt")
    dev.driver.copy.write([[0x000000FF]])        # op 255: no SDMA packet
    dev.copy_queue().copy(dst.addr, src.addr, 4096).signal(dev.timeline, dev.next_timeline()).submit(dev)
    start = time.monotonic()
    msg = _was_reset(dev, lambda: dev.synchronize(timeout=10))
    assert time.monotonic() - start < 5, msg
    for part in (r"^AMD: GPU copy queue stopped at a packet its engine cannot decode", r"copy queue \d+ stopped at ring "
                 r"dword 0x[0-9a-f]+: undecodable packet \(unknown SDMA packet: header 0x000000ff", r"=> 0x[0-9a-f]+ undecodable"):
      assert re.search(part, msg), (part, msg)
    _computes(dev, monkeypatch)
  finally:
    dev.driver.close()


# ---- kernels written to fault: the report names the command, the kernel and the allocation ----

def test_endless_kernel_is_a_runaway_named_with_its_command(dev, monkeypatch):
  """A kernel that branches to itself: the emulated GPU stops it as a runaway (its instruction budget, lowered here so
  the test takes a second) and the report names the kernel and the command the queue was in."""
  from baregrad.drivers.emu import ptx as ptx_emu, rdna3
  monkeypatch.setattr(rdna3, "MAX_STEPS", 20_000)
  monkeypatch.setattr(ptx_emu, "MAX_STEPS", 20_000)
  # AMD: s_branch -1 (SOPP 0x17F << 23 | op 0x20 << 16 | simm16 0xFFFF: to itself); NV: a PTX branch to itself
  patch = (0xBFA0FFFF).to_bytes(4, "little") if dev.name == "AMD" else \
    (lambda src: src.replace("  ret;", "$L_spin:\n  bra.uni $L_spin;\n  ret;"))
  _launch(dev, _kernel(dev, patch), dev.driver.alloc(4 * 64).addr)
  start = time.monotonic()
  msg = _raises(lambda: dev.synchronize(timeout=10))
  assert time.monotonic() - start < 10
  _names(msg, dev, "E_64", r"budget|endless loop|runaway", r"first not done #\d+ \(kernel E_64")


def test_store_past_the_end_names_the_allocation(dev, monkeypatch):
  """The kernel's output argument points 64 bytes before the end of an allocation's mapping (NV maps video memory in
  large pages: the end of the mapping, not of the bytes asked for), so its 256-byte store runs past it into unmapped
  memory: the fault names the address, says it is in no allocation, and names the launch. (Past the bytes asked for
  but inside the mapping nothing faults, on hardware either.)"""
  kernel = _kernel(dev)
  src = dev.driver.alloc(4 * 64)
  # an allocation whose mapping is followed by no live one: where earlier tests' buffers were freed, the next can land
  # just before a live buffer (or a ring), and the store would write into that instead of faulting
  taken = []
  for _ in range(64):
    out = dev.driver.alloc(4096)
    end = out.addr + (out.mapped if dev.name == "NV" else out.size)
    if not any(dev.driver.describe_address(end + d).startswith("in a live") for d in (0, 255)): break
    taken.append(out)
  else: pytest.fail("no allocation with unmapped memory after it in 64 tries")
  after = dev.driver.alloc(4096)          # (NV places video memory back to back: the next one is freed again)
  if after.addr == end: dev.driver.free(after)
  args = dev.kernargs.put([end - 64, src.addr])
  dev.compute_queue().exec(kernel, args, kernel.meta["global_size"], kernel.meta["local_size"]) \
    .signal(dev.timeline, dev.next_timeline()).submit(dev)
  msg = _raises(lambda: dev.synchronize(timeout=10))
  _names(msg, dev, "E_64", r"memory (page )?fault", r"write|store|st\.global", r"first not done #\d+ \(kernel E_64")
  address = int(re.search(r"fault at (?:address )?(0x[0-9a-f]+)|at (0x[0-9a-f]+) is outside every mapping", msg).group(
    1 if dev.name == "AMD" else 2), 16)
  assert end - 64 <= address < end + 256, (hex(address), hex(end), msg)
  assert re.search(r"in no allocation|freed [\d.]+ s ago: a use after free", msg), msg
  # the launch that did not finish, with its buffers by allocation
  assert re.search(r"first not done #\d+ \(kernel E_64 [^;]*; buffers 0: 0x[0-9a-f]+ in a live [\w ]+ allocation of 4096 "
                   r"bytes at 0x[0-9a-f]+, offset 0x[0-9a-f]+", msg), msg
  # the wave (AMD) / warp (NV) at the fault: the code around the store, its lanes, the registers it names
  state = {"AMD": [r"=> 0x[0-9a-f]+  global_store_b32 (v\d+), (v\d+), s\[\d+:\d+\]", r"EXEC 0x[0-9a-f]{16} \(\d+ lanes active\)",
                   r"registers it names: v\d+ = lane 0: 0x[0-9a-f]+"],
           "NV": [r"=> line \d+: st\.global\.f32 \[(%rd\d+)\], %f\d+", r"active mask 0x[0-9a-f]{8} \(\d+ threads ran it\)",
                  r"registers it names: %rd\d+ = thread 0: 0x[0-9a-f]+"]}[dev.name]
  for part in state: assert re.search(part, msg), (part, msg)
  for m in taken: dev.driver.free(m)


@pytest.mark.parametrize("threads", [1, 4])
def test_cpu_kernel_that_never_returns_is_named_within_the_timeout(threads):
  """A CPU kernel that spins until the host releases it (every chunk of a multi-threaded one: the waiting host thread,
  which runs chunks of the kernel in flight, must not take one that never returns): the wait times out within its
  timeout and names the command processor's position, the kernel running there and the last command done; the
  queues' dump shows it; once released, the device computes again."""
  from baregrad.drivers.cpu.driver import CPUDriver
  import numpy as np
  dev = Device("CPU", CPUDriver())
  try:
    flag = dev.driver.alloc(8)
    (item,) = (Tensor(np.arange(64, dtype=np.float32), device="CPU") + 1).schedule()
    prog = item.program
    spin = f"  while (!*(volatile unsigned long long *){flag.addr:#x}ULL) {{}}\n"
    source = prog.source.replace("long long core) {\n", "long long core) {\n" + spin, 1)
    assert source != prog.source
    spinning = dataclasses.replace(prog, binary=dev.driver.compile(source), source=source, handle=None,
                                   meta={**prog.meta, "threads": threads}).load(dev)
    out, inp = dev.driver.alloc(256), dev.driver.alloc(256)
    dev.compute_queue().signal(dev.timeline, dev.next_timeline()).submit(dev)
    dev.synchronize(timeout=10)
    args = dev.kernargs.put([out.addr, inp.addr])
    dev.compute_queue().exec(spinning, args).signal(dev.timeline, dev.next_timeline()).submit(dev)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e: dev.synchronize(timeout=0.5)
    assert time.monotonic() - start < 2
    msg = str(e.value)
    assert msg.startswith("CPU: waited 0.5 s") and re.search(r"first not done #\d+ \(kernel E_64\)", msg), msg
    assert re.search(r"last command done #\d+ \(signal \[0x[0-9a-f]+\] = 1\)", msg), msg
    assert re.search(r"EXEC(_MT)? fn=0x[0-9a-f]+ args=", e.value.queues), e.value.queues
    dev.driver.view(flag.addr, 8)[:] = (1).to_bytes(8, "little")
    dev.synchronize(timeout=10)
    assert "every command done" in dev.driver.progress_report()
  finally:
    dev.driver.view(flag.addr, 8)[:] = (1).to_bytes(8, "little")
    dev.driver.close()


CPU_FAULTS = {   # C inserted at the top of the kernel, the signal the report names, whether the address is reported
  "unmapped store": ("  *(volatile float *)0xdead0000ULL = 1.0f;\n", r"SIGSEGV \(a memory access where nothing is mapped for it\) "
                     r"at address 0xdead0000 \(header 0x[0-9a-f]+\) at ring position \d+ \(ring word \d+\) \(in no memory of "
                     r"this device\)"),
  "illegal instruction": ("  __builtin_trap();\n", r"SIGILL \(an illegal instruction\)"),
  "integer division by zero": ("  { volatile int seven = 7, zero = 0; volatile int x = seven / zero; (void)x; }\n",
                               r"SIGFPE \(an arithmetic fault"),
}


@pytest.mark.parametrize("case", list(CPU_FAULTS))
@pytest.mark.parametrize("threads", [1, 4])
def test_cpu_kernel_fault_stops_the_kernel_not_the_process(case, threads):
  """A CPU kernel that stores to an unmapped address, runs an illegal instruction or divides an integer by zero (in one
  chunk of a multi-threaded kernel: on a helper thread or the worker): the command processor faults like a GPU's MMU
  would, and the error names the signal, the address, the command and the kernel; the process goes on."""
  from baregrad.drivers.cpu.driver import CPUDriver
  from baregrad.drivers.cpu.processor import ProcessorFault
  code, want = CPU_FAULTS[case]
  dev = Device("CPU", CPUDriver())
  try:
    (item,) = (Tensor(np.arange(64, dtype=np.float32), device="CPU") + 1).schedule()
    prog = item.program
    body = code if threads == 1 else f"  if (core == {threads - 1}) {{\n{code}  }}\n"
    source = prog.source.replace("long long core) {\n", "long long core) {\n" + body, 1)
    assert source != prog.source
    bad = dataclasses.replace(prog, binary=dev.driver.compile(source), source=source, handle=None,
                              meta={**prog.meta, "threads": threads}).load(dev)
    out, inp = dev.driver.alloc(256), dev.driver.alloc(256)
    dev.compute_queue().exec(bad, dev.kernargs.put([out.addr, inp.addr])).signal(dev.timeline, dev.next_timeline()).submit(dev)
    start = time.monotonic()
    with pytest.raises(ProcessorFault) as e: dev.synchronize(timeout=10)
    assert time.monotonic() - start < 1
    msg = str(e.value)
    assert re.search(want, msg) and re.search(r"first not done #\d+ \(kernel E_64\)", msg), msg
    assert f"{'EXEC_MT' if threads > 1 else 'EXEC'} packet" in msg, msg
    with pytest.raises(ProcessorFault): dev.synchronize(timeout=10)      # it stays reported
  finally:
    dev.driver.close()
  np.testing.assert_array_equal((Tensor([1.0, 2.0], device="CPU") * 2).numpy(), [2.0, 4.0])   # the process goes on


def test_cpu_kernel_storing_past_its_buffer_end():
  """The kernel's output points 64 bytes before the end of the first page of a two-page buffer whose second page the
  test made inaccessible (mprotect PROT_NONE, as a GPU's unmapped page): its 256-byte store faults there, and the
  report names the address inside this device's memory at its offset, the command and the kernel."""
  import ctypes
  from baregrad.drivers.cpu.driver import CPUDriver
  from baregrad.drivers.cpu.processor import ProcessorFault
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
  dev = Device("CPU", CPUDriver())
  out = None
  try:
    (item,) = (Tensor(np.arange(64, dtype=np.float32), device="CPU") + 1).schedule()
    kernel = item.program.load(dev)
    src, out = dev.driver.alloc(256), dev.driver.alloc(8192)
    end = out.addr + 4096
    assert libc.mprotect(end, 4096, 0) == 0, ctypes.get_errno()          # PROT_NONE
    dev.compute_queue().exec(kernel, dev.kernargs.put([end - 64, src.addr])).signal(dev.timeline, dev.next_timeline()).submit(dev)
    with pytest.raises(ProcessorFault) as e: dev.synchronize(timeout=10)
    msg = str(e.value)
    address = int(re.search(r"SIGSEGV \(a memory access where nothing is mapped for it\) at address (0x[0-9a-f]+)", msg).group(1), 16)
    assert end <= address < end + 256, (hex(address), hex(end), msg)
    assert f"(in memory of this device at {out.addr:#x}, offset {address - out.addr:#x})" in msg, msg
    assert re.search(r"first not done #\d+ \(kernel E_64\)", msg), msg
  finally:
    if out is not None: libc.mprotect(out.addr + 4096, 4096, 3)        # PROT_READ | PROT_WRITE again
    dev.driver.close()


def test_a_fault_outside_kernels_still_ends_the_process():
  """The CPU device's fault handler takes only faults inside kernels: any other goes to the handler installed before
  it (here Python's faulthandler, which prints the traceback) and ends the process with SIGSEGV, as without it."""
  import subprocess, sys
  code = ("import ctypes\nfrom baregrad.tensor import Tensor\nprint((Tensor([1.0]) + 1).numpy(), flush=True)\n"
          "ctypes.string_at(0)\nprint('not reached')\n")
  p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=120)
  assert p.returncode == -11 and p.stdout.strip() == "[2.]", (p.returncode, p.stdout, p.stderr[-2000:])
  assert "Fatal Python error: Segmentation fault" in p.stderr and "string_at" in p.stderr, p.stderr[-2000:]
