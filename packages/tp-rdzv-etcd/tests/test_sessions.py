"""Store sessions on etcd leases: the session contract, and what only etcd does.

Wills live in etcd and are pushed by whoever reads their queue, so beyond the
contract these tests kill real session holders (``SIGKILL`` of a process:
nobody revokes its lease), race several readers for one will, and read a
queue only long after its will fell due.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tp_rdzv_etcd import EtcdSession, EtcdStore
from tp_rdzv_etcd.layout import b64, range_end
from tp_rdzv_etcd.local import LocalEtcd
from tp_store import (
    PrefixStore,
    QueueEmptyError,
    SessionExpiredError,
    Store,
    StoreTimeoutError,
)
from tp_store.testing.contract import TIMEOUT, Call, Harness
from tp_store.testing.session_contract import LONG, StoreSessionContract

pytestmark = pytest.mark.etcd

#: The shortest lease etcd grants with its default election timeout (1 s).
ETCD_MIN_TTL = 2


class _Attaching(EtcdStore):
    """A handle whose sessions go through it (``attach_session``), as a node's presence does."""

    def open_session(self, timeout: Any) -> Any:
        return self.attach_session(timeout)


@pytest.fixture(params=["etcd-1", "etcd-3", "prefix-etcd-1", "gateway-etcd-1", "attached-etcd-1"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    cluster = request.getfixturevalue("etcd3" if request.param == "etcd-3" else "etcd1")
    # Keep-alives on the process's gRPC stream by default; through the gateway as well.
    transport = "gateway" if request.param.startswith("gateway") else "auto"
    kind = _Attaching if request.param.startswith("attached") else EtcdStore
    opener: Callable[[], Store] = functools.partial(
        kind,
        cluster.endpoints,
        f"/sessions/{uuid.uuid4().hex}/",
        timeout=TIMEOUT,
        lease_transport=transport,
    )
    if request.param.startswith("prefix"):
        etcd_opener = opener
        opener = lambda: PrefixStore("run", etcd_opener())  # noqa: E731
    built = Harness(opener(), opener, crosses_processes=True)
    yield built
    built.close()


class TestEtcdSessions(StoreSessionContract):
    """The store-session contract on etcd (one and three members), also under a
    PrefixStore, with keep-alives through the JSON gateway, and attached to the
    caller's handle."""


@pytest.fixture
def store(etcd1: LocalEtcd) -> Iterator[EtcdStore]:
    with EtcdStore(etcd1.endpoints, f"/sessions/{uuid.uuid4().hex}/", timeout=TIMEOUT) as opened:
        yield opened


def test_an_attached_session_leaves_its_handle_open(store: EtcdStore) -> None:
    session = store.attach_session(ETCD_MIN_TTL)
    session.set("present/a", "1")
    session.add_will("departures", "a gone")
    store.set("plain", "2")  # the handle serves its other calls meanwhile
    session.keep_alive()
    assert store.get("present/a") == b"1"
    session.close()
    assert not store.check(["present/a"])
    assert store.queue_pop("departures") == b"a gone"
    # The handle outlives its session: it still reads, writes and waits.
    store.set("after", "3")
    assert store.wait_get("after", 5) == b"3"
    assert store.get("plain") == b"2"


def test_presence_push_and_read_are_one_revision(store: EtcdStore) -> None:
    store.set("lease", "held")
    session = store.attach_session(ETCD_MIN_TTL)
    held = session.set_with_will_push_and_get(
        "present/a",
        "token",
        "departures",
        "a gone",
        push_onto="mailbox",
        push="a joins",
        get="lease",
    )
    assert held == b"held"
    layout = store._layout
    (present,) = store._range(layout.value(b"present/a"))["kvs"]
    queue = layout.queue(b"mailbox")
    (pushed,) = store._range(queue, range_end(queue))["kvs"]
    # One transaction: no other client's write can come between them.
    assert present["mod_revision"] == pushed["create_revision"]
    assert present["lease"] == str(session.lease)
    session.close()
    assert store.queue_pop("departures") == b"a gone"


# A session holder in a process of its own: it opens a session, writes a key and
# a will through it, says "ready", then keeps the session alive until killed.
_HOLDER = """
import sys, time
from tp_rdzv_etcd import EtcdSession, EtcdStore
endpoints, prefix, name = sys.argv[1:4]
store = EtcdStore(endpoints, prefix, timeout=30)
session = store.open_session(1)
session.set("present/" + name, "token-" + name)
session.add_will("departures", name + " left")
session.add_will("departures", name + " really left")
print(session.timeout, flush=True)
while True:
    session.keep_alive()
    time.sleep(0.2)
"""


class Holder:
    """A process holding a session (see ``_HOLDER``); ``kill()`` is ``SIGKILL``."""

    def __init__(self, store: EtcdStore, name: str) -> None:
        endpoints = ",".join(store.endpoints)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, endpoints, store.prefix.decode(), name],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the session exists once this is read
        assert line, f"the holder {name} died before it was ready"
        self.timeout = float(line)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()


@pytest.fixture
def holders() -> Iterator[Callable[[EtcdStore, str], Holder]]:
    started: list[Holder] = []

    def start(store: EtcdStore, name: str) -> Holder:
        started.append(Holder(store, name))
        return started[-1]

    yield start
    for holder in started:
        holder.close()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_a_session_lease_is_at_least_etcd_minimum_ttl(store: EtcdStore) -> None:
    with store.open_session(0.5) as session:
        assert session.timeout == ETCD_MIN_TTL
    with store.open_session(2.2) as session:
        assert session.timeout == 3


def test_a_killed_holder_keys_vanish_and_its_wills_wake_a_blocked_popper(
    store: EtcdStore, holders: Callable[[EtcdStore, str], Holder]
) -> None:
    holder = holders(store, "a")
    reader = store.clone()
    popper = Call(lambda: reader.queue_pop("departures"))
    popper.assert_blocked()
    # Kept alive past its TTL: still present, and nothing pushed.
    time.sleep(holder.timeout + 1)
    assert store.get("present/a") == b"token-a"
    assert store.queue_len("departures") == 0
    holder.kill()
    assert popper.outcome() == b"a left"
    assert not store.check(["present/a"])
    assert store.queue_pop("departures", block=False) == b"a really left"
    assert store.queue_len("departures") == 0


def test_a_will_is_pushed_once_however_many_readers_race(
    store: EtcdStore, holders: Callable[[EtcdStore, str], Holder]
) -> None:
    holder = holders(store, "a")
    readers = [store.clone() for _ in range(4)]
    waiters = [Call(lambda reader=reader: reader.wait(["departures"])) for reader in readers]
    for waiter in waiters:
        waiter.assert_blocked()
    holder.kill()
    for waiter in waiters:
        waiter.outcome()  # every reader woke when the lease expired, and pushed what was due
    assert [reader.queue_len("departures") for reader in readers] == [2] * len(readers)
    assert store.queue_pop_many("departures", 10) == [b"a left", b"a really left"]


def test_a_will_due_while_nobody_read_is_pushed_by_a_later_reader(
    store: EtcdStore, holders: Callable[[EtcdStore, str], Holder]
) -> None:
    first, second = holders(store, "a"), holders(store, "b")
    first.kill()
    second.kill()
    # Nobody reads the queue meanwhile: the wills stay due, in etcd.
    wait_until(
        lambda: not store.check(["present/a"]) and not store.check(["present/b"]),
        "the leases of the killed holders expired",
    )
    assert store.list_keys() == []  # wills are no keys
    late = EtcdStore(store.endpoints, store.prefix, timeout=TIMEOUT)
    values = late.queue_pop_many("departures", 10)
    # Each session's wills in the order it added them, each once.
    assert sorted(values) == [b"a left", b"a really left", b"b left", b"b really left"]
    assert values.index(b"a left") < values.index(b"a really left")
    assert values.index(b"b left") < values.index(b"b really left")
    assert store.queue_len("departures") == 0


def test_live_wills_make_no_queue_and_no_key(store: EtcdStore) -> None:
    with store.open_session(LONG) as session:
        session.add_will("departures", "gone")
        assert not store.check(["departures"])
        assert store.queue_len("departures") == 0
        assert store.num_keys() == 0
        with pytest.raises(StoreTimeoutError):
            store.wait(["departures"], 0.3)
    assert store.queue_len("departures") == 1


@pytest.mark.parametrize(
    "use",
    [
        lambda session: session.set("present/a", "again"),
        lambda session: session.compare_set("present/a", "", "again"),
        lambda session: session.add_will("departures", "gone"),
        lambda session: session.keep_alive(),
    ],
    ids=["set", "compare_set", "add_will", "keep_alive"],
)
def test_a_session_whose_lease_is_gone_finds_out_at_its_next_use(
    etcd1: LocalEtcd, use: Callable[[EtcdSession], object]
) -> None:
    # Through the gateway every keep-alive waits for its answer (on the gRPC
    # stream a recent session's may not: test_lease_stream.py).
    store = EtcdStore(
        etcd1.endpoints,
        f"/sessions/{uuid.uuid4().hex}/",
        timeout=TIMEOUT,
        lease_transport="gateway",
    )
    session = store.open_session(LONG)
    assert isinstance(session, EtcdSession)
    session.set("present/a", "token")
    # Revoked behind its back, as etcd does when the lease expires.
    store._call("/v3/lease/revoke", {"ID": str(session.lease)})
    with pytest.raises(SessionExpiredError, match="expired"):
        use(session)
    assert session.ended
    assert not store.check(["present/a"])
    assert store.queue_len("departures") == 0  # nothing written with the lease gone
    session.close()
    store.close()


def test_a_will_record_deleted_by_hand_leaves_readers_working(store: EtcdStore) -> None:
    with store.open_session(LONG) as session:
        assert isinstance(session, EtcdSession)
        session.add_will("departures", "gone")
        # As `etcdctl del` of the record would: its mark stays, a will that can never fall due.
        record = store._layout.will_record(b"departures", session.lease, 0)
        store._call("/v3/kv/deleterange", {"key": b64(record)})
        assert store.queue_len("departures") == 0
        assert not store.check(["departures"])
        with pytest.raises(QueueEmptyError):
            store.queue_pop("departures", block=False)
    assert store.queue_len("departures") == 0
