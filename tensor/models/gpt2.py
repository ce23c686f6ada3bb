"""GPT-2 models from GGUF files (`general.architecture` = "gpt2").

What the file means follows llama.cpp (src/models/gpt2.cpp; tensor names from gguf-py constants.py, MODEL_ARCH.GPT2):
- tensors: token_embd (vocab, dim), position_embd (context_length, dim); per block N: attn_norm weight + bias,
  attn_qkv weight (dim + 2 kv_dim, dim) + bias (Q, K, V stacked in that order), attn_output weight + bias, ffn_norm
  weight + bias, ffn_up (n_ff, dim) + bias, ffn_down (dim, n_ff) + bias; output_norm weight + bias; output, or
  token_embd again when the file has no output.weight (GPT-2's tied embeddings).
- x = token_embd[t] + position_embd[pos]; block: h = x + attn(layer_norm(x)); out = h + ffn(layer_norm(h)), with
  eps = gpt2.attention.layer_norm_epsilon, attention scaled by 1/sqrt(head_dim), no RoPE (llama_model_rope_type:
  LLM_ARCH_GPT2 is LLAMA_ROPE_TYPE_NONE), and the FFN up -> GELU -> down (LLM_FFN_GELU, LLM_FFN_SEQ). ggml_gelu is the
  tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the one GPT-2 was trained with (its
  `gelu_new`).
"""
from __future__ import annotations
import math
from baregrad.tensor import Tensor
from .lm import LanguageModel, ModelError, Weights, linear, layer_norm, lookup, attention


class GPT2(LanguageModel):
  arch = "gpt2"

  def __init__(self, path, metadata, weights: Weights, device, max_context=None):
    super().__init__(path, metadata, weights, device, max_context)
    c, w = self.config, weights
    self.dim = dim = c.int("embedding_length")
    self.n_layer = c.int("block_count", hi=4096)
    self.n_head = c.int("attention.head_count")
    self.n_head_kv = c.int("attention.head_count_kv", default=self.n_head)
    if dim % self.n_head or self.n_head % self.n_head_kv:
      raise ModelError(f"{path}: embedding_length {dim}, attention.head_count {self.n_head} and head_count_kv "
                       f"{self.n_head_kv} do not divide evenly")
    self.head_dim = hd = dim // self.n_head
    self.n_ff = c.int("feed_forward_length")
    self.eps = c.float("attention.layer_norm_epsilon")
    self.scale = 1 / math.sqrt(hd)
    self.n_vocab = w.shape("token_embd.weight")[0]
    if self.tokenizer is not None and self.n_vocab != self.tokenizer.vocab_size:
      raise ModelError(f"{path}: token_embd.weight has {self.n_vocab} rows but the tokenizer has "
                       f"{self.tokenizer.vocab_size} tokens")
    kv_dim = self.n_head_kv * hd
    tied = not w.has("output.weight")
    self.tok_embd = w.get("token_embd.weight", (self.n_vocab, dim), table=not tied)
    self.pos_embd = w.get("position_embd.weight", (self.train_context, dim), table=True)
    self.layers = []
    for i in range(self.n_layer):
      get = lambda name, shape: w.get(f"blk.{i}.{name}", shape)   # noqa: E731
      self.layers.append(dict(
        attn_norm=get("attn_norm.weight", (dim,)), attn_norm_b=get("attn_norm.bias", (dim,)),
        wqkv=get("attn_qkv.weight", (dim + 2 * kv_dim, dim)), bqkv=get("attn_qkv.bias", (dim + 2 * kv_dim,)),
        wo=get("attn_output.weight", (dim, dim)), bo=get("attn_output.bias", (dim,)),
        ffn_norm=get("ffn_norm.weight", (dim,)), ffn_norm_b=get("ffn_norm.bias", (dim,)),
        up=get("ffn_up.weight", (self.n_ff, dim)), bup=get("ffn_up.bias", (self.n_ff,)),
        down=get("ffn_down.weight", (dim, self.n_ff)), bdown=get("ffn_down.bias", (dim,))))
    self.output_norm = w.get("output_norm.weight", (dim,))
    self.output_norm_b = w.get("output_norm.bias", (dim,))
    self.output = self.tok_embd if tied else w.get("output.weight", (self.n_vocab, dim))

  def _forward(self, tokens, start_pos, last_only: bool) -> Tensor:
    x = lookup(self.tok_embd, tokens)
    T, H, KV, hd, dim = x.shape[1], self.n_head, self.n_head_kv, self.head_dim, self.dim
    x = x + self.pos_embd.shrink(((start_pos, start_pos + T), None)).reshape(1, T, dim)
    for layer, cache in zip(self.layers, self.caches):
      h = layer_norm(x, layer["attn_norm"], layer["attn_norm_b"], self.eps)
      qkv = linear(h, layer["wqkv"], layer["bqkv"])
      q = qkv.shrink((None, None, (0, dim))).reshape(1, T, H, hd)
      k = qkv.shrink((None, None, (dim, dim + KV * hd))).reshape(1, T, KV, hd)
      v = qkv.shrink((None, None, (dim + KV * hd, dim + 2 * KV * hd))).reshape(1, T, KV, hd)
      x = x + linear(attention(cache, q, k, v, start_pos, self.scale), layer["wo"], layer["bo"])
      h = layer_norm(x, layer["ffn_norm"], layer["ffn_norm_b"], self.eps)
      ff = linear(h, layer["up"], layer["bup"]).gelu("tanh")
      x = (x + linear(ff, layer["down"], layer["bdown"])).contiguous()
    if last_only and T > 1: x = x.shrink((None, (T - 1, T), None))
    out = linear(layer_norm(x, self.output_norm, self.output_norm_b, self.eps), self.output)
    return out.reshape(out.shape[1], self.n_vocab).realize()


__all__ = ["GPT2"]
