"""RDNA3 emulator instruction semantics at the edges: NaN (quiet and signalling, with payloads), +-inf, +-0 and
denormal operands, against rdna3_reference.py (the ISA guide's pseudocode in Python) and numpy. Each instruction is
assembled into a small kernel (one lane per case) and run by drivers/emu/rdna3.dispatch, in the kernel descriptor's
default float mode (IEEE_MODE = 1, DX10_CLAMP = 1, denormals kept) unless a test says otherwise."""
import itertools, math
from fractions import Fraction

import numpy as np
import pytest

from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
from baregrad.compiler.amd.asm import assemble
from baregrad.drivers.emu.rdna3 import EmulatorError, IllegalInstruction, dispatch
from emu_helpers import Buffers
import rdna3_reference as ref

HARNESS = """
  s_load_b128 s[4:7], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshl_add_u32 v10, s2, 6, v0
  v_lshlrev_b32 v11, 4, v10
  v_lshlrev_b32 v12, 3, v10
  global_load_b128 v[0:3], v11, s[4:5]
  v_mov_b32 v4, 0
  v_mov_b32 v5, 0
  s_waitcnt vmcnt(0)
  {inst}
  global_store_b64 v12, v[4:5], s[6:7]
  s_endpgm
"""


def run_lanes(inst: str, *dwords, **descriptor) -> tuple[np.ndarray, np.ndarray]:
  """Run `inst` once per lane with up to four input dwords per lane in v0..v3; returns (v4, v5) per lane.
  `descriptor`: kernel descriptor fields overriding the defaults (e.g. enable_ieee_mode=0)."""
  n = len(dwords[0])
  lanes = -(-n // 64) * 64
  inputs = np.zeros((lanes, 4), np.uint32)
  for i, d in enumerate(dwords): inputs[:n, i] = np.asarray(d, np.uint64).astype(np.uint32)
  out = np.zeros((lanes, 2), np.uint32)
  kd = KernelDescriptor.for_kernel(vgprs=16, kernarg_size=64, workgroup_ids=1, workitem_dims=1, **descriptor)
  co = write_code_object("k", assemble(HARNESS.format(inst=inst)), kd, 64, [])
  bufs = Buffers(inputs, out)
  dispatch(co, (lanes // 64, 1, 1), (64, 1, 1), bufs.kernarg, bufs.mem)
  return bufs.arrays[1][:n, 0], bufs.arrays[1][:n, 1]


def halves(lo, hi=None) -> np.ndarray:
  lo = np.asarray(lo, np.uint64)
  return lo | (np.asarray(hi, np.uint64) << np.uint64(16)) if hi is not None else lo


def split64(x) -> tuple[np.ndarray, np.ndarray]:
  x = np.asarray(x, np.uint64)
  return x & np.uint64(0xFFFFFFFF), x >> np.uint64(32)


def hexes(xs, width: int = 8) -> list[str]: return [f"{int(x):0{width}x}" for x in xs]


def assert_bits(got, want, cases, what: str, width: int = 8):
  got, want = [int(g) for g in got], [int(w) for w in want]
  bad = [(c, f"{g:0{width}x}", f"{w:0{width}x}") for c, g, w in zip(cases, got, want) if g != w]
  assert not bad, f"{what}: {len(bad)} of {len(got)} lanes differ; (inputs, got, want): {bad[:6]}"


PAIRS = {t: list(itertools.product(ref.SPECIALS[t], repeat=2)) for t in ref.FORMATS}
TRIPLES = {t: list(itertools.product(ref.SPECIALS[t], repeat=3)) for t in ("f16", "f32")}


# =============================================================================================
# min / max and the three-operand forms (IEEE 754-2008 minNum/maxNum, signalling NaNs quieted in IEEE mode)
# =============================================================================================

@pytest.mark.parametrize("ieee", [1, 0], ids=["ieee", "no_ieee"])
@pytest.mark.parametrize("kind", ["min", "max"])
@pytest.mark.parametrize("form", ["v_{k}_f32 v4, v0, v1", "v_{k}_f32_e64 v4, v0, v1", "v_{k}_f16 v4, v0, v1",
                                  "v_{k}_f64 v[4:5], v[0:1], v[2:3]", "v_pk_{k}_f16 v4, v0, v1"])
def test_min_max_nan_zero_denormal(form, kind, ieee):
  t = "f64" if "f64" in form else "f16" if "f16" in form else "f32"
  a, b = zip(*PAIRS[t])
  fn = ref.MINMAX[kind]
  want = [fn(x, y, t, bool(ieee)) for x, y in zip(a, b)]
  inst = form.format(k=kind)
  if t == "f64":
    (alo, ahi), (blo, bhi) = split64(a), split64(b)
    lo, hi = run_lanes(inst, alo, ahi, blo, bhi, enable_ieee_mode=ieee)
    got = lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))
    assert_bits(got, want, list(zip(hexes(a, 16), hexes(b, 16))), inst, 16)
  elif form.startswith("v_pk"):     # both halves: (a, b) in the low halves, (b, a) in the high halves
    lo, _ = run_lanes(inst, halves(a, b), halves(b, a), enable_ieee_mode=ieee)
    assert_bits(lo & 0xFFFF, want, list(zip(hexes(a, 4), hexes(b, 4))), inst + " (low)", 4)
    assert_bits(lo >> 16, [fn(y, x, t, bool(ieee)) for x, y in zip(a, b)], list(zip(hexes(b, 4), hexes(a, 4))),
                inst + " (high)", 4)
  else:
    lo, _ = run_lanes(inst, a, b, enable_ieee_mode=ieee)
    if t == "f16": lo = lo & 0xFFFF
    assert_bits(lo, want, list(zip(hexes(a), hexes(b))), inst)


@pytest.mark.parametrize("ieee", [1, 0], ids=["ieee", "no_ieee"])
@pytest.mark.parametrize("t", ["f32", "f16"])
@pytest.mark.parametrize("kind", ["min3", "max3", "med3", "minmax", "maxmin"])
def test_three_operand_min_max_med3(kind, t, ieee):
  a, b, c = zip(*TRIPLES[t])
  fn = ref.MINMAX[kind]
  want = [fn(x, y, z, t, bool(ieee)) for x, y, z in zip(a, b, c)]
  got, _ = run_lanes(f"v_{kind}_{t} v4, v0, v1, v2", a, b, c, enable_ieee_mode=ieee)
  if t == "f16": got = got & 0xFFFF
  w = 4 if t == "f16" else 8
  assert_bits(got, want, list(zip(hexes(a, w), hexes(b, w), hexes(c, w))), f"v_{kind}_{t}", w)


def test_med3_of_ordered_values_is_the_median():
  rng = np.random.default_rng(7)
  x = rng.choice(np.array([-2.0, -0.0, 0.0, 1.0, 3.5, np.inf, -np.inf], np.float32), (3, 512))
  got, _ = run_lanes("v_med3_f32 v4, v0, v1, v2", *(r.view(np.uint32) for r in x))
  np.testing.assert_array_equal(got.view(np.float32), np.sort(x, axis=0)[1])


@pytest.mark.parametrize("dx10", [1, 0], ids=["dx10_clamp", "no_dx10_clamp"])
def test_clamp_modifier_on_nan(dx10):
  # DX10_CLAMP: "clamp NaN to zero, otherwise pass NaN through" (LLVM AMDGPUUsage, COMPUTE_PGM_RSRC1)
  a, b = zip(*PAIRS["f32"])
  got, _ = run_lanes("v_add_f32_e64 v4, v0, v1 clamp", a, b, enable_dx10_clamp=dx10)
  with np.errstate(all="ignore"):
    s = (np.array(a, np.uint32).view(np.float32) + np.array(b, np.uint32).view(np.float32)).astype(np.float32)
  g = got.view(np.float32)
  nan = np.isnan(s)
  np.testing.assert_array_equal(g[~nan], np.clip(s[~nan], 0, 1))
  if dx10: assert (got[nan] == 0).all()
  else: assert np.isnan(g[nan]).all()


# =============================================================================================
# every v_cmp: VOPC (VCC), VOP3 (an SGPR) and v_cmpx (EXEC)
# =============================================================================================

def _compare_forms(op: str, t: str, lo: str, hi: str) -> dict[str, str]:
  return {"vopc": f"v_cmp_{op}_{t} vcc_lo, {lo}, {hi}\n  v_cndmask_b32 v4, 0, 1, vcc_lo",
          "vop3": f"v_cmp_{op}_{t}_e64 s10, {lo}, {hi}\n  v_cndmask_b32_e64 v4, 0, 1, s10",
          "cmpx": f"v_cmpx_{op}_{t} {lo}, {hi}\n  v_mov_b32 v4, 1",      # only the lanes left in EXEC store a 1
          "cmpx_e64": f"v_cmpx_{op}_{t}_e64 {lo}, {hi}\n  v_mov_b32 v4, 1"}


def _run_compare(inst: str, t: str, a, b) -> np.ndarray:
  if t[1:] == "64":
    (alo, ahi), (blo, bhi) = split64(a), split64(b)
    return run_lanes(inst, alo, ahi, blo, bhi)[0]
  return run_lanes(inst, a, b)[0]


@pytest.mark.parametrize("form", ["vopc", "vop3", "cmpx", "cmpx_e64"])
@pytest.mark.parametrize("t", ["f16", "f32", "f64"])
@pytest.mark.parametrize("op", list(ref.FLOAT_COMPARES))
def test_float_compares_with_nan_zero_inf(op, t, form):
  a, b = zip(*PAIRS[t])
  regs = ("v[0:1]", "v[2:3]") if t == "f64" else ("v0", "v1")
  inst = _compare_forms(op, t, *regs)[form]
  got = _run_compare(inst, t, a, b)
  want = [int(ref.FLOAT_COMPARES[op](ref.value(x, t), ref.value(y, t))) for x, y in zip(a, b)]
  w = {"f16": 4, "f32": 8, "f64": 16}[t]
  assert_bits(got, want, list(zip(hexes(a, w), hexes(b, w))), inst.replace("\n", ";"))


INT_EDGES = {"i16": [0, 1, -1, 2, -32768, 32767, 100, -100], "u16": [0, 1, 2, 0x7FFF, 0x8000, 0xFFFF, 100, 0xFFFE],
             "i32": [0, 1, -1, 2, -2**31, 2**31 - 1, 65536, -65536],
             "u32": [0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1, 65536, 0xFFFF],
             "i64": [0, 1, -1, -2**63, 2**63 - 1, 2**32, -2**32, 2**32 - 1],
             "u64": [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**32, 2**32 - 1, 2]}


INT_CASES = [(op, t) for t in INT_EDGES for op in ref.INT_COMPARES if not (t[1:] == "16" and op in ("f", "t"))]   # gfx11 has no 16-bit F/T


@pytest.mark.parametrize("form", ["vopc", "vop3", "cmpx"])
@pytest.mark.parametrize("op,t", INT_CASES, ids=[f"{op}-{t}" for op, t in INT_CASES])
def test_integer_compares_at_the_limits(op, t, form):
  vals = INT_EDGES[t]
  a, b = zip(*itertools.product(vals, repeat=2))
  bits = int(t[1:])
  raw = lambda xs: [x & ((1 << bits) - 1) for x in xs]
  regs = ("v[0:1]", "v[2:3]") if bits == 64 else ("v0", "v1")
  inst = _compare_forms(op, t, *regs)[form]
  got = _run_compare(inst, t, raw(a), raw(b))
  want = [int(ref.INT_COMPARES[op](x, y)) for x, y in zip(a, b)]
  assert_bits(got, want, list(zip(a, b)), inst.replace("\n", ";"))


CLASS_MASKS = [1 << i for i in range(10)] + [0x3FF, 0x000, 0x090, 0x198, 0x207, 0x063]


@pytest.mark.parametrize("form", ["vopc", "vop3", "cmpx"])
@pytest.mark.parametrize("t", ["f16", "f32", "f64"])
def test_cmp_class_every_class_bit(t, form):
  a, m = zip(*itertools.product(ref.SPECIALS[t], CLASS_MASKS))
  if t == "f64":
    lo, hi = split64(a)
    inst = _compare_forms("class", t, "v[0:1]", "v2")[form]
    got = run_lanes(inst, lo, hi, m)[0]
  else:
    inst = _compare_forms("class", t, "v0", "v1")[form]
    got = run_lanes(inst, a, m)[0]
  want = [int(ref.v_cmp_class(x, mask, t)) for x, mask in zip(a, m)]
  assert_bits(got, want, list(zip(hexes(a, 16), hexes(m, 3))), inst.replace("\n", ";"))


# =============================================================================================
# VOP1 float ops: fract, rcp, rsq, sqrt, exp, log, frexp; ldexp
# =============================================================================================

def _unary(inst: str, t: str, xs) -> list[int]:
  if t == "f64":
    lo, hi = split64(xs)
    glo, ghi = run_lanes(inst, lo, hi)
    return [int(l) | int(h) << 32 for l, h in zip(glo, ghi)]
  got, _ = run_lanes(inst, xs)
  return [int(g) & (0xFFFF if t == "f16" else 0xFFFFFFFF) for g in got]


def _unary_inst(name: str, t: str) -> str:
  return f"{name}_{t} v[4:5], v[0:1]" if t == "f64" else f"{name}_{t} v4, v0"


EXTRA = {  # more edge inputs: values whose results are denormal, overflow or round at a tie
  "f32": [0x7F7FFFFF, 0x7E800000, 0x00400000, 0x80000100, 0x3EFFFFFF, 0xBF000000, 0x3F000000, 0x4B000001, 0xCB7FFFFF,
          0x3F7FFFFF, 0xB3800000, 0xC2FC0000, 0xC3100000, 0x43000000],
  "f16": [0x7BFF, 0x7800, 0x0200, 0x8010, 0x37FF, 0xB800, 0x3800, 0x6401, 0x3BFF, 0x8001, 0xCC00],
  "f64": [0x7FEFFFFFFFFFFFFF, 0x7FD0000000000000, 0x0008000000000000, 0x3FDFFFFFFFFFFFFF, 0xBFE0000000000000,
          0x4330000000000001, 0x3FEFFFFFFFFFFFFF, 0xBCA0000000000000],
}


def _inputs(t: str) -> list[int]: return ref.SPECIALS[t] + EXTRA[t]


@pytest.mark.parametrize("t", ["f32", "f16", "f64"])
def test_fract(t):
  # V_FRACT_F32 (16.8): S0 + -floor(S0) in the type, "result clamped to" the largest value below 1.0
  xs = _inputs(t)
  got = _unary(_unary_inst("v_fract", t), t, xs)
  f = ref.FORMATS[t]
  below_one = np.nextafter(f.float_t(1), f.float_t(0))
  for x, g in zip(xs, got):
    v = np.array(x, f.uint_t).view(f.float_t)[()]
    with np.errstate(invalid="ignore"):
      want = f.float_t(v + -np.floor(v))
    if np.isnan(want): assert ref.is_nan(g, t), (hex(x), hex(g)); continue
    want = min(want, below_one)
    assert g == ref.bits_of(want, t), (hex(x), hex(g), float(want))


GUIDE_EXAMPLES = {   # "Functional examples" of the guide (16.8), bit for bit
  "v_rcp_f32": {0xFF800000: 0x80000000, 0xC0000000: 0xBF000000, 0x80000000: 0xFF800000, 0x00000000: 0x7F800000,
                0x7F800000: 0x00000000},
  "v_rsq_f32": {0xFF800000: 0xFFC00000, 0x80000000: 0xFF800000, 0x00000000: 0x7F800000, 0x40800000: 0x3F000000,
                0x7F800000: 0x00000000},
  "v_sqrt_f32": {0xFF800000: 0xFFC00000, 0x80000000: 0x80000000, 0x00000000: 0x00000000, 0x40800000: 0x40000000,
                 0x7F800000: 0x7F800000},
  "v_exp_f32": {0xFF800000: 0x00000000, 0x80000000: 0x3F800000, 0x7F800000: 0x7F800000},
  "v_log_f32": {0xFF800000: 0xFFC00000, 0xBF800000: 0xFFC00000, 0x80000000: 0xFF800000, 0x00000000: 0xFF800000,
                0x3F800000: 0x00000000, 0x7F800000: 0x7F800000},
  "v_rcp_f16": {0xFC00: 0x8000, 0xC000: 0xB800, 0x8000: 0xFC00, 0x0000: 0x7C00, 0x7C00: 0x0000},
  "v_sqrt_f16": {0xFC00: 0xFE00, 0x8000: 0x8000, 0x0000: 0x0000, 0x4400: 0x4000, 0x7C00: 0x7C00},
  "v_rsq_f16": {0xFC00: 0xFE00, 0x8000: 0xFC00, 0x0000: 0x7C00, 0x4400: 0x3800, 0x7C00: 0x0000},
}


def _exact(name: str, x: float):
  """The real result of the function at x (a float for finite results), computed in float64 / exact rationals,
  or None where it is not finite or not a number."""
  if math.isnan(x) or math.isinf(x): return None
  if name == "rcp": return None if x == 0 else Fraction(1) / Fraction(x)
  if name in ("sqrt", "rsq"):
    if x < 0: return None
    if x == 0: return None if name == "rsq" else 0.0
    s = math.sqrt(x)                                 # correctly rounded in float64: far finer than f32/f16
    return 1 / s if name == "rsq" else s
  if name == "exp": return 2.0 ** x if x < 1024 else None
  if name == "log": return math.log2(x) if x > 0 else None


@pytest.mark.parametrize("name", ["v_rcp", "v_rsq", "v_sqrt", "v_exp", "v_log"])
@pytest.mark.parametrize("t", ["f32", "f16", "f64"])
def test_transcendentals_specials_and_denormals(name, t):
  """f32 rcp/rsq/sqrt/exp/log: "1ULP accuracy, denormals are flushed" (inputs and results); f16: "0.51ULP",
  denormals supported; f64 rcp/rsq/sqrt: "(2**29)ULP accuracy and supports denormals" (16.8)."""
  if t == "f64" and name in ("v_exp", "v_log"): pytest.skip("no f64 exp/log on RDNA3")
  xs = _inputs(t)
  if t == "f32": xs = xs + [0x7E000000, 0x7F000000, 0xC3050000, 0x01000000, 0x80FFFFFF]   # results near the denormals
  inst = _unary_inst(name, t)
  got = _unary(inst, t, xs)
  examples = GUIDE_EXAMPLES.get(f"{name}_{t}", {})
  flush = t == "f32"
  tolerance = {"f32": 1.0, "f16": 1.0, "f64": 2.0 ** 29}[t]
  fn = name[2:]
  for x, g in zip(xs, got):
    if x in examples: assert g == examples[x], (inst, hex(x), hex(g)); continue
    xin = ref.flushed(x, t) if flush else x
    if ref.is_nan(xin, t): assert ref.is_nan(g, t), (inst, hex(x), hex(g)); continue
    exact = _exact(fn, ref.value(xin, t))
    v = ref.value(xin, t)
    if exact is None:      # 0, inf, negative or NaN operands: IEEE rules, checked against numpy in float64
      with np.errstate(all="ignore"):
        want = {"rcp": lambda: 1 / np.float64(v), "rsq": lambda: 1 / np.sqrt(np.float64(v)),
                "sqrt": lambda: np.sqrt(np.float64(v)), "exp": lambda: np.exp2(np.float64(v)),
                "log": lambda: np.log2(np.float64(v))}[fn]()
      if np.isnan(want): assert ref.is_nan(g, t), (inst, hex(x), hex(g)); continue
      assert ref.value(g, t) == want and np.signbit(ref.value(g, t)) == np.signbit(want), (inst, hex(x), hex(g))
      continue
    want = ref.round_to(exact, t)
    if flush and ref.is_denormal(ref.bits_of(want, t), t):     # a denormal result is flushed
      assert ref.value(g, t) == 0 and ref.sign(g, t) == (want < 0), (inst, hex(x), hex(g)); continue
    if math.isinf(want): assert ref.value(g, t) == want, (inst, hex(x), hex(g)); continue
    assert ref.ulps_apart(g, want, t) <= tolerance, (inst, hex(x), hex(g), want)


@pytest.mark.parametrize("t", ["f32", "f16", "f64"])
def test_frexp_mant_and_exp(t):
  # V_FREXP_MANT/EXP (16.8): inf and NaN give S0 and 0; otherwise S0 = mantissa * 2**exponent with the mantissa
  # in [0.5, 1) ("see the C library function frexp()"): denormals are normalized, +-0 gives +-0 and 0
  xs = _inputs(t)
  mant = _unary(_unary_inst("v_frexp_mant", t), t, xs)
  exp_inst = {"f32": "v_frexp_exp_i32_f32 v4, v0", "f16": "v_frexp_exp_i16_f16 v4, v0",
              "f64": "v_frexp_exp_i32_f64 v4, v[0:1]"}[t]
  if t == "f64":
    lo, hi = split64(xs)
    exps = run_lanes(exp_inst, lo, hi)[0]
  else:
    exps = run_lanes(exp_inst, xs)[0]
  exps = [int(np.array(e, np.uint32).astype(np.uint16).view(np.int16)) if t == "f16" else int(np.array(e, np.uint32).view(np.int32))
          for e in exps]
  for x, m, e in zip(xs, mant, exps):
    v = ref.value(x, t)
    if math.isnan(v) or math.isinf(v):
      assert m == x and e == 0, (hex(x), hex(m), e); continue
    want_m, want_e = math.frexp(v)
    assert m == ref.bits_of(want_m, t) and e == want_e, (hex(x), hex(m), e, want_m, want_e)


LDEXP_EXPONENTS = [0, 1, -1, 23, -24, 126, -126, 127, -149, 300, -300, 2**31 - 1, -2**31, 1023, -1074, -1080]


@pytest.mark.parametrize("t", ["f32", "f16", "f64"])
def test_ldexp_overflow_underflow_and_specials(t):
  # V_LDEXP_F32 (16.12): S0 * 2**S1, rounded once (denormal results kept, overflow to inf)
  xs = _inputs(t)
  exps = LDEXP_EXPONENTS if t != "f16" else [e for e in LDEXP_EXPONENTS if -2**15 <= e < 2**15] + [-32768, 32767]
  x, n = zip(*itertools.product(xs, exps))
  if t == "f64":
    lo, hi = split64(x)
    glo, ghi = run_lanes("v_ldexp_f64 v[4:5], v[0:1], v2", lo, hi, [e & 0xFFFFFFFF for e in n])
    got = [int(l) | int(h) << 32 for l, h in zip(glo, ghi)]
  else:
    g, _ = run_lanes(f"v_ldexp_{t} v4, v0, v1", x, [e & (0xFFFF if t == "f16" else 0xFFFFFFFF) for e in n])
    got = [int(v) & (0xFFFF if t == "f16" else 0xFFFFFFFF) for v in g]
  limit = {"f16": 100, "f32": 400, "f64": 3000}[t]
  for xb, e, gb in zip(x, n, got):
    v = ref.value(xb, t)
    if math.isnan(v): assert ref.is_nan(gb, t), (hex(xb), e, hex(gb)); continue
    if math.isinf(v) or v == 0: assert gb == xb, (hex(xb), e, hex(gb)); continue
    want = ref.round_to(Fraction(v) * Fraction(2) ** max(-limit, min(limit, e)), t)
    if want == 0: want = math.copysign(0.0, v)
    assert gb == ref.bits_of(want, t), (hex(xb), e, hex(gb), want)


# =============================================================================================
# conversions
# =============================================================================================

def _to_int(v: float, lo: int, hi: int, rnd=math.trunc) -> int:
  """f32_to_i32 & co: "out-of-range floating point values (including infinity) saturate. NAN is converted to 0"."""
  if math.isnan(v): return 0
  if math.isinf(v): return hi if v > 0 else lo
  return max(lo, min(hi, rnd(v)))


CVT_INT = [("v_cvt_i32_f32 v4, v0", "f32", -2**31, 2**31 - 1, math.trunc),
           ("v_cvt_u32_f32 v4, v0", "f32", 0, 2**32 - 1, math.trunc),
           ("v_cvt_i32_f64 v4, v[0:1]", "f64", -2**31, 2**31 - 1, math.trunc),
           ("v_cvt_u32_f64 v4, v[0:1]", "f64", 0, 2**32 - 1, math.trunc),
           ("v_cvt_i16_f16 v4, v0", "f16", -2**15, 2**15 - 1, math.trunc),
           ("v_cvt_u16_f16 v4, v0", "f16", 0, 2**16 - 1, math.trunc),
           ("v_cvt_floor_i32_f32 v4, v0", "f32", -2**31, 2**31 - 1, math.floor)]
INT_FLOATS = {"f32": [0x4F000000, 0xCF000000, 0x4F800000, 0xCF000001, 0x3FC00000, 0xBFC00000, 0x4EFFFFFF],
              "f64": [0x41DFFFFFFFC00000, 0xC1E0000000000000, 0x41EFFFFFFFE00000, 0x41F0000000000000, 0xC1E0000000200000],
              "f16": [0x7800, 0xF800, 0x3E00, 0xBE00]}


@pytest.mark.parametrize("inst,t,lo,hi,rnd", CVT_INT, ids=[c[0].split()[0] for c in CVT_INT])
def test_float_to_int_conversions_saturate_and_zero_nan(inst, t, lo, hi, rnd):
  xs = _inputs(t) + INT_FLOATS[t]
  if t == "f64":
    a, b = split64(xs)
    got = run_lanes(inst, a, b)[0]
  else:
    got = run_lanes(inst, xs)[0]
  bits = 16 if t == "f16" else 32
  for x, g in zip(xs, got):
    want = _to_int(ref.value(x, t), lo, hi, rnd) & ((1 << bits) - 1)
    assert int(g) & ((1 << bits) - 1) == want, (inst, hex(x), hex(int(g)), want)


def _plus_half_is_exact(b: int) -> bool:
  v = ref.value(b, "f32")
  return not math.isfinite(v) or ref.round_to(Fraction(v) + Fraction(1, 2), "f32") == Fraction(v) + Fraction(1, 2)


def test_cvt_nearest_i32_f32():
  # V_CVT_NEAREST_I32_F32 (16.8): f32_to_i32(floor(S0 + 0.5F)); only values whose "+ 0.5" is exact in float32, where
  # the pseudocode's float32 sum and the real sum agree
  xs = [b for b in _inputs("f32") + [0x3F000000, 0xBF000000, 0xC0200000, 0x4AFFFFFF, 0xCAFFFFFD] if _plus_half_is_exact(b)]
  got = run_lanes("v_cvt_nearest_i32_f32 v4, v0", xs)[0]
  for x, g in zip(xs, got):
    v = ref.value(x, "f32")
    want = _to_int(v + 0.5 if math.isfinite(v) else v, -2**31, 2**31 - 1, math.floor) & 0xFFFFFFFF
    assert int(g) == want, (hex(x), hex(int(g)), want)


def test_float_to_float_conversions():
  # V_CVT_F32_F64, V_CVT_F16_F32: 0.5ULP (round to nearest even), denormals supported, overflow to inf;
  # V_CVT_F64_F32, V_CVT_F32_F16: exact (0ULP)
  d = _inputs("f64") + [0x47EFFFFFF0000000, 0x47EFFFFFE0000000, 0x36A0000000000000, 0x3690000000000000,
                        0x36A8000000000000, 0x3FF0000010000000]
  lo, hi = split64(d)
  got = run_lanes("v_cvt_f32_f64 v4, v[0:1]", lo, hi)[0]
  for x, g in zip(d, got):
    v = ref.value(x, "f64")
    if math.isnan(v): assert ref.is_nan(int(g), "f32"), hex(x); continue
    want = v if math.isinf(v) else ref.round_to(Fraction(v), "f32")
    assert int(g) == ref.bits_of(want if want != 0 else math.copysign(0.0, v), "f32"), (hex(x), hex(int(g)), want)
  f = _inputs("f32") + [0x477FF000, 0x477FEFFF, 0x33800000, 0x33000000, 0x33000001, 0x387FC000]
  got = run_lanes("v_cvt_f16_f32 v4, v0", f)[0]
  for x, g in zip(f, got):
    v = ref.value(x, "f32")
    if math.isnan(v): assert ref.is_nan(int(g) & 0xFFFF, "f16"), hex(x); continue
    want = v if math.isinf(v) else ref.round_to(Fraction(v), "f16")
    assert int(g) & 0xFFFF == ref.bits_of(want if want != 0 else math.copysign(0.0, v), "f16"), (hex(x), hex(int(g)))
  got = run_lanes("v_cvt_f64_f32 v[4:5], v0", f)
  for x, glo, ghi in zip(f, *got):
    v, g = ref.value(x, "f32"), int(glo) | int(ghi) << 32
    if math.isnan(v): assert ref.is_nan(g, "f64"), hex(x); continue
    assert g == ref.bits_of(v, "f64"), (hex(x), hex(g))
  h = _inputs("f16")
  got = run_lanes("v_cvt_f32_f16 v4, v0", h)[0]
  for x, g in zip(h, got):
    v = ref.value(x, "f16")
    if math.isnan(v): assert ref.is_nan(int(g), "f32"), hex(x); continue
    assert int(g) == ref.bits_of(v, "f32"), (hex(x), hex(int(g)))


def test_cvt_pk_rtz_f16_f32():
  # V_CVT_PK_RTZ_F16_F32 (16.7): round toward zero: a finite value never becomes inf (65504 at most)
  f = _inputs("f32") + [0x477FF000, 0x47800000, 0xC7800000, 0x33800001, 0xB3800001, 0x3F800001, 0xBF800001]
  got = run_lanes("v_cvt_pk_rtz_f16_f32 v4, v0, v1", f, list(reversed(f)))[0]
  for x, y, g in zip(f, reversed(f), got):
    for v_bits, half in ((x, int(g) & 0xFFFF), (y, int(g) >> 16)):
      v = ref.value(v_bits, "f32")
      if math.isnan(v): assert ref.is_nan(half, "f16"), hex(v_bits); continue
      want = v if math.isinf(v) else ref.round_to(Fraction(v), "f16", "rz")
      assert half == ref.bits_of(want if want != 0 else math.copysign(0.0, v), "f16"), (hex(v_bits), hex(half), want)


INT_SOURCES = [0, 1, -1, 2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**31 - 1, -2**31, 2**25 + 3, 0x7FFFFFC0]


def test_int_to_float_conversions_round_to_nearest_even():
  u = [x & 0xFFFFFFFF for x in INT_SOURCES] + [2**32 - 1, 2**32 - 129, 2**31 + 64]
  got = run_lanes("v_cvt_f32_i32 v4, v0", u)[0]
  assert [int(g) for g in got] == [ref.bits_of(ref.round_to(Fraction(int(np.array(x, np.uint32).view(np.int32))), "f32"), "f32")
                                   for x in u]
  got = run_lanes("v_cvt_f32_u32 v4, v0", u)[0]
  assert [int(g) for g in got] == [ref.bits_of(ref.round_to(Fraction(x), "f32"), "f32") for x in u]
  lo, hi = run_lanes("v_cvt_f64_i32 v[4:5], v0", u)
  assert [int(l) | int(h) << 32 for l, h in zip(lo, hi)] == [ref.bits_of(float(np.array(x, np.uint32).view(np.int32)), "f64")
                                                              for x in u]


# =============================================================================================
# float modes the emulator does not compute in are refused, not silently ignored
# =============================================================================================

@pytest.mark.parametrize("field,value", [("float_denorm_mode_32", 0), ("float_denorm_mode_16_64", 1),
                                         ("float_round_mode_32", 3), ("float_round_mode_16_64", 1)])
def test_descriptor_float_modes_not_emulated_are_refused(field, value):
  with pytest.raises(EmulatorError, match=f"{field} = {value}"):
    run_lanes("v_add_f32 v4, v0, v1", [0], [0], **{field: value})


@pytest.mark.parametrize("inst", ["s_setreg_b32 hwreg(HW_REG_MODE, 0, 4), s0", "s_denorm_mode 0", "s_round_mode 0x3"])
def test_mode_changes_in_a_kernel_are_refused(inst):
  with pytest.raises(IllegalInstruction, match="not emulated"):
    run_lanes(inst, [0])


def test_mode_writes_that_keep_the_emulated_modes_run():
  got, _ = run_lanes("s_denorm_mode 0xf\n  s_round_mode 0x0\n  s_setreg_b32 hwreg(HW_REG_GPR_ALLOC, 0, 4), s0\n"
                     "  v_add_f32 v4, v0, v1", [0x00000001], [0x00000001])
  assert got.tolist() == [2]                  # denormal + denormal, kept


# =============================================================================================
# fused multiply-add rounds once; transcendentals at their documented accuracy; the division helpers and the
# division macro they serve (LLVM SIISelLowering::LowerFDIV32 / LowerFDIV64) at the exponent extremes
# =============================================================================================

FMA_DOUBLE_ROUNDING = {  # a * b + c whose float64 rounding lands on a tie (or drops a product bit) of the type
  "f32": [(0x3F800800, 0x3F800800, 0x17800000), (0x3F800800, 0xBF800800, 0x97800000)],   # (1+2^-12)^2 +- 2^-80
  "f64": [(0x3FF0000000400000, 0x3FF0000000400000, 0xBFF0000000000000)],                # (1+2^-30)^2 - 1
}


def _fma_cases(t: str) -> list[tuple[int, int, int]]:
  rng = np.random.default_rng(7)
  f = ref.FORMATS[t]
  lo, hi = {"f16": (-6, 6), "f32": (-60, 60), "f64": (-400, 400)}[t]
  a = (rng.standard_normal(600) * 2.0 ** rng.integers(lo, hi, 600)).astype(f.float_t)
  b = (rng.standard_normal(600) * 2.0 ** rng.integers(lo, hi, 600)).astype(f.float_t)
  prod = a.astype(np.float64) * b.astype(np.float64)
  c = (-prod * (1 + rng.standard_normal(600) * 2.0 ** -f.mant)).astype(f.float_t)    # near cancellation
  c[::3] = (rng.standard_normal(200) * 2.0 ** rng.integers(lo, hi, 200)).astype(f.float_t)
  cases = [(ref.bits_of(x, t), ref.bits_of(y, t), ref.bits_of(z, t)) for x, y, z in zip(a, b, c)]
  return FMA_DOUBLE_ROUNDING.get(t, []) + cases + list(itertools.product(ref.SPECIALS[t][:10], repeat=3))[::7]


@pytest.mark.parametrize("inst,t", [("v_fma_f32 v4, v0, v1, v2", "f32"), ("v_fma_f16 v4, v0, v1, v2", "f16"),
                                    ("v_fma_f64 v[4:5], v[0:1], v[2:3], v[0:1]", "f64"),
                                    ("v_mov_b32 v4, v2\n  v_fmac_f32 v4, v0, v1", "f32")])
def test_fma_rounds_once(inst, t):
  # V_FMA_F32/F64/F16 (16.12): D = fma(S0, S1, S2), "0.5ULP accuracy": the exact value rounded once
  cases = _fma_cases(t)
  if t == "f64":        # three 64-bit operands do not fit in v0..v3: c = a here, and b = a for the constructed cases
    cases = [(a, b, a) for a, b, _ in cases]
    lo_hi = lambda i, cs: split64([c[i] for c in cs])
    g_lo, g_hi = run_lanes(inst, *lo_hi(0, cases), *lo_hi(1, cases))
    constructed = FMA_DOUBLE_ROUNDING["f64"]
    c_lo, c_hi = run_lanes("v_fma_f64 v[4:5], v[0:1], v[0:1], v[2:3]", *lo_hi(0, constructed), *lo_hi(2, constructed))
    cases += constructed
    got = [int(l) | int(h) << 32 for l, h in zip(list(g_lo) + list(c_lo), list(g_hi) + list(c_hi))]
  else:
    width = 0xFFFF if t == "f16" else 0xFFFFFFFF
    got = [int(g) & width for g in run_lanes(inst, *zip(*cases))[0]]
  want = [ref.fma(a, b, c, t) for a, b, c in cases]
  bad = [(hex(a), hex(b), hex(c), hex(g), hex(w)) for (a, b, c), g, w in zip(cases, got, want)
         if g != w and not (ref.is_nan(g, t) and ref.is_nan(w, t))]
  assert not bad, f"{inst}: {len(bad)} of {len(cases)} differ from the single rounding; (a, b, c, got, want): {bad[:5]}"
  if t in FMA_DOUBLE_ROUNDING:      # the cases a float64 a*b+c gets wrong are among them, and are right here
    f = ref.FORMATS[t]
    for a, b, c in FMA_DOUBLE_ROUNDING[t]:
      naive = f.float_t(np.float64(ref.value(a, t)) * ref.value(b, t) + ref.value(c, t))
      assert ref.bits_of(naive, t) != ref.fma(a, b, c, t)


def _sqrt_neighbours(x: float) -> tuple[float, float]:
  """The float32 values around sqrt(x), decided by exact squares."""
  v = np.float32(math.sqrt(x))
  up = lambda y: np.nextafter(y, np.float32(np.inf))
  while Fraction(float(v)) ** 2 > Fraction(x): v = np.nextafter(v, np.float32(0))
  while Fraction(float(up(v))) ** 2 <= Fraction(x): v = up(v)
  return (float(v), float(v)) if Fraction(float(v)) ** 2 == Fraction(x) else (float(v), float(up(v)))


def _sqrt_nearest(x: float) -> float:
  lo, hi = _sqrt_neighbours(x)
  return lo if ((Fraction(lo) + Fraction(hi)) / 2) ** 2 >= Fraction(x) else hi


def test_rcp_and_sqrt_f32_are_correctly_rounded_in_the_hard_cases():
  """The guide allows 1 ULP (16.8); the emulator returns the correctly rounded value, which LLVM's division sequence
  needs in cases like 1 / (1 - 2**-24) (rdna3_float.nearest_f32): checked against exact rationals."""
  rng = np.random.default_rng(3)
  xs = (rng.random(400) * 2.0 ** rng.integers(-120, 120, 400)).astype(np.float32)
  hard = [ref.bits_of(np.float32((2 ** 24 - k) * 2.0 ** -24), "f32") for k in range(1, 9)]
  xs = [ref.bits_of(x, "f32") for x in xs if x > 0] + hard + [0x3F800001, 0x40400000, 0x3EAAAAAB, 0x7E7FFFFF]
  nearest = {"v_rcp_f32": lambda x: ref.round_to(1 / Fraction(x), "f32"),
             "v_sqrt_f32": lambda x: _sqrt_nearest(x)}
  for name, want in nearest.items():
    got = _unary(f"{name} v4, v0", "f32", xs)
    bad = [(hex(x), hex(g)) for x, g in zip(xs, got) if ref.value(g, "f32") != want(ref.value(x, "f32"))]
    assert not bad, (name, bad[:5])


DIV_VALUES = {   # operands across each format's range: denormals, the reciprocal-denormal range, near overflow
  "f32": [e for m in (1.0, 1.5, 1.9999998807907104) for e in (-149, -140, -127, -126, -125, -100, -64, -30, -1, 0, 1,
                                                           30, 64, 96, 100, 125, 126, 127)],
  "f64": [e for m in (1.0, 1.5, 1.9999999999999998) for e in (-1074, -1060, -1023, -1022, -1021, -900, -512, -100, 0,
                                                           1, 100, 512, 900, 1021, 1022, 1023)],
}


def _div_operands(t: str) -> list[int]:
  f = ref.FORMATS[t]
  out = set()
  for m in (1.0, 1.5, 1.9999998807907104 if t == "f32" else 1.9999999999999998):
    for e in sorted(set(DIV_VALUES[t])):
      x = f.float_t(m * 2.0 ** e) if e > -1000 or t == "f32" else f.float_t(np.ldexp(m, e))
      if np.isfinite(x) and x != 0: out.add(ref.bits_of(x, t))
  rng = np.random.default_rng(11)
  lo, hi = (-149, 127) if t == "f32" else (-1074, 1023)
  for _ in range(12):
    x = f.float_t(np.ldexp(rng.random() + 0.5, int(rng.integers(lo, hi))))
    if np.isfinite(x) and x != 0: out.add(ref.bits_of(x, t))
  return sorted(out)


PAD6 = "\n".join(["  v_mov_b32 v15, 0"] * 6)     # the trans-use hazard distance after v_rcp
LLVM_FDIV32 = f"""v_div_scale_f32 v4, null, v1, v1, v0
  v_div_scale_f32 v5, vcc_lo, v0, v1, v0
  v_rcp_f32 v6, v4
{PAD6}
  v_fma_f32 v7, -v4, v6, 1.0
  v_fma_f32 v6, v7, v6, v6
  v_mul_f32 v7, v5, v6
  v_fma_f32 v8, -v4, v7, v5
  v_fma_f32 v7, v8, v6, v7
  v_fma_f32 v8, -v4, v7, v5
  v_div_fmas_f32 v8, v8, v6, v7
  v_div_fixup_f32 v4, v8, v1, v0"""
LLVM_FDIV64 = f"""v_div_scale_f64 v[4:5], null, v[2:3], v[2:3], v[0:1]
  v_rcp_f64 v[6:7], v[4:5]
{PAD6}
  v_fma_f64 v[8:9], -v[4:5], v[6:7], 1.0
  v_fma_f64 v[6:7], v[6:7], v[8:9], v[6:7]
  v_fma_f64 v[8:9], -v[4:5], v[6:7], 1.0
  v_div_scale_f64 v[13:14], vcc_lo, v[0:1], v[2:3], v[0:1]
  v_fma_f64 v[6:7], v[6:7], v[8:9], v[6:7]
  v_mul_f64 v[8:9], v[13:14], v[6:7]
  v_fma_f64 v[4:5], -v[4:5], v[8:9], v[13:14]
  v_div_fmas_f64 v[4:5], v[4:5], v[6:7], v[8:9]
  v_div_fixup_f64 v[4:5], v[4:5], v[2:3], v[0:1]"""


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_llvm_division_macro_is_correctly_rounded_at_the_extremes(t):
  """V_DIV_SCALE / V_DIV_FMAS / V_DIV_FIXUP exist for this sequence (LLVM SIISelLowering::LowerFDIV32/64, as LLVM
  emits it for gfx1100): its quotient must be the correctly rounded a / b for every pair, denormal operands and
  quotients, reciprocals below the normal range (v_rcp flushes them: 16.8) and quotients that overflow included."""
  xs = _div_operands(t)
  pairs = [(a, b ^ s) for a in xs for b in xs for s in (0, 1 << (ref.FORMATS[t].bits - 1))]
  if t == "f32":
    got = _unary_pairs(LLVM_FDIV32, pairs)
  else:
    a_lo, a_hi = split64([a for a, _ in pairs])
    b_lo, b_hi = split64([b for _, b in pairs])
    g_lo, g_hi = run_lanes(LLVM_FDIV64, a_lo, a_hi, b_lo, b_hi)
    got = [int(l) | int(h) << 32 for l, h in zip(g_lo, g_hi)]
  bad = []
  for (a, b), g in zip(pairs, got):
    want = ref.round_to(ref.exact(a, t) / ref.exact(b, t), t)
    if ref.value(g, t) != want or ref.sign(g, t) != (ref.sign(a, t) != ref.sign(b, t)):
      bad.append((hex(a), hex(b), hex(g), want))
  assert not bad, f"{len(bad)} of {len(pairs)} quotients are not correctly rounded; (a, b, got, want): {bad[:5]}"


def _unary_pairs(inst: str, pairs) -> list[int]:
  got, _ = run_lanes(inst, [a for a, _ in pairs], [b for _, b in pairs])
  return [int(g) for g in got]


def test_rcp_of_a_denominator_above_2_126_flushes_so_an_unscaled_division_gives_0():
  # v_rcp_f32 flushes its denormal results (16.8): a * rcp(b) is 0 for |b| > 2**126 unless the sequence scales b
  b = [0x7E800001, 0x7F000000, 0xFF7FFFFF]
  got = _unary_pairs("v_rcp_f32 v5, v1\n" + PAD6 + "\n  v_mul_f32 v4, v0, v5", [(0x7F000000, x) for x in b])
  assert [ref.value(g, "f32") for g in got] == [0.0, 0.0, -0.0]
  got = _unary_pairs(LLVM_FDIV32, [(0x7F000000, x) for x in b])
  want = [ref.round_to(Fraction(2.0 ** 127) / ref.exact(x, "f32"), "f32") for x in b]
  assert [ref.value(g, "f32") for g in got] == want


def _div_scale_lanes(t: str, s0_is: str, pairs) -> tuple[list[int], list[int]]:
  """(D0, VCC) of v_div_scale over (denominator, numerator) pairs, S0 being the denominator ("d") or numerator."""
  if t == "f32":
    s0 = "v1" if s0_is == "d" else "v0"
    got, vcc = run_lanes(f"v_div_scale_f32 v4, s8, {s0}, v1, v0\n  v_cndmask_b32 v5, 0, 1, s8",
                         [n for _, n in pairs], [d for d, _ in pairs])
    return [int(g) for g in got], [int(v) for v in vcc]
  s0 = "v[2:3]" if s0_is == "d" else "v[0:1]"
  cols = (*split64([n for _, n in pairs]), *split64([d for d, _ in pairs]))
  g_lo, g_hi = run_lanes(f"v_div_scale_f64 v[4:5], s8, {s0}, v[2:3], v[0:1]", *cols)
  vcc, _ = run_lanes(f"v_div_scale_f64 v[6:7], s8, {s0}, v[2:3], v[0:1]\n  v_cndmask_b32 v4, 0, 1, s8", *cols)
  return [int(l) | int(h) << 32 for l, h in zip(g_lo, g_hi)], [int(v) for v in vcc]


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_div_scale_follows_the_pseudocode(t):
  # V_DIV_SCALE_F32/F64 (16.12): S0 = the value to scale (the denominator or the numerator), S1 = denominator,
  # S2 = numerator; the D0 and VCC of each pseudocode branch (rdna3_reference.div_scale)
  xs = _div_operands(t)[::2] + ref.SPECIALS[t][:4] + ref.SPECIALS[t][8:11]
  pairs = [(d, n) for d in xs for n in xs]
  bad = []
  for s0_is in ("d", "n"):
    got, vcc = _div_scale_lanes(t, s0_is, pairs)
    for (d, n), g, v in zip(pairs, got, vcc):
      want, want_vcc = ref.div_scale(d if s0_is == "d" else n, d, n, t)
      if (g != want and not (ref.is_nan(g, t) and ref.is_nan(want, t))) or bool(v) != want_vcc:
        bad.append((s0_is, hex(d), hex(n), hex(g), v, hex(want), want_vcc))
  assert not bad, f"{len(bad)} of {2 * len(pairs)} differ; (S0, S1, S2, got, vcc, want, vcc): {bad[:5]}"


@pytest.mark.parametrize("t", ["f32", "f16"])
def test_div_fixup_special_cases(t):
  # V_DIV_FIXUP (16.12): S0 = quotient, S1 = denominator, S2 = numerator; NaN, 0 and inf operands decide
  triples = TRIPLES[t][::3]
  got = [int(g) & (0xFFFF if t == "f16" else 0xFFFFFFFF)
         for g in run_lanes(f"v_div_fixup_{t} v4, v0, v1, v2", *zip(*triples))[0]]
  bad = [(hex(q), hex(d), hex(n), hex(g), hex(ref.div_fixup(q, d, n, t))) for (q, d, n), g in zip(triples, got)
         if g != ref.div_fixup(q, d, n, t)]
  assert not bad, f"{len(bad)} of {len(triples)} differ; (q, d, n, got, want): {bad[:6]}"


def test_div_fmas_rescales_only_the_lanes_vcc_selects():
  # V_DIV_FMAS_F32 (16.12): fma(S0, S1, S2), rescaled where VCC is set; the lane's S2 decides the direction
  cases = [(0x3F800000, 0x40000000, 0x40800000), (0x3F800000, 0x3E800000, 0x3E800000), (0x40400000, 0x3F000000, 0x0)]
  for vcc in (0, 1):
    got, _ = run_lanes(f"s_mov_b32 vcc_lo, {-vcc}\n  v_div_fmas_f32 v4, v0, v1, v2", *zip(*cases))
    assert [int(g) for g in got] == [ref.div_fmas(a, b, c, bool(vcc), "f32") for a, b, c in cases]
