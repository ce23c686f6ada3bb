"""baregrad's own loader for relocatable ELF objects (`.o` files from cc.py): no dlopen, no shared library.

`link_elf(obj, base)` is the pure link step: it lays out every SHF_ALLOC section of an x86-64 or AArch64 object for
one base address, applies the relocations and returns the bytes and where everything is (`Linked`), touching no
memory; it links for any host. `load_elf(obj)` maps memory, links there, copies, makes the instructions visible to
instruction fetch where the architecture needs it (AArch64), protects each part and returns an `Image` whose
`symbol(name)` gives addresses to call; it runs only objects for this host's machine.

The mapping has up to three page-aligned parts, each protected once the relocations are written:
  text    code sections + one stub per external function            READ|EXEC
  rodata  read-only data + the GOT (one 8-byte slot per symbol)     READ
  data    writable data, .bss and common symbols (zero-filled)      READ|WRITE
x86-64: every external symbol (resolved by `resolve(name)`, default: libc then libm) gets a GOT slot and an 8-byte
stub `jmp *slot(%rip)` inside the image, so 32-bit PC-relative calls always reach it. AArch64: a call or jump to an
external function goes straight there when it lies within the branch's +-128 MiB, else through a 16-byte stub in the
image that loads the address into x16 and branches to it; only GOT-relative relocations get GOT slots.
"""
from __future__ import annotations
import functools, io, mmap, platform, struct, weakref
from dataclasses import dataclass
import cffi
from elftools.common.exceptions import ELFError as _PyElfError
from elftools.elf.elffile import ELFFile
from .. import kernel_log   # TRACE_IOCTL=1 logs mmap/mprotect/munmap (drivers/kernel_log.py)


class ElfError(ValueError):
  pass


class SymbolNotFound(KeyError):
  def __str__(self): return self.args[0]


# ---- libc through cffi: memory mapping and symbol lookup ----
ffi = cffi.FFI()
ffi.cdef("""
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int mprotect(void *addr, size_t length, int prot);
int munmap(void *addr, size_t length);
int madvise(void *addr, size_t length, int advice);
void *dlopen(const char *filename, int flags);
void *dlsym(void *handle, const char *symbol);
void __clear_cache(void *begin, void *end);
void sys_icache_invalidate(void *start, size_t len);
""")
libc = ffi.dlopen(None)
# <sys/mman.h> and <dlfcn.h>: the PROT_* and RTLD_NOW values are the same on Linux and Darwin, the MAP_* and MADV_*
# values are not. Python's mmap module has the running platform's own; the table is the fallback where it lacks one
# (Linux <asm-generic/mman-common.h>; Darwin <sys/mman.h>: MAP_ANON 0x1000, no MADV_HUGEPAGE).
# Darwin arm64 under the hardened runtime makes memory executable only in MAP_JIT (0x800) mappings, toggled per
# thread with pthread_jit_write_protect_np (Apple, "Porting just-in-time compilers to Apple silicon"); the loader does
# not do that: protect_memory says so when mprotect refuses.
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
_MMAN = {"Linux": {"MAP_PRIVATE": 0x02, "MAP_ANONYMOUS": 0x20, "MADV_HUGEPAGE": 14},
         "Darwin": {"MAP_PRIVATE": 0x0002, "MAP_ANONYMOUS": 0x1000, "MADV_HUGEPAGE": None}}
_mman = _MMAN.get(platform.system(), _MMAN["Linux"])
MAP_PRIVATE = getattr(mmap, "MAP_PRIVATE", _mman["MAP_PRIVATE"])
MAP_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", _mman["MAP_ANONYMOUS"]))
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", _mman["MADV_HUGEPAGE"])   # None: the platform has no such advice
RTLD_NOW = 2
HUGE = 2 << 20                         # a transparent huge page on x86-64 (and aarch64 with 4K pages)
HUGE_FROM = 4 << 20                    # mappings this large get huge pages (numpy's threshold for its arrays too)
PAGE = mmap.PAGESIZE
_MAP_FAILED = 2**64 - 1


def map_memory(size: int) -> int:
  """Anonymous READ|WRITE mapping of `size` bytes (a multiple of PAGE); returns its address. A mapping of HUGE_FROM
  bytes or more starts on a huge-page boundary and asks for transparent huge pages (MADV_HUGEPAGE: where THP is
  "madvise", the distributions' default, only such memory gets them; 512x fewer TLB entries for large tensors)."""
  huge = size >= HUGE_FROM
  ask = size + HUGE if huge else size
  addr = int(ffi.cast("uintptr_t", libc.mmap(ffi.NULL, ask, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)))
  if kernel_log.enabled: kernel_log.mmap(0, ask, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, addr)
  if addr == _MAP_FAILED: raise MemoryError(f"mmap of {size} bytes failed (errno {ffi.errno})")
  if huge:      # keep [aligned, aligned + size): the head and tail of the over-sized mapping go back
    aligned = (addr + HUGE - 1) // HUGE * HUGE
    if aligned > addr: unmap_memory(addr, aligned - addr)
    if addr + ask > aligned + size: unmap_memory(aligned + size, addr + ask - aligned - size)
    if MADV_HUGEPAGE is not None:   # advice only: a kernel without THP ignores it
      libc.madvise(ffi.cast("void *", aligned), size, MADV_HUGEPAGE)
    addr = aligned
  return addr


def protect_memory(addr: int, size: int, prot: int) -> None:
  result = libc.mprotect(ffi.cast("void *", addr), size, prot)
  if kernel_log.enabled: kernel_log.mprotect(addr, size, prot, result)
  if result != 0:
    errno = ffi.errno
    jit = ""
    if prot & PROT_EXEC and platform.system() == "Darwin":
      jit = (" (Darwin under the hardened runtime allows executable memory only in MAP_JIT mappings, which this loader "
             "does not use: run a Python without the hardened runtime)")
    raise OSError(errno, f"mprotect(0x{addr:x}, {size}, {prot}) failed{jit}")


def flush_icache(addr: int, size: int, machine: int) -> None:
  """Make instructions just written to [addr, addr + size) visible to instruction fetch. x86-64 keeps its instruction
  cache coherent with stores; AArch64 does not: the data cache must be cleaned and the instruction cache invalidated
  for the range (Arm ARM, "Concurrent modification and execution of instructions"), which the platform's runtime
  does: __clear_cache(begin, end) from libgcc on Linux, sys_icache_invalidate(start, len) from libSystem on Darwin."""
  if machine != EM_AARCH64: return
  if platform.system() == "Darwin": libc.sys_icache_invalidate(ffi.cast("void *", addr), size)
  else: getattr(_libgcc(), "__clear_cache")(ffi.cast("void *", addr), ffi.cast("void *", addr + size))


@functools.cache
def _libgcc():
  try: return ffi.dlopen("libgcc_s.so.1")
  except OSError: return libc    # a process built with compiler-rt has __clear_cache itself


_VOID_P = ffi.typeof("void *")   # (unmap_memory runs as a GC finalizer: no cffi type parse there, see amd/driver.py)


def unmap_memory(addr: int, size: int) -> None:
  result = libc.munmap(ffi.cast(_VOID_P, addr), size)
  if kernel_log.enabled: kernel_log.munmap(addr, size, result)


_libraries: list = []  # dlopen handles searched after the process's global scope


def resolve_libc(name: str) -> int:
  """Address of a libc/libm function or object, or 0 when none has that name."""
  if not _libraries:
    for lib in (b"libm.so.6", b"libmvec.so.1"):  # libmvec: vector math gcc may call from vectorized loops
      if (handle := libc.dlopen(lib, RTLD_NOW)) != ffi.NULL: _libraries.append(handle)
  for handle in (ffi.NULL, *_libraries):  # NULL is RTLD_DEFAULT: libc and everything Python loaded
    if (addr := libc.dlsym(handle, name.encode())) != ffi.NULL: return int(ffi.cast("uintptr_t", addr))
  return 0


# ---- ELF facts (System V gABI, "Object Files" chapter; Linux <elf.h>) ----
ET_NAMES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
EM_NAMES = {3: "EM_386", 8: "EM_MIPS", 20: "EM_PPC", 21: "EM_PPC64", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64",
            243: "EM_RISCV", 224: "EM_AMDGPU", 190: "EM_CUDA"}
EM_X86_64, EM_AARCH64 = 62, 183
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 4, 8, 9
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
STB_WEAK = 2
_HOST_MACHINE = {"x86_64": EM_X86_64, "AMD64": EM_X86_64, "aarch64": EM_AARCH64, "arm64": EM_AARCH64}.get(platform.machine())


@dataclass(frozen=True)
class Reloc:
  name: str
  field: str     # struct format of the patched field
  formula: str   # psABI notation: S symbol, A addend, P place, G GOT slot address, L stub ("PLT") address


# x86-64 relocation types: System V AMD64 psABI, section 4.4 "Relocation", table "Relocation Types".
X86_64_RELOCS = {
  1: Reloc("R_X86_64_64", "<Q", "S+A"),
  2: Reloc("R_X86_64_PC32", "<i", "S+A-P"),
  4: Reloc("R_X86_64_PLT32", "<i", "L+A-P"),
  9: Reloc("R_X86_64_GOTPCREL", "<i", "G+A-P"),
  10: Reloc("R_X86_64_32", "<I", "S+A"),
  11: Reloc("R_X86_64_32S", "<i", "S+A"),
  24: Reloc("R_X86_64_PC64", "<q", "S+A-P"),
  41: Reloc("R_X86_64_GOTPCRELX", "<i", "G+A-P"),
  42: Reloc("R_X86_64_REX_GOTPCRELX", "<i", "G+A-P"),
}
R_X86_64_NONE = 0
# names of the types we do not apply, for error messages (same table)
X86_64_RELOC_NAMES = {
  0: "NONE", 3: "GOT32", 5: "COPY", 6: "GLOB_DAT", 7: "JUMP_SLOT", 8: "RELATIVE", 12: "16", 13: "PC16", 14: "8",
  15: "PC8", 16: "DTPMOD64", 17: "DTPOFF64", 18: "TPOFF64", 19: "TLSGD", 20: "TLSLD", 21: "DTPOFF32",
  22: "GOTTPOFF", 23: "TPOFF32", 25: "GOTOFF64", 26: "GOTPC32", 27: "GOT64", 28: "GOTPCREL64", 29: "GOTPC64",
  30: "GOTPLT64", 31: "PLTOFF64", 32: "SIZE32", 33: "SIZE64", 34: "GOTPC32_TLSDESC", 35: "TLSDESC_CALL",
  36: "TLSDESC", 37: "IRELATIVE", 38: "RELATIVE64",
}
_GOT_FORMULAS = {"G+A-P", "G", "Page(G)-Page(P)", "G-P"}
_FIELD_RANGE = {"<Q": (0, 2**64), "<q": (-2**63, 2**63), "<i": (-2**31, 2**31), "<I": (0, 2**32)}
STUB = bytes([0xFF, 0x25]) + bytes(4) + bytes([0xCC, 0xCC])  # jmp *rel32(%rip); int3 padding to 8 bytes
STUB_SIZE = 8


@dataclass(frozen=True)
class A64Reloc:
  name: str
  formula: str   # AAELF64 notation: S, A, P as above; Page(x) = x & ~0xfff; G the address of the GOT slot holding S+A;
                 # L+A-P: a call or jump, to S when it is in reach, else to the symbol's stub in the image
  field: str     # where the bits go: a little-endian data word ("<Q", "<I", "<H") or an instruction field (A64_FIELDS)
  bits: tuple    # (hi, lo): the relocation writes bits [hi:lo] of the result X
  check: tuple | None = None   # overflow unless check[0] <= X < check[1], X read as a signed 64-bit value


# AArch64 relocation types: "ELF for the Arm 64-bit Architecture (AArch64)" (AAELF64), section 5.7 "Relocation",
# tables "Data relocations", "Group relocations ...", "Relocations to generate 19, 21 and 33 bit PC-relative
# addresses", "Relocations for control-flow instructions", "GOT-relative instruction relocations".
AARCH64_RELOCS = {
  257: A64Reloc("R_AARCH64_ABS64", "S+A", "<Q", (63, 0)),
  258: A64Reloc("R_AARCH64_ABS32", "S+A", "<I", (31, 0), (-2**31, 2**32)),
  259: A64Reloc("R_AARCH64_ABS16", "S+A", "<H", (15, 0), (-2**15, 2**16)),
  260: A64Reloc("R_AARCH64_PREL64", "S+A-P", "<Q", (63, 0)),
  261: A64Reloc("R_AARCH64_PREL32", "S+A-P", "<I", (31, 0), (-2**31, 2**32)),
  262: A64Reloc("R_AARCH64_PREL16", "S+A-P", "<H", (15, 0), (-2**15, 2**16)),
  263: A64Reloc("R_AARCH64_MOVW_UABS_G0", "S+A", "imm16", (15, 0), (0, 2**16)),
  264: A64Reloc("R_AARCH64_MOVW_UABS_G0_NC", "S+A", "imm16", (15, 0)),
  265: A64Reloc("R_AARCH64_MOVW_UABS_G1", "S+A", "imm16", (31, 16), (0, 2**32)),
  266: A64Reloc("R_AARCH64_MOVW_UABS_G1_NC", "S+A", "imm16", (31, 16)),
  267: A64Reloc("R_AARCH64_MOVW_UABS_G2", "S+A", "imm16", (47, 32), (0, 2**48)),
  268: A64Reloc("R_AARCH64_MOVW_UABS_G2_NC", "S+A", "imm16", (47, 32)),
  269: A64Reloc("R_AARCH64_MOVW_UABS_G3", "S+A", "imm16", (63, 48)),
  270: A64Reloc("R_AARCH64_MOVW_SABS_G0", "S+A", "movnz", (15, 0), (-2**16, 2**16)),
  271: A64Reloc("R_AARCH64_MOVW_SABS_G1", "S+A", "movnz", (31, 16), (-2**32, 2**32)),
  272: A64Reloc("R_AARCH64_MOVW_SABS_G2", "S+A", "movnz", (47, 32), (-2**48, 2**48)),
  273: A64Reloc("R_AARCH64_LD_PREL_LO19", "S+A-P", "imm19", (20, 2), (-2**20, 2**20)),
  274: A64Reloc("R_AARCH64_ADR_PREL_LO21", "S+A-P", "adr", (20, 0), (-2**20, 2**20)),
  275: A64Reloc("R_AARCH64_ADR_PREL_PG_HI21", "Page(S+A)-Page(P)", "adr", (32, 12), (-2**32, 2**32)),
  276: A64Reloc("R_AARCH64_ADR_PREL_PG_HI21_NC", "Page(S+A)-Page(P)", "adr", (32, 12)),
  277: A64Reloc("R_AARCH64_ADD_ABS_LO12_NC", "S+A", "imm12", (11, 0)),
  278: A64Reloc("R_AARCH64_LDST8_ABS_LO12_NC", "S+A", "imm12", (11, 0)),
  279: A64Reloc("R_AARCH64_TSTBR14", "S+A-P", "imm14", (15, 2), (-2**15, 2**15)),
  280: A64Reloc("R_AARCH64_CONDBR19", "S+A-P", "imm19", (20, 2), (-2**20, 2**20)),
  282: A64Reloc("R_AARCH64_JUMP26", "L+A-P", "imm26", (27, 2), (-2**27, 2**27)),
  283: A64Reloc("R_AARCH64_CALL26", "L+A-P", "imm26", (27, 2), (-2**27, 2**27)),
  284: A64Reloc("R_AARCH64_LDST16_ABS_LO12_NC", "S+A", "imm12", (11, 1)),
  285: A64Reloc("R_AARCH64_LDST32_ABS_LO12_NC", "S+A", "imm12", (11, 2)),
  286: A64Reloc("R_AARCH64_LDST64_ABS_LO12_NC", "S+A", "imm12", (11, 3)),
  299: A64Reloc("R_AARCH64_LDST128_ABS_LO12_NC", "S+A", "imm12", (11, 4)),
  309: A64Reloc("R_AARCH64_GOT_LD_PREL19", "G-P", "imm19", (20, 2), (-2**20, 2**20)),
  311: A64Reloc("R_AARCH64_ADR_GOT_PAGE", "Page(G)-Page(P)", "adr", (32, 12), (-2**32, 2**32)),
  312: A64Reloc("R_AARCH64_LD64_GOT_LO12_NC", "G", "imm12", (11, 3)),
}
AARCH64_NONE = (0, 256)   # R_AARCH64_NONE, and 256 (withdrawn: "treat as R_AARCH64_NONE")
AARCH64_CALLS = (282, 283)
# names of types we do not apply, for error messages (same document)
AARCH64_RELOC_NAMES = {
  287: "MOVW_PREL_G0", 288: "MOVW_PREL_G0_NC", 289: "MOVW_PREL_G1", 290: "MOVW_PREL_G1_NC", 291: "MOVW_PREL_G2",
  292: "MOVW_PREL_G2_NC", 293: "MOVW_PREL_G3", 307: "GOTREL64", 308: "GOTREL32", 310: "LD64_GOTOFF_LO15",
  313: "LD64_GOTPAGE_LO15", 314: "PLT32", 512: "TLSGD_ADR_PREL21", 513: "TLSGD_ADR_PAGE21", 514: "TLSGD_ADD_LO12_NC",
  1024: "COPY", 1025: "GLOB_DAT", 1026: "JUMP_SLOT", 1027: "RELATIVE", 1028: "TLS_DTPMOD", 1029: "TLS_DTPREL",
  1030: "TLS_TPREL", 1031: "TLSDESC", 1032: "IRELATIVE",
}
# where an A64 instruction keeps its immediate (Arm ARM, A64 instruction encodings): (bit position, width) pieces,
# filled from the value's low bits up. B/BL imm26 [25:0]; B.cond, CBZ/CBNZ, LDR (literal) imm19 [23:5]; TBZ/TBNZ
# imm14 [18:5]; ADR/ADRP immlo [30:29] then immhi [23:5]; ADD (immediate), LDR/STR (unsigned offset) imm12 [21:10];
# MOVZ/MOVK/MOVN imm16 [20:5] ("movnz" also sets bit 30: 1 MOVZ, 0 MOVN).
A64_FIELDS = {"imm26": ((0, 26),), "imm19": ((5, 19),), "imm14": ((5, 14),), "adr": ((29, 2), (5, 19)),
              "imm12": ((10, 12),), "imm16": ((5, 16),), "movnz": ((5, 16),)}
_A64_SCALED = {"imm26", "imm19", "imm14", "imm12"}   # X must be a multiple of 2**lo (the ABI's "check that X&7 = 0")
# AArch64 stub: ldr x16, .+8 (LDR literal, 64-bit: 0x58000000 | imm19 << 5 | Rt); br x16 (0xd61f0000 | Rn << 5); the
# target address. x16 (IP0) is the AAPCS64 intra-procedure-call scratch register a linker's veneer may clobber.
A64_STUB = struct.pack("<II", 0x58000000 | 2 << 5 | 16, 0xD61F0000 | 16 << 5)
A64_STUB_SIZE = 16


def reloc_name(rtype: int, machine: int = EM_X86_64) -> str:
  if machine == EM_AARCH64:
    if rtype in AARCH64_RELOCS: return AARCH64_RELOCS[rtype].name
    return "R_AARCH64_" + ("NONE" if rtype in AARCH64_NONE else AARCH64_RELOC_NAMES.get(rtype, "UNKNOWN"))
  if rtype in X86_64_RELOCS: return X86_64_RELOCS[rtype].name
  return "R_X86_64_" + X86_64_RELOC_NAMES.get(rtype, "UNKNOWN")


class Image:
  """A loaded object: one mapping at `base` of `size` bytes, and its symbols. The mapping lives until close() or
  until the Image is garbage collected: keep the Image while anything may still call into it."""

  def __init__(self, base: int, size: int, mapping: tuple[int, int], symbols: dict[str, int], sections: dict[str, int]):
    self.base, self.size = base, size
    self.symbols, self.sections = symbols, sections
    self._finalizer = weakref.finalize(self, unmap_memory, *mapping)
    self._finalizer.atexit = False    # at exit a thread may still run its code (the OS unmaps it)

  def symbol(self, name: str) -> int:
    """Address of a function or object defined in the image."""
    if self.closed: raise ValueError(f"symbol {name!r}: the image at 0x{self.base:x} is closed")
    if name not in self.symbols:
      raise SymbolNotFound(f"symbol {name!r} is not defined in the image; defined: {', '.join(sorted(self.symbols)) or '(none)'}")
    return self.symbols[name]

  @property
  def closed(self) -> bool: return not self._finalizer.alive

  def close(self) -> None:
    """Unmap the image (idempotent). Anything still pointing into it must not be used again."""
    self._finalizer()

  def __repr__(self): return f"<Image 0x{self.base:x}+0x{self.size:x} {'closed' if self.closed else f'{len(self.symbols)} symbols'}>"


def _align(x: int, a: int) -> int: return (x + a - 1) // a * a


def _machine_name(machine) -> str: return EM_NAMES.get(machine, f"#{machine}")


def _open(obj: bytes, machine: int | None) -> ELFFile:
  """Check the header by hand (clear messages), then let pyelftools parse. `machine`: the only e_machine accepted
  (load_elf: the host's), None: any the linker knows."""
  if len(obj) < 4 or obj[:4] != b"\x7fELF": raise ElfError(f"not an ELF file (starts with {bytes(obj[:4])!r}, expected b'\\x7fELF')")
  if len(obj) < 64: raise ElfError(f"truncated ELF: the 64-byte ELF header is cut off at {len(obj)} bytes")
  if obj[4] != 2: raise ElfError(f"ELF class {'ELFCLASS32' if obj[4] == 1 else obj[4]} is not supported: need ELFCLASS64")
  if obj[5] != 1: raise ElfError("big-endian ELF is not supported: need ELFDATA2LSB")
  e_type, e_machine = struct.unpack_from("<HH", obj, 16)
  if e_type != 1:
    raise ElfError(f"ELF type {ET_NAMES.get(e_type, e_type)} is not supported: need ET_REL (a relocatable .o from `cc -c`)")
  if e_machine not in (EM_X86_64, EM_AARCH64):
    raise ElfError(f"ELF machine {_machine_name(e_machine)} is not supported on this host ({platform.machine()}); "
                   "the loader handles EM_X86_64 and EM_AARCH64 objects")
  if machine is not None and e_machine != machine:
    raise ElfError(f"ELF machine {_machine_name(e_machine)} is not supported on this host ({platform.machine()}): "
                   f"code runs here only from {_machine_name(machine)} objects (link_elf still links it, for inspection)")
  shoff, = struct.unpack_from("<Q", obj, 40)
  shentsize, shnum = struct.unpack_from("<HH", obj, 58)
  if shoff + shnum * shentsize > len(obj):
    raise ElfError(f"truncated ELF: the section header table (0x{shoff:x} + {shnum}x{shentsize} bytes) extends past "
                   f"the end of the file ({len(obj)} bytes)")
  try:
    elf = ELFFile(io.BytesIO(obj))
    sections = list(elf.iter_sections())
  except (_PyElfError, struct.error, UnicodeDecodeError) as e:
    raise ElfError(f"malformed ELF: {e}") from e
  for s in sections:
    if s["sh_type"] != "SHT_NOBITS" and s["sh_offset"] + s["sh_size"] > len(obj):
      raise ElfError(f"truncated ELF: section {s.name} extends past end of file "
                     f"(0x{s['sh_offset']:x} + 0x{s['sh_size']:x} > 0x{len(obj):x})")
  return elf


@dataclass
class Linked:
  """What link_elf computed for one base address: the bytes to place there and where everything is."""
  machine: int                      # EM_X86_64 or EM_AARCH64
  base: int
  image: bytearray                  # the whole image (len: its size, a multiple of PAGE), to copy to `base`
  parts: dict                       # "text" / "rodata" / "data" -> (offset from base, length), page-aligned
  sections: dict                    # loaded section name -> address
  symbols: dict                     # defined symbol name -> address
  got: int                          # address of the GOT (0: none)
  got_slots: list                   # what each 8-byte GOT slot holds, in order: symbol name (+ addend)
  stubs: dict                       # external function -> address of its stub in the image


def link_elf(obj: bytes, base, resolve=None, machine: int | None = None) -> Linked:
  """Link a relocatable x86-64 or AArch64 ELF object for one base address, touching no memory: the image bytes and
  its layout. `base`: the address, or `base(size, alignment) -> address` called once the size is known (load_elf
  maps memory there). `resolve(name) -> address` finds external symbols (default: libc, libm of this process).
  `machine`: the only e_machine accepted (None: either)."""
  obj = bytes(obj)
  elf = _open(obj, machine)
  machine, = struct.unpack_from("<H", obj, 18)
  a64 = machine == EM_AARCH64
  table = AARCH64_RELOCS if a64 else X86_64_RELOCS
  resolve = resolve or resolve_libc
  sections = list(elf.iter_sections())
  symtabs = [s for s in sections if s["sh_type"] == "SHT_SYMTAB"]
  symbols = list(symtabs[0].iter_symbols()) if symtabs else []

  def flags(s): return s["sh_flags"]
  alloc = [i for i, s in enumerate(sections) if flags(s) & SHF_ALLOC]
  for i in alloc:
    if flags(sections[i]) & SHF_TLS: raise ElfError(f"section {sections[i].name} is thread-local (TLS): not supported")
    if flags(sections[i]) & SHF_WRITE and flags(sections[i]) & SHF_EXECINSTR:
      raise ElfError(f"section {sections[i].name} is both writable and executable: not supported")

  # relocations of loaded sections, as (target section, offset, type, symbol index, addend)
  relocs = []
  for s in sections:
    if s["sh_type"] not in ("SHT_RELA", "SHT_REL") or not (0 < s["sh_info"] < len(sections)): continue
    if not flags(sections[s["sh_info"]]) & SHF_ALLOC: continue  # e.g. .rela.debug_info
    if s["sh_type"] == "SHT_REL":
      raise ElfError(f"{s.name}: REL relocations (implicit addends) are not supported on {'AArch64' if a64 else 'x86-64'}")
    for offset, info, addend in struct.iter_unpack("<QQq", s.data()):  # Elf64_Rela
      if info >> 32 >= len(symbols): raise ElfError(f"{s.name}: relocation at 0x{offset:x} names symbol #{info >> 32}, "
                                                    f"symbol table has {len(symbols)}")
      relocs.append((s["sh_info"], offset, info & 0xFFFFFFFF, info >> 32, addend))

  def undefined(sym): return sym["st_shndx"] == "SHN_UNDEF" and sym.name != ""
  def symname(k):
    sym = symbols[k]
    if sym.name: return sym.name
    if sym["st_info"]["type"] == "STT_SECTION" and isinstance(sym["st_shndx"], int): return sections[sym["st_shndx"]].name
    return f"symbol #{k}"
  externals = list(dict.fromkeys(k for (_, _, _, k, _) in relocs if undefined(symbols[k])))
  resolved = {}
  for k in externals:
    sym = symbols[k]
    addr = resolve(sym.name)
    if not addr and sym["st_info"]["bind"] != "STB_WEAK":
      raise ElfError(f"undefined symbol {sym.name!r}: the resolver found no address for it "
                     "(default resolver: libc and libm of this process)")
    resolved[k] = addr or 0
  # GOT slots, keyed (symbol, addend): x86-64 G+A-P adds A to the slot's address, AArch64 G(GDAT(S+A)) puts it in the slot
  got_refs = [(k, A if a64 else 0) for (_, _, t, k, A) in relocs if t in table and table[t].formula in _GOT_FORMULAS]
  if a64:   # stubs only for called externals that resolved (a call to an unresolved weak one falls through)
    stubbed = list(dict.fromkeys(k for (_, _, t, k, _) in relocs if t in AARCH64_CALLS and resolved.get(k)))
    got_users = dict.fromkeys(got_refs)
  else:
    stubbed = externals
    got_users = dict.fromkeys([(k, 0) for k in externals] + got_refs)
  stub_size = A64_STUB_SIZE if a64 else STUB_SIZE
  commons = [k for k, sym in enumerate(symbols) if sym["st_shndx"] == "SHN_COMMON"]

  # ---- layout: offsets of every piece inside its part, then the parts inside the mapping ----
  parts = {"text": [], "rodata": [], "data": []}  # (key, size, align); key is a section index or a tag
  for i in alloc:
    s = sections[i]
    part = "text" if flags(s) & SHF_EXECINSTR else "data" if flags(s) & SHF_WRITE else "rodata"
    parts[part].append((i, s["sh_size"], max(1, s["sh_addralign"])))
  if stubbed: parts["text"].append(("stubs", stub_size * len(stubbed), 16))
  if got_users: parts["rodata"].append(("got", 8 * len(got_users), 8))
  for k in commons: parts["data"].append((("common", k), symbols[k]["st_size"], max(1, symbols[k]["st_value"])))

  offsets, part_ranges, size, max_align = {}, {}, 0, PAGE
  for part, pieces in parts.items():
    if not pieces: continue
    start = size = _align(size, PAGE)
    for key, nbytes, align in pieces:
      size = _align(size, align)
      offsets[key] = size
      size += nbytes
      max_align = max(max_align, align)
    part_ranges[part] = (start, _align(size, PAGE) - start)
  size = max(PAGE, _align(size, PAGE))
  if callable(base): base = base(size, max_align)
  if base % max_align: raise ElfError(f"base 0x{base:x} is not aligned to the object's {max_align}-byte alignment")

  image = bytearray(size)
  for i in alloc:
    if sections[i]["sh_type"] != "SHT_NOBITS":
      image[offsets[i]:offsets[i] + sections[i]["sh_size"]] = sections[i].data()

  def address(k: int) -> int:
    sym = symbols[k]
    shndx = sym["st_shndx"]
    if k == 0: return 0
    if k in resolved: return resolved[k]
    if shndx == "SHN_ABS": return sym["st_value"]
    if shndx == "SHN_COMMON": return base + offsets[("common", k)]
    if isinstance(shndx, int) and shndx in offsets: return base + offsets[shndx] + sym["st_value"]
    if shndx == "SHN_UNDEF": return 0  # weak, unresolved
    raise ElfError(f"symbol {sym.name!r} lives in section {shndx}, which is not loaded")

  got = {key: base + offsets["got"] + 8 * n for n, key in enumerate(got_users)}
  for (k, A), slot in got.items(): struct.pack_into("<Q", image, slot - base, (address(k) + A) & 2**64 - 1)
  stubs = {}
  for n, k in enumerate(stubbed):
    stubs[k] = at = base + offsets["stubs"] + stub_size * n
    if a64: image[at - base:at - base + stub_size] = A64_STUB + struct.pack("<Q", address(k) & 2**64 - 1)
    else:
      image[at - base:at - base + STUB_SIZE] = STUB
      struct.pack_into("<i", image, at - base + 2, got[k, 0] - (at + 6))

  # ---- relocations ----
  for target, offset, rtype, k, addend in relocs:
    if rtype == R_X86_64_NONE or a64 and rtype in AARCH64_NONE: continue
    sec = sections[target]
    where = f"{reloc_name(rtype, machine)} ({rtype}) at {sec.name}+0x{offset:x} against {symname(k)!r}"
    if rtype not in table:
      raise ElfError(f"unsupported relocation {where}: the loader applies only " + ", ".join(r.name for r in table.values())
                     + (" (compile with -fPIC -fno-plt, small code model, no TLS)" if a64 else " (compile with -fPIC -fno-plt)"))
    rel = table[rtype]
    width = struct.calcsize(rel.field) if rel.field[0] == "<" else 4
    if sec["sh_type"] == "SHT_NOBITS" or offset + width > sec["sh_size"]:
      raise ElfError(f"relocation {where} lies outside the section's {sec['sh_size']} bytes")
    S, A, P = address(k), addend, base + offsets[target] + offset
    if a64: _apply_a64(image, P - base, rel, S, A, P, got.get((k, A)), stubs.get(k), k in resolved and not S, where)
    else:
      if rel.formula == "S+A": value = S + A
      elif rel.formula == "S+A-P": value = S + A - P
      elif rel.formula == "L+A-P": value = stubs.get(k, S) + A - P
      else: value = got[k, 0] + A - P  # "G+A-P": G is the slot's address (GOT + offset of the entry)
      if rel.field == "<Q": value &= 2**64 - 1
      lo, hi = _FIELD_RANGE[rel.field]
      if not lo <= value < hi:
        raise ElfError(f"relocation overflow: {where}: value 0x{value & 2**64 - 1:x} does not fit the {8 * width}-bit field "
                       f"(image at 0x{base:x}; absolute 32-bit addresses need non-PIC code below 2 GiB: compile with -fPIC)")
      struct.pack_into(rel.field, image, P - base, value)

  defined = {}
  for k, sym in enumerate(symbols):
    kind, bind = sym["st_info"]["type"], sym["st_info"]["bind"]
    if not sym.name or kind not in ("STT_FUNC", "STT_OBJECT", "STT_NOTYPE") or sym["st_shndx"] == "SHN_UNDEF": continue
    if sym.name.startswith(".L"): continue  # assembler-local labels
    if sym.name in defined and bind == "STB_LOCAL": continue  # a global wins over a local of the same name
    defined[sym.name] = address(k)
  return Linked(machine, base, image, part_ranges, {sections[i].name: base + offsets[i] for i in alloc}, defined,
                base + offsets["got"] if got_users else 0,
                [symname(k) + (f"{A:+#x}" if A else "") for k, A in got_users], {symname(k): at for k, at in stubs.items()})


def _apply_a64(image: bytearray, at: int, rel: A64Reloc, S: int, A: int, P: int, G, stub, weak_unresolved: bool, where: str):
  """Compute X for one AArch64 relocation and write bits [hi:lo] of it into the data word or instruction field."""
  def page(x): return x & ~0xFFF
  if rel.formula == "S+A": X = S + A
  elif rel.formula == "S+A-P": X = S + A - P
  elif rel.formula == "Page(S+A)-Page(P)": X = page(S + A) - page(P)
  elif rel.formula == "G": X = G
  elif rel.formula == "G-P": X = G - P
  elif rel.formula == "Page(G)-Page(P)": X = page(G) - page(P)
  else:   # "L+A-P": B/BL reach +-128 MiB; an external beyond goes through its stub; an unresolved weak one falls through
    X = 4 if weak_unresolved else S + A - P
    if stub is not None and A == 0 and not rel.check[0] <= X < rel.check[1]: X = stub - P
  X = (X + 2**63) % 2**64 - 2**63    # the ABI reads X as a signed 64-bit integer
  hi, lo = rel.bits
  if rel.check and not rel.check[0] <= X < rel.check[1]:
    raise ElfError(f"relocation overflow: {where}: X = {X:#x} is outside [{rel.check[0]:#x}, {rel.check[1]:#x}) "
                   f"(place 0x{P:x}, target 0x{(S + A) & 2**64 - 1:x})")
  if rel.field in _A64_SCALED and X % (1 << lo):
    raise ElfError(f"misaligned relocation {where}: X = {X:#x} is not a multiple of {1 << lo}")
  v = X >> lo & (1 << hi - lo + 1) - 1
  if rel.field[0] == "<":
    struct.pack_into(rel.field, image, at, v)
    return
  insn, = struct.unpack_from("<I", image, at)
  if rel.field == "movnz":   # X >= 0: MOVZ with the bits; X < 0: MOVN with NOT the bits
    insn = insn & ~(1 << 30) | (X >= 0) << 30
    if X < 0: v = ~v & 0xFFFF
  for pos, width in A64_FIELDS[rel.field]:
    insn = insn & ~((1 << width) - 1 << pos) | (v & (1 << width) - 1) << pos
    v >>= width
  struct.pack_into("<I", image, at, insn)


def load_elf(obj: bytes, resolve=None) -> Image:
  """Load a relocatable ELF object for this host's machine (x86-64 or AArch64) and return the running image.
  `resolve(name) -> address` finds external symbols (default: libc, libm)."""
  if _HOST_MACHINE is None:
    raise ElfError(f"the loader runs code only on x86-64 and AArch64 hosts, not on this one ({platform.machine()})")
  mapped = []

  def place(size: int, align: int) -> int:   # sections aligned beyond a page: over-map and align the base
    mapped.append((map_memory(size + align - PAGE), size + align - PAGE))
    return _align(mapped[0][0], align)
  try:
    linked = link_elf(obj, place, resolve, _HOST_MACHINE)
    base, size = linked.base, len(linked.image)
    # ---- copy in, make the code visible to instruction fetch, then protect each part ----
    ffi.memmove(ffi.cast("void *", base), linked.image, size)
    if "text" in linked.parts: flush_icache(base + linked.parts["text"][0], linked.parts["text"][1], linked.machine)
    for part, (start, length) in linked.parts.items():
      protect_memory(base + start, length, {"text": PROT_READ | PROT_EXEC, "rodata": PROT_READ,
                                            "data": PROT_READ | PROT_WRITE}[part])
  except BaseException:
    for raw, nbytes in mapped: unmap_memory(raw, nbytes)
    raise
  return Image(base, size, mapped[0], linked.symbols, linked.sections)
