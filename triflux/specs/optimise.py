"""The optimise family's spec: the update rules' attributes checked once,
shared by the reference and the kernels.
"""

__all__ = ["check_step"]


def check_step(step):
    """``step``, the 1-based count of updates, as an int (checked)."""
    if int(step) != step or step < 1:
        raise ValueError(f"step is the 1-based count of updates, got {step!r}")
    return int(step)
