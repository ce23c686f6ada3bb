"""CAPTURE=run.bgq: record every queue submission of ExecItems into one self-contained, replayable file.

What is recorded (the format is described in tools/BGQ_FORMAT.md):
  host         the machine and OS; per device its kind and target, driver and firmware versions, GPU id
  programs     binary, name, source, parameters, the bytes each buffer parameter needs, launch meta (once each)
  allocations  every device allocation a command touched (views resolve to their base + offset), with its
               contents just before its first use in the capture and its contents at the end
  commands     in submission order: `exec` (program, buffers as [allocation, offset, nbytes], variable values),
               `copy`, host `write`s (copyin, with the bytes), host `sync` points; JIT replays are recorded
               with every patch resolved (the input/output buffers and variables of that call)

The recorder keeps every allocation it has seen alive until the file is written (at exit, or on `flush()`),
so their final contents can be read: capture a few steps of a long run, not all of it.

A capture is input from whoever sent it: `load_capture` checks every header field it uses (types, ranges, indices,
sizes, and that every kernel's buffer arguments are as large as the kernel was compiled for) and bounds every
size and decompression before replay touches anything; CaptureError names the field that is wrong.
"""
from __future__ import annotations
import atexit, hashlib, json, os, platform, re, struct, sys, time, zlib
from dataclasses import dataclass
from baregrad.drivers.decode import FORMATS as WORD_FORMATS, WORD_BYTES, WordLog, pack_words
from .exec_item import global_size

MAGIC = b"BGQCAPT\x00"
END_MAGIC = b"BGQEND\x00\x00"
VERSION = 2                           # 2: programs record `param_nbytes` (version 1 did not; it is refused)
FIXED = struct.Struct("<8sIIQQ")      # magic, version, flags, header length, blob section length
TRAILER = struct.Struct("<32s8s")     # SHA-256 of every byte before the trailer, END_MAGIC
BLOB_ALIGN = 64

# limits a reader enforces (tools/BGQ_FORMAT.md, "What a reader checks")
MAX_HEADER_BYTES = 64 << 20           # the JSON header
MAX_NESTING = 32                      # lists/objects inside each other in the header
MAX_NBYTES = 1 << 36                  # one allocation or one blob, uncompressed (64 GiB)
MAX_TOTAL_NBYTES = 1 << 38            # all allocations together (256 GiB)
ZLIB_MAX_RATIO = 1032                 # deflate inflates at most ~1032:1 (zlib.net/zlib_tech.html, "Maximum compression")
MAX_DEVICES = 16                      # entries in `devices`
MAX_PARAMS = 1024                     # buffer parameters of one program
MAX_THREADS = 4096                    # meta.threads: CPU cores a kernel is split across
MAX_GRID = (1 << 31) - 1              # one dimension of a launch's global size (blocks)
MAX_BLOCK = 1024                      # threads in one block (local size), NV and AMD
INT64 = (-(1 << 63), (1 << 63) - 1)


class CaptureError(ValueError):
  """A capture file that cannot be read (not a capture, truncated, corrupted, an unsupported version, a field
  that is wrong); the message is one line naming the file and what is wrong."""


def jsonable(x):
  if isinstance(x, dict): return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)): return [jsonable(v) for v in x]
  if x is None or isinstance(x, (bool, int, float, str)): return x
  return str(x)


# ---- the file format ----

class BlobStore:
  """Byte strings stored once each (deduplicated by SHA-256), zlib-compressed when that saves space."""

  def __init__(self):
    self.index: dict[bytes, int] = {}
    self.data: list[bytes] = []
    self.table: list[list] = []     # [offset, stored length, length, encoding, sha256 hex]
    self.size = 0

  def add(self, data) -> int:
    data = bytes(data)
    digest = hashlib.sha256(data).digest()
    if digest in self.index: return self.index[digest]
    packed = zlib.compress(data, 1) if len(data) >= 256 else data
    encoding = "zlib" if len(packed) < len(data) * 0.9 else "raw"
    stored = packed if encoding == "zlib" else data
    self.size = (self.size + BLOB_ALIGN - 1) // BLOB_ALIGN * BLOB_ALIGN
    self.table.append([self.size, len(stored), len(data), encoding, digest.hex()])
    self.data.append(stored)
    self.size += len(stored)
    self.index[digest] = len(self.data) - 1
    return self.index[digest]


def write_capture(path: str, header: dict, blobs: BlobStore) -> int:
  """Write atomically (temporary file + rename); returns the file size."""
  header = dict(header, format="bgq", version=VERSION, blobs=blobs.table)
  head = json.dumps(header, separators=(",", ":")).encode()
  if len(head) > MAX_HEADER_BYTES:
    raise CaptureError(f"{path}: the header would be {len(head) >> 20} MiB, more than the {MAX_HEADER_BYTES >> 20} MiB a "
                       "reader accepts: capture fewer steps of the run")
  sha = hashlib.sha256()
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    def put(b: bytes):
      f.write(b); sha.update(b)
    put(FIXED.pack(MAGIC, VERSION, 0, len(head), blobs.size))
    put(head)
    pos = 0
    for (offset, *_), stored in zip(blobs.table, blobs.data):
      if offset > pos: put(bytes(offset - pos))
      put(stored)
      pos = offset + len(stored)
    if blobs.size > pos: put(bytes(blobs.size - pos))
    f.write(TRAILER.pack(sha.digest(), END_MAGIC))
    size = f.tell()
  os.replace(tmp, path)
  return size


@dataclass
class Capture:
  """A loaded capture: the JSON header (every field checked by `check_header`) and the blob section."""
  path: str
  header: dict
  blob_section: memoryview
  checked: bool = False

  def blob(self, index: int | None) -> bytes | None:
    """The bytes of blob `index`, inflated to at most its declared length and checked against its SHA-256."""
    if index is None: return None
    table = self.header["blobs"]
    if type(index) is not int or not 0 <= index < len(table):
      raise CaptureError(f"{self.path}: corrupted capture: blob {_show(index)} is not in the blob table ({len(table)} blobs)")
    offset, stored, length, encoding, digest = table[index]
    data = bytes(self.blob_section[offset:offset + stored])
    if encoding == "zlib": data = self._inflate(index, data, length)
    if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
      raise CaptureError(f"{self.path}: corrupted capture: blobs[{index}] does not match its SHA-256")
    return data

  def _inflate(self, index: int, data: bytes, length: int) -> bytes:
    """zlib-decompress without ever producing more than `length` + 1 bytes: a small blob cannot inflate into gigabytes."""
    inflater = zlib.decompressobj()
    try:
      out = inflater.decompress(data, length + 1)
    except zlib.error as e:
      raise CaptureError(f"{self.path}: corrupted capture: blobs[{index}] does not decompress ({e})") from e
    if len(out) > length:
      raise CaptureError(f"{self.path}: corrupted capture: blobs[{index}] inflates to more than its declared length of "
                         f"{length} bytes (blobs[{index}][2]); refusing to inflate it further")
    if not inflater.eof:
      raise CaptureError(f"{self.path}: corrupted capture: blobs[{index}] ends before its compressed stream does")
    if inflater.unused_data:
      raise CaptureError(f"{self.path}: corrupted capture: blobs[{index}] has {len(inflater.unused_data)} bytes after its "
                         "compressed stream")
    return out

  @property
  def programs(self) -> list[dict]: return self.header["programs"]
  @property
  def allocations(self) -> list[dict]: return self.header["allocations"]
  @property
  def commands(self) -> list[dict]: return self.header["commands"]


def load_capture(path: str) -> Capture:
  """Read a capture file and check all of it (layout, checksum, every header field); CaptureError says, in one
  line, what is wrong."""
  try:
    with open(path, "rb") as f: raw = f.read()
  except OSError as e:
    raise CaptureError(f"cannot read capture {path}: {e.strerror}") from e
  if len(raw) < 8 or raw[:8] != MAGIC:
    raise CaptureError(f"{path} is not a baregrad capture: it starts with {raw[:8]!r}, expected {MAGIC!r} "
                       "(write one with `baregrad capture -o run.bgq -- python script.py` or CAPTURE=run.bgq)")
  if len(raw) < FIXED.size:
    raise CaptureError(f"{path}: truncated capture: {len(raw)} bytes, the fixed header alone is {FIXED.size}")
  _, version, flags, head_len, blob_len = FIXED.unpack_from(raw, 0)
  _check_version(path, version)
  if flags != 0:
    raise CaptureError(f"{path}: corrupted capture: the flags field is {flags:#x}; version {VERSION} defines no flags "
                       "(expected 0)")
  if head_len > MAX_HEADER_BYTES:
    raise CaptureError(f"{path}: corrupted capture: the header length field says {head_len} bytes; a reader accepts at most "
                       f"{MAX_HEADER_BYTES >> 20} MiB of header")
  want = FIXED.size + head_len + blob_len + TRAILER.size
  if len(raw) < want:
    raise CaptureError(f"{path}: truncated capture: the file has {len(raw)} bytes, its header says {want} "
                       "(was the capturing process killed before it wrote the file?)")
  if len(raw) > want:
    raise CaptureError(f"{path}: corrupted capture: {len(raw) - want} unexpected bytes after the end")
  digest, end = TRAILER.unpack_from(raw, want - TRAILER.size)
  if end != END_MAGIC:
    raise CaptureError(f"{path}: corrupted capture: the trailer's end marker is {end!r}, expected {END_MAGIC!r}")
  actual = hashlib.sha256(memoryview(raw)[:want - TRAILER.size]).digest()
  if actual != digest:
    raise CaptureError(f"{path}: corrupted capture: checksum mismatch (SHA-256 of the contents is {actual.hex()[:16]}..., "
                       f"the file says {digest.hex()[:16]}...)")
  try:
    header = json.loads(raw[FIXED.size:FIXED.size + head_len])
  except RecursionError:
    raise CaptureError(f"{path}: corrupted capture: the header nests lists/objects too deeply to parse "
                       f"(a capture nests at most {MAX_NESTING})") from None
  except ValueError as e:
    raise CaptureError(f"{path}: corrupted capture: the header is not valid JSON ({e})") from e
  start = FIXED.size + head_len
  cap = Capture(path, header, memoryview(raw)[start:start + blob_len])
  check_header(cap)
  return cap


def _check_version(path: str, version: int):
  if version == VERSION: return
  if version > VERSION:
    raise CaptureError(f"{path}: capture format version {version} is newer than this baregrad reads (version {VERSION}); "
                       "replay it with a newer baregrad")
  if version == 0: raise CaptureError(f"{path}: corrupted capture: format version 0 does not exist (versions start at 1)")
  raise CaptureError(f"{path}: capture format version {version} is older than this baregrad reads (version {VERSION}): it does "
                     "not record the bytes each kernel argument needs, which replay checks before it runs a kernel; "
                     "capture the program again with this baregrad")


# ---- checking a header: a capture is input, every field replay uses is checked before anything runs ----

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
OPS = ("exec", "copy", "submit", "write", "sync")
DEVICE_STRINGS = ("driver", "machine", "target", "compiler", "driver_version", "firmware", "gpu_id")   # optional, in `devices`
_REQUIRED = object()


def _show(value) -> str:
  """A JSON value from the file, short and on one line, for an error message."""
  if isinstance(value, list): return f"a list of {len(value)} items"
  if isinstance(value, dict): return f"an object with {len(value)} keys"
  try: text = json.dumps(value)
  except ValueError: text = type(value).__name__     # an integer too long to print
  return text if len(text) <= 40 else text[:37] + "..."


def _child(field: str, key) -> str:
  """The name of `field`'s member `key`: programs[0].meta.threads, devices["a b"]."""
  if isinstance(key, int): return f"{field}[{key}]"
  name = f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,39}", key) else f"[{_show(key)}]"
  return f"{field}{name}".lstrip(".")


def check_header(cap: Capture):
  """Check every header field replay uses (tools/BGQ_FORMAT.md, "What a reader checks"): types, ranges, indices into the
  programs, allocations and blobs, sizes, and that every exec's buffers are as large as its program was compiled for.
  The first wrong field raises CaptureError naming it."""
  _HeaderCheck(cap.path).check(cap.header, len(cap.blob_section))
  cap.checked = True


class _HeaderCheck:
  def __init__(self, path: str):
    self.path = path
    self.blob_lengths: list[int] = []
    self.devices: dict = {}
    self.programs: list[dict] = []
    self.allocations: list[dict] = []

  def fail(self, field: str, problem: str):
    if len(field) > 120: field = field[:60] + "..." + field[-40:]
    raise CaptureError(f"{self.path}: corrupted capture: header field {field} {problem}")

  # ---- one value ----

  def member(self, obj: dict, key: str, field: str, default=_REQUIRED):
    if key in obj: return obj[key]
    if default is _REQUIRED: self.fail(_child(field, key), "is missing")
    return default

  def integer(self, value, field: str, lo: int, hi: int) -> int:
    if type(value) is not int: self.fail(field, f"is {_show(value)}, expected an integer in [{lo}, {hi}]")
    if not lo <= value <= hi: self.fail(field, f"is {_show(value)}, outside [{lo}, {hi}]")
    return value

  def number(self, value, field: str) -> float:
    if type(value) not in (int, float) or not 0 <= value <= INT64[1]:
      self.fail(field, f"is {_show(value)}, expected a number in [0, {INT64[1]}]")
    return value

  def string(self, value, field: str, pattern: str | None = None, what: str = "", max_len: int = 256) -> str:
    if type(value) is not str: self.fail(field, f"is {_show(value)}, expected a string")
    if len(value) > max_len: self.fail(field, f"is a string of {len(value)} characters, expected at most {max_len}")
    if pattern is not None and not re.fullmatch(pattern, value): self.fail(field, f"is {_show(value)}, expected {what}")
    if not value.isprintable(): self.fail(field, f"is {_show(value)}, which holds control characters")
    return value

  def array(self, value, field: str, length: int | None = None) -> list:
    if type(value) is not list: self.fail(field, f"is {_show(value)}, expected a list")
    if length is not None and len(value) != length: self.fail(field, f"has {len(value)} items, expected {length}")
    return value

  def record(self, value, field: str) -> dict:
    if type(value) is not dict: self.fail(field, f"is {_show(value)}, expected an object")
    return value

  def index(self, value, field: str, count: int, what: str) -> int:
    if type(value) is not int: self.fail(field, f"is {_show(value)}, expected the index of one of the capture's {what}")
    if not 0 <= value < count:
      self.fail(field, f"is {value}, but the capture has {count} {what}" + (f" (0 to {count - 1})" if count else ""))
    return value

  def ident(self, record: dict, i: int, field: str):
    rid = self.member(record, "id", field)
    if rid != i or type(rid) is not int:
      self.fail(f"{field}.id", f"is {_show(rid)}, expected {i} (records are listed in id order)")

  def device(self, value, field: str) -> str:
    name = self.string(value, field, max_len=64)
    if name not in self.devices:
      self.fail(field, f"is {_show(name)}, which is not one of the capture's devices ({', '.join(self.devices) or 'none'})")
    return name

  def blob(self, value, field: str, nullable: bool, length: int | None = None) -> int | None:
    if value is None:
      if not nullable: self.fail(field, "is null, expected the index of a blob")
      return None
    i = self.index(value, field, len(self.blob_lengths), "blobs")
    if length is not None and self.blob_lengths[i] != length:
      self.fail(field, f"is blob {i} of {self.blob_lengths[i]} bytes, expected {length} bytes")
    return i

  def launch(self, value, field: str, most: int) -> list[int]:
    """A global or local size: 3 positive integers (a local size: at most MAX_BLOCK threads in all)."""
    dims = [self.integer(d, f"{field}[{k}]", 1, most) for k, d in enumerate(self.array(value, field, length=3))]
    if most == MAX_BLOCK and dims[0] * dims[1] * dims[2] > MAX_BLOCK:
      self.fail(field, f"is {dims}, {dims[0] * dims[1] * dims[2]} threads in a block; at most {MAX_BLOCK}")
    return dims

  def ref(self, value, field: str, device: str) -> tuple[int, int, int]:
    """A buffer reference [allocation, byte offset, nbytes] inside its allocation, on `device`."""
    self.array(value, field, length=3)
    a = self.index(value[0], f"{field}[0]", len(self.allocations), "allocations")
    offset = self.integer(value[1], f"{field}[1]", 0, MAX_NBYTES)
    nbytes = self.integer(value[2], f"{field}[2]", 0, MAX_NBYTES)
    alloc = self.allocations[a]
    if offset + nbytes > alloc["nbytes"]:
      self.fail(field, f"is bytes [{offset}, {offset + nbytes}) of allocation {a}, which has {alloc['nbytes']} bytes")
    if alloc["device"] != device:
      self.fail(field, f"is in allocation {a} on {alloc['device']}, but the command runs on {device}")
    return a, offset, nbytes

  # ---- the sections ----

  def check(self, header, blob_section_len: int):
    if type(header) is not dict: self.fail("(the whole header)", f"is {_show(header)}, expected a JSON object")
    self.nesting(header)
    if self.member(header, "format", "") != "bgq": self.fail("format", f"is {_show(header['format'])}, expected \"bgq\"")
    if self.member(header, "version", "") != VERSION or type(header["version"]) is not int:
      self.fail("version", f"is {_show(header['version'])}, but the file's fixed header says version {VERSION}")
    for key, kind in (("created", str), ("python", str), ("argv", list), ("submissions", int)):
      if key in header and type(header[key]) is not kind: self.fail(key, f"is {_show(header[key])}, expected a {kind.__name__}")
    for key in ("host", "trimmed"):
      if key in header: self.strings(header[key], key)
    self.blob_table(self.member(header, "blobs", ""), blob_section_len)
    self.device_table(self.member(header, "devices", ""))
    for i, p in enumerate(self.array(self.member(header, "programs", ""), "programs")): self.program(i, p)
    self.programs = header["programs"]
    for i, a in enumerate(self.array(self.member(header, "allocations", ""), "allocations")): self.allocation(i, a)
    self.allocations = header["allocations"]
    total = sum(a["nbytes"] for a in self.allocations)
    if total > MAX_TOTAL_NBYTES:
      self.fail("allocations", f"add up to {total} bytes, more than the {MAX_TOTAL_NBYTES >> 30} GiB a replay recreates")
    for i, c in enumerate(self.array(self.member(header, "commands", ""), "commands")): self.command(i, c)

  def nesting(self, header: dict):
    stack = [(header, None, 1)]      # (list or object, (parent's path, key), depth): the name is made only to fail
    while stack:
      value, path, depth = stack.pop()
      if depth > MAX_NESTING:
        keys = []
        while path is not None: path, key = path; keys.append(key)
        field = ""
        for key in reversed(keys): field = _child(field, key)
        self.fail(field, f"nests lists/objects {depth} deep; a capture nests at most {MAX_NESTING}")
      for key, child in (value.items() if type(value) is dict else enumerate(value)):
        if type(child) is dict or type(child) is list: stack.append((child, (path, key), depth + 1))

  def blob_table(self, table, section_len: int):
    for i, entry in enumerate(self.array(table, "blobs")):
      field = f"blobs[{i}]"
      self.array(entry, field, length=5)
      offset = self.integer(entry[0], f"{field}[0] (offset)", 0, section_len)
      stored = self.integer(entry[1], f"{field}[1] (stored length)", 0, section_len - offset)
      encoding = self.string(entry[3], f"{field}[3] (encoding)", r"raw|zlib", "\"raw\" or \"zlib\"")
      if encoding == "raw":
        if entry[2] != stored or type(entry[2]) is not int:
          self.fail(f"{field}[2] (length)", f"is {_show(entry[2])}, but a raw blob's length is its stored length, {stored}")
      else:
        most = min(MAX_NBYTES, stored * ZLIB_MAX_RATIO)
        if type(entry[2]) is not int or not 0 <= entry[2] <= most:
          self.fail(f"{field}[2] (length)", f"is {_show(entry[2])}, expected an integer in [0, {most}] ({stored} zlib bytes "
                    f"inflate to at most {ZLIB_MAX_RATIO} times as many, and a blob holds at most {MAX_NBYTES >> 30} GiB)")
      self.string(entry[4], f"{field}[4] (SHA-256)", r"[0-9a-f]{64}", "64 lowercase hex digits")
      self.blob_lengths.append(entry[2])

  def device_table(self, devices):
    if len(self.record(devices, "devices")) > MAX_DEVICES:
      self.fail("devices", f"has {len(devices)} entries, at most {MAX_DEVICES}")
    for name, info in devices.items():
      field = _child("devices", name)
      self.string(name, f"{field} (the device's name)", max_len=64)
      self.record(info, field)
      self.string(self.member(info, "kind", field), f"{field}.kind", max_len=64)
      for key in DEVICE_STRINGS:
        if key in info: self.string(info[key], f"{_child(field, key)}")
      if "emulated" in info and type(info["emulated"]) is not bool:
        self.fail(_child(field, "emulated"), f"is {_show(info['emulated'])}, expected true or false")
    self.devices = devices

  def strings(self, value, field: str):
    """An optional record of short printable strings (`host`, `trimmed`): reports print them."""
    if len(self.record(value, field)) > 16: self.fail(field, f"has {len(value)} entries, at most 16")
    for key, v in value.items():
      self.string(key, f"{field} (a key)", IDENTIFIER, "a name", max_len=32)
      if type(v) is int: self.integer(v, _child(field, key), 0, INT64[1])
      else: self.string(v, _child(field, key))

  def program(self, i: int, p):
    field = f"programs[{i}]"
    self.record(p, field)
    self.ident(p, i, field)
    self.device(self.member(p, "device", field), f"{field}.device")
    self.string(self.member(p, "name", field), f"{field}.name", IDENTIFIER, "a C identifier")
    self.blob(self.member(p, "binary", field), f"{field}.binary", nullable=False)
    self.blob(self.member(p, "source", field), f"{field}.source", nullable=True)
    n_params = self.integer(self.member(p, "n_params", field), f"{field}.n_params", 0, MAX_PARAMS)
    for j, v in enumerate(self.array(self.member(p, "variables", field), f"{field}.variables")):
      self.string(v, f"{field}.variables[{j}]", IDENTIFIER, "a C identifier")
    if len(p["variables"]) > MAX_PARAMS:
      self.fail(f"{field}.variables", f"has {len(p['variables'])} items, at most {MAX_PARAMS}")
    sizes = self.array(self.member(p, "param_nbytes", field), f"{field}.param_nbytes")
    if len(sizes) != n_params:
      self.fail(f"{field}.param_nbytes", f"has {len(sizes)} sizes, but the program takes {n_params} buffers ({field}.n_params)")
    for j, n in enumerate(sizes): self.integer(n, f"{field}.param_nbytes[{j}]", 0, MAX_NBYTES)
    meta = self.record(self.member(p, "meta", field), f"{field}.meta")
    if "threads" in meta: self.integer(meta["threads"], f"{field}.meta.threads", 1, MAX_THREADS)
    if "global_size" in meta: self.launch(meta["global_size"], f"{field}.meta.global_size", MAX_GRID)
    if "local_size" in meta: self.launch(meta["local_size"], f"{field}.meta.local_size", MAX_BLOCK)

  def allocation(self, i: int, a):
    field = f"allocations[{i}]"
    self.record(a, field)
    self.ident(a, i, field)
    self.device(self.member(a, "device", field), f"{field}.device")
    nbytes = self.integer(self.member(a, "nbytes", field), f"{field}.nbytes", 0, MAX_NBYTES)
    self.string(self.member(a, "dtype", field), f"{field}.dtype", r"[a-z][a-z0-9_]*", "a dtype name", max_len=32)
    self.blob(self.member(a, "initial", field), f"{field}.initial", nullable=True, length=nbytes)
    self.blob(self.member(a, "final", field, None), f"{field}.final", nullable=True, length=nbytes)

  def command(self, i: int, c):
    field = f"commands[{i}]"
    self.record(c, field)
    op = self.member(c, "op", field)
    if op not in OPS: self.fail(f"{field}.op", f"is {_show(op)}, expected one of {', '.join(OPS)}")
    device = self.device(self.member(c, "device", field), f"{field}.device")
    if op in ("exec", "copy", "submit"): self.integer(self.member(c, "sub", field), f"{field}.sub", 0, INT64[1])
    if op in ("exec", "copy"):
      self.string(self.member(c, "queue", field), f"{field}.queue", max_len=32)
      self.string(self.member(c, "name", field), f"{field}.name")
    if op == "exec": self.exec(c, field, device)
    elif op == "copy":
      dst = self.ref(self.member(c, "dst", field), f"{field}.dst", device)
      src = self.ref(self.member(c, "src", field), f"{field}.src", device)
      nbytes = self.integer(self.member(c, "nbytes", field), f"{field}.nbytes", 0, MAX_NBYTES)
      if nbytes > min(dst[2], src[2]):
        self.fail(f"{field}.nbytes", f"is {nbytes}, more than its dst ({dst[2]} bytes) or src ({src[2]} bytes) holds")
    elif op == "write":
      dst = self.ref(self.member(c, "dst", field), f"{field}.dst", device)
      self.blob(self.member(c, "data", field), f"{field}.data", nullable=False, length=dst[2])
    elif op == "submit":
      self.string(self.member(c, "origin", field), f"{field}.origin", max_len=32)
    if "hw" in c: self.hw(c["hw"], f"{field}.hw")

  def hw(self, value, field: str):
    """The words the command's submission handed the engines (optional; `baregrad decode` reads them)."""
    for k, seg in enumerate(self.array(value, field)):
      f = f"{field}[{k}]"
      self.record(seg, f)
      self.string(self.member(seg, "queue", f), f"{f}.queue", max_len=32)
      fmt = self.member(seg, "format", f)
      if fmt not in WORD_FORMATS: self.fail(f"{f}.format", f"is {_show(fmt)}, expected one of {', '.join(WORD_FORMATS)}")
      i = self.blob(self.member(seg, "words", f), f"{f}.words", nullable=False)
      if self.blob_lengths[i] % WORD_BYTES[fmt]:
        self.fail(f"{f}.words", f"is blob {i} of {self.blob_lengths[i]} bytes, not whole {WORD_BYTES[fmt]}-byte words")
      for j, pair in enumerate(self.array(self.member(seg, "memory", f), f"{f}.memory")):
        self.array(pair, f"{f}.memory[{j}]", length=2)
        self.integer(pair[0], f"{f}.memory[{j}][0]", 0, 2**64 - 1)
        self.blob(pair[1], f"{f}.memory[{j}][1]", nullable=False)

  def exec(self, c: dict, field: str, device: str):
    """A kernel launch: the arguments its program takes, each buffer as large as the program was compiled for."""
    pid = self.index(self.member(c, "program", field), f"{field}.program", len(self.programs), "programs")
    prog = self.programs[pid]
    what = f"program {pid} ({prog['name']})"
    if prog["device"] != device: self.fail(f"{field}.device", f"is {device}, but {what} is a {prog['device']} program")
    bufs = self.array(self.member(c, "bufs", field), f"{field}.bufs")
    if len(bufs) != prog["n_params"]:
      self.fail(f"{field}.bufs", f"has {len(bufs)} buffers, but {what} takes {prog['n_params']} (programs[{pid}].n_params)")
    for j, ref in enumerate(bufs):
      a, _, nbytes = self.ref(ref, f"{field}.bufs[{j}]", device)
      need = prog["param_nbytes"][j]
      if nbytes < need:
        self.fail(f"{field}.bufs[{j}]", f"is {nbytes} bytes of allocation {a}, but {what} was compiled for {need} bytes in "
                  f"argument {j} (programs[{pid}].param_nbytes[{j}]); refusing to run it on a smaller buffer")
    values = self.array(self.member(c, "vars", field), f"{field}.vars")
    if len(values) != len(prog["variables"]):
      self.fail(f"{field}.vars", f"has {len(values)} values, but {what} takes {len(prog['variables'])} "
                f"(programs[{pid}].variables)")
    for j, v in enumerate(values): self.integer(v, f"{field}.vars[{j}]", *INT64)
    for key, most in (("global_size", MAX_GRID), ("local_size", MAX_BLOCK)):
      size = self.launch(self.member(c, key, field), f"{field}.{key}", most)
      compiled = prog["meta"].get(key, [1, 1, 1])
      # a local size of [1, 1, 1] means "the program's own" (the drivers read it from the program's meta); a grid
      # that depends on Variables (meta "grid") launches at most the compiled one
      smaller = key == "global_size" and "grid" in prog["meta"] and all(0 < a <= b for a, b in zip(size, compiled))
      if size != compiled and not (key == "local_size" and size == [1, 1, 1]) and not smaller:
        self.fail(f"{field}.{key}", f"is {size}, but {what} was compiled for {compiled} (programs[{pid}].meta.{key})")
    for key in ("flops", "bytes"): self.number(self.member(c, key, field), f"{field}.{key}")


# ---- recording (hcq/trace.py calls these when CAPTURE is set) ----

recorder: "Recorder | None" = None     # the CAPTURE= recorder (hcq/trace.py makes it on first use)


def host_info() -> dict:
  """The machine a capture (or a replay report) was made on: architecture and operating system (not its name)."""
  return {"machine": platform.machine(), "os": f"{platform.system()} {platform.release()}".strip()}


def device_info(dev) -> dict:
  """What a replay checks before it loads the programs (the device kind and its code target), and what a report
  shows of where it ran: the kernel driver and firmware versions and the GPU's id, where the driver has them."""
  info = {"kind": dev.driver.name, "driver": type(dev.driver).__name__, "machine": platform.machine()}
  if dev.driver.target is not None: info["target"] = dev.driver.target
  if dev.driver.name == "CPU":
    try:
      from baregrad.drivers.cpu import cc
      info["compiler"] = cc.compiler_version(cc.find_compiler())
    except Exception: pass
  try: facts = _driver_facts(dev.driver)
  except Exception: facts = {}     # a fact the driver does not have is left out; it never stops a capture
  # only what a reader accepts (check_header: printable strings of at most 256 characters), or the file would be refused
  info.update({k: v for k, v in facts.items() if type(v) is bool or (type(v) is str and v.isprintable() and len(v) <= 256)})
  return info


def _driver_facts(driver) -> dict:
  """Kernel driver and firmware versions and the GPU id, from what the driver read while opening the device (with EMU=1:
  what the emulated kernel driver reports). tools/doctor.py prints the same facts at length."""
  from baregrad.drivers import settings
  facts: dict = {"emulated": bool(settings.EMU) and driver.name != "CPU"}
  if driver.name == "AMD":
    props, node = driver.node.props, driver.node
    facts["driver_version"] = f"KFD {driver.version[0]}.{driver.version[1]}"
    if driver.kernel.exists("/sys/module/amdgpu/version"):
      facts["driver_version"] += f", amdgpu {driver.kernel.read_text('/sys/module/amdgpu/version').strip()[:64]}"
    facts["firmware"] = f"MEC {props.get('fw_version')}, SDMA {props.get('sdma_fw_version')}"
    facts["gpu_id"] = f"{node.gpu_id:#x} (PCI {props.get('vendor_id', 0):04x}:{props.get('device_id', 0):04x})"
  elif driver.name == "NV":
    facts["driver_version"] = str(driver.version)      # the GSP firmware ships with, and has the version of, the driver
    h = driver.uuid.hex()
    facts["gpu_id"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
  elif driver.name == "METAL":
    facts["driver_version"] = f"macOS {platform.mac_ver()[0] or '(emulated)'}"
    facts["gpu_id"] = str(driver.device_name)
  return facts


class Recorder:
  def __init__(self, path: str):
    self.path = path
    self.blobs = BlobStore()
    self.alloc_ids: dict = {}          # base Buffer -> allocation id (the Buffers are kept alive)
    self.allocs: list[tuple] = []      # (Buffer, record)
    self.program_ids: dict = {}        # Program -> id
    self.programs: list[dict] = []
    self.commands: list[dict] = []
    self.submissions = 0
    self.devices: dict[str, object] = {}
    self.flushed_at = None
    self.unsubmitted = None            # the timeline value of a submission being recorded, not yet submitted
    self.start = time.time()
    atexit.register(self.flush_at_exit)

  def _device(self, name: str):
    dev = self.devices.get(name)
    if dev is None:
      from .device import Device
      dev = self.devices[name] = Device.get(name)
      self._log_words(dev)
    return dev

  def _log_words(self, dev):
    """From now on the driver logs the words it hands its engines (drivers/decode.py WordLog)."""
    if dev.driver.word_log is None: dev.driver.word_log = WordLog()

  def _drain(self):
    """The words each device's engines got since the last call, attached to the device's last command record (the
    submission, host write or sync they came from; they are logged when the driver submits, after it is recorded)."""
    for name, dev in self.devices.items():
      log = dev.driver.word_log
      entries = log.take() if log is not None else []
      if not entries: continue
      rec = next((c for c in reversed(self.commands) if c.get("device") == name), None)
      if rec is None: continue
      for kind, fmt, words, memory in entries:
        rec.setdefault("hw", []).append({
          "queue": kind, "format": fmt, "words": self.blobs.add(pack_words(fmt, words)),
          "memory": [[addr, self.blobs.add(data)] for addr, data in memory.items()]})

  def _alloc(self, base, dev, skip_snapshot: bool = False) -> int:
    aid = self.alloc_ids.get(base)
    if aid is not None: return aid
    base.ensure_allocated()
    record = {"id": len(self.allocs), "device": dev.name, "nbytes": base.nbytes, "dtype": base.dtype.name, "initial": None}
    if not skip_snapshot:
      # nothing in flight may still write it (a JIT replay has taken its timeline value but not submitted yet)
      dev.timeline.wait(dev.timeline_value if self.unsubmitted is None else self.unsubmitted - 1)
      record["initial"] = self.blobs.add(dev.driver.view(base.addr, base.nbytes))
    self.alloc_ids[base] = aid = record["id"]
    self.allocs.append((base, record))
    return aid

  def ref(self, buf, dev) -> list[int]:
    """[allocation id, byte offset, nbytes] of a Buffer (a view resolves to its base)."""
    base, offset = (buf.base, buf.offset) if buf.base is not None else (buf, 0)
    return [self._alloc(base, dev), offset, buf.nbytes]

  def program(self, prog, arg_nbytes: list[int]) -> int:
    """The id of `prog`'s record. `arg_nbytes` are the sizes of the buffers one launch passes: a kernel's shapes are
    fixed when it is compiled, so every launch passes buffers at least as large as it uses, and `param_nbytes` keeps
    the smallest size seen per argument; replay refuses to launch it on anything smaller."""
    pid = self.program_ids.get(prog)
    if pid is None:
      pid = self.program_ids[prog] = len(self.programs)
      self.programs.append({"id": pid, "device": prog.device, "name": prog.name, "binary": self.blobs.add(prog.binary),
                            "source": self.blobs.add(str(prog.source).encode()) if prog.source else None,
                            "n_params": prog.n_params, "variables": list(prog.variables), "param_nbytes": list(arg_nbytes),
                            "meta": jsonable(prog.meta)})
    record = self.programs[pid]
    record["param_nbytes"] = [min(a, b) for a, b in zip(record["param_nbytes"], arg_nbytes)]
    return pid

  def _exec(self, sub: int, dev, prog, bufs: list, var_vals: dict, meta: dict):
    pid = self.program(prog, [b.nbytes for b in bufs])
    return {"op": "exec", "sub": sub, "device": dev.name, "queue": "compute", "program": pid,
            "bufs": [self.ref(b, dev) for b in bufs], "vars": [int(var_vals[v]) for v in prog.variables],
            "global_size": list(global_size(meta, var_vals)), "local_size": [1, 1, 1],
            "name": prog.name, "flops": meta.get("flops", 0), "bytes": meta.get("bytes", 0)}

  def _copy(self, sub: int, dev, dst, src, name: str):
    return {"op": "copy", "sub": sub, "device": dev.name, "queue": "compute", "dst": self.ref(dst, dev),
            "src": self.ref(src, dev), "nbytes": dst.nbytes, "name": name}

  def record_items(self, items: list):
    """One run_schedule call: one submission per device."""
    self._drain()
    subs: dict[str, int] = {}
    for item in items:
      dev = self._device(item.bufs[0].device)
      if dev.name not in subs:
        subs[dev.name] = self.submissions; self.submissions += 1
      sub = subs[dev.name]
      if item.program is None: self.commands.append(self._copy(sub, dev, item.bufs[0], item.bufs[1], item.name))
      else: self.commands.append(self._exec(sub, dev, item.program, item.bufs, item.var_vals, item.meta))
    for name, sub in subs.items(): self.commands.append({"op": "submit", "sub": sub, "device": name, "origin": "schedule"})

  def record_graph(self, graph, inputs: list, outputs: list, var_vals: dict, timeline_value: int):
    """One JIT replay: the graph's commands with this call's inputs, outputs and variables."""
    dev, role = graph.dev, graph.capture_role
    self._device(dev.name)
    self._drain()
    sub = self.submissions; self.submissions += 1

    def actual(b):
      r = role.get(b)
      if r is None: return b
      if r[0] == "arena": return _ArenaView(graph.arena, r[1], b.nbytes)
      return inputs[r[1]] if r[0] == "in" else outputs[r[1]]
    self.unsubmitted = timeline_value
    try:
      for it in graph.items:
        if it.program is None: self.commands.append(self._copy(sub, dev, actual(it.bufs[0]), actual(it.bufs[1]), it.name))
        else: self.commands.append(self._exec(sub, dev, it.program, [actual(b) for b in it.bufs], var_vals, it.meta))
    finally:
      self.unsubmitted = None
    self.commands.append({"op": "submit", "sub": sub, "device": dev.name, "origin": "jit"})

  def host_write(self, dev, buf, data: memoryview):
    """A copyin (called before the bytes are written)."""
    if dev.name not in self.devices: self.devices[dev.name] = dev; self._log_words(dev)
    self._drain()
    base = buf.base if buf.base is not None else buf
    whole = buf.base is None and data.nbytes == base.nbytes
    aid = self._alloc(base, dev, skip_snapshot=whole)
    self.commands.append({"op": "write", "device": dev.name, "dst": [aid, buf.offset if buf.base is not None else 0, data.nbytes],
                          "data": self.blobs.add(data)})

  def sync(self, dev):
    self._drain()
    if self.commands and self.commands[-1]["op"] == "sync" and self.commands[-1]["device"] == dev.name: return
    if dev.name in self.devices: self.commands.append({"op": "sync", "device": dev.name})

  def flush(self) -> int:
    """Read every allocation's final contents and write the file; returns its size in bytes."""
    for dev in self.devices.values():
      dev.timeline.wait(dev.timeline_value)
      dev.check_faults()
    self._drain()
    allocations = []
    for base, record in self.allocs:
      dev = self.devices[record["device"]]
      allocations.append(dict(record, final=self.blobs.add(dev.driver.view(base.addr, base.nbytes))))
    header = {
      "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.start)), "argv": sys.argv,
      "python": platform.python_version(), "host": host_info(),
      "devices": {n: device_info(d) for n, d in self.devices.items()},
      "programs": self.programs, "allocations": allocations, "commands": self.commands,
      "submissions": self.submissions,
    }
    size = write_capture(self.path, header, self.blobs)
    self.flushed_at = len(self.commands)
    return size

  def flush_at_exit(self):
    if self.flushed_at == len(self.commands) and self.flushed_at is not None: return
    try:
      size = self.flush()
      n = sum(1 for c in self.commands if c["op"] in ("exec", "copy"))
      print(f"CAPTURE: wrote {self.path} ({n} commands, {len(self.programs)} programs, {len(self.allocs)} buffers, "
            f"{size / 1e6:.2f} MB)", file=sys.stderr)
    except Exception as e:
      print(f"CAPTURE: could not write {self.path}: {type(e).__name__}: {e}", file=sys.stderr)


class _ArenaView:
  """A JIT intermediate: `nbytes` at `offset` inside the graph's arena Buffer (resolved like a Buffer view)."""
  def __init__(self, arena, offset: int, nbytes: int): self.base, self.offset, self.nbytes = arena, offset, nbytes


def flush() -> int | None:
  """Write the capture now (it is also written at exit); None when CAPTURE is not set."""
  return recorder.flush() if recorder is not None else None
