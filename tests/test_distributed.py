"""Collectives across processes on MPI (tensor/distributed.py), run for real under `mpirun --oversubscribe -np N`
(loopback). The rank side is tests/helpers_mpi.py: each rank checks its results against numpy. Needs Open MPI and
mpi4py (.ci/run installs both: apt openmpi-bin libopenmpi-dev, pip '.[distributed]')."""
import os, shutil, subprocess, sys, time
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIRUN = shutil.which("mpirun")
try:
  import mpi4py  # noqa: F401
  HAVE_MPI4PY = True
except ImportError:
  HAVE_MPI4PY = False
needs_mpi = pytest.mark.skipif(not (MPIRUN and HAVE_MPI4PY), reason="needs mpirun (apt install openmpi-bin "
                               "libopenmpi-dev) and mpi4py (pip install -e '.[distributed]')")


def mpirun(n: int, mode: str, timeout: float = 240, **env):
  cmd = [MPIRUN, "--oversubscribe", "-np", str(n)]
  if os.geteuid() == 0: cmd.insert(1, "--allow-run-as-root")
  e = {k: v for k, v in os.environ.items() if k not in ("EMU", "DEV")}
  e.update(env)
  t = time.monotonic()
  p = subprocess.run(cmd + [sys.executable, os.path.join(HERE, "helpers_mpi.py"), mode], capture_output=True,
                     text=True, timeout=timeout, env=e, cwd=ROOT)
  return p, time.monotonic() - t


def check_ok(p, n: int, mode: str):
  out = p.stdout + p.stderr
  assert p.returncode == 0, out[-4000:]
  for r in range(n): assert f"RANK {r} OK {mode}" in p.stdout, out[-4000:]


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("emu", [False, True], ids=["CPU", "EMU-AMD"])
def test_collectives_against_numpy(n, emu):
  """allreduce (every op; float32, int32, float16, bfloat16; views; more than one staging chunk), broadcast,
  allgather and reduce_scatter on two axes, a shape mismatch named on every rank, a jitted function with an
  allreduce in it replayed with new inputs, and (CPU) tensors on two devices of each process."""
  p, _ = mpirun(n, "collectives", **({"EMU": "1", "DEV": "AMD"} if emu else {}))
  check_ok(p, n, "collectives")


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_data_parallel_training_equals_one_process(n):
  """20 jitted Adam steps with the global batch split across the ranks give rank 0's parameters and the global
  losses of one process training on the whole batch, to 1e-5 (checked on every rank)."""
  p, _ = mpirun(n, "training")
  check_ok(p, n, "training")


@needs_mpi
def test_a_rank_that_raises_ends_every_rank_with_it_named():
  p, took = mpirun(3, "fails", timeout=60)
  out = p.stdout + p.stderr
  assert p.returncode != 0, out[-3000:]
  assert "baregrad.distributed: rank 1 failed (ValueError: rank one breaks in step 3)" in out, out[-3000:]
  # the others name it themselves (each waits on MPI when the notice comes)
  for r in (0, 2):
    assert f"baregrad.distributed: rank {r}: rank 1 failed: ValueError: rank one breaks in step 3" in out, out[-3000:]
  assert took < 20, f"took {took:.1f} s; the ranks sleep 60 s after the failure unless stopped"


def run_py(code: str, **env):
  e = {k: v for k, v in os.environ.items() if k not in ("EMU", "DEV")}
  e.update(env)
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e, cwd=ROOT)


def test_without_mpi4py_the_error_says_what_to_install():
  p = run_py("import sys; sys.modules['mpi4py'] = None\n"
             "from baregrad.tensor import distributed as d\n"
             "try: d.init()\n"
             "except ImportError as e: print('ERR', e)\n")
  assert "ERR" in p.stdout and "openmpi-bin" in p.stdout and ".[distributed]" in p.stdout, p.stdout + p.stderr


@needs_mpi
def test_single_process_world_and_argument_errors():
  p = run_py("import numpy as np\n"
             "from baregrad.tensor import Tensor, distributed as d\n"
             "try: d.rank()\n"
             "except RuntimeError as e: print('E1', e)\n"
             "for bad in (-1, 0, float('nan')):\n"
             "  try: d.init(timeout=bad)\n"
             "  except ValueError as e: print('ET', e)\n"
             "w = d.init()\n"
             "print('W', w.rank, w.size, w.device)\n"
             "x = Tensor(np.arange(4, dtype=np.float32))\n"
             "print('V', d.allreduce(x, 'mean').numpy().tolist(), d.allgather(x).numpy().tolist())\n"
             "for bad in (lambda: d.allreduce(x, 'avg'), lambda: d.broadcast(x, 1), lambda: d.allgather(x, 2),\n"
             "            lambda: d.allreduce([])):\n"
             "  try: bad()\n"
             "  except (ValueError, TypeError) as e: print('E', e)\n")
  out = p.stdout
  assert "E1 baregrad.tensor.distributed: call init() first" in out, out + p.stderr
  assert out.count("ET timeout must be a number of seconds > 0") == 3, out + p.stderr
  assert "W 0 1 CPU" in out and "V [0.0, 1.0, 2.0, 3.0] [0.0, 1.0, 2.0, 3.0]" in out, out + p.stderr
  assert "op must be one of sum, mean, max, min, prod, got 'avg'" in out, out
  assert "root 1 is not a rank (0..0)" in out and "axis 2 out of range for 1 dims" in out and "an empty list" in out, out


@pytest.mark.parametrize("extra", [["--model", "transformer"], ["--devices", "2"]])
def test_demo_refuses_what_it_cannot_run_distributed(extra):
  p = subprocess.run([sys.executable, "-m", "baregrad.tools.demo", "--distributed", *extra], capture_output=True,
                     text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 2 and "--distributed runs" in p.stderr, p.stderr
