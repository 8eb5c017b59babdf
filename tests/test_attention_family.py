"""attention / attention_weights: what the property suite does not pin down.

Bad input raises the spec's triflux error (naming what it got and the fix)
on both sides and through the public functions, before any launch and with
the inputs unchanged. Gradients are bit-identical run to run (dq, dk, dv and
a broadcast bias's gradient: no atomics). A backward that ignored the causal
mask is caught: keys no query may see get exactly zero dK and dV, and the
causal gradients match the reference's and not the non-causal ones. Fully
masked rows give 0 and zero gradients, as torch 2.13. Dropout (p > 0, which
the property suite does not draw): reproducible per seed, the right moments,
the same mask in y and in the returned weights, and the backward kernels
redraw exactly the forward's mask (checked against torch autograd with the
kernels' own mask). The GPU's block plan run in the interpreter on longer
sequences, logits of 1e4, the row statistics recomputed when the forward's are not at
hand, torch doing nothing but allocate and view, the NNlib layout as views,
and MultiHeadAttention against torch's nn.MultiheadAttention.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import ArgumentError, DTypeError, ShapeError
from triflux.reference import attention as ref
from triflux.specs.attention import attention_flops

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

import triflux as tf  # noqa: E402
from triflux import attention as A  # noqa: E402
from triflux.layers.attention import MultiHeadAttention  # noqa: E402
from triflux.triton_kernels import attention as ka  # noqa: E402
from triflux.triton_kernels import launch  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"


def _np(t):
    return t.detach().to("cpu").to(torch.float64).numpy()


def _t(a, dtype=torch.float64):
    a = np.asarray(a)
    if a.dtype == bool:
        return torch.from_numpy(a.copy()).to(DEVICE)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(dtype).to(DEVICE)


def _qkv(seed, n=1, h=2, lq=37, lk=45, d=20, dv=12):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, h, lq, d)), rng.standard_normal((n, h, lk, d)),
            rng.standard_normal((n, h, lk, dv)))


def _kernel(arrays, attrs, g=None, dtype=torch.float64, weights=False):
    ts = [_t(a, dtype) for a in arrays]
    fwd = ka.attention_weights_forward if weights else ka.attention_forward
    bwd = ka.attention_weights_backward if weights else ka.attention_backward
    y = fwd(*ts, **attrs)
    if g is None:
        return y, None
    return y, bwd(_t(g, y.dtype), y, *ts, **attrs)


def _bits(t):
    return t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()


# --- bad input ---------------------------------------------------------------------------------------

BAD = [  # (description, shapes and dtypes of q, k, v, extras), error type, words the message must hold
    ("head dims differ", [((1, 2, 5, 4), "f"), ((1, 2, 6, 3), "f"), ((1, 2, 6, 4), "f")], ShapeError, "head dims"),
    ("batch differs", [((2, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f")], ShapeError, "batch"),
    ("heads differ", [((1, 2, 5, 4), "f"), ((1, 3, 6, 4), "f"), ((1, 3, 6, 4), "f")], ShapeError, "heads"),
    ("k, v lengths differ", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 7, 4), "f")], ShapeError, "length"),
    ("3-d q", [((2, 5, 4), "f"), ((2, 6, 4), "f"), ((2, 6, 4), "f")], ShapeError, "(N, H, L, d)"),
    ("dtypes differ", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "h"), ((1, 2, 6, 4), "f")], DTypeError, "float16"),
    ("integer mask", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f"), ((5, 6), "i")],
     DTypeError, "bool"),
    ("mask shape", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f"), ((5, 7), "b")],
     ShapeError, "(5, 7)"),
    ("bias shape", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f"), ((3, 5, 6), "f")],
     ShapeError, "broadcast"),
    ("bias dtype", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f"), ((5, 6), "d")],
     DTypeError, "bias"),
    ("mask before bias", [((1, 2, 5, 4), "f"), ((1, 2, 6, 4), "f"), ((1, 2, 6, 4), "f"), ((5, 6), "b"),
                          ((5, 6), "f")], ArgumentError, "order"),
]
_NP = {"f": np.float32, "h": np.float16, "d": np.float64, "i": np.int64, "b": bool}


@pytest.mark.parametrize("side", ["reference", "kernel"])
@pytest.mark.parametrize("what,specs,error,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_any_work(what, specs, error, words, side, monkeypatch):
    arrays = [np.ones(shape, dtype=_NP[kind]) for shape, kind in specs]
    if side == "kernel":
        def no_launch(*args, **kwargs):
            raise AssertionError("a kernel was launched before the inputs were checked")
        monkeypatch.setattr(launch, "launch", no_launch)
        ins = [torch.from_numpy(a.copy()).to(DEVICE) for a in arrays]
        before = [_bits(t) for t in ins]
        with pytest.raises(error) as e:
            ka.attention_forward(*ins)
        assert [_bits(t) for t in ins] == before
    else:
        with pytest.raises(error) as e:
            ref.attention_forward(*arrays)
    assert words in str(e.value), str(e.value)


def test_bad_attributes_and_public_functions():
    q, k, v = (np.ones(s, np.float32) for s in ((1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4)))
    with pytest.raises(ArgumentError, match="probability"):
        ref.attention_forward(q, k, v, p=1.5)
    with pytest.raises(ArgumentError, match="seed"):
        ref.attention_forward(q, k, v, seed=-1)
    with pytest.raises(ArgumentError, match="causal"):
        ref.attention_forward(q, k, v, causal="yes")
    x = tf.tensor(np.ones((2, 5, 12), np.float32))
    with pytest.raises(ShapeError, match="nheads=5"):
        A.dot_product_attention(x, x, x, nheads=5)
    with pytest.raises(ShapeError, match="batch sizes"):
        A.dot_product_attention(x, tf.tensor(np.ones((3, 5, 12), np.float32)), x, nheads=2)
    with pytest.raises(DTypeError, match="mask"):
        A.dot_product_attention(x, x, x, nheads=2, mask=np.ones((5, 5), np.int32))
    with pytest.raises(ShapeError, match="broadcast"):
        A.dot_product_attention(x, x, x, nheads=2, mask=np.ones((4, 5), bool))
    with pytest.raises(ShapeError, match="\\(N, L, nheads"):
        A.dot_product_attention(tf.tensor(np.ones((5, 12), np.float32)), x, x)
    with pytest.raises(ShapeError, match="not divisible by nheads"):
        MultiHeadAttention(10, nheads=4)
    with pytest.raises(ShapeError, match="features"):
        MultiHeadAttention(12, nheads=4)(tf.tensor(np.ones((2, 5, 10), np.float32)))
    with pytest.raises(ShapeError, match="batch"):
        A.batched_mul(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))


# --- determinism, causal masking -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_bit_identical_run_to_run(dtype):
    q, k, v = _qkv(1, n=2, h=2, lq=41, lk=53, d=24, dv=17)
    bias = np.random.default_rng(2).standard_normal((2, 1, 41, 53))      # broadcast over heads: a reduction
    g = np.random.default_rng(3).standard_normal((2, 2, 41, 17))
    attrs = {"causal": True}
    runs = [_kernel((q, k, v, bias), attrs, g, dtype)[1] for _ in range(2)]
    for i, (a, b) in enumerate(zip(*runs)):
        assert _bits(a) == _bits(b), f"gradient {i} differs between two identical runs"


@pytest.mark.parametrize("side", ["reference", "kernel"])
def test_partial_backward_gives_what_is_needed(side):
    q, k, v = _qkv(34, n=1, h=2, lq=19, lk=23, d=8, dv=6)
    bias = np.random.default_rng(35).standard_normal((19, 23))
    g = np.random.default_rng(36).standard_normal((1, 2, 19, 6))
    bwd = ka.attention_backward if side == "kernel" else ref.attention_backward
    conv = _t if side == "kernel" else np.asarray
    ins = [conv(a) for a in (q, k, v, bias)]
    y = ka.attention_forward(*ins, causal=True) if side == "kernel" else ref.attention_forward(*ins, causal=True)
    full = bwd(conv(g), y, *ins, causal=True)
    for needs in ((True, False, False, False), (False, True, False, False), (False, False, True, False),
                  (False, False, False, True), (False, True, True, True)):
        part = bwd(conv(g), y, *ins, causal=True, needs=needs)
        for i, (a, b) in enumerate(zip(part, full)):
            if needs[i]:
                np.testing.assert_array_equal(np.asarray(_np(a) if side == "kernel" else a),
                                              np.asarray(_np(b) if side == "kernel" else b))


@pytest.mark.parametrize("lq,lk", [(20, 70), (45, 37), (33, 33)])
def test_a_backward_that_ignored_the_causal_mask_is_caught(lq, lk):
    """Causal with top-left alignment: key j is seen by queries i >= j only. A
    backward that skipped the mask (or the block skipping, or the zero store
    for unseen key blocks) would give dK, dV != 0 for keys j >= Lq and the
    non-causal gradients elsewhere."""
    q, k, v = _qkv(4, n=1, h=2, lq=lq, lk=lk, d=16, dv=16)
    g = np.random.default_rng(5).standard_normal((1, 2, lq, 16))
    attrs = {"causal": True}
    y, (dq, dk, dv) = _kernel((q, k, v), attrs, g)
    ry = ref.attention_forward(q, k, v, causal=True)
    rdq, rdk, rdv = ref.attention_backward(g, ry, q, k, v, causal=True)
    _, (ndq, ndk, ndv) = _kernel((q, k, v), {"causal": False}, g)
    for got, want, other in ((dq, rdq, ndq), (dk, rdk, ndk), (dv, rdv, ndv)):
        np.testing.assert_allclose(_np(got), want, rtol=1e-11, atol=1e-11)
        assert np.abs(_np(other) - want).max() > 1e-3, "the causal and non-causal gradients agree: no test"
    if lk > lq:
        assert not _np(dk)[:, :, lq:].any() and not _np(dv)[:, :, lq:].any(), \
            "keys no query may attend got a nonzero gradient"
    # dV of the last key seen: only the last query attends it
    j = min(lq, lk) - 1
    p_last = ref._weights(ref._spec("attention", (q, k, v), True, None, 0.0, 0), q, k, None, None)[0]
    want = sum(p_last[0, :, i, j, None] * g[0, :, i] for i in range(j, lq))
    np.testing.assert_allclose(_np(dv)[0, :, j], want, rtol=1e-11, atol=1e-12)


# --- fully masked rows, extreme logits -------------------------------------------------------------------

@pytest.mark.parametrize("side", ["reference", "kernel"])
def test_fully_masked_rows_give_zero_as_torch(side):
    q, k, v = _qkv(6, n=1, h=2, lq=9, lk=11, d=8, dv=5)
    mask = np.random.default_rng(7).random((9, 11)) < 0.6
    mask[[0, 4]] = False
    bias = np.random.default_rng(8).standard_normal((2, 9, 11))
    bias[1, 6] = -np.inf                                  # an all -inf bias row: fully masked too
    g = np.random.default_rng(9).standard_normal((1, 2, 9, 5))
    if side == "kernel":
        y, grads = _kernel((q, k, v, bias, mask), {}, g)
        y, grads = _np(y), [_np(t) for t in grads[:4]]
    else:
        y = ref.attention_forward(q, k, v, bias, mask)
        grads = ref.attention_backward(g, y, q, k, v, bias, mask)[:4]
    ts = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v, bias)]
    tb = torch.where(torch.from_numpy(mask), ts[3], torch.tensor(-np.inf, dtype=torch.float64))
    ty = torch.nn.functional.scaled_dot_product_attention(*ts[:3], attn_mask=tb)
    tgrads = torch.autograd.grad(ty, ts, torch.from_numpy(g))
    assert not np.isnan(y).any() and not y[:, :, [0, 4]].any() and not y[:, 1, 6].any()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, tgrads):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-12)
    assert not grads[0][:, :, [0, 4]].any()


def test_logits_of_ten_thousand_are_stable_in_float32():
    """Scores of +-1e4 overflow exp without the running-maximum shift; with it
    the kernel is as accurate as torch's float32 on the same inputs (the
    scores themselves are rounded to u |S| ~ 1e-3 in float32, by both)."""
    q, k, v = _qkv(10, n=1, h=1, lq=33, lk=40, d=16, dv=8)
    bias = np.full((33, 40), 1e4) + np.random.default_rng(11).standard_normal((33, 40))
    bias[::2] *= -1
    y, _ = _kernel((q, k, v, bias), {"causal": True}, dtype=torch.float32)
    want = ref.attention_forward(q, k, v, bias, causal=True)
    tq, tk, tv, tb = (torch.from_numpy(a).float() for a in (q, k, v, bias))
    tb = torch.where(torch.ones(33, 40, dtype=torch.bool).tril(), tb, torch.tensor(-float("inf")))
    torch_err = np.abs(torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb).double().numpy()
                       - want).max()
    err = np.abs(_np(y) - want).max()
    assert np.isfinite(_np(y)).all()
    assert err <= max(2 * torch_err, 1e-5), (err, torch_err)


# --- dropout -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["reference", "kernel"])
def test_dropout_reproducible_and_seeded(side):
    q, k, v = _qkv(12, n=1, h=2, lq=20, lk=24, d=8, dv=8)
    g = np.random.default_rng(13).standard_normal((1, 2, 20, 8))

    def run(seed):
        attrs = {"p": 0.3, "seed": seed, "causal": True}
        if side == "kernel":
            y, grads = _kernel((q, k, v), attrs, g)
            return [_np(y)] + [_np(t) for t in grads]
        y = ref.attention_forward(q, k, v, **attrs)
        return [y] + list(ref.attention_backward(g, y, q, k, v, **attrs))
    a, b, c = run(5), run(5), run(6)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("side", ["reference", "kernel"])
@pytest.mark.parametrize("p", [0.2, 0.6])
def test_dropout_moments(side, p):
    """Uniform weights (q = 0): each weight is 1/Lk kept with probability 1 - p
    and scaled by 1/(1 - p): zeros at rate p, mean 1/Lk."""
    n, h, lq, lk = 1, 2, 64, 96
    q = np.zeros((n, h, lq, 8))
    k = np.random.default_rng(14).standard_normal((n, h, lk, 8))
    attrs = {"p": p, "seed": 20240611}
    if side == "kernel":
        w = _np(ka.attention_weights_forward(_t(q), _t(k), **attrs))
    else:
        w = ref.attention_weights_forward(q, k, **attrs)
    count = w.size
    zeros = float((w == 0).mean())
    assert abs(zeros - p) <= 6 * np.sqrt(p * (1 - p) / count)
    assert abs(w.mean() - 1 / lk) <= 6 * np.sqrt(p / (1 - p) / count) / lk
    kept = w[w != 0]
    np.testing.assert_allclose(kept, 1 / lk / (1 - p), rtol=1e-12)


def test_dropout_same_mask_in_output_weights_and_backward():
    """The kernels draw one mask per (seed, pair): y equals the returned weights
    times v, and the backward kernels redraw that mask (checked with torch
    autograd on the kernels' own mask)."""
    q, k, v = _qkv(15, n=2, h=1, lq=29, lk=38, d=12, dv=7)
    bias = np.random.default_rng(16).standard_normal((29, 38))
    g = np.random.default_rng(17).standard_normal((2, 1, 29, 7))
    attrs = {"p": 0.4, "seed": 99, "causal": True}
    y, grads = _kernel((q, k, v, bias), attrs, g)
    w = _np(ka.attention_weights_forward(_t(q), _t(k), _t(bias), **attrs))
    np.testing.assert_allclose(_np(y), w @ v, rtol=1e-10, atol=1e-12)
    P = ref._weights(ref._spec("attention", (q, k, v, bias), True, None, 0.0, 0), q, k, bias, None)[0]
    keep = (w != 0) | (P == 0)
    assert 0.5 < keep[P > 0].mean() < 0.7
    ts = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v, bias)]
    s = ts[0] @ ts[1].transpose(-1, -2) / np.sqrt(12) + ts[3]
    s = s.masked_fill(~torch.ones(29, 38, dtype=torch.bool).tril(), -float("inf"))
    ty = (torch.softmax(s, -1) * torch.from_numpy(keep) / 0.6) @ ts[2]
    tgrads = torch.autograd.grad(ty, ts, torch.from_numpy(g))
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, tgrads):
        np.testing.assert_allclose(_np(a), b.numpy(), rtol=1e-9, atol=1e-11)


# --- the GPU's plan, the kept statistics, layouts ----------------------------------------------------------------

@pytest.fixture
def gpu_plan(monkeypatch):
    """The block sizes a GPU takes for 16-bit head dims <= 64, forced in the interpreter."""
    monkeypatch.setattr(ka, "FORCED_PLAN", {"forward": (128, 64, 4, 3), "dkdv": (64, 128, 8, 2),
                                            "dq": (128, 64, 8, 2), "rows": (128, 64, 4, 2)})


def test_gpu_plan_matches_the_reference(gpu_plan):
    q, k, v = _qkv(18, n=1, h=2, lq=200, lk=291, d=64, dv=40)
    mask = np.random.default_rng(19).random((1, 1, 200, 291)) < 0.9
    g = np.random.default_rng(20).standard_normal((1, 2, 200, 40))
    for attrs, extras in (({"causal": True}, ()), ({"causal": False}, (mask,))):
        y, grads = _kernel((q, k, v) + extras, attrs, g)
        ry = ref.attention_forward(q, k, v, *extras, **attrs)
        rgrads = ref.attention_backward(g, ry, q, k, v, *extras, **attrs)
        np.testing.assert_allclose(_np(y), ry, rtol=1e-11, atol=1e-12)
        for a, b in zip(grads[:3], rgrads[:3]):
            np.testing.assert_allclose(_np(a), b, rtol=1e-10, atol=1e-11)


def test_backward_recomputes_the_lse_for_another_output():
    q, k, v = _qkv(21, n=1, h=2, lq=30, lk=26, d=9, dv=6)
    g = np.random.default_rng(22).standard_normal((1, 2, 30, 6))
    ts = [_t(a) for a in (q, k, v)]
    y = ka.attention_forward(*ts, causal=True)
    kept = ka.attention_backward(_t(g), y, *ts, causal=True)
    other = y.clone()
    assert ka._kept_for_backward(other, ka._spec("attention", ts, True, None, 0.0, 0)) is None
    again = ka.attention_backward(_t(g), other, *ts, causal=True)
    for a, b in zip(kept, again):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-12, atol=1e-13)


def test_torch_only_allocates_and_views():
    q, k, v = _qkv(23, n=1, h=2, lq=20, lk=24, d=8, dv=8)
    bias = np.random.default_rng(24).standard_normal((2, 1, 24))
    mask = np.random.default_rng(25).random((20, 24)) < 0.8
    ts = [_t(a, torch.float32) for a in (q, k, v, bias)] + [_t(mask)]
    ts[0] = ts[0].transpose(2, 3).contiguous().transpose(2, 3)       # a non-contiguous q

    def work():
        y = ka.attention_forward(*ts, causal=True, p=0.1, seed=3)
        ka.attention_backward(y, y, *ts, causal=True, p=0.1, seed=3)
        w = ka.attention_weights_forward(*ts[:2], *ts[3:], causal=True)
        ka.attention_weights_backward(w, w, *ts[:2], *ts[3:], causal=True)
    assert_torch_only_moves_memory(work, "the attention kernels")


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_nnlib_layout_heads_are_views_and_match_torch(dev):
    d = tf.cpu_device() if dev == "cpu" else tf.CUDADevice(0)
    rng = np.random.default_rng(26)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 9, 12), (2, 11, 12), (2, 11, 8)))
    bias = rng.standard_normal((4, 9, 11)).astype(np.float32)
    y, w = A.dot_product_attention(d(q), d(k), d(v), d(bias), nheads=4, mask=d(np.tri(9, 11, dtype=bool)))
    tq, tk, tv = (torch.from_numpy(a).view(2, a.shape[1], 4, -1).transpose(1, 2) for a in (q, k, v))
    tb = torch.where(torch.ones(9, 11, dtype=torch.bool).tril(), torch.from_numpy(bias), torch.tensor(-np.inf))
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb)
    np.testing.assert_allclose(y.numpy(), ty.transpose(1, 2).reshape(2, 9, 8).numpy(), rtol=2e-5, atol=2e-6)
    tw = torch.softmax(tq @ tk.transpose(-1, -2) / np.sqrt(3) + tb, -1)
    np.testing.assert_allclose(w.numpy(), tw.numpy(), rtol=2e-5, atol=2e-6)
    _, none = A.dot_product_attention(d(q), d(k), d(v), nheads=4, need_weights=False)
    assert none is None
    if dev == "cuda":       # the heads split and join as views: y (N, Lq, H*dv) is the kernel's own buffer
        assert y._data.is_contiguous()


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_sdpa_three_dimensional_and_masks(dev):
    d = tf.cpu_device() if dev == "cpu" else tf.CUDADevice(0)
    rng = np.random.default_rng(27)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((3, 6, 5), (3, 8, 5), (3, 8, 4)))
    m = rng.random((3, 6, 8)) < 0.7
    y = A.scaled_dot_product_attention(d(q), d(k), d(v), d(m), is_causal=True, scale=0.7)
    tm = torch.from_numpy(m) & torch.ones(6, 8, dtype=torch.bool).tril()
    ty = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                                          attn_mask=tm, scale=0.7)
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=2e-5, atol=2e-6)
    assert A.make_causal_mask(d(q)).numpy().tolist() == np.tri(6, dtype=bool).tolist()


def test_batched_mul_and_transpose():
    rng = np.random.default_rng(28)
    a, b = rng.standard_normal((4, 3, 5)).astype(np.float32), rng.standard_normal((1, 5, 2)).astype(np.float32)
    np.testing.assert_allclose(A.batched_mul(a, b).numpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose(A.batched_mul(a, b[0]).numpy(), a @ b[0], rtol=1e-5)
    assert A.batched_transpose(a).shape == (4, 5, 3)
    np.testing.assert_array_equal(A.batched_adjoint(a).numpy(), a.transpose(0, 2, 1))


def test_flops_count_the_pairs_causal_masking_leaves():
    shapes = [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)]
    assert attention_flops("attention", "forward", shapes, None, {}, 0) == 2 * 6 * 35 * 12
    causal = sum(min(i + 1, 7) for i in range(5))
    assert attention_flops("attention", "forward", shapes, None, {"causal": True}, 0) == 2 * 6 * causal * 12
    assert attention_flops("attention", "backward", shapes, None, {}, 0) == 2 * 6 * 35 * (24 + 8)


# --- MultiHeadAttention --------------------------------------------------------------------------------

@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_multi_head_attention_matches_torch(dev):
    """Against torch.nn.MultiheadAttention (batch_first) with the same
    weights: its packed in_proj splits into q_proj, k_proj, v_proj, and its
    bool attn_mask is True where *not* allowed (the inverse of ours)."""
    d = tf.cpu_device() if dev == "cpu" else tf.CUDADevice(0)
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(12, 3, bias=True, batch_first=True).double()
    mha = MultiHeadAttention(12, nheads=3, bias=True, dtype=np.float64)
    w, b = tm.in_proj_weight.detach().numpy(), tm.in_proj_bias.detach().numpy()
    for i, proj in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
        proj.weight = tf.tensor(w[12 * i:12 * (i + 1)].copy())
        proj.bias = tf.tensor(b[12 * i:12 * (i + 1)].copy())
    mha.out_proj.weight = tf.tensor(tm.out_proj.weight.detach().numpy().copy())
    mha.out_proj.bias = tf.tensor(tm.out_proj.bias.detach().numpy().copy())
    mha = d(mha)
    rng = np.random.default_rng(29)
    x, kv = rng.standard_normal((2, 7, 12)), rng.standard_normal((2, 9, 12))
    allowed = np.tri(7, 9, dtype=bool)
    y, a = mha(d(x), d(kv), mask=d(allowed))
    ty, ta = tm(torch.from_numpy(x), torch.from_numpy(kv), torch.from_numpy(kv),
                attn_mask=torch.from_numpy(~allowed), average_attn_weights=False)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.numpy(), ta.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert a.shape == (2, 3, 7, 9)
    y2, a2 = mha(d(x))
    assert y2.shape == (2, 7, 12) and a2.shape == (2, 3, 7, 7)
    y3, a3 = mha(d(x), d(kv), causal=True)           # the causal flag is the causal mask
    np.testing.assert_allclose(y3.numpy(), y.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(a3.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)


def test_multi_head_attention_dims_printing_and_dropout():
    assert repr(MultiHeadAttention(64)).startswith("MultiHeadAttention(64; nheads=8)")
    m = MultiHeadAttention((64, (32, 16), 48), nheads=4, bias=True, dropout_prob=0.1)
    assert repr(m).startswith("MultiHeadAttention(64 => (32, 16) => 48; nheads=4, bias=true, dropout_prob=0.1)")
    assert (m.q_proj.weight.shape, m.k_proj.weight.shape, m.v_proj.weight.shape, m.out_proj.weight.shape) == \
        ((32, 64), (32, 64), (16, 64), (48, 16))
    m = MultiHeadAttention(((10, 6, 4), (8, 12), 5), nheads=2)
    assert repr(m).startswith("MultiHeadAttention((10, 6, 4) => (8, 12) => 5; nheads=2)")
    x = tf.tensor(np.random.default_rng(30).standard_normal((2, 3, 10)).astype(np.float32))
    kk = tf.tensor(np.ones((2, 4, 6), np.float32))
    vv = tf.tensor(np.ones((2, 4, 4), np.float32))
    y, a = m(x, kk, vv)
    assert y.shape == (2, 3, 5) and a.shape == (2, 2, 3, 4)
    drop = MultiHeadAttention(8, nheads=2, dropout_prob=0.5)
    z = tf.tensor(np.random.default_rng(31).standard_normal((1, 6, 8)).astype(np.float32))
    _, a_test = drop(z)
    assert np.allclose(a_test.numpy().sum(-1), 1, atol=1e-6)          # no dropout outside training
    tf.trainmode(drop)
    _, a_train = drop(z)
    assert (a_train.numpy() == 0).any()


def test_inside_gradient_16_bit_gradients_read_the_unrounded_output():
    """Inside ``gradient`` a 16-bit forward keeps y in float32 too, so the
    backward's D = dO . y carries no bfloat16 rounding of y: the gradients are
    closer to the float64 reference than a backward reading the rounded y."""
    q, k, v = _qkv(32, n=2, h=2, lq=24, lk=31, d=16, dv=16)
    g = np.random.default_rng(33).standard_normal((2, 2, 24, 16))
    dev = tf.CUDADevice(0)
    ts = [dev(a.astype(np.float32)).astype("bfloat16") for a in (q, k, v, g)]
    q, k, v, g = (t.numpy().astype(np.float64) for t in ts)          # the bfloat16 values, exactly
    dq_tape, = tf.gradient(lambda x: (A.scaled_dot_product_attention(x, ts[1], ts[2], is_causal=True)
                                      * ts[3]).sum(), ts[0])
    _, (dq_direct, _, _) = _kernel((q, k, v), {"causal": True}, g, torch.bfloat16)
    rq = ref.attention_backward(g, ref.attention_forward(q, k, v, causal=True), q, k, v, causal=True)[0]
    err_tape = np.abs(dq_tape.numpy().astype(np.float64) - rq).max() / np.abs(rq).max()
    err_direct = np.abs(_np(dq_direct) - rq).max() / np.abs(rq).max()
    assert err_tape <= 2 ** -7, err_tape
    assert err_tape <= err_direct, (err_tape, err_direct)
