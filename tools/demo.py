"""The main job: train a small network on the 8x8 handwritten digits and check its test accuracy.

An MLP 64-128-10 (or, with --model conv, a tiny conv net) learns the digits that ship with baregrad (1438
training and 359 test images; see tensor/data/DIGITS_LICENSE.txt) with Adam. One training step (forward,
backward, optimizer update) is one `jit`-ed function: after two calls it replays prebuilt command queues.

Target: with the defaults (300 steps, batch 128) the MLP reaches >= 95% test accuracy (about 97% in practice)
in a few seconds on a 2-core CPU. The command exits with status 1 if the accuracy misses --target; use fewer
--steps and --target 0 for a quick smoke run on a slow (emulated) device."""
from __future__ import annotations
import argparse, sys, time
import numpy as np

TARGET = 0.95


def build_model(kind: str = "mlp", device=None):
  from baregrad.tensor import Tensor, nn
  if kind == "mlp":
    return nn.Sequential(nn.Linear(64, 128, device=device), Tensor.relu, nn.Linear(128, 10, device=device))
  if kind == "conv":
    return nn.Sequential(lambda x: x.reshape(x.shape[0], 1, 8, 8), nn.Conv2d(1, 8, 3, padding=1, device=device),
                         Tensor.relu, lambda x: x.max_pool2d(2), lambda x: x.flatten(1),
                         nn.Linear(8 * 4 * 4, 10, device=device))
  raise ValueError(f"unknown model {kind!r}: expected 'mlp' or 'conv'")


def make_train_step(model, opt):
  """The un-jitted step: returns the loss of the batch, computed from the parameters before the update."""
  from baregrad.tensor import nn
  def train_step(x, y):
    opt.zero_grad()
    loss = nn.cross_entropy(model(x), y)
    loss.backward()
    opt.step(loss)
    return loss
  return train_step


def batches(n: int, batch: int, seed: int):
  """Endless shuffled minibatch indices (full batches only, so every step has the same shapes)."""
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(n)
    for i in range(0, n - batch + 1, batch): yield order[i:i + batch]


def accuracy(model, x: np.ndarray, y: np.ndarray, device=None) -> float:
  from baregrad.tensor import Tensor
  model.eval()
  with Tensor.no_grad():
    pred = model(Tensor(x, device=device)).argmax(-1).numpy()
  model.train()
  return float((pred == y).mean())


class Progress:
  """One line that updates in place on a terminal (\\r); on a pipe, a plain line every ~10% of the steps."""
  def __init__(self, total: int, stream=None):
    self.total, self.stream = total, stream or sys.stdout
    self.tty = self.stream.isatty()
    self.every = max(1, total // 10)

  def update(self, step: int, loss: float, step_ms: float):
    width = 24
    filled = width * step // self.total
    bar = "=" * filled + (">" if filled < width else "") + " " * (width - filled - 1)
    text = f"step {step:>{len(str(self.total))}}/{self.total} [{bar}] loss {loss:7.4f}  {step_ms:7.2f} ms/step"
    if self.tty:
      self.stream.write("\r" + text + ("\n" if step == self.total else ""))
      self.stream.flush()
    elif step % self.every == 0 or step in (1, self.total):
      self.stream.write(text + "\n")
      self.stream.flush()


def train(steps: int = 300, batch: int = 128, lr: float = 0.01, model_kind: str = "mlp", device=None, seed: int = 0,
          use_jit: bool = True, progress: Progress | None = None):
  """Train on the digits; returns (model, losses, seconds of the first step, median seconds of the others)."""
  from baregrad.tensor import Tensor, optim
  from baregrad.tensor.datasets import load_digits
  from baregrad.tensor.jit import jit
  x_train, y_train, _, _ = load_digits()
  Tensor.manual_seed(seed)
  model = build_model(model_kind, device)
  opt = optim.Adam(model.parameters(), lr=lr)
  step_fn = make_train_step(model, opt)
  if use_jit: step_fn = jit(step_fn)
  losses, times = [], []
  order = batches(len(x_train), batch, seed)
  for i in range(steps):
    idx = next(order)
    x, y = Tensor(x_train[idx], device=device), Tensor(y_train[idx], device=device)
    t = time.perf_counter()
    loss = step_fn(x, y).item()
    times.append(time.perf_counter() - t)
    losses.append(loss)
    if progress is not None: progress.update(i + 1, loss, times[-1] * 1e3)
  rest = float(np.median(times[1:])) if len(times) > 1 else 0.0
  return model, losses, (times[0] if times else 0.0), rest


def main(argv=None):
  p = argparse.ArgumentParser(prog="baregrad.tools.demo", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--device", default=None, help="device to run on (default: $DEV or CPU)")
  p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
  p.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
  p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
  p.add_argument("--model", choices=("mlp", "conv"), default="mlp")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-jit", action="store_true", help="run the training step eagerly")
  p.add_argument("--target", type=float, default=TARGET, help=f"test accuracy to reach (default {TARGET})")
  args = p.parse_args(argv)
  if args.steps < 1 or args.batch < 1: p.error("--steps and --batch must be positive")
  from baregrad.tensor.datasets import load_digits
  from baregrad.hcq.device import Device
  device = args.device or Device.default()
  _, _, x_test, y_test = load_digits()
  desc = "MLP 64-128-10" if args.model == "mlp" else "conv 1->8 3x3, maxpool, linear 128->10"
  print(f"device {device}: {desc} on the 8x8 digits (1438 train / 359 test), Adam lr {args.lr}, batch {args.batch}, "
        f"{args.steps} steps, {'jitted' if not args.no_jit else 'eager'} training step")
  t0 = time.perf_counter()
  model, losses, first, rest = train(args.steps, args.batch, args.lr, args.model, args.device, args.seed,
                                     not args.no_jit, Progress(args.steps))
  train_s = time.perf_counter() - t0
  acc = accuracy(model, x_test, y_test, args.device)
  total = time.perf_counter() - t0
  print(f"first step (schedule + compile + run): {first * 1e3:.0f} ms; then {rest * 1e3:.2f} ms/step (median)")
  print(f"training took {train_s:.1f} s; final loss {losses[-1]:.4f}")
  ok = acc >= args.target
  print(f"test accuracy {acc * 100:.2f}% (target >= {args.target * 100:.0f}%): {'OK' if ok else 'MISSED'}  "
        f"[{total:.1f} s total]")
  if not ok: raise SystemExit(1)


if __name__ == "__main__":
  main()
