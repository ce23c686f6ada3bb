"""The CPU device starts without waiting for its own C compiler, and its kernels keep their register tiles.

- The command processor's worker (worker.c) compiles on the processor's thread while the host goes on; memory the
  host registers meanwhile is handed to the worker once it is loaded (a checked processor faults on memory it was
  not told about). A fresh process (its worker not loaded yet) holds the compile at an event to see that.
- x86-64 kernels are compiled for 512-bit vectors where the CPU has them: objdump of the 1024 matmul kernel shows its
  multiply-adds on zmm registers and no accumulator spilled to the stack (both compilers prefer 256-bit vectors for
  -march=native on Intel cores, which splits each 64-byte accumulator in two and spills half of the tile).
"""
import os, re, shutil, subprocess, sys
import pytest

STARTUP = r"""
import threading, time, numpy as np
from baregrad.drivers.cpu import cc, processor
from baregrad.drivers.cpu.processor import CommandProcessor, Op, packet, address_space, _Worker
release, original = threading.Event(), cc.compile_c
def held(src, *a, **k):
  if "bg_worker_run" in src: assert release.wait(60)
  return original(src, *a, **k)
cc.compile_c = held
proc = CommandProcessor(checked=True)
target = np.zeros(1, np.uint64)
t = time.perf_counter()
address_space.map(target.ctypes.data, 8)          # registered while the worker compiles: must not wait for it
assert time.perf_counter() - t < 5 and _Worker._instance is None, "registering memory waited for the worker"
release.set()
proc.write(packet(Op.SIGNAL, target.ctypes.data, 7))
assert proc.wait_value(target.ctypes.data, 7, timeout=60), proc.fault
assert proc.fault is None and int(target[0]) == 7
print("ok")
"""


def test_worker_compiles_in_the_background_and_gets_earlier_memory(tmp_path):
  env = dict(os.environ, BAREGRAD_CACHE=str(tmp_path))    # an empty cache: the worker is really compiled
  out = subprocess.run([sys.executable, "-c", STARTUP], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


MATMUL = r"""
import numpy as np
from baregrad.tensor import Tensor
items = (Tensor(np.ones((1024, 1024), np.float32)) @ Tensor(np.ones((1024, 1024), np.float32))).schedule()
print(items[-1].program.source)
"""


@pytest.mark.skipif(" avx512f" not in open("/proc/cpuinfo").read() or not shutil.which("objdump"),
                    reason="needs an AVX-512 x86-64 host and objdump")
@pytest.mark.parametrize("compiler", ["gcc", "clang-19"])
def test_matmul_tile_stays_in_zmm_registers(tmp_path, compiler):
  if not shutil.which(compiler): pytest.skip(f"{compiler} not installed")
  from baregrad.drivers.cpu import driver
  env = {k: v for k, v in os.environ.items() if k not in ("DEV", "EMU")}    # the CPU device's kernel, whatever DEV is
  src = subprocess.run([sys.executable, "-c", MATMUL], env=env, capture_output=True, text=True, timeout=300,
                       check=True).stdout
  obj = tmp_path / "k.o"
  subprocess.run([compiler, *driver.KERNEL_FLAGS, "-c", "-x", "c", "-", "-o", str(obj)], input=src.encode(),
                 check=True, capture_output=True)
  asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, check=True).stdout
  fma = [line for line in asm.splitlines() if "vfmadd" in line]
  assert len(fma) >= 16 and all("zmm" in line for line in fma), "\n".join(fma[:20])
  spills = [line for line in asm.splitlines() if re.search(r"mov\w*\s+%[xyz]mm\d+,.*\(%rsp\)", line)]
  assert not spills, "\n".join(spills[:10])


def test_a_processor_whose_worker_failed_to_load_says_so_at_once(monkeypatch):
  """The processor's thread loads the worker; if that fails there (while the host's own load later succeeds), the
  thread is gone and nothing consumes the ring: the host's next wait raises that error at once, not a timeout after
  30 s per wait (seen once under load: every later op of the process timed out)."""
  import threading, time
  import numpy as np
  from baregrad.drivers.cpu import processor
  from baregrad.drivers.cpu.processor import CommandProcessor, Op, packet, ProcessorFault, _Worker
  original = _Worker.get.__func__
  def get(cls):
    if threading.current_thread().name == "baregrad-cpu-processor": raise OSError("the worker image did not load")
    return original(cls)
  monkeypatch.setattr(processor._Worker, "get", classmethod(get))
  proc = CommandProcessor()
  try:
    proc._thread.join(10)
    target = np.zeros(1, np.uint64)
    t = time.monotonic()
    with pytest.raises(ProcessorFault, match="thread is not running.*OSError: the worker image did not load"):
      proc.write(packet(Op.SIGNAL, target.ctypes.data, 7))
      proc.wait_value(target.ctypes.data, 7, timeout=30)
    assert time.monotonic() - t < 5
  finally:
    proc.stop()
