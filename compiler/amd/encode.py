"""RDNA3 (gfx1100) encoder: instruction objects (inst.py) -> machine code, driven by the tables in
drivers/amd/isa.py. The one encoder: the renderer's objects come here directly, and the text assembler
(asm.py) parses hand-written lines into the same objects first.

`encode(inst)` encodes one instruction; `assemble(code)` a list of instructions and `Label`s, branch targets
resolved. A mnemonic with several encodings (VOP2 and VOP3) takes the first whose operand rules the operands
meet, as llvm-mc does. Errors raise AsmError naming the instruction.
"""
from __future__ import annotations
import math
import re
import struct

from baregrad.drivers.amd import isa
from baregrad.drivers.amd.isa import FORMATS, Operand
from .inst import Inst, Reg, Sub, Imm, Label, Neg, Abs, Special, OFF, mods_text


class AsmError(ValueError):
  pass


# ---- constants: inline codes and literals per operand kind ----

def _f16_bits(x: float) -> int: return struct.unpack("<H", struct.pack("<e", x))[0]
def _f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def _f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


def _inline_float_code(value: float, kind: str) -> int | None:
  """The inline code (240..248) a float maps to for this operand kind, if any."""
  for code, (fval, b16, b32, b64) in isa.INLINE_FLOATS.items():
    if code == 248:
      if kind in ("f64", "b64"):
        if _f64_bits(value) == b64: return code
      elif kind in ("f16", "i16", "v2f16"):
        if _f16_bits(value) == b16 or _f32_bits(value) == b32: return code
      elif _f32_bits(value) == b32: return code
    elif value == fval:
      return code
  return None


def _inline_bits_code(value: int, kind: str) -> int | None:
  """An integer whose bit pattern is an inline float constant of the operand's type."""
  for code, (_, b16, b32, b64) in isa.INLINE_FLOATS.items():
    if kind in ("f16", "v2f16") and value == b16: return code
    if kind in ("b32", "n32") and value == b32: return code
  return None


def encode_constant(value: int | float, kind: str, allow_literal: bool) -> tuple[int, int | None]:
  """(source code, literal dword or None) for a constant operand of the given kind."""
  if isinstance(value, int):
    if -16 <= value <= 64: return (isa.INLINE_INT_ZERO + value if value >= 0 else 192 - value), None
    code = _inline_bits_code(value, kind)
    if code is not None: return code, None
    bits = 16 if kind in ("f16", "i16", "bf16") else 32
    if not -(1 << (bits - 1)) <= value < (1 << bits):
      raise AsmError(f"literal {value:#x} does not fit in {bits} bits")
    literal = value & ((1 << bits) - 1)
  else:
    if math.isnan(value) or math.isinf(value): raise AsmError(f"cannot encode {value} as a literal")
    code = _inline_float_code(value, kind)
    if code is not None: return code, None
    if kind in ("f16", "v2f16"): literal = _f16_bits(value)
    elif kind in ("bf16", "v2bf16"): literal = _f32_bits(value) >> 16
    elif kind == "f64": literal = _f64_bits(value) >> 32
    elif kind == "b64": raise AsmError(f"float literal {value} not allowed for a 64-bit integer operand")
    else: literal = _f32_bits(value)
  if not allow_literal: raise AsmError(f"literal constant {value} not allowed here")
  return isa.LITERAL, literal


def is_literal(value: int) -> bool:
  """Whether a 32-bit integer operand needs a literal dword (no inline integer or float constant)."""
  return not (-16 <= value <= 64 or _inline_bits_code(value & 0xFFFFFFFF, "b32") is not None)


def _bits(kind: str) -> int:
  return int(kind[1:]) if isa.is_sized_kind(kind) else isa.SRC_KIND_BITS.get(kind, 32)


class _Encoding:
  """Collects field values and the literal of one instruction."""

  def __init__(self, entry: isa.Inst):
    self.entry, self.fmt = entry, FORMATS[entry.fmt]
    self.values: dict[str, int] = dict(self.fmt.fixed)
    self.values["op"] = entry.opcode
    self.values.update(entry.fixed)
    self.literal: int | None = None

  def set(self, name: str, value: int):
    field = self.fmt.fields[name]
    if not 0 <= value < (1 << field.width):
      raise AsmError(f"{name}={value} does not fit in {field.width} bits")
    self.values[name] = value

  def set_literal(self, literal: int):
    if self.literal is not None and self.literal != literal:
      raise AsmError("only one literal constant is allowed per instruction")
    self.literal = literal

  def bytes(self) -> bytes:
    lo, _, prefix = self.fmt.match
    word = prefix << lo
    for name, value in self.values.items():
      word |= self.fmt.fields[name].put(value)
    data = word.to_bytes(self.fmt.size, "little")
    if self.literal is not None: data += self.literal.to_bytes(4, "little")
    return data


# ---- registers ----

def _register(x, kind: str) -> tuple[str, int, int]:
  """(file, first encoding number, count) of a register operand, checked against a register kind."""
  if not isinstance(x, (Reg, Sub)):
    raise AsmError(f"operand {x}: expected a{'n SGPR' if kind[0] == 's' else ' VGPR' if kind[0] == 'v' else ' register'}")
  if x.phys is None: raise AsmError(f"operand {x!r}: a virtual register (allocate registers first)")
  want_file = kind[0] if isa.is_reg_kind(kind) else None
  if want_file and x.file != want_file:
    raise AsmError(f"operand {x}: expected a{'n SGPR' if want_file == 's' else ' VGPR'}")
  want = _bits(kind) // 32
  if x.size != want:
    raise AsmError(f"operand {x}: expected {want} register{'s' if want > 1 else ''}, got {x.size}")
  if x.file == "s" and x.size > 1 and x.phys % min(x.size, 4):
    raise AsmError(f"scalar register range {x} is not aligned to {min(x.size, 4)}")
  return x.file, x.phys, x.size


_SRC_FIELDS = {"src0", "src1", "src2", "ssrc0", "ssrc1"}


def _encode_source(enc: _Encoding, op: Operand, x):
  """Register, special source, inline constant or literal into a source field."""
  kind, fld = op.kind, op.field
  plain = x
  while isinstance(plain, (Neg, Abs)): plain = plain.x
  if isinstance(plain, Special):
    if isa.is_reg_kind(kind): raise AsmError(f"operand {x}: expected a register")
    if plain.name not in isa.SPECIAL_SRCS: raise AsmError(f"operand {x}: not a source")
    enc.set(fld, isa.SPECIAL_SRCS[plain.name])
  elif isinstance(plain, Imm):
    if isa.is_reg_kind(kind): raise AsmError(f"operand {x}: expected a register, not a constant")
    code, literal = encode_constant(plain.value, kind, allow_literal=kind[0] != "n")
    enc.set(fld, code)
    if literal is not None: enc.set_literal(literal)
  else:
    if not isinstance(plain, (Reg, Sub)): raise AsmError(f"operand {x}: not a source operand")
    if fld.startswith("ssrc") and plain.file == "v": raise AsmError(f"operand {x}: scalar instructions cannot read VGPRs")
    reg_kind = kind if isa.is_reg_kind(kind) else plain.file + str(_bits(kind))
    file, index, _ = _register(plain, reg_kind)
    enc.set(fld, index + (isa.VGPR_BASE if file == "v" else 0))


def _encode_register(enc: _Encoding, op: Operand, x):
  _, index, _ = _register(x, op.kind)
  if op.field == "sbase": enc.set("sbase", index >> 1)
  else: enc.set(op.field, index)


def _encode_imm16(enc: _Encoding, x, labels: dict[str, int] | None, pc: int):
  if isinstance(x, Label):
    if labels is None: raise AsmError(f"label {x.name!r} needs assemble(), not encode()")
    if x.name not in labels: raise AsmError(f"undefined label {x.name!r}")
    value = (labels[x.name] - (pc + 4)) // 4
  elif isinstance(x, Imm) and isinstance(x.value, int):
    value = x.value
  else:
    raise AsmError(f"expected an integer, got {x}")
  if not -0x8000 <= value <= 0xFFFF: raise AsmError(f"immediate {value} does not fit in 16 bits")
  enc.set("simm16", value & 0xFFFF)


# ---- modifiers ----

def _mod_text(name: str, value) -> str: return mods_text({name: value})[0]


def _valu_modifiers(enc: _Encoding, entry: isa.Inst, srcs: list, mods: dict):
  allowed = entry.modifiers
  nsrc = sum(1 for op in entry.operands if op.field.startswith("src"))
  neg = abs_bits = 0
  for i, src in enumerate(srcs):
    if isinstance(src, Neg):
      if "neg" not in allowed: raise AsmError(f"{entry.name}: negation (-) not allowed on its operands")
      neg |= 1 << i
      src = src.x
    if isinstance(src, Abs):
      if "abs" not in allowed: raise AsmError(f"{entry.name}: |abs| not allowed on its operands")
      abs_bits |= 1 << i
  packed = entry.fmt == "VOP3P"
  if packed:
    if neg: enc.set("neg", neg)
    if abs_bits: enc.set("neg_hi", abs_bits)    # v_fma_mix: |x| is stored in neg_hi
    default_hi = 0 if entry.name.startswith("v_fma_mix") else (1 << nsrc) - 1 if nsrc else 0
    if default_hi:
      enc.set("op_sel_hi", default_hi & 3)
      enc.set("op_sel_hi2", 1 if nsrc < 3 else (default_hi >> 2) & 1)
  elif neg or abs_bits:
    enc.set("neg", neg)
    enc.set("abs", abs_bits)
  for name, value in mods.items():
    if name not in allowed: raise AsmError(f"{entry.name}: modifier {_mod_text(name, value)!r} not allowed")
    if name == "clamp": enc.set("clamp", 1)
    elif name == "omod": enc.set("omod", value)
    else:
      bits = list(value)
      if any(b not in (0, 1) for b in bits): raise AsmError(f"{_mod_text(name, value)!r}: values must be 0 or 1")
      packed_bits = sum(b << i for i, b in enumerate(bits))
      if name == "op_sel" and not packed:
        if len(bits) != nsrc + 1: raise AsmError(f"{_mod_text(name, value)!r}: expected {nsrc + 1} values")
        packed_bits = (packed_bits & ((1 << nsrc) - 1)) | (bits[-1] << 3)
      elif len(bits) != nsrc:
        raise AsmError(f"{_mod_text(name, value)!r}: expected {nsrc} values")
      if name == "op_sel": enc.set("op_sel", packed_bits)
      elif name == "op_sel_hi":
        enc.set("op_sel_hi", packed_bits & 3)
        enc.set("op_sel_hi2", (packed_bits >> 2) & 1 if nsrc == 3 else 1)
      elif name == "neg_lo": enc.set("neg", packed_bits)
      else: enc.set("neg_hi", packed_bits)


def _encode_memory_mods(enc: _Encoding, entry: isa.Inst, mods: dict):
  for name, value in mods.items():
    if name not in entry.modifiers and not (name == "offset" and "smem_offset" in entry.modifiers):
      raise AsmError(f"{entry.name}: modifier {_mod_text(name, value)!r} not allowed")
    if value is True:
      enc.set(name, 1)
      continue
    if entry.fmt == "DS":
      limit = 255 if name != "offset" else 65535
      if not 0 <= value <= limit: raise AsmError(f"{_mod_text(name, value)!r} out of range (0..{limit})")
      if name == "offset": enc.set("offset0", value & 0xFF); enc.set("offset1", value >> 8)
      else: enc.set(name, value)
    elif entry.fmt == "SMEM":
      if not -(1 << 20) <= value < (1 << 20): raise AsmError(f"{_mod_text(name, value)!r}: expected a 21-bit signed offset")
      enc.set("offset", value & ((1 << 21) - 1))
    else:
      lo, hi = (0, 4095) if entry.fmt == "FLAT" else (-4096, 4095)
      if not lo <= value <= hi: raise AsmError(f"{_mod_text(name, value)!r} out of range ({lo}..{hi})")
      enc.set("offset", value & 0x1FFF)


def _encode_smem_address(enc: _Encoding, extra: tuple):
  """`sbase, imm` | `sbase, soffset` ; the offset:N modifier is handled with the others."""
  enc.set("soffset", isa.SPECIAL_SREGS["null"])
  if not extra: return
  if len(extra) > 1: raise AsmError("too many operands")
  x = extra[0]
  if isinstance(x, Imm) and isinstance(x.value, int):
    if not -(1 << 20) <= x.value < (1 << 20): raise AsmError(f"offset {x} does not fit in 21 bits (signed)")
    enc.set("offset", x.value & ((1 << 21) - 1))
  else:
    _, index, _ = _register(x, "s32")
    enc.set("soffset", index)


# ---- one instruction ----

def _is_16bit_operand(entry: isa.Inst, op: Operand) -> bool:
  """In VOP1/VOP2/VOPC forms a 16-bit operand's VGPR field holds 7 bits plus a half selector
  (true16), so without that syntax only v0..v127 are encodable there (checked with llvm-mc-19)."""
  if op.field == "vdst":
    m = re.search(r"_[fiub](\d+)", entry.name)
    return bool(m) and m[1] == "16" and "_pk_" not in entry.name
  if op.field == "vsrc1":
    vop3 = [i for i in isa.BY_NAME[entry.name] if i.fmt == "VOP3"]
    kinds = {o.kind for o in (vop3[0] if vop3 else entry).operands if o.field in ("src0", "src1", "k")}
    return bool(kinds & {"f16", "i16", "bf16", "k16"})
  return op.kind in ("f16", "i16", "bf16")


def _encode_operands(enc: _Encoding, entry: isa.Inst, operands: tuple, mods: dict, labels, pc: int):
  table = list(entry.operands)
  if table and table[0].optional and not mods.get("glc"): table = table[1:]   # returning atomics: vdst only with glc
  if table and table[0].kind == "dec?" and not operands: operands = (Imm(0),)
  if entry.fmt in ("FLAT", "GLOBAL", "SCRATCH"): enc.set("saddr", isa.SPECIAL_SREGS["null"])
  extra: tuple = ()
  if entry.fmt == "SMEM" and entry.operands: operands, extra = operands[:2], operands[2:]
  if len(operands) != len(table):
    raise AsmError(f"{entry.name} takes {len(table)} operand{'s' if len(table) != 1 else ''}, got {len(operands)}")
  srcs: list = []
  saddr_is_reg = any(op.kind == "saddr" and x is not OFF for op, x in zip(table, operands))
  for op, x in zip(table, operands):
    kind, fld = op.kind, op.field
    if fld == "":
      if str(x) != kind: raise AsmError(f"{entry.name}: expected {kind!r}, got {x}")
    elif fld == "simm16":
      _encode_imm16(enc, x, labels, pc)
    elif kind in ("k32", "k16"):
      if not isinstance(x, Imm): raise AsmError(f"expected a constant, got {x}")
      value, bits = x.value, 16 if kind == "k16" else 32
      if isinstance(value, float): value = _f16_bits(value) if kind == "k16" else _f32_bits(value)
      if not -(1 << (bits - 1)) <= value < (1 << bits): raise AsmError(f"constant {x} does not fit")
      enc.set_literal(value & ((1 << bits) - 1))
    elif fld in _SRC_FIELDS:
      if isinstance(x, (Neg, Abs)) and entry.fmt not in ("VOP3", "VOP3P"):
        raise AsmError(f"operand {x}: neg/abs need the VOP3 (_e64) encoding")
      _encode_source(enc, op, x)
      if fld.startswith("src"): srcs.append(x)
    elif kind == "saddr":
      if x is OFF: enc.set("saddr", isa.SPECIAL_SREGS["null"])
      else: _encode_register(enc, Operand("saddr", "s64" if entry.fmt == "GLOBAL" else "s32"), x)
    elif kind == "vaddr":
      if entry.fmt == "SCRATCH":
        if x is OFF: continue
        _encode_register(enc, Operand("addr", "v32"), x)
        enc.set("sve", 1)
      else:
        _encode_register(enc, Operand("addr", "v32" if saddr_is_reg else "v64"), x)
    else:
      _encode_register(enc, op, x)
  if entry.fmt in ("VOP1", "VOP2", "VOPC"):
    for op, x in zip(table, operands):
      if op.field and isinstance(x, (Reg, Sub)) and x.file == "v" and x.phys + x.size > 128 and _is_16bit_operand(entry, op):
        raise AsmError(f"operand {x}: 16-bit operands reach only v0..v127 in the 32-bit encoding")
  if entry.fmt == "SMEM" and entry.operands: _encode_smem_address(enc, extra)
  if entry.fmt in ("VOP3", "VOP3P"): _valu_modifiers(enc, entry, srcs, mods)
  elif mods: _encode_memory_mods(enc, entry, mods)


def encodings(mnemonic: str) -> list[isa.Inst]:
  """The table entries a mnemonic may encode as, in the order they are tried (_e32/_e64 pins one form)."""
  m = re.fullmatch(r"(.*)_e(32|64)", mnemonic)
  if m and m[1] in isa.BY_NAME:
    want_vop3 = m[2] == "64"
    found = [i for i in isa.BY_NAME[m[1]] if (i.fmt == "VOP3") == want_vop3]
    if found: return found
  if mnemonic not in isa.BY_NAME: raise AsmError(f"unknown mnemonic {mnemonic!r}")
  return isa.BY_NAME[mnemonic]


def encode(inst: Inst, labels: dict[str, int] | None = None, pc: int = 0) -> bytes:
  """The machine code of one instruction at byte offset `pc` (`labels`: byte offsets of branch targets)."""
  errors = []
  for entry in encodings(inst.name):
    try:
      enc = _Encoding(entry)
      _encode_operands(enc, entry, inst.operands, inst.mods, labels, pc)
      return enc.bytes()
    except AsmError as e:
      errors.append(e)
  raise errors[-1]


def assemble(code: list, where: list[str] | None = None) -> bytes:
  """Machine code of a list of `Inst`s and `Label`s (a label names the offset of the next instruction).
  `where[i]` names item i in errors (asm.py passes the source line)."""
  labels: dict[str, int] = {}
  chunks: list[bytes | None] = []
  pc = 0
  for i, x in enumerate(code):   # pass 1: offsets (a branch's size does not depend on its target)
    if isinstance(x, Label):
      if x.name in labels: raise AsmError(f"{where[i] if where else x.name}: label {x.name!r} defined twice")
      labels[x.name] = pc
      chunks.append(b"")
      continue
    branch = x.target is not None
    try: data = encode(x, {t.name: 0 for t in x.operands if isinstance(t, Label)} if branch else None, pc)
    except AsmError as e: raise AsmError(f"{where[i] if where else x}: {e}") from None
    chunks.append(None if branch else data)
    pc += len(data)
  out, pc = bytearray(), 0
  for i, (x, data) in enumerate(zip(code, chunks)):   # pass 2: branches with their targets
    if data is None:
      try: data = encode(x, labels, pc)
      except AsmError as e: raise AsmError(f"{where[i] if where else x}: {e}") from None
    out += data
    pc += len(data)
  return bytes(out)
