"""Test support: the :class:`Case` a strategy draws, shared hypothesis
building blocks, and helpers that lay inputs out on a device.

Per family, ``triflux.testing.<family>`` holds ``<name>_strategy(dtype)``,
``<name>_torch(*tensors, **attrs)`` (the oracle) and, where a tolerance floor
needs code, ``<name>_magnitude(...)`` for each registered primitive (see
``triflux.registry``). hypothesis is imported only by those modules, when the
tests run.
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    """One drawn input set for a primitive.

    ``inputs``: NumPy arrays. Floating inputs are drawn in float64 and the
    harness rounds them to the dtype under test before anything runs, so the
    reference (on float64 copies) and the kernel see the same numbers.
    ``attrs``: the primitive's keyword attributes.
    ``layouts``: per input, how the kernel-side tensor is laid out in memory:
    "contiguous", "transposed" (a transposed view of a dense buffer) or
    "strided" (every other element of a wider buffer). Missing = contiguous.
    ``grad_inputs``: indices of inputs to check gradients for (default: all
    floating inputs).
    """
    inputs: tuple
    attrs: dict = field(default_factory=dict)
    layouts: tuple = ()
    grad_inputs: tuple = None
    note: str = ""

    def layout(self, i):
        return self.layouts[i] if i < len(self.layouts) else "contiguous"


def shapes(min_dims=0, max_dims=4, min_side=0, max_side=17):
    """Shapes with awkward sides (0, 1, primes), small enough for the interpreter."""
    from hypothesis.extra import numpy as hnp
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims,
                            min_side=min_side, max_side=max_side)


def floats(shape, low=-3.0, high=3.0, extreme=False):
    """float64 arrays of ``shape`` with values in [low, high]; with ``extreme``,
    a few entries are pushed to ``±high`` exactly and to zero."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    elements = st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)
    if not extreme:
        return hnp.arrays(np.float64, shape, elements=elements)
    elements = st.one_of(elements, st.sampled_from([low, high, 0.0]))
    return hnp.arrays(np.float64, shape, elements=elements)


def layouts_for(n_inputs):
    from hypothesis import strategies as st
    return st.tuples(*[st.sampled_from(("contiguous", "transposed", "strided"))] * n_inputs)


def round_to(array, dtype):
    """Round a float64 array to ``dtype`` (values exactly representable there),
    returned in ``dtype``. Non-floating arrays are returned as they are."""
    from ..dtypes import is_floating
    a = np.asarray(array)
    if not is_floating(a.dtype):
        return a
    return a.astype(dtype)


def to_numpy_layout(array, layout):
    """A NumPy array holding ``array``'s values with the given memory layout,
    the reference's counterpart of :func:`to_torch_layout`: "transposed" is
    column-major (a transposed view of a dense buffer, as Dense's ``weight.T``),
    "strided" every other element of a wider buffer along the last axis."""
    a = np.asarray(array)
    if layout == "transposed" and a.ndim >= 2:
        out = np.array(a, order="F", copy=True)
    elif layout == "strided" and a.ndim >= 1 and a.size > 0:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        wide[..., ::2] = a
        out = wide[..., ::2]
    else:
        out = np.array(a, copy=True)
    assert out.shape == a.shape
    return out


def to_torch_layout(array, layout, device="cpu"):
    """A torch tensor holding ``array``'s values with the given memory layout."""
    import torch

    from ..dtypes import to_torch, is_bfloat16
    a = np.asarray(array)
    tdtype = to_torch(a.dtype)
    dense = np.array(a, order="C", copy=True)      # (ascontiguousarray would make 0-d arrays 1-d)
    if is_bfloat16(a.dtype):
        base = torch.from_numpy(dense.view(np.int16)).view(torch.bfloat16)
    else:
        base = torch.from_numpy(dense)
    base = base.to(device)
    if layout == "transposed" and a.ndim >= 2:
        buf = base.permute(*reversed(range(a.ndim))).contiguous()
        t = buf.permute(*reversed(range(a.ndim)))
    elif layout == "strided" and a.ndim >= 1 and a.size > 0:
        wide = torch.empty(a.shape[:-1] + (2 * a.shape[-1],), dtype=tdtype, device=device)
        wide[..., ::2] = base
        t = wide[..., ::2]
    else:
        t = base
    assert tuple(t.shape) == a.shape
    return t


def to_numpy(t):
    """A NumPy copy of a torch tensor (bfloat16 included)."""
    import torch

    from ..dtypes import from_torch
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(from_torch(torch.bfloat16)).copy()
    return t.numpy().copy()


def finite_max(a):
    """max |a| over the finite entries of ``a`` (0.0 when there are none), the
    size a ``<name>_magnitude`` floor is made of."""
    a = np.abs(np.asarray(a, dtype=np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


#: |act'(y)| + |d act'/dy| |y| in terms of the output y = act(z), for the activations a
#: primitive fuses (the registry's fusable_activations): the size of the terms of
#: act'(y) when y carries a rounding error of u |y| (a fused backward reads the rounded y)
_ACTIVATION_SENSITIVITY = {
    "identity": lambda y: np.ones_like(y),
    "relu": lambda y: (y > 0).astype(np.float64),
    "sigmoid": lambda y: y * np.abs(1 - y) + np.abs(1 - 2 * y) * y,
    "tanh": lambda y: np.abs(1 - y * y) + 2 * y * y,
}


def torch_activated(z, activation):
    """act(z) for a fused activation, computed by torch (the oracles' last step):
    ``torch.relu`` / ``torch.sigmoid`` / ``torch.tanh``, or z itself."""
    import torch
    return {"identity": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid,
            "tanh": torch.tanh}[activation](z)


def through_activation_terms(grad, out, activation, who):
    """|dL/dz|'s term sizes |G| (|act'(y)| + |d act'/dy| |y|) for a fused
    activation's backward (see ``_ACTIVATION_SENSITIVITY``), in float64."""
    if activation not in _ACTIVATION_SENSITIVITY:
        raise LookupError(f"{who}: no sensitivity for the activation {activation!r}; "
                          "add it to _ACTIVATION_SENSITIVITY in triflux/testing/__init__.py")
    y = np.abs(np.asarray(out, dtype=np.float64))
    return np.abs(np.asarray(grad, dtype=np.float64)) * _ACTIVATION_SENSITIVITY[activation](y)
