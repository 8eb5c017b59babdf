"""Independent pieces of one reference computation run on every core at once.

NumPy runs each call on one core; only OpenBLAS's products use the others.
A loop of independent iterations (a convolution over groups of samples: im2col,
a product, col2im) then keeps a core idle for everything but the products, and
OpenBLAS's threads spin between them. ``in_parallel`` runs the iterations
themselves on the cores instead, each product with one BLAS thread:

    in_parallel(fn, items) == [fn(item) for item in items]

(the results in the items' order). Each item is computed as in the loop, so
the results do not depend on how many threads ran them. The number of threads
is the BLAS library's own setting (``OPENBLAS_NUM_THREADS``, threadpoolctl's
``threadpool_limits``), read at each call: limit NumPy to one thread and the
reference uses one too.
"""
import functools
import threading
from concurrent.futures import ThreadPoolExecutor, wait


@functools.cache
def _blas_libraries():
    """threadpoolctl's controllers of the BLAS libraries NumPy has loaded."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas").lib_controllers


def thread_count():
    """The threads ``in_parallel`` runs on: the BLAS libraries' setting (1 with
    none found), or 1 inside ``in_parallel`` itself."""
    if getattr(_POOL.inside, "active", False):
        return 1
    return max((lib.get_num_threads() or 1 for lib in _blas_libraries()), default=1)


def slices_per_thread(n):
    """0 ... n - 1 cut into one slice of consecutive indices per thread (fewer
    for n below the thread count), for ``in_parallel``."""
    parts = max(1, min(n, thread_count()))
    return [slice(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


class _Pool:
    """The worker threads (created on first use) and the BLAS setting to
    restore once no parallel section is running."""

    def __init__(self):
        self.lock = threading.Lock()
        self.executor = None
        self.running = 0          # parallel sections now running (several user threads may call)
        self.saved = None         # the BLAS libraries' thread counts before the first of them
        self.inside = threading.local()

    def enter(self, workers):
        with self.lock:
            if self.executor is None or self.executor._max_workers < workers - 1:
                self.executor = ThreadPoolExecutor(workers - 1, thread_name_prefix="triflux-reference")
            if self.running == 0:
                self.saved = [lib.get_num_threads() for lib in _blas_libraries()]
                for lib in _blas_libraries():
                    lib.set_num_threads(1)
            self.running += 1
            return self.executor

    def leave(self):
        with self.lock:
            self.running -= 1
            if self.running == 0:
                for lib, count in zip(_blas_libraries(), self.saved):
                    lib.set_num_threads(count)


_POOL = _Pool()


def in_parallel(fn, items):
    """``[fn(item) for item in items]``, the items split into as many runs of
    consecutive items as there are threads (the caller's thread takes the
    first run). Serial for a single item, a single thread, or when called
    from inside another ``in_parallel``."""
    items = list(items)
    workers = min(len(items), thread_count()) if len(items) > 1 else 1
    if workers < 2:
        return [fn(item) for item in items]

    def run(chunk):
        _POOL.inside.active = True
        try:
            return [fn(item) for item in chunk]
        finally:
            _POOL.inside.active = False

    bounds = [len(items) * k // workers for k in range(workers + 1)]
    chunks = [items[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    executor = _POOL.enter(workers)
    try:
        others = [executor.submit(run, chunk) for chunk in chunks[1:]]
        try:
            results = run(chunks[0])
        finally:
            wait(others)             # no thread still writing when an error propagates
        for future in others:
            results += future.result()
    finally:
        _POOL.leave()
    return results
