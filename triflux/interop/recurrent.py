"""RNN, LSTM, GRU <-> RNN, LSTM, GRU. triflux's recurrent layers are
batch-first and return the output sequence only; in torch they become
``TorchSequence(nn.RNN/LSTM/GRU(..., batch_first=True))``, which does the
same, so they chain with Linear."""
from triflux import activations as A
from triflux.layers import GRU, LSTM, RNN, Chain, Dropout
from .conversion import active_for, refuse_from, refuse_to
from .parameters import set_params, torch_array, torch_device_of, torch_dtype_of, torch_tensor_copy
from .torch_modules import import_torch, torch_classes


# RNN, LSTM, GRU <-> RNN, LSTM, GRU (as TorchSequence)

RECURRENT = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}   # torch.nn's name: triflux's layer
RNN_NONLINEARITIES = {"tanh": A.tanh, "relu": A.relu}


def recurrent_from_torch(m, path, options):
    """torch.nn.RNN/LSTM/GRU as triflux's layer of the same name (a Chain of
    them, with Dropout between, for ``num_layers > 1``). triflux's layers are
    batch-first and return the output sequence only, whatever ``batch_first``
    says: feed them (N, L, in)."""
    cls = RECURRENT[type(m).__name__]
    if m.bidirectional:
        refuse_from(path, m, "bidirectional=True", "triflux's recurrent layers run forward in time; run a "
                    "second layer on the time-reversed sequence and concat the outputs")
    if getattr(m, "proj_size", 0):
        refuse_from(path, m, f"proj_size={m.proj_size}")
    if not m.bias:
        refuse_from(path, m, "bias=False", "triflux's recurrent layers have bias_ih and bias_hh")
    layers = []
    for k in range(m.num_layers):
        ins = m.input_size if k == 0 else m.hidden_size
        w = torch_array(getattr(m, f"weight_ih_l{k}"))
        activation = (RNN_NONLINEARITIES[m.nonlinearity],) if cls is RNN else ()
        layer = cls(ins, m.hidden_size, *activation, dtype=w.dtype)
        for field in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(layer, field, torch_tensor_copy(getattr(m, f"{field}_l{k}")))
        if k and m.dropout:
            drop = Dropout(m.dropout)
            drop.active = active_for(m, options)
            layers.append(drop)
        layers.append(layer)
    return layers[0] if len(layers) == 1 else Chain(*layers)


def recurrent_to_torch(x, path):
    nn = import_torch().nn
    name = type(x).__name__
    if x.return_state:
        refuse_to(path, f"{name} with return_state=True", "a layer returning its state does not chain; "
                  "use return_state=False and call the torch module directly for the state")
    w = x.weight_ih
    kw = dict(batch_first=True, dtype=torch_dtype_of(w), device=torch_device_of(w))
    if type(x) is RNN:
        nonlinearity = {f: n for n, f in RNN_NONLINEARITIES.items()}[x.activation]
        mod = nn.RNN(x.in_features, x.out_features, nonlinearity=nonlinearity, **kw)
    else:
        mod = getattr(nn, name)(x.in_features, x.out_features, **kw)
    set_params(mod, weight_ih_l0=x.weight_ih, weight_hh_l0=x.weight_hh, bias_ih_l0=x.bias_ih,
               bias_hh_l0=x.bias_hh)
    return torch_classes()["TorchSequence"](mod)


def sequence_from_torch(m, path, options):
    return recurrent_from_torch(m.rnn, f"{path}.rnn", options)
