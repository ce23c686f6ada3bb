"""PTX instructions -> numpy closures over all threads of a batch.

Every instruction compiles once into `fn(ctx, idx)`: `ctx` holds the registers of every thread of the batch
(one numpy array per register, its bits in an unsigned container of the declared width, bool for .pred)
and `idx` picks the threads that execute (None: all of them; else an index array). Operands are read as
the instruction type (a `.view` when the register has that width; a wider register is truncated, a
narrower one extended, as PTX's "operand size exceeding instruction-type size" rules say), results are
written back the same way: zero- or sign-extended by the instruction type's signedness.

Semantics follow NVIDIA's "PTX ISA" (8.x) instruction descriptions; the comments name the rule where it is
not the obvious one. Control flow (bra, ret/exit, bar.sync) is executed by `ptx.launch`, not here.
"""
from __future__ import annotations

import numpy as np

from .ptx_parse import (Instr, Reg, SReg, Imm, Sym, Mem, Vec, PredPair, PtxError, PtxTrap, PtxUnsupported, PtxWarpError,
                        TYPE_SIZE, SREG_64)
from . import ptx_float as F
from .rdna3_float import matrix_sum, round_matrix_sum
from .counters import ALU, GLOBAL, SHARED, BRANCH, BARRIER, OTHER

NP = {"pred": np.dtype(bool), "b8": np.dtype(np.uint8), "u8": np.dtype(np.uint8), "s8": np.dtype(np.int8),
      "b16": np.dtype(np.uint16), "u16": np.dtype(np.uint16), "s16": np.dtype(np.int16), "f16": np.dtype(np.float16),
      "bf16": np.dtype(np.uint16), "b32": np.dtype(np.uint32), "u32": np.dtype(np.uint32), "s32": np.dtype(np.int32),
      "f32": np.dtype(np.float32), "f16x2": np.dtype(np.uint32), "bf16x2": np.dtype(np.uint32),
      "b64": np.dtype(np.uint64), "u64": np.dtype(np.uint64), "s64": np.dtype(np.int64), "f64": np.dtype(np.float64)}
UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
SINT = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
ROUND = ("rn", "rz", "rm", "rp")
IROUND = ("rni", "rzi", "rmi", "rpi")
# generic-address windows of the per-thread .local and per-block .shared spaces (cvta / generic ld/st)
LOCAL_WINDOW = 0xFE00_0000_0000_0000
SHARED_WINDOW = 0xFD00_0000_0000_0000
WINDOW_SIZE = 1 << 40
M64 = (1 << 64) - 1

KIND_OP, KIND_BRA, KIND_EXIT, KIND_BAR = 0, 1, 2, 3


def container(reg_type: str) -> np.dtype:
  if reg_type == "pred": return NP["pred"]
  return UINT[TYPE_SIZE[reg_type]]


def is_float(t: str) -> bool: return t in ("f16", "bf16", "f32", "f64")
def is_signed(t: str) -> bool: return t.startswith("s")


class Compiled:
  """One instruction ready to run: its kind (op/bra/exit/bar), closure, guard, branch target and counter class
  (drivers/emu/counters.py CLASSES; its bytes are counted where the access lands, in ptx._Batch.load/store)."""
  __slots__ = ("kind", "fn", "guard", "target", "ins", "cls")

  def __init__(self, kind, fn, guard, target, ins, cls=ALU):
    self.kind, self.fn, self.guard, self.target, self.ins, self.cls = kind, fn, guard, target, ins, cls


# the counter class of ld/st by state space: generic counts as global (ptx._Batch moves the count of threads whose
# address lands in the .shared or .local window); .param reads are constant-bank operands in SASS, .local is private
_MEMORY_CLASS = {"global": GLOBAL, "generic": GLOBAL, "shared": SHARED, "local": OTHER, "param": OTHER}


def counter_class(ins: Instr) -> int:
  """The counter class of an instruction the Compiler accepts (decided once, when it is compiled)."""
  op = ins.op
  if op in ("bra", "ret", "exit"): return BRANCH
  if op in ("bar", "barrier"): return BARRIER
  if op in ("ld", "ldu", "st"):
    return _MEMORY_CLASS.get(next((m for m in ins.mods if m in _SPACES), "generic"), OTHER)
  if op in HANDLERS: return ALU
  return OTHER                  # membar, fence, prefetch, nanosleep, pmevent, trap


class Compiler:
  """Turns the instructions of one entry into closures (operand readers and writers bound once)."""

  def __init__(self, entry):
    self.entry = entry
    self.regs = {name: container(t) for name, t in entry.regs.items()}
    self.params = {p.name: p for p in entry.params}

  # ---- errors ----
  def unsupported(self, ins: Instr, detail: str = ""):
    return PtxUnsupported(".".join((ins.op,) + ins.mods), ins.line, detail or ins.text)

  def reg_container(self, r: Reg, ins: Instr) -> np.dtype:
    if r.name not in self.regs: raise PtxError(f"line {ins.line}: register {r.name} is not declared ({ins.text})")
    return self.regs[r.name]

  # ---- operand readers: fn(ctx, idx) -> numpy array (len of idx) or numpy scalar, of dtype NP[t] ----
  def imm(self, op: Imm, t: str):
    dt = NP[t]
    if op.fbits:
      fval = np.array(op.value, np.uint32 if op.fbits == "f32" else np.uint64).view(
        np.float32 if op.fbits == "f32" else np.float64)[()]
      if t == "bf16": return F.to_bf16_bits(np.float64(fval))[()]
      if is_float(t): return dt.type(fval)
      return np.array(op.value & ((1 << (8 * dt.itemsize)) - 1), UINT[dt.itemsize]).view(dt)[()]
    if isinstance(op.value, float):
      if t == "bf16": return F.to_bf16_bits(np.float64(op.value))[()]
      if not is_float(t): raise PtxError(f"float literal {op.value} used as .{t}")
      return dt.type(op.value)
    if t == "pred": return np.bool_(op.value != 0)
    if t == "bf16": return F.to_bf16_bits(np.float64(op.value))[()]
    if is_float(t): return dt.type(op.value)
    return np.array(op.value & ((1 << (8 * dt.itemsize)) - 1), UINT[dt.itemsize]).view(dt)[()]

  def reader(self, op, t: str, ins: Instr):
    dt = NP[t]
    if isinstance(op, Imm):
      v = self.imm(op, t)
      return lambda ctx, idx: v
    if isinstance(op, SReg):
      key = op.name + ("." + op.comp if op.comp else "")
      src_t = "u64" if op.name in SREG_64 else "u32"
      def rd_sreg(ctx, idx):
        a = ctx.sreg(key)
        if isinstance(a, np.ndarray) and idx is not None: a = a[idx]
        return _convert(a, src_t, t)
      return rd_sreg
    if isinstance(op, Sym):
      addr = self.symbol_address(op, ins)
      v = np.array(addr & ((1 << (8 * dt.itemsize)) - 1), UINT[dt.itemsize]).view(dt)[()]
      return lambda ctx, idx: v
    if isinstance(op, Reg):
      name, cont = op.name, self.reg_container(op, ins)
      neg = op.neg
      if t == "pred" or cont == NP["pred"]:
        if not (t == "pred" and cont == NP["pred"]):
          raise PtxError(f"line {ins.line}: {name} used as .{t} ({ins.text})")
        if neg: return lambda ctx, idx: ~(ctx.regs[name] if idx is None else ctx.regs[name][idx])
        return lambda ctx, idx: (ctx.regs[name] if idx is None else ctx.regs[name][idx]).view(bool)
      if neg: raise PtxError(f"line {ins.line}: `!` on a non-predicate register ({ins.text})")
      if cont.itemsize == dt.itemsize:
        return lambda ctx, idx: (ctx.regs[name] if idx is None else ctx.regs[name][idx]).view(dt)
      if cont.itemsize > dt.itemsize:      # source truncated to the instruction type's size
        narrow = UINT[dt.itemsize]
        return lambda ctx, idx: (ctx.regs[name] if idx is None else ctx.regs[name][idx]).astype(narrow).view(dt)
      if is_float(t): raise PtxError(f"line {ins.line}: {name} is narrower than .{t} ({ins.text})")
      src = (SINT if is_signed(t) else UINT)[cont.itemsize]
      wide = (SINT if is_signed(t) else UINT)[dt.itemsize]
      return lambda ctx, idx: (ctx.regs[name] if idx is None else ctx.regs[name][idx]).view(src).astype(wide).view(dt)
    raise PtxError(f"line {ins.line}: operand {op} cannot be read as a value ({ins.text})")

  def symbol_address(self, op: Sym, ins: Instr) -> int:
    v = self.entry.variables.get(op.name)
    if v is not None: return v.offset              # the address in its own (.local / .shared) space
    p = self.params.get(op.name)
    if p is not None: return p.offset
    raise PtxError(f"line {ins.line}: unknown symbol {op.name!r} ({ins.text})")

  # ---- writers: fn(ctx, idx, value) ----
  def writer(self, op, t: str, ins: Instr):
    if not isinstance(op, Reg): raise PtxError(f"line {ins.line}: destination must be a register ({ins.text})")
    name, cont = op.name, self.reg_container(op, ins)
    dt = NP[t]
    if cont == NP["pred"] and t != "pred": raise PtxError(f"line {ins.line}: {name} is a predicate ({ins.text})")
    if t == "pred" and cont != NP["pred"]: raise PtxError(f"line {ins.line}: {name} is not a predicate ({ins.text})")
    if t == "pred": conv = lambda v: v
    elif cont.itemsize == dt.itemsize: conv = lambda v: v.view(cont)
    elif cont.itemsize > dt.itemsize:    # extended by the instruction type's signedness
      src = (SINT if is_signed(t) else UINT)[dt.itemsize]
      wide = (SINT if is_signed(t) else UINT)[cont.itemsize]
      conv = lambda v: v.view(src).astype(wide).view(cont)
    else:
      narrow = UINT[dt.itemsize]
      conv = lambda v: v.view(narrow).astype(cont)

    def write(ctx, idx, v):
      if not isinstance(v, np.ndarray) or v.ndim == 0:
        v = np.asarray(v, dt)
        if idx is None: ctx.regs[name] = np.full(ctx.n, conv(v[()]), cont); return
        ctx.regs[name][idx] = conv(v[()]); return
      if v.dtype != dt: v = v.astype(dt)
      if idx is None:
        fresh = v.base is None
        v = conv(v)
        ctx.regs[name] = v if fresh or v.base is None else v.copy()
      else:
        ctx.regs[name][idx] = conv(v)
    return write

  # ---- addresses ----
  def address(self, m: Mem, ins: Instr):
    """fn(ctx, idx) -> uint64 address array or scalar (in the operand's own state space)."""
    off = np.uint64(m.offset & M64)
    if m.base is None: return lambda ctx, idx: off
    if isinstance(m.base, Sym):
      a = np.uint64((self.symbol_address(m.base, ins) + m.offset) & M64)
      return lambda ctx, idx: a
    rd = self.reader(m.base, "u64" if self.reg_container(m.base, ins).itemsize == 8 else "u32", ins)
    if m.offset == 0: return lambda ctx, idx: np.asarray(rd(ctx, idx)).astype(np.uint64, copy=False)
    return lambda ctx, idx: np.asarray(rd(ctx, idx)).astype(np.uint64, copy=False) + off

  # ---- entry point ----
  def compile(self, ins: Instr, labels: dict) -> Compiled:
    c = self._compile(ins, labels)
    c.cls = counter_class(ins)
    return c

  def _compile(self, ins: Instr, labels: dict) -> Compiled:
    guard = None
    if ins.guard is not None:
      if self.reg_container(ins.guard, ins) != NP["pred"]:
        raise PtxError(f"line {ins.line}: guard {ins.guard.name} is not a predicate")
      guard = (ins.guard.name, ins.guard.neg)
    op = ins.op
    if op == "bra":
      if len(ins.operands) != 1 or not isinstance(ins.operands[0], Sym): raise self.unsupported(ins, "indirect branch")
      label = ins.operands[0].name
      if label not in labels: raise PtxError(f"line {ins.line}: unknown label {label!r}")
      return Compiled(KIND_BRA, None, guard, labels[label], ins)
    if op in ("ret", "exit"): return Compiled(KIND_EXIT, None, guard, None, ins)
    if op in ("bar", "barrier"):
      if not ins.has("sync") and ins.mods[:1] != ("sync",) and not (op == "barrier" and ins.has("sync")):
        raise self.unsupported(ins, "only bar.sync / barrier.sync are supported")
      return Compiled(KIND_BAR, None, guard, None, ins)
    if op in ("membar", "fence", "prefetch", "prefetchu", "nanosleep", "pmevent"):
      return Compiled(KIND_OP, lambda ctx, idx: None, guard, None, ins)
    if op == "trap": return Compiled(KIND_OP, _trap, guard, None, ins)
    handler = HANDLERS.get(op)
    if handler is None: raise self.unsupported(ins)
    return Compiled(KIND_OP, handler(self, ins), guard, None, ins)


def _trap(ctx, idx):
  raise PtxTrap("trap")      # launch() names the kernel and the line


def _convert(a, src_t: str, t: str):
  """Integer value of type src_t read as type t (truncate / extend by src signedness)."""
  s, d = NP[src_t], NP[t]
  if s == d: return a.view(d) if isinstance(a, np.ndarray) else a
  if d.itemsize == s.itemsize: return a.view(d)
  if d.itemsize < s.itemsize: return np.asarray(a).astype(UINT[d.itemsize]).view(d)
  return np.asarray(a).astype((SINT if is_signed(src_t) else UINT)[d.itemsize]).view(d)


def _operands(c: Compiler, ins: Instr, n: int):
  if len(ins.operands) != n:
    raise PtxError(f"line {ins.line}: {ins.op} takes {n} operands, got {len(ins.operands)} ({ins.text})")
  return ins.operands


def _type(c: Compiler, ins: Instr, allowed=None) -> str:
  if len(ins.types) != 1: raise c.unsupported(ins, "expected one type")
  t = ins.types[0]
  if t in ("f16x2", "bf16x2", "b128", "tf32") or (allowed is not None and t not in allowed): raise c.unsupported(ins)
  return t


def _rnd(ins: Instr, default: str = "rn") -> str:
  for m in ins.mods:
    if m in ROUND: return m
  return default


_IGNORED = {"approx", "full", "ftz", "sat", "rn", "rz", "rm", "rp", "lo", "hi", "wide", "NaN", "uni"}


# =================================== integer and float arithmetic ===================================
def _f_in(ins: Instr, t: str, v):
  """Inputs: flush float32 subnormals with .ftz."""
  return F.ftz(v) if ins.has("ftz") and t == "f32" else v


def _f_out(ins: Instr, t: str, v):
  if ins.has("ftz") and t == "f32": v = F.ftz(v)
  if ins.has("sat"):   # clamp to [0, 1], NaN -> +0 (PTX: saturation modifier)
    v = np.asarray(v)
    v = np.where(np.isnan(v), v.dtype.type(0), np.clip(v, v.dtype.type(0), v.dtype.type(1))).astype(v.dtype)
  return v


def _half_in(t: str, v):
  """f16 / bf16 operand (bits for bf16) as float32."""
  return F.bf16_bits_to_f32(v) if t == "bf16" else np.asarray(v).astype(np.float32)


def _round_pair(s, e, t: str, mode: str):
  """The exact value s + e (float64 pair) rounded to type t."""
  odd = F.f64_sign_residual(s, e)
  if t == "f32": return F.to_f32_from_f64(odd, mode)
  if t == "f16": return F.to_f16_bits(odd, mode).view(np.float16)
  if t == "bf16": return F.to_bf16_bits(odd, mode)
  raise ValueError(t)


def _float_arith(c: Compiler, ins: Instr, t: str, kind: str, a, b, cc=None):
  """add/sub/mul/fma on float types with any rounding mode."""
  mode = _rnd(ins)
  if t == "f64":
    if mode != "rn": raise c.unsupported(ins, "directed rounding on f64")
    if kind == "fma": return F.f64_fma(a, b, cc)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[kind](a, b)
  if t == "f32" and mode == "rn" and kind != "fma":
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[kind](a, b)
  to64 = (lambda v: _half_in(t, v).astype(np.float64)) if t in ("f16", "bf16") else (lambda v: np.asarray(v).astype(np.float64))
  a64, b64 = to64(a), to64(b)
  if kind == "mul": return _round_pair(a64 * b64, np.zeros_like(a64 * b64), t, mode)
  if kind == "add": x, y = a64, b64                     # the exact addends
  elif kind == "sub": x, y = a64, -b64
  else: x, y = a64 * b64, to64(cc)
  out = _round_pair(*F.two_sum(x, y), t, mode)
  negative_zero = F.exact_zero_is_negative(x, y, mode)     # sign of an exact zero sum (IEEE 754-2008, 6.3)
  if t == "bf16": return np.where(negative_zero, np.uint16(0x8000), out).astype(np.uint16)
  return np.where(negative_zero, out.dtype.type(-0.0), out).astype(out.dtype)


def _check_float_mode(c: Compiler, ins: Instr, t: str):
  if t == "f64" and _rnd(ins) != "rn": raise c.unsupported(ins, "directed rounding on f64")


def h_addsub(c: Compiler, ins: Instr):
  t = _type(c, ins)
  _check_float_mode(c, ins, t)
  d, a, b = _operands(c, ins, 3)
  ra, rb, w = c.reader(a, t, ins), c.reader(b, t, ins), c.writer(d, t, ins)
  kind = ins.op
  if ins.has("cc") or ins.op in ("addc", "subc"): raise c.unsupported(ins, "carry chains")
  if is_float(t):
    def fn(ctx, idx):
      w(ctx, idx, _f_out(ins, t, _float_arith(c, ins, t, kind, _f_in(ins, t, ra(ctx, idx)), _f_in(ins, t, rb(ctx, idx)))))
    return fn
  if ins.has("sat"):
    if t != "s32": raise c.unsupported(ins)
    def fn(ctx, idx):
      x, y = np.asarray(ra(ctx, idx)).astype(np.int64), np.asarray(rb(ctx, idx)).astype(np.int64)
      w(ctx, idx, np.clip(x + y if kind == "add" else x - y, -2**31, 2**31 - 1).astype(np.int32))
    return fn
  u = UINT[NP[t].itemsize]
  f = np.add if kind == "add" else np.subtract
  return lambda ctx, idx: w(ctx, idx, f(np.asarray(ra(ctx, idx)).view(u), np.asarray(rb(ctx, idx)).view(u)))


def _mulhi(a, b, t: str):
  dt = NP[t]
  n = dt.itemsize
  if n < 8:
    wide = np.int64 if is_signed(t) else np.uint64
    p = np.asarray(a).astype(wide) * np.asarray(b).astype(wide)
    return (p >> wide(8 * n)).astype(dt)
  ua, ub = np.asarray(a).view(np.uint64), np.asarray(b).view(np.uint64)
  m, s = np.uint64(0xFFFFFFFF), np.uint64(32)
  al, ah, bl, bh = ua & m, ua >> s, ub & m, ub >> s
  ll, lh, hl, hh = al * bl, al * bh, ah * bl, ah * bh
  mid = (ll >> s) + (lh & m) + (hl & m)
  hi = hh + (lh >> s) + (hl >> s) + (mid >> s)
  if is_signed(t):   # signed high half from the unsigned one: subtract b if a < 0 and a if b < 0
    hi = hi - np.where(np.asarray(a) < 0, ub, np.uint64(0)) - np.where(np.asarray(b) < 0, ua, np.uint64(0))
  return hi.view(dt)


def _wide(t: str) -> str: return t[0] + str(2 * int(t[1:]))


def h_mul(c: Compiler, ins: Instr):
  t = _type(c, ins)
  _check_float_mode(c, ins, t)
  d, a, b = _operands(c, ins, 3)
  if is_float(t):
    ra, rb, w = c.reader(a, t, ins), c.reader(b, t, ins), c.writer(d, t, ins)
    def fn(ctx, idx):
      w(ctx, idx, _f_out(ins, t, _float_arith(c, ins, t, "mul", _f_in(ins, t, ra(ctx, idx)), _f_in(ins, t, rb(ctx, idx)))))
    return fn
  ra, rb = c.reader(a, t, ins), c.reader(b, t, ins)
  if ins.has("wide"):
    if NP[t].itemsize > 4: raise c.unsupported(ins)
    wt = _wide(t)
    w = c.writer(d, wt, ins)
    return lambda ctx, idx: w(ctx, idx, np.asarray(ra(ctx, idx)).astype(NP[wt]) * np.asarray(rb(ctx, idx)).astype(NP[wt]))
  w = c.writer(d, t, ins)
  if ins.has("hi"): return lambda ctx, idx: w(ctx, idx, _mulhi(ra(ctx, idx), rb(ctx, idx), t))
  u = UINT[NP[t].itemsize]
  return lambda ctx, idx: w(ctx, idx, np.multiply(np.asarray(ra(ctx, idx)).view(u), np.asarray(rb(ctx, idx)).view(u)))


def h_mad(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a, b, cc = _operands(c, ins, 4)
  if is_float(t): return h_fma(c, ins)
  ra, rb = c.reader(a, t, ins), c.reader(b, t, ins)
  if ins.has("wide"):
    if NP[t].itemsize > 4: raise c.unsupported(ins)
    wt = _wide(t)
    rc, w = c.reader(cc, wt, ins), c.writer(d, wt, ins)
    u = UINT[NP[wt].itemsize]
    def fn(ctx, idx):
      p = np.asarray(ra(ctx, idx)).astype(NP[wt]) * np.asarray(rb(ctx, idx)).astype(NP[wt])
      w(ctx, idx, (p.view(u) + np.asarray(rc(ctx, idx)).view(u)))
    return fn
  rc, w = c.reader(cc, t, ins), c.writer(d, t, ins)
  u = UINT[NP[t].itemsize]
  if ins.has("hi"):
    if ins.has("sat"):
      if t != "s32": raise c.unsupported(ins)
      return lambda ctx, idx: w(ctx, idx, np.clip(_mulhi(ra(ctx, idx), rb(ctx, idx), t).astype(np.int64)
                                                  + np.asarray(rc(ctx, idx)).astype(np.int64), -2**31, 2**31 - 1).astype(np.int32))
    return lambda ctx, idx: w(ctx, idx, _mulhi(ra(ctx, idx), rb(ctx, idx), t).view(u) + np.asarray(rc(ctx, idx)).view(u))
  return lambda ctx, idx: w(ctx, idx, np.asarray(ra(ctx, idx)).view(u) * np.asarray(rb(ctx, idx)).view(u)
                            + np.asarray(rc(ctx, idx)).view(u))


def h_fma(c: Compiler, ins: Instr):
  t = _type(c, ins, ("f16", "bf16", "f32", "f64"))
  if not any(m in ROUND for m in ins.mods) and t in ("f32", "f64") and ins.op == "mad":
    raise c.unsupported(ins, "mad.f32/f64 needs a rounding modifier (sm_20+)")
  _check_float_mode(c, ins, t)
  d, a, b, cc = _operands(c, ins, 4)
  ra, rb, rc, w = c.reader(a, t, ins), c.reader(b, t, ins), c.reader(cc, t, ins), c.writer(d, t, ins)
  def fn(ctx, idx):
    x, y, z = (_f_in(ins, t, r(ctx, idx)) for r in (ra, rb, rc))
    if t == "f32": out = F.f32_fma(x, y, z, _rnd(ins))
    else: out = _float_arith(c, ins, t, "fma", x, y, z)
    w(ctx, idx, _f_out(ins, t, out))
  return fn


def _int_div(a, b, t: str, rem: bool):
  """Truncating division; b == 0 gives all ones (div) / a (rem), INT_MIN / -1 wraps (PTX: unspecified)."""
  a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
  dt = a.dtype
  zero = b == 0
  if is_signed(t):
    minus1 = b == -1
    safe = np.where(zero | minus1, dt.type(1), b)
    r = np.fmod(a, safe)                          # C remainder: sign of the dividend
    if rem: return np.where(zero, a, np.where(minus1, dt.type(0), r)).astype(dt)
    q = (a - r) // safe
    neg = (np.zeros_like(a).view(UINT[dt.itemsize]) - a.view(UINT[dt.itemsize])).view(dt)
    return np.where(zero, dt.type(-1), np.where(minus1, neg, q)).astype(dt)
  safe = np.where(zero, dt.type(1), b)
  if rem: return np.where(zero, a, a % safe).astype(dt)
  return np.where(zero, np.iinfo(dt).max, a // safe).astype(dt)


def h_divrem(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a, b = _operands(c, ins, 3)
  ra, rb, w = c.reader(a, t, ins), c.reader(b, t, ins), c.writer(d, t, ins)
  if is_float(t):
    if ins.op == "rem": raise c.unsupported(ins)
    if t in ("f16", "bf16"): raise c.unsupported(ins)
    mode = _rnd(ins)
    if mode != "rn": raise c.unsupported(ins, "directed-rounding division")
    if t == "f64" and not any(m in ROUND for m in ins.mods): raise c.unsupported(ins, "div.f64 needs .rn")
    # .rn is IEEE correctly rounded; .full (2 ulp) and .approx are computed exactly as well
    return lambda ctx, idx: w(ctx, idx, _f_out(ins, t, np.divide(_f_in(ins, t, ra(ctx, idx)), _f_in(ins, t, rb(ctx, idx)))))
  rem = ins.op == "rem"
  return lambda ctx, idx: w(ctx, idx, _int_div(ra(ctx, idx), rb(ctx, idx), t, rem))


def h_minmax(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a, b = _operands(c, ins, 3)[:3]
  ra, rb, w = c.reader(a, t, ins), c.reader(b, t, ins), c.writer(d, t, ins)
  is_max = ins.op == "max"
  if is_float(t):
    nan_mode = ins.has("NaN")
    if t in ("f16", "bf16"):
      def fh(ctx, idx):
        r = F.fminmax(_half_in(t, ra(ctx, idx)), _half_in(t, rb(ctx, idx)), is_max, nan_mode)
        w(ctx, idx, F.to_bf16_bits(r) if t == "bf16" else F.to_f16_bits(r).view(np.float16))
      return fh
    return lambda ctx, idx: w(ctx, idx, _f_out(ins, t, F.fminmax(_f_in(ins, t, ra(ctx, idx)), _f_in(ins, t, rb(ctx, idx)),
                                                               is_max, nan_mode)))
  f = np.maximum if is_max else np.minimum
  if ins.has("relu"): return lambda ctx, idx: w(ctx, idx, np.maximum(f(ra(ctx, idx), rb(ctx, idx)), NP[t].type(0)))
  return lambda ctx, idx: w(ctx, idx, f(ra(ctx, idx), rb(ctx, idx)))


def h_absneg(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a = _operands(c, ins, 2)
  ra, w = c.reader(a, t, ins), c.writer(d, t, ins)
  neg = ins.op == "neg"
  if is_float(t):   # sign-bit operations (exact for every input)
    u = UINT[NP[t].itemsize]
    sign = u.type(1 << (8 * NP[t].itemsize - 1))
    def ff(ctx, idx):
      x = _f_in(ins, t, ra(ctx, idx))
      bits = np.asarray(x).view(u)
      out = (bits ^ sign) if neg else (bits & ~sign)
      w(ctx, idx, _f_out(ins, t, out.view(NP[t])) if t == "f32" else out.view(NP[t]))
    return ff
  u = UINT[NP[t].itemsize]
  if neg: return lambda ctx, idx: w(ctx, idx, (u.type(0) - np.asarray(ra(ctx, idx)).view(u)))
  return lambda ctx, idx: w(ctx, idx, np.abs(ra(ctx, idx)))


def h_logic(c: Compiler, ins: Instr):
  t = _type(c, ins)
  if is_float(t) or (t == "pred" and ins.op == "cnot"): raise c.unsupported(ins)
  op = ins.op
  if op in ("not", "cnot"):
    d, a = _operands(c, ins, 2)
    ra, w = c.reader(a, t, ins), c.writer(d, t, ins)
    if op == "cnot": return lambda ctx, idx: w(ctx, idx, (np.asarray(ra(ctx, idx)) == 0).astype(NP[t]))
    if t == "pred": return lambda ctx, idx: w(ctx, idx, np.logical_not(ra(ctx, idx)))
    return lambda ctx, idx: w(ctx, idx, np.invert(ra(ctx, idx)))
  d, a, b = _operands(c, ins, 3)
  ra, rb, w = c.reader(a, t, ins), c.reader(b, t, ins), c.writer(d, t, ins)
  f = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
  return lambda ctx, idx: w(ctx, idx, f(ra(ctx, idx), rb(ctx, idx)))


def h_shift(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a, b = _operands(c, ins, 3)
  ra, rb, w = c.reader(a, t, ins), c.reader(b, "u32", ins), c.writer(d, t, ins)
  dt = NP[t]
  bits = 8 * dt.itemsize
  left = ins.op == "shl"
  arith = ins.op == "shr" and is_signed(t)
  if isinstance(b, Imm):   # a constant amount (the common case)
    n = int(b.value) & 0xFFFFFFFF
    if n >= bits and not arith: return lambda ctx, idx: w(ctx, idx, np.zeros(ctx.count(idx), dt))
    s = dt.type(min(n, bits - 1))
    f = np.left_shift if left else np.right_shift
    return lambda ctx, idx: w(ctx, idx, f(np.asarray(ra(ctx, idx)), s))
  def fn(ctx, idx):
    x = np.asarray(ra(ctx, idx))
    n = np.asarray(rb(ctx, idx)).astype(np.uint32)
    big = n >= bits                                    # PTX: amounts above the width are clamped to it
    s = np.minimum(n, bits - 1).astype(dt)
    if left: out = np.where(big, dt.type(0), np.left_shift(x, s))
    elif arith: out = np.right_shift(x, s)             # >= width: all sign bits, as a shift by width-1
    else: out = np.where(big, dt.type(0), np.right_shift(x, s))
    w(ctx, idx, np.asarray(out, dt))
  return fn


def _bitlen(x):
  """Bit length of unsigned values (uint32/uint64 arrays)."""
  x = np.asarray(x)
  if x.dtype.itemsize <= 4:
    _, e = np.frexp(x.astype(np.float64))
    return e.astype(np.int64)
  hi, lo = (x >> np.uint64(32)).astype(np.uint32), (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)
  return np.where(hi != 0, _bitlen(hi) + 32, _bitlen(lo))


_BREV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


def h_bits(c: Compiler, ins: Instr):
  t = _type(c, ins)
  op = ins.op
  if op in ("popc", "clz"):
    d, a = _operands(c, ins, 2)
    ra, w = c.reader(a, t, ins), c.writer(d, "u32", ins)
    u = UINT[NP[t].itemsize]
    if op == "popc": return lambda ctx, idx: w(ctx, idx, np.bitwise_count(np.asarray(ra(ctx, idx)).view(u)).astype(np.uint32))
    width = 8 * NP[t].itemsize
    return lambda ctx, idx: w(ctx, idx, (width - _bitlen(np.asarray(ra(ctx, idx)).view(u))).astype(np.uint32))
  if op == "brev":
    d, a = _operands(c, ins, 2)
    ra, w = c.reader(a, t, ins), c.writer(d, t, ins)
    n = NP[t].itemsize
    def fb(ctx, idx):   # reverse the byte order, and the bits of every byte by table
      x = np.ascontiguousarray(np.atleast_1d(np.asarray(ra(ctx, idx)).view(UINT[n])))
      by = np.ascontiguousarray(_BREV8[x.view(np.uint8).reshape(-1, n)[:, ::-1]])
      w(ctx, idx, by.view(UINT[n]).reshape(-1).view(NP[t]))
    return fb
  if op == "bfe":
    d, a, b, cc = _operands(c, ins, 4)
    ra, rb, rc, w = c.reader(a, t, ins), c.reader(b, "u32", ins), c.reader(cc, "u32", ins), c.writer(d, t, ins)
    width, signed = 8 * NP[t].itemsize, is_signed(t)
    def fe(ctx, idx):
      x = np.asarray(ra(ctx, idx)).view(UINT[NP[t].itemsize]).astype(np.uint64)
      pos = (np.asarray(rb(ctx, idx)).astype(np.int64) & 0xFF)
      ln = (np.asarray(rc(ctx, idx)).astype(np.int64) & 0xFF)
      x, pos, ln = np.broadcast_arrays(x, pos, ln)
      avail = np.clip(np.minimum(ln, width - pos), 0, 64)
      shifted = np.where(pos >= width, np.uint64(0), x >> np.minimum(pos, 63).astype(np.uint64))
      mask = np.where(avail >= 64, np.uint64(M64), (np.uint64(1) << np.minimum(avail, 63).astype(np.uint64)) - np.uint64(1))
      val = shifted & mask
      if signed:
        spos = np.minimum(pos + ln - 1, width - 1).clip(0).astype(np.uint64)
        sbit = (ln != 0) & (((x >> spos) & np.uint64(1)) != 0)
        val = np.where(sbit, val | ~mask, val)
      w(ctx, idx, val.astype(UINT[NP[t].itemsize]).view(NP[t]))
    return fe
  if op == "bfi":
    d, a, b, cc, dd = _operands(c, ins, 5)
    ra, rb = c.reader(a, t, ins), c.reader(b, t, ins)
    rc, rd, w = c.reader(cc, "u32", ins), c.reader(dd, "u32", ins), c.writer(d, t, ins)
    width = 8 * NP[t].itemsize
    def fi(ctx, idx):
      x = np.asarray(ra(ctx, idx)).view(UINT[NP[t].itemsize]).astype(np.uint64)
      y = np.asarray(rb(ctx, idx)).view(UINT[NP[t].itemsize]).astype(np.uint64)
      pos = np.asarray(rc(ctx, idx)).astype(np.int64) & 0xFF
      ln = np.asarray(rd(ctx, idx)).astype(np.int64) & 0xFF
      x, y, pos, ln = np.broadcast_arrays(x, y, pos, ln)
      n = np.clip(np.minimum(ln, width - pos), 0, 64)
      m = np.where(n >= 64, np.uint64(M64), (np.uint64(1) << np.minimum(n, 63).astype(np.uint64)) - np.uint64(1))
      sh = np.minimum(pos, 63).astype(np.uint64)
      m = np.where(pos >= width, np.uint64(0), m << sh)
      out = (y & ~m) | ((x << sh) & m)
      w(ctx, idx, out.astype(UINT[NP[t].itemsize]).view(NP[t]))
    return fi
  raise c.unsupported(ins)


# =================================== comparisons and selection ===================================
_INT_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
_FLOAT_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
_BOOL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _compare(cmp: str, t: str, x, y):
  if is_float(t):
    if t in ("f16", "bf16"): x, y = _half_in(t, x), _half_in(t, y)
    nan = np.isnan(x) | np.isnan(y)
    if cmp == "num": return ~nan
    if cmp == "nan": return nan
    if cmp.endswith("u") and cmp[:-1] in _FLOAT_CMP: return _FLOAT_CMP[cmp[:-1]](x, y) | nan
    if cmp in _FLOAT_CMP: return _FLOAT_CMP[cmp](x, y) & ~nan    # ordered: false when either is NaN
    raise KeyError(cmp)
  if cmp in ("lo", "ls", "hi", "hs") or t.startswith("b"):
    u = UINT[NP[t].itemsize]
    x, y = np.asarray(x).view(u), np.asarray(y).view(u)
  return _INT_CMP[cmp](x, y)


def h_setp(c: Compiler, ins: Instr):
  t = _type(c, ins)
  cmps = [m for m in ins.mods if m not in TYPE_SIZE and m not in ("and", "or", "xor", "ftz")]
  if len(cmps) != 1: raise c.unsupported(ins)
  cmp = cmps[0]
  if not is_float(t) and cmp not in _INT_CMP: raise c.unsupported(ins)
  boolop = next((m for m in ins.mods if m in _BOOL), None)
  ops = ins.operands
  if len(ops) != (4 if boolop else 3): raise PtxError(f"line {ins.line}: bad operands ({ins.text})")
  dst = ops[0]
  pw = c.writer(dst.p if isinstance(dst, PredPair) else dst, "pred", ins)
  qw = c.writer(dst.q, "pred", ins) if isinstance(dst, PredPair) else None
  ra, rb = c.reader(ops[1], t, ins), c.reader(ops[2], t, ins)
  rc = c.reader(ops[3], "pred", ins) if boolop else None
  try: _compare(cmp, t, np.zeros(1, NP[t]), np.zeros(1, NP[t]))
  except KeyError: raise c.unsupported(ins) from None
  def fn(ctx, idx):
    x, y = ra(ctx, idx), rb(ctx, idx)
    if ins.has("ftz") and t == "f32": x, y = F.ftz(x), F.ftz(y)
    r = np.asarray(_compare(cmp, t, x, y))
    if boolop:
      cv = rc(ctx, idx)
      p = _BOOL[boolop](r, cv)
      q = _BOOL[boolop](~r, cv) if qw else None
    else:
      p, q = r, (~r if qw else None)
    if qw: qw(ctx, idx, np.asarray(q))
    pw(ctx, idx, np.asarray(p))
  return fn


def h_selp(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a, b, p = _operands(c, ins, 4)
  ra, rb, rp, w = c.reader(a, t, ins), c.reader(b, t, ins), c.reader(p, "pred", ins), c.writer(d, t, ins)
  return lambda ctx, idx: w(ctx, idx, np.where(rp(ctx, idx), ra(ctx, idx), rb(ctx, idx)).astype(NP[t]))


def h_testp(c: Compiler, ins: Instr):
  t = _type(c, ins, ("f32", "f64"))
  kind = next((m for m in ins.mods if m not in TYPE_SIZE), None)
  d, a = _operands(c, ins, 2)
  ra, w = c.reader(a, t, ins), c.writer(d, "pred", ins)
  tiny = F.TINY[NP[t]]
  tests = {"finite": np.isfinite, "infinite": np.isinf, "number": lambda x: ~np.isnan(x), "notanumber": np.isnan,
           "normal": lambda x: np.isfinite(x) & (np.abs(x) >= tiny),
           "subnormal": lambda x: (np.abs(x) < tiny) & (x != 0)}
  if kind not in tests: raise c.unsupported(ins)
  f = tests[kind]
  return lambda ctx, idx: w(ctx, idx, np.asarray(f(ra(ctx, idx))))


# =================================== float unary ===================================
def h_funary(c: Compiler, ins: Instr):
  t = _type(c, ins, ("f32", "f64"))
  d, a = _operands(c, ins, 2)
  ra, w = c.reader(a, t, ins), c.writer(d, t, ins)
  op = ins.op
  mode = _rnd(ins, None)
  if op in ("rcp", "sqrt") and mode not in (None, "rn"): raise c.unsupported(ins, "directed rounding")
  if op in ("rcp", "sqrt") and mode is None and not ins.has("approx"): raise c.unsupported(ins, "needs .rn or .approx")
  one = NP[t].type(1)
  # .rn: IEEE correctly rounded (numpy's float32/float64 divide and sqrt); the .approx forms are
  # computed the same way (exact is within their error bounds); ex2/lg2/sin/cos/tanh: numpy in the type
  f = {"rcp": lambda x: one / x, "sqrt": np.sqrt, "rsqrt": lambda x: one / np.sqrt(x), "ex2": np.exp2,
       "lg2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh}[op]
  return lambda ctx, idx: w(ctx, idx, _f_out(ins, t, np.asarray(f(_f_in(ins, t, ra(ctx, idx))), NP[t])))


# =================================== moves and conversions ===================================
def h_mov(c: Compiler, ins: Instr):
  t = _type(c, ins)
  d, a = _operands(c, ins, 2)
  if isinstance(d, Vec):      # unpack: mov.b64 {lo, hi}, %rd
    n = len(d.items)
    part = NP[t].itemsize // n
    ra = c.reader(a, t, ins)
    ws = [c.writer(x, "b" + str(8 * part), ins) for x in d.items]
    def unpack(ctx, idx):
      v = np.asarray(ra(ctx, idx)).view(UINT[NP[t].itemsize]).astype(np.uint64)
      for i, wi in enumerate(ws): wi(ctx, idx, ((v >> np.uint64(8 * part * i)) & np.uint64((1 << (8 * part)) - 1)).astype(UINT[part]))
    return unpack
  w = c.writer(d, t, ins)
  if isinstance(a, Vec):      # pack: mov.b64 %rd, {lo, hi}
    n = len(a.items)
    part = NP[t].itemsize // n
    rs = [c.reader(x, "b" + str(8 * part), ins) for x in a.items]
    def pack(ctx, idx):
      v = np.uint64(0)
      for i, ri in enumerate(rs): v = v | (np.asarray(ri(ctx, idx)).astype(np.uint64) << np.uint64(8 * part * i))
      w(ctx, idx, np.asarray(v).astype(UINT[NP[t].itemsize]).view(NP[t]))
    return pack
  ra = c.reader(a, t, ins)
  return lambda ctx, idx: w(ctx, idx, ra(ctx, idx))


def _float_to_float(x, st: str, dt_: str, ins: Instr, c: Compiler):
  """cvt between float types (x already read as st; f16 as float16, bf16 as bits)."""
  mode = _rnd(ins, None)
  irnd = next((m for m in ins.mods if m in IROUND), None)
  if st == "bf16": x = F.bf16_bits_to_f32(x)
  elif st == "f16": x = np.asarray(x).astype(np.float32)
  x = np.asarray(x)
  if ins.has("ftz") and x.dtype == np.float32: x = F.ftz(x)
  if irnd:   # round to an integral value in the source type
    x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[irnd](x).astype(x.dtype)
  size_s, size_d = TYPE_SIZE[st], TYPE_SIZE[dt_]
  narrowing = size_d < size_s or (st, dt_) in (("f16", "bf16"), ("bf16", "f16"))
  if narrowing and mode is None and not irnd: raise c.unsupported(ins, "narrowing float conversion needs a rounding mode")
  mode = mode or "rn"
  if dt_ == "f64": out = x.astype(np.float64)
  elif dt_ == "f32": out = F.to_f32_from_f64(x.astype(np.float64), mode) if x.dtype == np.float64 else x.astype(np.float32)
  elif dt_ == "f16": out = F.to_f16_bits(x, mode).view(np.float16)
  else: out = F.to_bf16_bits(x, mode)
  return out


def _sat_float(v, t: str, ins: Instr):
  if ins.has("relu"):
    f = _half_in(t, v) if t in ("f16", "bf16") else np.asarray(v)
    keep = (f >= 0) | np.isnan(f)
    zero = np.zeros((), v.dtype)
    canon = {"f16": F.F16_NAN, "bf16": F.BF16_NAN}.get(t)
    out = np.where(keep, v, zero)
    if canon is not None: out = np.where(np.isnan(f), np.asarray(canon).view(v.dtype), out)
    return out.astype(v.dtype)
  if not ins.has("sat"): return v
  if t in ("f16", "bf16"):
    f = _half_in(t, v)
    r = np.where(np.isnan(f), np.float32(0), np.clip(f, 0, 1)).astype(np.float32)
    return F.to_bf16_bits(r) if t == "bf16" else r.astype(np.float16)
  return np.where(np.isnan(v), v.dtype.type(0), np.clip(v, v.dtype.type(0), v.dtype.type(1))).astype(v.dtype)


def _float_to_int(x, st: str, dt_: str, ins: Instr, c: Compiler):
  """PTX: float -> int saturates to the destination range; NaN gives 0."""
  irnd = next((m for m in ins.mods if m in IROUND), None)
  if irnd is None: raise c.unsupported(ins, "float-to-integer cvt needs .rni/.rzi/.rmi/.rpi")
  if st == "bf16": x = F.bf16_bits_to_f32(x)
  x = np.asarray(x).astype(np.float64)                 # exact for every source type
  if ins.has("ftz") and st == "f32": x = F.ftz(x.astype(np.float32)).astype(np.float64)
  r = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[irnd](x)
  d = NP[dt_]
  lo, hi = (-(2.0 ** (8 * d.itemsize - 1)), 2.0 ** (8 * d.itemsize - 1)) if is_signed(dt_) else (0.0, 2.0 ** (8 * d.itemsize))
  nan = np.isnan(r)
  over, under = r >= hi, r < lo
  inside = np.where(nan | over | under, 0.0, r)
  if d.itemsize == 8 and not is_signed(dt_):
    big = inside >= 2.0 ** 63                          # float64 -> uint64 through int64 and an offset
    v = np.where(big, (inside - 2.0 ** 63).astype(np.int64).view(np.uint64) + np.uint64(1 << 63),
                 inside.astype(np.int64).view(np.uint64))
  else:
    v = inside.astype(np.int64).astype(d)
  maxv, minv = np.iinfo(d).max, np.iinfo(d).min
  return np.where(over, d.type(maxv), np.where(under, d.type(minv), v)).astype(d)


def _int_to_float(x, st: str, dt_: str, ins: Instr, c: Compiler):
  mode = _rnd(ins, None)
  if mode is None: raise c.unsupported(ins, "integer-to-float cvt needs a rounding mode")
  x = np.asarray(x)
  wide_src = TYPE_SIZE[st] == 8
  if dt_ == "f64":
    if not wide_src or mode == "rn": return x.astype(np.float64)
    return _int_to_float_exact(x, np.float64, mode)
  if dt_ == "f32":
    if not wide_src: return F.to_f32_from_f64(x.astype(np.float64), mode)
    if mode == "rn": return x.astype(np.float32)
    return _int_to_float_exact(x, np.float32, mode)
  # 16-bit float targets: |x| >= 2^53 overflows them anyway, so the float64 value rounds correctly
  x64 = x.astype(np.float64)
  if wide_src: x64 = np.where(np.abs(x64) >= 2.0 ** 53, np.copysign(1e300, x64), x64)
  return F.to_f16_bits(x64, mode).view(np.float16) if dt_ == "f16" else F.to_bf16_bits(x64, mode)


def _int_to_float_exact(x, dtype, mode: str):
  """64-bit integers to float with a directed rounding mode, element by element (rare)."""
  out = x.astype(dtype).reshape(-1)
  for i, v in enumerate(x.reshape(-1).tolist()):
    r = out[i]
    exact, approx = int(v), int(r) if np.isfinite(r) else None
    if approx is None or approx == exact: continue
    too_far = {"rz": abs(approx) > abs(exact), "rm": approx > exact, "rp": approx < exact}[mode]
    if too_far: out[i] = np.nextafter(r, {"rz": dtype(0), "rm": dtype(-np.inf), "rp": dtype(np.inf)}[mode])
  return out.reshape(x.shape)


def _int_to_int(x, st: str, dt_: str, sat: bool):
  d = NP[dt_]
  x = np.asarray(x)
  if not sat: return x.astype(d)                       # wraps / extends by the source's signedness
  if st == "u64" or dt_ == "u64":
    if st == "u64":
      return np.minimum(x, np.uint64(np.iinfo(d).max)).astype(d)
    return np.maximum(x, 0).astype(d)
  info = np.iinfo(d)
  return np.clip(x.astype(np.int64), info.min, info.max).astype(d)


def h_cvt(c: Compiler, ins: Instr):
  if len(ins.types) != 2: raise c.unsupported(ins, "cvt takes a destination and a source type")
  dt_, st = ins.types
  for t in (dt_, st):
    if t in ("f16x2", "bf16x2", "b128", "tf32", "pred"): raise c.unsupported(ins)
  d, a = _operands(c, ins, 2)
  ra, w = c.reader(a, st, ins), c.writer(d, dt_, ins)
  sat = ins.has("sat")
  mode, irnd = _rnd(ins, None), next((m for m in ins.mods if m in IROUND), None)
  if is_float(st) and is_float(dt_):
    narrowing = TYPE_SIZE[dt_] < TYPE_SIZE[st] or {st, dt_} == {"f16", "bf16"}
    if narrowing and mode is None and irnd is None: raise c.unsupported(ins, "a narrowing float cvt needs .rn/.rz/.rm/.rp")
  elif is_float(st) and irnd is None: raise c.unsupported(ins, "float-to-integer cvt needs .rni/.rzi/.rmi/.rpi")
  elif is_float(dt_) and mode is None: raise c.unsupported(ins, "integer-to-float cvt needs .rn/.rz/.rm/.rp")
  if is_float(st) and is_float(dt_):
    return lambda ctx, idx: w(ctx, idx, _sat_float(np.asarray(_float_to_float(ra(ctx, idx), st, dt_, ins, c)), dt_, ins))
  if is_float(st): return lambda ctx, idx: w(ctx, idx, _float_to_int(ra(ctx, idx), st, dt_, ins, c))
  if is_float(dt_):
    return lambda ctx, idx: w(ctx, idx, _sat_float(np.asarray(_int_to_float(ra(ctx, idx), st, dt_, ins, c)), dt_, ins))
  return lambda ctx, idx: w(ctx, idx, _int_to_int(ra(ctx, idx), st, dt_, sat))


def h_cvta(c: Compiler, ins: Instr):
  t = _type(c, ins, ("u32", "u64"))
  d, a = _operands(c, ins, 2)
  to = ins.has("to")
  space = next((m for m in ins.mods if m in ("global", "local", "shared", "const", "param")), None)
  if space is None: raise c.unsupported(ins)
  window = {"global": 0, "const": 0, "param": 0, "local": LOCAL_WINDOW, "shared": SHARED_WINDOW}[space]
  delta = np.uint64((-window if to else window) & M64)
  ra, w = c.reader(a, "u64", ins), c.writer(d, t, ins)
  if t == "u32":
    return lambda ctx, idx: w(ctx, idx, (np.asarray(ra(ctx, idx)) + delta).astype(np.uint32))
  if window == 0: return lambda ctx, idx: w(ctx, idx, np.array(ra(ctx, idx), np.uint64))
  return lambda ctx, idx: w(ctx, idx, np.asarray(ra(ctx, idx)) + delta)


# =================================== memory ===================================
_SPACES = ("global", "local", "shared", "param", "const")


def _mem_op_types(c: Compiler, ins: Instr):
  t = _type(c, ins)
  space = next((m for m in ins.mods if m in _SPACES), "generic")
  if space == "const": raise c.unsupported(ins, "constant banks")
  vec = next((int(m[1:]) for m in ins.mods if m in ("v2", "v4", "v8")), 1)
  return t, space, vec


def h_ld(c: Compiler, ins: Instr):
  t, space, vec = _mem_op_types(c, ins)
  d, a = _operands(c, ins, 2)
  if not isinstance(a, Mem): raise PtxError(f"line {ins.line}: ld needs a memory operand ({ins.text})")
  dsts = d.items if isinstance(d, Vec) else (d,)
  if len(dsts) != vec: raise PtxError(f"line {ins.line}: {vec} destinations expected ({ins.text})")
  ws = [c.writer(x, t, ins) for x in dsts]
  addr = c.address(a, ins)
  size = TYPE_SIZE[t]
  nbytes = size * vec
  dt = NP[t]
  def fn(ctx, idx):
    raw = ctx.load(space, addr(ctx, idx), idx, nbytes)       # (count, nbytes) uint8
    vals = np.ascontiguousarray(raw).reshape(-1).view(dt)
    if vec == 1: ws[0](ctx, idx, vals)
    else:
      vals = vals.reshape(-1, vec)
      for i, wi in enumerate(ws): wi(ctx, idx, vals[:, i].copy())
  return fn


def h_st(c: Compiler, ins: Instr):
  t, space, vec = _mem_op_types(c, ins)
  if space == "param": raise c.unsupported(ins, "st.param")
  a, v = _operands(c, ins, 2)
  if not isinstance(a, Mem): raise PtxError(f"line {ins.line}: st needs a memory operand ({ins.text})")
  srcs = v.items if isinstance(v, Vec) else (v,)
  if len(srcs) != vec: raise PtxError(f"line {ins.line}: {vec} sources expected ({ins.text})")
  rs = [c.reader(x, t, ins) for x in srcs]
  addr = c.address(a, ins)
  size = TYPE_SIZE[t]
  def fn(ctx, idx):
    n = ctx.count(idx)
    cols = [np.broadcast_to(np.asarray(r(ctx, idx), NP[t]), (n,)) for r in rs]
    data = np.stack(cols, axis=1) if vec > 1 else np.ascontiguousarray(cols[0])
    ctx.store(space, addr(ctx, idx), idx, np.ascontiguousarray(data).view(np.uint8).reshape(n, size * vec), size * vec)
  return fn


# =================================== warp-level matrix multiply-accumulate ===================================
# PTX ISA 8.x, "Warp-level matrix multiply-accumulate instructions: mma" and "Matrix Fragments for mma.m16n8k16 with
# floating point type". With groupID = %laneid >> 2 and threadID_in_group = %laneid % 4, the elements a0..a7 (four
# .f16x2 / .bf16x2 registers, "low to high": a0 in bits 0-15 of the first register, a1 in bits 16-31, ...), b0..b3
# (two registers) and c0..c3 / d0..d3 (four .f32 registers) of a thread sit at
#   A (16x16): row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
#              col = (threadID_in_group * 2) + (i & 0x1) for i < 4, (threadID_in_group * 2) + (i & 0x1) + 8 for i >= 4
#   B (16x8):  row = (threadID_in_group * 2) + (i & 0x1) for bi where i < 2, ... + 8 for i >= 2;  col = groupID
#   C, D (16x8): row = groupID for ci where i < 2, groupID + 8 for i >= 2;  col = (threadID_in_group * 2) + (i & 0x1)
def _fragment(count: int, row, col):
  """(32, count) row and column of element i of each lane, from the document's formulas row(g, t, i), col(g, t, i)."""
  lane = np.arange(32)[:, None]
  g, t, i = lane >> 2, lane % 4, np.arange(count)[None, :]
  return np.broadcast_to(row(g, t, i), (32, count)), np.broadcast_to(col(g, t, i), (32, count))


_MMA_A = _fragment(8, lambda g, t, i: np.where((i < 2) | ((4 <= i) & (i < 6)), g, g + 8),
                   lambda g, t, i: t * 2 + (i & 1) + np.where(i >= 4, 8, 0))
_MMA_B = _fragment(4, lambda g, t, i: t * 2 + (i & 1) + np.where(i >= 2, 8, 0), lambda g, t, i: g + 0 * i)
_MMA_C = _fragment(4, lambda g, t, i: np.where(i < 2, g, g + 8), lambda g, t, i: t * 2 + (i & 1))


def _halves_to_f64(bits, t: str):
  """uint16 bits of .f16 / .bf16 elements as exact float64 values."""
  if t == "f16": return bits.view(np.float16).astype(np.float64)
  return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _whole_warps(ctx, idx, c: Compiler, ins: Instr) -> int:
  """The number of warps executing: every warp in `idx` must be there with all 32 threads (`.aligned`: "all threads
  in the warp must execute the same mma instruction"; anything else is undefined behavior on the GPU)."""
  rows = ctx.rows(idx)
  lane = ctx.sregs["laneid"][rows]
  warps_per_block = int(ctx.sregs["nwarpid"])
  warp = ctx.block_row[rows] * warps_per_block + ctx.sregs["warpid"][rows]
  if len(rows) % 32 == 0:
    lw, ww = lane.reshape(-1, 32), warp.reshape(-1, 32)
    if (lw == np.arange(32)).all() and (ww == ww[:, :1]).all(): return len(rows) // 32
  uniq, counts = np.unique(warp, return_counts=True)
  bad = int(uniq[np.argmax(counts != 32)])
  mine = rows[warp == bad]
  lanes = [int(x) for x in lane[warp == bad]]
  shown = ", ".join(map(str, lanes[:12])) + (", ..." if len(lanes) > 12 else "")
  block = tuple(int(ctx.sregs[f"ctaid.{a}"][mine[0]]) for a in "xyz")
  tpb = int(ctx.sregs["ntid.x"]) * int(ctx.sregs["ntid.y"]) * int(ctx.sregs["ntid.z"])
  if tpb % 32 and bad % warps_per_block == warps_per_block - 1:
    why = f"the block has {tpb} threads, not a multiple of 32, so its last warp is partial"
  else: why = "a guard, a divergent branch or exited threads left the others out"
  raise PtxWarpError(f"kernel {c.entry.name}: line {ins.line}: `{ins.text}` is .sync.aligned: all 32 threads of a warp "
                     f"must execute it together (PTX ISA, mma), but warp {bad % warps_per_block} of block {block} "
                     f"executes it with {len(lanes)} of 32 threads (lanes {shown}): {why}")


def h_mma(c: Compiler, ins: Instr):
  """mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, c: D = A * B + C per warp, every
  element the exact sum of its 16 products and C rounded once to float32, nearest even (rdna3_float.matrix_sum:
  NVIDIA documents no accumulation order or precision; this is the exact one)."""
  mods = ins.mods
  forms = [("sync", "aligned", "m16n8k16", "row", "col", "f32", t, t, "f32") for t in ("f16", "bf16")]
  if mods not in forms:
    raise c.unsupported(ins, "the interpreter runs mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 and "
                             "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
  t = mods[6]
  d, a, b, cc = _operands(c, ins, 4)
  for op, n, what in ((d, 4, "d"), (a, 4, "a"), (b, 2, "b"), (cc, 4, "c")):
    if not isinstance(op, Vec) or len(op.items) != n:
      raise PtxError(f"line {ins.line}: mma.m16n8k16 operand {what} is a vector of {n} registers ({ins.text})")
  ra = [c.reader(x, "b32", ins) for x in a.items]
  rb = [c.reader(x, "b32", ins) for x in b.items]
  rc = [c.reader(x, "f32", ins) for x in cc.items]
  wd = [c.writer(x, "f32", ins) for x in d.items]

  def regs(ctx, idx, readers, nw, dtype):
    n = 32 * nw
    cols = [np.broadcast_to(np.asarray(r(ctx, idx)), (n,)) for r in readers]
    return np.stack(cols, axis=1).astype(dtype).reshape(nw, 32, -1)

  def fn(ctx, idx):
    nw = _whole_warps(ctx, idx, c, ins)
    halves_a = np.ascontiguousarray(regs(ctx, idx, ra, nw, np.uint32)).view(np.uint16)     # (warp, lane, a0..a7)
    halves_b = np.ascontiguousarray(regs(ctx, idx, rb, nw, np.uint32)).view(np.uint16)     # (warp, lane, b0..b3)
    am, bm, cm = np.zeros((nw, 16, 16)), np.zeros((nw, 16, 8)), np.zeros((nw, 16, 8))
    am[:, _MMA_A[0], _MMA_A[1]] = _halves_to_f64(halves_a, t)
    bm[:, _MMA_B[0], _MMA_B[1]] = _halves_to_f64(halves_b, t)
    cm[:, _MMA_C[0], _MMA_C[1]] = regs(ctx, idx, rc, nw, np.float32)
    terms = np.empty((17, nw, 16, 8))                                                     # (k, warp, row, col)
    np.multiply(np.moveaxis(am, 2, 0)[:, :, :, None], np.moveaxis(bm, 1, 0)[:, :, None, :], out=terms[:16])   # exact
    terms[16] = cm
    dm = round_matrix_sum(matrix_sum(terms), "f32")
    out = dm[:, _MMA_C[0], _MMA_C[1]].reshape(32 * nw, 4)
    for i, w in enumerate(wd): w(ctx, idx, out[:, i].copy())
  return fn


HANDLERS = {
  "add": h_addsub, "sub": h_addsub, "mul": h_mul, "mad": h_mad, "fma": h_fma, "div": h_divrem, "rem": h_divrem,
  "min": h_minmax, "max": h_minmax, "abs": h_absneg, "neg": h_absneg,
  "and": h_logic, "or": h_logic, "xor": h_logic, "not": h_logic, "cnot": h_logic,
  "shl": h_shift, "shr": h_shift, "popc": h_bits, "clz": h_bits, "brev": h_bits, "bfe": h_bits, "bfi": h_bits,
  "setp": h_setp, "selp": h_selp, "testp": h_testp,
  "rcp": h_funary, "sqrt": h_funary, "rsqrt": h_funary, "ex2": h_funary, "lg2": h_funary, "sin": h_funary,
  "cos": h_funary, "tanh": h_funary,
  "mov": h_mov, "cvt": h_cvt, "cvta": h_cvta, "ld": h_ld, "ldu": h_ld, "st": h_st, "mma": h_mma,
}
