"""``Tensor``: an array that knows its device.

On ``CPUDevice`` the storage is a NumPy array and the reference
implementations compute; on a GPU device it is a torch tensor used only as
memory, and the Triton kernels compute. Every operator goes through
``triflux.ops``, which checks devices, dtypes and shapes and records the
operation for ``gradient``.
"""
import numpy as np

from . import dtypes as _dt
from .devices import CPU, Device, get_device, _canonical
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
        return _np_dtype_of(self._data)

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
        return _torch_to_numpy(self._data)

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
            data = _torch_to_numpy(data.reshape(()) if data.dim() else data)
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
        """Shape, dtype, device and the values (copied from the device)."""
        from .show import tensor_repr
        return tensor_repr(self)

    # --- arithmetic (all through triflux.ops) ---------------------------------
    def __add__(self, o): return _ops.add(self, o)
    def __radd__(self, o): return _ops.add(o, self)
    def __sub__(self, o): return _ops.sub(self, o)
    def __rsub__(self, o): return _ops.sub(o, self)
    def __mul__(self, o): return _ops.mul(self, o)
    def __rmul__(self, o): return _ops.mul(o, self)
    def __truediv__(self, o): return _ops.div(self, o)
    def __rtruediv__(self, o): return _ops.div(o, self)
    def __pow__(self, o): return _ops.pow(self, o)
    def __rpow__(self, o): return _ops.pow(o, self)
    def __matmul__(self, o): return _ops.matmul(self, o)
    def __rmatmul__(self, o): return _ops.matmul(o, self)
    def __neg__(self): return _ops.neg(self)
    def __pos__(self): return self
    def __abs__(self): return _ops.abs(self)
    def __eq__(self, o): return _ops.eq(self, o)
    def __ne__(self, o): return _ops.ne(self, o)
    def __lt__(self, o): return _ops.lt(self, o)
    def __le__(self, o): return _ops.le(self, o)
    def __gt__(self, o): return _ops.gt(self, o)
    def __ge__(self, o): return _ops.ge(self, o)
    def __getitem__(self, index): return _ops.getitem(self, index)

    def sum(self, axis=None, keepdims=False): return _ops.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return _ops.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return _ops.max(self, axis, keepdims)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops.reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _ops.transpose(self, axes or None)

    @property
    def T(self):
        return _ops.transpose(self, None)

    def astype(self, dtype):
        return _ops.cast(self, dtype)

    def exp(self): return _ops.exp(self)
    def log(self): return _ops.log(self)
    def sqrt(self): return _ops.sqrt(self)
    def tanh(self): return _ops.tanh(self)

    def to(self, device):
        """This tensor on ``device`` (a Device or a name such as "cpu", "cuda:1")."""
        return transfer(self, as_device(device))


# --- host <-> device ----------------------------------------------------------------

def _torch_to_numpy(t):
    import torch
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_dt.bfloat16).copy()
    return t.numpy().copy()


def _numpy_to_torch(arr, tdevice):
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
        from .triton_kernels import common
        if common._is_oom(e):
            raise common.out_of_memory(e, device=tdevice, asked=t.numel() * t.element_size(),
                                       purpose=f"a {tuple(t.shape)} tensor moved to the device") from None
        raise


def transfer(t, device):
    """``t`` on ``device`` (``t`` itself when already there)."""
    src = t._device
    if src == device:
        return t
    if device.is_cpu:
        return Tensor._make(_torch_to_numpy(t._data), CPU)
    tdev = device.torch_device
    if src.is_cpu:
        return Tensor._make(_numpy_to_torch(t._data, tdev), device)
    return Tensor._make(_copy_to(t._data, tdev), device)


def as_device(device):
    """A Device from a Device, ``None`` (CPU) or a name: "cpu", "cuda",
    "cuda:1", "amdgpu:0", "gpu"."""
    if device is None:
        return CPU
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        name, _, idx = device.partition(":")
        if name.lower() == "gpu":
            from .devices import gpu_device
            return gpu_device()
        return get_device(backend=_canonical(name), idx=int(idx or 0))
    raise TypeError(f"not a device: {device!r}")


# --- constructors ----------------------------------------------------------------------

def tensor(data, dtype=None, device=None):
    """A Tensor from a NumPy array, nested lists, a number or a Tensor.

    Floating data without a ``dtype`` keeps its dtype for arrays and becomes
    float32 for Python lists and numbers (the default float type), as
    triflux layers expect; integers and bools keep their type.
    """
    dev = as_device(device)
    if isinstance(data, Tensor):
        t = data if dtype is None else _ops.cast(data, dtype)
        return transfer(t, dev)
    if type(data).__module__.startswith("torch"):
        data = _torch_to_numpy(data)
    was_array = isinstance(data, np.ndarray) or np.isscalar(data) and isinstance(data, np.generic)
    arr = np.array(data, dtype=None if dtype is None else _dt.as_dtype(dtype), copy=True)
    if dtype is None and not was_array and arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    if arr.dtype.kind in "OUSV" and not _dt.is_bfloat16(arr.dtype):   # ml_dtypes' bfloat16 is of kind "V"
        raise DTypeError(f"cannot make a Tensor of {arr.dtype} data; use numbers")
    return transfer(Tensor._make(arr, CPU), dev)


_SEED = {"rng": np.random.default_rng()}


def seed(s):
    """Seed triflux's random numbers (``rand``, ``randn``, initialisers,
    dropout) on every device."""
    _SEED["rng"] = np.random.default_rng(s)


def next_seed():
    """A fresh 31-bit seed for one random fill, from triflux's seeded stream."""
    return int(_SEED["rng"].integers(0, 2**31 - 1))


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        from .errors import ShapeError
        raise ShapeError(f"negative dimension in shape {shape}")
    return shape


def full(shape, value, dtype=_dt.float32, device=None):
    return _ops.fill(_shape_args((shape,) if isinstance(shape, int) else (tuple(shape),)),
                     value, dtype=dtype, device=as_device(device))


def zeros(*shape, dtype=_dt.float32, device=None):
    return _ops.fill(_shape_args(shape), 0, dtype=dtype, device=as_device(device))


def ones(*shape, dtype=_dt.float32, device=None):
    return _ops.fill(_shape_args(shape), 1, dtype=dtype, device=as_device(device))


def rand(*shape, dtype=_dt.float32, device=None, seed=None):
    """Uniform on [0, 1), drawn on the device itself."""
    return _ops.random("rand_uniform", _shape_args(shape), dtype, as_device(device), seed)


def randn(*shape, dtype=_dt.float32, device=None, seed=None):
    """Standard normal, drawn on the device itself."""
    return _ops.random("rand_normal", _shape_args(shape), dtype, as_device(device), seed)


from . import ops as _ops  # noqa: E402  (ops needs Tensor)


def _dlpack_methods():
    """``Tensor.__dlpack__``/``__dlpack_device__`` (the DLPack protocol:
    ``np.from_dlpack(t)``, ``torch.from_dlpack(t)``), from triflux.interop."""
    def __dlpack__(self, stream=None, **kw):
        from .interop import tensor_dlpack
        return tensor_dlpack(self, stream, **kw)

    def __dlpack_device__(self):
        from .interop import tensor_dlpack_device
        return tensor_dlpack_device(self)
    Tensor.__dlpack__, Tensor.__dlpack_device__ = __dlpack__, __dlpack_device__


_dlpack_methods()
