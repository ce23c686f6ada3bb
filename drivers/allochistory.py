"""Which allocation a fault address falls in: the live allocations, else a bounded history of frees (a use after
free, and how long ago), else "never mapped" as far as the history reaches. Shared by the GPU drivers' fault reports."""
from __future__ import annotations
import collections, time

KEPT = 4096                     # allocations and frees remembered


class AllocationHistory:
  def __init__(self, kept: int = KEPT):
    self.kept = kept
    self.events: collections.deque = collections.deque(maxlen=kept)    # (time, "alloc" | "free", base, size, what)

  def alloc(self, base: int, size: int, what: str): self.events.append((time.monotonic(), "alloc", base, size, what))
  def free(self, base: int, size: int, what: str): self.events.append((time.monotonic(), "free", base, size, what))

  def describe(self, addr: int, live) -> str:
    """`live`: (base, mapped bytes, bytes asked for, what) of each live allocation."""
    for base, size, nbytes, what in live:
      if base <= addr < base + size:
        past = " (past the bytes asked for)" if addr >= base + nbytes else ""
        return f"in a live {what} allocation of {nbytes} bytes at {base:#x}, offset {addr - base:#x}{past}"
    now = time.monotonic()
    for t, event, base, size, what in reversed(self.events):
      if event == "free" and base <= addr < base + size:
        return (f"in a {what} allocation of {size} bytes at {base:#x} (offset {addr - base:#x}) freed "
                f"{now - t:.3f} s ago: a use after free")
    return f"in no allocation of this driver (never mapped, as far as the last {self.kept} allocations and frees go)"
