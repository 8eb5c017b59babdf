"""triflux.losses against torch.nn.functional (forward) and torch.autograd
(gradients), on the CPU device and on the CUDA device (the Triton interpreter
in CI); error messages; onehotbatch / onecold."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import triflux as tf
from triflux import losses
from triflux.errors import DeviceMismatchError, ShapeError

from helpers import DEVICES, device

RTOL, ATOL = 2e-5, 1e-6
EPS32 = float(np.finfo(np.float32).eps)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _probs(rng, shape, axis):
    z = rng.standard_normal(shape)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def _onehot(rng, shape, axis):
    c = shape[axis]
    lab = rng.integers(0, c, size=tuple(s for i, s in enumerate(shape) if i != axis))
    return np.moveaxis(np.eye(c, dtype=np.float32)[lab], -1, axis)


def check(dev, loss, torch_loss, yhat, y, **kw):
    """triflux's loss value and dloss/dŷ on ``dev`` against torch (float64 on
    the same float32 numbers)."""
    d = device(dev)
    yh_t, y_t = tf.tensor(yhat, device=d), tf.tensor(y, device=d)
    value, (g,) = tf.withgradient(lambda a: loss(a, y_t, **kw), yh_t)
    assert value.device == d and g.device == d
    assert value.dtype == np.float32 and g.dtype == np.float32
    a = torch.tensor(yhat.astype(np.float64), requires_grad=True)
    ref = torch_loss(a, torch.tensor(y.astype(np.float64)))
    ref.backward()
    np.testing.assert_allclose(value.numpy(), ref.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(g.numpy(), a.grad.numpy(), rtol=1e-4, atol=1e-6)
    return value


# --- regression ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("agg", ["mean", "sum"])
def test_mse_mae(dev, agg):
    rng = _rng(1)
    yhat, y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    check(dev, losses.mse, lambda a, b: F.mse_loss(a, b, reduction=agg), yhat, y, agg=agg)
    check(dev, losses.mae, lambda a, b: F.l1_loss(a, b, reduction=agg), yhat, y, agg=agg)


def test_agg_variants():
    rng = _rng(2)
    yhat, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    ref = ((yhat.astype(np.float64) - y) ** 2)
    for agg in (tf.ops.mean, np.mean, None):
        np.testing.assert_allclose(losses.mse(yhat, y, agg=agg).numpy(), ref.mean(), rtol=1e-6)
    for agg in (sum, np.sum, tf.ops.sum):
        np.testing.assert_allclose(losses.mse(yhat, y, agg=agg).numpy(), ref.sum(), rtol=1e-6)
    none = losses.mse(yhat, y, agg="none")
    assert none.shape == (4, 3)
    np.testing.assert_allclose(losses.mse(yhat, y, agg=lambda t: t.sum(axis=0)).numpy(), ref.sum(0), rtol=1e-6)
    # crossentropy with agg="none" keeps the class axis as size 1, as Flux's sum(...; dims)
    p, oh = _probs(_rng(3), (4, 3), 1), _onehot(_rng(3), (4, 3), 1)
    assert losses.crossentropy(p, oh, agg="none").shape == (4, 1)
    with pytest.raises(ValueError, match="unknown agg"):
        losses.mse(yhat, y, agg="median")


def test_scalar_target_broadcasts():
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    np.testing.assert_allclose(losses.mse(x, 0).numpy(), (1 + 4 + 9) / 3, rtol=1e-6)


def test_flux_doc_examples():
    # Flux docstrings: mse([1.1, 1.9, 3.1], 1:3) ≈ 0.01; mae ≈ 0.1
    yhat = np.array([1.1, 1.9, 3.1])
    y = np.array([1, 2, 3])
    np.testing.assert_allclose(losses.mse(yhat, y).numpy(), 0.01, rtol=1e-6)
    np.testing.assert_allclose(losses.mae(yhat, y).numpy(), 0.1, rtol=1e-6)
    # logitbinarycrossentropy(Float32[2, -1, pi], Bool[1, 0, 1]) ≈ 0.160832
    v = losses.logitbinarycrossentropy(np.array([2, -1, np.pi], np.float32), np.array([True, False, True]))
    np.testing.assert_allclose(v.numpy(), 0.160832, rtol=1e-5)
    # crossentropy(softmax(reshape(-7:7, 3, 5)), onehotbatch([0,1,2,1,0], 0:2)) ≈ 1.6076053 (batch first here)
    logits = np.arange(-7, 8, dtype=np.float32).reshape(5, 3)
    y = losses.onehotbatch([0, 1, 2, 1, 0], range(3))
    np.testing.assert_allclose(losses.crossentropy(tf.softmax(tf.tensor(logits)), y).numpy(), 1.6076053, rtol=1e-5)


# --- classification -------------------------------------------------------------------------------

def _torch_ce(axis, eps=EPS32):
    return lambda a, b: (-torch.xlogy(b, a + eps).sum(axis, keepdim=True)).mean()


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shape,axis,dims", [((6, 4), 1, None), ((3, 4, 5), 1, None), ((4,), 0, None),
                                             ((3, 5, 4), 2, -1)])
def test_crossentropy(dev, shape, axis, dims):
    rng = _rng(4)
    p = _probs(rng, shape, axis)
    y = _onehot(rng, shape, axis) * 0.8 + 0.2 / shape[axis]   # smoothed labels: xlogy is not trivial
    check(dev, losses.crossentropy, _torch_ce(axis), p, y, dims=dims)


def test_crossentropy_one_hot_matches_nll_and_zero_labels():
    rng = _rng(5)
    p = _probs(rng, (6, 4), 1)
    lab = rng.integers(0, 4, 6)
    y = np.eye(4, dtype=np.float32)[lab]
    p[0, :] = np.eye(4, dtype=np.float32)[lab[0]]   # zero probabilities where y == 0 are fine (xlogy)
    v = losses.crossentropy(p, y).numpy()
    ref = F.nll_loss(torch.log(torch.tensor(p, dtype=torch.float64) + EPS32), torch.tensor(lab))
    np.testing.assert_allclose(v, ref.numpy(), rtol=1e-5)
    assert np.isfinite(losses.crossentropy(p, y, eps=0).numpy())
    _, (g,) = tf.withgradient(lambda a: losses.crossentropy(a, y), tf.tensor(p))
    assert np.isfinite(g.numpy()).all()   # the default ϵ keeps log and its gradient finite at 0


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shape,axis,dims", [((6, 4), 1, None), ((3, 4, 5), 1, None), ((4,), 0, None),
                                             ((3, 5, 4), 2, 2)])
def test_logitcrossentropy(dev, shape, axis, dims):
    rng = _rng(6)
    z = (rng.standard_normal(shape) * 3).astype(np.float32)
    y = _probs(rng, shape, axis)
    if axis == 1 or len(shape) == 1:
        ref = lambda a, b: F.cross_entropy(a, b)   # noqa: E731  (class axis 1, or an unbatched vector)
    else:
        ref = lambda a, b: F.cross_entropy(a.movedim(axis, 1), b.movedim(axis, 1))  # noqa: E731
    check(dev, losses.logitcrossentropy, ref, z, y, dims=dims)


def test_logitcrossentropy_extreme_logits_stable():
    z = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4]], dtype=np.float32)
    y = np.array([[0, 1, 0], [0, 0, 1]], dtype=np.float32)
    v, (g,) = tf.withgradient(lambda a: losses.logitcrossentropy(a, y), tf.tensor(z))
    ref = F.cross_entropy(torch.tensor(z, dtype=torch.float64), torch.tensor(y, dtype=torch.float64))
    np.testing.assert_allclose(v.numpy(), ref.numpy(), rtol=1e-6)
    assert np.isfinite(g.numpy()).all()


@pytest.mark.parametrize("dev", DEVICES)
def test_binarycrossentropy(dev):
    rng = _rng(7)
    p = rng.uniform(0.02, 0.98, (5, 3)).astype(np.float32)
    y = (rng.uniform(size=(5, 3)) > 0.5).astype(np.float32)
    y[0, 0] = 0.3   # soft target
    exact = lambda a, b: (-torch.xlogy(b, a + EPS32) - torch.xlogy(1 - b, 1 - a + EPS32)).mean()  # noqa: E731
    check(dev, losses.binarycrossentropy, exact, p, y)
    # and torch's own (clamped log, no epsilon): the same up to ϵ
    v = losses.binarycrossentropy(p, y).numpy()
    np.testing.assert_allclose(v, F.binary_cross_entropy(torch.tensor(p), torch.tensor(y)).numpy(), rtol=1e-5)


@pytest.mark.parametrize("dev", DEVICES)
def test_logitbinarycrossentropy(dev):
    rng = _rng(8)
    z = (rng.standard_normal((4, 5)) * 4).astype(np.float32)
    z[0, :3] = [60.0, -60.0, 0.0]    # saturated logits stay finite, exact
    y = (rng.uniform(size=(4, 5)) > 0.5).astype(np.float32)
    y[1, 1] = 0.25
    check(dev, losses.logitbinarycrossentropy, lambda a, b: F.binary_cross_entropy_with_logits(a, b), z, y)
    check(dev, losses.logitbinarycrossentropy,
          lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="sum"), z, y, agg="sum")


@pytest.mark.parametrize("dev", DEVICES)
def test_dice_coeff_loss(dev):
    rng = _rng(9)
    p = rng.uniform(size=(2, 1, 4, 4)).astype(np.float32)
    y = (rng.uniform(size=(2, 1, 4, 4)) > 0.5).astype(np.float32)

    def ref(a, b, smooth=1.0):
        return 1 - (2 * (b * a).sum() + smooth) / ((b ** 2).sum() + (a ** 2).sum() + smooth)

    v = check(dev, losses.dice_coeff_loss, ref, p, y)
    assert v.shape == ()
    check(dev, losses.dice_coeff_loss, lambda a, b: ref(a, b, 0.5), p, y, smooth=0.5)


@pytest.mark.parametrize("dev", DEVICES)
def test_float64_and_dtype_of_target(dev):
    d = device(dev)
    rng = _rng(10)
    p64 = _probs(rng, (3, 4), 1).astype(np.float64)
    y = _onehot(rng, (3, 4), 1)
    v = losses.crossentropy(tf.tensor(p64, device=d), tf.tensor(y.astype(np.int64), device=d))
    assert v.dtype == np.float64      # ŷ's dtype rules; integer one-hot targets are converted
    ref = -(np.log(p64 + np.finfo(np.float64).eps) * y).sum(1).mean()
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-12)
    # a bool target (Flux's one-hot arrays) against float32 predictions
    p32 = p64.astype(np.float32)
    v = losses.crossentropy(tf.tensor(p32, device=d), tf.tensor(y.astype(bool), device=d))
    assert v.dtype == np.float32
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-5)


# --- errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss", [losses.mse, losses.mae, losses.crossentropy, losses.logitcrossentropy,
                                  losses.binarycrossentropy, losses.logitbinarycrossentropy,
                                  losses.dice_coeff_loss])
def test_shape_mismatch_names_loss_and_shapes(loss):
    with pytest.raises(ShapeError) as e:
        loss(np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32))
    msg = str(e.value)
    assert f"`{loss.__name__}`" in msg and "(4, 3)" in msg and "(4, 2)" in msg


@pytest.mark.parametrize("loss", [losses.mse, losses.crossentropy, losses.logitcrossentropy,
                                  losses.logitbinarycrossentropy])
def test_empty_batch(loss):
    with pytest.raises(ShapeError, match="batch is empty") as e:
        loss(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert loss.__name__ in str(e.value) and "(0, 3)" in str(e.value)


@pytest.mark.parametrize("loss", [losses.crossentropy, losses.logitcrossentropy])
def test_integer_labels_say_onehot(loss):
    with pytest.raises(ShapeError, match="onehotbatch") as e:
        loss(np.zeros((4, 3), np.float32), np.array([0, 2, 1, 1]))
    assert "class indices" in str(e.value) and "(4,)" in str(e.value) and "(4, 3)" in str(e.value)
    # float labels of the batch shape: still a hint
    with pytest.raises(ShapeError, match="onehotbatch"):
        loss(np.zeros((4, 3), np.float32), np.array([0.0, 2.0, 1.0, 1.0], np.float32))


def test_bad_dims():
    with pytest.raises(ShapeError, match="out of range"):
        losses.crossentropy(np.full((2, 3), 1 / 3, np.float32), np.eye(3, dtype=np.float32)[[0, 1]], dims=2)


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_device_mismatch_names_loss_and_fix():
    yhat = tf.tensor(np.zeros((2, 3), np.float32), device=tf.CUDADevice(0))
    with pytest.raises(DeviceMismatchError) as e:
        losses.logitcrossentropy(yhat, np.eye(3, dtype=np.float32)[[0, 1]])
    msg = str(e.value)
    assert "`logitcrossentropy`" in msg and "CPUDevice()" in msg and "CUDADevice(0)" in msg and "gpu(y)" in msg


# --- one-hot -------------------------------------------------------------------------------------------

def test_onehotbatch_and_onecold():
    y = losses.onehotbatch([2, 0, 1, 2], range(3))
    assert y.shape == (4, 3) and y.dtype == np.float32 and y.device == tf.cpu_device()
    np.testing.assert_array_equal(y.numpy(), np.eye(3, dtype=np.float32)[[2, 0, 1, 2]])
    np.testing.assert_array_equal(losses.onecold(y), [2, 0, 1, 2])
    y = losses.onehotbatch(list("abca"), "abc")
    np.testing.assert_array_equal(losses.onecold(y, "abc"), list("abca"))
    assert losses.onehotbatch(np.array([1, 0]), 2).shape == (2, 2)          # an int means range(C)
    assert losses.onehotbatch(np.zeros((2, 5), np.int64), 3).shape == (2, 5, 3)
    # default for unknown labels, and the error without it
    np.testing.assert_array_equal(losses.onehotbatch([7, 1], [0, 1, 2], default=2).numpy(),
                                  [[0, 0, 1], [0, 1, 0]])
    with pytest.raises(ValueError, match="label 7"):
        losses.onehotbatch([7, 1], [0, 1, 2])
    # onecold over one vector, and along another axis
    assert losses.onecold(np.array([0.1, 0.7, 0.2])) == 1
    np.testing.assert_array_equal(losses.onecold(np.array([[0.1, 0.9], [0.8, 0.2]]), dims=0), [1, 0])
    with pytest.raises(ShapeError, match="classes"):
        losses.onecold(np.zeros((2, 3)), [0, 1])


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_onehot_on_device():
    d = tf.CUDADevice(0)
    labels = tf.tensor(np.array([1, 0, 1]), device=d)
    y = losses.onehotbatch(labels, [0, 1])
    assert y.device == d and y.dtype == np.float32
    np.testing.assert_array_equal(losses.onecold(y, ["no", "yes"]), ["yes", "no", "yes"])
    assert losses.onehotbatch([1, 0], 2, device=d).device == d


@pytest.mark.parametrize("classes", [None, 2.5, float("nan"), True, 0, -1])
def test_onehotbatch_names_a_bad_classes_argument(classes):
    from triflux.errors import ArgumentError
    with pytest.raises(ArgumentError, match=r"onehotbatch: classes must be a number of classes \(an int >= 1\) "
                                            r"or a sequence"):
        tf.onehotbatch([0, 1], classes)


def test_loss_device_message_gives_code_that_moves_the_target():
    from triflux.errors import DeviceMismatchError
    if not tf.functional("CUDA"):
        pytest.skip("needs a CUDA device (real, or the interpreter's)")
    yhat, y = tf.gpu(np.ones((2, 3), np.float32)), tf.cpu(np.ones((2, 3), np.float32))
    with pytest.raises(DeviceMismatchError, match=r"`gpu\(y\)` moves the target"):
        tf.losses.mse(yhat, y)
