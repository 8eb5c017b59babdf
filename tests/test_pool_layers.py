"""MaxPool, MeanPool, AdaptiveMaxPool, AdaptiveMeanPool, GlobalMaxPool,
GlobalMeanPool and Upsample against torch.nn on both devices (outputs and
input gradients); their Flux-style printing; the old spellings of Upsample;
and the errors for options and inputs they cannot take (each names the
layer and the fix)."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, device

torch = pytest.importorskip("torch")
nn = torch.nn


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _compare(layer, tlayer, x_np, dev, rtol=1e-5, atol=1e-5):
    d = device(dev)
    y, (gx,) = tf.withgradient(lambda x: (layer(x) ** 2).sum(), d(x_np))
    out = layer(d(x_np))
    tx = torch.from_numpy(x_np.astype(np.float64)).requires_grad_()
    ty = tlayer(tx)
    tloss = (ty ** 2).sum()
    tloss.backward()
    assert out.shape == tuple(ty.shape), (repr(layer), out.shape, ty.shape)
    assert out.device == d
    np.testing.assert_allclose(out.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol, err_msg=repr(layer))
    np.testing.assert_allclose(float(y), tloss.item(), rtol=rtol)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol, err_msg=repr(layer))


PAIRS = [
    (lambda: tf.MaxPool(2), lambda: nn.MaxPool2d(2)),
    (lambda: tf.MaxPool(3, stride=1, pad=1), lambda: nn.MaxPool2d(3, 1, 1)),
    (lambda: tf.MaxPool((3, 2), pad=1, dilation=(1, 2), ceil_mode=True),
     lambda: nn.MaxPool2d((3, 2), padding=1, dilation=(1, 2), ceil_mode=True)),
    (lambda: tf.MaxPool(3, stride=2, dilation=2), lambda: nn.MaxPool2d(3, 2, dilation=2)),
    (lambda: tf.MeanPool(2), lambda: nn.AvgPool2d(2)),
    (lambda: tf.MeanPool(3, stride=2, pad=1, count_include_pad=False),
     lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
    (lambda: tf.MeanPool((4, 3), stride=(2, 3), pad=1, ceil_mode=True),
     lambda: nn.AvgPool2d((4, 3), (2, 3), 1, ceil_mode=True)),
    (lambda: tf.MeanPool(3, stride=2, pad=1, ceil_mode=True, count_include_pad=False),
     lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
    (lambda: tf.AdaptiveMaxPool((5, 3)), lambda: nn.AdaptiveMaxPool2d((5, 3))),
    (lambda: tf.AdaptiveMaxPool((None, 10)), lambda: nn.AdaptiveMaxPool2d((None, 10))),
    (lambda: tf.AdaptiveMeanPool(4), lambda: nn.AdaptiveAvgPool2d(4)),
    (lambda: tf.AdaptiveMeanPool((3, None)), lambda: nn.AdaptiveAvgPool2d((3, None))),
    (lambda: tf.GlobalMaxPool(), lambda: nn.AdaptiveMaxPool2d(1)),
    (lambda: tf.GlobalMeanPool(), lambda: nn.AdaptiveAvgPool2d(1)),
    (lambda: tf.Upsample(2), lambda: nn.Upsample(scale_factor=2)),
    (lambda: tf.Upsample("bilinear", scale=2), lambda: nn.Upsample(scale_factor=2, mode="bilinear")),
    (lambda: tf.Upsample("nearest", size=(5, 11)), lambda: nn.Upsample(size=(5, 11))),
    (lambda: tf.Upsample("nearest", scale=(1.7, 0.6)), lambda: nn.Upsample(scale_factor=(1.7, 0.6))),
    (lambda: tf.Upsample("bilinear", scale=1.5), lambda: nn.Upsample(scale_factor=1.5, mode="bilinear")),
    (lambda: tf.Upsample("bilinear", size=(4, 13), align_corners=True),
     lambda: nn.Upsample(size=(4, 13), mode="bilinear", align_corners=True)),
    (lambda: tf.Upsample(":bilinear", scale=(2, 3), align_corners=True),
     lambda: nn.UpsamplingBilinear2d(scale_factor=(2, 3))),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: repr(p[0]()))
def test_layer_matches_torch(pair, dev):
    make, tmake = pair
    _compare(make(), tmake(), _x(2, 3, 7, 8) * 2, dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_max_pools_keep_nan_and_route_ties_as_torch(dev):
    d = device(dev)
    x = np.random.default_rng(1).choice([0.0, 1.0, np.nan], size=(1, 2, 6, 6), p=[0.45, 0.45, 0.1]).astype(np.float32)
    for layer, t in [(tf.MaxPool(3, stride=1, pad=1), nn.MaxPool2d(3, 1, 1)),
                     (tf.AdaptiveMaxPool((4, 3)), nn.AdaptiveMaxPool2d((4, 3))), (tf.GlobalMaxPool(), nn.AdaptiveMaxPool2d(1))]:
        (gx,) = tf.gradient(lambda x: layer(x).sum(), d(x))
        tx = torch.from_numpy(x).requires_grad_()
        ty = t(tx)
        ty.sum().backward()
        np.testing.assert_array_equal(np.isnan(layer(d(x)).numpy()), np.isnan(ty.detach().numpy()))
        np.testing.assert_array_equal(gx.numpy(), tx.grad.numpy(), err_msg=repr(layer))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5, 3)])
def test_global_max_pool_any_number_of_spatial_axes(shape, dev):
    d = device(dev)
    x = _x(*shape)
    y = tf.GlobalMaxPool()(d(x))
    assert y.shape == shape[:2] + (1,) * (len(shape) - 2)
    np.testing.assert_array_equal(y.numpy().reshape(shape[:2]), x.reshape(shape[:2] + (-1,)).max(axis=2))
    (g,) = tf.gradient(lambda x: tf.GlobalMaxPool()(x).sum(), d(x))
    assert g.numpy().reshape(shape[:2] + (-1,)).sum(axis=2).tolist() == [[1.0] * shape[1]] * shape[0]


def test_upsample_spellings():
    # Flux's Upsample(:bilinear, scale=2), and today's Upsample(scale, mode) in either form
    for layer in (tf.Upsample("bilinear", scale=2), tf.Upsample(2, "bilinear"), tf.Upsample(2, mode="bilinear"),
                  tf.Upsample(scale=2, mode="bilinear"), tf.Upsample(mode="bilinear", scale=(2, 2)),
                  tf.Upsample(":bilinear", scale=2)):
        assert (layer.mode, layer.scale, layer.size, layer.align_corners) == ("bilinear", (2, 2), None, False)
    # nearest keeps one scale for every spatial axis of its input (any rank)
    assert tf.Upsample(2).mode == "nearest" and tf.Upsample(scale=2).scale == 2


def test_printing_like_flux():
    assert repr(tf.MaxPool(2)) == "MaxPool((2, 2))"
    assert repr(tf.MaxPool(3, stride=1, pad=1)) == "MaxPool((3, 3), pad=1, stride=1)"
    assert repr(tf.MaxPool((3, 2), pad=(1, 0), dilation=(1, 2), ceil_mode=True)) == \
        "MaxPool((3, 2), pad=(1, 0), dilation=(1, 2), ceil_mode=true)"
    assert repr(tf.MeanPool(2, pad=1, ceil_mode=True, count_include_pad=False)) == \
        "MeanPool((2, 2), pad=1, ceil_mode=true, count_include_pad=false)"
    assert repr(tf.AdaptiveMaxPool((5, 7))) == "AdaptiveMaxPool((5, 7))"
    assert repr(tf.AdaptiveMeanPool(3)) == "AdaptiveMeanPool((3, 3))"
    assert repr(tf.GlobalMaxPool()) == "GlobalMaxPool()"
    assert repr(tf.Upsample(2)) == "Upsample(:nearest, scale=2)"
    # neither scale nor size: API.md's default, Upsample(scale=2, mode="nearest")
    assert repr(tf.Upsample()) == "Upsample(:nearest, scale=2)"
    assert repr(tf.Upsample("bilinear")) == "Upsample(:bilinear, scale=2)"
    assert repr(tf.Upsample("bilinear", scale=(2, 1.5))) == "Upsample(:bilinear, scale=(2, 1.5))"
    assert repr(tf.Upsample("bilinear", size=(4, 5), align_corners=True)) == \
        "Upsample(:bilinear, size=(4, 5), align_corners=true)"
    text = repr(tf.Chain(tf.MaxPool(2), tf.GlobalMaxPool(), tf.Upsample("nearest", size=3)))
    assert "  MaxPool((2, 2)),\n  GlobalMaxPool(),\n  Upsample(:nearest, size=(3, 3))," in text


@pytest.mark.parametrize("make,match", [
    (lambda: tf.Upsample("nearest", scale=2, size=(4, 4)), r"Upsample: give scale or size, not both.*scale=2"),
    (lambda: tf.Upsample("nearest", scale=0), r"Upsample: scale must be a positive number"),
    (lambda: tf.Upsample("nearest", scale=(2, -1.5)), r"Upsample: scale must be a positive number"),
    (lambda: tf.Upsample("nearest", size=(0, 4)), r"Upsample: size must be a positive int"),
    (lambda: tf.Upsample("nearest", size=(2.5, 4)), r"Upsample: size must be a positive int"),
    (lambda: tf.Upsample("nearest", scale=2, align_corners=True),
     r"Upsample: align_corners applies to the linear modes only \(linear, bilinear, trilinear\); use "
     r"Upsample\('bilinear'"),
    (lambda: tf.Upsample("bicubic", scale=2), r"Upsample: mode must be one of \('nearest', 'linear', 'bilinear', 'trilinear'\)"),
    (lambda: tf.Upsample("bilinear", 2, scale=3), r"Upsample: the positional arguments"),
    (lambda: tf.MaxPool(2, dilation=0), r"MaxPool: dilation must be a positive int"),
    (lambda: tf.MaxPool(0), r"MaxPool: the window must be a positive int"),
    (lambda: tf.MaxPool(2, stride=(1, 0)), r"MaxPool: stride must be a positive int"),
    (lambda: tf.MaxPool(2, pad=2), r"MaxPool: pad=2 must be smaller than the window \(2, 2\).*smaller pad"),
    (lambda: tf.MeanPool(3, pad=-1), r"MeanPool: pad must be a non-negative int, \(h, w\) or \(top, bottom"),
    (lambda: tf.MeanPool(3, pad=(1, 0, 1)), r"MeanPool: pad must be"),
    (lambda: tf.AdaptiveMaxPool(0), r"AdaptiveMaxPool: the output size must be a positive int"),
    (lambda: tf.AdaptiveMeanPool((2, -1)), r"AdaptiveMeanPool: the output size must be a positive int"),
])
def test_bad_options_name_the_layer_and_the_fix(make, match):
    with pytest.raises(tf.ShapeError, match=match):
        make()


@pytest.mark.parametrize("layer,shape,match", [
    (tf.MaxPool(3), (1, 2, 2, 8), r"MaxPool\(\(3, 3\)\) cannot pool an input of shape \(1, 2, 2, 8\).*"
                                   r"larger than the padded input height 2.*smaller window or pad"),
    (tf.MeanPool(4, pad=1), (1, 1, 1, 9), r"MeanPool\(\(4, 4\), pad=1\) cannot pool.*height"),
    (tf.MaxPool(2, pad=1, dilation=3), (1, 1, 2, 2), r"MaxPool.*reads only padding.*less padding or a smaller dilation"),
    (tf.Upsample("nearest", scale=0.3), (1, 1, 3, 3), r"Upsample\(:nearest, scale=0.3\) cannot resize an input "
                                                      r"of shape \(1, 1, 3, 3\).*larger scale, or size="),
    (tf.AdaptiveMaxPool(2), (2, 3, 4), r"AdaptiveMaxPool\(\(2, 2\)\) expects a 4-d"),
    (tf.Upsample("bilinear"), (2, 3, 4), r"Upsample\(:bilinear, scale=2\) expects a 4-d"),
    (tf.Upsample(2), (2, 3), r"Upsample\(:nearest, scale=2\) expects a 3-d \(N, C, L\)"),
    (tf.GlobalMaxPool(), (2, 3), r"GlobalMaxPool\(\) expects \(N, C, spatial...\)"),
])
def test_bad_inputs_name_the_layer_and_the_fix(layer, shape, match):
    with pytest.raises(tf.ShapeError, match=match):
        layer(np.zeros(shape, np.float32))


@pytest.mark.parametrize("dev", DEVICES)
def test_unet_with_upsampling_trains_on_each_device(dev):
    d = device(dev)
    tf.seed(0)
    model = d(tf.models.UNet(1, 2, depth=2, base_channels=4, up="upsample"))
    x = d(_x(2, 1, 8, 8))
    loss, (g,) = tf.withgradient(lambda m: (m(x) ** 2).mean(), model)
    assert np.isfinite(float(loss))
    assert all(np.isfinite(leaf.numpy()).all() for leaf in tf.functor.leaves(g))
