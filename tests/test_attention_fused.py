"""Attention as one kernel (Ops.ATTEND): softmax(scores) @ value with an online softmax, the scores computed inside
the kernel's loop over the keys and never stored. Checked against numpy's two-pass softmax (values, the NaN of a row
with no key kept, gradients written out by hand) and, on the emulated GPUs, against their counters: one kernel whose
only global stores are its output."""
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.tensor.losses import attend, attention_scores
from baregrad.compiler.dtype import dtypes

rng = np.random.default_rng(7)


def randn(*shape): return rng.standard_normal(shape).astype(np.float32)


def np_softmax(s):
  with np.errstate(invalid="ignore"):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_attention(q, k, v, mask=None, scale=None):
  scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
  s = q @ np.swapaxes(k, -1, -2) * scale
  if mask is not None: s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
  return np_softmax(s) @ v


def kernels(t: Tensor) -> list:
  return [item for item in t.schedule() if item.program is not None]


def causal(L, S): return np.triu(np.full((L, S), -np.inf, np.float32), S - L + 1)


@pytest.mark.parametrize("shape", [(1, 2, 5, 7, 8, 6), (2, 3, 4, 4, 16, 16), (1, 1, 9, 33, 5, 3)])
def test_matches_numpy_in_one_kernel(shape):
  B, H, L, S, E, D = shape
  qn, kn, vn = randn(B, H, L, E), randn(B, H, S, E), randn(B, H, S, D)
  mask = causal(L, S)
  out = attend(attention_scores(Tensor(qn), Tensor(kn), Tensor(mask)), Tensor(vn))
  ks = kernels(out)
  assert len(ks) == 1, [k.name for k in ks]
  np.testing.assert_allclose(out.numpy(), np_attention(qn, kn, vn, mask), rtol=2e-5, atol=2e-6)


def test_masks_broadcast_and_empty_rows():
  """A bool mask; a value shared by every batch and head (2-D); a row whose keys are all masked gives NaN (softmax's
  0 / 0, as torch), the others are unaffected; scores of very different sizes (the running maximum rescales)."""
  qn, kn, vn = randn(2, 3, 6, 4) * 8, randn(2, 3, 10, 4) * 8, randn(10, 5)
  keep = rng.random((6, 10)) > 0.4
  keep[2] = False
  out = attend(attention_scores(Tensor(qn), Tensor(kn), Tensor(keep)), Tensor(vn)).numpy()
  ref = np_attention(qn, kn, vn, keep)
  assert np.isnan(out[:, :, 2]).all() and not np.isnan(np.delete(out, 2, axis=2)).any()
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_float16_computes_in_float32():
  qn, kn, vn = randn(1, 2, 5, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8)
  q, k, v = (Tensor(x).cast(dtypes.float16) for x in (qn, kn, vn))
  out = attend(attention_scores(q, k, Tensor(causal(5, 5))), v)
  assert out.dtype == dtypes.float16
  h = lambda x: x.astype(np.float16).astype(np.float32)
  np.testing.assert_allclose(out.numpy().astype(np.float32), np_attention(h(qn), h(kn), h(vn), causal(5, 5)), rtol=3e-3, atol=3e-3)


def test_malformed_shapes_are_clear_errors():
  from baregrad.tensor.composite import ShapeError
  with pytest.raises(ShapeError, match="5 scores per query but value has 6 positions"):
    attend(Tensor(randn(2, 3, 5)), Tensor(randn(2, 6, 4)))
  with pytest.raises(ShapeError, match="batch dims .* do not broadcast"):
    attend(Tensor(randn(3, 5, 7)), Tensor(randn(4, 7, 2)))


def test_gradients():
  """d/dq, d/dk, d/dv of sum(out * G) against the gradients of softmax attention written out in numpy."""
  L, S, E, D = 5, 6, 4, 3
  qn, kn, vn, G = randn(2, L, E), randn(2, S, E), randn(2, S, D), randn(2, L, D)
  mask = causal(L, S)
  q, k, v = (Tensor(x, requires_grad=True) for x in (qn, kn, vn))
  out = attend(attention_scores(q, k, Tensor(mask)), v)
  (out * Tensor(G)).sum().backward()
  scale = 1 / np.sqrt(E)
  P = np_softmax(qn @ np.swapaxes(kn, 1, 2) * scale + mask)
  dV = np.swapaxes(P, 1, 2) @ G
  dP = G @ np.swapaxes(vn, 1, 2)
  dS = P * (dP - (dP * P).sum(-1, keepdims=True))
  dQ, dK = dS @ kn * scale, np.swapaxes(dS, 1, 2) @ qn * scale
  for t, ref in ((q, dQ), (k, dK), (v, dV)): np.testing.assert_allclose(t.grad.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_opts_keep_the_coupled_loop_whole():
  """The CPU heuristic picks no opt for the online softmax's kernel; an opt that splits its loop (UNROLL, GROUP) is
  refused, as is a register tile (UPCAST) along the queries, on which the shared running maximum depends; LOCAL and
  a tile along the value's dims apply (each lane its own running sum; the GPU heuristic picks both, run by the
  emulated-GPU test below)."""
  from baregrad.compiler.opt import Opt, OptError, apply_opt, hand_coded_opts
  from baregrad.compiler.schedule import normalize
  from baregrad.compiler.rangeify import rangeify, KernelSpec
  out = attend(attention_scores(Tensor(randn(1, 4, 8, 8)), Tensor(randn(1, 4, 8, 8))), Tensor(randn(1, 4, 8, 8)))
  sink, _, _ = normalize(out.uop.sink())
  [spec] = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)]
  ast = spec.ast      # global axes (head, query, value dim); reduce axes (key, feature)
  assert hand_coded_opts(ast) == []
  for o in (Opt("UNROLL", 0, 2), Opt("GROUP", 0, 2), Opt("UPCAST", 1, 2), Opt("PADTO", 2, 16)):
    with pytest.raises(OptError, match="coupled"): apply_opt(ast, o)
  apply_opt(apply_opt(ast, Opt("UPCAST", 2, 4)), Opt("LOCAL", 1, 4))


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_prefill_on_emulated_gpus_stores_no_scores(emulated_gpus, device):
  """scaled_dot_product_attention with several queries on a GPU is one kernel; the emulator's counters show its
  global stores are the output alone (the 2 x 12 x 12 scores of the two-kernel softmax are never written)."""
  from baregrad.drivers.emu import counters
  H, L, E, D = 2, 12, 8, 8
  qn, kn, vn = randn(1, H, L, E), randn(1, H, L, E), randn(1, H, L, D)
  mask = causal(L, L)
  q, k, v, m = (Tensor(x, device=device).realize() for x in (qn, kn, vn, mask))
  out = q.scaled_dot_product_attention(k, v, m)
  assert len(kernels(out)) == 1
  counters.reset()
  got = out.numpy()
  total = counters.total()
  assert total.kernels == 1 and total.global_store_bytes == H * L * D * 4, total.as_dict()
  np.testing.assert_allclose(got, np_attention(qn, kn, vn, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", ["CPU", "AMD", "NV"])
def test_coupled_step_reads_the_old_accumulator(emulated_gpus, device):
  """Two coupled accumulators: a += 1 and b += a, over 10 steps: b must read a as it stood at the start of each step
  (0 + 1 + ... + 9 = 45). A renderer that computes a's step into its register in place (its only use is its update)
  before b's step reads it gives 55: the renderers check for such a reader first (linearize.read_between)."""
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.rangeify import KernelSpec
  from baregrad.compiler.codegen import get_program
  from baregrad.hcq.runtime import ExecItem, run_schedule
  f32, idx = dtypes.float32, dtypes.index
  g = UOp(Ops.RANGE, idx, (UOp.const(idx, 4),), (0, "global"))
  r = UOp(Ops.RANGE, idx, (UOp.const(idx, 10),), (1, "reduce"))
  pa, pb = (UOp(Ops.DEFINE_ACC, f32, (r,), ("peer", k)) for k in (0, 1))
  a = UOp(Ops.REDUCE, f32, (pa + UOp.const(f32, 1.0), r), (Ops.ADD, ("coupled", 0)))
  b = UOp(Ops.REDUCE, f32, (pb + pa, r), (Ops.ADD, ("coupled", 1)))
  out = Tensor.empty(4, device=device).realize()
  value = b * UOp.const(f32, 100.0) + a + g.cast(f32)
  ast = UOp.sink(UOp(Ops.STORE, None, (UOp(Ops.INDEX, None, (UOp(Ops.PARAM, f32, (), 0), g)), value)))
  buf = out.uop.base
  prog = get_program(KernelSpec(ast, [buf], "coupled_pair", device))
  run_schedule([ExecItem(prog, [buf.arg], {}, prog.meta)], sync=True)
  np.testing.assert_array_equal(out.numpy(), 4510 + np.arange(4))


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_symbolic_number_of_keys_under_jit(emulated_gpus, device):
  """Three queries over a cache prefix of p + 3 keys, p a bound Variable (a chunked prefill): the coupled loop runs to
  a bound read from a kernel argument, and the jitted graph replays for each p against numpy."""
  from baregrad.tensor.tensor import Variable
  from baregrad.tensor.jit import jit
  qn, kn, vn = randn(1, 2, 3, 8), randn(1, 2, 16, 8), randn(1, 2, 16, 8)
  q, kc, vc = (Tensor(x, device=device).realize() for x in (qn, kn, vn))
  f = jit(lambda p: q.scaled_dot_product_attention(kc.shrink((None, None, (0, p + 3), None)),
                                                    vc.shrink((None, None, (0, p + 3), None))).contiguous())
  v = Variable("p", 0, 13)
  for n in (4, 7, 2, 13):
    np.testing.assert_allclose(f(v.bind(n)).numpy(), np_attention(qn, kn[:, :, :n + 3], vn[:, :, :n + 3]),
                               rtol=1e-5, atol=1e-6)
