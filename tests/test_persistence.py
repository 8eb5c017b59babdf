"""triflux.persistence: state(x) as device-free NumPy data, loadmodel filling
models (and optimiser states) in place across devices, with checks that name
the field and leave the model untouched when they fail."""
import numpy as np
import pytest

import triflux as tf
from triflux import ops
from triflux.errors import StructureError
from triflux.functor import fmap, leaves
from triflux.optimise import Adam, Descent, Leaf, Momentum, setup, update
from triflux.persistence import loadmodel, state

from helpers import DEVICES, device


def _mlp(seed=0, d=None):
    tf.seed(seed)
    m = tf.Chain(tf.Dense(3, 4, tf.relu), tf.relu, tf.Dense(4, 2))
    return m if d is None else d(m)


def _values(m):
    return [a.copy() for a in leaves(state(m))]


def _same(a, b):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("dev", DEVICES)
def test_state_structure_and_copies(dev):
    d = device(dev)
    m = _mlp(d=d)
    s = state(m)
    assert list(s) == ["layers"] and len(s["layers"]) == 3
    assert set(s["layers"][0]) == {"weight", "bias"} and s["layers"][1] is None
    w = s["layers"][0]["weight"]
    assert type(w) is np.ndarray and w.shape == (4, 3) and w.dtype == np.float32
    np.testing.assert_array_equal(w, m[0].weight.numpy())
    w[...] = 0                                                   # a copy: the model is unaffected
    assert m[0].weight.numpy().any()
    # plain containers, Tensors and numbers
    lst = state([tf.ones(2), (3, None)])
    assert isinstance(lst, list) and type(lst[0]) is np.ndarray and lst[1] == [3, None]
    out = state({"a": tf.ones(2, device=d), "b": [np.zeros(1), 2.5]})
    assert type(out["a"]) is np.ndarray and out["b"][1] == 2.5


def test_bfloat16_stays_bfloat16():
    bf16 = tf.dtypes.bfloat16
    m = fmap(lambda t: ops.cast(t, bf16), _mlp())
    s = state(m)
    assert s["layers"][0]["weight"].dtype == bf16
    m2 = fmap(lambda t: ops.cast(t, bf16), _mlp(seed=5))
    loadmodel(m2, s)
    assert m2[0].weight.dtype == bf16
    np.testing.assert_array_equal(m2[0].weight.numpy().view(np.uint16), s["layers"][0]["weight"].view(np.uint16))
    if tf.functional("CUDA"):
        g = tf.CUDADevice(0)(fmap(lambda t: ops.cast(t, bf16), _mlp(seed=6)))
        loadmodel(g, s)
        assert g[2].bias.dtype == bf16 and g[2].bias.device == tf.CUDADevice(0)
        np.testing.assert_array_equal(state(g)["layers"][2]["weight"].view(np.uint16),
                                      s["layers"][2]["weight"].view(np.uint16))


@pytest.mark.parametrize("src_dev,dst_dev", [("cpu", "cpu"), ("cpu", "cuda"), ("cuda", "cpu")])
def test_loadmodel_across_devices_keeps_tensor_objects(src_dev, dst_dev):
    if "cuda" in (src_dev, dst_dev) and not tf.functional("CUDA"):
        pytest.skip("no functional CUDA backend")
    src, dst = _mlp(1, device(src_dev)), _mlp(2, device(dst_dev))
    ids = [id(t) for t in leaves(dst)]
    opt = setup(Momentum(), dst)                   # references dst's Tensors: must stay valid
    out = loadmodel(dst, state(src))
    assert out is dst
    assert [id(t) for t in leaves(dst)] == ids
    assert all(t.device == device(dst_dev) for t in leaves(dst))
    _same(state(dst), state(src))
    # the loaded storage is the model's own: changing the source later does not leak in
    update(setup(Descent(1.0), src), src,
           {"layers": [{"weight": tf.ones_like(src[0].weight), "bias": None}, None, None]})
    assert not np.array_equal(src[0].weight.numpy(), dst[0].weight.numpy())
    # and training the loaded model with the optimiser state set up before the load works
    x = tf.randn(2, 3, device=device(dst_dev))
    (g,) = tf.gradient(lambda m: m(x).sum(), dst)
    update(opt, dst, g)


def test_loadmodel_from_a_model_and_a_state_with_tensors():
    src, dst = _mlp(1), _mlp(2)
    loadmodel(dst, src)                                    # Flux's loadmodel!(dst, src model)
    _same(state(dst), state(src))
    assert dst[0].weight is not src[0].weight
    t = tf.zeros(2, 2)
    loadmodel(t, np.eye(2, dtype=np.float32))
    np.testing.assert_array_equal(t.numpy(), np.eye(2))


def _err(x, s):
    with pytest.raises(StructureError) as e:
        loadmodel(x, s)
    return str(e.value)


def test_errors_name_the_field_and_nothing_is_half_loaded():
    m = _mlp()
    before = _values(m)
    good = state(_mlp(3))
    # shape: layers[0] would load fine, layers[2].weight does not fit
    bad = state(_mlp(3))
    bad["layers"][2]["weight"] = np.zeros((5, 4), np.float32)
    msg = _err(m, bad)
    assert "`layers[2].weight`" in msg and "(2, 4)" in msg and "(5, 4)" in msg and "Nothing was loaded" in msg
    # dtype
    bad = state(_mlp(3))
    bad["layers"][0]["bias"] = bad["layers"][0]["bias"].astype(np.float64)
    msg = _err(m, bad)
    assert "`layers[0].bias`" in msg and "float32" in msg and "float64" in msg
    # missing and extra fields, list length, wrong kinds
    bad = state(_mlp(3))
    del bad["layers"][2]["bias"]
    assert "`layers[2].bias`: missing" in _err(m, bad)
    bad = state(_mlp(3))
    bad["layers"][0]["gamma"] = np.ones(4, np.float32)
    assert "`layers[0].gamma`: in the state but not in the model" in _err(m, bad)
    bad = state(_mlp(3))
    bad["layers"].pop()
    msg = _err(m, bad)
    assert "`layers`" in msg and "3" in msg and "2 entries" in msg
    bad = state(_mlp(3))
    bad["layers"][1] = {"weight": np.ones(2, np.float32)}
    assert "`layers[1]`" in _err(m, bad)
    assert "the top level" in _err(m, [1, 2])
    # several problems are all reported
    bad = state(_mlp(3))
    bad["layers"][0]["weight"] = np.zeros((1, 1), np.float32)
    bad["layers"][2]["bias"] = np.zeros(7, np.float32)
    msg = _err(m, bad)
    assert "2 problems" in msg and "layers[0].weight" in msg and "layers[2].bias" in msg
    # after all those failures the model is exactly as before
    for a, b in zip(_values(m), before):
        np.testing.assert_array_equal(a, b)
    loadmodel(m, good)
    _same(state(m), good)


def test_bias_false_and_none_entries():
    m = tf.Dense(3, 2, bias=False)
    s = state(m)
    assert set(s) == {"weight"}
    s["bias"] = None                                      # a None field is fine to carry
    loadmodel(m, s)
    msg = _err(tf.Dense(3, 2, bias=False), state(tf.Dense(3, 2)))
    assert "`bias`: in the state but not in the model" in msg


@pytest.mark.parametrize("dev", DEVICES)
def test_optimiser_state_roundtrip(dev):
    d = device(dev)
    m = _mlp(d=d)
    opt = setup(Adam(0.01), m)
    x = tf.randn(4, 3, device=d)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), m)
    update(opt, m, g)
    update(opt, m, g)
    s = state(opt)
    leaf = s["layers"][0]["weight"]
    assert leaf["rule"] == {"Adam": {"eta": 0.01, "beta": [0.9, 0.999], "epsilon": 1e-08}}
    mom, vel, t = leaf["state"]
    assert type(mom) is np.ndarray and mom.shape == (4, 3) and t == 2
    assert s["layers"][1] is None
    # into a fresh state on the other device (or the same): values, step and rule come back
    other = tf.CUDADevice(0) if dev == "cpu" and tf.functional("CUDA") else tf.cpu_device()
    m2 = _mlp(4, other)
    opt2 = setup(Adam(), m2)
    arrays = [id(a) for a in leaves(opt2)]
    loadmodel(opt2, s)
    l2 = opt2["layers"][0]["weight"]
    assert isinstance(l2, Leaf) and l2.rule == Adam(0.01) and l2.state[2] == 2
    assert [id(a) for a in leaves(opt2)] == arrays and l2.state[0].device == other
    _same(state(opt2), s)
    # a rule of another kind does not load
    msg = _err(setup(Momentum(), _mlp()), s)
    assert "`layers[0].weight.rule`" in msg and "Momentum" in msg and "Adam" in msg
    # nor does a wrong step count
    s["layers"][2]["bias"]["state"][2] = 1.5
    assert "`layers[2].bias.state[2]`" in _err(setup(Adam(), _mlp()), s)


def test_state_after_saved_file_like_roundtrip():
    """What a file format gives back (lists for tuples, 0-d arrays or floats
    for numbers) still loads."""
    m = _mlp()
    opt = setup(Adam(), m)
    s = state(opt)
    leaf = s["layers"][0]["weight"]
    leaf["state"][2] = np.asarray(3)
    leaf["rule"]["Adam"]["eta"] = np.asarray(0.002)
    leaf["rule"]["Adam"]["beta"] = np.array([0.8, 0.9])
    loadmodel(opt, s)
    lf = opt["layers"][0]["weight"]
    assert lf.state[2] == 3 and isinstance(lf.state[2], int) and lf.rule == Adam(0.002, (0.8, 0.9))


# --- resuming a training run exactly --------------------------------------------------------------

_TRAIN = '''
import numpy as np
import triflux as tf
from triflux.losses import mse


def make(dev, seed):
    tf.seed(seed)
    m = tf.Chain(tf.Conv((3, 3), 1, 2, pad=1), tf.BatchNorm(2, tf.relu), tf.flatten, tf.Dense(2 * 5 * 5, 3))
    return dev(m)


def batches(dev, k0, k1):
    """Batch i is a function of i alone: the data order needs no RNG state."""
    out = []
    for i in range(k0, k1):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((4, 1, 5, 5)).astype(np.float32)
        y = rng.standard_normal((4, 3)).astype(np.float32)
        out.append((dev(tf.tensor(x)), dev(tf.tensor(y))))
    return out


def run(m, opt, dev, k0, k1):
    return tf.train(lambda mm, x, y: mse(mm(x), y), m, batches(dev, k0, k1), opt)
'''


@pytest.mark.parametrize("dev", DEVICES)
def test_resume_in_a_new_process_continues_exactly(tmp_path, dev):
    """k steps, save model + optimiser state, load both into a fresh model and
    optimiser in another process, go on: bit-identical to never stopping."""
    from helpers import run_python
    k, n = (3, 3) if dev == "cpu" else (2, 2)    # the interpreter is slow
    ns = {}
    exec(_TRAIN, ns)
    d = device(dev)
    m = ns["make"](d, 1)
    opt = setup(Adam(0.01), m)
    ns["run"](m, opt, d, 0, k)
    ck = tf.save(tmp_path / "ck.safetensors", {"model": m, "opt": opt, "step": k})
    ns["run"](m, opt, d, k, k + n)                    # the uninterrupted run
    out = str(tmp_path / "resumed.safetensors")
    dev_expr = "tf.cpu_device()" if dev == "cpu" else "tf.CUDADevice(0)"
    r = run_python(_TRAIN + f'''
d = {dev_expr}
ck = tf.load({ck!r})
m = make(d, 99)                                   # a different initialisation, overwritten by the load
opt = tf.setup(tf.Adam(), m)                      # default hyperparameters, restored by the load
tf.loadmodel(m, ck["model"])
tf.loadmodel(opt, ck["opt"])
run(m, opt, d, ck["step"], ck["step"] + {n})
tf.save({out!r}, {{"model": m, "opt": opt}})
''')
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = tf.load(out)
    want_m, want_o = state(m), state(opt)
    assert len(leaves(want_m)) == 8                   # conv w/b, BN gamma/beta/mean/var, dense w/b
    _same(resumed["model"], want_m)                   # bit-identical (assert_array_equal on every array)
    _same(resumed["opt"], want_o)
    assert resumed["opt"]["layers"][0]["weight"]["state"][2] == k + n
    assert resumed["opt"]["layers"][3]["bias"]["rule"]["Adam"]["eta"] == 0.01


def test_failed_optimiser_load_changes_nothing():
    m = _mlp()
    opt = setup(Adam(0.01), m)
    x = tf.randn(4, 3)
    (g,) = tf.gradient(lambda mm: mm(x).sum(), m)
    update(opt, m, g)
    before = state(opt)
    src = setup(Adam(0.5), _mlp(2))
    for _ in range(3):
        update(src, m, g)
    bad = state(src)
    bad["layers"][2]["bias"]["state"][1] = np.zeros(3, np.float32)    # the last leaf does not fit
    msg = _err(opt, bad)
    assert "`layers[2].bias.state[1]`" in msg and "(2,)" in msg and "(3,)" in msg
    after = state(opt)
    _same(after, before)                                              # the moments are untouched
    for path in (("layers", 0, "weight"), ("layers", 2, "bias")):
        a, b = after, before
        for p in path:
            a, b = a[p], b[p]
        assert a["rule"] == b["rule"] and a["state"][2] == b["state"][2] == 1   # rules and step counts too


def test_a_saved_rule_is_rebuilt_through_its_checks(tmp_path):
    """A file whose rule has beta1 = 1 (every later step would divide by zero) is refused."""
    m = _mlp()
    saved = state(setup(Adam(0.01), m))
    saved["layers"][0]["weight"]["rule"] = {"Adam": {"eta": 0.01, "beta": [1.0, 0.999], "epsilon": 1e-8}}
    opt = setup(Adam(0.02), m)
    msg = _err(opt, tf.load(tf.save(tmp_path / "opt.safetensors", saved)))
    assert "`layers[0].weight.rule`: Adam: beta[0]" in msg and "must be in [0, 1), got 1.0" in msg
    assert opt["layers"][0]["weight"].rule == Adam(0.02)
