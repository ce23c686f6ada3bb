"""Environment variables: read and validated once in drivers/settings.py; a bad value fails the import with one
message naming the variable, its value and the values it takes (not a bare `invalid literal for int()`)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from baregrad.drivers import settings
from baregrad.drivers.settings import SettingsError

ROOT = Path(__file__).resolve().parents[1]


def _env(**values) -> dict:
  """This process's environment without any baregrad setting, plus `values`."""
  env = {k: v for k, v in os.environ.items() if k not in settings.SETTINGS}
  env.update(values)
  return env


def _python(code: str, **values) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], env=_env(**values), capture_output=True, text=True, timeout=120)


BAD = [  # variable, value, words the message must hold (what the variable takes)
  ("DEBUG", "abc", "DEBUG takes an integer >= 0 (0: quiet, 1: kernel timings, 2: schedule, 4: source)"),
  ("DEBUG", "-1", "DEBUG takes an integer >= 0"),
  ("DEBUG", "1.0", "DEBUG takes an integer >= 0"),
  ("BEAM", "x", "BEAM takes an integer >= 0"),
  ("OPT", "1.5", "OPT takes 0 or 1"),
  ("OPT", "2", "OPT takes 0 or 1"),
  ("EMU", "2", "EMU takes 0 or 1"),
  ("EMU", "yes", "EMU takes 0 or 1"),
  ("TIMEOUT", "-1", "TIMEOUT takes a number of seconds > 0"),
  ("TIMEOUT", "soon", "TIMEOUT takes a number of seconds > 0"),
  ("TIMEOUT", "inf", "TIMEOUT takes a number of seconds > 0"),
  ("DEV", "FOO", "DEV takes a device name: one of CPU, AMD, NV, METAL"),
  ("THREADS", "0", "THREADS takes an integer >= 1"),
  ("PLAN_CACHE", "-3", "PLAN_CACHE takes an integer >= 0"),
  ("PROGRAM_CACHE", "1e3", "PROGRAM_CACHE takes an integer >= 0"),
  ("SPLIT_REDUCE", "0", "SPLIT_REDUCE takes an integer >= 1"),
  ("PTX_MAX_STEPS", "lots", "PTX_MAX_STEPS takes an integer >= 1"),
  ("TRACE_IOCTL", "2", "TRACE_IOCTL takes 0 or 1"),
  ("EMU_LOG", "on", "EMU_LOG takes 0 or 1"),
  ("EMU_SMALL_BAR", "yes", "EMU_SMALL_BAR takes 0 or 1"),
  ("QUEUE_MARKERS", "2", "QUEUE_MARKERS takes 0 or 1"),
  ("CACHE", "no", "CACHE takes 0 or 1"),
]


@pytest.mark.parametrize("name,value,takes", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_bad_value_fails_the_import_with_one_clear_message(name, value, takes):
  # the settings module is what every baregrad import reads first (test_every_bad_variable_is_named_at_once
  # imports baregrad.tensor); importing it alone keeps each of these subprocesses short
  r = _python("import baregrad.drivers.settings", **{name: value})
  assert r.returncode != 0
  last = r.stderr.strip().splitlines()[-1]
  message = f"{name}={value!r} is not valid: {name} takes {settings.SETTINGS[name].takes}"
  assert last == f"baregrad.drivers.settings.SettingsError: {message}"
  assert takes in last
  assert "invalid literal" not in r.stderr and "could not convert" not in r.stderr


def test_every_bad_variable_is_named_at_once():
  r = _python("import baregrad.tensor", DEBUG="abc", BEAM="x", OPT="1.5", EMU="2", TIMEOUT="-1", DEV="FOO")
  assert r.returncode != 0
  for name, value in (("DEBUG", "abc"), ("BEAM", "x"), ("OPT", "1.5"), ("EMU", "2"), ("TIMEOUT", "-1"), ("DEV", "FOO")):
    assert f"{name}={value!r} is not valid: {name} takes" in r.stderr


def test_the_command_line_tool_reports_a_bad_value_without_a_traceback():
  r = subprocess.run([sys.executable, "-m", "baregrad.tools", "info"], env=_env(OPT="fast"), capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 2
  assert r.stderr.strip() == f"baregrad: OPT='fast' is not valid: OPT takes {settings.SETTINGS['OPT'].takes}"


GOOD = [  # environment -> the settings it must give
  ({}, {"DEBUG": 0, "BEAM": 0, "OPT": 1, "EMU": False, "DEV": "CPU", "TIMEOUT": 30.0, "PLAN_CACHE": 4096,
        "PROGRAM_CACHE": 4096, "SPLIT_REDUCE": 32768, "PTX_MAX_STEPS": 5_000_000, "TRACE_IOCTL": False,
        "EMU_LOG": False, "CAPTURE": None, "PROFILE": None, "VIZ": None, "TRACE_IOCTL_FILE": None, "CACHE": True}),
  ({"DEBUG": "2", "BEAM": "4", "OPT": "0", "EMU": "1", "DEV": "amd", "TIMEOUT": "2.5", "THREADS": "3"},
   {"DEBUG": 2, "BEAM": 4, "OPT": 0, "EMU": True, "DEV": "amd", "TIMEOUT": 2.5, "THREADS": 3}),
  ({"DEBUG": " 1 ", "EMU": "", "OPT": "", "DEV": "NV:0", "PLAN_CACHE": "0", "PROGRAM_CACHE": "8", "SPLIT_REDUCE": "1"},
   {"DEBUG": 1, "EMU": False, "OPT": 1, "DEV": "NV:0", "PLAN_CACHE": 0, "PROGRAM_CACHE": 8, "SPLIT_REDUCE": 1}),
  ({"EMU": "0", "TRACE_IOCTL": "0", "EMU_LOG": "0", "CACHE": "0", "VIZ": "out.html", "CAPTURE": "run.bgq",
    "PROFILE": "", "TRACE_IOCTL_FILE": "log.txt", "PTX_MAX_STEPS": "100"},
   {"EMU": False, "TRACE_IOCTL": False, "EMU_LOG": False, "CACHE": False, "VIZ": "out.html", "CAPTURE": "run.bgq",
    "PROFILE": None, "TRACE_IOCTL_FILE": "log.txt", "PTX_MAX_STEPS": 100}),
]


@pytest.mark.parametrize("environ,expected", GOOD)
def test_good_values(environ, expected):
  assert {name: settings.read(environ)[name] for name in expected} == expected   # in this process
  code = ("import json, baregrad.tensor\nfrom baregrad.drivers import settings\n"
          f"print(json.dumps({{n: getattr(settings, n) for n in {sorted(expected)!r}}}))")
  r = _python(code, **environ)
  assert r.returncode == 0, r.stderr[-2000:]
  import json
  assert json.loads(r.stdout) == expected


def test_the_modules_use_the_settings():
  code = ("import baregrad.tensor\nfrom baregrad.compiler import codegen, schedule, opt\n"
          "from baregrad.hcq import runtime, graph, trace\nfrom baregrad.hcq.device import Device\n"
          "from baregrad.drivers import kernel, kernel_log\nfrom baregrad.tensor import tensor\n"
          "print(codegen.DEBUG, codegen.OPT, codegen.BEAM, codegen.PROGRAM_CACHE, schedule.DEBUG, schedule.PLAN_CACHE,\n"
          "      runtime.DEBUG, graph.DEBUG, Device.default(), Device.default_timeout, kernel.emulated(),\n"
          "      opt.cpu_threads(), tensor.SPLIT_REDUCE, kernel_log.enabled, trace.PROFILE)")
  r = _python(code, DEBUG="3", OPT="0", BEAM="2", PROGRAM_CACHE="7", PLAN_CACHE="9", DEV="nv", EMU="1",
              TIMEOUT="4", THREADS="2", SPLIT_REDUCE="100", TRACE_IOCTL="0", PROFILE="p.json")
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["3", "0", "2", "7", "3", "9", "3", "3", "NV", "4.0", "True", "2", "100", "False", "p.json"]


def test_debug_4_prints_the_kernel_source():
  r = _python("from baregrad.tensor import Tensor\nprint((Tensor([1.0, 2.0]) * 3).numpy())", DEBUG="4", DEV="CPU")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "void " in r.stdout and "[3. 6.]" in r.stdout


def test_parse_and_read_in_process():
  assert settings.parse("DEBUG", None) == 0 and settings.parse("DEBUG", "  ") == 0 and settings.parse("BEAM", "3") == 3
  with pytest.raises(SettingsError, match=r"^EMU='true' is not valid: EMU takes 0 or 1"):
    settings.parse("EMU", "true")
  with pytest.raises(ValueError, match="unknown setting 'NOPE'"):
    settings.parse("NOPE", "1")
  with pytest.raises(SettingsError) as e:
    settings.read({"DEBUG": "x", "THREADS": "-2"})
  assert str(e.value).splitlines() == [f"DEBUG='x' is not valid: DEBUG takes {settings.SETTINGS['DEBUG'].takes}",
                                       f"THREADS='-2' is not valid: THREADS takes {settings.SETTINGS['THREADS'].takes}"]


def test_override_validates_and_restores():
  from baregrad.drivers import kernel
  before = settings.EMU
  with settings.override(EMU=1, TIMEOUT="5"):
    assert settings.EMU is True and kernel.emulated() and settings.TIMEOUT == 5.0
    with settings.override(EMU=None):   # unset: the default
      assert settings.EMU is False and not kernel.emulated()
    assert settings.EMU is True
  assert settings.EMU == before and settings.TIMEOUT == settings.read(os.environ)["TIMEOUT"]
  with pytest.raises(SettingsError, match="EMU='2' is not valid"):
    with settings.override(EMU=2): pass
  assert settings.EMU == before


def test_dev_names_the_devices_hcq_knows():
  from baregrad.hcq.device import DRIVERS, canonical
  assert set(settings.DEVICES) == set(DRIVERS)
  for name, want in (("cpu", "CPU"), ("AMD:1", "AMD:1"), ("nv", "NV"), ("amd:0", "AMD")):   # what DEV accepts, canonical() accepts
    assert canonical(settings.parse("DEV", name)) == want


# modules that hand an environment to a child process (not a setting of this process)
CHILD_ENV = {"tools/bench.py", "tools/__main__.py"}


def test_only_the_settings_module_reads_the_environment():
  readers = set()
  for layer in ("drivers", "hcq", "compiler", "tensor", "tools"):
    for path in (ROOT / layer).rglob("*.py"):
      if re.search(r"os\.environ|os\.getenv|getenv\(", path.read_text()):
        readers.add(path.relative_to(ROOT).as_posix())
  assert readers - CHILD_ENV == {"drivers/settings.py"}
