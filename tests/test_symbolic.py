"""Symbolic shapes: a bound Variable (and arithmetic on it) as a size or an offset in shrink, pad, reshape, expand,
slicing, setitem, arange and full; kernels compiled once for every value; a jitted decode step with a KV cache
replayed for 32 positions with no compile after the second call. Values against numpy."""
import math
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.tensor.tensor import Variable
from baregrad.tensor.jit import jit
from baregrad.tensor.nn import Linear, LayerNorm, Embedding
from baregrad.compiler import codegen


def rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_bound_variable_sizes_and_offsets():
  v = Variable("p", 0, 6)
  a = rand(8, 5)
  x = Tensor(a).realize()
  compiled = None
  for k in range(5):
    p = v.bind(k)
    assert p.val == k and (p + 1).val == k + 1
    np.testing.assert_array_equal(x[p:p + 2].numpy(), a[k:k + 2])                       # a static size at a symbolic offset
    np.testing.assert_array_equal(x[p].numpy(), a[k])
    head = x.shrink(((0, p + 1), None))
    assert str(head.shape) == f"(p[={k}]+1, 5)"
    np.testing.assert_allclose(head.sum(0).numpy(), a[:k + 1].sum(0), rtol=1e-6, atol=1e-6)   # a symbolic reduce
    np.testing.assert_allclose((head * 2).numpy(), a[:k + 1] * 2)                           # a symbolic-shaped result
    np.testing.assert_allclose(head.reshape(-1).numpy(), a[:k + 1].reshape(-1))              # reshape keeps the symbol
    np.testing.assert_array_equal(Tensor.arange(p + 2).numpy(), np.arange(k + 2))
    np.testing.assert_array_equal(Tensor.full((2, p + 1), 3.0).numpy(), np.full((2, k + 1), 3.0))
    np.testing.assert_array_equal(Tensor.full((1, p + 3), -1.0).triu(p + 1).numpy(), np.triu(np.full((1, k + 3), -1.0), k + 1))
    np.testing.assert_allclose(x[1:3].pad(((0, 0), (p, 1))).numpy(), np.pad(a[1:3], ((0, 0), (k, 1))))
    np.testing.assert_allclose(Tensor(a[:1]).expand(p + 1, 5).numpy(), np.broadcast_to(a[:1], (k + 1, 5)))
    np.testing.assert_allclose((x[0] + p).numpy(), a[0] + k)                               # as a value
    cache = Tensor.zeros(8, 5).contiguous().realize()
    cache[p:p + 1] = Tensor(a[k:k + 1])                                                    # setitem at a symbolic offset
    want = np.zeros((8, 5), np.float32)
    want[k] = a[k]
    np.testing.assert_array_equal(cache.numpy(), want)
    if k == 1: compiled = codegen.stats["kernels_compiled"]
  assert codegen.stats["kernels_compiled"] == compiled, "other values compiled new kernels"


@pytest.mark.skipif(Tensor(1.0).device != "CPU", reason="CPU kernel opts")
def test_attention_over_symbolic_positions_in_vector_lanes():
  """One token's attention over positions 0..p of a cache, p a bound Variable: the scores q . k sum a head's 64 dims in
  vector lanes, the probabilities times V keep a head's dims as lanes and sum over the positions (the loops over p
  stay whole). Against numpy for several p."""
  v = Variable("p", 0, 15)
  qn, kn, vn = rand(4, 64), rand(16, 64, seed=1), rand(16, 64, seed=2)
  q, kc, vc = (Tensor(a).realize() for a in (qn, kn, vn))
  for k in (0, 6, 15):
    p = v.bind(k)
    scores = (q @ kc[:p + 1].T) * 0.125
    out = scores.softmax(-1) @ vc[:p + 1]
    opts = [o.op for it in out.schedule() if it.program is not None for o in it.program.meta.get("opts", ())]
    assert "REDUCE_LANES" in opts and "UPCAST" in opts, opts
    s = qn.astype(np.float64) @ kn[:k + 1].T * 0.125
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), (w / w.sum(-1, keepdims=True)) @ vn[:k + 1], rtol=1e-5, atol=1e-5)


def test_symbolic_errors():
  v = Variable("q", 0, 10)
  x = Tensor(rand(4, 3)).realize()
  with pytest.raises(ValueError, match="outside shape"): x[v.bind(3):v.bind(3) + 2]
  with pytest.raises(ValueError, match="outside its range"): v.bind(11)
  with pytest.raises(TypeError, match="int"): v.bind(1.5)
  with pytest.raises(ValueError, match="identifier"): Variable("not a name", 0, 1)
  with pytest.raises(ValueError, match="step 1"): x[v.bind(1):v.bind(1) + 2:2]


# ---------------------------------------------------------------- tinygrad's examples/gpt2.py, with baregrad's names
MAX_CONTEXT = 40


class Attention:
  def __init__(self, dim, n_heads):
    self.c_attn = Linear(dim, 3 * dim)
    self.c_proj = Linear(dim, dim)
    self.n_heads, self.dim, self.head_dim = n_heads, dim, dim // n_heads

  def __call__(self, x, start_pos, mask):
    if mask is not None or start_pos.val == 0: start_pos = start_pos.val      # prefill: no symbols
    xqkv = self.c_attn(x)
    xq, xk, xv = [xqkv.shrink((None, None, (i * self.dim, (i + 1) * self.dim))).reshape(None, None, self.n_heads, self.head_dim)
                  for i in range(3)]
    bsz, seqlen, _, _ = xq.shape
    if not hasattr(self, "cache_kv"):
      self.cache_kv = Tensor.zeros(2, bsz, MAX_CONTEXT, self.n_heads, self.head_dim, dtype=x.dtype).contiguous().realize()
    self.cache_kv.shrink((None, None, (start_pos, start_pos + seqlen), None, None)).assign(Tensor.stack(xk, xv)).realize()
    if not isinstance(start_pos, int) or start_pos > 0:
      keys = self.cache_kv[0].shrink((None, (0, start_pos + seqlen), None, None))
      values = self.cache_kv[1].shrink((None, (0, start_pos + seqlen), None, None))
    else: keys, values = xk, xv
    xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    return self.c_proj(xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2).reshape(bsz, seqlen, self.dim))


class FeedForward:
  def __init__(self, dim, hidden_dim):
    self.c_fc, self.c_proj = Linear(dim, hidden_dim), Linear(hidden_dim, dim)

  def __call__(self, x): return self.c_proj(self.c_fc(x).gelu())


class TransformerBlock:
  def __init__(self, dim, n_heads):
    self.attn, self.mlp = Attention(dim, n_heads), FeedForward(dim, 4 * dim)
    self.ln_1, self.ln_2 = LayerNorm(dim), LayerNorm(dim)

  def __call__(self, x, start_pos, mask):
    h = x + self.attn(self.ln_1(x), start_pos, mask).float()
    return (h + self.mlp(self.ln_2(h))).contiguous()


class Transformer:
  def __init__(self, dim, n_heads, n_layers, vocab_size):
    self.wte, self.wpe = Embedding(vocab_size, dim), Embedding(MAX_CONTEXT, dim)
    self.h = [TransformerBlock(dim, n_heads) for _ in range(n_layers)]
    self.ln_f, self.lm_head = LayerNorm(dim), Linear(dim, vocab_size, bias=False)
    self.forward_jit = jit(self.forward)

  def forward(self, tokens, start_pos):
    if not hasattr(self, "allpos"): self.allpos = Tensor.arange(0, MAX_CONTEXT).reshape(1, -1).realize()
    if not isinstance(tokens, Tensor):       # a bound Variable: one token, its row of the table
      seqlen = 1
      tok_emb = self.wte.weight.shrink(((tokens, tokens + 1), None))
    else:
      seqlen = tokens.shape[1]
      tok_emb = self.wte(tokens)
    pos_emb = self.wpe(self.allpos.shrink((None, (start_pos, start_pos + seqlen))))
    h = tok_emb + pos_emb
    mask = Tensor.full((1, 1, seqlen, start_pos.val + seqlen), float("-inf"), dtype=h.dtype).triu(start_pos.val + 1) \
      if seqlen > 1 else None
    for hi in self.h: h = hi(h, start_pos, mask)
    logits = self.lm_head(self.ln_f(h))
    return logits[:, -1, :].realize()


def _np_reference(model: Transformer):
  """The same model in numpy float64: a forward over all tokens so far (no cache) gives the last logits."""
  W = lambda t: t.numpy().astype(np.float64)
  erf = np.vectorize(math.erf)
  def ln(x, m): return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * W(m.weight) + W(m.bias)
  def lin(x, m): return x @ W(m.weight).T + (W(m.bias) if m.bias is not None else 0)
  def forward(tokens):
    T = len(tokens)
    h = W(model.wte.weight)[tokens] + W(model.wpe.weight)[:T]
    for blk in model.h:
      a = blk.attn
      qkv = lin(ln(h, blk.ln_1), a.c_attn)
      q, k, v = (qkv[:, i * a.dim:(i + 1) * a.dim].reshape(T, a.n_heads, a.head_dim).transpose(1, 0, 2) for i in range(3))
      s = q @ k.transpose(0, 2, 1) / math.sqrt(a.head_dim) + np.triu(np.full((T, T), -np.inf), 1)
      p = np.exp(s - s.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      h = h + lin((p @ v).transpose(1, 0, 2).reshape(T, a.dim), a.c_proj)
      f = lin(ln(h, blk.ln_2), blk.mlp.c_fc)
      h = h + lin(0.5 * f * (1 + erf(f / math.sqrt(2))), blk.mlp.c_proj)
    return lin(ln(h, model.ln_f), model.lm_head)[-1]
  return forward


def test_gpt2_pattern_jitted_decode():
  """tinygrad's GPT-2 decode: prefill three tokens, then 32 jitted steps with a Variable start_pos (and the token as
  a Variable); logits against numpy to 1e-4 of their scale; nothing compiled after the second jitted step."""
  Tensor.manual_seed(3)
  model = Transformer(dim=32, n_heads=4, n_layers=2, vocab_size=50)
  ref = _np_reference(model)
  tokens = [3, 7, 11]
  logits = model.forward(Tensor([tokens]), Variable("start_pos", 0, MAX_CONTEXT).bind(0)).numpy()[0]
  want = ref(tokens)
  np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4 * np.abs(want).max())
  start_pos = Variable("start_pos", 1, MAX_CONTEXT)
  tok_var = Variable("tokens", 0, 49)
  compiled = None
  for step in range(32):
    tok = int(np.argmax(logits)) if step % 3 else (step * 7) % 50     # greedy, and some forced tokens
    tokens.append(tok)
    logits = model.forward_jit(tok_var.bind(tok), start_pos.bind(len(tokens) - 1)).numpy()[0]
    want = ref(tokens)
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=f"step {step}")
    if step == 1: compiled = codegen.stats["kernels_compiled"]
  assert model.forward_jit.graph is not None
  assert codegen.stats["kernels_compiled"] == compiled, "a decode step after the second compiled kernels"


def test_jit_replay_checks_symbolic_views():
  """A view [p, p + 3) of 8 rows is inside for p <= 5 only: a replay with p = 6 is refused (it would read past the
  tensor), before anything runs."""
  x = Tensor(rand(8, 2)).realize()
  v = Variable("p", 0, 7)
  f = jit(lambda p: x[p:p + 3].sum(0) + 0)
  for k in (0, 2, 5):
    np.testing.assert_allclose(f(v.bind(k)).numpy(), x.numpy()[k:k + 3].sum(0), rtol=1e-6)
  from baregrad.tensor.jit import JitError
  with pytest.raises(JitError, match=r"\[6, 9\)"): f(v.bind(6))


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_symbolic_sizes_on_emulated_gpus(emulated_gpus, device):
  """Symbolic loops on a GPU: the launch covers the largest size, the threads past this value's end do nothing."""
  v = Variable("p", 0, 6)
  a = rand(8, 4)
  x = Tensor(a, device=device).realize()
  f = jit(lambda p: (x[0:p + 1] * 2).sum(0) + 0)
  for k in range(4):
    p = v.bind(k)
    np.testing.assert_allclose(x[0:p + 1].sum(0).numpy(), a[:k + 1].sum(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose((x[p:p + 2] * 2).numpy(), a[k:k + 2] * 2)
    np.testing.assert_allclose(f(p).numpy(), a[:k + 1].sum(0) * 2, rtol=1e-6, atol=1e-6)
    cache = Tensor.zeros(8, 4, device=device).contiguous().realize()
    cache[p:p + 1] = Tensor(a[k:k + 1], device=device)
    want = np.zeros((8, 4), np.float32)
    want[k] = a[k]
    np.testing.assert_array_equal(cache.numpy(), want)


@pytest.mark.parametrize("device", ["AMD", "NV"])
def test_symbolic_launch_dimensions_patched_on_emulated_gpus(emulated_gpus, device):
  """A kernel whose global size depends on a Variable launches the workgroups this value needs, eagerly and in a JIT
  replay (hcq patches the prebuilt queue's launch): a short prefix runs a fraction of the threads a long one runs
  (the emulators' executed thread-instructions), and every value is right (numpy)."""
  from baregrad.drivers.emu import counters
  from baregrad.hcq.device import Device
  v = Variable("p", 0, 4095)
  a = rand(4096)
  x = Tensor(a, device=device).realize()
  f = jit(lambda p: (x[0:p + 1] * 2 + 1).contiguous())
  dev = Device.get(device)
  def instrs(k: int, fn) -> int:
    dev.synchronize(); counters.reset()
    out = fn(v.bind(k)).numpy()
    np.testing.assert_allclose(out, a[:k + 1] * 2 + 1, rtol=1e-5, atol=1e-6)
    return sum(counters.total().instrs)
  for fn in (lambda p: (x[0:p + 1] * 3 + 1 - x[0:p + 1]).contiguous(), f):   # eager, then jitted
    for k in (4000, 3, 700):      # the JIT: warm-up, capture, then replays
      instrs(k, fn)
    short, long = instrs(40, fn), instrs(4000, fn)
    assert short * 8 < long, (short, long)
    assert instrs(700, fn) * 3 < long


def test_symbolic_launch_dimensions_patched_in_a_graph_of_two_gpus(emulated_gpus):
  """A JIT graph over two devices (hcq/multigraph.py) patches symbolic launch dimensions as the one-device graph
  does: a short prefix on EMU AMD and EMU NV runs a fraction of the threads of a long one (it launched the largest
  grid, masked, before)."""
  from baregrad.drivers.emu import counters
  from baregrad.hcq.device import Device
  from baregrad.hcq.multigraph import MultiGraphExecutor
  v = Variable("p", 0, 4095)
  a, b = rand(4096), rand(4096, seed=1)
  x, y = Tensor(a, device="AMD").realize(), Tensor(b, device="NV").realize()
  f = jit(lambda p: ((x[0:p + 1] * 2 + 1).contiguous(), (y[0:p + 1] * 3 - 1).contiguous()))
  def instrs(k: int) -> int:
    for d in ("AMD", "NV"): Device.get(d).synchronize()
    counters.reset()
    ox, oy = f(v.bind(k))
    np.testing.assert_allclose(ox.numpy(), a[:k + 1] * 2 + 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(oy.numpy(), b[:k + 1] * 3 - 1, rtol=1e-5, atol=1e-6)
    return sum(counters.total().instrs)
  for k in (4000, 3, 700): instrs(k)
  assert isinstance(f.graph, MultiGraphExecutor)
  short, long = instrs(40), instrs(4000)
  assert short * 8 < long, (short, long)


def test_symbolic_matmul_with_broadcast_rows():
  """A product over a symbolic number of keys with several query rows (attention scores in a batched decode): the
  CPU's matmul packing leaves symbolic sizes alone."""
  q, k = rand(4, 8), rand(16, 8, seed=1)
  tq, tk = Tensor(q).realize(), Tensor(k).realize()
  for n in (5, 9):
    p = Variable("p", 1, 16).bind(n)
    np.testing.assert_allclose((tq @ tk[:p].T).numpy(), q @ k[:n].T, rtol=1e-5, atol=1e-5)


def test_beam_leaves_symbolic_loops_to_the_heuristic(monkeypatch):
  """BEAM=2 on a kernel with a loop of symbolic size: the heuristic's choice (a search cannot time every value)."""
  from baregrad.compiler import codegen
  monkeypatch.setattr(codegen, "BEAM", 2)
  codegen.clear_programs()
  a = rand(8, 5)
  x = Tensor(a).realize()
  p = Variable("p", 0, 7).bind(3)
  np.testing.assert_allclose(x[:p + 1].sum(0).numpy(), a[:4].sum(0), rtol=1e-6, atol=1e-6)
  codegen.clear_programs()


def test_compiled_size_expressions_match_python_arithmetic():
  """shape.evaluator (what launches resolve their grids with) against the same formulas in Python, C's truncating
  division for negative values included."""
  import math
  from baregrad.compiler.shape import evaluator, unbind
  from baregrad.tensor.tensor import Variable as TensorVariable
  u = unbind(TensorVariable("p", -60, 5000).uop)
  trunc = lambda a, b: int(math.copysign(abs(a) // abs(b), a * b)) if a * b else 0
  for p in list(range(-60, 70)) + [4095, 5000]:
    assert evaluator(((u + 1) * 32 + 255) // 256)({"p": p}) == trunc((p + 1) * 32 + 255, 256)
    assert evaluator((u * -3 + 7) // 5)({"p": p}) == trunc(p * -3 + 7, 5)
  assert evaluator(7)({}) == 7
