"""A process's copy of a family of keys, kept by one watch (``tp_rdzv_etcd.client.shared.mirrors``):
waits for its keys answered from memory, on a real etcd."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_dynamic.documents.layout import RunLayout
from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.client.shared import mirrors
from tp_rdzv_etcd.factory import create_store
from tp_rdzv_etcd.local import LocalEtcd
from tp_store import StoreTimeoutError

pytestmark = pytest.mark.etcd

_BOUND = 30.0


def _stores(etcd: LocalEtcd, **options: Any) -> tuple[EtcdStore, EtcdStore]:
    """A handle that mirrors ``r/`` and a writer, under a prefix of their own."""
    prefix = f"/mirrors/{uuid.uuid4().hex}/"
    waiter = EtcdStore(etcd.endpoints, prefix, timeout=_BOUND, **options)
    waiter.mirror_prefix("r/")
    return waiter, EtcdStore(etcd.endpoints, prefix, timeout=_BOUND)


def test_the_mirror_is_read_in_the_next_transaction_and_waits_then_cost_nothing(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        writer.set("r/0", "before")
        asked, _ = count_requests()
        assert waiter.compare_set("k", "", "1") == b"1"
        assert asked == ["/v3/kv/txn", "watch"]  # the family read rode on the transaction
        assert waiter.wait_get("r/0") == b"before"
        got: list[bytes] = []
        later = threading.Thread(target=lambda: got.append(waiter.wait_get("r/1", _BOUND)))
        later.start()
        writer.set("r/1", "after")
        later.join(_BOUND)
        assert got == [b"after"]
        with waiter.clone() as twin:
            assert twin.wait_get("r/1") == b"after"  # clones share it
        assert asked == ["/v3/kv/txn", "watch", "/v3/kv/put"]  # the writer's put


def test_a_wait_that_comes_first_starts_the_mirror_with_a_read_of_its_own(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        writer.set("r/0", "there")
        asked, _ = count_requests()
        assert waiter.wait_get("r/0") == b"there"
        assert asked == ["/v3/kv/range", "watch"]
        writer.set("r/1", "next")
        assert waiter.wait_get("r/1") == b"next"
        assert asked == ["/v3/kv/range", "watch", "/v3/kv/put"]  # the writer's put


def test_a_missing_key_times_out_and_a_deleted_one_is_missing_again(etcd1: LocalEtcd) -> None:
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        with pytest.raises(StoreTimeoutError):
            waiter.wait_get("r/none", 0.2)
        writer.set("r/gone", "soon")
        assert waiter.wait_get("r/gone") == b"soon"
        assert writer.delete_key("r/gone")
        writer.set("r/marker", "after the delete")
        # Events come in order: once the marker is in, so is the delete.
        assert waiter.wait_get("r/marker") == b"after the delete"
        with pytest.raises(StoreTimeoutError):
            waiter.wait_get("r/gone", 0.2)


def test_keys_outside_the_family_are_waited_for_as_before(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        writer.set("other", "v")
        asked, _ = count_requests()
        assert waiter.wait_get("other") == b"v"
        assert asked == ["/v3/kv/range"]


def test_a_family_too_large_is_waited_for_key_by_key(
    etcd1: LocalEtcd, count_requests: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirrors, "MAX_KEYS", 2)
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        writer.multi_set(["r/1", "r/2", "r/3"], ["1", "2", "3"])
        asked, _ = count_requests()
        assert waiter.wait_get("r/3") == b"3"
        assert waiter.wait_get("r/1") == b"1"
        # The family's read (more than 2 keys), then each key read as it is waited for.
        assert asked == ["/v3/kv/range"] * 3


def test_a_family_that_grows_too_large_is_no_longer_mirrored(
    etcd1: LocalEtcd, count_requests: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirrors, "MAX_BYTES", 1000)
    waiter, writer = _stores(etcd1, transport="grpc")
    with waiter, writer:
        writer.set("r/small", "s")
        assert waiter.wait_get("r/small") == b"s"
        writer.set("r/big", "x" * 2000)
        assert waiter.wait_get("r/big") == b"x" * 2000
        asked, _ = count_requests()
        assert waiter.wait_get("r/small") == b"s"
        assert asked == ["/v3/kv/range"]  # read: the mirror let go of everything


def test_over_the_gateway_a_mirrored_family_is_waited_for_as_before(etcd1: LocalEtcd) -> None:
    waiter, writer = _stores(etcd1, transport="gateway")
    with waiter, writer:
        got: list[bytes] = []
        later = threading.Thread(target=lambda: got.append(waiter.wait_get("r/1", _BOUND)))
        later.start()
        writer.set("r/1", "through the gateway")
        later.join(_BOUND)
        assert got == [b"through the gateway"]


def test_when_the_mirrors_watch_ends_waits_go_on_and_it_starts_again(make_cluster: Any) -> None:
    cluster = make_cluster(3)
    leader = cluster.leader()
    others = [member for member in cluster.members if member is not leader]
    prefix = f"/mirrors/{uuid.uuid4().hex}/"
    endpoints = ",".join(member.client_url for member in [leader, *others])
    with EtcdStore(endpoints, prefix, timeout=_BOUND, transport="grpc") as waiter:
        waiter.mirror_prefix("r/")
        with pytest.raises(StoreTimeoutError):
            waiter.wait_get("r/1", 0.2)  # the mirror started, its watch on the leader's stream
        leader.kill()
        with EtcdStore(",".join(m.client_url for m in others), prefix, timeout=_BOUND) as writer:
            writer.set("r/1", "after the kill")
            assert waiter.wait_get("r/1") == b"after the kill"
            writer.set("r/2", "later")
            assert waiter.wait_get("r/2") == b"later"


def test_the_backends_store_mirrors_the_runs_outcomes(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    run_id = f"mirror-{uuid.uuid4().hex[:8]}"
    params = RendezvousParameters("etcd", etcd1.endpoints, run_id, 1, 1)
    outcome = RunLayout(run_id).outcome(0)
    with create_store(params) as node, create_store(params) as steward:
        node.compare_set("k", "", "1")  # the mirror starts with it
        asked, _ = count_requests()
        steward.set(outcome, "complete")
        assert node.wait_get(outcome) == b"complete"
        assert asked == ["/v3/kv/put"]


def test_the_mirror_goes_with_the_last_handle_that_asked_for_it(
    etcd1: LocalEtcd, count_requests: Any
) -> None:
    waiter, writer = _stores(etcd1, transport="grpc")
    with writer:
        writer.set("r/0", "v")
        with waiter:
            with waiter.clone() as twin:
                assert twin.wait_get("r/0") == b"v"  # started by the clone, held by both
            asked, _ = count_requests()
            assert waiter.wait_get("r/0") == b"v"
            assert asked == []  # the clone's close left it to the first handle
        with EtcdStore(etcd1.endpoints, writer.prefix, timeout=_BOUND, transport="grpc") as again:
            again.mirror_prefix("r/")
            assert again.wait_get("r/0") == b"v"
            assert asked == ["/v3/kv/range", "watch"]  # the last close stopped it: a new one


def test_an_empty_prefix_is_refused(etcd1: LocalEtcd) -> None:
    with (
        EtcdStore(etcd1.endpoints, "/mirrors/", timeout=_BOUND) as store,
        pytest.raises(ValueError, match="must not be empty"),
    ):
        store.mirror_prefix("")
