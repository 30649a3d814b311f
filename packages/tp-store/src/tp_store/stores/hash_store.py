"""``HashStore``: an in-process store, shared by threads through ``clone()``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from tp_store.base import DEFAULT_TIMEOUT, Data, Store, Timeout, as_bytes, as_keys
from tp_store.errors import QueueEmptyError
from tp_store.protocol import Limits
from tp_store.semantics import compare_set_result, counter_after_add, key_text, timeout_error
from tp_store.sessions.base import StoreSession, session_timeout_seconds
from tp_store.sessions.hash_session import HashSession, SessionReaper
from tp_store.sessions.presence import Presence, PresenceBook


class _Queue:
    """The values of one queue, and the condition its blocked poppers wait on."""

    def __init__(self, lock: threading.Lock) -> None:
        self.values: deque[bytes] = deque()
        self.pushed = threading.Condition(lock)


class _SharedData:
    """What every handle of one ``HashStore`` shares.

    One lock guards everything. ``changed`` wakes all key waiters on every
    write; each queue has its own condition so that a push wakes one popper.
    ``book`` knows which keys store sessions own (the default ``Limits``
    bound each session).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.values: dict[bytes, bytes] = {}
        self.queues: dict[bytes, _Queue] = {}
        limits = Limits()
        self.book = PresenceBook(limits.max_session_keys, limits.max_session_wills)
        self.reaper = SessionReaper(self.lock)

    def queue(self, key: bytes) -> _Queue:
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = _Queue(self.lock)
        return queue

    def exists(self, key: bytes) -> bool:
        """Whether ``key`` holds a value or a non-empty queue (as PyTorch's stores)."""
        queue = self.queues.get(key)
        return key in self.values or (queue is not None and bool(queue.values))

    def write(self, key: bytes, value: bytes) -> None:
        """Store ``value`` (the key is nobody's now: a session re-owns what it writes)."""
        self.values[key] = value
        if self.book.owners:
            self.book.release(key)
        self.changed.notify_all()

    def delete(self, key: bytes) -> bool:
        if self.book.owners:
            self.book.release(key)
        return self.values.pop(key, None) is not None

    def push(self, key: bytes, value: bytes) -> None:
        queue = self.queue(key)
        queue.values.append(value)
        queue.pushed.notify()
        # A non-empty queue makes its key exist for wait() and check().
        self.changed.notify_all()

    def end(self, presence: Presence) -> None:
        """End a store session: delete the keys it owns, then push its wills."""
        keys, wills = self.book.end(presence)
        for key in keys:
            del self.values[key]
        for queue, value in wills:
            self.push(queue, value)


class HashStore(Store):
    """An in-process store: thread-safe, and shared between threads via ``clone()``.

    Blocking operations wait on condition variables, never by polling.
    """

    def __init__(self, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        self._data = _SharedData()

    def has_extended_api(self) -> bool:
        """True: ``append`` is native, and ``multi_get`` and ``multi_set`` are ``get`` and
        ``set`` per key."""
        return True

    def clone(self) -> HashStore:
        """A new handle on the same data, with the same default timeout."""
        twin = HashStore(self.timeout)
        twin._data = self._data
        return twin

    def open_session(self, timeout: Timeout) -> StoreSession:
        """A store session on this store's data (see :class:`~tp_store.StoreSession`).

        It ends on ``close()``, or once ``timeout`` passed without a write, a
        will or a ``keep_alive`` through it.
        """
        return HashSession(self._data, session_timeout_seconds(timeout))

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, waking anyone waiting for it."""
        raw_key, raw_value = as_bytes(key, "key"), as_bytes(value)
        with self._data.lock:
            self._data.write(raw_key, raw_value)

    def get(self, key: Data) -> bytes:
        """Return the value of ``key``, waiting up to the default timeout for it."""
        raw_key = as_bytes(key, "key")
        seconds = self._deadline_seconds(None)
        data = self._data
        with data.lock:
            if not data.changed.wait_for(lambda: raw_key in data.values, seconds):
                raise timeout_error([raw_key], seconds)
            return data.values[raw_key]

    def add(self, key: Data, amount: int) -> int:
        """Add ``amount`` to the decimal counter at ``key`` (missing = 0); return the sum."""
        raw_key = as_bytes(key, "key")
        with self._data.lock:
            total = counter_after_add(raw_key, self._data.values.get(raw_key), amount)
            self._data.write(raw_key, str(total).encode())
        return total

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """Set ``key`` to ``desired`` iff it holds ``expected``; return the value after."""
        raw_key = as_bytes(key, "key")
        raw_expected, raw_desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        with self._data.lock:
            to_store, result = compare_set_result(
                self._data.values.get(raw_key), raw_expected, raw_desired
            )
            if to_store is not None:
                self._data.write(raw_key, to_store)
        return result

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        """Block until every key exists, or raise ``StoreTimeoutError`` naming the missing ones."""
        raw_keys = as_keys(keys)
        seconds = self._deadline_seconds(timeout)
        data = self._data
        with data.lock:
            if not data.changed.wait_for(lambda: all(map(data.exists, raw_keys)), seconds):
                raise timeout_error([key for key in raw_keys if not data.exists(key)], seconds)

    def wait_any(self, keys: Sequence[Data], timeout: Timeout | None = None) -> tuple[int, bytes]:
        """The index of the first of ``keys`` that exists and its value, once one does."""
        raw_keys = as_keys(keys)
        if not raw_keys:
            raise ValueError("wait_any needs at least one key")
        seconds = self._deadline_seconds(timeout)
        data = self._data

        def first() -> int | None:
            return next((i for i, key in enumerate(raw_keys) if data.exists(key)), None)

        with data.lock:
            if not data.changed.wait_for(lambda: first() is not None, seconds):
                raise timeout_error(raw_keys, seconds)
            index = first()
            assert index is not None
            return index, data.values.get(raw_keys[index], b"")

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key exists, without blocking."""
        raw_keys = as_keys(keys)
        with self._data.lock:
            return all(map(self._data.exists, raw_keys))

    def delete_key(self, key: Data) -> bool:
        """Delete ``key``; return whether it existed."""
        raw_key = as_bytes(key, "key")
        with self._data.lock:
            return self._data.delete(raw_key)

    def num_keys(self) -> int:
        """The number of keys held (queues are not keys)."""
        with self._data.lock:
            return len(self._data.values)

    def append(self, key: Data, value: Data) -> None:
        """Append ``value`` to the value of ``key``, creating it if missing."""
        raw_key, raw_value = as_bytes(key, "key"), as_bytes(value)
        with self._data.lock:
            self._data.write(raw_key, self._data.values.get(raw_key, b"") + raw_value)

    def list_keys(self) -> list[str]:
        """The keys held, as ``str``."""
        with self._data.lock:
            return [key_text(key) for key in self._data.values]

    def queue_push(self, key: Data, value: Data) -> None:
        """Push ``value`` onto the queue at ``key``, waking one blocked popper."""
        raw_key, raw_value = as_bytes(key, "key"), as_bytes(value)
        with self._data.lock:
            self._data.push(raw_key, raw_value)

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        """Pop the oldest value of the queue at ``key``.

        With ``block`` it waits up to the default timeout (``StoreTimeoutError``);
        without, an empty queue raises ``QueueEmptyError``.
        """
        raw_key = as_bytes(key, "key")
        seconds = self._deadline_seconds(None)
        with self._data.lock:
            queue = self._data.queue(raw_key)
            if not queue.values:
                if not block:
                    raise QueueEmptyError(f"queue {key_text(raw_key)!r} is empty")
                if not queue.pushed.wait_for(lambda: bool(queue.values), seconds):
                    raise timeout_error([raw_key], seconds, "a value in queue")
            return queue.values.popleft()

    def queue_len(self, key: Data) -> int:
        """The number of values in the queue at ``key``."""
        raw_key = as_bytes(key, "key")
        with self._data.lock:
            queue = self._data.queues.get(raw_key)
            return 0 if queue is None else len(queue.values)
