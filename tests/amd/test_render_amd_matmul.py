"""The AMD renderer's tensor-core (WMMA) ops and the instruction-saving techniques of fast workgroup kernels, against
independent references:
- numpy computes what every kernel must write (float64 sums of the 16-bit rounded inputs for the tensor cores; an
  exactly rounded fma for the register tiles); kernels are lowered like codegen.get_program and run on the RDNA3
  emulator (drivers/emu/rdna3.py), which refuses a WMMA with a partial EXEC or lanes 16-31 that differ from lanes
  0-15, a missing s_waitcnt, and the WMMA register hazard (drivers/emu/rdna3_deps.py);
- llvm-mc-19 assembles the listing of every kernel here to the bytes baregrad's encoder makes;
- the listings show the techniques: v_wmma in place on its accumulators, operands loaded with global_load_b128,
  v_fmac_f32 into the accumulators, ds_load_b128, immediate offsets, loop-invariant sums out of the loop, the staged
  tile's loads issued before one wait.
"""
import dataclasses, re, sys
from pathlib import Path

import numpy as np
import pytest

from baregrad.tensor import Tensor
from baregrad.compiler import codegen, gpu
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import UOp, Ops
from baregrad.compiler.opt import Opt
from baregrad.compiler.schedule import normalize
from baregrad.compiler.rangeify import rangeify, KernelSpec
from baregrad.compiler.render_amd import AMDRenderer, wmma_hazards
from baregrad.compiler.amd.encode import assemble

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_render_amd_workgroups import (special, param, load, store, sink, render, run, fma32, F32,  # noqa: E402
                                        assert_llvm_mc_same_bytes)


def spec_of(fn, *arrays) -> KernelSpec:
  t = fn(*(Tensor(a, device="CPU") for a in arrays))
  sink_, _, _ = normalize(t.uop.sink())
  return [i for i in rangeify(sink_, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]


def render_spec(spec: KernelSpec, opts, name: str):
  """(AMDKernel, launch) of spec with GPU opts, lowered for the AMD renderer as get_program does."""
  renderer = AMDRenderer()
  low = codegen.lower(dataclasses.replace(spec, opts=tuple(opts), device="AMD"), renderer)
  return renderer.render(name, low.program, low.alias, len(spec.params), low.variables), low.launch


def loop_body(text: str, n: int = -1) -> list[str]:
  """The lines of the n-th loop (innermost last by default) of a listing."""
  lines = [x.strip() for x in text.splitlines()]
  tops = [i for i, x in enumerate(lines) if x.startswith(".loop")]
  top = tops[n]
  end = next(i for i in range(top, len(lines)) if lines[i].startswith("s_cbranch_scc1 " + lines[top][:-1]))
  return lines[top + 1:end]


# ---------------------------------------------------------------------------------------------- tensor cores

def tc_matmul(dt: str, m: int = 64, k: int = 48, n: int = 32, seed: int = 0):
  r = np.random.default_rng(seed)
  a, b = r.standard_normal((m, k)).astype(dt), r.standard_normal((k, n)).astype(dt)
  return spec_of(lambda x, y: x @ y, a, b), a, b


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("which", ["tc", "heuristic"])
def test_wmma_matmul(dt, which):
  """64x48 @ 48x32 on the tensor cores: one v_wmma per 16x16x16 tile step, accumulating in place, A read with
  global_load_b128 (16 neighbouring halves of a row), B's halves paired with v_lshl_or_b32."""
  r = np.random.default_rng(1)
  a32, b32 = r.standard_normal((64, 48)).astype(np.float32), r.standard_normal((48, 32)).astype(np.float32)
  if dt == "float16":
    a, b = a32.astype(np.float16), b32.astype(np.float16)
    spec = spec_of(lambda x, y: x @ y, a, b)
    ah, bh = a.astype(np.float64), b.astype(np.float64)
  else:   # bfloat16 inputs: rounded by the CPU device, the kernel's parameters are their bits
    ta, tb = (Tensor(x, device="CPU").cast("bfloat16").realize() for x in (a32, b32))
    t = ta @ tb
    sink_, _, _ = normalize(t.uop.sink())
    spec = [i for i in rangeify(sink_, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]
    a, b = ((x.cast("float32").numpy().view(np.uint32) >> 16).astype(np.uint16) for x in (ta, tb))
    ah, bh = ((x.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for x in (a, b))
  assert all(p.dtype == getattr(dtypes, dt) for p in spec.params)
  opts = [Opt("TC", 0, 0)] if which == "tc" else gpu.gpu_opts(spec.ast, "AMD")
  assert opts[0] == Opt("TC", 0, 0), opts
  k, launch = render_spec(spec, opts, f"wmma_{dt}_{which}")
  text = str(k)
  name = "v_wmma_f32_16x16x16_" + ("f16" if dt == "float16" else "bf16")
  wmmas = re.findall(rf"{name} (v\[\d+:\d+\]), (v\[\d+:\d+\]), (v\[\d+:\d+\]), (\S+)", text)
  a_tiles, b_tiles = {"tc": (1, 1), "heuristic": (4, 2)}[which]      # the heuristic: 4x2 tiles of 16x16 a wave
  assert len(wmmas) == a_tiles * b_tiles, text
  assert all(d == c for d, _, _, c in wmmas), wmmas             # D = C: in place on the accumulators
  body = loop_body(text)
  ops = [x.split()[0] for x in body]
  assert ops.count("global_load_b128") == 2 * a_tiles and ops.count("v_lshl_or_b32") == 8 * b_tiles, body
  assert not any(x.startswith(("v_mov_b32", "v_add_f32")) for x in body), body
  want = (ah @ bh).reshape(-1)
  out = np.zeros(64 * 32, np.float16 if dt == "float16" else np.uint16)
  got, _, _ = run(k, launch, [out, a.reshape(-1), b.reshape(-1)])
  got = got.astype(np.float64) if dt == "float16" else (got.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-2 if dt == "bfloat16" else 2e-3, atol=1e-2)


def test_wmma_hazard_pass_against_the_emulator():
  """wmma_hazards puts an independent VALU between a v_wmma and a v_wmma that reads the first one's D as A or B (the
  emulator's dependency checker refuses the pair without it) and nothing between independent ones."""
  from baregrad.compiler.amd.asm import parse
  from baregrad.drivers.amd.codeobj import write_code_object, KernelDescriptor
  from baregrad.drivers.emu.memory import Memory
  from baregrad.drivers.emu.rdna3 import dispatch
  from baregrad.drivers.emu.rdna3_deps import HazardError
  init = [parse(f"v_mov_b32 v{r}, 0x3c003c00") for r in range(8, 32)]       # halves of 1.0 in every lane
  def go(code):
    kd = KernelDescriptor.for_kernel(vgprs=40, lds_size=0, workgroup_ids=1, workitem_dims=1)
    dispatch(write_code_object("h", assemble(code), kd, 0, []), (1, 1, 1), (32, 1, 1), 0, Memory())
  dependent = [parse("v_wmma_f32_16x16x16_f16 v[8:15], v[16:23], v[24:31], 0"),
               parse("v_wmma_f32_16x16x16_f16 v[32:39], v[8:15], v[24:31], 0"), parse("s_endpgm")]
  independent = [parse("v_wmma_f32_16x16x16_f16 v[32:39], v[16:23], v[24:31], 0"),
                 parse("v_wmma_f32_16x16x16_f16 v[32:39], v[16:23], v[24:31], v[32:39]"), parse("s_endpgm")]
  with pytest.raises(HazardError, match="WMMA hazard"): go(init + dependent)
  fixed = wmma_hazards(init + dependent)
  assert [str(x) for x in fixed[len(init):]][:3] == [str(dependent[0]), "v_nop", str(dependent[1])]
  go(fixed)
  assert [str(x) for x in wmma_hazards(init + independent)] == [str(x) for x in init + independent]
  go(init + independent)


# ---------------------------------------------------------------------------------------------- register tiles

STAGED = [Opt("UPCAST", 1, 4), Opt("UPCAST", 0, 4), Opt("LOCAL", 1, 8), Opt("LOCAL", 0, 8), Opt("STAGE", 0, 8)]


def staged_matmul():
  r = np.random.default_rng(2)
  a, b = r.standard_normal((64, 32)).astype(np.float32), r.standard_normal((32, 64)).astype(np.float32)
  spec = spec_of(lambda x, y: x @ y, a, b)
  return render_spec(spec, STAGED, "staged_matmul"), a, b


def test_staged_matmul_instructions():
  """A 4x4 register tile staged through LDS: in the inner loop one v_fmac_f32 per output into its accumulator and
  the operands as ds_load_b128 (no mul, add or copy); in the staging loop the loads go out before one wait, and the
  invariant part of each address sum is added before the loop."""
  (k, launch), a, b = staged_matmul()
  text = str(k)
  inner = loop_body(text, -1)
  ops = [x.split()[0] for x in inner]
  assert ops.count("v_fmac_f32") == 16 and ops.count("ds_load_b128") == 2, inner
  assert not {"v_mul_f32", "v_add_f32", "v_mov_b32", "ds_load_b32"} & set(ops), inner
  outer = loop_body(text, 0)
  outer = outer[:next(i for i, x in enumerate(outer) if x.startswith(".loop"))]
  loads = [i for i, x in enumerate(outer) if x.startswith("global_load")]
  stores = [i for i, x in enumerate(outer) if x.startswith("ds_store")]
  assert len(loads) == len(stores) == 8 and max(loads) < min(stores), outer      # 4 of A, 4 of B a thread
  assert sum(x.startswith("s_waitcnt vmcnt") for x in outer) == 1, outer
  assert sum(x.startswith("v_add_nc_u32") for x in outer) <= len(loads), outer     # one add per address, not four
  out, _, _ = run(k, launch, [np.zeros(64 * 64, np.float32), a.reshape(-1), b.reshape(-1)])
  want = np.zeros((64, 64), np.float32)
  for j in range(32): want = fma32(np.broadcast_to(a[:, j:j + 1], want.shape), np.broadcast_to(b[j], want.shape), want)
  np.testing.assert_array_equal(out.reshape(64, 64), want)     # the same fma, in the same order: bit exact


# ---------------------------------------------------------------------------------------------- addresses

def offsets_kernel(n: int = 64):
  """out[l + c] = in[l + c] * 2 for the constant offsets c of C (bytes up to 4 * 6000: three 8 KiB windows)."""
  l = special("lid0", n)
  out, inp = param(0, F32), param(1, F32)
  return sink(*(store(out, l + c, load(inp, l + c) * UOp.const(F32, 2.0)) for c in C))


C = (0, 1, 100, 1023, 1024, 3000, 6000)


def test_immediate_offsets_and_windows():
  """Neighbouring elements share one address VGPR: the constant of each index is the instruction's immediate offset,
  and beyond its signed 13 bits an SGPR base moved by 8 KiB (set once)."""
  k, launch = render(offsets_kernel(), 2, "offsets")
  text = str(k)
  assert text.count("v_lshlrev_b32") == 1, text
  offs = {int(m) for m in re.findall(r"global_load_b32 v\d+, v\d+, s\[\d+:\d+\](?: offset:(-?\d+))?", text) if m}
  assert offs and all(-4096 <= o < 4096 for o in offs) and "s_add_u32" in text, text
  x = np.random.default_rng(3).standard_normal(6064).astype(np.float32)
  out, _ = run(k, launch, [np.zeros(6064, np.float32), x])
  want = np.zeros(6064, np.float32)
  for c in C: want[c:c + 64] = x[c:c + 64] * 2
  np.testing.assert_array_equal(out, want)


def negative_range_kernel() -> UOp:
  I32 = dtypes.int32
  l = special("lid0", 64, I32)
  i = l * 2 - (l & UOp.const(I32, 1))    # values 0, 1, 3, 4, ...; its value range (interval arithmetic) starts at -1
  return sink(store(param(0, F32), i, load(param(1, F32), l)))


def test_index_that_may_be_negative_is_one_mad():
  """An index whose value range reaches below 0 (though its values do not) is no unsigned 32-bit offset: its 64-bit
  address is one v_mad_i64_i32 of the 32-bit index."""
  k, launch = render(negative_range_kernel(), 2, "negative_range")
  assert "v_mad_i64_i32" in str(k), str(k)
  x = np.arange(64, dtype=np.float32)
  out, _ = run(k, launch, [np.zeros(128, np.float32), x])
  want = np.zeros(128, np.float32)
  want[np.arange(64) * 2 - (np.arange(64) & 1)] = x
  np.testing.assert_array_equal(out, want)


def test_int64_reduction_through_lds():
  """An int64 partial sum per thread through workgroup memory (INDEX on an int64 DEFINE_LOCAL: an address, not an
  int64 value): a GROUP reduction of integers, as compiler/gpu.py makes it."""
  x = np.random.default_rng(4).integers(-1000, 1000, (8, 48)).astype(np.int32)
  spec = spec_of(lambda t: t.sum(1), x)
  assert spec.ast.src[0].src[1].dtype.itemsize == 8
  k, launch = render_spec(spec, [Opt("GROUP", 0, 4)], "int_sum")
  assert "ds_store_b64" in str(k)
  out, _ = run(k, launch, [np.zeros(8, np.int64), x.reshape(-1)])
  np.testing.assert_array_equal(out, x.astype(np.int64).sum(1))


# ---------------------------------------------------------------------------------------------- LLVM as the reference

def kernels():
  out = [render_spec(tc_matmul(dt)[0], gpu.gpu_opts(tc_matmul(dt)[0].ast, "AMD"), f"wmma_{dt}")[0] for dt in ("float16",)]
  out.append(staged_matmul()[0][0])
  out.append(render(offsets_kernel(), 2, "offsets")[0])
  out.append(render(negative_range_kernel(), 2, "negative_range")[0])
  return out


def test_llvm_mc_same_bytes():
  """llvm-mc-19 assembles each kernel's listing (v_wmma, global_load_b128, ds_load_b128, v_fmac_f32, negative and
  positive immediate offsets, s_add_u32/s_addc_u32 bases, v_mad_i64_i32 with a null carry) to the bytes baregrad's
  encoder made."""
  assert_llvm_mc_same_bytes(kernels(), ("v_wmma_f32_16x16x16_f16", "global_load_b128", "ds_load_b128", "v_fmac_f32",
                                       "v_lshl_or_b32", "s_addc_u32", "offset:-", "v_mad_i64_i32", "v_cvt_f16_f32"))


def test_invariant_terms_of_an_accumulator_sum():
  """out[t] = sum_k (x[t*8 + k] + t + 5) in int32: the loop-invariant terms t and 5 of each step's sum are added once
  before the loop, the accumulator (which changes in every step) never is; numpy's sums are the reference."""
  I32 = dtypes.int32
  t = special("lid0", 64, I32)
  out, x = param(0, I32), param(1, I32)
  r = UOp(Ops.RANGE, I32, (UOp.const(I32, 8),), (0, "reduce"))
  acc = UOp(Ops.DEFINE_ACC, I32, (), (Ops.ADD, 0))
  step = (acc + t) + (load(x, t * 8 + r) + UOp.const(I32, 5))     # the accumulator inside the sum, not at its top
  program = [out, x, t, acc, r]
  program += [n for n in step.toposort() if n not in program] + [UOp(Ops.ACC_UPDATE, I32, (acc, step)),
                                                                  UOp(Ops.ENDRANGE, None, (r,))]
  st = store(out, t, acc)
  program += [n for n in st.toposort() if n not in program]
  k = AMDRenderer().render("acc_sum", program, {}, 2, [])
  body = loop_body(str(k))
  assert sum(x.startswith("v_add_nc_u32") for x in body) == 3, body    # index, + (t + 5), + into the accumulator
  xs = np.random.default_rng(5).integers(-1000, 1000, 64 * 8).astype(np.int32)
  got, _ = run(k, {"global_size": (1, 1, 1), "local_size": (64, 1, 1)}, [np.zeros(64, np.int32), xs])
  np.testing.assert_array_equal(got, (xs.reshape(64, 8) + np.arange(64)[:, None] + 5).sum(1))
