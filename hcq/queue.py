"""HWQueue: a builder of hardware commands. The command list is generic; each driver encodes it."""
from __future__ import annotations


class HWQueue:
  """`exec`, `copy`, `signal`, `wait`, `timestamp`, `memory_barrier`, then `submit(dev)`.

  A value may be an int or a symbolic slot: any object with `resolve(var_vals) -> int`; it is resolved
  when the queue is encoded, so a bound queue can be replayed with other values."""

  def __init__(self, kind: str = "compute"):
    self.kind = kind
    self.cmds: list[tuple] = []

  def exec(self, program, args_addr, global_size=(1, 1, 1), local_size=(1, 1, 1)):
    self.cmds.append(("exec", program, args_addr, tuple(global_size), tuple(local_size))); return self
  def copy(self, dst, src, nbytes):
    self.cmds.append(("copy", dst, src, nbytes)); return self
  def signal(self, signal, value):
    self.cmds.append(("signal", signal, value)); return self
  def wait(self, signal, value):
    self.cmds.append(("wait", signal, value)); return self
  def timestamp(self, signal):
    self.cmds.append(("timestamp", signal)); return self
  def memory_barrier(self):
    self.cmds.append(("barrier",)); return self

  @staticmethod
  def resolve(v, var_vals) -> int: return v if isinstance(v, int) else v.resolve(var_vals)

  def describe(self) -> str:
    parts = []
    for c in self.cmds[-4:]:
      if c[0] == "exec": parts.append(f"exec {getattr(c[1], 'name', c[1])}")
      elif c[0] in ("signal", "wait"): parts.append(f"{c[0]} {c[1].name} {c[2]}")
      else: parts.append(c[0])
    return ", ".join(parts)

  def submit(self, dev, var_vals: dict | None = None):
    dev.driver.submit(self.kind, dev.driver.encode(self.cmds, var_vals or {}, self.resolve))
    dev.last_command = f"{self.kind} queue: {self.describe()}"
    return self
