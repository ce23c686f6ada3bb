"""Gathers: an embedding lookup and an index with an index tensor are a one-hot mask times the table summed over its
rows in the Tensor graph; the kernel reads only the rows it needs (compiler/gather.py). Values against numpy,
including indices out of range (an Embedding gives a row of zeros there)."""
import numpy as np
import pytest
from baregrad.tensor import Tensor
from baregrad.tensor.nn import Embedding
from baregrad.compiler import schedule
from baregrad.compiler.rangeify import rangeify
from baregrad.compiler.uop import Ops


def kernel_asts(t: Tensor) -> list:
  sink, _, _ = schedule.normalize(t.uop.sink())
  return [k.ast for k in rangeify(sink, lambda n: n.device).items]


def test_embedding_reads_only_its_rows():
  emb = Embedding(50, 8)
  table = emb.weight.numpy()
  idx = np.array([[3, 7, 49], [0, 3, 12]], np.int32)
  out = emb(Tensor(idx))
  (ast,) = kernel_asts(out)
  assert not any(u.op is Ops.REDUCE for u in ast.toposort()), "the lookup still sums over the table"
  np.testing.assert_array_equal(out.numpy(), table[idx])
  bad = emb(Tensor(np.array([-1, 50, 2], np.int32))).numpy()    # out of range: zeros, as the one-hot sum gave
  np.testing.assert_array_equal(bad, np.stack([np.zeros(8), np.zeros(8), table[2]]).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_index_tensor_gathers(dtype):
  a = (np.arange(60).reshape(5, 12) * 3 - 40).astype(dtype)
  t = Tensor(a)
  for idx in ([4, 0, 4], [[1, 2], [3, -1]]):
    np.testing.assert_array_equal(t[Tensor(np.array(idx, np.int32))].numpy(), a[np.array(idx)])
    np.testing.assert_array_equal(t[:, Tensor(np.array(idx, np.int32))].numpy(), a[:, np.array(idx)])


def test_gradient_of_a_lookup_still_scatters():
  emb = Embedding(6, 3)
  idx = Tensor(np.array([1, 4, 1], np.int32))
  emb(idx).sum().backward()
  want = np.zeros((6, 3), np.float32)
  np.add.at(want, [1, 4, 1], 1.0)
  np.testing.assert_array_equal(emb.weight.grad.numpy(), want)
