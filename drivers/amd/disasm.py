"""RDNA3 (gfx1100) disassembler: machine code -> text in the syntax llvm-mc-19 prints.

`disassemble(data)` returns one line per instruction; `decode(data, offset)` returns
(text, size) for the instruction at `offset`. Both read the tables in isa.py.
"""
from __future__ import annotations

from . import isa
from .isa import FORMATS, Inst, Operand

_SREG_NAMES = {v: k for k, v in isa.SPECIAL_SREGS.items()}
_SREG_PAIR_NAMES = {v: k for k, v in isa.SPECIAL_SREG_PAIRS.items()}
_SRC_NAMES = {v: k for k, v in isa.SPECIAL_SRCS.items()}
_SRC_FIELDS = {"src0", "src1", "src2", "ssrc0", "ssrc1"}


class DisasmError(ValueError):
  pass


def sreg_name(index: int, count: int) -> str:
  if count == 1:
    if index < isa.SGPR_COUNT: return f"s{index}"
    if isa.TTMP_BASE <= index < isa.TTMP_BASE + 16: return f"ttmp{index - isa.TTMP_BASE}"
    if index in _SREG_NAMES: return _SREG_NAMES[index]
  else:
    if count == 2 and index in _SREG_PAIR_NAMES: return _SREG_PAIR_NAMES[index]
    if index + count <= isa.SGPR_COUNT: return f"s[{index}:{index + count - 1}]"
    if isa.TTMP_BASE <= index and index + count <= isa.TTMP_BASE + 16:
      return f"ttmp[{index - isa.TTMP_BASE}:{index - isa.TTMP_BASE + count - 1}]"
    if index in _SREG_NAMES: return _SREG_NAMES[index]
  return f"s{index}"


def vreg_name(index: int, count: int) -> str:
  return f"v{index}" if count == 1 else f"v[{index}:{index + count - 1}]"


def _bits(kind: str) -> int:
  return int(kind[1:]) if isa.is_sized_kind(kind) else isa.SRC_KIND_BITS.get(kind, 32)


def constant_text(code: int, kind: str, literal: int | None) -> str:
  """An inline constant or literal as llvm-mc prints it for this operand kind."""
  if 128 <= code <= 192: return str(code - 128)
  if 193 <= code <= 208: return str(192 - code)
  if code in isa.INLINE_FLOATS:
    value, b16, _, _ = isa.INLINE_FLOATS[code]
    if kind == "i16": return f"0x{b16:x}"
    if code == 248: return isa.INV_2PI_TEXT[64 if _bits(kind) == 64 else 32]
    return repr(value)
  if code == isa.LITERAL:
    if literal is None: raise DisasmError("literal operand without a literal dword")
    return f"0x{literal:x}"
  if code in _SRC_NAMES: return _SRC_NAMES[code]
  return str(code)


def source_text(value: int, kind: str, literal: int | None, src_field: bool) -> str:
  count = max(1, _bits(kind) // 32)
  if src_field and value >= isa.VGPR_BASE: return vreg_name(value - isa.VGPR_BASE, count)
  if value < 128: return sreg_name(value, count)
  return constant_text(value, kind, literal)


# ---- special 16-bit immediates ----

def waitcnt_text(value: int) -> str:
  parts, all_max = [], True
  for name in ("vmcnt", "expcnt", "lgkmcnt"):
    lo, width = isa.WAITCNT_FIELDS[name]
    count = (value >> lo) & ((1 << width) - 1)
    if count != (1 << width) - 1:
      all_max = False
      parts.append(f"{name}({count})")
  if all_max:
    parts = [f"{n}({(1 << isa.WAITCNT_FIELDS[n][1]) - 1})" for n in ("vmcnt", "expcnt", "lgkmcnt")]
  return " ".join(parts)


def delay_text(value: int) -> str:
  if value == 0: return "0"
  parts = []
  for name, shift, width, names in (("instid0", 0, 4, isa.DELAY_INSTID), ("instskip", 4, 3, isa.DELAY_INSTSKIP),
                                    ("instid1", 7, 4, isa.DELAY_INSTID)):
    field = (value >> shift) & ((1 << width) - 1)
    if field: parts.append(f"{name}({names[field] if field < len(names) else field})")
  return " | ".join(parts)


def depctr_text(value: int) -> str:
  """llvm-mc's form: the fields that wait (all of them when none does), or hex when unused bits are set."""
  fields = {n: (value >> lo) & ((1 << w) - 1) for n, (lo, w) in isa.DEPCTR_FIELDS.items()}
  used = sum(((1 << w) - 1) << lo for lo, w in isa.DEPCTR_FIELDS.values())
  if value & ~used & 0xFFFF: return f"0x{value:x}"
  waiting = [n for n, (lo, w) in isa.DEPCTR_FIELDS.items() if fields[n] != (1 << w) - 1] or list(fields)
  return " ".join(f"depctr_{n}({fields[n]})" for n in waiting)


def hwreg_text(value: int) -> str:
  reg, offset, size = value & 0x3F, (value >> 6) & 0x1F, ((value >> 11) & 0x1F) + 1
  name = isa.HWREG_NAMES.get(reg, str(reg))
  return f"hwreg({name})" if offset == 0 and size == 32 else f"hwreg({name}, {offset}, {size})"


def sendmsg_text(value: int) -> str:
  if value in isa.SENDMSG_NAMES: return f"sendmsg({isa.SENDMSG_NAMES[value]})"
  return f"sendmsg({value & 0xF}, {(value >> 4) & 7}, {(value >> 8) & 3})"


def imm16_text(kind: str, value: int) -> str | None:
  if kind == "hex": return f"0x{value:x}"
  if kind == "label": return str(value)
  if kind in ("dec", "dec?"):
    if kind == "dec?" and value == 0: return None
    return str(value) if value <= 64 else f"0x{value:x}"     # llvm prints inline-sized values in decimal
  if kind == "waitcnt": return waitcnt_text(value)
  if kind == "delay": return delay_text(value)
  if kind == "depctr": return depctr_text(value)
  if kind == "hwreg": return hwreg_text(value)
  if kind == "sendmsg": return sendmsg_text(value)
  raise DisasmError(f"unknown immediate kind {kind!r}")


def _signed(value: int, bits: int) -> int:
  return value - (1 << bits) if value >> (bits - 1) else value


def _hex_signed(value: int) -> str:
  return f"-0x{-value:x}" if value < 0 else f"0x{value:x}"


# ---- per-format printers ----

def _mnemonic(inst: Inst) -> str:
  if isa.has_e64_pair(inst.name): return inst.name + ("_e64" if inst.fmt == "VOP3" else "_e32")
  return inst.name


def _valu(inst: Inst, get, literal: int | None) -> str:
  vop3, packed = inst.fmt == "VOP3", inst.fmt == "VOP3P"
  mix = inst.name.startswith("v_fma_mix")
  texts, nsrc = [], 0
  for op in inst.operands:
    if op.field == "":
      texts.append(op.kind)
      continue
    if op.kind in ("k32", "k16"):
      texts.append(f"0x{literal:x}")
      continue
    value = get(op.field)
    if op.field.startswith("src"):
      text = source_text(value, op.kind, literal, True)
      i = int(op.field[3])
      nsrc += 1
      has_abs = (vop3 and "abs" in inst.modifiers and (get("abs") >> i) & 1) or (mix and (get("neg_hi") >> i) & 1)
      has_neg = (vop3 and "neg" in inst.modifiers or mix) and (get("neg") >> i) & 1
      if has_abs: text = f"|{text}|"
      if has_neg: text = "-" + text
      texts.append(text)
    else:
      count = max(1, _bits(op.kind) // 32)
      texts.append(sreg_name(value, count) if op.kind.startswith("s") else vreg_name(value, count))
  line = _mnemonic(inst) + (" " + ", ".join(texts) if texts else "")
  mods = inst.modifiers
  if vop3:
    if "op_sel" in mods and get("op_sel"):
      sel = get("op_sel")
      bits = [(sel >> i) & 1 for i in range(nsrc)] + [(sel >> 3) & 1]
      line += " op_sel:[" + ",".join(map(str, bits)) + "]"
    if "clamp" in mods and get("clamp"): line += " clamp"
    if "omod" in mods and get("omod"): line += " " + {v: k for k, v in isa.OMOD.items()}[get("omod")]
  elif packed:
    def array(value: int) -> str: return "[" + ",".join(str((value >> i) & 1) for i in range(nsrc)) + "]"
    if get("op_sel"): line += " op_sel:" + array(get("op_sel"))
    hi = get("op_sel_hi") | (get("op_sel_hi2") << 2)
    default = 0 if mix else (1 << nsrc) - 1
    if "op_sel_hi" in mods and hi & ((1 << nsrc) - 1) != default: line += " op_sel_hi:" + array(hi)
    if not mix and get("neg"): line += " neg_lo:" + array(get("neg"))
    if not mix and get("neg_hi"): line += " neg_hi:" + array(get("neg_hi"))
    if get("clamp"): line += " clamp"
  return line


def _scalar(inst: Inst, get, literal: int | None) -> str:
  texts = []
  for op in inst.operands:
    value = get(op.field)
    if op.field == "simm16":
      text = imm16_text(op.kind, value)
      if text is not None: texts.append(text)
    elif op.field in _SRC_FIELDS:
      texts.append(source_text(value, op.kind, literal, False))
    else:
      texts.append(sreg_name(value, _bits(op.kind) // 32))
  return inst.name + (" " + ", ".join(texts) if texts else "")


def _smem(inst: Inst, get) -> str:
  if not inst.operands: return inst.name
  sdata, sbase = inst.operands
  texts = [sreg_name(get("sdata"), _bits(sdata.kind) // 32), sreg_name(get("sbase") * 2, _bits(sbase.kind) // 32)]
  offset, soffset = _signed(get("offset"), 21), get("soffset")
  if soffset != isa.SPECIAL_SREGS["null"]:
    texts.append(sreg_name(soffset, 1) + (f" offset:{_hex_signed(offset)}" if offset else ""))
  else:
    texts.append(_hex_signed(offset) if offset else "null")
  line = inst.name + " " + ", ".join(texts)
  if get("glc"): line += " glc"
  if get("dlc"): line += " dlc"
  return line


def _ds(inst: Inst, get) -> str:
  texts = [vreg_name(get(op.field), _bits(op.kind) // 32) for op in inst.operands]
  line = inst.name + (" " + ", ".join(texts) if texts else "")
  if "offset0" in inst.modifiers:
    if get("offset0"): line += f" offset0:{get('offset0')}"
    if get("offset1"): line += f" offset1:{get('offset1')}"
  else:
    offset = get("offset0") | (get("offset1") << 8)
    if offset: line += f" offset:{offset}"
  if get("gds"): line += " gds"
  return line


def _flat(inst: Inst, get) -> str:
  null = isa.SPECIAL_SREGS["null"]
  texts = []
  for op in inst.operands:
    if op.optional and not get("glc"): continue
    if op.kind == "saddr":
      saddr = get("saddr")
      texts.append("off" if saddr == null else sreg_name(saddr, 2 if inst.fmt == "GLOBAL" else 1))
    elif op.kind == "vaddr":
      if inst.fmt == "SCRATCH": texts.append(vreg_name(get("addr"), 1) if get("sve") else "off")
      else: texts.append(vreg_name(get("addr"), 1 if get("saddr") != null else 2))
    else:
      texts.append(vreg_name(get(op.field), _bits(op.kind) // 32))
  line = inst.name + " " + ", ".join(texts)
  offset = get("offset") if inst.fmt == "FLAT" else _signed(get("offset"), 13)
  if offset: line += f" offset:{offset}"
  for flag in ("glc", "slc", "dlc"):
    if get(flag): line += " " + flag
  return line


def _uses_literal(inst: Inst, get) -> bool:
  for op in inst.operands:
    if op.kind in ("k32", "k16"): return True
    if op.field in _SRC_FIELDS and not isa.is_reg_kind(op.kind) and get(op.field) == isa.LITERAL: return True
  return False


def decode(data: bytes, offset: int = 0) -> tuple[str, int]:
  """(text, size in bytes) of the instruction at data[offset:]."""
  if len(data) - offset < 4: raise DisasmError(f"truncated instruction at byte {offset}")
  word = int.from_bytes(data[offset:offset + 8].ljust(8, b"\0"), "little")
  for fmt in isa.DECODE_ORDER:
    if not fmt.matches(word & 0xFFFFFFFF if fmt.size == 4 else word): continue
    if fmt.size == 8 and len(data) - offset < 8: raise DisasmError(f"truncated {fmt.name} instruction at byte {offset}")
    word &= (1 << (8 * fmt.size)) - 1
    inst = isa.BY_OPCODE.get((fmt.name, fmt.fields["op"].get(word)))
    if inst is None: break

    def get(name: str, _fmt=fmt, _word=word) -> int: return _fmt.fields[name].get(_word)

    size, literal = fmt.size, None
    if _uses_literal(inst, get):
      if len(data) - offset < size + 4: raise DisasmError(f"missing literal at byte {offset + size}")
      literal = int.from_bytes(data[offset + size:offset + size + 4], "little")
      size += 4
    if inst.fmt in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"): text = _valu(inst, get, literal)
    elif inst.fmt == "SMEM": text = _smem(inst, get)
    elif inst.fmt == "DS": text = _ds(inst, get)
    elif inst.fmt in ("FLAT", "GLOBAL", "SCRATCH"): text = _flat(inst, get)
    else: text = _scalar(inst, get, literal)
    return text, size
  raise DisasmError(f"unknown instruction 0x{word & 0xFFFFFFFF:08x} at byte {offset}")


def disassemble(data: bytes) -> list[str]:
  """Every instruction in `data`, one line of llvm-mc-19 syntax each."""
  lines, offset = [], 0
  while offset < len(data):
    text, size = decode(data, offset)
    lines.append(text)
    offset += size
  return lines
