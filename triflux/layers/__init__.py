"""Layers: callables holding parameters (Tensors) as attributes.

Each module lists its public layers in ``__all__``; this package exports
exactly those (and ``triflux`` exports this package's ``__all__``), so a new
layer is exported by naming it in its module's ``__all__``.
"""
from .attention import *   # noqa: F401,F403
from .base import *        # noqa: F401,F403
from .containers import *  # noqa: F401,F403
from .conv import *        # noqa: F401,F403
from .dense import *       # noqa: F401,F403
from .dropout import *     # noqa: F401,F403
from .embedding import *   # noqa: F401,F403
from .norm import *        # noqa: F401,F403
from .normalisation import *  # noqa: F401,F403
from .pool import *        # noqa: F401,F403
from .recurrent import *   # noqa: F401,F403
from .stateless import *   # noqa: F401,F403
from . import attention, base, containers, conv, dense, dropout, embedding, norm, normalisation, pool, recurrent, stateless

__all__ = [name for module in (attention, base, containers, conv, dense, dropout, embedding, norm, normalisation, pool,
                               recurrent, stateless)
           for name in module.__all__]
