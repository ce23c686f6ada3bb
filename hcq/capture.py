"""CAPTURE=run.bgq: record every queue submission of ExecItems into one self-contained, replayable file.

What is recorded (the format is described in tools/BGQ_FORMAT.md):
  programs     binary, name, source, parameters, launch meta (once each)
  allocations  every device allocation a command touched (views resolve to their base + offset), with its
               contents just before its first use in the capture and its contents at the end
  commands     in submission order: `exec` (program, buffers as [allocation, offset, nbytes], variable values),
               `copy`, host `write`s (copyin, with the bytes), host `sync` points; JIT replays are recorded
               with every patch resolved (the input/output buffers and variables of that call)

The recorder keeps every allocation it has seen alive until the file is written (at exit, or on `flush()`),
so their final contents can be read: capture a few steps of a long run, not all of it.
"""
from __future__ import annotations
import atexit, hashlib, json, os, platform, struct, sys, time, zlib
from dataclasses import dataclass

MAGIC = b"BGQCAPT\x00"
END_MAGIC = b"BGQEND\x00\x00"
VERSION = 1
FIXED = struct.Struct("<8sIIQQ")      # magic, version, flags, header length, blob section length
TRAILER = struct.Struct("<32s8s")     # SHA-256 of every byte before the trailer, END_MAGIC
BLOB_ALIGN = 64


class CaptureError(ValueError):
  """A capture file that cannot be read (not a capture, truncated, corrupted, a newer version)."""


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
  """A loaded capture: the JSON header and the blob section."""
  path: str
  header: dict
  blob_section: memoryview

  def blob(self, index: int | None) -> bytes | None:
    if index is None: return None
    try: offset, stored, length, encoding, digest = self.header["blobs"][index]
    except (IndexError, TypeError, ValueError) as e:
      raise CaptureError(f"{self.path}: corrupted capture: blob #{index} is not in the blob table") from e
    data = bytes(self.blob_section[offset:offset + stored])
    if encoding == "zlib":
      try: data = zlib.decompress(data)
      except zlib.error as e: raise CaptureError(f"{self.path}: corrupted capture: blob #{index} does not decompress ({e})") from e
    if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
      raise CaptureError(f"{self.path}: corrupted capture: blob #{index} does not match its SHA-256")
    return data

  @property
  def programs(self) -> list[dict]: return self.header["programs"]
  @property
  def allocations(self) -> list[dict]: return self.header["allocations"]
  @property
  def commands(self) -> list[dict]: return self.header["commands"]


def load_capture(path: str) -> Capture:
  """Read and check a capture file; CaptureError says what is wrong with it."""
  try:
    with open(path, "rb") as f: raw = f.read()
  except OSError as e:
    raise CaptureError(f"cannot read capture {path}: {e.strerror}") from e
  if len(raw) < 8 or raw[:8] != MAGIC:
    raise CaptureError(f"{path} is not a baregrad capture: it starts with {raw[:8]!r}, expected {MAGIC!r} "
                       "(write one with `baregrad capture -o run.bgq -- python script.py` or CAPTURE=run.bgq)")
  if len(raw) < FIXED.size:
    raise CaptureError(f"{path}: truncated capture: {len(raw)} bytes, the fixed header alone is {FIXED.size}")
  _, version, _, head_len, blob_len = FIXED.unpack_from(raw, 0)
  if version > VERSION:
    raise CaptureError(f"{path}: capture format version {version} is newer than this baregrad reads (version {VERSION})")
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
  except ValueError as e:
    raise CaptureError(f"{path}: corrupted capture: the header is not valid JSON ({e})") from e
  for key in ("programs", "allocations", "commands", "devices", "blobs"):
    if key not in header: raise CaptureError(f"{path}: corrupted capture: the header has no {key!r}")
  start = FIXED.size + head_len
  return Capture(path, header, memoryview(raw)[start:start + blob_len])


# ---- recording (hcq/trace.py calls these when CAPTURE is set) ----

def device_info(dev) -> dict:
  """What a replay checks before it loads the programs: the device kind and its code target."""
  info = {"kind": dev.name, "driver": type(dev.driver).__name__, "machine": platform.machine()}
  target = getattr(dev.driver, "target", None) or getattr(dev.driver, "arch", None)
  if target is not None: info["target"] = str(target)
  if dev.name == "CPU":
    try:
      from baregrad.drivers.cpu import cc
      info["compiler"] = cc.compiler_version(cc.find_compiler())
    except Exception: pass
  return info


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
    return dev

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

  def program(self, prog) -> int:
    pid = self.program_ids.get(prog)
    if pid is None:
      pid = self.program_ids[prog] = len(self.programs)
      self.programs.append({"id": pid, "device": prog.device, "name": prog.name, "binary": self.blobs.add(prog.binary),
                            "source": self.blobs.add(prog.source.encode()) if prog.source else None,
                            "n_params": prog.n_params, "variables": list(prog.variables), "meta": jsonable(prog.meta)})
    return pid

  def _exec(self, sub: int, dev, prog, bufs: list, var_vals: dict, meta: dict):
    return {"op": "exec", "sub": sub, "device": dev.name, "queue": "compute", "program": self.program(prog),
            "bufs": [self.ref(b, dev) for b in bufs], "vars": [int(var_vals[v]) for v in prog.variables],
            "global_size": list(meta.get("global_size", (1, 1, 1))), "local_size": [1, 1, 1],
            "name": prog.name, "flops": meta.get("flops", 0), "bytes": meta.get("bytes", 0)}

  def _copy(self, sub: int, dev, dst, src, name: str):
    return {"op": "copy", "sub": sub, "device": dev.name, "queue": "compute", "dst": self.ref(dst, dev),
            "src": self.ref(src, dev), "nbytes": dst.nbytes, "name": name}

  def record_items(self, items: list):
    """One run_schedule call: one submission per device."""
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
    dev, role = graph.dev, getattr(graph, "capture_role", {})
    self._device(dev.name)
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
    self.devices.setdefault(dev.name, dev)
    base = buf.base if buf.base is not None else buf
    whole = buf.base is None and data.nbytes == base.nbytes
    aid = self._alloc(base, dev, skip_snapshot=whole)
    self.commands.append({"op": "write", "device": dev.name, "dst": [aid, buf.offset if buf.base is not None else 0, data.nbytes],
                          "data": self.blobs.add(data)})

  def sync(self, dev):
    if self.commands and self.commands[-1]["op"] == "sync" and self.commands[-1]["device"] == dev.name: return
    if dev.name in self.devices: self.commands.append({"op": "sync", "device": dev.name})

  def flush(self) -> int:
    """Read every allocation's final contents and write the file; returns its size in bytes."""
    for dev in self.devices.values():
      dev.timeline.wait(dev.timeline_value)
      dev.check_faults()
    allocations = []
    for base, record in self.allocs:
      dev = self.devices[record["device"]]
      allocations.append(dict(record, final=self.blobs.add(dev.driver.view(base.addr, base.nbytes))))
    header = {
      "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.start)), "argv": sys.argv,
      "python": platform.python_version(), "devices": {n: device_info(d) for n, d in self.devices.items()},
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
  from . import trace
  return trace.recorder.flush() if trace.recorder is not None else None
