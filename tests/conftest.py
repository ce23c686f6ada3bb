"""Test configuration shared by the op/dtype/error suites.

The suites never name a device: they use the default one, so the same files run under
`DEV=CPU` (default), `EMU=1 DEV=AMD` or `DEV=NV`. The header says which device was used.
"""
import gc
import os
import sys

import pytest

# make the helpers_* modules importable however pytest was started
sys.path.insert(0, os.path.dirname(__file__))

# The session keeps ~1 M objects alive (the op suite's kernel records, the compile caches), and with Python's default
# thresholds (700, 10, 10) the collector walked all of them ~100 times a run (~30 s of a full run). Collecting the
# youngest generation every 20000 allocations instead of 700 makes full collections ~30x rarer; what is collected is
# the same (the tests that count releases call gc.collect() themselves).
gc.set_threshold(20000, 10, 10)


def pytest_report_header(config):
  try:
    from baregrad.tensor import Tensor
    device = Tensor([1]).device
  except Exception as e:  # the header must never break collection
    device = f"unknown ({type(e).__name__}: {e})"
  return [f"baregrad default device: {device} (DEV={os.environ.get('DEV', '')!r}, EMU={os.environ.get('EMU', '')!r})"]


def pytest_configure(config):
  config.addinivalue_line("markers", "needs_float64: the case computes in float64; skipped on a device without it "
                          "(METAL: MSL has no double), as tensor/device_dtypes.py says")


def pytest_runtest_setup(item):
  """A case marked needs_float64 is skipped where the default device has no float64 (asked at setup, so collecting
  opens no device)."""
  if item.get_closest_marker("needs_float64") is None: return
  from baregrad.hcq.device import Device
  from baregrad.tensor.device_dtypes import lacks_float64
  if missing := lacks_float64(Device.default()):
    pytest.skip(f"{', '.join(missing)} has no float64 (its kernel language has no 64-bit float type); the case "
                f"computes in float64")


def pytest_collection_modifyitems(session, config, items):
  import helpers_capture
  helpers_capture.plan_session(config, items)     # the op suite runs once per session (helpers_capture's doc)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """The README's command runs the suite on every core (pytest-xdist: -n auto --dist loadfile). Each file runs whole
  in one worker (its module fixtures set up once), and the op-suite files with the renderer tests that read their
  kernels run in one worker, which records the kernels once as a single session does (helpers_capture)."""
  if config.getoption("dist") != "loadfile": return None
  from xdist.scheduler import LoadFileScheduling
  import helpers_capture

  class Scheduling(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str: return helpers_capture.worker_scope(nodeid)
  return Scheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  import helpers_capture
  with helpers_capture.recording(item):
    yield


@pytest.fixture(scope="module")
def emulated_gpus():
  """The emulated AMD and NV devices (EMU=1) for a module's tests: opened here, closed after the module (those it
  opened); skipped where a real GPU answers instead."""
  from baregrad.drivers import settings
  from baregrad.hcq.device import Device
  before = set(Device._open)
  with settings.override(EMU=1):
    for d in ("AMD", "NV"):
      dev = Device.get(d)
      iface = dev.driver.kernel if d == "AMD" else dev.driver.k
      if not iface.emulated: pytest.skip(f"{d} is a real GPU here; these tests use the emulated one")
    yield
  import gc
  gc.collect()
  for name, dev in list(Device._open.items()):
    if name not in before: dev.close()
