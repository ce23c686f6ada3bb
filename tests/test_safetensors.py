"""safetensors reader/writer: files written here with numpy + json + struct (an independent encoder) load with the
right values; saved files decode with the same independent reader; every malformed header is rejected with a
SafetensorsError that names the tensor and the problem."""
import json, struct
import numpy as np
import pytest
from baregrad.tensor import Tensor, dtypes, nn
from baregrad.tensor.safetensors import SafetensorsError, load_file, save_file, safe_load_metadata, read_header
from helpers_ops import as_widest, has_float64

rng = np.random.default_rng(7)

# safetensors name -> (numpy dtype of the bytes, baregrad dtype)
CASES = {
  "F32": ("<f4", dtypes.float32), "F64": ("<f8", dtypes.float64), "F16": ("<f2", dtypes.float16),
  "I8": ("|i1", dtypes.int8), "U8": ("|u1", dtypes.uint8), "I16": ("<i2", dtypes.int16), "I32": ("<i4", dtypes.int32),
  "I64": ("<i8", dtypes.int64), "U32": ("<u4", dtypes.uint32), "BOOL": ("|b1", dtypes.bool),
}


def sample(np_dt: str, shape):
  dt = np.dtype(np_dt)
  if dt.kind == "f": return rng.standard_normal(shape).astype(dt)
  if dt.kind == "b": return rng.random(shape) < 0.5
  info = np.iinfo(dt)
  return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


def encode(entries, metadata=None, pad=0, header_override=None, extra_data=b""):
  """Independent writer: entries is a list of (name, dtype name, shape, raw bytes)."""
  header, pos, blobs = {}, 0, []
  if metadata is not None: header["__metadata__"] = metadata
  for name, dt, shape, raw in entries:
    header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + len(raw)]}
    pos += len(raw); blobs.append(raw)
  if header_override is not None: header_override(header)
  text = json.dumps(header).encode() + b" " * pad
  return struct.pack("<Q", len(text)) + text + b"".join(blobs) + extra_data


def decode(data: bytes):
  """Independent reader: name -> numpy array (BF16 as uint16 bits), plus metadata."""
  (n,) = struct.unpack("<Q", data[:8])
  header = json.loads(data[8:8 + n])
  meta = header.pop("__metadata__", {})
  np_of = {k: v[0] for k, v in CASES.items()} | {"BF16": "<u2"}
  out = {}
  for name, info in header.items():
    b, e = info["data_offsets"]
    out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=np_of[info["dtype"]]).reshape(info["shape"])
  return out, meta


def test_load_every_dtype(tmp_path):
  arrays = {f"t_{name}": (name, sample(np_dt, (3, 4) if name != "I64" else (5,))) for name, (np_dt, dt) in CASES.items()
            if dt is not dtypes.float64 or has_float64()}     # (a device without float64 refuses F64 tensors)
  arrays["scalar"] = ("F32", np.array(2.5, dtype="<f4"))
  arrays["empty"] = ("I32", np.zeros((0, 3), dtype="<i4"))
  path = tmp_path / "x.safetensors"
  path.write_bytes(encode([(k, dt, a.shape, a.tobytes()) for k, (dt, a) in arrays.items()], metadata={"format": "pt"}))
  got = load_file(path)
  assert list(got) == list(arrays)
  for k, (dt, a) in arrays.items():
    assert got[k].dtype == (CASES[dt][1]), k
    assert got[k].shape == a.shape
    np.testing.assert_array_equal(got[k].numpy(), a)
  assert safe_load_metadata(path) == {"format": "pt"}


def test_load_bf16_bits(tmp_path):
  bits = np.array([0x3f80, 0xc040, 0x7f80, 0x0001, 0x4049], dtype="<u2")   # 1, -3, inf, a subnormal, 3.140625
  path = tmp_path / "bf.safetensors"
  path.write_bytes(encode([("w", "BF16", (5,), bits.tobytes())]))
  t = load_file(path)["w"]
  assert t.dtype == dtypes.bfloat16
  want = (bits.astype(np.uint32) << 16).view(np.float32)
  np.testing.assert_array_equal(t.numpy(), want)
  assert (t.bitcast(dtypes.uint16).numpy() == bits).all()


def test_save_decodes_independently(tmp_path):
  tensors = {
    "a": Tensor(rng.standard_normal((2, 3)).astype(np.float32)),
    "b": Tensor(rng.integers(-100, 100, (4,)).astype(np.int64)),
    "c": Tensor(rng.standard_normal(6).astype(np.float16)).reshape(2, 3),
    "d": Tensor(np.array([1.0, -2.5, 3.0], dtype=np.float32), dtype=dtypes.bfloat16),
    "e": Tensor(np.array([True, False, True])),
    "f": Tensor(as_widest(rng.standard_normal((2, 2)))).permute(1, 0) * 2,   # a lazy non-contiguous view
  }
  path = tmp_path / "out.safetensors"
  save_file(tensors, path, metadata={"step": "12", "note": "ünïcode"})
  data = path.read_bytes()
  (n,) = struct.unpack("<Q", data[:8])
  assert (8 + n) % 8 == 0, "the data area starts 8-byte aligned"
  arrays, meta = decode(data)
  assert meta == {"step": "12", "note": "ünïcode"}
  for k, t in tensors.items():
    if k == "d": np.testing.assert_array_equal(arrays[k], np.array([0x3f80, 0xc020, 0x4040], dtype=np.uint16))
    else:
      np.testing.assert_array_equal(arrays[k], t.numpy())
      assert arrays[k].dtype == t.numpy().dtype
  # and the round trip through our own reader
  back = load_file(path)
  for k, t in tensors.items():
    assert back[k].dtype == t.dtype and back[k].shape == t.shape
    np.testing.assert_array_equal(back[k].numpy(), t.numpy())


def test_state_dict_round_trip(tmp_path):
  Tensor.manual_seed(3)
  model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), Tensor.relu, lambda x: x.flatten(1), nn.Linear(144, 10))
  model(Tensor(rng.standard_normal((2, 1, 8, 8)).astype(np.float32))).realize()   # moves the running stats
  path = tmp_path / "model.safetensors"
  save_file(model.state_dict(), path)
  sd = load_file(path)
  assert list(sd) == list(model.state_dict())
  Tensor.manual_seed(4)
  other = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), Tensor.relu, lambda x: x.flatten(1), nn.Linear(144, 10))
  other.load_state_dict(sd)
  for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
  x = Tensor(rng.standard_normal((3, 1, 8, 8)).astype(np.float32))
  model.eval(); other.eval()
  np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())


# ---------------------------------------------------------------- malformed files

GOOD = [("w", "F32", (2, 2), np.arange(4, dtype="<f4").tobytes()), ("b", "I32", (3,), np.arange(3, dtype="<i4").tobytes())]


def entry(name, **changes):
  def edit(h): h[name].update(changes)
  return edit


BAD = [
  ("too_short", lambda: b"\x05\x00\x00", "too short"),
  ("header_past_end", lambda: struct.pack("<Q", 1000) + b"{}", "runs past the end"),
  ("huge_header_len", lambda: struct.pack("<Q", 2**63) + b"{}" * 10, "runs past the end"),
  ("not_utf8", lambda: struct.pack("<Q", 4) + b"\xff\xfe{}", "UTF-8"),
  ("not_json", lambda: struct.pack("<Q", 5) + b"{oops", "not valid JSON"),
  ("not_object", lambda: struct.pack("<Q", 2) + b"[]", "JSON object"),
  ("unknown_dtype", lambda: encode(GOOD, header_override=entry("w", dtype="F8")), "'w': unknown dtype 'F8'"),
  ("negative_shape", lambda: encode(GOOD, header_override=entry("w", shape=[-2, -2])), "'w': shape"),
  ("float_shape", lambda: encode(GOOD, header_override=entry("b", shape=[3.0])), "'b': shape"),
  ("shape_mismatch", lambda: encode(GOOD, header_override=entry("w", shape=[2, 3])), "'w': data_offsets [0, 16] hold 16 bytes"),
  ("offsets_out_of_range", lambda: encode(GOOD, header_override=entry("b", data_offsets=[16, 40])), "'b': data_offsets [16, 40] are outside"),
  ("offsets_reversed", lambda: encode(GOOD, header_override=entry("b", data_offsets=[28, 16])), "'b': data_offsets [28, 16]"),
  ("offsets_not_ints", lambda: encode(GOOD, header_override=entry("b", data_offsets=[16])), "'b': data_offsets must be"),
  ("overlap", lambda: encode(GOOD + [("c", "U8", (4,), b"abcd")], header_override=entry("c", data_offsets=[12, 16])), "overlap"),
  ("gap", lambda: encode(GOOD, header_override=entry("b", data_offsets=[20, 32]), extra_data=b"\0" * 4), "'b': data_offsets start at 20"),
  ("trailing_bytes", lambda: encode(GOOD, extra_data=b"junk"), "unused"),
  ("truncated_data", lambda: encode(GOOD)[:-4], "'b': data_offsets [16, 28] are outside"),
  ("missing_field", lambda: encode(GOOD, header_override=lambda h: h["w"].pop("shape")), "'w': entry lacks ['shape']"),
  ("extra_field", lambda: encode(GOOD, header_override=entry("w", strides=[2, 1])), "'w': entry has unknown fields"),
  ("entry_not_object", lambda: encode([], header_override=lambda h: h.update(x=[1, 2])), "'x': entry must be an object"),
  ("bad_metadata", lambda: encode(GOOD, metadata={"n": 3}), "__metadata__"),
  # hostile headers: each must be the module's own error, without recursing, overflowing or allocating
  ("deep_nesting", lambda: raw_header(b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
  ("deep_nesting_in_entry", lambda: raw_header(b'{"w": {"dtype": "F32", "shape": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"),
   "nested too deeply"),
  ("huge_dim_empty", lambda: encode(GOOD + [("e", "F32", (2**62, 0), b"")]), "'e': shape [4611686018427387904, 0] is too large"),
  ("huge_dims_empty", lambda: encode(GOOD + [("e", "U8", (2**40, 2**40, 0), b"")]), "'e': shape [1099511627776, 1099511627776, 0] is too large"),
  ("huge_dim_with_data", lambda: encode(GOOD, header_override=entry("w", shape=[2**200, 2**200])), "'w': shape"),
  ("thousand_digit_dim", lambda: raw_header(json.dumps({"w": {"dtype": "U8", "shape": [0, "DIM"], "data_offsets": [0, 0]}})
                                             .replace('"DIM"', "9" * 5000).encode()), "not valid JSON"),
  ("too_many_dims", lambda: encode(GOOD, header_override=entry("w", shape=[1] * 30 + [2, 2] + [1] * 3)), "'w': shape has 35 dimensions"),
  ("dtype_not_a_string", lambda: encode(GOOD, header_override=entry("w", dtype=["F32"])), "'w': unknown dtype ['F32']"),
  ("duplicate_tensor", lambda: raw_header(b'{"b": {"dtype": "I32", "shape": [3], "data_offsets": [0, 12]}, '
                                          b'"b": {"dtype": "I32", "shape": [3], "data_offsets": [0, 12]}}', b"\0" * 12),
   "the key 'b' appears twice"),
  ("duplicate_field", lambda: raw_header(b'{"b": {"dtype": "I32", "dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}',
                                         b"\0" * 12), "the key 'dtype' appears twice"),
]


def raw_header(text: bytes, data: bytes = b"") -> bytes:
  return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_rejects_malformed(tmp_path, name, make, message):
  path = tmp_path / f"{name}.safetensors"
  path.write_bytes(make())
  with pytest.raises(SafetensorsError, match=None) as e:
    load_file(path)
  assert message in str(e.value), str(e.value)
  assert isinstance(e.value, ValueError)


def test_good_file_loads(tmp_path):
  path = tmp_path / "good.safetensors"
  path.write_bytes(encode(GOOD, pad=5))   # padding spaces after the JSON are allowed
  got = load_file(path)
  np.testing.assert_array_equal(got["w"].numpy(), np.arange(4, dtype=np.float32).reshape(2, 2))
  entries, meta = read_header(path)
  assert entries["b"] == ("I32", (3,), (16, 28)) and meta == {}


def test_truncated_header_metadata(tmp_path):
  path = tmp_path / "t.safetensors"
  path.write_bytes(encode(GOOD, metadata={"a": "b"})[:20])
  with pytest.raises(SafetensorsError, match="runs past the end"): safe_load_metadata(path)


def test_save_errors(tmp_path):
  with pytest.raises(SafetensorsError, match="reserved"): save_file({"__metadata__": Tensor([1.0])}, tmp_path / "a")
  with pytest.raises(SafetensorsError, match="names must be"): save_file({3: Tensor([1.0])}, tmp_path / "a")
  with pytest.raises(SafetensorsError, match="metadata"): save_file({"a": Tensor([1.0])}, tmp_path / "a", {"k": 1})
  with pytest.raises(SafetensorsError, match="'a': expected a Tensor"): save_file({"a": [1.0]}, tmp_path / "a")


def test_dimension_bound_keeps_real_empty_tensors(tmp_path):
  """Zero-size tensors load whatever their other dims, up to 2**48 elements with the zeros left out; past it the
  shape is refused (see the module docstring), and so is [2**62, 0], before numpy or a Tensor sees it."""
  from baregrad.tensor.safetensors import MAX_NUMEL
  ok, bad = tmp_path / "ok.safetensors", tmp_path / "bad.safetensors"
  wide = "F64" if has_float64() else "F32"          # (a device without float64 refuses F64 tensors, empty ones too)
  ok.write_bytes(encode(GOOD + [("e", wide, (0, 4096), b""), ("f", "U8", (2**24, 2**24, 0), b"")]))
  got = load_file(ok)
  assert got["e"].shape == (0, 4096) and got["f"].shape == (2**24, 2**24, 0) and got["f"].numpy().size == 0
  assert MAX_NUMEL == 2**48
  for shape in ([2**24, 2**24 + 1, 0], [2**62, 0], [0, 2**62], [2**16, 0, 2**16, 2**16 + 1]):
    bad.write_bytes(encode(GOOD + [("e", "U8", shape, b"")]))
    with pytest.raises(SafetensorsError, match=r"'e': shape \[.*\] is too large"):
      read_header(bad)


def test_messages_stay_short_for_huge_values(tmp_path):
  """A hostile name or value is quoted shortened: the error names it without echoing megabytes."""
  name = "n" * 1_000_000
  path = tmp_path / "long.safetensors"
  path.write_bytes(encode([(name, "X9", (1,), b"\0")]))
  with pytest.raises(SafetensorsError, match="unknown dtype 'X9'") as e:
    load_file(path)
  assert len(str(e.value)) < 500 and "nnnn" in str(e.value)
  path.write_bytes(encode(GOOD, header_override=entry("w", shape=list(range(-1, 1_000_000)))))
  with pytest.raises(SafetensorsError, match="'w': shape must be a list of non-negative ints") as e:
    load_file(path)
  assert len(str(e.value)) < 500
