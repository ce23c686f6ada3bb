"""A TLSF-style allocator over an abstract address range: two-level segregated free lists (a power-of-two
class, then linear subclasses) give O(1) good-fit allocation; freed blocks merge with free neighbours."""
from __future__ import annotations

SUBCLASS_BITS = 4


def _classes(size: int) -> tuple[int, int]:
  fl = max(size.bit_length() - 1, 0)
  if fl < SUBCLASS_BITS: return 0, size
  return fl - SUBCLASS_BITS + 1, (size >> (fl - SUBCLASS_BITS)) & ((1 << SUBCLASS_BITS) - 1)


class TLSF:
  def __init__(self, size: int, alignment: int = 64):
    self.size, self.alignment = size, alignment
    self.free_lists: dict[tuple[int, int], set[int]] = {}
    self.blocks: dict[int, tuple[int, bool]] = {}     # start -> (size, is_free)
    self.high_water = 0
    self._insert(0, size)

  def _insert(self, start: int, size: int):
    self.blocks[start] = (size, True)
    self.free_lists.setdefault(_classes(size), set()).add(start)

  def _remove(self, start: int):
    size, _ = self.blocks.pop(start)
    self.free_lists[_classes(size)].discard(start)

  def alloc(self, size: int) -> int:
    size = max(self.alignment, (size + self.alignment - 1) // self.alignment * self.alignment)
    want = _classes(size)
    # the smallest class that can hold it, then the best fitting block in it (lowest address on ties)
    best = None
    for cls in sorted(c for c, blocks in self.free_lists.items() if blocks and c >= (want[0], 0)):
      fits = [b for b in self.free_lists[cls] if self.blocks[b][0] >= size]
      if fits:
        best = min(fits, key=lambda b: (self.blocks[b][0], b))
        break
    if best is None: raise MemoryError(f"TLSF: no free block of {size} bytes in an arena of {self.size}")
    block_size = self.blocks[best][0]
    self._remove(best)
    self.blocks[best] = (size, False)
    if block_size > size: self._insert(best + size, block_size - size)
    self.high_water = max(self.high_water, best + size)
    return best

  def free(self, start: int):
    size, is_free = self.blocks.get(start, (0, True))
    if is_free: raise ValueError(f"TLSF: double free or bad address {start}")
    del self.blocks[start]
    end = start + size
    if end in self.blocks and self.blocks[end][1]:     # merge with the next block
      size += self.blocks[end][0]; self._remove(end)
    for prev, (psize, pfree) in list(self.blocks.items()):   # and with the previous one
      if pfree and prev + psize == start:
        self._remove(prev); start, size = prev, size + psize
        break
    self._insert(start, size)


def plan_arena(lifetimes: list[tuple[int, int, int]], alignment: int = 64) -> tuple[list[int], int]:
  """lifetimes: (first step, last step, nbytes) per buffer. Returns (offset per buffer, arena size).
  A buffer's memory is reusable from the step after its last use."""
  total = sum(max(n, alignment) + alignment for _, _, n in lifetimes)
  tlsf = TLSF(max(total, alignment), alignment)
  offsets = [0] * len(lifetimes)
  order = sorted(range(len(lifetimes)), key=lambda i: (lifetimes[i][0], -lifetimes[i][2]))
  live: list[int] = []
  for i in order:
    first = lifetimes[i][0]
    for j in [j for j in live if lifetimes[j][1] < first]:
      tlsf.free(offsets[j]); live.remove(j)
    offsets[i] = tlsf.alloc(lifetimes[i][2])
    live.append(i)
  return offsets, tlsf.high_water
