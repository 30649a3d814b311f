"""tp-store: PyTorch-compatible key/value stores in pure Python.

Every public name is importable from ``tp_store`` itself. The package's rooms:

- :mod:`~tp_store.base`: the :class:`Store` interface; :mod:`~tp_store.errors`:
  the exceptions; :mod:`~tp_store.semantics`: the value rules every store
  shares; :mod:`~tp_store.security`: TLS contexts and secrets;
- :mod:`tp_store.stores`: the ``Store`` implementations (``TCPStore``,
  ``HashStore``, ``FileStore``, ``PrefixStore``);
- :mod:`tp_store.sessions`: store sessions (``StoreSession``, the rules of
  presence, each store's sessions);
- :mod:`tp_store.protocol`: the TCPStore wire protocol, without I/O;
- :mod:`tp_store.server`: the asyncio server (``StoreServer``) and what only
  the server side uses;
- :mod:`tp_store.testing`: the contract suites a store's tests run;
- ``python -m tp_store`` (:mod:`tp_store.__main__`, also the ``tp-store``
  command): a standalone server; ``python -m tp_store.demo``: a live demo.
"""

from .__about__ import __version__
from .base import DEFAULT_TIMEOUT, Store, UnsupportedOperationError
from .errors import (
    ProtocolError,
    QueueEmptyError,
    SessionExpiredError,
    StoreAuthenticationError,
    StoreConnectionError,
    StoreError,
    StoreFileError,
    StoreLimitError,
    StoreTimeoutError,
)
from .protocol import Limits, ServerStats
from .security import TLSConfig
from .server.store_server import StoreServer
from .sessions.base import StoreSession
from .stores.file_store import FileStore
from .stores.hash_store import HashStore
from .stores.prefix_store import PrefixStore
from .stores.tcp_store import TCPStore

__all__ = [
    "DEFAULT_TIMEOUT",
    "FileStore",
    "HashStore",
    "Limits",
    "PrefixStore",
    "ProtocolError",
    "QueueEmptyError",
    "ServerStats",
    "SessionExpiredError",
    "Store",
    "StoreAuthenticationError",
    "StoreConnectionError",
    "StoreError",
    "StoreFileError",
    "StoreLimitError",
    "StoreServer",
    "StoreSession",
    "StoreTimeoutError",
    "TCPStore",
    "TLSConfig",
    "UnsupportedOperationError",
    "__version__",
]
