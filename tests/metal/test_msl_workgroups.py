"""Workgroup kernels on the emulated Metal device (EMU=1), checked against numpy: hand-built workgroup ASTs (SPECIAL
gid/lid, DEFINE_LOCAL, BARRIER: the GPU workgroup IR) through codegen.get_program, the MSL renderer and the Metal
driver, run by the emulator's fibers: barriers really wait (each thread reads what another thread wrote before the
barrier, which the plain one-thread-after-the-other loops would not show), threadgroup memory is per threadgroup and
starts undefined; SIMD-group functions (simd_sum, simd_max, simd_shuffle_down over 32-lane SIMD-groups) in
hand-written MSL through the driver; and the errors: a barrier that not every thread reaches, threadgroup memory
over 32 KiB (more than 1024 threads per threadgroup: test_metal_driver.py)."""
from __future__ import annotations
import shutil, struct
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

if AVAILABLE:
  from baregrad.compiler.uop import UOp, Ops
  from baregrad.compiler.dtype import dtypes
  from baregrad.compiler.rangeify import KernelSpec
  from baregrad.compiler.codegen import get_program
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.runtime import ExecItem, run_schedule
  from baregrad.drivers.emu import metal_framework as mf, metal_shim
  from baregrad.drivers.metal.driver import MetalDriver, MetalCompileError, CommandBufferError

F32 = dtypes.float32 if AVAILABLE else None


@pytest.fixture(scope="module")
def metal():
  """The METAL device (emulated), closed again if this module opened it."""
  from baregrad.hcq.device import Device
  opened = "METAL" not in Device._open
  with settings.override(EMU=1):
    dev = Device.get("METAL")
    if not getattr(dev.driver.fw, "emulated", False): pytest.skip("METAL is a real GPU here; these tests use the emulated one")
    yield "METAL"
    if opened: dev.close()


# ---------------------------------------------------------------- hand-built workgroup ASTs (the IR's form)

def special(name: str, n: int, dt=None) -> UOp: return UOp(Ops.SPECIAL, dt or dtypes.index, (), (name, n))
def param(i: int, dt=None) -> UOp: return UOp(Ops.PARAM, dt or F32, (), i)
def index(buf: UOp, i: UOp, valid: UOp | None = None) -> UOp:
  return UOp(Ops.INDEX, buf.dtype, (buf, i) if valid is None else (buf, i, valid))
def load(idx: UOp, after: UOp | None = None) -> UOp:
  return UOp(Ops.LOAD, idx.dtype, (idx,) if after is None else (idx, after))
def store(idx: UOp, value: UOp) -> UOp: return UOp(Ops.STORE, None, (idx, value))
def barrier(*stores: UOp) -> UOp: return UOp(Ops.BARRIER, None, stores)
def local(i: int, count: int, dt=None) -> UOp: return UOp(Ops.DEFINE_LOCAL, dt or F32, (), (i, count))


def run(device: str, ast: UOp, inputs: list[np.ndarray], out_size: int, name: str) -> tuple[np.ndarray, object]:
  """Output 0 of the kernel `ast` (params: output then inputs) on `device`, and its program."""
  params = [UOp(Ops.RESHAPE, F32, (), (n,)) for n in [out_size] + [a.size for a in inputs]]   # shapes for estimates
  prog = get_program(KernelSpec(ast, params, name, device))
  bufs = [Buffer(device, out_size, F32).ensure_allocated()]
  for a in inputs:
    bufs.append(Buffer(device, a.size, F32).ensure_allocated())
    bufs[-1].copyin(memoryview(np.ascontiguousarray(a, np.float32)).cast("B"))
  run_schedule([ExecItem(prog, bufs, {}, prog.meta)], sync=True)
  out = np.empty(out_size, np.float32)
  bufs[0].copyout(memoryview(out).cast("B"))
  return out, prog


@pytest.mark.parametrize("id_dtype", ["index", "int32"])
def test_block_reverse_1d(metal, id_dtype):
  """The IR's example: each block of 64 values reversed through threadgroup memory."""
  dt = getattr(dtypes, id_dtype)
  g, l = special("gid0", 4, dt), special("lid0", 64, dt)
  smem = local(0, 64)
  st = store(index(smem, l), load(index(param(1), g * 64 + l)))
  ast = UOp(Ops.SINK, None, (store(index(param(0), g * 64 + l), load(index(smem, 63 - l), barrier(st))),))
  a = np.random.default_rng(0).standard_normal(256).astype(np.float32)
  got, prog = run(metal, ast, [a], 256, f"reverse_{id_dtype}")
  np.testing.assert_array_equal(got, a.reshape(4, 64)[:, ::-1].reshape(-1))
  assert prog.meta["global_size"] == (4, 1, 1) and prog.meta["local_size"] == (64, 1, 1)
  src = prog.source
  assert "uint3 bid [[threadgroup_position_in_grid]]" in src and "uint3 lid [[thread_position_in_threadgroup]]" in src
  assert "threadgroup float local0[64];" in src and src.count("threadgroup_barrier(mem_flags::mem_threadgroup);") == 1
  assert "thread_position_in_grid" not in src


def test_block_reverse_2d(metal):
  """Threadgroups of 8 x 4 threads over a 3 x 2 grid: each 4 x 8 tile of an 8 x 24 matrix flipped in both axes."""
  gx, gy, lx, ly = special("gid0", 3), special("gid1", 2), special("lid0", 8), special("lid1", 4)
  smem = local(0, 32)
  here = (gy * 4 + ly) * 24 + gx * 8 + lx
  st = store(index(smem, ly * 8 + lx), load(index(param(1), here)))
  flipped = load(index(smem, (3 - ly) * 8 + (7 - lx)), barrier(st))
  ast = UOp(Ops.SINK, None, (store(index(param(0), here), flipped),))
  a = np.random.default_rng(1).standard_normal((8, 24)).astype(np.float32)
  got, prog = run(metal, ast, [a.reshape(-1)], 8 * 24, "reverse_2d")
  np.testing.assert_array_equal(got.reshape(8, 24), a.reshape(2, 4, 3, 8)[:, ::-1, :, ::-1].reshape(8, 24))
  assert prog.meta["global_size"] == (3, 2, 1) and prog.meta["local_size"] == (8, 4, 1)
  assert "bid.y" in prog.source and "lid.y" in prog.source


def test_lds_tree_reduction_with_a_barrier_per_level(metal):
  """Sums of 8 rows of 64 values: the threads below half add the upper half in, one barrier per level (7 barriers);
  thread 0 writes the row's sum."""
  g, l = special("gid0", 8), special("lid0", 64)
  smem = local(0, 64)
  bar = barrier(store(index(smem, l), load(index(param(1), g * 64 + l))))
  for half in (32, 16, 8, 4, 2, 1):
    lower = l < half
    total = load(index(smem, l, lower), bar) + load(index(smem, l + half, lower), bar)
    bar = barrier(store(index(smem, l, lower), total))
  ast = UOp(Ops.SINK, None, (store(index(param(0), g, l < 1), load(index(smem, UOp.const(dtypes.index, 0)), bar)),))
  a = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
  got, prog = run(metal, ast, [a.reshape(-1)], 8, "tree_sum")
  want = a.copy()
  for half in (32, 16, 8, 4, 2, 1): want[:, :half] += want[:, half:2 * half]   # the same order of float adds
  np.testing.assert_array_equal(got, want[:, 0])
  np.testing.assert_allclose(got, a.sum(1), rtol=1e-5)
  assert prog.source.count("threadgroup_barrier") == 7


def neighbour_kernel(count: int) -> UOp:
  """Thread i of 64 stores at i, then reads what thread i+1 (mod 64) stored, from a threadgroup array of `count`."""
  g, l = special("gid0", 2), special("lid0", 64)
  smem = local(0, count)
  st = store(index(smem, l), load(index(param(1), g * 64 + l)))
  return UOp(Ops.SINK, None, (store(index(param(0), g * 64 + l), load(index(smem, (l + 1) % 64), barrier(st))),))


def test_a_barrier_makes_each_thread_wait_for_the_others(metal):
  """Thread i reads what thread i+1 wrote before the barrier: in the emulator thread i runs before thread i+1, so
  only a barrier that really waits gives the written values (threadgroup memory starts as all ones: NaN)."""
  a = np.arange(128, dtype=np.float32)
  got, _ = run(metal, neighbour_kernel(64), [a], 128, "neighbour")
  np.testing.assert_array_equal(got, np.roll(a.reshape(2, 64), -1, axis=1).reshape(-1))


def test_threadgroup_memory_limit_is_32_kib(metal):
  """8192 floats (32 KiB, Metal feature set tables: maximum total threadgroup memory allocation) run; one more is
  refused when the pipeline is made, naming the kernel and the size."""
  a = np.arange(128, dtype=np.float32)
  got, _ = run(metal, neighbour_kernel(8192), [a], 128, "tg_32k")
  np.testing.assert_array_equal(got, np.roll(a.reshape(2, 64), -1, axis=1).reshape(-1))
  with pytest.raises(MetalCompileError, match=r"tg_too_big declares 32784 bytes of threadgroup memory; the device has "
                                              r"32768 \(maxThreadgroupMemoryLength\)"):
    run(metal, neighbour_kernel(8193), [a], 128, "tg_too_big")


# ---------------------------------------------------------------- hand-written MSL through the driver

SIMD = """#include <metal_stdlib>
using namespace metal;
// per lane: the sum and max over its SIMD-group, and a shuffle-down tree sum (lane 0 holds its SIMD-group's sum)
kernel void simd_ops(device float* sums [[buffer(0)]], device float* maxes [[buffer(1)]], device float* tree [[buffer(2)]],
                     const device float* x [[buffer(3)]], uint i [[thread_index_in_threadgroup]],
                     uint3 group [[threadgroup_position_in_grid]], uint3 size [[threads_per_threadgroup]],
                     ushort lane [[thread_index_in_simdgroup]]) {
  uint at = group.x * size.x + i;
  float v = x[at];
  sums[at] = simd_sum(v);
  maxes[at] = simd_max(v);
  for (ushort delta = 16; delta > 0; delta /= 2) v += simd_shuffle_down(v, delta);
  tree[at] = v;
}
// a threadgroup's sum: simd_sum per SIMD-group, the partial sums through threadgroup memory after a barrier
kernel void block_sum(device float* out [[buffer(0)]], const device float* x [[buffer(1)]],
                      uint i [[thread_index_in_threadgroup]], uint3 group [[threadgroup_position_in_grid]],
                      uint lane [[thread_index_in_simdgroup]], uint simd [[simdgroup_index_in_threadgroup]],
                      uint simds [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  float s = simd_sum(x[group.x * 256 + i]);
  if (lane == 0) partial[simd] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd == 0) {
    float p = simd_sum(lane < simds ? partial[lane] : 0.0f);
    if (lane == 0) out[group.x] = p;
  }
}
// thread 5 returns before the barrier the others wait at
kernel void skips_barrier(device float* out [[buffer(0)]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float t[64];
  if (lid.x == 5) return;
  t[lid.x] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lid.x] = t[(lid.x + 1) % 64];
}
"""


class _Signal:
  def __init__(self, addr): self.addr, self.timestamp_addr, self.name = addr, addr + 8, "s"


class _Program:
  def __init__(self, entry, n_params, local):
    self.entry, self.n_params, self.variables, self.meta, self.name = entry, n_params, (), {"local_size": local}, "k"


@pytest.fixture(scope="module")
def driver():
  d = MetalDriver(mf.EmulatedMetal())
  yield d
  d.close()


def launch(d, name: str, arrays: list[np.ndarray], grid: tuple, block: tuple, expect_fault: bool = False) -> list[np.ndarray]:
  """Run kernel `name` of SIMD with float32 buffers `arrays` (copied in and out) on the driver's compute queue."""
  entry, program = d.load_program(SIMD.encode(), name)
  mems = [d.alloc(a.nbytes) for a in arrays]
  args, sig = d.alloc(8 * len(arrays)), d.alloc(64)
  for m, a in zip(mems, arrays): d.view(m.addr, a.nbytes)[:] = a.tobytes()
  struct.pack_into(f"<{len(arrays)}Q", d.view(args.addr, 8 * len(arrays)), 0, *[m.addr for m in mems])
  done = _Signal(sig.addr)
  d.submit("compute", d.encode("compute", [("exec", _Program(entry, len(arrays), block), args.addr, grid, (1, 1, 1)),
                                           ("signal", done, 1)]))
  try:
    reached = d.wait_value(done.addr, 1, 30)
    if expect_fault: assert not reached, "the command buffer did not fail"
    else: assert reached, d.check_faults("METAL")
    d.check_faults("METAL")
    return [np.frombuffer(d.view(m.addr, a.nbytes), np.float32).copy() for m, a in zip(mems, arrays)]
  finally:
    for m in mems + [args, sig]: d.free(m)
    d.unload_program(program)


@pytest.mark.parametrize("threads", [64, 48])
def test_simd_sum_max_and_shuffle_down(driver, threads):
  """32-lane SIMD-groups (threadExecutionWidth 32): with 48 threads the second SIMD-group has 16 lanes, and its
  simd_sum/simd_max cover those; simd_shuffle_down leaves the upper `delta` lanes their own value (MSL 6.9.2)."""
  groups = 3
  x = np.random.default_rng(3).standard_normal(groups * threads).astype(np.float32)
  zeros = [np.zeros_like(x) for _ in range(3)]
  sums, maxes, tree = launch(driver, "simd_ops", zeros + [x], (groups, 1, 1), (threads, 1, 1))[:3]
  for g in range(groups):
    for lo in range(0, threads, 32):
      part = x[g * threads + lo:g * threads + min(lo + 32, threads)]
      at = slice(g * threads + lo, g * threads + lo + part.size)
      np.testing.assert_allclose(sums[at], np.full(part.size, part.sum()), rtol=1e-5)
      np.testing.assert_array_equal(maxes[at], np.full(part.size, part.max()))
  if threads == 64:    # full SIMD-groups: the shuffle-down tree, step by step as numpy (same float adds)
    v = x.reshape(-1, 32).copy()
    for delta in (16, 8, 4, 2, 1):
      src = np.arange(32) + delta
      v = v + np.where(src < 32, v[:, np.minimum(src, 31)], v)
    np.testing.assert_array_equal(tree, v.reshape(-1))
    np.testing.assert_allclose(tree[::32], x.reshape(-1, 32).sum(1), rtol=1e-5)


def test_simd_sum_block_reduction_through_the_driver(driver):
  x = np.random.default_rng(4).standard_normal(8 * 256).astype(np.float32)
  out = launch(driver, "block_sum", [np.zeros(8, np.float32), x], (8, 1, 1), (256, 1, 1))[0]
  np.testing.assert_allclose(out, x.reshape(8, 256).sum(1), rtol=1e-5)


def test_a_barrier_not_every_thread_reaches_fails_the_command_buffer(driver):
  with pytest.raises(CommandBufferError, match=r"kernel skips_barrier: threadgroup \(0,0,0\) of 64 threads: 63 threads "
                                               r"wait at threadgroup_barrier .* 1 returned without reaching it \(thread 5"):
    launch(driver, "skips_barrier", [np.zeros(64, np.float32)], (1, 1, 1), (64, 1, 1), expect_fault=True)
  x = np.random.default_rng(5).standard_normal(256).astype(np.float32)        # the queue goes on
  out = launch(driver, "block_sum", [np.zeros(1, np.float32), x], (1, 1, 1), (256, 1, 1))[0]
  np.testing.assert_allclose(out, [x.sum()], rtol=1e-5)


# ---------------------------------------------------------------- the shim itself, with each C++ compiler

COMPILERS = [c for c in ("g++", "clang++", "clang++-19") if shutil.which(c)][:2] or [None]


@pytest.mark.parametrize("compiler", COMPILERS, ids=lambda c: c or "none")
def test_threadgroup_memory_is_per_threadgroup_and_starts_undefined(compiler):
  """Each threadgroup gets its own threadgroup memory, all ones when it starts (MSL 4.4: undefined), not what the
  previous threadgroup left; a declaration the shim cannot lay out is refused rather than made per thread."""
  src = """#include <metal_stdlib>
using namespace metal;
kernel void first(device uint* out [[buffer(0)]], uint3 g [[threadgroup_position_in_grid]], uint3 l [[thread_position_in_threadgroup]]) {
  threadgroup uint seen[4];
  threadgroup uint count;
  out[g.x * 4 + l.x] = seen[l.x];
  seen[l.x] = g.x + 7;
  if (l.x == 0) count = 0;
}
"""
  if compiler is None: pytest.skip("no C++ compiler on PATH")
  lib = metal_shim.Library(src, compiler=shutil.which(compiler))
  try:
    out = np.zeros(8, np.uint32)
    lib.run("first", [out.ctypes.data], (2, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(out, np.full(8, 0xFFFFFFFF, np.uint32))
    assert lib.threadgroup_memory["first"] == 32    # 16 + 4, each at a 16-byte aligned offset, rounded to 16
  finally:
    lib.close()
  with pytest.raises(metal_shim.ShimCompileError, match="one per declaration, without an initializer"):
    metal_shim.translation_unit("kernel void f(device float* a [[buffer(0)]]) { threadgroup float x[2], y[2]; }")


@pytest.mark.parametrize("compiler", COMPILERS, ids=lambda c: c or "none")
def test_simd_functions_meet_the_lanes_that_call_them(compiler):
  """Lanes that returned are inactive: simd_sum adds the others' values (MSL 6.9.2: the active threads); lanes of one
  SIMD-group in two different SIMD-group functions at once are refused by name (the emulator does not run them)."""
  if compiler is None: pytest.skip("no C++ compiler on PATH")
  src = """#include <metal_stdlib>
using namespace metal;
kernel void tail(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  if (i % 32 >= 20) return;
  out[i] = simd_sum((float)i);
}
kernel void split(device float* out [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  out[i] = i < 8 ? simd_sum(1.0f) : simd_max(2.0f);
}
"""
  lib = metal_shim.Library(src, compiler=shutil.which(compiler))
  try:
    out = np.zeros(64, np.float32)
    lib.run("tail", [out.ctypes.data], (1, 1, 1), (64, 1, 1))
    lanes = np.arange(64)
    want = np.where(lanes % 32 < 20, np.where(lanes < 32, np.arange(20).sum(), np.arange(32, 52).sum()), 0)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(metal_shim.KernelFault, match=r"kernel split: threadgroup \(0,0,0\): in SIMD-group 0, lane 0 "
                                                     r"calls simd_sum while lane 8 calls simd_max"):
      lib.run("split", [out.ctypes.data], (1, 1, 1), (32, 1, 1))
  finally:
    lib.close()
