"""The words a queue hands its engine, decoded by the same tables the drivers encode with: PM4 and SDMA packets
(amd/pm4.py, amd/sdma.py), GPFIFO entries, pushbuffer methods and QMDs (nv/pushbuf.py, nv/qmd.py), the CPU command
processor's packets (cpu/processor.py) and the Metal queue's command words (metal/commands.py). A table that is wrong
decodes wrong here too, which is what tests/drivers/test_decode.py checks against words written from the vendors'
documents.

Used by `Device.dump_queues()` (a live ring, from the engine's read pointer to the write pointer) and by
`baregrad decode run.bgq` (the words a capture recorded). `read(address, nbytes)` gives the bytes at a device address,
or None where there are none to show: decoding follows indirect buffers, GPFIFO entries and QMD addresses through it.

    lines = decode("pm4", words, address=ring_base, read=driver_read)
"""
from __future__ import annotations
import struct
from typing import Callable

from .amd import pm4, sdma
from .nv import pushbuf as pb, qmd
from .cpu import processor
from .metal import commands as metal_commands

Read = Callable[[int, int], "bytes | None"]
FORMATS = ("pm4", "sdma", "gpfifo", "pushbuf", "qmd", "cpu", "metal")
WORD_BYTES = {"pm4": 4, "sdma": 4, "gpfifo": 4, "pushbuf": 4, "qmd": 4, "cpu": 8, "metal": 8}
MAX_FOLLOW = 8192          # words read through one indirect reference at most (a report stays readable)


def decode(fmt: str, words, address: int | None = None, read: Read | None = None, indent: str = "") -> list[str]:
  """Lines decoding `words` of format `fmt` (one of FORMATS). `address`: where words[0] lies, for the offsets shown."""
  if fmt not in FORMATS: raise ValueError(f"no decoder for {fmt!r} (the formats are {', '.join(FORMATS)})")
  words = [int(w) for w in words]
  return _DECODERS[fmt](words, address, read, indent)


def words_of(fmt: str, data: bytes) -> list[int]:
  """The words of `data` in format `fmt` (little-endian, 4 or 8 bytes each)."""
  size = WORD_BYTES[fmt]
  n = len(data) // size
  return list(struct.unpack_from(f"<{n}{'I' if size == 4 else 'Q'}", data))


def pack_words(fmt: str, words: list[int]) -> bytes:
  """`words` of format `fmt` as little-endian bytes (what `words_of` reads back)."""
  return struct.pack(f"<{len(words)}{'I' if WORD_BYTES[fmt] == 4 else 'Q'}", *words)


def _at(address: int | None, pos: int, size: int) -> str:
  return f"{address + pos * size:#014x}" if address is not None else f"+{pos * size:#07x}"


def _follow(read: Read | None, fmt: str, addr: int, nwords: int, indent: str) -> list[str]:
  """The words at `addr`, decoded one level deeper (or a line saying they cannot be read)."""
  if read is None: return []
  shown = min(nwords, MAX_FOLLOW)
  data = read(addr, shown * WORD_BYTES[fmt])
  if data is None: return [f"{indent}  | (memory at {addr:#x} not readable here)"]
  lines = decode(fmt, words_of(fmt, data), addr, read, indent + "  | ")
  if shown < nwords: lines.append(f"{indent}  | ... {nwords - shown} more words")
  return lines


def _packets(words, address, read, indent, size, decode_one, describe, follow) -> list[str]:
  lines, pos, nops = [], 0, 0
  while pos < len(words):
    try: name, fields, n = decode_one(words, pos)
    except ValueError as e:
      lines.append(f"{indent}{_at(address, pos, size)}  undecodable: {e}; {len(words) - pos} words left")
      break
    if name == "NOP":        # padding: one line per run of NOPs
      nops += n; pos += n
      if pos >= len(words) or decode_safe(decode_one, words, pos) != "NOP":
        lines.append(f"{indent}{_at(address, pos - nops, size)}  NOP ({nops} dwords)"); nops = 0
      continue
    lines.append(f"{indent}{_at(address, pos, size)}  {describe(name, fields)}")
    lines += follow(name, fields, indent)
    pos += n
  return lines


def decode_safe(decode_one, words, pos) -> str | None:
  try: return decode_one(words, pos)[0]
  except ValueError: return None


def _pm4(words, address, read, indent) -> list[str]:
  def follow(name, fields, indent):
    if name != "INDIRECT_BUFFER": return []
    return _follow(read, "pm4", fields["ib_base_hi"] << 32 | fields["ib_base_lo"], fields["ib_size"], indent)
  return _packets(words, address, read, indent, 4, pm4.decode, pm4.describe, follow)


def _sdma(words, address, read, indent) -> list[str]:
  def follow(name, fields, indent):
    if name != "INDIRECT": return []
    return _follow(read, "sdma", fields["ib_base_hi"] << 32 | fields["ib_base_lo"], fields["ib_size"], indent)
  return _packets(words, address, read, indent, 4, sdma.decode, sdma.describe, follow)


def _gpfifo(words, address, read, indent) -> list[str]:
  lines = []
  for k in range(0, len(words) - 1, 2):
    addr, n = pb.decode_gp_entry(words[k], words[k + 1])
    lines.append(f"{indent}{_at(address, k, 4)}  GP entry {k // 2}: {n} pushbuffer words at {addr:#x}")
    lines += _follow(read, "pushbuf", addr, n, indent)
  return lines


def _names(module, names: list[str]) -> dict[int, str]:
  return {getattr(module, n): n for n in names}


# method offset -> name, from the constants the driver encodes with (nv/pushbuf.py)
HOST_METHODS = _names(pb, ["SET_OBJECT", "NON_STALL_INTERRUPT", "SEM_ADDR_LO", "SEM_ADDR_HI", "SEM_PAYLOAD_LO",
                           "SEM_PAYLOAD_HI", "SEM_EXECUTE", "WFI"])
CLASS_METHODS = {
  pb.SUBC_COMPUTE: ("compute", _names(pb, [
    "SET_SHADER_SHARED_MEMORY_WINDOW_A", "SET_SHADER_SHARED_MEMORY_WINDOW_B", "SEND_PCAS_A", "SEND_SIGNALING_PCAS2_B",
    "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A", "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B",
    "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C", "SET_SHADER_LOCAL_MEMORY_A", "SET_SHADER_LOCAL_MEMORY_B",
    "SET_SHADER_LOCAL_MEMORY_WINDOW_A", "SET_SHADER_LOCAL_MEMORY_WINDOW_B", "INVALIDATE_SHADER_CACHES_NO_WFI",
    "SET_I2M_SPARE_NOOP00", "I2M_LINE_LENGTH_IN", "I2M_LINE_COUNT", "I2M_OFFSET_OUT_UPPER", "I2M_OFFSET_OUT",
    "I2M_LAUNCH_DMA", "I2M_LOAD_INLINE_DATA"])),
  pb.SUBC_COPY: ("copy", _names(pb, ["LAUNCH_DMA", "OFFSET_IN_UPPER", "OFFSET_IN_LOWER", "OFFSET_OUT_UPPER",
                                     "OFFSET_OUT_LOWER", "LINE_LENGTH_IN", "LINE_COUNT"])),
}
SEC_OPS = {pb.SEC_OP_INC_METHOD: "INC", pb.SEC_OP_NON_INC_METHOD: "NON_INC", pb.SEC_OP_IMMD_DATA_METHOD: "IMMD",
           pb.SEC_OP_ONE_INC: "ONE_INC"}
SEM_OPERATIONS = {pb.SEM_OPERATION_ACQUIRE: "ACQUIRE", pb.SEM_OPERATION_RELEASE: "RELEASE",
                  pb.SEM_OPERATION_ACQ_STRICT_GEQ: "ACQ_STRICT_GEQ"}


def method_name(subchannel: int, method: int) -> str:
  if method < pb.HOST_METHODS_END: return HOST_METHODS.get(method, f"host method {method:#x}")
  cls, names = CLASS_METHODS.get(subchannel, (f"subchannel {subchannel}", {}))
  return f"{cls}.{names[method]}" if method in names else f"{cls} method {method:#x}"


def _value_text(subchannel: int, method: int, value: int) -> str:
  if method == pb.SEM_EXECUTE:
    flags = [SEM_OPERATIONS.get(value & 7, f"operation {value & 7}")]
    flags += [n for bit, n in ((pb.SEM_RELEASE_WFI, "RELEASE_WFI"), (pb.SEM_PAYLOAD_SIZE_64BIT, "PAYLOAD_64BIT"),
                               (pb.SEM_RELEASE_TIMESTAMP, "TIMESTAMP")) if value & bit]
    return f"{value:#x} ({' | '.join(flags)})"
  if subchannel == pb.SUBC_COMPUTE and method == pb.SEND_PCAS_A: return f"{value:#x} (QMD at {value << 8:#x})"
  return f"{value:#x}"


def _pushbuf(words, address, read, indent) -> list[str]:
  lines, i = [], 0
  regs, inline = {}, {}      # compute method values so far; inline writes (I2M) seen: destination -> bytes
  while i < len(words):
    sec_op, subc, method, count = pb.decode_header(words[i])
    head = f"{indent}{_at(address, i, 4)}  "
    if sec_op == pb.SEC_OP_IMMD_DATA_METHOD:
      lines.append(f"{head}{method_name(subc, method)} = {count:#x} (immediate)"); i += 1; continue
    if sec_op not in SEC_OPS or count == 0:
      lines.append(f"{head}word {words[i]:#010x}: not a method header the decoder knows (SEC_OP {sec_op})"); i += 1
      continue
    data = words[i + 1:i + 1 + count]
    if len(data) < count: lines.append(f"{head}method header for {count} words, {len(data)} left (cut off)")
    for k, value in enumerate(data):
      m = method + 4 * k if sec_op == pb.SEC_OP_INC_METHOD or (sec_op == pb.SEC_OP_ONE_INC and k == 0) else \
        method + (4 if sec_op == pb.SEC_OP_ONE_INC else 0)
      pad = head if k == 0 else indent + ' ' * (len(head) - len(indent))
      if subc == pb.SUBC_COMPUTE: regs[m] = int(value)
      if subc == pb.SUBC_COMPUTE and m == pb.I2M_LOAD_INLINE_DATA and sec_op != pb.SEC_OP_INC_METHOD:
        # the data of an inline write: one line, not a line per word
        dst = (regs.get(pb.I2M_OFFSET_OUT_UPPER, 0) & 0x1FFFFFF) << 32 | regs.get(pb.I2M_OFFSET_OUT, 0)
        n = regs.get(pb.I2M_LINE_LENGTH_IN, 0)
        inline[dst] = struct.pack(f"<{len(data) - k}I", *(int(w) for w in data[k:]))[:n]
        lines.append(f"{pad}{method_name(subc, m)} x {len(data) - k}: {n} bytes to {dst:#x}")
        break
      lines.append(f"{pad}{method_name(subc, m)} = {_value_text(subc, m, value)}")
      if subc == pb.SUBC_COMPUTE and m == pb.SEND_PCAS_A and (read is not None or (value << 8) in inline):
        data_qmd = inline[value << 8][:qmd.QMD_BYTES] if (value << 8) in inline else read(value << 8, qmd.QMD_BYTES)
        lines += ([f"{indent}  | (QMD at {value << 8:#x} not readable here)"] if data_qmd is None else
                  decode("qmd", words_of("qmd", data_qmd), value << 8, None, indent + "  | "))
    i += 1 + count
  return lines


def qmd_fields(data: bytes) -> dict:
  """A QMD's launch fields (nv/qmd.py read_launch), its version from its own QMD_MAJOR_VERSION bits."""
  major = (int.from_bytes(bytes(data[:qmd.QMD_BYTES]), "little") >> qmd.V04_00["QMD_MAJOR_VERSION"][1]) & 0xF
  version = (major, 0)
  if version not in qmd.TABLES: raise ValueError(f"QMD major version {major} (baregrad reads 3 and 4)")
  return qmd.read_launch(version, data)


def _qmd(words, address, read, indent) -> list[str]:
  data = b"".join(w.to_bytes(4, "little") for w in words)
  try: f = qmd_fields(data)
  except ValueError as e: return [f"{indent}QMD: {e}"]
  banks = ", ".join(f"{i}: {a:#x} ({n} bytes)" for i, (a, n) in sorted(f["cbufs"].items()))
  return [f"{indent}QMD V{f['version'][0]:02d}_{f['version'][1]:02d}: program {f['program']:#x}, grid {f['grid']}, "
          f"block {f['block']}, {f['registers']} registers, {f['shared']} bytes shared, constant banks {banks or 'none'}"]


def _cpu(words, address, read, indent) -> list[str]:
  lines, i = [], 0
  while i < len(words):
    hdr = words[i]
    op, n = hdr & 0xFFFF, hdr >> 16
    head = f"{indent}{_at(address, i, 8)}  "
    try: name, operands = processor.Op(op).name, processor.PACKETS[processor.Op(op)]
    except ValueError:
      lines.append(f"{head}word {hdr:#x}: unknown opcode {op}"); break
    if n < 1 or i + n > len(words):
      lines.append(f"{head}{name} of {n} words: {'cut off' if n else 'size 0'}"); break
    if name == "NOP":
      lines.append(f"{head}NOP ({n} words)"); i += n; continue
    values = words[i + 1:i + n]
    lines.append(f"{head}{name} " + " ".join(f"{k}={v:#x}" for k, v in zip(operands, values)))
    if name == "INDIRECT" and len(values) >= 2: lines += _follow(read, "cpu", values[0], values[1], indent)
    i += n
  return lines


def _metal(words, address, read, indent) -> list[str]:
  try: cmds = metal_commands.decode(words)
  except ValueError as e: return [f"{indent}{e}"]
  return [f"{indent}#{k} {name} " + " ".join(f"{n}={v:#x}" for n, v in ops.items()) for k, (name, ops) in enumerate(cmds)]


_DECODERS = {"pm4": _pm4, "sdma": _sdma, "gpfifo": _gpfifo, "pushbuf": _pushbuf, "qmd": _qmd, "cpu": _cpu,
             "metal": _metal}


def referenced_memory(fmt: str, words, read: Read) -> dict[int, bytes]:
  """{address: bytes} of the memory `words` reference (indirect buffers, pushbuffer segments, QMDs), read now through
  `read` exactly as `decode` follows them: what a capture keeps so that its words decode later without the device."""
  seen: dict[int, bytes] = {}
  def keep(addr: int, n: int):
    data = read(addr, n)
    if data is not None: seen[addr] = data
    return data
  decode(fmt, words, None, keep)
  return seen


def read_from(memory: dict[int, bytes]) -> Read:
  """A `read` over {address: bytes} snapshots (None outside them)."""
  def read(addr: int, n: int):
    for base, data in memory.items():
      if base <= addr and addr + n <= base + len(data): return data[addr - base:addr - base + n]
    return None
  return read


class WordLog:
  """What a driver hands its engines while a capture records them (`Driver.word_log`): (queue kind, format, words,
  referenced memory) per submission, appended by the driver's submit paths and taken by the recorder."""

  def __init__(self): self.entries: list[tuple[str, str, list[int], dict[int, bytes]]] = []

  def add(self, kind: str, fmt: str, words, read: Read | None):
    words = [int(w) for w in words]
    self.entries.append((kind, fmt, words, referenced_memory(fmt, words, read) if read is not None else {}))

  def take(self) -> list:
    out, self.entries = self.entries, []
    return out
