"""``save(path, obj)`` and ``load(path)``: checkpoints as safetensors files.

A triflux file is a plain `safetensors <https://huggingface.co/docs/safetensors>`_
file:

* every array is one tensor, named by its place in the structure
  (``layers[0].weight``, ``opt.layers[2].bias.state[0]``), with its own dtype
  (bfloat16 as safetensors' ``BF16``, so torch and JAX read it as bfloat16);
* the nesting (dicts, lists, tuples), ``None``, bools, ints, floats (NaN and
  infinities included) and strings are JSON in the header's ``__metadata__``
  under ``"structure"``, next to ``"format": "triflux"`` and
  ``"format_version"``.

``save`` takes a model or layer (its ``state``), an optimiser state tree (from
``setup``), or any nesting of dicts / lists / tuples of arrays, Tensors (on any
device: no ``cpu()`` needed first) and numbers. It writes atomically: the
bytes go to a temporary file in the same folder, which is flushed, fsync'ed
and renamed over ``path`` (then the folder is fsync'ed), so a crash or an
error leaves either the old file or the new one, never a broken one.

``load(path)`` returns the nested structure with NumPy arrays (device-free);
``loadmodel(model, load(path))`` puts it into a model (or optimiser state) on
any device. **Loading never runs code**: the header is parsed as JSON and the
tensors by safetensors (no pickle, no ``eval``), whatever the file holds. A
missing, truncated or corrupt file, a pickle / ``torch.save`` / BSON / NumPy
file, or a safetensors file whose structure does not match its tensors raises
:class:`~triflux.errors.CheckpointError` naming the path and the problem.

A safetensors file written by another program (no triflux metadata) raises
``CheckpointError`` listing its tensors; ``load(path, flat=True)`` reads any
safetensors file as a flat ``{name: array}`` dict instead.
"""
import json
import math
import os
import tempfile

import numpy as np

from .errors import CheckpointError
from .functor import is_layer, path_join
from .optimise import Leaf, MixedPrecisionState, Rule
from .persistence import state
from .tensor import Tensor
from .version import __version__

__all__ = ["save", "load", "FORMAT", "FORMAT_VERSION"]

FORMAT = "triflux"
FORMAT_VERSION = 1

# safetensors dtype tags -> NumPy dtypes (little-endian on disk)
_FROM_TAG = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "BOOL": "?", "C64": "<c8",
}
_ML_DTYPES_TAGS = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# NumPy dtype names safetensors' writer accepts
_SAVABLE = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
            "uint64", "uint32", "uint16", "uint8", "bool", "complex64"}


def _np_dtype(tag):
    if tag in _FROM_TAG:
        return np.dtype(_FROM_TAG[tag])
    if tag in _ML_DTYPES_TAGS:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, _ML_DTYPES_TAGS[tag]))
    return None


# --- save -------------------------------------------------------------------------------------

def _show(path):
    return f"`{path}`" if path else "the top level"


class _Encoder:
    """Turns a structure into (JSON-able tree, {tensor name: array})."""

    def __init__(self):
        self.tensors = {}

    def _name(self, path):
        name = path or "(top)"
        base, n = name, 1
        while name in self.tensors or name == "__metadata__":
            n += 1
            name = f"{base}#{n}"
        return name

    def array(self, arr, path, tag="array"):
        if arr.dtype.name not in _SAVABLE:
            raise CheckpointError(
                f"save: {_show(path)} is an array of dtype {arr.dtype}, which a triflux file cannot hold "
                f"(supported: {', '.join(sorted(_SAVABLE))})")
        name = self._name(path)
        self.tensors[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (keeps 0-d arrays 0-d)
        return {tag: name}

    def encode(self, x, path=""):
        if isinstance(x, Tensor):
            return self.array(x.numpy(), path)
        if isinstance(x, np.ndarray):
            return self.array(x, path)
        if isinstance(x, np.generic):  # a NumPy scalar keeps its dtype
            return self.array(np.asarray(x), path, tag="scalar")
        if is_layer(x) or isinstance(x, (Leaf, MixedPrecisionState, Rule)):
            return self.encode(state(x), path)
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": repr(x)}
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise CheckpointError(f"save: the dict at {_show(path)} has the key {k!r}; a triflux file "
                                          "holds dicts with str or int keys only")
                items.append([k, self.encode(v, path_join(path, k))])
            return {"dict": items}
        if isinstance(x, (list, tuple)):
            kind = "tuple" if isinstance(x, tuple) else "list"
            return {kind: [self.encode(v, path_join(path, i)) for i, v in enumerate(x)]}
        raise CheckpointError(
            f"save: {_show(path)} is a {type(x).__name__} ({x!r:.60}); a triflux file holds models, optimiser "
            "states and nestings of dicts/lists/tuples of arrays, Tensors, numbers, strings and None "
            "(never arbitrary objects, so that loading never runs code)")


def _write(f, data):
    """Write ``data`` to the open file ``f`` (a separate function so tests can make it fail)."""
    view = memoryview(data)
    chunk = 1 << 24
    for i in range(0, len(view), chunk):
        f.write(view[i:i + chunk])


def _fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path, data):
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CheckpointError(f"save: {path} is a folder; give a file name "
                              f"(e.g. {os.path.join(path, 'model.safetensors')})")
    if not os.path.isdir(folder):
        raise CheckpointError(f"save: cannot write {path}: the folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            _write(f, data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


def save(path, obj):
    """Write ``obj`` to ``path`` as a triflux safetensors file and return
    ``path``.

    ``obj``: a model or layer (saved as ``state(model)``), an optimiser state
    tree (``setup``'s), or any nesting of dicts (str/int keys), lists and
    tuples of arrays, Tensors on any device, numbers, strings and ``None``.
    The write is atomic (temporary file in the same folder, fsync, rename):
    if anything fails, the file previously at ``path`` is untouched.
    Read it back with ``load(path)``; restore a model with
    ``loadmodel(model, load(path))``."""
    import safetensors.numpy
    path = os.fspath(path)
    enc = _Encoder()
    tree = enc.encode(obj)
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "triflux_version": __version__,
            "structure": json.dumps(tree, allow_nan=False, ensure_ascii=False)}
    data = safetensors.numpy.save(enc.tensors, metadata=meta)
    _atomic_write(path, data)
    return path


# --- load -------------------------------------------------------------------------------------

def _sniff(data):
    """What a non-safetensors file probably is, or None."""
    if data[:1] == b"\x80" and len(data) > 1 and 2 <= data[1] <= 5:
        return "pickle"
    if data[:4] == b"PK\x03\x04":
        return "zip"          # torch.save (a zip of pickles) or numpy .npz
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if data[:4] == b"\x89HDF" or data[:10] == b"HDF5-based":
        return "hdf5"         # HDF5 / JLD2
    if len(data) >= 5 and int.from_bytes(data[:4], "little") == len(data) and data[-1:] == b"\x00":
        return "bson"         # BSON.jl: a document whose int32 prefix is the file size
    if data[:1] in (b"(", b"]", b"}") and data[-1:] == b".":
        return "pickle"       # pickle protocol 0/1
    return None


_SNIFFED = {
    "pickle": "this looks like a pickle file; triflux never unpickles (unpickling runs arbitrary code)",
    "zip": "this looks like a zip archive, e.g. a `torch.save` file (pickles inside) or a NumPy .npz; "
           "triflux never unpickles",
    "npy": "this looks like a NumPy .npy file, not a triflux checkpoint",
    "hdf5": "this looks like an HDF5 / JLD2 file, not a triflux checkpoint",
    "bson": "this looks like a BSON file (BSON.jl); triflux does not read BSON (reading it can run code)",
}
_CONVERT = ("; if you trust it, convert it once where it was made: load it with its own tool and call "
            "`triflux.save(path, {name: numpy_array, ...})` (for torch: "
            "`safetensors.torch.save_file(torch.load(f, weights_only=True), path)` gives a file "
            "`load(path, flat=True)` reads)")


def _fail(path, what):
    raise CheckpointError(f"load: {path}: {what}")


def _read_header(path, data):
    if len(data) == 0:
        _fail(path, "the file is empty (an interrupted copy?)")
    kind = None if data[8:9] == b"{" else _sniff(data)  # a safetensors header starts at byte 8 with "{"
    if kind is not None:
        _fail(path, _SNIFFED[kind] + _CONVERT)
    if len(data) < 8:
        _fail(path, f"not a safetensors file: only {len(data)} bytes (truncated?)")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        if data[8:9] == b"{":
            _fail(path, f"the file is truncated: its header says {n} header bytes but the file has only "
                        f"{len(data)} bytes")
        _fail(path, "not a safetensors file (nor a pickle, zip, BSON or HDF5 file): unrecognised contents")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        _fail(path, f"not a safetensors file: the header is not valid JSON ({e}); corrupt or another format")
    end = 0
    for k, v in header.items():
        if k != "__metadata__":
            try:
                end = max(end, int(v["data_offsets"][1]))
            except (TypeError, KeyError, IndexError, ValueError):
                _fail(path, f"corrupt safetensors header: the entry for tensor {k!r} is {v!r:.100}")
    if 8 + n + end > len(data):
        _fail(path, f"the file is truncated: its tensors need {8 + n + end} bytes, the file has {len(data)}")
    return header


def _tensors(path, data):
    import safetensors
    try:
        raw = safetensors.deserialize(data)
    except Exception as e:  # SafetensorError (no public class to catch)
        _fail(path, f"corrupt safetensors file: {e}")
    out = {}
    for name, v in raw:
        dt = _np_dtype(v["dtype"])
        if dt is None:
            _fail(path, f"tensor {name!r} has dtype {v['dtype']}, which triflux cannot read")
        arr = np.frombuffer(v["data"], dtype=dt).reshape(v["shape"])
        if not dt.isnative:
            arr = arr.astype(dt.newbyteorder("="))
        out[name] = arr
    return out


class _Decoder:
    def __init__(self, path, tensors):
        self.path, self.tensors, self.used = path, tensors, set()

    def bad(self, where, what):
        _fail(self.path, f"the structure in the metadata does not match the file at {_show(where)}: {what} "
                         "(the file is corrupt or was edited)")

    def decode(self, node, where=""):
        if node is None or isinstance(node, (bool, int, str)):
            return node
        if isinstance(node, float):
            return node
        if isinstance(node, dict) and len(node) == 1:
            (tag, v), = node.items()
            if tag in ("array", "scalar"):
                if not isinstance(v, str) or v not in self.tensors:
                    self.bad(where, f"it refers to a tensor {v!r} the file does not hold")
                if v in self.used:
                    self.bad(where, f"the tensor {v!r} is used twice")
                self.used.add(v)
                arr = self.tensors[v]
                if tag == "scalar":
                    if arr.ndim != 0:
                        self.bad(where, f"a scalar, but the tensor {v!r} has shape {arr.shape}")
                    return arr[()]
                return arr
            if tag == "float" and v in ("nan", "inf", "-inf"):
                return float(v)
            if tag in ("list", "tuple") and isinstance(v, list):
                items = [self.decode(e, path_join(where, i)) for i, e in enumerate(v)]
                return tuple(items) if tag == "tuple" else items
            if tag == "dict" and isinstance(v, list):
                out = {}
                for item in v:
                    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                            and not isinstance(item[0], bool)):
                        self.bad(where, f"a malformed dict entry {item!r:.80}")
                    out[item[0]] = self.decode(item[1], path_join(where, item[0]))
                return out
        self.bad(where, f"an unknown entry {node!r:.80}")


def load(path, *, flat=False):
    """Read a file written by ``save`` and return its nested structure
    (dicts, lists, tuples, NumPy arrays, numbers, strings, ``None``): for a
    saved model, the ``state`` to give ``loadmodel(model, load(path))``.

    Loading never runs code (no pickle, no ``eval``): the header is JSON and
    the arrays raw bytes. Raises ``CheckpointError`` naming ``path`` for a
    missing, empty, truncated or corrupt file, a pickle / torch.save / BSON /
    NumPy / HDF5 file, a structure that does not match the tensors, and a
    safetensors file not written by triflux (``flat=True`` reads any
    safetensors file as a flat ``{tensor name: array}`` dict)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        _fail(path, "no such file")
    except IsADirectoryError:
        _fail(path, "is a folder, not a file")
    except OSError as e:
        _fail(path, f"cannot read it ({e.strerror or e})")
    header = _read_header(path, data)
    tensors = _tensors(path, data)
    if flat:
        return tensors
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        names = list(tensors)
        shown = ", ".join(repr(k) for k in names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        _fail(path, f"a safetensors file not written by triflux.save (no triflux metadata); it holds the tensors "
                    f"[{shown}]. Read it as a flat dict of arrays with `triflux.load(path, flat=True)` (or "
                    "`safetensors.numpy.load_file(path)`) and build the state for `loadmodel` from it")
    try:
        version = int(meta.get("format_version", ""))
    except ValueError:
        _fail(path, f"corrupt triflux metadata: format_version is {meta.get('format_version')!r}")
    if version > FORMAT_VERSION:
        _fail(path, f"written by a newer triflux (file format version {version}; this triflux reads up to "
                    f"{FORMAT_VERSION}); upgrade triflux to load it")
    try:
        tree = json.loads(meta["structure"])
    except (KeyError, TypeError, ValueError) as e:
        _fail(path, f"corrupt triflux metadata: the structure is missing or not JSON ({e})")
    dec = _Decoder(path, tensors)
    out = dec.decode(tree)
    unused = [k for k in tensors if k not in dec.used]
    if unused:
        _fail(path, f"the structure in the metadata does not match the file: tensors {unused[:10]} are in the "
                    "file but not in the structure (the file is corrupt or was edited)")
    return out
