"""``PrefixStore``: a namespace inside another store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from tp_store.base import Data, Store, Timeout, as_bytes
from tp_store.protocol import ServerStats
from tp_store.semantics import check_sequence, key_text
from tp_store.sessions.base import StoreSession


class PrefixStore(Store):
    """A view of ``store`` in which every key ``k`` is stored as ``prefix + "/" + k``.

    The timeout, ``num_keys()`` and ``close()`` are those of the underlying
    store; ``list_keys()`` returns only the keys under the prefix, without it.
    As in PyTorch, the underlying store is called with ``str`` keys (``bytes``
    for a ``bytes`` key) and ``bytes`` values.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if store is None:
            raise ValueError("PrefixStore store argument cannot be None")
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore needs a tp_store.Store, got {type(store).__name__}")
        # The timeout lives in the underlying store, so Store.__init__ is not called.
        self._key_prefix = as_bytes(prefix, "prefix") + b"/"
        self._prefix = key_text(self._key_prefix[:-1])
        try:
            self._text_prefix: str | None = self._key_prefix.decode()
        except UnicodeDecodeError:  # a bytes prefix that is not UTF-8: bytes keys throughout
            self._text_prefix = None
        self._store = store

    @property
    def prefix(self) -> str:
        """The prefix added to every key (without the ``/`` separator)."""
        return self._prefix

    @property
    def underlying_store(self) -> Store:
        """The store that holds the prefixed keys."""
        return self._store

    @property
    def timeout(self) -> timedelta:
        """The default timeout of the underlying store."""
        return self._store.timeout

    def set_timeout(self, timeout: Timeout) -> None:
        """Change the default timeout of the underlying store."""
        self._store.set_timeout(timeout)

    def has_extended_api(self) -> bool:
        """Whether the underlying store supports the extended operations."""
        return self._store.has_extended_api()

    def _key(self, key: Data) -> Data:
        if isinstance(key, str) and self._text_prefix is not None:
            return self._text_prefix + key
        return self._key_prefix + as_bytes(key, "key")

    def _keys(self, keys: Sequence[Data]) -> list[Data]:
        check_sequence(keys, "keys")
        return [self._key(key) for key in keys]

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, waking anyone waiting for it."""
        self._store.set(self._key(key), as_bytes(value))

    def get(self, key: Data) -> bytes:
        """Return the value of ``key``, waiting up to the timeout for it to exist."""
        return self._store.get(self._key(key))

    def wait_get(self, key: Data, timeout: Timeout | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` (default: the store's) for it."""
        return self._store.wait_get(self._key(key), timeout)

    def add(self, key: Data, amount: int) -> int:
        """Add ``amount`` to the decimal counter at ``key`` (missing = 0); return the sum."""
        return self._store.add(self._key(key), amount)

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """Set ``key`` to ``desired`` iff it holds ``expected``; return the value after."""
        return self._store.compare_set(
            self._key(key), as_bytes(expected, "expected"), as_bytes(desired, "desired")
        )

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        """Block until every key exists, or raise ``StoreTimeoutError``."""
        self._store.wait(self._keys(keys), timeout)

    def wait_any(self, keys: Sequence[Data], timeout: Timeout | None = None) -> tuple[int, bytes]:
        """The index of the first of ``keys`` that exists and its value, once one does."""
        return self._store.wait_any(self._keys(keys), timeout)

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key exists, without blocking."""
        return self._store.check(self._keys(keys))

    def delete_key(self, key: Data) -> bool:
        """Delete ``key``; return whether it existed."""
        return self._store.delete_key(self._key(key))

    def num_keys(self) -> int:
        """The number of keys of the whole underlying store, as in PyTorch."""
        return self._store.num_keys()

    def append(self, key: Data, value: Data) -> None:
        """Append ``value`` to the value of ``key``, creating it if missing."""
        self._store.append(self._key(key), as_bytes(value))

    def list_keys(self) -> list[str]:
        """The keys under the prefix, with the prefix removed."""
        start = self._prefix + "/"
        return [key[len(start) :] for key in self._store.list_keys() if key.startswith(start)]

    def multi_get(self, keys: Sequence[Data]) -> list[bytes]:
        """The values of all ``keys``, waiting for all of them to exist."""
        return self._store.multi_get(self._keys(keys))

    def multi_set(self, keys: Sequence[Data], values: Sequence[Data]) -> None:
        """Set every key to its value, in order."""
        check_sequence(values, "values")
        self._store.multi_set(self._keys(keys), [as_bytes(value) for value in values])

    def queue_push(self, key: Data, value: Data) -> None:
        """Push ``value`` onto the queue at ``key``, waking one blocked popper."""
        self._store.queue_push(self._key(key), as_bytes(value))

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        """Pop the oldest value of the queue at ``key`` (see ``Store.queue_pop``)."""
        return self._store.queue_pop(self._key(key), block)

    def queue_pop_many(self, key: Data, count: int) -> list[bytes]:
        """Up to ``count`` of the oldest values of the queue at ``key``, without waiting."""
        return self._store.queue_pop_many(self._key(key), count)

    def queue_len(self, key: Data) -> int:
        """The number of values in the queue at ``key``."""
        return self._store.queue_len(self._key(key))

    def barrier(self, key: Data, world_size: int, timeout: Timeout | None = None) -> None:
        """Block until ``world_size`` callers have reached the barrier ``key``."""
        self._store.barrier(self._key(key), world_size, timeout)

    def server_stats(self) -> ServerStats:
        """The counters of the underlying store's server (the whole server, not the prefix)."""
        return self._store.server_stats()

    def open_session(self, timeout: Timeout) -> StoreSession:
        """A session of the underlying store whose keys and will queues are under the prefix."""
        return _PrefixSession(self._store.open_session(timeout), self._key)

    def attach_session(self, timeout: Timeout) -> StoreSession:
        """A session on the underlying store's connection, keys and will queues under the prefix."""
        return _PrefixSession(self._store.attach_session(timeout), self._key)

    def clone(self) -> PrefixStore:
        """The same prefix over a clone of the underlying store."""
        return PrefixStore(self._prefix, self._store.clone())

    def close(self) -> None:
        """Close the underlying store."""
        self._store.close()

    def __repr__(self) -> str:
        return f"PrefixStore({self._prefix!r}, {self._store!r})"


class _PrefixSession(StoreSession):
    """A session of the underlying store seen through a ``PrefixStore``."""

    def __init__(self, session: StoreSession, key: Callable[[Data], Data]) -> None:
        super().__init__(session.timeout)
        self._session = session
        self._key = key

    @property
    def ended(self) -> bool:
        """Whether the underlying session is known to have ended."""
        return self._session.ended

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under the prefixed ``key``, owned by the session."""
        self._session.set(self._key(key), as_bytes(value))

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``compare_set`` of the prefixed ``key``; a write leaves it owned by the session."""
        return self._session.compare_set(
            self._key(key), as_bytes(expected, "expected"), as_bytes(desired, "desired")
        )

    def add_will(self, queue: Data, value: Data) -> None:
        """Push ``value`` onto the prefixed ``queue`` when the session ends."""
        self._session.add_will(self._key(queue), as_bytes(value))

    def set_with_will(self, key: Data, value: Data, queue: Data, will: Data) -> None:
        """``set_with_will`` of the prefixed ``key`` and ``queue``, as one step below."""
        self._session.set_with_will(
            self._key(key), as_bytes(value), self._key(queue), as_bytes(will)
        )

    def set_with_will_push_and_get(
        self,
        key: Data,
        value: Data,
        queue: Data,
        will: Data,
        *,
        push_onto: Data,
        push: Data,
        get: Data,
        claim: Data | None = None,
    ) -> bytes | None:
        """``set_with_will_push_and_get`` of the prefixed keys, if the underlying session can."""
        return self._session.set_with_will_push_and_get(
            self._key(key),
            as_bytes(value),
            self._key(queue),
            as_bytes(will),
            push_onto=self._key(push_onto),
            push=as_bytes(push),
            get=self._key(get),
            claim=None if claim is None else as_bytes(claim),
        )

    def keep_alive(self) -> None:
        """Keep the underlying session alive."""
        self._session.keep_alive()

    def close(self) -> None:
        """End the underlying session."""
        self._session.close()

    def __repr__(self) -> str:
        return f"<PrefixSession {self._session!r}>"
