"""A captured training step (``capture_step``, ``train(capture=True)``)
is the eager step: the same losses, parameters, running statistics and
optimiser state, bit for bit, over recorded and replayed steps of both
parities, through a failed step, after the hyperparameters or the modes
change; a step that cannot be replayed runs eagerly and says why; the
replay runs none of the model's Python."""
import warnings

import numpy as np
import pytest

import triflux as tf
from triflux import dispatch, losses
from triflux.errors import NonFiniteError
from triflux.optimise import Adam, adjust, setup, train, train_step
from triflux.persistence import loadmodel, state

from helpers import DEVICES, assert_bit_identical, device

pytestmark = pytest.mark.filterwarnings("error::UserWarning")


def conv_bn_chain():
    return tf.Chain(tf.Conv((3, 3), 2, 3, pad=1), tf.BatchNorm(3, tf.relu), tf.MaxPool((2, 2)), tf.flatten,
                    tf.Dense(12, 2))


def lstm_head():
    return tf.Chain(tf.LSTM(2, 3), lambda h: h[:, -1], tf.Dense(3, 2))


def mlp():
    return tf.Chain(tf.Dense(4, 5, tf.relu), tf.Dense(5, 2))


def mlp_dropout():
    return tf.Chain(tf.Dense(4, 5, tf.relu), tf.Dropout(0.5), tf.Dense(5, 2))


#: model, one input, the loss
CASES = {
    "conv_bn": (conv_bn_chain, (2, 2, 4, 4), lambda m, x, y: losses.logitcrossentropy(m(x), y)),
    "lstm": (lstm_head, (2, 3, 2), lambda m, x, y: losses.mse(m(x), y)),
    "mlp": (mlp, (2, 4), lambda m, x, y: losses.mse(m(x), y)),
    "mlp_dropout": (mlp_dropout, (2, 4), lambda m, x, y: losses.mse(m(x), y)),
}


def twins(case, dev, rule=None):
    """The same model and optimiser state twice (eager, captured)."""
    build, shape, loss = CASES[case]
    out = []
    for _ in range(2):
        tf.seed(0)
        model = dev(build())
        out.append((model, setup(rule or Adam(1e-2), model)))
    return out, shape, loss


def batch(dev, shape, seed, nan=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if nan:
        x[0, ...] = np.nan
    return dev(x), dev(np.eye(2, dtype=np.float32)[rng.integers(0, 2, shape[0])])


def same_state(a, b):
    """Bit-identical model and optimiser states (NaN payloads included)."""
    assert_bit_identical(state(a[0]), state(b[0]), "model")
    assert_bit_identical(state(a[1]), state(b[1]), "opt_state")


def test_replayed_steps_are_the_eager_steps_through_a_failed_one_and_a_new_mode():
    """Steps 0-1 are recorded, 2 and 4 replayed with BatchNorm's moved
    statistics read from one buffer and then the other; step 3 has a NaN
    batch: a NonFiniteError in both, nothing changed; step 5 in test mode
    is recorded again."""
    dev = device("cuda")
    (eager, captured), shape, loss = twins("conv_bn", dev)
    step = tf.capture_step(loss, *captured)
    for i in range(6):
        b = batch(dev, shape, i, nan=(i == 3))
        if i == 3:
            before = state(captured[0]), state(captured[1])
            with pytest.raises(NonFiniteError, match="loss is nan"):
                train_step(loss, *eager, b, i)
            with pytest.raises(NonFiniteError, match="loss is nan"):
                step.run(b, i)
            same_state(captured, eager)
            same_state(captured, before)
            continue
        if i == 5:
            for m in (eager[0], captured[0]):
                tf.testmode(m)                   # BatchNorm uses its running statistics now
        assert train_step(loss, *eager, b, i) == step(*b)
        same_state(captured, eager)
    assert step.stats == {"eager": 0, "recorded": 3, "replayed": 3}, step.stats


def test_a_replayed_recurrent_step_is_the_eager_step():
    dev = device("cuda")
    (eager, captured), shape, loss = twins("lstm", dev)
    step = tf.capture_step(loss, *captured)
    for i in range(3):
        b = batch(dev, shape, i)
        assert train_step(loss, *eager, b, i) == step(*b)
        same_state(captured, eager)
    assert step.stats["replayed"] == 1


def test_replay_runs_no_python_of_the_model(monkeypatch):
    """Once replaying, no primitive is dispatched: the loss, the model and
    the tape are skipped. Both parities' launches are prepared."""
    dev = device("cuda")
    (eager, captured), shape, loss = twins("mlp", dev)
    step = tf.capture_step(loss, *captured)
    b = batch(dev, shape, 0)
    launches = []
    from triflux.triton_kernels import launch
    real = launch.prepare
    monkeypatch.setattr(launch, "prepare", lambda *a: launches.append(a[0]) or real(*a))
    step(*b), step(*b)

    def refuse(*args, **kwargs):
        raise AssertionError("the replay dispatched a primitive")
    monkeypatch.setattr(dispatch, "apply", refuse)
    step(*b)
    assert step.stats["replayed"] == 1
    assert len(launches) >= 2 * 6, len(launches)


def test_hyperparameters_modes_shapes_and_loaded_weights_are_honoured():
    dev = device("cuda")
    (eager, captured), shape, loss = twins("mlp", dev)
    step = tf.capture_step(loss, *captured)

    def both(b, i):
        assert train_step(loss, *eager, b, i) == step(*b)
        same_state(captured, eager)

    for i in range(3):
        both(batch(dev, shape, i), i)
    assert step.stats["replayed"] == 1
    for opt in (eager[1], captured[1]):          # a learning-rate schedule: the replay's update reads it
        adjust(opt, 1e-3)
    both(batch(dev, shape, 3), 3)
    assert step.stats["replayed"] == 2
    other = (3,) + shape[1:]                     # another batch size: a recording of its own
    for i in range(4, 7):
        both(batch(dev, other, i), i)
    both(batch(dev, shape, 7), 7)
    assert step.stats == {"eager": 0, "recorded": 4, "replayed": 4}, step.stats
    saved = state(eager[0])                      # loading weights replaces the model's memory: recorded again
    loadmodel(eager[0], saved)
    loadmodel(captured[0], saved)
    both(batch(dev, shape, 8), 8)
    assert step.stats["recorded"] == 5, step.stats


def test_dropout_draws_new_seeds_in_every_replay():
    """The replay draws the step's seeds from triflux's stream: with the same
    seed(...) it is the eager step, and its masks change from step to step."""
    dev = device("cuda")
    (eager, captured), shape, loss = twins("mlp_dropout", dev)
    step = tf.capture_step(loss, *captured)
    values = []
    for i in range(4):
        b = batch(dev, shape, 0)                 # the same batch: only the masks differ
        tf.seed(i)
        expected = train_step(loss, *eager, b, i)
        tf.seed(i)
        values.append(step(*b))
        assert values[-1] == expected
        same_state(captured, eager)
    assert step.stats == {"eager": 0, "recorded": 2, "replayed": 2}, step.stats
    tf.seed(7)
    after = step(*batch(dev, shape, 0))
    tf.seed(8)
    assert step(*batch(dev, shape, 0)) != after


@pytest.mark.parametrize("what", ["step count", "host read", "upload"])
def test_a_step_that_cannot_be_replayed_runs_eagerly_and_says_why(what):
    dev = device("cuda")
    (eager, captured), shape, loss = twins("mlp", dev)
    if what == "step count":                     # a host value that changes per step, not a seed
        calls = []

        def loss(m, x, y):
            calls.append(1)
            return losses.mse(m(x), y) * (1.0 + (len(calls) - 1) // 2)
        reason = "differs between steps"
    elif what == "host read":
        def loss(m, x, y):
            out = m(x)
            return losses.mse(out, y) * (2.0 if float(out.sum()) > 1e9 else 1.0)
        reason = "read on the host"
    else:
        calls = []

        def loss(m, x, y):                       # new host data every step, moved to the device
            calls.append(1)
            weights = dev(np.full((1, 2), (len(calls) - 1) // 2, np.float32))   # the step number
            return losses.mse(m(x) * weights, y)
        reason = "copies host data"
    step = tf.capture_step(loss, *captured)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            b = batch(dev, shape, i)
            assert train_step(loss, *eager, b, i) == step(*b)
            same_state(captured, eager)
    caught = [w for w in caught if "capture_step" in str(w.message)]
    assert len(caught) == 1 and "runs eagerly" in str(caught[0].message), [str(w.message) for w in caught]
    assert any(r in str(caught[0].message) for r in reason.split("|")), str(caught[0].message)
    # a host read is seen in the first recording, a difference between steps in the second
    assert step.stats == ({"eager": 2, "recorded": 1, "replayed": 0} if what == "host read" else
                          {"eager": 1, "recorded": 2, "replayed": 0}), step.stats
    assert list(step.reasons.values())[0] in str(caught[0].message)


@pytest.mark.parametrize("name", [p.values[0] for p in DEVICES], ids=["cpu", "cuda"])
def test_train_with_capture_is_train(name):
    if name == "cuda" and DEVICES[1].marks:
        pytest.skip("no CUDA backend")
    dev = device(name)
    (eager, captured), shape, loss = twins("mlp", dev)
    data = [batch(dev, shape, i) for i in range(4)]
    assert train(loss, eager[0], data, eager[1]) == train(loss, captured[0], data, captured[1], capture=True)
    same_state(captured, eager)
    step = tf.capture_step(loss, *captured)     # on the CPU: eager, silently (nothing to replay)
    step(*data[0]), step(*data[1]), step(*data[2])
    assert step.stats == ({"eager": 2, "recorded": 1, "replayed": 0} if name == "cpu"
                          else {"eager": 0, "recorded": 2, "replayed": 1}), step.stats


def test_capture_step_refuses_a_rule():
    with pytest.raises(TypeError, match="setup"):
        tf.capture_step(losses.mse, mlp(), Adam())


def test_a_float64_step_with_fills_inside_replays():
    """float64 fills reach the device through a one-element host copy: that is
    the step's own memory and data, so the step still replays, as eager."""
    dev = device("cuda")
    (eager, captured), shape, _ = twins("mlp", dev)
    eager, captured = [(m, setup(Adam(1e-2), m)) for m in (tf.f64(eager[0]), tf.f64(captured[0]))]

    def loss(m, x, y):
        return losses.mse(m(x), y) + tf.zeros(1, dtype=np.float64, device=dev).sum()
    step = tf.capture_step(loss, *captured)
    for i in range(3):
        x, y = batch(dev, shape, i)
        b = (x.astype(np.float64), y.astype(np.float64))
        assert train_step(loss, *eager, b, i) == step(*b)
        same_state(captured, eager)
    assert step.stats["replayed"] == 1, step.reasons
