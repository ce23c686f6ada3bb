"""Settings: every environment variable baregrad reads, read and validated once, when this module is imported.

drivers/ is the lowest layer, so every layer (drivers, hcq, compiler, tensor, tools) may import this module, and
every other module takes its settings from here instead of reading `os.environ` (tests/test_settings.py checks).
A bad value fails at once -- importing `baregrad.tensor` (or anything that imports this) raises one
`SettingsError`, a ValueError naming each bad variable, the value it had and the values it takes:

    SettingsError: DEBUG='abc' is not valid: DEBUG takes an integer >= 0 (0: quiet, 1: kernel timings, ...)

An unset or empty variable takes its default. The values are attributes of this module (`settings.DEBUG`):

    DEBUG, BEAM, OPT, EMU, DEV, TIMEOUT, THREADS   the user's knobs (see SETTINGS for each one's values)
    PLAN_CACHE, PROGRAM_CACHE, SPLIT_REDUCE        sizes of caches and of the reduce split
    PTX_MAX_STEPS, EMU_LOG, EMU_SMALL_BAR,         emulator and kernel-interface debugging
    TRACE_IOCTL, QUEUE_MARKERS
    CAPTURE, PROFILE, VIZ, TRACE_IOCTL_FILE        output files of the tools (None when unset)
    CACHE, BAREGRAD_CACHE, XDG_CACHE_HOME          the on-disk cache of compiled kernels
    CC, PTXAS                                      the external compilers

Changing a setting at runtime: modules that copy one into a global of their own at import keep that global as
the switch (tests monkeypatch it): `codegen.DEBUG/OPT/BEAM/PROGRAM_CACHE`, `schedule.DEBUG/PLAN_CACHE`,
`runtime.DEBUG`, `graph.DEBUG`, `tensor.SPLIT_REDUCE`, `Device.default_timeout`, `ptx.MAX_STEPS`,
`kernel_log.enabled`, `trace.CAPTURE/PROFILE/VIZ`, `viz.VIZ`. Code that reads `settings.NAME` when it runs
(EMU: `kernel.emulated()`, DEV: `Device.default()`, THREADS, EMU_LOG, TRACE_IOCTL_FILE) sees `override()`, which
validates like the environment does:

    with settings.override(EMU=1): ...        # the emulated kernel drivers inside the block
"""
from __future__ import annotations
import contextlib, math, os, sys
from dataclasses import dataclass
from typing import Any, Callable

# the devices DEV may name: the keys of hcq.device.DRIVERS (that module is a higher layer; a test keeps them equal)
DEVICES = ("CPU", "AMD", "NV", "METAL")


class SettingsError(ValueError):
  """An environment variable with a value baregrad does not accept; the message names it and what it takes."""


@dataclass(frozen=True)
class Setting:
  name: str
  parse: Callable[[str], Any]   # the stripped, non-empty text -> value; ValueError when it is not one
  default: Any
  takes: str                    # "takes ..." in the error message


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
  def parse(text: str) -> int:
    value = int(text)    # ValueError for '1.5' and 'abc'
    if value < minimum or (maximum is not None and value > maximum): raise ValueError(text)
    return value
  return parse


def _flag(text: str) -> bool:
  if text not in ("0", "1"): raise ValueError(text)
  return text == "1"


def _seconds(text: str) -> float:
  value = float(text)
  if not (math.isfinite(value) and value > 0): raise ValueError(text)
  return value


def _device(text: str) -> str:
  """A device name as hcq.device.canonical() accepts it (any case, an optional ':n'); kept as written."""
  if text.upper().split(":")[0] not in DEVICES: raise ValueError(text)
  return text


def _text(text: str) -> str: return text


_DEVICE_NAMES = ", ".join(DEVICES)
SETTINGS: dict[str, Setting] = {s.name: s for s in (
  Setting("DEBUG", _integer(0), 0, "an integer >= 0 (0: quiet, 1: kernel timings, 2: schedule, 4: source)"),
  Setting("BEAM", _integer(0), 0, "an integer >= 0 (0: hand-coded kernel optimizations, n: search them with a beam "
                                  "of width n, timing real runs)"),
  Setting("OPT", _integer(0, 1), 1, "0 or 1 (0: no kernel optimizations, 1: optimize kernels)"),
  Setting("EMU", _flag, False, "0 or 1 (1: the AMD and NV devices run on emulated kernel drivers and GPUs, METAL "
                               "on an emulated Metal framework)"),
  Setting("DEV", _device, "CPU", f"a device name: one of {_DEVICE_NAMES} (any case, optionally with ':n')"),
  Setting("TIMEOUT", _seconds, 30.0, "a number of seconds > 0 (how long a wait for the device may take before it "
                                     "fails; default 30)"),
  Setting("THREADS", _integer(1), max(1, os.cpu_count() or 1), "an integer >= 1 (CPU cores a kernel may use; "
                                                               "default: all)"),
  Setting("PLAN_CACHE", _integer(0), 4096, "an integer >= 0 (schedules kept for reuse; default 4096)"),
  Setting("PROGRAM_CACHE", _integer(0), 4096, "an integer >= 0 (loaded programs kept for reuse; default 4096)"),
  Setting("SPLIT_REDUCE", _integer(1), 32768, "an integer >= 1 (a reduction at least this long into <= 64 outputs "
                                              "runs as two kernels; default 32768)"),
  Setting("PTX_MAX_STEPS", _integer(1), 5_000_000, "an integer >= 1 (instruction dispatches the PTX emulator runs "
                                                   "per launch before it calls the kernel a runaway)"),
  Setting("EMU_LOG", _flag, False, "0 or 1 (1: the emulated KFD prints its kernel log on stderr)"),
  Setting("EMU_SMALL_BAR", _flag, False, "0 or 1 (1: the emulated AMD GPU has a small BAR: the host can map only "
                                         "part of its VRAM, as on a machine without Resizable BAR)"),
  Setting("QUEUE_MARKERS", _flag, True, "0 or 1 (1: every command a GPU queue runs writes its sequence number where "
                                        "the host reads it, so a hang or fault report names the command; 0: off)"),
  Setting("HANG_REPORT", _text, None, "a file path (a wait that times out or meets a device fault appends its error "
                                      "and every queue of the device decoded from the read pointer there)"),
  Setting("TRACE_IOCTL", _flag, False, "0 or 1 (1: log every call through the kernel interface)"),
  Setting("TRACE_IOCTL_FILE", _text, None, "a file path (where TRACE_IOCTL=1 writes; default stderr)"),
  Setting("CAPTURE", _text, None, "a file path (record every queue submission there, e.g. run.bgq)"),
  Setting("PROFILE", _text, None, "a file path (write a Chrome trace of the run there, e.g. out.json)"),
  Setting("VIZ", _text, None, "a file path (write the UOp graphs of every kernel there, e.g. out.html)"),
  Setting("CACHE", _flag, True, "0 or 1 (0: do not look compiled kernels up in the disk cache)"),
  Setting("BAREGRAD_CACHE", _text, None, "a directory (the disk cache; default $XDG_CACHE_HOME/baregrad)"),
  Setting("XDG_CACHE_HOME", _text, None, "a directory (the user's cache root; default ~/.cache)"),
  Setting("CC", _text, None, "a C compiler command (default: cc, gcc or clang on PATH)"),
  Setting("PTXAS", _text, None, "the path of ptxas (default: on PATH, else the nvidia-cuda-nvcc wheel's)"),
)}


def parse(name: str, text: str | None):
  """The value of setting `name` for the text of its environment variable (None or blank: the default)."""
  setting = SETTINGS.get(name)
  if setting is None: raise SettingsError(f"unknown setting {name!r}: baregrad reads {', '.join(SETTINGS)}")
  if text is None or not text.strip(): return setting.default
  try: return setting.parse(text.strip())
  except ValueError: raise SettingsError(f"{name}={text!r} is not valid: {name} takes {setting.takes}") from None


def read(environ) -> dict[str, Any]:
  """Every setting from `environ` (a mapping like os.environ); one SettingsError listing all the bad ones."""
  values, errors = {}, []
  for name in SETTINGS:
    try: values[name] = parse(name, environ.get(name))
    except SettingsError as e: errors.append(str(e))
  if errors: raise SettingsError("\n".join(errors))
  return values


@contextlib.contextmanager
def override(**values):
  """Set settings inside a `with` block, each given as in the environment ("1") or as a value (1, True, 2.5);
  None means unset (the default). Validated like the environment; the old values come back after the block."""
  module = sys.modules[__name__]
  def as_text(v): return None if v is None else str(int(v) if isinstance(v, bool) else v)
  new = {name: parse(name, as_text(v)) for name, v in values.items()}
  old = {name: getattr(module, name) for name in new}
  for name, value in new.items(): setattr(module, name, value)
  try: yield
  finally:
    for name, value in old.items(): setattr(module, name, value)


_values = read(os.environ)
DEBUG: int = _values["DEBUG"]
BEAM: int = _values["BEAM"]
OPT: int = _values["OPT"]
EMU: bool = _values["EMU"]
DEV: str = _values["DEV"]
TIMEOUT: float = _values["TIMEOUT"]
THREADS: int = _values["THREADS"]
PLAN_CACHE: int = _values["PLAN_CACHE"]
PROGRAM_CACHE: int = _values["PROGRAM_CACHE"]
SPLIT_REDUCE: int = _values["SPLIT_REDUCE"]
PTX_MAX_STEPS: int = _values["PTX_MAX_STEPS"]
EMU_LOG: bool = _values["EMU_LOG"]
EMU_SMALL_BAR: bool = _values["EMU_SMALL_BAR"]
QUEUE_MARKERS: bool = _values["QUEUE_MARKERS"]
HANG_REPORT: str | None = _values["HANG_REPORT"]
TRACE_IOCTL: bool = _values["TRACE_IOCTL"]
TRACE_IOCTL_FILE: str | None = _values["TRACE_IOCTL_FILE"]
CAPTURE: str | None = _values["CAPTURE"]
PROFILE: str | None = _values["PROFILE"]
VIZ: str | None = _values["VIZ"]
CACHE: bool = _values["CACHE"]
BAREGRAD_CACHE: str | None = _values["BAREGRAD_CACHE"]
XDG_CACHE_HOME: str | None = _values["XDG_CACHE_HOME"]
CC: str | None = _values["CC"]
PTXAS: str | None = _values["PTXAS"]
