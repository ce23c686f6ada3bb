"""nn.MultiheadAttention and nn.TransformerBlock against a numpy implementation of the same math with the same
weights (torch's definitions: packed in-projection, masks True = not allowed, pre-LN block with exact GELU), and
a few training steps of the character-level demo model."""
import math
import numpy as np
import pytest
from baregrad.tensor import Tensor, nn
from baregrad.hcq.device import Device

rng = np.random.default_rng(21)
TOL = 1e-4

# torch.nn.MultiheadAttention(...).state_dict() and TransformerEncoderLayer(...).state_dict() keys, in order
TORCH_MHA_KEYS = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
TORCH_LAYER_KEYS = ["self_attn." + k for k in TORCH_MHA_KEYS] + [
  "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight",
  "norm2.bias"]


# ---------------------------------------------------------------- numpy reference

def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_mha(q_in, k_in, v_in, sd, num_heads, add_mask=None):
  """Batch-first multi-head attention from a torch-layout state dict; add_mask broadcasts to (N, H, L, S)."""
  w, b = sd["in_proj_weight"], sd["in_proj_bias"]
  E = w.shape[1]
  D = E // num_heads
  q, k, v = (x @ w[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E] for i, x in enumerate((q_in, k_in, v_in)))
  heads = lambda t: t.reshape(t.shape[0], t.shape[1], num_heads, D).transpose(0, 2, 1, 3)
  q, k, v = heads(q), heads(k), heads(v)
  scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
  if add_mask is not None: scores = scores + add_mask
  p = np_softmax(scores)
  out = (p @ v).transpose(0, 2, 1, 3).reshape(q_in.shape[0], q_in.shape[1], E)
  return out @ sd["out_proj.weight"].T + sd["out_proj.bias"], p


def np_layer_norm(x, w, b, eps=1e-5):
  m = x.mean(-1, keepdims=True)
  return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_gelu(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def np_block(x, sd, num_heads):
  L = x.shape[1]
  causal = np.where(np.tril(np.ones((L, L), bool)), 0.0, -np.inf)
  h = np_layer_norm(x, sd["norm1.weight"], sd["norm1.bias"])
  attn = {k[len("self_attn."):]: v for k, v in sd.items() if k.startswith("self_attn.")}
  x = x + np_mha(h, h, h, attn, num_heads, causal)[0]
  h = np_layer_norm(x, sd["norm2.weight"], sd["norm2.bias"])
  return x + np_gelu(h @ sd["linear1.weight"].T + sd["linear1.bias"]) @ sd["linear2.weight"].T + sd["linear2.bias"]


def random_state(module, scale=0.3):
  """Random float32 values for every tensor of `module`, loaded into it (through the torch names)."""
  sd = {k: (rng.standard_normal(t.shape) * scale + (1.0 if k.endswith("norm1.weight") or k.endswith("norm2.weight")
                                                    else 0.0)).astype(np.float32)
        for k, t in module.state_dict().items()}
  module.load_state_dict(sd)
  return {k: v.astype(np.float64) for k, v in sd.items()}


def close(got, want): np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=TOL, atol=TOL)


# ---------------------------------------------------------------- MultiheadAttention

def test_mha_names_shapes_and_init_follow_torch():
  Tensor.manual_seed(0)
  mha = nn.MultiheadAttention(32, 4)
  sd = mha.state_dict()
  assert list(sd) == TORCH_MHA_KEYS
  assert [tuple(sd[k].shape) for k in TORCH_MHA_KEYS] == [(96, 32), (96,), (32, 32), (32,)]
  w = sd["in_proj_weight"].numpy()
  bound = math.sqrt(6 / (32 + 96))                 # xavier_uniform_ on (3E, E)
  assert np.abs(w).max() <= bound and w.std() == pytest.approx(bound / math.sqrt(3), rel=0.1)
  assert not sd["in_proj_bias"].numpy().any() and not sd["out_proj.bias"].numpy().any()
  assert list(nn.MultiheadAttention(8, 2, bias=False).state_dict()) == ["in_proj_weight", "out_proj.weight"]
  with pytest.raises(ValueError, match="multiple of num_heads"): nn.MultiheadAttention(10, 3)


def test_mha_self_attention_matches_numpy():
  mha = nn.MultiheadAttention(16, 4)
  sd = random_state(mha)
  x = rng.standard_normal((3, 5, 16)).astype(np.float32)
  xt = Tensor(x)
  out, weights = mha(xt, xt, xt)
  want, p = np_mha(x, x, x, sd, 4)
  close(out.numpy(), want)
  close(weights.numpy(), p.mean(1))                 # averaged over heads by default
  _, per_head = mha(xt, xt, xt, average_attn_weights=False)
  close(per_head.numpy(), p)
  out, none = mha(xt, need_weights=False)           # key and value default to the query
  assert none is None
  close(out.numpy(), want)


def test_mha_cross_attention_and_masks_match_numpy():
  mha = nn.MultiheadAttention(12, 3)
  sd = random_state(mha)
  q = rng.standard_normal((2, 4, 12)).astype(np.float32)
  kv = rng.standard_normal((2, 6, 12)).astype(np.float32)
  v = rng.standard_normal((2, 6, 12)).astype(np.float32)
  # a bool attn_mask is True where attention is NOT allowed; key_padding_mask likewise per key
  attn_mask = rng.uniform(size=(4, 6)) < 0.3
  attn_mask[:, 0] = False
  kpm = np.zeros((2, 6), bool)
  kpm[0, 4:] = True
  out, weights = mha(Tensor(q), Tensor(kv), Tensor(v), attn_mask=Tensor(attn_mask), key_padding_mask=Tensor(kpm))
  add = np.where(attn_mask, -np.inf, 0.0)[None, None] + np.where(kpm, -np.inf, 0.0)[:, None, None, :]
  want, p = np_mha(q, kv, v, sd, 3, add)
  close(out.numpy(), want)
  close(weights.numpy(), p.mean(1))
  # a float mask (per batch and head: (N * H, L, S)) is added
  fmask = rng.standard_normal((6, 4, 6)).astype(np.float32)
  out, _ = mha(Tensor(q), Tensor(kv), Tensor(v), attn_mask=Tensor(fmask))
  close(out.numpy(), np_mha(q, kv, v, sd, 3, fmask.reshape(2, 3, 4, 6))[0])
  # is_causal without a mask builds the causal mask (L == S here)
  out, _ = mha(Tensor(kv), Tensor(kv), Tensor(v), is_causal=True, key_padding_mask=Tensor(kpm))
  causal = np.where(np.tril(np.ones((6, 6), bool)), 0.0, -np.inf)
  close(out.numpy(), np_mha(kv, kv, v, sd, 3, causal + np.where(kpm, -np.inf, 0.0)[:, None, None, :])[0])


def test_mha_sequence_first_and_unbatched():
  mha = nn.MultiheadAttention(8, 2, batch_first=False)
  sd = random_state(mha)
  x = rng.standard_normal((5, 3, 8)).astype(np.float32)       # (L, N, E)
  out, weights = mha(Tensor(x), Tensor(x), Tensor(x))
  xb = x.transpose(1, 0, 2)
  want, p = np_mha(xb, xb, xb, sd, 2)
  close(out.numpy(), want.transpose(1, 0, 2))
  assert weights.shape == (3, 5, 5)
  out, weights = mha(Tensor(x[:, 0]), Tensor(x[:, 0]), Tensor(x[:, 0]))   # unbatched (L, E)
  close(out.numpy(), want[0])
  close(weights.numpy(), p[0].mean(0))
  with pytest.raises(ValueError, match="features in its last dim"): mha(Tensor(x[..., :4]))


# ---------------------------------------------------------------- TransformerBlock

def test_block_names_follow_torch_encoder_layer():
  block = nn.TransformerBlock(16, 2)
  assert list(block.state_dict()) == TORCH_LAYER_KEYS
  assert block.state_dict()["linear1.weight"].shape == (64, 16)


def test_block_matches_numpy():
  block = nn.TransformerBlock(16, 4, dim_feedforward=24)
  sd = random_state(block)
  x = rng.standard_normal((2, 7, 16)).astype(np.float32)
  close(block(Tensor(x)).numpy(), np_block(x.astype(np.float64), sd, 4))


def test_block_is_causal_and_trains():
  Tensor.manual_seed(4)
  block = nn.TransformerBlock(8, 2)
  x = rng.standard_normal((1, 6, 8)).astype(np.float32)
  y = x.copy()
  y[0, 4:] += 5.0                                   # change only the last two positions
  a, b = block(Tensor(x)).numpy(), block(Tensor(y)).numpy()
  close(a[0, :4], b[0, :4])
  assert np.abs(a[0, 4:] - b[0, 4:]).max() > 1e-2
  block(Tensor(x)).square().mean().backward()
  for name, p in block.named_parameters():
    g = p.grad.numpy()
    assert np.isfinite(g).all() and np.abs(g).max() > 0, name


# ---------------------------------------------------------------- the demo's character model

def test_demo_text_ships_with_the_package():
  from baregrad.tools import demo
  text = demo.load_text()
  assert 20_000 <= len(text.encode("utf-8")) <= 60_000
  assert text.startswith("Alice’s Adventures in Wonderland") and "CHAPTER III." in text
  vocab = demo.CharVocab(text)
  assert vocab.decode(vocab.encode(text[:500])) == text[:500]


def test_demo_model_training_reduces_the_loss():
  from baregrad.tools import demo
  text = demo.load_text()[:4000]
  model, vocab, _, _, losses, _, _ = demo.train_char(steps=20, batch=4, lr=1e-2, context=16, dim=16, heads=2,
                                                     layers=2, seed=1, text=text)
  assert losses[0] > 3.0                            # about ln(vocab) at the start
  assert np.mean(losses[-3:]) < losses[0] - 0.5, losses
  # the same 20 jitted steps as computed before the training-speed work on the CPU codegen (commit 7674381: matmul
  # tiles, threading, fusion of reductions into pads): kernels that compute in another order agree to float rounding
  before = [4.3105984, 4.1332641, 4.0331993, 3.8653240, 3.7088628, 3.7606976, 3.3839948, 3.3226333, 3.3427753,
            3.3406649, 3.3487549, 3.2068269, 3.1433024, 3.3105185, 3.0950029, 2.9148877, 3.3742154, 3.0719793,
            3.2545760, 2.9416568]
  if Device.default() == "CPU": np.testing.assert_allclose(losses, before, rtol=2e-5)
  assert all(np.isfinite(losses))
  with pytest.raises(ValueError, match="context"):
    model(Tensor(np.zeros((1, 17), np.int32)))
