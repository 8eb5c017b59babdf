"""DataLoader: structures, errors, reproducible shuffling, and device
loaders that prefetch one batch ahead without holding more than two."""
import gc
import weakref

import numpy as np
import pytest

import triflux as tf
from triflux import data as data_mod
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
    ref = [_host(tf.devices.move(b, d)) for b in make()]
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
    for xb, yb, mb, hb in tf.devices.move(tf.DataLoader((x64, y, m, h), batchsize=5), d, f64_to_f32=True):
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
