"""``transport=auto``: requests over gRPC, through the JSON gateway where gRPC is blocked.

Some networks let only HTTP/1.1 through (a proxy, a firewall that inspects
traffic). When no member can be reached over gRPC, the request goes through
the gateway; if that serves it, gRPC is taken as blocked for this cluster in
this process, and its requests all go through the gateway from then on (a
WARNING says so, once).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from tp_rdzv_etcd.endpoints import Endpoint

from .gateway import EtcdGateway, Json
from .rpc import EtcdRpc, GrpcUnreachableError

log = logging.getLogger(__name__)

_BLOCKED: set[tuple[int, tuple[Endpoint, ...]]] = set()
_BLOCKED_LOCK = threading.Lock()


class GrpcOrGateway:
    """Requests over ``rpc``, through ``gateway`` once gRPC proved blocked (thread-safe)."""

    def __init__(self, rpc: EtcdRpc, gateway: EtcdGateway) -> None:
        self._rpc = rpc
        self._gateway = gateway
        self._cluster = (os.getpid(), rpc.endpoints)

    @property
    def blocked(self) -> bool:
        """Whether gRPC was found blocked to this cluster (from this process)."""
        with _BLOCKED_LOCK:
            return (os.getpid(), self._rpc.endpoints) in _BLOCKED

    def _found_blocked(self, exc: GrpcUnreachableError) -> None:
        with _BLOCKED_LOCK:
            if self._cluster in _BLOCKED:
                return
            _BLOCKED.add(self._cluster)
        log.warning(
            "etcd %s: gRPC does not get through (%s); requests go through the JSON gateway",
            ",".join(map(str, self._rpc.endpoints)),
            exc,
        )

    def close(self) -> None:
        self._rpc.close()

    def call(self, path: str, body: Json, deadline: float, *, retry_ambiguous: bool = True) -> Json:
        """As :meth:`.gateway.EtcdGateway.call`."""
        if not self.blocked:
            try:
                return self._rpc.call(path, body, deadline, retry_ambiguous=retry_ambiguous)
            except GrpcUnreachableError as exc:
                answer = self._gateway.call(path, body, deadline, retry_ambiguous=retry_ambiguous)
                self._found_blocked(exc)
                return answer
        return self._gateway.call(path, body, deadline, retry_ambiguous=retry_ambiguous)

    @property
    def rpc(self) -> EtcdRpc | None:
        """The gRPC client, while gRPC is not found blocked."""
        return None if self.blocked else self._rpc

    def first_events(
        self, create_request: Json, deadline: float, keep: Callable[[list[Json]], list[Json]]
    ) -> list[Json] | None:
        """As :meth:`.rpc.EtcdRpc.first_events`."""
        if not self.blocked:
            try:
                return self._rpc.first_events(create_request, deadline, keep)
            except GrpcUnreachableError as exc:
                if time.monotonic() >= deadline:
                    return None
                events = self._gateway.first_events(create_request, deadline, keep)
                self._found_blocked(exc)
                return events
        return self._gateway.first_events(create_request, deadline, keep)
