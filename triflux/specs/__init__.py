"""Specs: one per family that has geometry to derive or inputs to validate.

A spec is a frozen dataclass built by one cached function from the input
shapes, dtypes and attributes (``matmul_spec(a_shape, b_shape, a_dtype,
b_dtype)``, ...). Building it validates the inputs, raising the triflux error
that says what is wrong, and it carries what follows from them: the output
shape, the derived sizes and the ``compute_dtype``. ``triflux.ops`` builds it
at the API edge; the reference and the kernel build the same (cached) object
instead of deriving the geometry again. Specs use NumPy only.

``triflux.specs.<family>`` mirrors ``triflux.reference.<family>``,
``triflux.triton_kernels.<family>`` and ``triflux.testing.<family>``, for the
families that have a spec (conv2d's is in ``specs.conv``, as its reference
is in ``reference.conv``).
"""
import functools


def cached_on_arguments(spec_function):
    """``spec_function`` (which normalises its arguments, then calls its
    cached core) memoised on the arguments as given too, so that the
    normalisation (ints, dtypes) runs once per distinct call, not on every
    launch. Arguments that compare equal normalise alike, so one cached
    answer serves them all; unhashable ones (a list) skip this cache."""
    cached = functools.lru_cache(maxsize=1024)(spec_function)

    @functools.wraps(spec_function)
    def spec(*args, **kwargs):
        try:
            return cached(*args, **kwargs)
        except TypeError:
            return spec_function(*args, **kwargs)   # an unhashable argument (or its own TypeError, again)
    return spec
