"""The op suite's kernels (tests/helpers_capture.py) rendered to PTX entries:
`{"name", "entry", "n_params", "variables", "uops"}` per kernel, "uops" the "OP:dtype" pairs of the linearized
program (for coverage checks)."""
import re, sys, traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers_capture import op_suite_records, op_suite_count, dtype_matrix_specs  # noqa: E402,F401
from baregrad.compiler import codegen
from baregrad.compiler.deepstack import on_deep_stack
from baregrad.compiler.uop import Ops
from baregrad.compiler.render_ptx import PTXRenderer

PLACEHOLDER = "__KERNEL__"   # the entry's name; the test gives each kernel a unique one per module


def lower(spec, renderer, opts=None):
  """The steps of codegen.get_program up to rendering (codegen's own `_lower`): `opts` the GPU opts to apply, None
  for the heuristic's. On the compiler's deep-stack thread, as codegen runs them (compiler/deepstack.py)."""
  low = on_deep_stack(codegen._lower, SimpleNamespace(ast=spec.ast, opts=None if opts is None else tuple(opts)), renderer)
  return low.program, low.alias, low.variables, low.launch


def render_spec(spec, renderer, opts=None) -> dict:
  program, alias, variables, _launch = lower(spec, renderer, opts)
  entry = renderer.render_entry(PLACEHOLDER, program, alias, len(spec.params), variables)
  return {"name": re.sub(r"[^A-Za-z0-9_]", "_", spec.name), "entry": entry, "n_params": len(spec.params),
          "variables": [v.arg[0] for v in variables],
          "uops": sorted({f"{u.op.name}:{u.dtype.name if u.dtype else ''}" for u in program})}


def _spec(rec):
  name, ast, params = rec
  return SimpleNamespace(name=name, ast=ast, params=params)


def op_suite_kernels() -> tuple[list[dict], list[str]]:
  """(rendered kernels, rendering errors) for every kernel the op suite compiles."""
  renderer, kernels, errors = PTXRenderer(), {}, []
  for rec in op_suite_records():
    try:
      k = render_spec(_spec(rec), renderer)
      kernels.setdefault(k["entry"], k)
    except Exception:
      errors.append(f"kernel {rec[0]}:\n{traceback.format_exc()}")
  return list(kernels.values()), errors


def dtype_matrix() -> list:
  """The dtype matrix rendered with the heuristic's opts, with none, and with upcast lanes (a tile per thread)."""
  from baregrad.compiler.opt import Opt, OptError
  renderer, kernels = PTXRenderer(), {}
  for item in dtype_matrix_specs():
    for opts in (None, (), (Opt("UPCAST", 0, 2),)):
      try: k = render_spec(item, renderer, opts)
      except OptError: continue
      kernels.setdefault(k["entry"], k)
  return list(kernels.values())
