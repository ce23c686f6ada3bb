"""Language models from GGUF files (tensor/models) and the `baregrad llm` command, against numpy float64 references.

The files are written here with random weights: a LLaMA with grouped-query attention (4 query heads, 2 KV heads),
llama3-style rope_freqs factors and a large freq_base (F32), the same shape quantized to Q8_0 by gguf-py with tied
embeddings and linear RoPE scaling, and a GPT-2 (fused QKV, biases, learned positions, tanh GELU). Each carries a real
tokenizer vocabulary (a SentencePiece-style one with byte fallback for LLaMA, a byte-level BPE one for GPT-2) so that
text goes in and comes out.

The references follow ggml's conventions, written here from llama.cpp's graphs (src/models/llama.cpp, gpt2.cpp) and
not from the code under test: RoPE rotates adjacent pairs (x[2i], x[2i+1]) of the file's Q and K rows by
pos * freq_scale * base^(-2i/d) / rope_freqs[i] (LLAMA_ROPE_TYPE_NORM), query head h reads KV head
h // (n_head / n_head_kv), RMSNorm x / sqrt(mean(x^2) + eps) * w, SwiGLU silu(gate) * up, GPT-2's LayerNorm and tanh
GELU. Each reference runs the whole sequence so far (no cache) for every position, so it checks the KV cache, the
causal mask and the symbolic decode step too. Logits must agree to 1e-4 of the logits' scale; quantized weights enter
the reference dequantized by gguf-py (`gguf.quants.dequantize`), an independent implementation.

The CPU cases name the CPU (they are sized for it); the emulated AMD and NV GPUs run a tiny model at the end.
(Checked once by hand against llama.cpp itself, llama-cpp-python 0.3.36 built from source, on these files with F32
KV caches: the LLaMA logits agree to 1e-6 of their scale, GPT-2's to 3e-4 (ggml's GELU reads a float16 table); the
Q8_0 file to 5e-2, as llama.cpp's CPU quantizes the activations to Q8_0 for its dot products.)
"""
import math
import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as QT

from baregrad.compiler import codegen
from baregrad.tensor.gguf import write_gguf
from baregrad.tensor.models import load_model, ModelError, ContextError, SamplingParams, sample
from baregrad.tools.__main__ import main as baregrad_main

SP = "\u2581"     # sentencepiece's space
PROMPT = "the cat sat on the mat"     # 7 tokens in both vocabularies (with LLaMA's BOS): tests share kernels


# ---------------------------------------------------------------- vocabularies

def spm_vocab() -> dict:
  """A SentencePiece-style ("llama") vocabulary: <unk> <s> </s>, the 256 byte tokens, and pieces scored so that longer
  ones merge first."""
  tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
  types = [2, 3, 3] + [6] * 256
  pieces = [SP + "the", SP + "cat", SP + "sat", SP + "on", SP + "mat", SP + "t", SP + "a", SP + "s", SP + "o",
            SP + "m", SP + "c", "he", "at", "in", "er", "on", "or", "en", "ll", "ing", SP]
  pieces += list("abcdefghijklmnopqrstuvwxyz")
  scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
  return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens + pieces,
          "tokenizer.ggml.token_type": np.array(types + [1] * len(pieces), np.int32),
          "tokenizer.ggml.scores": np.array(scores, np.float32),
          "tokenizer.ggml.bos_token_id": np.uint32(1), "tokenizer.ggml.eos_token_id": np.uint32(2),
          "tokenizer.ggml.unknown_token_id": np.uint32(0)}


def tiny_spm_vocab() -> dict:
  """32 tokens, no byte tokens (characters outside it become <unk>): for the emulated GPUs."""
  tokens = ["<unk>", "<s>", "</s>", SP] + list("abcdefghijklmnopqrstuvwxyz") + [SP + "a", SP + "the"]
  return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.array([2, 3, 3] + [1] * (len(tokens) - 3), np.int32),
          "tokenizer.ggml.scores": np.array([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)], np.float32)}


def gpt2_byte_chars() -> list[str]:
  """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py bytes_to_unicode): the printable Latin-1
  bytes stand for themselves, the other 68 bytes for U+0100 onwards, in byte order."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  extra = iter(range(256, 256 + 256))
  return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def bpe_vocab() -> dict:
  """A byte-level BPE ("gpt2") vocabulary: the 256 byte characters, merges that build some words, <|endoftext|>."""
  chars = gpt2_byte_chars()
  space = chars[ord(" ")]
  merges = [(space, "t"), ("h", "e"), (space + "t", "he"), (space, "c"), ("a", "t"), (space + "c", "at"), (space, "s"),
            (space + "s", "at"), (space, "o"), (space + "o", "n"), (space, "m"), (space + "m", "at"), ("i", "n"),
            ("e", "r"), (space, "a"), ("o", "r")]
  tokens = chars + [a + b for a, b in merges] + ["<|endoftext|>"]
  return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.array([1] * (len(tokens) - 1) + [3], np.int32),
          "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
          "tokenizer.ggml.bos_token_id": np.uint32(len(tokens) - 1),
          "tokenizer.ggml.eos_token_id": np.uint32(len(tokens) - 1)}


# ---------------------------------------------------------------- model files

def llama3_factors(n_rot: int, base: float, factor=8.0, low=1.0, high=4.0, original_context=16) -> np.ndarray:
  """convert_hf_to_gguf.py's llama3 rope_freqs values (a small original context so that all three cases occur)."""
  out = []
  for freq in base ** (-np.arange(0, n_rot, 2) / n_rot):
    wavelen = 2 * math.pi / freq
    if wavelen < original_context / high: out.append(1.0)
    elif wavelen > original_context / low: out.append(factor)
    else:
      smooth = (original_context / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def typed(md: dict) -> dict:
  """Metadata with the value types llama.cpp's converter writes (gguf-py add_uint32 / add_float32): UINT32 sizes and
  token ids, FLOAT32 numbers (llama.cpp refuses an INT32 where it reads a UINT32)."""
  def value(v): return np.uint32(v) if isinstance(v, int) else np.float32(v) if isinstance(v, float) else v
  return {k: value(v) for k, v in md.items()}


def write_llama(path, quant=None, dim=64, n_head=4, n_kv=2, n_layer=2, n_ff=128, ctx=48, tied=False, vocab=spm_vocab,
                rope_freqs=False, freq_base=10000.0, linear_scale=None, seed=0):
  """A random LLaMA GGUF file; returns its reference parameters (weights as float64, what the file holds)."""
  md = vocab()
  V, hd = len(md["tokenizer.ggml.tokens"]), dim // n_head
  rng = np.random.default_rng(seed)
  def r(*shape, std=0.25): return (rng.standard_normal(shape) * std).astype(np.float32)
  w = {"token_embd.weight": r(V, dim, std=1.0), "output_norm.weight": 1 + r(dim, std=0.1)}
  if not tied: w["output.weight"] = r(V, dim)
  for i in range(n_layer):
    b = f"blk.{i}."
    w |= {b + "attn_norm.weight": 1 + r(dim, std=0.1), b + "attn_q.weight": r(n_head * hd, dim),
          b + "attn_k.weight": r(n_kv * hd, dim), b + "attn_v.weight": r(n_kv * hd, dim),
          b + "attn_output.weight": r(dim, n_head * hd), b + "ffn_norm.weight": 1 + r(dim, std=0.1),
          b + "ffn_gate.weight": r(n_ff, dim), b + "ffn_up.weight": r(n_ff, dim), b + "ffn_down.weight": r(dim, n_ff)}
  md |= typed({"general.architecture": "llama", "llama.embedding_length": dim, "llama.block_count": n_layer,
               "llama.attention.head_count": n_head, "llama.attention.head_count_kv": n_kv,
               "llama.feed_forward_length": n_ff, "llama.context_length": ctx,
               "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": freq_base,
               "llama.rope.dimension_count": hd})
  if linear_scale: md["llama.rope.scaling.factor"] = np.float32(linear_scale)
  tensors, ref = _store(w, quant)
  if rope_freqs: tensors["rope_freqs.weight"] = ref["rope_freqs.weight"] = llama3_factors(hd, freq_base)
  write_gguf(path, md, tensors)
  cfg = dict(dim=dim, n_head=n_head, n_kv=n_kv, n_layer=n_layer, eps=1e-5, base=freq_base,
             scale=1 / linear_scale if linear_scale else 1.0)
  return {k: np.asarray(v, np.float64) for k, v in ref.items()}, cfg


def write_gpt2(path, dim=48, n_head=4, n_layer=2, n_ff=96, ctx=48, seed=1):
  md = bpe_vocab()
  V = len(md["tokenizer.ggml.tokens"])
  rng = np.random.default_rng(seed)
  def r(*shape, std=0.25): return (rng.standard_normal(shape) * std).astype(np.float32)
  w = {"token_embd.weight": r(V, dim, std=1.0), "position_embd.weight": r(ctx, dim, std=0.5),
       "output_norm.weight": 1 + r(dim, std=0.1), "output_norm.bias": r(dim, std=0.1)}
  for i in range(n_layer):
    b = f"blk.{i}."
    w |= {b + "attn_norm.weight": 1 + r(dim, std=0.1), b + "attn_norm.bias": r(dim, std=0.1),
          b + "attn_qkv.weight": r(3 * dim, dim), b + "attn_qkv.bias": r(3 * dim, std=0.1),
          b + "attn_output.weight": r(dim, dim), b + "attn_output.bias": r(dim, std=0.1),
          b + "ffn_norm.weight": 1 + r(dim, std=0.1), b + "ffn_norm.bias": r(dim, std=0.1),
          b + "ffn_up.weight": r(n_ff, dim), b + "ffn_up.bias": r(n_ff, std=0.1),
          b + "ffn_down.weight": r(dim, n_ff), b + "ffn_down.bias": r(dim, std=0.1)}
  md |= typed({"general.architecture": "gpt2", "gpt2.embedding_length": dim, "gpt2.block_count": n_layer,
               "gpt2.attention.head_count": n_head, "gpt2.feed_forward_length": n_ff, "gpt2.context_length": ctx,
               "gpt2.attention.layer_norm_epsilon": 1e-5})
  write_gguf(path, md, w)     # GPT-2's tied embeddings: no output.weight
  return {k: v.astype(np.float64) for k, v in w.items()}, dict(dim=dim, n_head=n_head, n_layer=n_layer, eps=1e-5)


def _store(w: dict, quant) -> tuple[dict, dict]:
  """(what write_gguf stores, the weights the file means): matrices quantized when `quant` (gguf-py's quantizer; the
  reference gets gguf-py's dequantization of those bytes), vectors always F32 (as llama.cpp keeps norms)."""
  if quant is None: return dict(w), dict(w)
  tensors, ref = {}, {}
  for name, a in w.items():
    if a.ndim == 1: tensors[name] = ref[name] = a; continue
    raw = gguf.quants.quantize(a, QT[quant])
    tensors[name] = (raw.tobytes(), quant, a.shape)
    ref[name] = gguf.quants.dequantize(raw, QT[quant]).reshape(a.shape)
  return tensors, ref


# ---------------------------------------------------------------- numpy references

def _softmax(s):
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _attend(q, k, v, n_head, n_kv):
  """q (T, n_head, hd), k/v (T, n_kv, hd): causal attention, query head h on KV head h // (n_head // n_kv)."""
  T, _, hd = q.shape
  out = np.empty((T, n_head * hd))
  for h in range(n_head):
    kv = h // (n_head // n_kv)
    s = q[:, h] @ k[:, kv].T / math.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
    out[:, h * hd:(h + 1) * hd] = _softmax(s) @ v[:, kv]
  return out


def llama_reference(W, cfg, tokens) -> np.ndarray:
  """Logits (T, vocab) of the LLaMA `W` for `tokens` at positions 0..T-1, float64."""
  dim, H, KV = cfg["dim"], cfg["n_head"], cfg["n_kv"]
  hd, T = dim // H, len(tokens)
  rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["eps"]) * w   # noqa: E731
  inv = cfg["base"] ** (-np.arange(0, hd, 2) / hd) * cfg["scale"]
  if "rope_freqs.weight" in W: inv = inv / W["rope_freqs.weight"]
  angle = np.arange(T)[:, None] * inv[None, :]                                  # (T, hd/2)
  cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
  def rope(x):      # adjacent pairs (ggml's normal mode)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out
  x = W["token_embd.weight"][tokens]
  for i in range(cfg["n_layer"]):
    L = lambda n: W[f"blk.{i}.{n}.weight"]   # noqa: E731
    h = rms(x, L("attn_norm"))
    q, k = rope((h @ L("attn_q").T).reshape(T, H, hd)), rope((h @ L("attn_k").T).reshape(T, KV, hd))
    v = (h @ L("attn_v").T).reshape(T, KV, hd)
    x = x + _attend(q, k, v, H, KV) @ L("attn_output").T
    h = rms(x, L("ffn_norm"))
    gate = h @ L("ffn_gate").T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ L("ffn_up").T)) @ L("ffn_down").T
  return rms(x, W["output_norm.weight"]) @ W.get("output.weight", W["token_embd.weight"]).T


def gpt2_reference(W, cfg, tokens) -> np.ndarray:
  dim, H, T = cfg["dim"], cfg["n_head"], len(tokens)
  def ln(x, n):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + cfg["eps"]) * W[n + ".weight"] + W[n + ".bias"]
  def lin(x, n): return x @ W[n + ".weight"].T + W[n + ".bias"]
  x = W["token_embd.weight"][tokens] + W["position_embd.weight"][:T]
  for i in range(cfg["n_layer"]):
    b = f"blk.{i}."
    qkv = lin(ln(x, b + "attn_norm"), b + "attn_qkv")
    q, k, v = (qkv[:, j * dim:(j + 1) * dim].reshape(T, H, dim // H) for j in range(3))
    x = x + lin(_attend(q, k, v, H, H), b + "attn_output")
    f = lin(ln(x, b + "ffn_norm"), b + "ffn_up")
    x = x + lin(0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f ** 3))), b + "ffn_down")
  return ln(x, "output_norm") @ W["token_embd.weight"].T


def reference_greedy(ref, prompt_ids, n, eog, margin=1e-3):
  """Greedy continuation by the reference; asserts each step's winner leads by `margin` of the logit scale, so that a
  correct float32 model cannot pick another token."""
  ids, out = list(prompt_ids), []
  for _ in range(n):
    logits = ref(ids)[-1]
    top2 = np.sort(logits)[-2:]
    assert top2[1] - top2[0] > margin * np.abs(logits).max(), "pick another seed: two logits nearly tie"
    tok = int(np.argmax(logits))
    if tok in eog: break
    out.append(tok)
    ids.append(tok)
  return out


def close(got, want, what=""):
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=what)


# ---------------------------------------------------------------- fixtures

CASES = {   # name: (writer, its arguments, reference)
  "llama_f32_gqa_rope_freqs": (write_llama, dict(rope_freqs=True, freq_base=500000.0), llama_reference),
  "llama_q8_0_tied_linear_scaling": (write_llama, dict(quant="Q8_0", tied=True, linear_scale=2.0), llama_reference),
  "gpt2": (write_gpt2, {}, gpt2_reference),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
  """(path of the file, its reference: token ids -> logits (T, vocab))."""
  write, kwargs, reference = CASES[request.param]
  path = tmp_path_factory.mktemp("llm") / f"{request.param}.gguf"
  W, cfg = write(path, **kwargs)
  return path, (lambda ids: reference(W, cfg, ids))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """A LLaMA of the shapes of the first case (so its kernels are compiled already), other weights."""
  path = tmp_path_factory.mktemp("llm") / "llama.gguf"
  W, cfg = write_llama(path, rope_freqs=True, seed=5)
  return path, (lambda ids: llama_reference(W, cfg, ids))


def check_prefill_and_decode(model, ref, prompt_ids, steps=10, captured=False):
  """Prefill logits of every prompt position, then `steps` jitted decode steps (greedy, with some forced tokens),
  each against the reference; nothing compiles after the second decode step (after the prefill when the step is
  `captured` already)."""
  ids = list(prompt_ids)
  model.reset()
  logits = model.logits(ids)
  close(logits, ref(ids), "prefill")
  logits = logits[-1]
  compiled = codegen.stats["kernels_compiled"] if captured else None
  for step in range(steps):
    tok = int(np.argmax(logits)) if step % 3 else (7 * step + 5) % model.n_vocab
    ids.append(tok)
    logits = model.step(tok)
    close(logits, ref(ids)[-1], f"decode step {step}")
    if step == 1 and not captured: compiled = codegen.stats["kernels_compiled"]
  if steps > 2 or captured:
    assert codegen.stats["kernels_compiled"] == compiled, "a replayed decode step compiled kernels"
  return ids


# ---------------------------------------------------------------- the models on the CPU

def test_prefill_and_decode(case):
  path, ref = case
  m = load_model(path, device="CPU")
  if m.arch == "llama": assert (m.n_head, m.n_head_kv, m.n_layer) == (4, 2, 2)
  prompt = m.tokenizer.encode(PROMPT)
  assert m.tokenizer.decode(prompt) == PROMPT and len(prompt) == 7     # words made of merged pieces
  check_prefill_and_decode(m, ref, prompt, steps=10)
  assert m._step_jit.graph is not None          # the later steps were replays of the captured step
  # a second sequence of the same length: the cache is overwritten from position 0, the captured step replayed
  check_prefill_and_decode(m, ref, prompt[::-1], steps=3, captured=True)


def test_generate_greedy_text(case):
  path, ref = case
  m = load_model(path, device="CPU")
  prompt = PROMPT
  ids = m.tokenizer.encode(prompt)
  want = reference_greedy(ref, ids, 12, m.tokenizer.eog_ids)
  pieces = list(m.generate(prompt, max_tokens=12, temperature=0.0))
  assert m.stats.generated == want
  assert "".join(pieces) == m.tokenizer.decode(want)
  s = m.stats
  assert s.prompt_tokens == len(ids) and s.decode_tokens == len(want) - (len(want) == 12)
  assert s.prefill_tokens_per_s > 0 and s.decode_tokens_per_s > 0 and s.decode_gb_per_s > 0
  # the same request again replays the captured step and gives the same text
  assert "".join(m.generate(prompt, max_tokens=12, temperature=0.0)) == m.tokenizer.decode(want)
  assert m.stats.steady_tokens == m.stats.decode_tokens


def test_prefill_in_chunks(llama):
  """A prompt run as two forwards: the second (4 tokens at positions 3..6) reads the first's keys from the cache
  under a causal mask offset by 3."""
  path, ref = llama
  m = load_model(path, device="CPU")
  ids = m.tokenizer.encode(PROMPT)
  close(m.logits(ids[:3]), ref(ids[:3]), "first chunk")
  close(m.logits(ids[3:]), ref(ids)[3:], "second chunk")
  assert m.pos == 7


def test_weight_bytes_per_token(llama):
  """What a decode step reads: every matrix and norm in its file type; the embedding table only its row, unless it
  is also the output matrix (tied)."""
  from baregrad.tensor.gguf import GGUFFile
  path, _ = llama
  m = load_model(path, device="CPU")
  with GGUFFile(path) as f:
    info = f.tensors
    want = sum(i.nbytes for n, i in info.items() if n != "token_embd.weight")
    emb = info["token_embd.weight"]
    want += emb.nbytes if "output.weight" not in info else emb.nbytes // emb.shape[0]
  assert m.weights.read_per_token == want


def test_sampling_is_seeded_and_filtered(llama):
  path, _ = llama
  m = load_model(path, device="CPU")
  args = dict(max_tokens=8, temperature=1.5, top_k=20, top_p=0.9, stop_at_eos=False)
  a, b = ("".join(m.generate(PROMPT, seed=7, **args)) for _ in range(2))
  assert a == b and "".join(m.generate(PROMPT, seed=8, **args)) != a
  list(m.generate(PROMPT, max_tokens=6, temperature=0.0))
  greedy = m.tokenizer.decode(m.stats.generated)
  assert "".join(m.generate(PROMPT, max_tokens=6, temperature=2.0, top_k=1, seed=1)) == greedy   # top-k 1 is greedy


def test_sample_distribution():
  """sample() on the host: top-k keeps the k largest, top-p the smallest set reaching p (of the softmax before the
  temperature), then the temperature's softmax: frequencies over 2000 draws within 4.5 sigma of the probabilities."""
  logits = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))
  rng = np.random.default_rng(0)
  n = 2000
  for params, keep in [(SamplingParams(1.0), [0, 1, 2, 3, 4]), (SamplingParams(0.7, top_k=3), [1, 3, 4]),
                       (SamplingParams(1.3, top_p=0.75), [1, 3, 4]), (SamplingParams(1.0, top_p=0.7), [1, 3]),
                       (SamplingParams(2.0, top_k=2, top_p=0.5), [1])]:
    p = np.zeros(5)
    p[keep] = np.exp(logits[keep] / params.temperature)
    p /= p.sum()
    freq = np.bincount([sample(logits, params, rng) for _ in range(n)], minlength=5) / n
    assert np.all(np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-12), (params, freq, p)
  assert sample(logits, SamplingParams(0.0, top_k=3), rng) == 1
  for bad in (dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5),
              dict(seed=-3), dict(top_k=1.5)):
    with pytest.raises(ValueError): SamplingParams(**bad)


def test_context_limit(llama):
  """A prompt and max_tokens fill the cache (48 positions) up to its last position, whose logits are still right;
  one more is refused before anything runs."""
  path, ref = llama
  m = load_model(path, device="CPU")
  ids = m.tokenizer.encode(PROMPT)
  with pytest.raises(ContextError, match="do not fit in the KV cache of 48 positions"):
    m.generate(PROMPT, max_tokens=48 - len(ids) + 1)
  list(m.generate(PROMPT, max_tokens=48 - len(ids), stop_at_eos=False))
  assert m.pos == 47 and len(m.stats.generated) == 48 - len(ids)     # the last sampled token is not run yet
  close(m.step(m.stats.generated[-1]), ref(ids + m.stats.generated)[-1], "the last position")
  with pytest.raises(ContextError, match="positions 48..48"): m.step(3)
  m2 = load_model(path, device="CPU", max_context=6)
  assert m2.n_ctx == 6
  with pytest.raises(ContextError, match="KV cache of 6 positions"): m2.generate("the cat sat", max_tokens=6)
  with pytest.raises(ModelError, match=r"\[1, 48\]"): m2.set_context(49)


# ---------------------------------------------------------------- the command

def run_llm(capsys, *args):
  code = baregrad_main(["llm", *map(str, args)])
  out = capsys.readouterr()
  return code, out.out, out.err


def test_llm_command_greedy(case, capsys):
  path, ref = case
  m = load_model(path, device="CPU")
  want = reference_greedy(ref, m.tokenizer.encode(PROMPT), 10, m.tokenizer.eog_ids)
  code, out, err = run_llm(capsys, path, "--prompt", PROMPT, "--max-tokens", 10, "--temperature", 0,
                           "--device", "CPU", "--max-context", 48)   # the other tests' cache: kernels compiled already
  assert code == 0, err
  assert out == m.tokenizer.decode(want) + "\n"
  assert "prefill:" in err and "tokens/s" in err and "GB/s" in err and "Traceback" not in err


def test_llm_command_errors(tmp_path, llama, capsys):
  path, _ = llama
  def fails(*args, match):
    code, out, err = run_llm(capsys, *args)
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("baregrad llm: ") and "Traceback" not in err, err
    assert match in lines[0], lines[0]
  fails(tmp_path / "none.gguf", "--prompt", "x", match="no such file")
  junk = tmp_path / "junk.gguf"
  junk.write_bytes(b"not a gguf file at all")
  fails(junk, "--prompt", "x", match="not a GGUF file")
  other = tmp_path / "other.gguf"
  write_gguf(other, {"general.architecture": "mamba"}, {})
  fails(other, "--prompt", "x", match="unknown architecture 'mamba'")
  broken = tmp_path / "broken.gguf"
  W, _ = write_llama(broken, dim=32, n_head=2, n_kv=1, n_layer=1, n_ff=32)
  from baregrad.tensor.gguf import GGUFFile
  with GGUFFile(broken) as f: md = dict(f.metadata)
  write_gguf(broken, md, {k: v.astype(np.float32) for k, v in W.items() if k != "blk.0.ffn_up.weight"})
  fails(broken, "--prompt", "x", match="tensor 'blk.0.ffn_up.weight' is missing")
  md["llama.block_count"] = -1
  write_gguf(broken, md, {k: v.astype(np.float32) for k, v in W.items()})
  fails(broken, "--prompt", "x", match="llama.block_count")
  for flag, value in (("--max-tokens", "-1"), ("--max-tokens", "ten"), ("--temperature", "-0.5"),
                      ("--temperature", "nan"), ("--top-k", "-2"), ("--top-p", "0"), ("--top-p", "1.5"),
                      ("--seed", "-1"), ("--max-context", "0")):
    fails(path, "--prompt", "x", flag, value, match=flag)
  fails(path, "--prompt", PROMPT, "--max-tokens", 100, match="do not fit in the KV cache")
  fails(path, "--prompt", "x", "--device", "NOPE", match="unknown device 'NOPE'")


# ---------------------------------------------------------------- emulated GPUs

@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_llama_on_emulated_gpus(emulated_gpus, device, tmp_path):
  """The emulators run each kernel instruction by instruction: a 1-layer model with grouped-query attention (2 query
  heads on 1 KV head), a 3-token prefill and three decode steps (compile, capture, replay)."""
  path = tmp_path / "tiny.gguf"
  W, cfg = write_llama(path, dim=16, n_head=2, n_kv=1, n_layer=1, n_ff=16, ctx=8, vocab=tiny_spm_vocab)
  m = load_model(path, device=device)
  assert m.device == device
  check_prefill_and_decode(m, lambda ids: llama_reference(W, cfg, ids), [1, 22, 19], steps=3)
