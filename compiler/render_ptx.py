"""Render a linearized kernel to PTX for the NV device (then `drivers.nv.cubin` turns it into a cubin).

Calling convention: `.visible .entry name(.param .u64 data0, ..., .param .s64 var0, ...)`: the buffer
addresses in PARAM order, then the DEFINE_VAR values sorted by name (as the C renderer's `args[]`).
Each thread computes one element of the global loops: codegen's `to_threads` replaced them by the SPECIAL
"gidx" = ctaid.x * ntid.x + tid.x and gated the stores of threads past the end.

What PTX lacks was lowered before (compiler/lower.py, keyed by `native_ops`): the ops left map to one instruction
each (`FLOAT_OPS`, `INT_OPS`, `BOOL_OPS`). Registers by dtype: bool -> .pred; int8..uint32 -> .b32 holding the
value sign/zero-extended from its width (a conversion to a narrow type re-extends); float16/bfloat16 -> their 16
storage bits in a .b32; int64, uint64, index -> .b64; float32 -> .f32; float64 -> .f64. Float arithmetic uses
explicit `.rn` rounding so ptxas never contracts a mul and an add into an fma (PTX ISA, "mul/add: ... with an
explicit rounding modifier are not contracted"); rcp, sqrt and div are IEEE correctly rounded like C's operators.
Syntax and instruction forms follow NVIDIA's "PTX ISA 8.0" reference and were checked with ptxas 13.0.
"""
from __future__ import annotations
import struct
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes
from .lower import Native
from .linearize import positions, read_between

# register class per value kind: declaration type and name prefix
REG_CLASSES = {"pred": ("pred", "%p"), "b16": ("b16", "%h"), "b32": ("b32", "%r"), "b64": ("b64", "%rd"),
               "f32": ("f32", "%f"), "f64": ("f64", "%fd")}
# SPECIAL thread indices: name -> PTX special registers (all .u32)
SPECIALS = {"gidx": ("%ctaid.x", "%ntid.x", "%tid.x"), "lidx": ("%tid.x",), "bidx": ("%ctaid.x",),
            "gid0": ("%ctaid.x",), "gid1": ("%ctaid.y",), "gid2": ("%ctaid.z",),
            "lid0": ("%tid.x",), "lid1": ("%tid.y",), "lid2": ("%tid.z",)}
# one instruction per op: {t} f32/f64; {i} s32/u32/s64/u64 (signedness and width); {s} s32/s64; {b} b32/b64
FLOAT_OPS = {Ops.ADD: "add.rn.{t}", Ops.MUL: "mul.rn.{t}", Ops.FDIV: "div.rn.{t}", Ops.NEG: "neg.{t}",
             Ops.RECIP: "rcp.rn.{t}", Ops.SQRT: "sqrt.rn.{t}", Ops.TRUNC: "cvt.rzi.{t}.{t}",
             Ops.FLOOR: "cvt.rmi.{t}.{t}",
             Ops.CMPLT: "setp.lt.{t}", Ops.CMPNE: "setp.neu.{t}"}     # lt is false and neu true on NaN, as C's < and !=
INT_OPS = {Ops.ADD: "add.{i}", Ops.MUL: "mul.lo.{i}", Ops.MAX: "max.{i}", Ops.IDIV: "div.{i}", Ops.MOD: "rem.{i}",
           Ops.NEG: "neg.{s}", Ops.XOR: "xor.{b}", Ops.OR: "or.{b}", Ops.AND: "and.{b}", Ops.SHL: "shl.{b}",
           Ops.SHR: "shr.{i}", Ops.CMPLT: "setp.lt.{i}", Ops.CMPNE: "setp.ne.{b}"}
BOOL_OPS = {Ops.AND: "and.pred", Ops.OR: "or.pred", Ops.XOR: "xor.pred"}


def reg_class(dt: DType) -> str:
  if dt.is_bool: return "pred"
  if dt == dtypes.float64: return "f64"
  if dt == dtypes.float32: return "f32"
  return "b64" if dt.itemsize == 8 else "b32"


def int_type(dt: DType) -> str:
  """PTX integer type an (int or index) value is computed in: its signedness at register width."""
  return ("u" if dt.is_unsigned else "s") + ("64" if dt.itemsize == 8 else "32")


def float_type(dt: DType) -> str: return "f64" if dt == dtypes.float64 else "f32"
def bits_type(dt: DType) -> str: return "b64" if dt.itemsize == 8 and not dt.is_bool else "b32"
def mov_type(dt: DType) -> str:
  return "pred" if dt.is_bool else float_type(dt) if reg_class(dt) in ("f32", "f64") else bits_type(dt)
def f32_literal(value: float) -> str: return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]
def f64_literal(value: float) -> str: return "0d%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def int_literal(value: int, dt: DType) -> str:
  """The register bits of an integer constant, in hex (a sub-32-bit value sign/zero-extended to 32 bits)."""
  width = 64 if dt.itemsize == 8 else 32
  return "0x%X" % (int(value) & ((1 << width) - 1))


# a value converted to a narrow type is re-extended from its width (16-bit floats are bits: zero-extended)
NARROW = {dtypes.int8: "s32.s8", dtypes.uint8: "u32.u8", dtypes.int16: "s32.s16", dtypes.uint16: "u32.u16",
          dtypes.float16: "u32.u16", dtypes.bfloat16: "u32.u16"}
# global memory access type per dtype (a narrow load extends to 32 bits by its type)
MEM_TYPE = {dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16", dtypes.int32: "s32",
            dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64", dtypes.index: "s64", dtypes.float16: "u16",
            dtypes.bfloat16: "u16", dtypes.float32: "f32", dtypes.float64: "f64"}


class _Kernel:
  """The state of one render: registers, names of values, emitted lines."""

  def __init__(self):
    self.counts = {cls: 0 for cls in REG_CLASSES}
    self.lines: list[str] = []
    self.names: dict[UOp, str] = {}
    self.labels = 0
    self.addresses: dict[tuple, str] = {}    # (base, index register, size) -> address register (registers are unique)
    self.wmma: dict[tuple, list] = {}        # (config, sources) -> the registers of D
    self.packed: dict[tuple, str] = {}       # (lo, hi) 16-bit values -> the .b32 register holding both

  def reg(self, cls: str) -> str:
    n = self.counts[cls]; self.counts[cls] += 1
    return f"{REG_CLASSES[cls][1]}{n}"

  def emit(self, text: str): self.lines.append("  " + text)

  def op(self, cls: str, text: str, dest: str | None = None) -> str:
    """Emit `text` with a new destination register of class `cls` (`{d}` in text; `dest`: that register instead) and
    return the register."""
    d = dest or self.reg(cls)
    self.emit(text.format(d=d))
    return d

  def declarations(self) -> list[str]:
    return [f"  .reg .{REG_CLASSES[c][0]} {REG_CLASSES[c][1]}<{n}>;" for c, n in self.counts.items() if n]

  def label(self) -> str:
    self.labels += 1
    return f"$L{self.labels}"

  def narrow(self, r: str, dt: DType) -> str:
    if dt in NARROW: self.emit(f"cvt.{NARROW[dt]} {r}, {r};")
    return r

  def alu(self, u: UOp, srcs: list[str], dest: str | None = None) -> str:
    op, dt = u.op, u.src[-1].dtype          # the operands' dtype (a comparison gives a predicate)
    if op is Ops.WHERE: return self.where(*srcs, dt)
    if dt.is_bool: instr = BOOL_OPS[op]
    elif dt.is_float: instr = FLOAT_OPS[op].format(t=float_type(dt))
    else:
      w = "64" if dt.itemsize == 8 else "32"
      instr = INT_OPS[op].format(i=int_type(dt), s="s" + w, b=bits_type(dt))
      if op in (Ops.SHL, Ops.SHR) and w == "64":   # the amount is a .u32
        srcs[1] = self.op("b32", f"cvt.u32.u64 {{d}}, {srcs[1]};")
    return self.op("pred" if op in (Ops.CMPLT, Ops.CMPNE) else reg_class(u.dtype), f"{instr} {{d}}, {', '.join(srcs)};", dest)

  def where(self, c: str, a: str, b: str, dt: DType) -> str:
    if dt.is_bool:   # a predicate has no selp: (c & a) | (!c & b)
      t = self.op("pred", f"and.pred {{d}}, {c}, {a};")
      nc = self.op("pred", f"not.pred {{d}}, {c};")
      f = self.op("pred", f"and.pred {{d}}, {nc}, {b};")
      return self.op("pred", f"or.pred {{d}}, {t}, {f};")
    return self.op(reg_class(dt), f"selp.{mov_type(dt)} {{d}}, {a}, {b}, {c};")

  # ---- conversions (bool and 16-bit float conversions were lowered to compares, selects and bit operations) ----
  def cast(self, x: str, src: DType, dst: DType) -> str:
    cls = reg_class(dst)
    if src == dtypes.float16 and dst == dtypes.float32:   # the 16 bits of a .b32 register -> cvt.f32.f16 (sm_53+)
      h = self.op("b16", f"cvt.u16.u32 {{d}}, {x};")
      return self.op("f32", f"cvt.f32.f16 {{d}}, {h};")
    if src == dtypes.float32 and dst == dtypes.float16:   # round to nearest even, the bits zero-extended
      h = self.op("b16", f"cvt.rn.f16.f32 {{d}}, {x};")
      return self.op("b32", f"cvt.u32.u16 {{d}}, {h};")
    if src.is_float and dst.is_float:
      if float_type(src) == float_type(dst): return self.op(cls, f"mov.{float_type(dst)} {{d}}, {x};")
      return self.op(cls, f"cvt.f64.f32 {{d}}, {x};" if dst == dtypes.float64 else f"cvt.rn.f32.f64 {{d}}, {x};")
    if src.is_float: return self.op(cls, f"cvt.rzi.{int_type(dst)}.{float_type(src)} {{d}}, {x};")   # toward zero
    if dst.is_float: return self.op(cls, f"cvt.rn.{float_type(dst)}.{int_type(src)} {{d}}, {x};")    # to nearest
    if src.itemsize == 8 and dst.itemsize == 8: return self.op(cls, f"mov.b64 {{d}}, {x};")
    if dst.itemsize == 8: return self.op(cls, f"cvt.{int_type(dst)[0]}64.{int_type(src)} {{d}}, {x};")
    if src.itemsize == 8: return self.narrow(self.op(cls, f"cvt.u32.u64 {{d}}, {x};"), dst)
    return self.narrow(self.op(cls, f"mov.b32 {{d}}, {x};"), dst)

  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.itemsize != dst.itemsize:
      raise NotImplementedError(f"PTX renderer: BITCAST {src.name} -> {dst.name} changes the size")
    return self.narrow(self.op(reg_class(dst), f"mov.{bits_type(dst)} {{d}}, {x};"), dst)

  # ---- memory (space: "global", or "shared" for a DEFINE_LOCAL's workgroup memory) ----
  def load(self, addr: str, dt: DType, gate: str | None, space: str = "global") -> str:
    """A gated load does not touch memory when the gate is false and gives 0 (C: `valid ? p[i] : 0`)."""
    d = self.reg(reg_class(dt))
    zero = {"f32": f32_literal(0.0), "f64": f64_literal(0.0)}.get(reg_class(dt), "0")
    if gate: self.emit(f"mov.{mov_type(dt)} {d}, {zero};")
    self.emit(f"{'@' + gate + ' ' if gate else ''}ld.{space}.{MEM_TYPE[dt]} {d}, [{addr}];")
    return d

  def store(self, addr: str, value: str, dt: DType, gate: str | None, space: str = "global"):
    self.emit(f"{'@' + gate + ' ' if gate else ''}st.{space}.{MEM_TYPE[dt]} [{addr}], {value};")


class PTXRenderer:
  device = "NV"
  threads = True                          # codegen maps the global loops to thread ids (SPECIALs)
  workgroups = True                       # and optimizes them with the GPU opts (compiler/gpu.py)
  tensor_cores = True                     # renders WMMA ops (compiler/tc.py) as mma.sync
  # exp2/log2/sin are decomposed (ex2/lg2/sin.approx are not accurate enough), so are NaN-propagating max and fmod;
  # 16-bit floats and the 8/16-bit integers are emulated in 32 bits
  native_ops = Native(float_ops=frozenset({Ops.FLOOR, Ops.FDIV}),
                      dtypes=frozenset(dtypes.all()) - {dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.uint8,
                                                        dtypes.int16, dtypes.uint16},
                      float16_casts=frozenset({dtypes.float16}))

  def __init__(self, arch: str = "sm_90", version: str = "8.0"):
    self.arch, self.version = arch, version

  def header(self) -> str:
    """The module directives; a module may hold several entries (`header() + render_entry(...) + ...`)."""
    return f".version {self.version}\n.target {self.arch}\n.address_size 64\n"

  @staticmethod
  def with_launch_bounds(src: str, local_size) -> str:
    """The module with `.maxntid` on its entry (PTX ISA "Performance-tuning directives"): ptxas then keeps the
    registers per thread within what a block of that many threads fits in the 64K register file, and a launch with
    more threads is refused."""
    x, y, z = (tuple(local_size) + (1, 1, 1))[:3]
    head, sep, rest = src.partition(")\n{")
    return f"{head})\n.maxntid {x}, {y}, {z}\n{{{rest}" if sep else src

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
      return k.names[u]

    def space(idx: UOp) -> str: return "shared" if idx.src[0].op is Ops.DEFINE_LOCAL else "global"
    inplace, fused, offsets = self.peepholes(program)
    vectors = self.vector_accesses(program, offsets)
    wmma_accs, pairs = self.wmma_plan(program, inplace, offsets)
    loops: dict[UOp, tuple[str, str]] = {}
    for u in program:
      op = u.op
      if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.PARAM, Ops.SINK, Ops.REDUCE): continue
      if op is Ops.SPECIAL: k.names[u] = self.special(k, u)
      elif op is Ops.RANGE:   # a 64-bit counter, or a 32-bit one for a narrowed kernel (compiler/gpu.py)
        w = "64" if u.dtype.itemsize == 8 else "32"
        size = val(u.src[0]) if u.src[0].dtype.itemsize == u.dtype.itemsize else self.as_index(k, val(u.src[0]), u.src[0].dtype)
        counter = k.op("b" + w, f"mov.b{w} {{d}}, 0;")
        top = k.label(); end = top + "_end"
        k.lines.append(f"{top}:")
        if not (u.src[0].op is Ops.CONST and u.src[0].arg > 0):   # a loop that may run 0 times tests at the top
          done = k.op("pred", f"setp.ge.s{w} {{d}}, {counter}, {size};")
          k.emit(f"@{done} bra {end};")
        loops[u], k.names[u] = (top, end, size), counter
      elif op is Ops.ENDRANGE:
        counter, (top, end, size) = k.names[u.src[0]], loops[u.src[0]]
        w = "64" if u.src[0].dtype.itemsize == 8 else "32"
        k.emit(f"add.s{w} {counter}, {counter}, 1;")
        if u.src[0].src[0].op is Ops.CONST and u.src[0].src[0].arg > 0:
          more = k.op("pred", f"setp.lt.s{w} {{d}}, {counter}, {size};")
          k.emit(f"@{more} bra {top};")
        else: k.emit(f"bra {top};")
        k.lines.append(f"{end}:")
      elif op is Ops.DEFINE_ACC:
        if u.src: raise NotImplementedError("PTX renderer: lane accumulators (compiler/gpu.py expands UPCAST lanes)")
        init = self.constant(k, identity_for(u.arg[0], u.dtype), u.dtype)
        k.names[u] = k.op(reg_class(u.dtype), f"mov.{mov_type(u.dtype)} {{d}}, {init};")
      elif op is Ops.ACC_UPDATE:   # acc = the accumulate step computed before (unless it was computed into acc)
        if val(u.src[1]) != k.names[u.src[0]]: k.emit(f"mov.{mov_type(u.dtype)} {k.names[u.src[0]]}, {val(u.src[1])};")
      elif op is Ops.INDEX:
        i, off = u.src[1], 0
        if i in offsets: i, off = offsets[i]
        addr = self.address(k, val(u.src[0]), val(i), i.dtype, u.src[0].dtype)
        k.names[u] = f"{addr}+{off * u.src[0].dtype.itemsize}" if off else addr
      elif u in fused or u in offsets or u in pairs: continue      # rendered by the one op that uses it
      elif op is Ops.WMMA: self.wmma(k, u, val, wmma_accs, pairs)
      elif u in inplace and inplace[u] in wmma_accs.get("done", ()): k.names[u] = k.names[inplace[u]]  # the mma wrote it
      elif u in inplace:
        acc = k.names[inplace[u]]
        other = u.src[1] if u.src[0] is inplace[u] else u.src[0]
        if other in fused:   # acc + a * b as one fma, rounded once (a sum of products: what BLAS computes)
          k.emit(f"fma.rn.{float_type(u.dtype)} {acc}, {val(other.src[0])}, {val(other.src[1])}, {acc};")
          k.names[u] = acc
        else: k.names[u] = k.alu(u, [val(s) for s in u.src], dest=acc)
      elif op in (Ops.LOAD, Ops.STORE) and u in vectors:
        group = vectors[u]
        if group is None: continue     # accessed by its group's first load / last store
        x, off = offsets.get(group[0].src[0].src[1], (group[0].src[0].src[1], 0))   # the lowest address
        dt = u.dtype if op is Ops.LOAD else u.src[1].dtype
        addr = self.address(k, val(u.src[0].src[0]), val(x), x.dtype, dt)
        at = f"{addr}+{off * dt.itemsize}" if off else addr
        if op is Ops.LOAD and len(group) == 8:   # 8 16-bit elements: 4 words, each split into its two halves
          words = [k.reg("b32") for _ in range(4)]
          k.emit(f"ld.{space(u.src[0])}.v4.b32 {{{', '.join(words)}}}, [{at}];")
          for i, w in enumerate(words):
            k.names[group[2 * i]] = k.op("b32", f"and.b32 {{d}}, {w}, 0xFFFF;")
            k.names[group[2 * i + 1]] = k.op("b32", f"shr.u32 {{d}}, {w}, 16;")
        elif op is Ops.LOAD:
          regs = [k.reg(reg_class(dt)) for _ in group]
          k.emit(f"ld.{space(u.src[0])}.v4.{MEM_TYPE[dt]} {{{', '.join(regs)}}}, [{at}];")
          for ld, r in zip(group, regs): k.names[ld] = r
        elif len(group) == 8:      # two 16-bit values a word: the odd one's low 16 bits inserted above the even one's
          vals = [val(st.src[1]) for st in group]
          words = [k.op("b32", f"bfi.b32 {{d}}, {vals[2 * i + 1]}, {vals[2 * i]}, 16, 16;") for i in range(4)]
          k.emit(f"st.{space(u.src[0])}.v4.b32 [{at}], {{{', '.join(words)}}};")
        else: k.emit(f"st.{space(u.src[0])}.v4.{MEM_TYPE[dt]} [{at}], {{{', '.join(val(st.src[1]) for st in group)}}};")
      elif op is Ops.LOAD:
        idx = u.src[0]
        k.names[u] = k.load(val(idx), u.dtype, val(idx.src[2]) if len(idx.src) == 3 else None, space(idx))
      elif op is Ops.STORE:
        idx = u.src[0]
        k.store(val(idx), val(u.src[1]), u.src[1].dtype, val(idx.src[2]) if len(idx.src) == 3 else None, space(idx))
      elif op is Ops.DEFINE_LOCAL:   # workgroup memory: a .shared array of the entry (PTX ISA 5.1.5, state spaces)
        array = f"smem{u.arg[0]}"
        k.lines.insert(0, f"  .shared .align 16 .b8 {array}[{max(1, u.arg[1] * u.dtype.itemsize)}];")
        k.names[u] = k.op("b64", f"mov.u64 {{d}}, {array};")
      elif op is Ops.BARRIER: k.emit("bar.sync 0;")   # every thread of the CTA, and its shared-memory writes
      elif op is Ops.CAST: k.names[u] = k.cast(val(u.src[0]), u.src[0].dtype, u.dtype)
      elif op is Ops.BITCAST: k.names[u] = k.bitcast(val(u.src[0]), u.src[0].dtype, u.dtype)
      else: k.names[u] = k.alu(u, [val(s) for s in u.src])
    head = [f".visible .entry {name}(", ",\n".join("  " + p for p in params), ")", "{"]
    return "\n".join(head + k.declarations() + k.lines + ["  ret;", "}"]) + "\n"

  @staticmethod
  def peepholes(program: list[UOp]) -> tuple[dict, set, dict]:
    """(inplace, fused, offsets): an accumulate step used only by its ACC_UPDATE is computed into the accumulator
    (inplace: step -> DEFINE_ACC); in a float sum, a product used only by that step is fused into one fma (fused);
    an index `x + c` (c >= 0 constant) used only by INDEXes becomes the address of x plus an immediate offset, so
    loads of neighbouring elements share one address register (offsets: index -> (x, c))."""
    users: dict[UOp, set] = {}
    for u in dict.fromkeys(program):
      for s in u.src: users.setdefault(s, set()).add(u)
    inplace, fused, offsets, where = {}, set(), {}, positions(program)
    simple = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64)
    for u in dict.fromkeys(program):
      if u.op is Ops.ACC_UPDATE and u.arg is None:
        acc, new = u.src
        if new.op in (Ops.ADD, Ops.MUL, Ops.MAX) and acc in new.src and new.dtype in simple and users[new] == {u} and \
           not read_between(where, users, acc, new, u):
          inplace[new] = acc
          other = new.src[1] if new.src[0] is acc else new.src[0]
          if new.op is Ops.ADD and new.dtype.is_float and other.op is Ops.MUL and users[other] == {new}:
            fused.add(other)
      if u.op is Ops.INDEX and (i := u.src[1]).op is Ops.ADD and i.src[1].op is Ops.CONST and 0 < i.src[1].arg < (1 << 24):
        if all(x.op is Ops.INDEX and x.src[1] is i and i not in x.src[2:] for x in users[i]): offsets[i] = (i.src[0], i.src[1].arg)
    return inplace, fused, offsets

  # ---- tensor cores (compiler/tc.py): mma.sync.aligned.m16n8k16 (PTX ISA 9.7.13.4) ----
  @staticmethod
  def wmma_plan(program: list[UOp], inplace: dict, offsets: dict) -> tuple[dict, dict]:
    """(accs, pairs). accs: {(config, sources): accumulators} for a WMMA whose every output is only added into its
    own accumulator (the mma reads and writes them: D = A @ B + acc), plus "done": those accumulators. pairs: the
    16-bit loads of neighbouring elements x, x + 1 (x even, so 4-byte aligned: buffers are) that only WMMAs read, as
    {first: second, second: None}: one 32-bit load of the pair packed as the mma wants it."""
    from .symbolic import linear
    users: dict = {}
    for u in dict.fromkeys(program):
      for s in u.src: users.setdefault(s, set()).add(u)
    groups: dict = {}
    for u in dict.fromkeys(program):
      if u.op is Ops.WMMA: groups.setdefault((u.arg[0], u.src), {})[u.arg[1]] = u
    accs: dict = {"done": set()}
    for key, outs in groups.items():
      steps = [next(iter(users.get(o, ())), None) if len(users.get(o, ())) == 1 else None for _, o in sorted(outs.items())]
      if all(s is not None and s in inplace and s.op is Ops.ADD for s in steps):
        accs[key] = [inplace[s] for s in steps]
        accs["done"].update(accs[key])
    pairs: dict = {}
    for (name, src), _ in groups.items():
      for lo, hi in zip(src[0::2], src[1::2]):
        if lo.op is not Ops.LOAD or hi.op is not Ops.LOAD or len(lo.src[0].src) != 2 or len(hi.src[0].src) != 2: continue
        if lo.src[0].src[0] is not hi.src[0].src[0] or lo.src[0].src[0].op is not Ops.PARAM: continue
        if not all(x.op is Ops.WMMA for v in (lo, hi) for x in users.get(v, ())): continue
        (tl, cl), (th, ch) = linear(lo.src[0].src[1]), linear(hi.src[0].src[1])
        if tl == th and ch == cl + 1 and cl % 2 == 0 and all(v % 2 == 0 for v in tl.values()) and lo not in pairs:
          pairs[lo], pairs[hi] = hi, None
    return accs, pairs

  def wmma(self, k: _Kernel, u: UOp, val, accs: dict, pairs: dict):
    """The mma of u's group at its first output; every output of the group names its register."""
    from .tc import BY_NAME
    key = (u.arg[0], u.src)
    if key in k.wmma:
      k.names[u] = k.wmma[key][u.arg[1]]; return
    tc = BY_NAME[u.arg[0]]
    def packed(lo: UOp, hi: UOp) -> str:
      if (lo, hi) in k.packed: return k.packed[(lo, hi)]
      k.packed[(lo, hi)] = r = _packed(lo, hi)
      return r
    def _packed(lo: UOp, hi: UOp) -> str:
      if pairs.get(lo) is hi:   # one 32-bit load: element lo in the low half (little endian), as the mma packs them
        return k.op("b32", f"ld.global.b32 {{d}}, [{val(lo.src[0])}];")
      return k.op("b32", f"mad.lo.u32 {{d}}, {val(hi)}, 65536, {val(lo)};")    # (hi << 16) | lo, lo is 16 bits
    a = [packed(x, y) for x, y in zip(u.src[:tc.n_a:2], u.src[1:tc.n_a:2])]
    b = [packed(x, y) for x, y in zip(u.src[tc.n_a:tc.n_a + tc.n_b:2], u.src[tc.n_a + 1:tc.n_a + tc.n_b:2])]
    if key in accs: c = d = [k.names[acc] for acc in accs[key]]
    else:
      c = [val(x) for x in u.src[tc.n_a + tc.n_b:]]
      d = [k.reg("f32") for _ in range(tc.n_c)]
    t = "bf16" if tc.dtype_in == dtypes.bfloat16 else "f16"
    k.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{', '.join(d)}}}, {{{', '.join(a)}}}, "
           f"{{{', '.join(b)}}}, {{{', '.join(c)}}};")
    k.wmma[key] = d
    k.names[u] = d[u.arg[1]]

  @staticmethod
  def vector_accesses(program: list[UOp], offsets: dict) -> dict:
    """Ungated 4-byte accesses of one buffer at x + c .. x + c + 3 (c a multiple of 4, x one of 4 by its linear form,
    so 16-byte aligned: .shared arrays are declared so, and every buffer a kernel gets is: allocations are page
    aligned, JIT arena offsets 64-byte aligned) become one ld/st .v4 (PTX ISA: ld/st, "vector ... .v4", aligned to the
    vector size). Loads with no store, barrier or loop boundary between them go at the first one; stores with no load,
    barrier or loop boundary between them at the last one (every value is computed by then). Eight 16-bit elements at
    a multiple of 8 become one .v4.b32 access (16 bytes, two elements a word).
    {the access that emits: the four (or eight) in order, each other one: None}."""
    from .symbolic import linear
    out: dict = {}
    order = {u: i for i, u in enumerate(program)}
    def flush(window, pick):
      by_x: dict = {}
      for acc in window:
        x, c = offsets.get(acc.src[0].src[1], (acc.src[0].src[1], 0))
        by_x.setdefault((acc.src[0].src[0], x), {}).setdefault(c, acc)
      for (_, x), accs in by_x.items():
        terms, const = linear(x)
        # 16-bit elements go 8 to a 16-byte access where the index allows (ld/st .v4.b32, two elements a word)
        wide = 8 if _access_type(next(iter(accs.values()))).itemsize == 2 else 4
        for n in sorted({wide, 4}, reverse=True):
          if const % n or any(v % n for v in terms.values()): continue
          for c in sorted(accs):
            if c % n == 0 and all(c + i in accs and accs[c + i] not in out for i in range(n)):
              group = [accs[c + i] for i in range(n)]
              out.update({g: None for g in group}); out[pick(group, key=order.__getitem__)] = group
    def _access_type(u): return u.dtype if u.op is Ops.LOAD else u.src[1].dtype
    def ok(u, dt): return len(u.src[0].src) == 2 and dt in (dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.float16, dtypes.bfloat16)
    # a store ends the window of loads of its own buffer only (and a load that of stores to its buffer): accesses of
    # different buffers may pass each other (an elementwise kernel's lanes: load a, load b, store c, ... become one
    # vector load of a, one of b, one vector store of c)
    def buf(u): return u.src[0].src[0]
    loads, stores = [], []
    for u in program:
      if u.op in (Ops.BARRIER, Ops.RANGE, Ops.ENDRANGE):
        flush(loads, min); flush(stores, max); loads, stores = [], []
      elif u.op is Ops.STORE:
        if any(buf(ld) is buf(u) for ld in loads):
          flush(loads, min); loads = []
        if ok(u, u.src[1].dtype): stores.append(u)
      elif u.op is Ops.LOAD:
        if any(buf(st) is buf(u) for st in stores):
          flush(stores, max); stores = []
        if ok(u, u.dtype): loads.append(u)
    flush(loads, min); flush(stores, max)
    return out

  @staticmethod
  def constant(k: _Kernel, value, dt: DType) -> str:
    if dt.is_bool: return k.op("pred", f"setp.ne.b32 {{d}}, {1 if value else 0}, 0;")
    if dt == dtypes.float64: return k.op("f64", f"mov.f64 {{d}}, {f64_literal(value)};")
    if dt == dtypes.float32: return k.op("f32", f"mov.f32 {{d}}, {f32_literal(value)};")
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
    key = (base, idx, elem.itemsize)
    if key in k.addresses: return k.addresses[key]
    if idx_dt.itemsize == 4:   # a 32-bit index: base + idx * size in one mad.wide (32 x 32 -> 64 bits, plus base)
      out = k.op("b64", f"mad.wide.{int_type(idx_dt)} {{d}}, {idx}, {elem.itemsize}, {base};")
      k.addresses[key] = out
      return out
    x = self.as_index(k, idx, idx_dt)
    if elem.itemsize == 1: out = k.op("b64", f"add.s64 {{d}}, {base}, {x};")
    else: out = k.op("b64", f"mad.lo.s64 {{d}}, {x}, {elem.itemsize}, {base};")     # base + idx * size
    k.addresses[key] = out
    return out
