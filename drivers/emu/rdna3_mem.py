"""RDNA3 memory instructions: SMEM (s_load), GLOBAL/FLAT/SCRATCH loads, stores and atomics, and
DS (LDS) operations, vectorized over all lanes of all selected waves.

Addressing follows the AMD "RDNA3 Instruction Set Architecture" reference guide, chapters
"Scalar Memory Operations" (address = SGPR pair base + offset (+ soffset)), "Flat, Scratch and
Global Instructions" (global: 64-bit VGPR address, or SGPR-pair base + 32-bit VGPR offset, plus
a signed 13-bit immediate) and "Data Share Operations" (LDS address = VGPR + offset; the
2addr forms use offset0/offset1 in units of the element size, x64 for the stride64 forms).
Loads are performed on the active lanes only; memory faults name the first bad address.

LDS ordering between the waves of a workgroup (`LDSOrder`): the emulator runs those waves in lockstep, so a missing
s_barrier would go unnoticed; instead every DS access of a workgroup of two or more waves is checked against which
wave wrote and read each LDS byte since the last s_barrier, and a read of another wave's write (or a write over
another wave's read) with no s_barrier between raises LDSRace.
"""
from __future__ import annotations

import numpy as np

from .memory import Memory, MemoryFault
from .rdna3_state import NULL, U32, U64, EmulatorError, check_vgpr

# load/store kinds: name suffix -> (bytes, how to extend into 32 bits)
_LOAD = {"u8": (1, "u"), "i8": (1, "i"), "u16": (2, "u"), "i16": (2, "i"), "b32": (4, ""), "b64": (8, ""),
         "b96": (12, ""), "b128": (16, "")}
_STORE = {"b8": 1, "b16": 2, "b32": 4, "b64": 8, "b96": 12, "b128": 16}


def _signed(v: int, bits: int) -> int: return v - (1 << bits) if v >> (bits - 1) else v


def _extend(data: np.ndarray, nbytes: int, how: str) -> np.ndarray:
  """(m, nbytes) uint8 -> (m, max(1, nbytes//4)) uint32 dwords (sub-dword values extended)."""
  if nbytes >= 4: return np.ascontiguousarray(data).view(U32)
  if nbytes == 1: v = data[:, 0].view(np.int8) if how == "i" else data[:, 0]
  else: v = np.ascontiguousarray(data).view(np.int16 if how == "i" else np.uint16)[:, 0]
  return v.astype(np.int32).view(U32)[:, None] if how == "i" else v.astype(U32)[:, None]


def _dwords_to_bytes(dwords: list[np.ndarray], nbytes: int) -> np.ndarray:
  """list of (m,) uint32 arrays -> (m, nbytes) uint8."""
  stacked = np.stack(dwords, axis=1).astype(U32)
  return np.ascontiguousarray(stacked).view(np.uint8)[:, :nbytes]


# ---- SMEM ----

def put_dwords(w, sel, first, dwords, lanes, full):
  """Write (m, n) dwords of the active lanes into V[first..first+n-1]."""
  k = lanes.shape[0]
  for j in range(dwords.shape[1]):
    if full: w.write_v(first + j, sel, dwords[:, j].reshape(k, 32), None)
    else:
      plane = np.zeros((k, 32), U32)
      plane[lanes] = dwords[:, j]
      w.write_v(first + j, sel, plane, lanes)


def get_dwords(w, sel, first, count, lanes, full):
  """V[first..first+count-1] of the active lanes."""
  return [w.V[first + j][sel].reshape(-1) if full else w.V[first + j][sel][lanes] for j in range(count)]


def compile_smem(inst, get):
  name = inst.name
  if name in ("s_dcache_inv", "s_gl1_inv"): return lambda w, sel: None
  if not name.startswith("s_load_b"): return None
  count = int(name[len("s_load_b"):]) // 32
  sdata, sbase = get("sdata"), get("sbase") * 2
  offset = _signed(get("offset"), 21)
  soffset = get("soffset")

  def run(w, sel):
    addr = w.read_s64(sbase, sel) + np.uint64(offset & 0xFFFFFFFFFFFFFFFF)
    if soffset != NULL: addr = addr + w.S[soffset][sel].astype(U64)
    addr = np.broadcast_to(addr, (len(w.scc[sel]),))
    data = w.memory.gather(addr, 4 * count).view(U32)
    for j in range(count): w.write_s(sdata + j, sel, data[:, j])
  return run


# ---- GLOBAL / FLAT / SCRATCH ----

def _address(w, sel, inst, get):
  """(k, 32) uint64 addresses of a GLOBAL/FLAT instruction."""
  saddr, vaddr = get("saddr"), get("addr")
  offset = _signed(get("offset"), 13) if inst.fmt != "FLAT" else get("offset")
  off = np.uint64(offset & 0xFFFFFFFFFFFFFFFF)
  if inst.fmt == "GLOBAL" and saddr != NULL:
    base = w.read_s64(saddr, sel)[:, None]
    return base + w.V[vaddr][sel].astype(U64) + off
  return (w.V[vaddr][sel].astype(U64) | (w.V[vaddr + 1][sel].astype(U64) << np.uint64(32))) + off


def _scratch_index(w, sel, get):
  """(k, 32) byte offsets into the batch's private memory (each lane owns private_bytes)."""
  if w.scratch is None: raise EmulatorError("scratch access but the kernel descriptor has no private segment")
  saddr, vaddr = get("saddr"), get("addr")
  off = _signed(get("offset"), 13)
  addr = np.full((len(w.scc[sel]), 32), off, np.int64)
  if get("sve"): addr = addr + w.V[vaddr][sel].astype(np.int64)
  if saddr != NULL: addr = addr + w.S[saddr][sel].astype(np.int64)[:, None]
  waves = np.arange(w.n)[sel]
  lane_base = (waves[:, None] * 32 + np.arange(32)) * w.private_bytes
  return addr, lane_base


class _Scratch:
  """A Memory-like view of per-lane private memory for one instruction."""

  def __init__(self, w, addr, lane_base, lanes):
    self.w, self.addr, self.lane_base, self.lanes = w, addr, lane_base, lanes

  def check(self, nbytes):
    bad = self.lanes & ((self.addr < 0) | (self.addr + nbytes > self.w.private_bytes))
    if bad.any(): raise MemoryFault(int(self.addr[bad][0]), nbytes, detail="scratch (private) address out of the private segment")


def compile_vmem(inst, get, n_vgprs):
  name = inst.name
  kind = name.split("_", 1)[1]          # load_b32, store_b8, atomic_add_u32, ...
  scratch = inst.fmt == "SCRATCH"
  vdst, vdata = get("vdst"), get("data")

  def targets(w, sel, nbytes):
    """(flat active addresses, lanes mask, store function, load function) for this access."""
    lanes = w.lanes(sel)
    full = w.all_active(sel)
    if scratch:
      addr, base = _scratch_index(w, sel, get)
      _Scratch(w, addr, base, lanes).check(nbytes)
      flat = (addr + base)
      flat = flat.reshape(-1) if full else flat[lanes]
      mem = w.scratch
      load = lambda: Memory._take(mem, flat, nbytes)
      store = lambda values: Memory._put(mem, flat, values, nbytes)
      return lanes, full, load, store
    addr = _address(w, sel, inst, get)
    flat = addr.reshape(-1) if full else addr[lanes]
    return lanes, full, (lambda: w.memory.gather(flat, nbytes)), (lambda values: w.memory.scatter(flat, values, nbytes))

  if kind.startswith("load_d16"):
    hi = "_hi_" in kind
    suffix = kind.rsplit("_", 1)[1]
    nbytes, how = {"u8": (1, "u"), "i8": (1, "i"), "b16": (2, "u")}[suffix]
    check_vgpr(vdst, 1, n_vgprs)

    def run_d16(w, sel):
      lanes, full, load, _ = targets(w, sel, nbytes)
      value = _extend(load(), nbytes, how)[:, 0] & np.uint32(0xFFFF)
      old = w.V[vdst][sel].reshape(-1) if full else w.V[vdst][sel][lanes]
      new = (old & np.uint32(0xFFFF)) | (value << np.uint32(16)) if hi else (old & np.uint32(0xFFFF0000)) | value
      put_dwords(w, sel, vdst, new[:, None], lanes, full)
    return run_d16

  if kind.startswith("load_") and kind[5:] in _LOAD:
    nbytes, how = _LOAD[kind[5:]]
    check_vgpr(vdst, max(1, nbytes // 4), n_vgprs)

    def run_load(w, sel):
      lanes, full, load, _ = targets(w, sel, nbytes)
      if not full and not lanes.any(): return
      put_dwords(w, sel, vdst, _extend(load(), nbytes, how), lanes, full)
    return run_load

  if kind.startswith("store_"):
    hi = "_d16_hi_" in kind
    nbytes = _STORE[kind.rsplit("_", 1)[1]]
    check_vgpr(vdata, max(1, nbytes // 4), n_vgprs)

    def run_store(w, sel):
      lanes, full, _, store = targets(w, sel, nbytes)
      if not full and not lanes.any(): return
      dwords = get_dwords(w, sel, vdata, max(1, nbytes // 4), lanes, full)
      if hi: dwords = [dwords[0] >> np.uint32(16)]
      store(_dwords_to_bytes(dwords, nbytes))
    return run_store

  if kind.startswith("atomic_"):
    return _compile_atomic(inst, get, n_vgprs, targets, put_dwords, get_dwords)
  return None


# ---- atomics (global and LDS share the arithmetic) ----

def _atomic_fn(op: str, bits: int):
  """fn(old, data, data2) -> new for one atomic operation on uint32/uint64 values."""
  dt = U64 if bits == 64 else U32
  sdt = np.int64 if bits == 64 else np.int32
  fns = {
    "swap": lambda o, d, c: d, "add": lambda o, d, c: o + d, "sub": lambda o, d, c: o - d,
    "rsub": lambda o, d, c: d - o,
    "min_i": lambda o, d, c: np.where(o.view(sdt) < d.view(sdt), o, d), "max_i": lambda o, d, c: np.where(o.view(sdt) > d.view(sdt), o, d),
    "min_u": lambda o, d, c: np.minimum(o, d), "max_u": lambda o, d, c: np.maximum(o, d),
    "and": lambda o, d, c: o & d, "or": lambda o, d, c: o | d, "xor": lambda o, d, c: o ^ d,
    "inc": lambda o, d, c: np.where(o >= d, dt(0), o + dt(1)), "dec": lambda o, d, c: np.where((o == 0) | (o > d), d, o - dt(1)),
    "cmpswap": lambda o, d, c: np.where(o == c, d, o),    # d = new value, c = compare value
    "csub": lambda o, d, c: np.where(o >= d, o - d, dt(0)),
    "add_f": lambda o, d, c: (o.view(np.float32) + d.view(np.float32)).view(U32),
    "min_f": lambda o, d, c: np.fmin(o.view(np.float32), d.view(np.float32)).view(U32),
    "max_f": lambda o, d, c: np.fmax(o.view(np.float32), d.view(np.float32)).view(U32),
    "cmpswap_f": lambda o, d, c: np.where(o.view(np.float32) == c.view(np.float32), d, o),
  }
  return fns[op]


def _atomic_op_name(mnemonic: str) -> tuple[str, int]:
  """'global_atomic_min_i32' -> ('min_i', 32); 'ds_add_rtn_f32' -> ('add_f', 32)."""
  parts = mnemonic.split("_")
  typ = parts[-1]
  bits = 64 if typ.endswith("64") else 32
  op = parts[-2] if parts[-2] != "rtn" else parts[-3]
  if op in ("min", "max"): op += "_" + typ[0] if typ[0] in "iu" else "_f"
  elif typ.startswith("f") and op in ("add", "cmpswap"): op += "_f"
  return op, bits


def apply_atomics(old_fn, keys: np.ndarray, data: np.ndarray, data2, fn):
  """Atomic read-modify-write of lanes that may share addresses, in lane order.

  keys: (m,) address per lane; returns (pre-op values per lane, {unique key: final value}).
  Lanes touching distinct addresses run at once; lanes sharing an address run in rounds (one
  lane per address per round), which keeps the lane order a sequential execution would have."""
  m = keys.size
  pre = np.empty(m, data.dtype)
  order = np.argsort(keys, kind="stable")
  sorted_keys = keys[order]
  starts = np.r_[0, np.nonzero(sorted_keys[1:] != sorted_keys[:-1])[0] + 1]
  uniq = sorted_keys[starts]
  counts = np.diff(np.r_[starts, m])
  current = old_fn(uniq)
  for r in range(int(counts.max()) if m else 0):
    live = counts > r
    lanes = order[starts[live] + r]
    o = current[live]
    pre[lanes] = o
    current[live] = fn(o, data[lanes], None if data2 is None else data2[lanes])
  return pre, uniq, current


def _compile_atomic(inst, get, n_vgprs, targets, put_dwords, get_dwords):
  op, bits = _atomic_op_name(inst.name)
  fn = _atomic_fn(op, bits)
  nd = bits // 32
  vdst, vdata = get("vdst"), get("data")
  returns = bool(get("glc"))
  cmp = op.startswith("cmpswap")

  def run(w, sel):
    nbytes = bits // 8
    lanes = w.lanes(sel)
    full = w.all_active(sel)
    if not full and not lanes.any(): return
    dw = get_dwords(w, sel, vdata, nd * (2 if cmp else 1), lanes, full)
    join = (lambda lo, hi: lo.astype(U64) | (hi.astype(U64) << np.uint64(32))) if bits == 64 else (lambda lo, hi=None: lo)
    data = join(dw[0], dw[1]) if bits == 64 else dw[0]
    data2 = (join(dw[2], dw[3]) if bits == 64 else dw[1]) if cmp else None
    addr = _address(w, sel, inst, get)
    flat = addr.reshape(-1) if full else addr[lanes]
    mem = w.memory
    dt = U64 if bits == 64 else U32
    pre, uniq, final = apply_atomics(lambda keys: mem.gather(keys, nbytes).view(dt)[:, 0].copy(), flat, data, data2, fn)
    mem.scatter(uniq, final.view(np.uint8).reshape(-1, nbytes), nbytes)
    if returns:
      check_vgpr(vdst, nd, n_vgprs)
      out = pre.view(U32).reshape(-1, nd) if bits == 64 else pre[:, None]
      put_dwords(w, sel, vdst, out, lanes, full)
  return run


# ---- LDS ordering between the waves of a workgroup ----

class LDSRace(EmulatorError):
  """A DS access that reads (or overwrites) LDS bytes another wave of its workgroup wrote (or read) since the last
  s_barrier: on a gfx1100 its result depends on how the waves happen to be scheduled."""


LOAD, STORE, ATOMIC = range(3)
NO_WAVE, MANY_WAVES, ATOMIC_BY = -1, -2, 32     # codes of LDSOrder.writer/reader besides a wave's index in its group


class LDSOrder:
  """Which wave of its workgroup wrote and which read each LDS byte since the workgroup's last s_barrier.

  The rule is the hardware's: "The LDS memory has multiple request queues shared by the SIMDs of a WGP. Therefore,
  the LDS operations performed by different wavefronts of a work-group can be reordered relative to each other"
  (LLVM AMDGPUUsage, "Memory Model GFX10-GFX11"), while one wave's own LDS operations complete in order (RDNA3 ISA
  guide, 5.6 "Data Dependency Resolution": LGKM_CNT, LDS returns in order). What orders the waves is S_BARRIER
  ("Synchronize waves within a threadgroup", RDNA3 ISA guide, 16.5 "SOPP Instructions"), after each wave's
  `s_waitcnt lgkmcnt(0)` (the workgroup-scope release of AMDGPUUsage's code sequences; rdna3_deps.py checks it).
  So, between two barriers, a wave may read LDS bytes only it (or nobody) wrote, and write bytes only it (or nobody)
  read; atomics (ds_add_u32, ...) of several waves to one address are ordered by the LDS itself, against plain
  loads and stores of other waves they are not. Two plain stores of different waves to one byte are not checked.

  writer[b]: NO_WAVE, the wave (index in its workgroup) of the last plain store, ATOMIC_BY + wave for atomics of one
  wave, MANY_WAVES for atomics of several; reader[b]: NO_WAVE, the one wave that read b, or MANY_WAVES. Every wave of
  a batch passes a barrier at the same time (rdna3.py `_run` releases a barrier once every live wave of the batch
  waits at one), so a release clears both for the whole batch. An aligned access of whole dwords whose four bytes
  agree in both tables (the common case) is checked on int32 views of the tables, four equal codes at a time."""

  def __init__(self, n_bytes: int, lds_bytes: int, wave_in_group: np.ndarray, group_base: int, grid: tuple):
    n = -(-n_bytes // 4) * 4
    self.writer = np.full(n, NO_WAVE, np.int8)
    self.reader = np.full(n, NO_WAVE, np.int8)
    self.writer32, self.reader32 = self.writer.view(np.int32), self.reader.view(np.int32)
    self.lds_bytes, self.group_base, self.grid = lds_bytes, group_base, grid
    self.lane_wave = np.repeat(wave_in_group.astype(np.int8)[:, None], 32, axis=1)     # (waves, 32) codes
    self.lane_rep = _rep(self.lane_wave)
    self.lane_rep_atomic = _rep(self.lane_wave + ATOMIC_BY)
    self.touched = self.bytewise = False       # bytewise: a sub-dword access since the barrier (dwords may be mixed)

  def barrier(self) -> None:
    if self.touched:
      self.writer.fill(NO_WAVE)
      self.reader.fill(NO_WAVE)
      self.touched = self.bytewise = False

  def access(self, sel, idx: np.ndarray, lanes: np.ndarray, full: bool, nbytes: int, kind: int, where) -> None:
    """Check, then record, an access of `nbytes` bytes from each flat index `idx` (the active lanes of `sel`)."""
    pick = (lambda a: a[sel].reshape(-1)) if full else (lambda a: a[sel][lanes])
    self.touched = True
    if nbytes % 4 == 0 and not (idx & 3).any():
      d, plain, atomic = idx >> 2, pick(self.lane_rep), pick(self.lane_rep_atomic)
      if nbytes > 4:
        d = (d[:, None] + np.arange(nbytes // 4)).reshape(-1)
        plain, atomic = np.repeat(plain, nbytes // 4), np.repeat(atomic, nbytes // 4)
      wr, rd = self.writer32[d], self.reader32[d]
      if not self.bytewise or (_same_bytes(wr) and _same_bytes(rd)):
        return self._check(self.writer32, self.reader32, d, wr, rd, plain, atomic, 4, kind, where)
    b, wave = idx, pick(self.lane_wave)
    self.bytewise = True
    if nbytes > 1: b, wave = (idx[:, None] + np.arange(nbytes)).reshape(-1), np.repeat(wave, nbytes)
    self._check(self.writer, self.reader, b, self.writer[b], self.reader[b], wave, wave + ATOMIC_BY, 1, kind, where)

  def _check(self, writer, reader, i, wr, rd, plain, atomic, unit, kind, where) -> None:
    """The rule on tables of bytes (unit 1) or of dwords holding four equal byte codes (unit 4, codes from _rep)."""
    no, many = _code(NO_WAVE, unit), _code(MANY_WAVES, unit)
    if kind == LOAD:
      if not (wr == no).all():                               # (the common case: nothing written since the barrier)
        bad = (wr != no) & (wr != plain) & (wr != atomic)
        if bad.any(): self._race(i, unit, plain, wr, bad, kind, False, where)
      _record(reader, i, plain, rd, plain, no, many)
      return
    read = not (rd == no).all()
    war = (rd != no) & (rd != plain) if read else None                                # write after another's read
    raw = (wr >= 0) & (wr < _code(ATOMIC_BY, unit)) & (wr != plain) if kind == ATOMIC else None   # RMW of a store
    bad = war if raw is None else raw if war is None else war | raw
    if bad is not None and bad.any():
      first_war = war is not None and bool(war[int(np.argmax(bad))])
      self._race(i, unit, plain, rd if first_war else wr, bad, kind, first_war, where)
    if kind == STORE: writer[i] = plain
    else: _record(writer, i, atomic, wr, plain, no, many)

  def _race(self, i, unit, plain, other, bad, kind, war, where) -> None:
    j = int(np.argmax(bad))
    group, addr = divmod(int(i[j]) * unit, self.lds_bytes)
    g = self.group_base + group
    gx, gy, _ = self.grid
    wg = (g % gx, g // gx % gy, g // (gx * gy))
    code, me = _signed8(int(other[j])), _signed8(int(plain[j]))
    who = ("several waves" if code == MANY_WAVES else f"wave {code - ATOMIC_BY} (an atomic)" if code >= ATOMIC_BY
           else f"wave {code}")
    if war:
      what, fix = f"wave {me} writes LDS byte {addr:#x} that {who} of the same workgroup read", "the new value"
    else:
      verb, stored = "updates" if kind == ATOMIC else "reads", "stored" if 0 <= code < ATOMIC_BY else "updated"
      what = f"wave {me} {verb} LDS byte {addr:#x} that {who} of the same workgroup {stored}"
      fix = "the old value"
    raise LDSRace(
      f"LDS race in {where()}: {what} with no s_barrier between (workgroup {wg}); the waves of a workgroup run in no "
      f"fixed order on a gfx1100, the read may see {fix}. Order them with `s_waitcnt lgkmcnt(0)` then `s_barrier` in "
      f"every wave between the two accesses (AMDGPUUsage \"Memory Model GFX10-GFX11\": LDS operations of different "
      f"wavefronts of a work-group can be reordered relative to each other)")


def _rep(codes: np.ndarray) -> np.ndarray:
  """int8 codes -> int32 holding the code in each of its four bytes."""
  return (codes.astype(np.uint8).astype(np.uint32) * np.uint32(0x01010101)).view(np.int32)


def _code(code: int, unit: int) -> int: return code if unit == 1 else int(_rep(np.array([code], np.int8))[0])
def _signed8(value: int) -> int: return (value & 0xFF) - 256 if value & 0x80 else value & 0xFF


def _same_bytes(x: np.ndarray) -> bool:
  """Whether every int32 of x holds four equal bytes."""
  u = x.view(np.uint32)
  return bool((u == (u & np.uint32(0xFF)) * np.uint32(0x01010101)).all())


def _record(table: np.ndarray, i: np.ndarray, code: np.ndarray, prev: np.ndarray, plain, no, many) -> None:
  """table[i] = code, or `many` where another wave's code was there or several waves meet in this access."""
  table[i] = code
  mixed = table[i] != code                   # with repeated indices the last lane's code stays: the others see it
  if not (prev == no).all(): mixed |= (prev != no) & (prev != code) & (prev != plain)
  if mixed.any(): table[i[mixed]] = many


# ---- DS (LDS) ----

def compile_ds(inst, get, n_vgprs, where=lambda: "the kernel"):
  """fn(w, sel) running the DS instruction; `where()` names the kernel and pc for errors."""
  name = inst.name
  addr_r, d0, d1, vdst = get("addr"), get("data0"), get("data1"), get("vdst")
  offset = get("offset0") | (get("offset1") << 8)
  off0, off1 = get("offset0"), get("offset1")
  if name in ("ds_nop",): return lambda w, sel: None

  def lds_index(w, sel, extra: int, nbytes: int, kind: int):
    """(flat byte index into w.lds of the active lanes, lanes, full); checks the access against w.lds_order."""
    lanes = w.lanes(sel)
    full = w.all_active(sel)
    a = w.V[addr_r][sel].astype(np.int64) + extra
    if full: a, grp = a.reshape(-1), np.repeat(w.group[sel], 32)
    else: a, grp = a[lanes], np.broadcast_to(w.group[sel][:, None], lanes.shape)[lanes]
    bad = (a < 0) | (a + nbytes > w.lds_bytes)
    if bad.any():
      raise MemoryFault(int(a[bad][0]), nbytes, detail=f"LDS address out of the {w.lds_bytes}-byte workgroup allocation")
    idx = grp * w.lds_bytes + a
    if w.lds_order is not None and idx.size: w.lds_order.access(sel, idx, lanes, full, nbytes, kind, where)
    return idx, lanes, full

  load_kinds = {"ds_load_b32": (4, ""), "ds_load_b64": (8, ""), "ds_load_b96": (12, ""), "ds_load_b128": (16, ""),
                "ds_load_u8": (1, "u"), "ds_load_i8": (1, "i"), "ds_load_u16": (2, "u"), "ds_load_i16": (2, "i")}
  store_kinds = {"ds_store_b32": 4, "ds_store_b64": 8, "ds_store_b96": 12, "ds_store_b128": 16, "ds_store_b8": 1,
                 "ds_store_b16": 2}
  if name in load_kinds:
    nbytes, how = load_kinds[name]
    check_vgpr(vdst, max(1, nbytes // 4), n_vgprs)

    def run_load(w, sel):
      idx, lanes, full = lds_index(w, sel, offset, nbytes, LOAD)
      if idx.size == 0: return
      put_dwords(w, sel, vdst, _extend(Memory._take(w.lds, idx, nbytes), nbytes, how), lanes, full)
    return run_load
  if name in store_kinds or name in ("ds_store_b8_d16_hi", "ds_store_b16_d16_hi"):
    nbytes = store_kinds.get(name) or (1 if "b8" in name else 2)
    hi = name.endswith("_d16_hi")

    def run_store(w, sel):
      idx, lanes, full = lds_index(w, sel, offset, nbytes, STORE)
      if idx.size == 0: return
      dwords = get_dwords(w, sel, d0, max(1, nbytes // 4), lanes, full)
      if hi: dwords = [dwords[0] >> np.uint32(16)]
      Memory._put(w.lds, idx, _dwords_to_bytes(dwords, nbytes), nbytes)
    return run_store
  if name.startswith("ds_load_u8_d16") or name.startswith("ds_load_i8_d16") or name.startswith("ds_load_u16_d16"):
    nbytes, how = (2, "u") if "u16" in name else (1, "i" if "i8" in name else "u")
    hi = name.endswith("_hi")

    def run_d16(w, sel):
      idx, lanes, full = lds_index(w, sel, offset, nbytes, LOAD)
      if idx.size == 0: return
      value = _extend(Memory._take(w.lds, idx, nbytes), nbytes, how)[:, 0] & np.uint32(0xFFFF)
      old = get_dwords(w, sel, vdst, 1, lanes, full)[0]
      new = (old & np.uint32(0xFFFF)) | (value << np.uint32(16)) if hi else (old & np.uint32(0xFFFF0000)) | value
      put_dwords(w, sel, vdst, new[:, None], lanes, full)
    return run_d16
  if name.startswith("ds_load_2addr") or name.startswith("ds_store_2addr"):
    size = 8 if name.endswith("b64") else 4
    stride = size * (64 if "stride64" in name else 1)
    nd = size // 4

    def run_2addr(w, sel):
      for which, off in ((0, off0 * stride), (1, off1 * stride)):
        idx, lanes, full = lds_index(w, sel, off, size, LOAD if name.startswith("ds_load") else STORE)
        if idx.size == 0: return
        if name.startswith("ds_load"):
          put_dwords(w, sel, vdst + which * nd, _extend(Memory._take(w.lds, idx, size), size, ""), lanes, full)
        else:
          src = d0 if which == 0 else d1
          Memory._put(w.lds, idx, _dwords_to_bytes(get_dwords(w, sel, src, nd, lanes, full), size), size)
    return run_2addr
  if name in ("ds_bpermute_b32", "ds_permute_b32"):
    def run_perm(w, sel):
      lanes = w.lanes(sel)
      src = w.V[d0][sel]
      lane_of = ((w.V[addr_r][sel].astype(np.int64) + offset) >> 2) & 31
      if name == "ds_bpermute_b32":     # dst[i] = src[addr[i] / 4]  (pull)
        value = np.take_along_axis(src, lane_of, axis=1)
        value = np.where(np.take_along_axis(lanes, lane_of, axis=1), value, 0)   # inactive source lanes read 0
        w.write_v(vdst, sel, value, None if w.all_active(sel) else lanes)
      else:                              # dst[addr[i] / 4] = src[i]  (push), later lanes win
        out = np.zeros_like(src)
        k = src.shape[0]
        rows = np.repeat(np.arange(k), 32).reshape(k, 32)
        out[rows[lanes], lane_of[lanes]] = src[lanes]
        w.write_v(vdst, sel, out, None)
    return run_perm
  # LDS atomics: ds_<op>_[rtn_]<type>
  if name.startswith("ds_") and any(name.startswith(f"ds_{o}") for o in
                                    ("add", "sub", "rsub", "inc", "dec", "min", "max", "and", "or", "xor", "cmpstore", "storexchg")):
    if "2addr" in name or name.startswith("ds_mskor") or name.startswith("ds_wrap") or name.startswith("ds_condxchg"): return None
    mnemonic = name.replace("cmpstore", "cmpswap").replace("storexchg", "swap")
    op, bits = _atomic_op_name(mnemonic)
    fn = _atomic_fn(op, bits)
    nd, nbytes = bits // 32, bits // 8
    returns = "_rtn_" in name
    cmp = op.startswith("cmpswap")

    def run_atomic(w, sel):
      idx, lanes, full = lds_index(w, sel, offset, nbytes, ATOMIC)
      if idx.size == 0: return
      dt = U64 if bits == 64 else U32
      join = lambda lo, hi: lo.astype(U64) | (hi.astype(U64) << np.uint64(32))
      dw0 = get_dwords(w, sel, d0, nd, lanes, full)
      data = join(*dw0) if bits == 64 else dw0[0]
      data2 = None
      if cmp:   # ds_cmpstore: data0 = new value, data1 = compare value (RDNA3 naming)
        dw1 = get_dwords(w, sel, d1, nd, lanes, full)
        data2 = join(*dw1) if bits == 64 else dw1[0]
      pre, uniq, final = apply_atomics(lambda keys: Memory._take(w.lds, keys, nbytes).copy().view(dt)[:, 0], idx, data, data2, fn)
      Memory._put(w.lds, uniq, final.view(np.uint8).reshape(-1, nbytes), nbytes)
      if returns:
        put_dwords(w, sel, vdst, pre.view(U32).reshape(-1, nd) if bits == 64 else pre[:, None], lanes, full)
    return run_atomic
  return None
