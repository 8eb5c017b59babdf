"""triflux.optimise: each rule against a NumPy re-derivation of Optimisers.jl's
formula and against torch.optim; setup/update structure and errors; adjust;
train (the same run on CPU and CUDA, NaN losses stop it)."""
import numpy as np
import pytest
import torch

import triflux as tf
from triflux import losses
from triflux.errors import ArgumentError, DeviceMismatchError, NonFiniteError, StructureError
from triflux.layers import Layer
from triflux.optimise import (Adam, AdamW, Descent, Leaf, MixedPrecision, Momentum, Nesterov, RMSProp, adjust,
                              rule_from_dict, setup, trainables,
                              train, update)
from triflux.persistence import loadmodel, state

from helpers import DEVICES, device

STEPS = 4


def _grads(seed=0, shape=(3, 4), n=STEPS):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _x0(shape=(3, 4)):
    return np.random.default_rng(99).standard_normal(shape).astype(np.float32)


# --- NumPy re-derivations of Optimisers.jl (src/rules.jl), in float64 --------------------------------

def np_descent(x, gs, eta=0.1):
    for g in gs:
        x = x - eta * g
    return x


def np_momentum(x, gs, eta=0.01, rho=0.9):
    v = np.zeros_like(x)
    for g in gs:
        v = rho * v + eta * g
        x = x - v
    return x


def np_nesterov(x, gs, eta=0.001, rho=0.9):
    v = np.zeros_like(x)
    for g in gs:
        d = -rho ** 2 * v + (1 + rho) * eta * g
        v = rho * v - eta * g
        x = x - d
    return x


def np_rmsprop(x, gs, eta=0.001, rho=0.9, eps=1e-8):
    s = np.zeros_like(x)
    for g in gs:
        s = rho * s + (1 - rho) * g ** 2
        x = x - eta * g / (np.sqrt(s) + eps)
    return x


def np_adam(x, gs, eta=0.001, beta=(0.9, 0.999), eps=1e-8, lambd=None, couple=True):
    m, v = np.zeros_like(x), np.zeros_like(x)
    bt = np.array(beta)                      # Optimisers.jl's βt: β at the first step, then β^t
    for g in gs:
        m = beta[0] * m + (1 - beta[0]) * g
        v = beta[1] * v + (1 - beta[1]) * g ** 2
        d = m / (1 - bt[0]) / (np.sqrt(v / (1 - bt[1])) + eps)
        if lambd is None:
            x = x - eta * d
        elif couple:
            x = x - eta * (d + lambd * x)
        else:
            x = x - (eta * d + lambd * x)
        bt = bt * beta
    return x


CASES = [
    (Descent(), np_descent, {}),
    (Descent(0.3), lambda x, gs: np_descent(x, gs, 0.3), {}),
    (Momentum(), np_momentum, {}),
    (Momentum(0.05, 0.8), lambda x, gs: np_momentum(x, gs, 0.05, 0.8), {}),
    (Nesterov(), np_nesterov, {}),
    (Nesterov(0.02, 0.7), lambda x, gs: np_nesterov(x, gs, 0.02, 0.7), {}),
    (RMSProp(), np_rmsprop, {}),
    (RMSProp(0.01, 0.95, 1e-6), lambda x, gs: np_rmsprop(x, gs, 0.01, 0.95, 1e-6), {}),
    (Adam(), np_adam, {}),
    (Adam(0.01, (0.8, 0.99), 1e-6), lambda x, gs: np_adam(x, gs, 0.01, (0.8, 0.99), 1e-6), {}),
    (AdamW(), lambda x, gs: np_adam(x, gs, lambd=0.0), {}),
    (AdamW(0.01, (0.9, 0.999), 0.1), lambda x, gs: np_adam(x, gs, 0.01, lambd=0.1), {}),
    (AdamW(0.01, (0.9, 0.999), 0.1, couple=False),
     lambda x, gs: np_adam(x, gs, 0.01, lambd=0.1, couple=False), {}),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("rule,ref,_", CASES, ids=[repr(c[0]) for c in CASES])
def test_rule_matches_optimisers_jl(dev, rule, ref, _):
    d = device(dev)
    x0, gs = _x0(), _grads()
    p = tf.tensor(x0, device=d)
    st = setup(rule, p)
    assert isinstance(st, Leaf) and st.rule == rule
    for g in gs:
        out = update(st, p, tf.tensor(g, device=d))
        assert out[0] is st and out[1] is p
    assert p.device == d and p.dtype == np.float32
    expect = ref(x0.astype(np.float64), [g.astype(np.float64) for g in gs])
    np.testing.assert_allclose(p.numpy(), expect, rtol=2e-5, atol=2e-6)


def _torch_run(opt_cls, x0, gs, **kw):
    p = torch.nn.Parameter(torch.tensor(x0, dtype=torch.float64))
    opt = opt_cls([p], **kw)
    for g in gs:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return p.detach().numpy()


TORCH = [
    (Descent(0.1), torch.optim.SGD, dict(lr=0.1)),
    (Momentum(0.01, 0.9), torch.optim.SGD, dict(lr=0.01, momentum=0.9)),
    (Nesterov(0.01, 0.9), torch.optim.SGD, dict(lr=0.01, momentum=0.9, nesterov=True)),
    (RMSProp(0.001, 0.9, 1e-8), torch.optim.RMSprop, dict(lr=0.001, alpha=0.9, eps=1e-8)),
    (Adam(0.001, (0.9, 0.999), 1e-8), torch.optim.Adam, dict(lr=0.001, betas=(0.9, 0.999), eps=1e-8)),
    (AdamW(0.01, (0.9, 0.99), 0.05, 1e-8), torch.optim.AdamW,
     dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)),
]


@pytest.mark.parametrize("rule,opt_cls,kw", TORCH, ids=[t[1].__name__ + "-" + type(t[0]).__name__ for t in TORCH])
def test_rule_matches_torch_optim(rule, opt_cls, kw):
    x0, gs = _x0(), _grads(1)
    p = tf.tensor(x0)
    st = setup(rule, p)
    for g in gs:
        update(st, p, tf.tensor(g))
    np.testing.assert_allclose(p.numpy(), _torch_run(opt_cls, x0, gs, **kw), rtol=2e-5, atol=2e-6)


def test_defaults_and_repr():
    assert repr(Descent()) == "Descent(0.1)"
    assert repr(Momentum()) == "Momentum(0.01, 0.9)"
    assert repr(Nesterov()) == "Nesterov(0.001, 0.9)"
    assert repr(Adam()) == "Adam(0.001, (0.9, 0.999), 1e-08)"
    assert repr(AdamW()) == "AdamW(0.001, (0.9, 0.999), 0.0, 1e-08, True)"
    assert repr(RMSProp()) == "RMSProp(0.001, 0.9, 1e-08; centred = false)"
    assert Adam(eta=0.01).eta == 0.01 and AdamW(lambda_=0.1).lambd == 0.1
    with pytest.raises(NotImplementedError, match="centred"):
        RMSProp(centred=True)
    r = repr(setup(Adam(), tf.zeros(2, 3)))
    assert r.startswith("Leaf(Adam(0.001, (0.9, 0.999), 1e-08), (2×3 Tensor{float32}")


# --- setup / update on models ------------------------------------------------------------------------------

class WithBuffer(Layer):
    """A layer with a non-trainable child, as BatchNorm's running statistics."""
    _nontrainable = ("running",)

    def __init__(self):
        self.weight = tf.ones(4)
        self.running = tf.zeros(4)
        self.count = tf.tensor(np.array([0, 0]))   # an integer buffer: never trained

    def __call__(self, x):
        return x * self.weight


def _mlp(d=None, seed=0):
    tf.seed(seed)
    m = tf.Chain(tf.Dense(3, 4, tf.relu), tf.Dense(4, 2))
    return m if d is None else d(m)


@pytest.mark.parametrize("dev", DEVICES)
def test_setup_mirrors_model(dev):
    d = device(dev)
    m = d(tf.Chain(tf.Dense(3, 4, tf.relu), tf.relu, WithBuffer()))
    st = setup(Momentum(), m)
    assert list(st) == ["layers"] and len(st["layers"]) == 3
    dense = st["layers"][0]
    assert set(dense) == {"weight", "bias"} and isinstance(dense["weight"], Leaf)
    v = dense["weight"].state
    assert v.device == d and v.dtype == np.float32 and v.shape == (4, 3) and not v.numpy().any()
    assert st["layers"][1] is None
    assert st["layers"][2] == {"weight": st["layers"][2]["weight"], "running": None, "count": None}
    # the state tree has the gradient's shape
    x = tf.randn(2, 3, device=d)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), m)
    assert set(g) == set(st) and len(g["layers"]) == len(st["layers"])
    update(st, m, g)
    np.testing.assert_array_equal(m[2].running.numpy(), 0)        # non-trainable: untouched


def test_float64_and_tied_parameters():
    w = tf.tensor(np.ones((2, 2)))            # float64 stays float64
    model = {"a": w, "b": w, "c": [tf.ones(2)]}
    st = setup(Adam(), model)
    assert st["a"] is st["b"]                    # one shared Leaf, as Optimisers.jl
    assert st["a"].state[0].dtype == np.float64
    g = tf.tensor(np.full((2, 2), 0.5))
    update(st, model, {"a": g, "b": g, "c": [None]})
    assert st["a"].state[2] == 1               # the tied weight stepped once
    np.testing.assert_allclose(w.numpy(), 1 - 0.001 * 0.5 / (0.5 + 1e-8), rtol=1e-12)
    np.testing.assert_array_equal(model["c"][0].numpy(), 1)     # None: skipped
    assert st["c"][0].state[2] == 0


def test_update_checks_before_changing_anything():
    m = _mlp()
    st = setup(Descent(), m)
    before = state(m)
    x = tf.randn(5, 3)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), m)
    bad = {"layers": [g["layers"][0], {"weight": tf.zeros(3, 4), "bias": g["layers"][1]["bias"]}]}
    with pytest.raises(StructureError) as e:
        update(st, m, bad)
    assert "layers[1].weight" in str(e.value) and "(3, 4)" in str(e.value) and "(2, 4)" in str(e.value)
    for a, b in zip(tf.functor.leaves(state(m)), tf.functor.leaves(before)):
        np.testing.assert_array_equal(a, b)                        # layers[0] was not updated either
    with pytest.raises(StructureError, match="gradient has field"):
        update(st, m, {"layers": [{"weight": None, "bias": None, "oops": None}, None]})
    with pytest.raises(StructureError, match="list of 2"):
        update(st, m, {"layers": [None]})
    with pytest.raises(TypeError, match="setup"):
        update(Descent(), m, g)
    with pytest.raises(StructureError, match="setup"):
        update(setup(Descent(), _mlp()), tf.Chain(tf.Dense(3, 4)), {"layers": [g["layers"][0]]})


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_device_errors_and_moving_state():
    d = tf.CUDADevice(0)
    m = _mlp(d)
    st = setup(Adam(), m)
    x = tf.randn(5, 3)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), _mlp())           # a CPU gradient for a GPU model
    with pytest.raises(DeviceMismatchError) as e:
        update(st, m, g)
    assert "layers[0].weight" in str(e.value) and "CPUDevice()" in str(e.value) and "CUDADevice(0)" in str(e.value)
    # state set up on the CPU, model moved afterwards: a clear error, and gpu(opt_state) fixes it
    m_cpu = _mlp()
    st_cpu = setup(Adam(), m_cpu)
    m_gpu = d(m_cpu)
    (gg,) = tf.gradient(lambda mm: mm(d(x)).sum(), m_gpu)
    with pytest.raises(DeviceMismatchError, match="moved after `setup`"):
        update(st_cpu, m_gpu, gg)
    st_gpu = d(st_cpu)
    assert isinstance(st_gpu["layers"][0]["weight"], Leaf)
    assert st_gpu["layers"][0]["weight"].state[0].device == d
    assert tf.get_device(st_gpu) == d
    update(st_gpu, m_gpu, gg)
    assert st_gpu["layers"][0]["weight"].state[2] == 1


def test_adjust():
    m = _mlp()
    st = setup(Adam(0.01), m)
    adjust(st, 0.5)
    assert st["layers"][1]["bias"].rule == Adam(0.5)
    adjust(st, beta=(0.8, 0.9))
    assert st["layers"][0]["weight"].rule == Adam(0.5, (0.8, 0.9))
    with pytest.raises(TypeError, match="rho"):
        adjust(st, rho=0.3)
    p = tf.ones(3)
    s = setup(Descent(1.0), p)
    adjust(s, eta=0.25)
    update(s, p, tf.ones(3))
    np.testing.assert_allclose(p.numpy(), 0.75)


INF, NAN = float("inf"), float("nan")
BAD_HYPERPARAMETERS = [
    (lambda: Adam(1e-3, (0.9, 1.5)), r"Adam: beta\[1\] \(β2\) must be in \[0, 1\), got 1.5"),
    (lambda: Adam(1e-3, (1.0, 0.999)), r"Adam: beta\[0\] \(β1\) must be in \[0, 1\), got 1.0"),
    (lambda: Adam(beta=0.9), r"Adam: beta must be a pair \(β1, β2\) of numbers in \[0, 1\), e.g. \(0.9, 0.999\), "
                             r"got 0.9"),
    (lambda: Adam(-1.0), r"Adam: eta \(the learning rate\) must be finite and >= 0, got -1.0"),
    (lambda: Adam("0.1"), r"Adam: eta \(the learning rate\) must be a real number, got '0.1'"),
    (lambda: Adam(epsilon=0), r"Adam: epsilon must be finite and > 0, got 0.0"),
    (lambda: Descent(INF), r"Descent: eta \(the learning rate\) must be finite and >= 0, got inf"),
    (lambda: Momentum(0.01, NAN), r"Momentum: rho \(the momentum\) must be in \[0, 1\), got nan"),
    (lambda: Nesterov(rho=1), r"Nesterov: rho \(the momentum\) must be in \[0, 1\), got 1.0"),
    (lambda: RMSProp(rho=1.5), r"RMSProp: rho must be in \[0, 1\), got 1.5"),
    (lambda: RMSProp(epsilon=INF), r"RMSProp: epsilon must be finite and > 0, got inf"),
    (lambda: AdamW(lambd=NAN), r"AdamW: lambd \(the weight decay\) must be finite and >= 0, got nan"),
    (lambda: AdamW(couple="no"), r"AdamW: couple must be True or False, got 'no'"),
    (lambda: MixedPrecision(Adam(), growth_interval=2.5), r"MixedPrecision: growth_interval must be a whole number "
                                                          r">= 1, got 2.5"),
    (lambda: MixedPrecision(Adam(), backoff_factor=0), r"MixedPrecision: backoff_factor must be in \(0, 1\], got 0.0"),
    (lambda: MixedPrecision(Adam(), loss_scale=-2), r"MixedPrecision: loss_scale must be finite and > 0, got -2.0"),
    (lambda: Adam().replace(beta=(0.9, NAN)), r"Adam: beta\[1\] \(β2\) must be in \[0, 1\), got nan"),
    (lambda: rule_from_dict({"Adam": {"eta": 1e-3, "beta": np.array([1.0, 0.999])}}),
     r"Adam: beta\[0\] \(β1\) must be in \[0, 1\), got 1.0"),
]


@pytest.mark.parametrize("make,text", BAD_HYPERPARAMETERS, ids=range(len(BAD_HYPERPARAMETERS)))
def test_hyperparameters_are_checked(make, text):
    with pytest.raises(ArgumentError, match=text):
        make()


def test_adjust_with_a_bad_value_changes_nothing():
    m = _mlp()
    st = setup(Adam(0.01), m)
    update(st, m, tf.gradient(lambda mm: mm(tf.ones(2, 3)).sum(), m)[0])
    before = repr(state(st))
    with pytest.raises(ArgumentError, match=r"Adam: beta\[0\] \(β1\) must be in \[0, 1\), got 2.0"):
        adjust(st, beta=(2, 2))
    with pytest.raises(TypeError, match="no rule in this optimiser state has hyperparameter"):
        adjust(st, 0.5, rho=0.3)                     # eta is valid, rho unknown: neither is applied
    assert repr(state(st)) == before and st["layers"][0]["weight"].rule == Adam(0.01)


def test_loading_a_saved_rule_checks_it():
    m = _mlp()
    saved = state(setup(Adam(), m))
    saved["layers"][0]["weight"]["rule"]["Adam"]["beta"] = [1.0, 0.999]
    with pytest.raises(ValueError, match=r"Adam: beta\[0\] \(β1\) must be in \[0, 1\), got 1.0"):
        loadmodel(setup(Adam(), m), saved)
    with pytest.raises(StructureError, match=r"a saved Adam rule with unknown hyperparameter\(s\) \['rho'\]; "
                                             r"Adam has \['eta', 'beta', 'epsilon'\]"):
        rule_from_dict({"Adam": {"eta": 1e-3, "rho": 0.9}})


def test_trainables():
    tied = tf.Dense(3, 3)
    bn = tf.BatchNorm(3)
    model = {"net": tf.Chain(tied, bn, WithBuffer(), tied), "extra": [tf.ones(2)]}
    ps = trainables(model)
    expected = [tied.weight, tied.bias, bn.weight, bn.bias, model["net"][2].weight, model["extra"][0]]
    assert len(ps) == len(expected) and all(p is e for p, e in zip(ps, expected))
    assert sum(p.size for p in ps) == 12 + 6 + 4 + 2
    assert tf.trainables(tf.relu) == [] and tf.trainables(tied.weight) == [tied.weight]


# --- all parameters of a dtype in one launch -------------------------------------------------------------

ALL_RULES = [Descent(0.1), Momentum(), Nesterov(), RMSProp(), Adam(), AdamW(0.01, (0.9, 0.999), 0.1),
             AdamW(0.01, (0.9, 0.999), 0.1, couple=False)]


def _many_parameters(d, seed=0):
    """Twelve Dense layers (24 float32 parameters) and a float64 parameter
    beside them, and a gradient for each parameter."""
    tf.seed(seed)
    widths = [3, 4, 5, 2] * 3 + [3]
    model = d({"net": tf.Chain(*[tf.Dense(a, b) for a, b in zip(widths, widths[1:])]),
               "scale": tf.tensor(np.ones(3))})
    rng = np.random.default_rng(seed)

    def gradient(x):
        if isinstance(x, tf.Tensor):
            return tf.tensor(rng.standard_normal(x.shape).astype(x.dtype), device=d)
        if isinstance(x, Layer):
            return {name: gradient(v) for name, v in tf.functor.children(x).items()
                    if name not in type(x)._nontrainable}
        if isinstance(x, (list, tuple)):
            return [gradient(v) for v in x]
        if isinstance(x, dict):
            return {k: gradient(v) for k, v in x.items()}
        return None
    return model, gradient(model)


@pytest.mark.parametrize("rule", ALL_RULES, ids=repr)
def test_update_launches_once_per_rule_and_dtype(monkeypatch, rule):
    """Dozens of float32 parameters and one float64 parameter: two launches."""
    from triflux.triton_kernels import launch
    d = device("cuda")
    model, g = _many_parameters(d)
    st = setup(rule, model)
    kernels = []
    real = launch.launch
    monkeypatch.setattr(launch, "launch", lambda kernel, *a, **m: kernels.append(kernel) or real(kernel, *a, **m))
    update(st, model, g)
    assert len(_parameters(st, model, g)) == 25
    assert len(kernels) == 2 and kernels[0] is kernels[1], [getattr(k, "__name__", k) for k in kernels]


def _parameters(st, model, g):
    from triflux.optimise import _collect
    return _collect(st, model, g)


#: every rule on the CPU; on the device (slow in the interpreter) the three kinds of kernel
#: call: with a state, with a step count, and AdamW's two calls at eta = 0
_TOGETHER = ([pytest.param("cpu", rule, id=f"cpu-{rule!r}")
              for rule in ALL_RULES + [AdamW(0.0, (0.9, 0.999), 0.1, couple=False)]]
             + [pytest.param("cuda", rule, id=f"cuda-{rule!r}", marks=DEVICES[1].marks)
                for rule in (Momentum(), Adam(), AdamW(0.0, (0.9, 0.999), 0.1, couple=False))])


@pytest.mark.parametrize("dev,rule", _TOGETHER)
def test_update_together_is_one_parameter_at_a_time_bit_for_bit(dev, rule):
    """``update`` (one launch per dtype) against each parameter stepped alone
    (a launch each), two steps: the same bits, parameters and states."""
    d = device(dev)
    together, g = _many_parameters(d)
    alone, _ = _many_parameters(d)
    st_together, st_alone = setup(rule, together), setup(rule, alone)
    for _ in range(2):
        update(st_together, together, g)
        for leaf, x, gx in _parameters(st_alone, alone, g):
            leaf.state = leaf.rule.step(x, gx, leaf.state)
    for a, b in zip(tf.functor.leaves(state(together)) + tf.functor.leaves(state(st_together)),
                    tf.functor.leaves(state(alone)) + tf.functor.leaves(state(st_alone))):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_rule_steps_of_different_counts_go_in_separate_launches():
    """Adam's bias corrections depend on each parameter's own step count."""
    a, b = tf.ones(3), tf.ones(3)
    st = setup(Adam(0.1), {"a": a, "b": b})
    update(st, {"a": a, "b": b}, {"a": tf.ones(3), "b": None})
    update(st, {"a": a, "b": b}, {"a": tf.ones(3), "b": tf.ones(3)})
    assert st["a"].state[2] == 2 and st["b"].state[2] == 1
    np.testing.assert_array_equal(b.numpy(), np.float32(1) - np.float32(0.1) * np.float32(1 / (1 + 1e-8)))
    assert (a.numpy() < b.numpy()).all()


# --- train -----------------------------------------------------------------------------------------------

def _data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 3)).astype(np.float32)
    y = losses.onehotbatch((x[:, 0] > 0).astype(int), 2).numpy()
    return [(x[i:i + 4], y[i:i + 4]) for i in range(0, 12, 4)]


def _lossfn(m, x, y):
    return losses.logitcrossentropy(m(x), y)


def test_train_same_on_cpu_and_cuda():
    results = {}
    for dev in ("cpu", "cuda"):
        if dev == "cuda" and not tf.functional("CUDA"):
            continue
        d = device(dev)
        m = _mlp(d)
        st = setup(Adam(0.05), m)
        data = [(d(x), d(y)) for x, y in _data()[:2]]
        ls = train(_lossfn, m, data, st)
        assert len(ls) == 2 and all(isinstance(v, float) for v in ls)
        ls2 = train(_lossfn, m, data[:1], st)
        assert ls2[0] < ls[0]
        results[dev] = (ls + ls2, state(m))
    if "cuda" in results:
        np.testing.assert_allclose(results["cuda"][0], results["cpu"][0], rtol=1e-4, atol=1e-6)
        for a, b in zip(tf.functor.leaves(results["cuda"][1]), tf.functor.leaves(results["cpu"][1])):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_train_single_array_batches_and_progress():
    p = tf.tensor(np.array([3.0, -2.0], np.float32))
    st = setup(Descent(0.25), p)
    import contextlib
    import importlib.util
    no_tqdm = importlib.util.find_spec("tqdm") is None
    with pytest.warns(UserWarning, match="tqdm") if no_tqdm else contextlib.nullcontext():
        ls = train(lambda w, target: ((w - target) * (w - target)).sum(), p,
                   [np.zeros(2, np.float32)] * 3, st, progress=True)
    assert ls[0] == pytest.approx(13.0)
    np.testing.assert_allclose(p.numpy(), np.array([3.0, -2.0]) * 0.5 ** 3)
    with pytest.raises(TypeError, match="setup"):
        train(_lossfn, _mlp(), _data(), Adam())


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("dev", DEVICES)
def test_train_stops_on_nan_leaving_model_intact(dev):
    d = device(dev)
    data = [(d(x), d(y)) for x, y in _data()[:2]]
    bad_x = data[1][0].numpy()
    bad_x[2, 1] = np.nan
    data[1] = (d(bad_x), data[1][1])
    m = _mlp(d)
    st = setup(Momentum(0.1), m)
    ref = _mlp()                                       # what one good batch does (on the CPU)
    train(_lossfn, ref, [tuple(tf.cpu(b)) for b in data[:1]], setup(Momentum(0.1), ref))
    with pytest.raises(NonFiniteError) as e:
        train(_lossfn, m, data, st)
    msg = str(e.value)
    assert "batch 1" in msg and "nan" in msg.lower()
    for a, b in zip(tf.functor.leaves(state(m)), tf.functor.leaves(state(ref))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert st["layers"][0]["weight"].state.numpy().any()          # the good batch did update


def test_train_stops_on_inf_at_the_first_batch():
    m = _mlp()
    before = state(m)
    with pytest.raises(NonFiniteError, match="inf on batch 0"):
        train(lambda mm, x, y: _lossfn(mm, x, y) + float("inf"), m, _data(), setup(Adam(), m))
    for a, b in zip(tf.functor.leaves(state(m)), tf.functor.leaves(before)):
        np.testing.assert_array_equal(a, b)


def test_resume_exactly_through_state():
    """Training interrupted, its model and optimiser state saved as plain data
    and loaded into fresh objects, continues exactly as uninterrupted."""
    data = _data()
    m = _mlp()
    st = setup(Adam(0.05), m)
    train(_lossfn, m, data[:2], st)
    saved_m, saved_st = state(m), state(st)
    train(_lossfn, m, data[2:], st)
    m2 = _mlp(seed=7)
    st2 = setup(Adam(), m2)
    loadmodel(m2, saved_m)
    loadmodel(st2, saved_st)
    assert st2["layers"][0]["weight"].rule == Adam(0.05)
    assert st2["layers"][0]["weight"].state[2] == 2
    train(_lossfn, m2, data[2:], st2)
    for a, b in zip(tf.functor.leaves(state(m2)), tf.functor.leaves(state(m))):
        np.testing.assert_array_equal(a, b)
