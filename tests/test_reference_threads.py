"""The reference's threads (reference/_threads.py): ``in_parallel`` is the loop
it replaces, runs on as many threads as the BLAS library is set to, restores
that setting, and lets no worker outlive an error; the convolution and pooling
references give the same results on one thread as on two."""
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from triflux.reference import _threads, conv, pool


def _blas_threads():
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_results_in_order_and_the_loops_own():
    with threadpool_limits(2, "blas"):
        assert _threads.thread_count() == 2
        assert _threads.in_parallel(lambda i: i * i, range(7)) == [i * i for i in range(7)]
        assert _threads.in_parallel(lambda i: i, []) == []
        big = _threads.PARALLEL_VALUES
        assert _threads.slices_per_thread(5, big) == [slice(0, 2), slice(2, 5)]
        assert _threads.slices_per_thread(1, big) == [slice(0, 1)] and _threads.slices_per_thread(0, big) == [slice(0, 0)]
        assert _threads.slices_per_thread(5, big - 1) == [slice(0, 5)]      # small work stays on one thread


def test_threads_follow_the_blas_setting_and_it_is_restored():
    def names(_):
        return threading.current_thread().name

    with threadpool_limits(2, "blas"):
        seen = _threads.in_parallel(names, range(4))
        assert len(set(seen)) == 2 and seen[0] == seen[1] == threading.current_thread().name
        inside = _threads.in_parallel(lambda _: _blas_threads(), range(2))
        assert all(counts and set(counts) == {1} for counts in inside)     # one BLAS thread per worker
        assert set(_blas_threads()) == {2}
        nested = _threads.in_parallel(lambda _: _threads.in_parallel(names, range(3)), range(2))
        assert all(len(set(run)) == 1 for run in nested)                   # an inner call runs serially
    with threadpool_limits(1, "blas"):
        assert set(_threads.in_parallel(names, range(4))) == {threading.current_thread().name}


def test_an_error_waits_for_the_workers_and_restores_blas():
    finished = []

    def work(i):
        if i == 0:
            raise ValueError("item 0")
        threading.Event().wait(0.05)
        finished.append(i)

    with threadpool_limits(2, "blas"):
        with pytest.raises(ValueError, match="item 0"):
            _threads.in_parallel(work, range(2))
        assert finished == [1]                    # the worker's item was done before the error surfaced
        assert set(_blas_threads()) == {2}


@pytest.mark.parametrize("stride,padding", [((1, 1), (1, 1, 1, 1)), ((2, 1), (0, 1, 2, 0))])
def test_conv_and_pool_on_one_thread_and_on_two(stride, padding):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4, 12, 10)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = dict(stride=stride, padding=padding, activation="relu")
    runs = []
    for threads in (1, 2):
        with threadpool_limits(threads, "blas"):
            y = conv.conv_bias_act_forward(x, w, b, **attrs)
            grads = conv.conv_bias_act_backward(np.ones_like(y), y, x, w, b, **attrs)
            p = pool.maxpool_forward(x, (2, 2), (2, 2), (0, 0, 0, 0))
            runs.append((y, *grads, p, *pool.maxpool_backward(p, p, x, (2, 2), (2, 2), (0, 0, 0, 0))))
    for one, two in zip(*runs):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-5)


def _squares_on_threads():
    return _threads.thread_count(), _threads.in_parallel(lambda i: i * i, range(4))


def test_a_forked_child_starts_its_own_workers():
    import multiprocessing
    with threadpool_limits(2, "blas"):
        _threads.in_parallel(lambda i: i, range(2))          # the parent's workers are running
        with multiprocessing.get_context("fork").Pool(1) as child:
            threads, squares = child.apply_async(_squares_on_threads).get(timeout=20)
    assert squares == [0, 1, 4, 9] and threads == 2


def test_workers_hold_nothing_of_a_finished_call():
    import gc
    import weakref

    class Big:
        pass

    big = Big()
    seen = weakref.ref(big)
    with threadpool_limits(2, "blas"):
        _threads.in_parallel(lambda i, big=big: i, range(2))
    del big
    gc.collect()
    assert seen() is None


def test_batchnorm_and_pooling_above_the_threshold_bit_identical_on_two_threads():
    from triflux.reference import norm
    from triflux.reference._util import keeping_for_backward
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 4, 128, 128)).astype(np.float32)     # PARALLEL_VALUES values
    assert x.size >= _threads.PARALLEL_VALUES
    gamma, beta = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    runs = []
    for threads in (1, 2):
        with threadpool_limits(threads, "blas"), keeping_for_backward():
            moved = [np.zeros(4, np.float32), np.ones(4, np.float32)]
            y = norm.batchnorm_train_forward(x, gamma, beta, np.zeros(4, np.float32), np.ones(4, np.float32),
                                             *moved, activation="relu")
            grads = norm.batchnorm_train_backward(g, y, x, gamma, beta, activation="relu")
            p = pool.maxpool_forward(x, (2, 2), (2, 2), (0, 0, 0, 0))
            runs.append((y, *moved, *grads, *pool.maxpool_backward(g[:, :, ::2, ::2], p, x, (2, 2), (2, 2),
                                                                      (0, 0, 0, 0))))
    for one, two in zip(*runs):
        np.testing.assert_array_equal(one, two)
