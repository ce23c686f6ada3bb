"""The on-disk cache: compiled kernels (C objects, cubins) and BEAM search results, one file per entry.

Layout: `<root>/<kind>/<key>`, where `kind` names what is stored ("cc", "ptxas", "beam") and `key` is a hash of
everything that decides the entry's bytes (compiler build, flags, source, ...), made by `hash_key`:

    key = diskcache.hash_key(cc, version, flags, src) + ".o"
    data = diskcache.get("cc", key)          # bytes, or None: absent, unusable, or lookups are off
    diskcache.put("cc", key, data)           # True if it was written; never raises for a disk problem

`hash_key` also hashes the entry format's version, so a baregrad that stores entries another way (an older
one wrote bare objects) uses other file names in the same directories and never reads these files.

Environment (read by drivers/settings.py):
  BAREGRAD_CACHE   the cache root (default `$XDG_CACHE_HOME/baregrad`, else `~/.cache/baregrad`)
  CACHE=0          do not look entries up (they are still written)

Entries are input, not code we trust blindly: a cached C object is an ELF file that baregrad's own loader
(`drivers/cpu/elf.py`) maps and executes in this process, and a cubin is run on the GPU. Two checks protect them:

- Who can write the cache. The root and each kind's directory must be real directories owned by the current
  user and not writable by group or others (after following a symlink: a link to a directory of another user
  is refused). Directories baregrad creates are made 0700 whatever the umask, entries 0600. An entry file must
  also be a regular file owned by the current user. A directory that fails the check is not used at all:
  one warning says why and what to change, and compiling goes on without the cache. The check covers the
  root and its subdirectories, not the directories above the root.
- Whether an entry is intact. Each file starts with a header: a magic, a format version, the payload length
  and the payload's SHA-256, all checked on every read. An empty, truncated, corrupted or foreign file (or
  one larger than MAX_ENTRY) is a miss: it is removed and the caller rebuilds and rewrites it, so a damaged
  cache heals on the next run instead of failing every run until someone deletes it by hand.

The content hash catches corruption (a crash mid-write on a filesystem without atomic rename, a bad disk, a
file copied in by hand), not malice: whoever owns the cache can write a valid header for any payload. That is
why the ownership and permission check exists, and why the key, not the content hash, names the entry.
"""
from __future__ import annotations
import hashlib, json, os, re, stat, struct, tempfile, threading, warnings
from pathlib import Path
from . import settings

MAGIC = b"bgcache\x00"
VERSION = 1
# magic, format version, reserved (0), payload length, SHA-256 of the payload; little-endian
HEADER = struct.Struct("<8sIIQ32s")
MAX_ENTRY = 256 << 20          # a larger file is not a cache entry baregrad wrote (kernels are kilobytes)

_NAME = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_.-]{0,127}")   # kinds and keys: one path component, no `..`

# in-process counters (for callers and tests): entries found damaged and dropped
stats = {"bad_entries": 0}
_lock = threading.Lock()
_warned: set[str] = set()


def root() -> Path:
  """The cache root (not created here)."""
  if (d := settings.BAREGRAD_CACHE): return Path(d)
  if (d := settings.XDG_CACHE_HOME): return Path(d) / "baregrad"
  return Path.home() / ".cache" / "baregrad"


def hash_key(*parts) -> str:
  """The hex SHA-256 of `parts` (JSON values: everything that decides an entry's bytes) and the entry format."""
  return hashlib.sha256(json.dumps([f"baregrad-diskcache-{VERSION}", *parts]).encode()).hexdigest()


def lookups_enabled() -> bool:
  return settings.CACHE


def _warn_once(msg: str) -> None:
  with _lock:
    if msg in _warned: return
    _warned.add(msg)
  warnings.warn(msg)


def _check_name(what: str, name: str) -> None:
  if not isinstance(name, str) or not _NAME.fullmatch(name):
    raise ValueError(f"disk cache {what} {name!r} must be 1-128 characters of letters, digits, '_', '.', '-' "
                     f"(not starting with '.' or '-')")


def _unsafe_reason(path: Path) -> str | None:
  """Why the directory `path` must not hold cache entries, or None if it may. Follows a symlink."""
  try:
    st = os.stat(path)
  except OSError as e:
    return f"cannot inspect it ({e.strerror})"
  if not stat.S_ISDIR(st.st_mode):
    return "it is not a directory"
  where = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
  if st.st_uid != os.getuid():
    return (f"it{where} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}): its owner could replace the "
            f"kernels baregrad runs")
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return (f"it{where} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): they could replace the "
            f"kernels baregrad runs; `chmod go-w {path}` fixes it")
  return None


def _refuse(path: Path, reason: str) -> None:
  _warn_once(f"baregrad: not using the disk cache directory {path}: {reason}. Compiling without the cache; point "
             f"BAREGRAD_CACHE at a private directory (or fix this one) to cache again.")


def _make_private_dirs(path: Path) -> None:
  """Create `path` and any missing parents, each 0700 whatever the umask: mkdir with 0700 (the umask can only
  remove bits), then chmod for a umask that removed the owner's bits. The process umask is not touched."""
  missing = []
  p = path
  while not os.path.lexists(p) and p != p.parent:
    missing.append(p)
    p = p.parent
  for d in reversed(missing):
    try:
      os.mkdir(d, 0o700)
    except FileExistsError:   # another process or thread made it first: the safety check decides
      continue
    os.chmod(d, 0o700)


def _directory(kind: str, create: bool) -> Path | None:
  """`<root>/<kind>` if it (and the root) is safe to use; None if absent (and not `create`) or unsafe."""
  _check_name("kind", kind)
  base = root()
  for path in (base, base / kind):   # the root is checked before anything is made inside it
    if create:
      try:
        _make_private_dirs(path)
      except OSError as e:
        _refuse(path, f"cannot create it ({e.strerror})")
        return None
    elif not os.path.lexists(path):
      return None
    if (reason := _unsafe_reason(path)) is not None:
      _refuse(path, reason)
      return None
  return base / kind


def _drop(path: Path) -> None:
  with _lock: stats["bad_entries"] += 1
  try: os.unlink(path)
  except OSError: pass


def frame(data: bytes) -> bytes:
  """An entry's file contents: the header, then `data`."""
  return HEADER.pack(MAGIC, VERSION, 0, len(data), hashlib.sha256(data).digest()) + data


def unframe(raw: bytes) -> bytes | None:
  """The payload of an entry's file contents, or None if the header or the payload does not check out."""
  if len(raw) < HEADER.size: return None
  magic, version, reserved, length, digest = HEADER.unpack_from(raw)
  if magic != MAGIC or version != VERSION or reserved != 0 or length != len(raw) - HEADER.size: return None
  payload = raw[HEADER.size:]
  return payload if hashlib.sha256(payload).digest() == digest else None


def get(kind: str, key: str) -> bytes | None:
  """The payload stored under (kind, key), or None: a miss, lookups off (CACHE=0), an unsafe directory (one
  warning), or a damaged entry (removed; the caller rebuilds it)."""
  _check_name("key", key)
  if not lookups_enabled() or (d := _directory(kind, create=False)) is None: return None
  path = d / key
  try:
    # O_NOFOLLOW: a symlink is not an entry; O_NONBLOCK: a FIFO planted there must not block the read
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
  except FileNotFoundError:
    return None
  except OSError:   # a symlink, unreadable: not an entry we wrote
    _drop(path)
    return None
  with os.fdopen(fd, "rb") as f:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) \
       or st.st_size > MAX_ENTRY:
      raw = None
    else:
      raw = f.read(MAX_ENTRY + 1)
  payload = unframe(raw) if raw is not None else None
  if payload is None: _drop(path)
  return payload


def put(kind: str, key: str, data: bytes) -> bool:
  """Store `data` under (kind, key), atomically (readers see the old entry or the new one, never a part) and
  0600. Returns whether it was written; a disk problem is a warning, never an exception."""
  _check_name("key", key)
  if len(data) + HEADER.size > MAX_ENTRY:   # get() would refuse it: not worth writing
    _warn_once(f"baregrad: not caching {kind}/{key}: {len(data)} bytes is over the {MAX_ENTRY}-byte entry limit")
    return False
  if (d := _directory(kind, create=True)) is None: return False
  try:
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{key}.", suffix=".tmp")
  except OSError as e:
    _warn_once(f"baregrad: cannot write to the disk cache directory {d} ({e.strerror}); compiling without caching")
    return False
  try:
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), 0o600)   # mkstemp asks for 0600, but a umask may have removed the owner's bits
      f.write(frame(data))
    os.replace(tmp, d / key)
  except BaseException as e:
    try: os.unlink(tmp)
    except OSError: pass
    if not isinstance(e, OSError): raise
    # a full or read-only disk must not break compiling
    _warn_once(f"baregrad: cannot write to the disk cache directory {d} ({e.strerror}); compiling without caching")
    return False
  return True


__all__ = ["root", "hash_key", "get", "put", "frame", "unframe", "lookups_enabled", "stats", "MAX_ENTRY"]
