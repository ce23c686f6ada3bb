"""Elementwise math, activations, initializers and dtype shorthands (torch names and defaults).

`ElementwiseOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph."""
from __future__ import annotations


class ElementwiseOps:
  """Mixed into `Tensor`."""
