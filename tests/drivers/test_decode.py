"""The queue decoder (drivers/decode.py) against words written here by hand from the vendors' documents, not by the
encoders; `Device.dump_queues()` of a queue stopped on a wait on every device; the hang report a timed-out wait
carries (and writes with HANG_REPORT)."""
import re, time
import numpy as np
import pytest
from baregrad.drivers.decode import decode
from baregrad.drivers import settings
from baregrad.hcq.device import Device
from baregrad.hcq.signal import Signal
from baregrad.tensor import Tensor


def pm4_header(opcode: int, count: int) -> int:
  # PM4 type-3 header (AMD "Radeon GCN/RDNA PM4 packets"; Linux amdgpu soc15d.h PACKET3 / PACKET3_COMPUTE):
  # TYPE 31:30 = 3, COUNT 29:16 = body dwords - 1, IT_OPCODE 15:8, SHADER_TYPE bit 1 (compute)
  return 3 << 30 | count << 16 | opcode << 8 | 1 << 1


def test_pm4_packets():
  words = [pm4_header(0x15, 3), 64, 2, 1, 0x1,                                 # DISPATCH_DIRECT (IT 0x15)
           pm4_header(0x3C, 5), 0x3 | 1 << 4, 0x1000, 0x7F, 5, 0xFFFFFFFF, 4,    # WAIT_REG_MEM (IT 0x3C), memory, ==
           pm4_header(0x10, 2), 0, 0, 0,                                        # NOP (IT 0x10), 4 dwords
           pm4_header(0x3F, 2), 0x2000, 0x7F, 8 | 1 << 23]                      # INDIRECT_BUFFER (IT 0x3F) of 8 dwords
  ib = [pm4_header(0x10, 6)] + [0] * 7                                     # one NOP of 8 dwords
  reads = []
  def read(addr, n):
    reads.append((addr, n))
    return b"".join(w.to_bytes(4, "little") for w in ib)[:n]
  lines = decode("pm4", words, 0x7F00001000, read)
  text = "\n".join(lines)
  assert re.search(r"0x007f00001000  DISPATCH_DIRECT dim_x=0x40 dim_y=0x2 dim_z=0x1", text), text
  assert re.search(r"0x007f00001014  WAIT_REG_MEM \[0x7f00001000\] & 0xffffffff == 0x5", text), text
  assert re.search(r"0x007f00001030  NOP \(4 dwords\)", text), text
  assert re.search(r"0x007f00001040  INDIRECT_BUFFER ib_base_lo=0x2000 ib_base_hi=0x7f ib_size=0x8 valid=0x1", text), text
  assert reads == [(0x7F00002000, 32)]
  assert re.search(r"  \| 0x007f00002000  NOP \(8 dwords\)", text), text
  # RELEASE_MEM (IT 0x49, 7 body dwords on gfx11: Linux gfx_v11_0_ring_emit_fence) of a bottom-of-pipe event (0x28,
  # index 5), DATA_SEL 29:31 = 1 (32 bits), INT_SEL 24:26 = 2; EVENT_WRITE (IT 0x46) of a CS partial flush (7, index 4)
  words = [pm4_header(0x49, 6), 0x28 | 5 << 8, 1 << 29 | 2 << 24, 0x4000, 0x7F, 7, 0, 3,
           pm4_header(0x46, 0), 7 | 4 << 8]
  text = "\n".join(decode("pm4", words))
  assert re.search(r"\+0x00000  RELEASE_MEM event_type=0x28 event_index=0x5 int_sel=0x2 data_sel=0x1 addr_lo=0x4000 "
                   r"addr_hi=0x7f data_lo=0x7 int_ctxid=0x3\n\+0x00020  EVENT_WRITE event_type=0x7 event_index=0x4$", text), text
  # a header that is not type 3 stops the decode with the reason
  assert "not a PM4 type-3 header" in decode("pm4", [0x12345678])[0]


def sdma_header(op: int, sub_op: int = 0, extra: int = 0) -> int:
  # SDMA v6 header (Linux sdma_v6_0_0_pkt_open.h): OP 7:0, SUB_OP 15:8
  return op | sub_op << 8 | extra


def test_sdma_packets():
  words = [sdma_header(1, 0), 4095, 0, 0x1000, 0x7F, 0x3000, 0x7F,       # COPY_LINEAR (SDMA_OP_COPY 1, SUBOP 0), 4 KiB
           sdma_header(5), 0x5000, 0x7F, 9,                               # FENCE (SDMA_OP_FENCE 5)
           sdma_header(8, 0, 3 << 28 | 1 << 31), 0x6000, 0x7F, 7, 0xFFFFFFFF, 10,   # POLL_REGMEM (8), memory, ==
           sdma_header(6), 1]                                             # TRAP (SDMA_OP_TRAP 6)
  text = "\n".join(decode("sdma", words))
  assert re.search(r"\+0x00000  COPY_LINEAR count=0xfff src_addr_lo=0x1000 src_addr_hi=0x7f dst_addr_lo=0x3000 "
                   r"dst_addr_hi=0x7f", text), text
  assert re.search(r"\+0x0001c  FENCE addr_lo=0x5000 addr_hi=0x7f data=0x9", text), text
  assert re.search(r"\+0x0002c  POLL_REGMEM \[0x7f00006000\] & 0xffffffff == 0x7", text), text
  assert re.search(r"\+0x00044  TRAP int_context=0x1", text), text
  # TIMESTAMP (SDMA_OP_TIMESTAMP 13, SUBOP GET_GLOBAL 2) and a 3-dword NOP (COUNT 29:16 = 2)
  text = "\n".join(decode("sdma", [sdma_header(13, 2), 0x8000, 0x7F, sdma_header(0, 0, 2 << 16), 0, 0]))
  assert text == "+0x00000  TIMESTAMP addr_lo=0x8000 addr_hi=0x7f\n+0x0000c  NOP (3 dwords)", text
  assert "unknown SDMA packet" in decode("sdma", [sdma_header(0x77)])[0]


def test_gpfifo_pushbuffer_and_qmd():
  # GPFIFO entry (clc86f.h NVC86F_GP_ENTRY0 GET 31:2, ENTRY1 GET_HI 7:0, LENGTH 30:10): 11 words at 0x12_3456_7800
  entry = [0x34567800, 0x12 | 11 << 10]
  # method headers (clc56f.h NVC56F_DMA_*): SEC_OP 31:29 (1 INC, 4 IMMD), COUNT 28:16, SUBCHANNEL 15:13, ADDRESS 11:0
  push = [4 << 29 | 1 << 16 | 0x78 >> 2,                                     # WFI = 1 (immediate, NVC56F_WFI 0x78)
          1 << 29 | 5 << 16 | 0x5C >> 2, 0x9000, 0x20, 3, 0, 0x01100001,     # SEM_ADDR_LO.. SEM_EXECUTE (0x5C..0x6C)
          1 << 29 | 1 << 16 | 1 << 13 | 0x2B4 >> 2, 0x40000700,              # compute SEND_PCAS_A (NVCBC0 0x2B4)
          1 << 29 | 1 << 16 | 4 << 13 | 0x300 >> 2]                          # copy LAUNCH_DMA (NVC8B5 0x300), cut off
  # QMD V04_00 (clcbc0qmd.h): QMD_MAJOR_VERSION MW(583:580), GRID_WIDTH MW(1055:1024), CTA_THREAD_DIMENSION0
  # MW(1167:1152), REGISTER_COUNT MW(1208:1200), PROGRAM_ADDRESS_LOWER MW(1247:1216), UPPER MW(1272:1248)
  qmd = [0] * 96
  qmd[580 // 32] |= 4 << (580 % 32)
  qmd[1024 // 32] = 48
  qmd[1152 // 32] |= 128
  qmd[1200 // 32] |= 24 << (1200 % 32)
  qmd[1216 // 32], qmd[1248 // 32] = 0x30000, 0x40
  memory = {0x1234567800: push, 0x4000070000: qmd}
  def read(addr, n):
    for base, ws in memory.items():
      if base <= addr < base + 4 * len(ws): return b"".join(w.to_bytes(4, "little") for w in ws)[addr - base:addr - base + n]
    return None
  text = "\n".join(decode("gpfifo", entry, 0x2000022010, read))
  assert "0x002000022010  GP entry 0: 11 pushbuffer words at 0x1234567800" in text, text
  assert re.search(r"\| 0x001234567800  WFI = 0x1 \(immediate\)", text), text
  assert re.search(r"SEM_ADDR_LO = 0x9000\n.*SEM_ADDR_HI = 0x20\n.*SEM_PAYLOAD_LO = 0x3\n.*SEM_PAYLOAD_HI = 0x0\n"
                   r".*SEM_EXECUTE = 0x1100001 \(RELEASE \| RELEASE_WFI \| PAYLOAD_64BIT\)", text), text
  assert "compute.SEND_PCAS_A = 0x40000700 (QMD at 0x4000070000)" in text, text
  assert re.search(r"\|   \| QMD V04_00: program 0x4000030000, grid \(48, 0, 0\), block \(128, 0, 0\), 24 registers", text), text
  assert "method header for 1 words, 0 left (cut off)" in text, text


def test_cpu_and_metal_words():
  # CPU command processor packets (drivers/cpu/worker.c): header = opcode | nwords << 16; EXEC 1, SIGNAL 3, INDIRECT 7
  ib = [3 | 3 << 16, 0x5000, 7]
  words = [1 | 3 << 16, 0x1000, 0x2000, 7 | 3 << 16, 0x9000, 3, 0 | 2 << 16, 0]
  text = "\n".join(decode("cpu", words, None, lambda a, n: b"".join(w.to_bytes(8, "little") for w in ib)[:n] if a == 0x9000 else None))
  assert re.search(r"\+0x00000  EXEC fn=0x1000 args=0x2000\n\+0x00018  INDIRECT addr=0x9000 nwords=0x3\n"
                   r"  \| 0x000000009000  SIGNAL addr=0x5000 value=0x7\n\+0x00030  NOP \(2 words\)", text), text
  assert "unknown opcode 99" in decode("cpu", [99 | 1 << 16])[0]
  # the Metal queue's command words (drivers/metal/commands.py: opcode word, then the operands): copy 2, signal 3
  text = "\n".join(decode("metal", [2, 0x100, 0x200, 64, 3, 0x300, 5]))
  assert text == "#0 copy dst=0x100 src=0x200 nbytes=0x40\n#1 signal addr=0x300 value=0x5", text


DUMP_WAIT = {"CPU": r"WAIT addr={gate:#x} value=0x5", "AMD": r"WAIT_REG_MEM64 \[{gate:#x}\] & 0xffffffffffffffff >= 0x5",
             "NV": r"SEM_ADDR_LO = {lo:#x}\n.*SEM_ADDR_HI = {hi:#x}\n.*SEM_PAYLOAD_LO = 0x5\n.*\n.*ACQ_STRICT_GEQ",
             "METAL": r"wait addr={gate:#x} value=0x5"}


@pytest.mark.parametrize("name", ["CPU", "AMD", "NV", "METAL"])
def test_dump_queues_shows_the_waiting_command_and_the_hang_report_carries_it(name, tmp_path, emulated_gpus):
  dev = Device.get(name)
  dev.synchronize()
  gate = Signal(dev, "gate")
  dev.compute_queue().wait(gate, 5).signal(dev.timeline, dev.next_timeline()).submit(dev)
  dump = dev.dump_queues()
  want = DUMP_WAIT[name].format(gate=gate.addr, lo=gate.addr & 0xFFFFFFFF, hi=gate.addr >> 32)
  assert dump.startswith(f"{name} queues:\n") and re.search(want, dump), dump
  report = tmp_path / "hang.txt"
  with settings.override(HANG_REPORT=str(report)):
    with pytest.raises(TimeoutError) as e: dev.synchronize(timeout=0.3)
  assert re.search(want, e.value.queues), e.value.queues
  assert any("decoded from their read pointers" in n and re.search(want, n) for n in e.value.__notes__), e.value.__notes__
  written = report.read_text()
  assert f"{type(e.value).__name__}: {e.value}" in written and re.search(want, written), written
  gate.value = 5
  dev.synchronize(timeout=10)
  deadline = time.monotonic() + 5     # (Metal: the completion thread sees a finished command buffer soon after its signal)
  while re.search(want, dev.dump_queues()) and time.monotonic() < deadline: time.sleep(0.01)
  assert not re.search(want, dev.dump_queues()), dev.dump_queues()
  np.testing.assert_array_equal((Tensor([1.0, 2.0], device=name) + 1).numpy(), [2.0, 3.0])


def test_hang_report_that_cannot_be_written_keeps_the_error(tmp_path):
  """HANG_REPORT naming a directory (or any path that cannot be opened for appending): the timeout is still raised with
  its queue dump, and a note says the report was not written and why."""
  dev = Device.get("CPU")
  dev.synchronize()
  gate = Signal(dev, "gate")
  dev.compute_queue().wait(gate, 1).signal(dev.timeline, dev.next_timeline()).submit(dev)
  try:
    with settings.override(HANG_REPORT=str(tmp_path)):
      with pytest.raises(TimeoutError) as e: dev.synchronize(timeout=0.2)
    assert re.search(r"WAIT addr=0x[0-9a-f]+ value=0x1", e.value.queues), e.value.queues
    assert any(n.startswith(f"(HANG_REPORT: cannot write {tmp_path}: ") for n in e.value.__notes__), e.value.__notes__
  finally:
    gate.value = 1
    dev.synchronize(timeout=10)
