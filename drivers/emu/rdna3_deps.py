"""Data dependencies an RDNA3 (gfx1100) program must resolve itself: s_waitcnt counters and the VALU hazards.

Outstanding memory results (RDNA3 ISA guide, 5.6 "Data Dependency Resolution"): "the program must insert
S_WAITCNT instructions to ensure that previous operations have completed before continuing". Counters:
  - VMcnt: GLOBAL/SCRATCH/FLAT loads and atomics with return. "Instructions within a type often return in the
    order they were issued"; "it is possible for data to be written to VGPRs out-of-order, but the
    counter-decrement still reflects in-order completion" (the guide's example: two global_load, then
    `s_waitcnt vmcnt(1)` makes the first one's result usable).
  - LGKMcnt: LDS operations (in order), SMEM loads ("may return completely out-of-order with respect to other
    scalar memory loads") and FLAT instructions ("uses both LGKMcnt and either VMcnt or VScnt"; the data may come
    from LDS or memory, so a FLAT load is complete only when both counters reach 0, as LLVM's SIInsertWaitcnts
    treats a pending FLAT).
  - VScnt (stores, atomics without return) and EXPcnt (exports) guard no register, so they are not tracked.
The groups return out of order with respect to each other. So after `s_waitcnt <counter>(N)` a load counted
in order is known complete once N or more in-order loads of that counter were issued after it; a load counted
out of order only once the counter is 0. Until then its destination registers hold no defined value: an
instruction that reads or writes one of them raises MissingWait (even a second load into the same register:
the data of two loads may reach the VGPRs in either order).

An s_barrier with an LDS store of the same wave still outstanding (LGKMcnt not brought to 0 since) raises MissingWait:
s_barrier orders no memory operation, so a workgroup-scope release is `s_waitcnt lgkmcnt(0)` then `s_barrier`
(AMDGPUUsage, "Memory Model GFX10-GFX11": the release fence waits for the wave's LDS operations to complete, "Must
happen before the following s_barrier"), else another wave may read the LDS before the store has reached it.

Hazards (gfx11 has hardware interlocks for data dependencies, "Inserting S_NOP is not required to achieve
correct operation" (5.6); LLVM's GCNHazardRecognizer keeps these for gfx1100, wave32):
  - VALUTransUseHazard (AMDGPU.td FeatureVALUTransUseHazard, "Hazard when TRANS instructions are closely
    followed by a use of the result", in gfx1100-1103; GCNHazardRecognizer::fixVALUTransUseHazard): a VALU that
    reads a VGPR written by a transcendental (VOP1Instructions.td `TRANS = 1`) with at most 5 VALUs and at most
    1 other TRANS between them, and no VMEM/FLAT/DS in between, needs `s_waitcnt_depctr va_vdst(0)` first.
  - WMMA (GCNHazardRecognizer::fixWMMAHazards): a v_wmma whose A or B matrix overlaps the D matrix of the
    previous VALU, a v_wmma, needs an independent VALU (LLVM inserts v_nop) in between.
  - VcmpxPermlaneHazard (FeatureVcmpxPermlaneHazard, in every gfx11; fixVcmpxPermlaneHazards): v_permlane*
    right after a v_cmpx (the previous VALU wrote EXEC by a compare) needs an independent VALU in between.
Not modelled because LLVM does not apply them to gfx1100 wave32: the GCN-era wait states (FeatureNoDataDepHazard,
"Does not need SW waitstates", is in FeatureGFX11), VALUPartialForwarding and VALUMaskWrite (wave64 only), and
the gfx10-only VMEMtoScalarWrite, SMEMtoVectorWrite, VcmpxExecWAR and LdsBranchVmemWAR hazards.
"""
from __future__ import annotations

import numpy as np

from baregrad.drivers.amd import isa
from .rdna3_state import ALL, NULL, VCC, EmulatorError

SGPR = 256            # register keys: VGPR r -> r, scalar operand code s -> SGPR + s
TRANS = frozenset(   # LLVM VOP1Instructions.td, `let TRANS = 1`
  "v_exp_f32 v_log_f32 v_rcp_f32 v_rcp_iflag_f32 v_rsq_f32 v_sqrt_f32 v_rcp_f64 v_rsq_f64 v_sqrt_f64 v_sin_f32 "
  "v_cos_f32 v_rcp_f16 v_sqrt_f16 v_rsq_f16 v_log_f16 v_exp_f16 v_sin_f16 v_cos_f16".split())
TRANS_USE_VALUS, TRANS_USE_TRANS = 5, 1        # fixVALUTransUseHazard: IntvMaxVALUs, IntvMaxTRANS
COUNTER_MAX = 63                                # 6-bit VMcnt/LGKMcnt: at most 63 outstanding, the 64th waits
GUIDE_WAITCNT = 'RDNA3 ISA guide, 5.6 "Data Dependency Resolution"'
_VALU = ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P")
_WIDTH = {"v64": 2, "s64": 2, "b64": 2, "f64": 2, "v96": 3, "v128": 4, "s128": 4, "v256": 8, "n256": 8, "s256": 8,
          "s512": 16}
_SOPK_READS = ("s_cmpk_", "s_setreg", "s_waitcnt_")
_SOPK_READ_WRITES = ("s_addk_i32", "s_mulk_i32", "s_cmovk_i32")
# VALU instructions that also read their destination (an accumulator, a partial write or a swap)
_READS_VDST = ("v_fmac_", "v_dot2acc_", "v_pk_fmac_", "v_writelane_", "v_swap_", "v_fma_mixlo_", "v_fma_mixhi_")


class MissingWait(EmulatorError):
  """An instruction used a register that an outstanding memory load has not finished writing."""


class HazardError(EmulatorError):
  """An instruction sequence that gfx1100 hardware does not interlock (GCNHazardRecognizer)."""


# ---------------------------------------------------------------- what one instruction touches

class Dep:
  """The registers an instruction reads and writes and how it takes part in the counters and hazards."""
  __slots__ = ("reads", "writes", "regs", "valu", "trans", "mem", "issue", "wait", "note", "wmma_ab", "permlane",
               "barrier", "starts")

  def __init__(self):
    self.reads, self.writes = set(), set()
    self.valu = self.trans = self.mem = self.permlane = self.barrier = False
    self.issue = ()            # ((counter, in_order, registers), ...) of an instruction that returns data later
    self.wait = {}             # counter -> count of an s_waitcnt
    self.note = None           # "wmma" / "cmpx": what the next VALU is checked against
    self.wmma_ab = frozenset()

  def done(self) -> "Dep":
    self.reads, self.writes = frozenset(self.reads), frozenset(self.writes)
    self.regs = self.reads | self.writes
    self.starts = bool(self.issue or self.wait or self.trans or self.note or self.barrier)
    return self


def _vgprs(first: int, count: int) -> set: return set(range(first, first + count))


def _sgprs(code: int, count: int) -> set:
  return {SGPR + code + i for i in range(count)} if code < 128 and code != NULL else set()


def _source(code: int, kind: str) -> set:
  """Registers of a 9-bit VALU source field (VGPRs from 256, SGPRs below 128, else a constant)."""
  n = _WIDTH.get(kind, 1)
  return _vgprs(code - 256, n) if code >= 256 else _sgprs(code, n)


def analyze(inst, get) -> Dep:
  """The Dep of a decoded instruction (fields read with get(name))."""
  d, name, fmt = Dep(), inst.name, inst.fmt
  if fmt in _VALU: _valu(d, inst, get)
  elif fmt in ("SOP1", "SOP2", "SOPC", "SOPK"): _salu(d, inst, get)
  elif fmt == "SOPP": _sopp(d, name, get)
  elif fmt == "SMEM":
    count = _WIDTH.get(next(op.kind for op in inst.operands if op.field == "sdata"), 1)
    d.reads |= _sgprs(get("sbase") * 2, 2)
    if "soffset" in isa.FORMATS[fmt].fields and get("soffset") != NULL: d.reads |= _sgprs(get("soffset"), 1)
    if name.startswith(("s_load_", "s_buffer_load_")):
      d.writes |= _sgprs(get("sdata"), count)
      d.issue = (("lgkm", False, frozenset(d.writes)),)
  elif fmt == "DS": _ds(d, inst, get)
  elif fmt in ("GLOBAL", "SCRATCH", "FLAT"): _vmem(d, inst, get)
  return d.done()


def _valu(d: Dep, inst, get) -> None:
  name = inst.name
  d.valu, d.trans = True, name in TRANS
  ops = inst.operands
  first_src = next((i for i, op in enumerate(ops) if op.field.startswith(("src", "vsrc"))), len(ops))
  for i, op in enumerate(ops):
    if op.field in ("src0", "src1", "src2"): d.reads |= _source(get(op.field), op.kind)
    elif op.field == "vsrc1": d.reads |= _vgprs(get("vsrc1"), _WIDTH.get(op.kind, 1))
    elif op.field in ("vdst", "sdst"):
      n = _WIDTH.get(op.kind, 1)
      d.writes |= _vgprs(get(op.field), n) if op.kind.startswith("v") else _sgprs(get(op.field), n)
    elif op.kind == "vcc_lo":                                       # the implicit VCC of VOPC/VOP2 forms
      (d.writes if i < first_src else d.reads).add(SGPR + VCC)
  vdst_regs = {r for r in d.writes if r < SGPR}
  if name.startswith(_READS_VDST) or (inst.fmt == "VOP3" and "op_sel" in inst.modifiers and get("op_sel") & 8):
    d.reads |= vdst_regs
  if name.startswith("v_swap_"): d.writes |= _source(get("src0"), "v32")
  if name.startswith("v_div_fmas_"): d.reads.add(SGPR + VCC)
  if name.startswith("v_wmma_"):
    d.note = "wmma"
    n = 2 if name.endswith("iu4") else 4 if name.endswith("iu8") else 8      # VGPRs of the A and B matrices
    d.wmma_ab = frozenset(_vgprs(get("src0") - 256, n) | _vgprs(get("src1") - 256, n))
  if name.startswith("v_cmpx_"): d.note = "cmpx"
  d.permlane = name.startswith(("v_permlane16_", "v_permlanex16_", "v_permlane64_"))


def _salu(d: Dep, inst, get) -> None:
  name = inst.name
  for op in inst.operands:
    if op.field in ("ssrc0", "ssrc1"): d.reads |= _sgprs(get(op.field), _WIDTH.get(op.kind, 1))
    elif op.field == "sdst":
      regs = _sgprs(get("sdst"), _WIDTH.get(op.kind, 1))
      if inst.fmt != "SOPK" or not name.startswith(_SOPK_READS): d.writes |= regs
      if inst.fmt == "SOPK" and name.startswith(_SOPK_READS + _SOPK_READ_WRITES): d.reads |= regs
  if name.startswith("s_waitcnt_"):
    # "Wait for VSCNT, VMCNT, EXPCNT or LGKMcnt to be less-than or equal-to the count in SIMM16" (5.6, Table 18)
    if get("sdst") != NULL:
      raise EmulatorError(f"{name} with an SGPR count operand is not emulated (only `{name} null, <count>`)")
    counter = {"s_waitcnt_vmcnt": "vm", "s_waitcnt_lgkmcnt": "lgkm"}.get(name)
    if counter: d.wait = {counter: get("simm16")}


def _sopp(d: Dep, name: str, get) -> None:
  if name == "s_waitcnt":       # SIMM16 = { VMcnt[5:0], LGKMcnt[5:0], 1'b0, EXPcnt[2:0] } (5.6, Table 18)
    simm = get("simm16")
    field = lambda f: (simm >> isa.WAITCNT_FIELDS[f][0]) & ((1 << isa.WAITCNT_FIELDS[f][1]) - 1)
    d.wait = {"vm": field("vmcnt"), "lgkm": field("lgkmcnt")}
  elif name == "s_waitcnt_depctr" and not (get("simm16") >> 12) & 0xF:
    d.mem = True                # va_vdst(0), SIMM16[15:12]: every VALU result written, as a VMEM/DS issue waits
  elif name in ("s_cbranch_vccz", "s_cbranch_vccnz"): d.reads.add(SGPR + VCC)
  elif name == "s_barrier": d.barrier = True


def _ds(d: Dep, inst, get) -> None:
  name = inst.name
  d.mem = True
  for op in inst.operands:
    if op.field in ("addr", "data0", "data1"): d.reads |= _vgprs(get(op.field), _WIDTH.get(op.kind, 1))
    elif op.field == "vdst": d.writes |= _vgprs(get("vdst"), _WIDTH.get(op.kind, 1))
  if "_d16" in name: d.reads |= d.writes                         # the other half of the register is kept
  if name != "ds_nop": d.issue = (("lgkm", True, frozenset(d.writes)),)


def _vmem(d: Dep, inst, get) -> None:
  fmt, name = inst.fmt, inst.name
  d.mem = True
  saddr = get("saddr")
  for op in inst.operands:
    if op.field == "addr":
      if op.kind != "vaddr": n = _WIDTH.get(op.kind, 1)
      elif fmt == "GLOBAL": n = 1 if saddr != NULL else 2          # SGPR base + 32-bit offset, or a 64-bit address
      else: n = 1 if get("sve") else 0                              # scratch: the VGPR offset only with SVE
      d.reads |= _vgprs(get("addr"), n)
    elif op.field == "data": d.reads |= _vgprs(get("data"), _WIDTH.get(op.kind, 1))
    elif op.field == "saddr" and saddr != NULL: d.reads |= _sgprs(saddr, 2 if fmt == "GLOBAL" else 1)
    elif op.field == "vdst" and (not op.optional or get("glc")): d.writes |= _vgprs(get("vdst"), _WIDTH.get(op.kind, 1))
  if "_d16" in name: d.reads |= d.writes
  if d.writes:                   # loads and atomics with return; stores and atomics without count on VScnt
    regs = frozenset(d.writes)
    d.issue = (("vm", False, regs), ("lgkm", False, regs)) if fmt == "FLAT" else (("vm", True, regs),)


# ---------------------------------------------------------------- per-batch state and the checks

class _Pending:
  """One outstanding load: its destination registers and, per counter, the waves still waiting for it."""
  __slots__ = ("regs", "left", "in_order", "pc")

  def __init__(self, regs, pc): self.regs, self.left, self.in_order, self.pc = regs, {}, {}, pc

  def outstanding(self) -> np.ndarray:
    masks = list(self.left.values())
    out = masks[0].copy()
    for m in masks[1:]: out |= m
    return out


class _Trans:
  """A transcendental's destination VGPRs and, per wave, the VALUs and TRANS issued since (99: expired)."""
  __slots__ = ("regs", "valus", "trans", "pc")


class DepState:
  def __init__(self, n_waves: int):
    self.n = n_waves
    self.queues: dict[str, list[_Pending]] = {"vm": [], "lgkm": []}
    self.pending_regs = frozenset()
    self.trans: list[_Trans] = []
    self.notes: list[list] = []          # [kind, registers, waves mask, pc] of the last VALU of some waves
    self.all = np.ones(n_waves, bool)        # shared, never written: "every wave" (the uniform case)
    self.none = np.zeros(n_waves, bool)

  def mask(self, sel) -> np.ndarray:
    if sel is ALL: return self.all
    m = np.zeros(self.n, bool)
    m[sel] = True
    return m


def reg_name(key: int) -> str:
  from baregrad.drivers.amd.disasm import sreg_name
  return f"v{key}" if key < SGPR else sreg_name(key - SGPR, 1)


def step(w, d: Dep, sel, pc: int, text) -> None:
  """Check instruction d (at pc, for the waves in sel) against what is outstanding, then account for it.
  text(pc) gives an instruction's assembly for error messages."""
  st: DepState = w.deps
  m = st.mask(sel)
  if d.valu:
    if st.trans: _check_trans(st, d, m, pc, text)
    if st.notes: _check_notes(st, d, m, pc, text)
  if st.pending_regs and not st.pending_regs.isdisjoint(d.regs): _check_pending(st, d, m, pc, text)
  if d.barrier and st.queues["lgkm"]: _check_barrier(st, m, pc, text)
  for counter, count in d.wait.items(): _retire(st, counter, count, m)
  if st.trans and (d.valu or d.mem): _age_trans(st, d, sel, m)
  if d.valu and st.notes:
    for note in st.notes: note[2] = note[2] & ~m
    st.notes = [n for n in st.notes if n[2].any()]
  if d.issue:
    p = _Pending(d.issue[0][2], pc)
    for counter, in_order, _ in d.issue:
      p.left[counter], p.in_order[counter] = (m if m is st.all else m.copy()), in_order
      st.queues[counter].append(p)
      if len(st.queues[counter]) > COUNTER_MAX: _retire(st, counter, COUNTER_MAX, m)
  if d.trans:
    t = _Trans()
    t.regs, t.pc = frozenset(r for r in d.writes if r < SGPR), pc
    t.valus, t.trans = np.where(m, 0, 99).astype(np.int16), np.zeros(st.n, np.int16)
    st.trans.append(t)
  if d.note:
    st.notes.append([d.note, frozenset(r for r in d.writes if r < SGPR), m.copy(), pc])
  if d.issue or d.wait:
    st.pending_regs = frozenset().union(*(p.regs for q in st.queues.values() for p in q))
  w.tracking = bool(st.pending_regs or st.trans or st.notes)


def _retire(st: DepState, counter: str, count: int, m: np.ndarray) -> None:
  """s_waitcnt <counter>(count) for the waves in m: what it guarantees complete stops being outstanding."""
  q = st.queues[counter]
  if not q: return
  if m is st.all and all(p.left[counter] is st.all for p in q):      # every wave alike: count entries
    keep, younger = [], 0
    for p in reversed(q):
      done = (younger >= count) if p.in_order[counter] else count == 0
      younger += p.in_order[counter]
      if done: p.left[counter] = st.none
      else: keep.append(p)
    st.queues[counter] = keep[::-1]
    return
  younger = np.zeros(st.n, np.int32)         # in-order loads of this counter issued after the one looked at
  for p in reversed(q):
    left = p.left[counter]
    if p.in_order[counter]:
      done = m & left & (younger >= count)
      younger += left
    else:
      done = m & left if count == 0 else None
    if done is not None and done.any(): p.left[counter] = left & ~done
  st.queues[counter] = [p for p in q if p.left[counter].any()]


def _needed_wait(st: DepState, p: _Pending, wave: int) -> str:
  waits = []
  for counter, left in p.left.items():
    if not left[wave]: continue
    if p.in_order[counter]:
      q = st.queues[counter]
      younger = sum(1 for o in q[q.index(p) + 1:] if o.in_order[counter] and o.left[counter][wave])
      waits.append(f"{counter}cnt({younger})")
    else: waits.append(f"{counter}cnt(0)")
  return "s_waitcnt " + " ".join(waits)


def _check_pending(st: DepState, d: Dep, m: np.ndarray, pc: int, text) -> None:
  seen = set()
  for q in st.queues.values():
    for p in q:
      if id(p) in seen: continue
      seen.add(id(p))
      hit = p.regs & d.regs
      if not hit: continue
      waves = p.outstanding() & m
      if not waves.any(): continue
      reg = min(hit)
      verb = "reads" if reg in d.reads else "overwrites"
      wave = int(np.argmax(waves))
      counters = " and ".join(f"{c}cnt" for c, left in p.left.items() if left[wave])
      raise MissingWait(
        f"missing s_waitcnt: `{text(pc)}` at pc {pc:#x} {verb} {reg_name(reg)}, which `{text(p.pc)}` at pc "
        f"{p.pc:#x} is still loading (counted by {counters}); insert `{_needed_wait(st, p, wave)}` before it "
        f"({GUIDE_WAITCNT}: a load's result is in its registers only once S_WAITCNT has brought its counter down; "
        "VMEM loads complete in order, SMEM loads out of order, FLAT on two counters)")


def _check_barrier(st: DepState, m: np.ndarray, pc: int, text) -> None:
  for p in st.queues["lgkm"]:
    waves = p.left["lgkm"] & m
    if p.regs or not waves.any(): continue          # an entry without registers: a DS store (or atomic without return)
    raise MissingWait(
      f"missing s_waitcnt: `{text(pc)}` at pc {pc:#x} in wave {int(np.argmax(waves))} while the LDS store "
      f"`{text(p.pc)}` at pc {p.pc:#x} may not have completed; insert `s_waitcnt lgkmcnt(0)` before the barrier "
      "(s_barrier orders no memory operation: AMDGPUUsage \"Memory Model GFX10-GFX11\", workgroup release; "
      f"{GUIDE_WAITCNT})")


def _check_trans(st: DepState, d: Dep, m: np.ndarray, pc: int, text) -> None:
  for t in st.trans:
    hit = t.regs & d.reads
    if not hit: continue
    live = m & (t.valus <= TRANS_USE_VALUS) & (t.trans <= TRANS_USE_TRANS)
    if live.any():
      wave = int(np.argmax(live))
      raise HazardError(
        f"VALU trans-use hazard: `{text(pc)}` at pc {pc:#x} reads {reg_name(min(hit))}, written by the "
        f"transcendental `{text(t.pc)}` at pc {t.pc:#x} only {int(t.valus[wave])} VALU instruction(s) before; "
        f"gfx1100 needs `s_waitcnt_depctr va_vdst(0)` (0xfff) or more than {TRANS_USE_VALUS} VALUs (or more than "
        f"{TRANS_USE_TRANS} other transcendental) in between (LLVM AMDGPU.td FeatureVALUTransUseHazard, "
        "GCNHazardRecognizer::fixVALUTransUseHazard)")


def _age_trans(st: DepState, d: Dep, sel, m: np.ndarray) -> None:
  for t in st.trans:
    if d.mem: t.valus[m] = 99              # a VMEM/FLAT/DS instruction waits for va_vdst == 0 (expires the hazard)
    else:
      t.valus[sel] += 1
      if d.trans: t.trans[sel] += 1
  st.trans = [t for t in st.trans if ((t.valus <= TRANS_USE_VALUS) & (t.trans <= TRANS_USE_TRANS)).any()]


def _check_notes(st: DepState, d: Dep, m: np.ndarray, pc: int, text) -> None:
  for kind, regs, waves, note_pc in st.notes:
    if not (waves & m).any(): continue
    if kind == "wmma" and d.note == "wmma" and regs & d.wmma_ab:
      raise HazardError(
        f"WMMA hazard: `{text(pc)}` at pc {pc:#x} reads {reg_name(min(regs & d.wmma_ab))} as its A or B matrix, "
        f"the D matrix of the v_wmma right before it (`{text(note_pc)}` at pc {note_pc:#x}); put an independent "
        "VALU (LLVM inserts v_nop) in between (LLVM GCNHazardRecognizer::fixWMMAHazards)")
    if kind == "cmpx" and d.permlane:
      raise HazardError(
        f"v_cmpx -> v_permlane hazard: `{text(pc)}` at pc {pc:#x} follows `{text(note_pc)}` (pc {note_pc:#x}), "
        "which wrote EXEC, with no VALU in between; put an independent VALU (LLVM: v_mov_b32 of the permlane "
        "source) in between (LLVM AMDGPU.td FeatureVcmpxPermlaneHazard, "
        "GCNHazardRecognizer::fixVcmpxPermlaneHazards)")
