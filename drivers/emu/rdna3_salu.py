"""RDNA3 scalar ALU semantics: SOP1, SOP2, SOPK, SOPC (per-wave numpy arrays of shape (k,)).

Semantics and SCC rules follow the AMD "RDNA3 Instruction Set Architecture" reference guide,
chapter "Scalar ALU Operations" and the SOP1/SOP2/SOPK/SOPC opcode descriptions.
Control flow (SOPP, s_setpc/s_swappc/s_getpc/s_call) is in rdna3.py.

Each table entry maps a mnemonic to fn(a, b, scc) -> (result, new_scc or None); a and b are
uint32 (or uint64 for 64-bit operands) arrays, scc a uint32 array.
"""
from __future__ import annotations

import numpy as np

from .rdna3_state import EXEC, U32, U64, I32, I64, EmulatorError, scalar_source
from .rdna3_valu import _top_bit, bit_reverse32

M32, M64 = np.uint64(0xFFFFFFFF), np.uint64(0xFFFFFFFFFFFFFFFF)
HW_REG_MODE = 1        # hwreg id of MODE (s_getreg/s_setreg simm16[5:0])
OPS: dict[str, object] = {}


def _nz(x): return (x != 0).astype(U32)
def _s32(x): return np.asarray(x, U32).view(I32)
def _s64(x): return np.asarray(x, U64).view(I64)


def _op(names: str, fn) -> None:
  for n in names.split(): OPS[n] = fn


def _bitwise(fn):
  return lambda a, b, scc: (lambda r: (r, _nz(r)))(fn(a, b))


def _bfe(a, b, bits, signed):
  off = (b & np.uint32(bits - 1)).astype(I64)
  width = ((b >> np.uint32(16)) & np.uint32(0x7F)).astype(I64)
  width = np.minimum(width, bits)
  if bits == 32:
    v = (a.astype(U64) >> off.astype(U64)) & ((np.uint64(1) << width.astype(U64)) - np.uint64(1))
    if signed:
      sv = v.astype(I64)
      sv = np.where((width > 0) & ((sv >> np.maximum(width - 1, 0)) & 1 == 1), sv - (np.int64(1) << width), sv)
      return sv.astype(I32).view(U32)
    return v.astype(U32)
  # 64-bit: shift in two steps so a width of 64 stays defined
  v = a.astype(U64) >> off.astype(U64)
  keep = np.where(width >= 64, M64, (np.uint64(1) << np.minimum(width, 63).astype(U64)) - np.uint64(1))
  v = v & keep
  if signed:
    top = np.where(width > 0, (v >> np.maximum(width - 1, 0).astype(U64)) & np.uint64(1), np.uint64(0))
    v = np.where((top == 1) & (width < 64), v | ~keep, v)
  return v


# ---- SOP1 ----
_op("s_mov_b32 s_mov_b64", lambda a, b, scc: (a, None))
_op("s_cmov_b32 s_cmov_b64", None)          # handled in compile (keeps the old value when SCC = 0)
_op("s_not_b32 s_not_b64", lambda a, b, scc: (~a, _nz(~a)))
_op("s_brev_b32", lambda a, b, scc: (bit_reverse32(a), None))
_op("s_brev_b64", lambda a, b, scc: ((bit_reverse32((a & M32).astype(U32)).astype(U64) << np.uint64(32))
                                     | bit_reverse32((a >> np.uint64(32)).astype(U32)).astype(U64), None))
_op("s_ctz_i32_b32 s_ctz_i32_b64", lambda a, b, scc: (np.where(a == 0, -1, _top_bit(a & (~a + a.dtype.type(1)))).astype(I32).view(U32), None))
_op("s_clz_i32_u32", lambda a, b, scc: (np.where(a == 0, -1, 31 - _top_bit(a)).astype(I32).view(U32), None))
_op("s_clz_i32_u64", lambda a, b, scc: (np.where(a == 0, -1, 63 - _top_bit(a)).astype(I32).view(U32), None))
_op("s_cls_i32", lambda a, b, scc: (np.where((a == 0) | (a == 0xFFFFFFFF), -1,
                                              31 - _top_bit(np.where(_s32(a) < 0, ~a, a).astype(U32))).astype(I32).view(U32), None))
_op("s_cls_i32_i64", lambda a, b, scc: (np.where((a == 0) | (a == M64), -1,
                                                 63 - _top_bit(np.where(_s64(a) < 0, ~a, a).astype(U64))).astype(I32).view(U32), None))
_op("s_sext_i32_i8", lambda a, b, scc: ((a & np.uint32(0xFF)).astype(np.uint8).view(np.int8).astype(I32).view(U32), None))
_op("s_sext_i32_i16", lambda a, b, scc: ((a & np.uint32(0xFFFF)).astype(np.uint16).view(np.int16).astype(I32).view(U32), None))
_op("s_abs_i32", lambda a, b, scc: (lambda r: (r, _nz(r)))(np.abs(_s32(a).astype(I64)).astype(U32)))
_op("s_bcnt0_i32_b32", lambda a, b, scc: (lambda r: (r, _nz(r)))((32 - np.bitwise_count(a)).astype(U32)))
_op("s_bcnt0_i32_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))((64 - np.bitwise_count(a)).astype(U32)))
_op("s_bcnt1_i32_b32 s_bcnt1_i32_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))(np.bitwise_count(a).astype(U32)))
_op("s_bitreplicate_b64_b32", lambda a, b, scc: (sum((((a >> np.uint32(i)) & np.uint32(1)).astype(U64) * np.uint64(3)) << np.uint64(2 * i)
                                                    for i in range(32)), None))


def _quadmask(a, bits):
  out = np.zeros(a.shape, a.dtype)
  for i in range(bits // 4):
    nib = (a >> a.dtype.type(4 * i)) & a.dtype.type(15)
    out |= (nib != 0).astype(a.dtype) << a.dtype.type(i)
  return out


def _wqm(a, bits):
  out = np.zeros(a.shape, a.dtype)
  for i in range(bits // 4):
    nib = (a >> a.dtype.type(4 * i)) & a.dtype.type(15)
    out |= np.where(nib != 0, a.dtype.type(15), a.dtype.type(0)) << a.dtype.type(4 * i)
  return out


_op("s_quadmask_b32", lambda a, b, scc: (lambda r: (r, _nz(r)))(_quadmask(a, 32)))
_op("s_quadmask_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))(_quadmask(a, 64)))
_op("s_wqm_b32", lambda a, b, scc: (lambda r: (r, _nz(r)))(_wqm(a, 32)))
_op("s_wqm_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))(_wqm(a, 64)))

# saveexec: D = EXEC (old); EXEC = f(S0, EXEC); SCC = EXEC != 0. wrexec: D = EXEC (new).
SAVEEXEC = {
  "and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e,
  "nand": lambda s, e: ~(s & e), "nor": lambda s, e: ~(s | e), "xnor": lambda s, e: ~(s ^ e),
  "and_not0": lambda s, e: ~s & e, "or_not0": lambda s, e: ~s | e,
  "and_not1": lambda s, e: s & ~e, "or_not1": lambda s, e: s | ~e,
}

# ---- SOP2 ----


def _add_u32(a, b, scc): s = a.astype(U64) + b.astype(U64); return (s & M32).astype(U32), (s >> np.uint64(32)).astype(U32)
def _sub_u32(a, b, scc): return (a - b), (b > a).astype(U32)
def _addc_u32(a, b, scc): s = a.astype(U64) + b.astype(U64) + scc.astype(U64); return (s & M32).astype(U32), (s >> np.uint64(32)).astype(U32)
def _subb_u32(a, b, scc): s = a.astype(I64) - b.astype(I64) - scc.astype(I64); return s.astype(U32), (s < 0).astype(U32)


def _add_i32(a, b, scc):
  r = a + b
  sa, sb, sr = _s32(a) < 0, _s32(b) < 0, _s32(r) < 0
  return r, ((sa == sb) & (sr != sa)).astype(U32)


def _sub_i32(a, b, scc):
  r = a - b
  sa, sb, sr = _s32(a) < 0, _s32(b) < 0, _s32(r) < 0
  return r, ((sa != sb) & (sr != sa)).astype(U32)


def _lshl_add(n):
  def fn(a, b, scc):
    s = (a.astype(U64) << np.uint64(n)) + b.astype(U64)
    return (s & M32).astype(U32), (s >> np.uint64(32) != 0).astype(U32)
  return fn


_op("s_add_u32", _add_u32)
_op("s_sub_u32", _sub_u32)
_op("s_add_i32", _add_i32)
_op("s_sub_i32", _sub_i32)
_op("s_addc_u32", _addc_u32)
_op("s_subb_u32", _subb_u32)
_op("s_absdiff_i32", lambda a, b, scc: (lambda r: (r, _nz(r)))(np.abs(_s32(a).astype(I64) - _s32(b).astype(I64)).astype(U32)))
_op("s_lshl_b32", lambda a, b, scc: (lambda r: (r, _nz(r)))(a << (b & np.uint32(31))))
_op("s_lshr_b32", lambda a, b, scc: (lambda r: (r, _nz(r)))(a >> (b & np.uint32(31))))
_op("s_ashr_i32", lambda a, b, scc: (lambda r: (r, _nz(r)))((_s32(a) >> (b & np.uint32(31)).astype(I32)).view(U32)))
_op("s_lshl_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))(a << (b & np.uint32(63)).astype(U64)))
_op("s_lshr_b64", lambda a, b, scc: (lambda r: (r, _nz(r)))(a >> (b & np.uint32(63)).astype(U64)))
_op("s_ashr_i64", lambda a, b, scc: (lambda r: (r, _nz(r)))((_s64(a) >> (b & np.uint32(63)).astype(I64)).view(U64)))
for _n in range(1, 5): _op(f"s_lshl{_n}_add_u32", _lshl_add(_n))
_op("s_min_i32", lambda a, b, scc: (np.where(_s32(a) < _s32(b), a, b), (_s32(a) < _s32(b)).astype(U32)))
_op("s_min_u32", lambda a, b, scc: (np.where(a < b, a, b), (a < b).astype(U32)))
_op("s_max_i32", lambda a, b, scc: (np.where(_s32(a) > _s32(b), a, b), (_s32(a) > _s32(b)).astype(U32)))
_op("s_max_u32", lambda a, b, scc: (np.where(a > b, a, b), (a > b).astype(U32)))
_op("s_and_b32 s_and_b64", _bitwise(lambda a, b: a & b))
_op("s_or_b32 s_or_b64", _bitwise(lambda a, b: a | b))
_op("s_xor_b32 s_xor_b64", _bitwise(lambda a, b: a ^ b))
_op("s_nand_b32 s_nand_b64", _bitwise(lambda a, b: ~(a & b)))
_op("s_nor_b32 s_nor_b64", _bitwise(lambda a, b: ~(a | b)))
_op("s_xnor_b32 s_xnor_b64", _bitwise(lambda a, b: ~(a ^ b)))
_op("s_and_not1_b32 s_and_not1_b64", _bitwise(lambda a, b: a & ~b))
_op("s_or_not1_b32 s_or_not1_b64", _bitwise(lambda a, b: a | ~b))
_op("s_bfe_u32", lambda a, b, scc: (lambda r: (r, _nz(r)))(_bfe(a, b, 32, False)))
_op("s_bfe_i32", lambda a, b, scc: (lambda r: (r, _nz(r)))(_bfe(a, b, 32, True)))
_op("s_bfe_u64", lambda a, b, scc: (lambda r: (r, _nz(r)))(_bfe(a, b, 64, False)))
_op("s_bfe_i64", lambda a, b, scc: (lambda r: (r, _nz(r)))(_bfe(a, b, 64, True)))
_op("s_bfm_b32", lambda a, b, scc: ((((np.uint64(1) << (a & np.uint32(31)).astype(U64)) - np.uint64(1)) << (b & np.uint32(31)).astype(U64)).astype(U32), None))
_op("s_bfm_b64", lambda a, b, scc: ((((np.uint64(1) << (a & np.uint32(63)).astype(U64)) - np.uint64(1)) << (b & np.uint32(63)).astype(U64)), None))
_op("s_mul_i32", lambda a, b, scc: (a * b, None))
_op("s_mul_hi_u32", lambda a, b, scc: (((a.astype(U64) * b.astype(U64)) >> np.uint64(32)).astype(U32), None))
_op("s_mul_hi_i32", lambda a, b, scc: (((_s32(a).astype(I64) * _s32(b).astype(I64)) >> 32).astype(I32).view(U32), None))
_op("s_cselect_b32 s_cselect_b64", lambda a, b, scc: (np.where(scc != 0, a, b), None))
_op("s_pack_ll_b32_b16", lambda a, b, scc: ((a & np.uint32(0xFFFF)) | (b << np.uint32(16)), None))
_op("s_pack_lh_b32_b16", lambda a, b, scc: ((a & np.uint32(0xFFFF)) | (b & np.uint32(0xFFFF0000)), None))
_op("s_pack_hh_b32_b16", lambda a, b, scc: ((a >> np.uint32(16)) | (b & np.uint32(0xFFFF0000)), None))
_op("s_pack_hl_b32_b16", lambda a, b, scc: ((a >> np.uint32(16)) | (b << np.uint32(16)), None))

# ---- SOPC ----
_CMP = {"eq": np.equal, "lg": np.not_equal, "gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal}
for _c, _f in _CMP.items():
  _op(f"s_cmp_{_c}_i32", lambda a, b, scc, f=_f: (None, f(_s32(a), _s32(b)).astype(U32)))
  _op(f"s_cmp_{_c}_u32", lambda a, b, scc, f=_f: (None, f(a, b).astype(U32)))
_op("s_cmp_eq_u64", lambda a, b, scc: (None, (a == b).astype(U32)))
_op("s_cmp_lg_u64", lambda a, b, scc: (None, (a != b).astype(U32)))
_op("s_bitcmp0_b32", lambda a, b, scc: (None, (((a >> (b & np.uint32(31))) & np.uint32(1)) == 0).astype(U32)))
_op("s_bitcmp1_b32", lambda a, b, scc: (None, (((a >> (b & np.uint32(31))) & np.uint32(1)) == 1).astype(U32)))
_op("s_bitcmp0_b64", lambda a, b, scc: (None, (((a >> (b & np.uint32(63)).astype(U64)) & np.uint64(1)) == 0).astype(U32)))
_op("s_bitcmp1_b64", lambda a, b, scc: (None, (((a >> (b & np.uint32(63)).astype(U64)) & np.uint64(1)) == 1).astype(U32)))

# ---- SOPK (b = the 16-bit immediate, sign- or zero-extended as the op says) ----
for _c, _f in _CMP.items():
  _op(f"s_cmpk_{_c}_i32", lambda a, b, scc, f=_f: (None, f(_s32(a), _s32(b)).astype(U32)))
  _op(f"s_cmpk_{_c}_u32", lambda a, b, scc, f=_f: (None, f(a, b).astype(U32)))
_op("s_movk_i32", lambda a, b, scc: (b, None))
_op("s_cmovk_i32", None)
_op("s_addk_i32", lambda a, b, scc: _add_i32(a, b, scc))
_op("s_mulk_i32", lambda a, b, scc: (a * b, None))


def _sext16(v: int) -> int: return (v - 0x10000 if v & 0x8000 else v) & 0xFFFFFFFF


def compile_salu(inst, get, literal):
  """run(w, sel) for a SOP1/SOP2/SOPC/SOPK instruction, or None if it has no semantics here."""
  name, fmt = inst.name, inst.fmt
  ops = {op.field: op for op in inst.operands}
  bits = lambda f: 64 if ops[f].kind in ("b64", "s64") else 32
  if fmt == "SOPK":
    imm = get("simm16")
    if name in ("s_getreg_b32",):
      dst = get("sdst")
      return lambda w, sel: w.write_s(dst, sel, np.uint32(0))
    if name == "s_setreg_b32" and imm & 0x3F == HW_REG_MODE:
      # the float semantics read MODE once, from the kernel descriptor (rdna3_state.FloatMode): a kernel that
      # changes its IEEE, DX10_CLAMP, denorm or round mode would run with the wrong ones, so it is refused
      raise EmulatorError("s_setreg_b32 hwreg(HW_REG_MODE): changing MODE in a kernel is not emulated (the float "
                          "modes come from the kernel descriptor only)")
    if name in ("s_setreg_b32", "s_waitcnt_vscnt", "s_waitcnt_vmcnt", "s_waitcnt_expcnt", "s_waitcnt_lgkmcnt",
                "s_subvector_loop_begin", "s_subvector_loop_end"):
      return lambda w, sel: None
    if name == "s_call_b64": return None          # control flow: rdna3.py
    signed = "_i32" in name          # s_cmpk_*_u32 zero-extends the immediate, the rest sign-extend
    k = U32(_sext16(imm) if signed else imm)
    dst = get("sdst")
    if name in ("s_movk_i32",): return lambda w, sel: w.write_s(dst, sel, k)
    if name == "s_cmovk_i32":
      return lambda w, sel: w.write_s(dst, sel, np.where(w.scc[sel] != 0, k, w.S[dst][sel]))
    fn = OPS.get(name)
    if fn is None: return None

    def run_k(w, sel):
      result, scc = fn(w.S[dst][sel], k, w.scc[sel])
      if result is not None: w.write_s(dst, sel, result)
      if scc is not None: w.scc[sel] = scc
    return run_k

  src0 = scalar_source(get("ssrc0"), bits("ssrc0"), literal, signed64="_i64" in name) if "ssrc0" in ops else None
  src1 = scalar_source(get("ssrc1"), bits("ssrc1"), literal, signed64="_i64" in name) if "ssrc1" in ops else None
  dst = get("sdst") if "sdst" in ops else None
  wide = dst is not None and ops["sdst"].kind == "s64"

  def write(w, sel, value):
    if wide: w.write_s64(dst, sel, value)
    else: w.write_s(dst, sel, np.asarray(value).astype(U32))

  def read_n(w, sel, reader):
    return np.broadcast_to(reader(w, sel), (len(w.scc[sel]),))

  if name.endswith("_saveexec_b32") or name.endswith("_saveexec_b64") or "_wrexec_" in name:
    op = name[2:name.index("_saveexec") if "saveexec" in name else name.index("_wrexec")]
    fn = SAVEEXEC[op]
    wrexec = "_wrexec_" in name

    def run_exec(w, sel):
      s = read_n(w, sel, src0).astype(U32)
      old = w.S[EXEC][sel].copy()
      new = fn(s, old).astype(U32)
      w.write_s(EXEC, sel, new)
      if wide: w.write_s(EXEC + 1, sel, np.uint32(0))
      write(w, sel, new if wrexec else old)
      w.scc[sel] = _nz(new)
    return run_exec
  if name in ("s_cmov_b32", "s_cmov_b64"):
    def run_cmov(w, sel):
      old = w.read_s64(dst, sel) if wide else w.S[dst][sel]
      write(w, sel, np.where(w.scc[sel] != 0, read_n(w, sel, src0), old))
    return run_cmov
  if name in ("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64"):
    one = name.startswith("s_bitset1")
    def run_bitset(w, sel):
      old = w.read_s64(dst, sel) if wide else w.S[dst][sel].astype(U64)
      bit = np.uint64(1) << (read_n(w, sel, src0).astype(U64) & np.uint64(63 if wide else 31))
      write(w, sel, (old | bit) if one else (old & ~bit))
    return run_bitset
  fn = OPS.get(name)
  if fn is None: return None

  if src1 is None:
    def run1(w, sel):
      result, scc = fn(read_n(w, sel, src0), None, w.scc[sel])
      if result is not None: write(w, sel, result)
      if scc is not None: w.scc[sel] = scc
    return run1

  def run2(w, sel):
    result, scc = fn(read_n(w, sel, src0), read_n(w, sel, src1), w.scc[sel])
    if result is not None and dst is not None: write(w, sel, result)
    if scc is not None: w.scc[sel] = scc
  return run2
