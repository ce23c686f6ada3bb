"""RDNA3 (gfx1100) instruction set as data: encoding formats, field layouts, opcode tables.

Sources of the facts written here:
  * AMD "RDNA3 Instruction Set Architecture" reference guide, chapter "Microcode Formats":
    the field layout of each encoding (bit position and width of every field).
  * llvm-mc-19 (`-triple=amdgcn-amd-amdhsa -mcpu=gfx1100`): the opcode of every mnemonic and
    the kind of each operand were read off its disassembly of every opcode value and its
    encodings of probe instructions. The tables below are our own notation of those facts.

Table notation (one instruction per line):  mnemonic  opcode  operands [| modifiers]
  operands, in assembly order, are `field:kind`:
    s32 s64 s128 s256 s512   scalar registers (SGPRs, vcc, exec, m0, null, ttmp) of that many bits
    v32 v64 v96 v128 v256    vector registers
    b32 b64                  a source: register, inline constant or literal (fp tokens become f32 bits)
    f16 i16 bf16 f64         same, with the literal/inline rules of that type (16-bit: one 32-bit VGPR)
    v2f16 v2bf16             packed 16-bit pairs
    n32 n256                 register or inline constant, never a literal
    k32 k16                  a mandatory literal constant (v_fmamk/v_fmaak)
    vaddr saddr              GLOBAL/SCRATCH address (v64 with `off`, else v32) and scalar base or `off`
    hex dec dec? label waitcnt delay hwreg sendmsg    forms of a 16-bit immediate
  `vcc_lo` alone is an implicit operand that is printed but not encoded; `field=value` is a fixed
  field value that is not printed; `vdst?:v32` is present only with `glc` (returning atomics).
  modifiers: clamp omod neg abs op_sel op_sel_hi neg_lo neg_hi (VALU), offset offset0 offset1
  gds glc slc dlc smem_offset (memory).
"""
from __future__ import annotations
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Field:
  name: str
  lo: int       # bit position of the least significant bit, counted over the whole 32/64-bit word
  width: int

  def get(self, word: int) -> int: return (word >> self.lo) & ((1 << self.width) - 1)
  def put(self, value: int) -> int: return (value & ((1 << self.width) - 1)) << self.lo


@dataclass(frozen=True)
class Format:
  name: str
  size: int                         # bytes, without a trailing literal
  match: tuple[int, int, int]       # (lo, width, value) of the bits that identify the format
  fields: dict[str, Field]
  fixed: dict[str, int] = field(default_factory=dict)   # field values every instruction sets

  def matches(self, word: int) -> bool:
    lo, width, value = self.match
    if (word >> lo) & ((1 << width) - 1) != value: return False
    return all(self.fields[k].get(word) == v for k, v in self.fixed.items())


def _format(name: str, size: int, match: tuple[int, int, int], layout: str, **fixed: int) -> Format:
  fields = {}
  for item in layout.split():
    fname, lo, width = item.split(":")
    fields[fname] = Field(fname, int(lo), int(width))
  return Format(name, size, match, fields, fixed)


# field layouts: name:lowest_bit:width (RDNA3 ISA guide, "Microcode Formats")
FORMATS: dict[str, Format] = {f.name: f for f in [
  _format("SOP2", 4, (30, 2, 0b10), "op:23:7 sdst:16:7 ssrc1:8:8 ssrc0:0:8"),
  _format("SOPK", 4, (28, 4, 0b1011), "op:23:5 sdst:16:7 simm16:0:16"),
  _format("SOP1", 4, (23, 9, 0b101111101), "sdst:16:7 op:8:8 ssrc0:0:8"),
  _format("SOPC", 4, (23, 9, 0b101111110), "op:16:7 ssrc1:8:8 ssrc0:0:8"),
  _format("SOPP", 4, (23, 9, 0b101111111), "op:16:7 simm16:0:16"),
  _format("SMEM", 8, (26, 6, 0b111101),
          "op:18:8 glc:14:1 dlc:13:1 sdata:6:7 sbase:0:6 offset:32:21 soffset:57:7"),
  _format("VOP1", 4, (25, 7, 0b0111111), "vdst:17:8 op:9:8 src0:0:9"),
  _format("VOP2", 4, (31, 1, 0b0), "op:25:6 vdst:17:8 vsrc1:9:8 src0:0:9"),
  _format("VOPC", 4, (25, 7, 0b0111110), "op:17:8 vsrc1:9:8 src0:0:9"),
  # VOP3 and VOP3 with a scalar destination (VOP3b/"VOP3SD") share the op space; sdst overlays
  # abs and op_sel
  _format("VOP3", 8, (26, 6, 0b110101),
          "op:16:10 clamp:15:1 op_sel:11:4 abs:8:3 sdst:8:7 vdst:0:8 "
          "src0:32:9 src1:41:9 src2:50:9 omod:59:2 neg:61:3"),
  _format("VOP3P", 8, (24, 8, 0b11001100),
          "op:16:7 clamp:15:1 op_sel_hi2:14:1 op_sel:11:3 neg_hi:8:3 vdst:0:8 "
          "src0:32:9 src1:41:9 src2:50:9 op_sel_hi:59:2 neg:61:3"),
  _format("DS", 8, (26, 6, 0b110110),
          "op:18:8 gds:17:1 offset1:8:8 offset0:0:8 addr:32:8 data0:40:8 data1:48:8 vdst:56:8"),
  # FLAT, SCRATCH and GLOBAL are one encoding told apart by the seg field
  _format("FLAT", 8, (26, 6, 0b110111),
          "op:18:7 seg:16:2 slc:15:1 glc:14:1 dlc:13:1 offset:0:13 "
          "addr:32:8 data:40:8 saddr:48:7 sve:55:1 vdst:56:8", seg=0),
  _format("SCRATCH", 8, (26, 6, 0b110111),
          "op:18:7 seg:16:2 slc:15:1 glc:14:1 dlc:13:1 offset:0:13 "
          "addr:32:8 data:40:8 saddr:48:7 sve:55:1 vdst:56:8", seg=1),
  _format("GLOBAL", 8, (26, 6, 0b110111),
          "op:18:7 seg:16:2 slc:15:1 glc:14:1 dlc:13:1 offset:0:13 "
          "addr:32:8 data:40:8 saddr:48:7 sve:55:1 vdst:56:8", seg=2),
]}

# decoding tries the formats with the longest identifying prefix first
DECODE_ORDER = sorted(FORMATS.values(), key=lambda f: -f.match[1])

# VOP1/VOP2/VOPC instructions also have a VOP3 ("_e64") form whose opcode is offset like this
VOP3_OPCODE_BASE = {"VOPC": 0x000, "VOP2": 0x100, "VOP1": 0x180}


@dataclass(frozen=True)
class Operand:
  field: str        # encoding field, or "" for an implicit operand
  kind: str         # see the module docstring
  optional: bool = False   # `vdst?`: only present with glc


@dataclass(frozen=True)
class Inst:
  name: str
  fmt: str
  opcode: int
  operands: tuple[Operand, ...]
  fixed: tuple[tuple[str, int], ...]
  modifiers: frozenset[str]


def _table(text: str) -> dict[str, tuple[int, str]]:
  rows = {}
  for line in text.strip().splitlines():
    name, opcode, *rest = line.split(None, 2)
    rows[name] = (int(opcode, 16), rest[0] if rest else "")
  return rows


SOP1 = _table("""
  s_mov_b32                          0x000  sdst:s32 ssrc0:b32
  s_mov_b64                          0x001  sdst:s64 ssrc0:b64
  s_cmov_b32                         0x002  sdst:s32 ssrc0:b32
  s_cmov_b64                         0x003  sdst:s64 ssrc0:b64
  s_brev_b32                         0x004  sdst:s32 ssrc0:b32
  s_brev_b64                         0x005  sdst:s64 ssrc0:b64
  s_ctz_i32_b32                      0x008  sdst:s32 ssrc0:b32
  s_ctz_i32_b64                      0x009  sdst:s32 ssrc0:b64
  s_clz_i32_u32                      0x00a  sdst:s32 ssrc0:b32
  s_clz_i32_u64                      0x00b  sdst:s32 ssrc0:b64
  s_cls_i32                          0x00c  sdst:s32 ssrc0:b32
  s_cls_i32_i64                      0x00d  sdst:s32 ssrc0:b64
  s_sext_i32_i8                      0x00e  sdst:s32 ssrc0:b32
  s_sext_i32_i16                     0x00f  sdst:s32 ssrc0:b32
  s_bitset0_b32                      0x010  sdst:s32 ssrc0:b32
  s_bitset0_b64                      0x011  sdst:s64 ssrc0:b32
  s_bitset1_b32                      0x012  sdst:s32 ssrc0:b32
  s_bitset1_b64                      0x013  sdst:s64 ssrc0:b32
  s_bitreplicate_b64_b32             0x014  sdst:s64 ssrc0:b32
  s_abs_i32                          0x015  sdst:s32 ssrc0:b32
  s_bcnt0_i32_b32                    0x016  sdst:s32 ssrc0:b32
  s_bcnt0_i32_b64                    0x017  sdst:s32 ssrc0:b64
  s_bcnt1_i32_b32                    0x018  sdst:s32 ssrc0:b32
  s_bcnt1_i32_b64                    0x019  sdst:s32 ssrc0:b64
  s_quadmask_b32                     0x01a  sdst:s32 ssrc0:b32
  s_quadmask_b64                     0x01b  sdst:s64 ssrc0:b64
  s_wqm_b32                          0x01c  sdst:s32 ssrc0:b32
  s_wqm_b64                          0x01d  sdst:s64 ssrc0:b64
  s_not_b32                          0x01e  sdst:s32 ssrc0:b32
  s_not_b64                          0x01f  sdst:s64 ssrc0:b64
  s_and_saveexec_b32                 0x020  sdst:s32 ssrc0:b32
  s_and_saveexec_b64                 0x021  sdst:s64 ssrc0:b64
  s_or_saveexec_b32                  0x022  sdst:s32 ssrc0:b32
  s_or_saveexec_b64                  0x023  sdst:s64 ssrc0:b64
  s_xor_saveexec_b32                 0x024  sdst:s32 ssrc0:b32
  s_xor_saveexec_b64                 0x025  sdst:s64 ssrc0:b64
  s_nand_saveexec_b32                0x026  sdst:s32 ssrc0:b32
  s_nand_saveexec_b64                0x027  sdst:s64 ssrc0:b64
  s_nor_saveexec_b32                 0x028  sdst:s32 ssrc0:b32
  s_nor_saveexec_b64                 0x029  sdst:s64 ssrc0:b64
  s_xnor_saveexec_b32                0x02a  sdst:s32 ssrc0:b32
  s_xnor_saveexec_b64                0x02b  sdst:s64 ssrc0:b64
  s_and_not0_saveexec_b32            0x02c  sdst:s32 ssrc0:b32
  s_and_not0_saveexec_b64            0x02d  sdst:s64 ssrc0:b64
  s_or_not0_saveexec_b32             0x02e  sdst:s32 ssrc0:b32
  s_or_not0_saveexec_b64             0x02f  sdst:s64 ssrc0:b64
  s_and_not1_saveexec_b32            0x030  sdst:s32 ssrc0:b32
  s_and_not1_saveexec_b64            0x031  sdst:s64 ssrc0:b64
  s_or_not1_saveexec_b32             0x032  sdst:s32 ssrc0:b32
  s_or_not1_saveexec_b64             0x033  sdst:s64 ssrc0:b64
  s_and_not0_wrexec_b32              0x034  sdst:s32 ssrc0:b32
  s_and_not0_wrexec_b64              0x035  sdst:s64 ssrc0:b64
  s_and_not1_wrexec_b32              0x036  sdst:s32 ssrc0:b32
  s_and_not1_wrexec_b64              0x037  sdst:s64 ssrc0:b64
  s_movrels_b32                      0x040  sdst:s32 ssrc0:b32
  s_movrels_b64                      0x041  sdst:s64 ssrc0:b64
  s_movreld_b32                      0x042  sdst:s32 ssrc0:b32
  s_movreld_b64                      0x043  sdst:s64 ssrc0:b64
  s_movrelsd_2_b32                   0x044  sdst:s32 ssrc0:b32
  s_getpc_b64                        0x047  sdst:s64
  s_setpc_b64                        0x048  ssrc0:b64
  s_swappc_b64                       0x049  sdst:s64 ssrc0:b64
  s_rfe_b64                          0x04a  ssrc0:b64
""")

SOP2 = _table("""
  s_add_u32                          0x000  sdst:s32 ssrc0:b32 ssrc1:b32
  s_sub_u32                          0x001  sdst:s32 ssrc0:b32 ssrc1:b32
  s_add_i32                          0x002  sdst:s32 ssrc0:b32 ssrc1:b32
  s_sub_i32                          0x003  sdst:s32 ssrc0:b32 ssrc1:b32
  s_addc_u32                         0x004  sdst:s32 ssrc0:b32 ssrc1:b32
  s_subb_u32                         0x005  sdst:s32 ssrc0:b32 ssrc1:b32
  s_absdiff_i32                      0x006  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshl_b32                         0x008  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshl_b64                         0x009  sdst:s64 ssrc0:b64 ssrc1:b32
  s_lshr_b32                         0x00a  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshr_b64                         0x00b  sdst:s64 ssrc0:b64 ssrc1:b32
  s_ashr_i32                         0x00c  sdst:s32 ssrc0:b32 ssrc1:b32
  s_ashr_i64                         0x00d  sdst:s64 ssrc0:b64 ssrc1:b32
  s_lshl1_add_u32                    0x00e  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshl2_add_u32                    0x00f  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshl3_add_u32                    0x010  sdst:s32 ssrc0:b32 ssrc1:b32
  s_lshl4_add_u32                    0x011  sdst:s32 ssrc0:b32 ssrc1:b32
  s_min_i32                          0x012  sdst:s32 ssrc0:b32 ssrc1:b32
  s_min_u32                          0x013  sdst:s32 ssrc0:b32 ssrc1:b32
  s_max_i32                          0x014  sdst:s32 ssrc0:b32 ssrc1:b32
  s_max_u32                          0x015  sdst:s32 ssrc0:b32 ssrc1:b32
  s_and_b32                          0x016  sdst:s32 ssrc0:b32 ssrc1:b32
  s_and_b64                          0x017  sdst:s64 ssrc0:b64 ssrc1:b64
  s_or_b32                           0x018  sdst:s32 ssrc0:b32 ssrc1:b32
  s_or_b64                           0x019  sdst:s64 ssrc0:b64 ssrc1:b64
  s_xor_b32                          0x01a  sdst:s32 ssrc0:b32 ssrc1:b32
  s_xor_b64                          0x01b  sdst:s64 ssrc0:b64 ssrc1:b64
  s_nand_b32                         0x01c  sdst:s32 ssrc0:b32 ssrc1:b32
  s_nand_b64                         0x01d  sdst:s64 ssrc0:b64 ssrc1:b64
  s_nor_b32                          0x01e  sdst:s32 ssrc0:b32 ssrc1:b32
  s_nor_b64                          0x01f  sdst:s64 ssrc0:b64 ssrc1:b64
  s_xnor_b32                         0x020  sdst:s32 ssrc0:b32 ssrc1:b32
  s_xnor_b64                         0x021  sdst:s64 ssrc0:b64 ssrc1:b64
  s_and_not1_b32                     0x022  sdst:s32 ssrc0:b32 ssrc1:b32
  s_and_not1_b64                     0x023  sdst:s64 ssrc0:b64 ssrc1:b64
  s_or_not1_b32                      0x024  sdst:s32 ssrc0:b32 ssrc1:b32
  s_or_not1_b64                      0x025  sdst:s64 ssrc0:b64 ssrc1:b64
  s_bfe_u32                          0x026  sdst:s32 ssrc0:b32 ssrc1:b32
  s_bfe_i32                          0x027  sdst:s32 ssrc0:b32 ssrc1:b32
  s_bfe_u64                          0x028  sdst:s64 ssrc0:b64 ssrc1:b32
  s_bfe_i64                          0x029  sdst:s64 ssrc0:b64 ssrc1:b32
  s_bfm_b32                          0x02a  sdst:s32 ssrc0:b32 ssrc1:b32
  s_bfm_b64                          0x02b  sdst:s64 ssrc0:b32 ssrc1:b32
  s_mul_i32                          0x02c  sdst:s32 ssrc0:b32 ssrc1:b32
  s_mul_hi_u32                       0x02d  sdst:s32 ssrc0:b32 ssrc1:b32
  s_mul_hi_i32                       0x02e  sdst:s32 ssrc0:b32 ssrc1:b32
  s_cselect_b32                      0x030  sdst:s32 ssrc0:b32 ssrc1:b32
  s_cselect_b64                      0x031  sdst:s64 ssrc0:b64 ssrc1:b64
  s_pack_ll_b32_b16                  0x032  sdst:s32 ssrc0:b32 ssrc1:b32
  s_pack_lh_b32_b16                  0x033  sdst:s32 ssrc0:b32 ssrc1:b32
  s_pack_hh_b32_b16                  0x034  sdst:s32 ssrc0:b32 ssrc1:b32
  s_pack_hl_b32_b16                  0x035  sdst:s32 ssrc0:b32 ssrc1:b32
""")

SOPK = _table("""
  s_movk_i32                         0x000  sdst:s32 simm16:hex
  s_cmovk_i32                        0x002  sdst:s32 simm16:hex
  s_cmpk_eq_i32                      0x003  sdst:s32 simm16:hex
  s_cmpk_lg_i32                      0x004  sdst:s32 simm16:hex
  s_cmpk_gt_i32                      0x005  sdst:s32 simm16:hex
  s_cmpk_ge_i32                      0x006  sdst:s32 simm16:hex
  s_cmpk_lt_i32                      0x007  sdst:s32 simm16:hex
  s_cmpk_le_i32                      0x008  sdst:s32 simm16:hex
  s_cmpk_eq_u32                      0x009  sdst:s32 simm16:hex
  s_cmpk_lg_u32                      0x00a  sdst:s32 simm16:hex
  s_cmpk_gt_u32                      0x00b  sdst:s32 simm16:hex
  s_cmpk_ge_u32                      0x00c  sdst:s32 simm16:hex
  s_cmpk_lt_u32                      0x00d  sdst:s32 simm16:hex
  s_cmpk_le_u32                      0x00e  sdst:s32 simm16:hex
  s_addk_i32                         0x00f  sdst:s32 simm16:hex
  s_mulk_i32                         0x010  sdst:s32 simm16:hex
  s_getreg_b32                       0x011  sdst:s32 simm16:hwreg
  s_setreg_b32                       0x012  simm16:hwreg sdst:s32
  s_call_b64                         0x014  sdst:s64 simm16:label
  s_subvector_loop_begin             0x016  sdst:s32 simm16:label
  s_subvector_loop_end               0x017  sdst:s32 simm16:label
  s_waitcnt_vscnt                    0x018  sdst:s32 simm16:hex
  s_waitcnt_vmcnt                    0x019  sdst:s32 simm16:hex
  s_waitcnt_expcnt                   0x01a  sdst:s32 simm16:hex
  s_waitcnt_lgkmcnt                  0x01b  sdst:s32 simm16:hex
""")

SOPC = _table("""
  s_cmp_eq_i32                       0x000  ssrc0:b32 ssrc1:b32
  s_cmp_lg_i32                       0x001  ssrc0:b32 ssrc1:b32
  s_cmp_gt_i32                       0x002  ssrc0:b32 ssrc1:b32
  s_cmp_ge_i32                       0x003  ssrc0:b32 ssrc1:b32
  s_cmp_lt_i32                       0x004  ssrc0:b32 ssrc1:b32
  s_cmp_le_i32                       0x005  ssrc0:b32 ssrc1:b32
  s_cmp_eq_u32                       0x006  ssrc0:b32 ssrc1:b32
  s_cmp_lg_u32                       0x007  ssrc0:b32 ssrc1:b32
  s_cmp_gt_u32                       0x008  ssrc0:b32 ssrc1:b32
  s_cmp_ge_u32                       0x009  ssrc0:b32 ssrc1:b32
  s_cmp_lt_u32                       0x00a  ssrc0:b32 ssrc1:b32
  s_cmp_le_u32                       0x00b  ssrc0:b32 ssrc1:b32
  s_bitcmp0_b32                      0x00c  ssrc0:b32 ssrc1:b32
  s_bitcmp1_b32                      0x00d  ssrc0:b32 ssrc1:b32
  s_bitcmp0_b64                      0x00e  ssrc0:b64 ssrc1:b32
  s_bitcmp1_b64                      0x00f  ssrc0:b64 ssrc1:b32
  s_cmp_eq_u64                       0x010  ssrc0:b64 ssrc1:b64
  s_cmp_lg_u64                       0x011  ssrc0:b64 ssrc1:b64
""")

SOPP = _table("""
  s_nop                              0x000  simm16:dec
  s_setkill                          0x001  simm16:dec
  s_sethalt                          0x002  simm16:dec
  s_sleep                            0x003  simm16:dec
  s_set_inst_prefetch_distance       0x004  simm16:hex
  s_clause                           0x005  simm16:hex
  s_delay_alu                        0x007  simm16:delay
  s_waitcnt_depctr                   0x008  simm16:depctr
  s_waitcnt                          0x009  simm16:waitcnt
  s_wait_idle                        0x00a
  s_wait_event                       0x00b  simm16:hex
  s_trap                             0x010  simm16:dec
  s_round_mode                       0x011  simm16:hex
  s_denorm_mode                      0x012  simm16:dec
  s_code_end                         0x01f
  s_branch                           0x020  simm16:label
  s_cbranch_scc0                     0x021  simm16:label
  s_cbranch_scc1                     0x022  simm16:label
  s_cbranch_vccz                     0x023  simm16:label
  s_cbranch_vccnz                    0x024  simm16:label
  s_cbranch_execz                    0x025  simm16:label
  s_cbranch_execnz                   0x026  simm16:label
  s_cbranch_cdbgsys                  0x027  simm16:label
  s_cbranch_cdbguser                 0x028  simm16:label
  s_cbranch_cdbgsys_or_user          0x029  simm16:label
  s_cbranch_cdbgsys_and_user         0x02a  simm16:label
  s_endpgm                           0x030  simm16:dec?
  s_endpgm_saved                     0x031
  s_wakeup                           0x034
  s_setprio                          0x035  simm16:dec
  s_sendmsg                          0x036  simm16:sendmsg
  s_sendmsghalt                      0x037  simm16:sendmsg
  s_incperflevel                     0x038  simm16:dec
  s_decperflevel                     0x039  simm16:dec
  s_ttracedata                       0x03a
  s_ttracedata_imm                   0x03b  simm16:hex
  s_icache_inv                       0x03c
  s_barrier                          0x03d
""")

SMEM = _table("""
  s_load_b32                         0x000  sdata:s32 sbase:s64 | smem_offset glc dlc
  s_load_b64                         0x001  sdata:s64 sbase:s64 | smem_offset glc dlc
  s_load_b128                        0x002  sdata:s128 sbase:s64 | smem_offset glc dlc
  s_load_b256                        0x003  sdata:s256 sbase:s64 | smem_offset glc dlc
  s_load_b512                        0x004  sdata:s512 sbase:s64 | smem_offset glc dlc
  s_buffer_load_b32                  0x008  sdata:s32 sbase:s128 | smem_offset glc dlc
  s_buffer_load_b64                  0x009  sdata:s64 sbase:s128 | smem_offset glc dlc
  s_buffer_load_b128                 0x00a  sdata:s128 sbase:s128 | smem_offset glc dlc
  s_buffer_load_b256                 0x00b  sdata:s256 sbase:s128 | smem_offset glc dlc
  s_buffer_load_b512                 0x00c  sdata:s512 sbase:s128 | smem_offset glc dlc
  s_gl1_inv                          0x020
  s_dcache_inv                       0x021
""")

VOP1 = _table("""
  v_nop                              0x000
  v_mov_b32                          0x001  vdst:v32 src0:b32
  v_readfirstlane_b32                0x002  vdst:s32 src0:b32
  v_cvt_i32_f64                      0x003  vdst:v32 src0:f64
  v_cvt_f64_i32                      0x004  vdst:v64 src0:b32
  v_cvt_f32_i32                      0x005  vdst:v32 src0:b32
  v_cvt_f32_u32                      0x006  vdst:v32 src0:b32
  v_cvt_u32_f32                      0x007  vdst:v32 src0:b32
  v_cvt_i32_f32                      0x008  vdst:v32 src0:b32
  v_cvt_f16_f32                      0x00a  vdst:v32 src0:b32
  v_cvt_f32_f16                      0x00b  vdst:v32 src0:f16
  v_cvt_nearest_i32_f32              0x00c  vdst:v32 src0:b32
  v_cvt_floor_i32_f32                0x00d  vdst:v32 src0:b32
  v_cvt_off_f32_i4                   0x00e  vdst:v32 src0:b32
  v_cvt_f32_f64                      0x00f  vdst:v32 src0:f64
  v_cvt_f64_f32                      0x010  vdst:v64 src0:b32
  v_cvt_f32_ubyte0                   0x011  vdst:v32 src0:b32
  v_cvt_f32_ubyte1                   0x012  vdst:v32 src0:b32
  v_cvt_f32_ubyte2                   0x013  vdst:v32 src0:b32
  v_cvt_f32_ubyte3                   0x014  vdst:v32 src0:b32
  v_cvt_u32_f64                      0x015  vdst:v32 src0:f64
  v_cvt_f64_u32                      0x016  vdst:v64 src0:b32
  v_trunc_f64                        0x017  vdst:v64 src0:f64
  v_ceil_f64                         0x018  vdst:v64 src0:f64
  v_rndne_f64                        0x019  vdst:v64 src0:f64
  v_floor_f64                        0x01a  vdst:v64 src0:f64
  v_fract_f32                        0x020  vdst:v32 src0:b32
  v_trunc_f32                        0x021  vdst:v32 src0:b32
  v_ceil_f32                         0x022  vdst:v32 src0:b32
  v_rndne_f32                        0x023  vdst:v32 src0:b32
  v_floor_f32                        0x024  vdst:v32 src0:b32
  v_exp_f32                          0x025  vdst:v32 src0:b32
  v_log_f32                          0x027  vdst:v32 src0:b32
  v_rcp_f32                          0x02a  vdst:v32 src0:b32
  v_rcp_iflag_f32                    0x02b  vdst:v32 src0:b32
  v_rsq_f32                          0x02e  vdst:v32 src0:b32
  v_rcp_f64                          0x02f  vdst:v64 src0:f64
  v_rsq_f64                          0x031  vdst:v64 src0:f64
  v_sqrt_f32                         0x033  vdst:v32 src0:b32
  v_sqrt_f64                         0x034  vdst:v64 src0:f64
  v_sin_f32                          0x035  vdst:v32 src0:b32
  v_cos_f32                          0x036  vdst:v32 src0:b32
  v_not_b32                          0x037  vdst:v32 src0:b32
  v_bfrev_b32                        0x038  vdst:v32 src0:b32
  v_clz_i32_u32                      0x039  vdst:v32 src0:b32
  v_ctz_i32_b32                      0x03a  vdst:v32 src0:b32
  v_cls_i32                          0x03b  vdst:v32 src0:b32
  v_frexp_exp_i32_f64                0x03c  vdst:v32 src0:f64
  v_frexp_mant_f64                   0x03d  vdst:v64 src0:f64
  v_fract_f64                        0x03e  vdst:v64 src0:f64
  v_frexp_exp_i32_f32                0x03f  vdst:v32 src0:b32
  v_frexp_mant_f32                   0x040  vdst:v32 src0:b32
  v_movreld_b32                      0x042  vdst:v32 src0:b32
  v_movrels_b32                      0x043  vdst:v32 src0:v32
  v_movrelsd_b32                     0x044  vdst:v32 src0:v32
  v_movrelsd_2_b32                   0x048  vdst:v32 src0:v32
  v_cvt_f16_u16                      0x050  vdst:v32 src0:i16
  v_cvt_f16_i16                      0x051  vdst:v32 src0:i16
  v_cvt_u16_f16                      0x052  vdst:v32 src0:f16
  v_cvt_i16_f16                      0x053  vdst:v32 src0:f16
  v_rcp_f16                          0x054  vdst:v32 src0:f16
  v_sqrt_f16                         0x055  vdst:v32 src0:f16
  v_rsq_f16                          0x056  vdst:v32 src0:f16
  v_log_f16                          0x057  vdst:v32 src0:f16
  v_exp_f16                          0x058  vdst:v32 src0:f16
  v_frexp_mant_f16                   0x059  vdst:v32 src0:f16
  v_frexp_exp_i16_f16                0x05a  vdst:v32 src0:f16
  v_floor_f16                        0x05b  vdst:v32 src0:f16
  v_ceil_f16                         0x05c  vdst:v32 src0:f16
  v_trunc_f16                        0x05d  vdst:v32 src0:f16
  v_rndne_f16                        0x05e  vdst:v32 src0:f16
  v_fract_f16                        0x05f  vdst:v32 src0:f16
  v_sin_f16                          0x060  vdst:v32 src0:f16
  v_cos_f16                          0x061  vdst:v32 src0:f16
  v_sat_pk_u8_i16                    0x062  vdst:v32 src0:b32
  v_cvt_norm_i16_f16                 0x063  vdst:v32 src0:f16
  v_cvt_norm_u16_f16                 0x064  vdst:v32 src0:f16
  v_swap_b32                         0x065  vdst:v32 src0:v32
  v_permlane64_b32                   0x067  vdst:v32 src0:v32
  v_swaprel_b32                      0x068  vdst:v32 src0:v32
  v_not_b16                          0x069  vdst:v32 src0:i16
  v_cvt_i32_i16                      0x06a  vdst:v32 src0:i16
  v_cvt_u32_u16                      0x06b  vdst:v32 src0:i16
""")

VOP2 = _table("""
  v_cndmask_b32                      0x001  vdst:v32 src0:b32 vsrc1:v32 vcc_lo
  v_dot2acc_f32_f16                  0x002  vdst:v32 src0:v2f16 vsrc1:v32
  v_add_f32                          0x003  vdst:v32 src0:b32 vsrc1:v32
  v_sub_f32                          0x004  vdst:v32 src0:b32 vsrc1:v32
  v_subrev_f32                       0x005  vdst:v32 src0:b32 vsrc1:v32
  v_fmac_dx9_zero_f32                0x006  vdst:v32 src0:b32 vsrc1:v32
  v_mul_dx9_zero_f32                 0x007  vdst:v32 src0:b32 vsrc1:v32
  v_mul_f32                          0x008  vdst:v32 src0:b32 vsrc1:v32
  v_mul_i32_i24                      0x009  vdst:v32 src0:b32 vsrc1:v32
  v_mul_hi_i32_i24                   0x00a  vdst:v32 src0:b32 vsrc1:v32
  v_mul_u32_u24                      0x00b  vdst:v32 src0:b32 vsrc1:v32
  v_mul_hi_u32_u24                   0x00c  vdst:v32 src0:b32 vsrc1:v32
  v_min_f32                          0x00f  vdst:v32 src0:b32 vsrc1:v32
  v_max_f32                          0x010  vdst:v32 src0:b32 vsrc1:v32
  v_min_i32                          0x011  vdst:v32 src0:b32 vsrc1:v32
  v_max_i32                          0x012  vdst:v32 src0:b32 vsrc1:v32
  v_min_u32                          0x013  vdst:v32 src0:b32 vsrc1:v32
  v_max_u32                          0x014  vdst:v32 src0:b32 vsrc1:v32
  v_lshlrev_b32                      0x018  vdst:v32 src0:b32 vsrc1:v32
  v_lshrrev_b32                      0x019  vdst:v32 src0:b32 vsrc1:v32
  v_ashrrev_i32                      0x01a  vdst:v32 src0:b32 vsrc1:v32
  v_and_b32                          0x01b  vdst:v32 src0:b32 vsrc1:v32
  v_or_b32                           0x01c  vdst:v32 src0:b32 vsrc1:v32
  v_xor_b32                          0x01d  vdst:v32 src0:b32 vsrc1:v32
  v_xnor_b32                         0x01e  vdst:v32 src0:b32 vsrc1:v32
  v_add_co_ci_u32                    0x020  vdst:v32 vcc_lo src0:b32 vsrc1:v32 vcc_lo
  v_sub_co_ci_u32                    0x021  vdst:v32 vcc_lo src0:b32 vsrc1:v32 vcc_lo
  v_subrev_co_ci_u32                 0x022  vdst:v32 vcc_lo src0:b32 vsrc1:v32 vcc_lo
  v_add_nc_u32                       0x025  vdst:v32 src0:b32 vsrc1:v32
  v_sub_nc_u32                       0x026  vdst:v32 src0:b32 vsrc1:v32
  v_subrev_nc_u32                    0x027  vdst:v32 src0:b32 vsrc1:v32
  v_fmac_f32                         0x02b  vdst:v32 src0:b32 vsrc1:v32
  v_fmamk_f32                        0x02c  vdst:v32 src0:b32 k:k32 vsrc1:v32
  v_fmaak_f32                        0x02d  vdst:v32 src0:b32 vsrc1:v32 k:k32
  v_cvt_pk_rtz_f16_f32               0x02f  vdst:v32 src0:b32 vsrc1:v32
  v_add_f16                          0x032  vdst:v32 src0:f16 vsrc1:v32
  v_sub_f16                          0x033  vdst:v32 src0:f16 vsrc1:v32
  v_subrev_f16                       0x034  vdst:v32 src0:f16 vsrc1:v32
  v_mul_f16                          0x035  vdst:v32 src0:f16 vsrc1:v32
  v_fmac_f16                         0x036  vdst:v32 src0:f16 vsrc1:v32
  v_fmamk_f16                        0x037  vdst:v32 src0:f16 k:k16 vsrc1:v32
  v_fmaak_f16                        0x038  vdst:v32 src0:f16 vsrc1:v32 k:k16
  v_max_f16                          0x039  vdst:v32 src0:f16 vsrc1:v32
  v_min_f16                          0x03a  vdst:v32 src0:f16 vsrc1:v32
  v_ldexp_f16                        0x03b  vdst:v32 src0:f16 vsrc1:v32
  v_pk_fmac_f16                      0x03c  vdst:v32 src0:v2f16 vsrc1:v32
""")

VOPC = _table("""
  v_cmp_f_f16                        0x000  vcc_lo src0:f16 vsrc1:v32
  v_cmp_lt_f16                       0x001  vcc_lo src0:f16 vsrc1:v32
  v_cmp_eq_f16                       0x002  vcc_lo src0:f16 vsrc1:v32
  v_cmp_le_f16                       0x003  vcc_lo src0:f16 vsrc1:v32
  v_cmp_gt_f16                       0x004  vcc_lo src0:f16 vsrc1:v32
  v_cmp_lg_f16                       0x005  vcc_lo src0:f16 vsrc1:v32
  v_cmp_ge_f16                       0x006  vcc_lo src0:f16 vsrc1:v32
  v_cmp_o_f16                        0x007  vcc_lo src0:f16 vsrc1:v32
  v_cmp_u_f16                        0x008  vcc_lo src0:f16 vsrc1:v32
  v_cmp_nge_f16                      0x009  vcc_lo src0:f16 vsrc1:v32
  v_cmp_nlg_f16                      0x00a  vcc_lo src0:f16 vsrc1:v32
  v_cmp_ngt_f16                      0x00b  vcc_lo src0:f16 vsrc1:v32
  v_cmp_nle_f16                      0x00c  vcc_lo src0:f16 vsrc1:v32
  v_cmp_neq_f16                      0x00d  vcc_lo src0:f16 vsrc1:v32
  v_cmp_nlt_f16                      0x00e  vcc_lo src0:f16 vsrc1:v32
  v_cmp_t_f16                        0x00f  vcc_lo src0:f16 vsrc1:v32
  v_cmp_f_f32                        0x010  vcc_lo src0:b32 vsrc1:v32
  v_cmp_lt_f32                       0x011  vcc_lo src0:b32 vsrc1:v32
  v_cmp_eq_f32                       0x012  vcc_lo src0:b32 vsrc1:v32
  v_cmp_le_f32                       0x013  vcc_lo src0:b32 vsrc1:v32
  v_cmp_gt_f32                       0x014  vcc_lo src0:b32 vsrc1:v32
  v_cmp_lg_f32                       0x015  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ge_f32                       0x016  vcc_lo src0:b32 vsrc1:v32
  v_cmp_o_f32                        0x017  vcc_lo src0:b32 vsrc1:v32
  v_cmp_u_f32                        0x018  vcc_lo src0:b32 vsrc1:v32
  v_cmp_nge_f32                      0x019  vcc_lo src0:b32 vsrc1:v32
  v_cmp_nlg_f32                      0x01a  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ngt_f32                      0x01b  vcc_lo src0:b32 vsrc1:v32
  v_cmp_nle_f32                      0x01c  vcc_lo src0:b32 vsrc1:v32
  v_cmp_neq_f32                      0x01d  vcc_lo src0:b32 vsrc1:v32
  v_cmp_nlt_f32                      0x01e  vcc_lo src0:b32 vsrc1:v32
  v_cmp_t_f32                        0x01f  vcc_lo src0:b32 vsrc1:v32
  v_cmp_f_f64                        0x020  vcc_lo src0:f64 vsrc1:v64
  v_cmp_lt_f64                       0x021  vcc_lo src0:f64 vsrc1:v64
  v_cmp_eq_f64                       0x022  vcc_lo src0:f64 vsrc1:v64
  v_cmp_le_f64                       0x023  vcc_lo src0:f64 vsrc1:v64
  v_cmp_gt_f64                       0x024  vcc_lo src0:f64 vsrc1:v64
  v_cmp_lg_f64                       0x025  vcc_lo src0:f64 vsrc1:v64
  v_cmp_ge_f64                       0x026  vcc_lo src0:f64 vsrc1:v64
  v_cmp_o_f64                        0x027  vcc_lo src0:f64 vsrc1:v64
  v_cmp_u_f64                        0x028  vcc_lo src0:f64 vsrc1:v64
  v_cmp_nge_f64                      0x029  vcc_lo src0:f64 vsrc1:v64
  v_cmp_nlg_f64                      0x02a  vcc_lo src0:f64 vsrc1:v64
  v_cmp_ngt_f64                      0x02b  vcc_lo src0:f64 vsrc1:v64
  v_cmp_nle_f64                      0x02c  vcc_lo src0:f64 vsrc1:v64
  v_cmp_neq_f64                      0x02d  vcc_lo src0:f64 vsrc1:v64
  v_cmp_nlt_f64                      0x02e  vcc_lo src0:f64 vsrc1:v64
  v_cmp_t_f64                        0x02f  vcc_lo src0:f64 vsrc1:v64
  v_cmp_lt_i16                       0x031  vcc_lo src0:i16 vsrc1:v32
  v_cmp_eq_i16                       0x032  vcc_lo src0:i16 vsrc1:v32
  v_cmp_le_i16                       0x033  vcc_lo src0:i16 vsrc1:v32
  v_cmp_gt_i16                       0x034  vcc_lo src0:i16 vsrc1:v32
  v_cmp_ne_i16                       0x035  vcc_lo src0:i16 vsrc1:v32
  v_cmp_ge_i16                       0x036  vcc_lo src0:i16 vsrc1:v32
  v_cmp_lt_u16                       0x039  vcc_lo src0:i16 vsrc1:v32
  v_cmp_eq_u16                       0x03a  vcc_lo src0:i16 vsrc1:v32
  v_cmp_le_u16                       0x03b  vcc_lo src0:i16 vsrc1:v32
  v_cmp_gt_u16                       0x03c  vcc_lo src0:i16 vsrc1:v32
  v_cmp_ne_u16                       0x03d  vcc_lo src0:i16 vsrc1:v32
  v_cmp_ge_u16                       0x03e  vcc_lo src0:i16 vsrc1:v32
  v_cmp_f_i32                        0x040  vcc_lo src0:b32 vsrc1:v32
  v_cmp_lt_i32                       0x041  vcc_lo src0:b32 vsrc1:v32
  v_cmp_eq_i32                       0x042  vcc_lo src0:b32 vsrc1:v32
  v_cmp_le_i32                       0x043  vcc_lo src0:b32 vsrc1:v32
  v_cmp_gt_i32                       0x044  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ne_i32                       0x045  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ge_i32                       0x046  vcc_lo src0:b32 vsrc1:v32
  v_cmp_t_i32                        0x047  vcc_lo src0:b32 vsrc1:v32
  v_cmp_f_u32                        0x048  vcc_lo src0:b32 vsrc1:v32
  v_cmp_lt_u32                       0x049  vcc_lo src0:b32 vsrc1:v32
  v_cmp_eq_u32                       0x04a  vcc_lo src0:b32 vsrc1:v32
  v_cmp_le_u32                       0x04b  vcc_lo src0:b32 vsrc1:v32
  v_cmp_gt_u32                       0x04c  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ne_u32                       0x04d  vcc_lo src0:b32 vsrc1:v32
  v_cmp_ge_u32                       0x04e  vcc_lo src0:b32 vsrc1:v32
  v_cmp_t_u32                        0x04f  vcc_lo src0:b32 vsrc1:v32
  v_cmp_f_i64                        0x050  vcc_lo src0:b64 vsrc1:v64
  v_cmp_lt_i64                       0x051  vcc_lo src0:b64 vsrc1:v64
  v_cmp_eq_i64                       0x052  vcc_lo src0:b64 vsrc1:v64
  v_cmp_le_i64                       0x053  vcc_lo src0:b64 vsrc1:v64
  v_cmp_gt_i64                       0x054  vcc_lo src0:b64 vsrc1:v64
  v_cmp_ne_i64                       0x055  vcc_lo src0:b64 vsrc1:v64
  v_cmp_ge_i64                       0x056  vcc_lo src0:b64 vsrc1:v64
  v_cmp_t_i64                        0x057  vcc_lo src0:b64 vsrc1:v64
  v_cmp_f_u64                        0x058  vcc_lo src0:b64 vsrc1:v64
  v_cmp_lt_u64                       0x059  vcc_lo src0:b64 vsrc1:v64
  v_cmp_eq_u64                       0x05a  vcc_lo src0:b64 vsrc1:v64
  v_cmp_le_u64                       0x05b  vcc_lo src0:b64 vsrc1:v64
  v_cmp_gt_u64                       0x05c  vcc_lo src0:b64 vsrc1:v64
  v_cmp_ne_u64                       0x05d  vcc_lo src0:b64 vsrc1:v64
  v_cmp_ge_u64                       0x05e  vcc_lo src0:b64 vsrc1:v64
  v_cmp_t_u64                        0x05f  vcc_lo src0:b64 vsrc1:v64
  v_cmp_class_f16                    0x07d  vcc_lo src0:f16 vsrc1:v32
  v_cmp_class_f32                    0x07e  vcc_lo src0:b32 vsrc1:v32
  v_cmp_class_f64                    0x07f  vcc_lo src0:f64 vsrc1:v32
  v_cmpx_f_f16                       0x080  src0:f16 vsrc1:v32
  v_cmpx_lt_f16                      0x081  src0:f16 vsrc1:v32
  v_cmpx_eq_f16                      0x082  src0:f16 vsrc1:v32
  v_cmpx_le_f16                      0x083  src0:f16 vsrc1:v32
  v_cmpx_gt_f16                      0x084  src0:f16 vsrc1:v32
  v_cmpx_lg_f16                      0x085  src0:f16 vsrc1:v32
  v_cmpx_ge_f16                      0x086  src0:f16 vsrc1:v32
  v_cmpx_o_f16                       0x087  src0:f16 vsrc1:v32
  v_cmpx_u_f16                       0x088  src0:f16 vsrc1:v32
  v_cmpx_nge_f16                     0x089  src0:f16 vsrc1:v32
  v_cmpx_nlg_f16                     0x08a  src0:f16 vsrc1:v32
  v_cmpx_ngt_f16                     0x08b  src0:f16 vsrc1:v32
  v_cmpx_nle_f16                     0x08c  src0:f16 vsrc1:v32
  v_cmpx_neq_f16                     0x08d  src0:f16 vsrc1:v32
  v_cmpx_nlt_f16                     0x08e  src0:f16 vsrc1:v32
  v_cmpx_t_f16                       0x08f  src0:f16 vsrc1:v32
  v_cmpx_f_f32                       0x090  src0:b32 vsrc1:v32
  v_cmpx_lt_f32                      0x091  src0:b32 vsrc1:v32
  v_cmpx_eq_f32                      0x092  src0:b32 vsrc1:v32
  v_cmpx_le_f32                      0x093  src0:b32 vsrc1:v32
  v_cmpx_gt_f32                      0x094  src0:b32 vsrc1:v32
  v_cmpx_lg_f32                      0x095  src0:b32 vsrc1:v32
  v_cmpx_ge_f32                      0x096  src0:b32 vsrc1:v32
  v_cmpx_o_f32                       0x097  src0:b32 vsrc1:v32
  v_cmpx_u_f32                       0x098  src0:b32 vsrc1:v32
  v_cmpx_nge_f32                     0x099  src0:b32 vsrc1:v32
  v_cmpx_nlg_f32                     0x09a  src0:b32 vsrc1:v32
  v_cmpx_ngt_f32                     0x09b  src0:b32 vsrc1:v32
  v_cmpx_nle_f32                     0x09c  src0:b32 vsrc1:v32
  v_cmpx_neq_f32                     0x09d  src0:b32 vsrc1:v32
  v_cmpx_nlt_f32                     0x09e  src0:b32 vsrc1:v32
  v_cmpx_t_f32                       0x09f  src0:b32 vsrc1:v32
  v_cmpx_f_f64                       0x0a0  src0:f64 vsrc1:v64
  v_cmpx_lt_f64                      0x0a1  src0:f64 vsrc1:v64
  v_cmpx_eq_f64                      0x0a2  src0:f64 vsrc1:v64
  v_cmpx_le_f64                      0x0a3  src0:f64 vsrc1:v64
  v_cmpx_gt_f64                      0x0a4  src0:f64 vsrc1:v64
  v_cmpx_lg_f64                      0x0a5  src0:f64 vsrc1:v64
  v_cmpx_ge_f64                      0x0a6  src0:f64 vsrc1:v64
  v_cmpx_o_f64                       0x0a7  src0:f64 vsrc1:v64
  v_cmpx_u_f64                       0x0a8  src0:f64 vsrc1:v64
  v_cmpx_nge_f64                     0x0a9  src0:f64 vsrc1:v64
  v_cmpx_nlg_f64                     0x0aa  src0:f64 vsrc1:v64
  v_cmpx_ngt_f64                     0x0ab  src0:f64 vsrc1:v64
  v_cmpx_nle_f64                     0x0ac  src0:f64 vsrc1:v64
  v_cmpx_neq_f64                     0x0ad  src0:f64 vsrc1:v64
  v_cmpx_nlt_f64                     0x0ae  src0:f64 vsrc1:v64
  v_cmpx_t_f64                       0x0af  src0:f64 vsrc1:v64
  v_cmpx_lt_i16                      0x0b1  src0:i16 vsrc1:v32
  v_cmpx_eq_i16                      0x0b2  src0:i16 vsrc1:v32
  v_cmpx_le_i16                      0x0b3  src0:i16 vsrc1:v32
  v_cmpx_gt_i16                      0x0b4  src0:i16 vsrc1:v32
  v_cmpx_ne_i16                      0x0b5  src0:i16 vsrc1:v32
  v_cmpx_ge_i16                      0x0b6  src0:i16 vsrc1:v32
  v_cmpx_lt_u16                      0x0b9  src0:i16 vsrc1:v32
  v_cmpx_eq_u16                      0x0ba  src0:i16 vsrc1:v32
  v_cmpx_le_u16                      0x0bb  src0:i16 vsrc1:v32
  v_cmpx_gt_u16                      0x0bc  src0:i16 vsrc1:v32
  v_cmpx_ne_u16                      0x0bd  src0:i16 vsrc1:v32
  v_cmpx_ge_u16                      0x0be  src0:i16 vsrc1:v32
  v_cmpx_f_i32                       0x0c0  src0:b32 vsrc1:v32
  v_cmpx_lt_i32                      0x0c1  src0:b32 vsrc1:v32
  v_cmpx_eq_i32                      0x0c2  src0:b32 vsrc1:v32
  v_cmpx_le_i32                      0x0c3  src0:b32 vsrc1:v32
  v_cmpx_gt_i32                      0x0c4  src0:b32 vsrc1:v32
  v_cmpx_ne_i32                      0x0c5  src0:b32 vsrc1:v32
  v_cmpx_ge_i32                      0x0c6  src0:b32 vsrc1:v32
  v_cmpx_t_i32                       0x0c7  src0:b32 vsrc1:v32
  v_cmpx_f_u32                       0x0c8  src0:b32 vsrc1:v32
  v_cmpx_lt_u32                      0x0c9  src0:b32 vsrc1:v32
  v_cmpx_eq_u32                      0x0ca  src0:b32 vsrc1:v32
  v_cmpx_le_u32                      0x0cb  src0:b32 vsrc1:v32
  v_cmpx_gt_u32                      0x0cc  src0:b32 vsrc1:v32
  v_cmpx_ne_u32                      0x0cd  src0:b32 vsrc1:v32
  v_cmpx_ge_u32                      0x0ce  src0:b32 vsrc1:v32
  v_cmpx_t_u32                       0x0cf  src0:b32 vsrc1:v32
  v_cmpx_f_i64                       0x0d0  src0:b64 vsrc1:v64
  v_cmpx_lt_i64                      0x0d1  src0:b64 vsrc1:v64
  v_cmpx_eq_i64                      0x0d2  src0:b64 vsrc1:v64
  v_cmpx_le_i64                      0x0d3  src0:b64 vsrc1:v64
  v_cmpx_gt_i64                      0x0d4  src0:b64 vsrc1:v64
  v_cmpx_ne_i64                      0x0d5  src0:b64 vsrc1:v64
  v_cmpx_ge_i64                      0x0d6  src0:b64 vsrc1:v64
  v_cmpx_t_i64                       0x0d7  src0:b64 vsrc1:v64
  v_cmpx_f_u64                       0x0d8  src0:b64 vsrc1:v64
  v_cmpx_lt_u64                      0x0d9  src0:b64 vsrc1:v64
  v_cmpx_eq_u64                      0x0da  src0:b64 vsrc1:v64
  v_cmpx_le_u64                      0x0db  src0:b64 vsrc1:v64
  v_cmpx_gt_u64                      0x0dc  src0:b64 vsrc1:v64
  v_cmpx_ne_u64                      0x0dd  src0:b64 vsrc1:v64
  v_cmpx_ge_u64                      0x0de  src0:b64 vsrc1:v64
  v_cmpx_t_u64                       0x0df  src0:b64 vsrc1:v64
  v_cmpx_class_f16                   0x0fd  src0:f16 vsrc1:v32
  v_cmpx_class_f32                   0x0fe  src0:b32 vsrc1:v32
  v_cmpx_class_f64                   0x0ff  src0:f64 vsrc1:v32
""")

VOP3 = _table("""
  v_cmp_f_f16                        0x000  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_lt_f16                       0x001  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_eq_f16                       0x002  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_le_f16                       0x003  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_gt_f16                       0x004  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_lg_f16                       0x005  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_ge_f16                       0x006  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_o_f16                        0x007  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_u_f16                        0x008  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_nge_f16                      0x009  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_nlg_f16                      0x00a  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_ngt_f16                      0x00b  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_nle_f16                      0x00c  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_neq_f16                      0x00d  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_nlt_f16                      0x00e  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_t_f16                        0x00f  vdst:s32 src0:f16 src1:f16 | clamp neg abs
  v_cmp_f_f32                        0x010  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_lt_f32                       0x011  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_eq_f32                       0x012  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_le_f32                       0x013  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_gt_f32                       0x014  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_lg_f32                       0x015  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_ge_f32                       0x016  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_o_f32                        0x017  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_u_f32                        0x018  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_nge_f32                      0x019  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_nlg_f32                      0x01a  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_ngt_f32                      0x01b  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_nle_f32                      0x01c  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_neq_f32                      0x01d  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_nlt_f32                      0x01e  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_t_f32                        0x01f  vdst:s32 src0:b32 src1:b32 | clamp neg abs
  v_cmp_f_f64                        0x020  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_lt_f64                       0x021  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_eq_f64                       0x022  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_le_f64                       0x023  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_gt_f64                       0x024  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_lg_f64                       0x025  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_ge_f64                       0x026  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_o_f64                        0x027  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_u_f64                        0x028  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_nge_f64                      0x029  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_nlg_f64                      0x02a  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_ngt_f64                      0x02b  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_nle_f64                      0x02c  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_neq_f64                      0x02d  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_nlt_f64                      0x02e  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_t_f64                        0x02f  vdst:s32 src0:f64 src1:f64 | clamp neg abs
  v_cmp_lt_i16                       0x031  vdst:s32 src0:i16 src1:i16
  v_cmp_eq_i16                       0x032  vdst:s32 src0:i16 src1:i16
  v_cmp_le_i16                       0x033  vdst:s32 src0:i16 src1:i16
  v_cmp_gt_i16                       0x034  vdst:s32 src0:i16 src1:i16
  v_cmp_ne_i16                       0x035  vdst:s32 src0:i16 src1:i16
  v_cmp_ge_i16                       0x036  vdst:s32 src0:i16 src1:i16
  v_cmp_lt_u16                       0x039  vdst:s32 src0:i16 src1:i16
  v_cmp_eq_u16                       0x03a  vdst:s32 src0:i16 src1:i16
  v_cmp_le_u16                       0x03b  vdst:s32 src0:i16 src1:i16
  v_cmp_gt_u16                       0x03c  vdst:s32 src0:i16 src1:i16
  v_cmp_ne_u16                       0x03d  vdst:s32 src0:i16 src1:i16
  v_cmp_ge_u16                       0x03e  vdst:s32 src0:i16 src1:i16
  v_cmp_f_i32                        0x040  vdst:s32 src0:b32 src1:b32
  v_cmp_lt_i32                       0x041  vdst:s32 src0:b32 src1:b32
  v_cmp_eq_i32                       0x042  vdst:s32 src0:b32 src1:b32
  v_cmp_le_i32                       0x043  vdst:s32 src0:b32 src1:b32
  v_cmp_gt_i32                       0x044  vdst:s32 src0:b32 src1:b32
  v_cmp_ne_i32                       0x045  vdst:s32 src0:b32 src1:b32
  v_cmp_ge_i32                       0x046  vdst:s32 src0:b32 src1:b32
  v_cmp_t_i32                        0x047  vdst:s32 src0:b32 src1:b32
  v_cmp_f_u32                        0x048  vdst:s32 src0:b32 src1:b32
  v_cmp_lt_u32                       0x049  vdst:s32 src0:b32 src1:b32
  v_cmp_eq_u32                       0x04a  vdst:s32 src0:b32 src1:b32
  v_cmp_le_u32                       0x04b  vdst:s32 src0:b32 src1:b32
  v_cmp_gt_u32                       0x04c  vdst:s32 src0:b32 src1:b32
  v_cmp_ne_u32                       0x04d  vdst:s32 src0:b32 src1:b32
  v_cmp_ge_u32                       0x04e  vdst:s32 src0:b32 src1:b32
  v_cmp_t_u32                        0x04f  vdst:s32 src0:b32 src1:b32
  v_cmp_f_i64                        0x050  vdst:s32 src0:b64 src1:b64
  v_cmp_lt_i64                       0x051  vdst:s32 src0:b64 src1:b64
  v_cmp_eq_i64                       0x052  vdst:s32 src0:b64 src1:b64
  v_cmp_le_i64                       0x053  vdst:s32 src0:b64 src1:b64
  v_cmp_gt_i64                       0x054  vdst:s32 src0:b64 src1:b64
  v_cmp_ne_i64                       0x055  vdst:s32 src0:b64 src1:b64
  v_cmp_ge_i64                       0x056  vdst:s32 src0:b64 src1:b64
  v_cmp_t_i64                        0x057  vdst:s32 src0:b64 src1:b64
  v_cmp_f_u64                        0x058  vdst:s32 src0:b64 src1:b64
  v_cmp_lt_u64                       0x059  vdst:s32 src0:b64 src1:b64
  v_cmp_eq_u64                       0x05a  vdst:s32 src0:b64 src1:b64
  v_cmp_le_u64                       0x05b  vdst:s32 src0:b64 src1:b64
  v_cmp_gt_u64                       0x05c  vdst:s32 src0:b64 src1:b64
  v_cmp_ne_u64                       0x05d  vdst:s32 src0:b64 src1:b64
  v_cmp_ge_u64                       0x05e  vdst:s32 src0:b64 src1:b64
  v_cmp_t_u64                        0x05f  vdst:s32 src0:b64 src1:b64
  v_cmp_class_f16                    0x07d  vdst:s32 src0:f16 src1:b32 | neg abs
  v_cmp_class_f32                    0x07e  vdst:s32 src0:b32 src1:b32 | neg abs
  v_cmp_class_f64                    0x07f  vdst:s32 src0:f64 src1:b32 | neg abs
  v_cmpx_f_f16                       0x080  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_lt_f16                      0x081  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_eq_f16                      0x082  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_le_f16                      0x083  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_gt_f16                      0x084  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_lg_f16                      0x085  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_ge_f16                      0x086  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_o_f16                       0x087  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_u_f16                       0x088  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_nge_f16                     0x089  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_nlg_f16                     0x08a  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_ngt_f16                     0x08b  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_nle_f16                     0x08c  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_neq_f16                     0x08d  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_nlt_f16                     0x08e  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_t_f16                       0x08f  vdst=126 src0:f16 src1:f16 | clamp neg abs
  v_cmpx_f_f32                       0x090  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_lt_f32                      0x091  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_eq_f32                      0x092  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_le_f32                      0x093  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_gt_f32                      0x094  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_lg_f32                      0x095  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_ge_f32                      0x096  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_o_f32                       0x097  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_u_f32                       0x098  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_nge_f32                     0x099  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_nlg_f32                     0x09a  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_ngt_f32                     0x09b  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_nle_f32                     0x09c  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_neq_f32                     0x09d  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_nlt_f32                     0x09e  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_t_f32                       0x09f  vdst=126 src0:b32 src1:b32 | clamp neg abs
  v_cmpx_f_f64                       0x0a0  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_lt_f64                      0x0a1  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_eq_f64                      0x0a2  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_le_f64                      0x0a3  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_gt_f64                      0x0a4  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_lg_f64                      0x0a5  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_ge_f64                      0x0a6  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_o_f64                       0x0a7  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_u_f64                       0x0a8  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_nge_f64                     0x0a9  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_nlg_f64                     0x0aa  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_ngt_f64                     0x0ab  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_nle_f64                     0x0ac  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_neq_f64                     0x0ad  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_nlt_f64                     0x0ae  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_t_f64                       0x0af  vdst=126 src0:f64 src1:f64 | clamp neg abs
  v_cmpx_lt_i16                      0x0b1  vdst=126 src0:i16 src1:i16
  v_cmpx_eq_i16                      0x0b2  vdst=126 src0:i16 src1:i16
  v_cmpx_le_i16                      0x0b3  vdst=126 src0:i16 src1:i16
  v_cmpx_gt_i16                      0x0b4  vdst=126 src0:i16 src1:i16
  v_cmpx_ne_i16                      0x0b5  vdst=126 src0:i16 src1:i16
  v_cmpx_ge_i16                      0x0b6  vdst=126 src0:i16 src1:i16
  v_cmpx_lt_u16                      0x0b9  vdst=126 src0:i16 src1:i16
  v_cmpx_eq_u16                      0x0ba  vdst=126 src0:i16 src1:i16
  v_cmpx_le_u16                      0x0bb  vdst=126 src0:i16 src1:i16
  v_cmpx_gt_u16                      0x0bc  vdst=126 src0:i16 src1:i16
  v_cmpx_ne_u16                      0x0bd  vdst=126 src0:i16 src1:i16
  v_cmpx_ge_u16                      0x0be  vdst=126 src0:i16 src1:i16
  v_cmpx_f_i32                       0x0c0  vdst=126 src0:b32 src1:b32
  v_cmpx_lt_i32                      0x0c1  vdst=126 src0:b32 src1:b32
  v_cmpx_eq_i32                      0x0c2  vdst=126 src0:b32 src1:b32
  v_cmpx_le_i32                      0x0c3  vdst=126 src0:b32 src1:b32
  v_cmpx_gt_i32                      0x0c4  vdst=126 src0:b32 src1:b32
  v_cmpx_ne_i32                      0x0c5  vdst=126 src0:b32 src1:b32
  v_cmpx_ge_i32                      0x0c6  vdst=126 src0:b32 src1:b32
  v_cmpx_t_i32                       0x0c7  vdst=126 src0:b32 src1:b32
  v_cmpx_f_u32                       0x0c8  vdst=126 src0:b32 src1:b32
  v_cmpx_lt_u32                      0x0c9  vdst=126 src0:b32 src1:b32
  v_cmpx_eq_u32                      0x0ca  vdst=126 src0:b32 src1:b32
  v_cmpx_le_u32                      0x0cb  vdst=126 src0:b32 src1:b32
  v_cmpx_gt_u32                      0x0cc  vdst=126 src0:b32 src1:b32
  v_cmpx_ne_u32                      0x0cd  vdst=126 src0:b32 src1:b32
  v_cmpx_ge_u32                      0x0ce  vdst=126 src0:b32 src1:b32
  v_cmpx_t_u32                       0x0cf  vdst=126 src0:b32 src1:b32
  v_cmpx_f_i64                       0x0d0  vdst=126 src0:b64 src1:b64
  v_cmpx_lt_i64                      0x0d1  vdst=126 src0:b64 src1:b64
  v_cmpx_eq_i64                      0x0d2  vdst=126 src0:b64 src1:b64
  v_cmpx_le_i64                      0x0d3  vdst=126 src0:b64 src1:b64
  v_cmpx_gt_i64                      0x0d4  vdst=126 src0:b64 src1:b64
  v_cmpx_ne_i64                      0x0d5  vdst=126 src0:b64 src1:b64
  v_cmpx_ge_i64                      0x0d6  vdst=126 src0:b64 src1:b64
  v_cmpx_t_i64                       0x0d7  vdst=126 src0:b64 src1:b64
  v_cmpx_f_u64                       0x0d8  vdst=126 src0:b64 src1:b64
  v_cmpx_lt_u64                      0x0d9  vdst=126 src0:b64 src1:b64
  v_cmpx_eq_u64                      0x0da  vdst=126 src0:b64 src1:b64
  v_cmpx_le_u64                      0x0db  vdst=126 src0:b64 src1:b64
  v_cmpx_gt_u64                      0x0dc  vdst=126 src0:b64 src1:b64
  v_cmpx_ne_u64                      0x0dd  vdst=126 src0:b64 src1:b64
  v_cmpx_ge_u64                      0x0de  vdst=126 src0:b64 src1:b64
  v_cmpx_t_u64                       0x0df  vdst=126 src0:b64 src1:b64
  v_cmpx_class_f16                   0x0fd  vdst=126 src0:f16 src1:b32 | neg abs
  v_cmpx_class_f32                   0x0fe  vdst=126 src0:b32 src1:b32 | neg abs
  v_cmpx_class_f64                   0x0ff  vdst=126 src0:f64 src1:b32 | neg abs
  v_cndmask_b32                      0x101  vdst:v32 src0:b32 src1:b32 src2:s32 | neg abs
  v_add_f32                          0x103  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_sub_f32                          0x104  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_subrev_f32                       0x105  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_fmac_dx9_zero_f32                0x106  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_mul_dx9_zero_f32                 0x107  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_mul_f32                          0x108  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_mul_i32_i24                      0x109  vdst:v32 src0:b32 src1:b32 | clamp
  v_mul_hi_i32_i24                   0x10a  vdst:v32 src0:b32 src1:b32
  v_mul_u32_u24                      0x10b  vdst:v32 src0:b32 src1:b32 | clamp
  v_mul_hi_u32_u24                   0x10c  vdst:v32 src0:b32 src1:b32
  v_min_f32                          0x10f  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_max_f32                          0x110  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_min_i32                          0x111  vdst:v32 src0:b32 src1:b32
  v_max_i32                          0x112  vdst:v32 src0:b32 src1:b32
  v_min_u32                          0x113  vdst:v32 src0:b32 src1:b32
  v_max_u32                          0x114  vdst:v32 src0:b32 src1:b32
  v_lshlrev_b32                      0x118  vdst:v32 src0:b32 src1:b32
  v_lshrrev_b32                      0x119  vdst:v32 src0:b32 src1:b32
  v_ashrrev_i32                      0x11a  vdst:v32 src0:b32 src1:b32
  v_and_b32                          0x11b  vdst:v32 src0:b32 src1:b32
  v_or_b32                           0x11c  vdst:v32 src0:b32 src1:b32
  v_xor_b32                          0x11d  vdst:v32 src0:b32 src1:b32
  v_xnor_b32                         0x11e  vdst:v32 src0:b32 src1:b32
  v_add_co_ci_u32                    0x120  vdst:v32 sdst:s32 src0:b32 src1:b32 src2:s32 | clamp
  v_sub_co_ci_u32                    0x121  vdst:v32 sdst:s32 src0:b32 src1:b32 src2:s32 | clamp
  v_subrev_co_ci_u32                 0x122  vdst:v32 sdst:s32 src0:b32 src1:b32 src2:s32 | clamp
  v_add_nc_u32                       0x125  vdst:v32 src0:b32 src1:b32 | clamp
  v_sub_nc_u32                       0x126  vdst:v32 src0:b32 src1:b32 | clamp
  v_subrev_nc_u32                    0x127  vdst:v32 src0:b32 src1:b32 | clamp
  v_fmac_f32                         0x12b  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_cvt_pk_rtz_f16_f32               0x12f  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_add_f16                          0x132  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_sub_f16                          0x133  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_subrev_f16                       0x134  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_mul_f16                          0x135  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_fmac_f16                         0x136  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_max_f16                          0x139  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_min_f16                          0x13a  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_ldexp_f16                        0x13b  vdst:v32 src0:f16 src1:f16 | clamp omod neg abs
  v_mov_b32                          0x181  vdst:v32 src0:b32
  v_cvt_i32_f64                      0x183  vdst:v32 src0:f64 | clamp omod neg abs
  v_cvt_f64_i32                      0x184  vdst:v64 src0:b32 | clamp omod
  v_cvt_f32_i32                      0x185  vdst:v32 src0:b32 | clamp omod
  v_cvt_f32_u32                      0x186  vdst:v32 src0:b32 | clamp omod
  v_cvt_u32_f32                      0x187  vdst:v32 src0:b32 | clamp omod neg abs
  v_cvt_i32_f32                      0x188  vdst:v32 src0:b32 | clamp omod neg abs
  v_cvt_f16_f32                      0x18a  vdst:v32 src0:b32 | clamp omod neg abs
  v_cvt_f32_f16                      0x18b  vdst:v32 src0:f16 | clamp omod neg abs
  v_cvt_nearest_i32_f32              0x18c  vdst:v32 src0:b32 | clamp neg abs
  v_cvt_floor_i32_f32                0x18d  vdst:v32 src0:b32 | clamp neg abs
  v_cvt_off_f32_i4                   0x18e  vdst:v32 src0:b32 | clamp omod
  v_cvt_f32_f64                      0x18f  vdst:v32 src0:f64 | clamp omod neg abs
  v_cvt_f64_f32                      0x190  vdst:v64 src0:b32 | clamp omod neg abs
  v_cvt_f32_ubyte0                   0x191  vdst:v32 src0:b32 | clamp omod
  v_cvt_f32_ubyte1                   0x192  vdst:v32 src0:b32 | clamp omod
  v_cvt_f32_ubyte2                   0x193  vdst:v32 src0:b32 | clamp omod
  v_cvt_f32_ubyte3                   0x194  vdst:v32 src0:b32 | clamp omod
  v_cvt_u32_f64                      0x195  vdst:v32 src0:f64 | clamp omod neg abs
  v_cvt_f64_u32                      0x196  vdst:v64 src0:b32 | clamp omod
  v_trunc_f64                        0x197  vdst:v64 src0:f64 | clamp omod neg abs
  v_ceil_f64                         0x198  vdst:v64 src0:f64 | clamp omod neg abs
  v_rndne_f64                        0x199  vdst:v64 src0:f64 | clamp omod neg abs
  v_floor_f64                        0x19a  vdst:v64 src0:f64 | clamp omod neg abs
  v_fract_f32                        0x1a0  vdst:v32 src0:b32 | clamp omod neg abs
  v_trunc_f32                        0x1a1  vdst:v32 src0:b32 | clamp omod neg abs
  v_ceil_f32                         0x1a2  vdst:v32 src0:b32 | clamp omod neg abs
  v_rndne_f32                        0x1a3  vdst:v32 src0:b32 | clamp omod neg abs
  v_floor_f32                        0x1a4  vdst:v32 src0:b32 | clamp omod neg abs
  v_exp_f32                          0x1a5  vdst:v32 src0:b32 | clamp omod neg abs
  v_log_f32                          0x1a7  vdst:v32 src0:b32 | clamp omod neg abs
  v_rcp_f32                          0x1aa  vdst:v32 src0:b32 | clamp omod neg abs
  v_rcp_iflag_f32                    0x1ab  vdst:v32 src0:b32 | clamp omod neg abs
  v_rsq_f32                          0x1ae  vdst:v32 src0:b32 | clamp omod neg abs
  v_rcp_f64                          0x1af  vdst:v64 src0:f64 | clamp omod neg abs
  v_rsq_f64                          0x1b1  vdst:v64 src0:f64 | clamp omod neg abs
  v_sqrt_f32                         0x1b3  vdst:v32 src0:b32 | clamp omod neg abs
  v_sqrt_f64                         0x1b4  vdst:v64 src0:f64 | clamp omod neg abs
  v_sin_f32                          0x1b5  vdst:v32 src0:b32 | clamp omod neg abs
  v_cos_f32                          0x1b6  vdst:v32 src0:b32 | clamp omod neg abs
  v_not_b32                          0x1b7  vdst:v32 src0:b32
  v_bfrev_b32                        0x1b8  vdst:v32 src0:b32
  v_clz_i32_u32                      0x1b9  vdst:v32 src0:b32
  v_ctz_i32_b32                      0x1ba  vdst:v32 src0:b32
  v_cls_i32                          0x1bb  vdst:v32 src0:b32
  v_frexp_exp_i32_f64                0x1bc  vdst:v32 src0:f64 | clamp omod neg abs
  v_frexp_mant_f64                   0x1bd  vdst:v64 src0:f64 | clamp omod neg abs
  v_fract_f64                        0x1be  vdst:v64 src0:f64 | clamp omod neg abs
  v_frexp_exp_i32_f32                0x1bf  vdst:v32 src0:b32 | clamp neg abs
  v_frexp_mant_f32                   0x1c0  vdst:v32 src0:b32 | clamp omod neg abs
  v_movreld_b32                      0x1c2  vdst:v32 src0:v32
  v_movrels_b32                      0x1c3  vdst:v32 src0:v32
  v_movrelsd_b32                     0x1c4  vdst:v32 src0:v32
  v_movrelsd_2_b32                   0x1c8  vdst:v32 src0:v32
  v_cvt_f16_u16                      0x1d0  vdst:v32 src0:i16 | clamp omod
  v_cvt_f16_i16                      0x1d1  vdst:v32 src0:i16 | clamp omod
  v_cvt_u16_f16                      0x1d2  vdst:v32 src0:f16 | clamp omod neg abs
  v_cvt_i16_f16                      0x1d3  vdst:v32 src0:f16 | clamp omod neg abs
  v_rcp_f16                          0x1d4  vdst:v32 src0:f16 | clamp omod neg abs
  v_sqrt_f16                         0x1d5  vdst:v32 src0:f16 | clamp omod neg abs
  v_rsq_f16                          0x1d6  vdst:v32 src0:f16 | clamp omod neg abs
  v_log_f16                          0x1d7  vdst:v32 src0:f16 | clamp omod neg abs
  v_exp_f16                          0x1d8  vdst:v32 src0:f16 | clamp omod neg abs
  v_frexp_mant_f16                   0x1d9  vdst:v32 src0:f16 | clamp omod neg abs
  v_frexp_exp_i16_f16                0x1da  vdst:v32 src0:f16 | clamp omod neg abs
  v_floor_f16                        0x1db  vdst:v32 src0:f16 | clamp omod neg abs
  v_ceil_f16                         0x1dc  vdst:v32 src0:f16 | clamp omod neg abs
  v_trunc_f16                        0x1dd  vdst:v32 src0:f16 | clamp omod neg abs
  v_rndne_f16                        0x1de  vdst:v32 src0:f16 | clamp omod neg abs
  v_fract_f16                        0x1df  vdst:v32 src0:f16 | clamp omod neg abs
  v_sin_f16                          0x1e0  vdst:v32 src0:f16 | clamp omod neg abs
  v_cos_f16                          0x1e1  vdst:v32 src0:f16 | clamp omod neg abs
  v_sat_pk_u8_i16                    0x1e2  vdst:v32 src0:b32
  v_cvt_norm_i16_f16                 0x1e3  vdst:v32 src0:f16 | clamp omod neg abs
  v_cvt_norm_u16_f16                 0x1e4  vdst:v32 src0:f16 | clamp omod neg abs
  v_not_b16                          0x1e9  vdst:v32 src0:i16
  v_cvt_i32_i16                      0x1ea  vdst:v32 src0:i16
  v_cvt_u32_u16                      0x1eb  vdst:v32 src0:i16
  v_fma_dx9_zero_f32                 0x209  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_mad_i32_i24                      0x20a  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_mad_u32_u24                      0x20b  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_cubeid_f32                       0x20c  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_cubesc_f32                       0x20d  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_cubetc_f32                       0x20e  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_cubema_f32                       0x20f  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_bfe_u32                          0x210  vdst:v32 src0:b32 src1:b32 src2:b32
  v_bfe_i32                          0x211  vdst:v32 src0:b32 src1:b32 src2:b32
  v_bfi_b32                          0x212  vdst:v32 src0:b32 src1:b32 src2:b32
  v_fma_f32                          0x213  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_fma_f64                          0x214  vdst:v64 src0:f64 src1:f64 src2:f64 | clamp omod neg abs
  v_lerp_u8                          0x215  vdst:v32 src0:b32 src1:b32 src2:b32
  v_alignbit_b32                     0x216  vdst:v32 src0:b32 src1:b32 src2:b32
  v_alignbyte_b32                    0x217  vdst:v32 src0:b32 src1:b32 src2:b32
  v_mullit_f32                       0x218  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_min3_f32                         0x219  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_min3_i32                         0x21a  vdst:v32 src0:b32 src1:b32 src2:b32
  v_min3_u32                         0x21b  vdst:v32 src0:b32 src1:b32 src2:b32
  v_max3_f32                         0x21c  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_max3_i32                         0x21d  vdst:v32 src0:b32 src1:b32 src2:b32
  v_max3_u32                         0x21e  vdst:v32 src0:b32 src1:b32 src2:b32
  v_med3_f32                         0x21f  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_med3_i32                         0x220  vdst:v32 src0:b32 src1:b32 src2:b32
  v_med3_u32                         0x221  vdst:v32 src0:b32 src1:b32 src2:b32
  v_sad_u8                           0x222  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_sad_hi_u8                        0x223  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_sad_u16                          0x224  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_sad_u32                          0x225  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_cvt_pk_u8_f32                    0x226  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp neg abs
  v_div_fixup_f32                    0x227  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_div_fixup_f64                    0x228  vdst:v64 src0:f64 src1:f64 src2:f64 | clamp omod neg abs
  v_div_fmas_f32                     0x237  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_div_fmas_f64                     0x238  vdst:v64 src0:f64 src1:f64 src2:f64 | clamp omod neg abs
  v_msad_u8                          0x239  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp
  v_qsad_pk_u16_u8                   0x23a  vdst:v64 src0:b64 src1:b32 src2:b64 | clamp
  v_mqsad_pk_u16_u8                  0x23b  vdst:v64 src0:b64 src1:b32 src2:b64 | clamp
  v_mqsad_u32_u8                     0x23d  vdst:v128 src0:b64 src1:b32 src2:v128 | clamp
  v_xor3_b32                         0x240  vdst:v32 src0:b32 src1:b32 src2:b32
  v_mad_u16                          0x241  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_perm_b32                         0x244  vdst:v32 src0:b32 src1:b32 src2:b32
  v_xad_u32                          0x245  vdst:v32 src0:b32 src1:b32 src2:b32
  v_lshl_add_u32                     0x246  vdst:v32 src0:b32 src1:b32 src2:b32
  v_add_lshl_u32                     0x247  vdst:v32 src0:b32 src1:b32 src2:b32
  v_fma_f16                          0x248  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs op_sel
  v_min3_f16                         0x249  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs op_sel
  v_min3_i16                         0x24a  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_min3_u16                         0x24b  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_max3_f16                         0x24c  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs op_sel
  v_max3_i16                         0x24d  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_max3_u16                         0x24e  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_med3_f16                         0x24f  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs op_sel
  v_med3_i16                         0x250  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_med3_u16                         0x251  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_mad_i16                          0x253  vdst:v32 src0:i16 src1:i16 src2:i16 | clamp op_sel
  v_div_fixup_f16                    0x254  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs op_sel
  v_add3_u32                         0x255  vdst:v32 src0:b32 src1:b32 src2:b32
  v_lshl_or_b32                      0x256  vdst:v32 src0:b32 src1:b32 src2:b32
  v_and_or_b32                       0x257  vdst:v32 src0:b32 src1:b32 src2:b32
  v_or3_b32                          0x258  vdst:v32 src0:b32 src1:b32 src2:b32
  v_mad_u32_u16                      0x259  vdst:v32 src0:i16 src1:i16 src2:b32 | clamp op_sel
  v_mad_i32_i16                      0x25a  vdst:v32 src0:i16 src1:i16 src2:b32 | clamp op_sel
  v_permlane16_b32                   0x25b  vdst:v32 src0:v32 src1:b32 src2:b32 | op_sel
  v_permlanex16_b32                  0x25c  vdst:v32 src0:v32 src1:b32 src2:b32 | op_sel
  v_cndmask_b16                      0x25d  vdst:v32 src0:i16 src1:i16 src2:s32 | neg abs
  v_maxmin_f32                       0x25e  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_minmax_f32                       0x25f  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp omod neg abs
  v_maxmin_f16                       0x260  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs
  v_minmax_f16                       0x261  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp omod neg abs
  v_maxmin_u32                       0x262  vdst:v32 src0:b32 src1:b32 src2:b32
  v_minmax_u32                       0x263  vdst:v32 src0:b32 src1:b32 src2:b32
  v_maxmin_i32                       0x264  vdst:v32 src0:b32 src1:b32 src2:b32
  v_minmax_i32                       0x265  vdst:v32 src0:b32 src1:b32 src2:b32
  v_dot2_f16_f16                     0x266  vdst:v32 src0:v2f16 src1:v2f16 src2:f16 | neg abs op_sel
  v_dot2_bf16_bf16                   0x267  vdst:v32 src0:v2bf16 src1:v2bf16 src2:bf16 | neg abs op_sel
  v_div_scale_f32                    0x2fc  vdst:v32 sdst:s32 src0:b32 src1:b32 src2:b32 | clamp omod neg
  v_div_scale_f64                    0x2fd  vdst:v64 sdst:s32 src0:f64 src1:f64 src2:f64 | clamp omod neg
  v_mad_u64_u32                      0x2fe  vdst:v64 sdst:s32 src0:b32 src1:b32 src2:b64 | clamp
  v_mad_i64_i32                      0x2ff  vdst:v64 sdst:s32 src0:b32 src1:b32 src2:b64 | clamp
  v_add_co_u32                       0x300  vdst:v32 sdst:s32 src0:b32 src1:b32 | clamp
  v_sub_co_u32                       0x301  vdst:v32 sdst:s32 src0:b32 src1:b32 | clamp
  v_subrev_co_u32                    0x302  vdst:v32 sdst:s32 src0:b32 src1:b32 | clamp
  v_add_nc_u16                       0x303  vdst:v32 src0:i16 src1:i16 | clamp op_sel
  v_sub_nc_u16                       0x304  vdst:v32 src0:i16 src1:i16 | clamp op_sel
  v_mul_lo_u16                       0x305  vdst:v32 src0:i16 src1:i16
  v_cvt_pk_i16_f32                   0x306  vdst:v32 src0:b32 src1:b32 | clamp neg abs
  v_cvt_pk_u16_f32                   0x307  vdst:v32 src0:b32 src1:b32 | clamp neg abs
  v_max_u16                          0x309  vdst:v32 src0:i16 src1:i16
  v_max_i16                          0x30a  vdst:v32 src0:i16 src1:i16
  v_min_u16                          0x30b  vdst:v32 src0:i16 src1:i16
  v_min_i16                          0x30c  vdst:v32 src0:i16 src1:i16
  v_add_nc_i16                       0x30d  vdst:v32 src0:i16 src1:i16 | clamp op_sel
  v_sub_nc_i16                       0x30e  vdst:v32 src0:i16 src1:i16 | clamp op_sel
  v_pack_b32_f16                     0x311  vdst:v32 src0:f16 src1:f16 | clamp neg abs op_sel
  v_cvt_pk_norm_i16_f16              0x312  vdst:v32 src0:f16 src1:f16 | clamp neg abs op_sel
  v_cvt_pk_norm_u16_f16              0x313  vdst:v32 src0:f16 src1:f16 | clamp neg abs op_sel
  v_ldexp_f32                        0x31c  vdst:v32 src0:b32 src1:b32 | clamp omod neg abs
  v_bfm_b32                          0x31d  vdst:v32 src0:b32 src1:b32
  v_bcnt_u32_b32                     0x31e  vdst:v32 src0:b32 src1:b32
  v_mbcnt_lo_u32_b32                 0x31f  vdst:v32 src0:b32 src1:b32
  v_mbcnt_hi_u32_b32                 0x320  vdst:v32 src0:b32 src1:b32
  v_cvt_pk_norm_i16_f32              0x321  vdst:v32 src0:b32 src1:b32 | clamp neg abs
  v_cvt_pk_norm_u16_f32              0x322  vdst:v32 src0:b32 src1:b32 | clamp neg abs
  v_cvt_pk_u16_u32                   0x323  vdst:v32 src0:b32 src1:b32
  v_cvt_pk_i16_i32                   0x324  vdst:v32 src0:b32 src1:b32
  v_sub_nc_i32                       0x325  vdst:v32 src0:b32 src1:b32 | clamp
  v_add_nc_i32                       0x326  vdst:v32 src0:b32 src1:b32 | clamp
  v_add_f64                          0x327  vdst:v64 src0:f64 src1:f64 | clamp omod neg abs
  v_mul_f64                          0x328  vdst:v64 src0:f64 src1:f64 | clamp omod neg abs
  v_min_f64                          0x329  vdst:v64 src0:f64 src1:f64 | clamp omod neg abs
  v_max_f64                          0x32a  vdst:v64 src0:f64 src1:f64 | clamp omod neg abs
  v_ldexp_f64                        0x32b  vdst:v64 src0:f64 src1:b32 | clamp omod neg abs
  v_mul_lo_u32                       0x32c  vdst:v32 src0:b32 src1:b32
  v_mul_hi_u32                       0x32d  vdst:v32 src0:b32 src1:b32
  v_mul_hi_i32                       0x32e  vdst:v32 src0:b32 src1:b32
  v_trig_preop_f64                   0x32f  vdst:v64 src0:f64 src1:b32 | clamp omod neg abs
  v_lshlrev_b16                      0x338  vdst:v32 src0:i16 src1:i16
  v_lshrrev_b16                      0x339  vdst:v32 src0:i16 src1:i16
  v_ashrrev_i16                      0x33a  vdst:v32 src0:i16 src1:i16
  v_lshlrev_b64                      0x33c  vdst:v64 src0:b32 src1:b64
  v_lshrrev_b64                      0x33d  vdst:v64 src0:b32 src1:b64
  v_ashrrev_i64                      0x33e  vdst:v64 src0:b32 src1:b64
  v_readlane_b32                     0x360  vdst:s32 src0:v32 src1:n32
  v_writelane_b32                    0x361  vdst:v32 src0:b32 src1:n32
  v_and_b16                          0x362  vdst:v32 src0:i16 src1:i16
  v_or_b16                           0x363  vdst:v32 src0:i16 src1:i16
  v_xor_b16                          0x364  vdst:v32 src0:i16 src1:i16
""")

VOP3P = _table("""
  v_pk_mad_i16                       0x000  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_mul_lo_u16                    0x001  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_add_i16                       0x002  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_sub_i16                       0x003  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_lshlrev_b16                   0x004  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_lshrrev_b16                   0x005  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_ashrrev_i16                   0x006  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_max_i16                       0x007  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_min_i16                       0x008  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_mad_u16                       0x009  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_add_u16                       0x00a  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_sub_u16                       0x00b  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_max_u16                       0x00c  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_min_u16                       0x00d  vdst:v32 src0:b32 src1:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_fma_f16                       0x00e  vdst:v32 src0:v2f16 src1:v2f16 src2:v2f16 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_add_f16                       0x00f  vdst:v32 src0:v2f16 src1:v2f16 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_mul_f16                       0x010  vdst:v32 src0:v2f16 src1:v2f16 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_min_f16                       0x011  vdst:v32 src0:v2f16 src1:v2f16 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_pk_max_f16                       0x012  vdst:v32 src0:v2f16 src1:v2f16 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot2_f32_f16                     0x013  vdst:v32 src0:v2f16 src1:v2f16 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot4_i32_iu8                     0x016  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot4_u32_u8                      0x017  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot8_i32_iu4                     0x018  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot8_u32_u4                      0x019  vdst:v32 src0:b32 src1:b32 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_dot2_f32_bf16                    0x01a  vdst:v32 src0:v2bf16 src1:v2bf16 src2:b32 | clamp op_sel neg_lo neg_hi op_sel_hi
  v_fma_mix_f32                      0x020  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp neg abs op_sel op_sel_hi
  v_fma_mixlo_f16                    0x021  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp neg abs op_sel op_sel_hi
  v_fma_mixhi_f16                    0x022  vdst:v32 src0:f16 src1:f16 src2:f16 | clamp neg abs op_sel op_sel_hi
  v_wmma_f32_16x16x16_f16            0x040  vdst:v256 src0:v256 src1:v256 src2:n256 | neg_lo neg_hi
  v_wmma_f32_16x16x16_bf16           0x041  vdst:v256 src0:v256 src1:v256 src2:n256 | neg_lo neg_hi
  v_wmma_f16_16x16x16_f16            0x042  vdst:v256 src0:v256 src1:v256 src2:n256 | op_sel neg_lo neg_hi op_sel_hi
  v_wmma_bf16_16x16x16_bf16          0x043  vdst:v256 src0:v256 src1:v256 src2:n256 | op_sel neg_lo neg_hi op_sel_hi
  v_wmma_i32_16x16x16_iu8            0x044  vdst:v256 src0:v128 src1:v128 src2:n256 | clamp neg_lo neg_hi
  v_wmma_i32_16x16x16_iu4            0x045  vdst:v256 src0:v64 src1:v64 src2:n256 | clamp neg_lo neg_hi
""")

DS = _table("""
  ds_add_u32                         0x000  addr:v32 data0:v32 | offset gds
  ds_sub_u32                         0x001  addr:v32 data0:v32 | offset gds
  ds_rsub_u32                        0x002  addr:v32 data0:v32 | offset gds
  ds_inc_u32                         0x003  addr:v32 data0:v32 | offset gds
  ds_dec_u32                         0x004  addr:v32 data0:v32 | offset gds
  ds_min_i32                         0x005  addr:v32 data0:v32 | offset gds
  ds_max_i32                         0x006  addr:v32 data0:v32 | offset gds
  ds_min_u32                         0x007  addr:v32 data0:v32 | offset gds
  ds_max_u32                         0x008  addr:v32 data0:v32 | offset gds
  ds_and_b32                         0x009  addr:v32 data0:v32 | offset gds
  ds_or_b32                          0x00a  addr:v32 data0:v32 | offset gds
  ds_xor_b32                         0x00b  addr:v32 data0:v32 | offset gds
  ds_mskor_b32                       0x00c  addr:v32 data0:v32 data1:v32 | offset gds
  ds_store_b32                       0x00d  addr:v32 data0:v32 | offset gds
  ds_store_2addr_b32                 0x00e  addr:v32 data0:v32 data1:v32 | offset0 offset1 gds
  ds_store_2addr_stride64_b32        0x00f  addr:v32 data0:v32 data1:v32 | offset0 offset1 gds
  ds_cmpstore_b32                    0x010  addr:v32 data0:v32 data1:v32 | offset gds
  ds_cmpstore_f32                    0x011  addr:v32 data0:v32 data1:v32 | offset gds
  ds_min_f32                         0x012  addr:v32 data0:v32 | offset gds
  ds_max_f32                         0x013  addr:v32 data0:v32 | offset gds
  ds_nop                             0x014  | offset gds
  ds_add_f32                         0x015  addr:v32 data0:v32 | offset gds
  ds_store_b8                        0x01e  addr:v32 data0:v32 | offset gds
  ds_store_b16                       0x01f  addr:v32 data0:v32 | offset gds
  ds_add_rtn_u32                     0x020  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_sub_rtn_u32                     0x021  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_rsub_rtn_u32                    0x022  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_inc_rtn_u32                     0x023  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_dec_rtn_u32                     0x024  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_min_rtn_i32                     0x025  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_max_rtn_i32                     0x026  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_min_rtn_u32                     0x027  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_max_rtn_u32                     0x028  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_and_rtn_b32                     0x029  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_or_rtn_b32                      0x02a  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_xor_rtn_b32                     0x02b  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_mskor_rtn_b32                   0x02c  vdst:v32 addr:v32 data0:v32 data1:v32 | offset gds
  ds_storexchg_rtn_b32               0x02d  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_storexchg_2addr_rtn_b32         0x02e  vdst:v64 addr:v32 data0:v32 data1:v32 | offset0 offset1 gds
  ds_storexchg_2addr_stride64_rtn_b32 0x02f  vdst:v64 addr:v32 data0:v32 data1:v32 | offset0 offset1 gds
  ds_cmpstore_rtn_b32                0x030  vdst:v32 addr:v32 data0:v32 data1:v32 | offset gds
  ds_cmpstore_rtn_f32                0x031  vdst:v32 addr:v32 data0:v32 data1:v32 | offset gds
  ds_min_rtn_f32                     0x032  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_max_rtn_f32                     0x033  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_wrap_rtn_b32                    0x034  vdst:v32 addr:v32 data0:v32 data1:v32 | offset gds
  ds_load_b32                        0x036  vdst:v32 addr:v32 | offset gds
  ds_load_2addr_b32                  0x037  vdst:v64 addr:v32 | offset0 offset1 gds
  ds_load_2addr_stride64_b32         0x038  vdst:v64 addr:v32 | offset0 offset1 gds
  ds_load_i8                         0x039  vdst:v32 addr:v32 | offset gds
  ds_load_u8                         0x03a  vdst:v32 addr:v32 | offset gds
  ds_load_i16                        0x03b  vdst:v32 addr:v32 | offset gds
  ds_load_u16                        0x03c  vdst:v32 addr:v32 | offset gds
  ds_consume                         0x03d  vdst:v32 | offset gds
  ds_append                          0x03e  vdst:v32 | offset gds
  ds_add_u64                         0x040  addr:v32 data0:v64 | offset gds
  ds_sub_u64                         0x041  addr:v32 data0:v64 | offset gds
  ds_rsub_u64                        0x042  addr:v32 data0:v64 | offset gds
  ds_inc_u64                         0x043  addr:v32 data0:v64 | offset gds
  ds_dec_u64                         0x044  addr:v32 data0:v64 | offset gds
  ds_min_i64                         0x045  addr:v32 data0:v64 | offset gds
  ds_max_i64                         0x046  addr:v32 data0:v64 | offset gds
  ds_min_u64                         0x047  addr:v32 data0:v64 | offset gds
  ds_max_u64                         0x048  addr:v32 data0:v64 | offset gds
  ds_and_b64                         0x049  addr:v32 data0:v64 | offset gds
  ds_or_b64                          0x04a  addr:v32 data0:v64 | offset gds
  ds_xor_b64                         0x04b  addr:v32 data0:v64 | offset gds
  ds_mskor_b64                       0x04c  addr:v32 data0:v64 data1:v64 | offset gds
  ds_store_b64                       0x04d  addr:v32 data0:v64 | offset gds
  ds_store_2addr_b64                 0x04e  addr:v32 data0:v64 data1:v64 | offset0 offset1 gds
  ds_store_2addr_stride64_b64        0x04f  addr:v32 data0:v64 data1:v64 | offset0 offset1 gds
  ds_cmpstore_b64                    0x050  addr:v32 data0:v64 data1:v64 | offset gds
  ds_cmpstore_f64                    0x051  addr:v32 data0:v64 data1:v64 | offset gds
  ds_min_f64                         0x052  addr:v32 data0:v64 | offset gds
  ds_max_f64                         0x053  addr:v32 data0:v64 | offset gds
  ds_add_rtn_u64                     0x060  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_sub_rtn_u64                     0x061  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_rsub_rtn_u64                    0x062  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_inc_rtn_u64                     0x063  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_dec_rtn_u64                     0x064  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_min_rtn_i64                     0x065  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_max_rtn_i64                     0x066  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_min_rtn_u64                     0x067  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_max_rtn_u64                     0x068  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_and_rtn_b64                     0x069  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_or_rtn_b64                      0x06a  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_xor_rtn_b64                     0x06b  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_mskor_rtn_b64                   0x06c  vdst:v64 addr:v32 data0:v64 data1:v64 | offset gds
  ds_storexchg_rtn_b64               0x06d  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_storexchg_2addr_rtn_b64         0x06e  vdst:v128 addr:v32 data0:v64 data1:v64 | offset0 offset1 gds
  ds_storexchg_2addr_stride64_rtn_b64 0x06f  vdst:v128 addr:v32 data0:v64 data1:v64 | offset0 offset1 gds
  ds_cmpstore_rtn_b64                0x070  vdst:v64 addr:v32 data0:v64 data1:v64 | offset gds
  ds_cmpstore_rtn_f64                0x071  vdst:v64 addr:v32 data0:v64 data1:v64 | offset gds
  ds_min_rtn_f64                     0x072  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_max_rtn_f64                     0x073  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_load_b64                        0x076  vdst:v64 addr:v32 | offset gds
  ds_load_2addr_b64                  0x077  vdst:v128 addr:v32 | offset0 offset1 gds
  ds_load_2addr_stride64_b64         0x078  vdst:v128 addr:v32 | offset0 offset1 gds
  ds_add_rtn_f32                     0x079  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_condxchg32_rtn_b64              0x07e  vdst:v64 addr:v32 data0:v64 | offset gds
  ds_store_b8_d16_hi                 0x0a0  addr:v32 data0:v32 | offset gds
  ds_store_b16_d16_hi                0x0a1  addr:v32 data0:v32 | offset gds
  ds_load_u8_d16                     0x0a2  vdst:v32 addr:v32 | offset gds
  ds_load_u8_d16_hi                  0x0a3  vdst:v32 addr:v32 | offset gds
  ds_load_i8_d16                     0x0a4  vdst:v32 addr:v32 | offset gds
  ds_load_i8_d16_hi                  0x0a5  vdst:v32 addr:v32 | offset gds
  ds_load_u16_d16                    0x0a6  vdst:v32 addr:v32 | offset gds
  ds_load_u16_d16_hi                 0x0a7  vdst:v32 addr:v32 | offset gds
  ds_bvh_stack_rtn_b32               0x0ad  vdst:v32 addr:v32 data0:v32 data1:v128 | offset gds
  ds_store_addtid_b32                0x0b0  data0:v32 | offset gds
  ds_load_addtid_b32                 0x0b1  vdst:v32 | offset gds
  ds_permute_b32                     0x0b2  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_bpermute_b32                    0x0b3  vdst:v32 addr:v32 data0:v32 | offset gds
  ds_store_b96                       0x0de  addr:v32 data0:v96 | offset gds
  ds_store_b128                      0x0df  addr:v32 data0:v128 | offset gds
  ds_load_b96                        0x0fe  vdst:v96 addr:v32 | offset gds
  ds_load_b128                       0x0ff  vdst:v128 addr:v32 | offset gds
""")

FLAT = _table("""
  flat_load_u8                       0x010  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_i8                       0x011  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_u16                      0x012  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_i16                      0x013  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_b32                      0x014  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_b64                      0x015  vdst:v64 addr:v64 | offset glc slc dlc
  flat_load_b96                      0x016  vdst:v96 addr:v64 | offset glc slc dlc
  flat_load_b128                     0x017  vdst:v128 addr:v64 | offset glc slc dlc
  flat_store_b8                      0x018  addr:v64 data:v32 | offset glc slc dlc
  flat_store_b16                     0x019  addr:v64 data:v32 | offset glc slc dlc
  flat_store_b32                     0x01a  addr:v64 data:v32 | offset glc slc dlc
  flat_store_b64                     0x01b  addr:v64 data:v64 | offset glc slc dlc
  flat_store_b96                     0x01c  addr:v64 data:v96 | offset glc slc dlc
  flat_store_b128                    0x01d  addr:v64 data:v128 | offset glc slc dlc
  flat_load_d16_u8                   0x01e  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_d16_i8                   0x01f  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_d16_b16                  0x020  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_d16_hi_u8                0x021  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_d16_hi_i8                0x022  vdst:v32 addr:v64 | offset glc slc dlc
  flat_load_d16_hi_b16               0x023  vdst:v32 addr:v64 | offset glc slc dlc
  flat_store_d16_hi_b8               0x024  addr:v64 data:v32 | offset glc slc dlc
  flat_store_d16_hi_b16              0x025  addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_swap_b32               0x033  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_cmpswap_b32            0x034  vdst?:v32 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_add_u32                0x035  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_sub_u32                0x036  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_min_i32                0x038  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_min_u32                0x039  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_max_i32                0x03a  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_max_u32                0x03b  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_and_b32                0x03c  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_or_b32                 0x03d  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_xor_b32                0x03e  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_inc_u32                0x03f  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_dec_u32                0x040  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_swap_b64               0x041  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_cmpswap_b64            0x042  vdst?:v64 addr:v64 data:v128 | offset glc slc dlc
  flat_atomic_add_u64                0x043  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_sub_u64                0x044  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_min_i64                0x045  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_min_u64                0x046  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_max_i64                0x047  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_max_u64                0x048  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_and_b64                0x049  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_or_b64                 0x04a  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_xor_b64                0x04b  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_inc_u64                0x04c  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_dec_u64                0x04d  vdst?:v64 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_cmpswap_f32            0x050  vdst?:v32 addr:v64 data:v64 | offset glc slc dlc
  flat_atomic_min_f32                0x051  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_max_f32                0x052  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
  flat_atomic_add_f32                0x056  vdst?:v32 addr:v64 data:v32 | offset glc slc dlc
""")

GLOBAL = _table("""
  global_load_u8                     0x010  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_i8                     0x011  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_u16                    0x012  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_i16                    0x013  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_b32                    0x014  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_b64                    0x015  vdst:v64 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_b96                    0x016  vdst:v96 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_b128                   0x017  vdst:v128 addr:vaddr saddr:saddr | offset glc slc dlc
  global_store_b8                    0x018  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_store_b16                   0x019  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_store_b32                   0x01a  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_store_b64                   0x01b  addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_store_b96                   0x01c  addr:vaddr data:v96 saddr:saddr | offset glc slc dlc
  global_store_b128                  0x01d  addr:vaddr data:v128 saddr:saddr | offset glc slc dlc
  global_load_d16_u8                 0x01e  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_d16_i8                 0x01f  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_d16_b16                0x020  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_d16_hi_u8              0x021  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_d16_hi_i8              0x022  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_load_d16_hi_b16             0x023  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  global_store_d16_hi_b8             0x024  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_store_d16_hi_b16            0x025  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_load_addtid_b32             0x028  vdst:v32 saddr:saddr | offset glc slc dlc
  global_store_addtid_b32            0x029  data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_swap_b32             0x033  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_cmpswap_b32          0x034  vdst?:v32 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_add_u32              0x035  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_sub_u32              0x036  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_csub_u32             0x037  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_min_i32              0x038  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_min_u32              0x039  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_max_i32              0x03a  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_max_u32              0x03b  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_and_b32              0x03c  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_or_b32               0x03d  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_xor_b32              0x03e  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_inc_u32              0x03f  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_dec_u32              0x040  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_swap_b64             0x041  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_cmpswap_b64          0x042  vdst?:v64 addr:vaddr data:v128 saddr:saddr | offset glc slc dlc
  global_atomic_add_u64              0x043  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_sub_u64              0x044  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_min_i64              0x045  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_min_u64              0x046  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_max_i64              0x047  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_max_u64              0x048  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_and_b64              0x049  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_or_b64               0x04a  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_xor_b64              0x04b  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_inc_u64              0x04c  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_dec_u64              0x04d  vdst?:v64 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_cmpswap_f32          0x050  vdst?:v32 addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  global_atomic_min_f32              0x051  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_max_f32              0x052  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  global_atomic_add_f32              0x056  vdst?:v32 addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
""")

SCRATCH = _table("""
  scratch_load_u8                    0x010  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_i8                    0x011  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_u16                   0x012  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_i16                   0x013  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_b32                   0x014  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_b64                   0x015  vdst:v64 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_b96                   0x016  vdst:v96 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_b128                  0x017  vdst:v128 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_store_b8                   0x018  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  scratch_store_b16                  0x019  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  scratch_store_b32                  0x01a  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  scratch_store_b64                  0x01b  addr:vaddr data:v64 saddr:saddr | offset glc slc dlc
  scratch_store_b96                  0x01c  addr:vaddr data:v96 saddr:saddr | offset glc slc dlc
  scratch_store_b128                 0x01d  addr:vaddr data:v128 saddr:saddr | offset glc slc dlc
  scratch_load_d16_u8                0x01e  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_d16_i8                0x01f  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_d16_b16               0x020  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_d16_hi_u8             0x021  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_d16_hi_i8             0x022  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_load_d16_hi_b16            0x023  vdst:v32 addr:vaddr saddr:saddr | offset glc slc dlc
  scratch_store_d16_hi_b8            0x024  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
  scratch_store_d16_hi_b16           0x025  addr:vaddr data:v32 saddr:saddr | offset glc slc dlc
""")


# ---- operand encodings shared by the assembler and the disassembler (RDNA3 ISA guide,
# "Scalar source operands" / "Vector source operands") ----
SGPR_COUNT = 106                      # s0..s105
TTMP_BASE = 108                       # ttmp0..ttmp15 = 108..123
SPECIAL_SREGS = {"vcc_lo": 106, "vcc_hi": 107, "null": 124, "m0": 125, "exec_lo": 126, "exec_hi": 127}
SPECIAL_SREG_PAIRS = {"vcc": 106, "exec": 126}
SPECIAL_SRCS = {"src_shared_base": 235, "src_shared_limit": 236, "src_private_base": 237,
                "src_private_limit": 238, "src_pops_exiting_wave_id": 239, "src_vccz": 251,
                "src_execz": 252, "src_scc": 253}
INLINE_INT_ZERO = 128                 # 128..192 = 0..64, 193..208 = -1..-16
LITERAL = 255
VGPR_BASE = 256                       # in 9-bit source fields
# inline float constants 240..248: value, and the bit patterns as f16 / f32 / f64
INLINE_FLOATS = {
  240: (0.5, 0x3800, 0x3F000000, 0x3FE0000000000000),
  241: (-0.5, 0xB800, 0xBF000000, 0xBFE0000000000000),
  242: (1.0, 0x3C00, 0x3F800000, 0x3FF0000000000000),
  243: (-1.0, 0xBC00, 0xBF800000, 0xBFF0000000000000),
  244: (2.0, 0x4000, 0x40000000, 0x4000000000000000),
  245: (-2.0, 0xC000, 0xC0000000, 0xC000000000000000),
  246: (4.0, 0x4400, 0x40800000, 0x4010000000000000),
  247: (-4.0, 0xC400, 0xC0800000, 0xC010000000000000),
  248: (0.15915494309189532, 0x3118, 0x3E22F983, 0x3FC45F306DC9C882),   # 1/(2*pi)
}
# how llvm-mc-19 prints 1/(2*pi): with the precision of the operand type
INV_2PI_TEXT = {16: "0.15915494", 32: "0.15915494", 64: "0.15915494309189532"}

# operand kinds whose register is 64 bits wide; 16-bit kinds use a 32-bit register
SRC_KIND_BITS = {"b32": 32, "b64": 64, "f64": 64, "f16": 32, "i16": 32, "bf16": 32, "v2f16": 32,
                 "v2bf16": 32}
# hardware register names for hwreg(...) (llvm-mc-19 disassembly of s_getreg_b32 on gfx1100)
HWREG_NAMES = {1: "HW_REG_MODE", 2: "HW_REG_STATUS", 3: "HW_REG_TRAPSTS", 5: "HW_REG_GPR_ALLOC",
               6: "HW_REG_LDS_ALLOC", 7: "HW_REG_IB_STS", 15: "HW_REG_SH_MEM_BASES",
               18: "HW_REG_PERF_SNAPSHOT_PC_LO", 19: "HW_REG_PERF_SNAPSHOT_PC_HI",
               20: "HW_REG_FLAT_SCR_LO", 21: "HW_REG_FLAT_SCR_HI", 23: "HW_REG_HW_ID1",
               24: "HW_REG_HW_ID2", 27: "HW_REG_PERF_SNAPSHOT_DATA", 29: "HW_REG_SHADER_CYCLES"}
# message ids for sendmsg(...) without an operation (llvm-mc-19 disassembly of s_sendmsg)
SENDMSG_NAMES = {1: "MSG_INTERRUPT", 2: "MSG_HS_TESSFACTOR", 3: "MSG_DEALLOC_VGPRS",
                 5: "MSG_STALL_WAVE_GEN", 6: "MSG_HALT_WAVES", 9: "MSG_GS_ALLOC_REQ"}
# s_waitcnt_depctr fields on gfx11 (name: (low bit, width)), as llvm-mc-19 -mcpu=gfx1100 disassembles them
# (AMDGPU's DepCtr table, AMDGPUAsmUtils.cpp): each field's all-ones value is "no wait"; bits 5-6 are unused
DEPCTR_FIELDS = {"hold_cnt": (7, 1), "sa_sdst": (0, 1), "va_vdst": (12, 4), "va_sdst": (9, 3), "va_ssrc": (8, 1),
                 "va_vcc": (1, 1), "vm_vsrc": (2, 3)}
# s_delay_alu fields: instid0 [3:0], instskip [6:4], instid1 [10:7]
DELAY_INSTID = ["NO_DEP", "VALU_DEP_1", "VALU_DEP_2", "VALU_DEP_3", "VALU_DEP_4", "TRANS32_DEP_1",
                "TRANS32_DEP_2", "TRANS32_DEP_3", "FMA_ACCUM_CYCLE_1", "SALU_CYCLE_1", "SALU_CYCLE_2",
                "SALU_CYCLE_3"]
DELAY_INSTSKIP = ["SAME", "NEXT", "SKIP_1", "SKIP_2", "SKIP_3", "SKIP_4"]
# s_waitcnt fields (gfx11): name -> (lowest bit, width)
WAITCNT_FIELDS = {"vmcnt": (10, 6), "expcnt": (0, 3), "lgkmcnt": (4, 6)}
OMOD = {"mul:2": 1, "mul:4": 2, "div:2": 3}


def _parse(name: str, fmt: str, opcode: int, spec: str) -> Inst:
  ops_text, _, mods_text = spec.partition("|")
  operands, fixed = [], []
  for tok in ops_text.split():
    if "=" in tok:
      fname, value = tok.split("=")
      fixed.append((fname, int(value, 0)))
    elif ":" in tok:
      fname, kind = tok.split(":")
      operands.append(Operand(fname.rstrip("?"), kind, fname.endswith("?")))
    else:
      operands.append(Operand("", tok))
  return Inst(name, fmt, opcode, tuple(operands), tuple(fixed), frozenset(mods_text.split()))


TABLES = {"SOP1": SOP1, "SOP2": SOP2, "SOPK": SOPK, "SOPC": SOPC, "SOPP": SOPP, "SMEM": SMEM,
          "VOP1": VOP1, "VOP2": VOP2, "VOPC": VOPC, "VOP3": VOP3, "VOP3P": VOP3P, "DS": DS,
          "FLAT": FLAT, "GLOBAL": GLOBAL, "SCRATCH": SCRATCH}

# mnemonic -> its encodings, the 32-bit VOP1/VOP2/VOPC form before the VOP3 form
BY_NAME: dict[str, list[Inst]] = {}
# (format, opcode) -> instruction
BY_OPCODE: dict[tuple[str, int], Inst] = {}
for _fmt, _rows in TABLES.items():
  for _name, (_opcode, _spec) in _rows.items():
    _inst = _parse(_name, _fmt, _opcode, _spec)
    BY_NAME.setdefault(_name, []).append(_inst)
    BY_OPCODE[(_fmt, _opcode)] = _inst
for _encodings in BY_NAME.values():
  _encodings.sort(key=lambda inst: inst.fmt in ("VOP3", "VOP3P"))


def is_reg_kind(kind: str) -> bool:
  """s32, v64, ...: an operand that must be a register of that size."""
  return kind[0] in "sv" and kind[1:].isdigit()


def is_sized_kind(kind: str) -> bool:
  """Register kinds and n<bits> (register or inline constant of that size)."""
  return kind[0] in "svn" and kind[1:].isdigit()


def has_e64_pair(name: str) -> bool:
  """True when a VALU mnemonic has both a 32-bit and a VOP3 encoding (printed with _e32/_e64)."""
  fmts = {inst.fmt for inst in BY_NAME.get(name, ())}
  return "VOP3" in fmts and bool(fmts & {"VOP1", "VOP2", "VOPC"})
