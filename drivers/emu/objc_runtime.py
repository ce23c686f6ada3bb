"""An Objective-C runtime for the emulated Metal framework: GCC's GNU runtime (libobjc4), an `objc_msgSend` for it,
and the Foundation classes the Metal driver touches (NSObject, NSString, NSError), with Cocoa's reference counting.

The driver (drivers/metal/objc.py) sends messages exactly as on a Mac: `objc_msgSend` cast to each method's
prototype, `sel_registerName`, `objc_getClass`, `objc_autoreleasePoolPush/Pop`. Here those reach:
- libobjc.so.4 for classes, selectors and method lookup. Emulated classes are real runtime classes, made with
  `objc_allocateClassPair`; each method is an `ffi.callback` with the method's exact C prototype, added with
  `class_addMethod` and a type encoding (an empty encoding makes GNU's class_addMethod fail).
- objc_msgsend.S: the GNU runtime has no objc_msgSend, so a trampoline looks the IMP up with objc_msg_lookup and jumps
  to it. It is assembled by the system compiler and cached on disk (drivers/diskcache.py, kind "objc").
- NSObject here keeps a real retain count (Apple's "Advanced Memory Management Programming Guide": you own what you
  alloc/new/copy/retain, release what you own; autorelease defers a release to the innermost pool). What Cocoa
  would crash on or leak is recorded and raised at the sender instead (`check`): a message to a deallocated
  object (objects are kept as zombies, as NSZombieEnabled does), a release past zero, an autorelease with no pool
  in place. `live()` lists the objects still alive (leaks once their owner is gone).
An exception raised inside a method cannot cross the C frames of the send: it is kept per thread and raised by
`check()`, which the bridge calls after every send (on a Mac an Objective-C exception would abort the process)."""
from __future__ import annotations
import os, platform, subprocess, sys, tempfile, threading
from pathlib import Path
import cffi
from .. import diskcache

HERE = Path(__file__).resolve().parent
LIBOBJC = "libobjc.so.4"

ffi = cffi.FFI()
# GCC's libobjc4 (objc/runtime.h, GCC 12): the calls used here; BOOL is unsigned char in the GNU runtime
ffi.cdef("""
typedef void *id; typedef void *SEL; typedef void *Class; typedef void (*IMP)(void);
typedef struct { unsigned long width, height, depth; } MTLSize;
typedef struct { unsigned long location, length; } NSRange;
Class objc_getClass(const char *name);
Class objc_getMetaClass(const char *name);
SEL sel_registerName(const char *name);
const char *sel_getName(SEL sel);
Class objc_allocateClassPair(Class superclass, const char *name, size_t extraBytes);
void objc_registerClassPair(Class cls);
unsigned char class_addMethod(Class cls, SEL name, IMP imp, const char *types);
id class_createInstance(Class cls, size_t extraBytes);
IMP objc_msg_lookup(id receiver, SEL op);
void objc_msgSend(void);
void objc_msgSend_stret(void);
""")

# C type -> Objective-C type encoding (Apple's "Type Encodings", Objective-C Runtime Programming Guide)
ENCODINGS = {"void": "v", "id": "@", "Class": "#", "SEL": ":", "BOOL": "c", "unsigned char": "C", "int": "i",
             "unsigned int": "I", "long": "q", "unsigned long": "Q", "uint64_t": "Q", "double": "d", "float": "f",
             "void*": "^v", "const void*": "r^v", "const char*": "r*", "id*": "^@", "const id*": "r^@",
             "MTLSize": "{MTLSize=QQQ}", "NSRange": "{_NSRange=QQ}"}
C_TYPES = {"BOOL": "signed char"}    # x86-64: BOOL is signed char (objc.h); this runtime exists only there
STRUCTS = ("MTLSize", "NSRange")
POINTERS = ("void*", "const void*", "const char*", "id*", "const id*")


class ObjCError(RuntimeError):
  """What Cocoa would crash on or leak: a message to a freed object, an over-release, an autorelease with no pool."""


def objc(selector: str, restype: str = "void", *argtypes: str, cls: bool = False):
  """Make a Python method an Objective-C method `selector` of prototype `restype (id, SEL, *argtypes)` (a class
  method when `cls`): arguments arrive as Python values (id -> object or None, struct -> tuple, pointer -> int)."""
  def mark(fn):
    fn.objc = (selector, restype, argtypes, cls)
    return fn
  return mark


def _cdecl(t: str) -> str: return C_TYPES.get(t, t)


def _build_trampoline() -> bytes:
  from ..cpu import cc
  src = (HERE / "objc_msgsend.S").read_text()
  compiler = cc.find_compiler()
  key = diskcache.hash_key("objc_msgsend", compiler, cc.compiler_version(compiler), src) + ".so"
  if (data := diskcache.get("objc", key)) is not None: return data
  with tempfile.TemporaryDirectory(prefix="baregrad-objc-") as tmp:
    out = Path(tmp) / "objc_msgsend.so"
    proc = subprocess.run([compiler, "-shared", "-fPIC", "-x", "assembler-with-cpp", str(HERE / "objc_msgsend.S"),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
      raise RuntimeError(f"assembling the objc_msgSend trampoline with {compiler} failed:\n{proc.stderr}")
    data = out.read_bytes()
  diskcache.put("objc", key, data)
  return data


def load_shared_object(data: bytes, dl_ffi: cffi.FFI, flags: int):
  """dlopen a shared object held in memory: written to a private temporary file, opened, unlinked."""
  fd, path = tempfile.mkstemp(prefix="baregrad-", suffix=".so")
  try:
    with os.fdopen(fd, "wb") as f: f.write(data)
    return dl_ffi.dlopen(path, flags)
  finally:
    os.unlink(path)


class Runtime:
  """The process's emulated Objective-C runtime (one: classes are process-wide). `runtime()` makes it."""

  def __init__(self):
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
      raise RuntimeError("the emulated Objective-C runtime needs x86-64 Linux (its objc_msgSend trampoline, "
                         f"drivers/emu/objc_msgsend.S, is x86-64 assembly); this is {sys.platform} {platform.machine()}")
    try: self.lib = ffi.dlopen(LIBOBJC, ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
    except OSError as e:
      raise RuntimeError(f"cannot load {LIBOBJC}, GCC's Objective-C runtime, which the emulated Metal framework runs "
                         f"on: {e}. Install it (Debian/Ubuntu: `apt-get install libobjc4`).") from None
    self.trampoline = load_shared_object(_build_trampoline(), ffi, ffi.RTLD_NOW)
    self.lock = threading.RLock()
    self.classes: dict[type, object] = {}        # Python class -> its Class
    self.by_class_ptr: dict[int, type] = {}       # Class and metaclass address -> Python class
    self.objects: dict[int, NSObject] = {}       # live instances by address
    self.zombies: dict[int, str] = {}             # freed instances (never reused): address -> description
    self.errors: list[str] = []                   # every ObjCError, for report()
    self.counts = {"allocated": 0, "deallocated": 0}
    self._local = threading.local()               # per thread: autorelease pool stack, pending exception
    self._callbacks: list = []                    # the ffi.callbacks (methods, pool functions) stay alive
    self._push = ffi.callback("void *(*)(void)", self._pool_push)
    self._pop = ffi.callback("void (*)(void *)", self._pool_pop)
    for c in (NSObject, NSString, NSError): self.register(c)

  # ---- what the bridge loads (drivers/metal/framework.py) ----
  def symbols(self) -> dict[str, int]:
    def addr(f): return int(ffi.cast("uintptr_t", f))
    return {"objc_msgSend": addr(self.trampoline.objc_msgSend), "objc_msgSend_stret": addr(self.trampoline.objc_msgSend_stret),
            "sel_registerName": addr(self.lib.sel_registerName), "objc_getClass": addr(self.lib.objc_getClass),
            "objc_autoreleasePoolPush": addr(self._push), "objc_autoreleasePoolPop": addr(self._pop)}

  def check(self) -> None:
    """Raise the exception a method raised during the last send on this thread (if any)."""
    e = getattr(self._local, "pending", None)
    if e is not None:
      self._local.pending = None
      raise e

  # ---- classes ----
  def register(self, pycls: type) -> None:
    """Create the Objective-C class for `pycls` (its superclass's first) with the methods `@objc` marks."""
    if pycls in self.classes: return
    base = pycls.__mro__[1]
    if base is not object: self.register(base)
    name = pycls.__name__.encode()
    cls = self.lib.objc_allocateClassPair(self.classes[base] if base is not object else ffi.NULL, name, 0)
    if cls == ffi.NULL: raise ObjCError(f"objc_allocateClassPair({pycls.__name__}) failed: the class exists already")
    self.lib.objc_registerClassPair(cls)
    meta = self.lib.objc_getMetaClass(name)
    self.classes[pycls] = cls
    self.by_class_ptr[int(ffi.cast("uintptr_t", cls))] = self.by_class_ptr[int(ffi.cast("uintptr_t", meta))] = pycls
    for fn in vars(pycls).values():
      if not hasattr(fn, "objc"): continue
      selector, restype, argtypes, is_class = fn.objc
      imp = self._imp(fn, selector, restype, argtypes, is_class)
      types = ENCODINGS[restype] + "@:" + "".join(ENCODINGS[a] for a in argtypes)
      if not self.lib.class_addMethod(meta if is_class else cls, self.lib.sel_registerName(selector.encode()),
                                      ffi.cast("IMP", imp), types.encode()):
        raise ObjCError(f"class_addMethod({pycls.__name__}, {selector}) failed")

  def _imp(self, fn, selector: str, restype: str, argtypes: tuple, is_class: bool):
    proto = f"{_cdecl(restype)} (*)(id, SEL{''.join(', ' + _cdecl(a) for a in argtypes)})"

    def imp(receiver, _sel, *raw):
      try:
        target = self.by_class_ptr[int(ffi.cast("uintptr_t", receiver))] if is_class else self.obj(receiver, selector)
        args = [self._arg(t, v, selector) for t, v in zip(argtypes, raw)]
        return self._result(restype, fn(target, *args))
      except BaseException as e:                     # kept for check(): it cannot unwind through objc_msgSend
        if getattr(self._local, "pending", None) is None: self._local.pending = e
        return self._result(restype, None)
    cb = ffi.callback(proto, imp)
    self._callbacks.append(cb)
    return cb

  def _arg(self, t: str, v, selector: str):
    if t == "id": return self.obj(v, selector)
    if t == "Class": return self.by_class_ptr.get(int(ffi.cast("uintptr_t", v)))
    if t == "MTLSize": return (v.width, v.height, v.depth)
    if t == "NSRange": return (v.location, v.length)
    if t in POINTERS: return int(ffi.cast("uintptr_t", v))
    return v

  def _result(self, t: str, value):
    if t == "void": return None
    if t == "id": return ffi.cast("id", value.addr) if value is not None else ffi.NULL
    if t in STRUCTS: return ffi.new(f"{t} *", list(value) if value is not None else None)[0]
    if t in POINTERS: return ffi.cast(t.replace("*", " *"), value or 0)
    return value if value is not None else 0

  # ---- objects ----
  def instantiate(self, pycls: type) -> "NSObject":
    """A new instance of `pycls`, retain count 1 (the caller owns it: alloc/new)."""
    with self.lock:
      ptr = self.lib.class_createInstance(self.classes[pycls], 0)
      obj = pycls()
      obj.addr = int(ffi.cast("uintptr_t", ptr))
      self.objects[obj.addr] = obj
      self.counts["allocated"] += 1
      return obj

  def obj(self, ptr, selector: str = "?") -> "NSObject | None":
    addr = ptr if isinstance(ptr, int) else int(ffi.cast("uintptr_t", ptr))
    if addr == 0: return None
    found = self.objects.get(addr)
    if found is None:
      what = self.zombies.get(addr, "an address that is no object of this runtime")
      self.fail(f"-[{what} {selector}]: message sent to deallocated instance 0x{addr:x}" if addr in self.zombies
                else f"{selector}: 0x{addr:x} is {what}")
    return found

  def fail(self, message: str):
    with self.lock: self.errors.append(message)
    raise ObjCError(message)

  def dealloc(self, obj: "NSObject") -> None:
    with self.lock:
      del self.objects[obj.addr]
      self.zombies[obj.addr] = f"{type(obj).__name__}"
      self.counts["deallocated"] += 1
    obj.dealloc()

  # ---- autorelease pools (a stack per thread) ----
  def _pools(self) -> list:
    if not hasattr(self._local, "pools"): self._local.pools = []
    return self._local.pools

  def _pool_push(self):
    pools = self._pools()
    pools.append([])
    return ffi.cast("void *", len(pools))

  def _pool_pop(self, token):
    try:
      depth, pools = int(ffi.cast("uintptr_t", token)), self._pools()
      if not 1 <= depth <= len(pools): self.fail(f"objc_autoreleasePoolPop({depth}): no such pool (depth {len(pools)})")
      while len(pools) >= depth:
        for obj in pools.pop(): obj.release()
    except BaseException as e:
      if getattr(self._local, "pending", None) is None: self._local.pending = e

  def autorelease(self, obj: "NSObject") -> None:
    pools = self._pools()
    if not pools:
      self.fail(f"-[{type(obj).__name__} autorelease]: object 0x{obj.addr:x} autoreleased with no pool in place - just leaking")
    pools[-1].append(obj)

  # ---- reports ----
  def live(self) -> list["NSObject"]:
    with self.lock: return list(self.objects.values())

  def report(self) -> str:
    by_class: dict[str, int] = {}
    for o in self.live(): by_class[type(o).__name__] = by_class.get(type(o).__name__, 0) + 1
    live = ", ".join(f"{n} {c}" for c, n in sorted(by_class.items())) or "none"
    return (f"objects allocated {self.counts['allocated']}, deallocated {self.counts['deallocated']}, alive: {live}; "
            f"errors (over-release, message to a freed object, autorelease with no pool): {len(self.errors)}"
            + "".join(f"\n  {e}" for e in self.errors[:20]))


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
  global _runtime
  with _runtime_lock:
    if _runtime is None: _runtime = Runtime()
    return _runtime


# ---------------------------------------------------------------- Foundation: the classes the driver touches

class NSObject:
  """The root class: alloc/new/init, retain/release/autorelease with a real count (released at 0: `dealloc`)."""

  def __init__(self):
    self.addr, self.refs = 0, 1

  def __repr__(self): return f"<{type(self).__name__} 0x{self.addr:x} retainCount={self.refs}>"

  @objc("alloc", "id", cls=True)
  def alloc(cls): return runtime().instantiate(cls)

  @objc("new", "id", cls=True)
  def new(cls): return runtime().instantiate(cls).init()

  @objc("init", "id")
  def init(self): return self

  @objc("retain", "id")
  def retain(self):
    with runtime().lock:
      if self.refs <= 0: runtime().fail(f"-[{type(self).__name__} retain]: 0x{self.addr:x} was deallocated")
      self.refs += 1
    return self

  @objc("release")
  def release(self):
    rt = runtime()
    with rt.lock:
      if self.refs <= 0: rt.fail(f"-[{type(self).__name__} release]: over-release of 0x{self.addr:x}")
      self.refs -= 1
      if self.refs == 0: rt.dealloc(self)

  @objc("autorelease", "id")
  def autorelease(self):
    runtime().autorelease(self)
    return self

  @objc("retainCount", "unsigned long")
  def retainCount(self): return self.refs

  def dealloc(self):
    """Release what this object owns (subclasses)."""

  @classmethod
  def make(cls, **fields) -> "NSObject":
    """A new instance (+1, owned by the caller) with Python attributes set."""
    obj = runtime().instantiate(cls)
    for k, v in fields.items(): setattr(obj, k, v)
    return obj


class NSString(NSObject):
  def __init__(self):
    super().__init__()
    self.text, self._utf8 = "", None

  @objc("stringWithUTF8String:", "id", "const char*", cls=True)
  def stringWithUTF8String_(cls, ptr):
    if not ptr: raise ObjCError("+[NSString stringWithUTF8String:]: NULL cString (NSInvalidArgumentException)")
    return cls.make(text=ffi.string(ffi.cast("char *", ptr)).decode("utf-8", "replace")).autorelease()

  @objc("UTF8String", "const char*")
  def UTF8String(self):
    if self._utf8 is None: self._utf8 = ffi.new("char[]", self.text.encode())   # lives as long as the string
    return int(ffi.cast("uintptr_t", self._utf8))

  @objc("length", "unsigned long")
  def length(self): return len(self.text.encode("utf-16-le")) // 2


class NSError(NSObject):
  def __init__(self):
    super().__init__()
    self.domain, self.code, self.text = "", 0, ""

  @classmethod
  def autoreleased(cls, domain: str, code: int, text: str) -> "NSError":
    return cls.make(domain=domain, code=code, text=text).autorelease()

  @objc("localizedDescription", "id")
  def localizedDescription(self): return NSString.make(text=self.text).autorelease()

  @objc("code", "long")
  def code_(self): return self.code
