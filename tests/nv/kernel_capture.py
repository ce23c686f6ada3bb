"""pytest plugin: record every kernel the running tests compile, rendered to PTX.

Load it with `-p kernel_capture` (this folder on PYTHONPATH) and set NV_CAPTURE_OUT to a file: each
KernelSpec that reaches `compiler.schedule.get_program` goes through the NV lowering (`lower` below),
is rendered by PTXRenderer and written, deduplicated, to that file as JSON when the session ends:
`{"kernels": [{"name", "entry", "n_params", "variables", "uops"}], "errors": [traceback, ...]}` where
"uops" lists the "OP:dtype" pairs of the linearized program (for coverage checks).
The tests themselves still run on their own device, so what they check is unchanged.
"""
import json, os, re, traceback

from baregrad.compiler import schedule, codegen
from baregrad.compiler.uop import Ops
from baregrad.compiler.render_ptx import PTXRenderer

PLACEHOLDER = "__KERNEL__"   # the entry's name; the test gives each kernel a unique one per module


def lower(spec, renderer, opts=()):
  """The steps of codegen.get_program up to rendering, for a threaded renderer (`opts`: range
  optimizations applied first, as codegen does for the CPU; none by default, as codegen does for GPUs)."""
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


def dtype_matrix() -> list:
  """Kernels the op suite may lack: every ALU op, cast and bitcast on every dtype (uint16 and uint64
  included), reductions and a gated (padded) load, scheduled with rangeify but never run."""
  import numpy as np
  from baregrad.tensor import Tensor
  from baregrad.compiler.dtype import dtypes
  from baregrad.compiler.uop import UOp, BINARY
  from baregrad.compiler.rangeify import rangeify, KernelSpec
  from baregrad.compiler.schedule import normalize
  outs = []
  def make(dt):
    vals = np.array([0, 1, 2, 3, 5, 7, 100, 127])
    return Tensor(vals.astype(np.float32), dtype=dt) if dt == dtypes.bfloat16 else Tensor(vals.astype(dt.np))
  def add(fn):
    try: outs.append(fn())
    except (TypeError, ValueError): pass   # combinations the Tensor API refuses
  for dt in dtypes.all():
    a, b, cond = make(dt), make(dt).flip(0), make(dtypes.bool)
    for op in BINARY:
      if dt.is_float and op in (Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.IDIV): continue
      add(lambda: a._alu(op, b))
    unary = [Ops.NEG, Ops.TRUNC] + ([Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN] if dt.is_float else [])
    for op in unary: add(lambda: a._alu(op))
    add(lambda: cond._alu(Ops.WHERE, a, b, dtype=dt))
    for dst in dtypes.all():
      if dst != dt: add(lambda: a.cast(dst))
      if dst != dt and dst.itemsize == dt.itemsize: add(lambda: a.bitcast(dst))
    add(lambda: a.sum()); add(lambda: a.max()); add(lambda: a.prod())
    add(lambda: a.reshape(2, 4).sum(1)); add(lambda: a.pad(((2, 1),)))
  sink, _buffers, _vars = normalize(UOp.sink(*[t.uop for t in outs]))
  sched = rangeify(sink, lambda n: n.device)
  from baregrad.compiler.opt import Opt, OptError
  renderer, kernels = PTXRenderer(), {}
  for item in sched.items:
    if not isinstance(item, KernelSpec): continue
    for opts in ((), (Opt("UPCAST", 0, 2),)):   # upcast lanes: accumulators indexed by lane
      try: k = render_spec(item, renderer, opts)
      except OptError: continue
      kernels.setdefault(k["entry"], k)
  return list(kernels.values())


class Capture:
  def __init__(self, out: str):
    self.out, self.renderer = out, PTXRenderer()
    self.kernels: dict[str, dict] = {}
    self.errors: list[str] = []
    self.original = schedule.get_program
    schedule.get_program = self.get_program

  def get_program(self, spec):
    try:
      k = render_spec(spec, self.renderer)
      self.kernels.setdefault(k["entry"], k)
    except Exception:
      self.errors.append(f"kernel {spec.name}:\n{traceback.format_exc()}")
    return self.original(spec)

  def pytest_sessionfinish(self, session, exitstatus):
    schedule.get_program = self.original
    with open(self.out, "w") as f:
      json.dump({"kernels": list(self.kernels.values()), "errors": self.errors}, f)


def pytest_configure(config):
  if (out := os.environ.get("NV_CAPTURE_OUT")):
    config.pluginmanager.register(Capture(out), "nv_kernel_capture")
