"""The conversions of a multilayer perceptron's layers: Linear <-> Dense
(with the layer's activation), Dropout <-> Dropout (its mode kept) and
Flatten <-> flatten."""
from triflux.layers import Dense, Dropout, flatten
from .activations import with_activation
from .conversion import active_for, refuse_from
from .parameters import set_params, torch_array, torch_device_of, torch_dtype_of, torch_tensor_copy
from .torch_modules import import_torch


# Linear <-> Dense

def dense_from_torch(m, path, options):
    w = torch_array(m.weight)
    layer = Dense(m.in_features, m.out_features, init=lambda *s: w, dtype=w.dtype, bias=m.bias is not None)
    if m.bias is not None:
        layer.bias = torch_tensor_copy(m.bias)
    return layer


def dense_to_torch(x, path):
    w = x.weight
    mod = import_torch().nn.Linear(w.shape[1], w.shape[0], bias=x.bias is not None, dtype=torch_dtype_of(w),
                                   device=torch_device_of(w))
    return with_activation(set_params(mod, weight=w, bias=x.bias), x, path)


# Dropout <-> Dropout

def dropout_from_torch(m, path, options):
    layer = Dropout(m.p)
    layer.active = active_for(m, options)
    return layer


def dropout_to_torch(x, path):
    mod = import_torch().nn.Dropout(x.p)
    mod.train(x.active is not False)
    return mod


# Flatten <-> flatten

def flatten_from_torch(m, path, options):
    if m.start_dim != 1 or m.end_dim != -1:
        refuse_from(path, m, f"start_dim={m.start_dim}, end_dim={m.end_dim}",
                    "triflux's flatten keeps axis 0 and flattens the rest (start_dim=1, end_dim=-1)")
    return flatten


def flatten_to_torch(x, path):
    return import_torch().nn.Flatten()
