"""tensorplay.distributed.elastic.rendezvous: the documented rendezvous API.

Re-exports only; the implementations live in ``tp_rdzv_api`` (the interface,
the parameters, the errors and the registry), ``tp_rdzv_static`` (the
``static`` backend) and ``tp_rdzv_dynamic`` (the ``core``, ``p10d`` and
``c10d`` backends).
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
from tp_rdzv_dynamic import (
    DynamicRendezvousHandler,
    P10dRendezvousBackend,
    RendezvousSettings,
    TpRendezvousBackend,
)
from tp_rdzv_static import StaticTCPRendezvous

__all__ = [
    "DynamicRendezvousHandler",
    "P10dRendezvousBackend",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousExhaustedError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousSettings",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "StaticTCPRendezvous",
    "TpRendezvousBackend",
    "create_handler",
]
