"""DataLoader: structures, data containers (MLUtils' protocol, torch
datasets, DistributedDataContainer), errors, reproducible shuffling, and
device loaders that prefetch one batch ahead without holding more than two."""
import gc
import operator
import weakref

import numpy as np
import pytest
from hypothesis import given, strategies as st

import triflux as tf
from triflux import data as data_mod
from triflux import distributed as dist
from triflux.distributed import backends as dist_backends
from triflux.errors import ShapeError, DTypeError
from helpers import DEVICES, device


def _host(b):
    """A batch (any structure of arrays/Tensors) as nested lists of NumPy arrays."""
    if isinstance(b, dict):
        return {k: _host(v) for k, v in b.items()}
    if isinstance(b, (tuple, list)):
        return tuple(_host(v) for v in b)
    return b.numpy() if isinstance(b, tf.Tensor) else np.asarray(b)


def _assert_same(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            _assert_same(u, v)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 3)).astype(np.float32)
    y = np.arange(11)
    m = rng.random(11) > 0.5
    h = rng.standard_normal((11, 2, 2)).astype(np.float16)
    return x, y, m, h


def test_len_partial_and_order_without_shuffle():
    x, y, _, _ = _data()
    assert len(tf.DataLoader(x, batchsize=4)) == 3
    assert len(tf.DataLoader(x, batchsize=4, partial=False)) == 2
    assert len(tf.DataLoader(x, batchsize=11)) == 1 and len(tf.DataLoader(x, batchsize=20, partial=False)) == 0
    got = [b for b in tf.DataLoader((x, y), batchsize=4)]
    assert [b[1].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    np.testing.assert_array_equal(got[2][0], x[8:])
    assert [b[1].tolist() for b in tf.DataLoader((x, y), batchsize=4, partial=False)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="batchsize"):
        tf.DataLoader(x, batchsize=0)


def test_shuffle_is_a_permutation_and_reproducible():
    x, y, _, _ = _data()
    a = [b[1].tolist() for b in tf.DataLoader((x, y), batchsize=3, shuffle=True, rng=7)]
    b = [b[1].tolist() for b in tf.DataLoader((x, y), batchsize=3, shuffle=True, rng=7)]
    c = [b[1].tolist() for b in tf.DataLoader((x, y), batchsize=3, shuffle=True, rng=8)]
    assert a == b and a != c
    assert sorted(sum(a, [])) == list(range(11))
    loader = tf.DataLoader((x, y), batchsize=3, shuffle=True, rng=np.random.default_rng(7))
    e1 = [b[1].tolist() for b in loader]
    e2 = [b[1].tolist() for b in loader]
    assert e1 == a and e2 != e1                     # reshuffled every epoch
    for xb, yb in tf.DataLoader((x, y), batchsize=3, shuffle=True, rng=1):
        np.testing.assert_array_equal(xb, x[yb])    # rows stay paired


def test_dicts_tuples_lists_nested():
    x, y, m, h = _data()
    for xb in tf.DataLoader({"x": x, "labels": {"y": y, "mask": m}}, batchsize=5):
        assert set(xb) == {"x", "labels"} and set(xb["labels"]) == {"y", "mask"}
    first = next(iter(tf.DataLoader({"x": x, "labels": {"y": y, "mask": m}}, batchsize=5)))
    np.testing.assert_array_equal(first["labels"]["mask"], m[:5])
    b = next(iter(tf.DataLoader([x, (y, m)], batchsize=4)))
    assert isinstance(b, tuple) and isinstance(b[1], tuple)
    np.testing.assert_array_equal(b[1][0], y[:4])


def test_mismatched_lengths_name_every_entry():
    x, y, _, _ = _data()
    with pytest.raises(ShapeError) as e:
        tf.DataLoader({"x": x, "y": y[:7]})
    msg = str(e.value)
    assert "data['x'] has 11" in msg and "data['y'] has 7" in msg and "first axis" in msg
    with pytest.raises(ShapeError, match=r"data\[1\]\[0\] has 3"):
        tf.DataLoader((x, (y[:3],)))
    with pytest.raises(ShapeError, match="no batch axis"):
        tf.DataLoader((x, np.float32(1)))
    with pytest.raises(ShapeError, match="not an array"):
        tf.DataLoader({"x": x, "n": 3})
    with pytest.raises(ShapeError, match="holds no arrays"):
        tf.DataLoader({})


@pytest.mark.parametrize("dev", DEVICES)
def test_device_loader_gives_the_same_batches(dev):
    """Values, dtypes and order agree with the host loader plus ``move``."""
    d = device(dev)
    x, y, m, h = _data()
    make = lambda: tf.DataLoader({"x": x, "rest": (y, m, h)}, batchsize=4, shuffle=True, rng=3)  # noqa: E731
    ref = [_host(tf.moving.move(b, d)) for b in make()]
    got = []
    for b in d(make()):
        assert b["x"].device == d and b["rest"][2].device == d
        got.append(_host(b))
    assert len(got) == len(ref) == 3
    for a, b in zip(ref, got):
        _assert_same(a, b)
    # the host loader's values too
    plain = [_host(b) for b in make()]
    for a, b in zip(plain, got):
        _assert_same(a, b)


@pytest.mark.parametrize("dev", DEVICES)
def test_gpu_rules_float64_to_float32_keep_ints_bools_float16(dev):
    d = device(dev)
    x, y, m, h = _data()
    x64 = x.astype(np.float64)
    for xb, yb, mb, hb in tf.moving.move(tf.DataLoader((x64, y, m, h), batchsize=5), d, f64_to_f32=True):
        assert (xb.dtype, yb.dtype, mb.dtype, hb.dtype) == (np.float32, np.int64, np.bool_, np.float16)
        np.testing.assert_array_equal(xb.numpy(), x64[yb.numpy()].astype(np.float32))
    for xb, _, _, _ in d(tf.DataLoader((x64, y, m, h), batchsize=5)):
        assert xb.dtype == np.float64            # a plain device move keeps float64


@pytest.mark.parametrize("dev", DEVICES)
def test_tensor_data_on_any_device(dev):
    d = device(dev)
    x, y, _, _ = _data()
    loader = tf.DataLoader((d(x), tf.tensor(y)), batchsize=4, shuffle=True, rng=0)
    ref = [(x[b[1]], b[1]) for b in tf.DataLoader((x, y), batchsize=4, shuffle=True, rng=0)]
    got = []
    for xb, yb in loader:
        assert isinstance(xb, tf.Tensor) and xb.device == d and yb.device == tf.cpu_device()
        got.append((xb.numpy(), yb.numpy()))
    mixed = next(iter(tf.DataLoader((d(x), y), batchsize=4)))
    assert isinstance(mixed[0], tf.Tensor) and mixed[0].device == d and isinstance(mixed[1], np.ndarray)
    for (a, ai), (b, bi) in zip(ref, got):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ai, bi)
    on = [(xb.device, yb.device) for xb, yb in tf.cpu_device()(loader)]
    assert on and all(p == (tf.cpu_device(), tf.cpu_device()) for p in on)


def _watch_staging(monkeypatch):
    """Record the stage calls of every loader: ``(events, refs)`` with weak
    references to each staged batch's tensors."""
    events, refs = [], []
    real = data_mod._stager_for

    def stager_for(dev, f64_to_f32):
        s = real(dev, f64_to_f32)
        orig = s.stage

        def stage(host, idx):
            out = orig(host, idx)
            batch = out[0] if isinstance(s, data_mod._CudaStager) else out
            refs.append([weakref.ref(t) for _, t in data_mod._walk(batch)])
            events.append(("stage", len(refs) - 1))
            return out
        s.stage = stage
        return s

    monkeypatch.setattr(data_mod, "_stager_for", stager_for)
    return events, refs


@pytest.mark.parametrize("dev", DEVICES)
def test_prefetch_one_ahead_and_at_most_two_live_batches(monkeypatch, dev):
    """Batch k+1 is staged before batch k is handed out, and the loader
    drops every batch it handed out: at most two staged batches are alive."""
    x, y, _, _ = _data()
    events, refs = _watch_staging(monkeypatch)
    loader = device(dev)(tf.DataLoader((x, y), batchsize=2, shuffle=True, rng=0))
    live, held = [], []
    k = -1
    for xb, yb in loader:                # (not enumerate: it keeps the last tuple alive)
        k += 1
        events.append(("yield", k))
        assert xb.device == device(dev)
        held.append(sum(any(r() is not None for r in rs) for rs in refs))   # current + the next, staged
        del xb, yb                       # the caller lets go of the batch
        gc.collect()
        live.append(sum(any(r() is not None for r in rs) for rs in refs))
    assert len(refs) == len(loader) == 6
    for k in range(len(loader) - 1):     # batch k+1 was staged before batch k was yielded
        assert events.index(("stage", k + 1)) < events.index(("yield", k))
    assert max(held) <= 2 and held[0] == 2, held
    assert max(live) <= 1, live          # the loader holds only the next batch, never old ones
    gc.collect()
    assert all(r() is None for rs in refs for r in rs)


needs_real_cuda = pytest.mark.skipif(
    not (tf.functional("CUDA") and tf.CUDADevice(0).torch_device.type == "cuda"),
    reason="needs a real CUDA GPU (not the Triton interpreter)")


@needs_real_cuda
def test_real_cuda_copy_stream_pinned_memory_and_events():
    import torch
    x, y, _, _ = _data()
    loader = tf.gpu(tf.DataLoader((x.astype(np.float64), y), batchsize=4, shuffle=True, rng=5))
    stager = data_mod._stager_for(loader.device, True)
    assert isinstance(stager, data_mod._CudaStager)
    assert stager.stream != torch.cuda.current_stream()
    host = loader._host_data()
    batch, event = stager.stage(host, np.array([3, 1, 2]))
    assert len(stager._pinned_in_flight) == 2 and all(b.is_pinned() for b in stager._pinned_in_flight)
    got = stager.ready((batch, event))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(got[0].numpy(), x[[3, 1, 2]])
    assert got[0].dtype == np.float32 and got[1].dtype == np.int64
    ref = [(x[b[1]], b[1]) for b in tf.DataLoader((x, y), batchsize=4, shuffle=True, rng=5)]
    for (a, ai), (xb, yb) in zip(ref, loader):
        assert xb._data.device.type == "cuda"
        np.testing.assert_array_equal(xb.numpy(), a)
        np.testing.assert_array_equal(yb.numpy(), ai)


@needs_real_cuda
def test_real_cuda_bfloat16_and_unsupported_dtypes():
    x, y, _, _ = _data()
    xb16 = tf.bf16(x)
    for (b,) in tf.gpu(tf.DataLoader((xb16,), batchsize=4)):
        assert b.dtype == tf.bfloat16


@pytest.mark.parametrize("dev", DEVICES)
def test_precision_functions_on_loaders_and_structures(dev):
    d = device(dev)
    x, y, m, _ = _data()
    loader = d(tf.DataLoader((x.astype(np.float64), y, m), batchsize=4, shuffle=True, rng=2))
    for f, dt in ((tf.f16, np.float16), (tf.f32, np.float32), (tf.f64, np.float64), (tf.bf16, tf.bfloat16)):
        conv = f(loader)
        assert isinstance(conv, tf.DataLoader) and conv.device == d and len(conv) == len(loader)
        batches = list(conv)
        assert all(b[0].dtype == dt and b[1].dtype == np.int64 and b[2].dtype == np.bool_ for b in batches)
        assert all(b[0].device == d for b in batches)
    assert loader.data[0].dtype == np.float64               # the original is untouched
    s = tf.f16({"a": [d(x), y], "b": d(tf.Dense(2, 2))})
    assert s["a"][0].dtype == np.float16 and s["a"][1].dtype == np.int64 and s["b"].weight.dtype == np.float16


@pytest.mark.parametrize("dev", DEVICES)
def test_unsupported_dtype_fails_clearly_when_staged(dev):
    x, _, _, _ = _data()
    loader = device(dev)(tf.DataLoader((x.astype(np.complex64),), batchsize=4))
    if dev == "cpu":
        assert next(iter(loader))[0].dtype == np.complex64   # the CPU device keeps NumPy's types
        return
    with pytest.raises(DTypeError):
        list(loader)


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_cuda_stager_protocol_with_a_fake_cuda(monkeypatch):
    """The copy-stream path, run without a GPU: every leaf is gathered into a
    (pinned) buffer and copied inside the copy stream, an event is recorded
    there, and ``ready`` makes the consumer stream wait on it and marks each
    tensor as used by the consumer stream."""
    import contextlib
    import torch
    from triflux import backend
    log = []

    class Stream:
        def __init__(self, device=None):
            self.name = "copy" if device is not None else "consumer"

        def wait_event(self, e):
            log.append(("wait", self.name, e))

    consumer = Stream()

    class FakeEvent:
        def record(self, s):
            log.append(("record", s.name, self))

    class Cuda:
        Event = FakeEvent

        @staticmethod
        def Stream(device=None):
            return Stream(device=device or "gpu")

        @staticmethod
        def current_stream(dev=None):
            return consumer

        @staticmethod
        @contextlib.contextmanager
        def stream(s):
            log.append(("enter", s.name))
            yield
            log.append(("exit", s.name))

    class FakeTorch:
        cuda = Cuda

        @staticmethod
        def empty(shape, dtype, pin_memory=False):
            log.append(("pinned", pin_memory))
            return torch.empty(shape, dtype=dtype)

        def __getattr__(self, name):
            return getattr(torch, name)

    monkeypatch.setattr(backend, "torch", lambda: FakeTorch())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: log.append(("record_stream", s.name)),
                        raising=False)
    x, y, m, _ = _data()
    dev = tf.CUDADevice(0)
    stager = data_mod._CudaStager(dev, True)
    host = {"x": x.astype(np.float64), "rest": (y, m, tf.bf16(x))}
    staged = stager.stage(host, np.array([4, 0, 7]))
    assert ("enter", "copy") in log and log[-1] == ("exit", "copy")
    assert [e for e in log if e[0] == "pinned"] == [("pinned", True)] * 4
    assert any(e[0] == "record" and e[1] == "copy" for e in log)
    log.clear()
    batch = stager.ready(staged)
    assert log[0][:2] == ("wait", "consumer") and log[0][2] is staged[1]
    assert log[1:] == [("record_stream", "consumer")] * 4
    assert batch["x"].dtype == np.float32 and batch["x"].device == dev
    np.testing.assert_array_equal(batch["x"].numpy(), x[[4, 0, 7]])
    np.testing.assert_array_equal(batch["rest"][0].numpy(), y[[4, 0, 7]])
    assert batch["rest"][1].dtype == np.bool_ and batch["rest"][2].dtype == tf.bfloat16
    np.testing.assert_array_equal(batch["rest"][2].numpy(), tf.bf16(x)[[4, 0, 7]])
    # a slice (no shuffling) takes the one-copy path
    b2 = stager.ready(stager.stage(host, slice(2, 5)))
    assert len(stager._pinned_in_flight) == 8             # this batch's buffers and the previous batch's
    np.testing.assert_array_equal(b2["x"].numpy(), x[2:5])
    # a batch a container gave (idx None): host leaves go through pinned memory, a Tensor already on
    # the device stays as it is
    log.clear()
    here = tf.tensor(x[:3], device=dev)
    b3 = stager.ready(stager.stage({"host": tf.tensor(x[:3].astype(np.float64)), "here": here}, None))
    assert [e for e in log if e[0] == "pinned"] == [("pinned", True)]
    assert b3["here"] is here and b3["host"].dtype == np.float32 and b3["host"].device == dev
    np.testing.assert_array_equal(b3["host"].numpy(), x[:3])


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_out_of_memory_while_staging_a_batch_is_triflux_error(monkeypatch):
    import torch

    def stage(self, host, idx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(data_mod._Stager, "stage", stage)
    x, y, _, _ = _data()
    with pytest.raises(tf.OutOfMemoryError) as e:
        list(tf.gpu(tf.DataLoader((x, y), batchsize=4)))
    msg = str(e.value)
    assert f"{4 * 3 * 4 + 4 * 8} bytes" in msg and "DataLoader batch of 4 observations" in msg
    assert "smaller batch" in msg
    monkeypatch.setattr(data_mod._Stager, "stage", lambda self, h, i: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):
        list(tf.gpu(tf.DataLoader((x, y), batchsize=4)))


# --- data containers (MLUtils' numobs/getobs protocol) ----------------------------------------------

rebuild = data_mod.rebuild


def _signature(b):
    """A batch's structure with each leaf's kind, device, dtype and shape:
    what must agree, besides the values, with the arrays' batch."""
    if isinstance(b, dict):
        return {k: _signature(v) for k, v in b.items()}
    if isinstance(b, (tuple, list)):
        return (type(b).__name__, [_signature(v) for v in b])
    dev = repr(b.device) if isinstance(b, tf.Tensor) else None
    return (type(b).__name__, dev, str(b.dtype), tuple(b.shape))


def _same_batches(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert _signature(g) == _signature(r)
        _assert_same(_host(g), _host(r))


def _nrows(data):
    return len(data_mod._walk(data)[0][1])


class Batched:
    """A container whose ``__getitem__`` takes an array of indices (MLUtils'
    ``getobs(data, indices)``): the batch as a tuple/dict of arrays, or as a
    list (``as_list``), or with each array made by ``leaf``."""

    def __init__(self, data, as_list=False, leaf=None):
        self.data, self.as_list, self.leaf, self.calls = data, as_list, leaf, []

    def __len__(self):
        return _nrows(self.data)

    def __getitem__(self, idx):
        assert isinstance(idx, np.ndarray) and idx.dtype.kind == "i", idx   # the protocol: an int array
        self.calls.append(len(idx))
        b = rebuild(self.data, lambda a: (self.leaf or (lambda v: v))(a[idx]))
        return list(b) if self.as_list and isinstance(b, tuple) else b


class ItemsOnly:
    """A typical torch ``Dataset``: ``__getitem__`` takes one int only."""

    def __init__(self, data):
        self.data, self.calls = data, 0

    def __len__(self):
        return _nrows(self.data)

    def __getitem__(self, i):
        i = operator.index(i)            # TypeError for an array, as a list or a dict lookup would give
        self.calls += 1
        return rebuild(self.data, lambda a: a[i])


class GetItems(ItemsOnly):
    """torch's batched protocol: ``__getitems__(indices)``, a list of observations."""

    def __getitem__(self, i):
        raise AssertionError("DataLoader must use __getitems__")

    def __getitems__(self, indices):
        assert isinstance(indices, list) and all(type(i) is int for i in indices)
        return [rebuild(self.data, lambda a: a[i]) for i in indices]


def _fake_backend(rank, workers):
    """Rank and size only: a DistributedDataContainer exchanges nothing."""
    return dist_backends.DistributedBackend(rank, workers, 0, 1.0)


def _shard(data, lo, hi):
    if isinstance(data, dict):
        return {k: _shard(v, lo, hi) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(_shard(v, lo, hi) for v in data)
    return data[lo:hi]


@st.composite
def _datasets(draw):
    """A structure of arrays (every kind DataLoader takes) with ``n``
    observations, and loader options."""
    n = draw(st.integers(0, 13))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))

    def leaf():
        dt = draw(st.sampled_from([np.float32, np.int64, np.bool_, np.float16]))
        shape = (n,) + draw(st.sampled_from([(), (2,), (2, 3)]))
        return (rng.standard_normal(shape) * 3).astype(dt)
    kind = draw(st.sampled_from(["array", "tuple", "dict", "list", "nested"]))
    data = {"array": lambda: leaf(), "tuple": lambda: (leaf(), leaf()), "dict": lambda: {"x": leaf(), "y": leaf()},
            "list": lambda: [leaf(), leaf(), leaf()],
            "nested": lambda: {"x": leaf(), "rest": (leaf(), {"m": leaf()})}}[kind]()
    options = dict(batchsize=draw(st.integers(1, 5)), shuffle=draw(st.booleans()), partial=draw(st.booleans()),
                   rng=draw(st.integers(0, 100)))
    return data, options


def _torch_tensor(a):
    import torch
    return torch.from_numpy(np.ascontiguousarray(a))


def _as_cpu_tensors(data):
    return rebuild(data, tf.tensor) if not isinstance(data, list) else tuple(rebuild(data, tf.tensor))


CONTAINERS = {
    # kind: (container over data, the equivalent data DataLoader takes)
    "batched": lambda d: (Batched(d), d),
    "batched_list": lambda d: (Batched(d, as_list=True), d),
    "batched_torch": lambda d: (Batched(d, leaf=_torch_tensor), d),
    "batched_tensors": lambda d: (Batched(d, leaf=tf.tensor), _as_cpu_tensors(d)),
    "items": lambda d: (ItemsOnly(d), d),
    "items_tensors": lambda d: (ItemsOnly(_as_cpu_tensors(d)), _as_cpu_tensors(d)),
    "getitems": lambda d: (GetItems(d), d),
    "distributed": lambda d: (dist.DistributedDataContainer(_fake_backend(1, 2), d),
                              _shard(d, *dist.data.shard_range(_nrows(d), 2, 1))),
}


@pytest.mark.parametrize("dev", [pytest.param(None, id="nodevice")] + DEVICES)
@pytest.mark.parametrize("kind", list(CONTAINERS))
@given(case=_datasets())
def test_a_container_gives_the_batches_of_the_equivalent_arrays(kind, dev, case):
    """Every kind of container (batched, one index at a time, torch's
    ``__getitems__``, giving tuples, lists, dicts, Tensors, torch tensors;
    a DistributedDataContainer) gives, batch for batch and epoch after epoch,
    what DataLoader gives for the equivalent arrays: the same structure, leaf
    types, devices, dtypes, shapes and values, with the same shuffling,
    ``partial`` and ``rng``, with and without a device."""
    data, options = case
    container, equivalent = CONTAINERS[kind](data)
    got_loader = tf.DataLoader(container, **options)
    ref_loader = tf.DataLoader(equivalent, **options)
    assert len(got_loader) == len(ref_loader)
    if dev is not None:
        got_loader, ref_loader = device(dev)(got_loader), device(dev)(ref_loader)
    for epoch in range(2):
        _same_batches(list(got_loader), list(ref_loader))


def test_a_batched_container_is_read_once_per_batch_with_an_index_array():
    x, y, _, _ = _data()
    c = Batched({"x": x, "y": y})
    batches = list(tf.DataLoader(c, batchsize=4, shuffle=True, rng=0))
    assert c.calls == [4, 4, 3]                       # one call per batch, never one per observation
    assert sorted(np.concatenate([b["y"] for b in batches]).tolist()) == list(range(11))
    items = ItemsOnly((x, y))
    list(tf.DataLoader(items, batchsize=4))
    assert items.calls == 11                          # read one observation at a time, each once


def test_torch_datasets_work_as_containers():
    """A PyTorch user's data: a ``TensorDataset`` (batched indexing works),
    a map-style ``Dataset`` subclass taking one int (stacked, as torch's
    default collate does), and ``Subset`` (torch's ``__getitems__``)."""
    import torch
    from torch.utils.data import Dataset, Subset, TensorDataset
    x, y, _, _ = _data()

    class Pairs(Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return torch.from_numpy(x[i]), int(y[i])      # an int label, as torch datasets give

    for ds in (TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), Pairs()):
        got = list(tf.DataLoader(ds, batchsize=4, shuffle=True, rng=9))
        _same_batches(got, list(tf.DataLoader((x, y), batchsize=4, shuffle=True, rng=9)))
    sub = Subset(Pairs(), [10, 2, 5])
    (xb, yb), = tf.DataLoader(sub, batchsize=3)
    np.testing.assert_array_equal(xb, x[[10, 2, 5]])
    assert yb.tolist() == [10, 2, 5] and yb.dtype == np.int64


def test_observations_of_numbers_lists_and_tensors_stack_like_arrays():
    """One-index containers may give Python numbers (floats become float32,
    as ``tensor`` makes them), lists of numbers (a vector), dicts, and
    Tensors (a Tensor batch on their device)."""
    class Rows:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            i = operator.index(i)
            return {"f": i / 2, "v": [i, i + 1.5], "flag": bool(i % 2), "n": i, "t": tf.tensor([i, -i])}

    (b,) = tf.DataLoader(Rows(), batchsize=5)
    assert b["f"].dtype == np.float32 and b["f"].tolist() == [0, 0.5, 1, 1.5, 2]
    assert b["v"].shape == (5, 2) and b["v"].dtype == np.float32 and b["v"][3].tolist() == [3, 4.5]
    assert b["flag"].dtype == np.bool_ and b["n"].dtype == np.int64
    assert isinstance(b["t"], tf.Tensor) and b["t"].shape == (5, 2) and b["t"][4].tolist() == [4, -4]

    class Batches:             # batched, giving a list of labels as Python numbers
        def __len__(self):
            return 6

        def __getitem__(self, idx):
            return np.asarray(idx, np.float32)[:, None], [float(i) for i in idx]

    xb, yb = next(iter(tf.DataLoader(Batches(), batchsize=4)))
    assert xb.shape == (4, 1) and yb.dtype == np.float32 and yb.tolist() == [0, 1, 2, 3]


def test_containers_mix_with_arrays_and_train():
    """A container may be one entry of a tuple/dict; ``train`` takes the
    loader like any other (Flux's ``train!(loss, model, DataLoader(...))``)."""
    x, y, _, _ = _data()
    batches = list(tf.DataLoader((ItemsOnly(x), y), batchsize=4, shuffle=True, rng=2))
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, x[yb])
    with pytest.raises(ShapeError, match=r"data\[0\] has 11, data\[1\] has 7"):
        tf.DataLoader((ItemsOnly(x), y[:7]))
    tf.seed(0)
    model = tf.Dense(3, 1)
    state = tf.setup(tf.Descent(0.1), model)
    target = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)
    loader = tf.DataLoader(Batched((x, target)), batchsize=4, shuffle=True, rng=0)
    first = tf.train(lambda m, a, b: tf.losses.mse(m(a), b), model, loader, state)
    for _ in range(20):
        last = tf.train(lambda m, a, b: tf.losses.mse(m(a), b), model, loader, state)
    assert len(first) == 3 and np.mean(last) < np.mean(first) / 4


def test_repr_names_the_container():
    x, y, _, _ = _data()
    r = repr(tf.DataLoader((ItemsOnly(x), y), batchsize=4))
    assert "11 observations of ItemsOnly" in r and "3 batches" in r
    r = repr(tf.DataLoader(dist.DistributedDataContainer(_fake_backend(0, 2), (x, y)), batchsize=4))
    assert "6 observations of DistributedDataContainer" in r and "2 batches" in r


def test_container_errors_name_the_protocol_and_the_fix():
    x, y, _, _ = _data()

    class WrongLength(Batched):
        def __getitem__(self, idx):
            return x[:2], y[idx]

    with pytest.raises(ShapeError) as e:
        list(tf.DataLoader(WrongLength(x), batchsize=4))
    msg = str(e.value)
    assert "WrongLength[indices][0] has shape (2, 3) for a batch of 4 indices" in msg
    assert "__getitem__ that takes a NumPy array of indices" in msg and "one int index" in msg

    class ListOfObservations(Batched):        # a batch given as a list of single observations
        def __getitem__(self, idx):
            return [x[i] for i in idx]

    with pytest.raises(ShapeError) as e:
        list(tf.DataLoader(ListOfObservations(x), batchsize=4))
    msg = str(e.value)
    assert "ListOfObservations[indices][0] has shape (3,) for a batch of 4 indices" in msg
    assert "It returned 4 items for 4 indices: a list of single observations is not a batch; stack them" in msg

    class IntOnly(ItemsOnly):           # int(i) takes a one-element array too: probed with two indices
        def __getitem__(self, i):
            return x[int(i)]

    _same_batches(list(tf.DataLoader(IntOnly(x), batchsize=1)), list(tf.DataLoader(x, batchsize=1)))

    class Neither(ItemsOnly):
        def __getitem__(self, i):
            raise TypeError("no ints here") if isinstance(i, int) else IndexError("no arrays either")

    with pytest.raises(ShapeError) as e:
        list(tf.DataLoader(Neither(x), batchsize=4))
    msg = str(e.value)
    assert "Neither[indices] (an array of indices) gave IndexError: no arrays either" in msg
    assert "Neither[i] (one int index at a time) gave TypeError: no ints here" in msg

    class Broken:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"a": 1}[i]                 # a bug in the user's container

    with pytest.raises(ShapeError) as e:
        list(tf.DataLoader(Broken(), batchsize=2))
    assert isinstance(e.value.__cause__, KeyError)           # the user's own error, chained
    assert "cannot read a batch of 2 observations from Broken" in str(e.value)

    class Ragged(ItemsOnly):
        def __getitem__(self, i):
            return np.zeros(operator.index(i) + 1)

    with pytest.raises(ShapeError, match=r"observations of Ragged have different shapes \(\(1,\), \(2,\)\).*pad"):
        list(tf.DataLoader(Ragged(x), batchsize=2))

    class Mixed(ItemsOnly):
        def __getitem__(self, i):
            return (x[i], y[i]) if operator.index(i) % 2 == 0 else {"x": x[i]}

    with pytest.raises(ShapeError, match="differ in structure"):
        list(tf.DataLoader(Mixed(x), batchsize=2))
    with pytest.raises(ShapeError, match=r"data\[1\] is not an array or a data container \(got generator\)"):
        tf.DataLoader((x, (v for v in y)))
    with pytest.raises(ShapeError, match=r"data\['name'\] is not an array or a data container \(got str\)"):
        tf.DataLoader({"x": x, "name": "abcdefghijk"})     # a str is no container, though it has len and []
    assert issubclass(ShapeError, ValueError)


def test_a_container_error_after_the_first_batch_is_the_users_own():
    """Once the first batch has shown how to read a container, a later
    error in its ``__getitem__`` reaches the caller as it is."""
    x, _, _, _ = _data()

    class FailsLater(Batched):
        def __getitem__(self, idx):
            if len(self.calls) == 1:
                raise FileNotFoundError("image 17.png")
            return super().__getitem__(idx)

    with pytest.raises(FileNotFoundError, match="17.png"):
        list(tf.DataLoader(FailsLater(x), batchsize=4))


def test_precision_of_a_loader_over_a_distributed_container():
    """``f16(DataLoader(DistributedDataContainer(...)))`` converts the shard's
    floating arrays (the loader reads the arrays behind the container)."""
    x, y, _, _ = _data()
    c = dist.DistributedDataContainer(_fake_backend(0, 1), (x.astype(np.float64), y))
    half = tf.f16(tf.DataLoader(c, batchsize=4))
    assert [(b[0].dtype, b[1].dtype) for b in half] == [(np.float16, np.int64)] * 3


def test_precision_conversion_reaches_container_batches():
    """``f16(loader)`` converts a container's batches (its data cannot be
    converted), arrays as before."""
    x, y, _, _ = _data()
    loader = tf.DataLoader((Batched(x.astype(np.float64)), y), batchsize=4)
    half = loader._converted(tf.f16)
    assert all(b[0].dtype == np.float16 and b[1].dtype == np.int64 for b in half)
    assert all(b[0].dtype == np.float64 for b in loader)            # the original is untouched
    arrays = tf.DataLoader((x, y), batchsize=4)._converted(tf.f16)
    assert arrays.data[0].dtype == np.float16 and arrays._batch_maps == ()
    # the public spelling
    assert all(b[0].dtype == np.float16 and b[1].dtype == np.int64 for b in tf.f16(loader))
    assert all(b[0].dtype == tf.bfloat16 for b in tf.bf16(loader))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("source", ["batched", "items", "distributed"])
def test_container_prefetch_one_ahead_and_at_most_two_live_batches(monkeypatch, dev, source):
    x, y, _, _ = _data()
    data = {"batched": lambda: Batched((x, y)), "items": lambda: ItemsOnly((x, y)),
            "distributed": lambda: dist.DistributedDataContainer(_fake_backend(0, 1), (x, y))}[source]()
    events, refs = _watch_staging(monkeypatch)
    loader = device(dev)(tf.DataLoader(data, batchsize=2, shuffle=True, rng=0))
    held, live, k = [], [], -1
    for xb, yb in loader:
        k += 1
        events.append(("yield", k))
        assert xb.device == device(dev)
        np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])
        held.append(sum(any(r() is not None for r in rs) for rs in refs))
        del xb, yb
        gc.collect()
        live.append(sum(any(r() is not None for r in rs) for rs in refs))
    assert len(refs) == len(loader) == 6
    for k in range(len(loader) - 1):
        assert events.index(("stage", k + 1)) < events.index(("yield", k))
    assert max(held) <= 2 and held[0] == 2, held
    assert max(live) <= 1, live
    gc.collect()
    assert all(r() is None for rs in refs for r in rs)


# --- DistributedDataContainer as a container of its own -------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_distributed_container_indexing(dev):
    """``len``, an int (negative too), a slice, an index array/list/range, a
    boolean mask; Tensors stay on their device (the seed moves the data to
    the GPU before splitting it); out of range and bad indices fail clearly."""
    d = device(dev)
    x = np.arange(30, dtype=np.float32).reshape(15, 2)
    y = np.arange(15)
    c = dist.DistributedDataContainer(_fake_backend(1, 2), {"x": d(x), "y": y})   # observations 8:15
    assert len(c) == 7 and c.indices == range(8, 15)
    assert repr(c) == (f"DistributedDataContainer(rank 1 of 2: observations 8:15 of 15; "
                       f"{{'x': Tensor float32[7, 2] on {d!r}, 'y': int64[7]}})")
    one = c[-1]
    assert one["x"].device == d and one["x"].tolist() == [28, 29] and int(one["y"]) == 14
    for index, rows in ((slice(1, 4), [9, 10, 11]), ([6, 0, 1, 2, 4], [14, 8, 9, 10, 12]),
                        (np.array([3, -1]), [11, 14]), (range(2), [8, 9]), (np.arange(7) % 3 == 0, [8, 11, 14]),
                        (np.array([], np.int64), [])):
        b = c[index]
        assert b["x"].device == d and b["x"].shape == (len(rows), 2), index
        np.testing.assert_array_equal(b["x"].numpy(), x[rows])
        np.testing.assert_array_equal(b["y"], y[rows])
    assert [int(o["y"]) for o in c] == list(range(8, 15))
    with pytest.raises(IndexError, match=r"observation 7 of 7"):
        c[7]
    with pytest.raises(IndexError, match=r"observation -9 of 7"):
        c[[0, -9]]
    with pytest.raises(TypeError, match="an int, a slice, or a 1-d array of ints"):
        c[np.array([0.5])]
    with pytest.raises(TypeError, match="an int, a slice"):
        c["x"]
    # a DataLoader over it: batches on the data's device, read as arrays
    got = list(tf.DataLoader(c, batchsize=3, shuffle=True, rng=4))
    ref = list(tf.DataLoader({"x": d(x[8:]), "y": y[8:]}, batchsize=3, shuffle=True, rng=4))
    _same_batches(got, ref)


def test_distributed_container_over_a_container():
    """The data split across workers may itself be a container (a torch-style
    Dataset): each worker reads only its own observations."""
    x, y, _, _ = _data()
    ds = ItemsOnly((x, y))
    c = dist.DistributedDataContainer(_fake_backend(0, 2), ds)
    assert len(c) == 6 and "ItemsOnly[0:6]" in repr(c)
    xb, yb = c[4]
    np.testing.assert_array_equal(xb, x[4])
    with pytest.raises(TypeError):
        c[[1, 2]]                           # the Dataset itself only takes ints
    got = list(tf.DataLoader(c, batchsize=4, shuffle=True, rng=1))
    _same_batches(got, list(tf.DataLoader((x[:6], y[:6]), batchsize=4, shuffle=True, rng=1)))
    other = dist.DistributedDataContainer(_fake_backend(1, 2), (Batched(x), y))
    _same_batches(list(tf.DataLoader(other, batchsize=2)), list(tf.DataLoader((x[6:], y[6:]), batchsize=2)))


def test_distributed_container_with_a_real_single_process_backend():
    """``initialize(GlooBackend)`` without a launcher is a world of one: the
    container holds everything, and Flux's spelling trains from it."""
    x, y, _, _ = _data()
    backend = dist.initialize(dist.GlooBackend, timeout=30)
    try:
        _train_from_single_process_container(backend, x, y)
    finally:
        dist.shutdown(backend)     # later tests in this process start without a backend


def _train_from_single_process_container(backend, x, y):
    assert dist.total_workers(backend) == 1
    c = dist.DistributedDataContainer(backend, (x, y))
    assert len(c) == 11 and repr(c).startswith("DistributedDataContainer(rank 0 of 1: observations 0:11 of 11")
    _same_batches(list(tf.DataLoader(c, batchsize=4, shuffle=True, rng=3)),
                  list(tf.DataLoader((x, y), batchsize=4, shuffle=True, rng=3)))
    tf.seed(0)
    model = tf.Dense(3, 1)
    state = tf.setup(dist.DistributedOptimizer(backend, tf.Adam(0.01)), model)
    data = dist.DistributedDataContainer(backend, (x, x @ np.array([[1.0], [-1.0], [2.0]], np.float32)))
    loader = tf.DataLoader(data, batchsize=4, shuffle=True)
    first = tf.train(lambda m, a, b: tf.losses.mse(m(a), b), model, loader, state)
    for _ in range(10):
        last = tf.train(lambda m, a, b: tf.losses.mse(m(a), b), model, loader, state)
    assert len(first) == len(last) == 3 and np.mean(last) < np.mean(first)
