"""The logic around the NV tables (drivers/nv/qmd.py, pushbuf.py): field limits, rounding, address splits and the
bounds of method headers and GPFIFO entries, at their boundaries.

tests/nv/test_nv_hw_tables.py checks the tables against NVIDIA's headers; this file checks the code that uses them, with
inputs at the edges — a value exactly at a field's limit and one past it, sizes one above a rounding step, a constant
buffer above 2**38 (where V04_00 splits its address), a QMD whose bank 0 is not valid — where a wrong comparison,
rounding or shift would otherwise go unnoticed. Expected values are worked out by hand from the header definitions
(DOC classes/compute/clcbc0qmd.h, clc6c0qmd.h; OGKM class/clc56f.h, clc86f.h; see test_nv_hw_tables.py for the commits).
"""
import pytest

from baregrad.drivers.nv import pushbuf as pb, qmd

V4, V3 = (4, 0), (3, 0)


def _launch(version, **kw):
  args = dict(program=0x7F12_3456_7800, cbufs={}, grid=(1, 1, 1), block=(32, 1, 1), registers=16, shared=0,
              barriers=0, sm_config=(8 << 10, 8 << 10, 228 << 10), sass_version=0x90)
  args.update(kw)
  return qmd.launch_fields(version, **args)


# ==== qmd.pack: a value fits its field or is refused ======================================================================

@pytest.mark.parametrize("version", [V4, V3])
def test_pack_takes_a_field_at_its_limit_and_refuses_one_past(version):
  table = qmd.TABLES[version]
  for name in ("QMD_GROUP_ID", "SHARED_MEMORY_SIZE", "PROGRAM_ADDRESS_UPPER", "BARRIER_COUNT", "SASS_VERSION"):
    hi, lo = table[name]
    width = hi - lo + 1
    top = (1 << width) - 1
    assert int.from_bytes(qmd.pack(table, {name: top}), "little") == top << lo, name
    for bad in (1 << width, -1):
      with pytest.raises(ValueError, match=f"QMD field {name}=.* does not fit in {width} bits"):
        qmd.pack(table, {name: bad})
  with pytest.raises(KeyError, match="not in this QMD version's table"):
    qmd.pack(table, {"NO_SUCH_FIELD": 0})


def test_pack_of_a_32_bit_field():
  """GRID_WIDTH MW(1055:1024) is 32 bits: 0xFFFFFFFF packs into dword 32, 1 << 32 does not."""
  assert qmd.pack(qmd.V04_00, {"GRID_WIDTH": 0xFFFF_FFFF})[128:132] == b"\xff\xff\xff\xff"
  with pytest.raises(ValueError, match="does not fit in 32 bits"):
    qmd.pack(qmd.V04_00, {"GRID_WIDTH": 1 << 32})


# ==== launch_fields: rounding and address splits ===========================================================================

@pytest.mark.parametrize("version", [V4, V3])
def test_shared_memory_rounds_up_to_256_bytes(version):
  for shared, want in ((0, 0), (1, 256), (255, 256), (256, 256), (257, 512), (1025, 1280), (48 << 10, 48 << 10),
                       ((48 << 10) + 1, (48 << 10) + 256)):
    assert _launch(version, shared=shared)["SHARED_MEMORY_SIZE"] == want, shared


@pytest.mark.parametrize("version", [V4, V3])
def test_local_memory_rounds_up_to_16_bytes(version):
  f = _launch(version)                                  # no local memory asked for: both sizes 0
  assert (f["SHADER_LOCAL_MEMORY_LOW_SIZE"], f["SHADER_LOCAL_MEMORY_HIGH_SIZE"]) == (0, 0)
  for size, want in ((1, 16), (15, 16), (16, 16), (17, 32), (33, 48), (48, 48), (0x341, 0x350)):
    f = _launch(version, local_low=size, local_high=size)
    assert (f["SHADER_LOCAL_MEMORY_LOW_SIZE"], f["SHADER_LOCAL_MEMORY_HIGH_SIZE"]) == (want, want), size


@pytest.mark.parametrize("version", [V4, V3])
def test_constant_buffer_size_rounds_up_to_16_bytes(version):
  """CONSTANT_BUFFER_SIZE_SHIFTED4 holds the size in 16-byte units, rounded up."""
  for size, want in ((16, 1), (17, 2), (31, 2), (32, 2), (0x2F4, 0x30), (0x10000, 0x1000)):
    f = _launch(version, cbufs={0: (0x20_0000_1000, size)})
    assert f["CONSTANT_BUFFER_SIZE_SHIFTED4_0"] == want, size


@pytest.mark.parametrize("addr, lower, upper", [
  (0x40_0000_0000, 0x0000_0000, 0x1),            # 2**38: the first address with an UPPER_SHIFTED6 bit
  (0x1F5_3456_7840, 0xD4D1_59E1, 0x7),           # (addr >> 6) & 0xFFFFFFFF, addr >> 38, worked out by hand
  (0xFF_FFFF_FFC0, 0xFFFF_FFFF, 0x3),            # the top of a 40-bit address space
  (0x3F_FFFF_FFC0, 0xFFFF_FFFF, 0x0),            # just below 2**38: all in LOWER_SHIFTED6
])
def test_v04_constant_buffer_address_above_2_38(addr, lower, upper):
  """QMD V04_00 CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6 holds address bits 37:6, ADDR_UPPER_SHIFTED6 bits 56:38."""
  f = _launch(V4, cbufs={1: (addr, 0x100)})
  assert (f["CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_1"], f["CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_1"]) == (lower, upper)
  launch = qmd.read_launch(V4, qmd.pack(qmd.V04_00, f))
  assert launch["cbufs"] == {1: (addr, 0x100)}


def test_v04_constant_buffer_must_be_64_byte_aligned():
  for addr in (0x20_0000_1001, 0x20_0000_1020, 0x20_0000_103F, 0x20_0000_1002):
    with pytest.raises(ValueError, match="is not 64-byte aligned"):
      _launch(V4, cbufs={0: (addr, 0x100)})
  assert _launch(V4, cbufs={0: (0x20_0000_1040, 0x100)})["CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0"] == 0x8000_0041


def test_v03_constant_buffer_and_program_addresses_split_at_bit_32():
  """V03_00 CONSTANT_BUFFER_ADDR_LOWER / _UPPER and PROGRAM_ADDRESS_LOWER / _UPPER: bits 31:0 and the rest, every bit
  of the low word carried (an address with its low bits set)."""
  f = _launch(V3, program=0x1_FFFF_FFFF, cbufs={3: (0x7F_FFFF_FFFF, 0x40)})
  assert (f["CONSTANT_BUFFER_ADDR_LOWER_3"], f["CONSTANT_BUFFER_ADDR_UPPER_3"]) == (0xFFFF_FFFF, 0x7F)
  assert (f["PROGRAM_ADDRESS_LOWER"], f["PROGRAM_ADDRESS_UPPER"]) == (0xFFFF_FFFF, 0x1)
  launch = qmd.read_launch(V3, qmd.pack(qmd.V03_00, f))
  assert launch["program"] == 0x1_FFFF_FFFF and launch["cbufs"] == {3: (0x7F_FFFF_FFFF, 0x40)}
  f = _launch(V4, program=0x1_FFFF_FFFF)
  assert (f["PROGRAM_ADDRESS_LOWER"], f["PROGRAM_ADDRESS_UPPER"]) == (0xFFFF_FFFF, 0x1)


@pytest.mark.parametrize("version", [V4, V3])
def test_read_launch_without_bank_0(version):
  """Only bank 2 valid: no bank-0 address, size or valid bit is reported."""
  addr = 0x20_0000_2000
  launch = qmd.read_launch(version, qmd.pack(qmd.TABLES[version], _launch(version, cbufs={2: (addr, 0x9A)})))
  assert launch["cbufs"] == {2: (addr, 0xA0)}
  assert (launch["cbuf0"], launch["cbuf0_valid"], launch["cbuf0_size"]) == (0, 0, 0)


def test_sm_config_carveout_encoding():
  """bytes / 4096 + 1 (Mesa NVK gv100_sm_config_smem_size); not a multiple of 4 KiB is an error; 0 encodes nothing."""
  assert [qmd.sm_config_shared_mem(n) for n in (0, 4096, 228 << 10)] == [1, 2, 58]
  for bad in (1, 4095, 4097):
    with pytest.raises(ValueError, match="not a multiple of 4 KiB"):
      qmd.sm_config_shared_mem(bad)
  assert [qmd.sm_config_bytes(v) for v in (1, 2, 58)] == [0, 4096, 228 << 10] and qmd.sm_config_bytes(0) is None


# ==== method headers and GPFIFO entries at their bounds ======================================================================

def test_method_header_bounds():
  """ADDRESS 11:0 holds method >> 2 (methods below 0x4000, word aligned), COUNT 28:16 1..0x1FFF."""
  assert pb.method_header(0, 0x3FFC, 1) == 0x2001_0FFF
  assert pb.method_header(0, 0x0000, 0x1FFF) == 0x3FFF_0000
  for method in (0x4000, 0x4004, 0x0001, 0x0002, 0x0003, -4):
    with pytest.raises(ValueError, match="is not a word offset below 0x4000"):
      pb.method_header(0, method, 1)
  for count in (0, 0x2000, -1):
    with pytest.raises(ValueError, match="does not fit in 13 bits"):
      pb.method_header(0, 0x100, count)


def test_gp_entry_bounds():
  """GET 31:2 + GET_HI 7:0: a 4-byte aligned address below 2**40; LENGTH 30:10: 1 .. 2**21 - 1 words."""
  top = (1 << 40) - 4
  assert pb.gp_entry(top, 1) == (0xFFFF_FFFC, 0xFF | 1 << 10)
  assert pb.decode_gp_entry(*pb.gp_entry(top, (1 << 21) - 1)) == (top, (1 << 21) - 1)
  assert pb.gp_entry(0, 1) == (0, 1 << 10)
  for address in (1 << 40, (1 << 40) + 4, -4, 0x1001, 0x1003):
    with pytest.raises(ValueError, match="must be 4-byte aligned and below 2\\*\\*40"):
      pb.gp_entry(address, 1)
  for n in (0, 1 << 21, -1):
    with pytest.raises(ValueError, match="pushbuffer segment of"):
      pb.gp_entry(0x1000, n)


def test_decode_gp_entry_reads_only_the_address_and_length_bits():
  """OGKM class/clc86f.h: GP_ENTRY0_FETCH 0:0 (CONDITIONAL 1) sits below GET 31:2, and GP_ENTRY1 LEVEL 9:9 / SYNC
  31:31 beside LENGTH 30:10: none of them is part of the address or the length."""
  fetch_conditional, level_subroutine, sync_wait = 1 << 0, 1 << 9, 1 << 31
  assert pb.decode_gp_entry(0x1000 | fetch_conditional, 0x12 | 5 << 10) == (0x12_0000_1000, 5)
  assert pb.decode_gp_entry(0xFFFF_FFFF, 0xFF | level_subroutine | sync_wait | 7 << 10) == (0xFF_FFFF_FFFC, 7)
