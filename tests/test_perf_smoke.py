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
    from triflux import benchmarks as workloads
    workloads.BUILDERS["mlp", side](dict(batch=4, sizes=(6, 5, 5, 3)))()
    workloads.BUILDERS["unet", side](TINY_UNET)()
    workloads.BUILDERS["rnn_seed", side]()()
    workloads.BUILDERS["lstm_large", side](dict(workloads.LSTM_LARGE, batch=2, length=3, inputs=2, hidden=3))()


def test_torch_unet_is_triflux_unet():
    """Same architecture: the same parameter shapes in the same order."""
    pytest.importorskip("torch")
    import triflux as tf
    from triflux import benchmarks as workloads
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
    r = run_python("import sys; from triflux.benchmarks import main, QUICK; import triflux.benchmarks as b; "
                   "b.QUICK = (('tiny mlp', 'mlp', dict(batch=4, sizes=(6, 5, 5, 3))),); sys.exit(main(['--reps', '1']))")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| tiny mlp")]
    assert len(rows) == 1 and rows[0].rstrip().endswith("x |")
    bad = run_python("import sys; from triflux.benchmarks import main; sys.exit(main(['--reps', '0']))")
    assert bad.returncode == 2 and "--reps must be positive" in bad.stderr
