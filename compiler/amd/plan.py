"""What the AMD renderer (compiler/render_amd.py) decides about a linearized kernel before it emits an instruction.

`plan(program)` looks at the whole program once and returns a `Plan`:
- inplace: an accumulate step used only by its ACC_UPDATE is computed into the accumulator's register (no copy);
  fused: in a float sum, a product used only by that step is one v_fmac_f32 / v_fma_f64 into the accumulator
  (rounded once: a sum of products as BLAS computes it; the PTX renderer does the same).
- offsets: an index `x + c` (c > 0 constant) used only by INDEXes is not computed: the access takes the address of
  x and c in the instruction's immediate offset (global: signed 13 bits, RDNA3 ISA guide "Global, Scratch and Flat
  Instructions"; DS: 16 bits unsigned), so neighbouring elements share one address register.
- lds_vectors: ungated 4-byte loads of workgroup memory at x + c .. x + c + 3 (c and every term of x a multiple of
  4: 16-byte aligned, as LDS buffers are) with no store, barrier or loop boundary between them are one ds_load_b128
  (two neighbours: one ds_load_b64); RDNA3 ISA guide, "Data Share Operations" (DS_LOAD_B128 needs 16-byte aligned
  addresses, LLVM's SIISelLowering requires it too).
- WMMA (compiler/tc.py): `wmma_accs` maps a group (config, sources) whose every output is only added into its own
  accumulator to those accumulators, in element order: the instruction reads and writes them (C = D), so the
  accumulators of a group are one range of 8 consecutive VGPRs (`acc_slot`). `operand_loads`: runs of 16-bit
  loads that only WMMAs read, neighbours in memory, become one global_load_b32 per pair or one global_load_b128 per 8
  elements (aligned: buffers are allocated 64-byte aligned, hcq/tlsf.py) straight into the operand registers.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from ..uop import UOp, Ops
from ..dtype import dtypes
from ..symbolic import linear
from ..linearize import positions, read_between

SIMPLE = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32)
FUSABLE = (dtypes.float32, dtypes.float64)


@dataclass
class Plan:
  users: dict = field(default_factory=dict)
  inplace: dict = field(default_factory=dict)         # step -> DEFINE_ACC
  fused: set = field(default_factory=set)             # MULs rendered by their accumulate step as one fma
  offsets: dict = field(default_factory=dict)         # index `x + c` -> (x, c)
  lds_vectors: dict = field(default_factory=dict)     # first load -> [loads in address order]; the others -> None
  wmma_accs: dict = field(default_factory=dict)       # (config, sources) -> [DEFINE_ACC per element]
  acc_slot: dict = field(default_factory=dict)        # DEFINE_ACC -> ((config, sources), element)
  operand_loads: dict = field(default_factory=dict)   # 16-bit LOAD -> the loads of its run, in element order

  def skipped(self, u: UOp) -> bool:
    """Rendered by the op that uses it (or, for WMMA operand loads, by the WMMA), not where it stands."""
    return u in self.fused or u in self.offsets or u in self.operand_loads

  def acc_done(self, acc: UOp) -> bool: return acc in self.acc_slot


def users_of(program: list[UOp]) -> dict:
  users: dict = {}
  for u in dict.fromkeys(program):
    for s in u.src: users.setdefault(s, set()).add(u)
  return users


def split(i: UOp, offsets: dict) -> tuple[UOp, int]:
  """(x, c) of an index: x + c when planned so, else (i, 0)."""
  return offsets.get(i, (i, 0))


def aligned(x: UOp, c: int, n: int) -> bool:
  """x + c is a multiple of n for every value of x (by x's linear form)."""
  terms, const = linear(x)
  return (const + c) % n == 0 and all(v % n == 0 for v in terms.values())


def plan(program: list[UOp]) -> Plan:
  p = Plan(users=users_of(program))
  users, where = p.users, positions(program)
  for u in dict.fromkeys(program):
    if u.op is Ops.ACC_UPDATE and u.arg is None:
      acc, new = u.src
      if new.op in (Ops.ADD, Ops.MUL, Ops.MAX) and acc in new.src and new.dtype in SIMPLE and users[new] == {u} and \
         not read_between(where, users, acc, new, u):
        p.inplace[new] = acc
        other = new.src[1] if new.src[0] is acc else new.src[0]
        if new.op is Ops.ADD and new.dtype in FUSABLE and other.op is Ops.MUL and users[other] == {new} and other is not acc:
          p.fused.add(other)
    if u.op is Ops.INDEX and (i := u.src[1]).op is Ops.ADD and i.src[1].op is Ops.CONST and i.dtype is not None \
        and i.dtype.is_int and 0 < i.src[1].arg < (1 << 20):
      if all(x.op is Ops.INDEX and x.src[1] is i and i not in x.src[2:] for x in users[i]):
        p.offsets[i] = (i.src[0], i.src[1].arg)
  p.lds_vectors = lds_vectors(program, p.offsets)
  plan_wmma(program, p)
  return p


def lds_vectors(program: list[UOp], offsets: dict) -> dict:
  out: dict = {}
  order = {u: k for k, u in enumerate(program)}

  def flush(window):
    by_x: dict = {}
    for ld in window:
      x, c = split(ld.src[0].src[1], offsets)
      by_x.setdefault((ld.src[0].src[0], x), {}).setdefault(c, ld)
    for (_, x), lds in by_x.items():
      for width in (4, 2):
        if not aligned(x, 0, width): continue
        for c in sorted(lds):
          if c % width == 0 and all(c + k in lds and lds[c + k] not in out for k in range(width)):
            group = [lds[c + k] for k in range(width)]
            out.update({g: None for g in group})
            out[min(group, key=order.__getitem__)] = group
  window: list = []
  for u in program:
    if u.op in (Ops.STORE, Ops.BARRIER, Ops.RANGE, Ops.ENDRANGE): flush(window); window = []
    elif (u.op is Ops.LOAD and len(u.src[0].src) == 2 and u.src[0].src[0].op is Ops.DEFINE_LOCAL
          and u.dtype in (dtypes.float32, dtypes.int32, dtypes.uint32) and u.src[0].src[0].dtype.itemsize == 4):
      window.append(u)
  flush(window)
  return out


def plan_wmma(program: list[UOp], p: Plan):
  from ..tc import BY_NAME
  users = p.users
  groups: dict = {}
  for u in dict.fromkeys(program):
    if u.op is Ops.WMMA: groups.setdefault((u.arg[0], u.src), {})[u.arg[1]] = u
  for key, outs in groups.items():
    tc = BY_NAME[key[0]]
    if len(outs) != tc.n_c: continue
    steps = [next(iter(users[o])) if len(users.get(o, ())) == 1 else None for _, o in sorted(outs.items())]
    accs = [p.inplace.get(s) if s is not None and s.op is Ops.ADD and s.dtype == dtypes.float32 else None for s in steps]
    zero_c = all(x.op is Ops.CONST and x.arg == 0 for x in key[1][tc.n_a + tc.n_b:])
    if zero_c and all(a is not None for a in accs) and len(set(accs)) == len(accs) and not any(a in p.acc_slot for a in accs) \
        and all(not a.src for a in accs):
      p.wmma_accs[key] = accs
      for e, a in enumerate(accs): p.acc_slot[a] = (key, e)
    # A and B: runs of neighbouring 16-bit loads only WMMAs read
    for lo_at, n in ((0, tc.n_a), (tc.n_a, tc.n_b)):
      srcs = key[1][lo_at:lo_at + n]
      e = 0
      while e < n:
        width = _run(srcs, e, p, users)
        if width:
          for k in range(width): p.operand_loads[srcs[e + k]] = tuple(srcs[e:e + width])
          e += width
        else: e += 2


def _run(srcs, e: int, p: Plan, users) -> int:
  """8 or 2 when srcs[e:e+8] / srcs[e:e+2] are loads of consecutive elements of one buffer, aligned to that many
  elements, only WMMAs reading them; else 0."""
  for width in (8, 2):
    part = srcs[e:e + width]
    if len(part) < width or e % width: continue
    if not all(ld.op is Ops.LOAD and len(ld.src) == 1 and len(ld.src[0].src) == 2 and ld.src[0].src[0].op is Ops.PARAM
               and ld.dtype.itemsize == 2 for ld in part): continue
    if any(ld in p.operand_loads for ld in part): continue
    if not all(x.op is Ops.WMMA for ld in part for x in users.get(ld, ())): continue
    buf = part[0].src[0].src[0]
    xs = [split(ld.src[0].src[1], p.offsets) for ld in part]
    x0, c0 = xs[0]
    if any(ld.src[0].src[0] is not buf for ld in part) or any(x is not x0 or c != c0 + k for k, (x, c) in enumerate(xs)):
      continue
    lo, hi = x0.vrange
    if not (isinstance(lo, int) and lo >= 0 and (hi + c0 + width) * 2 <= (1 << 32)): continue
    if aligned(x0, c0, width): return width
  return 0


def hoist_staging_loads(program: list[UOp]) -> list[UOp]:
  """The program with each global load that only feeds workgroup-memory STOREs (a tile staged through LDS,
  compiler/gpu.py STAGE) moved, with what it needs, to the front of its straight-line segment: the loads are all in
  flight before the first store waits for one (one s_waitcnt instead of one per load). Segments end at loops,
  barriers, accumulator updates, thread ids (the 1-D mapping switches lanes past the end off there) and global stores
  (no load moves past a store to global memory)."""
  users = users_of(program)
  def staging(u): return u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM and \
    all(x.op is Ops.STORE and x.src[0].src[0].op is Ops.DEFINE_LOCAL for x in users.get(u, ()))
  def boundary(u): return u.op in (Ops.RANGE, Ops.ENDRANGE, Ops.BARRIER, Ops.DEFINE_ACC, Ops.ACC_UPDATE, Ops.SPECIAL) or \
    (u.op is Ops.STORE and u.src[0].src[0].op is not Ops.DEFINE_LOCAL)
  out: list = []
  seg: list = []

  def flush():
    at = {u: k for k, u in enumerate(seg)}
    early: set = set()
    for u in seg:
      if staging(u):
        stack = [u]
        while stack:
          n = stack.pop()
          if n in at and n not in early: early.add(n); stack.extend(n.src)
    out.extend(u for u in seg if u in early)
    out.extend(u for u in seg if u not in early)
    seg.clear()
  for u in program:
    if boundary(u): flush(); out.append(u)
    else: seg.append(u)
  flush()
  return out
