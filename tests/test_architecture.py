"""The package's shape, checked from its source: layers import downwards only.

* No import cycle among triflux's modules, counting imports inside functions
  (a cycle hidden in a function is still a cycle: the two modules cannot be
  understood, or tested, one without the other).
* Few function-local imports of project modules: they are kept for the lazy
  imports that keep CPU-only work free of torch, Triton and hypothesis.
* No module imports another module's private (underscore) names: what two
  families share is public, in a module of its own (a spec, a kernel helper).

The source is read with ``ast``; nothing is imported, so this runs anywhere.
"""
import ast
from collections import defaultdict
from pathlib import Path

from test_moved_modules import MOVED

ROOT = Path(__file__).resolve().parents[1]
#: source folders and the package names they install as (setup.py's package_dir)
SOURCES = {"triflux": "triflux", "reference": "triflux.reference", "triton_kernels": "triflux.triton_kernels"}
#: function-local imports of project modules allowed in the whole package
MAX_LOCAL_IMPORTS = 20


def _modules():
    """{module name: path} for every module of the installed package."""
    out = {}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package] + parts)] = path
    return out


MODULES = _modules()


def _target(module, node, alias):
    """The project module an import statement's ``alias`` refers to (or None)."""
    if isinstance(node, ast.Import):
        name = alias.name
    else:
        base = module.split(".")
        if node.level:
            is_package = MODULES[module].name == "__init__.py"
            base = base if is_package else base[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        name = f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports():
    """[(importer, imported module, imported name, line, inside a function)]."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    target = _target(module, node, alias)
                    if target and target != module:
                        found.append((module, target, alias.name, node.lineno, id(node) in local))
    return found


IMPORTS = _imports()


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return components


def test_the_analysis_sees_the_package():
    assert "triflux.tensor" in MODULES and "triflux.reference.conv" in MODULES
    assert "triflux.triton_kernels.launch" in MODULES
    assert any(imp[:2] == ("triflux.ops", "triflux.tensor") for imp in IMPORTS)


def test_no_import_cycles():
    edges = defaultdict(set)
    for importer, imported, *_ in IMPORTS:
        edges[importer].add(imported)
    cycles = _cycles(edges)
    where = {(a, b): f"{MODULES[a].relative_to(ROOT)}:{line}" for a, b, _, line, _ in IMPORTS}
    detail = "; ".join(
        " -> ".join(c) + " (" + ", ".join(where[a, b] for a in c for b in c if (a, b) in where) + ")"
        for c in cycles)
    assert not cycles, f"import cycles (move the shared concept down a layer): {detail}"


def test_few_function_local_imports():
    local = sorted({(a, line) for a, _, _, line, inside in IMPORTS if inside})
    listing = ", ".join(f"{MODULES[a].relative_to(ROOT)}:{line}" for a, line in local)
    assert len(local) <= MAX_LOCAL_IMPORTS, (
        f"{len(local)} imports of project modules inside functions (at most {MAX_LOCAL_IMPORTS}; import at "
        f"the top unless the import keeps torch, Triton or hypothesis out of CPU-only work): {listing}")


def test_no_private_names_imported_across_modules():
    private = sorted({f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}.{name}"
                      for a, b, name, line, _ in IMPORTS
                      if name.startswith("_") and not name.startswith("__")})
    assert not private, "private names used across modules (make them public where they are shared): " + \
        "; ".join(private)


def test_kernels_import_no_reference_module():
    """Kernels read the family's spec, never the reference: shared validation or
    geometry imported from the reference could hide a bug from the
    kernel-vs-reference check (both sides would carry it)."""
    found = sorted({f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}"
                    for a, b, _, line, _ in IMPORTS
                    if a.startswith("triflux.triton_kernels") and b.startswith("triflux.reference")})
    assert not found, "move what the kernels share with the reference into triflux/specs/<family>.py: " + \
        "; ".join(found)


#: the workbench: the tools built on the library (CLI, demos, doctor, benchmarks, kernel report)
WORKBENCH = "triflux.workbench"


def _in_workbench(module):
    return module == WORKBENCH or module.startswith(WORKBENCH + ".")


def test_the_library_never_imports_the_workbench():
    """The workbench is built on the library, never the reverse: no module
    outside triflux/workbench/ imports it, but the old names kept as aliases
    of its modules (``triflux.doctor``..., tests/test_moved_modules.py)."""
    aliases = {name for name in MOVED if name in MODULES}
    assert {"triflux.doctor", "triflux.demos", "triflux.__main__"} <= aliases
    found = sorted({f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}" for a, b, _, line, _ in IMPORTS
                    if _in_workbench(b) and not _in_workbench(a) and a not in aliases})
    assert not found, "the library imports the workbench (move what it needs out of triflux/workbench/): " + \
        "; ".join(found)


def test_the_old_names_are_tiny_aliases():
    """Each old name's module imports its workbench module and nothing else of the project."""
    for name in (n for n in MOVED if n in MODULES):
        targets = {b for a, b, *_ in IMPORTS if a == name}
        assert targets and all(_in_workbench(b) for b in targets), (name, sorted(targets))
        assert len(MODULES[name].read_text().splitlines()) <= 20, f"{MODULES[name]} is an alias: keep it tiny"
