"""tp-rdzv-dynamic: elastic rendezvous (backends ``core``, ``p10d`` and ``c10d``).

See ``docs/design/dynamic-rendezvous.md`` for how it works.
"""

from .__about__ import __version__
from .backends.backend import RendezvousBackend, Token
from .backends.holder import _RendezvousStateHolder
from .backends.p10d_backend import P10dRendezvousBackend
from .backends.tp_backend import TpRendezvousBackend
from .handler import DynamicRendezvousHandler
from .model.node_desc import NodeDesc, _NodeDesc
from .settings import RendezvousSettings

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
