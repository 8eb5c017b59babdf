"""The conversions of the embedding tables: Embedding <-> Embedding and
EmbeddingBag <-> EmbeddingBag (the table, padding_idx, scale_grad_by_freq,
and the bag's mode and include_last_offset). Both sides index from 0 and hold
the table as (vocab_size, dim). torch's ``max_norm`` (renormalising the rows
read, in place, during the forward) has no triflux counterpart and is refused;
``sparse`` (the form of torch's gradient) has no meaning here and is dropped."""
from triflux.layers import Embedding, EmbeddingBag
from .conversion import refuse_from
from .parameters import set_params, torch_device_of, torch_dtype_of, torch_tensor_copy
from .torch_modules import import_torch


def _refuse_max_norm(m, path):
    if m.max_norm is not None:
        refuse_from(path, m, f"max_norm={m.max_norm} (rows renormalised in place as they are read)",
                    "renormalise the weight yourself, or build the module with max_norm=None")


def _with_table(layer, m):
    """``layer`` holding torch module ``m``'s table as it is (its padding row included)."""
    layer.weight = torch_tensor_copy(m.weight)
    return layer


def embedding_from_torch(m, path, options):
    _refuse_max_norm(m, path)
    layer = Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx,
                      scale_grad_by_freq=m.scale_grad_by_freq, dtype=torch_tensor_copy(m.weight).dtype)
    return _with_table(layer, m)


def embedding_to_torch(x, path):
    w = x.weight
    mod = import_torch().nn.Embedding(w.shape[0], w.shape[1], padding_idx=x.padding_idx,
                                      scale_grad_by_freq=x.scale_grad_by_freq, dtype=torch_dtype_of(w),
                                      device=torch_device_of(w))
    return set_params(mod, weight=w)


def embedding_bag_from_torch(m, path, options):
    _refuse_max_norm(m, path)
    layer = EmbeddingBag(m.num_embeddings, m.embedding_dim, m.mode, padding_idx=m.padding_idx,
                         include_last_offset=m.include_last_offset, scale_grad_by_freq=m.scale_grad_by_freq,
                         dtype=torch_tensor_copy(m.weight).dtype)
    return _with_table(layer, m)


def embedding_bag_to_torch(x, path):
    w = x.weight
    mod = import_torch().nn.EmbeddingBag(w.shape[0], w.shape[1], mode=x.mode, padding_idx=x.padding_idx,
                                         include_last_offset=x.include_last_offset,
                                         scale_grad_by_freq=x.scale_grad_by_freq, dtype=torch_dtype_of(w),
                                         device=torch_device_of(w))
    return set_params(mod, weight=w)
