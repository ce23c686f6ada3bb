"""Replay for profiling: `replay --kernel/--list/--json-out/--sqlite`, `diff`, `trim`, `profile --sqlite`, and the
machine, driver, firmware and GPU id a capture records. CPU captures of tiny programs, plus one pair of emulated AMD
captures (a launch size that changes)."""
import copy, json, os, re, sqlite3, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from baregrad.hcq.capture import CaptureError, load_capture

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
FORMAT_DOC = ROOT / "tools" / "BGQ_FORMAT.md"

# three kernels: y = relu(x * K + 1) (stored), s = sum(y * y), z = y / s; K and N from the environment
SCRIPT = """
import os
import numpy as np
from baregrad.tensor import Tensor
k, n = float(os.environ.get("K", "2")), int(os.environ.get("N", "64"))
x = np.linspace(-1, 1, n, dtype=np.float32)
y = (Tensor(x) * k + 1).relu().realize()
s = (y * y).sum().realize()
z = (y / s).numpy()
ref = np.maximum(x * k + 1, 0)
assert np.allclose(z, ref / (ref * ref).sum(), rtol=1e-5), "differs from numpy"
print("ok")
"""


def baregrad(*args, env=None, check=True, timeout=120):
  full = {k: v for k, v in os.environ.items() if k not in ("CAPTURE", "PROFILE", "VIZ", "TRACE_IOCTL", "EMU", "DEV")}
  full.update({"DEV": "CPU"}, **(env or {}))
  out = subprocess.run([sys.executable, "-m", "baregrad.tools", *map(str, args)], env=full, capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
  if check and out.returncode != 0:
    raise AssertionError(f"{args} exited {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}")
  return out


def capture(path: Path, env=None) -> Path:
  script = path.parent / "script.py"
  if not script.exists(): script.write_text(SCRIPT)
  out = baregrad("capture", "-o", path, "--", sys.executable, script, env=env)
  assert "ok" in out.stdout, out.stdout + out.stderr
  return path


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
  d = tmp_path_factory.mktemp("replay-tools")
  return {"k2": capture(d / "k2.bgq", {"K": "2"}), "k3": capture(d / "k3.bgq", {"K": "3"}),
          "mlp": _mlp(d / "mlp.bgq")}


def _mlp(path: Path) -> Path:
  out = baregrad("capture", "-o", path, "--", sys.executable, HERE / "mlp_script.py")
  assert out.stdout.startswith("ok"), out.stdout
  return path


def execs(cap) -> list[int]: return [i for i, c in enumerate(cap.commands) if c["op"] == "exec"]


def _reference(k: float = 2, n: int = 64):
  x = np.linspace(-1, 1, n, dtype=np.float32)
  y = np.maximum(x * np.float32(k) + 1, 0)
  return y, (y * y).sum(), y / (y * y).sum()


# ---- the capture header: machine, driver, firmware, GPU id ----

def test_capture_records_the_machine_and_device(caps):
  cap = load_capture(str(caps["k2"]))
  host = cap.header["host"]
  assert host["machine"] == os.uname().machine and host["os"].startswith(os.uname().sysname)
  assert cap.header["devices"]["CPU"]["emulated"] is False


def test_header_versions_are_checked(caps, tmp_path):
  from baregrad.tools.bgq import Derived
  cap = load_capture(str(caps["k2"]))
  for where, value, field in ((("devices", "CPU", "gpu_id"), 7, "devices.CPU.gpu_id"),
                              (("devices", "CPU", "firmware"), "MEC\x1b[2J", "devices.CPU.firmware"),
                              (("devices", "CPU", "emulated"), "yes", "devices.CPU.emulated"),
                              (("host", "os"), ["Linux"], "host.os")):
    header = copy.deepcopy(cap.header)
    d = Derived(cap)
    for key in ("programs", "allocations"):
      for rec in header[key]:
        for blob in ("binary", "source", "initial", "final"):
          if blob in rec: rec[blob] = d.blob(rec[blob])
    for c in header["commands"]:
      if c["op"] == "write": c["data"] = d.blob(c["data"])
    target = header
    for key in where[:-1]: target = target[key]
    target[where[-1]] = value
    with pytest.raises(CaptureError, match=re.escape(f"header field {field}")):
      d.write(str(tmp_path / "bad.bgq"), header)


# ---- replay --kernel ----

def test_kernel_replay_output_matches_the_captured_one(caps):
  from baregrad.tools.kernel_replay import replay_kernel, summary
  cap = load_capture(str(caps["k2"]))
  last = execs(cap)[-1]                     # z = y / s: its output is nowhere written later
  run = replay_kernel(cap, last, repeat=4, warmup=2, allow_native_code=True, show_progress=False)
  assert len(run.times_ns) == 4 and len(run.warmup_ns) == 2 and all(t > 0 for t in run.times_ns)
  assert not run.mismatches and not run.reference.mismatches and run.runs_checked == 6
  assert run.against[0] == "capture"      # the output buffer is compared with the captured final contents themselves
  # and those captured contents are the right answer (numpy), so the kernel's replayed outputs are too
  a, off, n = cap.commands[last]["bufs"][0]
  got = np.frombuffer(cap.blob(cap.allocations[a]["final"])[off:off + n], np.float32)
  np.testing.assert_allclose(got, _reference()[2], rtol=1e-5)
  text = summary(run)
  assert re.search(r"min [\d.]+ us\s+median [\d.]+ us\s+max [\d.]+ us\s+\(of 4 runs\)", text)
  assert "4 timed runs (2 warm-up runs before them" in text and "GFLOP/s" in text and "GB/s" in text


def test_kernel_replay_notices_wrong_outputs(caps):
  """A capture whose final contents say otherwise: the kernel's outputs are reported as different."""
  from baregrad.tools.kernel_replay import failed, replay_kernel
  cap = load_capture(str(caps["k2"]))
  last = execs(cap)[-1]
  a = cap.commands[last]["bufs"][0][0]
  wrong = bytearray(cap.blob(cap.allocations[a]["final"]))
  wrong[:4] = np.float32(42).tobytes()
  original = cap.blob
  cap.blob = lambda i: bytes(wrong) if i == cap.allocations[a]["final"] else original(i)
  run = replay_kernel(cap, last, repeat=2, warmup=0, allow_native_code=True, show_progress=False)
  assert failed(run) and "42" in run.mismatches[0] and "element 0" in run.mismatches[0]


def test_kernel_replay_command_line(caps, tmp_path):
  cap = load_capture(str(caps["mlp"]))
  listing = baregrad("replay", caps["mlp"], "--list").stdout
  assert len(re.findall(r"^\s+\d+  exec ", listing, re.M)) == len(execs(cap)) == 25
  i = execs(cap)[12]                        # a JIT-step kernel whose buffers later commands write again
  out = baregrad("replay", caps["mlp"], "--allow-native-code", "--kernel", i, "--repeat", 3, "--json-out", tmp_path / "k.json")
  assert f"kernel replay of command {i}" in out.stdout and "(of 3 runs)" in out.stdout
  assert "against this replay's run of the capture, which matched the captured final contents of all 27" in out.stdout
  res = json.loads((tmp_path / "k.json").read_text())
  assert res["mode"] == "kernel" and [c["command"] for c in res["commands"]] == [i] and len(res["commands"][0]["ns"]) == 3
  # a command that is not a kernel launch, and a CPU capture without the opt-in
  bad = baregrad("replay", caps["mlp"], "--allow-native-code", "--kernel", 0, check=False)
  assert bad.returncode == 2 and "command 0" in bad.stderr and "write command" in bad.stderr
  bad = baregrad("replay", caps["mlp"], "--kernel", i, check=False)
  assert bad.returncode == 2 and "--allow-native-code" in bad.stderr


# ---- trim ----

def test_trimmed_capture_replays_and_checks_on_its_own(caps, tmp_path):
  cap = load_capture(str(caps["mlp"]))
  subs = [i for i, c in enumerate(cap.commands) if c["op"] == "submit"]
  first, last = subs[1] + 1, execs(cap)[17]          # from the third step's host write into the middle of the fourth
  part_path = tmp_path / "part.bgq"
  out = baregrad("trim", caps["mlp"], "--from", first, "--to", last, "-o", part_path, "--allow-native-code")
  assert "matched the captured final contents of all 27 allocations" in out.stdout
  part = load_capture(str(part_path))               # passes every check of the reader
  kept = cap.commands[first:last + 1]
  assert [c["op"] for c in part.commands] == [c["op"] for c in kept] + ["submit"]     # the cut submission is submitted
  assert len(part.allocations) < len(cap.allocations) and os.path.getsize(part_path) < os.path.getsize(caps["mlp"])
  assert part.header["trimmed"] == {"file": "mlp.bgq", "sha256": part.header["trimmed"]["sha256"], "first": first,
                                    "last": last, "commands": len(cap.commands),
                                    "contents_from": part.header["trimmed"]["contents_from"]}
  out = baregrad("replay", part_path, "--allow-native-code", "--repeat", 2)
  assert f"all {len(part.allocations)} buffers match their captured final contents in every repetition" in out.stdout

  # one kernel: one program, and its output is the captured one (the last step's softmax, nothing writes it later)
  baregrad("trim", caps["mlp"], "--from", execs(cap)[-1], "--to", execs(cap)[-1], "-o", tmp_path / "one.bgq",
           "--allow-native-code")
  one = load_capture(str(tmp_path / "one.bgq"))
  assert len(one.programs) == 1 and [c["op"] for c in one.commands] == ["exec", "submit"]
  a, off, n = cap.commands[execs(cap)[-1]]["bufs"][0]
  b = one.commands[0]["bufs"][0]
  assert one.blob(one.allocations[b[0]]["final"])[b[1]:b[1] + b[2]] == cap.blob(cap.allocations[a]["final"])[off:off + n]
  assert len(one.allocations) == 2         # its output, and the JIT arena its three inputs are slices of
  assert "all 2 buffers match" in baregrad("replay", tmp_path / "one.bgq", "--allow-native-code").stdout

  bad = baregrad("trim", caps["mlp"], "--from", 5, "--to", 999, "-o", tmp_path / "x.bgq", "--allow-native-code", check=False)
  assert bad.returncode == 2 and "has 48 commands" in bad.stderr and not (tmp_path / "x.bgq").exists()


# ---- diff ----

def test_diff_finds_a_changed_kernel(caps):
  out = baregrad("diff", caps["k2"], caps["k3"], check=False)
  assert out.returncode == 1, out.stdout + out.stderr
  changed = [line for line in out.stdout.splitlines() if "(A program" in line]
  assert len(changed) == 1 and "source" in changed[0] and "binary" in changed[0]   # relu(x * K + 1): K is in its code
  assert re.search(r"programs: 2 identical, 1 changed", out.stdout)
  assert "its program differs" in out.stdout and "final contents:" in out.stdout and "differ" in out.stdout
  same = baregrad("diff", caps["k2"], caps["k2"], check=False)
  assert same.returncode == 0 and same.stdout.rstrip().endswith("no differences")


def test_diff_finds_a_changed_launch_size(tmp_path):
  env = {"EMU": "1", "DEV": "AMD"}
  a, b = capture(tmp_path / "n64.bgq", dict(env, N="64")), capture(tmp_path / "n512.bgq", dict(env, N="512"))
  out = baregrad("diff", a, b, env=env, check=False)
  assert out.returncode == 1
  ca, cb = load_capture(str(a)), load_capture(str(b))
  pairs = [(x, y) for x, y in zip(execs(ca), execs(cb)) if ca.commands[x]["global_size"] != cb.commands[y]["global_size"]]
  assert pairs, "the emulated AMD kernels of 64 and 512 elements launch different grids"
  x, y = pairs[0]
  assert f"global size {ca.commands[x]['global_size']} -> {cb.commands[y]['global_size']}" in out.stdout
  assert "AMD gfx1100 (emulated)" in out.stdout and "driver KFD" in out.stdout


def test_diff_of_replay_results(caps, tmp_path):
  from baregrad.tools.results import write_json
  ja, jb = tmp_path / "a.json", tmp_path / "b.json"
  baregrad("replay", caps["k2"], "--allow-native-code", "--repeat", 3, "--json-out", ja)
  res = json.loads(ja.read_text())
  assert res["repeat"] == 3 and res["warmup"] == 1 and {c["op"] for c in res["commands"]} == {"exec"}
  slow = copy.deepcopy(res)
  name = slow["commands"][-1]["name"]
  for c in slow["commands"]:
    # (slower than every original run: on a loaded machine one run can take 10x another)
    if c["name"] == name: c["ns"] = [t + 2 * max(c["ns"]) + 1000 for t in c["ns"]]
  write_json(str(jb), slow)
  out = baregrad("diff", ja, jb, check=False)
  assert out.returncode == 1
  row = next(line for line in out.stdout.splitlines() if line.startswith(name))
  assert row.split()[1] == "3/3" and row.rstrip().endswith("slower")
  assert all(line.rstrip().endswith("within spread") for line in out.stdout.splitlines()
             if line.startswith("r_") and not line.startswith(name))
  assert baregrad("diff", ja, ja, check=False).returncode == 0
  slow["commands"][0]["ns"] = [1, 2]       # not one time per run
  write_json(str(jb), slow)
  bad = baregrad("diff", ja, jb, check=False)
  assert bad.returncode == 2 and "commands[0].ns has 2 times" in bad.stderr
  bad = baregrad("diff", caps["k2"], ja, check=False)
  assert bad.returncode == 2 and "is a capture but" in bad.stderr


# ---- SQLite ----

def documented_queries() -> list[str]:
  queries = re.findall(r"```sql\n(.*?)```", FORMAT_DOC.read_text(), re.S)
  assert len(queries) == 2
  return queries


def test_sqlite_tables_answer_the_documented_queries(caps, tmp_path):
  db, js = tmp_path / "r.db", tmp_path / "r.json"
  baregrad("replay", caps["mlp"], "--allow-native-code", "--repeat", 2, "--sqlite", db, "--json-out", js)
  cap, res = load_capture(str(caps["mlp"])), json.loads(js.read_text())
  con = sqlite3.connect(db)
  by_kernel, by_program = (con.execute(q).fetchall() for q in documented_queries())
  launches = {}
  for i in execs(cap): launches[cap.commands[i]["name"]] = launches.get(cap.commands[i]["name"], 0) + 1
  assert {row[0]: row[1] for row in by_kernel} == {k: 2 * v for k, v in launches.items()}      # runs per kernel
  total = {c["name"]: 0 for c in res["commands"]}
  for c in res["commands"]: total[c["name"]] += sum(c["ns"])
  assert [row[0] for row in by_kernel] == sorted(total, key=lambda k: -total[k])               # most time first
  assert {row[0] for row in by_program} == set(launches) and len(by_program) == len(cap.programs)
  hashes = {cap.header["blobs"][p["binary"]][4] for p in cap.programs}
  assert {row[1] for row in by_program} == hashes and {row[3] for row in by_program} == {"CPU"}
  roles = con.execute("SELECT role, kind, machine FROM devices ORDER BY id").fetchall()
  assert roles == [("captured", "CPU", os.uname().machine), ("replay", "CPU", os.uname().machine)]


def test_sqlite_of_an_emulated_gpu_kernel_replay_has_driver_versions(tmp_path):
  env = {"EMU": "1", "DEV": "AMD"}
  path = capture(tmp_path / "amd.bgq", env)
  cap = load_capture(str(path))
  info = cap.header["devices"]["AMD"]
  assert info["emulated"] is True and info["driver_version"].startswith("KFD ") and "MEC" in info["firmware"]
  assert re.match(r"0x[0-9a-f]+ \(PCI 1002:", info["gpu_id"])
  db = tmp_path / "k.db"
  out = baregrad("replay", path, "--kernel", execs(cap)[0], "--repeat", 2, "--warmup", 0, "--sqlite", db, env=env)
  assert "emulator time" in out.stdout and "replayed on: AMD gfx1100 (emulated)" in out.stdout
  rows = sqlite3.connect(db).execute(documented_queries()[1]).fetchall()
  assert len(rows) == 1 and rows[0][3:] == ("AMD", info["driver_version"], info["firmware"], info["gpu_id"])


def test_profile_writes_sqlite(tmp_path):
  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  db = tmp_path / "p.db"
  baregrad("profile", "-o", tmp_path / "p.json", "--sqlite", db, "--", sys.executable, script)
  trace = json.loads((tmp_path / "p.json").read_text())
  kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
  con = sqlite3.connect(db)
  rows = con.execute(documented_queries()[0]).fetchall()
  assert sum(r[1] for r in rows) == len(kernels) == 3
  assert con.execute("SELECT role, kind FROM devices").fetchall() == [("profile", "CPU")]
