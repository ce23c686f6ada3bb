"""The kernels of the op test suite, recorded once per pytest process and shared by the renderer tests
(tests/amd/test_render.py, tests/nv/test_ptx.py), plus a matrix of every ALU op, cast and bitcast on every dtype.

A record is `(name, kernel AST, [(param dtype, element count)])`. The kernels are recorded with
`compiler.schedule.get_programs` wrapped while the op suite runs on the CPU device; its own failures do not matter here.
When the pytest session itself runs the whole op suite (the default run), tests/conftest.py records it in process
(`plan_session`, `recording`) and moves the tests that read the records after it, so the suite runs once; otherwise
(`pytest tests/amd`, a -k selection, another device) it is run once more in a subprocess on the CPU."""
import contextlib, math, os, pickle, subprocess, sys, tempfile
from pathlib import Path
import numpy as np

from baregrad.compiler import schedule
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import UOp, Ops, BINARY
from baregrad.compiler.rangeify import KernelSpec, rangeify

TESTS = Path(__file__).resolve().parent
OP_SUITE = ["test_ops.py", "test_composite.py", "test_fusion.py", "test_dtypes.py", "test_jit.py"]
_op_suite: list | None = None
_in_process: dict | None = None     # {ast: record} filled while this session's op-suite tests run (plan_session)
_fresh = False                      # the caches were cleared before the first op-suite test recorded in process


def _numel(p: UOp) -> int:
  return p.arg.size if p.op is Ops.BUFFER else math.prod(p.shape)


def record(spec: KernelSpec) -> tuple:
  dts = {u.arg: u.dtype for u in spec.ast.toposort() if u.op is Ops.PARAM}
  return (spec.name, spec.ast, [(dts.get(i, dtypes.uint8), _numel(p)) for i, p in enumerate(spec.params)])


def _reads_records(item) -> bool:
  mod = getattr(item, "module", None)
  return getattr(mod, "op_suite_records", None) is op_suite_records or hasattr(mod, "kernel_capture")


def worker_scope(nodeid: str) -> str:
  """The tests one pytest-xdist worker runs together (tests/conftest.py): the op-suite files and the files that read
  their kernels (found by name in their source), else the test's file."""
  global _readers
  if _readers is None:
    _readers = {str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py")
                if "op_suite_records" in (text := p.read_text()) or "kernel_capture" in text}
    _readers |= {f"tests/{f}" for f in OP_SUITE}
  file = nodeid.split("::")[0]
  return "op-suite" if file in _readers else file


_readers: set | None = None


def plan_session(config, items: list) -> None:
  """Called from pytest_collection_modifyitems: when this session runs every op-suite file unfiltered on the CPU,
  arrange to record its kernels in process and move the tests that read them to the end (the order is otherwise
  kept)."""
  global _in_process
  from baregrad.hcq.device import Device
  # on another default device the suite's kernels are that device's (the few CPU ones among them are not the suite's):
  # op_suite_records runs it on the CPU in a subprocess
  if Device.default().partition(":")[0] != "CPU": return
  readers = [it for it in items if _reads_records(it)]
  opt = config.option
  filtered = (getattr(opt, "keyword", "") or getattr(opt, "markexpr", "") or getattr(opt, "deselect", None)
              or getattr(opt, "lf", False) or getattr(opt, "failedfirst", False) or getattr(opt, "stepwise", False)
              or any("::" in str(a) for a in config.args))
  suite_files = {Path(str(it.path)).resolve() for it in items} & {TESTS / f for f in OP_SUITE}
  if not readers or filtered or len(suite_files) != len(OP_SUITE): return
  _in_process = {}
  ids = {id(it) for it in readers}
  items[:] = [it for it in items if id(it) not in ids] + readers


@contextlib.contextmanager
def recording(item):
  """Around one test (setup, call, teardown): record the CPU kernels it compiles, if it is an op-suite test of a
  session plan_session chose to record."""
  global _fresh
  if _in_process is None or Path(str(item.path)).resolve() not in {TESTS / f for f in OP_SUITE}:
    yield; return
  if not _fresh:
    # kernels and schedules that tests before the op suite cached would not pass through get_programs: the records
    # would depend on what ran first (a pytest-xdist worker runs other files before it)
    from baregrad.compiler import codegen
    codegen.clear_programs()
    _fresh = True
  original = schedule.get_programs

  def capture(specs):
    specs = list(specs)
    for spec in specs:
      if spec.device == "CPU" and spec.ast not in _in_process: _in_process[spec.ast] = record(spec)
    return original(specs)
  schedule.get_programs = capture
  try: yield
  finally: schedule.get_programs = original


def _capture_main(out: str, files: list[str]):
  """Run the op suite in this process with get_programs wrapped; pickle the kernel records to `out`."""
  import pytest
  sys.setrecursionlimit(100000)
  seen: dict = {}
  original = schedule.get_programs

  def capture(specs):
    specs = list(specs)
    for spec in specs:
      if spec.ast not in seen and spec.device == "CPU": seen[spec.ast] = record(spec)
    return original(specs)
  schedule.get_programs = capture
  pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", *files])
  schedule.get_programs = original
  with open(out, "wb") as f: pickle.dump(list(seen.values()), f)


# OP_SUITE_ALL=1: the renderer tests take every kernel the op suite compiles; by default a sample (`sample`)
OP_SUITE_ALL = os.environ.get("OP_SUITE_ALL", "0") not in ("", "0")
SAMPLE_EVERY = 6


def _features(rec) -> set:
  return {(u.op, u.dtype, tuple(s.dtype for s in u.src)) for u in rec[1].toposort()}


def sample(records: list, every: int = SAMPLE_EVERY) -> list:
  """Every `every`-th record, plus each one holding an (op, dtype, operand dtypes) node no earlier chosen record had:
  every kind of node the op suite gives a renderer stays covered in a fraction of the time. All of them with
  OP_SUITE_ALL=1."""
  if OP_SUITE_ALL: return list(records)
  seen, out = set(), []
  for i, rec in enumerate(records):
    features = _features(rec)
    if i % every == 0 or not features <= seen: out.append(rec); seen |= features
  return out


def op_suite_count() -> int:
  """How many distinct kernels the op suite compiled (all of them, before `sample`)."""
  return len(_all_records())


def op_suite_records() -> list:
  """The kernels the op suite compiles (recorded once per process), `sample`d unless OP_SUITE_ALL=1; a new list each
  call."""
  return sample(_all_records())


def _all_records() -> list:
  global _op_suite
  if _op_suite is None and _in_process:      # this session ran the op suite on the CPU: its records, no second run
    _op_suite = list(_in_process.values())
  if _op_suite is None:
    with tempfile.TemporaryDirectory(prefix="baregrad-kernels-") as d:
      out = Path(d) / "kernels.pkl"
      env = dict(os.environ, DEV="CPU")
      env.pop("EMU", None)
      env["PYTHONPATH"] = os.pathsep.join([str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
      code = f"import helpers_capture; helpers_capture._capture_main({str(out)!r}, {[str(TESTS / f) for f in OP_SUITE]!r})"
      proc = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                            timeout=900)
      if not out.exists():
        raise RuntimeError(f"op suite did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
      limit = sys.getrecursionlimit()
      sys.setrecursionlimit(max(limit, 20000))     # pickled graphs nest deeply: only while loading them
      try: _op_suite = pickle.loads(out.read_bytes())
      finally: sys.setrecursionlimit(limit)
  return _op_suite


def dtype_matrix_specs() -> list[KernelSpec]:
  """Kernels the op suite may lack: every binary/unary ALU op, WHERE, cast and bitcast on every dtype (uint16 and
  uint64 included), reductions, a padded (gated) load, float division, and tail lanes past a multiple of 256;
  scheduled with rangeify, never run. Built on the CPU device, whatever the default device: like the op suite's
  records, they are kernels for the renderer a test names (float64 ones included, which METAL cannot hold)."""
  from baregrad.tensor import Tensor
  from baregrad.compiler.schedule import normalize
  outs = []
  def make(dt):
    vals = np.array([0, 1, 2, 3, 5, 7, 100, 127])
    if dt == dtypes.bfloat16: return Tensor(vals.astype(np.float32), dtype=dt, device="CPU")
    return Tensor(vals.astype(dt.np), device="CPU")
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
    if dt.is_float: add(lambda: a._alu(Ops.MUL, b._alu(Ops.RECIP)))   # x / y
  x = Tensor(np.arange(1000, dtype=np.float32), device="CPU")
  outs += [x * 2 + 1, (x.reshape(10, 100).pad(((1, 1), (0, 0))).sum(1)), x.reshape(40, 25).max(0)]
  sink, _b, _v = normalize(UOp.sink(*[t.uop for t in outs]))
  return [it for it in rangeify(sink, lambda n: n.device).items if isinstance(it, KernelSpec)]
