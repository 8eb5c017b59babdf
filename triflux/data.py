"""``DataLoader``: mini-batches over arrays, batch axis first.

``DataLoader((x, y), batchsize=32, shuffle=True)`` yields ``(x[i:j], y[i:j])``
for successive (shuffled) index ranges; a loader moved to a device
(``gpu(loader)``, ``device(loader)``) yields batches already there.
"""
import numpy as np

from .errors import ShapeError


def _nobs(x, path):
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) == 0:
        raise ShapeError(f"DataLoader: {path} has no batch axis (shape {shape}); "
                         "give arrays whose first axis indexes the observations")
    return shape[0]


class DataLoader:
    """Iterate over ``data`` (an array, Tensor, tuple/list or dict of them)
    in batches of ``batchsize`` along the first axis.

    ``shuffle`` reshuffles every epoch with ``rng`` (a NumPy Generator or a
    seed); ``partial=False`` drops a last batch smaller than ``batchsize``.
    """

    def __init__(self, data, batchsize=1, shuffle=False, partial=True, rng=None, *, device=None,
                 f64_to_f32=False):
        if int(batchsize) < 1:
            raise ValueError(f"DataLoader: batchsize must be >= 1, got {batchsize}")
        self.data = data
        self.batchsize = int(batchsize)
        self.shuffle = bool(shuffle)
        self.partial = bool(partial)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.device = device
        self._f64_to_f32 = f64_to_f32
        self.nobs = self._check(data)

    def _check(self, data):
        items = self._items(data)
        ns = {path: _nobs(x, path) for path, x in items}
        if len(set(ns.values())) > 1:
            detail = ", ".join(f"{p}: {n}" for p, n in ns.items())
            raise ShapeError(f"DataLoader: the arrays have different numbers of observations ({detail}); "
                             "they must agree on the first axis")
        return next(iter(ns.values()))

    @staticmethod
    def _items(data):
        if isinstance(data, dict):
            return [(f"data[{k!r}]", v) for k, v in data.items()]
        if isinstance(data, (tuple, list)):
            return [(f"data[{i}]", v) for i, v in enumerate(data)]
        return [("data", data)]

    def __len__(self):
        full, rest = divmod(self.nobs, self.batchsize)
        return full + (1 if rest and self.partial else 0)

    def _take(self, x, idx):
        from .tensor import Tensor
        if isinstance(x, Tensor):
            host = x.numpy() if not x.device.is_cpu else x._data
            return host[idx]
        return np.asarray(x)[idx]

    def _batch(self, idx):
        d = self.data
        if isinstance(d, dict):
            b = {k: self._take(v, idx) for k, v in d.items()}
        elif isinstance(d, (tuple, list)):
            b = tuple(self._take(v, idx) for v in d)
        else:
            b = self._take(d, idx)
        if self.device is not None:
            from .devices import move
            b = move(b, self.device, f64_to_f32=self._f64_to_f32)
        return b

    def __iter__(self):
        order = self.rng.permutation(self.nobs) if self.shuffle else np.arange(self.nobs)
        for k in range(len(self)):
            idx = order[k * self.batchsize:(k + 1) * self.batchsize]
            if not self.shuffle:
                idx = slice(int(idx[0]), int(idx[-1]) + 1) if len(idx) else slice(0, 0)
            yield self._batch(idx)

    def to(self, device, f64_to_f32=False):
        """The same loader, yielding batches on ``device``."""
        new = DataLoader.__new__(DataLoader)
        new.__dict__.update(self.__dict__)
        new.device = device
        new._f64_to_f32 = f64_to_f32
        return new

    def __repr__(self):
        dev = f", device={self.device!r}" if self.device is not None else ""
        return (f"DataLoader({self.nobs} observations, batchsize={self.batchsize}, "
                f"shuffle={self.shuffle}, partial={self.partial}{dev})  # {len(self)} batches")
