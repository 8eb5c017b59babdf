"""On the Triton path torch may allocate memory, make views and copy, and
nothing else: a full training step runs under torch's dispatch hooks and
fails if torch computed anything."""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise
from torch_ops import assert_torch_only_moves_memory

pytestmark = pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")

def test_training_step_uses_torch_only_for_memory():
    pytest.importorskip("torch")
    dev = tf.CUDADevice(0)
    rng = np.random.default_rng(0)
    model = dev(tf.Chain(tf.Dense(6, 8, tf.relu), tf.Dense(8, 8, tf.gelu), tf.Dense(8, 3)))
    x = dev(rng.standard_normal((5, 6)).astype(np.float32))
    y = dev(losses.onehotbatch(rng.integers(0, 3, 5), range(3)))
    opt = optimise.setup(optimise.Adam(1e-2), model)
    def step():
        loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y) + losses.mse(tf.softmax(m(x)), y), model)
        optimise.update(opt, model, g)
        extra = (x[:, ::-1].sum(axis=0) / 2).max() + tf.concat([x, x], axis=1).mean()
        float(loss), float(extra)
    ops = assert_torch_only_moves_memory(step, "a training step on the Triton path")
    assert ops & {"empty.memory_format", "empty_strided.default"}, "no device memory was allocated?"


def test_unet_step_uses_torch_only_for_memory():
    pytest.importorskip("torch")
    from triflux.models import UNet
    dev = tf.CUDADevice(0)
    rng = np.random.default_rng(1)
    model = dev(tf.Chain(UNet(2, 3, depth=1, base_channels=2, up="convtranspose"), tf.Dropout(0.2)))
    up = dev(UNet(2, 3, depth=1, base_channels=2, up="upsample"))
    x = dev(rng.standard_normal((2, 2, 4, 4)).astype(np.float32))
    y = dev(np.moveaxis(np.eye(3, dtype=np.float32)[rng.integers(0, 3, (2, 4, 4))], -1, 1))
    opt = optimise.setup(optimise.Adam(1e-2), model)

    def step():
        loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), model)
        optimise.update(opt, model, g)
        tf.gradient(lambda m: losses.mse(tf.softmax(m(x)), y) + tf.MeanPool(2)(x).sum(), up)
        float(loss)
    assert_torch_only_moves_memory(step, "a UNet training step on the Triton path")
