"""Scans, sorting, gathering and scattering, masks, triangles and diagonals (torch names and defaults).

`SelectionOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph."""
from __future__ import annotations


class SelectionOps:
  """Mixed into `Tensor`."""
