"""The GPU backend preference, kept in ``LocalPreferences.toml`` as in Flux:

.. code-block:: toml

    [triflux]
    gpu_backend = "AMDGPU"

It is read once, at import (``triflux.GPU_BACKEND``); ``gpu_backend(name)``
writes it and takes effect in a new process.
"""
import os

PREFERENCES_FILE = "LocalPreferences.toml"
SECTION = "triflux"
BACKENDS = ("CUDA", "AMDGPU", "Metal", "CPU")


def preferences_path(directory=None):
    return os.path.join(directory or os.getcwd(), PREFERENCES_FILE)


def read_preference(directory=None):
    """The ``gpu_backend`` in ``LocalPreferences.toml`` of ``directory`` (the
    current directory by default), or ``None``."""
    import tomllib
    path = preferences_path(directory)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return None
    except (tomllib.TOMLDecodeError, OSError) as e:
        import warnings
        warnings.warn(f"ignoring unreadable {path}: {e}")
        return None
    value = data.get(SECTION, {}).get("gpu_backend")
    for b in BACKENDS:
        if isinstance(value, str) and value.lower() == b.lower():
            return b
    if value is not None:
        import warnings
        warnings.warn(f"{path}: gpu_backend = {value!r} is not one of {', '.join(BACKENDS)}; ignored")
    return None


_AT_IMPORT = read_preference()


def gpu_backend_preference():
    return _AT_IMPORT


def gpu_backend(name, directory=None):
    """Persist ``name`` ("CUDA", "AMDGPU", "Metal" or "CPU") as the GPU
    backend in ``LocalPreferences.toml`` of the current project directory,
    creating or updating it and keeping its other sections. Like Flux's
    ``gpu_backend!``, it takes effect in a new Python process."""
    canonical = next((b for b in BACKENDS if str(name).lower() == b.lower()), None)
    if canonical is None:
        raise ValueError(f"unknown GPU backend {name!r}; valid backends are {', '.join(BACKENDS)}")
    try:
        import tomlkit
    except ImportError:
        raise ImportError("writing preferences needs `tomlkit`: `pip install tomlkit`") from None
    path = preferences_path(directory)
    doc = tomlkit.document()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            doc = tomlkit.parse(f.read())
    if SECTION not in doc:
        doc[SECTION] = tomlkit.table()
    old = doc[SECTION].get("gpu_backend")
    doc[SECTION]["gpu_backend"] = canonical
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(tomlkit.dumps(doc))
    os.replace(tmp, path)
    if old != canonical:
        print(f"[triflux] GPU backend preference set to {canonical!r} in {path}; "
              "restart Python for it to take effect.")
    return canonical
