"""The device dtype rule on METAL (tensor/device_dtypes.py): Metal has no float64 (MSL spec 2.1: double is not
supported), so its renderer declares none; the Tensor layer then computes in float32 where it would pick float64
(cos of float32, mean/var/std and isclose of ints) and refuses a float64 tensor where it is made, with a message
naming the op, the device and what to use. Devices with float64 keep it (the op suite on them checks their results)."""
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework

with settings.override(EMU=1): AVAILABLE, WHY = framework.available()


def test_the_renderers_declare_which_devices_have_float64():
  from baregrad.compiler.render_c import CRenderer
  from baregrad.compiler.render_msl import MSLRenderer
  from baregrad.compiler.render_amd import AMDRenderer
  from baregrad.compiler.render_ptx import PTXRenderer
  from baregrad.compiler.dtype import dtypes
  from baregrad.tensor.device_dtypes import lacks_float64, widest_float
  assert dtypes.float64 not in MSLRenderer.native_ops.dtypes
  assert all(dtypes.float64 in r.native_ops.dtypes for r in (CRenderer, AMDRenderer, PTXRenderer))
  assert lacks_float64("METAL") == ("METAL",) and lacks_float64(("CPU", "METAL:1")) == ("METAL",)
  assert lacks_float64("CPU") == () and widest_float("CPU") == dtypes.float64 and widest_float("METAL") == dtypes.float32


@pytest.fixture(scope="module")
def metal():
  """The METAL device (emulated), closed again if this module opened it."""
  if not AVAILABLE: pytest.skip(WHY)
  from baregrad.hcq.device import Device
  opened = "METAL" not in Device._open
  with settings.override(EMU=1):
    Device.get("METAL")
    yield "METAL"
    if opened: Device.get("METAL").close()


def _refused(make, op: str):
  with pytest.raises(TypeError, match=rf"^{op}: METAL has no float64 \(its kernel language has no 64-bit float type\): "
                                      r"use float32, or another device$"):
    make()


def test_float64_is_refused_where_it_is_made(metal):
  from baregrad.tensor import Tensor, dtypes
  ints, floats = Tensor(np.arange(4, dtype=np.int64), device=metal), Tensor([1.5, 2.5], device=metal)
  data = "Tensor of float64 data \\(dtype=float32 converts it\\)"
  _refused(lambda: Tensor(np.zeros(3), device=metal), data)                  # numpy's default float is float64
  _refused(lambda: Tensor([1.0, 2.0], dtype=dtypes.float64, device=metal), data)
  _refused(lambda: Tensor(np.float64(2.5), device=metal), "a float64 constant")
  _refused(lambda: Tensor.zeros(2, 3, dtype="float64", device=metal), "a float64 constant")
  _refused(lambda: Tensor.empty(4, dtype=dtypes.float64, device=metal), "empty")
  _refused(lambda: Tensor.rand(3, dtype=dtypes.float64, device=metal), "cast to float64")
  _refused(lambda: Tensor.arange(5, dtype=dtypes.float64, device=metal), "cast to float64")
  _refused(lambda: floats.double(), "cast to float64")
  _refused(lambda: floats.sum(dtype=dtypes.float64), "cast to float64")
  _refused(lambda: ints.bitcast(dtypes.float64), "bitcast to float64")
  _refused(lambda: Tensor(np.ones(2), device="CPU").to(metal), "to")
  np.testing.assert_array_equal(Tensor(np.arange(3.0), dtype=dtypes.float32, device=metal).numpy(), [0, 1, 2])


def test_float64_choices_become_float32(metal):
  from baregrad.tensor import Tensor, dtypes
  a = np.random.default_rng(3).integers(-1000, 1000, (5, 7)).astype(np.int32)
  t = Tensor(a, device=metal)
  for got, want in ((t.mean(1), a.mean(1)), (t.var(0), a.var(0, ddof=1)), (t.std(), a.std(ddof=1)),
                    (Tensor([True, False, True], device=metal).mean(), np.float64(2 / 3))):
    assert got.dtype == dtypes.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-6)
  np.testing.assert_array_equal(t.isclose(t + 1, atol=1).numpy(), np.ones_like(a, bool))
  np.testing.assert_array_equal(t.isclose(t + 2, atol=1).numpy(), np.zeros_like(a, bool))


def test_cos_without_float64_is_as_precise_as_sin(metal):
  """cos x = 1 - 2 sin^2(x/2) in float32: within 3e-7 of cos x (float64 reference) for small and large x alike."""
  from baregrad.tensor import Tensor
  rng = np.random.default_rng(4)
  x = np.concatenate([rng.uniform(-10, 10, 2000), rng.uniform(-1e5, 1e5, 2000), np.arange(-64, 65) * (np.pi / 2),
                      [0.0, 1e-30, 3e4, 1e7, 3.4e38]]).astype(np.float32)
  got = Tensor(x, device=metal).cos().numpy()
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, np.cos(x.astype(np.float64)), rtol=0, atol=3e-7)
  z = Tensor.randn(4096, device=metal).numpy()
  assert np.isfinite(z).all() and abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1


def test_host_float_lists_feed_losses_and_masks(metal):
  """Python floats are float64 to numpy: a loss's class weights, pos_weight or float targets, and an attention mask given
  as lists work on METAL (in the computation's float dtype), against numpy in float64."""
  from baregrad.tensor import Tensor
  rng = np.random.default_rng(3)
  xn, w, tgt = rng.standard_normal((4, 3)).astype(np.float32), [1.0, 2.0, 0.5], [0, 2, 1, 2]
  with settings.override(EMU=1):
    got = Tensor(xn, device=metal).cross_entropy(tgt, weight=w).numpy()
    logp = xn - np.log(np.exp(xn.astype(np.float64)).sum(1, keepdims=True))
    wt = np.array(w)[tgt]
    np.testing.assert_allclose(got, -(wt * logp[np.arange(4), tgt]).sum() / wt.sum(), rtol=1e-5)
    p = np.array([0.2, 0.7, 0.9], np.float32)
    got = Tensor(p, device=metal).binary_crossentropy([1.0, 0.0, 1.0]).numpy()
    y = np.array([1.0, 0.0, 1.0])
    np.testing.assert_allclose(got, -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(), rtol=1e-5)
    q = rng.standard_normal((1, 2, 4)).astype(np.float32)
    mask = [[0.0, -1e9], [0.0, 0.0]]
    got = Tensor(q, device=metal).scaled_dot_product_attention(Tensor(q, device=metal), Tensor(q, device=metal),
                                                                attn_mask=mask).numpy()
    s = q.astype(np.float64) @ q.astype(np.float64).transpose(0, 2, 1) / 2.0 + np.array(mask)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(-1, keepdims=True)) @ q, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"weight must have shape \(3,\)"):
      Tensor(xn, device=metal).cross_entropy(tgt, weight=[1.0, 2.0])


def test_a_float64_safetensors_entry_names_itself(metal, tmp_path):
  from baregrad.tensor import Tensor
  from baregrad.tensor.safetensors import save_file, load_file
  path = tmp_path / "w.safetensors"
  save_file({"w64": Tensor(np.arange(3, dtype=np.float64), device="CPU")}, path)
  with settings.override(EMU=1):
    with pytest.raises(TypeError, match=r"^load_file: entry 'w64' is F64 \(load the file on CPU, device='CPU', and cast "
                                        r"it to float32 there\): METAL has no float64"):
      load_file(path, device=metal)
    t = load_file(path, device="CPU")["w64"].cast("float32").to(metal)
    assert t.numpy().tolist() == [0.0, 1.0, 2.0]


def test_a_traced_function_that_reads_values_is_refused_on_metal(metal):
  """The runtime's allocation check meets the tracing placeholder: the tracing error, not an AttributeError."""
  from baregrad.tensor import Tensor
  from baregrad.tensor.function import function, FunctionError
  @function
  def f(x): return x * float((x + 1).sum().item())
  with settings.override(EMU=1):
    with pytest.raises(FunctionError, match="cannot be traced"): f(Tensor(np.ones(4, np.float32), device=metal))
