"""``Store.wait_any``: the first of several keys, over TCP (a real server on 127.0.0.1),
in process (``HashStore``) and through a ``PrefixStore``; the stores without it say so.

Over TCP it is one request, ``WAIT_ANY``, which the server parks on every key
it names and answers when the first is written. The raw-client tests hold the
server to the rules a client relies on: the wait leaves no trace on the keys
it did not get, ``WAIT_KEEPALIVE`` keeps it parked, and a malformed
``WAIT_ANY`` closes its connection while the server serves on.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_client import Raw, wait_until

from tp_store import (
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    StoreTimeoutError,
    TCPStore,
    UnsupportedOperationError,
)
from tp_store.protocol import (
    EXTENSION_ACCEPT,
    EXTENSION_OFFER,
    Ping,
    ReplyKind,
    SessionOpen,
    WaitAny,
    WaitKeepAlive,
    WaitReply,
)
from tp_store.server.store_server import ServerThread
from tp_store.testing.contract import SHORT, TIMEOUT, Call

#: The user-key prefix TCPStore puts before every key on the wire.
USER = b"/"


def _client(server: ServerThread) -> TCPStore:
    return TCPStore("127.0.0.1", server.server.port, timeout=TIMEOUT)


def _stats(server: ServerThread) -> dict:
    return dict(server.call(server.server.stats))


@pytest.fixture(params=["tcp", "hash", "prefix"])
def stores(request: pytest.FixtureRequest, server: ServerThread) -> Iterator[tuple[Store, Store]]:
    """A store under test and a second handle on its data (the writer)."""
    if request.param == "hash":
        store = HashStore()
        yield store, store
        return
    waiter, writer = _client(server), _client(server)
    if request.param == "prefix":
        yield PrefixStore("run", waiter), PrefixStore("run", writer)
    else:
        yield waiter, writer
    waiter.close()
    writer.close()


def test_the_first_key_that_exists_comes_back_with_its_value(stores: tuple[Store, Store]) -> None:
    store, writer = stores
    writer.set("b", b"\x00value b")
    writer.set("c", "value c")
    assert store.wait_any(["a", "b", "c"], SHORT) == (1, b"\x00value b")
    writer.set("a", "")
    # SET has no reply: read back on the writer's connection, it is in before the
    # wait (else the wait, on another connection, may come first and find b).
    assert writer.get("a") == b""
    assert store.wait_any(["a", "b"], SHORT) == (0, b"")


def test_a_key_holding_a_queue_reads_as_empty(stores: tuple[Store, Store]) -> None:
    store, writer = stores
    writer.queue_push("mailbox", "message")
    assert store.wait_any(["outcome", "mailbox"], SHORT) == (1, b"")
    assert writer.queue_pop("mailbox") == b"message"  # the wait took nothing


@pytest.mark.parametrize("write", ["set", "queue_push", "add"])
def test_a_wait_ends_with_the_first_write_of_any_key(
    stores: tuple[Store, Store], write: str
) -> None:
    store, writer = stores
    waiter = Call(functools.partial(store.wait_any, ["outcome", "vacated"], TIMEOUT))
    waiter.assert_blocked()
    if write == "add":
        writer.add("vacated", 1)
    else:
        getattr(writer, write)("vacated", "1")
    assert waiter.outcome() == (1, b"" if write == "queue_push" else b"1")
    # The handle serves on, and the other key written later wakes nobody.
    writer.set("outcome", "done")
    assert store.get("outcome") == b"done"
    assert store.wait_any(["outcome"], SHORT) == (0, b"done")


def test_a_session_will_ends_a_wait(stores: tuple[Store, Store]) -> None:
    store, writer = stores
    session = writer.open_session(TIMEOUT)
    session.set("steward", "lease")
    session.add_will("vacated/3", "1")
    waiter = Call(functools.partial(store.wait_any, ["result/7", "vacated/3"], TIMEOUT))
    waiter.assert_blocked()
    session.close()
    assert waiter.outcome() == (1, b"")


def test_none_in_time_is_a_timeout_naming_the_keys(stores: tuple[Store, Store]) -> None:
    store, writer = stores
    with pytest.raises(StoreTimeoutError, match=r"late', '.*later'"):
        store.wait_any(["late", "later"], SHORT)
    writer.set("late", "1")
    assert store.wait_any(["late", "later"], SHORT) == (0, b"1")


def test_no_keys_is_refused(stores: tuple[Store, Store]) -> None:
    store, _ = stores
    with pytest.raises(ValueError, match="at least one key"):
        store.wait_any([], SHORT)


def test_a_store_without_it_says_so(tmp_path: Path) -> None:
    with (
        FileStore(str(tmp_path / "store"), 1) as store,
        pytest.raises(UnsupportedOperationError, match="wait_any"),
    ):
        store.wait_any(["a"], SHORT)


@pytest.mark.parametrize("write", ["set", "queue_push", "will"])
def test_every_waiter_wakes_at_the_first_write(server: ServerThread, write: str) -> None:
    # A push onto a queue wakes one of the waits that pop (WAIT, as PyTorch's
    # queue_pop waits); WAIT_ANY takes nothing, and every one of them wakes.
    writer = _client(server)
    popper = _client(server)
    waiters = [_client(server) for _ in range(20)]
    calls = [Call(functools.partial(w.wait_any, ["a", "b"], TIMEOUT)) for w in waiters]
    pop = Call(functools.partial(popper.queue_pop, "b"))
    wait_until(lambda: _stats(server)["waiters_parked"] == 21, "every wait parked")
    if write == "will":
        session = writer.open_session(TIMEOUT)
        session.add_will("b", "1")
        session.close()
    else:
        getattr(writer, write)("b", "1")
    value = b"1" if write == "set" else b""
    assert [call.outcome() for call in calls] == [(1, value)] * 20
    if write == "set":
        writer.queue_push("b", "1")  # the popper's turn
    assert pop.outcome() == b"1"
    assert _stats(server)["waiters_parked"] == 0
    assert not server.server.state._waiters
    for store in [writer, popper, *waiters]:
        store.close()


# -- the server's rules, from a raw client -----------------------------------------------
def _extended(server: ServerThread) -> Raw:
    raw = Raw(server.server.port)
    assert raw.request(Ping(EXTENSION_OFFER).encode(), ReplyKind.U32) == EXTENSION_ACCEPT
    return raw


def test_the_wait_leaves_no_trace_on_the_keys_it_did_not_get(server: ServerThread) -> None:
    raw, writer = _extended(server), _client(server)
    raw.send(WaitAny((USER + b"a", USER + b"b")).encode())
    wait_until(lambda: _stats(server)["waiters_parked"] == 1, "the wait parked")
    writer.set("a", "1")
    assert raw.read_reply(ReplyKind.WAIT_GET, 2) == (WaitReply.STOP_WAITING, [b"0", b"1"])
    state = server.server.state
    assert not state._waiters, "a woken WAIT_ANY stays registered on its other key"
    writer.set("b", "2")  # nobody waits: no reply comes to the raw client
    raw.ping(7)  # the next reply on its connection is its PING's
    raw.close()
    writer.close()


def test_keepalives_keep_a_wait_parked_without_a_reply(server: ServerThread) -> None:
    raw, writer = _extended(server), _client(server)
    session_id = raw.request(SessionOpen(60_000).encode(), ReplyKind.I64)
    assert session_id > 0
    raw.send(WaitAny((USER + b"late",)).encode())
    for _ in range(3):
        raw.send(WaitKeepAlive().encode())
    wait_until(lambda: _stats(server)["ops"].get("wait_keepalive", 0) == 3, "the keepalives")
    assert _stats(server)["waiters_parked"] == 1
    writer.set("late", "v")
    assert raw.read_reply(ReplyKind.WAIT_GET, 2) == (WaitReply.STOP_WAITING, [b"0", b"v"])
    raw.close()
    writer.close()


def test_a_wait_any_without_keys_closes_its_connection(server: ServerThread) -> None:
    raw = _extended(server)
    raw.send(WaitAny(()).encode())
    raw.assert_closed()
    with _client(server) as store:  # the server serves on
        store.set("a", "1")
        assert store.wait_any(["a"], SHORT) == (0, b"1")


def test_an_attached_session_outlives_a_long_wait_any(server: ServerThread) -> None:
    store, observer = _client(server), _client(server)
    session = store.attach_session(0.3)
    session.set("present/a", "1")
    with pytest.raises(StoreTimeoutError):
        store.wait_any(["never", "nor"], 1.2)
    session.keep_alive()
    assert observer.get("present/a") == b"1"
    stats = _stats(server)
    assert stats.get("sessions_ended_expired", 0) == 0
    # Parked once: kept alive by WAIT_KEEPALIVE frames, cancelled only at its timeout.
    assert stats["ops"]["wait_any"] == 1
    assert stats["ops"]["wait_keepalive"] >= 3
    assert stats["ops"]["cancel_wait"] == 1
    session.close()
    store.close()
    observer.close()
