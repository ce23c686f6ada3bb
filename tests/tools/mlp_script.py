"""A 2-layer MLP forward (+ a JIT-replayed step) used by the capture/replay tests; prints the output checksum."""
import numpy as np
from baregrad.tensor import Tensor
from baregrad.tensor.jit import jit

rng = np.random.default_rng(0)
w1, b1 = Tensor(rng.standard_normal((32, 16)).astype(np.float32) * 0.1), Tensor(np.zeros(16, np.float32))
w2, b2 = Tensor(rng.standard_normal((16, 10)).astype(np.float32) * 0.1), Tensor(np.zeros(10, np.float32))


def mlp(x): return ((x @ w1 + b1).relu() @ w2 + b2).softmax()


x = rng.standard_normal((8, 32)).astype(np.float32)   # small: the emulated GPUs run it too
out = mlp(Tensor(x)).numpy()
step = jit(mlp)
for i in range(4): out_jit = step(Tensor(x * (i + 1))).numpy()
ref = np.maximum(x * 4 @ w1.numpy() + b1.numpy(), 0) @ w2.numpy() + b2.numpy()
ref = np.exp(ref - ref.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
assert np.allclose(out_jit, ref, atol=1e-5), "jit output differs from numpy"
print(f"ok {float(out.sum()):.6f} {float(out_jit.sum()):.6f}")
