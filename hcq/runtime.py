"""The loop that runs ExecItems on a device's queues."""
from __future__ import annotations
import time
from .device import Device, device_ns
from .exec_item import ExecItem, kernel_args, enqueue as _enqueue   # ExecItem, kernel_args: imported from here too
from .signal import Signal
from . import hooks
from baregrad.drivers import settings
if settings.CAPTURE or settings.PROFILE: from . import trace   # noqa: F401  installs their hooks (hcq/hooks.py)

DEBUG = settings.DEBUG


capturing: list | None = None     # the JIT collects ExecItems here while it captures


def run_schedule(items: list[ExecItem], sync: bool = False):
  """Queue every item in order on its device and signal the timeline once at the end (under Device.lock: the
  timeline values taken here are submitted in the order they were taken)."""
  if not items: return
  with Device.lock: _run_schedule(items, sync)


def _run_schedule(items: list[ExecItem], sync: bool):
  if capturing is not None: capturing.extend(items)
  if hooks.active and hooks.installed.on_run_schedule(items, sync): return   # CAPTURE/PROFILE (hcq/trace.py)
  if DEBUG >= 1: return _run_timed(items)
  by_dev: dict[str, tuple] = {}
  devs = []
  for item in items:
    bufs = item.bufs
    for b in bufs:
      if b._mem is None: b.ensure_allocated()    # (a view's is always None: it allocates its base)
    if item.program is None and bufs[0].device != bufs[1].device:
      _submit(by_dev, devs)
      from . import transfer        # (imported on the first copy between devices)
      transfer.copy(*bufs)          # ordered by signals (hcq/transfer.py); the host does not wait here
      continue
    dev = Device.get(bufs[0].device)
    q = by_dev.get(dev.name)
    if q is None: q = by_dev[dev.name] = (dev, dev.queue("compute"))
    _enqueue(dev, q[1], item)
  _submit(by_dev, devs)
  if sync:
    for dev in devs: dev.synchronize()


def _submit(by_dev: dict, devs: list) -> None:
  """Submit each device's queue, noting the device in `devs`."""
  for dev, q in by_dev.values():
    dev.submit(q)
    devs.append(dev)
  by_dev.clear()


def _run_timed(items: list[ExecItem]):
  for item in items:
    for b in item.bufs: b.ensure_allocated()
    if item.program is None and item.bufs[0].device != item.bufs[1].device:
      from . import transfer
      src, dst = Device.get(item.bufs[1].device), Device.get(item.bufs[0].device)
      start = time.perf_counter()
      transfer.copy(*item.bufs)
      src.synchronize(); dst.synchronize()
      dt = time.perf_counter() - start
      print(f"{dst.name:4s} {item.name:32s} {dt * 1e6:10.2f} us (host clock) {item.bufs[0].nbytes / dt * 1e-9:9.2f} GB/s "
            f"via {transfer.link(src, dst).describe()}")
      continue
    dev = Device.get(item.bufs[0].device)
    dt = time_item(dev, item)
    gflops = item.meta.get("flops", 0) / dt * 1e-9
    gbs = item.meta.get("bytes", 0) / dt * 1e-9
    print(f"{dev.name:4s} {item.name:32s} {dt * 1e6:10.2f} us {gflops:9.2f} GFLOP/s {gbs:9.2f} GB/s")


def time_item(dev, item: ExecItem, launches: int = 1) -> float:
  """Seconds one run of a kernel's item takes on its device: timestamps the device writes before and after it, or
  before and after `launches` runs back to back, divided by their number (only for an item whose outputs are not its
  inputs). A GPU runs a kernel launched after it idled slower than the same kernel queued behind others: on an H200
  a 64 Mi float32 add took 439 us launched alone after each wait, 186 us back to back (PyTorch: the same)."""
  q = dev.queue("compute")
  t0, t1 = Signal(dev, "t0"), Signal(dev, "t1")
  q.timestamp(t0)
  for _ in range(launches): _enqueue(dev, q, item)
  dev.submit(q.timestamp(t1))
  dev.synchronize()
  return max(device_ns(dev, t1.timestamp) - device_ns(dev, t0.timestamp), 1) * 1e-9 / launches
