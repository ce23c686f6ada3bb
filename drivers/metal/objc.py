"""The Objective-C bridge: messages sent through `objc_msgSend` cast to each selector's exact prototype
(selectors.py), classes from `objc_getClass`, selectors from `sel_registerName`, autorelease pools, NSString and
NSError, and ownership by Cocoa's rules. No Objective-C is compiled: everything goes through function pointers
the frameworks seam (framework.py) hands over, so the same code drives macOS and the emulated framework.

    rt = ObjC(frameworks())
    with rt.pool():                                   # objects returned +0 live until here
      device = rt.call("MTLCreateSystemDefaultDevice")   # +1: the driver releases it
      queue = rt.send(device, "newCommandQueue")         # +1
      name = rt.string(rt.send(device, "name"))          # +0 NSString -> str

Calling convention: arguments as C declares them; on x86-64 a struct result over 16 bytes (MTLSize) comes back
through a hidden pointer, which needs objc_msgSend_stret (objc/message.h); arm64 has no _stret (the result pointer
goes in x8) and uses objc_msgSend for every prototype. BOOL is signed char on x86-64, bool on arm64 (objc.h).
"""
from __future__ import annotations
import contextlib, platform
import cffi
from .selectors import SELECTORS, Signature

ARM64 = platform.machine() in ("arm64", "aarch64")
ffi = cffi.FFI()
ffi.cdef(f"""
typedef void *id; typedef void *SEL; typedef void *Class; typedef {'_Bool' if ARM64 else 'signed char'} BOOL;
typedef struct {{ unsigned long width, height, depth; }} MTLSize;
typedef struct {{ unsigned long location, length; }} NSRange;
""")
NULL = ffi.NULL
STRUCTS = ("MTLSize", "NSRange")


class ObjCError(RuntimeError):
  """A message could not be sent as asked (unknown selector, nil receiver, no such class)."""


def addr(obj) -> int:
  """The address of an object (0 for nil)."""
  return int(ffi.cast("uintptr_t", obj))


def _ctype(t: str) -> str: return t.replace("*", " *")


class ObjC:
  def __init__(self, frameworks):
    self.fw = frameworks
    self._msg = frameworks.symbol("objc_msgSend")
    self._stret = None if ARM64 else frameworks.symbol("objc_msgSend_stret")
    self._sel_register = ffi.cast("SEL (*)(const char *)", frameworks.symbol("sel_registerName"))
    self._get_class = ffi.cast("Class (*)(const char *)", frameworks.symbol("objc_getClass"))
    self._pool_push = ffi.cast("void *(*)(void)", frameworks.symbol("objc_autoreleasePoolPush"))
    self._pool_pop = ffi.cast("void (*)(void *)", frameworks.symbol("objc_autoreleasePoolPop"))
    self._selectors: dict[str, object] = {}
    self._casts: dict[str, object] = {}
    self._classes: dict[str, object] = {}

  # ---- names ----
  def sel(self, name: str):
    s = self._selectors.get(name)
    if s is None: s = self._selectors[name] = self._sel_register(name.encode())
    return s

  def cls(self, name: str):
    c = self._classes.get(name)
    if c is None:
      c = self._get_class(name.encode())
      if c == NULL: raise ObjCError(f"objc_getClass({name!r}): no such class is loaded")
      self._classes[name] = c
    return c

  # ---- sends ----
  def _cast(self, selector: str, sig: Signature):
    fn = self._casts.get(selector)
    if fn is None:
      proto = f"{_ctype(sig.restype)} (*)(id, SEL{''.join(', ' + _ctype(a) for a in sig.argtypes)})"
      large = sig.restype in STRUCTS and ffi.sizeof(sig.restype) > 16
      fn = self._casts[selector] = ffi.cast(proto, self._stret if large and self._stret is not None else self._msg)
    return fn

  def send(self, receiver, selector: str, *args):
    """Send `selector` with `args` (ids as cdata, numbers as ints, structs as tuples); the result as C returns it
    (an id as cdata: NULL for nil)."""
    sig = SELECTORS.get(selector)
    if sig is None: raise ObjCError(f"selector {selector!r} is not in drivers/metal/selectors.py; add its prototype there")
    if receiver == NULL or receiver is None: raise ObjCError(f"[nil {selector}]: the receiver is nil")
    if len(args) != len(sig.argtypes):
      raise ObjCError(f"{selector} takes {len(sig.argtypes)} arguments ({', '.join(sig.argtypes)}), got {len(args)}")
    args = tuple(ffi.new(f"{t} *", a)[0] if t in STRUCTS and isinstance(a, tuple) else NULL if a is None else a
                 for t, a in zip(sig.argtypes, args))
    result = self._cast(selector, sig)(receiver, self.sel(selector), *args)
    self.fw.check()
    return result

  def new(self, class_name: str):
    """[Class new]: +1."""
    return self.send(self.cls(class_name), "new")

  def call(self, function: str):
    """A C function of the frameworks taking no argument and returning an object (MTLCreateSystemDefaultDevice)."""
    result = ffi.cast("id (*)(void)", self.fw.symbol(function))()
    self.fw.check()
    return result

  # ---- ownership ----
  def retain(self, obj):
    """Take ownership of a +0 object kept past the current autorelease pool."""
    return self.send(obj, "retain")

  def release(self, obj) -> None:
    if obj is not None and obj != NULL: self.send(obj, "release")

  @contextlib.contextmanager
  def pool(self):
    """An autorelease pool (objc_autoreleasePoolPush/Pop): +0 results made inside die at its end."""
    token = self._pool_push()
    try: yield
    finally:
      self._pool_pop(token)
      self.fw.check()

  # ---- Foundation ----
  def nsstring(self, text: str):
    """An autoreleased NSString (+0) holding `text`."""
    return self.send(self.cls("NSString"), "stringWithUTF8String:", text.encode())

  def string(self, nsstring) -> str:
    if nsstring == NULL: return ""
    return ffi.string(self.send(nsstring, "UTF8String")).decode("utf-8", "replace")

  def error_text(self, error) -> str:
    """The localizedDescription of an NSError (from an `NSError **` out-parameter: autoreleased)."""
    return "(no NSError given)" if error == NULL else self.string(self.send(error, "localizedDescription"))

  def out(self):
    """An `id *` out-parameter (an NSError ** / reflection slot), nil until the callee writes it."""
    return ffi.new("id *", NULL)
