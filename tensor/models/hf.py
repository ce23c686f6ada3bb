"""Language models from Hugging Face checkpoint directories: `config.json` + the weights (`model.safetensors`,
`pytorch_model.bin`, or either sharded with its `*.index.json`) + `tokenizer.json`.

The directory becomes what a GGUF file of the same model holds -- `{arch}.*` metadata keys, GGUF tensor names and
layouts, `tokenizer.ggml.*` keys -- so the models of llama.py and gpt2.py run it unchanged. What changes on the way
is what llama.cpp's convert_hf_to_gguf.py changes (the facts below are that converter's, gguf-py's TensorNameMap and
transformers' model classes):
- LLaMA family (model_type llama, mistral): model.embed_tokens -> token_embd; per layer input_layernorm ->
  attn_norm, self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output}, post_attention_layernorm -> ffn_norm,
  mlp.{gate,up,down}_proj -> ffn_{gate,up,down}; model.norm -> output_norm; lm_head -> output (absent or tied: the
  embeddings). transformers rotates (x[i], x[i + d/2]) of each head (rotate_half); GGUF files rotate adjacent pairs,
  so the converter permutes the rows of q_proj and k_proj per head: reshape(n_head, 2, head_dim / 2, dim), swap the
  two middle axes (LlamaModel.permute). rope_scaling "linear" becomes llama.rope.scaling.*, "llama3" the per-frequency
  factors the converter writes as rope_freqs.weight (generate_extra_tensors: wavelengths below
  original_max_position_embeddings / high_freq_factor keep factor 1, above / low_freq_factor get `factor`, smoothed in
  between).
- GPT-2 (model_type gpt2): transformer.wte/wpe -> token_embd/position_embd; per layer ln_1 -> attn_norm,
  attn.c_attn -> attn_qkv, attn.c_proj -> attn_output, ln_2 -> ffn_norm, mlp.c_fc -> ffn_up, mlp.c_proj -> ffn_down;
  ln_f -> output_norm. GPT-2's Conv1D stores weights (in, out): transposed to GGUF's (out, in). The attention-mask
  buffers (attn.bias, attn.masked_bias) are not weights.
- tokenizer.json with a byte-level BPE model (GPT-2, LLaMA 3) becomes a "gpt2" tokenizer (vocabulary by id, added
  tokens, merges). A directory without one (or with a SentencePiece model) loads with no tokenizer: logits() and
  step() take token ids, generate() says it needs a tokenizer.

Everything read is untrusted: JSON files are size-bounded, every config value type- and range-checked by the model
(lm.py Config), every tensor's shape checked against the config before use.
"""
from __future__ import annotations
import json, math, os
from dataclasses import dataclass
from typing import Any
import numpy as np
from baregrad.tensor import Tensor
from .lm import ModelError

MAX_JSON_BYTES = 64 << 20          # config.json, tokenizer.json and index files: larger is not a real one
LLAMA_TYPES = ("llama", "mistral")


@dataclass(frozen=True)
class HFTensorInfo:
  """What lm.Weights needs of a tensor: its name, shape and the bytes it takes in the checkpoint."""
  name: str
  shape: tuple
  nbytes: int


def is_hf_directory(path: str) -> bool:
  return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def _read_json(path: str, what: str) -> Any:
  try: size = os.path.getsize(path)
  except OSError as e: raise ModelError(f"{path}: cannot read {what} ({e.strerror})") from None
  if size > MAX_JSON_BYTES: raise ModelError(f"{path}: {what} of {size} bytes is larger than {MAX_JSON_BYTES} bytes")
  try:
    with open(path, "rb") as f: return json.loads(f.read().decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e: raise ModelError(f"{path}: {what} is not valid JSON ({e})") from None


def _load_weight_files(directory: str, device) -> dict[str, Tensor]:
  """Every tensor of the checkpoint's weight files (sharded or not) by its checkpoint name."""
  from baregrad.tensor.safetensors import load_file, SafetensorsError
  from baregrad.tensor.torch_load import load_torch, TorchLoadError
  for single, index in (("model.safetensors", "model.safetensors.index.json"),
                        ("pytorch_model.bin", "pytorch_model.bin.index.json")):
    files = None
    if os.path.isfile(os.path.join(directory, single)): files = [single]
    elif os.path.isfile(os.path.join(directory, index)):
      idx = _read_json(os.path.join(directory, index), "the shard index")
      weight_map = idx.get("weight_map") if isinstance(idx, dict) else None
      if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelError(f"{os.path.join(directory, index)}: 'weight_map' must map tensor names to file names")
      files = sorted(set(weight_map.values()))
      for name in files:     # shard names come from the file: no path may leave the directory
        if os.path.basename(name) != name or name in ("", ".", ".."):
          raise ModelError(f"{os.path.join(directory, index)}: shard {name[:80]!r} is not a file name in the directory")
    if files is None: continue
    tensors: dict[str, Tensor] = {}
    for name in files:
      path = os.path.join(directory, name)
      try:
        got = load_file(path, device) if name.endswith(".safetensors") else load_torch(path, device)
      except (SafetensorsError, TorchLoadError) as e: raise ModelError(str(e)) from None
      if isinstance(got, dict) and "state_dict" in got and isinstance(got["state_dict"], dict): got = got["state_dict"]
      if not isinstance(got, dict): raise ModelError(f"{path}: holds a {type(got).__name__}, not a state dict")
      for k, v in got.items():
        if not isinstance(k, str) or not isinstance(v, Tensor): continue      # step counters and the like
        if k in tensors: raise ModelError(f"{path}: tensor {k!r} is also in another shard")
        tensors[k] = v
    return tensors
  raise ModelError(f"{directory}: no weights (model.safetensors, pytorch_model.bin, or a sharded one with its "
                   f"*.index.json)")


# ---------------------------------------------------------------- config.json -> GGUF metadata

def _cfg(config: dict, key: str, kinds=(int,), default=None, path: str = ""):
  v = config.get(key, default)
  if v is None: raise ModelError(f"{path}: config.json has no {key!r}")
  if isinstance(v, bool) or not isinstance(v, kinds):
    raise ModelError(f"{path}: config.json {key!r} must be {' or '.join(k.__name__ for k in kinds)}, got {v!r}")
  return v


def llama3_rope_factors(head_dim: int, theta: float, scaling: dict, path: str) -> np.ndarray:
  """convert_hf_to_gguf.py's llama3 rope factors (one per frequency pair), which ggml divides the angles by."""
  try:
    factor = float(scaling.get("factor", 8.0)); low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0)); old = float(scaling.get("original_max_position_embeddings", 8192))
  except (TypeError, ValueError): raise ModelError(f"{path}: config.json rope_scaling {scaling!r} has a non-number") from None
  if not (factor > 0 and old > 0 and high > low > 0):
    raise ModelError(f"{path}: config.json rope_scaling {scaling!r}: needs factor > 0, high_freq_factor > "
                     f"low_freq_factor > 0, original_max_position_embeddings > 0")
  freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  low_wavelen, high_wavelen = old / low, old / high
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < high_wavelen: out.append(1.0)
    elif wavelen > low_wavelen: out.append(factor)
    else:
      smooth = (old / wavelen - low) / (high - low)
      out.append(1.0 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def _llama_metadata(config: dict, path: str) -> tuple[dict, np.ndarray | None]:
  g = lambda key, kinds=(int,), default=None: _cfg(config, key, kinds, default, path)   # noqa: E731
  # transformers 5 writes the RoPE settings as one `rope_parameters` object (rope_theta, rope_type and the scaling
  # fields); 4.x as `rope_theta` beside a `rope_scaling` object (null when unscaled)
  params = config.get("rope_parameters")
  if params is not None and not isinstance(params, dict): raise ModelError(f"{path}: config.json rope_parameters must be an object")
  params = params or {}
  dim, heads = g("hidden_size"), g("num_attention_heads")
  md = {"llama.embedding_length": dim, "llama.block_count": g("num_hidden_layers"),
        "llama.attention.head_count": heads, "llama.attention.head_count_kv": g("num_key_value_heads", default=heads),
        "llama.feed_forward_length": g("intermediate_size"),
        "llama.attention.layer_norm_rms_epsilon": float(g("rms_norm_eps", (int, float))),
        "llama.rope.freq_base": float(_cfg(params, "rope_theta", (int, float), 10000.0, path + " rope_parameters")
                                      if "rope_theta" in params else g("rope_theta", (int, float), 10000.0)),
        "llama.context_length": g("max_position_embeddings", default=4096)}
  head_dim = config.get("head_dim")
  if head_dim is not None: md["llama.attention.key_length"] = md["llama.attention.value_length"] = g("head_dim")
  head_dim = head_dim or (dim // heads if heads > 0 else 0)
  act = config.get("hidden_act", "silu")
  if act != "silu": raise ModelError(f"{path}: config.json hidden_act {act!r}: LLaMA models use silu (SwiGLU)")
  factors = None
  scaling = config.get("rope_scaling") or (params if params.get("rope_type") not in (None, "default") else None)
  if scaling is not None:
    if not isinstance(scaling, dict): raise ModelError(f"{path}: config.json rope_scaling must be an object")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
      md["llama.rope.scaling.type"], md["llama.rope.scaling.factor"] = "linear", float(_cfg(scaling, "factor", (int, float), None, path))
    elif kind == "llama3":
      factors = llama3_rope_factors(head_dim, md["llama.rope.freq_base"], scaling, path)
    elif kind not in (None, "default"):
      raise ModelError(f"{path}: config.json rope_scaling type {kind!r} is not supported (supported: linear, llama3)")
  return md, factors


def _gpt2_metadata(config: dict, path: str) -> dict:
  g = lambda key, kinds=(int,), default=None: _cfg(config, key, kinds, default, path)   # noqa: E731
  dim = g("n_embd")
  act = config.get("activation_function", "gelu_new")
  if act != "gelu_new":
    raise ModelError(f"{path}: config.json activation_function {act!r}: GPT-2 models use gelu_new (tanh GELU)")
  return {"gpt2.embedding_length": dim, "gpt2.block_count": g("n_layer"), "gpt2.attention.head_count": g("n_head"),
          "gpt2.feed_forward_length": g("n_inner") if config.get("n_inner") is not None else 4 * dim,
          "gpt2.attention.layer_norm_epsilon": float(g("layer_norm_epsilon", (int, float), 1e-5)),
          "gpt2.context_length": g("n_positions", default=1024)}


# ---------------------------------------------------------------- tokenizer.json -> tokenizer.ggml.* keys

def _is_byte_level(pre) -> bool:
  if not isinstance(pre, dict): return False
  if pre.get("type") == "ByteLevel": return True
  return pre.get("type") == "Sequence" and any(_is_byte_level(p) for p in pre.get("pretokenizers") or ())


def tokenizer_metadata(directory: str, arch: str, config: dict) -> dict:
  """The tokenizer.ggml.* keys for the directory's tokenizer.json ({} when there is none it can read)."""
  path = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(path): return {}
  tj = _read_json(path, "tokenizer.json")
  model = tj.get("model") if isinstance(tj, dict) else None
  if not isinstance(model, dict) or model.get("type") != "BPE" or not _is_byte_level(tj.get("pre_tokenizer")):
    return {}                   # SentencePiece-style and other tokenizers: no tokenizer (token ids only)
  vocab, merges = model.get("vocab"), model.get("merges") or []
  if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                            for k, v in vocab.items()):
    raise ModelError(f"{path}: model.vocab must map token texts to integer ids")
  added = [t for t in tj.get("added_tokens") or () if isinstance(t, dict)]
  ids = dict(vocab)
  for t in added:
    if isinstance(t.get("content"), str) and isinstance(t.get("id"), int): ids[t["content"]] = t["id"]
  n = max(ids.values(), default=-1) + 1
  if n > 1 << 22 or min(ids.values(), default=0) < 0: raise ModelError(f"{path}: token ids outside [0, 2^22)")
  tokens = [""] * n
  for text, i in ids.items(): tokens[i] = text
  if any(not t for t in tokens): raise ModelError(f"{path}: the vocabulary has ids with no token (holes)")
  types = [1] * n
  for t in added:
    if t.get("content") in ids: types[ids[t["content"]]] = 3 if t.get("special") else 4
  out_merges = []
  for m in merges:       # "a b" strings (older files) or [a, b] pairs
    if isinstance(m, str): out_merges.append(m)
    elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m): out_merges.append(f"{m[0]} {m[1]}")
    else: raise ModelError(f"{path}: model.merges entry {str(m)[:60]!r} is neither 'a b' nor [a, b]")
  md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2" if arch == "gpt2" else "llama-bpe",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": out_merges,
        "tokenizer.ggml.add_bos_token": arch != "gpt2"}
  for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos")):
    v = config.get(key)
    if isinstance(v, list) and v: v = v[0]
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n: md[f"tokenizer.ggml.{name}_token_id"] = v
  return md


# ---------------------------------------------------------------- weights: names and layouts

def _llama_tensors(hf: dict[str, Tensor], md: dict, path: str) -> dict[str, Tensor]:
  heads, kv = md["llama.attention.head_count"], md["llama.attention.head_count_kv"]
  out: dict[str, Tensor] = {}

  def permute(w: Tensor, n_head: int, name: str) -> Tensor:
    """rotate_half rows -> adjacent pairs (convert_hf_to_gguf.py LlamaModel.permute) for (n_head * hd, ...) w."""
    rows = w.shape[0]
    if rows % (2 * n_head): raise ModelError(f"{path}: {name} has {rows} rows, not a multiple of 2 x {n_head} heads")
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).transpose(1, 2).reshape(*w.shape)

  names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
  layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
           "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
           "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
           "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
           "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
           "mlp.down_proj.weight": "ffn_down.weight"}
  for name, t in hf.items():
    if name in names: out[names[name]] = t; continue
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit() and parts[3] in layer:
      new = f"blk.{int(parts[2])}.{layer[parts[3]]}"
      if parts[3].startswith("self_attn.q_proj"): t = permute(t, heads, name)
      elif parts[3].startswith("self_attn.k_proj"): t = permute(t, kv, name)
      out[new] = t
    elif name.endswith("rotary_emb.inv_freq"): continue    # a buffer older checkpoints saved: recomputed from config
    else: raise ModelError(f"{path}: tensor {name!r} is not a LLaMA weight (unknown name)")
  return out


def _gpt2_tensors(hf: dict[str, Tensor], path: str) -> dict[str, Tensor]:
  out: dict[str, Tensor] = {}
  names = {"wte.weight": ("token_embd.weight", False), "wpe.weight": ("position_embd.weight", False),
           "ln_f.weight": ("output_norm.weight", False), "ln_f.bias": ("output_norm.bias", False)}
  layer = {"ln_1.weight": ("attn_norm.weight", False), "ln_1.bias": ("attn_norm.bias", False),
           "attn.c_attn.weight": ("attn_qkv.weight", True), "attn.c_attn.bias": ("attn_qkv.bias", False),
           "attn.c_proj.weight": ("attn_output.weight", True), "attn.c_proj.bias": ("attn_output.bias", False),
           "ln_2.weight": ("ffn_norm.weight", False), "ln_2.bias": ("ffn_norm.bias", False),
           "mlp.c_fc.weight": ("ffn_up.weight", True), "mlp.c_fc.bias": ("ffn_up.bias", False),
           "mlp.c_proj.weight": ("ffn_down.weight", True), "mlp.c_proj.bias": ("ffn_down.bias", False)}
  for name, t in hf.items():
    key = name[len("transformer."):] if name.startswith("transformer.") else name
    if key == "lm_head.weight": out["output.weight"] = t; continue
    if key in names: new, transpose = names[key]
    else:
      parts = key.split(".", 2)
      if len(parts) == 3 and parts[0] == "h" and parts[1].isdigit() and parts[2] in ("attn.bias", "attn.masked_bias"):
        continue                                   # causal-mask buffers, not weights
      if not (len(parts) == 3 and parts[0] == "h" and parts[1].isdigit() and parts[2] in layer):
        raise ModelError(f"{path}: tensor {name!r} is not a GPT-2 weight (unknown name)")
      new, transpose = layer[parts[2]]
      new = f"blk.{int(parts[1])}.{new}"
    if transpose:         # Conv1D (in, out) -> (out, in)
      if len(t.shape) != 2: raise ModelError(f"{path}: tensor {name!r} of shape {tuple(t.shape)} is not a matrix")
      t = t.T
    out[new] = t
  return out


def load_hf(directory: str, device) -> tuple[dict, dict[str, Tensor], dict[str, HFTensorInfo], str]:
  """(metadata in GGUF keys, tensors in GGUF names and layouts, their infos, architecture) of a checkpoint directory."""
  config = _read_json(os.path.join(directory, "config.json"), "config.json")
  if not isinstance(config, dict): raise ModelError(f"{directory}/config.json: must be a JSON object")
  model_type = config.get("model_type")
  if model_type in LLAMA_TYPES: arch = "llama"
  elif model_type == "gpt2": arch = "gpt2"
  else:
    raise ModelError(f"{directory}/config.json: model_type {str(model_type)[:40]!r} is not supported (supported: "
                     f"{', '.join(LLAMA_TYPES)}, gpt2)")
  where = os.path.join(directory, "config.json")
  if arch == "llama": md, factors = _llama_metadata(config, where)
  else: md, factors = _gpt2_metadata(config, where), None
  md["general.architecture"] = arch
  md.update(tokenizer_metadata(directory, arch, config))
  hf = _load_weight_files(directory, device)
  tensors = _llama_tensors(hf, md, directory) if arch == "llama" else _gpt2_tensors(hf, directory)
  if factors is not None: tensors["rope_freqs.weight"] = Tensor(factors, device=device)
  if config.get("tie_word_embeddings") and "output.weight" in tensors and arch == "llama":
    del tensors["output.weight"]                  # tied: the embeddings serve (llama.py reads them again)
  infos = {name: HFTensorInfo(name, tuple(t.shape), int(np.prod(t.shape)) * t.dtype.itemsize) for name, t in tensors.items()}
  return md, tensors, infos, arch


__all__ = ["load_hf", "is_hf_directory", "tokenizer_metadata", "llama3_rope_factors", "HFTensorInfo"]
