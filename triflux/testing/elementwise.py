"""Strategies and torch oracles for the elementwise family.

Inputs: 0- to 4-d float64 arrays (awkward sides, 0 and 1 included, a few
thousand elements at most), random memory layouts; binary operations draw
NumPy-broadcastable shape pairs (dropped leading dimensions, size-1
dimensions stretched, also against 0-sized ones). Each operation keeps to its
domain (``log``/``sqrt``: positive inputs away from 0; ``pow``: positive
bases; ``div``: denominators away from 0) and, where meaningful, mixes in
extreme values of +-1e4 (activations must neither overflow nor produce NaN
there). ``maximum``/``minimum`` and the comparisons often draw values on a
coarse grid so that ties happen. Integer and boolean inputs are exercised by
``tests/test_elementwise_family.py``.
"""
import numpy as np

from . import Case, layouts_for, shapes

#: the large |x| at which a naive sigmoid/tanh/softplus overflows
EXTREME = 1e4
#: at most this many elements per drawn array (the interpreter is slow)
MAX_ELEMENTS = 3000


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
        attrs = draw(attrs_strategy) if attrs_strategy is not None else {}
        return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)),
                    note=f"{shape}" + (" extreme" if extreme else "") + (" grid" if grid else ""))
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
    from .. import dtypes
    if np.dtype(dtypes.as_dtype(dtype)) == np.float64:
        targets = st.just(np.dtype(np.float64))
    else:
        targets = st.sampled_from(["float32", "float16", "bfloat16", "float64"]).map(dtypes.as_dtype)
    return _unary_case("cast", dtype, st.fixed_dictionaries({"dtype": targets}))


# --- binary ---------------------------------------------------------------------------------

def _binary_case(name, make):
    """``make(draw, shape_a, shape_b) -> (a, b, note)``."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        sa, sb = _broadcast_shapes(draw, 2)
        a, b, note = make(draw, sa, sb)
        return Case(inputs=(a, b), layouts=draw(layouts_for(2)),
                    note=f"{sa} with {sb}" + (f" {note}" if note else ""))
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
    """Values on a coarse grid (ties), now and then a NaN (compares unequal)."""
    from hypothesis import strategies as st
    a = _values(draw, sa, -2.0, 2.0, grid=0.5)
    b = _values(draw, sb, -2.0, 2.0, grid=0.5)
    if draw(st.integers(0, 3)) == 0 and a.size:
        a = a.copy()
        a.flat[draw(st.integers(0, a.size - 1))] = np.nan
        return a, b, "with NaN"
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
        return Case(inputs=(cond, a, b), layouts=draw(layouts_for(3)),
                    note=f"cond {sc}, a {sa}, b {sb}")
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
    import torch.nn.functional as F
    return F.elu(x, alpha)


def cast_torch(x, dtype):
    from ..dtypes import to_torch
    return x.to(to_torch(dtype))


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
