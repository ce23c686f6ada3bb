"""Process lifecycle and concurrency: exit with work queued, fork() after a device was used, several threads
realizing tensors and calling one jitted function, and training math under CPU contention (numpy is the
reference for every value)."""
import json, os, subprocess, sys, textwrap, threading
import numpy as np
import pytest
from helpers_stress import busy_cores, run_threads
from baregrad.tensor import Tensor
from baregrad.tensor.jit import jit
from baregrad.hcq.buffer import ForkedDeviceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_ENV = {"DEV": "CPU", "EMU": "0"}     # a script about the CPU device runs there whatever DEV/EMU this run has


def run_python(code: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                        timeout=timeout, env=dict(os.environ, **(env or {})))


# ---- exit with work queued ----

def test_exit_with_work_queued_cpu():
  """A script that ends right after queuing kernels: the queued work finishes before anything it uses is released
  (it used to segfault at exit in most runs: buffers and kernel images were unmapped under the running worker)."""
  code = """
    from baregrad.tensor import Tensor
    a = Tensor.rand(512, 512).realize(); xs = [(a @ a + i % 3).realize() for i in range(30)]
  """
  for _ in range(3):
    r = run_python(code, env=CPU_ENV)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-2000:]}"
    assert "did not finish" not in r.stderr


@pytest.mark.parametrize("dev", ["AMD", "NV"])
def test_exit_with_work_queued_emulated(dev):
  r = run_python("""
    from baregrad.tensor import Tensor
    a = Tensor.rand(32, 32).realize(); xs = [(a @ a + i).realize() for i in range(4)]
  """, env={"EMU": "1", "DEV": dev})
  assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-2000:]}"


# ---- fork ----

def _in_child(fn) -> dict:
  """Run fn() in a forked child; its JSON-able result (or the error it raised) comes back through a pipe."""
  rd, wr = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.close(rd)
      try: out = {"ok": fn()}
      except Exception as e: out = {"error": type(e).__name__, "message": str(e)}
      os.write(wr, json.dumps(out).encode())
    finally:
      os._exit(0)
  os.close(wr)
  with os.fdopen(rd) as f: data = f.read()
  _, status = os.waitpid(pid, 0)
  assert status == 0, f"child exit status {status}"
  return json.loads(data)


def test_fork_cpu_child_continues_parent_unaffected():
  a_np = np.arange(64, dtype=np.float32)
  a = Tensor(a_np, device="CPU").realize()
  np.testing.assert_array_equal((a + 1).numpy(), a_np + 1)
  def child():
    b = Tensor(a_np * 10, device="CPU")
    return [(b + 1).numpy().tolist(), (a * 3).numpy().tolist(), (a + 1).numpy().tolist()]
  out = _in_child(child)
  assert "ok" in out, out
  np.testing.assert_array_equal(out["ok"][0], a_np * 10 + 1)     # a kernel the parent loaded, on new data
  np.testing.assert_array_equal(out["ok"][1], a_np * 3)          # the parent's buffers are the child's copies
  np.testing.assert_array_equal(out["ok"][2], a_np + 1)
  for k in range(3):    # the parent's command processor never saw the child's packets
    np.testing.assert_array_equal((a * 2 + k).numpy(), a_np * 2 + k)


def test_fork_cpu_jit_in_child():
  f = jit(lambda x: (x * 2).sum(axis=0))
  full = lambda k: Tensor(np.full((4, 8), k, np.float32), device="CPU")
  for k in range(3): f(full(k))
  out = _in_child(lambda: [f(full(k)).numpy().tolist() for k in range(3, 6)])
  assert out.get("ok") == [[8.0 * k] * 8 for k in range(3, 6)], out
  np.testing.assert_array_equal(f(full(1)).numpy(), np.full(8, 8.0))


@pytest.mark.parametrize("dev", ["AMD", "NV"])
def test_fork_emulated_gpu(dev):
  """The child cannot use the parent's GPU (its buffers give a clear error) but gets a new device of its own
  that runs the same kernels; the parent's device keeps working."""
  r = run_python(f"""
    import json, os, numpy as np
    from baregrad.tensor import Tensor
    a = Tensor(np.arange(16, dtype=np.float32)).realize()
    assert (a + 1).numpy().tolist() == (np.arange(16) + 1).tolist()
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
      out = {{}}
      try: (a + 2).numpy()
      except Exception as e: out["old"] = [type(e).__name__, str(e)]
      out["new"] = (Tensor(np.arange(16, dtype=np.float32) * 10) + 1).numpy().tolist()
      os.write(wr, json.dumps(out).encode()); os._exit(0)
    os.close(wr)
    child = json.loads(os.fdopen(rd).read())
    os.waitpid(pid, 0)
    child["parent"] = (a * 3).numpy().tolist()
    print(json.dumps(child))
  """, env={"EMU": "1", "DEV": dev})
  assert r.returncode == 0, r.stderr[-2000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["old"][0] == ForkedDeviceError.__name__ and "fork" in out["old"][1] and dev in out["old"][1]
  assert out["new"] == (np.arange(16) * 10 + 1).tolist()
  assert out["parent"] == (np.arange(16) * 3).tolist()


def test_emulated_kfd_refuses_ioctls_from_a_forked_child():
  """amdkfd: only the process that opened /dev/kfd may use the descriptor (kfd_ioctl -> -EBADF)."""
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  from baregrad.drivers.amd import kfd
  k = EmulatedKFD()
  fd = k.open("/dev/kfd")
  args = kfd.new_args("GET_VERSION")
  request = kfd.REQUEST["GET_VERSION"]
  k.ioctl(fd, request, args, name="AMDKFD_IOC_GET_VERSION")
  assert args.major_version == 1
  def child():
    try: k.ioctl(fd, request, args, name="AMDKFD_IOC_GET_VERSION")
    except OSError as e: return [e.errno, str(e)]
    return None
  out = _in_child(child)
  import errno
  assert out["ok"] is not None and out["ok"][0] == errno.EBADF, out
  k.close(fd)


# ---- threads ----

def test_jit_from_threads():
  """One jitted function called from 4 threads at once: every call returns its own correct result."""
  w_np = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
  w = Tensor(w_np).realize()
  f = jit(lambda x: (x @ w).relu().sum(axis=1))
  errors, wrong = [], []
  def worker(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
      x = rng.standard_normal((8, 32)).astype(np.float32)
      try:
        got = f(Tensor(x)).numpy()
        if not np.allclose(got, np.maximum(x @ w_np, 0).sum(1), rtol=1e-4, atol=1e-4): wrong.append(seed)
      except Exception as e: errors.append(f"{type(e).__name__}: {e}")
  threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
  for t in threads: t.start()
  for t in threads: t.join(120)
  assert not errors and not wrong, (errors[:3], len(wrong))


def test_realize_from_threads():
  """Eager realizes from 4 threads: timeline values are submitted in the order they are taken (a thread that took
  a value and was preempted before submitting used to leave the timeline behind, and every wait timed out)."""
  errors, wrong = [], []
  def worker(seed):
    rng = np.random.default_rng(seed)
    for i in range(60):
      x = rng.standard_normal((8, 16)).astype(np.float32)
      try:      # (a few distinct constants: a few kernels to compile, the rest of the time spent realizing)
        got = ((Tensor(x) * 2).sum(axis=1) + i % 4).numpy()
        if not np.allclose(got, (x * 2).sum(1) + i % 4, rtol=1e-5, atol=1e-5): wrong.append(seed)
      except Exception as e: errors.append(f"{type(e).__name__}: {e}")
  run_threads(worker, [(s,) for s in range(6)])
  assert not errors and not wrong, (errors[:3], len(wrong))


# ---- gradients under CPU contention ----

def test_conv2d_weight_gradient_under_contention():
  """The conv2d weight gradient, many times while every core is busy with another process: half of it used to come
  back 0.0 in some iterations (a helper thread ran a chunk of the next multi-threaded kernel with the previous
  kernel's arguments)."""
  rng = np.random.default_rng(0)
  a = rng.uniform(-2, 2, (4, 16, 64, 64)).astype(np.float32)
  w = rng.uniform(-2, 2, (6, 16, 5, 2)).astype(np.float32)
  H, W = 60, 63
  ref = np.zeros_like(w)
  for i in range(5):
    for j in range(2): ref[:, :, i, j] = a[:, :, i:i + H, j:j + W].sum(axis=(0, 2, 3))[None, :]
  bad = []
  with busy_cores():
    for it in range(40):
      x, y = Tensor(a), Tensor(w)
      x.conv2d(y).realize()
      loss = x.conv2d(y).sum()
      x.requires_grad = True; y.requires_grad = True
      loss.backward()
      g = y.grad.numpy()
      wrong = ~np.isclose(g, ref, rtol=1e-3, atol=3e-2)
      if wrong.any(): bad.append((it, int(wrong.sum())))
  assert not bad, f"wrong weight gradients in (iteration, values wrong): {bad}"


# ---- memory freed while queued work still uses it ----

def test_buffer_dropped_while_its_kernel_is_queued():
  """A buffer dropped right after the kernel that writes it was queued, with the allocator's cache full: its
  memory goes back to the driver only once that kernel has run (it used to be unmapped at once, and the kernel
  wrote into unmapped memory)."""
  r = run_python("""
    import gc, numpy as np
    from baregrad.tensor import Tensor
    from baregrad.hcq.device import Device
    from baregrad.hcq.signal import Signal
    from baregrad.drivers.cpu.processor import futex_wake
    dev = Device.get("CPU")
    dev.allocator.max_cached = 0                     # nothing is kept for reuse: freed memory goes to the driver
    x = Tensor(np.ones((512, 512), np.float32)).realize()
    gate = Signal(dev, "gate")
    dev.compute_queue().wait(gate, 1).submit(dev)    # everything queued from here waits for the host
    y = (x * 3 + 1).realize()                        # queued, not run
    del y; gc.collect()                              # its buffer is freed with the kernel still queued
    gate.value = 1; futex_wake(gate.addr)
    dev.synchronize()
    z = (x + 2).realize()
    assert float(z.numpy().sum()) == 3 * 512 * 512
    print("ok")
  """, env=CPU_ENV)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"exit status {r.returncode}\n{r.stderr[-2000:]}"


# ---- deep graphs ----

def test_deep_chain_compiles_on_small_thread_stacks():
  """A chain of 6000 elementwise steps (12000 ops deep), realized on a thread with a 256 KiB stack: it used to
  overflow the C stack (the compiler raised the process-wide recursion limit to 20000 and recursed through C)."""
  r = run_python("""
    import sys, threading, numpy as np
    from baregrad.tensor import Tensor
    assert sys.getrecursionlimit() == 1000      # importing baregrad leaves the interpreter's limit alone
    out = []
    def run():
      y = Tensor(np.ones(4, np.float32))
      for _ in range(6000): y = y * 1.0001 + 0.5
      out.append(y.numpy())
    threading.stack_size(256 << 10)
    t = threading.Thread(target=run); t.start(); t.join()
    ref = np.ones(4, np.float32)
    for _ in range(6000): ref = ref * np.float32(1.0001) + np.float32(0.5)
    np.testing.assert_allclose(out[0], ref, rtol=1e-5)
    print("ok")
  """)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"exit status {r.returncode}\n{r.stderr[-2000:]}"


def test_signal_slot_not_reused_while_a_queued_command_writes_it():
  """A Signal dropped while a queued command still writes it: its slot used to go to the next Signal at once, which
  then saw the old command's value (a wait on it would return early)."""
  from baregrad.hcq.device import Device
  from baregrad.hcq.signal import Signal
  from baregrad.drivers.cpu.processor import futex_wake
  dev = Device.get("CPU")
  dev.synchronize()
  gate, old = Signal(dev, "gate"), Signal(dev, "old")
  dev.compute_queue().wait(gate, 1).signal(old, 0xBAD).signal(dev.timeline, dev.next_timeline()).submit(dev)
  del old
  new = Signal(dev, "new")
  gate.value = 1
  futex_wake(gate.addr)
  dev.synchronize()
  assert new.value == 0


def test_a_failed_submit_leaves_no_timeline_value_to_wait_for(monkeypatch):
  """A submit that raises (a driver refusing a launch) sent nothing: synchronize afterwards returns at once instead of
  waiting (30 s, then a timeout) for the timeline value taken for it, and the device keeps working."""
  import time
  from baregrad.hcq.device import Device
  dev = Device.get("CPU")
  x = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
  def refuse(kind, encoded): raise RuntimeError("the driver refuses this submit")
  monkeypatch.setattr(dev.driver, "submit", refuse)
  with pytest.raises(RuntimeError, match="refuses"): (x * 3 + 1).realize()
  monkeypatch.undo()
  t = time.perf_counter()
  dev.synchronize(timeout=5)
  assert time.perf_counter() - t < 1
  np.testing.assert_array_equal((x * 2).numpy(), np.arange(8, dtype=np.float32) * 2)
