"""Store sessions of a ``HashStore``: in-process presence, ended by ``close()`` or silence.

A session is silent while nothing goes through it (no write, no will, no
``keep_alive``). One daemon thread per store data, alive only while a session
is open, sleeps until the earliest deadline and ends the sessions whose
deadline passed; a session also checks its own deadline whenever it is used,
so it never acts after its timeout even if that thread is late.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import TYPE_CHECKING

from .base import Data, as_bytes
from .errors import SessionExpiredError
from .presence import Presence
from .semantics import compare_set_result
from .session import StoreSession

if TYPE_CHECKING:
    from .hash_store import _SharedData


class HashSession(StoreSession):
    """A :class:`~tp_store.StoreSession` of a :class:`~tp_store.HashStore`."""

    def __init__(self, data: _SharedData, timeout: float) -> None:
        super().__init__(timeout)
        self._data = data
        self._presence = Presence()
        self._last_used = time.monotonic()
        self._end_cause = ""
        with data.lock:
            data.reaper.watch(self)

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` past which the session is over unless used again."""
        return self._last_used + self.timeout

    @property
    def ended(self) -> bool:
        """Whether the session ended (closed, or silent past its timeout)."""
        return self._presence.ended

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, owned by this session."""
        raw_key, raw_value = as_bytes(key, "key"), as_bytes(value)
        data = self._data
        with data.lock:
            self._use()
            data.book.may_own(self._presence, raw_key)
            data.write(raw_key, raw_value)
            data.book.own(self._presence, raw_key)

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``Store.compare_set``; a write it makes leaves ``key`` owned by this session."""
        raw_key = as_bytes(key, "key")
        raw_expected, raw_desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        data = self._data
        with data.lock:
            self._use()
            to_store, result = compare_set_result(
                data.values.get(raw_key), raw_expected, raw_desired
            )
            if to_store is not None:
                data.book.may_own(self._presence, raw_key)
                data.write(raw_key, to_store)
                data.book.own(self._presence, raw_key)
        return result

    def add_will(self, queue: Data, value: Data) -> None:
        """Push ``value`` onto ``queue`` when the session ends."""
        raw_queue, raw_value = as_bytes(queue, "queue"), as_bytes(value)
        with self._data.lock:
            self._use()
            self._data.book.add_will(self._presence, raw_queue, raw_value)

    def keep_alive(self) -> None:
        """Restart the silence timer; ``SessionExpiredError`` if the session ended."""
        with self._data.lock:
            self._use()

    def close(self) -> None:
        """End the session now: its keys are deleted, then its wills pushed."""
        with self._data.lock:
            self.end_locked("closed")

    def end_locked(self, cause: str) -> None:
        """End the session (the store's lock held) for ``cause``, unless it has ended."""
        if not self._presence.ended:
            self._end_cause = cause
            self._data.end(self._presence)

    def _use(self) -> None:
        """Count a use of the session (the store's lock held), unless it is over."""
        now = time.monotonic()
        if not self._presence.ended and now > self.deadline:
            self.end_locked(f"silent for more than its timeout of {self.timeout:g} s")
        if self._presence.ended:
            raise SessionExpiredError(f"the store session ended: {self._end_cause}")
        self._last_used = now

    def __repr__(self) -> str:
        state = f"ended: {self._end_cause}" if self.ended else "open"
        return f"<HashSession timeout={self.timeout:g} s, {state}>"


class SessionReaper:
    """Ends a store's silent sessions: one thread, alive while some session is open.

    Deadlines sit in a heap as they were when last looked at; a session used
    since is put back at its new deadline, so using a session costs a clock
    read and nothing here.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._due = threading.Condition(lock)
        self._heap: list[tuple[float, int, HashSession]] = []
        self._order = itertools.count()  # ties in the heap never compare sessions
        self._running = False

    def watch(self, session: HashSession) -> None:
        """Time ``session`` out (the lock held)."""
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (session.deadline, next(self._order), session))
        if not self._running:
            self._running = True
            threading.Thread(target=self._run, name="tp-store-session-reaper", daemon=True).start()
        elif earliest is None or session.deadline < earliest:
            self._due.notify()

    def _run(self) -> None:
        with self._due:
            heap = self._heap
            while heap:
                deadline, _, session = heap[0]
                if session.ended:
                    heapq.heappop(heap)
                    continue
                now = time.monotonic()
                if session.deadline > now:
                    if session.deadline != deadline:
                        heapq.heapreplace(heap, (session.deadline, next(self._order), session))
                    else:
                        self._due.wait(deadline - now)
                    continue
                heapq.heappop(heap)
                session.end_locked(f"silent for more than its timeout of {session.timeout:g} s")
            self._running = False
