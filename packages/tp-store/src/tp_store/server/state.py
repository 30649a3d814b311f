"""The data a store server holds, and its waiters, without any I/O.

The server's connections call these methods from one thread (the event
loop); blocked clients are :class:`Waiter` objects whose ``wake`` callback
the I/O layer supplies. Keeping this apart from the sockets lets the rules be
tested directly and shared by every transport.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from tp_store.errors import StoreLimitError
from tp_store.semantics import INT64_MAX, INT64_MIN, compare_set_result, counter_after_add
from tp_store.sessions.presence import Presence, PresenceBook


class Waiter:
    """A client blocked until a set of keys all exist (WAIT, WAIT_GET, queue pops), or
    until one of them does (WAIT_ANY: :meth:`StoreState.park_any`)."""

    __slots__ = ("any_of", "keys", "missing", "wake")

    def __init__(
        self, keys: Sequence[bytes], wake: Callable[[Waiter], None], any_of: bool = False
    ) -> None:
        self.keys = keys
        self.missing = 0
        self.wake = wake
        #: Woken by the first of its keys (WAIT_ANY), and by every push onto it.
        self.any_of = any_of


class BarrierWaiter:
    """A client blocked in BARRIER until the count at its key reaches ``world_size``."""

    __slots__ = ("key", "wake", "world_size")

    def __init__(self, key: bytes, world_size: int, wake: Callable[[BarrierWaiter], None]) -> None:
        self.key = key
        self.world_size = world_size
        self.wake = wake


class StoreState:
    """Keys, queues and blocked clients of one store server.

    A key "exists" for waiters when it holds a value or a non-empty queue, as
    in PyTorch's server. Waking is count-based: a waiter records how many of
    its keys were missing when it parked and is woken when that many have been
    written, so a write costs O(waiters on that key), never a rescan.

    ``max_keys`` bounds the keys and queued values held together,
    ``max_stored_bytes`` their bytes (a key's and its value's, once per queued
    value), and ``max_value_bytes`` what APPEND may grow a value to: a write
    past any raises :class:`~tp_store.errors.StoreLimitError` and changes nothing.

    Keys written through a store session are owned by it (``book``, bounded by
    ``max_session_keys`` and ``max_session_wills``); a plain write or a delete
    makes a key ordinary again, and :meth:`end_presence` applies a session's end.
    """

    def __init__(
        self,
        max_keys: int | None = None,
        max_value_bytes: int | None = None,
        max_session_keys: int = 1024,
        max_session_wills: int = 1024,
        max_stored_bytes: int | None = None,
    ) -> None:
        self.data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        self._queued = 0  # values in all queues
        #: Bytes of the stored keys and values (a queue's key once per value).
        self.stored_bytes = 0
        self._max_keys = max_keys if max_keys is not None else float("inf")
        self._max_stored_bytes = max_stored_bytes if max_stored_bytes is not None else float("inf")
        self._max_value_bytes = max_value_bytes if max_value_bytes is not None else float("inf")
        # Insertion-ordered dicts used as sets: O(1) removal when a client leaves.
        self._waiters: dict[bytes, dict[Waiter, None]] = {}
        self._barriers: dict[bytes, dict[BarrierWaiter, None]] = {}
        self._watches: dict[bytes, list[Callable[[bytes], bool]]] = {}
        self.book = PresenceBook(max_session_keys, max_session_wills)
        self._owners = self.book.owners  # the same dict, tested on every write

    # -- reads --------------------------------------------------------------
    def exists(self, key: bytes) -> bool:
        """Whether ``key`` holds a value or a non-empty queue."""
        return key in self.data or bool(self._queues.get(key))

    def check(self, keys: Iterable[bytes]) -> bool:
        return all(self.exists(key) for key in keys)

    def get(self, key: bytes) -> bytes:
        """The value of ``key``, or empty bytes when missing (as PyTorch's libuv server)."""
        return self.data.get(key, b"")

    def multi_get(self, keys: Iterable[bytes]) -> list[bytes]:
        data = self.data
        return [data.get(key, b"") for key in keys]

    def num_keys(self) -> int:
        return len(self.data)

    def list_keys(self) -> list[bytes]:
        return list(self.data)

    def queue_len(self, key: bytes) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue else 0

    # -- writes -------------------------------------------------------------
    def set(self, key: bytes, value: bytes) -> None:
        data = self.data
        old = data.get(key)
        if old is None:
            if len(data) + self._queued >= self._max_keys:
                self._refuse_new_entry(key)
            grown = len(key) + len(value)
        else:
            grown = len(value) - len(old)
        if self.stored_bytes + grown > self._max_stored_bytes:
            self._refuse_bytes(key, grown)
        self.stored_bytes += grown
        data[key] = value
        # As a rule nobody waits, watches or owns keys: truth tests, no lookups.
        if self._waiters or self._watches or self._owners:
            self._written(key, value)

    def add(self, key: bytes, delta: int) -> int:
        data = self.data
        old = data.get(key)
        # The common case, a non-negative counter, without the general checks.
        total = int(old) + delta if old is not None and old.isdigit() else None
        if total is None or not INT64_MIN <= total <= INT64_MAX or type(delta) is not int:
            total = counter_after_add(key, old, delta)
            if old is None and len(data) + self._queued >= self._max_keys:
                self._refuse_new_entry(key)
        value = str(total).encode()
        grown = len(value) - len(old) if old is not None else len(key) + len(value)
        if self.stored_bytes + grown > self._max_stored_bytes:
            self._refuse_bytes(key, grown)
        self.stored_bytes += grown
        data[key] = value
        # As a rule nobody waits, watches or owns keys: truth tests, no lookups.
        if (self._waiters or self._watches or self._owners) and (
            key in self._waiters or key in self._watches or key in self._owners
        ):
            self._written(key, value)
        return total

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        """PyTorch's rule; returns the value held afterwards (``expected`` if left missing)."""
        to_store, result = compare_set_result(self.data.get(key), expected, desired)
        if to_store is not None:
            self.set(key, to_store)
        return result

    def append(self, key: bytes, value: bytes) -> None:
        old = self.data.get(key, b"")
        if len(old) + len(value) > self._max_value_bytes:
            raise StoreLimitError(
                f"APPEND would grow the value of {key!r:.80} to {len(old) + len(value)} bytes, "
                f"over the limit of {self._max_value_bytes}"
            )
        self.set(key, old + value)

    def multi_set(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Store every item, or (over ``max_keys`` or ``max_stored_bytes``) none of them."""
        data = self.data
        final = dict(items)  # a key named twice is stored once, with its last value
        new_keys = 0
        grown = 0
        for key, value in final.items():
            old = data.get(key)
            if old is None:
                new_keys += 1
                grown += len(key) + len(value)
            else:
                grown += len(value) - len(old)
        if new_keys > self._max_keys - len(data) - self._queued:
            raise StoreLimitError(
                f"MULTI_SET of {new_keys} new keys would exceed the limit of "
                f"{self._max_keys} keys and queued values"
            )
        if self.stored_bytes + grown > self._max_stored_bytes:
            raise StoreLimitError(
                f"MULTI_SET of {len(final)} keys would grow the stored keys and values to "
                f"{self.stored_bytes + grown} bytes, over the limit of {self._max_stored_bytes}"
            )
        self.stored_bytes += grown
        for key, value in items:
            data[key] = value
            self._written(key, value)

    def delete(self, key: bytes) -> bool:
        if self._owners:
            self.book.release(key)
        old = self.data.pop(key, None)
        if old is None:
            return False
        self.stored_bytes -= len(key) + len(old)
        return True

    def queue_push(self, key: bytes, value: bytes) -> None:
        if len(self.data) + self._queued >= self._max_keys:
            self._refuse_new_entry(key)
        if self.stored_bytes + len(key) + len(value) > self._max_stored_bytes:
            self._refuse_bytes(key, len(key) + len(value))
        self._push(key, value)

    def _push(self, key: bytes, value: bytes) -> None:
        self._queued += 1
        self.stored_bytes += len(key) + len(value)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(value)
        waiters = self._waiters.get(key)
        if not waiters:
            return
        # A WAIT_ANY takes nothing from the queue: every one of them wakes (a
        # session's will tells all who wait for it).
        anyone = [waiter for waiter in waiters if waiter.any_of]
        for waiter in anyone:
            del waiters[waiter]
        # One value can satisfy one popper: count the key in for waiters in
        # arrival order until one of them is complete, and wake only that one.
        while waiters:
            waiter = next(iter(waiters))
            del waiters[waiter]
            waiter.missing -= 1
            if waiter.missing == 0:
                waiter.wake(waiter)
                break
        if not waiters:
            self._waiters.pop(key, None)
        for waiter in anyone:
            waiter.missing = 0
            waiter.wake(waiter)  # which unparks it from its other keys

    def queue_pop(self, key: bytes) -> tuple[int, bytes | None]:
        """The queue length before the pop, and the popped value (None if empty)."""
        queue = self._queues.get(key)
        if not queue:
            return 0, None
        length = len(queue)
        value = queue.popleft()
        self._queued -= 1
        self.stored_bytes -= len(key) + len(value)
        if not queue:
            del self._queues[key]
        return length, value

    # -- store sessions -------------------------------------------------------
    def session_set(self, presence: Presence, key: bytes, value: bytes) -> None:
        """SET through a store session: ``key`` is owned by ``presence`` afterwards."""
        self.book.may_own(presence, key)
        self.set(key, value)
        self.book.own(presence, key)

    def session_compare_set(
        self, presence: Presence, key: bytes, expected: bytes, desired: bytes
    ) -> bytes:
        """COMPARE_SET through a store session: a write it makes is owned by ``presence``."""
        to_store, result = compare_set_result(self.data.get(key), expected, desired)
        if to_store is not None:
            self.session_set(presence, key, to_store)
        return result

    def end_presence(self, presence: Presence) -> None:
        """A store session ended: delete the keys it owns, then push its wills.

        Deleting wakes nobody (waits are for existence); each will's push wakes
        its queue's waiters. Wills are pushed even at ``max_keys``: each was
        accepted when added, and a session holds a bounded number.
        """
        keys, wills = self.book.end(presence)
        data = self.data
        for key in keys:
            self.stored_bytes -= len(key) + len(data.pop(key))
        for queue, value in wills:
            self._push(queue, value)

    # -- blocking -----------------------------------------------------------
    def park(self, waiter: Waiter) -> bool:
        """Register ``waiter``; True if its keys all exist already (it is not kept)."""
        missing = [key for key in dict.fromkeys(waiter.keys) if not self.exists(key)]
        if not missing:
            return True
        waiter.missing = len(missing)
        for key in missing:
            self._waiters.setdefault(key, {})[waiter] = None
        return False

    def park_missing(self, waiter: Waiter, key: bytes) -> None:
        """Register ``waiter`` of the one ``key``, which does not exist."""
        waiter.missing = 1
        waiters = self._waiters.get(key)
        if waiters is None:
            self._waiters[key] = {waiter: None}
        else:
            waiters[waiter] = None

    def park_any(self, waiter: Waiter) -> None:
        """Register ``waiter`` of keys none of which exists: woken by the first written.

        The wake must :meth:`unpark` it from the other keys.
        """
        waiter.missing = 1
        for key in dict.fromkeys(waiter.keys):
            self._waiters.setdefault(key, {})[waiter] = None

    def first_existing(self, keys: Sequence[bytes]) -> tuple[int, bytes] | None:
        """The index of the first of ``keys`` that exists and its value (empty for a key
        holding a queue only); None when none does."""
        data = self.data
        for index, key in enumerate(keys):
            value = data.get(key)
            if value is not None:
                return index, value
            if self._queues.get(key):
                return index, b""
        return None

    def unpark(self, waiter: Waiter) -> None:
        """Forget a waiter (cancelled, or its connection closed)."""
        for key in dict.fromkeys(waiter.keys):
            waiters = self._waiters.get(key)
            if waiters is not None and waiter in waiters:
                del waiters[waiter]
                if not waiters:
                    del self._waiters[key]

    def barrier(self, waiter: BarrierWaiter) -> bool:
        """Count ``waiter`` in; True if the barrier is complete (everyone is woken)."""
        count = self.add(waiter.key, 1)
        if count < waiter.world_size:
            self._barriers.setdefault(waiter.key, {})[waiter] = None
            return False
        for parked in self._barriers.pop(waiter.key, ()):
            parked.wake(parked)
        return True

    def leave_barrier(self, waiter: BarrierWaiter) -> None:
        """Forget a barrier waiter whose connection closed or cancelled."""
        parked = self._barriers.get(waiter.key)
        if parked is not None and waiter in parked:
            del parked[waiter]
            if not parked:
                del self._barriers[waiter.key]

    def watch(self, key: bytes, callback: Callable[[bytes], bool]) -> None:
        """Call ``callback(value)`` on every write of ``key`` until it returns True.

        Lets the process hosting the server follow a key (``init/``) without polling.
        """
        self._watches.setdefault(key, []).append(callback)
        value = self.data.get(key)
        if value is not None:
            self._run_watches(key, value)

    # -- internals ----------------------------------------------------------
    def _refuse_new_entry(self, key: bytes) -> None:
        raise StoreLimitError(
            f"storing {key!r:.80} would exceed the limit of {self._max_keys} keys and queued values"
        )

    def _refuse_bytes(self, key: bytes, grown: int) -> None:
        raise StoreLimitError(
            f"storing {key!r:.80} would grow the stored keys and values to "
            f"{self.stored_bytes + grown} bytes, over the limit of {self._max_stored_bytes}"
        )

    def _written(self, key: bytes, value: bytes) -> None:
        if key in self._owners:  # a session re-owns what it writes, after this
            self.book.release(key)
        if key in self._waiters:
            self._key_appeared(key)
        if key in self._watches:
            self._run_watches(key, value)

    def _key_appeared(self, key: bytes) -> None:
        waiters = self._waiters.pop(key, None)
        if not waiters:
            return
        for waiter in waiters:
            waiter.missing -= 1
            if waiter.missing == 0:
                waiter.wake(waiter)

    def _run_watches(self, key: bytes, value: bytes) -> None:
        remaining = [callback for callback in self._watches[key] if not callback(value)]
        if remaining:
            self._watches[key] = remaining
        else:
            del self._watches[key]
