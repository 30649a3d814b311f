"""Watches over gRPC: one shared Watch stream per process and member
(``tp_rdzv_etcd.client.watch_stream``); the threads of a process waiting for one key
share one read and one watch, kept for the next wait when all gave up
(``tp_rdzv_etcd.client.shared.waits``)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.client.shared.waits import MAX_PARKED
from tp_rdzv_etcd.local import LocalEtcd
from tp_store import StoreTimeoutError

pytestmark = pytest.mark.etcd

_STARTED = re.compile(r'^grpc_server_started_total\{[^}]*grpc_method="Watch"[^}]*\} (\S+)$', re.M)


def _watch_streams(member_url: str) -> int:
    """How many Watch streams the member has seen opened."""
    with urllib.request.urlopen(member_url + "/metrics", timeout=10) as answer:
        return sum(int(float(n)) for n in _STARTED.findall(answer.read().decode()))


def test_many_waits_share_one_stream(etcd1: LocalEtcd) -> None:
    member = etcd1.members[0]
    prefix = f"/watches/{uuid.uuid4().hex}/"
    with EtcdStore(etcd1.endpoints, prefix, timeout=30, transport="grpc") as writer:
        handles = [writer.clone() for _ in range(20)]
        before = _watch_streams(member.client_url)
        got: list[bytes] = []
        waiters = [
            threading.Thread(target=lambda h=h, i=i: got.append(h.wait_get(f"k{i}", 30)))
            for i, h in enumerate(handles)
        ]
        for waiter in waiters:
            waiter.start()
        for index in range(len(handles)):
            writer.set(f"k{index}", str(index))
        for waiter in waiters:
            waiter.join(30)
        assert sorted(got) == sorted(str(i).encode() for i in range(len(handles)))
        # One stream (opened now, or by an earlier test of this process), not 20.
        assert _watch_streams(member.client_url) - before <= 1
        for handle in handles:
            handle.close()


def test_the_waits_of_a_process_for_one_key_share_one_read_and_one_watch(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    prefix = f"/watches/{uuid.uuid4().hex}/"
    with EtcdStore(etcd1.endpoints, prefix, timeout=30, transport="grpc") as writer:
        handles = [writer.clone() for _ in range(50)]
        asked, watched = count_requests()
        got: list[bytes] = []
        waiters = [
            threading.Thread(target=lambda h=h: got.append(h.wait_get("outcome", 30)))
            for h in handles
        ]
        for waiter in waiters:
            waiter.start()
        assert watched.wait(30)
        waits = writer._rpc.waits._waits  # type: ignore[union-attr]
        key = writer._layout.value(b"outcome")
        deadline = time.monotonic() + 30
        while key not in waits or waits[key].waiters < len(handles):
            assert time.monotonic() < deadline, "the waiters never all waited"
            time.sleep(0.01)
        writer.set("outcome", "round 0")
        for waiter in waiters:
            waiter.join(30)
        assert got == [b"round 0"] * len(handles)
        assert asked.count("watch") == 1
        assert asked.count("/v3/kv/range") == 1
        for handle in handles:
            handle.close()


def test_a_waiter_giving_up_leaves_the_shared_watch_to_the_others(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    prefix = f"/watches/{uuid.uuid4().hex}/"
    with (
        EtcdStore(etcd1.endpoints, prefix, timeout=30, transport="grpc") as writer,
        writer.clone() as impatient,
        writer.clone() as patient,
    ):
        asked, watched = count_requests()
        timeouts: list[StoreTimeoutError] = []

        def give_up_soon() -> None:
            with pytest.raises(StoreTimeoutError) as raised:
                impatient.wait_get("k", 1)
            timeouts.append(raised.value)

        first = threading.Thread(target=give_up_soon)
        first.start()
        assert watched.wait(30)  # the first waiter reads the watch, for both
        got: list[bytes] = []
        second = threading.Thread(target=lambda: got.append(patient.wait_get("k", 30)))
        second.start()
        first.join(30)
        assert len(timeouts) == 1
        writer.set("k", "after the first gave up")
        second.join(30)
        assert got == [b"after the first gave up"]
        assert asked.count("watch") == 1


def test_a_wait_resumed_after_a_timeout_sees_a_write_made_in_between(etcd1: LocalEtcd) -> None:
    prefix = f"/watches/{uuid.uuid4().hex}/"
    with (
        EtcdStore(etcd1.endpoints, prefix, timeout=30, transport="grpc") as waiter,
        waiter.clone() as writer,
    ):
        with pytest.raises(StoreTimeoutError):
            waiter.wait_get("k", 0.2)
        writer.set("k", "written while nobody waited")
        requests: list[str] = []
        call = waiter._transport.call

        def counted(path: str, *args: Any, **kwargs: Any) -> Any:
            requests.append(path)
            return call(path, *args, **kwargs)

        waiter._transport.call = counted  # type: ignore[method-assign]
        assert waiter.wait_get("k", 30) == b"written while nobody waited"
        assert requests == []  # the kept watch had it: no read, no new watch


def test_a_kept_watch_whose_stream_ended_reads_again(make_cluster: Any) -> None:
    cluster = make_cluster(3)
    leader = cluster.leader()
    others = [member for member in cluster.members if member is not leader]
    endpoints = ",".join(member.client_url for member in [leader, *others])
    prefix = f"/watches/{uuid.uuid4().hex}/"
    with EtcdStore(endpoints, prefix, timeout=30, transport="grpc") as waiter:
        with pytest.raises(StoreTimeoutError):
            waiter.wait_get("k", 0.2)  # its watch kept, on the leader's stream
        leader.kill()
        with EtcdStore(",".join(m.client_url for m in others), prefix, timeout=30) as writer:
            writer.set("k", "after the kill")
        assert waiter.wait_get("k", 30) == b"after the kill"


def test_the_oldest_kept_watch_goes_when_too_many_are_kept(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    prefix = f"/watches/{uuid.uuid4().hex}/"
    kept = [f"k{index}" for index in range(MAX_PARKED + 1)]
    with (
        EtcdStore(etcd1.endpoints, prefix, timeout=30, transport="grpc") as waiter,
        waiter.clone() as writer,
    ):
        for key in kept:
            with pytest.raises(StoreTimeoutError):
                waiter.wait_get(key, 0.05)  # each wait's watch kept when it gives up
        writer.set(kept[0], "oldest")
        writer.set(kept[-1], "newest")
        asked, _ = count_requests()
        assert waiter.wait_get(kept[-1], 30) == b"newest"
        assert asked == []  # its kept watch had it
        assert waiter.wait_get(kept[0], 30) == b"oldest"
        assert asked == ["/v3/kv/range"]  # its watch was cancelled: read again
