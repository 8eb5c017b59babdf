"""Convolutions, NumPy reference (forward and backward).

Layout: batch-first NCHW. ``conv2d`` takes ``x`` of shape (N, C, H, W) and a
weight ``w`` of shape (O, C/G, kh, kw) (PyTorch's layout, G = ``groups``);
it is a cross-correlation, as in torch:

    xp = x zero-padded by (top, bottom, left, right)
    y[n, o, p, q] = sum_{c in group(o), i, j}
                    xp[n, c, p*sh + i*dh, q*sw + j*dw] * w[o, c - g(o)*C/G, i, j]

with output sides ``Ho = (H + top + bottom - dh*(kh-1) - 1) // sh + 1`` (and
likewise ``Wo``); output channel ``o`` sees the input channels of its group
``g(o) = o // (O/G)``. Shapes and attributes are checked, and the output
shape derived, by the family's spec (``triflux.specs.conv``).

``conv_transpose2d`` is the adjoint (transpose) of ``conv2d`` with respect to
its input: its forward is conv2d's input gradient, its backward uses conv2d's
forward and conv2d's weight gradient. Nothing is computed twice.

Everything is im2col (a strided view of the padded input, then one copy laid
out as (channel, tap) rows by pixel columns) followed by one ``matmul``, per
group of samples (one sample of a large image, the whole batch of a small
one); the input gradient is one ``matmul`` followed by col2im, one slice-add
per kernel tap (kh*kw of them), never a loop over pixels, or for stride 1 a
forward correlation of the output gradient with the turned kernel. The groups are
independent, so they run on all the threads at once (``_threads``: copies and
products alike); a fused layer's bias, activation and activation derivative
are applied group by group, while the group's block is in cache. How many
samples a group holds depends on the thread count (each thread gets a group),
so sums over groups may round differently on machines with other core counts.
float16/bfloat16 compute in float32 and round once at the end; float32 and
float64 stay as they are.
"""
import math
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..specs.conv import conv2d_bias_act_spec, conv2d_spec, conv_transpose2d_spec
from ._threads import in_parallel, thread_count
from ._activation import activate, through_activation
from ._util import in_compute_dtype


class _Scratch(threading.local):
    """Buffers reused by every group and every call (one set per thread, each
    of ``small`` to ``keep`` bytes): a fresh array of several MB costs a page
    fault per 4 KB each time it is first written, as much as the copies into
    it (small arrays come from memory malloc keeps, at no such cost)."""
    small, keep = 1 << 20, 64 << 20

    def array(self, name, shape, dtype):
        """A scratch array of ``shape`` (its contents are garbage), valid until
        the next request of ``name``."""
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size < self.small:
            return np.empty(shape, dtype)
        memory = self.__dict__.get(name)
        if memory is None or memory.size < size:
            memory = np.empty(size, np.uint8)
            if size <= self.keep:
                self.__dict__[name] = memory
        return memory[:size].view(dtype).reshape(shape)


_SCRATCH = _Scratch()


def _padded(x, padding):
    """x zero-padded by (top, bottom, left, right) on its last two axes (in
    scratch memory: valid until the next call)."""
    pt, pb, pl, pr = padding
    if not any(padding):
        return x
    N, C, H, W = x.shape
    xp = _SCRATCH.array("padded", (N, C, H + pt + pb, W + pl + pr), x.dtype)
    xp[:, :, :pt] = xp[:, :, pt + H:] = xp[:, :, :, :pl] = xp[:, :, :, pl + W:] = 0
    xp[:, :, pt: pt + H, pl: pl + W] = x
    return xp


def _windows(xp, spec):
    """im2col as a view: (N, C, kh, kw, Ho, Wo) with
    ``cols[n, c, i, j, p, q] = xp[n, c, p*sh + i*dh, q*sw + j*dw]``,
    for the zero-padded input xp: a step along i is dh rows of xp, along p
    sh rows (likewise j, q along the columns), so the view is xp's memory
    read with those strides (``as_strided``; it never reads past xp)."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel_size, spec.stride, spec.dilation
    Ho, Wo = spec.out_shape[2:]
    assert (Ho - 1) * sh + (kh - 1) * dh < xp.shape[2] and (Wo - 1) * sw + (kw - 1) * dw < xp.shape[3]
    n, c, rows, cols = xp.strides
    return as_strided(xp, (xp.shape[0], xp.shape[1], kh, kw, Ho, Wo),
                      (n, c, dh * rows, dw * cols, sh * rows, sw * cols), writeable=False)


#: the products run over groups of whole samples with at least this many output
#: pixels: one sample of a large image, the whole batch of a small one. A group's
#: im2col matrix stays a few MB, and a deep layer with few pixels still reads its
#: weights once per batch, not once per sample.
_GROUP_PIXELS = 2048


def _sample_groups(n, pixels):
    """Slices of consecutive samples (of ``n``), each with ``_GROUP_PIXELS`` or
    more output ``pixels`` (the last one fewer), and at least as many groups as
    the threads that run them (``_threads``) where there are enough samples."""
    per = min(max(1, -(-_GROUP_PIXELS // max(pixels, 1))), max(1, -(-n // thread_count())))
    return [slice(start, min(start + per, n)) for start in range(0, n, per)]


def _im2col(xp, spec):
    """The im2col matrices (G, Cg*kh*kw, S*Ho*Wo) of a group of S samples of
    the padded input xp: rows (c, i, j) of group g, columns the output pixels
    (n, p, q), so one matrix product serves all S samples. The copy into the
    scratch buffer is the one copy im2col makes; its inner axis runs along an
    image row."""
    view = _windows(xp, spec).transpose(1, 2, 3, 0, 4, 5)   # (C, kh, kw, S, Ho, Wo)
    cols = _SCRATCH.array("cols", view.shape, xp.dtype)
    np.copyto(cols, view)
    C, kh, kw = view.shape[:3]
    return cols.reshape(spec.groups, C // spec.groups * kh * kw, -1)


def _batch_inside(g, groups):
    """g (S, O, Ho, Wo) as (G, O/G, S*Ho*Wo), the layout of the im2col columns."""
    S, O, Ho, Wo = g.shape
    return g.reshape(S, groups, O // groups, Ho * Wo).transpose(1, 2, 0, 3).reshape(groups, O // groups, S * Ho * Wo)


def _conv2d(x, w, spec, bias=None, activation="identity"):
    """The forward formula (module docstring), in the compute dtype, for x
    of the spec's input shape; with ``bias`` and ``activation``,
    act(conv2d(x, w) + b), added to each group's output while it is in cache."""
    N = x.shape[0]
    O, Cg, kh, kw = w.shape
    G = spec.groups
    Ho, Wo = spec.out_shape[2:]
    wm = w.reshape(G, O // G, Cg * kh * kw)
    y = np.empty((N, O, Ho, Wo), dtype=x.dtype)

    def group(s):
        # the weights (G, O/G, Cg*kh*kw) times the im2col matrix (G, Cg*kh*kw, S*Ho*Wo):
        # y[g, o, (n, p, q)] = sum_{(c, i, j)} w[g, o, (c, i, j)] * cols[g, (c, i, j), (n, p, q)]
        z = np.matmul(wm, _im2col(_padded(x[s], spec.padding), spec)).reshape(O, -1, Ho, Wo).transpose(1, 0, 2, 3)
        if bias is not None:
            z += bias.reshape(1, -1, 1, 1)
        activate(z, activation, out=y[s])
    in_parallel(group, _sample_groups(N, Ho * Wo))
    return y


#: the fewest output pixels in a batch for which the input gradient is a correlation
#: with the turned kernel (:func:`_flipped_correlation`)
_TURNED_PIXELS = 1024


def _flipped_correlation(g_shape, w, spec):
    """For stride 1, conv2d's input gradient is itself a correlation: of g
    zero-padded by (dh*(kh-1) - top, ...) on each side, with the kernel turned
    by 180 degrees and its two channel axes swapped (per group),

        dx[n, c, h, v] = sum_{o, i, j} gp[n, o, h + i*dh, v + j*dw] * w[o, c', kh-1-i, kw-1-j]

    Returns that weight (C, O/G, kh, kw) and the correlation's spec, or None
    where col2im serves: strides; padding past the kernel's reach; weights
    that are not all finite (the padding's zeros would multiply them: 0 * inf
    is NaN); more output than input channels (fewer rows for the product) on
    images wider than 8, where col2im's slice-adds run long enough; and
    batches of fewer than ``_TURNED_PIXELS`` output pixels, where turning the
    kernel (a copy of the weights) costs as much as the products. Measured on
    two cores, a layer's whole backward took 0.6-1.0x of its time with
    col2im on the UNets' and the Chain's layers it is chosen for."""
    O, Cg, kh, kw = w.shape
    (dh, dw), G = spec.dilation, spec.groups
    pt, _, pl, _ = spec.padding
    _, C, H, W = spec.x_shape
    Ho, Wo = g_shape[2:]
    # the padding that gives H x W outputs; g may lack rows/columns no input reaches (conv_transpose2d)
    padding = (dh * (kh - 1) - pt, H + pt - Ho, dw * (kw - 1) - pl, W + pl - Wo)
    if (spec.stride != (1, 1) or min(padding) < 0 or (Cg < O // G and Wo > 8)
            or g_shape[0] * Ho * Wo < _TURNED_PIXELS or not bool(np.isfinite(w).all())):
        return None
    flipped = w.reshape(G, O // G, Cg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(C, O // G, kh, kw)
    flipped = np.ascontiguousarray(flipped[:, :, ::-1, ::-1])
    return flipped, conv2d_spec(g_shape, flipped.shape, w.dtype, w.dtype, (1, 1), padding, spec.dilation, G)


def _input_grad_buffer(g, w, spec):
    """The padded input gradient dxp for :func:`_add_input_grad` (not yet
    zeroed: each group zeroes its own samples, on its thread) and whether
    col2im runs along the image rows laid end to end (``runs``)."""
    N, C, H, W = spec.x_shape
    (pt, pb, pl, pr), Wo = spec.padding, g.shape[3]
    Hp, Wp = H + pt + pb, W + pl + pr
    # Stride 1: with the rows of the padded image laid end to end, tap (i, j) moves
    # every output pixel by the same i*dh*Wp + j*dw, so its slice-add is one long
    # run per channel. g gets zero columns up to the padded width Wp; their
    # products (exact zeros for finite weights) land on pixels real ones reach too.
    # Worth it for wide images only, where those columns add few products.
    runs = spec.stride == (1, 1) and 16 * (Wp - Wo) <= Wo and bool(np.isfinite(w).all())
    return np.empty((N, C, Hp + int(runs), Wp), dtype=g.dtype), runs    # (runs: a spare row for the last run)


def _add_input_grad(dxp, runs, g, w, spec):
    """col2im of a group of samples: zeroes their padded dxp (S, C, Hp (+ 1), Wp)
    and adds conv2d's input gradient for their output gradient g (S, O, Ho, Wo)
    into it (the formula at :func:`_conv2d_input_grad`)."""
    dxp[...] = 0
    S, C, _, Wp = dxp.shape
    O, Cg, kh, kw = w.shape
    G, (sh, sw), (dh, dw) = spec.groups, spec.stride, spec.dilation
    Ho, Wo = g.shape[2:]
    if runs:                                                   # g's rows widened to Wp by zeros
        gw = _SCRATCH.array("g", (S, O, Ho, Wp), g.dtype)
        gw[..., :Wo], gw[..., Wo:] = g, 0
        g = gw
    dcols = _SCRATCH.array("cols", (G, Cg * kh * kw, S * Ho * g.shape[3]), g.dtype)
    np.matmul(w.reshape(G, O // G, Cg * kh * kw).transpose(0, 2, 1), _batch_inside(g, G), out=dcols)
    dcols = dcols.reshape(C, kh, kw, S, Ho, g.shape[3])
    d = dxp.transpose(1, 0, 2, 3)                              # (C, S, Hp (+ 1), Wp), a view
    rows = dxp.reshape(S, C, -1).transpose(1, 0, 2)            # the same with its rows end to end
    for i in range(kh):
        for j in range(kw):
            if runs:
                start = i * dh * Wp + j * dw
                rows[:, :, start: start + Ho * Wp] += dcols[:, i, j].reshape(C, S, Ho * Wp)
            else:
                d[:, :, i * dh: i * dh + sh * (Ho - 1) + 1: sh,
                  j * dw: j * dw + sw * (Wo - 1) + 1: sw] += dcols[:, i, j]


def _cropped(dxp, spec):
    """dx: the padded input gradient with the padding cropped off (a view)."""
    (pt, _, pl, _), (H, W) = spec.padding, spec.x_shape[2:]
    return dxp[:, :, pt: pt + H, pl: pl + W]


def _conv2d_input_grad(g, w, spec):
    """dL/dx of conv2d for dL/dy = g (N, O, Ho, Wo):

        dcols[c, i, j, n, p, q] = sum_{o in group(c)} w[o, c', i, j] * g[n, o, p, q]
        dxp[n, c, p*sh + i*dh, q*sw + j*dw] += dcols[c, i, j, n, p, q]     (col2im)
        dx = dxp with the padding cropped off

    (per group of samples one matmul, then one slice-add per kernel tap (i, j)),
    or for stride 1 the same sums as a forward correlation (:func:`_flipped_correlation`).
    This is also conv_transpose2d's forward, whose ``g`` may lack the
    bottom/right rows and columns of the spec's output that no input position reaches."""
    flipped = _flipped_correlation(g.shape, w, spec)
    if flipped is not None:
        return _conv2d(g, *flipped)
    dxp, runs = _input_grad_buffer(g, w, spec)
    in_parallel(lambda s: _add_input_grad(dxp[s], runs, g[s], w, spec),
                         _sample_groups(g.shape[0], g.shape[2] * g.shape[3]))
    return _cropped(dxp, spec)


def _weight_grad_part(x, g, spec):
    """The weight gradient's sum over one group of samples, x (S, C, H, W) and
    g (S, O, Ho, Wo), as one product over their (n, p, q) together:
    dw[g, o, (c, i, j)] = sum_{(n, p, q)} g[g, o, (n, p, q)] * cols[g, (c, i, j), (n, p, q)]."""
    cols, gs = _im2col(_padded(x, spec.padding), spec), _batch_inside(g, spec.groups)
    if cols.shape[2] >= cols.shape[1]:     # more pixels than rows: BLAS runs the same sums
        return np.matmul(cols, gs.transpose(0, 2, 1)).transpose(0, 2, 1)   # as dw^T = cols g^T, 10-20% faster
    return np.matmul(gs, cols.transpose(0, 2, 1))


def _in_order(parts, empty):
    """The sum of the groups' ``parts`` (new arrays, the first one overwritten),
    added in order (``empty`` with none)."""
    total = empty() if not parts else parts[0]
    for part in parts[1:]:
        total += part
    return total


def _weight_grad(parts, spec, dtype):
    """dw from the groups' parts, in the weight's memory layout."""
    return np.ascontiguousarray(_in_order(parts, lambda: np.zeros(spec.w_shape, dtype))).reshape(spec.w_shape)


def _conv2d_weight_grad(x, g, spec):
    """dL/dw of conv2d for dL/dy = g:

        dw[o, c', i, j] = sum_{n, p, q} g[n, o, p, q] * xp[n, g(o)*C/G + c', p*sh + i*dh, q*sw + j*dw]
    """
    parts = in_parallel(lambda s: _weight_grad_part(x[s], g[s], spec),
                                 _sample_groups(x.shape[0], g.shape[2] * g.shape[3]))
    return _weight_grad(parts, spec, g.dtype)


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w): the cross-correlation of the module docstring,
    ``y[n, o, p, q] = sum_{c, i, j} xp[n, c, p*sh + i*dh, q*sw + j*dw] * w[o, c, i, j]``
    (c over the group of o). Output (N, O, Ho, Wo) in x's dtype."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    xc, wc = in_compute_dtype(x, w)
    return _conv2d(xc, wc, spec).astype(x.dtype, copy=False)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                    needs=(True, True)):
    """Adjoint of y = conv2d(x, w) with G = dL/dy (``needs`` says which of
    (dx, dw) to compute; the other is None: a first layer's dx nobody uses):

        dx[n, c, h, v] = sum_{o, i, j : h + top = p*sh + i*dh, v + left = q*sw + j*dw} G[n, o, p, q] w[o, c', i, j]
                         (conv_transpose2d(G, w), the "full" correlation with the flipped kernel)
        dw[o, c', i, j] = sum_{n, p, q} G[n, o, p, q] xp[n, c, p*sh + i*dh, q*sw + j*dw]
    """
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    gc, xc, wc = in_compute_dtype(grad, x, w)
    dx, dw, _ = _backward_by_groups(gc, None, xc, wc, spec, "identity", tuple(needs) + (False,))
    return (None if dx is None else dx.astype(x.dtype, copy=False),
            None if dw is None else dw.astype(w.dtype, copy=False))


def conv_transpose2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                             dilation=(1, 1), groups=1):
    """y = conv_transpose2d(x, w), x (N, Cin, H, W), w (Cin, O/G, kh, kw): the
    adjoint of conv2d (weight w read as a conv2d weight of Cin outputs and O/G
    inputs per group) with the same stride/padding/dilation/groups:

        y = dL/dz of z = conv2d(u, w) at dL/dz = x, for u of shape (N, O, Ho, Wo),
        Ho = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1.

    output_padding (below the stride or the dilation) adds rows/columns at the
    bottom/right, as torch."""
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    xc, wc = in_compute_dtype(x, w)
    y = _conv2d_input_grad(xc, wc, spec.adjoint)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


def conv_transpose2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0),
                              output_padding=(0, 0), dilation=(1, 1), groups=1, needs=(True, True)):
    """Adjoint of y = conv_transpose2d(x, w) = A_w^T x (A_w: conv2d by w), G = dL/dy
    (``needs``: which of (dx, dw) to compute; the other is None):

        dx = A_w G = conv2d(G, w)                       (the same stride, padding, ...)
        dw = conv2d's weight gradient with input G and output gradient x:
        dw[c, o', i, j] = sum_{n, p, q} x[n, c, p, q] Gp[n, o, p*sh + i*dh, q*sw + j*dw]
    """
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    gc, xc, wc = in_compute_dtype(grad, x, w)
    # An output_padding of a stride or more (allowed below the dilation) adds whole
    # rows/columns that no input position reaches: conv2d(G) then has spec.extra
    # more positions, which are cut off (dx) or met by zero gradients (dw).
    H, W = x.shape[2:]
    dx = _conv2d(gc, wc, spec.adjoint)[:, :, :H, :W].astype(x.dtype, copy=False) if needs[0] else None
    if not needs[1]:
        return dx, None
    if spec.extra != (0, 0):
        xc = np.pad(xc, ((0, 0), (0, 0), (0, spec.extra[0]), (0, spec.extra[1])))
    return dx, _conv2d_weight_grad(gc, xc, spec.adjoint).astype(w.dtype, copy=False)


# --- conv2d with bias and activation fused (one primitive) -----------------------------------

def conv2d_bias_act_forward(x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                            activation="identity"):
    """y = act(conv2d(x, w) + b), one primitive (a Conv layer's whole forward):

        y[n, o, p, q] = act(z[n, o, p, q]),  z[n, o, p, q] = conv2d(x, w)[n, o, p, q] + b[o]

    with act one of the declared fusable activations, identity, relu
    (max(z, 0)), sigmoid (1 / (1 + exp(-z))) and tanh: those whose derivative
    is a function of y alone, so the backward needs only the output. Computed
    in float32 for half-precision inputs and rounded once; output
    (N, O, Ho, Wo) in x's dtype."""
    spec = conv2d_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                                stride, padding, dilation, groups, activation)
    xc, wc, bc = in_compute_dtype(x, w, b)
    return _conv2d(xc, wc, spec, bc, activation).astype(x.dtype, copy=False)


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity", needs=(True, True, True)):
    """Adjoint of y = act(conv2d(x, w) + b) with G = dL/dy, from the output y
    (``needs``: which of (dx, dw, db) to compute; the others are None):

        gz[n, o, p, q] = G[n, o, p, q] * act'(y[n, o, p, q])
                         (identity: 1; relu: [not y <= 0]; sigmoid: y (1 - y); tanh: 1 - y^2)
        db[o]          = sum_{n, p, q} gz[n, o, p, q]
        (dx, dw)       = conv2d's adjoint (conv2d_backward) at the output gradient gz
    """
    spec = conv2d_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                                stride, padding, dilation, groups, activation)
    xc, wc, g, y = in_compute_dtype(x, w, grad, out)
    dx, dw, db = _backward_by_groups(g, y, xc, wc, spec, activation, needs)
    return (None if dx is None else dx.astype(x.dtype, copy=False),
            None if dw is None else dw.astype(w.dtype, copy=False),
            None if db is None else db.astype(np.asarray(b).dtype, copy=False))


def _backward_by_groups(g, y, x, w, spec, activation, needs):
    """(dx, dw, db) of y = act(conv2d(x, w) + b) for the output gradient g (in
    the compute dtype; ``y`` serves act' only, None for identity), those in
    ``needs`` (None for the others): one section of groups of samples, each
    taking its gz = g * act'(y) through the input gradient, the weight
    gradient's product and the bias sum while gz is in cache."""
    flipped = _flipped_correlation(g.shape, w, spec) if needs[0] else None
    dx = np.empty(spec.x_shape, g.dtype) if flipped is not None else None
    if needs[0] and flipped is None:
        dxp, runs = _input_grad_buffer(g, w, spec)

    def group(s):
        gz = g[s] if activation == "identity" else through_activation(g[s], y[s], activation)
        if flipped is not None:
            dx[s] = _conv2d(gz, *flipped)
        elif needs[0]:
            _add_input_grad(dxp[s], runs, gz, w, spec)
        return (gz.sum(axis=(0, 2, 3)) if needs[2] else None,
                _weight_grad_part(x[s], gz, spec) if needs[1] else None)
    parts = in_parallel(group, _sample_groups(g.shape[0], g.shape[2] * g.shape[3]))
    if needs[0] and flipped is None:
        dx = _cropped(dxp, spec)
    dw = _weight_grad([p[1] for p in parts], spec, g.dtype) if needs[1] else None
    db = _in_order([p[0] for p in parts], lambda: np.zeros(spec.w_shape[0], g.dtype)) if needs[2] else None
    return dx, dw, db
