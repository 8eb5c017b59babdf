"""The benchmark suites stay runnable: every workload builds and steps on
both sides, and the GPU benchmark script runs end to end (tiny shapes, on
the interpreter-served CUDA device)."""
import numpy as np
import pytest

from .helpers import run_python

TINY_UNET = dict(batch=1, size=8, in_channels=3, classes=2, depth=1, base=2)


@pytest.mark.parametrize("side", ["triflux", "torch"])
def test_workloads_step(side):
    pytest.importorskip("torch")
    from triflux.workbench import benchmarks as workloads
    workloads.BUILDERS["mlp", side](dict(batch=4, sizes=(6, 5, 5, 3)))()
    workloads.BUILDERS["unet", side](TINY_UNET)()
    workloads.BUILDERS["rnn_seed", side]()()
    workloads.BUILDERS["lstm_large", side](dict(workloads.LSTM_LARGE, batch=2, length=3, inputs=2, hidden=3))()
    workloads.BUILDERS["seed_chain", side](dict(workloads.SEED_CHAIN, batch=1, size=8, widths=(2, 3)))()


def test_torch_unet_is_triflux_unet():
    """Same architecture: the same parameter shapes in the same order."""
    pytest.importorskip("torch")
    import triflux as tf
    from triflux.workbench import benchmarks as workloads
    cfg = dict(TINY_UNET, depth=2)
    ours = sorted(t.shape for t in tf.functor.leaves(tf.models.UNet(3, 2, depth=2, base_channels=2)))
    theirs = sorted(tuple(v.shape) for v in workloads.torch_unet(cfg).state_dict().values() if v.ndim > 0)
    assert ours == theirs


def test_gpu_benchmark_script_smoke():
    r = run_python("import runpy, sys; sys.argv = ['bench_gpu.py', '--smoke', '--dtypes', 'float32']; "
                   "runpy.run_path('perf/bench_gpu.py', run_name='__main__')",
                   env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "conv3x3 forward+backward" in r.stdout and "| UNet step | float32 |" in r.stdout
    ratios = [float(line.split("|")[5].strip()[:-1]) for line in r.stdout.splitlines()
              if line.startswith("| conv3x3")]
    assert ratios and all(np.isfinite(ratios))


def test_bench_command_prints_a_table():
    r = run_python("import sys; from triflux.workbench import benchmarks as b; main = b.main; "
                   "b.QUICK = (('tiny mlp', 'mlp', dict(batch=4, sizes=(6, 5, 5, 3))),); sys.exit(main(['--reps', '1']))")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| tiny mlp")]
    assert len(rows) == 1 and rows[0].rstrip().endswith("x |")
    bad = run_python("import sys; from triflux.workbench.benchmarks import main; sys.exit(main(['--reps', '0']))")
    assert bad.returncode == 2 and "--reps must be positive" in bad.stderr


def test_interleaved_prints_a_row_per_case():
    r = run_python("import runpy, sys; sys.argv = ['interleaved.py', '1', 'add_tiny']; "
                   "runpy.run_path('perf/interleaved.py', run_name='__main__')", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    row = [line for line in r.stdout.splitlines() if line.startswith("| add_tiny |")]
    assert len(row) == 1 and row[0].count("|") == 10 and "x-" in row[0]
    bad = run_python("import runpy, sys; sys.argv = ['interleaved.py', '1', 'mpl']; "
                     "runpy.run_path('perf/interleaved.py', run_name='__main__')")
    assert bad.returncode == 1 and "unknown case(s) mpl: choose from mlp," in bad.stderr


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tiled_max_pool_backward_is_the_general_rule(dtype):
    """The reference's shortcut for windows that tile the input (the first tap
    equal to the maximum takes the gradient) gives the general rule's result
    bit for bit: ties (relu's zeros), all -inf windows, a cropped edge, and
    adaptive windows that tile; NaN takes the general path."""
    from triflux.reference import pool
    from triflux.specs.pool import adaptive_pool_spec, pool_spec
    rng = np.random.default_rng(0)
    cases = [("maxpool", (2, 3, 8, 9), (2, 2)), ("maxpool", (1, 2, 9, 6), (3, 2)),
             ("adaptive_maxpool", (1, 2, 12, 12), (4, 6)), ("maxpool", (1, 2, 4, 6, 5), (2, 3, 2)),
             ("maxpool", (2, 3, 11), (3,))]
    for name, shape, attr in cases:
        x = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
        x[(0, 0) + (slice(0, 2),) * (len(shape) - 2)] = -np.inf
        if name == "maxpool":
            spec = pool_spec(name, shape, x.dtype, attr, attr, (0,) * (2 * len(attr)), None, False)
            y = pool.maxpool_forward(x, attr, attr, (0,) * (2 * len(attr)))
        else:
            spec = adaptive_pool_spec(name, shape, x.dtype, attr)
            y = pool.adaptive_maxpool_forward(x, attr)
        g = rng.standard_normal(y.shape).astype(dtype)
        assert all(pool._tile(a) for a in spec.axes)
        general = pool._max_backward_separable(g, x, pool._maps(spec))
        np.testing.assert_array_equal(pool._max_backward(g, y, x, spec), general)
        assert pool._max_backward(g, y, x, spec).dtype == x.dtype
    x = np.maximum(rng.standard_normal((1, 2, 12, 12)), 0).astype(dtype)
    x[0, 0, 0, 0] = np.nan
    spec = adaptive_pool_spec("adaptive_maxpool", x.shape, x.dtype, (4, 6))
    y = pool.adaptive_maxpool_forward(x, (4, 6))
    g = rng.standard_normal(y.shape).astype(dtype)
    np.testing.assert_array_equal(pool._max_backward(g, y, x, spec), pool._max_backward_separable(g, x, pool._maps(spec)))


def test_adam_in_cache_blocks_is_the_whole_array_update():
    """A large parameter's Adam update runs block by block (each block's passes
    in cache): the same numbers, bit for bit, as the update of its halves
    (small enough to go in one piece), and a strided parameter is updated in place."""
    from triflux.reference import optimise as ref
    n = 5 * ref._BLOCK + 7
    rng = np.random.default_rng(0)
    x, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(n)).astype(np.float32)
    hyper = dict(eta=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, step=3)
    halves = [[a[:n // 2].copy(), a[n // 2:].copy()] for a in (x, g, m, v)]
    ref.adam_update_forward(x, g, m, v, **hyper)
    for half in zip(*halves):
        ref.adam_update_forward(*half, **hyper)
    for whole, (first, second) in zip((x, g, m, v), halves):
        np.testing.assert_array_equal(whole, np.concatenate([first, second]))
    strided = np.zeros((n, 2), np.float32)[:, 0]
    ref.adamw_update_forward(strided, g, m, v, lambd=0.0, **hyper)
    assert np.count_nonzero(strided) > n // 2


def test_interleaved_before_times_another_checkout_in_the_same_rounds():
    # this checkout as its own "before": a third process per round, both ratios in one row
    r = run_python("import runpy, sys; sys.argv = ['interleaved.py', '--before', '.', '1', 'add_tiny']; "
                   "runpy.run_path('perf/interleaved.py', run_name='__main__')", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "process triples" in r.stdout and "| ratio before |" in r.stdout
    row = [line for line in r.stdout.splitlines() if line.startswith("| add_tiny |")]
    assert len(row) == 1 and row[0].count("|") == 11 and row[0].count("x-") == 2


def test_interleaved_one_thread_prints_cpu_times():
    r = run_python("import runpy, sys; sys.argv = ['interleaved.py', '--one-thread', '1', 'add_tiny']; "
                   "runpy.run_path('perf/interleaved.py', run_name='__main__')", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "one thread each side, CPU time per step" in r.stdout
    row = [line for line in r.stdout.splitlines() if line.startswith("| add_tiny |")]
    assert len(row) == 1 and row[0].count("|") == 10 and "x-" in row[0]
