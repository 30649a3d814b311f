"""Functions the contract tests hand to child processes (as picklable openers).

Children started with the "spawn" method cannot import the test modules (pytest
imports them by path), so what they run lives in this plain module.
"""

from __future__ import annotations

from collections.abc import Callable

from tp_store.base import Store
from tp_store.stores.file_store import FileStore
from tp_store.stores.prefix_store import PrefixStore

StoreOpener = Callable[[], Store]


def open_prefixed(prefix: str, opener: StoreOpener) -> PrefixStore:
    """A ``PrefixStore`` over a new handle from ``opener`` (picklable via ``functools.partial``)."""
    return PrefixStore(prefix, opener())


def exchange_through_file_store(path: str, mine: str, theirs: str) -> tuple[bytes, list[str]]:
    """Open a ``FileStore`` on ``path``, set ``mine``, wait for ``theirs``; return its value
    and the keys this process sees then."""
    with FileStore(path, timeout=60) as store:
        store.set(mine, mine)
        return store.get(theirs), sorted(store.list_keys())
