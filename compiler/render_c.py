"""Render a linearized kernel to freestanding C for the CPU device.

Calling convention: `void name(const unsigned long long *args)`; args[i] are buffer addresses in PARAM
order, then the DEFINE_VAR values sorted by name. What C lacks was lowered before (compiler/lower.py): the ops
left map to C operators one to one (`OPS`), float16/bfloat16 are their `unsigned short` storage bits here.
"""
from __future__ import annotations
import math
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes
from .lower import Native


def ctype(dt: DType) -> str:
  """The C type a value of `dt` is computed in."""
  return "_Bool" if dt.is_bool else dt.ctype


def literal(value, dt: DType) -> str:
  if dt.is_bool: return "1" if value else "0"
  if dt.is_int:
    if dt.is_unsigned: return f"{value}ULL" if dt.itemsize == 8 else f"{value}u"
    if value == dt.min: return f"({value + 1}LL-1)" if dt.itemsize == 8 else f"({value + 1}-1)"
    return f"{value}LL" if dt.itemsize == 8 else str(value)
  suffix = "" if dt == dtypes.float64 else "f"
  if math.isnan(value): return f"__builtin_nan{suffix}(\"\")"
  if math.isinf(value): return f"({'-' if value < 0 else ''}__builtin_inf{suffix}())"
  return f"{float(value).hex()}{suffix}"


# op -> C expression of its operands {0} {1} {2}; {f} is the float32 suffix of a builtin
OPS = {Ops.NEG: "(-{0})", Ops.RECIP: "(1.0{f}/{0})", Ops.SQRT: "__builtin_sqrt{f}({0})",
       Ops.TRUNC: "__builtin_trunc{f}({0})",
       Ops.FLOOR: "__builtin_floor{f}({0})",
       Ops.ADD: "({0}+{1})", Ops.MUL: "({0}*{1})", Ops.FDIV: "({0}/{1})", Ops.MAX: "({0}>{1}?{0}:{1})",
       Ops.IDIV: "({0}/{1})", Ops.MOD: "({0}%{1})", Ops.CMPLT: "({0}<{1})", Ops.CMPNE: "({0}!={1})",
       Ops.XOR: "({0}^{1})", Ops.OR: "({0}|{1})", Ops.AND: "({0}&{1})", Ops.SHL: "({0}<<{1})", Ops.SHR: "({0}>>{1})",
       Ops.WHERE: "({0}?{1}:{2})"}
FLOAT_OPS = {Ops.MOD: "__builtin_fmod{f}({0},{1})"}   # where a float op is spelled differently


def alu(op: Ops, dt: DType, *srcs: str) -> str:
  template = FLOAT_OPS.get(op, OPS[op]) if dt.is_float else OPS[op]
  return template.format(*srcs, f="" if dt == dtypes.float64 else "f")


def _bitcast(a: str, src: DType, dst: DType) -> str:
  # a union reinterprets the bits (GNU C defines this) without the stack temporaries a memcpy takes, which gcc is
  # slow to clean up in kernels with thousands of bitcasts
  if src.ctype == dst.ctype: return a
  return f"(({ctype(dst)})((union {{ {src.ctype} from; {dst.ctype} to; }}){{ .from = {a} }}).to)"


VEC_DTYPES = (dtypes.float32, dtypes.float64)
VEC_OPS = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIP, Ops.FDIV, Ops.MAX, Ops.WHERE, Ops.TRUNC, Ops.FLOOR}
# integer lanes a vector block may hold besides its float ones (and 16-bit floats as their storage bits): loaded,
# combined with integer ops, converted to the float lanes (a quantized weight's bytes, a float16 weight's bits)
INT_VEC_DTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                  dtypes.uint64, dtypes.float16, dtypes.bfloat16)
INT_VEC_OPS = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
# bool values in a vector block are masks: signed integer vectors as wide as the float lanes, all ones where true
# (what a vector comparison gives in GNU C, gcc and clang alike); a select is bitwise and/or through them
MASK_OPS = {Ops.CMPLT, Ops.CMPNE, Ops.XOR, Ops.OR, Ops.AND}


def vector_type(dt: DType, n: int) -> str:
  if dt in VEC_DTYPES: return f"bg_{'f32' if dt == dtypes.float32 else 'f64'}x{n}"
  return f"bg_{'u' if dt.is_unsigned or not dt.is_int else 'i'}{8 * dt.itemsize}x{n}"   # (16-bit floats: their bits)


def mask_type(dt: DType, n: int) -> str:
  return f"bg_i{8 * dt.itemsize}x{n}"


def vector_renderable(op: Ops, dtype: DType, src_dtypes) -> bool:
  """Whether a value computed by `op` (of `dtype` from operands of `src_dtypes`) can be one vector op per lane block:
  float arithmetic, comparisons and bool logic (masks), selects, bool -> float casts. compiler/opt.py asks this too,
  before it gives a kernel wide register tiles."""
  if op in INT_VEC_OPS and dtype in _INT_LANES: return all(d in _INT_LANES for d in src_dtypes)   # (and, or, xor too)
  if op in (Ops.CMPLT, Ops.CMPNE) and src_dtypes and src_dtypes[0] in _INT_LANES:
    # integer lanes compared: a mask as wide as the integers (callers check it is as wide as the float lanes)
    return dtype.is_bool and all(d == src_dtypes[0] for d in src_dtypes)
  if op in MASK_OPS: return dtype.is_bool and all(d.is_bool or d in VEC_DTYPES for d in src_dtypes)
  if op is Ops.CAST:
    if all(d.is_bool for d in src_dtypes): return dtype in VEC_DTYPES
    # conversions between integer lanes, integers to floats, and a native float16 -> float32 (compiler/lower.py
    # leaves that CAST only where the CPU converts them itself: F16C)
    src = src_dtypes[0]
    if src == dtypes.float16: return dtype == dtypes.float32
    if src == dtypes.bfloat16: return dtype == dtypes.float32     # (lowered to integer lanes shifted into place)
    # float -> a signed integer as wide (C's truncating conversion, lane by lane: exp2's exponent, a floor)
    if src in VEC_DTYPES: return dtype in (dtypes.int32, dtypes.int64) and dtype.itemsize == src.itemsize
    return src in _INT_LANES and (dtype in VEC_DTYPES or dtype in _INT_LANES)
  if op is Ops.BITCAST:
    src = src_dtypes[0]
    return src.itemsize == dtype.itemsize and all(d in VEC_DTYPES or d in INT_VEC_DTYPES for d in (src, dtype))
  if op in INT_VEC_OPS and dtype in _INT_LANES: return all(d in _INT_LANES for d in src_dtypes)
  # EXP2/LOG2 of float lanes: compiler/lower.py decomposes them (the C target has no such instruction) into float
  # arithmetic, FLOOR, float<->int conversions and bit operations, each renderable here (tests/test_render_c.py
  # checks the decompositions); the optimizer asks before they are decomposed
  if op in (Ops.EXP2, Ops.LOG2): return dtype in VEC_DTYPES and all(d == dtype for d in src_dtypes)
  if op is Ops.WHERE:   # (integer lanes: a condition the same for every lane picks a whole vector; callers check)
    return (dtype in VEC_DTYPES or dtype in _INT_LANES) and src_dtypes[0].is_bool
  return op in VEC_OPS and dtype in VEC_DTYPES


_INT_LANES = INT_VEC_DTYPES[:8]


# Non-temporal stores: a kernel without reductions that writes at least this much streams its vector stores past the
# caches (x86 MOVNTPS/MOVNTPD: Intel SDM vol. 2B, "MOVNTPS"; they need an address aligned to the vector, checked
# at run time, and an SFENCE before the kernel returns). Such an output is too big to be read back from cache by
# the next kernel anyway, and the store skips the read for ownership of each line (1/4 of a streaming add's
# traffic). 16 MiB: more than the L2 of a few cores.
NT_STORE_BYTES = 16 << 20
_MASK_CTYPE = {4: "int", 8: "long long"}
# gcc's builtins behind _mm512_stream_ps/_pd, _mm256_stream_ps/_pd, _mm_stream_ps/_pd (its avx512fintrin.h,
# avxintrin.h, xmmintrin.h, emmintrin.h) and the ISA each needs; clang has one generic builtin
_GCC_STREAM = {(4, 64): ("__AVX512F__", "__builtin_ia32_movntps512", "float"),
               (8, 64): ("__AVX512F__", "__builtin_ia32_movntpd512", "double"),
               (4, 32): ("__AVX__", "__builtin_ia32_movntps256", "float"), (8, 32): ("__AVX__", "__builtin_ia32_movntpd256", "double"),
               (4, 16): ("__SSE__", "__builtin_ia32_movntps", "float"), (8, 16): ("__SSE2__", "__builtin_ia32_movntpd", "double")}
_STREAM_DEFS = """typedef {ct} {name}_t __attribute__((vector_size({bytes}), aligned({bytes})));
#if defined(__x86_64__) && defined(__clang__)
#define {name}(p, v) __builtin_nontemporal_store((v), ({name}_t *)(p))
#elif defined(__x86_64__) && defined({isa})
#define {name}(p, v) {builtin}(({elt} *)(p), (v))
#else
#define {name}(p, v) (*({vt} *)(p) = (v))
#endif"""


def _streaming_bytes(program: list[UOp]) -> int:
  """Bytes a kernel without reductions stores (every loop encloses its stores), or 0: the case for streaming."""
  total = 0
  for u in program:
    if u.op is Ops.DEFINE_ACC or (u.op is Ops.RANGE and u.src[0].op is not Ops.CONST): return 0
  iters = math.prod(u.src[0].arg for u in program if u.op is Ops.RANGE)
  iters *= math.prod(u.arg[1] for u in program if u.op is Ops.SPECIAL)
  for u in program:
    if u.op is Ops.STORE: total += iters * u.src[1].dtype.itemsize
  return total


# Software prefetch of a streamed matrix in a reduction along its rows (a matrix-vector product's weights: each step
# reads 64 bytes of a row, the lanes summed across at the end): the load runs PREFETCH_BYTES ahead of itself.
# A hardware prefetcher alone keeps too few lines in flight: an f16 8192 x 4096 matrix-vector product on 2 cores of a
# Zen 1 EPYC, 17.7 -> 22 GB/s (512 to 2048 bytes ahead do the same; prefetcht0 20.6). Locality 0 (prefetchnta):
# the row is read once. A prefetch never faults, past the end of a buffer included.
PREFETCH_BYTES = 1024


def _prefetch_loads(program: list[UOp], vloops: dict[int, UOp]) -> dict[UOp, list[UOp]]:
  """Vector loads to prefetch: in a vector block whose lanes are summed (no store is indexed by them), the innermost
  loop around the block that is not a lane loop is a reduce loop the load walks by >= 32 bytes a step, and the load's
  index also depends on some other range or the core (a row of a matrix, not the vector shared by the rows).
  Returns {load: the unrolled lane loops between its reduce loop and it where the prefetch runs only at 0}."""
  stored = {r for u in program if u.op is Ops.STORE for r in u.src[0].toposort() if r.op is Ops.RANGE}
  out: dict[UOp, list[UOp]] = {}
  stack: list[UOp] = []
  for u in program:
    if u.op is Ops.RANGE: stack.append(u)
    elif u.op is Ops.ENDRANGE and stack and stack[-1] is u.src[0]: stack.pop()
    elif u.op is Ops.LOAD and stack and stack[-1] in vloops.values() and stack[-1] not in stored:
      inner = [r for r in stack[:-1] if r.arg[1] not in ("upcast", "unroll")]
      if not inner or inner[-1].arg[1] != "reduce": continue
      red = inner[-1]
      lanes = stack[stack.index(red) + 1:-1]
      idx = u.src[0]
      terms, _ = index_linear(idx.src[1])
      step = abs(terms.get(red, 0)) * u.dtype.itemsize
      if step < 32 or red.src[0].op is not Ops.CONST or red.src[0].arg * step < 512: continue   # (rows of >= 512 bytes)
      others = {x for t in terms if t is not red and t not in lanes and t is not stack[-1] for x in t.toposort()}
      if any(x.op is Ops.SPECIAL or (x.op is Ops.RANGE and x not in lanes and x is not red) for x in others):
        # lanes that step within the reduce loop's stretch (an unrolled split of the same axis) share one prefetch;
        # others (several rows of the matrix) each prefetch their own
        out[u] = [r for r in lanes if abs(terms.get(r, 0)) * r.src[0].arg <= abs(terms[red])]
  return out


def _stream_macro(dt: DType, n: int) -> str | None:
  return f"bg_stream_{vector_type(dt, n)[3:]}" if (dt.itemsize, n * dt.itemsize) in _GCC_STREAM else None


def _lane_aligned(idx: UOp, lane: UOp) -> bool:
  """Whether lane 0 of this vector store is a multiple of the lanes from the buffer's start (every other term of
  its index steps by whole vectors)."""
  n = lane.src[0].arg
  terms, const = index_linear(idx.src[1])
  return const % n == 0 and terms.get(lane) == 1 and all(c % n == 0 for t, c in terms.items() if t is not lane)


def index_linear(u: UOp) -> tuple[dict[UOp, int], int]:
  """The linear form of an index (symbolic.linear) with (x // c) * c + x % c folded back into x (symbolic.fold_div_mod;
  a packed matmul's output read as (n, m) leaves that pair in its indices, hiding their unit stride from the lanes)."""
  from .symbolic import linear, fold_div_mod
  return fold_div_mod(*linear(u))


def lane_step(value: UOp, lane: UOp) -> int | None:
  """How much an index value grows per step of the lane range `lane` when it is linear in it (value = lane 0's value
  + step * lane), else None (the lane inside a division or a remainder). A CAST of such a value to integer lanes is
  rendered as lane 0's value plus step times (0, 1, ..., n-1): a causal mask compares the key's position with the
  query's."""
  terms, _ = index_linear(value)
  step = terms.get(lane)
  if step is None or any(t is not lane and lane in t.toposort() for t in terms): return None
  return step


def flat_lane_index(names: dict, lanes) -> str:
  """The row-major index into an accumulator array of its lane ranges (`lanes`, outermost first; `names`: each
  range's variable name): r0*n1*n2 + r1*n2 + r2. Shared with render_msl."""
  idx, stride = [], 1
  for r in reversed(lanes):
    idx.append(f"{names[r]}*{stride}" if stride != 1 else names[r]); stride *= r.src[0].arg
  return "+".join(reversed(idx))


def _body_end(program: list[UOp], i: int) -> int:
  r = program[i]
  return next(j for j in range(i + 1, len(program)) if program[j].op is Ops.ENDRANGE and program[j].src[0] is r)


def vector_loops(program: list[UOp], alias: dict[UOp, UOp]) -> tuple[dict[int, UOp], dict[UOp, int], dict[int, DType]]:
  """Innermost upcast lane loops whose body runs as one vector op per value: loads and stores walk the lane
  with stride 1 (or not at all: a scalar broadcast), the values are float arithmetic, comparisons, bool logic and
  selects of one float dtype (`vector_renderable`), and accumulators keep this lane innermost. Returns ({position of
  the RANGE in program: its range}, {accumulator updated in such a loop: its vector lanes}, {position: the float
  dtype of its lanes})."""
  loops, reads, updates, dts = _vector_candidates(program, alias)
  while True:
    vacc = {acc: r.src[0].arg for i, r in loops.items() for acc in updates[i]}
    # a loop reading a lane-dependent accumulator as a vector needs that accumulator in vector layout
    keep = {i: r for i, r in loops.items() if reads[i] <= set(vacc)}
    if keep == loops: return loops, vacc, {i: dts[i] for i in loops}
    loops = keep


def _lane_cast(u: UOp) -> bool:
  """A CAST of an index value to 32- or 64-bit integer lanes (see lane_step)."""
  return u.op is Ops.CAST and u.src[0].dtype == dtypes.index and u.dtype in (dtypes.int32, dtypes.int64)


def _vector_candidates(program: list[UOp], alias: dict[UOp, UOp]):
  """The loops that qualify on their own, with the accumulators each reads (lane-dependent) and updates."""
  out: dict[int, UOp] = {}
  reads: dict[int, set] = {}
  updates: dict[int, list] = {}
  lane_dtype: dict[int, DType] = {}
  for i, r in enumerate(program):
    if r.op is not Ops.RANGE or r.arg[1] != "upcast" or r.src[0].op is not Ops.CONST: continue
    n = r.src[0].arg
    if n < 2 or n & (n - 1): continue
    j = _body_end(program, i)
    body = program[i + 1:j]
    if any(u.op in (Ops.RANGE, Ops.DEFINE_ACC) for u in body): continue
    memo: dict[UOp, bool] = {r: True}

    def dep(u: UOp) -> bool:
      u = alias.get(u, u)
      if u not in memo:
        memo[u] = r in u.src if u.op is Ops.DEFINE_ACC else any(dep(s) for s in u.src)
      return memo[u]

    def contiguous(idx: UOp) -> bool:
      # (a gate that is the same for every lane gates the whole vector: a padded region, one half of a stack)
      if len(idx.src) == 3 and dep(idx.src[2]): return False
      terms, _ = index_linear(idx.src[1])
      return terms.get(r) == 1 and not any(t is not r and r in t.toposort() for t in terms)

    loaded: dict[UOp, bool] = {}

    def data(u: UOp) -> bool:     # a value computed from memory (not index arithmetic)
      if u not in loaded: loaded[u] = u.op is Ops.LOAD or any(data(s) for s in u.src if s.op is not Ops.INDEX)
      return loaded[u]

    users: dict[UOp, list[UOp]] = {}
    for u in body:
      for s in u.src: users.setdefault(s, []).append(u)
    ok, dts, int_selects = True, set(), set()
    lane_ints: set[UOp] = set()     # integer lanes computed from positions (lane casts)
    for u in body:
      if not dep(u): continue
      if u.op is Ops.INDEX: ok = contiguous(u)
      elif any(alias.get(x, x) in lane_ints for x in u.src):
        ok = vector_renderable(u.op, u.dtype, [x.dtype for x in u.src])
        if u.dtype in _INT_LANES: lane_ints.add(u)
        elif u.op in (Ops.CMPLT, Ops.CMPNE): int_selects.add(u.src[0].dtype.itemsize)
      elif (u.dtype is not None and u.dtype in (dtypes.index, dtypes.int64, dtypes.int32) and u.op in (Ops.ADD, Ops.MUL)
            and not data(u)):
        # index arithmetic: rendered for lane 0, used to address vector loads/stores (or cast to integer lanes)
        ok = all(v.op in (Ops.ADD, Ops.MUL) and v.dtype == u.dtype or v.op is Ops.INDEX and v.src[1] is u or
                 _lane_cast(v) for v in users.get(u, []))
      elif _lane_cast(u):
        # a position as integer lanes (lane 0's plus the step times the lane); compared, a mask as wide as they are
        ok = lane_step(u.src[0], r) is not None
        lane_ints.add(u)
      elif u.op is Ops.LOAD:
        ok = (u.dtype in VEC_DTYPES or u.dtype in INT_VEC_DTYPES) and u.src[0].src[0].dtype == u.dtype
        if u.dtype in VEC_DTYPES: dts.add(u.dtype)
      elif u.op in VEC_OPS | MASK_OPS | INT_VEC_OPS | {Ops.CAST, Ops.BITCAST}:
        ok = vector_renderable(u.op, u.dtype, [s.dtype for s in u.src])
        # integer lanes chosen lane by lane, or compared: a mask select or a mask as wide as the float lanes (checked
        # below)
        if u.op is Ops.WHERE and u.dtype in _INT_LANES and dep(u.src[0]): int_selects.add(u.dtype.itemsize)
        if u.op in (Ops.CMPLT, Ops.CMPNE) and u.src[0].dtype in _INT_LANES: int_selects.add(u.src[0].dtype.itemsize)
        dts.update(d for d in [u.dtype, *(s.dtype for s in u.src)] if d in VEC_DTYPES)
      elif u.op is Ops.ACC_UPDATE:   # acc = acc op x (the step itself is ops of the body)
        acc = u.src[0]
        ok = acc.arg[0] in (Ops.ADD, Ops.MUL, Ops.MAX) and bool(acc.src) and acc.src[-1] is r and u.dtype in VEC_DTYPES
        dts.add(u.dtype)
      elif u.op is Ops.STORE:
        ok = dep(u.src[0]) and u.src[1].dtype in VEC_DTYPES and u.src[0].src[0].dtype == u.src[1].dtype
        dts.add(u.src[1].dtype)
      else: ok = False
      # a reduce read through its accumulator: vector only when this lane is the accumulator's innermost
      ok = ok and all(s not in alias or not dep(s) or alias[s].src[-1] is r for s in u.src)
      if not ok: break
    if ok and len(dts) == 1 and int_selects <= {next(iter(dts)).itemsize}:
      out[i] = r
      reads[i] = {alias[s] for u in body for s in u.src if s in alias and dep(s)}
      updates[i] = [u.src[0] for u in body if u.op is Ops.ACC_UPDATE]
      lane_dtype[i] = dts.pop()
  return out, reads, updates, lane_dtype


# Function attributes (gcc; clang has no optimize attribute: the CPU driver drops its SLP pass for huge kernels):
# - a kernel of more than HUGE_KERNEL_STATEMENTS statements (a fused expression of hundreds of exp/sin/log/sqrt terms)
#   is compiled without the gcc passes that grow faster than linearly there (PRE, points-to, loop splitting and
#   if-conversion). gcc 12 -O3, 500-term chains: sin 4.5 s -> 1.9 s, exp2/sqrt 4.9 s -> 0.8 s, pow 8.7 s -> 5.3 s;
#   runtimes within 1% (one exp2/sqrt chain 10% slower).
# - kernels are compiled with -ffp-contract=off (a*b+c rounds twice, as numpy); one whose float reduction sums
#   products (matmul, conv: acc + a*b) fuses multiply-adds, as BLAS does (clang: its fp pragma).
HUGE_KERNEL_STATEMENTS = 2048


def kernel_attributes(program: list[UOp], alias: dict, statements: int) -> tuple[str, str]:
  """(text before the function, first line of its body)."""
  def product(u): return alias.get(u, u).op is Ops.MUL
  fused = any(u.op is Ops.ACC_UPDATE and u.dtype.is_float and (product(u.src[1]) if u.arg is Ops.ADD else u.arg is None
              and alias.get(u.src[1], u.src[1]).op is Ops.ADD and any(map(product, alias.get(u.src[1], u.src[1]).src)))
              for u in program)
  gcc = (("no-tree-pre", "no-tree-pta", "no-split-loops", "no-tree-loop-if-convert")
         if statements > HUGE_KERNEL_STATEMENTS else ()) + (("fp-contract=fast",) if fused else ())
  before = f'#if defined(__GNUC__) && !defined(__clang__)\n__attribute__((optimize({", ".join(map(repr, gcc))})))\n#endif\n'
  return before.replace("'", '"') if gcc else "", "#ifdef __clang__\n#pragma clang fp contract(fast)\n#endif" if fused else ""


class _NativeC:
  """CRenderer.native_ops, worked out at first use (it asks the C compiler for F16C's builtins): exp2/log2/sin are
  decomposed (freestanding: no libm); float16/bfloat16 are computed in float32, float16 converted with the
  hardware's instructions where there are some (drivers/cpu/cc.py), else by bit operations."""
  value = None

  def __get__(self, obj, owner) -> Native:
    if _NativeC.value is None:
      from baregrad.drivers.cpu.cc import supports_float16
      _NativeC.value = Native(float_ops=frozenset({Ops.FLOOR, Ops.MOD, Ops.FDIV}),
                              dtypes=frozenset(dtypes.all()) - {dtypes.float16, dtypes.bfloat16},
                              float16_casts=frozenset({dtypes.float16}) if supports_float16() else frozenset())
    return _NativeC.value


# a float16 value's bits (its C storage, unsigned short) <-> float32 with x86 F16C's VCVTPH2PS / VCVTPS2PH (the
# rounding immediate 4: MXCSR's mode, round to nearest even), through gcc's and clang's builtins for them
_HALF_TO_FLOAT = "__builtin_ia32_vcvtph2ps((bg_hs8){{(short)({0}), 0, 0, 0, 0, 0, 0, 0}})[0]"
_FLOAT_TO_HALF = "((unsigned short)__builtin_ia32_vcvtps2ph((bg_fs4){{({0}), 0, 0, 0}}, 4)[0])"
_HALF_TYPES = {"bg_hs8": "typedef short bg_hs8 __attribute__((vector_size(16), may_alias));",
               "bg_fs4": "typedef float bg_fs4 __attribute__((vector_size(16), may_alias));"}


class CRenderer:
  device = "CPU"
  native_ops = _NativeC()

  def render(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> str:
    names: dict[UOp, str] = {}
    lines: list[str] = []
    indent = 1
    params: dict[int, DType] = {}
    for u in program:
      if u.op is Ops.PARAM: params[u.arg] = u.dtype
    head = [f"void {name}(const unsigned long long *restrict args, long long core) {{"]
    for i in range(n_params):
      dt = params.get(i, dtypes.uint8)
      const = "" if i == 0 else "const "
      head.append(f"  {const}{dt.ctype} *restrict data{i} = ({const}{dt.ctype} *)args[{i}];")
    for j, v in enumerate(variables):
      head.append(f"  const long long {v.arg[0]} = (long long)args[{n_params + j}];")
      names[v] = v.arg[0]
    counter = [0]
    # accumulators updated in a vector loop are arrays of vectors over their other lanes
    vloops, vacc, vdtypes = vector_loops(program, alias)
    vtypes: dict[str, str] = {}
    vec = [None]                 # the lane range rendered as vectors right now
    vdt: list = [None]           # ... and the float dtype of its lanes
    vvals: set[UOp] = set()      # values that are vectors in the current vector block
    nt_total = _streaming_bytes(program)
    prefetch = _prefetch_loads(program, vloops)
    nt_params: dict[str, tuple] = {}   # streamed buffer -> (its run-time alignment flag, the vector's bytes)

    def vtype(dt: DType, n: int) -> str:
      if dt.is_bool: return mtype(n)
      nm = vector_type(dt, n)
      vtypes[nm] = f"typedef {ctype(dt)} {nm} __attribute__((vector_size({n * dt.itemsize}), aligned({dt.itemsize}), may_alias));"
      return nm

    def mtype(n: int) -> str:
      dt = vdt[0]
      nm = mask_type(dt, n)
      vtypes[nm] = f"typedef {_MASK_CTYPE[dt.itemsize]} {nm} __attribute__((vector_size({n * dt.itemsize}), aligned({dt.itemsize}), may_alias));"
      return nm

    def lanes() -> int: return vec[0].src[0].arg

    def as_vector(s: UOp) -> str:    # a float operand as a vector (a scalar broadcast: x - 0 keeps -0.0 and NaN)
      return name_of(s) if is_vec(s) else f"({name_of(s)} - ({vtype(vdt[0], lanes())}){{}})"

    def half_to_float(bits: str) -> str:
      """float16 lanes (their bits) -> float32 lanes with F16C's VCVTPH2PS (8 lanes per instruction; other lane
      counts one lane at a time)."""
      n, f32 = lanes(), vtype(dtypes.float32, lanes())
      vtypes.update(_HALF_TYPES)
      if n == 8: return f"(({f32})__builtin_ia32_vcvtph2ps256((bg_hs8)({bits})))"
      if n % 8 == 0 and (n & (n - 1)) == 0:    # 16, 32, ...: 8 at a time, the parts joined pairwise
        parts = [f"__builtin_ia32_vcvtph2ps256((bg_hs8)__builtin_shufflevector({bits}, {bits}, "
                 f"{', '.join(map(str, range(k, k + 8)))}))" for k in range(0, n, 8)]
        width = 8
        while len(parts) > 1:
          parts = [f"__builtin_shufflevector({parts[i]}, {parts[i + 1]}, {', '.join(map(str, range(2 * width)))})"
                   for i in range(0, len(parts), 2)]
          width *= 2
        return f"(({f32}){parts[0]})"
      return f"(({f32}){{{', '.join(_HALF_TO_FLOAT.format(f'({bits})[{i}]') for i in range(n))}}})"

    def widen_to_int32(x: str, sdt: DType) -> str:
      """8- or 16-bit integer lanes -> 32-bit ones (sign- or zero-extended): gcc scalarizes __builtin_convertvector
      from them, and from a 64-bit vector loads each byte on its own; x86 AVX2's VPMOVSX/VPMOVZX (BD: bytes, WD:
      words) take 8 lanes at a time from a 16-byte vector. clang's convertvector emits those already."""
      n, wide = lanes(), dtypes.uint32 if sdt.is_unsigned else dtypes.int32
      generic = f"__builtin_convertvector((v), {vtype(wide, n)})"
      if n != 8 or sdt.itemsize != 1: return generic.replace("(v)", f"({x})")   # (16-bit lanes convert well)
      macro = f"bg_widen_{vector_type(sdt, n)[3:]}"
      suffix, sign = "bd" if sdt.itemsize == 1 else "wd", "zx" if sdt.is_unsigned else "sx"
      vtypes["bg_qi16"] = "typedef char bg_qi16 __attribute__((vector_size(16), may_alias));"
      vtypes["bg_hi8"] = "typedef short bg_hi8 __attribute__((vector_size(16), may_alias));"
      vtypes["bg_ll2"] = "typedef long long bg_ll2 __attribute__((vector_size(16), may_alias));"
      vtypes["bg_si8"] = "typedef int bg_si8 __attribute__((vector_size(32), may_alias));"
      op = f"__builtin_ia32_pmov{sign}{suffix}256"
      def part(lo: int) -> str:      # lanes lo..lo+7 as a 16-byte vector, widened
        if sdt.itemsize == 1 and n == 8:
          bits = f"((union {{ {vector_type(sdt, n)} v; long long l; }}){{ .v = (v) }}).l"
          return f"{op}((bg_qi16)(bg_ll2){{{bits}, 0}})"
        if sdt.itemsize == 1:     # 16 byte lanes: the vector itself (low 8), or its upper half moved down
          src = "(v)" if lo == 0 else f"__builtin_shufflevector((v), (v), {', '.join(map(str, range(8, 16)))}, " \
                                        f"{', '.join(map(str, range(8)))})"
          return f"{op}((bg_qi16){src})"
        if n == 8: return f"{op}((bg_hi8)(v))"
        return f"{op}((bg_hi8)__builtin_shufflevector((v), (v), {', '.join(map(str, range(lo, lo + 8)))}))"
      fast = f"(({vtype(wide, n)}){part(0)})" if n == 8 else \
        f"(({vtype(wide, n)})__builtin_shufflevector((bg_si8){part(0)}, (bg_si8){part(8)}, {', '.join(map(str, range(16)))}))"
      vtypes[macro] = (f"#if defined(__x86_64__) && defined(__AVX2__) && !defined(__clang__)\n#define {macro}(v) {fast}\n"
                       f"#else\n#define {macro}(v) {generic}\n#endif")
      return f"{macro}({x})"

    def as_lanes(s: UOp) -> str:     # an integer operand as a vector of its own type (a scalar one broadcast)
      if is_vec(s): return name_of(s)
      return f"(({vtype(s.dtype, lanes())}){{}} + ({ctype(s.dtype)}){name_of(s)})"

    def as_mask(s: UOp) -> str:      # a bool operand as a mask (a scalar one broadcast: 0 or all ones)
      if is_vec(s): return name_of(s)
      c = alias.get(s, s)
      if c.op is Ops.CONST: return "-1" if c.arg else "0"
      return f"(-({_MASK_CTYPE[vdt[0].itemsize]}){name_of(s)})"

    def trunc_floor(op: Ops, x: str, dt: DType) -> str:
      """trunc/floor of float lanes with GNU C vector operations (no libm call per lane): a value of magnitude
      below 2**mantissa bits goes through the integer conversion, which truncates; larger ones, infinities and NaN
      are integral (or NaN) already. The sign bit of x is put back (trunc(-0.5) is -0.0, as C's truncf). floor:
      trunc less one where trunc went up (x negative, not integral)."""
      vt, mt, n = vtype(dt, lanes()), mtype(lanes()), lanes()
      big = float(1 << (23 if dt == dtypes.float32 else 52))
      it, sign = vtype(dtypes.int32 if dt == dtypes.float32 else dtypes.int64, n), ("0x80000000" if dt == dtypes.float32
                                                                                    else "0x8000000000000000LL")
      xv = f"t{counter[0]}"; counter[0] += 1
      lines.append("  " * indent + f"const {vt} {xv} = {x};")
      out = f"t{counter[0]}"; counter[0] += 1
      # x86 with AVX: one VROUNDPS/VROUNDPD (imm8 bits 1:0 the rounding: 01 down, 11 toward zero; bit 3 suppresses
      # the precision exception; Intel SDM vol. 2B "ROUNDPS"): IEEE floor/trunc, -0.0, infinities and NaN included
      rnd = {(4, 32): "__builtin_ia32_roundps256", (8, 32): "__builtin_ia32_roundpd256"}.get((dt.itemsize, n * dt.itemsize))
      if rnd:
        lines.extend([f"#if defined(__x86_64__) && defined(__AVX__)", "  " * indent +
                      f"const {vt} {out} = ({vt}){rnd}({xv}, {9 if op is Ops.FLOOR else 11});", "#else"])
      small = f"m{counter[0]}"; counter[0] += 1
      lines.append("  " * indent + f"const {mt} {small} = ({xv} < {literal(big, dt)}) & ({xv} > {literal(-big, dt)});")
      t = f"t{counter[0]}"; counter[0] += 1
      conv = f"__builtin_convertvector(__builtin_convertvector({xv}, {it}), {vt})"
      lines.append("  " * indent + f"const {vt} {t} = (({vt})(((({mt}){conv} & {small}) | (({mt}){xv} & ~{small})) | "
                                   f"(({mt}){xv} & ({mt}){{}} + {sign})));")
      if op is Ops.TRUNC: lines.append("  " * indent + f"const {vt} {out} = {t};")
      else:
        up = f"m{counter[0]}"; counter[0] += 1
        lines.append("  " * indent + f"const {mt} {up} = ({t} > {xv});")
        lines.append("  " * indent + f"const {vt} {out} = ({t} - {select(up, as_vector(UOp.const(dt, 1)), as_vector(UOp.const(dt, 0)))});")
      if rnd: lines.append("#endif")
      return out

    def select(mask: str, a: str, b: str) -> str:
      vt, mt = vtype(vdt[0], lanes()), mtype(lanes())
      return f"(({vt})((({mt}){a} & {mask}) | (({mt}){b} & ~{mask})))"

    def vector_alu(u: UOp) -> str:
      """A value of a vector block with at least one vector operand, as GNU C vector operations."""
      op, src = u.op, u.src
      if op is Ops.WHERE and u.dtype in _INT_LANES:
        vt = vtype(u.dtype, lanes())
        if is_vec(src[0]):           # lane by lane: through the mask (integer lanes as wide as the float ones)
          mt = mtype(lanes())
          return f"(({vt})((({mt})({as_lanes(src[1])}) & {as_mask(src[0])}) | (({mt})({as_lanes(src[2])}) & ~{as_mask(src[0])})))"
        return f"({name_of(src[0])} ? ({vt})({as_lanes(src[1])}) : ({vt})({as_lanes(src[2])}))"   # (a scalar condition)
      if op is Ops.WHERE: return select(as_mask(src[0]), as_vector(src[1]), as_vector(src[2]))
      if op is Ops.CAST and src[0].dtype == dtypes.float16: return half_to_float(name_of(src[0]))
      if op is Ops.CAST and not src[0].dtype.is_bool:
        x, sdt = as_lanes(src[0]), src[0].dtype
        if sdt.itemsize < 4 and (u.dtype.is_float or u.dtype.itemsize == 4):
          x = widen_to_int32(x, sdt)      # (gcc converts narrow integer lanes to float one at a time)
          if u.dtype.itemsize == 4 and not u.dtype.is_float: return f"(({vtype(u.dtype, lanes())}){x})"
          # zero-extended lanes (< 2^16) are exact as signed ones: x86 converts signed int32 to float in one
          # instruction, unsigned (before AVX-512) as two halves, two conversions and a multiply-add (Q4_K's nibbles)
          if u.dtype.is_float and sdt.is_unsigned: x = f"(({vtype(dtypes.int32, lanes())}){x})"
        return f"__builtin_convertvector({x}, {vtype(u.dtype, lanes())})"
      if op is Ops.BITCAST: return f"(({vtype(u.dtype, lanes())}){as_lanes(src[0])})"
      if op in (Ops.TRUNC, Ops.FLOOR): return trunc_floor(op, as_vector(src[0]), u.dtype)
      if op in (Ops.SHL, Ops.SHR) and u.dtype.itemsize == 1 and src[1].op is Ops.CONST and 0 <= src[1].arg < 8 and \
         (op is Ops.SHL or u.dtype.is_unsigned) and lanes() % 2 == 0:
        # byte lanes shifted by a constant (a quantized block's high nibbles): x86 has no byte shift and gcc shifts
        # each byte as a scalar (Q4_K 8192 x 4096: 1.3 GB/s); shifted as 16-bit lanes, the bits that crossed from the
        # neighbouring byte masked off
        k, n = src[1].arg, lanes()
        wide, keep = vtype(dtypes.uint16, n // 2), (0xFF >> k) if op is Ops.SHR else (0xFF << k) & 0xFF
        vt = vtype(u.dtype, n)
        return f"(({vt})(({wide}){as_lanes(src[0])} {'>>' if op is Ops.SHR else '<<'} {k}) & ({vt}){{}} + ({ctype(u.dtype)}){keep}u)"
      if op in INT_VEC_OPS and u.dtype in _INT_LANES: return alu(op, u.dtype, *[as_lanes(s) for s in src])
      if op is Ops.CAST: return select(as_mask(src[0]), as_vector(UOp.const(u.dtype, 1)), as_vector(UOp.const(u.dtype, 0)))
      if op is Ops.MAX:
        a, b = as_vector(src[0]), as_vector(src[1])
        m = f"m{counter[0]}"; counter[0] += 1
        lines.append("  " * indent + f"const {mtype(lanes())} {m} = ({a}>{b});")
        return select(m, a, b)
      if src[0].dtype.is_bool:       # bool logic on masks (a < b of bools: !a & b)
        a, b = as_mask(src[0]), as_mask(src[1])
        return {Ops.CMPLT: f"(~{a}&{b})", Ops.CMPNE: f"({a}^{b})", Ops.XOR: f"({a}^{b})", Ops.OR: f"({a}|{b})",
                Ops.AND: f"({a}&{b})"}[op]
      if src[0].dtype in _INT_LANES: return alu(op, src[0].dtype, *[as_lanes(s) for s in src])   # integer comparisons
      return alu(op, src[-1].dtype, *[name_of(s) for s in src])    # float arithmetic and comparisons (vector op scalar)

    def is_vec(u: UOp) -> bool:
      u = alias.get(u, u)
      return u in vvals or (u.op is Ops.DEFINE_ACC and u in vacc and vec[0] is not None and u.src[-1] is vec[0])

    def lane_index(lanes) -> str: return flat_lane_index(names, lanes)

    def name_of(u: UOp) -> str:
      u = alias.get(u, u)
      if u.op is Ops.CONST: return literal(u.arg, u.dtype)
      if u.op is Ops.DEFINE_ACC and u in vacc:
        outer = f"{names[u]}[{lane_index(u.src[:-1]) or 0}]"
        return outer if vec[0] is u.src[-1] else f"{outer}[{names[u.src[-1]]}]"
      if u.op is Ops.DEFINE_ACC and u.src: return f"{names[u]}[{lane_index(u.src)}]"
      return names[u]

    def vector_value(u: UOp) -> bool:
      return (vec[0] is not None and u.dtype is not None and (u.dtype in VEC_DTYPES or u.dtype.is_bool
              or u.dtype in INT_VEC_DTYPES) and any(is_vec(s) for s in u.src))

    def new_var(u: UOp, expr: str, prefix="v"):
      nm = f"{prefix}{counter[0]}"; counter[0] += 1
      vector = vector_value(u)
      if vector: vvals.add(u)
      t = vtype(u.dtype, lanes()) if vector else ctype(u.dtype)
      lines.append("  " * indent + f"const {t} {nm} = {expr};")
      names[u] = nm

    def idx_vec(idx: UOp) -> bool:    # this INDEX walks the vector lane (its address is lane 0's)
      return vec[0] in idx.src[1].toposort()

    def vref(idx: UOp, dt: DType, const="") -> str:
      return f"(*({const}{vtype(dt, vec[0].src[0].arg)} *)&{name_of(idx.src[0])}[{name_of(idx.src[1])}])"

    for pos, u in enumerate(program):
      op = u.op
      if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.SINK): continue
      if op is Ops.PARAM: names[u] = f"data{u.arg}"; continue
      if op is Ops.RANGE and u.arg[1] in ("upcast", "unroll") and pos not in vloops:
        lines.append("  " * indent + f"#pragma GCC unroll {u.src[0].arg}")
      if op is Ops.RANGE and pos in vloops:
        # the lane loop becomes one block of vector ops; index math inside is for lane 0
        vec[0] = u; vdt[0] = vdtypes[pos]; names[u] = "0"
        lines.append("  " * indent + "{"); indent += 1
      elif op is Ops.ENDRANGE and vec[0] is u.src[0]:
        vec[0] = None; vvals.clear()
        indent -= 1
        lines.append("  " * indent + "}")
      elif op is Ops.RANGE:
        nm = f"r{u.arg[0]}"
        names[u] = nm
        lines.append("  " * indent + f"for (long long {nm} = 0; {nm} < {name_of(u.src[0])}; {nm}++) {{")
        indent += 1
      elif op is Ops.ENDRANGE:
        indent -= 1
        lines.append("  " * indent + "}")
      elif op is Ops.DEFINE_ACC:
        nm = f"acc{u.arg[1]}"
        names[u] = nm
        init = literal(identity_for(u.arg[0], u.dtype), u.dtype)
        if u in vacc:   # vectors over the innermost lane, one per combination of the other lanes
          n = 1
          for r in u.src[:-1]: n *= r.src[0].arg
          t = vtype(u.dtype, vacc[u])
          lines.append("  " * indent + f"{t} {nm}[{n}];")
          lines.append("  " * indent + f"for (int _i = 0; _i < {n}; _i++) {nm}[_i] = {init} - ({t}){{}};")
        elif u.src:   # one accumulator per upcast lane, kept in registers once the lane loops unroll
          n = 1
          for r in u.src: n *= r.src[0].arg
          lines.append("  " * indent + f"{ctype(u.dtype)} {nm}[{n}];")
          lines.append("  " * indent + f"for (int _i = 0; _i < {n}; _i++) {nm}[_i] = {init};")
        else:
          lines.append("  " * indent + f"{ctype(u.dtype)} {nm} = {init};")
      elif op is Ops.SPECIAL:
        names[u] = u.arg[0]
      elif op is Ops.ACC_UPDATE:
        lines.append("  " * indent + f"{name_of(u.src[0])} = {name_of(u.src[1])};")
      elif op is Ops.INDEX:
        names[u] = name_of(u.src[1])      # rendered by LOAD/STORE
      elif op is Ops.LOAD and vec[0] is not None and idx_vec(u.src[0]):
        vvals.add(u); nm = f"v{counter[0]}"; counter[0] += 1; names[u] = nm
        if u in prefetch:
          ahead = f"__builtin_prefetch(&{name_of(u.src[0].src[0])}[{name_of(u.src[0].src[1])} + {PREFETCH_BYTES // u.dtype.itemsize}], 0, 0);"
          first = " && ".join(f"{names[r]} == 0" for r in prefetch[u])
          lines.append("  " * indent + (f"if ({first}) {ahead}" if first else ahead))
        load = vref(u.src[0], u.dtype, 'const ')
        if len(u.src[0].src) == 3: load = f"({name_of(u.src[0].src[2])} ? {load} : ({vtype(u.dtype, lanes())}){{}})"
        lines.append("  " * indent + f"const {vtype(u.dtype, vec[0].src[0].arg)} {nm} = {load};")
      elif op is Ops.STORE and vec[0] is not None and idx_vec(u.src[0]):
        idx, val, dt = u.src[0], u.src[1], u.src[1].dtype
        v = name_of(val) if is_vec(val) else f"({name_of(val)} - ({vtype(dt, lanes())}){{}})"
        st = f"{vref(idx, dt)} = {v};"
        if nt_total >= NT_STORE_BYTES and (stream := _stream_macro(dt, lanes())) and _lane_aligned(idx, vec[0]):
          buf = name_of(idx.src[0])
          flag = nt_params.setdefault(buf, (f"aligned{len(nt_params)}", lanes() * dt.itemsize))[0]
          isa, builtin, elt = _GCC_STREAM[(dt.itemsize, lanes() * dt.itemsize)]
          vtypes[stream] = _STREAM_DEFS.format(name=stream, vt=vtype(dt, lanes()), ct=ctype(dt), bytes=lanes() * dt.itemsize,
                                               isa=isa, builtin=builtin, elt=elt)
          st = f"if ({flag}) {stream}(&{buf}[{name_of(idx.src[1])}], {v}); else {st}"
        if len(idx.src) == 3: st = f"if ({name_of(idx.src[2])}) {{ {st} }}"
        lines.append("  " * indent + st)
      elif op is Ops.LOAD:
        idx = u.src[0]
        v = f"{name_of(idx.src[0])}[{name_of(idx.src[1])}]"
        if len(idx.src) == 3:
          v = f"({name_of(idx.src[2])}?{v}:{literal(0, u.dtype)})"
        new_var(u, v)
      elif op is Ops.STORE:
        idx = u.src[0]
        st = f"{name_of(idx.src[0])}[{name_of(idx.src[1])}] = {name_of(u.src[1])};"
        if len(idx.src) == 3: st = f"if ({name_of(idx.src[2])}) {st}"
        lines.append("  " * indent + st)
      elif vec[0] is not None and _lane_cast(u) and vec[0] in u.src[0].toposort():
        n, step = lanes(), lane_step(u.src[0], vec[0])
        vt = vtype(u.dtype, n)
        iota = "{" + ", ".join(str(step * k) for k in range(n)) + "}"
        vvals.add(u)
        nm = f"v{counter[0]}"; counter[0] += 1; names[u] = nm
        lines.append("  " * indent + f"const {vt} {nm} = (({vt}){iota} + ({ctype(u.dtype)}){name_of(u.src[0])});")
      elif vector_value(u): new_var(u, vector_alu(u))
      elif op is Ops.CAST and dtypes.float16 in (u.src[0].dtype, u.dtype):
        vtypes.update(_HALF_TYPES)
        new_var(u, (_HALF_TO_FLOAT if u.src[0].dtype == dtypes.float16 else _FLOAT_TO_HALF).format(name_of(u.src[0])))
      elif op is Ops.CAST: new_var(u, f"(({ctype(u.dtype)}){name_of(u.src[0])})")
      elif op is Ops.BITCAST: new_var(u, _bitcast(name_of(u.src[0]), u.src[0].dtype, u.dtype))
      elif op in OPS: new_var(u, alu(op, u.src[-1].dtype, *[name_of(s) for s in u.src]))
      else:
        raise NotImplementedError(f"C renderer: no rule for {op.name}")
    if nt_params:   # streamed stores: each buffer's alignment checked once; fenced before the kernel returns
      head += [f"  const int {flag} = ((unsigned long long){buf} & {width - 1}) == 0;" for buf, (flag, width) in nt_params.items()]
      lines += ["#if defined(__x86_64__)", "  __builtin_ia32_sfence();", "#endif"]
    before, body = kernel_attributes(program, alias, len(lines))
    head[1:1] = [body] if body else []
    return "".join(t + "\n" for t in vtypes.values()) + before + "\n".join(head + lines + ["}"]) + "\n"
