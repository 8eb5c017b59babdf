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
