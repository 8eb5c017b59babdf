"""What Triton compiles anew: a kernel's :class:`Specialization` (argument
types, constexprs, 16-byte divisibility, launch options), built from one
launch the way Triton's launcher does (:func:`specialization`), compiled for
a GPU architecture without a GPU (:func:`compile_specialization`), and the
fingerprint of the source it compiles (:func:`source_fingerprint`)."""
import dataclasses
import hashlib
import inspect
import json
import types

#: architecture name -> compute capability given to GPUTarget
ARCHS = {"sm_90": 90, "sm_80": 80}

#: keyword arguments of a launch that are options of the compiler, not kernel parameters
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclasses.dataclass(frozen=True)
class Specialization:
    """One compiled form of a kernel: the arguments of ``triton.compile``.
    ``signature`` maps each parameter to its Triton type (``*fp32``, ``i32``,
    ``constexpr``...), ``constexprs`` the constexpr parameters to their values,
    ``divisible`` lists the parameters known to be multiples of 16 (pointers
    aligned to 16 bytes, integers divisible by 16: what lets the compiler
    vectorise), ``options`` the compiler options the launch passed."""
    module: str
    kernel: str
    signature: dict
    constexprs: dict
    divisible: tuple
    options: dict

    def attrs(self):
        names = list(self.signature)
        return {(names.index(p),): [["tt.divisibility", 16]] for p in self.divisible}

    def encoded(self):
        """The specialization as JSON-ready values (constexprs encoded)."""
        return {"module": self.module, "kernel": self.kernel, "signature": self.signature,
                "constexprs": {k: encode_constexpr(v) for k, v in self.constexprs.items()},
                "divisible": list(self.divisible), "options": self.options}

    @classmethod
    def decoded(cls, d):
        constexprs = {k: decode_constexpr(v) for k, v in d["constexprs"].items()}
        return cls(d["module"], d["kernel"], d["signature"], constexprs, tuple(d["divisible"]), d["options"])

    def key(self):
        return json.dumps(self.encoded(), sort_keys=True)


def encode_constexpr(value):
    """A constexpr value as JSON (Triton dtypes and constexpr wrappers tagged)."""
    kind = type(value).__name__
    if kind == "constexpr":
        return encode_constexpr(value.value)
    if kind == "dtype" and type(value).__module__.startswith("triton"):
        return {"triton_dtype": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode_constexpr(v) for v in value]}
    return value


def decode_constexpr(value):
    if isinstance(value, dict) and "triton_dtype" in value:
        import triton.language as tl
        return tl.dtype(value["triton_dtype"])
    if isinstance(value, dict) and "tuple" in value:
        return tuple(decode_constexpr(v) for v in value["tuple"])
    return value


def _parameters(kernel):
    """[(name, is_constexpr, specialize, align, default)] of a jitted kernel
    (compiled or interpreted), as Triton's launcher reads them."""
    fn = kernel.fn
    params = getattr(kernel, "params", None)
    if params is not None:     # a compiled JITFunction knows its own
        return [(p.name, p.is_constexpr, not p.do_not_specialize, not p.do_not_specialize_on_alignment,
                 p.default if p.has_default else inspect.Parameter.empty) for p in params]
    options = getattr(kernel, "kwargs", {}) or {}
    sig = list(inspect.signature(fn).parameters.values())

    def listed(key):
        given = options.get(key) or ()
        return {sig[i].name if isinstance(i, int) else i for i in given}
    no_spec, no_align = listed("do_not_specialize"), listed("do_not_specialize_on_alignment")
    return [(p.name, "constexpr" in str(p.annotation), p.name not in no_spec, p.name not in no_align, p.default)
            for p in sig]


def specialization(kernel, args, meta):
    """The :class:`Specialization` that ``kernel[grid](*args, **meta)``
    compiles to on a GPU: each argument typed and specialized as Triton's
    launcher does (ints equal to 1 and ``None`` become constexprs, pointers
    and ints divisible by 16 are marked so)."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl
    params = _parameters(kernel)
    names = [p[0] for p in params]
    values = dict(zip(names, args))
    unknown = [k for k in meta if k not in names and k not in LAUNCH_OPTIONS]
    if unknown:
        raise TypeError(f"{kernel.__name__}: unknown launch keywords {unknown}")
    values.update({k: v for k, v in meta.items() if k in names})
    signature, constexprs, divisible = {}, {}, []
    for name, is_constexpr, specialize, align, default in params:
        if name not in values:
            if default is inspect.Parameter.empty:
                raise TypeError(f"{kernel.__name__}: no value for parameter {name}")
            values[name] = default
        v = values[name]
        if is_constexpr:
            ty, attr = "constexpr", None
        else:
            ty, attr = native_specialize_impl(CUDABackend, v, False, specialize, align)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = attr if not is_constexpr else v
        elif isinstance(attr, str) and "D" in attr:
            divisible.append(name)
    options = {k: v for k, v in meta.items() if k in LAUNCH_OPTIONS}
    fn = kernel.fn
    return Specialization(fn.__module__, fn.__name__, signature, constexprs, tuple(divisible), options)


def compile_specialization(kernel, spec, arch="sm_90"):
    """``triton.compile`` of ``spec`` for ``arch`` (sm_90 or sm_80); ``kernel``
    must be a compiled (not interpreted) jitted function, so this runs where
    TRITON_INTERPRET is off. No GPU is needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(fn=kernel, signature=spec.signature, constexprs=spec.constexprs,
                                    attrs=spec.attrs())
    return triton.compile(src, target=GPUTarget("cuda", ARCHS[arch], 32), options=dict(spec.options))


def source_fingerprint(kernel):
    """(sha256 hex, contains a dot) of a kernel's source with every jitted
    function it reaches and the simple constants it reads (the parts of the
    tree that change what it compiles to)."""
    from triton.runtime.jit import KernelInterface
    digest, seen, state = hashlib.sha256(), set(), {"dot": False}

    def names(code):
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out |= names(c)
        return out

    def value(label, v, used):
        if isinstance(v, KernelInterface):
            visit(v.fn)
        elif isinstance(v, types.ModuleType):
            for attr in sorted(used):
                if attr in vars(v):
                    value(f"{label}.{attr}", vars(v)[attr], ())
        elif type(v).__name__ == "constexpr" or isinstance(v, (bool, int, float, str)):
            digest.update(f"{label}={v!r};".encode())

    def visit(fn):
        if fn in seen:
            return
        seen.add(fn)
        text = inspect.getsource(fn)
        state["dot"] |= "tl.dot(" in text
        digest.update(text.encode())
        used = names(fn.__code__)
        for name in sorted(used):
            if name in fn.__globals__:
                value(name, fn.__globals__[name], used)
    visit(kernel.fn)
    return digest.hexdigest(), state["dot"]
