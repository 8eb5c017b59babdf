"""gradient / withgradient: values, accumulation, closures, structure, no tape kept."""
import gc
import weakref

import numpy as np
import pytest

import triflux as tf
from triflux import tape
from triflux.errors import GradientError
from helpers import DEVICES, device


@pytest.mark.parametrize("dev", DEVICES)
def test_simple_gradients(dev):
    d = device(dev)
    x_np = np.array([0.5, -1.0, 2.0], np.float32)
    x = tf.tensor(x_np, device=d)
    (g,) = tf.gradient(lambda x: (x * x).sum(), x)
    assert isinstance(g, tf.Tensor) and g.device == d
    np.testing.assert_allclose(g.numpy(), 2 * x_np, rtol=1e-6)
    (g,) = tf.gradient(lambda x: tf.sigmoid(x).mean(), x)
    s = 1 / (1 + np.exp(-x_np))
    np.testing.assert_allclose(g.numpy(), s * (1 - s) / 3, rtol=1e-5)


@pytest.mark.parametrize("dev", DEVICES)
def test_reuse_accumulates_and_closures_work(dev):
    d = device(dev)
    w = tf.tensor([3.0], device=d)
    x = tf.tensor([2.0], device=d)
    # x used three times: d/dx (x*x + w*x) = 2x + w
    (gx,) = tf.gradient(lambda x: (x * x + w * x).sum(), x)
    np.testing.assert_allclose(gx.numpy(), [7.0])
    value, (gx, gw) = tf.withgradient(lambda x, w: (x * w).sum(), x, w)
    assert float(value) == 6.0 and gx.numpy()[0] == 3.0 and gw.numpy()[0] == 2.0


@pytest.mark.parametrize("dev", DEVICES)
def test_structural_gradient_mirrors_the_model(dev):
    d = device(dev)
    m = d(tf.Chain(tf.Dense(3, 4, tf.relu), tf.flatten, tf.Dense(4, 2, bias=False)))
    x = d(np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32))
    (g, gx) = tf.gradient(lambda m, x: m(x).sum(), m, x)
    assert set(g) == {"layers"} and isinstance(g["layers"], list) and len(g["layers"]) == 3
    assert set(g["layers"][0]) == {"weight", "bias"} and g["layers"][1] is None
    assert g["layers"][2] == {"weight": g["layers"][2]["weight"]}
    assert g["layers"][0]["weight"].shape == (4, 3) and g["layers"][0]["weight"].device == d
    assert gx.shape == (5, 3)


def test_gradients_match_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    m = tf.Chain(tf.Dense(6, 5, tf.tanh), tf.Dense(5, 3))
    x_np = rng.standard_normal((4, 6)).astype(np.float32)
    (g,) = tf.gradient(lambda m: tf.logsoftmax(m(x_np)).mean(), m)
    tm = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for tl, l in zip([tm[0], tm[2]], [m[0], m[1]]):
            tl.weight.copy_(torch.from_numpy(l.weight.numpy()))
            tl.bias.copy_(torch.from_numpy(l.bias.numpy()))
    torch.log_softmax(tm(torch.from_numpy(x_np)), 1).mean().backward()
    for tl, gl in zip([tm[0], tm[2]], g["layers"]):
        np.testing.assert_allclose(gl["weight"].numpy(), tl.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gl["bias"].numpy(), tl.bias.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_no_gradient_is_none_and_constants_are_fine():
    x, y = tf.tensor([1.0]), tf.tensor([2.0])
    gx, gy = tf.gradient(lambda x, y: (x * 3).sum(), x, y)
    assert gy is None and gx.numpy()[0] == 3.0
    assert tf.gradient(lambda x, n: (x * n).sum(), x, 4)[1] is None


def test_no_tape_is_kept_outside_gradient():
    x = tf.tensor(np.ones(3, np.float32))
    holder = {}

    def f(x):
        y = x * 2
        holder["ref"] = weakref.ref(y)
        return y.sum()
    tf.gradient(f, x)
    assert tape.TAPE is None
    gc.collect()
    assert holder["ref"]() is None            # intermediates are freed: nothing holds a graph
    assert not hasattr(x, "grad")
    before = tape.TAPE
    _ = x * 3                                  # outside gradient: nothing recorded
    assert tape.TAPE is before is None


def test_errors():
    x = tf.tensor([1.0, 2.0])
    with pytest.raises(GradientError, match="scalar loss.*shape \\(2,\\)"):
        tf.gradient(lambda x: x * 2, x)
    with pytest.raises(GradientError, match="not a scalar Tensor"):
        tf.gradient(lambda x: 1.0, x)


def test_numpy_arguments_get_gradients():
    (g,) = tf.gradient(lambda a: (a * a).sum(), np.array([1.0, 2.0], np.float32))
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("arg,text", [
    (3.0, r"argument 0 is a Python float \(3.0\): pass `tensor\(3.0\)`"),
    ([1.0, 2.0], r"argument 0 is a Python list \(\[1.0, 2.0\]\): pass `tensor\(\[1.0, 2.0\]\)`"),
    (tf.tensor([1, 2]), r"argument 0 is a Tensor of int64: pass a floating-point one, `x.astype\('float32'\)`"),
    (tf.Chain(tf.relu), r"argument 0 \(Chain\) holds no floating-point Tensor"),
])
def test_nothing_to_differentiate_says_what_to_pass(arg, text):
    with pytest.raises(GradientError, match="`gradient`: nothing to differentiate: " + text):
        tf.gradient(lambda a: a * 2, arg)


def test_a_gradient_that_is_none_for_a_likely_reason_warns():
    x = tf.tensor([1.0, 2.0])
    with pytest.warns(UserWarning, match="`gradient`: argument 1 is a Python float, not a Tensor, so its "
                                         r"gradient is None. To differentiate with respect to it pass a Tensor"):
        gx, gs = tf.gradient(lambda x, s: (x * s).sum(), x, 0.5)
    assert gs is None and gx.numpy().tolist() == [0.5, 0.5]
    with pytest.warns(UserWarning, match=r"`withgradient`: the value does not depend on the arguments' "
                                         r"floating-point Tensors, so every gradient is None. Likely it left the "
                                         r"tape: `.numpy\(\)`, `.item\(\)`, `float\(...\)`"):
        value, (g,) = tf.withgradient(lambda x: tf.tensor((x * x).sum().numpy()), x)
    assert g is None and float(value) == 5.0
    with pytest.raises(GradientError, match=r"returned float, not a scalar Tensor.*`.item\(\)`, `float\(...\)`"):
        tf.gradient(lambda x: (x * x).sum().item(), x)


def test_second_order_gradients_are_refused():
    x = tf.tensor([1.0, 2.0])
    with pytest.raises(GradientError, match="`gradient` was called while another `gradient` is recording .*"
                                            "second-order gradients are not supported"):
        tf.gradient(lambda x: tf.gradient(lambda z: (z * z).sum(), x)[0].sum(), x)
    assert tape.TAPE is None
    (g,) = tf.gradient(lambda x: (x * x).sum(), x)                 # and gradient works again afterwards
    assert g.numpy().tolist() == [2.0, 4.0]


@pytest.mark.parametrize("dev", DEVICES)
def test_ignore_derivatives(dev):
    d = device(dev)
    w = tf.tensor([1.0, -2.0], device=d)
    (g,) = tf.gradient(lambda w: (w * tf.ignore_derivatives(w)).sum(), w)
    assert g.numpy().tolist() == [1.0, -2.0]                         # w, not 2w: one factor is a constant
    m = d(tf.Dense(2, 1))
    x = tf.tensor([[1.0, 3.0]], device=d)
    (gm,) = tf.gradient(lambda m: (m(x) * 3 + tf.ignore_derivatives(m)(x) + tf.ignore_derivatives(lambda: m(x))).sum(),
                        m)
    np.testing.assert_allclose(gm["weight"].numpy(), [[3.0, 9.0]])  # only the first term counts
    frozen = tf.ignore_derivatives({"w": w, "n": 3})
    assert frozen["n"] == 3 and frozen["w"] is not w and frozen["w"].numpy().tolist() == [1.0, -2.0]
