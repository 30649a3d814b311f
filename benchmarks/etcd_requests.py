"""Counting a node process's etcd requests by method and by key family (benchmarks only).

Over either transport, :func:`count_requests` wraps its two entry points in the node
processes of ``spread.py`` when the bench asks for it: every unary call is
counted as ``<path> <family>`` and every watch opened as ``watch <family>``,
where the family is the rendezvous key it touches with the run's prefix and
the node names taken out (``mailbox``, ``present``, ``result``, ``rcpt``...;
``bootstrap``: the round's own keys, where the workers' store is published).
etcd's own counters (``grpc_server_handled_total``) give the totals; these say
which keys they were for.
"""

from __future__ import annotations

import base64
import collections
import re
import threading
from typing import Any

_COUNTS: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()
# tp_rdzv/<run>/<family>..., escaped ('/' as %2F) inside the etcd key <prefix><key>/<part>
_FAMILY = re.compile(rb"tp_rdzv%2F[^%/]*%2F([A-Za-z_]+)")


def family(body: dict[str, Any]) -> str:
    """The rendezvous key family a request body names (its first key)."""
    key = body.get("key")
    if key is None:
        for op in [*body.get("success", []), *body.get("compare", [])]:
            inner = next(iter(op.values())) if "key" not in op else op
            key = inner.get("key") if isinstance(inner, dict) else None
            if key is not None:
                break
    if key is None:
        return "-"
    raw = base64.b64decode(key)
    found = _FAMILY.search(raw)
    if found is not None:
        name = found.group(1).decode()
        return "bootstrap" if name == "r" else name  # r<round>/: the round's own keys
    return "round-store" if b"%2Fr" in raw else raw[-24:].decode(errors="replace")


def count_requests() -> None:
    """Count every etcd request of this process from now on (over gRPC or the gateway)."""
    from tp_rdzv_etcd.client.gateway import EtcdGateway
    from tp_rdzv_etcd.client.rpc import EtcdRpc

    for transport in (EtcdGateway, EtcdRpc):
        _count(transport)


def _count(transport: Any) -> None:
    call = transport.call

    def counted_call(self: Any, path: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            _COUNTS[f"{path} {family(body)}"] += 1
        return call(self, path, body, *args, **kwargs)

    transport.call = counted_call
    # A watch of its own (first_events), or one a process's waiters share (start_watch).
    for name in ("first_events", "start_watch"):
        if hasattr(transport, name):
            setattr(transport, name, _counted_watch(getattr(transport, name)))


def _counted_watch(watch: Any) -> Any:
    def counted(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            _COUNTS[f"watch {family(request)}"] += 1
        return watch(self, request, *args, **kwargs)

    return counted


def take_counts() -> dict[str, int]:
    """The counts since the last take, and start again from zero."""
    with _LOCK:
        counts = dict(_COUNTS)
        _COUNTS.clear()
    return counts
