"""Store sessions on etcd: one lease each.

- ``open_session`` grants a lease whose TTL is the session's timeout (whole
  seconds, at least etcd's minimum); ``keep_alive`` renews it through
  ``LeaseKeepAlive``, which the leader serves from memory: nothing is written
  to etcd's log. Through the JSON gateway each keep-alive is a gRPC stream
  opened inside etcd, about 0.7 ms of its CPU; so by default the sessions of
  a process send theirs on one gRPC stream (:mod:`.lease_stream`), about half
  that (``benchmarks/etcd_sessions.py``).
- ``set`` and ``compare_set`` attach what they write to the lease; a later
  write through another session re-attaches the key to that one, a plain
  write or a delete detaches it (etcd's own rules for a put's lease).
- ``close`` revokes the lease; when it expires etcd revokes it itself. Either
  way etcd deletes every key still attached, in one revision.
- Wills are kept in etcd (see :mod:`.wills`) and pushed after that deletion,
  by ``close`` or by whichever ``EtcdStore`` reads or waits on their queue.

etcd renews a lease only on a keep-alive, not on a write; so that a session
that writes but never calls ``keep_alive`` stays alive as on other stores, a
write through it renews the lease first when a third of the TTL has passed
since the last renewal.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from typing import TYPE_CHECKING

from tp_store import SessionExpiredError, StoreConnectionError, StoreError, StoreSession
from tp_store.base import Data, as_bytes
from tp_store.errors import StoreLimitError
from tp_store.protocol import Limits

from .client.gateway import Json, LeaseNotFoundError
from .client.lease_stream import KeepAliveFailed, LeaseKeeper
from .layout import b64, never_created, unb64
from .wills import Will, push_own

if TYPE_CHECKING:
    from .store import EtcdStore

log = logging.getLogger(__name__)

#: gRPC codes of a keep-alive stream's error that mean "not now": no leader yet.
_TRANSIENT_CODES = frozenset({14, 4, 10})
_RETRY_PAUSE = 0.05
#: The shortest wait worth gathering a burst for: a keep-alive due sooner goes at
#: once, awaited.
_MIN_BURST_WAIT = 0.5
#: The shortest TTL whose keep-alives may go unawaited in a burst (see ``_burst_due``).
_MIN_TTL_RENEWED_SOON = 10 * _MIN_BURST_WAIT
#: The longest a keep-alive may wait for its burst, as a part of the TTL.
_BURST_WAIT_OF_TTL = 1 / 3


class EtcdSession(StoreSession):
    """A store session whose presence is the etcd lease ``lease``.

    Made by :meth:`tp_rdzv_etcd.EtcdStore.open_session`, on a handle of its
    own closed with the session (``owns_store``), or by
    :meth:`~tp_rdzv_etcd.EtcdStore.attach_session`, on the caller's handle,
    left open. ``timeout`` is the lease's TTL.
    """

    def __init__(self, store: EtcdStore, lease: int, ttl: int, *, owns_store: bool = True) -> None:
        super().__init__(float(ttl))
        self.lease = lease
        self._store = store
        self._owns_store = owns_store
        self._lock = threading.Lock()
        self._wills: list[Will] = []
        self._numbered = 0  # wills numbered so far (a failed add_will uses up its number)
        self._max_wills = Limits().max_session_wills
        self._ended = False
        self._lease_gone = False  # an unawaited keep-alive's answer said so
        self._renewed = time.monotonic()

    @classmethod
    def grant(cls, store: EtcdStore, timeout: float, *, owns_store: bool = True) -> EtcdSession:
        """A session on a new lease with a TTL of ``timeout`` (rounded up) at least.

        A grant retried after a lost answer may leave an unused lease behind:
        it holds no key, and expires after its TTL.
        """
        asked = time.monotonic()
        answer = store._call("/v3/lease/grant", {"TTL": max(1, math.ceil(timeout))})
        error = answer.get("error")
        if error:
            raise StoreError(f"etcd refused a lease of {timeout:g} s: {error}")
        session = cls(store, int(answer["ID"]), int(answer["TTL"]), owns_store=owns_store)
        session._renewed = asked
        return session

    def __repr__(self) -> str:
        state = "ended" if self._ended else f"timeout={self.timeout:g}"
        return f"EtcdSession(lease={self.lease:x}, {state}, {self._store!r})"

    @property
    def ended(self) -> bool:
        """Whether the lease is known, here, to be gone (closed, or found expired)."""
        return self._ended or self._lease_gone

    def set(self, key: Data, value: Data) -> None:
        """Put ``value`` under ``key``, attached to this session's lease."""
        etcd_key = self._store._layout.value(as_bytes(key, "key"))
        body = {"key": b64(etcd_key), "value": b64(as_bytes(value)), "lease": str(self.lease)}
        self._renew_if_due()
        try:
            self._store._call("/v3/kv/put", body)
        except LeaseNotFoundError as exc:
            raise self._expired() from exc

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """``Store.compare_set``; what it writes is attached to this session's lease.

        A key that holds ``expected`` is written even when ``desired`` is the
        same value: the session then owns it.
        """
        etcd_key = self._store._layout.value(as_bytes(key, "key"))
        raw_expected, raw_desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        self._renew_if_due()
        try:
            return self._store._compare_set(etcd_key, raw_expected, raw_desired, self.lease)
        except LeaseNotFoundError as exc:
            raise self._expired() from exc

    def add_will(self, queue: Data, value: Data) -> None:
        """When the session ends, push ``value`` onto the queue ``queue``.

        The will's record and its lease-attached mark are written in one
        transaction, so a will exists in etcd only with a live lease.
        """
        self._write_will([], as_bytes(queue, "queue"), as_bytes(value))

    def set_with_will(self, key: Data, value: Data, queue: Data, will: Data) -> None:
        """:meth:`set` and :meth:`add_will` in one transaction."""
        etcd_key = self._store._layout.value(as_bytes(key, "key"))
        put = {"key": b64(etcd_key), "value": b64(as_bytes(value)), "lease": str(self.lease)}
        self._write_will([{"request_put": put}], as_bytes(queue, "queue"), as_bytes(will))

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
        """:meth:`set_with_will`, a push and a read (or with ``claim``, the claim of a
        missing ``get``), in one transaction."""
        layout = self._store._layout
        etcd_key = layout.value(as_bytes(key, "key"))
        put = {"key": b64(etcd_key), "value": b64(as_bytes(value)), "lease": str(self.lease)}
        item = layout.new_queue_item(as_bytes(push_onto, "queue"))
        pushed = {"key": b64(item), "value": b64(as_bytes(push))}
        read_key = layout.value(as_bytes(get, "key"))
        ops: list[Json] = [{"request_put": put}, {"request_put": pushed}]
        claimed = None if claim is None else as_bytes(claim)
        if_missing = None
        if claimed is not None:
            taken = {"key": b64(read_key), "value": b64(claimed)}
            if_missing = (read_key, [*ops, {"request_put": taken}])
        answer = self._write_will(
            [*ops, {"request_range": {"key": b64(read_key)}}],
            as_bytes(queue, "queue"),
            as_bytes(will),
            if_missing=if_missing,
        )
        if if_missing is not None and answer.get("succeeded"):
            return claimed
        kvs = answer["responses"][2].get("response_range", {}).get("kvs")
        return unb64(kvs[0].get("value", "")) if kvs else None

    def _write_will(
        self,
        also: list[Json],
        raw_queue: bytes,
        raw_value: bytes,
        *,
        if_missing: tuple[bytes, list[Json]] | None = None,
    ) -> Json:
        """One transaction: the operations ``also``, then a will's record and mark; its
        answer. With ``if_missing`` (an etcd key and operations), those operations
        instead of ``also`` if that key is missing (the answer then succeeded)."""
        layout = self._store._layout
        with self._lock:
            if len(self._wills) >= self._max_wills:
                raise StoreLimitError(f"a store session may hold at most {self._max_wills} wills")
            number = self._numbered
            self._numbered += 1
        self._renew_if_due()
        record = layout.will_record(raw_queue, self.lease, number)
        will: list[Json] = [
            {"request_put": {"key": b64(record), "value": b64(raw_value)}},
            {
                "request_put": {
                    "key": b64(layout.will_mark(record)),
                    "value": "",
                    "lease": str(self.lease),
                }
            },
        ]
        compare: list[Json] = []
        success, failure = [*also, *will], None
        if if_missing is not None:
            missing, instead = if_missing
            compare = [never_created(missing)]
            success, failure = [*instead, *will], success
        try:
            answer = self._store._txn(compare, success, failure)
        except LeaseNotFoundError as exc:
            raise self._expired() from exc
        with self._lock:
            self._wills.append(Will(raw_queue, record, raw_value))
        return answer

    def keep_alive(self) -> None:
        """Renew the lease (``LeaseKeepAlive``: not written to etcd's log).

        On the gRPC stream, while the last renewal is recent, the keep-alive
        goes with a burst of the process's keep-alives within a third of the
        TTL, and this returns at once; an answer that the lease is gone then
        ends the session at its next use.

        Raises:
            SessionExpiredError: the lease is gone (expired, or closed), found
                by this keep-alive or by the answer to an earlier one.
            StoreConnectionError: no member renewed it for a TTL's time.
        """
        self._check_open()
        sent = time.monotonic()
        keeper = self._store._lease_keeper
        due = self._burst_due(sent)
        if keeper is not None and due is not None:
            keeper.renew_soon(self.lease, functools.partial(self._answered, sent), due)
            return
        deadline = sent + min(self.timeout, self._store.timeout.total_seconds())
        while True:
            if keeper is not None:
                ttl, error = self._keep_alive_on_stream(keeper, deadline)
                if ttl is None and self._store._lease_fallback:
                    # gRPC may be blocked on the way (lease_transport auto): the
                    # gateway renews it as well.
                    ttl, error = self._keep_alive_through_gateway(deadline)
            else:
                ttl, error = self._keep_alive_through_gateway(deadline)
            if ttl is not None:
                if ttl <= 0:
                    raise self._expired()
                self._renewed = sent
                return
            if time.monotonic() + _RETRY_PAUSE >= deadline:
                raise self._unreachable(f"no leader renewed it ({error})")
            time.sleep(_RETRY_PAUSE)  # an election is under way, or a member died

    def _burst_due(self, now: float) -> float | None:
        """By when a keep-alive asked for at ``now`` may go in a burst, unawaited; or
        ``None``: it goes at once and the caller waits for the answer.

        A burst may wait up to a third of the TTL, and no later than half the
        TTL after the last renewal, so the lease keeps half of it. With a
        keep-alive every third of the TTL (the default), a process's
        keep-alives then gather into one burst per interval, whatever the
        phases of their nodes' ticks (a sixth made two, of half the size, and
        etcd's CPU is mostly waking up for them); one lost renewal still leaves
        the next keep-alive time to go. One due sooner than
        :data:`_MIN_BURST_WAIT` goes at once, as does one with a TTL that
        short, so one resumed after a long pause learns at once that its lease
        is gone.
        """
        if self.timeout < _MIN_TTL_RENEWED_SOON:
            return None
        due = min(now + self.timeout * _BURST_WAIT_OF_TTL, self._renewed + self.timeout / 2)
        return due if due - now >= _MIN_BURST_WAIT else None

    def _answered(self, sent: float, ttl: int | None, error: object) -> None:
        """The answer to a keep-alive sent at ``sent`` that nobody waited for.

        A lost answer changes nothing: the next keep-alive then waits for its own.
        """
        if ttl is None:
            log.debug("a keep-alive of etcd lease %x got no answer: %s", self.lease, error)
        elif ttl > 0:
            with self._lock:
                self._renewed = max(self._renewed, sent)
        else:
            with self._lock:
                self._lease_gone = True  # the next use raises SessionExpiredError

    def _keep_alive_on_stream(
        self, keeper: LeaseKeeper, deadline: float
    ) -> tuple[int | None, object]:
        """One keep-alive on the process's gRPC stream: ``(TTL, None)``, or
        ``(None, why)`` when it may work on a retry."""
        # A third of the TTL at most: a stream that does not answer (gRPC blocked
        # on the way) leaves time for the gateway.
        wait = min(deadline - time.monotonic(), self.timeout / 3)
        try:
            return keeper.keep_alive(self.lease, max(wait, 0.001)), None
        except KeepAliveFailed as exc:
            if exc.code not in _TRANSIENT_CODES:
                raise StoreError(
                    f"etcd refused a keep-alive of lease {self.lease:x}: {exc}"
                ) from exc
            return None, exc

    def _keep_alive_through_gateway(self, deadline: float) -> tuple[int | None, object]:
        """One keep-alive through the JSON gateway, as :meth:`_keep_alive_on_stream`."""
        body = {"ID": str(self.lease)}
        # A keep-alive is a stream: its answer is {"result": ...} or {"error": ...}.
        answer = self._store._gateway.call("/v3/lease/keepalive", body, deadline)
        result = answer.get("result")
        if isinstance(result, dict):
            return int(result.get("TTL", 0)), None  # etcd leaves out a TTL of 0
        error = answer.get("error")
        code = error.get("grpc_code") if isinstance(error, dict) else None
        if code not in _TRANSIENT_CODES:
            raise StoreError(f"etcd answered a keep-alive of lease {self.lease:x}: {answer}")
        return None, error

    def close(self) -> None:
        """Revoke the lease (deleting its keys), then push the wills. Idempotent.

        If etcd cannot be reached, the lease expires by itself within its TTL
        and the readers of the wills' queues push them: that is logged, not raised.
        """
        with self._lock:
            if self._ended:
                return
            self._ended = True
        store = self._store
        try:
            with contextlib.suppress(LeaseNotFoundError):  # it expired already
                store._call("/v3/lease/revoke", {"ID": str(self.lease)})
            push_own(store._call, store._layout, self._wills)
        except StoreConnectionError as exc:
            log.warning(
                "closing the store session of etcd lease %x: %s; it ends when its TTL "
                "(%g s) runs out",
                self.lease,
                exc,
                self.timeout,
            )
        finally:
            self._release_store()

    def _renew_if_due(self) -> None:
        """Keep the lease alive if a third of its TTL passed since the last renewal."""
        self._check_open()
        if time.monotonic() - self._renewed > self.timeout / 3:
            self.keep_alive()

    def _release_store(self) -> None:
        if self._owns_store:
            self._store.close()

    def _check_open(self) -> None:
        if self._ended:
            raise self._error("has ended")
        if self._lease_gone:
            raise self._expired()

    def _expired(self) -> SessionExpiredError:
        """The lease is gone: the session has ended (its wills are pushed by readers)."""
        with self._lock:
            self._ended = True
        self._release_store()
        return self._error("expired: its lease is gone (silent for its timeout, or revoked)")

    def _error(self, what: str) -> SessionExpiredError:
        first = self._store._endpoints[0]
        return SessionExpiredError(
            f"the store session of etcd lease {self.lease:x} {what}", first.host, first.port
        )

    def _unreachable(self, why: str) -> StoreConnectionError:
        first = self._store._endpoints[0]
        return StoreConnectionError(
            f"etcd did not renew the lease {self.lease:x} of a store session: {why}",
            first.host,
            first.port,
        )
