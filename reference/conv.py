"""Convolutions, NumPy reference (forward and backward).

Layout: batch-first NCHW. ``conv2d`` takes ``x`` of shape (N, C, H, W) and a
weight ``w`` of shape (O, C/G, kh, kw) (PyTorch's layout, G = ``groups``);
it is a cross-correlation, as in torch:

    xp = x zero-padded by (top, bottom, left, right)
    y[n, o, p, q] = sum_{c in group(o), i, j}
                    xp[n, c, p*sh + i*dh, q*sw + j*dw] * w[o, c - g(o)*C/G, i, j]

with output sides ``Ho = (H + top + bottom - dh*(kh-1) - 1) // sh + 1`` (and
likewise ``Wo``); output channel ``o`` sees the input channels of its group
``g(o) = o // (O/G)``.

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

from ..errors import DTypeError, ShapeError
from ._util import in_compute_dtype


def _out_side(n, lo, hi, k, s, d):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


def _check(x, w, groups):
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv needs x of shape (N, C, H, W) and w of 4 dimensions, got "
                         f"{x.shape} and {w.shape}")
    if x.dtype != w.dtype:
        raise DTypeError(f"conv of {x.dtype} and {w.dtype}: convert one of them first")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise ShapeError(f"groups={groups} must divide the channels of x {x.shape} and of w {w.shape}")


def _padded(x, padding):
    """x zero-padded by (top, bottom, left, right) on its last two axes."""
    pt, pb, pl, pr = padding
    if not any(padding):
        return x
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=x.dtype)
    xp[:, :, pt: pt + H, pl: pl + W] = x
    return xp


def _windows(x, w_shape, stride, padding, dilation):
    """im2col as a view: (N, C, kh, kw, Ho, Wo) with
    ``cols[n, c, i, j, p, q] = xp[n, c, p*sh + i*dh, q*sw + j*dw]``."""
    kh, kw = w_shape[2], w_shape[3]
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    N, C, H, W = x.shape
    Ho = _out_side(H, pt, pb, kh, sh, dh)
    Wo = _out_side(W, pl, pr, kw, sw, dw)
    if Ho < 1 or Wo < 1:
        raise ShapeError(f"conv: the padded input {x.shape} is smaller than the dilated kernel "
                         f"{(kh, kw)} (dilation {dilation}, padding {padding})")
    xp = _padded(x, padding)
    ext_h, ext_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    win = sliding_window_view(xp, (ext_h, ext_w), axis=(2, 3))   # (N, C, Hp', Wp', ext_h, ext_w)
    win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :Ho, :Wo]
    return win.transpose(0, 1, 4, 5, 2, 3)


def _im2col(x, w_shape, stride, padding, dilation, groups):
    """The im2col matrices (G, Cg*kh*kw, N*Ho*Wo): rows (c, i, j) of group g,
    columns the output pixels (n, p, q) of the whole batch, so one matrix
    product per group serves every sample (a deep layer with few pixels
    then reads its weights once, not once per sample). This reshape is the
    one copy im2col makes; its inner axis runs along an image row."""
    cols = _windows(x, w_shape, stride, padding, dilation)        # (N, C, kh, kw, Ho, Wo)
    N, C, kh, kw, Ho, Wo = cols.shape
    return cols.transpose(1, 2, 3, 0, 4, 5).reshape(groups, C // groups * kh * kw, N * Ho * Wo), (Ho, Wo)


def _batch_inside(g, groups):
    """g (N, O, Ho, Wo) as (G, O/G, N*Ho*Wo), the layout of _im2col's columns."""
    N, O, Ho, Wo = g.shape
    return g.reshape(N, groups, O // groups, Ho * Wo).transpose(1, 2, 0, 3).reshape(groups, O // groups, N * Ho * Wo)


def _conv2d(x, w, stride, padding, dilation, groups):
    """The forward formula (module docstring), in the compute dtype."""
    N = x.shape[0]
    O, Cg, kh, kw = w.shape
    G = groups
    cols, (Ho, Wo) = _im2col(x, w.shape, stride, padding, dilation, G)
    # the weights (G, O/G, Cg*kh*kw) times the im2col matrix (G, Cg*kh*kw, N*Ho*Wo):
    # y[g, o, (n, p, q)] = sum_{(c, i, j)} w[g, o, (c, i, j)] * cols[g, (c, i, j), (n, p, q)]
    y = np.matmul(w.reshape(G, O // G, Cg * kh * kw), cols)       # (G, O/G, N*Ho*Wo)
    return np.ascontiguousarray(y.reshape(O, N, Ho, Wo).transpose(1, 0, 2, 3))


def _conv2d_input_grad(g, w, x_shape, stride, padding, dilation, groups):
    """dL/dx of conv2d for dL/dy = g (N, O, Ho, Wo):

        dcols[c, i, j, n, p, q] = sum_{o in group(c)} w[o, c', i, j] * g[n, o, p, q]
        dxp[n, c, p*sh + i*dh, q*sw + j*dw] += dcols[c, i, j, n, p, q]     (col2im)
        dx = dxp with the padding cropped off

    (one matmul, then one slice-add per kernel tap (i, j)). This is also
    conv_transpose2d's forward."""
    N, C, H, W = x_shape
    O, Cg, kh, kw = w.shape
    G = groups
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    Ho, Wo = g.shape[2], g.shape[3]
    wt = w.reshape(G, O // G, Cg * kh * kw).transpose(0, 2, 1)   # (G, Cg*kh*kw, O/G)
    dcols = np.matmul(wt, _batch_inside(g, G)).reshape(C, kh, kw, N, Ho, Wo)
    dxp = np.zeros((C, N, H + pt + pb, W + pl + pr), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh: i * dh + sh * (Ho - 1) + 1: sh,
                j * dw: j * dw + sw * (Wo - 1) + 1: sw] += dcols[:, i, j]
    return dxp[:, :, pt: pt + H, pl: pl + W].transpose(1, 0, 2, 3)


def _conv2d_weight_grad(x, g, w_shape, stride, padding, dilation, groups):
    """dL/dw of conv2d for dL/dy = g:

        dw[o, c', i, j] = sum_{n, p, q} g[n, o, p, q] * xp[n, g(o)*C/G + c', p*sh + i*dh, q*sw + j*dw]
    """
    O, Cg, kh, kw = w_shape
    cols, _ = _im2col(x, w_shape, stride, padding, dilation, groups)
    # one product over (n, p, q) together:
    # dw[g, o, (c, i, j)] = sum_{(n, p, q)} g[g, o, (n, p, q)] * cols[g, (c, i, j), (n, p, q)]
    dw = np.matmul(_batch_inside(g, groups), cols.transpose(0, 2, 1))   # (G, O/G, Cg*kh*kw)
    return dw.reshape(O, Cg, kh, kw)


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w): the cross-correlation of the module docstring,
    ``y[n, o, p, q] = sum_{c, i, j} xp[n, c, p*sh + i*dh, q*sw + j*dw] * w[o, c, i, j]``
    (c over the group of o). Output (N, O, Ho, Wo) in x's dtype."""
    _check(x, w, groups)
    if x.shape[1] // groups != w.shape[1]:
        raise ShapeError(f"conv2d: w {w.shape} needs C/groups = {x.shape[1] // groups} input channels")
    xc, wc = in_compute_dtype(x, w)
    return _conv2d(xc, wc, stride, padding, dilation, groups).astype(x.dtype, copy=False)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Adjoint of y = conv2d(x, w) with G = dL/dy:

        dx[n, c, h, v] = sum_{o, i, j : h + top = p*sh + i*dh, v + left = q*sw + j*dw} G[n, o, p, q] w[o, c', i, j]
                         (conv_transpose2d(G, w), the "full" correlation with the flipped kernel)
        dw[o, c', i, j] = sum_{n, p, q} G[n, o, p, q] xp[n, c, p*sh + i*dh, q*sw + j*dw]
    """
    gc, xc, wc = in_compute_dtype(grad, x, w)
    dx = _conv2d_input_grad(gc, wc, x.shape, stride, padding, dilation, groups)
    dw = _conv2d_weight_grad(xc, gc, w.shape, stride, padding, dilation, groups)
    return dx.astype(x.dtype, copy=False), dw.astype(w.dtype, copy=False)


def _transpose_out_shape(x, w, stride, padding, output_padding, dilation, groups):
    N, Cin, H, W = x.shape
    _, Og, kh, kw = w.shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw), (oph, opw) = stride, padding, dilation, output_padding
    # torch's rule: each side of output_padding below its stride or its dilation
    if not (0 <= oph < max(sh, dh) and 0 <= opw < max(sw, dw)):
        raise ShapeError(f"conv_transpose2d: output_padding {output_padding} must be smaller than "
                         f"the stride {stride} or the dilation {dilation} on each axis")
    Ho = (H - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
    Wo = (W - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
    if Ho < 1 or Wo < 1:
        raise ShapeError(f"conv_transpose2d: the padding {padding} crops the whole output")
    return (N, Og * groups, Ho, Wo)


def conv_transpose2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                             dilation=(1, 1), groups=1):
    """y = conv_transpose2d(x, w), x (N, Cin, H, W), w (Cin, O/G, kh, kw): the
    adjoint of conv2d (weight w read as a conv2d weight of Cin outputs and O/G
    inputs per group) with the same stride/padding/dilation/groups:

        y = dL/dz of z = conv2d(u, w) at dL/dz = x, for u of shape (N, O, Ho, Wo),
        Ho = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1.

    output_padding (below the stride or the dilation) adds rows/columns at the
    bottom/right, as torch."""
    _check(x, w, groups)
    if x.shape[1] != w.shape[0]:
        raise ShapeError(f"conv_transpose2d: w {w.shape} needs {x.shape[1]} input channels first")
    shape = _transpose_out_shape(x, w, stride, padding, output_padding, dilation, groups)
    xc, wc = in_compute_dtype(x, w)
    y = _conv2d_input_grad(xc, wc, shape, stride, padding, dilation, groups)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


def conv_transpose2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0),
                              output_padding=(0, 0), dilation=(1, 1), groups=1):
    """Adjoint of y = conv_transpose2d(x, w) = A_w^T x (A_w: conv2d by w), G = dL/dy:

        dx = A_w G = conv2d(G, w)                       (the same stride, padding, ...)
        dw = conv2d's weight gradient with input G and output gradient x:
        dw[c, o', i, j] = sum_{n, p, q} x[n, c, p, q] Gp[n, o, p*sh + i*dh, q*sw + j*dw]
    """
    gc, xc, wc = in_compute_dtype(grad, x, w)
    # An output_padding of a stride or more (allowed below the dilation) adds whole
    # rows/columns that no input position reaches: conv2d(G) then has floor(op / s)
    # extra positions, which are cut off (dx) or met by zero gradients (dw).
    H, W = x.shape[2:]
    dx = _conv2d(gc, wc, stride, padding, dilation, groups)[:, :, :H, :W]
    extra = (output_padding[0] // stride[0], output_padding[1] // stride[1])
    if extra != (0, 0):
        xc = np.pad(xc, ((0, 0), (0, 0), (0, extra[0]), (0, extra[1])))
    dw = _conv2d_weight_grad(gc, xc, w.shape, stride, padding, dilation, groups)
    return dx.astype(x.dtype, copy=False), dw.astype(w.dtype, copy=False)


# --- conv2d with bias and activation fused (one primitive) -----------------------------------

#: the activations whose derivative is a function of the output y alone
BIAS_ACTIVATIONS = ("identity", "relu", "sigmoid", "tanh")


def _check_bias_act(x, w, b, activation):
    if activation not in BIAS_ACTIVATIONS:
        raise ValueError(f"conv2d_bias_act: activation must be one of {BIAS_ACTIVATIONS} (those whose "
                         f"derivative follows from the output), got {activation!r}; apply other "
                         "activations after conv2d")
    if np.ndim(b) != 1 or np.shape(b)[0] != np.shape(w)[0]:
        raise ShapeError(f"conv2d_bias_act: the bias must have shape ({np.shape(w)[0]},) (one entry per "
                         f"output channel of w {np.shape(w)}), got {np.shape(b)}")
    if np.asarray(b).dtype != np.asarray(x).dtype:
        raise DTypeError(f"conv2d_bias_act: the bias is {np.asarray(b).dtype} but x is "
                         f"{np.asarray(x).dtype}; convert one of them first")


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

    with act one of identity, relu (max(z, 0)), sigmoid (1 / (1 + exp(-z)))
    and tanh: the activations whose derivative is a function of y alone, so
    the backward needs only the output. Computed in float32 for half-precision
    inputs and rounded once; output (N, O, Ho, Wo) in x's dtype."""
    _check_bias_act(x, w, b, activation)
    xc, wc, bc = in_compute_dtype(x, w, b)
    z = conv2d_forward(xc, wc, stride=stride, padding=padding, dilation=dilation, groups=groups)
    z = z + bc.reshape(1, -1, 1, 1)
    return _activate(z, activation).astype(np.asarray(x).dtype, copy=False)


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity"):
    """Adjoint of y = act(conv2d(x, w) + b) with G = dL/dy, from the output y:

        gz[n, o, p, q] = G[n, o, p, q] * act'(y[n, o, p, q])
                         (identity: 1; relu: [not y <= 0]; sigmoid: y (1 - y); tanh: 1 - y^2)
        db[o]          = sum_{n, p, q} gz[n, o, p, q]
        (dx, dw)       = conv2d's adjoint (conv2d_backward) at the output gradient gz
    """
    xc, wc, g, y = in_compute_dtype(x, w, grad, out)
    gz = g * _activation_derivative(y, activation)
    db = gz.sum(axis=(0, 2, 3))
    dx, dw = conv2d_backward(gz, gz, xc, wc, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return (np.asarray(dx).astype(np.asarray(x).dtype, copy=False),
            np.asarray(dw).astype(np.asarray(w).dtype, copy=False),
            db.astype(np.asarray(b).dtype, copy=False))
