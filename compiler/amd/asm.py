"""RDNA3 (gfx1100) text assembler: hand-written lines -> instruction objects (inst.py) -> encode.py.

For tests and tools that assemble text; the compiler hands its instruction objects to encode.py directly.
`assemble(text)` takes one instruction per line (`;` and `//` comments, `name:` labels for branches);
`encode(line)` encodes a single instruction; `parse(line)` gives its `Inst`. Errors raise AsmError naming the line.
"""
from __future__ import annotations
import re

from baregrad.drivers.amd import isa
from . import encode as _encoder
from .encode import AsmError, encodings
from .inst import Inst, Reg, Imm, Neg, Abs, Label, Special, OFF

__all__ = ["AsmError", "assemble", "encode", "parse"]

_REG_RE = re.compile(r"(v|s|ttmp)(?:(\d+)|\[(\d+)(?::(\d+))?\])$")


def parse_reg(text: str) -> Reg | None:
  text = text.strip()
  if text in isa.SPECIAL_SREGS: return Reg("s", 1, phys=isa.SPECIAL_SREGS[text])
  if text in isa.SPECIAL_SREG_PAIRS: return Reg("s", 2, phys=isa.SPECIAL_SREG_PAIRS[text])
  m = _REG_RE.match(text)
  if not m: return None
  kind = m[1]
  first = int(m[2] if m[2] is not None else m[3])
  last = int(m[4]) if m[4] is not None else first
  if last < first: raise AsmError(f"register range {text!r} is reversed")
  count = last - first + 1
  if kind == "v":
    if last > 255: raise AsmError(f"VGPR {text!r} out of range (v0..v255)")
    return Reg("v", count, phys=first)
  if kind == "ttmp":
    if last > 15: raise AsmError(f"trap register {text!r} out of range (ttmp0..ttmp15)")
    first += isa.TTMP_BASE
  elif last >= isa.SGPR_COUNT:
    raise AsmError(f"SGPR {text!r} out of range (s0..s{isa.SGPR_COUNT - 1})")
  return Reg("s", count, phys=first)


def parse_int(text: str) -> int | None:
  try:
    return int(text.strip(), 0)
  except ValueError:
    return None


def parse_number(text: str) -> int | float | None:
  value = parse_int(text)
  if value is not None: return value
  if re.fullmatch(r"-?(\d+\.\d*|\.\d+|\d+)(e[-+]?\d+)?", text.strip(), re.I):
    return float(text)
  return None


def parse_src(text: str):
  """A register, special source or number, with -x / neg(x) and |x| / abs(x) modifiers."""
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
  x = parse_reg(text)
  if x is None and text in isa.SPECIAL_SRCS: x = Special(text)
  if x is None:
    value = parse_number(text)
    if value is None: raise AsmError(f"cannot parse operand {text!r}")
    x = Imm(value)
  if absolute: x = Abs(x)
  return Neg(x) if neg else x


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


def _parse_depctr(text: str) -> int:
  value = parse_int(text)
  if value is not None: return value
  result = sum(((1 << w) - 1) << lo for lo, w in isa.DEPCTR_FIELDS.values())     # fields not named: no wait
  for m in re.finditer(r"(\S+)", text):
    f = re.fullmatch(r"depctr_(\w+)\((\d+)\)", m[1])
    if not f or f[1] not in isa.DEPCTR_FIELDS: raise AsmError(f"bad s_waitcnt_depctr field {m[1]!r}")
    lo, w = isa.DEPCTR_FIELDS[f[1]]
    result = result & ~(((1 << w) - 1) << lo) | (int(f[2]) & ((1 << w) - 1)) << lo
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


_IMM16_PARSERS = {"waitcnt": _parse_waitcnt, "delay": _parse_delay, "depctr": _parse_depctr, "hwreg": _parse_hwreg, "sendmsg": _parse_sendmsg}
_LABEL_NAME_RE = re.compile(r"[A-Za-z_.$][\w.$]*")


def parse_operand(text: str, kind: str | None):
  """One operand; `kind` is the table's operand kind where the text depends on it (16-bit immediates)."""
  text = text.strip()
  if kind in _IMM16_PARSERS: return Imm(_IMM16_PARSERS[kind](text))
  if kind in ("label", "hex", "dec", "dec?"):
    value = parse_int(text)
    if value is not None: return Imm(value)
    if kind == "label" and _LABEL_NAME_RE.fullmatch(text): return Label(text)
    raise AsmError(f"expected an integer, got {text!r}")
  if text == "off": return OFF
  return parse_src(text)


# ---- modifiers ----

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


def parse_mods(words: list[str]) -> dict:
  """Modifier words -> Inst.mods: flags True, omod its code, bit lists tuples, offsets integers."""
  mods: dict = {}
  for word in words:
    if word in isa.OMOD: mods["omod"] = isa.OMOD[word]; continue
    name, _, value = word.partition(":")
    if not value: mods[name] = True
    elif value.startswith("["): mods[name] = tuple(int(b) for b in value[1:-1].split(",") if b.strip())
    elif (number := parse_int(value)) is not None: mods[name] = number
    else: raise AsmError(f"{word!r}: expected an integer")
  return mods


# ---- lines and programs ----

def _strip_comment(line: str) -> str:
  for mark in (";", "//"):
    if mark in line: line = line[:line.index(mark)]
  return line


def parse(line: str) -> Inst | None:
  """The instruction on one line (None for an empty or comment line)."""
  line = _strip_comment(line).strip()
  if not line: return None
  mnemonic, _, rest = line.partition(" ")
  mnemonic = mnemonic.lower()
  entry = encodings(mnemonic)[0]
  if entry.fmt == "SOPP" and entry.operands and entry.operands[0].kind in ("waitcnt", "delay", "depctr"):
    texts, mods = ([rest.strip()] if rest.strip() else []), []
  else:
    texts, mods = split_modifiers(split_operands(rest))
  kinds = [op.kind if entry.fmt in ("SOPP", "SOPK") and op.field == "simm16" else None for op in entry.operands]
  kinds += [None] * (len(texts) - len(kinds))
  return Inst(mnemonic, tuple(parse_operand(t, k) for t, k in zip(texts, kinds)), parse_mods(mods))


def encode(line: str) -> bytes:
  """Encode one instruction (no labels)."""
  try:
    inst = parse(line)
    return _encoder.encode(inst) if inst is not None else b""
  except AsmError as e:
    raise AsmError(f"{line.strip()!r}: {e}") from None


_LABEL_RE = re.compile(r"^\s*([A-Za-z_.$][\w.$]*):(?!\S)")


def assemble(text: str) -> bytes:
  """Assemble a program: one instruction per line, comments, `label:` lines for branches."""
  code, where = [], []
  for number, raw in enumerate(text.splitlines(), 1):
    body = _strip_comment(raw)
    while (m := _LABEL_RE.match(body)):
      code.append(Label(m[1])); where.append(f"line {number}")
      body = body[m.end():]
    try: inst = parse(body)
    except AsmError as e: raise AsmError(f"line {number}: {body.strip()!r}: {e}") from None
    if inst is not None:
      code.append(inst); where.append(f"line {number}: {body.strip()!r}")
  return _encoder.assemble(code, where)
