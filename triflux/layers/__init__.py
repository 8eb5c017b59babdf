"""Layers: callables holding parameters (Tensors) as attributes."""
from .base import Layer
from .basic import Chain, Dense, flatten, Flatten
from .containers import SkipConnection, Parallel
from .pool import (GlobalMeanPool, GlobalMaxPool, MaxPool, MeanPool, AdaptiveMaxPool, AdaptiveMeanPool,
                   Upsample)
from .conv import Conv, ConvTranspose
from .norm import BatchNorm, Dropout
from .recurrent import RNN, LSTM, GRU, RNNCell, LSTMCell, GRUCell
