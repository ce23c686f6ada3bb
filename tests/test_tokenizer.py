"""tensor/tokenizer.py against HF `tokenizers` (a test extra) built from the very same vocabulary and merges.

The vocabularies are trained here, in a few ms, by tokenizers.trainers.BpeTrainer on text made from the fixed strings
below (English, code, numbers, accented Latin, Greek, Cyrillic, CJK, emoji, whitespace runs, CR/LF, contractions),
then written out as GGUF tokenizer metadata the way llama.cpp's converter does. The HF references are set up as HF
itself converts such models: for gpt2-style vocabularies BPE(vocab, merges) behind the ByteLevel (or Split + ByteLevel)
pre-tokenizer; for SentencePiece-style ones transformers' LlamaConverter (legacy): BPE(byte_fallback=True,
fuse_unk=True) with merges derived from the scores (`hf_merges_from_scores`), normalizers Prepend("▁") + Replace(" ",
"▁"), decoders Replace + ByteFallback + Fuse + Strip.
"""
import json, random
import numpy as np
import pytest
from baregrad.tensor.tokenizer import (Tokenizer, TokenizerError, StreamDecoder, pre_tokenize, NORMAL, UNKNOWN, CONTROL,
                                       USER_DEFINED, BYTE, SPACE_MARK)

FRAGMENTS = [
  "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine; we've done what we'd planned.",
  "DON'T SHOUT, YOU'RE LOUD! I'M HERE.", "def main(argv):\n    for i in range(10):\n        print(f\"{i:03d}\")\n",
  "    return {'key': [1, 2, 3], \"x\": None}  # comment\n", "if (a <= b && c != d) { x += y >> 2; }",
  "Numbers: 12345678, 3.14159, 2024-06-01, 1,000,000 and 0x1F; 42 is the answer.",
  "Café naïve résumé über straße façade coöperate Ångström.", "Ελληνικά γράμματα: καλημέρα κόσμε.",
  "Кириллица: привет мир, как дела?", "中文字符测试，日本語のテキスト、한국어 텍스트。",
  "Emoji: 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷", "Tabs\tand  double  spaces,   triple   spaces.",
  "\n\nnew paragraph\r\nwindows line\r\n", "  leading and trailing  ", "hello world hello world hello there",
]
TRAINING_TEXT = [f for _ in range(6) for f in FRAGMENTS]      # ~5 KB

# texts to compare on: the fragments, variants of them, and edge cases (many hold characters never trained on)
EDGE = ["", " ", "  ", "   ", "\n", "\n\n", "\r\n", " \n ", "\t", "a", "A", "12345678", "1234567890123", "00 000 0000",
        "I'm", "DON'T", "you're", "we'LL", "'s", "''", "it's'", "x'sy", "'ſx", "hello", " hello", "hello ",
        "  hello  world  ", "hello\n\n\nworld", "a\r\nb\rc\nd", "snow ☃ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ŉ ǅ ǈ",
        "\u00a0non\u00a0breaking",
        "em\u2003space", "zero\u200bwidth", "\x1cunit\x1fsep", "\u3000ideographic", "tab\t\tx", "...!!!???", "¡¿«»",
        "$100 + 5% = <x> ^ ~ |y|", "½ ² Ⅻ ١٢٣", "😀", "😀😀😀", "👍🏽", "🇯🇵🇫🇷", "中", "中文", "ﬁﬂ ligatures", "naïve",
        "x" * 50, " " * 17 + "x", "a" + " " * 9, "\n" * 5 + "end", "<0x41>", "▁already▁escaped", "line\u2028sep"]


def _texts() -> list[str]:
  out = list(FRAGMENTS) + EDGE
  for f in FRAGMENTS:
    out += [" " + f, f + " ", f.upper(), f.lower(), "  " + f + "\n", f.replace(" ", "  "), f[: len(f) // 2],
            f[len(f) // 3:], f.replace(" ", "\n"), f + f]
  rng = random.Random(1234)
  alphabet = list("abcXYZ éßΩжд中文😀1234  \t\n\r'.,!?-_()$<>ſ\xa0\u2003") + ["'s", "'T", "\r\n", "12345", "hello"]
  out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 25))) for _ in range(120)]
  return out


TEXTS = _texts()                                               # ~420 strings

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN_NO_WS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


@pytest.fixture(scope="module")
def hf():
  return pytest.importorskip("tokenizers")


def hf_pre_tokenizer(hf, pre: str):
  pt, Regex = hf.pre_tokenizers, hf.Regex
  if pre == "gpt-2": return pt.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre == "llama-bpe":
    return pt.Sequence([pt.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])
  assert pre == "default"     # llama.cpp's four regexes for LLAMA_VOCAB_PRE_TYPE_DEFAULT, in order
  return pt.Sequence([pt.Split(Regex(r"[\p{P}\$\+<=>\^~\|]+"), "isolated"),
                      pt.Split(Regex(GPT2_PATTERN_NO_WS), "isolated"), pt.Split(Regex(r"\p{N}+"), "isolated"),
                      pt.Split(Regex(r"[0-9][0-9][0-9]"), "isolated"),
                      pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def _trained(hf, pre_tokenizer, special: list[str], vocab_size: int, **kw) -> tuple[dict, list]:
  tok = hf.Tokenizer(hf.models.BPE())
  tok.pre_tokenizer = pre_tokenizer
  trainer = hf.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False, **kw)
  tok.train_from_iterator(TRAINING_TEXT, trainer)
  model = json.loads(tok.to_str())["model"]
  return model["vocab"], [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]


# -- gpt2-style (byte-level) vocabularies ------------------------------------------------------------------------------

class ByteLevelCase:
  """A trained byte-level vocabulary as GGUF metadata, with the HF tokenizer that is its reference."""

  def __init__(self, hf, pre: str, control: list[str], user: list[str], ids: dict):
    vocab, merges = _trained(hf, hf_pre_tokenizer(hf, pre), control + user, 700,
                             initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet())
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    types = [CONTROL if t in control else USER_DEFINED if t in user else NORMAL for t in tokens]
    self.md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
               "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
               **{f"tokenizer.ggml.{k}": v for k, v in ids.items()}}
    ref = hf.Tokenizer(hf.models.BPE(vocab, merges, ignore_merges=pre == "llama-bpe"))
    ref.pre_tokenizer = hf_pre_tokenizer(hf, pre)
    ref.decoder = hf.decoders.ByteLevel()
    ref.add_special_tokens([hf.AddedToken(t, special=True, normalized=False) for t in control])
    ref.add_tokens([hf.AddedToken(t, special=False, normalized=False) for t in user])
    self.ref, self.tok = ref, Tokenizer.from_gguf_metadata(self.md)


@pytest.fixture(scope="module")
def gpt2(hf):
  return ByteLevelCase(hf, "gpt-2", ["<|endoftext|>"], ["<|user|>"], {"bos_token_id": 0, "eos_token_id": 0})


@pytest.fixture(scope="module")
def llama3(hf):
  return ByteLevelCase(hf, "llama-bpe", ["<|begin_of_text|>", "<|eot_id|>"], [],
                       {"bos_token_id": 0, "eos_token_id": 1})


@pytest.fixture(scope="module")
def default_pre(hf):
  return ByteLevelCase(hf, "default", ["<|endoftext|>"], [], {"eos_token_id": 0})


# -- SentencePiece-style vocabularies ----------------------------------------------------------------------------------

def hf_merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
  """The merges transformers' converter gives a sentencepiece BPE vocabulary (convert_slow_tokenizer.py,
  generate_merges): every split of a token into two tokens; ordered by the token's score, highest first, then by the
  length of the left part, then of the right part, longest first; ties keep (left id, right id) order."""
  ids = {t: i for i, t in enumerate(tokens)}
  found = []
  for t, score in zip(tokens, scores):
    splits = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    found += sorted(((score, a, b) for a, b in splits), key=lambda s: (ids[s[1]], ids[s[2]]))
  found.sort(key=lambda s: (-s[0], -len(s[1]), -len(s[2])))
  return [(a, b) for _, a, b in found]


class SpmCase:
  """A sentencepiece-like vocabulary: <unk> <s> </s>, the 256 byte tokens (unless byte_tokens=False), then pieces
  trained by BpeTrainer on "▁"-prefixed words; a piece's score is minus the index of the merge that made it (single
  characters below all merges), as sentencepiece orders a BPE model's pieces."""

  def __init__(self, hf, byte_tokens: bool = True, user: tuple = ("<tool>",), vocab_size: int = 600):
    pt = hf.pre_tokenizers
    vocab, merges = _trained(hf, pt.Metaspace(replacement=SPACE_MARK, prepend_scheme="always", split=True), [],
                             vocab_size)
    merged = {a + b: rank for rank, (a, b) in enumerate(merges)}
    trained = sorted(vocab, key=vocab.get)
    chars = [t for t in trained if t not in merged]
    tokens = ["<unk>", "<s>", "</s>"] + ([f"<0x{b:02X}>" for b in range(256)] if byte_tokens else [])
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * (len(tokens) - 3)
    scores = [0.0] * len(tokens)
    for t in trained:
      tokens.append(t)
      types.append(NORMAL)
      scores.append(-float(merged[t]) if t in merged else -float(len(merges) + chars.index(t)))
    for t in user:
      tokens.append(t)
      types.append(USER_DEFINED)
      scores.append(0.0)
    self.md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
               "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
               "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True,
               "tokenizer.ggml.add_eos_token": False}
    ids = {t: i for i, t in enumerate(tokens)}
    ref = hf.Tokenizer(hf.models.BPE(ids, hf_merges_from_scores(tokens, scores), unk_token="<unk>", fuse_unk=True,
                                     byte_fallback=True))
    n, d = hf.normalizers, hf.decoders
    ref.normalizer = n.Sequence([n.Prepend(SPACE_MARK), n.Replace(" ", SPACE_MARK)])
    ref.decoder = d.Sequence([d.Replace(SPACE_MARK, " "), d.ByteFallback(), d.Fuse(),
                              d.Strip(content=" ", left=1, right=0)])
    ref.add_special_tokens([hf.AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    ref.add_tokens([hf.AddedToken(t, special=False, normalized=False) for t in user])
    self.ref, self.tok = ref, Tokenizer.from_gguf_metadata(self.md)


@pytest.fixture(scope="module")
def spm(hf):
  return SpmCase(hf)


CASES = ["gpt2", "llama3", "default_pre", "spm"]


def round_trip(case: str, text: str) -> str:
  """What decode(encode(text)) gives: the text itself, but a SentencePiece vocabulary reads a "▁" in the input as
  the space it stands for (sentencepiece and HF alike)."""
  return text.replace(SPACE_MARK, " ") if case == "spm" else text


# -- the pre-tokenizer scanners against the regexes --------------------------------------------------------------------

@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "default"])
def test_pre_tokenize_matches_hf_regex(hf, pre):
  ref = hf_pre_tokenizer(hf, pre)
  rng = random.Random(7)
  # classes the patterns tell apart: letters, digits (Nd/No/Nl), \s (White_Space, not U+001C..1F), CR/LF, apostrophes
  alphabet = list("aZéΩж中1١²Ⅻ \t\n\r\x0b\x1c\xa0\u2003\u200b\x85\u3000'sStTrReEvVmMlLdDſ.,-$+<=>^~|_😀")
  alphabet += ["\r\n", "  ", "'s", "'LL", "'Re", "123", "12345", " 1", " .", " a"]
  texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16))) for _ in range(3000)]
  for text in texts:
    want = [text[a:b] for _, (a, b) in ref.pre_tokenize_str(text)]
    assert pre_tokenize(text, pre) == want, f"{pre}: {text!r}"


def test_pre_tokenize_examples():
  # worked by hand from the patterns: a run of spaces gives its last one to the next word; LLaMA 3 keeps digits in
  # threes (so a space before digits stands alone), lets a tab lead a word and ends a newline run at its last break
  assert pre_tokenize("a   b  12345\n\n  c", "gpt-2") == ["a", "  ", " b", " ", " 12345", "\n\n ", " c"]
  assert pre_tokenize("a   b  12345\n\n  c", "llama-bpe") == ["a", "  ", " b", " ", " ", "123", "45", "\n\n", " ", " c"]
  assert pre_tokenize("I'M\tok'Ll", "llama-bpe") == ["I", "'M", "\tok", "'Ll"]
  assert pre_tokenize("I'M\tok'Ll", "gpt-2") == ["I", "'", "M", "\t", "ok", "'", "Ll"]
  with pytest.raises(TokenizerError, match="tokenizer.ggml.pre"): pre_tokenize("x", "no-such")


# -- encode / decode against HF ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_encode_matches_hf(case, request):
  c = request.getfixturevalue(case)
  for text in TEXTS:
    assert c.tok.encode(text, add_bos=False) == c.ref.encode(text, add_special_tokens=False).ids, repr(text)


@pytest.mark.parametrize("case", CASES)
def test_decode_round_trip_matches_hf(case, request):
  c = request.getfixturevalue(case)
  for text in TEXTS:
    ids = c.ref.encode(text, add_special_tokens=False).ids
    assert c.tok.decode(ids) == c.ref.decode(ids, skip_special_tokens=True) == round_trip(case, text), repr(text)


@pytest.mark.parametrize("case", CASES)
def test_stream_decoder_equals_decode(case, request):
  c = request.getfixturevalue(case)
  for text in TEXTS[:150]:
    ids = c.tok.encode(text)
    stream = c.tok.stream_decoder()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == c.tok.decode(ids) == round_trip(case, text)
  # a character cut over tokens comes out only once complete: "𝔘" (never trained on) is four byte tokens
  if case == "spm":
    ids = c.tok.encode("𝔘", add_bos=False)
    assert len(ids) == 5      # "▁" then the byte tokens F0 9D 94 98
    stream = c.tok.stream_decoder()
    assert [stream.push(i) for i in ids] == ["", "", "", "", "𝔘"] and stream.flush() == ""


def test_bos_eos(spm, gpt2, llama3):
  s = spm.tok
  assert (s.bos_id, s.eos_id, s.unk_id, s.vocab_size) == (1, 2, 0, len(spm.md["tokenizer.ggml.tokens"]))
  assert s.encode("") == [1] and s.encode("", add_bos=False) == []
  body = s.encode("hello world", add_bos=False)
  assert s.encode("hello world") == [1] + body and s.encode("hello world", add_eos=True) == [1] + body + [2]
  assert s.decode([1] + body + [2]) == "hello world"
  assert s.decode([1] + body + [2], special=True) == "<s> hello world</s>"      # after <s>, the "▁" stays a space
  assert s.is_eog(2) and not s.is_eog(1)
  # gpt-2: no BOS unless asked; LLaMA 3's pre-tokenizer makes llama.cpp add one by default
  assert gpt2.tok.encode("hi") == gpt2.ref.encode("hi").ids and not gpt2.tok.add_bos
  assert llama3.tok.encode("hi") == [0] + llama3.ref.encode("hi").ids
  assert llama3.tok.is_eog(llama3.tok.token_id("<|eot_id|>"))


@pytest.mark.parametrize("case", CASES)
def test_parse_special(case, request, hf):
  c = request.getfixturevalue(case)
  control = [t for t, k in zip(c.tok.tokens, c.tok.token_types) if k == CONTROL]
  user = [t for t, k in zip(c.tok.tokens, c.tok.token_types) if k == USER_DEFINED]
  texts = [f"{control[-1]}Hello{control[0]} world", f"a{control[0]}{control[0]}b ", f"{control[0]}",
           f" {control[-1]} x"]
  texts += [f"x{u}y {u}" for u in user] + [f"<{control[0]}>", control[0][:-1]]
  for text in texts:
    c.ref.encode_special_tokens = False                       # HF: added special tokens are matched in the text
    want = c.ref.encode(text, add_special_tokens=False).ids
    got = c.tok.encode(text, add_bos=False, parse_special=True)
    assert got == want, repr(text)
    assert all(c.tok.token_id(t) in got for t in control if t in text)
    c.ref.encode_special_tokens = True             # ... or taken as plain text, user-defined ones still split
    assert c.tok.encode(text, add_bos=False) == c.ref.encode(text, add_special_tokens=False).ids, repr(text)
  c.ref.encode_special_tokens = False
  assert c.tok.decode(c.tok.encode(texts[0], add_bos=False, parse_special=True), special=True) == \
    c.ref.decode(c.ref.encode(texts[0], add_special_tokens=False).ids, skip_special_tokens=False)


def test_spm_byte_fallback(spm):
  tok = spm.tok
  ids = tok.encode("☃", add_bos=False)
  byte_ids = [tok.token_id(f"<0x{b:02X}>") for b in "☃".encode()]
  assert ids == [tok.token_id(SPACE_MARK)] + byte_ids
  assert [tok.decode_token(i) for i in ids] == [b" ", b"\xe2", b"\x98", b"\x83"]
  assert tok.decode(ids) == "☃"


def test_spm_unknown_without_byte_tokens(hf):
  c = SpmCase(hf, byte_tokens=False)
  for text in ["snow ☃☃ man", "☃", "a ☃ 𝔘𝔫 b", "中文😀", "ok"]:
    ids = c.tok.encode(text, add_bos=False)
    assert ids == c.ref.encode(text, add_special_tokens=False).ids, repr(text)
  assert c.tok.encode("☃☃", add_bos=False).count(0) == 1           # consecutive unknowns fuse, as fuse_unk=True
  ids = c.tok.encode("a☃b", add_bos=False)
  assert c.tok.decode(ids) == "ab" and c.tok.decode(ids, special=True) == "a<unk>b" == c.ref.decode(ids, False)
  # no byte tokens and no unknown token: nothing can stand for the character
  with pytest.raises(TokenizerError, match="U\\+2603"): Tokenizer("llama", ["a"], [NORMAL]).encode("☃")


def test_spm_without_space_prefix(spm, hf):
  tok = Tokenizer.from_gguf_metadata({**spm.md, "tokenizer.ggml.add_space_prefix": False})
  ref = hf.Tokenizer.from_str(spm.ref.to_str())
  ref.normalizer = hf.normalizers.Replace(" ", SPACE_MARK)
  ref.decoder = hf.decoders.Sequence([hf.decoders.Replace(SPACE_MARK, " "), hf.decoders.ByteFallback(),
                                      hf.decoders.Fuse()])
  for text in TEXTS[:100]:
    ids = tok.encode(text, add_bos=False)
    assert ids == ref.encode(text, add_special_tokens=False).ids, repr(text)
    assert tok.decode(ids) == round_trip("spm", text)


def test_ignore_merges(hf):
  # "abc" is a token no merge makes: LLaMA 3's pre-tokenizer takes a whole word that is a token as it is
  tokens, merges = ["a", "b", "c", "ab", "abc"], ["a b"]
  for pre, ignore in (("gpt-2", False), ("llama-bpe", True)):
    tok = Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
                                        "tokenizer.ggml.add_bos_token": False})
    ref = hf.Tokenizer(hf.models.BPE({t: i for i, t in enumerate(tokens)}, [("a", "b")], ignore_merges=ignore))
    ref.pre_tokenizer = hf_pre_tokenizer(hf, pre)
    assert tok.encode("abc") == ref.encode("abc").ids == ([4] if ignore else [3, 2])


def test_spm_merge_order_by_score():
  # hand-made: "▁abc" starts as ▁ a b c; "▁a" scores highest and merges first, then "▁ab" (made from "▁a" + "b")
  # competes with "bc": whichever scores higher takes the "b"
  tokens = ["<unk>", "<s>", "</s>", SPACE_MARK, "a", "b", "c", SPACE_MARK + "a", "ab", "bc", SPACE_MARK + "ab"]
  for scores, want in (([0, 0, 0, -9, -9, -9, -9, -1, -2, -3, -4], [SPACE_MARK + "a", "bc"]),
                       ([0, 0, 0, -9, -9, -9, -9, -1, -4, -3, -2], [SPACE_MARK + "ab", "c"])):
    tok = Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                        "tokenizer.ggml.scores": scores})
    assert [tok.tokens[i] for i in tok.encode("abc", add_bos=False)] == want
  # equal scores: the leftmost pair first
  tok = Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens[:7] + ["aa"]})
  assert [tok.tokens[i] for i in tok.encode("aaa", add_bos=False)] == [SPACE_MARK, "aa", "a"]


def test_decode_invalid_utf8(gpt2, spm, hf):
  # byte-level: each byte is one character of GPT-2's table; HF's ByteLevel decoder replaces maximal invalid
  # subsequences (Rust from_utf8_lossy), as Python's "replace" does
  alphabet = hf.pre_tokenizers.ByteLevel.alphabet()          # the 256 one-byte tokens, trained in every vocabulary
  single = {gpt2.tok.decode_token(gpt2.tok.token_id(ch))[0]: gpt2.tok.token_id(ch) for ch in alphabet}
  assert sorted(single) == list(range(256))
  for data in (b"\xe4\xb8", b"\xff", b"a\xe4\xb8b", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xc0\xaf",
               b"\x80abc\xe4\xb8\xad"):
    ids = [single[b] for b in data]
    assert gpt2.tok.decode(ids) == gpt2.ref.decode(ids) == data.decode("utf-8", "replace")
    stream = gpt2.tok.stream_decoder()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == data.decode("utf-8", "replace")
  # byte tokens: a stray byte is one U+FFFD in HF's ByteFallback too; a cut character differs (module docstring)
  byte = lambda b: spm.tok.token_id(f"<0x{b:02X}>")
  for data in (b"\xff", b"\x80", b"\xe4\xb8\xad"):
    ids = [byte(b) for b in data]
    assert spm.tok.decode(ids) == spm.ref.decode(ids) == data.decode("utf-8", "replace")
  ids = [byte(0xE4), byte(0xB8), spm.tok.token_id("a")]
  assert spm.tok.decode(ids) == "\ufffda" and spm.ref.decode(ids) == "\ufffd\ufffda"
  with pytest.raises(TokenizerError, match="outside the vocabulary"): spm.tok.decode([spm.tok.vocab_size])
  with pytest.raises(TokenizerError, match="integers"): spm.tok.decode(["a"])


def test_lone_surrogate_is_refused(spm, gpt2):
  for tok in (spm.tok, gpt2.tok):
    with pytest.raises(TokenizerError, match="U\\+D800"): tok.encode("a\ud800b")


def test_through_a_gguf_file(tmp_path, spm, gpt2):
  # key names and value types as gguf-py writes them, read back by baregrad's own reader
  gguf = pytest.importorskip("gguf")
  from baregrad.tensor.gguf import GGUFFile
  for case, name in ((spm, "spm"), (gpt2, "gpt2")):
    md, path = case.md, tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in md: w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.scores" in md: w.add_token_scores(md["tokenizer.ggml.scores"])
    if "tokenizer.ggml.merges" in md: w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    w.add_add_bos_token(name == "spm")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f: tok = Tokenizer.from_gguf_metadata(f.metadata)
    assert tok.add_bos == (name == "spm")
    for text in TEXTS[:60]: assert tok.encode(text) == case.tok.encode(text)


def test_speed_smoke(spm, llama3):
  # not a timing assertion (the benchmark tool measures speed): a few KB encode and decode back in one call each
  text = "\n".join(FRAGMENTS) * 4
  for c in (spm, llama3):
    assert c.tok.decode(c.tok.encode(text, add_bos=False)) == text


# -- malformed metadata ------------------------------------------------------------------------------------------------

GOOD_GPT2 = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
             "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": [1, 1, 1]}
GOOD_LLAMA = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "<0x41>"],
              "tokenizer.ggml.scores": [0.0] * 5, "tokenizer.ggml.token_type": [2, 3, 3, 1, 6]}

BAD = [
  (GOOD_GPT2, {"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens: missing"),
  (GOOD_GPT2, {"tokenizer.ggml.tokens": "ab"}, "tokenizer.ggml.tokens: must be an array"),
  (GOOD_GPT2, {"tokenizer.ggml.tokens": ["a", 7, "ab"]}, r"tokenizer.ggml.tokens\[1\]: must be a string"),
  (GOOD_GPT2, {"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens: the vocabulary is empty"),
  (GOOD_GPT2, {"tokenizer.ggml.tokens": ["a", "b", "a"]}, r"tokenizer.ggml.tokens\[2\]: token 'a' is already token 0"),
  (GOOD_GPT2, {"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges: missing"),
  (GOOD_GPT2, {"tokenizer.ggml.merges": ["a c"]}, r"tokenizer.ggml.merges\[0\]: 'a c' names 'c'"),
  (GOOD_GPT2, {"tokenizer.ggml.merges": ["b a"]}, r"tokenizer.ggml.merges\[0\]: 'b a' names 'ba'"),
  (GOOD_GPT2, {"tokenizer.ggml.merges": ["ab"]}, r"tokenizer.ggml.merges\[0\]: 'ab' is not two tokens"),
  (GOOD_GPT2, {"tokenizer.ggml.pre": "no-such-pre"}, "tokenizer.ggml.pre: unknown pre-tokenizer 'no-such-pre'"),
  (GOOD_GPT2, {"tokenizer.ggml.pre": ["gpt-2"]}, r"tokenizer.ggml.pre: unknown pre-tokenizer \['gpt-2'\]"),
  (GOOD_GPT2, {"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type: 2 token types for 3 tokens"),
  (GOOD_GPT2, {"tokenizer.ggml.token_type": [1, 9, 1]}, r"tokenizer.ggml.token_type\[1\]: unknown token type 9"),
  (GOOD_GPT2, {"tokenizer.ggml.token_type": [6, 1, 1]}, r"tokenizer.ggml.token_type\[0\]: token 'a' has type 6"),
  (GOOD_GPT2, {"tokenizer.ggml.bos_token_id": 3}, "tokenizer.ggml.bos_token_id: token id 3 is outside"),
  (GOOD_GPT2, {"tokenizer.ggml.eos_token_id": -1}, "tokenizer.ggml.eos_token_id: token id -1 is outside"),
  (GOOD_GPT2, {"tokenizer.ggml.unknown_token_id": "0"}, "tokenizer.ggml.unknown_token_id: must be an integer"),
  (GOOD_GPT2, {"tokenizer.ggml.padding_token_id": True}, "tokenizer.ggml.padding_token_id: must be an integer"),
  (GOOD_GPT2, {"tokenizer.ggml.add_bos_token": True}, "tokenizer.ggml.add_bos_token is true, but "
                                                      "tokenizer.ggml.bos_token_id is not set"),
  (GOOD_GPT2, {"tokenizer.ggml.add_eos_token": 1}, "tokenizer.ggml.add_eos_token: must be a bool"),
  (GOOD_GPT2, {"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model: unsupported tokenizer model 'bert'"),
  (GOOD_GPT2, {"tokenizer.ggml.model": None}, "tokenizer.ggml.model: missing"),
  (GOOD_GPT2, {"tokenizer.ggml.model": 2}, "tokenizer.ggml.model: unsupported tokenizer model 2"),
  (GOOD_LLAMA, {"tokenizer.ggml.scores": [0.0] * 4}, "tokenizer.ggml.scores: 4 scores for 5 tokens"),
  (GOOD_LLAMA, {"tokenizer.ggml.scores": [0.0] * 6}, "tokenizer.ggml.scores: 6 scores for 5 tokens"),
  (GOOD_LLAMA, {"tokenizer.ggml.scores": [0.0, 0.0, float("nan"), 0.0, 0.0]}, r"tokenizer.ggml.scores\[2\]: NaN"),
  (GOOD_LLAMA, {"tokenizer.ggml.scores": [0.0, 0.0, "x", 0.0, 0.0]}, r"tokenizer.ggml.scores\[2\]: must be a number"),
  (GOOD_LLAMA, {"tokenizer.ggml.bos_token_id": 5}, "tokenizer.ggml.bos_token_id: token id 5 is outside"),
  (GOOD_LLAMA, {"tokenizer.ggml.tokens": ["<unk>"]}, "tokenizer.ggml.scores: 5 scores for 1 tokens"),
]


@pytest.mark.parametrize("good,change,message", BAD)
def test_malformed_metadata(good, change, message):
  md = {**good, **change}
  md = {k: v for k, v in md.items() if v is not None}
  with pytest.raises(TokenizerError, match=message): Tokenizer.from_gguf_metadata(md)


def test_metadata_forms():
  with pytest.raises(TokenizerError, match="mapping"): Tokenizer.from_gguf_metadata([("tokenizer.ggml.model", "gpt2")])
  assert isinstance(TokenizerError("x"), ValueError)
  # numpy arrays (as some readers return) are taken like lists; llama's default ids 1/2/0 apply when in range
  tok = Tokenizer.from_gguf_metadata({**GOOD_LLAMA, "tokenizer.ggml.scores": np.zeros(5, np.float32),
                                      "tokenizer.ggml.token_type": np.array([2, 3, 3, 1, 6], np.int32)})
  assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.add_bos, tok.add_space_prefix) == (1, 2, 0, True, True)
  # "▁" is no token and its bytes neither: <unk>; "A" is missing but its byte token is there
  assert tok.encode("aA") == [1, 0, 3, 4] and tok.decode([1, 0, 3, 4]) == "aA"
  # without token types: byte texts are byte tokens, the named ids control tokens, the rest normal
  tok = Tokenizer.from_gguf_metadata({k: v for k, v in GOOD_LLAMA.items() if k != "tokenizer.ggml.token_type"})
  assert tok.token_types == [UNKNOWN, CONTROL, CONTROL, NORMAL, BYTE] and tok.decode([1, 4, 2]) == "A"
  tok = Tokenizer.from_gguf_metadata({k: v for k, v in GOOD_GPT2.items() if k != "tokenizer.ggml.pre"})
  assert tok.pre == "default" and tok.encode("ab") == [2]
  assert repr(tok) == "Tokenizer(model='gpt2', pre='default', vocab_size=3)"
  assert isinstance(tok.stream_decoder(), StreamDecoder)
