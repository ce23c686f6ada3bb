"""The NV hardware tables against NVIDIA's headers, and the emulated GPU rejecting what they do not define.

drivers/nv/qmd.py, pushbuf.py and rm.py hold the facts the driver encodes with; drivers/emu decodes with the very same
tables, so a wrong constant there passes every end-to-end test. This file is a second, independent transcription of
every constant those three files define, written from the headers (not from the driver's tables), each block naming
its header, and tests that compare every entry, not a sample: QMD field bit ranges (both versions), pushbuffer method
offsets and field values, class ids, escape / ioctl / control numbers, status codes, RM and UVM struct sizes and field
offsets. The encoders' output is pinned bit for bit (a QMD with a distinct value in every field, method headers and
GPFIFO entries as hand-computed words).

Sources (the driver targets the 580 series):
  OGKM = NVIDIA/open-gpu-kernel-modules, tag 580.142 (commit 1a5075f82128be3603d4a4657c7b689234306778)
  DOC  = NVIDIA/open-gpu-doc, commit c8607fe576b53ff821ffcf97e7548d2de11c4eaf (classes/compute/*qmd.h and the compute
         class headers, which OGKM does not carry in full; classes/dma-copy/clc8b5.h)
Struct layouts are those gcc (x86-64 Linux, the driver's ABI) gives the headers' structs. Set
NV_OPEN_GPU_KERNEL_MODULES and/or NV_OPEN_GPU_DOC to checkouts of those (OGKM at tag 580.142) and the gcc probes at the
end compile the headers themselves and check this transcription and the driver's cffi layouts against them.
"""
import os, re, shutil, subprocess, time
import pytest

from baregrad.drivers.encoded import Encoded
from baregrad.drivers.nv import pushbuf as pb, qmd, rm


def _mw(text: str, i: int = 0) -> tuple[int, int]:
  """(hi, lo) of a header's `MW(hi:lo)` (hi and lo may be expressions of the index `(i)`)."""
  m = re.fullmatch(r"MW\((.*)\)", text.strip())
  hi, lo = m.group(1).split(":")
  return eval(hi, {"__builtins__": {}}, {"i": i}), eval(lo, {"__builtins__": {}}, {"i": i})


def _qmd_table(header_lines: str, count: int = 8) -> dict:
  """Field name -> (hi, lo) from `NAME MW(...)` lines; an indexed field `NAME(i)` becomes NAME_0 .. NAME_{count-1}."""
  table = {}
  for line in header_lines.strip().splitlines():
    name, macro = line.split(None, 1)
    if name.endswith("(i)"):
      for i in range(count): table[f"{name[:-3]}_{i}"] = _mw(macro, i)
    else: table[name] = _mw(macro)
  return table


# ==== QMD ========================================================================================================
# DOC classes/compute/clcbc0qmd.h (HOPPER_COMPUTE_A), "Queue Meta Data, Version 04_00": NVCBC0_QMDV04_00_<NAME>.
QMD_V04_00_HEADER = """
QMD_GROUP_ID                              MW(21:16)
QMD_TYPE                                  MW(25:23)
CONSTANT_BUFFER_VALID(i)                  MW((416+(i)*4):(416+(i)*4))
SHADER_LOCAL_MEMORY_LOW_SIZE              MW(535:512)
SASS_VERSION                              MW(543:536)
SHADER_LOCAL_MEMORY_HIGH_SIZE             MW(567:544)
API_VISIBLE_CALL_LIMIT                    MW(568:568)
SAMPLER_INDEX                             MW(569:569)
QMD_MINOR_VERSION                         MW(579:576)
QMD_MAJOR_VERSION                         MW(583:580)
SHARED_MEMORY_SIZE                        MW(601:584)
INVALIDATE_TEXTURE_HEADER_CACHE           MW(602:602)
INVALIDATE_TEXTURE_SAMPLER_CACHE          MW(603:603)
INVALIDATE_TEXTURE_DATA_CACHE             MW(604:604)
INVALIDATE_SHADER_DATA_CACHE              MW(605:605)
INVALIDATE_INSTRUCTION_CACHE              MW(606:606)
INVALIDATE_SHADER_CONSTANT_CACHE          MW(607:607)
MIN_SM_CONFIG_SHARED_MEM_SIZE             MW(613:608)
MAX_SM_CONFIG_SHARED_MEM_SIZE             MW(619:614)
TARGET_SM_CONFIG_SHARED_MEM_SIZE          MW(625:620)
GRID_WIDTH                                MW(1055:1024)
GRID_HEIGHT                               MW(1071:1056)
GRID_DEPTH                                MW(1103:1088)
CTA_THREAD_DIMENSION0                     MW(1167:1152)
CTA_THREAD_DIMENSION1                     MW(1183:1168)
CTA_THREAD_DIMENSION2                     MW(1199:1184)
REGISTER_COUNT                            MW(1208:1200)
BARRIER_COUNT                             MW(1215:1211)
PROGRAM_ADDRESS_LOWER                     MW(1247:1216)
PROGRAM_ADDRESS_UPPER                     MW(1272:1248)
CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(i)    MW((1567+(i)*64):(1536+(i)*64))
CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(i)    MW((1586+(i)*64):(1568+(i)*64))
CONSTANT_BUFFER_SIZE_SHIFTED4(i)          MW((1599+(i)*64):(1587+(i)*64))
"""
# its last field: NVCBC0_QMDV04_00_OUTER_STICKY_OVERFLOW MW(3071:3071), so a V04_00 QMD is 3072 bits = 384 bytes
QMD_V04_00_LAST_FIELD = "MW(3071:3071)"

# DOC classes/compute/clc6c0qmd.h (AMPERE_COMPUTE_A), "Queue Meta Data, Version 03_00": NVC6C0_QMDV03_00_<NAME>.
# clc7c0qmd.h (AMPERE_COMPUTE_B) and clc9c0qmd.h (ADA_COMPUTE_A) define V03_00 with the same positions.
QMD_V03_00_HEADER = """
QMD_GROUP_ID                              MW(133:128)
SM_GLOBAL_CACHING_ENABLE                  MW(134:134)
INVALIDATE_TEXTURE_HEADER_CACHE           MW(186:186)
INVALIDATE_TEXTURE_SAMPLER_CACHE          MW(187:187)
INVALIDATE_TEXTURE_DATA_CACHE             MW(188:188)
INVALIDATE_SHADER_DATA_CACHE              MW(189:189)
INVALIDATE_INSTRUCTION_CACHE              MW(190:190)
INVALIDATE_SHADER_CONSTANT_CACHE          MW(191:191)
API_VISIBLE_CALL_LIMIT                    MW(378:378)
SAMPLER_INDEX                             MW(382:382)
CTA_RASTER_WIDTH                          MW(415:384)
CTA_RASTER_HEIGHT                         MW(431:416)
CTA_RASTER_DEPTH                          MW(463:448)
SHARED_MEMORY_SIZE                        MW(561:544)
MIN_SM_CONFIG_SHARED_MEM_SIZE             MW(567:562)
MAX_SM_CONFIG_SHARED_MEM_SIZE             MW(574:569)
QMD_VERSION                               MW(579:576)
QMD_MAJOR_VERSION                         MW(583:580)
CTA_THREAD_DIMENSION0                     MW(607:592)
CTA_THREAD_DIMENSION1                     MW(623:608)
CTA_THREAD_DIMENSION2                     MW(639:624)
CONSTANT_BUFFER_VALID(i)                  MW((640+(i)*1):(640+(i)*1))
REGISTER_COUNT_V                          MW(656:648)
TARGET_SM_CONFIG_SHARED_MEM_SIZE          MW(662:657)
SHADER_LOCAL_MEMORY_LOW_SIZE              MW(759:736)
BARRIER_COUNT                             MW(767:763)
CONSTANT_BUFFER_ADDR_LOWER(i)             MW((1055+(i)*64):(1024+(i)*64))
CONSTANT_BUFFER_ADDR_UPPER(i)             MW((1072+(i)*64):(1056+(i)*64))
CONSTANT_BUFFER_SIZE_SHIFTED4(i)          MW((1087+(i)*64):(1075+(i)*64))
PROGRAM_ADDRESS_LOWER                     MW(1567:1536)
PROGRAM_ADDRESS_UPPER                     MW(1584:1568)
SHADER_LOCAL_MEMORY_HIGH_SIZE             MW(1623:1600)
SASS_VERSION                              MW(1663:1656)
"""
# its last field: NVC6C0_QMDV03_00_DEBUG_ID_LOWER MW(2047:2016): 2048 bits = 256 bytes
QMD_V03_00_LAST_FIELD = "MW(2047:2016)"

# 8 constant buffers: the (i) ranges end where the next field starts (V04_00: VALID(i) 416+4i below DEPENDENT_QMD0_POINTER
# MW(479:448), the 64-bit blocks from 1536 below CIRCULAR_QUEUE_ADDR_LOWER MW(2079:2048); V03_00: VALID(i) 640+i below
# REGISTER_COUNT_V MW(656:648), the blocks from 1024 below PROGRAM_ADDRESS_LOWER MW(1567:1536))
QMD = {(4, 0): _qmd_table(QMD_V04_00_HEADER), (3, 0): _qmd_table(QMD_V03_00_HEADER)}
QMD_SIZE = {(4, 0): (_mw(QMD_V04_00_LAST_FIELD)[0] + 1) // 8, (3, 0): (_mw(QMD_V03_00_LAST_FIELD)[0] + 1) // 8}
# enum values the driver writes (same names with the NVCBC0_QMDV04_00_ / NVC6C0_QMDV03_00_ prefix)
QMD_TYPE_GRID_CTA = 0x2                      # QMD_TYPE_GRID_CTA (V04_00 only; V03_00 has IS_QUEUE instead)
API_VISIBLE_CALL_LIMIT_NO_CHECK = 0x1
SAMPLER_INDEX_VIA_HEADER_INDEX = 0x1
TRUE = 0x1                                   # INVALIDATE_*_TRUE, CONSTANT_BUFFER_VALID_TRUE


def _bytes_from_fields(table: dict, values: dict, size: int) -> bytes:
  """The QMD with `values` at the transcribed bit ranges, written one bit at a time (not the driver's way)."""
  out = bytearray(size)
  for name, value in values.items():
    hi, lo = table[name]
    assert value < 1 << (hi - lo + 1), f"{name}={value:#x} wider than MW({hi}:{lo})"
    for k in range(hi - lo + 1):
      if (value >> k) & 1: out[(lo + k) // 8] |= 1 << ((lo + k) % 8)
  return bytes(out)


@pytest.mark.parametrize("version", [(4, 0), (3, 0)])
def test_qmd_fields_match_header(version):
  """Every field of the driver's table at the header's (hi, lo); no field of one side missing from the other."""
  ours, theirs = qmd.TABLES[version], QMD[version]
  assert set(ours) == set(theirs), (f"QMD V{version[0]:02d}_{version[1]:02d}: only in drivers/nv/qmd.py "
                                    f"{sorted(set(ours) - set(theirs))}, only in the header {sorted(set(theirs) - set(ours))}")
  wrong = {name: (ours[name], theirs[name]) for name in theirs if ours[name] != theirs[name]}
  assert not wrong, "QMD fields at the wrong bits (driver (hi, lo), header (hi, lo)): " + repr(wrong)


@pytest.mark.parametrize("version", [(4, 0), (3, 0)])
def test_qmd_size_and_fields_fit(version):
  """The QMD's size from its last field; the transcribed fields are disjoint and inside it."""
  assert qmd.SIZES[version] == QMD_SIZE[version] == {(4, 0): 384, (3, 0): 256}[version]
  assert qmd.QMD_BYTES >= QMD_SIZE[version] and qmd.QMD_BYTES % 64 == 0    # bank 0 follows, 64-byte aligned (SHIFTED6)
  taken = 0
  for name, (hi, lo) in QMD[version].items():
    mask = ((1 << (hi - lo + 1)) - 1) << lo
    assert hi >= lo and hi < 8 * QMD_SIZE[version] and not taken & mask, name
    taken |= mask
  assert qmd.QMD_TYPE_GRID_CTA == QMD_TYPE_GRID_CTA


@pytest.mark.parametrize("version", [(4, 0), (3, 0)])
def test_qmd_pack_every_field_bit_exact(version):
  """A distinct value in every field (its top and bottom bit set), packed by the driver, equals the QMD built bit by
  bit from the transcription; unpacking gives every value back."""
  table = QMD[version]
  values = {}
  for k, (name, (hi, lo)) in enumerate(sorted(table.items())):
    width = hi - lo + 1
    values[name] = ((0x9E3779B97F4A7C15 * (k + 1)) | 1 | (1 << (width - 1))) & ((1 << width) - 1)
  data = qmd.pack(qmd.TABLES[version], values)
  assert data == _bytes_from_fields(table, values, qmd.QMD_BYTES)
  assert qmd.unpack(qmd.TABLES[version], data) == values


@pytest.mark.parametrize("version", [(4, 0), (3, 0)])
def test_qmd_launch_bit_exact(version):
  """The QMD of one launch, byte for byte as the header says, and read back by the emulator's decoder."""
  program, cbuf0, cb_size, cbuf2 = 0x7F12_3456_7800, 0x20_0000_1140, 0x2F4, 0x20_0000_2000
  grid, block = (70000, 3, 2), (96, 2, 1)
  fields = qmd.launch_fields(version, program=program, cbufs={0: (cbuf0, cb_size), 2: (cbuf2, 0x9A)}, grid=grid,
                             block=block, registers=38, shared=1000, barriers=1, sm_config=(8 << 10, 16 << 10, 228 << 10),
                             local_low=20, local_high=0x341, sass_version=0x90)
  want = {"QMD_GROUP_ID": 0x3F, "API_VISIBLE_CALL_LIMIT": API_VISIBLE_CALL_LIMIT_NO_CHECK,
          "SAMPLER_INDEX": SAMPLER_INDEX_VIA_HEADER_INDEX, "QMD_MAJOR_VERSION": version[0],
          "INVALIDATE_TEXTURE_HEADER_CACHE": TRUE, "INVALIDATE_TEXTURE_SAMPLER_CACHE": TRUE,
          "INVALIDATE_TEXTURE_DATA_CACHE": TRUE, "INVALIDATE_SHADER_DATA_CACHE": TRUE,
          "INVALIDATE_SHADER_CONSTANT_CACHE": TRUE, "CTA_THREAD_DIMENSION0": 96, "CTA_THREAD_DIMENSION1": 2,
          "CTA_THREAD_DIMENSION2": 1, "SHARED_MEMORY_SIZE": 1024, "BARRIER_COUNT": 1, "SHADER_LOCAL_MEMORY_LOW_SIZE": 32,
          "SHADER_LOCAL_MEMORY_HIGH_SIZE": 0x350,
          # SM_CONFIG_SHARED_MEM_SIZE: KiB / 4 + 1 (Mesa NVK gv100_sm_config_smem_size): 8 KiB, 16 KiB, 228 KiB
          "MIN_SM_CONFIG_SHARED_MEM_SIZE": 3, "TARGET_SM_CONFIG_SHARED_MEM_SIZE": 5, "MAX_SM_CONFIG_SHARED_MEM_SIZE": 58,
          "SASS_VERSION": 0x90, "PROGRAM_ADDRESS_LOWER": 0x3456_7800, "PROGRAM_ADDRESS_UPPER": 0x7F12,
          "CONSTANT_BUFFER_VALID_0": TRUE, "CONSTANT_BUFFER_SIZE_SHIFTED4_0": 0x300 >> 4,
          "CONSTANT_BUFFER_VALID_2": TRUE, "CONSTANT_BUFFER_SIZE_SHIFTED4_2": 0xA0 >> 4}
  if version == (4, 0):
    want.update({"QMD_TYPE": QMD_TYPE_GRID_CTA, "QMD_MINOR_VERSION": 0, "GRID_WIDTH": 70000, "GRID_HEIGHT": 3,
                 "GRID_DEPTH": 2, "REGISTER_COUNT": 38, "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0": 0x8000_0045,
                 "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_0": 0, "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_2": 0x8000_0080,
                 "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_2": 0})
  else:
    want.update({"QMD_VERSION": 0, "CTA_RASTER_WIDTH": 70000, "CTA_RASTER_HEIGHT": 3, "CTA_RASTER_DEPTH": 2,
                 "REGISTER_COUNT_V": 38, "SM_GLOBAL_CACHING_ENABLE": 1, "CONSTANT_BUFFER_ADDR_LOWER_0": 0x0000_1140,
                 "CONSTANT_BUFFER_ADDR_UPPER_0": 0x20, "CONSTANT_BUFFER_ADDR_LOWER_2": 0x0000_2000,
                 "CONSTANT_BUFFER_ADDR_UPPER_2": 0x20})
  assert fields == want
  data = qmd.pack(qmd.TABLES[version], fields)
  assert data == _bytes_from_fields(QMD[version], want, qmd.QMD_BYTES)
  if version == (4, 0):     # spot checks as raw words: GRID_WIDTH MW(1055:1024) is dword 32, PROGRAM_ADDRESS_LOWER dword 38
    assert int.from_bytes(data[128:132], "little") == 70000 and int.from_bytes(data[152:156], "little") == 0x3456_7800
  launch = qmd.read_launch(version, data)
  assert launch == {"version": version, "program": program, "cbufs": {0: (cbuf0, 0x300), 2: (cbuf2, 0xA0)},
                    "cbuf0": cbuf0, "cbuf0_valid": 1, "cbuf0_size": 0x300, "grid": grid, "block": block, "shared": 1024, "registers": 38,
                    "sm_config": (3, 5, 58), "local": (32, 0x350), "invalidate_instruction_cache": 0}
  assert [qmd.sm_config_bytes(v) for v in launch["sm_config"]] == [8 << 10, 16 << 10, 228 << 10]
  assert qmd.sm_config_bytes(0) is None      # 0 encodes no carveout


# ==== pushbuffer =================================================================================================
# OGKM src/common/sdk/nvidia/inc/class/clc56f.h (AMPERE_CHANNEL_GPFIFO_A): the "dma method formats" (NVC56F_DMA_*)
DMA_METHOD_ADDRESS, DMA_METHOD_SUBCHANNEL, DMA_METHOD_COUNT, DMA_SEC_OP = (11, 0), (15, 13), (28, 16), (31, 29)
DMA_SEC_OP_INC_METHOD, DMA_SEC_OP_NON_INC_METHOD, DMA_SEC_OP_IMMD_DATA_METHOD, DMA_SEC_OP_ONE_INC = 0x1, 0x3, 0x4, 0x5

# host methods: OGKM class/clc56f.h NVC56F_* and class/clc86f.h NVC86F_* (HOPPER_CHANNEL_GPFIFO_A). clc86f.h repeats at
# the same offsets the methods it defines, but leaves out NON_STALL_INTERRUPT and the enum values ACQ_STRICT_GEQ,
# RELEASE_WFI_EN and PAYLOAD_SIZE_64BIT, which clc56f.h gives (the fields themselves are at the same bits in both).
HOST_METHODS = {
  rm.AMPERE_CHANNEL_GPFIFO_A: {"SET_OBJECT": 0x0000, "NON_STALL_INTERRUPT": 0x0020, "SEM_ADDR_LO": 0x005C,
                               "SEM_ADDR_HI": 0x0060, "SEM_PAYLOAD_LO": 0x0064, "SEM_PAYLOAD_HI": 0x0068,
                               "SEM_EXECUTE": 0x006C, "WFI": 0x0078},
  rm.HOPPER_CHANNEL_GPFIFO_A: {"SET_OBJECT": 0x0000, "SEM_ADDR_LO": 0x005C, "SEM_ADDR_HI": 0x0060,
                               "SEM_PAYLOAD_LO": 0x0064, "SEM_PAYLOAD_HI": 0x0068, "SEM_EXECUTE": 0x006C, "WFI": 0x0078},
}
SEM_EXECUTE_OPERATION = (2, 0)     # _ACQUIRE 0, _RELEASE 1, _ACQ_STRICT_GEQ 2 (clc56f.h)
SEM_EXECUTE_RELEASE_WFI, SEM_EXECUTE_PAYLOAD_SIZE, SEM_EXECUTE_RELEASE_TIMESTAMP = (20, 20), (24, 24), (25, 25)
WFI_SCOPE, WFI_SCOPE_ALL = (0, 0), 0x1

# compute classes: DOC classes/compute/clc6c0.h, clc7c0.h, clc9c0.h, clcbc0.h (NV<class>_*): the same offsets in all four
_COMPUTE = {"NO_OPERATION": 0x0100, "SET_SHADER_SHARED_MEMORY_WINDOW_A": 0x02A0, "SET_SHADER_SHARED_MEMORY_WINDOW_B": 0x02A4,
            "SEND_PCAS_A": 0x02B4, "SEND_SIGNALING_PCAS2_B": 0x02C0, "SET_SHADER_LOCAL_MEMORY_A": 0x0790,
            "SET_SHADER_LOCAL_MEMORY_B": 0x0794, "SET_SHADER_LOCAL_MEMORY_WINDOW_A": 0x07B0,
            "SET_SHADER_LOCAL_MEMORY_WINDOW_B": 0x07B4, "INVALIDATE_SHADER_CACHES_NO_WFI": 0x1698,
            "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A": 0x02E4, "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B": 0x02E8,
            "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C": 0x02EC, "SET_I2M_SPARE_NOOP00": 0x01F0,
            # inline to memory: NV<class>_LINE_LENGTH_IN, _LINE_COUNT, _OFFSET_OUT_UPPER, _OFFSET_OUT, _LAUNCH_DMA,
            # _LOAD_INLINE_DATA (DOC classes/compute/clc6c0.h .. clcbc0.h, the same in each)
            "I2M_LINE_LENGTH_IN": 0x0180, "I2M_LINE_COUNT": 0x0184, "I2M_OFFSET_OUT_UPPER": 0x0188,
            "I2M_OFFSET_OUT": 0x018C, "I2M_LAUNCH_DMA": 0x01B0, "I2M_LOAD_INLINE_DATA": 0x01B4}
# NVCBC0_LAUNCH_DMA_DST_MEMORY_LAYOUT 0:0 (PITCH 0x1), _SYSMEMBAR_DISABLE 6:6 (TRUE 0x1)
I2M_LAUNCH_DMA_DST_MEMORY_LAYOUT, I2M_LAUNCH_DMA_SYSMEMBAR_DISABLE = (0, 0), (6, 6)
INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION, INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION_TRUE = (0, 0), 0x1
COMPUTE_METHODS = {rm.AMPERE_COMPUTE_A: _COMPUTE, rm.AMPERE_COMPUTE_B: _COMPUTE, rm.ADA_COMPUTE_A: _COMPUTE,
                   rm.HOPPER_COMPUTE_A: _COMPUTE}
SEND_PCAS_A_QMD_ADDRESS_SHIFTED8, SEND_PCAS_A_QMD_ADDRESS_SHIFTED8_SHIFT = (31, 0), 8    # the QMD's address >> 8
SEND_SIGNALING_PCAS2_B_PCAS_ACTION, PCAS_ACTION_INVALIDATE_COPY_SCHEDULE = (3, 0), 0x3

# copy classes: OGKM class/clc6b5.h, clc7b5.h, clc8b5.h (NV<class>_*); OGKM's clc8b5.h lacks LINE_COUNT, which DOC
# classes/dma-copy/clc8b5.h gives (0x041C, as in clc6b5.h / clc7b5.h)
_COPY = {"LAUNCH_DMA": 0x0300, "OFFSET_IN_UPPER": 0x0400, "OFFSET_IN_LOWER": 0x0404, "OFFSET_OUT_UPPER": 0x0408,
         "OFFSET_OUT_LOWER": 0x040C, "LINE_LENGTH_IN": 0x0418, "LINE_COUNT": 0x041C}
COPY_METHODS = {rm.AMPERE_DMA_COPY_A: _COPY, rm.AMPERE_DMA_COPY_B: _COPY, rm.HOPPER_DMA_COPY_A: _COPY}
# NV<class>_LAUNCH_DMA_<field> (hi, lo) and the value the driver sets (same in the three copy classes)
LAUNCH_DMA = {"DATA_TRANSFER_TYPE_NON_PIPELINED": ((1, 0), 0x2), "FLUSH_ENABLE_TRUE": ((2, 2), 0x1),
              "SRC_MEMORY_LAYOUT_PITCH": ((7, 7), 0x1), "DST_MEMORY_LAYOUT_PITCH": ((8, 8), 0x1),
              "MULTI_LINE_ENABLE_TRUE": ((9, 9), 0x1), "REMAP_ENABLE_TRUE": ((10, 10), 0x1),
              "SRC_TYPE_PHYSICAL": ((12, 12), 0x1), "DST_TYPE_PHYSICAL": ((13, 13), 0x1)}

# GPFIFO entry: OGKM class/clc86f.h NVC86F_GP_ENTRY__SIZE 8, GP_ENTRY0_GET 31:2, GP_ENTRY1_GET_HI 7:0, GP_ENTRY1_LEVEL
# 9:9 (MAIN 0), GP_ENTRY1_LENGTH 30:10, GP_ENTRY1_SYNC 31:31 (PROCEED 0)
GP_ENTRY_SIZE, GP_ENTRY0_GET, GP_ENTRY1_GET_HI, GP_ENTRY1_LEVEL, GP_ENTRY1_LENGTH, GP_ENTRY1_SYNC = \
  8, (31, 2), (7, 0), (9, 9), (30, 10), (31, 31)
# USERD: OGKM class/clc86f.h Nvc86fControl: GPGet at 0x88, GPPut at 0x8c, Ignored05[0x5c] ends the struct at 0x200
USERD_GPGET, USERD_GPPUT, USERD_SIZE = 0x88, 0x8C, 0x90 + 4 * 0x5C
# usermode doorbell: OGKM class/clc361.h NVC361_NOTIFY_CHANNEL_PENDING 0x00000090, NVC361_NV_USERMODE__SIZE 65536
NOTIFY_CHANNEL_PENDING, NV_USERMODE_SIZE = 0x90, 65536
# the copy engine's subchannel: OGKM class/cla06fsubch.h (read at 1739a20efc4a) NVA06F_SUBCHANNEL_COPY_ENGINE 4;
# kernel-open/nvidia-uvm/uvm_push_macros.h: "Starting with Kepler HW settled on using a fixed subchannel for CE"
# (UVM_SUBCHANNEL_CE = NVA06F_SUBCHANNEL_COPY_ENGINE)
NVA06F_SUBCHANNEL_COPY_ENGINE = 4


def _f(hi_lo, value=1): return value << hi_lo[1]


# every integer drivers/nv/pushbuf.py defines, from the blocks above
PUSHBUF = {
  "SEC_OP_INC_METHOD": DMA_SEC_OP_INC_METHOD, "SEC_OP_NON_INC_METHOD": DMA_SEC_OP_NON_INC_METHOD,
  "SEC_OP_IMMD_DATA_METHOD": DMA_SEC_OP_IMMD_DATA_METHOD, "SEC_OP_ONE_INC": DMA_SEC_OP_ONE_INC,
  **HOST_METHODS[rm.AMPERE_CHANNEL_GPFIFO_A],
  "HOST_METHODS_END": _COMPUTE["NO_OPERATION"],       # the first method of an engine class; host methods lie below
  "SEM_OPERATION_ACQUIRE": _f(SEM_EXECUTE_OPERATION, 0x0), "SEM_OPERATION_RELEASE": _f(SEM_EXECUTE_OPERATION, 0x1),
  "SEM_OPERATION_ACQ_STRICT_GEQ": _f(SEM_EXECUTE_OPERATION, 0x2),
  "SEM_RELEASE_WFI": _f(SEM_EXECUTE_RELEASE_WFI), "SEM_PAYLOAD_SIZE_64BIT": _f(SEM_EXECUTE_PAYLOAD_SIZE),
  "SEM_RELEASE_TIMESTAMP": _f(SEM_EXECUTE_RELEASE_TIMESTAMP), "WFI_SCOPE_ALL": _f(WFI_SCOPE, WFI_SCOPE_ALL),
  **{k: v for k, v in _COMPUTE.items() if k != "NO_OPERATION"},
  "PCAS_ACTION_INVALIDATE_COPY_SCHEDULE": _f(SEND_SIGNALING_PCAS2_B_PCAS_ACTION, PCAS_ACTION_INVALIDATE_COPY_SCHEDULE),
  "INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION": _f(INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION,
                                                    INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION_TRUE),
  **_COPY,
  **{"DMA_" + k.replace("_TRUE", ""): _f(*v) for k, v in LAUNCH_DMA.items()},
  "GP_ENTRY_BYTES": GP_ENTRY_SIZE, "GP_ENTRY_MAX_LENGTH": (1 << (GP_ENTRY1_LENGTH[0] - GP_ENTRY1_LENGTH[1] + 1)) - 1,
  "GP_ENTRY_MAX_ADDRESS": 1 << (GP_ENTRY0_GET[0] + 1 + GP_ENTRY1_GET_HI[0] + 1),    # GET 31:2 and GET_HI 7:0: 40 bits
  "USERD_GP_GET": USERD_GPGET, "USERD_GP_PUT": USERD_GPPUT, "USERD_BYTES": USERD_SIZE,
  "USERMODE_NOTIFY_CHANNEL_PENDING": NOTIFY_CHANNEL_PENDING, "USERMODE_BYTES": NV_USERMODE_SIZE,
  "SUBC_COPY": NVA06F_SUBCHANNEL_COPY_ENGINE,
  "I2M_DST_MEMORY_LAYOUT_PITCH": _f(I2M_LAUNCH_DMA_DST_MEMORY_LAYOUT, 0x1),
  "I2M_SYSMEMBAR_DISABLE": _f(I2M_LAUNCH_DMA_SYSMEMBAR_DISABLE, 0x1),
  # the data words one method header carries after LAUNCH_DMA: COUNT 28:16 (clc56f.h NVC56F_DMA_METHOD_COUNT) less one
  "I2M_MAX_WORDS": (1 << 13) - 1 - 1,
}
# baregrad's own choice, not a fact of a header: the subchannel the compute object is bound to (cla06fsubch.h names
# only NVA06F_SUBCHANNEL_2D 3 and _COPY_ENGINE 4)
PUSHBUF_CHOICES = {"SUBC_COMPUTE"}


def _public_ints(module) -> dict:
  return {k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, int) and not isinstance(v, bool)}


def test_pushbuf_constants_match_headers():
  ours = {k: v for k, v in _public_ints(pb).items() if k not in PUSHBUF_CHOICES}
  assert set(ours) == set(PUSHBUF), (f"only in pushbuf.py (transcribe it here from its header): {sorted(set(ours) - set(PUSHBUF))}; "
                                     f"only here: {sorted(set(PUSHBUF) - set(ours))}")
  wrong = {k: (hex(ours[k]), hex(PUSHBUF[k])) for k in PUSHBUF if ours[k] != PUSHBUF[k]}
  assert not wrong, "pushbuf.py constants that differ from the headers (ours, header): " + repr(wrong)
  assert len({pb.SUBC_COMPUTE, pb.SUBC_COPY}) == 2 and all(0 <= s < 8 for s in (pb.SUBC_COMPUTE, pb.SUBC_COPY))


def test_every_method_is_defined_by_every_class_that_receives_it():
  """One offset table serves several classes: each method must sit at that offset in each class's own header."""
  for cls, methods in HOST_METHODS.items():
    for name, offset in methods.items(): assert getattr(pb, name) == offset, (rm.class_name(cls), name)
  for table, classes in ((COMPUTE_METHODS, rm.COMPUTE_CLASSES), (COPY_METHODS, rm.COPY_CLASSES)):
    assert set(table) == set(classes)
    for cls in classes:
      for name, offset in table[cls].items():
        if name != "NO_OPERATION": assert getattr(pb, name) == offset, (rm.class_name(cls), name)
  host = [getattr(pb, k) for k in HOST_METHODS[rm.AMPERE_CHANNEL_GPFIFO_A]]
  engine = [getattr(pb, k) for k in (*_COPY, *(k for k in _COMPUTE if k != "NO_OPERATION"))]
  assert max(host) < pb.HOST_METHODS_END <= min(engine)


def test_method_headers_are_hand_computed_words():
  """SEC_OP 31:29 | COUNT 28:16 | SUBCHANNEL 15:13 | ADDRESS 11:0 = method >> 2 (clc56f.h NVC56F_DMA_*)."""
  words = {  # (subchannel, method, count, sec_op) -> the word, worked out by hand
    (1, 0x02B4, 1, DMA_SEC_OP_INC_METHOD): 0x200120AD,        # 0x20000000 | 1 << 16 | 1 << 13 | 0x2B4 >> 2 (0xAD)
    (4, 0x0400, 4, DMA_SEC_OP_INC_METHOD): 0x20048100,        # 0x20000000 | 4 << 16 | 4 << 13 | 0x100
    (0, 0x005C, 5, DMA_SEC_OP_INC_METHOD): 0x20050017,        # 0x20000000 | 5 << 16 | 0 | 0x17
    (2, 0x1698, 3, DMA_SEC_OP_NON_INC_METHOD): 0x600345A6,    # 0x60000000 | 3 << 16 | 2 << 13 | 0x5A6
    (1, 0x0300, 2, DMA_SEC_OP_ONE_INC): 0xA00220C0,           # 0xA0000000 | 2 << 16 | 1 << 13 | 0xC0
    (7, 0x3FFC, 0x1FFF, DMA_SEC_OP_INC_METHOD): 0x3FFFEFFF,   # every field at its maximum
  }
  for (subc, method, count, sec_op), word in words.items():
    assert pb.method_header(subc, method, count, sec_op) == word, hex(word)
    assert pb.decode_header(word) == (sec_op, subc, method, count)
    field = lambda hi_lo: (word >> hi_lo[1]) & ((1 << (hi_lo[0] - hi_lo[1] + 1)) - 1)
    assert (field(DMA_SEC_OP), field(DMA_METHOD_SUBCHANNEL), field(DMA_METHOD_ADDRESS) << 2,
            field(DMA_METHOD_COUNT)) == (sec_op, subc, method, count)
  assert pb.Pushbuffer().method(1, pb.SEND_PCAS_A, 0x123).method(0, pb.WFI, 1).words == [0x200120AD, 0x123, 0x2001001E, 1]
  for bad in ((0, 0x4000, 1), (0, 0x0002, 1), (0, 0, 0), (0, 0, 0x2000)):
    with pytest.raises(ValueError): pb.method_header(*bad)


def test_gp_entries_are_hand_computed_words():
  """GP_ENTRY0 = address 31:2; GP_ENTRY1 = GET_HI 7:0 | LEVEL 9:9 (MAIN) | LENGTH 30:10 | SYNC 31:31 (PROCEED)."""
  assert pb.gp_entry(0x12_3456_7890, 100) == (0x3456_7890, 0x0001_9012)
  assert pb.gp_entry(0xFF_FFFF_FFFC, (1 << 21) - 1) == (0xFFFF_FFFC, 0x7FFF_FCFF)
  assert pb.gp_entry(0x1000, 1) == (0x1000, 0x400)
  for w0, w1, addr, n in ((0x3456_7890, 0x0001_9012, 0x12_3456_7890, 100), (0xFFFF_FFFC, 0x7FFF_FCFF, 0xFF_FFFF_FFFC, (1 << 21) - 1)):
    assert pb.decode_gp_entry(w0, w1) == (addr, n)
    assert not (w1 >> GP_ENTRY1_SYNC[1]) & 1 and not (w1 >> GP_ENTRY1_LEVEL[1]) & 1
  with pytest.raises(ValueError): pb.gp_entry(0x1002, 1)
  with pytest.raises(ValueError): pb.gp_entry(1 << 40, 1)
  with pytest.raises(ValueError): pb.gp_entry(0x1000, 1 << 21)


# ==== RM / UVM ===================================================================================================
# ---- classes: OGKM src/common/sdk/nvidia/inc/nvos.h (NV01_ROOT_CLIENT) and class/cl<id>.h
CLASS_IDS = {
  "NV01_ROOT_CLIENT": 0x00000041, "NV01_DEVICE_0": 0x80, "NV20_SUBDEVICE_0": 0x2080,
  "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR": 0x00000071, "NV01_MEMORY_LOCAL_USER": 0x00000040,     # class/cl0040.h
  "FERMI_VASPACE_A": 0x000090F1, "FERMI_CONTEXT_SHARE_A": 0x00009067,
  "KEPLER_CHANNEL_GROUP_A": 0x0000A06C, "AMPERE_USERMODE_A": 0xC561, "HOPPER_USERMODE_A": 0xC661,
  "AMPERE_CHANNEL_GPFIFO_A": 0x0000C56F, "HOPPER_CHANNEL_GPFIFO_A": 0x0000C86F, "AMPERE_COMPUTE_A": 0xC6C0,
  "AMPERE_COMPUTE_B": 0xC7C0, "ADA_COMPUTE_A": 0xC9C0, "HOPPER_COMPUTE_A": 0xCBC0, "AMPERE_DMA_COPY_A": 0x0000C6B5,
  "AMPERE_DMA_COPY_B": 0x0000C7B5, "HOPPER_DMA_COPY_A": 0x0000C8B5,
}
# compute class -> (CUDA compute capability of those chips, newest QMD version of the class's QMD header (DOC
# clc6c0qmd.h / clc7c0qmd.h / clc9c0qmd.h: V03_00, clcbc0qmd.h: V04_00))
COMPUTE_CLASSES = {0xCBC0: ("sm_90", (4, 0)), 0xC9C0: ("sm_89", (3, 0)), 0xC7C0: ("sm_86", (3, 0)), 0xC6C0: ("sm_80", (3, 0))}
# newest first; OGKM src/nvidia/generated/g_gpu_class_list.c lists for GH100 HOPPER_DMA_COPY_A, HOPPER_CHANNEL_GPFIFO_A and
# AMPERE_CHANNEL_GPFIFO_A, HOPPER_USERMODE_A and AMPERE_USERMODE_A; for AD102 and GA102 AMPERE_DMA_COPY_B; for GA100
# AMPERE_DMA_COPY_A; for the three Ampere/Ada chips AMPERE_CHANNEL_GPFIFO_A and AMPERE_USERMODE_A
COPY_CLASSES = (0xC8B5, 0xC7B5, 0xC6B5)
CHANNEL_CLASSES = (0xC86F, 0xC56F)
USERMODE_CLASSES = (0xC661, 0xC561)

# ---- escapes: OGKM kernel-open/common/inc/nv-ioctl-numbers.h, src/nvidia/arch/nvalloc/unix/include/nv_escape.h
ESCAPE_NUMBERS = {
  "NV_IOCTL_BASE": 200, "NV_ESC_CARD_INFO": 200 + 0, "NV_ESC_REGISTER_FD": 200 + 1, "NV_ESC_CHECK_VERSION_STR": 200 + 10,
  "NV_ESC_RM_ALLOC_MEMORY": 0x27, "NV_ESC_RM_FREE": 0x29, "NV_ESC_RM_CONTROL": 0x2A, "NV_ESC_RM_ALLOC": 0x2B,
  "NV_ESC_RM_MAP_MEMORY": 0x4E, "NV_ESC_RM_UNMAP_MEMORY": 0x4F, "NV_ESC_RM_MAP_MEMORY_DMA": 0x57,
}
NV_IOCTL_MAGIC = "F"
# escape -> its parameter struct (OGKM src/nvidia/arch/nvalloc/unix/src/escape.c `dataSize != sizeof(...)`,
# kernel-open/nvidia/nv.c for CARD_INFO (an array of nv_ioctl_card_info_t, NV_MAX_DEVICES of them) and CHECK_VERSION_STR)
ESCAPE_PARAMS = {
  200: "nv_ioctl_card_info_t[32]", 201: "nv_ioctl_register_fd_t", 210: "nv_ioctl_rm_api_version_t",
  0x27: "nv_ioctl_nvos02_parameters_with_fd", 0x29: "NVOS00_PARAMETERS", 0x2A: "NVOS54_PARAMETERS",
  0x2B: "NVOS21_PARAMETERS", 0x4E: "nv_ioctl_nvos33_parameters_with_fd", 0x57: "NVOS46_PARAMETERS",
}
# _IOWR('F', nr, size) = 3 << 30 | size << 16 | 'F' << 8 | nr (Linux asm-generic/ioctl.h), worked out by hand from the
# struct sizes below
ESCAPE_REQUESTS = {200: 0xC90046C8, 201: 0xC00446C9, 210: 0xC04846D2, 0x27: 0xC0384627, 0x29: 0xC0104629,
                   0x2A: 0xC020462A, 0x2B: 0xC020462B, 0x4E: 0xC038464E, 0x57: 0xC0404657}
# OGKM nv-ioctl.h NV_RM_API_VERSION_*, nvlimits.h NV_MAX_DEVICES
RM_API_VERSION = {"NV_RM_API_VERSION_CMD_STRICT": 0, "NV_RM_API_VERSION_CMD_RELAXED": ord("1"),
                  "NV_RM_API_VERSION_CMD_QUERY": ord("2"), "NV_RM_API_VERSION_REPLY_RECOGNIZED": 1, "NV_MAX_DEVICES": 32}

# ---- UVM: OGKM kernel-open/nvidia-uvm/uvm_linux_ioctl.h (UVM_INITIALIZE), uvm_ioctl.h (UVM_IOCTL_BASE(i) = i on Linux);
# each takes <NAME>_PARAMS
UVM_NUMBERS = {"UVM_INITIALIZE": 0x30000001, "UVM_REGISTER_GPU_VASPACE": 25, "UVM_REGISTER_CHANNEL": 27,
               "UVM_UNREGISTER_CHANNEL": 28, "UVM_MAP_EXTERNAL_ALLOCATION": 33,
               "UVM_FREE": 34, "UVM_REGISTER_GPU": 37, "UVM_CREATE_EXTERNAL_RANGE": 73, "UVM_MM_INITIALIZE": 75}

# ---- flags: OGKM nvos.h (NVOS02_FLAGS_PHYSICALITY 7:4 NONCONTIGUOUS 1, COHERENCY 15:12 CACHED 1, MAPPING 31:30 NO_MAP 1;
# NV_VASPACE_ALLOCATION_FLAGS_* BIT(n); NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT 1:0 ASYNC 1), class/cl2080_notification.h
# (NV2080_ENGINE_TYPE_*), ctrl/ctrl2080/ctrl2080gpu.h (NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT 1:0 BINARY 2)
FLAGS = {
  "NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS": 1 << 4, "NVOS02_FLAGS_COHERENCY_CACHED": 1 << 12,
  "NVOS02_FLAGS_MAPPING_NO_MAP": 1 << 30, "NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED": 1 << 3,
  "NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING": 1 << 6, "NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC": 1,
  "NV2080_ENGINE_TYPE_NULL": 0x00000000, "NV2080_ENGINE_TYPE_GRAPHICS": 0x00000001, "NV2080_ENGINE_TYPE_COPY0": 0x00000009,
  "NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY": 0x00000002,
}

# ---- control commands: OGKM ctrl/ctrl0080/ctrl0080gpu.h, ctrl/ctrl2080/ctrl2080gpu.h, ctrl/ctrlc36f.h, ctrl/ctrla06c.h
# (the params of NVA06C_CTRL_CMD_GPFIFO_SCHEDULE are typedef'd to NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS, ctrla06fgpfifo.h)
CONTROLS = {
  "NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2": (0x800292, "NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS"),
  "NV2080_CTRL_CMD_GPU_GET_GID_INFO": (0x2080014A, "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS"),
  "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN": (0xC36F0108, "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS"),
  "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE": (0xA06C0101, "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS"),
  "NV2080_CTRL_CMD_FB_GET_INFO_V2": (0x20801303, "NV2080_CTRL_FB_GET_INFO_V2_PARAMS"),     # ctrl/ctrl2080/ctrl2080fb.h
  # ctrl/ctrl2080/ctrl2080gr.h: NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS {NvHandle hChannel; NV_DECLARE_ALIGNED(NvU64
  # totalBufferSize, 8)}
  "NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE": (0x20801218, "NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS"),
}
# class -> its allocation parameters: OGKM src/nvidia/src/kernel/rmapi/resource_list.h "Alloc Param Info" (root client:
# RS_OPTIONAL(NvHandle), i.e. RM reads the hClient that NV0000_ALLOC_PARAMETERS starts with; the compute, copy and
# usermode classes' parameters are optional and the driver passes none)
ALLOC_PARAMS = {
  0x41: "NV0000_ALLOC_PARAMETERS", 0x80: "NV0080_ALLOC_PARAMETERS", 0x2080: "NV2080_ALLOC_PARAMETERS",
  0x90F1: "NV_VASPACE_ALLOCATION_PARAMETERS", 0xA06C: "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
  0x9067: "NV_CTXSHARE_ALLOCATION_PARAMETERS", 0xC86F: "NV_CHANNEL_ALLOC_PARAMS", 0xC56F: "NV_CHANNEL_ALLOC_PARAMS",
  0x40: "NV_MEMORY_ALLOCATION_PARAMS",          # RS_REQUIRED(NV_MEMORY_ALLOCATION_PARAMS)
}

# ---- status codes: OGKM src/common/sdk/nvidia/inc/nvstatuscodes.h NV_STATUS_CODE(name, value, ...)
NV_STATUS = {
  "NV_OK": 0x00000000, "NV_ERR_GENERIC": 0x0000FFFF, "NV_ERR_ILLEGAL_ACTION": 0x00000016, "NV_ERR_IN_USE": 0x00000017,
  "NV_ERR_INSERT_DUPLICATE_NAME": 0x00000019, "NV_ERR_INSUFFICIENT_RESOURCES": 0x0000001A,
  "NV_ERR_INSUFFICIENT_PERMISSIONS": 0x0000001B, "NV_ERR_INVALID_BASE": 0x00000020, "NV_ERR_INVALID_OWNER": 0x00000039,
  "NV_ERR_INVALID_ADDRESS": 0x0000001E, "NV_ERR_INVALID_ARGUMENT": 0x0000001F, "NV_ERR_INVALID_CHANNEL": 0x00000021,
  "NV_ERR_INVALID_CLASS": 0x00000022,
  "NV_ERR_INVALID_CLIENT": 0x00000023, "NV_ERR_INVALID_COMMAND": 0x00000024, "NV_ERR_INVALID_DEVICE": 0x00000026,
  "NV_ERR_INVALID_FLAGS": 0x00000029, "NV_ERR_INVALID_LIMIT": 0x0000002E, "NV_ERR_INVALID_OBJECT_HANDLE": 0x00000033,
  "NV_ERR_INVALID_OBJECT_NEW": 0x00000034, "NV_ERR_INVALID_OBJECT_PARENT": 0x00000036,
  "NV_ERR_INVALID_OFFSET": 0x00000037, "NV_ERR_INVALID_PARAM_STRUCT": 0x0000003A, "NV_ERR_INVALID_STATE": 0x00000040,
  "NV_ERR_NO_MEMORY": 0x00000051, "NV_ERR_NOT_SUPPORTED": 0x00000056, "NV_ERR_OBJECT_NOT_FOUND": 0x00000057,
  "NV_ERR_OPERATING_SYSTEM": 0x00000059, "NV_ERR_OUT_OF_RANGE": 0x0000005B, "NV_ERR_UVM_ADDRESS_IN_USE": 0x00000068,
  "NV_WARN_NOTHING_TO_DO": 0x00010006,
}
# ---- robust-channel errors: OGKM src/common/sdk/nvidia/inc/nverror.h; the error notifier's status: OGKM
# src/nvidia/src/kernel/gpu/rc/kernel_rc_notification.c (krcErrorWriteNotifier(..., 0xffff /* notifierStatus */, ...))
RC_ERRORS = {"ROBUST_CHANNEL_GR_EXCEPTION": 13, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT": 31, "ROBUST_CHANNEL_PBDMA_ERROR": 32}
NOTIFICATION_STATUS_ERROR = 0xFFFF

# ---- struct layouts: name -> (sizeof, {field: (offsetof, sizeof)}), every field of the header's struct, as gcc lays out
# (x86-64 Linux; NvP64 is a pointer aligned to 8, NV_ALIGN_BYTES(8) / NV_DECLARE_ALIGNED(.., 8) align to 8)
STRUCTS = {
  # OGKM src/nvidia/arch/nvalloc/unix/include/nv-ioctl.h (= kernel-open/common/inc/nv-ioctl.h)
  "nv_pci_info_t": (12, {"domain": (0, 4), "bus": (4, 1), "slot": (5, 1), "function": (6, 1), "vendor_id": (8, 2),
                         "device_id": (10, 2)}),
  "nv_ioctl_card_info_t": (72, {"valid": (0, 1), "pci_info": (4, 12), "gpu_id": (16, 4), "interrupt_line": (20, 2),
                                "reg_address": (24, 8), "reg_size": (32, 8), "fb_address": (40, 8), "fb_size": (48, 8),
                                "minor_number": (56, 4), "dev_name": (60, 10)}),
  "nv_ioctl_rm_api_version_t": (72, {"cmd": (0, 4), "reply": (4, 4), "versionString": (8, 64)}),
  "nv_ioctl_register_fd_t": (4, {"ctl_fd": (0, 4)}),
  # OGKM src/common/sdk/nvidia/inc/nvos.h
  "NVOS00_PARAMETERS": (16, {"hRoot": (0, 4), "hObjectParent": (4, 4), "hObjectOld": (8, 4), "status": (12, 4)}),
  "NVOS02_PARAMETERS": (48, {"hRoot": (0, 4), "hObjectParent": (4, 4), "hObjectNew": (8, 4), "hClass": (12, 4),
                             "flags": (16, 4), "pMemory": (24, 8), "limit": (32, 8), "status": (40, 4)}),
  "NVOS21_PARAMETERS": (32, {"hRoot": (0, 4), "hObjectParent": (4, 4), "hObjectNew": (8, 4), "hClass": (12, 4),
                             "pAllocParms": (16, 8), "paramsSize": (24, 4), "status": (28, 4)}),
  "NVOS33_PARAMETERS": (48, {"hClient": (0, 4), "hDevice": (4, 4), "hMemory": (8, 4), "offset": (16, 8),
                             "length": (24, 8), "pLinearAddress": (32, 8), "status": (40, 4), "flags": (44, 4)}),
  "NVOS46_PARAMETERS": (64, {"hClient": (0, 4), "hDevice": (4, 4), "hDma": (8, 4), "hMemory": (12, 4), "offset": (16, 8),
                             "length": (24, 8), "flags": (32, 4), "flags2": (36, 4), "kindOverride": (40, 4),
                             "dmaOffset": (48, 8), "status": (56, 4)}),
  "NVOS54_PARAMETERS": (32, {"hClient": (0, 4), "hObject": (4, 4), "cmd": (8, 4), "flags": (12, 4), "params": (16, 8),
                             "paramsSize": (24, 4), "status": (28, 4)}),
  "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS": (20, {"hObjectError": (0, 4), "hObjectEccError": (4, 4), "hVASpace": (8, 4),
                                                  "engineType": (12, 4), "bIsCallingContextVgpuPlugin": (16, 1)}),
  "NV_VASPACE_ALLOCATION_PARAMETERS": (56, {"index": (0, 4), "flags": (4, 4), "vaSize": (8, 8), "vaStartInternal": (16, 8),
                                            "vaLimitInternal": (24, 8), "bigPageSize": (32, 4), "vaBase": (40, 8),
                                            "pasid": (48, 4)}),
  "NV_CTXSHARE_ALLOCATION_PARAMETERS": (12, {"hVASpace": (0, 4), "flags": (4, 4), "subctxId": (8, 4)}),
  "NV_MEMORY_ALLOCATION_PARAMS": (128, {"owner": (0, 4), "type": (4, 4), "flags": (8, 4), "width": (12, 4),
                                        "height": (16, 4), "pitch": (20, 4), "attr": (24, 4), "attr2": (28, 4),
                                        "format": (32, 4), "comprCovg": (36, 4), "zcullCovg": (40, 4), "rangeLo": (48, 8),
                                        "rangeHi": (56, 8), "size": (64, 8), "alignment": (72, 8), "offset": (80, 8),
                                        "limit": (88, 8), "address": (96, 8), "ctagOffset": (104, 4), "hVASpace": (108, 4),
                                        "internalflags": (112, 4), "tag": (116, 4), "numaNode": (120, 4)}),
  # OGKM src/nvidia/arch/nvalloc/unix/include/nv-unix-nvos-params-wrappers.h
  "nv_ioctl_nvos02_parameters_with_fd": (56, {"params": (0, 48), "fd": (48, 4)}),
  "nv_ioctl_nvos33_parameters_with_fd": (56, {"params": (0, 48), "fd": (48, 4)}),
  # OGKM class/cl0000.h (processName[NV_PROC_NAME_MAX_LENGTH = 100], nvlimits.h), cl0080.h, cl2080.h
  "NV0000_ALLOC_PARAMETERS": (120, {"hClient": (0, 4), "processID": (4, 4), "processName": (8, 100),
                                    "pOsPidInfo": (112, 8)}),
  "NV0080_ALLOC_PARAMETERS": (56, {"deviceId": (0, 4), "hClientShare": (4, 4), "hTargetClient": (8, 4),
                                   "hTargetDevice": (12, 4), "flags": (16, 4), "vaSpaceSize": (24, 8),
                                   "vaStartInternal": (32, 8), "vaLimitInternal": (40, 8), "vaMode": (48, 4)}),
  "NV2080_ALLOC_PARAMETERS": (4, {"subDeviceId": (0, 4)}),
  # OGKM alloc/alloc_channel.h (NV_MAX_SUBDEVICES 8, CC_CHAN_ALLOC_IV_SIZE_DWORD 3, CC_CHAN_ALLOC_NONCE_SIZE_DWORD 8)
  "NV_MEMORY_DESC_PARAMS": (24, {"base": (0, 8), "size": (8, 8), "addressSpace": (16, 4), "cacheAttrib": (20, 4)}),
  "NV_CHANNEL_ALLOC_PARAMS": (368, {
    "hObjectError": (0, 4), "hObjectBuffer": (4, 4), "gpFifoOffset": (8, 8), "gpFifoEntries": (16, 4), "flags": (20, 4),
    "hContextShare": (24, 4), "hVASpace": (28, 4), "hUserdMemory": (32, 32), "userdOffset": (64, 64),
    "engineType": (128, 4), "cid": (132, 4), "subDeviceId": (136, 4), "hObjectEccError": (140, 4),
    "instanceMem": (144, 24), "userdMem": (168, 24), "ramfcMem": (192, 24), "mthdbufMem": (216, 24),
    "hPhysChannelGroup": (240, 4), "internalFlags": (244, 4), "errorNotifierMem": (248, 24),
    "eccErrorNotifierMem": (272, 24), "ProcessID": (296, 4), "SubProcessID": (300, 4), "encryptIv": (304, 12),
    "decryptIv": (316, 12), "hmacNonce": (328, 32), "tpcConfigID": (360, 4)}),
  # OGKM ctrl/ctrl0080/ctrl0080gpu.h (NV0080_CTRL_GPU_CLASSLIST_MAX_SIZE 200), ctrl/ctrl2080/ctrl2080gpu.h
  # (NV2080_GPU_MAX_GID_LENGTH 0x100), ctrl/ctrlc36f.h, ctrl/ctrla06f/ctrla06fgpfifo.h
  "NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS": (804, {"numClasses": (0, 4), "classList": (4, 800)}),
  "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS": (268, {"index": (0, 4), "flags": (4, 4), "length": (8, 4), "data": (12, 256)}),
  "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS": (4, {"workSubmitToken": (0, 4)}),
  "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS": (3, {"bEnable": (0, 1), "bSkipSubmit": (1, 1), "bSkipEnable": (2, 1)}),
  # ctrl/ctrl2080/ctrl2080fb.h (NV2080_CTRL_FB_INFO is ctrlxxxx.h's NVXXXX_CTRL_XXX_INFO; MAX_LIST_SIZE 0x80)
  "NV2080_CTRL_FB_INFO": (8, {"index": (0, 4), "data": (4, 4)}),
  "NV2080_CTRL_FB_GET_INFO_V2_PARAMS": (1028, {"fbInfoListSize": (0, 4), "fbInfoList": (4, 1024)}),
  "NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS": (16, {"hChannel": (0, 4), "totalBufferSize": (8, 8)}),
  # OGKM kernel-open/nvidia-uvm/uvm_ioctl.h, uvm_linux_ioctl.h, uvm_types.h (NvProcessorUuid 16 bytes; UVM_MAX_GPUS =
  # NV_MAX_DEVICES 32 * UVM_PARENT_ID_MAX_SUB_PROCESSORS 8 = 256)
  "UVM_INITIALIZE_PARAMS": (16, {"flags": (0, 8), "rmStatus": (8, 4)}),
  "UVM_MM_INITIALIZE_PARAMS": (8, {"uvmFd": (0, 4), "rmStatus": (4, 4)}),
  "UVM_REGISTER_GPU_PARAMS": (40, {"gpu_uuid": (0, 16), "numaEnabled": (16, 1), "numaNodeId": (20, 4), "rmCtrlFd": (24, 4),
                                   "hClient": (28, 4), "hSmcPartRef": (32, 4), "rmStatus": (36, 4)}),
  "UVM_REGISTER_GPU_VASPACE_PARAMS": (32, {"gpuUuid": (0, 16), "rmCtrlFd": (16, 4), "hClient": (20, 4), "hVaSpace": (24, 4),
                                           "rmStatus": (28, 4)}),
  "UVM_CREATE_EXTERNAL_RANGE_PARAMS": (24, {"base": (0, 8), "length": (8, 8), "rmStatus": (16, 4)}),
  "UvmGpuMappingAttributes": (36, {"gpuUuid": (0, 16), "gpuMappingType": (16, 4), "gpuCachingType": (20, 4),
                                   "gpuFormatType": (24, 4), "gpuElementBits": (28, 4), "gpuCompressionType": (32, 4)}),
  "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS": (9264, {"base": (0, 8), "length": (8, 8), "offset": (16, 8),
                                                "perGpuAttributes": (24, 36 * 256), "gpuAttributesCount": (9240, 8),
                                                "rmCtrlFd": (9248, 4), "hClient": (9252, 4), "hMemory": (9256, 4),
                                                "rmStatus": (9260, 4)}),
  "UVM_FREE_PARAMS": (24, {"base": (0, 8), "length": (8, 8), "rmStatus": (16, 4)}),
  "UVM_REGISTER_CHANNEL_PARAMS": (56, {"gpuUuid": (0, 16), "rmCtrlFd": (16, 4), "hClient": (20, 4), "hChannel": (24, 4),
                                       "base": (32, 8), "length": (40, 8), "rmStatus": (48, 4)}),
  "UVM_UNREGISTER_CHANNEL_PARAMS": (28, {"gpuUuid": (0, 16), "hClient": (16, 4), "hChannel": (20, 4), "rmStatus": (24, 4)}),
}

# every scalar drivers/nv/rm.py defines
RM_SCALARS = {**CLASS_IDS, **ESCAPE_NUMBERS, **UVM_NUMBERS, **FLAGS, **RM_API_VERSION, "NV_IOCTL_MAGIC": NV_IOCTL_MAGIC,
              **{name: cmd for name, (cmd, _) in CONTROLS.items()}, **RC_ERRORS, "NV_OK": NV_STATUS["NV_OK"],
              "NOTIFICATION_STATUS_ERROR": NOTIFICATION_STATUS_ERROR, "HEADERS_VERSION": "580.142"}
# its tables, each compared in full by a test below
RM_TABLES = {"SUPPORTED_SERIES", "ESCAPES", "UVM_IOCTLS", "COMPUTE_CLASSES", "COPY_CLASSES", "CHANNEL_CLASSES",
             "USERMODE_CLASSES", "CONTROLS", "ALLOC_PARAMS", "CLASS_NAMES", "NV_STATUS", "STATUS", "RC_ERRORS"}


def test_rm_scalars_match_headers():
  ours = {k: v for k, v in vars(rm).items() if k.isupper() and isinstance(v, (int, str)) and not isinstance(v, bool)}
  assert set(ours) == set(RM_SCALARS), (f"only in rm.py (transcribe it here from its header): {sorted(set(ours) - set(RM_SCALARS))}; "
                                        f"only here: {sorted(set(RM_SCALARS) - set(ours))}")
  wrong = {k: (ours[k], RM_SCALARS[k]) for k in RM_SCALARS if ours[k] != RM_SCALARS[k]}
  assert not wrong, "rm.py constants that differ from the headers (ours, header): " + repr(wrong)
  tables = {k for k, v in vars(rm).items() if k.isupper() and isinstance(v, (dict, tuple))}
  assert tables == RM_TABLES, f"rm.py tables without a test here: {sorted(tables - RM_TABLES)}"
  assert rm.SUPPORTED_SERIES == ("580",) and rm.HEADERS_VERSION.split(".")[0] in rm.SUPPORTED_SERIES


def test_rm_escapes_and_ioctl_requests():
  assert {nr: name for nr, (name, _) in rm.ESCAPES.items()} == {ESCAPE_NUMBERS[n]: n for n in ESCAPE_NUMBERS
                                                                 if n.startswith("NV_ESC_") and n != "NV_ESC_RM_UNMAP_MEMORY"}
  assert {nr: struct for nr, (_, struct) in rm.ESCAPES.items()} == ESCAPE_PARAMS
  for nr, request in ESCAPE_REQUESTS.items():
    struct = ESCAPE_PARAMS[nr]
    size = STRUCTS[struct.replace("[32]", "")][0] * (32 if struct.endswith("[32]") else 1)
    assert request == (3 << 30) | (size << 16) | (ord("F") << 8) | nr     # the hand-computed word is the formula's
    assert rm.escape_request(nr) == request, f"{rm.ESCAPES[nr][0]}: {rm.escape_request(nr):#x}, want {request:#x}"
  assert rm.UVM_IOCTLS == {num: (name, name + "_PARAMS") for name, num in UVM_NUMBERS.items()}


def test_rm_controls_classes_and_alloc_params():
  assert rm.CONTROLS == {cmd: (name, struct) for name, (cmd, struct) in CONTROLS.items()}
  for name, (cmd, _) in CONTROLS.items():   # a command's high 16 bits are its interface's class (finn: class << 16 | ...)
    assert cmd >> 16 == int(name[2:6], 16), name
  assert rm.ALLOC_PARAMS == ALLOC_PARAMS
  assert rm.COMPUTE_CLASSES == COMPUTE_CLASSES and list(rm.COMPUTE_CLASSES) == sorted(COMPUTE_CLASSES, reverse=True)
  assert rm.COPY_CLASSES == COPY_CLASSES and rm.CHANNEL_CLASSES == CHANNEL_CLASSES and rm.USERMODE_CLASSES == USERMODE_CLASSES
  for cls, (_, version) in COMPUTE_CLASSES.items(): assert version in qmd.TABLES, rm.class_name(cls)
  assert rm.CLASS_NAMES == {v: k for k, v in CLASS_IDS.items()}


def test_rm_status_codes_and_rc_errors():
  assert rm.NV_STATUS == {v: k for k, v in NV_STATUS.items()}
  assert rm.STATUS == NV_STATUS
  assert {int(code): text.split(":")[0] for code, text in rm.RC_ERRORS.items()} == {v: k for k, v in RC_ERRORS.items()}


def test_struct_layouts_match_headers():
  """Every struct of rm.py's cdef: sizeof, and every field's offset and size, as gcc lays out the header's struct."""
  typedefs = set(rm.ffi.list_types()[0])
  assert typedefs == set(STRUCTS), (f"structs only in rm.py (transcribe them here): {sorted(typedefs - set(STRUCTS))}; "
                                    f"only here: {sorted(set(STRUCTS) - typedefs)}")
  wrong = []
  for name, (size, fields) in STRUCTS.items():
    t = rm.ffi.typeof(name)
    if rm.ffi.sizeof(t) != size: wrong.append(f"sizeof({name}) = {rm.ffi.sizeof(t)}, header {size}")
    ours = {f for f, _ in t.fields}
    if ours != set(fields): wrong.append(f"{name} fields: only ours {sorted(ours - set(fields))}, only header {sorted(set(fields) - ours)}")
    for f, field in t.fields:
      if f not in fields: continue
      got = (rm.ffi.offsetof(t, f), rm.ffi.sizeof(field.type))
      if got != fields[f]: wrong.append(f"{name}.{f}: (offset, size) {got}, header {fields[f]}")
  assert not wrong, "\n".join(wrong)


# ==== the emulated GPU rejects what the tables do not define ======================================================
@pytest.fixture
def fresh():
  """A driver on its own emulated GPU: a faulted channel stays stopped."""
  from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
  from baregrad.drivers.nv.driver import NVDriver
  return NVDriver(kernel=EmulatedNVKernel())


def _fault(d, words, kind="compute", timeout=5.0) -> str:
  from baregrad.drivers.nv.driver import NVError
  d.submit(kind, Encoded(list(words)))
  end = time.monotonic() + timeout
  while d.k.fault() is None and time.monotonic() < end: time.sleep(0.005)
  with pytest.raises(NVError) as e: d.check_faults("NV")
  return str(e.value)


def _m(subc, method, *data): return [pb.method_header(subc, method, len(data)), *data]


@pytest.mark.parametrize("kind, subc, method, cls", [
  ("compute", pb.SUBC_COMPUTE, 0x0214, "HOPPER_COMPUTE_A (0xcbc0)"),    # NVCBC0_SET_QMD_VIRTUALIZATION_BASE_A (not emulated)
  ("compute", pb.SUBC_COMPUTE, 0x02B8, "HOPPER_COMPUTE_A (0xcbc0)"),    # NVCBC0_SEND_PCAS_B (not emulated)
  ("compute", pb.SUBC_COMPUTE, 0x3FFC, "HOPPER_COMPUTE_A (0xcbc0)"),    # in no header
  ("copy", pb.SUBC_COPY, 0x0500, "HOPPER_DMA_COPY_A (0xc8b5)"),         # NVC8B5_SET_SECURE_COPY_MODE
  ("copy", 0, 0x0028, "HOPPER_CHANNEL_GPFIFO_A (0xc86f)"),              # NVC86F_MEM_OP_A, a host method
], ids=["compute-0x0214", "compute-0x02b8", "compute-0x3ffc", "copy-0x0500", "host-0x0028"])
def test_unknown_method_is_rejected_naming_method_and_class(fresh, kind, subc, method, cls):
  msg = _fault(fresh, _m(subc, method, 0x1), kind)
  assert f"{method:#06x}" in msg and cls in msg and f"channel '{kind}'" in msg and "ROBUST_CHANNEL_PBDMA_ERROR" in msg


@pytest.mark.parametrize("words, want", [
  (_m(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, 0x6), "PCAS_ACTION_INCREMENT_PUT is not emulated"),
  (_m(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, 0x5), "PCAS_ACTION 0x5 is not a PCAS_ACTION of clcbc0.h"),
  (_m(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, 0x103), "SEND_SIGNALING_PCAS2_B 0x103: bits MW(8:8) are set"),   # SELECT
  (_m(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, 0x13), "SEND_SIGNALING_PCAS2_B 0x13: bits MW(4:4) are set"),     # no field
  (_m(pb.SUBC_COMPUTE, pb.INVALIDATE_SHADER_CACHES_NO_WFI, 0x2), r"bits MW(1:1) are not fields"),
  (_m(0, pb.WFI, 0x3), "WFI 0x3: bits MW(1:1)"),
  (_m(0, pb.SEM_ADDR_LO, 0, 0, 1, 0, pb.SEM_OPERATION_RELEASE | (7 << 27)), "SEM_EXECUTE 0x38000001: bits MW(29:27)"),
  (_m(pb.SUBC_COPY, pb.LAUNCH_DMA, 0x2 | (1 << 3) | (1 << 7) | (1 << 8)), "SEMAPHORE_TYPE (4:3) = 1 is not emulated"),
  (_m(pb.SUBC_COPY, pb.LAUNCH_DMA, 0x2), "SRC_MEMORY_LAYOUT (7:7) = 0 is not emulated"),    # BLOCKLINEAR
])
def test_method_data_it_does_not_emulate_is_rejected(fresh, words, want):
  assert want in _fault(fresh, words)


TINY_PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry tiny(.param .u64 out)\n{\n  ret;\n}\n"


def _qmd_fault(d, edit, program: int = 0x1000) -> str:
  """Submit a launch whose V04_00 QMD (otherwise what the driver writes) went through `edit(fields) -> bits to or in`."""
  table = qmd.TABLES[(4, 0)]
  mem = d.alloc(4096)
  fields = qmd.launch_fields((4, 0), program=program, cbufs={0: (mem.addr + 1024, 0x400)}, grid=(1, 1, 1),
                             block=(32, 1, 1), registers=16, shared=0, barriers=0, sm_config=(8 << 10, 8 << 10, 228 << 10),
                             sass_version=0x90)
  extra = edit(fields) or 0
  data = int.from_bytes(qmd.pack(table, fields), "little") | extra
  d.view(mem.addr, qmd.QMD_BYTES)[:] = data.to_bytes(qmd.QMD_BYTES, "little")
  qmd_address = mem.addr >> SEND_PCAS_A_QMD_ADDRESS_SHIFTED8_SHIFT
  return _fault(d, _m(pb.SUBC_COMPUTE, pb.SEND_PCAS_A, qmd_address) + _m(pb.SUBC_COMPUTE, pb.SEND_SIGNALING_PCAS2_B, 0x3))


def test_qmd_with_unknown_version_is_rejected(fresh):
  msg = _qmd_fault(fresh, lambda f: f.update(QMD_MAJOR_VERSION=5))
  assert "QMD_MAJOR_VERSION 5 / QMD_MINOR_VERSION 0" in msg and "reads QMD V04_00" in msg


def test_qmd_with_bits_outside_known_fields_is_rejected(fresh):
  # DEPENDENCE_COUNTER MW(15:0) and, past the 256 bytes a V03_00 QMD has, GPC_CGA_WIDTH MW(2149:2144)
  msg = _qmd_fault(fresh, lambda f: (1 << 3) | (0x3 << 2144))
  assert "bits MW(3:3), MW(2145:2144) are set outside every QMD V04_00 field" in msg


def test_qmd_of_another_type_is_rejected(fresh):
  assert "QMD_TYPE 1 is not emulated" in _qmd_fault(fresh, lambda f: f.update(QMD_TYPE=1))     # GRID_NULL


def test_qmd_binding_a_constant_buffer_the_kernel_lacks_is_rejected(fresh):
  program, _ = fresh.load_program(fresh.compile(TINY_PTX), "tiny")
  msg = _qmd_fault(fresh, lambda f: f.update(CONSTANT_BUFFER_VALID_3=1), program)
  assert "constant buffers [3] are valid but the kernel has no such constant bank" in msg


def test_a_well_formed_qmd_gets_past_the_checks(fresh):
  """The same launch unedited fails only where it should: no program was uploaded at its code address."""
  assert "no program was uploaded at code address 0x1000" in _qmd_fault(fresh, lambda f: None)


# ==== gcc probes of the headers themselves (when checkouts are given) =============================================
OGKM = os.environ.get("NV_OPEN_GPU_KERNEL_MODULES", "")
DOC = os.environ.get("NV_OPEN_GPU_DOC", "")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _probe(tmp_path, includes, incdirs, lines) -> list[str]:
  src = tmp_path / "probe.c"
  src.write_text("#include <stdio.h>\n#include <stddef.h>\n" + "".join(f'#include "{h}"\n' for h in includes) +
                 "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
  exe = tmp_path / "probe"
  cc = subprocess.run(["gcc", "-O0", *(a for d in incdirs for a in ("-I", d)), "-o", str(exe), str(src)],
                      capture_output=True, text=True)
  assert cc.returncode == 0, cc.stderr[-3000:]
  return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()


@needs_gcc
@pytest.mark.skipif(not OGKM, reason="set NV_OPEN_GPU_KERNEL_MODULES to a checkout of open-gpu-kernel-modules at 580.142")
def test_gcc_probe_of_open_gpu_kernel_modules(tmp_path):
  """Sizes/offsets of every struct, and every class id / number / method offset, compiled from the headers and
  compared with the transcription above and with the driver's cffi layouts."""
  d = lambda *p: os.path.join(OGKM, *p)
  rm_structs = [s for s in STRUCTS if not s.startswith(("UVM_", "Uvm"))]
  lines = []
  for name in rm_structs:
    lines.append(f'printf("S {name} %zu\\n", sizeof({name}));')
    lines += [f'printf("F {name} {f} %zu %zu\\n", offsetof({name}, {f}), sizeof((({name} *)0)->{f}));' for f in STRUCTS[name][1]]
  consts = {**{k: v for k, v in RM_SCALARS.items() if isinstance(v, int) and not k.startswith(("UVM_", "ROBUST", "NOTIFICATION",
            "NV_VASPACE", "NV_CTXSHARE"))},
            **{f"NVC56F_{k}": v for k, v in HOST_METHODS[0xC56F].items()}, **{f"NVC86F_{k}": v for k, v in HOST_METHODS[0xC86F].items()},
            **{f"NV{c:04X}_{k}": v for c in (0xC6B5, 0xC7B5) for k, v in _COPY.items()},
            **{f"NVC8B5_{k}": v for k, v in _COPY.items() if k != "LINE_COUNT"},
            **{f"NVC6C0_{k}": v for k, v in _COMPUTE.items()}, "NVC361_NOTIFY_CHANNEL_PENDING": NOTIFY_CHANNEL_PENDING,
            "NVC361_NV_USERMODE__SIZE": NV_USERMODE_SIZE, "NVC86F_GP_ENTRY__SIZE": GP_ENTRY_SIZE,
            "NVC56F_DMA_SEC_OP_INC_METHOD": 1, "NVC56F_DMA_SEC_OP_NON_INC_METHOD": 3, "NVC56F_DMA_SEC_OP_IMMD_DATA_METHOD": 4,
            "NVC56F_DMA_SEC_OP_ONE_INC": 5, "NVC56F_SEM_EXECUTE_OPERATION_ACQ_STRICT_GEQ": 2,
            "NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED": 1 << 3, "NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING": 1 << 6,
            **NV_STATUS, **RC_ERRORS, "NV_PROC_NAME_MAX_LENGTH": 100}
  for flag, (field, value) in {"NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS": ("NVOS02_FLAGS_PHYSICALITY", "NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS"),
                               "NVOS02_FLAGS_COHERENCY_CACHED": ("NVOS02_FLAGS_COHERENCY", "NVOS02_FLAGS_COHERENCY_CACHED"),
                               "NVOS02_FLAGS_MAPPING_NO_MAP": ("NVOS02_FLAGS_MAPPING", "NVOS02_FLAGS_MAPPING_NO_MAP"),
                               "NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC": ("NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT",
                                                                                 "NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC"),
                               "NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY": ("NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT",
                                                                                  "NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY")}.items():
    consts.pop(flag, None)
    lines.append(f'printf("C {flag} %llu\\n", (unsigned long long)({value}) << (0 ? {field}));')
  lines += [f'printf("C {k} %llu\\n", (unsigned long long)({k}));' for k in consts]
  headers = ["nvtypes.h", "nvmisc.h", "nvos.h", "nvstatus.h", "nverror.h", "nv-ioctl.h", "nv-ioctl-numbers.h", "nv_escape.h",
             "nv-unix-nvos-params-wrappers.h", "class/cl0000.h", "class/cl0080.h", "class/cl2080.h", "class/cl0071.h",
             "class/cl90f1.h", "class/cl9067.h", "class/cla06c.h", "class/clc361.h", "class/clc561.h", "class/clc661.h",
             "class/clc56f.h", "class/clc86f.h", "class/clc6c0.h", "class/clc7c0.h", "class/clc9c0.h", "class/clcbc0.h",
             "class/clc6b5.h", "class/clc7b5.h", "class/clc8b5.h", "class/cl2080_notification.h", "alloc/alloc_channel.h",
             "ctrl/ctrl0080/ctrl0080gpu.h", "ctrl/ctrl2080/ctrl2080gpu.h", "ctrl/ctrlc36f.h", "ctrl/ctrla06c.h",
             "class/cl0040.h", "ctrl/ctrl2080/ctrl2080fb.h"]
  out = _probe(tmp_path, headers, [d("src/common/sdk/nvidia/inc"), d("src/nvidia/arch/nvalloc/unix/include"),
                                   d("kernel-open/common/inc")], lines)
  uvm = [s for s in STRUCTS if s.startswith(("UVM_", "Uvm"))]
  lines = [f'printf("S {s} %zu\\n", sizeof({s}));' for s in uvm]
  lines += [f'printf("F {s} {f} %zu %zu\\n", offsetof({s}, {f}), sizeof((({s} *)0)->{f}));' for s in uvm for f in STRUCTS[s][1]]
  lines += [f'printf("C {k} %llu\\n", (unsigned long long)({k}));' for k in UVM_NUMBERS]
  out += _probe(tmp_path, ["uvm_linux_ioctl.h", "uvm_ioctl.h"], [d("kernel-open/nvidia-uvm"), d("kernel-open/common/inc")], lines)
  checked = 0
  for line in out:
    kind, *rest = line.split()
    if kind == "S":
      assert STRUCTS[rest[0]][0] == int(rest[1]) == rm.ffi.sizeof(rest[0]), rest
    elif kind == "F":
      name, f, off, size = rest[0], rest[1], int(rest[2]), int(rest[3])
      assert STRUCTS[name][1][f] == (off, size), (name, f)
      assert rm.ffi.offsetof(name, f) == off, (name, f)
    else:
      name, value = rest[0], int(rest[1])
      want = {**consts, **UVM_NUMBERS, **FLAGS}[name]
      assert want == value, f"{name}: transcribed {want:#x}, header {value:#x}"
    checked += 1
  assert checked > 300


@needs_gcc
@pytest.mark.skipif(not DOC, reason="set NV_OPEN_GPU_DOC to a checkout of open-gpu-doc")
def test_gcc_probe_of_open_gpu_doc(tmp_path):
  """Every transcribed QMD field's MW(hi:lo), and the compute methods / LINE_COUNT, compiled from open-gpu-doc."""
  lines = []
  for prefix, header_lines in (("NVCBC0_QMDV04_00_", QMD_V04_00_HEADER), ("NVC6C0_QMDV03_00_", QMD_V03_00_HEADER)):
    for line in header_lines.strip().splitlines():
      name = line.split()[0]
      for i in (range(8) if name.endswith("(i)") else [None]):
        macro = prefix + (name[:-3] + f"({i})" if i is not None else name)
        lines.append(f'printf("{macro} %d %d\\n", (1 ? {macro}), (0 ? {macro}));')
  for cls, methods in COMPUTE_METHODS.items():
    lines += [f'printf("NV{cls:04X}_{k} %d %d\\n", NV{cls:04X}_{k}, NV{cls:04X}_{k});' for k in methods]
  lines.append('printf("NVC8B5_LINE_COUNT %d %d\\n", NVC8B5_LINE_COUNT, NVC8B5_LINE_COUNT);')
  headers = ["classes/compute/clcbc0qmd.h", "classes/compute/clc6c0qmd.h", "classes/compute/clc6c0.h", "classes/compute/clc7c0.h",
             "classes/compute/clc9c0.h", "classes/compute/clcbc0.h", "classes/dma-copy/clc8b5.h"]
  (tmp_path / "mw.h").write_text("#define MW(x) x\n")      # hi is (1 ? hi:lo), lo is (0 ? hi:lo), as NVIDIA's DRF macros
  (tmp_path / "nvtypes.h").write_text("")                   # the class headers include it; the probe needs no type
  out = _probe(tmp_path, ["mw.h", *headers], [DOC, str(tmp_path)], lines)
  got = {name: (int(hi), int(lo)) for name, hi, lo in (line.split() for line in out)}
  for prefix, header_lines in (("NVCBC0_QMDV04_00_", QMD_V04_00_HEADER), ("NVC6C0_QMDV03_00_", QMD_V03_00_HEADER)):
    for line in header_lines.strip().splitlines():
      name, macro = line.split(None, 1)
      for i in (range(8) if name.endswith("(i)") else [0]):
        full = prefix + (name[:-3] + f"({i})" if name.endswith("(i)") else name)
        assert got[full] == _mw(macro, i), (full, got[full], _mw(macro, i))
  for cls, methods in COMPUTE_METHODS.items():
    for k, v in methods.items(): assert got[f"NV{cls:04X}_{k}"] == (v, v)
  assert got["NVC8B5_LINE_COUNT"] == (_COPY["LINE_COUNT"],) * 2
