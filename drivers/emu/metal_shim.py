"""MSL source compiled as C++17 against the `metal_stdlib` shim (metal_shim/) and run over the grid on the host: the
kernels of the emulated Metal framework (drivers/emu/metal_framework.py), as ../../shared/METAL.md section 3 describes.

`compile_library(src)` parses every `kernel void name(...)` signature, appends one launcher per kernel
(`extern "C" int bg_launch_<name>(void **args, const unsigned *dims)`: dims = threadgroups x, y, z then threads per
threadgroup x, y, z) that runs the grid in plain loops, compiles the whole with the system C++ compiler into a shared
object (cached on disk by a hash of compiler, flags, shim and source: drivers/diskcache.py, kind "metal-emu") and
loads it. A kernel argument is one pointer per buffer index: the buffer's contents plus offset, or the bytes
`setBytes` gave. Threadgroup memory, barriers and simdgroup functions would need each threadgroup's threads to run as
fibers; compiler/render_msl.py emits none of them, so a source that uses them is refused here, by name.
"""
from __future__ import annotations
import functools, re, shutil, subprocess, tempfile
from dataclasses import dataclass
from pathlib import Path
import cffi
from .. import diskcache

SHIM_DIR = Path(__file__).resolve().parent / "metal_shim"
COMPILERS = ("g++", "clang++", "clang++-22", "clang++-19", "c++")
# -fwrapv: signed overflow wraps as on the GPU; -ffp-contract=off: no fused multiply-add the source did not ask for
# (MTLCompileOptions.fastMathEnabled = NO); with fast math on, the host compiler's -ffast-math stands in for it
FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC", "-fwrapv", "-fno-exceptions", "-fno-rtti")
QUIET = {"gcc": ("-Wno-attributes",), "clang": ("-Wno-unknown-attributes",)}   # [[buffer(n)]] means nothing to them
# fast math as -ffast-math's parts: -ffast-math itself (and -funsafe-math-optimizations) links crtfastmath.o, whose
# constructor sets FTZ/DAZ in MXCSR for the whole process when the library is loaded, so every later float op of
# the process (numpy included) would flush denormals
PRECISE = ("-ffp-contract=off",)
FAST = ("-fassociative-math", "-freciprocal-math", "-fno-signed-zeros", "-fno-trapping-math", "-ffinite-math-only",
        "-fno-math-errno", "-ffp-contract=fast")
# the [[attribute]] of a thread-position parameter -> the launcher's expression for it (MSL spec 5.2.3.6)
THREAD_ATTRIBUTES = {
  "thread_position_in_grid": ("g{c} * d[{k}] + t{c}",), "threadgroup_position_in_grid": ("g{c}",),
  "thread_position_in_threadgroup": ("t{c}",), "threads_per_threadgroup": ("d[{k}]",),
  "threadgroups_per_grid": ("d[{j}]",),
}
UNSUPPORTED = ("threadgroup_barrier", "simdgroup_barrier", "simd_", "threadgroup ", "thread_index_in_simdgroup")

_ffi = cffi.FFI()
_ffi.cdef("void *dlopen(const char *file, int mode); void *dlsym(void *handle, const char *name); "
          "int dlclose(void *handle); char *dlerror(void);")
_libc = _ffi.dlopen(None)
RTLD_NOW = 2


class ShimCompileError(RuntimeError):
  """The host compiler rejected the source (the text is what it printed), or the source uses what the shim lacks."""


@dataclass(frozen=True)
class Param:
  ctype: str          # as written: "device float*", "constant long&", "uint3"
  name: str
  attribute: str      # "buffer" or a THREAD_ATTRIBUTES key
  index: int          # the buffer index, -1 for thread positions

  @property
  def is_reference(self) -> bool: return self.ctype.rstrip().endswith("&")


@dataclass(frozen=True)
class KernelSignature:
  name: str
  params: tuple[Param, ...]

  @property
  def buffers(self) -> dict[int, Param]: return {p.index: p for p in self.params if p.attribute == "buffer"}


_KERNEL = re.compile(r"\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(")
_PARAM = re.compile(r"^(?P<type>.*?[\s*&])(?P<name>[A-Za-z_]\w*)\s*\[\[\s*(?P<attr>\w+)\s*(?:\(\s*(?P<index>\d+)\s*\))?\s*\]\]$")


def parse_kernels(src: str) -> list[KernelSignature]:
  """Every `kernel void name(...)` of `src` with its parameters; each must carry an attribute: [[buffer(n)]] or a
  thread position (the renderer writes them all)."""
  kernels = []
  for m in _KERNEL.finditer(src):
    depth, end = 1, m.end()
    while depth:
      if end >= len(src): raise ShimCompileError(f"kernel {m.group(1)}: unbalanced parentheses in its parameter list")
      depth += {"(": 1, ")": -1}.get(src[end], 0)
      end += 1
    params, pieces, depth, start = [], [], 0, m.end()
    text = src[m.end():end - 1]
    for k, ch in enumerate(text + ","):
      if ch in "([": depth += 1
      elif ch in ")]": depth -= 1
      elif ch == "," and depth == 0: pieces.append(text[start - m.end():k].strip()); start = m.end() + k + 1
    for piece in filter(None, pieces):
      pm = _PARAM.match(" ".join(piece.split()))
      if pm is None: raise ShimCompileError(f"kernel {m.group(1)}: parameter {piece!r} has no [[buffer(n)]] or thread attribute")
      attr = pm.group("attr")
      if attr != "buffer" and attr not in THREAD_ATTRIBUTES:
        raise ShimCompileError(f"kernel {m.group(1)}: attribute [[{attr}]] of {pm.group('name')} is not emulated "
                               f"(have buffer, {', '.join(THREAD_ATTRIBUTES)})")
      index = int(pm.group("index")) if attr == "buffer" else -1
      params.append(Param(pm.group("type").strip(), pm.group("name"), attr, index))
    kernels.append(KernelSignature(m.group(1), tuple(params)))
  return kernels


def launcher(k: KernelSignature) -> str:
  """The extern "C" function that runs kernel `k` over the whole grid, one thread after the other."""
  args = []
  for p in k.params:
    if p.attribute == "buffer":
      args.append(f"*({p.ctype[:-1]}*)args[{p.index}]" if p.is_reference else f"({p.ctype})args[{p.index}]")
      continue
    comps = [THREAD_ATTRIBUTES[p.attribute][0].format(c=c, k=3 + i, j=i) for i, c in enumerate("xyz")]
    args.append(f"metal::uint3{{{', '.join(comps)}}}" if p.ctype.endswith("3") else f"({p.ctype})({comps[0]})")
  loops = "".join(f"for (uint g{c} = 0; g{c} < d[{i}]; g{c}++) " for i, c in reversed(list(enumerate("xyz"))))
  loops += "".join(f"for (uint t{c} = 0; t{c} < d[{3 + i}]; t{c}++) " for i, c in reversed(list(enumerate("xyz"))))
  return (f'extern "C" int bg_launch_{k.name}(void **args, const unsigned *d) {{\n  (void)args;\n'
          f"  {loops}{k.name}({', '.join(args)});\n  return 0;\n}}\n")


def find_compiler() -> str:
  for name in COMPILERS:
    if (path := shutil.which(name)) is not None: return path
  raise ShimCompileError("no C++ compiler found: the emulated Metal device compiles MSL as C++ with one of "
                         f"{', '.join(COMPILERS)} (Debian/Ubuntu: `apt-get install g++`)")


@functools.cache
def _version(cxx: str) -> str:
  out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
  return (out.stdout or out.stderr).strip().splitlines()[0]


def translation_unit(src: str) -> tuple[str, list[KernelSignature]]:
  """The C++ the host compiler gets: the MSL source (it includes <metal_stdlib>) and the launchers."""
  for word in UNSUPPORTED:
    if word in src:
      raise ShimCompileError(f"the emulated Metal compiler does not run threadgroup memory, barriers or simdgroup "
                             f"functions (found {word.strip()!r}); compiler/render_msl.py emits none")
  kernels = parse_kernels(src)
  return src + "\n// ---- launchers (drivers/emu/metal_shim.py) ----\n" + "".join(launcher(k) for k in kernels), kernels


def compile_so(src: str, fast_math: bool = False, compiler: str | None = None) -> tuple[bytes, list[KernelSignature]]:
  """(shared object bytes, kernels) for MSL `src`; ShimCompileError with the compiler's output when it fails."""
  cxx = compiler or find_compiler()
  unit, kernels = translation_unit(src)
  flags = FLAGS + QUIET["clang" if "clang" in _version(cxx) else "gcc"] + (FAST if fast_math else PRECISE)
  shim = (SHIM_DIR / "metal_stdlib").read_text()
  key = diskcache.hash_key("metal-emu", cxx, _version(cxx), list(flags), shim, unit) + ".so"
  if (data := diskcache.get("metal-emu", key)) is not None: return data, kernels
  with tempfile.TemporaryDirectory(prefix="baregrad-msl-") as tmp:
    out = Path(tmp) / "library.so"
    proc = subprocess.run([cxx, *flags, f"-I{SHIM_DIR}", "-x", "c++", "-", "-o", str(out)], input=unit.encode(),
                          capture_output=True, timeout=600)
    if proc.returncode != 0 or not out.exists():
      raise ShimCompileError(f"program_source: {cxx} (standing in for the Metal compiler) failed:\n"
                             + proc.stderr.decode(errors="replace").strip())
    data = out.read_bytes()
  diskcache.put("metal-emu", key, data)
  return data, kernels


def check_syntax(src: str, compiler: str | None = None) -> None:
  """Compile `src` (with its launchers) only as far as the front end goes: ShimCompileError with what it printed."""
  cxx = compiler or find_compiler()
  unit, _ = translation_unit(src)
  flags = ("-std=c++17", "-fsyntax-only", "-fwrapv") + QUIET["clang" if "clang" in _version(cxx) else "gcc"]
  proc = subprocess.run([cxx, *flags, f"-I{SHIM_DIR}", "-x", "c++", "-"], input=unit.encode(), capture_output=True,
                        timeout=600)
  if proc.returncode != 0: raise ShimCompileError(f"{cxx} -fsyntax-only failed:\n" + proc.stderr.decode(errors="replace"))


class Library:
  """A compiled library: its kernels' signatures and launch functions (unloaded with `close`)."""

  def __init__(self, src: str, fast_math: bool = False, compiler: str | None = None):
    data, kernels = compile_so(src, fast_math, compiler)
    self.kernels = {k.name: k for k in kernels}
    fd, path = tempfile.mkstemp(prefix="baregrad-msl-", suffix=".so")
    try:
      with open(fd, "wb", closefd=True) as f: f.write(data)
      self.handle = _libc.dlopen(path.encode(), RTLD_NOW)
    finally:
      Path(path).unlink()
    if self.handle == _ffi.NULL: raise ShimCompileError(f"dlopen of the compiled library failed: {_ffi.string(_libc.dlerror()).decode()}")
    self.launch = {}
    for name in self.kernels:
      fn = _libc.dlsym(self.handle, f"bg_launch_{name}".encode())
      self.launch[name] = _ffi.cast("int (*)(void **, const unsigned *)", fn)

  def run(self, name: str, pointers: list[int], grid: tuple, block: tuple) -> None:
    """Run kernel `name` over `grid` threadgroups of `block` threads; pointers[i] is buffer index i's address."""
    args = _ffi.new("void *[]", [_ffi.cast("void *", p) for p in pointers] or [_ffi.NULL])
    rc = self.launch[name](args, _ffi.new("unsigned[6]", [*grid, *block]))
    if rc != 0: raise RuntimeError(f"kernel {name} returned {rc}")

  def close(self) -> None:
    if self.handle is not None and self.handle != _ffi.NULL: _libc.dlclose(self.handle)
    self.handle, self.launch = None, {}
