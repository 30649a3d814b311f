"""Lease keep-alives over etcd's gRPC API: one ``LeaseKeepAlive`` stream per process.

Through the JSON gateway every keep-alive is a request of its own, which
the gateway turns into a gRPC stream opened and closed inside etcd: about
0.7 ms of etcd's CPU each (``benchmarks/etcd_sessions.py``). On one
long-lived gRPC stream a keep-alive is one small message, about half that, and
a burst of them in one write a tenth. So the sessions of a process share a
:class:`LeaseKeeper` per cluster: one HTTP/2 connection, one bidirectional
stream (:mod:`.h2_stream`, which writes a burst at once where grpcio writes
its messages one by one), every lease's keep-alives on it; the answers name
their lease and go to whoever waits for it.

The two messages are tiny (``LeaseKeepAliveRequest``: field 1, the lease ID;
``LeaseKeepAliveResponse``: field 1 a header, 2 the ID, 3 the TTL left), so
they are encoded by :mod:`.messages`, without generated code.

When a stream breaks (its member died, or lost its leader: the stream asks
for one with ``hasleader``), the keep-alives waiting on it fail with the
stream's gRPC status code, and the next one opens a stream on the next
member. Only plain or TLS members without etcd authentication use it; the
gateway serves the rest (and everything when ``h2`` is missing).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tp_rdzv_etcd.endpoints import Endpoint

from . import messages
from .gateway import TlsFiles
from .h2_stream import UNAVAILABLE, GrpcStreamEnded, H2Stream
from .per_process import PerProcess

_METHOD = "/etcdserverpb.Lease/LeaseKeepAlive"
#: Ask the member to end the stream when it has no leader, so the keep-alive goes elsewhere.
_METADATA = (("hasleader", "true"),)


def encode_request(lease: int) -> bytes:
    """A ``LeaseKeepAliveRequest`` for ``lease``."""
    return messages.encode("LeaseKeepAliveRequest", {"ID": lease})


def decode_response(data: bytes) -> tuple[int, int]:
    """``(ID, TTL)`` of a ``LeaseKeepAliveResponse`` (missing fields are 0).

    Raises ``ValueError`` on bytes that are not one.
    """
    answer = messages.decode("LeaseKeepAliveResponse", data)
    return int(answer.get("ID", 0)), int(answer.get("TTL", 0))


class KeepAliveFailed(Exception):
    """A keep-alive got no answer: its stream broke (``code`` is the gRPC status code)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


#: Called with the TTL a keep-alive's answer gave, or the failure that lost it.
Outcome = Callable[[int | None, "KeepAliveFailed | None"], None]


@dataclass
class _Waiter:
    done: threading.Event
    then: Outcome | None = None  # for a keep-alive nobody waits for
    ttl: int | None = None
    error: KeepAliveFailed | None = None

    def settle(self, ttl: int | None, error: KeepAliveFailed | None) -> None:
        self.ttl, self.error = ttl, error
        self.done.set()
        if self.then is not None:
            self.then(ttl, error)


class _Stream:
    """One ``LeaseKeepAlive`` call on one member, and the thread reading its answers."""

    def __init__(self, endpoint: Endpoint, tls: TlsFiles, on_end: Any) -> None:
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._waiting: dict[int, list[_Waiter]] = {}
        self._broken: KeepAliveFailed | None = None
        self.answered = 0.0  # when the last answer came (monotonic)
        self._call = H2Stream(endpoint, tls, _METHOD, _METADATA)
        self._on_end = on_end
        threading.Thread(
            target=self._read, name=f"tp-etcd-keepalive-{endpoint.port}", daemon=True
        ).start()

    def send(self, leases: Sequence[tuple[int, _Waiter]]) -> None:
        """Send a keep-alive of each lease, in one write; its waiter settles with the answer."""
        with self._lock:
            broken = self._broken
            if broken is None:
                for lease, waiter in leases:
                    self._waiting.setdefault(lease, []).append(waiter)
        if broken is not None:
            for _, waiter in leases:
                waiter.settle(None, broken)
            return
        self._call.send([encode_request(lease) for lease, _ in leases])

    def _read(self) -> None:
        failure = KeepAliveFailed(f"etcd {self.endpoint}: the keep-alive stream ended", UNAVAILABLE)
        try:
            for raw in self._call.answers():
                lease, ttl = decode_response(raw)
                with self._lock:
                    self.answered = time.monotonic()
                    waiters = self._waiting.pop(lease, [])
                for waiter in waiters:
                    waiter.settle(ttl, None)
        except ValueError as exc:
            failure = KeepAliveFailed(f"etcd {self.endpoint}: {exc}", UNAVAILABLE)
        except GrpcStreamEnded as exc:
            failure = KeepAliveFailed(
                f"etcd {self.endpoint}: keep-alive stream: {exc.details}", exc.code
            )
        self.close(failure)

    def forget(self, lease: int, waiter: _Waiter, failure: KeepAliveFailed) -> None:
        """Stop waiting for ``waiter``'s answer: it settles with ``failure`` (unless it came)."""
        with self._lock:
            waiting = self._waiting.get(lease, [])
            if waiter not in waiting:
                return  # answered in the meantime
            waiting.remove(waiter)
        waiter.settle(None, failure)

    def close(self, failure: KeepAliveFailed) -> None:
        """End the stream; whoever still waits gets ``failure``."""
        with self._lock:
            if self._broken is not None:
                return
            self._broken = failure
            waiting, self._waiting = self._waiting, {}
        self._call.close()
        for waiters in waiting.values():
            for waiter in waiters:
                waiter.settle(None, failure)
        self._on_end(self)

    @property
    def broken(self) -> bool:
        return self._broken is not None


class LeaseKeeper:
    """Keep-alives of any number of leases of one cluster, on one stream at a time.

    :meth:`keep_alive` waits for its answer. :meth:`renew_soon` does not: its
    keep-alive waits, up to the time it is due, for the others of the process,
    and goes with them in one burst when the first of them falls due. etcd's
    CPU is mostly waking up: a keep-alive in a burst costs it about a third of
    one sent alone, and fewer, larger bursts cost it less still (so keep-alives
    that may wait seconds should).
    """

    def __init__(self, endpoints: Sequence[Endpoint], tls: TlsFiles) -> None:
        self.endpoints = tuple(endpoints)
        self._tls = tls
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._next = 0  # the member the next stream goes to
        self._soon: list[tuple[int, _Waiter]] = []  # keep-alives for the next burst
        self._burst_due_at = math.inf  # when the first of them falls due (monotonic)
        self._burst_due = threading.Condition(self._lock)
        self._flusher: threading.Thread | None = None

    def keep_alive(self, lease: int, timeout: float) -> int:
        """Renew ``lease``; the TTL it has left (0: it is gone).

        Raises:
            KeepAliveFailed: no answer within ``timeout`` seconds, or the stream broke.
        """
        stream = self._current()
        waiter = _Waiter(threading.Event())
        sent = time.monotonic()
        stream.send([(lease, waiter)])
        if not waiter.done.wait(timeout):
            late = KeepAliveFailed(f"etcd {stream.endpoint}: no keep-alive answer in time", 4)
            if stream.answered < sent:
                # Nothing at all came back since: a member that stopped
                # answering. The next keep-alive goes to the next one.
                stream.close(late)
            else:
                # Answers come, only slowly (a loaded member): the stream is kept.
                stream.forget(lease, waiter, late)
            # Settled now, or in a moment by the reader that just took its answer.
            waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.ttl is not None
        return waiter.ttl

    def renew_soon(self, lease: int, then: Outcome, due: float) -> None:
        """Renew ``lease`` by ``due`` (``time.monotonic()``), with the burst of the
        keep-alive due first; ``then(ttl, error)`` gets the answer."""
        with self._lock:
            self._soon.append((lease, _Waiter(threading.Event(), then)))
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush, name="tp-etcd-keepalive-bursts", daemon=True
                )
                self._flusher.start()
            if due < self._burst_due_at:
                self._burst_due_at = due
                self._burst_due.notify()

    def _flush(self) -> None:
        while True:
            with self._lock:
                while (wait := self._burst_due_at - time.monotonic()) > 0:
                    self._burst_due.wait(None if math.isinf(wait) else wait)
                burst, self._soon = self._soon, []
                self._burst_due_at = math.inf
            try:
                stream = self._current()
            except Exception as exc:  # a stream that cannot even start (no thread left)
                failure = KeepAliveFailed(f"etcd: no keep-alive stream: {exc}", UNAVAILABLE)
                for _, waiter in burst:
                    waiter.settle(None, failure)
                continue
            stream.send(burst)

    def _current(self) -> _Stream:
        with self._lock:
            if self._stream is None or self._stream.broken:
                endpoint = self.endpoints[self._next % len(self.endpoints)]
                self._stream = _Stream(endpoint, self._tls, self._ended)
            return self._stream

    def _ended(self, stream: _Stream) -> None:
        """A broken stream sends the next keep-alive to the next member."""
        with self._lock:
            if self._stream is stream:
                self._stream = None
                self._next += 1


_KEEPERS: PerProcess[tuple[tuple[Endpoint, ...], TlsFiles], LeaseKeeper] = PerProcess()


def keeper(endpoints: Sequence[Endpoint], tls: TlsFiles) -> LeaseKeeper:
    """This process's keeper for the cluster at ``endpoints`` (a forked child gets its own)."""
    return _KEEPERS.get((tuple(endpoints), tls), lambda: LeaseKeeper(endpoints, tls))
