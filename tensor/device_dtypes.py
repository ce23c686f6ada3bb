"""Which float dtypes a device computes in, as its renderer declares them (compiler/lower.py `Native.dtypes`).

Every target has every baregrad dtype — 16-bit floats and 8/16-bit integers are emulated where it lacks them — except
float64, which nothing emulates: a target whose renderer leaves float64 out of `native_ops.dtypes` has none (Metal:
MSL has no double, MSL specification 2.1). On such a device
- the computations that pick float64 for precision (cos of float32, the mean/var/std of ints, isclose of ints) pick
  `widest_float` instead (float32), and
- a float64 tensor is refused where it is made (`require_float64`: creation, cast, bitcast, copy to the device), with
  a message a user can act on, rather than a compile error inside the device's kernel compiler.
On every other device both keep float64, so their results do not change.
"""
from __future__ import annotations
from baregrad.compiler.dtype import DType, dtypes


def _kinds(device) -> tuple[str, ...]:
  return tuple(d.partition(":")[0] for d in (device if isinstance(device, tuple) else (device,)))


def lacks_float64(device) -> tuple[str, ...]:
  """The device kinds of `device` (a name or a tuple of names) whose renderer has no float64 (empty: all have it)."""
  from baregrad.compiler.codegen import renderer_for
  return tuple(k for k in dict.fromkeys(_kinds(device)) if dtypes.float64 not in renderer_for(k).native_ops.dtypes)


def widest_float(device) -> DType:
  """float64 where every device of `device` has it, else float32."""
  return dtypes.float32 if lacks_float64(device) else dtypes.float64


def require_float64(device, op: str) -> None:
  """Raise a TypeError naming the op and the device when `device` has no float64."""
  if missing := lacks_float64(device):
    raise TypeError(f"{op}: {', '.join(missing)} has no float64 (its kernel language has no 64-bit float type): use "
                    f"float32, or another device")


def host_floats(values, device, like: DType | None = None):
  """Host data (a list, a numpy array) as a numpy array for a tensor on `device` that feeds a computation in the
  float dtype `like` (default float32): a float64 array (what numpy makes of Python floats) comes as `like`'s host
  type where the device has no float64, so a loss's class weights or a mask given as a list work there too; other
  arrays are returned as they are."""
  import numpy as np
  arr = np.asarray(values)
  if arr.dtype == np.float64 and lacks_float64(device): arr = arr.astype((like or dtypes.float32).np)
  return arr
