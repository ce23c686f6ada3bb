"""Tensors on several devices: a value held as one lazy tensor per device, and the collectives that move it.

    x = Tensor(data).shard(("AMD", "AMD:1"), axis=0)    # rows split across two devices; x.device is the tuple
    w = Tensor(weights).to(("AMD", "AMD:1"))            # the same value on both (replicated: axis None)
    (x @ w).relu().sum()                                # per device; the sum over the shard axis ends in an allreduce

A multi-device tensor's UOp is `MULTI(shard_0, ..., shard_n-1)` with arg `(axis, bounds)`: shard i, a lazy tensor on
device i, holds the elements `bounds[i] = (start, end)` of the logical tensor along `axis` (axis None: every shard
holds all of it). Tensor ops build the logical graph as usual (autograd works on it unchanged); `lower` turns it into
one graph per device before scheduling, op by op (`Sharded` is a node's lowered value):
  * elementwise ops run per device once their operands agree on the layout (a replicated operand is cut to the
    other's shards locally; differently sharded ones are gathered first);
  * movement ops move the shard axis (reshape follows it where its bounds stay whole rows, else gathers first),
    pad and shrink on it change the bounds of the devices at the edges, flip mirrors them;
  * a reduction over the shard axis reduces each shard and then allreduces the partial results;
  * COPY to one device gathers, COPY from one device to a tuple broadcasts.

The collectives (broadcast, scatter, gather, reduce, allgather, reduce_scatter, allreduce) are built from per-device
kernels and copies between devices (Ops.COPY, run by hcq/transfer.py with cross-device signals). allreduce is a ring:
reduce_scatter then allgather, n-1 steps each; in each step every device sends one 1/n chunk to the next, so each
device sends (and receives) 2(n-1)/n of the data. The functions below take and return lists of per-device Tensors.
This module works on UOps and never imports tensor.py (which imports it); autograd's MULTI rule uses `shard_of`.
"""
from __future__ import annotations
from dataclasses import dataclass
from baregrad.compiler.uop import UOp, Ops, ELEMENTWISE, MOVEMENT, _derive
from baregrad.compiler.dtype import dtypes, truncate
from baregrad.compiler.schedule import reusable


def split_bounds(size: int, n: int) -> tuple[tuple[int, int], ...]:
  """(start, end) of n near-equal parts of `size` (numpy.array_split: the first size % n get one more)."""
  base, extra = divmod(size, n)
  out, start = [], 0
  for i in range(n):
    end = start + base + (1 if i < extra else 0)
    out.append((start, end)); start = end
  return tuple(out)


@dataclass(frozen=True)
class Sharded:
  """A lowered multi-device value: one single-device UOp per device, the shard axis (None: replicated) and bounds."""
  shards: tuple
  axis: int | None
  bounds: tuple | None

  @property
  def devices(self) -> tuple: return tuple(s.device for s in self.shards)
  @property
  def shape(self) -> tuple:
    shape = list(self.shards[0].shape)
    if self.axis is not None: shape[self.axis] = sum(e - b for b, e in self.bounds)
    return tuple(shape)
  def uop(self) -> UOp: return UOp(Ops.MULTI, self.shards[0].dtype, self.shards, (self.axis, self.bounds))


def multi_uop(shards, axis, bounds) -> UOp:
  return UOp(Ops.MULTI, shards[0].dtype, tuple(shards), (axis, None if axis is None else tuple(map(tuple, bounds))))


# ---------------- single-device UOp helpers ----------------
def _const(value, dtype, device) -> UOp:
  return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, None, (), device),), truncate(value, dtype))


def _shrink(u: UOp, axis: int, start: int, end: int) -> UOp:
  if (start, end) == (0, u.shape[axis]): return u
  return UOp(Ops.SHRINK, u.dtype, (u,), tuple((start, end) if i == axis else (0, s) for i, s in enumerate(u.shape)))


def _pad(u: UOp, axis: int, before: int, after: int) -> UOp:
  if not before and not after: return u
  pads = tuple((before, after) if i == axis else (0, 0) for i in range(len(u.shape)))
  return UOp(Ops.PAD, u.dtype, (u,), (pads, truncate(0, u.dtype)))


def _reshape(u: UOp, shape) -> UOp:
  shape = tuple(shape)
  if u.shape == shape: return u
  if u.op is Ops.RESHAPE: u = u.src[0]
  return u if u.shape == shape else UOp(Ops.RESHAPE, u.dtype, (u,), shape)


def copy_to(u: UOp, device: str) -> UOp:
  """`u` on `device` (a copy between devices, as Tensor.to makes it)."""
  if u.device == device: return u
  src = u if u.op is Ops.CONTIGUOUS else UOp(Ops.CONTIGUOUS, u.dtype, (u,))
  return UOp(Ops.COPY, u.dtype, (src,), device)


def _combine(op: Ops, a: UOp, b: UOp) -> UOp: return UOp(op, a.dtype, (a, b))


def concat(parts: list[tuple[UOp, int, int]], axis: int, size: int, device: str) -> UOp:
  """The tensor whose elements [start, end) on `axis` come from each (part, start, end), parts on `device` covering
  [0, size) without overlap: each part padded to the full size, chosen by position (exact: no arithmetic on values)."""
  parts = sorted((p for p in parts if p[2] > p[1]), key=lambda p: p[1])
  if len(parts) == 1: return parts[0][0]
  full = list(parts[0][0].shape); full[axis] = size
  ndim = len(full)
  idx = UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, None, (), device),), size)
  idx = _reshape(idx, tuple(size if i == axis else 1 for i in range(ndim)))
  idx = UOp(Ops.EXPAND, idx.dtype, (idx,), tuple(full)) if tuple(full) != idx.shape else idx
  out = _pad(parts[-1][0], axis, parts[-1][1], size - parts[-1][2])
  for part, start, end in reversed(parts[:-1]):
    lim = _const(end, dtypes.int32, device)
    lim = UOp(Ops.EXPAND, lim.dtype, (_reshape(lim, (1,) * ndim),), tuple(full))
    cond = UOp(Ops.CMPLT, dtypes.bool, (idx, lim))
    out = UOp(Ops.WHERE, out.dtype, (cond, _pad(part, axis, start, size - end), out))
  return out


# ---------------- collectives on per-device UOps ----------------
def broadcast_uops(u: UOp, devices) -> list[UOp]:
  """u (on one device) on every device: a copy from its device to each other one."""
  return [copy_to(u, d) for d in devices]


def scatter_uops(u: UOp, devices, axis: int) -> tuple[list[UOp], tuple]:
  """Part i of u along `axis` (split_bounds) on device i; returns (parts, bounds)."""
  bounds = split_bounds(u.shape[axis], len(devices))
  return [copy_to(_shrink(u, axis, b, e), d) for d, (b, e) in zip(devices, bounds)], bounds


def gather_uops(shards, axis: int | None, bounds, device: str) -> UOp:
  """The whole value on `device` from its shards (replicated: the copy already there, else the first one's)."""
  if axis is None:
    local = [s for s in shards if s.device == device]
    return local[0] if local else copy_to(shards[0], device)
  size = sum(e - b for b, e in bounds)
  return concat([(copy_to(s, device), b, e) for s, (b, e) in zip(shards, bounds) if e > b], axis, size, device)


def reduce_uops(parts, device: str, op: Ops = Ops.ADD) -> UOp:
  """op over the parts (one per device, same shape) on `device`: every other device sends its part there. Combined
  in the parts' order whatever the device, so that every device computing it gets the same bits."""
  out = None
  for p in parts:
    p = copy_to(p, device)
    out = p if out is None else _combine(op, out, p)
  return out


def allgather_uops(shards, axis: int | None, bounds) -> list[UOp]:
  """The whole value on every device that holds a shard (each receives the shards it lacks)."""
  return [gather_uops(shards, axis, bounds, s.device) for s in shards]


def _ring_chunks(parts):
  flat = [_reshape(p, (_numel(p.shape),)) for p in parts]
  return flat, split_bounds(flat[0].shape[0], len(parts))


def _numel(shape) -> int:
  n = 1
  for s in shape: n *= s
  return n


def _ring_reduce_scatter(parts, op: Ops):
  """Ring reduce-scatter of equal-shaped per-device parts, flattened: returns (chunk on device i, its bounds): device i
  ends with the full reduction of chunk i. In step s, device i sends its running chunk (i - s - 1) mod n to device
  i + 1, which combines it with its own (n - 1 steps, 1/n of the data per device per step)."""
  n = len(parts)
  flat, bounds = _ring_chunks(parts)
  acc = [[_shrink(f, 0, b, e) for b, e in bounds] for f in flat]
  devices = [p.device for p in parts]
  for step in range(n - 1):
    sends = []
    for i in range(n):
      j, to = (i - step - 1) % n, (i + 1) % n
      sends.append((to, j, copy_to(acc[i][j], devices[to])))
    for to, j, got in sends: acc[to][j] = _combine(op, acc[to][j], got)
  return [acc[i][i] for i in range(n)], bounds


def _ring_allgather(chunks, bounds, devices):
  """Ring allgather of chunk i (on device i): in step s device i passes chunk (i - s) mod n to device i + 1."""
  n = len(chunks)
  have = [{i: chunks[i]} for i in range(n)]
  for step in range(n - 1):
    sends = []
    for i in range(n):
      j, to = (i - step) % n, (i + 1) % n
      sends.append((to, j, copy_to(have[i][j], devices[to])))
    for to, j, got in sends: have[to][j] = got
  total = bounds[-1][1]
  return [concat([(have[i][j], b, e) for j, (b, e) in enumerate(bounds)], 0, total, devices[i]) for i in range(n)]


def reduce_scatter_uops(parts, op: Ops = Ops.ADD) -> tuple[list[UOp], tuple]:
  """op over the parts (one per device, same shape), flattened and split in n chunks: device i gets chunk i (ring)."""
  return _ring_reduce_scatter(parts, op)


# below this size an allreduce is latency-bound: every device sends its part to every other and combines them in one
# kernel (n - 1 copies out and one kernel per device, against the ring's 2(n - 1) copies and ~2n kernels), as NCCL
# picks its algorithm by message size
RING_MIN_BYTES = 64 * 1024


def allreduce_uops(parts, op: Ops = Ops.ADD, ring: bool | None = None) -> list[UOp]:
  """op over the parts (one per device, same shape) on every device: ring reduce_scatter, then ring allgather (each
  device sends 2(n-1)/n of the data); small parts (RING_MIN_BYTES, or ring=False) go to every device directly."""
  if len(parts) == 1: return list(parts)
  if ring is None: ring = _numel(parts[0].shape) * parts[0].dtype.itemsize >= RING_MIN_BYTES
  if not ring: return [reduce_uops(parts, p.device, op) for p in parts]
  shape = parts[0].shape
  chunks, bounds = _ring_reduce_scatter(parts, op)
  full = _ring_allgather(chunks, bounds, [p.device for p in parts])
  return [_reshape(f, shape) for f in full]


# ---------------- lowering a logical graph to per-device graphs ----------------
def _replicate(x: Sharded) -> Sharded:
  if x.axis is None: return x
  return Sharded(tuple(allgather_uops(x.shards, x.axis, x.bounds)), None, None)


def _reshard(x: Sharded, axis, bounds) -> Sharded:
  if x.axis == axis and (axis is None or x.bounds == bounds): return x
  x = _replicate(x)
  if axis is None: return x
  return Sharded(tuple(_shrink(s, axis, b, e) for s, (b, e) in zip(x.shards, bounds)), axis, tuple(bounds))


def _local_shape(shape, axis, bounds, i) -> tuple:
  """The shape of device i's part of a tensor of `shape`."""
  if axis is None: return tuple(shape)
  b, e = bounds[i]
  return tuple(e - b if k == axis else s for k, s in enumerate(shape))


def _reshape_axis(old, new, axis: int, bounds):
  """Where the shard axis goes in reshape old -> new, and its bounds, when every device's part stays a block of
  whole slices there; None when it does not (then the value is gathered first)."""
  before = _numel(old[:axis])
  k, acc = 0, 1
  while k < len(new) and acc < before: acc *= new[k]; k += 1
  if acc != before: return None
  while k < len(new) and new[k] == 1 and old[axis] != 1: k += 1
  if k >= len(new): return None
  if new[k] >= old[axis]:     # merged with the dims after it: the bounds scale by their product
    if new[k] % old[axis]: return None
    m = new[k] // old[axis]
    j, prod = axis + 1, 1
    while j < len(old) and prod < m: prod *= old[j]; j += 1
    if prod != m: return None
    return k, tuple((b * m, e * m) for b, e in bounds)
  # split: old[axis] = new[k] * q (q the product of the dims after k that it splits into)
  q, j = 1, k + 1
  while j < len(new) and new[k] * q < old[axis]: q *= new[j]; j += 1
  if new[k] * q != old[axis] or any(b % q or e % q for b, e in bounds): return None
  return k, tuple((b // q, e // q) for b, e in bounds)


class Lowering:
  """Lowers the logical graph of some tensors into per-device graphs: `value(node)` is a Sharded for a node on a
  tuple of devices, or the (rebuilt) single-device UOp for the others."""

  def __init__(self, reads_shifted=None):
    self.memo: dict[UOp, object] = {}
    self.reads_shifted = reads_shifted      # (value UOp, Buffer) -> must the assigned value be made contiguous first

  def run(self, outs: list[UOp]) -> list:
    outputs = set(outs)
    for n in UOp.sink(*outs).toposort():
      if n.op is Ops.SINK or n.op is Ops.DEVICE: continue
      # a node realized before is read from its buffers (as compiler/schedule.py's normalize does: an output is
      # computed again into buffers of its own, an assign that already ran never runs again)
      view = reusable(n) if n not in outputs or n.op is Ops.ASSIGN else None
      if view is not None and view.op is Ops.MULTI: self.memo[n] = Sharded(view.src, *view.arg)
      elif view is not None: self.memo[n] = n        # single-device: normalize puts its buffer in
      else: self.memo[n] = self.lower(n)
    return [self.memo[o] for o in outs]

  def get(self, n: UOp):
    return self.memo.get(n, n)

  def get_multi(self, n: UOp, why: str) -> Sharded:
    v = self.get(n)
    if not isinstance(v, Sharded):
      raise ValueError(f"{why}: an operand is on {n.device}, the others on several devices; move it with "
                       f".to(devices) or .shard(devices, axis)")
    return v

  def lower(self, n: UOp):
    if n.op is Ops.COPY: return self.copy(n)
    if not isinstance(n.device, tuple):
      src = tuple(self.get(s) for s in n.src)
      if any(isinstance(s, Sharded) for s in src):
        raise ValueError(f"{n.op.name}: mixes a tensor on several devices with one on {n.device}")
      return n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
    op = n.op
    if op is Ops.MULTI: return Sharded(tuple(self.get(s) for s in n.src), n.arg[0], n.arg[1])
    if op in (Ops.CONST, Ops.IOTA):
      return Sharded(tuple(n.replace(src=(UOp(Ops.DEVICE, None, (), d),)) for d in n.src[0].arg), None, None)
    if op is Ops.BIND:
      c = self.get_multi(n.src[1], "bind")
      return Sharded(tuple(n.replace(src=(n.src[0], s)) for s in c.shards), None, None)
    if op in ELEMENTWISE:
      xs = [self.get_multi(s, n.op.name.lower()) for s in n.src]
      target = next((x for x in xs if x.axis is not None), xs[0])
      xs = [_reshard(x, target.axis, target.bounds) for x in xs]
      return Sharded(tuple(n.replace(src=tuple(x.shards[i] for x in xs)) for i in range(len(target.shards))),
                     target.axis, target.bounds)
    if op in (Ops.CONTIGUOUS, Ops.DETACH):
      x = self.get_multi(n.src[0], op.name.lower())
      return Sharded(tuple(n.replace(src=(s,)) for s in x.shards), x.axis, x.bounds)
    if op in MOVEMENT: return self.movement(n, self.get_multi(n.src[0], op.name.lower()))
    if op is Ops.REDUCE_AXIS:
      x = self.get_multi(n.src[0], "reduce")
      rop, axes = n.arg
      parts = tuple(n.replace(src=(s,)) for s in x.shards)
      if x.axis is None or x.axis not in axes: return Sharded(parts, x.axis, x.bounds)
      return Sharded(tuple(allreduce_uops(list(parts), rop)), None, None)
    if op is Ops.ASSIGN: return self.assign(n)
    raise NotImplementedError(f"{op.name} on a tensor on several devices ({n.device}) is not supported")

  def movement(self, n: UOp, x: Sharded) -> Sharded:
    op, axis, bounds = n.op, x.axis, x.bounds
    old = n.src[0].shape
    if op is Ops.PERMUTE:
      return Sharded(tuple(n.replace(src=(s,)) for s in x.shards), None if axis is None else n.arg.index(axis), bounds)
    if axis is None: return Sharded(tuple(n.replace(src=(s,)) for s in x.shards), None, None)
    if op is Ops.RESHAPE:
      found = _reshape_axis(old, n.arg, axis, bounds)
      if found is None: return self.movement(n, _replicate(x))
      k, nb = found
      return Sharded(tuple(_reshape(s, _local_shape(n.arg, k, nb, i)) for i, s in enumerate(x.shards)), k, nb)
    if op is Ops.EXPAND:
      if n.arg[axis] != old[axis]: return self.movement(n, _replicate(x))
      return Sharded(tuple(n.replace(src=(s,), arg=_local_shape(n.arg, axis, bounds, i)) for i, s in enumerate(x.shards)),
                     axis, bounds)
    if op is Ops.FLIP:
      size = old[axis]
      nb = tuple((size - e, size - b) for b, e in bounds) if axis in n.arg else bounds
      return Sharded(tuple(n.replace(src=(s,)) for s in x.shards), axis, nb)
    if op is Ops.SHRINK:
      lo, hi = n.arg[axis]
      shards, nb = [], []
      for s, (b, e) in zip(x.shards, bounds):
        sb, se = max(b, lo), min(e, hi)
        if sb >= se: sb = se = min(max(b, lo), hi)     # this device keeps nothing
        rng = tuple((sb - b, se - b) if k == axis else r for k, r in enumerate(n.arg))
        shards.append(s if all(r == (0, d) for r, d in zip(rng, s.shape)) else n.replace(src=(s,), arg=rng))
        nb.append((sb - lo, se - lo))
      return Sharded(tuple(shards), axis, tuple(nb))
    if op is Ops.PAD:
      pads, value = n.arg
      before, after = pads[axis]
      if (before, after) == (0, 0): return Sharded(tuple(n.replace(src=(s,)) for s in x.shards), axis, bounds)
      order = sorted(range(len(bounds)), key=lambda i: bounds[i])
      if any(bounds[order[k]][1] != bounds[order[k + 1]][0] for k in range(len(order) - 1)):
        return self.movement(n, _replicate(x))
      first, last = order[0], order[-1]
      shards, nb = [], []
      for i, (s, (b, e)) in enumerate(zip(x.shards, bounds)):
        mine = (before if i == first else 0, after if i == last else 0)
        p = tuple(mine if k == axis else pr for k, pr in enumerate(pads))
        shards.append(s if all(pr == (0, 0) for pr in p) else n.replace(src=(s,), arg=(p, value)))
        nb.append((b + (before if i != first else 0), e + before + (after if i == last else 0)))
      return Sharded(tuple(shards), axis, tuple(nb))
    raise NotImplementedError(f"{op.name} on a tensor on several devices")

  def copy(self, n: UOp):
    target, x = n.arg, self.get(n.src[0])
    if isinstance(target, tuple):
      if not isinstance(x, Sharded): return Sharded(tuple(broadcast_uops(x, target)), None, None)
      if x.devices == target: return x
      if len(x.devices) == len(target):
        return Sharded(tuple(copy_to(s, d) for s, d in zip(x.shards, target)), x.axis, x.bounds)
      if x.axis is None: return Sharded(tuple(broadcast_uops(x.shards[0], target)), None, None)
      whole = gather_uops(x.shards, x.axis, x.bounds, target[0])
      parts, nb = scatter_uops(whole, target, x.axis)
      return Sharded(tuple(parts), x.axis, nb)
    if isinstance(x, Sharded): return gather_uops(x.shards, x.axis, x.bounds, target)
    return n.replace(src=(x,))

  def assign(self, n: UOp) -> Sharded:
    target = self.get_multi(n.src[0], "assign")
    value = _reshard(self.get_multi(n.src[1], "assign"), target.axis, target.bounds)
    out = []
    for t, v in zip(target.shards, value.shards):
      base = t
      while base.op in MOVEMENT: base = base.src[0]
      if self.reads_shifted is not None and base.op is Ops.BUFFER and self.reads_shifted(v, base.arg, t):
        v = UOp(Ops.CONTIGUOUS, v.dtype, (v,))
      out.append(UOp(Ops.ASSIGN, t.dtype, (t, v)))
    return Sharded(tuple(out), target.axis, target.bounds)


def involves_several_devices(u: UOp) -> bool:
  """Does u's graph hold a node on several devices (cached on every node, so each is looked at once)?"""
  d = u.__dict__
  return d["several"] if "several" in d else _derive(u, "several", _several)


def on_several(u: UOp) -> bool:
  """Is u itself a node on several devices (a MULTI, or a DEVICE or COPY naming a tuple of devices)?"""
  op = u.op
  return op is Ops.MULTI or ((op is Ops.DEVICE or op is Ops.COPY) and isinstance(u.arg, tuple))


def _several(u: UOp) -> bool:
  if on_several(u): return True
  for s in u.src:
    if s.__dict__["several"]: return True
  return False


def lower(outs: list[UOp], reads_shifted=None) -> list:
  """Each output's lowered value: a Sharded for an output on several devices, else a single-device UOp."""
  return Lowering(reads_shifted).run(outs)


# ---------------- autograd: the gradient of one shard ----------------
def shard_gradients(node: UOp, g) -> tuple:
  """d loss / d each shard of MULTI `node`, from g = d loss / d node (a Tensor on node's devices). Replicated: the
  shards hold one value, and its gradient goes to the first."""
  axis, bounds = node.arg
  if axis is None: return (g.to(node.src[0].device),) + (None,) * (len(node.src) - 1)
  return tuple(g.shrink(tuple(bounds[i] if k == axis else None for k in range(g.ndim))).to(s.device)
               for i, s in enumerate(node.src))


# ---------------- the collectives on Tensors: one Tensor per device in, one per device out ----------------
_OPS = {"sum": Ops.ADD, "max": Ops.MAX, "prod": Ops.MUL}


def _op(op: str) -> Ops:
  if op not in _OPS: raise ValueError(f"reduction op must be one of {', '.join(_OPS)}, got {op!r}")
  return _OPS[op]


def _devices_of(xs, what: str) -> tuple:
  xs = list(xs)
  if not xs: raise ValueError(f"{what}: needs at least one tensor")
  devices = tuple(x.device for x in xs)
  if any(isinstance(d, tuple) for d in devices):
    raise ValueError(f"{what}: takes one tensor per device (each on one device), got devices {devices}")
  if len(set(devices)) != len(devices): raise ValueError(f"{what}: two tensors on one device: {devices}")
  return devices


def _same_shape(xs, what: str):
  shapes = {x.shape for x in xs}
  if len(shapes) != 1: raise ValueError(f"{what}: the tensors must have one shape, got {sorted(shapes)}")


def _canonical(devices) -> tuple:
  from baregrad.hcq.device import canonical
  return tuple(canonical(d) for d in devices)


def broadcast(x, devices) -> list:
  """x (on one device) on each of `devices`."""
  return [type(x)(u) for u in broadcast_uops(x.uop, _canonical(devices))]


def scatter(x, devices, axis: int = 0) -> list:
  """Part i of x along `axis` on device i (near-equal parts: split_bounds)."""
  axis = axis + x.ndim if axis < 0 else axis
  parts, _ = scatter_uops(x.uop, _canonical(devices), axis)
  return [type(x)(u) for u in parts]


def gather(xs, device: str, axis: int = 0):
  """The tensors (one per device) put together along `axis` on `device` (numpy.concatenate)."""
  devices = _devices_of(xs, "gather")
  (device,) = _canonical((device,))
  x0 = xs[0]
  axis = axis + x0.ndim if axis < 0 else axis
  sizes = [x.shape[axis] for x in xs]
  starts = [sum(sizes[:i]) for i in range(len(xs))]
  bounds = tuple((s, s + n) for s, n in zip(starts, sizes))
  if not any(e > b for b, e in bounds): return type(x0)(copy_to(x0.uop, device))
  del devices
  return type(x0)(gather_uops([x.uop for x in xs], axis, bounds, device))


def reduce(xs, device: str, op: str = "sum"):
  """op over the tensors (one per device, one shape), on `device`."""
  _devices_of(xs, "reduce"); _same_shape(xs, "reduce")
  (device,) = _canonical((device,))
  return type(xs[0])(reduce_uops([x.uop for x in xs], device, _op(op)))


def allgather(xs, axis: int = 0) -> list:
  """Every device gets the tensors (one per device) put together along `axis`."""
  _devices_of(xs, "allgather")
  x0 = xs[0]
  axis = axis + x0.ndim if axis < 0 else axis
  sizes = [x.shape[axis] for x in xs]
  bounds = tuple((sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(len(xs)))
  return [type(x0)(u) for u in allgather_uops([x.uop for x in xs], axis, bounds)]


def reduce_scatter(xs, op: str = "sum") -> list:
  """op over the tensors (one per device, one shape), flattened and split into n near-equal chunks: chunk i on
  device i (a ring: n - 1 steps, each device sending 1/n of the data per step)."""
  _devices_of(xs, "reduce_scatter"); _same_shape(xs, "reduce_scatter")
  if len(xs) == 1: return [xs[0].reshape(-1)]
  chunks, _ = reduce_scatter_uops([x.uop for x in xs], _op(op))
  return [type(xs[0])(u) for u in chunks]


def allreduce(xs, op: str = "sum", ring: bool | None = None) -> list:
  """op over the tensors (one per device, one shape) on every device: ring reduce_scatter + ring allgather, each
  device sending 2(n - 1)/n of the data (ring=None: parts under RING_MIN_BYTES go to every device directly)."""
  _devices_of(xs, "allreduce"); _same_shape(xs, "allreduce")
  return [type(xs[0])(u) for u in allreduce_uops([x.uop for x in xs], _op(op), ring)]


def shards(x) -> list:
  """The per-device tensors of a tensor on several devices (each device's part), or [x] for a tensor on one."""
  if not isinstance(x.device, tuple): return [x]
  if x.uop.op is not Ops.MULTI: x = x.contiguous().realize()
  return [type(x)(s) for s in x.uop.src]


def from_shards(xs, axis: int | None = None):
  """One tensor on the tensors' devices: their parts put together along `axis`, or with axis None copies of one
  value (the tensors must then be equal)."""
  devices = _devices_of(xs, "from_shards")
  del devices
  x0 = xs[0]
  if axis is None:
    _same_shape(xs, "from_shards")
    return type(x0)(multi_uop([x.uop for x in xs], None, None))
  axis = axis + x0.ndim if axis < 0 else axis
  sizes = [x.shape[axis] for x in xs]
  bounds = tuple((sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(len(xs)))
  return type(x0)(multi_uop([x.uop for x in xs], axis, bounds))
