"""LLaMA-family models from GGUF files (`general.architecture` = "llama": LLaMA 1/2/3, Mistral, TinyLlama, ...).

What a GGUF file means is what llama.cpp computes from it (src/models/llama.cpp, src/llama-model.cpp, ggml's rope):
- tensors: token_embd (vocab, dim); per block N: attn_norm, attn_q/k/v/output, ffn_norm, ffn_gate/up/down (weights
  (out, in) in numpy order); output_norm; output, or token_embd again when the file has no output.weight (tied
  embeddings). Optional: biases of attn_q/k/v/output and ffn_gate/up/down; rope_freqs (llama3 frequency factors).
- block: h = x + attn(rms_norm(x) * attn_norm); out = h + ffn_down(silu(ffn_gate(n)) * ffn_up(n)), n = rms_norm(h) *
  ffn_norm (LLM_FFN_SILU + LLM_FFN_PAR: SwiGLU); eps = llama.attention.layer_norm_rms_epsilon.
- attention: scores scaled by 1/sqrt(head_dim) (llama.attention.scale when the file sets it), grouped-query heads
  (llama.attention.head_count_kv < head_count: query head h reads KV head h // (head_count / head_count_kv)).
- RoPE: llama.cpp's `llama_model_rope_type` gives LLM_ARCH_LLAMA LLAMA_ROPE_TYPE_NORM, "a normal RoPE, operating on
  pairs of consecutive head values": ggml's rope in that mode rotates (x[2i], x[2i+1]) of each head by the angle
  pos * freq_scale * freq_base^(-2i / n_rot) / ff[i] (ggml-cpu ops.cpp: rope_yarn with ext_factor 0, theta_base/ff,
  then dst[2i] = x0 cos - x1 sin, dst[2i+1] = x0 sin + x1 cos). HF LLaMA checkpoints rotate (x[i], x[i + d/2])
  instead (GPT-NeoX style); llama.cpp's convert_hf_to_gguf.py permutes the rows of the Q and K weights of each head
  (reshape(n_head, 2, head_dim / 2, dim), swap the two middle axes) so that adjacent pairs are right on the file's
  weights. So the rotation here is the adjacent-pair one, on the weights as they are in the file.
  freq_base = llama.rope.freq_base (default 10000, llama.cpp's rope_freq_base_train); freq_scale = 1 / the linear
  scaling factor (llama.rope.scaling.factor, or the older llama.rope.scale_linear; 1 when absent or 0). llama3's
  frequency scaling is not a metadata key: convert_hf_to_gguf.py computes per-frequency factors from config.json's
  rope_scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) and stores them as the
  rope_freqs.weight tensor (n_rot / 2), which ggml divides the angles by (`ff` above). YaRN and LongRoPE scaling are
  refused.
"""
from __future__ import annotations
import math
import numpy as np
from baregrad.tensor import Tensor
from .lm import LanguageModel, ModelError, Weights, linear, rms_norm, lookup, attention

ROPE_SCALING_TYPES = ("none", "linear")     # llama.cpp also has yarn and longrope (not supported here)


def rope_angles(n_ctx: int, n_rot: int, freq_base: float, freq_scale: float = 1.0, factors=None) -> np.ndarray:
  """(n_ctx, n_rot / 2) float64 angles pos * freq_scale * freq_base^(-2i / n_rot) / factors[i]."""
  inv = freq_base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot) * freq_scale
  if factors is not None: inv = inv / np.asarray(factors, np.float64)
  return np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
  """Rotate adjacent pairs (x[2i], x[2i+1]) of the last dim of x (1, T, H, d) by the angles whose cos and sin are
  (T, d / 2)."""
  _, T, H, d = x.shape
  pairs = x.reshape(1, T, H, d // 2, 2)
  x0 = pairs.shrink((None, None, None, None, (0, 1))).reshape(1, T, H, d // 2)
  x1 = pairs.shrink((None, None, None, None, (1, 2))).reshape(1, T, H, d // 2)
  c, s = cos.reshape(1, T, 1, d // 2), sin.reshape(1, T, 1, d // 2)
  return Tensor.stack(x0 * c - x1 * s, x0 * s + x1 * c, dim=-1).reshape(1, T, H, d)


class Llama(LanguageModel):
  arch = "llama"

  def __init__(self, path, metadata, weights: Weights, device, max_context=None):
    super().__init__(path, metadata, weights, device, max_context)
    c, w = self.config, weights
    self.dim = dim = c.int("embedding_length")
    self.n_layer = c.int("block_count", hi=4096)
    self.n_head = c.int("attention.head_count")
    self.n_head_kv = c.int("attention.head_count_kv", default=self.n_head)
    if self.n_head % self.n_head_kv:
      raise ModelError(f"{path}: attention.head_count {self.n_head} is not a multiple of attention.head_count_kv "
                       f"{self.n_head_kv}")
    if dim % self.n_head and "llama.attention.key_length" not in metadata:
      raise ModelError(f"{path}: embedding_length {dim} is not a multiple of attention.head_count {self.n_head}")
    self.head_dim = hd = c.int("attention.key_length", default=dim // self.n_head)
    if (vd := c.int("attention.value_length", default=hd)) != hd:   # llama.cpp asserts n_embd_head_k == n_embd_head_v
      raise ModelError(f"{path}: attention.value_length {vd} differs from attention.key_length {hd}")
    self.n_rot = c.int("rope.dimension_count", default=hd)
    if self.n_rot != hd or hd % 2:      # llama.cpp's llama graph asserts n_embd_head == n_rot
      raise ModelError(f"{path}: rope.dimension_count {self.n_rot} must equal the head size {hd} (and be even)")
    self.n_ff = c.int("feed_forward_length")
    self.eps = c.float("attention.layer_norm_rms_epsilon")
    self.scale = c.float("attention.scale", default=0.0, lo_open=False) or 1 / math.sqrt(hd)
    self.freq_base = c.float("rope.freq_base", default=10000.0)
    # llama.cpp load_hparams: the scaling type defaults to "linear"; freq_scale = 1 / (rope.scaling.factor, else the
    # older rope.scale_linear), 1 when that is 0 or absent; llama-context.cpp never scales when the type is "none"
    kind = c.str("rope.scaling.type", default="linear")
    if kind not in ROPE_SCALING_TYPES:
      raise ModelError(f"{path}: llama.rope.scaling.type {kind!r} is not supported (supported: "
                       f"{', '.join(ROPE_SCALING_TYPES)})")
    factor = c.float("rope.scaling.factor", default=0.0, lo_open=False) or \
      c.float("rope.scale_linear", default=0.0, lo_open=False)
    self.freq_scale = 1.0 / factor if factor and kind == "linear" else 1.0

    self.n_vocab = w.shape("token_embd.weight")[0]
    if self.tokenizer is not None and self.n_vocab != self.tokenizer.vocab_size:
      raise ModelError(f"{path}: token_embd.weight has {self.n_vocab} rows but the tokenizer has "
                       f"{self.tokenizer.vocab_size} tokens")
    q_dim, kv_dim = self.n_head * hd, self.n_head_kv * hd
    tied = not w.has("output.weight")
    self.tok_embd = w.get("token_embd.weight", (self.n_vocab, dim), table=not tied)
    self.rope_freqs = None
    if w.has("rope_freqs.weight"):
      self.rope_freqs = w.get("rope_freqs.weight", (hd // 2,)).numpy()
      if not (np.isfinite(self.rope_freqs).all() and (self.rope_freqs > 0).all()):
        raise ModelError(f"{path}: tensor 'rope_freqs.weight' holds factors that are not finite and positive")
    self.layers = []
    for i in range(self.n_layer):
      b = f"blk.{i}."
      get = lambda name, shape, optional=False: w.get(b + name, shape, optional)   # noqa: E731
      self.layers.append(dict(
        attn_norm=get("attn_norm.weight", (dim,)),
        wq=get("attn_q.weight", (q_dim, dim)), bq=get("attn_q.bias", (q_dim,), True),
        wk=get("attn_k.weight", (kv_dim, dim)), bk=get("attn_k.bias", (kv_dim,), True),
        wv=get("attn_v.weight", (kv_dim, dim)), bv=get("attn_v.bias", (kv_dim,), True),
        wo=get("attn_output.weight", (dim, q_dim)), bo=get("attn_output.bias", (dim,), True),
        ffn_norm=get("ffn_norm.weight", (dim,)),
        gate=get("ffn_gate.weight", (self.n_ff, dim)), bgate=get("ffn_gate.bias", (self.n_ff,), True),
        up=get("ffn_up.weight", (self.n_ff, dim)), bup=get("ffn_up.bias", (self.n_ff,), True),
        down=get("ffn_down.weight", (dim, self.n_ff)), bdown=get("ffn_down.bias", (dim,), True)))
    self.output_norm = w.get("output_norm.weight", (dim,))
    self.output = self.tok_embd if tied else w.get("output.weight", (self.n_vocab, dim))

  def _prepare(self):
    angles = rope_angles(self.n_ctx, self.n_rot, self.freq_base, self.freq_scale, self.rope_freqs)
    self.rope_cos = Tensor(np.cos(angles).astype(np.float32), device=self.device).realize()
    self.rope_sin = Tensor(np.sin(angles).astype(np.float32), device=self.device).realize()

  def _forward(self, tokens, start_pos, last_only: bool) -> Tensor:
    x = lookup(self.tok_embd, tokens)
    T, H, KV, hd = x.shape[1], self.n_head, self.n_head_kv, self.head_dim
    cos = self.rope_cos.shrink(((start_pos, start_pos + T), None))
    sin = self.rope_sin.shrink(((start_pos, start_pos + T), None))
    for layer, cache in zip(self.layers, self.caches):
      h = rms_norm(x, layer["attn_norm"], self.eps)
      q = rope(linear(h, layer["wq"], layer["bq"]).reshape(1, T, H, hd), cos, sin)
      k = rope(linear(h, layer["wk"], layer["bk"]).reshape(1, T, KV, hd), cos, sin)
      v = linear(h, layer["wv"], layer["bv"]).reshape(1, T, KV, hd)
      x = x + linear(attention(cache, q, k, v, start_pos, self.scale), layer["wo"], layer["bo"])
      h = rms_norm(x, layer["ffn_norm"], self.eps)
      ff = linear(h, layer["gate"], layer["bgate"]).silu() * linear(h, layer["up"], layer["bup"])
      x = (x + linear(ff, layer["down"], layer["bdown"])).contiguous()
    if last_only and T > 1: x = x.shrink((None, (T - 1, T), None))
    out = linear(rms_norm(x, self.output_norm, self.eps), self.output)
    return out.reshape(out.shape[1], self.n_vocab).realize()


__all__ = ["Llama", "rope", "rope_angles"]
