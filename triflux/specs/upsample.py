"""The upsample family's spec: the output size and the source positions of
upsample_nearest and upsample_linear (torch's ``F.interpolate``, modes
"nearest" and "linear" / "bilinear" / "trilinear"), and the geometry of
pixel_shuffle and pixel_unshuffle (torch's ``F.pixel_shuffle`` /
``F.pixel_unshuffle`` for any spatial rank), each checked once.

Inputs are ``(N, C, *spatial)`` with R = 1, 2 or 3 spatial axes; the rank R
is x's ndim - 2, and every per-axis attribute has R entries.

Upsampling attributes, exactly one of:

* ``size = (m_0, ..., m_R-1)``: the output's spatial sides (positive ints;
  one int means the same side along every axis);
* ``scale = (s_0, ..., s_R-1)``: positive scale factors (ints or floats;
  one number means the same factor along every axis); the output side is
  ``m_k = floor(n_k * s_k)`` (computed in float64, as torch; must be >= 1).

and, for upsample_linear only, ``align_corners`` (default False). A given
scale is the one torch's index rule uses (``F.interpolate(...,
scale_factor=s)`` with ``recompute_scale_factor`` None or False); torch's
``recompute_scale_factor=True`` is the same as giving ``size = floor(n * s)``
(the rule then uses n / m), so it needs no attribute of its own.

The map is separable: along each spatial axis k of n = n_k inputs and
m = m_k outputs, output position d reads positions of that axis by the
rule below (with ``r`` the ratio along that axis), and the R-dimensional
result reads the product of the axes' positions (nearest) or weights them
by the product of the axes' weights (linear). Along one axis:

nearest, R = 2 (torch's 2-D CPU kernel, ``nearest_idx``; computed in float32
for every dtype)::

    src(d) = d                                    if m == n
             floor(d / 2)                         if m == 2 n
             min(floor(float32(d) * r), n - 1)    otherwise, with the float32 ratio
             r = float32(1 / scale)  (scale given)  or  float32(n) / float32(m)  (size given)

nearest, R = 1 and R = 3 (torch's generic CPU kernel, ``HelperInterpNearest``:
no special cases; computed in float64 for float64 data, float32 otherwise)::

    src(d) = min(floor(float32(d * r)), n - 1),   r = 1 / scale  or  n / m   (in that precision)

(the two agree except where a kept or doubled size comes from a scale that
is not 1 or 2, e.g. 3 elements by 1.1 or 2.2, and where d * r lies within
rounding of an integer; torch's CUDA kernels use the second rule in float32
at every rank: triflux follows torch's CPU results, the oracle of its tests.
torch's CPU backward of 1-D and 3-D nearest uses the 2-D rule, so where the
rules differ it is not the derivative of torch's forward; triflux's
backward is always the adjoint of its forward.)

linear (computed in float64 for float64 data, float32 otherwise, as torch)::

    s(d) = d * (n - 1) / (m - 1)                      align_corners (0 when m == 1; the scale is ignored)
           max((d + 0.5) * r - 0.5, 0)                otherwise, r = 1 / scale or n / m
    i0 = min(floor(float32(s)), n - 1),  i1 = min(i0 + 1, n - 1),  lam = clip(s - i0, 0, 1)
    out[d] = (1 - lam) * in[i0] + lam * in[i1]

    except when m == n: then out[d] = 1 * in[d] + 0 * in[d] (i0 = i1 = d, lam = 0), whatever the scale.

These are the CPU kernels' rules of aten (``nearest_idx``,
``HelperInterpNearest``, ``area_pixel_compute_scale`` /
``area_pixel_compute_source_index``, ``guard_index_and_lambda``); the linear
rule is the same for 1, 2 and 3 spatial axes.

Pixel shuffle with factor r (a positive int): ``pixel_shuffle`` maps
``(N, C * r^R, s_0, ..., s_R-1)`` to ``(N, C, r s_0, ..., r s_R-1)``::

    y[n, c, r p_0 + i_0, ..., r p_R-1 + i_R-1] = x[n, c r^R + sum_k i_k r^(R-1-k), p_0, ..., p_R-1]

(0 <= i_k < r): the input channel's index, written in base r, is c followed
by the sub-positions i_0 ... i_R-1, the first spatial axis the most
significant. For R = 2 that is torch's ``F.pixel_shuffle`` (input channel
c r^2 + i r + j goes to output (c, h r + i, w r + j)). NNlib's
``pixel_shuffle`` (Julia, column-major (s_1, ..., s_d, C r^d, N)) reads its
channel as i_1 + r i_2 + ... + r^(d-1) i_d + r^d c with i_1 along its first,
fastest axis; that axis is the last spatial axis of the same memory read
row-major, so on the same memory NNlib's order and this one agree element
for element. ``pixel_unshuffle`` is the inverse, ``(N, C, r s...) -> (N,
C r^R, s...)``.
"""
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ShapeError

#: the upsampling primitives, and the 2-D names they had
UPSAMPLE_NAMES = ("upsample_nearest", "upsample_linear")
_OLD_NAMES = {"upsample_nearest2d": "upsample_nearest", "upsample_bilinear2d": "upsample_linear"}
#: the pixel shuffle primitives
SHUFFLE_NAMES = ("pixel_shuffle", "pixel_unshuffle")
#: the spatial ranks the family serves
RANKS = (1, 2, 3)
_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


@dataclass(frozen=True, eq=False)
class UpsampleAxis:
    """One spatial axis: ``size`` inputs to ``out`` outputs, by the rule of
    the module docstring with ``scale`` (None: size given). Output d reads
    input positions ``i0[d]`` and ``i1[d]`` with weights ``1 - lam[d]`` and
    ``lam[d]`` (``lam`` in ``compute_dtype``); nearest reads ``i0[d]`` only
    (``i1`` is ``i0``, ``lam`` None), by the 2-D rule with its special cases
    (``special``) or the generic rule of 1-D and 3-D computed in
    ``compute_dtype``. The arrays are read-only."""
    size: int
    out: int
    scale: float | None
    linear: bool
    align_corners: bool
    compute_dtype: np.dtype
    i0: np.ndarray
    i1: np.ndarray
    lam: np.ndarray | None
    special: bool = False


@dataclass(frozen=True, eq=False)
class UpsampleSpec:
    """An upsampling ``name`` of an input of ``x_shape`` (N, C, *spatial):
    the attributes normalised (``size`` as ints or ``scale`` as floats, the
    other None), the output shape, and per spatial axis its
    :class:`UpsampleAxis` (``axes``, R of them)."""
    name: str
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    size: tuple | None
    scale: tuple | None
    linear: bool
    align_corners: bool
    axes: tuple

    @property
    def rank(self):
        """R, the number of spatial axes."""
        return len(self.axes)

    @property
    def torch_mode(self):
        """F.interpolate's mode for this primitive at this rank."""
        return _MODES[self.rank] if self.linear else "nearest"


@dataclass(frozen=True, eq=False)
class PixelShuffleSpec:
    """``pixel_shuffle`` (``shuffle``) or ``pixel_unshuffle`` by ``factor``
    of an input of ``x_shape``: the output shape, the rank, and the channel
    count of the shuffled side (``channels``, the C of the module docstring)."""
    name: str
    x_shape: tuple
    dtype: np.dtype
    out_shape: tuple
    factor: int
    shuffle: bool

    @property
    def rank(self):
        return len(self.x_shape) - 2

    @property
    def channels(self):
        """C: the channels of the spatially larger side."""
        return self.out_shape[1] if self.shuffle else self.x_shape[1]


def _read_only(*arrays):
    for a in arrays:
        if a is not None:
            a.flags.writeable = False


@lru_cache(maxsize=512)
def nearest_axis(n, m, scale=None, dtype=None):
    """The :class:`UpsampleAxis` of the nearest rule (module docstring): the
    2-D rule when ``dtype`` is None, else the generic rule (1-D, 3-D)
    computed in ``dtype``."""
    d = np.arange(m)
    if dtype is not None:
        ct = np.dtype(dtype).type
        r = ct(1.0 / scale) if scale is not None else ct(n) / ct(m)
        # torch: floorf(d * r), the product rounded to float32
        src = np.minimum(np.floor((d.astype(ct) * r).astype(np.float32)).astype(np.int64), n - 1)
        _read_only(src)
        return UpsampleAxis(n, m, scale, False, False, np.dtype(dtype), src, src, None, special=False)
    if m == n:
        src = d
    elif m == 2 * n:
        src = d // 2
    else:
        r = np.float32(1.0 / scale) if scale is not None else np.float32(n) / np.float32(m)
        src = np.minimum(np.floor(d.astype(np.float32) * r).astype(np.int64), n - 1)
    _read_only(src)
    return UpsampleAxis(n, m, scale, False, False, np.dtype(np.float32), src, src, None, special=True)


@lru_cache(maxsize=512)
def linear_axis(n, m, scale, align_corners, dtype):
    """The :class:`UpsampleAxis` of the linear rule (module docstring),
    computed in ``dtype``."""
    d = np.arange(m)
    if m == n:
        i0, i1, lam = d, d, np.zeros(m, dtype=dtype)
    else:
        ct = np.dtype(dtype).type
        if align_corners:
            r = ct(n - 1) / ct(m - 1) if m > 1 else ct(0)
            s = d.astype(ct) * r
        else:
            r = ct(1.0 / scale) if scale is not None else ct(n) / ct(m)
            s = np.maximum((d.astype(ct) + ct(0.5)) * r - ct(0.5), ct(0))
        # torch floors the index rounded to float32 (floorf) and clamps lam to [0, 1]
        i0 = np.minimum(np.floor(s.astype(np.float32)).astype(np.int64), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        lam = np.clip(s - i0.astype(ct), ct(0), ct(1))
    _read_only(i0, i1, lam)
    return UpsampleAxis(n, m, scale, True, align_corners, np.dtype(dtype), i0, i1, lam)


# --- attributes ----------------------------------------------------------------------------------

def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _per_axis(v, rank, who, what, x_shape=None):
    """``v`` (one value or a sequence) as a tuple of ``rank`` values."""
    if isinstance(v, (tuple, list, np.ndarray)):
        vals = tuple(v.tolist() if isinstance(v, np.ndarray) else v)
    elif _is_number(v):
        vals = (v,) * rank
    else:
        raise ShapeError(f"{who}: {what} must be a number or {rank} of them (one per spatial axis), got {v!r}")
    if len(vals) != rank:
        of = f"x of shape {x_shape} has" if x_shape is not None else "the input has"
        raise ShapeError(f"{who}: {what} has {len(vals)} entries {vals}, but {of} {rank} spatial "
                         f"ax{'is' if rank == 1 else 'es'}: give {rank} (one per spatial axis) or a single number")
    return vals


def scale_tuple(scale, rank, who="upsample"):
    """Scale factors as a ``rank``-tuple of positive finite Python numbers,
    ints kept as ints (2 -> (2, 2) for rank 2, (2.0, 1.5) -> (2, 1.5)): the
    ``scale`` attribute's form. Raises ShapeError for a wrong count or a
    factor that is not a positive finite number."""
    vals = _per_axis(scale, rank, who, "scale")
    if not all(_is_number(v) and 0 < float(v) < math.inf for v in vals):
        raise ShapeError(f"{who}: scale factors must be positive finite numbers, got {vals}; e.g. scale=2 "
                         "or scale=(2, 1.5)")
    return tuple(int(v) if float(v).is_integer() else float(v) for v in vals)


def _size_tuple(size, rank, who, x_shape):
    vals = _per_axis(size, rank, who, "size", x_shape)
    if not all(_is_number(v) and float(v).is_integer() for v in vals):
        raise ShapeError(f"{who}: size must be {rank} ints (the output's spatial sides), got {vals}")
    vals = tuple(int(v) for v in vals)
    if min(vals) < 1:
        raise ShapeError(f"{who}: output sizes must be greater than 0, got size {vals}; give positive sides")
    return vals


def _rank_of(who, x_shape, shape_of="(N, C, *spatial)"):
    if len(x_shape) - 2 not in RANKS:
        raise ShapeError(f"{who} expects an input {shape_of} with 1, 2 or 3 spatial axes (3 to 5 dimensions), "
                         f"got shape {x_shape} ({len(x_shape)} dimensions); add the batch and channel axes "
                         "(x[None, None]) or drop extra ones")
    return len(x_shape) - 2


def _canonical(name):
    name = _OLD_NAMES.get(name, name)
    if name not in UPSAMPLE_NAMES:
        raise ShapeError(f"upsample_spec: unknown primitive {name!r}; expected one of {UPSAMPLE_NAMES}")
    return name


@lru_cache(maxsize=1024)
def _upsample_spec(name, x_shape, dtype, size, scale, align_corners):
    rank = _rank_of(name, x_shape)
    if (size is None) == (scale is None):
        raise ShapeError(f"{name}: upsampling needs exactly one of size (the output's {rank} spatial sides) and "
                         f"scale (the factors), got size={size}, scale={scale}")
    linear = name == "upsample_linear"
    if align_corners and not linear:
        raise ShapeError(f"{name}: align_corners applies to upsample_linear only; drop it or use linear "
                         "interpolation")
    spatial = x_shape[2:]
    if scale is not None:
        scale = tuple(float(s) for s in scale_tuple(scale, rank, name))
        out = tuple(int(math.floor(n * s)) for n, s in zip(spatial, scale))
    else:
        size = out = _size_tuple(size, rank, name, x_shape)
    if min(spatial) < 1 or min(out) < 1:
        raise ShapeError(f"{name}: upsampling needs input and output sizes greater than 0, got input sides "
                         f"{spatial} (x of shape {x_shape}), output {out}"
                         + (f" (= floor(input x scale {scale}))" if scale is not None else "")
                         + "; use a larger scale or give size")
    scales = scale if scale is not None else (None,) * rank
    ct = compute_dtype(dtype)
    if linear:
        axes = tuple(linear_axis(n, m, s, bool(align_corners), ct) for n, m, s in zip(spatial, out, scales))
    else:
        rule = None if rank == 2 else ct                   # torch's 2-D rule, or its generic one
        axes = tuple(nearest_axis(n, m, s, rule) for n, m, s in zip(spatial, out, scales))
    return UpsampleSpec(name, x_shape, dtype, ct, x_shape[:2] + out, size, scale, linear,
                        bool(align_corners) and linear, axes)


def upsample_spec(name, x_shape, dtype, size=None, scale=None, align_corners=None):
    """The :class:`UpsampleSpec` of ``name`` ("upsample_nearest", whose
    align_corners must be None or False, or "upsample_linear") on an input of
    ``x_shape`` (N, C, *spatial) and ``dtype`` (NumPy or torch). The rank is
    ``len(x_shape) - 2``; ``size`` and ``scale`` (exactly one) have that many
    entries, or are one number. Raises ShapeError on bad attributes."""
    return _upsample_spec(_canonical(name), tuple(int(s) for s in x_shape), as_dtype(dtype),
                          _hashable(size), _hashable(scale), bool(align_corners))


# --- the 2-D entry points (ops.py and layers/ call them until they move to the generic ones) ----------

def scale_pair(scale):
    """``scale_tuple(scale, 2)``: the scale factors of a 2-D upsampling."""
    return scale_tuple(scale, 2)


def upsample2d_spec(op, x_shape, dtype, size=None, scale=None, align_corners=False):
    """:func:`upsample_spec` for an NCHW input, by the 2-D names
    (upsample_nearest2d, upsample_bilinear2d) or the generic ones."""
    if len(x_shape) != 4:
        raise ShapeError(f"{op} expects an NCHW array of 4 dimensions, got shape {tuple(x_shape)}")
    return upsample_spec(op, x_shape, dtype, size, scale, align_corners)


# --- pixel shuffle -------------------------------------------------------------------------------------

@lru_cache(maxsize=1024)
def _pixel_shuffle_spec(name, x_shape, dtype, factor):
    if name not in SHUFFLE_NAMES:
        raise ShapeError(f"pixel_shuffle_spec: unknown primitive {name!r}; expected one of {SHUFFLE_NAMES}")
    shuffle = name == "pixel_shuffle"
    rank = _rank_of(name, x_shape, "(N, C*r^R, *spatial)" if shuffle else "(N, C, *spatial)")
    if not (_is_number(factor) and float(factor).is_integer() and factor >= 1):
        raise ShapeError(f"{name}: the factor must be a positive int, got {factor!r}")
    r = int(factor)
    n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    if shuffle:
        if c % r ** rank:
            raise ShapeError(f"{name}: x of shape {x_shape} has {c} channels, not divisible by r^R = {r}^{rank} = "
                             f"{r ** rank} (factor {r}, {rank} spatial axes); give a multiple of {r ** rank} "
                             "channels or another factor")
        out = (n, c // r ** rank) + tuple(s * r for s in spatial)
    else:
        bad = [k for k, s in enumerate(spatial) if s % r]
        if bad:
            raise ShapeError(f"{name}: x of shape {x_shape} has spatial sides {spatial}, not all divisible by the "
                             f"factor {r} (axis {bad[0]} of the spatial axes: {spatial[bad[0]]}); crop or pad "
                             f"the input to multiples of {r}, or use another factor")
        out = (n, c * r ** rank) + tuple(s // r for s in spatial)
    return PixelShuffleSpec(name, x_shape, dtype, out, r, shuffle)


def pixel_shuffle_spec(name, x_shape, dtype, factor):
    """The :class:`PixelShuffleSpec` of ``name`` ("pixel_shuffle" or
    "pixel_unshuffle") by ``factor`` on an input of ``x_shape`` and ``dtype``;
    raises ShapeError when the channels (shuffle) or the spatial sides
    (unshuffle) do not divide."""
    return _pixel_shuffle_spec(name, tuple(int(s) for s in x_shape), as_dtype(dtype), _hashable(factor))


def _hashable(v):
    if isinstance(v, np.ndarray):
        return tuple(v.tolist())
    return tuple(v) if isinstance(v, list) else v


# --- floating-point operations (the registry's ``flops``, read by the kernel report) ------------

def upsample_flops(name, direction, inputs, out_shape, attrs, largest):
    """Per output element: pixel shuffles copy (0); nearest copies forward and
    adds in each of its R backward passes; linear blends 2^R taps with 2^R - 1
    lerps of 3 FLOPs forward, and backward sends each gradient to two taps
    (multiply and add) in each of its R passes."""
    if name in ("pixel_shuffle", "pixel_unshuffle"):
        return 0
    rank, outputs, backward = len(inputs[0]) - 2, math.prod(out_shape), direction == "backward"
    if name == "upsample_nearest":
        return rank * outputs if backward else 0
    return (4 * rank if backward else 3 * (2 ** rank - 1)) * outputs
