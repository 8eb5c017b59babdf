"""The one table of tolerances, and the comparison every kernel test uses.

How the numbers are derived. ``u`` is the unit roundoff of a dtype (half the
distance from 1 to the next number): float64 2^-53, float32 2^-24, float16
2^-11, bfloat16 2^-8. Kernels load, upcast at once and compute in float32
(float64 stays float64), and round once when they store the output. The
reference runs in float64 on the very same (already rounded) input values. So
a correct kernel's error against the reference is

    (rounding of the output: at most u_dtype, relative, per element)
  + (its float32 arithmetic: a few u_32 per operation; for a sum of K terms,
     about sqrt(K) u_32 with random-sign rounding errors, K u_32 at worst)

The error measure is normwise relative, ``||a - e||_inf / max(||e||_inf, floor)``
with ``floor`` the dtype's smallest normal number: below it the output rounding
is absolute (half a subnormal spacing), and ``u_dtype * tiny`` is exactly that,
so the bound above holds there too.

For float16/bfloat16 (and float32/float64, see their entries) a fixed
tolerance is brittle where the *output rounding feeds the math*: a backward
that uses the forward output ``out`` (sigmoid, tanh, softmax use ``out``),
results that flush to subnormals, cancellations the dtype cannot represent.
torch makes the same errors on the same inputs, so there ``assert_close``
also accepts an error within ``RATIO`` (2x) of torch's own error in the same
dtype (``ratio_reference``: torch's result in that dtype, measured against
the same float64 reference).
"""
import math
from dataclasses import dataclass

import numpy as np

from triflux import dtypes as _dt
from triflux.reference._util import unbroadcast
from triflux.testing import finite_max

#: unit roundoff (2^-p for a p-bit significand) of each floating dtype
UNIT_ROUNDOFF = {
    "float64": 2.0 ** -53,
    "float32": 2.0 ** -24,
    "float16": 2.0 ** -11,
    "bfloat16": 2.0 ** -8,
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float           # normwise relative error accepted outright
    compute_u: float      # unit roundoff of the type the kernel computes in
    ratio: bool           # also accept within RATIO x of torch's same-dtype error


#: THE table. One entry per dtype; nothing else in the suite invents a tolerance
#: for kernel-vs-reference comparisons (the per-primitive looseners below follow
#: from the traits each primitive declares in triflux/primitives.py).
TOLERANCES = {
    # float64 kernels compute in float64: a handful of operations, each within an
    # ulp or two (libdevice / NumPy transcendental functions: <= 2-4 ulp), and the
    # reference may associate sums differently. 2^-40 = 8192 u_64 ~ 9e-13 is far
    # above that and still ~10^5 times below a kernel that slipped to float32
    # somewhere (>= u_32 ~ 6e-8), which is the bug this entry exists to catch.
    # The ratio test is on: where a formula cancels, float64 loses digits too.
    # Example: gelu's 0.5 x (1 + tanh(u)) at x = -4 has 1 + tanh(u) ~ 7e-4, which
    # amplifies tanh's rounding ~1400x: kernel and reference differ by 1.7e-12,
    # torch and the reference by 3.2e-12.
    "float64": Tolerance(rtol=2.0 ** -40, compute_u=2.0 ** -53, ratio=True),
    # float32: output rounding u_32 ~ 6e-8 plus float32 arithmetic; composite
    # activations (gelu, softplus, swish, elu: exp/log/tanh/erf chains of ~5
    # operations, each <= 2-4 ulp in libdevice or NumPy) stay within ~20 u_32.
    # 2^-18 = 64 u_32 ~ 3.8e-6 leaves a factor of ~3 on top of that; a wrong
    # formula, a float16 round trip or a lost term is >= 1e-4.
    # The ratio test is on for float32 too: a backward receives the forward
    # output *rounded to float32*, and where the math amplifies that rounding
    # no float32 implementation can do better. Example: logsumexp of
    # [1e4, 1e4] is 10000.69, whose float32 neighbours are 2^-10 apart; the
    # backward g * exp(x - out) then carries a relative error ~5e-4 in torch
    # exactly as in the kernel.
    "float32": Tolerance(rtol=2.0 ** -18, compute_u=2.0 ** -24, ratio=True),
    # float16: computed in float32 (error ~1e-6, negligible), rounded once on the
    # store: <= u_16 = 2^-11 relative. 2^-10 = 2 u_16 ~ 9.8e-4 allows the one
    # rounding plus the float32 part with room to spare; not more, because one
    # extra float16 rounding of an intermediate (the classic bug) already costs
    # about u_16 more. Where the dtype's own rounding feeds the math, the ratio
    # test against torch decides (see the module docstring).
    "float16": Tolerance(rtol=2.0 ** -10, compute_u=2.0 ** -24, ratio=True),
    # bfloat16: the same reasoning with u_bf16 = 2^-8: 2^-7 = 2 u_bf16 ~ 7.8e-3.
    "bfloat16": Tolerance(rtol=2.0 ** -7, compute_u=2.0 ** -24, ratio=True),
    # tf32: not a storage dtype but float32 dots under set_matmul_precision("tf32")
    # (matmul, conv; tests/test_matmul_precision.py). The tensor cores read each
    # float32 operand's top 19 bits (mma/wgmma .tf32 drop the low 13 and Triton
    # does not round first): a truncation, relative error < 2^-10 (rounding to
    # nearest would give u = 2^-11). A product of two such operands is off by
    # < 2 * 2^-10 = 2^-9 relative, so a dot by < 2^-9 sum_k |a_k b_k|, which is
    # the magnitude floor of these multilinear primitives: 2^-9 bounds the
    # normwise error, and the accumulation loosener (compute_u = u_32) covers
    # the float32 sums and the output's rounding. The bound is the worst case
    # (every dropped bit a one); truncation shrinks every product, by about
    # 2^-10 on average, so a sum of terms of one sign comes out about half the
    # bound low. No ratio test: torch on the CPU has no TF32 to compare with.
    "tf32": Tolerance(rtol=2.0 ** -9, compute_u=2.0 ** -24, ratio=False),
}

#: the factor by which a kernel may exceed torch's error in
#: the same dtype on the same inputs (DESIGN.md, "Testing")
RATIO = 2.0

#: dtypes whose subnormal numbers the Triton interpreter (3.6) converts wrongly.
#: bfloat16 <-> float32 conversions of subnormals (|x| < 2^-126 ~ 1.2e-38) are
#: off in both directions: loading the bfloat16 1.9e-39 gives 3.7e-39 in
#: float32, 9.2e-41 gives 0 (so abs' backward sees sign(0) = 0); storing the
#: float32 8e-41 as bfloat16 gives 8.7e-39. A GPU converts them exactly. So
#: under the interpreter, and only there, the harness flushes these dtypes'
#: subnormals to (signed) zero: in the inputs, so that both sides compute on
#: the same numbers, and in the results before comparing them (flush-to-zero
#: semantics). float16 subnormals convert correctly and are kept.
INTERPRETER_FLUSH_SUBNORMALS = {"bfloat16"}


def flush_subnormals(a, dtype):
    """``a`` with every nonzero value below ``dtype``'s smallest normal number
    in magnitude replaced by a zero of the same sign (``a``'s dtype is kept)."""
    a = np.asarray(a)
    if not _dt.is_floating(a.dtype):
        return a
    tiny = float(_finfo(_dt.as_dtype(dtype_name(dtype))).tiny)
    a64 = a.astype(np.float64)
    small = (a64 != 0) & (np.abs(a64) < tiny)
    if not small.any():
        return a
    return np.where(small, np.copysign(0.0, a64), a64).astype(a.dtype)


# --- per-primitive looseners, from the traits declared in triflux/primitives.py -----------

#: For a primitive declared ``accumulates`` the float32 arithmetic error grows
#: with the accumulation length K: about sqrt(K) u_compute for random-sign
#: rounding errors (blocked/tree sums keep the worst case near that too). The
#: tolerance gets ACCUMULATION_C * sqrt(K) * u_compute on top of the table
#: entry; K is bounded by the size of the largest tensor involved (a few
#: thousand in the strategies), so float32 moves from 3.8e-6 to at most ~2e-5
#: and float16/bfloat16 barely move. Backward passes of broadcasting
#: primitives accumulate too (the gradient of a broadcast input is a sum over
#: the broadcast axes); that loosener applies whenever a gradient has fewer
#: elements than the output gradient.
ACCUMULATION_C = 4.0


def magnitude(prim, direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """A floor for the denominator of the relative error of ``prim``'s
    ``direction`` (None: no floor), from the size of the terms the computation
    adds up. ``inputs``/``out``/``grad`` are the float64 reference-side arrays;
    ``reference`` the reference function of that direction. Returns a float, or
    a tuple (one per input) for "backward".

    The primitive's own ``<name>_magnitude`` (triflux/testing/<family>.py)
    decides first; where it has none (or returns None) the traits do:

    * ``multilinear_forward`` / ``multilinear_backward``: the direction is a
      sum of products (backward: of the inputs and the output gradient), so
      the natural size of a rounding error is set by the same computation on
      absolute values, f(|x|) >= |f(x)| (triangle inequality): a dot product
      or a gradient sum that cancels to nearly zero cannot be computed to
      small *relative* error in float32 by anyone (torch included), only to
      small error relative to sum |terms|. A plain elementwise a+b is computed
      exactly in float32 and rounded once, so it keeps the strict measure.
    * ``broadcasting`` (backward): the gradient of a broadcast input is a sum
      over the broadcast axes of per-element terms (g * dy/dx), each with a
      relative error of up to u_dtype of its own: the kernel's backward
      receives the forward output *rounded to dtype* (pow's db = sum g * y *
      log(a) uses y), and the terms may cancel (pow of a (1, 5, 6, 10) bfloat16
      array by a scalar: 300 terms, the sum 500x smaller than sum |terms|).
      The achievable bound is u_dtype * sum |terms|: the reference backward is
      evaluated on the inputs broadcast to the output's shape (no sum), and
      the absolute values are summed back with unbroadcast. Inputs that are
      not broadcast get no floor.
    """
    own = prim.magnitude()
    if own is not None:
        floor = own(direction, inputs=inputs, attrs=attrs, out=out, grad=grad, reference=reference)
        if floor is not None:
            return floor
    absin = tuple(np.abs(x) if _is_float_array(x) else x for x in inputs)
    if direction == "forward" and prim.multilinear_forward:
        return finite_max(reference(*absin, **attrs))
    if direction == "backward" and prim.multilinear_backward:
        grads = reference(np.abs(grad), np.abs(out), *absin, **attrs)
        return tuple(None if g is None else finite_max(g) for g in grads)
    if direction == "backward" and prim.broadcasting:
        shape = np.shape(grad)
        full = tuple(np.array(np.broadcast_to(x, shape)) for x in inputs)
        terms = reference(grad, out, *full, **attrs)
        return tuple(None if t is None or np.shape(t) == np.shape(x)
                     else finite_max(unbroadcast(np.abs(np.asarray(t, dtype=np.float64)), np.shape(x)))
                     for t, x in zip(terms, inputs))
    return None if direction == "forward" else (None,) * len(inputs)


def _is_float_array(x):
    return _dt.is_floating(np.asarray(x).dtype)


def accumulation_length(prim, direction, *, inputs, out=None, grad=None, grad_input=None):
    """K for the sqrt(K) loosener (1 where the primitive does not accumulate).
    An upper bound: the number of elements of the largest tensor involved."""
    if prim.accumulates is None:
        raise AssertionError(
            f"{prim.name}: its declaration in triflux/primitives.py does not say whether it "
            "accumulates; add accumulates=True or accumulates=False to its register(...) call")
    sizes = [np.size(x) for x in inputs] + [np.size(out) if out is not None else 0]
    if prim.accumulates:
        return max([1] + sizes)
    if direction == "backward" and grad is not None and grad_input is not None \
            and np.size(grad_input) < np.size(grad):
        return max(1, np.size(grad) // max(np.size(grad_input), 1))
    return 1


# --- the comparison ------------------------------------------------------------------

def dtype_name(dtype):
    return _dt.as_dtype(dtype).name


def coarsest(*dtypes):
    """The floating dtype with the largest unit roundoff among ``dtypes``."""
    names = [dtype_name(d) for d in dtypes if d is not None and _dt.is_floating(d)]
    return max(names, key=lambda n: UNIT_ROUNDOFF[n]) if names else None


def tolerance(dtype, k=1):
    """The accepted normwise relative error for ``dtype`` with accumulation length k."""
    t = TOLERANCES[dtype_name(dtype)]
    return t.rtol + (ACCUMULATION_C * math.sqrt(k) * t.compute_u if k > 1 else 0.0)


def _as64(a):
    a = np.asarray(a)
    return a.astype(np.float64)


def normwise_error(actual, expected, floor, scale=None):
    """||a - e||_inf / max(||e||_inf, scale, floor) over the positions where both
    are finite; also returns the index of the worst element."""
    a, e = _as64(actual), _as64(expected)
    both = np.isfinite(a) & np.isfinite(e)
    if not both.any():
        return 0.0, None, 0.0, 0.0
    diff = np.where(both, np.abs(a - e), 0.0)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    num = float(diff.max())
    norm_e = float(np.abs(e[both]).max())
    den = max(norm_e, scale or 0.0, floor)
    return num / den, worst, num, norm_e


def _nonfinite_mismatch(actual, expected_in_dtype):
    a, e = _as64(actual), _as64(expected_in_dtype)
    bad = (np.isnan(a) != np.isnan(e)) | (np.isposinf(a) != np.isposinf(e)) | \
          (np.isneginf(a) != np.isneginf(e))
    return bad


def _fmt_index(idx):
    return "()" if idx == () else str(tuple(int(i) for i in idx))


def assert_close(actual, expected, dtype, *, what, ratio_reference=None, scale=None, k=1,
                 rtol=None, flush=False):
    """Assert that ``actual`` (a kernel's result, in ``dtype`` or any dtype)
    matches ``expected`` (the float64 reference) to ``dtype``'s tolerance.

    * shapes must match;
    * non-floating results (bool, int) must be equal exactly;
    * NaN positions must match, and +-Inf positions must match those of the
      reference *rounded to dtype* (an overflow in float16 is the right answer);
    * on the finite positions, the normwise relative error
      ``||a - e||_inf / max(||e||_inf, scale, tiny_dtype)`` must be at most
      ``tolerance(dtype, k)``, or, for the dtypes whose table entry says
      ``ratio`` and given a ``ratio_reference`` (torch's result in ``dtype`` on
      the same inputs), at most ``RATIO`` times torch's own error. (The ratio
      test presumes a correct reference: if the reference were wrong, torch
      and the kernel would be "equally wrong" and pass. The float64 checks of
      the reference against finite differences and torch.autograd, which do
      not use ratios, close that gap.)

    ``what`` names the comparison (primitive, direction, what is compared, the
    drawn case) and starts every failure message. ``scale`` (a magnitude
    floor, see :func:`magnitude`) and ``k`` (an accumulation length) are the
    per-primitive looseners; ``rtol`` replaces the table entry and is meant
    only for the float64 checks of the reference itself (TORCH_F64_RTOL).
    ``flush``: compare with ``dtype``'s subnormals flushed to zero (see
    INTERPRETER_FLUSH_SUBNORMALS).
    """
    a = np.asarray(actual)
    e = np.asarray(expected)
    if flush:
        a, e = flush_subnormals(a, dtype), flush_subnormals(e, dtype)
        if ratio_reference is not None:
            ratio_reference = flush_subnormals(ratio_reference, dtype)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected shape {e.shape}")
    if not _dt.is_floating(e.dtype) and not _dt.is_floating(a.dtype):
        if not np.array_equal(a, e):
            bad = np.argwhere(a != e)
            first = tuple(int(i) for i in bad[0]) if bad.size else ()
            raise AssertionError(
                f"{what}: {len(bad)} of {a.size} {e.dtype} elements differ (exact comparison); "
                f"first at {first}: actual {a[first]!r}, expected {e[first]!r}")
        return
    name = dtype_name(dtype)
    np_dtype = _dt.as_dtype(name)
    floor = float(_finfo(np_dtype).tiny)
    with np.errstate(over="ignore", invalid="ignore"):
        e_in_dtype = _as64(e).astype(np_dtype)
    bad = _nonfinite_mismatch(a, e_in_dtype)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {name}: NaN/Inf positions differ at {int(bad.sum())} of {a.size} elements; "
            f"first at {idx}: actual {_as64(a)[idx]!r}, expected {_as64(e)[idx]!r} "
            f"(in {name}: {_as64(e_in_dtype)[idx]!r})")
    err, worst, num, norm_e = normwise_error(a, e, floor, scale)
    tol = tolerance(name, k) if rtol is None else rtol
    if err <= tol:
        return
    detail = (f"normwise relative error {err:.3g} > tolerance {tol:.3g} "
              f"(||a-e||_inf = {num:.3g}, ||e||_inf = {norm_e:.3g}"
              + (f", magnitude floor {scale:.3g}" if scale else "")
              + (f", accumulation length {k}" if k > 1 else "") + "); "
              f"worst element at {_fmt_index(worst)}: actual {float(_as64(a)[worst])!r}, "
              f"expected {float(_as64(e)[worst])!r}")
    use_ratio = TOLERANCES[name].ratio and rtol is None
    if use_ratio and ratio_reference is not None:
        r = np.asarray(ratio_reference)
        if r.shape == e.shape:
            terr, _, _, _ = normwise_error(r, e, floor, scale)
            if err <= RATIO * terr:
                return
            detail += (f"; torch's error in {name} on the same inputs is {terr:.3g}, "
                       f"the kernel's is {err / terr if terr else float('inf'):.3g}x that "
                       f"(> {RATIO:g}x accepted)")
        else:
            detail += f"; torch's result has shape {r.shape}, not usable as ratio reference"
    elif use_ratio:
        detail += "; no torch result in this dtype to compare the error ratio against"
    raise AssertionError(f"{what}: {name}: {detail}")


def _finfo(np_dtype):
    if _dt.is_bfloat16(np_dtype):
        import ml_dtypes
        return ml_dtypes.finfo(np_dtype)
    return np.finfo(np_dtype)


# --- tolerances of the float64 checks of the reference itself --------------------------

#: reference vs torch.autograd, both float64: two independent accurate
#: implementations (different summation orders, different but correctly rounded
#: transcendental functions) agree to ~K u_64; 1e-10 (~10^6 u_64) is far above
#: that and still flags any formula difference (a torch threshold such as
#: softplus's default beta/threshold approximation differs by ~1e-9 and more).
TORCH_F64_RTOL = 1e-10

#: reference backward vs central finite differences of the reference forward:
#: with steps of ~1e-7 relative the truncation error is ~1e-14 and the
#: cancellation error ~u_64 / 1e-7 ~ 1e-9; 1e-6 leaves a factor 1000.
FD_RTOL = 1e-6

#: random primitives: the moment checks accept a deviation of this many
#: standard errors (a correct generator fails with probability < 1e-8).
MOMENT_SIGMAS = 6.0
