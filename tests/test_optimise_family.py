"""Optimiser updates: several consecutive steps on both sides, agreement
with ``torch.optim`` where the formulas coincide, in-place writes through any
layout, and the errors.

Mapping to ``torch.optim`` (all checked below, x and every state):

* ``descent_update``  = ``SGD(lr=eta)``.
* ``momentum_update`` = ``SGD(lr=eta, momentum=rho)``; Optimisers.jl keeps the
  velocity with the learning rate folded in: ``v = eta * momentum_buffer``.
* ``nesterov_update`` = ``SGD(lr=eta, momentum=rho, nesterov=True)`` with
  ``v = -eta * momentum_buffer`` (Optimisers.jl stores it negated).
* ``adam_update``     = ``Adam(lr=eta, betas=(beta1, beta2), eps=epsilon)``:
  ``m = exp_avg``, ``v = exp_avg_sq``.
* ``adamw_update``    = ``AdamW(..., weight_decay=lambd)`` (Optimisers.jl
  v0.4 couples the decay with the learning rate exactly as torch does; only
  the defaults differ: lambda 0 there, 0.01 in torch).
* ``rmsprop_update``  = ``RMSprop(lr=eta, alpha=rho, eps=epsilon)``:
  ``s = square_avg``.

These hold for a constant learning rate (torch's buffers do not contain it).
"""
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import tolerances
from triflux import dtypes as tfd
from triflux import testing
from triflux.errors import DTypeError, ShapeError
from triflux.primitives import REGISTRY
from triflux.reference import optimise as ref
from triflux.testing import optimise as strategies

pytestmark = pytest.mark.requires_kernels

RULES = {
    # name: (number of states, hyperparameters)
    "descent_update": (0, dict(eta=0.1)),
    "momentum_update": (1, dict(eta=0.05, rho=0.9)),
    "nesterov_update": (1, dict(eta=0.05, rho=0.9)),
    "adam_update": (2, dict(eta=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)),
    "adamw_update": (2, dict(eta=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8, lambd=0.05)),
    "rmsprop_update": (1, dict(eta=0.01, rho=0.9, epsilon=1e-8)),
}
STEPS = 5
SHAPE = (5, 7)


@pytest.fixture(scope="module")
def K():
    from triflux.triton_kernels import optimise
    return optimise


def N(t):
    from triflux.testing import to_numpy
    return to_numpy(t)


def _gradients(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE) for _ in range(STEPS)]


def _attrs(name, step):
    n_states, hyper = RULES[name]
    attrs = dict(hyper)
    if name.startswith("adam"):
        attrs["step"] = step
    return attrs


def _run_reference(name, dtype=np.float64):
    n_states, _ = RULES[name]
    x = np.linspace(-1, 1, np.prod(SHAPE)).reshape(SHAPE).astype(dtype)
    states = [np.zeros(SHAPE, dtype) for _ in range(n_states)]
    update = getattr(ref, f"{name}_forward")
    for t, g in enumerate(_gradients(), start=1):
        assert update(x, g.astype(dtype), *states, **_attrs(name, t)) is None
    return x, states


# --- several steps on both sides -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("tdtype, tol", [("float64", 1e-12), ("float32", 1e-5), ("float16", 2e-2)])
def test_consecutive_steps_match(K, kernel_device, name, tdtype, tol):
    import torch
    dt = getattr(torch, tdtype)
    n_states, _ = RULES[name]
    x_ref, states_ref = _run_reference(name)
    # kernel side: x a transposed view, states strided views (all updated in place)
    x0 = np.linspace(-1, 1, np.prod(SHAPE)).reshape(SHAPE)
    x = torch.from_numpy(x0.T.copy()).to(kernel_device).to(dt).t()
    bufs = [torch.zeros(SHAPE[0], 2 * SHAPE[1], dtype=dt, device=kernel_device) for _ in range(n_states)]
    states = [b[:, ::2] for b in bufs]
    update = getattr(K, f"{name}_forward")
    for t, g in enumerate(_gradients(), start=1):
        gt = torch.from_numpy(g).to(kernel_device).to(dt)
        assert update(x, gt, *states, **_attrs(name, t)) is None
    np.testing.assert_allclose(N(x).astype(np.float64), x_ref, rtol=tol, atol=tol)
    for s, s_ref, b in zip(states, states_ref, bufs):
        np.testing.assert_allclose(N(s).astype(np.float64), s_ref, rtol=tol, atol=tol)
        assert (N(b[:, 1::2]) == 0).all()  # the gaps between strided elements are untouched


@pytest.mark.parametrize("name", sorted(RULES))
def test_reference_float32_close_to_float64(name):
    x64, s64 = _run_reference(name, np.float64)
    x32, s32 = _run_reference(name, np.float32)
    assert x32.dtype == np.float32 and all(s.dtype == np.float32 for s in s32)
    np.testing.assert_allclose(x32, x64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(RULES))
def test_oracle_matches_reference(name):
    import torch

    from triflux.testing import optimise as oracles
    n_states, _ = RULES[name]
    rng = np.random.default_rng(3)
    x, g = rng.standard_normal(SHAPE), rng.standard_normal(SHAPE)
    states = [rng.uniform(0.1, 1.0, SHAPE) for _ in range(n_states)]
    attrs = _attrs(name, 3)
    tensors = [torch.from_numpy(a.copy()) for a in (x, g, *states)]
    new = getattr(oracles, f"{name}_torch")(*tensors, **attrs)
    for t, a in zip(tensors, (x, g, *states)):
        np.testing.assert_array_equal(t.numpy(), a)  # the oracle mutates nothing
    getattr(ref, f"{name}_forward")(x, g, *states, **attrs)
    assert len(new) == 1 + n_states == len(REGISTRY[name].mutates)
    for t, a in zip(new, (x, *states)):
        np.testing.assert_allclose(t.numpy(), a, rtol=1e-13, atol=1e-13)


# --- torch.optim ---------------------------------------------------------------------------------

def _torch_optimizer(name, p):
    import torch
    h = RULES[name][1]
    if name == "descent_update":
        return torch.optim.SGD([p], lr=h["eta"])
    if name in ("momentum_update", "nesterov_update"):
        return torch.optim.SGD([p], lr=h["eta"], momentum=h["rho"], nesterov=name == "nesterov_update")
    if name == "adam_update":
        return torch.optim.Adam([p], lr=h["eta"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"])
    if name == "adamw_update":
        return torch.optim.AdamW([p], lr=h["eta"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"],
                                 weight_decay=h["lambd"])
    return torch.optim.RMSprop([p], lr=h["eta"], alpha=h["rho"], eps=h["epsilon"])


def _torch_states(name, state):
    eta = RULES[name][1]["eta"]
    if name == "momentum_update":
        return [eta * state["momentum_buffer"]]
    if name == "nesterov_update":
        return [-eta * state["momentum_buffer"]]
    if name.startswith("adam"):
        return [state["exp_avg"], state["exp_avg_sq"]]
    if name == "rmsprop_update":
        return [state["square_avg"]]
    return []


@pytest.mark.parametrize("name", sorted(RULES))
def test_matches_torch_optim(K, kernel_device, name):
    import torch
    x_ref, states_ref = _run_reference(name)
    p = torch.nn.Parameter(torch.linspace(-1, 1, int(np.prod(SHAPE)), dtype=torch.float64).reshape(SHAPE))
    opt = _torch_optimizer(name, p)
    for g in _gradients():
        p.grad = torch.from_numpy(g)
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), x_ref, rtol=1e-12, atol=1e-12)
    for s, s_ref in zip(_torch_states(name, opt.state[p]), states_ref):
        np.testing.assert_allclose(s.detach().numpy(), s_ref, rtol=1e-12, atol=1e-12)


# --- edge cases ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["adam_update", "adamw_update", "rmsprop_update"])
@pytest.mark.parametrize("tdtype", ["float16", "bfloat16", "float32"])
def test_zero_gradient_and_state_no_nan(K, kernel_device, name, tdtype):
    """epsilon = 1e-8 underflows in float16; computing in float32 keeps
    0 / (0 + epsilon) = 0 rather than 0/0."""
    import torch
    dt = getattr(torch, tdtype)
    n_states, _ = RULES[name]
    x = torch.ones(SHAPE, dtype=dt, device=kernel_device)
    g = torch.zeros(SHAPE, dtype=dt, device=kernel_device)
    states = [torch.zeros(SHAPE, dtype=dt, device=kernel_device) for _ in range(n_states)]
    getattr(K, f"{name}_forward")(x, g, *states, **_attrs(name, 1))
    expected = 1.0 - (0.01 * 0.05 if name == "adamw_update" else 0.0)
    np.testing.assert_allclose(N(x).astype(np.float64), expected, rtol=1e-2)
    xr, gr = np.ones(SHAPE, np.float16), np.zeros(SHAPE, np.float16)
    sr = [np.zeros(SHAPE, np.float16) for _ in range(n_states)]
    getattr(ref, f"{name}_forward")(xr, gr, *sr, **_attrs(name, 1))
    assert np.isfinite(xr).all() and xr.dtype == np.float16


@pytest.mark.parametrize("name", sorted(RULES))
def test_nan_and_infinite_gradients_as_torch(K, kernel_device, name):
    """A diverged step (NaN, +inf, -inf in the gradient and the parameter):
    parameters and states become NaN/+-inf exactly where torch's oracle puts
    them, on the reference and the kernel (float32 and float64)."""
    import torch

    from triflux.testing import optimise as oracles
    n_states, _ = RULES[name]
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal(SHAPE), rng.standard_normal(SHAPE)
    g[0, :3] = [np.nan, np.inf, -np.inf]
    x[1, :3] = [np.nan, np.inf, -np.inf]
    states = [rng.uniform(0.1, 1.0, SHAPE) for _ in range(n_states)]
    attrs = _attrs(name, 3)
    want = getattr(oracles, f"{name}_torch")(*[torch.from_numpy(a.copy()) for a in (x, g, *states)], **attrs)
    want = [w.numpy() for w in want]
    assert not all(np.isfinite(w).all() for w in want)
    ref_args = [a.copy() for a in (x, g, *states)]
    getattr(ref, f"{name}_forward")(*ref_args, **attrs)
    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        args = [torch.from_numpy(a.copy()).to(getattr(torch, dtype)).to(kernel_device) for a in (x, g, *states)]
        getattr(K, f"{name}_forward")(*args, **attrs)
        for i, w in zip(REGISTRY[name].mutates, want):
            np.testing.assert_allclose(ref_args[i], w, rtol=1e-12, atol=1e-12, equal_nan=True)
            np.testing.assert_allclose(N(args[i]).astype(np.float64), w, rtol=tol, atol=tol, equal_nan=True)


def test_empty_and_scalar_parameters(K, kernel_device):
    import torch
    e = torch.zeros(0, 3, device=kernel_device)
    K.adam_update_forward(e, e, e, e, **_attrs("adam_update", 1))
    s = torch.tensor(2.0, device=kernel_device)
    K.descent_update_forward(s, torch.tensor(1.0, device=kernel_device), eta=0.5)
    assert N(s).item() == 1.5
    sr = np.array(2.0)
    ref.descent_update_forward(sr, np.array(1.0), eta=0.5)
    assert sr.item() == 1.5


def test_errors(K, kernel_device):
    import torch
    x = torch.zeros(3, 4, device=kernel_device)
    with pytest.raises(ShapeError):
        K.momentum_update_forward(x, torch.zeros(3, 4, device=kernel_device), torch.zeros(4, 3, device=kernel_device),
                                  eta=0.1, rho=0.9)
    with pytest.raises(DTypeError):
        K.descent_update_forward(x, torch.zeros(3, 4, dtype=torch.float64, device=kernel_device), eta=0.1)
    with pytest.raises(DTypeError):
        K.descent_update_forward(torch.zeros(3, dtype=torch.int32, device=kernel_device),
                                 torch.zeros(3, dtype=torch.int32, device=kernel_device), eta=0.1)
    with pytest.raises(ShapeError):  # a broadcast parameter cannot be written in place
        K.descent_update_forward(torch.zeros(1, 4, device=kernel_device).expand(3, 4),
                                 torch.zeros(3, 4, device=kernel_device), eta=0.1)
    for step in (0, -1, 1.5):
        for fn, z in ((K.adam_update_forward, x), (ref.adam_update_forward, np.zeros((3, 4), np.float32))):
            with pytest.raises(ValueError):
                fn(z, z, z, z, eta=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8, step=step)


# --- the list form: all parameters of a dtype in one launch ---------------------------------------

UPDATES = [p for p in REGISTRY.values() if p.family == "optimise"]


def _foreach(side, name):
    return REGISTRY[name].reference("foreach") if side == "reference" else REGISTRY[name].kernel("foreach")


def test_every_update_has_a_list_form():
    assert {p.name for p in UPDATES} == set(RULES) == set(strategies.RULES)
    for p in UPDATES:
        assert callable(p.reference("foreach")) and callable(p.kernel("foreach")), p.name


def _as_torch(a, layout, device):
    a = np.asarray(a)
    if a.ndim == 0:
        return testing.to_torch_layout(a.reshape(1), "contiguous", device).reshape(())
    return testing.to_torch_layout(a, layout, device)


def _as_numpy(a, layout):
    a = np.asarray(a)
    return a.copy() if a.ndim == 0 else testing.to_numpy_layout(a, layout)


def _outside_view(t):
    """The bytes of ``t``'s storage that the view ``t`` does not cover."""
    import torch
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    covered = torch.zeros(raw.numel() // t.element_size(), dtype=torch.bool)
    if t.numel():
        covered.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
    return raw.cpu().numpy()[~covered.repeat_interleave(t.element_size()).numpy()].copy()


def _rounded(case, dtype, flush):
    """The case's lists rounded to ``dtype`` (subnormals flushed with ``flush``)."""
    d = tfd.as_dtype(dtype)

    def rnd(a):
        a = testing.round_to(np.asarray(a), d)
        return tolerances.flush_subnormals(a, d) if flush else a
    return [[rnd(a) for a in role] for role in case.inputs]


#: every rule in float32, and Adam's kernel (the most arguments) in every dtype; each dtype
#: of each rule goes through the same launches one parameter at a time in tests/test_primitives.py
FOREACH_CASES = ([(p.name, "float32") for p in UPDATES]
                 + [("adam_update", d) for d in REGISTRY["adam_update"].dtypes if d != "float32"])


def _same_values(a, b):
    """Bit for bit, except that a NaN matches a NaN of either sign: the
    reference updates small parameters as one array, and NumPy gives the NaN of
    an invalid operation (inf - inf) either sign depending on the loop that
    meets it (one element alone, or inside a longer array)."""
    if a.tobytes() == b.tobytes():
        return True
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and a[~nan].tobytes() == b[~nan].tobytes())


@pytest.mark.parametrize("name,dtype", FOREACH_CASES)
@given(data=st.data())
def test_foreach_kernel_matches_reference_and_one_at_a_time(K, kernel_device, name, dtype, data):
    """A list of parameters of different shapes (0-d, size 1, empty) and
    layouts in one call: the kernel agrees with the float64 reference to the
    dtype's tolerance and is bit for bit what it gives each parameter alone;
    the bytes of every buffer outside its view stay as they were; the
    reference on the list is the reference on each parameter, bit for bit
    (NaNs as NaNs, :func:`_same_values`)."""
    case = data.draw(strategies.foreach_cases(name, dtype), label="case")
    shapes = [np.shape(x) for x in case.inputs[0]]
    what = f"{name}_foreach [{dtype}] shapes {shapes} layouts {case.layouts} attrs {case.attrs}"
    note(what)
    flush = K.launch.INTERPRET and dtype in tolerances.INTERPRETER_FLUSH_SUBNORMALS
    rounded = _rounded(case, dtype, flush)
    mutated = REGISTRY[name].mutates

    expected = [[_as_numpy(a, lay).astype(np.float64) for a, lay in zip(r, ls)]
                for r, ls in zip(rounded, case.layouts)]
    _foreach("reference", name)(*expected, **case.attrs)

    in_dtype = [[_as_numpy(a, lay) for a, lay in zip(r, ls)] for r, ls in zip(rounded, case.layouts)]
    one_by_one = [[a.copy() for a in role] for role in in_dtype]
    _foreach("reference", name)(*in_dtype, **case.attrs)
    update = getattr(ref, f"{name}_forward")
    for arrays in zip(*one_by_one):
        update(*arrays, **case.attrs)
    for role in mutated:
        for a, b in zip(in_dtype[role], one_by_one[role]):
            assert _same_values(a, b), f"{what}: the reference on the list differs from one at a time"

    tensors = [[_as_torch(a, lay, kernel_device) for a, lay in zip(r, ls)]
               for r, ls in zip(rounded, case.layouts)]
    alone = [[t.clone() for t in role] for role in tensors]
    outside = [[_outside_view(t) for t in role] for role in tensors]
    assert _foreach("kernel", name)(*tensors, **case.attrs) is None
    for arrays in zip(*alone):
        getattr(K, f"{name}_forward")(*arrays, **case.attrs)
    torch_in_dtype = None
    if tolerances.TOLERANCES[tolerances.dtype_name(dtype)].ratio:
        cpu = [[_as_torch(a, "contiguous", "cpu") for a in role] for role in rounded]
        torch_in_dtype = [[testing.to_numpy(t) for t in new]
                          for new in strategies.foreach_oracle(name, *cpu, **case.attrs)]
    for role in range(len(tensors)):
        for i, t in enumerate(tensors[role]):
            where = f"{what}: parameter {i} ({shapes[i]}, {case.layouts[role][i]}), input {role}"
            got = testing.to_numpy(t)
            assert np.array_equal(_outside_view(t), outside[role][i]), f"{where}: bytes outside the view changed"
            if role not in mutated:
                assert got.tobytes() == rounded[role][i].tobytes(), f"{where}: changed, not mutated"
                continue
            assert got.tobytes() == testing.to_numpy(alone[role][i]).tobytes(), \
                f"{where}: the list's result differs from the parameter's alone"
            ratio = None if torch_in_dtype is None else torch_in_dtype[i][mutated.index(role)]
            tolerances.assert_close(got, expected[role][i], dtype, what=f"{where}, kernel vs reference",
                                    ratio_reference=ratio, flush=flush)


@pytest.mark.parametrize("name", [p.name for p in UPDATES])
@given(data=st.data())
def test_foreach_reference_matches_torch_float64(name, data):
    import torch
    case = data.draw(strategies.foreach_cases(name, "float64"), label="case")
    arrays = [[np.array(a, dtype=np.float64) for a in role] for role in case.inputs]
    want = strategies.foreach_oracle(name, *[[torch.from_numpy(a.copy()) for a in role] for role in arrays],
                                     **case.attrs)
    _foreach("reference", name)(*arrays, **case.attrs)
    for i, new in enumerate(want):
        for role, w in zip(REGISTRY[name].mutates, new):
            tolerances.assert_close(arrays[role][i], w.numpy(), "float64", rtol=tolerances.TORCH_F64_RTOL,
                                    what=f"{name}_foreach parameter {i}, input {role}, reference vs torch")


def _mixed(kernel_device):
    """Adam's lists for parameters of three dtypes, interleaved."""
    import torch
    rng = np.random.default_rng(5)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.float32, torch.float64, torch.float16,
              torch.float32, torch.float32]
    shapes = [(3, 4), (5,), (2, 2, 2), (), (0, 3), (7,), (33, 4), (40,)]
    roles = [[torch.from_numpy(rng.uniform(0.1, 1.0, s)).to(dt).to(kernel_device)
              for s, dt in zip(shapes, dtypes)] for _ in range(4)]
    return roles, dict(eta=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8, step=2)


def test_foreach_launches_once_per_dtype_tables_first(K, kernel_device, monkeypatch):
    """Mixed dtypes in one call: three launches, each parameter as it is
    alone, and every table allocated before the first launch (so running out
    of memory there changes nothing). Blocks of 16 elements: parameters of
    one to nine programs, each finding its own."""
    monkeypatch.setattr(K, "_block_size", lambda counts: 16)
    roles, hyper = _mixed(kernel_device)
    alone = [[t.clone() for t in role] for role in roles]
    for arrays in zip(*alone):
        K.adam_update_forward(*arrays, **hyper)
    events = []
    real_empty, real_launch = K.launch.empty, K.launch.launch
    monkeypatch.setattr(K.launch, "empty", lambda *a: events.append("allocate") or real_empty(*a))
    monkeypatch.setattr(K.launch, "launch",
                        lambda kernel, *a, **m: events.append(m["DTYPE"]) or real_launch(kernel, *a, **m))
    K.adam_update_foreach(*roles, **hyper)
    assert events[0] == "allocate" and "allocate" not in events[1:] and len(events) == 4
    assert len(set(events[1:])) == 3
    for role, role_alone in zip(roles, alone):
        for t, a in zip(role, role_alone):
            assert N(t).tobytes() == N(a).tobytes()


def test_foreach_out_of_memory_changes_nothing(K, kernel_device, monkeypatch):
    from triflux.errors import OutOfMemoryError
    roles, hyper = _mixed(kernel_device)
    before = [[N(t).tobytes() for t in role] for role in roles]

    def no_memory(*a):
        raise OutOfMemoryError("no memory for the table")
    monkeypatch.setattr(K.launch, "empty", no_memory)
    with pytest.raises(OutOfMemoryError):
        K.adam_update_foreach(*roles, **hyper)
    assert [[N(t).tobytes() for t in role] for role in roles] == before


def test_foreach_errors(K, kernel_device):
    import torch
    x = [torch.zeros(3, device=kernel_device), torch.zeros(2, device=kernel_device)]
    for fn in (K.momentum_update_foreach, ref.momentum_update_foreach):
        z = x if fn is K.momentum_update_foreach else [np.zeros(3, np.float32), np.zeros(2, np.float32)]
        with pytest.raises(ValueError, match="differ in length"):
            fn(z, z, z[:1], eta=0.1, rho=0.9)
    with pytest.raises(ShapeError):      # the second parameter's gradient has the wrong shape
        K.descent_update_foreach(x, [x[0], x[0]], eta=0.1)
    K.descent_update_foreach([], [], eta=0.1)
    ref.descent_update_foreach([], [], eta=0.1)
    for fn in (K.adam_update_foreach, ref.adam_update_foreach):
        with pytest.raises(ValueError):
            fn([], [], [], [], eta=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8, step=0)


# --- torch only allocates and makes views --------------------------------------------------------

from torch_ops import assert_torch_only_moves_memory  # noqa: E402


def test_torch_only_allocates(K, kernel_device):
    import torch
    ts = [torch.ones(4, 6, device=kernel_device).t() for _ in range(4)]  # set-up

    def work():
        for name, (n_states, _) in RULES.items():
            getattr(K, f"{name}_forward")(*ts[:2 + n_states], **_attrs(name, 2))
            getattr(K, f"{name}_foreach")(*[[t, t[:, 1:]] for t in ts[:2 + n_states]], **_attrs(name, 2))

    assert_torch_only_moves_memory(work, "these kernels")
