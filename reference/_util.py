"""Helpers shared by the reference families."""


def unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, so it
    has ``shape`` again: the adjoint of ``np.broadcast_to(x, grad.shape)``."""
    if grad.shape == tuple(shape):
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape) if axes else grad.reshape(shape)
