"""How kernels compute: the type they compute in, the rounding of a store,
float64 scalars passed as float32 pairs, NaN-propagating minimum and maximum,
the smooth functions built from ``exp`` and ``log`` alone (sigmoid, tanh,
expm1, log1p), and the one dot product every GEMM-shaped kernel (matmul, conv,
the recurrent layers) uses."""
import functools
import struct

import numpy as np
import torch
import triton
import triton.language as tl

from triflux.matmul_precision import get_matmul_precision

from . import launch


@functools.lru_cache(maxsize=None)
def compute_type(dtype):
    """The Triton type kernels compute in: float64 stays, everything else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


@triton.jit
def store_value(value, OUTPUT_TYPE: tl.constexpr, INTERPRETER: tl.constexpr):
    """``value`` (computed in float32/float64 or an integer type) converted
    for a store into an ``OUTPUT_TYPE`` tensor: booleans as ``value != 0``;
    bfloat16 through float32 with round-to-nearest-even (the interpreter
    truncates float32 to bfloat16 and garbles float64 to bfloat16; GPUs round
    correctly)."""
    if OUTPUT_TYPE == tl.int1:
        value = value != 0
    elif OUTPUT_TYPE == tl.bfloat16:
        value = value.to(tl.float32)
        if INTERPRETER:
            bits = value.to(tl.uint32, bitcast=True)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            value = tl.where(value != value, value, rounded.to(tl.float32, bitcast=True))
    return value.to(OUTPUT_TYPE)


# --- float64 scalars --------------------------------------------------------------------
# Triton passes Python floats as float32. A float64 scalar (a learning rate, a
# dropout scale) travels as two float32 numbers hi + lo whose float64 sum is
# the value to ~1e-15; float32 kernels use hi alone.

_FLOAT32 = struct.Struct("f")


def _to_float32(v):
    """The float32 nearest to the float ``v`` (as a Python float): packed
    through C's float, which rounds as NumPy does; out of float32's range,
    NumPy's answer (inf)."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(v))[0]
    except OverflowError:
        return float(np.float32(v))


def float32_pair(value):
    """``value`` as two float32 numbers ``(hi, lo)`` with ``hi + lo ~ value``."""
    value = float(value)
    hi = _to_float32(value)
    return hi, _to_float32(value - hi)


@triton.jit
def from_float32_pair(hi, lo, COMPUTE_TYPE: tl.constexpr):
    """The scalar ``hi + lo`` (from :func:`float32_pair`) in ``COMPUTE_TYPE``."""
    if COMPUTE_TYPE == tl.float64:
        return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)
    else:
        return tl.cast(hi, tl.float32)


# --- NaN-propagating minimum and maximum ----------------------------------------------
# Plain tl.minimum / tl.maximum / tl.max compile to PTX min.f32 / max.f32, which
# return the other operand when one is NaN (elu(NaN) would be 0 on a GPU), while
# the interpreter runs np.minimum / np.maximum (NaN) and np.nanmax (no NaN): what
# CI sees is not what a GPU does. Kernels take minima and maxima of floats only
# through these three, which give NaN whenever an operand is NaN, as torch and the
# NumPy references do, on every backend (tests/test_compiled_nan.py checks the PTX).

@triton.jit
def maximum(a, b):
    """max(a, b), NaN if a or b is NaN (PTX max.NaN; integers as usual)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum(a, b):
    """min(a, b), NaN if a or b is NaN (PTX min.NaN; integers as usual)."""
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_along(x, axis: tl.constexpr):
    """max of the float32/float64 tensor ``x`` along ``axis``, NaN if any entry
    is NaN (np.max, torch.amax).

    tl.max drops NaN (PTX max.f32; np.nanmax in the interpreter), so the
    maximum is taken over integers ordered as the floats are: the bit pattern
    for x >= +0 and the pattern with the 63 (31) value bits flipped for x <= -0,
    every NaN made the positive quiet NaN first, whose pattern lies above +inf's."""
    if x.dtype == tl.float64:
        bits = tl.where(x != x, float("nan"), x).to(tl.int64, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)
        top = tl.max(key, axis)
        return tl.where(top < 0, top ^ 0x7FFFFFFFFFFFFFFF, top).to(tl.float64, bitcast=True)
    else:
        bits = tl.where(x != x, float("nan"), x).to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        top = tl.max(key, axis)
        return tl.where(top < 0, top ^ 0x7FFFFFFF, top).to(tl.float32, bitcast=True)


# --- smooth functions from exp and log --------------------------------------------------
# Only tl.exp and tl.log (no libdevice), so the kernels run unchanged on NVIDIA,
# AMD and in the interpreter; short series take over where exp(x) - 1 or
# log(1 + x) would cancel. Series lengths suit the type of ``x``: float64 or
# float32 (16-bit values are computed in float32).

@triton.jit
def _expm1_series(x, TERMS: tl.constexpr):
    p = tl.zeros_like(x) + 1.0
    for k in tl.static_range(TERMS, 1, -1):
        p = 1.0 + p * x * (1.0 / k)
    return tl.where(tl.abs(x) < 0.5, x * p, tl.exp(x) - 1.0)


@triton.jit
def expm1(x):
    """exp(x) - 1 without cancellation: Taylor series for |x| < 1/2."""
    if x.dtype == tl.float64:
        return _expm1_series(x, 17)
    else:
        return _expm1_series(x, 9)


@triton.jit
def _log1p_series(e, TERMS: tl.constexpr):
    s = e / (2.0 + e)
    s2 = s * s
    p = tl.zeros_like(e) + 2.0 / (2 * TERMS + 1)
    for k in tl.static_range(TERMS - 1, -1, -1):
        p = 2.0 / (2 * k + 1) + s2 * p
    return tl.where(tl.abs(e) < 0.25, s * p, tl.log(1.0 + e))


@triton.jit
def log1p(e):
    """log(1 + e) without cancellation: for |e| < 1/4 the series
    2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), s = e / (2 + e)."""
    if e.dtype == tl.float64:
        return _log1p_series(e, 11)
    else:
        return _log1p_series(e, 6)


@triton.jit
def tanh(x):
    """tanh(x) = -expm1(-2|x|) / (2 + expm1(-2|x|)) * sign(x): no overflow
    for large |x| (it tends to +-1), accurate near 0."""
    em = expm1(-2.0 * tl.abs(x))
    t = -em / (2.0 + em)
    return tl.where(x < 0, -t, t)


@triton.jit
def sigmoid(x):
    """1 / (1 + exp(-x)): exp overflows to inf for x << 0, giving 0, never NaN."""
    return 1.0 / (1.0 + tl.exp(-x))


# --- activations applied inside a primitive's kernel -----------------------------------------
# (the registry's fusable_activations: their derivative is a function of the output y, so a
# fused primitive's backward reads y; reference/_activation.py has the same math)

ACT_IDENTITY = tl.constexpr(0)
ACT_RELU = tl.constexpr(1)
ACT_SIGMOID = tl.constexpr(2)
ACT_TANH = tl.constexpr(3)

#: activation name (one of the registry's fusable_activations) -> its ACTIVATION code
ACTIVATION_CODES = {"identity": ACT_IDENTITY.value, "relu": ACT_RELU.value, "sigmoid": ACT_SIGMOID.value,
                    "tanh": ACT_TANH.value}


@triton.jit
def activate(z, ACTIVATION: tl.constexpr):
    """act(z) in z's type: identity, relu (NaN stays NaN, as torch.relu), sigmoid, tanh."""
    if ACTIVATION == ACT_RELU:
        z = tl.where(z < 0, 0.0, z)
    elif ACTIVATION == ACT_SIGMOID:
        z = sigmoid(z)
    elif ACTIVATION == ACT_TANH:
        z = tanh(z)
    return z


@triton.jit
def through_activation(g, y, ACTIVATION: tl.constexpr):
    """dL/dz = g * act'(z) from the output y = act(z): identity g; relu
    [not y <= 0] (0 at 0, g at NaN: torch's threshold_backward); sigmoid
    g y (1 - y); tanh g (1 - y^2)."""
    if ACTIVATION == ACT_RELU:
        g = tl.where(y <= 0, 0.0, g)
    elif ACTIVATION == ACT_SIGMOID:
        g = g * (y * (1.0 - y))
    elif ACTIVATION == ACT_TANH:
        g = g * (1.0 - y * y)
    return g


# --- the dot product ----------------------------------------------------------------------
# Kernels that multiply blocks take a constexpr ``DOT`` that says how (one of the
# four kinds below, chosen on the host by ``dot_kind``).

#: 16-bit operands on a GPU: tl.dot in their own type with a float32 accumulator (tensor cores)
DOT_NATIVE = tl.constexpr(0)
#: float32 operands (and 16-bit ones in the interpreter, which has no 16-bit dot):
#: tl.dot in float32 with input_precision="ieee", so no TF32 rounding
DOT_IEEE_FP32 = tl.constexpr(1)
#: float64: products and sums in float64 (tl.dot has no float64 form on GPUs)
DOT_FP64 = tl.constexpr(2)
#: float32 operands under set_matmul_precision("tf32"): tl.dot with
#: input_precision="tf32", tensor cores that drop each operand's low 13 bits, float32 sums
#: (the interpreter ignores input_precision: exact float32 products there)
DOT_TF32 = tl.constexpr(3)


def dot_kind(*dtypes):
    """The ``DOT`` kind for operands of torch dtypes ``dtypes``: float64 if any
    is float64; with a float32 operand IEEE float32, or TF32 when
    ``get_matmul_precision()`` is "tf32" (in the interpreter too, which then
    computes exact float32 products); native 16-bit when all are the same
    16-bit type on a GPU; IEEE float32 for mixed 16-bit types and for 16-bit
    ones in the interpreter."""
    if torch.float64 in dtypes:
        return DOT_FP64.value
    if torch.float32 in dtypes:
        return DOT_TF32.value if get_matmul_precision() == "tf32" else DOT_IEEE_FP32.value
    if launch.INTERPRET or len(set(dtypes)) > 1:
        return DOT_IEEE_FP32.value
    return DOT_NATIVE.value


@triton.jit
def dot(acc, a, b, DOT: tl.constexpr):
    """``acc + a @ b`` for blocks ``a`` (M, K) and ``b`` (K, N), or stacks of
    them (B, M, K) and (B, K, N), computed as ``DOT`` says (float32 ``acc``
    for the native, float32 and TF32 kinds, float64 for DOT_FP64: the products
    a[..., m, k] b[..., k, n] summed over k)."""
    if DOT == DOT_FP64:
        products = tl.expand_dims(a.to(tl.float64), len(a.shape)) * tl.expand_dims(b.to(tl.float64), len(b.shape) - 2)
        acc += tl.sum(products, axis=len(a.shape) - 1)
    elif DOT == DOT_IEEE_FP32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif DOT == DOT_TF32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.float32)
    return acc
