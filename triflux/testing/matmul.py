"""Strategies and the torch oracle for the ``matmul`` family.

Shapes cover every case of NumPy's matmul: vector @ vector, matrix @ vector,
vector @ matrix, matrix @ matrix, and batched stacks whose batch axes
broadcast (``(2, 1, 5, 3) @ (4, 3, 7)``), with sides 0, 1 and sizes that are
not multiples of any tile. Layouts (contiguous / transposed / strided) make
both sides read through arbitrary strides.

Most draws are the product a Dense layer makes, a matrix against a
stack with one to three batch axes, on either side (``x @ weight.T``:
``(2, 5, 3) @ (3, 4)``), the matrix usually transposed in memory (Dense
passes ``weight.T``). Its gradient is a sum over the whole stack, so these
draws come in three sizes:

* square: every side of both operands equal (2 or 3), so a transpose of the
  wrong axes gives a wrong number instead of a shape error;
* long: over a thousand tiny matrices in the stack, a sum that a 16-bit
  accumulator visibly loses (the stack positive, so that with a positive
  output gradient, a sum's, every term has one sign: the worst case);
* mixed: awkward sides, 0 and 1 included.

Long draws come about once in three, square ones once in five, so the
property suite's 8 draws per dtype (nearly always) see both.

Stacks and matrices hold dense random values (no repeated fill value, which
would hide a product of the wrong entries).
"""
import numpy as np

from . import Case, floats, layouts_for

#: matrix sides: awkward sizes, 0 and 1 included, small for the interpreter
_NONZERO_SIDES = (1, 2, 3, 5, 7, 13, 17)

#: batch shapes of one to three axes holding over a thousand matrices: a
#: 16-bit sum of that many random-sign terms is off by several units of
#: roundoff even measured against its largest entry (at a few hundred terms
#: it often stays within the tolerance of 2 u)
_LONG_BATCHES = ((1031,), (1499,), (31, 41), (23, 61), (10, 11, 13), (7, 11, 17))

#: the draws' mix; repeated entries are drawn more often (and hypothesis
#: favours the first and the last entry)
_KINDS = ("stack @ matrix",) * 5 + ("mm", "mv", "vm", "vv") + ("batched",) * 2 + ("matrix @ stack",) * 3


def _side(st):
    """A matrix side; 0 in about one draw in eight."""
    return st.integers(0, 7).flatmap(
        lambda r: st.just(0) if r == 0 else st.sampled_from(_NONZERO_SIDES))


def _dense(shape, low=-2.0, high=2.0):
    """float64 arrays of ``shape`` with every entry drawn independently."""
    from hypothesis import strategies as st
    return st.integers(0, 2 ** 32 - 1).map(
        lambda seed: np.random.default_rng(seed).uniform(low, high, shape))


def _stack_sizes(draw, st):
    """(batch shape, M, K, N, size) for a matrix against a stack of matrices."""
    nb = draw(st.integers(1, 3))
    size = draw(st.sampled_from(("long", "square", "mixed", "square", "long")))
    if size == "square":
        s = draw(st.sampled_from((2, 3)))
        return (s,) * nb, s, s, s, size
    if size == "long":
        batch = draw(st.sampled_from(_LONG_BATCHES))
        # K, N > 1: a (K, 1) matrix is dense in both orders, no transposed view
        M, K, N = (draw(st.sampled_from(sides)) for sides in ((1, 2), (2, 3), (2, 3)))
        return batch, M, K, N, size
    batch = tuple(draw(st.sampled_from((1, 2, 3, 4))) for _ in range(nb))
    M, K, N = (min(draw(_side(st)), 7) for _ in range(3))
    return batch, M, K, N, size


def _general_batches(draw, st, M, K, N):
    """Batch shapes of both operands that broadcast against each other:
    suffixes of one batch shape with some sides set to 1; sometimes long."""
    nb = draw(st.integers(1, 3))
    if draw(st.integers(0, 3)) == 0:              # a long sum over a broadcast axis
        out_batch = (draw(st.sampled_from((1031, 1499))),) + (1,) * (nb - 1)
        M, K, N = min(M, 2), min(K, 3), min(N, 3)
    else:
        out_batch = tuple(draw(st.sampled_from((1, 2, 3, 4))) for _ in range(nb))
        if draw(st.integers(0, 15)) == 0:
            out_batch = out_batch[:-1] + (0,)
        M, K, N = min(M, 7), min(K, 7), min(N, 7)

    def operand_batch():
        keep = draw(st.integers(0, nb))           # leading axes dropped
        b = out_batch[nb - keep:]
        return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else s for s in b)

    return operand_batch() + (M, K), operand_batch() + (K, N)


def matmul_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        kind = draw(st.sampled_from(_KINDS))
        if kind in ("stack @ matrix", "matrix @ stack"):
            batch, M, K, N, size = _stack_sizes(draw, st)
            # the matrix mostly transposed in memory, as Dense's weight.T
            matrix_layout = draw(st.sampled_from(("transposed", "transposed", "contiguous", "strided")))
            stack_layout = draw(st.sampled_from(("contiguous", "transposed", "strided")))
            matrix = _dense
            stack = (lambda shape: _dense(shape, 0.0, 2.0)) if size == "long" else _dense
            if kind == "stack @ matrix":
                shape_a, shape_b, layouts = batch + (M, K), (K, N), (stack_layout, matrix_layout)
                a, b = draw(stack(shape_a)), draw(matrix(shape_b))
            else:
                shape_a, shape_b, layouts = (M, K), batch + (K, N), (matrix_layout, stack_layout)
                a, b = draw(matrix(shape_a)), draw(stack(shape_b))
            return Case(inputs=(a, b), layouts=layouts,
                        note=f"{kind} ({size}): {shape_a} @ {shape_b}")
        M, K, N = draw(_side(st)), draw(_side(st)), draw(_side(st))
        if kind == "batched":
            shape_a, shape_b = _general_batches(draw, st, M, K, N)
            a, b = draw(_dense(shape_a)), draw(_dense(shape_b))
        else:
            shape_a = {"vv": (K,), "vm": (K,)}.get(kind, (M, K))
            shape_b = {"vv": (K,), "mv": (K,)}.get(kind, (K, N))
            a, b = draw(floats(shape_a, -2.0, 2.0)), draw(floats(shape_b, -2.0, 2.0))
        return Case(inputs=(a, b), layouts=draw(layouts_for(2)),
                    note=f"{kind}: {shape_a} @ {shape_b}")

    return case()


def matmul_torch(a, b):
    """The oracle: ``torch.matmul`` (NumPy semantics too)."""
    import torch
    return torch.matmul(a, b)
