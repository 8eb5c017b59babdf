"""triflux.save / triflux.load: safetensors files holding any nesting of
arrays and numbers, written atomically, read without running code, with
errors that name the file and the problem."""
import json
import os
import pickle
import re
import signal
import socket
import stat
import zipfile
from contextlib import contextmanager

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import triflux as tf
from triflux import serialization
from triflux.errors import CheckpointError, TrifluxError
from triflux.functor import leaves
from triflux.optimise import Adam, setup, update
from triflux.persistence import loadmodel, state

from helpers import DEVICES, device, run_python

BF16 = np.dtype(ml_dtypes.bfloat16)


def _mlp(seed=0, d=None):
    tf.seed(seed)
    m = tf.Chain(tf.Dense(3, 4, tf.relu), tf.relu, tf.Dense(4, 2))
    return m if d is None else d(m)


def _assert_same(a, b, where="x"):
    """Structure, types, dtypes and bits all equal."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b and repr(a) == repr(b), (where, a, b)


def test_nested_roundtrip_keeps_everything(tmp_path):
    rng = np.random.default_rng(0)
    obj = {
        "floats": [rng.standard_normal((3, 4)).astype(dt) for dt in (np.float16, np.float32, np.float64, BF16)],
        "ints": (np.arange(5, dtype=np.int8), np.arange(-3, 3, dtype=np.int64), np.array([2**63 - 1], np.uint64),
                 np.array([True, False])),
        "shapes": {"zero_d": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.float32),
                   "one": np.ones((1, 1, 1), np.float64)},
        "views": [np.arange(24, dtype=np.float32).reshape(4, 6).T, np.arange(10.0)[::3],
                  np.arange(4, dtype=">f4")],
        "numbers": [0, -7, 2**70, 1.5, -0.0, float("inf"), float("-inf"), float("nan"), 1e-310, True, False],
        "other": [None, "text ü", [], {}, (), [[None]]],
        "numpy_scalars": [np.float32(1.25), np.int64(3), np.bool_(True), np.float16(0.5)],
        3: "an int key",
        "__metadata__": np.ones(2, np.float32),   # a key that is safetensors' reserved name
    }
    path = tf.save(tmp_path / "x.safetensors", obj)
    assert path == str(tmp_path / "x.safetensors")
    out = tf.load(path)
    expect = dict(obj)
    expect["views"] = [np.ascontiguousarray(v).astype(v.dtype.newbyteorder("=")) for v in obj["views"]]
    _assert_same(out, expect)
    assert out["shapes"]["zero_d"].shape == ()
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))


def test_the_file_is_plain_safetensors(tmp_path):
    """Other tools read the tensors (bfloat16 as BF16) and the metadata."""
    import safetensors.torch
    import torch
    p = tf.save(tmp_path / "m.safetensors", {"w": np.ones((2, 3), BF16), "n": [1, np.arange(3)]})
    t = safetensors.torch.load_file(p)
    assert set(t) == {"w", "n[1]"} and t["w"].dtype == torch.bfloat16 and t["w"].shape == (2, 3)
    with open(p, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n])["__metadata__"]
    assert meta["format"] == "triflux" and meta["format_version"] == "1"
    assert json.loads(meta["structure"])["dict"][1] == ["n", {"list": [1, {"array": "n[1]"}]}]


def test_bfloat16_bits_roundtrip_exactly(tmp_path):
    bits = np.array([0x0000, 0x8000, 0x0001, 0x807F, 0x007F, 0x3F80, 0x7F7F, 0xFF7F,  # 0, -0, subnormals, 1, max
                     0x7F80, 0xFF80,                                                    # +-inf
                     0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFFC1], np.uint16)                # NaN payloads
    x = bits.view(BF16)
    obj = {"x": x, "t": tf.Tensor._from_numpy(x.copy())}
    if tf.functional("CUDA"):
        obj["g"] = tf.CUDADevice(0)(obj["t"])
    out = tf.load(tf.save(tmp_path / "b.safetensors", obj))
    for k in obj:
        assert out[k].dtype == BF16
        np.testing.assert_array_equal(out[k].view(np.uint16), bits)
    # and a bfloat16 model loads back bit for bit
    m = tf.bf16(_mlp())
    s = tf.load(tf.save(tmp_path / "m.safetensors", m))
    assert s["layers"][0]["weight"].dtype == BF16
    np.testing.assert_array_equal(s["layers"][0]["weight"].view(np.uint16),
                                  m[0].weight.numpy().view(np.uint16))
    m2 = tf.bf16(_mlp(1))
    loadmodel(m2, s)
    np.testing.assert_array_equal(m2[2].weight.numpy().view(np.uint16), m[2].weight.numpy().view(np.uint16))


@pytest.mark.parametrize("dev", DEVICES)
def test_model_and_optimiser_roundtrip_from_any_device(tmp_path, dev):
    d = device(dev)
    m = _mlp(d=d)
    opt = setup(Adam(0.01), m)
    x = tf.randn(5, 3, device=d)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), m)
    update(opt, m, g)
    p = tf.save(tmp_path / "ckpt.safetensors", {"model": m, "opt": opt, "epoch": 3})  # no cpu() first
    ck = tf.load(p)
    assert ck["epoch"] == 3
    m2, other = _mlp(7), tf.cpu_device()
    opt2 = setup(Adam(), m2)
    loadmodel(m2, ck["model"])
    loadmodel(opt2, ck["opt"])
    for a, b in zip(leaves(state(m2)), leaves(state(m))):
        np.testing.assert_array_equal(a, b)
    leaf = opt2["layers"][0]["weight"]
    assert leaf.rule == Adam(0.01) and leaf.state[2] == 1 and leaf.state[0].device == other
    np.testing.assert_array_equal(leaf.state[1].numpy(), opt["layers"][0]["weight"].state[1].numpy())
    # a model alone saves as its state
    _assert_same(tf.load(tf.save(tmp_path / "m.safetensors", m)), state(m))


def test_saved_on_the_gpu_loads_where_there_is_no_gpu(tmp_path):
    if not tf.functional("CUDA"):
        pytest.skip("no functional CUDA backend")
    g = _mlp(3, tf.CUDADevice(0))
    p = tf.save(tmp_path / "gpu.safetensors", {"model": g, "opt": setup(Adam(), g)})
    want = state(g)
    np.save(tmp_path / "want.npy", want["layers"][2]["weight"])
    r = run_python(f"""
        import numpy as np, triflux as tf
        assert not tf.functional("CUDA")
        ck = tf.load({p!r})
        m = tf.Chain(tf.Dense(3, 4, tf.relu), tf.relu, tf.Dense(4, 2))
        tf.loadmodel(m, ck["model"])
        opt = tf.setup(tf.Adam(), m)
        tf.loadmodel(opt, ck["opt"])
        np.testing.assert_array_equal(m[2].weight.numpy(), np.load({str(tmp_path / "want.npy")!r}))
        print("OK", m[2].weight.device)
        """, env={"CUDA_VISIBLE_DEVICES": "-1"}, unset=("TRITON_INTERPRET",))
    assert r.returncode == 0 and "OK CPUDevice" in r.stdout, r.stderr[-3000:]


def _norms(seed, d=None):
    """The per-sample normalisations, with running statistics and absent parameters: (N, 4, 5, 6) input."""
    tf.seed(seed)
    m = tf.Chain(tf.LayerNorm((5, 6), tf.relu, bias=False), tf.GroupNorm(4, 2, eps=1e-4),
                 tf.InstanceNorm(4, affine=True, track_stats=True, momentum=0.3), tf.InstanceNorm(4),
                 tf.RMSNorm(6, eps=1e-6), tf.LayerNorm(6, affine=False))
    for layer in m.layers:
        for name in ("weight", "bias"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, tf.randn(*getattr(layer, name).shape))
    return m if d is None else d(m)


@pytest.mark.parametrize("dev", DEVICES)
def test_normalisation_layers_and_their_running_statistics_roundtrip(tmp_path, dev):
    """LayerNorm, GroupNorm, InstanceNorm (running statistics moved by a training step) and RMSNorm:
    save -> load -> loadmodel gives the same arrays bit for bit (nothing where a layer has no bias),
    the same outputs and the same optimiser state; a model built otherwise is refused by name."""
    d = device(dev)
    m = _norms(0, d)
    opt = setup(Adam(0.01), m)
    x = tf.randn(3, 4, 5, 6, device=d)
    (g,) = tf.gradient(lambda mm: (mm(x) ** 2).sum(), m)       # moves InstanceNorm's running statistics
    update(opt, m, g)
    assert not np.array_equal(m[2].running_mean.numpy(), np.zeros(4, np.float32))
    ck = tf.load(tf.save(tmp_path / "norms.safetensors", {"model": m, "opt": opt}))
    assert set(ck["model"]["layers"][0]) == {"weight"} and set(ck["model"]["layers"][3]) == set()   # no None arrays
    assert set(ck["model"]["layers"][2]) == {"weight", "bias", "running_mean", "running_var"}
    m2 = _norms(1)
    opt2 = setup(Adam(), m2)
    loadmodel(m2, ck["model"])
    loadmodel(opt2, ck["opt"])
    _assert_same(state(m2), state(m))
    np.testing.assert_array_equal(m2[2].running_var.numpy(), m[2].running_var.numpy())
    assert repr(m2) == repr(m)
    assert opt2["layers"][2]["running_mean"] is None                 # not trained: no optimiser state
    np.testing.assert_array_equal(opt2["layers"][2]["weight"].state[1].numpy(),
                                  opt["layers"][2]["weight"].state[1].numpy())
    tf.testmode(m)
    tf.testmode(m2)
    np.testing.assert_array_equal(d(m2)(x).numpy(), m(x).numpy())
    other = tf.Chain(tf.LayerNorm((5, 6), tf.relu), tf.GroupNorm(4, 2), tf.InstanceNorm(4, affine=True),
                     tf.InstanceNorm(4), tf.RMSNorm(6), tf.LayerNorm(6, affine=False))
    with pytest.raises(tf.StructureError) as e:
        loadmodel(other, ck["model"])
    for where, what in (("layers[0]", "`bias` is True in the model, False in the state"),
                        ("layers[1]", "`eps` is 1e-05 in the model, 0.0001 in the state"),
                        ("layers[2]", "`track_stats` is False in the model, True in the state; `momentum` is 0.1"),
                        ("layers[4]", "`eps` is None in the model, 1e-06 in the state")):
        assert f"`{where}`: the model's {type(other[int(where[7])]).__name__} differs from the one saved: {what}" \
            in str(e.value), str(e.value)


# --- atomic writes ---------------------------------------------------------------------------------

def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "model.safetensors"
    tf.save(p, {"w": np.arange(4.0)})
    good = p.read_bytes()

    def half_then_crash(f, data):
        f.write(bytes(data[:len(data) // 2]))
        raise OSError(28, "No space left on device (simulated)")

    monkeypatch.setattr(serialization, "_write", half_then_crash)
    with pytest.raises(CheckpointError, match=re.escape(f"save: cannot write {p}: No space left on device "
                                                        "(simulated). Nothing was written")):
        tf.save(p, {"w": np.arange(1000.0)})
    assert p.read_bytes() == good and os.listdir(tmp_path) == ["model.safetensors"]
    monkeypatch.undo()

    def fsync_fails(fd):
        raise OSError(5, "I/O error (simulated)")

    monkeypatch.setattr(serialization.os, "fsync", fsync_fails)
    with pytest.raises(CheckpointError, match=r"I/O error \(simulated\)"):
        tf.save(p, {"w": np.arange(1000.0)})
    monkeypatch.undo()
    assert p.read_bytes() == good and os.listdir(tmp_path) == ["model.safetensors"]
    _assert_same(tf.load(p), {"w": np.arange(4.0)})
    # an object that cannot be stored fails before the file is touched
    with pytest.raises(CheckpointError, match=r"`w\[1\]` is a function"):
        tf.save(p, {"w": [1, lambda: 0]})
    with pytest.raises(CheckpointError, match="key"):
        tf.save(p, {(1, 2): 3})
    with pytest.raises(CheckpointError, match="object"):
        tf.save(p, {"o": np.array([None], dtype=object)})
    assert p.read_bytes() == good
    # a new write replaces it, with ordinary permissions
    tf.save(p, {"w": np.arange(2.0)})
    _assert_same(tf.load(p), {"w": np.arange(2.0)})
    assert os.stat(p).st_mode & 0o644 == 0o644
    with pytest.raises(CheckpointError, match="does not exist"):
        tf.save(tmp_path / "no" / "such" / "m.safetensors", {})
    with pytest.raises(CheckpointError, match="is a folder"):
        tf.save(tmp_path, {})


# --- errors on load ------------------------------------------------------------------------------

def _load_error(path, **kw):
    with pytest.raises(CheckpointError) as e:
        tf.load(path, **kw)
    msg = str(e.value)
    assert str(path) in msg
    assert isinstance(e.value, TrifluxError) and isinstance(e.value, ValueError)
    return msg


def test_missing_empty_truncated_and_random_files(tmp_path):
    assert "no such file" in _load_error(tmp_path / "nope.safetensors")
    assert "is a folder" in _load_error(tmp_path)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    assert "empty" in _load_error(empty)
    p = tf.save(tmp_path / "m.safetensors", {"model": _mlp(), "n": 3})
    data = open(p, "rb").read()
    cut = tmp_path / "cut.safetensors"
    for n in (3, 8, 20, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:n])
        msg = _load_error(cut)
        assert "truncated" in msg, (n, msg)
    rnd = tmp_path / "random.bin"
    for seed in range(5):
        rnd.write_bytes(np.random.default_rng(seed).bytes(1000))
        msg = _load_error(rnd)
        assert "not a safetensors file" in msg or "corrupt" in msg
    # a corrupt header
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(len(b"{nope").to_bytes(8, "little") + b"{nope")
    assert "not valid JSON" in _load_error(bad)


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))   # creates a file when unpickled


def test_pickle_zip_bson_npy_files_are_refused_without_running_code(tmp_path):
    sentinel = tmp_path / "pwned"
    for proto in (0, 2, 4, 5):
        p = tmp_path / f"evil{proto}.pkl"
        p.write_bytes(pickle.dumps({"w": [_Evil(str(sentinel))]}, protocol=proto))
        msg = _load_error(p)
        assert "pickle" in msg and "never unpickles" in msg and "convert" in msg, msg
    assert not sentinel.exists()
    z = tmp_path / "model.pt"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("archive/data.pkl", pickle.dumps(1))
    assert "torch.save" in _load_error(z)
    npy = tmp_path / "w.npy"
    np.save(npy, np.ones(3))
    assert ".npy" in _load_error(npy)
    # a BSON document: int32 total length, elements, trailing NUL
    body = b"\x10w\x00" + (7).to_bytes(4, "little") + b"\x00"
    bson = tmp_path / "model.bson"
    bson.write_bytes((len(body) + 4).to_bytes(4, "little") + body)
    assert "BSON" in _load_error(bson)


def test_foreign_safetensors_file(tmp_path):
    p = tmp_path / "hf.safetensors"
    safetensors.numpy.save_file({"encoder.weight": np.ones((2, 2), np.float32), "bias": np.zeros(2)}, str(p))
    msg = _load_error(p)
    assert "not written by triflux" in msg and "'encoder.weight'" in msg and "'bias'" in msg
    assert "flat=True" in msg
    flat = tf.load(p, flat=True)
    assert set(flat) == {"encoder.weight", "bias"} and flat["encoder.weight"].dtype == np.float32
    # flat=True also reads triflux files, by tensor name
    q = tf.save(tmp_path / "t.safetensors", _mlp())
    assert set(tf.load(q, flat=True)) == {"layers[0].weight", "layers[0].bias", "layers[2].weight",
                                          "layers[2].bias"}


def _forged(path, tensors, structure, version="1"):
    meta = {"format": "triflux", "format_version": version,
            "structure": structure if isinstance(structure, str) else json.dumps(structure)}
    safetensors.numpy.save_file(tensors, str(path), metadata=meta)
    return path


def test_structure_inconsistent_with_the_tensors(tmp_path):
    a = {"a": np.ones(2, np.float32)}
    p = tmp_path / "f.safetensors"
    msg = _load_error(_forged(p, a, {"dict": [["a", {"array": "b"}]]}))
    assert "does not match" in msg and "`a`" in msg and "'b'" in msg
    msg = _load_error(_forged(p, {**a, "x": np.ones(1)}, {"dict": [["a", {"array": "a"}]]}))
    assert "'x'" in msg and "not in the structure" in msg
    msg = _load_error(_forged(p, a, {"list": [{"array": "a"}, {"array": "a"}]}))
    assert "used twice" in msg
    assert "unknown entry" in _load_error(_forged(p, a, {"list": [{"array": "a"}, {"code": "os.system('x')"}]}))
    assert "a scalar" in _load_error(_forged(p, a, {"scalar": "a"}))
    assert "not JSON" in _load_error(_forged(p, a, "{oops"))
    msg = _load_error(_forged(p, a, {"array": "a"}, version="2"))
    assert "newer triflux" in msg and "version 2" in msg
    # the forged file with a consistent structure loads (it records no checksums: as a file from an older
    # triflux, it is not checked)
    _assert_same(tf.load(_forged(p, a, {"tuple": [{"array": "a"}]})), (a["a"],))


# --- integrity ----------------------------------------------------------------------------------

def _header(data):
    n = int.from_bytes(data[:8], "little")
    return n, json.loads(data[8:8 + n])


def test_a_changed_byte_is_refused_naming_the_array(tmp_path):
    p = tmp_path / "m.safetensors"
    tf.save(p, {"model": _mlp(), "epoch": 3})
    good = p.read_bytes()
    n, header = _header(good)
    start, end = header["model.layers[2].weight"]["data_offsets"]
    flipped = bytearray(good)
    flipped[8 + n + start + (end - start) // 2] ^= 0x10          # one bit of one float
    p.write_bytes(bytes(flipped))
    want = (f"load: {p}: the data of the array `model.layers[2].weight` does not match its checksum: the file's "
            "bytes changed after it was written (a disk, memory or copy error, or an edit); use a good copy")
    assert _load_error(p) == want
    assert _load_error(p, flat=True) == want
    # the structure is checked too: "epoch": 3 -> 7 keeps the header valid JSON
    changed = good.replace(b'[\\"epoch\\", 3]', b'[\\"epoch\\", 7]')
    assert changed != good
    p.write_bytes(changed)
    assert _load_error(p) == (f"load: {p}: the file's metadata (its structure and layers) does not match its "
                              "checksum: the file changed after it was written (a disk, memory or copy error, or "
                              "an edit); use a good copy")


# --- paths and files at the edges -------------------------------------------------------------------

def test_paths_that_are_not_file_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = _mlp()
    for bad in (None, 123, b"model.safetensors"):
        with pytest.raises(TypeError, match=re.escape(
                "save: the path must be a str or a pathlib.Path naming a file (e.g. 'model.safetensors'), got "
                f"{type(bad).__name__} {bad!r}")):
            tf.save(bad, m)
        with pytest.raises(TypeError, match=re.escape(f"load: the path must be a str or a pathlib.Path naming a "
                                                      f"file (e.g. 'model.safetensors'), got {type(bad).__name__}")):
            tf.load(bad)
    with pytest.raises(TypeError, match=re.escape("(e.g. 'model.safetensors'), got Chain; the path comes first: "
                                                  "save(path, obj)")):
        tf.save(m, "model.safetensors")
    for call in (tf.save, tf.save_model):
        with pytest.raises(CheckpointError, match=re.escape(f"{call.__name__}: the path is empty (''); give a file "
                                                            "name such as 'model.safetensors'")):
            call("", m)
    with pytest.raises(CheckpointError, match=re.escape("load: the path is empty ('')")):
        tf.load("")
    assert os.listdir(tmp_path) == [] and not any(n.endswith(".tmp") for n in os.listdir(tmp_path.parent))


def test_a_read_only_folder(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    p = folder / "m.safetensors"
    tf.save(p, {"w": np.arange(3.0)})
    good = p.read_bytes()
    folder.chmod(0o555)
    try:
        if os.geteuid() == 0:     # root writes anyway: fail as the kernel does for everyone else
            def denied(*args, **kwargs):
                raise PermissionError(13, "Permission denied")
            monkeypatch.setattr(serialization.tempfile, "mkstemp", denied)
        with pytest.raises(CheckpointError, match=re.escape(
                f"save: cannot write {p}: cannot create a file in the folder {folder} (Permission denied); save to "
                "a folder you can write to. Nothing was written.")):
            tf.save(p, {"w": np.arange(5.0)})
    finally:
        folder.chmod(0o755)
    assert p.read_bytes() == good and os.listdir(folder) == ["m.safetensors"]


def test_saving_through_a_symbolic_link_writes_its_target(tmp_path):
    target = tmp_path / "runs" / "best.safetensors"
    target.parent.mkdir()
    tf.save(target, {"epoch": 1})
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    tf.save(link, {"epoch": 2})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert tf.load(target) == {"epoch": 2} and tf.load(link) == {"epoch": 2}
    assert sorted(os.listdir(target.parent)) == ["best.safetensors"]
    dangling = tmp_path / "new.safetensors"
    dangling.symlink_to(tmp_path / "runs" / "made.safetensors")
    tf.save(dangling, {"epoch": 3})
    assert dangling.is_symlink() and tf.load(tmp_path / "runs" / "made.safetensors") == {"epoch": 3}


@contextmanager
def _within(seconds):
    """Fail instead of hanging."""
    def hang(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_load_reads_regular_files_only(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with _within(10):
        assert _load_error(fifo) == (f"load: {fifo}: is a FIFO (named pipe), not a regular file; load reads "
                                     "checkpoint files only")
        for dev in ("/dev/zero", "/dev/urandom"):
            assert _load_error(dev) == f"load: {dev}: is a character device, not a regular file; load reads " \
                                       "checkpoint files only"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        assert _load_error(tmp_path / "sock") == (f"load: {tmp_path / 'sock'}: is a socket, not a regular file; "
                                                  "load reads checkpoint files only")
    finally:
        sock.close()
    # a header size larger than the file is refused before anything else is read
    big = tmp_path / "big.safetensors"
    big.write_bytes((2**40).to_bytes(8, "little") + b'{"a": 1}')
    assert _load_error(big) == (f"load: {big}: the file is truncated: its header says {2**40} header bytes but "
                                "the file has only 16 bytes")
    assert stat.S_ISREG(os.stat(big).st_mode)


def test_nesting_too_deep_to_read_or_write(tmp_path):
    deep = tmp_path / "deep.safetensors"
    header = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    deep.write_bytes(len(header).to_bytes(8, "little") + header)
    assert _load_error(deep) == (f"load: {deep}: the header is nested too deeply to read (the file is corrupt, "
                                 "or made to crash readers)")
    p = tmp_path / "f.safetensors"
    a = {"a": np.ones(2, np.float32)}
    assert "the structure is nested too deeply to read" in _load_error(_forged(p, a, "[" * 100_000 + "]" * 100_000))
    node = {"array": "a"}
    for _ in range(150):
        node = {"list": [node]}
    assert _load_error(_forged(p, a, node)) == (
        f"load: {p}: the structure is nested more than 100 levels deep at `{'[0]' * 101}` (the file is corrupt, or "
        "made to crash readers)")
    nested = []
    for _ in range(150):
        nested = [nested]
    with pytest.raises(CheckpointError, match=r"save: `(\[0\]){100}` is nested more than 100 levels deep; a "
                                              r"triflux file holds at most 100 levels of dicts, lists and tuples"):
        tf.save(p, nested)


def test_a_structure_that_contains_itself(tmp_path):
    p = tmp_path / "loop.safetensors"
    loop = {"w": np.ones(2), "more": []}
    loop["more"].append(loop)
    with pytest.raises(CheckpointError, match=re.escape(
            "save: `more[0]` is the dict at the top level again: the structure contains itself, and a triflux "
            "file holds trees")):
        tf.save(p, loop)
    chain = tf.Chain(tf.Dense(2, 2))
    chain.layers.append(chain)
    want = ("the structure contains itself: `layers[1]` is the Chain at the top level again (a model or a state "
            "must be a tree)")
    with pytest.raises(CheckpointError, match=re.escape("save: `model`: " + want)):
        tf.save(p, {"model": chain})
    with pytest.raises(tf.StructureError, match=re.escape(want)):
        state(chain)
    assert not p.exists()
