"""What the nodes of one run share within one process: the ticks' connection and presence.

A process lives, dies and pauses whole: the kernel closes all its sockets at
once, and SIGSTOP stops all its threads. So the nodes of a run that one
process holds (torchrun runs one per process; a simulation of a large job
runs hundreds) are present through one store session, and their ticks, which
the process's one scheduler thread runs one after the other, use one
connection. A node costs the store server one connection (its own), not three:
at 10,000 nodes over 16 processes the server holds ~10,000 connections
instead of ~30,000, which a 20,000 open-file limit could not hold.

Sharing is keyed by the run, the store server (``endpoint``, when the store
client names one) and the session timeout; a store that names no endpoint
shares nothing (each node has its own, as before).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Hashable

from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_store import StoreError, StoreSession

#: Nodes registered through one session at most (each leaves a key and a will
#: in it; the store allows 1024 of each per session).
MAX_NODES_PER_SESSION = 1000


def sharing_key(board: RendezvousBoard) -> Hashable:
    """What nodes must have in common to share: the run and the store server."""
    endpoint = getattr(board.store, "endpoint", None)
    server: Hashable = endpoint if isinstance(endpoint, str) else ("store", id(board.store))
    return (board.run_id, type(board.store).__name__, server)


class SharedSession:
    """A presence session the nodes of one run in this process are present through.

    Thread-safe. Pings go out at most once per quarter timeout, however many
    nodes ask (each node's tick asks).
    """

    def __init__(self, session: StoreSession, timeout: float) -> None:
        self.session = session
        self._timeout = timeout
        self._lock = threading.Lock()
        self._last_ping = time.monotonic()
        self.registered = 0  # nodes ever present through it
        self.users = 0  # nodes present through it now

    def keep_alive(self) -> None:
        """Ping, unless another node did lately; ``StoreError`` once the session ended."""
        with self._lock:
            now = time.monotonic()
            if self.session.ended or now - self._last_ping >= self._timeout / 4:
                self.session.keep_alive()
                self._last_ping = now


class PresenceSessions:
    """The shared presence sessions of this process, by run, store server and timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[Hashable, SharedSession] = {}

    def acquire(self, board: RendezvousBoard, timeout: float) -> SharedSession | None:
        """A live session to be present through (opened if needed; counted as used);
        ``None`` if the store offers none."""
        key = (sharing_key(board), timeout)
        with self._lock:
            shared = self._current.get(key)
            if shared is None or shared.session.ended or shared.registered >= MAX_NODES_PER_SESSION:
                session = board.open_session(timeout, "the presence session of this process")
                if session is None:
                    return None
                shared = self._current[key] = SharedSession(session, timeout)
            shared.registered += 1
            shared.users += 1
            return shared

    def release(self, shared: SharedSession) -> bool:
        """A node no longer present through ``shared``; the last one out closes it (the
        store then deletes every key it holds and pushes every will). Whether it did."""
        with self._lock:
            shared.users -= 1
            if shared.users > 0:
                return False
            for key, current in list(self._current.items()):
                if current is shared:
                    del self._current[key]
        with contextlib.suppress(StoreError):
            shared.session.close()
        return True


class TickBoards:
    """The one connection per run and store server on which this process's ticks run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._boards: dict[Hashable, tuple[RendezvousBoard, int]] = {}

    def acquire(self, board: RendezvousBoard) -> RendezvousBoard:
        """The ticks' board for ``board``'s run and server (a clone, made once)."""
        key = sharing_key(board)
        with self._lock:
            shared, users = self._boards.get(key, (None, 0))
            if shared is None:
                shared = board.clone("the ticks' connection")
            self._boards[key] = (shared, users + 1)
            return shared

    def release(self, board: RendezvousBoard) -> None:
        """One node done with the ticks' ``board``; the last one closes it."""
        with self._lock:
            for key, (shared, users) in list(self._boards.items()):
                if shared is board:
                    if users > 1:
                        self._boards[key] = (shared, users - 1)
                        return
                    del self._boards[key]
                    break
        board.store.close()


#: This process's shared presence sessions and ticks' connections.
PRESENCE_SESSIONS = PresenceSessions()
TICK_BOARDS = TickBoards()
