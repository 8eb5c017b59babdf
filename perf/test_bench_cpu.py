"""CPU benchmarks: triflux's reference path against torch on the CPU, in the
same run. Groups pair the two sides; `perf/report.py` turns the JSON into
the ratios recorded in perf/RESULTS.md.

    .venv/bin/python -m pytest perf --benchmark-only --benchmark-json=perf/cpu.json
    .venv/bin/python perf/report.py perf/cpu.json
"""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise

torch = pytest.importorskip("torch")

MLP = dict(batch=128, sizes=(784, 256, 256, 10))


# --- per-op dispatch overhead: a tiny add, where only overhead matters ------------------

@pytest.mark.benchmark(group="op-overhead: add of two (4,) float32")
def test_overhead_triflux(benchmark):
    a, b = tf.ones(4), tf.ones(4)
    benchmark(lambda: a + b)


@pytest.mark.benchmark(group="op-overhead: add of two (4,) float32")
def test_overhead_numpy(benchmark):
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    benchmark(lambda: a + b)


@pytest.mark.benchmark(group="op-overhead: add of two (4,) float32")
def test_overhead_torch(benchmark):
    a, b = torch.ones(4), torch.ones(4)
    benchmark(lambda: a + b)


@pytest.mark.benchmark(group="op-overhead: recorded under gradient, (4,) float32")
def test_overhead_grad_triflux(benchmark):
    a = tf.ones(4)
    benchmark(lambda: tf.gradient(lambda a: (a * a).sum(), a))


@pytest.mark.benchmark(group="op-overhead: recorded under gradient, (4,) float32")
def test_overhead_grad_torch(benchmark):
    a = torch.ones(4, requires_grad=True)

    def step():
        a.grad = None
        (a * a).sum().backward()
    benchmark(step)


# --- an MLP training step: forward, backward, Adam --------------------------------------

def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((MLP["batch"], MLP["sizes"][0])).astype(np.float32)
    y = np.eye(MLP["sizes"][-1], dtype=np.float32)[rng.integers(0, MLP["sizes"][-1], MLP["batch"])]
    return x, y


def triflux_mlp_step():
    """A closure running one triflux training step of the MLP."""
    x, y = _data()
    s = MLP["sizes"]
    model = tf.Chain(tf.Dense(s[0], s[1], tf.relu), tf.Dense(s[1], s[2], tf.relu), tf.Dense(s[2], s[3]))
    opt = optimise.setup(optimise.Adam(1e-3), model)
    xt, yt = tf.tensor(x), tf.tensor(y)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(xt), yt), model)
        optimise.update(opt, model, g)
    return step


def torch_mlp_step():
    """A closure running one torch training step of the same MLP."""
    x, y = _data()
    s = MLP["sizes"]
    model = torch.nn.Sequential(torch.nn.Linear(s[0], s[1]), torch.nn.ReLU(), torch.nn.Linear(s[1], s[2]),
                                torch.nn.ReLU(), torch.nn.Linear(s[2], s[3]))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


@pytest.mark.benchmark(group="mlp-step: 784-256-256-10 relu, batch 128, Adam, float32")
def test_mlp_step_triflux(benchmark):
    benchmark(triflux_mlp_step())


@pytest.mark.benchmark(group="mlp-step: 784-256-256-10 relu, batch 128, Adam, float32")
def test_mlp_step_torch(benchmark):
    benchmark(torch_mlp_step())
