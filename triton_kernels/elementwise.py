"""Elementwise primitives in Triton: unary, binary (NumPy broadcasting),
``where``; forward and backward. Mirrors ``triflux.reference.elementwise``.

Design: four generic strided kernels, the operation chosen by a
``tl.constexpr`` operation code (``OP_NEG``, ``OP_ADD``, ...), so each
(operation, dtype) pair compiles once:

* ``_unary_kernel``       y = f(x)
* ``_unary_bwd_kernel``   dx = g * f'(x, y)         (fused: one pass)
* ``_binary_kernel``      y = f(a, b), also ``where(c, a, b)``
* ``_binary_bwd_kernel``  (da, db) at the broadcast shape, then
                          :func:`reduce.unbroadcast` sums them to each
                          input's shape

Inputs may be any strided views and broadcast (stride 0); the index math is
:func:`indexing.nd_offset` over at most six merged dimensions, skipped (its
``DENSE`` flag, one per input) for inputs that are dense and not broadcast,
which read at the linear index. Outputs are new dense tensors. Floating inputs
are loaded and at once converted to float32 (float64 stays float64); integers
and booleans compute in their own integer type (booleans as int32, stored
back as ``!= 0``).

Only ``tl.exp``, ``tl.log``, ``tl.sqrt`` and ``tl.floor`` are used from the
math library (no libdevice), so the kernels run unchanged on NVIDIA, AMD and
in the interpreter; ``expm1``, ``log1p`` and ``tanh`` come from
:mod:`numerics`, ``erfc`` is a Chebyshev series here.

NaN: minima and maxima go through ``numerics.maximum``/``minimum`` (a GPU's
plain min/max drop NaN), and every branch on a comparison sends NaN where torch
does (``x > 0`` is false for NaN: leakyrelu and elu take their negative branch,
which gives NaN; at NaN relu's gradient is g and leakyrelu's g slope, as
torch's, elu's NaN).
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from triflux.dtypes import to_torch
from triflux.errors import DTypeError, ShapeError

from . import indexing, launch, numerics
from .numerics import store_value
from .reduce import unbroadcast

# --- operation codes -----------------------------------------------------------------------
# The kernels' constexpr OP is one of these; the jit code compares it by name and
# the host looks it up by primitive name in UNARY_OPS / BINARY_OPS.

OP_NEG = tl.constexpr(0)
OP_EXP = tl.constexpr(1)
OP_LOG = tl.constexpr(2)
OP_SQRT = tl.constexpr(3)
OP_ABS = tl.constexpr(4)
OP_TANH = tl.constexpr(5)
OP_SIGMOID = tl.constexpr(6)
OP_RELU = tl.constexpr(7)
OP_GELU = tl.constexpr(8)
OP_GELU_ERF = tl.constexpr(9)
OP_SWISH = tl.constexpr(10)
OP_SOFTPLUS = tl.constexpr(11)
OP_LEAKYRELU = tl.constexpr(12)
OP_ELU = tl.constexpr(13)
OP_CAST = tl.constexpr(14)

OP_ADD = tl.constexpr(15)
OP_SUB = tl.constexpr(16)
OP_MUL = tl.constexpr(17)
OP_DIV = tl.constexpr(18)
OP_POW = tl.constexpr(19)
OP_MAXIMUM = tl.constexpr(20)
OP_MINIMUM = tl.constexpr(21)
OP_EQ = tl.constexpr(22)
OP_NE = tl.constexpr(23)
OP_LT = tl.constexpr(24)
OP_LE = tl.constexpr(25)
OP_GT = tl.constexpr(26)
OP_GE = tl.constexpr(27)
OP_WHERE = tl.constexpr(28)

#: the operation code of each unary primitive
UNARY_OPS = {"neg": OP_NEG, "exp": OP_EXP, "log": OP_LOG, "sqrt": OP_SQRT, "abs": OP_ABS,
             "tanh": OP_TANH, "sigmoid": OP_SIGMOID, "relu": OP_RELU, "gelu": OP_GELU,
             "gelu_erf": OP_GELU_ERF, "swish": OP_SWISH, "softplus": OP_SOFTPLUS,
             "leakyrelu": OP_LEAKYRELU, "elu": OP_ELU, "cast": OP_CAST}
#: the operation code of each binary primitive (``where`` selects between two)
BINARY_OPS = {"add": OP_ADD, "sub": OP_SUB, "mul": OP_MUL, "div": OP_DIV, "pow": OP_POW,
              "maximum": OP_MAXIMUM, "minimum": OP_MINIMUM, "eq": OP_EQ, "ne": OP_NE,
              "lt": OP_LT, "le": OP_LE, "gt": OP_GT, "ge": OP_GE, "where": OP_WHERE}

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: the operations defined for integer and boolean inputs too (``neg`` and ``sub`` not for booleans)
_INTEGER_UNARY = {"neg", "abs", "cast", "relu"}
_INTEGER_BINARY = {"add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                   "where"}
#: the binary operations with boolean results
_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}

# --- constants of the formulas (as in the reference) -----------------------------------------
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_K = tl.constexpr(0.044715)
SQRT_1_2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


def _compute_type(dtype):
    """The Triton type a kernel computes in for inputs of torch ``dtype``."""
    if dtype == torch.float64:
        return tl.float64
    if dtype in _FLOATS:
        return tl.float32
    if dtype == torch.int64:
        return tl.int64
    return tl.int32  # int8/16/32, uint8, bool


def _check_unary_dtype(dtype, name):
    if dtype in _FLOATS:
        return
    if name not in _INTEGER_UNARY or (dtype == torch.bool and name == "neg"):
        raise DTypeError(f"`{name}` is not defined for {dtype} inputs on the GPU path; "
                         "cast to a floating dtype first (e.g. `x.astype(float32)`)")


def _check_binary_dtypes(dtype_a, dtype_b, name):
    if dtype_a != dtype_b:
        raise DTypeError(f"`{name}` got inputs of different dtypes ({dtype_a} and {dtype_b}); "
                         "the ops layer casts them to one dtype before calling the kernel")
    if dtype_a in _FLOATS:
        return
    if name not in _INTEGER_BINARY or (dtype_a == torch.bool and name == "sub"):
        raise DTypeError(f"`{name}` is not defined for {dtype_a} inputs on the GPU path; "
                         "cast to a floating dtype first")


@lru_cache(maxsize=4096)
def _broadcast_shape(*shapes):
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        shapes = " and ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(f"shapes {shapes} do not broadcast together (NumPy rules: trailing "
                         "dimensions must be equal or 1)") from None


# --- math building blocks --------------------------------------------------------------------

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
def _erfc_series(z, TERMS: tl.constexpr):
    t = 2.0 / (2.0 + z)
    u = 2.0 * t - 1.0
    b1 = tl.zeros_like(z)
    b2 = tl.zeros_like(z)
    for k in tl.static_range(TERMS - 1, 0, -1):
        b1, b2 = _ERFC_CHEB[k] + 2.0 * u * b1 - b2, b1
    return t * tl.exp(_ERFC_CHEB[0] + u * b1 - b2 - z * z)


@triton.jit
def _erfc_nonneg(z):
    """erfc(z) for z >= 0 (NaN for NaN) with full relative accuracy, also where
    it is tiny (1 - erf(z) would cancel): t exp(f(u) - z^2), f the Chebyshev
    series _ERFC_CHEB (all 28 terms in float64, 15 in float32) summed by
    Clenshaw's recurrence."""
    if z.dtype == tl.float64:
        return _erfc_series(z, 28)
    else:
        return _erfc_series(z, 15)


@triton.jit
def _normal_cdf(x):
    """Phi(x) = 0.5 erfc(-x / sqrt(2)), the standard normal CDF: 0.5 erfc(|x| / sqrt(2))
    for x < 0 (accurate where tiny), 1 minus that for x >= 0."""
    half_c = 0.5 * _erfc_nonneg(tl.abs(x) * SQRT_1_2)
    return tl.where(x < 0, half_c, 1.0 - half_c)


# --- the operations --------------------------------------------------------------------------

@triton.jit
def _unary(x, param, OP: tl.constexpr):
    """f(x) for the unary operation ``OP``; ``param`` is leakyrelu's slope or elu's alpha."""
    if OP == OP_NEG:
        y = -x
    elif OP == OP_EXP:
        y = tl.exp(x)
    elif OP == OP_LOG:
        y = tl.log(x)
    elif OP == OP_SQRT:
        y = tl.sqrt(x)
    elif OP == OP_ABS:
        y = tl.where(x < 0, -x, x)
    elif OP == OP_TANH:
        y = numerics.tanh(x)
    elif OP == OP_SIGMOID:
        y = numerics.sigmoid(x)
    elif OP == OP_RELU:       # NaN stays NaN
        y = tl.where(x < 0, 0, x)
    elif OP == OP_GELU:       # tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u)
        u = SQRT_2_OVER_PI * (x + GELU_K * x * x * x)
        y = x * numerics.sigmoid(2.0 * u)
    elif OP == OP_SWISH:
        y = x * numerics.sigmoid(x)
    elif OP == OP_SOFTPLUS:   # max(x, 0) + log1p(exp(-|x|))
        y = numerics.maximum(x, 0.0) + numerics.log1p(tl.exp(-tl.abs(x)))
    elif OP == OP_LEAKYRELU:  # NaN takes the x * slope branch: NaN
        y = tl.where(x > 0, x, x * param)
    elif OP == OP_ELU:        # NaN takes the expm1 branch: NaN
        y = tl.where(x > 0, x, param * numerics.expm1(x))
    elif OP == OP_GELU_ERF:   # x Phi(x)
        y = x * _normal_cdf(x)
    else:
        tl.static_assert(OP == OP_CAST, "not a unary operation")
        y = x                 # the conversion happens in the store
    return y


@triton.jit
def _unary_grad(g, x, y, param, OP: tl.constexpr):
    """g f'(x) for the unary operation ``OP``. exp and sqrt use y = f(x) (g y,
    g / 2y: no accuracy lost); tanh and sigmoid recompute from x, since 1 - y^2
    and 1 - y cancel where y is near 1 and would amplify the rounding of y."""
    if OP == OP_NEG:          # -g
        r = -g
    elif OP == OP_EXP:        # g y
        r = g * y
    elif OP == OP_LOG:        # g / x
        r = g / x
    elif OP == OP_SQRT:       # g / (2 y)
        r = g / (2.0 * y)
    elif OP == OP_ABS:        # g sign(x), sign(0) = 0
        r = tl.where(x > 0, g, tl.where(x < 0, -g, 0.0))
    elif OP == OP_TANH:       # g (1 - y^2) = g 4 e / (1 + e)^2, e = exp(-2|x|) (no cancellation)
        e = tl.exp(-2.0 * tl.abs(x))
        r = g * (4.0 * e / ((1.0 + e) * (1.0 + e)))
    elif OP == OP_SIGMOID:    # g y (1 - y) = g e / (1 + e)^2, e = exp(-|x|) (no cancellation)
        e = tl.exp(-tl.abs(x))
        r = g * (e / ((1.0 + e) * (1.0 + e)))
    elif OP == OP_RELU:       # g [not x <= 0]   (relu'(0) = 0; at NaN g, as torch)
        r = tl.where(x <= 0, 0.0, g)
    elif OP == OP_GELU:       # s + 2 x s (1 - s) u',  s = sigmoid(2u)
        u = SQRT_2_OVER_PI * (x + GELU_K * x * x * x)
        s = numerics.sigmoid(2.0 * u)
        ss = s * numerics.sigmoid(-2.0 * u)  # s (1 - s) without cancellation
        du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_K * x * x)
        inf_x = (x == float("inf")) | (x == -float("inf"))   # inf * 0 = NaN there, as torch
        d = s + tl.where((ss > 0) | inf_x, 2.0 * x * ss * du, 0.0)
        r = g * d
    elif OP == OP_SWISH:      # s (1 + x (1 - s)),  s = sigmoid(x)
        s = numerics.sigmoid(x)
        r = g * (s * (1.0 + x * numerics.sigmoid(-x)))  # 1 - s = sigmoid(-x)
    elif OP == OP_SOFTPLUS:   # g sigmoid(x)
        r = g * numerics.sigmoid(x)
    elif OP == OP_LEAKYRELU:  # g [x > 0] + g slope [not x > 0]   (at NaN g slope, as torch)
        r = tl.where(x > 0, g, g * param)
    elif OP == OP_GELU_ERF:   # g (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
        r = g * (_normal_cdf(x) + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI)
    else:                     # g [x > 0] + g alpha exp(x) [not x > 0]   (NaN at NaN)
        tl.static_assert(OP == OP_ELU, "not a unary operation with a kernel gradient")
        r = tl.where(x > 0, g, g * param * tl.exp(x))
    return r


@triton.jit
def _binary(a, b, OP: tl.constexpr):
    """f(a, b) for the arithmetic and comparison operations (``pow`` and
    ``where`` are the kernel's own branches)."""
    if OP == OP_ADD:
        y = a + b
    elif OP == OP_SUB:
        y = a - b
    elif OP == OP_MUL:
        y = a * b
    elif OP == OP_DIV:
        y = a / b
    elif OP == OP_MAXIMUM:    # NaN-propagating
        y = numerics.maximum(a, b)
    elif OP == OP_MINIMUM:    # NaN-propagating
        y = numerics.minimum(a, b)
    elif OP == OP_EQ:
        y = a == b
    elif OP == OP_NE:
        y = a != b
    elif OP == OP_LT:
        y = a < b
    elif OP == OP_LE:
        y = a <= b
    elif OP == OP_GT:
        y = a > b
    else:
        tl.static_assert(OP == OP_GE, "not a binary operation")
        y = a >= b
    return y


# --- the kernels -----------------------------------------------------------------------------

@triton.jit
def _unary_kernel(x_pointer, output_pointer, n_elements, param,
                  size1, size2, size3, size4, size5,
                  x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                  OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, X_DENSE: tl.constexpr,
                  INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output = f(x), f the unary operation ``OP``."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=X_DENSE)
    x = tl.load(x_pointer + x_offset, mask=mask, other=1).to(COMPUTE_TYPE)
    y = _unary(x, param, OP)
    tl.store(output_pointer + index, store_value(y, output_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)


@triton.jit
def _unary_bwd_kernel(grad_pointer, x_pointer, y_pointer, grad_x_pointer, n_elements, param,
                      size1, size2, size3, size4, size5,
                      grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                      x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                      y_stride0, y_stride1, y_stride2, y_stride3, y_stride4, y_stride5,
                      OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, USE_Y: tl.constexpr,
                      GRAD_DENSE: tl.constexpr, X_DENSE: tl.constexpr, Y_DENSE: tl.constexpr,
                      INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """grad_x = g f'(x), from y = f(x) too when ``USE_Y``."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=GRAD_DENSE)
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=X_DENSE)
    g = tl.load(grad_pointer + grad_offset, mask=mask, other=0).to(COMPUTE_TYPE)
    x = tl.load(x_pointer + x_offset, mask=mask, other=1).to(COMPUTE_TYPE)
    if USE_Y:
        y_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, y_stride0, y_stride1,
                                      y_stride2, y_stride3, y_stride4, y_stride5, DENSE=Y_DENSE)
        y = tl.load(y_pointer + y_offset, mask=mask, other=1).to(COMPUTE_TYPE)
    else:
        y = x
    grad_x = _unary_grad(g, x, y, param, OP)
    tl.store(grad_x_pointer + index, store_value(grad_x, grad_x_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)


@triton.jit
def _binary_kernel(a_pointer, b_pointer, condition_pointer, output_pointer, n_elements,
                   size1, size2, size3, size4, size5,
                   a_stride0, a_stride1, a_stride2, a_stride3, a_stride4, a_stride5,
                   b_stride0, b_stride1, b_stride2, b_stride3, b_stride4, b_stride5,
                   condition_stride0, condition_stride1, condition_stride2, condition_stride3,
                   condition_stride4, condition_stride5,
                   OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, POW_TYPE: tl.constexpr,
                   A_DENSE: tl.constexpr, B_DENSE: tl.constexpr, CONDITION_DENSE: tl.constexpr,
                   INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output = f(a, b); for ``OP_WHERE``: output = condition ? a : b."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    a_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, a_stride0, a_stride1,
                                  a_stride2, a_stride3, a_stride4, a_stride5, DENSE=A_DENSE)
    b_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, b_stride0, b_stride1,
                                  b_stride2, b_stride3, b_stride4, b_stride5, DENSE=B_DENSE)
    a = tl.load(a_pointer + a_offset, mask=mask, other=1).to(COMPUTE_TYPE)
    b = tl.load(b_pointer + b_offset, mask=mask, other=1).to(COMPUTE_TYPE)
    if OP == OP_WHERE:
        condition_offset = indexing.nd_offset(
            index, size1, size2, size3, size4, size5, condition_stride0, condition_stride1,
            condition_stride2, condition_stride3, condition_stride4, condition_stride5,
            DENSE=CONDITION_DENSE)
        condition = tl.load(condition_pointer + condition_offset, mask=mask, other=0)
        y = tl.where(condition != 0, a, b)
    elif OP == OP_POW:  # in POW_TYPE (float64 for float32 inputs: exp(b log a) loses |b log a| ulps)
        y = _pow(a.to(POW_TYPE), b.to(POW_TYPE))
    else:
        y = _binary(a, b, OP)
    tl.store(output_pointer + index, store_value(y, output_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)


@triton.jit
def _binary_bwd_kernel(grad_pointer, a_pointer, b_pointer, grad_a_pointer, grad_b_pointer, n_elements,
                       size1, size2, size3, size4, size5,
                       grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                       a_stride0, a_stride1, a_stride2, a_stride3, a_stride4, a_stride5,
                       b_stride0, b_stride1, b_stride2, b_stride3, b_stride4, b_stride5,
                       OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, POW_TYPE: tl.constexpr,
                       GRAD_DENSE: tl.constexpr, A_DENSE: tl.constexpr, B_DENSE: tl.constexpr,
                       INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """(grad_a, grad_b) = g (df/da, df/db), at the broadcast shape. For
    ``OP_WHERE``, ``a`` is the condition and (grad_a, grad_b) are the
    gradients of the two branches."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=GRAD_DENSE)
    a_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, a_stride0, a_stride1,
                                  a_stride2, a_stride3, a_stride4, a_stride5, DENSE=A_DENSE)
    g = tl.load(grad_pointer + grad_offset, mask=mask, other=0).to(COMPUTE_TYPE)
    if OP == OP_WHERE:
        condition = tl.load(a_pointer + a_offset, mask=mask, other=0)
        grad_a = tl.where(condition != 0, g, 0.0)
        grad_b = tl.where(condition != 0, 0.0, g)
    else:
        b_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, b_stride0, b_stride1,
                                      b_stride2, b_stride3, b_stride4, b_stride5, DENSE=B_DENSE)
        a = tl.load(a_pointer + a_offset, mask=mask, other=1).to(COMPUTE_TYPE)
        b = tl.load(b_pointer + b_offset, mask=mask, other=1).to(COMPUTE_TYPE)
        if OP == OP_MUL:
            grad_a = g * b
            grad_b = g * a
        elif OP == OP_DIV:      # g / b, -g a / b^2
            grad_a = g / b
            grad_b = -g * a / (b * b)
        elif OP == OP_POW:      # g b a^(b-1) (0 where b == 0), g y log(a) (0 where a == 0, b >= 0)
            a_pow = a.to(POW_TYPE)
            b_pow = b.to(POW_TYPE)
            g_pow = g.to(POW_TYPE)
            # y = a^b recomputed in POW_TYPE: the stored output may have overflowed
            # its 16-bit dtype (a^b > 65504) where g y log(a) has not
            y = _pow(a_pow, b_pow)
            grad_a = tl.where(b_pow == 0, 0.0, g_pow * b_pow * _pow(a_pow, b_pow - 1.0))
            grad_b = tl.where((a_pow == 0) & (b_pow >= 0), 0.0, g_pow * y * tl.log(a_pow))
        elif OP == OP_MAXIMUM:  # ties split the gradient half/half (torch)
            grad_a = tl.where(a == b, g * 0.5, tl.where(a < b, 0.0, g))
            grad_b = tl.where(a == b, g * 0.5, tl.where(a > b, 0.0, g))
        else:
            tl.static_assert(OP == OP_MINIMUM, "not a binary operation with a kernel gradient")
            grad_a = tl.where(a == b, g * 0.5, tl.where(a > b, 0.0, g))
            grad_b = tl.where(a == b, g * 0.5, tl.where(a < b, 0.0, g))
    tl.store(grad_a_pointer + index, store_value(grad_a, grad_a_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)
    tl.store(grad_b_pointer + index, store_value(grad_b, grad_b_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)


# --- launchers ----------------------------------------------------------------------------------

# Each launcher's host side depends only on its inputs' dtypes and layouts (shape, strides):
# a cached plan holds the output shape, the grid, the size and stride arguments and the constexprs.

class _Plan(NamedTuple):
    shape: tuple        # of the output
    n: int              # elements of the output
    grid: tuple
    args: tuple         # merged sizes and strides (indexing.strided_layout)
    meta: dict          # the constexprs


def _plan(shape, layouts, dense_names, **meta):
    """The plan of a launch over ``shape`` reading ``layouts``: ``meta`` and
    the DENSE flags (named ``dense_names``, one per layout) are its constexprs."""
    n = launch.numel(shape)
    if n == 0:
        return _Plan(shape, 0, (0,), (), {})
    args, dense = indexing.strided_layout(shape, layouts)
    block = launch.block_for(n)
    return _Plan(shape, n, (launch.cdiv(n, block),), args,
                 dict(meta, **dict(zip(dense_names, dense)), INTERPRETER=launch.INTERPRET, BLOCK_SIZE=block))


@lru_cache(maxsize=4096)
def _unary_plan(name, dtype, x_layout):
    _check_unary_dtype(dtype, name)
    shape = tuple(x_layout[0])
    return _plan(shape, (x_layout,), ("X_DENSE",), OP=UNARY_OPS[name].value,
                 COMPUTE_TYPE=_compute_type(dtype))


def _launch_unary(x, name, out_dtype, param=0.0):
    """f(x) for the unary primitive ``name``, in a new tensor of ``out_dtype``."""
    plan = _unary_plan(name, x.dtype, indexing.layout(x))
    out = launch.empty(plan.shape, out_dtype, x.device)
    if plan.n:
        launch.launch(_unary_kernel, plan.grid, x, out, plan.n, float(param), *plan.args, **plan.meta)
    return out


@lru_cache(maxsize=4096)
def _unary_bwd_plan(name, dtype, layouts, use_y):
    return _plan(tuple(layouts[1][0]), layouts, ("GRAD_DENSE", "X_DENSE", "Y_DENSE"),
                 OP=UNARY_OPS[name].value, COMPUTE_TYPE=_compute_type(dtype), USE_Y=use_y)


def _launch_unary_bwd(grad, x, y, name, param=0.0):
    """g f'(x) for the unary primitive ``name`` (``y = f(x)`` or ``None``)."""
    if x.dtype not in _FLOATS:
        return None
    use_y = y is not None
    y = y if use_y else x
    plan = _unary_bwd_plan(name, x.dtype, (indexing.layout(grad), indexing.layout(x), indexing.layout(y)), use_y)
    out = launch.empty(plan.shape, x.dtype, x.device)
    if plan.n:
        launch.launch(_unary_bwd_kernel, plan.grid, grad, x, y, out, plan.n, float(param), *plan.args,
                      **plan.meta)
    return out


def _pow_type(dtype):
    return tl.float64 if dtype in (torch.float32, torch.float64) else tl.float32


@lru_cache(maxsize=4096)
def _binary_plan(name, dtype_a, dtype_b, layouts):
    """``layouts``: of a, b and the condition (``where``) or a again."""
    _check_binary_dtypes(dtype_a, dtype_b, name)
    if name == "where":
        shape = _broadcast_shape(layouts[2][0], layouts[0][0], layouts[1][0])
    else:
        shape = _broadcast_shape(layouts[0][0], layouts[1][0])
    return _plan(shape, layouts, ("A_DENSE", "B_DENSE", "CONDITION_DENSE"), OP=BINARY_OPS[name].value,
                 COMPUTE_TYPE=_compute_type(dtype_a), POW_TYPE=_pow_type(dtype_a))


def _launch_binary(a, b, name, cond=None):
    """f(a, b) for the binary primitive ``name`` (broadcasting), or
    ``where(cond, a, b)``."""
    c = a if cond is None else cond
    plan = _binary_plan(name, a.dtype, b.dtype, (indexing.layout(a), indexing.layout(b), indexing.layout(c)))
    out = launch.empty(plan.shape, torch.bool if name in _COMPARISONS else a.dtype, a.device)
    if plan.n:
        launch.launch(_binary_kernel, plan.grid, a, b, c, out, plan.n, *plan.args, **plan.meta)
    return out


def _grads_at(shape, dtype, in_shapes, device):
    """Buffers for the broadcast-shape gradients: in the input dtype when no
    reduction follows, else in float32 (float64) for an accurate unbroadcast."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    return [launch.empty(shape, dtype if tuple(s) == tuple(shape) else acc, device)
            for s in in_shapes]


def _binary_bwd(grad, x0, x1, name, in_shapes, dtype):
    """The gradients of the binary primitive ``name`` with respect to its two
    inputs (of ``in_shapes``), summed back to those shapes."""
    plan = _binary_bwd_plan(name, dtype, (indexing.layout(grad), indexing.layout(x0), indexing.layout(x1)))
    ga, gb = _grads_at(plan.shape, dtype, in_shapes, grad.device)
    if plan.n:
        launch.launch(_binary_bwd_kernel, plan.grid, grad, x0, x1, ga, gb, plan.n, *plan.args, **plan.meta)
    return unbroadcast(ga, in_shapes[0], dtype), unbroadcast(gb, in_shapes[1], dtype)


@lru_cache(maxsize=4096)
def _binary_bwd_plan(name, dtype, layouts):
    """``layouts``: of the gradient (at the broadcast shape), a and b."""
    return _plan(tuple(layouts[0][0]), layouts, ("GRAD_DENSE", "A_DENSE", "B_DENSE"),
                 OP=BINARY_OPS[name].value, COMPUTE_TYPE=_compute_type(dtype), POW_TYPE=_pow_type(dtype))


def _full_grad(grad, a, b):
    """``grad`` at the broadcast shape of the forward (it has that shape)."""
    shape = _broadcast_shape(a.shape, b.shape)
    if tuple(grad.shape) != shape:
        raise ShapeError(f"gradient of shape {tuple(grad.shape)} does not match the output "
                         f"shape {shape}")
    return grad


# --- unary: forward and backward -------------------------------------------------------------

def neg_forward(x):
    """-x"""
    return _launch_unary(x, "neg", x.dtype)


def neg_backward(grad, out, x):
    """dx = -g"""
    return (_launch_unary_bwd(grad, x, None, "neg"),)


def exp_forward(x):
    """exp(x)"""
    return _launch_unary(x, "exp", x.dtype)


def exp_backward(grad, out, x):
    """dx = g exp(x) = g y"""
    if out is None:
        out = exp_forward(x)
    return (_launch_unary_bwd(grad, x, out, "exp"),)


def log_forward(x):
    """log(x)"""
    return _launch_unary(x, "log", x.dtype)


def log_backward(grad, out, x):
    """dx = g / x"""
    return (_launch_unary_bwd(grad, x, None, "log"),)


def sqrt_forward(x):
    """sqrt(x)"""
    return _launch_unary(x, "sqrt", x.dtype)


def sqrt_backward(grad, out, x):
    """dx = g / (2 sqrt(x)) = g / (2 y)"""
    if out is None:
        out = sqrt_forward(x)
    return (_launch_unary_bwd(grad, x, out, "sqrt"),)


def abs_forward(x):
    """|x|"""
    return _launch_unary(x, "abs", x.dtype)


def abs_backward(grad, out, x):
    """dx = g sign(x), with sign(0) = 0"""
    return (_launch_unary_bwd(grad, x, None, "abs"),)


def tanh_forward(x):
    """tanh(x)"""
    return _launch_unary(x, "tanh", x.dtype)


def tanh_backward(grad, out, x):
    """dx = g (1 - y^2) = g 4 e / (1 + e)^2, e = exp(-2|x|)"""
    return (_launch_unary_bwd(grad, x, None, "tanh"),)


def sigmoid_forward(x):
    """1 / (1 + exp(-x))"""
    return _launch_unary(x, "sigmoid", x.dtype)


def sigmoid_backward(grad, out, x):
    """dx = g y (1 - y) = g e / (1 + e)^2, e = exp(-|x|)"""
    return (_launch_unary_bwd(grad, x, None, "sigmoid"),)


def relu_forward(x):
    """max(x, 0)"""
    return _launch_unary(x, "relu", x.dtype)


def relu_backward(grad, out, x):
    """dx = g [x > 0]  (relu'(0) = 0)"""
    return (_launch_unary_bwd(grad, x, None, "relu"),)


def gelu_forward(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (tanh approximation)"""
    return _launch_unary(x, "gelu", x.dtype)


def gelu_backward(grad, out, x):
    """dx = g (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))"""
    return (_launch_unary_bwd(grad, x, None, "gelu"),)


def gelu_erf_forward(x):
    """x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))  (the exact GELU)"""
    return _launch_unary(x, "gelu_erf", x.dtype)


def gelu_erf_backward(grad, out, x):
    """dx = g (Phi(x) + x phi(x)), phi the standard normal density"""
    return (_launch_unary_bwd(grad, x, None, "gelu_erf"),)


def swish_forward(x):
    """x sigmoid(x)"""
    return _launch_unary(x, "swish", x.dtype)


def swish_backward(grad, out, x):
    """dx = g (s + x s (1 - s)), s = sigmoid(x)"""
    return (_launch_unary_bwd(grad, x, None, "swish"),)


def softplus_forward(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))"""
    return _launch_unary(x, "softplus", x.dtype)


def softplus_backward(grad, out, x):
    """dx = g sigmoid(x)"""
    return (_launch_unary_bwd(grad, x, None, "softplus"),)


def leakyrelu_forward(x, negative_slope=0.01):
    """x if x > 0 else negative_slope x"""
    return _launch_unary(x, "leakyrelu", x.dtype, negative_slope)


def leakyrelu_backward(grad, out, x, negative_slope=0.01):
    """dx = g if x > 0 else negative_slope g"""
    return (_launch_unary_bwd(grad, x, None, "leakyrelu", negative_slope),)


def elu_forward(x, alpha=1.0):
    """x if x > 0 else alpha (exp(x) - 1)"""
    return _launch_unary(x, "elu", x.dtype, alpha)


def elu_backward(grad, out, x, alpha=1.0):
    """dx = g if x > 0 else g alpha exp(x)"""
    return (_launch_unary_bwd(grad, x, None, "elu", alpha),)


def cast_forward(x, dtype):
    """x converted to ``dtype`` (a NumPy dtype): floats round to nearest,
    floats to integers truncate toward zero, anything to bool is ``x != 0``."""
    return _launch_unary(x, "cast", to_torch(dtype))


def cast_backward(grad, out, x, dtype):
    """dx = g converted back to x's dtype (no gradient for integer/bool x or
    an integer/bool output)."""
    if x.dtype not in _FLOATS or grad.dtype not in _FLOATS:
        return (None,)
    return (_launch_unary(grad, "cast", x.dtype),)


# --- binary: forward and backward -------------------------------------------------------------

def add_forward(a, b):
    """a + b (broadcasting)"""
    return _launch_binary(a, b, "add")


def add_backward(grad, out, a, b):
    """da = unbroadcast(g), db = unbroadcast(g)"""
    if a.dtype not in _FLOATS:
        return None, None
    return unbroadcast(grad, a.shape), unbroadcast(grad, b.shape)


def sub_forward(a, b):
    """a - b"""
    return _launch_binary(a, b, "sub")


def sub_backward(grad, out, a, b):
    """da = unbroadcast(g), db = -unbroadcast(g)"""
    if a.dtype not in _FLOATS:
        return None, None
    return unbroadcast(grad, a.shape), _launch_unary(unbroadcast(grad, b.shape), "neg", b.dtype)


def mul_forward(a, b):
    """a * b"""
    return _launch_binary(a, b, "mul")


def mul_backward(grad, out, a, b):
    """da = unbroadcast(g b), db = unbroadcast(g a)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, "mul", (a.shape, b.shape), a.dtype)


def div_forward(a, b):
    """a / b"""
    return _launch_binary(a, b, "div")


def div_backward(grad, out, a, b):
    """da = unbroadcast(g / b), db = unbroadcast(-g a / b^2)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, "div", (a.shape, b.shape), a.dtype)


def pow_forward(a, b):
    """a ** b (both tensors)"""
    return _launch_binary(a, b, "pow")


def pow_backward(grad, out, a, b):
    """da = unbroadcast(g b a^(b-1)) (0 where b == 0),
    db = unbroadcast(g y log(a)) (0 where a == 0 and b >= 0), as torch; y = a^b is
    recomputed in float32 (float64), not read from ``out``, which may have overflowed"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, "pow", (a.shape, b.shape), a.dtype)


def maximum_forward(a, b):
    """elementwise max(a, b), NaN-propagating"""
    return _launch_binary(a, b, "maximum")


def maximum_backward(grad, out, a, b):
    """g goes to the larger input; on ties each gets g / 2 (torch)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, "maximum", (a.shape, b.shape), a.dtype)


def minimum_forward(a, b):
    """elementwise min(a, b), NaN-propagating"""
    return _launch_binary(a, b, "minimum")


def minimum_backward(grad, out, a, b):
    """g goes to the smaller input; on ties each gets g / 2 (torch)"""
    if a.dtype not in _FLOATS:
        return None, None
    return _binary_bwd(_full_grad(grad, a, b), a, b, "minimum", (a.shape, b.shape), a.dtype)


def eq_forward(a, b):
    """a == b (bool)"""
    return _launch_binary(a, b, "eq")


def ne_forward(a, b):
    """a != b (bool)"""
    return _launch_binary(a, b, "ne")


def lt_forward(a, b):
    """a < b (bool)"""
    return _launch_binary(a, b, "lt")


def le_forward(a, b):
    """a <= b (bool)"""
    return _launch_binary(a, b, "le")


def gt_forward(a, b):
    """a > b (bool)"""
    return _launch_binary(a, b, "gt")


def ge_forward(a, b):
    """a >= b (bool)"""
    return _launch_binary(a, b, "ge")


def where_forward(cond, a, b):
    """cond ? a : b (broadcasting all three)"""
    return _launch_binary(a, b, "where", cond=cond)


def where_backward(grad, out, cond, a, b):
    """dcond: none; da = unbroadcast(g [cond]); db = unbroadcast(g [not cond])"""
    if a.dtype not in _FLOATS:
        return None, None, None
    shape = _broadcast_shape(cond.shape, a.shape, b.shape)
    if tuple(grad.shape) != shape:
        raise ShapeError(f"gradient of shape {tuple(grad.shape)} does not match the output "
                         f"shape {shape}")
    ga, gb = _binary_bwd(grad, cond, cond, "where", (a.shape, b.shape), a.dtype)
    return None, ga, gb
