"""tp-rdzv-api: the rendezvous API that every tensorplay rendezvous backend implements."""

from .__about__ import __version__
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
from .registry import (
    ENTRY_POINT_GROUP,
    HandlerCreator,
    RendezvousHandlerRegistry,
    create_handler,
    register,
    rendezvous_handler_registry,
)
from .timeout import RendezvousTimeout
from .utils import parse_rendezvous_config, parse_rendezvous_endpoint

__all__ = [
    "ENTRY_POINT_GROUP",
    "HandlerCreator",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousExhaustedError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
    "__version__",
    "create_handler",
    "parse_rendezvous_config",
    "parse_rendezvous_endpoint",
    "register",
    "rendezvous_handler_registry",
]
