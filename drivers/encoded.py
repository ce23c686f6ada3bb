"""What a driver's queue encoder returns (`encode` of the Driver protocol, hcq/driver.py): the words of the
commands, and where in them each symbolic value goes.

A command from hcq may carry a symbolic value (hcq's `Slot`: an object with `resolve(var_vals) -> int` that takes
`+ int`): a JIT graph's input address, a timeline value. A driver hands the packet encoders (pm4.py, sdma.py,
pushbuf.py) `Bits` of such a value wherever a field fills a whole word; `Encoder` writes 0 there and lists the
word's index beside the Bits (`stream` does the same for the CPU's packets, whose operands are whole 64-bit
words). So where a value lands is decided once, by the packet tables that place every field, and is never written
down a second time. hcq fills those words in at submit time (`Encoded.resolved`, or `submit_bound` for commands
already in device memory).

`Fixup` placeholders mark words only the driver can fill, once it has placed the commands in memory (bind/submit):
the NV driver's QMD address of a launch. Encoding itself has no side effects.
"""
from __future__ import annotations
import functools, struct
from dataclasses import dataclass, field


class Bits:
  """Bits [shift, shift + width) of a symbolic value: e.g. the high 32 bits of a 64-bit address in a dword."""
  __slots__ = ("value", "shift", "width")

  def __init__(self, value, shift: int = 0, width: int = 32): self.value, self.shift, self.width = value, shift, width
  def resolve(self, var_vals: dict) -> int: return (self.value.resolve(var_vals) >> self.shift) & ((1 << self.width) - 1)
  def __repr__(self): return f"bits({self.value!r}, {self.shift}, {self.width})"


def bits(value, shift: int, width: int):
  """Bits [shift, shift + width) of `value`: an int when it is one, else a symbolic `Bits`."""
  if isinstance(value, int): return (value >> shift) & ((1 << width) - 1)
  if isinstance(value, Bits): raise TypeError(f"bits of {value!r}: take bits of the symbolic value itself")
  return Bits(value, shift, width)


def lo32(value): return bits(value, 0, 32)
def hi32(value): return bits(value, 32, 32)


class Fixup:
  """A word the driver fills in itself when it places the commands in memory (bind/submit); `word(...)` is its
  value. Subclassed by a driver for what it places (drivers/nv/driver.py: a launch's QMD)."""


@dataclass(eq=False)
class Encoded:
  """Encoded commands. `words`: every word (a patched or fixed-up word holds 0 until it is filled in); `patches`:
  (word index, Bits of a symbolic value) for hcq to resolve; `packets`: the word index each packet starts at (a
  ring never splits one; empty: the words are one packet); `labels`: packet start -> what it runs (fault reports);
  `fixups`: (word index, Fixup) for the driver to fill in."""
  words: list[int]
  patches: list[tuple[int, Bits]] = field(default_factory=list)
  packets: list[int] = field(default_factory=list)
  labels: dict[int, str] = field(default_factory=dict)
  fixups: list[tuple[int, Fixup]] = field(default_factory=list)

  def resolved(self, var_vals: dict) -> "Encoded":
    """A copy with every patch filled in from `var_vals` (and no patches left); itself when it has none."""
    if not self.patches: return self
    words = list(self.words)
    for i, part in self.patches: words[i] = part.resolve(var_vals)
    return Encoded(words, [], self.packets, self.labels, self.fixups)

  def packet_words(self) -> list[list[int]]:
    """The words cut into packets."""
    if not self.packets: return [self.words] if self.words else []
    ends = self.packets[1:] + [len(self.words)]
    return [self.words[start:end] for start, end in zip(self.packets, ends)]

  def packet_labels(self) -> dict[int, str]:
    """packet index -> label (what `packet_words` returns is indexed so)."""
    return {k: self.labels[start] for k, start in enumerate(self.packets) if start in self.labels}


def stream(words: list, width: int) -> Encoded:
  """Encoded words of one stream in which a symbolic value fills a whole `width`-bit word (the CPU's 64-bit
  packets): each such word becomes 0 and a patch of all its bits. Takes over `words`."""
  patches = []
  for k, w in enumerate(words):
    if type(w) is not int and not isinstance(w, int):
      patches.append((k, Bits(w, 0, width)))
      words[k] = 0
  return Encoded(words, patches, [0] if words else [])


class Encoder:
  """Collects packets (lists whose words are ints, `Bits` or `Fixup`s) into one `Encoded`."""

  def __init__(self): self.encoded = Encoded([])

  def packet(self, words, label: str | None = None, special: list[int] | None = None) -> "Encoder":
    """Add a packet; `special`, when given, lists the indices of its words that are not ints (else they are found
    by looking at every word)."""
    enc = self.encoded
    start = len(enc.words)
    enc.packets.append(start)
    if label: enc.labels[start] = label
    enc.words.extend(words)
    for k in special if special is not None else [k for k, w in enumerate(words) if type(w) is not int]:
      w, at = words[k], start + k
      if isinstance(w, Bits): enc.patches.append((at, w))
      elif isinstance(w, Fixup): enc.fixups.append((at, w))
      elif isinstance(w, int): continue
      else: raise TypeError(f"word {at}: {w!r} is neither an int, Bits of a symbolic value, nor a Fixup")
      enc.words[at] = 0
    return self


@functools.lru_cache(maxsize=64)
def words_struct(n: int) -> struct.Struct:
  """The struct that packs n little-endian uint64 words (a ring write, kernel arguments)."""
  return struct.Struct(f"<{n}Q")
