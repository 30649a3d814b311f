"""The store server against hostile and unlucky clients, over real loopback sockets.

Each test runs a real :class:`StoreServer` in this process (a
:class:`ServerThread`), on asyncio's event loop and, when installed, on
uvloop's, and talks to it with raw sockets. Anything malformed must close
only the offending connection, with a log line, while clients connected
before and after keep being served. Ordering is never left to sleeps: the
tests wait for conditions on the server's loop (a request has arrived, a wait
is parked, a connection is gone), and a close is asserted with a read timeout.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from raw_client import EVENT_LOOPS, Raw, server_thread, wait_until

import tp_store
from tp_store.protocol import (
    EXTENSION_ACCEPT,
    EXTENSION_OFFER,
    Add,
    Barrier,
    CancelWait,
    Get,
    Ping,
    ReplyKind,
    Set,
    Validate,
    Wait,
    WaitGet,
)
from tp_store.server.store_server import ServerThread, StoreServer
from tp_store.stores.tcp_store import TCPStore

#: How long any single step may take before the test fails (generous for loaded CI).
TIMEOUT = 10.0
VALIDATE = Validate().encode()
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")
_T = TypeVar("_T")


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


class Server:
    """A server thread plus read-only views of its internals, taken on its loop."""

    def __init__(self, thread: ServerThread) -> None:
        self.thread = thread
        self.store = thread.server

    @property
    def port(self) -> int:
        return self.store.port

    def on_loop(self, function: Callable[[], _T]) -> _T:
        return self.thread.call(function)

    def connection_count(self) -> int:
        return self.on_loop(lambda: len(self.store.connections))

    def buffered(self) -> list[int]:
        """Bytes each connection has received but not parsed yet."""
        return self.on_loop(lambda: [c._session.buffered for c in self.store.connections])

    def waiters_on(self, key: bytes) -> int:
        return self.on_loop(lambda: len(self.store.state._waiters.get(key, ())))

    def barrier_waiters(self, key: bytes) -> int:
        return self.on_loop(lambda: len(self.store.state._barriers.get(key, ())))

    def no_waiters(self) -> bool:
        state = self.store.state
        return self.on_loop(lambda: not state._waiters and not state._barriers)

    def nodelay_flags(self) -> list[int]:
        def flags() -> list[int]:
            result = []
            for connection in self.store.connections:
                transport = connection._transport
                assert transport is not None
                sock = transport.get_extra_info("socket")
                result.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            return result

        return self.on_loop(flags)


def check_healthy(server: Server, *clients: Raw) -> None:
    """Existing clients and a brand new one all get answers."""
    for client in clients:
        client.ping()
    fresh = Raw(server.port)
    try:
        fresh.send(Set(b"health", b"ok").encode())
        assert fresh.request(Get(b"health").encode(), ReplyKind.BYTES) == b"ok"
    finally:
        fresh.close()


@pytest.fixture(params=EVENT_LOOPS)
def server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A fresh server on 127.0.0.1, on the event loop named by the parameter."""
    with server_thread(request.param, monkeypatch) as thread:
        yield Server(thread)


def closing_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        record.name == "tp_store.server" and "closing connection" in record.getMessage()
        for record in caplog.records
    )


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], f"the server logged errors: {errors}"


# ---------------------------------------------------------------------------
# Partial and malformed input
# ---------------------------------------------------------------------------


def test_request_sent_one_byte_at_a_time_is_served(server: Server) -> None:
    frames = [VALIDATE, Set(b"slow", b"value").encode(), Get(b"slow").encode(), Ping(9).encode()]
    stream = b"".join(frames)
    ends = [sum(len(frame) for frame in frames[: i + 1]) for i in range(len(frames))]
    client = Raw(server.port, validate=False)
    for sent in range(1, len(stream) + 1):
        client.send(stream[sent - 1 : sent])
        # Every byte is seen by the server on its own: it parses partial frames.
        expected = sent - max([end for end in ends if end <= sent], default=0)
        wait_until(
            lambda: server.buffered() == [expected],  # noqa: B023 - called before the next loop
            f"the server has received byte {sent}",
        )
    assert client.read_reply(ReplyKind.BYTES) == b"value"
    assert client.read_reply(ReplyKind.U32) == 9


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff" * 16,
        b"GET / HTTP/1.1\r\nHost: store\r\n\r\n",
        Set(b"k", b"v").encode(),  # a valid request, but not a VALIDATE
        Ping(1).encode(),
        Validate(0xDEADBEEF).encode(),  # wrong magic
        Validate(0).encode() + VALIDATE,
    ],
    ids=["ff", "http", "set-first", "ping-first", "bad-magic", "zero-magic"],
)
def test_garbage_first_message_closes_only_that_connection(
    server: Server, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    before = Raw(server.port)
    before.ping()
    bad = Raw(server.port, validate=False)
    bad.send(garbage)
    assert bad.assert_closed() == b""
    check_healthy(server, before)
    assert closing_logged(caplog)
    no_errors_logged(caplog)
    # A connection that was refused stored nothing.
    assert before.request(Get(b"k").encode(), ReplyKind.BYTES) == b""


BAD_REQUESTS = {
    "unknown-opcode-19": b"\x13",
    "unknown-opcode-0xdf": b"\xdf",
    "unknown-opcode-0xff": b"\xff" + b"\x00" * 20,
    "huge-key-length": b"\x03" + U64.pack(2**60),
    "huge-key-length-2**63": b"\x03" + U64.pack(2**63),
    "huge-value-length": b"\x01" + U64.pack(1) + b"k" + U64.pack(2**60),
    "key-over-8KiB": Get(b"k" * (8 * 1024 + 1)).encode(),
    "too-many-keys": b"\x06" + U64.pack(128 * 1024 + 1),
    "too-many-keys-2**63": b"\x05" + U64.pack(2**63),
    "negative-multi-set-count": b"\x0b" + I64.pack(-1),
    "request-while-waiting": Wait((b"never",)).encode() + Get(b"x").encode(),
    "wait-get-then-request": WaitGet((b"never",)).encode() + Ping(3).encode(),
    "barrier-then-request": Barrier(b"never-bar", 5).encode() + Ping(3).encode(),
}


@pytest.mark.parametrize("payload", list(BAD_REQUESTS.values()), ids=list(BAD_REQUESTS))
def test_bad_request_closes_only_that_connection(
    server: Server, caplog: pytest.LogCaptureFixture, payload: bytes
) -> None:
    before = Raw(server.port)
    before.ping()
    bad = Raw(server.port)
    bad.ping()  # a good request first: the connection was really established and validated
    bad.send(payload)
    assert bad.assert_closed() == b""
    check_healthy(server, before)
    assert closing_logged(caplog)
    no_errors_logged(caplog)
    wait_until(lambda: server.connection_count() == 1, "only the good client is left")
    assert server.no_waiters()


def test_add_on_a_non_integer_closes_only_that_connection(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    before = Raw(server.port)
    bad = Raw(server.port)
    bad.send(Set(b"text", b"abc").encode())
    bad.send(Add(b"text", 1).encode())
    assert bad.assert_closed() == b""
    assert any("text" in r.getMessage() for r in caplog.records if "closing" in r.getMessage())
    check_healthy(server, before)
    no_errors_logged(caplog)
    assert before.request(Get(b"text").encode(), ReplyKind.BYTES) == b"abc"


def test_add_out_of_int64_closes_only_that_connection(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    before = Raw(server.port)
    bad = Raw(server.port)
    assert bad.request(Add(b"big", 2**63 - 1).encode(), ReplyKind.I64) == 2**63 - 1
    bad.send(Add(b"big", 1).encode())
    assert bad.assert_closed() == b""
    check_healthy(server, before)
    no_errors_logged(caplog)
    assert before.request(Add(b"big", -1).encode(), ReplyKind.I64) == 2**63 - 2


def test_replies_before_a_bad_request_are_still_sent(server: Server) -> None:
    bad = Raw(server.port)
    bad.send(Ping(1).encode() + Add(b"n", 5).encode() + b"\xee")
    assert bad.assert_closed() == Ping(1).encode()[1:] + I64.pack(5)


def test_client_killed_mid_request_leaves_the_server_healthy(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    before = Raw(server.port)
    half = Set(b"half", b"x" * 1000).encode()[:500]
    script = textwrap.dedent(
        """
        import socket, sys
        sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        sock.sendall(bytes.fromhex(sys.argv[2]))
        print("sent", flush=True)
        sys.stdin.read()  # hold the connection until killed
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(server.port), (VALIDATE + half).hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], TIMEOUT)
        assert ready, "the child did not connect"
        assert child.stdout.readline() == b"sent\n"
        wait_until(lambda: sorted(server.buffered()) == [0, len(half)], "the half frame arrived")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(TIMEOUT)
        if child.stdin is not None:
            child.stdin.close()
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    wait_until(lambda: server.connection_count() == 1, "the killed client's connection is gone")
    check_healthy(server, before)
    assert before.request(Get(b"half").encode(), ReplyKind.BYTES) == b""
    no_errors_logged(caplog)


def test_connections_closed_early_leave_the_server_healthy(server: Server) -> None:
    before = Raw(server.port)
    Raw(server.port, validate=False).close()  # connects and says nothing
    Raw(server.port).close()  # validates and leaves
    half = Raw(server.port)
    half.send(b"\x01" + U64.pack(3))  # in the middle of a key length
    half.sock.shutdown(socket.SHUT_WR)
    assert half.assert_closed() == b""
    half.close()
    wait_until(lambda: server.connection_count() == 1, "the early leavers are gone")
    check_healthy(server, before)


# ---------------------------------------------------------------------------
# Waits
# ---------------------------------------------------------------------------


def test_cancel_wait_answers_a_pending_wait(server: Server) -> None:
    waiter = Raw(server.port)
    waiter.send(Wait((b"later",)).encode())
    wait_until(lambda: server.waiters_on(b"later") == 1, "the wait is parked")
    assert waiter.request(CancelWait().encode(), ReplyKind.U8) == 1  # WAIT_CANCELED
    assert server.no_waiters()
    # Writing the key now sends nothing to the cancelled client: its next reply is a PING's.
    writer = Raw(server.port)
    writer.send(Set(b"later", b"v").encode())
    writer.ping()
    waiter.ping()
    assert waiter.request(Get(b"later").encode(), ReplyKind.BYTES) == b"v"


def test_cancel_wait_without_a_pending_wait_is_answered(server: Server) -> None:
    client = Raw(server.port)
    assert client.request(CancelWait().encode(), ReplyKind.U8) == 1
    assert client.request(CancelWait().encode() * 2, ReplyKind.U8) == 1
    assert client.read_reply(ReplyKind.U8) == 1
    client.ping()


def test_wait_answered_before_its_cancel_gets_both_replies(server: Server) -> None:
    client = Raw(server.port)
    client.send(Set(b"here", b"v").encode())
    client.send(Wait((b"here",)).encode() + CancelWait().encode())
    assert client.read_reply(ReplyKind.U8) == 0  # STOP_WAITING
    assert client.read_reply(ReplyKind.U8) == 1  # WAIT_CANCELED
    client.ping()


def test_wait_is_woken_by_a_write_from_another_client(server: Server) -> None:
    waiter = Raw(server.port)
    waiter.send(Wait((b"a", b"b")).encode())
    wait_until(lambda: server.waiters_on(b"b") == 1, "the wait is parked")
    writer = Raw(server.port)
    writer.send(Set(b"a", b"1").encode())
    writer.ping()
    waiter.sock.settimeout(0.0)
    with pytest.raises(BlockingIOError):  # not woken by one key of two
        waiter.sock.recv(1)
    waiter.sock.settimeout(TIMEOUT)
    writer.send(Add(b"b", 1).encode())
    assert waiter.read_reply(ReplyKind.U8) == 0
    waiter.ping()


def test_closing_a_connection_drops_its_parked_wait(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    leaver = Raw(server.port)
    stayer = Raw(server.port)
    leaver.send(Wait((b"k",)).encode())
    stayer.send(WaitGet((b"k",)).encode())
    wait_until(lambda: server.waiters_on(b"k") == 2, "both waits are parked")
    leaver.close()
    wait_until(lambda: server.waiters_on(b"k") == 1, "the closed connection's wait is dropped")
    writer = Raw(server.port)
    writer.send(Set(b"k", b"value").encode())
    writer.ping()  # the write did not fail on the dropped waiter
    assert stayer.read_reply(ReplyKind.WAIT_GET, 1) == (0, [b"value"])
    assert server.no_waiters()
    check_healthy(server, stayer, writer)
    no_errors_logged(caplog)


def test_closing_a_connection_parked_in_a_barrier(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    leaver, first, last = Raw(server.port), Raw(server.port), Raw(server.port)
    leaver.send(Barrier(b"bar", 3).encode())
    first.send(Barrier(b"bar", 3).encode())
    wait_until(lambda: server.barrier_waiters(b"bar") == 2, "two members are parked")
    leaver.close()
    wait_until(lambda: server.barrier_waiters(b"bar") == 1, "the closed member is dropped")
    assert last.request(Barrier(b"bar", 3).encode(), ReplyKind.U8) == 0
    assert first.read_reply(ReplyKind.U8) == 0
    assert server.no_waiters()
    check_healthy(server, first, last)
    no_errors_logged(caplog)


# ---------------------------------------------------------------------------
# Scale, addresses, socket options, PING
# ---------------------------------------------------------------------------


def _raise_fd_limit(needed: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def test_500_concurrent_connections(server: Server) -> None:
    count = 500
    _raise_fd_limit(2 * count + 200)  # both ends live in this process
    clients: list[Raw] = []
    try:
        for _ in range(count):
            clients.append(Raw(server.port))
        wait_until(lambda: server.connection_count() == count, f"{count} connections are open")
        for i, client in enumerate(clients):
            client.send(
                Set(b"conn/%d" % i, b"value %d" % i).encode()
                + Add(b"counter", 1).encode()
                + Get(b"conn/%d" % i).encode()
            )
        totals = []
        for i, client in enumerate(clients):
            totals.append(client.read_reply(ReplyKind.I64))
            assert client.read_reply(ReplyKind.BYTES) == b"value %d" % i
        assert sorted(totals) == list(range(1, count + 1))
    finally:
        for client in clients:
            client.close()
    wait_until(lambda: server.connection_count() == 0, "every connection is closed")
    check_healthy(server)


def _bindable(family: socket.AddressFamily, address: str) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _route_source(family: socket.AddressFamily, target: str) -> str | None:
    """The local address the kernel would use towards ``target`` (no packet is sent)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            address: str = probe.getsockname()[0]
    except OSError:
        return None
    return address


def other_local_addresses() -> list[tuple[socket.AddressFamily, str]]:
    """Addresses of this machine other than 127.0.0.1 that a socket can bind."""
    candidates: list[tuple[socket.AddressFamily, str | None]] = [
        (socket.AF_INET, "127.0.0.2"),  # all of 127/8 is local on Linux
        (socket.AF_INET, _route_source(socket.AF_INET, "192.0.2.1")),
        (socket.AF_INET, _route_source(socket.AF_INET, "10.255.255.254")),
        (socket.AF_INET6, "::1"),
        (socket.AF_INET6, _route_source(socket.AF_INET6, "2001:db8::1")),
    ]
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM):
            candidates.append((socket.AddressFamily(info[0]), str(info[4][0])))
    found: list[tuple[socket.AddressFamily, str]] = []
    for family, address in dict.fromkeys(candidates):
        if address is None or address == "127.0.0.1" or "%" in address:
            continue
        if _bindable(family, address):
            found.append((family, address))
    return found


def _connect_refused(family: socket.AddressFamily, address: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        try:
            sock.connect((address, port))
        except ConnectionRefusedError:
            return True
        except OSError as exc:  # unreachable counts as refused too
            return exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)
    return False


def test_server_binds_only_the_address_asked_for(server: Server) -> None:
    others = other_local_addresses()
    if not others:
        pytest.skip("this machine has no local address besides 127.0.0.1")
    for family, address in others:
        assert _connect_refused(family, address, server.port), (
            f"a server bound to 127.0.0.1 accepted a connection on {address}"
        )
    check_healthy(server)


def test_ipv6_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _bindable(socket.AF_INET6, "::1"):
        pytest.skip("::1 cannot be bound on this machine")
    thread = ServerThread(StoreServer("::1", 0))
    thread.start()
    try:
        port = thread.server.port
        assert thread.server.endpoint == f"[::1]:{port}"
        raw = Raw(port, host="::1")
        raw.ping()
        store = TCPStore("::1", port, timeout=TIMEOUT)
        try:
            store.set("six", "v6")
            assert store.get("six") == b"v6"
            assert store.uses_extensions
        finally:
            store.close()
        assert raw.request(Get(b"/six").encode(), ReplyKind.BYTES) == b"v6"
        # Bound to ::1 only (IPV6_V6ONLY): IPv4 loopback is not served.
        assert _connect_refused(socket.AF_INET, "127.0.0.1", port)
        raw.close()
    finally:
        thread.stop()


def test_tcp_nodelay_on_both_ends(server: Server) -> None:
    raw = Raw(server.port)
    raw.ping()
    store = TCPStore("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        store.set("k", "v")
        flags = server.nodelay_flags()
        assert len(flags) == 2
        assert all(flags), f"TCP_NODELAY not set on accepted sockets: {flags}"
        client_sock = store._sock
        assert client_sock is not None
        assert client_sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        store.close()
        raw.close()


@pytest.mark.parametrize(
    "nonce", [0, 1, 4242, 2**22 - 1, 2**32 - 1, EXTENSION_ACCEPT, EXTENSION_OFFER + 1]
)
def test_ping_echoes_the_nonce(server: Server, nonce: int) -> None:
    client = Raw(server.port)
    assert client.request(Ping(nonce).encode(), ReplyKind.U32) == nonce


def test_ping_with_the_extension_offer_is_accepted(server: Server) -> None:
    client = Raw(server.port)
    assert client.request(Ping(EXTENSION_OFFER).encode(), ReplyKind.U32) == EXTENSION_ACCEPT
    assert client.request(Ping(os.getpid()).encode(), ReplyKind.U32) == os.getpid()


def test_our_client_negotiates_the_extension(server: Server) -> None:
    store = TCPStore("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        assert store.uses_extensions
        store.set("x", "1")
        assert store.add("x", 2) == 3
    finally:
        store.close()


# ---------------------------------------------------------------------------
# Slow and trickling clients
# ---------------------------------------------------------------------------


def test_a_client_that_never_reads_stops_being_read(server: Server) -> None:
    value = b"v" * (1 << 20)
    flooder = Raw(server.port)
    flooder.send(Set(b"big", value).encode())
    # 64 replies of 1 MiB that the client never reads: the server must hold the
    # requests back rather than build the replies in memory.
    flooder.send(Get(b"big").encode() * 64)
    wait_until(lambda: max(server.buffered(), default=0) > 0, "the server holds requests back")
    other = Raw(server.port)
    check_healthy(server, other)
    # Once the client reads, every reply arrives, in order.
    for _ in range(64):
        assert flooder.read_reply(ReplyKind.BYTES) == value
    wait_until(lambda: max(server.buffered()) == 0, "the held requests are served")


def test_a_request_trickled_in_small_pieces_is_served(server: Server) -> None:
    keys = [b"key%06d" % i for i in range(20_000)]
    frame = Wait(tuple(keys)).encode()
    client = Raw(server.port)
    client.send(tp_store.protocol.Set(keys[-1], b"1").encode())
    for offset in range(0, len(frame), 512):
        client.send(frame[offset : offset + 512])
    wait_until(lambda: server.waiters_on(keys[0]) == 1, "the wait is parked")
    writer = Raw(server.port)
    writer.send(tp_store.protocol.MultiSet(tuple((key, b"1") for key in keys)).encode())
    assert client.read_reply(ReplyKind.U8) == 0
