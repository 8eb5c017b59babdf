"""The conv family's spec: the geometry of conv, conv_bias_act and
conv_transpose for any spatial rank R (1, 2 or 3), checked once (NNlib's
DenseConvDims{N}).

conv takes ``x`` (N, C, *s) with R spatial sides s = (s_0, ..., s_{R-1})
and a weight ``w`` (O, C/G, *k), G the groups, k the R kernel sides, to
``y`` (N, O, *o) with, on each axis a,

    o_a = (s_a + lo_a + hi_a - d_a*(k_a - 1) - 1) // t_a + 1

for the stride t, the dilation d (R-tuples) and the padding, the flat
2R-tuple (lo_0, hi_0, lo_1, hi_1, ...) in axis order (for R = 2 that is
(top, bottom, left, right)). conv_bias_act adds a bias ``b`` (O,) and one of
the activations declared as ``fusable_activations`` in its registration.

conv_transpose takes ``x`` (N, Cin, *s) and ``w`` (Cin, O/G, *k) to ``y``
(N, O, *o) with

    o_a = (s_a - 1)*t_a - lo_a - hi_a + d_a*(k_a - 1) + output_padding_a + 1

It is the adjoint of the conv of ``w`` from (N, O, *o), whose output is
(N, Cin, *(s_a + output_padding_a // t_a)): output_padding of a stride or
more adds positions no input reaches. Its spec carries that conv's
(``ConvTransposeSpec.adjoint``), so reference and kernel compute the
transposed convolution with conv's geometry.

The rank is read from x, w and the attributes; they must agree (a ShapeError
naming the primitive, the expected and actual lengths and the fix, before any
work). Reference and kernels compute every rank as rank 3: ``ConvSpec.lifted``
is the same convolution with size-1 axes (kernel 1, stride 1, no padding) in
front of the R spatial ones, so one code path serves all ranks.

``conv2d_spec``, ``conv2d_bias_act_spec`` and ``conv_transpose2d_spec`` are
the 2-D entry points of before (2-D defaults), thin wrappers.
"""
import functools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..arguments import flux_layout_hint
from ..dtypes import as_dtype, compute_dtype
from ..errors import DTypeError, ShapeError
from . import cached_on_arguments
from ..primitives import REGISTRY

#: the activations conv_bias_act applies in its epilogue: those whose
#: derivative is a function of the output y alone (declared with the primitive)
FUSABLE_ACTIVATIONS = REGISTRY["conv_bias_act"].fusable_activations

#: the spatial ranks the family serves
RANKS = (1, 2, 3)

_AXES = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def lift3(values, fill):
    """An R-tuple as a 3-tuple: ``fill`` for the 3 - R axes in front."""
    return (fill,) * (3 - len(values)) + tuple(values)


@dataclass(frozen=True, eq=False)
class ConvSpec:
    """conv(x, w) (with ``activation``, conv_bias_act): shapes as in the
    module docstring, the attributes normalised to tuples of ints (stride and
    dilation R entries, padding 2R), the element type and the type the
    products and sums run in."""
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

    @functools.cached_property
    def rank(self):
        """R, the spatial axes."""
        return len(self.x_shape) - 2

    @functools.cached_property
    def kernel_size(self):
        """The R kernel sides k."""
        return self.w_shape[2:]

    @functools.cached_property
    def padding_lo(self):
        """The padding before each axis, (lo_0, ..., lo_{R-1})."""
        return self.padding[0::2]

    @functools.cached_property
    def padding_hi(self):
        return self.padding[1::2]

    @functools.cached_property
    def geometry3(self):
        """The canonical rank-3 geometry the kernels read (any rank): kernel,
        stride, padding before each axis and dilation as 3-tuples (size-1,
        stride-1, unpadded axes in front), and whether the depth axis is real."""
        return (lift3(self.kernel_size, 1), lift3(self.stride, 1), lift3(self.padding_lo, 0),
                lift3(self.dilation, 1), self.rank == 3)

    @property
    def in_channels_per_group(self):
        """C/G, the input channels each output channel reads."""
        return self.w_shape[1]

    @property
    def out_channels_per_group(self):
        """O/G"""
        return self.w_shape[0] // self.groups

    @property
    def lifted(self):
        """The same convolution at rank 3: size-1 axes (kernel 1, stride 1,
        dilation 1, no padding) in front of the R spatial ones (itself for R = 3)."""
        if self.rank == 3:
            return self
        lift = 3 - self.rank
        return _conv_spec(self.x_shape[:2] + (1,) * lift + self.x_shape[2:],
                          self.w_shape[:2] + (1,) * lift + self.w_shape[2:], self.dtype, self.dtype,
                          (1,) * lift + self.stride, (0,) * (2 * lift) + self.padding, (1,) * lift + self.dilation,
                          self.groups, self.activation, "conv")


@dataclass(frozen=True, eq=False)
class ConvTransposeSpec:
    """conv_transpose(x, w): shapes as in the module docstring, and
    ``adjoint``, the :class:`ConvSpec` of the conv whose input gradient it
    is (input ``out_shape``, output ``x_shape`` grown by ``extra``)."""
    x_shape: tuple
    w_shape: tuple
    out_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    output_padding: tuple
    adjoint: ConvSpec

    @property
    def rank(self):
        return len(self.x_shape) - 2

    @functools.cached_property
    def extra(self):
        """The positions at the high end of each axis of the adjoint's output
        that no input position reaches: output_padding // stride (R entries)."""
        return tuple(a - b for a, b in zip(self.adjoint.out_shape[2:], self.x_shape[2:]))


def _ints(v):
    return tuple(int(a) for a in v)


def _check_rank(name, x_shape, w_shape, per_axis, padding):
    """The rank R = len(x_shape) - 2 in 1..3, and w and every attribute of it
    (``per_axis``: (attribute name, tuple) pairs of R entries)."""
    R = len(x_shape) - 2
    if R not in RANKS:
        raise ShapeError(f"{name}: x must be (N, C, *spatial) with 1, 2 or 3 spatial axes, got {len(x_shape)} "
                         f"dimensions {x_shape}; add the batch and channel axes (N, C) in front")
    if len(w_shape) != R + 2:
        raise ShapeError(f"{name}: x {x_shape} is {_AXES[R]}, {R} spatial axes, so w needs {R + 2} dimensions "
                         f"(out, in, {R} kernel sides), got {len(w_shape)}: {w_shape}; give a kernel of {R} "
                         f"sides or an input of {len(w_shape) - 2} spatial axes")
    for attr, value in per_axis:
        if len(value) != R:
            raise ShapeError(f"{name}: {attr} must have {R} entries, one per spatial axis of x {x_shape}, got "
                             f"{len(value)}: {value}; pass an int or an {R}-tuple")
    if len(padding) != 2 * R:
        raise ShapeError(f"{name}: padding must have {2 * R} entries (lo, hi per spatial axis of x {x_shape}), "
                         f"got {len(padding)}: {padding}; pass an int, {R} per-axis ints or {2 * R} ints")


def _check_conv(name, x_shape, w_shape, x_dtype, w_dtype, groups):
    if x_dtype != w_dtype:
        raise DTypeError(f"{name} of {x_dtype} and {w_dtype}: convert one of them first")
    if groups < 1 or x_shape[1] % groups or w_shape[0] % groups:
        raise ShapeError(f"{name}: groups={groups} must divide the channels of x {x_shape} and of w {w_shape}")


def _out_side(n, lo, hi, k, s, d):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


@lru_cache(maxsize=1024)
def _conv_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, dilation, groups, activation, name):
    _check_rank(name, x_shape, w_shape, (("stride", stride), ("dilation", dilation)), padding)
    _check_conv(name, x_shape, w_shape, x_dtype, w_dtype, groups)
    if x_shape[1] // groups != w_shape[1]:
        raise ShapeError(f"{name}: x {x_shape} has {x_shape[1]} input channels (axis 1) but w {w_shape} takes "
                         f"{w_shape[1] * groups} (w's axis 1 times groups={groups})."
                         f"{flux_layout_hint(x_shape, 1, w_shape[1] * groups)}")
    kernel = w_shape[2:]
    out = tuple(_out_side(n, padding[2 * a], padding[2 * a + 1], k, s, d)
                for a, (n, k, s, d) in enumerate(zip(x_shape[2:], kernel, stride, dilation)))
    if min(out) < 1:
        reach = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
        padded = tuple(n + padding[2 * a] + padding[2 * a + 1] for a, n in enumerate(x_shape[2:]))
        raise ShapeError(f"{name}: the padded input {padded} (x {x_shape}, padding {padding}) is smaller than the "
                         f"dilated kernel {reach} (kernel {kernel}, dilation {dilation}); pad more, or use a "
                         "smaller kernel or dilation")
    return ConvSpec(x_shape, w_shape, x_shape[:1] + (w_shape[0],) + out, x_dtype, compute_dtype(x_dtype), stride,
                    padding, dilation, groups, activation)


def _rank_defaults(x_shape, stride, padding, dilation):
    """None attributes as the identity for x's rank (stride 1, no padding, dilation 1)."""
    R = max(len(x_shape) - 2, 1)
    return ((1,) * R if stride is None else stride, (0,) * (2 * R) if padding is None else padding,
            (1,) * R if dilation is None else dilation)


@cached_on_arguments
def conv_spec(x_shape, w_shape, x_dtype, w_dtype, stride=None, padding=None, dilation=None, groups=1):
    """The :class:`ConvSpec` of conv(x, w) (NumPy or torch dtypes; stride and
    dilation R-tuples, padding the flat 2R-tuple, None: none); raises
    ShapeError/DTypeError saying what to change."""
    stride, padding, dilation = _rank_defaults(x_shape, stride, padding, dilation)
    return _conv_spec(_ints(x_shape), _ints(w_shape), as_dtype(x_dtype), as_dtype(w_dtype), _ints(stride),
                      _ints(padding), _ints(dilation), int(groups), None, "conv")


@cached_on_arguments
def conv_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, stride=None, padding=None,
                       dilation=None, groups=1, activation="identity"):
    """The :class:`ConvSpec` of act(conv(x, w) + b): conv's, after checking
    the activation (one of FUSABLE_ACTIVATIONS) and the bias (one entry per
    output channel, x's dtype)."""
    if activation not in FUSABLE_ACTIVATIONS:
        raise ValueError(f"conv_bias_act: activation must be one of {FUSABLE_ACTIVATIONS} (those whose "
                         f"derivative follows from the output), got {activation!r}; apply other "
                         "activations after conv")
    w_shape, b_shape, x_dtype, b_dtype = _ints(w_shape), _ints(b_shape), as_dtype(x_dtype), as_dtype(b_dtype)
    if len(b_shape) != 1 or not w_shape or b_shape[0] != w_shape[0]:
        raise ShapeError(f"conv_bias_act: the bias must have shape ({w_shape[0] if w_shape else '?'},) (one "
                         f"entry per output channel of w {w_shape}), got {b_shape}")
    if b_dtype != x_dtype:
        raise DTypeError(f"conv_bias_act: the bias is {b_dtype} but x is {x_dtype}; convert one of them first")
    stride, padding, dilation = _rank_defaults(x_shape, stride, padding, dilation)
    return _conv_spec(_ints(x_shape), w_shape, x_dtype, as_dtype(w_dtype), _ints(stride), _ints(padding),
                      _ints(dilation), int(groups), activation, "conv_bias_act")


@lru_cache(maxsize=1024)
def _conv_transpose_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, output_padding, dilation, groups):
    name = "conv_transpose"
    _check_rank(name, x_shape, w_shape, (("stride", stride), ("dilation", dilation),
                                         ("output_padding", output_padding)), padding)
    _check_conv(name, x_shape, w_shape, x_dtype, w_dtype, groups)
    if x_shape[1] != w_shape[0]:
        raise ShapeError(f"{name}: x {x_shape} has {x_shape[1]} input channels (axis 1) but w "
                         f"{w_shape} takes {w_shape[0]} (w's axis 0).{flux_layout_hint(x_shape, 1, w_shape[0])}")
    # torch's rule: each side of output_padding below its stride or its dilation
    if not all(0 <= op < max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise ShapeError(f"{name}: output_padding {output_padding} must be smaller than "
                         f"the stride {stride} or the dilation {dilation} on each axis")
    out = tuple((n - 1) * s - padding[2 * a] - padding[2 * a + 1] + d * (k - 1) + op + 1
                for a, (n, k, s, d, op) in enumerate(zip(x_shape[2:], w_shape[2:], stride, dilation,
                                                         output_padding)))
    if min(out) < 1:
        raise ShapeError(f"{name}: the padding {padding} crops the whole output of x {x_shape} (sides {out}); "
                         "pad less")
    out_shape = (x_shape[0], w_shape[1] * groups) + out
    adjoint = _conv_spec(out_shape, w_shape, x_dtype, w_dtype, stride, padding, dilation, groups, None, name)
    return ConvTransposeSpec(x_shape, w_shape, out_shape, x_dtype, compute_dtype(x_dtype), output_padding, adjoint)


@cached_on_arguments
def conv_transpose_spec(x_shape, w_shape, x_dtype, w_dtype, stride=None, padding=None, output_padding=None,
                        dilation=None, groups=1):
    """The :class:`ConvTransposeSpec` of conv_transpose(x, w) (NumPy or
    torch dtypes); raises ShapeError/DTypeError saying what to change."""
    stride, padding, dilation = _rank_defaults(x_shape, stride, padding, dilation)
    if output_padding is None:
        output_padding = (0,) * max(len(x_shape) - 2, 1)
    return _conv_transpose_spec(_ints(x_shape), _ints(w_shape), as_dtype(x_dtype), as_dtype(w_dtype),
                                _ints(stride), _ints(padding), _ints(output_padding), _ints(dilation), int(groups))


# --- the 2-D entry points of before ----------------------------------------------------------

def conv2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                groups=1):
    """conv_spec with 2-D defaults."""
    return conv_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, dilation, groups)


def conv2d_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, stride=(1, 1),
                         padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, activation="identity"):
    """conv_bias_act_spec with 2-D defaults."""
    return conv_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, stride, padding, dilation,
                              groups, activation)


def conv_transpose2d_spec(x_shape, w_shape, x_dtype, w_dtype, stride=(1, 1), padding=(0, 0, 0, 0),
                          output_padding=(0, 0), dilation=(1, 1), groups=1):
    """conv_transpose_spec with 2-D defaults."""
    return conv_transpose_spec(x_shape, w_shape, x_dtype, w_dtype, stride, padding, output_padding, dilation,
                               groups)


# --- floating-point operations (the registry's ``flops``, read by the kernel report) ------------

def conv_flops(name, direction, inputs, out_shape, attrs, largest):
    """2 * (positions of the convolution's output) * C/G * prod(kernel) forward,
    any spatial rank (a transposed convolution's output is its input side);
    twice that backward (the input's gradient and the weight's)."""
    x, w = inputs[0], inputs[1]
    positions = math.prod(x if name == "conv_transpose" else out_shape)
    return 2 * positions * math.prod(w[1:]) * (2 if direction == "backward" else 1)
