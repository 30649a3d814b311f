"""tensorplay.distributed.elastic.rendezvous: the documented rendezvous API.

Re-exports only; the implementations live in ``tp_rdzv_api`` (the interface,
the parameters, the errors and the registry) and ``tp_rdzv_static`` (the
``static`` backend). The dynamic handler's names join with ``tp-rdzv-dynamic``.
"""

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousExhaustedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from tp_rdzv_api.registry import create_handler
from tp_rdzv_static import StaticTCPRendezvous

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
    "RendezvousTimeoutError",
    "StaticTCPRendezvous",
    "create_handler",
]
