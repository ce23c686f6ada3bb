"""End to end training on the digits that ship with baregrad: a jitted training step (forward, backward and
optimizer update in one `jit`) learns them, and gives the same losses and weights as the eager step."""
import numpy as np
import pytest
from baregrad.tensor import Tensor, nn, optim
from baregrad.tensor.datasets import load_digits
from baregrad.tensor.jit import jit
from baregrad.compiler import schedule
from baregrad.tools import demo


def test_digits_data():
  x_train, y_train, x_test, y_test = load_digits()
  assert x_train.shape == (1438, 64) and x_test.shape == (359, 64)
  assert x_train.dtype == np.float32 and y_train.dtype == np.int32
  assert x_train.min() == 0 and x_train.max() == 1
  assert sorted(set(y_train.tolist())) == list(range(10)) and sorted(set(y_test.tolist())) == list(range(10))
  counts = np.bincount(y_test, minlength=10)
  assert counts.min() >= 34 and counts.max() <= 37   # 20% of each class
  raw = load_digits(normalize=False, flatten=False)
  assert raw[0].shape == (1438, 1, 8, 8) and raw[0].dtype == np.uint8 and raw[0].max() == 16
  np.testing.assert_array_equal(raw[0].reshape(1438, 64) / 16, x_train)


def test_jitted_training_reaches_accuracy():
  model, losses, _, _ = demo.train(steps=250, batch=128, lr=0.01, seed=0)
  _, _, x_test, y_test = load_digits()
  acc = demo.accuracy(model, x_test, y_test)
  assert np.mean(losses[:10]) > 1.0 and np.mean(losses[-10:]) < 0.1
  assert acc >= 0.95, f"test accuracy {acc:.3f}"


def test_jitted_step_matches_eager_step():
  eager_model, eager_losses, _, _ = demo.train(steps=5, batch=128, seed=3, use_jit=False)
  jit_model, jit_losses, _, _ = demo.train(steps=5, batch=128, seed=3, use_jit=True)
  np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-6)
  assert len(set(jit_losses)) == 5   # the weights really change between steps
  for (k, a), (_, b) in zip(eager_model.state_dict().items(), jit_model.state_dict().items()):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_jitted_step_with_batchnorm_and_sgd():
  """Running statistics (assigned inside the step) and momentum buffers update on every replay as in eager mode."""
  x_train, y_train, _, _ = load_digits(flatten=False)
  rng = np.random.default_rng(0)
  batches = [rng.choice(len(x_train), 16, replace=False) for _ in range(4)]
  results = []
  for use_jit in (False, True):
    Tensor.manual_seed(11)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), Tensor.relu, lambda x: x.flatten(1), nn.Linear(144, 10))
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    step = demo.make_train_step(model, opt)
    if use_jit: step = jit(step)
    losses = []
    for k, i in enumerate(batches):
      if k == 2: built = dict(schedule.stats)
      losses.append(step(Tensor(x_train[i]), Tensor(y_train[i])).item())
    if use_jit: assert schedule.stats == built, "replayed steps must not schedule anything"
    results.append((losses, {k: v.numpy() for k, v in model.state_dict().items()}))
  (l_eager, sd_eager), (l_jit, sd_jit) = results
  np.testing.assert_allclose(l_jit, l_eager, rtol=1e-5)
  assert sd_eager["layers.1.num_batches_tracked"].tolist() == [4] == sd_jit["layers.1.num_batches_tracked"].tolist()
  for k in sd_eager:
    np.testing.assert_allclose(sd_jit[k], sd_eager[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_demo_cli(capsys):
  with pytest.raises(SystemExit) as e:
    demo.main(["--steps", "3", "--target", "1.01"])
  assert e.value.code == 1
  out = capsys.readouterr().out
  assert "MISSED" in out and "step 3/3" in out and "test accuracy" in out
