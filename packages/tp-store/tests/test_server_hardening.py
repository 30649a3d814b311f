"""The server against clients that do not authenticate, do not read, or take
more than their share, over real loopback sockets on both event loops.

Each test runs a real :class:`StoreServer` in this process (a
:class:`ServerThread`) with the options it needs, and raw sockets or our
:class:`TCPStore` as the clients. Ordering is never left to sleeps: the tests
wait for conditions read on the server's loop, or hold the loop still while
they line requests up.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import pytest
from raw_client import EVENT_LOOPS, TIMEOUT, Raw, server_thread, wait_until

import tp_store
from tp_store import Limits, StoreConnectionError, TCPStore
from tp_store.protocol import (
    EXTENSION_ACCEPT,
    EXTENSION_OFFER,
    Add,
    AuthChallenge,
    Get,
    MultiSet,
    Opcode,
    Ping,
    ReplyKind,
    Validate,
    encode_u32,
)
from tp_store.server.store_server import ServerThread
from tp_store.testing.tls import TestPKI

SECRET = b"a secret long enough for the store"
U64 = struct.Struct("<Q")
_T = TypeVar("_T")


@pytest.fixture(params=EVENT_LOOPS)
def event_loop(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@contextmanager
def serving(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, **options: object
) -> Iterator[ServerThread]:
    with server_thread(event_loop, monkeypatch, **options) as thread:
        yield thread


def on_loop(thread: ServerThread, function: Callable[[], _T]) -> _T:
    return thread.call(function)


def open_count(thread: ServerThread) -> int:
    return on_loop(thread, lambda: len(thread.server.connections))


def stats(thread: ServerThread) -> dict[str, object]:
    return dict(thread.server.stats())


def small_window_socket(port: int) -> socket.socket:
    """A connected socket with a receive buffer of a few KiB (set before connecting)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    return sock


def send_ignoring_resets(sock: socket.socket, data: bytes, timeout: float = 1.0) -> None:
    """Send what the server takes within ``timeout``; it may close the connection on the way."""
    sock.settimeout(timeout)
    with suppress(OSError):
        sock.sendall(data)


@contextmanager
def loop_held(thread: ServerThread) -> Iterator[None]:
    """Hold the server's event loop still (requests pile up in the kernel) until the end."""
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:
        held.set()
        release.wait(TIMEOUT)

    thread._loop.call_soon_threadsafe(hold)
    assert held.wait(TIMEOUT)
    try:
        yield
    finally:
        release.set()


def records(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "tp_store.server" and getattr(r, "action", None) == action
    ]


# ---------------------------------------------------------------------------
# D1: a client that never authenticates is dropped, reading or not
# ---------------------------------------------------------------------------


def shrink_send_buffers(thread: ServerThread) -> None:
    """Give the server's connections a send buffer of a few KiB (on its loop)."""
    for connection in thread.server.connections:
        transport = connection._transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


def connect_when_there_is_room(port: int, **options: object) -> TCPStore:
    """Our client, retrying while the server is at its connection limit (up to TIMEOUT)."""
    stores: list[TCPStore] = []

    def connected() -> bool:
        try:
            stores.append(TCPStore("127.0.0.1", port, timeout=TIMEOUT, **options))  # type: ignore[arg-type]
        except StoreConnectionError as exc:
            if "connection limit" not in str(exc):
                raise
            return False
        return True

    wait_until(connected, "the server has room for a client with the secret")
    return stores[0]


def test_pre_auth_clients_that_stop_reading_cannot_hold_the_connection_slots(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tp_store.server")
    with serving(
        event_loop, monkeypatch, secret=SECRET, max_connections=4, request_timeout=5.0
    ) as thread:
        port = thread.server.port
        # As many connections as the server takes send VALIDATE, then PINGs
        # into a small receive window, and never read. The server's send
        # buffers are small too, so that its replies back up at once.
        flooders = [small_window_socket(port) for _ in range(4)]
        for sock in flooders:
            sock.sendall(Validate().encode())
        wait_until(lambda: open_count(thread) == 4, "the server has every connection")
        on_loop(thread, lambda: shrink_send_buffers(thread))
        for sock in flooders:
            send_ignoring_resets(sock, Ping(1).encode() * 200_000, timeout=1.0)
        # Every one of them is dropped, and a client with the secret gets in.
        wait_until(lambda: open_count(thread) == 0, "every hostile connection is gone")
        store = connect_when_there_is_room(port, secret=SECRET)
        store.set("k", "v")
        assert store.get("k") == b"v"
        store.close()
        # Each was closed, logged and counted once: later sweeps find nothing to do.
        on_loop(thread, thread.server._sweep)
        on_loop(thread, thread.server._sweep)
        closed = stats(thread)
        assert closed["connections_auth_failures"] + closed["connections_timed_out"] == 4  # type: ignore[operator]
        closing = [r for r in caplog.records if "closing connection" in r.getMessage()]
        assert len(closing) == 4, [r.getMessage() for r in closing]
        for sock in flooders:
            sock.close()


def test_pre_auth_clients_that_send_nothing_more_are_timed_out_once(
    event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(
        event_loop, monkeypatch, secret=SECRET, max_connections=5, request_timeout=1.0
    ) as thread:
        port = thread.server.port
        quiet = [small_window_socket(port) for _ in range(5)]
        for sock in quiet:
            sock.sendall(Validate().encode() + Ping(1).encode() * 3)
        store = connect_when_there_is_room(port, secret=SECRET)
        store.close()
        wait_until(lambda: open_count(thread) == 0, "every quiet connection is gone")
        on_loop(thread, thread.server._sweep)
        on_loop(thread, thread.server._sweep)
        assert stats(thread)["connections_timed_out"] == len(quiet)
        for sock in quiet:
            sock.close()


# ---------------------------------------------------------------------------
# D2: before authenticating, only small handshake and auth messages
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        # A SET of an 8 MiB value (within the limits once authenticated).
        bytes([Opcode.SET]) + U64.pack(4) + b"/key" + U64.pack(8 << 20),
        # An authentication nonce of 4 KiB (a key's size, but no nonce's).
        bytes([Opcode.AUTH_CHALLENGE]) + U64.pack(4096),
    ],
    ids=["set", "huge-nonce"],
)
def test_before_authenticating_a_request_is_refused_from_its_header(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, header: bytes
) -> None:
    with serving(event_loop, monkeypatch, secret=SECRET) as thread:
        raw = Raw(thread.server.port)
        raw.ping()
        # The header alone and a little of the body: the server must not wait for the rest.
        raw.send(header + b"x" * 1000)
        raw.assert_closed()
        assert on_loop(thread, lambda: thread.server.held) == 0
        failures = stats(thread)
        assert failures["connections_auth_failures"] + failures["connections_protocol_errors"] == 1  # type: ignore[operator]
        # A client with the secret is served as ever.
        store = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT, secret=SECRET)
        store.set("k", b"v" * (1 << 20))
        assert store.get("k") == b"v" * (1 << 20)
        store.close()


def test_before_authenticating_only_the_handshake_and_the_exchange_are_accepted(
    event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(event_loop, monkeypatch, secret=SECRET) as thread:
        raw = Raw(thread.server.port)
        raw.send(Get(b"/k").encode())
        raw.assert_closed()
        assert stats(thread)["connections_auth_failures"] == 1
        # A nonce of the right size gets its answer.
        raw = Raw(thread.server.port)
        assert raw.request(Ping(EXTENSION_OFFER).encode(), ReplyKind.U32) != EXTENSION_OFFER
        assert len(raw.request(AuthChallenge(b"n" * 32).encode(), ReplyKind.BYTES)) == 32
        raw.close()


# ---------------------------------------------------------------------------
# D8: a MULTI_SET refused at the key limit changes nothing
# ---------------------------------------------------------------------------


def test_a_multi_set_refused_at_the_key_limit_changes_nothing(
    event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(event_loop, monkeypatch, limits=Limits(max_keys=100)) as thread:
        store = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
        store.multi_set([f"old{i}" for i in range(10)], ["x"] * 10)
        raw = Raw(thread.server.port)
        items = tuple((f"/new{i}".encode(), b"y") for i in range(91))
        raw.send(MultiSet(items).encode())
        raw.assert_closed()
        assert store.num_keys() == 10
        assert not store.check([f"new{i}" for i in range(91)][:1])
        # Within the limit (overwrites do not count), it is applied whole.
        keys = [f"old{i}" for i in range(10)] + [f"new{i}" for i in range(90)]
        store.multi_set(keys, ["z"] * 100)
        assert store.num_keys() == 100
        assert store.get("new89") == b"z"
        store.close()


# ---------------------------------------------------------------------------
# R1: fair service between connections
# ---------------------------------------------------------------------------


def test_a_pipelining_client_cannot_make_another_wait_for_all_of_its_requests(
    event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(event_loop, monkeypatch) as thread:
        port = thread.server.port
        flooder = Raw(port)
        good = Raw(port)
        flooder.ping()
        good.ping()
        flood = Add(b"/counter", 1).encode() * 5000
        with loop_held(thread):
            # Both requests are waiting when the loop looks again: the flood first.
            flooder.send(flood)
            good.send(Add(b"/counter", 1).encode())
        # The good client's ADD was served early among the flood's, not after all of them.
        value = good.read_reply(ReplyKind.I64)
        assert value < 1000, f"served after {value - 1} of the flood's 5000 requests"
        for _ in range(5000):
            flooder.read_reply(ReplyKind.I64)
        assert good.request(Get(b"/counter").encode(), ReplyKind.BYTES) == b"5001"


# ---------------------------------------------------------------------------
# R2: a server-wide memory budget
# ---------------------------------------------------------------------------


def test_over_the_memory_budget_the_biggest_holders_are_dropped(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tp_store.server")
    value_bytes = 1 << 20
    limits = Limits(max_value_bytes=value_bytes, max_message_bytes=value_bytes + 8 * 1024 + 64)
    # The kernel takes some of each reply; a few hundred KiB each stay with the server.
    budget = 2 * limits.max_message_bytes
    with serving(event_loop, monkeypatch, limits=limits, memory_budget=budget) as thread:
        port = thread.server.port
        store = TCPStore("127.0.0.1", port, timeout=TIMEOUT)
        store.set("big", b"v" * value_bytes)
        assert store.check(["big"])  # a round trip: the value is stored
        # Clients that ask for the big value again and again and never read.
        readers = [small_window_socket(port) for _ in range(16)]
        for sock in readers:
            sock.sendall(Validate().encode())
            send_ignoring_resets(sock, Get(b"/big").encode() * 64)
        wait_until(lambda: records(caplog, "memory_budget"), "a holder is dropped")

        # Readers served after a drop push it over again until the next check: read
        # what the server counts and what its connections hold in one loop turn.
        def holding() -> int:
            recounted = sum(c.recount() for c in thread.server.connections)
            return max(thread.server.held, recounted)

        wait_until(
            lambda: on_loop(thread, holding) <= budget, "the server holds less than its budget"
        )
        dropped = len(records(caplog, "memory_budget"))
        assert "over its budget" in records(caplog, "memory_budget")[0].getMessage()
        # Dropped connections are freed although their clients never read.
        wait_until(
            lambda: len(records(caplog, "connection_close")) >= dropped,
            "the dropped connections are gone",
        )
        # The others are served as ever.
        assert store.get("big") == b"v" * value_bytes
        store.close()
        for sock in readers:
            sock.close()


def test_memory_budget_below_one_message_is_refused() -> None:
    from tp_store.server.store_server import StoreServer

    with pytest.raises(ValueError, match="memory_budget must be an int of at least"):
        StoreServer("127.0.0.1", 0, memory_budget=1000)


# ---------------------------------------------------------------------------
# R3: TLS handshakes hold their place; the open-file limit
# ---------------------------------------------------------------------------


def test_unfinished_tls_handshakes_count_against_max_connections(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, pki: TestPKI
) -> None:
    from tp_store.security import server_ssl_context

    context = server_ssl_context(pki.server_cert, pki.server_key)
    with serving(event_loop, monkeypatch, ssl=context, max_connections=2) as thread:
        port = thread.server.port
        # Two connections that never send their ClientHello.
        # (The server accepts connections in order: these before the client's.)
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        with pytest.raises(StoreConnectionError, match="connection limit"):
            TCPStore("127.0.0.1", port, timeout=TIMEOUT, tls_ca=pki.ca)
        for sock in silent:
            sock.close()
        # Their places come free when they go.
        store = connect_when_there_is_room(port, tls_ca=pki.ca)
        store.set("k", "v")
        assert store.get("k") == b"v"
        store.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(next(iter(tp_store.__path__))).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _soft_open_file_limit(pid: int) -> int:
    limits = Path(f"/proc/{pid}/limits").read_text()
    found = re.search(r"^Max open files\s+(\d+)", limits, re.MULTILINE)
    assert found is not None
    return int(found[1])


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs /proc")
@pytest.mark.parametrize("hard_limit", ["enough", "too low"])
def test_the_server_raises_its_open_file_limit_or_warns(hard_limit: str) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2000
    if hard_limit == "enough" and hard != resource.RLIM_INFINITY and hard < wanted + 64:
        pytest.skip(f"the hard open-file limit ({hard}) is below {wanted + 64}")
    new_hard = hard if hard_limit == "enough" else 1024

    def lower_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, new_hard))

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tp_store",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--max-connections",
            str(wanted),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        preexec_fn=lower_limits,  # noqa: PLW1509 - only sets the limits of the child
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on ")
        soft = _soft_open_file_limit(proc.pid)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=TIMEOUT)
    if hard_limit == "enough":
        assert soft >= wanted
        assert "open-file limit" not in stderr
    else:
        assert soft == 1024
        assert "the open-file limit (1024) is below max_connections (2000)" in stderr


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs /proc")
def test_by_default_the_server_takes_as_many_connections_as_open_files_allow() -> None:
    import resource

    def lower_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))

    proc = subprocess.Popen(
        [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        preexec_fn=lower_limits,  # noqa: PLW1509 - only sets the limits of the child
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on ")
        soft = _soft_open_file_limit(proc.pid)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=TIMEOUT)
    # Raised to the hard limit, and no warning: the default fits what the host allows.
    assert soft == 1024
    assert "open-file limit" not in stderr


# ---------------------------------------------------------------------------
# R6: bad connections do not flood the log
# ---------------------------------------------------------------------------


def test_warnings_about_bad_connections_are_throttled(
    event_loop: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tp_store.server")
    with serving(event_loop, monkeypatch, secret=SECRET) as thread:
        for _ in range(200):
            raw = Raw(thread.server.port)
            raw.send(Get(b"/k").encode())
            raw.assert_closed()
            raw.close()
        wait_until(lambda: stats(thread)["connections_auth_failures"] == 200, "all are refused")
        # The next sweep past the interval sums up what was left out.
        wait_until(lambda: records(caplog, "log_suppressed"), "the summary is logged")
        closing = records(caplog, "auth_refused")
        assert len(closing) < 200 / 2, len(closing)
        suppressed = sum(int(r.args[0]) for r in records(caplog, "log_suppressed"))  # type: ignore[index]
        assert len(closing) + suppressed == 200


# ---------------------------------------------------------------------------
# R7: the client does not trust the lengths a server sends
# ---------------------------------------------------------------------------


def test_the_client_refuses_a_reply_longer_than_any_value() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()

    def fake_server() -> None:
        conn, _ = listener.accept()
        with conn:
            handshake = len(Validate().encode() + Ping(0).encode())
            received = b""
            while len(received) < handshake:
                received += conn.recv(handshake - len(received))
            conn.sendall(encode_u32(EXTENSION_ACCEPT))
            conn.recv(65536)  # the GET
            # A 400 MiB value, of which some arrives, the rest never.
            with suppress(OSError):
                conn.sendall(U64.pack(400 << 20) + b"x" * (1 << 20))
            done.wait(TIMEOUT)

    server = threading.Thread(target=fake_server, daemon=True)
    server.start()
    try:
        store = TCPStore("127.0.0.1", port, timeout=TIMEOUT)
        with pytest.raises(StoreConnectionError, match="exceeds the limit of 8388608"):
            store.get("k")
        store.close()
    finally:
        done.set()
        server.join(TIMEOUT)
        listener.close()
