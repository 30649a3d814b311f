"""The rendezvous API in one module, as backends import it (``from .api import ...``).

The classes live in small modules of their own; this one gathers them.
"""

from __future__ import annotations

from .errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousExhaustedError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from .handler import RendezvousHandler
from .info import RendezvousInfo, RendezvousStoreInfo
from .parameters import RendezvousParameters
from .timeout import RendezvousTimeout

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousExhaustedError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
]
