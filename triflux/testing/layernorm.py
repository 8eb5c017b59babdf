"""Strategies, torch oracles and tolerance floors for the per-sample
normalisations (family ``layernorm``).

Inputs. layernorm and rmsnorm: x of 1 to 4 axes, the last 1 or 2 of them
normalised (rows of 0 to a few dozen values, and in about one draw in four a
few rows of 256 to 700 values: long enough that a sum kept in float16 or
bfloat16 would show); groupnorm: x (N, C, *spatial) with 0 to 2 spatial axes,
C = groups * channels per group (C = 0 included), and now and then a long
group; instancenorm_train: the same x, one group per channel. Sides 0 and 1
are drawn (empty batches, empty rows, rows of one value). Optional weight and
bias (none, weight only, both), in random memory layouts; bias kept away from
0 so that the output has a scale. eps from a few orders of magnitude; rmsnorm
also draws its ``eps=None`` as the value it resolves to in the drawn dtype
(the suite's float64 reference copies would otherwise resolve it in float64;
the family's tests check ``eps=None`` itself). In one draw in four x gets an
offset of 50 (a naive E[x^2] - E[x]^2 loses digits there), in one in three a
few entries are NaN, +inf or -inf: their rows' outputs and gradients are NaN,
as torch's, and so is every parameter-gradient sum they feed. Half the draws
of the primitives with a fused activation apply one.

instancenorm_running_update draws x (N, C, *spatial) with S >= 2 positions
per instance or none (S = 1 is where torch refuses, pinned by the family's
tests), running means near x's and positive running variances, momenta from
0 to 1; its oracle returns torch's new running statistics (for an empty x,
the old ones: triflux moves nothing for an empty batch, where torch stores
the NaN of a mean over no samples).

Tolerance floors (``<name>_magnitude``). The backward of a normalisation
cancels by design: dx = istd (gw - mean(gw) - xhat mean(gw xhat)) is nearly
0 for rows of two values (xhat = +-1 up to eps) and small wherever the row's
gradient is nearly affine in xhat, while float32 arithmetic makes errors of
u times the terms' size. The floors are those sizes, computed in float64 from
the inputs: istd (|gw| + mean|gw| + |xhat| mean|gw xhat|) for dx, sums of
|g xhat| and |g| for the parameters, with |g| replaced by the sizes of the
fused activation's terms (``through_activation_terms``); the forward's
|w xhat| + |b| (through the activation's slope).
"""
import numpy as np

from ..specs.layernorm import FUSABLE_ACTIVATIONS, machine_eps
from . import Case, finite_max, floats, layouts_for, through_activation_terms, torch_activated
from .elementwise import with_nonfinite

EPS_CHOICES = (1e-5, 1e-3, 0.1)
MOMENTUM_CHOICES = (0.0, 0.01, 0.1, 0.5, 1.0)
#: a long row's length: several hundred values, so a 16-bit accumulator would drift
LONG_ROW = (256, 700)


def _st():
    from hypothesis import strategies as st
    return st


def _nonzero(st, shape, low=0.25, high=2.0):
    """Values with |v| in [low, high], random signs."""
    n = int(np.prod(shape))
    return st.tuples(floats((n,), low, high), st.lists(st.sampled_from((-1.0, 1.0)), min_size=n,
                                                        max_size=n)).map(
        lambda t: (t[0] * np.asarray(t[1], dtype=np.float64)).reshape(shape))


def _values(st, draw, shape):
    """x of ``shape``: extreme values now and then, an offset of 50 in one draw
    in four, NaN/+-inf in one in three; and a note saying which."""
    x = draw(floats(shape, -3.0, 3.0, extreme=draw(st.booleans())))
    offset = 50.0 if draw(st.integers(0, 3)) == 0 else 0.0
    x = x + offset
    nonfinite = draw(st.integers(0, 2)) == 0
    if nonfinite:
        x = with_nonfinite(draw, x)
    return x, offset, f"x {shape}" + (" offset 50" if offset else "") + (" NaN/inf" if nonfinite else "")


def _params(st, draw, shape, most):
    """0 to ``most`` of (weight, bias) of ``shape``: weight in [-2, 2], bias away from 0."""
    k = draw(st.sampled_from((0, 1, 2, 2)[:most + 1 + (most == 2)]))
    out = []
    if k >= 1:
        out.append(draw(floats(shape, -2.0, 2.0)))
    if k >= 2:
        out.append(draw(_nonzero(st, shape)))
    return tuple(out)


def _activation(st, draw, attrs):
    if draw(st.booleans()):
        attrs["activation"] = draw(st.sampled_from(FUSABLE_ACTIVATIONS))


def _row_shape(st, draw):
    """(x shape, normalised_ndim): 0 to 2 batch axes, 1 or 2 normalised ones;
    in one draw in four a few long rows. Rows hold 0 or at least 3 values
    (see :func:`_at_least_3`)."""
    if draw(st.integers(0, 3)) == 0:
        batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=1)))
        return batch + (draw(st.integers(*LONG_ROW)),), 1
    k = draw(st.integers(1, 2))
    normalised = _at_least_3(tuple(draw(st.lists(st.integers(0, 9), min_size=k, max_size=k))))
    batch = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=2)))
    return batch + normalised, k


def _at_least_3(sides):
    """``sides`` with the last one raised so that their product is 0 or >= 3.
    A row of one value normalises to exactly 0 (y = bias, dx = 0) and one of
    two to +-1 up to eps, so that dx cancels to (nearly) 0 and a relative
    comparison with torch in float64 measures only roundoff (torch's group_norm
    gives 2e-16 where the exact value is 0): those rows are pinned by
    tests/test_layernorm_family.py instead."""
    size = int(np.prod(sides, dtype=np.int64))
    if 0 < size < 3:
        sides = sides[:-1] + (sides[-1] * 3,)
    return sides


def _row_case(st, draw, dtype, primitive):
    shape, k = _row_shape(st, draw)
    x, _offset, note = _values(st, draw, shape)
    params = _params(st, draw, shape[len(shape) - k:], 2 if primitive == "layernorm" else 1)
    attrs = {"normalised_ndim": k}
    if primitive == "rmsnorm" and draw(st.booleans()):
        attrs["eps"] = machine_eps(dtype)            # eps=None, resolved as in this dtype
        note += " eps=None"
    else:
        attrs["eps"] = draw(st.sampled_from(EPS_CHOICES))
    if primitive == "layernorm":
        _activation(st, draw, attrs)
    inputs = (x,) + params
    return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))), note=f"{note} {attrs}")


def layernorm_strategy(dtype):
    st = _st()
    return st.composite(lambda draw: _row_case(st, draw, dtype, "layernorm"))()


def rmsnorm_strategy(dtype):
    st = _st()
    return st.composite(lambda draw: _row_case(st, draw, dtype, "rmsnorm"))()


def _group_shape(st, draw, instance):
    """(x shape, groups) of (N, C, *spatial): N 0..3, 0 to 2 spatial axes;
    in one draw in four a long group."""
    n = draw(st.integers(0, 3))
    if draw(st.integers(0, 3)) == 0:
        g = 1 if instance else draw(st.integers(1, 2))
        cg = 1 if instance else draw(st.integers(1, 3))
        s = draw(st.integers(*LONG_ROW)) // cg
        return (max(n, 1), g * cg, s), g
    g = draw(st.integers(1, 4))
    cg = 1 if instance else draw(st.integers(0, 3))
    spatial = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=2)))
    if cg * int(np.prod(spatial, dtype=np.int64)) in (1, 2):     # groups of 0 or >= 3 values (_at_least_3)
        spatial = _at_least_3((cg,) + spatial)[1:] if spatial else (3,)
    return (n, g * cg) + spatial, g


def groupnorm_strategy(dtype):
    st = _st()

    def case(draw):
        shape, groups = _group_shape(st, draw, False)
        x, _offset, note = _values(st, draw, shape)
        params = _params(st, draw, (shape[1],), 2)
        attrs = {"groups": groups, "eps": draw(st.sampled_from(EPS_CHOICES))}
        _activation(st, draw, attrs)
        inputs = (x,) + params
        return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))), note=f"{note} {attrs}")
    return st.composite(case)()


def instancenorm_train_strategy(dtype):
    """Without running statistics (an input the kernel writes cannot be drawn
    here: the suite checks that no input changes; the family's tests move them)."""
    st = _st()

    def case(draw):
        shape, _groups = _group_shape(st, draw, True)
        x, _offset, note = _values(st, draw, shape)
        affine = draw(st.booleans())
        params = (draw(floats((shape[1],), -2.0, 2.0)), draw(_nonzero(st, (shape[1],)))) if affine else ()
        attrs = {"affine": affine, "eps": draw(st.sampled_from(EPS_CHOICES)),
                 "momentum": draw(st.sampled_from(MOMENTUM_CHOICES))}
        _activation(st, draw, attrs)
        inputs = (x,) + params
        return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))), note=f"{note} {attrs}")
    return st.composite(case)()


def instancenorm_running_update_strategy(dtype):
    st = _st()

    def case(draw):
        n, c = draw(st.integers(0, 3)), draw(st.integers(0, 4))
        spatial = tuple(draw(st.lists(st.integers(2, 7), min_size=1, max_size=2)))
        if draw(st.integers(0, 5)) == 0:
            spatial = spatial[:-1] + (0,)
        x, offset, note = _values(st, draw, (n, c) + spatial)
        mean = draw(floats((c,), -2.0, 2.0)) + offset
        var = draw(floats((c,), 0.05, 3.0))
        momentum = draw(st.sampled_from(MOMENTUM_CHOICES))
        return Case(inputs=(x, mean, var), attrs={"momentum": momentum}, layouts=draw(layouts_for(3)),
                    note=f"{note} momentum={momentum}")
    return st.composite(case)()


# --- torch oracles ----------------------------------------------------------------------------------

def _empty(x, params):
    """An empty output connected to the inputs (their gradients: zeros)."""
    out = x * 1
    for p in params:
        out = out + p.sum() * 0
    return out


def _affine(y, weight, bias, channel_axis=None):
    """y * weight + bias in torch (per channel: on ``channel_axis``). The
    oracles scale and shift after torch's normalisation rather than in it:
    torch's fused form, x * (istd w) + (b - mean istd w), cancels where a
    row is constant far from 0 (a row of 50s with a weight and no bias gives
    9e-13 where the value is 0), while its plain normalisation is exact there."""
    def shaped(p):
        if channel_axis is None:
            return p
        return p.reshape((1, -1) + (1,) * (y.dim() - 2))
    if weight is not None:
        y = y * shaped(weight)
    if bias is not None:
        y = y + shaped(bias)
    return y


def layernorm_torch(x, weight=None, bias=None, normalised_ndim=1, eps=1e-5, activation="identity"):
    """torch's layer_norm over the last ``normalised_ndim`` axes (weight and
    bias applied after it: :func:`_affine`), then its activation."""
    import torch
    shape = tuple(x.shape[x.dim() - normalised_ndim:])
    y = torch.nn.functional.layer_norm(x, shape, None, None, eps)
    return torch_activated(_affine(y, weight, bias), activation)


def rmsnorm_torch(x, weight=None, normalised_ndim=1, eps=None):
    """torch's rms_norm over the last ``normalised_ndim`` axes."""
    import torch
    shape = tuple(x.shape[x.dim() - normalised_ndim:])
    return torch.nn.functional.rms_norm(x, shape, weight, eps)


def groupnorm_torch(x, weight=None, bias=None, *, groups, eps=1e-5, activation="identity"):
    """torch's group_norm (weight and bias applied after it: :func:`_affine`),
    then its activation. For an empty x, an empty output connected to the
    inputs: torch cannot split an empty channel axis into groups, and for
    groups of no values (S = 0) its dweight is the NaN of a mean over
    nothing, where the sum over no values is 0."""
    import torch
    if x.numel() == 0:
        return _empty(x, [p for p in (weight, bias) if p is not None])
    y = torch.nn.functional.group_norm(x, groups, None, None, eps)
    return torch_activated(_affine(y, weight, bias, channel_axis=1), activation)


def instancenorm_train_torch(x, *tensors, affine=False, eps=1e-5, momentum=0.1, activation="identity"):
    """torch's group_norm with one group per channel, then weight and bias
    (:func:`_affine`) and the activation: instance norm's math. (torch's
    instance_norm, a batch norm of the reshaped input, rounds each instance's
    mean less accurately: a constant instance of 50s normalises to 9e-13
    there, to exactly 0 in its group_norm and triflux; and it refuses
    instances of one value, which the primitive normalises to 0 as group_norm
    does. tests/test_layernorm_family.py checks against instance_norm itself.)"""
    import torch
    weight, bias = tensors[:2] if affine else (None, None)
    if x.numel() == 0:           # (as groupnorm_torch)
        return _empty(x, [p for p in (weight, bias) if p is not None])
    y = torch.nn.functional.group_norm(x, x.shape[1], None, None, eps)
    return torch_activated(_affine(y, weight, bias, channel_axis=1), activation)


def instancenorm_running_update_torch(x, running_mean, running_var, momentum=0.1):
    """The running statistics after torch's instance_norm of x in training
    (new tensors; an empty x moves nothing)."""
    import torch
    new_mean, new_var = running_mean.clone(), running_var.clone()
    if x.numel() > 0:
        torch.nn.functional.instance_norm(x, new_mean, new_var, use_input_stats=True, momentum=momentum)
    return new_mean, new_var


# --- tolerance floors -----------------------------------------------------------------------------

def _rows_view(x, attrs, groups):
    """x (float64) as (rows, M), and a function putting per-element arrays of x's shape the same way."""
    x = np.asarray(x, dtype=np.float64)
    if groups is None:
        k = attrs.get("normalised_ndim", 1)
        m = int(np.prod(x.shape[x.ndim - k:], dtype=np.int64))
    else:
        m = int(np.prod(x.shape[1:], dtype=np.int64)) // groups if groups else 0
    rows = x.size // m if m else 0
    return x.reshape(rows, m), (lambda a: np.broadcast_to(np.asarray(a, dtype=np.float64), x.shape).reshape(rows, m))


def _per_element(param, x_shape, attrs, groups):
    """|param| laid out as x (per position of the normalised axes, or per channel)."""
    p = np.abs(np.asarray(param, dtype=np.float64))
    if groups is None:
        return np.broadcast_to(p, x_shape)
    return np.broadcast_to(p.reshape((1, -1) + (1,) * (len(x_shape) - 2)), x_shape)


def _param_sum(terms, x_shape, attrs, groups):
    """sum over the rows of per-element terms, to a parameter's shape."""
    if groups is None:
        k = attrs.get("normalised_ndim", 1)
        return terms.reshape((-1,) + tuple(x_shape[len(x_shape) - k:])).sum(axis=0)
    return terms.reshape(x_shape[:2] + (-1,)).sum(axis=(0, 2))


def term_sizes(primitive, direction, inputs, attrs, out=None, grad=None, centring=False):
    """The floors of ``primitive``'s ``direction`` (as its ``<name>_magnitude``);
    with ``centring`` the size of xhat in the parameter gradients is that of
    the numbers whose difference it is, (|x - mean| + |mean|) * istd: the
    roundoff of x - mean, which a row of one value (xhat exactly 0) shows
    alone (torch's float64 gives 6e-16 there: tests/torch_samples.py)."""
    if primitive == "instancenorm_train":
        params = inputs[1:3] if attrs.get("affine") else ()
        return _floors(direction, inputs, attrs, out, grad, params, groups=np.shape(inputs[0])[1], centring=centring)
    groups = attrs["groups"] if primitive == "groupnorm" else None
    return _floors(direction, inputs, attrs, out, grad, inputs[1:], groups=groups, rms=primitive == "rmsnorm",
                   centring=centring)


def _floors(direction, inputs, attrs, out, grad, params, groups=None, rms=False, centring=False):
    x = inputs[0]
    if np.size(x) == 0:
        return None if direction == "forward" else (None,) * len(inputs)
    x_shape = np.shape(x)
    rows, as_rows = _rows_view(x, attrs, groups)
    m = rows.shape[1]
    eps = attrs.get("eps", 1e-5)
    with np.errstate(all="ignore"):
        if rms:
            istd = 1 / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps)
            xhat = np.abs(rows) * istd
        else:
            mean = rows.mean(axis=1, keepdims=True)
            istd = 1 / np.sqrt(np.mean((rows - mean) ** 2, axis=1, keepdims=True) + eps)
            xhat = (np.abs(rows - mean) + np.abs(mean) * centring) * istd
        w = as_rows(_per_element(params[0], x_shape, attrs, groups)) if params else 1.0
        activation = attrs.get("activation", "identity")
        if direction == "forward":
            terms = w * xhat + (as_rows(_per_element(params[1], x_shape, attrs, groups)) if len(params) > 1 else 0.0)
            if activation in ("sigmoid", "tanh"):
                y = np.asarray(out, dtype=np.float64) if out is not None else None
                if y is None:
                    return None
                slope = y * (1 - y) if activation == "sigmoid" else 1 - y * y
                terms = terms * np.abs(as_rows(slope))
            return finite_max(terms)
        t = as_rows(through_activation_terms(grad, out, activation, "layernorm magnitude"))
        tw = t * w
        dx = istd * (tw + tw.mean(axis=1, keepdims=True) * (not rms)
                     + xhat * (tw * xhat).mean(axis=1, keepdims=True))
        floors = [finite_max(dx)]
        if params:
            floors.append(finite_max(_param_sum((t * xhat).reshape(x_shape), x_shape, attrs, groups)))
        if len(params) > 1:
            floors.append(finite_max(_param_sum(t.reshape(x_shape), x_shape, attrs, groups)))
    return tuple(floors) + (None,) * (len(inputs) - len(floors))


def layernorm_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """The sizes of the terms the forward and backward add (module docstring)."""
    if direction == "forward" and out is None and attrs.get("activation", "identity") in ("sigmoid", "tanh"):
        out = reference(*inputs, **attrs)
    return _floors(direction, inputs, attrs, out, grad, inputs[1:])


def rmsnorm_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """The backward's term sizes (the forward is a product: no floor)."""
    if direction == "forward":
        return None
    return _floors(direction, inputs, attrs, out, grad, inputs[1:], rms=True)


def groupnorm_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """The sizes of the terms the forward and backward add, per group."""
    if direction == "forward" and out is None and attrs.get("activation", "identity") in ("sigmoid", "tanh"):
        out = reference(*inputs, **attrs)
    return _floors(direction, inputs, attrs, out, grad, inputs[1:], groups=attrs["groups"])


def instancenorm_train_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """groupnorm's floors with one group per channel."""
    if direction == "forward" and out is None and attrs.get("activation", "identity") in ("sigmoid", "tanh"):
        out = reference(*inputs, **attrs)
    params = inputs[1:3] if attrs.get("affine") else ()
    return _floors(direction, inputs, attrs, out, grad, params, groups=np.shape(inputs[0])[1])
