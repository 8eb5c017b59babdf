"""triflux.models.UNet: shapes, errors, a training step on both devices."""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise
from triflux.models import UNet
from helpers import device


def test_unet_shapes_and_size_errors():
    m = UNet(3, 4, depth=2, base_channels=4)
    y = m(np.zeros((2, 3, 8, 12), np.float32))
    assert y.shape == (2, 4, 8, 12)
    with pytest.raises(tf.ShapeError, match=r"divisible by 2\^2 = 4.*\(1, 3, 6, 8\)"):
        m(np.zeros((1, 3, 6, 8), np.float32))
    assert "Total:" in repr(m.net) and "SkipConnection" in repr(m.net)
    up = UNet(1, 2, depth=1, base_channels=2, up="upsample")
    assert up(np.zeros((1, 1, 4, 4), np.float32)).shape == (1, 2, 4, 4)


def _step(dev, seed=0):
    tf.seed(seed)
    d = device(dev)
    m = d(UNet(2, 3, depth=2, base_channels=4))
    rng = np.random.default_rng(seed)
    x = d(rng.standard_normal((2, 2, 8, 8)).astype(np.float32))
    y = d(np.moveaxis(np.eye(3, dtype=np.float32)[rng.integers(0, 3, (2, 8, 8))], -1, 1))
    opt = optimise.setup(optimise.Adam(1e-2), m)
    curve = []
    for _ in range(3):
        loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), m)
        optimise.update(opt, m, g)
        curve.append(float(loss))
    return np.array(curve), g


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_unet_training_step_agrees_on_both_devices():
    c_cpu, g_cpu = _step("cpu")
    c_gpu, g_gpu = _step("cuda")
    assert c_cpu[-1] < c_cpu[0]
    np.testing.assert_allclose(c_gpu, c_cpu, rtol=1e-3, atol=1e-4)
    w_cpu = g_cpu["net"]["layers"][1]["weight"].numpy()
    np.testing.assert_allclose(g_gpu["net"]["layers"][1]["weight"].numpy(), w_cpu, rtol=1e-3, atol=1e-4)
