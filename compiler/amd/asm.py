"""RDNA3 (gfx1100) assembler: text -> machine code, driven by the tables in isa.py.

`assemble(text)` takes one instruction per line (`;` and `//` comments, `name:` labels for
branches); `encode(line)` encodes a single instruction. Errors raise AsmError naming the line.
"""
from __future__ import annotations
import math
import re
import struct
from dataclasses import dataclass

from . import isa
from .isa import FORMATS, Inst, Operand


class AsmError(ValueError):
  pass


@dataclass(frozen=True)
class Reg:
  file: str       # 's' (scalar, including vcc/exec/m0/null/ttmp) or 'v'
  index: int      # encoding number for 's', register number for 'v'
  count: int      # number of 32-bit registers


@dataclass(frozen=True)
class Src:
  """A parsed source operand: a register, an integer, a float, or a special source name."""
  reg: Reg | None = None
  value: int | float | None = None
  code: int | None = None       # special source (src_scc, ...)
  neg: bool = False
  abs: bool = False


_REG_RE = re.compile(r"(v|s|ttmp)(?:(\d+)|\[(\d+)(?::(\d+))?\])$")


def parse_reg(text: str) -> Reg | None:
  text = text.strip()
  if text in isa.SPECIAL_SREGS: return Reg("s", isa.SPECIAL_SREGS[text], 1)
  if text in isa.SPECIAL_SREG_PAIRS: return Reg("s", isa.SPECIAL_SREG_PAIRS[text], 2)
  m = _REG_RE.match(text)
  if not m: return None
  kind = m[1]
  first = int(m[2] if m[2] is not None else m[3])
  last = int(m[4]) if m[4] is not None else first
  if last < first: raise AsmError(f"register range {text!r} is reversed")
  count = last - first + 1
  if kind == "v":
    if last > 255: raise AsmError(f"VGPR {text!r} out of range (v0..v255)")
    return Reg("v", first, count)
  if kind == "ttmp":
    if last > 15: raise AsmError(f"trap register {text!r} out of range (ttmp0..ttmp15)")
    first += isa.TTMP_BASE
  elif last >= isa.SGPR_COUNT:
    raise AsmError(f"SGPR {text!r} out of range (s0..s{isa.SGPR_COUNT - 1})")
  if count > 1 and first % min(count, 4):
    raise AsmError(f"scalar register range {text!r} is not aligned to {min(count, 4)}")
  return Reg("s", first, count)


def parse_int(text: str) -> int | None:
  text = text.strip()
  try:
    return int(text, 0)
  except ValueError:
    return None


def parse_number(text: str) -> int | float | None:
  value = parse_int(text)
  if value is not None: return value
  if re.fullmatch(r"-?(\d+\.\d*|\.\d+|\d+)(e[-+]?\d+)?", text.strip(), re.I):
    return float(text)
  return None


def parse_src(text: str) -> Src:
  text = text.strip()
  neg = absolute = False
  if text.startswith("-") and (text[1:2] == "|" or text[1:].startswith(("abs(", "v", "s", "ttmp"))
                               or text[1:] in isa.SPECIAL_SREGS or text[1:] in isa.SPECIAL_SREG_PAIRS):
    neg, text = True, text[1:].strip()
  elif text.startswith("neg(") and text.endswith(")"):
    neg, text = True, text[4:-1].strip()
  if text.startswith("|") and text.endswith("|") and len(text) > 1:
    absolute, text = True, text[1:-1].strip()
  elif text.startswith("abs(") and text.endswith(")"):
    absolute, text = True, text[4:-1].strip()
  reg = parse_reg(text)
  if reg is not None: return Src(reg=reg, neg=neg, abs=absolute)
  if text in isa.SPECIAL_SRCS: return Src(code=isa.SPECIAL_SRCS[text], neg=neg, abs=absolute)
  value = parse_number(text)
  if value is None: raise AsmError(f"cannot parse operand {text!r}")
  return Src(value=value, neg=neg, abs=absolute)


# ---- constants: inline codes and literals per operand kind ----

def _f16_bits(x: float) -> int: return struct.unpack("<H", struct.pack("<e", x))[0]
def _f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def _f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


def _inline_float_code(value: float, kind: str) -> int | None:
  """The inline code (240..248) a float token maps to for this operand kind, if any."""
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
  """An integer token whose bit pattern is an inline float constant of the operand's type."""
  for code, (_, b16, b32, b64) in isa.INLINE_FLOATS.items():
    if kind in ("f16", "v2f16") and value == b16: return code
    if kind in ("b32", "n32") and value == b32: return code
  return None


def encode_constant(value: int | float, kind: str, allow_literal: bool) -> tuple[int, int | None]:
  """(source code, literal dword or None) for a numeric operand of the given kind."""
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


# ---- line parsing ----

def split_operands(text: str) -> list[str]:
  """Split at commas outside brackets and parentheses."""
  parts, depth, cur = [], 0, ""
  for ch in text:
    if ch in "([": depth += 1
    elif ch in ")]": depth -= 1
    if ch == "," and depth == 0:
      parts.append(cur.strip())
      cur = ""
    else:
      cur += ch
  if cur.strip(): parts.append(cur.strip())
  return parts


_MODIFIER_RE = re.compile(r"(clamp|glc|slc|dlc|gds|off|offset\d?:\S+|(?:mul|div):\d|"
                          r"(?:op_sel|op_sel_hi|neg_lo|neg_hi):\[[\d,\s]*\])$")


def split_modifiers(operands: list[str]) -> tuple[list[str], list[str]]:
  """Peel trailing space-separated modifiers (clamp, offset:16, op_sel:[..]) off the last operand."""
  if not operands: return operands, []
  words = re.findall(r"\S+:\[[^\]]*\]|\S+", operands[-1])
  mods = []
  while len(words) > 1 and _MODIFIER_RE.match(words[-1]) and words[-1] != "off":
    mods.insert(0, words.pop())
  return operands[:-1] + [" ".join(words)], mods


def _bits(kind: str) -> int:
  return int(kind[1:]) if isa.is_sized_kind(kind) else isa.SRC_KIND_BITS.get(kind, 32)


class _Encoding:
  """Collects field values and the literal of one instruction."""

  def __init__(self, inst: Inst):
    self.inst, self.fmt = inst, FORMATS[inst.fmt]
    self.values: dict[str, int] = dict(self.fmt.fixed)
    self.values["op"] = inst.opcode
    self.values.update(inst.fixed)
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


def _check_reg(reg: Reg, kind: str, text: str):
  want_file = kind[0] if isa.is_reg_kind(kind) else None
  if want_file and reg.file != want_file:
    raise AsmError(f"operand {text!r}: expected a{'n SGPR' if want_file == 's' else ' VGPR'}")
  want = _bits(kind) // 32
  if reg.count != want:
    raise AsmError(f"operand {text!r}: expected {want} register{'s' if want > 1 else ''}, got {reg.count}")


def _reg_code(reg: Reg, src_field: bool) -> int:
  return reg.index + (isa.VGPR_BASE if reg.file == "v" and src_field else 0)


_SRC_FIELDS = {"src0", "src1", "src2", "ssrc0", "ssrc1"}


def _encode_source(enc: _Encoding, op: Operand, text: str, src: Src):
  """Register, inline constant or literal into a source field."""
  kind, fld = op.kind, op.field
  if fld.startswith("ssrc") and src.reg is not None and src.reg.file == "v":
    raise AsmError(f"operand {text!r}: scalar instructions cannot read VGPRs")
  if src.reg is not None:
    if isa.is_reg_kind(kind): _check_reg(src.reg, kind, text)
    else: _check_reg(src.reg, ("v" if src.reg.file == "v" else "s") + str(_bits(kind)), text)
    enc.set(fld, _reg_code(src.reg, True))
  elif src.code is not None:
    if isa.is_reg_kind(kind): raise AsmError(f"operand {text!r}: expected a register")
    enc.set(fld, src.code)
  else:
    if isa.is_reg_kind(kind): raise AsmError(f"operand {text!r}: expected a register, not a constant")
    code, literal = encode_constant(src.value, kind, allow_literal=kind[0] != "n")
    enc.set(fld, code)
    if literal is not None: enc.set_literal(literal)


def _encode_register(enc: _Encoding, op: Operand, text: str):
  reg = parse_reg(text)
  if reg is None: raise AsmError(f"operand {text!r}: expected a {'VGPR' if op.kind[0] == 'v' else 'register'}")
  _check_reg(reg, op.kind, text)
  if op.field == "sbase": enc.set("sbase", reg.index >> 1)
  else: enc.set(op.field, reg.index)


# ---- special 16-bit immediates ----

def _parse_waitcnt(text: str) -> int:
  value = parse_int(text)
  if value is not None: return value
  result = 0
  for name, (lo, width) in isa.WAITCNT_FIELDS.items(): result |= ((1 << width) - 1) << lo
  for m in re.finditer(r"(\w+)\((\d+)\)|(\S+)", text):
    if m[3] in ("&", ","): continue
    if m[1] not in isa.WAITCNT_FIELDS: raise AsmError(f"bad s_waitcnt counter {m[0]!r}")
    lo, width = isa.WAITCNT_FIELDS[m[1]]
    if int(m[2]) >= (1 << width): raise AsmError(f"{m[1]}({m[2]}) out of range (max {(1 << width) - 1})")
    result = (result & ~(((1 << width) - 1) << lo)) | (int(m[2]) << lo)
  return result


def _parse_delay(text: str) -> int:
  value = parse_int(text)
  if value is not None: return value
  result = 0
  for part in text.split("|"):
    m = re.fullmatch(r"\s*(instid0|instskip|instid1)\((\w+)\)\s*", part)
    if not m: raise AsmError(f"bad s_delay_alu field {part.strip()!r}")
    names = isa.DELAY_INSTSKIP if m[1] == "instskip" else isa.DELAY_INSTID
    if m[2] not in names: raise AsmError(f"unknown {m[1]} value {m[2]!r}")
    shift = {"instid0": 0, "instskip": 4, "instid1": 7}[m[1]]
    result |= names.index(m[2]) << shift
  return result


def _parse_hwreg(text: str) -> int:
  m = re.fullmatch(r"hwreg\((\w+)(?:,\s*(\d+),\s*(\d+))?\)", text.strip())
  if not m: raise AsmError(f"expected hwreg(name[, offset, size]), got {text!r}")
  names = {v: k for k, v in isa.HWREG_NAMES.items()}
  reg = names.get(m[1], parse_int(m[1]))
  if reg is None or not 0 <= reg < 64: raise AsmError(f"unknown hardware register {m[1]!r}")
  offset, size = (int(m[2]), int(m[3])) if m[2] else (0, 32)
  if not (0 <= offset < 32 and 1 <= size <= 32): raise AsmError(f"bad hwreg offset/size in {text!r}")
  return reg | (offset << 6) | ((size - 1) << 11)


def _parse_sendmsg(text: str) -> int:
  m = re.fullmatch(r"sendmsg\((\w+)(?:,\s*(\d+)(?:,\s*(\d+))?)?\)", text.strip())
  if not m:
    value = parse_int(text)
    if value is None: raise AsmError(f"expected sendmsg(...), got {text!r}")
    return value
  names = {v: k for k, v in isa.SENDMSG_NAMES.items()}
  msg = names.get(m[1], parse_int(m[1]))
  if msg is None: raise AsmError(f"unknown message {m[1]!r}")
  return msg | (int(m[2] or 0) << 4) | (int(m[3] or 0) << 8)


def _encode_imm16(enc: _Encoding, op: Operand, text: str, labels: dict[str, int] | None, pc: int):
  kind = op.kind
  if kind == "waitcnt": value = _parse_waitcnt(text)
  elif kind == "delay": value = _parse_delay(text)
  elif kind == "hwreg": value = _parse_hwreg(text)
  elif kind == "sendmsg": value = _parse_sendmsg(text)
  else:
    value = parse_int(text)
    if value is None and kind == "label":
      if labels is None: raise AsmError(f"label {text!r} needs assemble(), not encode()")
      if text not in labels: raise AsmError(f"undefined label {text!r}")
      delta = labels[text] - (pc + 4)
      value = delta // 4
    if value is None: raise AsmError(f"expected an integer, got {text!r}")
  if not -0x8000 <= value <= 0xFFFF: raise AsmError(f"immediate {value} does not fit in 16 bits")
  enc.set("simm16", value & 0xFFFF)


# ---- per-format operand handling ----

def _valu_modifiers(enc: _Encoding, inst: Inst, srcs: list[Src], mods: list[str]):
  allowed = inst.modifiers
  nsrc = sum(1 for op in inst.operands if op.field.startswith("src"))
  neg = abs_bits = 0
  for i, src in enumerate(srcs):
    if src.neg:
      if "neg" not in allowed: raise AsmError(f"{inst.name}: negation (-) not allowed on its operands")
      neg |= 1 << i
    if src.abs:
      if "abs" not in allowed: raise AsmError(f"{inst.name}: |abs| not allowed on its operands")
      abs_bits |= 1 << i
  packed = inst.fmt == "VOP3P"
  if packed:
    if neg: enc.set("neg", neg)
    if abs_bits: enc.set("neg_hi", abs_bits)    # v_fma_mix: |x| is stored in neg_hi
    default_hi = 0 if inst.name.startswith("v_fma_mix") else (1 << nsrc) - 1 if nsrc else 0
    if default_hi:
      enc.set("op_sel_hi", default_hi & 3)
      enc.set("op_sel_hi2", 1 if nsrc < 3 else (default_hi >> 2) & 1)
  elif neg or abs_bits:
    enc.set("neg", neg)
    enc.set("abs", abs_bits)
  for mod in mods:
    m = re.fullmatch(r"(op_sel|op_sel_hi|neg_lo|neg_hi):\[([\d,\s]*)\]", mod)
    name = m[1] if m else "omod" if mod in isa.OMOD else mod
    if name not in allowed: raise AsmError(f"{inst.name}: modifier {mod!r} not allowed")
    if name == "clamp": enc.set("clamp", 1)
    elif name == "omod": enc.set("omod", isa.OMOD[mod])
    else:
      bits = [int(b) for b in m[2].split(",")]
      if any(b not in (0, 1) for b in bits): raise AsmError(f"{mod!r}: values must be 0 or 1")
      value = sum(b << i for i, b in enumerate(bits))
      if name == "op_sel" and not packed:
        if len(bits) != nsrc + 1: raise AsmError(f"{mod!r}: expected {nsrc + 1} values")
        value = (value & ((1 << nsrc) - 1)) | (bits[-1] << 3)
      elif len(bits) != nsrc:
        raise AsmError(f"{mod!r}: expected {nsrc} values")
      if name == "op_sel": enc.set("op_sel", value)
      elif name == "op_sel_hi":
        enc.set("op_sel_hi", value & 3)
        enc.set("op_sel_hi2", (value >> 2) & 1 if nsrc == 3 else 1)
      elif name == "neg_lo": enc.set("neg", value)
      else: enc.set("neg_hi", value)


def _encode_memory_mods(enc: _Encoding, inst: Inst, mods: list[str]):
  for mod in mods:
    name, _, value = mod.partition(":")
    if name not in inst.modifiers and not (name == "offset" and "smem_offset" in inst.modifiers):
      raise AsmError(f"{inst.name}: modifier {mod!r} not allowed")
    if not value:
      enc.set(name, 1)
      continue
    number = parse_int(value)
    if number is None: raise AsmError(f"{mod!r}: expected an integer")
    if inst.fmt == "DS":
      limit = 255 if name != "offset" else 65535
      if not 0 <= number <= limit: raise AsmError(f"{mod!r} out of range (0..{limit})")
      if name == "offset": enc.set("offset0", number & 0xFF); enc.set("offset1", number >> 8)
      else: enc.set(name, number)
    elif inst.fmt == "SMEM":
      if not -(1 << 20) <= number < (1 << 20): raise AsmError(f"{mod!r}: expected a 21-bit signed offset")
      enc.set("offset", number & ((1 << 21) - 1))
    else:
      lo, hi = (0, 4095) if inst.fmt == "FLAT" else (-4096, 4095)
      if not lo <= number <= hi: raise AsmError(f"{mod!r} out of range ({lo}..{hi})")
      enc.set("offset", number & 0x1FFF)


def _encode_smem_address(enc: _Encoding, texts: list[str]):
  """`sbase, imm` | `sbase, soffset` ; the offset:N modifier is handled with the others."""
  enc.set("soffset", isa.SPECIAL_SREGS["null"])
  if not texts: return
  if len(texts) > 1: raise AsmError("too many operands")
  text = texts[0]
  reg = parse_reg(text)
  if reg is not None:
    _check_reg(reg, "s32", text)
    enc.set("soffset", reg.index)
    return
  number = parse_int(text)
  if number is None: raise AsmError(f"expected an offset or an SGPR, got {text!r}")
  if not -(1 << 20) <= number < (1 << 20): raise AsmError(f"offset {text} does not fit in 21 bits (signed)")
  enc.set("offset", number & ((1 << 21) - 1))


def _encode_operands(enc: _Encoding, inst: Inst, texts: list[str], mods: list[str],
                     labels: dict[str, int] | None, pc: int):
  operands = list(inst.operands)
  if operands and operands[0].optional:          # returning atomics: vdst only with glc
    if "glc" not in mods: operands = operands[1:]
  if inst.fmt in ("FLAT", "GLOBAL", "SCRATCH"):
    enc.set("saddr", isa.SPECIAL_SREGS["null"])
  extra: list[str] = []
  if inst.fmt == "SMEM" and inst.operands:
    texts, extra = texts[:2], texts[2:]
  if len(texts) != len(operands):
    raise AsmError(f"{inst.name} takes {len(operands)} operand{'s' if len(operands) != 1 else ''}, "
                   f"got {len(texts)}")
  srcs: list[Src] = []
  saddr_is_reg = None
  if inst.fmt in ("GLOBAL", "SCRATCH"):
    for op, text in zip(operands, texts):
      if op.kind == "saddr": saddr_is_reg = text.strip() != "off"
  for op, text in zip(operands, texts):
    kind, fld = op.kind, op.field
    if fld == "":
      if text != kind: raise AsmError(f"{inst.name}: expected {kind!r}, got {text!r}")
    elif fld == "simm16":
      _encode_imm16(enc, op, text, labels, pc)
    elif kind in ("k32", "k16"):
      value = parse_number(text)
      if value is None: raise AsmError(f"expected a constant, got {text!r}")
      if isinstance(value, float):
        value = _f16_bits(value) if kind == "k16" else _f32_bits(value)
      bits = 16 if kind == "k16" else 32
      if not -(1 << (bits - 1)) <= value < (1 << bits): raise AsmError(f"constant {text} does not fit")
      enc.set_literal(value & ((1 << bits) - 1))
    elif fld in _SRC_FIELDS:
      src = parse_src(text)
      if (src.neg or src.abs) and inst.fmt not in ("VOP3", "VOP3P"):
        raise AsmError(f"operand {text!r}: neg/abs need the VOP3 (_e64) encoding")
      _encode_source(enc, op, text, src)
      if fld.startswith("src"): srcs.append(src)
    elif kind == "saddr":
      if text.strip() == "off": enc.set("saddr", isa.SPECIAL_SREGS["null"])
      else: _encode_register(enc, Operand("saddr", "s64" if inst.fmt == "GLOBAL" else "s32"), text)
    elif kind == "vaddr":
      if inst.fmt == "SCRATCH":
        if text.strip() == "off": continue
        _encode_register(enc, Operand("addr", "v32"), text)
        enc.set("sve", 1)
      else:
        _encode_register(enc, Operand("addr", "v32" if saddr_is_reg else "v64"), text)
    else:
      _encode_register(enc, op, text)
  if inst.fmt in ("VOP1", "VOP2", "VOPC"):
    for op, text in zip(operands, texts):
      reg = parse_reg(text) if op.field else None
      if reg is not None and reg.file == "v" and reg.index + reg.count > 128 and _is_16bit_operand(inst, op):
        raise AsmError(f"operand {text!r}: 16-bit operands reach only v0..v127 in the 32-bit encoding")
  if inst.fmt == "SMEM" and inst.operands: _encode_smem_address(enc, extra)
  if inst.fmt in ("VOP3", "VOP3P"): _valu_modifiers(enc, inst, srcs, mods)
  elif mods: _encode_memory_mods(enc, inst, mods)


def _is_16bit_operand(inst: Inst, op: Operand) -> bool:
  """In VOP1/VOP2/VOPC forms a 16-bit operand's VGPR field holds 7 bits plus a half selector
  (true16), so without that syntax only v0..v127 are encodable there (checked with llvm-mc-19)."""
  if op.field == "vdst":
    m = re.search(r"_[fiub](\d+)", inst.name)
    return bool(m) and m[1] == "16" and "_pk_" not in inst.name
  kind = op.kind
  if op.field == "vsrc1":
    vop3 = [i for i in isa.BY_NAME[inst.name] if i.fmt == "VOP3"]
    kinds = {o.kind for o in (vop3[0] if vop3 else inst).operands if o.field in ("src0", "src1", "k")}
    return bool(kinds & {"f16", "i16", "bf16", "k16"})
  return kind in ("f16", "i16", "bf16")


def _candidates(mnemonic: str) -> list[Inst]:
  m = re.fullmatch(r"(.*)_e(32|64)", mnemonic)
  if m and m[1] in isa.BY_NAME:
    want_vop3 = m[2] == "64"
    found = [i for i in isa.BY_NAME[m[1]] if (i.fmt == "VOP3") == want_vop3]
    if found: return found
  if mnemonic not in isa.BY_NAME: raise AsmError(f"unknown mnemonic {mnemonic!r}")
  return isa.BY_NAME[mnemonic]


def _encode(line: str, labels: dict[str, int] | None = None, pc: int = 0) -> bytes:
  line = _strip_comment(line).strip()
  if not line: return b""
  mnemonic, _, rest = line.partition(" ")
  mnemonic = mnemonic.lower()
  candidates = _candidates(mnemonic)
  inst0 = candidates[0]
  if inst0.fmt == "SOPP" and inst0.operands and inst0.operands[0].kind in ("waitcnt", "delay"):
    texts, mods = ([rest.strip()] if rest.strip() else []), []
  else:
    texts, mods = split_modifiers(split_operands(rest))
  if inst0.fmt == "SOPP" and inst0.operands and inst0.operands[0].kind == "dec?" and not texts:
    texts = ["0"]
  errors = []
  for inst in candidates:
    try:
      enc = _Encoding(inst)
      _encode_operands(enc, inst, texts, mods, labels, pc)
      return enc.bytes()
    except AsmError as e:
      errors.append(e)
  raise errors[-1]


def _strip_comment(line: str) -> str:
  for mark in (";", "//"):
    if mark in line: line = line[:line.index(mark)]
  return line


def encode(line: str) -> bytes:
  """Encode one instruction (no labels)."""
  try:
    return _encode(line)
  except AsmError as e:
    raise AsmError(f"{line.strip()!r}: {e}") from None


_LABEL_RE = re.compile(r"^\s*([A-Za-z_.$][\w.$]*):(?!\S)")


def assemble(text: str) -> bytes:
  """Assemble a program: one instruction per line, comments, `label:` lines for branches."""
  lines = text.splitlines()
  # pass 1: sizes (branch targets do not change instruction sizes), label addresses
  labels: dict[str, int] = {}
  bodies: list[tuple[int, str, int]] = []
  pc = 0
  placeholders = {name: 0 for name in _label_names(lines)}
  for number, raw in enumerate(lines, 1):
    body = _strip_comment(raw)
    while (m := _LABEL_RE.match(body)):
      if m[1] in labels: raise AsmError(f"line {number}: label {m[1]!r} defined twice")
      labels[m[1]] = pc
      body = body[m.end():]
    if not body.strip(): continue
    try:
      size = len(_encode(body, placeholders, pc))
    except AsmError as e:
      raise AsmError(f"line {number}: {body.strip()!r}: {e}") from None
    bodies.append((number, body, pc))
    pc += size
  out = bytearray()
  for number, body, pc in bodies:
    try:
      out += _encode(body, labels, pc)
    except AsmError as e:
      raise AsmError(f"line {number}: {body.strip()!r}: {e}") from None
  return bytes(out)


def _label_names(lines: list[str]) -> list[str]:
  return [m[1] for raw in lines if (m := _LABEL_RE.match(_strip_comment(raw)))]
