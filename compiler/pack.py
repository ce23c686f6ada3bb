"""Matmul packing: a rewrite of the Tensor graph, before rangeify, for the CPU device.

The Tensor layer builds every matmul the same way on every device: REDUCE_AXIS(ADD) over the last axis of
MUL(A, B), shapes (..., n, m, k), with A broadcast along m and B along n. Its kernel reads B's elements for
neighbouring columns k apart, rows 4*m bytes apart, which alias to a few cache sets and miss in L1 and L2.
On the CPU a large one is rewritten here: B is first copied (a kernel of its own) into strips of shape
(m/W, k, W), and the product walks one contiguous W-wide strip per column block:

    B (k, m) --copy--> strips (m/W, k, W);  out[i, jb*W + l] = sum over kk of A[i, kk] * strips[jb, kk, l]

The copy costs O(k*m); it pays for itself once the product is big enough (`matmul_pack_width`).
compiler/schedule.py applies `pack_matmuls` to every graph; it packs only when kernel optimizations are on (OPT).
A float32 sum of 16-bit float products on the CPU gets exact float32 products either way (`_exact_products`), so
its result does not depend on OPT."""
from __future__ import annotations
import math
from .uop import UOp, Ops
from .dtype import dtypes
from .opt import has_avx512


def matmul_pack_width(device: str, dtype, n: int, k: int, m: int, batch: int = 1) -> int:
  """Lanes W of the packed layout the CPU device wants for the right operand of `batch` (n,k)@(k,m) matmuls, or 0:
  one strip row is one vector register (64 bytes with AVX-512, else 32)."""
  if device != "CPU" or dtype not in (dtypes.float32, dtypes.float64): return 0
  w = (64 if has_avx512() else 32) // dtype.itemsize
  if m % w or m < 2 * w or k < 16 or n < 4 or batch * n * k * m < (1 << 20): return 0
  return w


def matmul_operands(node: UOp) -> tuple[UOp, UOp, tuple[int, ...]] | None:
  """(A, B, perm) when `node` is a matmul's reduction, else None: REDUCE_AXIS(ADD) over one of the last three axes
  of MUL(EXPAND(A), EXPAND(B)), A broadcast along another of them (the output's columns) and B along the third
  (its rows). `perm` orders the axes (batch..., rows, columns, reduced): PERMUTE(A, perm) has shape
  (..., n, 1, k) and PERMUTE(B, perm) (..., 1, m, k). The Tensor layer's matmul has perm = identity; the gradient
  dA = dOut @ B.T reduces over the middle axis, dB = A.T @ dOut over the first of the three (when large: its A is
  read down the columns, so it is copied into row panels too, `_panels`)."""
  if node.op is not Ops.REDUCE_AXIS or node.arg[0] is not Ops.ADD or len(node.arg[1]) != 1: return None
  product, (r,) = node.src[0], node.arg[1]
  if product.op is Ops.CAST and product.src[0].op is Ops.MUL: product = product.src[0]   # 16-bit floats: f32 sums
  rank = len(product.shape)
  if product.op is not Ops.MUL or rank < 3 or r < rank - 3: return None
  # a reduction over the first of the three axes (dW = A.T @ dOut as autograd builds it) reads A down its columns
  # unpacked: packed from 16M multiply-adds (A into row panels, dOut into strips), where the operands outgrow L2
  # (1024 x 1024 x 1024: 12.5 -> 68 GFLOP/s on 2 cores; 64 x 64 x 1024 runs faster unpacked, 26 vs 17)
  dims = product.shape[-3:]
  if r == rank - 3 and (not all(isinstance(d, int) for d in dims) or math.prod(dims) < (1 << 24)): return None
  full = product.shape
  for a, b in (product.src, product.src[::-1]):
    if a.op is not Ops.EXPAND or b.op is not Ops.EXPAND: continue
    sa, sb = a.src[0].shape, b.src[0].shape
    if len(sa) != rank or len(sb) != rank or sa[r] != full[r] or sb[r] != full[r]: continue
    others = [d for d in range(rank - 3, rank) if d != r]
    for i, j in (others, others[::-1]):   # i: rows (B broadcast), j: columns (A broadcast)
      if sa[i] == full[i] and sa[j] == 1 and sb[i] == 1 and sb[j] == full[j]:
        return a.src[0], b.src[0], (*range(rank - 3), i, j, r)
  return None


def _reshape(u: UOp, shape: tuple) -> UOp:
  """u viewed as `shape` (a RESHAPE of a RESHAPE is one RESHAPE, as Tensor.reshape builds it)."""
  src = u.src[0] if u.op is Ops.RESHAPE else u
  return src if src.shape == shape else UOp(Ops.RESHAPE, u.dtype, (src,), shape)


def _transposed(a: UOp) -> bool:
  """Does the view A (..., n, 1, k) read its reduced axis k across memory, not along it (A = x.T of a weight
  gradient x.T @ dy: each step of k is a row of x)? Looks through the movement ops above its source."""
  u, moved = a, False
  while u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE):
    moved |= u.op is Ops.PERMUTE and u.arg[-1] != len(u.arg) - 1
    u = u.src[0]
  # (a computed A with a reduction in it, a matmul's result, has no layout yet: the panel copy would compute it)
  return moved and not _computes_a_reduction(u)


def _computes_a_reduction(u: UOp) -> bool:
  """Does `u` reduce something on the way from the stored values it reads (BUFFER, CONTIGUOUS)?"""
  seen, stack = set(), [u]
  while stack:
    n = stack.pop()
    if n.op is Ops.REDUCE_AXIS: return True
    if n.op in (Ops.BUFFER, Ops.CONTIGUOUS) or n in seen: continue
    seen.add(n)
    stack.extend(n.src)
  return False


def _panels(a: UOp, n: int, k: int, p: int) -> UOp:
  """A (..., n, 1, k) read as (..., n, 1, k, 1) from a copy in panels of p rows, (..., n/p, k, p): the register
  tile's p rows of one step of k are p neighbouring floats (x.T @ dy: x[k, i:i+p] was a new row of x, a new line
  and page, each step)."""
  nb = len(a.shape) - 3
  panels = _reshape(a, (*a.shape[:-3], n // p, p, k))
  panels = UOp(Ops.PERMUTE, a.dtype, (panels,), (*range(nb + 1), nb + 2, nb + 1))          # (..., n/p, k, p)
  panels = UOp(Ops.CONTIGUOUS, a.dtype, (panels,))
  rows = UOp(Ops.PERMUTE, a.dtype, (panels,), (*range(nb + 1), nb + 2, nb + 1))            # (..., n/p, p, k)
  return _reshape(_reshape(rows, (*a.shape[:-3], n, k)), (*a.shape[:-3], n, 1, k, 1))


def _packed_matmul(node: UOp, a: UOp, b: UOp, w: int) -> UOp:
  """The reduction `node` of A @ B, computed from B copied into (..., m/w, k, w) strips (and a transposed A into
  row panels, `_panels`); same shape as node."""
  *batch, n, m, k = node.src[0].shape
  dtype = node.src[0].dtype
  nb = len(batch)
  strips = _reshape(b, (*b.shape[:-3], m // w, w, k))
  strips = UOp(Ops.PERMUTE, b.dtype, (strips,), (*range(nb + 1), nb + 2, nb + 1))   # (..., m/w, k, w)
  strips = _reshape(UOp(Ops.CONTIGUOUS, b.dtype, (strips,)), (*b.shape[:-3], 1, m // w, k, w))
  p = 8 if has_avx512() else 4      # the rows of the CPU's register tile (compiler/opt.py)
  if _transposed(a) and n % p == 0: rows = _panels(a, n, k, p)
  else: rows = _reshape(a, (*a.shape[:-3], n, 1, k, 1))
  full = (*batch, n, m // w, k, w)
  product = UOp(Ops.MUL, dtype, (UOp(Ops.EXPAND, a.dtype, (rows,), full), UOp(Ops.EXPAND, b.dtype, (strips,), full)))
  total = UOp(Ops.REDUCE_AXIS, node.dtype, (product,), (Ops.ADD, (nb + 2,)))   # (..., n, m/w, 1, w)
  return UOp(Ops.RESHAPE, node.dtype, (total,), node.shape)


def _permute(u: UOp, perm: tuple) -> UOp:
  return u if perm == tuple(range(len(perm))) else UOp(Ops.PERMUTE, u.dtype, (u,), perm)


def _packed(node: UOp) -> UOp | None:
  """`node` computed with B packed into strips (see the top), same shape, or None when it is no matmul worth it."""
  if (operands := matmul_operands(node)) is None: return None
  a, b, perm = operands
  a, b = _permute(a, perm), _permute(b, perm)            # (..., n, 1, k) and (..., 1, m, k)
  n, m, k = a.shape[-3], b.shape[-2], a.shape[-1]
  if not all(isinstance(x, int) for x in node.src[0].shape): return None     # a symbolic size: never packed
  if node.dtype == dtypes.float32 and a.dtype == b.dtype and a.dtype in (dtypes.float16, dtypes.bfloat16):
    # a product of two 16-bit float operands, summed in float32 (the Tensor layer's matmul): computed in float32
    # from float32 copies (B's is its packed strips), each product exact rather than rounded to 16 bits. The CPU has
    # no 16-bit float arithmetic: unpacked, every product was converted and rounded one scalar at a time (512^3:
    # 0.002 TFLOP/s)
    a, b = UOp(Ops.CAST, dtypes.float32, (a,)), UOp(Ops.CAST, dtypes.float32, (b,))
  elif a.dtype != b.dtype or node.dtype != a.dtype or _narrower_source(b): return None
  if not (w := matmul_pack_width(node.device, node.dtype, n, k, m, math.prod(node.src[0].shape[:-3]))): return None
  full = (*node.src[0].shape[:-3], n, m, k)
  canonical = UOp(Ops.REDUCE_AXIS, node.dtype, (UOp(Ops.MUL, node.dtype, (UOp(Ops.EXPAND, a.dtype, (a,), full),
                  UOp(Ops.EXPAND, b.dtype, (b,), full))),), (Ops.ADD, (len(full) - 1,)))
  inverse = tuple(sorted(range(len(perm)), key=lambda d: perm[d]))
  return _permute(_packed_matmul(canonical, a, b, w), inverse)


def _narrower_source(b: UOp) -> bool:
  """Is B computed from memory of a narrower type than its own (a float16/bfloat16 weight, quantized blocks)? Such
  a weight is converted in registers by the product that reads it: packing would store a full copy in the wide type
  (2-8x the weight's bytes) on every call."""
  return any(u.op is Ops.BUFFER and u.dtype.itemsize < b.dtype.itemsize for u in b.toposort())


def _exact_products(node: UOp) -> UOp | None:
  """A float32 sum of products of two 16-bit float operands on the CPU (a matmul the packing above leaves alone: a
  matvec, a small one), with each product computed in float32 from the converted operands, exact, as numpy computes
  float16 products, instead of rounded to 16 bits: the CPU has no 16-bit float arithmetic, and the rounding
  round trip kept the kernel from vectorizing (a 2048x2048 float16 matvec ran at 3.2 GB/s, x @ W at 1.1)."""
  if node.op is not Ops.REDUCE_AXIS or node.arg[0] is not Ops.ADD or node.dtype != dtypes.float32: return None
  if not isinstance(node.device, str) or node.device.partition(":")[0] != "CPU": return None
  cast = node.src[0]
  if cast.op is not Ops.CAST or cast.src[0].op is not Ops.MUL: return None
  mul = cast.src[0]
  if mul.dtype not in (dtypes.float16, dtypes.bfloat16) or any(s.dtype != mul.dtype for s in mul.src): return None
  return node.replace(src=(UOp(Ops.MUL, dtypes.float32, tuple(UOp(Ops.CAST, dtypes.float32, (s,)) for s in mul.src)),))


def pack_matmuls(sink: UOp, pack: bool = True) -> tuple[UOp, dict]:
  """`sink` with each large CPU matmul computed from its right operand packed into strips (see the top; `pack`
  false: none, OPT=0) and 16-bit float products summed in float32 made exact (`_exact_products`), and the
  node of `sink` each node of the result stands for (new -> old; the copies and packed products added have none):
  what the schedule materializes is recorded under the caller's nodes, so a later realize reads those values
  instead of computing them again. Bottom-up: a matmul whose operand holds another matmul reads that one's packed
  form."""
  done: dict[UOp, UOp] = {}
  back: dict[UOp, UOp] = {}
  for node in sink.toposort():
    src = tuple(done[s] for s in node.src)
    new = node if all(x is y for x, y in zip(src, node.src)) else node.replace(src=src)
    if pack and (packed := _packed(new)) is not None:
      total = packed
      while total.op is Ops.RESHAPE: total = total.src[0]
      back[total] = node        # the packed product's reduction holds node's values in node's order (no permute)
      new = packed
    elif (exact := _exact_products(new)) is not None: new = exact
    done[node] = new
    back[new] = node
  return done[sink], back
