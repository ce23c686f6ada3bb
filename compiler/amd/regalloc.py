"""Virtual registers, linear-scan register allocation and s_waitcnt insertion for the AMD renderer.

The instruction selector (compiler/render_amd.py) writes a list of `Inst`s whose operands are virtual
registers (`Reg`, or one dword of one: `Sub`), immediates (`Imm`) and fixed register names ("vcc_lo",
"exec_lo", "s[0:1]", ...). `allocate` then
  1. numbers the instructions and takes each virtual register's live interval as [first mention,
     last mention]; an interval that crosses a loop boundary (a backward branch and its target label)
     is stretched over the whole loop, so values carried around a loop stay put for every iteration;
  2. gives each interval the lowest free physical registers of its file (VGPRs; SGPRs with tuples
     aligned to min(size, 4) as `compiler/amd/asm.py` requires), a register being free again only
     after the instruction of its last mention (no overlap of a destination with the sources of the
     same instruction, which some gfx11 instructions forbid, e.g. v_mad_u64_u32);
  3. `finish` writes text and inserts `s_waitcnt vmcnt(0)` before the first instruction that touches a
     register a global load has not finished writing, and before every label and branch while a load
     is outstanding (RDNA3 ISA guide, "Data Dependency Resolution": VMEM loads return asynchronously
     and are tracked by VM_CNT; the shader must wait on the counter before it reads the result).
"""
from __future__ import annotations
from dataclasses import dataclass

MAX_VGPRS = 256     # RDNA3 wave32: v0..v255
MAX_SGPRS = 106     # s0..s105 (RDNA3 ISA guide, "SGPRs"); vcc is separate


class RegisterPressureError(RuntimeError):
  pass


class Reg:
  """A virtual register of `size` consecutive dwords in file 'v' or 's'."""
  __slots__ = ("file", "size", "id", "phys", "fixed")

  def __init__(self, file: str, size: int, id: int, phys: int | None = None):
    self.file, self.size, self.id, self.phys, self.fixed = file, size, id, phys, phys is not None

  def __getitem__(self, i: int) -> "Sub":
    if not 0 <= i < self.size: raise IndexError(f"dword {i} of a {self.size}-dword register")
    return Sub(self, i)

  def text(self) -> str:
    p = self.phys
    if self.size == 1: return f"{self.file}{p}"
    return f"{self.file}[{p}:{p + self.size - 1}]"

  def __repr__(self): return f"%{self.file}{self.id}x{self.size}" + (f"={self.phys}" if self.phys is not None else "")


@dataclass(frozen=True)
class Sub:
  """Dword `index` of a virtual register."""
  reg: Reg
  index: int

  def text(self) -> str: return f"{self.reg.file}{self.reg.phys + self.index}"


@dataclass(frozen=True)
class Imm:
  """An integer immediate (the bits of a 32-bit operand, or a small 64-bit inline constant)."""
  value: int

  def text(self) -> str:
    v = self.value
    return str(v) if -16 <= v <= 64 else hex(v & 0xFFFFFFFF) if v >= 0 else str(v)


def is_inline(value: int) -> bool:
  """Integer inline constants -16..64 (RDNA3 ISA guide, "Scalar ALU operands": codes 128-208)."""
  return -16 <= value <= 64


# float bit patterns with inline codes 240-248 (0.5, -0.5, 1, -1, 2, -2, 4, -4, 1/(2*pi)), as f32 bits
INLINE_F32_BITS = {0x3F000000, 0xBF000000, 0x3F800000, 0xBF800000, 0x40000000, 0xC0000000, 0x40800000, 0xC0800000,
                   0x3E22F983}


@dataclass(frozen=True)
class Neg:
  """A VALU source with the VOP3 negate modifier (`-v1`)."""
  x: object

  def text(self) -> str: return "-" + self.x.text()


@dataclass(frozen=True)
class Abs:
  """A VALU source with the VOP3 absolute-value modifier (`|v1|`)."""
  x: object

  def text(self) -> str: return "|" + self.x.text() + "|"


def base_reg(a):
  """The virtual register an operand mentions, if any."""
  if isinstance(a, (Neg, Abs)): a = a.x
  if isinstance(a, Reg): return a
  if isinstance(a, Sub): return a.reg
  return None


@dataclass
class Inst:
  op: str                 # mnemonic, "label" for a label line
  args: tuple = ()        # destinations then sources (Reg, Sub, Imm or str)
  mods: str = ""          # trailing modifiers ("offset:4", "glc", ...)
  load: bool = False      # a VMEM load: its first operand is written asynchronously
  target: str = ""        # branch target label

  def regs(self):
    for a in self.args:
      if (r := base_reg(a)) is not None: yield r


def _loops(code: list[Inst]) -> list[tuple[int, int]]:
  labels = {inst.args[0]: i for i, inst in enumerate(code) if inst.op == "label"}
  out = []
  for i, inst in enumerate(code):
    if inst.target and labels.get(inst.target, i + 1) <= i: out.append((labels[inst.target], i))
  return out


def live_intervals(code: list[Inst]) -> dict[Reg, list[int]]:
  iv: dict[Reg, list[int]] = {}
  for i, inst in enumerate(code):
    for r in inst.regs():
      if r.fixed: continue
      if r not in iv: iv[r] = [i, i]
      else: iv[r][1] = i
  loops = _loops(code)
  changed = True
  while changed:
    changed = False
    for lo, hi in loops:
      for r, (a, b) in iv.items():
        if (a < lo <= b < hi) or (lo < a <= hi < b):   # crosses one boundary of the loop
          iv[r] = [min(a, lo), max(b, hi)]
          changed = True
  return iv


def allocate(code: list[Inst], reserved_v: int, reserved_s: int) -> tuple[int, int]:
  """Give every virtual register physical ones; returns (VGPRs used, SGPRs used)."""
  iv = live_intervals(code)
  order = sorted(iv, key=lambda r: (iv[r][0], r.id))
  busy = {"v": [None] * MAX_VGPRS, "s": [None] * MAX_SGPRS}   # phys -> end index of its interval
  for i in range(reserved_v): busy["v"][i] = float("inf")
  for i in range(reserved_s): busy["s"][i] = float("inf")
  used = {"v": reserved_v, "s": reserved_s}
  for r in order:
    start, end = iv[r]
    regs = busy[r.file]
    align = min(r.size, 4) if r.file == "s" else 1
    for p in range(0, len(regs) - r.size + 1, align):
      if all(regs[q] is None or regs[q] < start for q in range(p, p + r.size)): break
    else:
      live = sum(1 for q in regs if q is not None and q >= start)
      limit = MAX_VGPRS if r.file == "v" else MAX_SGPRS
      raise RegisterPressureError(
        f"AMD renderer: out of {'VGPRs' if r.file == 'v' else 'SGPRs'} ({live} of {limit} live at instruction "
        f"{start}: {code[start].op}); the kernel keeps too many values live at once: split it (fewer fused ops) "
        f"or reduce the upcast/unroll")
    for q in range(p, p + r.size): regs[q] = end
    r.phys = p
    used[r.file] = max(used[r.file], p + r.size)
  return used["v"], used["s"]


def _fmt(a) -> str:
  if isinstance(a, str): return a
  return a.text()


def _phys(inst: Inst) -> set:
  out = set()
  for a in inst.args:
    if isinstance(a, (Neg, Abs)): a = a.x
    if isinstance(a, Reg): out.update((a.file, a.phys + k) for k in range(a.size))
    elif isinstance(a, Sub): out.add((a.reg.file, a.reg.phys + a.index))
  return out


def finish(code: list[Inst]) -> list[str]:
  """Assembly lines, with s_waitcnt vmcnt(0) inserted where a pending load's result is touched."""
  lines: list[str] = []
  pending: set = set()
  for inst in code:
    if pending and (inst.op == "label" or inst.target or inst.op == "s_endpgm" or _phys(inst) & pending):
      lines.append("  s_waitcnt vmcnt(0)")
      pending.clear()
    if inst.op == "label":
      lines.append(f"{inst.args[0]}:")
      continue
    text = "  " + inst.op
    if inst.args: text += " " + ", ".join(_fmt(a) for a in inst.args)
    if inst.target: text += (", " if inst.args else " ") + inst.target
    if inst.mods: text += " " + inst.mods
    lines.append(text)
    if inst.load:
      a = inst.args[0]
      pending |= {(a.file, a.phys + k) for k in range(a.size)} if isinstance(a, Reg) else {(a.reg.file, a.reg.phys + a.index)}
  return lines
