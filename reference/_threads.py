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
import functools
import os
import queue
import threading


@functools.cache
def _blas_libraries():
    """(get, set) of the thread count of each BLAS library NumPy has loaded
    (threadpoolctl finds them): OpenBLAS's own C functions where threadpoolctl
    has them (~0.3 us a call against ~5 us through its checks: every
    ``in_parallel`` reads and sets them), its methods otherwise."""
    from threadpoolctl import ThreadpoolController
    libraries = []
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        symbol = getattr(lib, "_get_symbol", lambda name: None)
        get, set_ = symbol("openblas_get_num_threads"), symbol("openblas_set_num_threads")
        direct = lib.internal_api == "openblas" and lib.threading_layer == "pthreads" and get and set_
        libraries.append((get, set_) if direct else (lib.get_num_threads, lib.set_num_threads))
    return libraries


def _work(inbox):
    """A worker thread's loop: run each chunk it is handed, and send back its
    results or the error it raised."""
    while True:
        fn, chunk, outbox = inbox.get()
        _STATE.inside.active = True
        try:
            answer = (True, [fn(item) for item in chunk])
        except BaseException as error:     # re-raised in the caller's thread
            answer = (False, error)
        finally:
            _STATE.inside.active = False
        del fn, chunk                       # hold no array of the call once it is answered
        outbox.put(answer)
        del outbox, answer


class _State:
    """The worker threads (started on first use, each with its inbox: a
    ``queue.SimpleQueue``, the cheapest hand-over the standard library has)
    and, while ``in_parallel`` sections run (several user threads may call),
    the BLAS setting to restore after the last of them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inboxes = []
        self.sections = 0
        self.saved = []
        self.inside = threading.local()      # .active: this thread runs an in_parallel chunk

    def blas_threads(self):
        """The BLAS libraries' thread count outside the sections (1 with none found)."""
        counts = self.saved if self.sections else [get() for get, _ in _blas_libraries()]
        return max((count or 1 for count in counts), default=1)

    def enter(self, workers):
        """BLAS on one thread per caller; the inboxes of ``workers - 1`` worker threads."""
        with self.lock:
            if self.sections == 0:
                self.saved = [get() for get, _ in _blas_libraries()]
                for _, set_ in _blas_libraries():
                    set_(1)
            self.sections += 1
            while len(self.inboxes) < workers - 1:
                inbox = queue.SimpleQueue()
                threading.Thread(target=_work, args=(inbox,), name="triflux-reference", daemon=True).start()
                self.inboxes.append(inbox)
            return self.inboxes[:workers - 1]

    def leave(self):
        with self.lock:
            self.sections -= 1
            if self.sections == 0:
                for (_, set_), count in zip(_blas_libraries(), self.saved):
                    set_(count)


_STATE = _State()
# a forked child has none of the parent's threads: it starts its own
os.register_at_fork(after_in_child=lambda: _STATE.__init__())


def thread_count():
    """The threads the reference runs on: the BLAS libraries' setting, or 1
    inside ``in_parallel``."""
    return 1 if getattr(_STATE.inside, "active", False) else _STATE.blas_threads()


#: work over fewer values than this stays on the calling thread: a hand-over (~30 us)
#: would cost more than the second core saves (max-pool backward over 32K values:
#: 191 us on one thread, 300 on two; BatchNorm over 256K: 1.56 -> 1.17 ms on two)
PARALLEL_VALUES = 1 << 18


def slices_per_thread(n, values):
    """0 ... n - 1 cut into one slice of consecutive indices per thread (fewer
    for n below the thread count), for ``in_parallel`` over work on ``values``
    values in all: a single slice below ``PARALLEL_VALUES``."""
    parts = max(1, min(n, thread_count() if values >= PARALLEL_VALUES else 1))
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
    bounds = [len(items) * k // workers for k in range(workers + 1)]
    chunks = [items[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    outboxes = [queue.SimpleQueue() for _ in chunks[1:]]
    for inbox, chunk, outbox in zip(_STATE.enter(workers), chunks[1:], outboxes):
        inbox.put((fn, chunk, outbox))
    try:
        _STATE.inside.active = True
        try:
            results = [fn(item) for item in chunks[0]]
        finally:
            _STATE.inside.active = False
            answers = [outbox.get() for outbox in outboxes]    # no thread still writing when an error propagates
    finally:
        _STATE.leave()
    for ok, answer in answers:
        if not ok:
            raise answer
        results += answer
    return results
