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


def _set_in_text(text, value):
    """``text`` (a TOML document) with ``[triflux] gpu_backend = "value"``,
    everything else kept line for line (comments included)."""
    lines = text.splitlines()
    entry = f'gpu_backend = "{value}"'
    start = next((i for i, l in enumerate(lines) if l.strip().replace(" ", "") == f"[{SECTION}]"), None)
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [f"[{SECTION}]", entry]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        for i in range(start + 1, end):
            if lines[i].split("=", 1)[0].strip() == "gpu_backend":
                lines[i] = entry
                break
        else:
            lines.insert(start + 1, entry)
    return "\n".join(lines) + "\n"


def gpu_backend(name, directory=None):
    """Persist ``name`` ("CUDA", "AMDGPU", "Metal" or "CPU") as the GPU
    backend in ``LocalPreferences.toml`` of the current project directory
    (``directory``), creating or updating it and keeping its other sections
    and comments. Like Flux's ``gpu_backend!``, it takes effect in a new
    Python process (``GPU_BACKEND`` and ``get_device`` read the file at
    import), and it says so. Returns the canonical name."""
    import tomllib
    canonical = next((b for b in BACKENDS if str(name).lower() == b.lower()), None)
    if canonical is None:
        raise ValueError(f"unknown GPU backend {name!r}; valid backends are {', '.join(BACKENDS)}")
    path = preferences_path(directory)
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            old = tomllib.loads(text).get(SECTION, {}).get("gpu_backend")
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path} is not valid TOML ({e}); fix or delete it, then call "
                             f"gpu_backend({canonical!r}) again") from None
    else:
        old = None
    new_text = _set_in_text(text, canonical)
    try:
        ok = tomllib.loads(new_text).get(SECTION, {}).get("gpu_backend") == canonical
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:  # an unusual layout (dotted keys, inline table): let tomlkit edit it
        try:
            import tomlkit
        except ImportError:
            raise ValueError(f"cannot update {path}: its [{SECTION}] table has an unusual layout; "
                             f'set `gpu_backend = "{canonical}"` under [{SECTION}] by hand '
                             "(or `pip install tomlkit`)") from None
        doc = tomlkit.parse(text)
        if SECTION not in doc:
            doc[SECTION] = tomlkit.table()
        doc[SECTION]["gpu_backend"] = canonical
        new_text = tomlkit.dumps(doc)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new_text)
    os.replace(tmp, path)
    current = _AT_IMPORT
    if old == canonical and current == canonical:
        print(f"[triflux] GPU backend is already set to {canonical!r} ({path}); nothing else to do.")
    else:
        print(f"[triflux] New GPU backend set: {canonical!r} in {path}. "
              "Restart Python for this change to take effect "
              f"(this process keeps GPU_BACKEND = {current!r}).")
    return canonical
