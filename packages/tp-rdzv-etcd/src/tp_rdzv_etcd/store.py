"""``EtcdStore``: a ``tp_store.Store`` on etcd's v3 API, through its JSON gateway.

How each operation maps onto etcd (the key layout is in :mod:`.layout`):

- ``set``/``multi_set`` are puts (one transaction for many keys); ``get``,
  ``wait_get``, ``wait`` and blocking ``queue_pop`` read, and when what they
  need is missing, watch from the revision right after that read, so no write
  in between is missed; nothing polls. ``wait_get`` of a key under a prefix
  given to ``mirror_prefix`` is answered from the process's copy of those
  keys, kept by one watch (:mod:`.client.shared.mirrors`).
- ``add``, ``append`` and ``compare_set`` are transactions: ``add``/``append``
  compare the key's ``mod_revision`` with the one they read (and retry when
  someone wrote in between), ``compare_set`` compares the value itself.
- A queue is one etcd key per value; ``queue_pop`` deletes the oldest by
  ``create_revision`` with a transaction on its ``mod_revision``, so two
  poppers never both get it. A handle fetches the oldest values in batches and
  pops them in order, which keeps a pop O(1) on a queue of thousands.

When a member dies while answering, the request may or may not have been
applied (see :mod:`.gateway`). ``set``, ``multi_set``, ``compare_set`` and
reads are retried blindly: applying them twice is applying them once. A pop
whose answer was lost checks whether its value is gone and, if so, returns it
(a value is never lost; it could be delivered twice only if another popper
took it in that instant). ``add`` and ``append`` check whether the key moved
since their read: if not, they retry; if it now holds exactly what they wrote,
it was their write; otherwise they retry on top, which may apply them twice.
A push that is retried could leave its value twice only if the first copy was
popped in between. ``delete_key`` retried after its delete went through
reports ``False``.

``open_session`` gives store sessions on etcd leases (:mod:`.session`); the
wills of ended sessions are pushed by the readers of their queues
(:mod:`.wills`), so ``queue_pop``, ``queue_len``, ``wait`` and ``check``
count and push due wills in the same round trip as their reads.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tp_store import QueueEmptyError, Store, StoreError, StoreSession
from tp_store.base import DEFAULT_TIMEOUT, Data, Timeout, as_bytes, as_keys
from tp_store.semantics import (
    check_multi_set,
    counter_after_add,
    int_argument,
    key_text,
    timeout_error,
)
from tp_store.sessions.base import session_timeout_seconds

from .client import h2_stream, rpc
from .client.gateway import AmbiguousResultError, EtcdGateway, Json, TlsFiles
from .client.lease_stream import LeaseKeeper, keeper
from .client.rpc import EtcdRpc, GrpcUnreachableError
from .client.shared.mirrors import NOT_SERVING, Mirror, mirror
from .client.shared.reads import shared_reads
from .client.transport import GrpcOrGateway
from .endpoints import Endpoint, parse_endpoints
from .layout import KeyLayout, b64, never_created, range_end, unb64
from .session import EtcdSession
from .wills import any_due, count_requests, push_due, wakes

log = logging.getLogger(__name__)

#: The values of ``EtcdStore(transport=...)`` and ``EtcdStore(lease_transport=...)``.
TRANSPORTS = ("auto", "grpc", "gateway")
#: etcd's default limit of operations in one transaction (``--max-txn-ops``).
MAX_TXN_OPS = 128
#: How many of a queue's oldest values one read fetches for the pops that follow.
_POP_BATCH = 64
#: Back-off after losing a race for a key: random, up to this unit x 2^losses, at most the cap.
_BACKOFF_UNIT = 0.001
_MAX_BACKOFF = 0.05
#: The most counters a handle remembers the last revision of.
_MAX_REMEMBERED = 4096
#: Keys whose existence one transaction reads: three reads each (see ``_missing``).
_KEYS_PER_TXN = MAX_TXN_OPS // 3

_Item = tuple[bytes, int, bytes]  # (etcd key, mod_revision, value) of one queued value


def _revision(answer: Json) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def _kv(kv: Json) -> tuple[bytes, int, bytes]:
    """``(key, mod_revision, value)`` of a key-value of a gateway answer."""
    return unb64(kv["key"]), int(kv.get("mod_revision", 0)), unb64(kv.get("value", ""))


def _first_kv(answer: Json) -> Json | None:
    kvs = answer.get("kvs")
    return kvs[0] if kvs else None


def _back_off(conflicts: int) -> None:
    """Wait a random while after losing ``conflicts`` races in a row for one key.

    Contenders that retried at once would mostly lose again, each loss a
    round trip through raft; spreading them out lets one win per round.
    """
    time.sleep(random.uniform(0, min(_MAX_BACKOFF, _BACKOFF_UNIT * 2**conflicts)))


def _put(key: bytes, value: bytes, lease: int = 0) -> Json:
    request: Json = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def _get(key: bytes) -> Json:
    return {"request_range": {"key": b64(key)}}


def _watch_request(
    key: bytes, end: bytes | None, start_revision: int, *, deletes: bool = False
) -> Json:
    """A watch of ``key`` (or ``[key, end)``) from ``start_revision``: its puts, and
    with ``deletes`` its deletions too."""
    request: Json = {"key": b64(key), "start_revision": str(start_revision)}
    if not deletes:
        request["filters"] = ["NODELETE"]
    if end is not None:
        request["range_end"] = b64(end)
    return request


def _unchanged_since(key: bytes, mod_revision: int) -> Json:
    """A transaction compare: ``key`` was last modified at ``mod_revision``."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}


def _over_grpc(setting: str, transport: str, *, with_user: bool, needs: str) -> bool:
    """Whether ``setting=transport`` (``transport`` or ``lease_transport``) means gRPC,
    which takes the package ``needs`` (``grpcio``, or ``h2`` for the keep-alive stream)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"{setting} must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    available = h2_stream.available() if needs == "h2" else rpc.available()
    if transport == "grpc" and not available:
        raise ValueError(f"{setting} grpc needs {needs} (pip install {needs})")
    if transport == "grpc" and with_user:
        raise ValueError(f"{setting} grpc cannot authenticate: etcd users need 'gateway'")
    return transport == "grpc" or (transport == "auto" and available and not with_user)


class EtcdStore(Store):
    """A store whose data lives in an etcd cluster (v3 API, etcd 3.4 or later).

    Every key lives under ``prefix`` (give each run its own). Handles are
    thread-safe; ``clone()`` opens another one with its own connections.

    Args:
        endpoints: the members' client URLs or ``host[:port]``s, as a list or
            comma-separated; requests go to the first that answers, and move
            to the next member when one fails.
        prefix: where this store's keys live in etcd.
        timeout: the default timeout of blocking operations, and the most any
            other operation may take while members fail over.
        protocol: ``http`` or ``https``, for endpoints given without a scheme.
        cacert: the CA bundle that verifies ``https`` members (default: the system's).
        cert: a client certificate to present (PEM), with ``key``.
        key: the private key of ``cert``.
        user: the etcd user, when the cluster has authentication on.
        password: that user's password.
        attempt_timeout: the most one request to one member may take before
            the next member is asked.
        lease_transport: how sessions' keep-alives travel: ``grpc`` (one gRPC
            stream per process and cluster, :mod:`.lease_stream`), ``gateway``
            (a JSON request each, where gRPC is blocked), or ``auto``, the
            default: ``grpc`` unless ``grpcio`` is missing or ``user`` is set
            (etcd authentication goes through the gateway only), and a
            keep-alive that the stream does not deliver goes through the gateway.

    A ``password`` for an ``http`` member travels in clear text: the store
    logs a WARNING saying so, once (its clones do not repeat it).

    Raises:
        ValueError: malformed endpoints, an empty prefix, a lone ``cert``/``key``,
            a ``user`` without ``password``, an unknown ``lease_transport``, or
            ``grpc`` without ``grpcio`` or with a ``user``.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        prefix: str | bytes = "/tp_store/",
        timeout: Timeout = DEFAULT_TIMEOUT,
        *,
        protocol: str = "http",
        cacert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
        attempt_timeout: float = 10.0,
        lease_transport: str = "auto",
        transport: str = "auto",
    ) -> None:
        super().__init__(timeout)
        self._endpoints: tuple[Endpoint, ...] = parse_endpoints(endpoints, protocol)
        raw_prefix = as_bytes(prefix, "prefix")
        if not raw_prefix:
            raise ValueError("an EtcdStore prefix must not be empty (it scopes every key)")
        if (cert is None) != (key is None):
            raise ValueError("an EtcdStore client certificate needs both cert and key")
        if (user is None) != (password is None):
            raise ValueError("an EtcdStore user needs a password (and a password a user)")
        if not attempt_timeout > 0:
            raise ValueError(f"attempt_timeout must be positive, got {attempt_timeout!r}")
        self._grpc_leases = _over_grpc(
            "lease_transport", lease_transport, with_user=user is not None, needs="h2"
        )
        self._grpc = _over_grpc("transport", transport, with_user=user is not None, needs="grpcio")
        # auto: a keep-alive the gRPC stream did not deliver goes through the gateway,
        # and requests too where gRPC reaches no member.
        self._lease_fallback = lease_transport == "auto"
        self._fallback = transport == "auto"
        # What _connect needs for every handle (a clone's too).
        self._options: dict[str, Any] = {
            "cacert": cacert,
            "cert": cert,
            "key": key,
            "user": user,
            "password": password,
            "attempt_timeout": attempt_timeout,
        }
        self._layout = KeyLayout(raw_prefix)
        self._mirrored: tuple[bytes, ...] = ()  # key prefixes, see mirror_prefix
        self._connect()
        plain = [endpoint.url for endpoint in self._endpoints if endpoint.scheme == "http"]
        if user is not None and plain:
            log.warning(
                "the etcd password of user %r goes to %s over plain http: anyone on the "
                "network path can read it; use https members (protocol https)",
                user,
                ", ".join(plain),
            )

    def _connect(self) -> None:
        """Connections and caches of this handle's own (a clone shares none)."""
        options = self._options
        user, password = options["user"], options["password"]
        self._tls = TlsFiles(options["cacert"], options["cert"], options["key"])
        self._gateway = EtcdGateway(
            self._endpoints,
            tls=self._tls,
            credentials=None if user is None or password is None else (user, password),
            attempt_timeout=options["attempt_timeout"],
        )
        # Requests and watches: over gRPC, or through the gateway too.
        self._transport: EtcdGateway | EtcdRpc | GrpcOrGateway = self._gateway
        if self._grpc:
            rpc = EtcdRpc(
                self._endpoints,
                tls=self._tls,
                attempt_timeout=options["attempt_timeout"],
            )
            self._transport = GrpcOrGateway(rpc, self._gateway) if self._fallback else rpc
        self._lock = threading.Lock()
        # The last (mod_revision, value) this handle saw of a counter: a node's
        # own heartbeat counter then costs one transaction per add.
        self._seen: dict[bytes, tuple[int, bytes | None]] = {}
        # The oldest values of each queue, fetched in one read, popped in order.
        self._batches: dict[bytes, collections.deque[_Item]] = {}

    @property
    def _lease_keeper(self) -> LeaseKeeper | None:
        """This process's gRPC keep-alive stream to the cluster; ``None``: the gateway."""
        if not self._grpc_leases:
            return None
        return keeper(self._endpoints, self._tls)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The members' client URLs."""
        return tuple(endpoint.url for endpoint in self._endpoints)

    @property
    def endpoint(self) -> str:
        """The members' URLs and the prefix, as one string: two handles with the
        same one see the same keys (the nodes of a process share a presence
        session on it, as on one store server)."""
        return f"{','.join(self.endpoints)}{self.prefix.decode(errors='backslashreplace')}"

    @property
    def prefix(self) -> bytes:
        """Where this store's keys live in etcd."""
        return self._layout.prefix

    def clone(self) -> EtcdStore:
        """A new handle on the same keys, with connections of its own."""
        twin = copy.copy(self)
        twin._connect()
        for family in twin._mirrored:
            twin._mirror(family).hold()
        return twin

    def close(self) -> None:
        """Close this handle's connections (and let go of its mirrors)."""
        mirrored, self._mirrored = self._mirrored, ()
        for family in mirrored:
            self._mirror(family).release()
        self._gateway.close()

    def __repr__(self) -> str:
        return f"EtcdStore({','.join(self.endpoints)!r}, prefix={self.prefix!r})"

    def mirror_prefix(self, key_prefix: Data) -> None:
        """Answer this handle's waits for keys starting with ``key_prefix`` from this
        process's copy of them (:mod:`.client.shared.mirrors`), over gRPC.

        The copy is read once, in the handle's next transaction or its first
        wait for such a key, and one watch per process keeps it: waits for
        those keys then cost no request. For a small family of
        keys each written once (a run's round outcomes), at most
        :data:`.client.shared.mirrors.MAX_KEYS` of them; a larger one is waited for
        key by key. Clones made afterwards mirror it too. The copy goes when the
        last handle that asked for it closes.
        """
        raw = as_bytes(key_prefix, "key_prefix")
        if not raw:
            raise ValueError("a mirrored key prefix must not be empty")
        if raw not in self._mirrored:
            self._mirrored = (*self._mirrored, raw)
            self._mirror(raw).hold()

    def _mirror_of(self, raw_key: bytes) -> Mirror | None:
        """This process's mirror that holds ``raw_key``; ``None`` if none does (or
        requests go through the gateway)."""
        if self._rpc is None:
            return None
        for family in self._mirrored:
            if raw_key.startswith(family):
                return self._mirror(family)
        return None

    def _mirror_to_start(self) -> Mirror | None:
        """A mirror of this handle that the caller is to start (claimed), if one is idle."""
        if not self._mirrored or self._rpc is None:
            return None
        for family in self._mirrored:
            found = self._mirror(family)
            if found.claim_start():
                return found
        return None

    def _mirror(self, family: bytes) -> Mirror:
        """This process's mirror of the keys starting with ``family``."""
        start = self._layout.family(family)
        return mirror(self._endpoints, self._tls, start, range_end(start))

    def _start_mirror(self, found: Mirror, answer: Json, deadline: float) -> None:
        """Start the claimed mirror ``found`` from ``answer``, its range read."""
        rpc = self._rpc
        if rpc is None:
            found.abandon()
            return
        found.start(
            answer,
            lambda revision: rpc.start_watch(
                _watch_request(found.prefix, found.end, revision, deletes=True), deadline
            ),
        )

    def open_session(self, timeout: Timeout) -> StoreSession:
        """A store session on an etcd lease (see :class:`.session.EtcdSession`).

        Its TTL is ``timeout`` rounded up to whole seconds, or etcd's shortest
        (1.5 election timeouts: 2 s by default) if that is longer; the
        session's ``timeout`` says which. It has connections of its own.
        """
        return EtcdSession.grant(self.clone(), session_timeout_seconds(timeout))

    def attach_session(self, timeout: Timeout) -> StoreSession:
        """A store session on an etcd lease, through this handle (as :meth:`open_session`).

        An etcd lease belongs to no connection, and this handle's requests and
        watches are thread-safe: the session needs no handle of its own (a
        clone per node cost a node a gateway pool and a gRPC client more).
        Closing the session leaves this handle open.
        """
        return EtcdSession.grant(self, session_timeout_seconds(timeout), owns_store=False)

    # -- requests ---------------------------------------------------------------
    def _deadline(self) -> float:
        return time.monotonic() + self.timeout.total_seconds()

    def _call(self, path: str, body: Json, *, retry_ambiguous: bool = True) -> Json:
        return self._transport.call(path, body, self._deadline(), retry_ambiguous=retry_ambiguous)

    def _range(self, key: bytes, end: bytes | None = None, **options: Any) -> Json:
        body: Json = {"key": b64(key), **options}
        if end is not None:
            body["range_end"] = b64(end)
        return self._call("/v3/kv/range", body)

    def _txn(
        self,
        compare: list[Json],
        success: list[Json],
        failure: list[Json] | None = None,
        *,
        retry_ambiguous: bool = True,
    ) -> Json:
        failure = failure or []
        # The read that starts an idle mirror rides along, in either branch.
        starting = None
        if len(success) < MAX_TXN_OPS and len(failure) < MAX_TXN_OPS:
            starting = self._mirror_to_start()
        if starting is not None:
            read = {"request_range": starting.range_request()}
            success, failure = [*success, read], [*failure, read]
        body = {"compare": compare, "success": success, "failure": failure}
        try:
            answer = self._call("/v3/kv/txn", body, retry_ambiguous=retry_ambiguous)
        except BaseException:
            if starting is not None:
                starting.abandon()
            raise
        if starting is None:
            return answer
        responses = list(answer.get("responses", []))
        family = responses.pop().get("response_range", {}) if responses else {}
        try:
            self._start_mirror(
                starting, {**family, "header": answer.get("header", {})}, self._deadline()
            )
        except Exception:  # the transaction went through: the next wait starts the mirror
            log.debug("could not start the mirror of %r", starting.prefix, exc_info=True)
        return {**answer, "responses": responses}

    def _read(self, etcd_key: bytes) -> Json:
        """The range answer of ``etcd_key``; over gRPC, sent with the reads that the
        process's other threads ask meanwhile (:mod:`.client.shared.reads`)."""
        if self._rpc is None:
            return self._range(etcd_key)
        reads = shared_reads(self._endpoints, self._tls, MAX_TXN_OPS)
        return reads.range(etcd_key, self._send_reads)

    def _send_reads(self, etcd_keys: Sequence[bytes]) -> list[Json]:
        """The range answers of ``etcd_keys``, read in one request."""
        if len(etcd_keys) == 1:
            return [self._range(etcd_keys[0])]
        answer = self._txn([], [_get(key) for key in etcd_keys])
        responses = answer.get("responses", [])
        if len(responses) != len(etcd_keys):
            raise StoreError(
                f"etcd answered a transaction of {len(etcd_keys)} reads with "
                f"{len(responses)} responses"
            )
        header = answer.get("header", {})
        return [{**response.get("response_range", {}), "header": header} for response in responses]

    def _read_value(self, etcd_key: bytes) -> tuple[int, bytes | None]:
        kv = _first_kv(self._read(etcd_key))
        if kv is None:
            return 0, None
        _, mod_revision, value = _kv(kv)
        return mod_revision, value

    # -- values -----------------------------------------------------------------
    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``, waking anyone waiting for it."""
        etcd_key = self._layout.value(as_bytes(key, "key"))
        self._call("/v3/kv/put", {"key": b64(etcd_key), "value": b64(as_bytes(value))})

    def get(self, key: Data) -> bytes:
        """Return the value of ``key``, waiting up to the default timeout for it."""
        return self.wait_get(key)

    def wait_get(self, key: Data, timeout: Timeout | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` (default: the store's) for it.

        Over gRPC the threads of a process waiting for the same key share one
        read and one watch (:mod:`.client.shared.waits`).
        """
        raw_key = as_bytes(key, "key")
        seconds = self._deadline_seconds(timeout)
        deadline = time.monotonic() + seconds
        etcd_key = self._layout.value(raw_key)
        found = self._mirrored_value(raw_key, etcd_key, deadline)
        if found is None:
            raise timeout_error([raw_key], seconds)
        if isinstance(found, bytes):
            return found
        rpc = self._rpc
        if rpc is not None:
            try:
                value = rpc.waits.value(
                    etcd_key,
                    deadline,
                    functools.partial(self._value_as_of, etcd_key),
                    lambda revision: rpc.start_watch(
                        _watch_request(etcd_key, None, revision), deadline
                    ),
                )
            except GrpcUnreachableError:
                pass  # waited for again below, through the gateway if need be
            else:
                if value is None:
                    raise timeout_error([raw_key], seconds)
                return value
        while True:
            found, revision = self._value_as_of(etcd_key)
            if found is not None:
                return found
            events = self._await_put(etcd_key, None, revision + 1, deadline)
            if events is None:
                raise timeout_error([raw_key], seconds)
            for event in events:
                kv = event.get("kv")
                if kv is not None and unb64(kv["key"]) == etcd_key:
                    return _kv(kv)[2]

    def _mirrored_value(
        self, raw_key: bytes, etcd_key: bytes, deadline: float
    ) -> bytes | object | None:
        """The value of a mirrored key once it exists (``None`` past ``deadline``);
        :data:`NOT_SERVING` if no mirror serves it: then it is waited for the usual way."""
        found = self._mirror_of(raw_key)
        if found is None:
            return NOT_SERVING
        if found.claim_start():
            try:
                answer = self._call("/v3/kv/range", found.range_request())
                self._start_mirror(found, answer, deadline)
            except GrpcUnreachableError:
                found.abandon()
                return NOT_SERVING
            except BaseException:
                found.abandon()
                raise
        return found.value(etcd_key, deadline)

    def _value_as_of(self, etcd_key: bytes) -> tuple[bytes | None, int]:
        """The value of ``etcd_key`` (``None`` if missing) and the revision read at."""
        answer = self._read(etcd_key)
        kv = _first_kv(answer)
        return (None if kv is None else _kv(kv)[2]), _revision(answer)

    @property
    def _rpc(self) -> EtcdRpc | None:
        """The gRPC client while requests go over gRPC; ``None`` through the gateway."""
        transport = self._transport
        if isinstance(transport, GrpcOrGateway):
            return transport.rpc
        return transport if isinstance(transport, EtcdRpc) else None

    def multi_get(self, keys: Sequence[Data]) -> list[bytes]:
        """The values of all ``keys``, waiting for all of them to exist."""
        self.wait(keys)
        raw_keys = as_keys(keys)
        values: list[bytes] = []
        for start in range(0, len(raw_keys), MAX_TXN_OPS):
            chunk = raw_keys[start : start + MAX_TXN_OPS]
            answer = self._txn([], [_get(self._layout.value(key)) for key in chunk])
            for key, response in zip(chunk, answer.get("responses", []), strict=True):
                kv = _first_kv(response.get("response_range", {}))
                # Only a queue, or deleted since the wait: wait for a value as get() does.
                values.append(self.get(key) if kv is None else _kv(kv)[2])
        return values

    def multi_set(self, keys: Sequence[Data], values: Sequence[Data]) -> None:
        """Set every key to its value, ``MAX_TXN_OPS`` keys per transaction."""
        check_multi_set(keys, values)
        puts = [
            _put(self._layout.value(as_bytes(key, "key")), as_bytes(value))
            for key, value in zip(keys, values, strict=True)
        ]
        for start in range(0, len(puts), MAX_TXN_OPS):
            self._txn([], puts[start : start + MAX_TXN_OPS])

    def add(self, key: Data, amount: int) -> int:
        """Add ``amount`` to the decimal counter at ``key`` (missing = 0); return the sum."""
        raw_key = as_bytes(key, "key")
        amount = int_argument(amount, "amount")

        def added(value: bytes | None) -> bytes:
            return str(counter_after_add(raw_key, value, amount)).encode()

        if amount == 0:
            # A read, unless the key is missing: then it is created as "0".
            etcd_key = self._layout.value(raw_key)
            value = self._read_value(etcd_key)[1]
            if value is not None:
                return int(added(value))
        return int(self._update(raw_key, added))

    def append(self, key: Data, value: Data) -> None:
        """Append ``value`` to the value of ``key``, creating it if missing."""
        tail = as_bytes(value)
        self._update(as_bytes(key, "key"), lambda current: (current or b"") + tail)

    def _update(self, raw_key: bytes, change: Callable[[bytes | None], bytes]) -> bytes:
        """Replace the value of ``raw_key`` by ``change(value)`` atomically; the new value."""
        etcd_key = self._layout.value(raw_key)
        with self._lock:
            seen = self._seen.get(etcd_key)
        if seen is None:
            seen = self._read_value(etcd_key)
        conflicts = 0
        while True:
            mod_revision, current = seen
            desired = change(current)
            compare = _unchanged_since(etcd_key, mod_revision)
            try:
                answer = self._txn(
                    [compare], [_put(etcd_key, desired)], [_get(etcd_key)], retry_ambiguous=False
                )
            except AmbiguousResultError:
                now = self._read_value(etcd_key)
                if now[0] != mod_revision and now[1] == desired:
                    self._remember(etcd_key, now)
                    return desired  # the write that moved the key was this one
                seen = now
                continue
            if answer.get("succeeded"):
                self._remember(etcd_key, (_revision(answer), desired))
                return desired
            kv = _first_kv(answer["responses"][0].get("response_range", {}))
            seen = (0, None) if kv is None else _kv(kv)[1:]
            conflicts += 1
            _back_off(conflicts)

    def _remember(self, etcd_key: bytes, seen: tuple[int, bytes | None]) -> None:
        with self._lock:
            if len(self._seen) >= _MAX_REMEMBERED:
                self._seen.clear()
            self._seen[etcd_key] = seen

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """Set ``key`` to ``desired`` iff it holds ``expected``; return the value after.

        A missing key with an empty ``expected`` is created; a missing key with
        a non-empty ``expected`` is left missing and ``expected`` is returned.
        """
        etcd_key = self._layout.value(as_bytes(key, "key"))
        return self._compare_set(
            etcd_key, as_bytes(expected, "expected"), as_bytes(desired, "desired")
        )

    def _compare_set(
        self, etcd_key: bytes, raw_expected: bytes, raw_desired: bytes, lease: int = 0
    ) -> bytes:
        """``compare_set`` of ``etcd_key``; a write it makes is attached to ``lease`` (if any)."""
        if not raw_expected and (raw_desired or lease):
            # An empty expected matches a missing key: usually the case (nodes racing to
            # create a key), so try creating it first, in the one transaction of a loser.
            answer = self._txn(
                [never_created(etcd_key)], [_put(etcd_key, raw_desired, lease)], [_get(etcd_key)]
            )
            if answer.get("succeeded"):
                return raw_desired
            kv = _first_kv(answer["responses"][0].get("response_range", {}))
            if kv is not None and _kv(kv)[2]:
                return _kv(kv)[2]
            # It holds the empty value (or was deleted since): compared below.
        while True:
            if raw_expected == raw_desired and not lease:
                # Nothing to change unless the key must be created: a read.
                answer = self._read(etcd_key)
            else:
                answer = self._txn(
                    [
                        {
                            "key": b64(etcd_key),
                            "target": "VALUE",
                            "result": "EQUAL",
                            "value": b64(raw_expected),
                        }
                    ],
                    [_put(etcd_key, raw_desired, lease)],
                    [_get(etcd_key)],
                )
                if answer.get("succeeded"):
                    return raw_desired
                answer = answer["responses"][0].get("response_range", {})
            kv = _first_kv(answer)
            if kv is not None:
                return _kv(kv)[2]
            if raw_expected:
                return raw_expected
            created = self._txn([never_created(etcd_key)], [_put(etcd_key, raw_desired, lease)])
            if created.get("succeeded"):
                return raw_desired
            # Created by someone else in between: decide again on their value.

    def delete_key(self, key: Data) -> bool:
        """Delete ``key``; return whether it existed."""
        etcd_key = self._layout.value(as_bytes(key, "key"))
        answer = self._call("/v3/kv/deleterange", {"key": b64(etcd_key)})
        with self._lock:
            self._seen.pop(etcd_key, None)
        return int(answer.get("deleted", 0)) > 0

    # -- existence ----------------------------------------------------------------
    def _missing(self, raw_keys: Sequence[bytes]) -> list[tuple[bytes, int]]:
        """The keys with neither a value nor a queued value, each with the revision read.

        A missing key whose queue has a due will gets it pushed and is read again.
        """
        missing: list[tuple[bytes, int]] = []
        for start in range(0, len(raw_keys), _KEYS_PER_TXN):
            chunk = raw_keys[start : start + _KEYS_PER_TXN]
            while chunk:
                reads = []
                for key in chunk:
                    reads.append(
                        {
                            "request_range": {
                                "key": b64(self._layout.home(key)),
                                "range_end": b64(self._layout.existence_end(key)),
                                "limit": 1,
                                "keys_only": True,
                            }
                        }
                    )
                    reads.extend(count_requests(self._layout, key))
                answer = self._txn([], reads)
                responses = answer.get("responses", [])
                due = []
                for index, key in enumerate(chunk):
                    found, records, marks = responses[3 * index : 3 * index + 3]
                    if found.get("response_range", {}).get("kvs"):
                        continue
                    if any_due(records, marks) and push_due(self._call, self._layout, key):
                        due.append(key)  # read it again
                    else:
                        missing.append((key, _revision(answer)))
                chunk = due
        return missing

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key has a value or a non-empty queue, without blocking."""
        return not self._missing(as_keys(keys))

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        """Block until every key exists, or raise ``StoreTimeoutError`` naming the missing ones."""
        raw_keys = as_keys(keys)
        seconds = self._deadline_seconds(timeout)
        deadline = time.monotonic() + seconds
        while True:
            missing = self._missing(raw_keys)
            if not missing:
                return
            key, revision = missing[0]
            if self._await_home(key, revision + 1, deadline) is None:
                raise timeout_error([key for key, _ in missing], seconds)

    def _await_home(self, key: bytes, start_revision: int, deadline: float) -> list[Json] | None:
        """The first news for a reader of ``key`` from ``start_revision`` on (see
        :func:`.wills.wakes`): a write of its value or queue, or a due will."""
        home = self._layout.home(key)
        return self._await_put(home, range_end(home), start_revision, deadline, wills_of=key)

    def _await_put(
        self,
        key: bytes,
        end: bytes | None,
        start_revision: int,
        deadline: float,
        *,
        wills_of: bytes | None = None,
    ) -> list[Json] | None:
        """The first puts on ``key`` (or ``[key, end)``) from ``start_revision`` on.

        With ``wills_of`` (a store key whose home the range is), the first
        events that :func:`.wills.wakes` a reader of that key with.
        ``None`` once ``deadline`` passes; ``[]`` if the watch ended early (a
        member died or cancelled it): the caller reads again and re-watches.
        """
        request = _watch_request(key, end, start_revision, deletes=wills_of is not None)

        def keep(events: list[Json]) -> list[Json]:
            if wills_of is None:
                return events
            return [event for event in events if wakes(event, self._layout, wills_of)]

        return self._transport.first_events(request, deadline, keep)

    # -- listing ----------------------------------------------------------------
    def _value_keys(self) -> list[bytes]:
        prefix = self._layout.prefix
        answer = self._range(prefix, range_end(prefix), keys_only=True)
        found = (self._layout.store_key(unb64(kv["key"])) for kv in answer.get("kvs", []))
        return [key for key in found if key is not None]

    def num_keys(self) -> int:
        """The number of keys with a value under this store's prefix (queues are not keys)."""
        return len(self._value_keys())

    def list_keys(self) -> list[str]:
        """The keys with a value under this store's prefix, as ``str``."""
        return [key_text(key) for key in self._value_keys()]

    # -- queues -----------------------------------------------------------------
    def queue_push(self, key: Data, value: Data) -> None:
        """Push ``value`` onto the queue at ``key``, waking the blocked poppers."""
        item = self._layout.new_queue_item(as_bytes(key, "key"))
        self._call("/v3/kv/put", {"key": b64(item), "value": b64(as_bytes(value))})

    def queue_len(self, key: Data) -> int:
        """The number of values in the queue at ``key``."""
        answer, _ = self._read_queue(as_bytes(key, "key"), count_only=True)
        return int(answer.get("count", 0))

    def _read_queue(self, raw_key: bytes, **options: Any) -> tuple[Json, int]:
        """A range read of the queue of ``raw_key`` after pushing its due wills; the revision.

        The counts that tell whether a will is due go in the same transaction.
        """
        queue = self._layout.queue(raw_key)
        read = {"key": b64(queue), "range_end": b64(range_end(queue)), **options}
        while True:
            answer = self._txn(
                [], [{"request_range": read}, *count_requests(self._layout, raw_key)]
            )
            found, records, marks = answer.get("responses", [])
            if not any_due(records, marks) or not push_due(self._call, self._layout, raw_key):
                return found.get("response_range", {}), _revision(answer)

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        """Pop the oldest value of the queue at ``key``.

        With ``block`` it waits up to the default timeout (``StoreTimeoutError``);
        without, an empty queue raises ``QueueEmptyError``.
        """
        raw_key = as_bytes(key, "key")
        seconds = self._deadline_seconds(None)
        deadline = time.monotonic() + seconds
        queue = self._layout.queue(raw_key)
        while True:
            item, revision = self._oldest(raw_key)
            if item is None:
                if not block:
                    raise QueueEmptyError(f"queue {key_text(raw_key)!r} is empty")
                if self._await_home(raw_key, revision + 1, deadline) is None:
                    raise timeout_error([raw_key], seconds, "a value in queue")
                continue
            item_key, mod_revision, value = item
            compare = _unchanged_since(item_key, mod_revision)
            try:
                answer = self._txn(
                    [compare],
                    [{"request_delete_range": {"key": b64(item_key)}}],
                    retry_ambiguous=False,
                )
            except AmbiguousResultError:
                if self._read_value(item_key)[1] is not None:
                    continue  # not deleted: pop it again
                answer = {"succeeded": True}  # gone: this pop took it
            self._forget(queue, item)
            if answer.get("succeeded"):
                return value

    def queue_pop_many(self, key: Data, count: int) -> list[bytes]:
        """Up to ``count`` of the oldest values of the queue at ``key``, without waiting.

        One read of the oldest ``count`` values, then their deletes,
        ``MAX_TXN_OPS`` a transaction: a value is this pop's when its delete
        deleted it (another popper's delete of it deletes nothing), so no
        transaction is retried for a race. A steward draining a thousand joins
        costs etcd one read and eight transactions, not a transaction each.
        """
        raw_key = as_bytes(key, "key")
        count = int_argument(count, "count", 0)
        if count == 0:
            return []
        queue = self._layout.queue(raw_key)
        with self._lock:
            self._batches.pop(queue, None)  # this read supersedes a pop's batch
        answer, _ = self._read_queue(
            raw_key, limit=count, sort_order="ASCEND", sort_target="CREATE"
        )
        items = [_kv(kv) for kv in answer.get("kvs", [])]
        popped: list[bytes] = []
        for start in range(0, len(items), MAX_TXN_OPS):
            popped += [
                value for _, _, value in self._delete_items(items[start : start + MAX_TXN_OPS])
            ]
        return popped

    def _delete_items(self, items: Sequence[_Item]) -> list[_Item]:
        """Those of ``items`` (queued values) that this call's deletes removed, in order.

        When the answer is lost, the items found gone count as deleted here
        (as for ``queue_pop``: another popper in that instant is the only
        way a value is then delivered twice); the others are deleted again.
        """
        deletes = [{"request_delete_range": {"key": b64(key)}} for key, _, _ in items]
        try:
            answer = self._txn([], deletes, retry_ambiguous=False)
        except AmbiguousResultError:
            reads = [{"request_range": {"key": b64(key), "keys_only": True}} for key, _, _ in items]
            responses = self._txn([], reads).get("responses", [])
            left = [
                item
                for item, response in zip(items, responses, strict=True)
                if response.get("response_range", {}).get("kvs")
            ]
            deleted = set(self._delete_items(left)) if left else set()
            return [item for item in items if item not in left or item in deleted]
        responses = answer.get("responses", [])
        return [
            item
            for item, response in zip(items, responses, strict=True)
            if int(response.get("response_delete_range", {}).get("deleted", 0)) > 0
        ]

    def _oldest(self, raw_key: bytes) -> tuple[_Item | None, int]:
        """The oldest value of the queue of ``raw_key`` not known to be popped, and the
        revision read.

        A batch read returns the oldest values in order; any value it did not
        return is newer than all it did, so they are popped in order first.
        """
        queue = self._layout.queue(raw_key)
        with self._lock:
            batch = self._batches.get(queue)
            if batch:
                return batch[0], 0
        answer, revision = self._read_queue(
            raw_key, limit=_POP_BATCH, sort_order="ASCEND", sort_target="CREATE"
        )
        items = [_kv(kv) for kv in answer.get("kvs", [])]
        if not items:
            return None, revision
        with self._lock:
            self._batches[queue] = collections.deque(items)
        return items[0], 0

    def _forget(self, queue: bytes, item: _Item) -> None:
        with self._lock:
            batch = self._batches.get(queue)
            if batch and batch[0] == item:
                batch.popleft()
            elif batch and item in batch:
                batch.remove(item)
            if not batch:
                self._batches.pop(queue, None)
