"""A store server's store sessions: their records, silence timers and counters.

Each open session has one timer on the event loop. A frame arriving on its
connection only stores ``time.monotonic()`` in the record (the connection
does, on every receive); the timer, when it fires, re-arms itself for what is
left of the timeout since that time, or ends the session when nothing is.
So a session costs one timer per timeout period, not one per frame.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

from .presence import Presence
from .protocol.stats import SessionStats
from .protocol.store_sessions import EndCause, SessionHandle
from .state import StoreState

log = logging.getLogger("tp_store.server")


class SessionRecord:
    """An open store session on a server."""

    __slots__ = ("expired", "id", "last_frame", "presence", "timeout", "timer")

    def __init__(self, session_id: int, timeout: float, expired: Callable[[str], None]) -> None:
        self.id = session_id
        self.timeout = timeout
        self.presence = Presence()
        self.last_frame = time.monotonic()
        #: Closes its connection once the session ended for silence.
        self.expired = expired
        self.timer: asyncio.TimerHandle | None = None


class SessionTable:
    """The store sessions of one server (a :class:`~tp_store.protocol.store_sessions.SessionHost`).

    Used from the event loop's thread only, as the state it ends sessions in.
    """

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self._ids = itertools.count(1)
        self.open_sessions = 0
        self.opened = 0
        self._ended = dict.fromkeys(EndCause, 0)

    def open(self, timeout: float, expired: Callable[[str], None]) -> SessionRecord:
        """Open a session, ended after ``timeout`` seconds without a frame."""
        record = SessionRecord(next(self._ids), timeout, expired)
        record.timer = asyncio.get_running_loop().call_later(timeout, self._check, record)
        self.opened += 1
        self.open_sessions += 1
        return record

    def end(self, handle: SessionHandle, cause: EndCause) -> None:
        """End a session: its keys deleted, then its wills pushed (once)."""
        assert isinstance(handle, SessionRecord)
        if handle.presence.ended:
            return
        if handle.timer is not None:
            handle.timer.cancel()
            handle.timer = None
        self._state.end_presence(handle.presence)
        self.open_sessions -= 1
        self._ended[cause] += 1
        log.debug(
            "store session %d ended (%s)",
            handle.id,
            cause.value,
            extra={"action": "session_end", "reason": cause.value},
        )

    def _check(self, record: SessionRecord) -> None:
        """The timer of ``record``: re-armed for the rest of its timeout, or the end."""
        record.timer = None
        if record.presence.ended:
            return
        left = record.last_frame + record.timeout - time.monotonic()
        if left > 0:
            record.timer = asyncio.get_running_loop().call_later(left, self._check, record)
            return
        self.end(record, EndCause.EXPIRED)
        record.expired(
            f"its store session {record.id} received nothing for more than its timeout "
            f"of {record.timeout:g} s"
        )

    def stats(self) -> SessionStats:
        """The counters, as STATS reports them."""
        ended = self._ended
        return {
            "sessions_open": self.open_sessions,
            "sessions_opened": self.opened,
            "sessions_ended_closed": ended[EndCause.CLOSED],
            "sessions_ended_disconnected": ended[EndCause.DISCONNECTED],
            "sessions_ended_expired": ended[EndCause.EXPIRED],
        }
