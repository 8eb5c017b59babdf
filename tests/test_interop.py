"""PyTorch interop (from_torch / to_torch) and DLPack exchange.

Converted models give torch's outputs and gradients (parameters and input)
on both devices, in training and in eval mode; round trips keep state_dicts;
unsupported modules and layers are named with their path; tensors cross
through DLPack without copies where the device allows."""
import copy
import operator
from collections import OrderedDict

import numpy as np
import pytest

import triflux as tf
from triflux import interop
from helpers import DEVICES, device, run_python

torch = pytest.importorskip("torch")
nn = torch.nn


# --- helpers ----------------------------------------------------------------------------------

def _grad_of(gtree, tmodel, name):
    """The triflux gradient of torch parameter ``name`` ("0.block.2.weight")
    in the gradient tree of ``from_torch(tmodel)``."""
    *mods, leaf = name.split(".")
    node, mod = gtree, tmodel
    for p in mods:
        if isinstance(mod, nn.Sequential):
            node = node["layers"]
            node = node[int(p)] if isinstance(node, list) else node[p]
        else:
            node = node[p]
        mod = getattr(mod, p)
    return node[leaf]


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _randomise_bn(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.3)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.randn(mod.num_features, generator=g))
                mod.bias.copy_(torch.randn(mod.num_features, generator=g))


def _compare(tmodel, x_np, dev, *, rtol=2e-4, atol=2e-5, **kw):
    """from_torch(tmodel) on ``dev`` against a float64 copy of ``tmodel``:
    output, loss gradients w.r.t. every parameter and the input, and the
    running statistics after the step (training mode)."""
    d = device(dev)
    model = tf.from_torch(tmodel, device=d, **kw)
    oracle = copy.deepcopy(tmodel).double()
    y_shape = oracle(torch.from_numpy(x_np.astype(np.float64))).shape
    r_np = _x(*y_shape, seed=7)
    x = d(x_np)
    r = d(r_np)
    y = model(x) if tmodel.training is False else None
    loss, (g, gx) = tf.withgradient(lambda m, x: (m(x) * r).sum(), model, x)
    oracle = copy.deepcopy(tmodel).double()
    tx = torch.from_numpy(x_np.astype(np.float64)).requires_grad_()
    ty = oracle(tx)
    tloss = (ty * torch.from_numpy(r_np.astype(np.float64))).sum()
    tloss.backward()
    np.testing.assert_allclose(float(loss), tloss.item(), rtol=rtol, atol=atol)
    if y is not None:
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)
    n = 0
    for name, p in oracle.named_parameters():
        gp = _grad_of(g, tmodel, name)
        assert gp is not None, name
        assert gp.device == d
        np.testing.assert_allclose(gp.numpy(), p.grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
        n += 1
    assert n == len(list(tmodel.parameters()))
    tstate = oracle.state_dict()
    for name, v in tf.to_torch(model).state_dict().items():   # running statistics moved alike
        if "running" in name:
            np.testing.assert_allclose(v.numpy(), tstate[name].numpy(), rtol=rtol, atol=atol, err_msg=name)
    return model


def _cnn(dropout=True):
    torch.manual_seed(0)
    layers = [nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
              nn.Conv2d(4, 4, 3, padding="same", dilation=2, groups=2, bias=False), nn.Sigmoid(),
              nn.Upsample(scale_factor=2, mode="bilinear"),
              nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), nn.Tanh(),
              nn.Upsample(scale_factor=2), nn.AvgPool2d(3, stride=2, padding=1),
              nn.MaxPool2d(3, stride=4, padding=1), nn.Flatten(), nn.Linear(3 * 3 * 3, 5),
              nn.GELU(approximate="tanh")]
    if dropout:
        layers.append(nn.Dropout(0.3))
    layers += [nn.LeakyReLU(0.2), nn.Linear(5, 4), nn.Softmax(dim=1)]
    m = nn.Sequential(*layers)
    _randomise_bn(m)
    return m


def _named():
    torch.manual_seed(1)
    m = nn.Sequential(OrderedDict([
        ("stem", nn.Sequential(nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0)), nn.BatchNorm2d(3),
                               nn.SiLU(), nn.ConvTranspose2d(3, 4, 2, stride=2, groups=1, bias=False), nn.ELU(0.5))),
        ("pool", nn.AdaptiveAvgPool2d(1)),
        ("flat", nn.Flatten()),
        ("head", nn.Sequential(nn.Linear(4, 6), nn.Softplus(), nn.Identity(), nn.Linear(6, 3, bias=False),
                               nn.LogSoftmax(dim=-1))),
    ]))
    _randomise_bn(m, 2)
    return m


def _mlp():
    """The model of seed 003: input 7 -> hidden 6 (tanh) -> output 1."""
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 1))


# --- from_torch: outputs and gradients -------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_seed_mlp_matches_torch(dev):
    m = _mlp()
    model = _compare(m, _x(5, 7), dev)
    assert repr(model).startswith("Chain(\n  Dense(7 => 6),")
    assert isinstance(model[0], tf.Dense) and model[1] is tf.tanh


@pytest.mark.parametrize("dev", DEVICES)
def test_cnn_eval_mode_matches_torch(dev):
    m = _cnn().eval()
    model = _compare(m, _x(2, 2, 6, 6), dev)
    assert model[1].active is False and model[15].active is False    # pinned to test mode
    assert model[1].running_mean.device == device(dev)


@pytest.mark.parametrize("dev", DEVICES)
def test_cnn_train_mode_matches_torch(dev):
    m = _cnn(dropout=False).train()
    model = _compare(m, _x(3, 2, 6, 6), dev)
    assert model[1].active is None          # training inside gradient, test outside (Flux's automatic mode)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_named_nested_model_matches_torch(dev, mode):
    m = _named().train(mode == "train")
    model = _compare(m, _x(2, 2, 5, 4), dev)
    assert list(model.layers) == ["stem", "pool", "flat", "head"]
    assert isinstance(model["stem"], tf.Chain) and model["pool"].__class__ is tf.GlobalMeanPool


def test_pin_modes_runs_training_behaviour_outside_gradient():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.Dropout(0.0)).train()
    x = _x(4, 2, 3, 3) + 1
    auto, pinned = tf.from_torch(m), tf.from_torch(m, pin_modes=True)
    assert auto[1].active is None and pinned[1].active is True and pinned[2].active is True
    want = m(torch.from_numpy(x)).detach().numpy()          # torch in training mode: the batch's statistics
    np.testing.assert_allclose(pinned(x).numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pinned[1].running_mean.numpy(), m[1].running_mean.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(auto(x).numpy(), want, atol=1e-2)   # automatic: test behaviour outside gradient
    assert all(mod.training for mod in tf.to_torch(pinned).modules())


def test_float64_and_bfloat16_kept():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 2)).double()
    model = tf.from_torch(m)
    assert model[0].weight.dtype == np.float64
    x = np.random.default_rng(0).standard_normal((4, 3))
    np.testing.assert_allclose(model(x).numpy(), m(torch.from_numpy(x)).detach().numpy(), rtol=1e-12)
    mb = nn.Linear(3, 2).to(torch.bfloat16)
    lb = tf.from_torch(mb)
    assert lb.weight.dtype == tf.bfloat16
    assert torch.equal(tf.to_torch(lb).weight, mb.weight)


def test_parameters_are_copies():
    m = _mlp()
    model = tf.from_torch(m)
    with torch.no_grad():
        m[0].weight.add_(1)
    assert not np.allclose(model[0].weight.numpy(), m[0].weight.detach().numpy())


def test_softmax_without_dim_follows_torch():
    m = nn.Softmax()
    f = tf.from_torch(m)
    for shape in [(5,), (2, 3), (2, 3, 4), (2, 3, 2, 2)]:
        x = _x(*shape)
        with pytest.warns(UserWarning):
            want = m(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(f(tf.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dev", DEVICES)
def test_exact_gelu_is_gelu_erf_both_ways(dev):
    """torch's default GELU() is the exact (erf) GELU: triflux's gelu_erf,
    outputs and gradients as torch's, and back to GELU(approximate='none')."""
    torch.manual_seed(3)
    tmodel = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2), nn.GELU(approximate="tanh"))
    model = _compare(tmodel, _x(5, 3) * 3, dev)
    assert model[1] is tf.gelu_erf and model[3] is tf.gelu
    assert "gelu_erf" in repr(model)
    back = tf.to_torch(model)
    assert isinstance(back[1], nn.GELU) and back[1].approximate == "none"
    assert isinstance(back[3], nn.GELU) and back[3].approximate == "tanh"
    assert back.state_dict().keys() == tmodel.state_dict().keys()


def test_approximate_gelu_flag_still_gives_the_tanh_form():
    f = tf.from_torch(nn.GELU(), approximate_gelu=True)
    assert f is tf.gelu
    x = np.linspace(-4, 4, 81).astype(np.float32)
    np.testing.assert_allclose(f(tf.tensor(x)).numpy(), nn.GELU()(torch.from_numpy(x)).numpy(), atol=1e-3)


@pytest.mark.parametrize("dev", DEVICES)
def test_dense_with_gelu_erf_matches_torch(dev):
    """Dense(3, 4, gelu_erf) on each device: to_torch gives Linear + GELU(), same outputs and gradients."""
    tf.seed(0)
    d = device(dev)
    model = d(tf.Dense(3, 4, tf.gelu_erf))
    assert "gelu_erf" in repr(model)
    t = tf.to_torch(model).double()
    assert isinstance(t[1], nn.GELU) and t[1].approximate == "none"
    x = _x(6, 3) * 2
    loss, (g, gx) = tf.withgradient(lambda m, x: m(x).sum(), model, d(x))
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    tloss = t(tx).sum()
    tloss.backward()
    np.testing.assert_allclose(float(loss), tloss.item(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g["weight"].numpy(), t[0].weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g["bias"].numpy(), t[0].bias.grad.numpy(), rtol=1e-5, atol=1e-6)


# --- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("module, pattern", [
    (nn.Sequential(nn.Linear(2, 2), nn.LSTMCell(2, 2)),
     r"model\.1 \(torch\.nn\.LSTMCell\) is not supported yet; supported: Sequential, Linear"),
    (nn.LSTM(2, 3, bidirectional=True), r"model \(torch\.nn\.LSTM\): bidirectional=True"),
    (nn.LSTM(2, 3, proj_size=2), r"proj_size=2"),
    (nn.GRU(2, 3, bias=False), r"bias=False"),
    (nn.Sequential(OrderedDict(block=nn.Sequential(nn.ReLU(), nn.Hardtanh()))),
     r"model\.block\.1 \(torch\.nn\.Hardtanh\) is not supported yet"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.PixelUnshuffle(2)),
     r"model\.1 \(torch\.nn\.PixelUnshuffle\) is not supported yet"),
    (nn.BatchNorm2d(2, affine=False), r"model \(torch\.nn\.BatchNorm2d\): affine=False"),
    (nn.BatchNorm2d(2, track_running_stats=False), r"track_running_stats=False"),
    (nn.BatchNorm2d(2, momentum=None), r"momentum=None"),
    (nn.MaxPool2d(2, return_indices=True), r"return_indices=True"),
    (nn.AdaptiveMaxPool2d(2, return_indices=True), r"return_indices=True"),
    (nn.AvgPool2d(3, padding=1, divisor_override=2), r"divisor_override=2"),
    (nn.Upsample(scale_factor=1.5, recompute_scale_factor=True), r"recompute_scale_factor=True.*size="),
    (nn.Upsample(size=(4, 4), mode="nearest-exact"), r"nearest-exact"),
    (nn.Upsample(scale_factor=2, mode="bicubic"), r"mode='bicubic'"),
    (nn.Flatten(0), r"start_dim=0"),
    (nn.Softplus(beta=2), r"beta=2"),
    (nn.ModuleList([nn.ReLU()]), r"model \(torch\.nn\.ModuleList\) is not supported yet"),
])
def test_unsupported_modules_are_named(module, pattern):
    with pytest.raises(tf.TrifluxError, match=pattern):
        tf.from_torch(module)


def test_custom_module_is_refused_with_its_class():
    class Block(nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(ValueError, match=r"model\.0 \(.*Block\) is not supported yet"):
        tf.from_torch(nn.Sequential(Block()))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tf.from_torch(tf.Dense(2, 2))


def test_to_torch_unsupported_layers_are_named():
    m = tf.Chain(tf.Dense(2, 2), tf.Parallel(operator.add, tf.Dense(2, 2), tf.Dense(2, 2)))
    with pytest.raises(tf.TrifluxError, match=r"model\.layers\[1\] \(triflux\.layers\.containers\.Parallel\)"):
        tf.to_torch(m)
    skip = tf.SkipConnection(tf.Dense(2, 2), lambda y, x: tf.cat([y, x], axis=1))
    with pytest.raises(tf.TrifluxError, match=r"model\.layers\[0\] \(SkipConnection with connection.*only `\+`"):
        tf.to_torch(tf.Chain(skip))
    with pytest.raises(tf.TrifluxError, match=r"asymmetric pad=\(0, 1, 0, 1\)"):
        tf.to_torch(tf.Conv((2, 2), 1, 1, pad=(0, 1, 0, 1), stride=2))
    with pytest.raises(tf.TrifluxError, match=r"function <lambda>"):
        tf.to_torch(tf.Chain(tf.Dense(2, 2), lambda x: x))


# --- to_torch and round trips -----------------------------------------------------------------

@pytest.mark.parametrize("make", [_mlp, _cnn, _named])
def test_round_trip_keeps_state_dict_and_modes(make):
    m = make()
    m.train()
    x = torch.from_numpy(_x(2, 2, 6, 6) if make is _cnn else _x(2, 2, 5, 4) if make is _named else _x(2, 7))
    m(x)                                                    # moves the running statistics and num_batches_tracked
    m.eval()
    back = tf.to_torch(tf.from_torch(m))
    assert type(back) is nn.Sequential
    a, b = m.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert [type(x) for x in m.modules()] == [type(x) for x in back.modules()]
    stateful = (nn.Dropout, nn.BatchNorm2d)
    if any(isinstance(x, stateful) for x in m.modules()):   # eval mode carried over, the whole tree
        assert [x.training for x in back.modules()] == [False] * len(list(m.modules()))
    else:                                                   # nothing to carry: torch's default
        assert all(x.training for x in back.modules())
    with torch.no_grad():
        assert torch.equal(m(x), back(x))


@pytest.mark.parametrize("dev", DEVICES)
def test_to_torch_of_triflux_model_matches(dev):
    tf.seed(0)
    model = tf.Chain(tf.Conv((3, 3), 2, 3, tf.relu, pad=1), tf.BatchNorm(3, tf.sigmoid),
                     tf.SkipConnection(tf.Conv((3, 3), 3, 3, pad="same"), operator.add),
                     tf.MeanPool(2), tf.Upsample(2, mode="bilinear"), tf.GlobalMeanPool(), tf.flatten,
                     tf.Dense(3, 4, tf.gelu), tf.Dense(4, 3, tf.swish), tf.Dense(3, 2, tf.softmax))
    tf.testmode(model)
    d = device(dev)
    model = d(model)
    t = tf.to_torch(model)
    assert isinstance(t[2], interop.TorchSkipConnection)
    assert all(p.device.type == "cpu" for p in t.parameters())   # the CPU, or the interpreter's memory
    x = _x(2, 2, 4, 4)
    np.testing.assert_allclose(model(d(x)).numpy(), t(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    back = tf.from_torch(t)
    assert isinstance(back[0], tf.Chain) and back[0][1] is tf.relu      # activations came back as layers
    assert isinstance(back[2], tf.SkipConnection) and back[2].connection is operator.add
    np.testing.assert_allclose(back(x).numpy(), t(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_conversion_table_names_torch_modules_and_lists_every_layer():
    """Each Conversion names torch modules that exist, and to_torch's refusal
    lists the triflux side of every entry it translates."""
    for c in interop.CONVERSIONS:
        for name in c.torch:
            assert issubclass(interop.torch_modules.torch_class(name), nn.Module), name
    with pytest.raises(tf.TrifluxError) as e:
        tf.to_torch(tf.Parallel(operator.add, tf.Dense(2, 2)))
    for c in interop.CONVERSIONS:
        for key in c.triflux if c.to_torch else ():
            assert key.__module__.startswith(interop.__name__ + ".") or key.__name__ in str(e.value), key


def test_importing_triflux_does_not_import_torch():
    r = run_python("""
        import sys
        import triflux
        from triflux import from_torch, to_torch, from_dlpack, to_dlpack
        assert "torch" not in sys.modules
        import numpy as np
        t = from_dlpack(np.arange(3.0))          # NumPy producers need no torch
        assert "torch" not in sys.modules and t.device == triflux.cpu_device()
        print("OK")
    """, unset=("TRITON_INTERPRET",))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


# --- DLPack ---------------------------------------------------------------------------------------

def test_from_dlpack_cpu_shares_memory():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x = tf.from_dlpack(t)
    assert x.device == tf.cpu_device() and x.shape == (2, 3) and x.dtype == np.float32
    t[0, 1] = 42                                # write through torch, read through triflux
    assert x.numpy()[0, 1] == 42
    np.asarray(x)[1, 2] = -1                    # and the other way
    assert t[1, 2] == -1
    a = np.arange(4.0)
    y = tf.from_dlpack(a)
    a[0] = 7
    assert y.dtype == np.float64 and y.numpy()[0] == 7
    tt = t.T                                    # strided views keep their strides
    z = tf.from_dlpack(tt)
    assert z.shape == (3, 2) and np.shares_memory(np.asarray(z), np.asarray(x))
    np.testing.assert_array_equal(z.numpy(), tt.numpy())


def test_from_dlpack_bfloat16_without_copy():
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    x = tf.from_dlpack(t)
    assert x.dtype == tf.bfloat16
    t[1] = 5
    assert float(x.numpy()[1]) == 5.0
    a = np.zeros(2, dtype=tf.bfloat16)            # NumPy cannot export it, but it is host memory already
    y = tf.from_dlpack(a)
    a[0] = 3
    assert y.dtype == tf.bfloat16 and float(y.numpy()[0]) == 3.0


def test_from_dlpack_capsule_and_errors():
    t = torch.ones(3)
    x = tf.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    t[0] = 3
    assert x.numpy()[0] == 3
    with pytest.raises(TypeError, match="__dlpack__"):
        tf.from_dlpack([1, 2, 3])
    with pytest.raises(tf.DTypeError):
        tf.from_dlpack(torch.ones(2, dtype=torch.complex64))


@pytest.mark.parametrize("dev", DEVICES)
def test_from_dlpack_to_a_device(dev):
    d = device(dev)
    t = torch.arange(4, dtype=torch.float32)
    x = tf.from_dlpack(t, device=d)
    assert x.device == d
    t[2] = 9
    if tf.backend.interpreter_on() or d.is_cpu:  # the interpreter's device memory is host memory: shared
        assert x.numpy()[2] == 9
        y = tf.from_dlpack(np.arange(3.0, dtype=np.float32), device=d)
        assert y.device == d
    np.testing.assert_array_equal((x * 2).numpy(), t.numpy() * 2)   # kernels (or NumPy) compute on it


class _Producer:
    """An object other than a Tensor exporting ``t`` through its DLPack protocol."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("dev", DEVICES)
def test_to_dlpack_shares_memory(dev):
    d = device(dev)
    x = d(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = torch.from_dlpack(tf.to_dlpack(x))
    assert t.shape == (2, 3) and t.dtype == torch.float32
    t[0, 0] = 11                                 # write through torch, read through triflux
    assert x.numpy()[0, 0] == 11
    kind, idx = x.__dlpack_device__()
    assert kind == (interop.kDLCPU if d.is_cpu or tf.backend.interpreter_on() else interop.kDLCUDA)

    if kind == interop.kDLCPU:
        a = np.from_dlpack(_Producer(x))
        a[1, 1] = -3
        assert x.numpy()[1, 1] == -3
    back = tf.from_dlpack(_Producer(x), device=d)
    assert back.device == d
    np.testing.assert_array_equal(back.numpy(), x.numpy())


def test_to_dlpack_bfloat16():
    x = tf.tensor(np.array([1.0, 2.0], np.float32)).astype(tf.bfloat16)
    t = torch.from_dlpack(tf.to_dlpack(x))
    assert t.dtype == torch.bfloat16
    t[0] = 4
    assert float(x.numpy()[0]) == 4.0
    with pytest.raises(TypeError):
        tf.to_dlpack(np.zeros(2))


def test_cupy_exchange():
    cp = pytest.importorskip("cupy")
    a = cp.arange(4, dtype=cp.float32)
    x = tf.from_dlpack(a)
    assert isinstance(x.device, tf.CUDADevice)
    a[0] = 5
    assert x.numpy()[0] == 5
    b = cp.from_dlpack(_Producer(x))
    assert float(b[0]) == 5


def test_jax_exchange():
    jnp = pytest.importorskip("jax.numpy")
    a = jnp.arange(4.0, dtype=jnp.float32)
    x = tf.from_dlpack(a)
    np.testing.assert_array_equal(x.numpy(), np.arange(4.0))
    import jax
    b = jax.dlpack.from_dlpack(_Producer(tf.tensor(np.arange(3, dtype=np.float32))))
    np.testing.assert_array_equal(np.asarray(b), np.arange(3))


# --- recurrent layers -------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU", "RNN-relu", "LSTM-2-layers"])
def test_recurrent_modules_match_torch(kind, dev):
    """nn.RNN/LSTM/GRU (batch_first) become triflux's layers of the same name:
    the same output sequence and the same gradients for every weight and the input."""
    torch.manual_seed(0)
    name, _, extra = kind.partition("-")
    kw = {"nonlinearity": "relu"} if extra == "relu" else {"num_layers": 2} if extra == "2-layers" else {}
    rnn = getattr(nn, name)(3, 4, batch_first=True, **kw)
    model = tf.from_torch(rnn, device=device(dev))
    assert isinstance(model, tf.Chain) == (extra == "2-layers")
    x = _x(2, 5, 3)
    oracle = copy.deepcopy(rnn).double()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out = oracle(xt)[0]
    out.pow(2).sum().backward()
    xd = device(dev)(x)
    y, (g, gx) = tf.withgradient(lambda m, x: (m(x) ** 2).sum(), model, xd)
    np.testing.assert_allclose(model(xd).numpy(), out.detach().numpy(), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(gx.numpy(), xt.grad.numpy(), rtol=2e-4, atol=2e-5)
    layers = g["layers"] if extra == "2-layers" else [g]
    for k, lg in enumerate(layers):
        for field in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            want = getattr(oracle, f"{field}_l{k}").grad.numpy()
            np.testing.assert_allclose(lg[field].numpy(), want, rtol=2e-4, atol=2e-5, err_msg=f"{k} {field}")


@pytest.mark.parametrize("make", [lambda: tf.Chain(tf.LSTM(3, 4), tf.Dense(4, 1)),
                                  lambda: tf.Chain(tf.GRU(3, 4), tf.RNN(4, 2, tf.relu))])
def test_recurrent_round_trip_and_torch_chaining(make):
    """to_torch gives TorchSequence modules that chain in nn.Sequential as the
    triflux layers chain in Chain; from_torch maps them back weight for weight."""
    tf.seed(3)
    model = make()
    tmod = tf.to_torch(model)
    x = _x(2, 6, 3)
    np.testing.assert_allclose(tmod(torch.from_numpy(x)).detach().numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    back = tf.from_torch(tmod)
    for a, b in zip(tf.functor.leaves(model), tf.functor.leaves(back)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert "rnn.weight_ih_l0" in tmod[0].state_dict() or "0.rnn.weight_ih_l0" in tmod.state_dict()


def test_recurrent_with_return_state_does_not_go_to_torch():
    with pytest.raises(tf.TrifluxError, match="return_state=True"):
        tf.to_torch(tf.LSTM(2, 3, return_state=True))


# --- pooling and upsampling options ---------------------------------------------------------------

POOL_MODULES = [
    lambda: nn.MaxPool2d((3, 2), padding=1, dilation=(1, 2), ceil_mode=True),
    lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
    lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    lambda: nn.AvgPool2d((4, 4), stride=(2, 3), padding=1, ceil_mode=True),
    lambda: nn.AdaptiveAvgPool2d((5, 3)), lambda: nn.AdaptiveAvgPool2d((None, 2)), lambda: nn.AdaptiveAvgPool2d(1),
    lambda: nn.AdaptiveMaxPool2d(4), lambda: nn.AdaptiveMaxPool2d((3, None)), lambda: nn.AdaptiveMaxPool2d((1, 1)),
    lambda: nn.Upsample(size=(5, 9)), lambda: nn.Upsample(scale_factor=(1.7, 0.6)),
    lambda: nn.Upsample(scale_factor=1.5, mode="bilinear"),
    lambda: nn.Upsample(size=11, mode="bilinear", align_corners=True),
    lambda: nn.UpsamplingBilinear2d(scale_factor=2), lambda: nn.UpsamplingNearest2d(size=(3, 4)),
    lambda: nn.Upsample(scale_factor=3, mode="nearest-exact"),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("make", POOL_MODULES)
def test_pool_and_upsample_options_match_torch(make, dev):
    """from_torch keeps dilation, ceil_mode, count_include_pad, adaptive output sizes (None
    sides too), sizes, non-integer scale factors and align_corners: the same outputs and input
    gradients on each device; to_torch gives the module back (same outputs again)."""
    m = make()
    d = device(dev)
    layer = d(tf.from_torch(m))
    x = _x(2, 3, 7, 8) * 2
    y, (gx,) = tf.withgradient(lambda x: (layer(x) ** 2).sum(), d(x))
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    tloss = (m(tx) ** 2).sum()
    tloss.backward()
    np.testing.assert_allclose(float(y), tloss.item(), rtol=1e-5)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=repr(layer))
    back = tf.to_torch(layer)
    np.testing.assert_allclose(back(torch.from_numpy(x)).numpy(), m(torch.from_numpy(x)).numpy(),
                               rtol=1e-6, atol=1e-6, err_msg=f"{m} -> {layer} -> {back}")


def test_pool_and_upsample_layers_round_trip():
    for layer in (tf.MaxPool(3, stride=2, pad=1, dilation=2, ceil_mode=True),
                  tf.MeanPool(2, pad=1, ceil_mode=True, count_include_pad=False),
                  tf.AdaptiveMaxPool((3, None)), tf.AdaptiveMeanPool(4), tf.GlobalMaxPool(), tf.GlobalMeanPool(),
                  tf.Upsample("bilinear", size=(6, 7), align_corners=True), tf.Upsample("nearest", scale=(2, 1.5))):
        back = tf.from_torch(tf.to_torch(layer))
        assert type(back) is type(layer) and repr(back) == repr(layer), (layer, back)


# --- per-sample normalisations ----------------------------------------------------------------

def _randomise_norm(m, seed=4):
    """Every parameter and running statistic of ``m`` off its ones and zeros (variances positive)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            if name.endswith("num_batches_tracked"):
                t.fill_(3)
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g))
    return m


#: (torch module, input shape): every option the per-sample normalisations convert
NORM_MODULES = [
    (lambda: nn.LayerNorm((5, 6)), (2, 4, 5, 6)),
    (lambda: nn.LayerNorm(6, eps=1e-3, bias=False), (3, 4, 6)),
    (lambda: nn.LayerNorm((4, 5, 6), elementwise_affine=False), (2, 4, 5, 6)),
    (lambda: nn.GroupNorm(2, 4), (2, 4, 5, 6)),
    (lambda: nn.GroupNorm(4, 4, eps=1e-3, affine=False), (2, 4, 7)),
    (lambda: nn.InstanceNorm1d(4, affine=True), (3, 4, 7)),
    (lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True, momentum=0.3), (3, 4, 5, 6)),
    (lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True, momentum=0.3).eval(), (3, 4, 5, 6)),
    (lambda: nn.InstanceNorm3d(4, track_running_stats=True), (2, 4, 3, 2, 3)),
    (lambda: nn.InstanceNorm2d(4), (2, 4, 5, 6)),
    (lambda: nn.RMSNorm(6), (3, 4, 6)),
    (lambda: nn.RMSNorm((5, 6), eps=1e-4), (2, 4, 5, 6)),
    (lambda: nn.RMSNorm(6, elementwise_affine=False), (3, 6)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", range(len(NORM_MODULES)),
                         ids=[f"{make().__class__.__name__}-{i}" for i, (make, _) in enumerate(NORM_MODULES)])
def test_normalisation_modules_match_torch(case, dev):
    """nn.LayerNorm, GroupNorm, InstanceNorm1d/2d/3d and RMSNorm become triflux's
    layers: torch's outputs, gradients (parameters and input) and, in training
    mode, moved running statistics on each device; to_torch gives the module back."""
    make, shape = NORM_MODULES[case]
    m = _randomise_norm(make())
    x = _x(*shape) * 2 + 0.5
    model = _compare(m, x, dev)
    kind = {nn.LayerNorm: tf.LayerNorm, nn.GroupNorm: tf.GroupNorm, nn.RMSNorm: tf.RMSNorm}.get(type(m),
                                                                                                tf.InstanceNorm)
    assert type(model) is kind
    back = tf.to_torch(tf.from_torch(m))
    assert type(back) is type(m) and back.training == m.training and repr(back) == repr(m)
    a, b = m.state_dict(), back.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_normalisation_round_trip_keeps_state_dict_modes_and_dtype():
    """A model of them (trained a step, then in eval mode; float64) comes back with torch's classes,
    state_dict (num_batches_tracked included), modes and outputs; a triflux model of them as well."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv1d(2, 4, 3), nn.LayerNorm(5), nn.GroupNorm(2, 4), nn.ReLU(),
                      nn.InstanceNorm1d(4, affine=True, track_running_stats=True), nn.RMSNorm((4, 5)),
                      nn.InstanceNorm1d(4)).double()
    x = torch.from_numpy(_x(3, 2, 7).astype(np.float64))
    m.train()(x)                                           # moves the running statistics and num_batches_tracked
    m.eval()
    model = tf.from_torch(m)
    assert model[4].weight.dtype == np.float64 and model[4].active is False and model[4].track_stats
    back = tf.to_torch(model)
    assert [type(x) for x in m.modules()] == [type(x) for x in back.modules()]
    a, b = m.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert not any(x.training for x in back.modules())
    with torch.no_grad():
        assert torch.equal(m(x), back(x))
    np.testing.assert_allclose(model(x.numpy()).numpy(), m(x).detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dev", DEVICES)
def test_to_torch_of_triflux_normalisations_matches(dev):
    """Triflux's layers with their activations go to torch as (module, activation); an InstanceNorm's
    class follows the rank of the layer before it (1d after a Conv((3,)), 3d after a 3-d Conv, else 2d)."""
    tf.seed(6)
    d = device(dev)
    model = tf.Chain(tf.Conv((3, 3), 2, 4, pad=1), tf.LayerNorm((5, 6), tf.relu, bias=False, eps=1e-3),
                     tf.GroupNorm(4, 2, tf.tanh), tf.InstanceNorm(4, tf.sigmoid, affine=True, track_stats=True),
                     tf.RMSNorm(6, eps=1e-6), tf.InstanceNorm(4), tf.LayerNorm(6, affine=False))
    for layer in model.layers[1:]:
        for name in ("weight", "bias", "running_mean"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, tf.rand(*getattr(layer, name).shape) + 0.5)
    tf.testmode(model)
    model = d(model)
    t = tf.to_torch(model)
    assert [type(x) for x in t[1]] == [nn.LayerNorm, nn.ReLU] and t[1][0].bias is None
    assert [type(x) for x in t[3]] == [nn.InstanceNorm2d, nn.Sigmoid] and not t[3][0].training
    assert type(t[4]) is nn.RMSNorm and t[4].eps == 1e-6 and type(t[6]) is nn.LayerNorm
    x = _x(2, 2, 5, 6)
    with torch.no_grad():
        want = t(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model(d(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    back = tf.from_torch(t)
    np.testing.assert_allclose(back(x).numpy(), want, rtol=1e-5, atol=1e-5)
    for conv, cls in ((tf.Conv((3,), 2, 4), nn.InstanceNorm1d), (tf.Conv((1, 1, 1), 2, 4), nn.InstanceNorm3d),
                      (tf.Dense(2, 4), nn.InstanceNorm1d)):
        assert type(tf.to_torch(tf.Chain(conv, tf.InstanceNorm(4)))[1]) is cls
    assert type(tf.to_torch(tf.InstanceNorm(4))) is nn.InstanceNorm2d


@pytest.mark.parametrize("module, pattern", [
    (nn.InstanceNorm2d(2, track_running_stats=True, momentum=None),
     r"model \(torch\.nn\.InstanceNorm2d\): momentum=None \(a cumulative average\) is not supported by triflux; "
     r"give a number, e.g. momentum=0.1"),
    (nn.Sequential(nn.GroupNorm(2, 4, bias=False)),
     r"model\.0 \(torch\.nn\.GroupNorm\): affine=True with bias=False .*; use bias=True, or affine=False"),
    (nn.InstanceNorm1d(2, affine=True, bias=False), r"affine=True with bias=False"),
])
def test_unsupported_normalisation_options_are_named(module, pattern):
    with pytest.raises(tf.InteropError, match=pattern):
        tf.from_torch(module)


# --- embedding tables --------------------------------------------------------------------------

def _embedding_modules():
    g = torch.Generator().manual_seed(3)
    emb = nn.Embedding(7, 4, padding_idx=2, scale_grad_by_freq=True)
    bags = [nn.EmbeddingBag(7, 4, mode=mode, padding_idx=padding) for mode, padding in
            (("sum", None), ("mean", 1), ("max", None))]
    for m in [emb] + bags:
        with torch.no_grad():
            m.weight.copy_(torch.randn(m.weight.shape, generator=g))   # the padding row too: kept as it is
    return [emb] + bags


@pytest.mark.parametrize("dev", DEVICES)
def test_embedding_tables_convert_both_ways(dev):
    """nn.Embedding and nn.EmbeddingBag (each mode, padding_idx, scale_grad_by_freq) from
    torch: the same output and the same weight gradient as torch's on a (B, L) index batch
    with repeats and the padding index; to_torch gives back an equal module."""
    d = device(dev)
    idx = np.array([[1, 2, 5, 1], [6, 6, 0, 2]], dtype=np.int64)
    for tmod in _embedding_modules():
        model = tf.from_torch(tmod, device=d)
        assert model.weight.device == d
        r = _x(*tmod(torch.from_numpy(idx)).shape, seed=5)
        loss, (g,) = tf.withgradient(lambda m: (m(d(idx)) * d(r)).sum(), model)
        oracle = copy.deepcopy(tmod).double()
        tloss = (oracle(torch.from_numpy(idx)) * torch.from_numpy(r.astype(np.float64))).sum()
        tloss.backward()
        np.testing.assert_allclose(float(loss), tloss.item(), rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(g["weight"].numpy(), oracle.weight.grad.numpy(), rtol=2e-5, atol=2e-6)
        back = tf.to_torch(tf.cpu(model))
        assert type(back) is type(tmod)
        for name in ("num_embeddings", "embedding_dim", "padding_idx", "scale_grad_by_freq"):
            assert getattr(back, name) == getattr(tmod, name), name
        if isinstance(tmod, nn.EmbeddingBag):
            assert (back.mode, back.include_last_offset) == (tmod.mode, tmod.include_last_offset)
        assert torch.equal(back.weight, tmod.weight)


def test_embedding_max_norm_is_refused():
    with pytest.raises(tf.InteropError, match="max_norm"):
        tf.from_torch(nn.Embedding(5, 3, max_norm=1.0))
    with pytest.raises(tf.InteropError, match="max_norm"):
        tf.from_torch(nn.EmbeddingBag(5, 3, max_norm=1.0))
