"""``DistributedDataContainer``: this worker's shard of a data set."""
import math

from ..data import DataLoader, _rebuild, _walk
from ..errors import ShapeError
from .backends import _backend

__all__ = ["DistributedDataContainer", "shard_range"]


def shard_range(n, workers, rank):
    """Observations ``[lo, hi)`` of worker ``rank`` out of ``workers`` for
    ``n`` observations: consecutive blocks of ``ceil(n / workers)`` (Flux's
    split), so the last workers may get fewer, or none when ``n`` is small."""
    if workers < 1 or not 0 <= rank < workers:
        raise ValueError(f"shard_range: rank {rank} is not in 0..{workers - 1}")
    size = math.ceil(n / workers) if n else 0
    lo = min(rank * size, n)
    return lo, min(lo + size, n)


class DistributedDataContainer:
    """The part of ``data`` this worker trains on (Flux's
    ``DistributedUtils.DistributedDataContainer``). ``data`` is what
    :class:`~triflux.DataLoader` takes: an array or Tensor, or a
    tuple/list/dict of them, observations along the first axis. Worker
    ``r`` of ``n`` gets the ``r``-th block of ``ceil(N / n)`` observations
    (``N`` in all); the last blocks may be shorter (or empty) when ``N`` is
    not a multiple of ``n``.

    ``len(container)`` is the number of local observations,
    ``container[i]`` the ``i``-th of them, ``container.data`` the local
    shard (same structure as ``data``; slices, no copies),
    ``container.indices`` its range in ``data``, and
    ``container.loader(batchsize, ...)`` (or ``DataLoader(container.data,
    ...)``) iterates over it in batches."""

    def __init__(self, backend, data):
        b = _backend(backend, "DistributedDataContainer")
        items = _walk(data)
        if not items:
            raise ShapeError("DistributedDataContainer: the data holds no arrays")
        ns = set()
        for path, x in items:
            shape = getattr(x, "shape", None)
            if not shape:
                raise ShapeError(f"DistributedDataContainer: {path} has no observation axis "
                                 f"(got {type(x).__name__} of shape {shape}); give arrays whose first axis "
                                 "indexes the observations")
            ns.add(int(shape[0]))
        if len(ns) > 1:
            raise ShapeError(f"DistributedDataContainer: the arrays have different numbers of observations "
                             f"({sorted(ns)}); they must agree on the first axis")
        self.nobs_total = ns.pop()
        self.rank, self.workers = b.rank, b.world_size
        lo, hi = shard_range(self.nobs_total, self.workers, self.rank)
        self.indices = range(lo, hi)
        self.parent = data
        self.data = _rebuild(data, lambda x: x[lo:hi])
        if isinstance(data, list):
            self.data = list(self.data)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        n = len(self.indices)
        if isinstance(i, slice):
            return _rebuild(self.data, lambda x: x[i])
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"DistributedDataContainer: observation {i} of a shard of {n}")
        i %= n
        return _rebuild(self.data, lambda x: x[i])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def loader(self, batchsize=1, **kw):
        """A :class:`~triflux.DataLoader` over this worker's shard."""
        return DataLoader(self.data, batchsize=batchsize, **kw)

    def __repr__(self):
        return (f"DistributedDataContainer(rank {self.rank} of {self.workers}: observations "
                f"{self.indices.start}:{self.indices.stop} of {self.nobs_total})")
