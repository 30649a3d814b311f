"""Waits for a key's value, shared by every thread of a process that waits for it.

The nodes of a job that share a process (an agent's; a benchmark's hundreds)
wait for the same key at the same moment: the outcome of their round. Each
waiting alone costs etcd three messages per node: a read, then a watch's
create and its cancel. Shared, the first waiter reads the key and, if it is
missing, opens a watch from the revision after its read; the waiters that
come while that watch is open join it without a request of their own. The
first put of the key wakes them all and the watch is cancelled: three
messages per process, however many threads waited.

A waiter gives up at its own deadline and leaves the watch to the others;
the last one to leave keeps it open (parked) for the next wait for the key,
so a caller waiting in slices costs one read and one watch in all. At most
:data:`MAX_PARKED` watches stay parked per process and cluster; the oldest
is cancelled.

A waiter that joins a watch gets the first put since the watch's revision,
which may come from before its own call if nobody collected it yet: what a
read made just before would have returned.
"""

from __future__ import annotations

import base64
import collections
import threading
import time
from collections.abc import Callable
from typing import Final

from tp_rdzv_etcd.client.gateway import Json, TlsFiles
from tp_rdzv_etcd.client.per_process import PerProcess
from tp_rdzv_etcd.client.watch_stream import StreamBroken, Watch
from tp_rdzv_etcd.endpoints import Endpoint

#: The most watches a process keeps per cluster for waits to come.
MAX_PARKED = 64

#: A wait that must start again: its watch ended before the key came.
_AGAIN: Final = object()

#: ``(value, revision)``: what a read of the key found (``None`` if missing), and when.
Read = Callable[[], tuple[bytes | None, int]]
#: Opens a watch of the key's puts from a revision; ``None`` once the deadline passed.
OpenWatch = Callable[[int], Watch | None]


class _KeyWait:
    """The process's wait for one key: the watch (once opened) and its result."""

    def __init__(self, lock: threading.Lock) -> None:
        self.changed = threading.Condition(lock)
        self.watch: Watch | None = None
        self.reading = False  # a waiter is reading the watch for everyone
        self.waiters = 0
        self.over = False  # the value came, or the watch ended: later waiters start anew
        self.value: bytes | None = None


class SharedWaits:
    """The key waits of one process on one cluster (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[bytes, _KeyWait] = {}
        self._parked: collections.OrderedDict[bytes, _KeyWait] = collections.OrderedDict()

    def value(self, key: bytes, deadline: float, read: Read, open_watch: OpenWatch) -> bytes | None:
        """The value of the etcd ``key`` once it exists; ``None`` once ``deadline`` passes.

        ``read`` and ``open_watch`` are called by the first waiter only.
        Their errors reach that waiter; the others start again.
        """
        while True:
            wait, first = self._join(key)
            try:
                if first:
                    self._start(key, wait, read, open_watch)
                found = self._await(key, wait, deadline)
            finally:
                self._leave(key, wait)
            if found is not _AGAIN:
                assert found is None or isinstance(found, bytes)
                return found
            if time.monotonic() >= deadline:
                return None

    def _join(self, key: bytes) -> tuple[_KeyWait, bool]:
        with self._lock:
            wait = self._waits.get(key)
            first = wait is None
            if wait is None:
                wait = self._waits[key] = _KeyWait(self._lock)
            self._parked.pop(key, None)
            wait.waiters += 1
            return wait, first

    def _start(self, key: bytes, wait: _KeyWait, read: Read, open_watch: OpenWatch) -> None:
        """Read the key; if it is missing, open the watch that every waiter reads."""
        try:
            value, revision = read()
            watch = None if value is not None else open_watch(revision + 1)
        except BaseException:
            self._finish(key, wait, None)
            raise
        if watch is None:
            self._finish(key, wait, value)  # found; or no watch before the deadline
            return
        with wait.changed:
            wait.watch = watch
            wait.changed.notify_all()

    def _await(self, key: bytes, wait: _KeyWait, deadline: float) -> bytes | object | None:
        """The value, ``_AGAIN`` if the wait must start over, ``None`` at the deadline."""
        while True:
            with wait.changed:
                while True:
                    if wait.over:
                        return wait.value if wait.value is not None else _AGAIN
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    if wait.watch is not None and not wait.reading:
                        wait.reading, watch = True, wait.watch
                        break
                    wait.changed.wait(remaining)
            # This waiter reads for everyone until the key comes or its deadline.
            try:
                events = watch.next_events(deadline, _puts_of(key))
            except StreamBroken:
                events = []  # the watch never started: read again, on another member
            except BaseException:
                with wait.changed:
                    wait.reading = False
                    wait.changed.notify_all()
                raise
            if events is None:
                with wait.changed:
                    wait.reading = False
                    wait.changed.notify_all()  # another waiter reads on
                continue
            self._finish(key, wait, _value_in(events, key))

    def _finish(self, key: bytes, wait: _KeyWait, value: bytes | None) -> None:
        """End ``wait`` with ``value`` (``None``: its waiters start again)."""
        with self._lock:
            watch = self._end(key, wait, value)
        if watch is not None:
            watch.cancel()

    def _end(self, key: bytes, wait: _KeyWait, value: bytes | None) -> Watch | None:
        """End ``wait`` (the lock held): no waiter joins it from now on; its watch, to cancel."""
        if wait.over:
            return None
        wait.over, wait.value = True, value
        if self._waits.get(key) is wait:
            del self._waits[key]
        self._parked.pop(key, None)
        watch, wait.watch = wait.watch, None
        wait.changed.notify_all()
        return watch

    def _leave(self, key: bytes, wait: _KeyWait) -> None:
        """The last waiter to leave an open watch parks it; the oldest parked goes."""
        cancelled: list[Watch | None] = []
        with self._lock:
            wait.waiters -= 1
            if wait.waiters or wait.over:
                return
            self._parked[key] = wait
            while len(self._parked) > MAX_PARKED:
                cancelled.append(self._end(*self._parked.popitem(last=False), None))
        for watch in cancelled:
            if watch is not None:
                watch.cancel()


def _puts_of(key: bytes) -> Callable[[list[Json]], list[Json]]:
    def keep(events: list[Json]) -> list[Json]:
        return [event for event in events if _put_value(event, key) is not None]

    return keep


def _put_value(event: Json, key: bytes) -> bytes | None:
    """The value ``event`` puts at ``key``; ``None`` for another key (or a delete)."""
    kv = event.get("kv")
    if event.get("type", "PUT") != "PUT" or not isinstance(kv, dict):
        return None
    if base64.b64decode(kv.get("key", "")) != key:
        return None
    return base64.b64decode(kv.get("value", ""))


def _value_in(events: list[Json], key: bytes) -> bytes | None:
    """The first value put at ``key`` in ``events``; ``None`` if none (the watch ended)."""
    for event in events:
        value = _put_value(event, key)
        if value is not None:
            return value
    return None


_WAITS: PerProcess[tuple[tuple[Endpoint, ...], TlsFiles], SharedWaits] = PerProcess()


def shared_waits(endpoints: tuple[Endpoint, ...], tls: TlsFiles) -> SharedWaits:
    """This process's :class:`SharedWaits` for the cluster at ``endpoints``."""
    return _WAITS.get((endpoints, tls), SharedWaits)
