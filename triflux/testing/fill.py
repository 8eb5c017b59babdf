"""Strategies and torch oracles for the fill family.

Fills take no tensor inputs: a :class:`Case` has ``inputs=()`` and all of
the information in ``attrs`` (``shape``, ``dtype`` as a NumPy dtype, ``value``
or ``seed``, and ``device=None``: the kernels' default device, which the
harness may replace).

The random fills cannot be compared value by value across backends (NumPy's
PCG64 on the CPU, Philox in the kernels, torch's own generator in the
oracle): their oracles return torch's draw of the same shape and dtype, to be
used only for comparing moments (mean, standard deviation, range).
"""
import math

from hypothesis import strategies as st

from triflux.dtypes import as_dtype, to_torch

from . import Case, shapes

#: values worth filling with besides ordinary ones; all finite in float16
SPECIAL_VALUES = (0.0, -0.0, 1.0, -1.0, 0.5, 0.1, -2.5, 1e-3, 1e4, -6e4, 3.0e-5)

#: the seed strategy: small, large and edge seeds
SEEDS = st.one_of(st.integers(0, 1000), st.integers(0, 2 ** 63 - 1), st.sampled_from([0, 1, 2 ** 31, 2 ** 63 - 1]))


def _shape():
    """Shapes of at most 4096 elements."""
    return shapes(min_dims=0, max_dims=4, max_side=17).filter(lambda s: math.prod(s) <= 4096)


def fill_strategy(dtype):
    d = as_dtype(dtype)
    value = st.one_of(st.sampled_from(SPECIAL_VALUES),
                      st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))
    return st.builds(lambda shape, v: Case((), dict(shape=tuple(shape), value=float(v), dtype=d, device=None)),
                     _shape(), value)


def fill_torch(*, shape, value, dtype, device=None):
    import torch
    return torch.full(tuple(shape), value, dtype=to_torch(dtype))


def _random_strategy(dtype):
    d = as_dtype(dtype)
    return st.builds(lambda shape, seed: Case((), dict(shape=tuple(shape), dtype=d, seed=seed, device=None)),
                     _shape(), SEEDS)


def _generator(seed):
    import torch
    return torch.Generator().manual_seed(int(seed))


def rand_uniform_strategy(dtype):
    return _random_strategy(dtype)


def rand_uniform_torch(*, shape, dtype, seed, device=None):
    """torch's own U[0, 1) draw of the same shape and dtype (moments only)."""
    import torch
    return torch.rand(tuple(shape), generator=_generator(seed), dtype=to_torch(dtype))


def rand_normal_strategy(dtype):
    return _random_strategy(dtype)


def rand_normal_torch(*, shape, dtype, seed, device=None):
    """torch's own N(0, 1) draw of the same shape and dtype (moments only)."""
    import torch
    return torch.randn(tuple(shape), generator=_generator(seed), dtype=to_torch(dtype))
