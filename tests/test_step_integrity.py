"""A training step is all or nothing: whatever makes it fail (an error or an
out-of-memory at any primitive call of the forward, the loss, the backward
or the update, a NaN batch, a loss that does not fit the output, a
degenerate batch, a loss off the tape), the model's parameters, its running
statistics and the optimiser state are bit-identical afterwards, on both
devices. And BatchNorm on degenerate batches, as torch."""
import pickle

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import triflux as tf
from triflux import autodiff, dispatch, optimise
from triflux.errors import GradientError, NonFiniteError, OutOfMemoryError, ShapeError
from triflux.losses import mse
from triflux.optimise import Adam, rules, setup, train
from triflux.persistence import state

from helpers import DEVICES, device


class PrimitiveCalls:
    """Counts the primitive calls made inside the block (every forward,
    backward and optimiser update, on any device) and makes call number
    ``fail_at`` raise ``error`` instead of running."""

    MODULES = (dispatch, autodiff, rules)   # each calls `implementation` by its own name (rules: the updates)

    def __init__(self, fail_at=None, error=None):
        self.calls, self.fail_at, self.error = 0, fail_at, error

    def __enter__(self):
        real = dispatch.implementation

        def implementation(prim, dev, direction="forward"):
            run = real(prim, dev, direction)

            def call(*args, **kwargs):
                self.calls += 1
                if self.calls == self.fail_at:
                    raise self.error
                return run(*args, **kwargs)
            return call
        self.saved = [m.implementation for m in self.MODULES]
        for m in self.MODULES:
            m.implementation = implementation
        return self

    def __exit__(self, *exc):
        for m, saved in zip(self.MODULES, self.saved):
            m.implementation = saved


def _frozen(model, opt_state):
    """Every bit of the model (running statistics included) and of the optimiser state."""
    return pickle.dumps((state(model), state(opt_state)))


def _loss(m, x, y):
    return mse(m(x), y)


def _off_the_tape(m, x, y):
    return tf.tensor(mse(m(x), y).numpy())


ERRORS = [OutOfMemoryError("injected: out of memory"), RuntimeError("injected: a kernel failed")]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_failed_step_changes_nothing(dev):
    d = device(dev)
    tf.seed(0)
    model = d(tf.Chain(tf.Dense(3, 4), tf.BatchNorm(4, tf.relu), tf.Dense(4, 2)))
    opt_state = setup(Adam(0.1), model)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    with PrimitiveCalls() as step:      # a good step first: the moments and statistics are not at their start
        train(_loss, model, [(d(x), d(y))], opt_state)
    assert step.calls > 10

    @settings(max_examples=20 if dev == "cpu" else 6, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate])
    @given(st.data())
    def check(data):
        kind = data.draw(st.sampled_from(["fail", "fail", "nan", "target", "empty", "one", "numpy"]))
        bx, by, loss = x, y, _loss
        if kind == "nan":
            bx = x.copy()
            bx[data.draw(st.integers(0, 4)), data.draw(st.integers(0, 2))] = np.nan
        elif kind == "target":
            by = y[:, :1]
        elif kind in ("empty", "one"):
            n = 0 if kind == "empty" else 1
            bx, by = x[:n], y[:n]
        elif kind == "numpy":
            loss = _off_the_tape
        batch = [(d(bx), d(by))]
        before = _frozen(model, opt_state)
        if kind == "fail":
            error = data.draw(st.sampled_from(ERRORS))
            # train: anywhere in the step; gradient: anywhere but the update (its last call)
            how = data.draw(st.sampled_from(["train", "gradient"]))
            at = data.draw(st.integers(1, step.calls - (how == "gradient")))
            with PrimitiveCalls(at, error), pytest.raises(type(error), match="injected"):
                if how == "train":
                    train(loss, model, batch, opt_state)
                else:
                    tf.gradient(loss, model, *batch[0])
        else:
            expected = {"nan": (NonFiniteError, "the loss is nan on batch 0"),
                        "target": (ShapeError, "the target y has shape"),
                        "empty": (ShapeError, "the batch is empty"),
                        "one": (ShapeError, "expected more than 1 value per channel when training"),
                        "numpy": (GradientError, "does not depend on any trainable parameter")}[kind]
            with pytest.raises(expected[0], match=expected[1]):
                train(loss, model, batch, opt_state)
        assert _frozen(model, opt_state) == before, kind
    check()


@pytest.mark.parametrize("dev", DEVICES)
def test_update_is_all_or_nothing(dev):
    """A failure at any primitive call of ``update`` (converting each float64
    gradient to the parameters' float32, then the step) changes nothing."""
    d = device(dev)
    tf.seed(1)
    model = d(tf.Chain(tf.Dense(3, 4), tf.Dense(4, 2)))
    opt_state = setup(Adam(0.1), model)
    (g,) = tf.gradient(lambda m: m(d(np.ones((2, 3), np.float32))).sum(), model)
    g = tf.fmap(lambda t: t.astype("float64"), g)
    with PrimitiveCalls() as good:
        optimise.update(opt_state, model, g)
    assert good.calls == 5                    # four conversions, one step
    for at in range(1, good.calls + 1):
        before = _frozen(model, opt_state)
        with PrimitiveCalls(at, ERRORS[0]), pytest.raises(OutOfMemoryError):
            optimise.update(opt_state, model, g)
        assert _frozen(model, opt_state) == before, at


@pytest.mark.parametrize("dev", DEVICES)
def test_running_statistics_move_once_the_step_succeeds(dev):
    """Inside ``gradient`` the running statistics move exactly as a plain
    training-mode forward moves them (twice for a layer called twice), once
    the call returns."""
    d = device(dev)
    x = d(np.random.default_rng(1).standard_normal((6, 3, 2, 2)).astype(np.float32))
    plain, staged = d(tf.BatchNorm(3)), d(tf.BatchNorm(3))
    tf.trainmode(plain)
    plain(x)
    plain(x * 2.0)
    seen = {}

    def loss(bn):
        y = bn(x).sum() + bn(x * 2.0).sum()
        seen["during"] = bn.running_mean.numpy()
        return y
    tf.gradient(loss, staged)
    np.testing.assert_array_equal(seen["during"], 0)            # not yet: the step might still fail
    for name in ("running_mean", "running_var"):
        assert getattr(staged, name).numpy().tobytes() == getattr(plain, name).numpy().tobytes()


@pytest.mark.parametrize("dev", DEVICES)
def test_batchnorm_on_degenerate_batches_in_training(dev):
    """As torch: an empty batch gives an empty output and leaves the running
    statistics alone; one value per channel raises."""
    d = device(dev)
    bn = tf.trainmode(d(tf.BatchNorm(2)))
    y = bn(d(np.zeros((0, 2, 3, 3), np.float32)))
    assert y.shape == (0, 2, 3, 3)
    np.testing.assert_array_equal(bn.running_mean.numpy(), 0)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    with pytest.raises(ShapeError, match=r"BatchNorm\(2\): expected more than 1 value per channel when training, "
                                         r"got input of shape \(1, 2, 1, 1\) \(one sample of one pixel\).*"
                                         r"Use a batch of at least 2, or `testmode\(model\)`"):
        bn(d(np.ones((1, 2, 1, 1), np.float32)))
    with pytest.raises(ShapeError, match=r"shape \(1, 2\) \(one sample\)"):
        bn(d(np.ones((1, 2), np.float32)))
    np.testing.assert_array_equal(bn.running_mean.numpy(), 0)
    tf.testmode(bn)
    assert bn(d(np.ones((1, 2), np.float32))).shape == (1, 2)   # the running statistics need no batch


def test_training_a_model_without_trainable_parameters_says_so():
    model = tf.Chain(tf.relu)
    with pytest.raises(GradientError, match="the model has no trainable parameters"):
        train(_loss, model, [(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))], setup(Adam(), model))


@pytest.mark.parametrize("dev", DEVICES)
def test_a_failed_plain_forward_moves_nothing(dev):
    """Outside ``gradient``, a training-mode forward moves the running
    statistics in place (Flux's semantics) when it succeeds; when a later
    layer fails, the containers leave them as they were."""
    d = device(dev)
    x = d(np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32))
    model = tf.trainmode(d(tf.Chain(tf.Dense(3, 4), tf.BatchNorm(4), tf.Dense(5, 2))))   # 4 != 5: fails
    before = _frozen(model, None)
    with pytest.raises(ShapeError):
        model(x)
    assert _frozen(model, None) == before
    model.layers[2] = d(tf.Dense(4, 2))
    model(x)
    assert not np.array_equal(model.layers[1].running_mean.numpy(), 0)
