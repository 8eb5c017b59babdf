"""RNN, LSTM, GRU and their cells against torch.nn (batch_first=True, the same
weights copied in): output sequences, final states, and gradients with
respect to the input, the initial state and every parameter, on the CPU
device and the (interpreter- or GPU-served) CUDA device; training steps give
the same losses on both devices; printing and input errors."""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, device

torch = pytest.importorskip("torch")
nn = torch.nn

PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
RTOL, ATOL = 2e-4, 2e-5


def _t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def _torch_twin(layer, kind):
    """The torch module with ``layer``'s parameters (float64)."""
    i, h = layer.in_features, layer.out_features
    if kind == "RNN":
        m = nn.RNN(i, h, nonlinearity=layer._act, batch_first=True)
    elif kind == "LSTM":
        m = nn.LSTM(i, h, batch_first=True)
    else:
        m = nn.GRU(i, h, batch_first=True)
    m = m.double()
    with torch.no_grad():
        for k in PARAMS:
            getattr(m, k + "_l0").copy_(_t(getattr(layer, k).numpy()))
    return m


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _assert(a, b, what):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), b, rtol=RTOL, atol=ATOL, err_msg=what)


CASES = [("RNN", lambda: tf.RNN(3, 4)), ("RNN", lambda: tf.RNN(3, 4, tf.relu)),
         ("LSTM", lambda: tf.LSTM(3, 4)), ("GRU", lambda: tf.GRU(3, 4))]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kind,make", CASES, ids=["rnn-tanh", "rnn-relu", "lstm", "gru"])
def test_layer_matches_torch(dev, kind, make):
    tf.seed(1)
    layer = make()
    tm = _torch_twin(layer, kind)
    d = device(dev)
    n, length = 2, 5
    x_np = _x(n, length, 3)
    h0_np = _x(n, 4, seed=1)
    c0_np = _x(n, 4, seed=2)
    state_np = (h0_np, c0_np) if kind == "LSTM" else h0_np
    w = np.random.default_rng(3).standard_normal((n, length, 4))
    ws = np.random.default_rng(4).standard_normal((n, 4))

    layer = d(layer)
    x = d(x_np)
    state = tuple(d(s) for s in state_np) if kind == "LSTM" else d(state_np)

    def loss(m, x, state):
        y, fin = m(x, state, return_state=True)
        hT = fin[0] if kind == "LSTM" else fin
        total = (y * d(w.astype(np.float32))).sum() + (hT * d(ws.astype(np.float32))).sum()
        if kind == "LSTM":
            total = total + (fin[1] * fin[1]).sum()
        return total

    val, (g, gx, gstate) = tf.withgradient(loss, layer, x, state)

    tx = _t(x_np).requires_grad_()
    th0 = _t(h0_np)[None].requires_grad_()
    if kind == "LSTM":
        tc0 = _t(c0_np)[None].requires_grad_()
        ty, (thT, tcT) = tm(tx, (th0, tc0))
    else:
        ty, thT = tm(tx, th0)
    tloss = (ty * _t(w)).sum() + (thT[0] * _t(ws)).sum()
    if kind == "LSTM":
        tloss = tloss + (tcT * tcT).sum()
    tloss.backward()

    # forward: the output sequence and the final states
    y, fin = layer(x, state, return_state=True)
    assert y.shape == (n, length, 4) and y.device == d
    _assert(y.numpy(), ty.detach().numpy(), f"{kind} output sequence")
    if kind == "LSTM":
        _assert(fin[0].numpy(), thT[0].detach().numpy(), "LSTM final h")
        _assert(fin[1].numpy(), tcT[0].detach().numpy(), "LSTM final c")
    else:
        _assert(fin.numpy(), thT[0].detach().numpy(), f"{kind} final h")
    _assert(float(val), float(tloss.detach()), f"{kind} loss")
    # gradients
    _assert(gx.numpy(), tx.grad.numpy(), f"{kind} gradient of x")
    if kind == "LSTM":
        _assert(gstate[0].numpy(), th0.grad[0].numpy(), "LSTM gradient of h0")
        _assert(gstate[1].numpy(), tc0.grad[0].numpy(), "LSTM gradient of c0")
    else:
        _assert(gstate.numpy(), th0.grad[0].numpy(), f"{kind} gradient of h0")
    for k in PARAMS:
        assert g[k].device == d
        _assert(g[k].numpy(), getattr(tm, k + "_l0").grad.numpy(), f"{kind} gradient of {k}")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_cell_matches_torch_cell(dev, kind):
    tf.seed(2)
    cls = {"RNN": tf.RNNCell, "LSTM": tf.LSTMCell, "GRU": tf.GRUCell}[kind]
    tcls = {"RNN": nn.RNNCell, "LSTM": nn.LSTMCell, "GRU": nn.GRUCell}[kind]
    cell = cls(3, 5)
    tcell = tcls(3, 5).double()
    with torch.no_grad():
        for k in PARAMS:
            getattr(tcell, k).copy_(_t(getattr(cell, k).numpy()))
    d = device(dev)
    cell = d(cell)
    x_np, h_np, c_np = _x(2, 3), _x(2, 5, seed=1), _x(2, 5, seed=2)
    x, h = d(x_np), d(h_np)
    state = (h, d(c_np)) if kind == "LSTM" else h

    def loss(m, x, state):
        out, new = m(x, state)
        s = (out * out).sum()
        if kind == "LSTM":
            s = s + new[1].sum()
        return s

    val, (g, gx, gs) = tf.withgradient(loss, cell, x, state)
    tx, th = _t(x_np).requires_grad_(), _t(h_np).requires_grad_()
    if kind == "LSTM":
        tc = _t(c_np).requires_grad_()
        th2, tc2 = tcell(tx, (th, tc))
        tl = (th2 * th2).sum() + tc2.sum()
    else:
        th2 = tcell(tx, th)
        tl = (th2 * th2).sum()
    tl.backward()
    out, new = cell(x, state)
    _assert(out.numpy(), th2.detach().numpy(), f"{kind}Cell output")
    if kind == "LSTM":
        _assert(new[1].numpy(), tc2.detach().numpy(), "LSTMCell new c")
        _assert(gs[1].numpy(), tc.grad.numpy(), "LSTMCell gradient of c")
        _assert(gs[0].numpy(), th.grad.numpy(), "LSTMCell gradient of h")
    else:
        assert new is out
        _assert(gs.numpy(), th.grad.numpy(), f"{kind}Cell gradient of h")
    _assert(float(val), float(tl.detach()), f"{kind}Cell loss")
    _assert(gx.numpy(), tx.grad.numpy(), f"{kind}Cell gradient of x")
    for k in PARAMS:
        _assert(g[k].numpy(), getattr(tcell, k).grad.numpy(), f"{kind}Cell gradient of {k}")


@pytest.mark.parametrize("dev", DEVICES)
def test_default_state_is_zeros_and_cell_steps_match_the_layer(dev):
    tf.seed(3)
    d = device(dev)
    layer = d(tf.GRU(2, 3))
    x = d(_x(2, 4, 2))
    y = layer(x)
    y0 = layer(x, d(np.zeros((2, 3), np.float32)))
    np.testing.assert_array_equal(y.numpy(), y0.numpy())
    # the same parameters in a cell, stepped by hand
    cell = tf.GRUCell(2, 3)
    for k in PARAMS:
        setattr(cell, k, getattr(layer, k))
    h = d(np.zeros((2, 3), np.float32))
    for t in range(4):
        out, h = cell(x[:, t], h)
        np.testing.assert_allclose(out.numpy(), y.numpy()[:, t], rtol=1e-6, atol=1e-7)


def test_torch_weights_load_directly_and_init_is_torchs():
    tf.seed(4)
    layer = tf.LSTM(7, 6)
    assert layer.weight_ih.shape == (24, 7) and layer.weight_hh.shape == (24, 6)
    assert layer.bias_ih.shape == (24,) and layer.bias_hh.shape == (24,)
    bound = 1 / np.sqrt(6)
    for k in PARAMS:
        v = getattr(layer, k).numpy()
        assert v.dtype == np.float32 and np.all(np.abs(v) <= bound) and v.std() > bound / 4
    tm = nn.LSTM(7, 6, batch_first=True)
    st = {k: tm.state_dict()[k + "_l0"].numpy() for k in PARAMS}
    tf.loadmodel(layer, st)
    x = _x(3, 4, 7)
    with torch.no_grad():
        ty, _ = tm(torch.from_numpy(x))
    np.testing.assert_allclose(layer(x).numpy(), ty.numpy(), rtol=1e-5, atol=1e-6)
    tf.seed(4)
    again = tf.LSTM(7, 6)
    tf.seed(4)
    np.testing.assert_array_equal(tf.LSTM(7, 6).weight_ih.numpy(), again.weight_ih.numpy())


def test_chain_with_dense_on_the_last_axis():
    tf.seed(5)
    model = tf.Chain(tf.LSTM(7, 6), tf.Dense(6, 1))
    y = model(_x(2, 5, 7))
    assert y.shape == (2, 5, 1)
    text = repr(model)
    assert "LSTM(7 => 6)," in text and "Dense(6 => 1)" in text


def test_printing():
    assert repr(tf.LSTM(7, 6)) == "LSTM(7 => 6)  # 360 parameters"
    assert repr(tf.GRU(2, 3)).startswith("GRU(2 => 3)  # 63 parameters")
    assert repr(tf.RNN(2, 3, tf.relu)).startswith("RNN(2 => 3, relu)  # 21 parameters")
    assert repr(tf.RNNCell(2, 3)).startswith("RNNCell(2 => 3)")
    assert repr(tf.LSTM(2, 3, return_state=True)).startswith("LSTM(2 => 3, return_state=true)")


@pytest.mark.parametrize("dev", DEVICES)
def test_return_state_and_empty_sequence(dev):
    d = device(dev)
    layer = d(tf.LSTM(2, 3, return_state=True))
    x = d(np.zeros((2, 0, 2), np.float32))
    h0, c0 = d(_x(2, 3)), d(_x(2, 3, seed=1))
    y, (h, c) = layer(x, (h0, c0))
    assert y.shape == (2, 0, 3)
    np.testing.assert_array_equal(h.numpy(), h0.numpy())
    np.testing.assert_array_equal(c.numpy(), c0.numpy())
    y = layer(d(_x(2, 3, 2)), return_state=False)
    assert y.shape == (2, 3, 3)


def test_input_errors_say_what_and_how():
    layer = tf.LSTM(3, 4)
    with pytest.raises(tf.errors.ShapeError,
                       match=r"LSTM\(3 => 4\) expects a 3-d \(N, L, in\).*got shape \(5, 3\).*LSTMCell"):
        layer(np.zeros((5, 3), np.float32))
    with pytest.raises(tf.errors.ShapeError, match=r"expects 3 features on axis 2.*\(2, 5, 4\)"):
        layer(np.zeros((2, 5, 4), np.float32))
    with pytest.raises(tf.errors.ShapeError, match=r"state must have shape \(2, 4\)"):
        layer(np.zeros((2, 5, 3), np.float32), (np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32)))
    with pytest.raises(TypeError, match=r"pair \(h, c\)"):
        layer(np.zeros((2, 5, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(tf.errors.ShapeError, match=r"GRUCell\(3 => 4\) expects a 2-d \(N, in\)"):
        tf.GRUCell(3, 4)(np.zeros((2, 5, 3), np.float32))
    with pytest.raises(ValueError, match="tanh or relu"):
        tf.RNN(3, 4, tf.sigmoid)


@pytest.mark.parametrize("dev", [p for p in DEVICES if p.id == "cuda"])
def test_device_mismatch_names_the_fix(dev):
    layer = tf.GRU(2, 3)
    with pytest.raises(tf.DeviceMismatchError, match="GRU"):
        layer(device(dev)(_x(1, 2, 2)))


def test_training_gives_the_same_losses_on_both_devices():
    from helpers import DEVICES as _D
    if any(p.marks for p in _D if p.id == "cuda"):
        pytest.skip("no functional CUDA backend")
    losses = {}
    for dev in ("cpu", "cuda"):
        tf.seed(6)
        d = device(dev)
        model = d(tf.Chain(tf.LSTM(3, 4), tf.Dense(4, 1)))
        x = d(_x(2, 5, 3))
        target = d(_x(2, 5, 1, seed=9))
        opt = tf.setup(tf.Adam(0.01), model)
        out = []
        for _ in range(3):
            val, (g,) = tf.withgradient(lambda m: tf.losses.mse(m(x), target), model)
            tf.update(opt, model, g)
            out.append(float(val))
        losses[dev] = out
    np.testing.assert_allclose(losses["cpu"], losses["cuda"], rtol=1e-5)
    assert losses["cpu"][-1] < losses["cpu"][0]
