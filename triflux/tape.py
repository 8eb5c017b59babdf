"""The tape: the primitives applied while ``gradient`` runs.

``triflux.dispatch.apply`` records every primitive whose inputs include a
watched tensor, or a result of one; ``triflux.autodiff`` makes the tape,
watches the arguments, and walks the records backwards. Outside
``gradient`` there is no tape and nothing is recorded.
"""

#: the tape in use, or None outside ``gradient`` (a module global: cheap to test)
TAPE = None


class Tape:
    """The records ``(primitive, inputs, output, attrs)`` in the order applied,
    and the ids of the live tensors: the watched ones and every output
    computed from them."""
    __slots__ = ("live", "nodes")

    def __init__(self, watched):
        self.live = {id(t) for t in watched}
        self.nodes = []

    def record(self, prim, inputs, out, attrs):
        live = self.live
        for t in inputs:
            if id(t) in live:
                self.nodes.append((prim, inputs, out, attrs))
                live.add(id(out))
                return


def in_gradient():
    """True while ``gradient`` is recording (layers use it for train mode)."""
    return TAPE is not None
