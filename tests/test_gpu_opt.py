"""GPU kernel optimizations on both emulated GPUs, checked against numpy and against the kernel without opts: every
single opt (LOCAL, GROUP, GROUPTOP, UPCAST, UNROLL, PADTO) that applies, seeded random sequences of them, odd
sizes; the heuristic's choice; the workgroup launch and its limits; and that long reductions use many threads.

The emulated GPUs are opened with EMU=1 inside the test (settings.override), whatever the default device is."""
import dataclasses, math, os, random
import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.hcq.device import Device
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.runtime import ExecItem, run_schedule
from baregrad.tensor import Tensor
from baregrad.compiler.uop import Ops
from baregrad.compiler.schedule import normalize
from baregrad.compiler.rangeify import rangeify, KernelSpec
from baregrad.compiler.opt import Opt, OptError, apply_opts
from baregrad.compiler.codegen import get_program, renderer_for, lower
from baregrad.compiler import gpu

DEVICES = ("NV", "AMD", "METAL")
TENSOR_CORE_DEVICES = ("NV", "AMD")   # the renderers that render WMMA ops (compiler/tc.py)


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
  with settings.override(EMU=1):
    dev = Device.get(request.param)
    iface = {"AMD": lambda d: d.kernel, "NV": lambda d: d.k, "METAL": lambda d: d.fw}[dev.driver.name](dev.driver)
    if not iface.emulated: pytest.skip(f"{request.param} is a real GPU here; these tests use the emulated one")
  if not getattr(renderer_for(request.param), "workgroups", False):
    pytest.fail(f"the {request.param} renderer does not render workgroup kernels")
  return request.param


def rng(seed=0): return np.random.default_rng(seed)


def f32(r, *shape): return r.standard_normal(shape, dtype=np.float32)


# name -> (tensor function, numpy function, input shapes)
CASES = {
  "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [(16, 24), (24, 32)]),
  "matmul_odd": (lambda a, b: a @ b, lambda a, b: a @ b, [(7, 13), (13, 9)]),
  "sum_rows": (lambda a: a.sum(1), lambda a: a.sum(1), [(12, 96)]),
  "max_cols": (lambda a: a.max(0), lambda a: a.max(0), [(64, 12)]),
  "sum_all": (lambda a: a.sum(), lambda a: a.sum(), [(4, 512)]),
  "sum_odd": (lambda a: a.sum(0) * 3, lambda a: a.sum(0) * 3, [(45, 30)]),
  "elementwise": (lambda a, b: (a * 3 + b).relu(), lambda a, b: np.maximum(a * 3 + b, 0), [(16, 32), (16, 32)]),
  "elementwise_odd": (lambda a: (a * 2 + 1).exp(), lambda a: np.exp(a * 2 + 1), [(7, 13)]),
  "softmax": (lambda a: a.softmax(1), lambda a: np.exp(a - a.max(1, keepdims=True)) / np.exp(a - a.max(1, keepdims=True)).sum(1, keepdims=True), [(8, 64)]),
  "int_sum": (lambda a: (a * 100).cast("int32").sum(1), lambda a: (a * 100).astype(np.int32).sum(1), [(8, 48)]),
}


def last_kernel(fn, shapes, device, seed=0):
  """The last kernel of fn's schedule on `device`, its input buffers, and numpy's answer."""
  r = rng(seed)
  arrays = [f32(r, *s) for s in shapes]
  t = fn(*(Tensor(a, device=device) for a in arrays))
  items = t.schedule()
  run_schedule(items[:-1], sync=True)
  sink, _, _ = normalize(t.uop.sink())
  spec = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
  return spec, items[-1].bufs, arrays


def run_with(spec, bufs, opts):
  prog = get_program(dataclasses.replace(spec, opts=tuple(opts)))
  out = Buffer(bufs[0].device, bufs[0].size, bufs[0].dtype)
  run_schedule([ExecItem(prog, [out, *bufs[1:]], {}, prog.meta)], sync=True)
  raw = np.empty(out.nbytes, np.uint8)
  out.copyout(memoryview(raw))
  np_dt = np.dtype(out.dtype.np) if np.dtype(out.dtype.np).itemsize == out.dtype.itemsize else np.uint16   # bfloat16: its bits
  return raw.view(np_dt), prog


def check(got, want, dtype):
  if np.issubdtype(dtype, np.integer): np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


ALL_OPTS = os.environ.get("FUZZ_LONG", "0") not in ("", "0")   # FUZZ_LONG=1: every action on every device


def device_share(acts: list, d: int) -> list:
  """The actions device number d runs: of each (op, axis) group's amounts, every third one from the d-th, and at least
  one; the devices together run every action (and all of them each with FUZZ_LONG=1)."""
  if ALL_OPTS: return acts
  groups: dict = {}
  for o in acts: groups.setdefault((o.op, o.axis), []).append(o)
  return [o for g in groups.values() for i, o in enumerate(g) if i % len(DEVICES) == d or i == d % len(g)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_single_opt(device, case):
  fn, ref, shapes = CASES[case]
  spec, bufs, arrays = last_kernel(fn, shapes, device)
  want = np.asarray(ref(*arrays)).reshape(-1)
  base, _ = run_with(spec, bufs, ())
  check(base, want, want.dtype)
  acts = gpu.gpu_actions(spec.ast)
  assert acts, "no GPU opt applies"
  for o in device_share(acts, DEVICES.index(device)):
    got, prog = run_with(spec, bufs, (o,))
    check(got, base, want.dtype)
    assert prog.meta["opts"] == (o,)


@pytest.mark.parametrize("case", sorted(CASES))
def test_random_opt_sequences(device, case):
  fn, ref, shapes = CASES[case]
  spec, bufs, arrays = last_kernel(fn, shapes, device, seed=1)
  want = np.asarray(ref(*arrays)).reshape(-1)
  r = random.Random(f"{case}-{device}")
  done = 0
  for _ in range(40):
    if done == 4: break
    opts, ast = [], spec.ast
    for _ in range(r.randint(2, 4)):
      acts = gpu.gpu_actions(ast)
      if not acts: break
      o = r.choice(acts)
      try: ast = apply_opts(ast, [o])
      except OptError: continue
      opts.append(o)
    try: gpu.to_workgroups(ast)
    except OptError: continue
    got, _ = run_with(spec, bufs, opts)
    check(got, want, want.dtype)
    done += 1
  assert done >= 3, "too few opt sequences applied"


@pytest.mark.parametrize("case", sorted(CASES))
def test_heuristic(device, case):
  fn, ref, shapes = CASES[case]
  spec, bufs, arrays = last_kernel(fn, shapes, device, seed=2)
  got, prog = run_with(spec, bufs, gpu.gpu_opts(spec.ast))
  check(got, np.asarray(ref(*arrays)).reshape(-1), got.dtype)


def test_long_reduction_uses_a_workgroup(device):
  """A reduction into one value runs on many threads (GROUP), with workgroup memory and a barrier."""
  a = f32(rng(3), 20000)
  t = Tensor(a, device=device).mean()
  np.testing.assert_allclose(t.numpy(), a.mean(), rtol=1e-5, atol=1e-7)
  spec, bufs, _ = last_kernel(lambda x: x.sum(), [(20000,)], device)
  opts = gpu.gpu_opts(spec.ast)
  assert any(o.op == "GROUP" for o in opts), opts
  ast = gpu.to_workgroups(apply_opts(spec.ast, opts))
  ops = {u.op for u in ast.toposort()}
  assert Ops.DEFINE_LOCAL in ops and Ops.BARRIER in ops
  _, prog = run_with(spec, bufs, opts)
  assert math.prod(prog.meta["local_size"]) >= 32


def test_launch_follows_the_axes(device):
  """Global axes map to the workgroup ids (innermost on x), LOCAL axes to the thread ids: no div/mod left."""
  spec, bufs, arrays = last_kernel(lambda a, b: a + b, [(6, 10, 32), (6, 10, 32)], device)
  opts = [Opt("LOCAL", 2, 16), Opt("LOCAL", 1, 2)]
  got, prog = run_with(spec, bufs, opts)
  np.testing.assert_allclose(got, (arrays[0] + arrays[1]).reshape(-1), rtol=1e-6)
  assert prog.meta["global_size"] == (2, 5, 6) and sorted(prog.meta["local_size"]) == [1, 2, 16]
  low = lower(dataclasses.replace(spec, opts=tuple(opts)), renderer_for(device))     # after simplification
  assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in low.ast.toposort())


def test_an_axis_split_and_merged_again_indexes_without_division(device):
  """A view that splits an axis and merges it again ((x // 8) * 8 + x % 8 in its index) reads x: no div/mod is left
  in the kernel (symbolic.fold_div_mod), and the values are numpy's."""
  fn = lambda a: (a.reshape(3, 4, 8).reshape(12, 8) * 2).reshape(96)
  spec, bufs, arrays = last_kernel(fn, [(12, 8)], device)
  got, _ = run_with(spec, bufs, ())
  np.testing.assert_array_equal(got, (arrays[0] * 2).reshape(-1))
  low = lower(spec, renderer_for(device))
  assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in low.program), [u.op for u in low.program]


def test_more_than_three_global_axes(device):
  fn = lambda a: a.permute(3, 2, 1, 0) * 2
  spec, bufs, arrays = last_kernel(fn, [(3, 4, 5, 6)], device)
  got, prog = run_with(spec, bufs, ())
  np.testing.assert_allclose(got, (arrays[0].transpose(3, 2, 1, 0) * 2).reshape(-1))
  assert math.prod(prog.meta["global_size"]) == 360 and prog.meta["global_size"][0] == 3   # x: the innermost axis


def test_workgroup_limits():
  """A workgroup of more than 1024 threads or more than 3 dimensions is refused before rendering."""
  a = Tensor(np.ones((2048, 4), np.float32), device="CPU") + 1
  sink, _, _ = normalize(a.uop.sink())
  spec = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
  ast = apply_opts(spec.ast, [Opt("LOCAL", 0, 2048)])
  with pytest.raises(OptError, match="at most 1024"): gpu.to_workgroups(ast)
  b = Tensor(np.ones((2, 2, 2, 2), np.float32), device="CPU").permute(3, 2, 1, 0) + 1    # four axes that stay apart
  sink, _, _ = normalize(b.uop.sink())
  spec = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
  ast = apply_opts(spec.ast, [Opt("LOCAL", 0, 2)] * 4)     # each axis of 2 becomes a thread axis
  with pytest.raises(OptError, match="3 dimensions"): gpu.to_workgroups(ast)


def test_beam_on_the_emulator(device, monkeypatch, tmp_path):
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  """BEAM=1 on an emulated GPU: candidates judged by the emulator's counters; the result is numpy's and costs no
  more (by those counters) than the heuristic's choice."""
  from baregrad.compiler import codegen, search
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  spec, bufs, arrays = last_kernel(CASES["matmul"][0], CASES["matmul"][2], device, seed=4)
  best = search.beam_search(spec, 2, get_program, default=gpu.gpu_opts(spec.ast), moves=gpu.gpu_actions)
  got, _ = run_with(spec, bufs, best)
  np.testing.assert_allclose(got, (arrays[0] @ arrays[1]).reshape(-1), rtol=1e-4, atol=1e-4)
  cost = lambda opts: search.time_program(spec, opts, get_program)
  assert cost(best) <= cost(gpu.gpu_opts(spec.ast))


def test_beam_times_every_workgroup(device):
  """BEAM's timing run launches the kernel's whole grid (it launched one workgroup: on an H200 a 768 MB add 'took'
  8 us and the search chose by what one workgroup did): the emulator counts every byte of the buffers."""
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  from baregrad.compiler import search
  from baregrad.drivers.emu import counters
  n = 1 << 14
  spec, _, _ = last_kernel(lambda a, b: a + b, [(n,), (n,)], device)
  for opts in ([], gpu.gpu_opts(spec.ast)):
    prog = get_program(dataclasses.replace(spec, opts=tuple(opts)))
    search._run_times(spec, prog, search._buffers(spec), 1)
    c = counters.last()      # (AMD also counts each wave's scalar loads of its arguments: the stores tell)
    assert c.global_store_bytes == 4 * n and c.global_load_bytes >= 2 * 4 * n, (opts, c)


def test_gpu_timings_launch_back_to_back(device, monkeypatch):
  """On a real GPU BEAM times GPU_LAUNCHES launches between two timestamps, after running them for GPU_WARM_SECONDS
  (an H200's clocks rise only under sustained load), and time_item(launches=n) queues n: the emulator (made to look
  real here) counts them."""
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  from baregrad.compiler import search
  from baregrad.drivers.emu import counters
  from baregrad.hcq.device import Device
  from baregrad.hcq.runtime import ExecItem, time_item
  spec, _, _ = last_kernel(lambda a, b: a + b, [(256,), (256,)], device)
  prog = get_program(spec)
  bufs = search._buffers(spec)
  monkeypatch.setattr(search, "_emulated", lambda dev: False)
  monkeypatch.setattr(search, "GPU_WARM_SECONDS", 0.0)
  monkeypatch.setattr(search, "GPU_COLD_SECONDS", 0.0)
  counters.reset()
  times = search._run_times(spec, prog, bufs, 2)
  assert len(times) == 2 and counters.total().kernels == 2 * search.GPU_LAUNCHES
  monkeypatch.setattr(search, "GPU_WARM_SECONDS", 0.01)     # runs for a while before the timed runs
  counters.reset()
  search._run_times(spec, prog, bufs, 2)
  assert counters.total().kernels >= 3 * search.GPU_LAUNCHES
  counters.reset()
  assert time_item(Device.get(device), ExecItem(prog, bufs, {}, prog.meta), launches=3) > 0
  assert counters.total().kernels == 3


def test_matvec_with_contiguous_rows_one_workgroup_per_output(device):
  """x @ W.T (a language model's weights: rows contiguous along the reduction): a workgroup per output, 4 neighbouring
  weights per thread per step (NV: one .v4 load), numpy's result; its loads move x once per output row, and the
  distinct sectors they touch (counters.count_unique: DRAM traffic with caches) are exactly the weights' and x's."""
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  from baregrad.compiler import search
  from baregrad.drivers.emu import counters
  n, k = 32, 4096
  spec, bufs, arrays = last_kernel(lambda x, w: x @ w.T, [(1, k), (n, k)], device, seed=6)
  opts = gpu.gpu_opts(spec.ast)
  assert opts == [Opt("UNROLL", 0, 4), Opt("GROUP", 0, 256)], opts
  counters.reset()
  got, prog = run_with(spec, bufs, opts)
  assert counters.last().global_load_unique_bytes == 0           # not counted unless asked for
  np.testing.assert_allclose(got, (arrays[0] @ arrays[1].T).reshape(-1), rtol=1e-4, atol=1e-4)
  if device == "NV": assert "ld.global.v4.f32" in str(prog.source)
  counters.count_unique(True)
  try:
    counters.reset()
    run_with(spec, bufs, opts)
    c = counters.last()
  finally: counters.count_unique(False)
  w, x = n * k * 4, k * 4
  assert c.global_load_bytes >= w + n * x                         # x read once per output row
  extra = c.global_load_unique_bytes - (w + x)                    # AMD: the waves' scalar loads of the arguments too
  assert extra == 0 if device == "NV" else 0 <= extra <= 64, c


def test_matvec_with_16bit_rows_loads_8_weights_at_once(device):
  """float16 weights (x @ W.T, x float32): 8 neighbouring weights per thread per step, 16 bytes (NV: one .v4.b32 load
  split into halves; on an H200 this ran an 8192x8192 float16 matvec in 146 us against 186 with 4), numpy's result."""
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  n, k = 32, 4096
  spec, bufs, arrays = last_kernel(lambda x, w: x @ w.cast("float16").contiguous().T, [(1, k), (n, k)], device, seed=7)
  opts = gpu.gpu_opts(spec.ast)
  assert opts == [Opt("UNROLL", 0, 8), Opt("GROUP", 0, 128)], opts
  got, prog = run_with(spec, bufs, opts)
  want = arrays[0].astype(np.float64) @ arrays[1].astype(np.float16).astype(np.float64).T
  np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-4, atol=1e-4)
  if device == "NV": assert "ld.global.v4.b32" in str(prog.source)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_eight_16bit_lanes_in_one_access(device, dt):
  """8 neighbouring 16-bit elements per thread (UPCAST 8): on NV one 16-byte load per operand (.v4.b32, each word
  split into two elements) and one 16-byte store (two elements packed a word); numpy's result bit for bit."""
  n = 1 << 12
  spec, bufs, arrays = last_kernel(lambda a, b: a.cast(dt).contiguous() * b.cast(dt).contiguous() + 1, [(n,), (n,)],
                                   device, seed=8)
  got, prog = run_with(spec, bufs, [Opt("UPCAST", 0, 8)])
  want = Tensor(arrays[0], device="CPU").cast(dt) * Tensor(arrays[1], device="CPU").cast(dt) + 1
  if dt == "bfloat16": got = (got.astype(np.uint32) << 16).view(np.float32)     # (numpy() widens bfloat16 to float32)
  np.testing.assert_array_equal(got, want.numpy())
  if device == "NV": assert "ld.global.v4.b32" in prog.source and "st.global.v4.b32" in prog.source


def test_matvec_with_contiguous_columns_splits_the_reduction(device):
  """x @ W with W of shape (in, out), 4096 outputs: 64 threads of a workgroup along the outputs and 16 along the
  reduction in contiguous chunks (on the H200 1.6-1.7x the register tile's speed), numpy's result."""
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  k, n = 256, 4096
  spec, bufs, arrays = last_kernel(lambda x, w: x @ w, [(1, k), (k, n)], device, seed=9)
  opts = gpu.gpu_opts(spec.ast)
  assert opts == [Opt("LOCAL", 0, 64), Opt("GROUPTOP", 0, 16)], opts
  got, _ = run_with(spec, bufs, opts)
  np.testing.assert_allclose(got, (arrays[0] @ arrays[1]).reshape(-1), rtol=1e-4, atol=1e-4)


def test_matmul_staged_through_workgroup_memory(device):
  """(NV and AMD: counted by their emulators.) The heuristic's matmul: 8x8 outputs per thread, 16x16 threads, the reduce staged in steps of 8 through
  workgroup memory: each workgroup reads its rows of A and columns of B from global memory exactly once (the
  emulator's counters), the result is numpy's."""
  from baregrad.drivers.emu import counters
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  n, k = 256, 64       # (a reduce of 64: 8 staged steps, a quarter of a 256-deep product's emulated work)
  spec, bufs, arrays = last_kernel(lambda a, b: a @ b, [(n, k), (k, n)], device, seed=5)
  opts = gpu.gpu_opts(spec.ast)
  assert [o.op for o in opts] == ["UPCAST", "UPCAST", "LOCAL", "LOCAL", "STAGE"], opts
  counters.reset()
  got, prog = run_with(spec, bufs, opts)
  np.testing.assert_allclose(got, (arrays[0] @ arrays[1]).reshape(-1), rtol=1e-4, atol=1e-4)
  c = counters.last()
  gx, gy, gz = prog.meta["global_size"]
  assert gz == 1 and gx * gy > 1 and math.prod(prog.meta["local_size"]) == 256
  strips = gx * gy * (n // gy * k + k * (n // gx)) * 4      # each workgroup: its rows of A, its columns of B, once
  args = gx * gy * 8 * 64 if device == "AMD" else 0   # AMD: each wave's scalar loads of the kernel arguments count too
  assert strips <= c.global_load_bytes <= strips + args, (c.global_load_bytes, strips)
  assert c.global_store_bytes == n * n * 4
  if device == "NV":    # the tile's neighbouring words: one 16-byte access each (reads of the staged tiles, stores)
    assert "ld.shared.v4.f32" in prog.source and "st.global.v4.f32" in prog.source
  assert c.shared_load_bytes > 0 and c.by_class()["barrier"] > 0


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_tensor_cores(device, dt):
  """A matmul on 16-bit floats runs on the tensor cores (WMMA ops; PTX mma.sync m16n8k16, RDNA3 v_wmma 16x16x16):
  with TC alone, with the heuristic's tiles of them, and with more opts after; products exact, float32 sums."""
  if device not in TENSOR_CORE_DEVICES: pytest.skip(f"{device}: no tensor core op here")
  assert getattr(renderer_for(device), "tensor_cores", False), f"the {device} renderer renders no WMMA"
  from baregrad.compiler import tc
  r = rng(6)
  a32, b32 = r.standard_normal((64, 48), dtype=np.float32), r.standard_normal((48, 32), dtype=np.float32)
  a, b = Tensor(a32, device=device).cast(dt).realize(), Tensor(b32, device=device).cast(dt).realize()
  t = a @ b
  items = t.schedule()
  run_schedule(items[:-1], sync=True)
  sink, _, _ = normalize(t.uop.sink())
  spec = [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
  bufs = items[-1].bufs
  ah, bh = (x.cast("float32").numpy() for x in (a, b))       # the inputs as rounded to 16 bits
  want = (ah.astype(np.float64) @ bh.astype(np.float64)).reshape(-1)
  heuristic = gpu.gpu_opts(spec.ast, device)
  assert heuristic[0] == Opt("TC", 0, 0), heuristic
  for opts in ([Opt("TC", 0, 0)], heuristic, [Opt("TC", 0, 0), Opt("LOCAL", 0, 2), Opt("UPCAST", 1, 2)]):
    low = lower(dataclasses.replace(spec, opts=tuple(opts)), renderer_for(device))
    assert any(u.op is Ops.WMMA for u in low.program)
    got, _ = run_with(spec, bufs, opts)
    got32 = (got.astype(np.uint32) << 16).view(np.float32) if dt == "bfloat16" else got.astype(np.float32)
    np.testing.assert_allclose(got32, want, rtol=1e-2 if dt == "bfloat16" else 2e-3, atol=1e-2)
  # a float32 matmul or an odd size does not match a tensor core
  with pytest.raises(OptError, match="TC"):
    gpu.apply_gpu_opts(last_kernel(lambda x, y: x @ y, [(16, 16), (16, 16)], device)[0].ast, [Opt("TC", 0, 0)], device)


def test_quantized_matvec_reads_each_weight_byte_about_once(device):
  """(NV and AMD: counted by their emulators.) A Q8_0 weight (`gguf`'s quantizer) times a vector, dequantized in the
  kernel: whole 32-element blocks per thread, and workgroups for every output (the register tile it replaced ran a
  1024x2816 Q8_0 matvec in 2 workgroups). The distinct bytes its loads touch (what DRAM supplies when the caches keep
  x) are <= 1.03x the quantized bytes plus x's and the residual's; the result is numpy's product with gguf's
  dequantization."""
  gguf = pytest.importorskip("gguf")
  from baregrad.drivers.emu import counters
  from baregrad.tensor.ggml_quants import dequantize
  from baregrad.compiler.dtype import dtypes
  if device == "METAL": pytest.skip("the emulated Metal has no counters")
  M, K = 512, 256
  r = rng(7)
  raw = gguf.quants.quantize(f32(r, M, K), gguf.GGMLQuantizationType.Q8_0)
  x, res = f32(r, 1, K), f32(r, 1, M)
  W = dequantize(Tensor(raw.reshape(-1).view(np.uint8), dtype=dtypes.uint8, device=device), "Q8_0", (M, K))
  y = Tensor(x, device=device) @ W.T + Tensor(res, device=device)
  items = y.schedule()
  run_schedule(items[:-1], sync=True)
  counters.count_unique(True)
  try:
    counters.reset()
    run_schedule(items[-1:], sync=True)
    c = counters.total()
  finally: counters.count_unique(False)
  want = x @ gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(M, K).T + res
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
  workgroups = math.prod(items[-1].meta["global_size"])
  assert workgroups >= M // 4, items[-1].meta
  args = 64 if device == "AMD" else 0    # AMD: the waves' scalar loads of the (<= 8) kernel arguments
  assert c.global_load_unique_bytes <= 1.03 * raw.nbytes + x.nbytes + res.nbytes + args, (c.global_load_unique_bytes, raw.nbytes)


def test_sibling_reductions_with_a_staged_and_a_grouped_one(device):
  """silu(x @ A) * (x @ B) with short rows: both reductions share one kernel, one grouped across threads and one
  staged through workgroup memory; every thread takes part in the staging copy (only the stores are the first
  group thread's)."""
  r = rng(8)
  x, a, b = f32(r, 3, 16), f32(r, 16, 16), f32(r, 16, 16)
  got = ((Tensor(x, device=device) @ Tensor(a, device=device)).silu() * (Tensor(x, device=device) @ Tensor(b, device=device))).numpy()
  g = x @ a
  np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * (x @ b), rtol=1e-5, atol=1e-5)
