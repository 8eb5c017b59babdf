"""The benchmarked workloads, each built twice: in triflux and as the same
model in torch. A builder returns a closure running one training step
(forward, backward, optimiser update), so every suite times the same thing:
perf/ (pytest-benchmark, the interleaved ratio, the GPU script) and
``python -m triflux bench``, a quick run printing a table (``main`` below).

``device`` is ``"cpu"`` (triflux's NumPy reference, torch's CPU kernels) or
``"cuda"`` (triflux's Triton kernels, torch's cuDNN/cuBLAS).
"""
import argparse
import statistics
import sys
import time

import numpy as np

import triflux as tf
from triflux import backend, losses, models, optimise
from .flags import interpreter_notice

MLP = dict(batch=128, sizes=(784, 256, 256, 10))
#: the CPU target: a UNet step at batch 4, 64x64 (triflux.models.UNet's defaults:
#: depth 4, 64 base channels, 31M parameters)
UNET = dict(batch=4, size=64, in_channels=3, classes=2, depth=4, base=64)


def _np_dtype(dtype):
    return {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.dtypes.bfloat16}[dtype]


def _torch_dtype(dtype):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def _tf_device(device):
    return tf.cpu_device() if device == "cpu" else tf.CUDADevice(0)


# --- the MLP ------------------------------------------------------------------------------

def mlp_data(cfg=MLP):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((cfg["batch"], cfg["sizes"][0])).astype(np.float32)
    y = np.eye(cfg["sizes"][-1], dtype=np.float32)[rng.integers(0, cfg["sizes"][-1], cfg["batch"])]
    return x, y


def triflux_mlp_step(cfg=MLP, device="cpu"):
    """A closure running one triflux training step of the MLP."""
    x, y = mlp_data(cfg)
    s = cfg["sizes"]
    dev = _tf_device(device)
    model = dev(tf.Chain(tf.Dense(s[0], s[1], tf.relu), tf.Dense(s[1], s[2], tf.relu), tf.Dense(s[2], s[3])))
    opt = optimise.setup(optimise.Adam(1e-3), model)
    xt, yt = dev(x), dev(y)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(xt), yt), model)
        optimise.update(opt, model, g)
    return step


def torch_mlp_step(cfg=MLP, device="cpu"):
    """A closure running one torch training step of the same MLP."""
    import torch
    x, y = mlp_data(cfg)
    s = cfg["sizes"]
    model = torch.nn.Sequential(torch.nn.Linear(s[0], s[1]), torch.nn.ReLU(), torch.nn.Linear(s[1], s[2]),
                                torch.nn.ReLU(), torch.nn.Linear(s[2], s[3])).to(device)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


# --- the UNet -----------------------------------------------------------------------------

def unet_data(cfg=UNET):
    """Images (or, with ``cfg["dims"] == 3``, volumes) and one-hot labels for a UNet step."""
    rng = np.random.default_rng(0)
    n, s, dims = cfg["batch"], cfg["size"], cfg.get("dims", 2)
    x = rng.standard_normal((n, cfg["in_channels"]) + (s,) * dims).astype(np.float32)
    labels = rng.integers(0, cfg["classes"], (n,) + (s,) * dims)
    y = np.moveaxis(np.eye(cfg["classes"], dtype=np.float32)[labels], -1, 1)
    return x, np.ascontiguousarray(y)


def triflux_unet_step(cfg=UNET, device="cpu", dtype="float32", capture=False):
    """A closure running one triflux training step of ``triflux.models.UNet``
    (per-pixel logitcrossentropy, Adam); ``capture=True``: ``train``'s step
    through ``capture_step``, recorded here on two steps, so the closure
    replays (on a GPU; on the CPU it runs eagerly)."""
    dev = _tf_device(device)
    model = models.UNet(cfg["in_channels"], cfg["classes"], depth=cfg["depth"], base_channels=cfg["base"],
                        spatial_dims=cfg.get("dims", 2))
    if dtype != "float32":
        model = tf.f16(model) if dtype == "float16" else tf.bf16(model)
    model = dev(model)
    opt = optimise.setup(optimise.Adam(1e-3), model)
    x, y = unet_data(cfg)
    xt, yt = dev(x.astype(_np_dtype(dtype))), dev(y.astype(_np_dtype(dtype)))
    if capture:
        captured = tf.capture_step(lambda m, x, y: losses.logitcrossentropy(m(x), y, dims=1), model, opt)
        captured(xt, yt)
        captured(xt, yt)
        return lambda: captured(xt, yt)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(xt), yt, dims=1), model)
        optimise.update(opt, model, g)
    return step


def torch_unet(cfg=UNET):
    """The same architecture as ``triflux.models.UNet`` in torch.nn: (3x3 conv
    without bias, BatchNorm, relu) twice per level, 2x2 max pooling down, 2x2
    stride-2 ConvTranspose up, ``cat([up, skip])``, a 1x1 conv head; with
    ``cfg["dims"] == 3`` the volumetric one (3x3x3 convolutions, 2x2x2 pooling)."""
    import torch
    from torch import nn
    dims = cfg.get("dims", 2)
    conv, batchnorm = getattr(nn, f"Conv{dims}d"), getattr(nn, f"BatchNorm{dims}d")
    conv_transpose, max_pool = getattr(nn, f"ConvTranspose{dims}d"), getattr(nn.functional, f"max_pool{dims}d")

    def double_conv(i, o):
        return nn.Sequential(conv(i, o, 3, padding=1, bias=False), batchnorm(o), nn.ReLU(),
                             conv(o, o, 3, padding=1, bias=False), batchnorm(o), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self, cin, classes, depth, base):
            super().__init__()
            ch = [base * 2 ** d for d in range(depth + 1)]
            self.depth = depth
            self.down = nn.ModuleList([double_conv(cin if d == 0 else ch[d - 1], ch[d]) for d in range(depth + 1)])
            self.up = nn.ModuleList([conv_transpose(ch[d + 1], ch[d], 2, stride=2) for d in range(depth)])
            self.merge = nn.ModuleList([double_conv(2 * ch[d], ch[d]) for d in range(depth)])
            self.head = conv(base, classes, 1)

        def forward(self, x):
            skips = []
            for d in range(self.depth):
                x = self.down[d](x)
                skips.append(x)
                x = max_pool(x, 2)
            x = self.down[self.depth](x)
            for d in reversed(range(self.depth)):
                x = self.merge[d](torch.cat([self.up[d](x), skips[d]], 1))
            return self.head(x)

    return UNet(cfg["in_channels"], cfg["classes"], cfg["depth"], cfg["base"])


def torch_unet_step(cfg=UNET, device="cpu", dtype="float32"):
    """A closure running one torch training step of the same UNet."""
    import torch
    model = torch_unet(cfg).to(device=device, dtype=_torch_dtype(dtype))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x, y = unet_data(cfg)
    xt = torch.from_numpy(x).to(device=device, dtype=_torch_dtype(dtype))
    yt = torch.from_numpy(y).to(device=device, dtype=_torch_dtype(dtype))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


# --- the seeds' UNET-like Chain ------------------------------------------------------------

#: shared/seeds/000: Conv 3=>64=>64 (relu, pad 1), MaxPool 2, Conv 64=>128=>128, MaxPool 2,
#: Conv 128=>2 (examples/unet_chain.py); batch 4, 64x64, per-pixel logitcrossentropy, Adam
SEED_CHAIN = dict(batch=4, size=64, in_channels=3, classes=2, widths=(64, 128))


def seed_chain_data(cfg=SEED_CHAIN):
    """Images and one-hot labels at the output's resolution (a quarter of the side)."""
    x, y = unet_data(cfg)
    return x, np.ascontiguousarray(y[:, :, ::4, ::4])


def triflux_seed_chain_step(cfg=SEED_CHAIN, device="cpu"):
    """A closure running one triflux training step of the seeds' Chain."""
    dev = _tf_device(device)
    a, b = cfg["widths"]
    model = dev(tf.Chain(tf.Conv((3, 3), cfg["in_channels"], a, tf.relu, pad=1), tf.Conv((3, 3), a, a, tf.relu, pad=1),
                         tf.MaxPool((2, 2)),
                         tf.Conv((3, 3), a, b, tf.relu, pad=1), tf.Conv((3, 3), b, b, tf.relu, pad=1),
                         tf.MaxPool((2, 2)),
                         tf.Conv((3, 3), b, cfg["classes"], pad=1)))
    opt = optimise.setup(optimise.Adam(1e-3), model)
    xt, yt = (dev(v) for v in seed_chain_data(cfg))

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(xt), yt, dims=1), model)
        optimise.update(opt, model, g)
    return step


def torch_seed_chain_step(cfg=SEED_CHAIN, device="cpu"):
    """The same step in torch (nn.Conv2d with bias, nn.MaxPool2d)."""
    import torch
    from torch import nn
    a, b = cfg["widths"]
    model = nn.Sequential(nn.Conv2d(cfg["in_channels"], a, 3, padding=1), nn.ReLU(), nn.Conv2d(a, a, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.Conv2d(b, b, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2),
                          nn.Conv2d(b, cfg["classes"], 3, padding=1)).to(device)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    xt, yt = (torch.from_numpy(v).to(device) for v in seed_chain_data(cfg))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


# --- recurrent models: the seed's small RNN and a large LSTM ------------------------------

#: the seed (shared/seeds/003): RNN(1 => 6, tanh) and Dense(6 => 1) over one sequence of 20
RNN_SEED = dict(kind="rnn", batch=1, length=20, inputs=1, hidden=6)
#: the large case: LSTM(64 => 512) over 128 steps, batch 64
LSTM_LARGE = dict(kind="lstm", batch=64, length=128, inputs=64, hidden=512)


def sequence_data(cfg):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((cfg["batch"], cfg["length"], cfg["inputs"])).astype(np.float32)
    y = rng.standard_normal((cfg["batch"], cfg["length"], 1)).astype(np.float32)
    return x, y


def triflux_recurrent_step(cfg=RNN_SEED, device="cpu"):
    """A closure running one triflux training step (BPTT over the sequence,
    mse, Adam) of ``cfg``'s recurrent layer followed by Dense(hidden => 1)."""
    dev = _tf_device(device)
    layer = {"rnn": tf.RNN, "lstm": tf.LSTM, "gru": tf.GRU}[cfg["kind"]](cfg["inputs"], cfg["hidden"])
    model = dev(tf.Chain(layer, tf.Dense(cfg["hidden"], 1)))
    opt = optimise.setup(optimise.Adam(1e-3), model)
    x, y = (dev(a) for a in sequence_data(cfg))

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y), model)
        optimise.update(opt, model, g)
    return step


def torch_recurrent_step(cfg=RNN_SEED, device="cpu"):
    """The same step in torch (nn.RNN/LSTM/GRU with batch_first, nn.Linear)."""
    import torch
    from torch import nn
    cls = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[cfg["kind"]]
    rnn = cls(cfg["inputs"], cfg["hidden"], batch_first=True).to(device)
    head = nn.Linear(cfg["hidden"], 1).to(device)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], 1e-3)
    x, y = (torch.from_numpy(a).to(device) for a in sequence_data(cfg))

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(head(rnn(x)[0]), y).backward()
        opt.step()
    return step


# --- one convolution layer of any spatial rank ---------------------------------------------------

#: Conv(3^R, C => C, pad 1) forward and backward of sum(y * g): the same work (N * pixels * C^2 * 3^R)
#: in each rank would make the ratios comparable; these are shapes of the kind each rank serves
CONV_LAYERS = {1: dict(dims=1, batch=8, channels=32, size=2048), 2: dict(dims=2, batch=8, channels=32, size=48),
               3: dict(dims=3, batch=2, channels=32, size=16)}


def _conv_layer_data(cfg):
    rng = np.random.default_rng(0)
    shape = (cfg["batch"], cfg["channels"]) + (cfg["size"],) * cfg["dims"]
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def triflux_conv_layer_step(cfg=CONV_LAYERS[2], device="cpu"):
    """A closure: one Conv layer's forward and its gradients (input, weight, bias)."""
    dev = _tf_device(device)
    c = cfg["channels"]
    layer = dev(tf.Conv((3,) * cfg["dims"], c, c, pad=1))
    x, g = (dev(a) for a in _conv_layer_data(cfg))
    return lambda: tf.gradient(lambda m, x: (m(x) * g).sum(), layer, x)


def torch_conv_layer_step(cfg=CONV_LAYERS[2], device="cpu"):
    import torch
    c = cfg["channels"]
    layer = getattr(torch.nn, f"Conv{cfg['dims']}d")(c, c, 3, padding=1).to(device)
    x, g = (torch.from_numpy(a).to(device) for a in _conv_layer_data(cfg))
    x.requires_grad_(True)

    def step():
        layer.zero_grad()
        x.grad = None
        (layer(x) * g).sum().backward()
    return step


BUILDERS = {("mlp", "triflux"): triflux_mlp_step, ("mlp", "torch"): torch_mlp_step,
            ("conv_layer", "triflux"): triflux_conv_layer_step, ("conv_layer", "torch"): torch_conv_layer_step,
            ("unet", "triflux"): triflux_unet_step, ("unet", "torch"): torch_unet_step,
            ("rnn_seed", "triflux"): lambda cfg=RNN_SEED, **kw: triflux_recurrent_step(cfg, **kw),
            ("rnn_seed", "torch"): lambda cfg=RNN_SEED, **kw: torch_recurrent_step(cfg, **kw),
            ("lstm_large", "triflux"): lambda cfg=LSTM_LARGE, **kw: triflux_recurrent_step(cfg, **kw),
            ("lstm_large", "torch"): lambda cfg=LSTM_LARGE, **kw: torch_recurrent_step(cfg, **kw),
            ("seed_chain", "triflux"): triflux_seed_chain_step, ("seed_chain", "torch"): torch_seed_chain_step}


# --- python -m triflux bench ----------------------------------------------------------------

UNET_QUICK = dict(UNET, depth=2, base=16, size=32)
#: issue 28's volumetric step: UNet(1, 2, depth=2, base_channels=8, spatial_dims=3), batch 2, 32^3
UNET3D_SMALL = dict(UNET, depth=2, base=8, batch=2, size=32, in_channels=1, dims=3)
LSTM_QUICK = dict(LSTM_LARGE, hidden=128, length=32, batch=16)

#: the quick run's workloads: (label, workload, config)
QUICK = (("MLP step 784-256-256-10, batch 128", "mlp", MLP),
         ("UNet step depth 2, base 16, batch 4, 32x32", "unet", UNET_QUICK),
         ("the seed's RNN step (1 => 6, 20 steps)", "rnn_seed", RNN_SEED),
         ("LSTM step 64 => 128, 32 steps, batch 16", "lstm_large", LSTM_QUICK),
         ("the seeds' UNET-like Chain step, batch 4, 64x64", "seed_chain", SEED_CHAIN))


def _median_time(step, reps, warmup=1, sync=lambda: None):
    for _ in range(warmup):
        step()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv=None):
    """``python -m triflux bench``: time each workload in triflux and in torch
    on the same device, one after the other in this process, and print a
    table of medians and ratios. Quick and indicative; perf/ holds the
    careful suites (perf/interleaved.py for fair CPU ratios)."""
    p = argparse.ArgumentParser(prog="python -m triflux bench", description=main.__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the NumPy reference vs torch's CPU kernels; cuda: Triton kernels vs torch on the GPU")
    p.add_argument("--reps", type=int, default=5, help="timed steps per workload and side (default 5)")
    p.add_argument("--full", action="store_true", help="also the large sizes: UNet depth 4, base 64, batch 4, "
                   "64x64; LSTM 64 => 512 over 128 steps, batch 64")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be positive")
    if not backend.has_module("torch"):
        p.error("the benchmarks compare against torch: `pip install torch`")
    torch = backend.torch()
    sync, torch_device = (lambda: None), "cpu"
    if args.device == "cuda":
        ok, why = backend.status("CUDA")
        if not ok:
            p.error(f"--device cuda: {why}")
        if torch.cuda.is_available() and not backend.interpreter_on():   # a real GPU: torch runs there too
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            sync, torch_device = torch.cuda.synchronize, "cuda"
    work = list(QUICK) + ([("UNet step depth 4, base 64, batch 4, 64x64", "unet", UNET),
                           ("LSTM step 64 => 512, 128 steps, batch 64", "lstm_large", LSTM_LARGE)]
                          if args.full else [])
    interpreted = interpreter_notice(_tf_device(args.device), "The triflux timings below are interpreter timings.")
    where = f"{args.device} (Triton interpreter on the CPU; torch on the CPU)" if interpreted else args.device
    ours = "triflux (interpreter timings)" if interpreted else "triflux"
    print(f"device: {where}; torch {torch.__version__}; {args.reps} timed steps each (medians)")
    print(f"| workload | {ours} | torch | ratio triflux/torch |\n| --- | --- | --- | --- |")
    for label, name, cfg in work:
        a = BUILDERS[name, "triflux"](cfg, device=args.device)
        b = BUILDERS[name, "torch"](cfg, device=torch_device)
        ta = _median_time(a, args.reps, sync=sync)
        tb = _median_time(b, args.reps, sync=sync)
        print(f"| {label} | {ta * 1e3:.2f} ms | {tb * 1e3:.2f} ms | {ta / tb:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
