"""Completeness of the primitive registry (triflux/registry.py).

Every declared primitive must have all of its parts (reference forward and
backward, kernel forward and backward, strategy, torch oracle); the reference
and kernel modules of a family must mirror each other name for name; and the
reference, which users read to learn the math, documents every function.

Kernel modules need torch and triton; without them the kernel checks are
skipped with the reason, and everything else is still checked.
"""
import importlib
import inspect

import pytest

from triflux import backend, registry

PRIMITIVES = registry.all_primitives()
FAMILIES = sorted({p.family for p in PRIMITIVES})

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
    assert PRIMITIVES, "triflux.registry.all_primitives() is empty"
    for p in PRIMITIVES:
        assert set(p.dtypes) <= set(registry.ALL_FLOAT_DTYPES), \
            f"{p.name}: unknown dtypes {set(p.dtypes) - set(registry.ALL_FLOAT_DTYPES)}"
        assert p.dtypes, f"{p.name}: declares no dtypes"
        if p.in_place:
            assert not p.differentiable, f"{p.name}: in-place primitives are not differentiable"
        if p.random and p.differentiable:
            # a random primitive with inputs (dropout) redraws its mask from the seed
            assert "seed" in p.doc, f"{p.name}: a differentiable random primitive needs a `seed` attr"


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
                    + "; ".join(missing), pytrace=False)
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


def _suffixed(functions):
    return {n for n in functions if n.endswith("_forward") or n.endswith("_backward")}


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


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reference_primitive_function_is_registered(family):
    """A ``*_forward`` nobody registered would escape the property suite."""
    ref, problem = _import_family("reference", family)
    if problem is not None:
        pytest.fail(f"family {family!r}: {problem[1]}", pytrace=False)
    names = {p.name for p in PRIMITIVES if p.family == family}
    stray = sorted(n for n in _suffixed(_public_functions(ref))
                   if n.rsplit("_", 1)[0] not in names)
    if stray:
        pytest.fail(f"reference/{family}.py defines {stray}, but no primitive of family "
                    f"{family!r} with that name is declared in triflux/primitives.py, so the "
                    "property suite does not test them", pytrace=False)
