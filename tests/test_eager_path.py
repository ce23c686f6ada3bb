"""The eager path's caches give the results an uncached run would: a schedule reused for the same graph structure on
other data, scalar operands kept between ops, the realized results a write makes stale. Values against numpy."""
import math
import numpy as np
from baregrad.tensor import Tensor
from baregrad.hcq.device import Device
from baregrad.compiler import schedule
from baregrad.compiler.uop import Ops
from helpers_stress import run_threads


def test_same_structure_on_new_data_reuses_the_schedule():
  rng = np.random.default_rng(0)
  xn, yn = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
  (Tensor(xn) * Tensor(yn) + 1.0).numpy()
  built, hits = schedule.stats["schedules_built"], schedule.stats["schedule_cache_hits"]
  for i in range(5):
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    np.testing.assert_array_equal((Tensor(a) * Tensor(b) + 1.0).numpy(), a * b + np.float32(1.0))
  assert schedule.stats["schedules_built"] == built and schedule.stats["schedule_cache_hits"] == hits + 5
  # another shape is another schedule
  a = rng.standard_normal(17).astype(np.float32)
  np.testing.assert_array_equal((Tensor(a) * Tensor(a) + 1.0).numpy(), a * a + np.float32(1.0))
  assert schedule.stats["schedules_built"] == built + 1


def test_scalar_operands_keep_their_value_bits():
  """0.0 and -0.0 compare equal and hash alike, nan equals nothing, True == 1 == 1.0: the scalar operand kept
  between ops must still be the one asked for (bit-exact float32, as numpy computes it)."""
  xn = np.array([1.0, -2.0, 0.0, 3.5], np.float32)
  x = Tensor(xn)
  for v in (0.0, -0.0, 0.0, math.nan, -0.0, 1, True, 1.0, 2, np.float32(-0.0), 0.0):
    got = (x * v).numpy()
    want = xn * np.float32(v)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (v, got, want)
  for v in (-0.0, 0.0):   # on another shape, the same values
    got = (Tensor(np.ones((2, 3), np.float32)) + v).numpy()
    assert got.shape == (2, 3) and np.all(got == 1.0)
  assert (Tensor(np.array([1, 2], np.int32)) + True).numpy().tolist() == [2, 3]


def test_a_write_makes_every_live_result_computed_from_the_buffer_stale():
  """Results realized from x and still used by a pending graph are recomputed after x is written, however many
  results (live or gone) were recorded against x's buffer."""
  x = Tensor(np.arange(8, dtype=np.float32))
  kept = []
  for k in range(150):
    m = x * Tensor(np.full(8, k, np.float32))   # (one structure: compiled once)
    pending = m + 1.0          # holds m's graph node: its realized value stays recorded while this lives
    m.realize()
    if k % 3 == 0: kept.append((k, pending))
  x.assign(Tensor(np.full(8, 2.0, np.float32))).realize()
  for k, pending in kept:
    np.testing.assert_array_equal(pending.numpy(), np.full(8, 2.0 * k + 1.0, np.float32))


def test_a_write_makes_results_computed_from_realized_results_stale():
  """A graph that reads a realized result walks it as a leaf (schedule.graph_order: it records reading the result's
  buffer, not what the result was computed from); a write to that origin makes the later result stale as well
  (forget follows realized results to what was computed from them). Before the walk stopped there, each realize
  walked every earlier graph again."""
  w = Tensor(np.arange(8, dtype=np.float32)).realize()
  x, x2 = (w * 2.0).contiguous(), (w * 2.0).contiguous()      # one graph node (hash-consed)
  y, y2 = (x + 1.0).contiguous(), (x + 1.0).contiguous()
  x2.realize()                 # x's node realized, recorded against w
  y.realize()                  # reads x's value: x's node is a leaf of this graph
  w.assign(Tensor(np.full(8, 5.0, np.float32))).realize()
  np.testing.assert_array_equal((y2 * 1.0).numpy(), np.full(8, 11.0, np.float32))   # y2's node read by a graph
  np.testing.assert_array_equal(y2.numpy(), np.full(8, 11.0, np.float32))
  np.testing.assert_array_equal(x.numpy(), np.full(8, 10.0, np.float32))
  np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype=np.float32) * 2 + 1)   # realized before the write


def test_a_realize_walks_only_what_it_computes():
  """A chain of realizes, each reading the last one's result through its graph node: each walks its own nodes, not
  the whole chain again (linear, not quadratic, in the chain's length)."""
  walked = []
  real = schedule.normalize_outputs
  def spy(outs, order):
    walked.append(len(order))
    return real(outs, order)
  x = Tensor(np.ones(4, np.float32))
  held = []
  schedule.normalize_outputs = spy
  try:
    for _ in range(30):
      x = (x * 1.5 + 1.0).contiguous()
      held.append(x.uop)       # (the graph node stays alive: a later graph may read its value)
      (x + 0.0).realize()
  finally: schedule.normalize_outputs = real
  assert max(walked) == min(walked), walked
  want = np.ones(4, np.float32)
  for _ in range(30): want = want * np.float32(1.5) + np.float32(1.0)
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)


def test_last_command_names_the_last_kernel():
  """Hang and fault reports say what was submitted last."""
  x = Tensor(np.arange(4, dtype=np.float32))
  y = x * 3.0 + 2.0
  name = y.schedule()[0].name
  y.realize()
  dev = Device.get(x.device)
  assert dev.last_command == f"compute queue: exec {name}, signal timeline {dev.timeline_value}"


def test_scalar_operands_from_threads():
  """Threads making ops with many different scalars at once (more than the scalar operands kept, so entries are
  dropped while others are looked up and added): every result is the one asked for."""
  from baregrad.tensor import tensor as tensor_mod
  xn = np.arange(6, dtype=np.float32).reshape(2, 3)
  x = Tensor(xn)
  errors = []
  def work(seed):
    try:
      for k in range(3 * tensor_mod._SCALARS_KEPT):
        v = float(seed * 1000 + k) + 0.5 if k % 2 else seed * 1000 + k
        y = x + v
        const = y.uop.src[1]
        while const.src and const.op is not Ops.CONST: const = const.src[0]
        if const.op is not Ops.CONST or const.arg != v or y.shape != (2, 3): errors.append((seed, k, const))
        if k % 48 == 0 and not np.array_equal(y.numpy(), xn + np.float32(v)): errors.append((seed, k, y.numpy()))
    except Exception as e: errors.append(repr(e))
  run_threads(work, [(s,) for s in range(4)])
  assert not errors, errors[:3]


def test_a_realized_temporary_is_not_recorded_but_a_kept_node_is():
  """A graph node realized and then dropped leaves nothing behind on its inputs' buffers; one still held by a pending
  graph is recorded, and that graph reads its buffer (the kernel is not run again)."""
  from baregrad.compiler.schedule import realized
  xn = np.arange(8, dtype=np.float32)
  x = Tensor(xn)
  buf = x._buffer()
  before = len(buf.dependents or [])
  for _ in range(10): (x * 3.0 + 1.0).realize()
  assert len(buf.dependents or []) == before
  m = x * 5.0
  node = m.uop
  pending = m + 1.0
  m.realize()
  assert node in realized
  np.testing.assert_array_equal(pending.numpy(), xn * np.float32(5.0) + np.float32(1.0))
