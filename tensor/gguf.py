"""Read (and, for tests, write) GGUF files: llama.cpp/ggml's weight format, versions 2 and 3.

Layout (ggml `docs/gguf.md`; all little-endian, nothing aligned unless said):
  "GGUF"                        magic, 4 bytes
  uint32 version                2 or 3 (3 only added big-endian files; version 1 had 32-bit counts and lengths)
  uint64 tensor_count, uint64 metadata_kv_count
  metadata_kv_count times       key (string), uint32 value type, value
  tensor_count times            name (string), uint32 n_dims, uint64 ne[n_dims] (innermost first), uint32 ggml type,
                                uint64 offset (relative to the data section, a multiple of the alignment)
  padding                       to a multiple of `general.alignment` (a uint32 key; 32 when absent)
  data section                  each tensor's blocks (ggml_quants.py) at its offset
A string is a uint64 byte length and that many UTF-8 bytes. A value is one of the VALUE_TYPES; an array is a uint32
element type, a uint64 count and the elements (arrays may nest).

Every field is checked as it is read, each problem a `GGUFError` naming the file, the key or tensor and the field:
lengths and counts must fit in the bytes left (so a hostile count allocates nothing) and under the MAX_* bounds, types
must be known, keys and tensor names unique, bools 0 or 1, strings UTF-8; a tensor has at most GGML_MAX_DIMS dims,
non-zero dims multiplying to at most MAX_NUMEL (safetensors.py explains the bound), an innermost dim that is a whole
number of blocks, an aligned offset, and data inside the file not overlapping another tensor's. llama.cpp also asks
the tensors to be packed in file order; nothing here depends on that, so it is not required.

The file is memory-mapped, never read whole: metadata is parsed from the map, and `GGUFFile.raw(name)` is a
zero-copy view of a tensor's bytes. `load_gguf` hands back quantized tensors as lazy dequantizing Tensors over a uint8
buffer holding exactly the file's blocks (ggml_quants.dequantize): realizing one on its own (`.numpy()`, `.realize()`)
stores its float32 values, while a consumer such as a matmul fuses the dequantization and reads the blocks.
"""
from __future__ import annotations
import dataclasses, math, mmap, os, struct
from dataclasses import dataclass
from typing import Any
import numpy as np
from baregrad.compiler.dtype import dtypes
from .tensor import Tensor, _device_arg
from .device_dtypes import require_float64
from .safetensors import _short
from .ggml_quants import TYPES, PLAIN, LAYOUTS, DEQUANTIZABLE, GGMLTypeError, ggml_type, nbytes, dequantize


class GGUFError(ValueError):
  pass


MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32        # docs/gguf.md: "If no alignment is specified, assume it is 32"
GGML_MAX_DIMS = 4             # ggml.h; gguf.cpp refuses a tensor with more
MAX_NAME = 64                 # docs/gguf.md: a tensor name "must be at most 64 bytes long"
MAX_KEY = 65535               # docs/gguf.md: a key "must be at most 2^16-1 bytes long"
MAX_STRING = 256 << 20        # a longer metadata string is refused (the largest real ones, embedded tokenizer JSON,
                              # are tens of MiB)
MAX_ARRAY = 1 << 26           # elements in one array (vocabularies hold a few 100k)
MAX_NESTING = 8               # arrays of arrays of ...: the spec allows nesting, real files use none
MAX_NUMEL = 1 << 48           # as in safetensors.py: bound on the product of a shape's non-zero dims

# value type id -> (name, little-endian numpy dtype of one value); STRING and ARRAY have no fixed size
STRING, ARRAY = 8, 9
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
  0: ("UINT8", "<u1"), 1: ("INT8", "<i1"), 2: ("UINT16", "<u2"), 3: ("INT16", "<i2"), 4: ("UINT32", "<u4"),
  5: ("INT32", "<i4"), 6: ("FLOAT32", "<f4"), 7: ("BOOL", "<u1"), 8: ("STRING", None), 9: ("ARRAY", None),
  10: ("UINT64", "<u8"), 11: ("INT64", "<i8"), 12: ("FLOAT64", "<f8"),
}
BOOL, UINT32, INT32, INT64, UINT64, FLOAT32 = 7, 4, 5, 11, 10, 6
_MIN_SIZE = {STRING: 8, ARRAY: 12} | {k: np.dtype(v).itemsize for k, (_, v) in VALUE_TYPES.items() if v}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
  name: str
  shape: tuple[int, ...]   # numpy/PyTorch order: ggml's ne reversed
  ggml_type: int
  type_name: str
  offset: int              # of the first byte, from the start of the file
  nbytes: int


def _align(n: int, alignment: int) -> int: return -(-n // alignment) * alignment


class _Cursor:
  """Reads fields from the map at `pos`; every read is bounds-checked and a failure names the field."""
  def __init__(self, mm, size: int, path: str):
    self.mm, self.size, self.path, self.pos = mm, size, path, 0

  def fail(self, where: str, msg: str):
    raise GGUFError(f"{self.path}: {where}: {msg}")

  def need(self, n: int, where: str):
    if n > self.size - self.pos:
      self.fail(where, f"needs {n} bytes at offset {self.pos}, but the file ends at {self.size} (truncated?)")

  def u32(self, where: str) -> int:
    self.need(4, where)
    (v,) = _U32.unpack_from(self.mm, self.pos)
    self.pos += 4
    return v

  def u64(self, where: str) -> int:
    self.need(8, where)
    (v,) = _U64.unpack_from(self.mm, self.pos)
    self.pos += 8
    return v

  def string(self, where: str, limit: int) -> str:
    n = self.u64(f"{where} (string length)")
    if n > limit: self.fail(where, f"string length {n} is over the {limit}-byte limit")
    self.need(n, where)
    try: s = self.mm[self.pos:self.pos + n].decode("utf-8")
    except UnicodeDecodeError as e: self.fail(where, f"string is not valid UTF-8 ({e.reason} at byte {e.start})")
    self.pos += n
    return s

  def value(self, vtype: int, where: str, depth: int = 0) -> Any:
    if vtype == STRING: return self.string(where, MAX_STRING)
    if vtype == ARRAY: return self.array(where, depth + 1)
    if vtype not in VALUE_TYPES: self.fail(where, f"unknown value type {vtype} (known: 0..{max(VALUE_TYPES)})")
    np_dt, size = VALUE_TYPES[vtype][1], _MIN_SIZE[vtype]
    self.need(size, where)
    v = np.frombuffer(self.mm, np_dt, 1, self.pos)[0].item()
    if vtype == BOOL:
      if v > 1: self.fail(where, f"BOOL value is {v}, must be 0 or 1")
      v = bool(v)
    self.pos += size
    return v

  def array(self, where: str, depth: int) -> list:
    if depth > MAX_NESTING: self.fail(where, f"arrays nested more than {MAX_NESTING} deep")
    etype = self.u32(f"{where} (array element type)")
    count = self.u64(f"{where} (array length)")
    if etype not in VALUE_TYPES: self.fail(where, f"unknown array element type {etype} (known: 0..{max(VALUE_TYPES)})")
    ename = VALUE_TYPES[etype][0]
    if count > MAX_ARRAY: self.fail(where, f"array of {count} {ename} values is over the {MAX_ARRAY}-element limit")
    least, left = count * _MIN_SIZE[etype], self.size - self.pos
    if least > left:
      self.fail(where, f"array of {count} {ename} values needs at least {least} bytes, but only {left} remain in the "
                       f"file (a corrupt count or a truncated file)")
    if etype == STRING: return self._strings(where, count)
    if etype == ARRAY: return [self.array(f"{where}[{i}]", depth + 1) for i in range(count)]
    arr = np.frombuffer(self.mm, VALUE_TYPES[etype][1], count, self.pos)
    if etype == BOOL:
      if count and (bad := int(arr.max())) > 1: self.fail(where, f"BOOL array holds {bad}, must be 0 or 1")
      arr = arr.astype(bool)
    self.pos += least
    return arr.tolist()

  def _strings(self, where: str, count: int) -> list[str]:
    """`count` strings, in one tight loop (vocabularies hold 100k+ of them)."""
    mm, pos, end, unpack, out = self.mm, self.pos, self.size, _U64.unpack_from, []
    for i in range(count):
      if end - pos < 8: self.pos = pos; self.need(8, f"{where}[{i}] (string length)")
      (n,) = unpack(mm, pos)
      pos += 8
      if n > MAX_STRING: self.fail(f"{where}[{i}]", f"string length {n} is over the {MAX_STRING}-byte limit")
      if n > end - pos: self.pos = pos; self.need(n, f"{where}[{i}]")
      try: out.append(mm[pos:pos + n].decode("utf-8"))
      except UnicodeDecodeError as e:
        self.fail(f"{where}[{i}]", f"string is not valid UTF-8 ({e.reason} at byte {e.start})")
      pos += n
    self.pos = pos
    return out


class GGUFFile:
  """A GGUF file, parsed and checked on open: `.version`, `.metadata` (key -> value; arrays as lists), `.tensors`
  (name -> TensorInfo, in file order), `.alignment`, `.data_start`; `.raw(name)` the bytes of a tensor. The file stays
  mapped until `close()` (or the end of a `with` block); views from `raw` keep the map alive past that."""

  def __init__(self, path):
    self.path = os.fspath(path)
    try:
      with open(self.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0: raise GGUFError(f"{self.path}: the file is empty, not a GGUF file")
        self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e: raise GGUFError(f"{self.path}: cannot read ({e.strerror})") from None
    try: self._parse(_Cursor(self._mm, size, self.path))
    except BaseException:
      self.close()
      raise

  def _parse(self, cur: _Cursor):
    cur.need(4, "magic")
    magic = cur.mm[0:4]
    if magic != MAGIC:
      cur.fail("magic", f"the file starts with {bytes(magic)!r}, not {MAGIC!r}: not a GGUF file")
    cur.pos = 4
    version = cur.u32("version")
    if version not in VERSIONS:
      swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
      if version == 1: why = "GGUF version 1 (32-bit counts and lengths) is not supported; convert the file with a " \
                             "current llama.cpp (gguf-py writes version 3)"
      elif swapped in (1, 2, 3):
        why = f"version reads as {version:#x}: the file is big-endian (version {swapped}), which is not supported"
      else: why = f"version {version} is not supported (this reader reads versions {VERSIONS[0]} and {VERSIONS[1]})"
      cur.fail("version", why)
    self.version = version
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata kv count")
    # the smallest kv is a key length, a type and a uint8 (13 bytes); the smallest tensor info a name length, n_dims,
    # type and offset (24 bytes)
    least, left = n_kv * 13 + n_tensors * 24, cur.size - cur.pos
    if least > left:
      cur.fail("header", f"{n_tensors} tensors and {n_kv} metadata entries need at least {least} bytes, but only "
                         f"{left} remain (a corrupt count or a truncated file)")
    self.metadata: dict[str, Any] = {}
    self.alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv): self._read_kv(cur, i)
    infos: list[tuple[TensorInfo, int]] = []   # (info with its offset still relative to the data section, offset)
    names = set()
    for i in range(n_tensors):
      info = self._read_tensor_info(cur, i, names)
      names.add(info.name)
      infos.append((info, info.offset))
    self.data_start = _align(cur.pos, self.alignment)
    self.tensors: dict[str, TensorInfo] = {}
    data_len = cur.size - self.data_start
    for info, begin in infos:
      end = begin + info.nbytes
      if info.nbytes and end > data_len:
        cur.fail(f"tensor {_short(info.name)}", f"data [{begin}, {end}) of the data section runs past the end of the "
                                                f"file (the data section starts at {self.data_start} and holds "
                                                f"{max(data_len, 0)} bytes)")
      self.tensors[info.name] = dataclasses.replace(info, offset=self.data_start + begin)
    spans = sorted((begin, begin + info.nbytes, info.name) for info, begin in infos if info.nbytes)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
      if b1 < e0:
        cur.fail(f"tensor {_short(n1)}", f"data [{b1}, {e1}) overlaps the data [{b0}, {e0}) of tensor {_short(n0)}")

  def _read_kv(self, cur: _Cursor, i: int):
    key = cur.string(f"metadata entry {i} key", MAX_KEY)
    where = f"metadata key {_short(key)}"
    if key in self.metadata: cur.fail(where, "the key appears twice")
    vtype = cur.u32(f"{where} (value type)")
    self.metadata[key] = value = cur.value(vtype, where)
    if key == "general.alignment":   # gguf.cpp reads it as a uint32 and refuses one that is not a power of two
      if vtype != UINT32: cur.fail(where, f"must be a UINT32, got {VALUE_TYPES.get(vtype, (vtype,))[0]}")
      if value == 0 or value & (value - 1): cur.fail(where, f"alignment {value} is not a power of two")
      self.alignment = value

  def _read_tensor_info(self, cur: _Cursor, i: int, names: set) -> TensorInfo:
    """Tensor info i; its offset is still relative to the data section."""
    name = cur.string(f"tensor info {i} name", MAX_NAME)
    where = f"tensor {_short(name)}"
    if name in names: cur.fail(where, "the name appears twice")
    n_dims = cur.u32(f"{where} (n_dims)")
    if n_dims > GGML_MAX_DIMS: cur.fail(where, f"n_dims is {n_dims}, more than ggml's {GGML_MAX_DIMS}")
    ne = [cur.u64(f"{where} (dimension {d})") for d in range(n_dims)]
    if any(n >= 1 << 63 for n in ne): cur.fail(where, f"dimensions {ne} hold a negative int64")
    shape = tuple(reversed(ne))
    if math.prod(n for n in ne if n) > MAX_NUMEL:   # at most 4 multiplications of numbers < 2**63: cheap
      cur.fail(where, f"shape {shape} is too large: its non-zero dims multiply to more than {MAX_NUMEL} elements")
    type_id = cur.u32(f"{where} (type)")
    if type_id not in TYPES:
      cur.fail(where, f"unknown ggml type {type_id} (known: {', '.join(f'{t.name}={i}' for i, t in TYPES.items())})")
    t = TYPES[type_id]
    try: size = nbytes(t, shape)
    except GGMLTypeError as e: cur.fail(where, str(e))
    offset = cur.u64(f"{where} (offset)")
    if offset % self.alignment:
      cur.fail(where, f"data offset {offset} is not a multiple of the alignment {self.alignment}")
    return TensorInfo(name, shape, type_id, t.name, offset, size)

  def raw(self, name: str) -> np.ndarray:
    """The bytes of tensor `name`: a read-only uint8 view of the map (no copy)."""
    if name not in self.tensors: raise KeyError(f"{self.path}: no tensor {_short(name)}")
    if self._mm is None: raise ValueError(f"{self.path}: the file is closed")
    info = self.tensors[name]
    if info.nbytes == 0: return np.empty(0, np.uint8)
    return np.frombuffer(self._mm, np.uint8, info.nbytes, info.offset)

  def close(self):
    mm, self._mm = getattr(self, "_mm", None), None
    if mm is None: return
    try: mm.close()
    except BufferError: pass   # a view from raw() is alive: the map is unmapped when the last one goes

  def __enter__(self): return self
  def __exit__(self, *exc): self.close()


def _tensor(f: GGUFFile, info: TensorInfo, dev) -> Tensor:
  raw = f.raw(info.name)
  if info.type_name in PLAIN:
    dt, np_dt = PLAIN[info.type_name]
    if dt == dtypes.float64:
      require_float64(dev, f"load_gguf: tensor {info.name!r} is F64 (load the file on CPU, device='CPU', and cast it "
                           f"to float32 there)")
    arr = raw.view(np_dt).reshape(info.shape)
    if dt == dtypes.bfloat16: return Tensor(arr, dtype=dtypes.uint16, device=dev).bitcast(dt)
    return Tensor(arr, dtype=dt, device=dev)
  if info.type_name in LAYOUTS:
    return dequantize(Tensor(raw, dtype=dtypes.uint8, device=dev), info.ggml_type, info.shape)
  raise GGUFError(f"{f.path}: tensor {_short(info.name)}: ggml type {info.type_name} cannot be dequantized here "
                  f"(supported: {', '.join(DEQUANTIZABLE)}); GGUFFile(path).raw(name) gives its bytes")


def load_gguf(path, device: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata, tensors) of a GGUF file, tensors on `device` (default: the default device), in file order.

  F32/F16/BF16 and the integer types are plain tensors of their dtype. A quantized tensor is a lazy float32 Tensor
  over a uint8 buffer holding its blocks (ggml_quants.dequantize): the dequantization runs inside whatever kernel
  consumes it. A type that cannot be dequantized here raises a GGUFError (GGUFFile.raw still reads its bytes)."""
  dev = _device_arg(device)
  with GGUFFile(path) as f:   # each tensor's bytes are copied to the device straight from the map
    return f.metadata, {name: _tensor(f, info, dev) for name, info in f.tensors.items()}


# ---------------- writer (small: for tests and tools) ----------------

_NP_VALUE_TYPE = {np.dtype(v).newbyteorder("<"): k for k, (_, v) in VALUE_TYPES.items() if v and k != BOOL}
_NP_GGML_TYPE = {np.dtype(np_dt).newbyteorder("<"): name for name, (_, np_dt) in PLAIN.items() if name != "BF16"}


def _string(s) -> bytes:
  b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
  return _U64.pack(len(b)) + b


def _value_type(v, where: str) -> int:
  if isinstance(v, (bool, np.bool_)): return BOOL
  if isinstance(v, np.generic) and (t := _NP_VALUE_TYPE.get(v.dtype.newbyteorder("<"))) is not None: return t
  if isinstance(v, int): return INT32 if -2**31 <= v < 2**31 else INT64 if -2**63 <= v < 2**63 else UINT64
  if isinstance(v, float): return FLOAT32
  if isinstance(v, (str, bytes)): return STRING
  if isinstance(v, (list, tuple, np.ndarray)): return ARRAY
  raise GGUFError(f"write_gguf: {where}: cannot store a {type(v).__name__} (use bool, int, float, str, a numpy scalar "
                  f"for an exact type, or a list / 1-D numpy array of those)")


def _encode_array(v, where: str) -> bytes:
  if isinstance(v, np.ndarray):
    if v.ndim != 1: raise GGUFError(f"write_gguf: {where}: a numpy array value must be 1-D, got shape {v.shape}")
    etype = BOOL if v.dtype == np.bool_ else _NP_VALUE_TYPE.get(v.dtype.newbyteorder("<"))
    if etype is None: raise GGUFError(f"write_gguf: {where}: numpy dtype {v.dtype} has no GGUF value type")
    data = v.astype(VALUE_TYPES[etype][1]).tobytes()
    return _U32.pack(etype) + _U64.pack(len(v)) + data
  items = list(v)
  types = [_value_type(x, f"{where}[{i}]") for i, x in enumerate(items)]
  if all(isinstance(x, int) and not isinstance(x, bool) for x in items):   # plain ints: the widest one needs
    etype = max(types, key=[INT32, INT64, UINT64].index, default=INT32)
  elif len(set(types)) > 1: raise GGUFError(f"write_gguf: {where}: array items have different types")
  else: etype = types[0]
  if etype not in (STRING, ARRAY): return _encode_array(np.array(items, dtype=VALUE_TYPES[etype][1] if etype != BOOL
                                                                 else np.bool_), where)
  body = b"".join(_string(x) if etype == STRING else _encode_array(x, f"{where}[{i}]") for i, x in enumerate(items))
  return _U32.pack(etype) + _U64.pack(len(items)) + body


def _encode_value(v, where: str) -> bytes:
  vtype = _value_type(v, where)
  if vtype == STRING: body = _string(v)
  elif vtype == ARRAY: body = _encode_array(v, where)
  else: body = np.array(v, dtype=VALUE_TYPES[vtype][1]).tobytes()
  return _U32.pack(vtype) + body


def write_gguf(path, metadata: dict, tensors: dict, version: int = 3, alignment: int = DEFAULT_ALIGNMENT) -> None:
  """Write a GGUF file. `metadata`: key -> bool, int (INT32, or INT64/UINT64 when it needs them), float (FLOAT32), str,
  a numpy scalar (its exact type), or a list / 1-D numpy array of those (lists may nest). `tensors`: name -> a numpy
  array (F32, F16, F64, I8..I64), or (raw bytes, ggml type, numpy shape) for any ggml type. `general.alignment` is
  written when `alignment` is not 32."""
  if version not in VERSIONS: raise GGUFError(f"write_gguf: version must be 2 or 3, got {version!r}")
  if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
    raise GGUFError(f"write_gguf: alignment must be a power of two, got {alignment!r}")
  kv = dict(metadata)
  if "general.alignment" in kv and int(kv["general.alignment"]) != alignment:
    raise GGUFError(f"write_gguf: metadata general.alignment {kv['general.alignment']} differs from "
                    f"alignment={alignment}")
  if alignment != DEFAULT_ALIGNMENT or "general.alignment" in kv: kv["general.alignment"] = np.uint32(alignment)
  head = [MAGIC, _U32.pack(version), _U64.pack(len(tensors)), _U64.pack(len(kv))]
  for key, v in kv.items():
    if not isinstance(key, str): raise GGUFError(f"write_gguf: metadata keys must be strings, got {key!r}")
    head += [_string(key), _encode_value(v, f"metadata key {key!r}")]
  blobs, pos = [], 0
  for name, value in tensors.items():
    if isinstance(value, np.ndarray):
      tname = _NP_GGML_TYPE.get(value.dtype.newbyteorder("<"))
      if tname is None: raise GGUFError(f"write_gguf: tensor {name!r}: numpy dtype {value.dtype} has no ggml type")
      t, shape = ggml_type(tname), value.shape
      data = np.ascontiguousarray(value, dtype=PLAIN[tname][1]).tobytes()
    else:
      try:
        data, t, shape = value
        t, shape, data = ggml_type(t), tuple(int(s) for s in shape), bytes(data)
        if len(data) != (want := nbytes(t, shape)):
          raise GGMLTypeError(f"{t.name} of shape {shape} takes {want} bytes, got {len(data)}")
      except (GGMLTypeError, TypeError, ValueError) as e: raise GGUFError(f"write_gguf: tensor {name!r}: {e}") from None
    ne = tuple(reversed(shape))
    head += [_string(name), _U32.pack(len(ne)), *map(_U64.pack, ne), _U32.pack(t.id), _U64.pack(pos)]
    blobs += [data, b"\0" * (_align(len(data), alignment) - len(data))]
    pos += _align(len(data), alignment)
  header = b"".join(head)
  header += b"\0" * (_align(len(header), alignment) - len(header))
  tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(header)
    for b in blobs: f.write(b)
  os.replace(tmp, path)   # readers never see a half-written file


__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "load_gguf", "write_gguf", "VALUE_TYPES"]
