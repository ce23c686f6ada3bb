"""A systematic corpus of gfx1100 instructions: every mnemonic in the tables x operand choices.

Each instruction gets one all-register form, then one variant per (operand, constant) pair
(inline integers, inline floats, literals, special registers), then modifier variants
(neg/abs, clamp, omod, op_sel, offsets, cache flags).
"""
from __future__ import annotations
import re

from baregrad.drivers.amd import isa
from baregrad.drivers.amd.isa import Inst

REGS = {
  "s32": ["s1", "s7", "vcc_lo", "s105", "m0", "exec_lo", "null", "ttmp3", "exec_hi", "vcc_hi"],
  "s64": ["s[2:3]", "s[10:11]", "vcc", "exec", "s[104:105]", "ttmp[4:5]"],
  "s128": ["s[4:7]", "s[8:11]", "s[100:103]"],
  "s256": ["s[8:15]", "s[16:23]"],
  "s512": ["s[16:31]", "s[32:47]"],
  "v32": ["v1", "v255", "v17", "v128"],
  "v64": ["v[2:3]", "v[254:255]", "v[9:10]"],
  "v96": ["v[3:5]", "v[252:254]"],
  "v128": ["v[4:7]", "v[252:255]"],
  "v256": ["v[8:15]", "v[16:23]"],
}
# constants tried in each source position, per operand kind
CONSTANTS = {
  "b32": ["0", "-16", "64", "-1", "0.5", "-4.0", "0.15915494", "0x12345678", "1.5", "-100", "0xffff0000",
          "src_scc", "m0", "exec_hi", "null", "src_shared_base", "1.0"],
  "b64": ["0", "-16", "64", "0x12345678", "1.0", "-1", "-100"],
  "f64": ["0", "-16", "0.5", "-4.0", "1.5", "0x12345678", "2.0"],
  "f16": ["0", "-16", "64", "0.5", "-4.0", "0.15915494", "0x1234", "1.5", "0x3c00", "m0"],
  "i16": ["0", "-16", "64", "0x1234", "1.0", "0.5", "-2.0", "0xffff"],
  "v2f16": ["0", "-1", "1.0", "0x12345678", "1.5", "0.15915494"],
  "bf16": ["1.0", "0x1234", "-1"],
  "v2bf16": ["1.0", "0x12345678", "-1"],
  "n32": ["5", "-1", "0.5", "m0"],
  "n256": ["1.0", "0", "-2"],
}
K_CONSTANTS = {"k32": ["0x11", "1.5", "0x12345678"], "k16": ["0x1234", "1.5"]}
IMM16 = {
  "hex": ["0x0", "0x1234", "0xffff"],
  "dec": ["0", "3", "100"],
  "dec?": ["", "5"],
  "label": ["0", "5", "65534"],
  "waitcnt": ["vmcnt(0)", "lgkmcnt(0)", "vmcnt(0) lgkmcnt(0)", "expcnt(2)", "vmcnt(63) expcnt(7) lgkmcnt(63)",
              "vmcnt(1) expcnt(0) lgkmcnt(3)"],
  "delay": ["instid0(VALU_DEP_1)", "instid0(VALU_DEP_1) | instskip(NEXT) | instid1(SALU_CYCLE_1)",
            "instid0(TRANS32_DEP_2) | instskip(SKIP_3) | instid1(VALU_DEP_4)", "instskip(SAME) | instid1(VALU_DEP_2)"],
  "depctr": ["0xfff", "depctr_va_vdst(0)", "depctr_hold_cnt(0)", "depctr_va_vdst(3) depctr_vm_vsrc(1)", "0x0",
             "0xff9f"],
  "hwreg": ["hwreg(HW_REG_MODE)", "hwreg(HW_REG_MODE, 4, 2)", "hwreg(HW_REG_HW_ID1, 0, 8)", "hwreg(52, 8, 3)",
            "hwreg(HW_REG_SHADER_CYCLES)"],
  "sendmsg": ["sendmsg(MSG_DEALLOC_VGPRS)", "sendmsg(MSG_INTERRUPT)", "sendmsg(MSG_HALT_WAVES)"],
}


def _reg_choices(kind: str, file: str | None = None) -> list[str]:
  bits = isa.SRC_KIND_BITS.get(kind) or int(kind[1:])
  regs = []
  if file in (None, "v"): regs += REGS[f"v{bits}"][:2]
  if file in (None, "s") and f"s{bits}" in REGS: regs += REGS[f"s{bits}"][:2]
  return regs


def _base_choices(inst: Inst) -> list[tuple[str, list[str]]]:
  """(kind, [first choice, alternatives...]) per operand."""
  out = []
  for op in inst.operands:
    k = op.kind
    if op.field == "": out.append((k, [k]))
    elif op.field == "simm16": out.append((k, IMM16[k]))
    elif k in K_CONSTANTS: out.append((k, K_CONSTANTS[k]))
    elif isa.is_reg_kind(k): out.append((k, REGS[k]))
    elif op.field.startswith("ssrc"):
      out.append((k, _reg_choices(k, "s") + [c for c in CONSTANTS.get(k, CONSTANTS["b32"]) if not c.startswith("src_")
                                              or k == "b32"]))
    elif op.field.startswith("src"):
      if k.startswith("n"): out.append((k, _reg_choices("v" + k[1:], "v") + CONSTANTS[k]))
      else: out.append((k, _reg_choices(k) + CONSTANTS[k]))
    else: out.append((k, [k]))
  return out


def _join(inst: Inst, mnemonic: str, ops: list[str], mods: list[str]) -> str:
  text = mnemonic + (" " + ", ".join(o for o in ops if o != "") if any(ops) else "")
  return text + "".join(" " + m for m in mods)


def _valu_variants(inst: Inst, mnemonic: str) -> list[str]:
  choices = _base_choices(inst)
  base = [c[0] if c[0] != "v255" else c[0] for _, c in choices]
  # second register choice for sources so the all-register form exercises SGPR reads too
  lines = [_join(inst, mnemonic, base, [])]
  alt = [c[1] if len(c) > 1 and isa.is_reg_kind(k) else c[0] for k, c in choices]
  lines.append(_join(inst, mnemonic, alt, []))
  for i, (kind, c) in enumerate(choices):
    for value in c[1:]:
      ops = list(base)
      ops[i] = value
      lines.append(_join(inst, mnemonic, ops, []))
  srcs = [i for i, op in enumerate(inst.operands) if op.field.startswith("src")]
  nsrc = len(srcs)
  mods = inst.modifiers
  if "neg" in mods and srcs:
    ops = list(base)
    ops[srcs[0]] = "-" + ops[srcs[0]]
    if "abs" in mods: ops[srcs[-1]] = "|" + ops[srcs[-1]] + "|"
    lines.append(_join(inst, mnemonic, ops, []))
    ops = list(base)
    ops[srcs[-1]] = "-|" + ops[srcs[-1]] + "|" if "abs" in mods else "-" + ops[srcs[-1]]
    lines.append(_join(inst, mnemonic, ops, []))
  if "clamp" in mods: lines.append(_join(inst, mnemonic, base, ["clamp"]))
  if "omod" in mods:
    lines.append(_join(inst, mnemonic, base, ["mul:2"]))
    lines.append(_join(inst, mnemonic, base, ["clamp", "div:2"]))
  if inst.fmt == "VOP3" and "op_sel" in mods:
    lines.append(_join(inst, mnemonic, base, ["op_sel:[" + ",".join(["1"] + ["0"] * nsrc) + "]"]))
    lines.append(_join(inst, mnemonic, base, ["op_sel:[" + ",".join(["0"] * nsrc + ["1"]) + "]"]))
  if inst.fmt == "VOP3P" and nsrc:
    def arr(bits): return "[" + ",".join(str(b) for b in bits) + "]"
    if "op_sel" in mods: lines.append(_join(inst, mnemonic, base, ["op_sel:" + arr([1] + [0] * (nsrc - 1))]))
    if "op_sel_hi" in mods: lines.append(_join(inst, mnemonic, base, ["op_sel_hi:" + arr([0] * (nsrc - 1) + [1])]))
    if "neg_lo" in mods: lines.append(_join(inst, mnemonic, base, ["neg_lo:" + arr([0] * (nsrc - 1) + [1])]))
    if "neg_hi" in mods: lines.append(_join(inst, mnemonic, base, ["neg_hi:" + arr([1] + [0] * (nsrc - 1))]))
  return lines


def _memory_variants(inst: Inst) -> list[str]:
  name = inst.name
  ops = [op for op in inst.operands if not op.optional]
  def regs(pick: int) -> list[str]:
    out = []
    for op in ops:
      if op.kind in ("vaddr", "saddr"): out.append(op.kind)
      else: out.append(REGS[op.kind][pick % len(REGS[op.kind])])
    return out
  lines = []
  for pick in range(2):
    texts = regs(pick)
    if inst.fmt == "SMEM":
      if not texts: lines.append(name); break
      lines += [f"{name} {texts[0]}, {texts[1]}, 0x10", f"{name} {texts[0]}, {texts[1]}, s5",
                f"{name} {texts[0]}, {texts[1]}, s5 offset:0x100 glc", f"{name} {texts[0]}, {texts[1]}, -0x8 dlc",
                f"{name} {texts[0]}, {texts[1]}, 0x0"]
      continue
    if inst.fmt == "DS":
      joined = _join(inst, name, texts, [])
      if "offset0" in inst.modifiers:
        lines += [joined, joined + " offset0:4 offset1:255", joined + " offset1:3", joined + " offset0:1 gds"]
      else:
        lines += [joined, joined + " offset:16", joined + " offset:65535", joined + " offset:256 gds"]
      continue
    # FLAT / GLOBAL / SCRATCH: fill in address forms
    address_forms = {"FLAT": [(None, None)], "GLOBAL": [("v1", "s[2:3]"), ("v[2:3]", "off")],
                     "SCRATCH": [("v1", "s2"), ("v1", "off"), ("off", "s2")]}[inst.fmt]
    for vaddr, saddr in address_forms:
      if "addtid" in name and saddr == "s2": continue
      filled = [vaddr if t == "vaddr" else saddr if t == "saddr" else t for t in texts]
      joined = _join(inst, name, filled, [])
      offsets = ["offset:4095"] if inst.fmt == "FLAT" else ["offset:-4096", "offset:2047"]
      lines += [joined] + [joined + " " + o for o in offsets] + [joined + " glc slc dlc", joined + " slc"]
      if inst.operands and inst.operands[0].optional:
        ret = REGS[inst.operands[0].kind][pick]
        lines.append(_join(inst, name, [ret] + filled, ["glc"]))
        lines.append(_join(inst, name, [ret] + filled, [offsets[0], "glc", "slc"]))
  return lines


def instruction_variants(inst: Inst) -> list[str]:
  if inst.fmt in ("SMEM", "DS", "FLAT", "GLOBAL", "SCRATCH"): return _memory_variants(inst)
  if inst.fmt in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"):
    if isa.has_e64_pair(inst.name):
      suffixed = _valu_variants(inst, inst.name + ("_e64" if inst.fmt == "VOP3" else "_e32"))
      plain = _valu_variants(inst, inst.name)
      return suffixed + plain[::3]
    return _valu_variants(inst, inst.name)
  choices = _base_choices(inst)
  base = [c[0] for _, c in choices]
  lines = [_join(inst, inst.name, base, [])]
  for i, (_, c) in enumerate(choices):
    for value in c[1:]:
      ops = list(base)
      ops[i] = value
      lines.append(_join(inst, inst.name, ops, []))
  return lines


def corpus() -> list[str]:
  seen, lines = set(), []
  for encodings in isa.BY_NAME.values():
    for inst in encodings:
      for line in instruction_variants(inst):
        line = re.sub(r"\s+", " ", line).strip()
        if line not in seen:
          seen.add(line)
          lines.append(line)
  return lines
