"""Strategies and the torch oracle for the ``matmul`` family.

Shapes cover every case of NumPy's matmul: vector @ vector, matrix @ vector,
vector @ matrix, matrix @ matrix, and batched stacks whose batch axes
broadcast (``(2, 1, 5, 3) @ (4, 3, 7)``), with sides 0, 1 and sizes that are
not multiples of any tile. Layouts (contiguous / transposed / strided) make
the kernel read through arbitrary strides.
"""
from . import Case, floats, layouts_for

#: matrix sides: awkward sizes, 0 and 1 included, small for the interpreter
_NONZERO_SIDES = (1, 2, 3, 5, 7, 13, 17)


def _side(st):
    """A matrix side; 0 in about one draw in eight."""
    return st.integers(0, 7).flatmap(
        lambda r: st.just(0) if r == 0 else st.sampled_from(_NONZERO_SIDES))


def matmul_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        kind = draw(st.sampled_from(("vv", "mv", "vm", "mm", "mm", "batched", "batched")))
        M, K, N = draw(_side(st)), draw(_side(st)), draw(_side(st))
        batch_a, batch_b = (), ()
        if kind == "batched":
            nb = draw(st.integers(1, 2))
            out_batch = tuple(draw(st.sampled_from((1, 2, 3, 4))) for _ in range(nb))
            if draw(st.integers(0, 15)) == 0:
                out_batch = out_batch[:-1] + (0,)

            def operand_batch():
                keep = draw(st.integers(0, nb))           # leading axes dropped
                b = out_batch[nb - keep:]
                return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else s for s in b)

            # suffixes of one batch shape with some sides set to 1: they broadcast
            batch_a, batch_b = operand_batch(), operand_batch()
            # keep it small for the interpreter
            M, K, N = min(M, 7), min(K, 7), min(N, 7)
            if draw(st.booleans()):                     # sometimes only one is batched
                if draw(st.booleans()):
                    batch_b = ()
                else:
                    batch_a = ()
        shape_a = {"vv": (K,), "vm": (K,)}.get(kind, batch_a + (M, K))
        shape_b = {"vv": (K,), "mv": (K,)}.get(kind, batch_b + (K, N))
        a = draw(floats(shape_a, -2.0, 2.0))
        b = draw(floats(shape_b, -2.0, 2.0))
        return Case(inputs=(a, b), layouts=draw(layouts_for(2)),
                    note=f"{kind}: {shape_a} @ {shape_b}")

    return case()


def matmul_torch(a, b):
    """The oracle: ``torch.matmul`` (NumPy semantics too)."""
    import torch
    return torch.matmul(a, b)

