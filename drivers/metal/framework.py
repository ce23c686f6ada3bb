"""Where the Metal driver's calls go: the seam between it and the system, as drivers/kernel.py is for AMD and NV.

`frameworks()` gives the real Objective-C runtime and Metal.framework on macOS, or with EMU=1 the emulated ones
(drivers/emu/metal_framework.py: GCC's libobjc4 with emulated Foundation and Metal classes). Both have the same
members, so nothing in the driver asks which it has:
    emulated                 True for the emulated framework
    symbol(name) -> int      the address of objc_msgSend, objc_msgSend_stret (x86-64 only), sel_registerName,
                             objc_getClass, objc_autoreleasePoolPush/Pop, MTLCreateSystemDefaultDevice
    check()                  after every send: raise what the emulated framework recorded (a method that raised, a
                             validation error, an over-release); the real one has nothing to raise (an Objective-C
                             exception on a Mac ends the process)
"""
from __future__ import annotations
import importlib, platform, sys
from typing import Protocol
import cffi
from .. import settings

# the emulated framework, used when EMU=1 (as kernel.EMULATORS is for the kernel drivers)
EMULATED = {"METAL": ("baregrad.drivers.emu.metal_framework", "EmulatedMetal")}

LIBOBJC = "/usr/lib/libobjc.A.dylib"
# MTLCreateSystemDefaultDevice finds no device unless CoreGraphics is loaded (Apple, MTLCreateSystemDefaultDevice:
# "in macOS, in order for the system to provide a default Metal device object, you must link to the CoreGraphics
# framework")
CORE_GRAPHICS = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
METAL = "/System/Library/Frameworks/Metal.framework/Metal"


class Frameworks(Protocol):
  emulated: bool
  def symbol(self, name: str) -> int: ...
  def check(self) -> None: ...


class MacFrameworks:
  """libobjc and Metal.framework of macOS, opened with dlopen."""
  emulated = False

  def __init__(self):
    self.ffi = cffi.FFI()
    self.ffi.cdef("void objc_msgSend(void); void objc_msgSend_stret(void); void *sel_registerName(const char *);"
                  "void *objc_getClass(const char *); void *objc_autoreleasePoolPush(void);"
                  "void objc_autoreleasePoolPop(void *); void *MTLCreateSystemDefaultDevice(void);")
    self.objc = self.ffi.dlopen(LIBOBJC)
    self.core_graphics = self.ffi.dlopen(CORE_GRAPHICS)
    self.metal = self.ffi.dlopen(METAL)

  def symbol(self, name: str) -> int:
    lib = self.metal if name == "MTLCreateSystemDefaultDevice" else self.objc
    return int(self.ffi.cast("uintptr_t", getattr(lib, name)))

  def check(self) -> None:
    """Nothing: Objective-C exceptions are not caught on a Mac."""


def available() -> tuple[bool, str]:
  """(whether frameworks() can give a framework, why not) without loading anything."""
  if settings.EMU:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
      return False, f"the emulated Metal framework runs on x86-64 Linux only (this is {sys.platform} {platform.machine()})"
    import ctypes.util
    if ctypes.util.find_library("objc") is None:
      return False, "EMU=1: GCC's Objective-C runtime libobjc.so.4 is not installed (`apt-get install libobjc4`)"
    import shutil
    from ..emu.metal_shim import COMPILERS
    if not any(shutil.which(c) for c in COMPILERS):
      return False, f"EMU=1: no C++ compiler ({', '.join(COMPILERS)}) to run the emulated Metal kernels (`apt-get install g++`)"
    return True, ""
  if sys.platform != "darwin":
    return False, f"Metal needs macOS (this is {platform.system()}); EMU=1 DEV=METAL runs the emulated Metal framework"
  # since macOS 11 the system frameworks live only in the dyld shared cache: no file at METAL's path exists, yet
  # dlopen finds it (Apple, macOS Big Sur 11.0.1 release notes: "system-provided libraries ... a copy of the library
  # is no longer present on the file system ... check for library presence by attempting to dlopen() the path").
  # So dlopen decides; its error is the reason.
  try: _dlopen(METAL)
  except OSError as e: return False, f"dlopen({METAL}) failed: {e}"
  return True, ""


def _dlopen(path: str):
  import ctypes
  return ctypes.CDLL(path)


def frameworks() -> Frameworks:
  """The real frameworks, or with EMU=1 the emulated ones."""
  if settings.EMU:
    module, cls = EMULATED["METAL"]
    return getattr(importlib.import_module(module), cls)()
  ok, why = available()
  if not ok: raise RuntimeError(f"METAL device: {why}")
  return MacFrameworks()
