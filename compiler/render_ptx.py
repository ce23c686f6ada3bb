"""Render a linearized kernel to PTX for the NV device (then `drivers.nv.cubin` turns it into a cubin).

Calling convention: `.visible .entry name(.param .u64 data0, ..., .param .s64 var0, ...)`: the buffer
addresses in PARAM order, then the DEFINE_VAR values sorted by name (as the C renderer's `args[]`).
Each thread computes one element of the global loops: codegen's `to_threads` replaced them by the SPECIAL
"gidx" = ctaid.x * ntid.x + tid.x and gated the stores of threads past the end.

Semantics mirror `render_c.py` (the reference the op tests pass with), value by value:
- registers by dtype: bool -> .pred; int8..uint32 -> .b32 holding the value sign/zero-extended from its
  width (C's promotion to int, then a conversion back after every op that can leave the range); int64,
  uint64, index -> .b64; float16/bfloat16/float32 -> .f32 (16-bit floats are computed in float32 and
  rounded after every op, as C's `_round16`); float64 -> .f64.
- float arithmetic uses explicit `.rn` rounding so ptxas never contracts a mul and an add into an fma
  (PTX ISA, "mul/add: ... with an explicit rounding modifier are not contracted"); recip, sqrt and
  x * recip(y) (rendered as `div.rn`) are IEEE correctly rounded like the C operators.
- float->int truncates toward zero (`cvt.rzi`); for widths below 32 bits and for uint32 the value goes
  through a wider signed integer and is then wrapped, as gcc's x86-64 code does; int->float rounds to
  nearest (`cvt.rn`).
- float16 and bfloat16 conversions are spelled out with the C prelude's exact NaN handling (NaN keeps its
  sign, gets the canonical quiet payload), so stored and bitcast bits match the CPU device.
- IDIV/MOD: C truncation; a zero divisor gives 0 and x / -1 is -x (no INT_MIN / -1 trap), as in C.
- MAX on floats propagates a NaN from either side: `(a != a || a > b) ? a : b`.
Syntax and instruction forms follow NVIDIA's "PTX ISA 8.0" reference and were checked with ptxas 13.0.
"""
from __future__ import annotations
import math, struct
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes

F16, BF16 = dtypes.float16, dtypes.bfloat16
# register class per value kind: declaration type and name prefix
REG_CLASSES = {"pred": ("pred", "%p"), "b16": ("b16", "%h"), "b32": ("b32", "%r"), "b64": ("b64", "%rd"),
               "f32": ("f32", "%f"), "f64": ("f64", "%fd")}
# SPECIAL thread indices: name -> PTX special registers (all .u32)
SPECIALS = {"gidx": ("%ctaid.x", "%ntid.x", "%tid.x"), "lidx": ("%tid.x",), "bidx": ("%ctaid.x",)}


def reg_class(dt: DType) -> str:
  if dt.is_bool: return "pred"
  if dt == dtypes.float64: return "f64"
  if dt.is_float: return "f32"
  return "b64" if dt.itemsize == 8 else "b32"


def int_type(dt: DType) -> str:
  """PTX integer type an (int or index) value is computed in: its signedness at register width."""
  return ("u" if dt.is_unsigned else "s") + ("64" if dt.itemsize == 8 else "32")


def float_type(dt: DType) -> str: return "f64" if dt == dtypes.float64 else "f32"


def bits_type(dt: DType) -> str: return "b64" if dt.itemsize == 8 and not dt.is_bool else "b32"


def f32_literal(value: float) -> str: return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]


def f64_literal(value: float) -> str: return "0d%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def int_literal(value: int, dt: DType) -> str:
  """The register bits of an integer constant, in hex (a sub-32-bit value sign/zero-extended to 32 bits)."""
  width = 64 if dt.itemsize == 8 else 32
  return "0x%X" % (int(value) & ((1 << width) - 1))


# narrowing after an op: C converts the int result back to the small type on assignment
NARROW = {dtypes.int8: "s32.s8", dtypes.uint8: "u32.u8", dtypes.int16: "s32.s16", dtypes.uint16: "u32.u16"}
# global memory access type per dtype (bool is stored as one byte 0/1)
MEM_TYPE = {dtypes.bool: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16",
            dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
            dtypes.index: "s64", F16: "u16", BF16: "u16", dtypes.float32: "f32", dtypes.float64: "f64"}


class _Kernel:
  """The state of one render: registers, names of values, emitted lines."""

  def __init__(self):
    self.counts = {cls: 0 for cls in REG_CLASSES}
    self.lines: list[str] = []
    self.names: dict[UOp, str] = {}
    self.labels = 0

  def reg(self, cls: str) -> str:
    n = self.counts[cls]; self.counts[cls] += 1
    return f"{REG_CLASSES[cls][1]}{n}"

  def emit(self, text: str): self.lines.append("  " + text)

  def op(self, cls: str, text: str) -> str:
    """Emit `text` with a new destination register of class `cls` (`{d}` in text) and return the register."""
    d = self.reg(cls)
    self.emit(text.format(d=d))
    return d

  def declarations(self) -> list[str]:
    return [f"  .reg .{REG_CLASSES[c][0]} {REG_CLASSES[c][1]}<{n}>;" for c, n in self.counts.items() if n]

  # ---- small ints ----
  def narrow(self, r: str, dt: DType) -> str:
    if dt in NARROW: self.emit(f"cvt.{NARROW[dt]} {r}, {r};")
    return r

  # ---- float16 / bfloat16 storage formats (bits held in the low 16 bits of a .b32 register) ----
  def f32_to_f16_bits(self, x: str) -> str:
    """bg_f32_f16: round to nearest even (overflow -> inf, subnormals kept); NaN -> sign | 0x7e00."""
    h = self.op("b16", f"cvt.rn.f16.f32 {{d}}, {x};")
    r = self.op("b32", f"cvt.u32.u16 {{d}}, {h};")
    nan = self.op("pred", f"testp.notanumber.f32 {{d}}, {x};")
    xb = self.op("b32", f"mov.b32 {{d}}, {x};")
    q = self.op("b32", f"shr.u32 {{d}}, {xb}, 16;")
    self.emit(f"and.b32 {q}, {q}, 0x8000;")
    self.emit(f"or.b32 {q}, {q}, 0x7E00;")
    return self.op("b32", f"selp.b32 {{d}}, {q}, {r}, {nan};")

  def f16_bits_to_f32(self, bits: str) -> str:
    """bg_f16_f32: exact; a NaN keeps sign and payload (sign | 0x7f800000 | mantissa << 13)."""
    lo = self.op("b32", f"and.b32 {{d}}, {bits}, 0xFFFF;")
    h = self.op("b16", f"cvt.u16.u32 {{d}}, {lo};")
    f = self.op("f32", f"cvt.f32.f16 {{d}}, {h};")
    nan = self.op("pred", f"testp.notanumber.f32 {{d}}, {f};")
    s = self.op("b32", f"and.b32 {{d}}, {lo}, 0x8000;")
    self.emit(f"shl.b32 {s}, {s}, 16;")
    m = self.op("b32", f"and.b32 {{d}}, {lo}, 0x3FF;")
    self.emit(f"shl.b32 {m}, {m}, 13;")
    self.emit(f"or.b32 {s}, {s}, {m};")
    self.emit(f"or.b32 {s}, {s}, 0x7F800000;")
    fn = self.op("f32", f"mov.b32 {{d}}, {s};")
    return self.op("f32", f"selp.f32 {{d}}, {fn}, {f}, {nan};")

  def f32_to_bf16_bits(self, x: str) -> str:
    """bg_f32_bf16: NaN -> (bits >> 16) | 0x40, else round to nearest even on the top 16 bits."""
    b = self.op("b32", f"mov.b32 {{d}}, {x};")
    t = self.op("b32", f"shr.u32 {{d}}, {b}, 16;")
    self.emit(f"and.b32 {t}, {t}, 1;")
    self.emit(f"add.s32 {t}, {t}, 0x7FFF;")
    self.emit(f"add.s32 {t}, {t}, {b};")
    self.emit(f"shr.u32 {t}, {t}, 16;")
    a = self.op("b32", f"and.b32 {{d}}, {b}, 0x7FFFFFFF;")
    nan = self.op("pred", f"setp.gt.u32 {{d}}, {a}, 0x7F800000;")
    n = self.op("b32", f"shr.u32 {{d}}, {b}, 16;")
    self.emit(f"or.b32 {n}, {n}, 0x40;")
    return self.op("b32", f"selp.b32 {{d}}, {n}, {t}, {nan};")

  def bf16_bits_to_f32(self, bits: str) -> str:
    t = self.op("b32", f"shl.b32 {{d}}, {bits}, 16;")
    return self.op("f32", f"mov.b32 {{d}}, {t};")

  def round16(self, x: str, dt: DType) -> str:
    """C's _round16: a float32 value rounded to float16/bfloat16 and back; other dtypes unchanged."""
    if dt == F16: return self.f16_bits_to_f32(self.f32_to_f16_bits(x))
    if dt == BF16: return self.bf16_bits_to_f32(self.f32_to_bf16_bits(x))
    return x

  def to_bits(self, x: str, dt: DType) -> str:
    """The raw storage bits of a value (a .b32 or .b64 register), as C's memcpy sees them."""
    if dt == F16: return self.f32_to_f16_bits(x)
    if dt == BF16: return self.f32_to_bf16_bits(x)
    if dt.is_bool: return self.op("b32", f"selp.b32 {{d}}, 1, 0, {x};")
    if dt.is_float: return self.op(bits_type(dt), f"mov.{bits_type(dt)} {{d}}, {x};")
    return x

  def from_bits(self, bits: str, dt: DType) -> str:
    if dt == F16: return self.f16_bits_to_f32(bits)
    if dt == BF16: return self.bf16_bits_to_f32(bits)
    if dt.is_bool:
      lo = self.op("b32", f"and.b32 {{d}}, {bits}, 0xFF;")
      return self.op("pred", f"setp.ne.b32 {{d}}, {lo}, 0;")
    cls = reg_class(dt)
    out = self.op(cls, f"mov.{bits_type(dt)} {{d}}, {bits};")
    return out if dt.is_float else self.narrow(out, dt)

  # ---- conversions ----
  def cast(self, x: str, src: DType, dst: DType) -> str:
    if dst.is_bool:
      if src.is_bool: return self.op("pred", f"mov.pred {{d}}, {x};")
      if src.is_float:
        zero = f64_literal(0.0) if src == dtypes.float64 else f32_literal(0.0)
        return self.op("pred", f"setp.neu.{float_type(src)} {{d}}, {x}, {zero};")   # NaN != 0 is true in C
      return self.op("pred", f"setp.ne.{bits_type(src)} {{d}}, {x}, 0;")
    cls = reg_class(dst)
    if src.is_bool:
      if dst == dtypes.float64: return self.op(cls, f"selp.f64 {{d}}, {f64_literal(1.0)}, {f64_literal(0.0)}, {x};")
      if dst.is_float: return self.op(cls, f"selp.f32 {{d}}, {f32_literal(1.0)}, {f32_literal(0.0)}, {x};")
      return self.op(cls, f"selp.{bits_type(dst)} {{d}}, 1, 0, {x};")
    if src.is_float and dst.is_float:
      if float_type(src) == float_type(dst): out = self.op(cls, f"mov.{float_type(dst)} {{d}}, {x};")
      elif dst == dtypes.float64: out = self.op(cls, f"cvt.f64.f32 {{d}}, {x};")
      else: out = self.op(cls, f"cvt.rn.f32.f64 {{d}}, {x};")
      return self.round16(out, dst) if dst in (F16, BF16) and src != dst else out
    if src.is_float:   # -> int: truncate toward zero
      ft = float_type(src)
      if dst.itemsize < 4: return self.narrow(self.op(cls, f"cvt.rzi.s32.{ft} {{d}}, {x};"), dst)
      if dst == dtypes.uint32:
        wide = self.op("b64", f"cvt.rzi.s64.{ft} {{d}}, {x};")
        return self.op(cls, f"cvt.u32.u64 {{d}}, {wide};")
      return self.op(cls, f"cvt.rzi.{int_type(dst)}.{ft} {{d}}, {x};")
    if dst.is_float:   # int -> float: round to nearest
      out = self.op(cls, f"cvt.rn.{float_type(dst)}.{int_type(src)} {{d}}, {x};")
      return self.round16(out, dst)
    # int -> int
    if src.itemsize == 8 and dst.itemsize == 8: return self.op(cls, f"mov.b64 {{d}}, {x};")
    if dst.itemsize == 8: return self.op(cls, f"cvt.{int_type(dst)[0]}64.{int_type(src)} {{d}}, {x};")
    if src.itemsize == 8: return self.narrow(self.op(cls, f"cvt.u32.u64 {{d}}, {x};"), dst)
    return self.narrow(self.op(cls, f"mov.b32 {{d}}, {x};"), dst)

  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.itemsize != dst.itemsize:
      raise NotImplementedError(f"PTX renderer: BITCAST {src.name} -> {dst.name} changes the size")
    return self.from_bits(self.to_bits(x, src), dst)

  # ---- ALU ----
  def binary(self, op: Ops, a: str, b: str, dt: DType, b_uop: UOp | None = None) -> str:
    """`dt` is the operand dtype; CMPLT/CMPNE return a predicate."""
    if dt.is_bool: return self.binary_bool(op, a, b)
    if dt.is_float: return self.binary_float(op, a, b, dt)
    it, bt, cls = int_type(dt), bits_type(dt), reg_class(dt)
    if op is Ops.CMPLT: return self.op("pred", f"setp.lt.{it} {{d}}, {a}, {b};")
    if op is Ops.CMPNE: return self.op("pred", f"setp.ne.{bt} {{d}}, {a}, {b};")
    if op is Ops.ADD: return self.narrow(self.op(cls, f"add.{it} {{d}}, {a}, {b};"), dt)
    if op is Ops.MUL: return self.narrow(self.op(cls, f"mul.lo.{it} {{d}}, {a}, {b};"), dt)
    if op is Ops.MAX: return self.op(cls, f"max.{it} {{d}}, {a}, {b};")
    if op in (Ops.XOR, Ops.OR, Ops.AND): return self.op(cls, f"{op.name.lower()}.{bt} {{d}}, {a}, {b};")
    if op in (Ops.SHL, Ops.SHR):
      amount = self.op("b32", f"cvt.u32.u64 {{d}}, {b};") if dt.itemsize == 8 else b
      if op is Ops.SHL: return self.narrow(self.op(cls, f"shl.{bt} {{d}}, {a}, {amount};"), dt)
      return self.op(cls, f"shr.{it} {{d}}, {a}, {amount};")
    if op in (Ops.IDIV, Ops.MOD): return self.divide(op, a, b, dt, b_uop)
    raise NotImplementedError(f"PTX renderer: no rule for {op.name} on {dt.name}")

  def divide(self, op: Ops, a: str, b: str, dt: DType, b_uop: UOp | None) -> str:
    """C semantics: truncating; b == 0 gives 0; for signed types b == -1 gives -a (IDIV) or 0 (MOD)."""
    it, bt, cls = int_type(dt), bits_type(dt), reg_class(dt)
    instr = "div" if op is Ops.IDIV else "rem"
    signed = dt.kind == 'i'
    if b_uop is not None and b_uop.op is Ops.CONST:   # a constant divisor needs no guards
      c = b_uop.arg
      if c == 0 or (signed and c == -1 and op is Ops.MOD): return self.op(cls, f"mov.{bt} {{d}}, 0;")
      if signed and c == -1: return self.narrow(self.op(cls, f"neg.{it} {{d}}, {a};"), dt)
      return self.narrow(self.op(cls, f"{instr}.{it} {{d}}, {a}, {b};"), dt)
    zero = self.op("pred", f"setp.eq.{bt} {{d}}, {b}, 0;")
    if signed:
      minus1 = self.op("pred", f"setp.eq.{bt} {{d}}, {b}, -1;")
      skip = self.op("pred", f"or.pred {{d}}, {zero}, {minus1};")
    else:
      skip = zero
    safe = self.op(cls, f"selp.{bt} {{d}}, 1, {b}, {skip};")    # never divide by 0 or -1
    q = self.op(cls, f"{instr}.{it} {{d}}, {a}, {safe};")
    if signed:
      alt = self.op(cls, f"neg.{it} {{d}}, {a};") if op is Ops.IDIV else "0"
      q = self.op(cls, f"selp.{bt} {{d}}, {alt}, {q}, {minus1};")
    q = self.op(cls, f"selp.{bt} {{d}}, 0, {q}, {zero};")
    return self.narrow(q, dt)

  def binary_float(self, op: Ops, a: str, b: str, dt: DType) -> str:
    ft, cls = float_type(dt), reg_class(dt)
    if op is Ops.CMPLT: return self.op("pred", f"setp.lt.{ft} {{d}}, {a}, {b};")      # false on NaN, like C <
    if op is Ops.CMPNE: return self.op("pred", f"setp.neu.{ft} {{d}}, {a}, {b};")     # true on NaN, like C !=
    if op is Ops.ADD: out = self.op(cls, f"add.rn.{ft} {{d}}, {a}, {b};")
    elif op is Ops.MUL: out = self.op(cls, f"mul.rn.{ft} {{d}}, {a}, {b};")
    elif op is Ops.MAX:
      take_a = self.op("pred", f"testp.notanumber.{ft} {{d}}, {a};")
      self.emit(f"setp.gt.or.{ft} {take_a}, {a}, {b}, {take_a};")
      out = self.op(cls, f"selp.{ft} {{d}}, {a}, {b}, {take_a};")
    elif op is Ops.MOD: out = self.fmod(a, b, dt)
    else: raise NotImplementedError(f"PTX renderer: no rule for {op.name} on {dt.name}")
    return self.round16(out, dt)

  def label(self) -> str:
    self.labels += 1
    return f"$L{self.labels}"

  def fmod(self, a: str, b: str, dt: DType) -> str:
    """C's fmod (exact, sign of a) by long division of the integer significands; PTX has no fmod.
    fmod(x, 0), fmod(inf, y) and NaN operands give NaN; |x| < |y| gives x; |x| == |y| gives a signed zero.
    Subnormal operands are normalized with clz first, so both significands have the implicit bit set."""
    ft = float_type(dt)
    w, mb = (64, 52) if ft == "f64" else (32, 23)
    bt, ut, cls = f"b{w}", f"u{w}", reg_class(dt)
    sign_bit, inf, mant, implicit = 1 << (w - 1), (0x7FF << 52) if w == 64 else 0x7F800000, (1 << mb) - 1, 1 << mb
    lead = w - 1 - mb   # clz of a normalized significand
    base = self.label()
    nan_l, zero_l, done_l, loop_l, loop_end_l = (base + s for s in ("_nan", "_zero", "_done", "_loop", "_loopend"))
    res = self.op(cls, f"mov.{ft} {{d}}, {a};")
    xb, yb = self.op(bt, f"mov.{bt} {{d}}, {a};"), self.op(bt, f"mov.{bt} {{d}}, {b};")
    sign = self.op(bt, f"and.{bt} {{d}}, {xb}, 0x{sign_bit:X};")
    ux = self.op(bt, f"and.{bt} {{d}}, {xb}, 0x{sign_bit - 1:X};")
    uy = self.op(bt, f"and.{bt} {{d}}, {yb}, 0x{sign_bit - 1:X};")
    p = self.op("pred", f"setp.eq.{bt} {{d}}, {uy}, 0;")
    self.emit(f"setp.ge.or.{ut} {p}, {ux}, 0x{inf:X}, {p};")
    self.emit(f"setp.gt.or.{ut} {p}, {uy}, 0x{inf:X}, {p};")
    self.emit(f"@{p} bra {nan_l};")
    self.emit(f"setp.lt.{ut} {p}, {ux}, {uy};")
    self.emit(f"@{p} bra {done_l};")
    self.emit(f"setp.eq.{bt} {p}, {ux}, {uy};")
    self.emit(f"@{p} bra {zero_l};")

    def significand(u: str) -> tuple[str, str]:
      if w == 64: e = self.op("b32", f"cvt.u32.u64 {{d}}, {self.op(bt, f'shr.u64 {{d}}, {u}, {mb};')};")
      else: e = self.op("b32", f"shr.u32 {{d}}, {u}, {mb};")
      m = self.op(bt, f"and.{bt} {{d}}, {u}, 0x{mant:X};")
      self.emit(f"or.{bt} {m}, {m}, 0x{implicit:X};")
      sub = self.op("pred", f"setp.eq.s32 {{d}}, {e}, 0;")
      c = self.op("b32", f"clz.{bt} {{d}}, {u};")
      self.emit(f"sub.s32 {c}, {c}, {lead};")
      self.emit(f"@{sub} shl.{bt} {m}, {u}, {c};")
      self.emit(f"@{sub} sub.s32 {e}, 1, {c};")
      return e, m

    ex, mx = significand(ux)
    ey, my = significand(uy)
    self.lines.append(f"{loop_l}:")
    self.emit(f"setp.le.s32 {p}, {ex}, {ey};")
    self.emit(f"@{p} bra {loop_end_l};")
    self.emit(f"setp.ge.{ut} {p}, {mx}, {my};")
    self.emit(f"@{p} sub.s{w} {mx}, {mx}, {my};")
    self.emit(f"shl.{bt} {mx}, {mx}, 1;")
    self.emit(f"sub.s32 {ex}, {ex}, 1;")
    self.emit(f"bra {loop_l};")
    self.lines.append(f"{loop_end_l}:")
    self.emit(f"setp.ge.{ut} {p}, {mx}, {my};")
    self.emit(f"@{p} sub.s{w} {mx}, {mx}, {my};")
    self.emit(f"setp.eq.{bt} {p}, {mx}, 0;")
    self.emit(f"@{p} bra {zero_l};")
    c = self.op("b32", f"clz.{bt} {{d}}, {mx};")      # normalize the remainder
    self.emit(f"sub.s32 {c}, {c}, {lead};")
    self.emit(f"shl.{bt} {mx}, {mx}, {c};")
    self.emit(f"sub.s32 {ex}, {ex}, {c};")
    normal = self.op(bt, f"and.{bt} {{d}}, {mx}, 0x{mant:X};")
    ew = self.op(bt, f"cvt.{ut}.u32 {{d}}, {ex};") if w == 64 else self.op(bt, f"mov.b32 {{d}}, {ex};")
    self.emit(f"shl.{bt} {ew}, {ew}, {mb};")
    self.emit(f"or.{bt} {normal}, {normal}, {ew};")
    shift = self.op("b32", f"sub.s32 {{d}}, 1, {ex};")   # result below the normal range: a subnormal
    self.emit(f"max.s32 {shift}, {shift}, 0;")
    subn = self.op(bt, f"shr.{ut} {{d}}, {mx}, {shift};")
    self.emit(f"setp.gt.s32 {p}, {ex}, 0;")
    out = self.op(bt, f"selp.{bt} {{d}}, {normal}, {subn}, {p};")
    self.emit(f"or.{bt} {out}, {out}, {sign};")
    self.emit(f"mov.{bt} {res}, {out};")
    self.emit(f"bra {done_l};")
    self.lines.append(f"{zero_l}:")
    self.emit(f"mov.{bt} {res}, {sign};")
    self.emit(f"bra {done_l};")
    self.lines.append(f"{nan_l}:")
    self.emit(f"mov.{ft} {res}, {f64_literal(math.nan) if w == 64 else f32_literal(math.nan)};")
    self.lines.append(f"{done_l}:")
    return res

  def binary_bool(self, op: Ops, a: str, b: str) -> str:
    if op in (Ops.ADD, Ops.OR, Ops.MAX): return self.op("pred", f"or.pred {{d}}, {a}, {b};")
    if op in (Ops.MUL, Ops.AND): return self.op("pred", f"and.pred {{d}}, {a}, {b};")
    if op in (Ops.XOR, Ops.CMPNE): return self.op("pred", f"xor.pred {{d}}, {a}, {b};")
    if op is Ops.CMPLT:
      na = self.op("pred", f"not.pred {{d}}, {a};")
      return self.op("pred", f"and.pred {{d}}, {na}, {b};")
    # anything else: C computes on the 0/1 ints, then converts to _Bool (!= 0)
    ia = self.op("b32", f"selp.b32 {{d}}, 1, 0, {a};")
    ib = self.op("b32", f"selp.b32 {{d}}, 1, 0, {b};")
    return self.cast(self.binary(op, ia, ib, dtypes.uint8), dtypes.uint8, dtypes.bool)

  def unary(self, op: Ops, a: str, dt: DType) -> str:
    cls = reg_class(dt)
    if dt.is_bool:
      if op is Ops.NEG: return self.op("pred", f"not.pred {{d}}, {a};")
      if op is Ops.TRUNC: return self.op("pred", f"mov.pred {{d}}, {a};")
      raise NotImplementedError(f"PTX renderer: no rule for {op.name} on bool")
    if dt.is_float:
      ft = float_type(dt)
      if op is Ops.NEG: out = self.op(cls, f"neg.{ft} {{d}}, {a};")
      elif op is Ops.RECIP: out = self.op(cls, f"rcp.rn.{ft} {{d}}, {a};")
      elif op is Ops.SQRT: out = self.op(cls, f"sqrt.rn.{ft} {{d}}, {a};")
      elif op is Ops.TRUNC: out = self.op(cls, f"cvt.rzi.{ft}.{ft} {{d}}, {a};")
      else: raise NotImplementedError(f"PTX renderer: {op.name} is not native (compiler.decomp rewrites it)")
      return self.round16(out, dt)
    it = int_type(dt)
    if op is Ops.NEG: return self.narrow(self.op(cls, f"neg.s{it[1:]} {{d}}, {a};"), dt)   # wraps for unsigned too
    if op is Ops.TRUNC: return self.op(cls, f"mov.{bits_type(dt)} {{d}}, {a};")
    if op is Ops.RECIP: return self.divide(Ops.IDIV, self.op(cls, f"mov.{bits_type(dt)} {{d}}, 1;"), a, dt, None)
    if op is Ops.SQRT:   # C: __builtin_sqrtf on the int, truncated back on assignment
      f = self.unary(Ops.SQRT, self.cast(a, dt, dtypes.float32), dtypes.float32)
      return self.cast(f, dtypes.float32, dt)
    raise NotImplementedError(f"PTX renderer: no rule for {op.name} on {dt.name}")

  def where(self, c: str, a: str, b: str, dt: DType) -> str:
    if dt.is_bool:
      t = self.op("pred", f"and.pred {{d}}, {c}, {a};")
      nc = self.op("pred", f"not.pred {{d}}, {c};")
      f = self.op("pred", f"and.pred {{d}}, {nc}, {b};")
      return self.op("pred", f"or.pred {{d}}, {t}, {f};")
    t = float_type(dt) if dt.is_float else bits_type(dt)
    return self.op(reg_class(dt), f"selp.{t} {{d}}, {a}, {b}, {c};")

  # ---- memory ----
  def load(self, addr: str, dt: DType, gate: str | None) -> str:
    """A gated load does not touch memory when the gate is false and gives 0 (C: `valid ? p[i] : 0`)."""
    pre = f"@{gate} " if gate else ""
    mt = MEM_TYPE[dt]
    if dt.is_bool or dt in (F16, BF16) or (dt.is_int and dt.itemsize < 4):
      raw = self.reg("b32")
      if gate: self.emit(f"mov.b32 {raw}, 0;")
      self.emit(f"{pre}ld.global.{mt} {raw}, [{addr}];")   # extends to 32 bits by the memory type
      if dt.is_bool: return self.op("pred", f"setp.ne.b32 {{d}}, {raw}, 0;")
      if dt == F16: return self.f16_bits_to_f32(raw)
      if dt == BF16: return self.bf16_bits_to_f32(raw)
      return raw
    cls = reg_class(dt)
    d = self.reg(cls)
    if gate:
      zero = {"f32": f32_literal(0.0), "f64": f64_literal(0.0)}.get(cls, "0")
      self.emit(f"mov.{float_type(dt) if dt.is_float else bits_type(dt)} {d}, {zero};")
    self.emit(f"{pre}ld.global.{mt} {d}, [{addr}];")
    return d

  def store(self, addr: str, value: str, dt: DType, gate: str | None):
    pre = f"@{gate} " if gate else ""
    if dt.is_bool or dt in (F16, BF16): value = self.to_bits(value, dt)
    self.emit(f"{pre}st.global.{MEM_TYPE[dt]} [{addr}], {value};")


class PTXRenderer:
  device = "NV"
  threads = True                          # codegen maps the global loops to SPECIAL "gidx"
  native_ops = {Ops.SQRT, Ops.TRUNC}      # exp2/log2/sin: compiler.decomp (ex2/lg2/sin.approx are not accurate enough)

  def __init__(self, arch: str = "sm_90", version: str = "8.0"):
    self.arch, self.version = arch, version

  def header(self) -> str:
    """The module directives; a module may hold several entries (`header() + render_entry(...) + ...`)."""
    return f".version {self.version}\n.target {self.arch}\n.address_size 64\n"

  def render(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> str:
    """A complete PTX module with one kernel."""
    return self.header() + "\n" + self.render_entry(name, program, alias, n_params, variables)

  def render_entry(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> str:
    """The `.entry` of one kernel, without the module directives."""
    k = _Kernel()
    params = [f".param .u64 data{i}" for i in range(n_params)] + [f".param .s64 var{j}" for j in range(len(variables))]
    for u in program:
      if u.op is Ops.PARAM:
        if u.arg >= n_params: raise RuntimeError(f"PARAM {u.arg} but the kernel has {n_params} parameters")
        raw = k.op("b64", f"ld.param.u64 {{d}}, [data{u.arg}];")
        k.names[u] = k.op("b64", f"cvta.to.global.u64 {{d}}, {raw};")
    for j, v in enumerate(variables):
      k.emit(f"// var{j}: {v.arg[0]}")
      k.names[v] = k.op("b64", f"ld.param.s64 {{d}}, [var{j}];")
    for u in program:   # constants live in registers set once at entry, so they dominate every use
      if u.op is Ops.CONST and u not in k.names: k.names[u] = self.constant(k, u.arg, u.dtype)

    def val(u: UOp) -> str:
      u = alias.get(u, u)
      if u not in k.names: raise RuntimeError(f"PTX renderer: {u.op.name} used before it was rendered")
      if u.op is Ops.DEFINE_ACC and u.src: return self.lane_load(k, u)   # this lane's accumulator
      return k.names[u]

    loops: dict[UOp, tuple[str, str]] = {}
    for u in program:
      op = u.op
      if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.PARAM, Ops.SINK, Ops.REDUCE): continue
      if op is Ops.SPECIAL: k.names[u] = self.special(k, u)
      elif op is Ops.RANGE:
        size = self.as_index(k, val(u.src[0]), u.src[0].dtype)
        counter = k.op("b64", "mov.b64 {d}, 0;")
        top = k.label(); end = top + "_end"
        k.lines.append(f"{top}:")
        done = k.op("pred", f"setp.ge.s64 {{d}}, {counter}, {size};")
        k.emit(f"@{done} bra {end};")
        loops[u], k.names[u] = (top, end), counter
      elif op is Ops.ENDRANGE:
        counter, (top, end) = k.names[u.src[0]], loops[u.src[0]]
        k.emit(f"add.s64 {counter}, {counter}, 1;")
        k.emit(f"bra {top};")
        k.lines.append(f"{end}:")
      elif op is Ops.DEFINE_ACC:
        init = self.constant(k, identity_for(u.arg[0], u.dtype), u.dtype)
        if u.src: k.names[u] = self.lane_accumulator(k, u, init)
        else:
          acc = k.reg(reg_class(u.dtype))
          k.emit(f"mov.{self.mov_type(u.dtype)} {acc}, {init};")
          k.names[u] = acc
      elif op is Ops.ACC_UPDATE:
        acc_uop = u.src[0]
        new = k.binary(u.arg, val(acc_uop), val(u.src[1]), u.dtype)
        if acc_uop.src: self.lane_store(k, acc_uop, new)
        else: k.emit(f"mov.{self.mov_type(u.dtype)} {val(acc_uop)}, {new};")
      elif op is Ops.INDEX:
        k.names[u] = self.address(k, val(u.src[0]), val(u.src[1]), u.src[1].dtype, u.src[0].dtype)
      elif op is Ops.LOAD:
        idx = u.src[0]
        k.names[u] = k.load(val(idx), u.dtype, val(idx.src[2]) if len(idx.src) == 3 else None)
      elif op is Ops.STORE:
        idx = u.src[0]
        k.store(val(idx), val(u.src[1]), u.src[1].dtype, val(idx.src[2]) if len(idx.src) == 3 else None)
      elif op is Ops.CAST: k.names[u] = k.cast(val(u.src[0]), u.src[0].dtype, u.dtype)
      elif op is Ops.BITCAST: k.names[u] = k.bitcast(val(u.src[0]), u.src[0].dtype, u.dtype)
      elif op is Ops.WHERE: k.names[u] = k.where(val(u.src[0]), val(u.src[1]), val(u.src[2]), u.dtype)
      elif op is Ops.MUL and u.dtype.is_float and u.src[1].op is Ops.RECIP:
        ft = float_type(u.dtype)
        q = k.op(reg_class(u.dtype), f"div.rn.{ft} {{d}}, {val(u.src[0])}, {val(u.src[1].src[0])};")
        k.names[u] = k.round16(q, u.dtype)
      elif len(u.src) == 2:
        k.names[u] = k.binary(op, val(u.src[0]), val(u.src[1]), u.src[0].dtype, u.src[1])
      elif len(u.src) == 1:
        k.names[u] = k.unary(op, val(u.src[0]), u.dtype)
      else:
        raise NotImplementedError(f"PTX renderer: no rule for {op.name}")
    head = [f".visible .entry {name}(", ",\n".join("  " + p for p in params), ")", "{"]
    return "\n".join(head + k.declarations() + k.lines + ["  ret;", "}"]) + "\n"

  # ---- accumulators over upcast lanes (DEFINE_ACC with the lane ranges as src) ----
  # C keeps them in an array indexed by the lane counters; here a .local array of 4- or 8-byte slots
  # (bool as 0/1 in 4 bytes). Correct for any lane loop; ptxas keeps it in memory unless it unrolls them.
  @staticmethod
  def _slot(dt: DType) -> tuple[int, str]:
    if dt.is_bool: return 4, "u32"
    if dt == dtypes.float64: return 8, "f64"
    if dt.is_float: return 4, "f32"
    return (8, "b64") if dt.itemsize == 8 else (4, "b32")

  def lane_accumulator(self, k: _Kernel, u: UOp, init: str) -> str:
    n = 1
    for r in u.src: n *= r.src[0].arg
    size, mt = self._slot(u.dtype)
    array = f"acc{u.arg[1]}_{k.label()[2:]}"
    k.lines.insert(0, f"  .local .align 8 .b8 {array}[{n * size}];")
    base = k.op("b64", f"mov.u64 {{d}}, {array};")
    value = k.op("b32", f"selp.b32 {{d}}, 1, 0, {init};") if u.dtype.is_bool else init
    for i in range(n): k.emit(f"st.local.{mt} [{base}+{i * size}], {value};")
    return base

  def _lane_address(self, k: _Kernel, u: UOp) -> str:
    idx, stride = None, 1
    for r in reversed(u.src):   # row-major over the lane ranges, as the C renderer's lane_index
      term = k.names[r] if stride == 1 else k.op("b64", f"mul.lo.s64 {{d}}, {k.names[r]}, {stride};")
      idx = term if idx is None else k.op("b64", f"add.s64 {{d}}, {idx}, {term};")
      stride *= r.src[0].arg
    size, _ = self._slot(u.dtype)
    off = k.op("b64", f"shl.b64 {{d}}, {idx}, {int(math.log2(size))};")
    return k.op("b64", f"add.s64 {{d}}, {k.names[u]}, {off};")

  def lane_load(self, k: _Kernel, u: UOp) -> str:
    size, mt = self._slot(u.dtype)
    addr = self._lane_address(k, u)
    if u.dtype.is_bool:
      raw = k.op("b32", f"ld.local.u32 {{d}}, [{addr}];")
      return k.op("pred", f"setp.ne.b32 {{d}}, {raw}, 0;")
    return k.op(reg_class(u.dtype), f"ld.local.{mt} {{d}}, [{addr}];")

  def lane_store(self, k: _Kernel, u: UOp, value: str):
    size, mt = self._slot(u.dtype)
    if u.dtype.is_bool: value = k.op("b32", f"selp.b32 {{d}}, 1, 0, {value};")
    k.emit(f"st.local.{mt} [{self._lane_address(k, u)}], {value};")

  @staticmethod
  def mov_type(dt: DType) -> str:
    if dt.is_bool: return "pred"
    return float_type(dt) if dt.is_float else bits_type(dt)

  @staticmethod
  def constant(k: _Kernel, value, dt: DType) -> str:
    if dt.is_bool: return k.op("pred", f"setp.ne.b32 {{d}}, {1 if value else 0}, 0;")
    if dt == dtypes.float64: return k.op("f64", f"mov.f64 {{d}}, {f64_literal(value)};")
    if dt.is_float: return k.op("f32", f"mov.f32 {{d}}, {f32_literal(value)};")
    return k.op(reg_class(dt), f"mov.{bits_type(dt)} {{d}}, {int_literal(value, dt)};")

  @staticmethod
  def special(k: _Kernel, u: UOp) -> str:
    name = u.arg[0]
    if name not in SPECIALS: raise NotImplementedError(f"PTX renderer: unknown SPECIAL {name!r} (know {list(SPECIALS)})")
    regs = [k.op("b32", f"mov.u32 {{d}}, {sreg};") for sreg in SPECIALS[name]]
    if len(regs) == 1: out = k.op("b64", f"cvt.u64.u32 {{d}}, {regs[0]};")
    else:   # gidx = ctaid.x * ntid.x + tid.x, in 64 bits
      wide = k.op("b64", f"mul.wide.u32 {{d}}, {regs[0]}, {regs[1]};")
      tid = k.op("b64", f"cvt.u64.u32 {{d}}, {regs[2]};")
      out = k.op("b64", f"add.s64 {{d}}, {wide}, {tid};")
    return out if u.dtype.itemsize == 8 else k.op(reg_class(u.dtype), f"cvt.u32.u64 {{d}}, {out};")

  @staticmethod
  def as_index(k: _Kernel, x: str, dt: DType) -> str:
    if dt.itemsize == 8: return x
    return k.op("b64", f"cvt.{int_type(dt)[0]}64.{int_type(dt)} {{d}}, {x};")

  def address(self, k: _Kernel, base: str, idx: str, idx_dt: DType, elem: DType) -> str:
    idx = self.as_index(k, idx, idx_dt)
    size = elem.itemsize
    if size > 1: idx = k.op("b64", f"shl.b64 {{d}}, {idx}, {int(math.log2(size))};")
    return k.op("b64", f"add.s64 {{d}}, {base}, {idx};")
