"""The disk cache (`drivers/diskcache.py`) through its users: C objects from cc.compile_c and BEAM's entries.

References are independent of the code under test: the entry header is decoded here with struct + hashlib from
the documented layout, file modes come from os.stat, a rebuilt object is loaded and its numbers compared with
numpy. Every test points BAREGRAD_CACHE at its own tmp_path, so nothing touches the user's cache.
"""
import hashlib, json, os, stat, struct, warnings
import cffi
import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.drivers.cpu import cc
from baregrad.drivers.cpu.elf import load_elf

ffi = cffi.FFI()

# the documented entry layout: magic, version, reserved, payload length, SHA-256 of the payload; little-endian
HEADER = struct.Struct("<8sIIQ32s")
MAGIC = b"bgcache\x00"

AFFINE_SRC = "void affine_{tag}(float *y, const float *x, int n) {{ for (int i = 0; i < n; i++) y[i] = x[i] * 3.0f + 1.0f; }}\n"


def frame(payload: bytes) -> bytes:
  return HEADER.pack(MAGIC, 1, 0, len(payload), hashlib.sha256(payload).digest()) + payload


def unframe(raw: bytes) -> bytes:
  """The payload of a well-formed entry (asserts every header field)."""
  magic, version, reserved, length, digest = HEADER.unpack_from(raw)
  payload = raw[HEADER.size:]
  assert (magic, version, reserved, length) == (MAGIC, 1, 0, len(payload))
  assert hashlib.sha256(payload).digest() == digest
  return payload


def mode(path) -> int: return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  root = tmp_path / "cache"
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(root))
  monkeypatch.setattr(settings, "CACHE", True)
  monkeypatch.setattr(settings, "XDG_CACHE_HOME", None)
  return root


def check_affine(obj: bytes, tag: str) -> None:
  """Load the object with baregrad's loader and compare what it computes with numpy."""
  image = load_elf(obj)
  try:
    fn = ffi.cast("void(*)(float *, const float *, int)", image.symbol(f"affine_{tag}"))
    x = np.arange(-18, 19, dtype=np.float32) * np.float32(0.5)   # exact with or without a fused multiply-add
    y = np.zeros_like(x)
    fn(ffi.cast("float *", y.ctypes.data), ffi.cast("float *", x.ctypes.data), len(x))
    np.testing.assert_array_equal(y, x * np.float32(3) + np.float32(1))
  finally:
    image.close()


def only_entry(directory):
  files = list(directory.iterdir())
  assert len(files) == 1, files
  return files[0]


# ---------------------------------------------------------------------------------------------------- cc entries

def test_entry_is_framed_with_magic_length_and_hash(cache):
  obj = cc.compile_c(AFFINE_SRC.format(tag="framed"))
  path = only_entry(cache / "cc")
  payload = unframe(path.read_bytes())
  assert payload == obj and obj[:4] == b"\x7fELF"
  assert cc.compile_c(AFFINE_SRC.format(tag="framed")) == obj   # and it is read back


@pytest.mark.parametrize("umask", [0o000, 0o277])
def test_directories_0700_and_entries_0600_whatever_the_umask(tmp_path, monkeypatch, umask):
  root = tmp_path / "made" / "by" / "baregrad"   # missing parents are created too
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(root))
  monkeypatch.setattr(settings, "CACHE", True)
  old = os.umask(umask)
  try:
    obj = cc.compile_c(AFFINE_SRC.format(tag=f"umask{umask:o}"))
  finally:
    os.umask(old)
  for d in (tmp_path / "made", tmp_path / "made" / "by", root, root / "cc"):
    assert mode(d) == 0o700, f"{d}: {mode(d):04o}"
  entry = only_entry(root / "cc")
  assert mode(entry) == 0o600, f"{mode(entry):04o}"
  assert unframe(entry.read_bytes()) == obj


UNSAFE = {
  "root_world_writable": ("", 0o777, "writable by other users"),
  "root_group_writable": ("", 0o770, "writable by other users"),
  "kind_dir_other_writable": ("cc", 0o702, "writable by other users"),
  "symlink_to_world_writable": ("link", 0o777, "a symlink to"),
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_unsafe_directory_is_bypassed_with_one_warning(cache, case):
  sub, perms, message = UNSAFE[case]
  if sub == "link":   # the root is a symlink to a directory others can write
    real = cache.parent / "elsewhere"
    real.mkdir()
    os.chmod(real, perms)
    cache.symlink_to(real)
    unsafe = cache
  else:
    unsafe = cache / sub if sub else cache
    unsafe.mkdir(parents=True)
    os.chmod(unsafe, perms)
  before = dict(cc.stats)
  srcs = [AFFINE_SRC.format(tag=f"unsafe{i}") for i in range(2)]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    objs = [cc.compile_c(src) for src in srcs + srcs]
  ours = [str(w.message) for w in caught if "disk cache" in str(w.message)]
  assert len(ours) == 1, ours                                    # one warning, not one per kernel
  assert message in ours[0] and str(unsafe) in ours[0] and "BAREGRAD_CACHE" in ours[0], ours[0]
  assert cc.stats["compiles"] == before["compiles"] + 4 and cc.stats["cache_hits"] == before["cache_hits"]
  assert not (unsafe / "cc").exists() if unsafe == cache else not any(unsafe.iterdir())   # nothing made there
  check_affine(objs[2], "unsafe0")                               # compiling still works, uncached


def test_directory_of_another_user_is_bypassed(cache, monkeypatch):
  cache.mkdir(mode=0o700)
  me = os.getuid()
  monkeypatch.setattr(os, "getuid", lambda: me + 4242)   # the directory now belongs to "someone else"
  before = dict(cc.stats)
  with pytest.warns(UserWarning, match=rf"owned by uid {me}, not by you \(uid {me + 4242}\)"):
    obj = cc.compile_c(AFFINE_SRC.format(tag="foreign"))
  assert cc.compile_c(AFFINE_SRC.format(tag="foreign")) == obj
  assert cc.stats["compiles"] == before["compiles"] + 2 and cc.stats["cache_hits"] == before["cache_hits"]
  assert not (cache / "cc").exists()
  check_affine(obj, "foreign")


def flip_middle(raw: bytes) -> bytes:
  i = HEADER.size + (len(raw) - HEADER.size) // 2
  return raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]


DAMAGE = {
  "empty": lambda raw: b"",
  "truncated": lambda raw: raw[:len(raw) // 2],
  "header_only": lambda raw: raw[:HEADER.size],
  "flipped_byte": flip_middle,
  "wrong_magic": lambda raw: b"NOTCACHE" + raw[8:],
  "wrong_version": lambda raw: raw[:8] + struct.pack("<I", 99) + raw[12:],
  "length_lies": lambda raw: raw[:16] + struct.pack("<Q", len(raw)) + raw[24:],
  "unframed_object": lambda raw: raw[HEADER.size:],   # a valid object without the header
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_rebuilt(cache, damage):
  tag = f"damaged_{damage}"
  src = AFFINE_SRC.format(tag=tag)
  first = cc.compile_c(src)
  entry = only_entry(cache / "cc")
  entry.write_bytes(DAMAGE[damage](entry.read_bytes()))
  from baregrad.drivers import diskcache
  before, bad_before = dict(cc.stats), diskcache.stats["bad_entries"]
  obj = cc.compile_c(src)
  assert cc.stats["compiles"] == before["compiles"] + 1 and cc.stats["cache_hits"] == before["cache_hits"]
  assert diskcache.stats["bad_entries"] == bad_before + 1
  check_affine(obj, tag)
  assert unframe(entry.read_bytes()) == obj and len(obj) == len(first)   # rewritten whole
  assert cc.compile_c(src) == obj and cc.stats["cache_hits"] == before["cache_hits"] + 1   # and used again
  assert [p.name for p in (cache / "cc").iterdir()] == [entry.name]      # no temp files left


@pytest.mark.parametrize("problem", ["group_writable", "other_owner", "symlink"])
def test_entry_file_that_is_not_ours_is_rebuilt(cache, problem):
  tag = f"notours_{problem}"
  src = AFFINE_SRC.format(tag=tag)
  cc.compile_c(src)
  entry = only_entry(cache / "cc")
  if problem == "group_writable":
    os.chmod(entry, 0o664)
  elif problem == "other_owner":
    if os.getuid() != 0: pytest.skip("chown to another user needs root")
    os.chown(entry, 4242, -1)
  else:   # a link to a well-formed copy elsewhere
    copy = cache.parent / "copy.o"
    copy.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(copy)
  before = dict(cc.stats)
  obj = cc.compile_c(src)
  assert cc.stats["compiles"] == before["compiles"] + 1 and cc.stats["cache_hits"] == before["cache_hits"]
  check_affine(obj, tag)
  assert not entry.is_symlink() and os.stat(entry).st_uid == os.getuid() and mode(entry) == 0o600


def test_unwritable_cache_warns_once_and_compiles(tmp_path, monkeypatch):
  blocker = tmp_path / "a-file"
  blocker.write_bytes(b"not a directory")
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(blocker / "cache"))   # cannot be created: a file is in the way
  monkeypatch.setattr(settings, "CACHE", True)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    objs = [cc.compile_c(AFFINE_SRC.format(tag=f"unwritable{i}")) for i in range(3)]
  ours = [str(w.message) for w in caught]
  assert len(ours) == 1 and "cannot create it" in ours[0], ours
  check_affine(objs[2], "unwritable2")


def test_keys_and_kinds_are_one_path_component(cache):
  from baregrad.drivers import diskcache
  for kind, key in (("cc", "../escape"), ("cc", ".hidden"), ("../cc", "k"), ("cc", "a/b"), ("cc", "")):
    with pytest.raises(ValueError, match="must be 1-128 characters"):
      diskcache.put(kind, key, b"x")
  assert not cache.exists() or not any(cache.rglob("*"))


def test_oversized_entry_is_a_miss(cache, monkeypatch):
  from baregrad.drivers import diskcache
  assert diskcache.put("cc", "big", b"x" * 1000)
  assert diskcache.get("cc", "big") == b"x" * 1000
  monkeypatch.setattr(diskcache, "MAX_ENTRY", 512)   # as if the file were larger than any entry baregrad writes
  assert diskcache.get("cc", "big") is None and not (cache / "cc" / "big").exists()
  with pytest.warns(UserWarning, match="over the 512-byte entry limit"):
    assert not diskcache.put("cc", "big", b"x" * 1000)   # not written, and not an error
  assert not (cache / "cc" / "big").exists()


# ---------------------------------------------------------------------------------------------------- ptxas entries

TRIVIAL_PTX = (".version 8.0\n.target sm_90\n.address_size 64\n"
               ".visible .entry trivial(.param .u64 p)\n{\n  .reg .b64 %rd<2>;\n  ld.param.u64 %rd0, [p];\n"
               "  cvta.to.global.u64 %rd1, %rd0;\n  st.global.u32 [%rd1], 7;\n  ret;\n}\n")


@pytest.mark.parametrize("damage", ["truncated", "flipped_byte"])
def test_damaged_cubin_is_rebuilt(cache, damage):
  from baregrad.drivers.nv import cubin
  try: cubin.find_ptxas()
  except cubin.PtxasNotFound: pytest.skip("no ptxas")
  first = cubin.compile_ptx(TRIVIAL_PTX, "sm_90")
  entry = only_entry(cache / "ptxas")
  assert unframe(entry.read_bytes()) == first
  entry.write_bytes(DAMAGE[damage](entry.read_bytes()))
  before = dict(cubin.stats)
  data = cubin.compile_ptx(TRIVIAL_PTX, "sm_90")
  assert cubin.stats["compiles"] == before["compiles"] + 1 and cubin.stats["cache_hits"] == before["cache_hits"]
  assert unframe(entry.read_bytes()) == data and "trivial" in cubin.load_cubin(data)


# ---------------------------------------------------------------------------------------------------- BEAM entries

@pytest.fixture
def beam_spec():
  from baregrad.tensor import Tensor
  from baregrad.compiler.schedule import normalize
  from baregrad.compiler.rangeify import rangeify, KernelSpec
  from baregrad.hcq.runtime import run_schedule
  if Tensor(1.0).device != "CPU": pytest.skip("BEAM's opts are CPU kernel opts")
  t = Tensor(np.arange(64 * 48, dtype=np.float32).reshape(64, 48)).sum(1) * 2
  items = t.schedule()
  run_schedule(items[:-1], sync=True)
  sink, _, _ = normalize(t.uop.sink())
  return [i for i in rangeify(sink, lambda x: x.device).items if isinstance(i, KernelSpec)][-1]


@pytest.fixture
def timed(monkeypatch):
  """BEAM with a stand-in for the timed runs (more opts: faster): counts the candidates it times."""
  from baregrad.compiler import search
  calls = []
  def fake_time(spec, opts, compile_kernel, repeats=3):
    calls.append(tuple(opts))
    return 1.0 / (1 + len(opts))
  monkeypatch.setattr(search, "time_program", fake_time)
  return calls


def beam_entry(cache):
  return json.loads(unframe(only_entry(cache / "beam").read_bytes()))


def test_beam_entry_is_written_and_reused(cache, beam_spec, timed):
  from baregrad.compiler.search import beam_search, actions
  from baregrad.compiler.codegen import get_program
  from baregrad.compiler.opt import apply_opts, cpu_threads
  opts = beam_search(beam_spec, 2, get_program, depth=2)
  assert timed and len(opts) == 2
  assert beam_entry(cache) == [[o.op, o.axis, o.amount] for o in opts]
  assert opts[0] in actions(beam_spec.ast, cpu_threads()) and apply_opts(beam_spec.ast, opts) is not None
  timed.clear()
  assert beam_search(beam_spec, 2, get_program, depth=2) == opts and not timed   # from the cache: nothing timed


BAD_BEAM = {
  "not_json": b"[[\"UPCAST\", 0,",
  "not_utf8": b"\xff\xfe[]",
  "deeply_nested": b"[" * 100000 + b"]" * 100000,
  "object": b'{"UPCAST": [0, 2]}',
  "flat_list": b'["UPCAST", 0, 2]',
  "axis_is_string": b'[["UPCAST", "0", 2]]',
  "amount_is_bool": b'[["UPCAST", 0, true]]',
  "two_fields": b'[["UPCAST", 0]]',
  "too_long": json.dumps([["UPCAST", 0, 2]] * 1000).encode(),
  "unknown_opt": b'[["WARP", 0, 2]]',
  "axis_out_of_range": b'[["UPCAST", 7, 2]]',
  "amount_does_not_divide": b'[["UPCAST", 0, 3]]',
  "not_a_beam_choice": b'[["UPCAST", 0, 64]]',       # applies, but BEAM upcasts by 2..32 only
  "second_opt_no_longer_applies": b'[["UPCAST", 0, 2], ["UNROLL", 5, 2]]',
}


@pytest.mark.parametrize("bad", list(BAD_BEAM))
def test_beam_entry_that_does_not_apply_is_searched_again(cache, beam_spec, timed, bad):
  from baregrad.compiler.search import beam_search
  from baregrad.compiler.codegen import get_program
  opts = beam_search(beam_spec, 2, get_program, depth=2)
  entry = only_entry(cache / "beam")
  entry.write_bytes(frame(BAD_BEAM[bad]))
  timed.clear()
  assert beam_search(beam_spec, 2, get_program, depth=2) == opts and timed   # a fresh search
  assert beam_entry(cache) == [[o.op, o.axis, o.amount] for o in opts]   # and the entry is rewritten
  timed.clear()
  assert beam_search(beam_spec, 2, get_program, depth=2) == opts and not timed


def test_beam_damaged_entry_is_searched_again(cache, beam_spec, timed):
  from baregrad.compiler.search import beam_search
  from baregrad.compiler.codegen import get_program
  opts = beam_search(beam_spec, 2, get_program, depth=2)
  entry = only_entry(cache / "beam")
  entry.write_bytes(flip_middle(entry.read_bytes()))
  timed.clear()
  assert beam_search(beam_spec, 2, get_program, depth=2) == opts and timed
  assert beam_entry(cache) == [[o.op, o.axis, o.amount] for o in opts]


def test_beam_with_an_unwritable_cache_warns(tmp_path, monkeypatch, beam_spec, timed):
  from baregrad.compiler.search import beam_search
  from baregrad.compiler.codegen import get_program
  blocker = tmp_path / "a-file"
  blocker.write_bytes(b"")
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(blocker / "cache"))
  with pytest.warns(UserWarning, match="cannot create it"):
    opts = beam_search(beam_spec, 2, get_program, depth=2)
  assert timed and len(opts) == 2


def test_beam_with_an_unsafe_cache_warns_and_searches(cache, beam_spec, timed):
  from baregrad.compiler.search import beam_search
  from baregrad.compiler.codegen import get_program
  cache.mkdir()
  os.chmod(cache, 0o777)
  with pytest.warns(UserWarning, match="writable by other users"):
    opts = beam_search(beam_spec, 2, get_program, depth=2)
  timed.clear()
  assert beam_search(beam_spec, 2, get_program, depth=2) == opts and timed   # nothing cached in an unsafe directory
  assert not (cache / "beam").exists()


def test_beam_real_timing_round_trip(cache, beam_spec):
  """One search with real timed runs: the cached opts compile and give numpy's numbers."""
  import dataclasses
  from baregrad.compiler.search import beam_search
  from baregrad.compiler.codegen import get_program
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.runtime import ExecItem, run_schedule
  opts = beam_search(beam_spec, 2, get_program, depth=1)
  assert beam_entry(cache) == [[o.op, o.axis, o.amount] for o in opts]
  prog = get_program(dataclasses.replace(beam_spec, opts=tuple(beam_search(beam_spec, 2, get_program, depth=1))))
  x = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
  inp = Buffer("CPU", x.size, beam_spec.params[1].dtype).copyin(x.tobytes())
  out = Buffer("CPU", 64, beam_spec.params[0].dtype)
  run_schedule([ExecItem(prog, [out, inp], {}, prog.meta)], sync=True)
  got = np.empty(64, np.float32)
  out.copyout(memoryview(got).cast("B"))
  np.testing.assert_allclose(got, x.sum(1) * 2, rtol=1e-6)
