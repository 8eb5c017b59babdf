"""Edge cases of the elementwise family that the generic property suite
(tests/test_primitives.py) does not reach: integer and boolean inputs,
stability at large |x|, subgradient conventions at kinks and ties, 0-sized
broadcasting, 5-6-d non-contiguous views, casts between every dtype, NaN
semantics, error messages. Each compares the reference, the kernel (Triton
interpreter unless TRIFLUX_TEST_REAL_GPU=1) and torch.
"""
import numpy as np

from torch_ops import assert_torch_only_moves_memory
import pytest

from triflux import dtypes as tfd
from triflux.errors import DTypeError, ShapeError
from helpers import f64, tn, tt
from triflux.reference import elementwise as R

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.requires_kernels

FLOATS = ("float32", "float16", "bfloat16", "float64")


@pytest.fixture(scope="module")
def K():
    from triflux.triton_kernels import elementwise
    return elementwise


def torch_grad(fn, arrays, g, dtype=torch.float64):
    """torch.autograd gradients of fn at ``arrays`` (float64 CPU) for output gradient g."""
    ts = [torch.tensor(np.asarray(a, dtype=np.float64), dtype=dtype, requires_grad=True)
          for a in arrays]
    out = fn(*ts)
    out.backward(torch.tensor(np.asarray(g, dtype=np.float64), dtype=dtype))
    return [t.grad.numpy() for t in ts], out.detach().numpy()


# --- integer and boolean inputs ------------------------------------------------------------

INT_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_and_bool_binary_ops(K, kernel_device, dtype):
    rng = np.random.default_rng(0)
    a = rng.integers(-50, 50, (4, 1, 6)).astype(dtype)
    b = rng.integers(-50, 50, (3, 1)).astype(dtype)
    at = tt(a, kernel_device).transpose(0, 2).contiguous().transpose(0, 2)  # non-contiguous
    bt = tt(b, kernel_device)
    for name, npf in INT_BINARY.items():
        if dtype == "bool" and name == "sub":
            with pytest.raises(DTypeError, match="sub"):
                K.sub_forward(at, bt)
            continue
        want = npf(a, b)
        ref = getattr(R, name + "_forward")(a, b)
        got = tn(getattr(K, name + "_forward")(at, bt))
        assert ref.dtype == want.dtype and got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(ref, want, err_msg=name)
        np.testing.assert_array_equal(got, want, err_msg=name)
        tf = getattr(torch, name)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_array_equal(got, tf, err_msg=f"{name} vs torch")


def test_integer_wraparound_and_large_int64(K, kernel_device):
    """Integer arithmetic stays in the native type (no float round trip)."""
    a = np.array([2 ** 62 + 1, -(2 ** 62) - 3, 7], dtype=np.int64)
    b = np.array([2 ** 62, 5, -(2 ** 40) - 1], dtype=np.int64)
    for name in ("add", "sub", "mul", "maximum", "lt"):
        got = tn(getattr(K, name + "_forward")(tt(a, kernel_device), tt(b, kernel_device)))
        np.testing.assert_array_equal(got, INT_BINARY[name](a, b), err_msg=name)
    i32 = np.array([2 ** 31 - 1, -(2 ** 31)], dtype=np.int32)
    one = np.array([1], dtype=np.int32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(tn(K.add_forward(tt(i32, kernel_device), tt(one, kernel_device))),
                                      i32 + one)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_unary(K, kernel_device, dtype):
    x = np.array([[-7, 0, 3], [5, -1, 2 ** 20]], dtype=dtype)
    xt = tt(x, kernel_device).t()
    for name, npf in (("neg", np.negative), ("abs", np.abs), ("relu", lambda v: np.maximum(v, 0))):
        got = tn(getattr(K, name + "_forward")(xt))
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, npf(x.T), err_msg=name)
        np.testing.assert_array_equal(getattr(R, name + "_forward")(x.T), npf(x.T), err_msg=name)
        # no gradient for integer inputs, on both sides
        assert getattr(K, name + "_backward")(xt, None, xt) == (None,)
        assert getattr(R, name + "_backward")(x.T, None, x.T) == (None,)
    with pytest.raises(DTypeError, match="exp"):
        K.exp_forward(xt)


def test_bool_unary_and_where(K, kernel_device):
    m = np.array([[True, False, True]])
    np.testing.assert_array_equal(tn(K.abs_forward(tt(m, kernel_device))), m)
    with pytest.raises(DTypeError, match="neg"):
        K.neg_forward(tt(m, kernel_device))
    cond = np.array([[True], [False]])
    for dtype in ("int32", "int64", "bool", "float16", "bfloat16"):
        a = np.array([[1, 0, 3]]).astype(tfd.as_dtype(dtype))
        b = np.array([7, 1, 0]).astype(tfd.as_dtype(dtype))
        want = np.where(cond, a, b)
        got = tn(K.where_forward(tt(cond, kernel_device), tt(a, kernel_device), tt(b, kernel_device)))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
        np.testing.assert_array_equal(R.where_forward(cond, a, b).astype(np.float64),
                                      want.astype(np.float64))


CASTS = ("float64", "float32", "float16", "bfloat16", "int32", "int64", "bool")


@pytest.mark.parametrize("src", CASTS)
def test_cast_every_pair(K, kernel_device, src):
    """Kernel, reference and torch agree bit for bit on every cast (floats to
    integers truncate toward zero, anything to bool is != 0)."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-300, 300, 40), [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, 1 / 3, 255.9]])
    xs = x.astype(tfd.as_dtype(src))
    xt = tt(xs, kernel_device)
    xt = tt(np.stack([xs, xs]), kernel_device)[:, ::1].t()[:, 0]   # a strided view
    for dst in CASTS:
        d = tfd.as_dtype(dst)
        got = tn(K.cast_forward(xt, d))
        ref = R.cast_forward(xs, d)
        want = torch.from_numpy(np.asarray(xs).view(np.int16)).view(torch.bfloat16) \
            if src == "bfloat16" else torch.from_numpy(xs)
        want = tn(want.to(tfd.to_torch(d)))
        assert got.dtype == d and ref.dtype == d
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64),
                                      err_msg=f"{src} -> {dst}, kernel vs torch")
        np.testing.assert_array_equal(ref.astype(np.float64), want.astype(np.float64),
                                      err_msg=f"{src} -> {dst}, reference vs torch")


def test_cast_backward_returns_input_dtype(K, kernel_device):
    x = np.array([1.0, -2.5, 3.25])
    g = np.array([0.1, 0.2, 0.3], dtype=np.float16)
    for src in FLOATS:
        xt = tt(x, kernel_device, src)
        (gx,) = K.cast_backward(tt(g, kernel_device), None, xt, np.dtype(np.float16))
        assert gx.dtype == xt.dtype
        np.testing.assert_allclose(f64(gx), g.astype(np.float64).astype(tfd.as_dtype(src)).astype(np.float64))
        (gr,) = R.cast_backward(g, None, x.astype(tfd.as_dtype(src)), np.dtype(np.float16))
        assert gr.dtype == tfd.as_dtype(src)
    # integer input or output: no gradient
    assert K.cast_backward(tt(g, kernel_device), None, tt(np.array([1, 2, 3]), kernel_device),
                           np.dtype(np.float16)) == (None,)
    assert R.cast_backward(g, None, np.array([1, 2, 3]), np.dtype(np.float16)) == (None,)


# --- stability at large |x| ------------------------------------------------------------------

BIG = np.array([-1e4, -1e3, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 1e3, 1e4])

ACTIVATIONS = {
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "softplus": torch.nn.functional.softplus,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    # x Phi(x) with Phi = erfc(-x / sqrt 2) / 2: F.gelu's 1 + erf(x / sqrt 2) cancels to 0 below x ~ -8
    "gelu_erf": lambda x: x * 0.5 * torch.special.erfc(-x * 0.7071067811865476),
    "swish": torch.nn.functional.silu, "elu": torch.nn.functional.elu,
    "leakyrelu": lambda x: torch.nn.functional.leaky_relu(x, 0.01), "relu": torch.relu,
}


@pytest.mark.parametrize("dtype", FLOATS)
def test_activations_stable_at_large_abs_x(K, kernel_device, dtype):
    x = BIG.astype(tfd.as_dtype(dtype)).astype(np.float64)   # representable values
    g = np.ones_like(x)
    xt, gt = tt(x, kernel_device, dtype), tt(g, kernel_device, dtype)
    for name, tf in ACTIVATIONS.items():
        y = K.__dict__[name + "_forward"](xt)
        (gx,) = K.__dict__[name + "_backward"](gt, y, xt)
        yr = R.__dict__[name + "_forward"](x)
        (gr,) = R.__dict__[name + "_backward"](g, yr, x)
        (want_g,), want_y = torch_grad(tf, [x], g)
        for label, arr in (("kernel y", f64(y)), ("kernel dx", f64(gx)), ("ref y", yr),
                           ("ref dx", gr)):
            assert not np.isnan(arr).any(), f"{name} {dtype}: NaN in {label}: {arr}"
        tol = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
        d = tfd.as_dtype(dtype)   # compare with torch's float64 result rounded to dtype
        tiny = {"float64": 2.3e-308, "float32": 1.2e-38, "float16": 6.2e-5, "bfloat16": 1.2e-38}
        np.testing.assert_allclose(f64(y), want_y.astype(d).astype(np.float64), rtol=tol,
                                   atol=tiny[dtype], err_msg=f"{name} y")   # (subnormals may flush)
        np.testing.assert_allclose(f64(gx), want_g.astype(d).astype(np.float64), rtol=tol,
                                   atol=tol * 1e-3, err_msg=f"{name} dx")
        np.testing.assert_allclose(yr, want_y, rtol=1e-12, err_msg=f"{name} ref y")
        np.testing.assert_allclose(gr, want_g, rtol=1e-12, atol=1e-300, err_msg=f"{name} ref dx")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exp_overflow_is_inf_not_nan(K, kernel_device, dtype):
    x = np.array([-1e4, 0.0, 1e4])
    y = f64(K.exp_forward(tt(x, kernel_device, dtype)))
    np.testing.assert_array_equal(y, [0.0, 1.0, np.inf])
    np.testing.assert_array_equal(R.exp_forward(x.astype(dtype)), [0.0, 1.0, np.inf])


def test_small_arguments_keep_relative_accuracy(K, kernel_device):
    """tanh, elu (expm1) and softplus (log1p) where a naive formula cancels."""
    x = np.array([1e-7, -3e-6, 1e-4, -0.2, 0.3, -30.0, -80.0])
    xt = tt(x, kernel_device, "float32")
    xf = x.astype(np.float32).astype(np.float64)
    for name, want in (("tanh", np.tanh(xf)), ("elu", np.where(xf > 0, xf, np.expm1(xf))),
                       ("softplus", np.log1p(np.exp(xf)))):
        got = f64(K.__dict__[name + "_forward"](xt))
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)


# --- kinks and ties -----------------------------------------------------------------------

def test_kink_conventions_match_torch(K, kernel_device):
    """relu'(0) = 0, abs'(0) = 0, leakyrelu'(0) = slope, elu'(0) = alpha."""
    x = np.array([-1.0, 0.0, 2.0])
    g = np.array([1.0, 1.0, 1.0])
    cases = {"relu": torch.relu, "abs": torch.abs,
             "leakyrelu": lambda v: torch.nn.functional.leaky_relu(v, 0.01),
             "elu": torch.nn.functional.elu}
    for name, tf in cases.items():
        (want,), _ = torch_grad(tf, [x], g)
        (gk,) = K.__dict__[name + "_backward"](tt(g, kernel_device), None, tt(x, kernel_device))
        (gr,) = R.__dict__[name + "_backward"](g, None, x)
        np.testing.assert_array_equal(f64(gk), want, err_msg=name)
        np.testing.assert_array_equal(gr, want, err_msg=name)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_ties_split_the_gradient(K, kernel_device, name):
    a = np.array([[1.0, 2.0, 3.0], [0.5, 2.0, -1.0]])
    b = np.array([1.0, 0.0, 3.0])                          # ties in column 0 and 2, broadcast
    g = np.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
    (wa, wb), _ = torch_grad(getattr(torch, name), [a, b], g)
    ga, gb = getattr(K, name + "_backward")(tt(g, kernel_device), None, tt(a, kernel_device),
                                            tt(b, kernel_device))
    ra, rb = getattr(R, name + "_backward")(g, None, a, b)
    for got in (f64(ga), ra):
        np.testing.assert_array_equal(got, wa)
    for got in (f64(gb), rb):
        np.testing.assert_array_equal(got, wb)


def test_nan_propagation(K, kernel_device):
    a = np.array([np.nan, 1.0, 2.0, np.nan])
    b = np.array([0.0, np.nan, 1.0, np.nan])
    at, bt = tt(a, kernel_device), tt(b, kernel_device)
    for name, npf in (("maximum", np.maximum), ("minimum", np.minimum)):
        np.testing.assert_array_equal(tn(getattr(K, name + "_forward")(at, bt)), npf(a, b))
        np.testing.assert_array_equal(getattr(R, name + "_forward")(a, b), npf(a, b))
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        np.testing.assert_array_equal(tn(getattr(K, name + "_forward")(at, bt)),
                                      INT_BINARY[name](a, b), err_msg=name)
    np.testing.assert_array_equal(np.isnan(f64(K.relu_forward(at))), np.isnan(a))


#: every non-finite value and its neighbours (signed zeros, +-1, a fraction)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.0])
UNARY_ATTRS = {"neg": {}, "exp": {}, "log": {}, "sqrt": {}, "abs": {}, "tanh": {}, "sigmoid": {},
               "relu": {}, "gelu": {}, "gelu_erf": {}, "swish": {}, "softplus": {},
               "leakyrelu": {"negative_slope": 0.2}, "elu": {"alpha": 0.5}}
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")


def _check_special(name, inputs, attrs, kernel_device):
    """Reference (float64) vs torch's oracle, forward and autograd gradients;
    the kernel in float32 and float64 vs the reference: NaN and +-inf in the
    same places, finite values close (tolerances.assert_close)."""
    import tolerances as tol
    from triflux.primitives import REGISTRY
    prim = REGISTRY[name]
    g = np.linspace(-1.5, 2.0, inputs[0].size).reshape(np.broadcast(*inputs).shape) + 0.25
    y = prim.reference()(*inputs, **attrs)
    grads = prim.reference("backward")(g, y, *inputs, **attrs)
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    ty = prim.torch_oracle()(*ts, **attrs)
    tgrads = torch.autograd.grad(ty, ts, torch.tensor(g))
    what = f"{name} at {[a.tolist() for a in inputs]}"
    tol.assert_close(y, ty.detach().numpy(), "float64", what=f"{what}: reference vs torch",
                     rtol=tol.TORCH_F64_RTOL)
    for i, (r, t) in enumerate(zip(grads, tgrads)):
        tol.assert_close(r, t.numpy(), "float64", what=f"{what}: gradient {i}, reference vs torch",
                         rtol=tol.TORCH_F64_RTOL)
    for dtype in ("float32", "float64"):
        ky = K_of(prim)(*[tt(a, kernel_device, dtype) for a in inputs], **attrs)
        kgrads = K_of(prim, "backward")(tt(g, kernel_device, dtype), ky,
                                        *[tt(a, kernel_device, dtype) for a in inputs], **attrs)
        yd = prim.reference()(*[a.astype(dtype) for a in inputs], **attrs)
        tol.assert_close(tn(ky), yd, dtype, what=f"{what}: {dtype} kernel vs reference")
        gd = prim.reference("backward")(g.astype(dtype), yd, *[a.astype(dtype) for a in inputs], **attrs)
        for i, (kg, r) in enumerate(zip(kgrads, gd)):
            tol.assert_close(tn(kg), r, dtype, what=f"{what}: {dtype} kernel gradient {i} vs reference")


def K_of(prim, direction="forward"):
    return prim.kernel(direction)


@pytest.mark.parametrize("name", list(UNARY_ATTRS))
def test_unary_nan_and_infinities_as_torch(kernel_device, name):
    """Every unary activation at NaN, +-inf, +-0 and ordinary values: torch's
    results, forward and backward (relu'(NaN) = g, abs'(NaN) = 0, gelu'(+-inf)
    = NaN as torch; elu'(NaN) = NaN, which torch gives in its vectorised loop),
    on the reference and on the kernels (whose comparisons must send NaN down
    the same branch; tests/test_compiled_nan.py checks the GPU's min/max)."""
    _check_special(name, (SPECIAL.copy(),), UNARY_ATTRS[name], kernel_device)


@pytest.mark.parametrize("name", BINARY)
def test_binary_nan_and_infinities_as_torch(kernel_device, name):
    """Every pair of special values (NaN, +-inf, +-0, ...), forward and both
    gradients, as torch: maximum/minimum propagate NaN and give both inputs
    the gradient at NaN; pow follows C ((-1) ** inf = 1, (-inf) ** 0.5 = inf)."""
    a, b = np.meshgrid(SPECIAL, SPECIAL, indexing="ij")
    _check_special(name, (a.ravel().copy(), b.ravel().copy()), {}, kernel_device)


def test_gelu_erf_is_torch_exact_gelu(K, kernel_device):
    """gelu_erf = x Phi(x), torch's gelu(approximate="none") (not the tanh form)."""
    x = np.linspace(-6, 6, 97)
    g = np.cos(x)
    (want_g,), want_y = torch_grad(lambda t: torch.nn.functional.gelu(t, approximate="none"), [x], g)
    np.testing.assert_allclose(R.gelu_erf_forward(x), want_y, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(R.gelu_erf_backward(g, None, x)[0], want_g, rtol=1e-12, atol=1e-14)
    for dtype, rtol in (("float64", 1e-12), ("float32", 2e-6)):
        y = K.gelu_erf_forward(tt(x, kernel_device, dtype))
        (gx,) = K.gelu_erf_backward(tt(g, kernel_device, dtype), y, tt(x, kernel_device, dtype))
        np.testing.assert_allclose(f64(y), want_y, rtol=rtol, atol=rtol * 1e-2)
        np.testing.assert_allclose(f64(gx), want_g, rtol=rtol, atol=rtol * 1e-2)
    assert np.abs(R.gelu_erf_forward(x) - R.gelu_forward(x)).max() > 1e-4   # not the tanh form


# --- pow --------------------------------------------------------------------------------

def test_pow_special_cases(K, kernel_device):
    a = np.array([-2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 3.0, np.nan, 1.0, -0.5])
    b = np.array([2.0, 3.0, 0.5, 2.0, 0.0, -1.0, 0.0, 0.0, np.nan, -3.0])
    with np.errstate(all="ignore"):
        want = np.power(a, b)
    for dtype in ("float32", "float64"):
        got = f64(K.pow_forward(tt(a, kernel_device, dtype), tt(b, kernel_device, dtype)))
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(R.pow_forward(a, b), want, equal_nan=True)
    # gradients where torch defines them (x == 0, negative bases with integer exponents)
    a2 = np.array([-2.0, 0.0, 0.0, 3.0, 2.0])
    b2 = np.array([2.0, 2.0, 0.0, 0.0, -1.5])
    g = np.ones(5)
    (wa, wb), wy = torch_grad(torch.pow, [a2, b2], g)
    ka, kb = K.pow_backward(tt(g, kernel_device), tt(wy, kernel_device), tt(a2, kernel_device),
                            tt(b2, kernel_device))
    ra, rb = R.pow_backward(g, wy, a2, b2)
    np.testing.assert_allclose(f64(ka), wa, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(ra, wa, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(f64(kb), wb, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(rb, wb, rtol=1e-12, equal_nan=True)


def test_pow_float32_is_accurate_for_large_results(K, kernel_device):
    a = np.array([1.5, 10.0, 0.01, 7.3], dtype=np.float32)
    b = np.array([80.0, 30.0, -15.0, 20.5], dtype=np.float32)
    want = np.power(a.astype(np.float64), b.astype(np.float64))
    got = f64(K.pow_forward(tt(a, kernel_device), tt(b, kernel_device)))
    np.testing.assert_allclose(got, want, rtol=2 ** -23)


# --- broadcasting, shapes, layouts -------------------------------------------------------

def test_broadcast_against_zero_sized_dims(K, kernel_device):
    a = np.zeros((0, 3))
    b = np.array([[1.0, 2.0, 3.0]])
    for name in ("add", "mul", "maximum", "div"):
        y = getattr(K, name + "_forward")(tt(a, kernel_device), tt(b, kernel_device))
        assert tuple(y.shape) == (0, 3)
        ga, gb = getattr(K, name + "_backward")(tt(np.zeros((0, 3)), kernel_device), y,
                                                tt(a, kernel_device), tt(b, kernel_device))
        assert tuple(ga.shape) == (0, 3) and tuple(gb.shape) == (1, 3)
        np.testing.assert_array_equal(f64(gb), np.zeros((1, 3)))
        ra, rb = getattr(R, name + "_backward")(np.zeros((0, 3)), None, a, b)
        assert ra.shape == (0, 3) and rb.shape == (1, 3)
    c = np.zeros((2, 0, 1), dtype=bool)
    y = K.where_forward(tt(c, kernel_device), tt(np.ones(4), kernel_device),
                        tt(np.ones((1, 4)), kernel_device))
    assert tuple(y.shape) == (2, 0, 4)
    _, ga, gb = K.where_backward(tt(np.zeros((2, 0, 4)), kernel_device), y, tt(c, kernel_device),
                                 tt(np.ones(4), kernel_device), tt(np.ones((1, 4)), kernel_device))
    np.testing.assert_array_equal(f64(ga), np.zeros(4))
    assert tuple(gb.shape) == (1, 4)


def test_scalars_and_0d(K, kernel_device):
    a = np.array(2.5)
    b = np.array([[1.0], [2.0]])
    y = K.mul_forward(tt(a, kernel_device), tt(b, kernel_device))
    np.testing.assert_array_equal(f64(y), a * b)
    ga, gb = K.mul_backward(tt(np.ones((2, 1)), kernel_device), y, tt(a, kernel_device),
                            tt(b, kernel_device))
    assert tuple(ga.shape) == () and float(f64(ga)) == 3.0
    r = R.exp_forward(np.array(0.0))
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.float64
    assert R.add_backward(np.ones((2, 1)), None, a, b)[0].shape == ()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_high_rank_non_contiguous(K, kernel_device, dtype):
    """6-d permuted and sliced views, broadcast against a 5-d one."""
    rng = np.random.default_rng(3)
    base = rng.uniform(-2, 2, (3, 4, 2, 5, 3, 4))
    a_t = tt(base, kernel_device, dtype).permute(5, 3, 0, 2, 4, 1)[:, ::2, :, :, ::2]
    b_np = rng.uniform(0.5, 2, (1, 4, 2, 1, 3))
    b_t = tt(b_np, kernel_device, dtype).transpose(1, 4)          # (1, 3, 2, 1, 4)
    a = f64(a_t)
    b = f64(b_t)
    assert not a_t.is_contiguous() and not b_t.is_contiguous()
    tol = 2e-6 if dtype == "float32" else 1e-2
    for name, npf in (("add", np.add), ("div", np.divide), ("maximum", np.maximum)):
        y = getattr(K, name + "_forward")(a_t, b_t)
        assert y.is_contiguous() and tuple(y.shape) == np.broadcast_shapes(a.shape, b.shape)
        np.testing.assert_allclose(f64(y), npf(a, b), rtol=tol)
        g = rng.standard_normal(y.shape)
        ga, gb = getattr(K, name + "_backward")(tt(g, kernel_device, dtype), y, a_t, b_t)
        ra, rb = getattr(R, name + "_backward")(f64(tt(g, kernel_device, dtype)), npf(a, b), a, b)
        np.testing.assert_allclose(f64(ga), ra, rtol=tol, atol=tol * np.abs(ra).max())
        np.testing.assert_allclose(f64(gb), rb, rtol=tol, atol=tol * np.abs(rb).max())
    y = K.gelu_forward(a_t)
    np.testing.assert_allclose(f64(y), R.gelu_forward(a), rtol=tol, atol=1e-6)


def test_outputs_are_new_dense_and_inputs_untouched(K, kernel_device):
    x = tt(np.arange(12.0).reshape(3, 4) - 5, kernel_device).t()
    before = x.clone()
    for name in ("exp", "relu", "sigmoid"):
        y = getattr(K, name + "_forward")(x)
        assert y.is_contiguous() and y.data_ptr() != x.data_ptr()
    assert torch.equal(x, before)


# --- errors ---------------------------------------------------------------------------------

def test_errors_are_clear(K, kernel_device):
    a = tt(np.ones((2, 3)), kernel_device)
    with pytest.raises(ShapeError, match="broadcast"):
        K.add_forward(a, tt(np.ones((4,)), kernel_device))
    with pytest.raises(DTypeError, match="different dtypes"):
        K.add_forward(a, tt(np.ones((2, 3), dtype=np.float32), kernel_device))
    with pytest.raises(DTypeError, match="floating"):
        K.div_forward(tt(np.ones(3, dtype=np.int32), kernel_device),
                      tt(np.ones(3, dtype=np.int32), kernel_device))


def test_reference_keeps_low_precision_dtypes():
    for dtype in ("float16", "bfloat16", "float32"):
        d = tfd.as_dtype(dtype)
        x = np.array([[-1.0, 0.5, 2.0]]).astype(d)
        for name in ("exp", "gelu", "softplus", "elu", "relu", "abs", "neg"):
            assert R.__dict__[name + "_forward"](x).dtype == d, (name, dtype)
            assert R.__dict__[name + "_backward"](x, R.__dict__[name + "_forward"](x), x)[0].dtype == d
        for name in ("add", "mul", "div", "pow", "maximum"):
            assert R.__dict__[name + "_forward"](np.abs(x), x.T).dtype == d, (name, dtype)
            ga, gb = R.__dict__[name + "_backward"](np.ones((3, 3), d), None, np.abs(x), x.T)
            assert ga.dtype == d and gb.dtype == d and ga.shape == (1, 3) and gb.shape == (3, 1)


# --- torch only allocates -------------------------------------------------------------------

def test_kernels_use_torch_only_for_memory(K, kernel_device):
    rng = np.random.default_rng(4)
    x = tt(rng.uniform(0.5, 2, (4, 6)), kernel_device, "float16").t()
    b = tt(rng.uniform(0.5, 2, (4,)), kernel_device, "float16")
    c = tt(rng.random((6, 1)) > 0.5, kernel_device)
    g = tt(rng.standard_normal((6, 4)), kernel_device, "float16")

    def work():
        for name in ("exp", "tanh", "gelu", "softplus", "relu"):
            y = getattr(K, name + "_forward")(x)
            getattr(K, name + "_backward")(g, y, x)
        for name in ("add", "sub", "mul", "div", "pow", "maximum"):
            y = getattr(K, name + "_forward")(x, b)
            getattr(K, name + "_backward")(g, y, x, b)
        K.lt_forward(x, b)
        y = K.where_forward(c, x, b)
        K.where_backward(g, y, c, x, b)
        y = K.cast_forward(x, tfd.as_dtype("bfloat16"))
        K.cast_backward(y, y, x, tfd.as_dtype("bfloat16"))

    assert_torch_only_moves_memory(work, "the elementwise kernels")
