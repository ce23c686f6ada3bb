"""baregrad's own loader for relocatable ELF objects (`.o` files from cc.py): no dlopen, no shared library.

`load_elf(obj)` lays out every SHF_ALLOC section of the object in one anonymous memory mapping,
applies the x86-64 relocations and returns an `Image` whose `symbol(name)` gives addresses to call.

The mapping has up to three page-aligned parts, each protected once the relocations are written:
  text    code sections + one 8-byte stub per external function     READ|EXEC
  rodata  read-only data + the GOT (one 8-byte slot per symbol)     READ
  data    writable data, .bss and common symbols (zero-filled)      READ|WRITE
Every external symbol (resolved by `resolve(name)`, default: libc then libm) gets a GOT slot and a
stub `jmp *slot(%rip)` inside the image, so 32-bit PC-relative calls always reach it.
"""
from __future__ import annotations
import io, mmap, platform, struct, weakref
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
""")
libc = ffi.dlopen(None)
# <sys/mman.h> and <dlfcn.h> values on Linux (x86-64 and aarch64)
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
RTLD_NOW = 2
MADV_HUGEPAGE = 14                     # <asm-generic/mman-common.h>
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
    libc.madvise(ffi.cast("void *", aligned), size, MADV_HUGEPAGE)   # advice only: a kernel without THP ignores it
    addr = aligned
  return addr


def protect_memory(addr: int, size: int, prot: int) -> None:
  result = libc.mprotect(ffi.cast("void *", addr), size, prot)
  if kernel_log.enabled: kernel_log.mprotect(addr, size, prot, result)
  if result != 0:
    raise OSError(ffi.errno, f"mprotect(0x{addr:x}, {size}, {prot}) failed")


def unmap_memory(addr: int, size: int) -> None:
  result = libc.munmap(ffi.cast("void *", addr), size)
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
EM_X86_64 = 62
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 4, 8, 9
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
STB_WEAK = 2
_HOST_MACHINE = {"x86_64": EM_X86_64, "AMD64": EM_X86_64, "aarch64": 183, "arm64": 183}.get(platform.machine())


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
_GOT_FORMULAS = {"G+A-P"}
_FIELD_RANGE = {"<Q": (0, 2**64), "<q": (-2**63, 2**63), "<i": (-2**31, 2**31), "<I": (0, 2**32)}
STUB = bytes([0xFF, 0x25]) + bytes(4) + bytes([0xCC, 0xCC])  # jmp *rel32(%rip); int3 padding to 8 bytes
STUB_SIZE = 8


def reloc_name(rtype: int) -> str:
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


def _open(obj: bytes) -> ELFFile:
  """Check the header by hand (clear messages), then let pyelftools parse."""
  if len(obj) < 4 or obj[:4] != b"\x7fELF": raise ElfError(f"not an ELF file (starts with {bytes(obj[:4])!r}, expected b'\\x7fELF')")
  if len(obj) < 64: raise ElfError(f"truncated ELF: the 64-byte ELF header is cut off at {len(obj)} bytes")
  if obj[4] != 2: raise ElfError(f"ELF class {'ELFCLASS32' if obj[4] == 1 else obj[4]} is not supported: need ELFCLASS64")
  if obj[5] != 1: raise ElfError("big-endian ELF is not supported: need ELFDATA2LSB")
  e_type, e_machine = struct.unpack_from("<HH", obj, 16)
  if e_type != 1:
    raise ElfError(f"ELF type {ET_NAMES.get(e_type, e_type)} is not supported: need ET_REL (a relocatable .o from `cc -c`)")
  if e_machine != EM_X86_64 or _HOST_MACHINE != EM_X86_64:
    host = platform.machine()
    raise ElfError(f"ELF machine {EM_NAMES.get(e_machine, f'#{e_machine}')} is not supported on this host ({host}); "
                   "the loader handles EM_X86_64 objects on x86-64 hosts")
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


def load_elf(obj: bytes, resolve=None) -> Image:
  """Load a relocatable x86-64 ELF object. `resolve(name) -> address` finds external symbols (default: libc, libm)."""
  obj = bytes(obj)
  elf = _open(obj)
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
    if s["sh_type"] == "SHT_REL": raise ElfError(f"{s.name}: REL relocations (implicit addends) are not supported on x86-64")
    for offset, info, addend in struct.iter_unpack("<QQq", s.data()):  # Elf64_Rela
      if info >> 32 >= len(symbols): raise ElfError(f"{s.name}: relocation at 0x{offset:x} names symbol #{info >> 32}, "
                                                    f"symbol table has {len(symbols)}")
      relocs.append((s["sh_info"], offset, info & 0xFFFFFFFF, info >> 32, addend))

  def undefined(sym): return sym["st_shndx"] == "SHN_UNDEF" and sym.name != ""
  externals = list(dict.fromkeys(k for (_, _, _, k, _) in relocs if undefined(symbols[k])))
  got_users = dict.fromkeys(externals + [k for (_, _, t, k, _) in relocs if t in X86_64_RELOCS and X86_64_RELOCS[t].formula in _GOT_FORMULAS])
  commons = [k for k, sym in enumerate(symbols) if sym["st_shndx"] == "SHN_COMMON"]

  # ---- layout: offsets of every piece inside its part, then the parts inside the mapping ----
  parts = {"text": [], "rodata": [], "data": []}  # (key, size, align); key is a section index or a tag
  for i in alloc:
    s = sections[i]
    part = "text" if flags(s) & SHF_EXECINSTR else "data" if flags(s) & SHF_WRITE else "rodata"
    parts[part].append((i, s["sh_size"], max(1, s["sh_addralign"])))
  if externals: parts["text"].append(("stubs", STUB_SIZE * len(externals), 16))
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
  # sections aligned beyond a page: over-map and align the base
  raw = map_memory(size + max_align - PAGE)
  base = _align(raw, max_align)
  try:
    image = bytearray(size)
    for i in alloc:
      if sections[i]["sh_type"] != "SHT_NOBITS":
        image[offsets[i]:offsets[i] + sections[i]["sh_size"]] = sections[i].data()

    # ---- symbols ----
    resolved = {}
    for k in externals:
      sym = symbols[k]
      addr = resolve(sym.name)
      if not addr and sym["st_info"]["bind"] != "STB_WEAK":
        raise ElfError(f"undefined symbol {sym.name!r}: the resolver found no address for it "
                       "(default resolver: libc and libm of this process)")
      resolved[k] = addr or 0

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

    got = {k: base + offsets["got"] + 8 * n for n, k in enumerate(got_users)}
    for k, slot in got.items(): struct.pack_into("<Q", image, slot - base, address(k))
    stubs = {}
    for n, k in enumerate(externals):
      stubs[k] = at = base + offsets["stubs"] + STUB_SIZE * n
      image[at - base:at - base + STUB_SIZE] = STUB
      struct.pack_into("<i", image, at - base + 2, got[k] - (at + 6))

    # ---- relocations ----
    for target, offset, rtype, k, addend in relocs:
      if rtype == R_X86_64_NONE: continue
      sec = sections[target]
      where = f"{reloc_name(rtype)} ({rtype}) at {sec.name}+0x{offset:x} against {symbols[k].name or f'symbol #{k}'!r}"
      if rtype not in X86_64_RELOCS:
        raise ElfError(f"unsupported relocation {where}: the loader applies only " +
                       ", ".join(r.name for r in X86_64_RELOCS.values()) + " (compile with -fPIC -fno-plt)")
      rel = X86_64_RELOCS[rtype]
      width = struct.calcsize(rel.field)
      if sec["sh_type"] == "SHT_NOBITS" or offset + width > sec["sh_size"]:
        raise ElfError(f"relocation {where} lies outside the section's {sec['sh_size']} bytes")
      S, A, P = address(k), addend, base + offsets[target] + offset
      if rel.formula == "S+A": value = S + A
      elif rel.formula == "S+A-P": value = S + A - P
      elif rel.formula == "L+A-P": value = stubs.get(k, S) + A - P
      else: value = got[k] + A - P  # "G+A-P": G is the slot's address (GOT + offset of the entry)
      if rel.field == "<Q": value &= 2**64 - 1
      lo, hi = _FIELD_RANGE[rel.field]
      if not lo <= value < hi:
        raise ElfError(f"relocation overflow: {where}: value 0x{value & 2**64 - 1:x} does not fit the {8 * width}-bit field "
                       f"(image at 0x{base:x}; absolute 32-bit addresses need non-PIC code below 2 GiB: compile with -fPIC)")
      struct.pack_into(rel.field, image, P - base, value)

    # ---- copy in, then protect each part ----
    ffi.memmove(ffi.cast("void *", base), image, size)
    for part, (start, length) in part_ranges.items():
      protect_memory(base + start, length, {"text": PROT_READ | PROT_EXEC, "rodata": PROT_READ,
                                            "data": PROT_READ | PROT_WRITE}[part])
  except BaseException:
    unmap_memory(raw, size + max_align - PAGE)
    raise

  defined = {}
  for k, sym in enumerate(symbols):
    kind, bind = sym["st_info"]["type"], sym["st_info"]["bind"]
    if not sym.name or kind not in ("STT_FUNC", "STT_OBJECT", "STT_NOTYPE") or sym["st_shndx"] == "SHN_UNDEF": continue
    if sym.name.startswith(".L"): continue  # assembler-local labels
    if sym.name in defined and bind == "STB_LOCAL": continue  # a global wins over a local of the same name
    defined[sym.name] = address(k)
  section_addrs = {sections[i].name: base + offsets[i] for i in alloc}
  return Image(base, size, (raw, size + max_align - PAGE), defined, section_addrs)
