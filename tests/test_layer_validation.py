"""Layers at the API's edge: bad constructor arguments stop at construction
with a message naming the layer, the argument and what it expects; bad
inputs stop at the call; a layer owns its parameters; valid spellings
(NumPy ints, activation names, "same"/"valid") keep working."""
import numpy as np
import pytest

import triflux as tf
from triflux import ops
from triflux.errors import ArgumentError, DTypeError, ShapeError
from helpers import DEVICES, device

D = tf.Dense

BAD_CONSTRUCTORS = [
    # sizes: positive (or non-negative) ints, never floats, strings, bools, None or NaN
    (lambda: D(2.5, 2), ShapeError, "Dense: in_features must be a non-negative int, got 2.5 (float)"),
    (lambda: D("3", 2), ShapeError, "Dense: in_features must be a non-negative int, got '3' (str)"),
    (lambda: D(3), ShapeError, "Dense: out_features must be a non-negative int, got None (NoneType)"),
    (lambda: tf.RNN(3, True), ShapeError, "RNN: out_features must be a positive int, got True (bool)"),
    (lambda: tf.GRUCell(float("nan"), 3), ShapeError, "GRUCell: in_features must be a non-negative int, got nan"),
    (lambda: tf.Conv(0, 1, 1), ShapeError, "Conv: kernel must be a positive int or 2 of them, got 0"),
    (lambda: tf.Conv((3, None), 1, 1), ShapeError, "Conv: kernel must be a positive int or 2 of them, got (3, None)"),
    (lambda: tf.Conv(3, 1, 1, stride=0), ShapeError, "Conv: stride must be a positive int or 2 of them, got 0"),
    (lambda: tf.Conv(3, 1, 1, dilation=(1, 0)), ShapeError, "Conv: dilation must be a positive int or 2 of them"),
    (lambda: tf.Conv(3, 2, 4, groups=0), ShapeError, "Conv: groups must be a positive int, got 0"),
    (lambda: tf.Conv(3, 3, 4, groups=2), ShapeError, "Conv: channels 3 => 4 must both be divisible by groups=2"),
    (lambda: tf.Conv(3, 1, 1, pad=-1), ShapeError,
     'Conv: pad must be a non-negative int, (h, w) or (top, bottom, left, right), or "valid" or "same"; got -1'),
    (lambda: tf.Conv(3, 1, 1, pad="full"), ShapeError, "got 'full' (str)"),
    (lambda: tf.Conv(3, 1, 1, stride=2, pad="same"), ShapeError, 'Conv: pad="same" needs stride 1'),
    (lambda: tf.ConvTranspose(2, 1, 1, pad="same"), ShapeError, "or \"valid\"; got 'same'"),
    (lambda: tf.ConvTranspose(2, 1, 1, stride=2, outpad=2), ShapeError,
     "ConvTranspose: outpad=2 must be smaller than the stride (2, 2) or the dilation (1, 1)"),
    (lambda: tf.MaxPool(2, ceil_mode="yes"), ArgumentError, "MaxPool: ceil_mode must be True or False, got 'yes'"),
    (lambda: tf.AdaptiveMeanPool(2.0), ShapeError, "AdaptiveMeanPool: the output size must be a positive int"),
    (lambda: tf.models.UNet(1, 2, depth=2.5), ShapeError, "UNet: depth must be a positive int, got 2.5"),
    (lambda: tf.BatchNorm(2.5), ShapeError, "BatchNorm: channels must be a positive int, got 2.5 (float)"),
    (lambda: tf.BatchNorm(3, eps=-1e-5), ArgumentError, "BatchNorm: eps must be a non-negative finite number"),
    (lambda: tf.BatchNorm(3, momentum=float("nan")), ArgumentError, "BatchNorm: momentum must be a finite number"),
    (lambda: tf.BatchNorm(3, dtype="int32"), DTypeError, "BatchNorm: dtype=int32 cannot hold trainable parameters"),
    (lambda: tf.BatchNorm(3, "nope"), ArgumentError, "BatchNorm: activation must be a function"),
    # activations: functions or known names
    (lambda: D(3, 2, 5), ArgumentError, "Dense: activation must be a function (e.g. relu) or the name of one of"),
    (lambda: D(3, 2, activation="rleu"), ArgumentError, "leakyrelu, linear, logsoftmax, relu,"),
    (lambda: tf.Conv(3, 1, 1, "swishy"), ArgumentError, "Conv: activation must be a function"),
    (lambda: tf.RNN(3, 4, "sigmoid"), ArgumentError, "RNN: the activation must be tanh or relu"),
    (lambda: tf.RNN(3, 4, return_state="yes"), ArgumentError, "RNN: return_state must be True or False"),
    # element types of parameters, init functions and given arrays
    (lambda: D(3, 4, dtype="int32"), DTypeError, "Dense: dtype=int32 cannot hold trainable parameters"),
    (lambda: tf.LSTM(3, 4, dtype=np.complex64), DTypeError, "LSTM: dtype=complex64 cannot hold"),
    (lambda: D(3, 2, init="glorot"), ArgumentError, "Dense: init must be a function of the weight's shape"),
    (lambda: D(3, 2, init=lambda o, i: np.ones((o, i), complex)), DTypeError,
     "Dense got a weight of dtype complex128; triflux computes with real numbers"),
    (lambda: tf.Conv(3, 1, 2, init=lambda *s: np.ones(3)), ShapeError, "Conv: weight must have shape (2, 1, 3, 3)"),
    (lambda: D(3, 2, bias=["a", "b"]), ArgumentError, "Dense: the bias must be an array of numbers"),
    # probabilities, containers
    (lambda: tf.Dropout(1.5), ArgumentError, "Dropout: p must be a probability, a number in [0, 1], got 1.5"),
    (lambda: tf.Dropout(True), ArgumentError, "got True (bool)"),
    (lambda: tf.Chain(D(1, 1), "relu"), ArgumentError,
     "Chain: layer 1 must be a layer or a function, got 'relu' (str); for the activation write `relu`"),
    (lambda: tf.SkipConnection(D(1, 1), "+"), ArgumentError, "SkipConnection: the connection must be a layer"),
]


@pytest.mark.parametrize("make,error,fragment", BAD_CONSTRUCTORS, ids=range(len(BAD_CONSTRUCTORS)))
def test_bad_constructor_arguments_say_what_was_expected(make, error, fragment):
    with pytest.raises(error) as e:
        make()
    assert fragment in str(e.value)


def _x(*shape, dtype=np.float32):
    return np.ones(shape, dtype)


_CHAIN = tf.Chain(D(2, 3), D(3, 1))
BAD_CALLS = [
    (lambda: _CHAIN[5], IndexError, "Chain index 5 is out of range: the Chain has 2 layers (indices 0 to 1"),
    (lambda: _CHAIN["enc"], KeyError, "Chain has no layer named 'enc': its layers have no names"),
    (lambda: tf.Chain(enc=D(2, 3), dec=D(3, 1))["x"], KeyError, "its names are 'enc', 'dec'"),
    (lambda: _CHAIN[1.5], ArgumentError, "Chain index must be an int, a slice or a layer's name"),
    (lambda: tf.softmax(_x(2, 3), dims=1.5), ArgumentError, "`softmax`: dims must be an int"),
    (lambda: tf.ones(2, 3).sum(axis=1.5), ArgumentError, "`sum`: an axis must be an int"),
    (lambda: ops.logsumexp(_x(2, 3), axis="a"), ArgumentError, "`logsumexp`: an axis must be an int"),
    (lambda: tf.reshape(_x(2, 2), (2.5, 2)), ShapeError, "`reshape`: shape must be an int or a tuple of ints"),
    (lambda: tf.ones(2, 3)[:, "a"], IndexError, "a Tensor index is made of ints, slices of ints, None and `...`; "
                                                "got 'a' (str)"),
    (lambda: ops.conv2d(_x(1, 1, 4, 4), _x(1, 1, 3, 3), stride=0), ShapeError, "`conv2d`: stride must be a positive"),
    (lambda: ops.maxpool2d(_x(1, 1, 4, 4), 2, stride=0), ShapeError, "`maxpool2d`: stride must be a positive int"),
    (lambda: tf.GlobalMeanPool()(_x(1, 2, 0, 3)), ShapeError,
     "GlobalMeanPool() cannot pool an input with no spatial positions, shape (1, 2, 0, 3)"),
    # complex numbers are refused, not silently made real
    (lambda: D(3, 4)(_x(1, 3, dtype=np.complex64)), DTypeError,
     "Dense(3 => 4) got an input of dtype complex64; triflux computes with real numbers and will not drop the "
     "imaginary part: pass `np.real(x)` or `np.abs(x)`"),
    (lambda: tf.MaxPool(2)(_x(1, 1, 2, 2, dtype=np.complex128)), DTypeError, "MaxPool((2, 2)) got an input of dtype"),
    (lambda: tf.relu(_x(2, dtype=np.complex64)), DTypeError, "`relu` got an input of dtype complex64"),
    (lambda: ops.cast(_x(2, dtype=np.complex64), "float32"), DTypeError, "`cast` got a tensor of dtype complex64"),
    # Flux's layout, passed unchanged: the transpose that fixes it
    (lambda: tf.Conv((3, 3), 3, 8)(_x(32, 32, 3, 4)), ShapeError,
     "expects 3 channels on axis 1 of its input, but got an input of shape (32, 32, 3, 4). The shape looks like "
     "Flux's (W, H, C, N) layout; triflux takes (N, C, H, W), batch first: pass `x.transpose(3, 2, 1, 0)`"),
    (lambda: D(3, 2)(_x(3, 5)), ShapeError, "Flux's (features, N) layout; triflux takes (N, features), batch first: "
                                            "pass `x.T`"),
    (lambda: tf.LSTM(3, 4)(_x(3, 7, 2)), ShapeError, "(features, L, N) layout; triflux takes (N, L, features), batch "
                                                     "first: pass `x.transpose(2, 1, 0)`"),
    (lambda: ops.conv2d(_x(8, 8, 2, 1), _x(4, 2, 3, 3)), ShapeError, "(W, H, C, N) layout"),
]


@pytest.mark.parametrize("call,error,fragment", BAD_CALLS, ids=range(len(BAD_CALLS)))
def test_bad_calls_say_what_was_expected(call, error, fragment):
    with pytest.raises(error) as e:
        call()
    assert fragment in (e.value.args[0] if error is KeyError else str(e.value))


def test_the_advised_transposes_fix_flux_layouts():
    x = tf.ones(6, 5, 3, 2)                                     # (W, H, C, N)
    assert tf.Conv((3, 3), 3, 8)(x.transpose(3, 2, 1, 0)).shape == (2, 8, 3, 4)
    assert D(3, 2)(np.ones((3, 5), np.float32).T).shape == (5, 2)
    assert tf.LSTM(3, 4)(tf.ones(3, 7, 2).transpose(2, 1, 0)).shape == (2, 7, 4)


def test_valid_spellings_keep_working():
    x = np.ones((1, 3), np.float32)
    assert repr(D(np.int64(3), np.int32(2))) == repr(D((3, 2))) == "Dense(3 => 2)  # 8 parameters"
    named = D(3, 2, activation="relu")
    assert named.activation is tf.relu and "Dense(3 => 2, relu)" in repr(named)
    assert D(3, 2, "linear").activation is D(3, 2, None).activation is tf.identity
    assert tf.RNN(3, 4, "relu").activation is tf.relu
    assert tf.Conv(3, 1, 1, pad="valid").pad == (0, 0, 0, 0)
    assert tf.Conv(3, 1, 1, pad="SAME", dilation=2).pad == (2, 2, 2, 2)
    assert tf.MeanPool(2, pad="valid").pad == (0, 0, 0, 0)
    assert tf.Dropout(np.float32(0.25)).p == 0.25
    assert _CHAIN[-1] is _CHAIN.layers[1]
    assert D(3, 2)(x.astype(np.int32)).dtype == np.float32     # integer input converts


def test_a_layer_owns_its_parameters():
    w, b = np.ones((2, 3), np.float32), np.zeros(2, np.float32)
    bias_tensor = tf.tensor(b)
    dense = D(3, 2, init=lambda o, i: w, bias=b)
    dense_t = D(3, 2, init=lambda o, i: tf.tensor(w), bias=bias_tensor)
    conv_w = np.ones((1, 1, 2, 2), np.float32)
    conv = tf.Conv(2, 1, 1, init=lambda *s: conv_w)
    for model, x in ((dense, _x(4, 3)), (dense_t, _x(4, 3)), (conv, _x(1, 1, 3, 3))):
        opt = tf.setup(tf.Descent(0.1), model)
        (g,) = tf.gradient(lambda m: m(x).sum(), model)
        tf.update(opt, model, g)
        assert not np.allclose(model.weight.numpy(), 1)          # trained ...
    np.testing.assert_array_equal(w, 1)                          # ... without touching the user's arrays
    np.testing.assert_array_equal(b, 0)
    np.testing.assert_array_equal(bias_tensor.numpy(), 0)
    np.testing.assert_array_equal(conv_w, 1)


@pytest.mark.parametrize("dev", [p for p in DEVICES if p.id == "cuda"])
def test_input_element_types_on_the_device(dev):
    d = device(dev)
    dense, pool = d(D(3, 2)), tf.MaxPool(2)
    assert dense(d(_x(1, 3, dtype=np.int32))).dtype == np.float32          # integers convert on the device
    assert pool(d(_x(1, 1, 2, 2, dtype=np.int64))).shape == (1, 1, 1, 1)
    with pytest.raises(DTypeError, match=r"Dense\(3 => 2\) got an input of dtype complex64"):
        dense(_x(1, 3, dtype=np.complex64))        # the element type, before the device advice
    with pytest.raises(ShapeError, match=r"x\.transpose\(3, 2, 1, 0\)"):
        d(tf.Conv(1, 3, 2))(d(_x(5, 5, 3, 1)))
