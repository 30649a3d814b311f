"""Requests to etcd's gRPC API (``etcdserverpb.KV``, ``Lease``, ``Watch``), failing over.

The same calls as :class:`~.gateway.EtcdGateway` (the same paths, bodies and
answers in the gateway's JSON shape, :mod:`.messages` translating), with the
same failover rules, on one HTTP/2 connection per member and process that
every handle shares. etcd spends about half the CPU on a request that comes
over gRPC that it spends on one through its JSON gateway, which decodes the
JSON and makes a second gRPC call inside etcd (``benchmarks/etcd_transport.py``).

Only for clusters without etcd authentication (users go through the gateway).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tp_rdzv_etcd.endpoints import Endpoint
from tp_store import StoreConnectionError, StoreError

from . import messages
from .failover import Members, MemberUnavailable, NoMemberServed
from .gateway import AmbiguousResultError, Json, LeaseNotFoundError, TlsFiles
from .per_process import PerProcess
from .shared.waits import SharedWaits, shared_waits
from .watch_stream import StreamBroken, Watch, shared_stream

try:
    import grpc
except ImportError:  # pragma: no cover - grpcio is a dependency; a broken install falls back
    grpc = None

#: The gateway's paths, as gRPC methods with their request and answer messages.
METHODS: dict[str, tuple[str, str, str]] = {
    "/v3/kv/range": ("/etcdserverpb.KV/Range", "RangeRequest", "RangeResponse"),
    "/v3/kv/put": ("/etcdserverpb.KV/Put", "PutRequest", "PutResponse"),
    "/v3/kv/txn": ("/etcdserverpb.KV/Txn", "TxnRequest", "TxnResponse"),
    "/v3/kv/deleterange": (
        "/etcdserverpb.KV/DeleteRange",
        "DeleteRangeRequest",
        "DeleteRangeResponse",
    ),
    "/v3/lease/grant": (
        "/etcdserverpb.Lease/LeaseGrant",
        "LeaseGrantRequest",
        "LeaseGrantResponse",
    ),
    "/v3/lease/revoke": (
        "/etcdserverpb.Lease/LeaseRevoke",
        "LeaseRevokeRequest",
        "LeaseRevokeResponse",
    ),
}
_WATCH = "/etcdserverpb.Watch/Watch"
#: Seconds a write waits for its answer before the process asks a member for its term.
PROBE_AFTER = 1.0
#: A read that a member answers from its own state, with its raft term: the count of one key.
_TERM_PROBE = messages.encode(
    "RangeRequest", {"key": "AA==", "serializable": True, "count_only": True}
)
#: A member without a leader refuses at once ("no leader") instead of holding the request.
_HAS_LEADER = (("hasleader", "true"),)
#: The largest answer accepted (a range of thousands of queued messages fits).
MAX_MESSAGE = 64 << 20
#: gRPC status codes: "not now, ask again" (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED).
_UNAVAILABLE, _DEADLINE, _ABORTED, _NOT_FOUND = 14, 4, 10, 5
_LEASE_NOT_FOUND = "requested lease not found"


def available() -> bool:
    """Whether ``grpcio`` imports here."""
    return grpc is not None


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


def open_channel(endpoint: Endpoint, tls: TlsFiles) -> Any:
    """A new gRPC channel to ``endpoint`` (TLS for ``https``)."""
    assert grpc is not None
    target = f"{endpoint.host}:{endpoint.port}"
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
    ]
    if endpoint.scheme == "http":
        return grpc.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.cacert),
        private_key=_read(tls.key),
        certificate_chain=_read(tls.cert),
    )
    return grpc.secure_channel(target, credentials, options=options)


_CHANNELS: PerProcess[tuple[Endpoint, TlsFiles], Any] = PerProcess()


def shared_channel(endpoint: Endpoint, tls: TlsFiles) -> Any:
    """This process's channel to ``endpoint`` (a forked child makes its own)."""
    return _CHANNELS.get((endpoint, tls), lambda: open_channel(endpoint, tls))


def _proposes(path: str, body: Json) -> bool:
    """Whether etcd proposes the request to raft (a write, a transaction that writes,
    a lease's grant or revoke); reads, and transactions of reads only, it does not."""
    if path == "/v3/kv/range":
        return False
    if path == "/v3/kv/txn":
        ops = [*body.get("success", []), *body.get("failure", [])]
        return not all("request_range" in op for op in ops)
    return True


class RaftTerm:
    """The highest raft term that this process's answers from one cluster named.

    A new term is a new leader. A write still unanswered from before it may
    have been forwarded to the old leader, now dead: etcd answers it only when
    its request timeout runs out (7 s with the default election timeout; a
    read it fails at once, "leader changed"), so the write is abandoned at
    once instead, as one whose answer was lost (retried, or ambiguous for its
    caller to settle: :mod:`.store`).
    """

    def __init__(self) -> None:
        self.current = 0  # 0: none seen yet
        self._lock = threading.Lock()
        self._probing = threading.Lock()  # held by the one call asking a member for its term
        self._probed_at = -math.inf  # when that was last asked (monotonic)
        # One event per call awaiting its answer or pausing between passes: a new
        # term wakes them; an answer wakes its own caller only (a shared condition
        # woke every waiting thread at every answer).
        self._waiting: set[threading.Event] = set()

    def saw(self, answer: Json) -> None:
        """Note the term in ``answer``'s header."""
        header = answer.get("header")
        term = int(header.get("raft_term", 0)) if isinstance(header, dict) else 0
        if term > self.current:
            with self._lock:
                if term <= self.current:
                    return
                # The first term the process learns is no change of leader: the
                # calls sent before it stay (abandoning them sent every write twice).
                waiting = list(self._waiting) if self.current else []
                self.current = term
            for woken in waiting:
                woken.set()

    def pauses(self) -> Callable[[float], None]:
        """A pause between a call's passes over the members that ends early once an
        answer names a term newer than the last pause began at (a new leader:
        every call of the process retries at once, none sleeps its back-off out)."""
        seen = self.current

        def pause(seconds: float) -> None:
            nonlocal seen
            woken = threading.Event()
            with self._lock:
                newer = self.current > seen
                if not newer:
                    self._waiting.add(woken)
            if not newer:
                try:
                    woken.wait(seconds)
                finally:
                    with self._lock:
                        self._waiting.discard(woken)
            seen = self.current

        return pause

    def await_answer(self, pending: Any, since: int, probe: Callable[[], None]) -> bool:
        """Wait for the call ``pending`` (a gRPC future) sent at term ``since``; whether it
        was answered (or failed), false if a newer term came first.

        Every :data:`PROBE_AFTER` seconds it waits, ``probe`` asks a member for
        its term (once per :data:`PROBE_AFTER` in the process, however many
        calls wait; it reports through :meth:`saw`): a write held by a follower
        whose leader died learns of the new leader as soon as the follower
        does, even when no other call of the process is answered (all held by
        that follower), not 7 s later.
        """
        woken = threading.Event()
        pending.add_done_callback(lambda _: woken.set())
        with self._lock:
            if since > 0 and self.current > since:
                return bool(pending.done())
            self._waiting.add(woken)
        try:
            while not woken.wait(PROBE_AFTER):
                self._probe(probe)
        finally:
            with self._lock:
                self._waiting.discard(woken)
        return bool(pending.done())

    def _probe(self, probe: Callable[[], None]) -> None:
        if not self._probing.acquire(blocking=False):
            return  # another call of the process is asking
        try:
            now = time.monotonic()
            if now - self._probed_at < PROBE_AFTER:
                return  # another call asked a moment ago
            self._probed_at = now
            probe()
        except Exception:  # a member without a leader refuses: the next probe asks again
            pass
        finally:
            self._probing.release()


_T = TypeVar("_T")

_TERMS: PerProcess[tuple[Endpoint, ...], RaftTerm] = PerProcess()


def raft_term(endpoints: tuple[Endpoint, ...]) -> RaftTerm:
    """This process's :class:`RaftTerm` of the cluster at ``endpoints``."""
    return _TERMS.get(endpoints, RaftTerm)


class GrpcUnreachableError(StoreConnectionError):
    """No member could be reached over gRPC (down, or gRPC blocked on the way)."""


_STUBS: PerProcess[tuple[Endpoint, TlsFiles, str], Any] = PerProcess()


def unary(endpoint: Endpoint, tls: TlsFiles, method: str) -> Any:
    """A callable of the unary ``method`` on this process's channel to ``endpoint``."""
    return _STUBS.get(
        (endpoint, tls, method), lambda: shared_channel(endpoint, tls).unary_unary(method)
    )


def _status(exc: Exception) -> tuple[int, str]:
    """The gRPC status code and details of a failed call."""
    code = getattr(exc, "code", None)
    status = code() if callable(code) else None
    details = getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)
    return (status.value[0] if status is not None else _UNAVAILABLE), str(text or "")


def _failure(endpoint: Endpoint, path: str, exc: Exception) -> Exception:
    """The exception for a failed call: ``MemberUnavailable`` if another member may serve it."""
    code, details = _status(exc)
    if code == _UNAVAILABLE and not details.startswith("etcdserver:"):
        # grpc's own: no connection could be made (nothing sent), or it broke.
        never_sent = "connect" in details.lower() or "dns" in details.lower()
        return MemberUnavailable(
            f"unavailable: {details}", reached=not never_sent, ambiguous=not never_sent
        )
    if details == "etcdserver: no leader":
        # Refused before it was handled (hasleader): it may go anywhere.
        return MemberUnavailable("unavailable: no leader", reached=True, ambiguous=False)
    if code in (_UNAVAILABLE, _DEADLINE, _ABORTED):
        # No leader, leader changed, timed out: reached, and a write it took may
        # still be committed by the next leader.
        return MemberUnavailable(f"unavailable: {details}", reached=True, ambiguous=True)
    if code == _NOT_FOUND and _LEASE_NOT_FOUND in details:
        return LeaseNotFoundError(f"etcd {endpoint}: {path}: {details}")
    return StoreError(f"etcd {endpoint} rejected {path}: {details} (gRPC code {code})")


class EtcdRpc:
    """A thread-safe client of the members' gRPC API, with the gateway's failover.

    Args:
        endpoints: the members, tried in order; the one that last answered is tried first.
        tls: certificates for ``https`` members.
        attempt_timeout: the most one request to one member may take before
            the next member is asked (a call's deadline still bounds it).
    """

    def __init__(
        self, endpoints: Sequence[Endpoint], *, tls: TlsFiles, attempt_timeout: float = 10.0
    ) -> None:
        if grpc is None:
            raise ValueError("the gRPC transport needs grpcio (pip install grpcio)")
        self._members = Members(endpoints)
        self.endpoints = self._members.endpoints
        self._tls = tls
        self._attempt_timeout = attempt_timeout
        self._term = raft_term(self.endpoints)

    def close(self) -> None:
        """Nothing of its own to close: the channels are the process's."""

    def _fail_over(
        self, path: str, deadline: float, attempt: Callable[[Endpoint, float], _T]
    ) -> _T | None:
        """``attempt`` on the members in turn (:meth:`.failover.Members.fail_over`);
        ``None`` once ``deadline`` passes.

        Raises:
            GrpcUnreachableError: no member could be reached over gRPC.
        """
        try:
            return self._members.fail_over(attempt, deadline, self._term.pauses())
        except NoMemberServed as exc:
            if not exc.unreachable:
                return None
            raise self._did_not_serve(path, exc.why, GrpcUnreachableError) from None

    def _did_not_serve(
        self, path: str, why: str, kind: type[StoreConnectionError] = StoreConnectionError
    ) -> StoreConnectionError:
        members = ", ".join(map(str, self.endpoints))
        first = self.endpoints[0]
        return kind(
            f"etcd ({members}) did not serve {path} over gRPC: {why}", first.host, first.port
        )

    # -- unary calls -------------------------------------------------------------
    def call(self, path: str, body: Json, deadline: float, *, retry_ambiguous: bool = True) -> Json:
        """``path``'s request (the gateway's path and JSON body) on a member that can
        serve it; the answer in the gateway's JSON shape. Raises as
        :meth:`.gateway.EtcdGateway.call` does."""
        method, request_type, answer_type = METHODS[path]
        payload = messages.encode(request_type, body)

        proposes = _proposes(path, body)

        def attempt(endpoint: Endpoint, remaining: float) -> Json:
            stub = unary(endpoint, self._tls, method)
            timeout = min(remaining, self._attempt_timeout)
            term = self._term.current
            try:
                if not proposes:
                    # A read etcd fails at once itself when its leader changes.
                    raw = stub(payload, timeout=timeout, metadata=_HAS_LEADER)
                else:
                    # A future (dearer than a blocking call): abandoned at a new term.
                    pending = stub.future(payload, timeout=timeout, metadata=_HAS_LEADER)
                    probe = functools.partial(self._probe_term, endpoint)
                    if not self._term.await_answer(pending, term, probe):
                        pending.cancel()
                        raise MemberUnavailable(
                            f"abandoned: a new leader was elected (raft term {self._term.current})",
                            reached=True,
                            ambiguous=True,
                        )
                    raw = pending.result()
            except Exception as exc:  # grpc.RpcError, or abandoned
                failure = (
                    exc if isinstance(exc, MemberUnavailable) else _failure(endpoint, path, exc)
                )
                if (
                    isinstance(failure, MemberUnavailable)
                    and failure.ambiguous
                    and not retry_ambiguous
                ):
                    raise AmbiguousResultError(
                        f"etcd {path}: {endpoint}: {failure}", endpoint.host, endpoint.port
                    ) from exc
                raise failure from exc
            try:
                answer = messages.decode(answer_type, raw)
            except ValueError as exc:
                raise StoreError(
                    f"etcd {endpoint} answered {path} with a bad {answer_type}: {exc}"
                ) from exc
            self._term.saw(answer)
            return answer

        answer = self._fail_over(path, deadline, attempt)
        if answer is None:
            raise self._did_not_serve(path, "no answer before the deadline")
        return dict(answer)

    def _probe_term(self, endpoint: Endpoint) -> None:
        """Ask ``endpoint`` for its raft term: a serializable read it answers alone."""
        stub = unary(endpoint, self._tls, METHODS["/v3/kv/range"][0])
        raw = stub(_TERM_PROBE, timeout=PROBE_AFTER, metadata=_HAS_LEADER)
        self._term.saw(messages.decode("RangeResponse", raw))

    # -- watches -----------------------------------------------------------------
    @property
    def waits(self) -> SharedWaits:
        """This process's waits for keys of this cluster (:mod:`.shared.waits`)."""
        return shared_waits(self.endpoints, self._tls)

    def start_watch(self, create_request: Json, deadline: float) -> Watch | None:
        """A watch (``create_request``, the gateway's shape) on this process's watch
        stream to a member that takes it; ``None`` once ``deadline`` passes."""
        return self._fail_over(
            _WATCH, deadline, lambda endpoint, _: self._open_watch(endpoint, create_request)
        )

    def first_events(
        self, create_request: Json, deadline: float, keep: Callable[[list[Json]], list[Json]]
    ) -> list[Json] | None:
        """The first events of a watch (``create_request``, the gateway's shape) that
        ``keep`` keeps, on this process's watch stream to a member
        (:mod:`.watch_stream`); ``None`` at the deadline, ``[]`` if the watch
        ended early (its member died, lost its leader, or compacted past the
        revision). The watch is cancelled afterwards."""

        def attempt(endpoint: Endpoint, remaining: float) -> list[Json] | None:
            watch = self._open_watch(endpoint, create_request)
            try:
                return watch.next_events(deadline, keep)
            except StreamBroken as exc:  # before the member set the watch up
                raise MemberUnavailable(str(exc), reached=exc.reached, ambiguous=False) from exc
            finally:
                watch.cancel()

        return self._fail_over(_WATCH, deadline, attempt)

    def _open_watch(self, endpoint: Endpoint, create_request: Json) -> Watch:
        """A watch on this process's stream to ``endpoint``; ``MemberUnavailable`` if
        that stream has ended (another member may take it)."""
        try:
            return shared_stream(endpoint, self._tls, shared_channel).open(create_request)
        except StreamBroken as exc:
            raise MemberUnavailable(str(exc), reached=exc.reached, ambiguous=False) from exc
