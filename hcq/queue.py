"""HWQueue: a builder of hardware commands. The command list is generic; each driver encodes it.

A value in a command may be an int or a symbolic `Slot`; slots are resolved when the queue is submitted.
The driver's `encode` (hcq/driver.py) gives the words and, for every word a slot's bits go into, its index.
`bind(dev)` puts the words into device-visible memory once; a bound queue is submitted by patching only the
words whose value changed and handing the device one indirect-buffer command (one doorbell)."""
from __future__ import annotations


class Slot:
  """A named value filled in at submit time (an input address, a variable, a timeline value)."""
  __slots__ = ("name", "offset")
  def __init__(self, name: str, offset: int = 0): self.name, self.offset = name, offset
  def resolve(self, var_vals: dict) -> int: return var_vals[self.name] + self.offset
  def __add__(self, n: int) -> "Slot": return Slot(self.name, self.offset + n)
  def __repr__(self): return f"Slot({self.name!r}{f' + {self.offset}' if self.offset else ''})"


def resolve(v, var_vals) -> int: return v if isinstance(v, int) else v.resolve(var_vals)


class HWQueue:
  """`exec`, `copy`, `signal`, `wait`, `timestamp`, `memory_barrier`, then `submit(dev)` (or `bind` + `submit`)."""

  def __init__(self, kind: str = "compute"):
    self.kind = kind
    self.cmds: list[tuple] = []
    self.bound = None          # (the driver's bound handle, [(word index, Bits of a Slot)], last values)
    self._last = None          # a bound queue's last commands as reports word them (submit)

  def exec(self, program, args_addr, global_size=(1, 1, 1), local_size=(1, 1, 1)):
    if type(global_size) is not tuple: global_size = tuple(global_size)
    if type(local_size) is not tuple: local_size = tuple(local_size)
    self.cmds.append(("exec", program, args_addr, global_size, local_size)); return self
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

  def describe(self) -> str: return describe([brief(c) for c in self.cmds[-4:]])

  def bind(self, dev) -> "HWQueue":
    encoded = dev.driver.encode(self.kind, self.cmds)
    self.bound = (dev.driver.bind(self.kind, encoded), encoded.patches, [None] * len(encoded.patches))
    self._last = None
    return self

  def submit(self, dev, var_vals: dict | None = None) -> "HWQueue":
    try:
      if self.bound is None:
        encoded = dev.driver.encode(self.kind, self.cmds)
        dev.driver.submit(self.kind, encoded.resolved(var_vals or {}) if encoded.patches else encoded)
      else:
        handle, patches, last = self.bound
        var_vals = var_vals or {}
        patch = []
        for k, (i, part) in enumerate(patches):
          v = part.resolve(var_vals)
          if v != last[k]: patch.append((i, v)); last[k] = v
        dev.driver.submit_bound(self.kind, handle, patch)
    except BaseException:
      # nothing of this queue reached the device: the timeline values taken for it will never be signalled, and a
      # later synchronize must not wait for them
      dev.timeline_value = dev.timeline_submitted
      raise
    dev.timeline_submitted = dev.timeline_value
    # the last commands, for hang and fault reports (Device.last_command words them only when one is made); a bound
    # queue's commands do not change, so its are made once
    if self.bound is None: dev.last_submitted = (self.kind, [brief(c) for c in self.cmds[-4:]])
    else:
      if self._last is None: self._last = (self.kind, [brief(c) for c in self.cmds[-4:]])
      dev.last_submitted = self._last
    return self


def brief(cmd: tuple) -> tuple:
  """What a report says of a command, without holding its objects (a program must unload when its last user goes)."""
  op = cmd[0]
  if op == "exec": return (op, cmd[1].name)
  if op == "signal" or op == "wait": return (op, cmd[1].name, cmd[2])
  return (op,)


def describe(briefs: list[tuple]) -> str:
  """Commands (their `brief`s) in words."""
  return ", ".join(" ".join(map(str, b)) for b in briefs)
