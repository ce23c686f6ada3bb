"""Read and write the safetensors format.

Layout of a file:
  8 bytes        N, the header length, unsigned little-endian
  N bytes        a UTF-8 JSON object: {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
                 and optionally "__metadata__": {str: str}; writers pad it with spaces
  the rest       the data area: each tensor's bytes (little-endian, C order) at [begin, end) relative to its start

Everything a reader relies on is checked, and each problem raises a `SafetensorsError` that names the tensor
and the field: the header length fits the file (and MAX_HEADER), the header is a JSON object in UTF-8 with no
key twice in one object (two readers must not disagree on which one counts) and not nested past Python's
recursion limit, dtypes are known, shapes are lists of at most MAX_NDIM non-negative ints, offsets lie inside
the data area, end - begin == prod(shape) * itemsize, tensors do not overlap and together cover the data
area exactly. Values quoted in messages are shortened, so a hostile header cannot make a huge message.

Shapes: the format allows zero-size tensors and asks only that each dimension be a non-negative integer.
Here the dimensions of a shape other than its zeros must also multiply to at most MAX_NUMEL (2**48)
elements, even when a 0 makes the tensor empty. A tensor with data is bounded by the file anyway; the rule
refuses shapes like [2**62, 0], which hold nothing but cannot come from a real tensor (an axis of 2**62
elements exists nowhere) and overflow what multiplies the other dims downstream (numpy refuses a float32
array of that shape as "too big"; strides and index arithmetic overflow 64 bits). 2**48 elements is over
a PiB of F32 — more than any machine holds — and keeps every byte offset below 2**51.
"""
from __future__ import annotations
import json, math, os, reprlib, struct
import numpy as np
from baregrad.compiler.dtype import DType, dtypes
from .tensor import Tensor, _device_arg
from .device_dtypes import require_float64


class SafetensorsError(ValueError):
  pass


# safetensors dtype name -> (baregrad dtype, little-endian numpy dtype of the raw bytes)
DTYPES: dict[str, tuple[DType, str]] = {
  "BOOL": (dtypes.bool, "|b1"), "U8": (dtypes.uint8, "|u1"), "I8": (dtypes.int8, "|i1"),
  "I16": (dtypes.int16, "<i2"), "U16": (dtypes.uint16, "<u2"), "I32": (dtypes.int32, "<i4"),
  "U32": (dtypes.uint32, "<u4"), "I64": (dtypes.int64, "<i8"), "U64": (dtypes.uint64, "<u8"),
  "F16": (dtypes.float16, "<f2"), "BF16": (dtypes.bfloat16, "<u2"), "F32": (dtypes.float32, "<f4"),
  "F64": (dtypes.float64, "<f8"),
}
NAME_OF: dict[DType, str] = {dt: name for name, (dt, _) in DTYPES.items()}
MAX_HEADER = 100 << 20   # a header larger than 100 MiB is refused (a corrupt length, not a real file)
MAX_NDIM = 32            # numpy's limit before 2.0; real tensors have a handful
MAX_NUMEL = 1 << 48      # bound on the product of a shape's non-zero dimensions (see the module docstring)

_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = 80   # characters of a string or a number
_short_repr.maxlist, _short_repr.maxdict = 8, 4     # items shown of a list or an object
_short_repr.maxlevel = 3                            # nesting shown


def _short(x) -> str:
  """repr of a header value, cut to a readable length (names and values come from the file)."""
  return _short_repr.repr(x)


def _is_int(x) -> bool: return isinstance(x, int) and not isinstance(x, bool)


def _no_duplicate_keys(pairs: list) -> dict:
  out = {}
  for k, v in pairs:
    if k in out: raise SafetensorsError(f"the key {_short(k)} appears twice in one object")
    out[k] = v
  return out


def _shape_problem(shape) -> str | None:
  """Why `shape` is not a valid shape, or None. Never multiplies past MAX_NUMEL."""
  if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
    return f"shape must be a list of non-negative ints, got {_short(shape)}"
  if len(shape) > MAX_NDIM: return f"shape has {len(shape)} dimensions, more than the {MAX_NDIM} allowed"
  count = 1
  for s in shape:
    if s == 0: continue
    count *= s   # count <= MAX_NUMEL before each step: a huge dim costs one multiplication, then we stop
    if count > MAX_NUMEL:
      return (f"shape {_short(shape)} is too large: its non-zero dimensions multiply to more than {MAX_NUMEL} "
              f"elements (a corrupt or hostile header, not a real tensor)")
  return None


def parse_header(raw: bytes, file_size: int, source: str = "<bytes>"):
  """Validate the header at the start of `raw` (which holds at least the first 8 + N bytes of a file of
  `file_size` bytes). Returns (entries, metadata, data_start): entries maps name -> (dtype name, shape,
  (begin, end)) in header order."""
  def fail(msg: str): raise SafetensorsError(f"{source}: {msg}")
  if file_size < 8: fail(f"file is {file_size} bytes, too short for the 8-byte header length")
  (n,) = struct.unpack("<Q", raw[:8])
  if n > file_size - 8:
    fail(f"header length {n} runs past the end of the file ({file_size} bytes, so at most {file_size - 8}); "
         f"the file is truncated or not a safetensors file")
  if n > MAX_HEADER: fail(f"header length {n} is larger than the {MAX_HEADER}-byte limit")
  if n < 2: fail(f"header length {n} is too small to hold a JSON object")
  try: text = bytes(raw[8:8 + n]).decode("utf-8")
  except UnicodeDecodeError as e: fail(f"header is not valid UTF-8 ({e})")
  try: header = json.loads(text, object_pairs_hook=_no_duplicate_keys)
  except SafetensorsError as e: fail(f"header is ambiguous: {e}")
  except RecursionError: fail("header JSON is nested too deeply (a safetensors header is an object of objects "
                              "holding lists of numbers)")
  except ValueError as e: fail(f"header is not valid JSON ({e})")   # also: an integer of thousands of digits
  if not isinstance(header, dict): fail(f"header must be a JSON object, got {type(header).__name__}")
  data_start, data_len = 8 + n, file_size - 8 - n
  metadata = header.pop("__metadata__", None)
  if metadata is None: metadata = {}
  elif not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    fail("__metadata__ must be an object mapping strings to strings")
  entries = {}
  for name, info in header.items():
    where = f"tensor {_short(name)}"
    if not isinstance(info, dict): fail(f"{where}: entry must be an object, got {type(info).__name__}")
    extra = set(info) - {"dtype", "shape", "data_offsets"}
    missing = {"dtype", "shape", "data_offsets"} - set(info)
    if missing: fail(f"{where}: entry lacks {sorted(missing)}")
    if extra: fail(f"{where}: entry has unknown fields {sorted(extra)}")
    dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dt, str) or dt not in DTYPES: fail(f"{where}: unknown dtype {_short(dt)} (known: {', '.join(DTYPES)})")
    if (problem := _shape_problem(shape)) is not None: fail(f"{where}: {problem}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
      fail(f"{where}: data_offsets must be a list of two ints [begin, end], got {_short(offsets)}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
      fail(f"{where}: data_offsets [{begin}, {end}] are outside the data area of {data_len} bytes "
           f"(need 0 <= begin <= end <= {data_len})")
    want = math.prod(shape) * DTYPES[dt][0].itemsize
    if end - begin != want:
      fail(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dt} of shape {_short(shape)} needs {want}")
    entries[name] = (dt, tuple(shape), (begin, end))
  # the ranges must tile the data area: sorted by begin, each starts where the previous ended
  pos, prev = 0, None
  for name, (_, _, (begin, end)) in sorted(entries.items(), key=lambda kv: (kv[1][2][0], kv[1][2][1])):
    if begin < pos: fail(f"tensor {_short(name)}: data_offsets [{begin}, {end}] overlap tensor {_short(prev)}, which ends at {pos}")
    if begin > pos: fail(f"tensor {_short(name)}: data_offsets start at {begin}, leaving bytes [{pos}, {begin}) of the data "
                         f"area unused")
    pos, prev = end, name
  if pos != data_len:
    fail(f"the tensors cover {pos} bytes of the {data_len}-byte data area: bytes [{pos}, {data_len}) are unused "
         f"(trailing garbage or a wrong header)")
  return entries, metadata, data_start


def _read(path) -> bytes:
  try:
    with open(path, "rb") as f: return f.read()
  except OSError as e: raise SafetensorsError(f"{os.fspath(path)}: cannot read ({e.strerror})") from None


def safe_load_metadata(path) -> dict[str, str]:
  """The `__metadata__` strings of a file ({} if it has none), after validating its header."""
  try:
    with open(path, "rb") as f:
      size = os.fstat(f.fileno()).st_size
      head = f.read(8)
      n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
      raw = head + f.read(min(n, max(size - 8, 0), MAX_HEADER))
  except OSError as e: raise SafetensorsError(f"{os.fspath(path)}: cannot read ({e.strerror})") from None
  return parse_header(raw, size, os.fspath(path))[1]


def read_header(path) -> tuple[dict, dict]:
  """(entries, metadata): name -> (dtype name, shape, (begin, end)), and the `__metadata__` strings."""
  raw = _read(path)
  entries, metadata, _ = parse_header(raw, len(raw), os.fspath(path))
  return entries, metadata


def load_file(path, device: str | None = None) -> dict[str, Tensor]:
  """All tensors of a safetensors file, realized on `device` (default: the default device), in header order."""
  raw = _read(path)
  entries, _, start = parse_header(raw, len(raw), os.fspath(path))
  out = {}
  for name, (dt_name, shape, (begin, end)) in entries.items():
    dt, np_dt = DTYPES[dt_name]
    arr = np.frombuffer(raw, dtype=np.dtype(np_dt), count=(end - begin) // dt.itemsize, offset=start + begin)
    arr = arr.astype(np.dtype(np_dt).newbyteorder("="), copy=True).reshape(shape)
    if dt is dtypes.float64:
      require_float64(_device_arg(device), f"load_file: entry {name!r} is F64 (load the file on CPU, device='CPU', and "
                                           f"cast it to float32 there)")
    if dt == dtypes.bfloat16: t = Tensor(arr, dtype=dtypes.uint16, device=device).bitcast(dtypes.bfloat16)
    else: t = Tensor(arr, dtype=dt, device=device)
    out[name] = t
  if out: Tensor.realize(*out.values())
  return out


def _host_bytes(name: str, value) -> tuple[str, tuple, bytes]:
  if isinstance(value, Tensor):
    dt = value.dtype
    if dt not in NAME_OF: raise SafetensorsError(f"tensor {name!r}: dtype {dt.name} has no safetensors name")
    arr = value.bitcast(dtypes.uint16).numpy() if dt == dtypes.bfloat16 else value.numpy()
  elif isinstance(value, np.ndarray):
    try: dt = next(d for d in NAME_OF if d != dtypes.bfloat16 and np.dtype(d.np) == value.dtype)
    except StopIteration: raise SafetensorsError(f"tensor {name!r}: numpy dtype {value.dtype} has no safetensors name") from None
    arr = value
  else: raise SafetensorsError(f"tensor {name!r}: expected a Tensor or a numpy array, got {type(value).__name__}")
  _, np_dt = DTYPES[NAME_OF[dt]]
  return NAME_OF[dt], tuple(int(s) for s in arr.shape), np.ascontiguousarray(arr, dtype=np.dtype(np_dt)).tobytes()


def save_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
  """The safetensors encoding of `tensors` (name -> Tensor or numpy array), data in the dict's order."""
  if not isinstance(tensors, dict): raise SafetensorsError(f"save: expected a dict of tensors, got {type(tensors).__name__}")
  if metadata is not None and (not isinstance(metadata, dict) or
                               not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
    raise SafetensorsError("save: metadata must be a dict mapping strings to strings")
  header, chunks, pos = {}, [], 0
  if metadata: header["__metadata__"] = dict(metadata)
  for name, value in tensors.items():
    if not isinstance(name, str) or not name: raise SafetensorsError(f"save: tensor names must be non-empty strings, got {name!r}")
    if name == "__metadata__": raise SafetensorsError("save: '__metadata__' is reserved and cannot name a tensor")
    dt_name, shape, data = _host_bytes(name, value)
    header[name] = {"dtype": dt_name, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
    chunks.append(data)
    pos += len(data)
  text = json.dumps(header, separators=(",", ":")).encode("utf-8")
  text += b" " * (-(8 + len(text)) % 8)   # the data area starts 8-byte aligned
  return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save_file(tensors: dict, path, metadata: dict | None = None) -> None:
  """Write `tensors` (name -> Tensor or numpy array) and optional string metadata to `path`."""
  data = save_bytes(tensors, metadata)
  tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
  with open(tmp, "wb") as f: f.write(data)
  os.replace(tmp, path)   # readers never see a half-written file


__all__ = ["SafetensorsError", "save_file", "save_bytes", "load_file", "safe_load_metadata", "read_header", "DTYPES"]
