"""`baregrad doctor`: one report per device with every section, the device open call by call, exit codes, -o, and
what a failure (a device that cannot open, an op that raises) looks like. Each run is a child process: the doctor
opens, faults and reopens devices, which must not touch the devices of the test process."""
import io, os, re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).parent.parent.parent
HEADER = re.compile(r"^\[(\d)\] (.+?)\s+(PASS|FAIL|SKIP)\s+[\d.]+ ms$", re.M)
TITLES = {1: "host", 2: "kernel driver and firmware", 3: "device open (each kernel call)", 4: "smoke checks",
          5: "ops against numpy", 6: "fault recovery", 7: "summary"}
# calls each device's open must make, in this order (its kernel driver's interface)
OPEN_CALLS = {"AMD": ["open('/dev/kfd'", "AMDKFD_IOC_GET_VERSION", "AMDKFD_IOC_ACQUIRE_VM", "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU",
                      "AMDKFD_IOC_CREATE_EVENT", "AMDKFD_IOC_CREATE_QUEUE"],
              "NV": ["open('/dev/nvidiactl'", "NV_ESC_CHECK_VERSION_STR", "NV_ESC_RM_ALLOC", "NV_ESC_CARD_INFO",
                     "UVM_INITIALIZE", "NV_ESC_RM_CONTROL", "UVM_REGISTER_GPU"]}


def doctor(*args, env=None, script=None):
  """Run `baregrad doctor ARGS` (or a script that calls it) in a child with a clean environment plus `env`."""
  full = {k: v for k, v in os.environ.items() if k not in ("DEV", "EMU", "TRACE_IOCTL", "CAPTURE", "PROFILE", "VIZ")}
  full.update(env or {})
  cmd = [sys.executable, "-c", script] if script else [sys.executable, "-m", "baregrad.tools", "doctor", *args]
  return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, cwd=ROOT)


def sections(text: str) -> dict[int, tuple[str, str, str]]:
  """number -> (title, status, body) of each section of a report."""
  found = list(HEADER.finditer(text))
  ends = [m.start() for m in found[1:]] + [len(text)]
  return {int(m.group(1)): (m.group(2), m.group(3), text[m.end():end]) for m, end in zip(found, ends)}


def check_passed(out, text: str) -> dict:
  assert out.returncode == 0, f"exit {out.returncode}\n{text}\n{out.stderr[-3000:]}"
  got = sections(text)
  assert {n: title for n, (title, _, _) in got.items()} == TITLES, text
  assert all(status == "PASS" for _, status, _ in got.values()), text
  for line in ("python: ", "numpy: ", "baregrad: ", "os: "): assert line in got[1][2]
  assert "all 9 checks passed" in got[4][2]
  rows = re.findall(r"^    (add|mul|exp|sum|matmul|softmax|int32|copy) .*?(PASS|FAIL)", got[5][2], re.M)
  assert [op for op, _ in rows] == ["add", "mul", "exp", "sum", "matmul", "softmax", "int32", "copy"], got[5][2]
  assert all(status == "PASS" for _, status in rows)
  assert re.search(r"error after \d+\.\d+ s", got[6][2])      # (the doctor itself fails one slower than 5 s)
  assert "after the fault: x * 2 + 1 over 16 floats equals numpy's" in got[6][2]
  assert "6 passed, 0 failed, 0 skipped" in got[7][2]
  return got


def test_cpu_report_to_a_file(tmp_path):
  path = tmp_path / "report.txt"
  out = doctor("--device", "cpu", "-o", str(path))
  assert f"report written to {path}" in out.stdout
  assert re.search(r"^\[7\] summary\s+PASS$", out.stdout, re.M) and "[3] device open" in out.stdout   # the summary only
  got = check_passed(out, path.read_text())
  assert "command: baregrad doctor --device CPU -o" in path.read_text()
  assert re.search(r"compiler: .*(gcc|clang)", got[2][2])
  # the CPU command processor has no queue reset: the fault stays reported until the device is opened again
  assert "unknown opcode" in got[6][2] and "device lost: the next call reports the fault again" in got[6][2]


def _emulated(kind: str) -> bool:
  from baregrad.hcq.device import probe
  from baregrad.tools.info import emulated
  probe(kind)      # imports the driver, which registers its emulator
  return emulated(kind)["available"]


@pytest.mark.parametrize("kind", ["AMD", "NV", "METAL"])
def test_emulated_gpu_report(kind):
  if not _emulated(kind): pytest.skip(f"the emulated {kind} device is not available here")
  out = doctor("--device", kind, env={"EMU": "1"})
  got = check_passed(out, out.stdout)
  assert out.stdout.startswith(f"baregrad doctor report: {kind} (emulated, EMU=1)")
  assert "settings: EMU=1" in got[1][2] and f"emulated (EMU=1): {kind} (emulated" in got[2][2]
  opening = got[3][2]
  calls = re.findall(r"^      \[kernel \+[\d.]+ ms #\d+\] (.*) = (\S+)$", opening, re.M)
  if kind == "METAL":
    assert "0 kernel calls" in opening and "Objective-C" in opening
  else:
    assert len(calls) >= 20 and all(result != "-1" for _, result in calls), opening
    at = [next((i for i, (call, _) in enumerate(calls) if name in call), None) for name in OPEN_CALLS[kind]]
    assert None not in at and at == sorted(at), (at, opening)      # each call made, in the driver's order
  facts = {"AMD": ["KFD ioctl interface 1.", "gfx1100", "fw_version", "heap_type", "large BAR: yes"],
           "NV": ["kernel driver 580.", "PCI 10de:", "sm_90", "warps per SM", "UUID: GPU-"],
           "METAL": ["device: ", "GPU families: "]}[kind]
  for fact in facts: assert fact in got[2][2], (fact, got[2][2])
  error = {"AMD": r"QueueReset:\n\s+AMD: GPU queue error", "NV": r"ChannelReset:\n\s+NV: GPU channel error",
           "METAL": r"CommandBufferError:\n\s+METAL: compute queue"}[kind]
  assert re.search(error, got[6][2]) and "the driver recovered its queues" in got[6][2], got[6][2]


def test_device_that_cannot_open_fails_with_the_reason():
  if os.path.exists("/dev/kfd"): pytest.skip("this machine has /dev/kfd: the real AMD device may open")
  out = doctor("--device", "AMD")
  assert out.returncode == 1, out.stdout + out.stderr
  got = sections(out.stdout)
  assert got[3][1] == "FAIL" and "/dev/kfd does not exist on this machine" in got[3][2] and "Traceback" in got[3][2]
  assert got[2][1] == "FAIL" and "no /dev/kfd" in got[2][2]
  assert [got[n][1] for n in (4, 5, 6)] == ["SKIP"] * 3 and "the device did not open" in got[4][2]
  assert got[1][1] == "PASS" and got[7][1] == "FAIL" and "2 failed, 3 skipped" in got[7][2]


FAILING_OP = """
import sys
from baregrad.tensor import Tensor
def broken(self): raise RuntimeError("exp broke")
Tensor.exp = broken
from baregrad.tools.__main__ import main
sys.exit(main(["doctor", "--device", "CPU"]))
"""


def test_first_failure_shows_traceback_and_kernel_calls_and_the_rest_runs():
  out = doctor(script=FAILING_OP)
  assert out.returncode == 1, out.stdout + out.stderr
  got = sections(out.stdout)
  ops = got[5][2]
  assert got[5][1] == "FAIL" and re.search(r"exp 64x64 float32\s+FAIL\n\s+FAIL: RuntimeError: exp broke\n\s+traceback:", ops)
  assert re.search(r"the last \d+ kernel calls before this failure \(first failure of the run\):\n\s+\[kernel ", ops), ops
  assert "(the kernel calls before the first failure are under 'ops against numpy')" in ops     # softmax uses exp
  assert re.search(r"matmul 64x64 @ 64x64 float32\s+PASS", ops)                            # the other ops still ran
  assert got[6][1] == "PASS" and got[7][1] == "FAIL" and "failed: ops against numpy" in got[7][2]


def test_bad_arguments_exit_2(tmp_path, capsys):
  from baregrad.tools.__main__ import main
  assert main(["doctor", "--device", "NOPE"]) == 2
  assert "baregrad doctor: unknown device 'NOPE': available devices are CPU, AMD, NV, METAL" in capsys.readouterr().err
  assert main(["doctor", "--device", "CPU", "-o", str(tmp_path / "missing" / "report.txt")]) == 2
  assert "cannot write the report to" in capsys.readouterr().err


def test_kernel_calls_are_recorded_and_trace_ioctl_still_logs(monkeypatch):
  from baregrad.drivers import kernel, kernel_log
  from baregrad.tools.doctor import KernelCalls
  before = (kernel._logger, kernel_log.enabled, kernel_log._out)
  with KernelCalls() as calls:
    kernel.log("ioctl", fd=5, request=0x80084B01, name="AMDKFD_IOC_GET_VERSION", fields={"major_version": 1}, result=0,
               path="/dev/kfd")
  assert calls.count == 1 and calls.last(5)[0].endswith(
    "ioctl(fd=5 /dev/kfd, AMDKFD_IOC_GET_VERSION [r 'K' 0x01 size=8], major_version=1) = 0")
  assert (kernel._logger, kernel_log.enabled, kernel_log._out) == before     # all put back
  # TRACE_IOCTL=1: the log it writes still gets every line
  trace = io.StringIO()
  monkeypatch.setattr(kernel_log, "enabled", True)
  monkeypatch.setattr(kernel_log, "_out", trace)
  monkeypatch.setattr(kernel, "_logger", kernel._trace_logger())
  with KernelCalls() as calls:
    kernel.log("open", path="/dev/kfd", flags=2, result=3)
  assert calls.since(0) == trace.getvalue().splitlines() and "open('/dev/kfd', flags=0x2) = 3" in trace.getvalue()
  assert kernel_log._out is trace


def test_perf_section_on_the_cpu_and_an_emulated_gpu():
  """--perf adds section 7, performance (the summary becomes 8): each figure with a positive, finite value; on an
  emulated GPU it says its times are the emulator's."""
  for args, env in ((("--device", "cpu", "--perf"), {}), (("--device", "NV", "--perf"), {"EMU": "1"})):
    out = doctor(*args, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = sections(out.stdout)
    assert got[7][:2] == ("performance", "PASS") and got[8][0] == "summary" and "7 passed, 0 failed" in got[8][2]
    body = got[7][2]
    figures = [(m.group(1), float(m.group(2))) for m in
               re.finditer(r"^    (add of|matvec \d+x\d+ float16|matvec \d+x\d+ float32|matvec \d+x\d+ Q8_0|matmul \d+\^3 "
                            r"float32|matmul \d+\^3 float16|host -> device|a small op|a jitted)\D.*?\s([\d.]+) (?:us|GB/s)",
                            body, re.M)]
    assert [f for f, _ in figures] == ["add of", *(f for f in re.findall(r"matvec \d+x\d+ (?:float16|float32|Q8_0)", body)),
                                       *re.findall(r"matmul \d+\^3 float(?:32|16)", body), "host -> device", "a small op",
                                       "a jitted"], body
    assert len(figures) == 10 and all(0 < v < 1e9 for _, v in figures), body
    assert "x @ W (" in body and "Q8_0, x @ W.T" in body, body
    assert ("emulator's times" in body) == (env.get("EMU") == "1")
