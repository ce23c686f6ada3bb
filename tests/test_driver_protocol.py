"""Every driver implements the whole Driver protocol (hcq/driver.py), and every kernel interface the whole Kernel
protocol (drivers/kernel.py): each member is defined on the class, each method takes the protocol's parameters
(same names, same order, extra ones only with defaults), and nothing in hcq/ or tools/ probes a driver with
getattr/hasattr. Encoding has no side effects and puts every symbolic value where its patch says."""
import ast, inspect
from pathlib import Path
import pytest

from baregrad.drivers import kernel as kernel_mod, settings
from baregrad.drivers.amd.driver import AMDDriver
from baregrad.drivers.cpu.driver import CPUDriver
from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
from baregrad.drivers.encoded import Bits, Encoded, Fixup
from baregrad.drivers.nv.driver import NVDriver
from baregrad.hcq.driver import Driver
from baregrad.hcq.queue import Slot

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = {"CPU": CPUDriver, "AMD": AMDDriver, "NV": NVDriver}
KERNELS = [kernel_mod.KernelInterface, EmulatedKFD, EmulatedNVKernel]


def members(protocol) -> tuple[list[str], list[str]]:
  """(data attributes, methods) a protocol declares."""
  data = [n for n in protocol.__annotations__ if not n.startswith("_")]
  methods = [n for n, v in vars(protocol).items() if not n.startswith("_") and isinstance(v, (classmethod, type(members)))]
  return data, methods


def signature_problems(protocol, cls) -> list[str]:
  """How the methods of `cls` differ from the protocol's: missing, or parameters that do not match."""
  problems = []
  for name in members(protocol)[1]:
    if name not in dir(cls): problems.append(f"{cls.__name__}.{name} is missing"); continue
    want = list(inspect.signature(getattr(protocol, name)).parameters.values())
    have = list(inspect.signature(getattr(cls, name)).parameters.values())
    if isinstance(vars(protocol)[name], classmethod) != isinstance(inspect.getattr_static(cls, name), classmethod):
      problems.append(f"{cls.__name__}.{name}: classmethod in one, not the other"); continue
    for k, p in enumerate(want):
      if k >= len(have): problems.append(f"{cls.__name__}.{name} lacks parameter {p.name!r}"); break
      if have[k].name != p.name or have[k].kind != p.kind:
        problems.append(f"{cls.__name__}.{name}: parameter {k} is {have[k]}, the protocol's is {p}"); break
      if p.default is not inspect.Parameter.empty and have[k].default is inspect.Parameter.empty:
        problems.append(f"{cls.__name__}.{name}: parameter {p.name!r} needs a default, as in the protocol")
    for extra in have[len(want):]:
      if extra.default is inspect.Parameter.empty and extra.kind not in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD):
        problems.append(f"{cls.__name__}.{name}: extra parameter {extra.name!r} without a default")
  return problems


def test_the_signature_check_finds_differences():
  class Partial:
    name = "X"
    def alloc(self, size): ...                          # renamed parameter
    def free(self, mem, now): ...                       # an extra one without a default
    def view(self, addr: int, nbytes: int, offset: int = 0): ...   # an extra one with a default: fine
    def probe(self): ...                                # not a classmethod
  problems = "\n".join(signature_problems(Driver, Partial))
  assert "Partial.alloc: parameter 1 is size" in problems and "extra parameter 'now'" in problems
  assert "Partial.view" not in problems and "Partial.probe: classmethod" in problems
  assert "Partial.encode is missing" in problems and "Partial.close is missing" in problems


@pytest.mark.parametrize("kind", DRIVERS)
def test_driver_class_implements_every_method(kind):
  assert signature_problems(Driver, DRIVERS[kind]) == []


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.__name__)
def test_kernel_interface_implements_every_method(cls):
  assert signature_problems(kernel_mod.Kernel, cls) == []
  assert isinstance(cls.emulated, bool) and cls.emulated == (cls is not kernel_mod.KernelInterface)


@pytest.fixture(scope="module")
def drivers():
  made = {"CPU": CPUDriver(), "AMD": AMDDriver(kernel=EmulatedKFD(), timeout=10), "NV": NVDriver(kernel=EmulatedNVKernel())}
  yield made
  for d in made.values(): d.close()


@pytest.mark.parametrize("kind", DRIVERS)
def test_driver_attributes(drivers, kind):
  d = drivers[kind]
  data, _ = members(Driver)
  assert all(name in dir(d) for name in data), [n for n in data if n not in dir(d)]
  assert isinstance(d, Driver) and d.name == kind
  assert type(d.has_copy_queue) is bool and d.has_copy_queue == (kind != "CPU")
  assert type(d.emulated) is bool and d.emulated == (kind != "CPU")        # the fixture's GPUs are the emulated ones
  assert type(d.timestamp_hz) is int and d.timestamp_hz == (100_000_000 if kind == "AMD" else 1_000_000_000)
  assert d.target == {"CPU": None, "AMD": "gfx1100", "NV": "sm_90"}[kind]
  with settings.override(EMU=1): assert d.probe()["available"] is True


class _Signal:
  def __init__(self, addr): self.addr, self.timestamp_addr, self.name = addr, addr + 8, "s"


@pytest.mark.parametrize("kind", DRIVERS)
@pytest.mark.parametrize("queue", ["compute", "copy"])
def test_encode_is_pure_and_patches_hold_the_values(drivers, kind, queue):
  """The same commands encode to the same words twice; a patched word holds 0 until resolved and then exactly the
  bits its patch names; resolving takes nothing else from var_vals."""
  d = drivers[kind]
  mem = d.alloc(4096)
  sig = _Signal(mem.addr)
  cmds = [("copy", Slot("dst"), Slot("src") + 64, 128), ("barrier",), ("wait", sig, Slot("gate")),
          ("signal", sig, Slot("value")), ("timestamp", _Signal(mem.addr + 16))]
  first, again = d.encode(queue, cmds), d.encode(queue, cmds)
  assert isinstance(first, Encoded) and first.words == again.words
  assert all(isinstance(fix, Fixup) and first.words[i] == 0 for i, fix in first.fixups)   # (AMD: trace markers)
  assert all(isinstance(part, Bits) and first.words[i] == 0 for i, part in first.patches)
  names = {part.value.name for _, part in first.patches}
  assert names == {"dst", "src", "gate", "value"}
  vals = {"dst": 0x1234_5678_9ABC_D000, "src": 0x0FED_CBA9_8765_4000, "gate": 2**40 + 3, "value": 2**33 + 7}
  resolved = first.resolved(vals)
  assert not resolved.patches and first.patches                  # the original is left as it was
  for i, part in first.patches:
    v = part.value.resolve(vals)
    assert resolved.words[i] == (v >> part.shift) & ((1 << part.width) - 1)
  halves = {(part.shift, part.width) for _, part in first.patches if part.value.name == "value"}
  assert halves == ({(0, 64)} if kind == "CPU" else {(0, 32), (32, 32)})    # 64-bit words, or two dwords
  d.free(mem)


PROBED = ("driver", "kernel", "self.k")


def _probes(path: Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and node.args:
      target = ast.unparse(node.args[0])
      if any(word in target for word in PROBED) or target in ("cls", "kern"):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
  return found


def test_no_capability_probes_on_drivers():
  files = [*(ROOT / "hcq").glob("*.py"), *(ROOT / "tools").glob("*.py"), ROOT / "compiler" / "search.py",
           *(ROOT / "drivers" / kind.lower() / "driver.py" for kind in DRIVERS)]
  assert [p for f in files for p in _probes(f)] == []
