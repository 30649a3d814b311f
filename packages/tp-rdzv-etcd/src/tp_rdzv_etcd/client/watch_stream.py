"""Watches over gRPC: every watch of a process to one member on one ``Watch`` stream.

A watch on a stream of its own costs etcd a gRPC stream opened and closed (and
the client a thread to feed it); on a shared stream it is two small messages,
a create and a cancel. Each watch names its own ``watch_id`` (etcd 3.4 and
later take the client's), so the stream's one reader thread hands every
answer to the watch it is for.

When the stream breaks (its member died, or lost its leader: the stream asks
for one with ``hasleader``), every watch on it ends early, and the watchers
read again and watch again, on a new stream.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tp_rdzv_etcd.endpoints import Endpoint

from . import messages
from .gateway import Json, TlsFiles
from .per_process import PerProcess
from .request_stream import queued_requests

_WATCH = "/etcdserverpb.Watch/Watch"
#: Ask the member to end the stream when it loses its leader, so watches go elsewhere.
_HAS_LEADER = (("hasleader", "true"),)

#: What a watcher's queue gets: an answer, or ``None`` when the stream ended.
_Answer = Json | None


class StreamBroken(Exception):
    """The shared stream ended before a watch was set up on it: another member may
    serve it. ``reached``: whether the member was connected to at all."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reached = "connect" not in message.lower()


class WatchStream:
    """One ``Watch`` call to one member, shared by the watches of this process."""

    def __init__(self, channel: Any, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._watchers: dict[int, queue.SimpleQueue[_Answer]] = {}
        self._ids = itertools.count(1)
        self._ended: str | None = None
        call = channel.stream_stream(_WATCH)
        self._answers = call(queued_requests(self._requests), metadata=_HAS_LEADER)
        threading.Thread(
            target=self._read, name=f"tp-etcd-watch-{endpoint.port}", daemon=True
        ).start()

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def _read(self) -> None:
        why = "the watch stream ended"
        try:
            for raw in self._answers:
                answer = messages.decode("WatchResponse", raw)
                with self._lock:
                    watcher = self._watchers.get(int(answer.get("watch_id", 0)))
                if watcher is not None:
                    watcher.put(answer)
        except ValueError as exc:
            why = f"a malformed watch answer: {exc}"
        except Exception as exc:  # grpc.RpcError: the stream broke
            details = getattr(exc, "details", None)
            why = f"the watch stream broke: {details() if callable(details) else exc}"
        self.end(why)

    def end(self, why: str) -> None:
        """End the stream; every watch on it ends early."""
        with self._lock:
            if self._ended is not None:
                return
            self._ended = why
            watchers, self._watchers = list(self._watchers.values()), {}
        self._requests.put(None)
        self._answers.cancel()
        for watcher in watchers:
            watcher.put(None)

    def open(self, create_request: Json) -> Watch:
        """A new watch on this stream (``create_request`` in the gateway's shape).

        Raises :class:`StreamBroken` if the stream has ended.
        """
        watcher: queue.SimpleQueue[_Answer] = queue.SimpleQueue()
        with self._lock:
            if self._ended is not None:
                raise StreamBroken(self._ended)
            watch_id = next(self._ids)
            self._watchers[watch_id] = watcher
        request = {"create_request": {**create_request, "watch_id": watch_id}}
        self._requests.put(messages.encode("WatchRequest", request))
        return Watch(self, watch_id, watcher)

    def cancel(self, watch_id: int) -> None:
        """Stop the watch ``watch_id`` (a cancel message, unless the stream ended)."""
        with self._lock:
            mine = self._watchers.pop(watch_id, None) is not None and self._ended is None
        if mine:
            cancel = {"cancel_request": {"watch_id": watch_id}}
            self._requests.put(messages.encode("WatchRequest", cancel))


class Watch:
    """One watch on a :class:`WatchStream`: its answers queue up until read.

    A waiter that gives up at its deadline may keep it (parked) and read on
    later: no event in between is lost, and no new read or watch is needed.
    """

    def __init__(
        self, stream: WatchStream, watch_id: int, answers: queue.SimpleQueue[_Answer]
    ) -> None:
        self._stream = stream
        self._id = watch_id
        self._answers = answers
        self.created = False

    def next_events(
        self, deadline: float, keep: Callable[[list[Json]], list[Json]]
    ) -> list[Json] | None:
        """The next events that ``keep`` keeps; ``None`` at the deadline, ``[]`` if the
        watch ended (compacted past its revision, refused, or its stream ended).

        Raises :class:`StreamBroken` when the stream ended before the watch was set up
        (the next member may serve it).
        """
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                answer = self._answers.get(timeout=remaining)
            except queue.Empty:
                return None
            if answer is None:
                if not self.created:
                    raise StreamBroken(self._stream._ended or "the watch stream ended")
                return []
            if answer.get("canceled"):
                return []  # compacted past the revision, or refused
            self.created = True
            events = keep(list(answer.get("events") or []))
            if events:
                return events

    def cancel(self) -> None:
        """Stop the watch."""
        self._stream.cancel(self._id)


_STREAMS: PerProcess[tuple[Endpoint, TlsFiles], WatchStream] = PerProcess(
    stale=lambda stream: stream.ended
)


def shared_stream(
    endpoint: Endpoint, tls: TlsFiles, channel: Callable[[Endpoint, TlsFiles], Any]
) -> WatchStream:
    """This process's watch stream to ``endpoint`` (a new one when the last ended)."""
    return _STREAMS.get((endpoint, tls), lambda: WatchStream(channel(endpoint, tls), endpoint))
