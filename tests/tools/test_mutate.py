"""tests/mutate.py, the mutation tester: the mutants it makes and how it judges them (on a tiny synthetic package)."""
import io, textwrap, tokenize
from pathlib import Path
import pytest
import mutate     # tests/mutate.py (tests/ is on sys.path: conftest.py)

SOURCE = textwrap.dedent('''\
  """A module docstring with 256 and 0x10 in it."""
  import cffi
  TABLE = {"a": 0x1F, "b": 3, "c": 3}     # a comment with 7
  PAIR = (21, 16)
  WORDS = [5, 0b101]
  ffi = cffi.FFI()
  ffi.cdef("""
  typedef struct { uint32_t a; uint8_t b[4]; } s_t;   /* 8 bytes: uint64_t in a comment */
  """)


  def f(x):
    """A docstring with 42."""
    y = (x + 1) << 2
    return y if x < 5 and y != 0 else f"{x + 3:08b}" + str(9)
  ''')


def _tokens(source):
  return [(t.type, t.string, t.start) for t in tokenize.generate_tokens(io.StringIO(source).readline)]


def test_every_int_literal_gets_mutants_and_nothing_else_does():
  mutants = mutate.generate(SOURCE, "m.py")
  assert [m.id for m in mutants] == [m.id for m in mutate.generate(SOURCE, "m.py")]    # deterministic
  assert len({m.id for m in mutants}) == len(mutants)
  # every NUMBER token (an f-string is one STRING token: its insides are not mutated) and the cdef's array size
  numbers = {t[2] for t in _tokens(SOURCE) if t[0] == tokenize.NUMBER}
  assert len(numbers) == 12
  assert {(m.line, m.col - 1) for m in mutants if m.kind.startswith("int")} == numbers | {(8, 39)}
  assert all(sum(m.line == line and m.col - 1 == col for m in mutants if m.kind.startswith("int")) == 2
             for line, col in numbers)
  assert {m.line for m in mutants}.isdisjoint({1, 13})                       # docstrings
  assert not any(m.line == 8 and m.col > 50 for m in mutants)                # a C comment
  details = {(m.line, m.kind, m.detail) for m in mutants}
  assert {(3, "int+1", "'0x1F' -> '0x20'"), (3, "int-1", "'0x1F' -> '0x1E'"), (4, "int^2", "'16' -> '18'"),
          (5, "int-1", "'0b101' -> '0b100'"), (3, "swap", "'0x1F' <-> '3'"), (4, "swap", "'21' <-> '16'"),
          (14, "arith", "'+' -> '-'"), (14, "arith", "'<<' -> '>>'"), (15, "cmp", "'<' -> '<='"),
          (15, "cmp", "'!=' -> '=='"), (15, "arith", "'+' -> '-'"), (8, "ctype", "'uint32_t' -> 'uint64_t'"),
          (8, "ctype", "'uint8_t' -> 'uint16_t'")} <= details
  assert (3, "swap", "'3' <-> '3'") not in details                          # an identical pair is no mutant
  assert sum(m.kind == "arith" and m.line == 15 for m in mutants) == 1      # not the + inside the f-string
  for m in mutants:
    before, after = _tokens(SOURCE), _tokens(m.apply(SOURCE))
    changed = [(a, b) for a, b in zip(before, after) if a[:2] != b[:2]]
    if m.line == 8:     # inside the cdef string: one token of Python, one word of C
      assert len(changed) == 1 and changed[0][0][1].replace(m.original, m.replacement, 1) == changed[0][1][1], m.id
      continue
    assert len(before) == len(after) and len(changed) == (2 if m.kind == "swap" else 1), m.id
    assert changed[0][0][2] == (m.line, m.col - 1), m.id


def test_regions_limit_the_mutants_to_matching_top_level_statements():
  mutants = mutate.generate(SOURCE, "m.py", regions=[r"PAIR = ", r"def f\("])
  assert {m.line for m in mutants} == {4, 14, 15}


def test_int_variants_and_formatting():
  assert mutate.int_variants(0) == [("int+1", 1), ("int^2", 2)]
  assert mutate.int_variants(7) == [("int+1", 8), ("int-1", 6)]
  assert mutate.int_variants(0x400) == [("int+1", 0x401), ("int-1", 0x3FF)]
  assert mutate.format_int("0x00FF", 0x100) == "0x0100" and mutate.format_int("0xff", 0x100) == "0x100"
  assert mutate.format_int("0x1_000", 0xFFF) == "0x0FFF" and mutate.format_int("12", 13) == "13"


# ---- runs, on a tiny package laid out like this repository ----

PACKAGE = {
  "pyproject.toml": '[tool.setuptools]\npackage-dir = {"mutpkg.core" = "core"}\n',
  "core/__init__.py": "",
  "core/table.py": "CHECKED = 7\nUNCHECKED = 9\n",
  "tests/test_table.py": "from mutpkg.core import table\n\ndef test_checked():\n  assert table.CHECKED == 7\n",
}


def _package(tmp_path: Path, files: dict) -> Path:
  repo = tmp_path / "repo"
  for name, text in files.items():
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(text)
  return repo


def test_a_checked_literal_is_killed_an_unchecked_one_survives(tmp_path):
  repo = _package(tmp_path, PACKAGE)
  mutants, sources = mutate.collect(repo, ["core/table.py"])
  assert [m.id for m in mutants] == ["core/table.py:1:11:int+1", "core/table.py:1:11:int-1",
                                     "core/table.py:2:13:int+1", "core/table.py:2:13:int-1"]
  results, baseline = mutate.run(repo, mutants, sources, [("", ["tests"])], jobs=2, log=lambda line: None)
  assert [r.status for r in results] == ["killed", "killed", "survived", "survived"]
  assert list(baseline) == [("tests",)]
  assert (repo / "core/table.py").read_text() == PACKAGE["core/table.py"]      # the repository is never written
  text = mutate.report(results, sources, [])
  assert "| core/table.py | 4 | 2 | 0 | 2 | 50.0 |" in text
  assert "`core/table.py:2:13:int+1` '9' -> '10'" in text and "  -UNCHECKED = 9\n  +UNCHECKED = 10" in text


def test_a_mutant_that_hangs_is_a_timeout_and_a_failing_baseline_stops_the_run(tmp_path):
  repo = _package(tmp_path, {**PACKAGE, "tests/test_table.py": "import time\nfrom mutpkg.core import table\n\n"
                             "def test_checked():\n  if table.CHECKED != 7: time.sleep(60)\n"})
  mutants, sources = mutate.collect(repo, ["core/table.py"])
  results, _ = mutate.run(repo, mutants[:1], sources, [("", ["tests"])], timeout=2, log=lambda line: None)
  assert [r.status for r in results] == ["timeout"]
  (repo / "tests/test_table.py").write_text("def test_broken():\n  assert False\n")
  with pytest.raises(mutate.BaselineError, match="the unmutated tests fail"):
    mutate.run(repo, mutants[:1], sources, [("", ["tests"])], log=lambda line: None)


def test_tests_option_by_prefix():
  tests = mutate.parse_tests(["drivers/amd/=tests/amd/test_kfd.py -k pm4", "-k 'not slow'"])
  assert mutate.tests_for("drivers/amd/pm4.py", tests) == ["tests/amd/test_kfd.py", "-k", "pm4"]
  assert mutate.tests_for("drivers/nv/qmd.py", tests) == ["-k", "not slow"]
  assert mutate.tests_for("drivers/nv/qmd.py") == ["tests/nv"] and mutate.tests_for("drivers/emu/x.py") == ["tests/emu"]
  assert mutate.tests_for("tensor/tensor.py") == ["tests"]
