"""Several devices at once: device names (CPU:i, AMD:i, NV:i), copies between devices ordered by signals, tensors
on several devices (shard / to(devices)), the collectives, and a jitted step containing an allreduce.

The emulated GPUs (AMD:i, NV:i) are opened with EMU=1 inside the test (settings.override): each is an emulated
kernel driver + GPU of its own in this process. Every value is checked against numpy."""
import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.hcq import transfer
from baregrad.hcq.device import Device, canonical
from baregrad.tensor import Tensor, multi
from baregrad.tensor.jit import jit
from baregrad.compiler import schedule as schedule_mod
from baregrad.hcq.multigraph import MultiGraphExecutor


@pytest.fixture(scope="module", autouse=True)
def close_the_devices_opened_here():
  """The devices this module opens (CPU:i, emulated AMD:i / NV:i, each with threads and memory) are closed after it."""
  before = set(Device._open)
  yield
  import gc
  gc.collect()
  for name, dev in list(Device._open.items()):
    if name not in before: dev.close()


def names(kind: str, n: int) -> tuple:
  return tuple(kind if i == 0 else f"{kind}:{i}" for i in range(n))


def opened(*devices) -> tuple:
  """Open the devices (the GPUs emulated) and return their names."""
  with settings.override(EMU=1):
    for d in devices:
      dev = Device.get(d)
      if dev.driver.name != "CPU":
        iface = dev.driver.kernel if dev.driver.name == "AMD" else dev.driver.k
        if not iface.emulated: pytest.skip(f"{d} is a real GPU here; these tests use emulated ones")
  return tuple(devices)


def rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------- step 1: several devices of a kind ----------------
def test_device_names():
  assert [canonical(n) for n in ("cpu", "CPU:0", "amd:1", "NV:2", "nv")] == ["CPU", "CPU", "AMD:1", "NV:2", "NV"]
  with pytest.raises(ValueError, match="index after ':' must be a number"): canonical("AMD:x")
  cpu0, cpu1 = Device.get("CPU"), Device.get("CPU:1")
  assert cpu0 is Device.get("cpu:0") and cpu1 is not cpu0 and cpu1.driver is not cpu0.driver
  opened("AMD", "AMD:1", "NV", "NV:1")
  assert Device.get("AMD").driver.kernel is not Device.get("AMD:1").driver.kernel     # two emulated GPUs
  assert Device.get("NV").driver.k is not Device.get("NV:1").driver.k
  with settings.override(EMU=0):
    with pytest.raises(RuntimeError, match="opens only the first AMD GPU"): Device.get("AMD:7")
  a = rand(5, 3)
  for d in ("CPU:1", "AMD:1", "NV:1"):
    t = Tensor(a, device=d) * 2 + 1
    assert t.device == d
    np.testing.assert_allclose(t.numpy(), a * 2 + 1, rtol=1e-6)


# ---------------- step 2: copies between devices ----------------
PAIRS = [("CPU", "CPU:1", "peer"), ("AMD", "AMD:1", "peer"), ("NV", "NV:1", "peer"), ("AMD", "NV", "peer"),
         ("NV", "AMD:1", "peer"), ("CPU", "AMD", "peer"), ("NV:1", "CPU:1", "peer"), ("CPU:1", "NV:1", "peer")]


@pytest.mark.parametrize("src,dst,path", PAIRS, ids=[f"{s}->{d}" for s, d, _ in PAIRS])
def test_copy_between_devices(src, dst, path):
  opened(src, dst)
  a = rand(37, 3)
  y = ((Tensor(a, device=src) * 2).exp2() + 1).to(dst)       # queued on src, copied, used on dst in one realize
  np.testing.assert_allclose((y * 3).numpy(), (np.exp2(a * 2) + 1) * 3, rtol=1e-5)
  link = transfer.link(Device.get(src), Device.get(dst))
  assert link.path == path
  if path == "peer":   # the copy runs on a queue of a device that maps the other's memory: the AMD SDMA, the NV copy
    # engine (host pages as an RM OS descriptor mapped by UVM), a CPU; the destination's when it can map the source's
    assert link.engine.driver.name in ("AMD", "NV", "CPU") and (link.kind == "copy") == link.engine.driver.has_copy_queue
    assert link.engine.name == dst
    assert link.engine.name in (src, dst) and "addresses" in transfer.copy_path(src, dst)


@pytest.mark.parametrize("src,dst", [("CPU", "CPU:1"), ("AMD", "AMD:1"), ("NV", "NV:1"), ("AMD:1", "NV")])
def test_copy_needs_no_host_synchronization(src, dst, monkeypatch):
  """Realizing work on src, a copy and work on dst never waits on the host; the copy still sees the source's last
  kernel, and an overwrite of the source queued right after it does not reach the copy."""
  opened(src, dst)
  a = rand(64, 5)
  x = Tensor(a, device=src).realize()
  waits = []
  real = Device.synchronize
  monkeypatch.setattr(Device, "synchronize", lambda self, timeout=None: (waits.append(self.name), real(self, timeout))[1])
  y = ((x + 1) * 2).to(dst) * 3
  y.realize()
  x.assign(x * 0 - 7).realize()          # the source written right after the copy was queued
  z = x.to(dst).realize()
  assert waits == [], f"the host synchronized {waits} between the devices' work"
  monkeypatch.undo()
  np.testing.assert_allclose(y.numpy(), (a + 1) * 6, rtol=1e-6)
  np.testing.assert_array_equal(z.numpy(), np.full_like(a, -7))


# ---------------- step 3: tensors on several devices ----------------
@pytest.mark.parametrize("kind,n", [("CPU", 3), ("AMD", 2)])
def test_sharded_tensor_ops(kind, n):
  devs = opened(*names(kind, n))
  a, b = rand(7, 5), rand(5, 3, seed=1)
  x = Tensor(a).shard(devs, axis=0)
  assert x.device == devs and x.shape == (7, 5) and x.uop.arg == (0, multi.split_bounds(7, n))
  w = Tensor(b).to(devs)
  assert w.device == devs and w.uop.op.name == "COPY"
  checks = {
    "elementwise": ((x * 2 + 1).relu(), np.maximum(a * 2 + 1, 0)),
    "sum over the shard axis (allreduce)": (x.sum(0), a.sum(0)),
    "sum over another axis": (x.sum(1), a.sum(1)),
    "max of all": (x.max(), a.max()),
    "softmax over the shard axis": (x.softmax(0), np.exp(a) / np.exp(a).sum(0)),
    "matmul, left sharded": (x @ w, a @ b),
    "matmul, contraction sharded": (Tensor(a).shard(devs, axis=1) @ Tensor(b).shard(devs, axis=0), a @ b),
    "matmul, right sharded": (Tensor(a).to(devs) @ Tensor(b).shard(devs, axis=1), a @ b),
    "reshape keeps rows": (x.reshape(7, 1, 5), a.reshape(7, 1, 5)),
    "reshape merges": (x.reshape(35), a.reshape(35)),
    "permute": (x.permute(1, 0), a.T),
    "expand": (x.reshape(7, 1, 5).expand(7, 2, 5), np.broadcast_to(a.reshape(7, 1, 5), (7, 2, 5))),
    "pad": (x.pad(((1, 2), (0, 1))), np.pad(a, ((1, 2), (0, 1)))),
    "shrink": (x[2:6, 1:], a[2:6, 1:]),
    "flip": (x.flip(0), a[::-1]),
    "gather to one device": ((x * 3).to(devs[-1]), a * 3),
  }
  for what, (got, want) in checks.items():
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=what)
  assert (x * 3).to(devs[-1]).device == devs[-1] and x.sum(0).device == devs


def test_sharded_autograd_and_assign():
  devs = opened("CPU", "CPU:1")
  a, b = rand(9, 4), rand(4, 2, seed=1)
  xa = Tensor(a, requires_grad=True)
  (xa.shard(devs, axis=0) * 3).sum().backward()          # through the shards back to the one-device leaf
  np.testing.assert_allclose(xa.grad.numpy(), np.full_like(a, 3))
  w = Tensor(b).to(devs).realize()
  w.requires_grad = True
  loss = (Tensor(a).shard(devs, axis=0) @ w).square().mean()
  loss.backward()
  np.testing.assert_allclose(w.grad.numpy(), 2 * a.T @ (a @ b) / (9 * 2), rtol=1e-4)
  w.assign(w - w.grad).realize()
  np.testing.assert_allclose(w.numpy(), b - 2 * a.T @ (a @ b) / 18, rtol=1e-4)
  assert [s.op.name for s in w.uop.src] == ["RESHAPE", "RESHAPE"]


# ---------------- step 4: the collectives ----------------
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kind", ["CPU", "AMD", "NV"])
def test_collectives(kind, n):
  devs = opened(*names(kind, n))
  arrs = [rand(7, 5, seed=i) for i in range(n)]          # odd sizes: 35 elements in n chunks
  xs = [Tensor(a, device=d) for a, d in zip(arrs, devs)]
  total = np.sum(arrs, axis=0)
  for ring in (True, False):          # the ring, and the direct exchange small parts take
    ys = multi.allreduce(xs, ring=ring)
    for y, d in zip(ys, devs):
      assert y.device == d
      np.testing.assert_allclose(y.numpy(), total, rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(y.numpy(), ys[0].numpy())      # the same bits on every device
  for y in multi.allreduce(xs, "max"): np.testing.assert_array_equal(y.numpy(), np.max(arrs, axis=0))
  rs = multi.reduce_scatter(xs)
  assert [r.device for r in rs] == list(devs) and [r.shape[0] for r in rs] == [e - b for b, e in multi.split_bounds(35, n)]
  np.testing.assert_allclose(np.concatenate([r.numpy() for r in rs]), total.reshape(-1), rtol=1e-5, atol=1e-6)
  for y in multi.allgather(xs, axis=1): np.testing.assert_array_equal(y.numpy(), np.concatenate(arrs, 1))
  np.testing.assert_array_equal(multi.gather(xs, devs[-1]).numpy(), np.concatenate(arrs, 0))
  np.testing.assert_allclose(multi.reduce(xs, devs[1]).numpy(), total, rtol=1e-5, atol=1e-6)
  for y, d in zip(multi.broadcast(xs[0], devs), devs):
    assert y.device == d
    np.testing.assert_array_equal(y.numpy(), arrs[0])
  parts = multi.scatter(xs[0], devs, axis=0)
  assert [p.device for p in parts] == list(devs)
  np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts]), arrs[0])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_allreduce_moves_2_n_minus_1_over_n(n):
  """Each device sends 2(n-1)/n of the data: all chunks but its own in the reduce-scatter, all but the next one's in
  the allgather (the chunks differ by one element when n does not divide the size)."""
  devs = opened(*names("CPU", n))
  size = multi.RING_MIN_BYTES // 4 + 1001           # a size that takes the ring
  xs = [Tensor(rand(size, seed=i), device=d) for i, d in enumerate(devs)]
  items = Tensor.schedule(*multi.allreduce(xs))
  sent = {d: 0 for d in devs}
  for it in items:
    if it.program is None and it.bufs[0].device != it.bufs[1].device: sent[it.bufs[1].device] += it.bufs[0].nbytes
  chunks = [e - b for b, e in multi.split_bounds(size, n)]
  assert [sent[d] for d in devs] == [4 * (2 * size - chunks[i] - chunks[(i + 1) % n]) for i in range(n)]
  assert sum(sent.values()) == 4 * 2 * (n - 1) * size


@pytest.mark.parametrize("kind,n", [("CPU", 3), ("AMD", 2), ("NV", 2), ("MIXED", 3)])
def test_jit_replays_a_step_with_an_allreduce(kind, n):
  devs = opened(*(("CPU", "AMD:1", "NV:1") if kind == "MIXED" else names(kind, n)))
  w = Tensor(rand(5, 3)).to(devs).realize()

  @jit
  def step(x, y):
    partial = [(xi @ wi).relu().sum(0) for xi, wi in zip(multi.shards(x), multi.shards(w))]
    return tuple(multi.allreduce(partial)), (y * 2).sum(0)     # an explicit allreduce and a sharded sum
  for i in range(4):
    a = rand(9, 5, seed=10 + i)
    built = schedule_mod.stats["schedules_built"]
    sums, total = step(Tensor(a).shard(devs, axis=0), Tensor(a).shard(devs, axis=0))
    if i >= 2:     # replays: prebuilt queues over every device, nothing scheduled
      assert isinstance(step.graph, MultiGraphExecutor) and schedule_mod.stats["schedules_built"] == built
    want = np.maximum(a @ w.numpy(), 0).sum(0)
    for s, d in zip(sums, devs):
      assert s.device == d
      np.testing.assert_allclose(s.numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(total.numpy(), a.sum(0) * 2, rtol=1e-5, atol=1e-5)


def test_data_parallel_training_matches_one_device():
  from baregrad.tensor.optim import Adam
  devs = opened("CPU", "CPU:1")
  a, wv = rand(10, 5), rand(5, 3, seed=1)
  out = []
  for several in (False, True):
    w = Tensor(wv.copy()).to(devs) if several else Tensor(wv.copy())
    w.requires_grad = True
    opt = Adam([w], lr=0.1)
    x = Tensor(a).shard(devs, axis=0) if several else Tensor(a)
    for _ in range(3):
      loss = ((x @ w).relu() - 1).square().mean()
      loss.backward()
      opt.step(loss)
      opt.zero_grad()
    out.append((w.numpy(), loss.numpy()))
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-5)


def test_demo_trains_data_parallel_like_one_device():
  """tools/demo.py --devices: the batch split across devices, the gradients allreduced; the losses of a few jitted
  steps are the one-device run's within float tolerance."""
  from baregrad.tools import demo
  devs = opened("CPU", "CPU:1")
  _, one, _, _ = demo.train(steps=4, batch=32, device="CPU")
  model, two, _, _ = demo.train(steps=4, batch=32, device=devs)
  np.testing.assert_allclose(two, one, rtol=1e-4)
  assert all(p.device == devs for p in model.parameters())
