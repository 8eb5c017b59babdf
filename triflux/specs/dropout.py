"""The dropout family's spec: the probability checked once and the scale
of the kept elements, shared by the reference and the kernels (the seed is
checked as a fill's, ``triflux.specs.fill.check_seed``).
"""

__all__ = ["check_p", "keep_scale"]


def check_p(p):
    """``p`` as a float, checked to be a probability."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1], got {p}")
    return p


def keep_scale(p):
    """1 / (1 - p), and 0 for p = 1 (every element is dropped)."""
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
