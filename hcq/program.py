"""A program loaded on a device: its name, entry point and the source it came from."""
from __future__ import annotations
import weakref
from dataclasses import dataclass, field


@dataclass(eq=False)
class Program:
  device: str
  name: str
  binary: bytes
  source: object = ""             # the source text, or an object whose str() is the text (AMD: instruction objects)
  n_params: int = 0
  variables: tuple = ()            # names of the symbolic int arguments after the buffers
  meta: dict = field(default_factory=dict)
  entry: int = 0
  handle: object = None

  def load(self, dev) -> "Program":
    self.entry, self.handle = dev.driver.load_program(self.binary, self.name)
    # unloaded once the last reference is gone and the device has finished the work queued before that
    weakref.finalize(self, dev.retire, self.handle, dev.driver.unload_program).atexit = False
    return self
