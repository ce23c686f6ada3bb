"""Mutation testing: change one literal or operator of a source file, run the tests that cover it, see if they fail.

Mutation testing
----------------
A test suite that still passes after a register offset, a bit position or a struct field type was changed does
not check that fact. This tool makes such changes one at a time ("mutants") and reports the ones no test noticed:

    python tests/mutate.py                          # the hardware tables, with tests/amd and tests/nv
    python tests/mutate.py --target emu             # the emulators' compare/min/max/class/convert code
    python tests/mutate.py --files drivers/nv/qmd.py --tests "tests/nv/test_nv_emu.py" --jobs 2
    python tests/mutate.py --list                   # the mutants and their IDs, nothing runs
    python tests/mutate.py --only drivers/amd/pm4.py:31:10:swap     # one mutant (an ID from --list), with pytest's output
    python tests/mutate.py --jobs 2 --report mutants.md

Mutants come from the AST, each replacing one token of the source text (IDs are `file:line:column:kind`, both
1-based; the order is deterministic):
  int+1, int-1, int^2   every integer literal n: n+1, and n-1 (n >= 256 or odd) or n^2 (small even n)
  swap                  two adjacent values of a dict literal (ints, names like np.less), or ints of a tuple/list
  cmp                   < <=, > >=, == != flipped          arith   + -, << >>, & | swapped
  ctype                 a field type in a cffi `cdef` string (uint32_t -> uint64_t, ...); array sizes there
                        are integer literals like the others. C comments, docstrings and f-strings are skipped.
`--target emu` mutates only the table-like parts of the emulators (EMU_REGIONS below); `--files` any files.

Each job runs in a private copy of the repository (tracked and untracked-but-not-ignored files, laid out as the
`baregrad` namespace so `import baregrad.x` imports the copy), with its own BAREGRAD_CACHE and one CPU thread
(THREADS=1); the working tree is never written. The tests are first run unmutated in every copy (a failure
stops here), then per mutant: patch the file, `pytest <tests> -x -q -p no:cacheprovider`, restore the file.
A failing run kills the mutant; a run past the timeout (default 3x the unmutated run + 30 s) counts as killed
and is reported apart. The default tests of a file: tests/amd for drivers/amd/, tests/nv for drivers/nv/,
tests/emu for drivers/emu/, else tests/; `--tests "ARGS"` replaces them for every file and
`--tests "PREFIX=ARGS"` for the files under PREFIX (ARGS: pytest arguments, i.e. paths, node IDs, -k, --deselect):

    python tests/mutate.py --jobs 2 \\
      --tests "drivers/amd/=tests/amd/test_amd_hw_tables.py tests/amd/test_pm4_sdma_logic.py tests/amd/test_kfd.py tests/amd/test_kfd_rules.py" \\
      --tests "drivers/nv/=tests/nv/test_nv_hw_tables.py tests/nv/test_qmd_pushbuf_logic.py tests/nv/test_nv_driver.py tests/nv/test_nv_emu.py tests/nv/test_nv_rules.py"

(the tables' ~2500 mutants with these subsets: about 19-25 minutes with --jobs 2, 0.4% survivors, all equivalent; with the whole of tests/amd and
tests/nv, whose compiler tests take a minute per surviving mutant, hours). The kernel cache of a copy is kept from
mutant to mutant: its entries are keyed by everything that decides their bytes, so none is stale.

A survivor is either an equivalent change (an unused register, a bit that no path sets) or a missing test: the
report shows its original and mutated line to decide which.
"""
from __future__ import annotations
import argparse, ast, bisect, importlib.util, io, os, re, shlex, shutil, signal, subprocess, sys, tempfile, threading
import time, tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

TABLE_FILES = ("drivers/amd/pm4.py", "drivers/amd/sdma.py", "drivers/nv/qmd.py", "drivers/nv/pushbuf.py",
               "drivers/nv/rm.py")
# the emulators' semantic tables: top-level statements whose first line matches one of the patterns
EMU_REGIONS = {
  "drivers/emu/rdna3_valu.py": (r"def _minmax\(", r"def _med3", r"def _cvt_int\(", r'_op\("v_cvt_', r"def _minmax_kinds\(",
                                r"_SATURATE = ", r"_CMP = ", r"def _class_mask\(", r"def _compile_cmp\("),
  "drivers/emu/ptx_float.py": (r"(F32|F16|BF16)_NAN = ", r"def (f16|bf16)_bits_to_f32\(", r"def f32_to_bf16_bits\(",
                               r"def f64_to_f32_odd\(", r"def to_b?f16_bits\(", r"def fminmax\("),
  "drivers/emu/ptx_exec.py": (r"(NP|UINT|SINT) = ", r"def h_minmax\(", r"(_INT_CMP|_FLOAT_CMP|_BOOL) = ", r"def _compare\(",
                              r"def h_setp\(", r"def h_testp\(", r"def _float_to_float\(", r"def _sat_float\(",
                              r"def _float_to_int\(", r"def _int_to_float\(", r"def _int_to_float_exact\(",
                              r"def _int_to_int\(", r"def h_cvt\("),
}
DEFAULT_TESTS = (("drivers/amd/", "tests/amd"), ("drivers/nv/", "tests/nv"), ("drivers/emu/", "tests/emu"))
PYTEST_FLAGS = ("-x", "-q", "-p", "no:cacheprovider")

CMP_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
ARITH_SWAPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
               ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&")}
C_TYPE_SWAPS = {"uint8_t": "uint16_t", "uint16_t": "uint32_t", "uint32_t": "uint64_t", "uint64_t": "uint32_t",
                "int8_t": "int16_t", "int16_t": "int32_t", "int32_t": "int64_t", "int64_t": "int32_t",
                "char": "uint16_t", "int": "int64_t"}
C_TYPE = re.compile(r"\b(u?int(?:8|16|32|64)_t|char|int)\b")
C_ARRAY_SIZE = re.compile(r"\[\s*(\d+)\s*\]")
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


@dataclass(frozen=True)
class Mutant:
  file: str          # path relative to the repository
  line: int          # 1-based line and column (characters) of the changed token
  col: int
  kind: str
  start: int         # the replaced span, as character offsets into the file's text
  end: int
  original: str
  replacement: str
  detail: str        # what changes, for people: "'0x10' -> '0x11'", "'0x10' <-> '0x15'"

  @property
  def id(self) -> str: return f"{self.file}:{self.line}:{self.col}:{self.kind}"

  def apply(self, source: str) -> str:
    assert source[self.start:self.end] == self.original, f"{self.id}: the file changed since the mutants were made"
    return source[:self.start] + self.replacement + source[self.end:]


# ---- generation ----

class _Text:
  """Offsets in one source text: (line, column) of ast (UTF-8 bytes) or tokenize (characters) -> character offset."""

  def __init__(self, source: str):
    self.source = source
    self.lines = io.StringIO(source, newline="").readlines() or [""]
    self.starts = [0]
    for line in self.lines: self.starts.append(self.starts[-1] + len(line))

  def from_ast(self, lineno: int, byte_col: int) -> int:
    line = self.lines[lineno - 1]
    return self.starts[lineno - 1] + len(line.encode()[:byte_col].decode(errors="replace"))

  def from_token(self, row_col: tuple[int, int]) -> int: return self.starts[row_col[0] - 1] + row_col[1]

  def span(self, node: ast.AST) -> tuple[int, int]:
    return self.from_ast(node.lineno, node.col_offset), self.from_ast(node.end_lineno, node.end_col_offset)

  def line_col(self, offset: int) -> tuple[int, int]:
    i = bisect.bisect_right(self.starts, offset) - 1
    return i + 1, offset - self.starts[i] + 1


def int_variants(n: int) -> list[tuple[str, int]]:
  """The mutants of an integer literal n >= 0: n+1, and n-1 for big or odd n, else n with bit 1 flipped."""
  return [("int+1", n + 1), ("int-1", n - 1) if n >= 256 or n & 1 else ("int^2", n ^ 2)]


def format_int(text: str, value: int) -> str:
  """`value` written like the literal `text` (same base, hex letter case and zero padding)."""
  digits = text[2:].replace("_", "")
  base = text[:2].lower()
  if base in ("0x", "0b", "0o"):
    s = format(value, {"0x": "x", "0b": "b", "0o": "o"}[base]).rjust(len(digits), "0")
    return text[:2] + (s if re.search(r"[a-f]", digits) else s.upper())
  return str(value)


def _is_int(node) -> bool: return isinstance(node, ast.Constant) and type(node.value) is int


def _swappable(node, in_dict: bool) -> bool:
  if _is_int(node) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_int(node.operand)):
    return True
  return in_dict and (isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)))


def _in_fstring(tree: ast.AST) -> set[int]:
  """ids of the nodes inside f-strings (their positions are not reliable before Python 3.12)."""
  return {id(n) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}


def _regions(tree: ast.Module, text: _Text, patterns) -> list[tuple[int, int]]:
  """Character spans of the top-level statements whose first line matches one of `patterns`."""
  spans = []
  for stmt in tree.body:
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    head = text.lines[stmt.lineno - 1]
    if any(re.match(p, head) for p in patterns):
      spans.append((text.starts[first - 1], text.starts[stmt.end_lineno]))
  return spans


def generate(source: str, file: str, regions=None) -> list[Mutant]:
  """Every mutant of one file's source, in a deterministic order; `regions`: patterns of the top-level statements
  to mutate (None: the whole file)."""
  text, tree = _Text(source), ast.parse(source)
  skip = _in_fstring(tree)
  tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.OP]
  token_starts = [text.from_token(t.start) for t in tokens]
  found: list[tuple[int, int, str, str, str]] = []     # (start, end, kind, replacement, detail)

  def op_between(lo: int, hi: int, symbol: str):
    for i in range(bisect.bisect_left(token_starts, lo), len(tokens)):
      if token_starts[i] >= hi: break
      if tokens[i].string == symbol: return token_starts[i]
    return None

  for node in ast.walk(tree):
    if id(node) in skip: continue
    if _is_int(node) and node.value >= 0:
      start, end = text.span(node)
      for kind, value in int_variants(node.value):
        new = format_int(source[start:end], value)
        found.append((start, end, kind, new, f"{source[start:end]!r} -> {new!r}"))
    elif isinstance(node, (ast.Dict, ast.Tuple, ast.List)):
      items = node.values if isinstance(node, ast.Dict) else node.elts
      for a, b in zip(items, items[1:]):
        if not (a is not None and b is not None and _swappable(a, isinstance(node, ast.Dict)) and
                _swappable(b, isinstance(node, ast.Dict))): continue
        (a0, a1), (b0, b1) = text.span(a), text.span(b)
        if source[a0:a1] != source[b0:b1]:
          found.append((a0, b1, "swap", source[b0:b1] + source[a1:b0] + source[a0:a1],
                        f"{source[a0:a1]!r} <-> {source[b0:b1]!r}"))
    elif isinstance(node, ast.Compare):
      left = node.left
      for op, right in zip(node.ops, node.comparators):
        if type(op) in CMP_FLIPS:
          symbol, new = CMP_FLIPS[type(op)]
          pos = op_between(text.span(left)[1], text.span(right)[0], symbol)
          if pos is not None: found.append((pos, pos + len(symbol), "cmp", new, f"{symbol!r} -> {new!r}"))
        left = right
    elif isinstance(node, ast.BinOp) and type(node.op) in ARITH_SWAPS:
      symbol, new = ARITH_SWAPS[type(node.op)]
      pos = op_between(text.span(node.left)[1], text.span(node.right)[0], symbol)
      if pos is not None: found.append((pos, pos + len(symbol), "arith", new, f"{symbol!r} -> {new!r}"))
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cdef" and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      found.extend(_cdef_mutants(source, text, node.args[0]))

  spans = _regions(tree, text, regions) if regions is not None else None
  out = []
  for start, end, kind, replacement, detail in sorted(set(found), key=lambda f: (f[0], f[2], f[1], f[3])):
    if spans is not None and not any(lo <= start < hi for lo, hi in spans): continue
    line, col = text.line_col(start)
    out.append(Mutant(file, line, col, kind, start, end, source[start:end], replacement, detail))
  return out


def _cdef_mutants(source: str, text: _Text, node: ast.Constant):
  """Field types and array sizes inside a cffi cdef string written without escapes (outside C comments)."""
  start, end = text.span(node)
  literal = source[start:end]
  quote = next((q for q in ('"""', "'''", '"', "'") if literal.startswith(q) and literal.endswith(q)), None)
  if quote is None or literal[len(quote):len(literal) - len(quote)] != node.value: return []
  body, base = node.value, start + len(quote)
  comments = [m.span() for m in C_COMMENT.finditer(body)]
  def in_comment(i): return any(lo <= i < hi for lo, hi in comments)
  out = []
  for m in C_TYPE.finditer(body):
    if not in_comment(m.start()):
      out.append((base + m.start(), base + m.end(), "ctype", C_TYPE_SWAPS[m[1]], f"{m[1]!r} -> {C_TYPE_SWAPS[m[1]]!r}"))
  for m in C_ARRAY_SIZE.finditer(body):
    if in_comment(m.start()): continue
    for kind, value in int_variants(int(m[1])):
      out.append((base + m.start(1), base + m.end(1), kind, str(value), f"{m[1]!r} -> {str(value)!r}"))
  return out


def collect(repo: Path, files, regions: dict | None = None) -> tuple[list[Mutant], dict[str, str]]:
  """The mutants of `files` and the sources they were made from (what a run patches in)."""
  sources = {f: (repo / f).read_text() for f in files}
  return [m for f in files for m in generate(sources[f], f, (regions or {}).get(f))], sources


# ---- running ----

def repository_files(repo: Path) -> list[str]:
  """Tracked and untracked-but-not-ignored files (git), else every file outside dot-directories and caches."""
  try:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode()
    names = sorted({n for n in out.split("\0") if n})
  except (OSError, subprocess.CalledProcessError):
    names = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() and not any(
      part.startswith(".") or part == "__pycache__" or part.endswith(".egg-info") for part in p.relative_to(repo).parts))
  return [n for n in names if (repo / n).is_file()]


def namespace(repo: Path) -> str | None:
  """The namespace pyproject maps the top-level folders into (`baregrad` for {"baregrad.tensor" = "tensor", ...})."""
  import tomllib
  try: package_dir = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
  except (OSError, KeyError, tomllib.TOMLDecodeError): return None
  names = {key.rpartition(".")[0] for key, folder in package_dir.items() if key.rpartition(".")[2] == folder}
  return names.pop() if len(names) == 1 and "" not in names else None


class Copy:
  """A private copy of the repository that one job patches and tests in."""

  def __init__(self, repo: Path, files: list[str], work: Path):
    ns = namespace(repo)
    self.root = work / ns if ns else work / "repo"
    for name in files:
      (self.root / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(repo / name, self.root / name)
    (work / "cache").mkdir(mode=0o700)
    # children inherit this process's environment through `env`, with these set on top; byte code is cached in the
    # copy (`write` drops a patched file's .pyc)
    self.env = ["env", f"PYTHONPATH={work if ns else self.root}", "PYTHONDONTWRITEBYTECODE=",
                f"BAREGRAD_CACHE={work / 'cache'}", f"XDG_CACHE_HOME={work / 'cache'}", "THREADS=1", "OMP_NUM_THREADS=1",
                "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"]
    self.process: subprocess.Popen | None = None
    self.lock, self.stopped = threading.Lock(), False

  def write(self, file: str, source: str):
    path = self.root / file
    path.write_text(source)
    # a .pyc of the same size and mtime second would be taken for the new source: drop it
    for pyc in [*path.parent.glob(f"__pycache__/{path.stem}.*.pyc"), Path(importlib.util.cache_from_source(str(path)))]:
      pyc.unlink(missing_ok=True)

  def run_tests(self, tests: list[str], timeout: float | None) -> tuple[str, float, str]:
    """("passed" | "failed" | "timeout", seconds, the output's tail)."""
    t0 = time.monotonic()
    with self.lock:
      if self.stopped: raise KeyboardInterrupt("the run was stopped")
      self.process = subprocess.Popen([*self.env, sys.executable, "-m", "pytest", *tests, *PYTEST_FLAGS],
                                      cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True)
    try:
      out, _ = self.process.communicate(timeout=timeout)
      status = "passed" if self.process.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
      self.kill(stop=False)
      out, _ = self.process.communicate()
      status = "timeout"
    if self.stopped: raise KeyboardInterrupt("the run was stopped")
    return status, time.monotonic() - t0, out.decode(errors="replace")[-3000:]

  def kill(self, stop: bool = True):
    """Kill the running pytest and every process it started (its own session); `stop`: start no other."""
    with self.lock:
      self.stopped |= stop
      if (p := self.process) is not None and p.poll() is None:
        try: os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError: pass


@dataclass
class Result:
  mutant: Mutant
  status: str       # killed | survived | timeout
  seconds: float
  output: str       # the tail of pytest's output


class BaselineError(RuntimeError):
  pass


def parse_tests(specs: list[str]) -> list[tuple[str, list[str]]]:
  """`--tests` values -> [(file prefix, pytest arguments)]: "PREFIX=ARGS" for the files under PREFIX, "ARGS" for all."""
  out = []
  for spec in specs:
    prefix, eq, rest = spec.partition("=")
    is_prefix = eq and not prefix.startswith("-") and not re.search(r"\s|::", prefix)   # not `-k a=b`, a node ID
    out.append((prefix, shlex.split(rest)) if is_prefix else ("", shlex.split(spec)))
  return out


def tests_for(file: str, tests: list[tuple[str, list[str]]] | None = None) -> list[str]:
  """The pytest arguments that judge a mutant of `file`: the first `tests` entry whose prefix it starts with, else
  DEFAULT_TESTS by folder, else tests/."""
  for prefix, args in list(tests or []) + [(p, [t]) for p, t in DEFAULT_TESTS]:
    if file.startswith(prefix): return args
  return ["tests"]


def run(repo: Path, mutants: list[Mutant], sources: dict[str, str], tests: list[tuple[str, list[str]]] | None = None,
        jobs: int = 1, timeout: float | None = None, log=print) -> tuple[list[Result], dict]:
  """Run every mutant (made from `sources`, file -> text); (results in mutant order, baseline seconds per test
  subset). Raises BaselineError when the unmutated tests fail in a copy."""
  repo = repo.resolve()
  files = repository_files(repo)
  subsets = {tuple(tests_for(m.file, tests)) for m in mutants}
  originals = {f: sources[f] for f in {m.file for m in mutants}}
  with tempfile.TemporaryDirectory(prefix="baregrad-mutate-") as tmp:
    copies = [Copy(repo, files, Path(tmp) / f"job{j}") for j in range(max(1, min(jobs, len(mutants) or 1)))]
    for c in copies:
      for f, source in originals.items(): c.write(f, source)
    baseline: dict[tuple, float] = {}

    def check(copy: Copy):
      for subset in sorted(subsets):
        status, seconds, out = copy.run_tests(list(subset), None)
        if status != "passed":
          raise BaselineError(f"the unmutated tests fail, so no mutant can be judged: `pytest {' '.join(subset)}` in "
                              f"a copy of {repo} ({copy.root}):\n{out}\nFix them (or choose others with --tests) first.")
        baseline[subset] = max(baseline.get(subset, 0.0), seconds)

    free: Queue = Queue()
    for c in copies: free.put(c)
    results: list[Result | None] = [None] * len(mutants)
    done = [0]
    lock = threading.Lock()

    def one(i: int):
      m, copy = mutants[i], free.get()
      try:
        subset = tuple(tests_for(m.file, tests))
        limit = timeout if timeout is not None else 3 * baseline[subset] + 30
        copy.write(m.file, m.apply(originals[m.file]))
        status, seconds, output = copy.run_tests(list(subset), limit)
        copy.write(m.file, originals[m.file])
        results[i] = Result(m, {"passed": "survived", "failed": "killed"}.get(status, status), seconds, output)
        with lock:
          done[0] += 1
          left = (time.monotonic() - t0) / done[0] * (len(mutants) - done[0])
          log(f"[{done[0]}/{len(mutants)}] {results[i].status:8s} {m.id} {m.detail} ({seconds:.1f}s, "
              f"{left / 60:.0f} min left)")
      finally:
        free.put(copy)

    pool = ThreadPoolExecutor(len(copies))
    try:
      for f in [pool.submit(check, c) for c in copies]: f.result()
      for subset, seconds in sorted(baseline.items()): log(f"baseline: pytest {' '.join(subset)} passed in {seconds:.1f}s")
      t0 = time.monotonic()
      for f in [pool.submit(one, i) for i in range(len(mutants))]: f.result()
    except BaseException:
      pool.shutdown(wait=False, cancel_futures=True)
      for c in copies: c.kill()
      raise
    finally:
      pool.shutdown(wait=True)
  return [r for r in results if r is not None], baseline


# ---- report ----

def _lines(source: str, m: Mutant, mutated: bool) -> list[str]:
  """The whole lines the mutant touches, before or after it."""
  text, end = (m.apply(source), m.start + len(m.replacement)) if mutated else (source, m.end)
  first = text.rfind("\n", 0, m.start) + 1
  last = text.find("\n", max(end - 1, m.start))
  return text[first:last if last >= 0 else None].split("\n")


def report(results: list[Result], sources: dict[str, str], header: list[str]) -> str:
  """The markdown report: a table per file and every survivor with its original and mutated line."""
  lines = ["# Mutation testing report", "", *header, "",
           "| file | mutants | killed | timeout | survived | survival % |", "|---|---:|---:|---:|---:|---:|"]
  files = list(dict.fromkeys(r.mutant.file for r in results))
  def row(name, rs):
    n = len(rs); count = {s: sum(r.status == s for r in rs) for s in ("killed", "timeout", "survived")}
    pct = f"{100 * count['survived'] / n:.1f}" if n else "-"
    return f"| {name} | {n} | {count['killed']} | {count['timeout']} | {count['survived']} | {pct} |"
  lines += [row(f, [r for r in results if r.mutant.file == f]) for f in files]
  lines += [row("**all**", results), ""]
  for f in files:
    survivors = [r.mutant for r in results if r.mutant.file == f and r.status == "survived"]
    if not survivors: continue
    lines += [f"## Survivors in {f} ({len(survivors)})", ""]
    for m in survivors:
      lines += [f"- `{m.id}` {m.detail}", "  ```diff", *[f"  -{line}" for line in _lines(sources[f], m, False)],
                *[f"  +{line}" for line in _lines(sources[f], m, True)], "  ```"]
    lines.append("")
  timeouts = [r.mutant for r in results if r.status == "timeout"]
  if timeouts: lines += ["## Timeouts (counted as killed)", "", *[f"- `{m.id}` {m.detail}" for m in timeouts], ""]
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python tests/mutate.py", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target", choices=("tables", "emu"), default="tables",
                      help="tables: the hardware tables (default); emu: the emulators' compare/min/max/class/convert code")
  parser.add_argument("--files", nargs="+", help="mutate these files (relative to the repository), all of each")
  parser.add_argument("--tests", action="append", metavar="[PREFIX=]ARGS",
                      help="pytest arguments (one string) for the mutants of every file, or of the files under PREFIX "
                           "(repeatable; default: by folder, see above)")
  parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
  parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 3x the unmutated run + 30)")
  parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
  parser.add_argument("--only", action="append", metavar="ID", help="run only this mutant (repeatable)")
  parser.add_argument("--report", metavar="PATH", help="also write the report there (markdown)")
  parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.jobs < 1: parser.error(f"--jobs {args.jobs}: give 1 or more")
  if args.timeout is not None and args.timeout <= 0: parser.error(f"--timeout {args.timeout}: give seconds > 0")

  files, regions = (args.files, None) if args.files else \
    (list(TABLE_FILES), None) if args.target == "tables" else (list(EMU_REGIONS), EMU_REGIONS)
  missing = [f for f in files if not (args.repo / f).is_file()]
  if missing: parser.error(f"no such file in {args.repo}: {', '.join(missing)}")
  mutants, sources = collect(args.repo, files, regions)
  if args.only:
    by_id = {m.id: m for m in mutants}
    unknown = [i for i in args.only if i not in by_id]
    if unknown: parser.error(f"no mutant {', '.join(unknown)} (--list shows the IDs)")
    mutants = [by_id[i] for i in dict.fromkeys(args.only)]
  if args.list:
    for m in mutants: print(f"{m.id}  {m.detail}")
    print(f"{len(mutants)} mutants", file=sys.stderr)
    return 0

  tests = parse_tests(args.tests) if args.tests else None
  t0 = time.monotonic()
  try:
    results, baseline = run(args.repo, mutants, sources, tests, args.jobs, args.timeout,
                            log=lambda line: print(line, file=sys.stderr, flush=True))
  except BaselineError as e:
    print(f"mutate: {e}", file=sys.stderr)
    return 2
  wall = time.monotonic() - t0
  if args.only:     # a few mutants asked for by name: show what the tests said
    for r in results: print(f"---- {r.mutant.id} {r.mutant.detail}: {r.status}\n{r.output}", file=sys.stderr)
  mutated = list(dict.fromkeys(m.file for m in mutants))
  header = [f"Files: {', '.join(mutated)}" + (" (the table-like parts, EMU_REGIONS)" if regions else ""),
            "Tests: " + "; ".join(f"`pytest {' '.join(s)} {' '.join(PYTEST_FLAGS)}` ({sec:.0f}s unmutated)"
                                  for s, sec in sorted(baseline.items())),
            f"Jobs: {args.jobs}, timeout per mutant: " + (f"{args.timeout:.0f}s" if args.timeout else "3x unmutated + 30s")
            + f", wall time {wall / 60:.1f} min"]
  text = report(results, sources, header)
  print(text)
  if args.report: Path(args.report).write_text(text + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
