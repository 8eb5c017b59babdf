"""Elementwise primitives, NumPy reference: unary functions, binary
operations with NumPy broadcasting, comparisons and ``where``.

Conventions (``triflux.registry``): ``<name>_forward(*inputs, **attrs)`` and
``<name>_backward(grad, out, *inputs, **attrs)`` returning one gradient per
input, shaped and typed like that input (``None`` for an input without one).

Precision: results have the dtype of the inputs. float16 and bfloat16 are
computed in float32 and rounded once at the end (as torch does on the CPU);
float32 and float64 are computed in their own precision. Integer and boolean
inputs are supported where the operation makes sense for them (``neg``,
``abs``, ``relu``, ``cast``, ``add``, ``sub``, ``mul``, ``maximum``,
``minimum``, comparisons, ``where``) and compute in their own type, as NumPy
does.

The backward of a binary operation computes the gradient at the broadcast
shape and sums it back to each input's shape (``unbroadcast``: the adjoint of
broadcasting).
"""
import math

import numpy as np

from triflux.dtypes import compute_dtype

from ._activation import relu
from ._util import unbroadcast

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715
SQRT_1_2 = math.sqrt(0.5)
SQRT_2PI = math.sqrt(2.0 * math.pi)

#: erfc elementwise, in float64 (NumPy has no erf; Python's math.erfc is correctly rounded to ~1 ulp)
_erfc = np.frompyfunc(math.erfc, 1, 1)

quiet = np.errstate(all="ignore")  # exp(1e4) = inf, log(-1) = nan, ... as on the GPU


def _is_float(a):
    return a.dtype.kind == "f" or a.dtype.kind == "V" and a.dtype.name == "bfloat16"


def _work(x):
    """``x`` in the dtype the math runs in: float32 for float16/bfloat16."""
    x = np.asarray(x)
    return x.astype(compute_dtype(x.dtype), copy=False)


def _done(r, dtype):
    """The result as an array of ``dtype`` (0-d results stay arrays)."""
    return np.asarray(r).astype(dtype, copy=False)


def _sigmoid(x):
    """1 / (1 + exp(-x)); exp(-x) overflows to inf for x << 0, giving 0."""
    return 1.0 / (1.0 + np.exp(-x))


# --- unary ---------------------------------------------------------------------------------

@quiet
def neg_forward(x):
    """y = -x"""
    return _done(np.negative(x), x.dtype)


@quiet
def neg_backward(grad, out, x):
    """dx = -g"""
    if not _is_float(x):
        return (None,)
    return (_done(np.negative(_work(grad)), x.dtype),)


@quiet
def exp_forward(x):
    """y = exp(x)"""
    return _done(np.exp(_work(x)), x.dtype)


@quiet
def exp_backward(grad, out, x):
    """dx = g exp(x) = g y"""
    return (_done(_work(grad) * _work(out), x.dtype),)


@quiet
def log_forward(x):
    """y = log(x)"""
    return _done(np.log(_work(x)), x.dtype)


@quiet
def log_backward(grad, out, x):
    """dx = g / x"""
    return (_done(_work(grad) / _work(x), x.dtype),)


@quiet
def sqrt_forward(x):
    """y = sqrt(x)"""
    return _done(np.sqrt(_work(x)), x.dtype)


@quiet
def sqrt_backward(grad, out, x):
    """dx = g / (2 sqrt(x)) = g / (2 y)"""
    return (_done(_work(grad) / (2.0 * _work(out)), x.dtype),)


@quiet
def abs_forward(x):
    """y = |x|"""
    return _done(np.abs(x), x.dtype)


@quiet
def abs_backward(grad, out, x):
    """dx = g sign(x), taking sign(0) = 0 and sign(NaN) = 0 (torch's choices)"""
    if not _is_float(x):
        return (None,)
    g, xw = _work(grad), _work(x)
    return (_done(np.where(xw > 0, g, np.where(xw < 0, -g, np.zeros_like(g))), x.dtype),)


@quiet
def tanh_forward(x):
    """y = tanh(x)"""
    return _done(np.tanh(_work(x)), x.dtype)


@quiet
def tanh_backward(grad, out, x):
    """dx = g (1 - tanh(x)^2) = g (1 - y^2)"""
    y = _work(out)
    return (_done(_work(grad) * (1.0 - y * y), x.dtype),)


@quiet
def sigmoid_forward(x):
    """y = sigma(x) = 1 / (1 + exp(-x))"""
    return _done(_sigmoid(_work(x)), x.dtype)


@quiet
def sigmoid_backward(grad, out, x):
    """dx = g sigma(x) (1 - sigma(x)) = g y (1 - y)"""
    y = _work(out)
    return (_done(_work(grad) * y * (1.0 - y), x.dtype),)


@quiet
def relu_forward(x):
    """y = max(x, 0)"""
    return _done(relu(x), x.dtype)


@quiet
def relu_backward(grad, out, x):
    """dx = g [x > 0] with relu'(0) = 0, and g where x is NaN (torch zeroes
    only where x <= 0)"""
    if not _is_float(x):
        return (None,)
    g = np.asarray(grad)
    g = g.astype(compute_dtype(g.dtype))             # a new array, in the compute dtype: one copy
    # g's bits ANDed with all ones (keep) or all zeros (+0 exactly): np.where's
    # branch per element on a random mask costs 6-10x as much
    bits = np.dtype(f"i{g.itemsize}")
    keep = np.less_equal(_work(x), 0).astype(bits)
    keep -= 1                                         # x <= 0: 0; else (NaN too): -1, all ones
    np.bitwise_and(g.view(bits), keep, out=g.view(bits))
    return (_done(g, x.dtype),)


@quiet
def gelu_forward(x):
    """y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    (the tanh approximation: NNlib's gelu, torch's gelu(approximate="tanh")).

    Computed as y = x sigma(2u), the same function (0.5 (1 + tanh(u)) =
    sigma(2u)): 1 + tanh(u) cancels for x << 0, sigma(2u) does not."""
    xw = _work(x)
    u = SQRT_2_OVER_PI * (xw + GELU_K * xw ** 3)
    return _done(xw * _sigmoid(2.0 * u), x.dtype)


@quiet
def gelu_backward(grad, out, x):
    """dx = g (0.5 (1 + t) + 0.5 x (1 - t^2) u'),  t = tanh(u),
    u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2);

    computed with s = sigma(2u) = 0.5 (1 + t) and 1 - t^2 = 4 s (1 - s),
    1 - s = sigma(-2u) (no cancellation): dx = g (s + 2 x s sigma(-2u) u').
    At x = +-inf the second term is inf * 0: NaN, as torch's."""
    xw = _work(x)
    u = SQRT_2_OVER_PI * (xw + GELU_K * xw ** 3)
    s = _sigmoid(2.0 * u)
    s_s = s * _sigmoid(-2.0 * u)
    du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_K * xw * xw)
    # where the sigmoid has saturated (s (1 - s) == 0) the second term is 0, even if x^2
    # overflowed, except at x = +-inf (torch: NaN)
    second = np.where((s_s > 0) | np.isinf(xw), 2.0 * xw * s_s * du, 0.0)
    return (_done(_work(grad) * (s + second), x.dtype),)


def _normal_cdf(x):
    """Phi(x) = 0.5 erfc(-x / sqrt(2)), the standard normal CDF; erfc keeps
    its full relative accuracy where Phi is tiny (x << 0), 0.5 (1 + erf) would
    cancel there. Computed in float64, returned in x's dtype."""
    c = np.asarray(_erfc(-np.asarray(x, dtype=np.float64) * SQRT_1_2), dtype=np.float64)
    return (0.5 * c).astype(np.asarray(x).dtype, copy=False)


@quiet
def gelu_erf_forward(x):
    """y = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), the exact GELU (NNlib's
    gelu_erf, torch's gelu(approximate="none")), Phi the standard normal CDF.
    At x = -inf it is -inf * 0 = NaN, as torch's."""
    xw = _work(x)
    return _done(xw * _normal_cdf(xw), x.dtype)


@quiet
def gelu_erf_backward(grad, out, x):
    """dx = g (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi) the
    standard normal density (NaN at x = +-inf: inf * 0, as torch's)."""
    xw = _work(x)
    return (_done(_work(grad) * (_normal_cdf(xw) + xw * np.exp(-0.5 * xw * xw) / SQRT_2PI), x.dtype),)


@quiet
def swish_forward(x):
    """y = x sigma(x)"""
    xw = _work(x)
    return _done(xw * _sigmoid(xw), x.dtype)


@quiet
def swish_backward(grad, out, x):
    """dx = g (s + x s (1 - s)),  s = sigma(x)"""
    xw = _work(x)
    s = _sigmoid(xw)
    return (_done(_work(grad) * (s + xw * s * (1.0 - s)), x.dtype),)


@quiet
def softplus_forward(x):
    """y = log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)) so that
    exp never overflows"""
    xw = _work(x)
    return _done(np.maximum(xw, 0.0) + np.log1p(np.exp(-np.abs(xw))), x.dtype)


@quiet
def softplus_backward(grad, out, x):
    """dx = g sigma(x)"""
    return (_done(_work(grad) * _sigmoid(_work(x)), x.dtype),)


@quiet
def leakyrelu_forward(x, negative_slope=0.01):
    """y = x if x > 0 else negative_slope x"""
    xw = _work(x)
    return _done(np.where(xw > 0, xw, negative_slope * xw), x.dtype)


@quiet
def leakyrelu_backward(grad, out, x, negative_slope=0.01):
    """dx = g if x > 0 else negative_slope g"""
    g = _work(grad)
    return (_done(np.where(_work(x) > 0, g, negative_slope * g), x.dtype),)


@quiet
def elu_forward(x, alpha=1.0):
    """y = x if x > 0 else alpha (exp(x) - 1)"""
    xw = _work(x)
    return _done(np.where(xw > 0, xw, alpha * np.expm1(np.minimum(xw, 0.0))), x.dtype)


@quiet
def elu_backward(grad, out, x, alpha=1.0):
    """dx = g if x > 0 else g alpha exp(x): NaN where x is NaN (torch's CPU
    gives NaN there in its vectorised loop, g in its scalar loop and on CUDA)"""
    xw = _work(x)
    g = _work(grad)
    return (_done(np.where(xw > 0, g, g * alpha * np.exp(np.minimum(xw, 0.0))), x.dtype),)


@quiet
def cast_forward(x, dtype):
    """y = x converted to ``dtype`` (a NumPy dtype): to a float type by
    rounding to nearest, float to integer by truncation toward zero,
    anything to bool as x != 0"""
    return np.asarray(x).astype(dtype)


def cast_backward(grad, out, x, dtype):
    """dx = g converted back to x's dtype (none for integer/bool x or output)"""
    if not _is_float(np.asarray(x)) or not _is_float(np.asarray(grad)):
        return (None,)
    return (np.asarray(grad).astype(x.dtype),)


# --- binary (NumPy broadcasting) -------------------------------------------------------------

@quiet
def add_forward(a, b):
    """y = a + b"""
    return _done(np.add(a, b), a.dtype)


def add_backward(grad, out, a, b):
    """da = unbroadcast(g), db = unbroadcast(g)"""
    if not _is_float(a):
        return None, None
    g = _work(grad)
    return _done(unbroadcast(g, a.shape), a.dtype), _done(unbroadcast(g, b.shape), b.dtype)


@quiet
def sub_forward(a, b):
    """y = a - b"""
    return _done(np.subtract(a, b), a.dtype)


def sub_backward(grad, out, a, b):
    """da = unbroadcast(g), db = -unbroadcast(g)"""
    if not _is_float(a):
        return None, None
    g = _work(grad)
    return _done(unbroadcast(g, a.shape), a.dtype), _done(-unbroadcast(g, b.shape), b.dtype)


@quiet
def mul_forward(a, b):
    """y = a b"""
    return _done(np.multiply(a, b), a.dtype)


@quiet
def mul_backward(grad, out, a, b):
    """da = unbroadcast(g b), db = unbroadcast(g a)"""
    if not _is_float(a):
        return None, None
    g, aw, bw = _work(grad), _work(a), _work(b)
    return _done(unbroadcast(g * bw, a.shape), a.dtype), _done(unbroadcast(g * aw, b.shape), b.dtype)


@quiet
def div_forward(a, b):
    """y = a / b"""
    return _done(np.divide(_work(a), _work(b)), a.dtype)


@quiet
def div_backward(grad, out, a, b):
    """da = unbroadcast(g / b), db = unbroadcast(-g a / b^2)"""
    if not _is_float(a):
        return None, None
    g, aw, bw = _work(grad), _work(a), _work(b)
    return (_done(unbroadcast(g / bw, a.shape), a.dtype),
            _done(unbroadcast(-g * aw / (bw * bw), b.shape), b.dtype))


@quiet
def pow_forward(a, b):
    """y = a ** b"""
    return _done(np.power(_work(a), _work(b)), a.dtype)


@quiet
def pow_backward(grad, out, a, b):
    """da = unbroadcast(g b a^(b-1)), taken as 0 where b == 0;
    db = unbroadcast(g a^b log(a)), taken as 0 where a == 0 and b >= 0
    (torch's conventions; NaN for a < 0, as log(a))"""
    if not _is_float(a):
        return None, None
    g, aw, bw = _work(grad), _work(a), _work(b)
    y = np.power(aw, bw)
    da = np.where(bw == 0, 0.0, g * bw * np.power(aw, bw - 1.0))
    db = np.where((aw == 0) & (bw >= 0), 0.0, g * y * np.log(aw))
    return (_done(unbroadcast(da.astype(g.dtype), a.shape), a.dtype),
            _done(unbroadcast(db.astype(g.dtype), b.shape), b.dtype))


@quiet
def maximum_forward(a, b):
    """y = max(a, b) elementwise (NaN if either is NaN)"""
    return _done(np.maximum(a, b), a.dtype)


@quiet
def maximum_backward(grad, out, a, b):
    """da = g [a > b], db = g [b > a]; on a tie each gets g / 2 (torch)"""
    if not _is_float(a):
        return None, None
    g, aw, bw = _work(grad), _work(a), _work(b)
    da = np.where(aw == bw, g / 2, np.where(aw < bw, 0.0, g))
    db = np.where(aw == bw, g / 2, np.where(aw > bw, 0.0, g))
    return (_done(unbroadcast(da.astype(g.dtype), a.shape), a.dtype),
            _done(unbroadcast(db.astype(g.dtype), b.shape), b.dtype))


@quiet
def minimum_forward(a, b):
    """y = min(a, b) elementwise (NaN if either is NaN)"""
    return _done(np.minimum(a, b), a.dtype)


@quiet
def minimum_backward(grad, out, a, b):
    """da = g [a < b], db = g [b < a]; on a tie each gets g / 2 (torch)"""
    if not _is_float(a):
        return None, None
    g, aw, bw = _work(grad), _work(a), _work(b)
    da = np.where(aw == bw, g / 2, np.where(aw > bw, 0.0, g))
    db = np.where(aw == bw, g / 2, np.where(aw < bw, 0.0, g))
    return (_done(unbroadcast(da.astype(g.dtype), a.shape), a.dtype),
            _done(unbroadcast(db.astype(g.dtype), b.shape), b.dtype))


# --- comparisons (bool results, no gradient) ---------------------------------------------

def eq_forward(a, b):
    """y = (a == b)"""
    return np.asarray(np.equal(a, b))


def ne_forward(a, b):
    """y = (a != b)"""
    return np.asarray(np.not_equal(a, b))


def lt_forward(a, b):
    """y = (a < b)"""
    return np.asarray(np.less(a, b))


def le_forward(a, b):
    """y = (a <= b)"""
    return np.asarray(np.less_equal(a, b))


def gt_forward(a, b):
    """y = (a > b)"""
    return np.asarray(np.greater(a, b))


def ge_forward(a, b):
    """y = (a >= b)"""
    return np.asarray(np.greater_equal(a, b))


# --- where ---------------------------------------------------------------------------------

def where_forward(cond, a, b):
    """y = a where cond else b (all three broadcast)"""
    return _done(np.where(cond, a, b), a.dtype)


def where_backward(grad, out, cond, a, b):
    """dcond: none (boolean); da = unbroadcast(g [cond]); db = unbroadcast(g [not cond])"""
    if not _is_float(a):
        return None, None, None
    g = _work(grad)
    zero = np.zeros_like(g)
    c = np.broadcast_to(np.asarray(cond, dtype=bool), g.shape)
    da = np.where(c, g, zero)
    db = np.where(c, zero, g)
    return None, _done(unbroadcast(da, a.shape), a.dtype), _done(unbroadcast(db, b.shape), b.dtype)
