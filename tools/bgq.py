"""Reading and writing `.bgq` captures for the tools (trim, diff, replay --list): the hashes of a capture's programs
and contents, one line per command, and writing a new capture made of parts of a checked one.

The file format, its writer and its checking reader live in hcq/capture.py (tools/BGQ_FORMAT.md); everything here
works on a `Capture` that `load_capture` has checked, and what it writes is read back with `load_capture` before it
is handed on, so a derived file passes every check a capture from a real run does.
"""
from __future__ import annotations
import hashlib, os
from baregrad.hcq.capture import MAGIC, BlobStore, Capture, CaptureError, load_capture, write_capture


def is_capture(path: str) -> bool:
  """Whether `path` starts like a capture (the magic only: load_capture checks the rest)."""
  try:
    with open(path, "rb") as f: return f.read(len(MAGIC)) == MAGIC
  except OSError: return False


def file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""): h.update(chunk)
  return h.hexdigest()


def blob_sha(cap: Capture, index: int | None) -> str | None:
  """The SHA-256 (hex) the blob table records for blob `index` (checked when the blob is read), None for no blob."""
  return None if index is None else cap.header["blobs"][index][4]


def program_hashes(cap: Capture, p: dict) -> tuple[str | None, str]:
  """(source SHA-256, binary SHA-256) of program record `p`."""
  return blob_sha(cap, p["source"]), blob_sha(cap, p["binary"])


def launch_size(cap: Capture, c: dict) -> tuple[list, list]:
  """An exec's (global size, local size); a local size of [1, 1, 1] in a command means the program's own."""
  local = c["local_size"]
  if local == [1, 1, 1]: local = cap.programs[c["program"]]["meta"].get("local_size", [1, 1, 1])
  return c["global_size"], local


def command_line(cap: Capture, i: int) -> str:
  """One line describing command `i`: what `baregrad replay --list` prints."""
  c = cap.commands[i]
  op = c["op"]
  if op == "exec":
    g, l = launch_size(cap, c)
    bufs = " ".join(f"#{a}[{off}:{off + n}]" for a, off, n in c["bufs"])
    var = f" vars {c['vars']}" if c["vars"] else ""
    return f"{i:5d}  exec   {c['name']:28s} program {c['program']}, global {g}, local {l}, bufs {bufs}{var}"
  if op == "copy":
    return f"{i:5d}  copy   {c['name']:28s} {c['nbytes']} bytes #{c['src'][0]}[{c['src'][1]}:] -> #{c['dst'][0]}[{c['dst'][1]}:]"
  if op == "write":
    a, off, n = c["dst"]
    return f"{i:5d}  write  {'host write':28s} {n} bytes -> #{a}[{off}:{off + n}]"
  if op == "submit": return f"{i:5d}  submit {'submission ' + str(c['sub']):28s} ({c['origin']})"
  return f"{i:5d}  sync   {'host wait':28s}"


def listing(cap: Capture) -> str:
  """Every command of a capture, one per line, with the indices `--kernel`, `trim --from/--to` take."""
  n = {op: sum(1 for c in cap.commands if c["op"] == op) for op in ("exec", "copy", "write")}
  head = (f"{cap.path}: {len(cap.commands)} commands ({n['exec']} kernel launches, {n['copy']} copies, {n['write']} host "
          f"writes), {len(cap.programs)} programs, {len(cap.allocations)} allocations")
  return "\n".join([head, f"{'index':>5s}  op     name"] + [command_line(cap, i) for i in range(len(cap.commands))])


class Derived:
  """A new capture assembled from parts of a checked one: blobs are copied (read, so inflated and checked against
  their SHA-256, then stored once each) only when a record of the new file refers to them."""

  def __init__(self, cap: Capture):
    self.cap = cap
    self.blobs = BlobStore()

  def blob(self, index: int | None) -> int | None:
    """The new file's index of `cap`'s blob `index`."""
    return None if index is None else self.blobs.add(self.cap.blob(index))

  def data(self, data: bytes) -> int: return self.blobs.add(data)

  def write(self, path: str, header: dict) -> Capture:
    """Write `header` (its blob references made with `blob`/`data`) and read it back with every check."""
    if os.path.abspath(path) == os.path.abspath(self.cap.path):
      raise CaptureError(f"{path}: refusing to overwrite the capture it is made from")
    write_capture(path, header, self.blobs)
    return load_capture(path)
