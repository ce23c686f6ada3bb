"""Execution counters of the emulated GPUs (drivers/emu/counters.py).

Hand-written kernels whose counts are known by construction: each expected number below is read off the kernel's
listing (the comment beside each instruction names its class), times the threads (NV) or active / live lanes (AMD)
that execute it; bytes are threads x access width. The kernels' outputs are checked too, so a kernel that did not
run cannot pass. The end-to-end tests realize a Tensor add on `EMU=1 DEV=NV` / `EMU=1 DEV=AMD` in a child process
(with DEBUG=1) and bound the global bytes by the numpy sizes of the operands.
"""
from __future__ import annotations

import json, os, re, subprocess, sys, threading

import numpy as np
import pytest

from baregrad.drivers.emu import ptx as ptxmod
from baregrad.drivers.emu.counters import CLASSES, CounterLog, KernelCounters
from baregrad.drivers.emu.memory import Memory
from baregrad.drivers.emu.ptx import launch, parse_ptx
from baregrad.drivers.emu.rdna3 import dispatch
from emu_helpers import Buffers, code_object

HEADER = ".version 8.0\n.target sm_90\n.address_size 64\n"


def classes(kc: KernelCounters) -> dict:
  return {c: n for c, n in kc.by_class().items() if n}


def nbytes(kc: KernelCounters) -> tuple:
  return kc.global_load_bytes, kc.global_store_bytes, kc.shared_load_bytes, kc.shared_store_bytes


# ============================================ the counters themselves ============================================
def test_add_total_and_reset():
  a = KernelCounters("a", [1, 2, 3, 4, 5, 6], 10, 20, 30, 40, 8, 96)
  b = KernelCounters("b", [6, 5, 4, 3, 2, 1], 1, 2, 3, 4, 1, 32)
  log = CounterLog("NV", echo=False)
  log.record(a); log.record(b)
  assert log.last().name == "b" and log.last().instrs == [6, 5, 4, 3, 2, 1]
  t = log.total()
  assert t.kernels == 2 and t.thread_instrs == 42 and nbytes(t) == (11, 22, 33, 44) and t.instrs == [7] * 6
  assert t.as_dict() == {"name": "total", "kernels": 2, "thread_instrs": 42, **{c: 7 for c in CLASSES},
                         "global_load_bytes": 11, "global_store_bytes": 22, "shared_load_bytes": 33,
                         "shared_store_bytes": 44, "global_system_bytes": 9, "global_load_unique_bytes": 128}
  t.add(a)                      # a copy: the log's total is unchanged
  assert log.total().thread_instrs == 42
  log.reset()
  assert log.last() is None and log.total().thread_instrs == 0 and log.total().kernels == 0


def test_records_from_many_threads():
  log = CounterLog("AMD", echo=False)
  one = KernelCounters("k", [1, 0, 0, 0, 0, 0], 4, 0, 0, 0)
  def work():
    for _ in range(2000): log.record(one)
  threads = [threading.Thread(target=work) for _ in range(4)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert log.total().kernels == 8000 and log.total().instrs[0] == 8000 and log.total().global_load_bytes == 32000


def test_summary_line():
  kc = KernelCounters("r_256_16", [700, 200, 50, 40, 10, 0], 4_000_000, 1_000_000, 0, 0)
  assert kc.summary("NV") == ("emu NV  r_256_16  thread-instrs 1,000 (alu 70% global 20% shared 5% branch 4% "
                              "barrier 1%)  global 4.0 MB ld / 1.0 MB st  shared 0 B")


# ============================================ NV: the PTX interpreter ============================================
ADD_ONE = HEADER + """
.visible .entry k(.param .u64 src, .param .u64 dst)
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<6>;
  .reg .f32 %f<2>;
  ld.param.u64 %rd0, [src];         // other
  ld.param.u64 %rd1, [dst];         // other
  mov.u32 %r0, %tid.x;              // alu
  mov.u32 %r1, %ctaid.x;            // alu
  mov.u32 %r2, %ntid.x;             // alu
  mad.lo.s32 %r3, %r1, %r2, %r0;    // alu
  mul.wide.u32 %rd2, %r3, 4;        // alu
  add.s64 %rd3, %rd0, %rd2;         // alu
  add.s64 %rd4, %rd1, %rd2;         // alu
  ld.global.f32 %f0, [%rd3];        // global, 4 bytes
  add.f32 %f1, %f0, 0f3F800000;     // alu
  st.global.f32 [%rd4], %f1;        // global, 4 bytes
  ret;                              // branch
}
"""


@pytest.mark.parametrize("batch", [1 << 16, 64])
def test_ptx_load_add_store(monkeypatch, batch):
  monkeypatch.setattr(ptxmod, "BATCH_THREADS", batch)     # 64: one block per batch, the counts add up over batches
  n = 3 * 64
  mem = Memory()
  src, dst = mem.alloc(4 * n), mem.alloc(4 * n)
  x = np.arange(n, dtype=np.float32)
  mem.array(src, np.float32, n)[:] = x
  kc = launch(parse_ptx(ADD_ONE), "k", 3, 64, [src, dst], mem)
  np.testing.assert_array_equal(mem.array(dst, np.float32, n), x + 1)
  assert kc.name == "k" and classes(kc) == {"alu": 8 * n, "global": 2 * n, "branch": n, "other": 2 * n}
  assert kc.thread_instrs == 13 * n and nbytes(kc) == (4 * n, 4 * n, 0, 0)


GUARDED = HEADER + """
.visible .entry k(.param .u64 out)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd0, [out];          // other
  mov.u32 %r0, %tid.x;               // alu
  mov.u32 %r1, %ctaid.x;             // alu
  mad.lo.s32 %r2, %r1, 64, %r0;      // alu
  mul.wide.u32 %rd1, %r2, 4;         // alu
  add.s64 %rd0, %rd0, %rd1;          // alu
  setp.lt.u32 %p0, %r0, 16;          // alu
  @%p0 st.global.u32 [%rd0], %r2;    // global: the 16 threads of each block with tid < 16
  @!%p0 add.u32 %r2, %r2, 1;         // alu: the other 48
  ret;                               // branch
}
"""


def test_ptx_guard_counts_the_threads_it_lets_through():
  n = 2 * 64
  mem = Memory()
  out = mem.alloc(4 * n)
  mem.array(out, np.uint32, n)[:] = 0xFFFFFFFF
  kc = launch(parse_ptx(GUARDED), "k", 2, 64, [out], mem)
  i = np.arange(n)
  np.testing.assert_array_equal(mem.array(out, np.uint32, n), np.where(i % 64 < 16, i, 0xFFFFFFFF))
  assert classes(kc) == {"alu": 6 * n + 2 * 48, "global": 2 * 16, "branch": n, "other": n}
  assert nbytes(kc) == (0, 4 * 2 * 16, 0, 0)


VEC4 = HEADER + """
.visible .entry k(.param .u64 src, .param .u64 dst)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd0, [src];                     // other
  ld.param.u64 %rd1, [dst];                     // other
  mov.u32 %r0, %tid.x;                          // alu
  mul.wide.u32 %rd2, %r0, 16;                   // alu
  add.s64 %rd3, %rd0, %rd2;                     // alu
  add.s64 %rd4, %rd1, %rd2;                     // alu
  ld.v4.u32 {%r1, %r2, %r3, %r4}, [%rd3];       // global (a generic address in global memory), 16 bytes
  st.global.v4.u32 [%rd4], {%r4, %r3, %r2, %r1};  // global, 16 bytes
  ret;                                          // branch
}
"""


def test_ptx_v4_load_store():
  n = 96
  mem = Memory()
  src, dst = mem.alloc(16 * n), mem.alloc(16 * n)
  x = np.arange(4 * n, dtype=np.uint32)
  mem.array(src, np.uint32, 4 * n)[:] = x
  kc = launch(parse_ptx(VEC4), "k", 1, n, [src, dst], mem)
  np.testing.assert_array_equal(mem.array(dst, np.uint32, 4 * n).reshape(n, 4), x.reshape(n, 4)[:, ::-1])
  assert classes(kc) == {"alu": 4 * n, "global": 2 * n, "branch": n, "other": 2 * n}
  assert nbytes(kc) == (16 * n, 16 * n, 0, 0)


LOOP = HEADER + """
.visible .entry k(.param .u64 out)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<2>;
  mov.u32 %r0, %tid.x;               // alu
  and.b32 %r1, %r0, 3;               // alu
  add.u32 %r1, %r1, 1;               // alu: K = tid % 4 + 1 iterations
  mov.u32 %r2, 0;                    // alu
LOOP:
  add.u32 %r2, %r2, 1;               // alu, K times
  setp.lt.u32 %p0, %r2, %r1;         // alu, K times
  @%p0 bra LOOP;                     // branch, taken K - 1 times
  ld.param.u64 %rd0, [out];          // other
  mul.wide.u32 %rd1, %r0, 4;         // alu
  add.s64 %rd0, %rd0, %rd1;          // alu
  st.global.u32 [%rd0], %r2;         // global
  ret;                               // branch
}
"""


def test_ptx_divergent_loop():
  n = 64
  mem = Memory()
  out = mem.alloc(4 * n)
  kc = launch(parse_ptx(LOOP), "k", 1, n, [out], mem)
  k = np.arange(n) % 4 + 1
  np.testing.assert_array_equal(mem.array(out, np.uint32, n), k)
  assert classes(kc) == {"alu": 6 * n + 2 * int(k.sum()), "branch": n + int((k - 1).sum()), "other": n, "global": n}
  assert nbytes(kc) == (0, 4 * n, 0, 0)


SHARED = HEADER + """
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b32 tile[64];
  mov.u32 %r0, %tid.x;               // alu
  mov.u32 %r1, tile;                 // alu
  shl.b32 %r2, %r0, 2;               // alu
  add.s32 %r3, %r1, %r2;             // alu
  st.shared.u32 [%r3], %r0;          // shared, 4 bytes stored
  bar.sync 0;                        // barrier
  mov.u32 %r4, 252;                  // alu
  sub.s32 %r4, %r4, %r2;             // alu
  add.s32 %r4, %r1, %r4;             // alu
  ld.shared.u32 %r5, [%r4];          // shared, 4 bytes loaded: tile[63 - tid]
  add.u32 %r5, %r5, 1000;            // alu
  bar.sync 0;                        // barrier
  mov.u64 %rd0, tile;                // alu
  cvta.shared.u64 %rd1, %rd0;        // alu
  cvt.u64.u32 %rd2, %r2;             // alu
  add.s64 %rd1, %rd1, %rd2;          // alu
  st.u32 [%rd1], %r5;                // shared (a generic address in the shared window), 4 bytes stored
  ld.param.u64 %rd3, [out];          // other
  mov.u32 %r6, %ctaid.x;             // alu
  mad.lo.s32 %r6, %r6, 64, %r0;      // alu
  mul.wide.u32 %rd4, %r6, 4;         // alu
  add.s64 %rd3, %rd3, %rd4;          // alu
  st.global.u32 [%rd3], %r5;         // global
  ret;                               // branch
}
"""


def test_ptx_shared_memory_and_barrier():
  n = 2 * 64
  mem = Memory()
  out = mem.alloc(4 * n)
  kc = launch(parse_ptx(SHARED), "k", 2, 64, [out], mem)
  np.testing.assert_array_equal(mem.array(out, np.uint32, n), 63 - np.arange(n) % 64 + 1000)
  assert classes(kc) == {"alu": 16 * n, "shared": 3 * n, "barrier": 2 * n, "global": n, "branch": n, "other": n}
  assert nbytes(kc) == (0, 4 * n, 4 * n, 8 * n)


# ============================================ AMD: the RDNA3 emulator ============================================
def run_counted(src: str, grid, block, *arrays, **kw):
  """Assemble and run; (counters, arrays)."""
  run_kw = {k: kw.pop(k) for k in ("max_batch_waves",) if k in kw}
  bufs = Buffers(*arrays)
  kc = KernelCounters("k")
  dispatch(code_object(src, **kw), grid, block, bufs.kernarg, bufs.mem, counters=kc, **run_kw)
  return kc, bufs.arrays


def add_one_source(block: int) -> str:
  return f"""
  s_load_b128 s[4:7], s[0:1], 0x0        // global (scalar: the wave's live lanes), 16 bytes per wave
  v_mad_u32_u24 v1, s2, {block}, v0       // alu
  v_lshlrev_b32 v1, 2, v1                // alu
  s_waitcnt lgkmcnt(0)                   // other
  global_load_b32 v2, v1, s[4:5]         // global, 4 bytes per lane
  s_waitcnt vmcnt(0)                     // other
  v_add_f32 v2, 1.0, v2                  // alu
  global_store_b32 v1, v2, s[6:7]        // global, 4 bytes per lane
  s_endpgm                               // branch
"""


@pytest.mark.parametrize("groups,block,batch", [(3, 64, 8192), (2, 48, 8192), (3, 64, 2)])
def test_rdna3_load_add_store(groups, block, batch):
  """48 threads: a wave of 32 lanes and one of 16 (its scalar instructions count 16); batch 2: one group a batch."""
  n, waves = groups * block, groups * -(-block // 32)
  x = np.arange(n, dtype=np.float32)
  kc, (_, y) = run_counted(add_one_source(block), (groups, 1, 1), (block, 1, 1), x, np.zeros(n, np.float32),
                           vgprs=8, workgroup_ids=1, workitem_dims=1, max_batch_waves=batch)
  np.testing.assert_array_equal(y, x + 1)
  assert classes(kc) == {"alu": 3 * n, "global": 3 * n, "branch": n, "other": 2 * n}
  assert nbytes(kc) == (4 * n + 16 * waves, 4 * n, 0, 0)


PARTIAL_EXEC = """
  s_load_b64 s[4:5], s[0:1], 0x0         // global (scalar), 8 bytes per wave
  v_mad_u32_u24 v1, s2, 64, v0           // alu
  v_lshlrev_b32 v1, 2, v1                // alu
  v_mov_b32 v2, 7                        // alu
  v_cmp_gt_u32 vcc_lo, 12, v0            // alu
  s_and_saveexec_b32 s8, vcc_lo          // branch (exec mask): first wave of a group keeps 12 lanes, second none
  s_waitcnt lgkmcnt(0)                   // other
  global_store_b32 v1, v2, s[4:5]        // global: 12 lanes a group
  v_add_nc_u32 v2, 1, v2                 // alu: 12 lanes a group
  s_mov_b32 exec_lo, s8                  // branch (exec mask)
  v_mov_b32 v3, 0                        // alu
  s_endpgm                               // branch
"""


def test_rdna3_partial_exec_counts_active_lanes():
  groups = 2
  n, waves, active = groups * 64, groups * 2, groups * 12
  kc, (out,) = run_counted(PARTIAL_EXEC, (groups, 1, 1), (64, 1, 1), np.zeros(n, np.uint32), vgprs=8,
                           workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(out, np.where(np.arange(n) % 64 < 12, 7, 0))
  assert classes(kc) == {"alu": 5 * n + active, "global": n + active, "branch": 3 * n, "other": n}
  assert nbytes(kc) == (8 * waves, 4 * active, 0, 0)


B128 = """
  s_load_b128 s[4:7], s[0:1], 0x0        // global (scalar), 16 bytes per wave
  v_mad_u32_u24 v1, s2, 32, v0           // alu
  v_lshlrev_b32 v1, 4, v1                // alu
  s_waitcnt lgkmcnt(0)                   // other
  global_load_b128 v[2:5], v1, s[4:5]    // global, 16 bytes per lane
  s_waitcnt vmcnt(0)                     // other
  global_store_b128 v1, v[2:5], s[6:7]   // global, 16 bytes per lane
  s_endpgm                               // branch
"""


def test_rdna3_b128():
  groups = 2
  n, waves = groups * 32, groups
  x = np.arange(4 * n, dtype=np.uint32)
  kc, (_, y) = run_counted(B128, (groups, 1, 1), (32, 1, 1), x, np.zeros(4 * n, np.uint32), vgprs=8,
                           workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(y, x)
  assert classes(kc) == {"alu": 2 * n, "global": 3 * n, "branch": n, "other": 2 * n}
  assert nbytes(kc) == (16 * n + 16 * waves, 16 * n, 0, 0)


LDS = """
  s_load_b64 s[4:5], s[0:1], 0x0         // global (scalar), 8 bytes per wave
  v_lshlrev_b32 v1, 2, v0                // alu
  ds_store_b32 v1, v0                    // shared, 4 bytes stored per lane
  s_waitcnt lgkmcnt(0)                   // other
  s_barrier                              // barrier
  v_sub_nc_u32 v2, 0xfc, v1              // alu
  ds_load_b32 v3, v2                     // shared, 4 bytes loaded: lds[63 - id]
  ds_load_2addr_b32 v[4:5], v1 offset1:1 // shared, 8 bytes loaded
  v_mad_u32_u24 v6, s2, 64, v0           // alu
  v_lshlrev_b32 v6, 2, v6                // alu
  s_waitcnt lgkmcnt(0)                   // other
  global_store_b32 v6, v3, s[4:5]        // global, 4 bytes per lane
  s_endpgm                               // branch
"""


def test_rdna3_lds_and_barrier():
  groups = 2
  n, waves = groups * 64, groups * 2
  kc, (out,) = run_counted(LDS, (groups, 1, 1), (64, 1, 1), np.zeros(n, np.uint32), vgprs=8, lds=512,
                           workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(out, 63 - np.arange(n) % 64)
  assert classes(kc) == {"alu": 4 * n, "global": 2 * n, "shared": 3 * n, "barrier": n, "branch": n, "other": 2 * n}
  assert nbytes(kc) == (8 * waves, 4 * n, 12 * n, 4 * n)


LOOP_AMD = """
  s_load_b64 s[4:5], s[0:1], 0x0         // global (scalar), 8 bytes per wave
  v_mov_b32 v2, 0                        // alu
  s_mov_b32 s8, 5                        // alu: 5 iterations
loop:
  v_add_f32 v2, 1.0, v2                  // alu, 5 times
  s_sub_u32 s8, s8, 1                    // alu, 5 times
  s_cmp_lg_u32 s8, 0                     // alu, 5 times
  s_cbranch_scc1 loop                    // branch, 5 times (taken or not)
  v_lshlrev_b32 v1, 2, v0                // alu
  s_waitcnt lgkmcnt(0)                   // other
  global_store_b32 v1, v2, s[4:5]        // global
  s_endpgm                               // branch
"""


def test_rdna3_scalar_loop():
  n = 64
  kc, (out,) = run_counted(LOOP_AMD, (1, 1, 1), (n, 1, 1), np.zeros(n, np.float32), vgprs=8, workgroup_ids=1,
                           workitem_dims=1)
  np.testing.assert_array_equal(out, 5.0)
  assert classes(kc) == {"alu": 3 * n + 15 * n, "global": 2 * n, "branch": 6 * n, "other": n}
  assert nbytes(kc) == (8 * 2, 4 * n, 0, 0)


# ============================================ end to end ============================================
CHILD = r"""
import json, numpy as np
from baregrad.tensor import Tensor
from baregrad.hcq.device import Device
from baregrad.drivers.emu import counters
rng = np.random.default_rng(0)
a, b = rng.random(4096, dtype=np.float32), rng.random(4096, dtype=np.float32)
x, y = Tensor(a).realize(), Tensor(b).realize()
dev = Device.get(x.device)
dev.synchronize()
counters.reset()
z = (x + y).realize()
dev.synchronize()
total, last = counters.total(), counters.last()
assert np.array_equal(z.numpy(), a + b)
print("RESULT", json.dumps({"device": dev.name, "total": total.as_dict(), "last": last.as_dict()}))
"""


@pytest.mark.parametrize("kind", ["NV", "AMD"])
def test_tensor_add_end_to_end(kind):
  env = dict(os.environ, EMU="1", DEV=kind, DEBUG="1")
  r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  got = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
  assert got["device"] == kind
  total, last = got["total"], got["last"]
  size = 4 * 4096
  assert total["kernels"] >= 1 and total["thread_instrs"] >= 3 * 4096      # at least a load, load and store each
  assert 2 * size <= total["global_load_bytes"] <= 4 * 2 * size
  assert size <= total["global_store_bytes"] <= 4 * size
  assert total["global"] >= 3 * 4096 and total["alu"] >= 4096 and total["shared"] == 0
  # DEBUG=1: one line per kernel run, the last one is the add's
  lines = [line for line in r.stdout.splitlines() if line.startswith(f"emu {kind}")]
  m = re.match(rf"emu {kind}\s+(\S+)\s+thread-instrs ([\d,]+) \((.*)\)\s+global (.*) ld / (.*) st\s+shared 0 B$", lines[-1])
  assert m, lines[-1]
  assert int(m.group(2).replace(",", "")) == last["thread_instrs"] and m.group(1) == last["name"]
  assert m.group(3).startswith("alu ")
