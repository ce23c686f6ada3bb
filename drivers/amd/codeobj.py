"""AMDHSA code objects for gfx1100: the kernel descriptor, an ELF writer and a reader.

Sources of the facts written here:
  * LLVM "User Guide for AMDGPU Backend" (AMDGPUUsage.rst), sections "Kernel Descriptor"
    (the 64-byte layout and the compute_pgm_rsrc1/2/3 bit tables for GFX6-GFX12),
    "ELF Header" (e_ident OS/ABI ELFOSABI_AMDGPU_HSA = 64, ABI version 3 = code object V5,
    EF_AMDGPU_MACH_AMDGCN_GFX1100 = 0x041, the V4+ xnack/sramecc feature bits),
    "Note Records" (NT_AMDGPU_METADATA = 32, note name "AMDGPU"), "Symbols" (`name` STT_FUNC in
    .text, `name.kd` STT_OBJECT of 64 bytes in .rodata) and "Code Object V5 Metadata".
  * The System V ABI / ELF-64 object file format: header, section and program header layouts,
    the SysV symbol hash function and the .dynamic tags used below.
  * The MessagePack specification (github.com/msgpack/msgpack/blob/master/spec.md) for the
    encoding of the metadata note.
The layout choices (one read-only segment, the code in its own segment, the dynamic section
last) follow what `ld.lld-19 -shared` does with the output of `llvm-mc-19 -filetype=obj`.
"""
from __future__ import annotations

import dataclasses
import io
import struct

# ---- the kernel descriptor ----

# (name, lowest bit, width, default) over the 512-bit descriptor; a bit position is counted from
# the start of the descriptor, as in AMDGPUUsage's "Kernel Descriptor" table. Reserved bits are
# left out (they pack as zero). Defaults are what llvm-mc-19 writes for a gfx1100 kernel whose
# .amdhsa_kernel block sets nothing but the kernarg pointer and wave32.
RSRC3, RSRC1, RSRC2, PROPERTIES = 352, 384, 416, 448
KD_FIELDS: list[tuple[str, int, int, int]] = [
  ("group_segment_fixed_size", 0, 32, 0),
  ("private_segment_fixed_size", 32, 32, 0),
  ("kernarg_size", 64, 32, 0),
  ("kernel_code_entry_byte_offset", 128, 64, 0),        # signed, from the descriptor to the entry
  # compute_pgm_rsrc3 (GFX10-GFX11)
  ("shared_vgpr_count", RSRC3 + 0, 4, 0),
  ("inst_pref_size", RSRC3 + 4, 6, 0),                   # GFX11
  ("trap_on_start", RSRC3 + 10, 1, 0),                   # GFX11
  ("trap_on_end", RSRC3 + 11, 1, 0),                     # GFX11
  ("image_op", RSRC3 + 31, 1, 0),                        # GFX11
  # compute_pgm_rsrc1
  ("granulated_workitem_vgpr_count", RSRC1 + 0, 6, 0),
  ("granulated_wavefront_sgpr_count", RSRC1 + 6, 4, 0),  # GFX10+: reserved, must be 0
  ("priority", RSRC1 + 10, 2, 0),
  ("float_round_mode_32", RSRC1 + 12, 2, 0),
  ("float_round_mode_16_64", RSRC1 + 14, 2, 0),
  ("float_denorm_mode_32", RSRC1 + 16, 2, 0),
  ("float_denorm_mode_16_64", RSRC1 + 18, 2, 3),
  ("priv", RSRC1 + 20, 1, 0),
  ("enable_dx10_clamp", RSRC1 + 21, 1, 1),               # GFX6-GFX11 (WG_RR_EN on GFX12)
  ("debug_mode", RSRC1 + 22, 1, 0),
  ("enable_ieee_mode", RSRC1 + 23, 1, 1),                # GFX6-GFX11 (absent on GFX12)
  ("bulky", RSRC1 + 24, 1, 0),
  ("cdbg_user", RSRC1 + 25, 1, 0),
  ("fp16_ovfl", RSRC1 + 26, 1, 0),
  ("wgp_mode", RSRC1 + 29, 1, 1),
  ("mem_ordered", RSRC1 + 30, 1, 1),
  ("fwd_progress", RSRC1 + 31, 1, 0),
  # compute_pgm_rsrc2
  ("enable_private_segment", RSRC2 + 0, 1, 0),
  ("user_sgpr_count", RSRC2 + 1, 5, 2),
  ("enable_trap_handler", RSRC2 + 6, 1, 0),
  ("enable_sgpr_workgroup_id_x", RSRC2 + 7, 1, 0),
  ("enable_sgpr_workgroup_id_y", RSRC2 + 8, 1, 0),
  ("enable_sgpr_workgroup_id_z", RSRC2 + 9, 1, 0),
  ("enable_sgpr_workgroup_info", RSRC2 + 10, 1, 0),
  ("enable_vgpr_workitem_id", RSRC2 + 11, 2, 0),         # 0: x, 1: x y, 2: x y z
  ("enable_exception_address_watch", RSRC2 + 13, 1, 0),
  ("enable_exception_memory", RSRC2 + 14, 1, 0),
  ("granulated_lds_size", RSRC2 + 15, 9, 0),             # must be 0: the dispatch packet says
  ("enable_exception_ieee_754_fp_invalid_operation", RSRC2 + 24, 1, 0),
  ("enable_exception_fp_denormal_source", RSRC2 + 25, 1, 0),
  ("enable_exception_ieee_754_fp_division_by_zero", RSRC2 + 26, 1, 0),
  ("enable_exception_ieee_754_fp_overflow", RSRC2 + 27, 1, 0),
  ("enable_exception_ieee_754_fp_underflow", RSRC2 + 28, 1, 0),
  ("enable_exception_ieee_754_fp_inexact", RSRC2 + 29, 1, 0),
  ("enable_exception_int_divide_by_zero", RSRC2 + 30, 1, 0),
  # kernel_code_properties
  ("enable_sgpr_private_segment_buffer", PROPERTIES + 0, 1, 0),
  ("enable_sgpr_dispatch_ptr", PROPERTIES + 1, 1, 0),
  ("enable_sgpr_queue_ptr", PROPERTIES + 2, 1, 0),
  ("enable_sgpr_kernarg_segment_ptr", PROPERTIES + 3, 1, 1),
  ("enable_sgpr_dispatch_id", PROPERTIES + 4, 1, 0),
  ("enable_sgpr_flat_scratch_init", PROPERTIES + 5, 1, 0),
  ("enable_sgpr_private_segment_size", PROPERTIES + 6, 1, 0),
  ("enable_wavefront_size32", PROPERTIES + 10, 1, 1),
  ("uses_dynamic_stack", PROPERTIES + 11, 1, 0),
  # kernarg_preload (GFX90A/GFX940 only; 0 on gfx1100)
  ("kernarg_preload_spec_length", 464, 7, 0),
  ("kernarg_preload_spec_offset", 471, 9, 0),
]
# COMPUTE_PGM_RSRC1.PRIV (bit 20). AMDGPUUsage, compute_pgm_rsrc1 table: in the descriptor "Must be 0. Start executing
# wavefront in privilege trap handler mode. CP is responsible for filling in COMPUTE_PGM_RSRC1.PRIV." A PM4 driver that
# writes COMPUTE_PGM_RSRC1 itself is that CP: on gfx11 it sets the bit (drivers/amd/driver.py `_dispatch`).
RSRC1_PRIV = 1 << next(lo - RSRC1 for name, lo, _, _ in KD_FIELDS if name == "priv")
KD_SIZE = 64
_SIGNED = {"kernel_code_entry_byte_offset"}


class CodeObjectError(ValueError):
  pass


def _kd_namespace(ns: dict) -> None:
  def pack(self) -> bytes:
    """The 64 bytes the command processor reads."""
    value = 0
    for name, lo, width, _ in KD_FIELDS:
      field = getattr(self, name)
      if name not in _SIGNED and not 0 <= field < (1 << width):
        raise CodeObjectError(f"kernel descriptor field {name}={field} does not fit in {width} bits")
      value |= (field & ((1 << width) - 1)) << lo
    return value.to_bytes(KD_SIZE, "little")

  @classmethod
  def unpack(cls, data: bytes):
    if len(data) != KD_SIZE: raise CodeObjectError(f"a kernel descriptor is {KD_SIZE} bytes, got {len(data)}")
    value, kw = int.from_bytes(data, "little"), {}
    for name, lo, width, _ in KD_FIELDS:
      field = (value >> lo) & ((1 << width) - 1)
      if name in _SIGNED and field >> (width - 1): field -= 1 << width
      kw[name] = field
    return cls(**kw)

  def register(self, base: int) -> int:
    """One 32-bit register image (RSRC1, RSRC2, RSRC3 or PROPERTIES) as packed."""
    value = int.from_bytes(self.pack(), "little") >> base
    return value & (0xFFFF if base == PROPERTIES else 0xFFFFFFFF)

  @classmethod
  def for_kernel(cls, vgprs: int, kernarg_size: int = 0, lds_size: int = 0, workgroup_ids: int | tuple = 3,
                 workitem_dims: int = 3, private_size: int = 0, **fields):
    """A descriptor for a wave32 kernel using `vgprs` VGPRs, the kernarg pointer in s[0:1], workgroup ids in the
    next SGPRs (s2, s3, s4: `workgroup_ids` the first n of x, y, z, or three flags (x, y, z), each enabled id taking
    the next SGPR) and `workitem_dims` workitem ids packed in v0; any KD_FIELDS name can be overridden as a keyword.
    ENABLE_VGPR_WORKITEM_ID (AMDGPUUsage, compute_pgm_rsrc2): 0 gives x, 1 x and y, 2 x, y and z; gfx11 packs them
    in v0 as x | y << 10 | z << 20 (the packed work-item id layout of gfx90a and GFX11+)."""
    ids = tuple(workgroup_ids > k for k in range(3)) if isinstance(workgroup_ids, int) else tuple(map(bool, workgroup_ids))
    if len(ids) != 3: raise CodeObjectError(f"workgroup_ids takes a count or three flags (x, y, z), got {workgroup_ids!r}")
    if not 1 <= workitem_dims <= 3:
      raise CodeObjectError(f"workitem_dims is 1, 2 or 3 (x; x and y; x, y and z), got {workitem_dims}")
    granule = max(0, -(-max(vgprs, 1) // 8) - 1)      # GFX10-GFX11 wave32: blocks of 8 VGPRs
    # float_denorm_mode_32 = 3 (keep f32 denormals, what HIP kernels use; the emulator never flushes)
    kw = dict(granulated_workitem_vgpr_count=granule, kernarg_size=kernarg_size, float_denorm_mode_32=3,
              group_segment_fixed_size=lds_size, private_segment_fixed_size=private_size,
              enable_private_segment=int(private_size > 0),
              enable_sgpr_workgroup_id_x=int(ids[0]), enable_sgpr_workgroup_id_y=int(ids[1]),
              enable_sgpr_workgroup_id_z=int(ids[2]), enable_vgpr_workitem_id=workitem_dims - 1)
    kw.update(fields)
    return cls(**kw)

  @property
  def vgpr_count(self) -> int: return (self.granulated_workitem_vgpr_count + 1) * 8

  ns.update(pack=pack, unpack=unpack, register=register, for_kernel=for_kernel, vgpr_count=vgpr_count)


_ns: dict = {}
_kd_namespace(_ns)
KernelDescriptor = dataclasses.make_dataclass(
  "KernelDescriptor", [(name, int, dataclasses.field(default=default)) for name, _, _, default in KD_FIELDS],
  namespace=_ns)
KernelDescriptor.__module__ = __name__
KernelDescriptor.__doc__ = ("The AMDHSA kernel descriptor (AMDGPUUsage 'Kernel Descriptor'), one attribute per "
                            "field of KD_FIELDS; pack() -> 64 bytes, KernelDescriptor.unpack(bytes).")


# ---- MessagePack (only the types the metadata uses) ----

def msgpack(obj) -> bytes:
  out = io.BytesIO()
  _msgpack(obj, out)
  return out.getvalue()


def _msgpack(obj, out: io.BytesIO) -> None:
  if obj is None: out.write(b"\xc0")
  elif obj is True: out.write(b"\xc3")
  elif obj is False: out.write(b"\xc2")
  elif isinstance(obj, int):
    if 0 <= obj < 0x80: out.write(bytes([obj]))
    elif -32 <= obj < 0: out.write(struct.pack("b", obj))
    elif 0 <= obj < 1 << 8: out.write(b"\xcc" + struct.pack(">B", obj))
    elif 0 <= obj < 1 << 16: out.write(b"\xcd" + struct.pack(">H", obj))
    elif 0 <= obj < 1 << 32: out.write(b"\xce" + struct.pack(">I", obj))
    elif 0 <= obj < 1 << 64: out.write(b"\xcf" + struct.pack(">Q", obj))
    elif -(1 << 7) <= obj: out.write(b"\xd0" + struct.pack(">b", obj))
    elif -(1 << 15) <= obj: out.write(b"\xd1" + struct.pack(">h", obj))
    elif -(1 << 31) <= obj: out.write(b"\xd2" + struct.pack(">i", obj))
    else: out.write(b"\xd3" + struct.pack(">q", obj))
  elif isinstance(obj, float): out.write(b"\xcb" + struct.pack(">d", obj))
  elif isinstance(obj, str):
    data = obj.encode()
    n = len(data)
    if n < 32: out.write(bytes([0xA0 | n]))
    elif n < 1 << 8: out.write(b"\xd9" + struct.pack(">B", n))
    elif n < 1 << 16: out.write(b"\xda" + struct.pack(">H", n))
    else: out.write(b"\xdb" + struct.pack(">I", n))
    out.write(data)
  elif isinstance(obj, (list, tuple)):
    n = len(obj)
    out.write(bytes([0x90 | n]) if n < 16 else (b"\xdc" + struct.pack(">H", n)) if n < 1 << 16 else b"\xdd" + struct.pack(">I", n))
    for item in obj: _msgpack(item, out)
  elif isinstance(obj, dict):
    n = len(obj)
    out.write(bytes([0x80 | n]) if n < 16 else (b"\xde" + struct.pack(">H", n)) if n < 1 << 16 else b"\xdf" + struct.pack(">I", n))
    for key in sorted(obj): _msgpack(key, out); _msgpack(obj[key], out)   # llvm writes keys sorted
  else:
    raise TypeError(f"msgpack: cannot encode {type(obj).__name__}")


# ---- ELF constants (ELF-64 object file format; AMDGPUUsage "ELF Header") ----
ELFOSABI_AMDGPU_HSA = 64
ELFABIVERSION_AMDGPU_HSA_V5 = 3
EM_AMDGPU = 224
ET_DYN = 3
EF_AMDGPU_MACH_AMDGCN_GFX1100 = 0x041
EF_AMDGPU_FEATURE_XNACK_UNSUPPORTED_V4 = 0x000      # gfx1100 supports neither xnack nor sramecc,
EF_AMDGPU_FEATURE_SRAMECC_UNSUPPORTED_V4 = 0x000    # so llvm writes e_flags = 0x41
NT_AMDGPU_METADATA = 32
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_HASH, SHT_DYNAMIC, SHT_NOTE, SHT_DYNSYM = 1, 2, 3, 5, 6, 7, 11
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_PHDR = 1, 2, 4, 6
PF_X, PF_W, PF_R = 1, 2, 4
STB_GLOBAL, STT_OBJECT, STT_FUNC = 1, 1, 2
STV_PROTECTED = 3
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
PAGE = 0x1000


def _align(value: int, alignment: int) -> int: return -(-value // alignment) * alignment


def elf_hash(name: bytes) -> int:
  """The System V ABI symbol hash."""
  h = 0
  for c in name:
    h = ((h << 4) + c) & 0xFFFFFFFF
    g = h & 0xF0000000
    if g: h ^= g >> 24
    h &= ~g & 0xFFFFFFFF
  return h


def _metadata(name: str, kd, kernarg_size: int, args_meta, sgpr_count: int, vgpr_count: int,
              max_flat_workgroup_size: int) -> dict:
  args = []
  for arg in args_meta or ():
    args.append({(k if k.startswith(".") else "." + k): v for k, v in arg.items()})
  kernel = {".name": name, ".symbol": name + ".kd", ".kernarg_segment_size": kernarg_size,
            ".kernarg_segment_align": 8, ".group_segment_fixed_size": kd.group_segment_fixed_size,
            ".private_segment_fixed_size": kd.private_segment_fixed_size, ".sgpr_count": sgpr_count,
            ".vgpr_count": vgpr_count, ".wavefront_size": 32 if kd.enable_wavefront_size32 else 64,
            ".max_flat_workgroup_size": max_flat_workgroup_size, ".sgpr_spill_count": 0,
            ".vgpr_spill_count": 0, ".args": args}
  return {"amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx1100", "amdhsa.kernels": [kernel]}


class _Section:
  def __init__(self, name, type_, flags, data, align, entsize=0, link=0, info=0, addr_space=True):
    self.name, self.type, self.flags, self.data, self.align = name, type_, flags, data, align
    self.entsize, self.link, self.info, self.alloc = entsize, link, info, addr_space
    self.offset = self.addr = self.name_offset = 0


def write_code_object(name: str, code: bytes, kd, kernarg_size: int, args_meta=(), *, sgpr_count: int = 106,
                      vgpr_count: int | None = None, max_flat_workgroup_size: int = 1024) -> bytes:
  """An ELF64 EM_AMDGPU shared object (code object V5) holding one gfx1100 kernel.

  `code` is the machine code with the entry at byte 0; `kd` a KernelDescriptor (its
  kernel_code_entry_byte_offset and kernarg_size are filled in here); `args_meta` a list of
  metadata dicts per kernel argument, e.g. {".name": "out", ".size": 8, ".offset": 0,
  ".value_kind": "global_buffer", ".address_space": "global"} (the leading dot may be left out).
  """
  if not name or "\0" in name: raise CodeObjectError(f"bad kernel name {name!r}")
  if len(code) % 4: raise CodeObjectError(f"code size {len(code)} is not a multiple of 4 bytes")
  kd = dataclasses.replace(kd, kernarg_size=kernarg_size)
  vgpr_count = kd.vgpr_count if vgpr_count is None else vgpr_count
  meta = msgpack(_metadata(name, kd, kernarg_size, args_meta, sgpr_count, vgpr_count, max_flat_workgroup_size))
  note = struct.pack("<III", 7, len(meta), NT_AMDGPU_METADATA) + b"AMDGPU\0\0" + meta
  note += b"\0" * (_align(len(note), 4) - len(note))

  dynstr = b"\0" + name.encode() + b"\0" + (name + ".kd").encode() + b"\0"
  name_off, kd_name_off = 1, 2 + len(name)

  # sections in file order; addresses = file offsets (one image, as a loader maps it)
  s_note = _Section(".note", SHT_NOTE, SHF_ALLOC, note, 4)
  s_dynsym = _Section(".dynsym", SHT_DYNSYM, SHF_ALLOC, b"", 8, entsize=24, info=1)
  s_hash = _Section(".hash", SHT_HASH, SHF_ALLOC, b"", 4, entsize=4)
  s_dynstr = _Section(".dynstr", SHT_STRTAB, SHF_ALLOC, dynstr, 1)
  s_rodata = _Section(".rodata", SHT_PROGBITS, SHF_ALLOC, b"\0" * KD_SIZE, 64)
  s_text = _Section(".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, code, 256)
  s_dynamic = _Section(".dynamic", SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, b"", 8, entsize=16)
  s_symtab = _Section(".symtab", SHT_SYMTAB, 0, b"", 8, entsize=24, info=1, addr_space=False)
  s_shstrtab = _Section(".shstrtab", SHT_STRTAB, 0, b"", 1, addr_space=False)
  s_strtab = _Section(".strtab", SHT_STRTAB, 0, dynstr, 1, addr_space=False)
  sections = [s_note, s_dynsym, s_hash, s_dynstr, s_rodata, s_text, s_dynamic, s_symtab, s_shstrtab, s_strtab]
  index = {s.name: i + 1 for i, s in enumerate(sections)}
  s_dynsym.link = s_dynamic.link = index[".dynstr"]
  s_hash.link = index[".dynsym"]
  s_symtab.link = index[".strtab"]

  shstrtab = bytearray(b"\0")
  for s in sections:
    s.name_offset = len(shstrtab)
    shstrtab += s.name.encode() + b"\0"
  s_shstrtab.data = bytes(shstrtab)

  n_phdrs = 6
  ehdr_size, phdr_size = 64, 56
  # sizes that do not depend on addresses
  s_dynsym.data = b"\0" * 24 * 3
  s_symtab.data = b"\0" * 24 * 3
  nbucket = 3
  s_hash.data = b"\0" * 4 * (2 + nbucket + 3)
  s_dynamic.data = b"\0" * 16 * 6

  # lay out: the read-only part, then .text on its own page (256-byte aligned), then .dynamic
  offset = ehdr_size + phdr_size * n_phdrs
  for s in sections:
    if s is s_text: offset = _align(offset, PAGE)
    if s is s_dynamic: offset = _align(offset, PAGE)
    offset = _align(offset, s.align)
    s.offset = offset
    s.addr = offset if s.alloc else 0
    offset += len(s.data)
  shoff = _align(offset, 8)

  # symbols: [null, name (FUNC), name.kd (OBJECT)]
  def sym(name_off, info, other, shndx, value, size):
    return struct.pack("<IBBHQQ", name_off, info, other, shndx, value, size)
  syms = (b"\0" * 24 + sym(name_off, (STB_GLOBAL << 4) | STT_FUNC, STV_PROTECTED, index[".text"], s_text.addr, len(code))
          + sym(kd_name_off, (STB_GLOBAL << 4) | STT_OBJECT, 0, index[".rodata"], s_rodata.addr, KD_SIZE))
  s_dynsym.data = s_symtab.data = syms
  buckets, chains = [0] * nbucket, [0] * 3
  for i, n in ((1, name.encode()), (2, (name + ".kd").encode())):
    b = elf_hash(n) % nbucket
    chains[i], buckets[b] = buckets[b], i
  s_hash.data = struct.pack(f"<II{nbucket}I3I", nbucket, 3, *buckets, *chains)
  s_dynamic.data = struct.pack("<12Q", DT_HASH, s_hash.addr, DT_SYMTAB, s_dynsym.addr, DT_SYMENT, 24,
                               DT_STRTAB, s_dynstr.addr, DT_STRSZ, len(dynstr), DT_NULL, 0)
  kd = dataclasses.replace(kd, kernel_code_entry_byte_offset=s_text.addr - s_rodata.addr)
  s_rodata.data = kd.pack()

  ro_end = s_rodata.offset + len(s_rodata.data)
  phdrs = [
    (PT_PHDR, PF_R, ehdr_size, phdr_size * n_phdrs, phdr_size * n_phdrs, 8),
    (PT_LOAD, PF_R, 0, ro_end, ro_end, PAGE),
    (PT_LOAD, PF_R | PF_X, s_text.offset, len(code), len(code), PAGE),
    (PT_LOAD, PF_R | PF_W, s_dynamic.offset, len(s_dynamic.data), len(s_dynamic.data), PAGE),
    (PT_DYNAMIC, PF_R | PF_W, s_dynamic.offset, len(s_dynamic.data), len(s_dynamic.data), 8),
    (PT_NOTE, PF_R, s_note.offset, len(note), len(note), 4),
  ]
  out = bytearray(shoff + 64 * (len(sections) + 1))
  ident = b"\x7fELF" + bytes([2, 1, 1, ELFOSABI_AMDGPU_HSA, ELFABIVERSION_AMDGPU_HSA_V5]) + b"\0" * 7
  e_flags = EF_AMDGPU_MACH_AMDGCN_GFX1100 | EF_AMDGPU_FEATURE_XNACK_UNSUPPORTED_V4 | EF_AMDGPU_FEATURE_SRAMECC_UNSUPPORTED_V4
  out[0:64] = ident + struct.pack("<HHIQQQIHHHHHH", ET_DYN, EM_AMDGPU, 1, 0, ehdr_size, shoff, e_flags, ehdr_size,
                                  phdr_size, len(phdrs), 64, len(sections) + 1, index[".shstrtab"])
  for i, (type_, flags, off, filesz, memsz, align) in enumerate(phdrs):
    out[ehdr_size + i * phdr_size:ehdr_size + (i + 1) * phdr_size] = struct.pack(
      "<IIQQQQQQ", type_, flags, off, off, off, filesz, memsz, align)
  for i, s in enumerate(sections, 1):
    out[s.offset:s.offset + len(s.data)] = s.data
    out[shoff + 64 * i:shoff + 64 * (i + 1)] = struct.pack(
      "<IIQQQQIIQQ", s.name_offset, s.type, s.flags, s.addr, s.offset, len(s.data), s.link, s.info, s.align, s.entsize)
  return bytes(out)


@dataclasses.dataclass(frozen=True)
class KernelMeta:
  """What a compiler knows about a kernel besides its code, handed to `write_kernel` as data: register counts,
  segment sizes (lds_size: the workgroup's fixed LDS bytes, GROUP_SEGMENT_FIXED_SIZE), the launch registers it reads
  (workgroup ids in s2.., as for_kernel's `workgroup_ids`; work-item ids in v0), the most threads a workgroup of it
  may have (metadata .max_flat_workgroup_size) and argument metadata (dicts as write_code_object takes them).
  `descriptor` overrides KernelDescriptor fields by name."""
  name: str
  vgprs: int
  sgprs: int
  kernarg_size: int
  args: tuple = ()
  lds_size: int = 0
  workgroup_ids: int | tuple = 3
  workitem_dims: int = 3
  descriptor: tuple[tuple[str, int], ...] = ()
  max_flat_workgroup_size: int = 1024


def write_kernel(meta: KernelMeta, code: bytes) -> bytes:
  """The code object of one kernel: its descriptor from `meta`, `code` with the entry at byte 0."""
  kd = KernelDescriptor.for_kernel(meta.vgprs, kernarg_size=meta.kernarg_size, lds_size=meta.lds_size,
                                   workgroup_ids=meta.workgroup_ids, workitem_dims=meta.workitem_dims,
                                   **dict(meta.descriptor))
  return write_code_object(meta.name, code, kd, meta.kernarg_size, meta.args, sgpr_count=meta.sgprs,
                           vgpr_count=meta.vgprs, max_flat_workgroup_size=meta.max_flat_workgroup_size)


# ---- reading ----

def read_code_object(data: bytes):
  """(code, kd, entry offset into code, kernel name) of the first kernel in a code object.

  `code` is the whole .text section; execution starts at code[entry_offset:].
  """
  from elftools.elf.elffile import ELFFile
  from elftools.common.exceptions import ELFError

  if not isinstance(data, (bytes, bytearray, memoryview)): raise CodeObjectError(f"expected bytes, got {type(data).__name__}")
  data = bytes(data)
  if data[:4] != b"\x7fELF": raise CodeObjectError("not an ELF file (bad magic); expected an AMDGPU code object")
  try:
    elf = ELFFile(io.BytesIO(data))
    if elf["e_machine"] not in ("EM_AMDGPU", EM_AMDGPU):
      raise CodeObjectError(f"ELF machine is {elf['e_machine']}, expected EM_AMDGPU (224)")
    kd_sym = None
    for table_name in (".dynsym", ".symtab"):
      table = elf.get_section_by_name(table_name)
      if table is None: continue
      for s in table.iter_symbols():
        if s.name.endswith(".kd") and s["st_info"]["type"] == "STT_OBJECT":
          kd_sym = s
          break
      if kd_sym: break
    if kd_sym is None: raise CodeObjectError("no kernel descriptor symbol (`<name>.kd`, STT_OBJECT) in the code object")
    kd_bytes = _read_vaddr(elf, kd_sym["st_value"], KD_SIZE)
    kd = KernelDescriptor.unpack(kd_bytes)
    text = elf.get_section_by_name(".text")
    if text is None: raise CodeObjectError("code object has no .text section")
    code = text.data()
    entry = kd_sym["st_value"] + kd.kernel_code_entry_byte_offset - text["sh_addr"]
    if not 0 <= entry < len(code):
      raise CodeObjectError(f"kernel entry (descriptor at {kd_sym['st_value']:#x} + {kd.kernel_code_entry_byte_offset:#x}) "
                            f"is outside .text [{text['sh_addr']:#x}, {text['sh_addr'] + len(code):#x})")
    return code, kd, entry, kd_sym.name[:-3]
  except ELFError as e:
    raise CodeObjectError(f"malformed code object: {e}") from None
  except (struct.error, ValueError, KeyError, IndexError) as e:
    if isinstance(e, CodeObjectError): raise
    raise CodeObjectError(f"malformed code object: {type(e).__name__}: {e}") from None


def _read_vaddr(elf, addr: int, size: int) -> bytes:
  for sec in elf.iter_sections():
    if sec["sh_type"] == "SHT_NOBITS" or not sec["sh_flags"] & SHF_ALLOC: continue
    lo = sec["sh_addr"]
    if lo <= addr and addr + size <= lo + sec["sh_size"]:
      return sec.data()[addr - lo:addr - lo + size]
  raise CodeObjectError(f"address range [{addr:#x}, {addr + size:#x}) is in no section of the code object")
