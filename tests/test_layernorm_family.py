"""layernorm / rmsnorm / groupnorm / instancenorm_train /
instancenorm_running_update and their layers: the cases the generic property
suite does not pin down.

Forward and every gradient against torch (float64 and float32, both sides),
rows of one and two values (which the strategies leave out: y = bias and
dx = 0 exactly for one, xhat = +-1 up to eps for two), rmsnorm's eps=None in
every dtype, a negative eps, NaN and infinities, affine=False and weight-only
forms, non-contiguous views. The GPU's plans run in the interpreter (chunked
rows, several programs with the ordered second pass), and the parameter
gradients are the same bits on every run. Instance norm's running
statistics against torch (empty batches, empty instances, one position,
infinities), moved in place or aside, in the same launches. The layers
against torch's modules on both devices, their printing, their training
step (all or nothing), and bad input: a triflux error naming what it got and
what it expects, with nothing changed.
"""
import numpy as np
import pytest

import triflux as tf
from triflux import backend
from triflux.errors import ArgumentError, DeviceMismatchError, ShapeError
from triflux.reference import layernorm as ref

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux import normalisation as norm  # noqa: E402
from triflux.layers.normalisation import GroupNorm, InstanceNorm, LayerNorm, RMSNorm  # noqa: E402
from triflux.triton_kernels import launch  # noqa: E402
from triflux.triton_kernels import layernorm as kn  # noqa: E402

DEVICES = (tf.cpu_device(), tf.CUDADevice(0))


def _np(t):
    return t.detach().to("cpu").to(torch.float64).numpy()


def _t(a, dtype=torch.float64, grad=False):
    t = torch.from_numpy(np.array(a, dtype=np.float64)).to(dtype)
    return t.requires_grad_(True) if grad else t


def _close(a, e, rtol, what=""):
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"{what}: NaN positions")
    fin = np.isfinite(e)
    np.testing.assert_array_equal(a[~fin & ~np.isnan(e)], e[~fin & ~np.isnan(e)], err_msg=f"{what}: infinities")
    if fin.any():
        err = np.max(np.abs(a[fin] - e[fin])) / max(np.max(np.abs(e[fin])), 1e-30)
        assert err <= rtol, f"{what}: normwise relative error {err:.3g} > {rtol:g}"


def _torch(fn, inputs, g):
    """torch's output and gradients of sum(fn(*inputs) * g), float64."""
    ts = [_t(a, grad=True) for a in inputs]
    y = fn(*ts)
    grads = torch.autograd.grad(y, ts, _t(g), allow_unused=True)
    return y.detach().numpy(), [np.zeros(np.shape(a)) if gr is None else gr.numpy() for a, gr in zip(inputs, grads)]


PRIMS = {
    "layernorm": (ref.layernorm_forward, ref.layernorm_backward, kn.layernorm_forward, kn.layernorm_backward),
    "rmsnorm": (ref.rmsnorm_forward, ref.rmsnorm_backward, kn.rmsnorm_forward, kn.rmsnorm_backward),
    "groupnorm": (ref.groupnorm_forward, ref.groupnorm_backward, kn.groupnorm_forward, kn.groupnorm_backward),
    "instancenorm_train": (ref.instancenorm_train_forward, ref.instancenorm_train_backward,
                           kn.instancenorm_train_forward, kn.instancenorm_train_backward),
}


def _both_sides(name, inputs, attrs, g, want_y, want_grads, rtol64=1e-11, rtol32=2e-5, dtypes=None):
    """The reference (float64) and the kernel (float64, float32) against torch's float64 results."""
    rf, rb, kf, kb = PRIMS[name]
    y = rf(*inputs, **attrs)
    _close(y, want_y, rtol64, f"{name} reference y")
    for i, gr in enumerate(rb(g, y, *inputs, **attrs)[:len(want_grads)]):
        _close(gr, want_grads[i], rtol64, f"{name} reference gradient {i}")
    for dtype, rtol in dtypes or ((torch.float64, rtol64), (torch.float32, rtol32)):
        ks = [_t(a, dtype) for a in inputs]
        ky = kf(*ks, **attrs)
        assert ky.dtype == dtype
        _close(_np(ky), want_y, rtol, f"{name} kernel y {dtype}")
        kg = kb(_t(g, dtype), ky, *ks, **attrs)
        assert len(kg) == len(inputs)
        for i, gr in enumerate(kg[:len(want_grads)]):
            assert gr.dtype == dtype and tuple(gr.shape) == np.shape(inputs[i])
            _close(_np(gr), want_grads[i], 10 * rtol, f"{name} kernel gradient {i} {dtype}")


def _inputs(shape, seed, pshape, offset=0.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 1.5 + offset
    w = rng.uniform(0.5, 2.0, pshape) * rng.choice([-1, 1], pshape)
    b = rng.standard_normal(pshape)
    return x, w, b, rng.standard_normal(shape)


# --- against torch ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,k", [((4, 7), 1), ((2, 3, 5), 2), ((3, 1, 300), 1), ((6,), 1)])
@pytest.mark.parametrize("params", [0, 1, 2])
@pytest.mark.parametrize("activation", ["identity", "sigmoid"])
def test_layernorm_matches_torch(shape, k, params, activation):
    pshape = shape[len(shape) - k:]
    x, w, b, g = _inputs(shape, 1, pshape, offset=20.0)
    inputs = (x, w, b)[:1 + params]

    def fn(*ts):
        return tf.testing.torch_activated(F.layer_norm(ts[0], pshape, *ts[1:], eps=1e-3), activation)
    want_y, want = _torch(fn, inputs, g)
    _both_sides("layernorm", inputs, dict(normalised_ndim=k, eps=1e-3, activation=activation), g, want_y, want)


@pytest.mark.parametrize("shape,k", [((4, 7), 1), ((2, 3, 5), 2), ((2, 500), 1)])
@pytest.mark.parametrize("params", [0, 1])
def test_rmsnorm_matches_torch(shape, k, params):
    pshape = shape[len(shape) - k:]
    x, w, _, g = _inputs(shape, 2, pshape)
    inputs = (x, w)[:1 + params]
    want_y, want = _torch(lambda *ts: F.rms_norm(ts[0], pshape, *ts[1:], eps=1e-4), inputs, g)
    _both_sides("rmsnorm", inputs, dict(normalised_ndim=k, eps=1e-4), g, want_y, want)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((3, 8), 2), ((2, 8, 3, 5), 4), ((1, 6, 4, 4), 1)])
@pytest.mark.parametrize("params", [0, 1, 2])
@pytest.mark.parametrize("activation", ["identity", "relu"])
def test_groupnorm_matches_torch(shape, groups, params, activation):
    x, w, b, g = _inputs(shape, 3, (shape[1],), offset=-7.0)
    inputs = (x, w, b)[:1 + params]

    def fn(*ts):
        return tf.testing.torch_activated(F.group_norm(ts[0], groups, *ts[1:], eps=1e-5), activation)
    want_y, want = _torch(fn, inputs, g)
    _both_sides("groupnorm", inputs, dict(groups=groups, activation=activation), g, want_y, want)


@pytest.mark.parametrize("shape", [(3, 4, 6), (2, 3, 4, 5)])
@pytest.mark.parametrize("affine", [False, True])
def test_instancenorm_matches_torch_instance_norm(shape, affine):
    x, w, b, g = _inputs(shape, 4, (shape[1],))
    inputs = (x, w, b) if affine else (x,)
    want_y, want = _torch(lambda *ts: F.instance_norm(ts[0], None, None, *ts[1:], eps=1e-4), inputs, g)
    _both_sides("instancenorm_train", inputs, dict(affine=affine, eps=1e-4), g, want_y, want, rtol64=1e-10)


def test_rows_of_one_value_give_the_bias_and_no_gradient():
    """A row of one value normalises to exactly 0: y = bias (act(bias)) and
    dx = 0 exactly, on every side and in every dtype; dweight = 0 and dbias = sum g."""
    x, w, b, g = _inputs((5, 1), 5, (1,), offset=3.0)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        ks = [_t(a, dtype) for a in (x, w, b)]
        for f, bw, args in ((kn.layernorm_forward, kn.layernorm_backward, ks),
                            (ref.layernorm_forward, ref.layernorm_backward, [_np(a) for a in ks])):
            y = f(*args)
            yy = _np(y) if isinstance(y, torch.Tensor) else y
            np.testing.assert_array_equal(yy, np.broadcast_to(_np(ks[2]), (5, 1)))
            grads = bw(_t(g, dtype) if isinstance(y, torch.Tensor) else _np(_t(g, dtype)), y, *args)
            vals = [_np(gr) if isinstance(gr, torch.Tensor) else gr for gr in grads]
            np.testing.assert_array_equal(vals[0], 0)
            np.testing.assert_array_equal(vals[1], 0)
    for f, args in ((kn.groupnorm_forward, [_t(x.reshape(5, 1, 1)), _t(w), _t(b)]),
                    (kn.instancenorm_train_forward, [_t(x.reshape(5, 1, 1)), _t(w), _t(b)])):
        attrs = {"groups": 1} if f is kn.groupnorm_forward else {"affine": True}
        np.testing.assert_array_equal(_np(f(*args, **attrs)), np.broadcast_to(b, (5, 1, 1)))


def test_rows_of_two_values_match_torch():
    """Two values normalise to +-1 up to eps and dx cancels to a small
    difference: kernel and reference agree with torch to the size of the terms."""
    x, w, b, g = _inputs((6, 2), 6, (2,))
    want_y, want = _torch(lambda *ts: F.layer_norm(ts[0], (2,), *ts[1:], eps=1e-5), (x, w, b), g)
    rf, rb, kf, kb = PRIMS["layernorm"]
    scale = np.abs(g).max() * np.abs(w).max() / np.sqrt(np.var(x, axis=1).min() + 1e-5)
    _close(rf(x, w, b), want_y, 1e-12)
    for got in (rb(g, None, x, w, b), kb(_t(g), kf(_t(x), _t(w), _t(b)), _t(x), _t(w), _t(b))):
        got = [_np(v) if isinstance(v, torch.Tensor) else v for v in got]
        assert np.max(np.abs(got[0] - want[0])) <= 1e-12 * scale
        _close(got[1], want[1], 1e-12)
        _close(got[2], want[2], 1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_rmsnorm_eps_none_is_the_compute_types_machine_epsilon(dtype):
    """eps=None is 2^-23 for 16-bit and float32 data and 2^-52 for float64,
    what torch's rms_norm computes: rows of tiny values (where eps decides the
    result) agree with torch's eps=None in each dtype, on both sides."""
    x = np.array([[1e-4, 2e-4, -3e-4], [1.0, 2.0, 3.0]])
    xt = _t(x, dtype)
    want = _np(F.rms_norm(xt.float() if dtype != torch.float64 else xt, (3,)))
    explicit = 2.0 ** -52 if dtype == torch.float64 else 2.0 ** -23
    for got in (kn.rmsnorm_forward(xt), kn.rmsnorm_forward(xt, eps=None)):
        np.testing.assert_array_equal(_np(got), _np(kn.rmsnorm_forward(xt, eps=explicit)))
        _close(_np(got), want, {torch.float64: 1e-14, torch.float32: 1e-6}.get(dtype, 1e-2))
    np.testing.assert_array_equal(ref.rmsnorm_forward(_np(xt).astype(tf.testing.to_numpy(xt).dtype)),
                                  ref.rmsnorm_forward(tf.testing.to_numpy(xt), eps=explicit))
    _close(_np(F.rms_norm(xt, (3,))), _np(kn.rmsnorm_forward(xt)), {torch.float64: 1e-14, torch.float32: 1e-6}
           .get(dtype, 1e-2))


def test_negative_eps_and_nonfinite_rows_as_torch():
    """A negative eps gives NaN where var + eps < 0 (torch's functional forms
    take any eps); a row with NaN or +-inf is NaN in y and dx, and its NaN
    reaches dweight and dbias."""
    x, w, b, g = _inputs((4, 5), 7, (5,))
    x[0] *= 0.1                          # a row of small variance: var - 0.5 < 0
    want_y, want = _torch(lambda *ts: F.layer_norm(ts[0], (5,), *ts[1:], eps=-0.5), (x, w, b), g)
    assert np.isnan(want_y[0]).all() and np.isfinite(want_y[1:]).all()
    _both_sides("layernorm", (x, w, b), dict(eps=-0.5), g, want_y, want)
    x, w, b, g = _inputs((4, 5), 8, (5,))
    x[1, 2], x[2, 0], x[3, 4] = np.nan, np.inf, -np.inf
    want_y, want = _torch(lambda *ts: F.layer_norm(ts[0], (5,), *ts[1:]), (x, w, b), g)
    _both_sides("layernorm", (x, w, b), {}, g, want_y, want)
    xg = x.reshape(2, 2, 5)
    want_y, want = _torch(lambda *ts: F.group_norm(ts[0], 2, *ts[1:]), (xg, w[:2], b[:2]), g.reshape(2, 2, 5))
    _both_sides("groupnorm", (xg, w[:2], b[:2]), {"groups": 2}, g.reshape(2, 2, 5), want_y, want)
    want_y, want = _torch(lambda *ts: F.rms_norm(ts[0], (5,), *ts[1:], eps=1e-5), (x, w), g)
    _both_sides("rmsnorm", (x, w), {"eps": 1e-5}, g, want_y, want)


def test_empty_inputs():
    """No rows, or rows of no values: empty outputs and zero parameter gradients."""
    for shape, k in (((0, 4), 1), ((3, 0), 1), ((2, 0, 3), 2)):
        p = np.ones(shape[len(shape) - k:])
        for side in ("reference", "kernel"):
            conv = (lambda a: a) if side == "reference" else _t
            x, w, b = conv(np.zeros(shape)), conv(p), conv(p)
            f, bw = (PRIMS["layernorm"][:2] if side == "reference" else PRIMS["layernorm"][2:])
            y = f(x, w, b, normalised_ndim=k)
            assert tuple(y.shape) == shape
            dx, dw, db = bw(y, y, x, w, b, normalised_ndim=k)
            assert tuple(dx.shape) == shape
            np.testing.assert_array_equal(_np(dw) if side == "kernel" else dw, np.zeros(p.shape))
    for shape in ((0, 4, 3), (2, 4, 0), (2, 0, 3)):
        x = _t(np.zeros(shape))
        y = kn.groupnorm_forward(x, groups=2 if shape[1] else 1)
        assert tuple(y.shape) == shape


def test_views_are_read_as_they_are():
    """Transposed and strided x, weight and gradient give what dense ones give."""
    x, w, b, g = _inputs((5, 6), 9, (6,))
    kx = _t(np.ascontiguousarray(x.T), torch.float32).T
    kw = _t(np.repeat(w, 2), torch.float32)[::2]
    kg = _t(np.ascontiguousarray(g.T), torch.float32).T
    assert not kx.is_contiguous() and not kw.is_contiguous()
    dense = [_t(a, torch.float32) for a in (x, w, b)]
    y = kn.layernorm_forward(kx, kw, dense[2])
    np.testing.assert_array_equal(_np(y), _np(kn.layernorm_forward(*dense)))
    for a, e in zip(kn.layernorm_backward(kg, y, kx, kw, dense[2]),
                    kn.layernorm_backward(_t(g, torch.float32), y, *dense)):
        np.testing.assert_array_equal(_np(a), _np(e))


# --- the GPU's plans in the interpreter, determinism ---------------------------------------------

@pytest.fixture
def tiny_gpu_plan(monkeypatch):
    """The GPU plans with blocks of 16 row values, tiles of 8 and (for the
    rows) programs over a couple of row blocks each: rows in chunks, several
    programs adding their partial sums in the second pass, groups in tiles."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(kn, "_GPU_ROW_BLOCK", {"forward": 16, "backward": 16})
    monkeypatch.setattr(kn, "_GPU_TILE", 8)
    kn._row_plan.cache_clear()
    kn._group_plan.cache_clear()
    yield
    kn._row_plan.cache_clear()
    kn._group_plan.cache_clear()


@pytest.mark.parametrize("shape,k", [((12, 5), 1), ((3, 37), 1), ((3, 4, 9), 2)])
def test_gpu_row_plans_match_the_reference(shape, k, tiny_gpu_plan):
    """Short rows several to a program, long rows in chunks, and a backward of
    several programs whose partial sums the second pass adds: float64 and
    float32 kernels against the reference."""
    plan = kn._row_plan(int(np.prod(shape[:len(shape) - k])), int(np.prod(shape[len(shape) - k:])), 8, "backward",
                        False, launch.sm_count(0))
    assert plan.programs > 1 or not plan.single
    pshape = shape[len(shape) - k:]
    x, w, b, g = _inputs(shape, 10, pshape, offset=30.0)
    for name, inputs, attrs in (("layernorm", (x, w, b), dict(normalised_ndim=k, activation="tanh")),
                                ("layernorm", (x, w), dict(normalised_ndim=k)),
                                ("rmsnorm", (x, w), dict(normalised_ndim=k))):
        rf, rb, kf, kb = PRIMS[name]
        y = rf(*inputs, **attrs)
        want = rb(g, y, *inputs, **attrs)
        for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 3e-5)):
            ks = [_t(a, dtype) for a in inputs]
            ky = kf(*ks, **attrs)
            _close(_np(ky), y, rtol, f"{name} y")
            for i, (a, e) in enumerate(zip(kb(_t(g, dtype), ky, *ks, **attrs), want)):
                _close(_np(a), e, 10 * rtol, f"{name} gradient {i} {dtype}")


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 3), 2), ((2, 4, 11), 4)])
def test_gpu_group_plans_match_the_reference(shape, groups, tiny_gpu_plan):
    assert kn._group_plan(shape[1] // groups, int(np.prod(shape[2:])), 8, False).num_tiles > 1
    x, w, b, g = _inputs(shape, 11, (shape[1],), offset=30.0)
    y = ref.groupnorm_forward(x, w, b, groups=groups, activation="sigmoid")
    want = ref.groupnorm_backward(g, y, x, w, b, groups=groups, activation="sigmoid")
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 3e-5)):
        ks = [_t(a, dtype) for a in (x, w, b)]
        ky = kn.groupnorm_forward(*ks, groups=groups, activation="sigmoid")
        _close(_np(ky), y, rtol, "y")
        for i, (a, e) in enumerate(zip(kn.groupnorm_backward(_t(g, dtype), ky, *ks, groups=groups,
                                                             activation="sigmoid"), want)):
            _close(_np(a), e, 10 * rtol, f"gradient {i}")


def _bits(t):
    return _np(t).tobytes() if isinstance(t, torch.Tensor) else np.asarray(t).tobytes()


@pytest.mark.parametrize("gpu", [False, True], ids=["interpreter", "gpu plan"])
def test_parameter_gradients_are_the_same_bits_every_run(gpu, monkeypatch, request):
    """The same inputs give bit-identical gradients (dx, dweight, dbias) run
    after run: per-program partial sums and an ordered second pass, no
    atomics; with the GPU's plan, several programs feed the second pass."""
    if gpu:
        request.getfixturevalue("tiny_gpu_plan")
    x, w, b, g = _inputs((9, 20), 12, (20,))
    xg, wg, bg, gg = _inputs((3, 4, 9), 13, (4,))
    for dtype in (torch.float32, torch.bfloat16):
        runs = []
        for _ in range(2):
            ks = [_t(a, dtype) for a in (x, w, b)]
            ky = kn.layernorm_forward(*ks)
            out = list(kn.layernorm_backward(_t(g, dtype), ky, *ks))
            out += list(kn.rmsnorm_backward(_t(g, dtype), ky, ks[0], ks[1]))
            kgs = [_t(a, dtype) for a in (xg, wg, bg)]
            kgy = kn.groupnorm_forward(*kgs, groups=2)
            out += list(kn.groupnorm_backward(_t(gg, dtype), kgy, *kgs, groups=2))
            runs.append([_bits(t) for t in out])
        assert runs[0] == runs[1]
    r1 = [_bits(a) for a in ref.layernorm_backward(g, None, x, w, b)]
    assert r1 == [_bits(a) for a in ref.layernorm_backward(g, None, x, w, b)]


def test_launches_per_call(monkeypatch):
    """One launch per forward; a backward is one launch where one program
    covers the rows (the interpreter's small cases), plus the second pass
    otherwise; instance norm's running statistics add one small launch."""
    names = []
    real = launch.launch

    def recording(kernel, grid, *args, **meta):
        names.append(kernel.__name__)
        return real(kernel, grid, *args, **meta)
    monkeypatch.setattr(launch, "launch", recording)
    x, w, b, g = _inputs((4, 8), 14, (8,))
    ks = [_t(a, torch.float32) for a in (x, w, b)]
    y = kn.layernorm_forward(*ks)
    kn.layernorm_backward(_t(g, torch.float32), y, *ks)
    assert names == ["_rows_forward_kernel", "_rows_backward_kernel"]
    names.clear()
    xi = _t(np.random.default_rng(0).standard_normal((2, 3, 5)), torch.float32)
    rm, rv = _t(np.zeros(3), torch.float32), _t(np.ones(3), torch.float32)
    kn.instancenorm_train_forward(xi, rm, rv)
    assert names == ["_groupnorm_forward_kernel", "_instance_running_kernel"]


def test_torch_only_allocates():
    x, w, b, g = _inputs((3, 4, 5), 15, (5,))
    ks = [_t(a, torch.float32) for a in (x, w, b)]
    kx = _t(np.ascontiguousarray(np.swapaxes(x, 1, 2)), torch.float32).transpose(1, 2)
    rm, rv = _t(np.zeros(4), torch.float32), _t(np.ones(4), torch.float32)

    def work():
        y = kn.layernorm_forward(kx, ks[1], ks[2], activation="relu")
        kn.layernorm_backward(y, y, kx, ks[1], ks[2], activation="relu")
        z = kn.rmsnorm_forward(kx, ks[1])
        kn.rmsnorm_backward(z, z, kx, ks[1])
        v = kn.groupnorm_forward(kx, ks[1][:4], ks[2][:4], groups=2)
        kn.groupnorm_backward(v, v, kx, ks[1][:4], ks[2][:4], groups=2)
        kn.instancenorm_train_forward(kx, rm, rv, momentum=0.3)
        kn.instancenorm_running_update_forward(kx, rm, rv)
    assert_torch_only_moves_memory(work, "the per-sample normalisation kernels")


# --- instance norm's running statistics ------------------------------------------------------------

def _torch_running(x, mean, var, momentum):
    m, v = torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())
    if x.size:
        F.instance_norm(torch.from_numpy(x), m, v, use_input_stats=True, momentum=momentum)
    return m.numpy(), v.numpy()


def _running_sides(x, mean, var, momentum, dtype=torch.float64):
    """The running statistics moved by the reference, the kernel's update and
    the kernel's fused forward (in place, and aside into moved vectors)."""
    out = []
    m, v = mean.copy(), var.copy()
    ref.instancenorm_running_update_forward(x, m, v, momentum=momentum)
    out.append(("reference", m, v))
    m, v = mean.copy(), var.copy()
    ref.instancenorm_train_forward(x, m, v, momentum=momentum)
    out.append(("reference fused", m, v))
    km, kv = _t(mean, dtype), _t(var, dtype)
    assert kn.instancenorm_running_update_forward(_t(x, dtype), km, kv, momentum=momentum) is None
    out.append(("kernel", _np(km), _np(kv)))
    km, kv = _t(mean, dtype), _t(var, dtype)
    kn.instancenorm_train_forward(_t(x, dtype), km, kv, momentum=momentum)
    out.append(("kernel fused", _np(km), _np(kv)))
    km, kv = _t(mean, dtype), _t(var, dtype)
    mm, mv = _t(np.full_like(mean, 7.0), dtype), _t(np.full_like(var, 7.0), dtype)
    kn.instancenorm_train_forward(_t(x, dtype), km, kv, mm, mv, momentum=momentum)
    np.testing.assert_array_equal(_np(km), _np(_t(mean, dtype)))
    np.testing.assert_array_equal(_np(kv), _np(_t(var, dtype)))
    out.append(("kernel moved", _np(mm), _np(mv)))
    return out


@pytest.mark.parametrize("shape", [(4, 3, 6), (2, 3, 4, 5), (0, 3, 4), (2, 3, 0)])
@pytest.mark.parametrize("momentum", [0.1, -1.2])
def test_running_statistics_match_torch(shape, momentum):
    """running = (1 - momentum) running + momentum * the batch's average of
    the instances' means and unbiased variances (torch's); empty instances
    move nothing, and (where torch stores NaN) neither does an empty batch."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal(shape) * 2 + 5
    mean, var = rng.standard_normal(shape[1]), rng.uniform(0.5, 2, shape[1])
    want = (mean, var) if shape[0] == 0 else _torch_running(x, mean, var, momentum)
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        for what, m, v in _running_sides(x, mean, var, momentum, dtype):
            if dtype != torch.float64 and what.startswith("reference"):
                continue
            _close(m, want[0], rtol, f"{what} mean {dtype}")
            _close(v, want[1], rtol, f"{what} var {dtype}")


def test_running_statistics_with_one_position_and_nonfinite_instances():
    """S = 1: the variance taken is sqdev / 1 = 0 (torch refuses such input);
    an instance with +inf moves its channel's mean to inf and variance to NaN,
    one with NaN both to NaN (torch's), the other channels as usual."""
    x = np.arange(6.0).reshape(2, 3, 1)
    mean, var = np.zeros(3), np.ones(3)
    for what, m, v in _running_sides(x, mean, var, 0.5):
        _close(m, 0.5 * x[:, :, 0].mean(axis=0), 1e-14, what)
        _close(v, 0.5 * np.ones(3), 1e-14, what)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((3, 3, 4))
    x[1, 0, 2], x[2, 1, 1] = np.inf, np.nan
    want = _torch_running(x, mean, var, 0.1)
    assert np.isinf(want[0][0]) and np.isnan(want[1][0]) and np.isnan(want[0][1]) and np.isfinite(want[0][2])
    for dtype in (torch.float64, torch.float32):
        for what, m, v in _running_sides(x, mean, var, 0.1, dtype):
            _close(m, want[0], 1e-6, what)
            _close(v, want[1], 1e-6, what)


def test_fused_running_move_is_the_separate_update_bit_for_bit():
    rng = np.random.default_rng(18)
    x = rng.standard_normal((5, 4, 7)) + 3
    mean, var = rng.standard_normal(4), rng.uniform(0.5, 2, 4)
    for dtype in (torch.float32, torch.float64):
        sides = {what: (m, v) for what, m, v in _running_sides(x, mean, var, 0.3, dtype)}
        for what in ("kernel fused", "kernel moved"):
            for a, e in zip(sides[what], sides["kernel"]):
                np.testing.assert_array_equal(a, e)
    ky = kn.instancenorm_train_forward(_t(x), _t(mean), _t(var), momentum=0.3)
    np.testing.assert_array_equal(_np(ky), _np(kn.instancenorm_train_forward(_t(x))))


# --- the functions and layers ------------------------------------------------------------------------

def _dev(d, a):
    return d(np.asarray(a, np.float32))


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
def test_layers_match_torch_modules(device):
    rng = np.random.default_rng(19)
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    cases = [
        (LayerNorm((5, 6)), torch.nn.LayerNorm((5, 6))),
        (LayerNorm(6, affine=False), torch.nn.LayerNorm(6, elementwise_affine=False)),
        (LayerNorm(6, bias=False), torch.nn.LayerNorm(6, bias=False)),
        (RMSNorm(6), torch.nn.RMSNorm(6)),
        (RMSNorm((5, 6), eps=1e-3, affine=False), torch.nn.RMSNorm((5, 6), eps=1e-3, elementwise_affine=False)),
        (GroupNorm(4, 2), torch.nn.GroupNorm(2, 4)),
        (GroupNorm(4, 4, affine=False), torch.nn.GroupNorm(4, 4, affine=False)),
        (InstanceNorm(4), torch.nn.InstanceNorm2d(4)),
        (InstanceNorm(4, affine=True), torch.nn.InstanceNorm2d(4, affine=True)),
    ]
    for layer, module in cases:
        for name in ("weight", "bias"):
            if getattr(layer, name, None) is not None:
                value = rng.uniform(0.5, 1.5, getattr(layer, name).shape).astype(np.float32)
                setattr(layer, name, tf.tensor(value))
                getattr(module, name).data = torch.from_numpy(value)
        layer = device(layer)
        xt = torch.from_numpy(x).requires_grad_(True)
        want = module(xt)
        g = rng.standard_normal(want.shape).astype(np.float32)
        want_grads = torch.autograd.grad(want, [xt] + list(module.parameters()), torch.from_numpy(g))
        xd = device(x)
        y = layer(xd)
        np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=1e-5, atol=2e-5, err_msg=repr(layer))
        gx, gl = tf.gradient(lambda inp, m: (m(inp) * device(g)).sum(), xd, layer)
        np.testing.assert_allclose(gx.numpy(), want_grads[0].numpy(), rtol=1e-4, atol=1e-4, err_msg=repr(layer))
        for name, tg in zip([n for n, _ in module.named_parameters()], want_grads[1:]):
            np.testing.assert_allclose(gl[name].numpy(), tg.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{layer} {name}")


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_fused_activation_equals_the_layer_then_the_activation(activation):
    act = getattr(tf, activation)
    rng = np.random.default_rng(20)
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    for d in DEVICES:
        for fused, plain in ((LayerNorm((3, 3), act), LayerNorm((3, 3))), (GroupNorm(4, 2, act), GroupNorm(4, 2)),
                             (InstanceNorm(4, act, affine=True), InstanceNorm(4, affine=True))):
            fused, plain = d(fused), d(plain)
            xd = d(x)
            lf, (gf,) = tf.withgradient(lambda m: (m(xd) * xd).sum(), fused)
            lp, (gp,) = tf.withgradient(lambda m: (act(m(xd)) * xd).sum(), plain)
            np.testing.assert_allclose(lf.item(), lp.item(), rtol=1e-5)
            for k in ("weight", "bias"):
                np.testing.assert_allclose(gf[k].numpy(), gp[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


def test_printing_as_flux():
    assert repr(LayerNorm(5)) == "LayerNorm(5)  # 10 parameters"
    assert repr(LayerNorm((3, 4), tf.relu)) == "LayerNorm(3, 4, relu)  # 24 parameters"
    assert repr(LayerNorm(5, affine=False)) == "LayerNorm(5, affine=false)"
    assert repr(GroupNorm(4, 2)) == "GroupNorm(4, 2)  # 8 parameters"
    assert repr(GroupNorm(4, 2, tf.relu, affine=False)) == "GroupNorm(4, 2, relu, affine=false)"
    assert repr(InstanceNorm(3)) == "InstanceNorm(3, affine=false)"
    assert repr(InstanceNorm(3, tf.relu, affine=True, track_stats=True)) == \
        "InstanceNorm(3, relu)  # 6 parameters, plus 6 non-trainable"
    assert repr(RMSNorm(8)) == "RMSNorm(8)  # 8 parameters"
    for d in DEVICES:
        assert repr(d(LayerNorm(5))) == "LayerNorm(5)  # 10 parameters"


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
def test_instance_norm_layer_training_and_testing(device):
    """track_stats: training moves the running statistics (as torch's
    InstanceNorm in train mode), testing normalises with them (as torch's in
    eval mode); without track_stats both modes use the instances' own."""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((4, 3, 5, 2)) * 2 + 1).astype(np.float32)
    layer = device(InstanceNorm(3, affine=True, track_stats=True, momentum=0.2))
    module = torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.2)
    for _ in range(2):
        tf.trainmode(layer)(device(x))
        module.train()(torch.from_numpy(x))
    np.testing.assert_allclose(layer.running_mean.numpy(), module.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), module.running_var.numpy(), rtol=1e-5, atol=1e-6)
    y = tf.testmode(layer)(device(x))
    np.testing.assert_allclose(y.numpy(), module.eval()(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    before = tf.state(layer)
    tf.testmode(layer)(device(x))
    assert all(before[k].tobytes() == tf.state(layer)[k].tobytes() for k in before)
    plain = device(InstanceNorm(3))
    np.testing.assert_array_equal(tf.testmode(plain)(device(x)).numpy(), tf.trainmode(plain)(device(x)).numpy())
    empty = tf.trainmode(device(InstanceNorm(3, track_stats=True)))
    assert empty(device(np.zeros((0, 3, 4), np.float32))).shape == (0, 3, 4)
    np.testing.assert_array_equal(empty.running_mean.numpy(), np.zeros(3))


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "cuda"])
def test_a_failed_step_leaves_the_running_statistics(device):
    """Inside gradient the moved statistics go to new memory, committed only
    when the step completes: a step that raises leaves them as they were; one
    that completes moves them once."""
    x = device(np.random.default_rng(22).standard_normal((4, 2, 6)).astype(np.float32))
    layer = device(InstanceNorm(2, track_stats=True))
    before = tf.state(layer)

    def failing(m):
        m(x)
        raise RuntimeError("the step fails after the forward")
    with pytest.raises(RuntimeError, match="step fails"):
        tf.gradient(failing, layer)
    after = tf.state(layer)
    for k in before:
        assert before[k].tobytes() == after[k].tobytes(), k
    tf.gradient(lambda m: m(x).sum(), layer)
    assert not np.array_equal(tf.state(layer)["running_mean"], before["running_mean"])


# --- bad input ----------------------------------------------------------------------------------------

def test_bad_input_is_a_triflux_error_before_any_work(monkeypatch):
    from triflux import normalisation as nmod
    monkeypatch.setattr(nmod, "apply", lambda *a, **k: pytest.fail("dispatched a call the spec refuses"))
    x = tf.tensor(np.zeros((2, 6, 4), np.float32))
    with pytest.raises(ShapeError, match=r"4 groups do not divide the 6 channels.*\(1, 2, 3, 6\)"):
        norm.group_norm(x, 4)
    with pytest.raises(ShapeError, match=r"normalised_shape \(5,\) must be the last 1 axes.*\(2, 6, 4\)"):
        norm.layer_norm(x, 5)
    with pytest.raises(ShapeError, match=r"weight has shape \(3,\).*needs weight of shape \(4,\)"):
        norm.layer_norm(x, 4, tf.tensor(np.ones(3, np.float32)))
    with pytest.raises(ShapeError, match=r"one value per channel, shape \(6,\).*got shape \(4,\)"):
        norm.group_norm(x, 2, tf.tensor(np.ones(4, np.float32)))
    with pytest.raises(ArgumentError, match="eps must be a finite number"):
        norm.rms_norm(x, 4, eps=float("nan"))
    with pytest.raises(ShapeError, match="more than 1 spatial element"):
        norm.instance_norm(tf.tensor(np.zeros((2, 6, 1), np.float32)))
    with pytest.raises(ArgumentError, match="momentum"):
        norm.instance_norm(x, tf.tensor(np.zeros(6, np.float32)), tf.tensor(np.ones(6, np.float32)),
                           momentum=float("inf"))
    with pytest.raises(ShapeError, match=r"running_mean must have one value per channel"):
        norm.instance_norm(x, tf.tensor(np.zeros(5, np.float32)), tf.tensor(np.ones(5, np.float32)))
    with pytest.raises(ArgumentError, match="groups must be a positive int"):
        norm.group_norm(x, 0)


def test_bad_input_to_the_primitives_on_both_sides():
    for fn, args in ((ref.groupnorm_forward, (np.zeros((2, 6, 3)),)), (kn.groupnorm_forward, (torch.zeros(2, 6, 3),))):
        with pytest.raises(ShapeError, match="4 groups do not divide the 6 channels"):
            fn(*args, groups=4)
    for fn, x, w in ((ref.layernorm_forward, np.zeros((2, 5)), np.ones(4)),
                     (kn.layernorm_forward, torch.zeros(2, 5), torch.ones(4))):
        with pytest.raises(ShapeError, match=r"needs weight of shape \(5,\)"):
            fn(x, w)
    with pytest.raises(ShapeError, match="normalised_ndim=3"):
        kn.rmsnorm_forward(torch.zeros(2, 5), normalised_ndim=3)
    with pytest.raises(ShapeError, match=r"affine=True takes x, weight, bias"):
        ref.instancenorm_train_forward(np.zeros((2, 3, 4)), np.ones(3), affine=True)
    with pytest.raises(ArgumentError, match="activation 'gelu' is not one it applies itself"):
        kn.layernorm_forward(torch.zeros(2, 5), activation="gelu")


def test_bad_input_to_the_layers_changes_nothing():
    layer = InstanceNorm(3, track_stats=True, affine=True)
    tf.trainmode(layer)
    before = tf.state(layer)
    for bad in (np.zeros((2, 4, 5), np.float32), np.zeros((2, 3), np.float32), np.zeros((2, 3, 1), np.float32)):
        with pytest.raises(ShapeError) as e:
            layer(tf.tensor(bad))
        assert "InstanceNorm(3)" in str(e.value) and str(bad.shape) in str(e.value)
    assert all(before[k].tobytes() == tf.state(layer)[k].tobytes() for k in before)
    with pytest.raises(ShapeError, match=r"LayerNorm\(5\) expects 5 features on axis 1.*\(2, 4\)"):
        LayerNorm(5)(tf.tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(ShapeError, match=r"trailing axes of shape \(3, 5\).*\(2, 4, 5\)"):
        LayerNorm((3, 5))(tf.tensor(np.zeros((2, 4, 5), np.float32)))
    with pytest.raises(ShapeError, match="3 groups do not divide 4 channels"):
        GroupNorm(4, 3)
    with pytest.raises(ShapeError, match=r"GroupNorm\(4, 2\) expects 4 channels on axis 1"):
        GroupNorm(4, 2)(tf.tensor(np.zeros((2, 3, 5), np.float32)))
    with pytest.raises(ArgumentError, match="eps must be a non-negative finite number"):
        LayerNorm(5, eps=-1.0)
    with pytest.raises(ArgumentError, match="size must be a positive int"):
        RMSNorm(0)
    with pytest.raises(DeviceMismatchError):
        tf.CUDADevice(0)(LayerNorm(5))(tf.tensor(np.zeros((2, 5), np.float32)))


def test_out_of_memory_in_the_layer_leaves_its_running_statistics(monkeypatch):
    """Every allocation of a training-mode InstanceNorm call (y, the
    instances' statistics) happens before the launch that moves the running
    statistics: running out of memory at any of them leaves both as they were."""
    from triflux.errors import OutOfMemoryError
    dev = tf.CUDADevice(0)
    layer = tf.trainmode(dev(InstanceNorm(3, track_stats=True)))
    x = dev(np.random.default_rng(23).standard_normal((4, 3, 6)).astype(np.float32))
    layer(x)
    real_empty, calls = launch.empty, []

    def failing_empty(shape, dtype, device):
        calls.append(shape)
        if len(calls) == fail_at:
            raise OutOfMemoryError("out of memory (test)")
        return real_empty(shape, dtype, device)
    monkeypatch.setattr(launch, "empty", failing_empty)
    fail_at = None
    layer(x)
    allocations = len(calls)
    assert allocations == 2                  # y and the instances' statistics
    for fail_at in range(1, allocations + 1):
        calls.clear()
        state = tf.state(layer)
        with pytest.raises(OutOfMemoryError):
            layer(x)
        after = tf.state(layer)
        for name in ("running_mean", "running_var"):
            assert after[name].tobytes() == state[name].tobytes(), (fail_at, name)
