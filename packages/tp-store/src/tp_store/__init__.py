"""tp-store: PyTorch-compatible key/value stores in pure Python."""

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
from .file_store import FileStore
from .hash_store import HashStore
from .prefix_store import PrefixStore
from .protocol import Limits, ServerStats
from .security import TLSConfig
from .server import StoreServer
from .session import StoreSession
from .tcp_store import TCPStore

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
