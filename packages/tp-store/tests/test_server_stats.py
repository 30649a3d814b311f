"""The server's counters, the ``STATS`` extension, and the server's structured log records.

A real :class:`StoreServer` runs in this process (a :class:`ServerThread`) on
127.0.0.1, on asyncio's event loop and, when installed, on uvloop's. Clients
are our :class:`TCPStore` and raw sockets whose every byte is known, so byte
counts can be checked exactly. Ordering is never left to sleeps: the tests
poll the server's counters until a condition holds.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

import pytest
from raw_client import EVENT_LOOPS, Raw, server_thread, wait_until

import tp_store.server.store_server as server_module
from tp_store import (
    HashStore,
    PrefixStore,
    ServerStats,
    StoreError,
    TCPStore,
    UnsupportedOperationError,
)
from tp_store.protocol import (
    EXTENSION_ACCEPT,
    EXTENSION_OFFER,
    STATS_SCHEMA,
    Add,
    Barrier,
    Get,
    Opcode,
    Ping,
    Set,
    Stats,
    Validate,
    Wait,
    decode_stats,
    encode_i64,
    encode_u8,
    encode_u32,
)
from tp_store.server.store_server import ServerThread, StoreServer

#: How long any single step may take before the test fails (generous for loaded CI).
TIMEOUT = 10.0
#: What our client sends first on every connection: VALIDATE, then the extension offer.
HANDSHAKE = Validate().encode() + Ping(EXTENSION_OFFER).encode()


@pytest.fixture(params=EVENT_LOOPS)
def server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StoreServer]:
    """A fresh server on 127.0.0.1 in a thread, on the event loop named by the parameter."""
    with server_thread(request.param, monkeypatch) as thread:
        yield thread.server


@pytest.fixture
def client(server: StoreServer) -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        yield store
    finally:
        store.close()


def no_ops_but(**expected: int) -> dict[str, int]:
    """The ``ops`` counts of a server that received exactly ``expected``."""
    return {opcode.name.lower(): expected.get(opcode.name.lower(), 0) for opcode in Opcode}


# ---------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------


def test_a_fresh_server_counts_nothing(server: StoreServer) -> None:
    stats = server.stats()
    assert stats["schema"] == STATS_SCHEMA
    assert stats["ops"] == no_ops_but()
    assert [
        stats[name]  # type: ignore[literal-required]
        for name in (
            "connections_open",
            "connections_accepted",
            "connections_protocol_errors",
            "waiters_parked",
            "keys",
            "bytes_received",
            "bytes_sent",
        )
    ] == [0] * 7
    assert stats["uptime_seconds"] >= 0
    assert stats["tp_store_version"] == server_module.__version__


def test_counts_after_a_known_sequence_are_exact(server: StoreServer) -> None:
    raw = Raw(server.port, validate=False)
    raw.send(HANDSHAKE)
    assert raw.read_exact(4) == encode_u32(EXTENSION_ACCEPT)
    raw.send(Set(b"a", b"1").encode() + Set(b"b", b"2").encode())
    raw.send(Add(b"n", 2).encode())
    assert raw.read_exact(8) == encode_i64(2)
    raw.send(Add(b"n", 3).encode())
    assert raw.read_exact(8) == encode_i64(5)
    raw.send(Get(b"a").encode())
    assert raw.read_blob() == b"1"
    raw.send(Wait((b"a", b"b")).encode())
    assert raw.read_exact(1) == encode_u8(0)
    received_before = raw.received
    raw.send(Stats().encode())
    over_the_wire = decode_stats(raw.read_blob())
    # The document is written before its own reply is sent, and after its request arrived.
    assert over_the_wire["bytes_sent"] == received_before
    assert over_the_wire["bytes_received"] == raw.sent
    stats = server.stats()
    assert stats["ops"] == no_ops_but(validate=1, ping=1, set=2, add=2, get=1, wait=1, stats=1)
    assert stats["connections_open"] == stats["connections_accepted"] == 1
    assert stats["keys"] == 3  # a, b, n
    assert stats["bytes_received"] == raw.sent
    assert stats["bytes_sent"] == raw.received
    assert over_the_wire["ops"] == stats["ops"]
    raw.close()


def test_parked_waiters_are_counted_while_they_wait(server: StoreServer) -> None:
    waiter, barrier, writer = Raw(server.port), Raw(server.port), Raw(server.port)
    waiter.send(Wait((b"later",)).encode())
    barrier.send(Barrier(b"meet", 2).encode())
    wait_until(lambda: server.stats()["waiters_parked"] == 2, "both clients are parked")
    writer.send(Set(b"later", b"x").encode())
    assert waiter.read_exact(1) == encode_u8(0)
    wait_until(lambda: server.stats()["waiters_parked"] == 1, "the wait is over")
    barrier.close()  # closing drops the parked barrier
    wait_until(lambda: server.stats()["waiters_parked"] == 0, "the barrier is dropped")
    waiter.close()
    writer.close()


def test_connections_open_and_accepted(server: StoreServer) -> None:
    clients = [Raw(server.port, validate=False) for _ in range(3)]
    wait_until(lambda: server.stats()["connections_open"] == 3, "three connections are open")
    for raw in clients[:2]:
        raw.close()
    wait_until(lambda: server.stats()["connections_open"] == 1, "two connections are closed")
    stats = server.stats()
    assert stats["connections_accepted"] == 3
    assert stats["connections_protocol_errors"] == 0
    clients[2].close()


def test_a_protocol_error_is_counted_and_logged_with_fields(
    server: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tp_store.server")
    raw = Raw(server.port, validate=False)
    raw.send(Validate().encode() + bytes([0x7F]))  # an opcode nobody defines
    raw.assert_closed()
    wait_until(lambda: server.stats()["connections_open"] == 0, "the connection is gone")
    assert server.stats()["connections_protocol_errors"] == 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.name == "tp_store.server"
    assert "closing connection from 127.0.0.1:" in warning.getMessage()
    assert warning.action == "protocol_error"  # type: ignore[attr-defined]
    assert warning.peer == f"127.0.0.1:{raw.sock.getsockname()[1]}"  # type: ignore[attr-defined]
    assert warning.reason == "unknown opcode 127"  # type: ignore[attr-defined]
    assert warning.duration >= 0  # type: ignore[attr-defined]
    closed = [r for r in caplog.records if getattr(r, "action", None) == "connection_close"]
    assert [r.reason for r in closed] == ["unknown opcode 127"]  # type: ignore[attr-defined]
    raw.close()


def test_bytes_of_woken_waits_are_counted(server: StoreServer) -> None:
    waiter, writer = Raw(server.port), Raw(server.port)
    waiter.send(Wait((b"k",)).encode())
    wait_until(lambda: server.stats()["waiters_parked"] == 1, "the wait is parked")
    writer.send(Set(b"k", b"v").encode())
    assert waiter.read_exact(1) == encode_u8(0)
    stats = server.stats()
    assert stats["bytes_sent"] == 1
    assert stats["bytes_received"] == waiter.sent + writer.sent
    waiter.close()
    writer.close()


# ---------------------------------------------------------------------------
# STATS over the wire
# ---------------------------------------------------------------------------


def test_our_client_reads_the_stats(server: StoreServer, client: TCPStore) -> None:
    client.set("x", "1")
    assert client.get("x") == b"1"
    stats = client.server_stats()
    assert set(stats) == set(ServerStats.__annotations__)
    assert stats["ops"]["set"] == 1
    assert stats["ops"]["wait_get"] == 1  # get is one WAIT_GET round trip on our server
    assert stats["ops"]["stats"] == 1
    assert stats["connections_open"] == 1
    assert stats["keys"] == 1
    assert stats["bytes_received"] > 0
    assert stats["bytes_sent"] > 0
    assert client.server_stats()["ops"]["stats"] == 2


def test_prefix_store_forwards_to_the_underlying_store(client: TCPStore) -> None:
    prefixed = PrefixStore("job", client)
    prefixed.set("x", "1")
    assert prefixed.server_stats()["keys"] == 1


def test_in_process_stats_of_a_master() -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT)
    try:
        assert master.server is not None
        master.add("x", 1)  # a round trip: the server has counted it once it answers
        stats = master.server.stats()  # read from this thread, not the server's
        assert stats["ops"]["add"] == 1
        assert stats["connections_open"] == 1
        assert master.server_stats()["ops"]["stats"] == 1
    finally:
        master.close()


def test_stats_read_while_clients_work(server: StoreServer, client: TCPStore) -> None:
    stop = threading.Event()

    def work() -> None:
        worker = client.clone()
        try:
            while not stop.is_set():
                worker.add("n", 1)
        finally:
            worker.close()

    thread = threading.Thread(target=work)
    thread.start()
    try:
        wait_until(lambda: server.stats()["ops"]["add"] >= 20, "the worker is adding")
        seen = [server.stats()["ops"]["add"] for _ in range(200)]
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert seen == sorted(seen)  # totals never go back
    adds = client.server_stats()["ops"]["add"]
    assert client.add("n", 0) == adds  # every add the worker made, and no other


def test_a_plain_pytorch_client_never_gets_stats(
    server: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(server.port, validate=False)
    # A PyTorch client's handshake: VALIDATE, then PING with its pid as the nonce.
    raw.send(Validate().encode() + Ping(os.getpid()).encode())
    assert raw.read_exact(4) == encode_u32(os.getpid())
    raw.send(Set(b"a", b"1").encode() + Get(b"a").encode())
    assert raw.read_blob() == b"1"
    # STATS without the extension offer is an opcode a PyTorch server would not know.
    raw.send(Stats().encode())
    assert raw.assert_closed() == b""
    wait_until(lambda: server.stats()["connections_protocol_errors"] == 1, "the error is counted")
    assert any("STATS sent before" in r.getMessage() for r in caplog.records)
    raw.close()


def test_other_stores_have_no_server_stats() -> None:
    store = HashStore()
    with pytest.raises(UnsupportedOperationError, match="HashStore has no store server"):
        store.server_stats()
    with pytest.raises(UnsupportedOperationError):
        PrefixStore("p", store).server_stats()
    assert issubclass(UnsupportedOperationError, StoreError)
    assert issubclass(UnsupportedOperationError, NotImplementedError)


# ---------------------------------------------------------------------------
# Structured log records
# ---------------------------------------------------------------------------


def test_start_stop_and_connections_are_logged_with_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tp_store.server")
    thread = ServerThread(StoreServer("127.0.0.1", 0))
    thread.start()
    endpoint = thread.server.endpoint
    store = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    assert store._sock is not None
    peer = f"127.0.0.1:{store._sock.getsockname()[1]}"
    store.close()
    wait_until(lambda: thread.server.stats()["connections_open"] == 0, "the client is gone")
    thread.stop()
    records = {r.action: r for r in caplog.records if r.name == "tp_store.server"}  # type: ignore[attr-defined]
    assert set(records) == {"server_start", "connection_open", "connection_close", "server_stop"}
    assert records["server_start"].endpoint == endpoint  # type: ignore[attr-defined]
    assert records["server_start"].getMessage() == f"store server listening on {endpoint}"
    assert records["server_stop"].duration > 0  # type: ignore[attr-defined]
    assert records["connection_open"].peer == peer  # type: ignore[attr-defined]
    closed = records["connection_close"]
    assert closed.levelno == logging.DEBUG
    assert closed.peer == peer  # type: ignore[attr-defined]
    assert closed.reason == "closed by the client"  # type: ignore[attr-defined]
    assert closed.duration > 0  # type: ignore[attr-defined]
