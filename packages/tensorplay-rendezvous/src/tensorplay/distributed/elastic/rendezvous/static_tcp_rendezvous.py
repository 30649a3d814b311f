"""The ``static`` backend (re-exported from ``tp_rdzv_static.static_tcp_rendezvous``)."""

from tp_rdzv_static.static_tcp_rendezvous import (
    StaticTCPRendezvous,
    create_handler,
    create_rdzv_handler,
)

__all__ = ["StaticTCPRendezvous", "create_handler", "create_rdzv_handler"]
