"""Data types: what an element is, how big it is, and how two of them promote."""
from __future__ import annotations
from dataclasses import dataclass
import struct
import numpy as np

_F32 = struct.Struct('<f')
_NP_DTYPES = {n: np.dtype(n) for n in ('bool', 'int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64', 'float16', 'float32', 'float64')}


@dataclass(frozen=True, eq=False)   # one object per dtype: identity equality and hashing
class DType:
  name: str
  itemsize: int
  kind: str        # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
  rank: int        # order inside its kind, for promotion
  np_name: str     # numpy dtype used on the host side
  ctype: str       # C spelling of the storage type

  @property
  def is_float(self) -> bool: return self.kind == 'f'
  @property
  def is_int(self) -> bool: return self.kind in 'iu'
  @property
  def is_unsigned(self) -> bool: return self.kind == 'u'
  @property
  def is_bool(self) -> bool: return self.kind == 'b'
  @property
  def np(self) -> np.dtype: return _NP_DTYPES[self.np_name]
  @property
  def bits(self) -> int: return self.itemsize * 8

  @property
  def min(self):
    if self.is_bool: return False
    if self.is_unsigned: return 0
    if self.is_int: return -(1 << (self.bits - 1))
    return -float('inf')

  @property
  def max(self):
    if self.is_bool: return True
    if self.is_unsigned: return (1 << self.bits) - 1
    if self.is_int: return (1 << (self.bits - 1)) - 1
    return float('inf')

  def __repr__(self): return f"dtypes.{self.name}"
  def __reduce__(self): return (_by_name, (self.name,))


class dtypes:
  bool = DType("bool", 1, 'b', 0, "bool", "unsigned char")
  int8 = DType("int8", 1, 'i', 1, "int8", "signed char")
  uint8 = DType("uint8", 1, 'u', 1, "uint8", "unsigned char")
  int16 = DType("int16", 2, 'i', 2, "int16", "short")
  uint16 = DType("uint16", 2, 'u', 2, "uint16", "unsigned short")
  int32 = DType("int32", 4, 'i', 3, "int32", "int")
  uint32 = DType("uint32", 4, 'u', 3, "uint32", "unsigned int")
  int64 = DType("int64", 8, 'i', 4, "int64", "long long")
  uint64 = DType("uint64", 8, 'u', 4, "uint64", "unsigned long long")
  float16 = DType("float16", 2, 'f', 1, "float16", "unsigned short")
  bfloat16 = DType("bfloat16", 2, 'f', 1, "float32", "unsigned short")   # numpy has no bfloat16: exported as float32
  float32 = DType("float32", 4, 'f', 2, "float32", "float")
  float64 = DType("float64", 8, 'f', 3, "float64", "double")
  # index arithmetic inside kernels (addresses, loop counters)
  index = DType("index", 8, 'i', 4, "int64", "long long")

  default_float = float32
  default_int = int32
  # torch's and C's names (torch.half, torch.long, ...); they shadow the builtins below in this class body only
  half = float16
  float = float32
  double = float64
  char = int8
  uchar = uint8
  short = int16
  ushort = uint16
  int = int32
  uint = uint32
  long = int64
  ulong = uint64

  @staticmethod
  def all() -> list[DType]:
    return [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
            dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


_BY_NAME = {d.name: d for d in dtypes.all()}
_BY_NAME.update({"half": dtypes.float16, "float": dtypes.float32, "double": dtypes.float64, "long": dtypes.int64,
                 "int": dtypes.int32, "bool_": dtypes.bool})
_BY_NP = {np.dtype(d.np_name): d for d in dtypes.all() if d is not dtypes.bfloat16}


def _by_name(name: str) -> DType: return _BY_NAME[name] if name != "index" else dtypes.index


def to_dtype(x) -> DType:
  """Accept a DType, a name ("float32", "int64", torch's and C's aliases "float", "long", "half", also written
  "torch.float32" or "dtypes.float32"), a numpy dtype or its string ("f4", "<i8"), or a numpy scalar type."""
  if isinstance(x, DType): return x
  if isinstance(x, str):
    name = x.strip()
    for prefix in ("torch.", "dtypes.", "np.", "numpy."):
      if name.startswith(prefix): name = name[len(prefix):]
    if name in _BY_NAME: return _BY_NAME[name]
    if isinstance(getattr(dtypes, name, None), DType) and name not in ("index", "default_float", "default_int"):
      return getattr(dtypes, name)
    try: npd = np.dtype(name)
    except (TypeError, ValueError): npd = None
    if npd is not None and npd in _BY_NP: return _BY_NP[npd]
    raise TypeError(f"unsupported dtype {x!r}: baregrad supports {', '.join(d.name for d in dtypes.all())} "
                    f"(and the aliases half, float, double, char, uchar, short, ushort, int, uint, long, ulong)")
  try:
    npd = np.dtype(x)
  except TypeError:
    raise TypeError(f"unsupported dtype {x!r}: expected a baregrad dtype, a dtype name or a numpy dtype") from None
  if npd in _BY_NP: return _BY_NP[npd]
  raise TypeError(f"unsupported dtype {npd}: baregrad supports {', '.join(d.name for d in dtypes.all())}")


def _raise(e): raise e


def _next_signed(itemsize: int) -> DType:
  for d in (dtypes.int16, dtypes.int32, dtypes.int64):
    if d.itemsize > itemsize: return d
  raise TypeError(f"no signed integer type holds both operands (unsigned of {itemsize} bytes)")


def promote(a: DType, b: DType) -> DType:
  """torch-like promotion of two tensor dtypes."""
  if a == b: return a
  if a.is_bool: return b
  if b.is_bool: return a
  if a.is_float and b.is_float:
    if a.itemsize == b.itemsize: return dtypes.float32   # float16 with bfloat16
    return a if a.itemsize > b.itemsize else b
  if a.is_float: return a
  if b.is_float: return b
  if a.kind == b.kind: return a if a.itemsize >= b.itemsize else b
  signed, unsigned = (a, b) if a.kind == 'i' else (b, a)
  return signed if signed.itemsize > unsigned.itemsize else _next_signed(unsigned.itemsize)


def scalar_dtype(x) -> DType:
  """The dtype a lone Python scalar gets."""
  if isinstance(x, (bool, np.bool_)): return dtypes.bool
  if isinstance(x, (int, np.integer)):
    return dtypes.default_int if -2**31 <= x < 2**31 else dtypes.int64 if -2**63 <= x < 2**63 else \
      dtypes.uint64 if 0 <= x < 2**64 else _raise(OverflowError(f"Python int {x} does not fit in int64 or uint64"))
  if isinstance(x, (float, np.floating)): return dtypes.default_float
  raise TypeError(f"unsupported scalar {x!r} of type {type(x).__name__}")


def weak_promote(tensor_dtype: DType, scalar) -> DType:
  """Python scalars are weak: they only change the tensor dtype's kind, never its size."""
  sd = scalar_dtype(scalar)
  if sd.is_bool: return tensor_dtype
  if sd.is_int: return dtypes.default_int if tensor_dtype.is_bool else tensor_dtype
  return tensor_dtype if tensor_dtype.is_float else dtypes.default_float


def truncate(value, dtype: DType):
  """Wrap/round a Python value to what `dtype` can hold (C semantics for ints, IEEE for floats)."""
  if dtype.is_bool: return bool(value)
  if dtype.is_int:
    v = int(value) & ((1 << dtype.bits) - 1)
    if dtype.kind == 'i' and v >= (1 << (dtype.bits - 1)): v -= 1 << dtype.bits
    return v
  if dtype == dtypes.float64: return float(value)
  if dtype == dtypes.bfloat16:
    f = np.array(value, dtype=np.float32).view(np.uint32)
    f = ((f + 0x7fff + ((f >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return float(f.view(np.float32))
  if dtype == dtypes.float32:
    try: return _F32.unpack(_F32.pack(value))[0]
    except OverflowError: pass   # beyond float32's range: numpy rounds to inf below
  with np.errstate(over='ignore'):
    return float(np.array(value, dtype=dtype.np))
