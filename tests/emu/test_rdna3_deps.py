"""The RDNA3 emulator rejects what the hardware would run wrongly: a register used before the s_waitcnt that makes
a memory load's result valid (RDNA3 ISA guide, 5.6 "Data Dependency Resolution"), and the gfx1100 hazards LLVM's
GCNHazardRecognizer avoids (drivers/emu/rdna3_deps.py). Each rule: a kernel that breaks it raises, naming the
instruction, pc and register; the same kernel with the wait (or the distance) it needs runs."""
import numpy as np
import pytest

from baregrad.drivers.emu.rdna3 import HazardError, IllegalInstruction, MissingWait
from emu_helpers import run

PROLOGUE = """
  s_load_b128 s[4:7], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v1, 2, v0
"""


def run_kernel(body: str, **kw) -> np.ndarray:
  """PROLOGUE + body + s_endpgm over 64 threads: buffer 0 (s[4:5]) holds 1..65 as float32, buffer 1 (s[6:7]) is
  the output; returns the output."""
  a = np.arange(1, 66, dtype=np.float32)
  out = np.zeros(64, np.float32)
  run(PROLOGUE + body + "\n  s_endpgm", (1, 1, 1), (64, 1, 1), a, out, vgprs=24, workgroup_ids=1, workitem_dims=1,
      lds=512, **kw)
  return out


# =============================================================================================
# VMcnt: VMEM loads complete in order; the result is valid once s_waitcnt vmcnt(N) counts it done
# =============================================================================================

def test_vmem_load_used_without_wait_raises_naming_instruction_pc_and_register():
  with pytest.raises(MissingWait) as e:
    run_kernel("""
      global_load_b32 v2, v1, s[4:5]
      v_add_f32 v3, 1.0, v2
      global_store_b32 v1, v3, s[6:7]""")
  msg = str(e.value)
  assert "v_add_f32" in msg and "reads v2" in msg and "global_load_b32 v2" in msg
  assert "pc 0x" in msg and "s_waitcnt vmcnt(0)" in msg and "5.6" in msg


def test_vmem_load_with_wait_runs():
  out = run_kernel("""
    global_load_b32 v2, v1, s[4:5]
    s_waitcnt vmcnt(0)
    v_add_f32 v3, 1.0, v2
    global_store_b32 v1, v3, s[6:7]""")
  np.testing.assert_array_equal(out, np.arange(1, 65) + 1)


def test_vmcnt_counts_in_order():
  # the guide's example: two loads, s_waitcnt vmcnt(1) makes the first one's result usable
  out = run_kernel("""
    global_load_b32 v2, v1, s[4:5]
    global_load_b32 v3, v1, s[4:5] offset:4
    s_waitcnt vmcnt(1)
    v_mov_b32 v4, v2
    s_waitcnt vmcnt(0)
    v_add_f32 v4, v4, v3
    global_store_b32 v1, v4, s[6:7]""")
  a = np.arange(1, 66, dtype=np.float32)
  np.testing.assert_array_equal(out, a[:64] + a[1:])
  with pytest.raises(MissingWait, match=r"reads v3.*s_waitcnt vmcnt\(0\)"):
    run_kernel("""
      global_load_b32 v2, v1, s[4:5]
      global_load_b32 v3, v1, s[4:5] offset:4
      s_waitcnt vmcnt(1)
      v_add_f32 v4, v2, v3""")


def test_overwriting_a_register_still_being_loaded_raises():
  # data may reach the VGPRs out of order (5.6): a later write to the register could be undone by the load
  with pytest.raises(MissingWait, match="overwrites v2"):
    run_kernel("""
      global_load_b32 v2, v1, s[4:5]
      v_mov_b32 v2, 0""")
  with pytest.raises(MissingWait, match="overwrites v2"):
    run_kernel("""
      global_load_b32 v2, v1, s[4:5]
      global_load_b32 v2, v1, s[4:5] offset:4""")


def test_store_data_and_address_may_be_reused_at_once():
  # stores count on VScnt, which guards no register: the next instruction may overwrite their sources
  out = run_kernel("""
    v_mov_b32 v2, 7.0
    global_store_b32 v1, v2, s[6:7]
    v_mov_b32 v2, 0
    v_mov_b32 v1, 0""")
  np.testing.assert_array_equal(out, np.full(64, 7.0))


def test_vmcnt_form_of_the_wait_and_its_sgpr_form():
  out = run_kernel("""
    global_load_b32 v2, v1, s[4:5]
    s_waitcnt_vmcnt null, 0x0
    global_store_b32 v1, v2, s[6:7]""")
  np.testing.assert_array_equal(out, np.arange(1, 65))
  with pytest.raises(IllegalInstruction, match="SGPR count"):
    run_kernel("s_waitcnt_vmcnt s8, 0x0")


def test_waves_that_diverge_are_tracked_apart():
  # the odd workgroup waits on its own path, the even one forgets to
  src = """
    s_load_b128 s[4:7], s[0:1], 0x0
    s_waitcnt lgkmcnt(0)
    v_lshl_add_u32 v1, s2, 6, v0
    v_lshlrev_b32 v1, 2, v1
    global_load_b32 v2, v1, s[4:5]
    s_bitcmp1_b32 s2, 0
    s_cbranch_scc0 even
    s_waitcnt vmcnt(0)
    global_store_b32 v1, v2, s[6:7]
    s_endpgm
  even:
    {even}
    global_store_b32 v1, v2, s[6:7]
    s_endpgm
  """
  a, out = np.arange(128, dtype=np.float32), np.zeros(128, np.float32)
  run(src.format(even="s_waitcnt vmcnt(0)"), (2, 1, 1), (64, 1, 1), a, out, vgprs=8, workgroup_ids=1, workitem_dims=1)
  np.testing.assert_array_equal(out, a)
  with pytest.raises(MissingWait, match="global_store_b32 v1, v2"):
    run(src.format(even="s_nop 0"), (2, 1, 1), (64, 1, 1), a, out, vgprs=8, workgroup_ids=1, workitem_dims=1)


# =============================================================================================
# LGKMcnt: LDS in order, SMEM out of order (only lgkmcnt(0) guarantees an s_load), FLAT on both counters
# =============================================================================================

def test_smem_loads_return_out_of_order():
  body = """
    s_load_b32 s8, s[0:1], 0x0
    s_load_b32 s9, s[0:1], 0x4
    s_waitcnt lgkmcnt({n})
    s_add_u32 s10, s8, 1"""
  run_kernel(body.format(n=0))
  with pytest.raises(MissingWait, match=r"reads s8.*s_waitcnt lgkmcnt\(0\)"):
    run_kernel(body.format(n=1))


def test_lds_loads_return_in_order():
  body = """
    ds_store_b32 v1, v0
    ds_load_b32 v2, v1
    ds_load_b32 v3, v1
    s_waitcnt lgkmcnt({n})
    v_mov_b32 v4, v2"""
  run_kernel(body.format(n=1))                       # the store and the first load are done
  with pytest.raises(MissingWait, match=r"reads v2.*lgkmcnt\(1\)"):
    run_kernel(body.format(n=2))
  with pytest.raises(MissingWait, match="ds_load_b32 v2"):   # an SMEM load in flight: the count says nothing of LDS
    run_kernel("""
      ds_load_b32 v2, v1
      s_load_b32 s8, s[0:1], 0x0
      s_waitcnt lgkmcnt(1)
      v_mov_b32 v4, v2""")


def test_flat_load_needs_both_counters_at_zero():
  body = """
    v_mov_b32 v2, s4
    v_mov_b32 v3, s5
    flat_load_b32 v4, v[2:3]
    s_waitcnt {wait}
    global_store_b32 v1, v4, s[6:7]"""
  out = run_kernel(body.format(wait="vmcnt(0) lgkmcnt(0)"))
  np.testing.assert_array_equal(out, np.ones(64))
  with pytest.raises(MissingWait, match=r"lgkmcnt\(0\)"):
    run_kernel(body.format(wait="vmcnt(0)"))
  with pytest.raises(MissingWait, match=r"vmcnt\(0\)"):
    run_kernel(body.format(wait="lgkmcnt(0)"))


# =============================================================================================
# gfx1100 hazards (LLVM GCNHazardRecognizer)
# =============================================================================================

PAD = "\n".join(["  v_mov_b32 v9, 0"] * 6)


def test_trans_result_read_too_soon_raises():
  # fixVALUTransUseHazard: a VALU reading a v_rcp/v_sqrt/... result with <= 5 VALUs and <= 1 TRANS in between
  with pytest.raises(HazardError, match=r"v_fma_f32 v4, -v2, v3, 1.0.*reads v3.*v_rcp_f32.*FeatureVALUTransUseHazard"):
    run_kernel("""
      v_cvt_f32_u32 v2, v0
      v_rcp_f32 v3, v2
      v_fma_f32 v4, -v2, v3, 1.0""")
  five = "\n".join(["  v_mov_b32 v9, 0"] * 5)
  with pytest.raises(HazardError, match="5 VALU"):
    run_kernel(f"v_sqrt_f32 v3, v0\n{five}\n  v_add_f32 v4, v3, v3")


@pytest.mark.parametrize("between", [PAD, "v_rcp_f32 v10, v0\n  v_sqrt_f32 v11, v0",
                                     "global_load_b32 v12, v1, s[4:5]\n  s_waitcnt vmcnt(0)"],
                         ids=["six VALUs", "two other TRANS", "a VMEM load"])
def test_trans_result_read_after_the_hazard_expired(between):
  out = run_kernel(f"""
    v_cvt_f32_u32 v2, v1
    v_rcp_f32 v3, v2
    {between}
    v_mul_f32 v4, v3, v2
    global_store_b32 v1, v4, s[6:7]""")
  assert (np.abs(out[1:] - 1) < 1e-6).all()


def test_trans_result_taken_by_a_store_at_once_is_no_hazard():
  out = run_kernel("""
    v_cvt_f32_u32 v2, v0
    v_sqrt_f32 v3, v2
    global_store_b32 v1, v3, s[6:7]""")
  np.testing.assert_allclose(out, np.sqrt(np.arange(64)), rtol=2e-7)


WMMA = """
  v_wmma_f32_16x16x16_f16 v[0:7], v[8:15], v[16:23], 0
  {between}
  v_wmma_f32_16x16x16_f16 v[24:31], {a}, v[16:23], 0
"""


def test_wmma_reading_the_previous_wmma_result_raises():
  # fixWMMAHazards: A or B of a v_wmma overlapping the D of the v_wmma right before it
  with pytest.raises(HazardError, match="WMMA hazard.*fixWMMAHazards"):
    run(WMMA.format(between="", a="v[0:7]") + "s_endpgm", (1, 1, 1), (32, 1, 1), vgprs=32)
  run(WMMA.format(between="v_mov_b32 v40, 0", a="v[0:7]") + "s_endpgm", (1, 1, 1), (32, 1, 1), vgprs=48)
  run(WMMA.format(between="", a="v[32:39]") + "s_endpgm", (1, 1, 1), (32, 1, 1), vgprs=48)


def test_permlane_right_after_v_cmpx_raises():
  src = """
    v_cmpx_gt_u32 16, v0
    {between}
    v_permlane16_b32 v1, v0, 0, 0
    s_endpgm"""
  with pytest.raises(HazardError, match="v_cmpx -> v_permlane.*FeatureVcmpxPermlaneHazard"):
    run(src.format(between="s_nop 0"), (1, 1, 1), (32, 1, 1), vgprs=8)
  run(src.format(between="v_mov_b32 v2, v0"), (1, 1, 1), (32, 1, 1), vgprs=8)
