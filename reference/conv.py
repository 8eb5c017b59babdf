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

Everything is im2col (``sliding_window_view``, a view, then one reshaped copy
laid out as (channel, tap) rows by pixel columns) followed by one batched
``matmul``; the input gradient is one ``matmul`` followed by col2im, one
slice-add per kernel tap (kh*kw of them), never a loop over pixels. float16/bfloat16 compute in
float32 and round once at the end; float32 and float64 stay as they are.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..specs.conv import conv2d_bias_act_spec, conv2d_spec, conv_transpose2d_spec
from ._util import in_compute_dtype


def _padded(x, padding):
    """x zero-padded by (top, bottom, left, right) on its last two axes."""
    pt, pb, pl, pr = padding
    if not any(padding):
        return x
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=x.dtype)
    xp[:, :, pt: pt + H, pl: pl + W] = x
    return xp


def _windows(x, spec):
    """im2col as a view: (N, C, kh, kw, Ho, Wo) with
    ``cols[n, c, i, j, p, q] = xp[n, c, p*sh + i*dh, q*sw + j*dw]``,
    for x of the spec's input shape."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel_size, spec.stride, spec.dilation
    Ho, Wo = spec.out_shape[2:]
    xp = _padded(x, spec.padding)
    ext_h, ext_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    win = sliding_window_view(xp, (ext_h, ext_w), axis=(2, 3))   # (N, C, Hp', Wp', ext_h, ext_w)
    win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :Ho, :Wo]
    return win.transpose(0, 1, 4, 5, 2, 3)


def _im2col(x, spec):
    """The im2col matrices (G, Cg*kh*kw, N*Ho*Wo): rows (c, i, j) of group g,
    columns the output pixels (n, p, q) of the whole batch, so one matrix
    product per group serves every sample (a deep layer with few pixels
    then reads its weights once, not once per sample). This reshape is the
    one copy im2col makes; its inner axis runs along an image row."""
    cols = _windows(x, spec)                                      # (N, C, kh, kw, Ho, Wo)
    N, C, kh, kw, Ho, Wo = cols.shape
    G = spec.groups
    return cols.transpose(1, 2, 3, 0, 4, 5).reshape(G, C // G * kh * kw, N * Ho * Wo)


def _batch_inside(g, groups):
    """g (N, O, Ho, Wo) as (G, O/G, N*Ho*Wo), the layout of _im2col's columns."""
    N, O, Ho, Wo = g.shape
    return g.reshape(N, groups, O // groups, Ho * Wo).transpose(1, 2, 0, 3).reshape(groups, O // groups, N * Ho * Wo)


def _conv2d(x, w, spec):
    """The forward formula (module docstring), in the compute dtype, for x
    of the spec's input shape."""
    N = x.shape[0]
    O, Cg, kh, kw = w.shape
    G = spec.groups
    Ho, Wo = spec.out_shape[2:]
    cols = _im2col(x, spec)
    # the weights (G, O/G, Cg*kh*kw) times the im2col matrix (G, Cg*kh*kw, N*Ho*Wo):
    # y[g, o, (n, p, q)] = sum_{(c, i, j)} w[g, o, (c, i, j)] * cols[g, (c, i, j), (n, p, q)]
    y = np.matmul(w.reshape(G, O // G, Cg * kh * kw), cols)       # (G, O/G, N*Ho*Wo)
    return np.ascontiguousarray(y.reshape(O, N, Ho, Wo).transpose(1, 0, 2, 3))


def _conv2d_input_grad(g, w, spec):
    """dL/dx of conv2d for dL/dy = g (N, O, Ho, Wo):

        dcols[c, i, j, n, p, q] = sum_{o in group(c)} w[o, c', i, j] * g[n, o, p, q]
        dxp[n, c, p*sh + i*dh, q*sw + j*dw] += dcols[c, i, j, n, p, q]     (col2im)
        dx = dxp with the padding cropped off

    (one matmul, then one slice-add per kernel tap (i, j)). This is also
    conv_transpose2d's forward, whose ``g`` may lack the bottom/right rows
    and columns of the spec's output that no input position reaches."""
    N, C, H, W = spec.x_shape
    O, Cg, kh, kw = w.shape
    G = spec.groups
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = spec.stride, spec.padding, spec.dilation
    Ho, Wo = g.shape[2], g.shape[3]
    wt = w.reshape(G, O // G, Cg * kh * kw).transpose(0, 2, 1)   # (G, Cg*kh*kw, O/G)
    dcols = np.matmul(wt, _batch_inside(g, G)).reshape(C, kh, kw, N, Ho, Wo)
    dxp = np.zeros((C, N, H + pt + pb, W + pl + pr), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh: i * dh + sh * (Ho - 1) + 1: sh,
                j * dw: j * dw + sw * (Wo - 1) + 1: sw] += dcols[:, i, j]
    return dxp[:, :, pt: pt + H, pl: pl + W].transpose(1, 0, 2, 3)


def _conv2d_weight_grad(x, g, spec):
    """dL/dw of conv2d for dL/dy = g:

        dw[o, c', i, j] = sum_{n, p, q} g[n, o, p, q] * xp[n, g(o)*C/G + c', p*sh + i*dh, q*sw + j*dw]
    """
    cols = _im2col(x, spec)
    # one product over (n, p, q) together:
    # dw[g, o, (c, i, j)] = sum_{(n, p, q)} g[g, o, (n, p, q)] * cols[g, (c, i, j), (n, p, q)]
    dw = np.matmul(_batch_inside(g, spec.groups), cols.transpose(0, 2, 1))   # (G, O/G, Cg*kh*kw)
    return dw.reshape(spec.w_shape)


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w): the cross-correlation of the module docstring,
    ``y[n, o, p, q] = sum_{c, i, j} xp[n, c, p*sh + i*dh, q*sw + j*dw] * w[o, c, i, j]``
    (c over the group of o). Output (N, O, Ho, Wo) in x's dtype."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    xc, wc = in_compute_dtype(x, w)
    return _conv2d(xc, wc, spec).astype(x.dtype, copy=False)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Adjoint of y = conv2d(x, w) with G = dL/dy:

        dx[n, c, h, v] = sum_{o, i, j : h + top = p*sh + i*dh, v + left = q*sw + j*dw} G[n, o, p, q] w[o, c', i, j]
                         (conv_transpose2d(G, w), the "full" correlation with the flipped kernel)
        dw[o, c', i, j] = sum_{n, p, q} G[n, o, p, q] xp[n, c, p*sh + i*dh, q*sw + j*dw]
    """
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    gc, xc, wc = in_compute_dtype(grad, x, w)
    dx = _conv2d_input_grad(gc, wc, spec)
    dw = _conv2d_weight_grad(xc, gc, spec)
    return dx.astype(x.dtype, copy=False), dw.astype(w.dtype, copy=False)


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
                              output_padding=(0, 0), dilation=(1, 1), groups=1):
    """Adjoint of y = conv_transpose2d(x, w) = A_w^T x (A_w: conv2d by w), G = dL/dy:

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
    dx = _conv2d(gc, wc, spec.adjoint)[:, :, :H, :W]
    if spec.extra != (0, 0):
        xc = np.pad(xc, ((0, 0), (0, 0), (0, spec.extra[0]), (0, spec.extra[1])))
    dw = _conv2d_weight_grad(gc, xc, spec.adjoint)
    return dx.astype(x.dtype, copy=False), dw.astype(w.dtype, copy=False)


# --- conv2d with bias and activation fused (one primitive) -----------------------------------

def _activate(z, activation):
    """act(z): identity z; relu max(z, 0); sigmoid 1 / (1 + exp(-z)); tanh."""
    if activation == "relu":
        return np.maximum(z, 0)          # (NaN stays NaN, as torch.relu)
    if activation == "sigmoid":
        e = np.exp(-np.abs(z))          # <= 1: no overflow for large |z|
        return np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    if activation == "tanh":
        return np.tanh(z)
    return z


def _activation_derivative(y, activation):
    """act'(z) written in y = act(z): identity 1; relu [not y <= 0] (relu'(0) = 0
    and 1 at NaN, as torch's threshold_backward); sigmoid y (1 - y); tanh 1 - y^2."""
    if activation == "relu":
        return np.where(y <= 0, 0, 1).astype(y.dtype)
    if activation == "sigmoid":
        return y * (1 - y)
    if activation == "tanh":
        return 1 - y * y
    return np.ones_like(y)


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
    z = _conv2d(xc, wc, spec) + bc.reshape(1, -1, 1, 1)
    return _activate(z, activation).astype(x.dtype, copy=False)


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity"):
    """Adjoint of y = act(conv2d(x, w) + b) with G = dL/dy, from the output y:

        gz[n, o, p, q] = G[n, o, p, q] * act'(y[n, o, p, q])
                         (identity: 1; relu: [not y <= 0]; sigmoid: y (1 - y); tanh: 1 - y^2)
        db[o]          = sum_{n, p, q} gz[n, o, p, q]
        (dx, dw)       = conv2d's adjoint (conv2d_backward) at the output gradient gz
    """
    spec = conv2d_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                                stride, padding, dilation, groups, activation)
    xc, wc, g, y = in_compute_dtype(x, w, grad, out)
    gz = g * _activation_derivative(y, activation)
    db = gz.sum(axis=(0, 2, 3))
    dx, dw = _conv2d_input_grad(gz, wc, spec), _conv2d_weight_grad(xc, gz, spec)
    return dx.astype(x.dtype, copy=False), dw.astype(w.dtype, copy=False), db.astype(np.asarray(b).dtype, copy=False)
