"""A capture is input, not code: every malformed field ends in CaptureError/exit code 2 with one line naming it,
blobs inflate only to their declared length, kernels never run on buffers smaller than they were compiled for,
and a CPU capture's machine code runs only with --allow-native-code."""
import copy, hashlib, json, os, re, subprocess, sys, tracemalloc, zlib
from pathlib import Path
import pytest
from baregrad.hcq.capture import (END_MAGIC, FIXED, MAGIC, MAX_HEADER_BYTES, MAX_NBYTES, MAX_NESTING, TRAILER, VERSION,
                                  CaptureError, load_capture)

ROOT = Path(__file__).parent.parent.parent
N = 1 << 22          # float32 elements: the captured kernel writes 16 MiB, far past a 64-byte allocation
SCRIPT = f"""
import numpy as np
from baregrad.tensor import Tensor
y = (Tensor(np.arange({N}, dtype=np.float32)) + 1).numpy()
assert y[-1] == {N}
print("ok")
"""


def baregrad(*args, env=None, timeout=120):
  full_env = {k: v for k, v in os.environ.items() if k not in ("CAPTURE", "PROFILE", "VIZ", "TRACE_IOCTL", "EMU", "DEV")}
  full_env.update(env or {})
  return subprocess.run([sys.executable, "-m", "baregrad.tools", *args], env=full_env, capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)


def capture(path: Path, script: str, env=None) -> Path:
  script_path = path.with_suffix(".py")
  script_path.write_text(script)
  out = baregrad("capture", "-o", str(path), "--", sys.executable, str(script_path), env=env)
  assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr
  return path


def seal(path: Path, header, section: bytes = b"", version: int = VERSION, flags: int = 0) -> Path:
  """Write a capture around `header` (a dict, or the raw header bytes) and `section`, with a correct checksum, so the
  check under test is reached rather than the checksum's."""
  head = header if isinstance(header, bytes) else json.dumps(header).encode()
  body = FIXED.pack(MAGIC, version, flags, len(head), len(section)) + head + section
  path.write_bytes(body + TRAILER.pack(hashlib.sha256(body).digest(), END_MAGIC))
  return path


def opened(path: Path) -> tuple[dict, bytes]:
  """A capture's header (a copy to corrupt) and blob section."""
  cap = load_capture(str(path))
  return copy.deepcopy(cap.header), bytes(cap.blob_section)


def add_blob(header: dict, section: bytes, data: bytes, encoding: str = "raw", length: int | None = None) -> tuple[int, bytes]:
  """Append `data` as a blob (stored as given); returns its index and the new blob section."""
  offset = (len(section) + 63) // 64 * 64
  header["blobs"].append([offset, len(data), len(data) if length is None else length, encoding, hashlib.sha256(data).hexdigest()])
  return len(header["blobs"]) - 1, section + bytes(offset - len(section)) + data


def refused(out: subprocess.CompletedProcess, *words: str):
  """Exit code 2, one line on stderr naming what is wrong, no traceback."""
  err = out.stderr.strip()
  assert out.returncode == 2, f"exit code {out.returncode}\n{out.stdout}\n{out.stderr}"
  assert "\n" not in err and "Traceback" not in err and err.startswith("baregrad replay: "), err
  for w in words: assert w in err, f"{w!r} not in {err!r}"


@pytest.fixture(scope="module")
def cpu_capture(tmp_path_factory) -> Path:
  return capture(tmp_path_factory.mktemp("input") / "cpu.bgq", SCRIPT)


def index_of(header: dict, op: str) -> int:
  return next(i for i, c in enumerate(header["commands"]) if c["op"] == op)


# ---- what a capture may run ----

def test_recorder_records_the_bytes_each_kernel_argument_needs(cpu_capture):
  header, _ = opened(cpu_capture)
  assert header["version"] == VERSION
  [prog] = header["programs"]
  assert prog["n_params"] == 2 and prog["param_nbytes"] == [4 * N, 4 * N]      # float32 output and input


def test_cpu_capture_runs_only_with_allow_native_code(cpu_capture):
  out = baregrad("replay", str(cpu_capture))
  refused(out, "machine code", "--allow-native-code", "your privileges")
  out = baregrad("replay", str(cpu_capture), "--allow-native-code")
  assert out.returncode == 0 and "all 2 buffers match their captured final contents" in out.stdout, out.stdout + out.stderr
  help_text = baregrad("replay", "--help").stdout
  assert "--allow-native-code" in help_text and "machine code" in help_text and "privileges" in help_text


def test_refusal_comes_before_anything_from_the_file_is_loaded(cpu_capture):
  from baregrad.tools.replay import ReplayError, replay
  cap = load_capture(str(cpu_capture))
  read = []
  real_blob = cap.blob
  cap.blob = lambda i: read.append(i) or real_blob(i)
  with pytest.raises(ReplayError, match="--allow-native-code"): replay(cap, show_progress=False)
  assert read == []                     # no program binary, no source, no buffer contents


def test_source_is_compiled_only_with_the_opt_in_and_says_so(cpu_capture, tmp_path):
  header, section = opened(cpu_capture)
  header["programs"][0]["binary"], section = add_blob(header, section, b"\x7fELF but not a loadable object file")
  path = seal(tmp_path / "badbinary.bgq", header, section)
  refused(baregrad("replay", str(path)), "--allow-native-code")         # never a silent compile of the C source
  out = baregrad("replay", str(path), "--allow-native-code")
  assert out.returncode == 0 and "MISMATCH" not in out.stdout, out.stdout + out.stderr
  assert "compiling and running its captured C source instead (--allow-native-code)" in out.stderr


def test_allocation_smaller_than_the_kernel_argument_is_refused(cpu_capture, tmp_path):
  """Before param_nbytes, this capture ran the 16 MiB kernel on a 64-byte allocation: the replay segfaulted."""
  header, section = opened(cpu_capture)
  k = index_of(header, "exec")
  out_alloc = header["commands"][k]["bufs"][0][0]
  header["allocations"][out_alloc].update(nbytes=64, initial=None, final=None)
  header["commands"][k]["bufs"][0] = [out_alloc, 0, 64]
  path = seal(tmp_path / "small.bgq", header, section)
  out = baregrad("replay", str(path), "--allow-native-code")
  refused(out, f"commands[{k}].bufs[0]", "64 bytes", f"compiled for {4 * N} bytes", "param_nbytes[0]")


def test_gpu_capture_needs_no_opt_in_but_its_buffers_are_checked(tmp_path):
  env = {"EMU": "1", "DEV": "AMD"}
  rows = json.loads(baregrad("info", "--json", env=env).stdout)
  if not any(r["name"].startswith("AMD (emulated") and r["available"] for r in rows):
    pytest.skip("the emulated AMD device is not part of this build")
  path = capture(tmp_path / "amd.bgq", SCRIPT.replace(str(N), "4096"), env=env)
  out = baregrad("replay", str(path), env=env)
  assert out.returncode == 0 and "buffers match their captured final contents" in out.stdout, out.stdout + out.stderr
  header, section = opened(path)
  k = index_of(header, "exec")
  a = header["commands"][k]["bufs"][0][0]
  header["allocations"][a].update(nbytes=16, initial=None, final=None)
  header["commands"][k]["bufs"][0] = [a, 0, 16]
  out = baregrad("replay", str(seal(tmp_path / "small.bgq", header, section)), env=env)
  refused(out, f"commands[{k}].bufs[0]", "16 bytes", "compiled for 16384 bytes")


# ---- the file: versions, nesting, sizes, decompression ----

@pytest.mark.parametrize("version, words", [(0, "version 0 does not exist"), (99, "version 99 is newer"),
                                            (1, "version 1 is older")])
def test_unsupported_versions_are_refused(cpu_capture, tmp_path, version, words):
  header, section = opened(cpu_capture)
  path = seal(tmp_path / "v.bgq", dict(header, version=version), section, version=version)
  refused(baregrad("replay", str(path), "--allow-native-code"), words)


def test_deep_nesting_is_refused(cpu_capture, tmp_path):
  path = seal(tmp_path / "deep.bgq", b"[" * 100_000 + b"]" * 100_000)
  refused(baregrad("replay", str(path)), "nests lists/objects too deeply")
  header, section = opened(cpu_capture)
  deep = []
  header["programs"][0]["meta"]["x"] = deep
  for _ in range(MAX_NESTING): deep.append([]); deep = deep[0]
  with pytest.raises(CaptureError, match=r"header field programs\[0\]\.meta\.x(\[0\])+ nests lists/objects 33 deep"):
    load_capture(str(seal(tmp_path / "deep2.bgq", header, section)))


def test_header_length_flags_and_json_are_checked(tmp_path):
  path = tmp_path / "h.bgq"
  body = FIXED.pack(MAGIC, VERSION, 0, MAX_HEADER_BYTES + 1, 0)
  path.write_bytes(body + TRAILER.pack(hashlib.sha256(body).digest(), END_MAGIC))
  with pytest.raises(CaptureError, match="header length field says"): load_capture(str(path))
  with pytest.raises(CaptureError, match="flags field is 0x4"): load_capture(str(seal(path, {}, flags=4)))
  with pytest.raises(CaptureError, match="not valid JSON"): load_capture(str(seal(path, b"{\"a\": ")))
  with pytest.raises(CaptureError, match=r"\(the whole header\) is a list of 0 items"): load_capture(str(seal(path, b"[]")))


def test_zlib_bomb_inflates_no_further_than_declared(tmp_path):
  """64 MiB of zeros compress to ~64 KiB; declared as 1000 bytes, reading it stops after 1001 bytes."""
  header = {"format": "bgq", "version": VERSION, "devices": {"CPU": {"kind": "CPU"}}, "programs": [], "commands": [],
            "blobs": [], "allocations": [{"id": 0, "device": "CPU", "nbytes": 1000, "dtype": "uint8", "initial": 0}]}
  bomb = zlib.compress(bytes(64 << 20), 9)
  _, section = add_blob(header, b"", bomb, "zlib", length=1000)
  path = seal(tmp_path / "bomb.bgq", header, section)
  cap = load_capture(str(path))
  tracemalloc.start()
  try:
    with pytest.raises(CaptureError, match=r"blobs\[0\] inflates to more than its declared length of 1000 bytes"): cap.blob(0)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 1 << 20, f"inflating the bomb allocated {peak} bytes"
  refused(baregrad("replay", str(path)), "blobs[0] inflates to more than its declared length")


def test_declared_lengths_are_bounded_by_what_the_file_can_hold(tmp_path):
  """A 1 MiB zlib blob cannot declare 2 GiB (deflate inflates at most 1032:1); no size exceeds MAX_NBYTES."""
  header = {"format": "bgq", "version": VERSION, "devices": {}, "programs": [], "allocations": [], "commands": [], "blobs": []}
  _, section = add_blob(header, b"", bytes(1 << 20), "zlib", length=2 << 30)
  with pytest.raises(CaptureError, match=r"header field blobs\[0\]\[2\] \(length\) is 2147483648, expected an integer in "
                                         r"\[0, 1082130432\]"):
    load_capture(str(seal(tmp_path / "big.bgq", header, section)))
  header["blobs"][0][2] = 1 << 20
  header["blobs"][0][3] = "raw"
  header["allocations"] = [{"id": 0, "device": "CPU", "nbytes": MAX_NBYTES + 1, "dtype": "uint8", "initial": None}]
  header["devices"] = {"CPU": {"kind": "CPU"}}
  with pytest.raises(CaptureError, match=rf"allocations\[0\]\.nbytes is {MAX_NBYTES + 1}, outside \[0, {MAX_NBYTES}\]"):
    load_capture(str(seal(tmp_path / "big.bgq", header, section)))


# ---- field by field ----

def _exec(h): return h["commands"][index_of(h, "exec")]
def _write(h): return h["commands"][index_of(h, "write")]


def _set(get, key, value):
  def corrupt(h): get(h)[key] = value
  return corrupt


def _delete(get, key):
  def corrupt(h): del get(h)[key]
  return corrupt


CASES = {
  # missing keys
  "no programs": (_delete(lambda h: h, "programs"), "programs is missing"),
  "no param_nbytes": (_delete(lambda h: h["programs"][0], "param_nbytes"), "programs[0].param_nbytes is missing"),
  "exec without bufs": (_delete(_exec, "bufs"), "commands[1].bufs is missing"),
  "allocation without nbytes": (_delete(lambda h: h["allocations"][0], "nbytes"), "allocations[0].nbytes is missing"),
  "blobs entry too short": (lambda h: h["blobs"][0].pop(), "blobs[0] has 4 items, expected 5"),
  # wrong types
  "format": (_set(lambda h: h, "format", "zip"), "header field format is \"zip\", expected \"bgq\""),
  "devices a list": (_set(lambda h: h, "devices", []), "header field devices is a list of 0 items, expected an object"),
  "n_params a string": (_set(lambda h: h["programs"][0], "n_params", "2"), "programs[0].n_params is \"2\", expected an integer"),
  "nbytes a float": (_set(lambda h: h["allocations"][0], "nbytes", 1.5), "allocations[0].nbytes is 1.5, expected an integer"),
  "index a bool": (_set(_exec, "program", True), "commands[1].program is true, expected the index"),
  "bufs an object": (_set(_exec, "bufs", {}), "commands[1].bufs is an object with 0 keys, expected a list"),
  "meta a list": (_set(lambda h: h["programs"][0], "meta", []), "programs[0].meta is a list of 0 items, expected an object"),
  "vars a string": (_set(_exec, "vars", "1"), "commands[1].vars is \"1\", expected a list"),
  "encoding": (lambda h: h["blobs"][0].__setitem__(3, "lzma"), "blobs[0][3] (encoding) is \"lzma\", expected \"raw\" or \"zlib\""),
  "sha256": (lambda h: h["blobs"][0].__setitem__(4, "xyz"), "blobs[0][4] (SHA-256) is \"xyz\", expected 64 lowercase hex"),
  "name with a newline": (_set(lambda h: h["programs"][0], "name", "E\nx"), "programs[0].name is \"E\\nx\", expected a C identifier"),
  "exec name with an escape": (_set(_exec, "name", "\x1b[2J"), "commands[1].name is \"\\u001b[2J\", which holds control characters"),
  "dtype": (_set(lambda h: h["allocations"][0], "dtype", "O"), "allocations[0].dtype is \"O\", expected a dtype name"),
  "unknown op": (_set(_exec, "op", "run"), "commands[1].op is \"run\", expected one of exec, copy, submit, write, sync"),
  "unknown device": (_set(_exec, "device", "NV"), "commands[1].device is \"NV\", which is not one of the capture's devices (CPU)"),
  "threads": (lambda h: h["programs"][0]["meta"].__setitem__("threads", 0), "programs[0].meta.threads is 0, outside [1, 4096]"),
  "id": (_set(lambda h: h["allocations"][1], "id", 0), "allocations[1].id is 0, expected 1"),
  # negative and huge sizes
  "negative nbytes": (_set(lambda h: h["allocations"][0], "nbytes", -1), "allocations[0].nbytes is -1, outside [0, "),
  "negative offset": (lambda h: _write(h)["dst"].__setitem__(1, -8), "commands[0].dst[1] is -8, outside [0, "),
  "negative blob length": (lambda h: h["blobs"][0].__setitem__(1, -5), "blobs[0][1] (stored length) is -5, outside [0, "),
  "huge nbytes": (_set(lambda h: h["allocations"][0], "nbytes", 1 << 62), f"allocations[0].nbytes is {1 << 62}, outside"),
  "huge param_nbytes": (lambda h: h["programs"][0]["param_nbytes"].__setitem__(0, 1 << 40), "programs[0].param_nbytes[0] is"),
  "raw length": (lambda h: h["blobs"][0].__setitem__(slice(2, 4), [h["blobs"][0][1] + 1, "raw"]),
                 "blobs[0][2] (length) is", "but a raw blob's length is its stored length"),
  # indices out of range
  "program index": (_set(_exec, "program", 7), "commands[1].program is 7, but the capture has 1 programs (0 to 0)"),
  "allocation index": (lambda h: _exec(h)["bufs"][0].__setitem__(0, 99), "commands[1].bufs[0][0] is 99, but the capture has 2 allocations"),
  "binary blob": (_set(lambda h: h["programs"][0], "binary", 10 ** 6), "programs[0].binary is 1000000, but the capture has"),
  "negative blob index": (_set(lambda h: h["programs"][0], "binary", -1), "programs[0].binary is -1, but the capture has"),
  "binary null": (_set(lambda h: h["programs"][0], "binary", None), "programs[0].binary is null, expected the index of a blob"),
  "initial of the wrong size": (lambda h: h["allocations"][1].__setitem__("initial", h["programs"][0]["binary"]),
                                "allocations[1].initial is blob"),
  "write data of the wrong size": (lambda h: _write(h)["dst"].__setitem__(2, 4), "commands[0].data is blob 0 of 16777216 bytes, expected 4 bytes"),
  "ref past its allocation": (lambda h: _exec(h)["bufs"][1].__setitem__(1, 8),
                              f"commands[1].bufs[1] is bytes [8, {4 * N + 8}) of allocation 0, which has {4 * N} bytes"),
  # argument count and launch
  "one buffer short": (lambda h: _exec(h)["bufs"].pop(), "commands[1].bufs has 1 buffers, but program 0 (E_4194304) takes 2"),
  "one value too many": (_set(_exec, "vars", [1]), "commands[1].vars has 1 values, but program 0 (E_4194304) takes 0"),
  "param_nbytes count": (lambda h: h["programs"][0]["param_nbytes"].pop(), "programs[0].param_nbytes has 1 sizes, but the program takes 2"),
  "global size": (_set(_exec, "global_size", [64, 1, 1]), "commands[1].global_size is [64, 1, 1], but program 0 (E_4194304) was compiled for [1, 1, 1]"),
  # a program whose grid depends on Variables may launch fewer workgroups than compiled, never more
  "global size past a symbolic grid": (lambda h: (h["programs"][0]["meta"].__setitem__("grid", ["p"]),
                                                  _exec(h).__setitem__("global_size", [2, 1, 1])),
                                       "commands[1].global_size is [2, 1, 1], but program 0 (E_4194304) was compiled for [1, 1, 1]"),
  "global size shape": (_set(_exec, "global_size", [1, 1]), "commands[1].global_size has 2 items, expected 3"),
  # the engine words a submission got (`baregrad decode`)
  "hw format": (lambda h: h["commands"][2]["hw"][0].__setitem__("format", "ptx"),
                "commands[2].hw[0].format is \"ptx\", expected one of pm4, sdma, gpfifo, pushbuf, qmd, cpu, metal"),
  "hw memory pair": (lambda h: h["commands"][2]["hw"][0].__setitem__("memory", [[4096]]),
                     "commands[2].hw[0].memory[0] has 1 items, expected 2"),
  "hw words blob": (lambda h: h["commands"][2]["hw"][0].__setitem__("words", 10 ** 6), "commands[2].hw[0].words is 1000000"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_field_is_named(cpu_capture, tmp_path, case):
  corrupt, *words = CASES[case]
  header, section = opened(cpu_capture)
  assert [c["op"] for c in header["commands"]] == ["write", "exec", "submit", "sync"]     # the indices CASES name
  corrupt(header)
  with pytest.raises(CaptureError) as e: load_capture(str(seal(tmp_path / "bad.bgq", header, section)))
  text = str(e.value)
  assert all(w in text for w in words) and "\n" not in text, text
  assert text.startswith(f"{tmp_path / 'bad.bgq'}: ")


@pytest.mark.parametrize("case", ["no programs", "negative nbytes", "allocation index", "one buffer short"])
def test_malformed_field_exits_2_from_the_command_line(cpu_capture, tmp_path, case):
  corrupt, *words = CASES[case]
  header, section = opened(cpu_capture)
  corrupt(header)
  refused(baregrad("replay", str(seal(tmp_path / "bad.bgq", header, section)), "--allow-native-code"), *words)


def test_decode_prints_the_words_each_submission_got(cpu_capture, capsys):
  """`baregrad decode`: the CPU command processor's packets of the capture's submission, decoded from the words the
  capture kept; --command of an exec shows its submission's; a command the capture lacks exits 2."""
  from baregrad.tools.decode import run as decode
  header, _ = opened(cpu_capture)
  fn = json.loads(json.dumps(header["programs"][0]["name"]))
  assert decode(str(cpu_capture)) == 0
  text = capsys.readouterr().out
  assert re.search(rf"#1 exec {fn} on CPU \(program 0\).*\n#2 submit 0 to CPU \(schedule\)\n  compute queue: \d+ CPU words\n"
                   r"    \+0x00000  EXEC(_MT)? fn=0x[0-9a-f]+ args=0x[0-9a-f]+", text), text
  assert re.search(r"SIGNAL addr=0x[0-9a-f]+ value=0x1", text), text
  assert decode(str(cpu_capture), 1) == 0
  assert re.search(r"in submit 0 to CPU \(schedule\):\n    compute queue", capsys.readouterr().out)
  assert decode(str(cpu_capture), 99) == 2
  assert "--command 99 is not a command of" in capsys.readouterr().err
