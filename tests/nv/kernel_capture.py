"""The op suite's kernels (tests/helpers_capture.py) rendered to PTX entries:
`{"name", "entry", "n_params", "variables", "uops"}` per kernel, "uops" the "OP:dtype" pairs of the linearized
program (for coverage checks)."""
import re, sys, traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers_capture import op_suite_records, dtype_matrix_specs  # noqa: E402
from baregrad.compiler import codegen
from baregrad.compiler.deepstack import on_deep_stack
from baregrad.compiler.uop import Ops
from baregrad.compiler.render_ptx import PTXRenderer

PLACEHOLDER = "__KERNEL__"   # the entry's name; the test gives each kernel a unique one per module


def lower(spec, renderer, opts=()):
  """The steps of codegen.get_program up to rendering, for a threaded renderer (`opts`: range
  optimizations applied first, as codegen does for the CPU; none by default, as codegen does for GPUs). On the
  compiler's deep-stack thread, as codegen runs them (compiler/deepstack.py)."""
  return on_deep_stack(_lower, spec, renderer, opts)


def _lower(spec, renderer, opts=()):
  ast = spec.ast
  if opts:
    from baregrad.compiler.opt import apply_opts
    ast = apply_opts(ast, opts)
  ast, global_size, local_size = codegen.to_threads(ast)
  ast = codegen.optimize_ast(ast, renderer)
  program, alias = codegen.linearize(ast)
  variables = sorted({u for u in ast.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda v: v.arg[0])
  return program, alias, variables, {"global_size": global_size, "local_size": local_size}


def render_spec(spec, renderer, opts=()) -> dict:
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
  """The dtype matrix rendered plain and with upcast lanes (accumulators indexed by lane)."""
  from baregrad.compiler.opt import Opt, OptError
  renderer, kernels = PTXRenderer(), {}
  for item in dtype_matrix_specs():
    for opts in ((), (Opt("UPCAST", 0, 2),)):
      try: k = render_spec(item, renderer, opts)
      except OptError: continue
      kernels.setdefault(k["entry"], k)
  return list(kernels.values())
