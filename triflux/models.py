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


def double_conv(cin, cout, spatial_dims=2):
    """(3x3 conv, BatchNorm, relu) twice: one UNET stage (3x3x3 convs for volumes)."""
    k = (3,) * spatial_dims
    return Chain(Conv(k, cin, cout, pad=1, bias=False), BatchNorm(cout, relu),
                 Conv(k, cout, cout, pad=1, bias=False), BatchNorm(cout, relu))


class UNet(Layer):
    """A UNET (Ronneberger et al. 2015; Çiçek et al. 2016 for volumes) for
    segmentation: ``(N, in_channels, H, W)`` images to ``(N, num_classes, H,
    W)`` logits, or with ``spatial_dims=3`` volumes ``(N, in_channels, D, H,
    W)`` to ``(N, num_classes, D, H, W)``.

    ``depth`` times: a double convolution, then 2x2 (2x2x2) max pooling down;
    at the bottom a double convolution; on the way up, a 2x2 (2x2x2) stride-2
    ConvTranspose (or ``up="upsample"``: nearest upsampling and a 1x1 conv),
    the skip concatenation with the encoder's features, and a double
    convolution. Channels double at each level from ``base_channels``. Every
    spatial side must be divisible by ``2**depth``. Built from Chain and
    SkipConnection, so it prints, moves, trains, saves and converts to torch
    like any model::

        model = UNet(3, 2, depth=2, base_channels=8)
        model(tf.rand(1, 3, 64, 64)).shape      # (1, 2, 64, 64)
        UNet(1, 2, depth=2, base_channels=8, spatial_dims=3)(tf.rand(1, 1, 16, 16, 16)).shape  # (1, 2, 16, 16, 16)

    ``in_channels``, ``num_classes``, ``depth`` and ``base_channels`` are
    positive ints; ``spatial_dims`` 2 or 3.
    """

    def __init__(self, in_channels, num_classes, depth=4, base_channels=64, up="convtranspose", *, spatial_dims=2):
        in_channels, num_classes = int_arg(in_channels, "UNet", "in_channels"), int_arg(num_classes, "UNet",
                                                                                         "num_classes")
        depth, base_channels = int_arg(depth, "UNet", "depth"), int_arg(base_channels, "UNet", "base_channels")
        if up not in ("convtranspose", "upsample"):
            raise ArgumentError(f"UNet: up must be 'convtranspose' or 'upsample', got {up!r}")
        if spatial_dims not in (2, 3):
            raise ArgumentError(f"UNet: spatial_dims must be 2 (images) or 3 (volumes), got {spatial_dims!r}")
        self.depth, self.spatial_dims = depth, spatial_dims
        two, one = (2,) * spatial_dims, (1,) * spatial_dims

        def level(d, cin):
            c = base_channels * 2 ** d
            if d == depth:
                return double_conv(cin, c, spatial_dims)
            inner = level(d + 1, c)
            if up == "convtranspose":
                rise = ConvTranspose(two, 2 * c, c, stride=2)
            else:
                rise = Chain(Upsample("nearest", scale=two), Conv(one, 2 * c, c))
            down_and_up = Chain(MaxPool(two), inner, rise)
            return Chain(double_conv(cin, c, spatial_dims), SkipConnection(down_and_up, cat_channels),
                         double_conv(2 * c, c, spatial_dims))

        self.net = Chain(level(0, in_channels), Conv(one, base_channels, num_classes))

    def __call__(self, x):
        x = as_tensor(x)
        step, n = 2 ** self.depth, self.spatial_dims
        if x.ndim != n + 2 or any(side % step for side in x.shape[2:]):
            layout = "(N, C, H, W)" if n == 2 else "(N, C, D, H, W)"
            raise ShapeError(f"UNet(depth={self.depth}, spatial_dims={n}) needs {layout} input with every spatial "
                             f"side divisible by 2^{self.depth} = {step}; got shape {x.shape} (pad or crop the "
                             f"{'images' if n == 2 else 'volumes'})")
        return self.net(x)

    def _signature(self):
        return f"depth={self.depth}" + (f", spatial_dims={self.spatial_dims}" if self.spatial_dims != 2 else "")
