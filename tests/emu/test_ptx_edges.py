"""The PTX interpreter (drivers/emu/ptx.py) at the edges: NaN (quiet and signalling, with payloads), +-inf, +-0 and
subnormal operands, `.ftz`, every `setp` comparison, the rounding modes of `cvt` and of add/sub/fma (the sign of an
exact zero), against references written here from NVIDIA's "PTX ISA" (8.x) instruction descriptions, exact
rationals and numpy. Plus the rendered PTX of real kernels (compiler/render_ptx.py) checked for the rounding
qualifiers the semantics need.

Why the qualifier check, and not an interpreter that fuses: PTX ISA, `add` (and `mul`, `sub`): "An add instruction
with no rounding modifier defaults to round-to-nearest-even and may be optimized aggressively by the code optimizer.
In particular, mul/add sequences with no rounding modifiers may be optimized to use fused-multiply-add instructions
on the target device", while one with an explicit modifier is not contracted. Whether ptxas fuses a given unmarked
pair is its choice, not a rule the interpreter could copy; and the CPU device the interpreted kernels are compared
with is built with contraction itself (gcc -O3 -march=native). So the rule is checked where it lives: every float
add/sub/mul the renderer emits carries `.rn`, and (where nvdisasm is installed) ptxas's SASS for such kernels has no
FFMA the PTX did not ask for."""
import itertools, math, re, shutil, subprocess, sys, tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from test_ptx_interp import elementwise, round_fraction
import rdna3_reference as ref        # float formats and edge values (no emulator code)

F32 = ref.SPECIALS["f32"] + [0x00400000, 0x80000100, 0x3F000000, 0xBF000000, 0x3FC00000, 0xBFC00000, 0x4B000001,
                             0x3EFFFFFF, 0x7F7FFFFF, 0x1E3CE508, 0x9E3CE508]
F64 = ref.SPECIALS["f64"] + [0x3FE0000000000000, 0xBFE0000000000000, 0x3FF8000000000000, 0xC004000000000000,
                             0x7FEFFFFFFFFFFFFF, 0x47EFFFFFF0000000, 0x36A0000000000000, 0x3690000000000000,
                             0xB6A8000000000000, 0x3FF0000010000000]


def f32s(bits) -> np.ndarray: return np.array(bits, np.uint64).astype(np.uint32).view(np.float32)
def f64s(bits) -> np.ndarray: return np.array(bits, np.uint64).view(np.float64)


def flush(v: float, t: str = "f32") -> float:
  """`.ftz`: a subnormal becomes the zero of its sign (PTX ISA, "Floating-Point Instructions": .ftz)."""
  tiny = float(np.finfo(np.float32 if t == "f32" else np.float64).tiny)
  return math.copysign(0.0, v) if v != 0 and abs(v) < tiny else v


def same_float(got: float, want: float) -> bool:
  """Equal values with equal signs of zero; any NaN matches any NaN."""
  if math.isnan(want): return math.isnan(got)
  return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def check(got, want, cases, what):
  bad = [(c, g, w) for c, g, w in zip(cases, got, want) if not same_float(float(g), float(w))]
  assert not bad, f"{what}: {len(bad)} of {len(got)} differ; (inputs, got, want): {bad[:6]}"


# =============================================================================================
# min / max: a NaN operand gives the other one, both NaN (or .NaN and either) give NaN, +0.0 > -0.0, .ftz
# =============================================================================================

def ptx_minmax(x: float, y: float, is_max: bool, nan_mode: bool, ftz: bool) -> float:
  """PTX ISA, `min` / `max` (Floating-Point Instructions): semantics as listed there, and "If values of both inputs
  are 0.0, then +0.0 > -0.0"; `.ftz` flushes subnormal inputs and results to sign-preserving zero."""
  if ftz: x, y = flush(x), flush(y)
  if math.isnan(x) and math.isnan(y): return math.nan
  if nan_mode and (math.isnan(x) or math.isnan(y)): return math.nan
  if math.isnan(x): return y
  if math.isnan(y): return x
  if x == y == 0: return (x if math.copysign(1, x) > 0 else y) if is_max else (x if math.copysign(1, x) < 0 else y)
  return (max if is_max else min)(x, y)


@pytest.mark.parametrize("mods", ["", ".ftz", ".NaN", ".ftz.NaN"])
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_f32(op, mods):
  a, b = (f32s(v) for v in zip(*itertools.product(F32, repeat=2)))
  got = elementwise(f"{op}{mods}.f32 {{d}}, {{a0}}, {{a1}};", "f32", ["f32", "f32"], [a, b], np.float32)
  want = [ptx_minmax(float(x), float(y), op == "max", ".NaN" in mods, ".ftz" in mods) for x, y in zip(a, b)]
  check(got, want, list(zip(a, b)), f"{op}{mods}.f32")


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_f64(op):
  a, b = (f64s(v) for v in zip(*itertools.product(F64, repeat=2)))
  got = elementwise(f"{op}.f64 {{d}}, {{a0}}, {{a1}};", "f64", ["f64", "f64"], [a, b], np.float64)
  want = [ptx_minmax(float(x), float(y), op == "max", False, False) for x, y in zip(a, b)]
  check(got, want, list(zip(a, b)), f"{op}.f64")


@pytest.mark.parametrize("mods", ["", ".NaN"])
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_f16(op, mods):
  bits = list(zip(*itertools.product(ref.SPECIALS["f16"], repeat=2)))
  a, b = (np.array(v, np.uint16) for v in bits)
  got = elementwise(f"{op}{mods}.f16 {{d}}, {{a0}}, {{a1}};", "b16", ["b16", "b16"], [a, b], np.uint16).view(np.float16)
  x, y = a.view(np.float16), b.view(np.float16)
  want = [ptx_minmax(float(u), float(v), op == "max", bool(mods), False) for u, v in zip(x, y)]
  check(got, want, list(zip(x, y)), f"{op}{mods}.f16")


# =============================================================================================
# setp: ordered comparisons are false on NaN, the unordered ones (equ neu ltu leu gtu geu) true, num / nan
# =============================================================================================

ORDERED = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
           "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y}


def ptx_setp(cmp: str, x: float, y: float) -> bool:
  """PTX ISA, "Floating Point Comparisons": eq..ge are false if either operand is NaN; equ..geu are true if either
  is NaN and otherwise the ordered comparison; num: neither is NaN; nan: either is."""
  unordered = math.isnan(x) or math.isnan(y)
  if cmp == "num": return not unordered
  if cmp == "nan": return unordered
  if cmp.endswith("u"): return unordered or ORDERED[cmp[:-1]](x, y)
  return not unordered and ORDERED[cmp](x, y)


SETP = ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"]


@pytest.mark.parametrize("t", ["f32", "f32.ftz", "f64"])
@pytest.mark.parametrize("cmp", SETP)
def test_setp_every_comparison(cmp, t):
  ftz = t.endswith("ftz")
  base = t.split(".")[0]
  vals = F32 if base == "f32" else F64
  a, b = ((f32s if base == "f32" else f64s)(v) for v in zip(*itertools.product(vals, repeat=2)))
  mods = ".ftz" if ftz else ""
  got = elementwise(f"setp.{cmp}{mods}.{base} %p1, {{a0}}, {{a1}}; selp.u32 {{d}}, 1, 0, %p1;", "u32", [base, base],
                    [a, b], np.uint32)
  want = [int(ptx_setp(cmp, flush(float(x)) if ftz else float(x), flush(float(y)) if ftz else float(y)))
          for x, y in zip(a, b)]
  bad = [(x, y, int(g), w) for x, y, g, w in zip(a, b, got, want) if g != w]
  assert not bad, f"setp.{cmp}{mods}.{base}: {len(bad)} differ; (a, b, got, want): {bad[:6]}"


def test_testp_classes():
  # PTX ISA, `testp`: finite, infinite, number, notanumber, normal, subnormal (zero is neither normal nor subnormal)
  a = f32s(F32)
  tiny = float(np.finfo(np.float32).tiny)
  refs = {"finite": math.isfinite, "infinite": math.isinf, "number": lambda v: not math.isnan(v),
          "notanumber": math.isnan, "normal": lambda v: math.isfinite(v) and abs(v) >= tiny,
          "subnormal": lambda v: v != 0 and abs(v) < tiny}
  for kind, fn in refs.items():
    got = elementwise(f"testp.{kind}.f32 %p1, {{a0}}; selp.u32 {{d}}, 1, 0, %p1;", "u32", ["f32"], [a], np.uint32)
    assert got.tolist() == [int(fn(float(v))) for v in a], kind


# =============================================================================================
# the sign of an exact zero: +0 in every rounding mode but .rm, where it is -0; x + x keeps x's sign
# =============================================================================================

def zero_sum(x: float, y: float, mode: str) -> float:
  """IEEE 754-2008, 6.3 (PTX's add/sub/fma are IEEE operations with the given rounding): the exact sum x + y is
  zero; operands of opposite signs (or x - x) give +0, but -0 when rounding toward -inf (.rm); two zeros of the
  same sign give that zero."""
  if x == 0 and y == 0 and math.copysign(1, x) == math.copysign(1, y): return x
  return -0.0 if mode == "rm" else 0.0


ZERO_PAIRS = [(1.0, -1.0), (-1.0, 1.0), (0.0, -0.0), (-0.0, 0.0), (0.0, 0.0), (-0.0, -0.0), (2.5, -2.5),
              (1e-45, -1e-45), (-3.4028235e38, 3.4028235e38)]


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_exact_zero_sums_take_the_rounding_modes_sign(mode):
  x, y = (np.array(v, np.float32) for v in zip(*ZERO_PAIRS))
  got = elementwise(f"add.{mode}.f32 {{d}}, {{a0}}, {{a1}};", "f32", ["f32", "f32"], [x, y], np.float32)
  check(got, [zero_sum(float(a), float(b), mode) for a, b in zip(x, y)], ZERO_PAIRS, f"add.{mode}.f32")
  got = elementwise(f"sub.{mode}.f32 {{d}}, {{a0}}, {{a1}};", "f32", ["f32", "f32"], [x, -y], np.float32)
  check(got, [zero_sum(float(a), float(b), mode) for a, b in zip(x, y)], ZERO_PAIRS, f"sub.{mode}.f32")
  # fma: the product (with its sign, also when zero) plus c
  p, q, c = (np.array(v, np.float32) for v in zip(*[(2.0, 3.0, -6.0), (-2.0, 3.0, 6.0), (0.0, 5.0, -0.0),
                                                    (0.0, -5.0, -0.0), (0.0, 5.0, 0.0), (-0.0, 5.0, 0.0),
                                                    (1e-30, 1e-30, 0.0)]))
  got = elementwise(f"fma.{mode}.f32 {{d}}, {{a0}}, {{a1}}, {{a2}};", "f32", ["f32"] * 3, [p, q, c], np.float32)
  want = []
  for a, b, z in zip(p, q, c):
    prod = float(a) * float(b)
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(z))
    want.append(zero_sum(prod, float(z), mode) if exact == 0 else round_fraction(exact, "f32", mode))
  check(got, want, list(zip(p, q, c)), f"fma.{mode}.f32")


@pytest.mark.parametrize("op", ["add", "mul"])
def test_ftz_flushes_inputs_and_results(op):
  # add/mul.ftz.f32: subnormal inputs and results become sign-preserving zeros; without .ftz they are kept (sm_20+)
  a = np.array([1e-45, -1e-45, 1e-40, -1e-20, 1e-20, 3e-39, -0.0, 1.0], np.float32)
  b = np.array([-0.0, 0.0, 1e-40, 1e-20, 1e-20, 3e-39, 1e-45, 1e-40], np.float32)
  fn = (lambda x, y: x + y) if op == "add" else (lambda x, y: x * y)
  got = elementwise(f"{op}.rn.ftz.f32 {{d}}, {{a0}}, {{a1}};", "f32", ["f32", "f32"], [a, b], np.float32)
  want = [flush(float(np.float32(fn(np.float32(flush(float(x))), np.float32(flush(float(y))))))) for x, y in zip(a, b)]
  check(got, want, list(zip(a, b)), f"{op}.rn.ftz.f32")
  got = elementwise(f"{op}.rn.f32 {{d}}, {{a0}}, {{a1}};", "f32", ["f32", "f32"], [a, b], np.float32)
  check(got, [float(np.float32(fn(x, y))) for x, y in zip(a, b)], list(zip(a, b)), f"{op}.rn.f32")


@pytest.mark.parametrize("inst", ["rcp.rn.f32", "rcp.rn.ftz.f32", "sqrt.rn.f32", "sqrt.rn.ftz.f32", "rcp.approx.ftz.f32",
                                  "sqrt.approx.f32", "rsqrt.approx.f32", "rsqrt.approx.ftz.f32"])
def test_rcp_sqrt_specials(inst):
  # IEEE specials: 1/+-0 = +-inf, 1/+-inf = +-0, sqrt(-0) = -0, sqrt(x < 0) = NaN; .ftz flushes subnormal inputs
  a = f32s(F32)
  got = elementwise(f"{inst} {{d}}, {{a0}};", "f32", ["f32"], [a], np.float32)
  op, ftz = inst.split(".")[0], ".ftz" in inst
  for x, g in zip(a, got):
    v = flush(float(x)) if ftz else float(x)
    with np.errstate(all="ignore"):
      exact = {"rcp": lambda: 1 / np.float64(v), "sqrt": lambda: np.sqrt(np.float64(v)),
               "rsqrt": lambda: 1 / np.sqrt(np.float64(v))}[op]()
    if not math.isfinite(exact) or exact == 0:
      assert same_float(float(g), float(exact)), (inst, x, g, exact)
    else:                                   # finite results: within the .approx error, exact for .rn
      with np.errstate(over="ignore"):
        want = float(np.float32(exact))
      if ftz: want = flush(want)
      if math.isinf(want) or want == 0: assert same_float(float(g), want), (inst, x, g, want); continue
      tol = 0.0 if ".rn" in inst else 2 ** -21
      assert abs(float(g) - want) <= tol * abs(want), (inst, x, g, want)


# =============================================================================================
# cvt: integral rounding in float types, narrowing with every rounding mode, float to int
# =============================================================================================

def round_integral(x: float, mode: str) -> float:
  """cvt.rni/rzi/rmi/rpi.fXX.fXX: round to an integral value in the type (nearest even, toward zero, down, up); a
  zero result keeps the operand's sign (IEEE roundToIntegral), NaN and inf pass."""
  if not math.isfinite(x): return x
  q = Fraction(x)
  r = {"rni": round, "rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil}[mode](q)   # round(): half to even
  return math.copysign(0.0, x) if r == 0 else float(r)


@pytest.mark.parametrize("t", ["f32", "f32.ftz", "f64"])
@pytest.mark.parametrize("mode", ["rni", "rzi", "rmi", "rpi"])
def test_cvt_round_to_integral(mode, t):
  base, ftz = t.split(".")[0], t.endswith("ftz")
  vals = (f32s if base == "f32" else f64s)(F32 if base == "f32" else F64)
  mods = ".ftz" if ftz else ""
  got = elementwise(f"cvt.{mode}{mods}.{base}.{base} {{d}}, {{a0}};", base, [base], [vals],
                    np.float32 if base == "f32" else np.float64)
  check(got, [round_integral(flush(float(v)) if ftz else float(v), mode) for v in vals], list(vals),
        f"cvt.{mode}{mods}.{base}.{base}")


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_cvt_f32_f64_every_rounding_mode(mode):
  d = f64s(F64)
  got = elementwise(f"cvt.{mode}.f32.f64 {{d}}, {{a0}};", "f32", ["f64"], [d], np.float32)
  want = [v if not math.isfinite(v) else math.copysign(abs(round_fraction(Fraction(v), "f32", mode)), v)
          for v in map(float, d)]
  check(got, want, list(d), f"cvt.{mode}.f32.f64")


INT_RANGES = {"s32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "s64": (-2**63, 2**63 - 1), "u16": (0, 2**16 - 1),
              "s8": (-128, 127)}


@pytest.mark.parametrize("dst", list(INT_RANGES))
@pytest.mark.parametrize("mode", ["rni", "rzi", "rmi", "rpi"])
def test_cvt_float_to_int_nan_inf_and_saturation(mode, dst):
  # PTX ISA, `cvt`: float-to-integer conversions saturate to the destination range; NaN converts to 0
  vals = f32s(F32 + [0x4F000000, 0xCF000000, 0x477FFF80, 0xC3010000, 0x5F000000])
  lo, hi = INT_RANGES[dst]
  np_t = {"s32": np.int32, "u32": np.uint32, "s64": np.int64, "u16": np.uint16, "s8": np.int8}[dst]
  got = elementwise(f"cvt.{mode}.{dst}.f32 {{d}}, {{a0}};", dst, ["f32"], [vals], np_t)   # 8/16-bit: in a .b32 register
  want = []
  for v in map(float, vals):
    if math.isnan(v): want.append(0); continue
    if math.isinf(v): want.append(hi if v > 0 else lo); continue
    r = round_integral(v, mode)
    want.append(int(max(lo, min(hi, r))))
  assert [int(g) for g in got] == want, (mode, dst, list(zip(vals.tolist(), [int(g) for g in got], want)))


# =============================================================================================
# the rendered PTX of real kernels carries the rounding qualifiers C's semantics need
# =============================================================================================

FLOAT_ARITH = re.compile(r"^\s*(?:@!?%p\d+\s+)?(add|sub|mul|mad|fma|div|rcp|sqrt|rsqrt)((?:\.\w+)*)\s")
ROUNDING = {"rn", "rz", "rm", "rp"}


def _rendered_kernels() -> list[dict]:
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nv"))
  import kernel_capture
  return kernel_capture.dtype_matrix()


@pytest.fixture(scope="module")
def rendered():
  return _rendered_kernels()


def qualifier_problems(entry: str) -> list[str]:
  """Float instructions of a PTX entry that lack the qualifiers the renderer's semantics (C's: IEEE round to
  nearest even, denormals kept, no contraction) need."""
  bad = []
  for line in entry.splitlines():
    m = FLOAT_ARITH.match(line)
    if not m: continue
    op, mods = m[1], m[2].split(".")[1:]
    if not {"f16", "bf16", "f32", "f64", "f16x2", "bf16x2"} & set(mods): continue
    if "ftz" in mods: bad.append(f"{line.strip()}  (.ftz flushes subnormals; C keeps them)")
    if op in ("add", "sub", "mul", "mad") and not ROUNDING & set(mods):
      bad.append(f"{line.strip()}  (no rounding modifier: ptxas may contract it with a neighbouring mul/add into an "
                 f"fma, PTX ISA `add`/`mul`)")
    elif op in ("add", "sub", "mul", "div", "rcp", "sqrt") and "rn" not in mods:
      bad.append(f"{line.strip()}  (needs .rn: IEEE round-to-nearest-even, as C)")
    elif op == "rsqrt":
      bad.append(f"{line.strip()}  (rsqrt exists only as .approx)")
  return bad


def test_rendered_float_arithmetic_has_rn(rendered):
  assert len(rendered) > 100
  n_arith, problems = 0, []
  for k in rendered:
    n_arith += sum(bool(FLOAT_ARITH.match(line)) for line in k["entry"].splitlines())
    problems += [f"{k['name']}: {p}" for p in qualifier_problems(k["entry"])]
  assert n_arith > 200, "the dtype matrix rendered almost no float arithmetic"
  assert not problems, f"{len(problems)} float instructions without the qualifiers they need; first:\n" + \
    "\n".join(problems[:10])


def test_qualifier_check_catches_unmarked_arithmetic():
  entry = "mul.f32 %f3, %f1, %f2;\n  add.rn.f32 %f4, %f3, %f1;\n  @%p1 add.f64 %fd1, %fd2, %fd3;\n" \
          "  div.full.f32 %f5, %f1, %f2;\n  add.rn.ftz.f32 %f6, %f1, %f2;\n  add.s32 %r1, %r2, %r3;\n"
  problems = qualifier_problems(entry)
  assert [p.split()[0] for p in problems] == ["mul.f32", "@%p1", "div.full.f32", "add.rn.ftz.f32"], problems


def _find_nvdisasm() -> str | None:
  if (found := shutil.which("nvdisasm")): return found
  try:
    import nvidia
    for root in nvidia.__path__:
      for cand in Path(root).glob("*/bin/nvdisasm"): return str(cand)
  except ImportError:
    pass
  return None


def _sass(ptx: str, arch: str = "sm_90") -> str:
  from baregrad.drivers.nv.cubin import compile_ptx
  cubin = compile_ptx(ptx, arch)
  with tempfile.TemporaryDirectory() as d:
    Path(d, "k.cubin").write_bytes(cubin)
    return subprocess.run([_find_nvdisasm(), "-c", f"{d}/k.cubin"], capture_output=True, text=True, check=True).stdout


def test_ptxas_fuses_only_unmarked_mul_add(rendered):
  """The oracle: ptxas (-O3) turns an unmarked mul.f32 + add.f32 into one FFMA, the `.rn` pair into FMUL + FADD, and
  the rendered kernels without an fma of their own compile to SASS without FFMA/DFMA. Needs nvdisasm (pip install
  nvidia-cuda-nvdisasm); skipped without it."""
  from baregrad.drivers.nv.cubin import find_ptxas, PtxasNotFound
  from baregrad.compiler.render_ptx import PTXRenderer
  try: find_ptxas()
  except PtxasNotFound as e: pytest.skip(str(e))
  if _find_nvdisasm() is None: pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
  header = ".version 8.0\n.target sm_90\n.address_size 64\n"
  body = """.visible .entry k(.param .u64 out, .param .u64 inp)
{{
  .reg .f32 %f<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [inp];
  ld.param.u64 %rd2, [out];
  ld.global.f32 %f1, [%rd1];
  ld.global.f32 %f2, [%rd1+4];
  ld.global.f32 %f3, [%rd1+8];
  mul{rn}.f32 %f4, %f1, %f2;
  add{rn}.f32 %f5, %f4, %f3;
  st.global.f32 [%rd2], %f5;
  ret;
}}
"""
  assert "FFMA" in _sass(header + body.format(rn=""))
  assert "FFMA" not in _sass(header + body.format(rn=".rn"))
  # rendered kernels with float mul and add and nothing ptxas expands into FFMA sequences of its own (fma/mad, and
  # the Newton iterations of div/rcp/sqrt.rn and of the .approx functions)
  own_fma = re.compile(r"^\s*(?:@!?%p\d+\s+)?(fma|mad|div|rcp|sqrt|rsqrt|ex2|lg2|sin|cos|tanh)\.\S*f(16|32|64)", re.M)
  renderer, checked = PTXRenderer("sm_90"), 0
  eligible = [k for k in rendered if not own_fma.search(k["entry"]) and re.search(r"\bmul\.rn\.f(32|64)", k["entry"])
              and re.search(r"\badd\.rn\.f(32|64)", k["entry"])]
  for k in eligible[::max(1, len(eligible) // 6)]:       # half a dozen spread over the op suite (each runs ptxas)
    entry = k["entry"]
    sass = _sass(renderer.header() + "\n" + entry.replace("__KERNEL__", "k"))
    assert not re.search(r"\b[FD]FMA\b", sass), f"{k['name']}: ptxas fused a multiply-add the PTX did not ask for"
    checked += 1
  assert checked >= 3, checked
