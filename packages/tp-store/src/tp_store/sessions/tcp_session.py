"""Store sessions of a ``TCPStore``: the ``SESSION_*`` extension.

A session lives on a connection: a clone of the store's that never
reconnects (``open_session``: a new connection would be a new session on the
server), or the store handle's own (``attach_session``: no connection more;
the handle reconnects for its other calls, but the session's own requests go
on the connection it was opened on, or nowhere). Once that connection breaks
(or a request on it times out, which closes it) the server ends the session,
and every later call raises :class:`~tp_store.errors.SessionExpiredError`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tp_store.base import Data, as_bytes
from tp_store.errors import SessionExpiredError, StoreConnectionError, StoreTimeoutError
from tp_store.protocol import (
    CompareSet,
    Ping,
    QueuePush,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionWill,
)

from .base import StoreSession

if TYPE_CHECKING:
    from tp_store.stores.tcp_store import TCPStore

_T = TypeVar("_T")

#: What a PING on the session's connection carries (any nonce but the extension offer).
_PING_NONCE = os.getpid() & 0x3FFFFF
#: A COMPARE_SET from this to itself reads a key without waiting: it returns the
#: value, or this when the key is missing (and writes nothing unless the key holds it).
_MISSING = b"\xfftp-store: no such key\xff"


class TCPSession(StoreSession):
    """A :class:`~tp_store.StoreSession` of a :class:`~tp_store.TCPStore` on a tp-store server.

    ``link`` is the session's connection, its own or (``attached``) the store
    handle's; ``key_prefix`` what the store puts before user keys. The
    server's session id is :attr:`id`.
    """

    def __init__(
        self, link: TCPStore, timeout: float, key_prefix: bytes, *, attached: bool = False
    ) -> None:
        super().__init__(timeout)
        self._link = link
        self._prefix = key_prefix
        self._attached = attached
        self._end_cause = ""
        self._ended = False
        timeout_ms = max(round(timeout * 1000), 1)
        try:
            self.id = link._request(SessionOpen(timeout_ms).encode(), SessionOpen.reply)
        except BaseException:
            if not attached:
                link.close()
            raise
        # The connection the session lives on (an attached one's handle may reconnect).
        self._connection = link.connections_made
        if attached:
            # Its parked waits send keep-alive frames: never silent for a whole timeout.
            link.attached_session = self

    @property
    def ended(self) -> bool:
        """Whether the session ended: closed, or its connection lost (an attached
        session's handle reconnected for another call: the server ended it)."""
        return self._ended or not self._on_its_connection()

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, owned by this session."""
        request = SessionSet(self._key(key), as_bytes(value)).encode()
        self._call(lambda: self._link._send(request, self._connection))

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``Store.compare_set``; a write it makes leaves ``key`` owned by this session."""
        request = SessionCompareSet(
            self._key(key), as_bytes(expected, "expected"), as_bytes(desired, "desired")
        ).encode()
        return self._call(
            lambda: self._link._request(request, SessionCompareSet.reply, 0, self._connection)
        )

    def add_will(self, queue: Data, value: Data) -> None:
        """Push ``value`` onto ``queue`` when the session ends."""
        request = SessionWill(self._key(queue), as_bytes(value)).encode()
        self._call(lambda: self._link._send(request, self._connection))

    def set_with_will(self, key: Data, value: Data, queue: Data, will: Data) -> None:
        """:meth:`set` and :meth:`add_will`, in one send."""
        request = self._set_with_will_frames(key, value, queue, will)
        self._call(lambda: self._link._send(request, self._connection))

    def _set_with_will_frames(self, key: Data, value: Data, queue: Data, will: Data) -> bytes:
        """The SESSION_SET of ``key`` and the SESSION_WILL onto ``queue``, as sent."""
        return (
            SessionSet(self._key(key), as_bytes(value)).encode()
            + SessionWill(self._key(queue), as_bytes(will)).encode()
        )

    def set_with_will_push_and_get(
        self,
        key: Data,
        value: Data,
        queue: Data,
        will: Data,
        *,
        push_onto: Data,
        push: Data,
        get: Data,
        claim: Data | None = None,
    ) -> bytes | None:
        """:meth:`set_with_will`, a read of ``get`` and the push, in one send and one reply.

        The server applies them in that order, each as it comes: another
        client's write may come between the read and the push. The read is a
        compare-and-set that never matches, or with ``claim`` one from empty
        to ``claim`` (an empty value counts as missing).
        """
        expected, desired = (_MISSING, _MISSING) if claim is None else (b"", as_bytes(claim))
        request = b"".join((
            self._set_with_will_frames(key, value, queue, will),
            CompareSet.frame(self._key(get), expected, desired),
            QueuePush(self._key(push_onto), as_bytes(push)).encode(),
        ))  # fmt: skip
        held = self._call(
            lambda: self._link._request(request, CompareSet.reply, 0, self._connection)
        )
        return None if held == _MISSING else held

    def keep_alive(self) -> None:
        """A PING on the session's connection; ``SessionExpiredError`` once it ended.

        Attached, no PING while another call uses the connection: its frames
        keep the session alive (its waits send one at least every third of
        the timeout).
        """
        request = Ping(_PING_NONCE).encode()
        if self._attached:
            answer = self._call(
                lambda: self._link._request_unless_busy(request, Ping.reply, self._connection)
            )
            if answer is None:
                return
        else:
            answer = self._call(
                lambda: self._link._request(request, Ping.reply, 0, self._connection)
            )
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
        if self._on_its_connection():
            with contextlib.suppress(StoreConnectionError, StoreTimeoutError):
                self._link._request(
                    SessionClose().encode(), SessionClose.reply, 0, self._connection
                )
        self._end("closed")

    def _key(self, key: Data) -> bytes:
        return self._prefix + as_bytes(key, "key")

    def _call(self, request: Callable[[], _T]) -> _T:
        """Run ``request`` on the session's connection; a broken one ends the session."""
        if self._ended:
            raise SessionExpiredError(f"the store session {self.id} ended: {self._end_cause}")
        if not self._on_its_connection():
            self._end("its connection was lost (the store handle reconnected)")
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

    def _on_its_connection(self) -> bool:
        return self._link.connections_made == self._connection

    def _end(self, cause: str) -> None:
        self._end_cause = cause
        self._ended = True
        if not self._attached:
            self._link.close()
        elif self._link.attached_session is self:
            self._link.attached_session = None

    def __repr__(self) -> str:
        state = f"ended: {self._end_cause}" if self._ended else "open"
        return f"<TCPSession {self.id} on {self._link.endpoint}, {self.timeout:g} s, {state}>"
