"""What a node's round costs etcd: its lease, one transaction to join, one read of its answer.

Real handlers from the registry on a real etcd; each node's own handle is
watched (the steward works on a handle of its own).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_rdzv_dynamic import DynamicRendezvousHandler
from tp_rdzv_etcd.local import LocalEtcd

pytestmark = pytest.mark.etcd


def _count_calls(handler: DynamicRendezvousHandler) -> list[str]:
    """The requests of ``handler``'s own handle from now on: paths, and a txn's
    operations (``if`` the keys it compares, ``else`` the failure branch's)."""
    transport = handler._board.store._transport  # type: ignore[attr-defined]
    call = transport.call
    asked: list[str] = []

    def counted(path: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        words = [path]
        if path == "/v3/kv/txn":
            compared = [base64.b64decode(c["key"]).decode() for c in body.get("compare", [])]
            words += [f"if {key}" for key in compared]
            words += [next(iter(op)) for op in body.get("success", [])]
            if body.get("failure"):
                words += ["else", *(next(iter(op)) for op in body["failure"])]
        asked.append(" ".join(words))
        return call(path, body, *args, **kwargs)

    transport.call = counted
    return asked


def _lease_key(handler: DynamicRendezvousHandler) -> str:
    """The etcd key of the run's steward lease."""
    board = handler._board  # type: ignore[attr-defined]
    return str(board.store._layout.value(board.keys.lease.encode()).decode())


def test_a_node_joins_with_one_transaction(etcd1: LocalEtcd) -> None:
    config = {"etcd_prefix": f"/joins/{uuid.uuid4().hex}", "read_timeout": 30}
    handlers = [
        create_handler(RendezvousParameters("etcd", etcd1.endpoints, "run", 3, 3, **config))
        for _ in range(3)
    ]
    try:
        steward, *others = handlers
        counts = [_count_calls(handler) for handler in others]
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(steward.next_rendezvous)
            # The first node takes the lease; the others find it held.
            deadline = time.monotonic() + 30
            while not steward._office.running:  # type: ignore[attr-defined]
                assert not first.done(), first.exception()
                assert time.monotonic() < deadline, "no node took the lease"
                time.sleep(0.01)
            rounds = [pool.submit(handler.next_rendezvous) for handler in others]
            infos = [future.result(timeout=60) for future in [first, *rounds]]
        assert sorted(info.rank for info in infos) == [0, 1, 2]
        for asked in counts:
            # Its lease; present, posted and the lease read in one transaction; its answer
            # (and, for one node of the process, the outcome it waited for). Reads only
            # after that: a range, or a transaction of ranges when the nodes of the
            # process read at once (one sends the others' reads with its own).
            assert asked[0] == "/v3/lease/grant", asked
            # The lease claimed if missing (it was not: the steward held it), else read.
            assert asked[1] == (
                f"/v3/kv/txn if {_lease_key(steward)} "
                "request_put request_put request_put request_put request_put "
                "else request_put request_put request_range request_put request_put"
            ), asked
            for read in asked[2:]:
                path, *ops = read.split()
                assert path == "/v3/kv/range" or (path == "/v3/kv/txn" and ops), asked
                assert set(ops) <= {"request_range"}, asked
            assert len(asked) <= 4, asked
    finally:
        for handler in handlers:
            handler.shutdown()


def test_a_node_joining_a_later_round_asks_for_it_again(etcd1: LocalEtcd) -> None:
    config = {
        "etcd_prefix": f"/joins/{uuid.uuid4().hex}",
        "read_timeout": 30,
        "last_call_timeout": 0.5,  # the first round: two of at most three
    }
    handlers = [
        create_handler(RendezvousParameters("etcd", etcd1.endpoints, "run", 2, 3, **config))
        for _ in range(3)
    ]
    try:
        *first, late = handlers
        with ThreadPoolExecutor(3) as pool:
            for future in [pool.submit(handler.next_rendezvous) for handler in first]:
                assert future.result(timeout=60).world_size == 2
            asked = _count_calls(late)
            pending = pool.submit(late.next_rendezvous)
            rounds = [pool.submit(handler.next_rendezvous) for handler in first]
            infos = [future.result(timeout=60) for future in [pending, *rounds]]
        assert {info.world_size for info in infos} == {3}
        assert sorted(info.rank for info in infos) == [0, 1, 2]
        # The lease named round 1 as the join went: asked for round 0 (any), it asks again.
        assert " else request_put request_put request_range" in asked[1], asked
        assert "/v3/kv/put" in asked[2:], asked
    finally:
        for handler in handlers:
            handler.shutdown()


def test_in_a_jobs_first_round_the_lease_is_taken_by_a_join_and_swapped_by_none(
    etcd1: LocalEtcd,
) -> None:
    config = {"etcd_prefix": f"/joins/{uuid.uuid4().hex}", "read_timeout": 30}
    size = 8
    handlers = [
        create_handler(RendezvousParameters("etcd", etcd1.endpoints, "run", size, size, **config))
        for _ in range(size)
    ]
    try:
        counts = [_count_calls(handler) for handler in handlers]
        start = threading.Barrier(size)

        def join(handler: DynamicRendezvousHandler) -> Any:
            start.wait(30)
            return handler.next_rendezvous()

        with ThreadPoolExecutor(size) as pool:
            infos = [f.result(timeout=60) for f in [pool.submit(join, h) for h in handlers]]
        assert sorted(info.rank for info in infos) == list(range(size))
        lease = _lease_key(handlers[0])
        # Every join went with the lease's claim; no node compared-and-set it after.
        for asked in counts:
            assert asked[1].startswith(f"/v3/kv/txn if {lease} "), asked
        swaps = [call for asked in counts for call in asked[2:] if f"if {lease}" in call]
        assert swaps == [], swaps
        running = [handler._office.running for handler in handlers]  # type: ignore[attr-defined]
        assert running.count(True) == 1
    finally:
        for handler in handlers:
            handler.shutdown()
