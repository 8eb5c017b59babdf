"""On the Triton path torch may allocate memory, make views and copy, and
nothing else: a full training step runs under torch's dispatch hooks and
fails if torch computed anything."""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise

pytestmark = pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")

#: aten ops that only allocate, describe a view, or copy bytes (the Triton
#: interpreter itself uses new_empty/set_/copy_ to stage arguments)
ALLOWED = {
    "empty.memory_format", "empty_strided.default", "new_empty.default", "new_empty_strided.default",
    "copy_.default", "_to_copy.default", "set_.source_Storage", "set_.source_Storage_storage_offset",
    "view.default", "_unsafe_view.default", "as_strided.default", "permute.default", "transpose.int",
    "t.default", "expand.default", "slice.Tensor", "select.int", "unsqueeze.default", "squeeze.dim",
    "squeeze.default", "alias.default", "detach.default", "_reshape_alias.default", "lift_fresh.default",
    "_local_scalar_dense.default", "unbind.int", "split.Tensor", "narrow.default",
}


def test_training_step_uses_torch_only_for_memory():
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(f"{func.overloadpacket.__name__}.{func._overloadname}")
            return func(*args, **(kwargs or {}))

    dev = tf.CUDADevice(0)
    rng = np.random.default_rng(0)
    model = dev(tf.Chain(tf.Dense(6, 8, tf.relu), tf.Dense(8, 8, tf.gelu), tf.Dense(8, 3)))
    x = dev(rng.standard_normal((5, 6)).astype(np.float32))
    y = dev(losses.onehotbatch(rng.integers(0, 3, 5), range(3)))
    opt = optimise.setup(optimise.Adam(1e-2), model)
    with Record() as rec:
        loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y) + losses.mse(tf.softmax(m(x)), y), model)
        optimise.update(opt, model, g)
        extra = (x[:, ::-1].sum(axis=0) / 2).max() + tf.concat([x, x], axis=1).mean()
        float(loss), float(extra)
    computed = sorted(rec.ops - ALLOWED)
    assert not computed, f"torch computed on the Triton path: {computed}"
    assert rec.ops & {"empty.memory_format", "empty_strided.default"}, "no device memory was allocated?"
