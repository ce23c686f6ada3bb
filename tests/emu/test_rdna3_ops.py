"""Every instruction the emulator claims to run, executed once on random register state with NaN (quiet and
signalling), +-inf, +-0 and denormal values mixed into the registers: the only exception allowed is the emulator's
own refusal (EmulatorError) of an instruction it also lists as missing, the wave with EXEC = 0 keeps its VGPRs, and
for the instructions tests/emu has an independent reference for (rdna3_reference.py, numpy and Python integers
below) the result is checked lane by lane. Plus WMMA against numpy."""
import zlib

import numpy as np
import pytest

from baregrad.drivers.amd import isa
from baregrad.drivers.amd.codeobj import KernelDescriptor
from baregrad.drivers.emu.rdna3 import Program, coverage
from baregrad.drivers.emu.rdna3_state import ALL, EXEC, VCC, EmulatorError, Waves
from emu_helpers import run
import rdna3_reference as ref

FIELD_VALUES = {"src0": 256 + 2, "src1": 256 + 4, "src2": 256 + 6, "vsrc1": 4, "vdst": 8, "sdst": 10, "ssrc0": 2,
                "ssrc1": 4, "simm16": 5}
SGPR_DST, MASK_SGPR = 20, 12
VALU_SALU = ("VOP1", "VOP2", "VOP3", "VOPC", "VOP3P", "SOP1", "SOP2", "SOPC", "SOPK")
EXEC_MASKS = [0xFFFFFFFF, 0x0F0F00FF, 0]           # per wave; the last wave has no lane active


def _field(inst, name):
  if inst.fmt.startswith("SOP") and name == "sdst": return SGPR_DST
  if inst.fmt == "VOP3" and name == "vdst" and any(o.field == "vdst" and o.kind.startswith("s") for o in inst.operands):
    return SGPR_DST                                     # v_cmp_*_e64 / v_readlane: an SGPR destination
  if name == "src2" and any(o.field == "src2" and o.kind.startswith("s") for o in inst.operands):
    return MASK_SGPR                                    # v_cndmask_b32_e64, v_*_co_ci_u32_e64: a lane-mask SGPR
  return FIELD_VALUES.get(name, 0)


CASES = [inst for (fmt, _), inst in sorted(isa.BY_OPCODE.items()) if fmt in VALU_SALU]
HAVE = set(coverage()[0])


def test_coverage_counts():
  have, missing = coverage()
  assert len(have) > 1150, missing
  for name in ("v_fmac_f32", "global_load_b128", "ds_load_b128", "s_load_b512", "v_wmma_f32_16x16x16_f16",
               "v_cmpx_gt_u32", "s_and_saveexec_b32", "s_barrier", "v_pk_fma_f16"):
    assert any(h.startswith(name + " ") for h in have), name


def random_state(rng) -> Waves:
  """Three waves of random registers; in every VGPR, lanes 0-15 hold the float32 edge values, lanes 16-23 float16
  edge values in their low halves and lanes 24-31 (register pairs v[2k:2k+1]) float64 edge values, in an order
  that differs from register to register so that operands meet different partners."""
  w = Waves(3, 32, 1, 64)
  w.V[:] = rng.integers(0, 2**32, w.V.shape, dtype=np.uint64).astype(np.uint32)
  w.S[:106] = rng.integers(0, 2**32, (106, 3), dtype=np.uint64).astype(np.uint32)
  for r in range(w.V.shape[0]):
    order = rng.permutation(16)
    w.V[r, :, 0:16] = np.array(ref.SPECIALS["f32"], np.uint32)[order]
    w.V[r, :, 16:24] = (w.V[r, :, 16:24] & np.uint32(0xFFFF0000)) | np.array(ref.SPECIALS["f16"], np.uint32)[order[:8]]
    f64 = np.array(ref.SPECIALS["f64"], np.uint64)[order[8:]]
    part = (f64 >> np.uint64(32 * (r % 2))) & np.uint64(0xFFFFFFFF)
    w.V[r, :, 24:32] = part.astype(np.uint32)
  w.S[EXEC] = EXEC_MASKS
  w.exec_dirty = True
  return w


# ---- references: fn(state before) -> {(register file, index): expected value} for the checked registers ----
U32 = np.uint32


def _f32(x): return np.asarray(x, U32).view(np.float32)
def _i32(x): return np.asarray(x, U32).view(np.int32)


def _mask(bits) -> np.ndarray:
  """(waves,) lane-mask words -> (waves, 32) bool."""
  return ((np.asarray(bits, np.uint64)[:, None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)).astype(bool)


def _lanes_active() -> np.ndarray: return _mask(EXEC_MASKS)


def _lane_bits(per_lane: np.ndarray) -> np.ndarray:
  return (per_lane.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(U32)


def _per_lane(fn, *planes) -> np.ndarray:
  """fn applied lane by lane to Python ints (the planes' elements)."""
  out = np.zeros(planes[0].shape, np.uint64)
  for idx in np.ndindex(planes[0].shape):
    out[idx] = fn(*(int(p[idx]) for p in planes))
  return out


def _pair(V, r): return V[r].astype(np.uint64) | (V[r + 1].astype(np.uint64) << np.uint64(32))


def _operands(V, t: str, n: int):
  """Sources v2, v4, v6 (v[2:3], v[4:5], v[6:7] for 64-bit types; the low halves for 16-bit ones)."""
  regs = [2, 4, 6][:n]
  if t[1:] == "64": return [_pair(V, r) for r in regs]
  if t[1:] == "16": return [(V[r] & U32(0xFFFF)).astype(np.uint64) for r in regs]
  return [V[r].astype(np.uint64) for r in regs]


def _signed(x: int, bits: int) -> int: return x - (1 << bits) if x >> (bits - 1) else x


def _compare_reference(inst):
  """v_cmp_<op>_<type> / v_cmpx_<op>_<type> (VOPC: VCC, VOP3: the SGPR in vdst, v_cmpx: EXEC)."""
  name = inst.name
  op, t = name.split("_")[2], name.split("_")[3]
  bits = int(t[1:])
  def fn(V, S):
    a, b = _operands(V, t, 2)
    if op == "class":
      b = V[4].astype(np.uint64)                         # the class mask is a 32-bit operand, also for f64
      res = _per_lane(lambda x, m: ref.v_cmp_class(x, m, t), a, b)
    elif t[0] == "f":
      res = _per_lane(lambda x, y: ref.FLOAT_COMPARES[op](ref.value(x, t), ref.value(y, t)), a, b)
    else:
      conv = (lambda x: _signed(x, bits)) if t[0] == "i" else (lambda x: x)
      res = _per_lane(lambda x, y: ref.INT_COMPARES[op](conv(x), conv(y)), a, b)
    result = _lane_bits(res.astype(bool) & _lanes_active())
    dst = EXEC if name.startswith("v_cmpx") else SGPR_DST if inst.fmt == "VOP3" else VCC
    return {("s", dst): result}
  return fn


def _float_reference(kind: str, t: str, n: int):
  fn_ref = ref.MINMAX[kind]
  def fn(V, S):
    ops = _operands(V, t, n)
    out = _per_lane(lambda *xs: fn_ref(*xs, t), *ops)
    if t == "f64": return {("v", 8): (out & np.uint64(0xFFFFFFFF)).astype(U32), ("v", 9): (out >> np.uint64(32)).astype(U32)}
    return {("v16" if t == "f16" else "v", 8): out.astype(U32)}
  return fn


def _numpy_f32(fn, n: int):
  def ref_fn(V, S):
    with np.errstate(all="ignore"):
      r = np.asarray(fn(*(_f32(V[r]) for r in (2, 4, 6)[:n])), np.float32)
    return {("vf", 8): r.view(U32)}                      # NaN results compare as NaN
  return ref_fn


def _int_op(fn, n: int = 2):
  def ref_fn(V, S):
    with np.errstate(all="ignore"):
      return {("v", 8): np.asarray(fn(*(V[r].astype(np.uint64) for r in (2, 4, 6)[:n]))).astype(np.uint64).astype(U32)}
  return ref_fn


def _sext(x, bits=32): return np.where(x >> np.uint64(bits - 1), x.astype(np.int64) - (1 << bits), x.astype(np.int64))


def _cvt_to_int(x, lo, hi):
  """f32_to_i32/u32: truncation, out-of-range values (inf too) saturate, NaN gives 0 (16.8)."""
  v = _f32(x).astype(np.float64)
  return np.clip(np.trunc(np.nan_to_num(v, nan=0.0, posinf=hi, neginf=lo)), lo, hi).astype(np.int64)


def _cndmask(V, S, fmt):
  mask = _mask(S[MASK_SGPR] if fmt == "VOP3" else S[VCC])
  return {("v", 8): np.where(mask, V[4], V[2])}


def _add_carry(V, S, fmt, with_carry_in: bool):
  carry_in = _mask(S[MASK_SGPR] if fmt == "VOP3" else S[VCC]).astype(np.uint64) if with_carry_in else 0
  full = V[2].astype(np.uint64) + V[4].astype(np.uint64) + carry_in
  carry = _lane_bits((full >> np.uint64(32)).astype(bool) & _lanes_active())
  return {("v", 8): (full & np.uint64(0xFFFFFFFF)).astype(U32), ("s", 10 if fmt == "VOP3" else VCC): carry}


SALU_REFERENCE = {   # (result, SCC) from ssrc0 = s2, ssrc1 = s4 (RDNA3 ISA guide, 16.1 "SOP2 Instructions")
  "s_add_u32": lambda a, b: ((a + b) & 0xFFFFFFFF, (a + b) >> 32),
  "s_sub_u32": lambda a, b: ((a - b) & 0xFFFFFFFF, int(b > a)),
  "s_and_b32": lambda a, b: (a & b, int(a & b != 0)), "s_or_b32": lambda a, b: (a | b, int(a | b != 0)),
  "s_xor_b32": lambda a, b: (a ^ b, int(a ^ b != 0)),
  "s_lshl_b32": lambda a, b: ((a << (b & 31)) & 0xFFFFFFFF, int((a << (b & 31)) & 0xFFFFFFFF != 0)),
  "s_lshr_b32": lambda a, b: (a >> (b & 31), int(a >> (b & 31) != 0)),
  "s_mul_i32": lambda a, b: ((a * b) & 0xFFFFFFFF, None),
  "s_cmp_eq_u32": lambda a, b: (None, int(a == b)), "s_cmp_lg_u32": lambda a, b: (None, int(a != b)),
  "s_cmp_lt_u32": lambda a, b: (None, int(a < b)), "s_cmp_ge_i32": lambda a, b: (None, int(_signed(a, 32) >= _signed(b, 32))),
}


def _salu(fn):
  def ref_fn(V, S, scc):
    a, b = S[2].astype(np.uint64), S[4].astype(np.uint64)
    results = [fn(int(x), int(y)) for x, y in zip(a, b)]
    out = {}
    if results[0][0] is not None: out[("s", SGPR_DST)] = np.array([r[0] for r in results], U32)
    if results[0][1] is not None: out[("scc", 0)] = np.array([r[1] for r in results], U32)
    return out
  return ref_fn


def _reference(inst):
  """The reference for this instruction, or None."""
  name, fmt = inst.name, inst.fmt
  if fmt in ("SOP2", "SOPC"): return _salu(SALU_REFERENCE[name]) if name in SALU_REFERENCE else None
  if fmt.startswith("SOP"): return None
  if name.startswith("v_cmp"): return _compare_reference(inst)
  for kind in ref.MINMAX:
    for t in ("f16", "f32", "f64"):
      if name == f"v_{kind}_{t}" and fmt != "VOP3P": return _float_reference(kind, t, 2 if kind in ("min", "max") else 3)
  f32_ops = {"v_add_f32": (lambda a, b: a + b, 2), "v_sub_f32": (lambda a, b: a - b, 2),
             "v_subrev_f32": (lambda a, b: b - a, 2), "v_mul_f32": (lambda a, b: a * b, 2),
             "v_trunc_f32": (np.trunc, 1), "v_floor_f32": (np.floor, 1), "v_ceil_f32": (np.ceil, 1)}
  if name in ("v_cvt_f32_i32", "v_cvt_f32_u32"):
    signed = name.endswith("i32")
    return lambda V, S: {("v", 8): (_i32(V[2]) if signed else V[2]).astype(np.float32).view(U32)}
  if name in f32_ops: return _numpy_f32(*f32_ops[name])
  if name == "v_cvt_i32_f32": return lambda V, S: {("v", 8): _cvt_to_int(V[2], -2**31, 2**31 - 1).astype(U32)}
  if name == "v_cvt_u32_f32": return lambda V, S: {("v", 8): _cvt_to_int(V[2], 0, 2**32 - 1).astype(np.uint64).astype(U32)}
  if name == "v_cndmask_b32": return lambda V, S: _cndmask(V, S, fmt)
  if name in ("v_add_co_u32", "v_add_co_ci_u32"): return lambda V, S: _add_carry(V, S, fmt, "_ci_" in name)
  int_ops = {"v_add_nc_u32": lambda a, b: a + b, "v_sub_nc_u32": lambda a, b: a - b, "v_subrev_nc_u32": lambda a, b: b - a,
             "v_and_b32": lambda a, b: a & b, "v_or_b32": lambda a, b: a | b, "v_xor_b32": lambda a, b: a ^ b,
             "v_xnor_b32": lambda a, b: ~(a ^ b), "v_mul_lo_u32": lambda a, b: a * b,
             "v_mul_hi_u32": lambda a, b: (a * b) >> np.uint64(32),
             "v_lshlrev_b32": lambda a, b: b << (a & np.uint64(31)), "v_lshrrev_b32": lambda a, b: b >> (a & np.uint64(31)),
             "v_ashrrev_i32": lambda a, b: _sext(b) >> (a & np.uint64(31)).astype(np.int64),
             "v_min_u32": np.minimum, "v_max_u32": np.maximum,
             "v_min_i32": lambda a, b: np.minimum(_sext(a), _sext(b)), "v_max_i32": lambda a, b: np.maximum(_sext(a), _sext(b))}
  if name in int_ops: return _int_op(int_ops[name])
  three = {"v_add3_u32": lambda a, b, c: a + b + c, "v_xad_u32": lambda a, b, c: (a ^ b) + c,
           "v_lshl_add_u32": lambda a, b, c: (a << (b & np.uint64(31))) + c,
           "v_med3_u32": lambda a, b, c: np.sort(np.stack([a, b, c]), axis=0)[1],
           "v_med3_i32": lambda a, b, c: np.sort(np.stack([_sext(a), _sext(b), _sext(c)]), axis=0)[1]}
  if name in three: return _int_op(three[name], 3)
  one = {"v_not_b32": lambda a: ~a, "v_mov_b32": lambda a: a,
         "v_bfrev_b32": lambda a: np.array([int(f"{int(x):032b}"[::-1], 2) for x in a.reshape(-1)], np.uint64).reshape(a.shape)}
  if name in one: return _int_op(one[name], 1)
  return None


def _check(inst, expected: dict, w: Waves, before_V, before_S):
  active = _lanes_active()
  for (kind, r), want in expected.items():
    if kind == "scc":
      np.testing.assert_array_equal(w.scc, want, err_msg=f"{inst.name}: SCC"); continue
    if kind == "s":
      np.testing.assert_array_equal(w.S[r], want, err_msg=f"{inst.name}: s{r}"); continue
    got = w.V[r]
    if kind == "v16": got, want, before = got & U32(0xFFFF), want & U32(0xFFFF), before_V[r] & U32(0xFFFF)
    else: before = before_V[r]
    full = np.where(active, want, before)
    if kind == "vf":         # float results: NaN matches any NaN (payload propagation is not specified)
      same = (got == full) | (np.isnan(_f32(got)) & np.isnan(_f32(full)))
    else:
      same = got == full
    bad = np.argwhere(~same)
    assert not bad.size, (f"{inst.name} ({inst.fmt}) v{r}: {len(bad)} lanes differ; first (wave, lane) {tuple(bad[0])}: "
                          f"got {int(got[tuple(bad[0])]):#x}, want {int(full[tuple(bad[0])]):#x}; sources "
                          f"{[hex(int(before_V[s][tuple(bad[0])])) for s in (2, 3, 4, 5, 6)]}")


@pytest.mark.parametrize("inst", CASES, ids=[f"{i.fmt}-{i.name}" for i in CASES])
def test_instruction_runs_on_random_state(inst):
  rng = np.random.default_rng(zlib.crc32(f"{inst.fmt} {inst.name}".encode()))   # the same state in every run
  prog = Program(b"\0" * 16, 0, KernelDescriptor.for_kernel(vgprs=24))
  label = f"{inst.name} ({inst.fmt})"
  try:
    c = prog._compile_inst(0, inst, lambda name: _field(inst, name), 0x3FC00000, 8)
  except EmulatorError as e:     # the emulator's own refusal (IllegalInstruction is one)
    if label in HAVE: pytest.fail(f"{label} runs with zero fields but not with these operands: {e}")
    c = None
  if c is None:
    assert label not in HAVE, f"{label} compiles with zero fields but not with these operands"
    pytest.skip("no semantics (counted by test_coverage_counts)")
  if c.run is None: pytest.skip("control flow only (s_setpc_b64 & co: run by rdna3.py's wave scheduler)")
  w = random_state(rng)
  if inst.name.startswith("v_wmma_"):    # needs EXEC all ones (wave 1's is partial): tests/emu/test_tensor_cores.py
    with pytest.raises(EmulatorError, match="needs EXEC all ones"): c.run(w, ALL)
    return
  before_V, before_S, before_scc = w.V.copy(), w.S.copy(), w.scc.copy()
  reference = _reference(inst)
  expected = None
  if reference is not None:
    with np.errstate(all="ignore"):      # signalling NaNs and out-of-range casts are part of the state
      expected = reference(before_V, before_S, before_scc) if inst.fmt.startswith("SOP") else reference(before_V, before_S)
  with np.errstate(all="ignore"):
    c.run(w, ALL)
  if expected is not None: _check(inst, expected, w, before_V, before_S)
  with np.errstate(all="ignore"):
    c.run(w, np.array([1, 2]))
  # the all-lanes-off wave keeps its VGPRs, except for lane writes that ignore EXEC
  if inst.name not in ("v_writelane_b32",):
    np.testing.assert_array_equal(w.V[:, 2], before_V[:, 2])


REFERENCED = [i for i in CASES if _reference(i) is not None]


def test_references_cover_the_edge_instructions():
  """The random-state references reach every compare form and the float min/max family."""
  names = {i.name for i in REFERENCED}
  assert sum(n.startswith("v_cmp") for n in names) >= 180 and {"v_max_f32", "v_med3_f16", "v_min_f64"} <= names
  assert len(REFERENCED) >= 450, len(REFERENCED)


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
