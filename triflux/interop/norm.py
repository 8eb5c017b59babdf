"""BatchNorm1d/2d/3d <-> BatchNorm: weights, running statistics and mode.
triflux's BatchNorm takes any rank; on the way to torch the class is the one
it came from, else the rank of the layer before it in the model."""
from triflux.layers import BatchNorm
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
