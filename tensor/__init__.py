"""baregrad.tensor: the lazy Tensor API."""
from baregrad.compiler.dtype import dtypes, DType
from .tensor import Tensor

manual_seed = Tensor.manual_seed

__all__ = ["Tensor", "dtypes", "DType", "manual_seed"]
