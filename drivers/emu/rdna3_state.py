"""Register state of a batch of RDNA3 wave32 waves, and operand access shared by the executors.

Layout (chosen for numpy speed): VGPRs are register-major, V[r] is one (n_waves, 32) uint32
plane, so an instruction touches contiguous memory; SGPRs are S[code, wave] indexed by the
operand encoding (s0..s105, vcc_lo=106, vcc_hi=107, ttmp 108..123, null=124, m0=125,
exec_lo=126, exec_hi=127; RDNA3 ISA guide, "Scalar source operands"). SCC is one uint32 per wave.

A "sel" is either ALL (slice(None): every wave of the batch) or an index array of waves that
share one PC; readers return arrays of shape (k,) for scalars and (k, 32) for lanes.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from baregrad.drivers.amd import isa

ALL = slice(None)
U32, U64, I32, I64, F32, F64, F16, U16, I16 = (np.uint32, np.uint64, np.int32, np.int64, np.float32, np.float64,
                                              np.float16, np.uint16, np.int16)
LANE = np.arange(32, dtype=np.uint32)
LANE_BITS = (np.uint32(1) << LANE).astype(U32)
VCC, NULL, M0, EXEC = 106, 124, 125, 126
SRC_VCCZ, SRC_EXECZ, SRC_SCC = 251, 252, 253
# apertures reported by src_shared_base / src_private_base (our own choice of addresses)
SHARED_BASE, PRIVATE_BASE = 0x0001_0000_0000_0000, 0x0002_0000_0000_0000


class EmulatorError(RuntimeError):
  pass


class FloatMode(NamedTuple):
  """The MODE register bits that the VALU's float semantics read (RDNA3 ISA guide, "Mode Register" (MODE)). A
  wave starts with the values of COMPUTE_PGM_RSRC1.IEEE_MODE and DX10_CLAMP (LLVM AMDGPUUsage, "COMPUTE_PGM_RSRC1").
  - ieee: V_MIN/V_MAX and the min3/max3/med3/minmax/maxmin forms return a signalling NaN operand quieted
    (pseudocode "if WAVE_MODE.IEEE then if isSignalNAN(S0) ..."); without it any NaN operand gives the other one.
  - dx10_clamp: the clamp output modifier turns a NaN result into 0.0 ("DX10 style treatment of NaNs: when set,
    clamp NaN to zero, otherwise pass NaN through")."""
  ieee: bool
  dx10_clamp: bool

  @classmethod
  def of(cls, kd) -> "FloatMode":
    return cls(ieee=bool(kd.enable_ieee_mode), dx10_clamp=bool(kd.enable_dx10_clamp))


def unemulated_float_mode(kd) -> str | None:
  """Why the emulator cannot run a kernel with this descriptor's float modes, or None. Its arithmetic keeps
  denormals and rounds to nearest even (numpy), which is FLOAT_DENORM_MODE_32/16_64 = 3 ("keep input and output
  denormals") and FLOAT_ROUND_MODE_32/16_64 = 0 ("round to nearest even") in COMPUTE_PGM_RSRC1 (LLVM AMDGPUUsage,
  "Floating Point Denorm Mode Enumeration Values" and "Floating Point Rounding Mode Enumeration Values")."""
  modes = {"float_denorm_mode_32": 3, "float_denorm_mode_16_64": 3, "float_round_mode_32": 0, "float_round_mode_16_64": 0}
  wrong = [f"{field} = {getattr(kd, field)}" for field, want in modes.items() if getattr(kd, field) != want]
  if not wrong: return None
  return (f"the kernel descriptor sets {', '.join(wrong)}: the emulator only runs kernels that keep denormals "
          f"(denorm mode 3) and round to nearest even (round mode 0)")


class IllegalInstruction(EmulatorError):
  def __init__(self, pc: int, dword: int, why: str = "unknown or illegal instruction", text: str = ""):
    self.pc, self.dword = pc, dword
    super().__init__(f"{why} at pc {pc:#x}: dword {dword:#010x}" + (f" ({text})" if text else ""))


class Waves:
  """All state of the waves of one dispatch batch."""

  def __init__(self, n_waves: int, n_vgprs: int, n_groups: int, lds_bytes: int, private_bytes: int = 0):
    self.n, self.n_vgprs = n_waves, n_vgprs
    self.V = np.zeros((n_vgprs, n_waves, 32), U32)
    self.S = np.zeros((128, n_waves), U32)
    self.scc = np.zeros(n_waves, U32)
    self.pc = np.zeros(n_waves, np.int64)
    self.done = np.zeros(n_waves, bool)
    self.barrier = np.zeros(n_waves, bool)
    self.group = np.zeros(n_waves, np.int64)       # workgroup index (within the batch) of each wave
    self.lds_order = None       # rdna3_mem.LDSOrder: LDS bytes written/read since the last s_barrier, per wave
    self.lds_bytes = lds_bytes
    self.lds = np.zeros(max(n_groups * lds_bytes, 4), np.uint8)
    self.private_bytes = private_bytes
    self.scratch = np.zeros(n_waves * 32 * private_bytes, np.uint8) if private_bytes else None
    self._exec_version = -1
    self._exec_bool = None
    self._exec_all = False
    self._active = None         # per-wave count of EXEC bits (counters), None when EXEC changed
    self._active_total = 0
    self.exec_dirty = True
    self.live = np.full(n_waves, 32, np.int64)   # lanes that exist in each wave (set at launch)
    self.live_total = 32 * n_waves
    self.memory = None
    self.code_base = 0
    self.deps = None            # rdna3_deps.DepState: outstanding loads and hazard windows
    self.tracking = False       # something outstanding: every instruction is checked against it

  # ---- exec mask ----
  @property
  def exec_dirty(self) -> bool: return self._exec_dirty

  @exec_dirty.setter
  def exec_dirty(self, value: bool) -> None:
    self._exec_dirty = value
    if value: self._active = None

  def active_lanes(self, sel) -> int:
    """The number of EXEC bits over the selected waves (what a vector instruction counts, counters.py)."""
    if self._active is None:
      self._active = np.bitwise_count(self.S[EXEC]).astype(np.int64)
      self._active_total = int(self._active.sum())
    return self._active_total if sel is ALL else int(self._active[sel].sum())

  def live_lanes(self, sel) -> int:
    """The lanes that exist in the selected waves (what a scalar instruction counts, counters.py)."""
    return self.live_total if sel is ALL else int(self.live[sel].sum())

  def lanes(self, sel) -> np.ndarray:
    """(k, 32) bool: the active lanes of the selected waves."""
    if self.exec_dirty:
      self._exec_bool = (self.S[EXEC][:, None] & LANE_BITS) != 0
      self._exec_all = bool(self._exec_bool.all())
      self.exec_dirty = False
    return self._exec_bool[sel]

  def all_active(self, sel) -> bool:
    lanes = self.lanes(sel)
    return self._exec_all if sel is ALL else bool(lanes.all())

  # ---- scalar registers ----
  def read_s(self, code: int, sel) -> np.ndarray:
    return self.S[code][sel]

  def write_s(self, code: int, sel, value) -> None:
    if code == NULL: return
    if code >= 128: raise EmulatorError(f"write to scalar operand code {code}")
    if sel is ALL: self.S[code][:] = value
    else: self.S[code][sel] = value
    if code in (EXEC, EXEC + 1): self.exec_dirty = True

  def write_s64(self, code: int, sel, value) -> None:
    value = np.asarray(value).astype(U64)
    self.write_s(code, sel, (value & np.uint64(0xFFFFFFFF)).astype(U32))
    self.write_s(code + 1, sel, (value >> np.uint64(32)).astype(U32))

  def read_s64(self, code: int, sel) -> np.ndarray:
    return self.S[code][sel].astype(U64) | (self.S[code + 1][sel].astype(U64) << np.uint64(32))

  # ---- vector registers ----
  def write_v(self, r: int, sel, value, lanes: np.ndarray | None) -> None:
    """Write `value` (broadcastable to (k, 32)) into V[r] on the active lanes (all lanes when
    `lanes` is None)."""
    plane = self.V[r]
    if sel is ALL:
      if lanes is None: plane[...] = value
      else: np.copyto(plane, value, where=lanes, casting="unsafe")
    else:
      if lanes is None: plane[sel] = value
      else:
        cur = plane[sel]
        np.copyto(cur, value, where=lanes, casting="unsafe")
        plane[sel] = cur


def mask_to_bits(mask: np.ndarray) -> np.ndarray:
  """(k, 32) bool -> (k,) uint32 lane mask."""
  return np.packbits(mask, axis=1, bitorder="little").view("<u4")[:, 0].astype(U32)


def bits_to_mask(bits: np.ndarray) -> np.ndarray:
  """(k,) uint32 lane mask -> (k, 32) bool."""
  return (np.asarray(bits, U32)[:, None] & LANE_BITS) != 0


def inline_constant(code: int, bits: int, lo16: bool = False):
  """The value of an inline constant code as a raw pattern of `bits` bits (None if not one)."""
  if 128 <= code <= 208:
    v = code - 128 if code <= 192 else 192 - code
    return v & ((1 << bits) - 1)
  if code in isa.INLINE_FLOATS:
    _, b16, b32, b64 = isa.INLINE_FLOATS[code]
    return b16 if lo16 else b64 if bits == 64 else b32
  return None


def scalar_source(code: int, bits: int, literal: int | None, *, kind16: bool = False, signed64: bool = False,
                  float64: bool = False, packed16: bool = False):
  """A reader fn(w, sel) -> (k,) array (or numpy scalar) of a scalar/constant source.

  bits is 32 or 64; kind16 selects 16-bit inline float patterns; packed16 replicates a 16-bit
  inline constant into both halves."""
  dt = U64 if bits == 64 else U32
  if code < 128:
    if code == NULL: return lambda w, sel, z=dt(0): z
    if bits == 64: return lambda w, sel: w.read_s64(code, sel)
    return lambda w, sel: w.S[code][sel]
  const = inline_constant(code, bits, kind16)
  if const is not None:
    if packed16: const = (const & 0xFFFF) * 0x10001
    c = dt(const)
    return lambda w, sel: c
  if code == isa.LITERAL:
    if literal is None: raise EmulatorError("literal operand without a literal dword")
    if bits == 64:
      if float64: value = literal << 32
      elif signed64 and literal >> 31: value = literal | 0xFFFFFFFF_00000000
      else: value = literal
    else: value = literal
    c = dt(value)
    return lambda w, sel: c
  if code == SRC_SCC: return lambda w, sel: w.scc[sel].astype(dt)
  if code == SRC_VCCZ: return lambda w, sel: (w.S[VCC][sel] == 0).astype(dt)
  if code == SRC_EXECZ: return lambda w, sel: (w.S[EXEC][sel] == 0).astype(dt)
  apertures = {235: SHARED_BASE, 236: SHARED_BASE + 0xFFFF_FFFF, 237: PRIVATE_BASE, 238: PRIVATE_BASE + 0xFFFF_FFFF}
  if code in apertures:
    v = apertures[code] if bits == 64 else apertures[code] >> 32   # 32-bit read gives the high half
    c = dt(v)
    return lambda w, sel: c
  raise EmulatorError(f"unsupported source operand code {code}")


def vector_source(code: int, bits: int, literal: int | None, n_vgprs: int, **kw):
  """A reader fn(w, sel) -> array broadcastable to (k, 32) for a 9-bit VALU source field."""
  if code >= isa.VGPR_BASE:
    r = code - isa.VGPR_BASE
    check_vgpr(r, 2 if bits == 64 else 1, n_vgprs)
    if bits == 64:
      return lambda w, sel: w.V[r][sel].astype(U64) | (w.V[r + 1][sel].astype(U64) << np.uint64(32))
    return lambda w, sel: w.V[r][sel]
  read = scalar_source(code, bits, literal, **kw)
  if code < 128 or code in (SRC_SCC, SRC_VCCZ, SRC_EXECZ):
    return lambda w, sel: read(w, sel)[:, None]
  return read


def check_vgpr(r: int, count: int, n_vgprs: int) -> None:
  if r + count > n_vgprs:
    raise EmulatorError(f"v{r}" + (f"..v{r + count - 1}" if count > 1 else "") +
                        f" is beyond the {n_vgprs} VGPRs the kernel descriptor allocates "
                        "(granulated_workitem_vgpr_count)")
