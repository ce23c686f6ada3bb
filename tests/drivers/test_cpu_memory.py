"""CPU device memory (drivers/cpu/elf.py map_memory): a mapping of HUGE_FROM bytes or more starts on a 2 MiB boundary
and is advised MADV_HUGEPAGE -- read back from the kernel's own account of the process's mappings (/proc/self/smaps;
the kernel may merge it with a neighbouring mapping of the same kind, so the test asks only that one holds it)."""
import ctypes
import pytest
from baregrad.drivers.cpu import elf


def _smaps_entry(addr: int) -> tuple[int, int, str]:
  """(start, end, VmFlags) of the mapping holding `addr`, from /proc/self/smaps."""
  found = None
  with open("/proc/self/smaps") as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and not head.endswith(":"):
        lo, hi = (int(x, 16) for x in head.split("-"))
        found = (lo, hi) if lo <= addr < hi else None
      elif found and line.startswith("VmFlags:"):
        return found[0], found[1], line.split(":", 1)[1]
  raise AssertionError(f"{addr:#x} is in no mapping")


@pytest.mark.parametrize("size", [elf.HUGE_FROM, elf.HUGE_FROM + 3 * elf.PAGE, 3 * elf.HUGE_FROM])
def test_large_mappings_are_huge_page_aligned_exact_and_advised(size):
  addr = elf.map_memory(size)
  try:
    assert addr % elf.HUGE == 0
    lo, hi, flags = _smaps_entry(addr)
    assert lo <= addr and addr + size <= hi
    assert "hg" in flags.split(), flags                                   # MADV_HUGEPAGE
    ctypes.memset(addr, 1, 1); ctypes.memset(addr + size - 1, 2, 1)       # all of it is usable
    assert ctypes.string_at(addr, 1) == b"\x01" and ctypes.string_at(addr + size - 1, 1) == b"\x02"
  finally:
    elf.unmap_memory(addr, size)


def test_small_mappings_are_left_as_they_are():
  size = elf.HUGE_FROM - elf.PAGE
  addr = elf.map_memory(size)
  try:
    lo, hi, flags = _smaps_entry(addr)
    assert "hg" not in flags.split() and hi - lo >= size
  finally:
    elf.unmap_memory(addr, size)
