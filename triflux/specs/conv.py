"""The conv family's spec: the geometry of conv2d, conv2d_bias_act and
conv_transpose2d, checked once.

conv2d takes ``x`` (N, C, H, W) and a weight ``w`` (O, C/G, kh, kw), G the
groups, to ``y`` (N, O, Ho, Wo) with

    Ho = (H + top + bottom - dh*(kh - 1) - 1) // sh + 1      (Wo likewise)

conv2d_bias_act adds a bias ``b`` (O,) and one of the activations declared
as ``fusable_activations`` in its registration.

conv_transpose2d takes ``x`` (N, Cin, H, W) and ``w`` (Cin, O/G, kh, kw) to
``y`` (N, O, Ho, Wo) with

    Ho = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1

It is the adjoint of the conv2d of ``w`` from (N, O, Ho, Wo), whose output
is (N, Cin, H + output_padding_h // sh, ...): output_padding of a stride or
more adds rows no input position reaches. Its spec carries that conv2d's
(``ConvTransposeSpec.adjoint``), so reference and kernel compute the
transposed convolution with conv2d's geometry.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..arguments import flux_layout_hint
from ..dtypes import as_dtype, compute_dtype
from ..errors import DTypeError, ShapeError
from . import cached_on_arguments
from ..primitives import REGISTRY

#: the activations conv2d_bias_act applies in its epilogue: those whose
#: derivative is a function of the output y alone (declared with the primitive)
FUSABLE_ACTIVATIONS = REGISTRY["conv2d_bias_act"].fusable_activations


@dataclass(frozen=True, eq=False)
class ConvSpec:
    """conv2d(x, w) (with ``activation``, conv2d_bias_act): shapes as in the
    module docstring, the attributes normalised to tuples of ints, the
    element type and the type the products and sums run in."""
    x_shape: tuple
    w_shape: tuple
    out_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    activation: str | None = None

    @property
    def kernel_size(self):
        """(kh, kw)"""
        return self.w_shape[2:]

    @property
    def in_channels_per_group(self):
        """C/G, the input channels each output channel reads."""
        return self.w_shape[1]

    @property
    def out_channels_per_group(self):
        """O/G"""
        return self.w_shape[0] // self.groups


@dataclass(frozen=True, eq=False)
class ConvTransposeSpec:
    """conv_transpose2d(x, w): shapes as in the module docstring, and
    ``adjoint``, the :class:`ConvSpec` of the conv2d whose input gradient it
    is (input ``out_shape``, output ``x_shape`` grown by ``extra``)."""
    x_shape: tuple
    w_shape: tuple
    out_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    output_padding: tuple
    adjoint: ConvSpec

    @property
    def extra(self):
        """The rows and columns at the bottom/right of the adjoint's output
        that no input position reaches: output_padding // stride."""
        return (self.adjoint.out_shape[2] - self.x_shape[2], self.adjoint.out_shape[3] - self.x_shape[3])


def _ints(v):
    return tuple(int(a) for a in v)


def _check_conv(x_shape, w_shape, x_dtype, w_dtype, groups):
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(f"conv needs x of shape (N, C, H, W) and w of 4 dimensions, got "
                         f"{x_shape} and {w_shape}")
    if x_dtype != w_dtype:
        raise DTypeError(f"conv of {x_dtype} and {w_dtype}: convert one of them first")
    if groups < 1 or x_shape[1] % groups or w_shape[0] % groups:
        raise ShapeError(f"groups={groups} must divide the channels of x {x_shape} and of w {w_shape}")


def _out_side(n, lo, hi, k, s, d):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


@lru_cache(maxsize=1024)
def _conv2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, dilation, groups, activation):
    _check_conv(x_shape, w_shape, x_dtype, w_dtype, groups)
    if x_shape[1] // groups != w_shape[1]:
        raise ShapeError(f"conv2d: x {x_shape} has {x_shape[1]} input channels (axis 1) but w {w_shape} takes "
                         f"{w_shape[1] * groups} (w's axis 1 times groups={groups})."
                         f"{flux_layout_hint(x_shape, 1, w_shape[1] * groups)}")
    (N, _, H, W), (O, _, kh, kw) = x_shape, w_shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    Ho, Wo = _out_side(H, pt, pb, kh, sh, dh), _out_side(W, pl, pr, kw, sw, dw)
    if Ho < 1 or Wo < 1:
        raise ShapeError(f"conv: the padded input {x_shape} is smaller than the dilated kernel "
                         f"{(kh, kw)} (dilation {dilation}, padding {padding})")
    return ConvSpec(x_shape, w_shape, (N, O, Ho, Wo), x_dtype, compute_dtype(x_dtype), stride, padding,
                    dilation, groups, activation)


@cached_on_arguments
def conv2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                groups=1):
    """The :class:`ConvSpec` of conv2d(x, w) (NumPy or torch dtypes); raises
    ShapeError/DTypeError saying what to change."""
    return _conv2d_spec(_ints(x_shape), _ints(w_shape), as_dtype(x_dtype), as_dtype(w_dtype), _ints(stride),
                        _ints(padding), _ints(dilation), int(groups), None)


@cached_on_arguments
def conv2d_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, stride=(1, 1),
                         padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, activation="identity"):
    """The :class:`ConvSpec` of act(conv2d(x, w) + b): conv2d's, after
    checking the activation (one of FUSABLE_ACTIVATIONS) and the bias
    (one entry per output channel, x's dtype)."""
    if activation not in FUSABLE_ACTIVATIONS:
        raise ValueError(f"conv2d_bias_act: activation must be one of {FUSABLE_ACTIVATIONS} (those whose "
                         f"derivative follows from the output), got {activation!r}; apply other "
                         "activations after conv2d")
    w_shape, b_shape, x_dtype, b_dtype = _ints(w_shape), _ints(b_shape), as_dtype(x_dtype), as_dtype(b_dtype)
    if len(b_shape) != 1 or not w_shape or b_shape[0] != w_shape[0]:
        raise ShapeError(f"conv2d_bias_act: the bias must have shape ({w_shape[0] if w_shape else '?'},) (one "
                         f"entry per output channel of w {w_shape}), got {b_shape}")
    if b_dtype != x_dtype:
        raise DTypeError(f"conv2d_bias_act: the bias is {b_dtype} but x is {x_dtype}; convert one of them first")
    return _conv2d_spec(_ints(x_shape), w_shape, x_dtype, as_dtype(w_dtype), _ints(stride), _ints(padding),
                        _ints(dilation), int(groups), activation)


@lru_cache(maxsize=1024)
def _conv_transpose2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, output_padding, dilation, groups):
    _check_conv(x_shape, w_shape, x_dtype, w_dtype, groups)
    if x_shape[1] != w_shape[0]:
        raise ShapeError(f"conv_transpose2d: x {x_shape} has {x_shape[1]} input channels (axis 1) but w "
                         f"{w_shape} takes {w_shape[0]} (w's axis 0).{flux_layout_hint(x_shape, 1, w_shape[0])}")
    (N, _, H, W), (_, Og, kh, kw) = x_shape, w_shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw), (oph, opw) = stride, padding, dilation, output_padding
    # torch's rule: each side of output_padding below its stride or its dilation
    if not (0 <= oph < max(sh, dh) and 0 <= opw < max(sw, dw)):
        raise ShapeError(f"conv_transpose2d: output_padding {output_padding} must be smaller than "
                         f"the stride {stride} or the dilation {dilation} on each axis")
    Ho = (H - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
    Wo = (W - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
    if Ho < 1 or Wo < 1:
        raise ShapeError(f"conv_transpose2d: the padding {padding} crops the whole output")
    out_shape = (N, Og * groups, Ho, Wo)
    adjoint = _conv2d_spec(out_shape, w_shape, x_dtype, w_dtype, stride, padding, dilation, groups, None)
    return ConvTransposeSpec(x_shape, w_shape, out_shape, x_dtype, compute_dtype(x_dtype), output_padding, adjoint)


@cached_on_arguments
def conv_transpose2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride=(1, 1), padding=(0, 0, 0, 0),
                          output_padding=(0, 0), dilation=(1, 1), groups=1):
    """The :class:`ConvTransposeSpec` of conv_transpose2d(x, w) (NumPy
    dtypes); raises ShapeError/DTypeError saying what to change."""
    return _conv_transpose2d_spec(_ints(x_shape), _ints(w_shape), as_dtype(x_dtype), as_dtype(w_dtype),
                                  _ints(stride), _ints(padding), _ints(output_padding), _ints(dilation),
                                  int(groups))
