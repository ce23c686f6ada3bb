"""The CPU driver: host memory from mmap, kernels as ELF objects loaded by our own loader, and one command
processor (a ring consumed by a worker thread) that both the compute and the copy queue feed."""
from __future__ import annotations
from dataclasses import dataclass
import cffi
from . import cc, elf
from .processor import CommandProcessor, Op, packet, ProcessorFault

_ffi = cffi.FFI()
KERNEL_FLAGS = cc.DEFAULT_FLAGS + ("-fwrapv",)    # integer overflow wraps, as on every GPU and in numpy


@dataclass(eq=False)
class Memory:
  addr: int
  nbytes: int
  mapped: int


class CPUDriver:
  name = "CPU"

  def __init__(self):
    self.processor = CommandProcessor()

  # ---- memory ----
  def alloc(self, nbytes: int) -> Memory:
    mapped = (max(nbytes, 1) + elf.PAGE - 1) // elf.PAGE * elf.PAGE
    return Memory(elf.map_memory(mapped), nbytes, mapped)

  def free(self, mem: Memory):
    elf.unmap_memory(mem.addr, mem.mapped)

  def view(self, addr: int, nbytes: int):
    return _ffi.buffer(_ffi.cast("char *", addr), nbytes)

  # ---- programs ----
  def compile(self, src: str) -> bytes:
    return cc.compile_c(src, KERNEL_FLAGS)

  def load_program(self, binary: bytes, name: str):
    image = elf.load_elf(binary)
    return image.symbol(name), image

  # ---- queues ----
  def encode(self, cmds: list[tuple], var_vals: dict, resolve) -> list[int]:
    words: list[int] = []
    for cmd in cmds:
      kind = cmd[0]
      if kind == "exec": words += packet(Op.EXEC, cmd[1].entry, resolve(cmd[2], var_vals))
      elif kind == "copy": words += packet(Op.COPY, *(resolve(v, var_vals) for v in cmd[1:4]))
      elif kind == "signal": words += packet(Op.SIGNAL, cmd[1].addr, resolve(cmd[2], var_vals))
      elif kind == "wait": words += packet(Op.WAIT, cmd[1].addr, resolve(cmd[2], var_vals))
      elif kind == "timestamp": words += packet(Op.TIMESTAMP, cmd[1].timestamp_addr)
      elif kind == "barrier": words += packet(Op.BARRIER)
      else: raise ValueError(f"CPU queue: unknown command {kind!r}")
    return words

  def submit(self, kind: str, words: list[int]):
    self.processor.write(words)

  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    return self.processor.wait_value(addr, value, timeout)

  def check_faults(self, device_name: str):
    fault = self.processor.fault
    if fault is not None: raise ProcessorFault(f"{device_name}: {fault}")
