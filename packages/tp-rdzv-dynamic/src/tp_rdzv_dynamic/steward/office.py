"""The steward office: who decides for the run, and the steward thread when it is this node.

Each node has one :class:`StewardOffice`. It reads the lease and takes it over
(compare-and-set from the value last seen) when it is vacant: on a store with
sessions the store deletes the lease the moment its holder's session ends, so
a dead steward's lease is vacant at once. A lease held without a session is
judged on this host's monotonic clock instead, and taken over once it has
stopped moving for the liveness bound. A node's first join may also claim a
missing lease in the same request (:meth:`StewardOffice.claim`), so that in a
job's first round one node takes it and the others need no compare-and-set of
their own. The office re-posts the node's join to
every new steward, and starts and stops the steward thread. That thread holds the lease through a
:class:`~.tenure.Tenure`, which writes every later value of it. No other code writes the
lease (its codec is :class:`~tp_rdzv_dynamic.documents.codecs.Lease`).
"""

from __future__ import annotations

import contextlib
import logging
import threading

from tp_rdzv_api import RendezvousConnectionError
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.documents.codecs import Lease
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.decisions import Join
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings

from .steward import BootstrapHost, Steward
from .tenure import LeaseLost, Tenure

log = logging.getLogger(__name__)


class StewardOffice:
    """This node's view of the steward lease, and its steward thread while it holds it.

    Thread-safe: the agent's thread and the process's scheduler thread (the
    ticks of a waiting node, the deputy's watch between rounds) both use it.

    Args:
        node: this node.
        settings: the run's settings.
        board: the node's board (the steward gets a clone: a connection of its own).
        holder: the state holder the steward's is cloned from.
        bootstrap: hosts the workers' bootstrap store of the rounds this node's
            steward completes with this node in them (see :class:`Steward`).
    """

    def __init__(
        self,
        node: _NodeDesc,
        settings: RendezvousSettings,
        board: RendezvousBoard,
        holder: _RendezvousStateHolder,
        bootstrap: BootstrapHost | None = None,
    ) -> None:
        self._node = node
        self._settings = settings
        self._board = board
        self._holder = holder
        self._bootstrap = bootstrap
        self._bound = settings.liveness_bound.total_seconds()
        self._steward: Steward | None = None
        # The lease's clock: its value as last read, and since when (monotonic) it holds it.
        self._seen = b""
        self._since = 0.0
        self._epoch = -1
        self._lease: Lease | None = None  # as this node last read or took it
        self._posted_epoch = -1  # the epoch of the steward the last join went to
        self._lock = threading.RLock()

    @property
    def running(self) -> bool:
        """Whether this node's steward thread is deciding (it ends when it loses the lease)."""
        steward = self._steward
        return steward is not None and steward.running

    @property
    def lease(self) -> Lease | None:
        """The lease as this node last read or took it (``None`` before its first look)."""
        return self._lease

    def post(self, join: Join) -> None:
        """Post ``join`` to the steward in office."""
        with self._lock:
            self._board.post(join)
            self._posted_epoch = self._epoch

    def watch(self, now: float, rejoin: Join | None = None) -> Lease:
        """Read the lease; take it when vacant, ours without a thread, or frozen too long.

        ``now`` is this host's monotonic time. If a new steward took office
        since ``rejoin`` was last posted, it is posted again: what the old one
        took from the mailbox but did not persist is lost with it (unless it
        took it after the new one took office: then it puts it back). Returns
        the lease as it stands afterwards.
        """
        with self._lock:
            return self._watch(now, rejoin, self._board)

    def claim(self) -> bytes:
        """The lease this node's first join writes if it finds the lease missing
        (:meth:`RendezvousBoard.enter`): what taking it over would write."""
        return self._taken_from(Lease.parse(b""))

    def posted(self, read: Lease, now: float) -> Lease:
        """As :meth:`watch`, for the lease ``read`` in the request that posted this
        node's join, before the post (:meth:`RendezvousBoard.enter`); if that
        request claimed the missing lease, this node takes office."""
        with self._lock:
            if read.raw == self.claim():
                self._note(read, now)
                lease = self._take_office(self._board, read.raw, now)
            else:
                lease = self._watch(now, None, self._board, read)
            # The join went to the steward then in office (or to a later one, which
            # gets it again when seen: a repeat is a no-op); posted while the lease
            # was vacant, it waits in the mailbox for whoever took office since.
            self._posted_epoch = read.epoch if read.holder else self._epoch
            return lease

    def _watch(
        self, now: float, rejoin: Join | None, board: RendezvousBoard, read: Lease | None = None
    ) -> Lease:
        lease = board.read_lease() if read is None else read
        self._note(lease, now)
        mine = lease.holder == self._node.key
        if not lease.holder or (mine and not self.running):
            lease = self._take(board, lease, now)
        elif not mine and not lease.session_held and now - self._since >= self._bound:
            # Held without a session: silent for the liveness bound, its holder is dead
            # or frozen. The holder's own counter is judged within an interval.
            log_event(
                log,
                logging.WARNING,
                "steward_takeover",
                f"steward {lease.holder} silent for {self._settings.liveness_bound}; "
                f"{self._node} takes over",
                run_id=self._board.run_id,
                node=self._node,
                round_=lease.round,
            )
            lease = self._take(board, lease, now, suspect=lease.holder)
        if rejoin is not None and self._posted_epoch != self._epoch:
            self.post(rejoin)
        return lease

    def stop(self, waker: RendezvousBoard | None = None) -> None:
        """Stop this node's steward thread, if any; it hands the lease back vacant."""
        with self._lock:
            if self._steward is not None:
                self._steward.stop(waker=waker or self._board)
                self._steward = None

    def _note(self, lease: Lease, now: float) -> None:
        self._lease = lease
        self._epoch = lease.epoch
        if lease.raw != self._seen:
            self._seen, self._since = lease.raw, now

    def _take(
        self, board: RendezvousBoard, lease: Lease, now: float, suspect: str | None = None
    ) -> Lease:
        """Take over from ``lease`` and start deciding; the lease that holds afterwards.

        ``suspect`` names the holder of a lease taken for its silence.
        """
        desired = self._taken_from(lease)
        held = board.swap_lease(lease.raw, desired)
        if held != desired:
            # Another node was faster: it is the steward now (the answer names it).
            winner = Lease.parse(held)
            self._note(winner, now)
            return winner
        return self._take_office(board, desired, now, suspect)

    def _taken_from(self, lease: Lease) -> bytes:
        """The lease this node writes to take over from ``lease``."""
        return Lease.encode(lease.epoch + 1, self._node.key, 0, lease.round)

    def _take_office(
        self, board: RendezvousBoard, desired: bytes, now: float, suspect: str | None = None
    ) -> Lease:
        """Start deciding under the lease ``desired``, which this node just wrote."""
        self.stop(board)
        board = self._board.clone("the steward's connection")
        tenure = Tenure(board, self._node.key, desired, self._bound)
        # Held through a session from here, not once the steward's thread runs
        # (seconds, in a process of busy threads): the nodes that read the lease
        # from now on wait for its vacancy instead of ticking.
        with contextlib.suppress(LeaseLost, RendezvousConnectionError):
            tenure.hold_through_session()  # else the steward's thread tries, and reports
        steward = Steward(
            self._node,
            self._settings,
            board,
            self._holder.clone(),
            tenure,
            suspect=suspect,
            bootstrap=self._bootstrap,
        )
        steward.start()
        self._steward = steward
        taken = tenure.lease
        self._note(taken, now)
        return taken
