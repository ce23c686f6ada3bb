"""The RDNA3 emulator against numpy: hand-written kernels assembled with compiler/amd/asm.py,
wrapped with the code-object writer, run by drivers/emu/rdna3.dispatch."""
import struct

import numpy as np
import pytest

from baregrad.drivers.emu.memory import HostMemory, Memory, MemoryFault
from baregrad.drivers.emu.rdna3 import IllegalInstruction, InstructionBudgetExceeded, dispatch
from baregrad.drivers.emu.rdna3_state import EmulatorError
from emu_helpers import code_object, matmul_loop_source, run

rng = np.random.default_rng(0)


def f32_bits(x): return np.asarray(x, np.float32).view(np.uint32)
def bits_f32(x): return np.asarray(x, np.uint32).view(np.float32)


# ---- whole kernels ----

VADD = """
  s_load_b128 s[4:7], s[0:1], 0x0
  s_load_b64 s[8:9], s[0:1], 0x10
  s_load_b32 s10, s[0:1], 0x18
  v_lshl_add_u32 v1, s2, 8, v0            // global id = workgroup * 256 + local id
  s_waitcnt lgkmcnt(0)
  v_cmp_gt_u32 vcc_lo, s10, v1
  s_and_saveexec_b32 s11, vcc_lo
  s_cbranch_execz done
  v_lshlrev_b32 v1, 2, v1
  global_load_b32 v2, v1, s[4:5]
  global_load_b32 v3, v1, s[6:7]
  s_waitcnt vmcnt(0)
  v_add_f32 v2, v2, v3
  global_store_b32 v1, v2, s[8:9]
done:
  s_endpgm
"""


def test_vector_add_1m():
  n = 1_000_000 + 17                       # a partial last workgroup
  a, b = rng.random(n, np.float32), rng.random(n, np.float32)
  c = np.full(n + 64, -1, np.float32)      # the guard tail must stay untouched
  run(VADD, (-(-n // 256), 1, 1), (256, 1, 1), a, b, c, scalars=[n], vgprs=8, workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(c[:n], a + b)
  assert (c[n:] == -1).all()


def test_vector_add_small_batches():
  # the same kernel with the dispatch split into many batches of workgroups
  n = 5000
  a, b, c = rng.random(n, np.float32), rng.random(n, np.float32), np.zeros(n, np.float32)
  run(VADD, (-(-n // 256), 1, 1), (256, 1, 1), a, b, c, scalars=[n], vgprs=8, workgroup_ids=1, workitem_dims=1,
      max_batch_waves=8)
  np.testing.assert_array_equal(c, a + b)


def test_scalar_loop_divergent_trip_counts():
  # each workgroup sums 1..(wg+1) in a scalar loop: waves of one batch take different branches
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    s_add_u32 s6, s2, 1              // trip count
    s_mov_b32 s7, 0                  // sum
    s_mov_b32 s8, 1                  // i
  loop:
    s_add_u32 s7, s7, s8
    s_add_u32 s8, s8, 1
    s_cmp_le_u32 s8, s6
    s_cbranch_scc1 loop
    s_waitcnt lgkmcnt(0)
    v_mov_b32 v1, s7
    v_mov_b32 v2, s2
    v_lshlrev_b32 v2, 2, v2
    v_cmp_eq_u32 vcc_lo, 0, v0
    s_and_saveexec_b32 s9, vcc_lo
    global_store_b32 v2, v1, s[4:5]
    s_endpgm
  """
  groups = 40
  out = np.zeros(groups, np.uint32)
  run(src, (groups, 1, 1), (64, 1, 1), out, vgprs=8, workgroup_ids=1, workitem_dims=1)
  k = np.arange(groups) + 1
  np.testing.assert_array_equal(out, k * (k + 1) // 2)


def test_exec_masked_divergence():
  # if (x % 3 == 0) y = 2x; else if (x % 3 == 1) y = x + 100; else y = -x   (nested exec masks)
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_lshl_add_u32 v1, s2, 7, v0
    v_mul_hi_u32 v2, v1, 0xaaaaaaab     // x / 3 via multiply-high
    v_lshrrev_b32 v2, 1, v2
    v_mul_lo_u32 v2, v2, 3
    v_sub_nc_u32 v2, v1, v2             // x % 3
    v_mov_b32 v3, 0
    v_cmp_eq_u32 vcc_lo, 0, v2
    s_and_saveexec_b32 s6, vcc_lo
    s_cbranch_execz not0
    v_lshlrev_b32 v3, 1, v1
  not0:
    s_andn2_b32 exec_lo, s6, exec_lo
    s_cbranch_execz join
    v_cmp_eq_u32 vcc_lo, 1, v2
    s_and_saveexec_b32 s7, vcc_lo
    v_add_nc_u32 v3, 0x64, v1
    s_xor_b32 exec_lo, s7, exec_lo
    v_sub_nc_u32 v3, 0, v1
    s_or_b32 exec_lo, exec_lo, s7
  join:
    s_or_b32 exec_lo, exec_lo, s6
    s_waitcnt lgkmcnt(0)
    v_lshlrev_b32 v1, 2, v1
    global_store_b32 v1, v3, s[4:5]
    s_endpgm
  """.replace("s_andn2_b32 exec_lo, s6, exec_lo", "s_and_not1_b32 exec_lo, s6, exec_lo")
  n = 128 * 8
  out = np.zeros(n, np.uint32)
  run(src, (8, 1, 1), (128, 1, 1), out, vgprs=8, workgroup_ids=1, workitem_dims=1)
  x = np.arange(n, dtype=np.uint32)
  expect = np.where(x % 3 == 0, 2 * x, np.where(x % 3 == 1, x + 100, (-x.astype(np.int64)).astype(np.uint32)))
  np.testing.assert_array_equal(out, expect)


LDS_REDUCE = """
  s_load_b128 s[4:7], s[0:1], 0x0        // in, out
  v_lshl_add_u32 v1, s2, 8, v0
  v_lshlrev_b32 v1, 2, v1
  s_waitcnt lgkmcnt(0)
  global_load_b32 v2, v1, s[4:5]
  v_lshlrev_b32 v3, 2, v0                // LDS address = 4 * local id
  s_waitcnt vmcnt(0)
  ds_store_b32 v3, v2
  s_mov_b32 s8, 128                      // stride
loop:
  s_waitcnt lgkmcnt(0)
  s_barrier
  s_mov_b32 s9, exec_lo
  v_cmpx_gt_u32 s8, v0                   // lanes with id < stride
  s_cbranch_execz skip                   // whole waves skip: the waves diverge
  s_lshl_b32 s10, s8, 2
  v_add_nc_u32 v4, s10, v3
  ds_load_b32 v5, v4
  ds_load_b32 v6, v3
  s_waitcnt lgkmcnt(0)
  v_add_f32 v5, v5, v6
  ds_store_b32 v3, v5
skip:
  s_mov_b32 exec_lo, s9
  s_lshr_b32 s8, s8, 1
  s_cmp_lg_u32 s8, 0
  s_cbranch_scc1 loop
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_cmpx_eq_u32 0, v0
  s_cbranch_execz end
  v_mov_b32 v7, 0
  ds_load_b32 v8, v7
  v_mov_b32 v9, s2
  v_lshlrev_b32 v9, 2, v9
  s_waitcnt lgkmcnt(0)
  global_store_b32 v9, v8, s[6:7]
end:
  s_endpgm
"""


def test_lds_barrier_reduction():
  groups = 12
  x = rng.integers(-1000, 1000, groups * 256).astype(np.float32)   # exact sums
  out = np.zeros(groups, np.float32)
  run(LDS_REDUCE, (groups, 1, 1), (256, 1, 1), x, out, vgprs=16, lds=1024, workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(out, x.reshape(groups, 256).sum(axis=1))


def test_lds_reduction_dynamic_lds_and_batches():
  groups = 5
  x = rng.integers(-50, 50, groups * 256).astype(np.float32)
  out = np.zeros(groups, np.float32)
  run(LDS_REDUCE, (groups, 1, 1), (256, 1, 1), x, out, vgprs=16, lds=0, workgroup_ids=1, workitem_dims=1,
      lds_size=1024, max_batch_waves=16)
  np.testing.assert_array_equal(out, x.reshape(groups, 256).sum(axis=1))


def test_workitem_and_workgroup_ids_3d():
  # out[flat] = packed (wg x, wg y, wg z, local x, local y, local z)
  src = """
    s_load_b64 s[6:7], s[0:1], 0x0
    v_and_b32 v1, 0x3ff, v0
    v_bfe_u32 v2, v0, 10, 10
    v_bfe_u32 v3, v0, 20, 10
    s_mul_i32 s8, s4, 3                 // linear workgroup = (z * 3 + y) * 2 + x   (grid 2x3x2)
    s_add_u32 s8, s8, s3
    s_lshl_b32 s8, s8, 1
    s_add_u32 s8, s8, s2
    s_mul_i32 s8, s8, 24                // block 4x3x2 = 24 threads
    v_mad_u32_u24 v4, v3, 3, v2
    v_mad_u32_u24 v4, v4, 4, v1
    v_add_nc_u32 v4, s8, v4
    v_lshlrev_b32 v4, 2, v4
    s_lshl_b32 s9, s4, 20
    s_lshl_b32 s10, s3, 16
    s_or_b32 s9, s9, s10
    s_lshl_b32 s10, s2, 12
    s_or_b32 s9, s9, s10
    v_lshlrev_b32 v5, 8, v3
    v_lshl_or_b32 v5, v2, 4, v5
    v_or3_b32 v5, v5, v1, s9
    s_waitcnt lgkmcnt(0)
    global_store_b32 v4, v5, s[6:7]
    s_endpgm
  """
  out = np.zeros(2 * 3 * 2 * 24, np.uint32)
  run(src, (2, 3, 2), (4, 3, 2), out, vgprs=8)
  expect = []
  for gz in range(2):
    for gy in range(3):
      for gx in range(2):
        for lz in range(2):
          for ly in range(3):
            for lx in range(4):
              expect.append(gz << 20 | gy << 16 | gx << 12 | lz << 8 | ly << 4 | lx)
  np.testing.assert_array_equal(out, expect)


def test_64bit_address_arithmetic():
  # pointer = base + index * 8 with 32-bit halves and carries, across a 4 GiB boundary; `off` form
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0       // in (spans 0x1_0000_0000)
    s_load_b64 s[6:7], s[0:1], 0x8       // out
    s_waitcnt lgkmcnt(0)
    v_lshlrev_b32 v1, 3, v0
    v_add_co_u32 v2, vcc_lo, s4, v1
    v_add_co_ci_u32_e64 v3, s9, s5, 0, vcc_lo
    global_load_b64 v[4:5], v[2:3], off
    v_mad_u64_u32 v[6:7], s8, v0, 8, s[6:7]
    s_waitcnt vmcnt(0)
    v_lshlrev_b64 v[4:5], 1, v[4:5]
    global_store_b64 v[6:7], v[4:5], off offset:-8
    s_endpgm
  """
  mem = Memory()
  base = 0x1_0000_0000 - 8 * 100
  data = rng.integers(0, 2**62, 256, dtype=np.uint64)
  mem.map_array(base, data)
  out = np.zeros(257, np.uint64)
  mem.map_array(0x7_0000_0000, out)
  ka = mem.alloc(16)
  mem.write(ka, struct.pack("<QQ", base, 0x7_0000_0008))
  dispatch(code_object(src, vgprs=8, workgroup_ids=0, workitem_dims=1), (1, 1, 1), (256, 1, 1), ka, mem)
  np.testing.assert_array_equal(out[:256], data << np.uint64(1))


def test_scalar_64bit_arithmetic():
  # s_add_u32 / s_addc_u32 pointer math, s_lshl_b64, s_load at a computed address
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    s_load_b64 s[6:7], s[0:1], 0x8
    s_waitcnt lgkmcnt(0)
    s_lshl_b32 s8, s2, 3
    s_add_u32 s10, s4, s8
    s_addc_u32 s11, s5, 0
    s_load_b64 s[12:13], s[10:11], 0x0
    s_waitcnt lgkmcnt(0)
    s_lshl_b64 s[12:13], s[12:13], 4
    s_add_u32 s12, s12, 0xffffffff
    s_addc_u32 s13, s13, 0
    v_mov_b32 v1, s12
    v_mov_b32 v2, s13
    v_mov_b32 v3, s8
    global_store_b64 v3, v[1:2], s[6:7]
    s_endpgm
  """
  vals = rng.integers(0, 2**59, 16, dtype=np.uint64)
  out = np.zeros(16, np.uint64)
  run(src, (16, 1, 1), (32, 1, 1), vals, out, vgprs=8, workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(out, (vals << np.uint64(4)) + np.uint64(0xFFFFFFFF))


def test_matmul_loop_small():
  # the loop kernel timed by bench_rdna3_matmul.py, at 64^3
  n = 64
  a = rng.integers(-8, 8, (n, n)).astype(np.float32)
  b = rng.integers(-8, 8, (n, n)).astype(np.float32)
  c = np.zeros((n, n), np.float32)
  run(matmul_loop_source(n), (n // 16, n // 16, 1), (16, 16, 1), a, b, c, vgprs=16, workgroup_ids=2, workitem_dims=2)
  np.testing.assert_array_equal(c, a @ b)


def test_smem_wide_loads_and_sub_dword_global():
  src = """
    s_load_b128 s[4:7], s[0:1], 0x0         // in, out
    s_waitcnt lgkmcnt(0)
    s_load_b512 s[16:31], s[4:5], 0x0
    s_load_b256 s[32:39], s[4:5], 0x40
    s_waitcnt lgkmcnt(0)
    v_mov_b32 v1, s31
    v_add_nc_u32 v1, s39, v1
    v_lshlrev_b32 v2, 1, v0
    global_load_i16 v3, v2, s[4:5]
    global_load_u16 v4, v2, s[4:5]
    global_load_i8 v5, v0, s[4:5]
    global_load_u8 v6, v0, s[4:5]
    v_lshlrev_b32 v7, 4, v0
    s_waitcnt vmcnt(0)
    v_add_nc_u32 v3, v3, v1
    global_store_b128 v7, v[3:6], s[6:7]
    global_store_b8 v0, v6, s[6:7] offset:1024
    global_store_b16 v2, v3, s[6:7] offset:1280
    s_endpgm
  """
  raw = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
  out = np.zeros(512, np.uint32)
  run(src, (1, 1, 1), (32, 1, 1), raw, out, vgprs=8, workgroup_ids=0, workitem_dims=1)
  b = raw.view(np.uint8)
  h = raw.view(np.uint16)
  lane = np.arange(32)
  i16 = h[lane].view(np.int16).astype(np.int64)
  got = out[:128].reshape(32, 4)
  np.testing.assert_array_equal(got[:, 0], ((i16 + int(raw[15]) + int(raw[23])) & 0xFFFFFFFF).astype(np.uint32))
  np.testing.assert_array_equal(got[:, 1], h[lane])
  np.testing.assert_array_equal(got[:, 2], b[lane].view(np.int8).astype(np.int32).view(np.uint32))
  np.testing.assert_array_equal(got[:, 3], b[lane])
  np.testing.assert_array_equal(out.view(np.uint8)[1024:1056], b[lane])
  np.testing.assert_array_equal(out.view(np.uint16)[640:672], (got[:, 0] & 0xFFFF).astype(np.uint16))


def test_global_atomics_with_conflicts():
  src = """
    s_load_b128 s[4:7], s[0:1], 0x0          // counters, returned
    v_lshl_add_u32 v1, s2, 6, v0
    v_and_b32 v2, 3, v1                      // four counters, 16 lanes each per wave
    v_lshlrev_b32 v2, 2, v2
    v_mov_b32 v3, 1
    s_waitcnt lgkmcnt(0)
    global_atomic_add_u32 v4, v2, v3, s[4:5] glc
    global_atomic_max_u32 v2, v1, s[4:5] offset:16
    v_lshlrev_b32 v1, 2, v1
    s_waitcnt vmcnt(0)
    global_store_b32 v1, v4, s[6:7]
    s_endpgm
  """
  counters = np.zeros(8, np.uint32)
  returned = np.zeros(256, np.uint32)
  run(src, (4, 1, 1), (64, 1, 1), counters, returned, vgprs=8, workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(counters[:4], [64, 64, 64, 64])
  gid = np.arange(256)
  np.testing.assert_array_equal(counters[4:], [252, 253, 254, 255])
  for c in range(4):       # each counter handed out 0..63 exactly once
    assert sorted(returned[gid % 4 == c]) == list(range(64))


def test_cross_lane_ops():
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_mul_u32_u24 v1, v0, 7
    v_readfirstlane_b32 s6, v1               // lane 0 -> 0
    v_readlane_b32 s7, v1, 5                 // 35
    v_writelane_b32 v2, s7, 3
    v_mbcnt_lo_u32_b32 v3, -1, 0             // lane id
    v_mbcnt_hi_u32_b32 v3, -1, v3
    v_xor_b32 v4, 1, v0
    v_lshlrev_b32 v4, 2, v4
    ds_bpermute_b32 v5, v4, v1               // v1 of lane ^ 1
    v_lshlrev_b32 v6, 4, v0
    s_waitcnt lgkmcnt(0)
    v_add_nc_u32 v2, s6, v2
    global_store_b128 v6, v[2:5], s[4:5]
    s_endpgm
  """
  out = np.zeros(128, np.uint32)
  run(src, (1, 1, 1), (32, 1, 1), out, vgprs=8, workgroup_ids=0, workitem_dims=1, lds=128)
  got = out.reshape(32, 4)
  lane = np.arange(32)
  assert got[3, 0] == 35 and (np.delete(got[:, 0], 3) == 0).all()     # writelane + readfirstlane (0)
  np.testing.assert_array_equal(got[:, 1], lane)
  np.testing.assert_array_equal(got[:, 3], (lane ^ 1) * 7)


# ---- single VALU instructions against numpy ----
# harness: per thread four input dwords in v0..v3, the instruction writes v4 (and v5), stored

HARNESS = """
  s_load_b128 s[4:7], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshl_add_u32 v10, s2, 6, v0
  v_lshlrev_b32 v11, 4, v10
  v_lshlrev_b32 v12, 3, v10
  global_load_b128 v[0:3], v11, s[4:5]
  v_mov_b32 v4, 0
  v_mov_b32 v5, 0
  s_mov_b32 s8, 0x40400000                 // 3.0 for SGPR operands
  s_waitcnt vmcnt(0)
  {inst}
  global_store_b64 v12, v[4:5], s[6:7]
  s_endpgm
"""

N_LANES = 256


def run_inst(inst: str, a, b=None, c=None, d=None):
  inputs = np.zeros((N_LANES, 4), np.uint32)
  for i, x in enumerate((a, b, c, d)):
    if x is not None: inputs[:, i] = np.asarray(x).view(np.uint32) if np.asarray(x).dtype.itemsize == 4 else x
  out = np.zeros((N_LANES, 2), np.uint32)
  run(HARNESS.format(inst=inst), (N_LANES // 64, 1, 1), (64, 1, 1), inputs, out, vgprs=16, workgroup_ids=1,
      workitem_dims=1)
  return out[:, 0], out[:, 1]


def floats(n=N_LANES, lo=-100, hi=100):
  x = rng.uniform(lo, hi, n).astype(np.float32)
  x[:8] = [0.0, -0.0, 1.0, -1.5, 2.5, 0.5, -2.5, 3.5]
  return x


F = floats()
G = floats()
H = floats()
P = np.abs(F) + np.float32(0.25)
I = rng.integers(-2**31, 2**31, N_LANES).astype(np.int64).astype(np.int32)
J = rng.integers(-2**31, 2**31, N_LANES).astype(np.int64).astype(np.int32)
U, V = I.view(np.uint32), J.view(np.uint32)
SH = rng.integers(0, 64, N_LANES).astype(np.uint32)


def ref32(x): return np.asarray(x).astype(np.float32).view(np.uint32)


F32_CASES = [
  ("v_add_f32 v4, v0, v1", (F, G), lambda: ref32(F + G)),
  ("v_sub_f32 v4, v0, v1", (F, G), lambda: ref32(F - G)),
  ("v_subrev_f32 v4, v0, v1", (F, G), lambda: ref32(G - F)),
  ("v_mul_f32 v4, v0, v1", (F, G), lambda: ref32(F * G)),
  ("v_mul_f32 v4, s8, v1", (F, G), lambda: ref32(3 * G)),
  ("v_mul_f32 v4, 0.5, v1", (F, G), lambda: ref32(G / 2)),
  ("v_add_f32 v4, 0x40490fdb, v1", (F, G), lambda: ref32(G + np.float32(3.14159274))),
  ("v_fma_f32 v4, v0, v1, v2", (F, G, H), lambda: ref32(F.astype(np.float64) * G + H)),
  ("v_fmac_f32 v4, v0, v1", (F, G), lambda: ref32(F.astype(np.float64) * G)),
  ("v_fmamk_f32 v4, v0, 0x40000000, v1", (F, G), lambda: ref32(F.astype(np.float64) * 2 + G)),
  ("v_fmaak_f32 v4, v0, v1, 0x3f800000", (F, G), lambda: ref32(F.astype(np.float64) * G + 1)),
  ("v_min_f32 v4, v0, v1", (F, G), lambda: ref32(np.minimum(F, G))),
  ("v_max_f32 v4, v0, v1", (F, G), lambda: ref32(np.maximum(F, G))),
  ("v_min3_f32 v4, v0, v1, v2", (F, G, H), lambda: ref32(np.minimum(np.minimum(F, G), H))),
  ("v_max3_f32 v4, v0, v1, v2", (F, G, H), lambda: ref32(np.maximum(np.maximum(F, G), H))),
  ("v_med3_f32 v4, v0, v1, v2", (F, G, H), lambda: ref32(np.sort(np.stack([F, G, H]), axis=0)[1])),
  ("v_floor_f32 v4, v0", (F,), lambda: ref32(np.floor(F))),
  ("v_ceil_f32 v4, v0", (F,), lambda: ref32(np.ceil(F))),
  ("v_trunc_f32 v4, v0", (F,), lambda: ref32(np.trunc(F))),
  ("v_rndne_f32 v4, v0", (F,), lambda: ref32(np.round(F))),
  ("v_fract_f32 v4, v0", (F,), lambda: ref32(F - np.floor(F))),
  ("v_ldexp_f32 v4, v0, v1", (F, (SH.astype(np.int32) - 32)), lambda: ref32(F * 2.0 ** (SH.astype(np.float64) - 32))),
  ("v_frexp_mant_f32 v4, v0", (F,), lambda: ref32(np.frexp(F)[0])),
  ("v_frexp_exp_i32_f32 v4, v0", (F,), lambda: np.frexp(F)[1].astype(np.int32).view(np.uint32)),
  ("v_cndmask_b32 v4, v0, v1, vcc_lo", (F, G), None),   # checked separately below
  ("v_add_f32_e64 v4, -v0, |v1|", (F, G), lambda: ref32(-F + np.abs(G))),
  ("v_mul_f32_e64 v4, v0, v1 clamp", (F / 100, G / 100), lambda: ref32(np.clip(F / 100 * (G / 100), 0, 1))),
  ("v_add_f32_e64 v4, v0, v1 mul:2", (F, G), lambda: ref32((F + G) * 2)),
  ("v_add_f32_e64 v4, v0, v1 div:2", (F, G), lambda: ref32((F + G) / 2)),
  ("v_fma_f32 v4, -v0, |v1|, -|v2|", (F, G, H), lambda: ref32(-F.astype(np.float64) * np.abs(G) - np.abs(H))),
]


@pytest.mark.parametrize("inst,args,ref", [c for c in F32_CASES if c[2] is not None], ids=[c[0] for c in F32_CASES if c[2]])
def test_valu_f32(inst, args, ref):
  got, _ = run_inst(inst, *args)
  np.testing.assert_array_equal(got, ref())


TRANSCENDENTAL = [   # "1ULP accuracy" (RDNA3 ISA guide, 16.8): the emulator is off by up to 1 ULP on purpose
  ("v_sqrt_f32 v4, v0", (P,), lambda: np.sqrt(P.astype(np.float64))),
  ("v_rcp_f32 v4, v0", (P,), lambda: 1 / P.astype(np.float64)),
  ("v_exp_f32 v4, v0", (F / 10,), lambda: np.exp2(F / 10)),
  ("v_log_f32 v4, v0", (P,), lambda: np.log2(P)),
  ("v_rsq_f32 v4, v0", (P,), lambda: 1 / np.sqrt(P.astype(np.float64))),
  ("v_sin_f32 v4, v0", (F / 100,), lambda: np.sin(F / 100 * 2 * np.pi)),
  ("v_cos_f32 v4, v0", (F / 100,), lambda: np.cos(F / 100 * 2 * np.pi)),
]


@pytest.mark.parametrize("inst,args,ref", TRANSCENDENTAL, ids=[c[0] for c in TRANSCENDENTAL])
def test_valu_transcendental(inst, args, ref):
  got, _ = run_inst(inst, *args)
  np.testing.assert_allclose(bits_f32(got), ref(), rtol=2e-6, atol=2e-6)


def _u(x): return np.asarray(x).astype(np.int64).astype(np.uint64).astype(np.uint32)


INT_CASES = [
  ("v_add_nc_u32 v4, v0, v1", (U, V), lambda: U + V),
  ("v_sub_nc_u32 v4, v0, v1", (U, V), lambda: U - V),
  ("v_subrev_nc_u32 v4, v0, v1", (U, V), lambda: V - U),
  ("v_add_nc_u32_e64 v4, v0, v1 clamp", (U, V), lambda: np.minimum(U.astype(np.uint64) + V, 2**32 - 1).astype(np.uint32)),
  ("v_mul_lo_u32 v4, v0, v1", (U, V), lambda: U * V),
  ("v_mul_hi_u32 v4, v0, v1", (U, V), lambda: ((U.astype(np.uint64) * V) >> np.uint64(32)).astype(np.uint32)),
  ("v_mul_hi_i32 v4, v0, v1", (U, V), lambda: _u((I.astype(np.int64) * J) >> 32)),
  ("v_mul_u32_u24 v4, v0, v1", (U, V), lambda: _u((U & 0xFFFFFF).astype(np.int64) * (V & 0xFFFFFF))),
  ("v_mul_i32_i24 v4, v0, v1", (U, V), lambda: _u(((I << 8) >> 8).astype(np.int64) * ((J << 8) >> 8))),
  ("v_mad_u32_u24 v4, v0, v1, v2", (U, V, U), lambda: _u((U & 0xFFFFFF).astype(np.int64) * (V & 0xFFFFFF) + U)),
  ("v_min_i32 v4, v0, v1", (U, V), lambda: np.minimum(I, J).view(np.uint32)),
  ("v_max_u32 v4, v0, v1", (U, V), lambda: np.maximum(U, V)),
  ("v_med3_i32 v4, v0, v1, v2", (U, V, U ^ 0x5555), lambda: np.median(np.stack([I, J, (U ^ 0x5555).view(np.int32)]).astype(np.int64), axis=0).astype(np.int64).astype(np.uint32)),
  ("v_and_b32 v4, v0, v1", (U, V), lambda: U & V),
  ("v_or_b32 v4, v0, v1", (U, V), lambda: U | V),
  ("v_xor_b32 v4, v0, v1", (U, V), lambda: U ^ V),
  ("v_xnor_b32 v4, v0, v1", (U, V), lambda: ~(U ^ V)),
  ("v_not_b32 v4, v0", (U,), lambda: ~U),
  ("v_lshlrev_b32 v4, v0, v1", (SH, V), lambda: V << (SH & 31)),
  ("v_lshrrev_b32 v4, v0, v1", (SH, V), lambda: V >> (SH & 31)),
  ("v_ashrrev_i32 v4, v0, v1", (SH, V), lambda: (J >> (SH & 31).astype(np.int32)).view(np.uint32)),
  ("v_lshl_add_u32 v4, v0, 3, v1", (U, V), lambda: (U << 3) + V),
  ("v_add_lshl_u32 v4, v0, v1, 2", (U, V), lambda: (U + V) << 2),
  ("v_add3_u32 v4, v0, v1, v2", (U, V, U), lambda: U + V + U),
  ("v_lshl_or_b32 v4, v0, 5, v1", (U, V), lambda: (U << 5) | V),
  ("v_and_or_b32 v4, v0, v1, v2", (U, V, ~U), lambda: (U & V) | ~U),
  ("v_or3_b32 v4, v0, v1, v2", (U, V, SH), lambda: U | V | SH),
  ("v_xor3_b32 v4, v0, v1, v2", (U, V, SH), lambda: U ^ V ^ SH),
  ("v_xad_u32 v4, v0, v1, v2", (U, V, SH), lambda: (U ^ V) + SH),
  ("v_bfe_u32 v4, v0, v1, v2", (U, SH, SH >> 1), lambda: np.array([(int(u) >> (int(s) & 31)) & ((1 << (int(w) & 31)) - 1)
                                                                   for u, s, w in zip(U, SH, SH >> 1)], np.uint32)),
  ("v_bfe_i32 v4, v0, v1, v2", (U, SH, SH >> 1), lambda: np.array([_sbfe(int(u), int(s) & 31, int(w) & 31)
                                                                   for u, s, w in zip(U, SH, SH >> 1)], np.uint32)),
  ("v_bfi_b32 v4, v0, v1, v2", (U, V, SH), lambda: (U & V) | (~U & SH)),
  ("v_bfm_b32 v4, v0, v1", (SH, SH >> 2), lambda: np.array([((1 << (int(a) & 31)) - 1) << (int(b) & 31) & 0xFFFFFFFF
                                                            for a, b in zip(SH, SH >> 2)], np.uint32)),
  ("v_alignbit_b32 v4, v0, v1, v2", (U, V, SH), lambda: np.array([((int(a) << 32 | int(b)) >> (int(s) & 31)) & 0xFFFFFFFF
                                                                  for a, b, s in zip(U, V, SH)], np.uint32)),
  ("v_alignbyte_b32 v4, v0, v1, v2", (U, V, SH), lambda: np.array([((int(a) << 32 | int(b)) >> (8 * (int(s) & 3))) & 0xFFFFFFFF
                                                                   for a, b, s in zip(U, V, SH)], np.uint32)),
  ("v_perm_b32 v4, v0, v1, v2", (U, V, (U * 7) & 0x0F0F0F0F), None),
  ("v_bcnt_u32_b32 v4, v0, v1", (U, SH), lambda: np.array([bin(int(u)).count("1") + int(s) for u, s in zip(U, SH)], np.uint32)),
  ("v_bfrev_b32 v4, v0", (U,), lambda: np.array([int(f"{int(u):032b}"[::-1], 2) for u in U], np.uint32)),
  ("v_clz_i32_u32 v4, v0", (U >> (SH & 31),), lambda: np.array([32 - int(u).bit_length() if u else 0xFFFFFFFF
                                                                for u in U >> (SH & 31)], np.uint32)),
  ("v_ctz_i32_b32 v4, v0", (U << (SH & 31),), lambda: np.array([(int(u) & -int(u)).bit_length() - 1 if u else 0xFFFFFFFF
                                                                for u in U << (SH & 31)], np.uint32)),
  ("v_cvt_f32_i32 v4, v0", (U,), lambda: ref32(I.astype(np.float32))),
  ("v_cvt_f32_u32 v4, v0", (U,), lambda: ref32(U.astype(np.float32))),
  ("v_cvt_f32_ubyte2 v4, v0", (U,), lambda: ref32(((U >> 16) & 255).astype(np.float32))),
]


def _sbfe(u, s, w):
  if w == 0: return 0
  v = (u >> s) & ((1 << w) - 1)
  if v >> (w - 1): v -= 1 << w
  return v & 0xFFFFFFFF


@pytest.mark.parametrize("inst,args,ref", [c for c in INT_CASES if c[2]], ids=[c[0] for c in INT_CASES if c[2]])
def test_valu_int(inst, args, ref):
  got, _ = run_inst(inst, *args)
  np.testing.assert_array_equal(got, np.asarray(ref()).astype(np.uint32))


def test_v_perm_b32():
  a, b = U, V
  sel = rng.integers(0, 14, (N_LANES, 4)).astype(np.uint32)
  c = sel[:, 0] | sel[:, 1] << 8 | sel[:, 2] << 16 | sel[:, 3] << 24
  got, _ = run_inst("v_perm_b32 v4, v0, v1, v2", a, b, c)
  expect = []
  for x, y, s in zip(a, b, sel):
    src = (int(x) << 32 | int(y)).to_bytes(8, "little")
    out = 0
    for i, k in enumerate(s):
      k = int(k)
      byte = src[k] if k < 8 else (0xFF if src[2 * (k - 8) + 1] & 0x80 else 0) if k < 12 else 0 if k == 12 else 0xFF
      out |= byte << (8 * i)
    expect.append(out)
  np.testing.assert_array_equal(got, np.array(expect, np.uint32))


def test_float_to_int_conversions():
  x = np.concatenate([floats(N_LANES - 8, -3e9, 5e9), np.array([np.nan, np.inf, -np.inf, 2.5, -2.5, 0.5, 1.5, -0.0], np.float32)])
  got, _ = run_inst("v_cvt_i32_f32 v4, v0", x)
  expect = np.where(np.isnan(x), 0, np.clip(np.trunc(x.astype(np.float64)), -2**31, 2**31 - 1)).astype(np.int64)
  np.testing.assert_array_equal(got.view(np.int32), expect)
  got, _ = run_inst("v_cvt_u32_f32 v4, v0", x)
  np.testing.assert_array_equal(got, np.where(np.isnan(x), 0, np.clip(np.trunc(x.astype(np.float64)), 0, 2**32 - 1)).astype(np.uint64))
  y = floats(N_LANES, -1e4, 1e4) / np.float32(7)
  got, _ = run_inst("v_cvt_floor_i32_f32 v4, v0", y)
  np.testing.assert_array_equal(got.view(np.int32), np.floor(y).astype(np.int64))


def test_f16_conversions_and_ops():
  x = floats()
  got, _ = run_inst("v_cvt_f16_f32 v4, v0", x)
  np.testing.assert_array_equal(got, x.astype(np.float16).view(np.uint16))
  h = x.astype(np.float16)
  h2 = G.astype(np.float16)
  packed = h.view(np.uint16).astype(np.uint32) | (h2.view(np.uint16).astype(np.uint32) << 16)
  got, _ = run_inst("v_cvt_f32_f16 v4, v0", packed)
  np.testing.assert_array_equal(bits_f32(got), h.astype(np.float32))
  got, _ = run_inst("v_add_f16 v4, v0, v1", h.view(np.uint16).astype(np.uint32), h2.view(np.uint16).astype(np.uint32))
  np.testing.assert_array_equal(got, (h + h2).view(np.uint16))
  got, _ = run_inst("v_fma_f16 v4, v0, v1, v2 op_sel:[1,0,0,1]", packed, h2.view(np.uint16).astype(np.uint32),
                    h.view(np.uint16).astype(np.uint32))
  expect_hi = (h2.astype(np.float64) * h2 + h).astype(np.float16).view(np.uint16)
  np.testing.assert_array_equal(got >> 16, expect_hi)
  got, _ = run_inst("v_pk_add_f16 v4, v0, v1", packed, packed)
  np.testing.assert_array_equal(got & 0xFFFF, (h + h).view(np.uint16))
  np.testing.assert_array_equal(got >> 16, (h2 + h2).view(np.uint16))
  got, _ = run_inst("v_cvt_pk_rtz_f16_f32 v4, v0, v1", F * 1000, G)
  with np.errstate(over="ignore"): lo = (F * 1000).astype(np.float16)
  lo_bits = np.where(np.abs(lo.astype(np.float32)) > np.abs(F * 1000), lo.view(np.uint16) - 1, lo.view(np.uint16))
  np.testing.assert_array_equal(got & 0xFFFF, lo_bits.astype(np.uint16))
  got, _ = run_inst("v_fma_mix_f32 v4, v0, v1, v2 op_sel_hi:[1,1,0]", packed, packed, H)
  np.testing.assert_array_equal(bits_f32(got), (h.astype(np.float64) * h + H).astype(np.float32))
  got, _ = run_inst("v_dot2_f32_f16 v4, v0, v1, v2", packed, packed, H)
  np.testing.assert_allclose(bits_f32(got), h.astype(np.float32) ** 2 + h2.astype(np.float32) ** 2 + H, rtol=1e-6)


def test_f64_ops_and_conversions():
  a = rng.uniform(-1e3, 1e3, N_LANES)
  b = rng.uniform(-1e3, 1e3, N_LANES)
  pairs = np.stack([a, b], axis=1).reshape(-1).view(np.uint32).reshape(N_LANES, 4)
  lo, hi = run_inst("v_add_f64 v[4:5], v[0:1], v[2:3]", pairs[:, 0], pairs[:, 1], pairs[:, 2], pairs[:, 3])
  np.testing.assert_array_equal((lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)).view(np.float64), a + b)
  lo, hi = run_inst("v_mul_f64 v[4:5], -v[0:1], v[2:3]", pairs[:, 0], pairs[:, 1], pairs[:, 2], pairs[:, 3])
  np.testing.assert_array_equal((lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)).view(np.float64), -a * b)
  lo, _ = run_inst("v_cvt_f32_f64 v4, v[0:1]", pairs[:, 0], pairs[:, 1])
  np.testing.assert_array_equal(bits_f32(lo), a.astype(np.float32))
  lo, hi = run_inst("v_cvt_f64_i32 v[4:5], v0", U)
  np.testing.assert_array_equal((lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)).view(np.float64), I.astype(np.float64))
  lo, _ = run_inst("v_cvt_i32_f64 v4, v[0:1]", pairs[:, 0], pairs[:, 1])
  np.testing.assert_array_equal(lo.view(np.int32), np.trunc(a).astype(np.int32))
  lo, hi = run_inst("v_cvt_f64_f32 v[4:5], v0", F)
  np.testing.assert_array_equal((lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)).view(np.float64), F.astype(np.float64))


def test_compares_write_vcc_and_sgpr():
  # v_cmp results (per lane bits) go to vcc / an SGPR pair; v_cndmask picks per lane
  inst = """v_cmp_lt_f32 vcc_lo, v0, v1
  v_cmp_ge_i32_e64 s9, v2, v3
  v_cndmask_b32 v4, v2, v3, vcc_lo
  v_cndmask_b32_e64 v5, 0, 1, s9"""
  got4, got5 = run_inst(inst, F, G, U, V)
  np.testing.assert_array_equal(got4, np.where(F < G, V, U))
  np.testing.assert_array_equal(got5, (I >= J).astype(np.uint32))
  nan = F.copy()
  nan[::3] = np.nan
  got4, got5 = run_inst("""v_cmp_neq_f32 vcc_lo, v0, v1
  v_cndmask_b32 v4, 0, 1, vcc_lo
  v_cmp_class_f32_e64 s10, v0, 3
  v_cndmask_b32_e64 v5, 0, 1, s10""", nan, G)
  np.testing.assert_array_equal(got4, ~(nan == G) * 1)
  np.testing.assert_array_equal(got5, np.isnan(nan) * 1)


def test_carry_chains_and_mad64():
  inst = """v_add_co_u32 v4, vcc_lo, v0, v1
  v_add_co_ci_u32_e32 v5, vcc_lo, v2, v3, vcc_lo"""
  a = rng.integers(0, 2**64, N_LANES, dtype=np.uint64)
  b = rng.integers(0, 2**64, N_LANES, dtype=np.uint64)
  lo, hi = run_inst(inst, (a & 0xFFFFFFFF).astype(np.uint32), (b & 0xFFFFFFFF).astype(np.uint32),
                    (a >> np.uint64(32)).astype(np.uint32), (b >> np.uint64(32)).astype(np.uint32))
  np.testing.assert_array_equal(lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32), a + b)
  inst = """v_sub_co_u32 v4, vcc_lo, v0, v1
  v_sub_co_ci_u32_e32 v5, vcc_lo, v2, v3, vcc_lo"""
  lo, hi = run_inst(inst, (a & 0xFFFFFFFF).astype(np.uint32), (b & 0xFFFFFFFF).astype(np.uint32),
                    (a >> np.uint64(32)).astype(np.uint32), (b >> np.uint64(32)).astype(np.uint32))
  np.testing.assert_array_equal(lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32), a - b)
  lo, hi = run_inst("v_mad_u64_u32 v[4:5], s9, v0, v1, v[2:3]", U, V, U, V)
  expect = U.astype(np.uint64) * V + (U.astype(np.uint64) | V.astype(np.uint64) << np.uint64(32))
  np.testing.assert_array_equal(lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32), expect)
  lo, hi = run_inst("v_mad_i64_i32 v[4:5], s9, v0, v1, 0", U, V)
  np.testing.assert_array_equal((lo.astype(np.uint64) | hi.astype(np.uint64) << np.uint64(32)).view(np.int64),
                                I.astype(np.int64) * J)


def test_16bit_int_ops():
  a16 = (U & 0xFFFF).astype(np.uint16)
  b16 = (V & 0xFFFF).astype(np.uint16)
  got, _ = run_inst("v_add_nc_u16 v4, v0, v1", U, V)
  np.testing.assert_array_equal(got, (a16 + b16).astype(np.uint32))
  got, _ = run_inst("v_mul_lo_u16 v4, v0, v1", U, V)
  np.testing.assert_array_equal(got, (a16 * b16).astype(np.uint32))
  got, _ = run_inst("v_max_i16 v4, v0, v1", U, V)
  np.testing.assert_array_equal(got, np.maximum(a16.view(np.int16), b16.view(np.int16)).view(np.uint16))
  got, _ = run_inst("v_cvt_i32_i16 v4, v0", U)
  np.testing.assert_array_equal(got.view(np.int32), a16.view(np.int16).astype(np.int32))
  got, _ = run_inst("v_lshrrev_b16 v4, v0, v1", SH, V)
  np.testing.assert_array_equal(got, (b16 >> (SH & 15).astype(np.uint16)).astype(np.uint32))


# ---- scalar ALU against Python ints ----

SALU_HARNESS = """
  s_load_b128 s[4:7], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  s_lshl_b32 s8, s2, 4
  s_add_u32 s4, s4, s8
  s_addc_u32 s5, s5, 0
  s_load_b128 s[20:23], s[4:5], 0x0
  s_waitcnt lgkmcnt(0)
  s_mov_b32 s24, 0
  s_mov_b32 s25, 0
  s_cmp_eq_u32 s20, s20                 // SCC = 1 going in
  {inst}
  s_cselect_b32 s26, 1, 0               // SCC after
  v_mov_b32 v1, s24
  v_mov_b32 v2, s25
  v_mov_b32 v3, s26
  v_mov_b32 v4, s2
  v_lshlrev_b32 v4, 4, v4
  global_store_b96 v4, v[1:3], s[6:7]
  s_endpgm
"""


def run_salu(inst, a, b, c=None, d=None):
  n = len(a)
  inputs = np.zeros((n, 4), np.uint32)
  for i, x in enumerate((a, b, c, d)):
    if x is not None: inputs[:, i] = x
  out = np.zeros((n, 4), np.uint32)
  run(SALU_HARNESS.format(inst=inst), (n, 1, 1), (32, 1, 1), inputs, out, vgprs=8, workgroup_ids=1, workitem_dims=1)
  return out[:, 0], out[:, 1], out[:, 2]


SA = np.array([0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 12345, 0xDEADBEEF, 3, 64, 0x10000], np.uint32)
SB = np.array([0, 0xFFFFFFFF, 1, 0x80000000, 1, 54321, 0x12345678, 40, 7, 0xFFFF], np.uint32)


def _i32(x): return x - (1 << 32) if x >> 31 else x


SALU_CASES = [
  ("s_add_u32 s24, s20, s21", lambda a, b: ((a + b) & 0xFFFFFFFF, (a + b) >> 32)),
  ("s_sub_u32 s24, s20, s21", lambda a, b: ((a - b) & 0xFFFFFFFF, int(b > a))),
  ("s_add_i32 s24, s20, s21", lambda a, b: ((a + b) & 0xFFFFFFFF, int(not -2**31 <= _i32(a) + _i32(b) < 2**31))),
  ("s_addc_u32 s24, s20, s21", lambda a, b: ((a + b + 1) & 0xFFFFFFFF, (a + b + 1) >> 32)),
  ("s_mul_i32 s24, s20, s21", lambda a, b: ((a * b) & 0xFFFFFFFF, 1)),
  ("s_mul_hi_u32 s24, s20, s21", lambda a, b: ((a * b) >> 32, 1)),
  ("s_lshl_b32 s24, s20, s21", lambda a, b: ((a << (b & 31)) & 0xFFFFFFFF, int((a << (b & 31)) & 0xFFFFFFFF != 0))),
  ("s_lshr_b32 s24, s20, s21", lambda a, b: (a >> (b & 31), int(a >> (b & 31) != 0))),
  ("s_ashr_i32 s24, s20, s21", lambda a, b: ((_i32(a) >> (b & 31)) & 0xFFFFFFFF, int(_i32(a) >> (b & 31) != 0))),
  ("s_min_i32 s24, s20, s21", lambda a, b: (a if _i32(a) < _i32(b) else b, int(_i32(a) < _i32(b)))),
  ("s_max_u32 s24, s20, s21", lambda a, b: (max(a, b), int(a > b))),
  ("s_and_b32 s24, s20, s21", lambda a, b: (a & b, int(a & b != 0))),
  ("s_or_b32 s24, s20, s21", lambda a, b: (a | b, int(a | b != 0))),
  ("s_xor_b32 s24, s20, s21", lambda a, b: (a ^ b, int(a ^ b != 0))),
  ("s_and_not1_b32 s24, s20, s21", lambda a, b: (a & ~b & 0xFFFFFFFF, int(a & ~b & 0xFFFFFFFF != 0))),
  ("s_bfe_u32 s24, s20, 0x80004", lambda a, b: ((a >> 4) & 0xFF, int((a >> 4) & 0xFF != 0))),
  ("s_cselect_b32 s24, s20, s21", lambda a, b: (a, 1)),
  ("s_lshl2_add_u32 s24, s20, s21", lambda a, b: (((a << 2) + b) & 0xFFFFFFFF, int(((a << 2) + b) >> 32 != 0))),
  ("s_not_b32 s24, s20", lambda a, b: (~a & 0xFFFFFFFF, int(a != 0xFFFFFFFF))),
  ("s_bcnt1_i32_b32 s24, s20", lambda a, b: (bin(a).count("1"), int(a != 0))),
  ("s_sext_i32_i16 s24, s20", lambda a, b: (_i32(((a & 0xFFFF) ^ 0x8000) - 0x8000 & 0xFFFFFFFF) & 0xFFFFFFFF, 1)),
  ("s_cmp_lt_i32 s20, s21", lambda a, b: (0, int(_i32(a) < _i32(b)))),
  ("s_cmp_ge_u32 s20, s21", lambda a, b: (0, int(a >= b))),
  ("s_cmpk_eq_u32 s20, 0x3", lambda a, b: (0, int(a == 3))),
  ("s_movk_i32 s24, 0x8000", lambda a, b: (0xFFFF8000, 1)),
  ("s_mov_b64 s[24:25], s[20:21]", lambda a, b: (a, 1)),
  ("s_lshl_b64 s[24:25], s[20:21], 4", lambda a, b: (((b << 32 | a) << 4) & 0xFFFFFFFF, int((b << 32 | a) << 4 & (2**64 - 1) != 0))),
]


@pytest.mark.parametrize("inst,ref", SALU_CASES, ids=[c[0] for c in SALU_CASES])
def test_salu(inst, ref):
  lo, hi, scc = run_salu(inst, SA, SB)
  for i, (a, b) in enumerate(zip(SA.tolist(), SB.tolist())):
    value, flag = ref(a, b)
    assert (lo[i], scc[i]) == (value, flag), f"{inst} with {a:#x}, {b:#x}"


def test_salu_64bit_high_halves():
  lo, hi, _ = run_salu("s_lshl_b64 s[24:25], s[20:21], 4", SA, SB)
  for i, (a, b) in enumerate(zip(SA.tolist(), SB.tolist())):
    assert hi[i] == (((b << 32 | a) << 4) >> 32) & 0xFFFFFFFF


# ---- faults ----

def test_memory_fault_names_the_address():
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_lshlrev_b32 v1, 2, v0
    s_waitcnt lgkmcnt(0)
    global_load_b32 v2, v1, s[4:5] offset:64
    s_endpgm
  """
  a = np.zeros(16, np.float32)                     # 64 bytes: lane 0 reads just past it
  with pytest.raises(MemoryFault) as e:
    run(src, (1, 1, 1), (32, 1, 1), a, vgprs=8)
  addr = e.value.address
  assert addr % 0x10000 == 64                      # the first lane's address
  assert f"{addr:#x}" in str(e.value)
  assert "global_load_b32" in "\n".join(getattr(e.value, "__notes__", []))


def test_inactive_lanes_do_not_fault():
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_lshlrev_b32 v1, 2, v0
    s_waitcnt lgkmcnt(0)
    global_load_b32 v2, v1, s[4:5]
    s_waitcnt vmcnt(0)
    v_add_f32 v2, 1.0, v2
    global_store_b32 v1, v2, s[4:5]
    s_endpgm
  """
  a = np.arange(10, dtype=np.float32)              # a block of 10 threads: lanes 10..31 are off
  run(src, (1, 1, 1), (10, 1, 1), a, vgprs=8)
  np.testing.assert_array_equal(a, np.arange(10) + 1)


def test_store_fault_and_lds_fault():
  with pytest.raises(MemoryFault):
    run("""
      v_mov_b32 v1, 0
      v_mov_b32 v2, 0x1234
      global_store_b32 v[1:2], v1, off
      s_endpgm""", (1, 1, 1), (32, 1, 1), np.zeros(4, np.uint32), vgprs=8)
  with pytest.raises(MemoryFault, match="LDS"):
    run("""
      v_lshlrev_b32 v1, 2, v0
      ds_store_b32 v1, v0 offset:64
      s_endpgm""", (1, 1, 1), (32, 1, 1), np.zeros(4, np.uint32), vgprs=8, lds=128)


def test_illegal_instruction_names_pc_and_dword():
  good = code_object("s_nop 0\ns_endpgm", vgprs=8)
  from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
  from baregrad.compiler.amd.asm import assemble
  bad_word = 0xFFFFFFFF
  code = assemble("s_nop 0\ns_nop 0") + bad_word.to_bytes(4, "little") + assemble("s_endpgm")
  co = write_code_object("bad", code, KernelDescriptor.for_kernel(vgprs=8), 0, [])
  mem = Memory()
  dispatch(good, (1, 1, 1), (32, 1, 1), 0, mem)
  with pytest.raises(IllegalInstruction) as e:
    dispatch(co, (1, 1, 1), (32, 1, 1), 0, mem)
  assert e.value.pc == 8 and e.value.dword == bad_word
  assert "0x8" in str(e.value) and "0xffffffff" in str(e.value)


def test_unimplemented_instruction_is_illegal():
  with pytest.raises(IllegalInstruction, match="v_cubeid_f32.*no semantics"):
    run("v_cubeid_f32 v0, v1, v2, v3\ns_endpgm", (1, 1, 1), (32, 1, 1), np.zeros(1), vgprs=8)


def test_vgpr_beyond_descriptor_is_reported():
  with pytest.raises(IllegalInstruction, match="VGPRs the kernel descriptor allocates"):
    run("v_mov_b32 v9, 0\ns_endpgm", (1, 1, 1), (32, 1, 1), np.zeros(1), vgprs=8)


def test_runaway_kernel_exceeds_budget():
  with pytest.raises(InstructionBudgetExceeded, match="budget"):
    run("loop:\n  s_add_u32 s4, s4, 1\n  s_branch loop\n  s_endpgm", (1, 1, 1), (32, 1, 1), np.zeros(1), vgprs=8,
        max_steps=1000)


def test_code_end_reached_is_reported():
  with pytest.raises(IllegalInstruction, match="ran past the end"):
    run("s_nop 0\ns_code_end", (1, 1, 1), (32, 1, 1), np.zeros(1), vgprs=8)


def test_emulator_error_hierarchy():
  assert issubclass(IllegalInstruction, EmulatorError) and issubclass(InstructionBudgetExceeded, EmulatorError)


# ---- memory objects ----

def test_memory_gather_scatter_and_faults():
  mem = Memory()
  a = np.arange(64, dtype=np.uint32)
  mem.map_array(0x1000, a)
  b = mem.map(0x9000, 16)
  got = mem.gather(np.array([0x1000, 0x1004, 0x10FC, 0x9000], np.uint64), 4)
  np.testing.assert_array_equal(got.view(np.uint32)[:, 0], [0, 1, 63, 0])
  mem.scatter(np.array([0x1002, 0x9001], np.uint64), np.array([[0xAA, 0xBB], [0xCC, 0xDD]], np.uint8), 2,
              mask=np.array([True, True]))
  assert a[0] == 0xBBAA0000 and b[1] == 0xCC and b[2] == 0xDD
  with pytest.raises(MemoryFault) as e:
    mem.gather(np.array([0x1000, 0x1100, 0x9000], np.uint64), 4)
  assert e.value.address == 0x1100
  mem.scatter(np.array([0x5000], np.uint64), np.zeros((1, 4), np.uint8), 4, mask=np.array([False]))  # masked: no fault
  with pytest.raises(ValueError, match="overlaps"):
    mem.map(0x1010, 4)
  mem.unmap(0x9000)
  with pytest.raises(MemoryFault):
    mem.read(0x9000, 1)


def test_host_memory_kernel_writes_host_buffer():
  out = np.zeros(64, np.float32)
  args = np.array([out.ctypes.data], np.uint64)
  mem = HostMemory()
  mem.map(out.ctypes.data, out.nbytes)
  mem.map(args.ctypes.data, args.nbytes)
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_cvt_f32_u32 v1, v0
    v_mul_f32 v1, 0.5, v1
    v_lshlrev_b32 v2, 2, v0
    s_waitcnt lgkmcnt(0)
    global_store_b32 v2, v1, s[4:5]
    s_endpgm
  """
  dispatch(code_object(src, vgprs=8), (1, 1, 1), (64, 1, 1), args.ctypes.data, mem)
  np.testing.assert_array_equal(out, np.arange(64) * 0.5)


def test_lds_forms_and_atomics():
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_lshlrev_b32 v1, 3, v0                    // 8 bytes per lane
    v_mul_u32_u24 v2, v0, 3
    v_add_nc_u32 v3, 0x100, v0
    ds_store_2addr_b32 v1, v2, v3 offset1:1    // [8i] = 3i, [8i+4] = 256+i
    v_mov_b32 v4, 0
    v_mov_b32 v5, 1
    v_and_b32 v6, 3, v0
    v_lshlrev_b32 v6, 2, v6
    ds_add_rtn_u32 v7, v6, v5 offset:512       // four counters, 8 lanes each
    s_waitcnt lgkmcnt(0)
    s_barrier
    ds_load_2addr_b32 v[8:9], v1 offset1:1
    ds_load_b64 v[10:11], v1
    ds_load_u8 v12, v1 offset:4
    ds_load_i16 v13, v1 offset:4
    ds_store_b8 v0, v0 offset:1024
    ds_load_b32 v14, v6 offset:512
    v_lshlrev_b32 v15, 5, v0
    s_waitcnt lgkmcnt(0)
    ds_load_u8 v9, v0 offset:1024
    s_waitcnt lgkmcnt(0)
    global_store_b128 v15, v[7:10], s[4:5]
    global_store_b128 v15, v[11:14], s[4:5] offset:16
    s_endpgm
  """
  out = np.zeros((32, 8), np.uint32)
  run(src, (1, 1, 1), (32, 1, 1), out, vgprs=16, lds=2048, workgroup_ids=0, workitem_dims=1)
  i = np.arange(32)
  for c in range(4):
    assert sorted(out[i % 4 == c, 0]) == list(range(8))          # ds_add_rtn: each pre-value once
  np.testing.assert_array_equal(out[:, 1], 3 * i)                  # ds_load_2addr lo
  np.testing.assert_array_equal(out[:, 2], i)                      # ds_load_u8 of the bytes written by ds_store_b8
  np.testing.assert_array_equal(out[:, 3], 3 * i)                  # ds_load_b64 lo
  np.testing.assert_array_equal(out[:, 4], 256 + i)                # ds_load_b64 hi
  np.testing.assert_array_equal(out[:, 5], (256 + i) & 0xFF)
  np.testing.assert_array_equal(out[:, 6], 256 + i)                # i16 of a small positive value
  np.testing.assert_array_equal(out[:, 7], 8)                      # counters after the atomics


def test_scratch_private_memory():
  src = """
    s_load_b64 s[4:5], s[0:1], 0x0
    v_mul_u32_u24 v1, v0, 10
    v_add_nc_u32 v2, 1, v1
    v_mov_b32 v3, 4
    scratch_store_b64 off, v[1:2], off offset:8
    scratch_store_b32 v3, v0, off offset:8     // overwrites the high dword (VGPR offset form)
    scratch_load_b64 v[4:5], off, off offset:8
    v_lshl_add_u32 v6, s2, 5, v0
    v_lshlrev_b32 v6, 3, v6
    s_waitcnt vmcnt(0) lgkmcnt(0)
    global_store_b64 v6, v[4:5], s[4:5]
    s_endpgm
  """
  out = np.zeros((64, 2), np.uint32)
  run(src, (2, 1, 1), (32, 1, 1), out, vgprs=8, private=32, workgroup_ids=1, workitem_dims=1)
  lane = np.arange(64) % 32
  np.testing.assert_array_equal(out[:, 0], 10 * lane)
  np.testing.assert_array_equal(out[:, 1], lane)
