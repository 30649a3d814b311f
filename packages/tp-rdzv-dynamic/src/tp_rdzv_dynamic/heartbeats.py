"""Heartbeats: one thread per process ticks for every handler in it.

A node heartbeats while it waits for a round (and then also watches the steward
lease) and after it returned from one. A node's own thread doing that would
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
