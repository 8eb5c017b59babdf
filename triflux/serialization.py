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
import stat
import tempfile
import zlib

import numpy as np

from .errors import CheckpointError, StructureError
from .functor import is_layer, path_join
from .model_file import LayerState, build, layer_states, unknown_parts
from .optimise import Leaf, MixedPrecisionState, Rule
from .persistence import loadmodel, state
from .tensor import Tensor
from .version import __version__

__all__ = ["save", "load", "save_model", "load_model", "FORMAT", "FORMAT_VERSION", "MAX_DEPTH"]

FORMAT = "triflux"
FORMAT_VERSION = 1
#: the deepest nesting of dicts, lists and tuples a file holds (deeper is refused on save and on load)
MAX_DEPTH = 100
#: the largest safetensors header read (safetensors' own limit)
_MAX_HEADER = 100 * 1024 * 1024

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


def _checksum(buffer):
    """The checksum a file records for an array's bytes (CRC-32: it catches
    every flipped bit and burst error up to 32 bits)."""
    return f"crc32:{zlib.crc32(buffer):08x}"


def _file_path(path, who, hint=""):
    """``path`` as a str, or an error naming ``who`` and what is wrong with it."""
    name = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(name, str):
        shown = repr(path)
        shown = type(path).__name__ + (f" {shown:.60}" if "\n" not in shown else "")
        raise TypeError(f"{who}: the path must be a str or a pathlib.Path naming a file (e.g. "
                        f"'model.safetensors'), got {shown}{hint}")
    if not name:
        raise CheckpointError(f"{who}: the path is empty (''); give a file name such as 'model.safetensors'")
    if "\0" in name:
        raise CheckpointError(f"{who}: the path {name!r:.80} contains a NUL character")
    return name


# --- save -------------------------------------------------------------------------------------

def _show(path):
    return f"`{path}`" if path else "the top level"


class _Encoder:
    """Turns a structure into a JSON-able tree, ``tensors`` {name: array},
    their ``checksums`` {name: checksum} and the layers' ``specs`` {path: spec}."""

    def __init__(self):
        self.tensors, self.checksums, self.specs = {}, {}, {}
        self.enclosing = {}  # {id: path} of the containers being encoded: a structure must not contain itself

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
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (keeps 0-d arrays 0-d)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))  # the bytes safetensors writes, which are checksummed
        self.tensors[name] = arr
        self.checksums[name] = _checksum(arr.reshape(-1).view(np.uint8))
        return {tag: name}

    def encode(self, x, path=""):
        if isinstance(x, Tensor):
            return self.array(x.numpy(), path)
        if isinstance(x, np.ndarray):
            return self.array(x, path)
        if isinstance(x, np.generic):  # a NumPy scalar keeps its dtype
            return self.array(np.asarray(x), path, tag="scalar")
        if is_layer(x) or isinstance(x, (Leaf, MixedPrecisionState, Rule)):
            try:
                s = state(x)
            except StructureError as e:
                raise CheckpointError(f"save: {_show(path)}: {e}") from None
            return self.encode(s, path)
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": repr(x)}
        if isinstance(x, (dict, list, tuple)):
            if id(x) in self.enclosing:
                raise CheckpointError(f"save: {_show(path)} is the {type(x).__name__} at {_show(self.enclosing[id(x)])} "
                                      "again: the structure contains itself, and a triflux file holds trees")
            if len(self.enclosing) >= MAX_DEPTH:
                raise CheckpointError(f"save: {_show(path)} is nested more than {MAX_DEPTH} levels deep; a triflux "
                                      f"file holds at most {MAX_DEPTH} levels of dicts, lists and tuples")
            self.enclosing[id(x)] = path
            try:
                return self.container(x, path)
            finally:
                del self.enclosing[id(x)]
        raise CheckpointError(
            f"save: {_show(path)} is a {type(x).__name__} ({x!r:.60}); a triflux file holds models, optimiser "
            "states and nestings of dicts/lists/tuples of arrays, Tensors, numbers, strings and None "
            "(never arbitrary objects, so that loading never runs code)")


    def container(self, x, path):
        if isinstance(x, LayerState) and x.spec is not None:
            self.specs[path] = x.spec
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise CheckpointError(f"save: the dict at {_show(path)} has the key {k!r}; a triflux file "
                                          "holds dicts with str or int keys only")
                items.append([k, self.encode(v, path_join(path, k))])
            return {"dict": items}
        kind = "tuple" if isinstance(x, tuple) else "list"
        return {kind: [self.encode(v, path_join(path, i)) for i, v in enumerate(x)]}


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
    """Write ``data`` to ``path`` through a temporary file renamed over it; a
    symbolic link stays a link and its target gets the new contents."""
    target = os.path.realpath(path) if os.path.islink(path) else path
    shown = path if target == path else f"{path} (a link to {target})"
    folder = os.path.dirname(os.path.abspath(target))
    if os.path.isdir(target):
        raise CheckpointError(f"save: {shown} is a folder; give a file name "
                              f"(e.g. {os.path.join(path, 'model.safetensors')})")
    if not os.path.isdir(folder):
        why = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise CheckpointError(f"save: cannot write {shown}: the folder {folder} {why}")
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".", suffix=".tmp", dir=folder)
    except OSError as e:
        raise CheckpointError(f"save: cannot write {shown}: cannot create a file in the folder {folder} "
                              f"({e.strerror or e}); save to a folder you can write to. Nothing was written.") from None
    try:
        with os.fdopen(fd, "wb") as f:
            _write(f, data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise CheckpointError(f"save: cannot write {shown}: {e.strerror or e}. Nothing was written (a file "
                                  "already there is unchanged).") from e
        raise
    _fsync_dir(folder)


def save(path, obj):
    """Write ``obj`` to ``path`` as a triflux safetensors file and return
    ``path``.

    ``obj``: a model or layer (saved as ``state(model)``), an optimiser state
    tree (``setup``'s), or any nesting (at most ``MAX_DEPTH`` levels, and no
    structure that contains itself) of dicts (str/int keys), lists and
    tuples of arrays, Tensors on any device, numbers, strings and ``None``.
    Each layer's configuration (its spec, :mod:`triflux.model_file`) is
    recorded too, so that ``loadmodel`` can check that a model has the
    same structure, and a CRC-32 checksum of every array (and of the
    structure), which ``load`` verifies.

    The write is atomic (temporary file in the same folder, fsync, rename):
    if anything fails, the file previously at ``path`` is untouched and
    ``CheckpointError`` names the path and the problem (a read-only folder,
    a full disk, ...). A symbolic link at ``path`` stays a link: the file it
    points to gets the new contents. Read it back with ``load(path)``;
    restore a model with ``loadmodel(model, load(path))``."""
    import safetensors.numpy
    path = _file_path(path, "save", "; the path comes first: save(path, obj)" if isinstance(obj, str) else "")
    enc = _Encoder()
    tree = enc.encode(obj)
    structure = json.dumps(tree, allow_nan=False, ensure_ascii=False)
    layers = json.dumps(enc.specs, allow_nan=False, ensure_ascii=False)
    checksums = {**enc.checksums, "__metadata__": _metadata_checksum(structure, layers)}
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "triflux_version": __version__,
            "structure": structure, "layers": layers, "checksums": json.dumps(checksums)}
    data = safetensors.numpy.save(enc.tensors, metadata=meta)
    _atomic_write(path, data)
    return path


def _metadata_checksum(structure, layers):
    return _checksum(f"{structure}\0{layers}".encode())


# --- load -------------------------------------------------------------------------------------

def _sniff(data, size, last):
    """What a non-safetensors file probably is, or None, from its first
    bytes ``data``, its size and its ``last`` byte."""
    if data[:1] == b"\x80" and len(data) > 1 and 2 <= data[1] <= 5:
        return "pickle"
    if data[:4] == b"PK\x03\x04":
        return "zip"          # torch.save (a zip of pickles) or numpy .npz
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if data[:4] == b"\x89HDF" or data[:10] == b"HDF5-based":
        return "hdf5"         # HDF5 / JLD2
    if size >= 5 and int.from_bytes(data[:4], "little") == size and last == b"\x00":
        return "bson"         # BSON.jl: a document whose int32 prefix is the file size
    if data[:1] in (b"(", b"]", b"}") and last == b".":
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


#: what a path that is not a regular file is, by its mode
_NOT_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refuse_special(path, mode):
    """A CheckpointError for a folder, FIFO, device or socket at ``path`` (of ``mode``)."""
    if stat.S_ISDIR(mode):
        _fail(path, "is a folder, not a file")
    kind = next((name for test, name in _NOT_FILES if test(mode)), None)
    if kind is not None:
        _fail(path, f"is {kind}, not a regular file; load reads checkpoint files only")
    if mode and not stat.S_ISREG(mode):
        _fail(path, "is not a regular file; load reads checkpoint files only")


def _read(path):
    """(bytes, size, last byte) of the regular file at ``path``: all its
    bytes when the header size it starts with fits in the file, else only
    its first ones (enough to say what it is)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # opening a FIFO must not wait
    except FileNotFoundError:
        _fail(path, "no such file")
    except OSError as e:
        _refuse_special(path, os.stat(path).st_mode if os.path.exists(path) else 0)  # a folder, a socket
        _fail(path, f"cannot read it ({e.strerror or e})")
    info = os.fstat(fd)
    size = info.st_size
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        _refuse_special(path, info.st_mode)
    with os.fdopen(fd, "rb") as f:
        data = f.read(min(size, 1 << 16))
        n = int.from_bytes(data[:8], "little") if len(data) >= 8 else None
        if n is not None and n <= _MAX_HEADER and 8 + n <= size:
            data += f.read(size - len(data))
        if len(data) < size:
            f.seek(size - 1)
            return data, size, f.read(1)
    return data, size, data[-1:]


def _json(path, text, what, invalid):
    """``json.loads(text)``, or a CheckpointError: ``invalid`` (with ``{e}``,
    the parser's message) for text that is not JSON, and one naming ``what``
    for a nesting deeper than the parser goes."""
    try:
        return json.loads(text)
    except RecursionError:
        _fail(path, f"{what} is nested too deeply to read (the file is corrupt, or made to crash readers)")
    except (TypeError, ValueError) as e:   # (a UnicodeDecodeError is a ValueError)
        _fail(path, invalid.format(e=e))


def _read_header(path, data, size, last):
    if size == 0:
        _fail(path, "the file is empty (an interrupted copy?)")
    kind = None if data[8:9] == b"{" else _sniff(data, size, last)  # a safetensors header starts at byte 8 with "{"
    if kind is not None:
        _fail(path, _SNIFFED[kind] + _CONVERT)
    if size < 8:
        _fail(path, f"not a safetensors file: only {size} bytes (truncated?)")
    n = int.from_bytes(data[:8], "little")
    if n > size - 8:
        if data[8:9] == b"{":
            _fail(path, f"the file is truncated: its header says {n} header bytes but the file has only "
                        f"{size} bytes")
        _fail(path, "not a safetensors file (nor a pickle, zip, BSON or HDF5 file): unrecognised contents")
    if n > _MAX_HEADER:
        _fail(path, f"corrupt safetensors file: its header would be {n} bytes (at most {_MAX_HEADER} are read)")
    invalid = "not a safetensors file: the header is not valid JSON ({e}); corrupt or another format"
    header = _json(path, bytes(data[8:8 + n]), "the header", invalid)
    if not isinstance(header, dict):
        _fail(path, invalid.format(e="not a JSON object"))
    end = 0
    for k, v in header.items():
        if k != "__metadata__":
            try:
                end = max(end, int(v["data_offsets"][1]))
            except (TypeError, KeyError, IndexError, ValueError):
                _fail(path, f"corrupt safetensors header: the entry for tensor {k!r} is {v!r:.100}")
    if 8 + n + end > size:
        _fail(path, f"the file is truncated: its tensors need {8 + n + end} bytes, the file has {size}")
    return header


def _checksums(path, meta):
    """The checksums the metadata records ({tensor name: checksum}), or None
    for a file written before triflux recorded them (or by another program)."""
    if "checksums" not in meta:
        return None
    sums = _json(path, meta["checksums"], "the checksums", "corrupt triflux metadata: the checksums are not JSON ({e})")
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        _fail(path, "corrupt triflux metadata: the checksums are unreadable")
    if "__metadata__" in sums and \
            sums["__metadata__"] != _metadata_checksum(meta.get("structure", ""), meta.get("layers", "")):
        _fail(path, "the file's metadata (its structure and layers) does not match its checksum: the file "
                    "changed after it was written (a disk, memory or copy error, or an edit); use a good copy")
    return sums


def _tensors(path, data, checksums):
    import safetensors
    try:
        raw = safetensors.deserialize(data)
    except Exception as e:  # SafetensorError (no public class to catch)
        _fail(path, f"corrupt safetensors file: {e}")
    out = {}
    for name, v in raw:
        if checksums is not None and checksums.get(name) != _checksum(v["data"]):
            _fail(path, f"the data of the array `{name}` does not match its checksum: the file's bytes changed "
                        "after it was written (a disk, memory or copy error, or an edit); use a good copy")
        dt = _np_dtype(v["dtype"])
        if dt is None:
            _fail(path, f"tensor {name!r} has dtype {v['dtype']}, which triflux cannot read")
        arr = np.frombuffer(v["data"], dtype=dt).reshape(v["shape"])
        if not dt.isnative:
            arr = arr.astype(dt.newbyteorder("="))
        out[name] = arr
    return out


class _Decoder:
    def __init__(self, path, tensors, specs):
        self.path, self.tensors, self.specs, self.used = path, tensors, specs, set()

    def bad(self, where, what):
        _fail(self.path, f"the structure in the metadata does not match the file at {_show(where)}: {what} "
                         "(the file is corrupt or was edited)")

    def decode(self, node, where="", depth=0):
        if depth > MAX_DEPTH:
            _fail(self.path, f"the structure is nested more than {MAX_DEPTH} levels deep at {_show(where)} (the "
                             "file is corrupt, or made to crash readers)")
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
                items = [self.decode(e, path_join(where, i), depth + 1) for i, e in enumerate(v)]
                return tuple(items) if tag == "tuple" else items
            if tag == "dict" and isinstance(v, list):
                out = {}
                for item in v:
                    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                            and not isinstance(item[0], bool)):
                        self.bad(where, f"a malformed dict entry {item!r:.80}")
                    out[item[0]] = self.decode(item[1], path_join(where, item[0]), depth + 1)
                return LayerState(out, spec=self.specs[where]) if where in self.specs else out
        self.bad(where, f"an unknown entry {node!r:.80}")


def load(path, *, flat=False):
    """Read a file written by ``save`` and return its nested structure
    (dicts, lists, tuples, NumPy arrays, numbers, strings, ``None``): for a
    saved model, the ``state`` to give ``loadmodel(model, load(path))``.

    Loading never runs code (no pickle, no ``eval``): the header is JSON and
    the arrays raw bytes. Only regular files are read (never a FIFO or a
    device), and the header's size is checked against the file's before the
    rest is read. Every array's checksum is verified; a file from a triflux
    that did not record checksums loads unchecked. A layer's state comes
    back as a ``LayerState`` carrying its saved configuration, which
    ``loadmodel`` compares with the model's.

    Raises ``CheckpointError`` naming ``path`` for a missing, empty,
    truncated or corrupt file (an array whose bytes changed is named), a
    pickle / torch.save / BSON / NumPy / HDF5 file, a structure that does not
    match the tensors or is nested more than ``MAX_DEPTH`` levels, and a
    safetensors file not written by triflux (``flat=True`` reads any
    safetensors file as a flat ``{tensor name: array}`` dict)."""
    path = _file_path(path, "load")
    data, size, last = _read(path)
    header = _read_header(path, data, size, last)
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        meta = {}
    tensors = _tensors(path, data, _checksums(path, meta))
    if flat:
        return tensors
    if meta.get("format") != FORMAT:
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
    tree = _json(path, meta.get("structure"), "the structure",
                 "corrupt triflux metadata: the structure is missing or not JSON ({e})")
    specs = _json(path, meta.get("layers", "{}"), "the layers' description",
                  "corrupt triflux metadata: the layers' description is not JSON ({e})")
    if not isinstance(specs, dict):
        _fail(path, "corrupt triflux metadata: the layers' description is not a JSON object")
    dec = _Decoder(path, tensors, specs)
    out = dec.decode(tree)
    unused = [k for k in tensors if k not in dec.used]
    if unused:
        _fail(path, f"the structure in the metadata does not match the file: tensors {unused[:10]} are in the "
                    "file but not in the structure (the file is corrupt or was edited)")
    return out


# --- model files ----------------------------------------------------------------------------------

def save_model(path, model):
    """Write ``model`` (a layer: a Chain, a ``models.UNet``, ...) to ``path``
    so that ``load_model(path)`` rebuilds it without the code that built it,
    and return ``path``.

    It is ``save(path, model)`` after checking that the file describes
    every layer (:mod:`triflux.model_file`): layer types from triflux's own
    set (and those registered with ``register_layer``), their constructor
    arguments as plain data, functions (activations, connections) by name.
    A part the file cannot name (a lambda, a class or function that is not
    registered) raises ``CheckpointError`` naming where it is and how to
    register it, and nothing is written."""
    path = _file_path(path, "save_model", "; the path comes first: save_model(path, model)"
                      if isinstance(model, str) else "")
    if not is_layer(model):
        raise TypeError(f"save_model: expects a model (a layer such as a Chain), got {type(model).__name__}; "
                        "save other data with `save(path, x)`")
    try:
        s = state(model)
    except StructureError as e:
        raise CheckpointError(f"save_model: {path}: {e}") from None
    problems = [msg for where, layer in layer_states(s) for msg in unknown_parts(layer.spec, where)]
    if problems:
        raise CheckpointError(f"save_model: cannot describe the model, so nothing was written to {path}:\n  " +
                              "\n  ".join(problems))
    return save(path, s)


def load_model(path):
    """The model written by ``save_model(path, model)`` (or by ``save`` of a
    model all of whose parts have names), rebuilt on the CPU with the saved
    arrays, dtypes and train/test modes: ``gpu(load_model(path))`` puts it
    on the GPU.

    Nothing from the file is run: each layer is made by calling a class of
    triflux's closed registry (or one registered with ``register_layer``)
    with the arguments the file records, functions are looked up by name in
    the same registry, and the arrays are loaded with ``loadmodel``. Like
    building the model in code, this draws initial values from triflux's
    seeded stream before they are replaced. A type or function the registry
    does not have, or a file with no description of its model, raises
    ``CheckpointError`` naming the path, the layer and what to do."""
    path = _file_path(path, "load_model")
    tree = load(path)
    if not isinstance(tree, LayerState) or tree.spec is None:
        raise CheckpointError(f"load_model: {path}: the file holds no description of a model (it was written by "
                              "`save` of something else than a model); rebuild the model in code and call "
                              "`loadmodel(model, load(path))`, and write model files with `save_model(path, model)`")
    try:
        model = build(tree)
    except CheckpointError as e:
        raise CheckpointError(f"load_model: {path}: {e}") from None
    try:
        loadmodel(model, tree)
    except StructureError as e:
        raise CheckpointError(f"load_model: {path}: the saved arrays do not fit the layers the file describes (the "
                              f"file is corrupt or was edited): {e}") from None
    return model
