"""No Objective-C object leaked or over-released by the METAL device, as the emulated runtime counts them
(drivers/emu/objc_runtime.py: live objects, over-releases, messages to freed objects, autoreleases with no pool).

The check closes every open METAL device, then asks the runtime for what is still alive: nothing may be. Run after
the op suite, it checks the op suite:
    EMU=1 DEV=METAL python -m pytest -q tests/test_ops.py tests/metal/test_metal_leaks.py
Alone (or after anything else) it first runs a mix of ops on METAL that touches every kind of object the driver makes:
buffers, libraries and pipelines, command buffers with compute and blit encoders, shared events, and a JIT replayed
through an indirect command buffer."""
import gc
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)


def _many_ops(device: str):
  from baregrad.tensor import Tensor, dtypes
  from baregrad.tensor.jit import jit
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((9, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  np.testing.assert_allclose((ta @ tb).relu().sum(0).numpy(), np.maximum(a @ b, 0).sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ta.cast(dtypes.float16).exp().max(1).numpy(),
                             np.exp(a.astype(np.float16)).max(1), rtol=2e-3)
  np.testing.assert_array_equal(ta.to("CPU").to(device)[1:3, ::2].numpy(), a[1:3, ::2])    # copies both ways
  np.testing.assert_array_equal((Tensor(np.arange(-7, 8, dtype=np.int8), device=device) % 4).numpy(), np.arange(-7, 8) % 4)
  f = jit(lambda x: (x @ tb).softmax(1))
  for _ in range(4):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    e = np.exp(x @ b - (x @ b).max(1, keepdims=True))
    np.testing.assert_allclose(f(Tensor(x, device=device)).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_no_object_is_left_alive_or_over_released_after_closing_the_device():
  from baregrad.hcq.device import Device
  from baregrad.drivers.emu.objc_runtime import runtime
  with settings.override(EMU=1):
    _many_ops("METAL")
    gc.collect()
    for name in [n for n in Device._open if n.partition(":")[0] == "METAL"]: Device._open[name].close()
  gc.collect()
  rt = runtime()
  assert not rt.live() and not rt.errors, rt.report()
  assert rt.counts["allocated"] == rt.counts["deallocated"] > 0, rt.report()
