"""Tiles measured on a real GPU: ``triton.autotune`` over the model's short
list (``triflux.autotuning.set_autotune``).

A kernel with a tile table (matmul's ``_GPU_TILES``, the conv gather's
``_GATHER_TILES``) is wrapped once in ``triton.autotune`` keyed on the
launch's size arguments and dot kind (Triton adds the tensors' dtypes). The
candidates of a launch are the table's tiles for its dot kind with the
model's pick first (``ranked``); the wrapper's prune hook returns them, so
the first launch of a shape times just those and keeps the fastest. The
tile then reaches the kernel as its block-size constexprs and launch
options, and the grid is a function of them.

Tuned launches go Triton's way (its autotuner, then its binder), not the
direct launcher's, and a captured step replays them that way too.
"""
import triton

from . import launch


def ranked(tiles, pick):
    """``tiles`` with ``pick`` first, the others in table order."""
    return [pick] + [t for t in tiles if t != pick]


def config(names, tile):
    """A ``triton.Config`` of ``tile`` = (blocks, num_warps, num_stages, ...)
    whose blocks go to the constexprs ``names``."""
    blocks, warps, stages = tile[:3]
    return triton.Config(dict(zip(names, blocks)), num_warps=warps, num_stages=stages)


class Tuned:
    """``kernel`` under ``triton.autotune`` over ``tables`` (every tile of
    every dot kind: the autotuner needs more than one config to tune at all),
    keyed on the arguments ``key``; each launch names its own candidates."""

    def __init__(self, kernel, names, tables, key):
        self.names = names
        self.pending = None
        every = [config(names, tile) for tiles in tables.values() for tile in tiles]
        self.autotuner = triton.autotune(configs=every, key=key,
                                         prune_configs_by={"early_config_prune": self._prune})(kernel)

    def _prune(self, configs, named_args, **kwargs):
        return self.pending

    def launch(self, grid, candidates, *args, **meta):
        """Launch with ``grid(meta)`` over the tiles ``candidates`` (the
        model's pick first): the first launch of a key times them."""
        self.pending = [config(self.names, tile) for tile in candidates]
        try:
            return launch.launch(self.autotuner, grid, *args, **meta)
        finally:
            self.pending = None
