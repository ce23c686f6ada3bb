"""TRACE_IOCTL=1: a decoded log of every call that crosses the kernel interface.

Drivers reach the OS only through `open/ioctl/mmap/munmap/mprotect/close`; each driver calls the matching
function here right after the system call returns (only when `enabled`, so a disabled log costs one
attribute test). One line per call on stderr (or the file named by TRACE_IOCTL_FILE):

    [kernel +12.345 ms #7] mmap(addr=NULL, length=0x1000, prot=READ|WRITE, flags=PRIVATE|ANONYMOUS, fd=-1, offset=0) = 0x7f3a2c000000
    [kernel +12.400 ms #8] ioctl(fd=5 /dev/kfd, AMDKFD_IOC_CREATE_QUEUE [rw 'K' 0x02 size=96], queue_id=3 ...) = 0

An ioctl is named by the driver (it knows its header's table); an unnamed request number is still decoded
into direction, type, number and size (Linux <asm-generic/ioctl.h> _IOC layout).
"""
from __future__ import annotations
import sys, time
from . import settings

enabled = settings.TRACE_IOCTL
_start = time.perf_counter()
_count = 0
_out = None

# <sys/mman.h> (Linux, x86-64 and aarch64)
PROT_FLAGS = ((1, "READ"), (2, "WRITE"), (4, "EXEC"))
MAP_FLAGS = ((0x01, "SHARED"), (0x02, "PRIVATE"), (0x10, "FIXED"), (0x20, "ANONYMOUS"), (0x4000, "NORESERVE"),
             (0x8000, "POPULATE"), (0x100000, "FIXED_NOREPLACE"))
# <asm-generic/ioctl.h>: nr bits 0-7, type bits 8-15, size bits 16-29, direction bits 30-31
IOC_DIRECTIONS = {0: "none", 1: "w", 2: "r", 3: "rw"}


def flag_names(value: int, table) -> str:
  """`READ|WRITE`; bits not in the table are shown in hex, 0 as NONE."""
  names, rest = [], value
  for bit, name in table:
    if value & bit: names.append(name); rest &= ~bit
  if rest: names.append(f"0x{rest:x}")
  return "|".join(names) or "NONE"


def decode_request(request: int) -> str:
  """An ioctl request number as `rw 'K' 0x02 size=96`."""
  nr, kind, size, direction = request & 0xFF, (request >> 8) & 0xFF, (request >> 16) & 0x3FFF, (request >> 30) & 3
  kind_s = repr(chr(kind)) if 32 < kind < 127 else f"0x{kind:02x}"
  return f"{IOC_DIRECTIONS[direction]} {kind_s} 0x{nr:02x} size={size}"


def _fmt(v) -> str:
  if isinstance(v, bool) or not isinstance(v, int): return str(v)
  return f"0x{v:x}" if v >= 4096 else str(v)


def log(call: str, args: str, result) -> None:
  """One line: `[kernel +t ms #n] call(args) = result`."""
  global _count, _out
  _count += 1
  if _out is None:
    path = settings.TRACE_IOCTL_FILE
    _out = open(path, "a", buffering=1) if path else sys.stderr
  res = result if isinstance(result, str) else _fmt(result)
  _out.write(f"[kernel +{(time.perf_counter() - _start) * 1e3:.3f} ms #{_count}] {call}({args}) = {res}\n")


def mmap(addr: int, length: int, prot: int, flags: int, fd: int, offset: int, result: int) -> None:
  res = "MAP_FAILED" if result in (-1, 2**64 - 1) else result
  log("mmap", f"addr={_fmt(addr) if addr else 'NULL'}, length={_fmt(length)}, prot={flag_names(prot, PROT_FLAGS)}, "
              f"flags={flag_names(flags, MAP_FLAGS)}, fd={fd}, offset={_fmt(offset)}", res)


def munmap(addr: int, length: int, result: int) -> None:
  log("munmap", f"addr={_fmt(addr)}, length={_fmt(length)}", result)


def mprotect(addr: int, length: int, prot: int, result: int) -> None:
  log("mprotect", f"addr={_fmt(addr)}, length={_fmt(length)}, prot={flag_names(prot, PROT_FLAGS)}", result)


def open_file(path: str, flags: int, result: int) -> None:
  log("open", f"{path!r}, flags=0x{flags:x}", result)


def close(fd: int, result: int) -> None:
  log("close", f"fd={fd}", result)


def ioctl(fd: int, request: int, name: str | None = None, fields: dict | None = None, result: int = 0,
          path: str | None = None) -> None:
  """`name`: the request's name in its header (e.g. AMDKFD_IOC_ALLOC_MEMORY_OF_GPU); `fields`: the struct's key
  fields after the call (addresses, sizes, handles); `path`: what the fd is (e.g. /dev/kfd)."""
  what = f"{name} [{decode_request(request)}]" if name else f"0x{request:x} [{decode_request(request)}]"
  body = ", ".join(f"{k}={_fmt(v)}" for k, v in (fields or {}).items())
  log("ioctl", f"fd={fd}{' ' + path if path else ''}, {what}{', ' + body if body else ''}", result)


def calls() -> int:
  """How many calls were logged so far."""
  return _count
