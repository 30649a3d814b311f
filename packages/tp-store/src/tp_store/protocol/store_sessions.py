"""The store-session extension (``SESSION_*``) on one connection: its rules, without I/O.

A store session (:class:`tp_store.StoreSession`) lives on a connection of its
own. The rules a server enforces there, each broken one a
:class:`~tp_store.errors.ProtocolError` that closes the connection (which ends
its session):

- the protocol extensions were offered in the handshake PING (as for STATS):
  a PyTorch peer never sends or receives these opcodes;
- ``SESSION_OPEN`` at most once per connection, with a timeout of 1 ms to
  30 days; it is answered with the session's id;
- ``SESSION_SET``, ``SESSION_COMPARE_SET``, ``SESSION_WILL`` and
  ``SESSION_CLOSE`` only while the connection's session is open.

The session ends (:class:`EndCause`) on ``SESSION_CLOSE``, when its
connection closes, or when no byte arrived on the connection for its timeout
(then the server closes the connection too). The I/O layer keeps the open
sessions and their silence timers (:class:`SessionHost`, implemented by
:class:`tp_store.session_table.SessionTable`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from tp_store.errors import ProtocolError

if TYPE_CHECKING:
    from tp_store.presence import Presence

#: The shortest session timeout on the wire, in milliseconds.
MIN_SESSION_TIMEOUT_MS: Final = 1
#: The longest: 30 days (as :data:`tp_store.session.MAX_SESSION_TIMEOUT_SECONDS`).
MAX_SESSION_TIMEOUT_MS: Final = 30 * 24 * 3600 * 1000


class EndCause(enum.Enum):
    """Why a store session ended."""

    #: The client sent SESSION_CLOSE.
    CLOSED = "closed"
    #: Its connection closed (the client closed it, died, or broke a rule).
    DISCONNECTED = "disconnected"
    #: Nothing arrived on its connection for its timeout.
    EXPIRED = "expired"


class SessionHandle(Protocol):
    """What a server keeps of an open store session."""

    #: The id SESSION_OPEN answered.
    id: int
    #: Its owned keys and wills.
    presence: Presence
    #: ``time.monotonic()`` when a byte last arrived on its connection.
    last_frame: float


class SessionHost(Protocol):
    """The server's store sessions: opened, timed and ended by the I/O layer."""

    def open(self, timeout: float, expired: Callable[[str], None]) -> SessionHandle:
        """A new session ended after ``timeout`` seconds of silence; then ``expired(reason)``
        must close its connection."""
        ...

    def end(self, handle: SessionHandle, cause: EndCause) -> None:
        """End the session now: its keys deleted, then its wills pushed (idempotent)."""
        ...


def session_timeout(timeout_ms: int) -> float:
    """SESSION_OPEN's timeout in seconds; ``ProtocolError`` when out of range."""
    if not MIN_SESSION_TIMEOUT_MS <= timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        raise ProtocolError(
            f"SESSION_OPEN timeout of {timeout_ms} ms is outside "
            f"{MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS} ms"
        )
    return timeout_ms / 1000


def check_session_open(
    extended: bool, host: SessionHost | None, opened_before: bool
) -> SessionHost:
    """The host to open a session with, if a SESSION_OPEN may be served now."""
    if not extended:
        raise ProtocolError("SESSION_OPEN sent before the protocol extensions were offered")
    if host is None:
        raise ProtocolError("SESSION_OPEN sent to a server that offers no store sessions")
    if opened_before:
        raise ProtocolError("SESSION_OPEN sent twice on one connection (one session each)")
    return host


def open_session_of(handle: SessionHandle | None, request: str) -> SessionHandle:
    """The connection's open session, which ``request`` (a SESSION_* name) needs."""
    if handle is None:
        raise ProtocolError(f"{request} sent without an open store session")
    return handle
