"""``DataLoader``: mini-batches over arrays, batch axis first.

``DataLoader((x, y), batchsize=32, shuffle=True)`` yields ``(x[i:j], y[i:j])``
for successive (shuffled) index ranges; a loader moved to a device
(``gpu(loader)``, ``device(loader)``) yields batches already there.

A loader on a GPU device prefetches: while the caller computes on batch k,
batch k+1 is already being copied. On a real CUDA (or ROCm) GPU the batch is
gathered straight into pinned (page-locked) host memory and copied on a
dedicated copy stream; the compute stream waits on an event recorded after
the copy before it may touch the batch, and the batch's memory is marked as
used by the compute stream (``record_stream``) so the caching allocator
cannot hand it out while kernels still read it. Under the Triton
interpreter, and on the CPU device, the next batch is simply prepared one
step ahead (the same code path, so it is tested everywhere). The loader
keeps no reference to a batch it has handed out: while the caller works on
batch k it holds batch k+1 only, and at most two batches while it stages.
"""
import numpy as np

from .errors import ShapeError


def _nobs(x, path):
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ShapeError(f"DataLoader: {path} is not an array (got {type(x).__name__}); give NumPy arrays or "
                         "Tensors (or tuples/lists/dicts of them) whose first axis indexes the observations")
    if len(shape) == 0:
        raise ShapeError(f"DataLoader: {path} has no batch axis (shape {tuple(shape)}); "
                         "give arrays whose first axis indexes the observations")
    return int(shape[0])


def _walk(data, path="data"):
    """``[(path, leaf)]`` for every array of ``data`` (nested tuples, lists, dicts)."""
    if isinstance(data, dict):
        return [item for k, v in data.items() for item in _walk(v, f"{path}[{k!r}]")]
    if isinstance(data, (tuple, list)):
        return [item for i, v in enumerate(data) for item in _walk(v, f"{path}[{i}]")]
    return [(path, data)]


def _rebuild(data, f):
    """``data``'s structure with every leaf ``x`` replaced by ``f(x)``; lists
    become tuples (a batch of ``(x, y)`` splats into ``loss(model, x, y)``)."""
    if isinstance(data, dict):
        return type(data)((k, _rebuild(v, f)) for k, v in data.items())
    if isinstance(data, (tuple, list)):
        items = [_rebuild(v, f) for v in data]
        return type(data)(*items) if hasattr(data, "_fields") else tuple(items)
    return f(data)


class DataLoader:
    """Iterate over ``data`` (an array, Tensor, tuple/list or dict of them,
    nested freely) in batches of ``batchsize`` along the first axis.

    ``shuffle`` reshuffles every epoch with ``rng`` (a NumPy Generator or a
    seed; the same seed gives the same order); ``partial=False`` drops a last
    batch smaller than ``batchsize``. ``len(loader)`` is the number of
    batches. Without a device, NumPy arrays give NumPy batches and Tensors
    give Tensor batches on their own device (device data is read to the host
    once per epoch). Moved to a device (``gpu(loader)``, ``device(loader)``), it
    yields batches on that device, prefetching the next one while the
    current one is used (see the module docstring).
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
        items = _walk(data)
        if not items:
            raise ShapeError("DataLoader: the data holds no arrays (an empty tuple, list or dict)")
        ns = {path: _nobs(x, path) for path, x in items}
        if len(set(ns.values())) > 1:
            detail = ", ".join(f"{p} has {n}" for p, n in ns.items())
            raise ShapeError(f"DataLoader: the arrays have different numbers of observations ({detail}); "
                             "they must agree on the first axis (the batch axis)")
        return next(iter(ns.values()))

    def __len__(self):
        full, rest = divmod(self.nobs, self.batchsize)
        return full + (1 if rest and self.partial else 0)

    # --- batches on the host ---------------------------------------------------------------
    def _host_data(self):
        """The data with every leaf as a NumPy array (device Tensors copied
        to the host once per epoch, not once per batch)."""
        from .tensor import Tensor

        def host(x):
            if isinstance(x, Tensor):
                return x._data if x.device.is_cpu else x.numpy()
            return x if isinstance(x, np.ndarray) else np.asarray(x)
        return _rebuild(self.data, host)

    def _indices(self):
        """One index selection per batch: slices without shuffling (views),
        index arrays with."""
        order = self.rng.permutation(self.nobs) if self.shuffle else None
        for k in range(len(self)):
            lo, hi = k * self.batchsize, min((k + 1) * self.batchsize, self.nobs)
            yield order[lo:hi] if order is not None else slice(lo, hi)

    @staticmethod
    def _host_batch(host, idx):
        return _rebuild(host, lambda a: a[idx])

    def __iter__(self):
        host = self._host_data()
        indices = self._indices()
        if self.device is None:
            # no device of its own: NumPy leaves give NumPy batches, Tensor
            # leaves give Tensor batches on the Tensor's device
            from .tensor import Tensor
            homes = [x.device if isinstance(x, Tensor) else None for _, x in _walk(self.data)]
            for idx in indices:
                batch = self._host_batch(host, idx)
                if any(h is not None for h in homes):
                    batch = _place(batch, homes)
                yield batch
            return
        stager = _stager_for(self.device, self._f64_to_f32)
        # One ahead: batch k+1 is staged before batch k is handed out. The
        # handed-out batch is not kept in a local (it goes from ``box`` straight
        # to the caller), so the loader holds only the next batch while the
        # caller works, and never more than two.
        box = []
        for idx in indices:
            staged = _stage(stager, host, idx)
            if box:
                yield stager.ready(box.pop())
            box.append(staged)
            del staged
        if box:
            yield stager.ready(box.pop())

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


def _stage(stager, host, idx):
    """``stager.stage(host, idx)``; running out of device (or pinned host)
    memory raises triflux's ``OutOfMemoryError`` with the batch's size."""
    try:
        return stager.stage(host, idx)
    except RuntimeError as e:
        from .triton_kernels import common
        if not common._is_oom(e):
            raise
        nbytes = sum(a[idx].nbytes if isinstance(idx, slice) else a.dtype.itemsize * len(idx) *
                     int(np.prod(a.shape[1:])) for _, a in _walk(host))
        raise common.out_of_memory(e, device=getattr(stager.device, "torch_device", None), asked=nbytes,
                                   purpose=f"a DataLoader batch of {_nrows(idx)} observations") from None


def _nrows(idx):
    return idx.stop - idx.start if isinstance(idx, slice) else len(idx)


def _place(batch, homes):
    """``batch`` with its ``k``-th leaf (in ``_walk`` order) moved to device
    ``homes[k]`` (left as NumPy where ``None``)."""
    from .tensor import Tensor, transfer
    it = iter(homes)

    def leaf(a):
        home = next(it)
        return a if home is None else transfer(Tensor._from_numpy(a), home)
    return _rebuild(batch, leaf)


# --- staging batches on a device -----------------------------------------------------------------

class _Stager:
    """Moves host batches to ``device`` one step ahead of their use: the
    generic path (CPU device, Triton interpreter), ``devices.move``'s rules."""

    def __init__(self, device, f64_to_f32):
        self.device, self.f64_to_f32 = device, f64_to_f32

    def stage(self, host, idx):
        """Start moving batch ``idx``; returns a handle for ``ready``."""
        from .devices import move
        return move(DataLoader._host_batch(host, idx), self.device, f64_to_f32=self.f64_to_f32)

    def ready(self, staged):
        """The batch, safe to use on the current stream."""
        return staged


class _CudaStager(_Stager):
    """Pinned host buffers and a dedicated copy stream (real CUDA/ROCm GPUs)."""

    def __init__(self, device, f64_to_f32):
        super().__init__(device, f64_to_f32)
        from . import backend
        self.torch = torch = backend.torch()
        self.tdev = device.torch_device
        self.stream = torch.cuda.Stream(device=self.tdev)
        self._pinned_in_flight = []   # pinned buffers of the last staged batch (kept until the next stage)

    def _leaf(self, a, idx, pinned):
        from . import dtypes as _dt
        from .tensor import Tensor
        torch = self.torch
        if self.f64_to_f32 and a.dtype == np.float64:
            dtype = np.dtype(np.float32)
        else:
            dtype = a.dtype
        bf16 = _dt.is_bfloat16(dtype)
        tdtype = torch.int16 if bf16 else _dt.to_torch(dtype)  # DTypeError for unsupported dtypes
        shape = (len(range(*idx.indices(a.shape[0]))) if isinstance(idx, slice) else len(idx),) + a.shape[1:]
        buf = torch.empty(shape, dtype=tdtype, pin_memory=True)
        view = buf.numpy()
        if bf16:
            view = view.view(dtype)
        if not isinstance(idx, slice) and a.dtype == dtype:
            np.take(a, idx, axis=0, out=view)      # gather straight into pinned memory
        else:
            view[...] = a[idx]                      # one copy (and the float64 -> float32 cast)
        pinned.append(buf)
        dev = buf.to(self.tdev, non_blocking=True)  # on the copy stream (the caller's `with`)
        if bf16:
            dev = dev.view(torch.bfloat16)
        return Tensor._make(dev, self.device)

    def stage(self, host, idx):
        torch = self.torch
        pinned = []
        with torch.cuda.stream(self.stream):
            batch = _rebuild(host, lambda a: self._leaf(a, idx, pinned))
            event = torch.cuda.Event()
            event.record(self.stream)
        # torch's pinned allocator also waits for a copy before reusing its
        # buffer; keeping the buffers of the last two batches (the one in
        # flight and the one before) is safe either way
        self._pinned_in_flight = self._pinned_in_flight[-len(pinned):] + pinned if pinned else []
        return batch, event

    def ready(self, staged):
        batch, event = staged
        torch = self.torch
        consumer = torch.cuda.current_stream(self.tdev)
        consumer.wait_event(event)   # compute on the batch starts after its copy
        for _, t in _walk(batch):
            t._data.record_stream(consumer)  # freed only after the consumer's work on it
        return batch


def _stager_for(device, f64_to_f32):
    if not device.is_cpu and getattr(device, "torch_device", None) is not None \
            and device.torch_device.type == "cuda":
        return _CudaStager(device, f64_to_f32)
    return _Stager(device, f64_to_f32)
