"""Configurable limits of the server: connections, keys, sizes, slow requests, memory.

A real :class:`StoreServer` runs in this process (a :class:`ServerThread`) and
raw sockets play the clients. Going over a limit closes the offending
connection only (the protocol has no error reply), with a log line and a
counter; everyone else keeps being served.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from raw_client import Raw, wait_until

from tp_store import Limits, StoreConnectionError, StoreLimitError, TCPStore
from tp_store.protocol import (
    CONNECTION_REFUSED,
    Append,
    Get,
    ListKeys,
    MultiGet,
    Ping,
    QueuePush,
    ReplyKind,
    Set,
    Validate,
    Wait,
    encode_u32,
)
from tp_store.server.state import StoreState
from tp_store.server.store_server import ServerThread, StoreServer

TIMEOUT = 10.0


def serve(**kwargs: object) -> ServerThread:
    thread = ServerThread(StoreServer("127.0.0.1", 0, **kwargs))  # type: ignore[arg-type]
    thread.start()
    return thread


@pytest.fixture
def make_server() -> Iterator[Callable[..., ServerThread]]:
    threads: list[ServerThread] = []

    def make(**kwargs: object) -> ServerThread:
        threads.append(serve(**kwargs))
        return threads[-1]

    yield make
    for thread in threads:
        thread.stop()


def seconds_until_closed(client: Raw) -> float:
    """Seconds until the server closes ``client``'s connection (fails after a read timeout)."""
    started = time.monotonic()
    client.assert_closed()
    return time.monotonic() - started


# ---------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------


def test_connections_beyond_the_limit_are_closed_at_once(
    make_server: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    thread = make_server(max_connections=3)
    clients = [Raw(thread.server.port) for _ in range(3)]
    for client in clients:
        client.ping()
    extra = Raw(thread.server.port)
    started = time.monotonic()
    # Said before closing, unasked: our client finds it where it awaits its
    # handshake PING's answer (a PyTorch client sees a wrong answer and retries).
    assert extra.assert_closed() == encode_u32(CONNECTION_REFUSED)
    assert time.monotonic() - started < TIMEOUT
    stats = thread.server.stats()
    assert stats["connections_refused"] == 1
    assert stats["connections_open"] == 3
    assert any("refused 1 connection" in r.getMessage() for r in caplog.records)
    for client in clients:
        client.ping()
    # A slot that frees up can be taken again.
    clients.pop().close()
    wait_until(lambda: thread.server.stats()["connections_open"] == 2, "the slot is free")
    Raw(thread.server.port).ping()


def test_a_client_refused_at_the_connection_limit_is_told_so(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(max_connections=1)
    holder = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    started = time.monotonic()
    with pytest.raises(StoreConnectionError) as caught:
        TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT / 2
    message = str(caught.value)
    assert f"the store at 127.0.0.1:{thread.server.port} refused the connection" in message
    assert "connection limit (max_connections)" in message
    assert "TLS" not in message
    assert thread.server.stats()["connections_refused"] == 1
    # Once a slot is free, connecting works again.
    holder.close()
    wait_until(lambda: thread.server.stats()["connections_open"] == 0, "the slot is free")
    TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT).close()


def test_bad_server_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="max_connections must be a positive int"):
        StoreServer("127.0.0.1", max_connections=0)
    with pytest.raises(ValueError, match="request_timeout must be a positive number"):
        StoreServer("127.0.0.1", request_timeout=0)
    with pytest.raises(ValueError, match="max_message_bytes must be at least"):
        Limits(max_message_bytes=10)
    with pytest.raises(ValueError, match=r"Limits\.max_keys must be a positive int"):
        Limits(max_keys=0)


# ---------------------------------------------------------------------------
# Keys and sizes
# ---------------------------------------------------------------------------


def test_a_key_beyond_max_keys_closes_that_connection(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(limits=Limits(max_keys=3))
    writer = Raw(thread.server.port)
    for index in range(3):
        writer.send(Set(b"k%d" % index, b"v").encode())
    writer.send(Set(b"k0", b"overwritten").encode())  # not a new key: fine
    writer.ping()
    writer.send(Set(b"one-too-many", b"v").encode())
    writer.assert_closed()
    assert thread.server.state.num_keys() == 3
    assert thread.server.stats()["connections_protocol_errors"] == 1
    other = Raw(thread.server.port)
    assert other.request(Get(b"k0").encode(), ReplyKind.BYTES) == b"overwritten"


def test_a_write_past_max_stored_bytes_closes_that_connection_only(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(limits=Limits(max_stored_bytes=10_000))
    store = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    store.set("kept", "v" * 4000)
    store.set("fill0", "x" * 4000)
    store.set("fill1", "x" * 4000)  # over the budget
    # SET has no reply: the refusal shows on the next request, naming the limits.
    with pytest.raises(StoreConnectionError, match="max_stored_bytes"):
        store.get("kept")
    # The refused write changed nothing; another client is served as before.
    other = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    assert other.get("kept") == b"v" * 4000
    assert other.get("fill0") == b"x" * 4000
    assert not other.check(["fill1"])
    assert thread.server.stats()["connections_protocol_errors"] == 1
    other.delete_key("fill0")  # deleting makes room again
    other.set("fill1", "y" * 4000)
    store.close()
    other.close()


def test_stored_bytes_follow_every_kind_of_write() -> None:
    state = StoreState(max_stored_bytes=40)
    state.set(b"k", b"12345")  # 6
    state.set(b"k", b"1")  # an overwrite counts its new size: 2
    assert state.add(b"n", 9) == 9  # 2
    assert state.add(b"n", 1) == 10  # 3
    state.append(b"k", b"23")  # 4
    state.multi_set([(b"a", b"1"), (b"a", b"12"), (b"b", b"1")])  # 3 + 2
    state.queue_push(b"q", b"123")  # 4
    assert state.stored_bytes == 4 + 3 + 3 + 2 + 4
    with pytest.raises(StoreLimitError, match="over the limit of 40"):
        state.set(b"big", b"x" * 30)
    with pytest.raises(StoreLimitError, match="over the limit of 40"):
        state.multi_set([(b"c", b"x" * 10), (b"d", b"x" * 20)])
    with pytest.raises(StoreLimitError, match="over the limit of 40"):
        state.queue_push(b"q", b"x" * 30)
    with pytest.raises(StoreLimitError, match="over the limit of 40"):
        state.append(b"k", b"x" * 30)
    assert not state.check([b"big"])
    assert not state.check([b"c"])
    assert state.stored_bytes == 16  # the refused writes changed nothing
    state.queue_pop(b"q")
    state.delete(b"k")
    state.delete(b"a")
    assert state.stored_bytes == 3 + 2


def test_queued_values_count_towards_max_keys() -> None:
    state = StoreState(max_keys=2)
    state.set(b"a", b"1")
    state.queue_push(b"q", b"1")
    with pytest.raises(StoreLimitError, match="limit of 2 keys"):
        state.queue_push(b"q", b"2")
    state.queue_pop(b"q")
    state.queue_push(b"q", b"2")  # room again after a pop
    with pytest.raises(StoreLimitError):
        state.add(b"counter", 1)
    assert state.add(b"a", 1) == 2  # an existing key is not a new entry


def test_append_cannot_grow_a_value_past_max_value_bytes(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(limits=Limits(max_value_bytes=1000, max_message_bytes=1 << 20))
    client = Raw(thread.server.port)
    client.send(Append(b"log", b"x" * 600).encode())
    client.ping()
    client.send(Append(b"log", b"x" * 600).encode())
    client.assert_closed()
    assert thread.server.state.get(b"log") == b"x" * 600


def test_a_request_over_max_message_bytes_is_refused_from_its_prefix(
    make_server: Callable[..., ServerThread],
) -> None:
    limits = Limits(max_key_bytes=100, max_value_bytes=1000, max_message_bytes=2000)
    thread = make_server(limits=limits)
    client = Raw(thread.server.port)
    keys = tuple(b"k%03d" % index for index in range(200))  # 200 * 12 bytes > 2000
    client.send(Wait(keys).encode()[:1500])
    client.send(Wait(keys).encode()[1500:])
    client.assert_closed()
    assert thread.server.stats()["connections_protocol_errors"] == 1


def test_a_reply_over_max_message_bytes_closes_the_connection(
    make_server: Callable[..., ServerThread],
) -> None:
    limits = Limits(max_key_bytes=100, max_value_bytes=1000, max_message_bytes=5000)
    thread = make_server(limits=limits)
    client = Raw(thread.server.port)
    client.send(Set(b"big", b"v" * 1000).encode())
    assert (
        client.request(MultiGet((b"big",) * 4).encode(), ReplyKind.VALUES, 4) == [b"v" * 1000] * 4
    )
    client.send(MultiGet((b"big",) * 10).encode())  # 10 KB of reply
    client.assert_closed()
    lister = Raw(thread.server.port)
    assert lister.request(ListKeys().encode(), ReplyKind.KEY_LIST) == [b"big"]


# ---------------------------------------------------------------------------
# Slow requests
# ---------------------------------------------------------------------------


def test_a_trickled_request_is_closed_after_the_request_timeout(
    make_server: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    thread = make_server(request_timeout=0.5)
    frame = Set(b"key", b"v" * 100).encode()
    client = Raw(thread.server.port)
    stop = threading.Event()

    def trickle() -> None:
        # A byte every 50 ms: it never stops sending, so only a deadline from
        # the request's first byte can catch it.
        for byte in frame:
            if stop.wait(0.05):
                return
            try:
                client.send(bytes((byte,)))
            except OSError:
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        elapsed = seconds_until_closed(client)
    finally:
        stop.set()
        sender.join()
    assert 0.4 < elapsed < 5
    assert thread.server.stats()["connections_timed_out"] == 1
    assert any(getattr(r, "action", "") == "request_timeout" for r in caplog.records)


def test_idle_and_waiting_connections_are_never_timed_out(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(request_timeout=0.2)
    idle = Raw(thread.server.port)
    idle.ping()
    waiting = Raw(thread.server.port)
    waiting.send(Wait((b"later",)).encode())
    wait_until(lambda: thread.server.stats()["waiters_parked"] == 1, "the wait is parked")
    # Many request timeouts pass, on an event, not a sleep: the sweeper runs
    # every 50 ms, so a dozen of its rounds go by while this waits.
    threading.Event().wait(1.0)
    idle.ping()
    Raw(thread.server.port).send(Set(b"later", b"1").encode())
    waiting.sock.settimeout(TIMEOUT)
    assert waiting.sock.recv(1) == b"\x00"
    assert thread.server.stats()["connections_timed_out"] == 0


def test_a_handshake_sent_in_one_packet_then_idle_is_not_timed_out(
    make_server: Callable[..., ServerThread],
) -> None:
    # PyTorch's client sends VALIDATE and its first PING in one write, then
    # may stay silent for as long as its job runs.
    thread = make_server(request_timeout=0.2)
    raw = Raw(thread.server.port, validate=False)
    raw.send(Validate().encode() + Ping(5).encode())
    assert raw.read_reply(ReplyKind.U32) == 5
    # Many request timeouts pass, on an event, not a sleep (the sweeper runs every 50 ms).
    threading.Event().wait(1.0)
    raw.ping(6)  # still served
    assert thread.server.stats()["connections_timed_out"] == 0


def test_a_connection_that_sends_nothing_is_closed_after_the_request_timeout(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(request_timeout=0.3)
    silent = Raw(thread.server.port, validate=False)
    assert seconds_until_closed(silent) < 5
    assert thread.server.stats()["connections_timed_out"] == 1


def test_our_client_is_not_disturbed_by_a_short_request_timeout(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server(request_timeout=0.2)
    store = TCPStore("127.0.0.1", thread.server.port, timeout=TIMEOUT)
    store.set("k", "v" * 100_000)
    threading.Event().wait(0.6)
    assert store.get("k") == b"v" * 100_000
    assert store.queue_len("q") == 0
    store.close()


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------


def test_a_flooder_that_never_reads_holds_bounded_memory(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server()
    value = b"v" * (1 << 20)
    setter = Raw(thread.server.port)
    setter.send(Set(b"big", value).encode())
    setter.ping()
    flooder = socket.create_connection(("127.0.0.1", thread.server.port), timeout=TIMEOUT)
    flooder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    flooder.sendall(Validate().encode())
    requests = Get(b"big").encode() * 4096  # 4 GiB of replies, never read
    flooder.settimeout(0.5)
    sent = 0
    try:
        while sent < len(requests):
            sent += flooder.send(requests[sent : sent + 65536])
    except TimeoutError:
        pass  # the server stopped reading: the flooder's sends block
    server = thread.server

    def held() -> int:
        def measure() -> int:
            total = 0
            for connection in server.connections:
                transport = connection._transport
                if transport is not None:
                    total += transport.get_write_buffer_size()
                total += connection._session.buffered
            return total

        return thread.call(measure)

    # One reply in the transport's buffer and a chunk of unparsed requests:
    # a few MiB, never the 4 GiB of replies asked for.
    assert held() < 8 << 20
    Raw(server.port).ping()  # everyone else is still served
    flooder.close()
    wait_until(lambda: held() < 8 << 20, "the flooder's memory is released")


def test_request_size_is_bounded_without_buffering_it(
    make_server: Callable[..., ServerThread],
) -> None:
    thread = make_server()
    client = Raw(thread.server.port)
    # A length prefix of 1 TiB: refused on sight, nothing allocated.
    client.send(QueuePush(b"q", b"").encode()[:-8] + (1 << 40).to_bytes(8, "little"))
    client.assert_closed()
