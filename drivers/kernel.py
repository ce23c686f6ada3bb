"""The kernel interface: the only way a GPU driver reaches the operating system.

`KernelInterface` calls libc's `open/ioctl/mmap/munmap/close` through cffi and checks every result: a failing
call raises `KernelCallError` naming the call (the ioctl by its header name), the file and the errno.
`interface(vendor)` gives the real one, or with `EMU=1` the emulated kernel driver + GPU registered for that
vendor in `EMULATORS` (same methods; its ioctls and mmaps are served by Python code in `drivers/emu`).

Logging: when TRACE_IOCTL is set, every call is reported to `drivers/kernel_log.py`; any other logger can be
installed with `set_logger(fn)`, called as `fn(call, **details)` after the call returns.

    k = interface("NV")
    fd = k.open("/dev/nvidiactl")
    k.ioctl(fd, request, params_cdata, name="NV_ESC_RM_ALLOC")
"""
from __future__ import annotations
import contextlib, errno as _errno, importlib, os, sys
from typing import Protocol
import cffi
from . import settings

_ffi = cffi.FFI()
# <fcntl.h>, <sys/ioctl.h>, <sys/mman.h>, <unistd.h> (glibc, Linux x86-64 / aarch64)
_ffi.cdef("""
int open(const char *pathname, int flags, ...);
int close(int fd);
int ioctl(int fd, unsigned long request, ...);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
""")

O_RDWR, O_CLOEXEC = 0o2, 0o2000000                                 # <asm-generic/fcntl.h>
PROT_READ, PROT_WRITE = 1, 2                                       # <asm-generic/mman-common.h>
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
MAP_FAILED = 2**64 - 1

# vendor -> (module, class) of the emulated kernel driver used when EMU=1
EMULATORS: dict[str, tuple[str, str]] = {
  "NV": ("baregrad.drivers.emu.nv_kernel", "EmulatedNVKernel"),
}


class KernelCallError(OSError):
  """A system call failed: which call, on what, errno."""


# ---- logging hook ----
_logger = None


def set_logger(fn) -> None:
  """Install `fn(call: str, **details)` to be called after every kernel call (None removes it)."""
  global _logger
  _logger = fn


def _trace_logger():
  try:
    from . import kernel_log
  except ImportError:
    return None
  if not kernel_log.enabled: return None

  def log(call, **d):
    if call == "ioctl":
      kernel_log.ioctl(d["fd"], d["request"], d.get("name"), d.get("fields"), d["result"], d.get("path"))
    elif call == "open": kernel_log.open_file(d["path"], d["flags"], d["result"])
    elif call == "close": kernel_log.close(d["fd"], d["result"])
    elif call == "mmap": kernel_log.mmap(d["addr"], d["length"], d["prot"], d["flags"], d["fd"], d["offset"], d["result"])
    elif call == "munmap": kernel_log.munmap(d["addr"], d["length"], d["result"])
  return log


_logger = _trace_logger()


def log(call: str, **details) -> None:
  """Report one call to the installed logger (emulated interfaces call this too)."""
  if _logger is not None: _logger(call, **details)


@contextlib.contextmanager
def recording(sink):
  """While the block runs, every kernel call's trace line (kernel_log's format) is also written to `sink.write`; with
  TRACE_IOCTL=1 the lines still go where they went. (tools/doctor.py records a device's opening so.)"""
  from . import kernel_log
  global _logger
  saved = (kernel_log.enabled, kernel_log._out, _logger)
  forward = None
  if kernel_log.enabled:
    path = settings.TRACE_IOCTL_FILE
    forward = kernel_log._out or (open(path, "a", buffering=1) if path else sys.stderr)

  class Tee:
    def write(self, text): sink.write(text); forward is not None and forward.write(text)
    def flush(self): pass

  kernel_log.enabled, kernel_log._out = True, Tee()
  previous = _logger
  if previous is None or not saved[0]:       # (with TRACE_IOCTL=1 the installed logger is kernel_log's already)
    trace = _trace_logger()
    set_logger(trace if previous is None else lambda call, **d: (trace(call, **d), previous(call, **d)))
  try: yield sink
  finally:
    kernel_log.enabled, kernel_log._out = saved[0], (forward if saved[0] else saved[1])
    set_logger(saved[2])


def ioctl_request(direction: int, kind: str | int, nr: int, size: int) -> int:
  """Linux <asm-generic/ioctl.h> _IOC: nr bits 0-7, type 8-15, size 16-29, direction 30-31 (1 write, 2 read)."""
  kind = ord(kind) if isinstance(kind, str) else kind
  return (direction << 30) | (size << 16) | (kind << 8) | nr


def IOWR(kind, nr: int, size: int) -> int: return ioctl_request(3, kind, nr, size)


class Kernel(Protocol):
  """What a driver may call: the real `KernelInterface` and the emulated kernel drivers (drivers/emu) all have
  every member (tests/test_driver_protocol.py checks), so a driver never asks whether one exists."""
  emulated: bool      # True: an emulated kernel driver + GPU (EMU=1)

  def exists(self, path: str) -> bool: ...
  def read_text(self, path: str) -> str: ...
  def open(self, path: str, flags: int = ...) -> int: ...
  def close(self, fd: int) -> None: ...
  def ioctl(self, fd: int, request: int, arg, name: str | None = None, fields=None) -> int: ...
  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int: ...
  def munmap(self, addr: int, length: int) -> None: ...

  def fault(self) -> str | None:
    """What stopped the GPU's queues, as the kernel log would say it, or None. An emulated GPU reports its faults
    here (drivers/emu/README.md); the real kernel returns None (its faults arrive through the drivers' own channels:
    KFD exception events, RM's error notifier)."""
    ...

  def register_program(self, code_addr: int, source: str | None, name: str, param_base: int, params: list) -> None:
    """A program's code was uploaded at `code_addr`: the emulated NV GPU runs its PTX `source` (the one side channel,
    drivers/emu/README.md); the real kernel and the emulated AMD GPU (it runs the machine code) ignore it."""
    ...

  def unregister_program(self, code_addr: int) -> None: ...


class KernelInterface:
  """The real kernel: libc calls through cffi, every result checked."""
  emulated = False

  def __init__(self):
    self.libc = _ffi.dlopen(None)
    self.paths: dict[int, str] = {}

  def exists(self, path: str) -> bool: return os.path.exists(path)

  def read_text(self, path: str) -> str:
    with open(path) as f: return f.read()

  def open(self, path: str, flags: int = O_RDWR | O_CLOEXEC) -> int:
    fd = self.libc.open(path.encode(), flags)
    log("open", path=path, flags=flags, result=fd)
    if fd < 0: self._fail(f"open({path!r})")
    self.paths[fd] = path
    return fd

  def close(self, fd: int) -> None:
    r = self.libc.close(fd)
    log("close", fd=fd, result=r)
    if r < 0: self._fail(f"close({fd} {self.paths.get(fd, '')})")
    self.paths.pop(fd, None)

  def ioctl(self, fd: int, request: int, arg, name: str | None = None, fields=None) -> int:
    """`arg`: a cffi pointer (any FFI instance) to the parameter struct."""
    r = self.libc.ioctl(fd, _ffi.cast("unsigned long", request), _ffi.cast("void *", arg))
    log("ioctl", fd=fd, request=request, name=name, fields=fields() if callable(fields) else fields, result=r,
        path=self.paths.get(fd))
    if r < 0: self._fail(f"ioctl {name or hex(request)} on fd {fd} ({self.paths.get(fd, '?')})")
    return r

  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    p = self.libc.mmap(_ffi.cast("void *", addr), length, prot, flags, fd, offset)
    res = int(_ffi.cast("uintptr_t", p))
    log("mmap", addr=addr, length=length, prot=prot, flags=flags, fd=fd, offset=offset, result=res)
    if res == MAP_FAILED: self._fail(f"mmap(length={length:#x}, fd={fd} {self.paths.get(fd, '')}, offset={offset:#x})")
    return res

  def munmap(self, addr: int, length: int) -> None:
    r = self.libc.munmap(_ffi.cast("void *", addr), length)
    log("munmap", addr=addr, length=length, result=r)
    if r < 0: self._fail(f"munmap({addr:#x}, {length:#x})")

  def fault(self) -> None:
    """None: the real kernel reports faults through the drivers' own channels (KFD events, RM's error notifier)."""
    return None

  def register_program(self, code_addr: int, source: str | None, name: str, param_base: int, params: list) -> None:
    """Nothing: the GPU runs the machine code the driver uploaded."""

  def unregister_program(self, code_addr: int) -> None:
    """Nothing (see register_program)."""

  def _fail(self, what: str):
    e = _ffi.errno
    raise KernelCallError(e, f"{what} failed: errno {e} ({_errno.errorcode.get(e, '?')}: {os.strerror(e)})")


def emulated() -> bool: return settings.EMU   # EMU=1 (settings.override(EMU=1) inside a block)


def interface(vendor: str):
  """The kernel interface a `vendor` driver uses: the real one, or with EMU=1 its emulator."""
  if not emulated(): return KernelInterface()
  if vendor not in EMULATORS: raise RuntimeError(f"EMU=1: no emulated kernel driver for {vendor} (have {', '.join(EMULATORS)})")
  module, cls = EMULATORS[vendor]
  return getattr(importlib.import_module(module), cls)()
