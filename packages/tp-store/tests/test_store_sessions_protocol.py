"""The store-session extension's rules on a connection, driven with no socket.

A server's :class:`ServerSession` gets the bytes of ``SESSION_*`` requests
through plain calls, against a real :class:`SessionTable` on an asyncio loop
(its silence timers are loop timers): what a session owns and pushes, when it
ends and why, what the server counts, and every broken rule a
``ProtocolError``. The real server and client run these over TCP in
``test_tcp_sessions.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tp_store.errors import ProtocolError, StoreLimitError
from tp_store.protocol import (
    BYTES_REPLY,
    EXTENSION_OFFER,
    FLAG_REPLY,
    MAX_SESSION_TIMEOUT_MS,
    Limits,
    Ping,
    QueuePop,
    RequestBeforeAuthentication,
    ServerSession,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionWill,
    Set,
    Validate,
    Wait,
)
from tp_store.session_table import SessionTable
from tp_store.state import StoreState

#: A session timeout that never fires during a test.
LONG_MS = 60_000


class Connection:
    """One server-side connection, fed bytes by calls; its replies and closing recorded."""

    def __init__(
        self,
        state: StoreState,
        table: SessionTable | None,
        secret: bytes | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.woken: list[Exception | None] = []
        #: The keys the store held whenever a parked request was woken.
        self.keys_when_woken: list[list[bytes]] = []
        self.closed_because: list[str] = []

        def woken(error: Exception | None) -> None:
            self.woken.append(error)
            self.keys_when_woken.append(list(state.data))

        self.server = ServerSession(
            state,
            limits or Limits(),
            secret=secret,
            stats=dict,  # type: ignore[typeddict-item]
            ops=[0] * 256,
            woken=woken,
            sessions=table,
            expired=self.closed_because.append,
        )

    def send(self, data: bytes) -> bytes:
        """Serve ``data``; what the server replied."""
        self.server.receive(data)
        self.server.serve()
        return self.take()

    def take(self) -> bytes:
        replies = b"".join(self.server.outbox)
        self.server.outbox.clear()
        return replies

    def hello(self, offer: bool = True) -> None:
        """VALIDATE, then a PING offering the extensions (or a PyTorch client's PING)."""
        self.send(Validate().encode() + Ping(EXTENSION_OFFER if offer else 4242).encode())

    def open(self, timeout_ms: int = LONG_MS) -> int:
        self.hello()
        reply = self.send(SessionOpen(timeout_ms).encode())
        return int.from_bytes(reply, "little", signed=True)


def in_loop(test: Callable[[], Awaitable[None]]) -> None:
    """Run ``test`` on a fresh asyncio loop (the session table's timers need one)."""
    asyncio.run(test())  # type: ignore[arg-type]


@pytest.fixture
def state() -> StoreState:
    return StoreState()


def value_reply(value: bytes) -> bytes:
    return BYTES_REPLY.encode(value)


def test_a_session_owns_what_it_writes_and_close_deletes_then_pushes(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        owner, watcher = Connection(state, table), Connection(state, table)
        assert owner.open() == 1
        owner.send(SessionSet(b"present/a", b"token").encode())
        assert owner.send(SessionCompareSet(b"lease", b"", b"a").encode()) == value_reply(b"a")
        owner.send(SessionWill(b"departures", b"a left").encode())
        assert state.data == {b"present/a": b"token", b"lease": b"a"}
        watcher.hello()
        assert watcher.send(Wait((b"departures",)).encode()) == b""  # parked
        assert owner.send(SessionClose().encode()) == (0).to_bytes(8, "little")
        assert watcher.keys_when_woken == [[]], "the wills are pushed after the keys are deleted"
        assert watcher.take() == FLAG_REPLY.encode(0)
        assert state.queue_pop(b"departures") == (1, b"a left")
        assert table.stats() == {
            "sessions_open": 0,
            "sessions_opened": 1,
            "sessions_ended_closed": 1,
            "sessions_ended_disconnected": 0,
            "sessions_ended_expired": 0,
        }
        assert owner.closed_because == []  # SESSION_CLOSE leaves the connection open
        owner.send(Ping(7).encode())

    in_loop(test)


def test_a_closed_connection_ends_its_session(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        owner = Connection(state, table)
        owner.open()
        owner.send(SessionSet(b"present/a", b"token").encode())
        owner.send(SessionWill(b"departures", b"gone").encode())
        owner.server.close()
        assert state.data == {}
        assert state.queue_len(b"departures") == 1
        assert table.stats()["sessions_ended_disconnected"] == 1

    in_loop(test)


def test_ownership_moves_and_a_plain_write_or_delete_clears_it(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        first, second, plain = (Connection(state, table) for _ in range(3))
        first.open()
        second.open()
        plain.hello()
        first.send(SessionSet(b"moved", b"1").encode())
        second.send(SessionSet(b"moved", b"2").encode())
        first.send(SessionSet(b"overwritten", b"1").encode())
        plain.send(Set(b"overwritten", b"plain").encode())
        first.send(SessionSet(b"deleted", b"1").encode())
        state.delete(b"deleted")
        state.set(b"deleted", b"plain")
        first.send(SessionClose().encode())
        assert state.data == {b"moved": b"2", b"overwritten": b"plain", b"deleted": b"plain"}
        second.send(SessionClose().encode())
        assert state.data == {b"overwritten": b"plain", b"deleted": b"plain"}

    in_loop(test)


def test_a_silent_session_ends_and_its_connection_is_closed(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        owner = Connection(state, table)
        owner.open(timeout_ms=50)
        owner.send(SessionWill(b"departures", b"gone").encode())
        while not owner.closed_because:
            await asyncio.sleep(0.01)
        assert "received nothing for more than its timeout of 0.05 s" in owner.closed_because[0]
        assert state.queue_len(b"departures") == 1
        assert owner.server.store_session is None
        assert table.stats()["sessions_ended_expired"] == 1
        owner.server.close()  # what the I/O layer does next: nothing ends twice
        assert table.stats()["sessions_ended_disconnected"] == 0

    in_loop(test)


def test_frames_keep_a_session_open_past_its_timeout(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        owner = Connection(state, table)
        owner.open(timeout_ms=100)
        handle = owner.server.store_session
        assert handle is not None
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            handle.last_frame = time.monotonic()  # what the connection does on each receive
            await asyncio.sleep(0.01)
        assert owner.closed_because == []
        assert table.stats()["sessions_open"] == 1
        while not owner.closed_because:  # silent from now on
            await asyncio.sleep(0.01)

    in_loop(test)


def test_what_a_session_holds_counts_in_the_memory_budget(state: StoreState) -> None:
    async def test() -> None:
        owner = Connection(state, SessionTable(state))
        owner.open()
        assert owner.server.pending_bytes == 0
        owner.send(SessionWill(b"departures", b"x" * 1000).encode())
        owner.send(SessionSet(b"k", b"v").encode())
        held = owner.server.pending_bytes
        assert held > 1000
        owner.send(SessionClose().encode())
        assert owner.server.pending_bytes == 0

    in_loop(test)


def test_a_session_over_its_limits_is_refused_and_nothing_changes(state: StoreState) -> None:
    async def test() -> None:
        limits = Limits(max_session_keys=2, max_session_wills=1)
        bounded = StoreState(max_session_keys=2, max_session_wills=1)
        owner = Connection(bounded, SessionTable(bounded), limits=limits)
        owner.open()
        owner.send(SessionSet(b"a", b"1").encode() + SessionSet(b"b", b"1").encode())
        owner.send(SessionSet(b"a", b"again").encode())  # owned already
        with pytest.raises(StoreLimitError, match="at most 2 keys"):
            owner.send(SessionSet(b"c", b"1").encode())
        assert b"c" not in bounded.data
        owner.send(SessionWill(b"q", b"1").encode())
        with pytest.raises(StoreLimitError, match="at most 1 wills"):
            owner.send(SessionWill(b"q", b"2").encode())
        owner.server.close()
        assert bounded.data == {}
        assert bounded.queue_len(b"q") == 1

    in_loop(test)


REQUESTS_NEEDING_A_SESSION = [
    SessionSet(b"k", b"v"),
    SessionCompareSet(b"k", b"", b"v"),
    SessionWill(b"q", b"v"),
    SessionClose(),
]


@pytest.mark.parametrize("request_", REQUESTS_NEEDING_A_SESSION, ids=lambda r: type(r).__name__)
def test_a_session_request_without_an_open_session_is_a_protocol_error(
    state: StoreState, request_: Any
) -> None:
    async def test() -> None:
        connection = Connection(state, SessionTable(state))
        connection.hello()
        with pytest.raises(ProtocolError, match="without an open store session"):
            connection.send(request_.encode())
        closed = Connection(state, SessionTable(state))
        closed.open()
        closed.send(SessionClose().encode())
        with pytest.raises(ProtocolError, match="without an open store session"):
            closed.send(request_.encode())

    in_loop(test)


@pytest.mark.parametrize(
    ("prepare", "request_", "message"),
    [
        ("pytorch", SessionOpen(LONG_MS), "before the protocol extensions were offered"),
        ("open", SessionOpen(LONG_MS), "twice on one connection"),
        ("extended", SessionOpen(0), "outside 1.."),
        ("extended", SessionOpen(-5), "outside 1.."),
        ("extended", SessionOpen(MAX_SESSION_TIMEOUT_MS + 1), "outside 1.."),
        ("no-sessions", SessionOpen(LONG_MS), "offers no store sessions"),
    ],
)
def test_a_session_opened_against_the_rules_is_a_protocol_error(
    state: StoreState, prepare: str, request_: SessionOpen, message: str
) -> None:
    async def test() -> None:
        connection = Connection(state, None if prepare == "no-sessions" else SessionTable(state))
        if prepare == "open":
            connection.open()
        else:
            connection.hello(offer=prepare != "pytorch")
        with pytest.raises(ProtocolError, match=message):
            connection.send(request_.encode())

    in_loop(test)


def test_a_session_cannot_be_opened_before_authenticating(state: StoreState) -> None:
    async def test() -> None:
        connection = Connection(state, SessionTable(state), secret=b"s" * 32)
        connection.hello()
        with pytest.raises(RequestBeforeAuthentication, match="SESSION_OPEN"):
            connection.send(SessionOpen(LONG_MS).encode())

    in_loop(test)


def test_a_will_wakes_one_queue_popper_waiting_on_another_connection(state: StoreState) -> None:
    async def test() -> None:
        table = SessionTable(state)
        owner, popper = Connection(state, table), Connection(state, table)
        owner.open()
        owner.send(SessionWill(b"departures", b"gone").encode())
        popper.hello()
        # TCPStore's blocking queue_pop: WAIT on the queue, then QUEUE_POP.
        assert popper.send(Wait((b"departures",)).encode()) == b""
        owner.server.close()
        assert popper.woken == [None]
        assert popper.take() == FLAG_REPLY.encode(0)
        assert popper.send(QueuePop(b"departures").encode()) == QueuePop.reply.encode((1, b"gone"))

    in_loop(test)
