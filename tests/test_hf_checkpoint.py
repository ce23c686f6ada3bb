"""Models from Hugging Face checkpoint directories (tensor/models/hf.py), checked against transformers itself: the
fixtures (tests/fixtures/make_hf_fixtures.py) hold tiny random-weight LlamaForCausalLM (GQA, llama3 rope scaling,
pytorch_model.bin written by torch.save) and GPT2LMHeadModel (model.safetensors from save_pretrained) directories with
the logits transformers computed and the tokens its greedy generate() appended; tokenizers are checked against the
`tokenizers` package reading the same tokenizer.json."""
import json, os, shutil
import numpy as np
import pytest
from baregrad.tensor.models import load_model, ModelError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
TEXTS = ["The quick brown fox", "Numbers 12345 and 67, punctuation!? yes.", "Über café — 東京 😀 ok",
         "def f(x):\n    return x * 2\n", "  leading spaces and\ttabs", "hello world, hello again"]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_logits_match_transformers(name):
  ref = np.load(os.path.join(FIXTURES, name, "reference.npz"))
  m = load_model(os.path.join(FIXTURES, name))
  got = m.logits(ref["ids"].tolist())
  scale = np.abs(ref["logits"]).max()
  np.testing.assert_allclose(got / scale, ref["logits"] / scale, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_decode_matches_transformers(name):
  ref = np.load(os.path.join(FIXTURES, name, "reference.npz"))
  m = load_model(os.path.join(FIXTURES, name))
  tok = int(np.argmax(m.logits(ref["ids"].tolist())[-1]))
  out = [tok]
  for _ in range(len(ref["greedy"]) - 1):
    tok = int(np.argmax(m.step(tok)))
    out.append(tok)
  assert out == ref["greedy"].tolist()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_tokenizer_matches_tokenizers(name):
  tokenizers = pytest.importorskip("tokenizers")
  path = os.path.join(FIXTURES, name)
  theirs = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
  m = load_model(path)
  for text in TEXTS:
    ids = theirs.encode(text).ids
    assert m.tokenizer.encode(text, add_bos=False) == ids, text
    assert m.tokenizer.decode(ids) == text


def _copy(tmp_path, name):
  dst = tmp_path / name
  shutil.copytree(os.path.join(FIXTURES, name), dst)
  return dst


def _edit_config(d, **changes):
  cfg = json.loads((d / "config.json").read_text())
  cfg.update(changes)
  (d / "config.json").write_text(json.dumps(cfg))


def test_without_a_tokenizer_ids_still_work(tmp_path):
  d = _copy(tmp_path, "gpt2")
  os.remove(d / "tokenizer.json")
  ref = np.load(d / "reference.npz")
  m = load_model(d)
  assert m.tokenizer is None
  assert np.isfinite(m.logits(ref["ids"].tolist())).all()
  with pytest.raises(ModelError, match="no tokenizer"): list(m.generate("hello"))


@pytest.mark.parametrize("change,message", [
  (dict(model_type="bert"), r"model_type 'bert' is not supported"),
  (dict(n_embd="64"), r"'n_embd' must be int"),
  (dict(activation_function="relu"), r"activation_function 'relu'"),
])
def test_bad_config_is_named(tmp_path, change, message):
  d = _copy(tmp_path, "gpt2")
  _edit_config(d, **change)
  with pytest.raises(ModelError, match=message): load_model(d)


def test_unsupported_rope_scaling_is_named(tmp_path):
  d = _copy(tmp_path, "llama")
  _edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
  with pytest.raises(ModelError, match=r"rope_scaling type 'yarn' is not supported"): load_model(d)


def test_shard_index_cannot_leave_the_directory(tmp_path):
  d = _copy(tmp_path, "gpt2")
  os.remove(d / "model.safetensors")
  (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte.weight": "../../etc/passwd"}}))
  with pytest.raises(ModelError, match=r"is not a file name in the directory"): load_model(d)


def test_missing_weights_and_unknown_tensors(tmp_path):
  d = _copy(tmp_path, "gpt2")
  os.remove(d / "model.safetensors")
  with pytest.raises(ModelError, match=r"no weights"): load_model(d)
  from baregrad.tensor.safetensors import load_file, save_file
  d2 = _copy(tmp_path / "b", "gpt2")
  tensors = {k: v.numpy() for k, v in load_file(d2 / "model.safetensors").items()}
  tensors["h.0.attn.extra.weight"] = np.zeros(3, np.float32)
  save_file(tensors, d2 / "model.safetensors")
  with pytest.raises(ModelError, match=r"'h.0.attn.extra.weight' is not a GPT-2 weight"): load_model(d2)


@pytest.mark.parametrize("edit,message", [
  (lambda tj: tj["model"].__setitem__("vocab", ["a", "b"]), r"model.vocab must map token texts to integer ids"),
  (lambda tj: tj["model"]["merges"].insert(0, 7), r"merges entry '7' is neither"),
  (lambda tj: tj["model"]["vocab"].__setitem__("zz-new", 5000), r"holes"),
])
def test_malformed_tokenizer_json_is_named(tmp_path, edit, message):
  d = _copy(tmp_path, "gpt2")
  tj = json.loads((d / "tokenizer.json").read_text())
  edit(tj)
  (d / "tokenizer.json").write_text(json.dumps(tj))
  with pytest.raises(ModelError, match=message): load_model(d)
