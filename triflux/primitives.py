"""Declarations of every primitive (see ``triflux.registry`` for the rules).

Adding a primitive here makes the completeness test demand its five parts and
the property suite cross-check them.
"""
from .registry import register


# --- elementwise: unary ---------------------------------------------------------
for _n in ("neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu",
           "swish", "softplus"):
    register(_n, "elementwise")
register("leakyrelu", "elementwise", doc="attrs: negative_slope")
register("elu", "elementwise", doc="attrs: alpha")
register("cast", "elementwise", doc="attrs: dtype (NumPy dtype of the output)")

# --- elementwise: binary and ternary, NumPy broadcasting --------------------------
for _n in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    register(_n, "elementwise")
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(_n, "elementwise", differentiable=False)
register("where", "elementwise", doc="inputs: cond (bool), a, b")

# --- fills (no tensor inputs; attrs: shape, dtype, device, ...) --------------------
register("fill", "fill", differentiable=False, doc="attrs: shape, value, dtype, device")
register("rand_uniform", "fill", differentiable=False, random=True,
         doc="uniform on [0, 1); attrs: shape, dtype, seed, device")
register("rand_normal", "fill", differentiable=False, random=True,
         doc="standard normal; attrs: shape, dtype, seed, device")

# --- reductions ---------------------------------------------------------------------
for _n in ("sum", "mean", "max"):
    register(_n, "reduce", doc="attrs: axis (tuple of non-negative ints, sorted), keepdims")

# --- matrix products ------------------------------------------------------------------
register("matmul", "matmul", partial_backward=True, doc="NumPy matmul semantics: vector, matrix, batched with broadcasting")

# --- softmax family ---------------------------------------------------------------------
register("softmax", "softmax", doc="attrs: axis")
register("logsoftmax", "softmax", doc="attrs: axis")
register("logsumexp", "softmax", doc="attrs: axis, keepdims")

# --- shape and layout -----------------------------------------------------------------
register("reshape", "shape", doc="attrs: shape")
register("transpose", "shape", doc="attrs: axes (a permutation)")
register("getitem", "shape", doc="attrs: index (tuple of int / slice / None)")
register("concat", "shape", doc="variadic inputs; attrs: axis")
register("broadcast_to", "shape", doc="attrs: shape")
register("contiguous", "shape", doc="a dense row-major copy")

# --- optimiser updates (in place, fused: one kernel per rule) -----------------------------
register("descent_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g; attrs: eta")
register("momentum_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, v; attrs: eta, rho")
register("nesterov_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, v; attrs: eta, rho")
register("adam_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, step")
register("adamw_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, lambd, step")
register("rmsprop_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, s; attrs: eta, rho, epsilon")
