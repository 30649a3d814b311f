"""The dynamic rendezvous, re-exported from ``tp_rdzv_dynamic`` where PyTorch users look."""

from tp_rdzv_dynamic import (
    DynamicRendezvousHandler,
    P10dRendezvousBackend,
    RendezvousBackend,
    RendezvousSettings,
    Token,
    TpRendezvousBackend,
)
from tp_rdzv_dynamic.factory import create_c10d_handler, create_core_handler, create_p10d_handler

__all__ = [
    "DynamicRendezvousHandler",
    "P10dRendezvousBackend",
    "RendezvousBackend",
    "RendezvousSettings",
    "Token",
    "TpRendezvousBackend",
    "create_c10d_handler",
    "create_core_handler",
    "create_p10d_handler",
]
