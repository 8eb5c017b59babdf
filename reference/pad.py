"""Padding, NumPy reference (forward and backward): NNlib's pad_constant,
pad_reflect, pad_repeat, pad_symmetric and pad_circular, torch's ``F.pad``,
on an array of any rank.

The attributes (``padding``, a (lo, hi) pair per axis of x, flat; ``mode``;
``value``), their limits and, along each axis, the source position src(p)
each output position p copies are the family's spec
(``triflux.specs.pad``, whose docstring has every mode's rule). With
i = p - lo along an axis of n elements:

    constant   : x[i] inside (0 <= i < n), value outside
    reflect    : src = -i (i < 0),      2(n-1) - i (i >= n)
    symmetric  : src = -1 - i (i < 0),  2n - 1 - i (i >= n)
    replicate  : src = 0 (i < 0),       n - 1 (i >= n)
    circular   : src = i + n (i < 0),   i - n (i >= n)

    y[p_0, ..., p_{R-1}] = x[src_0(p_0), ..., src_{R-1}(p_{R-1})]

A negative pad crops (torch's F.pad): the same rules with lo < 0, except
circular, which crops x first and wraps what is left.

Values are copied, never computed, so NaN and infinities pass as they are;
the constant fill is ``value`` rounded once to x's dtype. The backward sums,
for each input element, the output gradients of the elements that copied
it, one padded axis at a time (the R-d map is the product of the per-axis
maps), in float32 for float16/bfloat16 (float64 for float64), rounded once.
"""
import numpy as np

from ..specs.pad import pad_spec


def _spec(x, padding, mode, value):
    return pad_spec(np.shape(x), np.asarray(x).dtype, padding, mode, value)


def pad_forward(x, *, padding, mode="constant", value=0.0):
    """y[p] = x[src_0(p_0), ..., src_{R-1}(p_{R-1})], src per axis and mode
    as in the module docstring; mode "constant": y = value outside x, i.e.

        y[lo_0 : lo_0 + n_0, ..., lo_{R-1} : lo_{R-1} + n_{R-1}] = x, value elsewhere.

    The other modes gather along each padded axis in turn (y = x taken at
    src_k along axis k)."""
    x = np.asarray(x)
    spec = _spec(x, padding, mode, value)
    if spec.mode == "constant":
        y = np.full(spec.out_shape, spec.value, dtype=x.dtype)
        y[_copied(spec, "out")] = x[_copied(spec, "in")]
        return y
    y = np.array(x, order="C")                 # a copy (and the identity when nothing is padded)
    for k in spec.padded_axes:
        y = np.take(y, spec.axes[k].source, axis=k)
    return y


def _copied(spec, side):
    """The block of the output ("out") that copies x itself, or that block of x ("in")."""
    blocks = []
    for a in spec.axes:
        first, end = a.copied
        blocks.append(slice(first, end) if side == "out" else slice(first - a.lo, end - a.lo))
    return tuple(blocks)


def _adjoint_along(g, k, axis):
    """The adjoint of ``np.take(., axis.source, axis=k)``:

        out[..., i, ...] = g[..., lo + i, ...] + sum over the pad positions p with src(p) == i of g[..., p, ...]

    (the copy of the block that copies x, zeros where a negative pad cropped
    x, then each padded position's gradient added to the input it copied,
    in order of p)."""
    def at(position):
        return (slice(None),) * k + (position,)
    first, end = axis.copied
    shape = list(g.shape)
    shape[k] = axis.size
    out = np.zeros(shape, dtype=g.dtype)
    out[at(slice(first - axis.lo, end - axis.lo))] = g[at(slice(first, end))]
    for p in [*range(first), *range(end, axis.out)]:
        out[at(int(axis.source[p]))] += g[at(p)]
    return out


def pad_backward(grad, out, x, *, padding, mode="constant", value=0.0):
    """dx[i] = sum of g[p] over the output positions p that copied x[i]
    (src(p) = i along every axis). Mode "constant": the slice of g over x,

        dx = g[lo_0 : lo_0 + n_0, ..., lo_{R-1} : lo_{R-1} + n_{R-1}]

    (the padding's gradient goes to no input; a cropped input gets 0).
    The other modes fold g one
    padded axis k at a time,

        g <- (sum over p with src_k(p) = i of g[..., p, ...])  at i along axis k,

    which is the R-d sum since src acts on each axis separately; the terms
    per axis are lo + i and at most one mirrored or wrapped position in each
    pad (replicate: the edge takes every pad position), see the spec."""
    x = np.asarray(x)
    spec = _spec(x, padding, mode, value)
    g = np.asarray(grad)
    if spec.mode == "constant":
        dx = np.zeros(x.shape, dtype=x.dtype)          # zeros where a negative pad cropped x
        dx[_copied(spec, "in")] = g[_copied(spec, "out")]
        return (dx,)
    acc = g.astype(spec.compute_dtype, copy=False)
    for k in spec.padded_axes:
        acc = _adjoint_along(acc, k, spec.axes[k])
    return (np.array(acc, dtype=x.dtype, order="C"),)
