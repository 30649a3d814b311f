"""Failover between members, the registry entry, a store with nobody to talk to, and
requests abandoned when a new leader is elected."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.client.rpc import RaftTerm
from tp_rdzv_etcd.local import LocalEtcd, free_ports
from tp_store import StoreConnectionError

pytestmark = pytest.mark.etcd


def _prefix() -> str:
    return f"/failover/{uuid.uuid4().hex}/"


def test_a_dead_first_member_is_skipped(etcd1: LocalEtcd) -> None:
    (dead,) = free_ports(1)
    with EtcdStore(f"127.0.0.1:{dead},{etcd1.endpoints}", _prefix(), timeout=10) as store:
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert store.add("n", 2) == 2


def test_nobody_listening_fails_fast() -> None:
    ports = free_ports(3)
    endpoints = ",".join(f"127.0.0.1:{port}" for port in ports)
    with EtcdStore(endpoints, _prefix(), timeout=30) as store:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError):
            store.get("k")
        assert time.monotonic() - started < 5


def test_ops_and_waits_survive_the_leader(make_cluster: Callable[[int], LocalEtcd]) -> None:
    cluster = make_cluster(3)
    leader = cluster.leader()
    others = [member for member in cluster.members if member is not leader]
    endpoints = ",".join(member.client_url for member in [leader, *others])
    prefix = _prefix()
    with EtcdStore(endpoints, prefix, timeout=30) as store, store.clone() as waiter:
        store.set("before", "1")
        got: list[bytes] = []
        blocked = threading.Thread(target=lambda: got.append(waiter.wait_get("after", 30)))
        blocked.start()
        for _ in range(20):
            store.add("counter", 1)
        killed = time.monotonic()
        leader.kill()
        for _ in range(20):
            store.add("counter", 1)
        store.set("after", "2")
        blocked.join(30)
        assert got == [b"2"], "the waiter did not see the write after the leader died"
        assert time.monotonic() - killed < 15
        # A new leader answered; counted at least once each (see the store's docstring).
        assert int(store.get("counter")) >= 40
        assert store.get("before") == b"1"


def test_the_registry_builds_an_etcd_handler(etcd1: LocalEtcd) -> None:
    params = RendezvousParameters("etcd", etcd1.endpoints, "reg-run", 1, 1, read_timeout=10)
    handler = create_handler(params)
    try:
        assert handler.get_backend() == "etcd"
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


@pytest.mark.parametrize("answered_first", [True, False])
def test_a_request_of_an_older_raft_term_is_abandoned(answered_first: bool) -> None:
    """A call waits for its answer unless an answer from a newer term (a new leader) comes
    first: then it is given up on at once, as one whose answer was lost."""
    term = RaftTerm()
    term.saw({"header": {"raft_term": "3"}})
    pending: Future[bytes] = Future()
    pending.set_running_or_notify_cancel()
    since = term.current

    def meanwhile() -> None:
        if answered_first:
            pending.set_result(b"answer")
        else:
            term.saw({"header": {"raft_term": "4"}})  # another call's answer, after an election

    threading.Thread(target=meanwhile).start()
    assert term.await_answer(pending, since, probe=lambda: None) is answered_first
    assert term.current == (3 if answered_first else 4)


def test_before_any_term_is_known_a_request_waits_for_its_answer() -> None:
    term = RaftTerm()
    pending: Future[bytes] = Future()
    pending.set_running_or_notify_cancel()

    def meanwhile() -> None:
        term.saw({"header": {"raft_term": "2"}})  # the first answer: no older term to compare
        pending.set_result(b"answer")

    threading.Thread(target=meanwhile).start()
    assert term.await_answer(pending, 0, probe=lambda: None)


def test_a_request_held_with_nothing_else_answered_learns_the_new_term_by_asking() -> None:
    """A write held by a follower whose leader died, in a process with no other
    call answered: the process asks a member for its term while it waits, and
    gives the write up once the member names a newer one."""
    term = RaftTerm()
    term.saw({"header": {"raft_term": "3"}})
    pending: Future[bytes] = Future()
    pending.set_running_or_notify_cancel()  # never answered
    asked: list[int] = []

    def probe() -> None:
        asked.append(1)
        if len(asked) == 1:
            raise ConnectionError("no leader yet")  # refused during the election
        term.saw({"header": {"raft_term": "4"}})  # the follower's term once elected

    assert not term.await_answer(pending, term.current, probe)
    assert len(asked) == 2
    assert term.current == 4


def test_a_pause_between_passes_ends_when_a_new_leader_answers() -> None:
    """A call that found no leader on any member waits out its back-off only until
    another call's answer names a newer term: then it retries at once, once."""
    term = RaftTerm()
    term.saw({"header": {"raft_term": "3"}})
    pause = term.pauses()
    paused = threading.Thread(target=pause, args=(60,))
    paused.start()
    deadline = time.monotonic() + 30
    while not term._waiting:  # the pause has begun
        assert time.monotonic() < deadline
        time.sleep(0.01)
    term.saw({"header": {"raft_term": "4"}})  # another call's answer, from the new leader
    paused.join(30)
    assert not paused.is_alive()
    # The next pause of the same call waits again: term 4 is no news to it.
    started = time.monotonic()
    pause(0.2)
    assert time.monotonic() - started >= 0.2
