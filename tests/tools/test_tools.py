"""The `baregrad` command: info, smoke, capture -> replay, traces, VIZ, TRACE_IOCTL, bad capture files."""
import html.parser, io, json, os, re, shutil, subprocess, sys
from pathlib import Path
import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def run(args, env=None, check=True, timeout=120):
  full_env = dict(os.environ, **(env or {}))
  for var in ("CAPTURE", "PROFILE", "VIZ", "TRACE_IOCTL"):
    if var not in (env or {}): full_env.pop(var, None)
  full_env["DEV"] = (env or {}).get("DEV", "CPU")     # the scripts' expectations are the CPU device's (C source etc.)
  out = subprocess.run(args, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
  if check and out.returncode != 0:
    raise AssertionError(f"{args} exited {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}")
  return out


def baregrad(*args, **kw): return run([sys.executable, "-m", "baregrad.tools", *args], **kw)


# ---- info and smoke ----

def test_info_lists_every_device_with_reasons():
  cli = shutil.which("baregrad")
  out = run([cli, "info"]) if cli else baregrad("info")
  text = out.stdout
  assert "CPU: available" in text
  assert re.search(r"compiler: .*(gcc|clang)", text) and "isa_flags:" in text and "cores:" in text
  for name in ("AMD", "NV", "METAL"): assert f"\n{name}: " in text
  if not os.path.exists("/dev/kfd"):
    assert re.search(r"AMD: unavailable\n  reason: .*/dev/kfd", text)
  if not os.path.exists("/dev/nvidiactl"):
    assert re.search(r"NV: unavailable\n  reason: no /dev/nvidiactl", text)
  if sys.platform != "darwin": assert "Metal needs macOS" in text
  assert "AMD (emulated, EMU=1 DEV=AMD)" in text and "NV (emulated, EMU=1 DEV=NV)" in text
  rows = json.loads(baregrad("info", "--json").stdout)
  by = {r["name"]: r for r in rows}
  assert by["CPU"]["available"] is True
  assert all(r["available"] or r["reason"] for r in rows)


def test_probe_never_raises():
  from baregrad.drivers import settings
  from baregrad.hcq.device import probe
  with settings.override(EMU=0):    # the real drivers, whatever EMU this run has (settings are read at import)
    assert probe("CPU")["available"] is True
    if sys.platform != "darwin":
      assert probe("METAL")["available"] is False and "needs macOS" in probe("METAL")["reason"]
    if not os.path.exists("/dev/kfd"):
      assert probe("AMD")["available"] is False and "/dev/kfd" in probe("AMD")["reason"]
    bad = probe("NOPE")
    assert bad["available"] is False and "unknown device" in bad["reason"]


def test_smoke_cpu_passes_and_reports_figures():
  out = baregrad("smoke", "--device", "CPU")
  rows = {line.split("  ")[0].strip(): line for line in out.stdout.splitlines()}
  for check in ("open", "allocate and map", "copy round trip", "signal round trip", "timestamp clock", "empty kernel",
                "add kernel vs numpy", "copy bandwidth", "dispatch latency"):
    assert any(k.startswith(check) and "PASS" in v for k, v in rows.items()), f"{check} missing:\n{out.stdout}"
  assert re.search(r"copy bandwidth\s+PASS.*\d+\.\d+ GB/s", out.stdout)
  assert re.search(r"dispatch latency\s+PASS.*\d+\.\d+ us median", out.stdout)
  assert "all 9 checks passed" in out.stdout


def _emulator_available(kind: str) -> bool:
  out = baregrad("info", "--json", env={"EMU": "1"})
  return any(r["name"].startswith(f"{kind} (emulated") and r["available"] for r in json.loads(out.stdout))


@pytest.mark.parametrize("kind", ["AMD", "NV"])
def test_smoke_emulated_gpu(kind):
  if not _emulator_available(kind): pytest.skip(f"the emulated {kind} device is not part of this build")
  out = baregrad("smoke", "--device", kind, env={"EMU": "1"}, check=False)
  assert out.returncode == 0 and "all 9 checks passed" in out.stdout, out.stdout + out.stderr[-2000:]


def test_smoke_unavailable_device_fails_at_open():
  out = baregrad("smoke", "--device", "METAL", env={"EMU": "0"}, check=False)    # the real Metal: needs macOS
  assert out.returncode != 0
  assert re.search(r"open\s+FAIL", out.stdout) and "stopped at 'open'" in out.stdout
  assert "empty kernel" not in out.stdout


# ---- capture -> replay ----

@pytest.fixture(scope="module")
def captures(tmp_path_factory):
  d = tmp_path_factory.mktemp("captures")
  paths = {}
  for name in ("mlp", "conv"):
    path = d / f"{name}.bgq"
    out = baregrad("capture", "-o", str(path), "--", sys.executable, str(HERE / f"{name}_script.py"))
    assert out.stdout.startswith("ok"), out.stdout
    assert "CAPTURE: wrote" in out.stderr
    paths[name] = path
  return paths


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_capture_replay_round_trip(captures, name, tmp_path):
  from baregrad.hcq.capture import load_capture
  cap = load_capture(str(captures[name]))
  execs = [c for c in cap.commands if c["op"] == "exec"]
  assert execs and cap.programs and cap.allocations
  if name == "mlp":   # 1 eager call + 2 JIT calls that run normally + 2 JIT replays, 5 kernels each (the logits are
    # stored once: max, sum and the normalized values read them)
    assert [c["origin"] for c in cap.commands if c["op"] == "submit"] == ["schedule"] * 3 + ["jit"] * 2
    assert len(execs) == 25
  trace = tmp_path / "trace.json"
  out = baregrad("replay", str(captures[name]), "--allow-native-code", "--repeat", "3", "--trace", str(trace))
  assert "all" in out.stdout and "buffers match their captured final contents in every repetition" in out.stdout
  assert "MISMATCH" not in out.stdout
  assert re.search(r"kernel\s+calls\s+total us\s+mean us\s+%\s+GFLOP/s\s+GB/s", out.stdout)
  events = json.loads(trace.read_text())["traceEvents"]
  kernels = [e for e in events if e.get("cat") == "kernel"]
  assert len(kernels) == 3 * len(execs)


def test_replay_api_outputs_match_the_captured_run(captures):
  import numpy as np
  from baregrad.hcq.capture import load_capture
  from baregrad.tools.replay import replay
  cap = load_capture(str(captures["mlp"]))
  res = replay(cap, repeat=1, show_progress=False, allow_native_code=True)
  assert not res.mismatches and res.checked == len(cap.allocations)
  # the softmax output of the last JIT replay: rows sum to 1 in the captured final contents
  last = [c for c in cap.commands if c["op"] == "exec"][-1]
  aid, off, n = last["bufs"][0]
  final = np.frombuffer(cap.blob(cap.allocations[aid]["final"])[off:off + n], np.float32).reshape(8, 10)
  np.testing.assert_allclose(final.sum(-1), 1, rtol=1e-5)


def test_replay_reports_a_mismatch_clearly(captures):
  from baregrad.hcq.capture import load_capture
  from baregrad.tools.replay import replay
  cap = load_capture(str(captures["conv"]))
  last = [c for c in cap.commands if c["op"] == "exec"][-1]
  out_alloc = last["bufs"][0][0]
  blob = bytearray(cap.blob(cap.allocations[out_alloc]["final"]))
  blob[0:4] = b"\x00\x00\xc0\x7f"    # a NaN in element 0
  cap.header["blobs"].append([0, 0, 0, "raw", ""])   # placeholder entry for the tampered blob
  idx = len(cap.header["blobs"]) - 1
  cap.blob = (lambda orig: (lambda i: bytes(blob) if i == idx else orig(i)))(cap.blob)
  cap.allocations[out_alloc]["final"] = idx
  res = replay(cap, repeat=1, show_progress=False, allow_native_code=True)
  assert len(res.mismatches) == 1
  text = res.mismatches[0].text
  assert f"buffer #{out_alloc}" in text and "1 of 10 elements differ" in text and "element 0" in text
  assert last["name"] in text


# ---- traces ----

def test_replay_trace_is_chrome_format_and_adds_up(captures, tmp_path):
  trace = tmp_path / "t.json"
  out = baregrad("replay", str(captures["mlp"]), "--allow-native-code", "--trace", str(trace))
  data = json.loads(trace.read_text())
  events = data["traceEvents"]
  names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
  complete = [e for e in events if e["ph"] == "X"]
  assert complete
  for e in complete:
    assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
    assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and (e["pid"], e["tid"]) in names
  kernels = [e for e in complete if e["cat"] == "kernel"]
  assert {names[(e["pid"], e["tid"])] for e in kernels} == {"compute queue"}
  assert any(e["cat"] == "wait" for e in complete), "host waits are visible"
  total = float(re.search(r"kernels: \d+ runs, ([\d.]+) us total", out.stdout).group(1))
  assert abs(total - sum(e["dur"] for e in kernels)) < 0.01
  # on one queue, kernels do not overlap
  ks = sorted(kernels, key=lambda e: e["ts"])
  assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(ks, ks[1:]))


def test_profile_env_writes_a_trace(tmp_path):
  path = tmp_path / "prof.json"
  out = run([sys.executable, str(HERE / "mlp_script.py")], env={"PROFILE": str(path)})
  assert out.stdout.startswith("ok")
  events = json.loads(path.read_text())["traceEvents"]
  kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
  assert len(kernels) == 25           # 15 eager (incl. the JIT's first two calls) + 10 replayed by the JIT graph
  assert sum(1 for e in kernels if e["args"].get("jit")) == 10
  assert all(e["dur"] > 0 and "flops" in e["args"] for e in kernels)


# ---- VIZ ----

class _Parser(html.parser.HTMLParser):
  VOID = {"meta", "br", "img", "input", "link", "hr"}

  def __init__(self):
    super().__init__()
    self.stack, self.count, self.text = [], {}, []

  def handle_starttag(self, tag, attrs):
    self.count[tag] = self.count.get(tag, 0) + 1
    if tag not in self.VOID: self.stack.append(tag)

  def handle_startendtag(self, tag, attrs): self.count[tag] = self.count.get(tag, 0) + 1

  def handle_endtag(self, tag):
    assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
    self.stack.pop()

  def handle_data(self, data): self.text.append(data)


@pytest.fixture(scope="module")
def viz_report(tmp_path_factory):
  path = tmp_path_factory.mktemp("viz") / "report.html"
  out = run([sys.executable, str(HERE / "conv_script.py")], env={"VIZ": str(path)})
  assert "VIZ: wrote" in out.stderr
  return path


def test_viz_report_has_a_graph_per_stage_and_the_source(viz_report):
  page = viz_report.read_text()
  p = _Parser()
  p.feed(page); p.close()
  assert p.stack == [], f"unclosed tags {p.stack}"
  kernels = len(re.findall(r'<section id="k\d+">', page))
  schedules = len(re.findall(r'<section id="s\d+">', page))
  assert kernels == 3 and schedules >= 1
  assert p.count["svg"] == schedules + 4 * kernels       # rangeify, opts, symbolic, linearized per kernel
  text = "".join(p.text)
  assert "void r_2_5_36(const unsigned long long *restrict args" in text
  for stage in ("rangeify: the kernel AST", "optimizations:", "symbolic + decompositions", "linearized program"):
    assert text.count(stage) == kernels
  assert re.search(r"rewrites: symbolic \d+, decompositions \d+, symbolic again \d+", text)
  assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "<script" not in page


def test_viz_layout_collapses_consts_and_is_layered():
  from baregrad.compiler.viz import layout
  nodes = [{"op": "CONST", "dtype": "float32", "arg": "2", "src": []},
           {"op": "PARAM", "dtype": "float32", "arg": "0", "src": []},
           {"op": "MUL", "dtype": "float32", "arg": "", "src": [1, 0]},
           {"op": "ADD", "dtype": "float32", "arg": "", "src": [2, 1]}]
  g = layout(nodes)
  boxes = {i: (x, y, lines) for i, x, y, w, lines, _ in g["boxes"]}
  assert set(boxes) == {1, 2, 3}                      # the CONST is folded into MUL's label
  assert any("2" in line for line in boxes[2][2][1:])
  assert boxes[1][1] < boxes[2][1] < boxes[3][1]      # sources above their users
  assert sorted(len(e) for e in g["edges"]) == [2, 2, 3]   # PARAM -> ADD skips a layer: drawn through a dummy point


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_viz_report_renders_in_chromium(viz_report, tmp_path):
  shot = tmp_path / "shot.png"
  out = run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
             f"--screenshot={shot}", "--window-size=1200,1600", f"file://{viz_report}"], check=False, timeout=90)
  assert shot.exists() and shot.stat().st_size > 10_000, out.stderr[-2000:]
  assert "Uncaught" not in out.stderr and ":CONSOLE" not in out.stderr


# ---- bad captures ----

def test_truncated_corrupted_and_foreign_captures_fail_clearly(captures, tmp_path):
  raw = captures["conv"].read_bytes()
  cut = tmp_path / "cut.bgq"
  cut.write_bytes(raw[:len(raw) // 2])
  out = baregrad("replay", str(cut), check=False)
  assert out.returncode == 2 and "truncated capture" in out.stderr and "header says" in out.stderr
  bad = tmp_path / "bad.bgq"
  flipped = bytearray(raw)
  flipped[len(raw) // 2] ^= 0xFF
  bad.write_bytes(bytes(flipped))
  out = baregrad("replay", str(bad), check=False)
  assert out.returncode == 2 and "corrupted capture: checksum mismatch" in out.stderr
  other = tmp_path / "other.bgq"
  other.write_bytes(b"PK\x03\x04 not a capture")
  out = baregrad("replay", str(other), check=False)
  assert out.returncode == 2 and "is not a baregrad capture" in out.stderr
  for device in ("AMD", "NV"):
    out = baregrad("replay", str(captures["conv"]), "--device", device, check=False)
    assert out.returncode == 2
    assert "was captured on a CPU device" in out.stderr and f"cannot run on {device}" in out.stderr
  assert "Traceback" not in out.stderr


def test_capture_format_reader_checks(tmp_path):
  from baregrad.hcq.capture import VERSION, BlobStore, CaptureError, load_capture, write_capture
  blobs = BlobStore()
  a = blobs.add(b"\x00" * 1000)
  assert blobs.add(b"\x00" * 1000) == a              # deduplicated
  b = blobs.add(b"xyz")
  path = tmp_path / "t.bgq"
  write_capture(str(path), {"devices": {}, "programs": [], "allocations": [], "commands": []}, blobs)
  cap = load_capture(str(path))
  assert cap.blob(a) == b"\x00" * 1000 and cap.blob(b) == b"xyz" and cap.header["version"] == VERSION
  raw = bytearray(path.read_bytes())
  raw[8] = 9                                         # a future version
  path.write_bytes(bytes(raw))
  with pytest.raises(CaptureError, match="version 9 is newer"): load_capture(str(path))


# ---- TRACE_IOCTL and progress ----

def test_trace_ioctl_logs_decoded_kernel_calls():
  out = run([sys.executable, "-c", "from baregrad.tensor import Tensor; print((Tensor([1.0, 2.0]) + 1).numpy())"],
            env={"TRACE_IOCTL": "1"})
  assert re.search(r"\[kernel \+[\d.]+ ms #\d+\] mmap\(addr=NULL, length=0x\w+, prot=READ\|WRITE, "
                   r"flags=PRIVATE\|ANONYMOUS, fd=-1, offset=0\) = 0x[0-9a-f]+", out.stderr)
  assert re.search(r"mprotect\(addr=0x[0-9a-f]+, length=0x1000, prot=READ\|EXEC\) = 0", out.stderr)


def test_kernel_log_decodes_ioctl_requests(capsys):
  from baregrad.drivers import kernel_log
  # AMDKFD_IOC_GET_VERSION = _IOR('K', 0x01, struct kfd_ioctl_get_version_args) (8 bytes), linux/kfd_ioctl.h
  assert kernel_log.decode_request(0x80084B01) == "r 'K' 0x01 size=8"
  assert kernel_log.decode_request(0xC0184B02) == "rw 'K' 0x02 size=24"
  assert kernel_log.flag_names(0x22, kernel_log.MAP_FLAGS) == "PRIVATE|ANONYMOUS"
  assert kernel_log.flag_names(0x80000001, kernel_log.PROT_FLAGS) == "READ|0x80000000"
  kernel_log._out = sys.stderr
  kernel_log.ioctl(5, 0x80084B01, "AMDKFD_IOC_GET_VERSION", {"major_version": 1, "minor_version": 14}, 0, "/dev/kfd")
  err = capsys.readouterr().err
  assert "ioctl(fd=5 /dev/kfd, AMDKFD_IOC_GET_VERSION [r 'K' 0x01 size=8], major_version=1, minor_version=14) = 0" in err


def test_progress_bar_draws_only_when_enabled():
  from baregrad.drivers.progress import Progress, progress
  buf = io.StringIO()
  with Progress(3, "work", delay=0, file=buf, enabled=True) as bar:
    for _ in range(3): bar.update(1, note="x")
  assert "work [" in buf.getvalue() and "3/3" in buf.getvalue() and buf.getvalue().endswith("\n")
  quiet = io.StringIO()
  assert list(progress([1, 2, 3], "q", file=quiet)) == [1, 2, 3] and quiet.getvalue() == ""


def test_copy_commands_are_captured_and_replayed(tmp_path):
  import atexit
  import numpy as np
  from baregrad.compiler.dtype import dtypes
  from baregrad.hcq.buffer import Buffer
  from baregrad.hcq.capture import Recorder, load_capture
  from baregrad.hcq.runtime import ExecItem, run_schedule
  from baregrad.tools.replay import replay, summary
  rec = Recorder(str(tmp_path / "copy.bgq"))
  atexit.unregister(rec.flush_at_exit)
  src = Buffer("CPU", 4096, dtypes.float32).copyin(np.arange(4096, dtype=np.float32).tobytes())
  dst = Buffer("CPU", 4096, dtypes.float32)
  items = [ExecItem(None, [dst, src], meta={"name": "copy CPU->CPU"})]
  rec.record_items(items)
  run_schedule(items, sync=True)
  rec.flush()
  cap = load_capture(str(tmp_path / "copy.bgq"))
  assert [c["op"] for c in cap.commands] == ["copy", "submit"] and cap.commands[0]["nbytes"] == 16384
  final = np.frombuffer(cap.blob(cap.allocations[cap.commands[0]["dst"][0]]["final"]), np.float32)
  np.testing.assert_array_equal(final, np.arange(4096, dtype=np.float32))
  res = replay(cap, repeat=2, show_progress=False)
  assert not res.mismatches and len(res.of("copy")) == 2
  assert re.search(r"copies:\s+2 runs, [\d.]+ us total, 0\.033 MB", summary(res))


@pytest.mark.parametrize("name,kind", [("mlp", "NV"), ("conv", "AMD")])
def test_capture_replay_on_emulated_gpu(name, kind, tmp_path):
  """The same round trip on the emulated GPUs: capture in one process, replay in another, outputs match. Each GPU
  with one of the scripts (the CPU round trip above runs both)."""
  path = tmp_path / f"{name}-{kind}.bgq"
  env = {"EMU": "1", "DEV": kind}
  out = baregrad("capture", "-o", str(path), "--", sys.executable, str(HERE / f"{name}_script.py"), env=env, timeout=600)
  assert out.stdout.startswith("ok"), out.stdout
  # `baregrad decode`: the launch as the engine got it, from the words the capture kept (no device needed)
  from baregrad.hcq.capture import load_capture
  from baregrad.tools.decode import run as decode
  cap = load_capture(str(path))
  k, c = next((k, c) for k, c in enumerate(cap.commands) if c["op"] == "exec")
  text = io.StringIO()
  assert decode(str(path), k, out=text) == 0
  grid = tuple(c["global_size"])
  want = (rf"DISPATCH_DIRECT dim_x={grid[0]:#x} dim_y={grid[1]:#x} dim_z={grid[2]:#x}" if kind == "AMD" else
          rf"compute\.SEND_PCAS_A = 0x[0-9a-f]+ \(QMD at 0x[0-9a-f]+\)\n\s+\|   \| QMD V0\d_00: program 0x[0-9a-f]+, "
          rf"grid \({grid[0]}, {grid[1]}, {grid[2]}\)")
  assert re.search(want, text.getvalue()), text.getvalue()
  out = baregrad("replay", str(path), "--repeat", "2", env=env, timeout=600)
  assert "buffers match their captured final contents in every repetition" in out.stdout, out.stdout
  assert "MISMATCH" not in out.stdout
  # a capture from one kind of device does not replay on another
  out = baregrad("replay", str(path), "--device", "CPU", check=False)
  assert out.returncode != 0 and kind in (out.stdout + out.stderr)


def test_bench_llama_cpp_interpreter_is_checked(tmp_path, monkeypatch):
  """bench --llama-cpp PYTHON: a path that does not run, or an interpreter without llama_cpp, is a clear error before
  any model is written; without the flag an interpreter lacking llama_cpp only leaves the comparison out."""
  from baregrad.tools import bench_llm
  monkeypatch.setattr(bench_llm, "LLAMA_CPP_PYTHON", str(tmp_path / "no-such-python"))
  with pytest.raises(RuntimeError, match="--llama-cpp .*no-such-python.*cannot run it"): bench_llm.llama_cpp_python()
  stub = tmp_path / "python-without-llama"          # an executable that runs but cannot import llama_cpp
  stub.write_text("#!/bin/sh\nexit 1\n")
  stub.chmod(0o755)
  monkeypatch.setattr(bench_llm, "LLAMA_CPP_PYTHON", str(stub))
  with pytest.raises(RuntimeError, match="cannot import llama_cpp"): bench_llm.llama_cpp_python()
  monkeypatch.setattr(bench_llm, "LLAMA_CPP_PYTHON", None)
  have = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True).returncode == 0
  assert bench_llm.llama_cpp_python() == (sys.executable if have else None)
  with pytest.raises(SystemExit): __import__("baregrad.tools.bench", fromlist=["main"]).main(["--llama-cpp"])
