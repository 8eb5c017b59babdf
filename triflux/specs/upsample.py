"""The upsample family's spec: the output size and the source positions of
upsample_nearest2d and upsample_bilinear2d (torch's ``F.interpolate``, modes
"nearest" and "bilinear") on an NCHW input, checked once.

Attributes, exactly one of:

* ``size = (Ho, Wo)``: the output's spatial size (positive ints);
* ``scale = (sh, sw)``: positive scale factors (ints or floats); the output
  size is ``Ho = floor(H * sh)``, ``Wo = floor(W * sw)`` (must be >= 1).

and, for bilinear only, ``align_corners`` (default False).

Along one axis of n inputs and m outputs, output position d reads:

nearest (computed in float32 as torch does for every dtype)::

    src(d) = d                                    if m == n
             floor(d / 2)                         if m == 2 n
             min(floor(float32(d) * r), n - 1)    otherwise, with the float32 ratio
             r = float32(1 / scale)  (scale given)  or  float32(n) / float32(m)  (size given)

bilinear (computed in float64 for float64 data, float32 otherwise, as torch)::

    s(d) = d * (n - 1) / (m - 1)                      align_corners (0 when m == 1)
           max((d + 0.5) * r - 0.5, 0)                otherwise, r = 1 / scale or n / m
    i0 = min(floor(float32(s)), n - 1),  i1 = min(i0 + 1, n - 1),  lam = clip(s - i0, 0, 1)
    out[d] = (1 - lam) * in[i0] + lam * in[i1]

    except when m == n: then out[d] = in[d] (i0 = i1 = d, lam = 0), whatever the scale.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ShapeError


@dataclass(frozen=True, eq=False)
class UpsampleAxis:
    """One spatial axis: ``size`` inputs to ``out`` outputs, by the rule of
    the module docstring with ``scale`` (None: size given). Output d reads
    input positions ``i0[d]`` and ``i1[d]`` with weights ``1 - lam[d]`` and
    ``lam[d]`` (``lam`` in ``compute_dtype``); nearest reads ``i0[d]`` only
    (``i1`` is ``i0``, ``lam`` None). The arrays are read-only."""
    size: int
    out: int
    scale: float | None
    bilinear: bool
    align_corners: bool
    compute_dtype: np.dtype
    i0: np.ndarray
    i1: np.ndarray
    lam: np.ndarray | None


@dataclass(frozen=True, eq=False)
class UpsampleSpec:
    """An upsampling of an NCHW input of ``x_shape``: the attributes
    normalised (``scale`` as floats, or None), the output shape and the
    source positions along the rows and the columns."""
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    size: tuple | None
    scale: tuple | None
    bilinear: bool
    align_corners: bool
    rows: UpsampleAxis
    cols: UpsampleAxis


def _read_only(*arrays):
    for a in arrays:
        if a is not None:
            a.flags.writeable = False


@lru_cache(maxsize=512)
def nearest_axis(n, m, scale=None):
    """The :class:`UpsampleAxis` of the nearest rule (module docstring)."""
    d = np.arange(m)
    if m == n:
        src = d
    elif m == 2 * n:
        src = d // 2
    else:
        r = np.float32(1.0 / scale) if scale is not None else np.float32(n) / np.float32(m)
        src = np.minimum(np.floor(d.astype(np.float32) * r).astype(np.int64), n - 1)
    _read_only(src)
    return UpsampleAxis(n, m, scale, False, False, np.dtype(np.float32), src, src, None)


@lru_cache(maxsize=512)
def linear_axis(n, m, scale, align_corners, dtype):
    """The :class:`UpsampleAxis` of the bilinear rule (module docstring),
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


def _pair(v, name):
    if v is None:
        return None
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(v) != 2:
        raise ShapeError(f"{name} must be a number or a pair, got {v}")
    return v


def scale_pair(scale):
    """Scale factors as a pair of Python numbers, ints kept as ints
    (2 -> (2, 2), (2.0, 1.5) -> (2, 1.5)): the ``scale`` attribute's form."""
    return tuple(int(v) if float(v).is_integer() else float(v) for v in _pair(scale, "scale"))


@lru_cache(maxsize=1024)
def _upsample2d_spec(op, x_shape, dtype, size, scale, align_corners):
    if len(x_shape) != 4:
        raise ShapeError(f"{op} expects an NCHW array of 4 dimensions, got shape {x_shape}")
    size, scale = _pair(size, "size"), _pair(scale, "scale")
    if (size is None) == (scale is None):
        raise ShapeError("upsampling needs exactly one of size (the output's (H, W)) and scale (the factors), "
                         f"got size={size}, scale={scale}")
    H, W = x_shape[2], x_shape[3]
    if scale is not None:
        scale = tuple(float(s) for s in scale)
        if not all(np.isfinite(s) and s > 0 for s in scale):
            raise ShapeError(f"upsampling scale factors must be positive, got {scale}")
        out = (int(np.floor(H * scale[0])), int(np.floor(W * scale[1])))
    else:
        if any(int(s) != s for s in size):
            raise ShapeError(f"upsampling size must be two ints, got {size}")
        size = out = (int(size[0]), int(size[1]))
    if min(H, W) < 1 or min(out) < 1:
        raise ShapeError(f"upsampling needs input and output sizes greater than 0, got input (H, W) = {(H, W)}, "
                         f"output {out}" + (f" (= floor(input x scale {scale}))" if scale is not None else ""))
    sh, sw = scale if scale is not None else (None, None)
    bilinear = op == "upsample_bilinear2d"
    if bilinear:
        ct = compute_dtype(dtype)
        rows, cols = linear_axis(H, out[0], sh, align_corners, ct), linear_axis(W, out[1], sw, align_corners, ct)
    else:
        rows, cols = nearest_axis(H, out[0], sh), nearest_axis(W, out[1], sw)
    return UpsampleSpec(x_shape, dtype, compute_dtype(dtype), x_shape[:2] + out, size, scale, bilinear,
                        align_corners, rows, cols)


def upsample2d_spec(op, x_shape, dtype, size=None, scale=None, align_corners=False):
    """The :class:`UpsampleSpec` of ``op`` (upsample_nearest2d, whose
    align_corners is False, or upsample_bilinear2d) on an NCHW input of
    ``x_shape`` and ``dtype`` (NumPy or torch); raises ShapeError on bad attributes."""
    return _upsample2d_spec(op, tuple(int(s) for s in x_shape), as_dtype(dtype), _hashable(size),
                            _hashable(scale), bool(align_corners))


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v
