"""Time the RDNA3 emulator on a naive float32 matmul loop kernel (not a test: run it directly).

    python tests/emu/bench_rdna3_matmul.py [n]      # default n = 256: 65536 threads x 256 iterations
"""
import sys
import time

import numpy as np

from emu_helpers import Buffers, code_object, matmul_loop_source
from baregrad.drivers.emu.rdna3 import dispatch


def main(n: int = 256) -> float:
  rng = np.random.default_rng(0)
  a, b = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
  c = np.zeros((n, n), np.float32)
  co = code_object(matmul_loop_source(n), vgprs=16, workgroup_ids=2, workitem_dims=2)
  bufs = Buffers(a, b, c)
  start = time.perf_counter()
  steps = dispatch(co, (n // 16, n // 16, 1), (16, 16, 1), bufs.kernarg, bufs.mem)
  seconds = time.perf_counter() - start
  err = float(np.abs(bufs.arrays[2] - a @ b).max())
  print(f"{n}x{n}x{n} matmul loop kernel: {seconds:.2f} s, {steps} instruction steps, {n ** 3 / seconds / 1e6:.1f} M FMA/s, "
        f"max |err| vs numpy {err:.2e}")
  return seconds


if __name__ == "__main__":
  main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
