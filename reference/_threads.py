"""The reference's threads: independent pieces of one computation run on
every core at once.

NumPy runs each call on one core; only OpenBLAS's products use the others.
A loop of independent iterations (a convolution over groups of samples: im2col,
a product, col2im) then keeps a core idle for everything but the products.
``in_parallel`` runs the iterations themselves on the cores instead, each
iteration's products on one BLAS thread:

    in_parallel(fn, items) == [fn(item) for item in items]

(the results in the items' order; each item computed as in the loop).

The number of threads is the BLAS library's own setting (``OPENBLAS_NUM_THREADS``,
threadpoolctl's ``threadpool_limits``), read at each call: limit NumPy to one
thread and the reference uses one too. Inside ``in_parallel`` BLAS is set to
one thread and restored after.

(Measured and not done: splitting products outside such loops over these
threads instead of OpenBLAS's. OpenBLAS's threads spin for ~0.1 s after a
large product, taking a core from two-thread work right after it, but for the
MLP's and LSTMs' products OpenBLAS's own split is 10-25% faster.)
"""
import contextlib
import functools
import threading
from concurrent.futures import ThreadPoolExecutor, wait


@functools.cache
def _blas_libraries():
    """threadpoolctl's controllers of the BLAS libraries NumPy has loaded."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas").lib_controllers


class _State:
    """The worker threads (created on first use) and, while ``in_parallel``
    sections run (several user threads may call), the BLAS setting to restore
    after the last of them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.executor = None
        self.sections = 0
        self.saved = []
        self.inside = threading.local()      # .active: this thread runs an in_parallel item

    def blas_threads(self):
        """The BLAS libraries' thread count outside the sections (1 with none found)."""
        with self.lock:
            counts = self.saved if self.sections else [lib.get_num_threads() for lib in _blas_libraries()]
        return max((count or 1 for count in counts), default=1)

    @contextlib.contextmanager
    def section(self, workers):
        """A block with BLAS on one thread per caller, and the executor of ``workers - 1`` threads."""
        with self.lock:
            if self.sections == 0:
                self.saved = [lib.get_num_threads() for lib in _blas_libraries()]
                for lib in _blas_libraries():
                    lib.set_num_threads(1)
            self.sections += 1
            if self.executor is None or self.executor._max_workers < workers - 1:
                self.executor = ThreadPoolExecutor(workers - 1, thread_name_prefix="triflux-reference")
            executor = self.executor
        try:
            yield executor
        finally:
            with self.lock:
                self.sections -= 1
                if self.sections == 0:
                    for lib, count in zip(_blas_libraries(), self.saved):
                        lib.set_num_threads(count)


_STATE = _State()


def thread_count():
    """The threads the reference runs on: the BLAS libraries' setting, or 1
    inside ``in_parallel``."""
    return 1 if getattr(_STATE.inside, "active", False) else _STATE.blas_threads()


def slices_per_thread(n):
    """0 ... n - 1 cut into one slice of consecutive indices per thread (fewer
    for n below the thread count), for ``in_parallel``."""
    parts = max(1, min(n, thread_count()))
    return [slice(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def in_parallel(fn, items):
    """``[fn(item) for item in items]``, the items split into as many runs of
    consecutive items as there are threads (the caller's thread takes the
    first run), BLAS on one thread in each. Serial for a single item, a
    single thread, or when called from inside another ``in_parallel``."""
    items = list(items)
    workers = min(len(items), thread_count())
    if workers < 2:
        return [fn(item) for item in items]

    def run(chunk):
        _STATE.inside.active = True
        try:
            return [fn(item) for item in chunk]
        finally:
            _STATE.inside.active = False

    bounds = [len(items) * k // workers for k in range(workers + 1)]
    chunks = [items[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    with _STATE.section(workers) as executor:
        others = [executor.submit(run, chunk) for chunk in chunks[1:]]
        try:
            results = run(chunks[0])
        finally:
            wait(others)             # no thread still writing when an error propagates
        for future in others:
            results += future.result()
    return results
