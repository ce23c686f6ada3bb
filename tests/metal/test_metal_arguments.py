"""A kernel on Metal takes at most 31 buffers (Metal Feature Set Tables: the buffer argument table of a compute
function): the scheduler splits a kernel that would read more (compiler/rangeify.py MAX_KERNEL_ARGS), checked on the
emulated Metal against numpy; the emulated framework refuses a 32nd binding, as Metal's validation does."""
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)


def test_a_kernel_reading_40_buffers_is_split():
  from baregrad.tensor import Tensor
  from baregrad.compiler.rangeify import MAX_KERNEL_ARGS
  from baregrad.compiler.rangeify import KernelSpec
  rng = np.random.default_rng(0)
  arrays = [rng.standard_normal(16).astype(np.float32) for _ in range(40)]
  with settings.override(EMU=1):
    ts = [Tensor(a, device="METAL").realize() for a in arrays]
    out = ts[0]
    for i, t in enumerate(ts[1:]): out = out + t * (i + 1)     # one elementwise expression over 40 buffers
    items = out.schedule()
    kernels = [it for it in items if it.program is not None]
    assert len(kernels) >= 2 and all(len(it.bufs) <= MAX_KERNEL_ARGS["METAL"] for it in kernels), [len(it.bufs) for it in kernels]
    want = arrays[0] + sum(a * (i + 1) for i, a in enumerate(arrays[1:]))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    # the same expression on the CPU stays one kernel (no limit there)
    cpu = [Tensor(a, device="CPU") for a in arrays]
    c = cpu[0]
    for i, t in enumerate(cpu[1:]): c = c + t * (i + 1)
    assert len([it for it in c.schedule() if it.program is not None]) == 1
