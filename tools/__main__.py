"""The `baregrad` command: device info, bring-up smoke tests, capture/replay, profiles and compiler reports.

    baregrad info                                   devices, versions, properties; why a device is unavailable
    baregrad smoke [--device D]                     bring-up checks, stops at the first failure
    baregrad doctor [--device D] [-o report.txt] [--inject-fault] [--perf]
                                                    one report of a first contact with a device, to send back:
                                                    host, driver and firmware versions, the device open call by
                                                    call, smoke checks, ops against numpy, fault recovery
    baregrad capture -o run.bgq -- python s.py      record every queue submission (CAPTURE=run.bgq)
    baregrad replay run.bgq [--repeat N] [--trace out.json] [--device D] [--allow-native-code]
                                                    run a capture again; a CPU capture's programs are machine
                                                    code from the file and run only with --allow-native-code
    baregrad replay run.bgq --kernel I [--repeat N] [--warmup W] [--list] [--json-out r.json] [--sqlite out.db]
                                                    one kernel launch again and again, inputs restored: its
                                                    min/median/max time, GB/s, GFLOP/s, outputs checked
    baregrad decode run.bgq [--command I]         every command with the words its submission handed the engines
                                                    (PM4/SDMA, GPFIFO + pushbuffer + QMD, CPU and Metal), decoded
    baregrad diff A.bgq B.bgq | A.json B.json       what differs between two captures or two replay results
    baregrad trim run.bgq --from I --to J -o part.bgq
                                                    commands I..J as a capture that replays and checks alone
    baregrad profile -o out.json [--sqlite out.db] -- python s.py
                                                    Chrome/Perfetto trace of a run (PROFILE=out.json)
    baregrad viz -o out.html -- python s.py         UOp graphs of every kernel at every stage (VIZ=out.html)
    baregrad llm MODEL.gguf --prompt TEXT [...]     generate text with a LLaMA or GPT-2 GGUF model; tokens/s

TRACE_IOCTL=1 on any run logs every call through the kernel interface (mmap/munmap/mprotect/ioctl).
"""
from __future__ import annotations
import argparse, os, subprocess, sys


REPLAY_HELP = """Replay a capture: recreate its allocations, submit its commands again, check and time them.

A capture is input from whoever made it. Every header field is checked first (exit code 2 and one line
naming the field when one is wrong), and every kernel launch must pass buffers at least as large as its
program was compiled for. A CPU capture's programs are native machine code that would run with your
privileges, so replay refuses them (exit code 2) unless you pass --allow-native-code; GPU programs run
under the GPU's MMU and replay without it."""


DOCTOR_HELP = """One report of a first contact with a device: what a person with the hardware runs and sends back.

Sections, each PASS, FAIL or SKIP with its time: (1) host: OS, kernel, Python, numpy, baregrad version and commit;
(2) kernel driver and firmware versions, GPU ids, memory and limits (EMU=1: what the emulator reports); (3) the device
open, every kernel-interface call (open/ioctl/mmap) with its result; (4) the smoke checks; (5) a few ops against numpy;
(6) fault recovery: a bad packet on the compute queue must raise an error naming the device within seconds, and the
device must compute again; (7) a summary. At the first failure the report shows the traceback and the last kernel
calls before it. Exit code 0: every check passed; 1: a check failed; 2: bad arguments."""


def _child(env_var: str, out: str, command: list[str]) -> int:
  if command and command[0] == "--": command = command[1:]
  if not command:
    print("baregrad: give the command to run after --, e.g. `-- python script.py`", file=sys.stderr)
    return 2
  env = dict(os.environ, **{env_var: os.path.abspath(out)})
  try:
    return subprocess.run(command, env=env).returncode
  except FileNotFoundError as e:
    print(f"baregrad: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
    return 127


def cmd_info(args) -> int:
  from .info import collect, render
  rows = collect()
  if args.json:
    import json
    print(json.dumps(rows, indent=1, default=str))
  else:
    print(render(rows))
  return 0


def cmd_smoke(args) -> int:
  from .smoke import run_smoke
  return 0 if run_smoke(args.device) else 1


def cmd_doctor(args) -> int:
  from .doctor import run_doctor
  return run_doctor(args.device, args.output, args.inject_fault, perf=args.perf)


def cmd_replay(args) -> int:
  from .replay_tools import run_replay     # also --kernel, --list, --json-out, --sqlite
  return run_replay(args)


def cmd_llm(args) -> int:
  from .llm import run
  return run(args)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="baregrad", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
  s = sub.add_parser("info", help="devices baregrad knows, their properties, and why one is unavailable")
  s.add_argument("--json", action="store_true", help="print JSON")
  s = sub.add_parser("smoke", help="bring-up checks of one device (open, memory, copies, signals, kernels, speed)")
  s.add_argument("--device", default=None, help="device to check (default: DEV or CPU)")
  s = sub.add_parser("doctor", help="one report of a first contact with a device, for whoever has the hardware to send back",
                     description=DOCTOR_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  s.add_argument("--device", default=None,
                 help="device to examine: CPU, AMD, NV or METAL, with :n for the n-th (default: DEV or CPU)")
  s.add_argument("-o", "--output", default=None, help="write the report to this file and print only its summary")
  s.add_argument("--inject-fault", action="store_true",
                 help="on a real AMD or NV GPU, also put a bad packet on its compute queue and check that the error "
                      "arrives and the GPU computes again (the kernel driver may reset the GPU: not on one that drives a "
                      "display). Emulated GPUs and the CPU always run this check")
  s.add_argument("--perf", action="store_true",
                 help="also measure: an add's and matvecs' bandwidth, matmul FLOP/s (device timestamps), host<->device "
                      "copies, the latency of a small op and of a jitted step (a GPU: gigabyte sizes, a few seconds)")
  for name, var, what in (("capture", "CAPTURE", "run.bgq"), ("profile", "PROFILE", "out.json"), ("viz", "VIZ", "out.html")):
    s = sub.add_parser(name, help=f"run a command with {var}=FILE set")
    s.add_argument("-o", "--output", required=True, help=f"file to write (e.g. {what})")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    s.set_defaults(env_var=var)
  s = sub.add_parser("decode", help="every command of a capture with the engine words its submission got, decoded")
  s.add_argument("file", help="a .bgq capture")
  s.add_argument("--command", type=int, default=None, help="only command I (an exec or copy: its submission's words)")
  s = sub.add_parser("replay", help="replay a capture: check the results, time every command",
                     description=REPLAY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  s.add_argument("file", help="a .bgq capture (tools/BGQ_FORMAT.md); every field is checked before anything runs")
  s.add_argument("--allow-native-code", action="store_true",
                 help="a CPU capture's programs are machine code taken from the file: load and run them in this process "
                      "with your privileges (and, where a binary does not load, compile the file's C source with cc and run "
                      "that). Only for captures you trust as you would a program from their author; GPU captures do not "
                      "need it")
  s.add_argument("--device", default=None, help="device to replay on (default: the captured one)")
  s.add_argument("--repeat", type=int, default=None, help="timed runs (default 1; with --kernel 10)")
  s.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace JSON here")
  s.add_argument("--top", type=int, default=10, help="kernels to list")
  s.add_argument("--no-check", action="store_true", help="do not compare final buffer contents")
  # ---- replay tools (tools/replay_tools.py): replay --kernel/--list/--json-out/--sqlite, diff, trim, profile --sqlite
  from . import replay_tools
  replay_tools.add_replay_arguments(s)
  replay_tools.add_subcommands(sub)
  replay_tools.add_profile_arguments(sub.choices["profile"])
  from .llm import add_arguments as llm_arguments, DESCRIPTION as LLM_HELP
  s = sub.add_parser("llm", help="generate text with a language model from a GGUF file (LLaMA, GPT-2)",
                     description=LLM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  llm_arguments(s)
  args = p.parse_args(argv)
  try: from baregrad.drivers import settings   # noqa: F401 -- validates every environment variable baregrad reads
  except ValueError as e:   # settings.SettingsError: names the variable, its value and the values it takes
    print(f"baregrad: {e}", file=sys.stderr)
    return 2
  if args.cmd == "profile" and args.sqlite: return replay_tools.run_profile(args, _child)
  if args.cmd in ("diff", "trim"): return {"diff": replay_tools.run_diff, "trim": replay_tools.run_trim}[args.cmd](args)
  if args.cmd in ("capture", "profile", "viz"): return _child(args.env_var, args.output, args.command)
  if args.cmd == "decode":
    from .decode import run as run_decode
    return run_decode(args.file, args.command)
  if args.cmd == "replay" and args.repeat is not None and args.repeat < 1: p.error("--repeat must be at least 1")
  return {"info": cmd_info, "smoke": cmd_smoke, "doctor": cmd_doctor, "replay": cmd_replay, "llm": cmd_llm}[args.cmd](args)


if __name__ == "__main__":
  sys.exit(main())
