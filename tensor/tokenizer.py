"""Tokenizers for language models, built from the tokenizer keys of GGUF metadata.

Two families, chosen by `tokenizer.ggml.model` (key names from gguf-py `gguf/constants.py`, Keys.Tokenizer; behaviour
from llama.cpp `src/llama-vocab.cpp`, which is the reference for what a GGUF file means):

"llama": SentencePiece-style BPE (LLaMA 1/2, Mistral, ...). Every space becomes U+2581 "▁" and, when
  `add_space_prefix` (default true), one "▁" goes in front of each stretch of plain text. The text is then split into
  characters and merged by llama.cpp's `llm_tokenizer_spm`: of all adjacent pairs whose concatenation is a token, the
  one whose token has the highest `tokenizer.ggml.scores` entry merges first (ties: the leftmost), until no pair is a
  token. A character that is no token falls back to the byte tokens "<0xXX>" of its UTF-8 bytes (sentencepiece's
  byte_fallback), else to the unknown token (consecutive unknowns fuse into one, as HF's BPE(fuse_unk=True) does).
"gpt2": byte-level BPE (GPT-2, LLaMA 3, ...). The text is split into words by the pre-tokenizer `tokenizer.ggml.pre`
  (a regex in llama.cpp and HF tokenizers; here a hand-written scanner per pattern, since Python's `re` has no
  \\p{L}/\\p{N}), each word's UTF-8 bytes are mapped to printable characters (GPT-2's byte table, `_BYTE_CHARS`) and
  merged by `tokenizer.ggml.merges`: the adjacent pair with the lowest merge index (rank) first, ties leftmost.

Both: `tokenizer.ggml.token_type` says what a token is (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte; 0 undefined). User-defined tokens are always matched literally in the input; control and unknown tokens only
when `encode(..., parse_special=True)` (llama.cpp `tokenizer_st_partition`: longest token text first). Decoding
renders control/unknown tokens only when asked, drops unused/undefined ones, maps byte tokens to their byte.

Decoding produces bytes first (`decode_token`): a token may hold part of a UTF-8 character (a byte token, or a
byte-level token cut inside a character), so text is made only once bytes are joined. Invalid UTF-8 becomes U+FFFD per
maximal invalid subsequence (the Unicode Standard's recommended substitution, ch. 3 "U+FFFD Substitution of Maximal
Subparts"; Python's "replace" and Rust's from_utf8_lossy, which HF's ByteLevel decoder uses, both do this). HF's
ByteFallback decoder is cruder: a run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte; the two agree
for single stray bytes and differ for a truncated multi-byte character. For "llama", one leading space is removed from
the decoded text when add_space_prefix (sentencepiece's dummy prefix; HF decoders.Strip(" ", 1, 0)). llama.cpp keeps
that space after a BOS and also "cleans" spaces before punctuation for gpt2-style vocabularies; neither is done here,
so decode(encode(text)) == text for any text the vocabulary covers.

Where a merges-list BPE and the score-ordered SPM merge differ: HF converts a sentencepiece vocabulary into a BPE
whose merges are every split of every token into two tokens, ranked by the merged token's score, then longer left
part first, then lower token ids. That gives the same result as the SPM merge except where SPM breaks a tie by
position and HF by that order: two different candidate pairs whose tokens score the same -- in particular two
overlapping pairs making the same token (x+y == y+z). SPM merges the leftmost, HF the pair it ranks first.

Metadata is input: every key this module reads is checked, and each problem raises `TokenizerError` naming the key.
"""
from __future__ import annotations
import codecs, heapq, math, unicodedata
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any
import numpy as np


class TokenizerError(ValueError):
  pass


# tokenizer.ggml.token_type values (gguf-py constants.py TokenType; llama.cpp llama_token_type)
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)

_K = "tokenizer.ggml."
KEY_MODEL, KEY_PRE, KEY_TOKENS, KEY_SCORES = _K + "model", _K + "pre", _K + "tokens", _K + "scores"
KEY_TOKEN_TYPE, KEY_MERGES = _K + "token_type", _K + "merges"
KEY_BOS, KEY_EOS, KEY_UNK = _K + "bos_token_id", _K + "eos_token_id", _K + "unknown_token_id"
KEY_PAD, KEY_EOT, KEY_EOM = _K + "padding_token_id", _K + "eot_token_id", _K + "eom_token_id"
KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_PREFIX = _K + "add_bos_token", _K + "add_eos_token", _K + "add_space_prefix"

MODELS = ("llama", "gpt2")
SPACE_MARK = "\u2581"      # sentencepiece's escaped space, "▁"

# llama.cpp's default ids for a "llama" vocabulary whose file does not name them (sentencepiece's LLaMA layout)
LLAMA_DEFAULT_IDS = {KEY_BOS: 1, KEY_EOS: 2, KEY_UNK: 0}

# texts llama.cpp treats as end of generation besides the eos/eot/eom ids (llama-vocab.cpp, "special_eog_ids")
EOG_TEXTS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                       "<|eom_id|>"))


def _show(v: Any, limit: int = 40) -> str:
  """repr of a value from the file, shortened so a hostile value cannot make a huge message."""
  r = repr(v)
  return r if len(r) <= limit else r[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------------------------
# Character classes of the pre-tokenizer regexes

# \s in Oniguruma (HF tokenizers) and in the `regex` package: the Unicode White_Space property (PropList.txt). Python's
# str.isspace() also says yes to U+001C..U+001F, which \s does not match.
_WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) +
                         "\u2028\u2029\u202f\u205f\u3000")
OTHER, LETTER, NUMBER, SPACE = range(4)      # [^\s\p{L}\p{N}], \p{L} (Lu Ll Lt Lm Lo), \p{N} (Nd Nl No), \s
_CLASS_OF_CATEGORY = {"L": LETTER, "N": NUMBER}
_class_cache: dict[str, int] = {}


def _char_classes(text: str) -> list[int]:
  cache = _class_cache
  if len(cache) > 1 << 16: cache.clear()     # bound the cache: a text may hold any of 1.1M code points
  out = []
  for c in text:
    k = cache.get(c)
    if k is None:
      k = cache[c] = SPACE if c in _WHITE_SPACE else _CLASS_OF_CATEGORY.get(unicodedata.category(c)[0], OTHER)
    out.append(k)
  return out


def _contraction(text: str, i: int, ignore_case: bool) -> int:
  """Length of the contraction 's|'t|'re|'ve|'m|'ll|'d at text[i] (which is "'"), or 0. With ignore_case, as the
  regex (?i:...) matches: ASCII letters in either case, and U+017F "ſ" for s (its simple case folding)."""
  a, b = text[i + 1:i + 2], text[i + 2:i + 3]
  if ignore_case:
    a = "s" if a == "\u017f" else a.lower() if a.isascii() else a
    b = b.lower() if b.isascii() else b
  if a + b in ("re", "ve", "ll"): return 3
  return 2 if a in ("s", "t", "m", "d") else 0


def _space_run_end(cls: list[int], i: int) -> int:
  j, n = i + 1, len(cls)
  while j < n and cls[j] == SPACE: j += 1
  return j


def _split_gpt2(text: str) -> list[str]:
  """GPT-2's pattern, as HF ByteLevel(use_regex=True) uses it:
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
  Leftmost alternative wins at each position. Whitespace: `\\s+(?!\\S)` takes a run that ends the text, and otherwise
  all of a run but its last character (which then starts the next word, as " word"); a single whitespace character
  before a non-space that no other alternative takes is matched alone by `\\s+`."""
  cls, n, i, out = _char_classes(text), len(text), 0, []
  while i < n:
    c, k = text[i], cls[i]
    if c == "'" and (m := _contraction(text, i, False)):
      j = i + m
    elif k != SPACE or (c == " " and i + 1 < n and cls[i + 1] != SPACE):
      start = i + 1 if k == SPACE else i        # the optional " " in front of a run of one class
      run, j = cls[start], start + 1
      while j < n and cls[j] == run: j += 1
    else:
      e = _space_run_end(cls, i)
      j = e if e == n or e - i == 1 else e - 1
    out.append(text[i:j])
    i = j
  return out


def _split_llama3(text: str) -> list[str]:
  """LLaMA 3's pattern (Meta's tokenizer.json; llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3):
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|
    \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
  `[^\\r\\n\\p{L}\\p{N}]?\\p{L}+` lets one space, tab or punctuation mark lead a word. `\\s*[\\r\\n]+` on a whitespace
  run holding a line break backtracks to end just after the run's last CR/LF."""
  cls, n, i, out = _char_classes(text), len(text), 0, []
  while i < n:
    c, k = text[i], cls[i]
    if c == "'" and (m := _contraction(text, i, True)):
      j = i + m
    elif k == LETTER or (k != NUMBER and c not in "\r\n" and i + 1 < n and cls[i + 1] == LETTER):
      j = i + 1
      while j < n and cls[j] == LETTER: j += 1
    elif k == NUMBER:
      j = i + 1
      while j < n and j < i + 3 and cls[j] == NUMBER: j += 1
    elif k == OTHER or (c == " " and i + 1 < n and cls[i + 1] == OTHER):
      j = i + 1 if k == OTHER else i + 2
      while j < n and cls[j] == OTHER: j += 1
      while j < n and text[j] in "\r\n": j += 1
    else:
      e = _space_run_end(cls, i)
      breaks = [p for p in range(i, e) if text[p] in "\r\n"]
      j = breaks[-1] + 1 if breaks else e if e == n or e - i == 1 else e - 1
    out.append(text[i:j])
    i = j
  return out


def _isolate(text: str, matcher) -> list[str]:
  """Split `text` into the non-overlapping matches of `matcher` (position -> match length, 0 for none) and the text
  between them, all kept: the "isolated" split of HF pre_tokenizers.Split and of llama.cpp's unicode_regex_split."""
  out, gap, i, n = [], 0, 0, len(text)
  while i < n:
    m = matcher(text, i)
    if m:
      if gap < i: out.append(text[gap:i])
      out.append(text[i:i + m])
      i = gap = i + m
    else:
      i += 1
  if gap < n: out.append(text[gap:])
  return out


def _run_matcher(pred):
  def match(text: str, i: int) -> int:
    j = i
    while j < len(text) and pred(text[j]): j += 1
    return j - i
  return match


_PUNCT_EXTRA = frozenset("$+<=>^~|")
_punct_runs = _run_matcher(lambda c: c in _PUNCT_EXTRA or unicodedata.category(c)[0] == "P")   # [\p{P}\$\+<=>\^~\|]+
_number_runs = _run_matcher(lambda c: unicodedata.category(c)[0] == "N")                         # \p{N}+


def _ascii_digit_triple(text: str, i: int) -> int:                                                 # [0-9][0-9][0-9]
  t = text[i:i + 3]
  return 3 if len(t) == 3 and all("0" <= c <= "9" for c in t) else 0


def _split_default(text: str) -> list[str]:
  """llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (a gpt2-style vocabulary whose pre-tokenizer the converter did not
  know): four regexes applied in turn, each splitting every piece the previous one left. The second is GPT-2's
  pattern without its final `|\\s+`; the only text that alternative takes is a single whitespace character before a
  non-space, which an isolated split keeps as a piece of its own anyway, so _split_gpt2 serves."""
  pieces = [text]
  for split in (lambda t: _isolate(t, _punct_runs), _split_gpt2, lambda t: _isolate(t, _number_runs),
                lambda t: _isolate(t, _ascii_digit_triple)):
    pieces = [p for piece in pieces for p in split(piece)]
  return pieces


# tokenizer.ggml.pre -> (word splitter, ignore_merges, add_bos default), as llama.cpp's llama_vocab::impl::load sets
# them; "gpt-2" is the name llama.cpp's converter writes, "gpt2" an alias. A missing key means "default".
PRE_TOKENIZERS: dict[str, tuple] = {
  **{name: (_split_gpt2, False, False) for name in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo")},
  **{name: (_split_llama3, True, True) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral")},
  "default": (_split_default, False, False),
}


def pre_tokenize(text: str, pre: str) -> list[str]:
  """The words a gpt2-style pre-tokenizer `pre` (a PRE_TOKENIZERS name) splits `text` into; they join back to `text`."""
  if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
    raise TokenizerError(f"{KEY_PRE}: unknown pre-tokenizer {_show(pre)}; known: {', '.join(sorted(PRE_TOKENIZERS))}")
  return PRE_TOKENIZERS[pre][0](text)


# ---------------------------------------------------------------------------------------------------------------------
# GPT-2's byte table (OpenAI gpt-2 src/encoder.py bytes_to_unicode; HF pre_tokenizers.ByteLevel): the 188 bytes that
# are printable Latin-1 characters stand for themselves (0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF); the other 68 (0x00..0x20,
# 0x7F..0xA0, 0xAD) get U+0100, U+0101, ... in increasing byte order. So " " is "Ġ" (U+0120) and "\n" is "Ċ" (U+010A).

def _byte_chars() -> list[str]:
  printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
  table, extra = [], 0
  for b in range(256):
    if b in printable: table.append(chr(b))
    else: table.append(chr(0x100 + extra)); extra += 1
  return table


_BYTE_CHARS = _byte_chars()
_CHAR_BYTES = {c: b for b, c in enumerate(_BYTE_CHARS)}
_LATIN1_TO_BYTE_CHARS = {b: c for b, c in enumerate(_BYTE_CHARS)}     # str.translate table from latin-1 text


def _byte_level(word: str) -> str:
  return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


# ---------------------------------------------------------------------------------------------------------------------
# The two merge loops. Symbols are slices of the text: symbol i starts at character i and spans size[i] characters
# (0 once merged into its left neighbour), so its right neighbour starts at i + size[i]. The heap holds candidate pairs
# (key, left, right, end); a pair is stale once either symbol changed, which `right + size[right] != end` or a size of
# 0 detects (a live left symbol grows only by taking `right`).

def _merge(text: str, pair_key) -> list[str]:
  n = len(text)
  if n < 2: return [text] if n else []
  size, prev, heap = [1] * n, list(range(-1, n - 1)), []

  def candidate(left: int, right: int):
    end = right + size[right]
    key = pair_key(text[left:right], text[right:end])
    if key is not None: heapq.heappush(heap, (key, left, right, end))

  for i in range(n - 1): candidate(i, i + 1)
  while heap:
    _, left, right, end = heapq.heappop(heap)
    if size[left] == 0 or size[right] == 0 or right + size[right] != end: continue
    size[left] += size[right]
    size[right] = 0
    if end < n: prev[end] = left
    if prev[left] >= 0: candidate(prev[left], left)
    if end < n: candidate(left, end)
  out, i = [], 0
  while i < n:
    out.append(text[i:i + size[i]])
    i += size[i]
  return out


# ---------------------------------------------------------------------------------------------------------------------
# Reading the metadata

def _sequence(md: Mapping, key: str, elem, elem_name: str, required: bool = False) -> list | None:
  v = md.get(key)
  if v is None:
    if required: raise TokenizerError(f"{key}: missing; the tokenizer needs it")
    return None
  if isinstance(v, np.ndarray): v = v.tolist()
  if not isinstance(v, (list, tuple)): raise TokenizerError(f"{key}: must be an array, got {type(v).__name__}")
  exact = {str: (str,), Integral: (int,), Real: (float, int)}[elem]     # the types a GGUF reader returns: fast path
  if all(type(x) in exact for x in v): return list(v)
  for i, x in enumerate(v):
    if not isinstance(x, elem) or isinstance(x, bool):
      raise TokenizerError(f"{key}[{i}]: must be {elem_name}, got {_show(x)}")
  return list(v)


def _flag(md: Mapping, key: str, default: bool) -> bool:
  v = md.get(key)
  if v is None: return default
  if not isinstance(v, (bool, np.bool_)): raise TokenizerError(f"{key}: must be a bool, got {_show(v)}")
  return bool(v)


def _token_id(md: Mapping, key: str, n_tokens: int, default: int | None = None) -> int | None:
  v = md.get(key)
  if v is None: return default if default is not None and default < n_tokens else None
  if not isinstance(v, Integral) or isinstance(v, bool):
    raise TokenizerError(f"{key}: must be an integer token id, got {_show(v)}")
  if not 0 <= v < n_tokens: raise TokenizerError(f"{key}: token id {v} is outside the vocabulary (0..{n_tokens - 1})")
  return int(v)


def _check_length(key: str, values: list, n_tokens: int, what: str):
  if len(values) != n_tokens:
    raise TokenizerError(f"{key}: {len(values)} {what} for {n_tokens} tokens in {KEY_TOKENS}; there must be one per "
                         f"token")


def _byte_token_value(text: str) -> int | None:
  """0xXX of a "<0xXX>" token text (sentencepiece's byte pieces), else None."""
  if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
    try: return int(text[3:5], 16)
    except ValueError: return None
  return None


class Tokenizer:
  """A vocabulary and its merge rules; build one with `Tokenizer.from_gguf_metadata(metadata)`.

  `encode(text)` -> token ids, `decode(ids)` -> text, `decode_token(id)` -> that token's bytes, `stream_decoder()` for
  text as generated tokens arrive. Attributes: model ("llama" | "gpt2"), pre (gpt2 pre-tokenizer name), vocab_size,
  tokens (texts by id), token_types, bos_id / eos_id / unk_id / pad_id / eot_id (None when absent), eog_ids (ids that
  end generation), add_bos / add_eos (defaults of encode), add_space_prefix (llama)."""

  def __init__(self, model: str, tokens: list[str], token_types: list[int], scores: list[float] | None = None,
               merges: list[tuple[str, str]] | None = None, pre: str | None = None,
               special_ids: Mapping[str, int | None] | None = None, add_bos: bool = False, add_eos: bool = False,
               add_space_prefix: bool = False, ignore_merges: bool = False):
    self.model, self.pre, self.tokens, self.token_types = model, pre, list(tokens), list(token_types)
    self.vocab_size = len(self.tokens)
    ids = dict(special_ids or {})
    self.bos_id, self.eos_id, self.unk_id = ids.get("bos"), ids.get("eos"), ids.get("unk")
    self.pad_id, self.eot_id, self.eom_id = ids.get("pad"), ids.get("eot"), ids.get("eom")
    self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
    self._ignore_merges = ignore_merges
    self._ids = {t: i for i, t in enumerate(self.tokens) if t}    # an empty token text can never be matched
    self._scores = scores if scores is not None else [0.0] * self.vocab_size
    self._ranks: dict[tuple[str, str], int] = {}
    for rank, pair in enumerate(merges or ()): self._ranks.setdefault(pair, rank)    # llama.cpp keeps the first
    self._split_words = PRE_TOKENIZERS[pre][0] if model == "gpt2" else None
    self._byte_ids = [self._ids.get(f"<0x{b:02X}>") for b in range(256)]
    self._word_cache: dict[str, list[int]] = {}
    self._pieces: dict[int, bytes] = {}
    self.eog_ids = frozenset(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None) | \
      frozenset(self._ids[t] for t in EOG_TEXTS if t in self._ids)
    # literal matches in the input (llama.cpp cache_special_tokens): longest text first, then by id
    specials = [i for i, t in enumerate(self.token_types) if t in (CONTROL, USER_DEFINED, UNKNOWN) and self.tokens[i]]
    self._specials = sorted(specials, key=lambda i: (-len(self.tokens[i]), i))

  # -- construction ---------------------------------------------------------------------------------------------------

  @classmethod
  def from_gguf_metadata(cls, md: Mapping[str, Any]) -> Tokenizer:
    """Build the tokenizer that the `tokenizer.ggml.*` keys of a GGUF file's metadata describe (tensor/gguf.py's
    GGUFFile.metadata or load_gguf's first result). Every key is checked; a problem raises TokenizerError naming it."""
    if not isinstance(md, Mapping): raise TokenizerError(f"metadata must be a mapping of keys, got {type(md).__name__}")
    model = md.get(KEY_MODEL)
    if model is None: raise TokenizerError(f"{KEY_MODEL}: missing; the file names no tokenizer")
    if not isinstance(model, str) or model not in MODELS:
      raise TokenizerError(f"{KEY_MODEL}: unsupported tokenizer model {_show(model)}; supported: {', '.join(MODELS)} "
                           f"(llama = SentencePiece-style BPE, gpt2 = byte-level BPE)")
    tokens = _sequence(md, KEY_TOKENS, str, "a string", required=True)
    n = len(tokens)
    if n == 0: raise TokenizerError(f"{KEY_TOKENS}: the vocabulary is empty")
    ids: dict[str, int] = {}
    for i, t in enumerate(tokens):
      if t and ids.setdefault(t, i) != i:
        raise TokenizerError(f"{KEY_TOKENS}[{i}]: token {_show(t)} is already token {ids[t]}; texts must be unique")

    scores = _sequence(md, KEY_SCORES, Real, "a number")
    if scores is not None:
      _check_length(KEY_SCORES, scores, n, "scores")
      for i, s in enumerate(scores):
        if math.isnan(s): raise TokenizerError(f"{KEY_SCORES}[{i}]: NaN cannot be ordered")
      scores = [float(s) for s in scores]

    special_ids = {name: _token_id(md, key, n, LLAMA_DEFAULT_IDS.get(key) if model == "llama" else None)
                   for name, key in (("bos", KEY_BOS), ("eos", KEY_EOS), ("unk", KEY_UNK), ("pad", KEY_PAD),
                                     ("eot", KEY_EOT), ("eom", KEY_EOM))}

    types = _sequence(md, KEY_TOKEN_TYPE, Integral, "an integer token type")
    if types is not None:
      _check_length(KEY_TOKEN_TYPE, types, n, "token types")
      for i, t in enumerate(types):
        if not UNDEFINED <= t <= BYTE:
          raise TokenizerError(f"{KEY_TOKEN_TYPE}[{i}]: unknown token type {t} (known: 0 undefined, 1 normal, "
                               f"2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)")
        if t == BYTE and _byte_token_value(tokens[i]) is None:
          raise TokenizerError(f"{KEY_TOKEN_TYPE}[{i}]: token {_show(tokens[i])} has type 6 (byte) but is not of the "
                               f"form <0xXX>")
      types = [int(t) for t in types]
    else:
      # no types in the file: llama.cpp takes every token as normal; naming the byte and special tokens keeps
      # decode from printing "<0x0A>" or "<s>"
      types = [NORMAL] * n
      for i, t in enumerate(tokens):
        if model == "llama" and _byte_token_value(t) is not None: types[i] = BYTE
      for name in ("bos", "eos", "pad", "eot", "eom"):
        if special_ids[name] is not None: types[special_ids[name]] = CONTROL
      if special_ids["unk"] is not None: types[special_ids["unk"]] = UNKNOWN

    merges, pre, ignore_merges, add_bos_default = None, None, False, model == "llama"
    if model == "gpt2":
      pre = md.get(KEY_PRE, "default")
      if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        raise TokenizerError(f"{KEY_PRE}: unknown pre-tokenizer {_show(pre)}; known: "
                             f"{', '.join(sorted(PRE_TOKENIZERS))}")
      _, ignore_merges, add_bos_default = PRE_TOKENIZERS[pre]
      merges = []
      for i, m in enumerate(_sequence(md, KEY_MERGES, str, "a string", required=True)):
        cut = m.find(" ", 1)      # as llama.cpp: the first space after the first character separates the two tokens
        if cut < 0: raise TokenizerError(f"{KEY_MERGES}[{i}]: {_show(m)} is not two tokens separated by a space")
        left, right = m[:cut], m[cut + 1:]
        for part in (left, right, left + right):
          if part not in ids:
            raise TokenizerError(f"{KEY_MERGES}[{i}]: {_show(m)} names {_show(part)}, which is not in {KEY_TOKENS}")
        merges.append((left, right))

    add_bos = _flag(md, KEY_ADD_BOS, add_bos_default)
    add_eos = _flag(md, KEY_ADD_EOS, False)
    add_space_prefix = _flag(md, KEY_ADD_PREFIX, True) if model == "llama" else False
    for flag, key, name, id_key in ((add_bos, KEY_ADD_BOS, "bos", KEY_BOS), (add_eos, KEY_ADD_EOS, "eos", KEY_EOS)):
      if flag and special_ids[name] is None: raise TokenizerError(f"{key} is true, but {id_key} is not set")
    return cls(model, tokens, types, scores, merges, pre, special_ids, add_bos, add_eos, add_space_prefix,
               ignore_merges)

  def __repr__(self):
    pre = f", pre={self.pre!r}" if self.pre else ""
    return f"Tokenizer(model={self.model!r}{pre}, vocab_size={self.vocab_size})"

  # -- encoding -------------------------------------------------------------------------------------------------------

  def token_id(self, text: str) -> int | None:
    """The id of the token whose text is exactly `text` (e.g. "<|eot_id|>"), or None."""
    return self._ids.get(text)

  def is_eog(self, token_id: int) -> bool:
    """Whether generation should stop at this token (eos, eot, eom and the texts in EOG_TEXTS, as llama.cpp)."""
    return token_id in self.eog_ids

  def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None,
             parse_special: bool = False) -> list[int]:
    """Token ids of `text`. add_bos/add_eos: None follows the file (tokenizer.ggml.add_bos_token, ...).
    parse_special: control tokens written in the text (e.g. "<|eot_id|>" in a chat template) become those tokens
    instead of being tokenized as characters; user-defined tokens always do."""
    if not isinstance(text, str): raise TokenizerError(f"encode takes a str, got {type(text).__name__}")
    try: text.encode("utf-8")
    except UnicodeEncodeError as e:
      raise TokenizerError(f"encode: the text holds U+{ord(text[e.start]):04X} at index {e.start}, a lone surrogate "
                           f"with no UTF-8 form") from None
    add_bos = self.add_bos if add_bos is None else add_bos
    add_eos = self.add_eos if add_eos is None else add_eos
    out: list[int] = []
    if add_bos:
      if self.bos_id is None: raise TokenizerError(f"encode: add_bos asked, but the vocabulary has no {KEY_BOS}")
      out.append(self.bos_id)
    for fragment in self._partition(text, parse_special):
      if isinstance(fragment, int): out.append(fragment)
      elif self.model == "llama": self._encode_spm(fragment, out)
      else: self._encode_bpe(fragment, out)
    if add_eos:
      if self.eos_id is None: raise TokenizerError(f"encode: add_eos asked, but the vocabulary has no {KEY_EOS}")
      out.append(self.eos_id)
    return out

  def _partition(self, text: str, parse_special: bool) -> list[str | int]:
    """Cut the special tokens' texts out of `text` (llama.cpp tokenizer_st_partition): each in turn, longest first,
    every occurrence in the plain text left so far becomes that token's id."""
    fragments: list[str | int] = [text] if text else []
    for tid in self._specials:
      if not parse_special and self.token_types[tid] != USER_DEFINED: continue
      tok, cut = self.tokens[tid], []
      for f in fragments:
        if isinstance(f, int) or tok not in f:
          cut.append(f)
          continue
        parts = f.split(tok)
        for j, part in enumerate(parts):
          if j: cut.append(tid)
          if part: cut.append(part)
      fragments = cut
    return fragments

  def _encode_spm(self, text: str, out: list[int]):
    # llama.cpp: a space goes in front of plain text that starts the input or follows a special token -- which, as
    # special tokens are cut out whole, is every stretch of plain text
    if self.add_space_prefix: text = " " + text
    text = text.replace(" ", SPACE_MARK)
    ids, scores = self._ids, self._scores

    def pair_score(a: str, b: str):
      tid = ids.get(a + b)
      return None if tid is None else -scores[tid]    # min-heap: the highest score first, then the leftmost pair

    prev_unknown = False
    for piece in _merge(text, pair_score):
      tid = ids.get(piece)
      if tid is not None:
        out.append(tid)
        prev_unknown = False
        continue
      # only single characters can be missing (every merge makes a token): its UTF-8 bytes as byte tokens, else <unk>
      byte_ids = [self._byte_ids[b] for b in piece.encode("utf-8")]
      if None not in byte_ids:
        out.extend(byte_ids)
        prev_unknown = False
      elif self.unk_id is None:
        raise TokenizerError(f"encode: {piece!r} (U+{ord(piece[0]):04X}) is not in the vocabulary, which has neither "
                             f"byte tokens <0xXX> for it nor an unknown token ({KEY_UNK})")
      elif not prev_unknown:
        out.append(self.unk_id)
        prev_unknown = True

  def _encode_bpe(self, text: str, out: list[int]):
    cache = self._word_cache
    if len(cache) > 1 << 16: cache.clear()
    for word in self._split_words(text):
      ids = cache.get(word)
      if ids is None: ids = cache[word] = self._bpe_word(_byte_level(word))
      out.extend(ids)

  def _bpe_word(self, word: str) -> list[int]:
    vocab = self._ids
    if self._ignore_merges and word in vocab: return [vocab[word]]    # llama.cpp/HF ignore_merges: whole-word token
    ranks = self._ranks
    ids = []
    for piece in _merge(word, lambda a, b: ranks.get((a, b))):
      tid = vocab.get(piece)
      if tid is None:                      # a single byte character the vocabulary lacks
        raise TokenizerError(f"encode: byte 0x{_CHAR_BYTES[piece]:02X} has no token ({piece!r}) in this byte-level "
                             f"vocabulary")
      ids.append(tid)
    return ids

  # -- decoding -------------------------------------------------------------------------------------------------------

  def _check_id(self, token_id) -> int:
    if not isinstance(token_id, Integral) or isinstance(token_id, bool):
      raise TokenizerError(f"decode: token ids are integers, got {_show(token_id)}")
    if not 0 <= token_id < self.vocab_size:
      raise TokenizerError(f"decode: token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
    return int(token_id)

  def decode_token(self, token_id: int, special: bool = False) -> bytes:
    """The bytes token `token_id` stands for: possibly part of a UTF-8 character. Control and unknown tokens give
    b"" unless `special` (then their text); unused and undefined ones always b"" (llama.cpp token_to_piece). The
    leading space that a "llama" vocabulary puts on a word is kept here; decode and StreamDecoder remove the first."""
    tid, kind = self._check_id(token_id), self.token_types[token_id]
    if kind in (CONTROL, UNKNOWN): return self.tokens[tid].encode("utf-8") if special else b""
    if kind in (UNUSED, UNDEFINED): return b""
    piece = self._pieces.get(tid)
    if piece is None:
      text = self.tokens[tid]
      if kind == BYTE: piece = bytes([_byte_token_value(text)])
      elif kind == USER_DEFINED: piece = text.encode("utf-8")
      elif self.model == "llama": piece = text.replace(SPACE_MARK, " ").encode("utf-8")
      elif all(c in _CHAR_BYTES for c in text): piece = bytes(_CHAR_BYTES[c] for c in text)
      else: piece = text.encode("utf-8")     # not byte-level text: as HF's ByteLevel decoder, its own UTF-8
      self._pieces[tid] = piece
    return piece

  def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
    """The bytes of `ids` joined, with the first leading space removed where `decode` removes it."""
    data = b"".join(self.decode_token(i, special) for i in ids)
    return data[1:] if self._strips_space_prefix and data[:1] == b" " else data

  def decode(self, ids: Iterable[int], special: bool = False) -> str:
    """Text of `ids`; invalid UTF-8 becomes U+FFFD (one per maximal invalid subsequence). `special`: render control
    tokens such as "<s>" as their text."""
    return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

  @property
  def _strips_space_prefix(self) -> bool:
    return self.model == "llama" and self.add_space_prefix

  def stream_decoder(self, special: bool = False, strip_space_prefix: bool | None = None) -> StreamDecoder:
    """A StreamDecoder over this vocabulary (see there)."""
    return StreamDecoder(self, special, strip_space_prefix)


class StreamDecoder:
  """Text from tokens as they are generated: `push(id)` returns the text that became complete (possibly ""), holding
  back the bytes of a character that is not finished yet; `flush()` returns what is left at the end (an unfinished
  character as U+FFFD). The pieces joined equal `tokenizer.decode(ids)`.
  strip_space_prefix: remove one leading space of the stream (None: as decode does, for a "llama" vocabulary)."""

  def __init__(self, tokenizer: Tokenizer, special: bool = False, strip_space_prefix: bool | None = None):
    self.tokenizer, self.special = tokenizer, special
    self._strip = tokenizer._strips_space_prefix if strip_space_prefix is None else strip_space_prefix
    self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def push(self, token_id: int) -> str:
    data = self.tokenizer.decode_token(token_id, self.special)
    if self._strip and data:
      self._strip = False
      if data[:1] == b" ": data = data[1:]
    return self._utf8.decode(data)

  def extend(self, ids: Sequence[int]) -> str:
    return "".join(self.push(i) for i in ids)

  def flush(self) -> str:
    return self._utf8.decode(b"", final=True)
