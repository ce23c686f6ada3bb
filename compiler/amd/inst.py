"""RDNA3 (gfx1100) instructions as objects: what the AMD renderer builds, register allocation and waitcnt
insertion (regalloc.py) rewrite, and encode.py turns into machine code with the tables in drivers/amd/isa.py.

An `Inst` is a mnemonic from those tables, its operands in assembly order and its modifiers. Operands are typed:
`Reg` (a virtual register until allocation gives it `phys`; fixed ones such as VCC_LO are physical from the start),
`Sub` (one dword of a Reg, or a run of them), `Imm` (an integer or float constant: the encoder makes it an inline constant or a
literal, by the operand's type), `Neg`/`Abs` (VOP3 source modifiers), `Label` (a branch target; in a code list,
the position it names) and `Special` (src_scc, ..., and OFF, the missing scalar base of a global access).

`str()` gives llvm-mc-19 syntax: for DEBUG listings, disassembly-style reports and the tests that hand the same
instructions to llvm-mc as an independent encoder. The compile path never formats or parses text.
"""
from __future__ import annotations
from dataclasses import dataclass, field

from baregrad.drivers.amd import isa
from baregrad.drivers.amd.disasm import imm16_text, sreg_name, vreg_name


class Reg:
  """`size` consecutive dwords in register file 'v' or 's'. SGPR numbers are encoding numbers (vcc_lo is 106)."""
  __slots__ = ("file", "size", "id", "phys", "fixed")

  def __init__(self, file: str, size: int = 1, id: int = 0, phys: int | None = None):
    self.file, self.size, self.id, self.phys, self.fixed = file, size, id, phys, phys is not None

  def __getitem__(self, i: int | slice) -> Sub:
    """Dword i, or the dwords of a slice (`r[4:8]`: four consecutive dwords, e.g. a b128 load into part of a range)."""
    if isinstance(i, slice):
      lo, hi, step = i.indices(self.size)
      if step != 1 or hi <= lo: raise IndexError(f"dwords {lo}:{hi} of a {self.size}-dword register")
      return Sub(self, lo, hi - lo)
    if not 0 <= i < self.size: raise IndexError(f"dword {i} of a {self.size}-dword register")
    return Sub(self, i)

  def __str__(self):
    if self.phys is None: return repr(self)
    return vreg_name(self.phys, self.size) if self.file == "v" else sreg_name(self.phys, self.size)

  def __repr__(self): return f"%{self.file}{self.id}x{self.size}" + (f"={self.phys}" if self.phys is not None else "")


@dataclass(frozen=True)
class Sub:
  """Dword `index` of a register, or `size` dwords from there."""
  reg: Reg
  index: int
  size: int = 1

  @property
  def file(self) -> str: return self.reg.file

  @property
  def phys(self) -> int | None: return None if self.reg.phys is None else self.reg.phys + self.index

  def __getitem__(self, i: int) -> "Sub":
    if not 0 <= i < self.size: raise IndexError(f"dword {i} of a {self.size}-dword register range")
    return Sub(self.reg, self.index + i)

  def __str__(self):
    if self.reg.phys is None:
      return f"{self.reg}[{self.index}]" if self.size == 1 else f"{self.reg}[{self.index}:{self.index + self.size}]"
    return vreg_name(self.phys, self.size) if self.file == "v" else sreg_name(self.phys, self.size)


@dataclass(frozen=True)
class Imm:
  """A constant operand: the bits of a 32-bit operand (or a small 64-bit inline integer), or a float."""
  value: int | float

  def __str__(self):
    v = self.value
    if isinstance(v, float): return repr(v)
    return str(v) if -16 <= v <= 64 else hex(v & 0xFFFFFFFF) if v >= 0 else str(v)


@dataclass(frozen=True)
class Neg:
  """A VALU source with the VOP3 negate modifier (`-v1`)."""
  x: object

  def __str__(self): return f"-{self.x}"


@dataclass(frozen=True)
class Abs:
  """A VALU source with the VOP3 absolute-value modifier (`|v1|`)."""
  x: object

  def __str__(self): return f"|{self.x}|"


@dataclass(frozen=True)
class Label:
  """A branch target operand; in a code list, the position it names."""
  name: str

  def __str__(self): return self.name


@dataclass(frozen=True)
class Special:
  """A named operand that is no register: a special source (isa.SPECIAL_SRCS) or `off`."""
  name: str

  def __str__(self): return self.name


OFF = Special("off")
VCC_LO, EXEC_LO = Reg("s", 1, phys=isa.SPECIAL_SREGS["vcc_lo"]), Reg("s", 1, phys=isa.SPECIAL_SREGS["exec_lo"])


def base_reg(a) -> Reg | None:
  """The register an operand mentions, if any."""
  if isinstance(a, (Neg, Abs)): a = a.x
  if isinstance(a, Reg): return a
  if isinstance(a, Sub): return a.reg
  return None


def waitcnt(vmcnt: int | None = None, lgkmcnt: int | None = None, expcnt: int | None = None) -> Imm:
  """The s_waitcnt immediate that waits for the given counters (the others at their maximum: no wait)."""
  value = 0
  for name, (lo, width) in isa.WAITCNT_FIELDS.items():
    count = {"vmcnt": vmcnt, "lgkmcnt": lgkmcnt, "expcnt": expcnt}[name]
    value |= ((1 << width) - 1 if count is None else count) << lo
  return Imm(value)


# the modifiers an Inst may carry, as llvm-mc spells them: flags are True, omod an isa.OMOD code, op_sel and
# friends a tuple of bits, offsets integers
_OMOD_TEXT = {code: text for text, code in isa.OMOD.items()}
_IMM16_TEXT_KINDS = ("waitcnt", "delay", "depctr", "hwreg", "sendmsg")


def mods_text(mods: dict) -> list[str]:
  out = []
  for name, value in mods.items():
    if value is True: out.append(name)
    elif name == "omod": out.append(_OMOD_TEXT[value])
    elif isinstance(value, tuple): out.append(f"{name}:[{','.join(map(str, value))}]")
    else: out.append(f"{name}:{value}")
  return out


@dataclass(eq=False)
class Inst:
  """One instruction: a mnemonic of isa.BY_NAME (optionally with an _e32/_e64 suffix that pins the encoding; the
  encoder otherwise takes the first encoding that fits), its operands in assembly order, its modifiers."""
  name: str
  operands: tuple = ()
  mods: dict = field(default_factory=dict)

  def regs(self):
    for a in self.operands:
      if (r := base_reg(a)) is not None: yield r

  @property
  def target(self) -> Label | None:
    return next((a for a in self.operands if isinstance(a, Label)), None)

  @property
  def is_vector_load(self) -> bool:
    """A VMEM load: its first operand is written when the data arrives (tracked by VM_CNT)."""
    return self.name.startswith(("global_load", "flat_load", "scratch_load"))

  def __str__(self):
    texts = [str(a) for a in self.operands]
    entry = isa.BY_NAME.get(self.name)
    if entry and entry[0].fmt in ("SOPP", "SOPK"):     # 16-bit immediates with a syntax of their own
      for i, op in enumerate(entry[0].operands[:len(texts)]):
        a = self.operands[i]
        if op.kind in _IMM16_TEXT_KINDS and isinstance(a, Imm): texts[i] = imm16_text(op.kind, a.value & 0xFFFF)
    return " ".join([self.name + (" " + ", ".join(texts) if texts else "")] + mods_text(self.mods))


def listing(code: list) -> str:
  """Assembly text of a code list (instructions and labels), one per line."""
  return "\n".join(f"{x}:" if isinstance(x, Label) else f"  {x}" for x in code)
