"""The normalisations: BatchNorm1d/2d/3d <-> BatchNorm, LayerNorm <->
LayerNorm, GroupNorm <-> GroupNorm, InstanceNorm1d/2d/3d <-> InstanceNorm and
RMSNorm <-> RMSNorm: weights, running statistics and mode.
triflux's BatchNorm and InstanceNorm take any rank; on the way to torch the
class is the one they came from, else the rank of the layer before them in
the model (:func:`feeding_rank`), else 2d."""
from triflux import dtypes as _dt
from triflux.layers import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from triflux.tensor import Tensor
from .activations import with_activation
from .conversion import active_for, feeding_rank, refuse_from
from .parameters import set_params, torch_array, torch_device_of, torch_dtype_of, torch_tensor_copy
from .torch_modules import import_torch


# BatchNorm1d/2d/3d <-> BatchNorm

def batchnorm_from_torch(m, path, options):
    if not m.affine:
        refuse_from(path, m, "affine=False", "use affine=True (triflux's BatchNorm always has γ and β)")
    if not m.track_running_stats:
        refuse_from(path, m, "track_running_stats=False",
                    "use track_running_stats=True (triflux's BatchNorm keeps running statistics)")
    if m.momentum is None:
        refuse_from(path, m, "momentum=None (a cumulative average)", "give a number, e.g. momentum=0.1")
    w = torch_array(m.weight)
    layer = BatchNorm(m.num_features, eps=m.eps, momentum=m.momentum, dtype=w.dtype)
    layer.weight, layer.bias = Tensor._from_numpy(w), torch_tensor_copy(m.bias)
    layer.running_mean, layer.running_var = torch_tensor_copy(m.running_mean), torch_tensor_copy(m.running_var)
    layer.active = active_for(m, options)
    # kept for to_torch (torch only reads it when momentum is None)
    layer._torch = {"class": type(m).__name__, "num_batches_tracked": int(m.num_batches_tracked)}
    return layer


def batchnorm_to_torch(x, path):
    w = x.weight
    info = getattr(x, "_torch", {})
    # torch's class by the rank of what feeds it (a triflux BatchNorm takes any): the one it came
    # from, else that of the layer before it in the model (Dense: 1d, Conv((3, 3, 3)): 3d), else 2d
    cls = getattr(import_torch().nn, info.get("class", f"BatchNorm{feeding_rank(x)}d"))
    mod = cls(w.shape[0], eps=x.eps, momentum=x.momentum, dtype=torch_dtype_of(w), device=torch_device_of(w))
    set_params(mod, weight=w, bias=x.bias, running_mean=x.running_mean, running_var=x.running_var)
    mod.num_batches_tracked.fill_(info.get("num_batches_tracked", 0))
    mod.train(x.active is not False)
    return with_activation(mod, x, path)


# LayerNorm <-> LayerNorm, RMSNorm <-> RMSNorm, GroupNorm <-> GroupNorm

def _dtype(*params):
    """The dtype of the first torch parameter or buffer that exists (float32 when none does)."""
    for p in params:
        if p is not None:
            return torch_array(p).dtype
    return _dt.float32


def _copy(p):
    return None if p is None else torch_tensor_copy(p)


def _torch_placement(*tensors):
    """``dtype`` and ``device`` for a torch module holding triflux ``tensors`` (the first that exists;
    torch's defaults when none does)."""
    t = next((t for t in tensors if t is not None), None)
    return {} if t is None else {"dtype": torch_dtype_of(t), "device": torch_device_of(t)}


def layernorm_from_torch(m, path, options):
    layer = LayerNorm(tuple(m.normalized_shape), eps=m.eps, affine=m.elementwise_affine, bias=m.bias is not None,
                      dtype=_dtype(m.weight, m.bias))
    if m.elementwise_affine:
        layer.weight, layer.bias = _copy(m.weight), _copy(m.bias)
    return layer


def layernorm_to_torch(x, path):
    mod = import_torch().nn.LayerNorm(x.size, eps=x.eps, elementwise_affine=x.affine, bias=x.bias is not None,
                                      **_torch_placement(x.weight, x.bias))
    set_params(mod, weight=x.weight, bias=x.bias)
    return with_activation(mod, x, path)


def rmsnorm_from_torch(m, path, options):
    layer = RMSNorm(tuple(m.normalized_shape), eps=m.eps, affine=m.elementwise_affine, dtype=_dtype(m.weight))
    if m.elementwise_affine:
        layer.weight = _copy(m.weight)
    return layer


def rmsnorm_to_torch(x, path):
    mod = import_torch().nn.RMSNorm(x.size, eps=x.eps, elementwise_affine=x.affine, **_torch_placement(x.weight))
    return set_params(mod, weight=x.weight)


def _refuse_weight_only(m, path, layer):
    """torch's ``affine=True, bias=False`` (a weight without a bias), which triflux's ``layer`` lacks."""
    if m.affine and getattr(m, "bias", None) is None:
        refuse_from(path, m, "affine=True with bias=False",
                    f"use bias=True, or affine=False (triflux's {layer} has both weight and bias, or neither)")


def groupnorm_from_torch(m, path, options):
    _refuse_weight_only(m, path, "GroupNorm")
    # torch's (num_groups, num_channels), Flux's and triflux's (channels, groups)
    layer = GroupNorm(m.num_channels, m.num_groups, eps=m.eps, affine=m.affine, dtype=_dtype(m.weight))
    if m.affine:
        layer.weight, layer.bias = _copy(m.weight), _copy(m.bias)
    return layer


def groupnorm_to_torch(x, path):
    mod = import_torch().nn.GroupNorm(x.groups, x.channels, eps=x.eps, affine=x.affine,
                                      **_torch_placement(x.weight, x.bias))
    set_params(mod, weight=x.weight, bias=x.bias)
    return with_activation(mod, x, path)


# InstanceNorm1d/2d/3d <-> InstanceNorm

def instancenorm_from_torch(m, path, options):
    _refuse_weight_only(m, path, "InstanceNorm")
    if m.momentum is None:
        refuse_from(path, m, "momentum=None (a cumulative average)",
                    "give a number, e.g. momentum=0.1 (triflux's InstanceNorm moves its running statistics by "
                    "an exponential average)")
    layer = InstanceNorm(m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                         track_stats=m.track_running_stats, dtype=_dtype(m.weight, m.running_mean))
    if m.affine:
        layer.weight, layer.bias = _copy(m.weight), _copy(m.bias)
    if m.track_running_stats:
        layer.running_mean, layer.running_var = _copy(m.running_mean), _copy(m.running_var)
    layer.active = active_for(m, options)
    info = {"class": type(m).__name__}
    if m.track_running_stats:   # kept for to_torch (torch only reads it when momentum is None)
        info["num_batches_tracked"] = int(m.num_batches_tracked)
    layer._torch = info
    return layer


def instancenorm_to_torch(x, path):
    info = getattr(x, "_torch", {})
    # torch's class by the rank of what feeds it, as BatchNorm's: the one it came from, else that of
    # the layer before it in the model (Conv((3,)): 1d), else 2d
    cls = getattr(import_torch().nn, info.get("class", f"InstanceNorm{feeding_rank(x)}d"))
    mod = cls(x.channels, eps=x.eps, momentum=x.momentum, affine=x.affine, track_running_stats=x.track_stats,
              **_torch_placement(x.weight, x.running_mean))
    set_params(mod, weight=x.weight, bias=x.bias, running_mean=x.running_mean, running_var=x.running_var)
    if x.track_stats:
        mod.num_batches_tracked.fill_(info.get("num_batches_tracked", 0))
    mod.train(x.active is not False)
    return with_activation(mod, x, path)
