"""Benchmarks: `python -m baregrad.tools.bench [--json] [--only PREFIX]`.

Every number is measured in this run. Throughputs use the median of several steady-state runs."""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
import numpy as np


def _median_time(fn, repeat: int, warmup: int = 1) -> float:
  for _ in range(warmup): fn()
  ts = []
  for _ in range(repeat):
    t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def _alternate(ours, theirs, rounds: int = 5, per_round: int = 3, settle: float = 0.3) -> tuple[float, float]:
  """Median seconds of `ours` and of `theirs` (numpy) over `rounds` rounds of `per_round` back-to-back calls each (after
  one untimed call), the two taking turns, so both see the same load on a shared machine. numpy's BLAS threads keep
  spinning on the cores for about 0.1 s after a call (OpenBLAS's thread timeout) and would take them from whatever
  runs next: ours starts `settle` seconds after numpy's last call (our helper threads sleep 50 us after a job)."""
  a, b = [], []
  for _ in range(rounds):
    for fn, times in ((ours, a), (theirs, b)):
      fn()
      for _ in range(per_round):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    time.sleep(settle)
  return float(np.median(a)), float(np.median(b))


def bench_add(results: dict):
  """16Mi float32 x + y: ours (a new output each run, as a program makes them) against numpy writing into an
  output it already has (np.add(x, y, out=z)); GB/s of the three arrays."""
  from baregrad.tensor import Tensor
  from baregrad.hcq.device import Device
  n = 16 * 1024 * 1024
  xn, yn = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
  zn = np.empty_like(xn)
  x, y = Tensor(xn), Tensor(yn)
  dev = Device.get(x.device)
  def run(): (x + y).realize(); dev.synchronize()
  ours, theirs = _alternate(run, lambda: np.add(xn, yn, out=zn))
  results[f"{dev.name.lower()}.add_16m_f32.gbps"] = 3 * 4 * n / ours / 1e9
  results["numpy.add_16m_f32.gbps"] = 3 * 4 * n / theirs / 1e9


def bench_matmul(results: dict):
  """float32 (n, k) @ (k, m) against numpy's BLAS in the same process, alternating: 1024 x 1024 x 1024 and a
  non-square 4096 x 256 x 1024 (n x k x m: a tall left operand, a short reduction)."""
  from baregrad.tensor import Tensor
  from baregrad.hcq.device import Device
  for (n, k, m), name in (((1024, 1024, 1024), "1024"), ((4096, 256, 1024), "4096x256x1024")):
    an, bn = np.random.rand(n, k).astype(np.float32), np.random.rand(k, m).astype(np.float32)
    a, b = Tensor(an), Tensor(bn)
    dev = Device.get(a.device)
    def run(): (a @ b).realize(); dev.synchronize()
    ours, theirs = _alternate(run, lambda: an @ bn)
    results[f"{dev.name.lower()}.matmul_{name}_f32.gflops"] = 2 * n * k * m / ours / 1e9
    results[f"numpy.matmul_{name}_f32.gflops"] = 2 * n * k * m / theirs / 1e9


def bench_eager(results: dict):
  from baregrad.tensor import Tensor
  from baregrad.hcq.device import Device
  x, y = Tensor(np.random.rand(16).astype(np.float32)), Tensor(np.random.rand(16).astype(np.float32))
  dev = Device.get(x.device)
  def run(): (x * y + 1.0).realize(); dev.synchronize()
  results[f"{dev.name.lower()}.eager_tiny_kernel.us"] = _median_time(run, 500, warmup=20) * 1e6


def bench_jit(results: dict):
  from baregrad.tensor import Tensor
  from baregrad.tensor.jit import jit
  from baregrad.hcq.device import Device

  @jit
  def chain(x):
    for _ in range(100): x = (x * 1.0001 + 0.5).contiguous()
    return x
  x = Tensor(np.ones(16, np.float32))
  dev = Device.get(x.device)
  for _ in range(3): chain(x); dev.synchronize()
  def replay(): chain(x); dev.synchronize()
  name = dev.name.lower()
  results[f"{name}.jit_replay_tiny_kernel.us"] = _median_time(replay, 200, warmup=10) * 1e6 / 100
  submit = []
  for _ in range(200):
    dev.synchronize()
    t = time.perf_counter(); chain(x); submit.append(time.perf_counter() - t)
  dev.synchronize()
  results[f"{name}.jit_submit_100.us"] = float(np.median(submit)) * 1e6


MATMUL_CHILD = r"""
import sys, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.hcq.device import Device
n, runs = int(sys.argv[1]), int(sys.argv[2])
a, b = (Tensor(np.random.default_rng(i).random((n, n), dtype=np.float32)) for i in range(2))
dev = Device.get(a.device)
c = (a @ b).realize(); dev.synchronize()           # compile (and search, with BEAM) outside the timing
ts = []
for _ in range(runs):
  t = time.perf_counter(); (a @ b).realize(); dev.synchronize(); ts.append(time.perf_counter() - t)
assert np.allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-3, atol=1e-3), "matmul result differs from numpy"
print(min(ts))
"""


def _child_matmul(n: int, runs: int, env: dict) -> float:
  out = subprocess.run([sys.executable, "-c", MATMUL_CHILD, str(n), str(runs)], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=1800)
  if out.returncode != 0: raise RuntimeError(f"matmul child ({env}) failed:\n{out.stderr}")
  return float(out.stdout.strip().splitlines()[-1])


def bench_matmul_opts(results: dict):
  """The same 1024 matmul kernel without optimizations and with BEAM=2 (each in a fresh process)."""
  n = 1024
  results["cpu.matmul_1024_f32_noopt.gflops"] = 2 * n ** 3 / _child_matmul(n, 1, {"OPT": "0", "DEV": "CPU"}) / 1e9
  results["cpu.matmul_1024_f32_beam.gflops"] = 2 * n ** 3 / _child_matmul(n, 3, {"BEAM": "2", "DEV": "CPU"}) / 1e9


# what the kernels of one op execute on an emulated GPU (drivers/emu/counters.py), one JSON line per op as it finishes
EMU_COUNTERS_CHILD = r"""
import json, sys, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.hcq.device import Device
from baregrad.drivers.emu import counters
n = int(sys.argv[1])
rng = np.random.default_rng(0)
for name, dtype, tol in (("f32", np.float32, 1e-3), ("f16", np.float16, 2e-2)):
  try:
    an, bn = (rng.random((n, n), dtype=np.float32).astype(dtype) for _ in range(2))
    a, b = Tensor(an).realize(), Tensor(bn).realize()
    dev = Device.get(a.device)
    dev.synchronize()
    counters.reset()                                 # only the kernels of the matmul
    t = time.perf_counter(); c = (a @ b).realize(); dev.synchronize(); s = time.perf_counter() - t
    got = counters.total()
    want = an.astype(np.float32) @ bn.astype(np.float32)
    assert np.allclose(c.numpy().astype(np.float32), want, rtol=tol, atol=tol * n), "matmul result differs from numpy"
    print(json.dumps({"op": f"matmul_{n}_{name}", "s": s, **got.as_dict()}), flush=True)
  except Exception as e:
    print(f"matmul_{n}_{name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
"""

EMU_SUM_CHILD = r"""
import sys, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.hcq.device import Device
size, limit = int(sys.argv[1]), float(sys.argv[2])
xn = np.random.default_rng(0).random(size, dtype=np.float32)
x = Tensor(xn).realize()
dev = Device.get(x.device)
dev.synchronize()
ts = []
for _ in range(2):                # the first run compiles: the second one is the measurement
  t = time.perf_counter(); r = x.sum().realize(); dev.synchronize(); ts.append(time.perf_counter() - t)
  if ts[-1] > limit: print("inf"); sys.exit(0)
assert np.isclose(r.numpy(), xn.astype(np.float64).sum(), rtol=1e-4), "sum differs from numpy"
print(ts[-1])
"""


def _emu_counter_runs(kind: str, n: int) -> dict:
  """op -> the counters of its kernels (and its wall seconds) on the emulated `kind` GPU, from a fresh process."""
  try:
    out = subprocess.run([sys.executable, "-c", EMU_COUNTERS_CHILD, str(n)], env=dict(os.environ, EMU="1", DEV=kind),
                         capture_output=True, text=True, timeout=1800)
    stdout, stderr = out.stdout, out.stderr
  except subprocess.TimeoutExpired as e:    # keep the ops that finished
    stdout, stderr = (x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    stderr += "\n(timed out after 1800 s)"
  runs = {}
  for line in stdout.splitlines():
    if line.startswith("{"):
      got = json.loads(line)
      runs[got["op"]] = got
  if stderr.strip(): print(f"{kind.lower()}_emu counters child:\n{stderr.strip()[-2000:]}", file=sys.stderr)
  return runs


def _emu_sum_seconds(kind: str, size: int, limit: float = 120.0) -> float:
  """Seconds to realize the sum of `size` float32 on the emulated `kind` GPU (second run); inf past `limit`."""
  try:
    out = subprocess.run([sys.executable, "-c", EMU_SUM_CHILD, str(size), str(limit)],
                         env=dict(os.environ, EMU="1", DEV=kind), capture_output=True, text=True, timeout=3 * limit + 60)
  except subprocess.TimeoutExpired:
    print(f"{kind.lower()}_emu.sum: over {limit:.0f} s, reported as inf", file=sys.stderr)
    return float("inf")
  if out.returncode != 0: raise RuntimeError(f"sum child ({kind}) failed:\n{out.stderr}")
  value = float(out.stdout.strip().splitlines()[-1])
  if value == float("inf"): print(f"{kind.lower()}_emu.sum: over {limit:.0f} s, reported as inf", file=sys.stderr)
  return value


def bench_emulated(results: dict):
  """On each emulated GPU (EMU=1, a fresh process per measurement): one 256x256x256 float32 matmul kernel rendered by
  baregrad (seconds); what the kernels of a 512 matmul execute (drivers/emu/counters.py), per flop (2 * 512^3): global
  bytes loaded + stored, and thread-instructions (f32 and f16 inputs); the sum of 1M float32 (seconds, after the
  compiling run; inf when a run takes over 120 s)."""
  n, flops = 512, 2 * 512 ** 3
  for kind in ("AMD", "NV"):
    name = f"{kind.lower()}_emu"
    results[f"{name}.matmul_256_f32.s"] = _child_matmul(256, 1, {"EMU": "1", "DEV": kind})
    runs = _emu_counter_runs(kind, n)
    for op in (f"matmul_{n}_f32", f"matmul_{n}_f16"):
      got = runs.get(op)
      if got is None:
        print(f"{name}.{op}: no result (see the child's errors above)", file=sys.stderr)
        continue
      print(f"{name}.{op}: {got['s']:.1f} s, {got['kernels']} kernel(s), {got['thread_instrs']:,} thread-instructions",
            file=sys.stderr)
      if op.endswith("f32"):
        results[f"{name}.{op}.global_bytes_per_flop"] = (got["global_load_bytes"] + got["global_store_bytes"]) / flops
      results[f"{name}.{op}.thread_instrs_per_flop"] = got["thread_instrs"] / flops
    results[f"{name}.sum_1m_f32.s"] = _emu_sum_seconds(kind, 1 << 20)


MLP_CHILD = r"""
import time, numpy as np
rng = np.random.default_rng(0)
w1, b1 = rng.standard_normal((784, 128)).astype(np.float32) * 0.05, np.zeros(128, np.float32)
w2, b2 = rng.standard_normal((128, 10)).astype(np.float32) * 0.05, np.zeros(10, np.float32)
x = rng.standard_normal((64, 784)).astype(np.float32)
from baregrad.tensor import Tensor
X, W1, B1, W2, B2 = (Tensor(a) for a in (x, w1, b1, w2, b2))
t = time.perf_counter()
out = ((X @ W1 + B1).relu() @ W2 + B2).numpy()
dt = time.perf_counter() - t
ref = np.maximum(x @ w1 + b1, 0) @ w2 + b2
assert np.allclose(out, ref, rtol=1e-4, atol=1e-4), "MLP result differs from numpy"
print(dt)
"""


# forward + backward of the MLP above, timed from before `import baregrad` to the gradients on the host
MLP_COLD_CHILD = r"""
import time
t = time.perf_counter()
import numpy as np
from baregrad.tensor import Tensor
rng = np.random.default_rng(0)
x = Tensor(rng.standard_normal((64, 784)).astype(np.float32))
w1 = Tensor(rng.standard_normal((784, 128)).astype(np.float32) * 0.05, requires_grad=True)
w2 = Tensor(rng.standard_normal((128, 10)).astype(np.float32) * 0.05, requires_grad=True)
loss = (x @ w1).relu().matmul(w2).log_softmax().mean()
loss.backward()
Tensor.realize(w1.grad, w2.grad); g1, g2 = w1.grad.numpy(), w2.grad.numpy()
print(time.perf_counter() - t)
"""


def _cold_child(code: str, what: str) -> float:
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, BAREGRAD_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  if out.returncode != 0: raise RuntimeError(f"{what} child failed:\n{out.stderr}")
  return float(out.stdout.strip().splitlines()[-1])


def bench_mlp_first_run(results: dict):
  """The MLP's first forward on an empty kernel cache, and forward + backward from import (fresh process)."""
  from baregrad.hcq.device import Device
  results[f"{Device.default().lower()}.mlp_first_run.s"] = _cold_child(MLP_CHILD, "MLP first-run")
  results[f"{Device.default().lower()}.mlp_fwd_bwd_cold.s"] = _cold_child(MLP_COLD_CHILD, "MLP forward+backward")


def fused_chain(x, inputs: list, terms: int, exp, sin, log, sqrt):
  """One fused elementwise expression of the slowest shape found to compile: `terms` different terms, each nested
  in the next (term i reads term i-1), cycling through exp/sin/log/sqrt with different constants over 4 inputs.
  exp/sin/log expand into polynomials with selects, so the kernel is one loop body of ~40 statements per term and
  one dependence chain through all of them (a sum of as many independent terms compiles faster). Works on Tensors
  and on numpy arrays (pass the functions)."""
  y = x
  for i in range(terms):
    a = inputs[i % 4]
    if i % 4 == 0: y = exp(y * 0.5 + a * 0.25)
    elif i % 4 == 1: y = sin(y * 0.8 + 0.01 * i) + a
    elif i % 4 == 2: y = log(y * y + a + 1.0)
    else: y = sqrt(y + a) * 0.9
  return y


FUSED_CHILD = r"""
import sys, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.tools.bench import fused_chain
terms = int(sys.argv[1])
rng = np.random.default_rng(0)
xs = [rng.random(1024, dtype=np.float32) + 0.5 for _ in range(4)]
ts = [Tensor(a) for a in xs]                        # the device starts here, outside the timing
t = time.perf_counter()
out = fused_chain(ts[0], ts, terms, Tensor.exp, Tensor.sin, Tensor.log, Tensor.sqrt).numpy()
dt = time.perf_counter() - t
ref = fused_chain(xs[0], xs, terms, np.exp, np.sin, np.log, np.sqrt)
assert np.allclose(out, ref, rtol=1e-4, atol=1e-5), "fused expression differs from numpy"
print(dt)
"""


def bench_fused_first_realize(results: dict):
  """Build a 500-term fused elementwise expression (`fused_chain`) and realize it, in a fresh process with an empty
  kernel cache: graph building, scheduling, codegen and the C compiler, all in the timing (seconds)."""
  from baregrad.hcq.device import Device
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, BAREGRAD_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", FUSED_CHILD, "500"], env=env, capture_output=True, text=True,
                         timeout=900)
  if out.returncode != 0: raise RuntimeError(f"fused-expression child failed:\n{out.stderr}")
  results[f"{Device.default().lower()}.fused_500_terms_first_realize.s"] = float(out.stdout.strip().splitlines()[-1])


ALLREDUCE_CHILD = r"""
import json, sys, time, numpy as np
from baregrad.tensor import Tensor, multi
from baregrad.tensor.jit import jit
from baregrad.hcq.device import Device
from baregrad.hcq import transfer
kind, n, runs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
devs = [kind if i == 0 else f"{kind}:{i}" for i in range(n)]
rng = np.random.default_rng(0)
host = [rng.random(size, dtype=np.float32) for _ in devs]
xs = [Tensor(h, device=d).realize() for h, d in zip(host, devs)]
@jit
def allreduce(*xs): return tuple(multi.allreduce(list(xs)))
def run():
  outs = allreduce(*xs)
  for d in devs: Device.get(d).synchronize()
  return outs
for _ in range(2): outs = run()          # compile, capture (the replays below run prebuilt queues)
want = np.sum(host, axis=0)
assert all(np.allclose(o.numpy(), want, rtol=1e-5) for o in outs), "allreduce result differs from numpy"
ts = []
for _ in range(runs):
  t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
link = transfer.link(Device.get(devs[0]), Device.get(devs[1]))
print(json.dumps({"s": float(np.median(ts)), "path": link.describe(),
                  "tag": "host_relay" if link.path == "host" else f"peer_{link.kind}_queue"}))
"""


def bench_allreduce(results: dict):
  """A ring allreduce (tensor/multi.py) of 16M float32 per device across 2 and 4 devices of each kind (CPU:i; the
  emulated AMD:i and NV:i, EMU=1), jitted, in a fresh process each. Bus bandwidth as nccl-tests defines it:
  bytes / time * 2(n-1)/n (what each device sends, per second). The metric names the copy path the ring's copies took
  (hcq/transfer.py: peer_<queue>_queue when one device's queue addresses the other's memory, host_relay otherwise)."""
  size = 16 * 1024 * 1024
  slow = {"EMU": "1", "TIMEOUT": "1800"}     # an emulated GPU takes tens of seconds for 4 x 16M floats
  for kind, runs, env in (("CPU", 3, {}), ("AMD", 1, slow), ("NV", 1, slow)):
    for n in (2, 4):
      out = subprocess.run([sys.executable, "-c", ALLREDUCE_CHILD, kind, str(n), str(runs), str(size)],
                           env=dict(os.environ, **env), capture_output=True, text=True, timeout=1800)
      if out.returncode != 0: raise RuntimeError(f"allreduce child ({kind} x {n}) failed:\n{out.stderr}")
      got = json.loads(out.stdout.strip().splitlines()[-1])
      name = kind.lower() + ("_emu" if env else "")
      results[f"{name}.allreduce_16m_f32_{n}dev.{got['tag']}.busbw_gbps"] = 4 * size / got["s"] * 2 * (n - 1) / n / 1e9
      print(f"{name} x{n}: {got['path']}", file=sys.stderr)


MPI_CHILD = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
from baregrad.tensor import Tensor, distributed as dist
from baregrad.hcq.device import Device
runs, size = int(sys.argv[1]), int(sys.argv[2])
w = dist.init()
host = np.random.default_rng(w.rank).random(size, dtype=np.float32)
x = Tensor(host, device=w.device).realize()
recv = np.empty_like(host)
def ours():
  out = dist.allreduce(x)
  out.realize(); Device.get(w.device).synchronize()
  return out
def theirs(): w.comm.Allreduce(host, recv)
for _ in range(2): out = ours(); theirs()
assert np.allclose(out.numpy(), recv, rtol=1e-5), "allreduce result differs from mpi4py's"
t_ours, t_theirs = [], []
for _ in range(runs):                     # alternating, so both see the same machine
  w.comm.Barrier(); t = time.perf_counter(); ours(); t_ours.append(time.perf_counter() - t)
  w.comm.Barrier(); t = time.perf_counter(); theirs(); t_theirs.append(time.perf_counter() - t)
if w.rank == 0: print(json.dumps({"ours": float(np.median(t_ours)), "theirs": float(np.median(t_theirs))}))
"""


def bench_mpi(results: dict):
  """An allreduce across 2 MPI ranks on loopback (tensor/distributed.py) of 16 MiB of float32, next to mpi4py's own
  Allreduce of a numpy array of the same size in the same run (alternating); CPU tensors and the emulated AMD's
  (through host staging). Bus bandwidth as nccl-tests defines it: bytes / time * 2(n-1)/n."""
  import shutil
  mpirun = shutil.which("mpirun")
  if mpirun is None: raise RuntimeError("bench mpi needs mpirun (apt install openmpi-bin libopenmpi-dev) and mpi4py")
  size, n = 4 << 20, 2
  for name, runs, env in (("cpu", 20, {}), ("amd_emu", 5, {"EMU": "1", "DEV": "AMD", "TIMEOUT": "600"})):
    cmd = [mpirun, "--oversubscribe", "-np", str(n)] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    out = subprocess.run(cmd + [sys.executable, "-c", MPI_CHILD, str(runs), str(size)], env=dict(os.environ, **env),
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0: raise RuntimeError(f"mpi child ({name}) failed:\n{out.stdout}{out.stderr}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    bw = lambda s: 4 * size / s * 2 * (n - 1) / n / 1e9
    results[f"{name}.mpi_allreduce_16mib_f32_2ranks.busbw_gbps"] = bw(got["ours"])
    results[f"{name}.mpi_allreduce_16mib_f32_2ranks.mpi4py_numpy_busbw_gbps"] = bw(got["theirs"])
    results[f"{name}.mpi_allreduce_16mib_f32_2ranks.vs_mpi4py"] = got["theirs"] / got["ours"]


def bench_llm(results: dict):
  from .bench_llm import bench_llm_cpu, bench_llm_emulated
  bench_llm_cpu(results)
  bench_llm_emulated(results)


def bench_train(results: dict):
  """Issue 32's training-speed figures on the default device: the character transformer's jitted training step
  (tools/demo.py --model transformer: 2 pre-LN blocks, width 64, 4 heads, context 64, batch 16; median ms of 30 steps
  after 10), and the three matmul forms of a linear layer at transformer sizes (1024 rows; width 64, 256, 1024):
  x @ W, dy @ W^T and x^T @ dy (the weight gradient, one reduction over all rows), GFLOP/s each beside numpy's
  matmul of the same shapes in the same run (a jitted product: each call replays its kernels)."""
  from baregrad.tensor import Tensor
  from baregrad.tensor.jit import jit
  from baregrad.hcq.device import Device
  from .demo import train_char
  _, _, _, _, _, _, rest = train_char(40, 16, 0.003, 64, 64, 4, 2, None, 0, True, None)
  results["cpu.transformer_train_step.ms"] = rest * 1e3
  rng = np.random.default_rng(0)
  for w in (64, 256, 1024):
    x, W, dy = (rng.standard_normal(s, dtype=np.float32) for s in ((1024, w), (w, w), (1024, w)))
    X, WT, DY = (Tensor(a).realize() for a in (x, W, dy))
    dev = Device.get(X.device)
    for name, ours, theirs in (("x_W", lambda a, b, c: a @ b, lambda: x @ W),
                               ("dy_WT", lambda a, b, c: c @ b.T, lambda: dy @ W.T),
                               ("xT_dy", lambda a, b, c: a.T @ c, lambda: x.T @ dy)):
      step = jit(lambda a, b, c, f=ours: f(a, b, c).contiguous())    # replays the kernel: no scheduling per call
      def run(): step(X, WT, DY); dev.synchronize()
      for _ in range(3): run()
      t_ours, t_np = _alternate(run, theirs)
      flops = 2 * 1024 * w * w
      results[f"{dev.name.lower()}.matmul_{name}_1024x{w}.gflops"] = flops / t_ours / 1e9
      results[f"numpy.matmul_{name}_1024x{w}.gflops"] = flops / t_np / 1e9


MARKERS_CHILD = r"""
import json, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.tensor.jit import jit
from baregrad.hcq.device import Device
x, y = Tensor(np.random.rand(16).astype(np.float32)), Tensor(np.random.rand(16).astype(np.float32))
dev = Device.get(x.device)
def median(fn, n, warm):
  for _ in range(warm): fn()
  ts = []
  for _ in range(n):
    t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
  return float(np.median(ts))
def eager(): (x * y + 1.0).realize(); dev.synchronize()
@jit
def chain(a):
  for _ in range(20): a = (a * 1.0001 + 0.5).contiguous()
  return a
def replay(): chain(x); dev.synchronize()
print(json.dumps({"eager": median(eager, 100, 10), "replay": median(replay, 40, 4) / 20}))
"""


def bench_markers(results: dict):
  """What the queues' trace markers cost (QUEUE_MARKERS: each command writes its sequence number for hang and fault
  reports): eager launch + synchronize of a tiny kernel and a JIT replay per kernel, on the CPU and the emulated AMD
  and NV GPUs with markers on and off (a fresh process each). The emulators run each marker packet in Python, so this is an upper
  bound of the host-side and queue-side cost; on the hardware a marker is one end-of-pipe memory write (AMD) or one
  semaphore release after the WFI the command has anyway (NV). On the CPU device a marker is the host's note of each
  packet's ring position (the worker's own progress words are always written)."""
  for kind in ("CPU", "AMD", "NV"):
    for flag, label in (("1", "on"), ("0", "off")):
      env = dict(os.environ, DEV=kind, QUEUE_MARKERS=flag, **({} if kind == "CPU" else {"EMU": "1"}))
      out = subprocess.run([sys.executable, "-c", MARKERS_CHILD], env=env, capture_output=True, text=True, timeout=900)
      if out.returncode != 0:
        print(f"markers child ({kind}, {label}) failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        continue
      got = json.loads(out.stdout.strip().splitlines()[-1])
      prefix = "cpu" if kind == "CPU" else f"{kind.lower()}_emu"
      results[f"{prefix}.eager_tiny_kernel_markers_{label}.us"] = got["eager"] * 1e6
      results[f"{prefix}.jit_replay_tiny_kernel_markers_{label}.us"] = got["replay"] * 1e6


GPU_MEMORY_CHILD = r"""
import json, sys, time, numpy as np
from baregrad.tensor import Tensor
from baregrad.drivers.emu import counters
from baregrad.hcq.device import Device
dev = Device.get(Device.default())
rng = np.random.default_rng(0)
an, bn = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
a, b = Tensor(an).realize(), Tensor(bn).realize()
dev.synchronize()
out = {}
gpu = getattr(getattr(dev.driver, "kernel", None), "gpu", None)      # the emulated NV GPU: what launches read that
written = dict(getattr(gpu, "host_written", {}))                     # the host wrote through BAR1
for name, f, ref in (("add", lambda: a + b, an + bn), ("matmul", lambda: a @ b, an @ bn)):
  counters.reset()
  r = f().realize(); dev.synchronize()
  t = counters.total()
  assert np.allclose(r.numpy(), ref, rtol=1e-3, atol=1e-3), name
  out[name] = [t.global_bytes, t.global_system_bytes]
if gpu is not None: out["host_written"] = sum(gpu.host_written.values()) - sum(written.values())
k = getattr(dev.driver, "kernel", None)
engine0 = getattr(k, "copy_engine_bytes", 0)
x = rng.integers(0, 256, 64 << 20, dtype=np.uint8)
t = time.perf_counter(); buf = Tensor(x).realize(); dev.synchronize(); t_in = time.perf_counter() - t
t = time.perf_counter(); y = buf.numpy(); t_out = time.perf_counter() - t
assert (y == x).all(), "64 MiB round trip differs"
out["roundtrip"] = [t_in, t_out, getattr(k, "copy_engine_bytes", 0) - engine0]
print(json.dumps(out))
"""


def bench_gpu_memory(results: dict):
  """Where the emulated GPUs' kernels find tensor data (drivers/emu/memory.py counts each kernel's global bytes by
  where they live): the fraction of an add's and a 256 matmul's global traffic in system memory (the goal is 0:
  tensors in the GPU's own memory), and a 64 MiB host->device->host round trip: seconds each way and its path (the
  copy engine through staging, or the CPU). AMD also with a small BAR (EMU_SMALL_BAR=1, where host-visible memory is
  system memory). NV: the bytes of QMDs, constant banks and code its launches read that the host wrote through BAR1
  rather than the GPU (goal 0: a hypervisor may trap every BAR access)."""
  for name, kind, extra in (("amd_emu", "AMD", {}), ("amd_emu_small_bar", "AMD", {"EMU_SMALL_BAR": "1"}),
                            ("nv_emu", "NV", {})):
    env = dict(os.environ, EMU="1", DEV=kind, **extra)
    out = subprocess.run([sys.executable, "-c", GPU_MEMORY_CHILD], env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
      print(f"{name} gpu memory child failed:\n{out.stderr[-2000:]}", file=sys.stderr)
      continue
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for op in ("add", "matmul"):
      total, system = got[op]
      results[f"{name}.{op}.system_memory_fraction"] = system / max(total, 1)
    if "host_written" in got:     # QMDs, constant banks and code of the two ops' launches (goal 0: I2M)
      results[f"{name}.launch_bytes_written_by_host"] = got["host_written"]
    t_in, t_out, engine = got["roundtrip"]
    results[f"{name}.roundtrip_64mib.to_device_s"], results[f"{name}.roundtrip_64mib.to_host_s"] = t_in, t_out
    path = ("copy engine through pinned staging" if engine >= 2 * (64 << 20) else
            "CPU copy (the tensor is in system memory)" if got["add"][1] else "CPU copy")
    print(f"{name}: 64 MiB round trip {64 / 1.048576 / t_in:.0f} MB/s in, {64 / 1.048576 / t_out:.0f} MB/s out: {path}",
          file=sys.stderr)


BENCHES = {"add": bench_add, "matmul": bench_matmul, "eager": bench_eager, "mlp": bench_mlp_first_run, "jit": bench_jit,
           "opts": bench_matmul_opts, "emu": bench_emulated, "gpumem": bench_gpu_memory, "markers": bench_markers, "train": bench_train, "fused": bench_fused_first_realize,
           "allreduce": bench_allreduce, "mpi": bench_mpi, "llm": bench_llm}


def main(argv=None):
  p = argparse.ArgumentParser(prog="baregrad.tools.bench", description=__doc__)
  p.add_argument("--json", action="store_true", help="print one JSON object of metric -> number")
  p.add_argument("--only", nargs="*", choices=list(BENCHES), help="run only these groups")
  p.add_argument("--llama-cpp", metavar="PYTHON", help="a Python interpreter that imports llama_cpp (llama-cpp-python): "
                 "the llm group has llama.cpp decode the same GGUF files in the same run (default: this interpreter, "
                 "where it imports llama_cpp)")
  args = p.parse_args(argv)
  from . import bench_llm
  bench_llm.LLAMA_CPP_PYTHON = args.llama_cpp
  results: dict[str, float] = {}
  for name, fn in BENCHES.items():
    if args.only and name not in args.only: continue
    fn(results)
  if args.json: print(json.dumps(results))
  else:
    width = max(map(len, results), default=10)
    for k, v in results.items(): print(f"{k:{width}s}  {v:12.3f}")
  return results


if __name__ == "__main__":
  main()
