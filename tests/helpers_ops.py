"""Shared helpers for the op tests: compare a baregrad Tensor with a numpy reference.

Every check asserts shape, dtype and values. numpy has no bfloat16, so a bfloat16 tensor is
compared with a float32 array whose values were rounded to bfloat16 (`bf16_round`), and its
`numpy()` must come back as float32 (the documented export rule).

A device may lack float64 (METAL: MSL has no double; tensor/device_dtypes.py): the cases that compute in float64 are
marked `needs_float64` (conftest.py skips them there, `needs_float64_cases` marks parametrize values), a test that
loops over dtypes loops over `default_has(...)`, and a result numpy gives in float64 for precision (the mean of ints)
is expected in `widest_float_name()`.
"""
import numpy as np
import pytest

from baregrad.tensor import Tensor, dtypes

ALL_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint32",
              "float16", "bfloat16", "float32", "float64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
INT_DTYPES = ["int8", "uint8", "int16", "int32", "int64", "uint32"]
SIGNED_INT_DTYPES = ["int8", "int16", "int32", "int64"]

# (rtol, atol) used when a test does not give its own
TOLERANCES = {
  "float64": (1e-10, 1e-12),
  "float32": (1e-5, 1e-6),
  "float16": (5e-3, 5e-3),
  "bfloat16": (3e-2, 3e-2),
}


def _is_float64(value):
  return (isinstance(value, str) and value == "float64") or value is dtypes.float64


def needs_float64_cases(values, at=None):
  """The parametrize `values` with each one that names float64 wrapped in pytest.param(..., marks=needs_float64).

  A value names float64 when it is "float64" (or dtypes.float64), or a tuple (the values of several argnames) with
  such an element; `at` limits the look to those tuple positions (e.g. at=(0,): only the input dtype). Ids are kept:
  an `ids=` list still applies by position, and a value without one gets the id it would have had."""
  out = []
  for v in values:
    if isinstance(v, tuple):
      picked = v if at is None else [v[i] for i in at]
      out.append(pytest.param(*v, marks=pytest.mark.needs_float64) if any(map(_is_float64, picked)) else v)
    else:
      out.append(pytest.param(v, marks=pytest.mark.needs_float64) if _is_float64(v) else v)
  return out


def _default_device():
  from baregrad.hcq.device import Device
  return Device.default()            # the name only: no device is opened


def default_has(names):
  """The dtype names of `names` that the default device has (all but float64 where it lacks float64)."""
  from baregrad.tensor.device_dtypes import lacks_float64
  return [n for n in names if n != "float64"] if lacks_float64(_default_device()) else list(names)


def has_float64():
  """Whether the default device has float64."""
  return bool(default_has(["float64"]))


def as_widest(values):
  """`values` as a numpy array of the widest float the default device has (float64, or float32 without it): for the
  tests that compute in float64 only for headroom, so that they run in float32 on a device without float64."""
  return np.asarray(values, dtype=widest_float_name())


def widest_float_name():
  """The float dtype the default device computes in where numpy picks float64 for precision (the mean/var/std of
  ints): "float64", or "float32" where the device has no float64 (tensor/device_dtypes.py `widest_float`)."""
  from baregrad.tensor.device_dtypes import widest_float
  return widest_float(_default_device()).name


def bg_dtype(name):
  """The baregrad DType called `name` ("float32", ...)."""
  return getattr(dtypes, name)


def np_dtype(name):
  """The numpy dtype that `numpy()` returns for a baregrad dtype name (bfloat16 -> float32)."""
  return np.dtype(np.float32) if name == "bfloat16" else np.dtype(name)


def bf16_round(x):
  """Round float32 values to the nearest bfloat16 (ties to even); returned as float32."""
  x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
  bits = x.view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  out = bits.astype(np.uint32).view(np.float32).reshape(x.shape)
  return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def round_to(x, name):
  """numpy values as they would be stored in baregrad dtype `name` (float32 array for bfloat16)."""
  x = np.asarray(x)
  if name == "bfloat16":
    return bf16_round(x.astype(np.float32))
  return x.astype(np_dtype(name))


def make(values, name):
  """A baregrad tensor of dtype `name` holding `values` (rounded to the dtype first)."""
  if name == "bfloat16":
    return Tensor(bf16_round(np.asarray(values, dtype=np.float32)), dtype=dtypes.bfloat16)
  return Tensor(np.asarray(values).astype(np_dtype(name)))


def check(t, expected, rtol=None, atol=None, dtype=None):
  """Assert that baregrad tensor `t` matches numpy `expected` in shape, dtype and values.

  `dtype` names the expected baregrad dtype; by default it is `expected.dtype`. For bfloat16
  pass dtype="bfloat16" and a float32 `expected` holding bfloat16-rounded values.
  """
  expected = np.asarray(expected)
  name = dtype if dtype is not None else expected.dtype.name
  assert isinstance(t, Tensor), f"expected a Tensor, got {type(t)}"
  assert tuple(t.shape) == expected.shape and isinstance(t.shape, tuple), \
    f"shape {t.shape} != expected {expected.shape}"
  assert t.dtype == bg_dtype(name), f"dtype {t.dtype} != expected {name}"
  out = t.numpy()
  assert isinstance(out, np.ndarray), f"numpy() returned {type(out)}"
  assert out.shape == expected.shape, f"numpy() shape {out.shape} != expected {expected.shape}"
  assert out.dtype == np_dtype(name), f"numpy() dtype {out.dtype} != expected {np_dtype(name)}"
  if np_dtype(name).kind == "f":
    default_rtol, default_atol = TOLERANCES[name]
    np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64),
                               rtol=default_rtol if rtol is None else rtol,
                               atol=default_atol if atol is None else atol, equal_nan=True)
  else:
    np.testing.assert_array_equal(out, expected.astype(np_dtype(name)))
  return out


def rng(seed=0):
  return np.random.default_rng(seed)


def randf(shape, low=-2.0, high=2.0, seed=0, dtype=np.float32):
  return np.asarray(rng(seed).uniform(low, high, size=shape)).astype(dtype)


def randi(shape, low=-10, high=10, seed=0, dtype=np.int32):
  return np.asarray(rng(seed).integers(low, high, size=shape)).astype(dtype)
