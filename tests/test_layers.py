"""Dense, Chain, flatten, activations; Flux-style printing; input checks."""
import warnings

import numpy as np
import pytest

import triflux as tf
from triflux.errors import ShapeError
from triflux.layers import inputs
from helpers import DEVICES, device


@pytest.mark.parametrize("dev", DEVICES)
def test_dense_forward_matches_numpy_on_any_leading_axes(dev):
    d = device(dev)
    layer = tf.Dense(4, 3, tf.relu)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    layer.bias = tf.tensor(np.array([0.1, -0.2, 0.3], np.float32))
    b = layer.bias.numpy()
    layer = d(layer)
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    y = layer(d(x))
    assert y.shape == (2, 5, 3) and y.device == d
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("act", [tf.relu, tf.sigmoid, tf.tanh, tf.leakyrelu, tf.elu, tf.gelu, tf.swish,
                                 tf.identity, tf.softplus])
def test_activations_match_torch(dev, act):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ref = {tf.relu: F.relu, tf.sigmoid: torch.sigmoid, tf.tanh: torch.tanh, tf.leakyrelu: F.leaky_relu,
           tf.elu: F.elu, tf.gelu: lambda t: F.gelu(t, approximate="tanh"), tf.swish: F.silu,
           tf.identity: lambda t: t, tf.softplus: F.softplus}[act]
    x = np.linspace(-4, 4, 9).astype(np.float32)
    got = act(tf.tensor(x, device=device(dev)))
    np.testing.assert_allclose(got.numpy(), ref(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_softmax_class_axis_defaults(dev):
    d = device(dev)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    s = tf.softmax(d(x)).numpy()
    np.testing.assert_allclose(s.sum(axis=1), 1, rtol=1e-5)                # batched: axis 1
    v = tf.softmax(d(x[0, :, 0])).numpy()
    np.testing.assert_allclose(v.sum(), 1, rtol=1e-5)                       # unbatched vector: axis 0
    np.testing.assert_allclose(tf.logsoftmax(d(x), dims=2).numpy(),
                               x - np.log(np.exp(x).sum(2, keepdims=True)), rtol=1e-5, atol=1e-6)


def test_printing_like_flux():
    m = tf.Chain(tf.Dense(784, 32, tf.relu), tf.Dense(32, 10))
    text = repr(m)
    assert text.splitlines()[0] == "Chain("
    assert "Dense(784 => 32, relu)," in text and "# 25_120 parameters" in text
    assert "Dense(32 => 10)," in text and "# 330 parameters" in text
    assert text.splitlines()[-1].strip() == ")                   # Total: 4 arrays, 25_450 parameters, 99.414 KiB.".strip()
    assert repr(tf.Dense(10, 5, tf.sigmoid)) == "Dense(10 => 5, sigmoid)  # 55 parameters"
    assert repr(tf.Dense(2, 3, bias=False)) == "Dense(2 => 3; bias=false)  # 6 parameters"


def test_printing_flags_nan_and_works_on_device():
    m = tf.Chain(tf.Dense(2, 2), tf.Dense(2, 1))
    m[1].weight = tf.tensor(np.array([[np.nan, 1.0]], np.float32))
    assert "(some NaN)" in repr(m) and "(some NaN)" in repr(m[1])
    if tf.functional("CUDA"):
        g = tf.gpu(m)
        assert "(some NaN)" in repr(g) and "Total: 4 arrays, 9 parameters" in repr(g)


def test_named_chain_and_indexing():
    m = tf.Chain(enc=tf.Dense(3, 2), dec=tf.Dense(2, 3))
    assert m["enc"] is m[0] and len(m) == 2 and isinstance(m[0:1], tf.Chain)
    assert "enc=Dense(3 => 2)" in repr(m)
    (g,) = tf.gradient(lambda m: m(np.ones((1, 3), np.float32)).sum(), m)
    assert set(g["layers"]) == {"enc", "dec"}


def test_dense_input_errors_name_layer_and_shapes():
    layer = tf.Dense(4, 3)
    with pytest.raises(ShapeError) as e:
        layer(np.ones((2, 5), np.float32))
    assert "Dense(4 => 3)" in str(e.value) and "4 features" in str(e.value) and "(2, 5)" in str(e.value)
    with pytest.raises(ShapeError, match="weight must have shape"):
        tf.Dense(2, 3, init=lambda o, i: np.ones((i, o)))


def test_float64_input_converts_with_one_warning():
    inputs._WARNED_F64.clear()
    layer = tf.Dense(2, 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y1 = layer(np.ones((1, 2)))
        y2 = layer(np.ones((1, 2)))
    assert y1.dtype == np.float32 and y2.dtype == np.float32
    msgs = [str(x.message) for x in w if "float64" in str(x.message)]
    assert len(msgs) == 1 and "f32" in msgs[0]


def test_empty_batch_passes_through_dense():
    y = tf.Dense(3, 2)(np.zeros((0, 3), np.float32))
    assert y.shape == (0, 2)


def test_flatten():
    x = tf.zeros(2, 3, 4)
    assert tf.flatten(x).shape == (2, 12)
    with pytest.raises(ShapeError):
        tf.flatten(tf.tensor(1.0))


# --- the device check at each layer's entry -----------------------------------------------------

def _layers_with_parameters():
    return [
        (lambda: tf.Dense(3, 2, tf.relu), (2, 3), "Dense(3 => 2, relu)"),
        (lambda: tf.Conv((3, 3), 2, 4), (1, 2, 5, 5), "Conv((3, 3), 2 => 4)"),
        (lambda: tf.ConvTranspose((2, 2), 2, 3, stride=2), (1, 2, 4, 4), "ConvTranspose((2, 2), 2 => 3"),
        (lambda: tf.BatchNorm(2), (3, 2, 4, 4), "BatchNorm(2)"),
    ]


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
@pytest.mark.parametrize("case", range(4), ids=["Dense", "Conv", "ConvTranspose", "BatchNorm"])
@pytest.mark.parametrize("order", ["model_cpu_data_gpu", "model_gpu_data_cpu", "model_gpu_data_numpy"])
def test_layer_entry_device_check_names_layer_devices_and_fix(monkeypatch, case, order):
    from triflux import ops
    from triflux.errors import DeviceMismatchError
    make, shape, name = _layers_with_parameters()[case]
    gpu, cpu = tf.CUDADevice(0), tf.cpu_device()
    x = np.ones(shape, np.float32)
    layer = make()
    if order == "model_cpu_data_gpu":
        model, data, pdev, xdev = layer, gpu(x), cpu, gpu
    else:
        model, data, pdev, xdev = gpu(layer), (cpu(x) if order == "model_gpu_data_cpu" else x), gpu, cpu
    before = tf.state(model)

    def no_kernels(*a, **k):
        raise AssertionError("a primitive ran before the device check")
    monkeypatch.setattr(ops, "apply", no_kernels)
    for m in (model, tf.Chain(model)):
        with pytest.raises(DeviceMismatchError) as e:
            tf.trainmode(m)(data)
        msg = str(e.value)
        assert msg.startswith(name), msg
        assert f"parameters are on {pdev!r}" in msg and f"input is on {xdev!r}" in msg
        fix_x = "cpu" if pdev.is_cpu else "gpu"        # valid code: the default GPU device is gpu(...)
        fix_m = "cpu" if xdev.is_cpu else "gpu"
        assert f"`x = {fix_x}(x)`" in msg and f"`model = {fix_m}(model)`" in msg
    monkeypatch.undo()
    after = tf.state(model)
    for k in before:
        if before[k] is not None:
            np.testing.assert_array_equal(before[k], after[k])
    # the fix works
    fixed = (gpu if pdev == gpu else cpu)(data) if not isinstance(data, np.ndarray) else gpu(data)
    assert model(fixed).device == pdev


# --- the per-sample normalisations: exported, their functions in triflux.ops -----------------------

def _primitives_of(f, x):
    """Names of the primitives the tape records for ``f(x)``."""
    from triflux import tape as tapes
    tape = tapes.Tape([x])
    outer, tapes.TAPE = tapes.TAPE, tape
    try:
        y = f(x)
    finally:
        tapes.TAPE = outer
    return y, [prim.name for prim, *_ in tape.nodes]


@pytest.mark.parametrize("dev", DEVICES)
def test_normalisations_are_exported_and_their_functions_are_in_ops(dev):
    from triflux import normalisation
    from triflux.errors import ArgumentError
    for name in ("LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm"):
        assert name in tf.layers.__all__ and getattr(tf, name) is getattr(tf.layers, name)
    for name in ("layer_norm", "rms_norm", "group_norm", "instance_norm"):
        assert getattr(tf.ops, name) is getattr(normalisation, name)
    d = device(dev)
    x = d(np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32))
    plain = tf.ops.layer_norm(x, 5).numpy()

    def relu(t):   # the user's own function, a lookalike of triflux's relu: applied after, not fused
        return tf.relu(t)

    # triflux's own relu, sigmoid, tanh (function or name) run in the normalisation's kernels; others after it
    for act, n in ((tf.relu, 1), ("relu", 1), (tf.sigmoid, 1), (relu, 2), (tf.gelu, 2)):
        y, names = _primitives_of(lambda t: tf.ops.layer_norm(t, 5, activation=act), x)
        assert names[0] == "layernorm" and len(names) == n, (act, names)
        want = tf.sigmoid(tf.tensor(plain)) if act is tf.sigmoid else \
            tf.gelu(tf.tensor(plain)) if act is tf.gelu else tf.relu(tf.tensor(plain))
        np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentError, match=r"activation 'gelu' is not one .*pass the function instead "
                                            r"\(activation=triflux\.gelu\)"):
        tf.ops.group_norm(x, 3, activation="gelu")
    # instance_norm with the running statistics (batch norm's test mode), launched from triflux.normalisation
    mean, var = np.array([0.5, -1, 2], np.float32), np.array([1, 2, 0.5], np.float32)
    w, b = np.array([1, -2, 3], np.float32), np.array([0, 1, -1], np.float32)
    y = tf.ops.instance_norm(x, d(mean), d(var), d(w), d(b), use_input_stats=False, eps=1e-3, activation=tf.tanh)
    c = (slice(None), None)
    want = np.tanh((x.numpy() - mean[c]) / np.sqrt(var[c] + 1e-3) * w[c] + b[c])
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
