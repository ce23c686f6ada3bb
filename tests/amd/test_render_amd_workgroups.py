"""The AMD renderer on workgroup kernels (SPECIAL gid0..2 / lid0..2, DEFINE_LOCAL, BARRIER; ir: compiler/uop.py) and
large register need, against independent references:
- numpy computes what every kernel must write; the kernels are hand-built ASTs lowered like codegen.get_program
  (codegen.lower), rendered, assembled and run on the RDNA3 emulator (drivers/emu/rdna3.py), whose dependency
  checker rejects a missing s_waitcnt and whose DS unit faults outside the descriptor's LDS;
- llvm-mc-19 assembles the listing of every kernel here (ds_*, s_barrier, work-item id unpacking) to the bytes
  baregrad's encoder makes; llvm-objdump-19 decodes the kernel descriptors (workgroup ids y/z, work-item ids, LDS);
- one kernel runs end to end on the emulated AMD device (EMU=1: KFD, PM4 dispatch with the LDS size of RSRC2).
"""
import os, re, shutil, subprocess, sys, tempfile, textwrap
from pathlib import Path

import numpy as np
import pytest

from baregrad.compiler import codegen
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import UOp, Ops
from baregrad.compiler.rangeify import KernelSpec
from baregrad.compiler.render_amd import AMDRenderer
from baregrad.compiler.amd.encode import assemble
from baregrad.compiler.amd.regalloc import RegisterPressureError
from baregrad.drivers.amd.codeobj import read_code_object, write_code_object, KernelDescriptor
from baregrad.drivers.emu.memory import Memory, MemoryFault
from baregrad.drivers.emu.rdna3 import dispatch

IDX, F32 = dtypes.index, dtypes.float32


# ---------------------------------------------------------------------------------------------- building kernels

def special(name: str, n: int, dt=IDX) -> UOp: return UOp(Ops.SPECIAL, dt, (), (name, n))
def param(i: int, dt) -> UOp: return UOp(Ops.PARAM, dt, (), i)
def local(i: int, dt, n: int) -> UOp: return UOp(Ops.DEFINE_LOCAL, dt, (), (i, n))


def index(buf: UOp, i: UOp, valid: UOp | None = None) -> UOp:
  return UOp(Ops.INDEX, None, (buf, i) if valid is None else (buf, i, valid))


def load(buf: UOp, i: UOp, valid: UOp | None = None, after: UOp | None = None) -> UOp:
  return UOp(Ops.LOAD, buf.dtype, (index(buf, i, valid),) + ((after,) if after is not None else ()))


def store(buf: UOp, i: UOp, value: UOp, valid: UOp | None = None) -> UOp:
  return UOp(Ops.STORE, None, (index(buf, i, valid), value))


def barrier(*stores: UOp) -> UOp: return UOp(Ops.BARRIER, None, stores)
def sink(*stores: UOp) -> UOp: return UOp(Ops.SINK, None, stores)


def render(ast: UOp, n_params: int, name: str):
  """(AMDKernel, launch) as codegen.get_program makes them for the AMD device."""
  renderer = AMDRenderer()
  spec = KernelSpec(ast, [UOp(Ops.RESHAPE, F32, (), (1,))] * n_params, name, "AMD")
  low = codegen.lower(spec, renderer)
  assert low.launch.keys() == {"global_size", "local_size"}
  return renderer.render(name, low.program, low.alias, n_params, low.variables), low.launch


def run(kernel, launch, arrays: list[np.ndarray], lds_size: int = 0) -> list[np.ndarray]:
  """Dispatch on the emulator with the arrays as parameters (in PARAM order); returns them as the kernel left them."""
  mem = Memory()
  addrs = []
  for a in arrays:
    addr = mem.alloc(max(a.nbytes, 4))
    mem.array(addr, np.uint8, a.nbytes)[:] = np.frombuffer(a.tobytes(), np.uint8)
    addrs.append(addr)
  ka = mem.alloc(8 * len(addrs))
  mem.array(ka, np.uint64, len(addrs))[:] = addrs
  dispatch(AMDRenderer().compile(kernel), launch["global_size"], launch["local_size"], ka, mem, lds_size=lds_size)
  return [mem.array(addr, np.uint8, a.nbytes).copy().view(a.dtype).reshape(a.shape) for a, addr in zip(arrays, addrs)]


# ---------------------------------------------------------------------------------------------- the kernels

def block_reverse(groups: int = 4, n: int = 64) -> UOp:
  """out[g*n + l] = inp[g*n + n-1-l] through LDS (the example of the IR's description)."""
  g, l = special("gid0", groups), special("lid0", n)
  out, inp, smem = param(0, F32), param(1, F32), local(0, F32, n)
  st = store(smem, l, load(inp, g * n + l))
  return sink(store(out, g * n + l, load(smem, (n - 1) - l, after=barrier(st))))


GX, GY, TX, TY = 3, 2, 16, 4          # 2-D: 3x2 workgroups of 16x4 threads over an 8x48 matrix
W = GX * TX


def tile_rotate() -> UOp:
  """Each 4x16 tile of a matrix turned by 180 degrees through LDS: gid0/gid1 and lid0/lid1."""
  g0, g1, l0, l1 = special("gid0", GX), special("gid1", GY), special("lid0", TX), special("lid1", TY)
  out, inp, smem = param(0, F32), param(1, F32), local(0, F32, TX * TY)
  row, col = g1 * TY + l1, g0 * TX + l0
  st = store(smem, l1 * TX + l0, load(inp, row * W + col))
  return sink(store(out, row * W + col, load(smem, ((TY - 1) - l1) * TX + ((TX - 1) - l0), after=barrier(st))))


def tree_sum(groups: int = 5, n: int = 64) -> UOp:
  """out[g] = the sum of inp[g*n : g*n+n] by halving in LDS: log2(n) gated steps, a barrier after each."""
  g, l = special("gid0", groups), special("lid0", n)
  out, inp, smem = param(0, F32), param(1, F32), local(0, F32, n)
  bar = barrier(store(smem, l, load(inp, g * n + l)))
  s = n // 2
  while s >= 1:
    active = l < s
    total = load(smem, l, active, bar) + load(smem, l + s, active, bar)
    bar = barrier(store(smem, l, total, active))
    s //= 2
  return sink(store(out, g, load(smem, UOp.const(IDX, 0), after=bar), l < 1))


def tree_sum_reference(x: np.ndarray, n: int = 64) -> np.ndarray:
  v = x.reshape(-1, n).copy()
  s = n // 2
  while s >= 1:
    v[:, :s] = v[:, :s] + v[:, s:2 * s]
    s //= 2
  return v[:, 0].copy()


def gated_shift(n: int = 64, written: int = 40) -> UOp:
  """Only threads l < written store to LDS; out[l] = smem[l + 1] where l + 1 < written, else the gated-off 0."""
  l = special("lid0", n)
  out, inp, smem = param(0, F32), param(1, F32), local(0, F32, n)
  st = store(smem, l, load(inp, l) * 2.0, l < written)
  return sink(store(out, l, load(smem, l + 1, l < written - 1, barrier(st))))


def loop_over_lds(groups: int = 3, n: int = 64) -> UOp:
  """Every thread sums its workgroup's n values from LDS in a loop (a REDUCE over a RANGE reading workgroup memory,
  as a grouped reduce's second stage does), then adds its own value: out[g*n + l] = sum(x[g]) + x[g*n + l]."""
  g, l = special("gid0", groups), special("lid0", n)
  out, inp, smem = param(0, F32), param(1, F32), local(0, F32, n)
  bar = barrier(store(smem, l, load(inp, g * n + l)))
  r = UOp(Ops.RANGE, IDX, (UOp.const(IDX, n),), (0, "reduce"))
  total = UOp(Ops.REDUCE, F32, (load(smem, r, after=bar), r), Ops.ADD)
  return sink(store(out, g * n + l, total + load(smem, l, after=bar)))


def staged_sum(groups: int = 2, n: int = 32, steps: int = 4) -> UOp:
  """compiler/gpu.py's STAGE pattern: in each step of a reduce loop a barrier (its source the RANGE: every thread is
  done reading the previous tile), the threads fill the tile from global memory, a barrier, then each reads another
  thread's element: out[g*n + l] = sum over steps r of x[(g*steps + r)*n + n-1-l]."""
  g, l = special("gid0", groups), special("lid0", n)
  out, inp, tile = param(0, F32), param(1, F32), local(0, F32, n)
  r = UOp(Ops.RANGE, IDX, (UOp.const(IDX, steps),), (0, "reduce"))
  first = UOp(Ops.BARRIER, None, (r,))
  fill = store(tile, l, UOp(Ops.LOAD, F32, (index(inp, (g * steps + r) * n + l), first)))
  total = UOp(Ops.REDUCE, F32, (load(tile, (n - 1) - l, after=barrier(fill)), r), Ops.ADD)
  return sink(store(out, g * n + l, total))


SMALL = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.float16, dtypes.float64, dtypes.int64]


def small_types(groups: int = 2, n: int = 32) -> UOp:
  """8/16/64-bit values through LDS buffers of 37 elements (offsets 16-byte aligned): out_t[g*n + l] =
  smem_t[n-1-l] for each type, plus the int8 values widened to int32 (ds_load_i8 sign-extends) and float16 * 2."""
  g, l = special("gid0", groups), special("lid0", n)
  stores, loads = [], []
  for k, dt in enumerate(SMALL):
    smem = local(k, dt, 37)
    stores.append(store(smem, l, load(param(len(SMALL) + 2 + k, dt), g * n + l)))
    loads.append((dt, smem))
  bar = barrier(*stores)
  outs = [store(param(k, dt), g * n + l, load(smem, (n - 1) - l, after=bar)) for k, (dt, smem) in enumerate(loads)]
  i8 = load(loads[0][1], (n - 1) - l, after=bar)
  f16 = load(loads[3][1], (n - 1) - l, after=bar)
  outs.append(store(param(len(SMALL), dtypes.int32), g * n + l, i8.cast(dtypes.int32)))
  outs.append(store(param(len(SMALL) + 1, dtypes.float16), g * n + l, f16 * UOp.const(dtypes.float16, 2.0)))
  return sink(*outs)


GRID3, BLOCK3 = (2, 3, 2), (4, 2, 2)


def ids3d(dt=IDX, axes=(0, 1, 2)) -> UOp:
  """out[flat thread] = gid0 + 10 gid1 + 100 gid2 + 1000 lid0 + 10^4 lid1 + 10^5 lid2 over the axes used."""
  gid = {a: special(f"gid{a}", GRID3[a], dt) for a in axes}
  lid = {a: special(f"lid{a}", BLOCK3[a], dt) for a in axes}
  flat, code = UOp.const(dt, 0), UOp.const(dt, 0)
  for a in reversed(axes): flat = flat * GRID3[a] + gid[a]
  for a in reversed(axes): flat = flat * BLOCK3[a] + lid[a]
  for a in axes: code = code + gid[a] * 10 ** a + lid[a] * 10 ** (3 + a)
  return sink(store(param(0, dtypes.int32), flat, code.cast(dtypes.int32) if dt != dtypes.int32 else code))


def ids3d_reference(axes=(0, 1, 2)) -> np.ndarray:
  shape = [GRID3[a] for a in reversed(axes)] + [BLOCK3[a] for a in reversed(axes)]
  grids = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
  k = len(axes)
  code = sum(grids[k - 1 - i] * 10 ** a + grids[2 * k - 1 - i] * 10 ** (3 + a) for i, a in enumerate(axes))
  return code.reshape(-1).astype(np.int32)


def accumulators(n_acc: int, threads: int, k_steps: int = 8, groups: int = 1):
  """A hand-built linear program (what linearize gives a register tile): out[t*n_acc + j] = sum_k x[t*K + k] *
  w[k*n_acc + j] with one float32 accumulator per j live across the reduce loop; each iteration loads all n_acc
  operands w[k, :] before the first update, so n_acc accumulators and n_acc operands are live at once."""
  g, l = special("gid0", groups), special("lid0", threads)
  out, x, w = param(0, F32), param(1, F32), param(2, F32)
  t = g * threads + l
  r = UOp(Ops.RANGE, IDX, (UOp.const(IDX, k_steps),), (0, "reduce"))
  accs = [UOp(Ops.DEFINE_ACC, F32, (), (Ops.ADD, j)) for j in range(n_acc)]
  xk = load(x, t * k_steps + r)
  ws = [load(w, r * n_acc + j) for j in range(n_acc)]
  updates = [UOp(Ops.ACC_UPDATE, F32, (acc, acc + xk * wj)) for acc, wj in zip(accs, ws)]
  stores = [store(out, t * n_acc + j, acc) for j, acc in enumerate(accs)]
  program, seen = [], set()

  def emit(u: UOp):
    if u in seen: return
    for s in u.src: emit(s)
    seen.add(u); program.append(u)
  for u in [out, x, w, t, *accs, r]: emit(u)
  for u in [xk, *ws, *updates]: emit(u)
  program.append(UOp(Ops.ENDRANGE, None, (r,)))
  for u in stores: emit(u)
  launch = {"global_size": (groups, 1, 1), "local_size": (threads, 1, 1)}
  return program, launch


def render_program(program, name: str):
  return AMDRenderer().render(name, program, {}, 3, [])


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """float32 a * b + c rounded once (IEEE fusedMultiplyAdd), by numpy: a * b is exact in float64, the sum is rounded
  to float64 with its exact error (TwoSum), then to odd (an inexact sum with an even last bit moves one float64 ulp
  toward the exact value), which float32's round to nearest even then rounds correctly (53 >= 24 + 2 bits: Boldo &
  Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", 2008)."""
  p, c = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
  s = p + c
  bb = s - p
  err = (p - (s - bb)) + (c - bb)
  odd = (err != 0) & ((s.view(np.int64) & 1) == 0)
  s = np.where(odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
  return s.astype(np.float32)


# ---------------------------------------------------------------------------------------------- results vs numpy

def test_block_reverse_1d():
  k, launch = render(block_reverse(), 2, "block_reverse")
  assert launch == {"global_size": (4, 1, 1), "local_size": (64, 1, 1)}
  assert k.meta.lds_size == 256 and k.meta.workgroup_ids == (True, False, False) and k.meta.workitem_dims == 1
  assert k.meta.max_flat_workgroup_size == 64
  x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
  out, _ = run(k, launch, [np.zeros(256, np.float32), x])
  np.testing.assert_array_equal(out, x.reshape(4, 64)[:, ::-1].reshape(-1))
  assert "gid0" not in str(k) and re.search(r"v_and_b32 v\d+, 0x3ff, v0", str(k))


def test_tile_rotate_2d_workgroup():
  k, launch = render(tile_rotate(), 2, "tile_rotate")
  assert launch == {"global_size": (GX, GY, 1), "local_size": (TX, TY, 1)}
  assert k.meta.workgroup_ids == (True, True, False) and k.meta.workitem_dims == 2
  text = str(k)
  assert re.search(r"v_bfe_u32 v\d+, v0, 10, 10", text)          # lid1: bits 10-19 of v0
  assert re.search(r"\bs3\b", text)                                # gid1 read from its system SGPR
  x = np.arange(GY * TY * W, dtype=np.float32)
  out, _ = run(k, launch, [np.zeros_like(x), x])
  np.testing.assert_array_equal(out, x.reshape(GY, TY, GX, TX)[:, ::-1, :, ::-1].reshape(-1))


def test_tree_reduction_several_barriers():
  k, launch = render(tree_sum(), 2, "tree_sum")
  assert str(k).count("s_barrier") == 7                               # the first store + 6 halvings
  x = np.random.default_rng(1).standard_normal(5 * 64).astype(np.float32)
  out, _ = run(k, launch, [np.full(5, -1, np.float32), x])
  np.testing.assert_array_equal(out, tree_sum_reference(x))     # the same additions in the same order: bit exact


def test_gated_local_accesses():
  k, launch = render(gated_shift(), 2, "gated_shift")
  x = np.arange(1, 65, dtype=np.float32)
  out, _ = run(k, launch, [np.full(64, -1, np.float32), x])
  want = np.where(np.arange(64) < 39, 2 * np.roll(x, -1), 0).astype(np.float32)
  np.testing.assert_array_equal(out, want)


def test_lds_loads_in_a_loop():
  k, launch = render(loop_over_lds(), 2, "loop_over_lds")
  x = np.random.default_rng(4).integers(-1000, 1000, 3 * 64).astype(np.float32)      # sums exact in float32
  out, _ = run(k, launch, [np.zeros_like(x), x])
  np.testing.assert_array_equal(out, (x.reshape(3, 64).sum(1)[:, None] + x.reshape(3, 64)).reshape(-1))


def test_barrier_in_a_loop():
  k, launch = render(staged_sum(), 2, "staged_sum")
  lines = [x.strip() for x in str(k).splitlines()]
  top = next(i for i, x in enumerate(lines) if x.startswith(".loop"))
  end = next(i for i, x in enumerate(lines) if x.startswith(".endloop"))
  assert lines[top:end].count("s_barrier") == 2          # both barriers run in every step
  x = np.random.default_rng(5).integers(-1000, 1000, 2 * 4 * 32).astype(np.float32)
  out, _ = run(k, launch, [np.zeros(64, np.float32), x])
  np.testing.assert_array_equal(out, x.reshape(2, 4, 32)[:, :, ::-1].sum(1).reshape(-1))


def test_small_and_wide_types_through_lds():
  k, launch = render(small_types(), 2 * len(SMALL) + 2, "small_types")
  assert k.meta.lds_size == 16 * sum(-(-37 * dt.itemsize // 16) for dt in SMALL)
  text = str(k)
  for inst in ("ds_store_b8", "ds_store_b16", "ds_store_b64", "ds_load_i8", "ds_load_u8", "ds_load_i16", "ds_load_u16",
               "ds_load_b64"):
    assert inst in text, inst
  rng = np.random.default_rng(2)
  ins = [rng.integers(-128, 128, 64).astype(np.int8), rng.integers(0, 256, 64).astype(np.uint8),
         rng.integers(-32768, 32768, 64).astype(np.int16), rng.standard_normal(64).astype(np.float16),
         rng.standard_normal(64), rng.integers(-2**62, 2**62, 64)]
  outs = [np.zeros(64, a.dtype) for a in ins] + [np.zeros(64, np.int32), np.zeros(64, np.float16)]
  got = run(k, launch, outs + ins)
  rev = lambda a: a.reshape(2, 32)[:, ::-1].reshape(-1)   # noqa: E731
  for a, g in zip(ins, got): np.testing.assert_array_equal(g, rev(a), err_msg=str(a.dtype))
  np.testing.assert_array_equal(got[len(SMALL)], rev(ins[0]).astype(np.int32))
  np.testing.assert_array_equal(got[len(SMALL) + 1], rev(ins[3]) * np.float16(2))


@pytest.mark.parametrize("dt,axes", [(IDX, (0, 1, 2)), (dtypes.int32, (0, 1, 2)), (dtypes.int32, (0, 2)), (IDX, (1,))],
                         ids=["index-xyz", "int32-xyz", "int32-xz", "index-y"])
def test_workgroup_and_workitem_ids(dt, axes):
  """Each id from where AMDGPUUsage puts it: workgroup ids in the system SGPRs after s[0:1] (only the enabled ones,
  so z is s3 when y is off), work-item ids packed in v0 (ENABLE_VGPR_WORKITEM_ID 2 for z even without y)."""
  k, launch = render(ids3d(dt, axes), 1, "ids")
  assert k.meta.workgroup_ids == (True, 1 in axes, 2 in axes)
  assert k.meta.workitem_dims == (3 if 2 in axes else 2 if 1 in axes else 1)
  if dt == dtypes.int32: assert not re.search(r"v_\w+_[biu]64", str(k)), str(k)    # int32 ids: no 64-bit math
  n = int(np.prod([GRID3[a] * BLOCK3[a] for a in axes]))
  out, = run(k, launch, [np.full(n, -1, np.int32)])
  np.testing.assert_array_equal(out, ids3d_reference(axes))


def test_64_accumulators_in_a_reduce_loop():
  program, launch = accumulators(64, threads=64, groups=2)
  k = render_program(program, "acc64")
  assert 129 <= k.meta.vgprs <= 256          # 64 accumulators + 64 operands live at once, all in registers
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((128, 8)).astype(np.float32), rng.standard_normal((8, 64)).astype(np.float32)
  out, _, _ = run(k, launch, [np.zeros(128 * 64, np.float32), x.reshape(-1), w.reshape(-1)])
  acc = np.zeros((128, 64), np.float32)
  for j in range(8): acc = fma32(np.broadcast_to(x[:, j:j + 1], acc.shape), np.broadcast_to(w[j], acc.shape), acc)
  np.testing.assert_array_equal(out.reshape(128, 64), acc)    # one v_fmac_f32 a step, in the same order
  assert str(k).count("v_fmac_f32") == 64 and "v_mul_f32" not in str(k)


def test_dead_registers_are_reused():
  """Values that die are given back: 16 accumulators over 8 loop steps need far fewer VGPRs than values made."""
  from baregrad.compiler.amd.inst import Inst, Reg, Sub
  program, _ = accumulators(16, threads=32)
  k = render_program(program, "acc16")
  made = sum(1 for x in k.code if isinstance(x, Inst) and x.operands and isinstance(x.operands[0], (Reg, Sub))
             and x.operands[0].file == "v" and not x.name.startswith(("global_store", "ds_store", "v_fmac")))
  assert k.meta.vgprs <= 40 and made >= 2 * 16 + 4     # an init and a load per accumulator, the addresses


def test_register_need_beyond_the_budget_is_a_clear_error():
  program, _ = accumulators(130, threads=64)          # 130 accumulators + 130 operands live: > 256 VGPRs
  with pytest.raises(RegisterPressureError) as e:
    render_program(program, "acc130")
  msg = str(e.value)
  assert "'acc130'" in msg and "VGPRs" in msg and "the 256" in msg
  need = int(re.search(r"needs (\d+) VGPRs", msg)[1])
  assert need > 256 and f"{need - 256} more than" in msg
  # a 1024-thread workgroup puts 8 waves on each SIMD: 1536 / 8 = 192 VGPRs a wave (alloc granule 24)
  program, _ = accumulators(100, threads=1024)
  with pytest.raises(RegisterPressureError, match=r"'acc100'.* more than the 192 .*1024 threads"):
    render_program(program, "acc100")
  program, _ = accumulators(100, threads=256)          # fits in 256 when 2 waves share a SIMD
  assert 192 < render_program(program, "acc100").meta.vgprs <= 256


def test_lds_limits():
  with pytest.raises(ValueError, match=r"'too_big' needs 65552 bytes of workgroup memory.*65536"):
    l = special("lid0", 64)
    big = local(0, F32, 16384)
    small = local(1, F32, 4)
    render(sink(store(big, l, UOp.const(F32, 1.0)), store(small, l, UOp.const(F32, 2.0), l < 4)), 0, "too_big")
  # the emulator refuses an access outside the descriptor's LDS (+ what the dispatch adds) ...
  l = special("lid0", 64)
  smem = local(0, F32, 64)
  k, launch = render(sink(store(smem, l + 32, UOp.const(F32, 1.0))), 0, "past_end")
  with pytest.raises(MemoryFault, match="LDS address out of the 256-byte"):
    run(k, launch, [])
  run(k, launch, [], lds_size=128)        # ... dynamic LDS makes it valid
  # ... and a descriptor asking for more than a workgroup has
  kd = KernelDescriptor.for_kernel(vgprs=8, lds_size=65536 + 512)
  co = write_code_object("k", assemble(k.code), kd, 0, [])
  with pytest.raises(ValueError, match="65536"):
    dispatch(co, (1, 1, 1), (64, 1, 1), 0, Memory())


def test_barrier_needs_the_lds_stores_done():
  """The emulator's dependency checker refuses an s_barrier while the wave's LDS store may be in flight (the renderer
  puts `s_waitcnt lgkmcnt(0)` before every s_barrier)."""
  from baregrad.compiler.amd.asm import assemble as assemble_text
  from baregrad.drivers.emu.rdna3 import MissingWait
  body = ("v_lshlrev_b32 v1, 2, v0\n ds_store_b32 v1, v0\n {wait}\n s_barrier\n ds_load_b32 v2, v1\n"
          " s_waitcnt lgkmcnt(0)\n s_endpgm")
  kd = KernelDescriptor.for_kernel(vgprs=8, lds_size=256, workgroup_ids=1, workitem_dims=1)
  def go(wait: str): dispatch(write_code_object("k", assemble_text(body.format(wait=wait)), kd, 0, []), (1, 1, 1),
                              (64, 1, 1), 0, Memory())
  go("s_waitcnt lgkmcnt(0)")
  with pytest.raises(MissingWait, match=r"s_barrier.*ds_store_b32.*lgkmcnt\(0\)"):
    go("")
  for k in all_kernels():       # and every barrier the renderer makes has the wait right before it
    text = [x for x in str(k).splitlines() if not x.startswith(";")]
    for i, line in enumerate(text):
      if line.strip() == "s_barrier": assert text[i - 1].strip() == "s_waitcnt lgkmcnt(0)", k.meta.name


def test_lds_wait_counts_in_order():
  """insert_lds_waits counts the DS operations issued after the load whose result is needed (LGKM_CNT decrements in
  order for LDS); the emulator's dependency checker accepts exactly that count and refuses one more."""
  from baregrad.compiler.amd.asm import parse
  from baregrad.compiler.render_amd import insert_lds_waits
  from baregrad.drivers.emu.rdna3 import MissingWait
  src = ["v_lshlrev_b32 v3, 2, v0", "ds_store_b32 v3, v0", "s_waitcnt lgkmcnt(0)", "ds_load_b32 v1, v3",
         "ds_load_b32 v2, v3 offset:4", "ds_store_b32 v3, v0 offset:8", "v_add_nc_u32 v4, v1, 1",
         "v_add_nc_u32 v4, v4, v2", "s_endpgm"]
  code = insert_lds_waits([parse(line) for line in src])
  text = [str(x) for x in code]
  assert text[6:8] == ["s_waitcnt lgkmcnt(2)", "v_add_nc_u32 v4, v1, 1"], text     # v1: 2 DS operations younger
  assert text[8:10] == ["s_waitcnt lgkmcnt(1)", "v_add_nc_u32 v4, v4, v2"], text   # v2: the store after it
  kd = KernelDescriptor.for_kernel(vgprs=8, lds_size=512, workgroup_ids=1, workitem_dims=1)
  # one wave (its lanes read what neighbouring lanes stored: in order within a wave, a race between two waves)
  def go(code): dispatch(write_code_object("w", assemble(code), kd, 0, []), (1, 1, 1), (32, 1, 1), 0, Memory())
  go(code)
  with pytest.raises(MissingWait, match="lgkmcnt"):
    go(code[:6] + [parse("s_waitcnt lgkmcnt(3)")] + code[7:])


def test_bad_workgroup_input_is_named():
  with pytest.raises(ValueError, match="mixes the 1-D SPECIAL 'gidx'"):
    render(sink(store(param(0, F32), special("gidx", 256) + special("lid0", 4), UOp.const(F32, 0.0))), 1, "mixed")
  with pytest.raises(ValueError, match="workgroup of 64x32x1 threads"):
    render(sink(store(param(0, F32), special("lid0", 64) * 32 + special("lid1", 32), UOp.const(F32, 0.0))), 1, "huge")


# ---------------------------------------------------------------------------------------------- LLVM as the reference

def all_kernels():
  out = [render(block_reverse(), 2, "block_reverse")[0], render(tile_rotate(), 2, "tile_rotate")[0],
         render(tree_sum(), 2, "tree_sum")[0], render(gated_shift(), 2, "gated_shift")[0],
         render(loop_over_lds(), 2, "loop_over_lds")[0], render(staged_sum(), 2, "staged_sum")[0],
         render(small_types(), 2 * len(SMALL) + 2, "small_types")[0],
         render(ids3d(IDX, (0, 1, 2)), 1, "ids_xyz")[0], render(ids3d(dtypes.int32, (0, 2)), 1, "ids_xz")[0],
         render_program(accumulators(64, threads=64)[0], "acc64")]
  return out


def _need(tool: str) -> str:
  found = shutil.which(tool)
  if found: return found
  if os.environ.get("CI"): pytest.fail(f"{tool} is required in CI (apt-get install llvm-19)")
  pytest.skip(f"{tool} not found (apt-get install llvm-19)")


def assert_llvm_mc_same_bytes(ks, expected_instructions):
  """llvm-mc-19 assembles the kernels' listings (each must contain `expected_instructions`) to the bytes baregrad's
  encoder made from the same instruction objects."""
  mc = _need("llvm-mc-19")
  from elftools.elf.elffile import ELFFile
  text = "\n".join(re.sub(r"(\.[A-Za-z]+\d+)\b", rf"\1_k{i}", str(k)) for i, k in enumerate(ks))
  for inst in expected_instructions: assert inst in text, inst
  with tempfile.TemporaryDirectory() as d:
    Path(d, "k.s").write_text(text)
    p = subprocess.run([mc, "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx1100", "-filetype=obj", f"{d}/k.s", "-o", f"{d}/k.o"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr[:3000]
    with open(f"{d}/k.o", "rb") as f: data = ELFFile(f).get_section_by_name(".text").data()
  ours = [assemble(k.code) for k in ks]
  assert data == b"".join(ours), [k.meta.name for k, c in zip(ks, ours) if c not in data]


def test_llvm_mc_same_bytes():
  """The workgroup kernels (ds_*, s_barrier, v_bfe_u32 of v0, system SGPRs s3/s4) through llvm-mc-19."""
  assert_llvm_mc_same_bytes(all_kernels(), ("ds_store_b32", "ds_load_b32", "ds_load_i8", "ds_store_b64", "s_barrier",
                                            "v_bfe_u32", "lgkmcnt"))


def test_llvm_objdump_reads_the_descriptors():
  objdump = _need("llvm-objdump-19")
  cases = [(render(tile_rotate(), 2, "tile_rotate")[0], (1, 0), 1, TX * TY * 4),     # (y, z) ids, work-item ids, LDS
           (render(ids3d(dtypes.int32, (0, 2)), 1, "ids_xz")[0], (0, 1), 2, 0),
           (render(small_types(), 2 * len(SMALL) + 2, "small_types")[0], (0, 0), 0, None)]
  with tempfile.TemporaryDirectory() as d:
    for k, (y, z), workitem, lds in cases:
      co = AMDRenderer().compile(k)
      Path(d, "k.hsaco").write_bytes(co)
      p = subprocess.run([objdump, "-D", "-j", ".rodata", f"{d}/k.hsaco"], capture_output=True, text=True)
      assert p.returncode == 0, p.stderr
      f = {m[1]: int(m[2], 0) for m in re.finditer(r"^\s*(\.amdhsa_\w+)\s+(-?(?:0x[0-9a-fA-F]+|\d+))\s*$", p.stdout, re.M)}
      assert f[".amdhsa_system_sgpr_workgroup_id_x"] == 1, k.meta.name
      assert (f[".amdhsa_system_sgpr_workgroup_id_y"], f[".amdhsa_system_sgpr_workgroup_id_z"]) == (y, z), k.meta.name
      assert f[".amdhsa_system_vgpr_workitem_id"] == workitem, k.meta.name
      assert f[".amdhsa_group_segment_fixed_size"] == (k.meta.lds_size if lds is None else lds), k.meta.name
      assert k.meta.vgprs <= f[".amdhsa_next_free_vgpr"] < k.meta.vgprs + 8
      _, kd, _, _ = read_code_object(co)
      assert kd.group_segment_fixed_size == k.meta.lds_size


# ---------------------------------------------------------------------------------------------- the device path

def test_end_to_end_on_the_emulated_device():
  """get_program -> the AMD driver (PM4 dispatch of 3x2 workgroups of 16x4, LDS in RSRC2) -> emulated KFD."""
  code = textwrap.dedent(f"""
    import sys, numpy as np
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from test_render_amd_workgroups import tile_rotate, GX, GY, TX, TY, W, F32
    from baregrad.compiler import codegen
    from baregrad.compiler.uop import UOp, Ops
    from baregrad.compiler.rangeify import KernelSpec
    from baregrad.compiler.dtype import dtypes
    from baregrad.hcq.buffer import Buffer
    from baregrad.hcq.runtime import ExecItem, run_schedule
    n = GY * TY * W
    prog = codegen.get_program(KernelSpec(tile_rotate(), [UOp(Ops.RESHAPE, F32, (), (n,))] * 2, "tile_rotate", "AMD"))
    x = np.arange(n, dtype=np.float32)
    bufs = [Buffer("AMD", 4 * n, dtypes.uint8).ensure_allocated() for _ in range(2)]
    bufs[1].copyin(x.tobytes())
    run_schedule([ExecItem(prog, bufs, {{}}, dict(prog.meta, name=prog.name))], sync=True)
    out = np.zeros(n, np.float32)
    bufs[0].copyout(memoryview(out).cast("B"))
    assert (out == x.reshape(GY, TY, GX, TX)[:, ::-1, :, ::-1].reshape(-1)).all(), out
    print("ok", prog.meta["global_size"], prog.meta["local_size"])
  """)
  r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EMU": "1", "DEV": "AMD"}, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "ok (3, 2, 1) (16, 4, 1)" in r.stdout
