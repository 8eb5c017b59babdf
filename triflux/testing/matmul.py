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

``dense_bias_act`` draws a Dense layer's problem, x (..., K) with zero to
three leading axes, w (O, K), b (O,) and one of the fusable activations, in
the same three sizes (long: over a thousand rows, whose sums dw and db a
16-bit accumulator loses, with every z = x @ w^T + b >= 1/4); in about half of the other draws some entries of
x and of the bias are NaN, +inf and -inf (with relu, whose NaN branch a
GPU's max or a comparison can get wrong, in half of those). Its oracle is
torch's ``F.linear`` and then torch's relu/sigmoid/tanh.
"""
import numpy as np

from ..specs.matmul import FUSABLE_ACTIVATIONS
from . import Case, finite_max, floats, layouts_for, through_activation_terms, torch_activated
from .elementwise import nonfinite_draw, with_nonfinite

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


def dense_bias_act_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        nb = draw(st.integers(0, 3))
        size = draw(st.sampled_from(("long", "square", "mixed", "square", "long", "mixed")))
        if size == "square":
            side = draw(st.sampled_from((2, 3)))
            lead, K, O = (side,) * nb, side, side
        elif size == "long":
            lead = draw(st.sampled_from(_LONG_BATCHES))
            K, O = draw(st.sampled_from((1, 2, 3))), draw(st.sampled_from((2, 3)))
        else:
            lead = tuple(draw(st.sampled_from((0, 1, 2, 3, 5))) for _ in range(nb))
            K, O = min(draw(_side(st)), 13), min(draw(_side(st)), 13)
        if size == "long":
            # long sums of terms of one sign (x >= 0), and z = x @ w^T + b >= 1/4, away from
            # relu's kink, where a TF32 forward's rounding error may rightly flip a row's mask
            x, w, b = (draw(_dense(shape, low, high)) for shape, low, high in
                       ((lead + (K,), 0.0, 2.0), ((O, K), 0.0, 1.0), ((O,), 0.25, 1.0)))
        else:
            x, w, b = (draw(_dense(shape, -r, r)) for shape, r in ((lead + (K,), 2.0), ((O, K), 1.0), ((O,), 1.0)))
        nonfinite = size != "long" and nonfinite_draw(draw, out_of=2)
        activations = (("relu",) * 3 + tuple(a for a in FUSABLE_ACTIVATIONS if a != "relu") if nonfinite
                       else FUSABLE_ACTIVATIONS)
        activation = draw(st.sampled_from(activations))
        if nonfinite:
            x, b = with_nonfinite(draw, x), with_nonfinite(draw, b)
        return Case(inputs=(x, w, b), attrs=dict(activation=activation), layouts=draw(layouts_for(3)),
                    note=f"{size}: x {x.shape} w {w.shape} {activation}" + (" NaN/inf" if nonfinite else ""))

    return case()


def dense_bias_act_torch(x, w, b, activation="identity"):
    """The oracle: ``torch.nn.functional.linear`` (x @ w^T + b), then
    ``torch.relu`` / ``torch.sigmoid`` / ``torch.tanh``."""
    import torch
    return torch_activated(torch.nn.functional.linear(x, w, b), activation)


def dense_bias_act_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: a sum of products through a monotone activation, bounded by
    the same computation on |x|, |w|, |b|. Backward: gz = G act'(y) read
    from the rounded output carries terms of size |G| (|act'(y)| + |d
    act'/dy| |y|) (``through_activation_terms``); dx, dw and db sum those
    against |w|, |x| and 1."""
    x, w, b = (np.abs(np.asarray(a, dtype=np.float64)) for a in inputs)
    if direction == "forward":
        return finite_max(reference(x, w, b, **attrs))
    gz = through_activation_terms(grad, out, attrs["activation"], "dense_bias_act_magnitude")
    rows = int(np.prod(x.shape[:-1]))
    gz, x = gz.reshape(rows, w.shape[0]), x.reshape(rows, w.shape[1])
    return finite_max(gz @ w), finite_max(gz.T @ x), finite_max(gz.sum(axis=0))
