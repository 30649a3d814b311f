"""A process's copy of a small family of keys written once each, kept by one watch.

Every node of a job waits for the same few keys: the outcomes of its run's
rounds, one small value per round. Waiting for one alone costs etcd a read,
then a watch's create and cancel; a node alone in its process (one agent per
host) pays that every round. A mirror of the family instead reads it once and
watches it from the revision after, for as long as the process needs it: every
later wait for a key of the family is answered from memory, with no request.

The read rides on a transaction the store sends anyway where it can (the
node's join), so a mirror costs one watch create per process and cluster. It
lives while a handle that asked for it is open: the last to close cancels
its watch.

Only families whose keys are written once belong in a mirror: a wait answered
from it may see a value up to one watch event old. A mirror whose watch ends
(its member died, or compacted past it) stops serving; the next wait starts
it again with a read and a watch, and a wait in between goes the usual way.
A family too large (more than :data:`MAX_KEYS` keys, or :data:`MAX_BYTES` of
keys and values: others wrote them) is not mirrored, or no longer.
"""

from __future__ import annotations

import base64
import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from tp_rdzv_etcd.client.gateway import Json, TlsFiles
from tp_rdzv_etcd.client.per_process import PerProcess
from tp_rdzv_etcd.client.watch_stream import StreamBroken, Watch
from tp_rdzv_etcd.endpoints import Endpoint

log = logging.getLogger(__name__)

#: The most keys a mirror holds; a larger family is waited for key by key.
MAX_KEYS = 4096
#: The most bytes of keys and values a mirror holds.
MAX_BYTES = 8 * 1024 * 1024
#: How long the watch's reader waits for events before it looks again (it stops only
#: when the watch ends).
_FOLLOW_SLICE = 60.0

#: What :meth:`Mirror.value` returns when the mirror does not serve: wait the usual way.
NOT_SERVING: Final = object()

#: Opens a watch of the family (puts and deletes) from a revision; ``None`` past its deadline.
OpenWatch = Callable[[int], Watch | None]


class _State(enum.Enum):
    IDLE = "idle"  # never started, or its watch ended: the next wait may start it
    STARTING = "starting"  # one thread reads the family and opens the watch
    LIVE = "live"
    TOO_LARGE = "too large"  # never mirrored


class Mirror:
    """The keys under one etcd prefix, as of the last event of this process's watch
    (thread-safe)."""

    def __init__(self, prefix: bytes, end: bytes) -> None:
        self.prefix, self.end = prefix, end
        self._changed = threading.Condition()
        self._state = _State.IDLE
        self._values: dict[bytes, bytes] = {}
        self._bytes = 0  # of the keys and values held
        self._holders = 0  # the open handles that asked for it
        # Which watch feeds it: a reader of an earlier one changes nothing.
        self._generation = 0
        self._watch: Watch | None = None

    def range_request(self) -> Json:
        """The read of the family that starts the mirror (the gateway's shape)."""
        return {
            "key": base64.b64encode(self.prefix).decode("ascii"),
            "range_end": base64.b64encode(self.end).decode("ascii"),
            "limit": str(MAX_KEYS),
        }

    def hold(self) -> None:
        """One more handle asks for the mirror."""
        with self._changed:
            self._holders += 1

    def release(self) -> None:
        """A handle that asked for the mirror closed; the last one stops it."""
        with self._changed:
            self._holders -= 1
            if self._holders > 0:
                return
            watch, self._watch = self._watch, None
            if self._state is _State.LIVE:
                self._generation += 1
                self._settle(_State.IDLE, {})
        if watch is not None:
            watch.cancel()

    def claim_start(self) -> bool:
        """Whether the caller is to start the mirror (then it must call
        :meth:`start` or :meth:`abandon`): true for one caller while it is idle."""
        with self._changed:
            if self._state is not _State.IDLE:
                return False
            self._state = _State.STARTING
            return True

    def start(self, answer: Json, open_watch: OpenWatch) -> None:
        """Fill the mirror from ``answer`` (a range of the family, with its header)
        and follow the family from the revision after it."""
        values = {}
        for kv in answer.get("kvs") or []:
            values[base64.b64decode(kv["key"])] = base64.b64decode(kv.get("value", ""))
        if answer.get("more") or _too_large(len(values), _size(values)):
            self._settle(_State.TOO_LARGE, {})
            return
        revision = int(answer.get("header", {}).get("revision", 0))
        try:
            watch = open_watch(revision + 1)
        except BaseException:
            self.abandon()
            raise
        if watch is None:
            self.abandon()
            return
        with self._changed:
            self._generation += 1
            generation, self._watch = self._generation, watch
            self._settle(_State.LIVE, values)
        threading.Thread(
            target=self._follow, args=(watch, generation), name="tp-etcd-mirror", daemon=True
        ).start()

    def abandon(self) -> None:
        """Give a claimed start up: the mirror is idle again."""
        self._settle(_State.IDLE, {})

    def value(self, key: bytes, deadline: float) -> bytes | object | None:
        """The value of ``key`` once the mirror has it; ``None`` once ``deadline``
        passes; :data:`NOT_SERVING` if the mirror does not serve (or stops)."""
        with self._changed:
            while True:
                if self._state is _State.LIVE:
                    found = self._values.get(key)
                    if found is not None:
                        return found
                elif self._state is not _State.STARTING:
                    return NOT_SERVING
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def _settle(self, state: _State, values: dict[bytes, bytes]) -> None:
        with self._changed:
            self._state, self._values, self._bytes = state, values, _size(values)
            self._changed.notify_all()

    def _fed_by(self, generation: int) -> bool:
        return self._generation == generation and self._state is _State.LIVE

    def _follow(self, watch: Watch, generation: int) -> None:
        """Apply the watch's events until it ends or is stopped; then the mirror is idle."""
        try:
            while self._fed_by(generation):
                events = watch.next_events(time.monotonic() + _FOLLOW_SLICE, _every)
                if events == []:
                    break  # the watch ended: compacted past, refused, or its stream broke
                if events is not None:
                    self._apply(events, generation)
        except StreamBroken:
            pass
        except Exception as exc:  # a malformed answer: the next wait starts it again
            log.warning("the mirror of %r stopped: %s", self.prefix, exc)
        finally:
            watch.cancel()
            with self._changed:
                if self._fed_by(generation):
                    self._watch = None
                    self._settle(_State.IDLE, {})

    def _apply(self, events: list[Json], generation: int) -> None:
        with self._changed:
            if not self._fed_by(generation):
                return
            for event in events:
                kv = event.get("kv") or {}
                key = base64.b64decode(kv.get("key", ""))
                old = self._values.pop(key, None)
                if old is not None:
                    self._bytes -= len(key) + len(old)
                if event.get("type", "PUT") == "PUT":
                    value = self._values[key] = base64.b64decode(kv.get("value", ""))
                    self._bytes += len(key) + len(value)
            if _too_large(len(self._values), self._bytes):
                self._watch = None  # its reader stops, and cancels it
                self._settle(_State.TOO_LARGE, {})
            else:
                self._changed.notify_all()


def _size(values: dict[bytes, bytes]) -> int:
    return sum(len(key) + len(value) for key, value in values.items())


def _too_large(keys: int, size: int) -> bool:
    return keys > MAX_KEYS or size > MAX_BYTES


def _every(events: list[Json]) -> list[Json]:
    return events


_MIRRORS: PerProcess[tuple[tuple[Endpoint, ...], TlsFiles, bytes], Mirror] = PerProcess()


def mirror(endpoints: tuple[Endpoint, ...], tls: TlsFiles, prefix: bytes, end: bytes) -> Mirror:
    """This process's :class:`Mirror` of the keys in ``[prefix, end)`` on the cluster at
    ``endpoints``."""
    return _MIRRORS.get((endpoints, tls, prefix), lambda: Mirror(prefix, end))
