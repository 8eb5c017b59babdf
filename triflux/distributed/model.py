"""``FluxDistributedModel``: a model marked as trained data-parallel."""
from ..layers.base import Layer

__all__ = ["FluxDistributedModel", "DistributedModel"]


class FluxDistributedModel(Layer):
    """A thin wrapper marking ``model`` as distributed (Flux's
    ``DistributedUtils.FluxDistributedModel``). Calling it calls the model;
    ``synchronize(backend, FluxDistributedModel(model))`` broadcasts the
    root's parameters into every worker's model and returns the model
    itself, as in Flux::

        model = synchronize(backend, FluxDistributedModel(model), root=0)

    It is a layer with one child, ``model``, so ``setup``, ``gradient``,
    ``gpu``/``cpu`` and ``state`` also work on the wrapper."""

    def __init__(self, model):
        if isinstance(model, FluxDistributedModel):
            model = model.model
        self.model = model

    def __call__(self, *args, **kw):
        return self.model(*args, **kw)

    def __repr__(self):
        return f"FluxDistributedModel({self.model!r})"


#: the same wrapper under its short name (API.md)
DistributedModel = FluxDistributedModel
