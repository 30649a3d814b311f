"""The process-wide backend registry (re-exported from ``tp_rdzv_api.registry``)."""

from tp_rdzv_api.registry import (
    ENTRY_POINT_GROUP,
    HandlerCreator,
    RendezvousHandlerRegistry,
    create_handler,
    register,
    rendezvous_handler_registry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "HandlerCreator",
    "RendezvousHandlerRegistry",
    "create_handler",
    "register",
    "rendezvous_handler_registry",
]
