"""The one registry of primitives.

A primitive is declared once (``triflux/primitives.py``) by name and family.
Its five parts are found by that name, so reference and kernel files mirror
each other and the property suite covers every primitive automatically:

===================  ===============================================================
part                 where
===================  ===============================================================
reference forward    ``triflux.reference.<family>.<name>_forward``
reference backward   ``triflux.reference.<family>.<name>_backward``
kernel forward       ``triflux.triton_kernels.<family>.<name>_forward``
kernel backward      ``triflux.triton_kernels.<family>.<name>_backward``
strategy             ``triflux.testing.<family>.<name>_strategy``
(torch oracle)       ``triflux.testing.<family>.<name>_torch`` (tests only)
===================  ===============================================================

Calling conventions, identical for the reference (NumPy arrays) and the kernels
(torch tensors used as storage):

* ``<name>_forward(*inputs, **attrs) -> output``. ``attrs`` are hashable Python
  values (ints, tuples, bools, floats, dtypes).
* ``<name>_backward(grad, out, *inputs, **attrs) -> tuple`` with one entry per
  input: the gradient, shaped and typed like that input, or ``None`` where the
  input has no gradient (a boolean condition, an integer index).
* A primitive declared ``partial_backward`` also takes ``needs=`` (one bool
  per input) and may return ``None`` for inputs not needed; autodiff passes
  it so, e.g., no gradient is computed for a layer's input data.
* Non-differentiable primitives (comparisons, fills, optimiser updates) have
  no backward; ``in_place`` primitives mutate their first inputs and return
  ``None``.
* ``<name>_strategy(dtype)`` returns a hypothesis strategy of
  :class:`triflux.testing.Case`; ``<name>_torch(*tensors, **attrs)`` computes
  the same forward with torch, the independent oracle.

Reference modules import at once (NumPy only); kernel and testing modules are
imported on first use, so neither torch nor Triton nor hypothesis is needed
for CPU work.
"""
import importlib
from dataclasses import dataclass, field

ALL_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(eq=False)
class Primitive:
    name: str
    family: str
    differentiable: bool = True
    in_place: bool = False
    random: bool = False
    partial_backward: bool = False
    dtypes: tuple = ALL_FLOAT_DTYPES
    doc: str = ""
    _cache: dict = field(default_factory=dict, repr=False)

    def _lookup(self, package, suffix):
        key = (package, suffix)
        fn = self._cache.get(key)
        if fn is None:
            module = importlib.import_module(f"triflux.{package}.{self.family}")
            fn = getattr(module, f"{self.name}_{suffix}")
            self._cache[key] = fn
        return fn

    def reference(self, direction="forward"):
        return self._lookup("reference", direction)

    def kernel(self, direction="forward"):
        return self._lookup("triton_kernels", direction)

    def impl(self, on_cpu, direction="forward"):
        return self._lookup("reference" if on_cpu else "triton_kernels", direction)

    def strategy(self, dtype):
        return self._lookup("testing", "strategy")(dtype)

    def torch_oracle(self):
        return self._lookup("testing", "torch")

    def parts(self):
        """(part name, package, suffix) for every part this primitive must have."""
        out = [("reference forward", "reference", "forward"),
               ("kernel forward", "triton_kernels", "forward"),
               ("strategy", "testing", "strategy"),
               ("torch oracle", "testing", "torch")]
        if self.differentiable:
            out += [("reference backward", "reference", "backward"),
                    ("kernel backward", "triton_kernels", "backward")]
        return out


REGISTRY: dict = {}


def register(name, family, **kw):
    if name in REGISTRY:
        raise ValueError(f"primitive {name!r} registered twice")
    p = Primitive(name, family, **kw)
    REGISTRY[name] = p
    return p


def get(name):
    return REGISTRY[name]


def all_primitives():
    from . import primitives  # noqa: F401  (fills REGISTRY)
    return list(REGISTRY.values())
