"""Functions the contract tests run in child processes.

Children started with the "spawn" method cannot import the test modules (pytest
imports them by path), so what they run lives in this plain module.
"""

from __future__ import annotations

from collections.abc import Callable

from tp_store.base import Store
from tp_store.prefix_store import PrefixStore

StoreOpener = Callable[[], Store]


def open_prefixed(prefix: str, opener: StoreOpener) -> PrefixStore:
    """A ``PrefixStore`` over a new handle from ``opener`` (picklable via ``functools.partial``)."""
    return PrefixStore(prefix, opener())


def add_many(opener: StoreOpener, key: str, count: int) -> list[int]:
    """Open a handle and ``add(key, 1)`` ``count`` times; return every result."""
    with opener() as store:
        return [store.add(key, 1) for _ in range(count)]
