"""The property suite: every registered primitive, every dtype, both sides.

Parametrised over ``triflux.primitives.REGISTRY`` (ids ``<name>-<dtype>``),
each test draws a :class:`triflux.testing.Case` from the primitive's strategy:

a. kernel forward vs reference forward (float64 copies of the same rounded
   inputs), every dtype the primitive declares;
b. kernel backward vs reference backward, for a random output gradient;
c. (float64) reference backward vs central finite differences of the
   reference forward (a directional-derivative check);
d. (float64) reference forward and backward vs torch.autograd through the
   oracle ``<name>_torch``;
e. random primitives: reproducible per seed, different across seeds, and the
   right mean and standard deviation, on both sides;
f. in-place primitives: every mutated input after the update, kernel vs
   reference, and reference vs the oracle.

Kernel-side inputs are torch tensors of the dtype under test, laid out as the
case says (contiguous, transposed or strided views) on ``kernel_device``; the
kernels run in the Triton interpreter unless ``TRIFLUX_TEST_REAL_GPU=1``.
Every kernel test also checks that the kernel left the memory of its inputs
alone (bit for bit, including the gaps of strided views), except what an
in-place primitive is meant to overwrite.

Tolerances come from ``tests/tolerances.py`` (the table per dtype, loosened by
the traits each primitive declares) and the primitives' own
``<name>_magnitude`` floors, and nowhere else.
"""
import functools
import inspect
import math

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import tolerances as tol
from triflux import backend, testing
from triflux import dtypes as tfd
from triflux.primitives import REGISTRY

PRIMITIVES = list(REGISTRY.values())
INTERPRET = backend.interpreter_on()
LAYOUTS = ("contiguous", "transposed", "strided")
F64 = np.dtype(np.float64)


# --- parametrisation ---------------------------------------------------------------------

def _params(prims, dtypes=None):
    return [pytest.param(p, d, id=f"{p.name}-{d}")
            for p in prims for d in p.dtypes if dtypes is None or d in dtypes]


def _f64_params(prims):
    return [pytest.param(p, id=f"{p.name}-float64") for p in prims]


#: the float64 checks against torch.autograd need torch (not the kernels)
requires_torch = pytest.mark.skipif(
    not backend.has_module("torch"),
    reason="torch (the independent oracle, torch.autograd on the CPU) is not installed")

def _takes_inputs(prim):
    """Whether the primitive has tensor inputs (dropout) or only attrs (fills)."""
    try:
        params = inspect.signature(prim.reference()).parameters.values()
    except (ImportError, AttributeError):
        return False
    return any(q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD, q.VAR_POSITIONAL) for q in params)


FORWARD = [p for p in PRIMITIVES if not p.random and not p.in_place]
BACKWARD = [p for p in PRIMITIVES if p.differentiable and not p.random]
RANDOM = [p for p in PRIMITIVES if p.random and not _takes_inputs(p)]
RANDOM_WITH_INPUTS = [p for p in PRIMITIVES if p.random and _takes_inputs(p)]
IN_PLACE = [p for p in PRIMITIVES if p.in_place]


# --- parts, with a clear failure when one is missing ---------------------------------------

def _part(prim, part, *args):
    """``prim.<part>(*args)``: its reference, kernel, strategy or torch_oracle."""
    try:
        return getattr(prim, part)(*args)
    except (ModuleNotFoundError, AttributeError) as e:
        problem = f"{type(e).__name__}: {e}"
    pytest.fail(f"{prim.name}: its {part} {' '.join(map(str, args))} is missing ({problem}); "
                "see tests/test_registry.py", pytrace=False)


@functools.lru_cache(maxsize=None)
def _strategy(prim, dtype):
    return _part(prim, "strategy", dtype)


def draw_case(data, prim, dtype):
    case = data.draw(_strategy(prim, dtype), label=f"{prim.name} case")
    if not isinstance(case, testing.Case):
        pytest.fail(f"{prim.name}_strategy({dtype!r}) drew a {type(case).__name__}, not a Case",
                    pytrace=False)
    return case


def _has_parameter(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _with_device(fn, attrs, device):
    """attrs for ``fn``: a ``device`` attribute (fills) is set to ``device``."""
    if "device" in attrs or _has_parameter(fn, "device"):
        return {**attrs, "device": device}
    return dict(attrs)


# --- inputs on both sides ------------------------------------------------------------------

def is_float(x):
    return tfd.is_floating(np.asarray(x).dtype)


def flushes(dtype):
    """Whether kernel tests in ``dtype`` flush subnormals (the interpreter's
    bfloat16 conversions get them wrong: tolerances.INTERPRETER_FLUSH_SUBNORMALS)."""
    return INTERPRET and tol.dtype_name(dtype) in tol.INTERPRETER_FLUSH_SUBNORMALS


def rounded_inputs(case, dtype, flush=False):
    """The case's inputs rounded to ``dtype`` (floating ones; others as they are)."""
    d = tfd.as_dtype(dtype)
    out = tuple(testing.round_to(np.asarray(x), d) for x in case.inputs)
    if flush:
        out = tuple(tol.flush_subnormals(x, d) for x in out)
    return out


def reference_copies(arrays, layouts=()):
    """float64 copies of the floating arrays; others as they are (copied). With
    ``layouts`` (one per array, as Case.layouts), each copy has that memory
    layout, as the kernel's tensors do: the reference is called with strided
    and column-major views too (Dense hands matmul ``weight.T``), so code that
    only works on C-contiguous arrays cannot hide."""
    return tuple(in_layout(np.array(x, dtype=F64) if is_float(x) else np.array(x),
                           layouts[i] if i < len(layouts) else "contiguous")
                 for i, x in enumerate(arrays))


def in_layout(array, layout):
    """``array`` (NumPy) re-laid out as ``layout`` (0-d arrays stay as they are)."""
    a = np.asarray(array)
    return a if a.ndim == 0 else testing.to_numpy_layout(a, layout)


def to_torch(array, layout, device):
    """testing.to_torch_layout, also for 0-d arrays (np.ascontiguousarray, which
    it uses, turns a 0-d array into shape (1,))."""
    a = np.asarray(array)
    if a.ndim == 0:
        return testing.to_torch_layout(a.reshape(1), "contiguous", device).reshape(())
    return testing.to_torch_layout(a, layout, device)


def kernel_tensors(arrays, layouts, device):
    return tuple(to_torch(x, layouts[i], device) for i, x in enumerate(arrays))


def case_layouts(case, n):
    return tuple(case.layout(i) for i in range(n))


def describe(prim, dtype, direction, case, **extra):
    def dt(x):
        return dtype if is_float(x) else np.asarray(x).dtype
    ins = ", ".join(f"{dt(x)}{tuple(np.shape(x))} {case.layout(i)}"
                    for i, x in enumerate(case.inputs))
    more = "".join(f", {k} {v}" for k, v in extra.items())
    note_ = f", note {case.note!r}" if case.note else ""
    return (f"{prim.name} [{dtype}, {direction}] inputs ({ins}) attrs {case.attrs}"
            f"{more}{note_}")


def to_numpy(t):
    torch = backend.torch()
    if isinstance(t, torch.Tensor):
        return testing.to_numpy(t)
    return np.asarray(t)


def _call(side, fn, args, attrs, what):
    try:
        return fn(*args, **attrs)
    except Exception as e:
        raise AssertionError(f"{what}: the {side} raised {type(e).__name__}: {e}") from e


# --- memory checks -------------------------------------------------------------------------

def _storage_bytes(t):
    torch = backend.torch()
    s = t.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    raw.set_(s, 0, (s.nbytes(),), (1,))
    return raw.cpu().numpy().copy()


def _covered_bytes(t, nbytes):
    """Mask of the storage bytes that the view ``t`` covers."""
    mask = np.zeros(nbytes, dtype=bool)
    if t.numel() == 0:
        return mask
    es = t.element_size()
    offs = np.full(tuple(t.shape), t.storage_offset(), dtype=np.int64)
    for axis, stride in enumerate(t.stride()):
        shape = [1] * t.dim()
        shape[axis] = t.shape[axis]
        offs = offs + np.arange(t.shape[axis], dtype=np.int64).reshape(shape) * stride
    for b in range(es):
        mask[offs.ravel() * es + b] = True
    return mask


def snapshot(tensors):
    return [(_storage_bytes(t) if _is_tensor(t) else None) for t in tensors]


def _is_tensor(t):
    torch = backend.torch()
    return isinstance(t, torch.Tensor)


def assert_untouched(tensors, before, what, allowed=()):
    """The storage of every tensor is bit for bit as before; for indices in
    ``allowed`` only the bytes the view covers may change."""
    for i, (t, b) in enumerate(zip(tensors, before)):
        if b is None:
            continue
        after = _storage_bytes(t)
        if i in allowed:
            outside = ~_covered_bytes(t, after.size)
            if not np.array_equal(after[outside], b[outside]):
                raise AssertionError(
                    f"{what}: the kernel wrote outside the view of input {i} (shape "
                    f"{tuple(t.shape)}, strides {t.stride()}, offset {t.storage_offset()}): "
                    f"{int((after[outside] != b[outside]).sum())} bytes of the underlying buffer "
                    "changed (an in-place kernel must honour the strides)")
        elif not np.array_equal(after, b):
            raise AssertionError(
                f"{what}: the kernel modified input {i} (shape {tuple(t.shape)}, strides "
                f"{t.stride()}): {int((after != b).sum())} bytes of its buffer changed; "
                "a kernel must not write into its inputs")


# --- torch oracles -------------------------------------------------------------------------

def torch_cpu(arrays, requires_grad=()):
    out = []
    for i, a in enumerate(arrays):
        t = to_torch(a, "contiguous", "cpu")
        if i in requires_grad:
            t = t.detach().requires_grad_(True)
        out.append(t)
    return out


def oracle_forward(prim, arrays, attrs):
    """The oracle's result on CPU tensors holding ``arrays`` (in their dtype)."""
    fn = _part(prim, "torch_oracle")
    res = fn(*torch_cpu(arrays), **_with_device(fn, attrs, "cpu"))
    if isinstance(res, (tuple, list)):
        return tuple(to_numpy(r) for r in res)
    return to_numpy(res)


def oracle_gradients(prim, arrays, attrs, grad, idx):
    """torch.autograd gradients (a dict index -> array) of the oracle at ``arrays``
    in their dtype, for the output gradient ``grad``."""
    torch = backend.torch()
    fn = _part(prim, "torch_oracle")
    ts = torch_cpu(arrays, requires_grad=idx)
    out = fn(*ts, **_with_device(fn, attrs, "cpu"))
    leaves = [ts[i] for i in idx]
    g = to_torch(grad, "contiguous", "cpu")
    if not out.requires_grad:  # e.g. an empty output: every gradient is zero
        return {i: np.zeros(np.shape(arrays[i]), dtype=np.asarray(arrays[i]).dtype) for i in idx}
    grads = torch.autograd.grad(out, leaves, grad_outputs=g, allow_unused=True)
    res = {}
    for i, gr in zip(idx, grads):
        res[i] = (np.zeros(np.shape(arrays[i]), dtype=np.asarray(arrays[i]).dtype)
                  if gr is None else to_numpy(gr))
    return res


def _try(fn, *args, label):
    """fn(*args), or None (noted) when torch cannot do it in this dtype on the CPU."""
    try:
        return fn(*args)
    except Exception as e:  # only used for optional comparisons (ratio, torch's sample)
        _note(f"{label}: torch could not provide a reference ({type(e).__name__}: {e})")
        return None


def _note(text):
    """hypothesis.note inside a property test; nothing outside one."""
    from hypothesis.errors import InvalidArgument
    try:
        note(text)
    except InvalidArgument:
        pass


def grad_indices(case, arrays):
    if case.grad_inputs is not None:
        return tuple(case.grad_inputs)
    return tuple(i for i, x in enumerate(arrays) if is_float(x))


def expected_dtype(ref_out, dtype, attrs):
    """The dtype the kernel's output must have: an explicit ``dtype`` attribute
    wins; floating results come in the dtype under test; others as the reference."""
    if "dtype" in attrs and attrs["dtype"] is not None:
        return tfd.as_dtype(attrs["dtype"])
    if is_float(ref_out):
        return tfd.as_dtype(dtype)
    return np.asarray(ref_out).dtype


def _gradient(seed, shape, dtype):
    """A random output gradient: float64 values rounded to ``dtype``; positive
    for one seed in three. With random signs a gradient sum over broadcast or
    batch axes stays small and a 16-bit accumulator is barely hurt; with one
    sign the partial sums grow and a sum kept in float16/bfloat16 stalls
    (a thousand bfloat16 terms of 0.037 add up to 33, not 37)."""
    g = np.random.default_rng(seed).standard_normal(shape)
    if seed % 3 == 0:
        g = np.abs(g)
    return testing.round_to(g, dtype)


def both_sides(case, dtype, device):
    """The case's inputs rounded to ``dtype``, the reference's float64-safe
    copies of them, and the kernel's tensors on ``device`` in the case's layouts."""
    rounded = rounded_inputs(case, dtype, flush=flushes(dtype))
    layouts = case_layouts(case, len(rounded))
    return rounded, reference_copies(rounded, layouts), kernel_tensors(rounded, layouts, device)


# === a. kernel forward vs reference ===========================================================

def assert_arrays(what, direction, *arrays, **named):
    """Reference results are NumPy arrays, 0-d ones included: NumPy turns 0-d
    results of arithmetic into scalars (np.float32), which a Tensor cannot hold."""
    for i, a in list(enumerate(arrays)) + list(named.items()):
        if _is_tensor(a):
            continue
        assert isinstance(a, np.ndarray), \
            f"{what}: the reference {direction} returned a {type(a).__name__} ({i}), not a NumPy array " \
            "(wrap 0-d results in np.asarray)"

def check_forward(actual, expected, prim, dtype, case, rounded, ref_in, what, flush=False):
    """``actual`` (a kernel's output as NumPy, or the reference's own in
    ``dtype``) against ``expected`` (the reference on float64 copies), with
    the table's tolerance for ``dtype`` and the primitive's looseners."""
    assert_arrays(what, "forward", expected=expected, actual=actual)
    want = expected_dtype(expected, dtype, case.attrs)
    got = np.asarray(actual).dtype
    assert got == want, f"{what}: the output has dtype {got}, expected {want}"
    tdtype = tol.coarsest(dtype, got)
    ratio = None
    if tdtype is not None and tol.TOLERANCES[tdtype].ratio:
        ratio = _try(oracle_forward, prim, rounded, case.attrs, label=what)
    ref_fwd = _part(prim, "reference", "forward")
    scale = tol.magnitude(prim, "forward", inputs=ref_in, attrs=case.attrs,
                          reference=ref_fwd)
    k = tol.accumulation_length(prim, "forward", inputs=ref_in, out=expected)
    tol.assert_close(actual, expected, tdtype or dtype, what=what,
                     ratio_reference=ratio, scale=scale, k=k,
                     flush=flush and (flushes(dtype) or flushes(tdtype or dtype)))


@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(FORWARD))
@given(data=st.data())
def test_kernel_forward_matches_reference(prim, dtype, data, kernel_device):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "forward", case)
    note(what)
    rounded, ref_in, k_in = both_sides(case, dtype, kernel_device)
    ref_fwd = _part(prim, "reference", "forward")
    ker_fwd = _part(prim, "kernel", "forward")

    expected = np.asarray(_call("reference", ref_fwd, ref_in, case.attrs, what))
    before = snapshot(k_in)
    out = _call("kernel", ker_fwd, k_in, _with_device(ker_fwd, case.attrs, kernel_device), what)
    assert_untouched(k_in, before, what)
    assert _is_tensor(out), f"{what}: the kernel returned a {type(out).__name__}, not a torch tensor"
    assert str(out.device).split(":")[0] == kernel_device, \
        f"{what}: the kernel's output is on {out.device}, expected {kernel_device}"
    check_forward(to_numpy(out), expected, prim, dtype, case, rounded, ref_in,
                  f"{what}: kernel vs reference", flush=True)


# === b. kernel backward vs reference ==========================================================

def check_backward(grads, ref_grads, prim, dtype, out_dtype, case, rounded, ref_in, ref_out, g, what,
                   flush=False):
    """Gradients under test (torch tensors of a kernel, or the reference's own
    NumPy arrays in ``dtype``) against ``ref_grads`` (the reference on float64
    copies, for the float64 output gradient ``g``), input by input."""
    n = len(rounded)
    assert_arrays(what, "backward", *[g_ for g_ in ref_grads if g_ is not None],
                  *[g_ for g_ in grads if g_ is not None and not _is_tensor(g_)])
    for side, gs in (("reference", ref_grads), ("tested", grads)):
        assert isinstance(gs, tuple) and len(gs) == n, \
            f"{what}: the {side} backward must return a tuple of {n} gradients (one per input), " \
            f"got {type(gs).__name__} of length {len(gs) if hasattr(gs, '__len__') else '?'}"
    idx = grad_indices(case, rounded)
    ratio = {}
    if tol.TOLERANCES[tol.dtype_name(dtype)].ratio:
        ratio = _try(oracle_gradients, prim, rounded, case.attrs, g, idx, label=what) or {}
    ref_bwd = _part(prim, "reference", "backward")
    g_ref = np.asarray(g, dtype=F64)
    scales = tol.magnitude(prim, "backward", inputs=ref_in, attrs=case.attrs,
                           out=ref_out, grad=g_ref, reference=ref_bwd)
    for i in idx:
        rg, kg = ref_grads[i], grads[i]
        gwhat = f"{what}: gradient of input {i}"
        if rg is None or kg is None:
            assert rg is None and kg is None, \
                f"{gwhat}: the reference gives {'None' if rg is None else 'an array'}, " \
                f"the tested side {'None' if kg is None else 'an array'}"
            continue
        if not isinstance(kg, np.ndarray):
            assert _is_tensor(kg), f"{gwhat}: the kernel returned a {type(kg).__name__}"
            kg = to_numpy(kg)
        assert kg.shape == np.shape(rounded[i]), \
            f"{gwhat}: shape {kg.shape}, but the input has shape {np.shape(rounded[i])}"
        assert kg.dtype == np.asarray(rounded[i]).dtype, \
            f"{gwhat}: dtype {kg.dtype}, but the input has dtype {np.asarray(rounded[i]).dtype}"
        assert np.shape(rg) == np.shape(rounded[i]), \
            f"{gwhat}: the reference gradient has shape {np.shape(rg)}, the input {np.shape(rounded[i])}"
        k = tol.accumulation_length(prim, "backward", inputs=ref_in, out=ref_out,
                                    grad=g_ref, grad_input=rounded[i])
        # the gradient went through the output's dtype (cast: possibly coarser)
        gdtype = tol.coarsest(dtype, out_dtype) or dtype
        tol.assert_close(kg, rg, gdtype, what=gwhat, ratio_reference=ratio.get(i),
                         scale=scales[i], k=k, flush=flush and (flushes(dtype) or flushes(gdtype)))


@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(BACKWARD))
@given(data=st.data())
def test_kernel_backward_matches_reference(prim, dtype, data, kernel_device):
    case = draw_case(data, prim, dtype)
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="gradient seed")
    glayout = data.draw(st.sampled_from(LAYOUTS), label="gradient layout")
    what = describe(prim, dtype, "backward", case, **{"gradient seed": seed,
                                                       "gradient layout": glayout})
    note(what)
    rounded, ref_in, k_in = both_sides(case, dtype, kernel_device)
    ref_fwd = _part(prim, "reference", "forward")
    ref_bwd = _part(prim, "reference", "backward")
    ker_fwd = _part(prim, "kernel", "forward")
    ker_bwd = _part(prim, "kernel", "backward")
    kattrs = _with_device(ker_fwd, case.attrs, kernel_device)

    ref_out = np.asarray(_call("reference forward", ref_fwd, ref_in, case.attrs, what))
    k_out = _call("kernel forward", ker_fwd, k_in, kattrs, what)
    out_dtype = tfd.from_torch(k_out.dtype)
    g = _gradient(seed, ref_out.shape, out_dtype)
    g_t = to_torch(g, glayout, kernel_device)

    ref_grads = _call("reference backward", ref_bwd, (g.astype(F64), ref_out) + ref_in, case.attrs, what)
    args = (g_t, k_out) + k_in
    before = snapshot(args)
    k_grads = _call("kernel backward", ker_bwd, args, kattrs, what)
    assert_untouched(args, before, what + " (arguments: grad, out, *inputs)")
    check_backward(k_grads, ref_grads, prim, dtype, out_dtype, case, rounded, ref_in, ref_out, g,
                   f"{what}, kernel vs reference", flush=True)


# === g. the reference in the dtype under test vs the reference in float64 =====================
# The CPU device runs the reference on the user's own dtype, not on float64
# copies, and it is the oracle people test against: in float32, float16 and
# bfloat16 it must be as accurate as the kernels (accumulate in float32 and
# round once, never sum in a 16-bit type), so it is held to the same table.

LOW_PRECISION = ("float32", "float16", "bfloat16")


def _in_dtype(rounded, layouts):
    return tuple(in_layout(np.array(x), layouts[i]) for i, x in enumerate(rounded))


@pytest.mark.parametrize("prim,dtype", _params(FORWARD, dtypes=LOW_PRECISION))
@given(data=st.data())
def test_reference_in_dtype_forward_matches_float64(prim, dtype, data):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "reference forward in dtype", case)
    note(what)
    layouts = case_layouts(case, len(case.inputs))
    rounded = rounded_inputs(case, dtype)
    ref_in = reference_copies(rounded, layouts)
    fwd = _part(prim, "reference", "forward")
    expected = np.asarray(_call("reference in float64", fwd, ref_in, case.attrs, what))
    actual = _call(f"reference in {dtype}", fwd, _in_dtype(rounded, layouts), case.attrs, what)
    check_forward(actual, expected, prim, dtype, case, rounded, ref_in,
                  f"{what}: reference in {dtype} vs reference in float64")


@pytest.mark.parametrize("prim,dtype", _params(BACKWARD, dtypes=LOW_PRECISION))
@given(data=st.data())
def test_reference_in_dtype_backward_matches_float64(prim, dtype, data):
    case = draw_case(data, prim, dtype)
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="gradient seed")
    glayout = data.draw(st.sampled_from(LAYOUTS), label="gradient layout")
    what = describe(prim, dtype, "reference backward in dtype", case,
                    **{"gradient seed": seed, "gradient layout": glayout})
    note(what)
    layouts = case_layouts(case, len(case.inputs))
    rounded = rounded_inputs(case, dtype)
    ref_in, low_in = reference_copies(rounded, layouts), _in_dtype(rounded, layouts)
    fwd, bwd = _part(prim, "reference", "forward"), _part(prim, "reference", "backward")
    ref_out = np.asarray(_call("reference forward in float64", fwd, ref_in, case.attrs, what))
    low_out = np.asarray(_call(f"reference forward in {dtype}", fwd, low_in, case.attrs, what))
    g = _gradient(seed, ref_out.shape, low_out.dtype)
    ref_grads = _call("reference backward in float64", bwd, (g.astype(F64), ref_out) + ref_in, case.attrs, what)
    low_grads = _call(f"reference backward in {dtype}", bwd, (in_layout(g, glayout), low_out) + low_in,
                      case.attrs, what)
    check_backward(low_grads, ref_grads, prim, dtype, low_out.dtype, case, rounded, ref_in, ref_out, g,
                   f"{what}, reference in {dtype} vs reference in float64")


# === c. reference backward vs finite differences (float64) ======================================

#: the jitter moves every floating input by 0.05-0.1 % of (|x| + 0.01) so that
#: no input sits on a kink (relu/abs at 0) or a tie (max, maximum): the
#: derivative is unique there and a central difference can see it. Subgradient
#: conventions *at* kinks are pinned by the kernel-vs-reference tests instead.
JITTER = 1e-3
#: central-difference step, relative to (|x| + 0.01): at most 3e-9 of it, far
#: below the jitter's distance to any kink (>= 5e-4 of it), so no step crosses one.
FD_STEP = 1e-9


def jitter(arrays, rng, idx=None):
    """Move floating inputs off kinks and ties (see JITTER). Equal values (in
    any input) get distinct jitter magnitudes so that ties cannot survive."""
    arrays = [np.array(a) for a in arrays]
    floating = [i for i, a in enumerate(arrays) if is_float(a)]
    if not floating:
        return arrays
    allvals = np.concatenate([arrays[i].ravel() for i in floating])
    if allvals.size == 0:
        return arrays
    _, inverse, counts = np.unique(allvals, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    # rank of each element within its group of equal values, in random order
    perm = rng.permutation(allvals.size)
    rank = np.empty(allvals.size, dtype=np.int64)
    order = perm[np.argsort(inverse[perm], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank[order] = np.arange(allvals.size) - np.repeat(starts, counts)
    # equal values get distinct slots, and a uniform draw inside the slot keeps
    # nearly equal values (0 and 2e-16) apart as well
    frac = 0.5 + 0.5 * (rank + rng.uniform(0.05, 0.95, size=allvals.size)) / counts[inverse]
    sign = rng.choice([-1.0, 1.0], size=allvals.size)
    delta = sign * frac * JITTER * (np.abs(allvals) + 1e-2)
    delta = np.where(np.isfinite(allvals), delta, 0.0)
    pos = 0
    for i in floating:
        a = arrays[i]
        arrays[i] = a + delta[pos:pos + a.size].reshape(a.shape)
        pos += a.size
    return arrays


def _finite_dot(a, b):
    """sum(a * b) over the positions where both are finite."""
    a, b = np.asarray(a, dtype=F64), np.asarray(b, dtype=F64)
    m = np.isfinite(a) & np.isfinite(b)
    return float(np.sum(np.where(m, a, 0.0) * np.where(m, b, 0.0)))


@pytest.mark.parametrize("prim", _f64_params([p for p in BACKWARD if "float64" in p.dtypes]))
@given(data=st.data())
def test_reference_backward_matches_finite_differences(prim, data):
    case = draw_case(data, prim, "float64")
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="direction seed")
    what = describe(prim, "float64", "backward vs finite differences", case, seed=seed)
    note(what)
    rng = np.random.default_rng(seed)
    ref_fwd = _part(prim, "reference", "forward")
    ref_bwd = _part(prim, "reference", "backward")
    layouts = case_layouts(case, len(case.inputs))
    x = jitter(reference_copies(rounded_inputs(case, "float64")), rng)
    x = [in_layout(a, layouts[i]) for i, a in enumerate(x)]
    idx = grad_indices(case, x)
    f0 = np.asarray(_call("reference forward", ref_fwd, x, case.attrs, what))
    if f0.dtype != F64:
        # an output narrower than float64 (a cast to float16, say) is piecewise
        # constant at this resolution: nothing for a finite difference to see
        event(f"finite differences skipped: output dtype {f0.dtype}")
        return
    g = rng.standard_normal(f0.shape)
    g = np.where(np.isfinite(f0), g, 0.0)
    # per-input directions, scaled to each element's size; none where x is not finite
    d = {i: np.where(np.isfinite(x[i]), np.clip(rng.standard_normal(np.shape(x[i])), -3, 3)
                     * (np.abs(np.where(np.isfinite(x[i]), x[i], 0.0)) + 1e-2), 0.0)
         for i in idx}
    grads = _call("reference backward", ref_bwd, (g, f0) + tuple(x), case.attrs, what)
    # with NaN or inf in the case, a gradient can be NaN at finite inputs coupled to
    # them (a softmax row holding a NaN, a sum over a broadcast NaN: 0 * NaN); the
    # torch check pins those values, so the directions skip them here
    nonfinite_case = not np.all(np.isfinite(f0)) or any(
        is_float(a) and not np.all(np.isfinite(a)) for a in x)
    lhs, scale = 0.0, 0.0
    for i in idx:
        if grads[i] is None:
            continue
        gi = np.asarray(grads[i], dtype=F64)
        if nonfinite_case:
            d[i] = np.where(np.isfinite(gi), d[i], 0.0)
        nz = d[i] != 0
        if not np.all(np.isfinite(gi[nz])):
            raise AssertionError(f"{what}: the gradient of input {i} is not finite at finite inputs")
        lhs += float(np.sum(np.where(nz, gi, 0.0) * d[i]))
        scale += float(np.sum(np.abs(np.where(nz, gi, 0.0) * d[i])))
    xp = list(x)
    xm = list(x)
    for i in idx:
        xp[i] = in_layout(x[i] + FD_STEP * d[i], layouts[i])
        xm[i] = in_layout(x[i] - FD_STEP * d[i], layouts[i])
    fp = np.asarray(_call("reference forward", ref_fwd, xp, case.attrs, what), dtype=F64)
    fm = np.asarray(_call("reference forward", ref_fwd, xm, case.attrs, what), dtype=F64)
    rhs = (_finite_dot(fp, g) - _finite_dot(fm, g)) / (2 * FD_STEP)
    # rounding noise of evaluating f, amplified by 1/step
    noise = 8 * tol.UNIT_ROUNDOFF["float64"] * _finite_dot(np.abs(f0), np.abs(g)) / FD_STEP
    bound = tol.FD_RTOL * (scale + abs(rhs)) + noise
    assert abs(lhs - rhs) <= bound, (
        f"{what}: <backward(g), v> = {lhs!r} but the central difference "
        f"(f(x+hv) - f(x-hv)).g / 2h = {rhs!r} (h = {FD_STEP:g}, relative to |x|+0.01); "
        f"difference {abs(lhs - rhs):.3g} > bound {bound:.3g} "
        f"(FD_RTOL {tol.FD_RTOL:g} x (sum |grad*v| = {scale:.3g} + |fd|) + noise {noise:.3g})")


# === d. reference vs torch.autograd (float64) =================================================

@requires_torch
@pytest.mark.parametrize("prim", _f64_params([p for p in FORWARD if "float64" in p.dtypes]))
@given(data=st.data())
def test_reference_matches_torch_float64(prim, data):
    case = draw_case(data, prim, "float64")
    what = describe(prim, "float64", "reference vs torch", case)
    note(what)
    layouts = case_layouts(case, len(case.inputs))
    x = reference_copies(rounded_inputs(case, "float64"), layouts)
    ref_fwd = _part(prim, "reference", "forward")
    expected = np.asarray(_call("reference", ref_fwd, x, case.attrs, what))
    oracle = _call("torch oracle", oracle_forward, (prim, x, case.attrs), {}, what)
    tol.assert_close(expected, oracle, tol.coarsest(expected.dtype) or "float64",
                     what=f"{what}: forward, reference vs torch", rtol=tol.TORCH_F64_RTOL)
    if not prim.differentiable:
        return
    # gradients away from kinks and ties (see JITTER): conventions at a kink
    # (relu'(0), which of two tied maxima gets the gradient) may differ from torch's
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="gradient seed")
    rng = np.random.default_rng(seed)
    xj = tuple(in_layout(a, layouts[i]) for i, a in enumerate(jitter(x, rng)))
    ref_bwd = _part(prim, "reference", "backward")
    out = np.asarray(_call("reference", ref_fwd, xj, case.attrs, what), dtype=F64)
    g = rng.standard_normal(out.shape)
    idx = grad_indices(case, xj)
    ref_grads = _call("reference backward", ref_bwd, (g, out) + xj, case.attrs, what)
    torch_grads = _call("torch.autograd", oracle_gradients, (prim, xj, case.attrs, g, idx), {}, what)
    for i in idx:
        if ref_grads[i] is None:
            raise AssertionError(f"{what}: the reference gives no gradient for input {i}, "
                                 "which is floating (set Case.grad_inputs if that is intended)")
        tol.assert_close(ref_grads[i], torch_grads[i], "float64",
                         what=f"{what}: gradient of input {i} (jittered inputs, gradient seed "
                              f"{seed}), reference vs torch.autograd", rtol=tol.TORCH_F64_RTOL)


# === e. random primitives ====================================================================

#: known distributions: (mean, standard deviation, fourth central moment,
#: support (low, high), whether high is excluded)
DISTRIBUTIONS = {
    "rand_uniform": (0.5, math.sqrt(1 / 12), 1 / 80, (0.0, 1.0), True),
    "rand_normal": (0.0, 1.0, 3.0, (-math.inf, math.inf), False),
}
MOMENT_N = 1 << 17


def _random_attrs(case, shape, seed):
    return {**case.attrs, "shape": shape, "seed": seed}


def _bits(a):
    return np.ascontiguousarray(a).tobytes()


def _check_same_and_different(prim, dtype, run, attrs, what):
    a = run(attrs)
    b = run(attrs)
    shape = attrs["shape"]
    want = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    assert a.shape == want, f"{what}: shape {a.shape}, asked for {shape}"
    assert a.dtype == tfd.as_dtype(dtype), f"{what}: dtype {a.dtype}, expected {dtype}"
    assert _bits(a) == _bits(b), \
        f"{what}: two draws with the same seed {attrs['seed']} differ"
    if a.size >= 16:
        other = dict(attrs, seed=(attrs["seed"] + 1) % (2 ** 63))
        c = run(other)
        assert _bits(a) != _bits(c), \
            f"{what}: seeds {attrs['seed']} and {other['seed']} give the same {a.size} numbers"


def _check_moments(prim, dtype, sample, what, reference_sample=None):
    x = np.asarray(sample, dtype=F64).ravel()
    n = x.size
    assert np.all(np.isfinite(x)), f"{what}: the draw contains NaN or Inf"
    mean, std = float(x.mean()), float(x.std())
    z = tol.MOMENT_SIGMAS
    known = DISTRIBUTIONS.get(prim.name)
    if known is not None:
        mu, sigma, mu4, (lo, hi), open_hi = known
        # standard errors of the sample mean and the sample standard deviation
        se_mean = sigma / math.sqrt(n)
        se_std = math.sqrt(max(mu4 - sigma ** 4, 0.0) / n) / (2 * sigma)
        # rounding to dtype shifts each value by at most u |x|: allow it on top
        bias = tol.UNIT_ROUNDOFF[tol.dtype_name(dtype)] * (abs(mu) + 4 * sigma)
        assert abs(mean - mu) <= z * se_mean + bias, \
            f"{what}: mean {mean:.5g} of {n} draws, expected {mu:.5g} +- {z * se_mean + bias:.2g}"
        assert abs(std - sigma) <= z * se_std + bias, \
            f"{what}: standard deviation {std:.5g} of {n} draws, expected {sigma:.5g} +- " \
            f"{z * se_std + bias:.2g}"
        assert x.min() >= lo and (x.max() < hi if open_hi else x.max() <= hi), \
            f"{what}: values must lie in [{lo}, {hi}{')' if open_hi else ']'}, got " \
            f"[{x.min()!r}, {x.max()!r}]"
    if reference_sample is not None:
        # two-sample comparison with torch's own generator in the same dtype
        y = np.asarray(reference_sample, dtype=F64).ravel()
        se = math.sqrt(x.var() / n + y.var() / y.size)
        assert abs(mean - y.mean()) <= z * se + 1e-12, \
            f"{what}: mean {mean:.5g} vs torch's {y.mean():.5g} (+- {z * se:.2g})"
        se_s = math.sqrt(_var_of_std(x) + _var_of_std(y))
        assert abs(std - y.std()) <= z * se_s + 1e-12, \
            f"{what}: standard deviation {std:.5g} vs torch's {y.std():.5g} (+- {z * se_s:.2g})"


def _var_of_std(x):
    s2 = x.var()
    if s2 == 0:
        return 0.0
    m4 = float(np.mean((x - x.mean()) ** 4))
    return max(m4 - s2 * s2, 0.0) / x.size / (4 * s2)


@pytest.mark.parametrize("prim,dtype", _params(RANDOM))
@given(data=st.data())
def test_random_reference_is_reproducible(prim, dtype, data):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "reference draw", case)
    ref = _part(prim, "reference", "forward")
    _check_same_and_different(prim, dtype, lambda a: np.asarray(_call("reference", ref, (), a, what)),
                              dict(case.attrs), what)


@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(RANDOM))
@given(data=st.data())
def test_random_kernel_is_reproducible(prim, dtype, data, kernel_device):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "kernel draw", case)
    ker = _part(prim, "kernel", "forward")

    def run(attrs):
        out = _call("kernel", ker, (), _with_device(ker, attrs, kernel_device), what)
        assert _is_tensor(out), f"{what}: the kernel returned a {type(out).__name__}"
        return to_numpy(out)
    _check_same_and_different(prim, dtype, run, dict(case.attrs), what)


def _example_attrs(prim, dtype):
    """One drawn case's attrs (the strategy's idea of a valid call)."""
    from hypothesis import find
    case = find(_strategy(prim, dtype), lambda c: True)
    return case


@pytest.mark.parametrize("prim,dtype", _params(RANDOM))
def test_random_reference_moments(prim, dtype):
    case = _example_attrs(prim, dtype)
    attrs = _random_attrs(case, (MOMENT_N,), 20240611)
    what = describe(prim, dtype, "reference moments", case)
    sample = np.asarray(_call("reference", _part(prim, "reference", "forward"), (), attrs, what))
    torch_sample = _try(oracle_forward, prim, (), attrs, label=what)
    _check_moments(prim, dtype, sample, what, torch_sample)


@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(RANDOM))
def test_random_kernel_moments(prim, dtype, kernel_device):
    case = _example_attrs(prim, dtype)
    attrs = _random_attrs(case, (MOMENT_N,), 20240611)
    what = describe(prim, dtype, "kernel moments", case)
    ker = _part(prim, "kernel", "forward")
    sample = to_numpy(_call("kernel", ker, (), _with_device(ker, attrs, kernel_device), what))
    torch_sample = _try(oracle_forward, prim, (), attrs, label=what)
    _check_moments(prim, dtype, sample, what, torch_sample)


# === e2. random primitives with inputs (dropout) ================================================
# Their outputs depend on a seed drawn differently on each side, so the two
# sides cannot be compared value by value: each side must be reproducible from
# the seed, forward and backward (the family tests check the distribution).

def _reproducible(prim, run, what):
    y1, g1 = run()
    y2, g2 = run()
    assert _bits(y1) == _bits(y2), f"{what}: the same seed gave different outputs"
    for i, (a, b) in enumerate(zip(g1, g2)):
        if a is not None:
            assert _bits(a) == _bits(b), f"{what}: the same seed gave different gradients for input {i}"


@pytest.mark.parametrize("prim,dtype", _params(RANDOM_WITH_INPUTS))
@given(data=st.data())
def test_random_reference_with_inputs_is_reproducible(prim, dtype, data):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "reference, same seed twice", case)
    xs = reference_copies(rounded_inputs(case, dtype), case_layouts(case, len(case.inputs)))
    fwd, bwd = _part(prim, "reference", "forward"), _part(prim, "reference", "backward")

    def run():
        y = np.asarray(_call("reference", fwd, xs, case.attrs, what))
        g = np.ones_like(y)
        return y, [None if d is None else np.asarray(d) for d in _call("reference", bwd, (g, y) + xs, case.attrs, what)]
    _reproducible(prim, run, what)


@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(RANDOM_WITH_INPUTS))
@given(data=st.data())
def test_random_kernel_with_inputs_is_reproducible(prim, dtype, data, kernel_device):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "kernel, same seed twice", case)
    xs = kernel_tensors(rounded_inputs(case, dtype, flushes(dtype)), case_layouts(case, len(case.inputs)),
                        kernel_device)
    fwd, bwd = _part(prim, "kernel", "forward"), _part(prim, "kernel", "backward")

    def run():
        y = _call("kernel", fwd, xs, case.attrs, what)
        g = kernel_tensors((np.ones(tuple(y.shape)),), ("contiguous",), kernel_device)[0].to(y.dtype)
        grads = _call("kernel", bwd, (g, y) + xs, case.attrs, what)
        return to_numpy(y), [None if d is None else to_numpy(d) for d in grads]
    _reproducible(prim, run, what)


# === f. in-place primitives ===================================================================

@pytest.mark.requires_kernels
@pytest.mark.parametrize("prim,dtype", _params(IN_PLACE))
@given(data=st.data())
def test_in_place_kernel_matches_reference(prim, dtype, data, kernel_device):
    case = draw_case(data, prim, dtype)
    what = describe(prim, dtype, "in place", case)
    note(what)
    rounded, ref_in, k_in = both_sides(case, dtype, kernel_device)
    ref_fwd = _part(prim, "reference", "forward")
    ker_fwd = _part(prim, "kernel", "forward")

    r = _call("reference", ref_fwd, ref_in, case.attrs, what)
    assert r is None, f"{what}: an in-place reference returns None, got {type(r).__name__}"
    ratio_new = None
    if tol.TOLERANCES[tol.dtype_name(dtype)].ratio:
        ratio_new = _try(oracle_forward, prim, rounded, case.attrs, label=what)
    before = snapshot(k_in)
    out = _call("kernel", ker_fwd, k_in, _with_device(ker_fwd, case.attrs, kernel_device), what)
    assert out is None, f"{what}: an in-place kernel returns None, got {type(out).__name__}"
    assert_untouched(k_in, before, what, allowed=prim.mutates)
    ratio_of = dict(zip(prim.mutates, ratio_new)) if ratio_new is not None else {}
    for i, (t, expected) in enumerate(zip(k_in, ref_in)):
        actual = to_numpy(t)
        if not is_float(expected):
            assert np.array_equal(actual, expected), f"{what}: non-floating input {i} changed"
            continue
        tol.assert_close(actual, expected, dtype,
                         what=f"{what}: input {i} after the update ({case.layout(i)}), kernel vs reference",
                         ratio_reference=ratio_of.get(i), flush=flushes(dtype))


@requires_torch
@pytest.mark.parametrize("prim", _f64_params([p for p in IN_PLACE if "float64" in p.dtypes]))
@given(data=st.data())
def test_in_place_reference_matches_torch_float64(prim, data):
    case = draw_case(data, prim, "float64")
    what = describe(prim, "float64", "in place, reference vs torch", case)
    note(what)
    x = reference_copies(rounded_inputs(case, "float64"), case_layouts(case, len(case.inputs)))
    original = [np.array(a) for a in x]
    new = oracle_forward(prim, original, case.attrs)
    new = new if isinstance(new, tuple) else (new,)
    mutated = prim.mutates
    assert len(new) == len(mutated), \
        f"{what}: the oracle returns {len(new)} arrays for the inputs {mutated} declared mutated"
    _call("reference", _part(prim, "reference", "forward"), x, case.attrs, what)
    for j, i in enumerate(mutated):
        tol.assert_close(x[i], new[j], "float64", rtol=tol.TORCH_F64_RTOL,
                         what=f"{what}: input {i} after the update, reference vs torch")
    for i in set(range(len(x))) - set(mutated):
        assert np.array_equal(x[i], original[i], equal_nan=is_float(x[i])), \
            f"{what}: the reference changed input {i}, which is not among the mutated {mutated}"
