"""Strategy and torch oracle for dropout.

Inputs: 0- to 4-d arrays (sides 0 and 1 included), random layouts; p from
the edges (0, 1) and the inside; seeds over the whole allowed range [0, 2**63).
In about two draws in three a few entries are NaN, +inf and -inf (the mask
multiplies, as torch's: a dropped NaN or infinity gives NaN).

Dropout is random (``random=True`` in the registry): the kernel's mask comes
from Triton's Philox generator, the reference's from NumPy's, and torch's
from its own, so the three agree in distribution only. The oracle is for
moments (fraction of zeros ~ p, E[y] ~ x), never an elementwise comparison.
"""
from . import Case, floats, layouts_for, shapes
from .elementwise import nonfinite_draw, with_nonfinite

P_CHOICES = (0.0, 0.1, 0.5, 0.9, 1.0)


def _case(st, draw):
    shape = draw(shapes(min_dims=0, max_dims=4, min_side=0, max_side=17))
    size = 1
    for s in shape:
        size *= s
    if size > 3000:
        shape = tuple(min(s, 5) for s in shape)
    x = draw(floats(shape, -3.0, 3.0, extreme=draw(st.booleans())))
    if nonfinite_draw(draw):
        x = with_nonfinite(draw, x)
    p = draw(st.one_of(st.sampled_from(P_CHOICES), st.floats(0.0, 1.0, allow_nan=False)))
    seed = draw(st.integers(0, 2 ** 63 - 1))
    return Case(inputs=(x,), attrs={"p": p, "seed": seed}, layouts=draw(layouts_for(1)),
                note=f"{shape} p={p}")


def dropout_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(_case_draw)()


def _case_draw(draw):
    from hypothesis import strategies as st
    return _case(st, draw)


def dropout_torch(x, p, seed):
    """torch's dropout (training mode) with its generator seeded from ``seed``;
    its mask is torch's own: for moments only."""
    import torch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return torch.nn.functional.dropout(x, p=float(p), training=True)
