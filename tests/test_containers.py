"""SkipConnection, Parallel, GlobalMeanPool: Flux semantics, gradients, printing, devices."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, device


@pytest.mark.parametrize("dev", DEVICES)
def test_skip_connection_residual_and_concat(dev):
    d = device(dev)
    inner = tf.Dense(3, 3, tf.relu)
    x_np = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    res = d(tf.SkipConnection(inner, tf.ops.add))
    x = d(x_np)
    want = np.maximum(x_np @ inner.weight.numpy().T, 0) + x_np
    np.testing.assert_allclose(res(x).numpy(), want, rtol=1e-5, atol=1e-6)
    cat = d(tf.SkipConnection(inner, lambda y, x: tf.concat([y, x], axis=1)))
    assert cat(x).shape == (4, 6)
    (g,) = tf.gradient(lambda m: m(x).sum(), res)
    assert set(g) == {"layer"} and g["layer"]["weight"].shape == (3, 3) and g["layer"]["weight"].device == d
    assert repr(tf.SkipConnection(inner, tf.ops.add)).startswith("SkipConnection(Dense(3 => 3, relu), +)")


@pytest.mark.parametrize("dev", DEVICES)
def test_parallel_one_or_many_inputs(dev):
    d = device(dev)
    a, b = tf.Dense(2, 3), tf.Dense(2, 3)
    p = d(tf.Parallel(tf.ops.add, a, b))
    x = d(np.ones((5, 2), np.float32))
    np.testing.assert_allclose(p(x).numpy(), a(np.ones((5, 2), np.float32)).numpy() + b(np.ones((5, 2), np.float32)).numpy(),
                               rtol=1e-5, atol=1e-6)
    y = d(np.zeros((5, 2), np.float32))
    np.testing.assert_allclose(p(x, y).numpy(), (a(np.ones((5, 2), np.float32)) + b(np.zeros((5, 2), np.float32))).numpy(),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="takes 1 input or 2"):
        p(x, x, x)
    (g,) = tf.gradient(lambda m: m(x).sum(), p)
    assert isinstance(g["layers"], list) and len(g["layers"]) == 2
    named = tf.Parallel(tf.ops.mul, left=tf.Dense(2, 2), right=tf.Dense(2, 2))
    (g,) = tf.gradient(lambda m: m(np.ones((1, 2), np.float32)).sum(), named)
    assert set(g["layers"]) == {"left", "right"}
    assert "Parallel(*, Dense(2 => 2), Dense(2 => 2))" in repr(named)


@pytest.mark.parametrize("dev", DEVICES)
def test_global_mean_pool(dev):
    d = device(dev)
    x_np = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = tf.GlobalMeanPool()(d(x_np))
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(y.numpy(), x_np.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.ShapeError, match="GlobalMeanPool"):
        tf.GlobalMeanPool()(tf.zeros(2, 3))
