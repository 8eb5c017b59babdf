"""``set_autotune(True)``: on a real GPU the matmul and conv gather kernels
go through ``triton.autotune`` over their tile table for the dot kind, the
model's pick first, keyed on the sizes; off (the default) and in the
interpreter they take the model's tile. No GPU here: the launch is recorded
with the kernels not run, the host told it is on a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from triton.runtime.autotuner import Autotuner  # noqa: E402

import triflux as tf  # noqa: E402
from triflux.triton_kernels import conv, launch, matmul, tuning  # noqa: E402


@pytest.fixture
def on_a_gpu(monkeypatch):
    """Launches recorded, not run, with the host told it is on a GPU; autotuning restored after."""
    launches = []

    def record(kernel, grid, *args, **meta):
        pending = None
        if isinstance(kernel, Autotuner):
            tuned = next(t for t in (matmul._tuned_matmul(), conv._tuned_gather()) if t.autotuner is kernel)
            pending = tuned.pending
        launches.append((kernel, grid, args, meta, pending))
    monkeypatch.setattr(launch, "launch", record)
    monkeypatch.setattr(launch, "INTERPRET", False)
    before = tf.get_autotune()
    yield launches
    tf.set_autotune(before)


def test_matmul_tunes_over_its_table_with_the_models_pick_first(on_a_gpu):
    a, b = torch.ones(300, 70), torch.ones(70, 200)
    tf.set_autotune(False)
    matmul.matrix_product(a, b)
    tf.set_autotune(True)
    matmul.matrix_product(a, b)
    (plain, _, _, meta, _), (kernel, grid, args, tuned_meta, pending) = on_a_gpu
    tiles = matmul._GPU_TILES[None]
    pick = matmul.best_tile(tiles, lambda blocks: launch.cdiv(300, blocks[0]) * launch.cdiv(200, blocks[1]),
                            launch.sm_count(None))
    assert plain is matmul._matmul_kernel and meta["BLOCK_SIZE_M"] == pick[0][0] and meta["num_warps"] == pick[1]
    assert isinstance(kernel, Autotuner) and kernel.keys == ["M", "N", "K", "batch_size", "DOT"]
    assert not set(matmul.TUNED_NAMES + ("num_warps", "num_stages")) & set(tuned_meta)
    assert [(tuple(c.kwargs.values()), c.num_warps, c.num_stages) for c in pending] == \
        [t[:3] for t in tuning.ranked(tiles, pick)], "the float32 table, the model's pick first"
    assert len(pending) == len(tiles) > 1
    assert grid({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32}) == (10 * 7,)
    assert grid({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}) == (5 * 4,)
    # the prune hook hands Triton's autotuner exactly this launch's candidates
    tuned = matmul._tuned_matmul()
    tuned.pending = pending
    kernel.nargs = {}
    assert kernel.prune_configs({}) == pending
    assert len(kernel.configs) > 1                # else Triton's autotuner never tunes


def test_conv_gather_tunes_with_the_models_pick_first(on_a_gpu):
    tf.set_autotune(True)
    x, w = torch.ones(2, 8, 16, 16, dtype=torch.bfloat16), torch.ones(16, 8, 3, 3, dtype=torch.bfloat16)
    spec = conv.conv_spec(tuple(x.shape), tuple(w.shape), x.dtype, w.dtype, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    y = torch.empty(2, 16, 16, 16, dtype=torch.bfloat16)
    conv._gather_conv(x, w, y, spec, 8, 16, (0, w.stride(0), w.stride(1)), False)
    ((kernel, grid, args, meta, pending),) = on_a_gpu
    assert isinstance(kernel, Autotuner) and "BLOCK_SIZE_PIXELS" not in meta
    tiles = conv._GATHER_TILES[conv.DOT_NATIVE.value]
    pick = conv._gather_gpu_tile(conv.DOT_NATIVE.value, 2 * 16 * 16, 16, 1, conv._target_programs(x.device))
    assert [(tuple(c.kwargs.values()), c.num_warps, c.num_stages) for c in pending] == tuning.ranked(tiles, pick)
    assert grid({"BLOCK_SIZE_PIXELS": 64, "BLOCK_SIZE_CHANNELS": 32}) == (8, 1, 1)


def test_the_interpreter_never_tunes(monkeypatch):
    tf.set_autotune(True)
    try:
        dev = tf.CUDADevice(0)
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose((dev(a) @ dev(a.T)).numpy(), a @ a.T)
    finally:
        tf.set_autotune(False)


def test_set_autotune_takes_a_bool():
    with pytest.raises(TypeError, match="True or False"):
        tf.set_autotune("yes")
    assert tf.get_autotune() is False
