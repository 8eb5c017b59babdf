"""save_model / load_model / register_layer: a model file that restores
without the code that built the model, and never runs code from the file;
loadmodel's check that a model has the structure its state was saved from."""
import json

import numpy as np
import pytest
import safetensors.numpy

import triflux as tf
from triflux import models, ops
from triflux.errors import CheckpointError, StructureError
from triflux.functor import children, is_layer, leaves
from triflux.interop import Activation
from triflux.model_file import CONSTRUCTOR_ARGUMENTS, layer_states

from helpers import DEVICES, device, run_python


def _image_model():
    """Every built-in layer that takes (N, C, H, W) input, with options off their defaults."""
    return tf.Chain(
        tf.Conv((3, 3), 2, 4, tf.relu, pad=1),
        tf.Conv((3, 3), 4, 4, Activation(tf.leakyrelu, a=0.2), stride=2, pad=(1, 0), groups=2, bias=False),
        tf.BatchNorm(4, tf.tanh, eps=1e-3, momentum=0.2),
        tf.Dropout(0.25),
        tf.ConvTranspose((2, 2), 4, 6, tf.elu, stride=2, outpad=1, groups=2),
        tf.MaxPool((2, 2), stride=1, pad=1, dilation=(1, 2)),
        tf.MeanPool(2, ceil_mode=True, count_include_pad=False),
        tf.Upsample("bilinear", size=(5, 6), align_corners=True),
        tf.Upsample(2),
        tf.AdaptiveMaxPool((None, 4)),
        tf.AdaptiveMeanPool(3),
        tf.SkipConnection(tf.Conv((1, 1), 6, 6), ops.add),
        tf.Parallel(ops.mul, gmean=tf.GlobalMeanPool(), gmax=tf.GlobalMaxPool()),
        tf.flatten,
        tf.Dense(6, 3, tf.gelu, bias=False),
    )


def _models():
    """(model, inputs) pairs that together hold every built-in layer type, UNet and bfloat16."""
    tf.seed(0)
    img = _image_model()
    tf.trainmode(img)
    img(tf.randn(3, 2, 7, 7))              # moves the running statistics away from 0 and 1
    tf.trainmode(img, None)
    tf.testmode(img[2])                    # BatchNorm pinned to test mode, Dropout automatic
    trainmode_dropout = tf.Chain(tf.Dense(3, 3), tf.Dropout(0.5))
    tf.trainmode(trainmode_dropout[1])
    seq = tf.Chain(tf.RNN(3, 4, tf.relu), tf.LSTM(4, 5, return_state=False), tf.GRU(5, 2))
    cells = tf.Chain(rnn=tf.RNNCell(3, 4, tf.relu), lstm=tf.LSTMCell(3, 4), gru=tf.GRUCell(3, 4))
    low = tf.bf16(tf.Chain(tf.Dense(3, 4, tf.swish), tf.Dense(4, 2)))
    unet = models.UNet(3, 2, depth=2, base_channels=4)
    # the layers of every spatial rank and their options: 1-d, 3-d, pad_mode, Flux's names
    spatial = tf.Chain(tf.Conv((3,), 2, 4, pad=1, pad_mode="reflect"), tf.DepthwiseConv((3,), 4, 8, pad=(0, 2)),
                       tf.CrossCor((1,), 8, 8), tf.MaxPool((2,)), tf.Upsample("linear", scale=2))
    volume = tf.Chain(tf.Conv((2, 2, 2), 1, 8, pad=((0, 1), (1, 0), (0, 1))), tf.PixelShuffle(2),
                      tf.AdaptiveMeanPool((2, 3, 2)))
    unet3d = models.UNet(1, 2, depth=1, base_channels=2, spatial_dims=3)
    return [(img, tf.randn(2, 2, 7, 7)), (trainmode_dropout, None), (seq, tf.randn(2, 3, 3)),
            (cells, tf.randn(2, 3)), (low, tf.bf16(tf.randn(2, 3))), (unet, tf.randn(1, 3, 8, 8)),
            (spatial, tf.randn(2, 2, 6)), (volume, tf.randn(1, 1, 2, 3, 2)), (unet3d, tf.randn(1, 1, 2, 4, 2)),
            (_norm_model(), tf.randn(2, 4, 5, 6)),
            (tf.Chain(tf.Embedding(5, 3, padding_idx=0, scale_grad_by_freq=True), tf.Dense(3, 2)), _TOKENS),
            (tf.EmbeddingBag(6, 4, "max", padding_idx=2), _TOKENS),
            (tf.MultiHeadAttention((4, (6, 8), 7), nheads=2, bias=True, dropout_prob=0.25), tf.randn(2, 3, 4))]


#: (N, L) int64 indices for the embeddings (below 5)
_TOKENS = tf.tensor(np.array([[1, 0, 4], [4, 4, 2]], dtype=np.int64))


def _norm_model():
    """The per-sample normalisations with their options off the defaults: (N, 4, 5, 6) input."""
    norms = tf.Chain(
        tf.LayerNorm((5, 6), tf.relu, bias=False, eps=1e-3),
        tf.GroupNorm(4, 2, tf.tanh, eps=1e-4),
        tf.InstanceNorm(4, tf.sigmoid, affine=True, track_stats=True, eps=1e-4, momentum=0.3),
        tf.InstanceNorm(4, track_stats=True),
        tf.InstanceNorm(4, affine=True),
        tf.LayerNorm(6, affine=False),
        tf.GroupNorm(4, 4, affine=False),
        tf.RMSNorm((5, 6), eps=1e-6),
        tf.RMSNorm(6, affine=False),
    )
    for layer in norms.layers:                       # parameters off their ones and zeros
        for name in ("weight", "bias"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, tf.randn(*getattr(layer, name).shape))
    tf.trainmode(norms)
    norms(tf.randn(3, 4, 5, 6))                      # moves the running statistics away from 0 and 1
    tf.trainmode(norms, None)
    tf.testmode(norms[3])                            # one pinned to test mode, the other automatic
    return norms


#: the model whose outputs are compared on the interpreter's CUDA device too (the others' arrays are)
_ON_DEVICE = 4


def _outputs(model, x):
    if x is None:
        return []
    if isinstance(model, tf.Chain) and isinstance(model.layers, dict):   # the cells: one step each
        return [leaves(cell(x)) for cell in model.layers.values()]
    return [model(x)]


def _layers(x):
    """Every layer in ``x``, outermost first."""
    if is_layer(x):
        yield x
        x = children(x)
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _layers(v)


def test_the_registry_covers_every_builtin_layer():
    builtin = {getattr(tf.layers, n) for n in tf.layers.__all__}
    classes = {c for c in builtin if isinstance(c, type) and c is not tf.Layer}
    assert classes == set(CONSTRUCTOR_ARGUMENTS)
    used = {type(layer) for model, _ in _models() for layer in _layers(model)}
    assert classes <= used, classes - used


@pytest.mark.parametrize("dev", DEVICES)
def test_every_builtin_layer_and_unet_round_trip(tmp_path, dev):
    d = device(dev)
    for i, (model, x) in enumerate(_models()):
        model = d(model)
        p = tf.save_model(tmp_path / f"m{i}.safetensors", model)       # from any device, no cpu() first
        back = tf.load_model(p)
        assert repr(back) == repr(model)
        assert all(t.device == tf.cpu_device() for t in leaves(back))
        saved, loaded = tf.state(model), tf.state(back)
        for (where, a), (_, b) in zip(layer_states(saved), layer_states(loaded)):
            assert a.spec == b.spec, where                              # eps, momentum, modes, ... too
        for a, b in zip(leaves(saved), leaves(loaded)):                 # running statistics included
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        assert [getattr(a, "active", 0) for a in _layers(model)] == [getattr(b, "active", 0) for b in _layers(back)]
        back = d(back)
        assert leaves(back)[0].device == d
        if x is not None and (dev == "cpu" or i == _ON_DEVICE):
            for y, z in zip(_outputs(model, d(x)), _outputs(back, d(x))):
                for a, b in zip(leaves(y), leaves(z)):
                    np.testing.assert_array_equal(a.numpy(), b.numpy())


def _scale_class():
    class Scale(tf.Layer):
        """A user layer rebuilt from its attributes."""

        def __init__(self, n, offset=0.5):
            self.weight = tf.ones(n)
            self.offset = offset

        def __call__(self, x):
            return x * self.weight + self.offset

    return Scale


class Gate(tf.Layer):
    """A user layer rebuilt with its constructor, from get_config()."""

    def __init__(self, inner, activation):
        self.inner, self.activation = inner, activation

    def get_config(self):
        return {"inner": self.inner, "activation": self.activation}

    def __call__(self, x):
        return self.activation(self.inner(x))


def join(y, x):
    return tf.cat(y, x, dims=1)


def test_user_layers_and_functions_once_registered(tmp_path):
    Scale = _scale_class()
    model = tf.Chain(Scale(3), tf.SkipConnection(Gate(tf.Dense(3, 3), tf.relu), join))
    p = tmp_path / "user.safetensors"
    with pytest.raises(CheckpointError) as e:
        tf.save_model(p, model)
    msg = str(e.value)
    assert f"save_model: cannot describe the model, so nothing was written to {p}:" in msg
    assert f"`layers[0]` is a {__name__}._scale_class.<locals>.Scale, which is not a triflux layer: call " \
           "`triflux.register_layer(Scale)` before saving and before loading it (help(triflux.register_layer) " \
           "says what the class must provide)" in msg
    assert f"`layers[1].layer` is a {__name__}.Gate, which is not a triflux layer" in msg
    assert "`layers[1]` (SkipConnection): its `connection` is the function join, which is not one of " \
           "triflux's functions; call `triflux.register_layer(join)` before saving and before loading, so the " \
           "file can name it" in msg
    assert not p.exists()
    assert tf.register_layer(Scale) is Scale and tf.register_layer(Gate) is Gate
    assert tf.register_layer(join) is join and tf.register_layer(join) is join      # idempotent
    tf.save_model(p, model)
    back = tf.load_model(p)
    x = tf.randn(2, 3)
    np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())
    assert type(back[0]) is Scale and back[0].offset == 0.5 and back[1].connection is join
    # a fresh program that has not registered them is told what to do, and nothing runs
    r = run_python(f"""
        import triflux as tf
        try:
            tf.load_model({str(p)!r})
        except tf.CheckpointError as e:
            print(e)
        """, env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"load_model: {p}: `layers[0]` is a layer of type 'Scale', which this program has not registered: " \
           "if it is a class of your program, call `triflux.register_layer(Scale)` before load_model" in r.stdout


def test_register_layer_refuses_what_a_file_cannot_name():
    with pytest.raises(TypeError, match=r"register_layer: <lambda> needs a name the file can record; define it "
                                        r"with `def` or pass name='\.\.\.'"):
        tf.register_layer(lambda y, x: y)
    with pytest.raises(TypeError, match="register_layer: int is a class but not a layer"):
        tf.register_layer(int)
    with pytest.raises(TypeError, match="register_layer: expects a subclass of triflux.Layer or a function, got int"):
        tf.register_layer(3)

    class Dense(tf.Layer):
        pass

    with pytest.raises(ValueError, match=r"register_layer: the name 'Dense' is already triflux's; register Dense "
                                         r"under another one: register_layer\(Dense, name='\.\.\.'\)"):
        tf.register_layer(Dense)
    assert tf.register_layer(Dense, name="MyDense") is Dense


def test_lambdas_and_other_objects_are_refused_at_save_time(tmp_path):
    p = tmp_path / "m.safetensors"
    skip = tf.Chain(tf.Dense(2, 2), tf.SkipConnection(tf.Dense(2, 2), lambda y, x: tf.cat(y, x, dims=1)))
    with pytest.raises(CheckpointError, match=r"`layers\[1\]` \(SkipConnection\): its `connection` is the function "
                                              r"<lambda>, which is not one of triflux's functions; define it with "
                                              r"`def` and call `triflux.register_layer\(fn\)`"):
        tf.save_model(p, skip)
    with pytest.raises(TypeError, match="save_model: expects a model .a layer such as a Chain., got dict; save "
                                        "other data with `save.path, x.`"):
        tf.save_model(p, {"w": np.ones(2)})
    assert not p.exists()
    # `save` still writes it (the arrays, and what can be described); load_model then says what is missing
    tf.save(p, skip)
    with pytest.raises(CheckpointError, match=f"load_model: {p}: " + r"`layers\[1\]` \(SkipConnection\): its "
                                              "`connection` is the function <lambda>"):
        tf.load_model(p)
    tf.save(p, {"model": tf.state(skip[0])})
    with pytest.raises(CheckpointError, match=f"load_model: {p}: the file holds no description of a model"):
        tf.load_model(p)


def _rewrite_specs(path, edit):
    """The file at ``path`` with its layers' description edited (and no checksums, as an older file)."""
    with open(path, "rb") as f:
        data = f.read()
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    specs = json.loads(meta["layers"])
    edit(specs)
    meta = {k: v for k, v in meta.items() if k != "checksums"}
    meta["layers"] = json.dumps(specs)
    safetensors.numpy.save_file(tf.load(path, flat=True), str(path), metadata=meta)


def test_a_file_never_makes_load_model_run_code(tmp_path):
    p = tmp_path / "m.safetensors"
    model = tf.Chain(tf.Dense(3, 4, tf.relu), tf.Dense(4, 2))
    cases = [
        (lambda s: s["layers[0]"].update(type="os.system"),
         "`layers[0]` is a layer of type 'os.system', which this program has not registered: if it is a class of "
         "your program, call `triflux.register_layer(os.system)` before load_model"),
        (lambda s: s["layers[0]"]["kwargs"].update(activation={"function": "builtins.eval"}),
         "`layers[0]` uses the function 'builtins.eval', which this program has not registered: if it is a "
         "function of your program, call `triflux.register_layer(builtins.eval)` before load_model"),
        (lambda s: s["layers[0]"]["kwargs"].update(in_features="3; import os"),
         "the description of `layers[0]` does not build a Dense: "),
        (lambda s: s["layers[1]"]["kwargs"].update(out_features=3),
         "the saved arrays do not fit the layers the file describes (the file is corrupt or was edited): "
         "loadmodel: the state does not fit the model (2 problems):\n  `layers[1].weight`: shape mismatch, the "
         "model has (3, 4), the state has (2, 4)\n"),
        (lambda s: s[""]["args"].append({"child": ["layers", 7]}),
         "the description of the model names a child ['layers', 7] its state does not have (the file is "
         "corrupt or was edited)"),
        (lambda s: s[""]["args"].append({"code": "print(1)"}),
         "the description of the model holds {'code': 'print(1)'} (the file is corrupt or was edited)"),
    ]
    for edit, message in cases:
        tf.save_model(p, model)
        _rewrite_specs(p, edit)
        with pytest.raises(CheckpointError) as e:
            tf.load_model(p)
        assert f"load_model: {p}: " + message in str(e.value)


def _loadmodel_error(model, saved):
    with pytest.raises(StructureError) as e:
        tf.loadmodel(model, saved)
    assert "Nothing was loaded" in str(e.value)
    return str(e.value)


def test_loadmodel_says_how_the_structure_differs(tmp_path):
    tf.seed(1)
    model = tf.Chain(tf.Conv((3, 3), 1, 2, tf.relu, stride=2, pad=1), tf.BatchNorm(2), tf.relu,
                     tf.SkipConnection(tf.Dense(5, 5), ops.add))
    saved = tf.load(tf.save(tmp_path / "m.safetensors", model))
    tf.testmode(model)
    assert tf.loadmodel(model, saved) is model                          # the mode is not the structure
    other = tf.Chain(tf.Conv((3, 3), 1, 2, stride=1, pad=(1, 0)), tf.BatchNorm(2, eps=1e-3), tf.tanh,
                     tf.SkipConnection(tf.Dense(5, 5), ops.mul))
    before = [t.numpy() for t in leaves(other)]
    msg = _loadmodel_error(other, saved)
    assert "loadmodel: the state does not fit the model (4 problems):\n" in msg
    assert "  the top level: the model's Chain differs from the one saved: argument 2 is tanh in the model, relu " \
           "in the state\n" in msg
    assert "  `layers[0]`: the model's Conv differs from the one saved: `activation` is identity in the model, " \
           "relu in the state; `stride` is (1, 1) in the model, (2, 2) in the state; `pad` is (1, 1, 0, 0) in the " \
           "model, (1, 1, 1, 1) in the state\n" in msg
    assert "  `layers[1]`: the model's BatchNorm differs from the one saved: `eps` is 0.001 in the model, 1e-05 " \
           "in the state\n" in msg
    assert "  `layers[3]`: the model's SkipConnection differs from the one saved: `connection` is mul in the " \
           "model, add in the state\n" in msg
    assert all(np.array_equal(a, t.numpy()) for a, t in zip(before, leaves(other)))
    # a live model is compared the same way; a different layer type is named
    assert "`layers[0]`: the model has a Dense, the state was saved from a Conv" in _loadmodel_error(
        tf.Chain(tf.Dense(3, 3), tf.BatchNorm(2), tf.relu, tf.SkipConnection(tf.Dense(5, 5), ops.add)), model)


def test_a_torch_state_dict_is_named_as_such(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save(torch.nn.Linear(4, 16).state_dict(), tmp_path / "torch.pt")
    msg = _loadmodel_error(tf.Dense(4, 16), torch.load(tmp_path / "torch.pt", weights_only=True))
    assert "`weight`: the model has a Tensor of shape (16, 4) and dtype float32, the state has a torch.Tensor of " \
           "shape (16, 4)" in msg
    assert "The state holds torch.Tensors (a torch `state_dict`?): convert them to NumPy first, " \
           "`{k: v.detach().cpu().numpy() for k, v in state_dict.items()}`, nested as `state(model)` is, or " \
           "translate the torch module itself with `triflux.from_torch(module)`." in msg
