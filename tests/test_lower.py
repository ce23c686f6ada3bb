"""The one lowering (compiler/lower.py) against numpy: FLOOR (the op added through the lowering table), C's integer
division edge cases, exact fmod, NaN-propagating max, emulated 16-bit floats and 8/16-bit integers.

The tests on the default device run as well under `EMU=1 DEV=NV` (PTX: fmod, max, 16-bit floats and small
integers come from the lowering). `bare_cpu` runs the CPU device with a C renderer that declares nothing beyond
the core, so every fallback of the lowering runs natively there too.
"""
import math

import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes
from baregrad.compiler import codegen, lower
from baregrad.compiler.uop import UOp, Ops
from baregrad.compiler.render_c import CRenderer
from baregrad.compiler.render_ptx import PTXRenderer
from helpers_ops import make, needs_float64_cases, round_to

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.0, -2.0, 0.49999997, -0.49999997, 1e-30, -1e-30, 8388607.5, -8388607.5,
           2.0 ** 52 + 0.5, 1e300, -1e300, math.inf, -math.inf, math.nan, 123.75, -123.25, 65504.0, -65504.0]


class BareC(CRenderer):
  """C with only the core: no native floor/fmod/division/max, float16/bfloat16 and 8/16-bit integers emulated."""
  native_ops = lower.Native(float_ops=frozenset(), dtypes=frozenset(dtypes.all()) - {
    dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})


@pytest.fixture
def bare_cpu(monkeypatch):
  codegen.clear_programs()
  monkeypatch.setitem(codegen.RENDERERS, "CPU", BareC)
  yield "CPU"
  codegen.clear_programs()


def values(name, seed=0, n=512):
  """Special values plus random bit patterns (every exponent) of a float dtype, as numpy (bfloat16: float32)."""
  rng = np.random.default_rng(seed)
  if name == "float64": rand = rng.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)
  else: rand = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
  with np.errstate(over="ignore", invalid="ignore"):
    return round_to(np.concatenate([np.array(SPECIAL), rand.astype(np.float64)]), name)


def same_bits(got, want, zero_sign=True):
  """Equal, with the sign of zeros (unless not `zero_sign`), NaN matching any NaN."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  ok = ((got == want) & ((np.signbit(got) == np.signbit(want)) | (not zero_sign))) | (np.isnan(got) & np.isnan(want))
  bad = np.flatnonzero(~ok)
  assert not len(bad), f"{len(bad)} differ, first at {bad[:5].tolist()}: got {got[bad[:5]].tolist()} " \
                       f"want {want[bad[:5]].tolist()}"


# ---------------------------------------------------------------- FLOOR

@pytest.mark.parametrize("name", needs_float64_cases(FLOATS))
def test_floor_like_numpy(name):
  x = values(name)
  same_bits(make(x, name).floor().numpy(), np.floor(x))


@pytest.mark.parametrize("name", FLOATS)
def test_floor_fallback_from_trunc(name, bare_cpu):
  x = values(name, seed=1)
  same_bits(Tensor(x, device=bare_cpu, dtype=getattr(dtypes, name)).floor().numpy(), np.floor(x))


def test_floor_is_one_op_on_every_target():
  """FLOOR reaches the renderers that declare it as one op, and is trunc + compare + select elsewhere."""
  x = UOp(Ops.PARAM, dtypes.float32, (), 0)
  f = UOp(Ops.FLOOR, dtypes.float32, (x,))
  for native in (CRenderer.native_ops, PTXRenderer.native_ops):
    assert codegen.graph_rewrite(f, lower.decompositions, ctx=native) is f
  bare = codegen.graph_rewrite(f, lower.decompositions, ctx=BareC.native_ops)
  assert {u.op for u in bare.toposort()} == {Ops.PARAM, Ops.TRUNC, Ops.CMPLT, Ops.CONST, Ops.NEG, Ops.ADD, Ops.WHERE}
  assert codegen.graph_rewrite(f, lower.legacy, ctx={Ops.SQRT, Ops.TRUNC}) is bare


def test_floor_rounds_ints_to_themselves():
  a = np.array([-5, 0, 7], np.int32)
  np.testing.assert_array_equal(Tensor(a).floor().numpy(), a)


# ---------------------------------------------------------------- integer division

def c_division(a: np.ndarray, b: np.ndarray, name: str):
  """C's truncating / and % with x / 0 = x % 0 = 0 and x / -1 = -x (wrapping), x % -1 = 0: in Python ints."""
  bits, signed = np.dtype(name).itemsize * 8, name.startswith("int")
  def wrap(v):
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v
  q, r = [], []
  for x, y in zip(a.tolist(), b.tolist()):
    if y == 0: q.append(0); r.append(0); continue
    t = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
    q.append(wrap(t)); r.append(wrap(x - t * y))
  return np.array(q, dtype=name), np.array(r, dtype=name)


def division_operands(name):
  info = np.iinfo(name)
  rng = np.random.default_rng(3)
  a = [info.min, info.max, 0, 1, -1, 7, -7, 100, info.min, info.min + 1, 5, -9] if info.min < 0 else \
      [info.max, 0, 1, 7, 100, info.max - 1, 5, 9, 255, 3, 1, 0]
  b = [-1, -1, 0, 0, 0, 2, -2, 3, 0, -1, info.min, info.max] if info.min < 0 else \
      [0, 0, 0, 2, 3, info.max, 1, 4, 7, 0, info.max, 5]
  ra = rng.integers(info.min, info.max, 64, dtype=np.int64 if info.min < 0 else np.uint64, endpoint=True)
  rb = rng.integers(-3 if info.min < 0 else 0, 4, 64)
  return np.concatenate([np.array(a, name), ra.astype(name)]), np.concatenate([np.array(b, name), rb.astype(name)])


@pytest.mark.parametrize("name", INTS)
def test_integer_division_edge_cases_like_c(name):
  a, b = division_operands(name)
  q, r = c_division(a, b, name)
  np.testing.assert_array_equal(Tensor(a)._alu(Ops.IDIV, Tensor(b)).numpy(), q)
  np.testing.assert_array_equal(Tensor(a)._alu(Ops.MOD, Tensor(b)).numpy(), r)
  for c in (0, -1, 3):   # constant divisors: folded guards
    if c < 0 and name.startswith("u"): continue
    qc, rc = c_division(a, np.full_like(a, c), name)
    np.testing.assert_array_equal(Tensor(a)._alu(Ops.IDIV, Tensor(np.full_like(a, c))).numpy(), qc)
    np.testing.assert_array_equal(Tensor(a)._alu(Ops.MOD, Tensor(np.full_like(a, c))).numpy(), rc)


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16"])
def test_small_integers_in_32_bits(name, bare_cpu):
  """8/16-bit integers computed in 32 bits and converted back after each op, as C's promotion and assignment."""
  a, b = division_operands(name)
  q, r = c_division(a, b, name)
  ta, tb = Tensor(a, device=bare_cpu), Tensor(b, device=bare_cpu)
  np.testing.assert_array_equal(ta._alu(Ops.IDIV, tb).numpy(), q)
  np.testing.assert_array_equal(ta._alu(Ops.MOD, tb).numpy(), r)
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal((ta * tb + ta).numpy(), a * b + a)
    np.testing.assert_array_equal(ta.maximum(tb).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal((ta << 3).numpy(), a << np.array(3, name))
    np.testing.assert_array_equal(ta.sum(dtype=name).numpy(), a.sum(dtype=name))
    np.testing.assert_array_equal(ta.max().numpy(), a.max())


# ---------------------------------------------------------------- fmod, max, 16-bit floats

def _fmod_check(name, device=None):
  x, y = values(name, seed=5), values(name, seed=6)[::-1]
  x = np.concatenate([x, np.repeat(np.array(SPECIAL), len(SPECIAL))])
  y = np.concatenate([y, np.tile(np.array(SPECIAL), len(SPECIAL))])
  with np.errstate(over="ignore"): x, y = round_to(x, name), round_to(y, name)
  dt = getattr(dtypes, name)
  got = Tensor(x, device=device, dtype=dt)._alu(Ops.MOD, Tensor(y, device=device, dtype=dt)).numpy()
  with np.errstate(invalid="ignore", divide="ignore"):
    want = np.fmod(x.astype(np.float64), y.astype(np.float64))   # exact, so rounding it to the dtype is too
  same_bits(got, round_to(want, name))


@pytest.mark.parametrize("name", needs_float64_cases(FLOATS))
def test_fmod_exact(name):
  _fmod_check(name)


@pytest.mark.parametrize("name", ["float32", "float64", "float16"])
def test_fmod_from_integer_significands(name, bare_cpu):
  _fmod_check(name, bare_cpu)


@pytest.mark.parametrize("name", FLOATS)
def test_maximum_propagates_nan_without_native_max(name, bare_cpu):
  x, y = values(name, seed=7), values(name, seed=8)
  dt = getattr(dtypes, name)
  tx, ty = Tensor(x, device=bare_cpu, dtype=dt), Tensor(y, device=bare_cpu, dtype=dt)
  # (a != a || a > b) ? a : b: NaN from either side; of two equal zeros it keeps b (numpy keeps a)
  same_bits(tx.maximum(ty).numpy(), np.maximum(x, y), zero_sign=False)
  same_bits(tx.max().numpy(), np.max(x), zero_sign=False)


def test_float16_arithmetic_rounds_after_every_op(bare_cpu):
  """numpy computes float16 ops in float32 and rounds each result: so does the emulation, bit for bit."""
  x, y = values("float16", seed=9), values("float16", seed=10)
  tx, ty = Tensor(x, device=bare_cpu), Tensor(y, device=bare_cpu)
  with np.errstate(all="ignore"):
    same_bits((tx + ty).numpy(), x + y)
    same_bits((tx * ty * tx).numpy(), x * y * x)
    same_bits((tx * tx).sqrt().numpy(), np.sqrt(x * x))
    same_bits(tx.cast(dtypes.float64).numpy(), x.astype(np.float64))
    same_bits(Tensor(x.astype(np.float32), device=bare_cpu).cast(dtypes.float16).numpy(), x)
    np.testing.assert_array_equal((tx < ty).numpy(), x < y)


def test_float16_bits_pass_through():
  """16-bit floats are their storage bits between ops: a bitcast round trip keeps NaN payloads, as numpy's view."""
  bits = np.array([0x7c01, 0xfe12, 0x7e00, 0x3c00, 0x8000, 0x0001], np.uint16)
  out = Tensor(bits).bitcast(dtypes.float16).bitcast(dtypes.uint16).numpy()
  np.testing.assert_array_equal(out, bits)


# ---------------------------------------------------------------- declarations

def test_native_declarations_are_checked():
  with pytest.raises(ValueError, match="have no lowering"):
    lower.Native(float_ops=frozenset({Ops.SQRT}), dtypes=frozenset(dtypes.all()))
  with pytest.raises(ValueError, match="int64"):
    lower.Native(float_ops=frozenset(), dtypes=frozenset(dtypes.all()) - {dtypes.int64})
  # float64 may be absent (a target without it: Metal); then it is not emulated either
  no64 = lower.Native(float_ops=frozenset(), dtypes=frozenset(dtypes.all()) - {dtypes.float64, dtypes.float16})
  assert not lower._emulated(dtypes.float64, no64) and lower._emulated(dtypes.float16, no64)


def test_set_declared_renderer_gets_only_the_old_rewrites():
  """A renderer still declaring a set of ops (the AMD one, until it adopts Native) keeps its own semantics."""
  labels = [label for label, _, _ in lower.passes({Ops.SQRT, Ops.TRUNC})]
  assert labels == ["symbolic", "decompositions", "symbolic again"]
  a, b = UOp(Ops.PARAM, dtypes.int32, (), 0), UOp(Ops.PARAM, dtypes.int32, (), 1)
  fa, fb = a.cast(dtypes.float32), b.cast(dtypes.float32)
  for u in (UOp(Ops.IDIV, dtypes.int32, (a, b)), UOp(Ops.MAX, dtypes.float32, (fa, fb))):
    assert codegen.graph_rewrite(u, lower.legacy, ctx={Ops.SQRT, Ops.TRUNC}) is u


def test_div_mod_of_lanes_inside_blocks():
  """(8*i + lane) // 32 and % 32 with 0 <= lane < 8 simplify to i // 4 and (i % 4)*8 + lane (a vector of 8 lanes
  inside 32-element blocks: the block's scale is loaded once per step, not per lane); the value equals the original
  for every i and lane."""
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.pattern import graph_rewrite
  from baregrad.compiler.symbolic import symbolic, exec_alu
  from baregrad.compiler.dtype import dtypes
  idx = dtypes.index
  i = UOp(Ops.RANGE, idx, (UOp.const(idx, 40),), (0, "reduce"))
  lane = UOp(Ops.RANGE, idx, (UOp.const(idx, 8),), (1, "upcast"))
  x = i * 8 + lane + 64
  for op in (Ops.IDIV, Ops.MOD):
    e = UOp(op, idx, (x, UOp.const(idx, 32)))
    s = graph_rewrite(e, symbolic)
    assert lane not in [u for u in s.toposort() if u.op in (Ops.IDIV, Ops.MOD) for u in u.src[0].toposort()], s
    def ev(u, iv, lv):
      vals = {}
      for n in u.toposort():
        vals[n] = iv if n is i else lv if n is lane else n.arg if n.op is Ops.CONST else \
          exec_alu(n.op, n.dtype, tuple(vals[q] for q in n.src)) if n.op is not Ops.RANGE else None
      return vals[u]
    for iv in range(40):
      for lv in range(8): assert ev(s, iv, lv) == ev(e, iv, lv), (op, iv, lv)


def _evaluate(u, env: dict):
  """u's value with the ranges (and Variables) in `env` set, by the same ALU semantics the kernels use."""
  from baregrad.compiler.uop import Ops
  from baregrad.compiler.symbolic import exec_alu
  vals = {}
  for n in u.toposort():
    vals[n] = env[n] if n in env else n.arg if n.op is Ops.CONST else exec_alu(n.op, n.dtype, tuple(vals[q] for q in n.src))
  return vals[u]


def test_comparisons_of_lanes_inside_blocks():
  """8*i + lane + k < c and c < 8*i + lane + k, 0 <= lane < 8: where the bound falls on a block edge the comparison is
  one of i alone (a gate the same for every lane of a vector); everywhere it equals the original."""
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.pattern import graph_rewrite
  from baregrad.compiler.symbolic import symbolic
  from baregrad.compiler.dtype import dtypes
  idx = dtypes.index
  i = UOp(Ops.RANGE, idx, (UOp.const(idx, 24),), (0, "global"))
  lane = UOp(Ops.RANGE, idx, (UOp.const(idx, 8),), (1, "upcast"))
  for k in (0, 3, -64):
    x = i * 8 + lane + k
    for c in (-64, -63, 0, 5, 8, 63, 64, 67, 128, 131):
      for e in (UOp(Ops.CMPLT, dtypes.bool, (x, UOp.const(idx, c))), UOp(Ops.CMPLT, dtypes.bool, (UOp.const(idx, c), x))):
        s = graph_rewrite(e, symbolic)
        upper = e.src[0] is x
        if ((c - k) if upper else (c - k + 1)) % 8 == 0: assert lane not in s.toposort(), (k, c, s)
        for iv in range(24):
          for lv in range(8): assert _evaluate(s, {i: iv, lane: lv}) == _evaluate(e, {i: iv, lane: lv}), (k, c, iv, lv)


def test_loop_index_over_a_symbolic_bound():
  """r % n and r // n for a loop r over a symbolic bound n (a KV cache read over positions 0..pos) are r and 0, and
  x // 1, x % 1 are x and 0 whatever the sign of x: no division is left; each equals the original for every value of
  the Variable and the loop (and for negative x)."""
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.pattern import graph_rewrite
  from baregrad.compiler.symbolic import symbolic
  from baregrad.compiler.dtype import dtypes
  idx = dtypes.index
  pos = UOp(Ops.DEFINE_VAR, idx, (), ("pos", 0, 20))
  n = pos + UOp.const(idx, 1)
  r = UOp(Ops.RANGE, idx, (n,), (0, "reduce"))
  one = UOp.const(idx, 1)
  x = r * 256 + UOp.const(idx, -300)
  for e in (UOp(Ops.MOD, idx, (r, n)) * 256 + 7, UOp(Ops.IDIV, idx, (r, n)) + r, UOp(Ops.IDIV, idx, (x, one)),
            UOp(Ops.MOD, idx, (x, one)) + r):
    s = graph_rewrite(e, symbolic)
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in s.toposort()), s
    for pv in (0, 3, 20):
      for rv in range(pv + 1): assert _evaluate(s, {pos: pv, r: rv}) == _evaluate(e, {pos: pv, r: rv}), (e, pv, rv)


def test_gated_index_simplified_for_the_values_it_is_read_at():
  """The index of a cat's middle piece, read under 64 <= r < 128, of a source permuted (16, 4, 64, 16) -> (16, 64, 64):
  simplified for those r its division by 4096 and the modulos by 4 and 64 go; it equals the original wherever the gate
  holds (elsewhere the load does not happen)."""
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.pattern import graph_rewrite
  from baregrad.compiler.symbolic import symbolic
  from baregrad.compiler.dtype import dtypes
  idx = dtypes.index
  r1 = UOp(Ops.RANGE, idx, (UOp.const(idx, 64),), (1, "global"))
  r = UOp(Ops.RANGE, idx, (UOp.const(idx, 192),), (2, "global"))
  flat = r1 * 64 + r + (-64)                     # (t, h*16 + d) of one batch row, flattened
  c = lambda v: UOp.const(idx, v)
  index = (flat // c(16) % c(4)) * c(1024) + (flat // c(64) % c(64)) * c(16) + flat % c(16) + (flat // c(4096)) * c(4096)
  valid = UOp(Ops.CMPLT, dtypes.bool, (c(63), r)) & UOp(Ops.CMPLT, dtypes.bool, (r, c(128)))
  buf = UOp(Ops.PARAM, dtypes.float32, (), 0)
  e = UOp(Ops.INDEX, None, (buf, index, valid))
  s = graph_rewrite(e, symbolic)
  divs = lambda u: sum(1 for n in u.toposort() if n.op in (Ops.IDIV, Ops.MOD))
  assert s.src[2] is valid and divs(s.src[1]) <= 2 < divs(index), s.src[1]
  for rv in range(64, 128):
    for tv in (0, 1, 17, 63):
      assert _evaluate(s.src[1], {r: rv, r1: tv}) == _evaluate(index, {r: rv, r1: tv}), (rv, tv)
  # a gate that narrows nothing leaves the index as it was
  wide = UOp(Ops.CMPLT, dtypes.bool, (r, c(500)))
  assert graph_rewrite(UOp(Ops.INDEX, None, (buf, index, wide)), symbolic).src[1] is graph_rewrite(index, symbolic)


def test_cat_of_permuted_pieces_like_numpy():
  """cat(dq, dk, dv) of head-permuted pieces (the backward of qkv.chunk(3) in attention), each piece read through its
  gate with the simplified index, and vector lanes across the pieces."""
  from baregrad.tensor import Tensor
  rng = np.random.default_rng(0)
  ps = [rng.standard_normal((3, 4, 8, 16), dtype=np.float32) for _ in range(3)]
  out = Tensor.cat(*[Tensor(p).permute(0, 2, 1, 3).reshape(3, 8, 64) for p in ps], dim=2).numpy()
  np.testing.assert_array_equal(out, np.concatenate([p.transpose(0, 2, 1, 3).reshape(3, 8, 64) for p in ps], 2))
