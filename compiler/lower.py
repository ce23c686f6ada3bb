"""One lowering for every target: what a target lacks is rewritten into what it has, once, here.

A renderer declares what its target has natively (`native_ops = Native(...)`); every other op and dtype is
rewritten into those. Every target renders the core:
  integers: ADD MUL NEG MAX CMPLT CMPNE AND OR XOR WHERE; SHL SHR with an amount in [0, bits);
            IDIV MOD truncating, with a divisor that is never 0 nor -1
  floats:   ADD MUL NEG RECIP SQRT TRUNC CMPLT (false on NaN) CMPNE (true on NaN) WHERE
  bool:     AND OR XOR WHERE, CMPLT/CMPNE results and gates
  CAST between non-bool dtypes (float -> int: truncation, in range), BITCAST between equal sizes, memory
and `Native.float_ops` adds what has a decomposition here: EXP2 LOG2 SIN FLOOR, MAX (propagating NaN from either
side, as numpy's maximum), MOD (C's fmod), FDIV (correctly rounded a / b). A dtype of EMULATED outside
`Native.dtypes` is emulated: float16/bfloat16 are computed in float32 and rounded after every op (a reduction's
accumulator after every step), their conversions made of bit operations, so in registers they are only their 16
storage bits; int8/uint8/int16/uint16 are computed in 32 bits and converted back after each op. float64 may be left
out too: the target has none and nothing emulates it (Metal: MSL has no double); the Tensor layer then computes in
float32 where it would pick float64 and refuses float64 tensors (tensor/device_dtypes.py), and the renderer refuses a
float64 kernel.

Semantics defined here once for all targets (the reference is C, as the CPU device computes it):
- IDIV/MOD truncate; x / 0 and x % 0 give 0; x / -1 is -x (wrapping) and x % -1 is 0 (no INT_MIN / -1 trap).
- MAX on floats: (a != a || a > b) ? a : b.
- bool arithmetic: + is or, * is and, max is or, x < y is !x & y; a bool is a byte 0/1 in memory.
- float -> int8/16 goes through int32 and float -> uint32 through int64, then wraps (as gcc's x86-64 code).
- a reduction's accumulate step is an ordinary op (REDUCE arg (op, step)), so it is lowered like any other.

Passes (`passes`, which codegen runs): "decompositions" (ops the target lacks, and the edge cases above), symbolic
simplification, then "emulation" (dtypes the target lacks; the edge cases again for the ops it promotes, and the
accumulate steps). A renderer that declares `native_ops` as a plain set of ops (no renderer does any more) gets only the
transcendental, floor and shift rewrites, as before.
"""
from __future__ import annotations
from dataclasses import dataclass
from .uop import UOp, Ops, ALU
from .dtype import DType, dtypes
from .pattern import UPat, PatternMatcher, graph_rewrite
from .symbolic import symbolic
from . import decomp

F16, BF16, F32, U8, BOOL = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.uint8, dtypes.bool
FLOAT16S = (F16, BF16)
EMULATED = frozenset({F16, BF16, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})   # computed in 32 bits
OPTIONAL_FLOAT_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.FLOOR, Ops.MAX, Ops.MOD, Ops.FDIV})


@dataclass(frozen=True)
class Native:
  """What a target computes natively beyond the core (module doc): float ops from OPTIONAL_FLOAT_OPS, and the
  dtypes it computes in (float16/bfloat16 and the 8/16-bit integers may be left out: they are emulated; float64 may
  be left out: the target has no float64)."""
  float_ops: frozenset
  dtypes: frozenset
  int64_divide: bool = True   # False where 64-bit IDIV/MOD are slow loops (AMD): fmod takes its quotients in float64
  float16_casts: frozenset = frozenset()   # emulated 16-bit floats the target converts to and from float32 itself

  def __post_init__(self):
    if unknown := set(self.float_ops) - OPTIONAL_FLOAT_OPS:
      raise ValueError(f"Native.float_ops: {sorted(o.name for o in unknown)} have no lowering; "
                       f"choose from {sorted(o.name for o in OPTIONAL_FLOAT_OPS)}")
    if missing := {F32, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64, BOOL} - self.dtypes:
      raise ValueError(f"Native.dtypes must hold {sorted(d.name for d in missing)}: they are not emulated")


def _const(dt: DType, v) -> UOp: return UOp.const(dt, v)
def _not(x: UOp) -> UOp: return x.alu(Ops.XOR, _const(BOOL, True))
def _is_float(u: UOp) -> bool: return u.dtype is not None and u.dtype.is_float
def _emulated(dt: DType | None, ctx: Native) -> bool:
  return dt in EMULATED and dt not in ctx.dtypes



# ---------------------------------------------------------------- decompositions: ops the target lacks

def _bool_alu(u: UOp) -> UOp | None:
  """ALU ops on bools, in the and/or/xor every target has (C computes them on 0/1 and converts back)."""
  if not u.src or u.src[0].dtype != BOOL or u.op is Ops.WHERE: return None
  a, b = u.src[0], (u.src[1] if len(u.src) > 1 else None)
  if u.op in (Ops.ADD, Ops.MAX): return a | b
  if u.op in (Ops.MUL, Ops.IDIV): return a & b
  if u.op is Ops.CMPNE: return a.alu(Ops.XOR, b)
  if u.op is Ops.CMPLT: return _not(a) & b
  if u.op is Ops.MOD: return _const(BOOL, False)
  if u.op is Ops.SHL: return a
  if u.op is Ops.SHR: return a & _not(b)
  if u.op is Ops.NEG: return _not(a)
  if u.op in (Ops.TRUNC, Ops.FLOOR, Ops.SQRT, Ops.RECIP): return a
  return None


def _int_unary(u: UOp) -> UOp | None:
  """RECIP/SQRT/TRUNC/FLOOR on integers: C's 1 / x, sqrtf of the value truncated back, the value itself."""
  if u.dtype is None or not u.dtype.is_int: return None
  x = u.src[0]
  if u.op is Ops.RECIP: return UOp(Ops.IDIV, u.dtype, (_const(u.dtype, 1), x))
  if u.op is Ops.SQRT: return UOp(Ops.SQRT, F32, (x.cast(F32),)).cast(u.dtype)
  return x


def _float_op(u: UOp, ctx: Native) -> UOp | None:
  """EXP2/LOG2/SIN/FLOOR/MOD on floats the target lacks."""
  if not _is_float(u) or u.op in ctx.float_ops: return None
  if u.op is Ops.FLOOR: return decomp.floor_by_trunc(u.src[0])
  if u.op is Ops.MOD:
    if u.dtype in FLOAT16S: return UOp(Ops.MOD, F32, tuple(s.cast(F32) for s in u.src)).cast(u.dtype)
    return decomp.fmod(*u.src, integer_remainder=ctx.int64_divide)
  return decomp.transcendental(u)


def _bool_cast(u: UOp) -> UOp | None:
  """CAST/BITCAST to and from bool: != 0, and 0/1."""
  src = u.src[0]
  if u.dtype == BOOL and src.dtype != BOOL: return src.ne(_const(src.dtype, 0))
  if src.dtype == BOOL and u.dtype != BOOL: return src.where(_const(u.dtype, 1), _const(u.dtype, 0))
  return None


def _bool_memory(u: UOp) -> UOp | None:
  """A bool is one byte 0/1 in memory (read as != 0)."""
  if u.op is Ops.LOAD and u.dtype == BOOL: return UOp(Ops.LOAD, U8, u.src, u.arg).ne(_const(U8, 0))
  if u.op is Ops.STORE and u.src[1].dtype == BOOL:
    return u.replace(src=(u.src[0], u.src[1].where(_const(U8, 1), _const(U8, 0))) + u.src[2:])
  return None


# any / all / max over bools: the max / product of 0/1 bytes
_BOOL_REDUCE = {Ops.ADD: Ops.MAX, Ops.MUL: Ops.MUL, Ops.MAX: Ops.MAX}


def _bool_reduce(u: UOp) -> UOp | None:
  if u.dtype != BOOL: return None
  as_byte = u.src[0].where(_const(U8, 1), _const(U8, 0))
  return UOp(Ops.REDUCE, U8, (as_byte,) + u.src[1:], _BOOL_REDUCE[u.arg]).ne(_const(U8, 0))


def _division(x: UOp, r: UOp, ctx: Native) -> UOp | None:
  if Ops.FDIV not in ctx.float_ops or not _is_float(x): return None
  return UOp(Ops.FDIV, x.dtype, (x, r.src[0]))


# ---------------------------------------------------------------- edge cases: C's semantics where targets differ

def _float_to_int(u: UOp) -> UOp | None:
  """float -> 8/16-bit ints through int32, float -> uint32 through int64 (then wrapped, as gcc's x86-64 code)."""
  src, dst = u.src[0].dtype, u.dtype
  if not src.is_float or not dst.is_int: return None
  if dst.itemsize < 4: return u.src[0].cast(dtypes.int32).cast(dst)
  if dst == dtypes.uint32: return u.src[0].cast(dtypes.int64).cast(dst)
  return None


def _safe_divisor(b: UOp) -> tuple[UOp, UOp] | None:
  """(b is usable, b where usable else 1) for an integer divisor that may be 0 (or -1 when signed); None if not."""
  lo, hi = b.vrange
  signed = b.dtype.kind == 'i' or b.dtype == dtypes.index
  if not (lo <= 0 <= hi or (signed and lo <= -1 <= hi)): return None
  ok = b.ne(_const(b.dtype, 0))
  if signed: ok = ok & b.ne(_const(b.dtype, -1))
  return ok, ok.where(b, _const(b.dtype, 1))


def _int_division(u: UOp, ctx: Native) -> UOp | None:
  """IDIV/MOD with C truncation, x / 0 = x % 0 = 0, x / -1 = -x, x % -1 = 0: the native op gets a safe divisor
  (an emulated dtype's once it is computed in 32 bits)."""
  if not u.dtype.is_int or _emulated(u.dtype, ctx): return None
  a, b = u.src
  if b.op is Ops.WHERE and (safe := _safe_divisor(b.src[1])) is not None and safe[1] is b: return None   # guarded
  if b.op is Ops.CONST and b.arg in (0, -1):
    return UOp(Ops.NEG, u.dtype, (a,)) if b.arg == -1 and u.op is Ops.IDIV else _const(u.dtype, 0)
  if (safe := _safe_divisor(b)) is None: return None
  ok, divisor = safe
  other = _const(u.dtype, 0)
  if u.op is Ops.IDIV and (u.dtype.kind == 'i' or u.dtype == dtypes.index):   # b is 0 or -1 here
    other = b.ne(_const(b.dtype, 0)).where(-a, other)
  return ok.where(UOp(u.op, u.dtype, (a, divisor)), other)


def _float_max(u: UOp, ctx: Native) -> UOp | None:
  if not _is_float(u) or Ops.MAX in ctx.float_ops or _emulated(u.dtype, ctx): return None
  a, b = u.src
  return (a.ne(a) | (b < a)).where(a, b)


EDGE_CASES = [(UPat(Ops.CAST, name="u"), _float_to_int), (UPat((Ops.IDIV, Ops.MOD), name="u"), _int_division),
              (UPat(Ops.MAX, name="u"), _float_max)]


decompositions = PatternMatcher([
  (UPat(ALU, name="u"), _bool_alu),
  (UPat((Ops.RECIP, Ops.SQRT, Ops.TRUNC, Ops.FLOOR), name="u"), _int_unary),
  (UPat((Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.FLOOR, Ops.MOD), name="u"), _float_op),
  (UPat((Ops.SHL, Ops.SHR), name="u"), decomp.shift),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat(Ops.RECIP, name="r"))), _division),
  (UPat((Ops.CAST, Ops.BITCAST), name="u"), _bool_cast),
  (UPat((Ops.LOAD, Ops.STORE), name="u"), _bool_memory),
  (UPat(Ops.REDUCE, name="u"), _bool_reduce),
  *EDGE_CASES,   # (again after emulation, on the promoted ops)
])


# ---------------------------------------------------------------- emulation: dtypes the target lacks

def _cast(x: UOp, dt: DType) -> UOp: return _const(dt, x.arg) if x.op is Ops.CONST else x.cast(dt)


def _bits(x: UOp) -> UOp:
  """The 16 storage bits of an emulated 16-bit float (a constant's are a uint16 constant)."""
  return x.src[0] if x.op is Ops.BITCAST and x.src[0].dtype == dtypes.uint16 else x.bitcast(dtypes.uint16)


def _wide(dt: DType) -> DType:
  if dt in FLOAT16S: return F32
  return dtypes.uint32 if dt.is_unsigned else dtypes.int32


def _promote(u: UOp, ctx: Native) -> UOp | None:
  """An op on an emulated dtype: computed in its wide type and converted back. Comparisons compare wide values;
  a select of two stored values stays as it is (16-bit floats: a select of their bits)."""
  if u.op is Ops.WHERE: return None
  if u.op in (Ops.CMPLT, Ops.CMPNE):
    dt = u.src[0].dtype
    if not _emulated(dt, ctx) or dt not in FLOAT16S: return None
    return UOp(u.op, BOOL, tuple(_cast(s, F32) for s in u.src))
  if not _emulated(u.dtype, ctx): return None
  wide = _wide(u.dtype)
  if u.op is not Ops.REDUCE: return UOp(u.op, wide, tuple(_cast(s, wide) for s in u.src), u.arg).cast(u.dtype)
  # a reduction accumulates in the wide type; a 16-bit float accumulator is rounded after every step too
  arg = (u.arg, _step(u.arg, wide, ctx, u.dtype)) if u.dtype in FLOAT16S else u.arg
  return UOp(Ops.REDUCE, wide, (_cast(u.src[0], wide),) + u.src[1:], arg).cast(u.dtype)


def _float16_cast(u: UOp, ctx: Native) -> UOp | None:
  """Conversions of emulated 16-bit floats: to and from float32 by bit operations, anything else via float32
  (int -> float16 rounds twice, as C's `(float)x` then the conversion)."""
  src, dst = u.src[0].dtype, u.dtype
  if (src in ctx.float16_casts and dst == F32) or (dst in ctx.float16_casts and src == F32): return None   # native
  if _emulated(src, ctx) and src in FLOAT16S:
    if dst != F32: return _cast(u.src[0], F32).cast(dst)
    return decomp.FROM_BITS[src](_bits(u.src[0]))
  if _emulated(dst, ctx) and dst in FLOAT16S:
    if src != F32: return _cast(u.src[0], F32).cast(dst)
    return decomp.TO_BITS[dst](u.src[0]).bitcast(dst)
  return None


def _float16_const(u: UOp, ctx: Native) -> UOp | None:
  if not _emulated(u.dtype, ctx) or u.dtype not in FLOAT16S: return None
  return _const(dtypes.uint16, decomp.bits16(u.arg, u.dtype)).bitcast(u.dtype)


def _step(op: Ops, dt: DType, ctx: Native, rounded_to: DType | None = None) -> UOp:
  """A reduction's accumulate step as an ordinary op on two placeholders (DEFINE_ACC "acc" and "value"), lowered
  here (rounded to `rounded_to` and back, if given); linearize puts the accumulator and the value in."""
  step = UOp(op, dt, (UOp(Ops.DEFINE_ACC, dt, (), "acc"), UOp(Ops.DEFINE_ACC, dt, (), "value")))
  if rounded_to is not None: step = step.cast(rounded_to).cast(dt)
  return graph_rewrite(step, emulation, ctx=ctx)


def _combine(u: UOp, ctx: Native) -> UOp | None:
  return u.replace(arg=(u.arg, _step(u.arg, u.dtype, ctx))) if isinstance(u.arg, Ops) else None


def _bitcast_pair(u: UOp) -> UOp | None:
  x = u.src[0]
  return x.src[0] if x.op is Ops.BITCAST and x.src[0].dtype == u.dtype else None


emulation = PatternMatcher([
  (UPat(Ops.CONST, name="u"), _float16_const),
  (UPat(Ops.CAST, name="u"), _float16_cast),
  (UPat(ALU | {Ops.REDUCE}, name="u"), _promote),
  (UPat(Ops.BITCAST, name="u"), _bitcast_pair),
  *EDGE_CASES,
  (UPat(Ops.REDUCE, name="u"), _combine),
])


# ---------------------------------------------------------------- targets that declare only a set of ops

def _legacy_float_op(u: UOp, ctx: set) -> UOp | None:
  if u.op in ctx or not u.dtype.is_float: return None
  return decomp.floor_by_trunc(u.src[0]) if u.op is Ops.FLOOR else decomp.transcendental(u)


legacy = PatternMatcher([(UPat((Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.FLOOR), name="u"), _legacy_float_op),
                         (UPat((Ops.SHL, Ops.SHR), name="u"), decomp.shift)])


def passes(native_ops) -> list[tuple]:
  """The rewrites between the kernel optimizations and linearize, as (label, patterns, ctx), for a renderer's
  `native_ops`: a Native gets the whole lowering, a plain set of ops (the legacy form) only the
  transcendental, floor and shift rewrites."""
  if not isinstance(native_ops, Native):
    return [("symbolic", symbolic, None), ("decompositions", legacy, native_ops), ("symbolic again", symbolic, None)]
  return [("symbolic", symbolic, None), ("decompositions", decompositions, native_ops),
          ("symbolic again", symbolic, None), ("emulation", emulation, native_ops)]
