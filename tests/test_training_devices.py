"""The same small training run on CPUDevice and on the CUDA device (the
Triton interpreter in CI, a GPU elsewhere) gives the same loss curve."""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise


def run(device, steps=12, seed=0):
    tf.seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((24, 5)).astype(np.float32)
    labels = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    y = losses.onehotbatch(labels, range(3))
    model = device(tf.Chain(tf.Dense(5, 16, tf.relu), tf.Dense(16, 3)))
    opt = optimise.setup(optimise.Adam(0.02), model)
    loader = device(tf.DataLoader((x, y), batchsize=8, shuffle=True, rng=seed))
    curve = []
    for _ in range(steps // len(loader)):
        for xb, yb in loader:
            loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(xb), yb), model)
            optimise.update(opt, model, g)
            curve.append(float(loss))
    return np.array(curve), tf.cpu(model)


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_same_loss_curve_on_cpu_and_cuda():
    c_cpu, m_cpu = run(tf.cpu_device())
    c_gpu, m_gpu = run(tf.CUDADevice(0))
    assert c_cpu[-1] < c_cpu[0]
    np.testing.assert_allclose(c_gpu, c_cpu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m_gpu[0].weight.numpy(), m_cpu[0].weight.numpy(), rtol=1e-4, atol=1e-5)
