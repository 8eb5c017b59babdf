"""Ready-made models built from triflux layers."""
from . import ops
from .activations import relu
from .arguments import int_arg
from .errors import ArgumentError, ShapeError
from .layers import BatchNorm, Chain, Conv, ConvTranspose, Layer, MaxPool, SkipConnection, Upsample
from .tensor import as_tensor


def cat_channels(y, x):
    """``concat([y, x], axis=1)``: a UNET's skip connection joins the
    upsampled features ``y`` and the encoder's ``x`` along the channels."""
    return ops.concat([y, x], axis=1)


def double_conv(cin, cout):
    """(3x3 conv, BatchNorm, relu) twice: one UNET stage."""
    return Chain(Conv((3, 3), cin, cout, pad=1, bias=False), BatchNorm(cout, relu),
                 Conv((3, 3), cout, cout, pad=1, bias=False), BatchNorm(cout, relu))


class UNet(Layer):
    """A UNET (Ronneberger et al. 2015) for segmentation: ``(N, in_channels,
    H, W)`` images to ``(N, num_classes, H, W)`` logits.

    ``depth`` times: a double convolution, then 2x2 max pooling down; at the
    bottom a double convolution; on the way up, a 2x2 stride-2 ConvTranspose
    (or ``up="upsample"``: nearest upsampling and a 1x1 conv), the skip
    concatenation with the encoder's features, and a double convolution.
    Channels double at each level from ``base_channels``. H and W must be
    divisible by ``2**depth``. Built from Chain and SkipConnection, so it
    prints, moves, trains and saves like any model::

        model = UNet(3, 2, depth=2, base_channels=8)
        model(tf.rand(1, 3, 64, 64)).shape      # (1, 2, 64, 64)

    ``in_channels``, ``num_classes``, ``depth`` and ``base_channels`` are
    positive ints.
    """

    def __init__(self, in_channels, num_classes, depth=4, base_channels=64, up="convtranspose"):
        in_channels, num_classes = int_arg(in_channels, "UNet", "in_channels"), int_arg(num_classes, "UNet",
                                                                                         "num_classes")
        depth, base_channels = int_arg(depth, "UNet", "depth"), int_arg(base_channels, "UNet", "base_channels")
        if up not in ("convtranspose", "upsample"):
            raise ArgumentError(f"UNet: up must be 'convtranspose' or 'upsample', got {up!r}")
        self.depth = depth

        def level(d, cin):
            c = base_channels * 2 ** d
            if d == depth:
                return double_conv(cin, c)
            inner = level(d + 1, c)
            if up == "convtranspose":
                rise = ConvTranspose((2, 2), 2 * c, c, stride=2)
            else:
                rise = Chain(Upsample(2), Conv((1, 1), 2 * c, c))
            down_and_up = Chain(MaxPool(2), inner, rise)
            return Chain(double_conv(cin, c), SkipConnection(down_and_up, cat_channels), double_conv(2 * c, c))

        self.net = Chain(level(0, in_channels), Conv((1, 1), base_channels, num_classes))

    def __call__(self, x):
        x = as_tensor(x)
        step = 2 ** self.depth
        if x.ndim != 4 or x.shape[2] % step or x.shape[3] % step:
            raise ShapeError(f"UNet(depth={self.depth}) needs (N, C, H, W) input with H and W divisible by "
                             f"2^{self.depth} = {step}; got shape {x.shape} (pad or crop the images)")
        return self.net(x)

    def _signature(self):
        return f"depth={self.depth}"
