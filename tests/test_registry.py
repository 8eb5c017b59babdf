"""Completeness of the primitive registry (triflux/registry.py lists what a
primitive needs; triflux/primitives.py declares them).

Every declared primitive must state its required traits and have all of its
parts (reference forward and backward, kernel forward and backward, strategy,
torch oracle; a tolerance floor ``<name>_magnitude`` is optional but must have
the agreed signature); the reference and kernel modules of a family must
mirror each other name for name; no function of a family's modules is named
for a primitive nobody declared; and the reference, which users read to learn
the math, documents every function.

Kernel modules need torch and triton; without them the kernel checks are
skipped with the reason, and everything else is still checked.
"""
import importlib
import inspect

import pytest

from triflux import backend, registry
from triflux.primitives import REGISTRY

PRIMITIVES = list(REGISTRY.values())
FAMILIES = sorted({p.family for p in PRIMITIVES})
DECLARATIONS = "triflux/primitives.py"

KERNELS_OK, KERNELS_WHY = backend.status("CUDA")
if not (backend.has_module("torch") and backend.has_module("triton")):
    KERNELS_OK = False


def _import_family(package, family):
    """``(module, problem)``: problem is None, or ("missing" | "skip" | "broken", text)."""
    modname = f"triflux.{package}.{family}"
    try:
        return importlib.import_module(modname), None
    except ModuleNotFoundError as e:
        if e.name == modname:
            return None, ("missing", f"module {modname} does not exist")
        if package == "triton_kernels" and not KERNELS_OK:
            return None, ("skip", f"{modname} cannot be imported without torch and triton "
                                  f"({KERNELS_WHY}; {type(e).__name__}: {e})")
        return None, ("broken", f"importing {modname} failed: {type(e).__name__}: {e}")
    except ImportError as e:
        if package == "triton_kernels" and not KERNELS_OK:
            return None, ("skip", f"{modname} cannot be imported without torch and triton "
                                  f"({KERNELS_WHY}; {type(e).__name__}: {e})")
        return None, ("broken", f"importing {modname} failed: {type(e).__name__}: {e}")
    except Exception as e:  # a module that does not even import is a failure, not a skip
        return None, ("broken", f"importing {modname} failed: {type(e).__name__}: {e}")


def _public_functions(module):
    return {name: fn for name, fn in vars(module).items()
            if not name.startswith("_") and inspect.isfunction(fn)
            and fn.__module__ == module.__name__}


def test_registry_is_not_empty_and_declarations_are_consistent():
    assert PRIMITIVES, f"{DECLARATIONS} declares no primitives"
    for p in PRIMITIVES:
        assert set(p.dtypes) <= set(registry.ALL_FLOAT_DTYPES), \
            f"{p.name}: unknown dtypes {set(p.dtypes) - set(registry.ALL_FLOAT_DTYPES)}"
        assert p.dtypes, f"{p.name}: declares no dtypes"
        if p.in_place:
            assert not p.differentiable, f"{p.name}: in-place primitives are not differentiable"
            assert all(isinstance(i, int) and i >= 0 for i in p.mutates), \
                f"{p.name}: mutates={p.mutates!r} must be indices of inputs"
        if p.random and p.differentiable:
            # a random primitive with inputs (dropout) redraws its mask from the seed
            assert "seed" in p.doc, f"{p.name}: a differentiable random primitive needs a `seed` attr"


ACCUMULATES_WHY = ("whether its kernels add up long sums (a reduction over an axis, dot products): "
                   "the property tests allow such sums sqrt(K) more rounding error")


@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.name)
def test_every_required_trait_is_declared(prim):
    problems = []
    if prim.differentiable and not isinstance(prim.accumulates, bool):
        problems.append(f"add accumulates=True or accumulates=False ({ACCUMULATES_WHY})")
    if not prim.differentiable and (prim.multilinear_backward or prim.partial_backward):
        problems.append("multilinear_backward and partial_backward describe a backward, and it has none "
                        "(differentiable=False)")
    if prim.fusable_activations:
        known = {"identity"} | {p.name for p in PRIMITIVES if p.family == "elementwise"}
        unknown = sorted(set(prim.fusable_activations) - known)
        if unknown:
            problems.append(f"fusable_activations {unknown} are neither 'identity' nor elementwise "
                            "primitives")
        if "activation" not in inspect.signature(prim.reference()).parameters:
            problems.append("it declares fusable_activations, but its reference forward takes no "
                            "`activation` attr")
    problems += _flops_problems(prim)
    if problems:
        pytest.fail(f"primitive {prim.name!r}: in its register(...) call in {DECLARATIONS}: "
                    + "; ".join(problems), pytrace=False)


FLOPS_WHY = ("the kernel report's roofline counts every call's floating-point operations from it: "
             "flops=PerElement(forward, backward) per element of the call's largest tensor, or the name of "
             "an exact count fn(name, direction, inputs, out_shape, attrs, largest) in triflux/specs/<family>.py")


def _flops_problems(prim):
    if isinstance(prim.flops, registry.PerElement):
        return []
    if not isinstance(prim.flops, str):
        return [f"add flops=... ({FLOPS_WHY}); it has {prim.flops!r}"]
    try:
        spec = importlib.import_module(f"triflux.specs.{prim.family}")
    except ModuleNotFoundError:
        return [f"flops={prim.flops!r} names a function of triflux/specs/{prim.family}.py, which does not exist"]
    fn = getattr(spec, prim.flops, None)
    if not callable(fn):
        return [f"flops={prim.flops!r}: triflux/specs/{prim.family}.py defines no such function ({FLOPS_WHY})"]
    if list(inspect.signature(fn).parameters) != ["name", "direction", "inputs", "out_shape", "attrs", "largest"]:
        return [f"flops={prim.flops!r}: its parameters must be (name, direction, inputs, out_shape, attrs, largest)"]
    return []


def test_a_missing_flops_declaration_is_named():
    undeclared = registry.Primitive("made_up", "conv", accumulates=False)
    assert "add flops=" in _flops_problems(undeclared)[0]
    misnamed = registry.Primitive("made_up", "conv", accumulates=False, flops="no_such_flops")
    assert "defines no such function" in _flops_problems(misnamed)[0]


@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.name)
def test_every_part_exists_and_is_callable(prim):
    missing, skipped = [], []
    for part, package, suffix in prim.parts():
        fn_name = f"{prim.name}_{suffix}"
        where = f"triflux.{package}.{prim.family}.{fn_name}"
        module, problem = _import_family(package, prim.family)
        if problem is not None:
            kind, text = problem
            if kind == "skip":
                skipped.append(f"{part} ({text})")
            else:
                missing.append(f"{part} `{where}`: {text}")
            continue
        fn = getattr(module, fn_name, None)
        if fn is None:
            missing.append(f"{part} `{where}` is not defined")
        elif not callable(fn):
            missing.append(f"{part} `{where}` is not callable (it is a {type(fn).__name__})")
    if missing:
        pytest.fail(f"primitive {prim.name!r} (family {prim.family!r}) lacks: "
                    + "; ".join(missing) + " (triflux/registry.py lists what a primitive needs)",
                    pytrace=False)
    if skipped:
        pytest.skip(f"{prim.name}: reference and strategy parts present; not checked: "
                    + "; ".join(skipped))


@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.name)
def test_strategy_gives_a_hypothesis_strategy_for_every_dtype(prim):
    from hypothesis.strategies import SearchStrategy

    module, problem = _import_family("testing", prim.family)
    if problem is not None or not hasattr(module, f"{prim.name}_strategy"):
        pytest.fail(f"{prim.name}: no strategy (see test_every_part_exists_and_is_callable)",
                    pytrace=False)
    for dtype in prim.dtypes:
        s = prim.strategy(dtype)
        assert isinstance(s, SearchStrategy), \
            f"{prim.name}_strategy({dtype!r}) returned {type(s).__name__}, not a hypothesis strategy"


MAGNITUDE_PARAMETERS = ("direction", "inputs", "attrs", "out", "grad", "reference")


@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.name)
def test_an_optional_magnitude_has_the_agreed_signature(prim):
    try:
        fn = prim.magnitude()
    except ModuleNotFoundError as e:
        pytest.fail(f"{prim.name}: {e} (see test_every_part_exists_and_is_callable)", pytrace=False)
    if fn is None:
        return
    where = f"triflux.testing.{prim.family}.{prim.name}_magnitude"
    assert callable(fn), f"{where} is not callable"
    params = inspect.signature(fn).parameters
    missing = [n for n in MAGNITUDE_PARAMETERS if n not in params]
    assert not missing, (f"{where} lacks the parameters {missing}; write it as {prim.name}_magnitude"
                         "(direction, *, inputs, attrs, out=None, grad=None, reference=None)")


def _suffixed(functions, suffixes=("_forward", "_backward")):
    return {n for n in functions if n.endswith(suffixes)}


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_and_kernel_modules_mirror_each_other(family):
    ref, problem = _import_family("reference", family)
    if problem is not None:
        pytest.fail(f"family {family!r}: {problem[1]}", pytrace=False)
    ker, problem = _import_family("triton_kernels", family)
    if problem is not None:
        if problem[0] == "skip":
            pytest.skip(problem[1])
        pytest.fail(f"family {family!r}: {problem[1]}", pytrace=False)
    r = _suffixed(_public_functions(ref))
    k = _suffixed(_public_functions(ker))
    msgs = []
    if r - k:
        msgs.append(f"in reference/{family}.py but not in triton_kernels/{family}.py: "
                    f"{sorted(r - k)}")
    if k - r:
        msgs.append(f"in triton_kernels/{family}.py but not in reference/{family}.py: "
                    f"{sorted(k - r)}")
    if msgs:
        pytest.fail(f"family {family!r}: the modules do not mirror each other: " + "; ".join(msgs),
                    pytrace=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reference_function_has_a_docstring(family):
    ref, problem = _import_family("reference", family)
    if problem is not None:
        pytest.fail(f"family {family!r}: {problem[1]}", pytrace=False)
    bare = sorted(n for n, fn in _public_functions(ref).items()
                  if not (fn.__doc__ and fn.__doc__.strip()))
    if bare:
        pytest.fail(f"reference/{family}.py: public functions without a docstring (the "
                    f"reference documents its math): {bare}", pytrace=False)


#: the functions of a family's modules that are parts of a primitive, by package
PART_SUFFIXES = {"reference": ("_forward", "_backward"),
                 "testing": ("_strategy", "_torch", "_magnitude")}


@pytest.mark.parametrize("package", sorted(PART_SUFFIXES))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_part_belongs_to_a_declared_primitive(family, package):
    """A ``*_forward`` nobody declared would escape the property suite, and a
    misspelt ``*_magnitude`` would silently not be used."""
    module, problem = _import_family(package, family)
    if problem is not None:
        pytest.fail(f"family {family!r}: {problem[1]}", pytrace=False)
    names = {p.name for p in PRIMITIVES if p.family == family}
    suffixes = PART_SUFFIXES[package]
    stray = sorted(n for n in _suffixed(_public_functions(module), suffixes)
                   if not any(n == f"{name}{s}" for name in names for s in suffixes))
    if stray:
        pytest.fail(f"triflux.{package}.{family} defines {stray}, but no primitive of family "
                    f"{family!r} with that name is declared in {DECLARATIONS}, so the property suite "
                    "does not use them", pytrace=False)
