"""The spatial layers in 1, 2 and 3 dimensions against torch.nn with the same
weights (forward and gradients, both devices); what a porting user writes
(Flux's kernel tuples, pad forms, pad_mode, CrossCor, DepthwiseConv,
PixelShuffle, ops.pad and NNlib's pad_* names); Flux's Conv weights; bad
input, stopped before any work with a message that names the layer; and the
volumetric UNet. The primitives themselves are cross-checked by the property
suite (tests/test_primitives.py); these tests check the layers built on them."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, compare_layer_with_torch, device
from triflux import ops
from triflux.errors import ShapeError

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- layers of every rank against torch ------------------------------------------------------------

CONVS = [  # (triflux layer, torch layer, input shape)
    (lambda: tf.Conv((3,), 3, 4, stride=2, pad=1), lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    (lambda: tf.Conv((3,), 4, 4, pad="same", dilation=2, groups=2),
     lambda: nn.Conv1d(4, 4, 3, padding="same", dilation=2, groups=2), (2, 4, 7)),
    (lambda: tf.Conv((2, 3, 3), 2, 3, pad=(0, 1, 1), stride=(1, 2, 1)),
     lambda: nn.Conv3d(2, 3, (2, 3, 3), padding=(0, 1, 1), stride=(1, 2, 1)), (1, 2, 3, 5, 4)),
    (lambda: tf.Conv((3, 3, 3), 2, 2, pad="same"), lambda: nn.Conv3d(2, 2, 3, padding="same"), (1, 2, 4, 3, 5)),
    (lambda: tf.Conv((3,), 2, 3, pad=2, pad_mode="reflect"),
     lambda: nn.Conv1d(2, 3, 3, padding=2, padding_mode="reflect"), (2, 2, 6)),
    (lambda: tf.Conv((3, 3), 2, 3, pad=1, pad_mode="circular"),
     lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"), (1, 2, 5, 4)),
    (lambda: tf.Conv((3, 3, 3), 1, 2, pad=1, pad_mode="replicate"),
     lambda: nn.Conv3d(1, 2, 3, padding=1, padding_mode="replicate"), (1, 1, 3, 4, 3)),
    (lambda: tf.DepthwiseConv((3, 3), 2, 4, pad=1), lambda: nn.Conv2d(2, 4, 3, padding=1, groups=2), (1, 2, 5, 5)),
    (lambda: tf.CrossCor((3,), 2, 3), lambda: nn.Conv1d(2, 3, 3), (2, 2, 5)),
    (lambda: tf.ConvTranspose((3,), 3, 2, stride=2, pad=1, outpad=1),
     lambda: nn.ConvTranspose1d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 5)),
    (lambda: tf.ConvTranspose((2, 2, 2), 2, 3, stride=2), lambda: nn.ConvTranspose3d(2, 3, 2, stride=2),
     (1, 2, 2, 3, 2)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv_layers_of_every_rank_match_torch(dev, case):
    make, tmake, shape = CONVS[case]
    compare_layer_with_torch(make(), tmake(), _x(*shape, seed=case), dev)


POOLS = [  # (triflux layer, torch layer, input shape); no weights
    (lambda: tf.MaxPool((2,)), lambda: nn.MaxPool1d(2), (2, 3, 7)),
    (lambda: tf.MaxPool((3,), stride=2, pad=1, dilation=2, ceil_mode=True),
     lambda: nn.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 2, 9)),
    (lambda: tf.MaxPool((2, 2, 2)), lambda: nn.MaxPool3d(2), (1, 2, 4, 5, 4)),
    (lambda: tf.MeanPool((3,), stride=2, pad=1, count_include_pad=False),
     lambda: nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), (2, 2, 8)),
    (lambda: tf.MeanPool((2, 3, 2), ceil_mode=True), lambda: nn.AvgPool3d((2, 3, 2), ceil_mode=True), (1, 2, 3, 7, 5)),
    (lambda: tf.AdaptiveMaxPool((3,)), lambda: nn.AdaptiveMaxPool1d(3), (2, 2, 8)),
    (lambda: tf.AdaptiveMeanPool((2, 3, 2)), lambda: nn.AdaptiveAvgPool3d((2, 3, 2)), (1, 2, 5, 4, 3)),
    (lambda: tf.GlobalMaxPool(), lambda: nn.AdaptiveMaxPool3d(1), (1, 3, 3, 4, 2)),
    (lambda: tf.GlobalMeanPool(), lambda: nn.AdaptiveAvgPool1d(1), (2, 3, 5)),
    (lambda: tf.Upsample("nearest", scale=2), lambda: nn.Upsample(scale_factor=2), (1, 2, 2, 3, 2)),
    (lambda: tf.Upsample("linear", scale=2.5), lambda: nn.Upsample(scale_factor=2.5, mode="linear"), (2, 2, 4)),
    (lambda: tf.Upsample("trilinear", size=(3, 5, 4), align_corners=True),
     lambda: nn.Upsample(size=(3, 5, 4), mode="trilinear", align_corners=True), (1, 2, 2, 3, 2)),
    (lambda: tf.PixelShuffle(2), lambda: nn.PixelShuffle(2), (1, 8, 3, 2)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pool_and_resampling_layers_of_every_rank_match_torch(dev, case):
    make, tmake, shape = POOLS[case]
    compare_layer_with_torch(make(), tmake(), _x(*shape, seed=case), dev)


def test_pixel_shuffle_of_volumes_and_sequences_inverts_unshuffle():
    for shape in ((2, 12, 5), (1, 16, 2, 3, 2)):
        x = tf.tensor(_x(*shape))
        y = tf.PixelShuffle(2)(x)
        r = 2 ** (len(shape) - 2)
        assert y.shape == (shape[0], shape[1] // r) + tuple(2 * s for s in shape[2:])
        np.testing.assert_array_equal(ops.pixel_unshuffle(y, 2).numpy(), x.numpy())


# --- what a porting user writes --------------------------------------------------------------------

def test_the_kernel_tuple_sets_the_rank_and_prints_like_flux():
    assert repr(tf.Conv((3,), 1, 4)).startswith("Conv((3,), 1 => 4)")
    assert repr(tf.Conv((3, 3, 3), 1, 8, tf.relu, pad=1)).startswith("Conv((3, 3, 3), 1 => 8, relu, pad=1)")
    assert repr(tf.MaxPool((2,))) == "MaxPool((2,))"
    assert repr(tf.MaxPool((2, 2, 2))) == "MaxPool((2, 2, 2))"
    assert repr(tf.AdaptiveMeanPool((2, 2, 2))) == "AdaptiveMeanPool((2, 2, 2))"
    assert repr(tf.PixelShuffle(3)) == "PixelShuffle(3)"
    assert repr(tf.Conv((3, 3), 2, 2, pad=(1, 0, 2, 2))).startswith("Conv((3, 3), 2 => 2, pad=(1, 0, 2, 2))")
    assert "pad_mode='reflect'" in repr(tf.Conv((3,), 1, 1, pad=1, pad_mode="reflect"))
    assert repr(tf.DepthwiseConv((3, 3), 4, 8)).startswith("DepthwiseConv((3, 3), 4 => 8)")
    assert tf.Conv((3, 3, 3), 1, 8).weight.shape == (8, 1, 3, 3, 3)
    assert tf.ConvTranspose((2, 2, 2), 8, 4).weight.shape == (8, 4, 2, 2, 2)


@pytest.mark.parametrize("pad, flat", [(1, (1, 1, 1, 1, 1, 1)), ((1, 2, 0), (1, 1, 2, 2, 0, 0)),
                                       ((0, 1, 2, 3, 1, 0), (0, 1, 2, 3, 1, 0)),
                                       (((0, 1), (2, 3), (1, 0)), (0, 1, 2, 3, 1, 0)), ("valid", (0,) * 6),
                                       ("same", (1, 1, 0, 1, 2, 2))])
def test_conv_pad_forms(pad, flat):
    layer = tf.Conv((3, 2, 5), 1, 1, pad=pad)
    assert layer.pad == flat
    x = _x(1, 1, 4, 5, 6)
    y = layer(x).numpy()
    lo_hi = [(flat[2 * k], flat[2 * k + 1]) for k in range(3)]
    want = F.conv3d(F.pad(torch.from_numpy(x), [v for p in reversed(lo_hi) for v in p]),
                    torch.from_numpy(layer.weight.numpy()), torch.from_numpy(layer.bias.numpy()))
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_ops_pad_and_nnlib_names_match_numpy(dev):
    d = device(dev)
    x = _x(2, 3, 4, 5)
    for mode, np_mode in (("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge"),
                          ("symmetric", "symmetric"), ("circular", "wrap")):
        y = ops.pad(d(x), ((1, 2), (3, 1)), mode)
        np.testing.assert_array_equal(y.numpy(), np.pad(x, ((0, 0), (0, 0), (1, 2), (3, 1)), mode=np_mode))
    np.testing.assert_array_equal(ops.pad_constant(d(x), 1, 2.5).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=2.5))
    np.testing.assert_array_equal(ops.pad_zeros(d(x), (1, 0)).numpy(), np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0))))
    np.testing.assert_array_equal(ops.pad_reflect(d(x), (1, 2, 0, 3)).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 3)), mode="reflect"))
    np.testing.assert_array_equal(ops.pad_repeat(d(x), 2).numpy(), np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), "edge"))
    np.testing.assert_array_equal(ops.pad_symmetric(d(x), 4).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)), "symmetric"))
    np.testing.assert_array_equal(ops.pad_circular(d(x), 1, dims=(0, 3)).numpy(),
                                  np.pad(x, ((1, 1), (0, 0), (0, 0), (1, 1)), "wrap"))
    # gradient: each input element gets the sum of the output gradients of its copies
    (g,) = tf.gradient(lambda x: ops.pad(x, 2, "circular").sum(), d(x[:, :, :3, :3]))
    # (side 3 wrapped by 2 on each side: outputs 0..6 read 1, 2, 0, 1, 2, 0, 1)
    copies = np.multiply.outer([2, 3, 2], [2, 3, 2])
    np.testing.assert_array_equal(g.numpy(), np.broadcast_to(copies, (2, 3, 3, 3)))


def test_flux_conv_weight_against_a_true_convolution_by_hand():
    """A Flux Conv: weight (kw, kh, cin, cout) in Julia's indexing, input (W, H, C, N), a true
    convolution y[i, j, o] = sum w[a, b, c, o] x[i + kw-1-a, j + kh-1-b, c] (the kernel flipped),
    computed here with loops in Julia's index order; triflux's Conv with the converted weight on
    the same memory read row-major (N, C, H, W) must agree."""
    rng = np.random.default_rng(3)
    kw, kh, cin, cout, W, H = 3, 2, 2, 3, 6, 5
    w_jl = rng.standard_normal((kw, kh, cin, cout))
    x_jl = rng.standard_normal((W, H, cin, 1))
    y_jl = np.zeros((W - kw + 1, H - kh + 1, cout, 1))
    for i in range(W - kw + 1):
        for j in range(H - kh + 1):
            for o in range(cout):
                y_jl[i, j, o, 0] = sum(w_jl[a, b, c, o] * x_jl[i + kw - 1 - a, j + kh - 1 - b, c, 0]
                                       for a in range(kw) for b in range(kh) for c in range(cin))
    layer = tf.Conv((kh, kw), cin, cout, bias=False, dtype="float64")
    layer.weight = tf.tensor(tf.flux_conv_weight(w_jl))
    x = np.ascontiguousarray(x_jl.transpose(3, 2, 1, 0))          # Julia's (W, H, C, N) memory, row-major
    np.testing.assert_allclose(layer(x).numpy(), y_jl.transpose(3, 2, 1, 0), rtol=1e-12, atol=1e-12)
    # a CrossCor weight is only permuted
    xc = tf.CrossCor((kh, kw), cin, cout, bias=False, dtype="float64")
    xc.weight = tf.tensor(tf.flux_conv_weight(w_jl[::-1, ::-1], flipped=False))
    np.testing.assert_allclose(xc(x).numpy(), y_jl.transpose(3, 2, 1, 0), rtol=1e-12, atol=1e-12)


# --- bad input: a triflux error naming the layer, before any work ------------------------------------

@pytest.mark.parametrize("make, shape, words", [
    (lambda: tf.Conv((3, 3, 3), 1, 2), (2, 1, 8, 8), ["Conv((3, 3, 3), 1 => 2)", "5-d", "(N, C, D, H, W)",
                                                      "(2, 1, 8, 8)"]),
    (lambda: tf.Conv((3,), 1, 2), (2, 1, 8, 8), ["3-d", "(N, C, L)", "kernel or window of 2 entries"]),
    (lambda: tf.Conv((3, 3, 3), 1, 2), (1, 4, 4, 4), ["single sample", "x.reshape((1,) + x.shape)",
                                                      "kernel or window of 2 entries"]),
    (lambda: tf.MaxPool((2, 2)), (2, 1, 4, 4, 4), ["MaxPool((2, 2))", "4-d", "3 spatial axes"]),
    (lambda: tf.Conv((5,), 1, 2, pad=1), (1, 1, 2), ["kernel's extent 5", "padded 4"]),
    (lambda: tf.Conv((3, 3), 1, 1, pad=3, pad_mode="reflect"), (1, 1, 3, 3),
     ["Conv((3, 3), 1 => 1, pad=3, pad_mode='reflect') cannot pad", "reflect", "at most 2"]),
    (lambda: tf.AdaptiveMaxPool((2, 2, 2)), (1, 1, 4, 4), ["AdaptiveMaxPool((2, 2, 2))", "5-d"]),
    (lambda: tf.Upsample("trilinear", scale=2), (1, 1, 4, 4), ["Upsample", "5-d"]),
    (lambda: tf.PixelShuffle(2), (1, 6, 2, 2), ["PixelShuffle(2) cannot shuffle", "6 channels", "multiple of 4"]),
])
def test_bad_input_names_the_layer_and_changes_nothing(make, shape, words):
    layer = make()
    x = _x(*shape)
    before = x.copy()
    weight = None if not hasattr(layer, "weight") else layer.weight.numpy().copy()
    with pytest.raises(ShapeError) as e:
        layer(x)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    np.testing.assert_array_equal(x, before)
    if weight is not None:
        np.testing.assert_array_equal(layer.weight.numpy(), weight)


@pytest.mark.parametrize("make, words", [
    (lambda: tf.Conv((3, 3), 1, 1, pad=(1, 2, 3)), ["pad", "(h, w) or (top, bottom, left, right)", "(1, 2, 3)"]),
    (lambda: tf.MaxPool((2, 2, 2), pad=(1, 1)), ["pad", "(d, h, w) or (front, back, top, bottom, left, right)",
                                                 "3 (lo, hi) pairs"]),
    (lambda: tf.Conv((3, 3, 3, 3), 1, 1), ["1, 2 or 3 entries"]),
    (lambda: tf.Conv((3,), 1, 1, pad_mode="mirror"), ["pad_mode", "reflect"]),
    (lambda: tf.DepthwiseConv((3,), 4, 6), ["multiple of in_channels"]),
    (lambda: tf.Upsample("bilinear", scale=(2, 2, 2)), ["bilinear", "2 spatial axes"]),
])
def test_bad_options_stop_at_construction(make, words):
    with pytest.raises(tf.TrifluxError) as e:
        make()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_ops_take_nnlibs_pad_keyword():
    x, w = _x(1, 2, 5, 4, 3), _x(3, 2, 3, 3, 3)
    np.testing.assert_array_equal(ops.conv(x, w, pad=1).numpy(), ops.conv(x, w, padding=1).numpy())
    np.testing.assert_array_equal(ops.maxpool(x, (2, 2, 2), pad=1).numpy(),
                                  ops.maxpool(x, (2, 2, 2), padding=1).numpy())
    np.testing.assert_array_equal(ops.lpnormpool(_x(1, 1, 6), 2, (3,), pad=(1, 0)).numpy(),
                                  ops.lpnormpool(_x(1, 1, 6), 2, (3,), padding=(1, 0)).numpy())
    with pytest.raises(tf.TrifluxError, match="give the padding once"):
        ops.conv(x, w, padding=1, pad=1)


def test_ops_name_the_rank_mismatch():
    with pytest.raises(ShapeError, match=r"`conv`.*5-d \(N, C, D, H, W\).*\(1, 1, 4, 4\)"):
        ops.conv(_x(1, 1, 4, 4), _x(2, 1, 3, 3, 3))
    with pytest.raises(ShapeError, match=r"`maxpool`.*padding"):
        ops.maxpool(_x(1, 1, 4), (2,), padding=(1, 1, 1))
    with pytest.raises(ShapeError, match=r"`pad`"):
        ops.pad(_x(1, 1, 3, 3), (1, 2, 3))


# --- moving, saving, converting ------------------------------------------------------------------------

def _spatial_model():
    return tf.Chain(tf.Conv((3,), 2, 4, pad=1, pad_mode="reflect"), tf.relu, tf.MaxPool((2,)),
                    tf.DepthwiseConv((3,), 4, 8, pad=1), tf.MeanPool((2,)), tf.Upsample("linear", scale=2),
                    tf.CrossCor((1,), 8, 2), tf.AdaptiveMaxPool((3,)))


def test_save_model_and_load_model_rebuild_every_new_layer(tmp_path):
    m = _spatial_model()
    x = _x(2, 2, 12)
    tf.save_model(tmp_path / "m.safetensors", m)
    back = tf.load_model(tmp_path / "m.safetensors")
    assert repr(back) == repr(m)
    np.testing.assert_array_equal(back(x).numpy(), m(x).numpy())
    m3 = tf.Chain(tf.Conv((3, 3, 3), 1, 8, pad=1), tf.PixelShuffle(2), tf.Upsample("trilinear", scale=(1, 2, 2)))
    tf.save_model(tmp_path / "m3.safetensors", m3)
    np.testing.assert_array_equal(tf.load_model(tmp_path / "m3.safetensors")(_x(1, 1, 2, 2, 2)).numpy(),
                                  m3(_x(1, 1, 2, 2, 2)).numpy())


@pytest.mark.parametrize("make, shape", [(_spatial_model, (2, 2, 12)),
                                         (lambda: tf.Chain(tf.Conv((3, 3, 3), 1, 2, pad=1, pad_mode="circular"),
                                                           tf.MaxPool((2, 2, 2)), tf.ConvTranspose((2, 2, 2), 2, 3,
                                                                                                   stride=2),
                                                           tf.AdaptiveMeanPool((2, 2, 2)), tf.BatchNorm(3),
                                                           tf.Upsample("trilinear", scale=2), tf.GlobalMeanPool()),
                                          (1, 1, 4, 4, 4))])
def test_to_torch_and_back(make, shape):
    m = tf.testmode(make())
    x = _x(*shape)
    tm = tf.to_torch(m)
    np.testing.assert_allclose(tm(torch.from_numpy(x)).detach().numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    back = tf.from_torch(tm)
    # Flux's names come back as the Conv they are in torch
    def lines(model):
        return [line.split("#")[0].strip() for line in repr(model).splitlines()]
    assert lines(back) == [line.replace("DepthwiseConv((3,), 4 => 8, pad=1)", "Conv((3,), 4 => 8, pad=1, groups=4)")
                           .replace("CrossCor", "Conv") for line in lines(m)]
    np.testing.assert_array_equal(back(x).numpy(), m(x).numpy())


@pytest.mark.parametrize("dims, shape", [(2, (1, 2, 8, 8)), (3, (1, 1, 4, 4, 4))])
def test_unet_converts_to_torch_with_its_concatenating_skips(dims, shape):
    from triflux.models import UNet
    tf.seed(0)
    m = tf.testmode(UNet(shape[1], 3, depth=2, base_channels=2, spatial_dims=dims))
    x = _x(*shape)
    tm = tf.to_torch(m)
    assert not tm.training
    np.testing.assert_allclose(tm(torch.from_numpy(x)).detach().numpy(), m(x).numpy(), rtol=1e-4, atol=1e-5)
    back = tf.from_torch(tm)
    np.testing.assert_allclose(back(x).numpy(), m(x).numpy(), rtol=1e-6, atol=1e-6)


# --- the volumetric UNet ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_unet3d_trains_on_both_devices(dev):
    from triflux import losses, optimise
    from triflux.models import UNet
    d = device(dev)
    tf.seed(1)
    m = d(UNet(1, 2, depth=1, base_channels=2, spatial_dims=3))
    x = d(_x(2, 1, 4, 4, 4))
    y = d(np.eye(2, dtype=np.float32)[np.random.default_rng(0).integers(0, 2, (2, 4, 4, 4))].transpose(0, 4, 1, 2, 3))
    opt = optimise.setup(optimise.Adam(1e-2), m)
    first = None
    for _ in range(3):
        loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y, dims=1), m)
        optimise.update(opt, m, g)
        first = float(loss) if first is None else first
    assert m(x).shape == (2, 2, 4, 4, 4)
    assert float(loss) < first
    with pytest.raises(ShapeError, match=r"spatial_dims=3.*\(N, C, D, H, W\).*divisible by 2\^1"):
        m(d(_x(1, 1, 4, 4, 5)))
