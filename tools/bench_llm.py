"""Language-model benchmarks (`python -m baregrad.tools.bench --only llm`): decode and prefill of a LLaMA-shaped model
of ~245M parameters with random weights, written here as GGUF files (F16, Q8_0, Q4_K), on the CPU; and the global
bytes an emulated GPU's decode step reads per token, against the weights' bytes.

The roofline of a decode step on the CPU is memory: each step reads every weight matrix once (and one row of the
embedding table), so tokens/s <= memory bandwidth / bytes read per token. The bandwidth is measured in the same run
by a STREAM-like copy (numpy, one thread per core, each copying its own part: (bytes read + bytes written) / time,
as STREAM's Copy reports it)."""
from __future__ import annotations
import json, os, subprocess, sys, tempfile, threading, time
import numpy as np

# LLaMA-shaped, ~245M parameters: 16 blocks of width 1024, 16 query heads and 4 KV heads (grouped-query), SwiGLU 2816,
# a 32000-token vocabulary with an untied output matrix
BIG = dict(dim=1024, layers=16, heads=16, kv_heads=4, ff=2816, vocab=32000, context=2048)
PROMPT_TOKENS, DECODE_TOKENS = 32, 24


def stream_copy_gbps(mib: int = 256, rounds: int = 5) -> float:
  """(read + written bytes) / seconds of copying `mib` MiB, split across one numpy thread per core (the copy releases
  the GIL), best of `rounds`."""
  n = (mib << 20) // 8
  src, dst = np.random.rand(n), np.empty(n)
  cores = os.cpu_count() or 1
  parts = np.array_split(np.arange(n), cores)
  bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]
  best = 0.0
  for _ in range(rounds):
    threads = [threading.Thread(target=np.copyto, args=(dst[b:e], src[b:e])) for b, e in bounds]
    t = time.perf_counter()
    for th in threads: th.start()
    for th in threads: th.join()
    best = max(best, 2 * src.nbytes / (time.perf_counter() - t) / 1e9)
  return best


def _vocab(n: int) -> dict:
  """A SentencePiece-style vocabulary of n tokens: <unk>, <s>, </s>, the 256 byte tokens, then filler words."""
  tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
  tokens += [f"\u2581w{i}" for i in range(n - len(tokens))]
  types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
  return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(n - 259)],
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": np.uint32(1),
          "tokenizer.ggml.eos_token_id": np.uint32(2), "tokenizer.ggml.unknown_token_id": np.uint32(0)}


def random_blocks(rng, ftype: str, shape) -> tuple:
  """Random weights of `shape` in ggml type `ftype`, as the writer takes them: F16 arrays, or raw blocks with
  finite scales (Q8_0: 34 bytes per 32; Q4_K: 144 bytes per 256; block layouts in tensor/ggml_quants.py)."""
  from baregrad.tensor.ggml_quants import BY_NAME, LAYOUTS
  if ftype in ("F16", "F32"):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16 if ftype == "F16" else np.float32)
  t = BY_NAME[ftype]
  nb = int(np.prod(shape)) // t.block_size
  raw = rng.integers(0, 256, (nb, t.type_size), dtype=np.uint8)
  for field in ("d", "dmin", "m"):
    if field in LAYOUTS[ftype]:
      at = LAYOUTS[ftype][field][0]
      raw[:, at:at + 2] = (rng.random(nb, dtype=np.float32) * 0.002).astype(np.float16).view(np.uint8).reshape(nb, 2)
  return (raw.reshape(-1).tobytes(), ftype, tuple(shape))


def write_llama(path: str, ftype: str, cfg: dict, seed: int = 0) -> None:
  """A LLaMA GGUF with random weights: norms F32, the matrices (and the embedding table) in `ftype`."""
  from baregrad.tensor.gguf import write_gguf
  rng = np.random.default_rng(seed)
  dim, ff, hd = cfg["dim"], cfg["ff"], cfg["dim"] // cfg["heads"]
  md = {"general.architecture": "llama", "llama.embedding_length": np.uint32(dim),
        "llama.block_count": np.uint32(cfg["layers"]), "llama.attention.head_count": np.uint32(cfg["heads"]),
        "llama.attention.head_count_kv": np.uint32(cfg["kv_heads"]), "llama.feed_forward_length": np.uint32(ff),
        "llama.context_length": np.uint32(cfg["context"]), "llama.rope.dimension_count": np.uint32(hd),
        "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5), "llama.rope.freq_base": np.float32(10000.0),
        **_vocab(cfg["vocab"])}
  kv = cfg["kv_heads"] * hd
  tensors = {"token_embd.weight": random_blocks(rng, ftype, (cfg["vocab"], dim)),
             "output_norm.weight": np.ones(dim, np.float32),
             "output.weight": random_blocks(rng, ftype, (cfg["vocab"], dim))}
  for i in range(cfg["layers"]):
    b = f"blk.{i}."
    tensors.update({b + "attn_norm.weight": np.ones(dim, np.float32), b + "ffn_norm.weight": np.ones(dim, np.float32),
                    b + "attn_q.weight": random_blocks(rng, ftype, (dim, dim)),
                    b + "attn_k.weight": random_blocks(rng, ftype, (kv, dim)),
                    b + "attn_v.weight": random_blocks(rng, ftype, (kv, dim)),
                    b + "attn_output.weight": random_blocks(rng, ftype, (dim, dim)),
                    b + "ffn_gate.weight": random_blocks(rng, ftype, (ff, dim)),
                    b + "ffn_up.weight": random_blocks(rng, ftype, (ff, dim)),
                    b + "ffn_down.weight": random_blocks(rng, ftype, (dim, ff))})
  write_gguf(path, md, tensors)


def _run_model(path: str, device: str, prompt_tokens: int, decode_tokens: int, rounds: int = 3):
  """Prefill and decode once to compile and capture, then `rounds` times timed: the GenerationStats of the round that
  decoded fastest, with the fastest round's prefill (the best of several, as the copy bandwidth it is compared with:
  on a shared machine a single round reads 0.6-1.0 of the roofline)."""
  import copy
  from baregrad.tensor.models import load_model
  m = load_model(path, device=device, max_context=prompt_tokens + decode_tokens + 1)
  prompt = list(range(300, 300 + prompt_tokens))
  runs = []
  for i in range(rounds + 1):
    list(m.generate(prompt, max_tokens=decode_tokens, temperature=0.0, stop_at_eos=False))
    if i: runs.append(copy.deepcopy(m.stats))
  best = max(runs, key=lambda s: s.decode_tokens_per_s)
  best.prompt_tokens, best.prefill_s = max(((s.prompt_tokens, s.prefill_s) for s in runs), key=lambda p: p[0] / p[1])
  return best


# llama.cpp on the same file, in a child (the llama-cpp-python package, which is not a dependency: `bench --llama-cpp
# PYTHON` names an interpreter that imports it; without one, this interpreter if it does): the same prompt, then one
# token per eval as a decode does, with all cores; the best of `rounds` as for ours
LLAMA_CPP_PYTHON: str | None = None
LLAMA_CPP_CHILD = r"""
import json, os, sys, time
from llama_cpp import Llama
path, prompt_tokens, decode_tokens, rounds = sys.argv[1], *map(int, sys.argv[2:5])
m = Llama(model_path=path, n_ctx=prompt_tokens + decode_tokens + 8, n_threads=os.cpu_count(), n_batch=prompt_tokens,
          verbose=False)
prompt, best = list(range(300, 300 + prompt_tokens)), 0.0
for r in range(rounds + 1):
  m.reset(); m.eval(prompt)
  t = time.perf_counter()
  for i in range(decode_tokens): m.eval([301 + i])
  if r: best = max(best, decode_tokens / (time.perf_counter() - t))
print(json.dumps({"decode_tok_s": best}))
"""


def llama_cpp_python() -> str | None:
  """An interpreter that imports llama_cpp: LLAMA_CPP_PYTHON (bench --llama-cpp), else this one if it can; None
  without one."""
  exe = LLAMA_CPP_PYTHON or sys.executable
  try: ok = subprocess.run([exe, "-c", "import llama_cpp"], capture_output=True, timeout=120).returncode == 0
  except OSError as e: raise RuntimeError(f"--llama-cpp {exe!r}: cannot run it ({e})") from None
  if not ok and LLAMA_CPP_PYTHON:
    raise RuntimeError(f"--llama-cpp {exe!r} cannot import llama_cpp (pip install llama-cpp-python there)")
  return exe if ok else None


def llama_cpp_decode(exe: str, path: str, rounds: int = 3) -> float:
  out = subprocess.run([exe, "-c", LLAMA_CPP_CHILD, path, str(PROMPT_TOKENS), str(DECODE_TOKENS), str(rounds)],
                       capture_output=True, text=True, timeout=1800)
  if out.returncode != 0: raise RuntimeError(f"llama.cpp decode of {path} failed:\n{out.stderr[-2000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])["decode_tok_s"]


def bench_llm_cpu(results: dict):
  """F16, Q8_0 and Q4_K files of the ~245M-parameter model: decode tokens/s (steps replayed from the captured jit),
  prefill tokens/s of a 32-token prompt, the bytes a decode step reads, and the roofline: the copy bandwidth divided
  by those bytes. The copy is measured before each model and after the last, and the best of those is the
  bandwidth (cpu.stream_copy.gbps) every share is computed with: a share is never flattered by a slow moment.
  Where llama-cpp-python is there (llama_cpp_python()), llama.cpp decodes each file right after ours, in the same
  run: `.llama_cpp_decode_tok_s` and our decode rate over it, `.vs_llama_cpp`."""
  bws, found, theirs = [], [], {}
  exe = llama_cpp_python()
  with tempfile.TemporaryDirectory(prefix="baregrad-bench-llm-") as tmp:
    for ftype in ("F16", "Q8_0", "Q4_K"):
      path = os.path.join(tmp, f"llama_245m_{ftype}.gguf")
      write_llama(path, ftype, BIG)
      bws.append(stream_copy_gbps())
      found.append((ftype, _run_model(path, "CPU", PROMPT_TOKENS, DECODE_TOKENS)))
      if exe is not None: theirs[ftype] = llama_cpp_decode(exe, path)
      os.unlink(path)
  bws.append(stream_copy_gbps())
  results["cpu.stream_copy.gbps"] = bw = max(bws)
  for ftype, stats in found:
    key = f"cpu.llm_245m_{ftype.lower()}"
    results[f"{key}.decode_tok_s"] = stats.decode_tokens_per_s
    results[f"{key}.prefill_tok_s"] = stats.prefill_tokens_per_s
    results[f"{key}.bytes_per_token_mb"] = stats.weight_bytes_per_token / 1e6
    roof = bw * 1e9 / stats.weight_bytes_per_token
    results[f"{key}.roofline_tok_s"] = roof
    results[f"{key}.roofline_share"] = stats.decode_tokens_per_s / roof
    if ftype in theirs:
      results[f"{key}.llama_cpp_decode_tok_s"] = theirs[ftype]
      results[f"{key}.vs_llama_cpp"] = stats.decode_tokens_per_s / theirs[ftype]


# an emulated GPU runs a small model: a decode step's global bytes (loads) against the bytes of the weights it reads
# (ff 768: 24 blocks of 32, so a thread's share of the down projection is whole quantized blocks, as in real models:
# 2816, 11008 and 14336 are 88, 344 and 448 blocks)
SMALL = dict(dim=256, layers=2, heads=4, kv_heads=2, ff=768, vocab=1024, context=64)
EMU_CHILD = r"""
import json, sys
from baregrad.drivers import settings
from baregrad.drivers.emu import counters
with settings.override(EMU=1):
  from baregrad.tensor.models import load_model
  m = load_model(sys.argv[1], device=sys.argv[2], max_context=16)
  list(m.generate(list(range(300, 304)), max_tokens=4, temperature=0.0, stop_at_eos=False))
  counters.count_unique(True)
  counters.reset()
  m.step(300)
  total = counters.total()
print(json.dumps({"load": total.global_load_bytes, "unique": total.global_load_unique_bytes,
                  "store": total.global_store_bytes, "weights": m.weights.read_per_token}))
"""


# a prefill's causal attention with the small model's heads (4 x 64 dims) over ATTN_T tokens: its kernels and the global
# bytes they store per byte of output (1.0: one kernel that writes only its output, no T x T scores)
ATTN_T = 32
ATTN_CHILD = r"""
import json, sys
import numpy as np
from baregrad.drivers import settings
from baregrad.drivers.emu import counters
with settings.override(EMU=1):
  from baregrad.tensor import Tensor
  dev, T, H, hd = sys.argv[1], %d, 4, 64
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal((1, H, T, hd)).astype(np.float32), device=dev).realize() for _ in range(3))
  mask = Tensor(np.triu(np.full((T, T), -np.inf, np.float32), 1), device=dev).realize()
  out = q.scaled_dot_product_attention(k, v, mask)
  counters.reset()
  out.numpy()
  total = counters.total()
print(json.dumps({"kernels": total.kernels, "store": total.global_store_bytes, "out": H * T * hd * 4}))
""" % ATTN_T


def bench_llm_emulated(results: dict):
  """On each emulated GPU (EMU=1, a fresh process): the global bytes one replayed decode step reads from DRAM (each
  32-byte sector once per kernel: what the caches leave) and the bytes its loads move (a vector read again per output
  row counts each time), divided by the bytes of the weights it needs (goal: DRAM <= 1.1), for F32 and Q8_0 weights
  of a small LLaMA; and a prefill attention's kernels and stored bytes per output byte (goal: one kernel, 1.0: the
  scores are never stored)."""
  with tempfile.TemporaryDirectory(prefix="baregrad-bench-llm-emu-") as tmp:
    for ftype in ("F32", "Q8_0"):
      path = os.path.join(tmp, f"llama_small_{ftype}.gguf")
      write_llama(path, ftype, SMALL)
      for dev in ("NV", "AMD"):
        out = subprocess.run([sys.executable, "-c", EMU_CHILD, path, dev], capture_output=True, text=True,
                             timeout=1800)      # (the child sets EMU=1 itself: settings.override)
        if out.returncode != 0:
          raise RuntimeError(f"emulated {dev} LLM decode failed:\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[f"emu_{dev.lower()}.llm_decode_{ftype.lower()}.global_load_per_weight_byte"] = r["load"] / r["weights"]
        results[f"emu_{dev.lower()}.llm_decode_{ftype.lower()}.dram_load_per_weight_byte"] = r["unique"] / r["weights"]
  for dev in ("NV", "AMD"):
    out = subprocess.run([sys.executable, "-c", ATTN_CHILD, dev], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0: raise RuntimeError(f"emulated {dev} prefill attention failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    key = f"emu_{dev.lower()}.prefill_attention_{ATTN_T}"
    results[f"{key}.kernels"] = r["kernels"]
    results[f"{key}.global_store_per_output_byte"] = r["store"] / r["out"]
