"""tp-rdzv-static: the ``static`` rendezvous backend (a fixed-size job over a TCPStore)."""

from .__about__ import __version__
from .static_tcp_rendezvous import (
    DEFAULT_PORT,
    StaticTCPRendezvous,
    create_handler,
    create_rdzv_handler,
)

__all__ = [
    "DEFAULT_PORT",
    "StaticTCPRendezvous",
    "__version__",
    "create_handler",
    "create_rdzv_handler",
]
