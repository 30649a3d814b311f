"""Store sessions over TCP: our client and a real server on 127.0.0.1.

Each test runs on asyncio's event loop and on uvloop's, in plain TCP and in
TLS with the shared secret: the session contract
(:mod:`tp_store.testing.session_contract`), a client process killed with
SIGKILL, a raw client falling silent, and session frames that break the
rules (each closes its connection cleanly; the server serves on).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from raw_client import EVENT_LOOPS, Raw, server_thread, wait_until

from tp_store import (
    Limits,
    PrefixStore,
    SessionExpiredError,
    Store,
    StoreConnectionError,
    StoreTimeoutError,
    TCPStore,
)
from tp_store.protocol import (
    EXTENSION_OFFER,
    FLAG_REPLY,
    Ping,
    ReplyKind,
    SessionClose,
    SessionOpen,
    SessionSet,
    SessionWill,
    Wait,
)
from tp_store.security import SECRET_ENV, SECRET_FILE_ENV, server_ssl_context
from tp_store.server.store_server import ServerThread
from tp_store.testing.contract import TIMEOUT, Call, Harness
from tp_store.testing.session_contract import LONG, StoreSessionContract
from tp_store.testing.tls import TestPKI

SECRET = b"correct horse battery staple"
SECURITY = ("plain", "tls+secret")
#: The user-key prefix TCPStore puts before every key on the wire.
USER = b"/"


@pytest.fixture(autouse=True)
def no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's shell must not lend the clients a secret."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


@dataclass
class Served:
    """A server thread, and how our clients reach it."""

    thread: ServerThread
    client_options: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.thread.server.port

    def client(self, timeout: float = TIMEOUT) -> TCPStore:
        return TCPStore("127.0.0.1", self.port, timeout=timeout, **self.client_options)

    def stats(self) -> dict[str, Any]:
        return dict(self.thread.call(self.thread.server.stats))


def serve(
    event_loop: str, security: str, monkeypatch: pytest.MonkeyPatch, pki: TestPKI, **options: Any
) -> Iterator[Served]:
    if security == "plain":
        with server_thread(event_loop, monkeypatch, **options) as thread:
            yield Served(thread)
        return
    context = server_ssl_context(pki.server_cert, pki.server_key)
    with server_thread(event_loop, monkeypatch, ssl=context, secret=SECRET, **options) as thread:
        yield Served(thread, {"tls_ca": pki.ca, "secret": SECRET})


@pytest.fixture(params=[(loop, security) for loop in EVENT_LOOPS for security in SECURITY])
def served(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, pki: TestPKI
) -> Iterator[Served]:
    yield from serve(*request.param, monkeypatch, pki)


@pytest.fixture(params=EVENT_LOOPS)
def plain(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    with server_thread(request.param, monkeypatch) as thread:
        yield Served(thread)


@pytest.fixture
def harness(served: Served) -> Iterator[Harness]:
    store = served.client()
    built = Harness(store, served.client, crosses_processes=False)
    yield built
    built.close()


class TestTCPSessions(StoreSessionContract):
    """The session contract on TCPStore, on both event loops, plain and TLS with the secret."""


# -- a client process killed ------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from tp_store import TCPStore
    port, ca = int(sys.argv[1]), sys.argv[2] or None
    store = TCPStore("127.0.0.1", port, timeout=30, tls_ca=ca)
    session = store.open_session(600)  # only its connection's end can end it in a test
    session.set("present/holder", "alive")
    session.add_will("departures", "holder gone")
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_client_s_keys_vanish_and_its_wills_wake_a_popper(
    served: Served, pki: TestPKI
) -> None:
    env = dict(os.environ)
    ca = ""
    if served.client_options:  # TLS and the secret
        env[SECRET_ENV] = SECRET.decode()
        ca = str(pki.ca)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(served.port), ca],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "ready\n"
        observer = served.client()
        assert observer.get("present/holder") == b"alive"
        popper = Call(lambda: observer.queue_pop("departures"))
        popper.assert_blocked()
        holder.send_signal(signal.SIGKILL)
        # Woken by the kernel closing the dead process's socket, not by any timeout:
        # the session's is 600 s, the popper's 10 s.
        assert popper.outcome() == b"holder gone"
        assert not observer.check(["present/holder"])
        stats = served.stats()
        assert stats["sessions_ended_disconnected"] == 1
        assert stats["sessions_open"] == 0
        observer.close()
    finally:
        holder.kill()
        holder.wait()


# -- silence ----------------------------------------------------------------------------


def test_a_silent_raw_client_loses_its_session_and_its_connection(plain: Served) -> None:
    silent = Raw(plain.port)
    silent.send(Ping(EXTENSION_OFFER).encode())
    silent.read_exact(4)
    assert silent.request(SessionOpen(200).encode(), ReplyKind.I64) == 1
    silent.send(SessionSet(USER + b"present/silent", b"x").encode())
    silent.send(SessionWill(USER + b"departures", b"silent gone").encode())
    observer = plain.client()
    assert observer.queue_pop("departures") == b"silent gone"
    assert silent.assert_closed() == b""
    assert not observer.check(["present/silent"])
    stats = plain.stats()
    assert stats["sessions_ended_expired"] == 1
    assert stats["connections_protocol_errors"] == 0
    observer.close()


def test_pings_keep_a_raw_session_alive(plain: Served) -> None:
    client = Raw(plain.port)
    client.send(Ping(EXTENSION_OFFER).encode())
    client.read_exact(4)
    client.request(SessionOpen(1000).encode(), ReplyKind.I64)
    client.send(SessionSet(USER + b"present/pinger", b"x").encode())
    observer = plain.client()
    until = time.monotonic() + 2.0  # twice the timeout, nothing but pings
    while time.monotonic() < until:
        client.ping()
        time.sleep(0.05)
    assert observer.check(["present/pinger"])
    assert client.request(SessionClose().encode(), ReplyKind.I64) == 0
    assert not observer.check(["present/pinger"])
    assert plain.stats()["sessions_ended_closed"] == 1
    observer.close()


def test_a_stalled_server_does_not_take_a_pinging_client_for_silent(plain: Served) -> None:
    store, writer = plain.client(), plain.client()
    session = store.open_session(0.3)
    stalled = threading.Event()

    def stall(value: bytes) -> bool:
        # The whole server stops, past the session's timeout, while it reads a request
        # (uvloop then runs its due timers before it reads the sockets again).
        stalled.set()
        time.sleep(1.0)
        return True

    state = plain.thread.server.state
    plain.thread.call(lambda: state.watch(b"/stall", stall))
    staller = threading.Thread(target=writer.set, args=("stall", "now"))
    staller.start()
    assert stalled.wait(TIMEOUT)
    # Sent during the stall: unread when the server comes back and its timer is overdue.
    session.keep_alive()
    staller.join()
    session.keep_alive()
    assert plain.stats()["sessions_ended_expired"] == 0
    session.close()
    store.close()
    writer.close()


# -- bad frames -------------------------------------------------------------------------


def _extended(port: int) -> Raw:
    raw = Raw(port)
    raw.send(Ping(EXTENSION_OFFER).encode())
    raw.read_exact(4)
    return raw


_U64_MAX = (2**64 - 1).to_bytes(8, "little")


@pytest.mark.parametrize(
    ("frames", "extended"),
    [
        pytest.param(SessionSet(b"k", b"v").encode(), True, id="set-without-session"),
        pytest.param(SessionClose().encode(), True, id="close-without-session"),
        pytest.param(SessionOpen(60_000).encode(), False, id="open-without-extensions"),
        pytest.param(SessionOpen(0).encode(), True, id="zero-timeout"),
        pytest.param(SessionOpen(-(2**63)).encode(), True, id="negative-timeout"),
        pytest.param(SessionOpen(60_000).encode() * 2, True, id="open-twice"),
        pytest.param(
            SessionOpen(60_000).encode() + bytes([0xE5]) + _U64_MAX, True, id="huge-key-length"
        ),
        pytest.param(
            SessionOpen(60_000).encode() + bytes([0xE7, 1, 0, 0, 0, 0, 0, 0, 0, 0x71]) + _U64_MAX,
            True,
            id="huge-will-length",
        ),
        pytest.param(
            SessionOpen(60_000).encode() + SessionWill(b"q", b"1").encode() * 3,
            True,
            id="over-the-wills-limit",
        ),
        pytest.param(bytes([0xE6]) + b"\x00" * 3, True, id="truncated-then-silent"),
    ],
)
def test_bad_session_frames_close_the_connection_cleanly(
    monkeypatch: pytest.MonkeyPatch, frames: bytes, extended: bool
) -> None:
    limits = Limits(max_session_wills=2)
    with server_thread("asyncio", monkeypatch, limits=limits, request_timeout=0.5) as thread:
        port = thread.server.port
        raw = _extended(port) if extended else Raw(port)
        raw.send(frames)
        raw.assert_closed()
        wait_until(lambda: thread.server.stats()["sessions_open"] == 0, "the session ended")
        # The server serves on, and nothing of the broken session is left.
        with TCPStore("127.0.0.1", port, timeout=TIMEOUT) as store:
            store.set("after", "1")
            assert store.get("after") == b"1"
            assert store.num_keys() == 1
            assert store.queue_len("q") == 0
        stats = thread.server.stats()
        assert stats["connections_protocol_errors"] + stats["connections_timed_out"] == 1


def test_the_wills_of_a_session_over_a_limit_are_still_pushed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with server_thread("asyncio", monkeypatch, limits=Limits(max_session_keys=1)) as thread:
        raw = _extended(thread.server.port)
        raw.send(SessionOpen(60_000).encode() + SessionWill(USER + b"q", b"pushed").encode())
        raw.send(SessionSet(USER + b"a", b"1").encode() + SessionSet(USER + b"b", b"1").encode())
        raw.assert_closed()
        with TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT) as store:
            assert store.queue_pop("q") == b"pushed"
            assert store.num_keys() == 0


# -- the client --------------------------------------------------------------------------


def test_a_session_connection_never_reconnects(served: Served) -> None:
    store = served.client()
    session = store.open_session(LONG)
    session.add_will("departures", "gone")
    session.keep_alive()  # the will is in
    for connection in list(served.thread.server.connections):
        if connection._session.store_session is not None:  # the session's, not the store's
            served.thread.call(functools.partial(connection.close, "dropped by the test"))
    assert store.queue_pop("departures") == b"gone"
    with pytest.raises(SessionExpiredError, match="connection was lost"):
        session.keep_alive()
    assert session.ended
    with pytest.raises(SessionExpiredError):
        session.set("k", "v")
    assert served.stats()["sessions_opened"] == 1
    session.close()
    store.close()


def test_a_prefix_store_session_over_tcp(plain: Served) -> None:
    store: Store = PrefixStore("run", plain.client())
    with store.open_session(LONG) as session:
        session.set("present/a", "1")
        session.add_will("departures", "a gone")
        assert store.list_keys() == ["present/a"]
    assert store.list_keys() == []
    assert store.queue_pop("departures") == b"a gone"
    store.close()


def test_close_answers_once_the_keys_are_deleted_and_the_wills_pushed(plain: Served) -> None:
    store = plain.client()
    for round_ in range(20):
        session = store.open_session(LONG)
        session.set("present/a", "1")
        session.add_will("departures", f"{round_}")
        session.close()
        assert not store.check(["present/a"])
        assert store.queue_pop("departures", block=False) == f"{round_}".encode()
    store.close()


def test_stats_count_sessions_by_how_they_ended(plain: Served) -> None:
    store = plain.client()
    store.open_session(LONG).close()
    session = store.open_session(0.2)
    session.add_will("departures", "expired")
    assert store.queue_pop("departures") == b"expired"
    wait_until(
        lambda: plain.stats()["connections_open"] == 1, "the silent session's connection closed"
    )
    stats = store.server_stats()
    assert stats.get("sessions_opened") == 2
    assert stats.get("sessions_ended_closed") == 1
    assert stats.get("sessions_ended_expired") == 1
    assert stats.get("sessions_ended_disconnected") == 0
    assert stats["ops"]["session_open"] == 2
    store.close()


def test_a_parked_wait_on_the_will_queue_gets_its_answer_once(plain: Served) -> None:
    store = plain.client()
    raw = Raw(plain.port)
    raw.send(Wait((USER + b"departures",)).encode())
    with store.open_session(LONG) as session:
        session.add_will("departures", "gone")
    assert raw.read_exact(1) == FLAG_REPLY.encode(0)
    raw.ping()
    store.close()


# -- a session attached to the store handle's own connection ----------------------------


class _Attaching(TCPStore):
    """A client whose sessions live on its own connection (``attach_session``)."""

    def open_session(self, timeout: Any) -> Any:
        return self.attach_session(timeout)


@pytest.fixture
def attached_harness(served: Served) -> Iterator[Harness]:
    def client() -> TCPStore:
        return _Attaching("127.0.0.1", served.port, timeout=TIMEOUT, **served.client_options)

    built = Harness(client(), client, crosses_processes=False)
    yield built
    built.close()


class TestAttachedTCPSessions(StoreSessionContract):
    """The session contract on sessions attached to the store handle's connection."""

    @pytest.fixture
    def harness(self, attached_harness: Harness) -> Harness:
        return attached_harness


def test_an_attached_session_costs_no_connection(plain: Served) -> None:
    store = plain.client()
    accepted = plain.stats()["connections_accepted"]
    session = store.attach_session(LONG)
    session.set("present/a", "1")
    session.add_will("departures", "a gone")
    store.set("plain", "2")  # the handle serves its other calls meanwhile
    session.keep_alive()
    assert store.get("present/a") == b"1"
    assert plain.stats()["connections_accepted"] == accepted
    session.close()
    assert not store.check(["present/a"])
    assert store.queue_pop("departures") == b"a gone"
    assert store.get("plain") == b"2"  # the connection outlives its session
    assert plain.stats()["connections_accepted"] == accepted
    store.close()


def test_a_long_wait_does_not_silence_an_attached_session(plain: Served) -> None:
    store, observer = plain.client(), plain.client()
    session = store.attach_session(0.3)
    session.set("present/a", "1")
    # Four timeouts parked on a key that never comes: sliced, never silent that long.
    with pytest.raises(StoreTimeoutError):
        store.wait(["never"], 1.2)
    session.keep_alive()
    assert observer.get("present/a") == b"1"
    assert plain.stats().get("sessions_ended_expired", 0) == 0
    # A wait that is satisfied across slices gets its value.
    writer = threading.Timer(0.5, observer.set, ("later", "v"))
    writer.start()
    try:
        assert store.wait_get("later", 30) == b"v"
    finally:
        writer.join()
    session.close()
    store.close()
    observer.close()


def test_a_ping_skips_a_connection_another_thread_waits_on(plain: Served) -> None:
    store, observer = plain.client(), plain.client()
    session = store.attach_session(LONG)
    waiter = Call(lambda: store.wait_get("woken", 60))
    wait_until(lambda: plain.stats()["waiters_parked"] == 1, "the wait parked")
    session.keep_alive()  # returns at once: the waiter's frames keep the session alive
    assert waiter.is_alive()
    observer.set("woken", "yes")
    assert waiter.outcome() == b"yes"
    session.close()
    store.close()
    observer.close()


def _drop_session_connections(served: Served) -> None:
    """The server closes every connection that holds a session."""
    for connection in list(served.thread.server.connections):
        if connection._session.store_session is not None:
            served.thread.call(functools.partial(connection.close, "dropped by the test"))


def test_an_attached_session_ends_with_its_connection(plain: Served) -> None:
    store = plain.client()
    session = store.attach_session(LONG)
    session.add_will("departures", "gone")
    session.keep_alive()  # the will is in
    _drop_session_connections(plain)
    with pytest.raises(SessionExpiredError, match="connection was lost"):
        session.keep_alive()
    assert session.ended
    # The handle reconnects for its own calls; the session stayed with the old connection.
    assert store.queue_pop("departures") == b"gone"
    with pytest.raises(SessionExpiredError):
        session.set("k", "v")
    store.set("k", "v")
    assert store.get("k") == b"v"
    store.close()


def test_a_request_after_the_store_closed_the_idle_connection_goes_on_a_new_one(
    served: Served,
) -> None:
    store, observer = served.client(), served.client()
    session = store.attach_session(0.6)
    store.set("before", "1")
    observer.get("before")
    # The store closes the connection, as it does when the session of a stopped
    # process expires; the connection lies idle past half the session's timeout.
    _drop_session_connections(served)
    idle_from = time.monotonic()
    wait_until(lambda: time.monotonic() - idle_from > 0.3, "idle")
    # SET has no reply: on the closed connection it would be lost without a word.
    store.set("after", "2")
    assert observer.get("after") == b"2"
    assert store.get("after") == b"2"
    assert store.connections_made == 2
    with pytest.raises(SessionExpiredError):
        session.keep_alive()  # it ended with its connection
    store.close()
    observer.close()


def test_an_attached_session_never_reconnects_for_its_own_requests(plain: Served) -> None:
    store = plain.client(timeout=4)
    session = store.attach_session(LONG)
    session.keep_alive()
    plain.thread.stop()
    # The handle's own call finds the store gone and retries for its timeout.
    with pytest.raises(StoreConnectionError):
        store.get("k")
    # The session's PING does not: it ended with its connection.
    began = time.monotonic()
    with pytest.raises(SessionExpiredError, match="connection"):
        session.keep_alive()
    assert time.monotonic() - began < 2, "the PING retried connecting"
    assert session.ended
    store.close()


def test_calls_that_waited_for_a_failed_connect_fail_with_it(plain: Served) -> None:
    store = plain.client(timeout=4)
    store.set("k", "v")
    plain.thread.stop()
    with pytest.raises(StoreConnectionError):
        store.check(["k"])  # the connection is gone now
    outcomes: dict[str, tuple[float, BaseException | None]] = {}

    def call(name: str) -> None:
        try:
            store.get("k")
            outcomes[name] = (time.monotonic(), None)
        except BaseException as exc:
            outcomes[name] = (time.monotonic(), exc)

    first = threading.Thread(target=call, args=("first",))
    first.start()
    wait_until(store._lock.locked, "the first call is connecting")
    second = threading.Thread(target=call, args=("second",))
    second.start()
    first.join(30)
    second.join(30)
    (first_done, first_error), (second_done, second_error) = outcomes["first"], outcomes["second"]
    assert isinstance(first_error, StoreConnectionError)
    assert isinstance(second_error, StoreConnectionError)
    assert "cannot connect" in str(second_error)
    # Not a second store timeout of retries after the first one's.
    assert second_done - first_done < 2
    store.close()
