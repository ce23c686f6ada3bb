"""Trace markers (settings.QUEUE_MARKERS): after each command a queue writes that command's sequence number into a slot
of host memory (AMD: RELEASE_MEM / SDMA FENCE; NV: a semaphore release), so a stopped or hung queue's report names
the last command done and the first one not done. A driver encodes a `Marker` fixup where the number goes and fills
the numbers in when the commands are placed (submitted or bound)."""
from __future__ import annotations
from .encoded import Fixup

MARKS_KEPT = 4096               # commands of eager submissions remembered per queue, for reports


class Marker(Fixup):
  """A trace marker's value: the queue's sequence number of the command before it, given when the commands are
  placed in the ring or a bound queue (submit/bind); `what` says what the command does, for reports; `args` (a
  launch's kernel-argument address and buffer count) lets a report name the buffers of a launch that did not finish."""
  def __init__(self, what: str, args: tuple | None = None): self.what, self.args = what, args


def launch_args(cmd: tuple) -> tuple | None:
  """(kernel-argument address, buffers) of an exec command with a concrete argument address, else None."""
  if cmd[0] != "exec" or not isinstance(cmd[2], int): return None
  return cmd[2], cmd[1].n_params


def describe(cmd: tuple) -> str:
  """One hcq command in words, for trace-marker reports."""
  op = cmd[0]
  if op == "exec":
    program, _, global_size, local_size = cmd[1:]
    return f"kernel {getattr(program.handle, 'name', None) or program.name} {tuple(global_size)}x{tuple(local_size)}"
  if op == "copy": return f"copy of {cmd[3]} bytes"
  if op in ("signal", "wait"):
    what = "signal" if op == "signal" else "wait for"
    value = cmd[2] if isinstance(cmd[2], int) else "a symbolic value"
    return f"{what} {getattr(cmd[1], 'name', '')!s} {value}".replace("  ", " ")
  return op


class TraceMarkers:
  """The bookkeeping of markers; a driver calls `_init_markers(enabled, slots)` with each queue kind's slot address
  (host memory it can read) and writes the slot's 32-bit value with its queue's own packet."""

  def _init_markers(self, enabled: bool, slots: dict):
    self.markers = enabled
    self._marker_slot = dict(slots)
    self._seq = {k: 0 for k in slots}
    self._marks: dict[str, dict[int, str]] = {k: {} for k in slots}

  def _place_markers(self, kind: str, words: list, fixups, keep: bool = True) -> list:
    """`words` with each marker's sequence number filled in (the queue's next numbers)."""
    words = list(words)
    marks = self._marks[kind]
    for at, fix in fixups:
      if not isinstance(fix, Marker): continue
      self._seq[kind] += 1
      words[at] = self._seq[kind] & 0xFFFFFFFF
      marks[self._seq[kind] & 0xFFFFFFFF] = fix.what if fix.args is None else (fix.what, fix.args)
    while keep and len(marks) > MARKS_KEPT: del marks[next(iter(marks))]
    return words

  def marker_report(self, kind: str) -> str:
    """'command #n (what) done, #n+1 (what) not' from the queue's marker slot (empty without markers)."""
    if not self.markers: return ""
    done = int.from_bytes(bytes(self.view(self._marker_slot[kind], 4)), "little")
    marks = self._marks[kind]
    def name(n: int, buffers: bool = False) -> str:
      if n not in marks: return f"#{n}"
      mark = marks[n]
      if isinstance(mark, str): return f"#{n} ({mark})"
      what, (args, count) = mark
      return f"#{n} ({what}{'; ' + self._launch_buffers(args, count) if buffers and count else ''})"
    if done == self._seq[kind] & 0xFFFFFFFF: return f"; every command done (last {name(done)})"
    return (f"; last command done {name(done) if done else 'none'}, first not done "
            f"{name((done + 1) & 0xFFFFFFFF, buffers=True)}")

  def _launch_buffers(self, args: int, count: int) -> str:
    """The buffers a launch was given, each by the allocation it lies in (its kernel arguments read now)."""
    data = self._readable(args, 8 * count)
    if data is None: return f"{count} buffers (their addresses not readable here)"
    addrs = [int.from_bytes(data[8 * i:8 * i + 8], "little") for i in range(count)]
    return "buffers " + ", ".join(f"{i}: {a:#x} {self.describe_address(a)}" for i, a in enumerate(addrs))
