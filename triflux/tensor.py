"""``Tensor``: an array that knows its device, and making one from data
(``tensor``, ``as_tensor``).

On ``CPUDevice`` the storage is a NumPy array and the reference
implementations compute; on a GPU device it is a torch tensor used only as
memory, and the Triton kernels compute. This module holds the storage and
its metadata, copies to and from the host and between devices, printing
and the DLPack protocol; the operators and methods that compute (``+``,
``@``, ``sum``, ``reshape``, ``astype``, ...) are the functions of
``triflux.ops``, which attaches them to ``Tensor`` and checks devices,
dtypes and shapes before anything runs.
"""
import numpy as np

from . import dtypes as _dt
from . import memory, recording
from .devices import CPU, as_device
from .errors import DTypeError, DeviceMismatchError

_TORCH_TO_NP = {}


def _np_dtype_of(data):
    if isinstance(data, np.ndarray):
        return data.dtype
    d = _TORCH_TO_NP.get(data.dtype)
    if d is None:
        d = _TORCH_TO_NP[data.dtype] = _dt.from_torch(data.dtype)
    return d


class Tensor:
    """An n-dimensional array on a device: ``.shape``, ``.dtype`` (a NumPy
    dtype), ``.device``, ``.ndim``; arithmetic, comparisons, ``@``,
    reductions, ``reshape``, ``transpose``/``.T`` and basic slicing."""
    __slots__ = ("_data", "_device", "__weakref__")
    __array_priority__ = 1000  # NumPy defers `ndarray + Tensor` to Tensor

    def __init__(self, data, dtype=None, device=None):
        t = tensor(data, dtype=dtype, device=device)
        self._data, self._device = t._data, t._device

    @classmethod
    def _make(cls, data, device):
        t = object.__new__(cls)
        t._data = data
        t._device = device
        return t

    @classmethod
    def _from_numpy(cls, arr):
        return cls._make(arr, CPU)

    # --- metadata -------------------------------------------------------------
    @property
    def shape(self):
        return tuple(self._data.shape)

    @property
    def dtype(self):
        data = self._data
        if isinstance(data, np.ndarray):
            return data.dtype
        d = _TORCH_TO_NP.get(data.dtype)      # read on every op: the common case inline
        return _np_dtype_of(data) if d is None else d

    @property
    def device(self):
        return self._device

    @property
    def ndim(self):
        return self._data.ndim if isinstance(self._data, np.ndarray) else self._data.dim()

    @property
    def size(self):
        """Number of elements (as NumPy's ``size``)."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d Tensor")
        return self.shape[0]

    __hash__ = object.__hash__

    # --- host access ----------------------------------------------------------
    def numpy(self):
        """A NumPy copy of the values, from any device."""
        if isinstance(self._data, np.ndarray):
            return self._data.copy()
        return torch_to_numpy(self._data)

    def __array__(self, dtype=None, copy=None):
        """NumPy's view of a CPU tensor; a device tensor raises
        ``DeviceMismatchError`` (NumPy cannot read device memory, and a
        silent copy would hide slow transfers): ``cpu(t)`` or ``t.numpy()``."""
        if not self._device.is_cpu:
            raise DeviceMismatchError(
                f"this Tensor (shape {self.shape}, {self.dtype}) lives on {self._device!r}; NumPy cannot read "
                "device memory. Call `cpu(t)` or `t.numpy()` first (a copy to the host).")
        a = self._data
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError(f"np.asarray(..., dtype={np.dtype(dtype)}, copy=False): converting this "
                                 f"{a.dtype} Tensor needs a copy")
            return a.astype(dtype)
        return a.copy() if copy else a

    def tolist(self):
        """The values as (nested) Python numbers, from any device (a copy)."""
        a = self.numpy()
        if _dt.is_bfloat16(a.dtype):
            a = a.astype(np.float32)
        return a.tolist()

    def _scalar(self, what):
        """The one element as a Python number, copied from any device."""
        if self.size != 1:
            raise ValueError(f"{what} needs a Tensor of exactly one element, this one has shape {self.shape}; "
                             "reduce it first (`.sum()`, `.mean()`) or index one element")
        data = self._data
        if not isinstance(data, np.ndarray):          # a device tensor: copy just this element
            data = torch_to_numpy(data.reshape(()) if data.dim() else data)
        a = np.asarray(data).reshape(())
        if _dt.is_bfloat16(a.dtype):
            a = a.astype(np.float32)
        return a.item()

    def item(self):
        """The one element as a Python number (a copy from any device)."""
        return self._scalar("item()")

    def __float__(self):
        return float(self._scalar("float()"))

    def __int__(self):
        return int(self._scalar("int()"))

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of a Tensor of shape {self.shape} is ambiguous; "
                             "use `.numpy().any()` or `.numpy().all()`")
        return bool(self._scalar("bool()"))

    def __index__(self):
        if self.dtype.kind not in "iu" or self.size != 1:
            raise TypeError(f"only integer Tensors of one element can be used as an index; this one is "
                            f"{self.dtype} of shape {self.shape}")
        return int(self._scalar("__index__"))

    def __format__(self, spec):
        if self.size == 1 and spec:        # f"{loss:.4f}" on a one-element tensor, any device
            return format(self._scalar("format"), spec)
        if spec:
            raise TypeError(f"format spec {spec!r} needs a Tensor of one element, this one has shape {self.shape}")
        return str(self)

    def __repr__(self):
        """Shape, dtype, device and the values (copied from the device), as Flux prints arrays."""
        dims = "×".join(str(s) for s in self.shape) if self.ndim else "0-dimensional"
        values = np.array2string(self.numpy(), separator=", ", threshold=200, edgeitems=3, precision=5)
        return f"{dims} Tensor{{{self.dtype}}} on {self._device!r}:\n{values}"

    def __pos__(self):
        return self

    def to(self, device):
        """This tensor on ``device`` (a Device or a name such as "cpu", "cuda:1")."""
        return transfer(self, as_device(device))

    def detach(self):
        """A Tensor over the same memory that ``gradient`` does not watch, as
        torch's ``detach``: nothing computed from it is recorded, so no
        gradient flows back through it (it counts as a constant). No copy:
        an in-place change of either (an optimiser's update) shows in both."""
        return Tensor._make(self._data, self._device)

    # --- DLPack: other libraries read the storage without a copy ---------------------------
    def _dlpack_producer(self):
        """The array whose ``__dlpack__`` exports this tensor's memory."""
        data = self._data
        if isinstance(data, np.ndarray) and _dt.is_bfloat16(data.dtype):
            try:
                import torch
            except ImportError:
                raise DTypeError("NumPy's DLPack cannot export bfloat16; installing torch lets triflux export "
                                 "bfloat16 CPU tensors without a copy") from None
            return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        return data

    def __dlpack__(self, stream=None, **kwargs):
        """A DLPack capsule over this tensor's memory (no copy), for
        ``np.from_dlpack(t)``, ``torch.from_dlpack(t)``. ``stream`` and the
        newer keywords (``max_version``, ``dl_device``, ``copy``) are passed
        to the storage's own ``__dlpack__``."""
        producer = self._dlpack_producer()
        if stream is not None:
            kwargs["stream"] = stream
        try:
            return producer.__dlpack__(**kwargs)
        except TypeError:
            if "max_version" in kwargs:   # an older producer: the legacy protocol
                kwargs.pop("max_version")
                return producer.__dlpack__(**kwargs)
            raise

    def __dlpack_device__(self):
        """``(device_type, device_id)``; the Triton interpreter's CUDADevice
        holds host memory and reports kDLCPU."""
        kind, idx = self._dlpack_producer().__dlpack_device__()
        return (int(kind), int(idx))


# --- host <-> device ----------------------------------------------------------------

def torch_to_numpy(t):
    """A NumPy copy of the torch tensor ``t``, from any device (bfloat16 as ml_dtypes' bfloat16)."""
    import torch
    if recording.ACTIVE is not None:
        recording.note_host_read(t)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_dt.bfloat16).copy()
    return t.numpy().copy()


def numpy_to_torch(arr, tdevice):
    """A torch copy of the NumPy array ``arr`` on torch device ``tdevice``."""
    import torch
    arr = np.ascontiguousarray(arr).reshape(arr.shape)   # ascontiguousarray makes 0-d arrays 1-d
    if _dt.is_bfloat16(arr.dtype):
        host = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        _dt.to_torch(arr.dtype)  # raises a DTypeError for unsupported dtypes
        host = torch.from_numpy(arr)
    # A copy always: the device tensor must not alias the caller's NumPy array.
    return _copy_to(host, tdevice)


def _copy_to(t, tdevice):
    """``t.to(tdevice, copy=True)``, running out of device memory as triflux's
    OutOfMemoryError (with the bytes asked for and free)."""
    try:
        return t.to(tdevice, copy=True)
    except Exception as e:
        if memory.is_out_of_memory(e):
            raise memory.out_of_memory(e, device=tdevice, asked=t.numel() * t.element_size(),
                                       purpose=f"a {tuple(t.shape)} tensor moved to the device") from None
        raise


def transfer(t, device):
    """``t`` on ``device`` (``t`` itself when already there)."""
    src = t._device
    if src == device:
        return t
    if device.is_cpu:
        return Tensor._make(torch_to_numpy(t._data), CPU)
    tdev = device.torch_device
    if src.is_cpu:
        moved = numpy_to_torch(t._data, tdev)
        if recording.ACTIVE is not None:
            recording.note_upload(t._data)
            recording.note_allocation(moved)
        return Tensor._make(moved, device)
    if recording.ACTIVE is not None:
        recording.note_device_copy(t._data, tdev)
    return Tensor._make(_copy_to(t._data, tdev), device)


# --- making Tensors from data -------------------------------------------------------------

def tensor(data, dtype=None, device=None):
    """A Tensor from a NumPy array, nested lists, a number or a Tensor.

    Floating data without a ``dtype`` keeps its dtype for arrays and becomes
    float32 for Python lists and numbers (the default float type), as
    triflux layers expect; integers and bools keep their type.
    """
    dev = as_device(device)
    if isinstance(data, Tensor):
        return transfer(data if dtype is None else data.astype(dtype), dev)
    if type(data).__module__.startswith("torch"):
        data = torch_to_numpy(data)
    was_array = isinstance(data, np.ndarray) or np.isscalar(data) and isinstance(data, np.generic)
    arr = np.array(data, dtype=None if dtype is None else _dt.as_dtype(dtype), copy=True)
    if dtype is None and not was_array and arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return transfer(Tensor._make(numeric(arr), CPU), dev)


def numeric(arr):
    """``arr`` itself when it holds numbers; a ``DTypeError`` for strings,
    Python objects, bytes, dates (NumPy arrays that cannot be a Tensor)."""
    kind = arr.dtype.kind
    if kind in "biufc" or kind == "V" and _dt.is_bfloat16(arr.dtype):   # ml_dtypes' bfloat16 is of kind "V"
        return arr
    what = {"O": "Python objects", "U": "strings", "S": "bytes", "M": "dates", "m": "time spans"}.get(kind, "data")
    hint = ("(NumPy makes one from rows of different lengths, or from None among numbers)" if kind == "O" else
            "(class labels become numbers with `onehotbatch(labels, classes)`)")
    raise DTypeError(f"cannot make a Tensor of {what} (a NumPy array of dtype {arr.dtype}, shape {arr.shape}): "
                     f"a Tensor holds numbers (floats, integers or bools); convert the data to numbers first {hint}")


def _constant(value, dtype, device):
    """A Python number as a 0-d Tensor of ``dtype`` on ``device``; device
    constants are cached, so a loop such as ``x * 0.5`` copies 0.5 once."""
    arr = np.asarray(value, dtype=dtype)
    if device.is_cpu:
        return Tensor._make(arr, device)
    key = (type(value), value, dtype, device)
    c = _CONSTANTS.get(key)
    if c is None:
        c = transfer(Tensor._make(arr, CPU), device)
        if len(_CONSTANTS) > 4096:
            _CONSTANTS.clear()
        _CONSTANTS[key] = c
    return c


_CONSTANTS = {}


def as_tensor(x, like=None):
    """``x`` as a Tensor: Tensors pass; NumPy arrays become CPU Tensors;
    Python numbers become constants of ``like``'s dtype and device (floats
    of an integer ``like`` the default float type)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number, np.bool_)) and like is not None:
        ld = like.dtype
        if _dt.is_floating(ld):
            dt = ld
        elif isinstance(x, (bool, np.bool_)):
            dt = ld
        elif isinstance(x, (int, np.integer)):
            dt = ld if ld.kind in "iu" else _dt.int64
        else:
            dt = _dt.DEFAULT_FLOAT
        return _constant(x, dt, like._device)
    if isinstance(x, np.ndarray):
        return Tensor._from_numpy(numeric(x))
    if like is not None and isinstance(x, (list, tuple)):
        return tensor(x, device=like._device)
    return tensor(x)
