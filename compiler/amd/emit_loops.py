"""The AMD renderer's loops, accumulators and tensor-core steps: RANGE/ENDRANGE (counters in SGPRs, the index sums
known before a loop added once before it), DEFINE_ACC/ACC_UPDATE (an accumulate step computed into its accumulator)
and WMMA. A mixin of compiler/render_amd.py's _Renderer (its registers, values and code list)."""
from __future__ import annotations
from ..uop import UOp, Ops, identity_for
from ..dtype import dtypes
from .inst import Inst, Reg, Sub, Imm, base_reg
from .common import BF16, F64, NO_RETARGET, Const, imm32, fits32, _is_vgpr


class LoopEmitter:
  def open_range(self, u: UOp):
    if not fits32(u): raise NotImplementedError(f"AMD renderer: loop bound {u.src[0].vmax} does not fit in 32 bits")
    if u.src[0].op is Ops.CONST: bound = imm32(u.src[0].arg)
    else:
      b = self.op32(u.src[0])
      if isinstance(b, Imm) or (isinstance(b, (Reg, Sub)) and b.file == "s"): bound = b
      else:   # uniform (a function of variables only) but computed in VGPRs: read it from the first lane
        bound = self.s(); self.e("v_readfirstlane_b32", bound, b)
    counter, top, end = self.s(), self.label("loop"), self.label("endloop")
    self.e("s_mov_b32", counter, Imm(0))
    if not (isinstance(bound, Imm) and bound.value > 0):
      self.e("s_cmp_ge_i32", counter, bound)
      self.e("s_cbranch_scc1", end)
    sums, parts = self.invariant_sums(u)
    self.code.append(top)
    self.loops[u] = (counter, bound, top, end)
    self.scopes.append({("sums",): sums, ("parts",): parts})
    self.sums.update(sums)
    self.sum_parts |= parts
    return counter

  def invariant_sums(self, r: UOp) -> tuple[dict, set]:
    """Loop-invariant code motion for 32-bit index sums (wrapping adds: any order gives the same bits). A sum in
    the loop body of terms of which two or more are known before the loop (values rendered outside it, constants)
    adds those once, here before the loop, and each iteration only adds the rest: (((r*8 + a) + b) + c) becomes
    r*8 + (a + b + c). Returns {root: (the other terms, the invariant sum)} and the inner ADDs no longer rendered."""
    body, depth = [], 0
    for u in self.program[self.pc + 1:]:
      if u.op is Ops.RANGE: depth += 1
      elif u.op is Ops.ENDRANGE:
        if depth == 0: break
        depth -= 1
      body.append(u)
    inside, users = set(body), self.plan.users
    def chain(n):
      return n.op is Ops.ADD and n.dtype in (dtypes.int32, dtypes.uint32) and n not in self.vals and n not in self.plan.inplace
    sums, parts = {}, set()
    for n in reversed(body):
      if not chain(n) or n in parts or n in self.sums or n in sums or n in self.plan.offsets: continue
      terms, inner, stack = [], [], list(n.src)
      while stack:
        t = stack.pop()
        if chain(t) and t in inside and len(users.get(t, ())) == 1 and t not in self.plan.offsets:   # only this sum uses it
          inner.append(t); stack.extend(t.src)
        else: terms.append(t)
      # (an accumulator changes in the loop: never a known term)
      known = [t for t in terms if t in self.vals and not isinstance(self.vals[t], Const) and t.op is not Ops.DEFINE_ACC]
      consts = [t for t in terms if t.op is Ops.CONST]
      rest = [t for t in terms if t not in known and t not in consts]
      if len(known) + bool(consts) < 2 or not rest: continue
      total = self.op32(known[0]) if known else imm32(0)
      for t in known[1:]: total = self.o("v_add_nc_u32", total, self.op32(t))
      c = sum(int(t.arg) for t in consts)
      if c: total = self.o("v_add_nc_u32", imm32(c), total)
      if isinstance(total, Imm) or (isinstance(total, (Reg, Sub)) and total.file == "s"): total = self.vgpr(total)
      sums[n] = (rest, total)
      parts.update(inner)
    return sums, parts

  def reassociated(self, u: UOp):
    rest, total = self.sums[u]
    for t in rest: total = self.o("v_add_nc_u32", self.op32(t), total)
    return total

  def close_range(self, u: UOp):
    self.pop_scope()
    r = u.src[0]
    counter, bound, top, end = self.loops.pop(r)
    self.e("s_add_i32", counter, counter, Imm(1))
    self.e("s_cmp_lt_i32", counter, bound)
    self.e("s_cbranch_scc1", top)
    self.code.append(end)
    del self.vals[r]

  def define_acc(self, u: UOp):
    if u in self.plan.acc_slot:     # one dword of its WMMA group's 8 consecutive accumulator VGPRs
      key, e = self.plan.acc_slot[u]
      if key not in self.wmma_d: self.wmma_d[key] = self.v(8)
      acc = self.wmma_d[key][e]
    else: acc = self.v(2 if u.dtype.itemsize == 8 else 1)
    return self.copy_into(acc, self.const(identity_for(u.arg[0], u.dtype), u.dtype), u.dtype)

  def acc_update(self, u: UOp):
    """acc = the accumulate step computed before (the lowering gives every reduction its step as ops), unless the
    step was computed into the accumulator (inplace_step)."""
    if u.arg is not None: raise NotImplementedError(f"AMD renderer: ACC_UPDATE {u.arg} was not lowered to a step")
    acc, new = self.vals[u.src[0]], self.val(u.src[1])
    if new != acc: self.copy_into(acc, new, u.dtype)

  def inplace_step(self, u: UOp):
    """An accumulate step whose only use is its ACC_UPDATE, computed into the accumulator: acc += a * b as one
    v_fmac_f32 / v_fma_f64 (rounded once), a WMMA group's sum by the WMMA itself (C = D = the accumulators), any other
    step by its own instruction with the accumulator as destination (retarget), else a copy."""
    acc_u = self.plan.inplace[u]
    acc = self.vals[acc_u]
    if self.plan.acc_done(acc_u): return acc
    other = u.src[1] if u.src[0] is acc_u else u.src[0]
    if other in self.plan.fused:
      a, b = other.src
      if u.dtype == F64: self.e("v_fma_f64", acc, self.pair(a), self.pair(b), acc)
      else:
        x, y = self.op32(a), self.op32(b)
        if not _is_vgpr(y) and _is_vgpr(x): x, y = y, x    # VOP2 v_fmac_f32 reads src1 from a VGPR (else VOP3)
        self.e("v_fmac_f32", acc, x, y)
      return acc
    start = len(self.code)
    x = self.rule(u)
    if x != acc and not self.retarget(x, acc, start): self.copy_into(acc, x, u.dtype)
    return acc

  def retarget(self, x, acc, since: int) -> bool:
    """Make the one instruction that wrote x (made since code position `since`, nothing else mentions it) write acc
    instead."""
    start = self.born.get(x) if isinstance(x, Reg) else None
    if start is None or start < since or x.size != acc.size: return False
    hits = [k for k in range(start, len(self.code)) if isinstance(self.code[k], Inst)
            and any(base_reg(a) is x for a in self.code[k].operands)]
    if len(hits) != 1: return False
    inst = self.code[hits[0]]
    if inst.operands[0] is not x or not inst.name.startswith("v_") or inst.name.startswith(NO_RETARGET): return False
    self.code[hits[0]] = Inst(inst.name, (acc,) + inst.operands[1:], inst.mods)
    return True

  # ---------------------------------------------------------------- tensor cores (compiler/tc.py)
  def wmma(self, u: UOp):
    """Element u.arg[1] of D of u's group: v_wmma_f32_16x16x16_{f16,bf16} D, A, B, C (RDNA3 ISA guide, 7.9 "Wave
    Matrix Multiply Accumulate"), emitted once per group (config, sources) at its first output."""
    key = (u.arg[0], u.src)
    return self.cached(("wmma", key), lambda: self.emit_wmma(key))[u.arg[1]]

  def emit_wmma(self, key) -> Reg:
    from ..tc import BY_NAME
    tc = BY_NAME[key[0]]
    srcs = key[1]
    a = self.cached(("operand", srcs[:tc.n_a]), lambda: self.operand(srcs[:tc.n_a]))
    b = self.cached(("operand", srcs[tc.n_a:tc.n_a + tc.n_b]), lambda: self.operand(srcs[tc.n_a:tc.n_a + tc.n_b]))
    if key in self.plan.wmma_accs: d = c = self.wmma_d[key]       # in place: D = A @ B + the accumulators
    else:
      d, cv = self.v(tc.n_c), [self.val(x) for x in srcs[tc.n_a + tc.n_b:]]
      if all(isinstance(x, Const) and x.bits == 0 for x in cv): c = Imm(0)
      else:
        c = self.v(tc.n_c)
        for k, x in enumerate(cv): self.e("v_mov_b32", c[k], self.op32(x))
    self.e("v_wmma_f32_16x16x16_" + ("bf16" if tc.dtype_in == BF16 else "f16"), d, a, b, c)
    return d

  def operand(self, srcs: tuple) -> Reg:
    """A or B: 16 16-bit values in 8 consecutive VGPRs, element e in VGPR e // 2 (low half for even e): planned runs
    of neighbouring loads straight from memory (global_load_b32 / b128, plan.py), other pairs (hi << 16) | lo."""
    r = self.v(len(srcs) // 2)
    e = 0
    while e < len(srcs):
      run = self.plan.operand_loads.get(srcs[e])
      if run is not None and run[0] is srcs[e] and e % len(run) == 0 and tuple(srcs[e:e + len(run)]) == run:
        idx, n = srcs[e].src[0], len(run) // 2
        a = self.global_address(idx.src[0], idx.src[1])
        dst = r[e // 2] if n == 1 else r[e // 2:e // 2 + n]
        self.code.append(Inst(f"global_load_b{32 * n}", (dst, a.vaddr, a.saddr), a.mods()))
        e += len(run)
        continue
      lo, hi = self.op32(srcs[e]), self.op32(srcs[e + 1])
      if isinstance(lo, Imm) and isinstance(hi, Imm):
        self.e("v_mov_b32", r[e // 2], imm32((hi.value & 0xFFFF) << 16 | lo.value & 0xFFFF))
      else: self.e("v_lshl_or_b32", r[e // 2], hi, Imm(16), lo)    # lo is zero-extended (16-bit float bits)
      e += 2
    return r
