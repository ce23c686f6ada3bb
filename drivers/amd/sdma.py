"""SDMA v6 (gfx11 system DMA) packets: tables of fields, one encoder, one decoder.

Source: Linux drivers/gpu/drm/amd/amdgpu/sdma_v6_0_0_pkt_open.h (SDMA_OP_* / SDMA_SUBOP_* and the
SDMA_PKT_<packet>_<word>_<field>_{offset,mask,shift} definitions). The copy chunk size follows
amdgpu/sdma_v6_0.c (`copy_max_bytes = 0x400000`), well inside the 30-bit COUNT field (count = bytes - 1).
"""
from __future__ import annotations
from .pm4 import pack_fields, PacketError   # one field packer for both packet families
from ..encoded import lo32, hi32

OP = {"NOP": 0, "COPY": 1, "WRITE": 2, "INDIRECT": 4, "FENCE": 5, "TRAP": 6, "POLL_REGMEM": 8, "COND_EXE": 9,
      "ATOMIC": 10, "CONST_FILL": 11, "TIMESTAMP": 13}
SUBOP_COPY_LINEAR, SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
COPY_MAX_BYTES = 0x400000
FUNC = {"always": 0, "<": 1, "<=": 2, "==": 3, "!=": 4, ">=": 5, ">": 6}

HEADER = [("op", 0, 8), ("sub_op", 8, 8)]
# (op, sub_op) -> name, and each packet's dwords as lists of (field, lowest bit, width); dword 0 is the header
PACKETS: dict[str, tuple[int, int, list[list[tuple[str, int, int]]]]] = {
  "NOP": (0, 0, [HEADER + [("count", 16, 14)]]),
  "COPY_LINEAR": (1, SUBOP_COPY_LINEAR, [HEADER + [("encrypt", 16, 1), ("tmz", 18, 1), ("cpv", 19, 1), ("backwards", 25, 1),
                                                   ("broadcast", 27, 1)],
                                         [("count", 0, 30)],
                                         [("dst_sw", 16, 2), ("dst_cache_policy", 18, 3), ("src_sw", 24, 2),
                                          ("src_cache_policy", 26, 3)],
                                         [("src_addr_lo", 0, 32)], [("src_addr_hi", 0, 32)],
                                         [("dst_addr_lo", 0, 32)], [("dst_addr_hi", 0, 32)]]),
  "INDIRECT": (4, 0, [HEADER + [("vmid", 16, 4), ("priv", 31, 1)], [("ib_base_lo", 0, 32)], [("ib_base_hi", 0, 32)],
                      [("ib_size", 0, 20)], [("csa_addr_lo", 0, 32)], [("csa_addr_hi", 0, 32)]]),
  "FENCE": (5, 0, [HEADER + [("mtype", 16, 3), ("gcc", 19, 1), ("sys", 20, 1), ("snp", 22, 1), ("gpa", 23, 1),
                             ("l2_policy", 24, 2), ("llc_policy", 26, 1), ("cpv", 28, 1)],
                   [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("data", 0, 32)]]),
  "TRAP": (6, 0, [HEADER, [("int_context", 0, 28)]]),
  "POLL_REGMEM": (8, 0, [HEADER + [("cache_policy", 20, 3), ("cpv", 24, 1), ("hdp_flush", 26, 1), ("func", 28, 3),
                                   ("mem_poll", 31, 1)],
                         [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("value", 0, 32)], [("mask", 0, 32)],
                         [("interval", 0, 16), ("retry_count", 16, 12)]]),
  "TIMESTAMP": (13, SUBOP_TIMESTAMP_GET_GLOBAL, [HEADER, [("addr_lo", 0, 32)], [("addr_hi", 0, 32)]]),
  # runs the next exec_count dwords if the dword at addr equals reference, else skips them
  "COND_EXE": (9, 0, [HEADER, [("addr_lo", 0, 32)], [("addr_hi", 0, 32)], [("reference", 0, 32)], [("exec_count", 0, 14)]]),
}
BY_OPCODE = {(op, sub): name for name, (op, sub, _) in PACKETS.items()}
# The HDP flush a user-mode SDMA queue issues: ROCr runtime/hsa-runtime/core/inc/sdma_registers.h SDMA_PKT_HDP_FLUSH
# (amd_blit_sdma.cpp BuildHdpFlushCommand copies it as is; "Version of gfx9 sDMA microcode introducing
# SDMA_PKT_HDP_FLUSH" 0x1A5). Its header is POLL_REGMEM's opcode with no HDP_FLUSH bit: the register form of
# sdma_v6_0_ring_emit_hdp_flush is for amdgpu's privileged kernel rings.
HDP_FLUSH_PACKET = [0x8, 0x0, 0x80000000, 0x0, 0x0, 0x0]
# SDMA indirect buffers: the INDIRECT packet ends on an 8-dword ring boundary and the IB is a multiple of 8 dwords
# (sdma_v6_0_ring_emit_ib, sdma_v6_0_ring_pad_ib)
IB_ALIGN_DWORDS = 8


def packet(name: str, **fields) -> list:
  """All dwords of one packet; a dword that is one full-width field may hold a symbolic value."""
  op, sub_op, layout = PACKETS[name]
  return pack_fields(layout, {"op": op, "sub_op": sub_op, **fields}, f"SDMA {name}")


def copy_linear_packets(dst, src, nbytes: int) -> list[list]:
  """One COPY_LINEAR packet per legal chunk of `nbytes`; `dst` and `src` may be symbolic (their Bits go into the
  address dwords, drivers/encoded.py)."""
  out = []
  for off in range(0, nbytes, COPY_MAX_BYTES):
    n = min(COPY_MAX_BYTES, nbytes - off)
    out.append(packet("COPY_LINEAR", count=n - 1, src_addr_lo=lo32(src + off), src_addr_hi=hi32(src + off),
                      dst_addr_lo=lo32(dst + off), dst_addr_hi=hi32(dst + off)))
  return out


def copy_linear(dst: int, src: int, nbytes: int) -> list[int]:
  """COPY_LINEAR packets for `nbytes`, split into legal chunks, as one list of dwords."""
  return [w for p in copy_linear_packets(dst, src, nbytes) for w in p]


def nop(dwords: int) -> list[int]:
  """Exactly `dwords` dwords: one NOP header whose COUNT covers the rest."""
  if dwords <= 0: return []
  return packet("NOP", count=dwords - 1) + [0] * (dwords - 1)


def decode(words, pos: int) -> tuple[str, dict, int]:
  """(name, fields, size in dwords) of the packet at words[pos]; unknown packets raise PacketError."""
  hdr = int(words[pos])
  op, sub_op = hdr & 0xFF, (hdr >> 8) & 0xFF
  name = BY_OPCODE.get((op, sub_op))
  if name is None: raise PacketError(f"unknown SDMA packet: header {hdr:#010x} (op {op}, sub_op {sub_op})")
  layout = PACKETS[name][2]
  size = ((hdr >> 16) & 0x3FFF) + 1 if name == "NOP" else len(layout)
  if pos + size > len(words): raise PacketError(f"SDMA {name} packet of {size} dwords runs past the end of the buffer")
  fields = {}
  for dword, value in zip(layout, words[pos:pos + len(layout)]):
    for field, lo, width in dword: fields[field] = (int(value) >> lo) & ((1 << width) - 1)
  return name, fields, size


def describe(name: str, fields: dict) -> str:
  if name == "POLL_REGMEM":
    func = {v: k for k, v in FUNC.items()}.get(fields["func"], fields["func"])
    return (f"POLL_REGMEM [{fields['addr_hi'] << 32 | fields['addr_lo']:#x}] & {fields['mask']:#x} {func} "
            f"{fields['value']:#x}")
  return f"{name} " + " ".join(f"{k}={v:#x}" for k, v in fields.items() if v and k not in ("op", "sub_op"))
