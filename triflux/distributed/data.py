"""``DistributedDataContainer``: this worker's shard of a data set, itself a
data container (Flux's ``DistributedUtils.DistributedDataContainer``)."""
import math

import numpy as np

from .. import ops
from ..data import DataLoader, is_data_container, rebuild, count_observations
from ..tensor import Tensor
from .backends import as_backend

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


def local_rows(index, n, who):
    """``index`` into ``n`` observations as an int (negative ones counted
    from the end), a slice, or a 1-d int array (from a list, range, int
    array or Tensor, or a boolean mask of length ``n``); ``IndexError`` when
    out of range, ``TypeError`` for anything else."""
    if isinstance(index, slice):
        return index
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"{who}: observation {i} of {n}")
        return i % n
    rows = index.numpy() if isinstance(index, Tensor) else np.asarray(index)
    if rows.dtype == np.bool_ and rows.shape == (n,):
        return np.flatnonzero(rows)
    if rows.ndim != 1 or not (rows.dtype.kind in "iu" or rows.size == 0):
        raise TypeError(f"{who}: index with an int, a slice, or a 1-d array of ints (or a boolean mask of "
                        f"length {n}); got {type(index).__name__}"
                        + (f" of {rows.dtype} with shape {rows.shape}" if hasattr(rows, "dtype") else ""))
    rows = rows.astype(np.intp)
    bad = (rows < -n) | (rows >= n)
    if bad.any():
        raise IndexError(f"{who}: observation {int(rows[bad][0])} of {n}")
    return np.where(rows < 0, rows + n, rows)


class _ContainerShard:
    """Observations ``lo:hi`` of a data container, itself a data container:
    ``shard[i]`` is ``container[lo + i]`` (an int, slice or index array)."""

    def __init__(self, container, lo, hi):
        self.container, self.lo, self.hi = container, lo, hi

    def __len__(self):
        return self.hi - self.lo

    def __getitem__(self, index):
        rows = local_rows(index, len(self), type(self.container).__name__)
        if isinstance(rows, slice):
            rows = np.arange(len(self))[rows]
        return self.container[self.lo + rows]

    def __repr__(self):
        return f"{type(self.container).__name__}[{self.lo}:{self.hi}]"


def _take(x, rows):
    """Observations ``rows`` (an int, slice or int array) of the array,
    Tensor or container ``x``; Tensors stay on their device."""
    if not isinstance(x, Tensor) or isinstance(rows, (int, slice)):
        return x[rows]
    if x.device.is_cpu:
        return Tensor._from_numpy(x._data[rows])
    # on a device: one slice per run of consecutive rows, joined
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(rows, cuts) if len(r)]
    parts = [x[lo:hi] for lo, hi in runs] or [x[0:0]]
    return parts[0] if len(parts) == 1 else ops.concat(parts, axis=0)


def _summary(x):
    """``float32[8, 3]`` for an array, ``Tensor float32[8, 3] on ...`` for a
    Tensor, ``MyDataset[0:8]`` for a container's shard."""
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_summary(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (tuple, list)):
        inner = ", ".join(_summary(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, _ContainerShard):
        return repr(x)
    shape = ", ".join(str(s) for s in x.shape)
    if isinstance(x, Tensor):
        return f"Tensor {x.dtype}[{shape}] on {x.device!r}"
    return f"{getattr(x, 'dtype', type(x).__name__)}[{shape}]"


class DistributedDataContainer:
    """The part of ``data`` this worker trains on (Flux's
    ``DistributedUtils.DistributedDataContainer``). ``data`` is what
    :class:`~triflux.DataLoader` takes: an array or Tensor, a data container
    (``__len__`` and ``__getitem__``), or a tuple/list/dict of them,
    observations along the first axis. Worker ``r`` of ``n`` gets the
    ``r``-th block of ``ceil(N / n)`` observations (``N`` in all); the last
    blocks may be shorter (or empty) when ``N`` is not a multiple of ``n``.

    It is a data container itself: ``len(container)`` is the number of local
    observations; ``container[i]`` (an int) is the ``i``-th of them,
    ``container[a:b]`` and ``container[indices]`` (an int array or list, or
    a boolean mask) a batch, with ``data``'s structure (lists become tuples)
    and Tensors on their device; iterating gives the observations one by one.
    ``DataLoader(container, batchsize, shuffle=...)`` (as in Flux) iterates
    over it in batches, reading the arrays of the shard directly.
    ``container.data`` is the local shard (``data``'s structure; slices,
    no copies), ``container.indices`` its range in ``data``.

    Every worker must take the same number of optimiser steps (each one is
    a collective): with ``DataLoader(container, batchsize)`` that holds when
    ``N`` is a multiple of ``n * batchsize``, or with ``partial=False`` when
    every shard holds the same number of full batches."""

    def __init__(self, backend, data):
        b = as_backend(backend, "DistributedDataContainer")
        self.nobs_total = count_observations(data, "DistributedDataContainer")
        self.rank, self.workers = b.rank, b.world_size
        lo, hi = shard_range(self.nobs_total, self.workers, self.rank)
        self.indices = range(lo, hi)
        self.parent = data
        self.data = rebuild(data, lambda x: _ContainerShard(x, lo, hi) if is_data_container(x) else x[lo:hi])
        if isinstance(data, list):
            self.data = list(self.data)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        rows = local_rows(index, len(self), f"DistributedDataContainer (rank {self.rank} of {self.workers})")
        return rebuild(self.data, lambda x: _take(x, rows))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _dataloader_arrays(self):
        """What a DataLoader reads: the shard's arrays (see triflux.data)."""
        return self.data

    def loader(self, batchsize=1, **kw):
        """``DataLoader(container, batchsize, **kw)``."""
        return DataLoader(self, batchsize=batchsize, **kw)

    def __repr__(self):
        return (f"DistributedDataContainer(rank {self.rank} of {self.workers}: observations "
                f"{self.indices.start}:{self.indices.stop} of {self.nobs_total}; {_summary(self.data)})")
