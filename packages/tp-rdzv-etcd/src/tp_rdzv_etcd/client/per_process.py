"""What a process keeps one of per key (a cluster, a member): shared by its threads.

Channels, stubs, streams, raft terms and waits are shared by every handle of
a process. A forked child inherits the parent's objects but not their
threads or sockets, so each is kept under the process id too: the child
makes its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class PerProcess(Generic[_K, _V]):
    """One object per key and process, made on first use (thread-safe).

    ``stale``: whether a kept object must be made anew (a stream that ended).
    """

    def __init__(self, stale: Callable[[_V], bool] | None = None) -> None:
        self._stale = stale
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, _K], _V] = {}

    def get(self, key: _K, make: Callable[[], _V]) -> _V:
        """This process's object for ``key``, from ``make()`` if there is none (or it is stale)."""
        kept = (os.getpid(), key)
        found = self._kept.get(kept)  # without the lock: the usual case, on every request
        if found is not None and not self._is_stale(found):
            return found
        with self._lock:
            found = self._kept.get(kept)
            if found is None or self._is_stale(found):
                found = self._kept[kept] = make()
            return found

    def _is_stale(self, found: _V) -> bool:
        return self._stale is not None and self._stale(found)
