"""Replay results as files: `replay --json-out results.json` (a small JSON file that `baregrad diff` compares with
another) and `replay --sqlite out.db` (three SQLite tables: the timed commands, the programs, the devices).
Both formats are described in tools/BGQ_FORMAT.md ("Replay results").

A results file is input too when it is diffed (people send them to each other): `load_results` checks every field
it uses, as `load_capture` does for captures.
"""
from __future__ import annotations
import json, os, sqlite3, time
from collections import defaultdict
from baregrad.hcq.capture import host_info
from .bgq import file_sha256, launch_size, program_hashes
from .replay import clock_text

FORMAT, VERSION = "baregrad-replay-results", 1
MAX_FILE = 64 << 20          # bytes of a results file a reader accepts
MAX_RUNS = 1 << 20
MAX_COMMANDS = 1 << 20


class ResultsError(ValueError):
  """A results file that cannot be read; the message is one line naming the file and the field."""


# ---- making results ----

def _header(cap, mode: str, repeat: int, warmup: int, info: dict) -> dict:
  programs = []
  for p in cap.programs:
    src, binary = program_hashes(cap, p)
    programs.append({"id": p["id"], "name": p["name"], "source_sha256": src, "binary_sha256": binary,
                     "n_params": p["n_params"], "global_size": p["meta"].get("global_size", [1, 1, 1]),
                     "local_size": p["meta"].get("local_size", [1, 1, 1])})
  return {"format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "tool": "baregrad replay",
          "mode": mode, "capture": {"file": os.path.basename(cap.path), "sha256": file_sha256(cap.path),
                                    "created": cap.header.get("created", "")},
          "repeat": repeat, "warmup": warmup, "clock": clock_text(info), "host": host_info(), "device": info,
          "captured_on": {"host": cap.header.get("host", {}), "devices": cap.header["devices"]}, "programs": programs}


def _command(cap, i: int, starts: list, times: list) -> dict:
  c = cap.commands[i]
  out = {"command": i, "op": c["op"], "name": c["name"], "start_ns": starts, "ns": times}
  if c["op"] == "exec":
    g, l = launch_size(cap, c)
    out.update(program=c["program"], flops=c.get("flops", 0), bytes=c.get("bytes", 0), global_size=g, local_size=l)
  else: out.update(program=None, flops=0, bytes=c["nbytes"])
  return out


def from_replay(result) -> dict:
  """Results of a whole-capture replay (tools/replay.py ReplayResult): every kernel and copy, its time in each timed run."""
  cap = result.capture
  out = _header(cap, "capture", result.repeat, result.warmup, result.device_info)
  out["check"] = {"compared": result.checked, "mismatches": len(result.mismatches)}
  first = {}
  by_index: dict[int, dict[int, tuple]] = defaultdict(dict)
  for t in result.of("exec", "copy"):
    first[t.rep] = min(first.get(t.rep, t.start_ns), t.start_ns)
    by_index[t.index][t.rep] = t
  out["commands"] = [_command(cap, i, [by[r].start_ns - first[r] for r in range(result.repeat)],
                              [by[r].ns for r in range(result.repeat)]) for i, by in sorted(by_index.items())]
  return out


def from_kernel(run) -> dict:
  """Results of `replay --kernel` (tools/kernel_replay.py KernelRun): the one kernel, its time in each timed run."""
  out = _header(run.capture, "kernel", run.repeat, run.warmup, run.device_info)
  out["check"] = {"compared": run.runs_checked, "mismatches": len(run.mismatches)}
  out["commands"] = [_command(run.capture, run.index, [0] * len(run.times_ns), list(run.times_ns))]
  return out


def write_json(path: str, results: dict):
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f: json.dump(results, f, indent=1)
  os.replace(tmp, path)


# ---- reading results (input: every field used is checked) ----

def load_results(path: str) -> dict:
  try:
    if os.path.getsize(path) > MAX_FILE: raise ResultsError(f"{path}: a results file is at most {MAX_FILE >> 20} MiB")
    with open(path, "rb") as f: data = json.loads(f.read())
  except OSError as e: raise ResultsError(f"cannot read {path}: {e.strerror}") from e
  except RecursionError: raise ResultsError(f"{path}: not a replay results file (JSON nested too deeply)") from None
  except ValueError as e: raise ResultsError(f"{path}: not a replay results file (not JSON: {e})") from e
  _Check(path).results(data)
  return data


class _Check:
  def __init__(self, path: str): self.path = path

  def fail(self, field: str, problem: str):
    raise ResultsError(f"{self.path}: not a valid replay results file: {field} {problem}")

  def get(self, obj: dict, key: str, field: str, kind, optional: bool = False):
    if key not in obj:
      if optional: return None
      self.fail(f"{field}{key}", "is missing")
    value = obj[key]
    ok = (type(value) in (int, float) and value >= 0) if kind == "number" else type(value) is kind
    if kind is int and ok and not 0 <= value <= (1 << 63) - 1: ok = False
    if not ok: self.fail(f"{field}{key}", f"is {str(value)[:40]!r}, expected {getattr(kind, '__name__', kind)}")
    if kind is str and (len(value) > 256 or not value.isprintable()): self.fail(f"{field}{key}", "is not a short printable string")
    return value

  def facts(self, value, field: str):
    """A record of facts a report prints (host, device): short printable strings, integers, booleans."""
    if type(value) is not dict or len(value) > 32: self.fail(field, "is not a record of at most 32 facts")
    for k, v in value.items():
      if type(k) is not str or len(k) > 32 or not k.isprintable(): self.fail(field, "has a bad key")
      if type(v) is not bool and type(v) is not int: self.get(value, k, f"{field}.", str)

  def results(self, data):
    if type(data) is not dict or data.get("format") != FORMAT:
      self.fail("format", f"is not {FORMAT!r} (write one with `baregrad replay run.bgq --json-out results.json`)")
    if data.get("version") != VERSION: self.fail("version", f"is {str(data.get('version'))[:20]}, this baregrad reads {VERSION}")
    repeat = self.get(data, "repeat", "", int)
    if not 1 <= repeat <= MAX_RUNS: self.fail("repeat", f"is {repeat}, expected 1 to {MAX_RUNS}")
    self.get(data, "warmup", "", int)
    for key in ("mode", "clock", "created"): self.get(data, key, "", str)
    self.facts(data.get("host", {}), "host")
    self.facts(data.get("device", {}), "device")
    capture = self.get(data, "capture", "", dict)
    self.get(capture, "file", "capture.", str)
    commands = self.get(data, "commands", "", list)
    if len(commands) > MAX_COMMANDS: self.fail("commands", f"has more than {MAX_COMMANDS} entries")
    for i, c in enumerate(commands):
      field = f"commands[{i}]."
      if type(c) is not dict: self.fail(field[:-1], "is not an object")
      self.get(c, "command", field, int)
      if self.get(c, "op", field, str) not in ("exec", "copy"): self.fail(f"{field}op", "is not exec or copy")
      self.get(c, "name", field, str)
      for key in ("flops", "bytes"): self.get(c, key, field, "number")
      ns = self.get(c, "ns", field, list)
      if len(ns) != repeat: self.fail(f"{field}ns", f"has {len(ns)} times, expected one per timed run ({repeat})")
      for j, t in enumerate(ns):
        if type(t) is not int or not 0 <= t < 1 << 63: self.fail(f"{field}ns[{j}]", "is not a time in nanoseconds")


# ---- SQLite ----

SCHEMA = """
CREATE TABLE devices (
  id INTEGER PRIMARY KEY,
  role TEXT NOT NULL,            -- 'captured': a device of the capture header; 'replay': the device the times are
                                 -- from; 'profile': a device of a PROFILE run (its times are from it)
  name TEXT, kind TEXT, target TEXT, machine TEXT, os TEXT,
  driver_version TEXT, firmware TEXT, gpu_id TEXT, emulated INTEGER, compiler TEXT,
  clock TEXT                     -- replay: where the times come from
);
CREATE TABLE programs (
  id INTEGER PRIMARY KEY,        -- the capture's program id
  device_id INTEGER REFERENCES devices(id),
  name TEXT, source_sha256 TEXT, binary_sha256 TEXT, n_params INTEGER,
  global_size TEXT, local_size TEXT   -- JSON lists
);
CREATE TABLE commands (
  run INTEGER,                   -- timed run, 0 to repeat-1 (warm-up runs are not stored)
  command INTEGER,               -- index in the capture's command list
  kind TEXT,                     -- 'kernel' or 'copy'
  name TEXT,
  program_id INTEGER REFERENCES programs(id),   -- NULL for a copy
  device_id INTEGER REFERENCES devices(id),     -- the device it ran on
  start_ns INTEGER,              -- from the start of the run's first command
  ns INTEGER,                    -- device time
  flops INTEGER, bytes INTEGER,  -- the compiler's estimates for a kernel; a copy's bytes moved
  global_size TEXT, local_size TEXT
);
"""


def _device_row(role: str, name: str, info: dict, host: dict, clock: str | None) -> tuple:
  return (role, name, info.get("kind"), info.get("target"), host.get("machine", info.get("machine")), host.get("os"),
          info.get("driver_version"), info.get("firmware"), info.get("gpu_id"),
          None if "emulated" not in info else int(bool(info["emulated"])), info.get("compiler"), clock)


def _json(value) -> str | None: return None if value is None else json.dumps(value)


def write_sqlite(path: str, results: dict):
  """The results as three tables (SCHEMA); an existing file at `path` is replaced."""
  tmp = f"{path}.tmp{os.getpid()}"
  if os.path.exists(tmp): os.remove(tmp)
  db = sqlite3.connect(tmp)
  try:
    db.executescript(SCHEMA)
    insert_device = ("INSERT INTO devices (role, name, kind, target, machine, os, driver_version, firmware, gpu_id, emulated, "
                     "compiler, clock) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    captured = {}
    on, role = results.get("captured_on", {}), results.get("device_role", "captured")
    for name, info in on.get("devices", {}).items():
      clock = results.get("clock") if role == "profile" else None
      captured[name] = db.execute(insert_device, _device_row(role, name, info, on.get("host", {}), clock)).lastrowid
    info = results.get("device")
    replay_id = None if info is None else db.execute(
      insert_device, _device_row("replay", info.get("kind", "?"), info, results.get("host", {}), results.get("clock"))).lastrowid
    first_captured = next(iter(captured.values()), None)
    db.executemany("INSERT INTO programs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   [(p["id"], first_captured, p["name"], p["source_sha256"], p["binary_sha256"], p["n_params"],
                     _json(p["global_size"]), _json(p["local_size"])) for p in results.get("programs", [])])
    rows = []
    for c in results["commands"]:
      kernel = c["op"] == "exec"
      sizes = (_json(c["global_size"]), _json(c["local_size"])) if kernel else (None, None)
      device_id = captured.get(c["device"]) if "device" in c else replay_id
      for run, (start, ns) in enumerate(zip(c["start_ns"], c["ns"])):
        rows.append((run, c["command"], "kernel" if kernel else "copy", c["name"], c.get("program"), device_id, start, ns,
                     int(c["flops"]), int(c["bytes"]), *sizes))
    db.executemany("INSERT INTO commands VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
  finally: db.close()
  os.replace(tmp, path)
