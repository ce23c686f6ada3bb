"""QMD (Queue Meta Data): the launch descriptor (256 bytes in V03_00, 384 in V04_00) the compute engine reads for a grid.

Field positions as bit ranges (hi, lo) over the QMD viewed as one little-endian bit string ("MW(hi:lo)"), from
NVIDIA's open-gpu-doc class headers: `classes/compute/clcbc0qmd.h` (HOPPER_COMPUTE_A, QMD V04_00) and
`classes/compute/clc6c0qmd.h` (AMPERE_COMPUTE_A; V03_00 is also used by AMPERE_COMPUTE_B and ADA_COMPUTE_A).
Only the fields baregrad writes or the emulator reads. `pack` writes a dict of field values, `unpack` reads
every field of a table back.
"""
from __future__ import annotations

# The QMD's size: V04_00 fields run to MW(3071:3071) (NVCBC0_QMDV04_00_OUTER_STICKY_OVERFLOW), 384 bytes; V03_00 to
# MW(2047:2016) (NVC6C0_QMDV03_00_DEBUG_ID_LOWER), 256 bytes. Every QMD baregrad writes takes the larger size, so what
# follows a QMD in memory (its constant bank 0) never overlaps the fields the compute engine reads.
SIZES = {(4, 0): 384, (3, 0): 256}
QMD_BYTES = max(SIZES.values())


# NVCBC0_QMDV04_00_* (clcbc0qmd.h)
V04_00 = {
  "QMD_GROUP_ID": (21, 16), "QMD_TYPE": (25, 23),
  "SHADER_LOCAL_MEMORY_LOW_SIZE": (535, 512), "SASS_VERSION": (543, 536), "SHADER_LOCAL_MEMORY_HIGH_SIZE": (567, 544),
  "API_VISIBLE_CALL_LIMIT": (568, 568), "SAMPLER_INDEX": (569, 569),
  "QMD_MINOR_VERSION": (579, 576), "QMD_MAJOR_VERSION": (583, 580), "SHARED_MEMORY_SIZE": (601, 584),
  "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 602), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 603),
  "INVALIDATE_TEXTURE_DATA_CACHE": (604, 604), "INVALIDATE_SHADER_DATA_CACHE": (605, 605),
  "INVALIDATE_INSTRUCTION_CACHE": (606, 606), "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 607),
  "MIN_SM_CONFIG_SHARED_MEM_SIZE": (613, 608), "MAX_SM_CONFIG_SHARED_MEM_SIZE": (619, 614),
  "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (625, 620),
  "GRID_WIDTH": (1055, 1024), "GRID_HEIGHT": (1071, 1056), "GRID_DEPTH": (1103, 1088),
  "CTA_THREAD_DIMENSION0": (1167, 1152), "CTA_THREAD_DIMENSION1": (1183, 1168), "CTA_THREAD_DIMENSION2": (1199, 1184),
  "REGISTER_COUNT": (1208, 1200), "BARRIER_COUNT": (1215, 1211),
  "PROGRAM_ADDRESS_LOWER": (1247, 1216), "PROGRAM_ADDRESS_UPPER": (1272, 1248),
}
for _i in range(8):   # CONSTANT_BUFFER_VALID(i) MW(416+i*4), ADDR_*_SHIFTED6(i) and SIZE_SHIFTED4(i) every 64 bits
  V04_00[f"CONSTANT_BUFFER_VALID_{_i}"] = (416 + _i * 4, 416 + _i * 4)
  V04_00[f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_{_i}"] = (1567 + _i * 64, 1536 + _i * 64)
  V04_00[f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_{_i}"] = (1586 + _i * 64, 1568 + _i * 64)
  V04_00[f"CONSTANT_BUFFER_SIZE_SHIFTED4_{_i}"] = (1599 + _i * 64, 1587 + _i * 64)

# NVC6C0_QMDV03_00_* (clc6c0qmd.h)
V03_00 = {
  "QMD_GROUP_ID": (133, 128), "SM_GLOBAL_CACHING_ENABLE": (134, 134),
  "INVALIDATE_TEXTURE_HEADER_CACHE": (186, 186), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (187, 187),
  "INVALIDATE_TEXTURE_DATA_CACHE": (188, 188), "INVALIDATE_SHADER_DATA_CACHE": (189, 189),
  "INVALIDATE_INSTRUCTION_CACHE": (190, 190), "INVALIDATE_SHADER_CONSTANT_CACHE": (191, 191),
  "API_VISIBLE_CALL_LIMIT": (378, 378), "SAMPLER_INDEX": (382, 382),
  "CTA_RASTER_WIDTH": (415, 384), "CTA_RASTER_HEIGHT": (431, 416), "CTA_RASTER_DEPTH": (463, 448),
  "SHARED_MEMORY_SIZE": (561, 544), "MIN_SM_CONFIG_SHARED_MEM_SIZE": (567, 562), "MAX_SM_CONFIG_SHARED_MEM_SIZE": (574, 569),
  "QMD_VERSION": (579, 576), "QMD_MAJOR_VERSION": (583, 580),
  "CTA_THREAD_DIMENSION0": (607, 592), "CTA_THREAD_DIMENSION1": (623, 608), "CTA_THREAD_DIMENSION2": (639, 624),
  "REGISTER_COUNT_V": (656, 648), "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (662, 657),
  "SHADER_LOCAL_MEMORY_LOW_SIZE": (759, 736), "BARRIER_COUNT": (767, 763),
  "PROGRAM_ADDRESS_LOWER": (1567, 1536), "PROGRAM_ADDRESS_UPPER": (1584, 1568),
  "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1623, 1600), "SASS_VERSION": (1663, 1656),
}
for _i in range(8):   # CONSTANT_BUFFER_VALID(i) MW(640+i), ADDR_LOWER/UPPER(i) and SIZE_SHIFTED4(i) every 64 bits
  V03_00[f"CONSTANT_BUFFER_VALID_{_i}"] = (640 + _i, 640 + _i)
  V03_00[f"CONSTANT_BUFFER_ADDR_LOWER_{_i}"] = (1055 + _i * 64, 1024 + _i * 64)
  V03_00[f"CONSTANT_BUFFER_ADDR_UPPER_{_i}"] = (1072 + _i * 64, 1056 + _i * 64)
  V03_00[f"CONSTANT_BUFFER_SIZE_SHIFTED4_{_i}"] = (1087 + _i * 64, 1075 + _i * 64)

TABLES = {(4, 0): V04_00, (3, 0): V03_00}
QMD_TYPE_GRID_CTA = 2            # NVCBC0_QMDV04_00_QMD_TYPE_GRID_CTA

# MIN/MAX/TARGET_SM_CONFIG_SHARED_MEM_SIZE hold an SM's shared-memory carveout (the L1/shared split the SM is set to
# while the grid runs) as `bytes / 4096 + 1`: the headers give no comment, the encoding is Mesa NVK's
# (src/nouveau/vulkan/nvk_cmd_dispatch.c and src/nouveau/compiler/nak/qmd.rs: gv100_sm_config_smem_size, the same
# fields in QMD V02_02 .. V04_00), and nouveau's gallium driver (nvc0/nve4_compute.c) writes them the same way.
SM_CONFIG_GRANULE = 4096


def sm_config_shared_mem(nbytes: int) -> int:
  """The SM_CONFIG_SHARED_MEM_SIZE field value of a carveout of `nbytes` (a multiple of 4 KiB)."""
  if nbytes % SM_CONFIG_GRANULE: raise ValueError(f"shared memory carveout {nbytes} is not a multiple of 4 KiB")
  return nbytes // SM_CONFIG_GRANULE + 1


def sm_config_bytes(value: int) -> int | None:
  """The carveout in bytes a SM_CONFIG_SHARED_MEM_SIZE field value encodes; None for 0 (not an encoding)."""
  return (value - 1) * SM_CONFIG_GRANULE if value else None


def pack(table: dict, values: dict) -> bytes:
  """A QMD with `values` (field name -> int) at the table's bit positions; other bits zero."""
  return pack_bits(table, values).to_bytes(QMD_BYTES, "little")


def pack_bits(table: dict, values: dict) -> int:
  """`values` (field name -> int) at the table's bit positions, as one integer (bit 0 = the QMD's first bit)."""
  bits = 0
  for name, value in values.items():
    if name not in table: raise KeyError(f"QMD field {name} is not in this QMD version's table")
    hi, lo = table[name]
    width = hi - lo + 1
    if not 0 <= value < (1 << width): raise ValueError(f"QMD field {name}={value:#x} does not fit in {width} bits")
    bits |= value << lo
  return bits


def unpack(table: dict, data: bytes) -> dict:
  """Every field of `table` read from a QMD."""
  bits = int.from_bytes(bytes(data[:QMD_BYTES]), "little")
  return {name: (bits >> lo) & ((1 << (hi - lo + 1)) - 1) for name, (hi, lo) in table.items()}


def cbuf_address_fields(version: tuple, bank: int, addr: int) -> dict:
  """The fields holding constant buffer `bank`'s address (V04_00: shifted by 6, 64-byte aligned; V03_00: as is)."""
  if version == (4, 0):
    if addr & 63: raise ValueError(f"QMD V04_00: constant buffer {bank} address {addr:#x} is not 64-byte aligned")
    return {f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_{bank}": (addr >> 6) & 0xFFFFFFFF,
            f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_{bank}": addr >> 38}
  return {f"CONSTANT_BUFFER_ADDR_LOWER_{bank}": addr & 0xFFFFFFFF, f"CONSTANT_BUFFER_ADDR_UPPER_{bank}": addr >> 32}


def launch_fields(version: tuple, *, program: int, cbufs: dict, grid, block, registers: int, shared: int,
                  barriers: int, sm_config: tuple, local_low: int = 0, local_high: int = 0, sass_version: int) -> dict:
  """The field values of one grid launch, for QMD `version` (4, 0) or (3, 0). cbufs: {bank: (address, bytes)};
  sm_config: the (min, target, max) shared-memory carveout in bytes; local_low / local_high: bytes of local memory
  per thread from address 0 up / from the top of the local window down (where ptxas code keeps its stack)."""
  v = {"QMD_GROUP_ID": 0x3F, "API_VISIBLE_CALL_LIMIT": 1, "SAMPLER_INDEX": 1, "QMD_MAJOR_VERSION": version[0],
       "INVALIDATE_TEXTURE_HEADER_CACHE": 1, "INVALIDATE_TEXTURE_SAMPLER_CACHE": 1, "INVALIDATE_TEXTURE_DATA_CACHE": 1,
       "INVALIDATE_SHADER_DATA_CACHE": 1, "INVALIDATE_SHADER_CONSTANT_CACHE": 1,
       "CTA_THREAD_DIMENSION0": block[0], "CTA_THREAD_DIMENSION1": block[1], "CTA_THREAD_DIMENSION2": block[2],
       "SHARED_MEMORY_SIZE": (shared + 255) // 256 * 256, "BARRIER_COUNT": barriers,
       "MIN_SM_CONFIG_SHARED_MEM_SIZE": sm_config_shared_mem(sm_config[0]),
       "TARGET_SM_CONFIG_SHARED_MEM_SIZE": sm_config_shared_mem(sm_config[1]),
       "MAX_SM_CONFIG_SHARED_MEM_SIZE": sm_config_shared_mem(sm_config[2]),
       "SHADER_LOCAL_MEMORY_LOW_SIZE": (local_low + 15) // 16 * 16, "SHADER_LOCAL_MEMORY_HIGH_SIZE": (local_high + 15) // 16 * 16,
       "SASS_VERSION": sass_version, "PROGRAM_ADDRESS_LOWER": program & 0xFFFFFFFF, "PROGRAM_ADDRESS_UPPER": program >> 32}
  if version == (4, 0):
    v.update({"QMD_TYPE": QMD_TYPE_GRID_CTA, "QMD_MINOR_VERSION": version[1], "GRID_WIDTH": grid[0],
              "GRID_HEIGHT": grid[1], "GRID_DEPTH": grid[2], "REGISTER_COUNT": registers})
  else:
    v.update({"QMD_VERSION": version[1], "CTA_RASTER_WIDTH": grid[0], "CTA_RASTER_HEIGHT": grid[1],
              "CTA_RASTER_DEPTH": grid[2], "REGISTER_COUNT_V": registers, "SM_GLOBAL_CACHING_ENABLE": 1})
  for i, (addr, size) in sorted(cbufs.items()):
    v.update({f"CONSTANT_BUFFER_VALID_{i}": 1, f"CONSTANT_BUFFER_SIZE_SHIFTED4_{i}": (size + 15) >> 4})
    v.update(cbuf_address_fields(version, i, addr))
  return v


# The register file: 64K 32-bit registers per SM, which is also the most one thread block may hold, on sm_80 .. sm_90
# (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": "Maximum number of 32-bit registers
# per thread block" 64K); registers are given to each warp in units of 256 (the "register allocation unit size" of the
# CUDA occupancy calculator for these compute capabilities).
REGISTER_FILE, REGISTER_UNIT = 65536, 256


def block_registers(registers: int, threads: int) -> int:
  """Registers a block of `threads` threads takes when each thread uses `registers` (per-warp allocation units)."""
  per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
  return per_warp * -(-threads // 32)


def read_launch(version: tuple, data: bytes) -> dict:
  """What the emulator needs from a QMD, under version-independent names: program, the valid constant buffers
  ({bank: (address, bytes)}), grid, block, shared memory, SM carveout fields, local memory sizes."""
  f = unpack(TABLES[version], data)
  cbufs = {}
  for i in range(8):
    if not f[f"CONSTANT_BUFFER_VALID_{i}"]: continue
    if version == (4, 0):
      addr = (f[f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_{i}"] << 38) | (f[f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_{i}"] << 6)
    else:
      addr = (f[f"CONSTANT_BUFFER_ADDR_UPPER_{i}"] << 32) | f[f"CONSTANT_BUFFER_ADDR_LOWER_{i}"]
    cbufs[i] = (addr, f[f"CONSTANT_BUFFER_SIZE_SHIFTED4_{i}"] << 4)
  if version == (4, 0):
    grid = (f["GRID_WIDTH"], f["GRID_HEIGHT"], f["GRID_DEPTH"])
    major, minor = f["QMD_MAJOR_VERSION"], f["QMD_MINOR_VERSION"]
  else:
    grid = (f["CTA_RASTER_WIDTH"], f["CTA_RASTER_HEIGHT"], f["CTA_RASTER_DEPTH"])
    major, minor = f["QMD_MAJOR_VERSION"], f["QMD_VERSION"]
  return {"version": (major, minor), "program": (f["PROGRAM_ADDRESS_UPPER"] << 32) | f["PROGRAM_ADDRESS_LOWER"],
          "cbufs": cbufs, "cbuf0": cbufs.get(0, (0, 0))[0], "cbuf0_valid": int(0 in cbufs), "cbuf0_size": cbufs.get(0, (0, 0))[1],
          "grid": grid,
          "block": (f["CTA_THREAD_DIMENSION0"], f["CTA_THREAD_DIMENSION1"], f["CTA_THREAD_DIMENSION2"]),
          "shared": f["SHARED_MEMORY_SIZE"],
          "registers": f["REGISTER_COUNT"] if version == (4, 0) else f["REGISTER_COUNT_V"],
          "sm_config": (f["MIN_SM_CONFIG_SHARED_MEM_SIZE"], f["TARGET_SM_CONFIG_SHARED_MEM_SIZE"],
                        f["MAX_SM_CONFIG_SHARED_MEM_SIZE"]),
          "local": (f["SHADER_LOCAL_MEMORY_LOW_SIZE"], f["SHADER_LOCAL_MEMORY_HIGH_SIZE"]),
          "invalidate_instruction_cache": f["INVALIDATE_INSTRUCTION_CACHE"]}
