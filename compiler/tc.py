"""Tensor cores: the TC opt turns a matmul-shaped reduction on 16-bit floats into WMMA ops.

A tensor core multiplies an M x K tile of A by a K x N tile of B into an M x N tile of float32, with the tiles
spread over the `threads` lanes of one wave/warp: lane l holds element e of A at `a(l, e)` = (row, col), of B at
`b(l, e)`, of C/D at `c(l, e)`. The layouts are the vendors' (sources beside each table); the emulators execute the
instructions by the same documents, and tests/emu/test_tensor_cores.py checks both against numpy with layouts
written from the documents, not from here.

`UOp(Ops.WMMA, float32, a elements + b elements + c elements, (config name, i))` is element i of D = A @ B + C
for one lane; the elements of A and B are 16-bit float values (loads), C float32. All outputs of one WMMA (same
sources and config) are one instruction: renderers emit it at its first output.

`apply_tc(ast, config)`: the kernel must be one ADD reduction over one loop k of a product of two 16-bit float loads
(`CAST(MUL(a, b))` or `MUL(CAST(a), CAST(b))`, the product exact on the tensor core), a's index using an output
axis i that b's does not and b's an axis j that a's does not, with i, j, k multiples of M, N, K. The result: i and j
step by whole tiles, k by K, a new "warp" range of `threads` lanes (compiler/gpu.py makes it thread x of the
workgroup), and one store per element of the lane's C fragment, each the REDUCE over k of a WMMA output.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from .uop import UOp, Ops
from .dtype import dtypes
from .pattern import substitute
from .opt import OptError, _size


@dataclass(frozen=True)
class TensorCore:
  name: str
  device: str
  dims: tuple             # (M, N, K)
  dtype_in: object
  threads: int
  a: Callable             # (lane, element) -> (row, col) of A (M x K); lane is a UOp, element an int
  b: Callable             # (lane, element) -> (row, col) of B (K x N)
  c: Callable             # (lane, element) -> (row, col) of C/D (M x N)
  n_a: int
  n_b: int
  n_c: int


# NVIDIA mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: PTX ISA 8.x, 9.7.13.4.8 "Matrix Fragments for
# mma.m16n8k16 with floating point type": groupID = %laneid >> 2, threadID_in_group = %laneid % 4;
# A a0..a7: row = groupID (+8 for a2, a3, a6, a7), col = threadID_in_group * 2 + (i & 1) (+8 for a4..a7);
# B b0..b3: row = threadID_in_group * 2 + (i & 1) (+8 for b2, b3), col = groupID;
# C/D c0..c3: row = groupID (+8 for c2, c3), col = threadID_in_group * 2 + (i & 1).
def _nv_a(l, e): return (l // 4 + 8 * ((e >> 1) & 1), (l % 4) * 2 + (e & 1) + 8 * (e >> 2))
def _nv_b(l, e): return ((l % 4) * 2 + (e & 1) + 8 * (e >> 1), l // 4)
def _nv_c(l, e): return (l // 4 + 8 * (e >> 1), (l % 4) * 2 + (e & 1))


# AMD v_wmma_f32_16x16x16_{f16,bf16}, wave32: RDNA3 ISA guide, 7.9 "Wave Matrix Multiply Accumulate": lane l holds
# row l % 16 of A and column l % 16 of B, all 16 k values in 8 VGPRs (element e = k; lanes 16-31 repeat lanes 0-15);
# D/C element e (VGPR e) of lane l is row 2 * e + l // 16, column l % 16.
def _amd_a(l, e): return (l % 16, e)
def _amd_b(l, e): return (e, l % 16)
def _amd_c(l, e): return (2 * e + l // 16, l % 16)


TENSOR_CORES = {
  "NV": [TensorCore(f"mma_m16n8k16_{d.name}", "NV", (16, 8, 16), d, 32, _nv_a, _nv_b, _nv_c, 8, 4, 4)
         for d in (dtypes.float16, dtypes.bfloat16)],
  "AMD": [TensorCore(f"wmma_16x16x16_{d.name}", "AMD", (16, 16, 16), d, 32, _amd_a, _amd_b, _amd_c, 16, 16, 8)
          for d in (dtypes.float16, dtypes.bfloat16)],
}
BY_NAME = {tc.name: tc for tcs in TENSOR_CORES.values() for tc in tcs}


def _operands(value: UOp):
  """(a load, b load) of a product of two 16-bit float loads, else None."""
  if value.op is Ops.CAST and value.dtype == dtypes.float32 and value.src[0].op is Ops.MUL:
    a, b = value.src[0].src
  elif value.op is Ops.MUL and value.dtype == dtypes.float32 and all(s.op is Ops.CAST for s in value.src):
    a, b = (s.src[0] for s in value.src)
  else: return None
  if a.op is not Ops.LOAD or b.op is not Ops.LOAD or a.dtype != b.dtype: return None
  return a, b


def _ranges_of(u: UOp) -> set:
  return {r for r in u.toposort() if r.op is Ops.RANGE}


def match(ast: UOp, tc: TensorCore):
  """(reduce, a, b, i, j, k) when `ast` is a matmul `tc` can compute, else an OptError saying why not."""
  reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE]
  if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or len(reduces[0].src) != 2:
    raise OptError("TC: the kernel is not one sum over one loop")
  red = reduces[0]
  k = red.src[1]
  ops = _operands(red.src[0])
  if ops is None: raise OptError("TC: the sum is not of a product of two 16-bit float loads")
  a, b = ops
  if a.dtype != tc.dtype_in: raise OptError(f"TC: {tc.name} takes {tc.dtype_in.name}, the loads are {a.dtype.name}")
  if any(len(x.src[0].src) != 2 for x in (a, b)): raise OptError("TC: gated loads")
  ra, rb = _ranges_of(a.src[0]), _ranges_of(b.src[0])
  ia = [r for r in ra - rb if r.arg[1] == "global"]
  jb = [r for r in rb - ra if r.arg[1] == "global"]
  if len(ia) != 1 or len(jb) != 1 or k not in ra or k not in rb:
    raise OptError("TC: no single row axis of A and column axis of B")
  i, j = ia[0], jb[0]
  M, N, K = tc.dims
  for r, d, what in ((i, M, "rows"), (j, N, "columns"), (k, K, "reduce")):
    if _size(r) % d: raise OptError(f"TC: {what} {_size(r)} are not a multiple of {d}")
  return red, a, b, i, j, k


def apply_tc(ast: UOp, tc: TensorCore) -> UOp:
  """The transformation of the module docstring."""
  red, a, b, i, j, k = match(ast, tc)
  M, N, K = tc.dims
  next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
  def rng(n, rid, kind): return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), (rid, kind))
  io, jo, ko = rng(_size(i) // M, i.arg[0], "global"), rng(_size(j) // N, j.arg[0], "global"), rng(_size(k) // K, k.arg[0], "reduce")
  lane = rng(tc.threads, next_id, "warp")
  def at(tile_row, tile_col, fn, e):
    r, c = fn(lane, e)
    return tile_row + r, tile_col + c
  a_el, b_el = [], []
  for e in range(tc.n_a):
    r, c = at(io * M, ko * K, tc.a, e)
    a_el.append(substitute(a, {i: r, k: c}))
  for e in range(tc.n_b):
    r, c = at(ko * K, jo * N, tc.b, e)
    b_el.append(substitute(b, {k: r, j: c}))
  zero = UOp.const(dtypes.float32, 0.0)
  src = tuple(a_el + b_el + [zero] * tc.n_c)
  accs = [UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.WMMA, dtypes.float32, src, (tc.name, e)), ko), Ops.ADD) for e in range(tc.n_c)]
  stores = []
  for st in ast.src:
    for e in range(tc.n_c):
      r, c = at(io * M, jo * N, tc.c, e)
      stores.append(substitute(st, {red: accs[e], i: r, j: c}))
  return ast.replace(src=tuple(stores))
