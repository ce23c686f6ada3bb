"""ExecItem: one compiled program (or a copy) with its buffers and variable values, the unit the runtime and the
JIT handle, and how one is put on a device's queue."""
from __future__ import annotations
from dataclasses import dataclass, field
from .program import Program


@dataclass(eq=False)
class ExecItem:
  """One compiled program (or a copy when program is None) with its buffers and variable values."""
  program: Program | None
  bufs: list
  var_vals: dict = field(default_factory=dict)
  meta: dict = field(default_factory=dict)     # name, flops, bytes

  @property
  def name(self) -> str: return self.program.name if self.program is not None else self.meta.get("name", "copy")


def kernel_args(item: ExecItem) -> list[int]:
  args = [b.addr for b in item.bufs]
  if item.program.variables: args += [item.var_vals[v] for v in item.program.variables]
  return args


def enqueue(dev, q, item: ExecItem):
  """Add `item` to queue `q` of `dev`: a copy, or the program with its arguments in the device's kernarg memory."""
  if item.program is None:
    dst, src = item.bufs
    q.copy(dst.addr, src.addr, dst.nbytes)
  else:
    q.exec(item.program, dev.kernargs.put(kernel_args(item)), global_size(item.meta, item.var_vals))


_ONE = (1, 1, 1)


def global_size(meta: dict, var_vals: dict) -> tuple:
  """The workgroups to launch: the program's `global_size`, or, for a global size that depends on Variables
  (meta "grid", compiler/codegen.py symbolic_grid), its value for `var_vals` (at least 1 and at most the largest)."""
  grid = meta.get("grid")
  if grid is None: return meta.get("global_size", _ONE)
  return tuple(grid_value(g, most, var_vals) for g, most in zip(grid, meta["global_size"]))


def grid_value(expr, most: int, var_vals: dict) -> int:
  """One launch dimension of a symbolic grid for `var_vals` (clamped to 1 .. the compiled largest)."""
  from baregrad.compiler.shape import evaluator
  return min(max(int(evaluator(expr)(var_vals)), 1), most)
