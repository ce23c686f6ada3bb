"""FLOOR, TRUNC, float -> int conversions and the EXP2/LOG2 decompositions run as GNU C vector operations on the CPU
(compiler/render_c.py), checked against numpy at the values where a vector formulation can go wrong: signed zeros,
halves, the 2**23 (2**52) boundary past which every float is integral, infinities and NaN."""
import numpy as np
import pytest
from baregrad.compiler import decomp
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.render_c import vector_renderable
from baregrad.compiler.uop import UOp, Ops
from baregrad.tensor import Tensor

SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 1e-40, -1e-40, 8388607.5, -8388607.5,
           8388608.0, -8388609.0, 16777217.0, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 7.0, -7.0]


def _values(dt):
  rng = np.random.default_rng(0)
  x = np.concatenate([np.array(SPECIAL, dt), rng.standard_normal(1024 - len(SPECIAL)).astype(dt) * 40])
  return x


def _vectorized(t: Tensor) -> bool:
  (item,) = t.schedule()
  return "x8" in item.program.source or "x4" in item.program.source


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["floor", "trunc"])
def test_floor_trunc_lanes(op, dt):
  x = _values(dt)
  t = getattr(Tensor(x), op)()
  assert _vectorized(getattr(Tensor(x), op)())
  got, want = t.numpy(), getattr(np, op)(x)
  np.testing.assert_array_equal(got, want)
  assert (np.signbit(got) == np.signbit(want)).all()          # -0.0 stays -0.0


def test_float_to_int_lanes():
  x = np.random.default_rng(1).standard_normal(1024).astype(np.float32) * 1000
  t = Tensor(x).cast(dtypes.int32).cast(dtypes.float32) * 3
  np.testing.assert_array_equal(t.numpy(), x.astype(np.int32).astype(np.float32) * 3)


@pytest.mark.parametrize("op", ["exp2", "log2"])
def test_exp2_log2_lanes(op):
  x = np.abs(_values(np.float32)) if op == "log2" else np.clip(_values(np.float32), -200, 200)
  t = getattr(Tensor(x), op)()
  assert _vectorized(getattr(Tensor(x), op)())
  with np.errstate(all="ignore"):
    np.testing.assert_allclose(t.numpy(), getattr(np, op)(x), rtol=2e-6, atol=0)


def test_gelu_runs_as_vectors():
  x = np.random.default_rng(2).standard_normal(1024).astype(np.float32)
  assert _vectorized(Tensor(x).gelu())


@pytest.mark.parametrize("name", ["exp2", "log2"])
def test_decompositions_are_vector_renderable(name):
  """vector_renderable says yes to EXP2/LOG2 because lower.py's decompositions use only renderable ops."""
  for dt in (dtypes.float32, dtypes.float64):
    out = getattr(decomp, name)(UOp(Ops.NEG, dt, (UOp.const(dt, 1.5),)))
    bad = {(u.op, u.dtype) for u in out.toposort()
           if u.op is not Ops.CONST and not vector_renderable(u.op, u.dtype, [s.dtype for s in u.src])}
    assert not bad, bad


@pytest.mark.parametrize("k", [1, 4, 7])
def test_byte_lane_shifts(k):
  """uint8 lanes shifted by a constant inside a vectorized reduction (a quantized block's nibbles): x86 has no byte
  shift, so the renderer shifts 16-bit lanes and masks off what crossed from the neighbouring byte. Every byte value,
  both directions, against numpy."""
  rng = np.random.default_rng(3)
  wn = np.concatenate([np.arange(256, dtype=np.uint8), rng.integers(0, 256, 768, dtype=np.uint8)]).reshape(4, 256)
  xn = rng.standard_normal((1, 256)).astype(np.float32)
  w, x = Tensor(wn).realize(), Tensor(xn).realize()
  for t, want in (((x * (w >> k).cast(dtypes.float32)).sum(-1), wn >> k),
                  ((x * (w << k).cast(dtypes.float32)).sum(-1), (wn << k).astype(np.uint8))):
    (item,) = t.schedule()
    assert "bg_u16x" in item.program.source, item.program.source
    np.testing.assert_allclose(t.numpy(), (xn.astype(np.float64) * want).sum(-1), rtol=1e-5)
