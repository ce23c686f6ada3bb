"""Every instruction the emulator claims to run, executed once on random register state (no
Python-level failure, results only on active lanes), plus WMMA against numpy."""
import numpy as np
import pytest

from baregrad.drivers.amd import isa
from baregrad.drivers.emu.rdna3 import Program, coverage
from baregrad.drivers.emu.rdna3_state import ALL, EXEC, Waves
from emu_helpers import run

FIELD_VALUES = {"src0": 256 + 2, "src1": 256 + 4, "src2": 256 + 6, "vsrc1": 4, "vdst": 8, "sdst": 10, "ssrc0": 2,
                "ssrc1": 4, "simm16": 5}
VALU_SALU = ("VOP1", "VOP2", "VOP3", "VOPC", "VOP3P", "SOP1", "SOP2", "SOPC", "SOPK")


def _field(inst, name):
  if inst.fmt.startswith("SOP") and name == "sdst": return 20
  if inst.fmt == "VOP3" and name == "vdst" and any(o.field == "vdst" and o.kind.startswith("s") for o in inst.operands):
    return 20                                           # v_cmp_*_e64 / v_readlane: an SGPR destination
  return FIELD_VALUES.get(name, 0)


CASES = [inst for (fmt, _), inst in sorted(isa.BY_OPCODE.items()) if fmt in VALU_SALU]


def test_coverage_counts():
  have, missing = coverage()
  assert len(have) > 1150, missing
  for name in ("v_fmac_f32", "global_load_b128", "ds_load_b128", "s_load_b512", "v_wmma_f32_16x16x16_f16",
               "v_cmpx_gt_u32", "s_and_saveexec_b32", "s_barrier", "v_pk_fma_f16"):
    assert any(h.startswith(name + " ") for h in have), name


@pytest.mark.parametrize("inst", CASES, ids=[f"{i.fmt}-{i.name}" for i in CASES])
def test_instruction_runs_on_random_state(inst):
  rng = np.random.default_rng(hash(inst.name) & 0xFFFF)
  prog = Program(b"\0" * 16, 0, type("KD", (), {"granulated_workitem_vgpr_count": 3})())
  try:
    c = prog._compile_inst(0, inst, lambda name: _field(inst, name), 0x3FC00000, 8)
  except Exception:
    c = None
  if c is None or c.run is None: pytest.skip("no semantics (counted by test_coverage_counts)")
  w = Waves(3, 32, 1, 64)
  w.V[:] = rng.integers(0, 2**32, w.V.shape, dtype=np.uint64).astype(np.uint32)
  w.S[:106] = rng.integers(0, 2**32, (106, 3), dtype=np.uint64).astype(np.uint32)
  w.S[EXEC] = [0xFFFFFFFF, 0x0F0F00FF, 0]
  w.exec_dirty = True
  before = w.V.copy()
  with np.errstate(all="ignore"):
    c.run(w, ALL)
    c.run(w, np.array([1, 2]))
  # the all-lanes-off wave keeps its VGPRs, except for lane writes that ignore EXEC
  if inst.name not in ("v_writelane_b32",):
    np.testing.assert_array_equal(w.V[:, 2], before[:, 2])


def test_wmma_f32_16x16x16_f16():
  rng = np.random.default_rng(1)
  a = rng.integers(-4, 4, (16, 16)).astype(np.float16)
  b = rng.integers(-4, 4, (16, 16)).astype(np.float16)
  c = rng.integers(-50, 50, (16, 16)).astype(np.float32)
  lane = np.arange(32)
  a_regs = a[lane % 16]                                  # lane l: row l % 16, K in halves
  b_regs = b.T[lane % 16]                                # lane l: column l % 16
  c_regs = np.stack([c[2 * j + lane // 16, lane % 16] for j in range(8)], axis=1)   # (lane, vgpr)
  inputs = np.concatenate([a_regs.view(np.uint32), b_regs.view(np.uint32), c_regs.view(np.uint32)], axis=1)
  out = np.zeros((32, 8), np.uint32)
  src = """
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
    s_waitcnt vmcnt(0)
    v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]
    global_store_b128 v41, v[24:27], s[6:7]
    global_store_b128 v41, v[28:31], s[6:7] offset:16
    s_endpgm
  """
  run(src, (1, 1, 1), (32, 1, 1), np.ascontiguousarray(inputs), out, vgprs=48, workgroup_ids=0, workitem_dims=1)
  d = np.zeros((16, 16), np.float32)
  for j in range(8):
    d[2 * j + lane // 16, lane % 16] = out[:, j].view(np.float32)
  np.testing.assert_array_equal(d, a.astype(np.float32) @ b.astype(np.float32) + c)
