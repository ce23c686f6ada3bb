"""PyTorch checkpoint reader: the files torch 2.13 wrote (tests/fixtures/torch, made by make_torch_fixtures.py) load
bit for bit as torch itself reads them back, with torch's storage sharing, offsets and strides; files written here by
an independent writer (pure-Python pickle + zipfile + struct, no torch) cover the big-endian layout and every kind of
damage; hostile pickles are refused with a TorchLoadError before anything in them runs. Needs no torch."""
import io, os, pickle, random, struct, subprocess, sys, zipfile
import numpy as np
import pytest
from baregrad.tensor import dtypes
from baregrad.tensor import torch_load as tl
from baregrad.tensor.torch_load import TorchLoadError, load_torch

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "torch")
MARKER = "TORCH_LOAD_PAYLOAD_RAN"   # what the fixtures' payload would create in the current directory
MAGIC = 0x1950A86A20F9469CFC6C      # torch/serialization.py (torch 2.13), written here independently of the reader
# torch dtype name -> baregrad dtype, as the tests expect them
BG = {"float32": dtypes.float32, "float16": dtypes.float16, "bfloat16": dtypes.bfloat16, "float64": dtypes.float64,
      "int64": dtypes.int64, "int32": dtypes.int32, "int16": dtypes.int16, "int8": dtypes.int8, "uint8": dtypes.uint8,
      "bool": dtypes.bool, "uint16": dtypes.uint16}


def fixture(name): return os.path.join(FIXTURES, name)


def flatten(obj, prefix=""):
  """path -> leaf, paths as make_torch_fixtures.py writes them."""
  if isinstance(obj, dict):
    for k, v in obj.items(): yield from flatten(v, f"{prefix}/{k}" if prefix else str(k))
  elif isinstance(obj, (list, tuple)):
    for i, v in enumerate(obj): yield from flatten(v, f"{prefix}/{i}" if prefix else str(i))
  else: yield prefix, obj


def assert_bits_equal(t, expected: np.ndarray, dtype_name: str, where: str):
  assert t.dtype == BG[dtype_name], where
  assert t.shape == expected.shape, where
  if dtype_name == "bfloat16":     # torch wrote bf16 as float32: the bf16 bits are its upper half, the rest zero
    bits = expected.astype("<f4").view("<u4")
    assert not (bits & 0xFFFF).any(), where
    np.testing.assert_array_equal(t.bitcast(dtypes.uint16).numpy(), (bits >> 16).astype(np.uint16), err_msg=where)
    return
  got = t.numpy()
  assert got.dtype == expected.dtype, where
  if got.dtype.kind == "f":
    got, expected = got.view(f"u{got.itemsize}"), expected.view(f"u{expected.itemsize}")
  np.testing.assert_array_equal(got, expected, err_msg=where)


def parse(path):
  """The unpickled tree of stand-ins (before tensors are built), to look at storages, offsets and strides."""
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if f.read(4) == b"PK\x03\x04":
      data, _, _ = tl._zip_layout(f, size, path)
      return tl._unpickle(data, path, False, {})
    f.seek(0)
    return tl._legacy_layout(f, size, path)[0]


# ---------------- the files torch wrote ----------------

@pytest.mark.parametrize("name", ["state_dict.pt", "legacy.pt", "linear.bin", "linear_legacy.bin",
                                  pytest.param("float64.pt", marks=pytest.mark.needs_float64)])
def test_fixture_values_match_torch(name):
  expected = np.load(fixture(name.rsplit(".", 1)[0] + ".npz"))
  out = load_torch(fixture(name))
  tensors = {p: v for p, v in flatten(out) if hasattr(v, "dtype") and hasattr(v, "shape")}
  want = {k for k in expected.files if not k.startswith("__")}
  assert set(tensors) == want
  for path, t in tensors.items():
    assert_bits_equal(t, expected[path], str(expected[f"__dtype__/{path}"]), f"{name}: {path}")


@pytest.mark.parametrize("name", ["state_dict.pt", "legacy.pt"])
def test_fixture_containers_and_scalars(name):
  out = load_torch(fixture(name))
  assert type(out) is dict
  nested = out["nested"]
  assert type(nested["list"]) is list and nested["list"][1:] == [7, "seven"]
  assert type(nested["tuple"]) is tuple and nested["tuple"][1] == 1.5
  assert nested["meta"] == {"epoch": 3, "name": "run-1", "none": None}
  assert out["scalar"].shape == () and out["scalar"].numpy() == np.float32(3.25)
  assert out["empty"].shape == (0, 3) and out["empty"].numpy().size == 0


@pytest.mark.parametrize("name", ["state_dict.pt", "legacy.pt"])
def test_fixture_layout_matches_torch(name):
  """Offsets and strides as torch has them, and the tensors that share a storage in torch share one here."""
  expected = np.load(fixture(name.rsplit(".", 1)[0] + ".npz"))
  refs = dict(flatten(parse(fixture(name))))
  storage_of = {}
  for path in (k for k in expected.files if not k.startswith("__")):
    ref = refs[path]
    assert isinstance(ref, tl._TensorRef), path
    layout = expected[f"__layout__/{path}"].tolist()
    assert (ref.offset, tuple(ref.stride)) == (layout[0], tuple(layout[1:])), path
    assert tuple(ref.size) == expected[path].shape, path
    storage_of.setdefault(int(expected[f"__storage__/{path}"]), set()).add(id(ref.storage))
  assert all(len(ids) == 1 for ids in storage_of.values())                       # one torch storage -> one here
  assert len({next(iter(ids)) for ids in storage_of.values()}) == len(storage_of)  # and distinct ones stay distinct
  shared = {id(refs[k].storage) for k in ("shared_a", "shared_b", "shared_every3")}
  assert len(shared) == 1 and refs["transposed"].stride == (1, 5) and refs["expanded"].stride == (1, 0)


def test_linear_is_an_ordered_dict():
  out = load_torch(fixture("linear.bin"))
  assert type(out).__name__ == "OrderedDict" and list(out) == ["weight", "bias"]
  assert out["weight"].shape == (3, 4) and out["bias"].shape == (3,)


# ---------------- hostile pickles ----------------

@pytest.mark.parametrize("name", ["malicious_zip.pt", "malicious_legacy.pt"])
def test_malicious_fixture_is_refused_and_not_run(name, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(TorchLoadError, match=r"global 'posix\.system'.*may be malicious"):
    load_torch(fixture(name))
  assert not (tmp_path / MARKER).exists()


def test_malicious_fixture_payload_is_live(tmp_path):
  """The control: plain pickle on the same bytes does run the payload, so the test above can fail."""
  code = ("import pickle, sys, zipfile\n"
          "data = zipfile.ZipFile(sys.argv[1]).read('malicious_zip/data.pkl')\n"
          "pickle.loads(data)\n")
  subprocess.run([sys.executable, "-c", code, fixture("malicious_zip.pt")], cwd=tmp_path, check=True,
                 capture_output=True, timeout=60)
  assert (tmp_path / MARKER).exists()


class Global:
  """A module.name reference, written as a GLOBAL opcode without importing it."""
  def __init__(self, module, name): self.module, self.name = module, name
  def __call__(self, *args): raise AssertionError("never called")


class Call:
  """Written as func(*args): a REDUCE."""
  def __init__(self, func, *args): self.func, self.args = func, args
  def __reduce__(self): return (self.func, self.args)


class Pid:
  """Written as a persistent id (BINPERSID) holding `pid`."""
  def __init__(self, *pid): self.pid = pid


class Writer(pickle._Pickler):   # the pure-Python pickler, so GLOBAL can be emitted for names that do not exist here
  dispatch = pickle._Pickler.dispatch.copy()
  def save_global_ref(self, obj):
    self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
    self.memoize(obj)
  dispatch[Global] = save_global_ref
  def persistent_id(self, obj): return obj.pid if isinstance(obj, Pid) else None


def dumps(obj, protocol=2) -> bytes:
  f = io.BytesIO()
  Writer(f, protocol).dump(obj)
  return f.getvalue()


ODICT = Global("collections", "OrderedDict")


def storage(cls, key, numel, legacy=False):
  return Pid("storage", Global("torch", cls), key, "cpu", numel, *((None,) if legacy else ()))


def tensor(st, offset, size, stride, func="_rebuild_tensor_v2", *extra):
  return Call(Global("torch._utils", func), st, offset, tuple(size), tuple(stride), False, Call(ODICT), *extra)


def make_zip(path, data_pkl, storages=None, top="archive", byteorder=b"little", version=b"3\n", compress=None,
             extra=None):
  """A zip laid out like torch's, written by Python's zipfile (stored members, no alignment or data descriptors)."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
    if data_pkl is not None: z.writestr(f"{top}/data.pkl", data_pkl)
    if byteorder is not None: z.writestr(f"{top}/byteorder", byteorder)
    if version is not None: z.writestr(f"{top}/version", version)
    for key, raw in (storages or {}).items():
      z.writestr(f"{top}/data/{key}", raw, compress_type=compress)
    for name, raw in (extra or {}).items(): z.writestr(f"{top}/{name}", raw)
  return path


def make_legacy(path, obj, records, keys=None, magic=MAGIC, tail=b""):
  """records: key -> (numel, raw bytes)."""
  sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
  parts = [dumps(magic), dumps(1001), dumps(sys_info), dumps(obj), dumps(list(records) if keys is None else keys)]
  parts += [struct.pack("<q", n) + raw for n, raw in records.values()]
  path.write_bytes(b"".join(parts) + tail)
  return path


def rejects(path, *patterns):
  with pytest.raises(TorchLoadError) as info: load_torch(path)
  for p in patterns: assert p in str(info.value), (p, str(info.value))
  return str(info.value)


@pytest.mark.parametrize("module,name", [("os", "system"), ("posix", "system"), ("builtins", "eval"),
                                         ("__builtin__", "exec"), ("subprocess", "Popen"), ("builtins", "getattr"),
                                         ("torch", "load"), ("collections", "Counter")])
def test_globals_outside_the_allowlist_are_refused(tmp_path, monkeypatch, module, name):
  monkeypatch.chdir(tmp_path)
  payload = Call(Global(module, name), f"touch {MARKER}")
  rejects(make_zip(tmp_path / "a.pt", dumps({"w": payload})), f"'{module}.{name}'", "may be malicious", "not loaded")
  rejects(make_legacy(tmp_path / "b.pt", {"w": payload}, {}), f"'{module}.{name}'", "may be malicious")
  assert not (tmp_path / MARKER).exists()


def test_refused_wherever_the_global_hides(tmp_path):
  os_system = Global("os", "system")
  hidden = [
    {"w": tensor(storage("FloatStorage", "0", 1), 0, (1,), (1,)), "x": [1, {"y": (os_system,)}]},
    {"w": Pid("storage", os_system, "0", "cpu", 1)},                                   # as the storage class
    {"w": Call(Global("torch._utils", "_rebuild_tensor_v2"), Call(os_system, "true"), 0, (1,), (1,), False, {})},
  ]
  for i, obj in enumerate(hidden):
    rejects(make_zip(tmp_path / f"{i}.pt", dumps(obj), {"0": b"\0" * 4}), "'os.system'", "may be malicious")
  # protocol 4 names globals with STACK_GLOBAL, from strings the pickle pushes itself
  stack_global = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."
  rejects(make_zip(tmp_path / "sg.pt", stack_global), "'os.system'")


def test_unsupported_torch_objects_are_named(tmp_path):
  q = Call(Global("torch._utils", "_rebuild_qtensor"), 1, 2)
  rejects(make_zip(tmp_path / "q.pt", dumps({"q": q})), "_rebuild_qtensor", "quantized tensor")
  complex_t = tensor(storage("ComplexFloatStorage", "0", 2), 0, (2,), (1,))
  rejects(make_zip(tmp_path / "c.pt", dumps({"c": complex_t}), {"0": b"\0" * 16}), "tensor 'c'", "complex64")
  module = make_legacy(tmp_path / "m.pt", {"m": Pid("module", 1, 2, 3)}, {})
  rejects(module, "nn.Module", "state_dict()")


def test_pickles_that_would_crash_or_exhaust_the_unpickler(tmp_path):
  """Each of these, given to CPython's C unpickler as is, crashes it (deep tuples as a dict key overflow the C stack
  when hashed), makes it allocate gigabytes (a far memo index) or take quadratic time (colliding keys)."""
  deep_key = b"\x80\x02}" + b")" + b"\x85" * 200_000 + b"K\x01s."
  rejects(make_zip(tmp_path / "deep.pt", deep_key), "nested more than 64")
  far_memo = b"\x80\x02}r\x00\x00\x00\x40."     # LONG_BINPUT 2**30
  rejects(make_zip(tmp_path / "memo.pt", far_memo), "memo index 1073741824")
  collide = dumps({float(2 ** 61 - 1) * k: 0 for k in range(1, 4)})
  rejects(make_zip(tmp_path / "float_keys.pt", collide), "SETITEMS", "collide")
  rejects(make_zip(tmp_path / "big_int_keys.pt", dumps({(2 ** 61 - 1) * 3: 0})), "collide")
  rejects(make_zip(tmp_path / "tuple_keys.pt", dumps({(1, 2): 0})), "collide")
  rejects(make_zip(tmp_path / "ext.pt", b"\x80\x02\x82\x01."), "EXT1")
  huge_bytearray = b"\x80\x05\x96" + struct.pack("<Q", 1 << 40) + b"."         # BYTEARRAY8 of 1 TiB, 1 byte given
  rejects(make_zip(tmp_path / "bytearray.pt", huge_bytearray), "not a valid pickle")
  rejects(make_zip(tmp_path / "short.pt", b"\x80\x02X\xff\xff\x00\x00ab."), "not a valid pickle")


def test_object_shapes_the_builder_refuses(tmp_path):
  cycle = b"\x80\x02]q\x00h\x00a."                  # a list that holds itself
  rejects(make_zip(tmp_path / "cycle.pt", cycle), "cycle")
  deep = b"\x80\x02" + b"]" * 1000 + b"a" * 999 + b"."
  rejects(make_zip(tmp_path / "deep.pt", deep), "nested more than 64")
  bare = {"s": storage("FloatStorage", "0", 1)}
  rejects(make_zip(tmp_path / "bare.pt", dumps(bare), {"0": b"\0" * 4}), "entry 's'", "bare storage")
  setstate = Call(Global("torch._utils", "_rebuild_tensor_v2"))
  rejects(make_zip(tmp_path / "args.pt", dumps({"w": setstate})), "_rebuild_tensor_v2 is called with 0 arguments")


def test_build_cannot_change_the_reader(tmp_path):
  """BUILD sets attributes on the object below it; on what find_class hands out it must fail, not stick."""
  for i, (module, name) in enumerate([("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"),
                                      ("__builtin__", "complex"), ("__builtin__", "set"), ("torch", "FloatStorage"),
                                      ("torch", "float32")]):
    state = b"N}X\x0c\x00\x00\x00__defaults__K\x01s\x86"       # (None, {"__defaults__": 1}): a slot state
    data = b"\x80\x02c" + f"{module}\n{name}\n".encode() + state + b"b."
    rejects(make_zip(tmp_path / f"{i}.pt", data))
  assert tl._GLOBALS["torch._utils", "_rebuild_tensor_v2"].function is tl._rebuild_tensor_v2
  assert tl._set.__defaults__ == ((),) and not hasattr(tl._StateDict, "__defaults__")
  assert load_torch(fixture("linear.bin"))["weight"].shape == (3, 4)


def test_older_spellings(tmp_path):
  """What older torch and Python 2 wrote: _rebuild_tensor (4 args), torch.Size shapes, torch.cuda storage classes,
  bytes and bytearray through _codecs.encode (protocol 2)."""
  raw = np.array([1, 2, 3, 4], dtype="<i4").tobytes()
  size = Call(Global("torch", "Size"), (2, 2))
  obj = {"v1": Call(Global("torch._utils", "_rebuild_tensor"), storage("IntStorage", "0", 4), 0, size, (1, 2)),
         "cuda": tensor(Pid("storage", Global("torch.cuda", "IntStorage"), "0", "cuda:0", 4), 2, (2,), (1,)),
         "shape": size, "blob": b"\x01\xfe", "buf": bytearray(b"ab"), "empty": b""}
  out = load_torch(make_zip(tmp_path / "old.pt", dumps(obj), {"0": raw}))
  np.testing.assert_array_equal(out["v1"].numpy(), [[1, 3], [2, 4]])
  np.testing.assert_array_equal(out["cuda"].numpy(), [3, 4])
  assert out["shape"] == (2, 2) and out["blob"] == b"\x01\xfe"
  assert out["buf"] == bytearray(b"ab") and out["empty"] == b""


# ---------------- files written here, without torch ----------------

def test_independently_written_zip_and_legacy(tmp_path):
  f32 = np.arange(12, dtype="<f4") * 1.5 - 4
  i64 = np.array([-5, 2 ** 50, 7], dtype="<i8")
  bools = np.array([0, 1, 2, 0, 255], dtype=np.uint8)                          # torch writes 0/1; any non-zero is True
  obj = {"m": tensor(storage("FloatStorage", "0", 12), 1, (3, 2), (1, 4)),    # a strided view from offset 1
         "v": tensor(storage("LongStorage", "1", 3), 0, (3,), (1,)),
         "b": tensor(storage("BoolStorage", "2", 5), 0, (5,), (1,)),
         "dt": Global("torch", "bfloat16"), "blob": b"\x00\xff", "s": Call(Global("__builtin__", "set"), [1, 2]),
         "od": Call(ODICT, [["k", 1]])}                                        # Python 2's OrderedDict(pairs)
  raw = {"0": f32.tobytes(), "1": i64.tobytes(), "2": bools.tobytes()}
  want_m = np.lib.stride_tricks.as_strided(f32[1:], (3, 2), (4, 16))
  z = load_torch(make_zip(tmp_path / "a.pt", dumps(obj), raw))
  legacy_obj = {k: v for k, v in obj.items()}
  legacy_obj.update(m=tensor(storage("FloatStorage", "0", 12, True), 1, (3, 2), (1, 4)),
                    v=tensor(storage("LongStorage", "1", 3, True), 0, (3,), (1,)),
                    b=tensor(storage("BoolStorage", "2", 5, True), 0, (5,), (1,)))
  records = {"0": (12, raw["0"]), "1": (3, raw["1"]), "2": (5, raw["2"])}
  lg = load_torch(make_legacy(tmp_path / "b.pt", legacy_obj, records))
  for out in (z, lg):
    np.testing.assert_array_equal(out["m"].numpy(), want_m)
    np.testing.assert_array_equal(out["v"].numpy(), i64)
    np.testing.assert_array_equal(out["b"].numpy(), bools != 0)
    assert out["dt"] == dtypes.bfloat16 and out["blob"] == b"\x00\xff" and out["s"] == {1, 2}
    assert type(out["od"]).__name__ == "OrderedDict" and out["od"] == {"k": 1}


def test_big_endian_zip_is_converted(tmp_path):
  f32 = np.array([1.5, -2.25, 3e38], dtype=">f4")
  i16 = np.array([-2, 300, 32767], dtype=">i2")
  u16 = np.array([1, 65535], dtype=">u2")
  bf16 = np.array([0x3FC0, 0xC2F7], dtype=">u2")                               # 1.5, -123.5
  obj = {"f": tensor(storage("FloatStorage", "0", 3), 0, (3,), (1,)),
         "i": tensor(storage("ShortStorage", "1", 3), 0, (3,), (1,)),
         "u": tensor(Pid("storage", Global("torch.storage", "UntypedStorage"), "2", "cpu", 4), 0, (2,), (1,),
                     "_rebuild_tensor_v3", Global("torch", "uint16")),
         "h": tensor(storage("BFloat16Storage", "3", 2), 0, (2,), (1,))}
  raw = {"0": f32.tobytes(), "1": i16.tobytes(), "2": u16.tobytes(), "3": bf16.tobytes()}
  out = load_torch(make_zip(tmp_path / "be.pt", dumps(obj), raw, byteorder=b"big"))
  np.testing.assert_array_equal(out["f"].numpy(), f32.astype("<f4"))
  np.testing.assert_array_equal(out["i"].numpy(), i16.astype("<i2"))
  np.testing.assert_array_equal(out["u"].numpy(), u16.astype("<u2"))
  assert out["u"].dtype == dtypes.uint16
  np.testing.assert_array_equal(out["h"].bitcast(dtypes.uint16).numpy(), bf16.astype("<u2"))
  np.testing.assert_array_equal(out["h"].numpy().astype(np.float32), [1.5, -123.5])


def test_not_a_dict_of_tensors_is_returned_as_it_is(tmp_path):
  obj = [tensor(storage("IntStorage", "0", 2), 0, (2,), (1,)), 3, ("x", None, 2.5, 1j)]
  out = load_torch(make_zip(tmp_path / "l.pt", dumps(obj), {"0": np.array([4, -4], "<i4").tobytes()}))
  assert type(out) is list and out[1:] == [3, ("x", None, 2.5, 1j)]
  np.testing.assert_array_equal(out[0].numpy(), [4, -4])
  assert load_torch(make_zip(tmp_path / "i.pt", dumps(42))) == 42
  top = load_torch(make_zip(tmp_path / "t.pt", dumps(tensor(storage("HalfStorage", "0", 1), 0, (), ())),
                            {"0": np.float16(0.5).tobytes()}))
  assert top.shape == () and top.numpy() == np.float16(0.5)


def test_wrappers_are_returned_as_they_are(tmp_path):
  inner = Call(ODICT)
  obj = {"state_dict": {"w": tensor(storage("FloatStorage", "0", 1), 0, (1,), (1,))}, "epoch": 4, "model": inner}
  out = load_torch(make_zip(tmp_path / "ck.pt", dumps(obj), {"0": np.float32(2).tobytes()}))
  assert list(out) == ["state_dict", "epoch", "model"] and out["epoch"] == 4 and out["model"] == {}
  assert out["state_dict"]["w"].numpy().tolist() == [2.0]


# ---------------- damaged files ----------------

def test_damaged_zip_files(tmp_path):
  good = open(fixture("state_dict.pt"), "rb").read()
  (tmp_path / "half.pt").write_bytes(good[:len(good) // 2])
  rejects(tmp_path / "half.pt", "not a readable zip archive", "truncated or corrupt")
  (tmp_path / "tail.pt").write_bytes(good[:-30])
  rejects(tmp_path / "tail.pt", "not a readable zip archive")
  one = {"w": tensor(storage("FloatStorage", "0", 4), 0, (2, 2), (2, 1))}
  four = np.arange(4, dtype="<f4").tobytes()
  rejects(make_zip(tmp_path / "nopkl.pt", None, {"0": four}), "has no 'archive/data.pkl'", "not a torch.save")
  rejects(make_zip(tmp_path / "jit.pt", None, extra={"constants.pkl": b"", "code/x.py": b""}), "TorchScript")
  rejects(make_zip(tmp_path / "nokey.pt", dumps(one), {"1": four}), "tensor 'w'", "storage '0' has no member")
  past = {"w": tensor(storage("FloatStorage", "0", 4), 1, (2, 2), (2, 1))}       # reaches element 4 of 0..3
  rejects(make_zip(tmp_path / "past.pt", dumps(past), {"0": four}), "tensor 'w'", "reach element 4", "holds 4 float32")
  wide = {"n": {"w": tensor(storage("FloatStorage", "0", 4), 0, (2, 3), (3, 1))}}
  rejects(make_zip(tmp_path / "wide.pt", dumps(wide), {"0": four}), "tensor ['n']['w']", "reach element 5")
  rejects(make_zip(tmp_path / "size.pt", dumps(one), {"0": four + b"\0"}), "holds 17 bytes", "16 bytes")
  rejects(make_zip(tmp_path / "zipped.pt", dumps(one), {"0": four}, compress=zipfile.ZIP_DEFLATED), "is compressed")
  rejects(make_zip(tmp_path / "order.pt", dumps(one), {"0": four}, byteorder=b"middle"), "byteorder record")
  rejects(make_zip(tmp_path / "ver.pt", dumps(one), {"0": four}, version=b"99\n"), "format version")
  rejects(make_zip(tmp_path / "nover.pt", dumps(one), {"0": four}, version=None), "no 'archive/version'")
  rejects(make_zip(tmp_path / "trail.pt", dumps(one) + b"x", {"0": four}), "1 bytes follow")
  huge = 10 ** 5000   # Python 3.11 refuses to print an int this long: the messages must still be made
  bad_views = [   # (offset, size, stride, the field the message names)
    (-1, (2, 2), (2, 1), "offset"), (0, (2, -2), (2, 1), "size"), (0, (2, 2), (1.5, 1), "stride"),
    (0, (2,), (2, 1), "different lengths"), (huge, (2, 2), (2, 1), "offset"), (0, (huge, 1), (1, 1), "size"),
    (0, (2, 2), (1, huge), "stride"), (0, (0, 2 ** 40, 2 ** 40), (1, 1, 1), "non-zero dims")]
  for i, (offset, size, stride, field) in enumerate(bad_views):
    obj = {"w": tensor(storage("FloatStorage", "0", 4), offset, size, stride)}
    rejects(make_zip(tmp_path / f"bad_view{i}.pt", dumps(obj), {"0": four}), "tensor 'w'", field)
  for i, pid in enumerate([("storage", Global("torch", "FloatStorage"), "0", "cpu", huge), ("storage", huge),
                           ("storage", Global("torch", "FloatStorage"), huge, "cpu", 4)]):
    rejects(make_zip(tmp_path / f"pid{i}.pt", dumps({"w": Pid(*pid)}), {"0": four}), "persistent id" if i == 1 else "")
  assert load_torch(make_zip(tmp_path / "value.pt", dumps({"n": huge}))) == {"n": huge}   # as a value it is fine
  two_types = {"a": tensor(storage("FloatStorage", "0", 4), 0, (4,), (1,)),
               "b": tensor(storage("IntStorage", "0", 4), 0, (4,), (1,))}
  rejects(make_zip(tmp_path / "types.pt", dumps(two_types), {"0": four}), "storage '0' is named as")
  conj = {"w": tensor(storage("FloatStorage", "0", 4), 0, (4,), (1,), "_rebuild_tensor_v2", {"conj": True})}
  rejects(make_zip(tmp_path / "conj.pt", dumps(conj), {"0": four}), "metadata")


def test_zip_structure(tmp_path):
  with zipfile.ZipFile(tmp_path / "flat.pt", "w") as z: z.writestr("data.pkl", dumps({}))
  rejects(tmp_path / "flat.pt", "'data.pkl' is not in a folder")
  with pytest.warns(UserWarning, match="Duplicate name"):
    with zipfile.ZipFile(tmp_path / "twice.pt", "w") as z:
      for data in (dumps({}), dumps({"a": 1})): z.writestr("archive/data.pkl", data)
  rejects(tmp_path / "twice.pt", "holds 'archive/data.pkl' twice")
  assert load_torch(make_zip(tmp_path / "named.pt", dumps({"x": 1}), top="my_model")) == {"x": 1}


def test_mutated_files_raise_only_torch_load_error(tmp_path):
  """Bytes flipped, cut out or inserted anywhere in the files torch wrote: each load succeeds or raises a
  TorchLoadError, never another exception."""
  rng = random.Random(11)
  sources = [open(fixture(n), "rb").read() for n in ("state_dict.pt", "legacy.pt", "linear_legacy.bin")]
  for i in range(150):
    data = bytearray(rng.choice(sources))
    at = rng.randrange(len(data))
    change = rng.randrange(3)
    if change == 0: data[at] ^= 1 << rng.randrange(8)
    elif change == 1: del data[at:at + rng.randint(1, 8)]
    else: data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    (tmp_path / "m.pt").write_bytes(bytes(data))
    try: load_torch(tmp_path / "m.pt")
    except TorchLoadError: pass


def test_zip_local_header_past_the_end(tmp_path):
  """The central directory says where a member starts; a file cut inside the data is refused, not read short."""
  one = {"w": tensor(storage("FloatStorage", "0", 4), 0, (4,), (1,))}
  path = make_zip(tmp_path / "z.pt", dumps(one), {"0": np.zeros(4, "<f4").tobytes()})
  data = bytearray(path.read_bytes())
  with zipfile.ZipFile(path) as z: offset = z.getinfo("archive/data/0").header_offset
  data[offset:offset + 4] = b"XXXX"                                                 # break its local header
  path.write_bytes(bytes(data))
  rejects(path, "tensor 'w'", "no local file header")


def test_damaged_legacy_files(tmp_path):
  obj = {"w": tensor(storage("FloatStorage", "7", 4, True), 0, (4,), (1,))}
  four = np.arange(4, dtype="<f4").tobytes()
  ok = load_torch(make_legacy(tmp_path / "ok.pt", obj, {"7": (4, four)}))
  np.testing.assert_array_equal(ok["w"].numpy(), [0, 1, 2, 3])
  rejects(make_legacy(tmp_path / "magic.pt", obj, {"7": (4, four)}, magic=12345), "12345", "not the magic number")
  rejects(make_legacy(tmp_path / "huge.pt", obj, {"7": (4, four)}, magic=10 ** 5000), "an int of 16610 bits")
  good = (tmp_path / "ok.pt").read_bytes()
  (tmp_path / "cut.pt").write_bytes(good[:-3])
  rejects(tmp_path / "cut.pt", "storage '7'", "run past the end", "truncated")
  (tmp_path / "cut_count.pt").write_bytes(good[:-16 - 4])
  rejects(tmp_path / "cut_count.pt", "before its element count")
  rejects(make_legacy(tmp_path / "count.pt", obj, {"7": (5, four + four[:4])}), "holds 5 elements")
  rejects(make_legacy(tmp_path / "tail.pt", obj, {"7": (4, four)}, tail=b"\0"), "1 bytes follow the last storage")
  rejects(make_legacy(tmp_path / "unused.pt", obj, {"7": (4, four), "8": (1, four[:4])}), "'8' is listed but no tensor")
  rejects(make_legacy(tmp_path / "missing.pt", obj, {}), "'7' is used by a tensor but has no record")
  view = {"w": Pid("storage", Global("torch", "FloatStorage"), "7", "cpu", 4, ("8", 0, 2))}
  rejects(make_legacy(tmp_path / "view.pt", view, {"7": (4, four)}), "view of another storage")
  (tmp_path / "sysinfo_only.pt").write_bytes(good[:40])
  rejects(tmp_path / "sysinfo_only.pt")


def test_random_and_odd_bytes(tmp_path):
  rng = random.Random(3)
  cases = {"empty": b"", "one": b"\x80", "text": b"hello world\n" * 10, "pk": b"PK\x03\x04" + b"\0" * 40,
           "tar": b"\0" * 257 + b"ustar" + b"\0" * 300, "none": b"N."}
  cases |= {f"random{i}": bytes(rng.randrange(256) for _ in range(rng.choice([7, 100, 4000]))) for i in range(30)}
  for name, data in cases.items():
    (tmp_path / name).write_bytes(data)
    rejects(tmp_path / name)
  assert "tar checkpoint" in rejects(tmp_path / "tar")
  assert "not the magic number" in rejects(tmp_path / "none")
  assert "cannot read" in rejects(tmp_path / "does_not_exist.pt")
