"""MSL source compiled as C++17 against the `metal_stdlib` shim (metal_shim/) and run over the grid on the host: the
kernels of the emulated Metal framework (drivers/emu/metal_framework.py), as ../../shared/METAL.md section 3 describes.

`compile_so(src)` parses every `kernel void name(...)` signature, appends one launcher per kernel
(`extern "C" int bg_launch_<name>(void **args, const unsigned *dims)`: dims = threadgroups x, y, z then threads per
threadgroup x, y, z), compiles the whole with the system C++ compiler into a shared object (cached on disk by a hash
of compiler, flags, shim and source: drivers/diskcache.py, kind "metal-emu") and loads it. A kernel argument is one
pointer per buffer index: the buffer's contents plus offset, or the bytes `setBytes` gave.

Threadgroups (MSL spec 4.4, 6.9): each `threadgroup T name[n];` declaration of a kernel becomes a reference into
the threadgroup's memory (all ones when a threadgroup starts: its contents are undefined), laid out at 16-byte
aligned offsets (the feature set tables' threadgroup memory alignment); `bg_threadgroup_memory_<name>()` gives the
total, which the framework holds against the 32 KiB limit. A library that calls threadgroup_barrier,
simdgroup_barrier or a simd_* function runs each threadgroup's threads as fibers, switched at every such call
(metal_stdlib's bg::run_threadgroups: a barrier lets the threads go on once all reached it and fails the launch, by
name, when some returned instead; a SIMD-group function meets the lanes of its 32-wide SIMD-group); any other
library runs the grid in plain loops, one thread after the other.
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
# the [[attribute]] of a thread-position parameter -> the launcher's expression for it (MSL spec 5.2.3.6), over the
# threadgroup g{x,y,z}, the thread in it t{x,y,z} and the launch d[] (threadgroups x y z, threads per threadgroup x y z);
# {c} is a component (the attribute is a uint3, or a uint that takes .x), {b} its threads-per-threadgroup word and
# {g} its threadgroups word. Lanes of a SIMD-group are consecutive thread_index_in_threadgroup values, 32 of them.
LINEAR = "(tx + d[3] * (ty + d[4] * tz))"
THREAD_ATTRIBUTES = {
  "thread_position_in_grid": "g{c} * d[{b}] + t{c}", "threadgroup_position_in_grid": "g{c}",
  "thread_position_in_threadgroup": "t{c}", "threads_per_threadgroup": "d[{b}]", "threadgroups_per_grid": "d[{g}]",
  "threads_per_grid": "d[{g}] * d[{b}]", "thread_index_in_threadgroup": LINEAR,
  "thread_index_in_simdgroup": f"{LINEAR} % 32", "simdgroup_index_in_threadgroup": f"{LINEAR} / 32",
  "threads_per_simdgroup": "32", "simdgroups_per_threadgroup": "(d[3] * d[4] * d[5] + 31) / 32",
}
# calls that make threads of a threadgroup wait for each other: such a library runs on fibers
FIBER_CALLS = re.compile(r"\b(threadgroup_barrier|simdgroup_barrier|simd_\w+)\s*\(")
# `threadgroup [__attribute__((aligned(n)))] T name[n]...;` (MSL 4.4: no initializer)
_THREADGROUP_DECL = re.compile(r"\bthreadgroup\s+(?:__attribute__\s*\(\(\s*aligned\s*\(\s*(?P<align>\d+)\s*\)\s*\)\)\s*)?"
                               r"(?P<type>(?:const\s+)?[A-Za-z_][\w:]*)\s+(?P<name>[A-Za-z_]\w*)\s*"
                               r"(?P<dims>(?:\[[^\[\];]+\]\s*)*);")
# what may remain of `threadgroup`: the address space of a pointer or reference (`threadgroup float *p`)
_THREADGROUP_POINTER = re.compile(r"\bthreadgroup\s+(?:const\s+)?[A-Za-z_][\w:]*\s*(?:const\s*)?[*&]")
THREADGROUP_ALIGN = 16     # Metal feature set tables: threadgroup memory length alignment 16 B

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
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def _closing(src: str, start: int, open_: str, close: str, what: str) -> int:
  """The index just past the `close` that balances the `open_` before `start`."""
  depth, end = 1, start
  while depth:
    if end >= len(src): raise ShimCompileError(f"{what}: unbalanced {open_}{close}")
    depth += {open_: 1, close: -1}.get(src[end], 0)
    end += 1
  return end


def _kernels(src: str):
  """(name, parameter text, body span or None) of every `kernel void name(...)` of `src`."""
  for m in _KERNEL.finditer(src):
    end = _closing(src, m.end(), "(", ")", f"kernel {m.group(1)}: its parameter list")
    brace = re.compile(r"\s*\{").match(src, end)
    body = (brace.end(), _closing(src, brace.end(), "{", "}", f"kernel {m.group(1)}: its body") - 1) if brace else None
    yield m.group(1), src[m.end():end - 1], body


def parse_kernels(src: str) -> list[KernelSignature]:
  """Every `kernel void name(...)` of `src` with its parameters; each must carry an attribute: [[buffer(n)]] or a
  thread position (the renderer writes them all)."""
  kernels = []
  for name, text, _ in _kernels(src):
    pieces, depth, start = [], 0, 0
    for k, ch in enumerate(text + ","):
      if ch in "([": depth += 1
      elif ch in ")]": depth -= 1
      elif ch == "," and depth == 0: pieces.append(text[start:k].strip()); start = k + 1
    params = []
    for piece in filter(None, pieces):
      pm = _PARAM.match(" ".join(piece.split()))
      if pm is None: raise ShimCompileError(f"kernel {name}: parameter {piece!r} has no [[buffer(n)]] or thread attribute")
      attr = pm.group("attr")
      if attr != "buffer" and attr not in THREAD_ATTRIBUTES:
        raise ShimCompileError(f"kernel {name}: attribute [[{attr}]] of {pm.group('name')} is not emulated "
                               f"(have buffer, {', '.join(THREAD_ATTRIBUTES)})")
      if attr != "buffer" and "{" not in THREAD_ATTRIBUTES[attr] and pm.group("type").strip()[-1].isdigit():
        raise ShimCompileError(f"kernel {name}: [[{attr}]] of {pm.group('name')} is a scalar (uint or ushort), not a "
                               f"{pm.group('type').strip()} (MSL spec 5.2.3.6)")
      index = int(pm.group("index")) if attr == "buffer" else -1
      params.append(Param(pm.group("type").strip(), pm.group("name"), attr, index))
    kernels.append(KernelSignature(name, tuple(params)))
  return kernels


def threadgroup_storage(src: str) -> tuple[str, dict[str, str]]:
  """`src` with each kernel's `threadgroup T name[n];` declarations made references into its threadgroup's memory
  (metal::bg::threadgroup_memory at 16-byte aligned offsets, in declaration order), and per kernel the C++ constant
  expression of the bytes they take. Any other threadgroup declaration is refused: the shim would give every thread
  its own copy."""
  sizes, out, last = {}, [], 0
  for name, _, body in _kernels(src):
    if body is None: continue
    end = "0"

    def declare(m: re.Match) -> str:
      nonlocal end
      ctype, var, dims = m.group("type"), m.group("name"), "".join(m.group("dims").split())
      offset = f"metal::bg::align_up({end}, {max(THREADGROUP_ALIGN, int(m.group('align') or 0))})"
      end = f"({offset} + sizeof({ctype}{dims}))"
      pointer = f"{ctype} (*){dims}" if dims else f"{ctype} *"
      return (f"{ctype} (&{var}){dims}" if dims else f"{ctype} &{var}") + \
          f" = *reinterpret_cast<{pointer}>(metal::bg::threadgroup_memory({offset}));"
    out += [src[last:body[0]], _THREADGROUP_DECL.sub(declare, src[body[0]:body[1]])]
    last = body[1]
    sizes[name] = f"metal::bg::align_up({end}, {THREADGROUP_ALIGN})"
  rewritten = "".join(out) + src[last:]
  code = _COMMENT.sub(lambda m: " " * len(m.group()), rewritten)
  for m in re.finditer(r"\bthreadgroup\b", code):
    if not _THREADGROUP_POINTER.match(code, m.start()):
      line = code[code.rfind("\n", 0, m.start()) + 1:code.find("\n", m.start())].strip()
      raise ShimCompileError(f"`{line}`: the emulated Metal compiler lays out threadgroup variables declared in a "
                             "kernel function's body, one per declaration, without an initializer (MSL spec 4.4: "
                             "threadgroup variables cannot be initialized)")
  return rewritten, sizes


def launcher(k: KernelSignature, fibers: bool = False, threadgroup_bytes: str = "0") -> str:
  """The extern "C" functions of kernel `k`: bg_launch_<name> runs it over the whole grid (in plain loops, one thread
  after the other, or with fibers: metal::bg::run_threadgroups), bg_threadgroup_memory_<name> gives the bytes of
  threadgroup memory it declares."""
  args = []
  for p in k.params:
    if p.attribute == "buffer":
      args.append(f"*({p.ctype[:-1]}*)args[{p.index}]" if p.is_reference else f"({p.ctype})args[{p.index}]")
      continue
    comps = [THREAD_ATTRIBUTES[p.attribute].format(c=c, b=3 + i, g=i) for i, c in enumerate("xyz")]
    args.append(f"metal::uint3{{{', '.join(comps)}}}" if p.ctype.endswith("3") else f"({p.ctype})({comps[0]})")
  call = f"{k.name}({', '.join(args)});"
  size = f'extern "C" unsigned long bg_threadgroup_memory_{k.name}(void) {{ return {threadgroup_bytes}; }}\n'
  if fibers:
    return (size + f"static void bg_thread_{k.name}(void **args, const uint *d, uint gx, uint gy, uint gz, uint tx, "
            f"uint ty, uint tz) {{\n  (void)args; (void)d; (void)gx; (void)gy; (void)gz; (void)tx; (void)ty; (void)tz;\n"
            f"  {call}\n}}\n"
            f'extern "C" int bg_launch_{k.name}(void **args, const unsigned *d) {{\n'
            f"  return metal::bg::run_threadgroups(args, d, bg_threadgroup_memory_{k.name}(), bg_thread_{k.name});\n}}\n")
  groups = "".join(f"for (uint g{c} = 0; g{c} < d[{i}]; g{c}++) " for i, c in reversed(list(enumerate("xyz"))))
  threads = "".join(f"for (uint t{c} = 0; t{c} < d[{3 + i}]; t{c}++) " for i, c in reversed(list(enumerate("xyz"))))
  return (size + f'extern "C" int bg_launch_{k.name}(void **args, const unsigned *d) {{\n  (void)args;\n'
          f"  metal::bg::PlainThreadgroups memory(bg_threadgroup_memory_{k.name}());\n"
          f"  {groups}{{\n    memory.begin();\n    {threads}{call}\n  }}\n  return 0;\n}}\n")


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
  """The C++ the host compiler gets: the MSL source (it includes <metal_stdlib>) with its threadgroup declarations
  laid out, and the launchers (on fibers when the library calls barriers or SIMD-group functions)."""
  src, sizes = threadgroup_storage(src)
  kernels = parse_kernels(src)
  fibers = FIBER_CALLS.search(_COMMENT.sub("", src)) is not None
  return (src + "\n// ---- launchers (drivers/emu/metal_shim.py) ----\n"
          + "".join(launcher(k, fibers, sizes.get(k.name, "0")) for k in kernels)
          + 'extern "C" const char *bg_last_error(void) { return metal::bg::error; }\n'), kernels


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


class KernelFault(RuntimeError):
  """A kernel stopped on the emulated GPU (a barrier not every thread of its threadgroup reached, ...)."""


class Library:
  """A compiled library: its kernels' signatures, launch functions and threadgroup memory sizes (unloaded with
  `close`)."""

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
    self.launch, self.threadgroup_memory = {}, {}
    for name in self.kernels:
      self.launch[name] = _ffi.cast("int (*)(void **, const unsigned *)", self._symbol(f"bg_launch_{name}"))
      self.threadgroup_memory[name] = int(_ffi.cast("unsigned long (*)(void)", self._symbol(f"bg_threadgroup_memory_{name}"))())
    self._error = _ffi.cast("const char *(*)(void)", self._symbol("bg_last_error"))

  def _symbol(self, name: str):
    fn = _libc.dlsym(self.handle, name.encode())
    if fn == _ffi.NULL: raise ShimCompileError(f"the compiled library has no {name}")
    return fn

  def run(self, name: str, pointers: list[int], grid: tuple, block: tuple) -> None:
    """Run kernel `name` over `grid` threadgroups of `block` threads; pointers[i] is buffer index i's address."""
    args = _ffi.new("void *[]", [_ffi.cast("void *", p) for p in pointers] or [_ffi.NULL])
    dims = _ffi.new("unsigned[6]", [*grid, *block])
    # a kernel that faults (a store outside its buffers, ...) stops as a GPU page fault, not the process: the launch
    # runs under the CPU command processor's fault guard (drivers/cpu/worker.c); a faulted launch on fibers leaves its
    # fiber stacks mapped (bounded by the faults)
    from baregrad.drivers.cpu.processor import guarded_launch, SIGNALS
    rc, sig, addr = guarded_launch(int(_ffi.cast("uintptr_t", self.launch[name])), int(_ffi.cast("uintptr_t", args)),
                                   int(_ffi.cast("uintptr_t", dims)))
    if sig: raise KernelFault(f"kernel {name}: GPU fault: stopped by {SIGNALS.get(sig, f'signal {sig}')} at address "
                              f"{addr:#x}")
    if rc != 0: raise KernelFault(f"kernel {name}: {_ffi.string(self._error()).decode(errors='replace')}")

  def close(self) -> None:
    if self.handle is not None and self.handle != _ffi.NULL: _libc.dlclose(self.handle)
    self.handle, self.launch = None, {}
