"""The command-line side of the replay tools (tools/__main__.py calls these): `replay --kernel/--list/--warmup/
--json-out/--sqlite`, `diff`, `trim`, and `profile --sqlite`.

Exit codes: 0 done (diff: no differences), 1 a check failed (diff: they differ), 2 a file cannot be read or used.
"""
from __future__ import annotations
import argparse, json, os, sys

DIFF_HELP = """Compare two captures, or two replay results files (`baregrad replay run.bgq --json-out results.json`).

Captures: the devices they were captured on, their programs (by name: source and binary hashes, parameters, launch
size), their commands in order (aligned on op and kernel name: launch sizes, buffer, copy and write sizes, variables)
and the final contents of their allocations. Results: each kernel's time per run on both sides, the delta of the
medians and the spread (min..max) of each side. Exit code 0: no differences, 1: differences, 2: a file cannot be read."""

TRIM_HELP = """Write commands I..J of a capture (indices as `baregrad replay run.bgq --list` prints them, both included)
as a capture of their own: the allocations they use, starting with the contents they had when command I ran and
ending with those after command J, and only the programs and blobs they need. The contents at I are not in the capture,
so trim replays it on a device of the captured kind (a CPU capture only with --allow-native-code), and, unless
--no-check, checks that replay against the capture before it writes anything."""


def add_replay_arguments(s: argparse.ArgumentParser):
  s.add_argument("--kernel", type=int, default=None, metavar="I",
                 help="run only kernel launch I (its command index, see --list) --repeat times, its argument buffers "
                      "restored before each run; report min/median/max device time, GB/s and GFLOP/s, and check its "
                      "outputs against the captured ones")
  s.add_argument("--warmup", type=int, default=1, metavar="W",
                 help="runs before the timed ones, checked but left out of the figures (default 1)")
  s.add_argument("--list", action="store_true", help="list the capture's commands with their indices; run nothing")
  s.add_argument("--json-out", default=None, metavar="FILE", help="write the timings as a results file for `baregrad diff`")
  s.add_argument("--sqlite", default=None, metavar="FILE",
                 help="write the timings, programs and devices as SQLite tables (tools/BGQ_FORMAT.md, \"Replay results\")")


def add_subcommands(sub):
  s = sub.add_parser("diff", help="what differs between two captures, or two replay results files",
                     description=DIFF_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  s.add_argument("a", help="a .bgq capture, or a results file of `replay --json-out`")
  s.add_argument("b", help="the same kind of file to compare it with")
  s.add_argument("--threshold", type=float, default=0.0,
                 help="results: a kernel differs only when its medians differ by more than this fraction (e.g. 0.05)")
  s = sub.add_parser("trim", help="a smaller capture of commands I..J that replays and checks on its own",
                     description=TRIM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  s.add_argument("file", help="a .bgq capture")
  s.add_argument("--from", dest="first", type=int, required=True, metavar="I", help="first command kept")
  s.add_argument("--to", dest="last", type=int, required=True, metavar="J", help="last command kept")
  s.add_argument("-o", "--output", required=True, help="the capture to write")
  s.add_argument("--device", default=None, help="device to replay on (default: the captured one)")
  s.add_argument("--allow-native-code", action="store_true",
                 help="a CPU capture's programs are machine code from the file; trim must run them (see replay --help)")
  s.add_argument("--no-check", action="store_true",
                 help="do not replay the rest of the capture to check the contents against the captured ones")


def add_profile_arguments(s: argparse.ArgumentParser):
  s.add_argument("--sqlite", default=None, metavar="FILE",
                 help="also write the trace's kernels and copies as SQLite tables (tools/BGQ_FORMAT.md)")


def _error(cmd: str, e: Exception) -> int:
  print(f"baregrad {cmd}: {e}", file=sys.stderr)
  return 2


def run_replay(args) -> int:
  from baregrad.hcq.capture import CaptureError, load_capture
  from .replay import ReplayError, replay, summary, write_trace
  from . import results as out
  if args.warmup < 0: return _error("replay", ValueError("--warmup must be at least 0"))
  try:
    cap = load_capture(args.file)
    if args.list:
      from .bgq import listing
      print(listing(cap))
      return 0
    if args.kernel is not None:
      from .kernel_replay import failed, replay_kernel, summary as kernel_summary
      if args.trace: return _error("replay", ValueError("--trace is for whole-capture replays, not --kernel"))
      run = replay_kernel(cap, args.kernel, args.device, args.repeat or 10, args.warmup, check=not args.no_check,
                          allow_native_code=args.allow_native_code)
      print(kernel_summary(run))
      results, bad = (out.from_kernel(run) if args.json_out or args.sqlite else None), failed(run)
    else:
      result = replay(cap, args.device, args.repeat or 1, check=not args.no_check, allow_native_code=args.allow_native_code,
                      warmup=args.warmup)
      print(summary(result, args.top))
      if args.trace:
        write_trace(result, args.trace)
        print(f"trace: {args.trace}")
      results, bad = (out.from_replay(result) if args.json_out or args.sqlite else None), bool(result.mismatches)
  except (CaptureError, ReplayError) as e:
    return _error("replay", e)
  if args.json_out:
    out.write_json(args.json_out, results)
    print(f"results: {args.json_out}")
  if args.sqlite:
    out.write_sqlite(args.sqlite, results)
    print(f"sqlite: {args.sqlite}")
  return 1 if bad else 0


def run_diff(args) -> int:
  from baregrad.hcq.capture import CaptureError, load_capture
  from .bgq import is_capture
  from .diff import diff_captures, diff_results
  from .results import ResultsError, load_results
  kinds = [is_capture(p) for p in (args.a, args.b)]
  try:
    if all(kinds): report = diff_captures(load_capture(args.a), load_capture(args.b))
    elif not any(kinds): report = diff_results(load_results(args.a), load_results(args.b), args.a, args.b, args.threshold)
    else:
      cap, other = (args.a, args.b) if kinds[0] else (args.b, args.a)
      return _error("diff", ValueError(f"{cap} is a capture but {other} is not: diff compares two captures, or two "
                                       "results files of `baregrad replay --json-out`"))
  except (CaptureError, ResultsError) as e:
    return _error("diff", e)
  print(report.text())
  return 1 if report.differences else 0


def run_trim(args) -> int:
  from baregrad.hcq.capture import CaptureError, load_capture
  from .replay import ReplayError
  from .trim import summary, trim
  try:
    t = trim(load_capture(args.file), args.first, args.last, args.output, args.device, args.allow_native_code,
             check=not args.no_check)
  except (CaptureError, ReplayError) as e:
    return _error("trim", e)
  print(summary(t))
  return 0


def run_profile(args, child) -> int:
  """`baregrad profile -o out.json --sqlite out.db -- cmd`: the run, then its trace's kernels and copies as tables."""
  from . import results as out
  rc = child(args.env_var, args.output, args.command)
  if rc != 0 or not os.path.exists(args.output): return rc
  try:
    results = from_trace(args.output)
  except (OSError, ValueError, KeyError, TypeError) as e:
    return _error("profile", ValueError(f"cannot read the trace {args.output}: {e}"))
  out.write_sqlite(args.sqlite, results)
  print(f"sqlite: {args.sqlite}", file=sys.stderr)
  return rc


def from_trace(path: str) -> dict:
  """A PROFILE trace as results (tools/results.py) for write_sqlite: one run; programs by kernel name, without hashes
  (a trace has none); the devices as this machine reports them now (the profiled run ran here)."""
  from baregrad.hcq.capture import device_info, host_info
  from .replay import clock_text
  with open(path) as f: trace = json.load(f)
  names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
  events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "copy")]
  devices = {}
  for name in dict.fromkeys(names[e["pid"]] for e in events):
    try:
      from baregrad.hcq.device import Device
      devices[name] = device_info(Device.get(name))
    except Exception: devices[name] = {"kind": name}
  first = next(iter(devices.values()), {"kind": "none"})
  programs = {}
  for e in events:
    if e["cat"] == "kernel" and e["name"] not in programs:
      programs[e["name"]] = {"id": len(programs), "name": e["name"], "source_sha256": None, "binary_sha256": None,
                             "n_params": None, "global_size": None, "local_size": None}
  origin = min((e["ts"] for e in events), default=0)
  commands = []
  for i, e in enumerate(sorted(events, key=lambda e: e["ts"])):
    kernel = e["cat"] == "kernel"
    args = e.get("args", {})
    commands.append({"command": i, "op": "exec" if kernel else "copy", "name": e["name"],
                     "program": programs[e["name"]]["id"] if kernel else None, "flops": args.get("flops", 0),
                     "bytes": args.get("bytes", args.get("nbytes", 0)), "global_size": None, "local_size": None,
                     "start_ns": [round((e["ts"] - origin) * 1000)], "ns": [round(e["dur"] * 1000)],
                     "device": names[e["pid"]]})
  return {"mode": "profile", "repeat": 1, "warmup": 0, "clock": clock_text(first), "device": None, "device_role": "profile",
          "captured_on": {"host": host_info(), "devices": devices}, "programs": list(programs.values()), "commands": commands}
