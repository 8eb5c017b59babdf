"""The "UNET-like" Chain of the question "Why am I getting an error while
using GPU on a UNET with FLUX in Julia?", translated to triflux.

In Flux the post builds

    Chain(Conv((3, 3), input_channels => 64, relu; pad=1),
          Conv((3, 3), 64 => 64, relu; pad=1),
          MaxPool((2,2)),
          Conv((3, 3), 64 => 128, relu; pad=1),
          Conv((3, 3), 128 => 128, relu; pad=1),
          MaxPool((2,2)),
          Conv((3,3), 128 => num_classes; pad=1),
          Flux.flatten)

and then hits the three errors the post is about: data left on the CPU while
the model is on the GPU, Float64 data, and parameters of the wrong type. In
triflux the same model is the same few lines (batch-first: Flux's
``rand(Float32, 128, 128, 3, 4)`` is ``(4, 3, 128, 128)`` here, the same
memory order), runs unchanged on every device, and each of those mistakes is
either handled or stopped by an error that says what to do; ``--pitfalls``
shows them.

Two fixes to the post's code: its labels ``y`` have 128*128 pixels per class
while the model's output has (128/4)^2 after two poolings, so the labels
here are at the output's resolution; and ``flatten`` would make
``logitcrossentropy`` take its softmax over every pixel at once, so the loss
takes it over the class axis (``dims=1``) of the unflattened output.

    python examples/unet_chain.py                 # the default device, 20 steps
    python examples/unet_chain.py --device cpu --steps 5 --image-size 32
    python examples/unet_chain.py --pitfalls      # the seed's errors, in triflux
"""
import argparse
import warnings

import numpy as np

import triflux as tf
from triflux import losses, optimise
from triflux.workbench.flags import device_from_flag


def build_unet(input_channels, num_classes):
    """The seed's model, layer for layer (``Conv(kernel, in, out, act)``
    spells Flux's ``Conv(kernel, in => out, act)``)."""
    return tf.Chain(
        tf.Conv((3, 3), input_channels, 64, tf.relu, pad=1),
        tf.Conv((3, 3), 64, 64, tf.relu, pad=1),
        tf.MaxPool((2, 2)),
        tf.Conv((3, 3), 64, 128, tf.relu, pad=1),
        tf.Conv((3, 3), 128, 128, tf.relu, pad=1),
        tf.MaxPool((2, 2)),
        tf.Conv((3, 3), 128, num_classes, pad=1),
    )


def make_data(n, channels, size, num_classes, seed=0):
    """Images whose label at each output pixel is which of ``num_classes``
    brightness bands the (4x4-pooled) pixel falls in: learnable, so the loss
    must go down."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, channels, size, size), dtype=np.float32)
    pooled = x.mean(axis=1).reshape(n, size // 4, 4, size // 4, 4).mean(axis=(2, 4))
    bands = np.clip((pooled * num_classes).astype(np.int64), 0, num_classes - 1)   # (N, h, w)
    y = np.eye(num_classes, dtype=np.float32)[bands].transpose(0, 3, 1, 2)          # one-hot (N, C, h, w)
    return x, np.ascontiguousarray(y)


def loss(model, x, y):
    return losses.logitcrossentropy(model(x), y, dims=1)


def train(device, steps=20, image_size=64, batch=4, input_channels=3, num_classes=2, lr=1e-3, seed=0,
          say=print):
    """Train the seed's model on ``device``; returns the losses per step."""
    tf.seed(seed)
    model = device(build_unet(input_channels, num_classes))     # the model on the device ...
    x, y = make_data(batch, input_channels, image_size, num_classes, seed)
    x, y = device(x), device(y)                                 # ... and the data with it
    opt = optimise.setup(optimise.Adam(lr), model)
    history = []
    for step in range(steps):
        value, (g, _, _) = tf.withgradient(loss, model, x, y)
        optimise.update(opt, model, g)
        history.append(float(value))
        say(f"step {step + 1:3d}  loss {history[-1]:.4f}")
    return history


def pitfalls(device, say=print):
    """The seed's three mistakes, each met by triflux. Returns what happened."""
    seen = {}
    model = device(build_unet(3, 2))
    x_cpu = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)

    # 1. "data on the CPU whilst the model is on the GPU" (a MethodError deep inside Flux)
    if not device.is_cpu:
        try:
            model(tf.tensor(x_cpu))
        except tf.DeviceMismatchError as e:
            seen["device"] = str(e)
            say(f"1. model on {device!r}, data on the CPU:\n   {type(e).__name__}: {e}")
    else:
        say("1. model and data both on the CPU here; with a GPU this mismatch raises DeviceMismatchError")

    # 2. Float64 data: `gpu`/devices convert it to float32 as CUDA.cu does; a float64
    #    array reaching a float32 model is converted with one warning, never a crash
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(device(x_cpu.astype(np.float64)) if not device.is_cpu else tf.tensor(x_cpu.astype(np.float64)))
    seen["float64"] = (out.dtype, [str(w.message) for w in caught])
    say(f"2. float64 images: output dtype {out.dtype}" + (f"; warning: {caught[0].message}" if caught else
                                                            " (the device converted them on the way in)"))

    # 3. "Ensure all model parameters are float32": they already are; f32/f64/f16 convert any structure
    dtypes = {t.dtype for t in tf.functor.leaves(model)}
    seen["param_dtypes"] = dtypes
    say(f"3. parameter dtypes: {sorted(str(d) for d in dtypes)}; f64(model) would make them float64")
    return seen


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: a functional GPU, else cpu)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--image-size", type=int, default=64, help="a multiple of 4 (two 2x2 poolings)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--pitfalls", action="store_true", help="show the post's errors and what triflux does")
    args = p.parse_args(argv)
    if args.image_size <= 0 or args.image_size % 4:
        p.error("--image-size must be a positive multiple of 4")
    device = device_from_flag(p, args.device)       # a device that can't be used: a one-line error naming --device
    print(f"device: {device!r}")
    if args.pitfalls:
        pitfalls(device)
        return 0
    print(build_unet(3, 2))
    history = train(device, steps=args.steps, image_size=args.image_size, batch=args.batch_size)
    print(f"loss {history[0]:.4f} -> {history[-1]:.4f} in {len(history)} steps on {device!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
