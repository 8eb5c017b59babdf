"""A training step on the CPU gives its memory back as it goes: it makes no
reference cycles (so its arrays are freed when the step drops them, not when
Python's garbage collector next runs), and once warm it takes no new pages
from the system (reference/_allocator.py keeps glibc's heap between steps);
``reclaim()`` returns the kept heap."""
import gc
import json
import platform

import numpy as np
import pytest

import triflux as tf
from triflux import losses

from .helpers import run_python

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _models():
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)    # noqa: E731
    return {
        "mlp": (tf.Chain(tf.Dense(12, 16, tf.relu), tf.Dropout(0.2), tf.Dense(16, 3)), f32(8, 12), f32(8, 3)),
        "conv": (tf.Chain(tf.Conv((3, 3), 2, 4, tf.relu, pad=1), tf.BatchNorm(4), tf.MaxPool((2, 2)),
                          tf.ConvTranspose((2, 2), 4, 2, stride=2)), f32(2, 2, 8, 8), f32(2, 2, 8, 8)),
        "lstm": (tf.Chain(tf.LSTM(3, 5), tf.Dense(5, 1)), f32(2, 4, 3), f32(2, 4, 1)),
        "gru": (tf.Chain(tf.GRU(3, 5), tf.Dense(5, 1)), f32(2, 4, 3), f32(2, 4, 1)),
    }


def _cycles_made_by(fn):
    """The objects ``fn()`` left in reference cycles (the collector off meanwhile)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("kind", ["mlp", "conv", "lstm", "gru"])
@pytest.mark.parametrize("how", ["withgradient", "train", "capture_step"])
def test_a_training_step_makes_no_reference_cycles(kind, how):
    model, x, y = _models()[kind]
    opt = tf.setup(tf.Adam(1e-3), model)
    loss = lambda m, x, y: losses.mse(m(x), y)      # noqa: E731
    if how == "withgradient":
        step = lambda: tf.update(opt, model, tf.withgradient(loss, model, tf.cpu(x), tf.cpu(y))[1][0])  # noqa: E731
    elif how == "train":
        step = lambda: tf.train(loss, model, [(x, y)], opt)    # noqa: E731
    else:
        captured = tf.capture_step(loss, model, opt)
        step = lambda: captured(x, y)                          # noqa: E731
    for _ in range(3):
        step()
    assert _cycles_made_by(step) == []


def _run(code, env=None):
    """The JSON value ``code`` prints last, run in a fresh Python."""
    out = run_python(code, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the heap is kept only under glibc's malloc")
def test_a_warm_step_takes_no_new_pages():
    # an LSTM whose step allocates ~7 MB: with glibc's own thresholds, 1,700 page faults a step
    faults = _run("""
        import json, resource
        from triflux.workbench.benchmarks import BUILDERS
        step = BUILDERS["lstm_large", "triflux"](dict(kind="lstm", batch=16, length=32, inputs=64, hidden=128))
        for _ in range(3):
            step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            step()
        print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5))
    """)
    assert faults < 100


_KEPT_AND_GIVEN_BACK = """
    import json, numpy as np, triflux
    from triflux.reference import _allocator
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    base = rss()
    blocks = [np.ones(1 << 18, np.float32) for _ in range(96)]     # 96 MiB of 1 MiB arrays, from the heap
    del blocks
    kept = rss() - base
    triflux.reclaim()
    print(json.dumps([_allocator.KEEPING_HEAP, kept, rss() - base]))
"""


@pytest.mark.skipif(not GLIBC, reason="the heap is kept only under glibc's malloc")
def test_the_heap_is_kept_and_reclaim_gives_it_back():
    keeping, kept, after = _run(_KEPT_AND_GIVEN_BACK)
    assert keeping
    assert kept > 64 << 20 and after < 16 << 20


@pytest.mark.skipif(not GLIBC, reason="the heap is kept only under glibc's malloc")
def test_the_users_malloc_settings_win():
    keeping, kept, _ = _run(_KEPT_AND_GIVEN_BACK, env={"MALLOC_TRIM_THRESHOLD_": str(1 << 20)})
    assert not keeping
    assert kept < 16 << 20          # glibc returned the freed arrays at once, as told
