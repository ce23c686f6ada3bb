"""The main job: a small real workload on the default device (DEV=CPU|AMD|NV|METAL), checked against numpy.

For now: a 784-128-10 MLP forward pass on random weights for a batch of 64."""
from __future__ import annotations
import argparse, time
import numpy as np


def main(argv=None):
  p = argparse.ArgumentParser(prog="baregrad.tools.demo", description=__doc__)
  p.add_argument("--device", default=None, help="device to run on (default: $DEV or CPU)")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--runs", type=int, default=10)
  args = p.parse_args(argv)
  from baregrad.tensor import Tensor
  from baregrad.hcq.device import Device
  rng = np.random.default_rng(0)
  w1, b1 = (rng.standard_normal((784, 128)) * 0.05).astype(np.float32), (rng.standard_normal(128) * 0.1).astype(np.float32)
  w2, b2 = (rng.standard_normal((128, 10)) * 0.05).astype(np.float32), (rng.standard_normal(10) * 0.1).astype(np.float32)
  x = rng.standard_normal((args.batch, 784)).astype(np.float32)
  dev = args.device or Device.default()
  X, W1, B1, W2, B2 = (Tensor(a, device=dev) for a in (x, w1, b1, w2, b2))

  def forward(): return ((X @ W1 + B1).relu() @ W2 + B2).softmax()
  t = time.perf_counter()
  out = forward().numpy()
  first = time.perf_counter() - t
  times = []
  for _ in range(args.runs):
    t = time.perf_counter(); forward().numpy(); times.append(time.perf_counter() - t)
  h = np.maximum(x @ w1 + b1, 0) @ w2 + b2
  ref = np.exp(h - h.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
  err = float(np.abs(out - ref).max())
  print(f"device {dev}: MLP 784-128-10 forward + softmax, batch {args.batch}")
  print(f"predicted classes (first 10): {out.argmax(-1)[:10].tolist()}")
  print(f"max |baregrad - numpy| = {err:.2e}  ({'OK' if err < 1e-4 else 'MISMATCH'})")
  print(f"first run (schedule + compile + run): {first * 1e3:.1f} ms; steady state: {np.median(times) * 1e3:.2f} ms")
  if err >= 1e-4: raise SystemExit(1)


if __name__ == "__main__":
  main()
