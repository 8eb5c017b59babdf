"""Flux's `cat(xs...; dims)` spelling beside `concat([xs], axis)`."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, device


@pytest.mark.parametrize("dev", DEVICES)
def test_cat_varargs_with_dims_matches_concat_and_numpy(dev):
    d = device(dev)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((2, k, 3)).astype(np.float32) for k in (1, 4, 2))
    ta, tb, tc = d(a), d(b), d(c)
    want = np.concatenate([a, b, c], axis=1)
    for got in (tf.cat(ta, tb, tc, dims=1), tf.cat([ta, tb, tc], dims=1), tf.cat(ta, tb, tc, dims=-2),
                tf.cat(ta, tb, tc, axis=1), tf.concat([ta, tb, tc], axis=1)):
        assert got.device == d and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    # no keyword: along axis 0, as concat
    np.testing.assert_array_equal(tf.cat(ta, ta).numpy(), np.concatenate([a, a], axis=0))


@pytest.mark.parametrize("dev", DEVICES)
def test_cat_gradient_splits_back_to_each_input(dev):
    d = device(dev)
    a, b = d(np.ones((2, 3), np.float32)), d(np.full((2, 1), 2.0, np.float32))
    w = d(np.arange(8, dtype=np.float32).reshape(2, 4))
    ga, gb = tf.gradient(lambda x, y: (tf.cat(x, y, dims=1) * w).sum(), a, b)
    np.testing.assert_array_equal(ga.numpy(), w.numpy()[:, :3])
    np.testing.assert_array_equal(gb.numpy(), w.numpy()[:, 3:])


def test_cat_errors_name_the_problem():
    a = tf.zeros(2, 3)
    with pytest.raises(tf.ShapeError, match="at least one tensor"):
        tf.cat(dims=1)
    with pytest.raises(tf.ShapeError, match="must agree on every other axis"):
        tf.cat(a, tf.zeros(3, 3), dims=1)
    with pytest.raises(TypeError, match="give one of them"):
        tf.cat(a, a, dims=1, axis=0)
