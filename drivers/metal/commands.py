"""The Metal queue's command words: what `MetalDriver.encode` returns, read back by `decode` when a submit turns them
into command buffers. Metal has no command stream the driver writes: its command buffers are objects built by
messages, once per submission. The words are baregrad's own record of the commands (a 64-bit opcode word, then one
64-bit word per operand, in the order the table lists them), so that encoding stays pure and a JIT graph's symbolic
values (an input address, a timeline value) are whole words that hcq patches like every other driver's.
"""
from __future__ import annotations
from ..encoded import Encoded, stream

# command -> (opcode, operand names)
COMMANDS = {
  "exec": (1, ("pipeline", "args", "buffers", "variables", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")),
  "copy": (2, ("dst", "src", "nbytes")),
  "signal": (3, ("addr", "value")),
  "wait": (4, ("addr", "value")),
  "timestamp": (5, ("addr",)),
  "barrier": (6, ()),
}
BY_OPCODE = {op: (name, operands) for name, (op, operands) in COMMANDS.items()}


def operands(cmd: tuple) -> list:
  """hcq's command tuple -> the operand values, in table order."""
  op = cmd[0]
  if op == "exec":
    program, args = cmd[1], cmd[2]
    block = tuple(cmd[4]) if tuple(cmd[4]) != (1, 1, 1) else tuple(program.meta.get("local_size", (1, 1, 1)))
    return [program.entry, args, program.n_params, len(program.variables), *cmd[3], *block]
  if op == "copy": return [cmd[1], cmd[2], cmd[3]]
  if op in ("signal", "wait"): return [cmd[1].addr, cmd[2]]
  if op == "timestamp": return [cmd[1].timestamp_addr]
  if op == "barrier": return []
  raise ValueError(f"METAL queue: unknown command {op!r}")


def encode(cmds: list[tuple]) -> Encoded:
  """The words of `cmds` (symbolic values: whole-word patches). No side effects."""
  words: list = []
  for cmd in cmds:
    if cmd[0] not in COMMANDS: raise ValueError(f"METAL queue: unknown command {cmd[0]!r}")
    values = operands(cmd)
    words.append(COMMANDS[cmd[0]][0])
    words.extend(values)
  return stream(words, 64)


def decode(words: list[int]) -> list[tuple[str, dict]]:
  """(command name, {operand: value}) for each command in `words`."""
  out, i = [], 0
  while i < len(words):
    entry = BY_OPCODE.get(words[i])
    if entry is None: raise ValueError(f"METAL queue: word {i} holds {words[i]:#x}, which is no command opcode")
    name, names = entry
    if i + 1 + len(names) > len(words): raise ValueError(f"METAL queue: {name} at word {i} is cut off")
    out.append((name, dict(zip(names, words[i + 1:i + 1 + len(names)]))))
    i += 1 + len(names)
  return out
