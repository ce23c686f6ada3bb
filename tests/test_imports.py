"""No import cycles between the modules of one layer: every `import` of a folder's modules is read with ast
(module level and inside functions alike: a deferred import still ties two modules together) and the graph of
imports between modules of the same folder must have no cycle. And `import baregrad.tensor` loads no device driver,
emulator, kernel compiler or tool: each is imported where it is first used (checked in a fresh interpreter)."""
import ast, json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "baregrad"          # pyproject maps each top-level folder to baregrad.<folder>

# the folders checked; a folder joins this list once its cycles are broken
ACYCLIC_FOLDERS = [
  "hcq",
  "compiler",
  "tensor",
]


def module_name(folder: Path, path: Path) -> str:
  parts = [PACKAGE, folder.name, *path.relative_to(folder).with_suffix("").parts]
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, is_package: bool, tree: ast.AST, known: set[str]) -> dict[str, int]:
  """{module of `known` that `name` imports: line of the first such import}."""
  found: dict[str, int] = {}
  def add(target: str, line: int):
    if target in known and target != name: found.setdefault(target, line)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names: add(alias.name, node.lineno)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
      else:
        source = node.module
      for alias in node.names:     # `from pkg import module` imports the module, `from module import name` the module
        if f"{source}.{alias.name}" in known: add(f"{source}.{alias.name}", node.lineno)
        else: add(source, node.lineno)
  return found


def import_graph(folder: Path) -> dict[str, dict[str, int]]:
  paths = {module_name(folder, p): p for p in sorted(folder.rglob("*.py"))}
  known = set(paths)
  return {name: imported_modules(name, path.name == "__init__.py", ast.parse(path.read_text(), str(path)), known)
          for name, path in paths.items()}


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), each as its sorted modules."""
  index, low, stack, on_stack, components = {}, {}, [], set(), []
  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w); low[v] = min(low[v], low[w])
      elif w in on_stack: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop(); on_stack.discard(w); component.append(w)
        if w == v: break
      if len(component) > 1: components.append(component)
  for v in sorted(graph):
    if v not in index: visit(v)
  return sorted(sorted(c) for c in components)


def cycle_through(graph, component: list[str]) -> list[str]:
  """A path from the component's first module back to itself inside the component (breadth first: a short one)."""
  inside, start = set(component), component[0]
  came_from, frontier = {start: None}, [start]
  while frontier:
    nxt = []
    for v in frontier:
      for w in sorted(graph[v]):
        if w == start:
          path = [v]
          while came_from[path[-1]] is not None: path.append(came_from[path[-1]])
          return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
        if w in inside and w not in came_from:
          came_from[w] = v; nxt.append(w)
    frontier = nxt
  return component


def describe(graph, component: list[str]) -> str:
  """The modules of a cycle, and one path around it with the line of each import."""
  cycle = cycle_through(graph, component)
  path = " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"
  return f"{', '.join(component)} import each other, e.g. {path}"


@pytest.mark.parametrize("folder", ACYCLIC_FOLDERS)
def test_no_import_cycles_between_modules_of_a_folder(folder):
  graph = import_graph(ROOT / folder)
  assert len(graph) > 1, f"{folder}/ has no modules to check"
  cycles = find_cycles(graph)
  assert not cycles, f"import cycles in {folder}/ (module imports, including those inside functions):\n" + \
    "\n".join(describe(graph, c) for c in cycles)


def test_the_checker_finds_cycles_and_deferred_imports(tmp_path):
  """The check itself: a cycle closed by an import inside a function, through `from . import x` and a relative
  `from .y import name`, is found; a chain is not a cycle."""
  pkg = tmp_path / "layer"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from . import b\n")
  (pkg / "b.py").write_text("import os\nfrom .sub.c import thing\n")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "sub" / "c.py").write_text("thing = 1\ndef f():\n  from ..a import x\n")
  (pkg / "d.py").write_text("from baregrad.layer import a\n")
  graph = import_graph(pkg)
  assert graph["baregrad.layer.b"] == {"baregrad.layer.sub.c": 2}
  assert graph["baregrad.layer.d"] == {"baregrad.layer.a": 1}
  cycles = find_cycles(graph)
  assert cycles == [["baregrad.layer.a", "baregrad.layer.b", "baregrad.layer.sub.c"]]
  assert describe(graph, cycles[0]).endswith("baregrad.layer.a (line 1) -> baregrad.layer.b (line 2) -> "
                                             "baregrad.layer.sub.c (line 3) -> baregrad.layer.a")
  (pkg / "sub" / "c.py").write_text("thing = 1\n")
  assert find_cycles(import_graph(pkg)) == []


# ---- what `import baregrad.tensor` loads: the Tensor API and the runtime it needs, nothing a script may never use.
# Each of these is imported where it is first needed: a device's driver (and cffi) when the device opens, the kernel
# compiler on the first schedule, the CAPTURE/PROFILE machinery when one is set, nn/optim/... when a user imports
# them (`from baregrad.tensor import nn` imports the submodule). Checked in a fresh interpreter with those settings
# unset.
LOADED_ON_FIRST_USE = [
  "baregrad.drivers.cpu", "baregrad.drivers.amd", "baregrad.drivers.nv", "baregrad.drivers.metal",
  "baregrad.drivers.emu", "baregrad.drivers.kernel", "cffi", "pycparser",
  "baregrad.compiler.codegen", "baregrad.compiler.render_c", "baregrad.compiler.render_amd",
  "baregrad.compiler.render_ptx", "baregrad.compiler.render_msl", "baregrad.compiler.search", "baregrad.compiler.viz",
  "baregrad.hcq.trace", "baregrad.hcq.capture", "baregrad.hcq.transfer", "baregrad.hcq.graph",
  "baregrad.tensor.nn", "baregrad.tensor.optim", "baregrad.tensor.jit", "baregrad.tensor.safetensors",
  "baregrad.tensor.datasets", "baregrad.tools",
]

IMPORT_CHILD = r"""
import json, sys
import baregrad.tensor
after_import = sorted(sys.modules)
from baregrad.tensor import Tensor, nn, optim, dtypes
import numpy as np
out = (Tensor(np.arange(4, dtype=np.float32)) * 2 + 1).numpy()
print(json.dumps({"after_import": after_import, "after_use": sorted(sys.modules), "out": out.tolist(),
                  "nn": hasattr(nn, "Linear"), "optim": hasattr(optim, "SGD")}))
"""


def loaded(modules: list[str], names: list[str]) -> list[str]:
  """The modules in `modules` that are one of `names` or inside one of them (a package)."""
  return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_import_tensor_loads_no_driver_compiler_or_tool():
  env = {k: v for k, v in os.environ.items() if k not in ("CAPTURE", "PROFILE", "VIZ", "TRACE_IOCTL", "EMU", "DEV")}
  res = subprocess.run([sys.executable, "-c", IMPORT_CHILD], env=env, capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  got = json.loads(res.stdout.strip().splitlines()[-1])
  early = loaded(got["after_import"], LOADED_ON_FIRST_USE)
  assert not early, (f"`import baregrad.tensor` imports {early}: import them where they are first used (inside the "
                     "function that needs them, or a module-level __getattr__)")
  # the same check sees them once they are used: the CPU device opened, a kernel compiled, nn/optim imported
  assert got["out"] == [1.0, 3.0, 5.0, 7.0] and got["nn"] and got["optim"]
  for name in ("baregrad.drivers.cpu", "cffi", "baregrad.compiler.codegen", "baregrad.tensor.nn", "baregrad.tensor.optim"):
    assert loaded(got["after_use"], [name]), f"{name} is not among the modules loaded after use"
