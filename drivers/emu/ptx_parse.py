"""PTX text -> PtxModule: entries with their parameters, register and variable declarations, labels and
instructions (still as parsed operands; `ptx_exec` turns them into numpy closures).

Syntax per NVIDIA's "PTX ISA" reference (chapters "Syntax", "State Spaces, Types, and Variables",
"Instruction Operands"): statements end with `;`, labels with `:`; `.reg .b32 %r<12>;` declares %r0..%r11;
`@%p` / `@!%p` guard an instruction; integer literals are decimal, 0x hex, 0b binary or 0-prefixed octal;
`0fXXXXXXXX` / `0dXXXXXXXXXXXXXXXX` give float bits; memory operands are `[reg]`, `[reg+imm]`, `[var]`,
`[var+imm]` or `[imm]`; `{a, b}` is a vector operand; `p|q` two predicate destinations of setp.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


class PtxError(Exception):
  """Malformed PTX (the text, not an unsupported feature)."""


class PtxTrap(RuntimeError):
  """A thread executed `trap`: on the GPU an illegal-instruction exception that ends the launch."""


class PtxWarpError(RuntimeError):
  """A warp-synchronous instruction (`.sync.aligned`, e.g. mma) executed by only part of a warp: undefined on the GPU."""


class PtxUnsupported(Exception):
  """An instruction, type or directive the interpreter does not implement."""

  def __init__(self, name: str, line: int | None = None, detail: str = ""):
    self.name, self.line = name, line
    where = f" (line {line})" if line is not None else ""
    super().__init__(f"PTX interpreter: unsupported {name!r}{where}" + (f": {detail}" if detail else ""))


TYPES = {"pred", "b8", "b16", "b32", "b64", "b128", "u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64",
         "f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "tf32"}
TYPE_SIZE = {"pred": 1, "b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
             "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4, "tf32": 4,
             "b64": 8, "u64": 8, "s64": 8, "f64": 8, "b128": 16}
# special registers (all .u32 unless listed in SREG_64); the vector ones have .x/.y/.z components
SREGS = {"tid", "ntid", "ctaid", "nctaid", "laneid", "warpid", "nwarpid", "smid", "nsmid", "gridid",
         "clock", "clock64", "globaltimer", "lanemask_eq", "lanemask_lt", "lanemask_le", "lanemask_gt",
         "lanemask_ge", "warpsize"}
SREG_64 = {"clock64", "globaltimer", "gridid"}


# ---- operands ----
@dataclass(frozen=True)
class Reg:
  name: str
  neg: bool = False       # `!%p` (a negated predicate source)


@dataclass(frozen=True)
class SReg:
  name: str               # "tid", "ctaid", ...
  comp: str | None        # "x" / "y" / "z" or None


@dataclass(frozen=True)
class Imm:
  value: int | float      # an int literal, or a Python float for decimal float literals
  fbits: str | None = None  # "f32" / "f64" when written as 0f / 0d bits (then value holds the bits)


@dataclass(frozen=True)
class Sym:
  name: str               # a variable (address of), a parameter or a label


@dataclass(frozen=True)
class Mem:
  base: Reg | Sym | None
  offset: int


@dataclass(frozen=True)
class Vec:
  items: tuple


@dataclass(frozen=True)
class PredPair:
  p: Reg
  q: Reg


@dataclass
class Instr:
  op: str                 # base name: "add", "ld", ...
  mods: tuple             # the dot-separated parts after the base name, in order (types included)
  types: tuple            # the parts of mods that are type names, in order
  operands: tuple
  guard: Reg | None       # @%p (neg=True for @!%p)
  line: int
  text: str

  def has(self, *mods) -> bool: return any(m in self.mods for m in mods)


@dataclass
class Param:
  name: str
  type: str
  size: int
  align: int
  offset: int = 0


@dataclass
class Var:
  name: str
  space: str              # "local" / "shared"
  size: int
  align: int
  offset: int = 0


@dataclass
class Entry:
  name: str
  params: list[Param]
  regs: dict = field(default_factory=dict)         # register name -> declared type
  variables: dict = field(default_factory=dict)    # name -> Var (.local / .shared)
  instrs: list[Instr] = field(default_factory=list)
  labels: dict = field(default_factory=dict)       # label -> index of the next instruction
  directives: dict = field(default_factory=dict)   # .maxntid / .reqntid / ... -> tuple of ints
  line: int = 0

  @property
  def param_size(self) -> int:
    return max((p.offset + p.size for p in self.params), default=0)

  def space_size(self, space: str) -> int:
    return max((v.offset + v.size for v in self.variables.values() if v.space == space), default=0)


@dataclass
class PtxModule:
  version: str | None
  target: str | None
  address_size: int
  entries: dict            # name -> Entry
  source: str = ""

  def entry(self, name: str) -> Entry:
    if name not in self.entries:
      raise KeyError(f"PTX module has no entry {name!r} (entries: {', '.join(self.entries) or 'none'})")
    return self.entries[name]


# ---- text helpers ----
def _strip_comments(src: str) -> str:
  """Comments become spaces (newlines kept), so positions still give line numbers."""
  def blank(m): return re.sub(r"[^\n]", " ", m.group(0))
  return re.sub(r"//[^\n]*|/\*.*?\*/", blank, src, flags=re.S)


def _line_of(text: str, pos: int, first_line: int = 1) -> int:
  return first_line + text.count("\n", 0, pos)


def _split_top(s: str, sep: str = ",") -> list[str]:
  """Split on `sep` outside [] and {}."""
  out, depth, cur = [], 0, []
  for ch in s:
    if ch in "[{(": depth += 1
    elif ch in "]})": depth -= 1
    if ch == sep and depth == 0:
      out.append("".join(cur)); cur = []
    else:
      cur.append(ch)
  if "".join(cur).strip() or out: out.append("".join(cur))
  return [x.strip() for x in out]


_INT = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]+|[1-9][0-9]*|0)[uU]?$")
_FBITS = re.compile(r"^0([fFdD])([0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^[+-]?([0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)$")
_IDENT = re.compile(r"^[A-Za-z_$%][A-Za-z0-9_$]*$")


def parse_int(text: str) -> int | None:
  t = text.strip()
  if not _INT.match(t): return None
  neg = t.startswith("-")
  t = t.lstrip("+-").rstrip("uU")
  if t[:2] in ("0x", "0X"): v = int(t[2:], 16)
  elif t[:2] in ("0b", "0B"): v = int(t[2:], 2)
  elif len(t) > 1 and t[0] == "0": v = int(t[1:], 8)
  else: v = int(t)
  return -v if neg else v


def _parse_expr_int(text: str, line: int) -> int:
  """A constant expression of the simple kind PTX code uses in offsets: ints joined by + and -."""
  t = text.replace(" ", "")
  total, pos = 0, 0
  for m in re.finditer(r"([+-]*)([^+-]+)", t):
    signs, num = m.group(1), m.group(2)
    v = parse_int(num)
    if v is None: raise PtxError(f"line {line}: cannot read {text!r} as an integer")
    total += -v if signs.count("-") % 2 else v
    pos = m.end()
  if pos != len(t): raise PtxError(f"line {line}: cannot read {text!r} as an integer")
  return total


def parse_operand(text: str, line: int):
  t = text.strip()
  if not t: raise PtxError(f"line {line}: empty operand")
  if t.startswith("[") and t.endswith("]"):
    inner = t[1:-1].strip()
    m = re.match(r"^([A-Za-z_$%][A-Za-z0-9_$.]*)\s*(?:([+-].*))?$", inner)
    if m and parse_int(m.group(1)) is None:
      base = parse_operand(m.group(1), line)
      if isinstance(base, SReg): raise PtxError(f"line {line}: special register as an address: {t}")
      off = _parse_expr_int(m.group(2), line) if m.group(2) else 0
      return Mem(base, off)
    return Mem(None, _parse_expr_int(inner, line))
  if t.startswith("{") and t.endswith("}"):
    return Vec(tuple(parse_operand(x, line) for x in _split_top(t[1:-1])))
  if "|" in t:
    p, q = (parse_operand(x, line) for x in t.split("|"))
    return PredPair(p, q)
  if t.startswith("!"):
    r = parse_operand(t[1:], line)
    if not isinstance(r, Reg): raise PtxError(f"line {line}: `!` applies to a predicate register: {t}")
    return Reg(r.name, True)
  if t.startswith("%"):
    name, _, comp = t[1:].partition(".")
    if name in SREGS:
      return SReg(name, comp or None)
    if comp: raise PtxError(f"line {line}: bad register {t!r}")
    return Reg(t)
  if (m := _FBITS.match(t)):
    return Imm(int(m.group(2), 16), "f32" if m.group(1) in "fF" else "f64")
  if (v := parse_int(t)) is not None: return Imm(v)
  if _FLOAT.match(t): return Imm(float(t))
  if _IDENT.match(t): return Sym(t)
  raise PtxError(f"line {line}: cannot parse operand {t!r}")


def parse_instruction(text: str, line: int) -> Instr:
  t = text.strip()
  guard = None
  if t.startswith("@"):
    m = re.match(r"^@(!?)(%?[A-Za-z_$][A-Za-z0-9_$]*)\s+", t)
    if not m: raise PtxError(f"line {line}: bad guard in {t!r}")
    guard = Reg(m.group(2), m.group(1) == "!")
    t = t[m.end():]
  m = re.match(r"^([A-Za-z_][A-Za-z0-9_.:]*)\s*(.*)$", t, re.S)
  if not m: raise PtxError(f"line {line}: cannot parse {text.strip()!r}")
  parts = m.group(1).split(".")
  op, mods = parts[0], tuple(p for p in parts[1:] if p)
  types = tuple(p for p in mods if p in TYPES)
  rest = m.group(2).strip()
  operands = tuple(parse_operand(x, line) for x in _split_top(rest)) if rest else ()
  return Instr(op, mods, types, operands, guard, line, " ".join(text.split()))


# ---- declarations ----
def _decl_tokens(text: str) -> list[str]:
  return re.findall(r"\.[A-Za-z_][A-Za-z0-9_:]*|[^\s,]+(?:\s*<\s*\d+\s*>)?(?:\s*\[\s*\d*\s*\])*", text)


def _parse_reg_decl(text: str, line: int, regs: dict):
  """`.reg .b32 %r<12>;` or `.reg .f32 %f1, %f2;` (optionally .v2/.v4 is not supported)."""
  body = text.strip()[len(".reg"):].strip()
  m = re.match(r"^((?:\.[A-Za-z0-9_]+\s*)+)(.*)$", body, re.S)
  if not m: raise PtxError(f"line {line}: bad register declaration {text.strip()!r}")
  quals = m.group(1).split()
  types = [q[1:] for q in quals if q[1:] in TYPES]
  if len(types) != 1 or any(q[1:] in ("v2", "v4") for q in quals):
    raise PtxUnsupported(text.strip(), line, "register declarations take one scalar type")
  typ = types[0]
  for name in _split_top(m.group(2)):
    if (mm := re.match(r"^(%?[A-Za-z_$][A-Za-z0-9_$]*)\s*<\s*(\d+)\s*>$", name)):
      for i in range(int(mm.group(2))): regs[f"{mm.group(1)}{i}"] = typ
    elif re.match(r"^%?[A-Za-z_$][A-Za-z0-9_$]*$", name):
      regs[name] = typ
    else:
      raise PtxError(f"line {line}: bad register name {name!r}")


def _parse_var_decl(text: str, line: int, space: str) -> Var:
  """`.local .align 8 .b8 name[32];`, `.shared .f32 tile[64];`, `.local .u32 x;` (no initializers)."""
  body = text.strip()[len(space) + 1:].strip()
  if "=" in body: raise PtxUnsupported(f".{space} with an initializer", line)
  align, typ = None, None
  toks = body.split()
  i = 0
  while i < len(toks) and toks[i].startswith("."):
    q = toks[i][1:]
    if q == "align":
      align = int(toks[i + 1]); i += 2; continue
    if q in TYPES: typ = q
    elif q in ("v2", "v4"): raise PtxUnsupported(f".{space} vector variable", line)
    i += 1
  rest = " ".join(toks[i:])
  m = re.match(r"^([A-Za-z_$][A-Za-z0-9_$]*)\s*((?:\[\s*\d*\s*\]\s*)*)$", rest)
  if not m or typ is None: raise PtxError(f"line {line}: bad .{space} declaration {text.strip()!r}")
  count = 1
  for d in re.findall(r"\[\s*(\d*)\s*\]", m.group(2)):
    if not d: raise PtxUnsupported(f".{space} array without a size", line)
    count *= int(d)
  size = TYPE_SIZE[typ]
  return Var(m.group(1), space, size * count, align or size)


def _parse_params(text: str, line: int) -> list[Param]:
  params, offset = [], 0
  for item in _split_top(text):
    if not item: continue
    toks = item.split()
    if not toks or toks[0] != ".param": raise PtxError(f"line {line}: bad parameter {item!r}")
    typ, align, name, count = None, None, None, 1
    i = 1
    while i < len(toks):
      tk = toks[i]
      if tk == ".align": align = int(toks[i + 1]); i += 2; continue
      if tk.startswith(".") and tk[1:] in TYPES: typ = tk[1:]
      elif tk.startswith("."): pass            # .ptr, .global, .const ... (attributes)
      else:
        m = re.match(r"^([A-Za-z_$][A-Za-z0-9_$]*)((?:\[\d+\])*)$", tk)
        if not m: raise PtxError(f"line {line}: bad parameter name {tk!r}")
        name = m.group(1)
        for d in re.findall(r"\[(\d+)\]", m.group(2)): count *= int(d)
      i += 1
    if typ is None or name is None: raise PtxError(f"line {line}: bad parameter {item!r}")
    size = TYPE_SIZE[typ] * count
    align = align or TYPE_SIZE[typ]
    offset = -(-offset // align) * align
    params.append(Param(name, typ, size, align, offset))
    offset += size
  return params


def _layout(variables: dict):
  offsets = {"local": 0, "shared": 0}
  for v in variables.values():
    o = -(-offsets[v.space] // v.align) * v.align
    v.offset, offsets[v.space] = o, o + v.size


def _parse_body(body: str, first_line: int, entry: Entry, module_vars: dict):
  entry.variables.update({k: Var(v.name, v.space, v.size, v.align) for k, v in module_vars.items()})
  pos, n = 0, len(body)
  while pos < n:
    while pos < n and body[pos] in " \t\r\n{}": pos += 1     # whitespace and scope braces
    if pos >= n: break
    m = re.match(r"([A-Za-z_$][A-Za-z0-9_$]*)\s*:(?!:)", body[pos:])
    if m:
      entry.labels[m.group(1)] = len(entry.instrs)
      pos += m.end(); continue
    end = body.find(";", pos)
    if end < 0:
      raise PtxError(f"line {_line_of(body, pos, first_line)}: statement without `;`: {body[pos:pos + 60].strip()!r}")
    stmt, line = body[pos:end], _line_of(body, pos, first_line)
    pos = end + 1
    s = stmt.strip()
    if s.startswith(".reg"): _parse_reg_decl(s, line, entry.regs)
    elif s.startswith(".local"):
      v = _parse_var_decl(s, line, "local"); entry.variables[v.name] = v
    elif s.startswith(".shared"):
      v = _parse_var_decl(s, line, "shared"); entry.variables[v.name] = v
    elif s.startswith(".pragma") or s.startswith(".loc") or s.startswith(".file"): pass
    elif s.startswith("."): raise PtxUnsupported(s.split()[0], line, "directive inside an entry")
    else: entry.instrs.append(parse_instruction(s, line))
  _layout(entry.variables)


def _matching(text: str, pos: int, open_ch: str, close_ch: str) -> int:
  depth = 0
  for i in range(pos, len(text)):
    if text[i] == open_ch: depth += 1
    elif text[i] == close_ch:
      depth -= 1
      if depth == 0: return i
  raise PtxError(f"line {_line_of(text, pos)}: unbalanced {open_ch!r}")


def parse_ptx(src: str) -> PtxModule:
  """Parse a PTX module (text) into entries; `.func` bodies are skipped (call is not supported)."""
  text = _strip_comments(src)
  version = target = None
  address_size = 64
  entries: dict[str, Entry] = {}
  module_vars: dict[str, Var] = {}
  pos = 0
  head = re.compile(r"\s*(\.[A-Za-z_]+)")
  while pos < len(text):
    m = head.match(text, pos)
    if not m:
      rest = text[pos:].strip()
      if not rest: break
      raise PtxError(f"line {_line_of(text, pos + len(text[pos:]) - len(text[pos:].lstrip()))}: unexpected {rest[:40]!r}")
    d, start = m.group(1), m.start(1)
    line = _line_of(text, start)
    if d in (".version", ".target", ".address_size"):
      eol = text.find("\n", m.end())
      eol = len(text) if eol < 0 else eol
      value = text[m.end():eol].strip()
      if d == ".version": version = value
      elif d == ".target": target = value
      else: address_size = int(value)
      if d == ".address_size" and address_size != 64: raise PtxUnsupported(".address_size 32", line)
      pos = eol; continue
    if d in (".visible", ".weak", ".extern"):
      pos = m.end(); continue
    if d in (".entry", ".func"):
      mm = re.compile(r"\s*(\([^)]*\))?\s*([A-Za-z_$][A-Za-z0-9_$]*)\s*").match(text, m.end())
      name = mm.group(2)
      p = mm.end()
      params_text = ""
      if p < len(text) and text[p] == "(":
        close = _matching(text, p, "(", ")")
        params_text, p = text[p + 1:close], close + 1
      brace = text.find("{", p)
      semi = text.find(";", p)
      if semi >= 0 and (brace < 0 or semi < brace):   # a declaration without a body
        pos = semi + 1; continue
      if brace < 0: raise PtxError(f"line {line}: {d} {name} without a body")
      directives = {}
      for dm in re.finditer(r"\.(maxntid|reqntid|minnctapersm|maxnreg|maxnctapersm|noreturn|pragma)\s*([^.{]*)",
                            text[p:brace]):
        directives[dm.group(1)] = tuple(int(x) for x in re.findall(r"\d+", dm.group(2)))
      close = _matching(text, brace, "{", "}")
      if d == ".entry":
        e = Entry(name, _parse_params(params_text, line), directives=directives, line=line)
        _parse_body(text[brace + 1:close], _line_of(text, brace + 1), e, module_vars)
        entries[name] = e
      pos = close + 1; continue
    if d == ".shared":
      semi = text.find(";", start)
      v = _parse_var_decl(text[start:semi], line, "shared")
      module_vars[v.name] = v
      pos = semi + 1; continue
    raise PtxUnsupported(d, line, "module-level directive")
  return PtxModule(version, target, address_size, entries, src)
