"""A node's presence: a store session whose end tells the steward the node is gone.

At its first rendezvous a node opens a store session (timeout: the liveness
bound) on its own store connection, writes its presence key through it
(``present/<node>``, holding a random token of that session) and leaves a
will that pushes ``{"op": "gone", "node": ..., "token": ...}`` into the
mailbox. The session costs the store server no connection more: a node holds
one connection, whatever it does. The process's scheduler thread pings the
session every ``keep_alive_interval`` (a ping is not a store write, and
nobody reads anything per node while a job trains); while the node's own
thread uses the connection (it waits for its round in slices), that thread's
frames keep the session alive instead.

When the process dies the kernel closes its sockets and the store ends the
session at once; when it freezes past the timeout the store ends it then.
Either way the presence key goes and the will wakes the steward. A node that
was only frozen finds its session ended at its next ping: it opens a new one
(a new token, so the steward ignores the old session's departure if it comes
late) and, if it waits for a round, posts its join again.

Stores without sessions (PyTorch's TCPStore, FileStore, most user stores)
keep heartbeat counters instead; :meth:`NodePresence.open` says which.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading

from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import Lease
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.decisions import Join
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_store import StoreError, StoreSession

log = logging.getLogger(__name__)


class NodePresence:
    """This node's presence session, opened once and renewed when the store ends it.

    Thread-safe: the agent's thread opens and closes it, the scheduler's
    thread keeps it alive.

    Args:
        board: the node's board (the session lives on its connection).
        node: this node.
        timeout: the liveness bound, in seconds.
    """

    def __init__(self, board: RendezvousBoard, node: _NodeDesc, timeout: float) -> None:
        self._board = board
        self._node = node
        self._timeout = timeout
        self._lock = threading.Lock()
        self._session: StoreSession | None = None
        self._offered: bool | None = None  # unknown until the first open
        #: How many times the session was replaced after the store ended it.
        self.renewals = 0

    @property
    def offered(self) -> bool:
        """Whether the store offers sessions (false until :meth:`open` found out)."""
        return bool(self._offered)

    @property
    def present(self) -> bool:
        """Whether this node is present through a session now."""
        session = self._session
        return session is not None and not session.ended

    def open(
        self, join: Join | None = None, claim: bytes | None = None
    ) -> tuple[bool, Lease | None]:
        """Be present, if the store offers sessions: whether it does, and the lease
        if ``join`` was posted too.

        On its first call, where the store can, the presence is announced, the
        lease read and ``join`` posted in one request
        (:meth:`RendezvousBoard.enter`), which writes ``claim`` as the lease if
        it is missing. Otherwise
        (present already, no sessions, or a store that cannot) nothing is
        posted, and the lease is ``None``.

        Raises :class:`~tp_rdzv_api.RendezvousConnectionError` if the store failed.
        """
        with self._lock:
            lease = self._open(join, claim) if self._offered is None else None
            return bool(self._offered), lease

    def keep_alive(self) -> None:
        """Ping the session; replace it if the store ended it (and count the renewal).

        A session whose ping fails ended: the store ends a session whose
        connection broke, too. Raises
        :class:`~tp_rdzv_api.RendezvousConnectionError` if a new one cannot be
        opened; the next call tries again.
        """
        with self._lock:
            session = self._session
            if session is not None:
                try:
                    session.keep_alive()
                    return
                except StoreError as exc:
                    self._session = None
                    log_event(
                        log,
                        logging.WARNING,
                        "presence_lost",
                        f"{self._node}'s presence session ended ({exc}); it opens a new one",
                        run_id=self._board.run_id,
                        node=self._node,
                    )
            if self._offered:
                self._open(None, None)
                self.renewals += 1

    def close(self) -> None:
        """End the presence: the store deletes the key and tells the steward the node is gone."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(StoreError):
                session.close()

    def _open(self, join: Join | None, claim: bytes | None) -> Lease | None:
        """Open a session and be present through it, posting ``join`` with it where
        the store can: then the lease read in that step (the lock held)."""
        session = self._board.attach_session(self._timeout, "this node's presence session")
        self._offered = session is not None
        if session is None:
            return None
        # Unique, not secret (whoever can post to the mailbox can post a departure):
        # no system call, which would hand the GIL to another of the process's nodes.
        token = f"{random.getrandbits(128):032x}"
        try:
            lease = (
                None if join is None else self._board.enter(session, self._node, token, join, claim)
            )
            if lease is None:
                self._board.be_present(session, self._node, token)
        except BaseException:
            with contextlib.suppress(StoreError):
                session.close()
            raise
        self._session = session
        return lease
