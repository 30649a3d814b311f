"""Exceptions raised by every store.

They subclass ``RuntimeError`` (as PyTorch's ``DistStoreError`` does) so code
written against PyTorch keeps catching them, and the standard ``TimeoutError``
and ``ConnectionError`` so plain Python code can catch them too.
"""

from __future__ import annotations

from collections.abc import Iterable


class StoreError(RuntimeError):
    """Base class of every error a store raises."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking operation did not finish before its timeout."""

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys: tuple[str, ...] = tuple(keys)


class StoreConnectionError(StoreError, ConnectionError):
    """The store could not be reached, or the connection to it broke."""

    def __init__(self, message: str, host: str = "", port: int = 0) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


class SessionExpiredError(StoreConnectionError):
    """The store ended this store session (see :class:`~tp_store.StoreSession`).

    Its keys are deleted and its wills pushed: the client was silent longer
    than the session's timeout, its connection broke, or the session was
    closed. Open a new session to be present again.
    """


class StoreAuthenticationError(StoreConnectionError):
    """The store and this client do not share a secret, or only one of them has one.

    Raised when connecting: the server refused our proof, could not prove it
    knows the secret, or has no secret while this client has one (a
    misconfiguration that must not pass silently).
    """


class StoreFileError(StoreError, OSError):
    """A ``FileStore``'s file cannot be opened, read or written.

    Its message names the file: a missing directory, a read-only file system,
    a symbolic link (never followed), something other than a regular file.
    """


class StoreLimitError(ValueError):
    """A request would take the store past one of its configured limits.

    The server closes the offending connection: PyTorch's wire protocol has
    no error reply.
    """


class QueueEmptyError(StoreError):
    """``queue_pop(key, block=False)`` found the queue empty."""


class ProtocolError(ValueError):
    """Bytes that do not form a valid TCPStore message (raised by the codec)."""
