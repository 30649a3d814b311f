"""Store sessions of a ``TCPStore``: the ``SESSION_*`` extension on a connection of their own.

The session's connection is a clone of the store's that never reconnects: a
new connection would be a new session on the server. Once that connection
breaks (or a request on it times out, which closes it) the server ends the
session, and every later call raises
:class:`~tp_store.errors.SessionExpiredError`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .base import Data, as_bytes
from .errors import SessionExpiredError, StoreConnectionError, StoreTimeoutError
from .protocol import (
    Ping,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionWill,
)
from .session import StoreSession

if TYPE_CHECKING:
    from .tcp_store import TCPStore

_T = TypeVar("_T")

#: What a PING on the session's connection carries (any nonce but the extension offer).
_PING_NONCE = os.getpid() & 0x3FFFFF


class TCPSession(StoreSession):
    """A :class:`~tp_store.StoreSession` of a :class:`~tp_store.TCPStore` on a tp-store server.

    ``link`` is the session's own connection, ``key_prefix`` what the store
    puts before user keys. The server's session id is :attr:`id`.
    """

    def __init__(self, link: TCPStore, timeout: float, key_prefix: bytes) -> None:
        super().__init__(timeout)
        self._link = link
        self._prefix = key_prefix
        self._end_cause = ""
        self._ended = False
        timeout_ms = max(round(timeout * 1000), 1)
        try:
            self.id = link._request(SessionOpen(timeout_ms).encode(), SessionOpen.reply)
        except BaseException:
            link.close()
            raise

    @property
    def ended(self) -> bool:
        """Whether the session ended: closed, or its connection lost."""
        return self._ended

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, owned by this session."""
        request = SessionSet(self._key(key), as_bytes(value)).encode()
        self._call(lambda: self._link._send(request))

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``Store.compare_set``; a write it makes leaves ``key`` owned by this session."""
        request = SessionCompareSet(
            self._key(key), as_bytes(expected, "expected"), as_bytes(desired, "desired")
        ).encode()
        return self._call(lambda: self._link._request(request, SessionCompareSet.reply))

    def add_will(self, queue: Data, value: Data) -> None:
        """Push ``value`` onto ``queue`` when the session ends."""
        request = SessionWill(self._key(queue), as_bytes(value)).encode()
        self._call(lambda: self._link._send(request))

    def keep_alive(self) -> None:
        """A PING on the session's connection; ``SessionExpiredError`` once it ended."""
        request = Ping(_PING_NONCE).encode()
        answer = self._call(lambda: self._link._request(request, Ping.reply))
        if answer != _PING_NONCE:
            self._end(f"the store answered a PING with {answer!r}")
            raise SessionExpiredError(f"the store session {self.id} ended: {self._end_cause}")

    def close(self) -> None:
        """End the session: the server deletes its keys, then pushes its wills.

        SESSION_CLOSE is answered once that is done, so what the session
        wrote is gone when this returns; closing its connection would end it
        too, a moment later.
        """
        if self._ended:
            return
        # A connection already gone: the server ends the session without it.
        with contextlib.suppress(StoreConnectionError, StoreTimeoutError):
            self._link._request(SessionClose().encode(), SessionClose.reply)
        self._end("closed")

    def _key(self, key: Data) -> bytes:
        return self._prefix + as_bytes(key, "key")

    def _call(self, request: Callable[[], _T]) -> _T:
        """Run ``request`` on the session's connection; a broken one ends the session."""
        if self._ended:
            raise SessionExpiredError(f"the store session {self.id} ended: {self._end_cause}")
        try:
            return request()
        except (StoreConnectionError, StoreTimeoutError) as exc:
            # The connection is closed now (a timed-out request closes it too):
            # the server ends the session, if it has not already.
            self._end(f"its connection was lost: {exc}")
            raise SessionExpiredError(
                f"the store session {self.id} ended: {self._end_cause}",
                self._link.host,
                self._link.port,
            ) from exc

    def _end(self, cause: str) -> None:
        self._end_cause = cause
        self._ended = True
        self._link.close()

    def __repr__(self) -> str:
        state = f"ended: {self._end_cause}" if self._ended else "open"
        return f"<TCPSession {self.id} on {self._link.endpoint}, {self.timeout:g} s, {state}>"
