"""What an eager step remembers between steps, and that it never goes stale.

An eager training step repeats the same decisions every step, so triflux
remembers them: a model's skeleton (``triflux.skeleton``: its leaves and
shape, for ``gradient`` and ``update``), a layer's checked options (Conv's
stride, padding, ...), the optimiser's table of parameters (the rows kept,
the gradients' addresses written in) and the kernels' host plans (per
layout). Each is checked here to follow the model when it changes, and every
error for bad input to be raised as before once the caches are warm, before
anything changes.
"""
import gc

import numpy as np
import pytest

import triflux as tf
from triflux import functor, skeleton
from triflux.errors import DeviceMismatchError, ShapeError, StructureError
from triflux.optimise import Adam, Descent, setup, update

from helpers import DEVICES, device


def _mlp(d):
    return d(tf.Chain(tf.Dense(3, 4), tf.Dense(4, 2)))


def _loss(m, x):
    return (m(x) * m(x)).sum()


def _step(model, opt, x):
    _, (g,) = tf.withgradient(lambda m: _loss(m, x), model)
    update(opt, model, g)
    return g


# --- the skeleton ------------------------------------------------------------------------------

def test_a_skeleton_is_kept_while_the_model_is_unchanged():
    model = _mlp(tf.cpu_device())
    first = skeleton.skeleton(model)
    assert skeleton.skeleton(model) is first
    assert [id(t) for t in first.leaves] == [id(t) for t in functor.leaves(model)]
    assert skeleton.skeleton([model]) is None and skeleton.skeleton(tf.ones(2)) is None   # layers only


@pytest.mark.parametrize("change", ["setattr", "append", "replace item", "behind the layer's back", "new child"])
def test_a_skeleton_follows_every_change_of_structure(change):
    model = _mlp(tf.cpu_device())
    first = skeleton.skeleton(model)
    new = tf.Dense(2, 2)
    if change == "setattr":
        model.layers[0].weight = tf.ones(4, 3)
    elif change == "append":
        model.layers.append(new)
    elif change == "replace item":
        model.layers[1] = tf.Dense(4, 2)
    elif change == "behind the layer's back":            # as a collective that writes a child in place
        object.__setattr__(model.layers[0], "weight", tf.ones(4, 3))
    else:
        model.layers[1].bias = None
        model.layers[1].bias = tf.zeros(2)
    again = skeleton.skeleton(model)
    assert again is not first
    assert [id(t) for t in again.leaves] == [id(t) for t in functor.leaves(model)]


@pytest.mark.parametrize("dev", DEVICES)
def test_gradients_follow_a_replaced_parameter(dev):
    d = device(dev)
    model, x = _mlp(d), d(np.ones((2, 3), np.float32))
    tf.gradient(lambda m: _loss(m, x), model)                 # warm
    model.layers[1].weight = d(tf.full((2, 4), 0.5))
    (g,) = tf.gradient(lambda m: _loss(m, x), model)
    (g_fresh,) = tf.gradient(lambda m: _loss(m, x), tf.fmap(lambda t: t, model))   # a new object: no skeleton yet
    np.testing.assert_array_equal(g["layers"][1]["weight"].numpy(), g_fresh["layers"][1]["weight"].numpy())


# --- the optimiser's plan ----------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_update_errors_are_the_same_once_warm(dev):
    d = device(dev)
    model, x = _mlp(d), d(np.ones((2, 3), np.float32))
    opt = setup(Adam(1e-2), model)
    g = _step(model, opt, x)                                  # warm: skeleton, plan, tables
    before = [t.numpy() for t in functor.leaves(model)]
    bad = {"layers": [dict(g["layers"][0], weight=d(tf.ones(3, 3))), g["layers"][1]]}
    with pytest.raises(StructureError, match=r"layers\[0\]\.weight` has shape \(3, 3\)"):
        update(opt, model, bad)
    extra = {"layers": [dict(g["layers"][0], scale=None), g["layers"][1]]}
    with pytest.raises(StructureError, match=r"field\(s\) \['scale'\]"):
        update(opt, model, extra)
    if dev == "cuda":
        moved = {"layers": [dict(g["layers"][0], weight=tf.cpu(g["layers"][0]["weight"])), g["layers"][1]]}
        with pytest.raises(DeviceMismatchError, match=r"layers\[0\]\.weight"):
            update(opt, model, moved)
    for a, b in zip(before, functor.leaves(model)):           # nothing changed
        np.testing.assert_array_equal(a, b.numpy())


def test_update_takes_what_the_careful_walk_converts():
    model, x = _mlp(tf.cpu_device()), np.ones((2, 3), np.float32)
    opt = setup(Descent(0.5), model)
    g = _step(model, opt, x)
    w = model.layers[0].weight.numpy()
    as_numpy = {"layers": [dict(g["layers"][0], weight=g["layers"][0]["weight"].numpy()), {"weight": None}]}
    update(opt, model, as_numpy)                              # a NumPy gradient and a missing field
    np.testing.assert_allclose(model.layers[0].weight.numpy(), w - 0.5 * g["layers"][0]["weight"].numpy())


@pytest.mark.parametrize("dev", DEVICES)
def test_update_follows_a_replaced_layer(dev):
    d = device(dev)
    model, x = _mlp(d), d(np.ones((2, 3), np.float32))
    opt = setup(Descent(0.1), model)
    _step(model, opt, x)
    model.layers[1] = d(tf.Dense(4, 2))                        # a new layer, then a new optimiser state for it
    opt = setup(Descent(0.1), model)
    w = model.layers[1].weight.numpy()
    _step(model, opt, x)
    assert not np.array_equal(w, model.layers[1].weight.numpy())


def test_a_tied_parameter_steps_once_with_a_warm_plan():
    dense = tf.Dense(2, 2)
    model = tf.Chain(dense, dense)
    opt = setup(Descent(1.0), model)
    x = np.ones((1, 2), np.float32)
    for _ in range(2):
        w = dense.weight.numpy()
        _, (g,) = tf.withgradient(lambda m: m(x).sum(), model)
        total = g["layers"][0]["weight"].numpy()
        update(opt, model, g)
        np.testing.assert_allclose(dense.weight.numpy(), w - total, rtol=1e-6)


# --- a layer's checked options -----------------------------------------------------------------

def test_conv_options_are_checked_again_after_a_change():
    conv = tf.Conv((3, 3), 1, 2, pad=1)
    x = np.ones((1, 1, 6, 6), np.float32)
    assert conv(x).shape == (1, 2, 6, 6)
    conv.stride = (2, 2)                                      # a set attribute drops the checked options
    assert conv(x).shape == (1, 2, 3, 3)
    conv.stride = 0
    with pytest.raises(ShapeError, match="Conv: stride must be a positive int"):
        conv(x)
    conv.stride, conv.pad = (1, 1), (0, 0, 0, 0)
    with pytest.raises(ShapeError, match=r"Conv\(\(3, 3\), 1 => 2.*smaller than the kernel's extent 3"):
        conv(np.ones((1, 1, 2, 6), np.float32))               # the spec finds it, the layer says it


# --- the optimiser's table and the kernels' host plans -------------------------------------------

def _kernels():
    dev = [p for p in DEVICES if p.id == "cuda"][0]
    if dev.marks:
        pytest.skip("no functional CUDA backend")
    from triflux.triton_kernels import optimise as ko
    return ko, device("cuda")


def test_the_update_table_checks_new_gradients():
    import torch
    ko, d = _kernels()
    xs = [d(tf.ones(3, 2))._data, d(tf.ones(4))._data]
    ms, vs = [torch.zeros_like(t) for t in xs], [torch.zeros_like(t) for t in xs]
    gs = [torch.ones_like(t) for t in xs]
    hp = dict(eta=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8, step=1)
    ko.adam_update_foreach(xs, gs, ms, vs, **hp)              # the rows, kept
    with pytest.raises(ShapeError, match="gradient has shape"):
        ko.adam_update_foreach(xs, [torch.ones(2, 3), gs[1]], ms, vs, **hp)
    strided = torch.ones(2, 3).t()                            # not dense: the rows are built again
    before = xs[0].clone()
    ko.adam_update_foreach(xs, [strided, gs[1]], ms, vs, **dict(hp, step=2))
    assert not torch.equal(before, xs[0])


def test_a_kept_table_is_dropped_with_its_tensors():
    import torch
    ko, d = _kernels()
    xs = [d(tf.ones(5))._data]
    ko.descent_update_foreach(xs, [torch.ones(5)], eta=0.1)
    layout = ko._LAST_LAYOUT["descent_update"]
    assert not layout.void
    del xs
    gc.collect()
    assert layout.void                                       # its id may be reused: never matched again


def test_a_conv_host_plan_is_made_once_per_layout():
    ko, d = _kernels()
    from triflux.triton_kernels import conv as kc
    conv, x = d(tf.Conv((3, 3), 2, 3, pad=1)), d(np.ones((1, 2, 5, 5), np.float32))
    conv(x)
    hits = kc._gather_plan.cache_info().hits
    conv(x)
    assert kc._gather_plan.cache_info().hits == hits + 1
    conv(d(np.ones((2, 2, 5, 5), np.float32)))                 # another batch: another plan
    assert kc._gather_plan.cache_info().hits == hits + 1


def test_a_copied_model_walks_its_own_skeleton():
    import copy
    model, x = _mlp(tf.cpu_device()), np.ones((2, 3), np.float32)
    tf.gradient(lambda m: _loss(m, x), model)                 # the original keeps a skeleton
    for twin in (copy.deepcopy(model), copy.copy(model), tf.fmap(lambda t: t * 1.0, model)):
        shape = skeleton.skeleton(twin)
        assert shape is not skeleton.skeleton(model)
        assert [id(t) for t in shape.leaves] == [id(t) for t in functor.leaves(twin)]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_dropped_model_is_freed_at_once(dev):
    import weakref
    d = device(dev)
    model, x = _mlp(d), d(np.ones((2, 3), np.float32))
    opt = setup(Adam(1e-2), model)
    _step(model, opt, x)                                      # skeleton, checked options, plans: all kept
    weight = weakref.ref(model.layers[0].weight)
    gc.disable()
    try:
        del model, opt
        assert weight() is None                               # by reference counting, no collector needed
    finally:
        gc.enable()
