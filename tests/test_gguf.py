"""GGUF reader/writer and ggml dequantization, against the independent `gguf` package (gguf-py, llama.cpp's own Python
reader, writer and quantizer): files it writes read back with equal metadata, shapes and bytes; every supported type
dequantizes to exactly `gguf.quants.dequantize`'s values, both on the host (numpy) and as a lazy Tensor graph (on
the CPU, and a few small cases on the emulated AMD and NV GPUs); a matmul with a quantized weight fuses the
dequantization; our writer's files read back through `gguf.GGUFReader`; every malformed file (bytes built here with
struct, an encoder independent of the module) is a GGUFError naming the problem, never a crash or a MemoryError.

Exactness: ggml's dequantization is a float32 product of a float16 scale and a small integer, `d * q + m`, or
`(d * sc) * q - dmin * m` for the K-quants; each operation rounds once. numpy, gguf-py and our graphs do the same
operations in the same order, and the CPU kernels are compiled with -ffp-contract=off (no fused multiply-add), so the
results must be bit-identical; the GPU renderers emit separate multiply and add too."""
import struct
import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from baregrad.drivers import settings
from baregrad.hcq.device import Device
from baregrad.compiler.uop import Ops
from baregrad.tensor import Tensor, dtypes
from baregrad.tensor.gguf import GGUFError, GGUFFile, load_gguf, write_gguf, MAX_ARRAY
from baregrad.tensor.ggml_quants import BY_NAME, LAYOUTS, dequantize, dequantize_numpy

QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")   # what gguf.quants.quantize implements
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")                      # gguf-py only dequantizes these: random blocks instead
SCALES = ("d", "m", "dmin")                              # the float16 fields of the layouts


def random_blocks(name: str, n_blocks: int, seed: int = 0) -> np.ndarray:
  """Random bytes for n_blocks blocks of a quant type, with finite float16 scales (random bits elsewhere cover every
  quant value, scale and high bit)."""
  r = np.random.default_rng(seed)
  t = BY_NAME[name]
  raw = r.integers(0, 256, size=(n_blocks, t.type_size), dtype=np.uint8)
  for field in SCALES:
    if field in LAYOUTS[name]:
      at = LAYOUTS[name][field][0]
      scale = (r.standard_normal(n_blocks) * r.choice([1e-4, 1e-2, 1.0], n_blocks)).astype(np.float16)
      raw[:, at:at + 2] = scale.reshape(-1, 1).view(np.uint8)
  return raw


def sample_raw(name: str, shape, seed: int = 0) -> np.ndarray:
  """The bytes of a tensor of `shape`: gguf's quantization of random weights where it has one, else random blocks;
  F32/F16/BF16 as their bits. uint8 array (rows, bytes per row), the layout gguf.quants uses."""
  r = np.random.default_rng(seed)
  w = (r.standard_normal(shape) * 0.5).astype(np.float32)
  if name in QUANTIZABLE: return gguf.quants.quantize(w, QT[name])
  if name == "F32": return w.view(np.uint8).reshape(*shape[:-1], -1)
  if name == "F16": return w.astype(np.float16).view(np.uint8).reshape(*shape[:-1], -1)
  if name == "BF16": return gguf.quants.quantize(w, QT.BF16).view(np.uint8).reshape(*shape[:-1], -1)
  t = BY_NAME[name]
  n_blocks = int(np.prod(shape)) // t.block_size
  return random_blocks(name, n_blocks, seed).reshape(*shape[:-1], -1)


# ---------------- dequantization ----------------

DEQUANT_TYPES = ("F32", "F16", "BF16", *QUANTIZABLE, *K_QUANTS)


@pytest.mark.parametrize("name", DEQUANT_TYPES)
def test_dequantize_matches_gguf(name):
  t = BY_NAME[name]
  shape = (2, 3, 2 * t.block_size) if name in ("Q4_0", "Q4_K") else (3, 2 * t.block_size)   # rows of several blocks
  raw = sample_raw(name, shape, seed=len(name))
  want = gguf.quants.dequantize(raw, QT[name]).astype(np.float32)
  assert want.shape == shape
  host = dequantize_numpy(raw, name, shape)
  assert host.dtype == np.float32 and host.shape == shape
  np.testing.assert_array_equal(host, want)
  lazy = dequantize(Tensor(raw.reshape(-1), dtype=dtypes.uint8, device="CPU"), name, shape)
  assert lazy.dtype == dtypes.float32 and lazy.shape == shape
  np.testing.assert_array_equal(lazy.numpy(), want)


def test_dequantize_rejects_wrong_sizes():
  with pytest.raises(ValueError, match="Q8_0 of shape \\(2, 32\\) takes 68 bytes, got 34"):
    dequantize_numpy(np.zeros(34, np.uint8), "Q8_0", (2, 32))
  with pytest.raises(ValueError, match="not a multiple of the block size 256"):
    dequantize(Tensor(np.zeros(144, np.uint8), device="CPU"), "Q4_K", (1, 128))
  with pytest.raises(ValueError, match="Q2_K is not supported"):
    dequantize_numpy(np.zeros(84, np.uint8), "Q2_K", (1, 256))


@pytest.fixture(scope="module", params=["AMD", "NV"])
def emulated_gpu(request):
  """An emulated GPU (EMU=1 inside the test, whatever the default device is), as tests/test_gpu_opt.py opens them."""
  with settings.override(EMU=1):
    dev = Device.get(request.param)
    iface = {"AMD": lambda d: d.kernel, "NV": lambda d: d.k}[dev.driver.name](dev.driver)
    if not iface.emulated: pytest.skip(f"{request.param} is a real GPU here; these tests use the emulated one")
  return request.param


@pytest.mark.parametrize("name", ["Q5_1", "Q4_K", "Q6_K"])
def test_dequantize_on_emulated_gpu(emulated_gpu, name):
  """One block each (the emulators are slow): the f16 scale bitcast, 5th-bit, packed 6-bit scale and int8 paths."""
  t = BY_NAME[name]
  raw = random_blocks(name, 1, seed=3)
  want = gguf.quants.dequantize(raw, QT[name])
  with settings.override(EMU=1):
    got = dequantize(Tensor(raw.reshape(-1), dtype=dtypes.uint8, device=emulated_gpu), name, (1, t.block_size)).numpy()
  np.testing.assert_array_equal(got, want)


def weight(name: str, rows: int, cols: int, seed: int = 1):
  raw = random_blocks(name, rows * cols // BY_NAME[name].block_size, seed)
  return raw, dequantize_numpy(raw, name, (rows, cols))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K"])
def test_matmul_fuses_dequantization(name):
  """x @ W.T with a quantized W: one kernel, reading the blocks; no kernel writes a float copy of W."""
  rows, cols = 16, 512
  raw, w = weight(name, rows, cols)
  x = np.random.default_rng(2).standard_normal((3, cols)).astype(np.float32)
  W = dequantize(Tensor(raw.reshape(-1), dtype=dtypes.uint8, device="CPU"), name, (rows, cols))
  out = Tensor(x, device="CPU") @ W.T
  items = out.schedule()
  written = [item.bufs[0].nbytes for item in items]
  assert max(written) < rows * cols * 4, f"a kernel writes {max(written)} bytes: a dequantized copy of W"
  assert len(items) == 1, written
  assert [b.nbytes for b in items[0].bufs if b.dtype == dtypes.uint8] == [raw.size]   # it reads the blocks
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-5, atol=1e-5 * np.abs(w).max() * cols)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("n", [1, 5])
def test_cpu_matvec_unrolls_k_quant_blocks(name, n):
  """x @ W.T on the CPU with W in a K-quant (256-element blocks of 8 sub-blocks whose nibble, scale and min are chosen
  by position) unrolls the reduction over the 8 sub-blocks, so each choice is a constant in its copy
  (compiler/opt.py _block_period_unroll); types of 32-element blocks (one block a step) do not. One decode row and a
  few prompt rows; the nibbles convert to float as signed lanes (render_c: one conversion, exact below 2^16). Every
  type's reduction runs in vector lanes (REDUCE_LANES), Q5_0/Q5_1's fifth bits included (ggml_quants._bits: they
  were chosen per lane between 8 shifted bytes, and the kernel ran one lane at a time). Against gguf's own
  dequantization."""
  rows, cols = 64, 1024
  raw = random_blocks(name, rows * cols // BY_NAME[name].block_size, 3)
  w = gguf.quants.dequantize(raw, QT[name]).reshape(rows, cols).astype(np.float64)
  x = np.random.default_rng(4).standard_normal((n, cols)).astype(np.float32)
  W = dequantize(Tensor(raw.reshape(-1), dtype=dtypes.uint8, device="CPU"), name, (rows, cols))
  out = Tensor(x, device="CPU") @ W.T
  items = out.schedule()
  assert len(items) == 1, [i.name for i in items]
  opts = items[0].program.meta["opts"]
  assert any(o.op == "UNROLL" and o.amount == 8 for o in opts) == name.endswith("_K"), opts
  assert any(o.op == "REDUCE_LANES" for o in opts), opts
  if name in ("Q4_K", "Q5_K"):
    assert "bg_u32x8)" not in items[0].program.source.split("void ")[-1], "nibbles converted as unsigned lanes"
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-5 * np.abs(w).max() * cols)


def test_large_cpu_matmul_fuses_dequantization():
  """A CPU matmul large enough to pack its right operand into strips (compiler/pack.py) leaves a quantized weight alone:
  the product reads the blocks, no kernel stores the float32 weight."""
  rows, cols = 512, 512    # n * k * m = 2**20 with n = 4: where pack.py's matmul_pack_width starts packing
  raw, w = weight("Q4_0", rows, cols)
  x = np.random.default_rng(2).standard_normal((4, cols)).astype(np.float32)
  W = dequantize(Tensor(raw.reshape(-1), dtype=dtypes.uint8, device="CPU"), "Q4_0", (rows, cols))
  items = (Tensor(x, device="CPU") @ W.T).schedule()
  assert max(item.bufs[0].nbytes for item in items) < rows * cols * 4


# ---------------- reading files written by gguf-py ----------------

METADATA = [   # key, gguf-py writer method or value type, value
  ("t.u8", "add_uint8", 200), ("t.i8", "add_int8", -100), ("t.u16", "add_uint16", 60000),
  ("t.i16", "add_int16", -30000), ("t.u32", "add_uint32", 4_000_000_000), ("t.i32", "add_int32", -2_000_000_000),
  ("t.f32", "add_float32", 0.1), ("t.bool", "add_bool", True), ("t.false", "add_bool", False),
  ("t.str", "add_string", "héllo wörld ✓"),   # (gguf-py skips an empty string value)
  ("t.u64", "add_uint64", 2**64 - 1), ("t.i64", "add_int64", -2**63), ("t.f64", "add_float64", 1 / 3),
  ("t.tokens", "add_array", ["<s>", "</s>", "▁the", "", "日本", "\n"] + [f"tok{i}" for i in range(2000)]),
  ("t.ints", "add_array", [1, -2, 3]), ("t.floats", "add_array", [0.5, -1.25]), ("t.bools", "add_array", [True, False]),
  ("t.nested", "add_array", [[1, 2], [3], [4, 5, 6]]), ("t.nested_str", "add_array", [["a", "b"], ["c"]]),
  ("t.u32s", VT.UINT32, [1, 2, 2**32 - 1]), ("t.i64s", VT.INT64, [-2**63, 2**63 - 1]),
]
TENSOR_TYPES = ("F32", "F16", "BF16", *QUANTIZABLE, *K_QUANTS)


def expected_value(method, value):
  if method in ("add_float32",): return float(np.float32(value))
  if method == "add_array" and value and isinstance(value[0], float): return [float(np.float32(v)) for v in value]
  return value


@pytest.fixture(scope="module")
def gguf_py_file(tmp_path_factory):
  """A file gguf-py writes: METADATA, and a tensor of every type in TENSOR_TYPES plus int8/int32 ones."""
  path = tmp_path_factory.mktemp("gguf") / "model.gguf"
  w = gguf.GGUFWriter(path, "llama")
  for key, how, value in METADATA:
    if isinstance(how, VT): w.add_key_value(key, value, VT.ARRAY, sub_type=how)
    else: getattr(w, how)(key, value)
  raws = {}
  for i, name in enumerate(TENSOR_TYPES):
    shape = (4, 2 * BY_NAME[name].block_size) if name != "F32" else (3, 5, 8)
    raws[name] = raw = sample_raw(name, shape, seed=i)
    w.add_tensor(f"w.{name}", raw, raw_dtype=QT[name])
  ints = {"i.I8": np.arange(-6, 6, dtype=np.int8).reshape(3, 4), "i.I32": np.arange(10, dtype=np.int32) * -7}
  for k, v in ints.items(): w.add_tensor(k, v)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return path, raws, ints


def test_reads_gguf_py_metadata(gguf_py_file):
  path, _, _ = gguf_py_file
  with GGUFFile(path) as f:
    assert f.version == 3 and f.alignment == 32 and f.data_start % 32 == 0
    assert f.metadata["general.architecture"] == "llama"
    for key, how, value in METADATA:
      got = f.metadata[key]
      assert got == expected_value(how, value), key
      assert type(got) is type(value), key                # bools stay bools, ints ints


def test_reads_gguf_py_tensors(gguf_py_file):
  path, raws, ints = gguf_py_file
  reference = {t.name: t for t in gguf.GGUFReader(path).tensors}
  with GGUFFile(path) as f:
    assert list(f.tensors) == [f"w.{n}" for n in TENSOR_TYPES] + list(ints)
    for name, info in f.tensors.items():
      ref = reference[name]
      assert info.type_name == ref.tensor_type.name and info.ggml_type == int(ref.tensor_type)
      assert info.shape == tuple(int(d) for d in reversed(ref.shape)), name      # ggml's ne is reversed
      assert info.offset == ref.data_offset and info.nbytes == ref.n_bytes
      raw = f.raw(name)
      assert raw.dtype == np.uint8 and not raw.flags.writeable and not raw.flags.owndata   # a view of the map
      expect = raws[name[2:]] if name.startswith("w.") else ints[name]
      assert raw.tobytes() == np.ascontiguousarray(expect).tobytes(), name


def test_load_gguf_tensors(gguf_py_file):
  path, raws, ints = gguf_py_file
  metadata, tensors = load_gguf(path, device="CPU")
  assert metadata["t.u32"] == 4_000_000_000
  with GGUFFile(path) as f:
    assert list(tensors) == list(f.tensors)
    sizes = {name: i.nbytes for name, i in f.tensors.items()}
  for name, t in tensors.items():
    tname = name[2:]
    if tname in ("F32", "F16", "BF16"):
      assert t.dtype == {"F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16}[tname]
      np.testing.assert_array_equal(t.numpy().astype(np.float32), gguf.quants.dequantize(raws[tname], QT[tname]))
    elif name in ints:
      assert t.dtype == {"i.I8": dtypes.int8, "i.I32": dtypes.int32}[name]
      np.testing.assert_array_equal(t.numpy(), ints[name])
    else:   # quantized: lazy, over one uint8 buffer holding exactly the file's blocks
      buffers = [u for u in t.uop.toposort() if u.op is Ops.BUFFER]
      blocks = [b for b in buffers if b.dtype == dtypes.uint8]
      assert len(blocks) == 1 and blocks[0].arg.nbytes == sizes[name]
      # besides the blocks at most a constant table (Q5_0/Q5_1: 8 floats, ggml_quants._bits), no copy of the weights
      assert all(b.arg.nbytes <= 32 for b in buffers if b is not blocks[0]), buffers
      np.testing.assert_array_equal(t.numpy(), gguf.quants.dequantize(raws[tname], QT[tname]))


def test_types_it_cannot_dequantize(tmp_path):
  """A Q2_K tensor (gguf-py writes it): GGUFFile reads its info and bytes; load_gguf says it cannot dequantize it."""
  path = tmp_path / "q2k.gguf"
  blocks = np.random.default_rng(0).integers(0, 256, size=(2, 2 * 84), dtype=np.uint8)
  w = gguf.GGUFWriter(path, "llama")
  w.add_tensor("w", blocks, raw_dtype=QT.Q2_K)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  with GGUFFile(path) as f:
    assert f.tensors["w"].shape == (2, 512) and f.tensors["w"].type_name == "Q2_K"
    assert f.raw("w").tobytes() == blocks.tobytes()
  with pytest.raises(GGUFError, match="tensor 'w': ggml type Q2_K cannot be dequantized here"):
    load_gguf(path, device="CPU")


def test_version_2_and_alignment(tmp_path):
  """Version 2 has the same layout as 3; general.alignment moves the data section and every offset."""
  raw = sample_raw("Q8_0", (2, 64))
  for version, alignment in ((2, 32), (3, 64), (3, 1)):
    path = tmp_path / f"v{version}_{alignment}.gguf"
    write_gguf(path, {"a": np.uint8(1)}, {"x": np.ones(3, np.float32), "q": (raw, "Q8_0", (2, 64))}, version=version,
               alignment=alignment)
    with GGUFFile(path) as f:
      assert f.version == version and f.alignment == alignment
      assert f.metadata.get("general.alignment", 32) == alignment
      assert all(i.offset % alignment == 0 for i in f.tensors.values()) and f.data_start % alignment == 0
      assert f.raw("q").tobytes() == raw.tobytes()
    ref = gguf.GGUFReader(path)
    assert ref.alignment == alignment and ref.tensors[1].data.tobytes() == raw.tobytes()


def test_writer_round_trips_through_gguf_reader(tmp_path):
  metadata = {
    "general.architecture": "llama", "n": 7, "big": 2**40, "huge": 2**64 - 1, "eps": 1e-5, "flag": True,
    "u16": np.uint16(65535), "i8": np.int8(-128), "f64": np.float64(0.1), "u64": np.uint64(3), "u32": np.uint32(9),
    "words": ["a", "bé", ""], "ids": [3, -1, 2**33], "scores": np.array([0.5, -1.0], np.float32),
    "mask": [True, False, True],
  }
  types = {"general.architecture": VT.STRING, "n": VT.INT32, "big": VT.INT64, "huge": VT.UINT64, "eps": VT.FLOAT32,
           "flag": VT.BOOL, "u16": VT.UINT16, "i8": VT.INT8, "f64": VT.FLOAT64, "u64": VT.UINT64, "u32": VT.UINT32,
           "words": VT.STRING, "ids": VT.INT64, "scores": VT.FLOAT32, "mask": VT.BOOL}
  q4k = random_blocks("Q4_K", 2)
  f16 = np.arange(12, dtype=np.float16).reshape(3, 4)
  tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": f16, "c": (q4k.tobytes(), QT.Q4_K, (2, 256))}
  path = tmp_path / "ours.gguf"
  write_gguf(path, metadata, tensors)
  ref = gguf.GGUFReader(path)
  for key, value in metadata.items():
    field = ref.fields[key]
    assert field.types[-1] == types[key], key
    want = value.tolist() if isinstance(value, np.ndarray) else value
    got = field.contents()
    if types[key] == VT.FLOAT32: want = np.float32(want).tolist()
    assert got == want, key
  got = {t.name: t for t in ref.tensors}
  np.testing.assert_array_equal(got["a"].data, tensors["a"])
  np.testing.assert_array_equal(got["b"].data, f16)
  assert got["c"].tensor_type == QT.Q4_K and got["c"].data.tobytes() == q4k.tobytes()
  assert [int(d) for d in got["c"].shape] == [256, 2]
  with GGUFFile(path) as f:   # and our reader
    assert f.metadata["words"] == ["a", "bé", ""] and f.metadata["ids"] == [3, -1, 2**33]
    assert f.metadata["huge"] == 2**64 - 1 and f.metadata["mask"] == [True, False, True]


def test_writer_rejects_bad_input(tmp_path):
  path = tmp_path / "x.gguf"
  with pytest.raises(GGUFError, match="tensor 'q': Q8_0 of shape \\(1, 32\\) takes 34 bytes, got 3"):
    write_gguf(path, {}, {"q": (b"abc", "Q8_0", (1, 32))})
  with pytest.raises(GGUFError, match="different types"):
    write_gguf(path, {"k": [1, "a"]}, {})
  with pytest.raises(GGUFError, match="cannot store a dict"):
    write_gguf(path, {"k": {}}, {})
  with pytest.raises(GGUFError, match="power of two"):
    write_gguf(path, {}, {}, alignment=48)
  assert not path.exists()


def test_big_endian_file_is_named(tmp_path):
  path = tmp_path / "be.gguf"
  w = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  with pytest.raises(GGUFError, match="big-endian"):
    GGUFFile(path)


# ---------------- malformed files ----------------

def s(text) -> bytes:
  b = text.encode() if isinstance(text, str) else text
  return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes: return s(key) + struct.pack("<I", vtype) + payload


def array(etype: int, count: int, payload: bytes = b"") -> bytes: return struct.pack("<IQ", etype, count) + payload


def info(name, ne, ttype: int, offset: int) -> bytes:
  dims = b"".join(struct.pack("<Q", n) for n in ne)
  return s(name) + struct.pack("<I", len(ne)) + dims + struct.pack("<IQ", ttype, offset)


def encode(kvs=None, infos=None, data=None, version=3, n_tensors=None, n_kv=None, magic=b"GGUF", alignment=32,
           pad=True):
  """Independent encoder. Default: GOOD_KVS, GOOD_INFOS and their data; pad=False: the header alone, unpadded."""
  kvs = GOOD_KVS if kvs is None else kvs
  infos = GOOD_INFOS if infos is None else infos
  data = GOOD_DATA if data is None else data
  head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                             len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
  return head + b"\0" * (-len(head) % alignment) + data if pad else head


GOOD_KVS = [kv("general.architecture", 8, s("llama")), kv("tokens", 9, array(8, 3, s("a") + s("bb") + s("é"))),
            kv("n", 4, struct.pack("<I", 5))]
GOOD_INFOS = [info("w", [4, 2], 0, 0), info("q", [32], 8, 32)]       # F32 (2, 4); Q8_0 (32,)
GOOD_DATA = np.arange(8, dtype=np.float32).tobytes() + random_blocks("Q8_0", 1).tobytes()


@pytest.fixture
def from_bytes(tmp_path):
  """open(data): write `data` to a file and open it with GGUFFile; open.path is that file."""
  path = tmp_path / "case.gguf"
  def open_(data: bytes) -> GGUFFile:
    path.write_bytes(data)
    return GGUFFile(path)
  open_.path = path
  return open_


def test_good_encoding_reads(from_bytes):
  """The encoder's baseline file is valid (so each case below fails for its own reason)."""
  with from_bytes(encode()) as f:
    assert f.metadata == {"general.architecture": "llama", "tokens": ["a", "bb", "é"], "n": 5}
    assert {n: i.shape for n, i in f.tensors.items()} == {"w": (2, 4), "q": (32,)}
    np.testing.assert_array_equal(f.raw("w").view(np.float32), np.arange(8))


def nest(depth: int) -> bytes:
  return array(9, 1, nest(depth - 1)) if depth else array(4, 0)


BAD = [
  ("empty", lambda: b"", "the file is empty"),
  ("short", lambda: b"GGU", "magic: needs 4 bytes at offset 0, but the file ends at 3"),
  ("bad_magic", lambda: encode(magic=b"GGML"), "starts with b'GGML', not b'GGUF'"),
  ("version_1", lambda: encode(version=1), "GGUF version 1"),
  ("version_4", lambda: encode(version=4), "version 4 is not supported"),
  ("version_0", lambda: encode(version=0), "version 0 is not supported"),
  ("big_endian_version", lambda: encode(version=3 << 24), "big-endian"),
  ("truncated_counts", lambda: encode()[:12], "tensor count: needs 8 bytes at offset 8"),
  ("huge_kv_count", lambda: encode(n_kv=2**63), "need at least"),
  ("huge_tensor_count", lambda: encode(n_tensors=2**40), "need at least"),
  ("key_past_end", lambda: encode(kvs=[struct.pack("<Q", 100) + b"general.name" + b"\0" * 8], infos=[], pad=False),
   "metadata entry 0 key: needs 100 bytes at offset 32, but the file ends at 52"),
  ("value_past_end", lambda: encode(kvs=GOOD_KVS + [kv("x", 8, struct.pack("<Q", 10_000) + b"abc")], infos=[],
                                    pad=False),
   "metadata key 'x': needs 10000 bytes"),
  ("string_over_limit", lambda: encode(kvs=[kv("x", 8, struct.pack("<Q", 2**62))]), "string length 4611686018427387904 "
   "is over the 268435456-byte limit"),
  ("key_over_limit", lambda: encode(kvs=[struct.pack("<Q", 70_000) + b"k" * 70_000 + struct.pack("<IB", 0, 1)]),
   "string length 70000 is over the 65535-byte limit"),
  ("huge_array_count", lambda: encode(kvs=[kv("x", 9, array(4, 2**62))]), f"over the {MAX_ARRAY}-element limit"),
  ("array_count_past_end", lambda: encode(kvs=[kv("x", 9, array(4, 1_000_000))]),
   "array of 1000000 UINT32 values needs at least 4000000 bytes"),
  ("string_array_count_past_end", lambda: encode(kvs=[kv("x", 9, array(8, 1_000_000, s("a")))]),
   "array of 1000000 STRING values needs at least 8000000 bytes"),
  ("string_in_array_past_end", lambda: encode(kvs=[kv("x", 9, array(8, 2, s("a") + struct.pack("<Q", 9999)))],
                                               infos=[], pad=False), "metadata key 'x'[1]: needs 9999 bytes"),
  ("deep_nesting", lambda: encode(kvs=[kv("x", 9, nest(50))]), "arrays nested more than 8 deep"),
  ("unknown_value_type", lambda: encode(kvs=[kv("x", 13, b"\0" * 8)]), "metadata key 'x': unknown value type 13"),
  ("unknown_array_type", lambda: encode(kvs=[kv("x", 9, array(42, 1))]), "unknown array element type 42"),
  ("bool_2", lambda: encode(kvs=[kv("x", 7, b"\x02")]), "BOOL value is 2, must be 0 or 1"),
  ("bool_array_3", lambda: encode(kvs=[kv("x", 9, array(7, 3, b"\x01\x00\x03"))]), "BOOL array holds 3"),
  ("key_not_utf8", lambda: encode(kvs=[kv(b"k\xff", 4, b"\0" * 4)]), "metadata entry 0 key: string is not valid UTF-8"),
  ("value_not_utf8", lambda: encode(kvs=[kv("x", 9, array(8, 1, s(b"\xc3")))]),
   "metadata key 'x'[0]: string is not valid UTF-8"),
  ("duplicate_key", lambda: encode(kvs=GOOD_KVS + [kv("n", 4, b"\0" * 4)]), "metadata key 'n': the key appears twice"),
  ("alignment_not_pow2", lambda: encode(kvs=[kv("general.alignment", 4, struct.pack("<I", 48))]),
   "alignment 48 is not a power of two"),
  ("alignment_zero", lambda: encode(kvs=[kv("general.alignment", 4, struct.pack("<I", 0))]),
   "alignment 0 is not a power of two"),
  ("alignment_int32", lambda: encode(kvs=[kv("general.alignment", 5, struct.pack("<i", 32))]),
   "must be a UINT32, got INT32"),
  ("n_dims_5", lambda: encode(infos=[info("w", [2, 2, 1, 1, 2], 0, 0)]), "tensor 'w': n_dims is 5, more than ggml's 4"),
  ("negative_dim", lambda: encode(infos=[info("w", [2**64 - 1], 0, 0)]), "tensor 'w': dimensions"),
  ("product_overflow", lambda: encode(infos=[info("w", [2**40, 2**40, 0], 0, 0)]),
   "tensor 'w': shape (0, 1099511627776, 1099511627776) is too large"),
  ("name_too_long", lambda: encode(infos=[info("w" * 65, [1], 0, 0)]), "over the 64-byte limit"),
  ("unknown_type", lambda: encode(infos=[info("w", [8], 99, 0)]), "tensor 'w': unknown ggml type 99"),
  ("removed_type", lambda: encode(infos=[info("w", [8], 4, 0)]), "tensor 'w': unknown ggml type 4"),
  ("partial_block", lambda: encode(infos=[info("q", [16], 8, 0)]), "tensor 'q': Q8_0: the innermost dimension 16"),
  ("misaligned_offset", lambda: encode(infos=[info("w", [4, 2], 0, 8)]),
   "tensor 'w': data offset 8 is not a multiple of the alignment 32"),
  ("tensor_past_eof", lambda: encode(infos=[GOOD_INFOS[0], info("q", [32], 8, 4096)]),
   "tensor 'q': data [4096, 4130) of the data section runs past the end of the file"),
  ("huge_offset", lambda: encode(infos=[info("w", [4, 2], 0, 2**64 - 32)]), "runs past the end of the file"),
  ("truncated_data", lambda: encode()[:-1], "tensor 'q': data [32, 66) of the data section runs past the end"),
  ("duplicate_name", lambda: encode(infos=[GOOD_INFOS[0], info("w", [4, 2], 0, 32)]),
   "tensor 'w': the name appears twice"),
  ("overlap", lambda: encode(infos=[GOOD_INFOS[0], info("w2", [4], 0, 0)]),
   "tensor 'w': data [0, 32) overlaps the data [0, 16) of tensor 'w2'"),
  ("truncated_tensor_info", lambda: encode(pad=False)[:-5], "tensor 'q' (offset): needs 8 bytes"),
]


@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_rejects_malformed(from_bytes, name, make, message):
  with pytest.raises(GGUFError) as e:
    from_bytes(make())
  text = str(e.value)
  assert message in text, text
  assert text.startswith(f"{from_bytes.path}: ")   # names the file
  assert len(text) < 600 and isinstance(e.value, ValueError)


def test_every_truncation_is_an_error(from_bytes):
  """Cutting the file anywhere before the end of the last tensor's data is a GGUFError that says the file ends."""
  data = encode(kvs=GOOD_KVS + [kv("nested", 9, array(9, 2, array(8, 1, s("x")) + array(0, 2, b"\1\2"))),
                                kv("f", 12, struct.pack("<d", 0.5))])
  for cut in range(len(data)):
    with pytest.raises(GGUFError) as e:
      from_bytes(data[:cut])
    text = str(e.value)
    assert any(m in text for m in ("truncated", "runs past the end", "the file is empty")), (cut, text)


def test_random_corruption_never_crashes(from_bytes):
  """Random byte changes: the file reads or is a GGUFError; nothing else (no IndexError, MemoryError, hang)."""
  good = bytearray(encode())
  r = np.random.default_rng(11)
  outcomes = set()
  for _ in range(300):
    data = bytearray(good)
    for at in r.integers(0, len(data), size=r.integers(1, 4)): data[at] = r.integers(0, 256)
    try:
      with from_bytes(bytes(data)): outcomes.add("ok")
    except GGUFError: outcomes.add("error")
  assert outcomes == {"ok", "error"}


def test_missing_file_and_tensor(tmp_path, from_bytes):
  with pytest.raises(GGUFError, match="cannot read"):
    GGUFFile(tmp_path / "nope.gguf")
  with pytest.raises(KeyError, match="no tensor 'x'"):
    with from_bytes(encode()) as f: f.raw("x")
