"""The rank side of tests/test_distributed.py: run under `mpirun -np N python tests/helpers_mpi.py MODE`.

Every rank checks its own results against numpy (each rank builds every rank's inputs from the rank's seed, so the
expected value is known everywhere) and prints "RANK r OK <mode>" at the end; a failed check raises (the
distributed excepthook then names the rank on every rank and aborts the job)."""
import os, sys, time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data(r: int, shape, dtype=np.float32):
  rng = np.random.default_rng(100 + r)
  if np.issubdtype(dtype, np.integer): return rng.integers(-50, 50, shape).astype(dtype)
  return (rng.standard_normal(shape) * 2).astype(dtype)


def close(got, want, tol=1e-5, what=""):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
    err = np.abs(got - want).max() if got.shape == want.shape else f"shapes {got.shape} vs {want.shape}"
    raise AssertionError(f"{what}: got {got.ravel()[:6]} want {want.ravel()[:6]} (max error {err})")


def bf16_round(x: np.ndarray) -> np.ndarray:
  b = x.astype(np.float32).view(np.uint32)
  return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def collectives(dist, Tensor, dev):
  w = dist.world()
  n, r = w.size, w.rank
  everyone = [data(k, (5, 7)) for k in range(n)]
  x = Tensor(everyone[r], device=dev)
  close(dist.allreduce(x).numpy(), sum(everyone), what="allreduce sum")
  close(dist.allreduce(x, "mean").numpy(), sum(everyone) / n, what="allreduce mean")
  close(dist.allreduce(x, "max").numpy(), np.max(everyone, 0), what="allreduce max")
  close(dist.allreduce(x, "min").numpy(), np.min(everyone, 0), what="allreduce min")
  close(dist.allreduce(x, "prod").numpy(), np.prod(everyone, 0), 1e-4, what="allreduce prod")
  ints = [data(k, (9,), np.int32) for k in range(n)]
  got = dist.allreduce(Tensor(ints[r], device=dev)).numpy()
  assert got.dtype == np.int32 and (got == sum(ints)).all(), ("allreduce int32", got)
  halves = [data(k, (33,), np.float16) for k in range(n)]
  got = dist.allreduce(Tensor(halves[r], device=dev)).numpy()
  want = halves[0].copy()
  for h in halves[1:]: want = (want + h).astype(np.float16)      # pairwise float16 sums, as the operation does
  assert got.dtype == np.float16
  close(got, want, 2e-3, what="allreduce float16")
  bfs = [bf16_round(data(k, (17,))) for k in range(n)]
  got = dist.allreduce(Tensor(bfs[r], device=dev).cast("bfloat16")).numpy()
  close(got, sum(bfs), 2e-2, what="allreduce bfloat16")
  # a strided view of a tensor, and more than one staging chunk (4 MiB) with a tail
  big = [data(k, (1 << 20) + 3) for k in range(n)]
  close(dist.allreduce(Tensor(big[r], device=dev)).numpy(), sum(big), 1e-4, what="allreduce 4 MiB + 12 bytes")
  close(dist.allreduce(x.T[1:4]).numpy(), sum(e.T[1:4] for e in everyone), what="allreduce of a view")
  close(dist.broadcast(x, n - 1).numpy(), everyone[n - 1], 0, what="broadcast")
  close(dist.broadcast(Tensor(big[r], device=dev), 0).numpy(), big[0], 0, what="broadcast 4 MiB + 12 bytes")
  rows = [data(k, (k + 1, 3)) for k in range(n)]
  close(dist.allgather(Tensor(rows[r], device=dev), 0).numpy(), np.concatenate(rows, 0), 0, what="allgather axis 0")
  close(dist.allgather(x, 1).numpy(), np.concatenate(everyone, 1), 0, what="allgather axis 1")
  long = [data(k, (3, 10)) for k in range(n)]
  bounds = np.array_split(np.arange(10), n)[r]
  close(dist.reduce_scatter(Tensor(long[r], device=dev), "sum", 1).numpy(), sum(long)[:, bounds], what="reduce_scatter")
  close(dist.reduce_scatter(Tensor(long[r].T.copy(), device=dev), "max").numpy(), np.max(long, 0).T[bounds], 0,
        what="reduce_scatter max axis 0")
  try:
    dist.allreduce(Tensor(np.zeros(3 + r, np.float32), device=dev))
    raise AssertionError("allreduce of different shapes was not detected")
  except dist.DistributedError as e:
    assert f"rank {n - 1}: allreduce" in str(e) and f"({3 + n - 1},)" in str(e), str(e)
  dist.barrier()


def under_jit(dist, Tensor, dev):
  """A jitted function with a collective between device work: replays give the right answer for new inputs."""
  from baregrad.tensor.jit import jit
  w = dist.world()
  n, r = w.size, w.rank
  scale = Tensor(np.full((4,), 3.0, np.float32), device=dev).realize()
  f = jit(lambda a: (dist.allreduce(a * 2 + 1) * scale).relu().sum(0))
  for call in range(4):
    ins = [data(10 * call + k, (6, 4)) for k in range(n)]
    got = f(Tensor(ins[r], device=dev)).numpy()
    close(got, np.maximum(sum(i * 2 + 1 for i in ins) * 3, 0).sum(0), 1e-4, what=f"jitted allreduce, call {call}")
  assert f.calls == 2 and f.graph.host_steps == 1, (f.calls, f.graph)
  g = jit(lambda a: dist.allreduce(a))       # the collective's own result handed out: fresh on every replay
  outs = [(g(Tensor(data(k + r, (8,)), device=dev)), k) for k in range(4)]
  for out, k in outs: close(out.numpy(), sum(data(k + j, (8,)) for j in range(n)), 1e-5, what=f"jitted output {k}")


def several_devices(dist, Tensor):
  """Tensors on two devices of this process: a replicated one is one value per process; a list is partial values."""
  w = dist.world()
  n, r = w.size, w.rank
  devs = ("CPU", "CPU:1")
  vals = [data(k, (4, 3)) for k in range(n)]
  out = dist.allreduce(Tensor(vals[r]).to(devs))
  assert out.device == devs
  close(out.numpy(), sum(vals), what="replicated allreduce")
  sharded = dist.allreduce(Tensor(vals[r]).shard(devs, axis=0))
  close(sharded.numpy(), sum(vals), what="sharded allreduce")
  parts = [Tensor(vals[r] * (i + 1), device=d) for i, d in enumerate(devs)]
  got = dist.allreduce(parts)
  assert [t.device for t in got] == list(devs)
  for t in got: close(t.numpy(), sum(vals) * 3, what="allreduce of per-device partials")


def training(dist, Tensor, dev):
  """20 data-parallel steps equal 20 steps of one process with the global batch, to 1e-5."""
  from baregrad.tools.demo import train
  w = dist.world()
  model, losses, _, _ = train(20, 96, 0.01, "mlp", dev, seed=3, use_jit=True, distributed=True)
  mine = [p.numpy() for p in model.parameters()]
  ref, ref_losses, _, _ = train(20, 96, 0.01, "mlp", dev, seed=3, use_jit=True)
  for a, b in zip(mine, [p.numpy() for p in ref.parameters()]): close(a, b, 1e-5, what=f"rank {w.rank} parameters")
  close(losses, ref_losses, 1e-5, what="global losses")


def fails(dist, Tensor, dev):
  """Rank 1 raises in the middle of step 3; every rank must end with it named."""
  w = dist.world()
  x = Tensor(np.ones(16, np.float32), device=dev)
  for step in range(6):
    dist.allreduce(x * step)
    if step == 3 and w.rank == 1: raise ValueError("rank one breaks in step 3")
  time.sleep(60)


def main():
  mode = sys.argv[1]
  from baregrad.tensor import Tensor, distributed as dist
  w = dist.init(timeout=20)
  dev = w.device
  t = time.perf_counter()
  if mode == "collectives":
    collectives(dist, Tensor, dev)
    under_jit(dist, Tensor, dev)
    if dev == "CPU": several_devices(dist, Tensor)
  elif mode == "training": training(dist, Tensor, dev)
  elif mode == "fails": fails(dist, Tensor, dev)
  else: raise SystemExit(f"unknown mode {mode}")
  dist.barrier()
  print(f"RANK {w.rank} OK {mode} on {dev} ({time.perf_counter() - t:.1f} s)", flush=True)


if __name__ == "__main__":
  main()
