"""Choosing the next token from a row of logits, on the host (a numpy Generator over float64 logits).

The filters run in llama.cpp's default order (common/common.h, `common_params_sampling::samplers`: ... top_k, ...,
top_p, ..., temperature, then the distribution sampler): top-k keeps the k largest logits; top-p keeps the smallest set
of the most likely tokens whose probabilities (a softmax of the logits left, before the temperature) sum to at least p;
the temperature divides what is left, and one token is drawn from its softmax. Temperature 0 is greedy: the largest
logit, the lowest id on a tie (numpy's argmax, as llama.cpp's greedy sampler keeps the first maximum).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
import numpy as np


@dataclass(frozen=True)
class SamplingParams:
  temperature: float = 0.0     # 0: greedy
  top_k: int = 0               # 0: off
  top_p: float = 1.0           # 1: off
  seed: int | None = None      # None: a fresh seed from the OS

  def __post_init__(self):
    t, k, p, s = self.temperature, self.top_k, self.top_p, self.seed
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
      raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {t!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
      raise ValueError(f"top_k must be an int >= 0 (0 keeps every token), got {k!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
      raise ValueError(f"top_p must be a number in (0, 1] (1 keeps every token), got {p!r}")
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0):
      raise ValueError(f"seed must be an int >= 0 or None, got {s!r}")

  @property
  def greedy(self) -> bool: return self.temperature == 0


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max())
  return e / e.sum()


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
  """The id of the next token from `logits` (vocab,)."""
  logits = np.asarray(logits)
  if params.greedy: return int(np.argmax(logits))
  ids = np.arange(logits.shape[0])
  x = logits.astype(np.float64)
  if not np.isfinite(x).any(): raise ValueError("sample: every logit is -inf or NaN")
  if params.top_k and params.top_k < x.shape[0]:
    keep = np.argpartition(-x, params.top_k - 1)[:params.top_k]
    ids, x = ids[keep], x[keep]
  if params.top_p < 1:
    order = np.argsort(-x, kind="stable")
    cum = np.cumsum(_softmax(x[order]))
    n = int(np.searchsorted(cum, params.top_p)) + 1          # the first prefix whose mass reaches p
    ids, x = ids[order[:n]], x[order[:n]]
  p = _softmax(x / params.temperature)
  return int(ids[rng.choice(len(p), p=p)])


__all__ = ["SamplingParams", "sample"]
