"""The MSL renderer (compiler/render_msl.py) and the metal_stdlib shim (drivers/emu/metal_shim/): every kernel of the op
suite and of the dtype matrix renders to MSL that compiles with the shim under g++ and clang++ (each present one),
all kernels of a compiler in one translation unit; float64 kernels are refused with a message. The shim's launcher
runs a kernel over the grid as Metal's thread positions say, and what the shim cannot run is refused by name."""
import re, shutil, sys, traceback
from pathlib import Path
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers_capture import op_suite_records, dtype_matrix_specs  # noqa: E402  (read by tests/conftest.py's plan)
from baregrad.compiler import codegen
from baregrad.compiler.deepstack import on_deep_stack
from baregrad.compiler.dtype import dtypes
from baregrad.compiler.uop import Ops
from baregrad.compiler.render_msl import MSLRenderer
from baregrad.drivers.emu import metal_shim

COMPILERS = [c for c in ("g++", "clang++", "clang++-22", "clang++-19") if shutil.which(c)]
COMPILERS = [c for c in COMPILERS if not (c.startswith("clang++-") and "clang++" in COMPILERS)][:2] or [None]


def _lower(spec, opts=()):
  ast = spec.ast
  if opts:
    from baregrad.compiler.opt import apply_opts
    ast = apply_opts(ast, opts)
  ast, _, _ = codegen.to_threads(ast)
  ast = codegen.optimize_ast(ast, MSLRenderer())
  program, alias = codegen.linearize(ast)
  variables = sorted({u for u in ast.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda v: v.arg[0])
  return program, alias, variables


def render_all(specs) -> tuple[dict[str, str], list[str], list[str]]:
  """({kernel name: MSL}, names refused for float64, errors) — each kernel named uniquely for one translation unit."""
  kernels, refused, errors = {}, [], []
  for k, (spec, opts) in enumerate(specs):
    name = f"k{k}_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.name)
    try:
      program, alias, variables = on_deep_stack(_lower, spec, opts)
      kernels[name] = MSLRenderer().render(name, program, alias, len(spec.params), variables)
    except NotImplementedError as e:
      if "float64" in str(e) and "Metal has no 64-bit float" in str(e): refused.append(name)
      else: errors.append(f"{name}: {e}")
    except Exception:
      errors.append(f"{name}:\n{traceback.format_exc()}")
  return kernels, refused, errors


def one_unit(kernels: dict[str, str]) -> str:
  head = "#include <metal_stdlib>\nusing namespace metal;\n"
  return head + "".join(src.replace(head, "") for src in kernels.values())


class _Spec:
  def __init__(self, rec): self.name, self.ast, self.params = rec


@pytest.fixture(scope="module")
def op_suite_msl():
  specs = {rec[1]: (_Spec(rec), ()) for rec in op_suite_records()}
  return render_all(list(specs.values()))


@pytest.fixture(scope="module")
def matrix_msl():
  from baregrad.compiler.opt import Opt, OptError
  specs = []
  for spec in dtype_matrix_specs():
    specs.append((spec, ()))
    try:
      on_deep_stack(_lower, spec, (Opt("UPCAST", 0, 2),))
      specs.append((spec, (Opt("UPCAST", 0, 2),)))
    except OptError: pass
  return render_all(specs)


@pytest.mark.parametrize("compiler", COMPILERS, ids=lambda c: c or "none")
@pytest.mark.parametrize("suite", ["op_suite_msl", "matrix_msl"])
def test_every_kernel_compiles_with_the_shim(suite, compiler, request):
  if compiler is None: pytest.skip("no C++ compiler (g++ or clang++) on PATH")
  kernels, refused, errors = request.getfixturevalue(suite)
  assert not errors, "\n".join(errors[:5])
  assert len(kernels) > 50 and len(refused) < len(kernels) / 5, (len(kernels), len(refused))
  unit = one_unit(kernels)
  signatures = metal_shim.parse_kernels(unit)
  assert {k.name for k in signatures} == set(kernels)
  metal_shim.check_syntax(unit, compiler=shutil.which(compiler))  # raises with the compiler's output


def test_rendered_kernel_shape():
  from baregrad.tensor import Tensor
  from baregrad.compiler.schedule import normalize
  from baregrad.compiler.rangeify import rangeify, KernelSpec
  a = Tensor(np.arange(300, dtype=np.float32))
  sink, _, _ = normalize((a.reshape(3, 100).sum(1) * 2).uop.sink())
  spec = [it for it in rangeify(sink, lambda n: n.device).items if isinstance(it, KernelSpec)][0]
  program, alias, variables = on_deep_stack(_lower, spec)
  src = MSLRenderer().render("r", program, alias, len(spec.params), variables)
  assert "kernel void r(device float* data0 [[buffer(0)]]" in src
  assert "const device float* data1 [[buffer(1)]]" in src and "uint3 gid [[thread_position_in_grid]]" in src
  assert "double" not in src and "__builtin" not in src


def test_float64_is_refused_by_name():
  from baregrad.compiler.uop import UOp
  program = [UOp(Ops.PARAM, dtypes.float64, (), 0)]
  with pytest.raises(NotImplementedError, match="kernel f64k computes in float64; Metal has no 64-bit float"):
    MSLRenderer().render("f64k", program, {}, 1, [])


@pytest.mark.parametrize("compiler", COMPILERS, ids=lambda c: c or "none")
def test_launcher_runs_the_grid_with_metal_thread_positions(compiler):
  if compiler is None: pytest.skip("no C++ compiler on PATH")
  src = """#include <metal_stdlib>
using namespace metal;
kernel void where(device uint* out [[buffer(0)]], constant long& base [[buffer(1)]], uint3 gid [[thread_position_in_grid]],
                  uint3 tg [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
                  uint3 ntg [[threads_per_threadgroup]]) {
  uint i = gid.y * 8 + gid.x;
  out[i] = (uint)base + tg.x * 1000 + lid.x * 100 + ntg.x * 10 + tg.y + as_type<uint>(1.0f) - 0x3f800000u;
}
"""
  lib = metal_shim.Library(src, compiler=shutil.which(compiler))
  out, base = np.zeros(16, np.uint32), np.array([7], np.int64)
  lib.run("where", [out.ctypes.data, base.ctypes.data], (2, 2, 1), (4, 1, 1))
  gx, gy = np.meshgrid(np.arange(8), np.arange(2))
  want = 7 + (gx // 4) * 1000 + (gx % 4) * 100 + 40 + gy
  np.testing.assert_array_equal(out, want.reshape(-1).astype(np.uint32))
  lib.close()


def test_what_the_shim_cannot_run_is_refused():
  """(What it refuses of threadgroup memory, barriers and SIMD-groups: test_msl_workgroups.py.)"""
  with pytest.raises(metal_shim.ShimCompileError, match=r"no \[\[buffer\(n\)\]\] or thread attribute"):
    metal_shim.parse_kernels("kernel void f(device float* a) {}")
  with pytest.raises(metal_shim.ShimCompileError, match="thread_index_in_quadgroup.* is not emulated"):
    metal_shim.parse_kernels("kernel void f(uint s [[thread_index_in_quadgroup]]) {}")
  if COMPILERS == [None]: return
  with pytest.raises(metal_shim.ShimCompileError, match="error"):
    metal_shim.compile_so("#include <metal_stdlib>\nkernel void f(device float* a [[buffer(0)]]) { a[0] = undefined_name; }")


def _apple_metal() -> list[str] | None:
  """`xcrun -sdk macosx metal` where Apple's Metal compiler is installed (a Mac with the command line tools)."""
  import subprocess
  if shutil.which("xcrun") is None: return None
  found = subprocess.run(["xcrun", "-sdk", "macosx", "-f", "metal"], capture_output=True, text=True)
  return ["xcrun", "-sdk", "macosx", "metal"] if found.returncode == 0 else None


@pytest.mark.parametrize("suite", ["op_suite_msl", "matrix_msl"])
def test_every_kernel_compiles_with_apples_metal_compiler(suite, request, tmp_path):
  """Real MSL acceptance, on a Mac only (drivers/metal/README.md)."""
  import subprocess
  metal = _apple_metal()
  if metal is None: pytest.skip("Apple's Metal compiler (xcrun -sdk macosx metal) is only on macOS")
  kernels, _, errors = request.getfixturevalue(suite)
  assert not errors
  proc = subprocess.run([*metal, "-std=metal3.0", "-x", "metal", "-c", "-", "-o", str(tmp_path / "k.air")],
                        input=one_unit(kernels).encode(), capture_output=True)
  assert proc.returncode == 0, proc.stderr.decode()[-5000:]
