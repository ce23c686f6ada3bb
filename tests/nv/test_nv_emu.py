"""The NV driver on the emulated RM/UVM + Hopper GPU (EMU=1): object tree, memory, copies, signals, kernels, JIT
replay, and faults that name channel, method and address."""
import time
import numpy as np
import pytest

from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel, GPU_UUID
from baregrad.drivers.encoded import Encoded
from baregrad.drivers.nv import pushbuf as pb
from baregrad.drivers.nv.driver import NVDriver, NVError
from baregrad.hcq.device import Device
from baregrad.hcq.queue import HWQueue
from baregrad.hcq.signal import Signal
from baregrad.tensor import Tensor


@pytest.fixture(scope="module")
def dev():
  """Device "NV" on the emulated kernel interface (what EMU=1 selects), without changing the environment."""
  if "NV" not in Device._open or not Device._open["NV"].driver.k.emulated:
    Device._open["NV"] = Device("NV", NVDriver(kernel=EmulatedNVKernel()))
  return Device._open["NV"]


def test_open_device(dev):
  d = dev.driver
  assert d.k.emulated and d.target == "sm_90" and d.qmd_version == (4, 0) and d.version.startswith("580.")
  assert d.uuid == GPU_UUID and d.compute_class == 0xCBC0 and d.copy_class == 0xC8B5
  client = d.k.clients[d.rm.root]
  assert client[d.channels["compute"].handle].cls == 0xC86F and client[d.group].cls == 0xA06C
  assert client[d.usermode].parent == d.subdevice


def test_alloc_map_and_free(dev):
  d = dev.driver
  m = d.alloc(3 * 4096 + 5)
  assert m.addr % 4096 == 0 and m.addr + m.mapped < 1 << 40
  d.view(m.addr, 8)[:] = b"baregrad"
  assert d.k.gpu.mem.read(m.addr, 8) == b"baregrad"          # the GPU sees the same bytes at the same address
  d.free(m)
  with pytest.raises(Exception): d.k.gpu.mem.read(m.addr, 1)


def test_rm_validation_status_codes(dev):
  d = dev.driver
  from baregrad.drivers.nv.driver import RMError
  with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_PARENT"):
    d.rm.alloc(d.subdevice, 0xA06C)                              # a channel group under a subdevice
  with pytest.raises(RMError, match="NV_ERR_INSERT_DUPLICATE_NAME"):
    d.rm.alloc(d.device, 0x2080, handle=d.subdevice)
  with pytest.raises(RMError, match="NV_ERR_INVALID_CLASS"):
    d.rm.alloc(d.device, 0xC7C0)                                 # Ampere compute on a Hopper GPU


@pytest.mark.parametrize("kind", ["copy", "compute"])
def test_copy_round_trip(dev, kind):
  d = dev.driver
  n = 100_000
  src, dst = d.alloc(n), d.alloc(n)
  data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
  d.view(src.addr, n)[:] = data.tobytes()
  sig = Signal(dev, "copy")
  HWQueue(kind).copy(dst.addr, src.addr, n).signal(sig, 7).submit(dev)
  sig.wait(7, timeout=10)
  assert bytes(d.view(dst.addr, n)) == data.tobytes()


def test_signal_wait_and_timestamp(dev):
  a, b, t = Signal(dev, "a"), Signal(dev, "b"), Signal(dev, "t")
  before = time.time_ns()
  HWQueue("compute").wait(a, 3).timestamp(t).signal(b, 1 << 40).submit(dev)
  time.sleep(0.05)
  assert b.value == 0                                           # blocked on the acquire
  a.value = 3
  b.wait(1 << 40, timeout=10)
  assert b.value == 1 << 40 and before < t.timestamp <= b.timestamp <= time.time_ns()


def test_tensor_add_and_matmul(dev):
  x = np.random.default_rng(1).standard_normal((48, 40)).astype(np.float32)
  y = np.random.default_rng(2).standard_normal((40, 24)).astype(np.float32)
  np.testing.assert_allclose((Tensor(x, device="NV") + 1.5).numpy(), x + 1.5, rtol=1e-6)
  np.testing.assert_allclose((Tensor(x, device="NV") @ Tensor(y, device="NV")).numpy(), x @ y, rtol=1e-5, atol=1e-5)


def test_jit_replay(dev):
  from baregrad.tensor.jit import jit
  f = jit(lambda a, b: (a * b + a).sum(axis=1))
  rng = np.random.default_rng(3)
  for _ in range(4):
    a, b = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(a, device="NV"), Tensor(b, device="NV")).numpy(), (a * b + a).sum(axis=1), rtol=1e-5, atol=1e-5)
  assert f.graph is not None


def test_encode_has_no_side_effects_and_launches_are_placed_at_submit(dev):
  """encode writes no QMD and takes no launch memory; the SEND_PCAS_A word is a fixup that bind/submit fill in
  with the address of the launch memory they chose, and the QMD + constant bank 0 reach it as inline data (I2M)
  of the same pushbuffer, whose destination and data words are fixups too; a symbolic value's halves are patches
  at SEM_PAYLOAD_LO/HI's data."""
  from baregrad.drivers.nv.driver import Launch, LaunchData
  from baregrad.drivers.nv import qmd
  from baregrad.hcq.queue import Slot
  d = dev.driver
  x = Tensor(np.arange(64, dtype=np.float32), device="NV")
  prog = (x * 2).schedule()[0].program
  out, args, sig = d.alloc(256), d.alloc(64), Signal(dev, "launch")
  np.frombuffer(d.view(args.addr, 16), np.uint64)[:] = [out.addr, x._buffer().addr]
  arenas = [(a[0].addr, a[1], a[2]) for a in d._arenas]
  enc = d.encode("compute", [("exec", prog, args.addr, prog.meta.get("global_size", (1, 1, 1)), (1, 1, 1)),
                             ("signal", sig, Slot("v"))])
  assert [(a[0].addr, a[1], a[2]) for a in d._arenas] == arenas       # no launch memory taken
  from baregrad.drivers.markers import Marker
  (at, launch), = [(i, f) for i, f in enc.fixups if isinstance(f, Launch)]
  parts = {f.part: i for i, f in enc.fixups if isinstance(f, LaunchData)}
  assert sorted(parts) == ["data", "hi", "lo"] and all(f.launch is launch for _, f in enc.fixups if isinstance(f, LaunchData))
  assert pb.decode_header(enc.words[parts["data"] - 2])[:3] == (pb.SEC_OP_ONE_INC, pb.SUBC_COMPUTE, pb.I2M_LAUNCH_DMA)
  assert [f.what for _, f in enc.fixups if isinstance(f, Marker)] == [f"kernel {prog.name} {tuple(prog.meta.get('global_size', (1, 1, 1)))}x(1, 1, 1)",
                                                                      "signal launch a symbolic value"]
  _, subc, method, count = pb.decode_header(enc.words[at - 1])
  assert (subc, method, count, enc.words[at]) == (pb.SUBC_COMPUTE, pb.SEND_PCAS_A, 1, 0)
  sems = [i for i, w in enumerate(enc.words) if pb.decode_header(w)[2:] == (pb.SEM_ADDR_LO, 5)]
  sem = sems[1]          # the signal's (the first releases the kernel's trace marker)
  assert [(i, part.shift, part.width) for i, part in enc.patches] == [(sem + 3, 0, 32), (sem + 4, 32, 32)]
  words, _, copies = d._place(enc.resolved({"v": 5}), "compute", keep=False)
  assert (words[parts["hi"]] << 32 | words[parts["lo"]]) == words[at] << 8      # the inline write lands on the QMD
  inline = np.array(words[parts["data"]:parts["data"] + qmd.QMD_BYTES // 4], np.uint32).tobytes()
  launched = qmd.read_launch(d.qmd_version, inline)
  assert launched["program"] == prog.entry and launched["cbuf0"] == (words[at] << 8) + qmd.QMD_BYTES
  # bank 0 gets the kernarg words at submit, into the inline data of the pushbuffer
  assert [c[0] for c in copies] == [args.addr, args.addr + 8]
  assert all(4 * parts["data"] + qmd.QMD_BYTES <= c[1] < 4 * len(words) for c in copies)
  before = dict(d.k.gpu.host_written)
  d.submit("compute", enc.resolved({"v": 5}))
  sig.wait(5, timeout=30)
  assert np.array_equal(np.frombuffer(d.view(out.addr, 256), np.float32), np.arange(64, dtype=np.float32) * 2)
  assert d.k.gpu.host_written == before           # the GPU wrote every QMD and constant byte it read


@pytest.fixture
def fresh():
  """A driver on its own emulated GPU: a faulted channel stays stopped, as on hardware."""
  return NVDriver(kernel=EmulatedNVKernel())


def _wait_fault(d, timeout=5.0):
  end = time.monotonic() + timeout
  while d.k.fault() is None and time.monotonic() < end: time.sleep(0.01)
  with pytest.raises(NVError) as e: d.check_faults("NV")
  return str(e.value)


def test_unknown_method_names_channel_and_method(fresh):
  fresh.submit("compute", Encoded([pb.method_header(pb.SUBC_COMPUTE, 0x1234, 1), 0xABCD]))
  msg = _wait_fault(fresh)
  assert "channel 'compute'" in msg and "0x1234" in msg and "HOPPER_COMPUTE_A" in msg


def test_bad_address_names_address(fresh):
  dst = fresh.alloc(4096)
  fresh.submit("copy", fresh.encode("copy", [("copy", dst.addr, 0xDEAD0000, 64)]))
  msg = _wait_fault(fresh)
  assert "channel 'copy'" in msg and "0xdead0000" in msg


def test_unknown_method_surfaces_through_signal_wait():
  from baregrad.hcq.signal import SignalTimeout
  d = NVDriver(kernel=EmulatedNVKernel())
  d.submit("compute", Encoded([pb.method_header(0, 0x00F0, 1), 1]))     # an unknown host method
  addr = d.alloc(16).addr
  assert d.wait_value(addr, 1, timeout=5) is False              # returns early: the GPU faulted
  with pytest.raises(NVError, match="unknown host method 0x00f0"): d.check_faults("NV")


def test_graph_orders_copy_and_compute_queues(dev):
  """A captured graph with copies puts them on the copy channel; per-queue signals keep the order
  (kernel writes A -> copy A to B -> kernel reads B), replay after replay."""
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.graph import GraphExecutor
  from baregrad.hcq.runtime import ExecItem
  from baregrad.compiler.dtype import dtypes
  x = Tensor(np.arange(64, dtype=np.float32), device="NV")
  prog_double = (x * 2).schedule()[0].program
  xb = x._buffer()
  a, b, out = (Buffer("NV", 64, dtypes.float32).ensure_allocated() for _ in range(3))
  items = [ExecItem(prog_double, [a, xb], {}, prog_double.meta),
           ExecItem(None, [b, a], {}, {"name": "copy"}),
           ExecItem(prog_double, [out, b], {}, prog_double.meta)]
  graph = GraphExecutor(items, [xb], [out], capture_serial=10**12)
  assert graph.side_queues, "copies should run on the copy channel"
  for k in range(3):
    inp = Buffer("NV", 64, dtypes.float32).ensure_allocated()
    inp.copyin(memoryview((np.arange(64, dtype=np.float32) + k).view(np.uint8)))
    got = graph.replay([inp], {})[0]
    res = np.empty(64, np.float32)
    got.copyout(memoryview(res.view(np.uint8)))
    np.testing.assert_array_equal(res, (np.arange(64, dtype=np.float32) + k) * 4)
