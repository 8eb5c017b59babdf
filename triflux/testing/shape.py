"""Strategies and torch oracles for the shape family."""
import math

from hypothesis import strategies as st

from triflux.specs.shape import normalise_index

from . import Case, floats, layouts_for, shapes


#: at most this many elements per drawn array (the interpreter runs them all)
MAX_SIZE = 4096


def _small(shape_strategy):
    return shape_strategy.filter(lambda s: math.prod(s) <= MAX_SIZE)


def _x_and_layout(min_dims=0, max_dims=4, max_side=9, min_side=0):
    shape = _small(shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side))
    return shape.flatmap(lambda s: st.tuples(floats(s, extreme=True), layouts_for(1)))


# --- reshape ---------------------------------------------------------------------------------

def _prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def _reshape_case(draw):
    x, layouts = draw(_x_and_layout())
    size = x.size
    if size == 0:
        # any shape holding a 0 side; no -1 (it would be ambiguous)
        k = draw(st.integers(1, 4))
        target = list(draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)))
        target[draw(st.integers(0, k - 1))] = 0
        return Case((x,), dict(shape=tuple(target)), layouts)
    # spread the prime factors of the size over a random number of sides
    k = draw(st.integers(0 if size == 1 else 1, 4))
    target = [1] * k
    for p in _prime_factors(size):
        target[draw(st.integers(0, k - 1))] *= p
    if k and draw(st.booleans()):
        target[draw(st.integers(0, k - 1))] = -1
    return Case((x,), dict(shape=tuple(target)), layouts)


def reshape_strategy(dtype):
    return _reshape_case()


def reshape_torch(x, *, shape):
    return x.reshape(shape)


# --- transpose -------------------------------------------------------------------------------

@st.composite
def _transpose_case(draw):
    x, layouts = draw(_x_and_layout())
    axes = tuple(draw(st.permutations(range(x.ndim))))
    return Case((x,), dict(axes=axes), layouts)


def transpose_strategy(dtype):
    return _transpose_case()


def transpose_torch(x, *, axes):
    return x.permute(axes)


# --- getitem ---------------------------------------------------------------------------------

@st.composite
def _slice(draw, side):
    bound = st.one_of(st.none(), st.integers(-side - 3, side + 3))
    step = draw(st.one_of(st.none(), st.sampled_from([1, 1, 2, 3, -1, -1, -2, -3])))
    return slice(draw(bound), draw(bound), step)


@st.composite
def _getitem_case(draw):
    x, layouts = draw(_x_and_layout(min_dims=1))
    items = []
    n_used = draw(st.integers(0, x.ndim))  # trailing axes left implicit
    for side in x.shape[:n_used]:
        if side > 0 and draw(st.integers(0, 3)) == 0:
            items.append(draw(st.integers(-side, side - 1)))
        else:
            items.append(draw(_slice(side)))
    if draw(st.booleans()):
        # an Ellipsis standing for a run of whole axes (possibly none); items after
        # it index the trailing axes, so first spell out every axis
        items += [slice(None)] * (x.ndim - n_used)
        a = draw(st.integers(0, len(items)))
        b = draw(st.integers(a, len(items)))
        items[a:b] = [Ellipsis]
    for _ in range(draw(st.integers(0, 2))):  # np.newaxis anywhere
        items.insert(draw(st.integers(0, len(items))), None)
    index = tuple(items)
    if len(index) == 1 and draw(st.booleans()):
        index = index[0]  # a bare item, as in x[3]
    return Case((x,), dict(index=index), layouts)


def getitem_strategy(dtype):
    return _getitem_case()


def getitem_torch(x, *, index):
    """``x[index]`` built one axis at a time from differentiable torch ops
    (torch has no negative steps, so those become ``index_select``)."""
    import torch
    t, axis = x, 0
    for item in normalise_index(index, tuple(x.shape)):
        if item[0] == "new":
            t = t.unsqueeze(axis)
            axis += 1
        elif item[0] == "int":
            t = t.select(axis, item[1])
        else:
            _, start, step, length = item
            positions = torch.tensor([start + k * step for k in range(length)], dtype=torch.long,
                                     device=t.device)
            t = t.index_select(axis, positions)
            axis += 1
    return t


# --- concat ----------------------------------------------------------------------------------

@st.composite
def _concat_case(draw):
    base = list(draw(_small(shapes(min_dims=1, max_dims=4, max_side=7))))
    axis = draw(st.integers(0, len(base) - 1))
    k = draw(st.integers(1, 4))
    xs = []
    for _ in range(k):
        s = list(base)
        s[axis] = draw(st.sampled_from([0, 1, 2, 3, 5, 7]))
        xs.append(draw(floats(tuple(s), extreme=True)))
    if draw(st.booleans()):
        axis -= len(base)  # negative axes count from the end
    return Case(tuple(xs), dict(axis=axis), draw(layouts_for(k)))


def concat_strategy(dtype):
    return _concat_case()


def concat_torch(*xs, axis):
    import torch
    return torch.cat(xs, dim=axis)


# --- broadcast_to ----------------------------------------------------------------------------

@st.composite
def _broadcast_to_case(draw):
    x, layouts = draw(_x_and_layout(max_dims=3, max_side=7))
    target = [draw(st.sampled_from([0, 1, 2, 3, 5])) if s == 1 and draw(st.booleans()) else s
              for s in x.shape]
    lead = draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4 - x.ndim))
    target = tuple(lead) + tuple(target)
    if math.prod(target) > MAX_SIZE:
        target = x.shape
    return Case((x,), dict(shape=target), layouts)


#: over a thousand copies of each element, spread over one or two axes: the
#: gradient sums that many terms, which a 16-bit accumulator visibly loses
_LONG_COPIES = ((1031,), (1301,), (29, 37))     # times 3 elements: within MAX_SIZE


@st.composite
def _long_broadcast_to_case(draw):
    """A few elements broadcast to over a thousand copies each, along new
    leading axes or along stretched axes of side 1 (first or last)."""
    k = draw(st.sampled_from([1, 2, 3]))
    copies = draw(st.sampled_from(_LONG_COPIES))
    where = draw(st.sampled_from(["leading", "stretched first", "stretched last"]))
    if where == "leading":
        shape, target = (k,), copies + (k,)
    elif where == "stretched first":
        shape, target = (1,) * len(copies) + (k,), copies + (k,)
    else:
        shape, target = (k,) + (1,) * len(copies), (k,) + copies
    return Case((draw(floats(shape, extreme=True)),), dict(shape=target), draw(layouts_for(1)),
                note=f"{where}: {shape} -> {target}")


def broadcast_to_strategy(dtype):
    return st.one_of(_broadcast_to_case(), _long_broadcast_to_case())


def broadcast_to_torch(x, *, shape):
    return x.expand(shape)


# --- contiguous ------------------------------------------------------------------------------

@st.composite
def _contiguous_case(draw):
    x, layouts = draw(_x_and_layout())
    return Case((x,), {}, layouts)


def contiguous_strategy(dtype):
    return _contiguous_case()


def contiguous_torch(x):
    return x.contiguous()
