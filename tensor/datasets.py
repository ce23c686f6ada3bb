"""Small real data sets that ship with baregrad (nothing is downloaded at run time).

`load_digits()`: the 8x8 handwritten digits (UCI "Optical Recognition of Handwritten Digits", as
distributed with scikit-learn; see data/DIGITS_LICENSE.txt for the origin, the license and how the
fixed train/test split was made)."""
from __future__ import annotations
import os
import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def load_digits(normalize: bool = True, flatten: bool = True):
  """The digits as numpy arrays `(x_train, y_train, x_test, y_test)`: 1438 training and 359 test samples.

  x is float32 in [0, 1] (pixel / 16) when `normalize`, else the raw uint8 pixels 0..16; its shape is
  (N, 64) when `flatten`, else (N, 1, 8, 8) (NCHW, for conv nets). y holds the int32 labels 0..9."""
  path = os.path.join(DATA_DIR, "digits.npz")
  if not os.path.exists(path):
    raise FileNotFoundError(f"load_digits: {path} is missing; the baregrad install is incomplete "
                            f"(package data 'data/*' of baregrad.tensor)")
  with np.load(path) as f:
    arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
  out = []
  for split in ("train", "test"):
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"].astype(np.int32)
    if normalize: x = x.astype(np.float32) / np.float32(16.0)
    x = x.reshape(len(x), 64) if flatten else x.reshape(len(x), 1, 8, 8)
    out += [x, y]
  return tuple(out)


__all__ = ["load_digits"]
