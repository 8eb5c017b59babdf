"""What a primitive is, and what to write to add one.

To add a primitive ``<name>`` of family ``<family>``, write:

1. its declaration in ``triflux/primitives.py`` (which fills and holds
   ``REGISTRY``): ``register("<name>", "<family>", accumulates=..., flops=...,
   doc=...)`` with its traits, the fields of :class:`Primitive` (``accumulates``
   has no default for a differentiable primitive, ``flops`` none for any
   primitive: :class:`PerElement` counts, or the name of an exact count in the
   family's spec, which the kernel report's roofline reads);
2. the reference, ``<name>_forward`` and (if differentiable) ``<name>_backward``
   in ``triflux.reference.<family>``, the math in their docstrings;
3. the kernel, the same two functions in ``triflux.triton_kernels.<family>``;
4. the testing part in ``triflux.testing.<family>``: ``<name>_strategy(dtype)``,
   ``<name>_torch(*tensors, **attrs)`` (the oracle), and, only where the
   generic tolerance floors miss a cancellation, ``<name>_magnitude(direction,
   *, inputs, attrs, out=None, grad=None, reference=None)``;
5. the user-facing function (``triflux/ops.py``, or ``triflux/spatial.py`` for
   the spatial families and ``triflux/normalisation.py`` for the per-sample
   normalisations, which ``ops`` re-exports) or layer (``triflux/layers/``),
   only when there is one. A new layer class also needs its constructor
   arguments in ``triflux/model_file.py``'s ``CONSTRUCTOR_ARGUMENTS`` (so model
   files rebuild it) and, where torch has the module, a ``Conversion`` in
   ``triflux/interop/table.py``'s ``CONVERSIONS``.

tests/test_registry.py checks 1-4 and says what is missing where (the flops
declaration included); tests/test_model_file.py checks 5's model-file entry;
the property suite (tests/test_primitives.py) then cross-checks every part.

Calling conventions, identical for the reference (NumPy arrays) and the kernels
(torch tensors used as storage):

* ``<name>_forward(*inputs, **attrs) -> output``. ``attrs`` are hashable Python
  values (ints, tuples, bools, floats, dtypes).
* ``<name>_backward(grad, out, *inputs, **attrs) -> tuple`` with one entry per
  input: the gradient, shaped and typed like that input, or ``None`` where the
  input has no gradient (a boolean condition, an integer index).
* A primitive declared ``partial_backward`` also takes ``needs=`` (one bool
  per input) and may return ``None`` for inputs not needed.
* Non-differentiable primitives have no backward; in-place primitives
  overwrite the inputs they declare in ``mutates`` and return ``None``.
* A primitive declared ``foreach`` also has ``<name>_foreach(*lists, **attrs)``
  (reference and kernel): the same update on lists of tensors, one launch per
  dtype on a GPU (the optimisers' multi-tensor updates).
* ``<name>_magnitude`` returns a floor for the denominator of the relative
  error of that direction (a float forward, a tuple with one entry per input
  backward), or None to leave it to the generic floors of the traits.

Reference modules import at once (NumPy only); kernel and testing modules are
imported on first use, so neither torch nor Triton nor hypothesis is needed
for CPU work.
"""
import importlib
from dataclasses import dataclass, field

ALL_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class PerElement:
    """A primitive's floating-point operations as a count per element of the
    call's largest tensor, forward and backward: the model of the primitives
    without a contraction (elementwise math, reductions, normalisation, copies: 0)."""
    forward: float
    backward: float


@dataclass(frozen=True, eq=False)
class Primitive:
    """A declared primitive: its name, family and traits, and its parts found by name."""
    name: str
    family: str
    #: has a backward
    differentiable: bool = True
    #: whether the kernels add up long sums (reductions over an axis, dot
    #: products), whose float32 rounding error grows with the length K;
    #: None = not stated, which the completeness test rejects when differentiable
    accumulates: bool | None = None
    #: the forward is a sum of products of the inputs, so its rounding error is
    #: bounded by the same computation on the inputs' absolute values
    multilinear_forward: bool = False
    #: the backward is a sum of products of the output gradient and the inputs
    multilinear_backward: bool = False
    #: elementwise with NumPy broadcasting: the gradient of a broadcast input
    #: is a sum over the broadcast axes
    broadcasting: bool = False
    #: the values of the ``activation`` attr a fused primitive applies
    fusable_activations: tuple = ()
    #: the backward takes ``needs=`` and may skip gradients nobody needs
    partial_backward: bool = False
    #: the indices of the inputs an in-place primitive (an optimiser update)
    #: overwrites; it returns None
    mutates: tuple = ()
    #: also has a list form ``<name>_foreach(xs, gs, *state lists, **attrs)``
    #: (reference and kernel) that updates many parameters in one launch per dtype
    foreach: bool = False
    #: draws random numbers from a ``seed`` attr
    random: bool = False
    dtypes: tuple = ALL_FLOAT_DTYPES
    #: the floating-point operations of a call, for the kernel report's roofline: a
    #: :class:`PerElement`, or the name of a function of the family's spec module
    #: (``triflux.specs.<family>``) ``fn(name, direction, inputs, out_shape, attrs, largest)``
    #: for the exact count of a contraction (inputs: the shapes of the inputs; out_shape:
    #: the output's; largest: the elements of the largest tensor of the call)
    flops: object = None
    doc: str = ""
    _found: dict = field(default_factory=dict, repr=False)

    @property
    def in_place(self):
        return bool(self.mutates)

    def _find(self, package, suffix, required=True):
        key = (package, suffix)
        found = self._found.get(key)
        if found is not None:
            return found
        if key not in self._found:
            module = importlib.import_module(f"triflux.{package}.{self.family}")
            fn = getattr(module, f"{self.name}_{suffix}", None)
            if fn is None and required:
                raise AttributeError(f"triflux.{package}.{self.family} defines no "
                                     f"{self.name}_{suffix}")
            self._found[key] = fn
        return self._found[key]

    def reference(self, direction="forward"):
        """The NumPy reference of ``direction`` ("forward" or "backward")."""
        return self._find("reference", direction)

    def kernel(self, direction="forward"):
        """The Triton kernel of ``direction``."""
        return self._find("triton_kernels", direction)

    def strategy(self, dtype):
        """A hypothesis strategy of :class:`triflux.testing.Case` in ``dtype``."""
        return self._find("testing", "strategy")(dtype)

    def torch_oracle(self):
        """The forward computed with torch, the independent oracle."""
        return self._find("testing", "torch")

    def magnitude(self):
        """The optional tolerance floor ``<name>_magnitude``, or None."""
        return self._find("testing", "magnitude", required=False)

    def count_flops(self, direction, inputs, out_shape, attrs, largest):
        """The floating-point operations of one call in ``direction``
        ("forward", "backward" or "update"), from the declared :attr:`flops`."""
        if isinstance(self.flops, PerElement):
            return (self.flops.backward if direction == "backward" else self.flops.forward) * largest
        count = getattr(importlib.import_module(f"triflux.specs.{self.family}"), self.flops)
        return count(self.name, direction, inputs, out_shape, attrs, largest)

    def parts(self):
        """(part, package, suffix) for every part this primitive must have."""
        out = [("reference forward", "reference", "forward"),
               ("kernel forward", "triton_kernels", "forward"),
               ("strategy", "testing", "strategy"),
               ("torch oracle", "testing", "torch")]
        if self.differentiable:
            out += [("reference backward", "reference", "backward"),
                    ("kernel backward", "triton_kernels", "backward")]
        if self.foreach:
            out += [("reference foreach", "reference", "foreach"),
                    ("kernel foreach", "triton_kernels", "foreach")]
        return out


class Registry(dict):
    """Primitives by name; ``triflux.primitives.REGISTRY`` is the one instance.

    A rank-generic primitive (``conv``, ``maxpool``, ...) is also found by the
    name of its 2-D case (``conv2d``, ``maxpool2d``, ...), an alias: indexing
    and ``get`` resolve it, iteration lists each primitive once."""

    def __init__(self):
        super().__init__()
        #: old or rank-specific name -> registered name
        self.aliases = {}

    def alias(self, name, registered):
        """Make ``name`` find the primitive ``registered``."""
        if name in self or registered not in self:
            raise ValueError(f"alias {name!r} -> {registered!r}: the name is taken or the target is unknown")
        self.aliases[name] = registered

    def __missing__(self, name):
        if name in self.aliases:
            return self[self.aliases[name]]
        raise KeyError(name)

    def get(self, name, default=None):
        return self[name] if name in self or name in self.aliases else default

    def register(self, name, family, **traits):
        if name in self:
            raise ValueError(f"primitive {name!r} registered twice")
        if not traits.get("differentiable", True):
            traits.setdefault("accumulates", False)  # comparisons, fills, updates add nothing up
        self[name] = Primitive(name, family, **traits)
        return self[name]
