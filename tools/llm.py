"""`baregrad llm MODEL.gguf --prompt "..."`: generate text with a language model from a GGUF file.

The generated text (not the prompt) streams to stdout as it is sampled; the timings follow on stderr: the prefill (all
prompt tokens in one forward) and the decode in tokens per second, and the memory bandwidth the decode uses — the
bytes of weights one decode step reads (each matrix once, in its file type; one row of an embedding table) times
decode steps per second. A decode on a memory-bound machine cannot beat its memory bandwidth divided by those bytes.
The first two decode steps of a run compile and capture the step's kernels; the decode rate counts the steps
replayed after them.

Errors in the request or the file (no such file, not GGUF, an architecture or a tensor missing, a bad number, a prompt
longer than the context) print one line and exit with code 2.
"""
from __future__ import annotations
import argparse, math, sys, time

DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser):
  # sampling defaults as llama.cpp's (common/common.h, common_params_sampling): temp 0.8, top_k 40, top_p 0.95
  p.add_argument("model", help="a GGUF file (general.architecture llama or gpt2)")
  p.add_argument("--prompt", required=True, metavar="TEXT", help="text to continue")
  p.add_argument("--max-tokens", default="64", metavar="N", help="tokens to generate at most (default 64)")
  p.add_argument("--device", default=None, metavar="D", help="device to run on (default: DEV or CPU)")
  p.add_argument("--temperature", default="0.8", metavar="T", help="0 is greedy (default 0.8)")
  p.add_argument("--top-k", default="40", metavar="K",
                 help="sample among the K most likely tokens; 0 keeps all (default 40)")
  p.add_argument("--top-p", default="0.95", metavar="P",
                 help="sample among the most likely tokens that hold probability P; 1 keeps all (default 0.95)")
  p.add_argument("--seed", default=None, metavar="S", help="seed of the sampler (default: a random one)")
  p.add_argument("--max-context", default=None, metavar="N",
                 help="KV cache positions (default: what the prompt and --max-tokens need)")


class _Bad(ValueError):
  pass


def _number(text, flag: str, kind, check, what: str):
  if text is None: return None
  try:
    v = kind(text)
  except ValueError: raise _Bad(f"{flag} must be {what}, got {text!r}") from None
  if (isinstance(v, float) and not math.isfinite(v)) or not check(v): raise _Bad(f"{flag} must be {what}, got {text!r}")
  return v


def _fail(msg: str) -> int:
  print(f"baregrad llm: {msg}", file=sys.stderr)
  return 2


def run(args) -> int:
  try:
    max_tokens = _number(args.max_tokens, "--max-tokens", int, lambda v: v >= 0, "an integer >= 0")
    temperature = _number(args.temperature, "--temperature", float, lambda v: v >= 0, "a number >= 0 (0 is greedy)")
    top_k = _number(args.top_k, "--top-k", int, lambda v: v >= 0, "an integer >= 0 (0 keeps every token)")
    top_p = _number(args.top_p, "--top-p", float, lambda v: 0 < v <= 1, "a number in (0, 1]")
    seed = _number(args.seed, "--seed", int, lambda v: 0 <= v < 2**63, "an integer in [0, 2^63)")
    max_context = _number(args.max_context, "--max-context", int, lambda v: v >= 1, "an integer >= 1")
  except _Bad as e: return _fail(str(e))

  from baregrad.tensor.models import load_model
  try:
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, max_context=max_context)
    load_s = time.perf_counter() - t0
    if max_context is None:     # a cache just as long as this request needs (capped by the model's context)
      need = len(model.encode(args.prompt)) + max_tokens
      model.set_context(max(1, min(need, model.train_context)))
    pieces = model.generate(args.prompt, max_tokens, temperature, top_k, top_p, seed)
  except (ValueError, OSError) as e: return _fail(str(e))     # ModelError, GGUFError, ContextError, ...
  except RuntimeError as e: return _fail(f"device {args.device or 'default'}: {e}")   # a device that cannot open
  print(f"{model.arch} model {args.model}: {model.n_layer} layers, vocabulary {model.n_vocab}, context "
        f"{model.n_ctx} of {model.train_context}, on {model.device} (loaded in {load_s:.2f} s)", file=sys.stderr)
  try:
    for piece in pieces:
      sys.stdout.write(piece)
      sys.stdout.flush()
  except KeyboardInterrupt:
    print(file=sys.stderr)
    return 130
  sys.stdout.write("\n")
  sys.stdout.flush()
  _report(model.stats)
  return 0


def _report(s):
  err = sys.stderr
  print(f"prefill: {s.prompt_tokens} tokens in {s.prefill_s:.3f} s, {s.prefill_tokens_per_s:.1f} tokens/s "
        f"(compiling included on a first run)", file=err)
  if not s.decode_tokens:
    print("decode: no decode steps", file=err)
    return
  how = f"over the {s.steady_tokens} replayed steps" if s.steady_tokens else "compiling included"
  print(f"decode: {s.decode_tokens} tokens in {s.decode_s:.3f} s, {s.decode_tokens_per_s:.1f} tokens/s ({how})",
        file=err)
  print(f"decode memory bandwidth: {s.weight_bytes_per_token / 1e6:.2f} MB of weights per token x "
        f"{s.decode_tokens_per_s:.1f} tokens/s = {s.decode_gb_per_s:.2f} GB/s", file=err)
