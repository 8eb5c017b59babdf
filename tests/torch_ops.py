"""Recording what torch does: on the Triton path torch may allocate memory,
describe views and copy bytes, and nothing else (DESIGN.md)."""

#: aten ops that allocate, describe a view, or copy bytes (the Triton
#: interpreter itself uses new_empty/set_/copy_ to stage kernel arguments)
MEMORY_OPS = {
    "empty.memory_format", "empty_strided.default", "new_empty.default", "new_empty_strided.default",
    "copy_.default", "_to_copy.default", "set_.source_Storage", "set_.source_Storage_storage_offset",
    "view.default", "_unsafe_view.default", "as_strided.default", "permute.default", "transpose.int",
    "t.default", "expand.default", "slice.Tensor", "select.int", "unsqueeze.default", "squeeze.dim",
    "squeeze.default", "alias.default", "detach.default", "_reshape_alias.default", "lift_fresh.default",
    "_local_scalar_dense.default", "unbind.int", "split.Tensor", "narrow.default",
}


def record_torch_ops(fn):
    """The aten ops (``name.overload``) torch dispatched while ``fn()`` ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(f"{func.overloadpacket.__name__}.{func._overloadname}")
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        fn()
    return rec.ops


def assert_torch_only_moves_memory(fn, what):
    """Run ``fn()`` and fail, naming the ops, if torch computed anything."""
    ops = record_torch_ops(fn)
    computed = sorted(ops - MEMORY_OPS)
    assert not computed, f"torch computed in {what}: {computed}"
    return ops
