"""PTX -> cubin with NVIDIA's `ptxas`, and a reader for what a launch needs from a cubin (used by the NV driver
to load programs and by the compiler's tests; it lives in the driver layer so both can import it).

`compile_ptx` runs ptxas (the one on PATH, $PTXAS, or the one in the `nvidia-cuda-nvcc` wheel) and caches
the cubin on disk by a hash of the ptxas build, the flags and the source (`drivers/diskcache.py`, kind "ptxas").
`load_cubin` reads the cubin's ELF with pyelftools: per kernel the code (`.text.<name>`), the parameter
layout in constant bank 0, registers, shared and stack sizes, from the `.nv.info` attributes.

Facts used here, observed in ptxas 13.0 output and decoded by `cuobjdump -elf` (which names the attributes):
- a `.nv.info*` section is a list of entries `u8 format, u8 attribute, u16 value-or-size`; format 4
  (EIFMT_SVAL) is followed by `size` bytes of data; formats 1/2/3 (NVAL/BVAL/HVAL) carry no data.
- EIATTR_KPARAM_INFO (0x17): u32 index, u16 ordinal, u16 offset, u32 flags with the size in bits 18..31.
- EIATTR_PARAM_CBANK (0x0a): u32 symbol of `.nv.constant0.<name>`, u16 offset of the first parameter in
  bank 0, u16 size of the parameters. ptxas puts them at 0x160 on sm_80/sm_86/sm_89 and 0x210 on sm_90.
- EIATTR_CBANK_PARAM_SIZE (0x19, HVAL), EIATTR_MAX_THREADS (0x05: u32 x, y, z from .maxntid),
  EIATTR_MAXREG_COUNT (0x1b, HVAL), EIATTR_NUM_BARRIERS (0x4c, BVAL), EIATTR_EXIT_INSTR_OFFSETS (0x1c).
- in the module-wide `.nv.info`: EIATTR_REGCOUNT (0x2f), EIATTR_FRAME_SIZE (0x11) and EIATTR_MIN_STACK_SIZE
  (0x12), each `u32 symbol, u32 value` for the function named by the symbol.
- `.text.<name>` sh_info bits 24..31 hold the register count on sm_80 (0 on sm_90: use EIATTR_REGCOUNT).
- `.nv.shared.<name>` (NOBITS) is the static shared memory; on sm_90 its size includes the 1 KiB that
  ptxas reserves at its start (`.nv.shared.reserved.0`), so a 1024-byte `.shared` array gives 2048.
- `.nv.constant<N>.<name>` is constant bank N of a kernel (`.nv.constant<N>` without a name: of the module). Bank 0
  holds the driver's area and the parameters; ptxas puts 64-bit immediates it cannot encode in an instruction (double
  constants, e.g. the renderer's `0d3FB999999999999A`) into bank 2 (`DMUL R26, R10, c[0x2][0x0]`): the driver must
  bind every bank a kernel has, with the section's bytes.
- `.rel.<section>` / `.rela.<section>` list relocations: addresses the loader must patch into the code or a constant
  bank (R_CUDA_64 and friends; globals, function pointers). The renderer's kernels have none (3850 cached cubins
  checked, only the unloaded `.rela.debug_frame` has entries); `relocations` lists those a kernel has.
- The driver area of bank 0 (below the parameters) as ptxas 13.0 code reads it (`cuobjdump -sass` of kernels using
  %ntid, %nctaid, cvta.local / cvta.shared and a stack frame, sm_80 .. sm_90): DRIVER_AREA below.
"""
from __future__ import annotations
import functools, io, os, shutil, struct, subprocess, tempfile, threading
from dataclasses import dataclass, field
from pathlib import Path
from baregrad.drivers import diskcache, settings
from baregrad.drivers.cpu.cc import numbered_source

DEFAULT_FLAGS = ("-O3",)
stats = {"compiles": 0, "cache_hits": 0}
_stats_lock = threading.Lock()

# .nv.info formats and attributes (numbers as ptxas 13.0 writes them; names as cuobjdump prints them)
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_EXIT_INSTR_OFFSETS = 0x1C
EIATTR_REGCOUNT = 0x2F
EIATTR_NUM_BARRIERS = 0x4C

# bank 0 driver area: byte offset of each value ptxas code loads from c[0x0][...] (all sm_80 .. sm_90 code seen)
DRIVER_AREA = {
  "NTID": 0x00,            # u32 x3: %ntid (LDC / ULDC c[0x0][0x0])
  "NCTAID": 0x0C,          # u32 x3: %nctaid (c[0x0][0xc])
  "SHARED_WINDOW": 0x18,   # u64: generic address of the CTA's shared memory (cvta.shared, sm_80 .. sm_89; sm_90
                           # forms it from SR_SWINHI instead)
  "LOCAL_WINDOW": 0x20,    # u64: generic address of the thread's local memory (cvta.local: IADD3 R, R1, c[0x0][0x20])
  "STACK_POINTER": 0x28,   # u32: the stack pointer's start (every kernel's first instruction: LDC R1, c[0x0][0x28])
}
# The stack grows down from the top of the 16 MiB local window, below 0x240 bytes the ABI keeps at its top:
# STACK_POINTER = 0xFFFDC0 (what the CUDA driver writes there; tinygrad's NV runtime, which runs ptxas code on real
# GPUs through the same ioctls, writes it too), so local memory must reach from the top of the window down to
# STACK_POINTER - frame: SHADER_LOCAL_MEMORY_HIGH_SIZE >= frame + 0x240.
LOCAL_WINDOW_BYTES = 1 << 24
STACK_RESERVED = 0x240
STACK_TOP = LOCAL_WINDOW_BYTES - STACK_RESERVED


class PtxasNotFound(RuntimeError):
  pass


class PtxasError(RuntimeError):
  pass


def _wheel_ptxas() -> str | None:
  """ptxas from the `nvidia-cuda-nvcc` wheel: site-packages/nvidia/cu13/bin/ptxas (cuda_nvcc/bin for CUDA 12)."""
  try:
    import nvidia
  except ImportError:
    return None
  for root in getattr(nvidia, "__path__", []):
    for sub in ("cu13", "cuda_nvcc", "cu12"):
      cand = Path(root) / sub / "bin" / "ptxas"
      if cand.is_file() and os.access(cand, os.X_OK): return str(cand)
  return None


def find_ptxas() -> str:
  if (p := settings.PTXAS):
    if (found := shutil.which(p)) is None:
      raise PtxasNotFound(f"PTXAS={p!r} is not an executable file (or a name on PATH)")
    return found
  if (found := shutil.which("ptxas")) is not None: return found
  if (found := _wheel_ptxas()) is not None: return found
  raise PtxasNotFound("ptxas not found: the NV device turns its PTX into cubins with NVIDIA's ptxas. Install the "
                      "optional dependency baregrad[nv] (pip install nvidia-cuda-nvcc) or put ptxas on PATH "
                      "(or point PTXAS at it).")


@functools.cache
def ptxas_version(ptxas: str) -> str:
  try:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60)
  except OSError as e:
    raise PtxasNotFound(f"cannot run ptxas {ptxas!r}: {e}") from e
  if out.returncode != 0: raise PtxasNotFound(f"{ptxas!r} --version failed (exit {out.returncode}): {out.stderr.strip()}")
  return out.stdout.strip().splitlines()[-1]


def compile_ptx(src: str, arch: str = "sm_90", flags: tuple = DEFAULT_FLAGS) -> bytes:
  """Assemble a PTX module into a cubin for `arch` (e.g. "sm_90") and return its bytes (cached on disk)."""
  ptxas = find_ptxas()
  key = diskcache.hash_key(ptxas_version(ptxas), arch, list(flags), src) + ".cubin"
  if (data := diskcache.get("ptxas", key)) is not None:
    with _stats_lock: stats["cache_hits"] += 1
    return data
  with tempfile.TemporaryDirectory(prefix="baregrad-ptxas-") as tmp:
    ptx, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
    ptx.write_text(src)
    proc = subprocess.run([ptxas, f"-arch={arch}", *flags, str(ptx), "-o", str(out)], capture_output=True,
                          text=True, timeout=600)
    data = out.read_bytes() if proc.returncode == 0 and out.exists() else None
  if data is None:
    raise PtxasError(f"ptxas failed (exit {proc.returncode}) assembling PTX for {arch}\n--- ptxas output ---\n"
                     f"{(proc.stderr + proc.stdout).strip()}\n--- source ---\n{numbered_source(src)}")
  with _stats_lock: stats["compiles"] += 1
  diskcache.put("ptxas", key, data)   # a read-only, full or unsafe cache is a warning there, never an error
  return data


# ---- cubin reader ----

@dataclass
class KernelParam:
  ordinal: int     # position in the .entry parameter list
  offset: int      # from the start of the parameter block (add CubinKernel.param_base for bank 0)
  size: int        # bytes


@dataclass
class CubinKernel:
  name: str
  text: bytes                    # the SASS of `.text.<name>`
  text_offset: int               # its offset in the cubin file
  params: list[KernelParam]      # sorted by ordinal
  param_base: int                # offset of the first parameter in constant bank 0 (EIATTR_PARAM_CBANK)
  param_size: int                # bytes of parameters (EIATTR_CBANK_PARAM_SIZE)
  cbank0_size: int               # size of `.nv.constant0.<name>` (driver area + parameters)
  registers: int
  shared_size: int = 0           # static shared memory (`.nv.shared.<name>`)
  stack_size: int = 0            # per-thread local memory: the frame (EIATTR_FRAME_SIZE / MIN_STACK_SIZE)
  max_threads: tuple | None = None
  barriers: int = 0
  attributes: dict = field(default_factory=dict)   # every raw attribute of `.nv.info.<name>`: {attr: [value]}
  const_banks: dict = field(default_factory=dict)  # constant banks other than 0: {bank: bytes of .nv.constant<bank>}
  cbank0_data: bytes = b""                         # `.nv.constant0.<name>` as the cubin holds it
  relocations: list = field(default_factory=list)  # (relocation section, entries) that patch this kernel's sections
  # set by the NV driver when it loads the kernel: {bank: (address, bytes)} of its constant banks other than 0, and its
  # launches' QMD and bank 0 packed per (grid, block, ...) (NVDriver._launch_bytes)
  bank_addrs: dict = field(default_factory=dict, repr=False, compare=False)
  launch_cache: dict = field(default_factory=dict, repr=False, compare=False)

  @property
  def local_high(self) -> int:
    """Bytes of local memory per thread at the top of the local window this kernel's stack needs (0: no stack)."""
    return self.stack_size + STACK_RESERVED if self.stack_size else 0

  def build_cbuf0(self, param_values: list[int]) -> bytes:
    """Constant bank 0 as the kernel reads it: zeros for the driver's area, then each parameter (an int:
    an address or a 64-bit variable; little-endian, its size from EIATTR_KPARAM_INFO) at its offset."""
    if len(param_values) != len(self.params):
      raise ValueError(f"kernel {self.name} takes {len(self.params)} parameters, got {len(param_values)}")
    buf = bytearray(max(self.cbank0_size, self.param_base + self.param_size))
    for p, v in zip(self.params, param_values):
      buf[self.param_base + p.offset:self.param_base + p.offset + p.size] = (int(v) & ((1 << (8 * p.size)) - 1)).to_bytes(p.size, "little")
    return bytes(buf)


def parse_nv_info(data: bytes) -> list[tuple[int, int, bytes | int]]:
  """(format, attribute, value): bytes for EIFMT_SVAL, else the 16-bit value."""
  out, i = [], 0
  while i + 4 <= len(data):
    fmt, attr, val = struct.unpack_from("<BBH", data, i); i += 4
    if fmt == EIFMT_SVAL:
      out.append((fmt, attr, data[i:i + val])); i += val
    elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL): out.append((fmt, attr, val))
    else: raise ValueError(f"unknown .nv.info entry format {fmt} at byte {i - 4}")
  return out


def load_cubin(data: bytes) -> dict[str, CubinKernel]:
  """Every kernel (`.entry`) in a cubin, by name."""
  from elftools.elf.elffile import ELFFile
  elf = ELFFile(io.BytesIO(data))
  if elf["e_machine"] not in ("EM_CUDA", 190):
    raise ValueError(f"not a cubin: ELF machine {elf['e_machine']}")
  sections = {s.name: s for s in elf.iter_sections()}
  symtab = sections[".symtab"]
  symbols = list(symtab.iter_symbols())
  per_symbol: dict[str, dict[int, int]] = {}   # function name -> {attr: value} from the module-wide .nv.info
  if ".nv.info" in sections:
    for fmt, attr, val in parse_nv_info(sections[".nv.info"].data()):
      if fmt == EIFMT_SVAL and len(val) == 8:
        sym, value = struct.unpack("<II", val)
        per_symbol.setdefault(symbols[sym].name, {})[attr] = value
  def data(section) -> bytes:
    return bytes(section["sh_size"]) if section["sh_type"] == "SHT_NOBITS" else section.data()

  relocs = {}      # section index a relocation section patches -> [(its name, entries)]
  for s in elf.iter_sections():
    if s["sh_type"] in ("SHT_REL", "SHT_RELA") and s["sh_size"] and "debug" not in s.name:
      relocs.setdefault(s["sh_info"], []).append((s.name, s["sh_size"] // s["sh_entsize"]))
  index = {s.name: i for i, s in enumerate(elf.iter_sections())}
  kernels = {}
  for s in elf.iter_sections():
    if not s.name.startswith(".text."): continue
    name = s.name[len(".text."):]
    attrs: dict[int, list] = {}
    if (info := sections.get(f".nv.info.{name}")) is not None:
      for fmt, attr, val in parse_nv_info(info.data()): attrs.setdefault(attr, []).append(val)
    params = []
    for raw in attrs.get(EIATTR_KPARAM_INFO, []):
      _index, ordinal, offset, flags = struct.unpack("<IHHI", raw)
      params.append(KernelParam(ordinal, offset, (flags >> 18) & 0x3FFF))
    params.sort(key=lambda p: p.ordinal)
    if EIATTR_PARAM_CBANK in attrs:
      _sym, base, size = struct.unpack("<IHH", attrs[EIATTR_PARAM_CBANK][0])
    else:   # a kernel without parameters
      base, size = 0, 0
    size = attrs.get(EIATTR_CBANK_PARAM_SIZE, [size])[0]
    fn = per_symbol.get(name, {})
    regs = fn.get(EIATTR_REGCOUNT, s["sh_info"] >> 24)
    const0 = sections.get(f".nv.constant0.{name}")
    shared = sections.get(f".nv.shared.{name}")
    max_threads = struct.unpack("<III", attrs[EIATTR_MAX_THREADS][0]) if EIATTR_MAX_THREADS in attrs else None
    banks = {}
    for sec_name in sections:    # the kernel's own bank N, else the module's
      parts = sec_name.split(".")
      if len(parts) >= 3 and parts[1] == "nv" and parts[2].startswith("constant") and parts[2][8:].isdigit():
        bank, owner = int(parts[2][8:]), ".".join(parts[3:])
        if bank and owner in (name, "") and (owner == name or bank not in banks): banks[bank] = data(sections[sec_name])
    patched = [f".text.{name}", *(f".nv.constant{b}.{name}" for b in range(18)), *(f".nv.constant{b}" for b in banks)]
    kernels[name] = CubinKernel(
      name=name, text=s.data(), text_offset=s["sh_offset"], params=params, param_base=base, param_size=size,
      cbank0_size=const0["sh_size"] if const0 is not None else base + size, registers=regs,
      shared_size=shared["sh_size"] if shared is not None else 0,
      stack_size=max(fn.get(EIATTR_FRAME_SIZE, 0), fn.get(EIATTR_MIN_STACK_SIZE, 0)),
      max_threads=max_threads, barriers=attrs.get(EIATTR_NUM_BARRIERS, [0])[0], attributes=attrs,
      const_banks=banks, cbank0_data=data(const0) if const0 is not None else b"",
      relocations=[r for sec in patched if sec in index for r in relocs.get(index[sec], [])])
  return kernels
