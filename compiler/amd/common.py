"""Values, constants and small helpers the AMD renderer's emitters share (compiler/render_amd.py and the emitter
mixins beside this module)."""
from __future__ import annotations
import struct
from dataclasses import dataclass
from ..uop import UOp
from ..dtype import DType, dtypes
from .inst import Reg, Sub, Imm
from baregrad.drivers.amd import isa

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
LOCAL_SIZE = 256
KERNARG_PTR, WORKGROUP_ID_X, LOCAL_ID = Reg("s", 2, phys=0), Reg("s", 1, phys=2), Reg("v", 1, phys=0)
NULL = Reg("s", 1, phys=isa.SPECIAL_SREGS["null"])     # a discarded carry-out (v_mad_*64)
USER_SGPRS, RESERVED_VGPRS = 2, 1
GROUP_IDS, LOCAL_IDS = ("gid0", "gid1", "gid2"), ("lid0", "lid1", "lid2")
WORKITEM_ID_BITS = 10                  # packed work-item ids: x bits 0-9, y 10-19, z 20-29 (AMDGPUUsage, GFX11)
MAX_WORKGROUP_THREADS = 1024
# VGPR budget (LLVM AMDGPUBaseInfo.cpp, gfx1100 = Feature1_5xVGPRs, wave32; see compiler/render_amd.py's docstring)
TOTAL_VGPRS_PER_SIMD, VGPR_ALLOC_GRANULE, ADDRESSABLE_VGPRS, SIMDS_PER_WGP, WAVE = 1536, 24, 256, 4, 32
LDS_BYTES = 65536                      # per workgroup (RDNA3 ISA guide, "Local Data Share"; AMDGPUUsage: 64 KiB)
LDS_ALIGN = 16
DS_LOAD = {1: "u8", 2: "u16", 4: "b32", 8: "b64"}
# v_cmp_class masks (RDNA3 ISA guide, V_CMP_CLASS_F32): bit 3 -normal, 4 -denormal, 7 +denormal, 8 +normal
CLASS_FINITE_NONZERO, CLASS_POSITIVE_FINITE_NONZERO = 0x198, 0x180
# gfx1100's VALU trans-use hazard (LLVM AMDGPU.td FeatureVALUTransUseHazard, GCNHazardRecognizer::
# fixVALUTransUseHazard): a transcendental's (v_rcp/v_sqrt/v_rsq...) result is read only after
# `s_waitcnt_depctr va_vdst(0)` (0xfff, what LLVM inserts) or enough other VALUs
DEPCTR_VA_VDST_0 = 0x0FFF
MEM_LOAD = {1: "u8", 2: "u16", 4: "b32", 8: "b64"}
MEM_STORE = {1: "b8", 2: "b16", 4: "b32", 8: "b64"}
# instructions whose destination may not be renamed to an accumulator that is also a source (gfx11 forbids an
# overlap of the 64-bit mad destination with its sources; WMMA and compares have destinations of their own)
NO_RETARGET = ("v_mad_u64", "v_mad_i64", "v_wmma", "v_cmp", "v_readfirstlane", "v_readlane")


@dataclass(frozen=True)
class LDSAddress:
  """Where a lane's workgroup-memory access goes: VGPR `addr` + the DS instruction's offset field."""
  addr: object
  offset: int


@dataclass(frozen=True)
class GlobalAddress:
  """Where a lane's global access goes: `saddr` (an SGPR pair) + `vaddr` (a 32-bit VGPR offset) + `offset`, or with
  saddr OFF a 64-bit VGPR address + offset (RDNA3 ISA guide, "Global, Scratch and Flat Instructions")."""
  vaddr: object
  saddr: object
  offset: int = 0

  def mods(self) -> dict: return {"offset": self.offset} if self.offset else {}


GLOBAL_OFFSET = 4096        # the signed 13-bit immediate offset of GLOBAL instructions: -4096..4095 (gfx11)
CHUNK = 2 * GLOBAL_OFFSET   # one SGPR base per 8 KiB window of constant offsets
MAX_CHUNK_BASES = 12        # SGPR pairs spent on such bases; beyond, a VGPR add per (index, window)
SGPR_SLACK = 32             # SGPRs kept free of them for loop counters, saved EXEC masks and the like


class Const:
  """A constant value: `bits` of its register form (a 64-bit pattern when size == 2)."""
  __slots__ = ("bits", "size", "is_float")
  def __init__(self, bits: int, size: int, is_float: bool = False): self.bits, self.size, self.is_float = bits, size, is_float


def f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


def imm32(bits: int) -> Imm: return Imm(b - (1 << 32) if (b := bits & 0xFFFFFFFF) >= 0xFFFFFFF0 else b)


def fits32(u: UOp) -> bool:
  lo, hi = u.vrange
  return isinstance(lo, int) and isinstance(hi, int) and -(1 << 31) <= lo and hi < (1 << 31)


def is_narrow(u: UOp) -> bool:
  """An 8-byte integer value held in one (sign-extended) dword."""
  return u.dtype is not None and u.dtype.itemsize == 8 and (u.dtype.is_int or u.dtype == dtypes.index) and fits32(u)


def is_wide(dt: DType, u: UOp | None = None) -> bool:
  """Two dwords: float64 and 8-byte integers that are not narrow."""
  return dt == F64 or (dt.itemsize == 8 and not (u is not None and is_narrow(u)))


def signed(dt: DType) -> bool: return dt.kind == 'i' or dt == dtypes.index


def value_class(dt: DType) -> str:
  """How a dtype's values are held and computed: f32, f64, or integers i32/u32/i64/u64 (bool, the 8/16-bit
  integers and the storage bits of float16/bfloat16 are 32-bit integers in registers)."""
  if dt in (F32, F64): return f"f{8 * dt.itemsize}"
  return ("i" if signed(dt) else "u") + ("64" if dt.itemsize == 8 else "32")



def _is_vgpr(x) -> bool: return isinstance(x, (Reg, Sub)) and x.file == "v"


def _narrow_const(v: int, dt: DType) -> int:
  bits = 8 * dt.itemsize
  v &= (1 << bits) - 1
  if signed(dt) and v >> (bits - 1): v -= 1 << bits
  return v & 0xFFFFFFFF
