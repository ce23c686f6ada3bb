"""PM4 type-3 packets for the gfx11 (RDNA3) compute command processor: tables of fields, one encoder, one decoder.

Sources (Linux, drivers/gpu/drm/amd):
  * amdgpu/nvd.h (the PM4 header for gfx10/gfx11): PACKET3() header layout, opcodes, WAIT_REG_MEM,
    INDIRECT_BUFFER, EVENT_WRITE, RELEASE_MEM and DMA_DATA fields.
  * amdgpu/gfx_v11_0.c: packet lengths as the kernel emits them (RELEASE_MEM 6+1 dwords of body with the
    interrupt context last, ACQUIRE_MEM's gfx10+ 7-dword body ending in GCR_CNTL, the compute IB control word).
  * include/asic_reg/gc/gc_11_0_0_offset.h: COMPUTE_* register offsets (block gc_shdec, BASE_IDX 0); the block's
    base byte address 0xb000 = dword 0x2c00 = PACKET3_SET_SH_REG_START, reached by register 0x19a0, so a
    SET_SH_REG offset is `register - 0x19a0`.
  * GCR_CNTL bits (ACQUIRE_MEM): the layout the SDMA_GCR_* macros of amdgpu/sdma_v6_0_0_pkt_open.h spell out.
  * VGT_EVENT_TYPE values (include/navi10_enum.h): CS_PARTIAL_FLUSH 0x07, CACHE_FLUSH_AND_INV_TS_EVENT 0x14,
    BOTTOM_OF_PIPE_TS 0x28.
  * WAIT_REG_MEM64: opcode 0x93 from amdgpu/nvd.h (PACKET3_WAIT_REG_MEM64); the Linux headers stop there, the body is
    PM4_MEC_WAIT_REG_MEM64 of AMD PAL's src/core/hw/gfxip/gfx9/chip/gfx9_plus_merged_f32_mec_pm4_packets.h
    (GPUOpen-Drivers/pal at c5e8000, 2025-04): WAIT_REG_MEM's control dword, then address lo/hi, reference lo/hi, mask lo/hi,
    poll interval; a 64-bit compare of the 8-byte-aligned memory word. No Linux code emits it for gfx11, so the MEC
    firmware's support rests on PAL alone: the driver uses it in one form only (driver.py `_wait` says why no 32-bit
    WAIT_REG_MEM form will do), the one form the emulated CP accepts.
  * HDP flush registers (see HDP_FLUSH_REQ below): amdgpu/nbio_v4_3.c, include/asic_reg/nbio/nbio_4_3_0_offset.h and
    nbio_4_3_0_sh_mask.h, include/sienna_cichlid_ip_offset.h (NBIO_BASE).
"""
from __future__ import annotations
from ..encoded import Bits, Fixup

PACKET_TYPE3 = 3
SHADER_TYPE_COMPUTE = 1 << 1          # PACKET3_COMPUTE(): bit 1 of the header
NOP_ONE_DWORD = 0x3FFF                # PACKET3(NOP, 0x3FFF): a NOP that is its header only (amdgpu's ring nop)

OPCODES = {
  "NOP": 0x10, "DISPATCH_DIRECT": 0x15, "WRITE_DATA": 0x37, "WAIT_REG_MEM": 0x3C, "INDIRECT_BUFFER": 0x3F,
  "EVENT_WRITE": 0x46, "RELEASE_MEM": 0x49, "DMA_DATA": 0x50, "ACQUIRE_MEM": 0x58, "SET_SH_REG": 0x76,
  "WAIT_REG_MEM64": 0x93,
}
NAMES = {v: k for k, v in OPCODES.items()}

SET_SH_REG_START, SH_REG_BASE = 0x2C00, 0x1260     # dword addresses: SET_SH_REG window, GC BASE_IDX 0
# gc_11_0_0_offset.h, BASE_IDX 0
REGISTERS = {
  "COMPUTE_DISPATCH_INITIATOR": 0x1BA0, "COMPUTE_DIM_X": 0x1BA1, "COMPUTE_DIM_Y": 0x1BA2, "COMPUTE_DIM_Z": 0x1BA3,
  "COMPUTE_START_X": 0x1BA4, "COMPUTE_START_Y": 0x1BA5, "COMPUTE_START_Z": 0x1BA6,
  "COMPUTE_NUM_THREAD_X": 0x1BA7, "COMPUTE_NUM_THREAD_Y": 0x1BA8, "COMPUTE_NUM_THREAD_Z": 0x1BA9,
  "COMPUTE_PGM_LO": 0x1BAC, "COMPUTE_PGM_HI": 0x1BAD,
  "COMPUTE_DISPATCH_SCRATCH_BASE_LO": 0x1BB0, "COMPUTE_DISPATCH_SCRATCH_BASE_HI": 0x1BB1,
  "COMPUTE_PGM_RSRC1": 0x1BB2, "COMPUTE_PGM_RSRC2": 0x1BB3, "COMPUTE_RESOURCE_LIMITS": 0x1BB5,
  "COMPUTE_TMPRING_SIZE": 0x1BB8, "COMPUTE_RESTART_X": 0x1BBB, "COMPUTE_RESTART_Y": 0x1BBC, "COMPUTE_RESTART_Z": 0x1BBD,
  "COMPUTE_PGM_RSRC3": 0x1BC8,
  **{f"COMPUTE_USER_DATA_{i}": 0x1BE0 + i for i in range(16)},
}
REGISTER_NAMES = {v: k for k, v in REGISTERS.items()}


def sh_offset(register: str) -> int:
  """The SET_SH_REG offset of a register: its dword address minus PACKET3_SET_SH_REG_START."""
  return REGISTERS[register] + SH_REG_BASE - SET_SH_REG_START


# ---- the HDP (host data path) flush ----
# CPU stores to VRAM go through the PCIe BAR and the HDP, which may still hold them when the doorbell rings; a queue
# flushes it before it reads what the host wrote. amdgpu emits the flush as gfx_v11_0_ring_emit_hdp_flush
# (amdgpu/gfx_v11_0.c: gfx_v11_0_wait_reg_mem(ring, reg_mem_engine 0 on compute rings, mem_space 0, operation 1
# "write, wait, write", req_offset, done_offset, ref_and_mask, ref_and_mask, poll interval 0x20), function 3 "==") and
# sdma_v6_0_ring_emit_hdp_flush (amdgpu/sdma_v6_0.c: POLL_REGMEM HDP_FLUSH(1) FUNC(3), done << 2, req << 2,
# ref_and_mask twice, RETRY_COUNT 0xfff INTERVAL 10). The registers: nbio_v4_3_get_hdp_flush_req_offset / _done_offset
# (amdgpu/nbio_v4_3.c) = SOC15_REG_OFFSET(NBIO, 0, regBIF_BX_PF0_GPU_HDP_FLUSH_REQ / _DONE), 0x0106 / 0x0107 with
# BASE_IDX 2 (nbio_4_3_0_offset.h), plus NBIO segment 2 = 0x00000D20 (NBIO_BASE of include/sienna_cichlid_ip_offset.h,
# the header GC's base above comes from; a gfx11 board reports the same through IP discovery).
NBIO_BASE_SEG2 = 0x0D20
HDP_FLUSH_REQ, HDP_FLUSH_DONE = NBIO_BASE_SEG2 + 0x0106, NBIO_BASE_SEG2 + 0x0107
# GPU_HDP_FLUSH_REQ / _DONE bits (nbio_4_3_0_sh_mask.h: CP0..CP9 bits 0-9, SDMA0 bit 10, SDMA1 bit 11), the
# ref_and_mask_* of nbio_v4_3_hdp_flush_reg. amdgpu's compute ring on ME m pipe p uses cp2 << p (m 1) or cp6 << p (m 2);
# SDMA engine e uses sdma0 << e. amdkfd places a user queue on a pipe / engine it does not report, so the driver asks for
# every compute pipe (cp2..cp9) or both SDMA engines.
HDP_FLUSH_BITS = {**{f"cp{i}": 1 << i for i in range(10)}, "sdma0": 1 << 10, "sdma1": 1 << 11}
HDP_FLUSH_COMPUTE = sum(HDP_FLUSH_BITS[f"cp{i}"] for i in range(2, 10))
HDP_FLUSH_SDMA = HDP_FLUSH_BITS["sdma0"] | HDP_FLUSH_BITS["sdma1"]
WAIT_REG_MEM_WRITE_WAIT_WRITE = 1      # WAIT_REG_MEM OPERATION 1 (nvd.h: 0 wait, 1 write-wait-write on registers)

# register fields (gc_11_0_0_sh_mask.h): name -> (lowest bit, width)
DISPATCH_INITIATOR = {"compute_shader_en": (0, 1), "partial_tg_en": (1, 1), "force_start_at_000": (2, 1),
                      "order_mode": (6, 1), "cs_w32_en": (15, 1)}
TMPRING_SIZE = {"waves": (0, 12), "wavesize": (12, 15)}

# VGT_EVENT_TYPE
CS_PARTIAL_FLUSH, CACHE_FLUSH_AND_INV_TS_EVENT, BOTTOM_OF_PIPE_TS = 0x07, 0x14, 0x28
# WAIT_REG_MEM functions, RELEASE_MEM selections
FUNC = {"always": 0, "<": 1, "<=": 2, "==": 3, "!=": 4, ">=": 5, ">": 6}
DATA_SEL_NONE, DATA_SEL_32, DATA_SEL_64, DATA_SEL_GPU_CLOCK, DATA_SEL_SYS_CLOCK = 0, 1, 2, 3, 4
INT_SEL_NONE, INT_SEL_INT_ONLY, INT_SEL_AFTER_WRITE = 0, 1, 2

# Packet bodies: one list of (field, lowest bit, width) per dword after the header, in order. Field widths follow
# nvd.h's PACKET3_<packet>__<FIELD>(x) masks where it has them, else PAL's PM4_MEC_<packet> bitfields (docstring).
# An address-low dword is one 32-bit field whose reserved low bits the caller keeps zero (tests/amd/test_amd_hw_tables.py).
GCR_CNTL = [("gli_inv", 0, 2), ("gl1_range", 2, 2), ("glm_wb", 4, 1), ("glm_inv", 5, 1), ("glk_wb", 6, 1), ("glk_inv", 7, 1),
            ("glv_inv", 8, 1), ("gl1_inv", 9, 1), ("gl2_us", 10, 1), ("gl2_range", 11, 2), ("gl2_discard", 13, 1),
            ("gl2_inv", 14, 1), ("gl2_wb", 15, 1), ("seq", 16, 2), ("range_is_pa", 18, 1)]
PACKETS: dict[str, list[list[tuple[str, int, int]]]] = {
  "DISPATCH_DIRECT": [[("dim_x", 0, 32)], [("dim_y", 0, 32)], [("dim_z", 0, 32)],
                      [(f, lo, w) for f, (lo, w) in DISPATCH_INITIATOR.items()]],
  "WAIT_REG_MEM": [[("function", 0, 3), ("mem_space", 4, 2), ("operation", 6, 2), ("engine", 8, 2)],
                   [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("reference", 0, 32)], [("mask", 0, 32)],
                   [("poll_interval", 0, 16), ("optimize_ace_offload_mode", 31, 1)]],
  # addr_lo bits 2:0 are reserved (the polled qword is 8-byte aligned)
  "WAIT_REG_MEM64": [[("function", 0, 3), ("mem_space", 4, 2), ("operation", 6, 2), ("cache_policy", 25, 2)],
                     [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("reference", 0, 32)], [("reference_hi", 0, 32)],
                     [("mask", 0, 32)], [("mask_hi", 0, 32)],
                     [("poll_interval", 0, 16), ("optimize_ace_offload_mode", 31, 1)]],
  "INDIRECT_BUFFER": [[("ib_base_lo", 0, 32)], [("ib_base_hi", 0, 32)],
                      [("ib_size", 0, 20), ("chain", 20, 1), ("pre_ena", 21, 1), ("valid", 23, 1), ("vmid", 24, 4),
                       ("cache_policy", 28, 2), ("pre_resume", 30, 1)]],
  "EVENT_WRITE": [[("event_type", 0, 6), ("event_index", 8, 4)]],
  "RELEASE_MEM": [[("event_type", 0, 6), ("event_index", 8, 4), ("gcr_glm_wb", 12, 1), ("gcr_glm_inv", 13, 1),
                   ("gcr_glv_inv", 14, 1), ("gcr_gl1_inv", 15, 1), ("gcr_gl2_us", 16, 1), ("gcr_gl2_range", 17, 1),
                   ("gcr_gl2_discard", 19, 1), ("gcr_gl2_inv", 20, 1), ("gcr_gl2_wb", 21, 1), ("gcr_seq", 22, 1),
                   ("cache_policy", 25, 2), ("execute", 28, 1)],
                  [("dst_sel", 16, 2), ("int_sel", 24, 3), ("data_sel", 29, 3)],
                  [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("data_lo", 0, 32)], [("data_hi", 0, 32)],
                  [("int_ctxid", 0, 32)]],
  # COHER_SIZE_HI is [7:0] in nvd.h and PAL (amdgpu's gfx_v11_0_emit_mem_sync writes 0xffffff, reserved bits too)
  "ACQUIRE_MEM": [[("coher_cntl", 0, 31), ("engine_sel", 31, 1)], [("coher_size", 0, 32)], [("coher_size_hi", 0, 8)],
                  [("coher_base", 0, 32)], [("coher_base_hi", 0, 24)], [("poll_interval", 0, 16)], GCR_CNTL],
  "DMA_DATA": [[("engine", 0, 1), ("src_cache_policy", 13, 2), ("dst_sel", 20, 2), ("dst_cache_policy", 25, 2),
                ("src_sel", 29, 2), ("cp_sync", 31, 1)],
               [("src_addr_lo", 0, 32)], [("src_addr_hi", 0, 32)], [("dst_addr_lo", 0, 32)], [("dst_addr_hi", 0, 32)],
               [("byte_count", 0, 26), ("sas", 26, 1), ("das", 27, 1), ("saic", 28, 1), ("daic", 29, 1),
                ("raw_wait", 30, 1), ("dis_wc", 31, 1)]],
}
# chunk size for copies: BYTE_COUNT is 26 bits, but on gfx11 Mesa keeps a CP DMA packet to 32767 bytes, aligned down to
# SI_CPDMA_ALIGNMENT 32 (cp_dma_max_byte_count() of radeonsi si_cp_dma.c and radv_cp_dma.c: `gfx_level >= GFX11 ? 32767`)
DMA_DATA_MAX_BYTES = 0x7FE0        # 32736 = 32767 & ~31


class PacketError(ValueError):
  pass


def header(opcode: int, body_dwords: int) -> int:
  """PACKET3_COMPUTE(op, n): type 3, count = body dwords - 1."""
  return (PACKET_TYPE3 << 30) | ((body_dwords - 1) & 0x3FFF) << 16 | (opcode & 0xFF) << 8 | SHADER_TYPE_COMPUTE


def pack_fields(layout, fields: dict, name: str) -> list:
  """Pack fields into dwords by a layout of dwords [(field, low bit, width), ...] (PM4 and SDMA both use this).
  A dword that is one full-width field may hold 32 `Bits` of a symbolic value (drivers/encoded.py): it stays in the
  dword's place, which is how an encoder learns where the value goes; symbolic values elsewhere are an error."""
  words, seen = [], set()
  for dword in layout:
    if len(dword) == 1 and dword[0][2] == 32 and isinstance(fields.get(dword[0][0]), (Bits, Fixup)):
      v = fields[dword[0][0]]      # (a Fixup: a dword the driver fills when it places the packet, e.g. a marker)
      if isinstance(v, Bits) and v.width != 32: raise PacketError(f"{name}.{dword[0][0]}: {v!r} is not 32 bits of a value")
      words.append(v); seen.add(dword[0][0]); continue
    value = 0
    for field, lo, width in dword:
      if field not in fields: continue
      v = fields[field]; seen.add(field)
      if not isinstance(v, int): raise PacketError(f"{name}.{field}={v!r}: a symbolic value goes in as 32 Bits "
                                                  "(drivers/encoded.py) of a field that fills a whole dword")
      if not 0 <= v < (1 << width): raise PacketError(f"{name}.{field}={v:#x} does not fit in {width} bits")
      value |= v << lo
    words.append(value)
  unknown = set(fields) - seen
  if unknown: raise PacketError(f"{name}: unknown field(s) {sorted(unknown)}")
  return words


def packet(name: str, **fields) -> list:
  """Header + body of a fixed-layout packet (see PACKETS)."""
  body = pack_fields(PACKETS[name], fields, name)
  return [header(OPCODES[name], len(body))] + body


def set_sh_reg(register: str, *values) -> list:
  """SET_SH_REG: consecutive registers from `register` (a value may be 32 `Bits` of a symbolic value)."""
  return [header(OPCODES["SET_SH_REG"], 1 + len(values)), sh_offset(register), *values]


def nop(dwords: int) -> list[int]:
  """Exactly `dwords` dwords of NOP."""
  if dwords <= 0: return []
  if dwords == 1: return [header(OPCODES["NOP"], NOP_ONE_DWORD + 1)]
  return [header(OPCODES["NOP"], dwords - 1)] + [0] * (dwords - 1)


# ---- decoding (the emulated command processor and the driver's hang report read packets with the same tables) ----

def decode(words, pos: int) -> tuple[str, dict, int]:
  """(name, fields, size in dwords) of the packet starting at words[pos]."""
  hdr = int(words[pos])
  if hdr >> 30 != PACKET_TYPE3: raise PacketError(f"dword {hdr:#010x} is not a PM4 type-3 header")
  opcode, count = (hdr >> 8) & 0xFF, (hdr >> 16) & 0x3FFF
  name = NAMES.get(opcode, f"OPCODE_{opcode:#04x}")
  if name == "NOP": return name, {}, 1 if count == NOP_ONE_DWORD else count + 2
  size = count + 2
  if pos + size > len(words): raise PacketError(f"{name} packet of {size} dwords runs past the end of the buffer")
  body = [int(w) for w in words[pos + 1:pos + size]]
  if name == "SET_SH_REG":
    return name, {"register": body[0] + SET_SH_REG_START - SH_REG_BASE, "values": body[1:]}, size
  layout = PACKETS.get(name)
  if layout is None: return name, {"opcode": opcode, "body": body}, size
  if len(body) != len(layout): raise PacketError(f"{name} has {len(body)} body dwords, expected {len(layout)}")
  fields = {}
  for dword, value in zip(layout, body):
    for field, lo, width in dword: fields[field] = (value >> lo) & ((1 << width) - 1)
  return name, fields, size


def wait64_operands(fields: dict) -> tuple[int, int, int]:
  """(address, 64-bit mask, 64-bit reference) of a decoded WAIT_REG_MEM64."""
  return (fields["addr_hi"] << 32 | fields["addr_lo"] & ~7, fields["mask_hi"] << 32 | fields["mask"],
          fields["reference_hi"] << 32 | fields["reference"])


def describe(name: str, fields: dict) -> str:
  if name == "SET_SH_REG":
    reg = fields["register"]
    return f"SET_SH_REG {REGISTER_NAMES.get(reg, hex(reg))} = {', '.join(hex(v) for v in fields['values'])}"
  if name == "WAIT_REG_MEM":
    func = {v: k for k, v in FUNC.items()}.get(fields["function"], fields["function"])
    if fields["mem_space"] == 0:       # registers: the HDP flush's write-wait-write names them
      regs = {HDP_FLUSH_REQ: "GPU_HDP_FLUSH_REQ", HDP_FLUSH_DONE: "GPU_HDP_FLUSH_DONE"}
      reg0, reg1 = (regs.get(fields[a], f"register {fields[a]:#x}") for a in ("addr_lo", "addr_hi"))
      what = f"write {reg0}, wait {reg1}" if fields["operation"] == WAIT_REG_MEM_WRITE_WAIT_WRITE else f"wait {reg0}"
      return f"WAIT_REG_MEM ({what}) & {fields['mask']:#x} {func} {fields['reference']:#x}"
    return (f"WAIT_REG_MEM [{fields['addr_hi'] << 32 | fields['addr_lo']:#x}] & {fields['mask']:#x} {func} "
            f"{fields['reference']:#x}")
  if name == "WAIT_REG_MEM64":
    func = {v: k for k, v in FUNC.items()}.get(fields["function"], fields["function"])
    addr, mask, ref = wait64_operands(fields)
    return f"WAIT_REG_MEM64 [{addr:#x}] & {mask:#x} {func} {ref:#x}"
  if "body" in fields: return f"{name} (unknown opcode, body {' '.join(f'{w:#x}' for w in fields['body'])})"
  return f"{name} " + " ".join(f"{k}={v:#x}" for k, v in fields.items() if v)
