"""Store sessions: ephemeral keys and wills that outlive their writer only briefly.

A :class:`StoreSession` is a client's presence in a store (ZooKeeper's
sessions, etcd's leases). Keys written through it are *owned* by it, and it
holds *wills*: queue pushes the store makes when the session ends. The store
ends a session when its client closes it, when the client's connection closes
(a killed process's sockets are closed by the kernel at once), or when nothing
arrived from the client for ``timeout`` seconds. Then, in this order, every
key the session still owns is deleted and each will is pushed, waking whoever
blocks on its queue: wills are how others learn of a departure (a deletion
wakes nobody, waits are for existence).

Ownership moves: a key written through another session is owned by that one;
a plain write or a delete of the key makes it an ordinary key again.

Open one with :meth:`tp_store.Store.open_session`; stores that cannot offer
sessions raise :class:`~tp_store.UnsupportedOperationError` there.
"""

from __future__ import annotations

import abc
import math
from types import TracebackType
from typing import TypeVar

from tp_store.base import Data, Timeout, UnsupportedOperationError, as_timedelta

_SessionT = TypeVar("_SessionT", bound="StoreSession")

#: The longest session timeout a store accepts (its silence timer must stay a sane number).
MAX_SESSION_TIMEOUT_SECONDS = 30 * 24 * 3600.0
#: The shortest: the wire protocol counts milliseconds.
MIN_SESSION_TIMEOUT_SECONDS = 0.001


def session_timeout_seconds(timeout: Timeout) -> float:
    """``timeout`` in seconds, checked: from 1 ms to 30 days (``ValueError`` otherwise)."""
    seconds = as_timedelta(timeout, "session timeout").total_seconds()
    if not MIN_SESSION_TIMEOUT_SECONDS <= seconds <= MAX_SESSION_TIMEOUT_SECONDS:
        raise ValueError(
            f"session timeout must be from {MIN_SESSION_TIMEOUT_SECONDS} to "
            f"{MAX_SESSION_TIMEOUT_SECONDS:.0f} seconds, got {seconds:g}"
        )
    return seconds


class StoreSession(abc.ABC):
    """A client's presence in a store: ephemeral keys and wills.

    One thread at a time uses a session (as one store handle); ``close`` may
    be called from any thread. After the session ended, every method but
    ``close`` raises :class:`~tp_store.errors.SessionExpiredError`.

    As ``Store.set`` on a network store, ``set`` and ``add_will`` may return
    before the store applied them; ``compare_set``, ``keep_alive`` and
    ``close`` return once it applied everything sent before them.
    """

    def __init__(self, timeout: float) -> None:
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"session timeout must be a positive number, got {timeout!r}")
        #: Seconds of silence after which the store ends the session.
        self.timeout = timeout

    @abc.abstractmethod
    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key`` as a key owned by this session (an ephemeral key)."""

    @abc.abstractmethod
    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``Store.compare_set``; a write it makes leaves the key owned by this session."""

    @abc.abstractmethod
    def add_will(self, queue: Data, value: Data) -> None:
        """When the session ends, push ``value`` onto the queue ``queue`` (after the deletions).

        Wills are pushed in the order they were added.
        """

    def set_with_will(self, key: Data, value: Data, queue: Data, will: Data) -> None:
        """:meth:`set` ``key`` and :meth:`add_will` ``will`` onto ``queue``, as one step.

        One request on a store that can (etcd: one transaction), so that a
        client's presence and the notice of its departure cost one.
        """
        self.set(key, value)
        self.add_will(queue, will)

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
        """:meth:`set_with_will`, a read of ``get``, then ``Store.queue_push(push_onto,
        push)``, as one request.

        Returns what ``get`` held before the push (``None``: it was missing). So
        a client can announce itself, learn the state its request will be read
        in (or one just before), and post the request, in one request. With
        ``claim``, a missing ``get`` is set to ``claim`` in the same request
        (after the read, before the push; a plain key, not the session's), and
        ``claim`` is returned: so the first of many clients that find it
        missing takes it, and the others learn who did, without a request of
        their own. etcd
        does the three as one atomic step (one transaction): no other client's
        write comes between them. A tp-store server gets them in one send and
        applies them in that order, each as it comes: another client's write
        may come between the read and the push.

        Optional: a session that cannot raises
        :class:`~tp_store.errors.UnsupportedOperationError` (the default)
        without doing any of them, and its caller does them one by one.
        """
        raise UnsupportedOperationError(
            f"{type(self).__name__} cannot set, get and push in one request"
        )

    @abc.abstractmethod
    def keep_alive(self) -> None:
        """Tell the store this session is alive (a cheap ping, not a write).

        Raises :class:`~tp_store.errors.SessionExpiredError` once the store
        ended the session.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """End the session now: its keys are deleted, its wills pushed. Idempotent."""

    @property
    @abc.abstractmethod
    def ended(self) -> bool:
        """Whether the session is known, here, to have ended."""

    def __enter__(self: _SessionT) -> _SessionT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
