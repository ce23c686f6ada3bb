"""Convolutions (N-D, transposed), pooling, padding modes and interpolation (torch names and defaults).

`SpatialOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph."""
from __future__ import annotations


class SpatialOps:
  """Mixed into `Tensor`."""
