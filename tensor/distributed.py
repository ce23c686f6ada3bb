"""Across processes and hosts: collectives on MPI (mpi4py over the MPI the machine has, e.g. Open MPI).

    mpirun -np 4 --hostfile hosts python train.py

    from baregrad.tensor import distributed as dist
    world = dist.init()                       # rank, size, local rank -> this process's device (AMD:{local_rank}, ...)
    g = dist.allreduce(grad, "mean")          # any Tensor: on the CPU, a GPU, or several devices of this process
    w = dist.broadcast(w, root=0)

`init()` takes the MPI world (or a communicator) and picks this process's device: the default device kind (DEV) with
the process's rank among the processes on its host (`AMD`, `AMD:1`, ...; every rank uses `CPU` on the CPU). The
collectives take Tensors and return new Tensors on the same device(s) with the same dtype (float16 and bfloat16
travel as 16-bit values and are reduced by baregrad's own MPI operations):
  allreduce(t, op)            op over every rank's t: "sum", "mean", "max", "min", "prod"
  broadcast(t, root)          root's t on every rank (t: a tensor of the same shape and dtype on the others)
  allgather(t, axis)          every rank's t put together along axis (in rank order; sizes may differ on that axis)
  reduce_scatter(t, op, axis) this rank's part (tensor/multi.py split_bounds) of the reduction along axis
  barrier()
For data-parallel training: broadcast_parameters(params) once, then in each step after backward
average_gradients(params, loss, weight) (one allreduce for every gradient and the loss; tools/demo.py --distributed).
A tensor on several devices of this process is one value: a replicated one is reduced once per process, a sharded
one shard by shard. A list of per-device tensors is a set of partial values (e.g. one gradient per local GPU): they
are reduced in the process first (tensor/multi.py's collectives, device to device), then once across processes, and
the result is broadcast back to each device.

Data movement: device -> host staging -> MPI -> staging -> device. An allreduce or broadcast moves 4 MiB chunks: the
copy of chunk i+1 off the device runs while MPI reduces chunk i (nonblocking collectives). CPU tensors live in host
memory, so MPI reads and writes their buffers directly (no staging).

Under @jit (tensor/jit.py): a collective inside the jitted function runs MPI on the host as it is called; while the
function is captured it leaves a host step in the captured work (hcq/segmented.py). A replay then runs the device
work before the collective from prebuilt queues, waits for it, does the MPI part on the host, and replays the device
work after it. Every rank must replay the same function (collectives match in call order).

Failures end every rank: every wait on MPI polls with the timeout of `init` (default: the TIMEOUT setting) and
raises `DistributedError` past it. Before each collective the ranks exchange what they pass (collective, shape,
dtype, op, root): a mismatch raises on every rank with each rank's shape named. An exception that escapes a rank
(installed by `init` as sys.excepthook) is sent to the other ranks, which raise `DistributedError("rank R failed:
...")` in their next wait on MPI and print it; then the job is aborted (MPI_Abort), so no rank hangs.
"""
from __future__ import annotations
import collections, os, sys, threading, time, zlib
from dataclasses import dataclass
import numpy as np
from baregrad.compiler.dtype import dtypes, DType
from baregrad.compiler.uop import UOp, Ops
from baregrad.drivers import settings
from baregrad.hcq import runtime
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.device import Device
from baregrad.hcq.segmented import HostStep
from .tensor import Tensor, _is_realized
from . import multi as _multi

CHUNK = 4 << 20                 # bytes per pipelined piece of an allreduce / broadcast through host staging
OPS = ("sum", "mean", "max", "min", "prod")
KINDS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier")
TAG_FAILED, TAG_ACK = 7001, 7002
INSTALL_HINT = ("baregrad's collectives across processes need mpi4py and an MPI implementation: "
                "apt install openmpi-bin libopenmpi-dev && pip install -e '.[distributed]'")


class DistributedError(RuntimeError):
  """A collective across processes failed: a rank failed or did not arrive in time, or the ranks disagree."""
  def __init__(self, message: str, rank: int | None = None, everywhere: bool = False):
    super().__init__(message)
    self.rank = rank               # the rank that failed (None: not known)
    self.everywhere = everywhere   # every rank raises this same error (a mismatch they all saw): no rank to notify


@dataclass
class World:
  rank: int
  size: int
  local_rank: int
  local_size: int
  device: str
  timeout: float
  comm: object                  # the communicator collectives run on (a duplicate of the one init was given)
  ctl: object                   # a second duplicate: failure notices
  seq: int = 0                  # collectives called so far (the ranks compare it)
  failed_from: int | None = None

  def __repr__(self):
    return f"<World rank {self.rank}/{self.size} local {self.local_rank}/{self.local_size} {self.device}>"


_world: World | None = None
_MPI = None
_lock = threading.Lock()


def _mpi():
  global _MPI
  if _MPI is None:
    try:
      from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as e:    # (a binary mpi4py without an MPI library fails to load it)
      raise ImportError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from None
    _MPI = MPI
  return _MPI


def init(comm=None, device: str | None = None, timeout: float | None = None) -> World:
  """Join the MPI world (or `comm`); returns this process's World. Idempotent: a second call returns the same World."""
  global _world
  with _lock:
    if _world is not None: return _world
    MPI = _mpi()
    base = MPI.COMM_WORLD if comm is None else comm
    if timeout is not None and not timeout > 0: raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    local = base.Split_type(MPI.COMM_TYPE_SHARED, key=base.Get_rank())
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    if device is None:
      kind = Device.default().partition(":")[0]
      device = kind if kind == "CPU" or local_rank == 0 else f"{kind}:{local_rank}"
    w = World(base.Get_rank(), base.Get_size(), local_rank, local_size, device,
              float(settings.TIMEOUT if timeout is None else timeout), base.Dup(), base.Dup())
    w._notice = bytearray(4096)
    w._notice_req = w.ctl.Irecv([w._notice, MPI.BYTE], source=MPI.ANY_SOURCE, tag=TAG_FAILED)
    _world = w
    _install_excepthook()
    return w


def world() -> World:
  if _world is None: raise RuntimeError("baregrad.tensor.distributed: call init() first (it joins the MPI world)")
  return _world


def rank() -> int: return world().rank
def size() -> int: return world().size


# ---------------------------------------------------------------- waiting, failures
def _wait(req, what: str):
  """Wait for an MPI request, watching for another rank's failure and for the timeout."""
  w = world()
  start = time.monotonic()
  deadline = start + w.timeout
  spins = 0
  while not req.Test():       # (a nonblocking collective advances only inside MPI calls: Test as often as we can)
    spins += 1
    if spins & 63 == 0:
      _check_notice(w)
      now = time.monotonic()
      # yield the core to the other ranks (oversubscribed), then after a second of waiting poll every millisecond
      if now - start < 1.0: os.sched_yield()
      else: time.sleep(0.001)
      if now > deadline:
        raise DistributedError(f"rank {w.rank}: {what} did not complete within {w.timeout:g} s: another rank did "
                               f"not reach it (stopped, hung, or called a different collective); set the timeout "
                               f"with init(timeout=) or TIMEOUT")
  _check_notice(w)


def _check_notice(w: World):
  st = _mpi().Status()
  if w.failed_from is None and w._notice_req.Test(st):
    src = st.Get_source()
    text = bytes(w._notice[:st.Get_count(_mpi().BYTE)]).decode(errors="replace")
    w.failed_from = src
    msg = f"rank {src} failed: {text}"
    print(f"baregrad.distributed: rank {w.rank}: {msg}; stopping", file=sys.stderr, flush=True)
    try: w.ctl.Send([b"1", _mpi().BYTE], dest=src, tag=TAG_ACK)
    except Exception: pass
    raise DistributedError(msg, rank=src)


_previous_hook = None


def _install_excepthook():
  global _previous_hook
  if _previous_hook is not None: return
  _previous_hook = sys.excepthook
  sys.excepthook = _excepthook


def _excepthook(tp, exc, tb):
  _previous_hook(tp, exc, tb)
  w = _world
  if w is None or w.size == 1: return
  try:
    sys.stderr.flush()
    if isinstance(exc, DistributedError) and exc.rank is not None:
      # another rank failed and aborts the job once every rank has seen it (each printed it first); wait for that,
      # then abort ourselves in case it cannot
      time.sleep(min(w.timeout, 10.0))
    elif isinstance(exc, DistributedError) and exc.everywhere:
      time.sleep(0.5)           # every rank raised this: let each print it
    else:
      _notify_failure(w, f"{tp.__name__}: {exc}")
  finally:
    w.comm.Abort(1)


def _notify_failure(w: World, text: str):
  """Tell every other rank that this one failed; wait (bounded) until each has seen it, so that each names it."""
  MPI = _mpi()
  data = text.encode()[:4000]
  print(f"baregrad.distributed: rank {w.rank} failed ({text.splitlines()[0] if text else ''}); stopping every rank",
        file=sys.stderr, flush=True)
  reqs = [w.ctl.Isend([data, MPI.BYTE], dest=r, tag=TAG_FAILED) for r in range(w.size) if r != w.rank]
  acks = [bytearray(1) for _ in range(w.size)]
  reqs += [w.ctl.Irecv([acks[r], MPI.BYTE], source=r, tag=TAG_ACK) for r in range(w.size) if r != w.rank]
  deadline = time.monotonic() + min(w.timeout, 5.0)
  while time.monotonic() < deadline and not MPI.Request.Testall(reqs): time.sleep(0.001)


# ---------------------------------------------------------------- agreement between ranks
def _describe(kind: str, shape, dtype: DType, op: str = "", arg: int = 0) -> np.ndarray:
  d = np.zeros(16, np.int64)
  d[0], d[1], d[2] = world().seq, KINDS.index(kind), (OPS.index(op) + 1 if op else 0)
  d[3], d[4], d[5] = zlib.crc32(dtype.name.encode()), arg, len(shape)
  for i, s in enumerate(shape[:9]): d[6 + i] = s
  d[15] = zlib.crc32(repr(tuple(shape)).encode())
  return d


def _agree(kind: str, shape, dtype: DType, op: str = "", arg: int = 0, free_axis: int | None = None) -> np.ndarray:
  """Every rank's description of this collective (one row per rank); raise on every rank when they differ."""
  w = world()
  w.seq += 1
  mine = _describe(kind, shape, dtype, op, arg)
  rows = np.empty((w.size, 16), np.int64)
  _wait(w.comm.Iallgather([mine, _mpi().INT64_T], [rows, _mpi().INT64_T]), f"{kind} #{w.seq} (agreeing on its arguments)")
  cols = [c for c in range(16) if c != 15 and (free_axis is None or c != 6 + free_axis)]
  if free_axis is not None and free_axis >= 9: cols = [c for c in cols if c < 6]     # shape beyond what rows hold
  if (rows[:, cols] != rows[0, cols]).any() or (free_axis is None and (rows[:, 15] != rows[0, 15]).any()):
    def says(r):
      row = rows[r]
      name = KINDS[row[1]] if 0 <= row[1] < len(KINDS) else "?"
      op_name = f" {OPS[row[2] - 1]}" if row[2] else ""
      shp = tuple(int(x) for x in row[6:6 + min(int(row[5]), 9)])
      return f"rank {r}: {name} #{row[0]}{op_name} of shape {shp}" + (f" (root/axis {row[4]})" if row[4] else "")
    dtypes_differ = (rows[:, 3] != rows[0, 3]).any()
    raise DistributedError(f"the ranks called {kind} with different arguments"
                           + (" (dtypes differ)" if dtypes_differ else "") + ": " + "; ".join(says(r) for r in range(w.size)),
                           everywhere=True)
  return rows


# ---------------------------------------------------------------- MPI types and reductions
_user_ops: dict = {}


def _bf16_to_f32(u: np.ndarray) -> np.ndarray: return (u.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(f: np.ndarray) -> np.ndarray:
  b = f.view(np.uint32)
  out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)      # round to nearest, ties to even
  out[np.isnan(f)] = 0x7FC0
  return out


NP_OPS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _mpi_type_op(dtype: DType, op: str):
  """(MPI datatype, MPI op) for reducing `dtype` with `op`."""
  MPI = _mpi()
  if dtype in (dtypes.float16, dtypes.bfloat16):      # no MPI type: 16-bit values and an operation of our own
    key = (dtype.name, op)
    if key not in _user_ops:
      f = NP_OPS[op]
      if dtype == dtypes.float16:
        def fn(inbuf, inoutbuf, datatype, f=f):
          a, b = np.frombuffer(inbuf, np.float16), np.frombuffer(inoutbuf, np.float16)
          f(a, b, out=b)
      else:
        def fn(inbuf, inoutbuf, datatype, f=f):
          a, b = np.frombuffer(inbuf, np.uint16), np.frombuffer(inoutbuf, np.uint16)
          b[:] = _f32_to_bf16(f(_bf16_to_f32(a), _bf16_to_f32(b)))
      _user_ops[key] = MPI.Op.Create(fn, commute=True)
    return MPI.UINT16_T, _user_ops[key]
  types = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int8": MPI.INT8_T, "uint8": MPI.UINT8_T,
           "int16": MPI.INT16_T, "uint16": MPI.UINT16_T, "int32": MPI.INT32_T, "uint32": MPI.UINT32_T,
           "int64": MPI.INT64_T, "uint64": MPI.UINT64_T, "bool": MPI.C_BOOL}
  if dtype.name not in types: raise TypeError(f"distributed: no MPI transport for dtype {dtype.name}")
  if dtype == dtypes.bool:
    return types["bool"], {"sum": MPI.LOR, "mean": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
  return types[dtype.name], {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]


# ---------------------------------------------------------------- device <-> host
def _host_view(dev: Device, buf: Buffer) -> np.ndarray:
  return np.frombuffer(dev.driver.view(buf.addr, buf.nbytes), np.uint8)


def _sync(dev: Device):
  with Device.lock: dev.synchronize()


def _read(dev: Device, buf: Buffer, out: np.ndarray, lo: int = 0):
  with Device.lock: dev.driver.copyout(memoryview(out), buf.addr + lo)


def _write(dev: Device, buf: Buffer, data: np.ndarray, lo: int = 0):
  with Device.lock: dev.driver.copyin(buf.addr + lo, memoryview(data))


def _pipelined(dev: Device, src: Buffer, dst: Buffer, step: int, start, read: bool, what: str):
  """Move src through host staging in chunks of `step` bytes: read chunk i off the device (when `read`), start its
  MPI request (`start(chunk) -> request`, in place on the staging chunk), and write finished chunks into dst -- the
  device copy of the next chunk runs while MPI works on this one."""
  stage = np.empty(src.nbytes, np.uint8)
  pending = collections.deque()
  def finish():
    lo, hi, req = pending.popleft()
    _wait(req, what)
    _write(dev, dst, stage[lo:hi], lo)
  for lo in range(0, src.nbytes, step):
    hi = min(src.nbytes, lo + step)
    if read: _read(dev, src, stage[lo:hi], lo)
    pending.append((lo, hi, start(stage[lo:hi])))
    while pending and pending[0][2].Test(): finish()
  while pending: finish()


def _allreduce_bufs(src: Buffer, dst: Buffer, dtype: DType, op: str, what: str):
  """dst = op over every rank's src: in place on host memory (CPU), else pipelined through host staging."""
  w, MPI = world(), _mpi()
  if src.nbytes == 0: return
  mtype, mop = _mpi_type_op(dtype, op)
  dev = Device.get(src.device)
  _sync(dev)
  if dev.host_memory:
    _wait(w.comm.Iallreduce([_host_view(dev, src), mtype], [_host_view(dev, dst), mtype], mop), what)
    return
  step = max(1, CHUNK // dtype.itemsize) * dtype.itemsize
  _pipelined(dev, src, dst, step, lambda chunk: w.comm.Iallreduce(MPI.IN_PLACE, [chunk, mtype], mop), True, what)


def _broadcast_bufs(src: Buffer, dst: Buffer, root: int, what: str):
  w, MPI = world(), _mpi()
  if src.nbytes == 0: return
  dev = Device.get(src.device)
  _sync(dev)
  if dev.host_memory:
    out = _host_view(dev, dst)
    if w.rank == root: out[:] = _host_view(dev, src)
    _wait(w.comm.Ibcast([out, MPI.BYTE], root=root), what)
    return
  _pipelined(dev, src, dst, CHUNK, lambda chunk: w.comm.Ibcast([chunk, MPI.BYTE], root=root), w.rank == root, what)


def _to_host(buf: Buffer) -> np.ndarray:
  dev = Device.get(buf.device)
  _sync(dev)
  out = np.empty(buf.nbytes, np.uint8)
  if buf.nbytes: _read(dev, buf, out)
  return out


def _from_host(buf: Buffer, data: np.ndarray):
  if buf.nbytes: _write(Device.get(buf.device), buf, np.ascontiguousarray(data).view(np.uint8).reshape(-1))


def _storage(dtype: DType):
  """The numpy type of `dtype`'s bytes (bfloat16: its 16-bit patterns)."""
  return np.uint16 if dtype == dtypes.bfloat16 else (np.bool_ if dtype == dtypes.bool else dtype.np)


# ---------------------------------------------------------------- tensors
def _single(t: Tensor) -> tuple[Tensor, Buffer]:
  """`t` realized as a contiguous buffer of exactly its elements (on its one device)."""
  if not isinstance(t, Tensor): raise TypeError(f"distributed: expected a Tensor, got {type(t).__name__}")
  if any(not isinstance(d, int) for d in t.shape):
    raise ValueError(f"distributed: {t!r} has a symbolic shape; collectives across processes need concrete sizes")
  if not _is_realized(t.uop): t = t.contiguous()
  t.realize()
  buf = t._buffer()
  if buf.size != t.numel():
    t = t.contiguous().realize()
    buf = t._buffer()
  return t, buf


def _tensor_of(buf: Buffer, shape) -> Tensor:
  u = UOp(Ops.BUFFER, buf.dtype, (), buf)
  return Tensor(u if tuple(shape) == (buf.size,) else UOp(Ops.RESHAPE, buf.dtype, (u,), tuple(shape)))


def _host_step(name: str, run, src: Buffer, dst: Buffer):
  """Do `run(src, dst)` now, and while a jitted function is captured, record it as a host step (hcq/segmented.py)."""
  run(src, dst)
  if runtime.capturing is not None:
    runtime.capturing.append(HostStep(name, lambda bufs: run(*bufs), [src, dst], writes=[dst]))


def _per_device(x, fn, what: str):
  """Apply fn (a collective on one single-device tensor) to x: a Tensor on one device, a Tensor on several devices
  (replicated: once; sharded: per shard), or a list of per-device partial values (reduced in-process first)."""
  if isinstance(x, (list, tuple)):
    raise TypeError(f"distributed.{what}: a list of per-device tensors is taken by allreduce only")
  if isinstance(x.device, tuple):
    x.realize()
    axis, bounds = x.uop.arg
    if axis is None:
      return fn(Tensor(x.uop.src[0])).to(x.device)
    parts = [fn(Tensor(s)) for s in x.uop.src]
    return Tensor(_multi.multi_uop([p.uop for p in parts], axis, bounds))
  return fn(x)


def allreduce(x, op: str = "sum"):
  """op ("sum", "mean", "max", "min", "prod") over every rank's x. x: a Tensor (one device or several), or a list of
  tensors on different devices of this process (partial values: reduced here first; returns a list, one per device)."""
  if op not in OPS: raise ValueError(f"distributed.allreduce: op must be one of {', '.join(OPS)}, got {op!r}")
  w = world()
  if isinstance(x, (list, tuple)):
    xs = list(x)
    if not xs: raise ValueError("distributed.allreduce: an empty list")
    devices = [t.device for t in xs]
    local = _multi.reduce(xs, devices[0], "sum" if op == "mean" else op) if len(xs) > 1 else xs[0]
    total = _allreduce_one(local, "sum" if op == "mean" else op)
    if op == "mean": total = total / (w.size * len(xs))
    return _multi.broadcast(total, devices) if len(xs) > 1 else [total]
  return _per_device(x, lambda t: _allreduce_one(t, op), "allreduce")


def _allreduce_one(t: Tensor, op: str) -> Tensor:
  w = world()
  t, src = _single(t)
  _agree("allreduce", t.shape, t.dtype, op)
  what = f"allreduce #{w.seq} ({op} of {tuple(t.shape)} {t.dtype.name} on {t.device})"
  dst = Buffer(src.device, src.size, src.dtype).ensure_allocated()
  red = "sum" if op == "mean" else op
  _host_step(what, lambda s, d: _allreduce_bufs(s, d, t.dtype, red, what), src, dst)
  out = _tensor_of(dst, t.shape)
  return out / w.size if op == "mean" else out


def broadcast(x, root: int = 0):
  """root's x on every rank (the other ranks pass a tensor of the same shape and dtype, whose values are unused)."""
  w = world()
  if not 0 <= root < w.size: raise ValueError(f"distributed.broadcast: root {root} is not a rank (0..{w.size - 1})")
  def one(t):
    t, src = _single(t)
    _agree("broadcast", t.shape, t.dtype, arg=root)
    what = f"broadcast #{w.seq} from rank {root} ({tuple(t.shape)} {t.dtype.name} on {t.device})"
    dst = Buffer(src.device, src.size, src.dtype).ensure_allocated()
    _host_step(what, lambda s, d: _broadcast_bufs(s, d, root, what), src, dst)
    return _tensor_of(dst, t.shape)
  return _per_device(x, one, "broadcast")


def allgather(x, axis: int = 0):
  """Every rank's x put together along `axis`, in rank order (their sizes along `axis` may differ)."""
  w, MPI = world(), _mpi()
  def one(t):
    t, src = _single(t)
    if t.ndim == 0: raise ValueError("distributed.allgather: a 0-d tensor has no axis to put together along")
    ax = axis + t.ndim if axis < 0 else axis
    if not 0 <= ax < t.ndim: raise ValueError(f"distributed.allgather: axis {axis} out of range for {t.ndim} dims")
    rows = _agree("allgather", t.shape, t.dtype, arg=ax, free_axis=ax)
    sizes = [int(r[6 + ax]) for r in rows] if ax < 9 else None
    if sizes is None:      # the axis lies beyond what the description holds: ask for the sizes
      got = np.empty(w.size, np.int64)
      _wait(w.comm.Iallgather([np.array([t.shape[ax]], np.int64), MPI.INT64_T], [got, MPI.INT64_T]), "allgather sizes")
      sizes = [int(s) for s in got]
    shape = list(t.shape); shape[ax] = sum(sizes)
    what = f"allgather #{w.seq} along axis {ax} ({tuple(t.shape)} {t.dtype.name} on {t.device})"
    dst = Buffer(src.device, int(np.prod(shape)), src.dtype).ensure_allocated()
    store, in_shape = _storage(t.dtype), tuple(t.shape)
    def run(s, d):
      mine = np.moveaxis(_to_host(s).view(store).reshape(in_shape), ax, 0)
      block = int(np.prod(mine.shape[1:]))
      counts = [n * block * t.dtype.itemsize for n in sizes]
      out = np.empty(sum(counts), np.uint8)
      _wait(w.comm.Iallgatherv([np.ascontiguousarray(mine).view(np.uint8).reshape(-1), MPI.BYTE], [out, (counts, None), MPI.BYTE]), what)
      full = out.view(store).reshape((sum(sizes),) + mine.shape[1:])
      _from_host(d, np.moveaxis(full, 0, ax))
    _host_step(what, run, src, dst)
    return _tensor_of(dst, shape)
  return _per_device(x, one, "allgather")


def reduce_scatter(x, op: str = "sum", axis: int = 0):
  """This rank's part (rank r: split_bounds(size along axis, ranks)[r]) of op over every rank's x, along `axis`."""
  if op not in OPS: raise ValueError(f"distributed.reduce_scatter: op must be one of {', '.join(OPS)}, got {op!r}")
  w = world()
  def one(t):
    t, src = _single(t)
    if t.ndim == 0: raise ValueError("distributed.reduce_scatter: a 0-d tensor has no axis to split along")
    ax = axis + t.ndim if axis < 0 else axis
    if not 0 <= ax < t.ndim: raise ValueError(f"distributed.reduce_scatter: axis {axis} out of range for {t.ndim} dims")
    _agree("reduce_scatter", t.shape, t.dtype, op, arg=ax)
    bounds = _multi.split_bounds(t.shape[ax], w.size)
    b, e = bounds[w.rank]
    shape = list(t.shape); shape[ax] = e - b
    what = f"reduce_scatter #{w.seq} {op} along axis {ax} ({tuple(t.shape)} {t.dtype.name} on {t.device})"
    dst = Buffer(src.device, int(np.prod(shape)), src.dtype).ensure_allocated()
    store, in_shape = _storage(t.dtype), tuple(t.shape)
    mtype, mop = _mpi_type_op(t.dtype, "sum" if op == "mean" else op)
    def run(s, d):
      full = np.ascontiguousarray(np.moveaxis(_to_host(s).view(store).reshape(in_shape), ax, 0))
      block = int(np.prod(full.shape[1:]))
      counts = [(hi - lo) * block for lo, hi in bounds]
      out = np.empty(counts[w.rank], store)
      _wait(w.comm.Ireduce_scatter([full.reshape(-1), mtype], [out, mtype], counts, mop), what)
      _from_host(d, np.moveaxis(out.reshape((e - b,) + full.shape[1:]), 0, ax))
    _host_step(what, run, src, dst)
    out = _tensor_of(dst, shape)
    return out / w.size if op == "mean" else out
  return _per_device(x, one, "reduce_scatter")


def barrier():
  """Wait until every rank has called barrier (with the timeout and failure checks of every collective)."""
  w = world()
  w.seq += 1
  _wait(w.comm.Ibarrier(), f"barrier #{w.seq}")


# ---------------------------------------------------------------- data-parallel training
def broadcast_parameters(params, root: int = 0):
  """Give every rank root's values of `params` (in place: each parameter's own buffer), e.g. after initializing."""
  for p in params: p.assign(broadcast(p.detach(), root)).realize()


def batch_part(n: int) -> tuple[int, int]:
  """(start, end) of this rank's part of a global batch of `n` (near-equal parts, the first ones one longer)."""
  w = world()
  return _multi.split_bounds(n, w.size)[w.rank]


def average_gradients(params, loss: Tensor | None = None, weight: float | None = None):
  """Make each parameter's .grad the average over the ranks (one allreduce for all of them, with `loss` in it).

  `weight`: this rank's share of the global batch (its examples / all examples; default 1/size): the gradient of a
  loss that is a mean over the global batch is the weighted sum of the ranks' gradients of their own means, so
  training equals one process with the global batch. Returns the global loss (the weighted sum of `loss`), or None."""
  w = world()
  weight = 1.0 / w.size if weight is None else float(weight)
  live = [p for p in params if p.grad is not None]
  parts = [p.grad.reshape(-1) for p in live] + ([loss.reshape(1).cast(live[0].grad.dtype if live else loss.dtype)]
                                                 if loss is not None else [])
  if not parts: return None
  flat = (parts[0].cat(*parts[1:]) if len(parts) > 1 else parts[0]) * weight
  total = allreduce(flat, "sum")
  at = 0
  for p in live:
    n = p.grad.numel()
    p.grad = total[at:at + n].reshape(p.grad.shape)
    at += n
  return total[at].cast(loss.dtype) if loss is not None else None


__all__ = ["init", "world", "rank", "size", "allreduce", "broadcast", "allgather", "reduce_scatter", "barrier",
           "broadcast_parameters", "batch_part", "average_gradients", "DistributedError", "World"]
