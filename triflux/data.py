"""``DataLoader``: mini-batches over arrays or any data container, batch axis first.

``DataLoader((x, y), batchsize=32, shuffle=True)`` yields ``(x[i:j], y[i:j])``
for successive (shuffled) index ranges; a loader moved to a device
(``gpu(loader)``, ``device(loader)``) yields batches already there.

Data containers (MLUtils' ``numobs``/``getobs`` protocol). Besides arrays,
the data (or any entry of a tuple/list/dict of data) may be any object with
``__len__`` (the number of observations) and ``__getitem__`` taking a NumPy
array of indices and returning that batch: an array or Tensor with one
entry per index along the first axis, or a tuple/list/dict of them. The
batch is given exactly as DataLoader gives it for the equivalent arrays
(lists become tuples, a list of numbers an array, other array types such as
torch tensors NumPy arrays). A container whose ``__getitem__`` only takes
one int (a typical torch ``Dataset``), or one with torch's batched
``__getitems__(indices)`` (a list of observations), is read observation by
observation and the observations are stacked into the batch (Python floats
become float32, as in ``tensor``). A container that is a view of arrays
(``DistributedDataContainer``) hands the loader those arrays
(``_dataloader_arrays()``), which it then reads as arrays: slices without
shuffling, device data read once per epoch.

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
import numbers

import numpy as np

from . import backend, memory
from . import dtypes as _dt
from .arguments import flag_arg, int_arg, is_int
from .errors import ArgumentError, ShapeError
from .moving import move
from .tensor import Tensor, torch_to_numpy, transfer

_PROTOCOL = ("a data container needs __len__ (the number of observations) and __getitem__ that takes a NumPy "
             "array of indices and returns the batch (arrays or Tensors with one entry per index along the first "
             "axis, or tuples/lists/dicts of them), or that takes one int index and returns one observation "
             "(DataLoader then stacks the observations into the batch; it reads one index at a time when "
             "__getitem__ raises a TypeError, IndexError, KeyError or ValueError for an array of indices)")


# --- structures of arrays ------------------------------------------------------------------------

def _walk(data, path="data"):
    """``[(path, leaf)]`` for every array (or data container) of ``data``
    (nested tuples, lists, dicts)."""
    if isinstance(data, dict):
        return [item for k, v in data.items() for item in _walk(v, f"{path}[{k!r}]")]
    if isinstance(data, (tuple, list)):
        return [item for i, v in enumerate(data) for item in _walk(v, f"{path}[{i}]")]
    return [(path, data)]


def _rebuild_paths(data, f, path="data"):
    """``data``'s structure with every leaf ``x`` (at ``path``) replaced by
    ``f(x, path)``; lists become tuples (a batch of ``(x, y)`` splats into
    ``loss(model, x, y)``)."""
    if isinstance(data, dict):
        return type(data)((k, _rebuild_paths(v, f, f"{path}[{k!r}]")) for k, v in data.items())
    if isinstance(data, (tuple, list)):
        items = [_rebuild_paths(v, f, f"{path}[{i}]") for i, v in enumerate(data)]
        return type(data)(*items) if hasattr(data, "_fields") else tuple(items)
    return f(data, path)


def rebuild(data, f):
    """``data``'s structure with every leaf ``x`` replaced by ``f(x)``; lists
    become tuples."""
    return _rebuild_paths(data, lambda x, _: f(x))


def is_data_container(x):
    """Whether ``x`` is a data container: not an array (nothing with a
    ``shape``), not a str or a tuple/list/dict (structures), but
    ``len(x)`` observations read with ``x[indices]`` (or ``__getitems__``)."""
    if hasattr(x, "shape") or isinstance(x, (str, bytes, bytearray, dict, tuple, list)):
        return False
    t = type(x)
    return hasattr(t, "__len__") and (hasattr(t, "__getitem__") or hasattr(t, "__getitems__"))


def _arrays_behind(data):
    """``data`` with every container that is a view of arrays (it has
    ``_dataloader_arrays()``, as ``DistributedDataContainer``) replaced by
    those arrays; other entries and the structure stay as they are."""
    if isinstance(data, dict):
        return type(data)((k, _arrays_behind(v)) for k, v in data.items())
    if isinstance(data, (tuple, list)):
        items = [_arrays_behind(v) for v in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    view = getattr(type(data), "_dataloader_arrays", None)
    return _arrays_behind(data._dataloader_arrays()) if callable(view) else data


def _nobs(x, path, who="DataLoader"):
    if is_data_container(x):
        return len(x)
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ShapeError(f"{who}: {path} is not an array or a data container (got {type(x).__name__}); give NumPy "
                         "arrays or Tensors (or tuples/lists/dicts of them) whose first axis indexes the "
                         "observations, or an object with __len__ and __getitem__ taking an array of indices "
                         "(a data container)")
    if len(shape) == 0:
        raise ShapeError(f"{who}: {path} has no batch axis (shape {tuple(shape)}); "
                         "give arrays whose first axis indexes the observations")
    return int(shape[0])


def count_observations(data, who="DataLoader"):
    """The number of observations of ``data`` (arrays along their first
    axis, containers by ``len``), which every entry must agree on."""
    items = _walk(data)
    if not items:
        raise ShapeError(f"{who}: the data holds no arrays (an empty tuple, list or dict)")
    ns = {path: _nobs(x, path, who) for path, x in items}
    if len(set(ns.values())) > 1:
        detail = ", ".join(f"{p} has {n}" for p, n in ns.items())
        raise ShapeError(f"{who}: the arrays have different numbers of observations ({detail}); "
                         "they must agree on the first axis (the batch axis)")
    return next(iter(ns.values()))


# --- reading data containers -----------------------------------------------------------------------

def _is_number(v):
    return isinstance(v, (numbers.Number, np.bool_)) and not isinstance(v, np.ndarray)


def _numbers(values):
    """A list of numbers as an array; Python floats become float32 (as in
    ``tensor``), NumPy scalars keep their dtype."""
    arr = np.asarray(values)
    if arr.dtype == np.float64 and not any(isinstance(v, np.floating) for v in values):
        arr = arr.astype(np.float32)
    return arr


def _array(x, where):
    """``x`` as a batch leaf: a NumPy array or a Tensor as it is, another
    array type (a torch tensor, a memmap, ...) as a NumPy array."""
    if isinstance(x, (np.ndarray, Tensor)):
        return x
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return torch_to_numpy(x)
    if hasattr(x, "shape") or hasattr(x, "__array__"):
        return np.asarray(x)
    raise ShapeError(f"DataLoader: {where} is a {type(x).__name__}, not an array; {_PROTOCOL}")


def _as_batch(out, n, name):
    """What ``container[indices]`` returned for ``n`` indices, as DataLoader
    gives a batch of the equivalent arrays: dicts and tuples keep their
    structure, lists become tuples and a list of numbers an array; every
    array must have ``n`` entries along its first axis."""
    try:
        return _batch_tree(out, n, name, "")
    except ShapeError as e:
        if isinstance(out, (list, tuple)) and len(out) == n:
            raise ShapeError(f"{e} It returned {n} items for {n} indices: a list of single observations is not a "
                             "batch; stack them (np.stack) in __getitem__, or let __getitem__ take one int "
                             "index only.") from None
        raise


def _batch_tree(out, n, name, path):
    where = f"{name}[indices]{path}"
    if isinstance(out, dict):
        return type(out)((k, _batch_tree(v, n, name, f"{path}[{k!r}]")) for k, v in out.items())
    if isinstance(out, list) and out and all(_is_number(v) for v in out):
        leaf = _numbers(out)
    elif isinstance(out, (tuple, list)):
        items = [_batch_tree(v, n, name, f"{path}[{i}]") for i, v in enumerate(out)]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    else:
        leaf = _array(out, where)
    shape = tuple(leaf.shape)
    if not shape or shape[0] != n:
        raise ShapeError(f"DataLoader: {where} has shape {shape} for a batch of {n} indices: {_PROTOCOL}.")
    return leaf


def _observation(x):
    """One observation's leaf as a NumPy array (Tensors and torch tensors
    copied to the host)."""
    if isinstance(x, Tensor):
        return x.numpy()
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return torch_to_numpy(x)
    return np.asarray(x)


def _stack(items, name, path=""):
    """The observations ``items`` (each an array, Tensor or number, or a
    tuple/list/dict of them, all alike) stacked into one batch along a new
    first axis, with the observations' structure; Tensor observations give
    a Tensor batch on their device."""
    first = items[0]
    where = f"the observations of {name}{path}"
    if isinstance(first, dict):
        keys = list(first)
        for it in items:
            if not isinstance(it, dict) or list(it) != keys:
                raise ShapeError(f"DataLoader: {where} differ in structure (a dict with keys {keys} and "
                                 f"{list(it) if isinstance(it, dict) else type(it).__name__}); every observation "
                                 "must have the same structure to be stacked into a batch")
        return type(first)((k, _stack([it[k] for it in items], name, f"{path}[{k!r}]")) for k in keys)
    if isinstance(first, tuple) or isinstance(first, list) and not all(_is_number(v) for v in first):
        for it in items:
            if not isinstance(it, (tuple, list)) or len(it) != len(first):
                raise ShapeError(f"DataLoader: {where} differ in structure (a {type(first).__name__} of "
                                 f"{len(first)} and {_describe(it)}); every observation must have the same "
                                 "structure to be stacked into a batch")
        fields = [_stack([it[j] for it in items], name, f"{path}[{j}]") for j in range(len(first))]
        return type(first)(*fields) if hasattr(first, "_fields") else tuple(fields)
    if all(_is_number(v) for v in items):
        return _numbers(items)
    arrays = [_numbers(v) if isinstance(v, list) else _observation(v) for v in items]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ShapeError(f"DataLoader: {where} have different shapes ({', '.join(map(str, sorted(shapes)))}); "
                         "a batch stacks them, so they must agree: pad or crop them to one shape in "
                         "__getitem__, or use batchsize=1")
    batch = np.stack(arrays)
    return transfer(Tensor._from_numpy(batch), first.device) if isinstance(first, Tensor) else batch


def _describe(x):
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


class _ContainerReader:
    """Reads the batches of one data container during one epoch. The first
    batch decides how: ``container[indices]`` when that gives a batch,
    else ``container[i]`` for each index, stacked; a container with torch's
    ``__getitems__(indices)`` gives a list of observations, stacked."""

    def __init__(self, container, path, maps=()):
        self.container, self.maps = container, maps
        self.name = f"{path} (a {type(container).__name__})" if path != "data" else type(container).__name__
        self.read = self._getitems if hasattr(type(container), "__getitems__") else None

    def __call__(self, idx):
        rows = np.arange(idx.start, idx.stop) if isinstance(idx, slice) else np.asarray(idx)
        batch = self.read(rows) if self.read is not None else self._first(rows)
        for f in self.maps:
            batch = f(batch)
        return batch

    def _batch(self, rows):
        return _as_batch(self.container[rows], len(rows), self.name)

    def _items(self, rows):
        c = self.container
        return _stack([c[int(i)] for i in rows], self.name)

    def _getitems(self, rows):
        obs = list(self.container.__getitems__(rows.tolist()))
        if len(obs) != len(rows):
            raise ShapeError(f"DataLoader: {self.name}.__getitems__ returned {len(obs)} observations for "
                             f"{len(rows)} indices; it must return one observation per index, in order")
        return _stack(obs, self.name)

    def _first(self, rows):
        # Probe with at least two indices: an int-only ``__getitem__`` may
        # accept a one-element array (``int(i)``) and give one observation.
        probe = rows if len(rows) > 1 else np.repeat(rows, 2)
        try:
            out = self.container[probe]
        except (TypeError, IndexError, KeyError, ValueError) as e:   # a container of single observations
            as_batch = e
        else:
            self.read = self._batch
            batch = _as_batch(out, len(probe), self.name)
            return batch if probe is rows else self._batch(rows)
        try:
            batch = self._items(rows)
        except Exception as as_items:
            raise ShapeError(
                f"DataLoader: cannot read a batch of {len(rows)} observations from {self.name}: "
                f"{self.name}[indices] (an array of indices) gave {type(as_batch).__name__}: {as_batch}; and "
                f"{self.name}[i] (one int index at a time) gave {type(as_items).__name__}: {as_items}. "
                f"{_PROTOCOL[0].upper()}{_PROTOCOL[1:]}.") from as_items
        self.read = self._items
        return batch


class DataLoader:
    """Iterate over ``data`` in batches of ``batchsize`` along the first axis.
    ``data`` is an array or Tensor, a data container (any object with
    ``__len__`` and ``__getitem__`` taking an array of indices, or one int:
    see the module docstring; ``DistributedDataContainer`` is one), or a
    tuple/list/dict of them, nested freely.

    ``shuffle`` reshuffles every epoch with ``rng`` (a NumPy Generator or a
    seed; the same seed gives the same order); ``partial=False`` drops a last
    batch smaller than ``batchsize``. ``len(loader)`` is the number of
    batches. Without a device, NumPy arrays give NumPy batches and Tensors
    give Tensor batches on their own device (device data is read to the host
    once per epoch); a container's batches come as its ``__getitem__`` gives
    them. Moved to a device (``gpu(loader)``, ``device(loader)``), it
    yields batches on that device, prefetching the next one while the
    current one is used (see the module docstring).
    """

    def __init__(self, data, batchsize=1, shuffle=False, partial=True, rng=None, *, device=None,
                 f64_to_f32=False):
        self.batchsize = int_arg(batchsize, "DataLoader", "batchsize (observations per batch)")
        self.shuffle = flag_arg(shuffle, "DataLoader", "shuffle")
        self.partial = flag_arg(partial, "DataLoader", "partial")
        self.rng = _generator(rng)
        self._kinds = [type(x).__name__ for _, x in _walk(data) if is_data_container(x)]   # for repr
        self.data = _arrays_behind(data)
        self.device = device
        self._f64_to_f32 = f64_to_f32
        self._batch_maps = ()     # applied to each batch a container gives (``_converted``)
        self.nobs = count_observations(self.data)

    def __len__(self):
        full, rest = divmod(self.nobs, self.batchsize)
        return full + (1 if rest and self.partial else 0)

    # --- batches on the host ---------------------------------------------------------------
    def _host_data(self):
        """The data with every array leaf as a NumPy array (device Tensors
        copied to the host once per epoch, not once per batch) and every
        data container as a reader of its batches."""

        def host(x, path):
            if isinstance(x, Tensor):
                return x._data if x.device.is_cpu else x.numpy()
            if is_data_container(x):
                return _ContainerReader(x, path, self._batch_maps)
            return x if isinstance(x, np.ndarray) else np.asarray(x)
        return _rebuild_paths(self.data, host)

    def _indices(self):
        """One index selection per batch: slices without shuffling (views),
        index arrays with."""
        order = self.rng.permutation(self.nobs) if self.shuffle else None
        for k in range(len(self)):
            lo, hi = k * self.batchsize, min((k + 1) * self.batchsize, self.nobs)
            yield order[lo:hi] if order is not None else slice(lo, hi)

    @staticmethod
    def _host_batch(host, idx, homes=None):
        """Batch ``idx`` of the host data: each array's rows (placed back on
        the device ``homes[k]`` of the ``k``-th leaf, where given) and each
        container's batch."""
        home = iter(homes) if homes is not None else None

        def leaf(a):
            dev = next(home) if home is not None else None
            if isinstance(a, _ContainerReader):
                return a(idx)
            rows = a[idx]
            return rows if dev is None else transfer(Tensor._from_numpy(rows), dev)
        return rebuild(host, leaf)

    def __iter__(self):
        host = self._host_data()
        indices = self._indices()
        if self.device is None:
            # no device of its own: NumPy leaves give NumPy batches, Tensor
            # leaves give Tensor batches on the Tensor's device
            homes = [x.device if isinstance(x, Tensor) else None for _, x in _walk(self.data)]
            homes = homes if any(h is not None for h in homes) else None
            for idx in indices:
                yield self._host_batch(host, idx, homes)
            return
        stager = _stager_for(self.device, self._f64_to_f32)
        # Arrays only: the stager gathers each batch itself (on a GPU straight
        # into pinned memory). With containers the batch is read first.
        read_first = any(isinstance(a, _ContainerReader) for _, a in _walk(host))
        # One ahead: batch k+1 is staged before batch k is handed out. The
        # handed-out batch is not kept in a local (it goes from ``box`` straight
        # to the caller), so the loader holds only the next batch while the
        # caller works, and never more than two.
        box = []
        for idx in indices:
            staged = _stage(stager, self._host_batch(host, idx), None) if read_first else _stage(stager, host, idx)
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

    def _converted(self, f):
        """The same loader with ``f`` (a function of a structure of arrays,
        such as ``f16``) applied to its arrays, and to each batch that a
        data container gives (a container's data cannot be converted)."""
        new = DataLoader.__new__(DataLoader)
        new.__dict__.update(self.__dict__)
        new.data = f(self.data)
        if any(is_data_container(x) for _, x in _walk(self.data)):
            new._batch_maps = self._batch_maps + (f,)
        return new

    def __repr__(self):
        dev = f", device={self.device!r}" if self.device is not None else ""
        of = f" of {', '.join(self._kinds)}" if self._kinds else ""
        return (f"DataLoader({self.nobs} observations{of}, batchsize={self.batchsize}, "
                f"shuffle={self.shuffle}, partial={self.partial}{dev})  # {len(self)} batches")


def _generator(rng):
    """``rng`` (a NumPy Generator, a seed: an int >= 0, or None) as a Generator."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or is_int(rng) and rng >= 0:
        return np.random.default_rng(rng)
    raise ArgumentError(f"DataLoader: rng must be a NumPy Generator (`np.random.default_rng(seed)`), a seed "
                        f"(an int >= 0) or None, got {rng!r} ({type(rng).__name__})")


@move.register
def _move_loader(loader: DataLoader, device, f64_to_f32=False):
    """A device called on a loader (``gpu(loader)``): the loader yielding its batches there."""
    return loader.to(device, f64_to_f32=f64_to_f32)


def _rows(a, idx):
    """How many rows of ``a`` batch ``idx`` takes (all of them for ``None``)."""
    if idx is None:
        return int(a.shape[0])
    return len(range(*idx.indices(a.shape[0]))) if isinstance(idx, slice) else len(idx)


def _stage(stager, host, idx):
    """``stager.stage(host, idx)``; running out of device (or pinned host)
    memory raises triflux's ``OutOfMemoryError`` with the batch's size."""
    try:
        return stager.stage(host, idx)
    except RuntimeError as e:
        if not memory.is_out_of_memory(e):
            raise
        leaves = [a for _, a in _walk(host)]
        nbytes = sum(np.dtype(a.dtype).itemsize * _rows(a, idx) * int(np.prod(a.shape[1:])) for a in leaves)
        raise memory.out_of_memory(e, device=getattr(stager.device, "torch_device", None), asked=nbytes,
                                   purpose=f"a DataLoader batch of {_rows(leaves[0], idx)} observations") from None


# --- staging batches on a device -----------------------------------------------------------------

class _Stager:
    """Moves host batches to ``device`` one step ahead of their use: the
    generic path (CPU device, Triton interpreter), ``moving.move``'s rules."""

    def __init__(self, device, f64_to_f32):
        self.device, self.f64_to_f32 = device, f64_to_f32

    def stage(self, host, idx):
        """Start moving batch ``idx`` of ``host`` (``host`` itself, a batch
        already read, for ``None``); returns a handle for ``ready``."""
        batch = host if idx is None else DataLoader._host_batch(host, idx)
        return move(batch, self.device, f64_to_f32=self.f64_to_f32)

    def ready(self, staged):
        """The batch, safe to use on the current stream."""
        return staged


class _CudaStager(_Stager):
    """Pinned host buffers and a dedicated copy stream (real CUDA/ROCm GPUs)."""

    def __init__(self, device, f64_to_f32):
        super().__init__(device, f64_to_f32)
        self.torch = torch = backend.torch()
        self.tdev = device.torch_device
        self.stream = torch.cuda.Stream(device=self.tdev)
        self._pinned_in_flight = []   # pinned buffers of the last staged batch (kept until the next stage)

    def _leaf(self, a, idx, pinned):
        torch = self.torch
        if isinstance(a, Tensor):    # from a container: kept if already here, else through the host
            if a.device == self.device and not (self.f64_to_f32 and a.dtype == np.float64):
                return a
            a = a.numpy()
        if self.f64_to_f32 and a.dtype == np.float64:
            dtype = np.dtype(np.float32)
        else:
            dtype = a.dtype
        bf16 = _dt.is_bfloat16(dtype)
        tdtype = torch.int16 if bf16 else _dt.to_torch(dtype)  # DTypeError for unsupported dtypes
        buf = torch.empty((_rows(a, idx),) + a.shape[1:], dtype=tdtype, pin_memory=True)
        view = buf.numpy()
        if bf16:
            view = view.view(dtype)
        if idx is not None and not isinstance(idx, slice) and a.dtype == dtype:
            np.take(a, idx, axis=0, out=view)      # gather straight into pinned memory
        else:
            view[...] = a if idx is None else a[idx]   # one copy (and the float64 -> float32 cast)
        pinned.append(buf)
        dev = buf.to(self.tdev, non_blocking=True)  # on the copy stream (the caller's `with`)
        if bf16:
            dev = dev.view(torch.bfloat16)
        return Tensor._make(dev, self.device)

    def stage(self, host, idx):
        torch = self.torch
        pinned = []
        with torch.cuda.stream(self.stream):
            batch = rebuild(host, lambda a: self._leaf(a, idx, pinned))
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
