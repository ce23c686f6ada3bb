"""A small conv net forward (conv -> relu -> pool -> linear) used by the capture/replay tests."""
import numpy as np
from baregrad.tensor import Tensor

rng = np.random.default_rng(0)
x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.3
fc = rng.standard_normal((4 * 3 * 3, 5)).astype(np.float32) * 0.2
h = Tensor(x).conv2d(Tensor(w)).relu().max_pool2d(2)
out = (h.reshape(2, -1) @ Tensor(fc)).numpy()
# numpy reference
cols = np.stack([x[:, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)], -1)        # (2,1,6,6,9)
conv = np.einsum("bchwk,ock->bohw", cols, w.reshape(4, 1, 9))
pool = np.maximum(conv, 0).reshape(2, 4, 3, 2, 3, 2).max((3, 5))
ref = pool.reshape(2, -1) @ fc
assert np.allclose(out, ref, atol=1e-4), f"conv net differs from numpy: {np.abs(out - ref).max()}"
print(f"ok {float(out.sum()):.6f}")
