"""The AMD renderer's memory accesses: global addresses (an SGPR base + a 32-bit VGPR offset + the immediate offset,
bases per 8 KiB window of constant offsets), gated accesses under EXEC, workgroup memory (LDS) and barriers. A mixin
of compiler/render_amd.py's _Renderer (its registers, values and code list)."""
from __future__ import annotations
import math
from ..uop import UOp, Ops
from .inst import Inst, Reg, Imm, OFF, EXEC_LO, waitcnt
from .regalloc import MAX_SGPRS
from .plan import split
from .common import NULL, LDS_BYTES, DS_LOAD, MEM_LOAD, MEM_STORE, LDSAddress, GlobalAddress, GLOBAL_OFFSET, CHUNK, MAX_CHUNK_BASES, SGPR_SLACK, Const, imm32, signed


class MemoryEmitter:
  # ---------------------------------------------------------------- memory
  def address(self, idx: UOp):
    """An INDEX: a GlobalAddress, or on workgroup memory an LDSAddress."""
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_address(idx.src[0], idx.src[1])
    return self.global_address(idx.src[0], idx.src[1])

  @staticmethod
  def offset32(x: UOp, size: int, extra: int = 0) -> bool:
    """x * size (+ extra bytes) is a 32-bit unsigned byte offset for every value of x."""
    lo, hi = x.vrange
    return isinstance(lo, int) and isinstance(hi, int) and lo >= 0 and (hi + 1) * size + extra <= (1 << 32)

  @staticmethod
  def window(cb: int) -> int:
    """The 8 KiB window k (the base moved by k * CHUNK bytes) that brings byte offset cb into the immediate's range."""
    return (cb + GLOBAL_OFFSET) // CHUNK

  def global_split(self, buf: UOp, i: UOp) -> tuple | None:
    """(x, c) with index i = x + c (x None: 0) where x * size is a 32-bit unsigned offset (also once moved by the
    window of c), as planned or else (i, 0); None when neither is (a 64-bit address)."""
    size = buf.dtype.itemsize
    x, c = split(i, self.plan.offsets)
    if x.op is Ops.CONST: x, c = None, c + int(x.arg)
    def ok(x, c): return x is None or self.offset32(x, size, max(0, self.window(c * size) * CHUNK))
    if ok(x, c): return x, c
    if c and i.op is not Ops.CONST and ok(i, 0): return i, 0
    return None

  def chunk_bases(self):
    """SGPR pairs base + k * CHUNK for the windows k != 0 the kernel's global accesses need, most used first (set once,
    before any loop: no per-iteration cost)."""
    want: dict = {}
    for u in self.program:
      if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and (xc := self.global_split(u.src[0], u.src[1])):
        if (k := self.window(xc[1] * u.src[0].dtype.itemsize)): want[(u.src[0], k)] = want.get((u.src[0], k), 0) + 1
    # (SGPRs left for them: the pointers and variables hold two each, and loops, gates and sums need some more)
    room = (MAX_SGPRS - self.reserved_sgprs - 2 * (self.n_params + len(self.variables)) - SGPR_SLACK) // 2
    for (buf, k), _ in sorted(want.items(), key=lambda kv: -kv[1])[:max(0, min(MAX_CHUNK_BASES, room))]:
      base, r = self.vals[buf], self.s(2)
      self.e("s_add_u32", r[0], base[0], imm32(k * CHUNK))
      self.e("s_addc_u32", r[1], base[1], imm32((k * CHUNK) >> 32))
      self.chunks[(buf, k)] = r

  def global_address(self, buf: UOp, i: UOp) -> GlobalAddress:
    """base + i * size. When x * size (i = x + c) is a 32-bit unsigned offset: the SGPR base, x << log2(size) in a
    VGPR (one per x and size in a scope) and c * size in the immediate offset, the base moved by whole 8 KiB windows
    (chunk_bases) where it is beyond the immediate's range. Else a 64-bit VGPR address: one v_mad_i64_i32 of a 32-bit
    index, or the 64-bit shift and add of a wide one."""
    size = buf.dtype.itemsize
    shift = int(math.log2(size))
    base = self.val(buf)
    if (xc := self.global_split(buf, i)) is not None:
      x, c = xc
      if x is None: voff = self.cached(("zero",), lambda: self.vgpr(Imm(0)))
      else:
        xv = self.op32(x)
        voff = self.cached(("global", x, shift), lambda: self.o("v_lshlrev_b32", Imm(shift), xv) if shift else self.vgpr(xv))
      k = self.window(c * size)
      saddr = self.chunks.get((buf, k), base) if k else base
      if k and saddr is base:
        voff = self.cached(("window", x, shift, k), lambda: self.o("v_add_nc_u32", imm32(k * CHUNK), voff))
      return GlobalAddress(voff, saddr, c * size - k * CHUNK)
    iv = self.val(i)
    if not (isinstance(iv, Reg) and iv.size == 2) and not (isinstance(iv, Const) and iv.size == 2):
      mad = "v_mad_i64_i32" if signed(i.dtype) or i.dtype.itemsize == 8 else "v_mad_u64_u32"
      d = self.v(2)
      self.e(mad, d, NULL, self.vgpr(self.op32(iv)), Imm(size), base)
      return GlobalAddress(d, OFF)
    off = self.rpair(i)
    if shift: off = self.o("v_lshlrev_b64", Imm(shift), off, size=2)
    return GlobalAddress(self.add64(base[0], base[1], off[0], off[1]), OFF)

  def gate_begin(self, idx: UOp):
    if len(idx.src) < 3: return None
    g = self.val(idx.src[2])
    if isinstance(g, Const):
      if g.bits: return None
      saved = self.s(); self.e("s_mov_b32", saved, EXEC_LO); self.e("s_mov_b32", EXEC_LO, Imm(0))
      return saved
    def mask():      # the lanes whose gate is true, once per gate in a scope (gates of neighbouring accesses repeat)
      m = self.s()
      self.e("v_cmp_ne_u32", m, Imm(0), self.op32(g))
      return m
    m = self.cached(("gate", idx.src[2]), mask)
    saved = self.s()
    self.e("s_and_saveexec_b32", saved, m)
    return saved

  def gate_end(self, saved):
    if saved is not None: self.e("s_mov_b32", EXEC_LO, saved)

  def lds_address(self, buf: UOp, i: UOp) -> LDSAddress:
    """The LDS byte address of a valid lane: x * itemsize in a VGPR (one per x and size in a scope), the buffer's
    offset and the constant term c of the index x + c in the DS instruction's 16-bit offset field (RDNA3 ISA guide,
    "Data Share Operations": address = VGPR + offset). Lanes whose gate is false never use it, so the low dword of
    the index suffices."""
    size, offset = buf.dtype.itemsize, self.lds_offsets[buf]
    def nonneg(x): return isinstance(lo := x.vrange[0], int) and lo >= 0
    x, c = split(i, self.plan.offsets)
    if c and not (nonneg(x) and offset + (c + 1) * size <= LDS_BYTES): x, c = i, 0
    if not c and x.op is Ops.ADD and x.src[1].op is Ops.CONST and nonneg(x.src[0]) and 0 <= (k := int(x.src[1].arg)) \
        and offset + (k + 1) * size <= LDS_BYTES:
      x, c = x.src[0], k          # (an index computed anyway: its constant term still goes into the offset field)
    if x.op is Ops.CONST and 0 <= offset + (int(x.arg) + c) * size < LDS_BYTES:
      return LDSAddress(self.cached(("zero",), lambda: self.vgpr(Imm(0))), offset + (int(x.arg) + c) * size)
    shift = int(math.log2(size))
    xv = self.op32(x)
    addr = self.cached(("lds", x, shift), lambda: self.o("v_lshlrev_b32", Imm(shift), xv) if shift else self.vgpr(xv))
    return LDSAddress(addr, offset + c * size)

  def lds_load(self, u: UOp) -> Reg:
    idx, dt = u.src[0], u.dtype
    size = idx.src[0].dtype.itemsize
    if (group := self.plan.lds_vectors.get(u)):    # neighbours: one ds_load_b64 / ds_load_b128 (plan.py)
      a = self.lds_address(group[0].src[0].src[0], group[0].src[0].src[1])
      d = self.v(len(group))
      self.code.append(Inst(f"ds_load_b{32 * len(group)}", (d, a.addr), {"offset": a.offset} if a.offset else {}))
      for k, ld in enumerate(group): self.vals[ld] = d[k]
      return d[group.index(u)]
    kind = DS_LOAD[size]
    if dt.is_int and size < 4 and signed(dt): kind = f"i{8 * size}"    # the register form of int8/int16 is sign-extended
    d = self.v(2 if size == 8 else 1)
    if len(idx.src) == 3:   # lanes whose gate is false keep 0
      for k in range(d.size): self.e("v_mov_b32", d[k] if d.size > 1 else d, Imm(0))
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"ds_load_{kind}", (d, a.addr), {"offset": a.offset} if a.offset else {}))
    self.gate_end(saved)
    return d

  def lds_store(self, u: UOp):
    idx, v = u.src[0], u.src[1]
    size = idx.src[0].dtype.itemsize
    data = self.rpair(v, signed(v.dtype)) if size == 8 else self.vgpr(self.val(v))
    if isinstance(data, Reg) and data.file == "s": data = self.copy_into(None, data, v.dtype)
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"ds_store_{MEM_STORE[size]}", (a.addr, data), {"offset": a.offset} if a.offset else {}))
    self.gate_end(saved)

  def barrier(self, u: UOp):
    """Every LDS operation of this wave done, its stores and its loads (lgkmcnt(0): AMDGPUUsage "Memory Model
    GFX10-GFX11", workgroup release), then s_barrier: the wave waits until every wave of its workgroup got here
    (RDNA3 ISA guide, S_BARRIER: waves that already ended are not waited for). Its sources are the local STOREs it
    publishes and, for a barrier in a loop (compiler/gpu.py STAGE), the RANGE whose previous step's reads it ends."""
    if any(s.op is Ops.STORE and s.src[0].src[0].op is not Ops.DEFINE_LOCAL for s in u.src):
      # global memory would also need s_waitcnt_vscnt and a gl0 invalidate (the WGP's two CUs have their own L0)
      raise NotImplementedError(f"AMD renderer: kernel {self.name!r} has a BARRIER ordering a STORE to global memory; "
                                "a BARRIER orders STOREs to workgroup memory (DEFINE_LOCAL)")
    self.e("s_waitcnt", waitcnt(lgkmcnt=0))
    self.e("s_barrier")

  def load(self, u: UOp):
    idx, dt = u.src[0], u.dtype
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_load(u)
    size = idx.src[0].dtype.itemsize
    kind = MEM_LOAD[size]
    if dt.is_int and dt.itemsize < 4: kind = ("i" if signed(dt) else "u") + str(8 * dt.itemsize)
    d = self.v(2 if size == 8 else 1)
    if len(idx.src) == 3:   # lanes whose gate is false keep 0
      for k in range(d.size): self.e("v_mov_b32", d[k] if d.size > 1 else d, Imm(0))
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"global_load_{kind}", (d, a.vaddr, a.saddr), a.mods()))
    self.gate_end(saved)
    return d

  def store(self, u: UOp):
    idx, v = u.src[0], u.src[1]
    if idx.src[0].op is Ops.DEFINE_LOCAL: return self.lds_store(u)
    size = idx.src[0].dtype.itemsize
    data = self.rpair(v, signed(v.dtype)) if size == 8 else self.vgpr(self.val(v))
    if isinstance(data, Reg) and data.file == "s": data = self.copy_into(None, data, v.dtype)
    saved = self.gate_begin(idx)
    a = self.val(idx)
    self.code.append(Inst(f"global_store_{MEM_STORE[size]}", (a.vaddr, data, a.saddr), a.mods()))
    self.gate_end(saved)
