"""gather / scatter / embedding / embedding_bag: what the generic property
suite does not pin down.

* torch's semantics in float64 where the strategies leave them out (an
  embedding's padding row that indices name, scale_grad_by_freq), and
  the cases people get wrong: padding rows, empty bags, bags of padding
  only, ties of max (first entry), include_last_offset, NaN in max;
* determinism: the gradients of repeated indices are bit-identical run to
  run, equal for the interpreter's tiles and a GPU's (a GPU plan run in the
  interpreter), and in float32 bit for bit the reference's (both add a
  row's entries in ascending order);
* the radix sort: stable, over several passes and several blocks;
* bad indices: out of range (too large, negative, a coordinate of the
  coordinate form), float, bool, int8 Tensors, bad offsets: a triflux
  error naming the range, on both devices, before any kernel reads the
  table (only the index scan runs), and the kernels' own masks (no read of
  other memory even without the check);
* torch doing nothing but allocate and copy;
* the ops-level functions (dstsize inference, init, tuple indices, NumPy
  indices moved to the device) and the layers (printing, one-hot input,
  padding row kept at zero by training, errors naming the layer).
"""
import numpy as np
import pytest

import triflux as tf
from triflux import backend
from triflux import embedding as E
from triflux.errors import DTypeError, ShapeError
from triflux.reference import gather as ref
from triflux.specs.gather import IndexRangeError

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux.layers.embedding import Embedding, EmbeddingBag  # noqa: E402
from triflux.triton_kernels import gather as kg  # noqa: E402
from triflux.triton_kernels import launch  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"


def _t(a, dtype=None):
    a = np.asarray(a)
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t if dtype is None else t.to(dtype)).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").to(torch.float64).numpy() if t.is_floating_point() else t.to("cpu").numpy()


def _bits(t):
    return t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()


def _close(a, e, rtol, what=""):
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=what)
    finite = np.isfinite(e)
    np.testing.assert_array_equal(a[~finite & ~np.isnan(e)], e[~finite & ~np.isnan(e)], err_msg=what)
    if finite.any():
        err = np.max(np.abs(a[finite] - e[finite])) / max(np.max(np.abs(e[finite])), 1e-30)
        assert err <= rtol, f"{what}: normwise relative error {err:.3g} > {rtol:g}"


def _torch_grad(fn, leaves, g):
    ts = [torch.from_numpy(np.asarray(a, np.float64)).requires_grad_(True) for a in leaves]
    y = fn(*ts)
    grads = torch.autograd.grad(y, ts, torch.from_numpy(np.asarray(g, np.float64)), allow_unused=True)
    return y.detach().numpy(), [None if gr is None else gr.numpy() for gr in grads]


@pytest.fixture
def gpu_plan(monkeypatch):
    """The host code's GPU choices (tiles, sort blocks of 1024, capped index-scan programs) run in the interpreter."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    kg._tiles.cache_clear()
    yield
    kg._tiles.cache_clear()


def _record_launches(monkeypatch):
    names = []
    real = launch.launch

    def recording(kernel, grid, *args, **meta):
        names.append(kernel.__name__)
        return real(kernel, grid, *args, **meta)
    monkeypatch.setattr(launch, "launch", recording)
    return names


# --- torch's semantics in float64 ---------------------------------------------------------------

@pytest.mark.parametrize("padding_idx", [None, 2, -1])
@pytest.mark.parametrize("freq", [False, True])
def test_embedding_matches_torch_with_padding_hits_and_frequencies(padding_idx, freq):
    """The padding row is returned as it is and gets no gradient, even where
    indices name it; scale_grad_by_freq divides a row's gradient by its
    count: reference and kernel (float64) against torch."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((7, 5))
    idx = rng.integers(0, 7, (4, 6))
    idx[0, :3] = 2
    idx[1, :2] = 6
    g = rng.standard_normal((4, 6, 5))
    ty, (tgw,) = _torch_grad(lambda w_: F.embedding(torch.from_numpy(idx), w_, padding_idx=padding_idx,
                                                    scale_grad_by_freq=freq), [w], g)
    _close(ref.embedding_forward(w, idx, padding_idx, freq), ty, 0, "reference y")
    _close(ref.embedding_backward(g, ty, w, idx, padding_idx, freq)[0], tgw, 1e-14, "reference dw")
    ky = kg.embedding_forward(_t(w), _t(idx), padding_idx, freq)
    _close(_np(ky), ty, 0, "kernel y")
    _close(_np(kg.embedding_backward(_t(g), ky, _t(w), _t(idx), padding_idx, freq)[0]), tgw, 1e-14, "kernel dw")


BAG_CASES = [
    # (offsets, include_last_offset, padding_idx)
    ([0, 0, 3, 7], False, None),            # an empty first bag
    ([0, 3, 3, 9], True, None),             # include_last_offset, an empty middle bag
    ([0, 2, 5], False, 1),                  # padding left out of its bag
    ([0, 4], False, 3),                     # a bag of padding only: zeros
]


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("sum", True), ("mean", False), ("max", False)])
@pytest.mark.parametrize("offsets,include_last,padding_idx", BAG_CASES)
@pytest.mark.parametrize("freq", [False, True])
def test_embedding_bag_matches_torch(mode, weighted, offsets, include_last, padding_idx, freq):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 4))
    w[5] = w[0]                                   # equal rows: max ties, the first entry wins
    idx = np.array([1, 5, 0, 1, 3, 3, 2, 0, 4])
    if offsets == [0, 4]:
        idx[:4] = 3
    psw = rng.standard_normal(idx.shape) if weighted else None
    g = rng.standard_normal((len(offsets) - include_last, 4))
    leaves = [w] + ([psw] if weighted else [])
    ty, tg = _torch_grad(lambda w_, *p: F.embedding_bag(torch.from_numpy(idx), w_, torch.tensor(offsets), mode=mode,
                                                        per_sample_weights=p[0] if p else None,
                                                        include_last_offset=include_last, padding_idx=padding_idx),
                         leaves, g)
    if freq:
        # the documented rule, F.embedding's: a row's gradient over its count in the batch (torch 2.13's CPU
        # embedding_bag divides some rows by another row's count: [1, 1, 5] scales row 5 by 1/2)
        tg[0] = tg[0] / np.maximum(np.bincount(idx, minlength=6), 1)[:, None]
    off = np.array(offsets)
    attrs = dict(mode=mode, padding_idx=padding_idx, include_last_offset=include_last, scale_grad_by_freq=freq)
    ry = ref.embedding_bag_forward(w, idx, off, psw, **attrs)
    rg = ref.embedding_bag_backward(g, ry, w, idx, off, psw, **attrs)
    ky = kg.embedding_bag_forward(_t(w), _t(idx), _t(off), None if psw is None else _t(psw), **attrs)
    kgr = kg.embedding_bag_backward(_t(g), ky, _t(w), _t(idx), _t(off), None if psw is None else _t(psw), **attrs)
    for side, y, grads in (("reference", ry, rg), ("kernel", _np(ky), [None if a is None else _np(a) for a in kgr])):
        _close(y, ty, 1e-15, f"{side} y")
        _close(grads[0], tg[0], 1e-14, f"{side} dweight")
        assert grads[1] is None and grads[2] is None
        if weighted:
            _close(grads[3], tg[1], 1e-14, f"{side} dpsw")


@pytest.mark.parametrize("op,reduce", [("add", "sum"), ("mul", "prod"), ("max", "amax"), ("min", "amin"),
                                       ("mean", "mean")])
def test_scatter_matches_torch_scatter_reduce_with_ties_and_zeros(op, reduce):
    """Rows holding ties (max/min share the gradient), zeros (mul: the
    product of the others), a row no index names (NNlib's initial value):
    reference and kernel (float64) against torch's scatter_reduce."""
    src = np.array([[1.0, 2.0], [3.0, 0.0], [3.0, -1.0], [0.5, 0.0], [-2.0, 4.0], [3.0, 2.0]])
    idx = np.array([0, 0, 0, 2, 2, 0])
    g = np.array([[1.0, -2.0], [0.5, 0.25], [3.0, 1.5]])

    def torch_fn(s):
        base = torch.full((3, 2), {"add": 0.0, "mul": 1.0, "max": -np.inf, "min": np.inf, "mean": 0.0}[op],
                          dtype=torch.float64)
        return base.scatter_reduce(0, torch.from_numpy(idx)[:, None].expand(6, 2), s, reduce, include_self=False)
    ty, (tg,) = _torch_grad(torch_fn, [src], g)
    ry = ref.scatter_forward(src, idx, op, (3, 2))
    ky = kg.scatter_forward(_t(src), _t(idx), op, (3, 2))
    for side, y, d in (("reference", ry, ref.scatter_backward(g, ry, src, idx, op, (3, 2))[0]),
                       ("kernel", _np(ky), _np(kg.scatter_backward(_t(g), ky, _t(src), _t(idx), op, (3, 2))[0]))):
        _close(y, ty, 1e-15, f"{side} y")
        _close(d, tg, 1e-15, f"{side} dsrc")


@pytest.mark.parametrize("op", ["max", "min"])
def test_scatter_max_propagates_nan_and_its_gradient_is_nan_as_torch(op):
    src = np.array([1.0, np.nan, 3.0, 2.0, 2.0])
    idx = np.array([0, 0, 0, 1, 1])
    g = np.array([1.0, 2.0, 5.0])
    reduce = "amax" if op == "max" else "amin"
    init = -np.inf if op == "max" else np.inf
    ty, (tg,) = _torch_grad(lambda s: torch.full((3,), init, dtype=torch.float64).scatter_reduce(
        0, torch.from_numpy(idx), s, reduce, include_self=False), [src], g)
    ky = kg.scatter_forward(_t(src), _t(idx), op, (3,))
    _close(_np(ky), ty, 0, "y")
    _close(_np(kg.scatter_backward(_t(g), ky, _t(src), _t(idx), op, (3,))[0]), tg, 0, "dsrc")
    _close(ref.scatter_backward(g, ty, src, idx, op, (3,))[0], tg, 0, "reference dsrc")


def test_embedding_bag_max_propagates_nan_on_both_sides():
    """triflux's max propagates NaN (torch's CPU kernel keeps a NaN only when
    it comes first); the gradient goes to the first NaN entry."""
    w = np.array([[1.0, 5.0], [3.0, np.nan], [3.0, 2.0]])
    idx, off = np.array([0, 1, 2, 1]), np.array([0, 3])
    g = np.array([[1.0, 2.0], [4.0, 8.0]])
    want_y = np.array([[3.0, np.nan], [3.0, np.nan]])
    want_dw = np.array([[0.0, 0.0], [1.0 + 4.0, 2.0 + 8.0], [0.0, 0.0]])
    ry = ref.embedding_bag_forward(w, idx, off, mode="max")
    ky = kg.embedding_bag_forward(_t(w), _t(idx), _t(off), mode="max")
    _close(ry, want_y, 0, "reference y")
    _close(_np(ky), want_y, 0, "kernel y")
    _close(ref.embedding_bag_backward(g, ry, w, idx, off, mode="max")[0], want_dw, 0, "reference dw")
    _close(_np(kg.embedding_bag_backward(_t(g), ky, _t(w), _t(idx), _t(off), mode="max")[0]), want_dw, 0,
           "kernel dw")


# --- determinism --------------------------------------------------------------------------------

def _repeated(seed, n=300, rows=20, f=33):
    """A table, indices repeating every row (about n / rows times; row 1 some
    50 more: in the interpreter a row's group costs a loop iteration per
    entry) and gradients of the entries."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, rows, n)
    idx[:50] = 1
    return rng.standard_normal((rows, f)).astype(np.float32), idx, rng.standard_normal((n, f)).astype(np.float32)


def _all_gradients(w, idx, g, src_rows=20):
    """Every reduction over repeated indices of the family, on the kernels (float32)."""
    tw, ti, tgr = _t(w), _t(idx), _t(g)
    out = [kg.gather_backward(tgr, None, tw, ti)[0], kg.embedding_backward(tgr, None, tw, ti)[0],
           kg.embedding_backward(tgr, None, tw, ti, 1, True)[0]]
    for op in ("add", "mean", "max"):
        out.append(kg.scatter_forward(tgr, ti, op, (src_rows, g.shape[1])))
    n = len(idx)
    off = _t(np.array([0, n // 6, n // 6, n // 2, n - 10]))
    y = kg.embedding_bag_forward(tw, ti, off, mode="sum")
    gb = _t(np.random.default_rng(3).standard_normal(tuple(y.shape)).astype(np.float32))
    out.append(kg.embedding_bag_backward(gb, y, tw, ti, off, mode="sum")[0])
    out.append(kg.embedding_bag_backward(gb, y, tw, ti, off, _t(np.linspace(-1, 1, len(idx)).astype(np.float32)),
                                         mode="sum")[3])
    return out


def test_gradients_of_repeated_indices_are_bit_identical_run_to_run():
    w, idx, g = _repeated(4)
    first = [_bits(t) for t in _all_gradients(w, idx, g)]
    second = [_bits(t) for t in _all_gradients(w, idx, g)]
    assert first == second


def test_gradients_are_the_same_bits_for_a_gpus_tiles(monkeypatch):
    """The GPU's tiles (blocks of rows, sort blocks of 1024, so several
    blocks and a real scan) reduce each row in the same order: the same bits
    as the interpreter's plan, and (float32) as the reference's."""
    w, idx, g = _repeated(5, n=1100, rows=60)
    here = [_bits(t) for t in _all_gradients(w, idx, g, 60)]
    monkeypatch.setattr(launch, "INTERPRET", False)
    kg._tiles.cache_clear()
    try:
        there = [_bits(t) for t in _all_gradients(w, idx, g, 60)]
    finally:
        kg._tiles.cache_clear()
    assert here == there
    want = ref.gather_backward(g, None, w, idx)[0]
    assert _bits(torch.from_numpy(want)) == here[0]
    want = ref.scatter_forward(g, idx, "add", (60, g.shape[1]))
    assert _bits(torch.from_numpy(want)) == here[3]


# --- the sort ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 2, 17, 300, 70_000])
def test_radix_sort_is_stable_over_passes_and_blocks(rows, gpu_plan):
    rng = np.random.default_rng(rows)
    n = 3000
    keys = rng.integers(0, rows, n).astype(np.int32)
    keys[:40] = rows - 1
    want = np.argsort(keys, kind="stable")
    sorted_keys, perm = kg._sort_rows(_t(keys.copy()), rows)         # (it reuses the keys' buffer)
    np.testing.assert_array_equal(_np(perm), want)
    np.testing.assert_array_equal(_np(sorted_keys), keys[want])


# --- bad indices -------------------------------------------------------------------------------------

def _calls():
    """(name, reference call, kernel call) of every primitive with an index argument ``i``."""
    w = np.random.default_rng(6).standard_normal((5, 3))
    return [
        ("gather", lambda i: ref.gather_forward(w, i), lambda i: kg.gather_forward(_t(w), i)),
        ("gather backward", lambda i: ref.gather_backward(np.ones(np.shape(i) + (3,)), None, w, i),
         lambda i: kg.gather_backward(_t(np.ones(tuple(i.shape) + (3,))), None, _t(w), i)),
        ("scatter", lambda i: ref.scatter_forward(np.ones(np.shape(i) + (3,)), i, "add", (5, 3)),
         lambda i: kg.scatter_forward(_t(np.ones(tuple(i.shape) + (3,))), i, "add", (5, 3))),
        ("embedding", lambda i: ref.embedding_forward(w, i), lambda i: kg.embedding_forward(_t(w), i)),
        ("embedding backward", lambda i: ref.embedding_backward(np.ones(np.shape(i) + (3,)), None, w, i),
         lambda i: kg.embedding_backward(_t(np.ones(tuple(i.shape) + (3,))), None, _t(w), i)),
        ("embedding_bag", lambda i: ref.embedding_bag_forward(w, i, np.array([0])),
         lambda i: kg.embedding_bag_forward(_t(w), i, _t(np.array([0])))),
    ]


@pytest.mark.parametrize("bad,shown", [(5, "5"), (-1, "-1"), (1 << 40, str(1 << 40))])
@pytest.mark.parametrize("call", range(6))
def test_an_index_out_of_range_is_an_error_naming_the_range_before_any_kernel_reads(bad, shown, call, monkeypatch):
    name, on_cpu, on_gpu = _calls()[call]
    idx = np.array([0, 3, bad, 1])
    with pytest.raises(IndexRangeError, match=f"index {shown} .*valid indices are 0 to 4"):
        on_cpu(idx)
    names = _record_launches(monkeypatch)
    with pytest.raises(IndexRangeError, match=f"index {shown} .*valid indices are 0 to 4"):
        on_gpu(_t(idx))
    assert set(names) <= {"_index_scan_kernel", "_copy_kernel", "_full_kernel"}, (name, names)
    with pytest.raises(IndexError):               # an IndexError too, as Python's own
        on_gpu(_t(idx))


def test_a_coordinate_out_of_range_is_named_by_its_axis():
    src = np.zeros((4, 3, 2))
    idx = np.array([[0, 1], [3, 3]])              # (3, 3) is a valid row (3 * 3 + 3 < 12) but axis 1 has 3
    for run in (lambda: ref.gather_forward(src, idx, coords=True),
                lambda: kg.gather_forward(_t(src), _t(idx), coords=True)):
        with pytest.raises(IndexRangeError, match="index 3 is outside src \\(coordinate 1, axis 1 of size 3\\)"):
            run()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, np.int8, np.uint8])
def test_indices_that_are_not_int32_or_int64_are_refused_before_any_launch(dtype, monkeypatch):
    w = np.zeros((5, 3))
    idx = np.array([0, 1, 2]).astype(dtype)
    names = _record_launches(monkeypatch)
    for run in (lambda: ref.embedding_forward(w, idx), lambda: kg.embedding_forward(_t(w), _t(idx)),
                lambda: ref.gather_forward(w, idx), lambda: kg.gather_forward(_t(w), _t(idx)),
                lambda: kg.scatter_forward(_t(w[:3]), _t(idx), "add", (5, 3))):
        with pytest.raises(DTypeError, match="int32 or int64"):
            run()
    assert names == []


@pytest.mark.parametrize("offsets,include_last,message", [
    ([1, 2], False, "offsets\\[0\\] must be 0"),
    ([0, 3, 2], False, "must not decrease"),
    ([0, 5], False, "past the end of idx"),
    ([0, 2, 3], True, "the last offset is the end of the last bag"),
])
def test_bad_offsets_are_errors(offsets, include_last, message):
    w, idx = np.zeros((5, 3)), np.array([0, 1, 2, 3])
    with pytest.raises(IndexRangeError, match=message):
        ref.embedding_bag_forward(w, idx, np.array(offsets), include_last_offset=include_last)
    with pytest.raises(IndexRangeError, match=message):
        kg.embedding_bag_forward(_t(w), _t(idx), _t(np.array(offsets)), include_last_offset=include_last)


def test_shape_errors_name_what_was_expected():
    with pytest.raises(ShapeError, match="src must have shape idx's entries"):
        kg.scatter_forward(_t(np.zeros((4, 3))), _t(np.array([0, 1, 2])), "add", (5, 3))
    with pytest.raises(ShapeError, match="coordinates per entry"):
        kg.gather_forward(_t(np.zeros((4,))), _t(np.zeros((2, 2), np.int64)), coords=True)
    with pytest.raises(ShapeError, match="weight must be \\(vocab_size, dim\\)"):
        kg.embedding_forward(_t(np.zeros((4,))), _t(np.array([0])))
    with pytest.raises(tf.errors.ArgumentError, match="per_sample_weights are only for mode 'sum'"):
        kg.embedding_bag_forward(_t(np.zeros((4, 2))), _t(np.array([0])), _t(np.array([0])), _t(np.ones(1)),
                                 mode="max")


def test_the_kernels_mask_rows_outside_the_table(monkeypatch):
    """Without the host's check, an index outside the table reads nothing:
    its row comes out as zeros (the kernels' loads are masked at rows
    outside the table), never another array's memory."""
    monkeypatch.setattr(kg, "_check_indices", lambda idx, table, who, write_keys=False: None)
    w = np.arange(15.0).reshape(5, 3) + 1
    y = kg.gather_forward(_t(w), _t(np.array([1, 5, -3, 4, 1 << 33])))
    np.testing.assert_array_equal(_np(y), np.stack([w[1], np.zeros(3), np.zeros(3), w[4], np.zeros(3)]))
    y = kg.gather_forward(_t(w.reshape(5, 3, 1)), _t(np.array([[1, 3], [4, 2]])), coords=True)
    np.testing.assert_array_equal(_np(y), np.array([[0.0], [w[4, 2]]]))


# --- torch only allocates and copies ---------------------------------------------------------------

def test_torch_only_allocates_and_copies():
    rng = np.random.default_rng(7)
    w = _t(rng.standard_normal((6, 4)).astype(np.float32))
    idx, off = _t(rng.integers(0, 6, 12)), _t(np.array([0, 5, 5, 9]))
    g = _t(rng.standard_normal((12, 4)).astype(np.float32))

    def run():
        y = kg.gather_forward(w, idx)
        kg.gather_backward(g, y, w, idx)
        for op in ("add", "mul", "max", "mean"):
            s = kg.scatter_forward(g, idx, op, (6, 4))
            kg.scatter_backward(w, s, g, idx, op, (6, 4))
        kg.embedding_backward(g, y, w, idx, 2, True)
        for mode in ("sum", "mean", "max"):
            b = kg.embedding_bag_forward(w, idx, off, mode=mode)
            kg.embedding_bag_backward(b, b, w, idx, off, mode=mode)
        b = kg.embedding_bag_forward(w, idx, off, g[:, 0], mode="sum")
        kg.embedding_bag_backward(b, b, w, idx, off, g[:, 0], mode="sum")
    assert_torch_only_moves_memory(run, "the gather family's kernels")


# --- ops-level functions -------------------------------------------------------------------------------

@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    return tf.cpu_device() if request.param == "cpu" else tf.CUDADevice(0)


def test_ops_gather_scatter_forms(device):
    src = device(np.arange(24.0).reshape(4, 3, 2))
    np.testing.assert_array_equal(E.gather(src, [2, 0, 2]).numpy(), np.arange(24.0).reshape(4, 3, 2)[[2, 0, 2]])
    rows, cols = np.array([0, 3, 3]), np.array([2, 1, 0])
    want = np.arange(24.0).reshape(4, 3, 2)[rows, cols]
    np.testing.assert_array_equal(E.gather(src, (rows, cols)).numpy(), want)
    np.testing.assert_array_equal(E.gather(src, np.stack([rows, cols], -1), coords=True).numpy(), want)
    # NNlib's docstring examples, 0-based
    y = E.scatter("add", device(np.array([10.0, 100.0, 1000.0])), np.array([2, 0, 1]))
    np.testing.assert_array_equal(y.numpy(), [100.0, 1000.0, 10.0])
    y = E.scatter("mul", device(np.array([10.0, 200.0, 3000.0])), np.array([0, 3, 1]), init=10, dstsize=6)
    np.testing.assert_array_equal(y.numpy(), [100.0, 30000.0, 10.0, 2000.0, 10.0, 10.0])
    y = E.scatter(max, device(np.array([[1.0, 2.0], [5.0, -1.0]])), np.array([1, 1]))
    np.testing.assert_array_equal(y.numpy(), [[-np.inf, -np.inf], [5.0, 2.0]])


def test_ops_gradients_agree_on_both_devices():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    idx = rng.integers(0, 6, (4, 5))
    results = []
    for d in (tf.cpu_device(), tf.CUDADevice(0)):
        wd, xd = d(w), d(idx)

        def loss(w_):
            e = E.embedding(xd, w_, padding_idx=1)
            s = E.scatter("mean", E.gather(w_, xd), xd, (6, 3))
            b = E.embedding_bag(xd, w_, mode="max")
            return (e * e).sum() + (s * s).sum() + b.sum()
        value, (g,) = tf.withgradient(loss, wd)
        results.append((value.item(), g.numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-6)


def test_a_tensor_index_on_another_device_is_an_error():
    with pytest.raises(tf.errors.DeviceMismatchError):
        E.gather(tf.CUDADevice(0)(np.zeros((3, 2), np.float32)), tf.tensor(np.array([0, 1])))


# --- layers ---------------------------------------------------------------------------------------------

def test_layers_print_as_flux():
    assert repr(Embedding(26, 4)) == "Embedding(26 => 4)  # 104 parameters"
    assert repr(Embedding((26, 4), padding_idx=-1)) == "Embedding(26 => 4, padding_idx=25)  # 104 parameters"
    assert repr(EmbeddingBag(26, 3)) == "EmbeddingBag(26 => 3)  # 78 parameters"
    assert repr(EmbeddingBag(26, 3, "sum")) == "EmbeddingBag(26 => 3, mode='sum')  # 78 parameters"


def test_embedding_layer_one_hot_and_padding_row_kept_at_zero(device):
    tf.seed(9)
    emb = device(Embedding(8, 3, padding_idx=0))
    x = np.array([[0, 3, 3], [7, 0, 1]])
    hot = np.eye(8, dtype=np.float32)[x]
    np.testing.assert_array_equal(emb(device(hot)).numpy(), emb(device(x)).numpy())
    opt = tf.optimise.setup(tf.optimise.Descent(0.5), emb)
    for _ in range(2):
        _, (g,) = tf.withgradient(lambda m: (m(device(x)) ** 2).sum(), emb)
        tf.optimise.update(opt, emb, g)
    np.testing.assert_array_equal(emb.weight.numpy()[0], np.zeros(3))
    assert np.all(emb.weight.numpy()[3] != 0)


def test_layer_errors_name_the_layer(device):
    emb = device(Embedding(8, 3))
    with pytest.raises(IndexRangeError, match="^Embedding\\(8 => 3\\): index 8 is outside the vocabulary"):
        emb(device(np.array([1, 8])))
    with pytest.raises(ShapeError, match="Embedding\\(8 => 3\\) takes integer indices"):
        emb(device(np.array([1.0, 2.0])))
    bag = device(EmbeddingBag(8, 3))
    with pytest.raises(IndexRangeError, match="^EmbeddingBag\\(8 => 3\\): index -2"):
        bag(device(np.array([[1, -2]])))
    with pytest.raises(DTypeError, match="EmbeddingBag\\(8 => 3\\) takes integer indices"):
        bag(device(np.array([[1.0]])))
    other = tf.cpu_device() if device != tf.cpu_device() else tf.CUDADevice(0)
    with pytest.raises(tf.errors.DeviceMismatchError, match="Embedding\\(8 => 3\\)"):
        emb(other(np.array([1])))


def test_embedding_bag_layer_call_forms(device):
    tf.seed(10)
    bag = device(EmbeddingBag(6, 2, "sum"))
    w = bag.weight.numpy()
    x = np.array([[1, 2, 2], [5, 0, 1]])
    np.testing.assert_allclose(bag(device(x)).numpy(), w[x].sum(1), rtol=1e-6)
    flat, offsets = np.array([1, 2, 2, 5, 0, 1]), np.array([0, 3])
    np.testing.assert_allclose(bag(device(flat), device(offsets)).numpy(), w[x].sum(1), rtol=1e-6)
    np.testing.assert_allclose(bag(device(flat)).numpy(), w[flat].sum(0), rtol=1e-6)
    psw = np.linspace(-1, 1, 6).astype(np.float32)
    np.testing.assert_allclose(bag(device(flat), device(offsets), device(psw)).numpy(),
                               (w[flat] * psw[:, None]).reshape(2, 3, 2).sum(1), rtol=1e-5, atol=1e-6)


# --- compiled for a GPU --------------------------------------------------------------------------------

_COMPILE_SCRIPT = """
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch
from triflux.triton_kernels import launch, gather as kg
from triflux.workbench.kernel_report.specializations import specialization, source_fingerprint
from triflux.workbench.kernel_report.compile_cache import compile_all
launches = []
launch.launch = lambda kernel, grid, *args, **meta: launches.append((kernel, specialization(kernel, args, meta)))
launch.INTERPRET = False
rng = np.random.default_rng(0)
for dt in (torch.float32, torch.bfloat16, torch.float64):
    for v, d, n in ((50257, 512, 8192), (100, 1, 512)):
        w = torch.from_numpy(rng.standard_normal((v, d))).to(dt)
        idx = torch.from_numpy(rng.integers(0, v, n))
        g = torch.from_numpy(rng.standard_normal((n, d))).to(dt)
        y = kg.embedding_forward(w, idx)
        kg.embedding_backward(g, y, w, idx, 3, True)
        kg.gather_forward(w[:7], torch.from_numpy(np.stack([rng.integers(0, 7, n), rng.integers(0, d, n)], -1)),
                          coords=True)
        for op in ("add", "mul", "max", "mean"):
            s = kg.scatter_forward(g, idx, op, (v, d))
            kg.scatter_backward(w, s, g, idx, op, (v, d))
        off = torch.arange(64) * (n // 64)
        for mode in ("sum", "mean", "max"):
            b = kg.embedding_bag_forward(w, idx, off, mode=mode, padding_idx=0)
            kg.embedding_bag_backward(b, b, w, idx, off, mode=mode, padding_idx=0)
        b = kg.embedding_bag_forward(w, idx, off, g[:, 0], mode="sum")
        kg.embedding_bag_backward(b, b, w, idx, off, g[:, 0], mode="sum")
jobs = {spec.key(): (source_fingerprint(kernel)[0], spec) for kernel, spec in launches}
rows = []
for arch in ("sm_90", "sm_80"):
    results, _ = compile_all(list(jobs.values()), arch)
    rows += [dict(arch=arch, kernel=spec.kernel, constexprs=str(spec.constexprs), **{k: results[key].get(k) for k in
             ("regs", "spills_bytes", "error")}) for key, (_, spec) in jobs.items()]
print(json.dumps(rows))
"""


@pytest.mark.skipif(__import__("os").environ.get("TRIFLUX_COMPILE_GATHER") != "1",
                    reason="compiles about 150 specializations per architecture (minutes with a cold cache): "
                           "set TRIFLUX_COMPILE_GATHER=1")
def test_kernels_compile_for_sm90_and_sm80_without_spills():
    """Every specialization a GPU would get for embeddings of GPT-2's
    vocabulary, rows of one value, every op, mode and float dtype: compiled
    for sm_90 and sm_80 (no GPU needed), none fails, none spills."""
    import json
    from helpers import run_python
    pytest.importorskip("triton.backends.nvidia", reason="needs Triton's NVIDIA backend to compile for a GPU")
    r = run_python(_COMPILE_SCRIPT, timeout=3000)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    bad = [row for row in rows if row["error"] or row["spills_bytes"]]
    assert rows and not bad, bad[:5]
