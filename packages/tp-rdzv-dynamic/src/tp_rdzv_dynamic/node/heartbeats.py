"""Keep-alive ticks: one thread per process ticks for every handler in it.

A node keeps its presence alive (a ping of its presence session; on a store
without sessions, a heartbeat counter) while it waits for a round, when it
also watches the steward lease, and after it returned from one. A node's own thread doing that would
wake, cancel its wait for the outcome and wait again at every tick; a thread
per node and per round would start thousands of threads at the end of every
round of a process that simulates thousands of nodes; and threads started
together tick together: every interval a herd. Here one daemon thread keeps a
schedule; each handler's first tick falls at a random point of its interval, so
ticks stay spread however many nodes started or returned at once, and a
waiting node's thread stays parked on its outcome.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable

from tp_rdzv_api import RendezvousError
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.decisions import Join
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.steward.office import StewardOffice

from .presence import NodePresence
from .shared import TICK_BOARDS

log = logging.getLogger(__name__)


class HeartbeatScheduler:
    """Calls every registered ``beat`` once per its interval, on one thread.

    A beat runs on the scheduler's thread, so it must not block for long:
    a beat that does (a store that stopped answering) delays the others of
    this process until its store call times out.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int]] = []  # (when, ticket), a heap
        self._beats: dict[int, tuple[Callable[[], None], float]] = {}
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def start(self, beat: Callable[[], None], interval: float, first: float | None = None) -> int:
        """Call ``beat`` every ``interval`` seconds; returns the ticket for :meth:`stop`.

        The first call comes after ``first`` seconds, by default at a random
        point of the first interval.
        """
        delay = interval * random.random() if first is None else first
        with self._changed:
            ticket = next(self._tickets)
            self._beats[ticket] = (beat, interval)
            heapq.heappush(self._due, (time.monotonic() + delay, ticket))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tp-rdzv-heartbeats", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        return ticket

    def stop(self, ticket: int) -> None:
        """No more beats for ``ticket`` (one under way finishes)."""
        with self._changed:
            self._beats.pop(ticket, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                beat = self._next_beat()
            try:
                beat()
            except Exception:  # a bug in one beat must not stop every node's heartbeats
                log.exception("a heartbeat failed")

    def _next_beat(self) -> Callable[[], None]:
        """Wait for the next beat that is due and schedule the one after (lock held)."""
        while True:
            while not self._due:
                self._changed.wait()
            when, ticket = self._due[0]
            registered = self._beats.get(ticket)
            if registered is None:
                heapq.heappop(self._due)
                continue
            now = time.monotonic()
            if when > now:
                self._changed.wait(when - now)
                continue
            beat, interval = registered
            # On its own schedule; one that fell behind skips what it missed
            # instead of catching up in a burst.
            after = when + interval
            heapq.heapreplace(self._due, (after if after > now else now + interval, ticket))
            return beat


#: The scheduler of this process.
HEARTBEATS = HeartbeatScheduler()
# A forked child has none of its parent's threads: it starts its own.
os.register_at_fork(after_in_child=HEARTBEATS._reset)


class Heartbeats:
    """A node's keep-alive, every ``interval`` seconds: ``beat`` on the scheduler's thread.

    ``beat`` pings the node's presence session (then it runs from the node's
    first rendezvous to its shutdown), or, on a store without sessions, moves
    its heartbeat counter while its round runs.
    """

    def __init__(
        self, run_id: str, node: _NodeDesc, interval: float, beat: Callable[[], None]
    ) -> None:
        self._run_id = run_id
        self._node = node
        self._interval = interval
        self._beat_once = beat
        self._ticket: int | None = None
        self._round = 0

    def start(self, round_: int) -> None:
        """Beat, for the nodes of ``round_`` (it names the round in its log records)."""
        self._round = round_
        if self._ticket is None:
            self._ticket = HEARTBEATS.start(self._beat, self._interval)

    def stop(self) -> None:
        """Stop beating (one under way finishes)."""
        if self._ticket is not None:
            HEARTBEATS.stop(self._ticket)
            self._ticket = None

    def _beat(self) -> None:
        try:
            self._beat_once()
        except RendezvousError as exc:
            _warn(self._run_id, self._node, self._round, f"heartbeat failed: {exc}")


class JoinTicks:
    """A waiting node's ticks, from the scheduler's thread on a board of their own.

    Each tick: the lease (taken over if vacant, or if its steward went silent
    on a store without sessions), and the join posted again to a new
    steward, or to the steward in office if this node was found gone: its
    presence session ended and was renewed, or (without sessions) its
    heartbeat counter, which each tick moves, went down (a steward reset it).
    The node's own thread stays
    parked in one wait for its outcome meanwhile; it used to wake every tick,
    cancel that wait, do the same and wait again, and hundreds of node threads
    of a process doing so fought for the GIL.

    Args:
        board: the node's board; the ticks use a clone of it (at the first tick),
            shared with the other nodes of the run in this process.
        node: this node.
        office: the node's steward office (used from the ticks only while waiting).
        interval: the keep-alive interval.
        presence: the node's presence (its pings are the heartbeats' job).
    """

    def __init__(
        self,
        board: RendezvousBoard,
        node: _NodeDesc,
        office: StewardOffice,
        interval: float,
        presence: NodePresence,
    ) -> None:
        self._node_board = board
        self._node = node
        self._office = office
        self._interval = interval
        self._presence = presence
        self._board: RendezvousBoard | None = None
        self._lock = threading.Lock()  # the join asked for, and the office while a tick uses it
        self._join: Join | None = None
        # The heartbeat counter as this node last saw it, or its presence's renewals.
        self._counter = 0
        self._ticket: int | None = None

    def start(self, join: Join, counter: int | None) -> None:
        """Tick while ``join`` waits, the heartbeat ``counter`` as the node last saw it
        (``None``: the node is present through a session); the first tick at a random
        point of the second half of the interval, so that nodes that started together
        tick apart."""
        with self._lock:
            self._join = join
            self._counter = self._presence.renewals if counter is None else counter
        self._ticket = HEARTBEATS.start(
            self._tick, self._interval, first=self._interval * random.uniform(0.5, 1.0)
        )

    def ask(self, join: Join) -> None:
        """The node now waits for ``join`` (a later round): posted again with it."""
        with self._lock:
            self._join = join

    def stop(self) -> None:
        """No more ticks; returns once one under way is done with the office."""
        if self._ticket is not None:
            HEARTBEATS.stop(self._ticket)
            self._ticket = None
        with self._lock:
            self._join = None

    def close(self) -> None:
        """Done with the ticks' connection (the process's last node closes it)."""
        if self._board is not None:
            TICK_BOARDS.release(self._board)
            self._board = None

    def _tick(self) -> None:
        round_ = -1
        try:
            if self._board is None:
                self._board = TICK_BOARDS.acquire(self._node_board)
            board = self._board
            present = self._presence.offered
            counter = self._presence.renewals if present else board.beat(self._node)
            with self._lock:
                if self._join is None:
                    return  # the node has its outcome, or gave up
                round_ = self._join.round
                found_dead = counter != self._counter if present else counter <= self._counter
                self._counter = counter
                self._office.watch(time.monotonic(), rejoin=self._join, board=board)
                if found_dead:
                    self._rejoin(self._join, board)
        except RendezvousError as exc:
            # The node's own wait meets the same store, and fails or times out.
            _warn(self._node_board.run_id, self._node, round_, f"a tick failed: {exc}")

    def _rejoin(self, join: Join, board: RendezvousBoard) -> None:
        """Post ``join`` again: the steward found this node dead and dropped it."""
        log_event(
            log,
            logging.WARNING,
            "rejoining",
            f"{self._node} was found gone while it waited; it joins again",
            run_id=board.run_id,
            node=self._node,
            round_=join.round,
        )
        self._office.post(join, board)


def _warn(run_id: str, node: _NodeDesc, round_: int, message: str) -> None:
    log_event(
        log, logging.WARNING, "heartbeat_failed", message, run_id=run_id, node=node, round_=round_
    )
