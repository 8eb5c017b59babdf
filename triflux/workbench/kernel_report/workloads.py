"""The workloads the kernel report records: one training step each, built on
the CUDA device (the Triton interpreter's while recording) in float32 or
bfloat16. :data:`WORKLOADS` maps each name (``--workload``) to its
description, its builder ``(dtype, batch, size) -> step`` and whether it
takes ``--size``."""
import numpy as np

import triflux as tf
from triflux import losses, models, optimise
from .. import benchmarks
from ..demos import shapes as demo_shapes
from ..demos import unet as demo_unet


def _unet_step(dtype, batch, size):
    cfg = dict(benchmarks.UNET, batch=batch or benchmarks.UNET["batch"], size=size or benchmarks.UNET["size"])
    return benchmarks.triflux_unet_step(cfg, device="cuda", dtype=dtype)


def _demo_step(dtype, batch, size):
    """The demo's training step (``python -m triflux demo unet`` with its defaults)."""
    d = demo_unet.DEFAULTS
    batch, size = batch or d["batch_size"], size or d["image_size"]
    dev = tf.CUDADevice(0)
    model = models.UNet(3, len(demo_shapes.CLASSES), depth=d["depth"], base_channels=d["base_channels"])
    model = dev(model if dtype == "float32" else tf.bf16(model))
    opt = optimise.setup(optimise.Adam(d["lr"]), model)
    rng = np.random.default_rng(0)
    np_dtype = getattr(tf, dtype)
    x = dev(rng.standard_normal((batch, 3, size, size)).astype(np_dtype))
    y = dev(np.eye(len(demo_shapes.CLASSES), dtype=np.float32)[rng.integers(0, len(demo_shapes.CLASSES),
                                                                           (batch, size, size))]
            .transpose(0, 3, 1, 2).astype(np_dtype))

    def step():
        _, (g, *_) = tf.withgradient(lambda m, a, b: losses.logitcrossentropy(m(a), b, dims=1), model, x, y)
        optimise.update(opt, model, g)
    return step


#: the volumetric workload: a 3-D UNet at its defaults (depth 4, 64 base channels) on 64^3 volumes
UNET3D = dict(batch=2, size=64, in_channels=1, classes=2)


def _unet3d_step(dtype, batch, size):
    """``models.UNet(1, 2, spatial_dims=3)``'s training step on (batch, 1, size, size, size)
    volumes (default 2 of 64^3), logitcrossentropy, Adam."""
    batch, size = batch or UNET3D["batch"], size or UNET3D["size"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, UNET3D["in_channels"], size, size, size)).astype(np.float32)
    y = np.eye(UNET3D["classes"], dtype=np.float32)[rng.integers(0, UNET3D["classes"], (batch, size, size, size))]
    model, x, y = _in_dtype(dtype, models.UNet(UNET3D["in_channels"], UNET3D["classes"], spatial_dims=3), x,
                            np.ascontiguousarray(np.moveaxis(y, -1, 1)))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y, dims=1), model)
        optimise.update(opt, model, g)
    return step


def _in_dtype(dtype, model, *arrays):
    """``model`` and ``arrays`` on the device, in ``dtype`` (float32 or bfloat16)."""
    dev = tf.CUDADevice(0)
    model = dev(model if dtype == "float32" else tf.bf16(model))
    return (model, *(dev(a.astype(getattr(tf, dtype))) for a in arrays))


def _spatial_step(dtype, batch, size):
    """The spatial families beyond the UNets' convolutions and pools: a 1-D
    model with Conv's reflect and replicate padding (the pad kernels),
    lpnormpool, pixel shuffle, linear upsampling and symmetric padding;
    (batch, 4, size) sequences (default 8 of 256), mse, Adam."""
    batch, size = batch or 8, size or 256
    rng = np.random.default_rng(0)
    model = tf.Chain(tf.Conv((3,), 4, 16, tf.relu, pad=2, pad_mode="reflect"),
                     lambda x: tf.ops.lpnormpool(x, 2, (2,)), tf.PixelShuffle(2),
                     tf.Upsample("linear", scale=2), lambda x: tf.ops.pad_symmetric(x, (1, 2)),
                     tf.Conv((3,), 8, 4, pad=1, pad_mode="replicate"))
    x = rng.standard_normal((batch, 4, size)).astype(np.float32)
    model, x = _in_dtype(dtype, model, x)
    y = model(x) * 0.5                  # a target of the output's shape (no kernel runs while recording)
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y), model)
        optimise.update(opt, model, g)
    return step


def _mlp_step(dtype, batch, size):
    """The benchmarks' MLP step (``benchmarks.triflux_mlp_step``), in ``dtype``."""
    cfg = dict(benchmarks.MLP, batch=batch or benchmarks.MLP["batch"])
    if dtype == "float32":
        return benchmarks.triflux_mlp_step(cfg, device="cuda")
    s = cfg["sizes"]
    model, x, y = _in_dtype(dtype, tf.Chain(tf.Dense(s[0], s[1], tf.relu), tf.Dense(s[1], s[2], tf.relu),
                                            tf.Dense(s[2], s[3])), *benchmarks.mlp_data(cfg))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), model)
        optimise.update(opt, model, g)
    return step


def _lstm_step(dtype, batch, size):
    """The benchmarks' LSTM step (``benchmarks.triflux_recurrent_step``), in ``dtype``."""
    cfg = dict(benchmarks.LSTM_LARGE, batch=batch or benchmarks.LSTM_LARGE["batch"])
    if dtype == "float32":
        return benchmarks.triflux_recurrent_step(cfg, device="cuda")
    model, x, y = _in_dtype(dtype, tf.Chain(tf.LSTM(cfg["inputs"], cfg["hidden"]), tf.Dense(cfg["hidden"], 1)),
                            *benchmarks.sequence_data(cfg))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y), model)
        optimise.update(opt, model, g)
    return step


#: name -> (description, builder(dtype, batch, size) -> step closure, takes --size)
WORKLOADS = {
    "unet": ("triflux.models.UNet(3, 2) (depth 4, 64 base channels), batch 4, 64x64, "
             "logitcrossentropy, Adam", _unet_step, True),
    "demo": ("the demo's UNet(3, 4, depth=3, base_channels=16), batch 16, 32x32, Adam", _demo_step, True),
    "unet3d": ("triflux.models.UNet(1, 2, spatial_dims=3) (depth 4, 64 base channels), batch 2, 64x64x64, "
               "logitcrossentropy, Adam", _unet3d_step, True),
    "spatial": ("a 1-D Chain: Conv with reflect padding, lpnormpool, PixelShuffle, linear Upsample, symmetric "
                "pad, Conv with replicate padding; batch 8, 4 x 256, mse, Adam", _spatial_step, True),
    "mlp": ("the benchmarks' MLP 784-256-256-10 relu, batch 128, logitcrossentropy, Adam", _mlp_step, False),
    "lstm": ("the benchmarks' LSTM(64 => 512) + Dense(512 => 1), batch 64, 128 steps, mse, Adam",
             _lstm_step, False),
}
