"""What every decoder-only language model here shares: its configuration and weights read from a GGUF file (each
checked, a problem a ModelError naming the file and the key or tensor), a KV cache per layer, the prefill and the
jitted decode step, and text generation with its timings.

KV cache (the pattern of tests/test_symbolic.py, after tinygrad's examples/gpt2.py): one realized tensor per layer,
(2, 1, n_ctx, n_head_kv, head_dim) float32, holding keys and values of every position so far. A forward over the
tokens at positions [p, p + T) writes their keys and values into the view [p, p + T) of it (`assign` through a
shrink) and attends to the view [0, p + T). The prefill runs all prompt tokens in one forward with a causal mask; a
decode step runs one token with `p` a bound Variable, so one jitted function (tensor/jit.py) serves every position:
its kernels are compiled on the first call, captured on the second, and replayed after that with the new values of
the token and the position patched in.

Attention with grouped-query heads (n_head_kv < n_head, llama.cpp `build_attn`): query head h reads KV head
h // (n_head / n_head_kv). Each cached KV head is broadcast to its query heads (expand + reshape: a view, the index
h // group computed in the kernel), never copied.
"""
from __future__ import annotations
import math, time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
import numpy as np
from baregrad.compiler.dtype import dtypes
from baregrad.tensor import Tensor
from baregrad.tensor.tensor import Variable
from baregrad.tensor.jit import jit
from baregrad.tensor.gguf import TensorInfo
from baregrad.tensor.tokenizer import Tokenizer, TokenizerError
from .sampling import SamplingParams, sample

DEFAULT_CONTEXT = 4096      # cache positions when the caller names none (a model's training context may be 128k)
MAX_SIZE = 1 << 24          # bound on any size read from metadata (dims, head counts, context): larger is corrupt


class ModelError(ValueError):
  """A model file that cannot be used (a missing or malformed key or tensor), or a request it cannot serve."""


class ContextError(ModelError):
  """A prompt plus the tokens to generate do not fit in the KV cache."""


# ---------------------------------------------------------------- configuration and weights from a GGUF file

class Config:
  """Typed, checked reads of `{arch}.*` metadata keys; each error names the file and the key."""

  def __init__(self, path: str, metadata: Mapping[str, Any], arch: str):
    self.path, self.md, self.arch = path, metadata, arch

  def _fail(self, key: str, msg: str):
    raise ModelError(f"{self.path}: metadata key {key!r}: {msg}")

  def int(self, name: str, default: int | None = None, lo: int = 1, hi: int = MAX_SIZE) -> int:
    key = f"{self.arch}.{name}"
    v = self.md.get(key, default)
    if v is None: self._fail(key, f"missing (a {self.arch} model needs it)")
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)): self._fail(key, f"must be an integer, got {v!r}")
    if not lo <= v <= hi: self._fail(key, f"{v} is outside [{lo}, {hi}]")
    return int(v)

  def float(self, name: str, default: float | None = None, lo: float = 0.0, lo_open: bool = True) -> float:
    key = f"{self.arch}.{name}"
    v = self.md.get(key, default)
    if v is None: self._fail(key, f"missing (a {self.arch} model needs it)")
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
      self._fail(key, f"must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < lo or (lo_open and v == lo):
      self._fail(key, f"{v} must be finite and {'>' if lo_open else '>='} {lo}")
    return v

  def str(self, name: str, default: str | None = None) -> str | None:
    key = f"{self.arch}.{name}"
    v = self.md.get(key, default)
    if v is not None and not isinstance(v, str): self._fail(key, f"must be a string, got {v!r}")
    return v


class Weights:
  """The tensors of a GGUF file by name, handed out as float32 Tensors after their shape is checked. Records the
  bytes each one takes in the file, for the bytes a decode step reads."""

  def __init__(self, path: str, tensors: Mapping[str, Tensor], infos: Mapping[str, TensorInfo], arch: str,
               source: str = "gguf"):
    self.path, self.tensors, self.infos, self.arch = path, tensors, infos, arch
    self.source = source           # "gguf", or "hf": a checkpoint directory (models/hf.py), whose tokenizer may be absent
    self.read_per_token = 0        # bytes of weights a decode step reads (each matrix once; a table only its row)

  def has(self, name: str) -> bool: return name in self.tensors

  def shape(self, name: str) -> tuple[int, ...]:
    if name not in self.infos:
      raise ModelError(f"{self.path}: tensor {name!r} is missing (a {self.arch} model needs it)")
    return self.infos[name].shape

  def get(self, name: str, shape: tuple[int, ...], optional: bool = False, table: bool = False) -> Tensor | None:
    """Tensor `name` of numpy `shape` as float32 (lazily cast or dequantized: the consumer's kernel reads the file's
    bytes). `table`: only one row of it is read per decode step (an embedding)."""
    if name not in self.tensors:
      if optional: return None
      raise ModelError(f"{self.path}: tensor {name!r} is missing (a {self.arch} model needs it)")
    t, info = self.tensors[name], self.infos[name]
    if tuple(t.shape) != tuple(shape):
      raise ModelError(f"{self.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)} from the "
                       f"model's metadata")
    self.read_per_token += info.nbytes // shape[0] if table else info.nbytes
    return t if t.dtype == dtypes.float32 else t.cast(dtypes.float32)


# ---------------------------------------------------------------- building blocks

def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
  """x @ w.T (+ b): GGUF matrices are (out, in) in numpy order (ggml ne = {in, out}), as torch's Linear."""
  y = x @ w.T
  return y if b is None else y + b


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
  """ggml_rms_norm then a scale (llama.cpp build_norm, LLM_NORM_RMS): x / sqrt(mean(x^2) + eps) * w."""
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w


def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
  """ggml_norm then scale and shift (build_norm, LLM_NORM): (x - mean) / sqrt(biased var + eps) * w + b."""
  return x.layernorm(-1, eps) * w + b


def lookup(table: Tensor, tokens) -> Tensor:
  """Rows of `table` (vocab, dim) for `tokens`: a (1, T) int32 Tensor (a one-hot sum the compiler turns into a gather,
  compiler/gather.py), or one bound Variable (a shrink at a symbolic row). Returns (1, T, dim)."""
  if isinstance(tokens, Tensor):
    onehot = tokens.reshape(*tokens.shape, 1) == Tensor.arange(table.shape[0], dtype=dtypes.int32, device=tokens.device)
    return onehot.reshape(*onehot.shape, 1).where(table, 0.0).sum(-2)
  return table.shrink(((tokens, tokens + 1), None)).reshape(1, 1, table.shape[1])


def attention(cache: Tensor, q: Tensor, k: Tensor, v: Tensor, start_pos, scale: float) -> Tensor:
  """Causal attention of q (1, T, n_head, hd) over the cached positions [0, start_pos) and k, v (1, T, n_head_kv, hd),
  which are first written into the cache at [start_pos, start_pos + T). Returns (1, T, n_head * hd)."""
  _, T, H, hd = q.shape
  KV = k.shape[2]
  g = H // KV
  cache.shrink((None, None, (start_pos, start_pos + T), None, None)).assign(Tensor.stack(k, v)).realize()
  if isinstance(start_pos, int) and start_pos == 0: keys, values = k, v
  else:
    keys = cache[0].shrink((None, (0, start_pos + T), None, None))
    values = cache[1].shrink((None, (0, start_pos + T), None, None))
  S = (start_pos if isinstance(start_pos, int) else start_pos.val) + T
  if g > 1:      # KV head kv serves query heads kv * g .. kv * g + g - 1: a broadcast view, not a copy
    keys = keys.reshape(1, -1, KV, 1, hd).expand(1, keys.shape[1], KV, g, hd).reshape(1, -1, H, hd)
    values = values.reshape(1, -1, KV, 1, hd).expand(1, values.shape[1], KV, g, hd).reshape(1, -1, H, hd)
  mask = None
  if T > 1:      # key s is visible to the query at position start_pos + t when s <= start_pos + t
    mask = Tensor.full((T, S), float("-inf"), device=q.device).triu(S - T + 1).reshape(1, 1, T, S)
  out = q.transpose(1, 2).scaled_dot_product_attention(keys.transpose(1, 2), values.transpose(1, 2), mask, scale=scale)
  return out.transpose(1, 2).reshape(1, T, H * hd)


# ---------------------------------------------------------------- the model and generation

@dataclass
class GenerationStats:
  """Timings of the last generate(): the prefill (prompt tokens in one forward) and the decode steps. The first two
  decode steps of a fresh model compile and capture kernels; `steady_*` counts only the steps replayed after that."""
  prompt_tokens: int = 0
  prefill_s: float = 0.0
  decode_tokens: int = 0          # decode forwards run (the last sampled token is not fed back)
  decode_s: float = 0.0
  steady_tokens: int = 0
  steady_s: float = 0.0
  generated: list[int] = field(default_factory=list)
  weight_bytes_per_token: int = 0

  @property
  def prefill_tokens_per_s(self) -> float: return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

  @property
  def decode_tokens_per_s(self) -> float:
    n, s = (self.steady_tokens, self.steady_s) if self.steady_tokens else (self.decode_tokens, self.decode_s)
    return n / s if s else 0.0

  @property
  def decode_gb_per_s(self) -> float:
    """Weight bytes a decode step reads times decode steps per second: the memory bandwidth the decode uses."""
    return self.weight_bytes_per_token * self.decode_tokens_per_s / 1e9


class LanguageModel:
  """A decoder-only model with a KV cache. Subclasses read their configuration and weights in __init__ and define
  `_forward(tokens, start_pos, last_only)` -> logits (T or 1, vocab) for a (1, T) int32 token Tensor (or a bound
  Variable: one token) at positions [start_pos, start_pos + T).

  `logits(tokens)` runs tokens through the model from the current position (`pos`, 0 after reset()) and returns every
  position's logits; `step(token)` runs one token through the jitted decode step; `generate(prompt, ...)` yields text.
  """
  arch = ""

  def __init__(self, path: str, metadata: Mapping[str, Any], weights: Weights, device: str, max_context: int | None):
    self.path, self.metadata, self.weights, self.device = path, metadata, weights, device
    self.config = Config(path, metadata, self.arch)
    self.tokenizer: Tokenizer | None = None
    if weights.source != "hf" or "tokenizer.ggml.model" in metadata:   # a checkpoint may come without one
      try: self.tokenizer = Tokenizer.from_gguf_metadata(metadata)
      except TokenizerError as e: raise ModelError(f"{path}: tokenizer: {e}") from None
    self.train_context = self.config.int("context_length")
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context < 1):
      raise ModelError(f"max_context must be a positive int, got {max_context!r}")
    self.n_ctx = min(self.train_context, max_context or DEFAULT_CONTEXT)
    self.pos = 0
    self.stats = GenerationStats()
    self._caches: list[Tensor] | None = None
    self._step_jit = None

  # ---- subclass interface
  n_layer: int
  n_head_kv: int
  head_dim: int
  n_vocab: int

  def _forward(self, tokens, start_pos, last_only: bool) -> Tensor: raise NotImplementedError

  def _prepare(self):
    """Per-context state beyond the caches (RoPE tables); called when the caches are (re)made."""

  # ---- cache
  def set_context(self, n_ctx: int):
    """Resize the KV cache to `n_ctx` positions (at most the model's training context). Drops what the cache holds
    and the captured decode step (the next steps compile and capture again)."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 1 <= n_ctx <= self.train_context:
      raise ModelError(f"set_context: the context must be an int in [1, {self.train_context}] (the model's "
                       f"{self.arch}.context_length), got {n_ctx!r}")
    if n_ctx != self.n_ctx: self._caches, self._step_jit = None, None
    self.n_ctx, self.pos = n_ctx, 0

  @property
  def caches(self) -> list[Tensor]:
    """The KV cache of each layer, made (with the decode step's Variables and jit) on first use."""
    if self._caches is None:
      self._caches = [Tensor.zeros(2, 1, self.n_ctx, self.n_head_kv, self.head_dim, device=self.device).contiguous()
                      .realize() for _ in range(self.n_layer)]
      self._prepare()
      self._start_var = Variable("start_pos", 1, self.n_ctx - 1) if self.n_ctx > 1 else None
      self._token_var = Variable("token", 0, self.n_vocab - 1)
      self._step_jit = jit(self._decode_step)
    return self._caches

  def reset(self):
    """Start a new sequence at position 0 (the cache's old entries are overwritten as positions are filled)."""
    self.pos = 0

  def _room(self, n: int, what: str):
    if self.pos + n > self.n_ctx:
      raise ContextError(f"{what}: positions {self.pos}..{self.pos + n - 1} do not fit in the KV cache of {self.n_ctx} "
                         f"positions (the model's context_length is {self.train_context})")

  def _check_tokens(self, tokens) -> list[int]:
    ids = [int(t) for t in tokens]
    bad = [t for t in ids if not 0 <= t < self.n_vocab]
    if bad: raise ModelError(f"token id {bad[0]} is outside the vocabulary [0, {self.n_vocab})")
    return ids

  # ---- forwards
  def _run(self, ids: list[int], last_only: bool) -> np.ndarray:
    _ = self.caches
    out = self._forward(Tensor(np.array([ids], np.int32), device=self.device), self.pos, last_only).numpy()
    self.pos += len(ids)
    return out

  def logits(self, tokens) -> np.ndarray:
    """Run `tokens` (ids) at positions [pos, pos + len): the logits of every one, (len, vocab) float32."""
    ids = self._check_tokens(tokens)
    if not ids: raise ModelError("logits: no tokens")
    self._room(len(ids), "logits")
    return self._run(ids, last_only=False)

  def _decode_step(self, token, start_pos) -> Tensor:
    return self._forward(token, start_pos, True)

  def step(self, token: int) -> np.ndarray:
    """Run one token at position `pos` through the jitted decode step: the next token's logits (vocab,) float32."""
    (tok,) = self._check_tokens([token])
    if self.pos == 0: raise ModelError("step: the sequence is empty; run the prompt through logits() first")
    self._room(1, "step")
    _ = self.caches
    out = self._step_jit(self._token_var.bind(tok), self._start_var.bind(self.pos)).numpy()[0]
    self.pos += 1
    return out

  # ---- generation
  def encode(self, prompt) -> list[int]:
    if isinstance(prompt, str) and self.tokenizer is None:
      raise ModelError(f"{self.path}: the model has no tokenizer (the checkpoint has no byte-level BPE tokenizer.json): "
                       f"give token ids, or use logits()/step()")
    if isinstance(prompt, str):
      try: return self.tokenizer.encode(prompt)
      except TokenizerError as e: raise ModelError(f"prompt: {e}") from None
    return self._check_tokens(prompt)

  def generate(self, prompt, max_tokens: int = 32, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop_at_eos: bool = True) -> Iterator[str]:
    """Text generated after `prompt` (a str, or token ids), as pieces while tokens are sampled. Greedy when
    temperature is 0; otherwise top-k, top-p and temperature as in sampling.py, drawn from a numpy Generator seeded
    with `seed`. Stops after `max_tokens` tokens or at an end-of-generation token (unless stop_at_eos is False).
    Arguments are checked now (ValueError / ModelError / ContextError); `stats` holds the timings afterwards."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 0:
      raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    params = SamplingParams(temperature, top_k, top_p, seed)
    if self.tokenizer is None:
      raise ModelError(f"{self.path}: generate() turns tokens into text and the model has no tokenizer (the checkpoint "
                       f"has no byte-level BPE tokenizer.json): use logits()/step() with token ids")
    ids = self.encode(prompt)
    if not ids: raise ModelError("the prompt encodes to no tokens (and the vocabulary adds no BOS token)")
    self.reset()
    self._room(len(ids) + max_tokens, f"a prompt of {len(ids)} tokens and max_tokens={max_tokens}")
    return self._generate(ids, max_tokens, params, stop_at_eos)

  def _generate(self, ids: list[int], max_tokens: int, params: SamplingParams, stop_at_eos: bool) -> Iterator[str]:
    rng = np.random.default_rng(params.seed)
    stats = self.stats = GenerationStats(prompt_tokens=len(ids), weight_bytes_per_token=self.weights.read_per_token)
    if max_tokens == 0: return
    t0 = time.perf_counter()
    logits = self._run(ids, last_only=True)[-1]
    stats.prefill_s = time.perf_counter() - t0
    stream = self.tokenizer.stream_decoder()
    for i in range(max_tokens):
      tok = sample(logits, params, rng)
      if stop_at_eos and self.tokenizer.is_eog(tok): break
      stats.generated.append(tok)
      if piece := stream.push(tok): yield piece
      if i == max_tokens - 1: break
      replay = self._step_jit is not None and self._step_jit.graph is not None
      t0 = time.perf_counter()
      logits = self.step(tok)
      dt = time.perf_counter() - t0
      stats.decode_tokens += 1
      stats.decode_s += dt
      if replay:
        stats.steady_tokens += 1
        stats.steady_s += dt
    if tail := stream.flush(): yield tail


__all__ = ["ModelError", "ContextError", "LanguageModel", "GenerationStats", "Config", "Weights", "DEFAULT_CONTEXT"]
