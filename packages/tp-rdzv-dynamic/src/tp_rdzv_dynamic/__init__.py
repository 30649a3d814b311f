"""tp-rdzv-dynamic: elastic rendezvous (backends ``core``, ``p10d`` and ``c10d``).

See ``docs/design/dynamic-rendezvous.md`` for how it works.
"""

from .__about__ import __version__
from .backend import RendezvousBackend, Token
from .handler import DynamicRendezvousHandler
from .holder import _RendezvousStateHolder
from .node import NodeDesc, _NodeDesc
from .p10d_backend import P10dRendezvousBackend
from .settings import RendezvousSettings
from .tp_backend import TpRendezvousBackend

__all__ = [
    "DynamicRendezvousHandler",
    "NodeDesc",
    "P10dRendezvousBackend",
    "RendezvousBackend",
    "RendezvousSettings",
    "Token",
    "TpRendezvousBackend",
    "_NodeDesc",
    "_RendezvousStateHolder",
    "__version__",
]
