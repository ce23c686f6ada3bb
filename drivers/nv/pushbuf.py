"""Pushbuffer methods and GPFIFO entries: the words a GPFIFO channel fetches.

A pushbuffer is a list of 32-bit words: a method header (opcode, subchannel, method offset, count) followed by
its data words. A GPFIFO entry (two words) points the channel at a pushbuffer segment. Layouts from NVIDIA's
open-gpu-kernel-modules 580.142, `src/common/sdk/nvidia/inc/class/clc56f.h` ("dma method formats", GP_ENTRY,
SEM_*; the same in clc86f.h for HOPPER_CHANNEL_GPFIFO_A), the copy class `clc8b5.h`/`clc6b5.h` and, for the
compute class, NVIDIA open-gpu-doc `classes/compute/clcbc0.h` / `clc6c0.h` (same offsets for these methods).
"""
from __future__ import annotations

# method header (NVC56F_DMA_*): SEC_OP 31:29, COUNT 28:16 (or immediate data), SUBCHANNEL 15:13, ADDRESS 11:0 (offset / 4)
SEC_OP_INC_METHOD, SEC_OP_NON_INC_METHOD, SEC_OP_IMMD_DATA_METHOD, SEC_OP_ONE_INC = 1, 3, 4, 5

# subchannels baregrad binds its objects to
SUBC_COMPUTE, SUBC_COPY = 1, 4

# host (channel) methods, any subchannel (NVC56F_* / NVC86F_*)
SET_OBJECT = 0x0000
NON_STALL_INTERRUPT = 0x0020
SEM_ADDR_LO, SEM_ADDR_HI, SEM_PAYLOAD_LO, SEM_PAYLOAD_HI, SEM_EXECUTE = 0x005C, 0x0060, 0x0064, 0x0068, 0x006C
WFI = 0x0078
HOST_METHODS_END = 0x0100        # methods below this are executed by the channel itself, not the bound class
SEM_OPERATION_ACQUIRE, SEM_OPERATION_RELEASE, SEM_OPERATION_ACQ_STRICT_GEQ = 0, 1, 2   # SEM_EXECUTE_OPERATION 2:0
SEM_RELEASE_WFI = 1 << 20        # SEM_EXECUTE_RELEASE_WFI 20:20 EN
SEM_PAYLOAD_SIZE_64BIT = 1 << 24  # SEM_EXECUTE_PAYLOAD_SIZE 24:24
SEM_RELEASE_TIMESTAMP = 1 << 25  # SEM_EXECUTE_RELEASE_TIMESTAMP 25:25 EN
WFI_SCOPE_ALL = 1

# compute class (NVCBC0_* / NVC6C0_*)
SET_SHADER_SHARED_MEMORY_WINDOW_A, SET_SHADER_SHARED_MEMORY_WINDOW_B = 0x02A0, 0x02A4
SET_I2M_SPARE_NOOP00 = 0x01F0     # V 31:0, no effect (the same offset in clc6c0.h .. clcdc0.h)
SEND_PCAS_A = 0x02B4             # QMD_ADDRESS_SHIFTED8 31:0
# inline to memory (I2M): LAUNCH_DMA starts a write of LINE_LENGTH_IN bytes to OFFSET_OUT_UPPER:OFFSET_OUT, whose data
# follows as LOAD_INLINE_DATA words (the same offsets in clc6c0.h, clc7c0.h, clc9c0.h and clcbc0.h). It puts QMDs,
# constant bank 0 and program code into video memory from the pushbuffer, so the host never writes them through BAR1.
I2M_LINE_LENGTH_IN, I2M_LINE_COUNT, I2M_OFFSET_OUT_UPPER, I2M_OFFSET_OUT = 0x0180, 0x0184, 0x0188, 0x018C
I2M_LAUNCH_DMA, I2M_LOAD_INLINE_DATA = 0x01B0, 0x01B4
I2M_LAUNCH_DMA_FIELDS = {"DST_MEMORY_LAYOUT": (0, 0), "REDUCTION_ENABLE": (1, 1), "REDUCTION_FORMAT": (3, 2),
                         "COMPLETION_TYPE": (5, 4), "SYSMEMBAR_DISABLE": (6, 6), "INTERRUPT_TYPE": (9, 8),
                         "SEMAPHORE_STRUCT_SIZE": (12, 12), "REDUCTION_OP": (15, 13)}
I2M_DST_MEMORY_LAYOUT_PITCH = 1 << 0          # DST_MEMORY_LAYOUT PITCH (0: BLOCKLINEAR)
I2M_SYSMEMBAR_DISABLE = 1 << 6                # SYSMEMBAR_DISABLE TRUE (COMPLETION_TYPE 0: FLUSH_DISABLE)
I2M_MAX_WORDS = (1 << 13) - 2                 # data words after LAUNCH_DMA in one method header (COUNT is 13 bits)
SEND_SIGNALING_PCAS2_B = 0x02C0  # PCAS_ACTION 3:0
PCAS_ACTION_INVALIDATE_COPY_SCHEDULE = 3
SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A = 0x02E4     # SIZE_UPPER 7:0 (bytes of local memory per TPC)
SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B = 0x02E8     # SIZE_LOWER 31:0
SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C = 0x02EC     # MAX_SM_COUNT 8:0
SET_SHADER_LOCAL_MEMORY_A, SET_SHADER_LOCAL_MEMORY_B = 0x0790, 0x0794   # ADDRESS_UPPER 24:0, ADDRESS_LOWER 31:0
SET_SHADER_LOCAL_MEMORY_WINDOW_A, SET_SHADER_LOCAL_MEMORY_WINDOW_B = 0x07B0, 0x07B4
INVALIDATE_SHADER_CACHES_NO_WFI = 0x1698
INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION = 1 << 0     # INSTRUCTION 0:0 TRUE

# copy class (NVC8B5_* / NVC6B5_*)
LAUNCH_DMA = 0x0300
OFFSET_IN_UPPER, OFFSET_IN_LOWER, OFFSET_OUT_UPPER, OFFSET_OUT_LOWER = 0x0400, 0x0404, 0x0408, 0x040C
LINE_LENGTH_IN, LINE_COUNT = 0x0418, 0x041C
DMA_DATA_TRANSFER_TYPE_NON_PIPELINED = 2          # LAUNCH_DMA_DATA_TRANSFER_TYPE 1:0
DMA_FLUSH_ENABLE = 1 << 2                         # LAUNCH_DMA_FLUSH_ENABLE 2:2
DMA_SRC_MEMORY_LAYOUT_PITCH = 1 << 7              # LAUNCH_DMA_SRC_MEMORY_LAYOUT 7:7
DMA_DST_MEMORY_LAYOUT_PITCH = 1 << 8              # LAUNCH_DMA_DST_MEMORY_LAYOUT 8:8
DMA_MULTI_LINE_ENABLE = 1 << 9                    # LAUNCH_DMA_MULTI_LINE_ENABLE 9:9
DMA_REMAP_ENABLE = 1 << 10
DMA_SRC_TYPE_PHYSICAL, DMA_DST_TYPE_PHYSICAL = 1 << 12, 1 << 13

# GPFIFO entry (NVC86F_GP_ENTRY0/1): GET 31:2 | GET_HI 7:0 (bits 39:32 of the address), LEVEL 9:9, LENGTH 30:10, SYNC 31
GP_ENTRY_BYTES = 8
GP_ENTRY_MAX_LENGTH = (1 << 21) - 1
GP_ENTRY_MAX_ADDRESS = 1 << 40

# USERD (Nvc86fControl in clc86f.h): GPGet at 0x88, GPPut at 0x8c; the usermode doorbell (clc361.h): 0x90
USERD_GP_GET, USERD_GP_PUT, USERD_BYTES = 0x88, 0x8C, 0x200
USERMODE_NOTIFY_CHANNEL_PENDING = 0x90
USERMODE_BYTES = 0x10000          # NVC361_NV_USERMODE__SIZE


def method_header(subchannel: int, method: int, count: int, sec_op: int = SEC_OP_INC_METHOD) -> int:
  if method & 3 or not 0 <= method < 0x4000: raise ValueError(f"method offset {method:#x} is not a word offset below 0x4000")
  if not 0 < count < (1 << 13): raise ValueError(f"method count {count} does not fit in 13 bits")
  return (sec_op << 29) | (count << 16) | (subchannel << 13) | (method >> 2)


def decode_header(word: int) -> tuple[int, int, int, int]:
  """(sec_op, subchannel, method offset, count or immediate data)."""
  return word >> 29, (word >> 13) & 7, (word & 0xFFF) << 2, (word >> 16) & 0x1FFF


def gp_entry(address: int, nwords: int) -> tuple[int, int]:
  """The two words of a GPFIFO entry fetching `nwords` pushbuffer words at `address` (main level, no sync)."""
  if address & 3 or not 0 <= address < GP_ENTRY_MAX_ADDRESS:
    raise ValueError(f"pushbuffer address {address:#x} must be 4-byte aligned and below 2**40 (GPFIFO GET_HI is 8 bits)")
  if not 0 < nwords <= GP_ENTRY_MAX_LENGTH: raise ValueError(f"pushbuffer segment of {nwords} words (at most {GP_ENTRY_MAX_LENGTH})")
  return address & 0xFFFFFFFC, ((address >> 32) & 0xFF) | (nwords << 10)


def decode_gp_entry(w0: int, w1: int) -> tuple[int, int]:
  """(address, nwords) of a GPFIFO entry."""
  return (w0 & 0xFFFFFFFC) | ((w1 & 0xFF) << 32), (w1 >> 10) & GP_ENTRY_MAX_LENGTH


class Pushbuffer:
  """Words of methods. A data word may be 32 `Bits` of a symbolic value or a driver's `Fixup` (drivers/encoded.py):
  it stays in its place in `words`, which is how the encoder learns where it goes."""

  def __init__(self):
    self.words: list = []
    self.special: list[int] = []     # the indices of the words that are not ints (for Encoder.packet)

  def method(self, subchannel: int, method: int, *data, sec_op: int = SEC_OP_INC_METHOD) -> "Pushbuffer":
    self.words.append(method_header(subchannel, method, len(data), sec_op))
    base = len(self.words)
    self.special += [base + i for i, w in enumerate(data) if type(w) is not int]
    self.words.extend(data)
    return self

  def inline_to_memory(self, dst_hi, dst_lo, nbytes: int, data: list) -> "Pushbuffer":
    """Write `nbytes` bytes (the words of `data`, little-endian; at most I2M_MAX_WORDS of them) to the address whose
    halves are `dst_hi`/`dst_lo`, through the compute class's I2M methods: LAUNCH_DMA and the data in one ONE_INC
    method (the first word to LAUNCH_DMA, the rest to LOAD_INLINE_DATA), as Mesa's nouveau uploads launch
    descriptors."""
    if not 0 < len(data) <= I2M_MAX_WORDS or (nbytes + 3) // 4 != len(data):
      raise ValueError(f"inline write of {nbytes} bytes in {len(data)} words (1 .. {I2M_MAX_WORDS} words, 4 bytes each)")
    self.method(SUBC_COMPUTE, I2M_LINE_LENGTH_IN, nbytes, 1)
    self.method(SUBC_COMPUTE, I2M_OFFSET_OUT_UPPER, dst_hi, dst_lo)
    # (the data words are not scanned for placeholders one by one: only the first may be one, a driver's fixup of the
    # whole run; a launch's run is ~300 words)
    self.method(SUBC_COMPUTE, I2M_LAUNCH_DMA, I2M_DST_MEMORY_LAYOUT_PITCH | I2M_SYSMEMBAR_DISABLE, data[0],
                sec_op=SEC_OP_ONE_INC)
    self.words[-3] = method_header(SUBC_COMPUTE, I2M_LAUNCH_DMA, 1 + len(data), SEC_OP_ONE_INC)
    self.words.extend(data[1:])
    return self
