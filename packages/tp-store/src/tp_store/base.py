"""The ``Store`` interface shared by every key/value store.

The method names, arguments and results are PyTorch's ``c10d::Store``: keys and
values are accepted as ``str`` or ``bytes``, values come back as ``bytes``,
blocking operations honour the store's default timeout unless given one.

As PyTorch's, the base class is not abstract: a store written in Python may
implement only what it needs (``set`` and ``get``, say); the operations it
lacks raise :class:`UnsupportedOperationError` when called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn, TypeVar

from .errors import QueueEmptyError, StoreError
from .semantics import INT64_MAX, check_multi_set, check_sequence, int_argument

if TYPE_CHECKING:
    from .protocol import ServerStats
    from .sessions.base import StoreSession

#: What callers may pass where PyTorch takes a ``timedelta``.
Timeout = timedelta | float | int
#: What callers may pass as a key or a value.
Data = str | bytes

_StoreT = TypeVar("_StoreT", bound="Store")

#: PyTorch's default store timeout.
DEFAULT_TIMEOUT = timedelta(seconds=300)
#: The operations PyTorch calls the extended API (see :meth:`Store.has_extended_api`).
EXTENDED_OPERATIONS = ("append", "multi_get", "multi_set")


def as_timedelta(timeout: Timeout, what: str = "timeout") -> timedelta:
    """Normalise a ``timedelta`` or a number of seconds; reject negatives and NaN."""
    if isinstance(timeout, timedelta):
        value = timeout
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        if isinstance(timeout, float) and not math.isfinite(timeout):
            raise ValueError(f"{what} must be a finite number of seconds, got {timeout!r}")
        try:
            value = timedelta(seconds=timeout)
        except OverflowError:  # also an int too large for a float
            raise ValueError(
                f"{what} must be at most {timedelta.max.total_seconds():.0f} seconds"
            ) from None
    else:
        raise TypeError(f"{what} must be a timedelta or seconds as a number, got {timeout!r}")
    if value < timedelta(0):
        raise ValueError(f"{what} must not be negative, got {value}")
    return value


class UnsupportedOperationError(StoreError, NotImplementedError):
    """The store, or the server behind it, does not offer this operation.

    Raised, for example, by ``server_stats()`` of a store whose server is
    PyTorch's rather than tp-store's.
    """


def as_bytes(data: Data, what: str = "value") -> bytes:
    """Encode a ``str`` as UTF-8; pass ``bytes`` (and bytes-likes) through."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be str or bytes, got {type(data).__name__}")


def as_keys(keys: Sequence[Data]) -> list[bytes]:
    """Encode a list of keys; a lone ``str`` or ``bytes`` is a ``TypeError``."""
    check_sequence(keys, "keys")
    return [as_bytes(key, "key") for key in keys]


class Store:
    """A key/value store with blocking waits, counters, queues and barriers.

    Subclasses override the operations they offer; the others raise
    :class:`UnsupportedOperationError` naming the store and the operation.
    """

    def __init__(self, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        self._timeout = as_timedelta(timeout)
        #: ``timeout`` in seconds, read on every request of a network store.
        self._timeout_seconds = self._timeout.total_seconds()

    # -- configuration -----------------------------------------------------
    @property
    def timeout(self) -> timedelta:
        """The default timeout of blocking operations."""
        return self._timeout

    def set_timeout(self, timeout: Timeout) -> None:
        """Change the default timeout of blocking operations."""
        self._timeout = as_timedelta(timeout)
        self._timeout_seconds = self._timeout.total_seconds()

    def _deadline_seconds(self, timeout: Timeout | None) -> float:
        if timeout is None:
            return self._timeout_seconds
        return as_timedelta(timeout).total_seconds()

    def has_extended_api(self) -> bool:
        """Whether the store implements ``append``, ``multi_get`` and ``multi_set`` itself.

        As in PyTorch, a store that inherits them from this class answers
        ``False`` (the inherited ``multi_get`` and ``multi_set`` still work,
        one ``get`` or ``set`` per key).
        """
        return all(
            getattr(type(self), name) is not getattr(Store, name) for name in EXTENDED_OPERATIONS
        )

    def _unsupported(self, operation: str) -> NoReturn:
        raise UnsupportedOperationError(f"{type(self).__name__} does not implement {operation}()")

    # -- the core operations -----------------------------------------------
    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, waking anyone waiting for it."""
        self._unsupported("set")

    def get(self, key: Data) -> bytes:
        """Return the value of ``key``, waiting up to the timeout for it to exist."""
        self._unsupported("get")

    def add(self, key: Data, amount: int) -> int:
        """Add ``amount`` to the decimal counter at ``key`` (missing = 0); return the sum."""
        self._unsupported("add")

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """Set ``key`` to ``desired`` iff it holds ``expected``; return the value after.

        A missing key with an empty ``expected`` is created; a missing key with a
        non-empty ``expected`` is left missing and ``expected`` is returned.
        """
        self._unsupported("compare_set")

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        """Block until every key exists, or raise ``StoreTimeoutError``."""
        self._unsupported("wait")

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key exists, without blocking."""
        self._unsupported("check")

    def delete_key(self, key: Data) -> bool:
        """Delete ``key``; return whether it existed."""
        self._unsupported("delete_key")

    def num_keys(self) -> int:
        """The number of keys held (including internal ones such as ``init/``)."""
        self._unsupported("num_keys")

    def append(self, key: Data, value: Data) -> None:
        """Append ``value`` to the value of ``key``, creating it if missing.

        A store that does not implement it gets PyTorch's fallback, a
        ``compare_set`` loop, so it needs only ``compare_set``. As in PyTorch,
        two appends racing to add the same bytes to the same value can count
        once: ``compare_set`` answers the winner's value to both.
        """
        if type(self).compare_set is Store.compare_set:
            self._unsupported("append")
        value = as_bytes(value)
        # A read that neither waits nor writes: a missing key answers the nonce.
        nonce = os.urandom(16)
        held = self.compare_set(key, nonce, nonce)
        current = b"" if held == nonce else held
        while True:
            desired = current + value
            held = self.compare_set(key, current, desired)
            if held == desired:
                return
            # Another writer was first: go on from what it left (from empty if
            # it deleted the key: a missing key answers what was expected).
            current = b"" if held == current else held

    def list_keys(self) -> list[str]:
        """The user keys held, as ``str``."""
        self._unsupported("list_keys")

    def queue_push(self, key: Data, value: Data) -> None:
        """Push ``value`` onto the queue at ``key``, waking one blocked popper."""
        self._unsupported("queue_push")

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        """Pop the oldest value of the queue at ``key``.

        With ``block`` it waits up to the timeout for a value; without, an empty
        queue raises ``QueueEmptyError``.
        """
        self._unsupported("queue_pop")

    def queue_len(self, key: Data) -> int:
        """The number of values in the queue at ``key``."""
        self._unsupported("queue_len")

    def queue_pop_many(self, key: Data, count: int) -> list[bytes]:
        """Up to ``count`` of the oldest values of the queue at ``key``, without waiting.

        Fewer when the queue holds fewer; oldest first. An extension of
        PyTorch's API: a reader draining a queue that thousands of writers fill
        pays one round trip for the lot on a ``TCPStore`` (it pipelines the
        pops), not one per value.
        """
        count = int_argument(count, "count", 0)
        values: list[bytes] = []
        while len(values) < count:
            try:
                values.append(self.queue_pop(key, block=False))
            except QueueEmptyError:
                break
        return values

    def clone(self) -> Store:
        """A new handle on the same data, safe to use from another thread."""
        self._unsupported("clone")

    # -- operations with a generic implementation ----------------------------
    def wait_get(self, key: Data, timeout: Timeout | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` (default: the store's) for it.

        An extension of PyTorch's API: ``get`` with its own timeout. Raises
        ``StoreTimeoutError`` if the key does not appear in time.
        """
        self.wait([key], timeout)
        return self.get(key)

    def multi_get(self, keys: Sequence[Data]) -> list[bytes]:
        """The values of all ``keys``, waiting for each of them to exist (``get`` per key)."""
        check_sequence(keys, "keys")
        return [self.get(key) for key in keys]

    def multi_set(self, keys: Sequence[Data], values: Sequence[Data]) -> None:
        """Set every key to its value, in order."""
        check_multi_set(keys, values)
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def barrier(self, key: Data, world_size: int, timeout: Timeout | None = None) -> None:
        """Block until ``world_size`` callers have reached the barrier ``key``."""
        int_argument(world_size, "world_size", 1, INT64_MAX)
        done_key = as_bytes(key, "key") + b"/done"
        if self.add(key, 1) >= world_size:
            self.set(done_key, b"1")
        self.wait([done_key], timeout)

    def wait_any(self, keys: Sequence[Data], timeout: Timeout | None = None) -> tuple[int, bytes]:
        """The index of the first of ``keys`` that exists, and its value, waiting up to
        ``timeout`` (default: the store's) for one to.

        The lowest index wins when several exist; a key holding a queue only
        reads as empty. Raises ``StoreTimeoutError`` if none appears in time.
        An extension of PyTorch's API, offered by :class:`~tp_store.HashStore`,
        :class:`~tp_store.PrefixStore` over a store that offers it, and
        :class:`~tp_store.TCPStore` connected to a tp-store server (one round
        trip); other stores raise :class:`UnsupportedOperationError`.
        """
        raise UnsupportedOperationError(f"{type(self).__name__} does not implement wait_any()")

    def server_stats(self) -> ServerStats:
        """The counters of the store server behind this store (see ``ServerStats``).

        An extension of PyTorch's API, offered by :class:`~tp_store.TCPStore`
        connected to a tp-store server; other stores raise
        :class:`UnsupportedOperationError`.
        """
        raise UnsupportedOperationError(f"{type(self).__name__} has no store server statistics")

    def open_session(self, timeout: Timeout) -> StoreSession:
        """Open a store session: ephemeral keys and wills (see :class:`~tp_store.StoreSession`).

        The store ends it after ``timeout`` (a ``timedelta`` or seconds) of
        silence from the client. An extension of PyTorch's API, offered by
        :class:`~tp_store.HashStore`, :class:`~tp_store.PrefixStore` over a
        store that offers it, and :class:`~tp_store.TCPStore` connected to a
        tp-store server; other stores raise :class:`UnsupportedOperationError`.
        """
        raise UnsupportedOperationError(f"{type(self).__name__} does not offer store sessions")

    def attach_session(self, timeout: Timeout) -> StoreSession:
        """A store session on this handle's own connection, where the store has one.

        A :class:`~tp_store.TCPStore` opens a session on a connection of its
        own; this one costs the server no connection more, and ends when this
        handle's connection does (see :meth:`tp_store.TCPStore.attach_session`).
        Other stores open one as :meth:`open_session` does.
        """
        return self.open_session(timeout)

    # -- lifetime --------------------------------------------------------------
    def close(self) -> None:
        """Release the connection or server this handle owns, if any."""

    def __enter__(self: _StoreT) -> _StoreT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
