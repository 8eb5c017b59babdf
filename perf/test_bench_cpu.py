"""CPU benchmarks: triflux's reference path against torch on the CPU, in the
same run. Groups pair the two sides; `perf/report.py` turns the JSON into
the ratios recorded in perf/RESULTS.md.

    .venv/bin/python -m pytest perf --benchmark-only --benchmark-json=perf/cpu.json
    .venv/bin/python perf/report.py perf/cpu.json
"""
import numpy as np
import pytest

import triflux as tf

from triflux.workbench.benchmarks import torch_mlp_step, torch_unet_step, triflux_mlp_step, triflux_unet_step

torch = pytest.importorskip("torch")


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


# --- training steps: forward, backward, Adam (triflux/workbench/benchmarks.py builds both)

@pytest.mark.benchmark(group="mlp-step: 784-256-256-10 relu, batch 128, Adam, float32")
def test_mlp_step_triflux(benchmark):
    benchmark(triflux_mlp_step())


@pytest.mark.benchmark(group="mlp-step: 784-256-256-10 relu, batch 128, Adam, float32")
def test_mlp_step_torch(benchmark):
    benchmark(torch_mlp_step())


UNET_GROUP = "unet-step: UNet(3, 2) depth 4, base 64, batch 4, 64x64, Adam, float32"


@pytest.mark.benchmark(group=UNET_GROUP)
def test_unet_step_triflux(benchmark):
    benchmark.pedantic(triflux_unet_step(), rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group=UNET_GROUP)
def test_unet_step_torch(benchmark):
    benchmark.pedantic(torch_unet_step(), rounds=5, warmup_rounds=1)
