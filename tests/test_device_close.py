"""A tensor whose device was closed (Device.close): on a GPU its memory went with that device, so using it — in a
kernel on the device of that name opened since, or reading it back — raises a clear error instead of reading another
device's memory (it read zeros on the emulated AMD and Metal, and faulted on NV). On the CPU the memory is the host's
and stays valid: the values are numpy's."""
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.hcq.buffer import DeviceClosedError
from baregrad.hcq.device import Device
from baregrad.tensor import Tensor


@pytest.mark.parametrize("kind", ["AMD", "NV", "METAL"])
def test_a_tensor_of_a_closed_gpu_is_refused(kind):
  name = f"{kind}:3"                   # an emulated GPU of its own (EMU=1): the other tests' devices stay open
  with settings.override(EMU=1):
    try: Device.get(name)
    except RuntimeError as e: pytest.skip(str(e))
    w = Tensor(np.ones((8, 16), np.float32), device=name).realize()
    Device.get(name).close()
    with pytest.raises(DeviceClosedError, match=rf"allocated on {kind}:3 before that device was closed .*\.numpy\(\)"):
      (Tensor(np.ones((3, 8), np.float32), device=name) @ w).numpy()
    with pytest.raises(DeviceClosedError): w.numpy()
    fresh = Tensor(np.full((3, 8), 2, np.float32), device=name) @ Tensor(np.ones((8, 16), np.float32), device=name)
    np.testing.assert_array_equal(fresh.numpy(), np.full((3, 16), 16, np.float32))   # the new device works
    Device.get(name).close()


def test_a_tensor_of_a_closed_cpu_device_keeps_its_values():
  wn = np.arange(128, dtype=np.float32).reshape(8, 16)
  w = Tensor(wn, device="CPU:3").realize()
  Device.get("CPU:3").close()
  np.testing.assert_array_equal((Tensor(np.ones((3, 8), np.float32), device="CPU:3") @ w).numpy(),
                                np.ones((3, 8), np.float32) @ wn)
  np.testing.assert_array_equal(w.numpy(), wn)
  Device.get("CPU:3").close()
