"""C compiler front end for the CPU device: C source in, relocatable ELF object (.o) bytes out.

The object is loaded by baregrad's own loader (`elf.py`), so it is compiled freestanding and
position independent: no startup code, no libc headers, every libc call goes through a GOT slot
that the loader fills. Objects are cached on disk (`drivers/diskcache.py`, kind "cc") by a hash of
everything that decides the bytes (compiler path and version, host CPU when `-march=native` is used,
flags, source); a cached object is executed, so that cache checks who can write it and each entry's hash.

Environment:
  CC               compiler to use (a path or a name on PATH); default: the first of COMPILERS found
  BAREGRAD_CACHE   cache directory, CACHE=0 no cache lookups: see `drivers/diskcache.py`
"""
from __future__ import annotations
import functools, os, platform, shutil, subprocess, tempfile, threading, warnings
from pathlib import Path
from baregrad.drivers import diskcache, settings

COMPILERS = ("clang", "clang-22", "clang-19", "gcc", "cc")
DEFAULT_FLAGS = ("-O3", "-march=native", "-fPIC", "-ffreestanding", "-fno-math-errno", "-fno-stack-protector",
                 "-fno-asynchronous-unwind-tables", "-fno-exceptions", "-fno-plt") + (
                 # AArch64 Linux: gcc >= 10 and clang call libgcc's __aarch64_* helpers for atomics by default
                 # (-moutline-atomics); those live only in the static libgcc, which the loader cannot resolve
                 ("-mno-outline-atomics",) if platform.machine() in ("aarch64", "arm64") and platform.system() == "Linux" else ())

# x86-64 -march=native: both gcc and clang tune for Intel cores with 256-bit vectors preferred (the width their
# vectorizers use, and clang splits our 64-byte vector types into pairs of ymm), even where AVX-512 is there; the
# kernels' 64-byte tiles want zmm registers (32 of them: a 16-accumulator matmul tile otherwise spills).
# gcc 12 `-Q --help=target`, clang 19 `-###`: "-mprefer-vector-width= 256" for -march=rocketlake/sapphirerapids.
VECTOR_WIDTH_FLAGS = ("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ()

# The loader (elf.py) reads ELF only, and macOS compilers emit Mach-O by default: on Darwin every compile names an ELF
# target for clang explicitly (the kernels are freestanding, so a Linux target needs no Linux headers or libraries),
# and on arm64 keeps x18 unused: it is the platform register there (Apple, "Writing ARM64 code for Apple platforms").
ELF_TARGET_FLAGS = ((f"--target={'aarch64' if platform.machine() == 'arm64' else platform.machine()}-unknown-linux-gnu",)
                    + (("-ffixed-x18",) if platform.machine() == "arm64" else ())) if platform.system() == "Darwin" else ()

# in-process counters, so callers and tests can see whether the cache worked
stats = {"compiles": 0, "cache_hits": 0}
_stats_lock = threading.Lock()


class CompilerNotFound(RuntimeError):
  pass


class CompileError(RuntimeError):
  pass


def find_compiler() -> str:
  """Absolute path of the C compiler: $CC if set, else the first of COMPILERS on PATH."""
  if (cc := settings.CC):
    if (found := shutil.which(cc)) is None:
      raise CompilerNotFound(f"CC={cc!r} is not an executable file (or a name on PATH). Point CC at gcc or clang, "
                             "or unset it to use the first of " + ", ".join(COMPILERS) + " found on PATH.")
    return found
  for name in COMPILERS:
    if (found := shutil.which(name)) is not None: return found
  raise CompilerNotFound("no C compiler found: the CPU device compiles its kernels with gcc or clang. Install one "
                         "(Debian/Ubuntu: `apt-get install gcc`) or point CC at one. Looked for "
                         + ", ".join(COMPILERS) + " on PATH.")


@functools.cache
def compiler_version(cc: str) -> str:
  """First line of `cc --version` (cached per process)."""
  try:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60)
  except OSError as e:
    raise CompilerNotFound(f"cannot run C compiler {cc!r}: {e}") from e
  lines = (out.stdout or out.stderr).strip().splitlines()
  if out.returncode != 0 or not lines:
    raise CompilerNotFound(f"{cc!r} --version failed (exit {out.returncode}): {out.stderr.strip()}")
  return lines[0]


@functools.cache
def _host_cpu() -> str:
  """What `-march=native` depends on: the CPU model and its feature flags."""
  try:
    with open("/proc/cpuinfo") as f: info = f.read()
  except OSError:
    import platform
    return platform.machine() + " " + platform.processor()
  keep = ("model name", "flags", "Features", "CPU implementer", "CPU part")
  lines = [line for line in info.splitlines() if line.split(":")[0].strip() in keep]
  return "\n".join(dict.fromkeys(lines))  # the same lines repeat per core


def _cache_key(cc: str, flags: tuple, src: str) -> str:
  host = _host_cpu() if any(f.endswith("=native") for f in flags) else ""
  return diskcache.hash_key(cc, compiler_version(cc), host, list(flags), src)


def numbered_source(src: str) -> str:
  """`src` with a right-aligned line number before each line, as compile errors show it."""
  lines = src.splitlines()
  width = len(str(len(lines)))
  return "\n".join(f"{i:{width}d} | {line}" for i, line in enumerate(lines, 1))


def _run_compiler(cc: str, flags: tuple, src: str) -> tuple[int, str, bytes | None]:
  """(exit status, stderr, object bytes or None)"""
  with tempfile.TemporaryDirectory(prefix="baregrad-cc-") as tmp:
    out = Path(tmp) / "kernel.o"
    proc = subprocess.run([cc, *flags, *ELF_TARGET_FLAGS, "-c", "-x", "c", "-", "-o", str(out)], input=src.encode(),
                          capture_output=True, timeout=600)
    obj = out.read_bytes() if proc.returncode == 0 and out.exists() else None
  return proc.returncode, proc.stderr.decode(errors="replace").strip(), obj


@functools.cache
def _accepted_flags(cc: str, flags: tuple) -> tuple:
  """The flags `cc` accepts, each tried alone on an empty file. Used only after a failed compile."""
  def ok(flag):
    return subprocess.run([cc, *ELF_TARGET_FLAGS, flag, "-Werror", "-fsyntax-only", "-x", "c", "-"],
                          input=b"int baregrad_probe;\n", capture_output=True, timeout=60).returncode == 0
  keep = tuple(f for f in flags if ok(f))
  if keep != flags:
    warnings.warn(f"{cc} rejects {[f for f in flags if f not in keep]}; compiling without them", stacklevel=3)
  return keep


FLOAT16_PROBE = """typedef short hs8 __attribute__((vector_size(16)));
typedef float fs4 __attribute__((vector_size(16)));
float from_bits(unsigned short u) { return __builtin_ia32_vcvtph2ps((hs8){(short)u, 0, 0, 0, 0, 0, 0, 0})[0]; }
unsigned short to_bits(float f) { return (unsigned short)__builtin_ia32_vcvtps2ph((fs4){f, 0, 0, 0}, 4)[0]; }
"""


@functools.cache
def supports_float16() -> bool:
  """Whether the CPU kernels can convert float16 <-> float32 with the hardware's instructions: x86 F16C
  (VCVTPH2PS/VCVTPS2PH, under -march=native) through the compiler's builtins for them (gcc and clang). Not through
  the _Float16 type: a freestanding kernel may not call libgcc's helpers, which compilers use for some _Float16
  arithmetic (a comparison of two converted halves becomes __nehf2)."""
  if platform.machine() not in ("x86_64", "AMD64"): return False
  try: return _run_compiler(find_compiler(), DEFAULT_FLAGS, FLOAT16_PROBE)[0] == 0
  except (CompilerNotFound, OSError, subprocess.SubprocessError): return False


def compile_c(src: str, flags: tuple = DEFAULT_FLAGS) -> bytes:
  """Compile C source to a relocatable ELF object and return its bytes (cached on disk)."""
  cc, flags = find_compiler(), tuple(flags)
  key = _cache_key(cc, flags + ELF_TARGET_FLAGS, src) + ".o"
  if (obj := diskcache.get("cc", key)) is not None:
    with _stats_lock: stats["cache_hits"] += 1
    return obj
  status, stderr, obj = _run_compiler(cc, flags, src)
  if status != 0 and (usable := _accepted_flags(cc, flags)) != flags:
    status, stderr, obj = _run_compiler(cc, usable, src)
  if status != 0 or obj is None:
    raise CompileError(f"{cc} failed (exit {status}) compiling a CPU kernel with {' '.join(flags)}\n"
                       f"--- compiler output ---\n{stderr}\n--- source ---\n{numbered_source(src)}")
  with _stats_lock: stats["compiles"] += 1
  diskcache.put("cc", key, obj)   # a read-only, full or unsafe cache is a warning there, never an error
  return obj
