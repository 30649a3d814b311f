"""Keep-alive ticks.

Between rounds a node keeps its presence alive (a ping of its presence
session; on a store without sessions, a heartbeat counter): one thread per
process does that for every handler in it (a thread per node and per round
would start thousands of threads at the end of every round of a process that
simulates thousands of nodes). It keeps a schedule; each handler's first
tick falls at a random point of its interval, so ticks stay spread however
many nodes started or returned at once.

While a node waits for a round it also watches the steward lease: its own
thread does that (:class:`JoinTicks`), between slices of its wait on its own
connection, which holds its presence session: a node costs the store server
one connection.
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

log = logging.getLogger(__name__)


#: How late (seconds, and at most a tenth of its interval) a beat may run, so
#: that the thread wakes once for all beats due within it, not once per beat: a
#: process of 500 nodes beating every 5 s would wake it 100 times a second.
_LATE_BY = 0.1


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
            due = (time.monotonic() + delay, ticket)
            heapq.heappush(self._due, due)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tp-rdzv-heartbeats", daemon=True
                )
                self._thread.start()
            elif self._due[0] is due:
                # Only a beat due before all others moves the thread's wake-up: the
                # hundreds that a process of many nodes starts at once wake it once.
                self._changed.notify()
        return ticket

    def stop(self, ticket: int) -> None:
        """No more beats for ``ticket`` (one under way finishes)."""
        with self._changed:
            self._beats.pop(ticket, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                ticket, when, beat, interval = self._next_beat()
            try:
                beat()
            except Exception:  # a bug in one beat must not stop every node's heartbeats
                log.exception("a heartbeat failed")
            with self._changed:
                if ticket in self._beats:
                    # On its own schedule; one that fell behind (or ran long: a
                    # store being reconnected) skips what it missed instead of
                    # catching up in a burst, which would hold the node's
                    # connection from its other callers.
                    now = time.monotonic()
                    after = when + interval
                    heapq.heappush(self._due, (after if after > now else now + interval, ticket))

    def _next_beat(self) -> tuple[int, float, Callable[[], None], float]:
        """Wait for the next beat that is due and take it off the schedule (lock held):
        its ticket, when it was due, the beat and its interval."""
        while True:
            while not self._due:
                self._changed.wait()
            when, ticket = self._due[0]
            registered = self._beats.get(ticket)
            if registered is None:
                heapq.heappop(self._due)
                continue
            beat, interval = registered
            now = time.monotonic()
            if when > now:
                # Woken a little late, it finds the beats due meanwhile due as well.
                self._changed.wait(when - now + min(_LATE_BY, interval / 10))
                continue
            heapq.heappop(self._due)
            return ticket, when, beat, interval


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
    """A waiting node's ticks, run by its own thread between slices of its wait.

    Each tick: the lease (taken over if vacant, or if its steward went silent
    on a store without sessions), and the join posted again to a new
    steward, or to the steward in office if this node was found gone: its
    presence session ended and was renewed, or (without sessions) its
    heartbeat counter, which each tick moves, went down (a steward reset it).
    The first tick falls at a random point of the second half of the
    interval, so that nodes that started together tick apart.

    Where the node is present through a session and the store can wait for
    either of several keys, the node waits for its steward's vacancy too
    (:meth:`vacancy`: the key the session holding the lease pushes when it
    ends) and ticks at once then (:meth:`hurry`); short of that it ticks once
    per liveness bound instead of once per interval: that judges the silence
    of a taker that died before it held the lease through a session, and
    posts again a join lost some other way. The node's connection's frames keep its own session
    alive meanwhile (``TCPStore`` sends them while the wait is parked).

    Args:
        board: the node's board.
        node: this node.
        office: the node's steward office.
        interval: the keep-alive interval.
        presence: the node's presence (its pings are the heartbeats' job).
        bound: the liveness bound.
    """

    def __init__(
        self,
        board: RendezvousBoard,
        node: _NodeDesc,
        office: StewardOffice,
        interval: float,
        presence: NodePresence,
        *,
        bound: float,
    ) -> None:
        self._board = board
        self._node = node
        self._office = office
        self._interval = interval
        self._presence = presence
        self._bound = bound
        self._join: Join | None = None
        # The heartbeat counter as this node last saw it, or its presence's renewals.
        self._counter = 0
        self._due = 0.0  # when the next tick is due (0: at the next look)
        self._scheduled = interval  # the period it was scheduled with

    def start(self, join: Join, counter: int, now: float) -> None:
        """Tick while ``join`` waits: ``counter`` is the heartbeat counter as the node
        last saw it, or (present through a session) its presence's renewals before
        the join was posted."""
        self._join = join
        self._counter = counter
        self._schedule(now)

    def ask(self, join: Join) -> None:
        """The node now waits for ``join`` (a later round): posted again with it."""
        self._join = join

    def stop(self) -> None:
        """No more ticks."""
        self._join = None

    def hurry(self) -> None:
        """Tick at the next look, not an interval later."""
        self._due = 0.0

    def vacancy(self) -> int | None:
        """The epoch whose vacancy key ends the node's wait too (the lease as the node
        last read it); ``None`` when the node learns of its steward's end by
        ticking only."""
        lease = self._office.lease
        if (
            lease is None
            or not lease.holder
            or not self._presence.offered
            or not self._board.waits_for_either
        ):
            return None
        return lease.epoch

    def wait(self, now: float, remaining: float) -> float:
        """How long the node waits before its next tick, at most ``remaining`` seconds."""
        if self._due and self._period() != self._scheduled:
            self._schedule(now)  # the store said it cannot wait for the vacancy
        return max(min(self._due - now, remaining), 0.0)

    def tick_if_due(self, now: float) -> None:
        """Tick, if the interval passed (a tick that fell behind is not caught up)."""
        if self._join is None or now < self._due:
            return
        join = self._join
        try:
            self._tick(join, now)
        except RendezvousError as exc:
            # The node's own wait meets the same store, and fails or times out.
            _warn(self._board.run_id, self._node, join.round, f"a tick failed: {exc}")
        period = self._scheduled = self._period()
        after = self._due + period
        self._due = after if after > now else now + period

    def _schedule(self, now: float) -> None:
        """The next tick from ``now`` on: a look at a random point of the second half of
        the interval, so that nodes that started together tick apart."""
        period = self._scheduled = self._period()
        self._due = now + period * (random.uniform(0.5, 1.0) if period == self._interval else 1)

    def _period(self) -> float:
        """Seconds from one tick to the next under the lease as last read."""
        return self._interval if self.vacancy() is None else self._bound

    def _tick(self, join: Join, now: float) -> None:
        board = self._board
        present = self._presence.offered
        counter = self._presence.renewals if present else board.beat(self._node)
        found_dead = counter != self._counter if present else counter <= self._counter
        self._counter = counter
        self._office.watch(now, rejoin=join)
        if found_dead:
            log_event(
                log,
                logging.WARNING,
                "rejoining",
                f"{self._node} was found gone while it waited; it joins again",
                run_id=board.run_id,
                node=self._node,
                round_=join.round,
            )
            self._office.post(join)


def _warn(run_id: str, node: _NodeDesc, round_: int, message: str) -> None:
    log_event(
        log, logging.WARNING, "heartbeat_failed", message, run_id=run_id, node=node, round_=round_
    )
