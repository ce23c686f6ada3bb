"""The Objective-C bridge (drivers/metal/objc.py) against a real Objective-C runtime: GCC's libobjc4, with classes
made at run time (drivers/emu/objc_runtime.py). Typed sends with structs by value (in registers and in memory),
struct returns (in registers, and through objc_msgSend_stret's hidden pointer), out-parameters, Cocoa's reference
counting with its failure modes (over-release, message to a freed object, autorelease with no pool, leaks), and the
selector table itself (its ownership rule, and the emulated framework implementing exactly its prototypes)."""
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework, selectors
from baregrad.drivers.metal.selectors import Signature

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

if AVAILABLE:
  from baregrad.drivers.emu.objc_runtime import runtime, NSObject, NSString, ObjCError, objc, ffi as emu_ffi
  from baregrad.drivers.emu import metal_framework
  from baregrad.drivers.metal.objc import ObjC, NULL, addr, ffi

  class BGProbe(NSObject):
    """A class the tests create in the GNU runtime, with methods of every calling-convention shape the driver uses."""
    def __init__(self):
      super().__init__()
      self.seen = []

    @objc("scaleSize:by:", "MTLSize", "MTLSize", "double")       # 24-byte struct in memory and returned via sret
    def scale(self, size, k): return tuple(int(v * k) for v in size)

    @objc("rangeAfter:", "NSRange", "NSRange")                     # 16 bytes: in two registers both ways
    def after(self, r): return (r[0] + r[1], r[1])

    @objc("sum:b:c:d:e:f:g:h:", "long", *["long"] * 8)              # 10 integer arguments: 4 on the stack
    def total(self, *v): return sum(v)

    @objc("half:", "double", "double")
    def half(self, x): return x / 2

    @objc("isPositive:", "BOOL", "long")
    def positive(self, x): return int(x > 0)

    @objc("makeChild:", "BOOL", "id*")                             # an out-parameter, as NSError ** is
    def make_child(self, out):
      emu_ffi.cast("id *", out)[0] = emu_ffi.cast("id", BGProbeChild.make().autorelease().addr)
      return 1

    @objc("explode", "void")
    def explode(self): raise ValueError("raised inside a method")

  class BGProbeChild(BGProbe):
    """A subclass: it inherits its methods through the runtime's class hierarchy."""

  PROTOTYPES = {"scaleSize:by:": Signature("MTLSize", ("MTLSize", "double")), "rangeAfter:": Signature("NSRange", ("NSRange",)),
                "sum:b:c:d:e:f:g:h:": Signature("long", ("long",) * 8), "half:": Signature("double", ("double",)),
                "isPositive:": Signature("BOOL", ("long",)), "makeChild:": Signature("BOOL", ("id*",)),
                "explode": Signature("void", ())}


@pytest.fixture
def rt(monkeypatch):
  for name, sig in PROTOTYPES.items(): monkeypatch.setitem(selectors.SELECTORS, name, sig)
  runtime().register(BGProbeChild)
  bridge = ObjC(metal_framework.EmulatedMetal())
  before = {o.addr for o in runtime().live()}
  yield bridge
  leaked = [o for o in runtime().live() if o.addr not in before]
  assert not leaked, f"objects left alive by the test: {leaked}"


def test_classes_made_at_run_time_are_gnu_runtime_classes(rt):
  lib = runtime().lib
  for name in (b"BGProbe", b"BGProbeChild", b"NSObject", b"MTLEmuDevice"):
    assert lib.objc_getClass(name) != emu_ffi.NULL, name
  child = rt.new("BGProbeChild")
  imp = lib.objc_msg_lookup(emu_ffi.cast("id", addr(child)), lib.sel_registerName(b"half:"))
  assert imp != emu_ffi.NULL                       # inherited from BGProbe through the runtime's hierarchy
  assert rt.send(child, "half:", 5.0) == 2.5
  assert rt.cls("BGProbeChild") != rt.cls("BGProbe")
  rt.release(child)


def test_typed_sends_with_structs_by_value(rt):
  probe = rt.new("BGProbe")
  size = rt.send(probe, "scaleSize:by:", (2, 3, 40), 1.5)       # MTLSize in memory, returned through objc_msgSend_stret
  assert (size.width, size.height, size.depth) == (3, 4, 60)
  r = rt.send(probe, "rangeAfter:", (5, 7))
  assert (r.location, r.length) == (12, 7)
  assert rt.send(probe, "sum:b:c:d:e:f:g:h:", *range(1, 9)) == 36
  assert rt.send(probe, "half:", 3.0) == 1.5
  assert rt.send(probe, "isPositive:", 4) == 1 and rt.send(probe, "isPositive:", -4) == 0
  rt.release(probe)


def test_out_parameter_and_autorelease_pool(rt):
  probe = rt.new("BGProbe")
  with rt.pool():
    out = rt.out()
    assert rt.send(probe, "makeChild:", out) == 1 and out[0] != NULL
    child = runtime().obj(addr(out[0]))
    assert type(child) is BGProbeChild and child.refs == 1       # +0 to us: the pool holds it
  assert child.addr in runtime().zombies                          # drained with the pool
  rt.release(probe)


def test_reference_counting_by_cocoa_rules(rt):
  probe = rt.new("BGProbe")
  assert rt.send(probe, "retainCount") == 1
  rt.retain(probe)
  assert rt.send(probe, "retainCount") == 2
  rt.release(probe)
  rt.release(probe)                                               # back to 0: deallocated (kept as a zombie)
  with pytest.raises(ObjCError, match="message sent to deallocated instance"): rt.send(probe, "release")
  with pytest.raises(ObjCError, match="message sent to deallocated instance"): rt.send(probe, "half:", 1.0)
  errors = runtime().errors
  assert any("BGProbe" in e and "release" in e for e in errors)
  errors.clear()


def test_autorelease_without_a_pool_is_reported(rt):
  probe = rt.new("BGProbe")
  with pytest.raises(ObjCError, match="no pool in place - just leaking"): rt.send(probe, "autorelease")
  runtime().errors.clear()
  rt.release(probe)


def test_a_leak_is_visible(rt):
  before = {o.addr for o in runtime().live()}
  probe = rt.new("BGProbe")
  leaked = [o for o in runtime().live() if o.addr not in before]
  assert [type(o).__name__ for o in leaked] == ["BGProbe"] and "BGProbe" in runtime().report()
  rt.release(probe)


def test_exception_inside_a_method_is_raised_at_the_sender(rt):
  probe = rt.new("BGProbe")
  with pytest.raises(ValueError, match="raised inside a method"): rt.send(probe, "explode")
  assert rt.send(probe, "half:", 8.0) == 4.0                     # and only once
  rt.release(probe)


def test_nsstring_round_trip(rt):
  with rt.pool():
    s = rt.nsstring("Metal \u00e9")
    assert rt.string(s) == "Metal \u00e9" and rt.send(s, "length") == 7
    assert type(runtime().obj(addr(s))) is NSString


def test_unknown_selector_and_nil_receiver_are_refused(rt):
  from baregrad.drivers.metal.objc import ObjCError as BridgeError
  with pytest.raises(BridgeError, match="not in drivers/metal/selectors.py"): rt.send(rt.cls("NSObject"), "frobnicate")
  with pytest.raises(BridgeError, match="receiver is nil"): rt.send(NULL, "release")


def test_selector_ownership_follows_the_naming_rule():
  for name, sig in selectors.SELECTORS.items():
    if sig.restype != "id": assert sig.owned is None, name; continue
    plus_one = name.split(":")[0].startswith(("alloc", "new", "copy", "mutableCopy")) or name in ("init", "retain")
    assert sig.owned is plus_one, f"{name}: +1 is {sig.owned}, the naming rule says {plus_one}"


def test_emulated_framework_implements_the_table_prototypes():
  """Every method the emulated framework implements for a selector of the table has the table's C prototype, and
  every selector the driver sends is implemented by some emulated class."""
  implemented = {}
  for cls in (*metal_framework.CLASSES, NSObject, NSString, metal_framework.NSError):
    for fn in vars(cls).values():
      if hasattr(fn, "objc"):
        name, restype, argtypes, _ = fn.objc
        implemented.setdefault(name, set()).add((restype, tuple(argtypes)))
  for name, sig in selectors.SELECTORS.items():
    assert name in implemented, f"{name} is in the table but no emulated class implements it"
    assert implemented[name] == {(sig.restype, sig.argtypes)}, f"{name}: table {sig[:2]}, emulated {implemented[name]}"
