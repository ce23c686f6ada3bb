"""Errors a user can act on: the right exception type, raised when the op is built, and a
message naming the shapes / index / device / dtype involved.
"""
import numpy as np
import pytest

from baregrad.tensor import Tensor


def _flat(msg):
  """message without spaces, so "(2, 3)" and "(2,3)" both match"""
  return str(msg).replace(" ", "")


def _names_shapes(excinfo, *shapes):
  msg = _flat(excinfo.value)
  for s in shapes:
    as_tuple, as_list = _flat(tuple(s)), _flat(list(s))
    assert as_tuple in msg or as_list in msg, f"message {str(excinfo.value)!r} does not name shape {s}"


BROADCAST = [
  ("add", (3,), (4,), lambda a, b: a + b),
  ("mul_2d", (2, 3), (3, 2), lambda a, b: a * b),
  ("where", (3,), (4,), lambda a, b: (a > 0).where(a, b)),
  ("maximum", (2, 5), (4,), lambda a, b: a.maximum(b)),
  ("cmp", (3, 2), (2, 3), lambda a, b: a < b),
]


@pytest.mark.parametrize("sa,sb,fn", [c[1:] for c in BROADCAST], ids=[c[0] for c in BROADCAST])
def test_broadcast_mismatch(sa, sb, fn):
  a, b = Tensor.ones(*sa), Tensor.ones(*sb)
  with pytest.raises(ValueError) as excinfo:
    fn(a, b)
  _names_shapes(excinfo, sa, sb)


def test_broadcast_mismatch_message_example():
  with pytest.raises(ValueError) as excinfo:
    Tensor([1, 2, 3]) + Tensor([1, 2, 3, 4])
  assert "(3,)" in _flat(excinfo.value) and "(4,)" in _flat(excinfo.value)


@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 2, 3), (2, 4, 1)), ((5,), (3, 2))],
                         ids=["2d", "vec", "batch", "vec_mat"])
def test_matmul_inner_mismatch(sa, sb):
  with pytest.raises(ValueError) as excinfo:
    Tensor.ones(*sa) @ Tensor.ones(*sb)
  _names_shapes(excinfo, sa, sb)


def test_matmul_batch_mismatch():
  with pytest.raises(ValueError):
    Tensor.ones(2, 3, 4) @ Tensor.ones(3, 4, 5)


@pytest.mark.parametrize("src,dst", [((2, 3), (4, 2)), ((6,), (4,)), ((2, 3), (-1, 4)), ((0, 3), (2,))],
                         ids=["2d", "1d", "infer", "empty"])
def test_reshape_wrong_size(src, dst):
  with pytest.raises(ValueError) as excinfo:
    Tensor.zeros(*src).reshape(*dst)
  msg = _flat(excinfo.value)
  assert _flat(tuple(src)) in msg or _flat(list(src)) in msg, f"message {msg!r} lacks source shape"


def test_reshape_two_minus_ones():
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).reshape(-1, -1)


@pytest.mark.parametrize("order", [(0, 0, 1), (0, 1), (0, 1, 3)], ids=["repeat", "too_short", "out_of_range"])
def test_bad_permute(order):
  with pytest.raises(ValueError) as excinfo:
    Tensor.zeros(2, 3, 4).permute(*order)
  _names_shapes(excinfo, (2, 3, 4))


def test_expand_incompatible():
  with pytest.raises(ValueError) as excinfo:
    Tensor.zeros(3).expand(4)
  _names_shapes(excinfo, (3,), (4,))


def test_pad_crop_past_the_dim_rejected():
  assert Tensor.zeros(3).pad(((-1, 0),)).shape == (2,)     # a negative amount crops (torch, tinygrad)
  with pytest.raises(ValueError):
    Tensor.zeros(3).pad(((-2, -2),))


INDEX = [
  ((3,), 3, "3"), ((3,), -4, "-4"), ((2, 3), (0, 5), "5"), ((2, 3), (2,), "2"), ((2, 3, 4), (Ellipsis, 4), "4"),
]


@pytest.mark.parametrize("shape,idx,name", INDEX, ids=["pos", "neg", "second_dim", "first_dim_tuple", "ellipsis"])
def test_getitem_out_of_range(shape, idx, name):
  t = Tensor(np.zeros(shape, np.float32))
  with pytest.raises(IndexError) as excinfo:
    t[idx]
  assert name in str(excinfo.value)


def test_getitem_too_many_indices():
  with pytest.raises(IndexError):
    Tensor.zeros(2, 3)[0, 0, 0]


def test_setitem_out_of_range():
  t = Tensor(np.zeros((3,), np.float32)).realize()
  with pytest.raises(IndexError) as excinfo:
    t[5] = 1.0
  assert "5" in str(excinfo.value)


def test_unknown_device():
  with pytest.raises(ValueError) as excinfo:
    Tensor([1], device="FOO")
  msg = str(excinfo.value)
  assert "FOO" in msg
  assert Tensor([1]).device.split(":")[0] in msg, f"message {msg!r} does not list the available devices"


def test_unknown_device_in_to():
  with pytest.raises(ValueError) as excinfo:
    Tensor([1]).to("FOO")
  assert "FOO" in str(excinfo.value)


@pytest.mark.parametrize("dtype", ["complex64", "float128x", "foo_dtype"])
def test_unsupported_cast(dtype):
  with pytest.raises((TypeError, ValueError)) as excinfo:
    Tensor([1.0]).cast(dtype)
  assert dtype in str(excinfo.value)


def test_unsupported_dtype_at_creation():
  with pytest.raises((TypeError, ValueError)) as excinfo:
    Tensor([1.0], dtype="complex64")
  assert "complex64" in str(excinfo.value)


def test_unsupported_numpy_array_dtype():
  with pytest.raises((TypeError, ValueError)) as excinfo:
    Tensor(np.array([1 + 2j], np.complex64))
  assert "complex64" in str(excinfo.value)


def test_bitcast_incompatible_size():
  with pytest.raises((TypeError, ValueError)) as excinfo:
    Tensor(np.zeros(3, np.int8)).bitcast("int32")
  msg = str(excinfo.value)
  assert "int8" in msg and "int32" in msg


@pytest.mark.parametrize("shape", [(2,), (2, 3), (0,)], ids=["vec", "mat", "empty"])
def test_item_on_non_single_element(shape):
  with pytest.raises((ValueError, RuntimeError)):
    Tensor.zeros(*shape).item()


def test_reduce_bad_axis():
  with pytest.raises((ValueError, IndexError)):
    Tensor.zeros(2, 3).sum(2)


def test_cat_shape_mismatch():
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).cat(Tensor.zeros(2, 4), dim=0)


def test_conv2d_channel_mismatch():
  with pytest.raises(ValueError):
    Tensor.zeros(1, 3, 5, 5).conv2d(Tensor.zeros(2, 4, 3, 3))


def test_assign_shape_mismatch():
  t = Tensor.zeros(2, 3).contiguous().realize()
  with pytest.raises(ValueError):
    t.assign(Tensor.zeros(3, 2))


def test_ragged_list():
  with pytest.raises((ValueError, TypeError)):
    Tensor([[1, 2], [3]])


def test_sum_duplicate_axis():
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).sum((0, 0))


def test_flip_duplicate_axis():
  with pytest.raises(ValueError):
    Tensor.zeros(2, 3).flip(1, 1)


def test_rand_int_dtype_rejected():
  with pytest.raises((TypeError, ValueError)) as excinfo:
    Tensor.rand(3, dtype="int32")
  assert "int32" in str(excinfo.value)


def test_python_int_out_of_int32_range_not_silently_wrapped():
  try:
    t = Tensor(2 ** 40)
  except (OverflowError, ValueError, TypeError):
    return
  assert t.item() == 2 ** 40, f"Tensor(2**40) silently became {t.item()} ({t.dtype})"


def test_weak_int_scalar_out_of_range_not_silently_wrapped():
  try:
    t = Tensor([1, 2]) + 2 ** 40
  except (OverflowError, ValueError, TypeError):
    return
  assert t.tolist() == [1 + 2 ** 40, 2 + 2 ** 40], f"int32 + 2**40 silently gave {t.tolist()} ({t.dtype})"
