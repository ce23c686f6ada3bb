"""Kernel optimizations on the CPU device, checked against numpy: every single opt BEAM may try and a set of
opt sequences give the same numbers as no opts; the C renderer's vector lanes and the packed matmul layout
compute what numpy computes; the matmul kernel really is vectorized (its source uses the vector types); the
Tensor layer's matmul graph is the same on every host, and the scheduler packs it for the CPU."""
import dataclasses, itertools, random
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import Ops
from baregrad.compiler.schedule import normalize
from baregrad.compiler.rangeify import rangeify, KernelSpec
from baregrad.compiler.opt import Opt, OptError, apply_opts, hand_coded_opts, has_avx512
from baregrad.compiler.pack import matmul_pack_width, matmul_operands, pack_matmuls
from baregrad.compiler.search import actions
from baregrad.compiler.codegen import get_program
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.runtime import ExecItem, run_schedule

pytestmark = pytest.mark.skipif(Tensor(1.0).device != "CPU", reason="CPU kernel opts")


def last_kernel(t: Tensor) -> tuple[KernelSpec, list]:
  """The last kernel of t's schedule and the numpy arrays of its inputs (earlier kernels realized)."""
  items = t.schedule()
  run_schedule(items[:-1], sync=True)
  sink, _, _ = normalize(t.uop.sink())
  spec = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
  return spec, items[-1].bufs


def run_with(spec: KernelSpec, bufs: list, opts) -> np.ndarray:
  prog = get_program(dataclasses.replace(spec, opts=tuple(opts)))
  out = Buffer(bufs[0].device, bufs[0].size, bufs[0].dtype)
  run_schedule([ExecItem(prog, [out, *bufs[1:]], {}, prog.meta)], sync=True)
  return read(out)


def read(buf: Buffer) -> np.ndarray:
  out = np.empty(buf.size, buf.dtype.np)
  buf.copyout(memoryview(out).cast("B"))
  return out


def rng(seed=0): return np.random.default_rng(seed)


CASES = {
  "matmul_packed": lambda r: Tensor(r.standard_normal((64, 48), dtype=np.float32)) @ Tensor(r.standard_normal((48, 64), dtype=np.float32)),
  "matmul_plain": lambda r: Tensor(r.standard_normal((12, 20), dtype=np.float32)) @ Tensor(r.standard_normal((20, 24), dtype=np.float32)),
  "sum_rows": lambda r: Tensor(r.standard_normal((32, 48), dtype=np.float32)).sum(1),
  "max_cols": lambda r: Tensor(r.standard_normal((32, 48), dtype=np.float32)).max(0),
  "relu_affine": lambda r: (Tensor(r.standard_normal((16, 32), dtype=np.float32)) * 3 + 1).relu(),
  "where_broadcast": lambda r: (Tensor(r.standard_normal((16, 1), dtype=np.float32)) > 0).where(
      Tensor(r.standard_normal((1, 32), dtype=np.float32)), 2.0),
  "odd_sizes": lambda r: (Tensor(r.standard_normal((7, 13), dtype=np.float32)) * Tensor(r.standard_normal((13,), dtype=np.float32))).exp(),
  "odd_reduce": lambda r: Tensor(r.standard_normal((30, 45), dtype=np.float32)).sum(0) / 3,
  "f64_mean": lambda r: Tensor(r.standard_normal((8, 64))).mean(1, keepdim=True) * Tensor(r.standard_normal((8, 64))),
  # positions compared in vector lanes (integer lanes: lane 0's position plus 3 * lane), a mask as a causal one is
  "positions_mask": lambda r: ((Tensor.arange(64).reshape(1, 64) * 3 - 5 < Tensor.arange(16).reshape(16, 1) * 7) |
                               (Tensor.arange(64).reshape(1, 64) == 9)).where(Tensor(r.standard_normal((16, 64), dtype=np.float32)), -1.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_single_opt_matches_unoptimized(name):
  """Each opt BEAM may try (UPCAST/THREAD/SWAP/PADTO of every global axis, UNROLL of every reduce axis) gives the
  unoptimized result."""
  spec, bufs = last_kernel(CASES[name](rng(1)))
  want = run_with(spec, bufs, [])
  acts = actions(spec.ast, 2)
  assert acts
  kinds = {a.op for a in acts}
  if name.startswith("odd"): assert "PADTO" in kinds, acts
  if name in ("sum_rows", "matmul_packed", "odd_reduce"): assert "UNROLL" in kinds, acts
  for a in acts:
    got = run_with(spec, bufs, [a])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {a}")


@pytest.mark.parametrize("name", list(CASES))
def test_opt_sequences_match_unoptimized(name):
  """Random sequences of up to four opts (what BEAM builds) and the heuristic's choice give the same result."""
  spec, bufs = last_kernel(CASES[name](rng(2)))
  want = run_with(spec, bufs, [])
  seqs, r = [hand_coded_opts(spec.ast, 2)], random.Random(name)
  while len(seqs) < 12:
    seq, ast = [], spec.ast
    for _ in range(r.randint(2, 4)):
      acts = actions(ast, 2)
      if not acts: break
      seq.append(r.choice(acts))
      try: ast = apply_opts(spec.ast, seq)
      except OptError: seq.pop(); break
    seqs.append(seq)
  for seq in seqs:
    np.testing.assert_allclose(run_with(spec, bufs, seq), want, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {seq}")


@pytest.mark.parametrize("shape", [((256, 128), (128, 96)), ((3, 64, 80), (80, 64)), ((2, 1, 40, 96), (3, 96, 128)),
                                   ((100, 70), (70, 128)), ((7, 33), (33, 64)), ((128, 64), (64, 32))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_shapes_match_numpy(shape, dtype):
  r = rng(3)
  a, b = (r.standard_normal(s).astype(dtype) for s in shape)
  got = (Tensor(a) @ Tensor(b)).numpy()
  want = a.astype(np.float64) @ b.astype(np.float64)
  tol = 1e-4 if dtype == np.float32 else 1e-10
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n,k,m", [(96, 48, 80), (36, 20, 48), (64, 33, 16), (128, 64, 256), (20, 12, 36),
                                   (50, 24, 32), (1000, 7, 48), (52, 64, 64)])
def test_linear_layer_matmul_forms_match_numpy(n, k, m):
  """The three products of a linear layer's step, x @ W, dy @ W^T and x^T @ dy (AVX2: 6-row x 2-vector register tiles
  from 48 rows, padded where 6 does not divide them (50, 64, 128, 1000, 52 rows), 4-row ones below, the 8 x 8 or
  scalar tiles elsewhere), and a batched x @ W."""
  r = rng(5)
  x, w, dy = (r.standard_normal(s).astype(np.float32) for s in ((n, k), (k, m), (n, m)))
  X, W, DY = Tensor(x), Tensor(w), Tensor(dy)
  f64 = lambda a: a.astype(np.float64)
  for got, want in (((X @ W).numpy(), f64(x) @ f64(w)), ((DY @ W.T).numpy(), f64(dy) @ f64(w).T),
                    ((X.T @ DY).numpy(), f64(x).T @ f64(dy)),
                    ((X.reshape(2, n // 2, k) @ W).numpy(), (f64(x) @ f64(w)).reshape(2, n // 2, m))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_gradient_forms_pack_both_operands(dtype):
  """A weight gradient x^T @ dy reduces over the rows of both: written x.T @ dy (a transposed left operand) and as
  autograd builds it (a sum over the first axis of x[:, :, None] * dy[:, None, :]), a large one copies x into row
  panels and dy into column strips (two copy kernels, then the product); x computed from a reduction (a matmul's
  output) is not copied into panels (the copy would compute it). Against numpy."""
  r = rng(21)
  n, k, m = 264, 256, 256
  x, dy = r.standard_normal((n, k)).astype(dtype), r.standard_normal((n, m)).astype(dtype)
  X, DY = Tensor(x), Tensor(dy)
  want = x.astype(np.float64).T @ dy.astype(np.float64)
  tol = 1e-4 if dtype == np.float32 else 1e-10
  for t in (X.T @ DY, (X.reshape(n, k, 1) * DY.reshape(n, 1, m)).sum(0)):
    names = [i.program.name for i in t.schedule()]
    assert [nm[0] for nm in names] == ["E", "E", "r"], names
    np.testing.assert_allclose(t.numpy(), want, rtol=tol, atol=tol)
  computed = (Tensor(x[:, :128]) @ Tensor(np.eye(128, k, dtype=dtype))).T @ DY
  names = [i.program.name for i in computed.schedule()]
  assert [nm[0] for nm in names] == ["E", "r", "E", "r"], names     # each product's strips, no panels
  np.testing.assert_allclose(computed.numpy(), np.eye(128, k).T @ x[:, :128].T.astype(np.float64) @ dy, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float16", "Q8_0"])
def test_few_rows_times_a_narrow_weight_share_each_converted_vector(dtype):
  """A few input rows (a prompt's tokens) @ W.T with W float16 or quantized: the step's outputs are 4 rows of the
  input (UPCAST of the input's row axis), so each converted weight vector serves 4 of them. Against numpy."""
  r = rng(19)
  wn = r.random((96, 256), dtype=np.float32) - 0.5
  w, wn = narrow_weight(wn, dtype)
  xn = r.random((12, 256), dtype=np.float32)
  items = (Tensor(xn) @ w.T).schedule()
  prog = items[-1].program
  assert Opt("UPCAST", 0, 4) in prog.meta["opts"], prog.meta["opts"]
  run_schedule(items, sync=True)
  np.testing.assert_allclose(read(items[-1].bufs[0]).reshape(12, 96), xn.astype(np.float64) @ wn.T, rtol=1e-5, atol=1e-5)


def test_many_small_matmuls_are_packed():
  """Attention's batched products (64 heads x batches of 64 x 16 @ 16 x 64, 4M multiply-adds in all, 64K each): the
  batch counts toward the packing threshold, so the right operand is copied into strips once for all of them."""
  r = rng(7)
  q, k = r.standard_normal((16, 4, 64, 16), dtype=np.float32), r.standard_normal((16, 4, 16, 64), dtype=np.float32)
  items = (Tensor(q) @ Tensor(k)).schedule()
  assert len(items) == 2, [i.program.name for i in items]
  run_schedule(items, sync=True)
  np.testing.assert_allclose(read(items[-1].bufs[0]).reshape(16, 4, 64, 64), q.astype(np.float64) @ k, rtol=1e-4, atol=1e-5)
  single = (Tensor(q[0, 0]) @ Tensor(k[0, 0])).schedule()          # one of them alone stays unpacked
  assert len(single) == 1, [i.program.name for i in single]


def test_large_matmul_is_packed_and_vectorized():
  """The 1024 matmul packs its right operand into (m/w, k, w) strips and runs on vector types."""
  w = matmul_pack_width("CPU", dtypes.float32, 1024, 1024, 1024)
  assert w in (8, 16)
  r = rng(4)
  a, b = r.random((256, 192), dtype=np.float32), r.random((192, 256), dtype=np.float32)
  items = (Tensor(a) @ Tensor(b)).schedule()
  assert len(items) == 2, [i.program.name for i in items]                 # the packing copy, then the product
  src = items[-1].program.source
  assert f"bg_f32x{w}" in src and "acc0[" in src, src
  run_schedule(items, sync=True)
  strips = read(items[0].bufs[0]).reshape(256 // w, 192, w)               # strips[jb, kk, l] = b[kk, jb*w + l]
  np.testing.assert_array_equal(strips, b.reshape(192, 256 // w, w).transpose(1, 0, 2))
  np.testing.assert_allclose(read(items[-1].bufs[0]).reshape(256, 256), a.astype(np.float64) @ b, rtol=1e-4)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_16_bit_float_matmul_is_packed_in_float32(dt):
  """A matmul of two 16-bit float operands on the CPU is computed in float32: B copied into float32 strips, exact
  products summed in float32, the result rounded once to the 16-bit type (the unpacked kernel rounded every product
  to 16 bits, one scalar at a time). Against numpy in float64 on the same 16-bit inputs: within the output's rounding."""
  r = rng(9)
  a = r.random((256, 192), dtype=np.float32)
  b = r.random((192, 256), dtype=np.float32)
  ta, tb = Tensor(a).cast(dt).realize(), Tensor(b).cast(dt).realize()
  items = (ta @ tb).schedule()
  assert len(items) == 2, [i.program.name for i in items]                 # the float32 strips, then the product
  assert items[0].bufs[0].dtype == dtypes.float32
  got = (ta @ tb).float().numpy().astype(np.float64)
  ref = ta.float().numpy().astype(np.float64) @ tb.float().numpy().astype(np.float64)
  ulp = 2.0 ** (-8 if dt == "bfloat16" else -11)                          # the 16-bit type's relative rounding
  assert np.max(np.abs(got - ref) / np.abs(ref)) <= ulp * 1.01


def _round_to(dt: str, a: np.ndarray) -> np.ndarray:
  """float64 values rounded once to float16 or bfloat16 (round to nearest even; bfloat16 from float32's bits), as
  float32."""
  if dt == "float16": return a.astype(np.float16).astype(np.float32)
  bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_16_bit_float_matvec_exact_products_in_vector_lanes(dt, monkeypatch):
  """A 16-bit float matrix-vector product on the CPU (too small to pack): exact products summed in float32, the
  result rounded once, with optimizations on and off (products rounded to 16 bits each kept it scalar: a 2048x2048
  float16 x @ W.T ran 3.2 GB/s; and they made 35 of these 96 outputs differ from the once-rounded product), both
  layouts; x @ W.T's reduction in float32 vector lanes though the output is 16-bit. Reference: numpy's float64
  product of the same 16-bit inputs, rounded once (a float32 sum may round differently in a rare output)."""
  from baregrad.compiler import codegen
  r = rng(10)
  x, w = r.standard_normal((1, 512), dtype=np.float32), r.standard_normal((96, 512), dtype=np.float32)
  tx, tw = Tensor(x).cast(dt).realize(), Tensor(w).cast(dt).realize()
  ref = _round_to(dt, tx.float().numpy().astype(np.float64) @ tw.float().numpy().astype(np.float64).T)
  for opt in (1, 0):
    monkeypatch.setattr(codegen, "OPT", opt)
    for y in (tx @ tw.T, tx @ tw.T.contiguous().realize()):
      assert np.count_nonzero(y.float().numpy() != ref) <= 2, (opt, y.float().numpy() - ref)
  monkeypatch.setattr(codegen, "OPT", 1)
  src = (tx @ tw.T).schedule()[-1].program.source
  assert "bg_f32x8 acc0[" in src or "bg_f32x16 acc0[" in src, src


@pytest.mark.parametrize("avx512", [False, True])
def test_matmul_graph_does_not_depend_on_the_host(monkeypatch, avx512):
  """The Tensor layer builds one matmul graph (a product summed over k, no copy) whatever the CPU; the scheduler's
  rewrite packs it, with strips as wide as the host's vector registers."""
  from baregrad.compiler import opt
  a, b = Tensor(np.ones((256, 192), np.float32)), Tensor(np.ones((192, 256), np.float32))
  plain = (a @ b).uop
  monkeypatch.setattr(opt, "_AVX512", avx512)
  assert (a @ b).uop is plain
  nodes = plain.toposort()
  assert not any(u.op is Ops.CONTIGUOUS for u in nodes)
  (reduce,) = [u for u in nodes if u.op is Ops.REDUCE_AXIS]
  x, y, perm = matmul_operands(reduce)
  assert x.shape == (256, 1, 192) and y.shape == (1, 256, 192) and perm == (0, 1, 2)
  w = 16 if avx512 else 8
  packed = pack_matmuls(plain.sink())[0].toposort()
  assert [u.shape for u in packed if u.op is Ops.CONTIGUOUS] == [(256 // w, 192, w)]
  assert [u.src[0].shape for u in packed if u.op is Ops.REDUCE_AXIS] == [(256, 256 // w, 192, w)]


def test_packed_matmul_gradients_match_numpy():
  r = rng(5)
  a, b, g = r.standard_normal((64, 96)), r.standard_normal((96, 128)), r.standard_normal((64, 128))
  A, B = Tensor(a.astype(np.float32), requires_grad=True), Tensor(b.astype(np.float32), requires_grad=True)
  ((A @ B) * Tensor(g.astype(np.float32))).sum().backward()
  np.testing.assert_allclose(A.grad.numpy(), g @ b.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(B.grad.numpy(), a.T @ g, rtol=1e-4, atol=1e-4)


def test_two_layer_gradients_pack_each_matmul_once():
  """Packing composes: the second layer's product reads the first one's packed result (no unpacked copy of it is
  computed again), the gradient dX = dOut @ W.T is packed too, and every gradient matches numpy."""
  r = rng(6)
  x, w1, w2 = r.standard_normal((64, 128)), r.standard_normal((128, 128)) * 0.1, r.standard_normal((128, 128)) * 0.1
  X, W1, W2 = (Tensor(v.astype(np.float32), requires_grad=True) for v in (x, w1, w2))
  ((X @ W1).relu() @ W2).square().sum().backward()
  names = [i.program.name for i in Tensor.schedule(X.grad, W1.grad, W2.grad)]
  assert sum(n.startswith("r_") for n in names) == 6, names   # 2 forward, 4 gradient products (dh dX dW1 dW2)
  assert sum(n.startswith("E_") for n in names) == 4, names   # strips of W1, W2 (forward), W2.T and W1.T (dh dX)
  h = x @ w1
  g2 = 2 * (np.maximum(h, 0) @ w2)
  g1 = (g2 @ w2.T) * (h > 0)
  np.testing.assert_allclose(X.grad.numpy(), g1 @ w1.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(W1.grad.numpy(), x.T @ g1, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(W2.grad.numpy(), np.maximum(h, 0).T @ g2, rtol=1e-4, atol=1e-4)


def test_no_packing_without_opts(monkeypatch):
  """OPT=0 schedules the plain matmul (one kernel); other devices, integer and small matmuls are never packed."""
  from baregrad.compiler import codegen
  r = rng(8)
  a, b = r.random((128, 96), dtype=np.float32), r.random((96, 128), dtype=np.float32)
  codegen.clear_programs()
  assert len((Tensor(a) @ Tensor(b)).schedule()) == 2
  codegen.clear_programs()
  monkeypatch.setattr(codegen, "OPT", 0)
  items = (Tensor(a) @ Tensor(b)).schedule()
  assert len(items) == 1, [i.program.name for i in items]
  run_schedule(items, sync=True)
  np.testing.assert_allclose(read(items[0].bufs[0]).reshape(128, 128), a.astype(np.float64) @ b, rtol=1e-4)
  codegen.clear_programs()
  assert matmul_pack_width("CPU", dtypes.float32, 1024, 1024, 1024)
  assert matmul_pack_width("NV", dtypes.float32, 1024, 1024, 1024) == 0
  assert matmul_pack_width("CPU", dtypes.int32, 1024, 1024, 1024) == 0
  assert matmul_pack_width("CPU", dtypes.float32, 64, 48, 64) == 0


def test_switching_opt_at_run_time_schedules_anew(monkeypatch):
  """A program that switches OPT (or BEAM) at run time gets schedules made under the new setting: the cached plan of
  the same graph (a packed matmul, two kernels) is not reused with OPT=0 (one plain kernel), nor the other way."""
  from baregrad.compiler import codegen
  r = rng(9)
  a, b = r.random((128, 96), dtype=np.float32), r.random((96, 128), dtype=np.float32)
  A, B = Tensor(a).realize(), Tensor(b).realize()
  for opt, kernels in ((1, 2), (0, 1), (1, 2)):
    monkeypatch.setattr(codegen, "OPT", opt)
    assert len((A @ B).schedule()) == kernels, opt
    np.testing.assert_allclose((A @ B).numpy(), a.astype(np.float64) @ b, rtol=1e-4)

@pytest.mark.parametrize("lanes", [2, 4, 8, 16, 32])
def test_vector_lanes_with_offsets_and_scalars(lanes):
  """Vector lanes over a strided, offset view mixed with a broadcast scalar column and division."""
  r = rng(6)
  x, y = r.standard_normal((8, 2 * lanes + 3), dtype=np.float32), r.uniform(1, 2, (8, 1)).astype(np.float32)
  t = (Tensor(x)[:, 3:3 + lanes] * 2 - Tensor(x)[:, 1:1 + lanes]) / Tensor(y)
  spec, bufs = last_kernel(t)
  got = run_with(spec, bufs, [Opt("UPCAST", 1, lanes)])
  np.testing.assert_allclose(got.reshape(8, lanes), (x[:, 3:3 + lanes] * 2 - x[:, 1:1 + lanes]) / y, rtol=1e-6)
  assert f"bg_f32x{lanes}" in get_program(dataclasses.replace(spec, opts=(Opt("UPCAST", 1, lanes),))).source


def test_unroll_and_padto_render_as_intended():
  """UNROLL gives the reduce an inner loop the compiler unrolls; PADTO rounds an axis up and gates the extra
  iterations (no load or store past the end: the buffers are exact-size, and the output matches)."""
  r = rng(7)
  x = r.standard_normal((30, 45), dtype=np.float32)
  spec, bufs = last_kernel(Tensor(x).sum(1))
  src = get_program(dataclasses.replace(spec, opts=(Opt("UNROLL", 0, 3),))).source
  assert "#pragma GCC unroll 3" in src, src
  np.testing.assert_allclose(run_with(spec, bufs, [Opt("UNROLL", 0, 3)]), x.sum(1), rtol=1e-5, atol=1e-5)
  opts = [Opt("PADTO", 0, 32), Opt("UPCAST", 0, 8), Opt("THREAD", 0, 2)]
  np.testing.assert_allclose(run_with(spec, bufs, opts), x.sum(1), rtol=1e-5, atol=1e-5)
  src = get_program(dataclasses.replace(spec, opts=tuple(opts))).source
  assert "< 30" in src.replace("LL", "") or "<30" in src.replace("LL", ""), src
  with pytest.raises(OptError, match="already a multiple"): apply_opts(spec.ast, [Opt("PADTO", 0, 10)])
  with pytest.raises(OptError, match="does not split"): apply_opts(spec.ast, [Opt("UNROLL", 0, 7)])


def test_beam_through_realize(monkeypatch, tmp_path):
  """BEAM=1 end to end: realize() compiles on the compiler's thread while holding the runtime lock, and BEAM's timed
  runs (which copy into buffers under that lock) run there too; the result is numpy's. A fresh cache: a real search."""
  from baregrad.compiler import codegen
  from baregrad.drivers import settings
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(codegen, "BEAM", 1)
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 56)).astype(np.float32)
  got = (Tensor(a) @ Tensor(b) + 3).numpy()
  np.testing.assert_allclose(got, a @ b + 3, rtol=1e-4, atol=1e-4)
  assert list((tmp_path / "beam").iterdir()), "BEAM wrote no cache entry: it did not search"


@pytest.mark.skipif((__import__("os").cpu_count() or 1) < 2, reason="needs 2 cores")
def test_a_cold_schedule_compiles_its_kernels_in_parallel(monkeypatch):
  """The kernels of one schedule that are not loaded yet are compiled by a pool: two compiles meet at a barrier
  (which times out if they run one after another)."""
  import threading
  from baregrad.compiler import codegen
  barrier, calls, original = threading.Barrier(2, timeout=30), [], codegen.compile_source
  def meet(device, src, renderer=None):
    calls.append(threading.get_ident())
    if len(calls) <= 2: barrier.wait()
    return original(device, src, renderer)
  monkeypatch.setattr(codegen, "compile_source", meet)
  codegen.clear_programs()
  r = rng(11)
  a, b = Tensor(r.random(97, dtype=np.float32)), Tensor(r.random(97, dtype=np.float32))
  outs = [(a * 3.25 + b).exp2(), (a - b * 1.5).sqrt(), (a.reshape(97, 1) * b).sum(1)]
  Tensor.realize(*outs)
  assert len(set(calls[:2])) == 2
  np.testing.assert_allclose(outs[0].numpy(), np.exp2(a.numpy() * 3.25 + b.numpy()), rtol=1e-5)
  codegen.clear_programs()


def test_beam_never_loses_to_the_heuristic(monkeypatch, tmp_path):
  """The heuristic's opts are a candidate from the start: when every other candidate measures slower, BEAM returns
  exactly them (a deterministic stand-in for the timer: the heuristic's choice costs least, everything else more)."""
  from baregrad.compiler import search
  from baregrad.drivers import settings
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  spec, _ = last_kernel(CASES["matmul_plain"](rng(3)))
  heuristic = hand_coded_opts(spec.ast)
  assert heuristic
  timed = []
  def fake_time(spec_, opts, compile_kernel, repeats=3):
    timed.append(list(opts))
    return 1.0 if list(opts) == list(heuristic) else 2.0 + 0.01 * len(opts)
  monkeypatch.setattr(search, "time_program", fake_time)
  got = search.beam_search(spec, 2, get_program, default=heuristic)
  assert got == list(heuristic) and len(timed) > 2     # it searched, and kept the best measured
  n = len(timed)
  assert search.beam_search(spec, 2, get_program, default=heuristic) == list(heuristic)   # the cached winner
  assert len(timed) == n
  search.beam_search(spec, 2, get_program, default=heuristic[:-1])   # another heuristic: the kernel is searched again
  assert len(timed) > n


@pytest.mark.parametrize("head_to_head_winner", ["search", "heuristic"])
def test_beam_winner_must_beat_the_heuristic_head_to_head(monkeypatch, tmp_path, head_to_head_winner):
  """The search's quick timings pick a candidate; it replaces the heuristic's choice only if it is faster by a margin
  when the two take turns on the same warm buffers (stand-ins for both timers: the quick one favours the candidate,
  the head-to-head one the side the parameter names)."""
  from baregrad.compiler import search
  from baregrad.drivers import settings
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  spec, _ = last_kernel(CASES["matmul_plain"](rng(3)))
  heuristic = hand_coded_opts(spec.ast)
  monkeypatch.setattr(search, "time_program", lambda s, opts, c, repeats=3: 1.0 / (1 + len(opts)) + (1 if list(opts) == heuristic else 0))
  heuristic_prog = get_program(dataclasses.replace(spec, opts=tuple(heuristic)))
  def run_times(s, prog, bufs, repeats):
    fast = (prog is heuristic_prog) == (head_to_head_winner == "heuristic")
    return [1.0 if fast else 1.5] * repeats
  monkeypatch.setattr(search, "_run_times", run_times)
  got = search.beam_search(spec, 2, get_program, depth=2, default=heuristic)
  assert (got == heuristic) == (head_to_head_winner == "heuristic"), got


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_lanes_with_masks_selects_and_max(dtype):
  """Comparisons, bool logic, selects, max and bool -> float casts inside vector lanes run as masks (integer vectors
  as wide as the lanes): bit for bit the scalar kernel's values, NaN and -0.0 included, and numpy's up to the order
  of the sum."""
  r = rng(12)
  x, y = r.standard_normal((8, 64)).astype(dtype), r.standard_normal((8, 64)).astype(dtype)
  x[0, :4] = [np.nan, -0.0, 0.0, np.inf]
  y[0, :4] = [1.0, 0.0, np.nan, -np.inf]
  X, Y = Tensor(x), Tensor(y)
  t = (((X > 0) | (Y < -1)).where(X * 2, Y).maximum(Y - 1) + (Y < X).cast(X.dtype) * 3 + (X != Y).where(1.5, X)
       + (~(X < 0.5)).where(X, -0.0))
  want = (np.maximum(np.where((x > 0) | (y < -1), x * 2, y), y - 1) + (y < x) * 3 + np.where(x != y, 1.5, x)
          + np.where(~(x < 0.5), x, -0.0))
  spec, bufs = last_kernel(t)
  lanes = 64 // np.dtype(dtype).itemsize
  src = get_program(dataclasses.replace(spec, opts=(Opt("UPCAST", 1, lanes),))).source
  assert f"bg_i{8 * np.dtype(dtype).itemsize}x{lanes}" in src and f"bg_f{8 * np.dtype(dtype).itemsize}x{lanes}" in src, src
  got = run_with(spec, bufs, [Opt("UPCAST", 1, lanes)])
  bits = np.int32 if dtype == np.float32 else np.int64
  np.testing.assert_array_equal(got.view(bits), run_with(spec, bufs, []).view(bits))
  np.testing.assert_allclose(got.reshape(8, 64), want, rtol=1e-6)



@pytest.mark.parametrize("offset", [0, 3])
def test_causal_mask_positions_in_vector_lanes(offset):
  """Attention scores with a causal mask fused in (q @ k.T * scale + triu(-inf)): the mask compares the key's position
  with the query's, positions that depend on the vector lanes; they run as integer lanes (lane 0's position plus
  0..n-1) compared into masks, so the scores get the wide register tile a matmul gets (they ran as a 4 x 4 tile of
  scalar copies, 5x slower). The values are numpy's, the masked ones exactly -inf."""
  r = rng(14)
  q, k = (r.standard_normal((4, 4, 64, 16)).astype(np.float32) for _ in range(2))   # (large enough to pack)
  t = (Tensor(q) @ Tensor(k).transpose(-1, -2)) * 0.25 + Tensor.full((64, 64), float("-inf")).triu(1 + offset)
  prog = t.schedule()[-1].program
  lanes = 16 if has_avx512() else 8
  assert Opt("UPCAST", 3, lanes) in prog.meta["opts"], prog.meta["opts"]
  assert f"bg_i32x{lanes}" in prog.source and "{0, 1, 2, 3" in prog.source, prog.source
  want = (q @ k.transpose(0, 1, 3, 2)) * 0.25 + np.triu(np.full((64, 64), -np.inf, np.float32), 1 + offset)
  got = t.numpy()
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_packed_matmul_strips_on_their_own_axis_get_the_row_tile():
  """A packed matmul whose output is viewed as (rows, strips, 1, 8) (the gradient of a 3-d activation times a weight:
  the strips are an axis of their own, the 8 lanes another) gets the matmul's register tile over rows and two strips,
  not a 1 x 64 tile across the strips (9 loads per 8 FMAs: a training step's 1024 x 256 @ 256 x 64 took 2x as long).
  The gradient matches numpy."""
  r = rng(15)
  x, w1, w2 = (r.standard_normal(s).astype(np.float32) for s in ((16, 64, 64), (256, 64), (64, 256)))
  X, W1, W2 = (Tensor(a, requires_grad=True) for a in (x, w1, w2))
  ((X @ W1.T).square() @ W2.T).sum().backward()
  items = X.grad.schedule()
  if not has_avx512():    # (AVX-512 packs 16-wide strips, another form)
    strips = [i for i in items if i.program.name == "r_1024_32_1_8_64"]
    assert strips, [i.program.name for i in items]
    for it in strips: assert Opt("UPCAST", 0, 6) in it.meta["opts"], it.meta["opts"]
  h = x @ w1.T
  want = ((2 * h) * w2.sum(0)) @ w1        # d/dx of sum((x @ w1.T)^2 @ w2.T)
  np.testing.assert_allclose(X.grad.numpy(), want, rtol=2e-4, atol=2e-3)

def test_relu_gradient_is_a_vector_tile_and_strided_lanes_stay_few():
  """The backward of a relu MLP: the weight gradient with the relu mask fused in gets the widest vector tile (masks in
  vector lanes), and a kernel whose lanes read an operand with a stride (dh = dOut @ W2.T) gets at most 16 scalar
  lanes (the C compiler vectorizes those itself, seconds for hundreds of them). Gradients match numpy."""
  from baregrad.compiler import codegen
  r = rng(13)
  x, w1, w2 = r.standard_normal((64, 784)), r.standard_normal((784, 128)) * 0.05, r.standard_normal((128, 10)) * 0.05
  X = Tensor(x.astype(np.float32))
  W1, W2 = (Tensor(w.astype(np.float32), requires_grad=True) for w in (w1, w2))
  (X @ W1).relu().matmul(W2).log_softmax().mean().backward()
  codegen.clear_programs()
  items = Tensor.schedule(W1.grad, W2.grad)
  by_name = {i.program.name: i.program for i in items}
  dw1 = by_name["r_784_128_64"]
  # (the 8 x 32 tile with its strips outside the rows, SWAP, is the AVX-512 one: 32 vector registers; with AVX2 one
  # register of 8 lanes per row: 8 rows of 16 lanes would be 16 accumulators, every register, and spill)
  lanes = 16 if has_avx512() else 8
  assert f"bg_f32x{lanes}" in dw1.source and f"bg_i32x{lanes}" in dw1.source, dw1.source
  assert ("SWAP" in str(dw1.meta["opts"])) == has_avx512(), dw1.meta["opts"]
  for prog in by_name.values():
    opts = prog.meta.get("opts", ())
    lanes = int(np.prod([o.amount for o in opts if o.op == "UPCAST"])) if opts else 1
    assert lanes <= 16 or "bg_f32x" in prog.source, (prog.name, opts)
  run_schedule(items, sync=True)
  h = x @ w1
  p = np.maximum(h, 0) @ w2
  soft = np.exp(p - p.max(1, keepdims=True))
  soft /= soft.sum(1, keepdims=True)
  g = (1 - 10 * soft) / (64 * 10)    # d mean(log_softmax) / d logits
  np.testing.assert_allclose(W2.grad.numpy(), np.maximum(h, 0).T @ g, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(W1.grad.numpy(), x.T @ ((g @ w2.T) * (h > 0)), rtol=1e-4, atol=1e-5)


def test_index_linear_folds_a_split_axis_back():
  """(x // c) * c + x % c is x: a view that splits an axis and merges it again leaves that pair in its index, and the
  vector lanes must see the unit stride through it. Checked against the integer arithmetic itself."""
  from baregrad.compiler.uop import UOp
  from baregrad.compiler.render_c import index_linear
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 8),), (0, "global"))
  j = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 128),), (1, "global"))
  x = i * 128 + j
  idx = (x // 16) * 16 + x % 16 + 5
  assert index_linear(idx) == ({i: 128, j: 1}, 5)
  other = (x // 16) * 32 + x % 16             # a real re-layout (strips twice as far apart): left alone
  terms, _ = index_linear(other)
  assert j not in terms
  for a in range(8):                          # the folded form is the value
    for b in range(0, 128, 7): assert (a * 128 + b) // 16 * 16 + (a * 128 + b) % 16 + 5 == a * 128 + b + 5


def test_large_elementwise_stores_stream_and_tolerate_unaligned_outputs():
  """A 16 MiB elementwise result is written with non-temporal vector stores (one per vector of lanes, fenced at the
  end): the values are numpy's, into a fresh buffer and into one that starts 4 bytes into its allocation (not aligned
  to the vector: the kernel falls back to plain stores). A small one stores plainly."""
  from baregrad.compiler.render_c import NT_STORE_BYTES
  n = NT_STORE_BYTES // 4
  r = rng(14)
  x, y = r.random(n, dtype=np.float32), r.random(n, dtype=np.float32)
  spec, bufs = last_kernel(Tensor(x) * 2 + Tensor(y))
  opts = hand_coded_opts(spec.ast, 2)
  assert opts[0].op == "UPCAST" and any(o.op == "THREAD" for o in opts), opts
  prog = get_program(dataclasses.replace(spec, opts=tuple(opts)))
  assert "bg_stream_" in prog.source and "sfence" in prog.source, prog.source
  np.testing.assert_array_equal(run_with(spec, bufs, opts), x * 2 + y)
  base = Buffer(bufs[0].device, n + 16, dtypes.float32)
  view = Buffer(bufs[0].device, n, dtypes.float32, base=base, offset=4)
  run_schedule([ExecItem(prog, [view, *bufs[1:]], {}, prog.meta)], sync=True)
  np.testing.assert_array_equal(read(view), x * 2 + y)
  small, sbufs = last_kernel(Tensor(x[:4096]) * 2 + Tensor(y[:4096]))
  assert "bg_stream_" not in get_program(dataclasses.replace(small, opts=tuple(hand_coded_opts(small.ast, 2)))).source


def test_chunks_and_two_axis_threads_match_unoptimized():
  """THREAD cuts an axis into more chunks than cores (the cores claim them one at a time), a second THREAD cuts
  another axis too (chunk = first * n + second): both give the unoptimized result. The heuristic cuts a large square
  matmul along both axes (panels of rows x groups of column strips), several chunks per core."""
  spec, bufs = last_kernel(CASES["matmul_packed"](rng(15)))
  want = run_with(spec, bufs, [])
  for opts in ([Opt("THREAD", 0, 16)], [Opt("THREAD", 0, 4), Opt("THREAD", 1, 2)], [Opt("THREAD", 1, 2), Opt("THREAD", 0, 8)],
               [Opt("UPCAST", 1, 16), Opt("THREAD", 0, 2), Opt("THREAD", 0, 4)]):
    np.testing.assert_allclose(run_with(spec, bufs, opts), want, rtol=1e-5, atol=1e-5, err_msg=str(opts))
  with pytest.raises(OptError, match="chunks"): apply_opts(spec.ast, [Opt("THREAD", 0, 8), Opt("THREAD", 1, 1024)])
  big, _ = last_kernel(Tensor(np.ones((1024, 1024), np.float32)) @ Tensor(np.ones((1024, 1024), np.float32)))
  threads = [o for o in hand_coded_opts(big.ast, 2) if o.op == "THREAD"]
  assert np.prod([o.amount for o in threads]) >= 8, threads
  # panels of rows x groups of strips: the AVX-512 tile's layout (with AVX2 the row blocks alone are the chunks)
  assert len({o.axis for o in threads}) == (2 if has_avx512() else 1), threads


def test_packing_copy_reads_its_source_in_order():
  """The copy that packs a matmul's right operand into strips runs vector lanes and walks the source row by row
  (the strips' axis innermost), and the strips hold what numpy says."""
  r = rng(16)
  a, b = r.random((256, 192), dtype=np.float32), r.random((192, 256), dtype=np.float32)
  items = (Tensor(a) @ Tensor(b)).schedule()
  pack = items[0].program
  assert [o.op for o in pack.meta["opts"]][:2] == ["UPCAST", "SWAP"], pack.meta["opts"]
  run_schedule(items, sync=True)
  w = matmul_pack_width("CPU", dtypes.float32, 256, 192, 256)
  np.testing.assert_array_equal(read(items[0].bufs[0]).reshape(256 // w, 192, w), b.reshape(192, 256 // w, w).transpose(1, 0, 2))
  np.testing.assert_allclose(read(items[-1].bufs[0]).reshape(256, 256), a.astype(np.float64) @ b, rtol=1e-4)


def narrow_weight(wn: np.ndarray, dtype: str) -> tuple[Tensor, np.ndarray]:
  """wn as a weight Tensor of `dtype` (float16, bfloat16, or Q8_0 blocks written by the gguf package) and the
  float values it holds (gguf's own dequantization)."""
  if dtype != "Q8_0":
    w = Tensor(wn).cast(dtype).realize()
    return w, w.cast("float32").numpy()
  import gguf
  from baregrad.tensor.ggml_quants import dequantize
  raw = gguf.quants.quantize(wn, gguf.GGMLQuantizationType.Q8_0)
  w = dequantize(Tensor(raw.reshape(-1).view(np.uint8), dtype=dtypes.uint8), "Q8_0", wn.shape)
  return w, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(wn.shape)


@pytest.mark.parametrize("dtype,k", [("float32", 256), ("float16", 256), ("bfloat16", 256), ("Q8_0", 256),
                                     ("float16", 1024), ("Q8_0", 1024), ("float32", 200)])
def test_matvec_streams_its_weight_in_vector_lanes(dtype, k):
  """x @ W.T with one row of x: the reduced axis is W's contiguous one, so the heuristic puts the vector lanes there
  (REDUCE_LANES: a partial sum per lane, the lanes summed at the end) and the weight's narrow elements (float16,
  bfloat16, quantized bytes) are converted in those lanes; nothing packs or copies W. Rows of a multiple of 32 are
  read 4 vectors a step into 4 accumulators, rows of >= 512 bytes with a software prefetch ahead of the loads; 200
  (25 vectors) one vector a step. Against numpy."""
  r = rng(17)
  wn = (r.random((96, k), dtype=np.float32) - 0.5)
  w, wn = narrow_weight(wn, dtype)
  xn = r.random((1, k), dtype=np.float32)
  items = (Tensor(xn) @ w.T).schedule()
  assert len(items) == 1, [i.name for i in items]
  prog = items[0].program
  lanes = [o for o in prog.meta["opts"] if o.op == "REDUCE_LANES"]
  assert len(lanes) == (2 if k % 32 == 0 else 1), prog.meta["opts"]
  assert "bg_f32x" in prog.source, prog.source
  row_bytes = k // 32 * 34 if dtype == "Q8_0" else k * np.dtype(dtype if dtype != "bfloat16" else "float16").itemsize
  assert ("__builtin_prefetch" in prog.source) == (row_bytes >= 512), prog.source
  run_schedule(items, sync=True)
  np.testing.assert_allclose(read(items[0].bufs[0]).reshape(1, 96), xn.astype(np.float64) @ wn.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,rows,x16", [("float16", 1, False), ("bfloat16", 1, False), ("float32", 1, False),
                                            ("float16", 4, False), ("float16", 1, True)])
def test_matvec_down_the_columns_takes_whole_lines(dtype, rows, x16):
  """x @ W with W stored (in, out) (GPT-2's Conv1D layout, user code's matvec): the reduction walks down W's columns,
  so the vector lanes go along its rows; one row of outputs takes 8 vectors of neighbouring columns a step (whole
  cache lines of each row of W into 8 accumulators), 16-bit float weights converted in those lanes, and a float16
  output (x float16 too) converted once per output after the loop. It took 4 columns a step as scalar copies
  (2048 x 2048 float16: 3.6 ms, now 0.18-0.27). Against numpy."""
  r = rng(18)
  wn = r.random((256, 512), dtype=np.float32) - 0.5           # (in, out)
  w, wn = narrow_weight(wn, dtype)
  xn = r.random((rows, 256), dtype=np.float32)
  if x16: xn = xn.astype(np.float16).astype(np.float32)
  items = ((Tensor(xn).cast("float16") if x16 else Tensor(xn)) @ w).schedule()
  prog = items[-1].program
  assert "bg_f32x" in prog.source, prog.source
  if rows == 1:
    ups = [o.amount for o in prog.meta["opts"] if o.op == "UPCAST"]
    assert np.prod(ups) >= 32 and ups[0] in (8, 16), prog.meta["opts"]
  run_schedule(items, sync=True)
  got = read(items[-1].bufs[0]).reshape(rows, 512).astype(np.float64)
  np.testing.assert_allclose(got, xn.astype(np.float64) @ wn, rtol=1e-3 if x16 else 1e-5, atol=1e-3 if x16 else 1e-5)
