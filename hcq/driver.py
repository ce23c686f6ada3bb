"""The Driver protocol: everything hcq and the tools ask of a device driver (CPU, AMD, NV, ...).

Every driver implements every member; a capability a driver lacks is still a member (False, None, or a method that
raises NotImplementedError saying what to do instead), so nothing here is probed with getattr/hasattr.
tests/test_driver_protocol.py checks each driver class against this one, signature by signature.

Queues. hcq's HWQueue holds a generic command list:
    ("exec", program, kernarg address, global size, local size)  ("copy", dst, src, nbytes)
    ("signal", signal, value)  ("wait", signal, value)  ("timestamp", signal)  ("barrier",)
A value may be symbolic (hcq.queue.Slot: `resolve(var_vals)`, `+ int`). `encode(kind, cmds)` returns the words the
driver's engine runs (an `Encoded`, drivers/encoded.py): every word, with each symbolic value's bits listed in
`patches` as (word index, Bits) at the place the packet tables put that field, never computed a second way. Encoding
has no side effects (no memory is written or taken): whatever needs device memory happens in `submit` / `bind`.
Eager work: `submit(kind, encoded.resolved(var_vals))`. A bound queue (JIT replay): `bind(kind, encoded)` puts the
words into device memory once; `submit_bound(kind, bound, patch)` writes the (word index, value) pairs whose values
changed and starts the words with one indirect command.
"""
from __future__ import annotations
from typing import Protocol, runtime_checkable
from baregrad.drivers.encoded import Encoded


@runtime_checkable
class Driver(Protocol):
  name: str                 # the device kind: "CPU", "AMD", "NV"
  target: str | None        # what programs are compiled for ("gfx1100", "sm_90"); None: host machine code (CPU)
  timestamp_hz: int         # ticks per second of the timestamps queues write (1_000_000_000: nanoseconds)
  has_copy_queue: bool      # a "copy" queue that runs beside "compute" (False: both kinds share one engine)
  emulated: bool            # an emulated device (EMU=1): its timings say nothing of hardware (BEAM weighs counters)
  word_log: object          # None, or a drivers/decode.py WordLog the submit paths append to (CAPTURE records it)

  @classmethod
  def probe(cls) -> dict:
    """{"available": bool, "reason": why not, properties...} without opening the device; never raises."""
    ...

  # ---- memory ----
  def alloc(self, nbytes: int):
    """`nbytes` of memory the device's queues address and the host maps at the same address: an object with
    `addr` and `nbytes`. MemoryError when there is no room."""
    ...

  def alloc_polled(self, nbytes: int):
    """Like `alloc`, for memory the host polls (signals): where host reads are fast -- system memory the device
    reaches over the bus rather than device memory the host would read through the BAR, uncached."""
    ...

  def alloc_args(self, nbytes: int):
    """Like `alloc`, for kernel arguments (hcq's kernarg memory: the host writes them, and where the device reads them
    from memory, the device does): AMD's packets point the GPU at them (device memory); NV copies them into a launch's
    constant bank 0 on the host at submit, so they are host memory there."""
    ...

  def free(self, mem) -> None:
    """Give back memory from `alloc` (hcq calls it once no queued work uses the memory)."""
    ...

  def view(self, addr: int, nbytes: int):
    """A writable buffer over `nbytes` of this driver's memory at `addr`."""
    ...

  def copyin(self, dst_addr: int, data) -> None:
    """Write the bytes of `data` into this driver's memory at `dst_addr`, by the path that is fast for where that
    memory lives (a GPU's video memory: its copy engine and pinned staging, not host stores through the BAR).
    hcq calls it with the device idle (no queued work touches the bytes)."""
    ...

  def copyout(self, out, src_addr: int) -> None:
    """Read len(out) bytes of this driver's memory at `src_addr` into `out` (writable), by the fast path (a GPU's
    video memory: its copy engine into pinned staging, never uncached host reads through the BAR)."""
    ...

  def map_host(self, addr: int, nbytes: int):
    """Let the queues address page-aligned host memory another device allocated, at its host address.
    NotImplementedError where the device addresses only memory its own driver allocated."""
    ...

  # ---- programs ----
  def compile(self, src: str) -> bytes:
    """A binary from the renderer's source (NotImplementedError where the renderer compiles, e.g. AMD's assembler)."""
    ...

  def load_program(self, binary: bytes, name: str) -> tuple[int, object]:
    """(entry address, handle) of kernel `name` in `binary`, loaded for this device's queues."""
    ...

  def unload_program(self, handle) -> None:
    """Release a loaded program (hcq calls it once the device finished the work that used it)."""
    ...

  # ---- queues ----
  def encode(self, kind: str, cmds: list[tuple]) -> Encoded:
    """The words of `cmds` for the queue of `kind` ("compute" or "copy") and where their symbolic values go
    (see the module docstring). No side effects."""
    ...

  def submit(self, kind: str, encoded: Encoded) -> None:
    """Run encoded commands without patches (resolved) on the queue of `kind`."""
    ...

  def bind(self, kind: str, encoded: Encoded) -> object:
    """Put encoded commands into device memory for repeated submission; returns the bound handle. Patched words
    hold 0 until the first `submit_bound`."""
    ...

  def submit_bound(self, kind: str, bound, patch: list[tuple[int, int]]) -> None:
    """Write each (word index, value) of `patch` into the bound words, then run them (one indirect command)."""
    ...

  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    """Block until the 64-bit value at `addr` is >= `value`: True, or False after `timeout` seconds or when the
    device faulted (then `check_faults` says why)."""
    ...

  def check_faults(self, device_name: str) -> None:
    """Raise the fault the device reported, naming `device_name` and what was running; an exception with
    `queues_reset = True` when the driver recreated its queues (the work they held is dropped)."""
    ...

  def dump_queues(self) -> str:
    """Each live queue decoded from the engine's read pointer to the write pointer (drivers/decode.py: the packet
    tables the driver encodes with), following indirect buffers: what the hardware has not finished yet."""
    ...

  # ---- lifetime ----
  def after_fork_in_child(self) -> bool:
    """In a forked child: True when this driver keeps working there, False when the child must open a new device."""
    ...

  def close(self) -> None:
    """Stop the queues and release everything the driver holds; the driver is not used after."""
    ...
