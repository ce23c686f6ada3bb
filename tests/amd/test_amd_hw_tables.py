"""The AMD driver's hardware tables (drivers/amd/pm4.py, sdma.py) against a transcription of the primary sources.

pm4.py and sdma.py are shared by the driver and the emulated gfx1100 (drivers/emu/kfd_engines.py decodes with the
same tables), so a wrong constant there round-trips and passes every end-to-end test. This file holds its own copy of
every constant those tables carry, written from the headers below (not from the driver), and compares every entry:
opcodes, the PM4 header layout, register offsets, every field's lowest bit and width, event types, GCR bits, SDMA ops.
Then it pins the packets the driver builds, word for word, against words computed here from the header macros, and
checks that the emulator stops a queue on what it does not model, naming it.

Sources (read at the commits named; each block below says which one it comes from):
  [nvd]    Linux drivers/gpu/drm/amd/amdgpu/nvd.h @ torvalds/linux ead971eec0eb (the PM4 header of gfx10/gfx11, with
           the PACKET3_<PACKET>__<FIELD>(x) field macros that give each field's mask)
  [off]    Linux drivers/gpu/drm/amd/include/asic_reg/gc/gc_11_0_0_offset.h @ torvalds/linux 0e8655b4e852
  [mask]   Linux drivers/gpu/drm/amd/include/asic_reg/gc/gc_11_0_0_sh_mask.h @ raspberrypi/linux 46d03bd22fb5
  [ipoff]  Linux drivers/gpu/drm/amd/include/sienna_cichlid_ip_offset.h @ torvalds/linux 5dcf8655cc80 (GC_BASE)
  [gfx11]  Linux drivers/gpu/drm/amd/amdgpu/gfx_v11_0.c @ torvalds/linux 01163079e136 (ring nop, emit_mem_sync) and
           @ 0d21364c6e8d (gfx_v11_0_wait_reg_mem, gfx_v11_0_ring_emit_hdp_flush)
  [sdma]   Linux drivers/gpu/drm/amd/amdgpu/sdma_v6_0_0_pkt_open.h @ torvalds/linux 446279168e03
  [sdmac]  Linux drivers/gpu/drm/amd/amdgpu/sdma_v6_0.c @ torvalds/linux 0410c6121529 (sdma_v6_0_buffer_funcs) and
           @ 21a550de5faf (sdma_v6_0_ring_emit_fence, sdma_v6_0_ring_emit_hdp_flush)
  [nbio]   Linux drivers/gpu/drm/amd/amdgpu/nbio_v4_3.c @ torvalds/linux d5984d29afdb (get_hdp_flush_req/done_offset,
           nbio_v4_3_hdp_flush_reg); include/asic_reg/nbio/nbio_4_3_0_offset.h @ torvalds/linux 446279168e03;
           include/asic_reg/nbio/nbio_4_3_0_sh_mask.h @ raspberrypi/linux 656a52a8fc04 (GPU_HDP_FLUSH_REQ bits)
  [usage]  LLVM AMDGPUUsage.rst, compute_pgm_rsrc1 table: PRIV (bit 20) "CP is responsible for filling in"
  [mesa]   Mesa src/gallium/drivers/radeonsi/si_cp_dma.c @ bminor/mesa-mesa 4989b6e6b95a and src/amd/vulkan/radv_cp_dma.c
           @ bminor/mesa-mesa 3ccb48ec460d (cp_dma_max_byte_count: the CP DMA bytes per DMA_DATA packet on GFX11)
  [cik]    Linux drivers/gpu/drm/radeon/cikd.h @ torvalds/linux 8d4ad9d4bb0a (SDMA POLL_REG_MEM FUNC values)
  [pal]    AMD PAL (GPUOpen-Drivers/pal) @ c5e800072a32, 2025-04-29, src/core/hw/gfxip/gfx9/chip/:
           gfx9_plus_merged_f32_mec_pm4_packets.h (PM4_MEC_* bitfields and *_SIZEDW__CORE), gfx9_plus_merged_offset.h
           (absolute mm* dword addresses), gfx9_plus_merged_enum.h (VGT_EVENT_TYPE); gfx9/gfx9CmdUtil.h
           (PM4_ME_NON_SAMPLE_EVENT_WRITE: a 2-dword EVENT_WRITE); sdma/gfx10/gfx10_merged_sdma_packets.h (cross-check)
"""
import types

import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.drivers.amd import pm4, sdma


# ==== transcription ====================================================================================================

# ---- [nvd] PM4 type-3 header: PACKET3(op, n) = (PACKET_TYPE3 << 30) | ((op) & 0xFF) << 8 | ((n) & 0x3FFF) << 16,
#      PACKET3_COMPUTE(op, n) = PACKET3(op, n) | 1 << 1; CP_PACKET_GET_COUNT(h) = ((h) >> 16) & 0x3FFF,
#      CP_PACKET3_GET_OPCODE(h) = ((h) >> 8) & 0xFF, CP_PACKET_GET_TYPE(h) = ((h) >> 30) & 3
PACKET_TYPE3, PACKET3_COMPUTE_BIT = 3, 1


def PACKET3(op, n): return (PACKET_TYPE3 << 30) | (op & 0xFF) << 8 | (n & 0x3FFF) << 16
def PACKET3_COMPUTE(op, n): return PACKET3(op, n) | 1 << PACKET3_COMPUTE_BIT


# ---- [nvd] opcodes (#define PACKET3_<NAME>)
PACKET3_OPCODES = {
  "NOP": 0x10, "DISPATCH_DIRECT": 0x15, "WRITE_DATA": 0x37, "WAIT_REG_MEM": 0x3C, "INDIRECT_BUFFER": 0x3F,
  "EVENT_WRITE": 0x46, "RELEASE_MEM": 0x49, "DMA_DATA": 0x50, "ACQUIRE_MEM": 0x58, "SET_SH_REG": 0x76,
  "WAIT_REG_MEM64": 0x93,
}
# ---- [nvd] #define PACKET3_SET_SH_REG_START 0x00002c00, PACKET3_SET_SH_REG_END 0x00003000;
#      PACKET3_SET_SH_REG__REG_OFFSET(x) ((((unsigned)(x)) & 0xFFFF) << 0)  ([pal] PM4_MEC_SET_SH_REG reg_offset : 16)
SET_SH_REG_START, SET_SH_REG_END, SET_SH_REG_OFFSET_BITS = 0x2C00, 0x3000, 16
# ---- [gfx11] gfx_v11_0_ring_funcs_compute .nop = PACKET3(PACKET3_NOP, 0x3FFF): the one-dword NOP
NOP_ONE_DWORD_COUNT = 0x3FFF

# ---- [off] #define regCOMPUTE_* (every one _BASE_IDX 0)
GC11_REG = {
  "COMPUTE_DISPATCH_INITIATOR": 0x1ba0, "COMPUTE_DIM_X": 0x1ba1, "COMPUTE_DIM_Y": 0x1ba2, "COMPUTE_DIM_Z": 0x1ba3,
  "COMPUTE_START_X": 0x1ba4, "COMPUTE_START_Y": 0x1ba5, "COMPUTE_START_Z": 0x1ba6, "COMPUTE_NUM_THREAD_X": 0x1ba7,
  "COMPUTE_NUM_THREAD_Y": 0x1ba8, "COMPUTE_NUM_THREAD_Z": 0x1ba9, "COMPUTE_PGM_LO": 0x1bac, "COMPUTE_PGM_HI": 0x1bad,
  "COMPUTE_DISPATCH_SCRATCH_BASE_LO": 0x1bb0, "COMPUTE_DISPATCH_SCRATCH_BASE_HI": 0x1bb1, "COMPUTE_PGM_RSRC1": 0x1bb2,
  "COMPUTE_PGM_RSRC2": 0x1bb3, "COMPUTE_RESOURCE_LIMITS": 0x1bb5, "COMPUTE_TMPRING_SIZE": 0x1bb8,
  "COMPUTE_RESTART_X": 0x1bbb, "COMPUTE_RESTART_Y": 0x1bbc, "COMPUTE_RESTART_Z": 0x1bbd, "COMPUTE_PGM_RSRC3": 0x1bc8,
  "COMPUTE_USER_DATA_0": 0x1be0, "COMPUTE_USER_DATA_1": 0x1be1, "COMPUTE_USER_DATA_2": 0x1be2,
  "COMPUTE_USER_DATA_3": 0x1be3, "COMPUTE_USER_DATA_4": 0x1be4, "COMPUTE_USER_DATA_5": 0x1be5,
  "COMPUTE_USER_DATA_6": 0x1be6, "COMPUTE_USER_DATA_7": 0x1be7, "COMPUTE_USER_DATA_8": 0x1be8,
  "COMPUTE_USER_DATA_9": 0x1be9, "COMPUTE_USER_DATA_10": 0x1bea, "COMPUTE_USER_DATA_11": 0x1beb,
  "COMPUTE_USER_DATA_12": 0x1bec, "COMPUTE_USER_DATA_13": 0x1bed, "COMPUTE_USER_DATA_14": 0x1bee,
  "COMPUTE_USER_DATA_15": 0x1bef,
}
# ---- [ipoff] static const struct IP_BASE GC_BASE = { { { { 0x00001260, 0x0000A000, 0x0001C000, 0x02402C00, 0 } }, ...
GC_BASE_IDX0 = 0x1260
# ---- [pal] gfx9_plus_merged_offset.h constexpr unsigned int mmCOMPUTE_* (absolute dword addresses, gfx9..gfx11):
#      an independent check that register + GC_BASE_IDX0 lands where SET_SH_REG_START + offset addresses
PAL_MM = {
  "COMPUTE_DISPATCH_INITIATOR": 0x2E00, "COMPUTE_DIM_X": 0x2E01, "COMPUTE_DIM_Y": 0x2E02, "COMPUTE_DIM_Z": 0x2E03,
  "COMPUTE_START_X": 0x2E04, "COMPUTE_START_Y": 0x2E05, "COMPUTE_START_Z": 0x2E06, "COMPUTE_NUM_THREAD_X": 0x2E07,
  "COMPUTE_NUM_THREAD_Y": 0x2E08, "COMPUTE_NUM_THREAD_Z": 0x2E09, "COMPUTE_PGM_LO": 0x2E0C, "COMPUTE_PGM_HI": 0x2E0D,
  "COMPUTE_DISPATCH_SCRATCH_BASE_LO": 0x2E10, "COMPUTE_DISPATCH_SCRATCH_BASE_HI": 0x2E11, "COMPUTE_PGM_RSRC1": 0x2E12,
  "COMPUTE_PGM_RSRC2": 0x2E13, "COMPUTE_RESOURCE_LIMITS": 0x2E15, "COMPUTE_TMPRING_SIZE": 0x2E18,
  "COMPUTE_RESTART_X": 0x2E1B, "COMPUTE_RESTART_Y": 0x2E1C, "COMPUTE_RESTART_Z": 0x2E1D, "COMPUTE_PGM_RSRC3": 0x2E28,
  **{f"COMPUTE_USER_DATA_{i}": 0x2E40 + i for i in range(16)},     # mmCOMPUTE_USER_DATA_0 .. _15 = 0x2E40 .. 0x2E4F
}

# ---- [mask] COMPUTE_DISPATCH_INITIATOR__<FIELD>__SHIFT / _MASK, COMPUTE_TMPRING_SIZE__<FIELD>__SHIFT / _MASK
#      as (shift, mask) the way the header writes them
DISPATCH_INITIATOR_MASKS = {"compute_shader_en": (0x0, 0x00000001), "partial_tg_en": (0x1, 0x00000002),
                            "force_start_at_000": (0x2, 0x00000004), "order_mode": (0x6, 0x00000040),
                            "cs_w32_en": (0xf, 0x00008000)}
TMPRING_SIZE_MASKS = {"waves": (0x0, 0x00000FFF), "wavesize": (0xc, 0x07FFF000)}

# ---- [pal] gfx9_plus_merged_enum.h enum VGT_EVENT_TYPE
CS_PARTIAL_FLUSH, CACHE_FLUSH_AND_INV_TS_EVENT, BOTTOM_OF_PIPE_TS = 0x00000007, 0x00000014, 0x00000028
# ---- [nvd] EVENT_INDEX comment "4 - *S_PARTIAL_FLUSH"; [pal] event_index__mec_release_mem__end_of_pipe = 5
EVENT_INDEX_PARTIAL_FLUSH, EVENT_INDEX_END_OF_PIPE = 4, 5
# ---- [nvd] WAIT_REG_MEM_FUNCTION comment: 0 - always, 1 - <, 2 - <=, 3 - ==, 4 - !=, 5 - >=, 6 - >
WAIT_FUNCTION = {"always": 0, "<": 1, "<=": 2, "==": 3, "!=": 4, ">=": 5, ">": 6}
# ---- [nvd] PACKET3_RELEASE_MEM_DATA_SEL comment: 0 discard, 1 low 32 bit, 2 64 bit, 3 64 bit GPU counter, 4 sys counter
DATA_SEL = {"NONE": 0, "32": 1, "64": 2, "GPU_CLOCK": 3, "SYS_CLOCK": 4}
# ---- [nvd] PACKET3_RELEASE_MEM_INT_SEL comment: 0 none, 1 interrupt only (DATA_SEL = 0), 2 interrupt when confirmed
INT_SEL = {"NONE": 0, "INT_ONLY": 1, "AFTER_WRITE": 2}
# ---- [nvd] WAIT_REG_MEM_MEM_SPACE(x) << 4 "0 - reg 1 - mem"; WAIT_REG_MEM_OPERATION(x) << 6 "0 - wait_reg_mem
#      1 - wr_wait_wr_reg"; WAIT_REG_MEM_ENGINE(x) << 8 "0 - me 1 - pfp"
def WAIT_REG_MEM_FUNCTION(x): return x << 0
def WAIT_REG_MEM_MEM_SPACE(x): return x << 4
def WAIT_REG_MEM_OPERATION(x): return x << 6
def WAIT_REG_MEM_ENGINE(x): return x << 8
# ---- [nbio] regBIF_BX_PF0_GPU_HDP_FLUSH_REQ 0x0106 / _DONE 0x0107, both _BASE_IDX 2; [ipoff] NBIO_BASE =
#      { 0x00000000, 0x00000014, 0x00000D20, ... }: segment 2 is 0x00000D20
NBIO_BASE_SEG2 = 0x00000D20
regBIF_BX_PF0_GPU_HDP_FLUSH_REQ, regBIF_BX_PF0_GPU_HDP_FLUSH_DONE = 0x0106, 0x0107
# ---- [nbio] GPU_HDP_FLUSH_REQ__CP0__SHIFT 0x0 .. __CP9__SHIFT 0x9, __SDMA0__SHIFT 0xa, __SDMA1__SHIFT 0xb
HDP_FLUSH_SHIFT = {**{f"cp{i}": i for i in range(10)}, "sdma0": 0xa, "sdma1": 0xb}
# ---- [gfx11] gfx_v11_0_ring_emit_hdp_flush: compute ring on me 1: ref_and_mask_cp2 << pipe, me 2: ref_and_mask_cp6
#      << pipe (4 pipes each); [sdmac] sdma_v6_0_ring_emit_hdp_flush: ref_and_mask_sdma0 << ring->me (2 engines)
HDP_COMPUTE_MASK = sum(1 << (HDP_FLUSH_SHIFT[cp] + pipe) for cp in ("cp2", "cp6") for pipe in range(4))
HDP_SDMA_MASK = sum(1 << (HDP_FLUSH_SHIFT["sdma0"] + me) for me in range(2))
# ---- [usage] COMPUTE_PGM_RSRC1 bit 20 PRIV
RSRC1_PRIV_BIT = 20
# ---- [sdmac] sdma_v6_0_ring_emit_fence: SDMA_PKT_FENCE_HEADER_MTYPE(0x3) /* Ucached(UC) */
FENCE_MTYPE_UC = 3


def address(reserved_low_bits):
  """An address-low dword: the source's field is bits [31:reserved_low_bits] of the address (its low bits
  reserved); the driver holds the whole dword as one 32-bit field and keeps those low bits zero itself."""
  return ("address", reserved_low_bits)


# ---- packet bodies: one {field: (lowest bit, width)} per dword after the header. Shifts from [nvd]'s macros; widths
#      from [nvd]'s PACKET3_<P>__<F>(x) masks where it has one, else from [pal]'s PM4_MEC_<P> bitfields
PM4_PACKETS = {
  # [pal] PM4_MEC_DISPATCH_DIRECT: dim_x, dim_y, dim_z, dispatch_initiator (COMPUTE_DISPATCH_INITIATOR, [mask])
  "DISPATCH_DIRECT": [{"dim_x": (0, 32)}, {"dim_y": (0, 32)}, {"dim_z": (0, 32)},
                      {"compute_shader_en": (0, 1), "partial_tg_en": (1, 1), "force_start_at_000": (2, 1),
                       "order_mode": (6, 1), "cs_w32_en": (15, 1)}],
  # [nvd] PACKET3_WAIT_REG_MEM__FUNCTION & 0x7 << 0, __MEM_SPACE & 0x3 << 4, __OPERATION & 0x3 << 6,
  #       WAIT_REG_MEM_ENGINE(x) << 8 ([pal] PM4_PFP_WAIT_REG_MEM engine_sel : 2), __MEM_POLL_ADDR_LO & 0x3FFFFFFF << 2,
  #       __MEM_POLL_ADDR_HI, __REFERENCE, __MASK (32 bits), __POLL_INTERVAL & 0xFFFF,
  #       __OPTIMIZE_ACE_OFFLOAD_MODE & 0x1 << 31
  "WAIT_REG_MEM": [{"function": (0, 3), "mem_space": (4, 2), "operation": (6, 2), "engine": (8, 2)},
                   {"addr_lo": address(2)}, {"addr_hi": (0, 32)}, {"reference": (0, 32)}, {"mask": (0, 32)},
                   {"poll_interval": (0, 16), "optimize_ace_offload_mode": (31, 1)}],
  # [pal] PM4_MEC_WAIT_REG_MEM64: function:3 @0, mem_space:2 @4, operation:2 @6, cache_policy:2 @25;
  #       reserved1:3 + mem_poll_addr_lo:29; mem_poll_addr_hi; reference; reference_hi; mask; mask_hi;
  #       poll_interval:16, reserved:15, optimize_ace_offload_mode:1
  "WAIT_REG_MEM64": [{"function": (0, 3), "mem_space": (4, 2), "operation": (6, 2), "cache_policy": (25, 2)},
                     {"addr_lo": address(3)}, {"addr_hi": (0, 32)}, {"reference": (0, 32)}, {"reference_hi": (0, 32)},
                     {"mask": (0, 32)}, {"mask_hi": (0, 32)},
                     {"poll_interval": (0, 16), "optimize_ace_offload_mode": (31, 1)}],
  # [nvd] PACKET3_INDIRECT_BUFFER__IB_BASE_LO & 0x3FFFFFFF << 2, __IB_BASE_HI (32 bits), __IB_SIZE & 0xFFFFF,
  #       __CHAIN & 1 << 20, INDIRECT_BUFFER_PRE_ENB(x) << 21, INDIRECT_BUFFER_VALID (1 << 23), __VMID & 0xF << 24,
  #       __CACHE_POLICY & 0x3 << 28, INDIRECT_BUFFER_PRE_RESUME(x) << 30
  "INDIRECT_BUFFER": [{"ib_base_lo": address(2)}, {"ib_base_hi": (0, 32)},
                      {"ib_size": (0, 20), "chain": (20, 1), "pre_ena": (21, 1), "valid": (23, 1), "vmid": (24, 4),
                       "cache_policy": (28, 2), "pre_resume": (30, 1)}],
  # [nvd] PACKET3_EVENT_WRITE__EVENT_TYPE & 0x3F << 0, __EVENT_INDEX & 0xF << 8; [pal] a non-sample event is 2 dwords
  "EVENT_WRITE": [{"event_type": (0, 6), "event_index": (8, 4)}],
  # [nvd] PACKET3_RELEASE_MEM_EVENT_TYPE(x) << 0, _EVENT_INDEX(x) << 8, _GCR_GLM_WB (1 << 12) .. _GCR_SEQ (1 << 22),
  #       _CACHE_POLICY(x) << 25, _EXECUTE (1 << 28); _DST_SEL(x) << 16, _INT_SEL(x) << 24, _DATA_SEL(x) << 29;
  #       widths [pal] PM4_MEC_RELEASE_MEM: event_type:6, event_index:4, cache_policy:2, dst_sel:2, int_sel:3,
  #       data_sel:3, address_lo_32b:30 after 2 reserved bits, address_hi, data_lo, data_hi, int_ctxid
  "RELEASE_MEM": [{"event_type": (0, 6), "event_index": (8, 4), "gcr_glm_wb": (12, 1), "gcr_glm_inv": (13, 1),
                   "gcr_glv_inv": (14, 1), "gcr_gl1_inv": (15, 1), "gcr_gl2_us": (16, 1), "gcr_gl2_range": (17, 1),
                   "gcr_gl2_discard": (19, 1), "gcr_gl2_inv": (20, 1), "gcr_gl2_wb": (21, 1), "gcr_seq": (22, 1),
                   "cache_policy": (25, 2), "execute": (28, 1)},
                  {"dst_sel": (16, 2), "int_sel": (24, 3), "data_sel": (29, 3)},
                  {"addr_lo": address(2)}, {"addr_hi": (0, 32)}, {"data_lo": (0, 32)}, {"data_hi": (0, 32)},
                  {"int_ctxid": (0, 32)}],
  # [nvd] ACQUIRE_MEM: "2. COHER_CNTL [30:0] 2.1 ENGINE_SEL [31:31]", __COHER_SIZE (32), __COHER_SIZE_HI & 0xFF,
  #       __COHER_BASE_LO (32), __COHER_BASE_HI & 0xFFFFFF, __POLL_INTERVAL & 0xFFFF, GCR_CNTL [18:0] (below)
  "ACQUIRE_MEM": [{"coher_cntl": (0, 31), "engine_sel": (31, 1)}, {"coher_size": (0, 32)}, {"coher_size_hi": (0, 8)},
                  {"coher_base": (0, 32)}, {"coher_base_hi": (0, 24)}, {"poll_interval": (0, 16)}, "GCR_CNTL"],
  # [nvd] PACKET3_DMA_DATA_ENGINE(x) << 0 ([pal] PFP engine_sel : 1), _SRC_CACHE_POLICY(x) << 13, _DST_SEL(x) << 20,
  #       _DST_CACHE_POLICY(x) << 25, _SRC_SEL(x) << 29, _CP_SYNC (1 << 31); COMMAND [31:26] | BYTE_COUNT [25:0]:
  #       _CMD_SAS 1 << 26, _CMD_DAS 1 << 27, _CMD_SAIC 1 << 28, _CMD_DAIC 1 << 29, _CMD_RAW_WAIT 1 << 30;
  #       widths and the address dwords from [pal] PM4_MEC_DMA_DATA (src_cache_policy:2, dst_sel:2, dst_cache_policy:2,
  #       src_sel:2, src_addr_lo_or_data/src_addr_hi/dst_addr_lo/dst_addr_hi : 32, byte_count:26, ..., dis_wc:1 @31)
  "DMA_DATA": [{"engine": (0, 1), "src_cache_policy": (13, 2), "dst_sel": (20, 2), "dst_cache_policy": (25, 2),
                "src_sel": (29, 2), "cp_sync": (31, 1)},
               {"src_addr_lo": (0, 32)}, {"src_addr_hi": (0, 32)}, {"dst_addr_lo": (0, 32)}, {"dst_addr_hi": (0, 32)},
               {"byte_count": (0, 26), "sas": (26, 1), "das": (27, 1), "saic": (28, 1), "daic": (29, 1),
                "raw_wait": (30, 1), "dis_wc": (31, 1)}],
}
# ---- [nvd] PACKET3_ACQUIRE_MEM_GCR_CNTL_GLI_INV(x) << 0 (0 NOP, 1 ALL, 2 RANGE, 3 FIRST_LAST: 2 bits), _GL1_RANGE(x)
#      << 2 (2 bits), _GLM_WB << 4, _GLM_INV << 5, _GLK_WB << 6, _GLK_INV << 7, _GLV_INV << 8, _GL1_INV << 9,
#      _GL2_US << 10, _GL2_RANGE(x) << 11 (2 bits), _GL2_DISCARD << 13, _GL2_INV << 14, _GL2_WB << 15, _SEQ(x) << 16
#      (0 parallel, 1 forward, 2 reverse: 2 bits), PACKET3_ACQUIRE_MEM_GCR_RANGE_IS_PA (1 << 18); the same layout as
#      [sdma]'s SDMA_GCR_* macros
GCR_CNTL = {"gli_inv": (0, 2), "gl1_range": (2, 2), "glm_wb": (4, 1), "glm_inv": (5, 1), "glk_wb": (6, 1),
            "glk_inv": (7, 1), "glv_inv": (8, 1), "gl1_inv": (9, 1), "gl2_us": (10, 1), "gl2_range": (11, 2),
            "gl2_discard": (13, 1), "gl2_inv": (14, 1), "gl2_wb": (15, 1), "seq": (16, 2), "range_is_pa": (18, 1)}
# ---- [mesa] cp_dma_max_byte_count(): `max = gfx_level >= GFX11 ? 32767 : ...` (not the 26-bit BYTE_COUNT field's limit),
#      `return max & ~(SI_CPDMA_ALIGNMENT - 1)` with #define SI_CPDMA_ALIGNMENT 32 (radv_cp_dma.c)
CP_DMA_MAX_BYTE_COUNT_GFX11, SI_CPDMA_ALIGNMENT = 32767, 32
CP_DMA_MAX_BYTES = CP_DMA_MAX_BYTE_COUNT_GFX11 & ~(SI_CPDMA_ALIGNMENT - 1)
# ---- [pal] PM4_MEC_<P>_SIZEDW__CORE (header included); EVENT_WRITE: [pal] PM4_ME_NON_SAMPLE_EVENT_WRITE (header +
#      ordinal2); [gfx11] PACKET3(PACKET3_ACQUIRE_MEM, 6) and a RELEASE_MEM fence of 8 dwords
PM4_SIZEDW = {"DISPATCH_DIRECT": 5, "WAIT_REG_MEM": 7, "WAIT_REG_MEM64": 9, "INDIRECT_BUFFER": 4, "EVENT_WRITE": 2,
              "RELEASE_MEM": 8, "ACQUIRE_MEM": 8, "DMA_DATA": 7}

# Where the driver's table knowingly differs from the sources: (packet, dword, field) -> (bit, width). None today:
# COHER_SIZE_HI is 8 bits ([nvd] COHER_SIZE_HI [7:0]; [pal] coher_size_hi : 8) and the barrier writes 0xff there
# (amdgpu's gfx_v11_0_emit_mem_sync writes 0xffffff, reserved bits included).
KNOWN_DEVIATIONS: dict = {}

# ---- [sdma] #define SDMA_OP_* / SDMA_SUBOP_*
SDMA_OP = {"NOP": 0, "COPY": 1, "WRITE": 2, "INDIRECT": 4, "FENCE": 5, "TRAP": 6, "POLL_REGMEM": 8, "COND_EXE": 9,
           "ATOMIC": 10, "CONST_FILL": 11, "TIMESTAMP": 13}
SDMA_SUBOP_COPY_LINEAR, SDMA_SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
# ---- [sdma] SDMA_PKT_<P>_<WORD>_<field>_{offset,mask,shift}: dword offset, then (shift, width of mask) per field.
#      HEADER op mask 0xFF shift 0, sub_op mask 0xFF shift 8 in every packet; packets without an SDMA_SUBOP_* use 0
SDMA_HEADER = {"op": (0, 8), "sub_op": (8, 8)}
SDMA_PACKETS = {  # name: (SDMA_OP_*, sub_op, dwords)
  # SDMA_PKT_NOP_HEADER_count mask 0x3FFF shift 16
  "NOP": ("NOP", 0, [{"count": (16, 14)}]),
  # SDMA_PKT_COPY_LINEAR_HEADER_encrypt 0x1 @16, tmz 0x1 @18, cpv 0x1 @19, backwards 0x1 @25, broadcast 0x1 @27;
  # COUNT_count 0x3FFFFFFF @0; PARAMETER_dst_sw 0x3 @16, dst_cache_policy 0x7 @18, src_sw 0x3 @24,
  # src_cache_policy 0x7 @26; SRC_ADDR_LO/HI, DST_ADDR_LO/HI 0xFFFFFFFF @0
  "COPY_LINEAR": ("COPY", SDMA_SUBOP_COPY_LINEAR,
                  [{"encrypt": (16, 1), "tmz": (18, 1), "cpv": (19, 1), "backwards": (25, 1), "broadcast": (27, 1)},
                   {"count": (0, 30)},
                   {"dst_sw": (16, 2), "dst_cache_policy": (18, 3), "src_sw": (24, 2), "src_cache_policy": (26, 3)},
                   {"src_addr_lo": (0, 32)}, {"src_addr_hi": (0, 32)}, {"dst_addr_lo": (0, 32)},
                   {"dst_addr_hi": (0, 32)}]),
  # SDMA_PKT_INDIRECT_HEADER_vmid 0xF @16, priv 0x1 @31; BASE_LO/BASE_HI 0xFFFFFFFF; IB_SIZE_ib_size 0xFFFFF @0;
  # CSA_ADDR_LO/HI 0xFFFFFFFF
  "INDIRECT": ("INDIRECT", 0, [{"vmid": (16, 4), "priv": (31, 1)}, {"ib_base_lo": (0, 32)}, {"ib_base_hi": (0, 32)},
                               {"ib_size": (0, 20)}, {"csa_addr_lo": (0, 32)}, {"csa_addr_hi": (0, 32)}]),
  # SDMA_PKT_FENCE_HEADER_mtype 0x7 @16, gcc 0x1 @19, sys 0x1 @20, snp 0x1 @22, gpa 0x1 @23, l2_policy 0x3 @24,
  # llc_policy 0x1 @26, cpv 0x1 @28; ADDR_LO/ADDR_HI/DATA 0xFFFFFFFF
  "FENCE": ("FENCE", 0, [{"mtype": (16, 3), "gcc": (19, 1), "sys": (20, 1), "snp": (22, 1), "gpa": (23, 1),
                          "l2_policy": (24, 2), "llc_policy": (26, 1), "cpv": (28, 1)},
                         {"addr_lo": (0, 32)}, {"addr_hi": (0, 32)}, {"data": (0, 32)}]),
  # SDMA_PKT_TRAP_INT_CONTEXT_int_context 0x0FFFFFFF @0
  "TRAP": ("TRAP", 0, [{}, {"int_context": (0, 28)}]),
  # SDMA_PKT_POLL_REGMEM_HEADER_cache_policy 0x7 @20, cpv 0x1 @24, hdp_flush 0x1 @26, func 0x7 @28, mem_poll 0x1 @31;
  # ADDR_LO/ADDR_HI/VALUE/MASK 0xFFFFFFFF; DW5_interval 0xFFFF @0, retry_count 0xFFF @16
  "POLL_REGMEM": ("POLL_REGMEM", 0, [{"cache_policy": (20, 3), "cpv": (24, 1), "hdp_flush": (26, 1), "func": (28, 3),
                                      "mem_poll": (31, 1)},
                                     {"addr_lo": (0, 32)}, {"addr_hi": (0, 32)}, {"value": (0, 32)}, {"mask": (0, 32)},
                                     {"interval": (0, 16), "retry_count": (16, 12)}]),
  # SDMA_PKT_TIMESTAMP_GET_GLOBAL_WRITE_ADDR_LO_write_addr_31_3 0x1FFFFFFF @3; WRITE_ADDR_HI 0xFFFFFFFF
  "TIMESTAMP": ("TIMESTAMP", SDMA_SUBOP_TIMESTAMP_GET_GLOBAL, [{}, {"addr_lo": address(3)}, {"addr_hi": (0, 32)}]),
  # SDMA_PKT_COND_EXE ADDR_LO/ADDR_HI/REFERENCE 0xFFFFFFFF; EXEC_COUNT_exec_count 0x3FFF @0
  "COND_EXE": ("COND_EXE", 0, [{}, {"addr_lo": (0, 32)}, {"addr_hi": (0, 32)}, {"reference": (0, 32)},
                               {"exec_count": (0, 14)}]),
}
# ---- [cik] SDMA_POLL_REG_MEM_EXTRA_FUNC: 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >  ([pal] gfx10DmaCmdBuffer: 3 Equal)
SDMA_FUNC = {"always": 0, "<": 1, "<=": 2, "==": 3, "!=": 4, ">=": 5, ">": 6}
# ---- [sdmac] .copy_max_bytes = 0x400000
SDMA_COPY_MAX_BYTES = 0x400000


# ==== tables vs transcription ==========================================================================================

def _field_matches(ours, source) -> bool:
  if source[0] == "address": return ours == (0, 32)      # the whole dword; the low reserved bits stay zero
  return ours == source


def _compare_layout(name: str, driver_dwords, source_dwords, header_fields=None):
  """Every dword, every field: same names, same lowest bit and width (KNOWN_DEVIATIONS aside)."""
  assert len(driver_dwords) == len(source_dwords), f"{name}: {len(driver_dwords)} dwords, source {len(source_dwords)}"
  for k, (ours, theirs) in enumerate(zip(driver_dwords, source_dwords)):
    theirs = dict(GCR_CNTL if theirs == "GCR_CNTL" else theirs)
    if k == 0 and header_fields: theirs = {**header_fields, **theirs}
    ours = {f: (lo, w) for f, lo, w in ours}
    assert set(ours) == set(theirs), f"{name} dword {k}: fields {sorted(ours)} vs source {sorted(theirs)}"
    for field, where in ours.items():
      expect = KNOWN_DEVIATIONS.get((name, k, field))
      if expect is not None:
        assert where == expect, f"{name} dword {k} {field}: {where}, the recorded deviation is {expect} (source " \
                                f"{theirs[field]}): update KNOWN_DEVIATIONS when the driver is fixed"
        continue
      assert _field_matches(where, theirs[field]), f"{name} dword {k} {field}: ours (bit, width) {where}, " \
                                                   f"source {theirs[field]}"


def test_pm4_header_layout():
  assert pm4.PACKET_TYPE3 == PACKET_TYPE3 and pm4.NOP_ONE_DWORD == NOP_ONE_DWORD_COUNT
  assert pm4.SHADER_TYPE_COMPUTE == 1 << PACKET3_COMPUTE_BIT
  # pm4.header(op, n body dwords) is PACKET3_COMPUTE(op, n - 1), for every opcode and count field bit
  for op in range(256):
    for body in (1, 2, 3, 0x40, 0x2001, 0x4000):
      assert pm4.header(op, body) == PACKET3_COMPUTE(op, body - 1), (op, body)
  # and decoding reads type / opcode / count back from where the header macros put them
  words = [PACKET3_COMPUTE(pm4.OPCODES["DMA_DATA"], 5)] + [0] * 6
  name, _, size = pm4.decode(words, 0)
  assert (name, size) == ("DMA_DATA", 7)
  with pytest.raises(pm4.PacketError): pm4.decode([2 << 30] + [0] * 8, 0)     # a type-2 header is not type 3


def test_pm4_opcodes():
  assert pm4.OPCODES == PACKET3_OPCODES
  assert pm4.NAMES == {v: k for k, v in PACKET3_OPCODES.items()}


def test_set_sh_reg_window_and_register_offsets():
  assert pm4.SET_SH_REG_START == SET_SH_REG_START and pm4.SH_REG_BASE == GC_BASE_IDX0
  assert pm4.REGISTERS == GC11_REG                                   # every register, by name
  assert pm4.REGISTER_NAMES == {v: k for k, v in GC11_REG.items()}
  for name in GC11_REG:
    assert GC11_REG[name] + GC_BASE_IDX0 == PAL_MM[name], name       # gc_11 offset + GC base = PAL's absolute address
    offset = pm4.sh_offset(name)
    assert offset == PAL_MM[name] - SET_SH_REG_START, name
    assert 0 <= offset < min(SET_SH_REG_END - SET_SH_REG_START, 1 << SET_SH_REG_OFFSET_BITS), name
    words = pm4.set_sh_reg(name, 0x1234)
    assert words == [PACKET3_COMPUTE(PACKET3_OPCODES["SET_SH_REG"], 1), PAL_MM[name] - SET_SH_REG_START, 0x1234], name
    assert pm4.decode(words, 0)[1]["register"] == GC11_REG[name], name


def test_register_fields():
  for table, masks in ((pm4.DISPATCH_INITIATOR, DISPATCH_INITIATOR_MASKS), (pm4.TMPRING_SIZE, TMPRING_SIZE_MASKS)):
    assert set(table) == set(masks)
    for field, (lo, width) in table.items():
      shift, mask = masks[field]
      assert (lo, ((1 << width) - 1) << lo) == (shift, mask), field


def test_event_types_and_enumerations():
  assert (pm4.CS_PARTIAL_FLUSH, pm4.CACHE_FLUSH_AND_INV_TS_EVENT, pm4.BOTTOM_OF_PIPE_TS) == \
         (CS_PARTIAL_FLUSH, CACHE_FLUSH_AND_INV_TS_EVENT, BOTTOM_OF_PIPE_TS)
  assert pm4.FUNC == WAIT_FUNCTION
  assert (pm4.DATA_SEL_NONE, pm4.DATA_SEL_32, pm4.DATA_SEL_64, pm4.DATA_SEL_GPU_CLOCK, pm4.DATA_SEL_SYS_CLOCK) == \
         (DATA_SEL["NONE"], DATA_SEL["32"], DATA_SEL["64"], DATA_SEL["GPU_CLOCK"], DATA_SEL["SYS_CLOCK"])
  assert (pm4.INT_SEL_NONE, pm4.INT_SEL_INT_ONLY, pm4.INT_SEL_AFTER_WRITE) == \
         (INT_SEL["NONE"], INT_SEL["INT_ONLY"], INT_SEL["AFTER_WRITE"])


def test_gcr_cntl_bits():
  assert {f: (lo, w) for f, lo, w in pm4.GCR_CNTL} == GCR_CNTL
  assert len(pm4.GCR_CNTL) == len(GCR_CNTL)


def test_hdp_flush_registers_and_bits():
  assert pm4.NBIO_BASE_SEG2 == NBIO_BASE_SEG2
  assert (pm4.HDP_FLUSH_REQ, pm4.HDP_FLUSH_DONE) == (NBIO_BASE_SEG2 + regBIF_BX_PF0_GPU_HDP_FLUSH_REQ,
                                                     NBIO_BASE_SEG2 + regBIF_BX_PF0_GPU_HDP_FLUSH_DONE)
  assert pm4.HDP_FLUSH_BITS == {name: 1 << shift for name, shift in HDP_FLUSH_SHIFT.items()}
  assert (pm4.HDP_FLUSH_COMPUTE, pm4.HDP_FLUSH_SDMA) == (HDP_COMPUTE_MASK, HDP_SDMA_MASK) == (0x3FC, 0xC00)
  assert pm4.WAIT_REG_MEM_WRITE_WAIT_WRITE << 6 == WAIT_REG_MEM_OPERATION(1)


@pytest.mark.parametrize("name", sorted(PM4_PACKETS))
def test_pm4_packet_layout(name):
  assert len(PM4_PACKETS[name]) + 1 == PM4_SIZEDW[name]             # the transcription itself: PAL's packet size
  _compare_layout(name, pm4.PACKETS[name], PM4_PACKETS[name])


def test_pm4_tables_cover_the_transcription():
  assert set(pm4.PACKETS) == set(PM4_PACKETS)
  # no two fields of a dword overlap and every field fits the dword (a packer would otherwise mix fields)
  for name, layout in pm4.PACKETS.items():
    for k, dword in enumerate(layout):
      used = 0
      for field, lo, width in dword:
        bits = ((1 << width) - 1) << lo
        assert lo + width <= 32 and not used & bits, (name, k, field)
        used |= bits
  assert pm4.DMA_DATA_MAX_BYTES < 1 << PM4_PACKETS["DMA_DATA"][5]["byte_count"][1]
  assert pm4.DMA_DATA_MAX_BYTES == CP_DMA_MAX_BYTES == 32736      # [mesa]: what a gfx11 DMA_DATA may carry


def test_sdma_opcodes_and_constants():
  assert sdma.OP == SDMA_OP
  assert sdma.SUBOP_COPY_LINEAR == SDMA_SUBOP_COPY_LINEAR
  assert sdma.SUBOP_TIMESTAMP_GET_GLOBAL == SDMA_SUBOP_TIMESTAMP_GET_GLOBAL
  assert {f: (lo, w) for f, lo, w in sdma.HEADER} == SDMA_HEADER and len(sdma.HEADER) == 2
  assert sdma.FUNC == SDMA_FUNC and sdma.COPY_MAX_BYTES == SDMA_COPY_MAX_BYTES
  assert sdma.COPY_MAX_BYTES <= 1 << SDMA_PACKETS["COPY_LINEAR"][2][1]["count"][1]     # count = bytes - 1 fits


@pytest.mark.parametrize("name", sorted(SDMA_PACKETS))
def test_sdma_packet_layout(name):
  op_name, sub_op, dwords = SDMA_PACKETS[name]
  op, ours_sub, layout = sdma.PACKETS[name]
  assert (op, ours_sub) == (SDMA_OP[op_name], sub_op), f"SDMA {name}: (op, sub_op) {(op, ours_sub)}"
  _compare_layout(f"SDMA {name}", layout, dwords, header_fields=SDMA_HEADER)


def test_sdma_tables_cover_the_transcription():
  assert set(sdma.PACKETS) == set(SDMA_PACKETS)
  assert sdma.BY_OPCODE == {(SDMA_OP[o], s): n for n, (o, s, _) in SDMA_PACKETS.items()}


# ==== the packets the driver builds, word for word =====================================================================
# Expected words are computed here with the header macros, from the transcription above.

def P3(name, n): return PACKET3_COMPUTE(PACKET3_OPCODES[name], n)
def lo(v): return v & 0xFFFFFFFF
def hi(v): return v >> 32
def sh(reg): return PAL_MM[reg] - SET_SH_REG_START
def SDMA_HDR(op, sub_op=0): return SDMA_OP[op] | sub_op << 8


@pytest.fixture
def drv(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)   # what EMU=1 selects
  from baregrad.drivers.amd.driver import AMDDriver
  d = AMDDriver(timeout=10)
  d.markers = False          # the exact words of each command (the trace markers have a test of their own)
  yield d
  d.close()


def _slot(drv):
  """The queue event's slot: event page + 8 * the event_slot_index the emulated amdkfd handed out."""
  slot = drv.event_page.addr + 8 * drv.kernel.events[drv.queue_event].slot
  assert slot == drv.queue_event_slot
  return slot


def _program(pgm_addr=0x7F12_3456_7800, user_sgprs=2, wave32=True):
  from baregrad.drivers.amd.driver import LoadedProgram
  handle = LoadedProgram("k", None, pgm_addr, 0x0060_0041, 0x0000_8004, 0x9, user_sgprs, 512, wave32)
  return types.SimpleNamespace(handle=handle, meta={})


BARRIER = [
  [P3("EVENT_WRITE", 0), CS_PARTIAL_FLUSH << 0 | EVENT_INDEX_PARTIAL_FLUSH << 8],
  # [gfx11] gfx_v11_0_emit_mem_sync: COHER_CNTL 0, SIZE 0xffffffff, SIZE_HI 0xffffff, BASE 0, BASE_HI 0, POLL 0xA,
  # GCR_CNTL = GL2_INV | GL2_WB | GLM_INV | GLM_WB | GL1_INV | GLV_INV | GLK_INV | GLI_INV(1)
  [P3("ACQUIRE_MEM", 6), 0, 0xFFFFFFFF, 0xFF, 0, 0, 0xA,
   1 << 14 | 1 << 15 | 1 << 5 | 1 << 4 | 1 << 9 | 1 << 8 | 1 << 7 | 1 << 0],
]


def test_compute_dispatch_words(drv):
  prog = _program()
  pgm, args = prog.handle.pgm_addr, 0x7F00_0000_1040
  got = drv.encode("compute", [("exec", prog, args, (4, 2, 1), (32, 2, 1))]).packet_words()
  assert got == [
    [P3("SET_SH_REG", 2), sh("COMPUTE_PGM_LO"), lo(pgm >> 8), pgm >> 40],
    # [usage] the CP fills COMPUTE_PGM_RSRC1.PRIV: the driver sets it over the descriptor's RSRC1
    [P3("SET_SH_REG", 2), sh("COMPUTE_PGM_RSRC1"), 0x0060_0041 | 1 << RSRC1_PRIV_BIT, 0x0000_8004],
    [P3("SET_SH_REG", 1), sh("COMPUTE_PGM_RSRC3"), 0x9],
    [P3("SET_SH_REG", 1), sh("COMPUTE_TMPRING_SIZE"), 0],
    [P3("SET_SH_REG", 2), sh("COMPUTE_USER_DATA_0"), lo(args), hi(args)],
    [P3("SET_SH_REG", 3), sh("COMPUTE_START_X"), 0, 0, 0],
    [P3("SET_SH_REG", 3), sh("COMPUTE_NUM_THREAD_X"), 32, 2, 1],
    [P3("SET_SH_REG", 1), sh("COMPUTE_RESOURCE_LIMITS"), 0],
    # COMPUTE_DISPATCH_INITIATOR: COMPUTE_SHADER_EN_MASK | FORCE_START_AT_000_MASK | CS_W32_EN_MASK
    [P3("DISPATCH_DIRECT", 3), 4, 2, 1, 0x00000001 | 0x00000004 | 0x00008000],
    *BARRIER]
  # a wave64 kernel without a kernarg pointer: no USER_DATA, no CS_W32_EN
  got = drv.encode("compute", [("exec", _program(user_sgprs=0, wave32=False), 0, (1, 1, 1), (64, 1, 1))]).packet_words()
  assert sh("COMPUTE_USER_DATA_0") not in [p[1] for p in got]
  assert [p for p in got if p[0] == P3("DISPATCH_DIRECT", 3)] == [[P3("DISPATCH_DIRECT", 3), 1, 1, 1, 0x1 | 0x4]]


def test_compute_signal_wait_timestamp_barrier_copy_words(drv):
  sig = types.SimpleNamespace(addr=0x7F55_0000_0100, timestamp_addr=0x7F55_0000_0108)
  value = 0x1_0000_0005
  got = drv.encode("compute", [("signal", sig, value), ("wait", sig, value), ("timestamp", sig), ("barrier",)])
  flush = CACHE_FLUSH_AND_INV_TS_EVENT | EVENT_INDEX_END_OF_PIPE << 8 | 1 << 12 | 1 << 13 | 1 << 21 | 1 << 22 | 3 << 25
  slot = _slot(drv)
  assert got.packet_words() == [
    # RELEASE_MEM: EVENT_TYPE(CACHE_FLUSH_AND_INV_TS_EVENT) | EVENT_INDEX(5) | GCR_GLM_WB | GCR_GLM_INV | GCR_GL2_WB |
    # GCR_SEQ | CACHE_POLICY(3); DATA_SEL(2) | INT_SEL(0) | DST_SEL(0): the 64-bit value, no interrupt
    [P3("RELEASE_MEM", 6), flush, DATA_SEL["64"] << 29 | INT_SEL["NONE"] << 24, lo(sig.addr), hi(sig.addr),
     lo(value), hi(value), 0],
    # then the event's slot := 1, INT_SEL(2): the interrupt once it is written, with the event id as interrupt context
    [P3("RELEASE_MEM", 6), flush, DATA_SEL["64"] << 29 | INT_SEL["AFTER_WRITE"] << 24, lo(slot), hi(slot), 1, 0,
     drv.queue_event],
    # WAIT_REG_MEM64: FUNCTION(>=) | MEM_SPACE(1); address; 64-bit reference and mask; POLL_INTERVAL 4
    [P3("WAIT_REG_MEM64", 7), WAIT_REG_MEM_FUNCTION(WAIT_FUNCTION[">="]) | WAIT_REG_MEM_MEM_SPACE(1), lo(sig.addr),
     hi(sig.addr), lo(value), hi(value), 0xFFFFFFFF, 0xFFFFFFFF, 4],
    # RELEASE_MEM: EVENT_TYPE(BOTTOM_OF_PIPE_TS) | EVENT_INDEX(5); DATA_SEL(3): the 64-bit GPU clock
    [P3("RELEASE_MEM", 6), BOTTOM_OF_PIPE_TS | EVENT_INDEX_END_OF_PIPE << 8, DATA_SEL["GPU_CLOCK"] << 29,
     lo(sig.timestamp_addr), hi(sig.timestamp_addr), 0, 0, 0],
    *BARRIER]
  # DMA_DATA in chunks: CP_SYNC only on the last; COMMAND RAW_WAIT | BYTE_COUNT
  src, dst, chunk = 0x7F10_0000_0000, 0x7F20_0000_0000, CP_DMA_MAX_BYTES
  got = drv.encode("compute", [("copy", dst, src, 2 * chunk + 100)]).packet_words()
  assert got == [[P3("DMA_DATA", 5), (k == 2) << 31, lo(src + k * chunk), hi(src + k * chunk), lo(dst + k * chunk),
                  hi(dst + k * chunk), 1 << 30 | (100 if k == 2 else chunk)] for k in range(3)]


def test_copy_queue_words(drv):
  sig = types.SimpleNamespace(addr=0x7F55_0000_0100, timestamp_addr=0x7F55_0000_0108)
  value = 0x2_0000_0007
  src, dst, n = 0x7F10_0000_0000, 0x7F20_0000_0010, 2 * SDMA_COPY_MAX_BYTES + 3
  got = drv.encode("copy", [("copy", dst, src, n), ("signal", sig, value), ("wait", sig, value), ("timestamp", sig),
                            ("barrier",)]).packet_words()
  poll = lambda addr, ref: [SDMA_HDR("POLL_REGMEM") | SDMA_FUNC[">="] << 28 | 1 << 31, lo(addr), hi(addr), ref,
                            0xFFFFFFFF, 10 | 0xFFF << 16]
  fence = SDMA_HDR("FENCE") | FENCE_MTYPE_UC << 16         # [sdma] SDMA_PKT_FENCE_HEADER_mtype 0x7 @16
  slot = _slot(drv)
  assert got == [
    *[[SDMA_HDR("COPY", SDMA_SUBOP_COPY_LINEAR), (3 if k == 2 else SDMA_COPY_MAX_BYTES) - 1, 0,
       lo(src + k * SDMA_COPY_MAX_BYTES), hi(src + k * SDMA_COPY_MAX_BYTES), lo(dst + k * SDMA_COPY_MAX_BYTES),
       hi(dst + k * SDMA_COPY_MAX_BYTES)] for k in range(3)],
    [fence, lo(sig.addr), hi(sig.addr), lo(value)],                              # low word first
    [fence, lo(sig.addr + 4), hi(sig.addr + 4), hi(value)],
    [fence, lo(slot), hi(slot), 1],                                              # the event's slot (low word)
    [SDMA_HDR("TRAP"), drv.queue_event & 0x0FFFFFFF],
    poll(sig.addr + 4, hi(value)),                                               # high word >= ...
    # COND_EXE: if the high word equals the value's, run the next EXEC_COUNT (6) dwords: the low-word poll
    [SDMA_HDR("COND_EXE"), lo(sig.addr + 4), hi(sig.addr + 4), hi(value), 6, *poll(sig.addr, lo(value))],
    [SDMA_HDR("TIMESTAMP", SDMA_SUBOP_TIMESTAMP_GET_GLOBAL), lo(sig.timestamp_addr), hi(sig.timestamp_addr)]]


# [gfx11] gfx_v11_0_ring_emit_hdp_flush -> gfx_v11_0_wait_reg_mem(ring, 0 (me), 0 (register), 1 (write-wait-write),
# req, done, ref_and_mask, ref_and_mask, 0x20), FUNCTION(3) "equal"
HDP_FLUSH_PM4 = [P3("WAIT_REG_MEM", 5), WAIT_REG_MEM_MEM_SPACE(0) | WAIT_REG_MEM_OPERATION(1) | WAIT_REG_MEM_FUNCTION(3) |
                 WAIT_REG_MEM_ENGINE(0), NBIO_BASE_SEG2 + regBIF_BX_PF0_GPU_HDP_FLUSH_REQ,
                 NBIO_BASE_SEG2 + regBIF_BX_PF0_GPU_HDP_FLUSH_DONE, HDP_COMPUTE_MASK, HDP_COMPUTE_MASK, 0x20]
# a user-mode SDMA queue flushes the HDP with ROCr's firmware packet (ROCR-Runtime
# runtime/hsa-runtime/core/inc/sdma_registers.h SDMA_PKT_HDP_FLUSH, copied as is by amd_blit_sdma.cpp
# BuildHdpFlushCommand): {0x8, 0x0, 0x80000000, 0x0, 0x0, 0x0}. Not the register form of sdma_v6_0_ring_emit_hdp_flush
# (HDP_FLUSH bit 26 set), which amdgpu uses on its privileged rings only
HDP_FLUSH_SDMA = [0x8, 0x0, 0x80000000, 0x0, 0x0, 0x0]


def test_submit_starts_with_an_hdp_flush(drv):
  assert drv.hdp_flush("compute") == HDP_FLUSH_PM4 and drv.hdp_flush("copy") == HDP_FLUSH_SDMA
  sig = types.SimpleNamespace(timestamp_addr=drv.alloc(4096, "gtt").addr + 8)
  for kind, flush in (("compute", HDP_FLUSH_PM4), ("copy", HDP_FLUSH_SDMA)):
    ring = drv.ring_of(kind)
    start = ring.wptr % ring.dwords
    drv.submit(kind, drv.encode(kind, [("timestamp", sig)]))
    assert list(ring.ring[start:start + len(flush)]) == flush                        # first the flush,
    first = int(ring.ring[start + len(flush)])                                        # then the commands
    assert first == (P3("RELEASE_MEM", 6) if kind == "compute" else SDMA_HDR("TIMESTAMP", SDMA_SUBOP_TIMESTAMP_GET_GLOBAL))
  assert _poll(lambda: all(drv.ring_of(k).idle() for k in ("compute", "copy"))) and drv.kernel.fault() is None


def test_bound_queue_submit_words(drv):
  for kind, flush in (("compute", HDP_FLUSH_PM4), ("copy", HDP_FLUSH_SDMA)):
    bound = drv.bind(kind, drv.encode(kind, [("barrier",)]))
    ring = drv.ring_of(kind)
    start = ring.wptr % ring.dwords
    drv.submit_bound(kind, bound, [])
    at = ring.last_packet_at % ring.dwords
    assert list(ring.ring[start:start + len(flush)]) == flush     # the flush first, then the indirect buffer
    addr = bound.memory.addr
    if kind == "compute":   # INDIRECT_BUFFER: base (dword aligned), base hi, VALID | IB_SIZE
      assert at == start + len(flush)
      assert list(ring.ring[at:at + 4]) == [P3("INDIRECT_BUFFER", 2), lo(addr), hi(addr), 1 << 23 | bound.ndwords]
    else:                   # SDMA INDIRECT: base lo/hi, IB_SIZE, CSA address 0
      assert list(ring.ring[at:at + 6]) == [SDMA_HDR("INDIRECT"), lo(addr), hi(addr), bound.ndwords, 0, 0]
      # sdma_v6_0_ring_emit_ib: "IB packet must end on a 8 DW boundary" (NOPs before it), the IB base 32-byte aligned;
      # sdma_v6_0_ring_pad_ib: the IB a multiple of 8 dwords, padded with NOPs
      assert (at + 6) % 8 == 0 and addr % 32 == 0 and bound.ndwords % 8 == 0
      assert all(int(w) & 0xFF == 0 for w in ring.ring[start + len(flush):at][:1])   # the gap is a NOP


def test_ring_nops():
  assert pm4.nop(1) == [PACKET3_COMPUTE(PACKET3_OPCODES["NOP"], NOP_ONE_DWORD_COUNT)]
  assert pm4.nop(5) == [PACKET3_COMPUTE(PACKET3_OPCODES["NOP"], 3), 0, 0, 0, 0]      # count = dwords - 2
  assert sdma.nop(4) == [SDMA_HDR("NOP") | 3 << 16, 0, 0, 0]                         # count = dwords - 1
  for n in (1, 2, 7):
    assert pm4.decode(pm4.nop(n) + [0], 0)[2] == n and sdma.decode(sdma.nop(n), 0)[2] == n


# ==== the emulator stops on what it does not model, naming it ==========================================================

def _poll(done, timeout: float = 10.0) -> bool:
  import time
  deadline = time.monotonic() + timeout
  while not done() and time.monotonic() < deadline: time.sleep(0.001)
  return done()


def _stops_with(drv, kind: str, words: list, message: str):
  """Write one raw packet to the queue; the engine must stop on it and the kernel log must say `message`."""
  import re
  drv.ring_of(kind).write([words])
  assert _poll(lambda: drv.kernel.fault() is not None), f"the {kind} queue ran {words} without complaint"
  assert re.search(message, drv.kernel.fault()), drv.kernel.fault()
  assert any(re.search(message, line) for line in drv.kernel.kmsg)


def test_emulator_rejects_set_sh_reg_of_unknown_register(drv):
  # COMPUTE_PIPELINESTAT_ENABLE ([off] 0x1baa) is a real SH register the emulated gfx1100 does not model
  _stops_with(drv, "compute", [P3("SET_SH_REG", 1), 0x1baa + GC_BASE_IDX0 - SET_SH_REG_START, 1],
              r"SET_SH_REG of unknown register 0x1baa \(SET_SH_REG offset 0x20a")


def test_emulator_rejects_a_run_of_registers_into_an_unknown_one(drv):
  # COMPUTE_NUM_THREAD_X..Z and one more: 0x1baa again; nothing of the packet is written
  _stops_with(drv, "compute", [P3("SET_SH_REG", 4), sh("COMPUTE_NUM_THREAD_X"), 1, 1, 1, 1],
              r"SET_SH_REG of unknown register 0x1baa .*value 3 of 4")
  assert drv.kernel.queues[drv.compute.queue_id].regs.get(GC11_REG["COMPUTE_NUM_THREAD_X"]) is None


def test_emulator_rejects_unknown_pm4_opcode(drv):
  _stops_with(drv, "compute", [PACKET3_COMPUTE(0x9A, 1), 0, 0], r"unknown PM4 packet OPCODE_0x9a \(opcode 0x9a")


def test_emulator_rejects_pm4_packet_it_does_not_emulate(drv):
  _stops_with(drv, "compute", [P3("WRITE_DATA", 3), 5 << 8, 0x1000, 0, 7],
              r"PM4 packet WRITE_DATA \(opcode 0x37, .*\) is not emulated")


def test_emulator_rejects_unknown_event(drv):
  _stops_with(drv, "compute", [P3("EVENT_WRITE", 0), 0x16 | 0 << 8],     # CACHE_FLUSH_AND_INV_EVENT
              r"EVENT_WRITE of event type 0x16 \(index 0\) is not emulated")


def test_emulator_rejects_wrong_event_index(drv):
  _stops_with(drv, "compute", [P3("EVENT_WRITE", 0), CS_PARTIAL_FLUSH | 0 << 8],
              r"EVENT_WRITE of CS_PARTIAL_FLUSH with EVENT_INDEX 0; the event takes EVENT_INDEX 4")


def test_emulator_rejects_release_mem_int_sel_it_does_not_emulate(drv):
  sig = drv.alloc(4096, "gtt")
  _stops_with(drv, "compute", [P3("RELEASE_MEM", 6), BOTTOM_OF_PIPE_TS | 5 << 8, DATA_SEL["32"] << 29 | 4 << 24,
                               lo(sig.addr), hi(sig.addr), 1, 0, 0], r"RELEASE_MEM INT_SEL 4 is not emulated")


def test_emulator_rejects_unknown_sdma_opcode(drv):
  _stops_with(drv, "copy", [0x7F, 0, 0, 0], r"unknown SDMA opcode 127 \(sub_op 0")


def test_emulator_rejects_unknown_sdma_sub_op(drv):
  # SDMA_SUBOP_COPY_TILED (1): a COPY the emulator does not model
  _stops_with(drv, "copy", [SDMA_HDR("COPY", 1)] + [0] * 12,
              r"SDMA packet COPY \(op 1\) sub_op 1 .* is not emulated; this op is emulated as COPY_LINEAR sub_op 0")


def test_emulator_rejects_sdma_op_it_does_not_emulate(drv):
  _stops_with(drv, "copy", [SDMA_HDR("WRITE"), 0x1000, 0, 0, 0],
              r"SDMA packet WRITE \(op 2\) sub_op 0 .* is not emulated")


def test_emulator_rejects_copy_linear_modes(drv):
  buf = drv.alloc(4096, "gtt")
  _stops_with(drv, "copy", [SDMA_HDR("COPY", 0) | 1 << 27, 3, 0, lo(buf.addr), hi(buf.addr), lo(buf.addr + 64),
                            hi(buf.addr + 64)], r"COPY_LINEAR with broadcast is not emulated")


def test_emulator_rejects_reserved_compare_function(drv):
  sig = drv.alloc(4096, "gtt")
  _stops_with(drv, "compute", [P3("WAIT_REG_MEM", 5), 7 | 1 << 4, lo(sig.addr), hi(sig.addr), 0, 0xFFFFFFFF, 4],
              r"compare function 7 is reserved")


def test_emulator_rejects_a_wait_reg_mem64_the_driver_does_not_emit(drv):
  sig = drv.alloc(4096, "gtt")
  _stops_with(drv, "compute", [P3("WAIT_REG_MEM64", 7), 3 | 1 << 4, lo(sig.addr), hi(sig.addr), 0, 0, 0xFFFFFFFF,
                               0xFFFFFFFF, 4], r"WAIT_REG_MEM64 other than a 64-bit '>=' .*function 3.*no Linux code emits")


def test_trace_marker_words(drv):
  """With markers on, each command is followed by its marker: PM4 RELEASE_MEM EVENT_TYPE(BOTTOM_OF_PIPE_TS) |
  EVENT_INDEX(5), DATA_SEL(1: low 32 bits) | INT_SEL(0), the marker slot, then the command's sequence number (filled
  at submit); SDMA FENCE MTYPE UC to the copy queue's slot."""
  drv.markers = True
  sig = types.SimpleNamespace(addr=0x7F55_0000_0100, timestamp_addr=0x7F55_0000_0108)
  enc = drv.encode("compute", [("timestamp", sig), ("barrier",)])
  got = enc.packet_words()
  slot = drv.marker_page.addr
  marker = [P3("RELEASE_MEM", 6), BOTTOM_OF_PIPE_TS | EVENT_INDEX_END_OF_PIPE << 8, DATA_SEL["32"] << 29 | INT_SEL["NONE"] << 24,
            lo(slot), hi(slot), 0, 0, 0]
  assert got[1] == marker and got[-1] == marker and len(enc.fixups) == 2
  copy = drv.encode("copy", [("timestamp", sig)]).packet_words()
  assert copy[1] == [SDMA_HDR("FENCE") | FENCE_MTYPE_UC << 16, lo(slot + 8), hi(slot + 8), 0]
