"""Embedding and EmbeddingBag: lookup tables of vectors, indexed by token."""
import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..arguments import float_dtype, int_arg
from ..constructors import randn
from ..devices import as_device, move_code
from ..embedding import embedding, embedding_bag
from ..errors import ArgumentError, DeviceMismatchError, DTypeError, ShapeError
from ..specs.gather import EMBEDDING_BAG_MODES, IndexRangeError, embedding_spec
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .initialisers import initial_weight

__all__ = ["Embedding", "EmbeddingBag"]


def _sizes(who, vocab_size, dim):
    """(vocab_size, dim): two ints, or Flux's pair ``(in, out)`` as the first argument."""
    if dim is None and isinstance(vocab_size, (tuple, list)) and len(vocab_size) == 2:
        vocab_size, dim = vocab_size
    if dim is None:
        raise ArgumentError(f"{who}: give the vocabulary size and the dimension, {who}(vocab_size, dim) (Flux's "
                            f"{who}(vocab_size => dim)), got only {vocab_size!r}")
    return int_arg(vocab_size, who, "vocab_size", low=0), int_arg(dim, who, "dim", low=0)


def _weight(who, vocab, dim, init, dtype, padding_idx, device):
    """The table (vocab, dim) drawn by ``init(vocab, dim)``, its padding row
    zeroed (as torch and Flux start it), on ``device``; and the padding row
    as an int in 0..vocab-1 (a negative one counts from the end) or None."""
    dtype = float_dtype(dtype, who)
    pad = embedding_spec((vocab, dim), (0,), dtype, _dt.int64, padding_idx, who=who).padding_idx
    weight = initial_weight(init, (vocab, dim), dtype, who)
    if pad is not None:
        values = weight.numpy().copy()
        values[pad] = 0
        weight = Tensor._from_numpy(values)
    if device is not None:
        weight = transfer(weight, as_device(device))
    return weight, pad


def _on_device(layer, x, like):
    """``x`` as a Tensor on ``like``'s device (an error naming the layer otherwise)."""
    if not isinstance(x, Tensor):
        x = as_tensor(np.asarray(x))
    if not (x._device is like._device or x._device == like._device):
        raise DeviceMismatchError(
            f"{layer_name(layer)}: its weight is on {like._device!r} but the input is on {x._device!r}. Put both "
            f"on one device: `x = {move_code(like._device)}` (the indices to the model's device) or "
            f"`model = {move_code(x._device, 'model')}`.")
    return x


def _indices(layer, x):
    """Integer indices as int32/int64 (other integer types widened)."""
    if x.dtype.kind in "iu" and x.dtype not in (_dt.int32, _dt.int64):
        x = ops.cast(x, _dt.int64)
    return x


def _named(layer, error):
    """``error`` (an IndexRangeError of the primitive) again, naming the layer."""
    text = str(error)
    if text.startswith("`"):
        text = text.split(": ", 1)[-1]
    return IndexRangeError(f"{layer_name(layer)}: {text}")


class Embedding(Layer):
    """A lookup table: row ``i`` of ``weight`` (vocab_size, dim) is the
    vector of token ``i``. ``Embedding(26, 4)`` is Flux's ``Embedding(26 =>
    4)``; ``weight`` has torch's layout ``(vocab_size, dim)`` (Flux's
    ``(dim, vocab_size)`` in the same memory order), drawn by ``init(vocab_size,
    dim)`` (standard normal, ``randn``, as Flux and torch).

    Called on integer indices of any shape K (0-based, int32/int64: Flux's
    token i is i - 1 here) it returns their rows, shape ``K + (dim,)``; on a
    float (or bool) one-hot input ``(..., vocab_size)`` it returns ``x @
    weight``, the same rows for one-hot rows (and a weighted sum for others)::

        emb = Embedding(26, 4)
        emb(tf.tensor([[3, 1], [20, 14]])).shape     # (2, 2, 4)

    ``padding_idx`` (an int, negative counting from the end): that row starts
    at zero and gets no gradient, so it stays zero (torch's; Flux's
    ``padding_idx`` is 1-based). ``scale_grad_by_freq``: each row's gradient
    divided by how often its token occurs in the batch (torch's). An index
    outside the vocabulary is an ``IndexRangeError`` naming the range, on
    every device, before any row is read; float indices are a ``DTypeError``.
    Repeated tokens' gradients are summed in a fixed order (the same on every
    run).

    Math: reference/gather.py ``embedding_forward``."""

    def __init__(self, vocab_size, dim=None, *, padding_idx=None, scale_grad_by_freq=False, init=randn,
                 dtype=_dt.float32, device=None):
        vocab, dim = _sizes("Embedding", vocab_size, dim)
        self.weight, self.padding_idx = _weight("Embedding", vocab, dim, init, dtype, padding_idx, device)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)

    @property
    def vocab_size(self):
        return self.weight.shape[0]

    @property
    def dim(self):
        return self.weight.shape[1]

    def __call__(self, x):
        x = _on_device(self, x, self.weight)
        kind = x.dtype.kind
        if kind in "iu":
            try:
                return embedding(_indices(self, x), self.weight, padding_idx=self.padding_idx,
                                 scale_grad_by_freq=self.scale_grad_by_freq)
            except IndexRangeError as e:
                raise _named(self, e) from None
        if _dt.is_floating(x.dtype) or kind == "b":
            if x.ndim == 0 or x.shape[-1] != self.vocab_size:
                raise ShapeError(f"{layer_name(self)} takes integer indices of any shape, or a one-hot input whose "
                                 f"last axis has the vocabulary's {self.vocab_size} entries; got a {x.dtype} input "
                                 f"of shape {x.shape}. Indices held as floats: convert them with "
                                 "`x.astype('int64')`")
            return ops.matmul(ops.cast(x, self.weight.dtype), self.weight)
        raise DTypeError(f"{layer_name(self)} takes integer indices (int32/int64) or a one-hot float input, got "
                         f"dtype {x.dtype}")

    def _signature(self):
        s = f"{self.vocab_size} => {self.dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s


def _mode(mode):
    """"sum", "mean" or "max", from a string or Flux's reduction function (sum, mean, maximum)."""
    name = mode if isinstance(mode, str) else getattr(mode, "__name__", None)
    name = {"add": "sum", "maximum": "max", "amax": "max"}.get(name, name)
    if name not in EMBEDDING_BAG_MODES:
        raise ArgumentError(f"EmbeddingBag: mode must be one of {', '.join(map(repr, EMBEDDING_BAG_MODES))} (or "
                            f"Flux's reduction: sum, mean, max), got {mode!r}")
    return name


class EmbeddingBag(Layer):
    """A lookup table whose rows are reduced over *bags* of tokens: each bag
    gives one vector, the ``mode`` ("mean", the default as Flux's, "sum" or
    "max") of the rows of its tokens. ``EmbeddingBag(26, 3, "sum")`` is
    Flux's ``EmbeddingBag(26 => 3, sum)``; ``weight`` (vocab_size, dim), drawn
    by ``init(vocab_size, dim)`` (standard normal).

    * ``bag(indices)`` on ``(B, L)`` indices: B bags of L tokens each, result
      ``(B, dim)`` (any leading axes: ``(..., L)`` gives ``(..., dim)``; a 1-D
      input is one bag, result ``(dim,)``, as Flux's);
    * ``bag(indices, offsets)`` on 1-D indices: bag b holds
      indices[offsets[b] : offsets[b + 1]] (the last to the end; offsets
      0-based, starting at 0, as torch's; Flux's ``at`` is 1-based), result
      ``(B, dim)``; an empty bag gives zeros;
    * ``per_sample_weights`` (the indices' shape, mode "sum"): each row
      weighted before the sum (and differentiated).

    ``padding_idx``: tokens of that row are left out of their bag (it starts
    at zero); ``include_last_offset``: offsets hold B + 1 entries, the last
    len(indices) (torch's CSR form); ``scale_grad_by_freq`` as Embedding's.
    max propagates NaN, and its gradient goes to the first token of the bag
    that attains the maximum. Errors as Embedding's.

    Math: reference/gather.py ``embedding_bag_forward``."""

    def __init__(self, vocab_size, dim=None, mode="mean", *, padding_idx=None, include_last_offset=False,
                 scale_grad_by_freq=False, init=randn, dtype=_dt.float32, device=None):
        if dim is not None and not isinstance(dim, (int, np.integer)) and isinstance(vocab_size, (tuple, list)):
            vocab_size, dim, mode = vocab_size, None, dim       # EmbeddingBag((26, 3), "sum"): Flux's pair form
        vocab, dim = _sizes("EmbeddingBag", vocab_size, dim)
        self.mode = _mode(mode)
        self.weight, self.padding_idx = _weight("EmbeddingBag", vocab, dim, init, dtype, padding_idx, device)
        self.include_last_offset = bool(include_last_offset)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)

    @property
    def vocab_size(self):
        return self.weight.shape[0]

    @property
    def dim(self):
        return self.weight.shape[1]

    def __call__(self, indices, offsets=None, per_sample_weights=None):
        x = _on_device(self, indices, self.weight)
        if x.dtype.kind not in "iu":
            raise DTypeError(f"{layer_name(self)} takes integer indices (int32/int64), got dtype {x.dtype}"
                             + (": convert them with `x.astype('int64')`" if _dt.is_floating(x.dtype) else ""))
        if offsets is not None:
            offsets = _indices(self, _on_device(self, offsets, self.weight))
        if per_sample_weights is not None:
            per_sample_weights = ops.cast(_on_device(self, per_sample_weights, self.weight), self.weight.dtype)
        try:
            return embedding_bag(_indices(self, x), self.weight, offsets, mode=self.mode,
                                 per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
                                 padding_idx=self.padding_idx, scale_grad_by_freq=self.scale_grad_by_freq)
        except IndexRangeError as e:
            raise _named(self, e) from None

    def _signature(self):
        s = f"{self.vocab_size} => {self.dim}"
        if self.mode != "mean":
            s += f", mode={self.mode!r}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s
