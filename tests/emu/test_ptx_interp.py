"""The vectorized PTX interpreter (drivers/emu/ptx.py).

1. Instruction semantics on hand-written kernels, against independent references: Python integers for
   integer ops, exact rationals (fractions.Fraction) for correctly rounded float results and conversions,
   Python's own float16 packing (struct "e") for cvt.rn.f16.f32.
2. Control flow and memory: divergent loops, if/else joins, exits, bar.sync with .shared, .local and generic
   addresses, parameters, faults, unsupported instructions, the runaway guard.
3. The real check: kernels rendered by compiler/render_ptx.PTXRenderer (through compiler.codegen.lower) for
   every op x dtype, cast and bitcast pair, reductions, upcast lanes and a 256^3 matmul, run in the interpreter
   on the CPU device's input buffers and compared with the CPU device's outputs (bit-exact; NaN payloads
   aside; tolerances only where gcc's fp contraction makes the CPU reference fuse a*b+c).
"""
from __future__ import annotations

import math, struct, sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from baregrad.drivers.emu import ptx as ptxmod
from baregrad.drivers.emu.ptx import parse_ptx, launch, Memory, MemoryFault, PtxUnsupported, PtxRunaway, SUPPORTED

HEADER = ".version 8.0\n.target sm_90\n.address_size 64\n"


# =============================================================================================
# helpers
# =============================================================================================

REG_OF = {"f32": "%f", "f64": "%fd", "b16": "%h", "f16": "%h", "bf16": "%h", "pred": "%p"}


def _reg(t: str, i: int) -> str:
  if t in REG_OF: return f"{REG_OF[t]}{i}"
  return f"%rd{i}" if t[1:] == "64" else f"%r{i}"


def elementwise(body: str, out_t: str, in_ts: list[str], inputs: list[np.ndarray], out_dtype, block: int = 64) -> np.ndarray:
  """Run `body` once per element: inputs are loaded into a0, a1, a2 (registers of their type: %f1.. / %r1.. /
  %rd1.. / %fd1.. / %h1..), the result is stored from `d` (register 0 of out_t). Returns the output array."""
  n = len(inputs[0])
  names = {f"a{i}": _reg(t, i + 1) for i, t in enumerate(in_ts)}
  names["d"] = _reg(out_t, 0)
  for k, v in names.items(): body = body.replace("{" + k + "}", v)
  loads = []
  for i, t in enumerate(in_ts):
    size = {"f32": 4, "f64": 8, "b16": 2, "f16": 2, "bf16": 2}.get(t, int(t[1:]) // 8)
    mt = {"f16": "b16", "bf16": "b16"}.get(t, t)
    loads += [f"ld.param.u64 %rd20, [p{i}];", f"mul.wide.u32 %rd21, %r23, {size};", "add.s64 %rd20, %rd20, %rd21;",
              f"ld.global.{mt} {names[f'a{i}']}, [%rd20];"]
  osize = np.dtype(out_dtype).itemsize
  omt = {"f16": "b16", "bf16": "b16"}.get(out_t, out_t)
  src = HEADER + f"""
.visible .entry k(.param .u64 out, .param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u32 n)
{{
  .reg .pred %p<12>;
  .reg .b16 %h<12>;
  .reg .b32 %r<32>;
  .reg .b64 %rd<32>;
  .reg .f32 %f<12>;
  .reg .f64 %fd<12>;
  mov.u32 %r20, %ctaid.x;
  mov.u32 %r21, %ntid.x;
  mov.u32 %r22, %tid.x;
  mad.lo.s32 %r23, %r20, %r21, %r22;
  ld.param.u32 %r24, [n];
  setp.ge.u32 %p11, %r23, %r24;
  @%p11 bra DONE;
  {chr(10).join('  ' + x for x in loads)}
  {body}
  ld.param.u64 %rd22, [out];
  mul.wide.u32 %rd21, %r23, {osize};
  add.s64 %rd22, %rd22, %rd21;
  st.global.{omt} [%rd22], {names['d']};
DONE:
  ret;
}}
"""
  mem = Memory()
  ptrs = []
  for i in range(3):
    arr = np.ascontiguousarray(inputs[i]) if i < len(inputs) else np.zeros(1, np.uint8)
    a = mem.alloc(max(arr.nbytes, 1))
    mem.array(a, np.uint8, arr.nbytes)[:] = arr.view(np.uint8).reshape(-1)
    ptrs.append(a)
  out = mem.alloc(n * osize)
  launch(parse_ptx(src), "k", -(-n // block), block, [out] + ptrs + [n], mem)
  return mem.array(out, out_dtype, n).copy()


# ---- exact float references (Fraction -> binary float with a rounding mode) ----
FMT = {"f32": (24, -126, 127), "f64": (53, -1022, 1023), "f16": (11, -14, 15), "bf16": (8, -126, 127)}


def round_fraction(x: Fraction, fmt: str, mode: str = "rn") -> float:
  """x rounded to the float format (precision p, exponents emin..emax, subnormals) in mode rn/rz/rm/rp."""
  p, emin, emax = FMT[fmt]
  if x == 0: return 0.0
  neg = x < 0
  a = -x if neg else x
  e = a.numerator.bit_length() - a.denominator.bit_length()
  if Fraction(2) ** e > a: e -= 1
  e = max(e, emin)
  ulp = Fraction(2) ** (e - p + 1)
  q, r = divmod(a, ulp)
  q = int(q)
  if r:
    if mode == "rn": q += 1 if (r > ulp / 2 or (r == ulp / 2 and q & 1)) else 0
    elif mode == "rp" and not neg or mode == "rm" and neg: q += 1
  v = q * ulp
  max_finite = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
  if v > max_finite:
    to_inf = mode == "rn" or (mode == "rp" and not neg) or (mode == "rm" and neg)
    out = math.inf if to_inf else float(max_finite)
  else:
    out = float(v)   # exact: v fits the format, and so a double
  return -out if neg else out


def f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]


def specials_f32(rng, n: int) -> np.ndarray:
  """Random float32 values of every magnitude, with zeros, subnormals, infinities and NaN mixed in."""
  bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
  v = bits.view(np.float32).copy()
  extra = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38,
                    3.4028235e38, -3.4028235e38, 65504.0, 65520.0, 6e-8, 3e-8], np.float32)
  v[:len(extra)] = extra
  return v


# =============================================================================================
# 1. parsing
# =============================================================================================

def test_parse_declarations_labels_and_params():
  src = HEADER + """
// a comment
.visible .entry first(.param .u64 a, .param .u32 b, .param .u8 c, .param .f64 d, .param .align 8 .b8 e[12])
.maxntid 128, 1, 1
{
  .reg .pred %p<3>;
  .reg .b32 %r<12>, %x;
  .reg .b64 %rd<2>;
  .local .align 8 .b8 scratch[24];
  .shared .align 4 .b8 tile[512];
  .shared .f32 row[3];
  /* block
     comment */
$L1:
  @!%p1 add.s32 %r1, %r2, -4;   // trailing
  ld.global.v2.u32 {%r3, %r4}, [%rd0+-8];
  setp.lt.or.f32 %p0|%p2, %r0, 0f3F800000, !%p1;
END: ret;
}
.entry second() { exit; }
"""
  m = parse_ptx(src)
  assert list(m.entries) == ["first", "second"] and m.version == "8.0" and m.target == "sm_90"
  e = m.entry("first")
  assert [(p.name, p.offset, p.size) for p in e.params] == [("a", 0, 8), ("b", 8, 4), ("c", 12, 1), ("d", 16, 8), ("e", 24, 12)]
  assert e.param_size == 36 and e.directives["maxntid"] == (128, 1, 1)
  assert len([r for r in e.regs if r[2:].isdigit() and r[1] == "r"]) == 12 and e.regs["%x"] == "b32" and e.regs["%p2"] == "pred"
  assert (e.variables["scratch"].offset, e.variables["scratch"].size) == (0, 24)
  assert (e.variables["tile"].offset, e.variables["row"].offset, e.space_size("shared")) == (0, 512, 524)
  assert e.labels == {"$L1": 0, "END": 3}
  add, ld, setp, ret = e.instrs
  assert add.guard.name == "%p1" and add.guard.neg and add.operands[2].value == -4 and add.line == 18
  assert ld.mods == ("global", "v2", "u32") and ld.operands[1].offset == -8 and len(ld.operands[0].items) == 2
  assert setp.operands[0].q.name == "%p2" and setp.operands[2].fbits == "f32" and setp.operands[3].neg
  assert ret.op == "ret"
  with pytest.raises(KeyError, match="no entry 'third'"): m.entry("third")


def test_unsupported_instruction_names_line():
  src = HEADER + ".visible .entry k(.param .u64 p)\n{\n  .reg .b64 %rd<2>;\n  .reg .b32 %r<2>;\n" \
        "  ld.param.u64 %rd0, [p];\n  atom.global.add.u32 %r0, [%rd0], 1;\n  ret;\n}\n"
  with pytest.raises(PtxUnsupported) as info:
    launch(parse_ptx(src), "k", 1, 1, [0], Memory())
  assert info.value.name == "atom.global.add.u32" and info.value.line == 9


# =============================================================================================
# 2. integer instructions against Python integers
# =============================================================================================

def _wrap(v: int, bits: int, signed: bool) -> int:
  v &= (1 << bits) - 1
  return v - (1 << bits) if signed and v >> (bits - 1) else v


def _ints(rng, t: str, n: int) -> np.ndarray:
  bits, signed = int(t[1:]), t[0] == "s"
  lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
  edge = [0, 1, 2, lo, hi, lo + 1, hi - 1, -1 if signed else hi // 2, 7, 3]
  small = rng.integers(-9 if signed else 0, 10, n // 4)
  big = [int(x) for x in rng.integers(0, 1 << 62, n - n // 4 - len(edge), dtype=np.int64)]
  vals = [_wrap(int(x), bits, signed) for x in edge + list(small) + [b * 4 + 3 for b in big]]
  return np.array(vals, dtype=np.dtype(("i" if signed else "u") + str(bits // 8)))


def _tdiv(a, b):   # C truncating division / remainder
  q = abs(a) // abs(b)
  q = -q if (a < 0) != (b < 0) else q
  return q, a - q * b


INT_CASES = [   # (body, out type, reference(a, b, bits, signed) -> int or None to skip)
  ("add.{t} {d}, {a0}, {a1};", lambda a, b, w, s: a + b),
  ("sub.{t} {d}, {a0}, {a1};", lambda a, b, w, s: a - b),
  ("mul.lo.{t} {d}, {a0}, {a1};", lambda a, b, w, s: a * b),
  ("mul.hi.{t} {d}, {a0}, {a1};", lambda a, b, w, s: (a * b) >> w),
  ("mad.lo.{t} {d}, {a0}, {a1}, {a0};", lambda a, b, w, s: a * b + a),
  ("div.{t} {d}, {a0}, {a1};", lambda a, b, w, s: None if b == 0 else _tdiv(a, b)[0]),
  ("rem.{t} {d}, {a0}, {a1};", lambda a, b, w, s: None if b == 0 else _tdiv(a, b)[1]),
  ("min.{t} {d}, {a0}, {a1};", lambda a, b, w, s: min(a, b)),
  ("max.{t} {d}, {a0}, {a1};", lambda a, b, w, s: max(a, b)),
  ("and.b{w} {d}, {a0}, {a1};", lambda a, b, w, s: a & b),
  ("or.b{w} {d}, {a0}, {a1};", lambda a, b, w, s: a | b),
  ("xor.b{w} {d}, {a0}, {a1};", lambda a, b, w, s: a ^ b),
  ("not.b{w} {d}, {a0};", lambda a, b, w, s: ~a),
  ("neg.s{w} {d}, {a0};", lambda a, b, w, s: -a),
  ("abs.s{w} {d}, {a0};", lambda a, b, w, s: abs(_wrap(a, w, True))),
  ("selp.{t} {d}, {a0}, {a1}, %p1;", None),
]


@pytest.mark.parametrize("t", ["s32", "u32", "s64", "u64", "s16", "u16"])
def test_integer_alu_matches_python(t):
  rng = np.random.default_rng(1)
  w, signed = int(t[1:]), t[0] == "s"
  a = _ints(rng, t, 200)
  b = np.roll(_ints(rng, t, 200), 7)
  b[::11] = -1 if signed else b[::11]
  ins = [t.replace("s", "b").replace("u", "b")] * 2 if w == 16 else [t, t]
  for body, ref in INT_CASES:
    if ref is None: continue
    if w == 16 and ("mul.hi" in body or "div" in body or "rem" in body or "mad" in body): continue
    text = body.replace("{t}", t).replace("{w}", str(w))
    reg_t = "b16" if w == 16 else t
    got = elementwise(text, reg_t, [reg_t, reg_t], [a, b], a.dtype)
    for x, y, g in zip(a.tolist(), b.tolist(), got.tolist()):
      want = ref(x, y, w, signed)
      if want is None: continue
      assert g == _wrap(want, w, signed), f"{text} with a={x}, b={y}: got {g}, want {_wrap(want, w, signed)}"


def test_mul_wide_shifts_and_bit_ops():
  rng = np.random.default_rng(2)
  a = _ints(rng, "s32", 128)
  b = _ints(rng, "s32", 128)
  got = elementwise("mul.wide.s32 {d}, {a0}, {a1};", "s64", ["s32", "s32"], [a, b], np.int64)
  assert got.tolist() == [x * y for x, y in zip(a.tolist(), b.tolist())]
  ua, ub = a.view(np.uint32), b.view(np.uint32)
  got = elementwise("mul.wide.u32 {d}, {a0}, {a1};", "u64", ["u32", "u32"], [ua, ub], np.uint64)
  assert got.tolist() == [x * y for x, y in zip(ua.tolist(), ub.tolist())]
  amounts = np.array([0, 1, 5, 31, 32, 33, 200, 7] * 16, np.uint32)
  for op, ref in (("shl.b32", lambda x, n: (x << n) & 0xFFFFFFFF if n < 32 else 0),
                  ("shr.u32", lambda x, n: x >> n if n < 32 else 0),
                  ("shr.s32", lambda x, n: _wrap(x, 32, True) >> min(n, 31))):
    got = elementwise(f"{op} {{d}}, {{a0}}, {{a1}};", "b32", ["b32", "u32"], [ua, amounts], np.uint32)
    assert [g for g in got.tolist()] == [_wrap(ref(x, n), 32, False) for x, n in zip(ua.tolist(), amounts.tolist())], op
  a64 = _ints(rng, "u64", 128)
  amounts64 = np.array([0, 1, 63, 64, 65, 32, 31, 7] * 16, np.uint32)
  got = elementwise("shl.b64 {d}, {a0}, {a1};", "b64", ["b64", "u32"], [a64, amounts64], np.uint64)
  assert got.tolist() == [(x << n) & (2**64 - 1) if n < 64 else 0 for x, n in zip(a64.tolist(), amounts64.tolist())]
  got = elementwise("clz.b64 {d}, {a0};", "b32", ["b64"], [a64], np.uint32)
  assert got.tolist() == [64 - x.bit_length() for x in a64.tolist()]
  got = elementwise("clz.b32 {d}, {a0};", "b32", ["b32"], [ua], np.uint32)
  assert got.tolist() == [32 - x.bit_length() for x in ua.tolist()]
  got = elementwise("popc.b64 {d}, {a0};", "b32", ["b64"], [a64], np.uint32)
  assert got.tolist() == [bin(x).count("1") for x in a64.tolist()]
  got = elementwise("brev.b32 {d}, {a0};", "b32", ["b32"], [ua], np.uint32)
  assert got.tolist() == [int(f"{x:032b}"[::-1], 2) for x in ua.tolist()]
  pos = np.array([0, 4, 28, 31, 40, 3, 8, 16] * 16, np.uint32)
  ln = np.array([8, 0, 8, 4, 3, 32, 255, 12] * 16, np.uint32)
  for t, npt in (("u32", np.uint32), ("s32", np.int32)):
    got = elementwise(f"bfe.{t} {{d}}, {{a0}}, {{a1}}, {{a2}};", t, [t, "u32", "u32"], [a.view(npt), pos, ln], npt)
    for x, p, n, g in zip(ua.tolist(), pos.tolist(), ln.tolist(), got.tolist()):
      # PTX: bit i of d is bit pos+i of a for i < len and pos+i <= 31, else the sign bit (bit min(pos+len-1, 31) of
      # a for .s32 when len > 0; 0 otherwise)
      sbit = (x >> min(p + n - 1, 31)) & 1 if t == "s32" and n else 0
      want = sum(((x >> (p + i)) & 1 if i < n and p + i <= 31 else sbit) << i for i in range(32))
      assert g == _wrap(want, 32, t == "s32"), (t, x, p, n)


def test_integer_division_edge_cases_and_64bit_mul_hi():
  a = np.array([-2**63, -2**63, 7, -7, 7, -7, 2**63 - 1, 5], np.int64)
  b = np.array([-1, 1, 2, 2, -2, -2, -1, 0], np.int64)
  q = elementwise("div.s64 {d}, {a0}, {a1};", "s64", ["s64", "s64"], [a, b], np.int64)
  r = elementwise("rem.s64 {d}, {a0}, {a1};", "s64", ["s64", "s64"], [a, b], np.int64)
  assert q[:7].tolist() == [-2**63, -2**63, 3, -3, -3, 3, -(2**63 - 1)]   # INT_MIN / -1 wraps
  assert r[:7].tolist() == [0, 0, 1, -1, 1, -1, 0]
  x = np.array([2**64 - 1, 2**63, 12345678901234567, 3], np.uint64)
  y = np.array([2**64 - 1, 2**63 + 5, 98765432109876543, 2**64 - 2], np.uint64)
  got = elementwise("mul.hi.u64 {d}, {a0}, {a1};", "u64", ["u64", "u64"], [x, y], np.uint64)
  assert got.tolist() == [(i * j) >> 64 for i, j in zip(x.tolist(), y.tolist())]
  got = elementwise("mul.hi.s64 {d}, {a0}, {a1};", "s64", ["s64", "s64"], [x.view(np.int64), y.view(np.int64)], np.int64)
  assert got.tolist() == [(i * j) >> 64 for i, j in zip(x.view(np.int64).tolist(), y.view(np.int64).tolist())]


# =============================================================================================
# 3. floats against exact rationals
# =============================================================================================

def _frac(v) -> Fraction: return Fraction(float(v))


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_f32_add_mul_fma_round_exactly(mode):
  rng = np.random.default_rng(3)
  a = specials_f32(rng, 300)
  b = np.roll(specials_f32(rng, 300), 3)
  # scale some pairs to close magnitudes so cancellation and ties happen
  b[100:200] = (a[100:200] * np.float32(1.0000001)).astype(np.float32)
  c = np.roll(a, 17)
  for body, fn in ((f"add.{mode}.f32 {{d}}, {{a0}}, {{a1}};", lambda x, y, z: x + y),
                   (f"sub.{mode}.f32 {{d}}, {{a0}}, {{a1}};", lambda x, y, z: x - y),
                   (f"mul.{mode}.f32 {{d}}, {{a0}}, {{a1}};", lambda x, y, z: x * y),
                   (f"fma.{mode}.f32 {{d}}, {{a0}}, {{a1}}, {{a2}};", lambda x, y, z: x * y + z)):
    got = elementwise(body, "f32", ["f32"] * 3, [a, b, c], np.float32)
    for x, y, z, g in zip(a, b, c, got):
      if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)): continue
      exact = fn(_frac(x), _frac(y), _frac(z))
      want = round_fraction(exact, "f32", mode)
      if exact == 0:   # the sign of an exact zero follows IEEE rules; compare as zeros
        assert g == 0, body; continue
      assert f32_bits(g) == f32_bits(want), f"{body} {x!r} {y!r} {z!r}: got {g!r}, want {want!r}"
  if mode == "rn":   # against numpy too: non-finite inputs follow IEEE
    got = elementwise("add.rn.f32 {d}, {a0}, {a1};", "f32", ["f32"] * 2, [a, b], np.float32)
    with np.errstate(invalid="ignore"): np.testing.assert_array_equal(got, a + b)


def test_f32_div_sqrt_rcp_are_correctly_rounded():
  rng = np.random.default_rng(4)
  a, b = specials_f32(rng, 400), np.roll(specials_f32(rng, 400), 5)
  q = elementwise("div.rn.f32 {d}, {a0}, {a1};", "f32", ["f32", "f32"], [a, b], np.float32)
  r = elementwise("rcp.rn.f32 {d}, {a0};", "f32", ["f32"], [b], np.float32)
  s = elementwise("sqrt.rn.f32 {d}, {a0};", "f32", ["f32"], [np.abs(a)], np.float32)
  for x, y, g, gr in zip(a, b, q, r):
    if np.isfinite(x) and np.isfinite(y) and y != 0:
      assert f32_bits(g) == f32_bits(round_fraction(_frac(x) / _frac(y), "f32")), (x, y)
      assert f32_bits(gr) == f32_bits(round_fraction(1 / _frac(y), "f32")), y
  for x, g in zip(np.abs(a), s):
    if np.isfinite(x):   # correctly rounded iff the neighbours bracket sqrt(x) (compare squares exactly)
      lo, hi = np.nextafter(g, np.float32(0)), np.nextafter(g, np.float32(np.inf))
      mid_lo, mid_hi = (_frac(lo) + _frac(g)) / 2, (_frac(g) + _frac(hi)) / 2
      assert mid_lo ** 2 <= _frac(x) <= mid_hi ** 2, x
  with np.errstate(invalid="ignore"):   # signaling NaNs among the random bits
    a64, b64 = a.astype(np.float64) * 3.3, b.astype(np.float64)
  got = elementwise("div.rn.f64 {d}, {a0}, {a1};", "f64", ["f64", "f64"], [a64, b64], np.float64)
  for x, y, g in zip(a64, b64, got):
    if np.isfinite(x) and np.isfinite(y) and y != 0:
      assert g == round_fraction(_frac(x) / _frac(y), "f64"), (x, y)


def test_f64_fma_is_fused():
  a = np.array([1 + 2**-30, 0.1, 1e308, -3.0, 2.0], np.float64)
  b = np.array([1 - 2**-30, 10.0, 10.0, 0.0, np.inf], np.float64)
  c = np.array([-1.0, -1.0, -1e308, -0.0, 1.0], np.float64)
  got = elementwise("fma.rn.f64 {d}, {a0}, {a1}, {a2};", "f64", ["f64"] * 3, [a, b, c], np.float64)
  assert got[0] == -2.0**-60 and got[1] == float(Fraction(0.1) * 10 - 1)
  assert got[2] == 9e308 and got[3] == 0 and np.signbit(got[3]) and got[4] == np.inf


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_float_narrowing_conversions(mode):
  rng = np.random.default_rng(5)
  bits = rng.integers(0, 1 << 64, 500, dtype=np.uint64)
  d = bits.view(np.float64).copy()
  d[:250] = (d[:250].view(np.uint64) & np.uint64(0x800FFFFFFFFFFFFF) | np.uint64(0x3800000000000000)).view(np.float64)  # f32 range
  d[:8] = [0.0, -0.0, np.inf, -np.inf, 3.4028235677973366e38, 3.4028236e38 * 1.0000001, 1.401298464324817e-45 / 2, 1e-50]
  got = elementwise(f"cvt.{mode}.f32.f64 {{d}}, {{a0}};", "f32", ["f64"], [d], np.float32)
  for x, g in zip(d, got):
    if np.isnan(x): assert np.isnan(g); continue
    want = x if np.isinf(x) else round_fraction(_frac(x), "f32", mode)
    assert f32_bits(g) == f32_bits(np.float32(want)) or (want == 0 and g == 0), (x, g, want)
  f = specials_f32(rng, 2000)
  f[100:1100] = (f[100:1100].view(np.uint32) & np.uint32(0x807FFFFF) | np.uint32(0x33000000) +
                 (np.arange(1000, dtype=np.uint32) % 30 << np.uint32(23))).view(np.float32)   # the f16 range
  h = elementwise(f"cvt.{mode}.f16.f32 {{d}}, {{a0}};", "b16", ["f32"], [f], np.uint16)
  for x, g in zip(f, h):
    if np.isnan(x): assert (g & 0x7C00) == 0x7C00 and g & 0x3FF; continue
    want = x if np.isinf(x) else round_fraction(_frac(x), "f16", mode)
    want_bits = struct.unpack("<H", struct.pack("<e", want))[0] if abs(want) <= 65504 or np.isinf(want) else None
    if want == 0: want_bits = 0x8000 if np.signbit(x) else 0
    assert g == want_bits, (x, hex(g), want)
  if mode == "rn":   # and Python's own float -> half packing
    ok = np.abs(f) < 65520
    py = np.array([struct.unpack("<H", struct.pack("<e", float(x)))[0] for x in f[ok]], np.uint16)
    np.testing.assert_array_equal(h[ok], py)
  bf = elementwise(f"cvt.{mode}.bf16.f32 {{d}}, {{a0}};", "b16", ["f32"], [f], np.uint16)
  for x, g in zip(f, bf):
    if np.isnan(x) or np.isinf(x): continue
    want = round_fraction(_frac(x), "bf16", mode)
    if want == 0: assert g & 0x7FFF == 0; continue
    assert g == f32_bits(want) >> 16, (x, hex(g), want)


def test_float_to_int_saturates_and_int_to_float_rounds():
  f = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3e9, -3e9, np.nan, np.inf, -np.inf, 2147483520.0, -2147483648.0, 7.9, -7.9],
               np.float32)
  for mode, rnd in (("rni", lambda x: round(x)), ("rzi", math.trunc), ("rmi", math.floor), ("rpi", math.ceil)):
    got = elementwise(f"cvt.{mode}.s32.f32 {{d}}, {{a0}};", "s32", ["f32"], [f], np.int32)
    want = [0 if math.isnan(x) else max(-2**31, min(2**31 - 1, rnd(x) if math.isfinite(x) else (2**40 if x > 0 else -2**40)))
            for x in f.tolist()]
    assert got.tolist() == want, mode
  got = elementwise("cvt.rzi.u64.f64 {d}, {a0};", "u64", ["f64"], [np.array([1.9, -5.0, 2.0**64, 2.0**63 + 2048, np.nan, 1e19])],
                    np.uint64)
  assert got.tolist() == [1, 0, 2**64 - 1, 2**63 + 2048, 0, 10**19]
  ints = np.array([2**63 - 1, -2**63, 2**53 + 1, 2**24 + 1, -(2**24 + 3), 123456789123, 0, -1], np.int64)
  for mode in ("rn", "rz", "rm", "rp"):
    got = elementwise(f"cvt.{mode}.f32.s64 {{d}}, {{a0}};", "f32", ["s64"], [ints], np.float32)
    assert [f32_bits(g) for g in got] == [f32_bits(round_fraction(Fraction(int(i)), "f32", mode)) for i in ints.tolist()], mode
    got = elementwise(f"cvt.{mode}.f64.u64 {{d}}, {{a0}};", "f64", ["u64"], [ints.view(np.uint64)], np.float64)
    assert got.tolist() == [round_fraction(Fraction(int(i)), "f64", mode) for i in ints.view(np.uint64).tolist()], mode
  u = np.array([2**64 - 1, 2**63 + 2**39 + 1, 2**32 - 1, 16777217], np.uint64)
  got = elementwise("cvt.rn.f32.u64 {d}, {a0};", "f32", ["u64"], [u], np.float32)
  assert got.tolist() == [round_fraction(Fraction(int(i)), "f32") for i in u.tolist()]
  got = elementwise("cvt.rn.f16.s32 {d}, {a0};", "b16", ["s32"], [np.array([2049, 2051, 70000, -65519, 65520], np.int32)], np.uint16)
  assert got.view(np.float16).tolist() == [2048.0, 2052.0, np.inf, -65504.0, np.inf]


def test_int_conversions_extend_truncate_and_saturate():
  x = np.array([0x1FF, 0x80, 0x7F, 0xFFFF8000, 0x12345678, 0xFFFFFFFF], np.uint32)
  got = elementwise("cvt.s32.s8 {d}, {a0};", "s32", ["b32"], [x], np.int32)
  assert got.tolist() == [-1, -128, 127, 0, 0x78, -1]
  got = elementwise("cvt.u32.u16 {d}, {a0};", "u32", ["b32"], [x], np.uint32)
  assert got.tolist() == [0x1FF, 0x80, 0x7F, 0x8000, 0x5678, 0xFFFF]
  got = elementwise("cvt.s64.s32 {d}, {a0};", "s64", ["s32"], [x.view(np.int32)], np.int64)
  assert got.tolist() == x.view(np.int32).tolist()
  got = elementwise("cvt.sat.u8.s32 {d}, {a0};", "u32", ["s32"], [x.view(np.int32)], np.uint32)
  assert got.tolist() == [255, 128, 127, 0, 255, 0]
  got = elementwise("cvt.sat.s16.s32 {d}, {a0};", "s32", ["s32"], [x.view(np.int32)], np.int32)
  assert got.tolist() == [0x1FF, 0x80, 0x7F, -32768, 32767, -1]
  got = elementwise("ld.global.s8 {d}, [%rd20];", "s32", ["b32"], [x], np.int32)   # loads extend by type
  assert got.tolist() == [-1, -128, 127, 0, 0x78, -1]


def test_compare_select_and_minmax_nan_rules():
  nan = np.float32(np.nan)
  a = np.array([1, 2, nan, nan, -0.0, 0.0, np.inf, 3], np.float32)
  b = np.array([2, 2, 1, nan, 0.0, -0.0, np.inf, nan], np.float32)
  for cmp in ("eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"):
    got = elementwise(f"setp.{cmp}.f32 %p1, {{a0}}, {{a1}}; selp.u32 {{d}}, 1, 0, %p1;", "u32", ["f32", "f32"], [a, b], np.uint32)
    base = cmp.rstrip("u") if cmp not in ("num", "nan") else cmp
    want = []
    for x, y in zip(a.tolist(), b.tolist()):
      unordered = math.isnan(x) or math.isnan(y)
      if cmp == "num": want.append(not unordered); continue
      if cmp == "nan": want.append(unordered); continue
      r = {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[base]
      want.append((r or unordered) if cmp.endswith("u") else (r and not unordered))
    assert got.tolist() == [int(w) for w in want], cmp
  got = elementwise("setp.gt.and.f32 %p1|%p2, {a0}, {a1}, %p3; selp.u32 {d}, 1, 0, %p2;", "u32", ["f32", "f32"], [a, b], np.uint32)
  assert not got.any()   # %p3 is false: both results false
  mn = elementwise("min.f32 {d}, {a0}, {a1};", "f32", ["f32"] * 2, [a, b], np.float32)
  mx = elementwise("max.f32 {d}, {a0}, {a1};", "f32", ["f32"] * 2, [a, b], np.float32)
  assert mn[[0, 1, 2, 6, 7]].tolist() == [1, 2, 1, np.inf, 3] and mx[[0, 2, 7]].tolist() == [2, 1, 3]
  assert mn.view(np.uint32)[3] == 0x7FFFFFFF and np.signbit(mn[4]) and np.signbit(mn[5]) and not np.signbit(mx[4])
  got = elementwise("testp.notanumber.f32 %p1, {a0}; selp.u32 {d}, 1, 0, %p1;", "u32", ["f32"], [a], np.uint32)
  assert got.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
  neg = elementwise("neg.f32 {d}, {a0};", "f32", ["f32"], [a], np.float32)
  assert (neg.view(np.uint32) == (a.view(np.uint32) ^ np.uint32(0x80000000))).all()


# =============================================================================================
# 4. control flow and memory
# =============================================================================================

DIVERGE = HEADER + """
.visible .entry k(.param .u64 out, .param .u32 n)
{
  .reg .pred %p<4>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<4>;
  mov.u32 %r0, %tid.z;
  mov.u32 %r1, %ntid.y;
  mov.u32 %r2, %tid.y;
  mad.lo.s32 %r0, %r0, %r1, %r2;      // z * ny + y
  mov.u32 %r1, %ntid.x;
  mov.u32 %r2, %tid.x;
  mad.lo.s32 %r0, %r0, %r1, %r2;      // linear thread index in the block
  mov.u32 %r1, %ctaid.x;
  mad.lo.s32 %r0, %r1, 256, %r0;      // global id
  ld.param.u32 %r9, [n];
  setp.ge.u32 %p3, %r0, %r9;
  @%p3 exit;                           // threads past n leave early
  and.b32 %r3, %r0, 7;                 // trip count: id % 8
  mov.u32 %r4, 0;
  mov.u32 %r5, 0;
LOOP:
  setp.ge.u32 %p0, %r4, %r3;
  @%p0 bra AFTER;
  add.u32 %r5, %r5, %r4;
  and.b32 %r6, %r4, 1;                 // if/else inside the loop
  setp.eq.u32 %p1, %r6, 0;
  @%p1 bra EVEN;
  add.u32 %r5, %r5, 100;
  bra JOIN;
EVEN:
  add.u32 %r5, %r5, 1000;
JOIN:
  add.u32 %r4, %r4, 1;
  bra LOOP;
AFTER:
  setp.eq.u32 %p2, %r3, 5;
  @%p2 ret;                            // some threads return without storing
  ld.param.u64 %rd0, [out];
  mul.wide.u32 %rd1, %r0, 4;
  add.s64 %rd0, %rd0, %rd1;
  st.global.u32 [%rd0], %r5;
  ret;
}
"""


def test_divergent_loops_branches_and_exits(monkeypatch):
  def want(i):
    t = i % 8
    return None if t == 5 else sum(j + (1000 if j % 2 == 0 else 100) for j in range(t))
  for batch in (1 << 16, 64):   # one batch, and several batches of whole blocks
    monkeypatch.setattr(ptxmod, "BATCH_THREADS", batch)
    mem = Memory()
    n = 1000
    out = mem.alloc(1024 * 4)
    mem.array(out, np.uint32, 1024)[:] = 0xDEADBEEF
    launch(parse_ptx(DIVERGE), "k", 4, (32, 4, 2), [out, n], mem)
    got = mem.array(out, np.uint32, 1024)
    assert got.tolist() == [0xDEADBEEF if i >= n or want(i) is None else want(i) for i in range(1024)]


SHARED = HEADER + """
.visible .entry rev(.param .u64 data)
{
  .reg .pred %p<2>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b32 tile[64];
  .local .align 4 .b8 scratch[16];
  mov.u32 %r0, %tid.x;
  mov.u32 %r1, %tid.y;
  mov.u32 %r2, %ntid.x;
  mad.lo.s32 %r3, %r1, %r2, %r0;       // thread index in the block (0..63)
  mov.u32 %r4, %ctaid.x;
  shl.b32 %r5, %r4, 6;
  add.s32 %r5, %r5, %r3;               // global element
  ld.param.u64 %rd0, [data];
  mul.wide.u32 %rd1, %r5, 4;
  add.s64 %rd0, %rd0, %rd1;
  ld.global.u32 %r6, [%rd0];
  // through .local (generic address) first
  mov.u64 %rd2, scratch;
  cvta.local.u64 %rd3, %rd2;
  st.u32 [%rd3+8], %r6;
  ld.local.u32 %r6, [%rd2+8];
  mov.u32 %r7, tile;
  shl.b32 %r8, %r3, 2;
  add.s32 %r8, %r7, %r8;
  setp.lt.u32 %p0, %r3, 32;            // divergent path before the barrier
  @%p0 add.s32 %r6, %r6, 0;
  st.shared.u32 [%r8], %r6;
  bar.sync 0;
  mov.u32 %r9, 63;
  sub.s32 %r9, %r9, %r3;
  shl.b32 %r9, %r9, 2;
  add.s32 %r9, %r7, %r9;
  ld.shared.u32 %r10, [%r9];
  st.global.u32 [%rd0], %r10;
  ret;
}
"""


@pytest.mark.parametrize("batch", [1 << 16, 64, 128])
def test_bar_sync_shared_and_local_memory(monkeypatch, batch):
  monkeypatch.setattr(ptxmod, "BATCH_THREADS", batch)
  mem = Memory()
  data = mem.alloc(5 * 64 * 4)
  src = np.arange(5 * 64, dtype=np.uint32) * 3 + 1
  mem.array(data, np.uint32, 5 * 64)[:] = src
  launch(parse_ptx(SHARED), "rev", (5, 1, 1), (16, 4, 1), [data], mem)
  np.testing.assert_array_equal(mem.array(data, np.uint32, 5 * 64), src.reshape(5, 64)[:, ::-1].reshape(-1))


def test_params_as_bytes_vectors_and_specials():
  src = HEADER + """
.visible .entry k(.param .u64 out, .param .f32 scale, .param .s16 bias)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd0, [out];
  ld.param.f32 %f0, [scale];
  ld.param.s16 %r0, [bias];
  mov.u32 %r1, %ctaid.y;
  mov.u32 %r2, %nctaid.y;
  mov.u32 %r3, %tid.z;
  mov.b32 %r4, %f0;
  mov.u32 %r5, %laneid;
  mad.lo.s32 %r6, %r1, 4, %r3;
  mul.wide.u32 %rd1, %r6, 16;
  add.s64 %rd1, %rd0, %rd1;
  st.global.v4.u32 [%rd1], {%r0, %r2, %r4, %r5};
  ret;
}
"""
  mem = Memory()
  out = mem.alloc(3 * 4 * 16)
  params = struct.pack("<Qfh", out, 1.5, -3) + b"\0\0"
  launch(parse_ptx(src), "k", (1, 3, 1), (1, 1, 2), params, mem)
  got = mem.array(out, np.uint32, 48).reshape(12, 4)
  for y in range(3):
    for z in range(2):
      assert got[y * 4 + z].tolist() == [2**32 - 3, 3, f32_bits(1.5), z]


def test_memory_fault_runaway_and_param_errors():
  mem = Memory()
  src = HEADER + ".visible .entry k(.param .u64 p)\n{\n  .reg .b64 %rd<2>;\n  .reg .b32 %r<2>;\n" \
        "  ld.param.u64 %rd0, [p];\n  ld.global.u32 %r0, [%rd0+4096];\n  ret;\n}\n"
  a = mem.alloc(64)
  with pytest.raises(MemoryFault) as info:
    launch(parse_ptx(src), "k", 1, 32, [a], mem)
  assert info.value.address == a + 4096
  loop = HEADER + ".visible .entry spin()\n{\n  .reg .b32 %r<2>;\nTOP:\n  add.s32 %r0, %r0, 1;\n  bra TOP;\n}\n"
  with pytest.raises(PtxRunaway, match=r"spin: more than 1000 instruction dispatches \(at line \d+"):
    launch(parse_ptx(loop), "spin", 2, 64, [], mem, max_steps=1000)
  with pytest.raises(ValueError, match="takes 1 parameters"):
    launch(parse_ptx(src), "k", 1, 1, [], mem)
  with pytest.raises(ValueError, match="at most 1024 threads"):
    launch(parse_ptx(src), "k", 1, (64, 32), [a], mem)


def test_supported_instruction_list():
  for name in ("add", "sub", "mul", "mad", "fma", "div", "rem", "min", "max", "and", "or", "xor", "not", "shl", "shr",
               "neg", "abs", "setp", "selp", "testp", "rcp", "sqrt", "cvt", "cvta", "mov", "ld", "st", "bra", "ret",
               "exit", "bar", "clz"):
    assert name in SUPPORTED


# =============================================================================================
# 5. render_ptx kernels vs the CPU device
# =============================================================================================

@pytest.fixture(scope="module")
def bg():
  """baregrad on the CPU device, with every KernelSpec recorded by the program it compiled to."""
  from baregrad.tensor import Tensor
  from baregrad.compiler import schedule, codegen
  from baregrad.compiler.render_ptx import PTXRenderer
  from baregrad.compiler.dtype import dtypes
  from baregrad.compiler.uop import Ops, BINARY
  from baregrad.hcq.runtime import run_schedule
  specs = {}
  original = schedule.get_programs

  def get_programs(items):
    items = list(items)
    progs = original(items)
    for spec, prog in zip(items, progs): specs[id(prog)] = (spec, prog)
    return progs
  schedule.get_programs = get_programs
  ns = type("BG", (), {})()
  ns.Tensor, ns.codegen, ns.renderer, ns.dtypes, ns.Ops, ns.BINARY = Tensor, codegen, PTXRenderer(), dtypes, Ops, BINARY
  ns.run_schedule, ns.specs = run_schedule, specs
  ns.tensor = lambda data, dtype=None: Tensor(data, dtype=dtype, device="CPU")   # the reference: the CPU, whatever DEV
  yield ns
  schedule.get_programs = original


def _read(buf) -> np.ndarray:
  out = np.empty(buf.nbytes, np.uint8)
  if buf.nbytes: buf.copyout(memoryview(out))
  return out


def _as_values(raw: np.ndarray, dt):
  if dt.name == "bfloat16": return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
  return raw.view(dt.np)


def run_on_both(bg, *tensors, opts=()):
  """Run the schedule of `tensors` item by item: each kernel in the interpreter (rendered by PTXRenderer) on
  copies of the CPU device's input buffers, then on the CPU device. Returns [(name, dtype, cpu, emu, src)].
  opts: the GPU opts (none by default: one thread per output, every reduction in the CPU's order, so results can be
  compared bit for bit; None: the heuristic's, which reorder sums)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nv"))
  import kernel_capture
  out = []
  for item in bg.Tensor.schedule(*tensors):
    if item.program is None:
      bg.run_schedule([item], sync=True); continue
    spec, _ = bg.specs[id(item.program)]
    program, alias, variables, launch_dims = kernel_capture.lower(spec, bg.renderer, opts)
    src = bg.renderer.render("k", program, alias, len(spec.params), variables)
    mem, addr = Memory(), {}
    for b in item.bufs:   # exact-size mappings: threads past the end must not touch memory (MemoryFault)
      if id(b) not in addr:
        a = mem.alloc(b.nbytes)
        mem.array(a, np.uint8, b.nbytes)[:] = _read(b)
        addr[id(b)] = a
    params = [addr[id(b)] for b in item.bufs] + [item.var_vals[v] for v in item.program.variables]
    launch(parse_ptx(src), "k", launch_dims["global_size"], launch_dims["local_size"], params, mem)
    bg.run_schedule([item], sync=True)
    o = item.bufs[0]
    out.append((spec.name, o.dtype, _read(o), mem.array(addr[id(o)], np.uint8, o.nbytes).copy(), src))
  return out


def mismatches(dt, cpu: np.ndarray, emu: np.ndarray, rtol: float = 0.0) -> np.ndarray:
  """Indices where the interpreter differs from the CPU: bits must match, NaN matches any NaN; with rtol, floats
  may differ by that relative amount."""
  n = cpu.size // dt.itemsize
  same = (cpu.reshape(n, -1) == emu.reshape(n, -1)).all(1)
  if dt.is_float:
    c, e = _as_values(cpu, dt).astype(np.float64), _as_values(emu, dt).astype(np.float64)
    same |= np.isnan(c) & np.isnan(e)
    if rtol: same |= np.isclose(c, e, rtol=rtol, atol=rtol) | ((c == e) & np.isinf(c))
  return np.flatnonzero(~same)


FLOATS = [0.0, -0.0, 1.5, -2.5, 0.1, 1 / 3, 2.5, -3.5, 1e-40, -7.25, 65504.0, 1e30, math.inf, -math.inf, math.nan, 100.7]
FINITE = [0.0, -0.0, 1.5, -2.5, 0.1, 1 / 3, 2.5, -3.5, 1e-40, -7.25, 100.7, 99.5, -100.2, 0.5, 126.9, -127.9]


def _values(dt, kind: str = "any") -> np.ndarray:
  if dt.is_bool: return np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 0, 0], bool)
  if dt.is_float:
    v = {"any": FLOATS, "finite": FINITE, "nonneg": [abs(x) for x in FINITE],
         "other": [0.0, 3.0, -1.5, 0.0, 7.0, 3.0, -0.25, 1e-39, math.nan, -math.inf, 2.5, 0.1, 1e20, -2.5, 0.75, 3.0]}[kind]
    return np.array(v, np.float64)
  bits = 8 * dt.itemsize
  if dt.is_unsigned:
    mx = (1 << bits) - 1
    v = [0, 1, 2, 3, 7, 100, 200, 255, mx, mx - 1, mx // 2, mx // 2 + 1, 12345 % (mx + 1), 65535 % (mx + 1), 9, 5]
  else:
    mx = (1 << (bits - 1)) - 1
    v = [0, 1, -1, 3, -7, 100, -100, 127, mx, -mx - 1, mx - 1, -mx, 12345 % (mx + 1), -(12345 % (mx + 1)), 9, -5]
  if kind == "other":
    v = v[::-1]
    v[2], v[4] = 0, (-1 if not dt.is_unsigned else v[4])
  if kind == "shift": v = [i % bits for i in (0, 1, 2, 3, 4, 5, 6, 7, bits - 1, bits - 2, 1, 2, 3, 0, 5, 7)]
  return np.array(v, dtype=np.int64 if not dt.is_unsigned else np.uint64).astype(dt.np)


def _tensor(bg, dt, kind="any"):
  v = _values(dt, kind)
  if dt.name == "bfloat16": return bg.tensor(v.astype(np.float32), dtype=dt)
  with np.errstate(over="ignore"):
    return bg.tensor(v.astype(dt.np))


def _segments(bg, dt) -> list[tuple[str, object, float]]:
  """(label, tensor of 16 elements, rtol) for one dtype: binary ops, unary ops, where."""
  Ops = bg.Ops
  segs = []
  for op in sorted(bg.BINARY, key=lambda o: o.name):
    if dt.is_float and op in (Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.IDIV): continue
    b = _tensor(bg, dt, "shift" if op in (Ops.SHL, Ops.SHR) and not dt.is_bool else "other" if not dt.is_bool else "any")
    if dt.is_bool: b = _tensor(bg, dt).flip(0)
    segs.append((op.name, _tensor(bg, dt)._alu(op, b), 0.0))
  unary = [Ops.NEG, Ops.TRUNC]
  if dt.is_float: unary += [Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN]
  elif not dt.is_bool:
    unary += [Ops.RECIP]
    segs.append(("SQRT", _tensor(bg, dt, "shift" if not dt.is_unsigned else "any")._alu(Ops.SQRT), 0.0))  # >= 0: C defines it
  for op in unary:
    approx = op in (Ops.EXP2, Ops.LOG2, Ops.SIN)   # decomposed polynomials: gcc fuses their a*b+c on the CPU
    segs.append((op.name, _tensor(bg, dt, "finite" if approx else "any")._alu(op), 1e-6 if approx else 0.0))
  segs.append(("WHERE", _tensor(bg, bg.dtypes.bool)._alu(Ops.WHERE, _tensor(bg, dt), _tensor(bg, dt, "other"), dtype=dt), 0.0))
  return segs


def _check_concat(bg, label, segs, failures, counts):
  """Concatenate same-dtype segments into one kernel (cat fuses them, with gated loads) and compare."""
  by_dtype = {}
  for name, t, rtol in segs: by_dtype.setdefault(t.dtype, []).append((name, t, rtol))
  for dt, group in by_dtype.items():
    cat = bg.Tensor.cat(*[t for _, t, _ in group])
    results = run_on_both(bg, cat)
    assert len(results) == 1, f"{label}: expected one fused kernel, got {[r[0] for r in results]}"
    _, odt, cpu, emu, src = results[0]
    n = cpu.size // odt.itemsize
    bad = set(mismatches(odt, cpu, emu).tolist())
    loose = set(mismatches(odt, cpu, emu, 1e-6).tolist())
    start = 0
    for name, t, rtol in group:
      rows = range(start, start + t.shape[0])
      start += t.shape[0]
      wrong = [i for i in rows if i in (loose if rtol else bad)]
      counts["kernels"] += 1
      if wrong:
        c, e = _as_values(cpu, odt), _as_values(emu, odt)
        failures.append(f"{label} {name} -> {odt.name}: at {[i - rows[0] for i in wrong]}: cpu {c[wrong].tolist()} "
                        f"emu {e[wrong].tolist()}")
      elif any(i in bad for i in rows): counts["within_tolerance"] += 1
      else: counts["bit_exact"] += 1
    assert start == n


def test_render_ptx_op_dtype_matrix_matches_cpu(bg):
  failures, counts = [], {"kernels": 0, "bit_exact": 0, "within_tolerance": 0}
  dts = bg.dtypes.all()
  for dt in dts:
    _check_concat(bg, dt.name, _segments(bg, dt), failures, counts)
  # casts: for each destination, one kernel over every source (values a C cast defines: in range for ints)
  for dst in dts:
    segs = []
    for src in dts:
      if src == dst: continue
      kind = "nonneg" if (src.is_float and dst.is_unsigned) else "finite" if (src.is_float and dst.is_int) else "any"
      segs.append((f"cast {src.name}", _tensor(bg, src, kind).cast(dst), 0.0))
      if src.itemsize == dst.itemsize and not src.is_bool and not dst.is_bool:
        segs.append((f"bitcast {src.name}", _tensor(bg, src).bitcast(dst), 0.0))
    _check_concat(bg, f"->{dst.name}", segs, failures, counts)
  # reductions (fused into one kernel per dtype)
  for dt in dts:
    kind = "finite" if dt.is_float else "any"
    segs = [("sum", _tensor(bg, dt, kind).sum().reshape(1), 0.0), ("max", _tensor(bg, dt).max().reshape(1), 0.0),
            ("prod", _tensor(bg, dt, kind).prod().reshape(1), 0.0), ("rowsum", _tensor(bg, dt, kind).reshape(4, 4).sum(1), 0.0),
            ("pad", _tensor(bg, dt).pad(((2, 1),)), 0.0)]
    if dt.is_bool: segs = segs[1:2] + segs[4:]
    _check_concat(bg, f"reduce {dt.name}", segs, failures, counts)
  print(f"\nrender_ptx op x dtype kernels vs CPU: {counts}")
  assert not failures, f"{len(failures)} of {counts['kernels']} op x dtype kernels differ:\n" + "\n".join(failures)
  assert counts["kernels"] >= 400


def test_upcast_lanes_are_registers(bg):
  """On a GPU each UPCAST lane is its own value (compiler/gpu.py expands them): two accumulators in registers, no
  .local array, one loop."""
  from baregrad.compiler.opt import Opt
  x = bg.tensor(np.arange(96, dtype=np.float32).reshape(12, 8) / 7)
  y = bg.tensor(np.arange(96, dtype=np.int32).reshape(12, 8) - 40)
  for t in (x.sum(1), y.max(1), (y * 3).sum(0)):
    (name, dt, cpu, emu, src), = run_on_both(bg, t, opts=(Opt("UPCAST", 0, 2),))
    assert ".local" not in src and src.count("_end:") == 1
    assert src.count("st.global") == 2
    assert not len(mismatches(dt, cpu, emu)), name


def test_matmul_256(bg):
  """The speed target (about 2 s on one core): a 256x256x256 float32 matmul as PTXRenderer renders it: each step
  acc = fma(a, b, acc), rounded once (the product of two float32 is exact in float64, so float64 then float32 is
  that rounding but for rare double-rounding ties: within 1 ulp); the CPU device fuses a*b+c too, in its own
  order, so against it only to rounding."""
  rng = np.random.default_rng(0)
  A, B = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
  # the CPU device may pack B into column strips first (a copy kernel): the product is the last kernel
  name, dt, cpu, emu, src = run_on_both(bg, bg.tensor(A) @ bg.tensor(B))[-1]
  acc = np.zeros((256, 256), np.float32)
  A64, B64 = A.astype(np.float64), B.astype(np.float64)
  for k in range(256): acc = (A64[:, k:k + 1] * B64[k:k + 1, :] + acc).astype(np.float32)
  np.testing.assert_array_max_ulp(emu.view(np.float32).reshape(256, 256), acc, maxulp=1)
  assert ".rn" in src and "fma.rn.f32" in src
  np.testing.assert_allclose(emu.view(np.float32), cpu.view(np.float32), rtol=1e-4, atol=1e-4)


def test_composite_kernels_match_cpu(bg):
  """Multi-kernel schedules of common layers: each kernel of each schedule against the CPU device (floats to
  rounding where gcc contracts a*b+c on the CPU; integers exactly)."""
  from baregrad.tensor.tensor import Variable
  T, dt = bg.tensor, bg.dtypes
  rng = np.random.default_rng(7)
  x = T(rng.standard_normal((4, 3, 9, 9), dtype=np.float32))
  w = T(rng.standard_normal((5, 3, 3, 3), dtype=np.float32))
  m = T(rng.standard_normal((33, 17), dtype=np.float32))
  i = T(rng.integers(-50, 50, (7, 13), dtype=np.int32))
  h = T(rng.standard_normal((16, 24), dtype=np.float32).astype(np.float16))
  n = Variable("n", 1, 64)
  cases = [("conv2d", x.conv2d(w, padding=1, stride=2).relu()), ("max_pool2d", x.max_pool2d(2)),
           ("softmax", m.softmax(1)), ("log_softmax", m.log_softmax(0)), ("layernorm", m.layernorm()),
           ("cumsum", i.cumsum(1)), ("argmax", m.argmax(1)), ("int matmul", i @ i.transpose()),
           ("half matmul", h @ h.transpose()), ("gelu", m.gelu()), ("tanh", m.tanh()), ("sigmoid", m.sigmoid()),
           ("var", m.var(0)), ("getitem", m[3:30:4, ::-2]), ("one_hot", i.flatten().clip(0, 9).one_hot(10)),
           ("bound variable", m + n.bind(5)), ("floordiv", i // 7), ("mod", i % -3), ("pow", m.abs() ** 1.7),
           ("where", (m > 0).where(m, m * 0.1)), ("int64 sum", i.cast(dt.int64).sum(0)), ("mean", m.mean())]
  failures, kernels = [], 0
  for label, t in cases:
    for name, odt, cpu, emu, src in run_on_both(bg, t):
      kernels += 1
      rtol = 2e-5 if odt.is_float and odt.itemsize >= 4 else 2e-3 if odt.is_float else 0.0
      bad = mismatches(odt, cpu, emu, rtol)
      if len(bad):
        failures.append(f"{label} / {name}: {len(bad)} elements differ, first at {bad[:5].tolist()}: "
                        f"cpu {_as_values(cpu, odt)[bad[:5]].tolist()} emu {_as_values(emu, odt)[bad[:5]].tolist()}")
  assert not failures, "\n".join(failures)
  assert kernels >= len(cases)
