"""Language models from GGUF files: `load_model(path)` reads the file, picks the architecture that
`general.architecture` names and returns a model that generates text.

    from baregrad.tensor.models import load_model
    m = load_model("model.gguf", device=None)            # device: None (the default device), "CPU", "AMD", ...
    for piece in m.generate("Once upon a time", max_tokens=32, temperature=0.0):
      print(piece, end="", flush=True)
    print(m.stats.prefill_tokens_per_s, m.stats.decode_tokens_per_s)

`m.logits(ids)` and `m.step(id)` run tokens one forward (prefill) or one jitted decode step at a time (lm.py).
"""
from __future__ import annotations
import os
from baregrad.tensor import Tensor
from baregrad.tensor.gguf import GGUFFile, GGUFError, load_gguf
from .lm import LanguageModel, ModelError, ContextError, GenerationStats, Weights, DEFAULT_CONTEXT
from .sampling import SamplingParams, sample
from .llama import Llama
from .gpt2 import GPT2
from .hf import load_hf, is_hf_directory

ARCHITECTURES: dict[str, type[LanguageModel]] = {"llama": Llama, "gpt2": GPT2}


def load_model(path, device: str | None = None, max_context: int | None = None) -> LanguageModel:
  """The model in GGUF file `path` (or in a Hugging Face checkpoint directory: config.json + safetensors or
  pytorch_model.bin weights + tokenizer.json, models/hf.py) on `device`, with a KV cache of `max_context` positions
  (default: the model's context_length, at most DEFAULT_CONTEXT). Raises ModelError (a GGUFError for a file that is
  not valid GGUF) with one line naming the file and what is wrong with it."""
  path = os.fspath(path)
  if not os.path.exists(path): raise ModelError(f"{path}: no such file")
  if is_hf_directory(path):
    dev = Tensor.zeros(1, device=device).device
    metadata, tensors, infos, arch = load_hf(path, dev)
    return ARCHITECTURES[arch](path, metadata, Weights(path, tensors, infos, arch, source="hf"), dev, max_context)
  if os.path.isdir(path): raise ModelError(f"{path}: is a directory with no config.json: neither a GGUF file nor a "
                                           f"checkpoint directory")
  with GGUFFile(path) as f:
    arch = f.metadata.get("general.architecture")
    if arch is None: raise ModelError(f"{path}: metadata key 'general.architecture' is missing")
    if arch not in ARCHITECTURES:
      raise ModelError(f"{path}: unknown architecture {str(arch)[:40]!r} (general.architecture); supported: "
                       f"{', '.join(ARCHITECTURES)}")
    infos = dict(f.tensors)
  dev = Tensor.zeros(1, device=device).device      # the device's canonical name (None: the default device)
  metadata, tensors = load_gguf(path, dev)
  return ARCHITECTURES[arch](path, metadata, Weights(path, tensors, infos, arch), dev, max_context)


__all__ = ["load_model", "load_hf", "LanguageModel", "Llama", "GPT2", "ModelError", "ContextError", "GGUFError",
           "GenerationStats", "SamplingParams", "sample", "ARCHITECTURES", "DEFAULT_CONTEXT"]
