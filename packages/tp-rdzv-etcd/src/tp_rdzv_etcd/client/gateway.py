"""Requests to etcd's JSON gateway (``/v3/...``), failing over between members.

Every call has a deadline (monotonic seconds). A member that cannot be reached,
or answers "unavailable" (no leader, leader changed, request timed out: an
election is under way), is skipped for the next one, as :mod:`.failover` says.

A request that was sent but not answered (the member died while handling it)
may or may not have been applied. Callers say whether a blind retry is safe
(``retry_ambiguous``); when it is not, :class:`AmbiguousResultError` tells
them to find out themselves.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.response import BaseHTTPResponse

from tp_rdzv_etcd.endpoints import Endpoint
from tp_store import StoreConnectionError, StoreError

from .failover import Members, MemberUnavailable, NoMemberServed

log = logging.getLogger(__name__)

Json = dict[str, Any]

#: gRPC status codes meaning "not now, ask again" (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED).
_TRANSIENT_CODES = frozenset({14, 4, 10})
#: gRPC UNAUTHENTICATED: the auth token expired or was revoked.
_UNAUTHENTICATED = 16
#: gRPC NOT_FOUND, with the words etcd (3.4 and 3.5) uses for a lease it does not know.
_NOT_FOUND = 5
_LEASE_NOT_FOUND = "requested lease not found"
#: What etcd answers when a token predates the last change of users, roles or
#: permissions (always so for JWT tokens, which carry the auth revision they
#: were issued at): a new token is the cure. etcd 3.4 says it with gRPC
#: INVALID_ARGUMENT (3), etcd 3.5 with UNKNOWN (2) and other words.
_OLD_AUTH_REVISION = {
    3: "revision of auth store is old",
    2: "auth: revision in header is old",
}
#: Connections kept per member: a handle's heartbeat thread and its caller at once.
_POOL_SIZE = 4
# Ask the member to refuse a request, and cancel a watch, when it has no leader, so
# a client of a member cut off from the quorum finds a working one instead of
# waiting for etcd's request timeout, or hearing nothing.
_REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}


class AmbiguousResultError(StoreConnectionError):
    """A request was sent but its answer was lost: it may or may not have been applied."""


class LeaseNotFoundError(StoreError):
    """etcd knows no lease of the ID a request named: it expired or was revoked."""


@dataclass(frozen=True)
class TlsFiles:
    """What an ``https`` connection verifies and presents (PEM file paths)."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None


class EtcdGateway:
    """A thread-safe client of the members' JSON gateways, with failover.

    Args:
        endpoints: the members, tried in order; the one that last answered is tried first.
        tls: certificates for ``https`` members.
        credentials: ``(user, password)`` when the cluster has authentication on.
        attempt_timeout: the most one request to one member may take before
            the next member is asked (a call's deadline still bounds it).
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        tls: TlsFiles | None = None,
        credentials: tuple[str, str] | None = None,
        attempt_timeout: float = 10.0,
    ) -> None:
        if not endpoints:
            raise ValueError("an etcd gateway needs at least one endpoint")
        self._members = Members(endpoints)
        self.endpoints = self._members.endpoints
        self._credentials = credentials
        self._attempt_timeout = attempt_timeout
        tls = tls or TlsFiles()
        self._client_cert = tls.cert
        self._pool = urllib3.PoolManager(
            num_pools=len(self.endpoints) + 1,
            maxsize=_POOL_SIZE,
            retries=False,
            cert_reqs="CERT_REQUIRED",
            ca_certs=tls.cacert,
            cert_file=tls.cert,
            key_file=tls.key,
        )
        self._lock = threading.Lock()
        self._token: str | None = None

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.clear()

    # -- unary calls -------------------------------------------------------------
    def call(self, path: str, body: Json, deadline: float, *, retry_ambiguous: bool = True) -> Json:
        """POST ``body`` to ``path`` on a member that can serve it; its JSON answer.

        Raises:
            AmbiguousResultError: the answer was lost and ``retry_ambiguous`` is false.
            StoreConnectionError: no member served the request before ``deadline``.
            StoreError: a member rejected the request (a bad request, no permission).
        """
        payload = json.dumps(body).encode()

        def attempt(endpoint: Endpoint, remaining: float) -> Json:
            try:
                return self._post(endpoint, path, payload, remaining)
            except MemberUnavailable as exc:
                if exc.ambiguous and not retry_ambiguous:
                    raise AmbiguousResultError(
                        f"etcd {path}: {endpoint}: {exc}", endpoint.host, endpoint.port
                    ) from exc
                log.debug("etcd %s failed on %s: %s", path, endpoint, exc)
                raise

        try:
            return self._members.fail_over(attempt, deadline)
        except NoMemberServed as exc:
            raise self._gave_up(path, exc.why) from None

    def _gave_up(self, path: str, why: str) -> StoreConnectionError:
        members = ", ".join(map(str, self.endpoints))
        first = self.endpoints[0]
        return StoreConnectionError(
            f"etcd ({members}) did not serve {path}: {why}", first.host, first.port
        )

    def _post(self, endpoint: Endpoint, path: str, payload: bytes, remaining: float) -> Json:
        response = self._send(endpoint, path, payload, remaining, stream=False)
        if response.status == 200:
            return _decode(response.data, endpoint, path)
        error = _decode_error(response.data)
        if _stale_token(error) and self._credentials is not None:
            self._authenticate(endpoint, remaining, stale=True)
            return self._post_once_more(endpoint, path, payload, remaining)
        raise _failure(endpoint, path, response.status, error)

    def _post_once_more(
        self, endpoint: Endpoint, path: str, payload: bytes, remaining: float
    ) -> Json:
        response = self._send(endpoint, path, payload, remaining, stream=False)
        if response.status == 200:
            return _decode(response.data, endpoint, path)
        raise _failure(endpoint, path, response.status, _decode_error(response.data))

    # -- watches -----------------------------------------------------------------
    def open_watch(self, create_request: Json, deadline: float) -> BaseHTTPResponse | None:
        """A streaming ``/v3/watch`` response on some member; ``None`` at the deadline.

        The caller reads newline-delimited JSON from it and must ``close()`` it.
        Raises ``StoreConnectionError`` when no member can be reached.
        """
        payload = json.dumps({"create_request": create_request}).encode()

        def attempt(endpoint: Endpoint, remaining: float) -> BaseHTTPResponse:
            response = self._send(endpoint, "/v3/watch", payload, remaining, stream=True)
            if response.status == 200:
                return response
            error = _decode_error(response.read())
            response.close()
            if _stale_token(error) and self._credentials is not None:
                self._authenticate(endpoint, remaining, stale=True)
                raise MemberUnavailable("a stale auth token", reached=True, ambiguous=False)
            raise _failure(endpoint, "/v3/watch", response.status, error)

        try:
            return self._members.fail_over(attempt, deadline)
        except NoMemberServed as exc:
            if exc.unreachable:
                raise self._gave_up("/v3/watch", exc.why) from None
            return None

    def first_events(
        self,
        create_request: Json,
        deadline: float,
        keep: Callable[[list[Json]], list[Json]],
    ) -> list[Json] | None:
        """The first events of a watch (``create_request``) that ``keep`` keeps;
        ``None`` at the deadline, ``[]`` if the watch ended early (its member died,
        lost its leader, or compacted past the revision): the caller reads again.
        A watch through the gateway ends with the call."""
        response = self.open_watch(create_request, deadline)
        if response is None:
            return None
        pending = b""
        try:
            for chunk in response.stream(65536):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if not line.strip():
                        continue
                    answer = json.loads(line)
                    result = answer.get("result") if isinstance(answer, dict) else None
                    if not isinstance(result, dict) or result.get("canceled"):
                        return []  # an error, a compaction, a member without a leader
                    events = keep(list(result.get("events") or []))
                    if events:
                        return events
        except ReadTimeoutError:
            return None if time.monotonic() >= deadline - 0.01 else []
        except (HTTPError, OSError, ValueError, RecursionError):
            return []
        finally:
            response.close()
            response.release_conn()
        return []

    # -- one request to one member -------------------------------------------------
    def _send(
        self,
        endpoint: Endpoint,
        path: str,
        payload: bytes,
        remaining: float,
        *,
        stream: bool,
        authorize: bool = True,
    ) -> BaseHTTPResponse:
        if authorize and self._credentials is not None and self._token is None:
            self._authenticate(endpoint, remaining, stale=False)
        headers = {"Content-Type": "application/json", **_REQUIRE_LEADER}
        token = self._token if authorize else None
        if token is not None:
            headers["Authorization"] = token
        attempt = min(remaining, self._attempt_timeout)
        # A watch waits for events until the caller's deadline; a unary call
        # gives up on this member after one attempt's time.
        timeout = urllib3.Timeout(connect=attempt, read=remaining if stream else attempt)
        try:
            return self._pool.request(
                "POST",
                endpoint.url + path,
                body=payload,
                headers=headers,
                timeout=timeout,
                preload_content=not stream,
                redirect=False,
            )
        except (NewConnectionError, ConnectTimeoutError) as exc:
            # Nothing was sent: any request may go elsewhere.
            raise MemberUnavailable(
                f"cannot connect: {exc}", reached=False, ambiguous=False
            ) from exc
        except SSLError as exc:
            # Not retried elsewhere: every member of a cluster has the same
            # certificates, so the next would refuse the same way.
            raise StoreConnectionError(
                f"etcd {endpoint}: TLS failed: {exc}{self._tls_hint(exc)}",
                endpoint.host,
                endpoint.port,
            ) from exc
        except ReadTimeoutError as exc:
            raise MemberUnavailable(
                f"no answer in {attempt:.1f} s", reached=True, ambiguous=True
            ) from exc
        except ProtocolError as exc:
            if not any(isinstance(arg, http.client.RemoteDisconnected) for arg in exc.args):
                raise MemberUnavailable(
                    f"connection lost: {exc}", reached=True, ambiguous=True
                ) from exc
            # Closed without a byte of answer. The request may have been
            # applied (a member killed at that moment), but this member did
            # not serve it: like an unreachable one, it counts toward giving up
            # early. An https member does this to every plain-http request.
            hint = " (an https member does that to http: protocol https?)"
            raise MemberUnavailable(
                "closed the connection without answering"
                + (hint if endpoint.scheme == "http" else ""),
                reached=False,
                ambiguous=True,
            ) from exc
        except HTTPError as exc:
            # The connection broke after the request went out.
            raise MemberUnavailable(
                f"connection lost: {exc}", reached=True, ambiguous=True
            ) from exc

    def _tls_hint(self, exc: SSLError) -> str:
        """What to check when a TLS failure may be a missing client certificate.

        A member that requires one and gets none aborts the handshake: OpenSSL
        reports a "bad certificate" alert or just an EOF (whichever comes
        first), never a message that says a client certificate was wanted.
        """
        about_member = any(
            isinstance(error, ssl.SSLCertVerificationError)
            for error in (*exc.args, exc.__cause__, exc.__context__)
        )
        if about_member or self._client_cert is not None:
            return ""  # the message (which certificate failed to verify) says enough
        return " (does the member require a client certificate? set cert and key)"

    def _authenticate(self, endpoint: Endpoint, remaining: float, *, stale: bool) -> None:
        """Get an auth token for ``credentials`` (a new one if ``stale``)."""
        assert self._credentials is not None
        with self._lock:
            if self._token is not None and not stale:
                return
            self._token = None
        user, password = self._credentials
        payload = json.dumps({"name": user, "password": password}).encode()
        response = self._send(
            endpoint, "/v3/auth/authenticate", payload, remaining, stream=False, authorize=False
        )
        if response.status != 200:
            error = _decode_error(response.data)
            raise StoreConnectionError(
                f"etcd {endpoint}: authentication of user {user!r} failed: "
                f"{error.get('message') or response.status}",
                endpoint.host,
                endpoint.port,
            )
        token = _decode(response.data, endpoint, "/v3/auth/authenticate").get("token")
        if not isinstance(token, str) or not token:
            raise StoreError(f"etcd {endpoint}: authentication returned no token")
        with self._lock:
            self._token = token


def _decode(data: bytes, endpoint: Endpoint, path: str) -> Json:
    try:
        answer = json.loads(data)
    # RecursionError: deeply nested JSON (from whoever answers in etcd's place).
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"etcd {endpoint} answered {path} with non-JSON {data[:80]!r}") from exc
    if not isinstance(answer, dict):
        raise StoreError(f"etcd {endpoint} answered {path} with {data[:80]!r}")
    return answer


def _decode_error(data: bytes) -> Json:
    try:
        error = json.loads(data)
    except (ValueError, RecursionError):
        return {"message": data[:200].decode("utf-8", "replace")}
    return error if isinstance(error, dict) else {"message": str(error)[:200]}


def _stale_token(error: Json) -> bool:
    """Whether an error answer means "authenticate again and retry"."""
    code = error.get("code")
    message = str(error.get("message") or error.get("error") or "")
    if code == _UNAUTHENTICATED:
        return True
    old_revision = _OLD_AUTH_REVISION.get(code) if isinstance(code, int) else None
    return old_revision is not None and old_revision in message


def _failure(endpoint: Endpoint, path: str, status: int, error: Json) -> Exception:
    """The exception for an error answer: ``MemberUnavailable`` if another try may work."""
    message = error.get("message") or error.get("error") or f"HTTP {status}"
    code = error.get("code")
    if message == "etcdserver: no leader":
        # Refused before it was handled (hasleader): it may go anywhere.
        return MemberUnavailable("unavailable: no leader", reached=True, ambiguous=False)
    if code in _TRANSIENT_CODES or (code is None and status >= 500):
        # The member was reached but cannot serve now; a write it accepted may
        # still be committed by the next leader.
        return MemberUnavailable(f"unavailable: {message}", reached=True, ambiguous=True)
    if code == _NOT_FOUND and _LEASE_NOT_FOUND in str(message):
        return LeaseNotFoundError(f"etcd {endpoint}: {path}: {message}")
    return StoreError(f"etcd {endpoint} rejected {path}: {message} (code {code}, HTTP {status})")
