"""Conv, ConvTranspose, pools, Upsample, BatchNorm, Dropout against torch.nn
with the same weights, forward and gradients, on both devices; bad input."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, compare_layer_with_torch, device

torch = pytest.importorskip("torch")
nn = torch.nn


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, pad=1), dict(pad="same", dilation=2), dict(groups=2, pad=(1, 0))])
def test_conv_matches_torch(dev, kw):
    layer = tf.Conv((3, 3), 4, 6, **kw)
    pad = kw.get("pad", 0)
    tpad = "same" if pad == "same" else pad
    t = nn.Conv2d(4, 6, 3, stride=kw.get("stride", 1), padding=tpad, dilation=kw.get("dilation", 1),
                  groups=kw.get("groups", 1))
    compare_layer_with_torch(layer, t, _x(2, 4, 7, 6), dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_conv_transpose_matches_torch(dev):
    layer = tf.ConvTranspose((2, 2), 4, 3, stride=2)
    compare_layer_with_torch(layer, nn.ConvTranspose2d(4, 3, 2, stride=2), _x(2, 4, 3, 5), dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_pools_and_upsample_match_torch(dev):
    d = device(dev)
    x_np = _x(2, 3, 6, 7)
    tx = torch.from_numpy(x_np)
    F = nn.functional
    cases = [(tf.MaxPool(2), F.max_pool2d(tx, 2)), (tf.MeanPool(2), F.avg_pool2d(tx, 2)),
             (tf.MaxPool(3, stride=1, pad=1), F.max_pool2d(tx, 3, 1, 1)),
             (tf.Upsample(2), F.interpolate(tx, scale_factor=2, mode="nearest")),
             (tf.Upsample(2, mode="bilinear"), F.interpolate(tx, scale_factor=2, mode="bilinear", align_corners=False))]
    for layer, want in cases:
        np.testing.assert_allclose(layer(d(x_np)).numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=repr(layer))


@pytest.mark.parametrize("dev", DEVICES)
def test_batchnorm_train_and_test_modes_match_torch(dev):
    d = device(dev)
    bn = d(tf.BatchNorm(3))
    t = nn.BatchNorm2d(3).double()
    x_np = _x(4, 3, 5, 5) * 2 + 1
    tx = torch.from_numpy(x_np.astype(np.float64))
    (g,) = tf.gradient(lambda m: (m(d(x_np)) ** 2).sum(), bn)        # training inside gradient
    t.train()
    (t(tx) ** 2).sum().backward()
    np.testing.assert_allclose(g["weight"].numpy(), t.weight.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), t.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), t.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert g["running_mean"] is None and g["running_var"] is None
    t.eval()
    np.testing.assert_allclose(bn(d(x_np)).numpy(), t(tx).detach().numpy(), rtol=1e-4, atol=1e-5)  # test mode outside
    tf.trainmode(bn)
    before = bn.running_mean.numpy()
    bn(d(x_np))
    assert not np.allclose(bn.running_mean.numpy(), before)


@pytest.mark.parametrize("dev", DEVICES)
def test_dropout_modes(dev):
    d = device(dev)
    x = d(np.ones((64, 64), np.float32))
    drop = tf.Dropout(0.5)
    assert drop(x) is x                                   # inactive outside gradient
    tf.seed(0)
    y, (g,) = tf.withgradient(lambda x: (drop(x) * 1.0).sum(), x)
    frac = float((g.numpy() == 0).mean())
    assert 0.4 < frac < 0.6 and set(np.unique(g.numpy())) <= {0.0, 2.0}
    tf.testmode(drop)
    (g,) = tf.gradient(lambda x: drop(x).sum(), x)
    assert (g.numpy() == 1).all()


def test_bad_input_names_layer_and_shapes():
    conv = tf.Conv((3, 3), 3, 8)
    with pytest.raises(tf.ShapeError, match=r"Conv\(\(3, 3\), 3 => 8\).*3 channels.*\(2, 4, 8, 8\)"):
        conv(np.zeros((2, 4, 8, 8), np.float32))
    with pytest.raises(tf.ShapeError, match=r"smaller than the kernel.*\(1, 3, 2, 8\)"):
        conv(np.zeros((1, 3, 2, 8), np.float32))
    with pytest.raises(tf.ShapeError, match="4-d"):
        conv(np.zeros((3, 8, 8), np.float32))
