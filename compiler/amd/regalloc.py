"""Operand legalization, linear-scan register allocation and s_waitcnt insertion for the AMD renderer.

The instruction selector (compiler/render_amd.py) writes a list of `Inst`s and `Label`s (compiler/amd/inst.py)
whose operands are virtual registers (`Reg`, or one dword of one: `Sub`), constants and fixed registers
(VCC_LO, EXEC_LO, the kernarg pointer ...). `legalize` moves the scalar operands a VALU instruction cannot read
(the constant bus limit) into new virtual VGPRs; `allocate` then
  1. numbers the instructions and takes each virtual register's live interval as [first mention,
     last mention]; an interval that crosses a loop boundary (a backward branch and its target label)
     is stretched over the whole loop, so values carried around a loop stay put for every iteration;
  2. gives each interval the lowest free physical registers of its file (VGPRs; SGPRs with tuples
     aligned to min(size, 4) as the encoder requires), a register being free again only
     after the instruction of its last mention (no overlap of a destination with the sources of the
     same instruction, which some gfx11 instructions forbid, e.g. v_mad_u64_u32);
  3. `insert_waits` puts `s_waitcnt vmcnt(0)` before the first instruction that touches a register a
     global load has not finished writing, and before every label and branch while a load is
     outstanding (RDNA3 ISA guide, "Data Dependency Resolution": VMEM loads return asynchronously
     and are tracked by VM_CNT; the shader must wait on the counter before it reads the result).
"""
from __future__ import annotations
from .inst import Inst, Label, Neg, Abs, Reg, Sub, Imm, base_reg, waitcnt
from .encode import encodings, is_literal

MAX_VGPRS = 256     # RDNA3 wave32: v0..v255
MAX_SGPRS = 106     # s0..s105 (RDNA3 ISA guide, "SGPRs"); vcc is separate


class RegisterPressureError(RuntimeError):
  pass


_first_source: dict[str, int] = {}


def _dests(name: str) -> int:
  """How many destination operands (a VGPR, a carry-out SGPR, vcc) come before a mnemonic's sources."""
  if name not in _first_source:
    ops = encodings(name)[0].operands
    _first_source[name] = next((i for i, op in enumerate(ops) if op.field.startswith("src")), len(ops))
  return _first_source[name]


def _literal(a) -> bool: return isinstance(a, Imm) and isinstance(a.value, int) and is_literal(a.value)


def _scalar(a) -> Reg | None:
  r = base_reg(a)
  return r if r is not None and r.file == "s" else None


def legalize(code: list, new_vgpr) -> list:
  """At most one literal and two scalar values (SGPRs + literal) per VALU instruction (gfx10+ constant bus
  limit, RDNA3 ISA guide "VALU Instruction Operands"): extra ones are first copied into VGPRs that
  `new_vgpr(size)` makes. An SGPR read twice (or both dwords of a pair) counts once."""
  out: list = []
  for x in code:
    if isinstance(x, Inst) and x.name.startswith("v_"):
      ndst, args = _dests(x.name), list(x.operands)
      for i in [i for i in range(ndst, len(args)) if _literal(args[i])][1:]:
        t = new_vgpr(1)
        out.append(Inst("v_mov_b32", (t, args[i])))
        args[i] = t
      while len({id(r) for a in args[ndst:] if (r := _scalar(a)) is not None}) + any(map(_literal, args[ndst:])) > 2:
        a = next((a for a in args[ndst:] if isinstance(a, (Reg, Sub)) and a.file == "s" and not base_reg(a).fixed), None)
        if a is None: raise RuntimeError(f"AMD renderer: cannot satisfy the constant bus limit for {x}")
        t = new_vgpr(a.size)
        for k in range(a.size): out.append(Inst("v_mov_b32", (t[k], a[k]) if a.size > 1 else (t, a)))
        args = [t if y is a else y for y in args]
      if args != list(x.operands): x = Inst(x.name, tuple(args), x.mods)
    out.append(x)
  return out


def _loops(code: list) -> list[tuple[int, int]]:
  labels = {x.name: i for i, x in enumerate(code) if isinstance(x, Label)}
  out = []
  for i, x in enumerate(code):
    if isinstance(x, Inst) and (t := x.target) is not None and labels.get(t.name, i + 1) <= i:
      out.append((labels[t.name], i))
  return out


def live_intervals(code: list) -> dict[Reg, list[int]]:
  iv: dict[Reg, list[int]] = {}
  for i, inst in enumerate(code):
    if isinstance(inst, Label): continue
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


def allocate(code: list, reserved_v: int, reserved_s: int) -> tuple[int, int]:
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
        f"{start}: {code[start].name}); the kernel keeps too many values live at once: split it (fewer fused ops) "
        f"or reduce the upcast/unroll")
    for q in range(p, p + r.size): regs[q] = end
    r.phys = p
    used[r.file] = max(used[r.file], p + r.size)
  return used["v"], used["s"]


def _phys(inst: Inst) -> set:
  out = set()
  for a in inst.operands:
    if isinstance(a, (Neg, Abs)): a = a.x
    if isinstance(a, (Reg, Sub)): out.update((a.file, a.phys + k) for k in range(a.size))
  return out


def insert_waits(code: list) -> list:
  """The code with s_waitcnt vmcnt(0) inserted where a pending load's result is touched (registers allocated)."""
  out: list = []
  pending: set = set()
  for x in code:
    if pending and (isinstance(x, Label) or x.target is not None or x.name == "s_endpgm" or _phys(x) & pending):
      out.append(Inst("s_waitcnt", (waitcnt(vmcnt=0),)))
      pending.clear()
    out.append(x)
    if isinstance(x, Inst) and x.is_vector_load:
      a = x.operands[0]
      pending |= {(a.file, a.phys + k) for k in range(a.size)}
  return out
