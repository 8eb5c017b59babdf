"""Strategies and torch oracles for the elementwise family.

Inputs: 0- to 4-d float64 arrays (awkward sides, 0 and 1 included, a few
thousand elements at most), random memory layouts; binary operations draw
NumPy-broadcastable shape pairs (dropped leading dimensions, size-1
dimensions stretched, also against 0-sized ones). Each operation keeps to its
domain (``log``/``sqrt``: positive inputs away from 0; ``pow``: positive
bases; ``div``: denominators away from 0) and, where meaningful, mixes in
extreme values of +-1e4 (activations must neither overflow nor produce NaN
there). ``maximum``/``minimum`` and the comparisons often draw values on a
coarse grid so that ties happen. In about two draws in three some entries
are NaN, +inf and -inf (:func:`with_nonfinite`), where torch, the oracle,
defines every result: a GPU's min/max instructions drop NaN where NumPy's
keep it, and a comparison such as ``x > 0`` sends NaN down one branch.
Binary operations now and then broadcast a small operand over several
hundred elements, so that the backward's sum back to its shape is long
(where a sum accumulated in a 16-bit type drifts, when its terms share a sign). Integer and boolean inputs are exercised
by ``tests/test_elementwise_family.py``.
"""
import numpy as np

from .. import dtypes
from . import Case, layouts_for, shapes

#: the large |x| at which a naive sigmoid/tanh/softplus overflows
EXTREME = 1e4
#: at most this many elements per drawn array (the interpreter is slow)
MAX_ELEMENTS = 3000
#: the non-finite values strategies mix in: torch defines a result for each
NONFINITE = (np.nan, np.inf, -np.inf)
#: the broadcast-heavy binary cases: the large operand's size range
LONG_BROADCAST = (300, 900)


def with_nonfinite(draw, x, values=NONFINITE):
    """A copy of the float64 array ``x`` with ``min(x.size, len(values))``
    entries at distinct random positions set to ``values`` (NaN, +inf, -inf),
    in turn from a random one; ``x`` itself when it is empty. Shared by the
    strategies of every family whose kernels compare, take maxima or branch."""
    from hypothesis import strategies as st
    x = np.array(x, dtype=np.float64)
    if x.size == 0:
        return x
    k = min(x.size, len(values))
    where = draw(st.lists(st.integers(0, x.size - 1), min_size=k, max_size=k, unique=True))
    first = draw(st.integers(0, len(values) - 1))
    for i, pos in enumerate(where):
        x.flat[pos] = values[(first + i) % len(values)]
    return x


def nonfinite_draw(draw, out_of=3):
    """Whether this draw mixes in non-finite values: all but one draw in
    ``out_of`` (two in three by default)."""
    from hypothesis import strategies as st
    return draw(st.integers(0, out_of - 1)) > 0


def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _shape(draw, min_dims=0, max_dims=4):
    shape = draw(shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=17))
    if _size(shape) > MAX_ELEMENTS:
        shape = tuple(min(s, 5) for s in shape)
    return tuple(shape)


def _broadcast_shapes(draw, n):
    """``n`` shapes that broadcast together (often equal, sometimes with
    leading dimensions dropped or sides set to 1)."""
    from hypothesis import strategies as st
    out = _shape(draw)
    result = []
    for _ in range(n):
        if draw(st.integers(0, 2)) == 0:
            result.append(out)
            continue
        drop = draw(st.integers(0, len(out)))
        s = list(out[drop:])
        ones = draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
        result.append(tuple(1 if o else d for d, o in zip(s, ones)))
    return result


def _values(draw, shape, low, high, extreme=False, grid=None):
    """float64 values in [low, high]; ``extreme``: some entries +-EXTREME;
    ``grid``: rounded to multiples of ``grid`` (ties)."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
    ordinary = st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)
    elements = st.one_of(ordinary, ordinary, st.sampled_from([EXTREME, -EXTREME])) \
        if extreme else ordinary
    x = draw(hnp.arrays(np.float64, shape, elements=elements))
    if grid:
        x = np.round(x / grid) * grid
    return x


# --- unary ----------------------------------------------------------------------------------

#: (low, high, extremes allowed) per unary operation
_UNARY_DOMAIN = {
    "neg": (-4.0, 4.0, True),
    "exp": (-6.0, 6.0, False),      # exp(1e4) is inf, its gradient too: nothing to check
    "log": (0.05, 30.0, False),
    "sqrt": (0.05, 30.0, False),
    "abs": (-4.0, 4.0, True),
    "tanh": (-4.0, 4.0, True),
    "sigmoid": (-8.0, 8.0, True),
    "relu": (-4.0, 4.0, True),
    "gelu": (-4.0, 5.0, True),      # below -4, torch's float64 0.5x(1+tanh u) cancels (> 1e-10)
    "gelu_erf": (-4.0, 5.0, True),  # ... and its 0.5x(1+erf(x/sqrt 2)) likewise
    "swish": (-6.0, 6.0, True),
    "softplus": (-6.0, 6.0, True),
    "leakyrelu": (-4.0, 4.0, True),
    "elu": (-5.0, 5.0, True),
    "cast": (-4.0, 4.0, True),
}


def _unary_case(name, dtype, attrs_strategy=None):
    from hypothesis import strategies as st
    low, high, can_extreme = _UNARY_DOMAIN[name]

    @st.composite
    def case(draw):
        shape = _shape(draw)
        extreme = can_extreme and draw(st.integers(0, 3)) == 0
        grid = 0.5 if name in ("relu", "abs", "leakyrelu", "elu") and draw(st.booleans()) else None
        x = _values(draw, shape, low, high, extreme, grid)   # grid: exact zeros (kinks)
        nonfinite = nonfinite_draw(draw)
        if nonfinite:
            x = with_nonfinite(draw, x)
        attrs = draw(attrs_strategy) if attrs_strategy is not None else {}
        return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)),
                    note=f"{shape}" + (" extreme" if extreme else "") + (" grid" if grid else "")
                    + (" NaN/inf" if nonfinite else ""))
    return case()


def neg_strategy(dtype):
    return _unary_case("neg", dtype)


def exp_strategy(dtype):
    return _unary_case("exp", dtype)


def log_strategy(dtype):
    return _unary_case("log", dtype)


def sqrt_strategy(dtype):
    return _unary_case("sqrt", dtype)


def abs_strategy(dtype):
    return _unary_case("abs", dtype)


def tanh_strategy(dtype):
    return _unary_case("tanh", dtype)


def sigmoid_strategy(dtype):
    return _unary_case("sigmoid", dtype)


def relu_strategy(dtype):
    return _unary_case("relu", dtype)


def gelu_strategy(dtype):
    return _unary_case("gelu", dtype)


def gelu_erf_strategy(dtype):
    return _unary_case("gelu_erf", dtype)


def swish_strategy(dtype):
    return _unary_case("swish", dtype)


def softplus_strategy(dtype):
    return _unary_case("softplus", dtype)


def leakyrelu_strategy(dtype):
    from hypothesis import strategies as st
    return _unary_case("leakyrelu", dtype, st.fixed_dictionaries(
        {"negative_slope": st.sampled_from([0.01, 0.2, 0.5])}))


def elu_strategy(dtype):
    from hypothesis import strategies as st
    return _unary_case("elu", dtype, st.fixed_dictionaries(
        {"alpha": st.sampled_from([1.0, 0.5, 2.0])}))


def cast_strategy(dtype):
    """Casts between floating dtypes. In float64 (the dtype of the
    finite-difference and torch checks) the target is float64 too: a cast to a
    narrower type is piecewise constant, which a finite difference cannot
    check; the kernel tests of the other dtypes draw every floating target."""
    from hypothesis import strategies as st
    if np.dtype(dtypes.as_dtype(dtype)) == np.float64:
        targets = st.just(np.dtype(np.float64))
    else:
        targets = st.sampled_from(["float32", "float16", "bfloat16", "float64"]).map(dtypes.as_dtype)
    return _unary_case("cast", dtype, st.fixed_dictionaries({"dtype": targets}))


# --- binary ---------------------------------------------------------------------------------

def _long_broadcast_shapes(draw):
    """A pair (large, small) or (small, large): the small operand (a scalar,
    one element, or one row) broadcasts over LONG_BROADCAST elements."""
    from hypothesis import strategies as st
    rows = draw(st.integers(20, 60))
    cols = draw(st.integers(*LONG_BROADCAST).map(lambda n: max(1, n // rows)))
    large = (rows, cols)
    small = draw(st.sampled_from([(), (1,), (1, 1), (cols,), (1, cols)]))
    return (large, small) if draw(st.booleans()) else (small, large)


def _binary_case(name, make):
    """``make(draw, shape_a, shape_b) -> (a, b, note)``; non-finite entries
    in ``a``, ``b`` or both in about two draws in three; about one draw in
    five broadcasts a small operand over several hundred elements."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        long_broadcast = draw(st.integers(0, 4)) == 0
        sa, sb = _long_broadcast_shapes(draw) if long_broadcast else _broadcast_shapes(draw, 2)
        a, b, note = make(draw, sa, sb)
        nonfinite = nonfinite_draw(draw)
        if nonfinite:
            which = draw(st.sampled_from(("a", "b", "both")))
            a = with_nonfinite(draw, a) if which != "b" else a
            b = with_nonfinite(draw, b) if which != "a" else b
            note = f"{note} NaN/inf in {which}"
        return Case(inputs=(a, b), layouts=draw(layouts_for(2)),
                    note=f"{sa} with {sb}" + (" (long broadcast)" if long_broadcast else "")
                    + (f" {note}" if note else ""))
    return case()


def _plain(draw, sa, sb):
    from hypothesis import strategies as st
    extreme = draw(st.integers(0, 4)) == 0
    return (_values(draw, sa, -3.0, 3.0, extreme), _values(draw, sb, -3.0, 3.0, extreme),
            "extreme" if extreme else "")


def _ties(draw, sa, sb):
    from hypothesis import strategies as st
    grid = 0.5 if draw(st.booleans()) else None
    return (_values(draw, sa, -3.0, 3.0, grid=grid), _values(draw, sb, -3.0, 3.0, grid=grid),
            "grid (ties)" if grid else "")


def _denominators(draw, sa, sb):
    a = _values(draw, sa, -3.0, 3.0)
    b = _values(draw, sb, 0.25, 3.0)
    sign = np.where(_values(draw, sb, -1.0, 1.0) < 0, -1.0, 1.0)
    return a, b * sign, ""


def _powers(draw, sa, sb):
    """Positive bases, moderate exponents; in one draw of three, bases near 1
    with exponents of 60-90, whose powers overflow float16 (a^b > 65504)
    while the exponent's gradient g a^b log(a) does not: a backward that
    reads the stored (overflowed) output instead of recomputing it gives inf."""
    from hypothesis import strategies as st
    if draw(st.integers(0, 2)) == 0:
        return _values(draw, sa, 1.1, 1.25), _values(draw, sb, 60.0, 90.0), "powers beyond float16"
    return _values(draw, sa, 0.1, 3.0), _values(draw, sb, -2.5, 2.5), ""


def add_strategy(dtype):
    return _binary_case("add", _plain)


def sub_strategy(dtype):
    return _binary_case("sub", _plain)


def mul_strategy(dtype):
    return _binary_case("mul", _plain)


def div_strategy(dtype):
    return _binary_case("div", _denominators)


def pow_strategy(dtype):
    return _binary_case("pow", _powers)


def maximum_strategy(dtype):
    return _binary_case("maximum", _ties)


def minimum_strategy(dtype):
    return _binary_case("minimum", _ties)


def _comparison_values(draw, sa, sb):
    """Values on a coarse grid (ties); NaN (compares unequal) and the
    infinities come from _binary_case."""
    a = _values(draw, sa, -2.0, 2.0, grid=0.5)
    b = _values(draw, sb, -2.0, 2.0, grid=0.5)
    return a, b, ""


def eq_strategy(dtype):
    return _binary_case("eq", _comparison_values)


def ne_strategy(dtype):
    return _binary_case("ne", _comparison_values)


def lt_strategy(dtype):
    return _binary_case("lt", _comparison_values)


def le_strategy(dtype):
    return _binary_case("le", _comparison_values)


def gt_strategy(dtype):
    return _binary_case("gt", _comparison_values)


def ge_strategy(dtype):
    return _binary_case("ge", _comparison_values)


def where_strategy(dtype):
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    @st.composite
    def case(draw):
        sc, sa, sb = _broadcast_shapes(draw, 3)
        cond = draw(hnp.arrays(np.bool_, sc))
        a = _values(draw, sa, -3.0, 3.0)
        b = _values(draw, sb, -3.0, 3.0)
        nonfinite = nonfinite_draw(draw)
        if nonfinite:
            a, b = with_nonfinite(draw, a), with_nonfinite(draw, b)
        return Case(inputs=(cond, a, b), layouts=draw(layouts_for(3)),
                    note=f"cond {sc}, a {sa}, b {sb}" + (" NaN/inf" if nonfinite else ""))
    return case()


# --- torch oracles --------------------------------------------------------------------------

def neg_torch(x):
    import torch
    return torch.neg(x)


def exp_torch(x):
    import torch
    return torch.exp(x)


def log_torch(x):
    import torch
    return torch.log(x)


def sqrt_torch(x):
    import torch
    return torch.sqrt(x)


def abs_torch(x):
    import torch
    return torch.abs(x)


def tanh_torch(x):
    import torch
    return torch.tanh(x)


def sigmoid_torch(x):
    import torch
    return torch.sigmoid(x)


def relu_torch(x):
    import torch
    return torch.relu(x)


def gelu_torch(x):
    import torch.nn.functional as F
    return F.gelu(x, approximate="tanh")


def gelu_erf_torch(x):
    import torch.nn.functional as F
    return F.gelu(x, approximate="none")


def swish_torch(x):
    import torch.nn.functional as F
    return F.silu(x)


def softplus_torch(x):
    import torch.nn.functional as F
    return F.softplus(x)


def leakyrelu_torch(x, negative_slope=0.01):
    import torch.nn.functional as F
    return F.leaky_relu(x, negative_slope)


def elu_torch(x, alpha=1.0):
    """elu by its definition, x if x > 0 else alpha (exp(x) - 1), in torch
    (F.elu's values): F.elu's own gradient at NaN is NaN in torch's vectorised
    CPU loop but g in its scalar loop and on CUDA; this one is NaN everywhere."""
    import torch
    negative = torch.where(x > 0, torch.zeros_like(x), x)   # (exp(1e4) in the unused branch: 0 * inf)
    return torch.where(x > 0, x, alpha * torch.expm1(negative))


def cast_torch(x, dtype):
    return x.to(dtypes.to_torch(dtype))


def add_torch(a, b):
    import torch
    return torch.add(a, b)


def sub_torch(a, b):
    import torch
    return torch.sub(a, b)


def mul_torch(a, b):
    import torch
    return torch.mul(a, b)


def div_torch(a, b):
    import torch
    return torch.div(a, b)


def pow_torch(a, b):
    import torch
    return torch.pow(a, b)


def maximum_torch(a, b):
    import torch
    return torch.maximum(a, b)


def minimum_torch(a, b):
    import torch
    return torch.minimum(a, b)


def eq_torch(a, b):
    import torch
    return torch.eq(a, b)


def ne_torch(a, b):
    import torch
    return torch.ne(a, b)


def lt_torch(a, b):
    import torch
    return torch.lt(a, b)


def le_torch(a, b):
    import torch
    return torch.le(a, b)


def gt_torch(a, b):
    import torch
    return torch.gt(a, b)


def ge_torch(a, b):
    import torch
    return torch.ge(a, b)


def where_torch(cond, a, b):
    import torch
    return torch.where(cond, a, b)
