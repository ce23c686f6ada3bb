"""The logic around the PM4 / SDMA tables (drivers/amd/pm4.py, sdma.py): field limits, NOP sizes, decoding of
truncated or unknown packets, the WAIT_REG_MEM64 operands and the hang report's descriptions, at their boundaries.

tests/amd/test_amd_hw_tables.py checks the tables against the headers; this file checks the code that reads them, with
inputs at the edges (a value exactly at a field's limit and one past it, a packet one dword short, the reserved low
bits of an address set), where a wrong comparison or mask would otherwise go unnoticed. Expected words are computed
here from the PM4 / SDMA header macros (nvd.h PACKET3(), sdma_v6_0_0_pkt_open.h), not with the driver's encoder.
"""
import pytest

from baregrad.drivers.amd import pm4, sdma

# nvd.h: PACKET3(op, n) = 3 << 30 | (n & 0x3FFF) << 16 | (op & 0xFF) << 8; PACKET3_COMPUTE sets bit 1
NOP, SET_SH_REG, DMA_DATA, WAIT_REG_MEM, WAIT_REG_MEM64, EVENT_WRITE = 0x10, 0x76, 0x50, 0x3C, 0x93, 0x46


def P3(op, n): return 3 << 30 | (n & 0x3FFF) << 16 | (op & 0xFF) << 8 | 1 << 1


# sdma_v6_0_0_pkt_open.h: SDMA_OP_COPY 1, SDMA_OP_TIMESTAMP 13, SDMA_OP_FENCE 5; header op 7:0, sub_op 15:8, NOP count 29:16
def SDMA_HDR(op, sub_op=0): return op | sub_op << 8


# ==== pack_fields: a value fits its field or is refused ==================================================================

@pytest.mark.parametrize("field, width", [("event_type", 6), ("event_index", 4)])
def test_pm4_field_value_at_its_limit_and_one_past(field, width):
    """EVENT_WRITE event_type is 6 bits, event_index 4 ([nvd] masks 0x3F, 0xF): the largest value packs, 1 << width
    does not, and neither does a negative value."""
    lo = {"event_type": 0, "event_index": 8}[field]
    assert pm4.packet("EVENT_WRITE", **{field: (1 << width) - 1}) == [P3(EVENT_WRITE, 0), ((1 << width) - 1) << lo]
    for bad in (1 << width, (1 << width) + 1, -1):
        with pytest.raises(pm4.PacketError, match=f"EVENT_WRITE.{field}=.* does not fit in {width} bits"):
            pm4.packet("EVENT_WRITE", **{field: bad})


def test_sdma_field_value_at_its_limit_and_one_past():
    """COPY_LINEAR count is 30 bits (SDMA_PKT_COPY_LINEAR_COUNT_count_mask 0x3FFFFFFF), COND_EXE exec_count 14."""
    assert sdma.packet("COPY_LINEAR", count=(1 << 30) - 1)[1] == 0x3FFFFFFF
    with pytest.raises(pm4.PacketError, match="count=0x40000000 does not fit in 30 bits"):
        sdma.packet("COPY_LINEAR", count=1 << 30)
    assert sdma.packet("COND_EXE", exec_count=0x3FFF)[4] == 0x3FFF
    with pytest.raises(pm4.PacketError, match="does not fit in 14 bits"):
        sdma.packet("COND_EXE", exec_count=0x4000)


def test_a_full_width_field_takes_every_32_bit_value_and_no_more():
    assert pm4.packet("DMA_DATA", src_addr_lo=0xFFFFFFFF)[2] == 0xFFFFFFFF
    with pytest.raises(pm4.PacketError, match="does not fit in 32 bits"):
        pm4.packet("DMA_DATA", src_addr_lo=1 << 32)


# ==== NOPs of every small size ===========================================================================================

def test_pm4_nop_sizes():
    """0 dwords: nothing; 1: the header-only NOP (count 0x3FFF, amdgpu's ring nop); n: header with count n - 2."""
    assert pm4.nop(0) == [] and pm4.nop(-3) == []
    assert pm4.nop(1) == [P3(NOP, 0x3FFF)]
    assert pm4.nop(2) == [P3(NOP, 0), 0]
    assert pm4.nop(3) == [P3(NOP, 1), 0, 0]
    for n in range(1, 6):
        words = pm4.nop(n) + [P3(NOP, 0x3FFF)]
        assert pm4.decode(words, 0) == ("NOP", {}, n)


def test_sdma_nop_sizes():
    """0 dwords: nothing; n: a header whose COUNT (29:16) is n - 1, then n - 1 zeros."""
    assert sdma.nop(0) == [] and sdma.nop(-1) == []
    assert sdma.nop(1) == [SDMA_HDR(0)]
    assert sdma.nop(3) == [SDMA_HDR(0) | 2 << 16, 0, 0]
    for n in range(1, 5):
        name, fields, size = sdma.decode(sdma.nop(n), 0)
        assert (name, fields["count"], size) == ("NOP", n - 1, n)


# ==== decoding a buffer that ends inside a packet =========================================================================

def test_pm4_decode_refuses_a_truncated_packet():
    """A packet whose count runs past the end of the words is an error, whatever the packet (SET_SH_REG has no fixed
    layout to catch it later; DMA_DATA has), and a packet that ends exactly at the end decodes."""
    set_sh = [P3(SET_SH_REG, 3), 0x1E0, 1, 2, 3]
    assert pm4.decode(set_sh, 0)[2] == 5
    for words in (set_sh[:-1], set_sh[:2], [P3(DMA_DATA, 5)] + [0] * 5, [P3(0x9A, 4), 0, 0]):
        with pytest.raises(pm4.PacketError, match="runs past the end of the buffer"):
            pm4.decode(words, 0)
    # at an offset: the same packet after two NOP dwords, one dword short
    with pytest.raises(pm4.PacketError, match="SET_SH_REG packet of 5 dwords runs past the end"):
        pm4.decode([P3(NOP, 0), 0] + set_sh[:-1], 2)
    assert pm4.decode([P3(NOP, 0), 0] + set_sh, 2)[2] == 5


def test_sdma_decode_refuses_a_truncated_packet():
    fence = [SDMA_HDR(5), 0x1000, 0, 7]
    assert sdma.decode(fence, 0)[2] == 4
    with pytest.raises(pm4.PacketError, match="SDMA FENCE packet of 4 dwords runs past the end of the buffer"):
        sdma.decode(fence[:-1], 0)
    with pytest.raises(pm4.PacketError, match="SDMA NOP packet of 3 dwords runs past the end"):
        sdma.decode([SDMA_HDR(0) | 2 << 16, 0], 0)
    with pytest.raises(pm4.PacketError, match="runs past the end"):
        sdma.decode([0, 0] + fence[:-1], 2)


def test_sdma_decode_reads_all_eight_sub_op_bits():
    """Only (op, sub_op) pairs of the table decode: SDMA_SUBOP_COPY_TILED (1) and a TIMESTAMP sub_op other than
    GET_GLOBAL (2) are unknown, not taken for COPY_LINEAR (sub_op 0) / GET_GLOBAL."""
    for hdr in (SDMA_HDR(1, 1), SDMA_HDR(13, 3), SDMA_HDR(13, 0x82), SDMA_HDR(1, 0x80)):
        with pytest.raises(pm4.PacketError, match="unknown SDMA packet"):
            sdma.decode([hdr] + [0] * 12, 0)
    assert sdma.decode([SDMA_HDR(13, 2), 0x1000, 0], 0)[0] == "TIMESTAMP"


# ==== WAIT_REG_MEM64 operands and the hang report's text ===================================================================

def test_wait64_operands_mask_the_reserved_address_bits_and_join_the_halves():
    """[pal] PM4_MEC_WAIT_REG_MEM64: addr_lo bits 2:0 are reserved (the polled qword is 8-byte aligned); reference and
    mask are 64 bits, low dword first."""
    words = [P3(WAIT_REG_MEM64, 7), 5 | 1 << 4, 0xFFFF_FFFF, 0x7F12, 0x1111_2222, 0x3333_4444, 0x5555_6666, 0x7777_8888, 4]
    name, fields, size = pm4.decode(words, 0)
    assert (name, size) == ("WAIT_REG_MEM64", 9)
    assert pm4.wait64_operands(fields) == (0x7F12_FFFF_FFF8, 0x7777_8888_5555_6666, 0x3333_4444_1111_2222)
    fields["addr_lo"] = 0x1000_0007
    assert pm4.wait64_operands(fields)[0] == 0x7F12_1000_0000
    assert pm4.describe(name, pm4.decode(words, 0)[1]) == \
        "WAIT_REG_MEM64 [0x7f12fffffff8] & 0x7777888855556666 >= 0x3333444411112222"


def test_describe_wait_reg_mem_on_registers_and_on_memory():
    """MEM_SPACE 0 polls registers: the HDP flush (OPERATION 1, write REQ then wait DONE) names them; MEM_SPACE 1 polls
    memory at addr_hi:addr_lo."""
    req, done = pm4.HDP_FLUSH_REQ, pm4.HDP_FLUSH_DONE
    hdp = [P3(WAIT_REG_MEM, 5), 3 | 0 << 4 | 1 << 6, req, done, 0x3FC, 0x3FC, 0x20]
    assert pm4.describe(*pm4.decode(hdp, 0)[:2]) == \
        "WAIT_REG_MEM (write GPU_HDP_FLUSH_REQ, wait GPU_HDP_FLUSH_DONE) & 0x3fc == 0x3fc"
    plain = [P3(WAIT_REG_MEM, 5), 3 | 0 << 4 | 0 << 6, 0x1234, 0, 0x1, 0xFF, 0x20]      # OPERATION 0: wait only
    assert pm4.describe(*pm4.decode(plain, 0)[:2]) == "WAIT_REG_MEM (wait register 0x1234) & 0xff == 0x1"
    mem = [P3(WAIT_REG_MEM, 5), 5 | 1 << 4, 0x0000_1000, 0x7F, 0x9, 0xFFFFFFFF, 4]      # MEM_SPACE 1, '>='
    assert pm4.describe(*pm4.decode(mem, 0)[:2]) == "WAIT_REG_MEM [0x7f00001000] & 0xffffffff >= 0x9"
    mem_space_2 = [P3(WAIT_REG_MEM, 5), 3 | 2 << 4, 0x0000_1000, 0x7F, 0x9, 0xFF, 4]    # not registers either
    assert pm4.describe(*pm4.decode(mem_space_2, 0)[:2]).startswith("WAIT_REG_MEM [0x7f00001000]")


def test_sdma_describe():
    """POLL_REGMEM names its address, mask, compare function ([cik] FUNC 5 '>=') and reference; other packets list
    their non-zero fields other than op / sub_op."""
    poll = [SDMA_HDR(8) | 5 << 28 | 1 << 31, 0x0000_2000, 0x7F, 0x42, 0xFFFF_0000, 10 | 0xFFF << 16]
    assert sdma.describe(*sdma.decode(poll, 0)[:2]) == "POLL_REGMEM [0x7f00002000] & 0xffff0000 >= 0x42"
    fence = [SDMA_HDR(5) | 3 << 16, 0x1000, 0x7F, 9]
    assert sdma.describe(*sdma.decode(fence, 0)[:2]) == "FENCE mtype=0x3 addr_lo=0x1000 addr_hi=0x7f data=0x9"
