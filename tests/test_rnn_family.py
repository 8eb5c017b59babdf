"""rnn_sequence / lstm_sequence / gru_sequence: what the generic property
suite does not pin down.

Long sequences (L = 200, saturating weights): BPTT gradients stay finite on
both sides and the kernel matches the reference; hidden sizes larger than
one kernel block (the chunk loops over hidden units); zero-length sequences
(the output is empty, every gradient zero: h0 does not reach the output);
the launch count of a sequence does not grow with its length; integer and
mixed dtypes and bad shapes raise errors that say so; torch only allocates
and views on the Triton path.
"""
import weakref

import numpy as np
import pytest

from triflux import backend
from triflux.errors import DTypeError, ShapeError
from triflux.reference import rnn as ref
from triflux.reference._util import keeping_for_backward, kept_for_backward

KERNELS = backend.functional("CUDA")
needs_kernels = pytest.mark.skipif(not KERNELS, reason="no functional GPU backend "
                                   "(set TRITON_INTERPRET=1 to use the interpreter)")
NAMES = {"rnn_sequence": 1, "lstm_sequence": 4, "gru_sequence": 3}


def _inputs(name, n, length, i, h, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    g = NAMES[name]
    ins = [rng.uniform(-1, 1, (n, length, i)), rng.uniform(-1, 1, (n, h))]
    if name == "lstm_sequence":
        ins.append(rng.uniform(-1, 1, (n, h)))
    ins += [scale * rng.uniform(-1, 1, (g * h, i)), scale * rng.uniform(-1, 1, (g * h, h)),
            rng.uniform(-1, 1, (g * h,)), rng.uniform(-1, 1, (g * h,))]
    return ins


def _fns(name, side):
    if side == "reference":
        mod = ref
    else:
        from triflux.triton_kernels import rnn as mod
    return getattr(mod, name + "_forward"), getattr(mod, name + "_backward")


def _kernel_args(arrays, dtype="float32"):
    import torch
    from triflux.triton_kernels import launch
    dev = "cpu" if launch.INTERPRET else "cuda"
    return [torch.from_numpy(np.ascontiguousarray(a)).to(getattr(torch, dtype)).to(dev) for a in arrays]


def _np(t):
    import torch
    return t.detach().to("cpu").to(torch.float64).numpy()


CASES = [("rnn_sequence", {"activation": "tanh"}), ("rnn_sequence", {"activation": "relu"}),
         ("lstm_sequence", {}), ("gru_sequence", {})]
IDS = ["rnn-tanh", "rnn-relu", "lstm", "gru"]


@pytest.mark.parametrize("name,attrs", CASES, ids=IDS)
def test_long_sequence_gradients_are_finite_on_the_reference(name, attrs):
    for scale in (1.0, 4.0):
        ins = _inputs(name, 2, 200, 3, 4, seed=1, scale=scale if attrs.get("activation") != "relu" else 0.5)
        fwd, bwd = _fns(name, "reference")
        out = fwd(*ins, **attrs)
        g = np.random.default_rng(2).standard_normal(out.shape)
        grads = bwd(g, out, *ins, **attrs)
        assert np.all(np.isfinite(out))
        for k, gr in enumerate(grads):
            assert np.all(np.isfinite(gr)), f"{name}: gradient of input {k} over L=200 is not finite"
        # the gradient reaches the first step (and does not explode for these gated cells)
        assert np.abs(grads[0][:, 0]).max() > 0


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_lstm_backward_reads_the_gates_its_forward_kept(dtype):
    """Inside a recorded gradient the reference LSTM forward keeps its gates
    and states with the output it returns, while that output lives: the
    backward of that very array reads them, the backward of any other (a
    copy) recomputes them from x and h, and both give the same gradients
    (float16: computed in float32 either way). Outside, it keeps nothing."""
    ins = [a.astype(dtype) for a in _inputs("lstm_sequence", 3, 6, 2, 5, seed=7)]
    assert kept_for_backward(ref.lstm_sequence_forward(*ins)) is None
    with keeping_for_backward():
        out = ref.lstm_sequence_forward(*ins)
    g = np.random.default_rng(8).standard_normal(out.shape).astype(dtype)
    recomputed = ref.lstm_sequence_backward(g, out.copy(), *ins)
    kept = ref.lstm_sequence_backward(g, out, *ins)
    tol = 1e-12 if dtype == np.float64 else 2e-3
    for k, (a, b) in enumerate(zip(kept, recomputed)):
        assert a.dtype == b.dtype == dtype and a.flags.c_contiguous
        np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=tol, atol=tol, err_msg=f"input {k}")
    gates = weakref.ref(kept_for_backward(out)[0])
    del out
    assert gates() is None, "the kept gates outlive their output"


#: the kernels' sequence length: 200 on a GPU; the interpreter pays ~0.1 ms per
#: operation of the in-kernel time loop (tens of ms per step), so it runs 24
LONG = 24 if backend.interpreter_on() else 200


@needs_kernels
@pytest.mark.parametrize("name,attrs", CASES, ids=IDS)
def test_long_sequence_kernel_matches_reference(name, attrs):
    ins = _inputs(name, 2, LONG, 3, 4, seed=3, scale=1.0 if attrs.get("activation") != "relu" else 0.5)
    rf, rb = _fns(name, "reference")
    kf, kb = _fns(name, "kernel")
    targs = _kernel_args(ins)
    ins = [_np(t) for t in targs]     # the same (float32) numbers on both sides
    out = rf(*ins, **attrs)
    kout = kf(*targs, **attrs)
    np.testing.assert_allclose(_np(kout), out, rtol=1e-4, atol=1e-5)
    g = np.random.default_rng(4).standard_normal(out.shape).astype(np.float32)
    grads = rb(g.astype(np.float64), out, *ins, **attrs)
    kgrads = kb(*_kernel_args([g]), kout, *targs, **attrs)
    for k, (a, b) in enumerate(zip(grads, kgrads)):
        b = _np(b)
        assert np.all(np.isfinite(b)), f"{name}: kernel gradient of input {k} is not finite"
        scale = max(np.abs(a).max(), 1e-6)
        assert np.abs(a - b).max() <= 1e-4 * scale, f"{name}: gradient of input {k}, kernel vs reference"


@needs_kernels
@pytest.mark.parametrize("name", ["lstm_sequence", "gru_sequence"])
def test_hidden_size_larger_than_a_block(name):
    """H = 70 > the interpreter's (and the GPU's) block of 64 hidden units, and
    a batch of 67 rows (two programs in the interpreter, five on a GPU)."""
    ins = _inputs(name, 67, 3, 2, 70, seed=5)
    rf, rb = _fns(name, "reference")
    kf, kb = _fns(name, "kernel")
    targs = _kernel_args(ins)
    ins = [_np(t) for t in targs]
    out = rf(*ins)
    kout = kf(*targs)
    np.testing.assert_allclose(_np(kout), out, rtol=1e-4, atol=1e-5)
    g = np.random.default_rng(6).standard_normal(out.shape).astype(np.float32)
    grads = rb(g.astype(np.float64), out, *ins)
    for k, (a, b) in enumerate(zip(grads, kb(*_kernel_args([g]), kout, *targs))):
        np.testing.assert_allclose(_np(b), a, rtol=1e-4, atol=1e-4 * max(np.abs(a).max(), 1e-6),
                                   err_msg=f"{name}: gradient of input {k}")


@pytest.mark.parametrize("side", ["reference", pytest.param("kernel", marks=needs_kernels)])
@pytest.mark.parametrize("name,attrs", CASES, ids=IDS)
def test_zero_length_sequence(side, name, attrs):
    ins = _inputs(name, 2, 0, 3, 4)
    fwd, bwd = _fns(name, side)
    args = ins if side == "reference" else _kernel_args(ins)
    out = fwd(*args, **attrs)
    width = 8 if name == "lstm_sequence" else 4
    assert tuple(out.shape) == (2, 0, width)
    g = np.zeros((2, 0, width))
    grads = bwd(g if side == "reference" else _kernel_args([g])[0], out, *args, **attrs)
    assert len(grads) == len(ins)
    for gr, x in zip(grads, ins):
        gr = np.asarray(gr) if side == "reference" else _np(gr)
        assert gr.shape == x.shape and not np.any(gr)


@pytest.mark.parametrize("side", ["reference", pytest.param("kernel", marks=needs_kernels)])
@pytest.mark.parametrize("name,attrs", CASES, ids=IDS)
def test_partial_backward_computes_only_what_is_needed(side, name, attrs):
    """Declared partial_backward: given ``needs``, a gradient nobody needs is
    None (a model's data x: no dx; initial states made by the layer) and the
    others are those of the full backward, bit for bit, whichever are asked
    for: every other input and then the rest (so each gradient is once left
    out and once computed next to left-out ones), and a training step's needs
    (weights and biases only)."""
    ins = _inputs(name, 3, 5, 2, 4, seed=11)
    fwd, bwd = _fns(name, side)
    args = ins if side == "reference" else _kernel_args(ins)
    back = np.asarray if side == "reference" else _np
    out = fwd(*args, **attrs)
    g = np.random.default_rng(12).standard_normal(tuple(out.shape))
    g = g if side == "reference" else _kernel_args([g])[0]
    full = bwd(g, out, *args, **attrs)
    states = 2 if name == "lstm_sequence" else 1
    every_other = tuple(k % 2 == 0 for k in range(len(ins)))
    cases = [every_other, tuple(not need for need in every_other), (False,) * (1 + states) + (True,) * 4]
    for needs in cases:
        part = bwd(g, out, *args, **attrs, needs=needs)
        assert len(part) == len(ins)
        for k, (need, p, f) in enumerate(zip(needs, part, full)):
            if need:
                np.testing.assert_array_equal(back(p), back(f), err_msg=f"{name} {needs}: gradient {k}")
            else:
                assert p is None, f"{name}: gradient {k} computed though not needed ({needs})"


@needs_kernels
@pytest.mark.parametrize("name,attrs", CASES[1:], ids=IDS[1:])
def test_launches_do_not_grow_with_the_length(name, attrs, monkeypatch):
    from triflux.triton_kernels import launch
    kf, kb = _fns(name, "kernel")
    counts = []
    for length in (2, 7):
        calls = []
        real = launch.launch
        monkeypatch.setattr(launch, "launch", lambda k, *a, **m: calls.append(k) or real(k, *a, **m))
        targs = _kernel_args(_inputs(name, 2, length, 3, 4))
        out = kf(*targs, **attrs)
        fwd = len(calls)
        kb(*_kernel_args([np.ones(tuple(out.shape))]), out, *targs, **attrs)
        monkeypatch.setattr(launch, "launch", real)
        counts.append((fwd, len(calls) - fwd))
    assert counts[0] == counts[1], f"{name}: launches (forward, backward) {counts} grow with L"
    assert counts[0][0] <= 2, f"{name}: the float32 forward should be a GEMM and one time-loop launch"
    assert counts[0][1] <= 8, f"{name}: the backward launches {counts[0][1]} kernels"


@pytest.mark.parametrize("side", ["reference", pytest.param("kernel", marks=needs_kernels)])
def test_integer_and_mixed_dtypes_are_errors(side):
    ins = _inputs("gru_sequence", 2, 3, 2, 3)
    fwd, _ = _fns("gru_sequence", side)
    bad = [ins[0].astype(np.int64)] + ins[1:]
    args = bad if side == "reference" else _kernel_args(bad[:1], "int64") + _kernel_args(bad[1:])
    with pytest.raises(DTypeError, match=r"gru_sequence: every input must have one floating dtype.*int64.*f32"):
        fwd(*args)
    mixed = [ins[0].astype(np.float32)] + ins[1:]
    args = mixed if side == "reference" else _kernel_args(mixed[:1]) + _kernel_args(mixed[1:], "float64")
    with pytest.raises(DTypeError, match="float32.*float64|float64.*float32"):
        fwd(*args)


@pytest.mark.parametrize("side", ["reference", pytest.param("kernel", marks=needs_kernels)])
def test_shape_errors_name_the_input(side):
    ins = _inputs("lstm_sequence", 2, 3, 2, 3)
    fwd, _ = _fns("lstm_sequence", side)
    bad = list(ins)
    bad[2] = np.zeros((2, 4))        # c0 with the wrong hidden size
    args = bad if side == "reference" else _kernel_args(bad)
    with pytest.raises(ShapeError, match=r"lstm_sequence: c0 must have shape \(2, 3\).*got \(2, 4\)"):
        fwd(*args)
    bad = list(ins)
    bad[4] = np.zeros((9, 3))        # w_hh of an RNN with 3 gates
    args = bad if side == "reference" else _kernel_args(bad)
    with pytest.raises(ShapeError, match=r"w_hh must have shape \(4\*H, H\)"):
        fwd(*args)
    with pytest.raises(ValueError, match="'tanh' or 'relu'"):
        _fns("rnn_sequence", side)[0](*(_inputs("rnn_sequence", 1, 1, 1, 1) if side == "reference"
                                        else _kernel_args(_inputs("rnn_sequence", 1, 1, 1, 1))),
                                      activation="sigmoid")


def test_ops_functions_check_before_dispatching(monkeypatch):
    """``ops.rnn_sequence`` / ``lstm_sequence`` / ``gru_sequence`` raise the
    spec's errors at the API edge, before any reference or kernel runs."""
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a bad sequence"))
    ins = [a.astype(np.float32) for a in _inputs("lstm_sequence", 2, 3, 2, 3)]
    ins[2] = np.zeros((2, 4), np.float32)
    with pytest.raises(ShapeError, match=r"lstm_sequence: c0 must have shape \(2, 3\).*got \(2, 4\)"):
        ops.lstm_sequence(*ins)
    gru = [a.astype(np.float32) for a in _inputs("gru_sequence", 2, 3, 2, 3)]
    with pytest.raises(DTypeError, match="gru_sequence: every input must have one floating dtype"):
        ops.gru_sequence(gru[0].astype(np.int64), *gru[1:])
    with pytest.raises(ValueError, match="'tanh' or 'relu'"):
        ops.rnn_sequence(*[a.astype(np.float32) for a in _inputs("rnn_sequence", 1, 1, 1, 1)], activation="sigmoid")


@needs_kernels
def test_training_steps_use_torch_only_for_memory():
    pytest.importorskip("torch")
    import triflux as tf
    from torch_ops import assert_torch_only_moves_memory
    dev = tf.CUDADevice(0)
    tf.seed(0)
    model = dev(tf.Chain(tf.RNN(3, 4), tf.GRU(4, 4), tf.LSTM(4, 3), tf.Dense(3, 1)))
    x = dev(np.random.default_rng(0).uniform(-1, 1, (2, 3, 3)).astype(np.float16).astype(np.float32))
    opt = tf.setup(tf.Adam(1e-2), model)

    def step():
        loss, (g,) = tf.withgradient(lambda m: (m(x) * m(x)).mean(), model)
        tf.update(opt, model, g)
        float(loss)
    assert_torch_only_moves_memory(step, "a recurrent training step on the Triton path")
