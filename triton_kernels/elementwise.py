"""Elementwise primitives in Triton: unary, binary (NumPy broadcasting),
``where``; forward and backward. Mirrors ``triflux.reference.elementwise``.

Design: four generic strided kernels, the operation chosen by a
``tl.constexpr`` op code, so each (op, dtype) pair compiles once:

* ``_unary_kernel``       y = f(x)
* ``_unary_bwd_kernel``   dx = g * f'(x, y)         (fused: one pass)
* ``_binary_kernel``      y = f(a, b), also ``where(c, a, b)``
* ``_binary_bwd_kernel``  (da, db) at the broadcast shape, then
                          :func:`reduce.unbroadcast` sums them to each
                          input's shape

Inputs may be any strided views and broadcast (stride 0); the index math is
:func:`common.nd_offset` over at most six merged dimensions, skipped (a
``tl.constexpr`` flag per input) for inputs that are dense and not broadcast,
which read at the linear index. Outputs are new dense tensors. Floating inputs are loaded and at once converted to float32
(float64 stays float64); integers and booleans compute in their own integer
type (booleans as int32, stored back as ``!= 0``).

Only ``tl.exp``, ``tl.log``, ``tl.sqrt`` and ``tl.floor`` are used from the
math library (no libdevice), so the kernels run unchanged on NVIDIA, AMD and in the
interpreter; ``expm1``, ``log1p``, ``tanh`` and ``erfc`` are built from them
with short series where cancellation would otherwise lose accuracy.

NaN: minima and maxima go through ``common.maximum``/``minimum`` (a GPU's
plain min/max drop NaN), and every branch on a comparison sends NaN where torch
does (``x > 0`` is false for NaN: leakyrelu and elu take their negative branch,
which gives NaN; at NaN relu's gradient is g and leakyrelu's g slope, as
torch's, elu's NaN).
"""

import numpy as np
import torch
import triton
import triton.language as tl

from triflux.dtypes import to_torch
from triflux.errors import DTypeError, ShapeError

from . import common
from .common import store_value
from .reduce import dense_strides as _dense, unbroadcast

# --- op codes ------------------------------------------------------------------------------

U_NEG, U_EXP, U_LOG, U_SQRT, U_ABS, U_TANH, U_SIGMOID, U_RELU, U_GELU, U_SWISH, \
    U_SOFTPLUS, U_LEAKYRELU, U_ELU, U_CAST, U_GELU_ERF = range(15)
B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAX, B_MIN, B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE, \
    B_WHERE = range(14)

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_OK_UNARY = {U_NEG, U_ABS, U_CAST, U_RELU}
_INT_OK_BINARY = {B_ADD, B_SUB, B_MUL, B_MAX, B_MIN, B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE, B_WHERE}


def _ct(dtype):
    """The Triton type a kernel computes in for inputs of torch ``dtype``."""
    if dtype == torch.float64:
        return tl.float64
    if dtype in _FLOATS:
        return tl.float32
    if dtype == torch.int64:
        return tl.int64
    return tl.int32  # int8/16/32, uint8, bool


def _nterms(dtype):
    """Series lengths (expm1, log1p, erfc) for the compute precision."""
    return (17, 11, 28) if dtype == torch.float64 else (9, 6, 15)


_UNARY_NAMES = ["neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu", "swish",
                "softplus", "leakyrelu", "elu", "cast", "gelu_erf"]
_BINARY_NAMES = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
                 "gt", "ge", "where"]


def _check_unary_dtype(x, op):
    if x.dtype in _FLOATS:
        return
    name = _UNARY_NAMES[op]
    if op not in _INT_OK_UNARY or (x.dtype == torch.bool and op == U_NEG):
        raise DTypeError(f"`{name}` is not defined for {x.dtype} inputs on the GPU path; "
                         "cast to a floating dtype first (e.g. `x.astype(float32)`)")


def _check_binary_dtypes(a, b, op):
    name = _BINARY_NAMES[op]
    if a.dtype != b.dtype:
        raise DTypeError(f"`{name}` got inputs of different dtypes ({a.dtype} and {b.dtype}); "
                         "the ops layer casts them to one dtype before calling the kernel")
    if a.dtype in _FLOATS:
        return
    if op not in _INT_OK_BINARY or (a.dtype == torch.bool and op == B_SUB):
        raise DTypeError(f"`{name}` is not defined for {a.dtype} inputs on the GPU path; "
                         "cast to a floating dtype first")


def _broadcast_shape(*tensors):
    try:
        return tuple(np.broadcast_shapes(*[tuple(t.shape) for t in tensors]))
    except ValueError:
        shapes = " and ".join(str(tuple(t.shape)) for t in tensors)
        raise ShapeError(f"shapes {shapes} do not broadcast together (NumPy rules: trailing "
                         "dimensions must be equal or 1)") from None


# --- math building blocks --------------------------------------------------------------------

@triton.jit
def _expm1(x, NT: tl.constexpr):
    """exp(x) - 1 without cancellation: Taylor series for |x| < 1/2."""
    p = tl.zeros_like(x) + 1.0
    for k in tl.static_range(NT, 1, -1):
        p = 1.0 + p * x * (1.0 / k)
    return tl.where(tl.abs(x) < 0.5, x * p, tl.exp(x) - 1.0)


@triton.jit
def _log1p(e, NT: tl.constexpr):
    """log(1 + e) without cancellation: for |e| < 1/4 the series
    2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), s = e / (2 + e)."""
    s = e / (2.0 + e)
    s2 = s * s
    p = tl.zeros_like(e) + 2.0 / (2 * NT + 1)
    for k in tl.static_range(NT - 1, -1, -1):
        p = 2.0 / (2 * k + 1) + s2 * p
    return tl.where(tl.abs(e) < 0.25, s * p, tl.log(1.0 + e))


@triton.jit
def _tanh(x, NT: tl.constexpr):
    """tanh(x) = -expm1(-2|x|) / (2 + expm1(-2|x|)) * sign(x): no overflow
    for large |x| (it tends to ±1), accurate near 0."""
    em = _expm1(-2.0 * tl.abs(x), NT)
    t = -em / (2.0 + em)
    return tl.where(x < 0, -t, t)


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)): exp overflows to inf for x << 0, giving 0, never NaN."""
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _pow(a, b):
    """a ** b with C/NumPy semantics (torch's too): negative bases (-0 included:
    (-0) ** -1 = -inf) with integer exponents (the infinities count as even),
    (-inf) ** y = inf ** y and (-0) ** y = 0 ** y for other y, x ** 0 == 1 and
    1 ** y == 1 (for NaN x and y too), (-1) ** +-inf == 1."""
    r = tl.exp(b * tl.log(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    neg = tl.where(b_int | (a == -float("inf")) | (a == 0), tl.where(b_odd, -r, r), float("nan"))
    r = tl.where((a < 0) | ((a == 0) & (1.0 / a < 0)), neg, r)
    b_inf = (b == float("inf")) | (b == -float("inf"))
    return tl.where((b == 0) | (a == 1) | ((a == -1) & b_inf), 1.0, r)


#: Chebyshev coefficients c_0..c_27 of f(u) = log(erfc(z) / t) + z^2 on u in
#: [-1, 1], t = 2 / (2 + z) = (u + 1) / 2, z >= 0 (Numerical Recipes' erfccheb),
#: computed with mpmath at 40 digits; the series' tail after c_27 is < 1e-16
#: (float64 takes all 28, float32 the first 15: tail < 1e-9)
_ERFC_CHEB = tl.constexpr((
    -0.6513268598908547, 0.6419697923564902, 0.019476473204185836, -0.009561514786808632,
    -0.0009465953444820369, 0.00036683949785276145, 4.252332480690777e-05, -2.0278578112534242e-05,
    -1.6242900046470256e-06, 1.3036558355805232e-06, 1.5626441722066142e-08, -8.523809591492654e-08,
    6.5290544390988515e-09, 5.059343495551469e-09, -9.91364156493033e-10, -2.273651222931836e-10,
    9.646791102015527e-11, 2.3940380830391146e-12, -6.886027526497553e-12, 8.944879273090725e-13,
    3.130921399342958e-13, -1.1270822361367252e-13, 3.810905255189232e-16, 7.106097613609237e-15,
    -1.5230282014571043e-15, -9.457494571291233e-17, 1.210237189224279e-16, -2.816663087747177e-17))


@triton.jit
def _erfc_nonneg(z, NC: tl.constexpr):
    """erfc(z) for z >= 0 (NaN for NaN) with full relative accuracy, also where
    it is tiny (1 - erf(z) would cancel): t exp(f(u) - z^2), f the Chebyshev
    series _ERFC_CHEB (its first NC terms) summed by Clenshaw's recurrence."""
    t = 2.0 / (2.0 + z)
    u = 2.0 * t - 1.0
    b1 = tl.zeros_like(z)
    b2 = tl.zeros_like(z)
    for k in tl.static_range(NC - 1, 0, -1):
        b1, b2 = _ERFC_CHEB[k] + 2.0 * u * b1 - b2, b1
    return t * tl.exp(_ERFC_CHEB[0] + u * b1 - b2 - z * z)


@triton.jit
def _normal_cdf(x, NC: tl.constexpr):
    """Phi(x) = 0.5 erfc(-x / sqrt(2)), the standard normal CDF: 0.5 erfc(|x| / sqrt(2))
    for x < 0 (accurate where tiny), 1 minus that for x >= 0."""
    half_c = 0.5 * _erfc_nonneg(tl.abs(x) * 0.7071067811865476, NC)
    return tl.where(x < 0, half_c, 1.0 - half_c)


@triton.jit
def _unary_fwd(x, p0, OP: tl.constexpr, NT_E: tl.constexpr, NT_L: tl.constexpr, NT_C: tl.constexpr):
    if OP == 0:      # neg
        y = -x
    elif OP == 1:    # exp
        y = tl.exp(x)
    elif OP == 2:    # log
        y = tl.log(x)
    elif OP == 3:    # sqrt
        y = tl.sqrt(x)
    elif OP == 4:    # abs
        y = tl.where(x < 0, -x, x)
    elif OP == 5:    # tanh
        y = _tanh(x, NT_E)
    elif OP == 6:    # sigmoid
        y = _sigmoid(x)
    elif OP == 7:    # relu (NaN stays NaN)
        y = tl.where(x < 0, 0, x)
    elif OP == 8:    # gelu, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = x * _sigmoid(2.0 * u)
    elif OP == 9:    # swish
        y = x * _sigmoid(x)
    elif OP == 10:   # softplus = max(x, 0) + log1p(exp(-|x|))
        y = common.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)), NT_L)
    elif OP == 11:   # leakyrelu (NaN takes the x * p0 branch: NaN)
        y = tl.where(x > 0, x, x * p0)
    elif OP == 12:   # elu (NaN takes the expm1 branch: NaN)
        y = tl.where(x > 0, x, p0 * _expm1(x, NT_E))
    elif OP == 14:   # gelu_erf: x Phi(x)
        y = x * _normal_cdf(x, NT_C)
    else:            # cast: the conversion happens in the store
        y = x
    return y


@triton.jit
def _unary_kernel(x, out, n, p0,
                  D1, D2, D3, D4, D5, XS0, XS1, XS2, XS3, XS4, XS5,
                  OP: tl.constexpr, CT: tl.constexpr, NT_E: tl.constexpr, NT_L: tl.constexpr,
                  NT_C: tl.constexpr,
                  XD: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if XD:  # dense, not broadcast: the offset is the linear index
        xo = lin
    else:
        xo = common.nd_offset(lin, D1, D2, D3, D4, D5, XS0, XS1, XS2, XS3, XS4, XS5)
    v = tl.load(x + xo, mask=mask, other=1).to(CT)
    y = _unary_fwd(v, p0, OP, NT_E, NT_L, NT_C)
    tl.store(out + lin, store_value(y, out.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _unary_bwd_kernel(g, x, y, out, n, p0,
                      D1, D2, D3, D4, D5,
                      GS0, GS1, GS2, GS3, GS4, GS5,
                      XS0, XS1, XS2, XS3, XS4, XS5,
                      YS0, YS1, YS2, YS3, YS4, YS5,
                      OP: tl.constexpr, CT: tl.constexpr, NT_E: tl.constexpr, NT_C: tl.constexpr,
                      USE_Y: tl.constexpr, GD: tl.constexpr, XD: tl.constexpr,
                      YD: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """out = g * f'(x). exp and sqrt use y = f(x) (g y, g / 2y: no accuracy
    lost); tanh and sigmoid recompute from x, since 1 - y^2 and 1 - y cancel
    where y is near 1 and would amplify the rounding of y."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if GD:  # dense, not broadcast: the offset is the linear index
        go = lin
    else:
        go = common.nd_offset(lin, D1, D2, D3, D4, D5, GS0, GS1, GS2, GS3, GS4, GS5)
    if XD:  # dense, not broadcast: the offset is the linear index
        xo = lin
    else:
        xo = common.nd_offset(lin, D1, D2, D3, D4, D5, XS0, XS1, XS2, XS3, XS4, XS5)
    gv = tl.load(g + go, mask=mask, other=0).to(CT)
    xv = tl.load(x + xo, mask=mask, other=1).to(CT)
    if USE_Y:
        if YD:  # dense, not broadcast: the offset is the linear index
            yo = lin
        else:
            yo = common.nd_offset(lin, D1, D2, D3, D4, D5, YS0, YS1, YS2, YS3, YS4, YS5)
        yv = tl.load(y + yo, mask=mask, other=1).to(CT)
    else:
        yv = xv
    if OP == 0:      # neg: -g
        r = -gv
    elif OP == 1:    # exp: g y
        r = gv * yv
    elif OP == 2:    # log: g / x
        r = gv / xv
    elif OP == 3:    # sqrt: g / (2 y)
        r = gv / (2.0 * yv)
    elif OP == 4:    # abs: g sign(x), sign(0) = 0
        r = tl.where(xv > 0, gv, tl.where(xv < 0, -gv, 0.0))
    elif OP == 5:    # tanh: g (1 - y^2) = g 4 e / (1 + e)^2, e = exp(-2|x|) (no cancellation)
        e = tl.exp(-2.0 * tl.abs(xv))
        r = gv * (4.0 * e / ((1.0 + e) * (1.0 + e)))
    elif OP == 6:    # sigmoid: g y (1 - y) = g e / (1 + e)^2, e = exp(-|x|) (no cancellation)
        e = tl.exp(-tl.abs(xv))
        r = gv * (e / ((1.0 + e) * (1.0 + e)))
    elif OP == 7:    # relu: g [not x <= 0]   (relu'(0) = 0; at NaN g, as torch)
        r = tl.where(xv <= 0, 0.0, gv)
    elif OP == 8:    # gelu: s + 2 x s (1 - s) u',  s = sigmoid(2u)
        u = 0.7978845608028654 * (xv + 0.044715 * xv * xv * xv)
        s = _sigmoid(2.0 * u)
        ss = s * _sigmoid(-2.0 * u)  # s (1 - s) without cancellation
        du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * xv * xv)
        inf_x = (xv == float("inf")) | (xv == -float("inf"))   # inf * 0 = NaN there, as torch
        d = s + tl.where((ss > 0) | inf_x, 2.0 * xv * ss * du, 0.0)
        r = gv * d
    elif OP == 9:    # swish: s (1 + x (1 - s)),  s = sigmoid(x)
        s = _sigmoid(xv)
        r = gv * (s * (1.0 + xv * _sigmoid(-xv)))  # 1 - s = sigmoid(-x)
    elif OP == 10:   # softplus: g sigmoid(x)
        r = gv * _sigmoid(xv)
    elif OP == 11:   # leakyrelu: g [x > 0] + g slope [not x > 0]   (at NaN g slope, as torch)
        r = tl.where(xv > 0, gv, gv * p0)
    elif OP == 14:   # gelu_erf: g (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
        r = gv * (_normal_cdf(xv, NT_C) + xv * tl.exp(-0.5 * xv * xv) * 0.3989422804014327)
    else:            # elu: g [x > 0] + g alpha exp(x) [not x > 0]   (NaN at NaN)
        r = tl.where(xv > 0, gv, gv * p0 * tl.exp(xv))
    tl.store(out + lin, store_value(r, out.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _binary_fwd(a, b, OP: tl.constexpr):
    if OP == 0:
        y = a + b
    elif OP == 1:
        y = a - b
    elif OP == 2:
        y = a * b
    elif OP == 3:
        y = a / b
    elif OP == 4:
        y = _pow(a, b)
    elif OP == 5:    # maximum, NaN-propagating
        y = common.maximum(a, b)
    elif OP == 6:    # minimum, NaN-propagating
        y = common.minimum(a, b)
    elif OP == 7:
        y = a == b
    elif OP == 8:
        y = a != b
    elif OP == 9:
        y = a < b
    elif OP == 10:
        y = a <= b
    elif OP == 11:
        y = a > b
    else:
        y = a >= b
    return y


@triton.jit
def _binary_kernel(a, b, c, out, n,
                   D1, D2, D3, D4, D5,
                   AS0, AS1, AS2, AS3, AS4, AS5,
                   BS0, BS1, BS2, BS3, BS4, BS5,
                   CS0, CS1, CS2, CS3, CS4, CS5,
                   OP: tl.constexpr, CT: tl.constexpr, PT: tl.constexpr,
                   AD: tl.constexpr, BD: tl.constexpr,
                   CD: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """out = f(a, b); for OP == where: out = c ? a : b."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if AD:  # dense, not broadcast: the offset is the linear index
        ao = lin
    else:
        ao = common.nd_offset(lin, D1, D2, D3, D4, D5, AS0, AS1, AS2, AS3, AS4, AS5)
    if BD:  # dense, not broadcast: the offset is the linear index
        bo = lin
    else:
        bo = common.nd_offset(lin, D1, D2, D3, D4, D5, BS0, BS1, BS2, BS3, BS4, BS5)
    av = tl.load(a + ao, mask=mask, other=1).to(CT)
    bv = tl.load(b + bo, mask=mask, other=1).to(CT)
    if OP == 13:
        if CD:  # dense, not broadcast: the offset is the linear index
            co = lin
        else:
            co = common.nd_offset(lin, D1, D2, D3, D4, D5, CS0, CS1, CS2, CS3, CS4, CS5)
        cv = tl.load(c + co, mask=mask, other=0)
        y = tl.where(cv != 0, av, bv)
    elif OP == 4:    # pow in PT (float64 for float32 inputs: exp(b log a) loses |b log a| ulps)
        y = _pow(av.to(PT), bv.to(PT))
    else:
        y = _binary_fwd(av, bv, OP)
    tl.store(out + lin, store_value(y, out.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _binary_bwd_kernel(g, a, b, ga, gb, n,
                       D1, D2, D3, D4, D5,
                       GS0, GS1, GS2, GS3, GS4, GS5,
                       AS0, AS1, AS2, AS3, AS4, AS5,
                       BS0, BS1, BS2, BS3, BS4, BS5,
                       OP: tl.constexpr, CT: tl.constexpr, PT: tl.constexpr,
                       GD: tl.constexpr, AD: tl.constexpr, BD: tl.constexpr,
                       INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """(ga, gb) = g * (df/da, df/db), at the broadcast shape. For OP == where,
    ``a`` is the condition and (ga, gb) are the gradients of the two branches."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if GD:  # dense, not broadcast: the offset is the linear index
        go = lin
    else:
        go = common.nd_offset(lin, D1, D2, D3, D4, D5, GS0, GS1, GS2, GS3, GS4, GS5)
    if AD:  # dense, not broadcast: the offset is the linear index
        ao = lin
    else:
        ao = common.nd_offset(lin, D1, D2, D3, D4, D5, AS0, AS1, AS2, AS3, AS4, AS5)
    gv = tl.load(g + go, mask=mask, other=0).to(CT)
    if OP == 13:     # where
        cv = tl.load(a + ao, mask=mask, other=0)
        da = tl.where(cv != 0, gv, 0.0)
        db = tl.where(cv != 0, 0.0, gv)
    else:
        if BD:  # dense, not broadcast: the offset is the linear index
            bo = lin
        else:
            bo = common.nd_offset(lin, D1, D2, D3, D4, D5, BS0, BS1, BS2, BS3, BS4, BS5)
        av = tl.load(a + ao, mask=mask, other=1).to(CT)
        bv = tl.load(b + bo, mask=mask, other=1).to(CT)
        if OP == 2:      # mul
            da = gv * bv
            db = gv * av
        elif OP == 3:    # div: g / b, -g a / b^2
            da = gv / bv
            db = -gv * av / (bv * bv)
        elif OP == 4:    # pow: g b a^(b-1) (0 where b == 0), g y log(a) (0 where a == 0, b >= 0)
            ap = av.to(PT)
            bp = bv.to(PT)
            gp = gv.to(PT)
            # y = a^b recomputed in PT: the stored output may have overflowed its
            # 16-bit dtype (a^b > 65504) where g y log(a) has not
            yv = _pow(ap, bp)
            da = tl.where(bp == 0, 0.0, gp * bp * _pow(ap, bp - 1.0))
            db = tl.where((ap == 0) & (bp >= 0), 0.0, gp * yv * tl.log(ap))
        elif OP == 5:    # maximum: ties split the gradient half/half (torch)
            da = tl.where(av == bv, gv * 0.5, tl.where(av < bv, 0.0, gv))
            db = tl.where(av == bv, gv * 0.5, tl.where(av > bv, 0.0, gv))
        else:            # minimum
            da = tl.where(av == bv, gv * 0.5, tl.where(av > bv, 0.0, gv))
            db = tl.where(av == bv, gv * 0.5, tl.where(av < bv, 0.0, gv))
    tl.store(ga + lin, store_value(da, ga.dtype.element_ty, INTERP), mask=mask)
    tl.store(gb + lin, store_value(db, gb.dtype.element_ty, INTERP), mask=mask)


# --- launchers ----------------------------------------------------------------------------------

def _strides(tensors, shape):
    """Merged shape and per-tensor strides for reading ``tensors`` (broadcast)
    at ``shape``; dense row-major outputs index by the linear position."""
    sets = [common.broadcast_strides(t, shape) for t in tensors]
    return common.merge_dims(shape, *sets)


def _launch_unary(x, op, out_dtype, p0=0.0):
    _check_unary_dtype(x, op)
    out = common.empty(x.shape, out_dtype, x.device)
    n = out.numel()
    if n == 0:
        return out
    mshape, (xs,) = _strides([x], tuple(x.shape))
    block = common.block_for(n)
    nt_e, nt_l, nt_c = _nterms(x.dtype)
    common.launch(_unary_kernel, (common.cdiv(n, block),), x, out, n, float(p0),
                  *mshape[1:], *xs, OP=op, CT=_ct(x.dtype), NT_E=nt_e, NT_L=nt_l, NT_C=nt_c,
                  XD=_dense(mshape, xs), INTERP=common.INTERPRET, BLOCK=block)
    return out


def _launch_unary_bwd(grad, x, y, op, p0=0.0):
    if x.dtype not in _FLOATS:
        return None
    out = common.empty(x.shape, x.dtype, x.device)
    n = out.numel()
    if n == 0:
        return out
    shape = tuple(x.shape)
    use_y = y is not None
    mshape, (gs, xs, ys) = _strides([grad, x, y if use_y else x], shape)
    block = common.block_for(n)
    nt_e, _, nt_c = _nterms(x.dtype)
    common.launch(_unary_bwd_kernel, (common.cdiv(n, block),), grad, x, y if use_y else x,
                  out, n, float(p0), *mshape[1:], *gs, *xs, *ys, OP=op, CT=_ct(x.dtype),
                  NT_E=nt_e, NT_C=nt_c, USE_Y=use_y, GD=_dense(mshape, gs), XD=_dense(mshape, xs),
                  YD=_dense(mshape, ys), INTERP=common.INTERPRET, BLOCK=block)
    return out


def _pow_type(dtype):
    return tl.float64 if dtype in (torch.float32, torch.float64) else tl.float32


def _launch_binary(a, b, op, cond=None):
    if op == B_WHERE:
        _check_binary_dtypes(a, b, op)
        shape = _broadcast_shape(cond, a, b)
        tensors = [a, b, cond]
    else:
        _check_binary_dtypes(a, b, op)
        shape = _broadcast_shape(a, b)
        tensors = [a, b, a]
    out_dtype = torch.bool if B_EQ <= op <= B_GE else a.dtype
    out = common.empty(shape, out_dtype, a.device)
    n = out.numel()
    if n == 0:
        return out
    mshape, (as_, bs, cs) = _strides(tensors, shape)
    block = common.block_for(n)
    common.launch(_binary_kernel, (common.cdiv(n, block),), tensors[0], tensors[1], tensors[2],
                  out, n, *mshape[1:], *as_, *bs, *cs, OP=op, CT=_ct(a.dtype),
                  PT=_pow_type(a.dtype), AD=_dense(mshape, as_),
                  BD=_dense(mshape, bs), CD=_dense(mshape, cs), INTERP=common.INTERPRET,
                  BLOCK=block)
    return out


def _grads_at(shape, dtype, in_shapes, device):
    """Buffers for the broadcast-shape gradients: in the input dtype when no
    reduction follows, else in float32 (float64) for an accurate unbroadcast."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    return [common.empty(shape, dtype if tuple(s) == tuple(shape) else acc, device)
            for s in in_shapes]


def _binary_bwd(grad, x0, x1, op, in_shapes, dtype):
    shape = tuple(grad.shape)
    ga, gb = _grads_at(shape, dtype, in_shapes, grad.device)
    n = common.numel(shape)
    if n:
        mshape, (gs, as_, bs) = _strides([grad, x0, x1], shape)
        block = common.block_for(n)
        common.launch(_binary_bwd_kernel, (common.cdiv(n, block),), grad, x0, x1, ga, gb, n,
                      *mshape[1:], *gs, *as_, *bs, OP=op, CT=_ct(dtype),
                      PT=_pow_type(dtype), GD=_dense(mshape, gs), AD=_dense(mshape, as_),
                      BD=_dense(mshape, bs), INTERP=common.INTERPRET, BLOCK=block)
    return unbroadcast(ga, in_shapes[0], dtype), unbroadcast(gb, in_shapes[1], dtype)


def _full_grad(grad, a, b):
    """``grad`` at the broadcast shape of the forward (it has that shape)."""
    shape = _broadcast_shape(a, b)
    if tuple(grad.shape) != shape:
        raise ShapeError(f"gradient of shape {tuple(grad.shape)} does not match the output "
                         f"shape {shape}")
    return grad


# --- unary: forward and backward -------------------------------------------------------------

def neg_forward(x):
    """-x"""
    return _launch_unary(x, U_NEG, x.dtype)


def neg_backward(grad, out, x):
    """dx = -g"""
    return (_launch_unary_bwd(grad, x, None, U_NEG),)


def exp_forward(x):
    """exp(x)"""
    return _launch_unary(x, U_EXP, x.dtype)


def exp_backward(grad, out, x):
    """dx = g exp(x) = g y"""
    if out is None:
        out = exp_forward(x)
    return (_launch_unary_bwd(grad, x, out, U_EXP),)


def log_forward(x):
    """log(x)"""
    return _launch_unary(x, U_LOG, x.dtype)


def log_backward(grad, out, x):
    """dx = g / x"""
    return (_launch_unary_bwd(grad, x, None, U_LOG),)


def sqrt_forward(x):
    """sqrt(x)"""
    return _launch_unary(x, U_SQRT, x.dtype)


def sqrt_backward(grad, out, x):
    """dx = g / (2 sqrt(x)) = g / (2 y)"""
    if out is None:
        out = sqrt_forward(x)
    return (_launch_unary_bwd(grad, x, out, U_SQRT),)


def abs_forward(x):
    """|x|"""
    return _launch_unary(x, U_ABS, x.dtype)


def abs_backward(grad, out, x):
    """dx = g sign(x), with sign(0) = 0"""
    return (_launch_unary_bwd(grad, x, None, U_ABS),)


def tanh_forward(x):
    """tanh(x)"""
    return _launch_unary(x, U_TANH, x.dtype)


def tanh_backward(grad, out, x):
    """dx = g (1 - y^2) = g 4 e / (1 + e)^2, e = exp(-2|x|)"""
    return (_launch_unary_bwd(grad, x, None, U_TANH),)


def sigmoid_forward(x):
    """1 / (1 + exp(-x))"""
    return _launch_unary(x, U_SIGMOID, x.dtype)


def sigmoid_backward(grad, out, x):
    """dx = g y (1 - y) = g e / (1 + e)^2, e = exp(-|x|)"""
    return (_launch_unary_bwd(grad, x, None, U_SIGMOID),)


def relu_forward(x):
    """max(x, 0)"""
    return _launch_unary(x, U_RELU, x.dtype)


def relu_backward(grad, out, x):
    """dx = g [x > 0]  (relu'(0) = 0)"""
    return (_launch_unary_bwd(grad, x, None, U_RELU),)


def gelu_forward(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (tanh approximation)"""
    return _launch_unary(x, U_GELU, x.dtype)


def gelu_backward(grad, out, x):
    """dx = g (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))"""
    return (_launch_unary_bwd(grad, x, None, U_GELU),)


def gelu_erf_forward(x):
    """x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))  (the exact GELU)"""
    return _launch_unary(x, U_GELU_ERF, x.dtype)


def gelu_erf_backward(grad, out, x):
    """dx = g (Phi(x) + x phi(x)), phi the standard normal density"""
    return (_launch_unary_bwd(grad, x, None, U_GELU_ERF),)


def swish_forward(x):
    """x sigmoid(x)"""
    return _launch_unary(x, U_SWISH, x.dtype)


def swish_backward(grad, out, x):
    """dx = g (s + x s (1 - s)), s = sigmoid(x)"""
    return (_launch_unary_bwd(grad, x, None, U_SWISH),)


def softplus_forward(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))"""
    return _launch_unary(x, U_SOFTPLUS, x.dtype)


def softplus_backward(grad, out, x):
    """dx = g sigmoid(x)"""
    return (_launch_unary_bwd(grad, x, None, U_SOFTPLUS),)


def leakyrelu_forward(x, negative_slope=0.01):
    """x if x > 0 else negative_slope x"""
    return _launch_unary(x, U_LEAKYRELU, x.dtype, negative_slope)


def leakyrelu_backward(grad, out, x, negative_slope=0.01):
    """dx = g if x > 0 else negative_slope g"""
    return (_launch_unary_bwd(grad, x, None, U_LEAKYRELU, negative_slope),)


def elu_forward(x, alpha=1.0):
    """x if x > 0 else alpha (exp(x) - 1)"""
    return _launch_unary(x, U_ELU, x.dtype, alpha)


def elu_backward(grad, out, x, alpha=1.0):
    """dx = g if x > 0 else g alpha exp(x)"""
    return (_launch_unary_bwd(grad, x, None, U_ELU, alpha),)


def cast_forward(x, dtype):
    """x converted to ``dtype`` (a NumPy dtype): floats round to nearest,
    floats to integers truncate toward zero, anything to bool is ``x != 0``."""
    return _launch_unary(x, U_CAST, to_torch(dtype))


def cast_backward(grad, out, x, dtype):
    """dx = g converted back to x's dtype (no gradient for integer/bool x or
    an integer/bool output)."""
    if x.dtype not in _FLOATS or grad.dtype not in _FLOATS:
        return (None,)
    return (_launch_unary(grad, U_CAST, x.dtype),)


# --- binary: forward and backward -------------------------------------------------------------

def add_forward(a, b):
    """a + b (broadcasting)"""
    return _launch_binary(a, b, B_ADD)


def add_backward(grad, out, a, b):
    """da = unbroadcast(g), db = unbroadcast(g)"""
    if a.dtype not in _FLOATS:
        return None, None
    return unbroadcast(grad, a.shape), unbroadcast(grad, b.shape)


def sub_forward(a, b):
    """a - b"""
    return _launch_binary(a, b, B_SUB)


def sub_backward(grad, out, a, b):
    """da = unbroadcast(g), db = -unbroadcast(g)"""
    if a.dtype not in _FLOATS:
        return None, None
    return unbroadcast(grad, a.shape), _launch_unary(unbroadcast(grad, b.shape), U_NEG, b.dtype)


def mul_forward(a, b):
    """a * b"""
    return _launch_binary(a, b, B_MUL)


def mul_backward(grad, out, a, b):
    """da = unbroadcast(g b), db = unbroadcast(g a)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, B_MUL, (a.shape, b.shape), a.dtype)


def div_forward(a, b):
    """a / b"""
    return _launch_binary(a, b, B_DIV)


def div_backward(grad, out, a, b):
    """da = unbroadcast(g / b), db = unbroadcast(-g a / b^2)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, B_DIV, (a.shape, b.shape), a.dtype)


def pow_forward(a, b):
    """a ** b (both tensors)"""
    return _launch_binary(a, b, B_POW)


def pow_backward(grad, out, a, b):
    """da = unbroadcast(g b a^(b-1)) (0 where b == 0),
    db = unbroadcast(g y log(a)) (0 where a == 0 and b >= 0), as torch; y = a^b is
    recomputed in float32 (float64), not read from ``out``, which may have overflowed"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, B_POW, (a.shape, b.shape), a.dtype)


def maximum_forward(a, b):
    """elementwise max(a, b), NaN-propagating"""
    return _launch_binary(a, b, B_MAX)


def maximum_backward(grad, out, a, b):
    """g goes to the larger input; on ties each gets g / 2 (torch)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, B_MAX, (a.shape, b.shape), a.dtype)


def minimum_forward(a, b):
    """elementwise min(a, b), NaN-propagating"""
    return _launch_binary(a, b, B_MIN)


def minimum_backward(grad, out, a, b):
    """g goes to the smaller input; on ties each gets g / 2 (torch)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, B_MIN, (a.shape, b.shape), a.dtype)


def eq_forward(a, b):
    """a == b (bool)"""
    return _launch_binary(a, b, B_EQ)


def ne_forward(a, b):
    """a != b (bool)"""
    return _launch_binary(a, b, B_NE)


def lt_forward(a, b):
    """a < b (bool)"""
    return _launch_binary(a, b, B_LT)


def le_forward(a, b):
    """a <= b (bool)"""
    return _launch_binary(a, b, B_LE)


def gt_forward(a, b):
    """a > b (bool)"""
    return _launch_binary(a, b, B_GT)


def ge_forward(a, b):
    """a >= b (bool)"""
    return _launch_binary(a, b, B_GE)


def where_forward(cond, a, b):
    """cond ? a : b (broadcasting all three)"""
    return _launch_binary(a, b, B_WHERE, cond=cond)


def where_backward(grad, out, cond, a, b):
    """dcond: none; da = unbroadcast(g [cond]); db = unbroadcast(g [not cond])"""
    if a.dtype not in _FLOATS:
        return None, None, None
    shape = _broadcast_shape(cond, a, b)
    if tuple(grad.shape) != shape:
        raise ShapeError(f"gradient of shape {tuple(grad.shape)} does not match the output "
                         f"shape {shape}")
    ga, gb = _binary_bwd(grad, cond, cond, B_WHERE, (a.shape, b.shape), a.dtype)
    return None, ga, gb
