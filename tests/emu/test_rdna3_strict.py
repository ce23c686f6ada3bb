"""What the RDNA3 emulator refuses because a real gfx1100 would do it wrong or not at all (drivers/emu/rdna3.py):
- LDS ordering (rdna3_mem.LDSOrder): the waves of a workgroup run in lockstep here, so a kernel that reads another
  wave's LDS store (or overwrites another wave's read) with no s_barrier between would still compute the right
  values; the emulator raises LDSRace instead (AMDGPUUsage "Memory Model GFX10-GFX11": the LDS operations of
  different wavefronts of a work-group can be reordered relative to each other);
- the VGPR budget (rdna3.check_launch): a workgroup whose waves cannot all hold the kernel's VGPRs on one WGP is
  refused (LaunchError), directly and through the emulated command processor (PM4 DISPATCH_DIRECT).
Values the kernels compute are checked against numpy; the VGPR limits against numbers worked out by hand from LLVM's
AMDGPUBaseInfo.cpp (1536 VGPRs a SIMD, blocks of 24, 4 SIMDs a WGP, 256 addressable)."""
import types

import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.drivers.emu.rdna3 import LaunchError, LDSRace, MissingWait, max_vgprs

from emu_helpers import Buffers, code_object, run
from baregrad.drivers.emu.rdna3 import dispatch

# v0 = local id, s2 = workgroup id; s[4:5] = the output buffer; v1 = 4 * local id (LDS address); v2 = 100 + local id;
# v7 = 4 * global id (output address)
PROLOGUE = """
  s_load_b64 s[4:5], s[0:1], 0x0
  v_lshlrev_b32 v1, 2, v0
  v_add_nc_u32 v2, 100, v0
  v_mad_u32_u24 v7, s2, {threads}, v0
  v_lshlrev_b32 v7, 2, v7
"""
# every lane stores 100 + id at its own dword, then reads the dword of lane (id + 32) % 64: the other wave's
NEIGHBOUR = """
  ds_store_b32 v1, v2
{sync}
  v_xor_b32 v3, 0x80, v1
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
SYNC = "  s_waitcnt lgkmcnt(0)\n  s_barrier"


def run_lds(body: str, groups: int = 1, threads: int = 64, lds: int = 512, **kw) -> np.ndarray:
  out = np.zeros(groups * threads, np.uint32)
  run(PROLOGUE.format(threads=threads) + "  s_waitcnt lgkmcnt(0)\n" + body, (groups, 1, 1), (threads, 1, 1), out,
      vgprs=16, lds=lds, workgroup_ids=1, workitem_dims=1, **kw)
  return out


def swapped(groups: int = 1) -> np.ndarray:
  """numpy: lane i of each workgroup holds 100 + (i ^ 32)."""
  return np.tile(100 + (np.arange(64) ^ 32), groups).astype(np.uint32)


# ---------------------------------------------------------------------------------------------- LDS ordering

def test_reading_another_waves_store_without_a_barrier_is_a_race():
  with pytest.raises(LDSRace) as e:
    run_lds(NEIGHBOUR.format(sync=""))
  msg = str(e.value)
  # the kernel, the pc and text of the load, both waves, the LDS byte (lane 32's dword: 0x80), the fix
  assert "kernel 'k' at pc 0x" in msg and "ds_load_b32 v4, v3" in msg, msg
  assert "wave 0 reads LDS byte 0x80 that wave 1 of the same workgroup stored" in msg, msg
  assert "s_barrier" in msg and "lgkmcnt(0)" in msg and "workgroup (0, 0, 0)" in msg, msg


def test_the_same_exchange_with_waitcnt_and_barrier_runs():
  np.testing.assert_array_equal(run_lds(NEIGHBOUR.format(sync=SYNC), groups=3), swapped(3))
  # several workgroups a batch and one workgroup a batch: the barrier epochs are per batch
  np.testing.assert_array_equal(run_lds(NEIGHBOUR.format(sync=SYNC), groups=5, max_batch_waves=2), swapped(5))


def test_barrier_without_waitcnt_is_still_refused():
  """The barrier alone does not order the store (rdna3_deps: the store may still be in flight)."""
  with pytest.raises(MissingWait, match="lgkmcnt"):
    run_lds(NEIGHBOUR.format(sync="  s_barrier"))


def test_a_wave_reads_its_own_stores_without_a_barrier():
  body = """
  ds_store_b32 v1, v2
  v_xor_b32 v3, 0x40, v1              // lane id ^ 16: a lane of the same wave
  ds_load_b32 v4, v3
  ds_load_b32 v5, v1 offset:0         // its own dword
  s_waitcnt lgkmcnt(0)
  v_add_nc_u32 v4, v4, v5
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  i = np.arange(128)
  np.testing.assert_array_equal(run_lds(body, groups=2), (200 + (i % 64 ^ 16) + i % 64).astype(np.uint32))


def test_sub_dword_bytes_of_different_waves_do_not_conflict():
  """Per byte: wave 0 and wave 1 store the two halves of one dword; each reads back only its own half."""
  body = """
  v_lshrrev_b32 v5, 5, v0             // wave index in the group: 0 or 1
  v_and_b32 v6, 31, v0
  v_lshl_add_u32 v3, v6, 2, v5        // byte 4 * lane + wave
  ds_store_b8 v3, v2
  ds_load_u8 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  np.testing.assert_array_equal(run_lds(body), (100 + np.arange(64)).astype(np.uint32))
  with pytest.raises(LDSRace, match="wave 0 reads LDS byte 0x1 that wave 1"):
    run_lds(body.replace("ds_load_u8 v4, v3", "ds_load_u16 v4, v3"))     # 2 bytes: the other wave's byte too
  with pytest.raises(LDSRace, match="wave 0 reads LDS byte 0x1 that wave 1"):
    run_lds(body.replace("ds_load_u8 v4, v3", "ds_load_b32 v4, v1"))      # a whole dword of mixed writers


def test_wide_accesses_are_checked_on_every_dword():
  """ds_store_b128 / ds_load_b128 (16 bytes a lane, on the int32 views of the tables): lane i reads lane i ^ 32's."""
  body = """
  v_lshlrev_b32 v8, 4, v0
  v_mov_b32 v3, v2
  v_mov_b32 v4, v2
  v_mov_b32 v5, v2
  ds_store_b128 v8, v[2:5]
{sync}
  v_xor_b32 v9, 0x200, v8
  ds_load_b128 v[10:13], v9
  s_waitcnt lgkmcnt(0)
  v_add_nc_u32 v4, v10, v13
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  np.testing.assert_array_equal(run_lds(body.format(sync=SYNC), lds=1024), 2 * (100 + (np.arange(64) ^ 32)))
  with pytest.raises(LDSRace, match=r"wave 0 reads LDS byte 0x200 that wave 1"):    # lane 0 reads lane 32's block
    run_lds(body.format(sync=""), lds=1024)


def test_an_atomic_on_another_waves_store_is_a_race():
  body = """
  v_mov_b32 v3, 0
  v_mov_b32 v5, 1
  v_cmpx_eq_u32 32, v0                // lane 0 of wave 1 stores the counter's start
  ds_store_b32 v3, v5
  s_mov_b32 exec_lo, -1
  s_waitcnt lgkmcnt(0)
{sync}
  ds_add_u32 v3, v5
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  np.testing.assert_array_equal(run_lds(body.format(sync="  s_barrier")), np.full(64, 65, np.uint32))
  with pytest.raises(LDSRace, match="wave 0 updates LDS byte 0x0 that wave 1 of the same workgroup stored"):
    run_lds(body.format(sync=""))


def test_write_after_another_waves_read_is_a_race():
  """Wave 1 overwrites the dwords wave 0 just read: without a barrier wave 0 may read the new values."""
  body = """
  ds_store_b32 v1, v2
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_xor_b32 v3, 0x80, v1
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
{sync}
  ds_store_b32 v1, v0                 // over the dword the other wave read
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  with pytest.raises(LDSRace, match=r"wave 0 writes LDS byte 0x0 that wave 1 of the same workgroup read"):
    run_lds(body.format(sync=""))
  np.testing.assert_array_equal(run_lds(body.format(sync="  s_barrier")), swapped())


def test_atomics_of_several_waves_need_no_barrier_but_a_plain_read_does():
  body = """
  v_mov_b32 v3, 0
  v_mov_b32 v5, 1
  v_cmpx_eq_u32 0, v0                 // lane 0 of wave 0 clears the counter
  ds_store_b32 v3, v3
  s_mov_b32 exec_lo, -1
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_add_u32 v3, v5                   // every lane of both waves: no order needed between atomics
  s_waitcnt lgkmcnt(0)
{sync}
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  np.testing.assert_array_equal(run_lds(body.format(sync="  s_barrier")), np.full(64, 64, np.uint32))
  with pytest.raises(LDSRace, match=r"wave 0 reads LDS byte 0x0 that several waves of the same workgroup updated"):
    run_lds(body.format(sync=""))


def test_diverged_waves_meet_at_the_barrier():
  """The two waves store and wait at the barrier on different paths (different pcs, so not in lockstep: wave 0
  parks at its s_barrier until wave 1 reaches its own), then read each other's stores."""
  body = """
  v_lshrrev_b32 v5, 5, v0
  v_readfirstlane_b32 s6, v5
  s_cmp_eq_u32 s6, 1
  s_cbranch_scc1 other                // wave 1
  ds_store_b32 v1, v2                 // wave 0 stores 100 + id
{sync}
  s_branch join
other:
  v_add_nc_u32 v2, 3, v2
  ds_store_b32 v1, v2                 // wave 1 stores 103 + id
{sync}
join:
  v_xor_b32 v3, 0x80, v1
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  i = np.arange(64)
  expect = (100 + (i ^ 32) + np.where(i < 32, 3, 0)).astype(np.uint32)
  np.testing.assert_array_equal(run_lds(body.format(sync=SYNC), groups=3), np.tile(expect, 3))
  with pytest.raises(LDSRace, match="wave 0 reads LDS byte 0x80 that wave 1"):
    run_lds(body.format(sync=""))


def test_one_wave_workgroups_are_not_tracked():
  """A workgroup of one wave orders its LDS operations by itself: any exchange among its lanes is legal."""
  body = """
  ds_store_b32 v1, v2
  v_xor_b32 v3, 0x40, v1
  ds_load_b32 v4, v3
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v4, s[4:5]
  s_endpgm
"""
  np.testing.assert_array_equal(run_lds(body, groups=4, threads=32),
                                np.tile(100 + (np.arange(32) ^ 16), 4).astype(np.uint32))


# ---------------------------------------------------------------------------------------------- the VGPR budget

def test_vgpr_limit_by_workgroup_size():
  """min(256, alignDown(1536 / ceil(ceil(threads / 32) / 4), 24)), worked out by hand (CU mode: 2 SIMDs)."""
  for threads, limit in ((1, 256), (64, 256), (640, 256), (641, 240), (768, 240), (769, 216), (896, 216),
                         (897, 192), (1024, 192)):
    assert max_vgprs(threads) == limit, threads
  assert max_vgprs(320, wgp_mode=False) == 256 and max_vgprs(384, wgp_mode=False) == 240
  assert max_vgprs(1024, wgp_mode=False) == 96


def wide_kernel(top: int, threads: int = 1024) -> str:
  """Every thread writes 7 + its local id (at its global id) through v<top>, the highest VGPR the descriptor allows."""
  return PROLOGUE.format(threads=threads) + f"""
  v_add_nc_u32 v{top}, 7, v0
  s_waitcnt lgkmcnt(0)
  global_store_b32 v7, v{top}, s[4:5]
  s_endpgm
"""


def test_too_many_vgprs_for_1024_threads_is_refused():
  out = np.zeros(1024, np.uint32)
  with pytest.raises(LaunchError) as e:
    run(wide_kernel(199), (1, 1, 1), (1024, 1, 1), out, vgprs=200, workgroup_ids=1, workitem_dims=1, name="wide")
  msg = str(e.value)
  assert "kernel 'wide' uses 200 VGPRs" in msg and "1024 threads" in msg and "at most 192" in msg, msg
  assert "at most 896 threads a workgroup" in msg, msg     # 200 -> 216 (blocks of 24): 7 waves a SIMD, 28 waves
  assert not out.any()                                    # refused before anything ran


def test_the_largest_allowed_vgpr_count_runs():
  out = run(wide_kernel(191), (2, 1, 1), (1024, 1, 1), np.zeros(2048, np.uint32), vgprs=192, workgroup_ids=1,
            workitem_dims=1)[0]
  np.testing.assert_array_equal(out, np.tile(7 + np.arange(1024), 2).astype(np.uint32))
  # and 200 VGPRs fit 896 threads
  out = run(wide_kernel(199, 896), (1, 1, 1), (896, 1, 1), np.zeros(896, np.uint32), vgprs=200, workgroup_ids=1,
            workitem_dims=1)[0]
  np.testing.assert_array_equal(out, (7 + np.arange(896)).astype(np.uint32))


def test_cu_mode_halves_the_simds():
  from baregrad.compiler.amd.asm import assemble
  from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
  kd = KernelDescriptor.for_kernel(vgprs=104, kernarg_size=8, workgroup_ids=1, workitem_dims=1, wgp_mode=0)
  co = write_code_object("cu", assemble(wide_kernel(103, 512)), kd, 8, [])
  bufs = Buffers(np.zeros(1024, np.uint32))
  with pytest.raises(LaunchError, match=r"uses 104 VGPRs.*2 SIMDs of a CU \(CU mode\).*at most 96"):
    dispatch(co, (1, 1, 1), (1024, 1, 1), bufs.kernarg, bufs.mem)
  dispatch(co, (1, 1, 1), (512, 1, 1), bufs.kernarg, bufs.mem)
  np.testing.assert_array_equal(bufs.arrays[0][:512], (7 + np.arange(512)).astype(np.uint32))


@pytest.fixture
def drv(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)   # what EMU=1 selects
  from baregrad.drivers.amd.driver import AMDDriver
  d = AMDDriver(timeout=10)
  yield d
  d.close()


def test_the_command_processor_refuses_the_dispatch(drv):
  """Through PM4: DISPATCH_DIRECT of 1024 threads of a 200-VGPR kernel stops the queue with the kernel's name."""
  from baregrad.compiler.amd.asm import assemble
  from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
  from baregrad.drivers.amd.driver import GPUFault
  kd = KernelDescriptor.for_kernel(200, kernarg_size=8, workgroup_ids=1, workitem_dims=1)
  _, handle = drv.load_program(write_code_object("wide", assemble(wide_kernel(199)), kd, 8), "wide")
  prog = types.SimpleNamespace(handle=handle, meta={}, name="wide", n_params=0)    # (as hcq.program.Program)
  out, args, sig = drv.alloc(4 * 1024), drv.alloc(64), drv.alloc(4096)
  np.frombuffer(drv.view(args.addr, 8), np.uint64)[0] = out.addr
  signal = types.SimpleNamespace(addr=sig.addr, timestamp_addr=sig.addr + 8, name="s")
  drv.submit("compute", drv.encode("compute", [("exec", prog, args.addr, (1, 1, 1), (1024, 1, 1)),
                                               ("signal", signal, 1)]))
  assert not drv.wait_value(sig.addr, 1, 2)
  with pytest.raises(GPUFault, match=r"DISPATCH_DIRECT .*kernel 'wide' .*uses 200 VGPRs.*1024 threads.*at most 192"):
    drv.check_faults("AMD")
  assert not np.frombuffer(drv.view(out.addr, 4096), np.uint32).any()
