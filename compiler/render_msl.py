"""Render a linearized kernel to the Metal Shading Language for the METAL device (Metal compiles the source when the
driver makes a library of it: drivers/metal/driver.py).

Calling convention: `kernel void name(device T* data0 [[buffer(0)]], const device T* data1 [[buffer(1)]], ...,
constant long& var0 [[buffer(n)]], ..., uint3 gid [[thread_position_in_grid]])`: the buffers in PARAM order (written
ones `device`, the others `const device`), then the DEFINE_VAR values sorted by name, bound by setBytes (or, from an
indirect command buffer, from a buffer of variables). Each thread computes one element of the global loops: codegen's
`to_threads` replaced them by the SPECIAL "gidx" (the thread's position in the grid) and gated the memory accesses of
threads past the end. A kernel mapped to workgroups (ir: SPECIAL gid0..2 / lid0..2) reads
`uint3 bid [[threadgroup_position_in_grid]]` and `uint3 lid [[thread_position_in_threadgroup]]` instead; its
DEFINE_LOCALs are `threadgroup T local<id>[count];` arrays of the kernel's scope, indexed like buffers, and a BARRIER
is `threadgroup_barrier(mem_flags::mem_threadgroup)` (MSL spec 4.4, 5.2.3.6, 6.9.1).

What MSL lacks was lowered before (compiler/lower.py, keyed by `native_ops`), so the ops left map to C++ operators
and the metal_stdlib functions of MSL spec section 6.5 (`OPS`), in their precise:: forms as fast math is off (sin is
one: the shared decomposition reduces its argument in float64).
float16 and bfloat16 are emulated there (computed in float, their 16 storage bits kept in a ushort: numerics equal to
every other device's), the transcendentals decomposed; `as_type<T>` is the bitcast (MSL 2.19). MSL has no 64-bit
float (MSL 2.1: double is not supported): a float64 kernel is refused here with a message naming the kernel.
"""
from __future__ import annotations
import math
from .uop import UOp, Ops, identity_for
from .dtype import DType, dtypes
from .lower import Native
from .render_c import flat_lane_index

# MSL scalar types (MSL 2.1); 16-bit floats are their storage bits (emulated), a bool in memory is a uchar
TYPES = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
         dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
         dtypes.uint64: "ulong", dtypes.index: "long", dtypes.float16: "ushort", dtypes.bfloat16: "ushort",
         dtypes.float32: "float"}
MEMORY_TYPES = {**TYPES, dtypes.bool: "uchar"}
# op -> MSL expression of its operands {0} {1} {2}
OPS = {Ops.NEG: "(-{0})", Ops.RECIP: "(1.0f/{0})", Ops.SQRT: "precise::sqrt({0})", Ops.SIN: "precise::sin({0})", Ops.TRUNC: "precise::trunc({0})",
       Ops.FLOOR: "precise::floor({0})", Ops.ADD: "({0}+{1})", Ops.MUL: "({0}*{1})", Ops.FDIV: "({0}/{1})",
       Ops.MAX: "({0}>{1}?{0}:{1})", Ops.IDIV: "({0}/{1})", Ops.MOD: "({0}%{1})", Ops.CMPLT: "({0}<{1})",
       Ops.CMPNE: "({0}!={1})", Ops.XOR: "({0}^{1})", Ops.OR: "({0}|{1})", Ops.AND: "({0}&{1})",
       Ops.SHL: "({0}<<{1})", Ops.SHR: "({0}>>{1})", Ops.WHERE: "({0}?{1}:{2})"}
# SPECIAL thread indices -> the kernel parameter (a uint3) giving them and its component (MSL spec 5.2.3.6: attributes
# for kernel function inputs): gid0..2 the threadgroup's position in the grid, lid0..2 the thread's in its threadgroup
SPECIALS = {"gidx": ("gid", "thread_position_in_grid", "x"), "lidx": ("lid", "thread_position_in_threadgroup", "x"),
            "bidx": ("bid", "threadgroup_position_in_grid", "x"),
            **{f"gid{i}": ("bid", "threadgroup_position_in_grid", c) for i, c in enumerate("xyz")},
            **{f"lid{i}": ("lid", "thread_position_in_threadgroup", c) for i, c in enumerate("xyz")}}


def msl_type(dt: DType) -> str:
  if dt not in TYPES:
    raise NotImplementedError(f"MSL renderer: Metal has no {dt.name} (MSL spec 2.1: double is not supported); compute "
                              f"in float32 on DEV=METAL")
  return TYPES[dt]


def literal(value, dt: DType) -> str:
  if dt.is_bool: return "true" if value else "false"
  if dt.is_int or dt == dtypes.index:
    if dt.itemsize == 8:
      if dt.is_unsigned: return f"{value}ul"
      return f"({value + 1}L-1)" if value == dt.min else f"{value}L"
    if dt.is_unsigned: return f"{value}u"
    return f"({value + 1}-1)" if value == dt.min else str(value)
  if dt in (dtypes.float16, dtypes.bfloat16):
    raise NotImplementedError(f"MSL renderer: a {dt.name} constant reached the renderer (the lowering emulates them)")
  msl_type(dt)
  if math.isnan(value): return "NAN"
  if math.isinf(value): return "INFINITY" if value > 0 else "(-INFINITY)"
  return f"{float(value)!r}f"


class MSLRenderer:
  device = "METAL"
  threads = True                          # codegen maps the global loops to thread ids (SPECIALs)
  workgroups = True                       # and optimizes them with the GPU opts (compiler/gpu.py)
  # exp2/log2 are decomposed (float32 polynomials, as on every GPU), so are the NaN-propagating max and fmod; sin is
  # precise::sin, as the decomposition reduces its argument in float64, which Metal lacks; float16/bfloat16 are
  # emulated in float (storage bits in a ushort)
  native_ops = Native(float_ops=frozenset({Ops.FLOOR, Ops.FDIV, Ops.SIN}),
                      dtypes=frozenset(dtypes.all()) - {dtypes.float16, dtypes.bfloat16, dtypes.float64})

  def render(self, name: str, program: list[UOp], alias: dict[UOp, UOp], n_params: int, variables: list[UOp]) -> str:
    names: dict[UOp, str] = {}
    lines: list[str] = []
    depth = [1]
    params: dict[int, DType] = {}
    written: set[int] = set()
    for u in program:
      if u.dtype == dtypes.float64 or (u.op is Ops.PARAM and u.dtype == dtypes.float64):
        raise NotImplementedError(f"MSL renderer: kernel {name} computes in float64; Metal has no 64-bit float (MSL "
                                  f"spec 2.1: double is not supported). Use float32 on DEV=METAL")
      if u.op is Ops.PARAM: params[u.arg] = u.dtype
      if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM: written.add(u.src[0].src[0].arg)
    args = []
    for i in range(n_params):
      qualifier = "device" if i in written else "const device"
      args.append(f"{qualifier} {MEMORY_TYPES[params.get(i, dtypes.uint8)]}* data{i} [[buffer({i})]]")
    for j, v in enumerate(variables):
      args.append(f"constant long& var{j} [[buffer({n_params + j})]]")
      names[v] = f"var{j}"
    used = {u.arg[0] for u in program if u.op is Ops.SPECIAL} or {"gidx"}
    if unknown := used - set(SPECIALS):
      raise NotImplementedError(f"MSL renderer: unknown SPECIAL {sorted(unknown)} (know {list(SPECIALS)})")
    for pname, attribute in dict.fromkeys(SPECIALS[s][:2] for s in SPECIALS if s in used):
      args.append(f"uint3 {pname} [[{attribute}]]")
    # workgroup memory: a threadgroup array in the kernel's scope (MSL spec 4.4, the threadgroup address space)
    locals_ = {u.arg[0]: u for u in program if u.op is Ops.DEFINE_LOCAL}
    lines += [f"  threadgroup {MEMORY_TYPES[u.dtype]} local{i}[{u.arg[1]}];" for i, u in sorted(locals_.items())]
    counter = [0]

    def emit(text: str): lines.append("  " * depth[0] + text)

    def name_of(u: UOp) -> str:
      u = alias.get(u, u)
      if u.op is Ops.CONST: return literal(u.arg, u.dtype)
      if u.op is Ops.DEFINE_ACC and u.src: return f"{names[u]}[{flat_lane_index(names, u.src)}]"
      return names[u]

    def value(u: UOp, expr: str):
      names[u] = f"v{counter[0]}"; counter[0] += 1
      emit(f"const {msl_type(u.dtype)} {names[u]} = {expr};")

    for u in program:
      op = u.op
      if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.SINK): continue
      if op is Ops.PARAM: names[u] = f"data{u.arg}"
      elif op is Ops.SPECIAL:
        pname, _, component = SPECIALS[u.arg[0]]
        value(u, f"({msl_type(u.dtype)}){pname}.{component}")
      elif op is Ops.DEFINE_LOCAL: names[u] = f"local{u.arg[0]}"
      elif op is Ops.BARRIER: emit("threadgroup_barrier(mem_flags::mem_threadgroup);")   # MSL spec 6.9.1
      elif op is Ops.RANGE:
        names[u] = f"r{u.arg[0]}"
        emit(f"for (long {names[u]} = 0; {names[u]} < {name_of(u.src[0])}; {names[u]}++) {{")
        depth[0] += 1
      elif op is Ops.ENDRANGE:
        depth[0] -= 1
        emit("}")
      elif op is Ops.DEFINE_ACC:
        names[u] = f"acc{u.arg[1]}"
        init = literal(identity_for(u.arg[0], u.dtype), u.dtype)
        if u.src:   # one accumulator per upcast lane, indexed by the lane counters
          n = math.prod(r.src[0].arg for r in u.src)
          emit(f"{msl_type(u.dtype)} {names[u]}[{n}];")
          emit(f"for (int i = 0; i < {n}; i++) {names[u]}[i] = {init};")
        else: emit(f"{msl_type(u.dtype)} {names[u]} = {init};")
      elif op is Ops.ACC_UPDATE: emit(f"{name_of(u.src[0])} = {name_of(u.src[1])};")
      elif op is Ops.INDEX: names[u] = name_of(u.src[1])     # rendered by LOAD/STORE
      elif op is Ops.LOAD:
        idx = u.src[0]
        load = f"{name_of(idx.src[0])}[{name_of(idx.src[1])}]"
        zero = "0" if u.dtype in (dtypes.float16, dtypes.bfloat16) else literal(0, u.dtype)   # 16-bit floats: bits
        value(u, f"({name_of(idx.src[2])}?{load}:{zero})" if len(idx.src) == 3 else load)
      elif op is Ops.STORE:
        idx = u.src[0]
        store = f"{name_of(idx.src[0])}[{name_of(idx.src[1])}] = {name_of(u.src[1])};"
        emit(f"if ({name_of(idx.src[2])}) {store}" if len(idx.src) == 3 else store)
      elif op is Ops.CAST: value(u, f"(({msl_type(u.dtype)}){name_of(u.src[0])})")
      elif op is Ops.BITCAST:
        src = msl_type(u.src[0].dtype)
        value(u, name_of(u.src[0]) if src == msl_type(u.dtype) else f"as_type<{msl_type(u.dtype)}>({name_of(u.src[0])})")
      elif op in OPS: value(u, OPS[op].format(*[name_of(s) for s in u.src]))
      else: raise NotImplementedError(f"MSL renderer: no rule for {op.name}")
    head = ["#include <metal_stdlib>", "using namespace metal;", "",
            f"kernel void {name}(" + ",\n    ".join(args) + ") {"]
    return "\n".join(head + lines + ["}"]) + "\n"
