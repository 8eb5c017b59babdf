"""MixedPrecision: float16 / bfloat16 models trained with float32 master
weights and (for float16) dynamic loss scaling, on both devices; its state
saves, loads and resumes like any optimiser state; f16/bf16/f32/f64 keep
integer arrays."""
import numpy as np
import pytest

import triflux as tf
from triflux.errors import GradientError, StructureError
from triflux.functor import leaves
from triflux.losses import mse
from triflux.optimise import (Adam, Descent, Leaf, MixedPrecision, MixedPrecisionState, Momentum, adjust, setup,
                              train, update)
from triflux.persistence import loadmodel, state

from helpers import DEVICES, device

BF16 = tf.dtypes.bfloat16


def _mlp(d, width=16):
    tf.seed(0)
    return d(tf.Chain(tf.Dense(4, width, tf.tanh), tf.Dense(width, width, tf.relu), tf.Dense(width, 2)))


def _data(d, n=32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], 1).astype(np.float32)
    return d(tf.tensor(x)), d(tf.tensor(y))


def _loss(m, x, y):
    return mse(tf.f32(m(x)), y)         # the loss in float32 (the model computes in its own dtype)


@pytest.mark.parametrize("dtype,rtol", [("float16", 0.03), ("bfloat16", 0.08)])
@pytest.mark.parametrize("dev", DEVICES)
def test_low_precision_training_tracks_float32(dev, dtype, rtol):
    """Loss curves of MixedPrecision(Adam) on a float16 / bfloat16 model stay
    within `rtol` (relative, every step) of the float32 run from the same
    initialisation (measured: 1% for float16, 3% for bfloat16 over 40 steps)."""
    d = device(dev)
    steps, width = (30, 16) if dev == "cpu" else (3, 8)   # the interpreter is slow
    x, y = _data(d)
    m32 = _mlp(d, width)
    o32 = setup(Adam(1e-2), m32)
    ref = [train(_loss, m32, [(x, y)], o32)[0] for _ in range(steps)]
    m = _mlp(d, width)
    w = [t for t in leaves(m)]
    opt = setup(MixedPrecision(Adam(1e-2), dtype), m)
    assert isinstance(opt, MixedPrecisionState)
    assert [id(t) for t in leaves(m)] == [id(t) for t in w]        # converted in place
    assert all(t.dtype.name == dtype and t.device == d for t in leaves(m))
    master = opt["tree"]["layers"][0]["weight"].state[0]
    assert master.dtype == np.float32 and master.device == d
    xl = tf.f16(x) if dtype == "float16" else tf.bf16(x)
    got = [train(_loss, m, [(xl, y)], opt)[0] for _ in range(steps)]
    ref, got = np.array(ref), np.array(got)
    assert got[-1] < got[0]
    np.testing.assert_allclose(got, ref, rtol=rtol)
    # the model holds its master weights rounded to its dtype
    mw = opt["tree"]["layers"][2]["weight"].state[0].numpy()
    np.testing.assert_array_equal(m[2].weight.numpy().view(np.uint16), mw.astype(m[2].weight.dtype).view(np.uint16))
    np.testing.assert_allclose(mw, m32[2].weight.numpy(), atol=0.05)
    sc = opt["scaler"]
    if dtype == "float16":
        assert sc == {"scale": 2.0 ** 16, "growth_tracker": steps, "dynamic": True}
    else:
        assert sc == {"scale": 1.0, "growth_tracker": 0, "dynamic": False}


def _snapshot(m, opt):
    return [a.copy() for a in leaves(state(m))], [a.copy() for a in leaves(state(opt))], state(opt)


@pytest.mark.parametrize("dev", DEVICES)
def test_overflow_skips_the_step_and_halves_the_scale(dev):
    d = device(dev)
    x, y = _data(d, 8)
    m = _mlp(d, 4)
    opt = setup(MixedPrecision(Adam(1e-2), "float16", init_scale=2.0 ** 40), m)
    before_m, before_o, before_s = _snapshot(m, opt)
    (g,) = tf.gradient(lambda mm: opt.scale(_loss(mm, x, tf.f16(y))), m)
    assert not np.isfinite(g["layers"][2]["weight"].numpy()).all()    # 2**40 overflows float16
    update(opt, m, g)
    assert opt.last_step_skipped
    after_m, after_o, after_s = _snapshot(m, opt)
    for a, b in zip(after_m + after_o, before_m + before_o):
        np.testing.assert_array_equal(a, b)                           # parameters, masters, moments
    assert after_s["tree"]["layers"][0]["weight"]["state"][1][2] == 0  # Adam's step count did not move
    assert opt["scaler"] == {"scale": 2.0 ** 39, "growth_tracker": 0, "dynamic": True}
    # a fixed huge scale skips as well but keeps its scale
    m2 = _mlp(d, 4)
    opt2 = setup(MixedPrecision(Descent(0.1), "float16", loss_scale=2.0 ** 30), m2)
    w = m2[0].weight.numpy()
    train(_loss, m2, [(tf.f16(x), y)], opt2)
    assert opt2.last_step_skipped and opt2["scaler"]["scale"] == 2.0 ** 30
    np.testing.assert_array_equal(m2[0].weight.numpy(), w)


def test_scale_grows_after_good_steps_and_bf16_needs_no_scaling():
    d = tf.cpu_device()
    x, y = _data(d, 8)
    m = _mlp(d, 4)
    opt = setup(MixedPrecision(Adam(1e-3), "float16", init_scale=8.0, growth_interval=2), m)
    train(_loss, m, [(tf.f16(x), y)] * 3, opt)
    assert opt["scaler"] == {"scale": 16.0, "growth_tracker": 1, "dynamic": True}
    mb = _mlp(d, 4)
    ob = setup(MixedPrecision(Adam(1e-3), BF16), mb)
    assert ob.loss_scale == 1.0 and not ob["scaler"]["dynamic"]
    (g,) = tf.gradient(lambda mm: _loss(mm, tf.bf16(x), y), mb)     # no opt.scale needed at scale 1
    w = mb[0].weight.numpy()
    update(ob, mb, g)
    assert not np.array_equal(mb[0].weight.numpy().view(np.uint16), w.view(np.uint16))
    # an explicit dynamic scale for bfloat16, and dtype=None (the model's own dtype)
    assert setup(MixedPrecision(Adam(), BF16, "dynamic"), _mlp(d, 4))["scaler"]["dynamic"]
    m16 = tf.f16(_mlp(d, 4))
    o16 = setup(MixedPrecision(Adam()), m16)
    assert o16["scaler"]["dynamic"] and m16[0].weight.dtype == np.float16
    assert o16["tree"]["layers"][0]["weight"].state[0].dtype == np.float32


def test_forgetting_to_scale_the_loss_is_an_error():
    d = tf.cpu_device()
    x, y = _data(d, 8)
    m = _mlp(d, 4)
    opt = setup(MixedPrecision(Adam(), "float16"), m)
    (g,) = tf.gradient(lambda mm: _loss(mm, tf.f16(x), y), m)
    w = m[0].weight.numpy()
    with pytest.raises(GradientError, match=r"opt_state.scale\(loss\)"):
        update(opt, m, g)
    np.testing.assert_array_equal(m[0].weight.numpy(), w)
    (g,) = tf.gradient(lambda mm: opt.scale(_loss(mm, tf.f16(x), y)), m)
    update(opt, m, g)
    assert not np.array_equal(m[0].weight.numpy(), w)
    with pytest.raises(GradientError):                 # once per update
        update(opt, m, g)
    # the tree alone (without the scaler) is refused
    (g,) = tf.gradient(lambda mm: opt.scale(_loss(mm, tf.f16(x), y)), m)
    with pytest.raises(StructureError, match="MixedPrecision"):
        update(opt["tree"], m, g)
    with pytest.raises(TypeError):
        MixedPrecision(MixedPrecision(Adam()))
    with pytest.raises(TypeError):
        MixedPrecision(Adam(), "int32")
    with pytest.raises(ValueError):
        MixedPrecision(Adam(), "float16", loss_scale=-1)


def test_adjust_reaches_the_inner_rule():
    m = _mlp(tf.cpu_device(), 4)
    opt = setup(MixedPrecision(Adam(1e-3), "float16"), m)
    adjust(opt, 0.5, beta=(0.8, 0.9))
    leaf = opt["tree"]["layers"][1]["bias"]
    assert leaf.rule.rule == Adam(0.5, (0.8, 0.9)) and leaf.rule.dtype == np.float16
    with pytest.raises(TypeError):
        adjust(opt, rho=0.3)


def test_state_save_load_and_resume_exactly(tmp_path):
    d = tf.cpu_device()
    x, y = _data(d, 8)
    data = [(tf.f16(x), y)]
    m = _mlp(d, 4)
    opt = setup(MixedPrecision(Adam(1e-2), "float16", init_scale=2.0 ** 20, growth_interval=3), m)
    train(_loss, m, data * 3, opt)                    # some skipped steps: the scale moves
    p = tf.save(tmp_path / "mp.safetensors", {"model": m, "opt": opt})
    s = state(opt)
    leaf = s["tree"]["layers"][0]["weight"]
    assert leaf["rule"]["MixedPrecision"]["rule"] == {"Adam": {"eta": 0.01, "beta": [0.9, 0.999], "epsilon": 1e-08}}
    assert leaf["rule"]["MixedPrecision"]["dtype"] == "float16" and leaf["state"][0].dtype == np.float32
    ck = tf.load(p)
    assert ck["opt"]["scaler"] == opt["scaler"]
    train(_loss, m, data * 4, opt)                    # the uninterrupted run
    m2 = _mlp(d, 4)
    opt2 = setup(MixedPrecision(Adam(), "float16"), m2)
    loadmodel(m2, ck["model"])
    loadmodel(opt2, ck["opt"])
    assert opt2["tree"]["layers"][0]["weight"].rule == MixedPrecision(Adam(1e-2), "float16", init_scale=2.0 ** 20,
                                                                      growth_interval=3)
    train(_loss, m2, data * 4, opt2)
    for a, b in zip(leaves(state(m2)) + leaves(state(opt2)), leaves(state(m)) + leaves(state(opt))):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert opt2["scaler"] == opt["scaler"]
    # the wrong inner rule, or a plain state, does not load (and loads nothing)
    with pytest.raises(StructureError, match=r"MixedPrecision\(Momentum\).*MixedPrecision\(Adam\)"):
        loadmodel(setup(MixedPrecision(Momentum(), "float16"), _mlp(d, 4)), ck["opt"])
    with pytest.raises(StructureError, match="MixedPrecisionState"):
        loadmodel(opt2, state(setup(Adam(), _mlp(d, 4))))
    bad = tf.load(p)["opt"]
    bad["scaler"]["scale"] = -1.0
    before = opt2["scaler"]
    with pytest.raises(StructureError, match="scale"):
        loadmodel(opt2, bad)
    assert opt2["scaler"] is before


def test_mixed_state_moves_between_devices():
    if not tf.functional("CUDA"):
        pytest.skip("no functional CUDA backend")
    m = _mlp(tf.cpu_device(), 4)
    opt = setup(MixedPrecision(Adam(), "float16"), m)
    g = tf.CUDADevice(0)(opt)
    assert isinstance(g, MixedPrecisionState) and g["scaler"] == opt["scaler"]
    assert isinstance(g["tree"]["layers"][0]["weight"], Leaf)
    assert g["tree"]["layers"][0]["weight"].state[0].device == tf.CUDADevice(0)
    loadmodel(g, state(opt))                                           # a CPU state into a GPU one
    assert isinstance(tf.cpu(g), MixedPrecisionState)


@pytest.mark.parametrize("conv", [tf.f16, tf.bf16, tf.f32, tf.f64])
def test_precision_conversions_keep_integer_arrays(conv):
    x = {"ints": np.arange(3, dtype=np.int32), "long": tf.tensor(np.arange(4)), "mask": np.array([True, False]),
         "labels": tf.tensor(np.array([1, 0], np.int32)), "w": np.ones(2, np.float32), "t": tf.ones(2),
         "layer": tf.Dense(2, 2)}
    y = conv(x)
    assert y["ints"].dtype == np.int32 and y["long"].dtype == np.int64 and y["mask"].dtype == np.bool_
    assert y["labels"].dtype == np.int32
    np.testing.assert_array_equal(y["long"].numpy(), np.arange(4))
    want = {tf.f16: "float16", tf.bf16: "bfloat16", tf.f32: "float32", tf.f64: "float64"}[conv]
    assert y["w"].dtype.name == want and y["t"].dtype.name == want and y["layer"].weight.dtype.name == want
