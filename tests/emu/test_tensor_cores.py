"""Tensor-core instructions of both emulated GPUs, pinned to the vendors' documents.

  PTX   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32   (drivers/emu/ptx_exec.py h_mma)
  RDNA3 v_wmma_f32_16x16x16_{f16,bf16} (and the 16-bit-output forms)     (drivers/emu/rdna3_valu.py _compile_wmma)

Each test builds the register fragments from random numpy matrices with the layout functions below, written here
straight from the documents (each cites its section; the emulators' own tables are never used), runs one instruction
in the emulator (hand-written PTX through ptx.launch; an assembled RDNA3 kernel through rdna3.dispatch), reads D back
and compares it with the documented accumulation rule (drivers/emu/rdna3_float.matrix_sum): the exact sum of the 16
products and C, rounded once to nearest even. References: numpy's float64 matmul of the 16-bit inputs plus C,
rounded to float32 (exact for the random matrices), and exact rationals (fractions.Fraction) for inputs built so
that float64 accumulation would round differently. Also: a partial warp / a partial EXEC is refused, the PTX text is
accepted by ptxas and the RDNA3 encodings agree with llvm-mc-19 (each where installed), both GPUs count the
instruction as "alu".
"""
from __future__ import annotations

import math
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pytest

from baregrad.drivers.emu import ptx as ptxmod
from baregrad.drivers.emu.counters import ALU, KernelCounters
from baregrad.drivers.emu.ptx import Memory, PtxUnsupported, PtxWarpError, launch, parse_ptx
from baregrad.drivers.emu.rdna3 import dispatch
from baregrad.drivers.emu.rdna3_state import EmulatorError
from emu_helpers import Buffers, code_object

# ============================================ layouts, from the documents ============================================

# PTX ISA 8.x, "Warp-level matrix multiply-accumulate instructions", section "Matrix Fragments for
# mma.m16n8k16 with floating point type": groupID = %laneid >> 2, threadID_in_group = %laneid % 4.
def ptx_a_element(lane: int, i: int) -> tuple[int, int]:
  """Multiplicand A (16x16, .f16/.bf16): a0..a7, "low to high" in four .f16x2 registers."""
  group_id, thread_in_group = lane >> 2, lane % 4
  row = group_id if (0 <= i < 2 or 4 <= i < 6) else group_id + 8
  col = (thread_in_group * 2) + (i & 0x1) if i < 4 else (thread_in_group * 2) + (i & 0x1) + 8
  return row, col


def ptx_b_element(lane: int, i: int) -> tuple[int, int]:
  """Multiplicand B (16x8): b0..b3 in two .f16x2 registers."""
  group_id, thread_in_group = lane >> 2, lane % 4
  row = (thread_in_group * 2) + (i & 0x1) if i < 2 else (thread_in_group * 2) + (i & 0x1) + 8
  return row, group_id


def ptx_c_element(lane: int, i: int) -> tuple[int, int]:
  """Accumulators C and D (16x8, .f32): c0..c3 in four .f32 registers."""
  group_id, thread_in_group = lane >> 2, lane % 4
  row = group_id if i < 2 else group_id + 8
  return row, (thread_in_group * 2) + (i & 0x1)


# RDNA3 (wave32): RDNA3 ISA guide, "Wave Matrix Multiply Accumulate (WMMA)", as AMD's Matrix Instruction Calculator
# states it (matrix_calculator.py --architecture rdna3 --instruction v_wmma_f32_16x16x16_f16 --detail-instruction,
# "Wave32 matrix element to register mapping with no modifiers"):
#   A[i][k] GPR: floor(k / 2).[16*(k % 2)+15 : 16*(k % 2)]   A[i][k] Lane: i and i+16
#   B[k][j] GPR: floor(k / 2).[16*(k % 2)+15 : 16*(k % 2)]   B[k][j] Lane: j and j+16
#   C or D[i][j] GPR: floor(i / 2)                           C or D[i][j] Lane: ((16 * i) % 32) + j
# and for the 16-bit C/D of v_wmma_f16/bf16_16x16x16_*: the .[15:0] half of that GPR, .[31:16] with OPSEL[2] = 1.
def wmma_a_location(i: int, k: int) -> tuple[int, int, list[int]]:
  """(vgpr, half, lanes) holding A[i][k]."""
  return k // 2, k % 2, [i, i + 16]


def wmma_b_location(k: int, j: int) -> tuple[int, int, list[int]]:
  return k // 2, k % 2, [j, j + 16]


def wmma_d_location(i: int, j: int) -> tuple[int, int]:
  """(vgpr, lane) holding D[i][j] (and C[i][j])."""
  return i // 2, ((16 * i) % 32) + j


# ============================================ numbers ============================================

FORMATS = {"f32": (24, -126, 127), "f16": (11, -14, 15), "bf16": (8, -126, 127)}   # precision, emin, emax


def round_nearest_even(x: Fraction, fmt: str) -> float:
  """x rounded once to the format (subnormals and overflow to inf included)."""
  p, emin, emax = FORMATS[fmt]
  if x == 0: return 0.0
  neg, a = x < 0, abs(x)
  e = a.numerator.bit_length() - a.denominator.bit_length()
  if Fraction(2) ** e > a: e -= 1
  ulp = Fraction(2) ** (max(e, emin) - p + 1)
  q, r = divmod(a, ulp)
  q = int(q) + (1 if r > ulp / 2 or (r == ulp / 2 and int(q) & 1) else 0)
  v = q * ulp
  out = math.inf if v > (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax else float(v)
  return -out if neg else out


def exact_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray, fmt: str = "f32") -> np.ndarray:
  """sum_k a[i,k] * b[k,j] + c[i,j] in exact rationals, rounded once (the documented rule); an exact zero is -0 when
  every term is -0 (IEEE 754-2008, 6.3) and +0 otherwise."""
  fa = [[Fraction(float(x)) for x in row] for row in a]
  fb = [[Fraction(float(x)) for x in row] for row in b]
  out = np.zeros((a.shape[0], b.shape[1]))
  for i in range(a.shape[0]):
    for j in range(b.shape[1]):
      out[i, j] = round_nearest_even(sum(fa[i][k] * fb[k][j] for k in range(a.shape[1])) + Fraction(float(c[i, j])), fmt)
      terms = [float(a[i, k]) * float(b[k, j]) for k in range(a.shape[1])] + [float(c[i, j])]
      if out[i, j] == 0 and all(x == 0 and math.copysign(1, x) < 0 for x in terms): out[i, j] = -0.0
  return out


def bf16_bits(x) -> np.ndarray:
  """float32 values truncated to bfloat16 (the bits of exactly representable bf16 values)."""
  return (np.asarray(x, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def half_values(bits: np.ndarray, t: str) -> np.ndarray:
  """uint16 bits of f16 / bf16 as float64."""
  if t == "f16": return bits.view(np.float16).astype(np.float64)
  return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def random_halves(rng, shape, t: str) -> np.ndarray:
  """uint16 bits of random f16 / bf16 matrices."""
  x = rng.standard_normal(shape).astype(np.float32) * np.float32(4)
  return x.astype(np.float16).view(np.uint16) if t == "f16" else bf16_bits(x)


def half_bits(values, t: str) -> np.ndarray:
  v = np.asarray(values, np.float32)
  return v.astype(np.float16).view(np.uint16) if t == "f16" else bf16_bits(v)


def adversarial(m: int, n: int, t: str):
  """(A, B, C) bits/values where float64 accumulation in any order misrounds or loses a term, the exact sum does not:
  row 0: 2**30 + 2**-40 - 2**30 (the tiny product survives only an exact sum; 2**-40 = 2**-20 * 2**-20);
  row 1: C = 2**30, products 2**6 (half an ulp of 2**30 in float32) and 2**-40: exactly above the tie, so float32
  rounds up to 2**30 + 2**7, where a float64 sum (2**30 + 2**6, the 2**-40 lost) ties to even and rounds down;
  row 2: every product -0 and C = -0 (the sum is -0); row 3: x - x + C with C a float32 subnormal."""
  a, b = np.zeros((m, 16), np.float32), np.zeros((16, n), np.float32)
  c = np.zeros((m, n), np.float32)
  a[0, 0], a[0, 1], a[0, 2] = 2.0 ** 15, 2.0 ** -20, -(2.0 ** 15)
  b[0, :], b[1, :], b[2, :] = 2.0 ** 15, 2.0 ** -20, 2.0 ** 15
  a[1, 3], a[1, 4] = 2.0 ** 3, 2.0 ** -20
  b[3, :], b[4, :] = 2.0 ** 3, 2.0 ** -20
  c[1, :] = 2.0 ** 30
  a[2, :] = -0.0
  b[:, :] = np.where(b == 0, np.float32(1.5), b)
  c[2, :] = -0.0
  a[3, 5], a[3, 6] = 3.0, -3.0
  b[5, :], b[6, :] = 7.0, 7.0
  c[3, :] = np.float32(1e-44)
  return half_bits(a, t), half_bits(b, t), c


def test_matrix_sum_is_the_exact_sum_rounded_once():
  """The accumulation both emulators share (drivers/emu/rdna3_float.matrix_sum + round_matrix_sum) on sums where
  float64 accumulation fails: bfloat16 products of every magnitude (2**-266 to 2**254) with cancellation, against
  exact rationals rounded once to float32, float16 and bfloat16."""
  from baregrad.drivers.emu.rdna3_float import matrix_sum, round_matrix_sum
  rng = np.random.default_rng(18)
  bits = rng.integers(0, 1 << 16, (2, 200, 16)).astype(np.uint16)
  bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF                     # no inf/NaN
  a, b = half_values(bits[0], "bf16"), half_values(bits[1], "bf16")
  terms = np.concatenate([(a * b).T, rng.standard_normal((1, 200)).astype(np.float32).astype(np.float64)])
  terms[3, ::2] = -terms[4, ::2]                               # cancellation that leaves the small terms
  carrier = matrix_sum(terms)
  for fmt in ("f32", "f16", "bf16"):
    got = round_matrix_sum(carrier, fmt)
    got = half_values(got, "bf16") if fmt == "bf16" else got.astype(np.float64)
    want = [round_nearest_even(sum(Fraction(float(x)) for x in terms[:, j]), fmt) for j in range(terms.shape[1])]
    np.testing.assert_array_equal(got, np.array(want), err_msg=fmt)


# ============================================ PTX: mma.sync ============================================

PTX = """.version 8.0
.target {target}
.address_size 64
.visible .entry mma_k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
  .reg .pred %p<2>;
  .reg .b16 %h<4>;
  .reg .b32 %r<16>;
  .reg .f32 %f<16>;
  .reg .b64 %rd<16>;
  mov.u32 %r10, %ctaid.x;
  mov.u32 %r11, %ntid.x;
  mov.u32 %r12, %tid.x;
  mad.lo.s32 %r13, %r10, %r11, %r12;
  mov.u32 %r14, %laneid;
  setp.lt.u32 %p1, %r14, 16;
  ld.param.u64 %rd1, [pa];
  ld.param.u64 %rd2, [pb];
  ld.param.u64 %rd3, [pc];
  ld.param.u64 %rd4, [pd];
  mul.wide.u32 %rd5, %r13, 16;
  mul.wide.u32 %rd6, %r13, 8;
  add.s64 %rd7, %rd1, %rd5;
  add.s64 %rd8, %rd2, %rd6;
  add.s64 %rd9, %rd3, %rd5;
  add.s64 %rd10, %rd4, %rd5;
  ld.global.v4.b32 {{%r0, %r1, %r2, %r3}}, [%rd7];
  ld.global.b16 %h0, [%rd8];
  ld.global.b16 %h1, [%rd8+2];
  ld.global.b16 %h2, [%rd8+4];
  ld.global.b16 %h3, [%rd8+6];
  mov.b32 %r4, {{%h0, %h1}};
  mov.b32 %r5, {{%h2, %h3}};
  ld.global.v4.f32 {{%f0, %f1, %f2, %f3}}, [%rd9];
  {guard}mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%f4, %f5, %f6, %f7}}, {{%r0, %r1, %r2, %r3}}, {{%r4, %r5}}, {{%f0, %f1, %f2, %f3}};
  st.global.v4.f32 [%rd10], {{%f4, %f5, %f6, %f7}};
  ret;
}}
"""


def ptx_source(t: str, guard: str = "", target: str = "sm_80", mma: bool = True) -> str:
  src = PTX.format(t=t, guard=guard, target=target)
  if not mma: src = "\n".join(l for l in src.splitlines() if "mma.sync" not in l)
  return src


def ptx_fragments(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray):
  """Per-lane registers of one warp, placed by the document's formulas: (32, 4) uint32 A, (32, 4) uint16 B (b0..b3,
  packed into two registers by mov.b32 in the kernel), (32, 4) float32 C."""
  fa, fb, fc = np.zeros((32, 8), np.uint16), np.zeros((32, 4), np.uint16), np.zeros((32, 4), np.float32)
  for lane in range(32):
    for i in range(8): fa[lane, i] = a_bits[ptx_a_element(lane, i)]
    for i in range(4): fb[lane, i] = b_bits[ptx_b_element(lane, i)]
    for i in range(4): fc[lane, i] = c[ptx_c_element(lane, i)]
  regs_a = fa[:, 0::2].astype(np.uint32) | (fa[:, 1::2].astype(np.uint32) << np.uint32(16))   # a0 low, a1 high, ...
  return regs_a, fb, fc


def run_ptx(src: str, warps: list, grid: int, block: int, counters: KernelCounters | None = None) -> np.ndarray:
  """Launch with each warp's (A bits, B bits, C); returns D per warp (warps, 16, 8) float32."""
  frags = [ptx_fragments(*w) for w in warps]
  regs_a = np.concatenate([f[0] for f in frags])
  halves_b = np.concatenate([f[1] for f in frags])
  acc_c = np.concatenate([f[2] for f in frags])
  threads = grid * block
  pad = threads - len(regs_a)
  if pad > 0:
    regs_a, halves_b, acc_c = (np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
                               for x in (regs_a, halves_b, acc_c))
  mem = Memory()
  ptrs = []
  for arr in (regs_a, halves_b, acc_c, np.zeros((threads, 4), np.float32)):
    p = mem.alloc(arr.nbytes)
    mem.array(p, np.uint8, arr.nbytes)[:] = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    ptrs.append(p)
  launch(parse_ptx(src), "mma_k", grid, block, ptrs, mem, counters=counters)
  d = mem.array(ptrs[3], np.float32, threads * 4).reshape(threads, 4)
  out = np.zeros((len(warps), 16, 8), np.float32)
  for w in range(len(warps)):
    for lane in range(32):
      for i in range(4): out[(w,) + ptx_c_element(lane, i)] = d[32 * w + lane, i]
  return out


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_ptx_mma_m16n8k16(t):
  """Four warps in two blocks, each its own matrices: three random (numpy float64 reference, exact there), one built
  against float64 accumulation (exact rationals)."""
  rng = np.random.default_rng(7 if t == "f16" else 8)
  warps = [(random_halves(rng, (16, 16), t), random_halves(rng, (16, 8), t),
            rng.standard_normal((16, 8)).astype(np.float32) * np.float32(8)) for _ in range(3)]
  warps.append(adversarial(16, 8, t))
  d = run_ptx(ptx_source(t), warps, grid=2, block=64)
  for w, (a_bits, b_bits, c) in enumerate(warps):
    a, b = half_values(a_bits, t), half_values(b_bits, t)
    exact = exact_reference(a, b, c)
    np.testing.assert_array_equal(d[w].view(np.uint32), exact.astype(np.float32).view(np.uint32), err_msg=f"warp {w}")
    if w < 3:       # random matrices: float64 holds every partial sum
      np.testing.assert_array_equal(d[w], (a @ b + c.astype(np.float64)).astype(np.float32), err_msg=f"warp {w}")
  adv = d[3]
  assert (adv[0] == np.float32(2.0 ** -40)).all() and (adv[1] == np.float32(2.0 ** 30 + 2.0 ** 7)).all()
  assert (adv[2] == 0).all() and np.signbit(adv[2]).all()


def test_ptx_mma_refuses_a_partial_warp():
  rng = np.random.default_rng(3)
  warp = (random_halves(rng, (16, 16), "f16"), random_halves(rng, (16, 8), "f16"), np.zeros((16, 8), np.float32))
  with pytest.raises(PtxWarpError, match=r"16 of 32 threads .*guard"):
    run_ptx(ptx_source("f16", guard="@%p1 "), [warp], grid=1, block=32)
  with pytest.raises(PtxWarpError, match="not a multiple of 32"):     # the second warp of a 48-thread block
    run_ptx(ptx_source("f16"), [warp, warp], grid=1, block=48)


def test_ptx_mma_counts_as_alu():
  rng = np.random.default_rng(4)
  warp = (random_halves(rng, (16, 16), "f16"), random_halves(rng, (16, 8), "f16"), np.zeros((16, 8), np.float32))
  with_mma, without = KernelCounters(), KernelCounters()
  run_ptx(ptx_source("f16"), [warp] * 2, grid=1, block=64, counters=with_mma)
  run_ptx(ptx_source("f16", mma=False), [warp] * 2, grid=1, block=64, counters=without)
  diff = [x - y for x, y in zip(with_mma.instrs, without.instrs)]
  assert diff[ALU] == 64 and sum(diff) == 64


def test_ptx_mma_other_shapes_are_refused_before_running():
  src = ptx_source("f16").replace("m16n8k16.row.col.f32.f16.f16.f32", "m16n8k8.row.col.f32.f16.f16.f32")
  with pytest.raises(PtxUnsupported, match="m16n8k16"):
    ptxmod.compile_entry(parse_ptx(src), "mma_k")


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_ptx_mma_text_is_accepted_by_ptxas(t, tmp_path):
  """The PTX the tests run is real PTX: ptxas assembles it for sm_80 and sm_90 (skipped where ptxas is missing)."""
  from baregrad.drivers.nv.cubin import find_ptxas, PtxasNotFound
  try: ptxas = find_ptxas()
  except PtxasNotFound as e: pytest.skip(str(e))
  for target in ("sm_80", "sm_90"):
    path = tmp_path / f"k_{target}.ptx"
    path.write_text(ptx_source(t, guard="@%p1 ", target=target))
    proc = subprocess.run([ptxas, f"-arch={target}", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ============================================ RDNA3: v_wmma ============================================

WMMA = """
  s_load_b128 s[4:7], s[0:1], 0x0
  v_mul_u32_u24 v40, v0, 96
  v_lshlrev_b32 v41, 5, v0
  s_waitcnt lgkmcnt(0)
  global_load_b128 v[0:3], v40, s[4:5]
  global_load_b128 v[4:7], v40, s[4:5] offset:16
  global_load_b128 v[8:11], v40, s[4:5] offset:32
  global_load_b128 v[12:15], v40, s[4:5] offset:48
  global_load_b128 v[16:19], v40, s[4:5] offset:64
  global_load_b128 v[20:23], v40, s[4:5] offset:80
  global_load_b128 v[24:27], v41, s[6:7]
  global_load_b128 v[28:31], v41, s[6:7] offset:16
  s_waitcnt vmcnt(0)
  {pre}
  {wmma}
  global_store_b128 v41, v[24:27], s[6:7]
  global_store_b128 v41, v[28:31], s[6:7] offset:16
  s_endpgm
"""


def wmma_registers(a_bits: np.ndarray, b_bits: np.ndarray, c, out16: bool = False, hi: bool = False):
  """(32, 24) uint32 per lane: A in v0-v7, B in v8-v15, C in v16-v23, placed by the calculator's layout. c: float32
  (16x16) for the f32 forms, uint16 bits for 16-bit C (in the half OPSEL[2] picks)."""
  regs = np.zeros((32, 24), np.uint32)
  for i in range(16):
    for k in range(16):
      v, half, lanes = wmma_a_location(i, k)
      regs[lanes, v] |= np.uint32(a_bits[i, k]) << np.uint32(16 * half)
      v, half, lanes = wmma_b_location(k, i)
      regs[lanes, 8 + v] |= np.uint32(b_bits[k, i]) << np.uint32(16 * half)
  for i in range(16):
    for j in range(16):
      v, lane = wmma_d_location(i, j)
      regs[lane, 16 + v] = np.uint32(c[i, j]) << np.uint32(16 * hi) if out16 else np.float32(c[i, j]).view(np.uint32)
  return regs


def run_wmma(instruction: str, waves: list, pre: str = "", old_d: np.ndarray | None = None,
             counters: KernelCounters | None = None) -> np.ndarray:
  """One workgroup of 32 * len(waves) threads, wave w on waves[w] = (32, 24) registers; returns (waves, 32, 8) uint32:
  v24-v31 after the instruction (loaded from old_d first)."""
  regs = np.concatenate(waves)
  out = np.zeros((len(regs), 8), np.uint32) if old_d is None else np.ascontiguousarray(np.concatenate(old_d))
  bufs = Buffers(np.ascontiguousarray(regs), out)
  co = code_object(WMMA.format(pre=pre, wmma=instruction), vgprs=48, workgroup_ids=0, workitem_dims=1)
  dispatch(co, (1, 1, 1), (len(regs), 1, 1), bufs.kernarg, bufs.mem, counters=counters)
  return bufs.arrays[1].reshape(len(waves), 32, 8)


def wmma_d(out: np.ndarray, bits16: bool = False, hi: bool = False) -> np.ndarray:
  """D (16x16) from one wave's v24-v31: float32 values (bit-exact), or uint16 bits of the selected half."""
  d = np.zeros((16, 16), np.uint32)
  for i in range(16):
    for j in range(16):
      v, lane = wmma_d_location(i, j)
      d[i, j] = out[lane, v]
  return ((d >> np.uint32(16 * hi)) & np.uint32(0xFFFF)).astype(np.uint16) if bits16 else d.view(np.float32)


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_wmma_f32_16x16x16(t):
  """Three waves: two random (numpy float64 reference), one built against float64 accumulation (exact rationals)."""
  rng = np.random.default_rng(11 if t == "f16" else 12)
  mats = [(random_halves(rng, (16, 16), t), random_halves(rng, (16, 16), t),
           rng.standard_normal((16, 16)).astype(np.float32) * np.float32(8)) for _ in range(2)]
  mats.append(adversarial(16, 16, t))
  out = run_wmma(f"v_wmma_f32_16x16x16_{t} v[24:31], v[0:7], v[8:15], v[16:23]", [wmma_registers(*m) for m in mats])
  for w, (a_bits, b_bits, c) in enumerate(mats):
    a, b = half_values(a_bits, t), half_values(b_bits, t)
    d = wmma_d(out[w])
    np.testing.assert_array_equal(d.view(np.uint32), exact_reference(a, b, c).astype(np.float32).view(np.uint32),
                                  err_msg=f"wave {w}")
    if w < 2: np.testing.assert_array_equal(d, (a @ b + c.astype(np.float64)).astype(np.float32), err_msg=f"wave {w}")
  adv = wmma_d(out[2])
  assert (adv[0] == np.float32(2.0 ** -40)).all() and (adv[1] == np.float32(2.0 ** 30 + 2.0 ** 7)).all()
  assert (adv[2] == 0).all() and np.signbit(adv[2]).all()


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_wmma_negate_modifiers(t):
  """NEG[0]/NEG_HI[0] negate the low/high halves of the A registers (even/odd K), NEG[1]/NEG_HI[1] those of B,
  NEG[2] negates C, NEG_HI[2] takes |C| (AMD Matrix Instruction Calculator, "NEG")."""
  rng = np.random.default_rng(13)
  a_bits, b_bits = random_halves(rng, (16, 16), t), random_halves(rng, (16, 16), t)
  c = rng.standard_normal((16, 16)).astype(np.float32)
  regs = wmma_registers(a_bits, b_bits, c)
  for neg_lo, neg_hi in (((1, 0, 0), (0, 0, 0)), ((0, 1, 1), (1, 0, 0)), ((1, 1, 0), (0, 1, 1)), ((0, 0, 1), (0, 0, 1))):
    inst = (f"v_wmma_f32_16x16x16_{t} v[24:31], v[0:7], v[8:15], v[16:23] "
            f"neg_lo:[{','.join(map(str, neg_lo))}] neg_hi:[{','.join(map(str, neg_hi))}]")
    a, b, cc = half_values(a_bits, t), half_values(b_bits, t), c.astype(np.float64)
    k_sign = lambda lo, hi: np.where(np.arange(16) % 2 == 0, -1.0 if lo else 1.0, -1.0 if hi else 1.0)
    a = a * k_sign(neg_lo[0], neg_hi[0])[None, :]           # A[i][k]: K is the column
    b = b * k_sign(neg_lo[1], neg_hi[1])[:, None]           # B[k][j]: K is the row
    if neg_hi[2]: cc = np.abs(cc)
    if neg_lo[2]: cc = -cc
    d = wmma_d(run_wmma(inst, [regs])[0])
    np.testing.assert_array_equal(d, (a @ b + cc).astype(np.float32), err_msg=inst)


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_wmma_16bit_result_in_the_selected_half(t):
  """v_wmma_{f16,bf16}_16x16x16_*: C read from and D written to the half OPSEL[2] picks, the other half kept; D is
  the exact sum rounded once to the 16-bit type."""
  rng = np.random.default_rng(14)
  a_bits, b_bits = random_halves(rng, (16, 16), t), random_halves(rng, (16, 16), t)
  for hi in (False, True):
    c_bits = random_halves(rng, (16, 16), t)
    old = rng.integers(0, 1 << 32, (1, 32, 8), dtype=np.uint64).astype(np.uint32)
    regs = wmma_registers(a_bits, b_bits, c_bits, out16=True, hi=hi)
    op_sel = " op_sel:[0,0,1]" if hi else ""
    out = run_wmma(f"v_wmma_{t}_16x16x16_{t} v[24:31], v[0:7], v[8:15], v[16:23]{op_sel}", [regs], old_d=old)[0]
    want = exact_reference(half_values(a_bits, t), half_values(b_bits, t), half_values(c_bits, t), t)
    np.testing.assert_array_equal(wmma_d(out, bits16=True, hi=hi), half_bits(want, t), err_msg=f"op_sel[2]={int(hi)}")
    keep = np.uint32(0xFFFF0000) if not hi else np.uint32(0x0000FFFF)
    np.testing.assert_array_equal(out & keep, old[0] & keep)


@pytest.mark.parametrize("kind, bits", [("iu8", 8), ("iu4", 4)])
def test_wmma_integer_forms(kind, bits):
  """v_wmma_i32_16x16x16_iu8 / _iu4 (calculator: A[i][k] GPR floor(k / (32/bits)), bits [bits*(k % (32/bits)) +
  bits-1 : bits*(k % (32/bits))], lanes i and i+16; B likewise): NEG[0] / NEG[1] read A / B as signed, clamp
  saturates the int32 sum; against numpy int64."""
  rng = np.random.default_rng(17)
  per = 32 // bits
  a_raw, b_raw = rng.integers(0, 1 << bits, (16, 16)), rng.integers(0, 1 << bits, (16, 16))
  c = rng.integers(-2**31, 2**31, (16, 16))
  c[0, :] = 2**31 - 1                                   # row 0 overflows int32 with positive products: clamp matters
  regs = np.zeros((32, 24), np.uint32)
  for i in range(16):
    for k in range(16):
      regs[[i, i + 16], k // per] |= np.uint32(a_raw[i, k] << (bits * (k % per)))
      regs[[i, i + 16], 8 + k // per] |= np.uint32(b_raw[k, i] << (bits * (k % per)))
      v, lane = wmma_d_location(i, k)
      regs[lane, 16 + v] = np.uint32(c[i, k] & 0xFFFFFFFF)
  signed = lambda x: np.where(x >= 1 << (bits - 1), x - (1 << bits), x)
  n = 16 // per
  for neg, clamp in (((0, 0), ""), ((1, 0), ""), ((0, 1), " clamp"), ((1, 1), " clamp")):
    inst = (f"v_wmma_i32_16x16x16_{kind} v[24:31], v[0:{n - 1}], v[8:{8 + n - 1}], v[16:23] "
            f"neg_lo:[{neg[0]},{neg[1]},0]{clamp}")
    a = signed(a_raw) if neg[0] else a_raw
    b = signed(b_raw) if neg[1] else b_raw
    want = a @ b + c
    want = np.clip(want, -2**31, 2**31 - 1) if clamp else (want + 2**31) % 2**32 - 2**31
    d = wmma_d(run_wmma(inst, [regs])[0]).view(np.int32)
    np.testing.assert_array_equal(d, want.astype(np.int32), err_msg=inst)


def test_wmma_refuses_partial_exec_and_unreplicated_lanes():
  rng = np.random.default_rng(15)
  regs = wmma_registers(random_halves(rng, (16, 16), "f16"), random_halves(rng, (16, 16), "f16"), np.zeros((16, 16)))
  inst = "v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]"
  with pytest.raises(EmulatorError, match="EXEC is 0x0000ffff"):
    run_wmma(inst, [regs], pre="s_mov_b32 exec_lo, 0xffff")
  bad = regs.copy()
  bad[20, 9] ^= 1          # lane 20's copy of a B register differs from lane 4's
  with pytest.raises(EmulatorError, match="lane 20 of v9"):
    run_wmma(inst, [bad])


def test_wmma_counts_as_alu():
  rng = np.random.default_rng(16)
  regs = wmma_registers(random_halves(rng, (16, 16), "f16"), random_halves(rng, (16, 16), "f16"), np.zeros((16, 16)))
  with_wmma, without = KernelCounters(), KernelCounters()
  run_wmma("v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]", [regs, regs], counters=with_wmma)
  run_wmma("", [regs, regs], counters=without)
  diff = [x - y for x, y in zip(with_wmma.instrs, without.instrs)]
  assert diff[ALU] == 64 and sum(diff) == 64


def test_wmma_encodings_match_llvm_mc():
  """Our assembler's encodings of the forms used above agree with llvm-mc-19 (skipped where it is missing)."""
  mc = shutil.which("llvm-mc-19")
  if mc is None: pytest.skip("llvm-mc-19 not found (apt-get install llvm-19)")
  from baregrad.compiler.amd.asm import assemble
  lines = ["v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]",
           "v_wmma_f32_16x16x16_bf16 v[24:31], v[0:7], v[8:15], v[16:23]",
           "v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23] neg_lo:[0,1,1] neg_hi:[1,0,0]",
           "v_wmma_f32_16x16x16_bf16 v[24:31], v[0:7], v[8:15], v[16:23] neg_lo:[1,1,0] neg_hi:[0,1,1]",
           "v_wmma_f16_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23] op_sel:[0,0,1]",
           "v_wmma_bf16_16x16x16_bf16 v[24:31], v[0:7], v[8:15], v[16:23]",
           "v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], 1.0",
           "v_wmma_i32_16x16x16_iu8 v[24:31], v[0:3], v[8:11], v[16:23] neg_lo:[1,0,0] clamp",
           "v_wmma_i32_16x16x16_iu4 v[24:31], v[0:1], v[8:9], v[16:23] neg_lo:[0,1,0]"]
  proc = subprocess.run([mc, "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx1100", "-show-encoding"], input="\n".join(lines),
                        capture_output=True, text=True)
  assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr
  theirs = [bytes(int(x, 16) for x in line.split("encoding: [")[1].rstrip("]").split(","))
            for line in proc.stdout.splitlines() if "encoding:" in line]
  assert len(theirs) == len(lines)
  for line, want in zip(lines, theirs): assert assemble(line) == want, line
