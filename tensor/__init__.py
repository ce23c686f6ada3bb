"""baregrad.tensor: the lazy Tensor API."""
from baregrad.compiler.dtype import dtypes, DType
from .tensor import Tensor
from .composite import (ShapeError, DimError, ArgumentError, ModeError, DTypeError, IndexTypeError, RangeOverflowError,
                        DTypeArgumentError, ArgumentTypeError)

manual_seed = Tensor.manual_seed

__all__ = ["Tensor", "dtypes", "DType", "manual_seed", "ShapeError", "DimError", "ArgumentError", "ModeError",
           "DTypeError", "IndexTypeError", "RangeOverflowError", "DTypeArgumentError", "ArgumentTypeError"]
