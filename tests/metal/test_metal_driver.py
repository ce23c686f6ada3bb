"""The Metal driver on the emulated Metal framework (EMU=1): the Driver protocol, queues (dispatch, blit and byte
copies, signals and waits through shared events, timestamps from command buffer times), JIT replay through an
indirect command buffer, faults, what Metal's validation rejects, and no object leaked or over-released.
The whole op suite on it: `EMU=1 DEV=METAL python -m pytest tests/test_ops.py` (drivers/metal/README.md)."""
import re, struct, time
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

if AVAILABLE:
  from baregrad.drivers.emu import metal_framework as mf
  from baregrad.drivers.emu.objc_runtime import runtime, ObjCError
  from baregrad.drivers.metal.driver import MetalDriver, MetalCompileError, CommandBufferError, MetalError
  from baregrad.drivers.metal.objc import NULL
  from baregrad.hcq.driver import Driver
  from baregrad.hcq.queue import HWQueue, Slot


class _Signal:
  def __init__(self, addr, name="s"): self.addr, self.timestamp_addr, self.name = addr, addr + 8, name


class _Program:
  def __init__(self, entry, n_params, variables=(), local=(1, 1, 1)):
    self.entry, self.n_params, self.variables, self.meta, self.name = entry, n_params, variables, {"local_size": local}, "k"


ADD = """#include <metal_stdlib>
using namespace metal;
kernel void add(device float* out [[buffer(0)]], const device float* a [[buffer(1)]], constant long& k [[buffer(2)]],
                uint3 gid [[thread_position_in_grid]]) {
  out[gid.x] = a[gid.x] + (float)k;
}
"""


@pytest.fixture(scope="module")
def driver():
  before = {o.addr for o in runtime().live()}
  d = MetalDriver(mf.EmulatedMetal())
  yield d
  d.close()
  leaked = [o for o in runtime().live() if o.addr not in before]
  assert not leaked, f"the driver left {len(leaked)} objects alive: {leaked[:8]}"


def _u64(d, addr): return struct.unpack_from("<Q", d.view(addr, 8))[0]


def _wait(d, addr, value):
  assert d.wait_value(addr, value, 10), (d.check_faults("METAL"), _u64(d, addr))


def test_implements_the_driver_protocol(driver):
  from test_driver_protocol import signature_problems
  assert signature_problems(Driver, MetalDriver) == []
  assert isinstance(driver, Driver) and driver.name == "METAL" and driver.has_copy_queue is True
  with settings.override(EMU=1): assert MetalDriver.probe()["available"] is True
  with settings.override(EMU=0):
    import sys
    if sys.platform != "darwin": assert "macOS" in MetalDriver.probe()["reason"]


def test_encode_is_pure_with_whole_word_patches(driver):
  mem = driver.alloc(4096)
  sig = _Signal(mem.addr)
  cmds = [("copy", Slot("dst"), Slot("src") + 64, 128), ("barrier",), ("wait", sig, Slot("gate")),
          ("signal", sig, Slot("value")), ("timestamp", _Signal(mem.addr + 16))]
  first, again = driver.encode("copy", cmds), driver.encode("copy", cmds)
  assert first.words == again.words and {(p.shift, p.width) for _, p in first.patches} == {(0, 64)}
  assert all(first.words[i] == 0 for i, _ in first.patches)
  driver.free(mem)


def test_copies_signals_waits_and_timestamps(driver):
  n = 4099
  a, b, c, sigs = driver.alloc(n + 8), driver.alloc(n + 8), driver.alloc(n + 8), driver.alloc(4096)
  data = np.random.default_rng(0).integers(0, 256, n + 8, dtype=np.uint8)
  driver.view(a.addr, n + 8)[:] = data.tobytes()
  gate, done, t0, t1 = (_Signal(sigs.addr + 16 * i) for i in range(4))
  cmds = [("wait", gate, 5), ("timestamp", t0), ("copy", b.addr, a.addr, 4096), ("copy", c.addr + 1, a.addr + 3, n),
          ("barrier",), ("timestamp", t1), ("signal", done, 9)]
  driver.submit("copy", driver.encode("copy", cmds))
  time.sleep(0.05)
  assert _u64(driver, done.addr) == 0                    # held at the gate: the host has not written it
  struct.pack_into("<Q", driver.view(gate.addr, 8), 0, 5)
  _wait(driver, done.addr, 9)
  assert bytes(driver.view(b.addr, 4096)) == data[:4096].tobytes()              # blit
  assert bytes(driver.view(c.addr + 1, n)) == data[3:3 + n].tobytes()           # unaligned: the byte-copy kernel
  ts0, ts1 = _u64(driver, t0.timestamp_addr), _u64(driver, t1.timestamp_addr)
  assert 0 < ts0 <= ts1 <= time.monotonic_ns()
  for m in (a, b, c, sigs): driver.free(m)


def test_kernel_launch_and_indirect_replay(driver):
  entry, program = driver.load_program(ADD.encode(), "add")
  out, src, args, sig = driver.alloc(1024), driver.alloc(1024), driver.alloc(64), driver.alloc(64)
  np.frombuffer(driver.view(src.addr, 1024), np.float32)[:] = np.arange(256, dtype=np.float32)
  done = _Signal(sig.addr)
  prog = _Program(entry, 2, ("k",), (64, 1, 1))
  struct.pack_into("<3Q", driver.view(args.addr, 24), 0, out.addr, src.addr, 3)
  driver.submit("compute", driver.encode("compute", [("exec", prog, args.addr, (4, 1, 1), (1, 1, 1)), ("signal", done, 1)]))
  _wait(driver, done.addr, 1)
  np.testing.assert_array_equal(np.frombuffer(driver.view(out.addr, 1024), np.float32), np.arange(256) + 3)
  # a bound queue: the launch becomes an ICB command; a replay re-binds changed buffers and variables
  bound = driver.bind("compute", driver.encode("compute", [("exec", prog, args.addr, (4, 1, 1), (1, 1, 1)),
                                                           ("signal", done, Slot("v"))]))
  other = driver.alloc(1024)
  executed = []
  original = mf._execute
  mf._execute = lambda cmd: (executed.append(cmd[0]), original(cmd))[1]
  try:
    for k, target in enumerate((out, other, out)):
      struct.pack_into("<3Q", driver.view(args.addr, 24), 0, target.addr, src.addr, 10 * k)
      enc = driver.encode("compute", [("exec", prog, args.addr, (4, 1, 1), (1, 1, 1)), ("signal", done, Slot("v"))])
      driver.submit_bound("compute", bound, [(i, 2 + k) for i, _ in enc.patches])
      _wait(driver, done.addr, 2 + k)
      np.testing.assert_array_equal(np.frombuffer(driver.view(target.addr, 1024), np.float32), np.arange(256) + 10 * k)
  finally:
    mf._execute = original
  assert executed.count("icb") == 3 and "dispatch" not in executed
  for m in (out, src, args, sig, other): driver.free(m)
  driver.unload_program(program)


def test_indirect_replay_with_a_symbolic_grid(driver):
  """A launch whose threadgroup count is a slot (a grid that depends on a Variable): each replay dispatches the count
  it is given (the ICB command is encoded again when it changes), so the threads past it write nothing."""
  entry, program = driver.load_program(ADD.encode(), "add")
  out, src, args, sig = driver.alloc(1024), driver.alloc(1024), driver.alloc(64), driver.alloc(64)
  np.frombuffer(driver.view(src.addr, 1024), np.float32)[:] = np.arange(256, dtype=np.float32)
  done = _Signal(sig.addr)
  prog = _Program(entry, 2, ("k",), (64, 1, 1))
  cmds = [("exec", prog, args.addr, (Slot("g"), 1, 1), (1, 1, 1)), ("signal", done, Slot("v"))]
  bound = driver.bind("compute", driver.encode("compute", cmds))
  enc = driver.encode("compute", cmds)
  for k, groups in enumerate((1, 3, 2, 4)):
    o = np.frombuffer(driver.view(out.addr, 1024), np.float32)
    o[:] = -1
    struct.pack_into("<3Q", driver.view(args.addr, 24), 0, out.addr, src.addr, k)
    vals = {"g": groups, "v": 2 + k}
    driver.submit_bound("compute", bound, [(i, part.resolve(vals)) for i, part in enc.patches])
    _wait(driver, done.addr, 2 + k)
    want = np.full(256, -1, np.float32)
    want[:64 * groups] = np.arange(64 * groups) + k
    np.testing.assert_array_equal(o, want)
  for m in (out, src, args, sig): driver.free(m)
  driver.unload_program(program)


SCALE = ADD.replace("void add(", "void scale(").replace("a[gid.x] + (float)k", "a[gid.x] * (float)k")


@pytest.mark.parametrize("apple_family", [8, 9])
def test_icb_replay_before_apple9_dispatches_each_pipeline_first(apple_family):
  """M1/M2 (families before Apple9) crash in an ICB command whose pipeline the encoder did not dispatch itself first:
  the driver dispatches each pipeline of a run once with no threadgroups there (the emulated Apple8 device faults
  without it); Apple9 needs none."""
  before = {o.addr for o in runtime().live()}
  d = MetalDriver(mf.EmulatedMetal(apple_family=apple_family))
  try:
    assert ("Apple9" in d.families, "Apple8" in d.families) == (apple_family == 9, True)
    assert d.icb_pipeline_fix is (apple_family < 9)
    (add, _), (scale, _) = d.load_program(ADD.encode(), "add"), d.load_program(SCALE.encode(), "scale")
    src, out, sig, args = d.alloc(1024), d.alloc(1024), d.alloc(64), d.alloc(64)
    np.frombuffer(d.view(src.addr, 1024), np.float32)[:] = np.arange(256, dtype=np.float32)
    struct.pack_into("<6Q", d.view(args.addr, 48), 0, out.addr, src.addr, 5, out.addr, out.addr, 3)
    done = _Signal(sig.addr)
    cmds = [("exec", _Program(add, 2, ("k",), (64, 1, 1)), args.addr, (4, 1, 1), (1, 1, 1)),
            ("exec", _Program(scale, 2, ("k",), (64, 1, 1)), args.addr + 24, (4, 1, 1), (1, 1, 1)),
            ("signal", done, Slot("v"))]
    enc = d.encode("compute", cmds)
    bound = d.bind("compute", enc)
    executed, original = [], mf._execute
    mf._execute = lambda cmd: (executed.append(cmd[0] if cmd[0] != "dispatch" else cmd[3]), original(cmd))[1]
    try:
      d.submit_bound("compute", bound, [(i, 1) for i, _ in enc.patches])
      _wait(d, done.addr, 1)
    finally:
      mf._execute = original
    np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 1024), np.float32), (np.arange(256) + 5) * 3)
    assert executed.count((0, 0, 0)) == (2 if apple_family < 9 else 0) and executed.count("icb") == 1
    if apple_family < 9:    # without the zero-size dispatches the emulated M2 faults, as the real one crashes
      d.icb_pipeline_fix = False
      d.submit_bound("compute", bound, [(i, 2) for i, _ in enc.patches])
      assert d.wait_value(done.addr, 2, 10) is False
      with pytest.raises(CommandBufferError, match=r"GPU fault in indirect command 0 \(add\): on an Apple8 GPU"):
        d.check_faults("METAL")
    for m in (src, out, sig, args): d.free(m)
    del bound
  finally:
    d.close()
  import gc; gc.collect()
  leaked = [o for o in runtime().live() if o.addr not in before]
  assert not leaked, leaked[:8]


def test_emulated_families_are_checked():
  with pytest.raises(ValueError, match="apple_family 6 is not emulated"): mf.EmulatedMetal(apple_family=6)


def test_compile_error_names_the_kernel_and_the_compiler_output(driver):
  with pytest.raises(MetalCompileError, match=r"(?s)rejected kernel broken: .*(undeclared|not declared)"):
    driver.load_program(b"#include <metal_stdlib>\nkernel void broken(device float* a [[buffer(0)]]) { a[0] = nope; }",
                        "broken")


WILD = """#include <metal_stdlib>
using namespace metal;
kernel void wild(device float* out [[buffer(0)]], uint3 gid [[thread_position_in_grid]]) {
  device float *p = (device float *)0xdead0000;
  p[gid.x] = out[gid.x];
}
"""


def test_kernel_storing_outside_its_buffers_fails_its_command_buffer(driver):
  """A kernel that stores to an address no buffer holds: its command buffer ends in error naming the kernel, the
  fault and the address (a GPU page fault, not the end of the process), and the queue goes on."""
  entry, program = driver.load_program(WILD.encode(), "wild")
  mem, sig = driver.alloc(4096), driver.alloc(64)
  struct.pack_into("<Q", driver.view(mem.addr, 8), 0, mem.addr + 1024)
  done = _Signal(sig.addr)
  driver.submit("compute", driver.encode("compute", [("exec", _Program(entry, 1, (), (32, 1, 1)), mem.addr, (2, 1, 1),
                                                      (1, 1, 1)), ("signal", done, 1)]))
  assert driver.wait_value(done.addr, 1, 10) is False
  with pytest.raises(CommandBufferError, match=r"kernel wild: GPU fault: stopped by SIGSEGV \(a memory access where "
                                               r"nothing is mapped for it\) at address 0xdead0000 \(in no buffer of this "
                                               r"device\)"):
    driver.check_faults("METAL")
  driver.submit("compute", driver.encode("compute", [("signal", done, 2)]))     # the queue goes on
  _wait(driver, done.addr, 2)
  for m in (mem, sig): driver.free(m)
  driver.unload_program(program)


SPIN = """#include <metal_stdlib>
using namespace metal;
kernel void spin(device float* out [[buffer(0)]], device const uint* flag [[buffer(1)]]) {
  while (*(volatile device const uint *)flag == 0) {}
  out[0] = 1.0f;
}
"""


def test_kernel_that_does_not_finish_is_named_by_the_timeout():
  """A kernel that spins until the host releases it: a wait on the device times out within its timeout, and the
  report's queue dump names the submission and its kernel; released, everything completes."""
  from baregrad.hcq.device import Device
  dev = Device("METAL", MetalDriver(mf.EmulatedMetal()))
  d = dev.driver
  try:
    entry, program = d.load_program(SPIN.encode(), "spin")
    mem = d.alloc(4096)
    struct.pack_into("<2Q", d.view(mem.addr, 16), 0, mem.addr + 1024, mem.addr + 2048)
    dev.compute_queue().exec(_Program(entry, 2), mem.addr, (1, 1, 1), (1, 1, 1)) \
      .signal(dev.timeline, dev.next_timeline()).submit(dev)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e: dev.synchronize(timeout=0.5)
    assert time.monotonic() - start < 2
    assert re.search(r"compute queue: \d+ of \d+ command buffers completed\n  a submission ending with command buffer "
                     r"\d+:\n    #0 exec kernel spin, pipeline=0x[0-9a-f]+", e.value.queues), e.value.queues
    struct.pack_into("<I", d.view(mem.addr + 2048, 4), 0, 1)
    dev.synchronize(timeout=10)
    assert struct.unpack_from("<f", d.view(mem.addr + 1024, 4))[0] == 1.0
    d.free(mem)
    d.unload_program(program)
  finally:
    d.close()


def test_failed_command_buffer_is_reported_once(driver, monkeypatch):
  entry, program = driver.load_program(ADD.encode(), "add")
  mem, sig = driver.alloc(4096), driver.alloc(64)
  struct.pack_into("<3Q", driver.view(mem.addr, 24), 0, mem.addr + 1024, mem.addr + 2048, 1)
  def boom(*args): raise RuntimeError("the GPU faulted")
  monkeypatch.setattr(mf.MTLEmuComputePipelineState, "run", boom)
  done = _Signal(sig.addr)
  driver.submit("compute", driver.encode("compute", [("exec", _Program(entry, 2, ("k",)), mem.addr, (1, 1, 1), (1, 1, 1)),
                                                     ("signal", done, 1)]))
  assert driver.wait_value(done.addr, 1, 10) is False
  with pytest.raises(CommandBufferError, match="status error: command buffer failed: RuntimeError: the GPU faulted") as e:
    driver.check_faults("METAL")
  assert e.value.queues_reset is True
  driver.check_faults("METAL")                            # reported once; the queue goes on
  monkeypatch.undo()
  driver.submit("compute", driver.encode("compute", [("signal", done, 2)]))
  _wait(driver, done.addr, 2)
  for m in (mem, sig): driver.free(m)
  driver.unload_program(program)


def test_a_command_failing_inside_an_open_encoder_raises_its_own_error(driver):
  """An exec whose arguments lie outside every buffer, after one that opened a compute encoder: the driver's MetalError,
  not a message to the (autoreleased, already freed) encoder while the command buffer is dropped."""
  entry, program = driver.load_program(ADD.encode(), "add")
  mem = driver.alloc(64)
  ok = _Program(entry, 2, ("k",), (1, 1, 1))
  with pytest.raises(MetalError, match="not inside a buffer this driver allocated"):
    driver.submit("compute", driver.encode("compute", [("exec", ok, mem.addr, (1, 1, 1), (1, 1, 1)),
                                                       ("exec", ok, mem.addr + (1 << 40), (1, 1, 1), (1, 1, 1))]))
  sig = _Signal(mem.addr)
  driver.submit("compute", driver.encode("compute", [("signal", sig, 1)]))    # the queue goes on
  _wait(driver, sig.addr, 1)
  driver.free(mem)
  driver.unload_program(program)


def test_launch_limits_are_checked_by_the_driver(driver):
  entry, program = driver.load_program(ADD.encode(), "add")
  mem = driver.alloc(64)
  big = _Program(entry, 2, ("k",), (2048, 1, 1))
  with pytest.raises(MetalError, match="2048, 1, 1.*at most 1024"):
    driver.submit("compute", driver.encode("compute", [("exec", big, mem.addr, (1, 1, 1), (1, 1, 1))]))
  # a command buffer already begun is dropped (not leaked: the fixture checks); one committed before it still runs
  sig = _Signal(mem.addr)
  with pytest.raises(MetalError, match="at most 1024"):
    driver.submit("compute", driver.encode("compute", [("signal", sig, 1), ("timestamp", _Signal(mem.addr + 16)),
                                                       ("signal", sig, 2), ("exec", big, mem.addr, (1, 1, 1), (1, 1, 1))]))
  _wait(driver, sig.addr, 1)
  driver.submit("compute", driver.encode("compute", [("signal", sig, 3)]))
  _wait(driver, sig.addr, 3)
  driver.free(mem)
  driver.unload_program(program)


# ---- what Metal's API validation rejects, sent straight through the bridge ----

@pytest.fixture
def objc(driver):
  rt = driver.rt
  with rt.pool(): yield rt


def test_validation_of_encoders_and_command_buffers(driver, objc):
  rt, dev = objc, driver.device
  cb = rt.send(driver.queues["compute"], "commandBuffer")
  enc = rt.send(cb, "computeCommandEncoder")
  with pytest.raises(ObjCError, match="still encoding"): rt.send(cb, "blitCommandEncoder")
  with pytest.raises(ObjCError, match="index 31 >= 31"): rt.send(enc, "setBuffer:offset:atIndex:", driver.copy_kernel.pipeline, 0, 31)
  with pytest.raises(ObjCError, match="no compute pipeline state"): rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
  rt.send(enc, "setComputePipelineState:", driver.copy_kernel.pipeline)
  with pytest.raises(ObjCError, match="no buffer bound at index 0"):
    rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
  buf = rt.send(dev, "newBufferWithLength:options:", 1024, 0)
  for i in range(2): rt.send(enc, "setBuffer:offset:atIndex:", buf, 1, i)
  rt.send(enc, "setBuffer:offset:atIndex:", buf, 8, 2)       # `constant ulong& n`: constant buffers at 256-byte offsets
  with pytest.raises(ObjCError, match=r"buffer 2 \(constant ulong& n\) is bound at offset 8, which is not a multiple of 256"):
    rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
  with pytest.raises(ObjCError, match="still encoding"): rt.send(cb, "commit")
  rt.send(enc, "endEncoding")
  blit = rt.send(cb, "blitCommandEncoder")
  with pytest.raises(ObjCError, match="multiples of 4"):
    rt.send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", buf, 1, buf, 8, 4)
  rt.send(blit, "endEncoding")
  rt.send(cb, "commit")
  with pytest.raises(ObjCError, match="already committed"): rt.send(cb, "computeCommandEncoder")
  rt.send(cb, "waitUntilCompleted")
  rt.release(buf)
  runtime().errors.clear()


def test_validation_of_indirect_command_buffers(driver, objc):
  rt = objc
  fn_lib = ADD
  desc = rt.new("MTLIndirectCommandBufferDescriptor")
  rt.send(desc, "setCommandTypes:", 32)
  rt.send(desc, "setInheritBuffers:", 0)
  rt.send(desc, "setInheritPipelineState:", 0)
  rt.send(desc, "setMaxKernelBufferBindCount:", 2)
  icb = rt.send(driver.device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc, 1, 0)
  rt.release(desc)
  command = rt.send(icb, "indirectComputeCommandAtIndex:", 0)
  # a pipeline made without supportIndirectCommandBuffers
  options = rt.new("MTLCompileOptions")
  lib = rt.send(driver.device, "newLibraryWithSource:options:error:", rt.nsstring(fn_lib), options, rt.out())
  fn = rt.send(lib, "newFunctionWithName:", rt.nsstring("add"))
  pdesc = rt.new("MTLComputePipelineDescriptor")
  rt.send(pdesc, "setComputeFunction:", fn)
  plain = rt.send(driver.device, "newComputePipelineStateWithDescriptor:options:reflection:error:", pdesc, 0, None, rt.out())
  with pytest.raises(ObjCError, match="supportIndirectCommandBuffers"): rt.send(command, "setComputePipelineState:", plain)
  rt.send(command, "setComputePipelineState:", driver.copy_kernel.pipeline)
  buf = rt.send(driver.device, "newBufferWithLength:options:", 64, 0)
  with pytest.raises(ObjCError, match="maxKernelBufferBindCount 2"): rt.send(command, "setKernelBuffer:offset:atIndex:", buf, 0, 2)
  # executing a command whose buffers were not made resident fails the command buffer
  for i in range(2): rt.send(command, "setKernelBuffer:offset:atIndex:", buf, 0, i)
  n = rt.send(driver.device, "newBufferWithLength:options:", 8, 0)
  rt.send(command, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
  cb = rt.send(driver.queues["compute"], "commandBuffer")
  enc = rt.send(cb, "computeCommandEncoder")
  rt.send(enc, "executeCommandsInBuffer:withRange:", icb, (0, 1))
  rt.send(enc, "endEncoding")
  rt.send(cb, "commit")
  rt.send(cb, "waitUntilCompleted")
  assert rt.send(cb, "status") == 5 and "useResource" in rt.error_text(rt.send(cb, "error"))
  for obj in (options, lib, fn, pdesc, plain, buf, n, icb): rt.release(obj)
  runtime().errors.clear()


def test_shared_events_only_increase(driver, objc):
  rt = objc
  event = rt.send(driver.device, "newSharedEvent")
  rt.send(event, "setSignaledValue:", 5)
  rt.send(event, "setSignaledValue:", 3)                 # a smaller value does not take effect
  assert rt.send(event, "signaledValue") == 5
  cb = rt.send(driver.queues["compute"], "commandBuffer")
  rt.send(cb, "encodeSignalEvent:value:", event, 4)
  rt.send(cb, "commit")
  rt.send(cb, "waitUntilCompleted")
  assert rt.send(cb, "status") == 5 and "events only increase" in rt.error_text(rt.send(cb, "error"))
  assert rt.send(event, "waitUntilSignaledValue:timeoutMS:", 5, 1) and not rt.send(event, "waitUntilSignaledValue:timeoutMS:", 6, 1)
  rt.release(event)


# ---- the device through the Tensor API (hcq + codegen + MSL + the emulator) ----

def test_tensor_ops_and_jit_on_the_metal_device():
  from baregrad.hcq.device import Device
  from baregrad.tensor import Tensor, dtypes
  from baregrad.tensor.jit import jit
  from baregrad.tensor.tensor import Variable
  if "METAL" in Device._open: pytest.skip("a METAL device is already open in this process")
  before = {o.addr for o in runtime().live()}
  with settings.override(EMU=1):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    ta, tb = Tensor(a, device="METAL"), Tensor(b, device="METAL")
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ta.sin().numpy(), np.sin(a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ta.cast(dtypes.float16).sum(1).numpy(), a.astype(np.float16).astype(np.float32).sum(1), rtol=5e-3, atol=5e-3)
    np.testing.assert_array_equal((Tensor(np.arange(-5, 5, dtype=np.int8), device="METAL") // 3).numpy(), np.arange(-5, 5) // 3)
    np.testing.assert_array_equal((ta > 0).where(ta, 0).argmax(1).numpy(), np.maximum(a, 0).argmax(1))
    n = Variable("n", 0, 100)
    f = jit(lambda x, k: (x @ tb).relu() * k)
    for i in range(4):
      x = rng.standard_normal((2, 7)).astype(np.float32)
      np.testing.assert_allclose(f(Tensor(x, device="METAL"), n.bind(i)).numpy(), np.maximum(x @ b, 0) * i, rtol=1e-5, atol=1e-5)
    del f, ta, tb
    Device.get("METAL").close()
  import gc; gc.collect()
  leaked = [o for o in runtime().live() if o.addr not in before]
  assert not leaked and not runtime().errors, (leaked[:8], runtime().errors)


def test_baregrad_smoke_on_the_emulated_device():
  import os, subprocess, sys
  env = dict(os.environ, EMU="1")
  out = subprocess.run([sys.executable, "-m", "baregrad.tools", "smoke", "--device", "METAL"], env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and "all 9 checks passed" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_fast_math_library_leaves_the_process_denormals_alone():
  """-ffast-math would link crtfastmath.o, whose constructor sets FTZ/DAZ for the whole process on load: numpy (and
  the other emulators) would then flush denormals. The shim's fast math is -ffast-math's parts without it."""
  from baregrad.drivers.emu import metal_shim
  src = ("#include <metal_stdlib>\nusing namespace metal;\n"
         "kernel void k(device float *o [[buffer(0)]], uint i [[thread_position_in_grid]]) { o[i] = o[i] * 2.0f; }\n")
  metal_shim.Library(src, fast_math=True)
  assert float(np.float32(1e-39) * np.float32(1.0)) != 0.0
