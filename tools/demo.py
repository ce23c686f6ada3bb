"""The main job: train a small network on the 8x8 handwritten digits and check its test accuracy.

An MLP 64-128-10 (or, with --model conv, a tiny conv net) learns the digits that ship with baregrad (1438
training and 359 test images; see tensor/data/DIGITS_LICENSE.txt) with Adam. One training step (forward,
backward, optimizer update) is one `jit`-ed function: after two calls it replays prebuilt command queues.

Target: with the defaults (300 steps, batch 128) the MLP reaches >= 95% test accuracy (about 97% in practice)
in a few seconds on a 2-core CPU. The command exits with status 1 if the accuracy misses --target; use fewer
--steps and --target 0 for a quick smoke run on a slow (emulated) device. With --devices N each batch is split
across N devices of the --device kind (CPU, CPU:1, ...; with EMU=1 DEV=AMD the emulated AMD, AMD:1, ...), the
parameters replicated and their gradients allreduced (tensor/multi.py): the same updates as on one device.

The second job, `--model transformer`: a character-level transformer (token and position embeddings, two pre-LN
blocks of causal multi-head attention and a GELU MLP, a final layer norm, a linear head) learns to predict the
next character of the first three chapters of "Alice's Adventures in Wonderland" (public domain; see
tensor/data/ALICE_LICENSE.txt), 90% for training and the last 10% held out. It prints the training loss every
--log-every steps, then the held-out loss and a short sample. It checks that the held-out loss (nats per
character) ends below that of the best character-bigram model of the training text (what a model that reads
only the previous character could reach); --target 0 skips the check. With the defaults (300 steps, batch 16
of 64 characters) it runs in about a minute or two on 2 CPU cores, plus about a minute to compile its kernels
the first time (they are cached on disk)."""
from __future__ import annotations
import argparse, math, sys, time
import numpy as np

TARGET = 0.95
TEXT_FILE = "alice.txt"
# the character model's defaults: sized to train in about a minute or two on 2 CPU cores
CHAR_DEFAULTS = dict(steps=300, batch=16, lr=3e-3, context=64, dim=64, heads=4, layers=2)


def build_model(kind: str = "mlp", device=None):
  from baregrad.tensor import Tensor, nn
  if kind == "mlp":
    return nn.Sequential(nn.Linear(64, 128, device=device), Tensor.relu, nn.Linear(128, 10, device=device))
  if kind == "conv":
    return nn.Sequential(lambda x: x.reshape(x.shape[0], 1, 8, 8), nn.Conv2d(1, 8, 3, padding=1, device=device),
                         Tensor.relu, lambda x: x.max_pool2d(2), lambda x: x.flatten(1),
                         nn.Linear(8 * 4 * 4, 10, device=device))
  raise ValueError(f"unknown model {kind!r}: expected 'mlp' or 'conv'")


def make_train_step(model, opt, weight: float | None = None):
  """The un-jitted step: returns the loss of the batch, computed from the parameters before the update. With
  `weight` (this rank's share of the global batch) the step is data parallel across MPI ranks: the gradients and
  the loss are averaged over the ranks (tensor/distributed.py) before the update, and the loss is the global one."""
  from baregrad.tensor import nn
  def train_step(x, y):
    opt.zero_grad()
    loss = nn.cross_entropy(model(x), y)
    loss.backward()
    if weight is not None:
      from baregrad.tensor import distributed as dist
      loss = dist.average_gradients(opt.params, loss, weight)
    opt.step(loss)
    return loss
  return train_step


def batches(n: int, batch: int, seed: int):
  """Endless shuffled minibatch indices (full batches only, so every step has the same shapes)."""
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(n)
    for i in range(0, n - batch + 1, batch): yield order[i:i + batch]


def place(a: np.ndarray, device=None):
  """A host array as a Tensor on `device`, or with a tuple of devices split along its first axis across them
  (data parallel: each device gets its part of the batch)."""
  from baregrad.tensor import Tensor
  if isinstance(device, tuple): return Tensor(a, device=device[0]).shard(device, axis=0)
  return Tensor(a, device=device)


def accuracy(model, x: np.ndarray, y: np.ndarray, device=None) -> float:
  from baregrad.tensor import Tensor
  model.eval()
  with Tensor.no_grad():
    pred = model(place(x, device)).argmax(-1).numpy()
  model.train()
  return float((pred == y).mean())


class Progress:
  """One line that updates in place on a terminal (\\r); on a pipe, a plain line every ~10% of the steps."""
  def __init__(self, total: int, stream=None, every: int | None = None, tty: bool | None = None):
    self.total, self.stream = total, stream or sys.stdout
    self.tty = self.stream.isatty() if tty is None else tty
    self.every = max(1, total // 10) if every is None else max(1, every)

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
          use_jit: bool = True, progress: Progress | None = None, distributed: bool = False):
  """Train on the digits; returns (model, losses, seconds of the first step, median seconds of the others).
  distributed: data parallel across the MPI ranks (distributed.init() called): `batch` is the global batch, each rank
  trains on its part of it, the weights start as rank 0's and the gradients are averaged every step."""
  from baregrad.tensor import Tensor, optim
  from baregrad.tensor.datasets import load_digits
  from baregrad.tensor.jit import jit
  x_train, y_train, _, _ = load_digits()
  Tensor.manual_seed(seed)
  model = build_model(model_kind, device)
  opt = optim.Adam(model.parameters(), lr=lr)
  part, weight = (0, batch), None
  if distributed:
    from baregrad.tensor import distributed as dist
    dist.broadcast_parameters(opt.params, root=0)
    part = dist.batch_part(batch)
    weight = (part[1] - part[0]) / batch
  step_fn = make_train_step(model, opt, weight)
  if use_jit: step_fn = jit(step_fn)
  losses, times = [], []
  order = batches(len(x_train), batch, seed)
  for i in range(steps):
    idx = next(order)[part[0]:part[1]]
    x, y = place(x_train[idx], device), place(y_train[idx], device)
    t = time.perf_counter()
    loss = step_fn(x, y).item()
    times.append(time.perf_counter() - t)
    losses.append(loss)
    if progress is not None: progress.update(i + 1, loss, times[-1] * 1e3)
  rest = float(np.median(times[1:])) if len(times) > 1 else 0.0
  return model, losses, (times[0] if times else 0.0), rest


# ---------------------------------------------------------------- the character-level transformer

def load_text() -> str:
  """The training text that ships with baregrad (tensor/data/alice.txt)."""
  import os
  from baregrad.tensor.datasets import DATA_DIR
  path = os.path.join(DATA_DIR, TEXT_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing; the baregrad install is incomplete (package data 'data/*' of "
                            f"baregrad.tensor)")
  with open(path, encoding="utf-8") as f: return f.read()


class CharVocab:
  """The characters of a text, numbered in sorted order."""
  def __init__(self, text: str):
    self.chars = sorted(set(text))
    self.index = {c: i for i, c in enumerate(self.chars)}
  def __len__(self): return len(self.chars)
  def encode(self, text: str) -> np.ndarray: return np.array([self.index[c] for c in text], dtype=np.int32)
  def decode(self, ids) -> str: return "".join(self.chars[int(i)] for i in ids)


def build_char_model(vocab_size: int, context: int, dim: int = 64, heads: int = 4, layers: int = 2, device=None):
  """Token + position embeddings, `layers` causal pre-LN transformer blocks, a final LayerNorm, a linear head."""
  from baregrad.tensor import Tensor, nn

  class CharTransformer(nn.Module):
    def __init__(self):
      self.tok_emb = nn.Embedding(vocab_size, dim, device=device)
      self.pos_emb = nn.Embedding(context, dim, device=device)
      self.blocks = [nn.TransformerBlock(dim, heads, device=device) for _ in range(layers)]
      self.ln_f = nn.LayerNorm(dim, device=device)
      self.head = nn.Linear(dim, vocab_size, device=device)
      self.context = context

    def forward(self, idx):
      """(N, T) character ids, T <= context -> (N, T, vocab) logits of the next character."""
      if idx.shape[-1] > self.context:
        raise ValueError(f"CharTransformer: {idx.shape[-1]} characters do not fit its context of {self.context}")
      x = self.tok_emb(idx) + self.pos_emb(Tensor.arange(idx.shape[-1], device=idx.device))
      for block in self.blocks: x = block(x)
      return self.head(self.ln_f(x))

  return CharTransformer()


def char_windows(data: np.ndarray, batch: int, context: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """`batch` random windows of `context` characters and the same windows shifted by one (the targets)."""
  start = rng.integers(0, len(data) - context - 1, batch)
  idx = start[:, None] + np.arange(context)
  return data[idx], data[idx + 1]


def make_char_train_step(model, opt, vocab_size: int):
  def train_step(x, y):
    opt.zero_grad()
    loss = model(x).reshape(-1, vocab_size).cross_entropy(y.reshape(-1))
    loss.backward()
    opt.step(loss)
    return loss
  return train_step


def char_loss(model, data: np.ndarray, context: int, batch: int, vocab_size: int, device=None) -> float:
  """Mean next-character loss (nats) of `model` over every full window of `data` (non-overlapping)."""
  from baregrad.tensor import Tensor
  n = (len(data) - 1) // context
  starts = np.arange(n) * context
  total, count = 0.0, 0
  model.eval()
  with Tensor.no_grad():
    for i in range(0, n, batch):
      s = starts[i:i + batch]
      if len(s) < batch: s = np.concatenate([s, np.repeat(s[-1:], batch - len(s))])   # same shape: no recompile
      idx = s[:, None] + np.arange(context)
      per = model(Tensor(data[idx], device=device)).reshape(-1, vocab_size).cross_entropy(
        Tensor(data[idx + 1].reshape(-1), device=device), reduction="none").numpy().reshape(batch, context)
      keep = min(batch, n - i)
      total, count = total + float(per[:keep].sum()), count + keep * context
  model.train()
  return total / count


def bigram_loss(train: np.ndarray, held_out: np.ndarray, vocab_size: int) -> float:
  """Held-out loss (nats per character) of the best add-k smoothed character-bigram model of `train`: the bar
  a model that only reads the previous character cannot get under by much."""
  counts = np.zeros((vocab_size, vocab_size))
  np.add.at(counts, (train[:-1], train[1:]), 1)
  best = math.inf
  for k in (0.01, 0.03, 0.1, 0.3, 1.0):
    p = (counts + k) / (counts + k).sum(1, keepdims=True)
    best = min(best, float(-np.log(p[held_out[:-1], held_out[1:]]).mean()))
  return best


def sample_chars(model, vocab: CharVocab, prompt: str, length: int, temperature: float = 0.8, seed: int = 0,
                 device=None) -> str:
  """Continue `prompt` by `length` characters, sampling each from the model's softmax / temperature. The model
  reads the last `context` characters; it runs as one jitted function of a fixed shape."""
  from baregrad.tensor import Tensor
  from baregrad.tensor.jit import jit
  context = model.context
  ids = list(vocab.encode(prompt[-context:].rjust(context)))   # left-padded with spaces to the full context
  rng = np.random.default_rng(seed)
  model.eval()
  forward = jit(lambda x: (model(x)[:, -1, :] * (1 / temperature)).softmax(-1))
  out = []
  with Tensor.no_grad():
    for _ in range(length):
      probs = forward(Tensor(np.array([ids[-context:]], dtype=np.int32), device=device)).numpy()[0].astype(np.float64)
      nxt = int(rng.choice(len(probs), p=probs / probs.sum()))
      ids.append(nxt)
      out.append(nxt)
  model.train()
  return vocab.decode(out)


def train_char(steps: int = 300, batch: int = 16, lr: float = 3e-3, context: int = 64, dim: int = 64, heads: int = 4,
               layers: int = 2, device=None, seed: int = 0, use_jit: bool = True, progress: Progress | None = None,
               text: str | None = None):
  """Train the character model; returns (model, vocab, train data, held-out data, losses, first-step seconds,
  median seconds of the other steps). `text` (default: the shipped excerpt) is split 90/10."""
  from baregrad.tensor import Tensor, optim
  from baregrad.tensor.jit import jit
  text = load_text() if text is None else text
  vocab = CharVocab(text)
  data = vocab.encode(text)
  split = int(len(data) * 0.9)
  train_data, held_out = data[:split], data[split:]
  if len(train_data) <= context + 1 or len(held_out) <= context + 1:
    raise ValueError(f"train_char: a text of {len(text)} characters is too short for a context of {context}")
  Tensor.manual_seed(seed)
  model = build_char_model(len(vocab), context, dim, heads, layers, device)
  opt = optim.Adam(model.parameters(), lr=lr)
  step_fn = make_char_train_step(model, opt, len(vocab))
  if use_jit: step_fn = jit(step_fn)
  rng = np.random.default_rng(seed)
  losses, times = [], []
  for i in range(steps):
    xb, yb = char_windows(train_data, batch, context, rng)
    x, y = Tensor(xb, device=device), Tensor(yb, device=device)
    t = time.perf_counter()
    loss = step_fn(x, y).item()
    times.append(time.perf_counter() - t)
    losses.append(loss)
    if progress is not None:   # the mean over the steps since the last line: one batch of 16 is noisy
      n = min(progress.every, (i % progress.every) + 1)
      progress.update(i + 1, float(np.mean(losses[-n:])), float(np.mean(times[-n:])) * 1e3)
  rest = float(np.median(times[1:])) if len(times) > 1 else 0.0
  return model, vocab, train_data, held_out, losses, (times[0] if times else 0.0), rest


def main_transformer(args) -> None:
  from baregrad.hcq.device import Device
  device = args.device or Device.default()
  opts = dict(CHAR_DEFAULTS)
  for k in ("steps", "batch", "lr"):
    if getattr(args, k) is not None: opts[k] = getattr(args, k)
  text = load_text()
  print(f"device {device}: character transformer ({opts['layers']} pre-LN blocks, dim {opts['dim']}, "
        f"{opts['heads']} heads, context {opts['context']}) on {len(text)} characters of \"Alice's Adventures in "
        f"Wonderland\" (90% train / 10% held out), Adam lr {opts['lr']}, batch {opts['batch']}, {opts['steps']} steps, "
        f"{'jitted' if not args.no_jit else 'eager'} training step")
  every = args.log_every if args.log_every else max(1, opts["steps"] // 12)
  print(f"(each line: the mean training loss and time per step over the last {every} steps)")
  t0 = time.perf_counter()
  model, vocab, train_data, held_out, losses, first, rest = train_char(
    opts["steps"], opts["batch"], opts["lr"], opts["context"], opts["dim"], opts["heads"], opts["layers"],
    args.device, args.seed, not args.no_jit, Progress(opts["steps"], every=every, tty=False))
  train_s = time.perf_counter() - t0
  held = char_loss(model, held_out, opts["context"], opts["batch"], len(vocab), args.device)
  bar = bigram_loss(train_data, held_out, len(vocab))
  print(f"first step (schedule + compile + run): {first * 1e3:.0f} ms; then {rest * 1e3:.2f} ms/step (median)")
  n = min(every, len(losses))
  print(f"training took {train_s:.1f} s; mean loss of the first {n} steps {np.mean(losses[:n]):.4f}, of the last {n} "
        f"{np.mean(losses[-n:]):.4f} (a uniform guess: ln {len(vocab)} = {math.log(len(vocab)):.4f})")
  if args.sample:
    prompt = vocab.decode(held_out[:opts["context"]])
    print(f"sample (temperature 0.8) after {prompt[-30:]!r}:")
    sample = sample_chars(model, vocab, prompt, args.sample, seed=args.seed, device=args.device)
    print("  " + sample.replace("\n", "\n  "))
  ok = args.target == 0 or held < bar
  print(f"held-out loss {held:.4f} nats/char (character-bigram model: {bar:.4f}): "
        f"{'OK' if ok else 'MISSED'}  [{time.perf_counter() - t0:.1f} s total]")
  if not ok: raise SystemExit(1)


def main(argv=None):
  p = argparse.ArgumentParser(prog="baregrad.tools.demo", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--device", default=None, help="device to run on (default: $DEV or CPU)")
  p.add_argument("--steps", type=int, default=None, help="training steps (default 300)")
  p.add_argument("--batch", type=int, default=None, help="batch size (default 128; transformer: 16)")
  p.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 0.01; transformer: 0.003)")
  p.add_argument("--model", choices=("mlp", "conv", "transformer"), default="mlp",
                 help="mlp or conv: the digits (default mlp); transformer: the character-level text model")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--devices", type=int, default=1,
                 help="digits: split each batch across N devices of --device's kind (CPU, CPU:1, ...; with EMU=1 the "
                      "emulated AMD:i / NV:i), the parameters replicated and their gradients allreduced (default 1)")
  p.add_argument("--distributed", action="store_true",
                 help="digits: data parallel across MPI ranks (run under mpirun; needs the [distributed] extra): each "
                      "rank trains on its part of every batch on its own device, rank 0 prints")
  p.add_argument("--no-jit", action="store_true", help="run the training step eagerly")
  p.add_argument("--target", type=float, default=TARGET,
                 help=f"digits: test accuracy to reach (default {TARGET}); transformer: 0 skips its check")
  p.add_argument("--log-every", type=int, default=None,
                 help="transformer: print the loss every N steps (default: steps / 12)")
  p.add_argument("--sample", type=int, default=200, help="transformer: characters to sample at the end (default 200)")
  args = p.parse_args(argv)
  if (args.steps is not None and args.steps < 1) or (args.batch is not None and args.batch < 1):
    p.error("--steps and --batch must be positive")
  if args.log_every is not None and args.log_every < 1: p.error("--log-every must be positive")
  if args.devices < 1: p.error("--devices must be positive")
  if args.devices > 1 and args.model == "transformer": p.error("--devices runs the digits models (mlp, conv)")
  if args.distributed and args.model == "transformer": p.error("--distributed runs the digits models (mlp, conv)")
  if args.distributed and args.devices > 1: p.error("--distributed runs one device per rank (use more ranks instead of --devices)")
  if args.model == "transformer": return main_transformer(args)
  args.steps = 300 if args.steps is None else args.steps
  args.batch = 128 if args.batch is None else args.batch
  args.lr = 0.01 if args.lr is None else args.lr
  from baregrad.tensor.datasets import load_digits
  from baregrad.hcq.device import Device
  device = args.device or Device.default()
  if args.distributed: return main_distributed(args, p)
  if args.devices > 1:     # data parallel: the batch split across the devices, the gradients allreduced
    kind = device.split(":")[0]
    device = args.device = tuple(kind if i == 0 else f"{kind}:{i}" for i in range(args.devices))
  _, _, x_test, y_test = load_digits()
  desc = "MLP 64-128-10" if args.model == "mlp" else "conv 1->8 3x3, maxpool, linear 128->10"
  where = f"devices {', '.join(device)} (data parallel)" if isinstance(device, tuple) else f"device {device}"
  print(f"{where}: {desc} on the 8x8 digits (1438 train / 359 test), Adam lr {args.lr}, batch {args.batch}, "
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


def main_distributed(args, parser) -> None:
  """--distributed: every rank runs this; rank 0 prints."""
  import io
  from baregrad.tensor import distributed as dist
  from baregrad.tensor.datasets import load_digits
  world = dist.init()
  device = args.device = args.device or world.device
  out = sys.stdout if world.rank == 0 else io.StringIO()
  _, _, x_test, y_test = load_digits()
  desc = "MLP 64-128-10" if args.model == "mlp" else "conv 1->8 3x3, maxpool, linear 128->10"
  print(f"{world.size} ranks (MPI), data parallel; rank 0 on {device}: {desc} on the 8x8 digits, Adam lr {args.lr}, "
        f"global batch {args.batch}, {args.steps} steps, {'jitted' if not args.no_jit else 'eager'} training step",
        file=out)
  t0 = time.perf_counter()
  model, losses, first, rest = train(args.steps, args.batch, args.lr, args.model, device, args.seed, not args.no_jit,
                                     Progress(args.steps, stream=out), distributed=True)
  acc = accuracy(model, x_test, y_test, device)
  print(f"first step (schedule + compile + run): {first * 1e3:.0f} ms; then {rest * 1e3:.2f} ms/step (median)", file=out)
  ok = acc >= args.target
  print(f"rank 0: final loss {losses[-1]:.4f} (global batch); test accuracy {acc * 100:.2f}% (target >= "
        f"{args.target * 100:.0f}%): {'OK' if ok else 'MISSED'}  [{time.perf_counter() - t0:.1f} s total]", file=out)
  dist.barrier()
  if not ok: raise SystemExit(1)


if __name__ == "__main__":
  main()
